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
(a shared prompt counts once, no-grad passes not at all).
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


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
