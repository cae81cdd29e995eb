"""bench/objectives.py, bench/grpo_step.py and bench/threads.py: each runs once as a subprocess at
--quick size on the embedded model with the transformers engine and one thread (2 OpenMP threads
stall on a busy 2-core box; threads.py's other setting, torch's default, is one thread there too),
and its JSON is checked: the keys the README's tables read, and the arithmetic that must hold
whatever the timings.

objectives.py runs with --step-lr 0, i.e. on-policy (pi = pi_old, every ratio 1), where the answers
are known: the ratio losses with masked_mean give REINFORCE's gradient (cosine 1); the per-token
weight is exactly 1/L for masked_mean, 1/max_tokens for Dr. GRPO and N/N_tokens for DAPO; and the
bench's gradient of reinforce_with_baseline has the norm grpo.train_step measured for the same loss
on the same weights. grpo_step.py's FLOP counter is checked in-process on the conftest tiny model
(a shared prompt counts once, no-grad passes not at all). bench/gpu_check.py --tiny runs in-process
with the packages a bare GPU image lacks made unimportable, its lines checked against the hub
profile and a hand count of the step's FLOPs.
"""

import argparse
import ast
import contextlib
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_script


def run_bench(name, *flags, env=None):
    script = os.path.join(ROOT, "bench", name)
    cmd = [sys.executable, script, "--quick", "--engine", "hf", "--threads", "1", *flags]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def objectives():
    return run_bench("objectives.py", "--step-lr", "0")


def test_objectives_keys_and_on_policy_gradients(objectives):
    r = objectives
    sections = {
        "config",
        "batch",
        "emulated_step",
        "ratio_pi_over_pi_old",
        "engine_mismatch",
        "objectives",
        "grad_cosine",
        "time_s",
    }
    assert sections <= set(r)
    assert r["batch"]["groups_with_signal"] > 0, (
        "the quick batch has no reward variance: no gradient to compare"
    )
    names = [
        "grpo_clip",
        "grpo_no_clip",
        "dr_grpo",
        "dapo",
        "gspo",
        "reinforce_with_baseline",
        "grpo_clip_tis",
    ]
    assert set(names) <= set(r["objectives"])
    assert set(r["grad_cosine"]) == set(r["objectives"])
    per_objective = {
        "loss",
        "grad_norm",
        "clip_fraction",
        "length_exponent",
        "per_token_weight_by_length",
    }
    for o in r["objectives"].values():
        assert per_objective <= set(o)
    # lr 0: theta_1 = theta_0
    assert r["ratio_pi_over_pi_old"]["min"] == r["ratio_pi_over_pi_old"]["max"] == 1.0
    cos = r["grad_cosine"]["reinforce_with_baseline"]
    for name in ("grpo_clip", "grpo_no_clip", "gspo", "grpo_clip_tis"):
        assert cos[name] == pytest.approx(1.0, abs=1e-4), name
    rwb = r["objectives"]["reinforce_with_baseline"]
    assert rwb["grad_norm"] == pytest.approx(r["emulated_step"]["grad_norm"], rel=1e-4)
    assert rwb["length_exponent"] == pytest.approx(-1.0, abs=1e-3)
    # 1/L, averaged over the bucket's lengths
    for key, bucket in rwb["per_token_weight_by_length"].items():
        lo, hi = map(int, key.split("-"))
        assert 1 / hi - 1e-6 <= bucket["per_token_weight"] <= 1 / lo + 1e-6
    max_tokens = r["config"]["max_tokens"]
    n = r["batch"]["responses"]
    n_tok = r["batch"]["response_tokens"]
    for bucket in r["objectives"]["dr_grpo"]["per_token_weight_by_length"].values():
        assert bucket["per_token_weight"] == pytest.approx(1 / max_tokens, rel=1e-4)
    for bucket in r["objectives"]["dapo"]["per_token_weight_by_length"].values():
        assert bucket["per_token_weight"] == pytest.approx(n / n_tok, rel=1e-4)
    # the estimators and controls of issue 31: RLOO is G / (G - 1) x GRPO's advantages (same
    # normaliser); on-policy CISPO is DAPO (ratio 1, token norm); the entropy controls move it
    G = r["config"]["group_size"]
    o = r["objectives"]
    assert cos["rloo"] == pytest.approx(1.0, abs=1e-4)
    assert o["rloo"]["grad_norm"] == pytest.approx(G / (G - 1) * rwb["grad_norm"], rel=1e-4)
    assert r["grad_cosine"]["dapo"]["cispo"] == pytest.approx(1.0, abs=1e-4)
    assert o["cispo"]["grad_norm"] == pytest.approx(o["dapo"]["grad_norm"], rel=1e-4)
    bonus = o["grpo_clip_entropy_bonus"]["grad_norm"]
    assert abs(bonus - o["grpo_clip"]["grad_norm"]) > 1e-6 * bonus
    assert r["grad_cosine"]["grpo_clip"]["grpo_clip_top20_entropy"] < 0.9999
    assert o["passk_4"]["grad_norm"] > 0
    # seed 003's shaping, the batch re-scored with the flag: the length reward changes the rewards
    # trained on; the language reward adds w = 0.5 x a fraction in [0, 1] to each
    assert o["grpo_clip_kimi_length"]["reward_mean"] != o["grpo_clip"]["reward_mean"]
    gain = o["grpo_clip_language"]["reward_mean"] - o["grpo_clip"]["reward_mean"]
    assert -1e-6 <= gain <= 0.5 + 1e-6


def test_grpo_step_keys_and_exactness():
    r = run_bench("grpo_step.py")
    sections = {
        "config",
        "variants",
        "shared_prefix",
        "old_log_probs",
        "flops",
        "seconds_per_step",
        "load_avg_1m",
    }
    assert sections <= set(r)
    assert set(r["variants"]) == {
        "shared_prefix_off",
        "shared_prefix_on",
        "old_log_probs_trainer",
        "old_log_probs_engine",
    }
    per_variant = {
        "train_step",
        "old_log_probs",
        "training",
        "training_cpu",
        "step",
        "train_gflop_per_s",
        "first_update",
    }
    for v in r["variants"].values():
        assert per_variant <= set(v)
        assert v["train_gflops"] > 0
    sp = r["shared_prefix"]
    assert r["variants"]["shared_prefix_off"]["first_update"]["grad_norm"] > 0, (
        "no reward variance: nothing to compare"
    )
    assert sp["first_update_equal"], sp  # the option is exact: the same loss and grad norm
    assert sp["train_tokens_ratio"] < 0.6  # each group's prompt ran once instead of G times
    assert {"training_ratio", "training_cpu_ratio", "step_ratio", "targets_met"} <= set(sp)
    tr = r["variants"]["old_log_probs_trainer"]
    en = r["variants"]["old_log_probs_engine"]
    assert en["train_tokens_run"] == tr["train_tokens_run"]
    assert en["first_update"]["grad_norm"] > 0
    assert r["flops"]["matmul_1024_gflop_per_s"] > 0
    assert "training_shared_prefix_on_vs_matmul" in r["flops"]


def test_threads_quiet_and_loaded():
    """bench/threads.py: each setting (torch's default, --threads 1) ran in a process of its own
    with that many threads, its engine included; quiet and loaded rounds alternated; the
    competitors really ran and are gone; the ratios are the times' quotients. torch's default is
    made 1 thread too (OMP_NUM_THREADS): 2 threads beside a competitor on a busy 2-core box take
    minutes, and the mechanics are the same."""
    r = run_bench("threads.py", env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert {"config", "settings", "threads_1_over_default", "load_avg_1m"} <= set(r)
    assert set(r["settings"]) == {"default", "threads_1"}
    assert r["config"]["omp_num_threads_env"] == "1"
    one = r["settings"]["threads_1"]
    default = r["settings"]["default"]
    assert one["threads_flag"] == 1  # grpo.py's own --threads, passed through
    assert one["threads"] == one["threads_after_engine_start"] == 1
    assert default["threads_flag"] is None
    assert default["threads"] == default["threads_after_engine_start"] == 1
    phases = {"step", "generation", "grading", "training", "weight_sync", "step_cpu"}
    for s in (default, one):
        for kind in ("quiet_s", "loaded_s"):
            assert set(s[kind]) == phases
            assert s[kind]["step"] > 0
        ratio = s["loaded_s"]["step"] / s["quiet_s"]["step"]
        assert s["loaded_over_quiet"]["step"] == pytest.approx(ratio, abs=2e-3)
        rounds = r["config"]["rounds"]
        assert len(s["samples_s"]["quiet"]["step"]) == len(s["samples_s"]["loaded"]["step"])
        assert len(s["competitor_cpu_s"]) == rounds
        assert sum(sum(cpus) for cpus in s["competitor_cpu_s"]) > 0  # they competed
        for pid in s["competitor_pids"]:
            assert not os.path.exists(f"/proc/{pid}"), "a competitor outlived the bench"
    quiet = one["quiet_s"]["step"] / default["quiet_s"]["step"]
    assert r["threads_1_over_default"]["quiet"] == pytest.approx(quiet, abs=2e-3)


def test_flop_counter_counts_the_forwards_that_ran_with_grad(tiny_model_dir):
    """A shared prompt counts once (the hook sees the KV cache's length); no-grad passes do not
    count."""
    import torch
    from transformers import AutoModelForCausalLM

    import losses

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import grpo_step

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = model.config
    counter = grpo_step.count_training_flops(model)
    linears = [m for m in model.base_model.modules() if isinstance(m, torch.nn.Linear)]
    # weights per token: the linear layers' and the (tied) lm_head's
    W = sum(m.weight.numel() for m in linears) + cfg.vocab_size * cfg.hidden_size
    # FLOPs per (query, key) pair, forward
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
    ids = torch.randint(1, 100, (4, 12), generator=torch.Generator().manual_seed(0))
    ids[:, :6] = ids[:1, :6]
    with torch.no_grad():
        losses.get_response_log_probs(model, ids[:, :-1], ids[:, 1:], prefix_len=5)
    assert counter["tokens"] == 0
    # the prompt (1, 5), then (1, 4 x 6) packed on its cache
    losses.get_response_log_probs(model, ids[:, :-1], ids[:, 1:], prefix_len=5)
    assert counter["tokens"] == 5 + 4 * 6
    assert counter["flops"] == 3 * (2 * W * (5 + 24) + attn * (15 + 4 * (6 * 5 + 21)))


@pytest.fixture(scope="module")
def estimator_lab():
    """bench/estimators.py --quick, in-process: the module, its cells keyed (estimator, policy,
    G) and its config line."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import estimators

    lines = []
    rows, config = estimators.run(estimators.parse(["--quick"]), emit=lines.append)
    assert len(lines) == len(rows)
    cells = {(r["estimator"], r["policy"], r["G"]): r for r in rows}
    return {"module": estimators, "cells": cells, "config": config}


def test_estimator_lab_unbiased_where_theory_says(estimator_lab):
    """Against the exact gradient by enumeration: REINFORCE and RLOO on-policy are unbiased (their
    error is the noise an unbiased estimator of their variance shows, their scale 1); Dr. GRPO's
    group mean holds the sample itself, so its expectation is (G - 1) / G times the gradient;
    pass@k's advantages give (G - k) / (k G) times the pass@k objective's gradient; the seeds' GRPO
    (1/L per token) and REINFORCE on stale samples are biased well beyond the noise. A wrong exact
    gradient, sampler or loss fails the first check."""
    cells = estimator_lab["cells"]
    config = estimator_lab["config"]
    assert config["responses_per_prompt"] == 121  # 1 + 3 + 9 + 27 ended, 81 truncated
    k = config["objectives"]["passk"][1]
    known_scale = {"reinforce": lambda G: 1.0, "rloo": lambda G: 1.0}
    known_scale["dr_grpo"] = lambda G: (G - 1) / G
    known_scale["passk"] = lambda G: (G - k) / (k * G)
    for G in (4, 8):
        for name, scale in known_scale.items():
            c = cells[(name, "on_policy", G)]
            assert c["cosine"] > 0.99, c
            assert abs(c["scale"] - scale(G)) < 3 * c["noise_floor"], c
        c = cells[("reinforce", "on_policy", G)]
        assert c["rel_err"] < 3 * c["noise_floor"], c
        c = cells[("grpo", "on_policy", G)]
        assert c["rel_err"] > 5 * c["noise_floor"], c
        assert c["clip_fraction"] == 0  # on-policy every ratio is 1
        c = cells[("reinforce", "stale", G)]
        assert c["rel_err"] > 5 * c["noise_floor"], c
        assert cells[("grpo", "stale", G)]["clip_fraction"] > 0


def test_estimator_lab_variance_is_reinforces_exact_variance(estimator_lab):
    """The lab's variance of on-policy REINFORCE against its exact value by enumeration: per
    prompt x, Var = E[r^2 |grad log pi|^2] - |grad p_x|^2, and the batch mean of P x G
    independent samples has sum_x Var_x / (P^2 G), relative to |g|^2 = sum_x |grad p_x|^2 / P^2."""
    import torch
    from torch.func import grad, vmap

    estimators = estimator_lab["module"]
    cells = estimator_lab["cells"]
    config = estimator_lab["config"]
    toy = estimators.enumerate_responses()
    theta, _ = estimators.policies(toy, 3, config["stale_step"])
    probs = estimators.response_probs(theta, toy)  # (P, R)
    var_sum = 0.0
    grad_sq = 0.0
    for x in range(estimators.N_PROMPTS):

        def seq_log_prob(th, tok, st, m, x=x):
            return estimators.token_log_probs(th, torch.tensor(x), tok, st, m).sum()

        scores = vmap(grad(seq_log_prob), in_dims=(None, 0, 0, 0))(
            theta, toy["tokens"], toy["state"], toy["mask"]
        ).reshape(len(toy["tokens"]), -1)  # (R, D), grad log pi(y | x)
        weight = probs[x] * toy["reward"][x]  # (R,), pi(y) r (r is 0 or 1: r^2 = r)
        g_x = weight @ scores  # (D,)
        var_sum += float(weight @ (scores**2).sum(-1) - g_x @ g_x)
        grad_sq += float(g_x @ g_x)
    for G in (4, 8):
        exact = var_sum / (G * grad_sq)
        assert cells[("reinforce", "on_policy", G)]["variance"] == pytest.approx(exact, rel=0.1)


def lora_adapter_count(rank, hidden, intermediate, q_out, kv_out, layers):
    """r x (in + out) of every attention and MLP projection (q, k, v, o, gate, up, down)."""
    q = hidden + q_out
    k = hidden + kv_out
    v = hidden + kv_out
    o = q_out + hidden
    mlp = 3 * (hidden + intermediate)
    return rank * layers * (q + k + v + o + mlp)


def test_lora_bench_counts_the_adapters_alone():
    """bench/lora.py --quick, in-process: against a hand count from each model's shape, LoRA's
    optimizer holds exactly the adapters (r x (in + out) per projection) with 8 bytes of AdamW
    moments each, and full fine-tuning every parameter; an optimizer that also held the base
    weights fails the count."""
    import importlib.util

    import torch

    # by its path: the name lora is the root module's
    spec = importlib.util.spec_from_file_location("lora_bench", os.path.join(ROOT, "bench/lora.py"))
    lora_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lora_bench)
    threads = torch.get_num_threads()
    lines = []
    try:
        rows, config = lora_bench.run(
            lora_bench.parse(["--quick", "--threads", "1"]), emit=lines.append
        )
    finally:
        torch.set_num_threads(threads)
    assert len(lines) == len(rows) == 2 * len(config["ranks"])
    with open(os.path.join(ROOT, "models", "countdown-tiny", "config.json")) as f:
        cfg = json.load(f)
    h = config["stand_in"]["hidden"]
    shapes = {  # hidden, intermediate, q out, kv out, layers
        "embedded": (
            cfg["hidden_size"],
            cfg["intermediate_size"],
            cfg["num_attention_heads"] * cfg["head_dim"],
            cfg["num_key_value_heads"] * cfg["head_dim"],
            cfg["num_hidden_layers"],
        ),
        "stand_in": (h, 3 * h, h, h, config["stand_in"]["layers"]),
    }
    full = {r["model"]: r for r in rows if r["lora_rank"] == 0}
    for r in rows:
        shape = shapes[r["model"]]
        base = full[r["model"]]["parameters"]
        if r["lora_rank"] == 0:
            n = base
            assert r["lora_layers"] == 0
        else:
            n = lora_adapter_count(r["lora_rank"], *shape)
            assert r["lora_layers"] == 7 * shape[-1]
            assert r["parameters"] == base + n
        assert r["trainable"] == r["optimizer_params"] == n, r
        assert r["adam_moment_bytes"] == 8 * n, r  # exp_avg + exp_avg_sq, fp32
        assert r["optimizer_state_bytes"] - r["adam_moment_bytes"] <= 8 * 7 * shape[-1] + 64
        assert r["train_step_s"] > 0
        assert r["first_update"]["grad_norm"] > 0, "no reward variance: nothing trained"


def gpu_check_module():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check

    return gpu_check


def module_level_imports(source):
    """The top-level packages a module imports when it is imported: its statements, including
    those in module-level if/try/with blocks and class bodies, not those in function bodies."""
    found = set()
    stack = list(ast.parse(source).body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.partition(".")[0])
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def test_gpu_check_imports_no_optional_package_at_module_level():
    """Every root script gpu_check can reach (through imports at any depth) imports none of
    gpu_check.OPTIONAL (vllm, ray, math_verify, pebble, ...) when it is imported, so importing
    them on a bare GPU image cannot fail (the tiny run below covers the imports inside functions).
    """
    gpu_check = gpu_check_module()
    assert module_level_imports(
        "import vllm\ntry:\n    import ray\nexcept ImportError:\n"
        "    pass\ndef f():\n    import pebble\n"
    ) == {"vllm", "ray"}
    project = set()
    for name in os.listdir(ROOT):
        if name.endswith(".py"):
            project.add(name[:-3])
    todo = [os.path.join(ROOT, "bench", "gpu_check.py")]
    seen = set()
    while todo:
        path = todo.pop()
        with open(path) as f:
            source = f.read()
        found = module_level_imports(source) & set(gpu_check.OPTIONAL)
        assert not found, f"{os.path.relpath(path, ROOT)} imports {found} at module level"
        for node in ast.walk(ast.parse(source)):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name.partition(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module.partition(".")[0]]
            for name in names:
                if name in project and name not in seen:
                    seen.add(name)
                    todo.append(os.path.join(ROOT, f"{name}.py"))
    assert {"grpo", "rollout", "grader", "lora", "losses", "hardware"} <= seen


@contextlib.contextmanager
def absent(names):
    """Inside, the named packages cannot be imported, as on an image without them: each finder of
    sys.meta_path answers None for them (find_spec says absent, import raises
    ModuleNotFoundError), and their modules already imported leave sys.modules for the while."""

    class Absent:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in names:
                return None
            return self.finder.find_spec(name, path, target)

        def __getattr__(self, attr):
            return getattr(self.finder, attr)

    finders = list(sys.meta_path)
    loaded = {}
    for key in list(sys.modules):
        if key.partition(".")[0] in names:
            loaded[key] = sys.modules.pop(key)
    sys.meta_path[:] = [Absent(finder) for finder in finders]
    try:
        yield
    finally:
        sys.meta_path[:] = finders
        sys.modules.update(loaded)


def test_gpu_check_config_is_qwen25_math_15b():
    """QWEN built on the meta device (no memory): the model card's 1.54B parameters, one tied
    embedding, the matmul weights by hand; without CUDA the check runs the toy size, saying why."""
    import torch
    from transformers import AutoModelForCausalLM

    gpu_check = gpu_check_module()
    a = gpu_check.parse([])
    if not torch.cuda.is_available():
        assert a.tiny and a.tiny_why == "no CUDA device"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            gpu_check.model_config(argparse.Namespace(tiny=False))
        )
    n = sum(p.numel() for p in model.parameters())
    assert round(n / 1e9, 2) == 1.54, n
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    h = 1536
    layer = 2 * h * h + 2 * h * 256 + 3 * h * 8960  # q, o; k, v (2 KV heads x 128); the MLP
    assert gpu_check.matmul_weights(model) == 28 * layer + 151936 * h


def test_gpu_check_tiny_without_the_optional_packages(tmp_path):
    """bench/gpu_check.py --tiny with gpu_check.OPTIONAL (vllm, ray, math_verify, pebble, datasets,
    wandb) unimportable: every section runs and its JSON line holds against the hub profile and a
    hand computation: the batch is PROFILES["hub"]'s; the step's model FLOPs are 4 forwards of
    2 W x tokens + 4 x layers x d_attn x pairs, counted by hand with the shared prefix off and on;
    bf16 changed d logp/dh (autocast ran) no more than a plain log_softmax's own bf16 error, and the
    chunked head equals the plain one in fp32; LoRA trains r x (in + out) per projection; the
    engine produced every token; --out holds the same lines."""
    import grpo

    gpu_check = gpu_check_module()
    out = tmp_path / "out"
    with absent(set(gpu_check.OPTIONAL)):
        proc = run_script(["gpu_check.py", "--tiny", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert (out / "gpu_check.jsonl").read_text().splitlines() == lines
    records = [json.loads(line) for line in lines]
    sections = [r["section"] for r in records]
    assert sections == ["env", "step", "step", "logprobs", "lora", "engine", "done"]
    env = records[0]
    off = records[1]  # the step, shared prefix off
    on = records[2]  # and on
    logprobs = records[3]
    lora_line = records[4]
    engine = records[5]
    done = records[6]
    assert done["failed"] == []
    assert env["vllm"] is None and env["absent"] == list(gpu_check.OPTIONAL)
    cfg = env["model_config"]
    hub = grpo.PROFILES["hub"]
    micro = hub["train_batch_size"] // hub["gradient_accumulation_steps"]
    P = off["prompt_tokens"] - 1  # the prompt's label positions
    L = off["prompt_tokens"] + off["response_tokens"] - 1  # a row's
    rows = off["microbatches_timed"] * micro
    h = cfg["hidden_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    layer = 2 * h * h + 2 * h * kv + 3 * h * cfg["intermediate_size"]
    W = cfg["num_hidden_layers"] * layer + cfg["vocab_size"] * h
    own = L - P  # a row's tokens after its prompt
    work = {  # (tokens, pairs) by hand
        "shared_prefix_off": (rows * L, rows * L * (L + 1) // 2),
        "shared_prefix_on": (
            rows // micro * (P + micro * own),
            rows // micro * (P * (P + 1) // 2 + micro * (own * P + own * (own + 1) // 2)),
        ),
    }
    for r in (off, on):
        assert r["shared_prefix_ran"] == r["shared_prefix"]
        assert r["rows_per_step"] == hub["train_batch_size"]
        assert r["microbatches_per_step"] == hub["gradient_accumulation_steps"]
        assert r["micro_batch"] == micro and r["group_size"] == hub["group_size"]
        assert r["extrapolated"] and r["microbatches_timed"] == 8
        scale = r["microbatches_per_step"] / r["microbatches_timed"]
        assert r["seconds_per_step"] == pytest.approx(r["measured_s"] * scale, abs=0.01)
        assert r["parameters_matmul"] == W
        tokens, pairs = work[r["variant"]]
        forward = 2 * W * tokens + 4 * cfg["num_hidden_layers"] * h * pairs
        assert r["flops"] == {
            "tokens_run": tokens,
            "pairs": pairs,
            "old_log_probs": forward,
            "training": 3 * forward,
            "total": 4 * forward,
        }
        mfu = r["flops"]["total"] / r["measured_s"] / r["bf16_peak_flops"]
        assert r["mfu"] == pytest.approx(mfu, rel=0.01)
        assert r["first_update"]["grad_norm"] > 0
        assert r["peak_reserved_bytes"] is None  # no CUDA here
    assert on["first_update"]["grad_norm"] == pytest.approx(off["first_update"]["grad_norm"], 1e-2)
    bf16 = logprobs["dlogp_dh_rel_err"]
    assert 1e-4 < bf16["median"] <= 2 * logprobs["plain_dlogp_dh_rel_err"]["median"]
    assert logprobs["chunked_vs_plain_float32_rel_err"]["max"] < 1e-5
    assert lora_line["trainable"] == lora_adapter_count(
        32, h, cfg["intermediate_size"], h, kv, cfg["num_hidden_layers"]
    )
    assert lora_line["first_update"]["grad_norm"] > 0
    assert engine["tokens_generated"] == 16 * engine["tokens_per_response"]
    assert engine["vllm"] is None and "note" in engine


@pytest.mark.parametrize(
    "says, driver",
    [("exit 0", None), ("echo broken >&2; exit 9", None), ("echo 550.54.15", "550.54.15")],
)
def test_gpu_check_driver_is_null_when_nvidia_smi_cannot_say(tmp_path, monkeypatch, says, driver):
    """A fake nvidia-smi first on PATH: one that prints nothing (exit 0) or fails gives a null
    driver, not an IndexError that would end the check before its first line."""
    gpu_check = gpu_check_module()
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n{says}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert gpu_check.nvidia_driver() == driver


def test_gpu_check_env_that_raises_is_a_failed_section(monkeypatch):
    """An env section that raises writes its error as its line, the sections still run and the
    done line names env failed (exit 1): the run always leaves its JSON."""
    gpu_check = gpu_check_module()

    def broken(a):
        raise RuntimeError("no driver\nsecond line")

    monkeypatch.setattr(gpu_check, "env_record", broken)
    monkeypatch.setattr(gpu_check, "plan", lambda a: [])
    proc = run_script(["gpu_check.py", "--tiny"])
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 1
    assert [r["section"] for r in records] == ["env", "done"]
    assert records[0]["error"] == "RuntimeError: no driver"
    assert records[1]["failed"] == ["env"]
