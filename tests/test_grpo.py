"""grpo.py: end-to-end runs as subprocesses (on- and off-policy, resume with the saved flags,
--engine hf; args.json beside runtime.json; every logged key in docs/metrics.md's glossary),
grpo.summarize on hand-built batches (advantages, metrics, shard stats), grpo.train_step
in-process on real rollout batches (every loss and length norm, bf16 master weights, dropout, the
min_tokens ban, stale-data refusal, rollout IS, dynamic sampling), Ctrl-C consistency, and early
failures on bad input.

Everything uses the tiny random model of conftest and a generated keyword task (reward 1 when the
response contains the keyword): a random model never earns a Countdown reward, and a batch with
no reward variance has no gradient.
"""

import contextlib
import json
import math
import os
import re
import signal
import statistics
import threading

import pytest
import torch
import torch.optim.optimizer as optimizer_hooks

import common
import grader
import grpo
import hardware
import lora
import losses
import metric_table
import runs
import validation
from conftest import HAS_VLLM, ROOT, doc_section, one_line_error, run_script

EVAL_KEYS = [
    "eval/accuracy",
    "eval/reward",
    "eval/format_reward",
    "eval/answer_reward",
    "eval/response_len",
    "eval/truncation_rate",
]
# the runtime record grpo.main saves as runtime.json (grpo.setup_runtime)
RUNTIME_KEYS = {
    "engine",
    "policy_device",
    "vllm_device",
    "param_dtype",
    "compute_dtype",
    "shared_prefix",
    "gpus_visible",
    "threads",
}
KEYWORD = "the"
# a tiny run: 4 prompts x 4 samples a step, one optimizer step of 2 microbatches, 16 tokens, on CPU
TINY_FLAGS = [
    "--task jsonl",
    "--prompt question_only",
    "--reward keyword",
    "--rollout-batch-size 16",
    "--group-size 4",
    "--train-batch-size 16",
    "--gradient-accumulation-steps 2",
    "--max-tokens 16",
    "--min-tokens 2",
    "--eval-n 8",
    "--eval-every 1",
    "--lr 1e-3",
    "--policy-device cpu",
    "--grader-workers 0",
    "--eager",  # vLLM without torch.compile: starts ~35 s sooner (the hf runs ignore it)
]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kw") / "task.jsonl"
    with open(path, "w") as f:
        for i in range(64):
            row = {
                "question": f"Write a sentence about the numbers {i} and {i + 3}.",
                "ground_truth": [KEYWORD],
            }
            f.write(json.dumps(row) + "\n")
    return str(path)


def tiny_flags(model, task, *extra):
    """grpo.py's flags for a tiny run of `model` on the keyword task in `task`; `extra` last, so
    that it overrides."""
    flags = ["--model", model, "--train-path", task, "--val-path", task]
    for flag in TINY_FLAGS:
        flags += flag.split()
    return flags + list(extra)


def run_grpo(flags, out=None, check=True, merge=False):
    """grpo.py with `flags` (and --out `out`), in this process (conftest.run_script; merge: stdout
    and stderr as one console, in .stdout). Only while no other vLLM engine of this module lives:
    a run's engine, freed, would take down theirs."""
    argv = ["grpo.py", *flags]
    if out:
        argv += ["--out", str(out)]
    proc = run_script(argv, merge=merge)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_metrics(rows):
    """The rows of optimizer steps (not the eval rows)."""
    return [r for r in rows if "train/loss" in r]


def glossary_keys():
    """The keys the metric glossary (docs/metrics.md) explains: each backticked name in the first
    column of the table under "Metrics". A name starting with "_" shortens the one before it:
    `train/ratio_mean`, `_min` is train/ratio_min."""
    section = doc_section("Metrics")
    keys = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first_column = line.split(" | ")[0]
        previous = None
        for name in re.findall(r"`([^`]+)`", first_column):
            if name.startswith("_"):
                name = previous.rsplit("_", 1)[0] + name
            keys.add(name)
            previous = name
    return keys


def logged_keys(rows):
    """Every key of the metric rows `rows`."""
    keys = set()
    for row in rows:
        keys.update(row)
    return keys


def test_step_keys_are_in_the_readme_glossary():
    glossary = glossary_keys()
    # the shorthand rows are read: `train/ratio_mean`, `_min`, `_max`
    assert {"step", "train/reward", "train/ratio_min", "train/ratio_max"} <= glossary
    missing = [k for k in grpo.STEP_KEYS if k not in glossary]
    assert not missing, missing


@pytest.fixture(scope="module")
def on_policy(tiny_model_dir, task_file, tmp_path_factory):
    """2 steps with KL monitoring and --curriculum, then a resume that names only --resume and two
    overrides; and 3 steps straight through with the same seed."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed (the --engine hf runs below still run)")
    d = tmp_path_factory.mktemp("runs")
    flags = tiny_flags(
        tiny_model_dir,
        task_file,
        "--loss",
        "reinforce_with_baseline",
        "--kl-every",
        "1",
        "--curriculum",
    )
    proc = run_grpo(flags + ["--n-grpo-steps", "2"], d / "a", merge=True)
    first = metrics(d / "a")
    resumed = run_grpo(["--resume", str(d / "a"), "--n-grpo-steps", "3", "--eval-every", "0"])
    run_grpo(flags + ["--n-grpo-steps", "3", "--eval-every", "0"], d / "b")  # straight through
    return {
        "dir": d / "a",
        "straight_dir": d / "b",
        "first": first,
        "resumed": metrics(d / "a"),
        "straight": metrics(d / "b"),
        "console": proc.stdout,  # stdout and stderr, as a terminal shows them
        "resume_stdout": resumed.stdout,
    }


def test_on_policy_run_logs_every_key_dashboard_and_checkpoint(on_policy):
    rows = on_policy["first"]
    train = train_metrics(rows)
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in train] == [0, 1]
    for r in train:
        assert set(grpo.STEP_KEYS) <= set(r), set(grpo.STEP_KEYS) - set(r)
        assert r["train/ratio_mean"] == 1.0  # on-policy
        assert r["train/clip_fraction"] == 0.0
        assert r["train/kl_ref"] >= 0
        assert "train/mismatch_kl" in r
    # pi_1 vs pi_0 on step 1's samples
    assert "train/kl_prev" not in train[0]
    assert train[1]["train/kl_prev"] >= 0
    # the policy moved iff step 0 had a gradient
    assert train[1]["train/kl_prev"] > 0 or train[0]["train/grad_norm"] == 0
    # step 0: the policy is the reference
    assert train[0]["train/kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(set(EVAL_KEYS) <= set(r) for r in evals)
    assert any(r["train/grad_norm"] > 0 for r in train), "keyword task should give reward variance"
    d = on_policy["dir"]
    assert os.path.getsize(d / "dashboard.png") > 10_000
    # the flags as given (device, dtype, shared prefix unresolved) and, next to them, what the run
    # decided from them
    with open(d / "args.json") as f:
        args = json.load(f)
    assert args["policy_device"] == "cpu"  # given
    assert args["vllm_device"] is None
    assert args["shared_prefix"] is None
    assert args["dtype"] == "auto"
    assert "param_dtype" not in args
    assert "compute_dtype" not in args
    with open(d / "runtime.json") as f:
        runtime = json.load(f)
    assert set(runtime) == RUNTIME_KEYS
    assert runtime["policy_device"] == "cpu"
    assert runtime["vllm_device"] == "cpu"  # default: the policy's device
    assert runtime["shared_prefix"] is True  # default on CPU; the tiny model's cache passes
    assert runtime["param_dtype"] == str(torch.float32)
    assert runtime["compute_dtype"] == str(torch.float32)  # auto on CPU
    rollouts = sorted(os.listdir(d / "rollouts"))
    assert rollouts[:3] == ["step_0000.jsonl", "step_0001.jsonl", "step_0002.jsonl"]
    checkpoint = set(os.listdir(d / "checkpoint"))
    assert {"config.json", "model.safetensors", "optimizer.pt", "state.json"} <= checkpoint
    assert not any(n.startswith("checkpoint.") for n in os.listdir(d))  # no tmp/old leftovers
    assert "step 2/2 |" in on_policy["console"]
    assert "eval step 2 | accuracy" in on_policy["console"]


# the step bar of a 2-step run as tqdm draws it, e.g. " 50%|#####     | 1/2 [00:09<00:09, ...]"
STEP_BAR = re.compile(r"\s*\d+%\|[^|]*\| \d/2 \[[^\]]*\]")


def terminal_lines(text):
    """The lines a terminal shows for `text`: each carriage return starts overwriting its line
    (tqdm redraws its bar so, and wipes it with spaces before a line is written over it)."""
    shown = []
    for line in text.split("\n"):
        screen = ""
        for part in line.split("\r"):
            screen = part + screen[len(part) :]
        shown.append(screen.rstrip())
    return shown


def test_console_shows_the_runs_lines_and_one_progress_bar_the_engine_log_the_rest(on_policy):
    """A newcomer's console: the run's own lines and the steps' progress bar, whole on one line
    (a line printed into it would leave a bar with text after it and a second bar below); no
    engine INFO line and no known-benign vLLM warning. vLLM's log, load_policy_into_vllm's line
    per push included, is <run>/engine.log (rollout.engine_log)."""
    console = on_policy["console"]
    log = on_policy["dir"] / "engine.log"
    assert f"engine: vLLM's log -> {log}\n" in console
    for noise in ["INFO", "Reloading weights", "load_policy_into_vllm", "Failed to load weights"]:
        assert noise not in console
    assert "set_num_threads" not in console  # vLLM's own calls while its engine starts
    shown = terminal_lines(console)
    bars = [line for line in shown if re.search(r"\| \d/2 \[", line)]
    assert len(bars) == 1, bars
    assert STEP_BAR.fullmatch(bars[0]) and "100%|" in bars[0], bars[0]
    steps = [line for line in shown if line.startswith(("step ", "eval step "))]
    assert len(steps) == 5, steps  # eval 0, step 1, eval 1, step 2, eval 2: each line whole
    text = log.read_text()
    assert "Initializing a V1 LLM engine" in text
    assert text.count("RotaryEmbedding: Failed to load weights") >= 2  # one per push, benign
    assert text.count("load_policy_into_vllm: ") >= 2
    assert "Successfully reset prefix cache" in text


def test_every_logged_key_is_in_the_readme_glossary(on_policy):
    """The step and eval rows of the run (with --kl-every: the KL and mismatch keys too), resumed
    and straight through: each key is explained in docs/metrics.md."""
    rows = on_policy["first"] + on_policy["resumed"] + on_policy["straight"]
    missing = sorted(logged_keys(rows) - glossary_keys())
    assert not missing, missing


def test_resume_restores_the_run_flags_and_continues_identically(on_policy):
    out = on_policy["resume_stdout"]
    assert "resume: restored the run's flags" in out
    assert "overriding" in out
    assert "n_grpo_steps 2 -> 3" in out
    with open(on_policy["dir"] / "args.json") as f:
        args = json.load(f)
    # the run's own values, not a profile default
    assert args["lr"] == 1e-3
    assert args["rollout_batch_size"] == 16
    assert args["kl_every"] == 1

    def step_row(rows, s):
        return next(r for r in train_metrics(rows) if r.get("step") == s)

    resumed = step_row(on_policy["resumed"], 2)
    straight = step_row(on_policy["straight"], 2)
    for k in ("train/reward", "train/response_len_mean"):
        assert resumed[k] == straight[k], k
    assert resumed["train/loss"] == pytest.approx(straight["train/loss"], rel=1e-4, abs=1e-6)
    assert resumed["train/grad_norm"] == pytest.approx(straight["train/grad_norm"], rel=1e-3)
    # the rows past the checkpoint are dropped
    assert [r["step"] for r in train_metrics(on_policy["resumed"])] == [0, 1, 2]
    # --curriculum's success rates: saved at step 2, resumed, and after step 3 the straight run's
    saved = []
    for run in (on_policy["dir"], on_policy["straight_dir"]):
        with open(run / "checkpoint" / "state.json") as f:
            saved.append(json.load(f)["curriculum"])
    assert saved[0] == saved[1]
    assert len(saved[0]["success"]) == 64 and set(saved[0]["success"]) != {0.5}


def test_off_policy_run_ratio_starts_at_one_and_hf_engine_smoke(
    tiny_model_dir, task_file, tmp_path
):
    extra = (
        "--loss grpo_clip --length-norm masked_normalize --epochs-per-rollout-batch 2"
        " --train-batch-size 8 --gradient-accumulation-steps 2 --no-std-norm"
        " --n-grpo-steps 2 --eval-every 0 --engine hf"
    )
    run_grpo(tiny_flags(tiny_model_dir, task_file, *extra.split()), tmp_path)
    train = train_metrics(metrics(tmp_path))
    # 2 epochs x 2 train batches x 2 steps
    assert [r["opt_step"] for r in train] == list(range(1, 9))
    for s in (0, 1):
        first = next(r for r in train if r["step"] == s)
        assert first["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert first["train/ratio_min"] == pytest.approx(1.0, abs=1e-4)
        assert first["train/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert all(set(grpo.STEP_KEYS) <= set(r) for r in train)
    # later steps really move off-policy
    assert any(r["train/ratio_max"] > 1.0 + 1e-4 for r in train)
    missing = sorted(logged_keys(metrics(tmp_path)) - glossary_keys())
    assert not missing, missing


# ----------------------------------------------------------------------------- summarize
RIGHT = {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}
FORMATTED = {"reward": 0.1, "format_reward": 1.0, "answer_reward": 0.0}  # wrong answer
UNFORMATTED = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}


def summarize_args(*flags):
    """The flags of a step of 2 groups x 4 samples (the embedded model: nothing is loaded)."""
    sizes = ["--group-size", "4", "--rollout-batch-size", "8", "--train-batch-size", "8"]
    return grpo.parse_args(sizes + list(flags))


def scored_batch(rewards, raw=None):
    """A scored batch as grpo.collect returns it, of the reward dicts `rewards` (group-major);
    raw: the total rewards (N,), by default each dict's reward."""
    if raw is None:
        raw = [d["reward"] for d in rewards]
    lengths = [3, 5, 2, 7, 4, 4, 1, 6]
    return {
        "raw": torch.tensor(raw),
        "rewards": list(rewards),
        "correct": [grader.is_correct(d) for d in rewards],
        "response_ids": [[1] * n for n in lengths],
        "truncated": [False, False, False, True, False, False, False, True],
    }


def shard_stats(
    generation_s,
    grading_s,
    extra_rounds_s,
    prompts_sampled,
    groups_flat,
    all_correct=0,
    all_wrong=0,
):
    """One shard's stats, as grpo.collect returns them."""
    return {
        "generation_s": generation_s,
        "grading_s": grading_s,
        "extra_rounds_s": extra_rounds_s,
        "prompts_sampled": prompts_sampled,
        "groups_flat": groups_flat,
        "groups_all_correct": all_correct,
        "groups_all_wrong": all_wrong,
    }


NO_LOG_PROBS = {"policy": None, "ref": None}  # what the advantages phase reads without a KL


def step_advantages(batch, args):
    """The advantages train_step's rewards -> advantages phase gives a batch (no KL in the
    reward: no log-probs needed)."""
    adv, _, _ = grpo.advantages(batch, None, NO_LOG_PROBS, args)
    return adv


@pytest.mark.parametrize("std_norm", ["--std-norm", "--no-std-norm"])
def test_the_advantages_and_the_batch_metrics(std_norm):
    """Group 0 varies, group 1 is flat; row 2 lost 0.25 to an overlong penalty, so the total
    reward (raw) is not the dicts' reward. Advantages (the learner's phase) are
    losses.group_normalized_advantages of raw; each metric of summarize is computed here by hand."""
    args = summarize_args(std_norm)
    rewards = [RIGHT, FORMATTED, RIGHT, UNFORMATTED] + [UNFORMATTED] * 4
    raw = [1.0, 0.1, 0.75, 0.0, 0.0, 0.0, 0.0, 0.0]
    batch = scored_batch(rewards, raw)
    assert grpo.count_groups(batch, args) == (2, 0, 1)  # group 1: no correct response
    m = grpo.summarize(batch, [shard_stats(1.5, 0.25, 0.0, 2, 0, 0, 1)], args)
    want_adv, _ = losses.group_normalized_advantages(
        batch["raw"], args.group_size, args.advantage_eps, args.std_norm
    )
    adv = step_advantages(batch, args)
    assert torch.equal(adv, want_adv)
    # by hand: group 0 centred (and / its std + eps), the flat group 1 exactly 0
    group = raw[:4]
    centred = [r - statistics.fmean(group) for r in group]
    if args.std_norm:
        std = statistics.stdev(group)  # unbiased, as torch.std
        centred = [c / (std + args.advantage_eps) for c in centred]
    assert adv[:4].tolist() == pytest.approx(centred, rel=1e-6)
    assert adv[4:].tolist() == [0.0] * 4
    want = {
        "train/reward": sum(raw) / 8,  # with the penalty
        "train/format_reward": 3 / 8,
        "train/answer_reward": 2 / 8,
        "train/zero_var_frac": 1 / 2,
        "train/all_correct_frac": 0 / 2,
        "train/all_wrong_frac": 1 / 2,
        "train/response_len_mean": (3 + 5 + 2 + 7 + 4 + 4 + 1 + 6) / 8,
        "train/response_len_max": 7,
        "train/truncation_rate": 2 / 8,
        "time/generation": 1.5,
        "time/grading": 0.25,
    }
    assert {key: m[key] for key in want} == pytest.approx(want)
    # any other key is a metric of the table (a new one needs no edit here), in the glossary
    assert set(m) - set(want) <= set(metric_table.KEYS)
    missing = sorted(set(m) - glossary_keys())
    assert not missing, missing


def test_summarize_zeroes_a_flat_fallback_group_under_dynamic_sampling():
    """Group 1 differs in format only: flat for --dynamic-sampling's filter (on answer_reward), so
    it is in the batch only as a fallback, and gets no advantage; group 0 keeps its own. Without
    the filter, or with it on the total reward, both keep theirs."""
    rewards = [RIGHT, FORMATTED, RIGHT, UNFORMATTED] + [FORMATTED, UNFORMATTED] * 2
    batch = scored_batch(rewards)
    args = summarize_args("--dynamic-sampling")
    want_adv, _ = losses.compute_advantages(
        batch["raw"], args.group_size, "grpo", args.adv_std, args.advantage_eps
    )
    assert want_adv[4:].abs().min() > 0, "the format differences have a plain advantage"
    adv = step_advantages(batch, args)
    assert torch.equal(adv[:4], want_adv[:4])
    assert adv[4:].tolist() == [0.0] * 4
    for flags in ([], ["--dynamic-sampling", "--dynamic-sampling-on", "reward"]):
        assert torch.equal(step_advantages(batch, summarize_args(*flags)), want_adv), flags


def test_a_dynamic_sampling_fallback_group_leaves_the_batch_std():
    """--adv-std batch with --dynamic-sampling: group 1 (flat on answer_reward, varying in format)
    is zeroed before the batch std, so by hand the std is over group 0's centred rewards and
    group 1's zeros, not over group 1's format differences."""
    rewards = [RIGHT, FORMATTED, RIGHT, UNFORMATTED] + [FORMATTED, UNFORMATTED] * 2
    batch = scored_batch(rewards)
    args = summarize_args("--dynamic-sampling", "--adv-std", "batch")
    adv = step_advantages(batch, args)
    raw = [d["reward"] for d in rewards[:4]]
    centred = [r - statistics.fmean(raw) for r in raw] + [0.0] * 4
    std = statistics.stdev(centred)  # unbiased, as torch.std
    want = [c / (std + args.advantage_eps) for c in centred]
    assert adv.tolist() == pytest.approx(want, rel=1e-6)
    assert adv[4:].tolist() == [0.0] * 4


def test_summarize_joins_the_shards_stats():
    """Shards run side by side: a time is the longest shard's; the filtered fraction is over all
    the prompts sampled (3 flat of 8, not the mean of the shards' fractions)."""
    batch = scored_batch([RIGHT, UNFORMATTED] * 4)
    args = summarize_args("--dynamic-sampling")
    stats = [shard_stats(2.0, 0.5, 0.75, 3, 2), shard_stats(3.0, 0.25, 0.5, 5, 1)]
    m = grpo.summarize(batch, stats, args)
    assert m["time/generation"] == 3.0
    assert m["time/grading"] == 0.5
    assert m["time/dynamic_extra_generation"] == 0.75
    assert m["train/dynamic_prompts_sampled"] == 8
    assert m["train/dynamic_filtered_frac"] == 3 / 8
    missing = sorted(set(m) - glossary_keys())
    assert not missing, missing


# ------------------------------------------------------------------------ in-process, one engine
def collect(engine, rows, args, step):
    """A step's rollout and reward phases as grpo.main runs them: (the scored batch, with the
    advantages the learner's phase computes for it under "advantages", the step's rollout
    metrics)."""
    batch, stats = grpo.collect(engine, rows, args, step)
    metrics = grpo.summarize(batch, [stats], args)
    batch["advantages"] = step_advantages(batch, args)
    return batch, metrics


@pytest.fixture(scope="module")
def live(tiny_model_dir, task_file):
    """One in-process vLLM engine and a real scored rollout batch on the tiny model."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed (the --engine hf runs still run)")
    args = grpo.parse_args(
        tiny_flags(tiny_model_dir, task_file, "--out", "/tmp/unused", "--min-tokens", "4")
    )
    runtime = grpo.setup_runtime(args)
    train_rows, _ = grpo.load_data(args)
    engine = grpo.make_engine(tiny_model_dir, args, runtime)
    batch, _ = collect(engine, train_rows, args, 0)
    return {
        "args": args,
        "runtime": runtime,
        "engine": engine,
        "batch": batch,
        "rows": train_rows,
        "model_dir": tiny_model_dir,
        "task": task_file,
    }


def count_forwards(policy):
    """Records torch.is_grad_enabled() for every scoring forward: one of several rows, or the packed
    responses on a shared prompt's KV cache (not the prompt's own forward; the self-check runs
    before the counting starts)."""
    losses.shared_prefix_works(policy)
    calls = []

    def scoring(m, a, kw):
        cache = kw.get("past_key_values")
        if kw["input_ids"].shape[0] > 1 or (cache is not None and cache.get_seq_length() > 0):
            calls.append(torch.is_grad_enabled())

    policy.base_model.register_forward_pre_hook(scoring, with_kwargs=True)
    return calls


def make(live, *flags):
    """(the live batch's args with `flags` added, their runtime record as grpo.main sets it up)."""
    args = grpo.parse_args(
        tiny_flags(
            live["model_dir"], live["task"], "--out", "/tmp/unused", "--min-tokens", "4", *flags
        )
    )
    runtime = grpo.setup_runtime(args)
    return args, runtime


def test_threads_reach_the_running_vllm_engine(live):
    """--threads reaches the engine's forwards. A vLLM CPU engine, once started, has replaced
    torch.set_num_threads with a no-op (vllm/v1/worker/cpu_worker.py): a second run in this process
    (a test, a notebook, a reused Ray actor) sets its threads through torch._C's own setter
    (hardware.set_threads), which the engine, running on this thread's pool, follows."""
    import rollout

    assert torch.set_num_threads is not torch._C.set_num_threads  # vLLM's no-op
    before = torch.get_num_threads()
    want = before + 1
    seen = []  # torch's thread count inside each forward of the engine's model

    def record(module, inputs):
        seen.append(torch.get_num_threads())

    hook = rollout._engine_model(live["engine"]).register_forward_pre_hook(record)
    try:
        args, runtime = make(live, "--threads", str(want))
        rollout.generate(live["engine"], ["The answer is"], max_tokens=4, seed=0)
    finally:
        hook.remove()
        torch._C.set_num_threads(before)
    assert runtime["threads"] == want
    assert seen and set(seen) == {want}


def learner(policy, optimizer, ref_model=None, prev_model=None):
    """A learner as grpo.build_learner returns it, from parts a test has built."""
    return {
        "policy": policy,
        "tokenizer": None,
        "optimizer": optimizer,
        "ref_model": ref_model,
        "prev_model": prev_model,
    }


def read_gradients(optimizer, params, grads):
    """Appends the flat gradient of `params` to `grads` each time `optimizer` steps."""

    def hook(*_):
        grads.append(torch.cat([p.grad.flatten() for p in params]))

    optimizer.register_step_pre_hook(hook)


@contextlib.contextmanager
def given_advantages(adv):
    """train_step trains on `adv` (N,): its rewards -> advantages phase replaced, as a fork would
    edit it, so a test sets the loss's advantages by hand."""
    real = grpo.advantages

    def fixed(batch, tensors, log_probs, args):
        _, rewards, metrics = real(batch, tensors, log_probs, args)
        return adv, rewards, metrics

    grpo.advantages = fixed
    try:
        yield
    finally:
        grpo.advantages = real


def step_gradient(live, *flags, batch=None, advantages=None):
    """(gradient BEFORE clipping (flat), history row, metrics) of the first optimizer step on the
    live batch from the initial weights: --max-grad-norm 1e30 (no clipping), and an SGD at lr 0
    reads the gradient when it steps and moves nothing. advantages (N,): trained on instead of
    the phase's."""
    args, runtime = make(live, "--max-grad-norm", "1e30", *flags)
    policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
    params = list(policy.parameters())
    grads = []
    probe = torch.optim.SGD(params, lr=0.0)
    read_gradients(probe, params, grads)
    if batch is None:
        batch = live["batch"]
    context = contextlib.nullcontext()
    if advantages is not None:
        context = given_advantages(advantages)
    with context:
        hist, m = grpo.train_step(learner(policy, probe), batch, args, runtime, 0)
    return grads[0], hist[0], m


def test_dapo_token_norm_divides_by_the_whole_steps_tokens(live):
    """--length-norm token (DAPO): every response token's gradient is -A_i / N_step, N_step = the
    optimizer step's response tokens, so 1 or 4 microbatches (of unequal token counts: rows sorted
    by length) give one gradient."""
    n = len(live["batch"]["advantages"])
    adv = torch.linspace(-1.0, 1.0, n)
    tokens = sorted(len(r) for r in live["batch"]["response_ids"])
    microbatch_tokens = {sum(tokens[i : i + 4]) for i in range(0, 16, 4)}
    assert len(microbatch_tokens) > 1, "equal microbatches would not tell"
    flags = ["--length-norm", "token", "--no-shared-prefix", "--gradient-accumulation-steps"]
    g1, h1, _ = step_gradient(live, *flags, "1", advantages=adv)
    g4, h4, _ = step_gradient(live, *flags, "4", advantages=adv)
    assert g1.norm() > 0
    assert ((g4 - g1).norm() / g1.norm()).item() <= 1e-6
    assert h4["train/grad_norm"] == pytest.approx(h1["train/grad_norm"], rel=1e-6)
    assert h4["train/loss"] == pytest.approx(h1["train/loss"], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize(
    "mode,level", [("tis", "token"), ("tis", "sequence"), ("mis", "token"), ("mis", "sequence")]
)
def test_rollout_is_weights_and_masks_the_step(live, mode, level):
    """mu lowered on rows 0-3 so pi_old / mu = 3 per token (TIS: the cap 2; MIS: weight 0), and on
    rows 4-7 to 1.5 (TIS: 1.5 per token, the cap 2 per sequence of >= 2 tokens; MIS: weight 1.5
    per token, 0 per sequence). With the seed's masked_mean a row's weight scales its advantage
    and a dropped row counts 0, so each step's gradient is that of a --rollout-is none step on
    hand-rescaled advantages."""
    b = live["batch"]
    n = len(b["advantages"])
    ratio = torch.tensor([3.0] * 4 + [1.5] * 4 + [1.0] * (n - 8))
    seq_ratio = ratio ** torch.tensor([len(r) for r in b["response_ids"]])
    assert seq_ratio[:8].min() > 2  # every shifted response has >= 2 tokens
    if level == "sequence":
        r = seq_ratio
    else:
        r = ratio
    if mode == "tis":
        scale = r.clamp(max=2.0)  # (n,)
    else:
        scale = torch.where(r <= 2.0, r, 0.0)  # (n,) MIS: rho where kept
    adv = torch.linspace(-1.0, 1.0, n)
    # the engine's log-probs, shifted
    mu = [[x - math.log(q) for x in lp] for lp, q in zip(b["engine_logprobs"], ratio.tolist())]
    g, h, m = step_gradient(
        live,
        "--rollout-is",
        mode,
        "--rollout-is-level",
        level,
        batch=dict(b, engine_logprobs=mu),
        advantages=adv,
    )
    want, h_want, _ = step_gradient(live, advantages=adv * scale)
    assert want.norm() > 0
    assert ((g - want).norm() / want.norm()).item() <= 1e-4, (mode, level)
    assert h["train/loss"] == pytest.approx(h_want["train/loss"], rel=1e-4)
    tokens = torch.tensor([len(x) for x in b["response_ids"]], dtype=torch.float)
    dropped_tokens = tokens[scale == 0].sum()
    assert m["train/is_dropped_frac"] == pytest.approx(dropped_tokens.item() / tokens.sum().item())


# each loss of losses.LOSSES with a length norm; every norm of losses.LENGTH_NORMS appears
LOSS_NORMS = [
    ("no_baseline", "masked_mean"),
    ("reinforce_with_baseline", "token"),
    ("grpo_clip", "masked_normalize"),
    ("grpo_no_clip", "masked_mean"),
    ("gspo", "token"),
    ("cispo", "token"),  # MiniMax-M1's reduction
]


def test_every_loss_and_length_norm_is_trained_below():
    assert sorted(loss for loss, _ in LOSS_NORMS) == sorted(losses.LOSSES)
    assert {norm for _, norm in LOSS_NORMS} == set(losses.LENGTH_NORMS)


@pytest.mark.parametrize("loss,norm", LOSS_NORMS)
def test_each_loss_and_length_norm_trains(live, loss, norm):
    n_epochs = 1
    if loss in losses.RATIO_LOSSES:
        n_epochs = 2  # a ratio loss trains off-policy too
    args, runtime = make(
        live,
        "--loss",
        loss,
        "--length-norm",
        norm,
        "--no-shared-prefix",  # one forward per microbatch
        "--epochs-per-rollout-batch",
        str(n_epochs),
    )
    policy, _ = grpo.load_policy(live["model_dir"], args, runtime)
    before = [p.detach().clone() for p in policy.parameters()]
    calls = count_forwards(policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    hist, m = grpo.train_step(learner(policy, optimizer), live["batch"], args, runtime, 0)
    assert len(hist) == n_epochs
    assert all(torch.isfinite(torch.tensor(h["train/loss"])) for h in hist)
    assert hist[0]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # first epoch: pi == pi_old
    # forwards with grad = epochs x microbatches: pi_old is computed once, not per epoch
    n_grad = sum(calls)
    assert n_grad == len(hist) * args.gradient_accumulation_steps
    n_no_grad = 0
    if loss in losses.RATIO_LOSSES:
        n_no_grad = args.gradient_accumulation_steps  # pi_old's pass
    assert len(calls) - n_grad == n_no_grad
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.parameters()))


def test_stale_data_with_a_plain_loss_is_refused(capsys):
    with pytest.raises(SystemExit):
        grpo.parse_args(["--epochs-per-rollout-batch", "2", "--loss", "reinforce_with_baseline"])
    err = capsys.readouterr().err
    assert "use a loss with a ratio" in err
    for name in losses.RATIO_LOSSES:  # the fix names each
        assert name in err, name
    with pytest.raises(SystemExit):  # several train batches per rollout batch: stale too
        grpo.parse_args(["--train-batch-size", "32", "--loss", "no_baseline"])


# ------------------------------------------------------- advantage estimators, exploration controls
def one_line_refusal(capsys, flags, needle):
    """grpo.parse_args(flags) exits with a one-line error holding `needle`."""
    with pytest.raises(SystemExit):
        summarize_args(*flags)
    err = capsys.readouterr().err.strip()
    assert needle in err, err
    assert len(err.splitlines()) == 1, err


def test_advantage_flags_resolve_and_their_conflicts_are_refused(capsys):
    """--adv-std is the normaliser (default group); --std-norm / --no-std-norm spell group / none,
    and contradicting --adv-std is an error; --advantage other than grpo with no_baseline (raw
    rewards) is refused; passk needs a k below the group size."""
    assert summarize_args().adv_std == "group"
    assert summarize_args("--std-norm").adv_std == "group"
    assert summarize_args("--no-std-norm").adv_std == "none"
    assert summarize_args("--adv-std", "batch").adv_std == "batch"
    assert summarize_args("--no-std-norm", "--adv-std", "none").adv_std == "none"
    one_line_refusal(capsys, ["--std-norm", "--adv-std", "batch"], "contradicts --std-norm")
    one_line_refusal(capsys, ["--no-std-norm", "--adv-std", "group"], "contradicts --std-norm")
    for name in losses.ADVANTAGES:
        if name != "grpo":
            flags = ["--advantage", name, "--loss", "no_baseline", "--passk-k", "2"]
            if name != "passk":
                flags = flags[:-2]
            one_line_refusal(capsys, flags, "--loss no_baseline trains on the raw rewards")
    one_line_refusal(capsys, ["--advantage", "passk"], "needs --passk-k K")
    one_line_refusal(capsys, ["--advantage", "passk", "--passk-k", "4"], "must be below")
    one_line_refusal(capsys, ["--passk-k", "2"], "add --advantage passk")
    one_line_refusal(capsys, ["--entropy-top-quantile", "0"], "probability")
    one_line_refusal(capsys, ["--entropy-coef", "-1"], ">= 0")


@pytest.mark.parametrize(
    "saved, typed, want",
    [
        ({"std_norm": True}, ["--adv-std", "batch"], "batch"),  # a run that predates --adv-std
        ({"std_norm": None, "adv_std": "group"}, ["--no-std-norm"], "none"),
        ({"std_norm": True, "adv_std": "group"}, ["--adv-std", "none"], "none"),
        ({"std_norm": False, "adv_std": "none"}, [], "none"),  # nothing typed: the run's
    ],
)
def test_resume_takes_the_normaliser_typed_now_in_either_spelling(tmp_path, saved, typed, want):
    """--resume restores both spellings of the normaliser from the run's flags; the one typed on
    the command line replaces them, instead of contradicting the restored other spelling."""
    sizes = {"group_size": 4, "rollout_batch_size": 8, "train_batch_size": 8}
    (tmp_path / "args.json").write_text(json.dumps({**sizes, **saved, "out": str(tmp_path)}))
    (tmp_path / "run.lock").write_text("")  # the project's run marker
    args = grpo.parse_args(["--resume", str(tmp_path), "--dry-run", *typed])
    assert args.adv_std == want


@pytest.mark.parametrize(
    "flags",
    [
        ["--advantage", "rloo"],
        ["--advantage", "passk", "--passk-k", "2", "--adv-std", "none"],
        ["--adv-std", "batch"],  # REINFORCE++-baseline
    ],
)
def test_each_advantage_option_sets_the_advantages_and_trains(live, flags):
    """The advantages phase applies --advantage / --adv-std (losses.compute_advantages of the
    step's rewards; rloo's hand value on one group), and train_step trains on them."""
    args, runtime = make(live, *flags)
    batch = dict(live["batch"])
    batch["advantages"] = step_advantages(batch, args)
    want, _ = losses.compute_advantages(
        batch["raw"],
        args.group_size,
        args.advantage,
        args.adv_std,
        args.advantage_eps,
        args.passk_k or 1,
    )
    assert torch.equal(batch["advantages"], want)
    if args.advantage == "rloo":
        r = batch["raw"][:4].tolist()
        others = (sum(r) - r[0]) / 3
        std = statistics.stdev(r)
        if std > 0:
            want_0 = (r[0] - others) / (std + args.advantage_eps)
            assert batch["advantages"][0].item() == pytest.approx(want_0)
    assert batch["advantages"].abs().sum() > 0, "a batch without signal would not tell"
    policy, _ = grpo.load_policy(live["model_dir"], args, runtime)
    before = [p.detach().clone() for p in policy.parameters()]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    hist, _ = grpo.train_step(learner(policy, optimizer), batch, args, runtime, 0)
    assert all(math.isfinite(h["train/loss"]) for h in hist)
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.parameters()))


def one_forward_gradient(live, loss_of):
    """The gradient of loss_of(log_probs, token_entropy, response_mask) (N, T) each, from one
    forward of the whole live batch (no microbatches, no shared prefix) at the initial weights."""
    args, runtime = make(live)
    policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
    tensors = grpo.collate(live["batch"], args)
    out = losses.get_response_log_probs(
        policy,
        tensors["input_ids"],
        tensors["labels"],
        return_token_entropy=True,
        temperature=args.temperature,
        ban_token_ids=live["batch"]["ban_token_ids"],
        ban_mask=tensors["ban_mask"],
    )
    loss_of(out["log_probs"], out["token_entropy"], tensors["response_mask"]).backward()
    return torch.cat([p.grad.flatten() for p in policy.parameters()])


def test_batch_log_probs_with_entropy_reads_the_token_entropies(live):
    """batch_log_probs(entropy=True): the no-grad pass's token entropies (the
    --entropy-top-quantile pass), as get_response_log_probs gives them in one forward."""
    args = live["args"]
    runtime = live["runtime"]
    ban = live["batch"]["ban_token_ids"]
    tensors = grpo.collate(live["batch"], args)
    policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
    got = grpo.batch_log_probs(policy, tensors, args, runtime, ban, entropy=True)
    with torch.no_grad():
        want = losses.get_response_log_probs(
            policy,
            tensors["input_ids"],
            tensors["labels"],
            return_token_entropy=True,
            temperature=args.temperature,
            ban_token_ids=ban,
            ban_mask=tensors["ban_mask"],
        )["token_entropy"]
    mask = tensors["response_mask"]
    assert (got - want)[mask].abs().max() <= 1e-4
    log_probs = grpo.batch_log_probs(policy, tensors, args, runtime, ban)
    assert not torch.equal(got[mask], log_probs[mask])


def test_entropy_coef_is_the_entropy_bonus_at_the_gradient(live):
    """With zero advantages, a --entropy-coef 0.1 step's gradient is -0.1 x the gradient of the
    response tokens' entropy (each row's mean, then the batch mean: the loss's reduction)."""
    zero = torch.zeros(len(live["batch"]["advantages"]))
    g, _, _ = step_gradient(live, "--entropy-coef", "0.1", "--no-shared-prefix", advantages=zero)

    def bonus(log_probs, entropy, mask):
        return -0.1 * losses.masked_mean_per_sequence(entropy, mask)

    want = one_forward_gradient(live, bonus)
    assert want.norm() > 0
    assert ((g - want).norm() / want.norm()).item() <= 1e-4


def test_entropy_top_quantile_is_over_the_whole_optimizer_step(live):
    """--entropy-top-quantile 0.3 with 4 microbatches: the gradient of -A log pi on the top 30% of
    the whole step's response tokens by entropy (every row's normaliser unchanged), as one forward
    of the batch computes it; a quantile per microbatch keeps other tokens (so this tells)."""
    b = live["batch"]
    n = len(b["advantages"])
    adv = torch.linspace(-1.0, 1.0, n)
    flags = ["--entropy-top-quantile", "0.3", "--no-shared-prefix"]
    g, h, _ = step_gradient(live, *flags, "--gradient-accumulation-steps", "4", advantages=adv)
    kept = {}

    def top_tokens_only(log_probs, entropy, mask):
        keep = losses.top_entropy_mask(entropy, mask, 0.3)
        kept["step"] = keep
        kept["entropy"] = entropy.detach()
        per_token = torch.where(keep, -adv[:, None] * log_probs, 0.0)
        return losses.masked_mean_per_sequence(per_token, mask)

    want = one_forward_gradient(live, top_tokens_only)
    assert want.norm() > 0
    assert ((g - want).norm() / want.norm()).item() <= 1e-4
    mask = grpo.collate(b, live["args"])["response_mask"]
    assert h["train/entropy_mask_frac"] == kept["step"].sum().item() / mask.sum().item()
    assert 0.3 <= h["train/entropy_mask_frac"] < 0.35
    # per microbatch (the trainer's on-policy order, 4 rows each) the quantile keeps other tokens
    order = torch.argsort(grpo.collate(b, live["args"])["lengths"], stable=True)
    per_microbatch = torch.zeros_like(mask)
    for start in range(0, n, 4):
        rows = order[start : start + 4]
        per_microbatch[rows] = losses.top_entropy_mask(kept["entropy"][rows], mask[rows], 0.3)
    assert not torch.equal(per_microbatch, kept["step"])


def test_bf16_compute_keeps_fp32_master_weights(live, tmp_path):
    """One AdamW step at lr 1e-5 from bf16-loaded weights changes >= 95% of them by default; pure
    bf16 rounds most of those updates away."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bf16_dir = str(tmp_path / "bf16")
    model = AutoModelForCausalLM.from_pretrained(live["model_dir"], dtype=torch.bfloat16)
    model.save_pretrained(bf16_dir)
    AutoTokenizer.from_pretrained(live["model_dir"]).save_pretrained(bf16_dir)
    changed = {}
    for mode in ([], ["--pure-bf16"]):
        args, runtime = make(live, "--dtype", "bfloat16", "--lr", "1e-5", *mode)
        policy, _ = grpo.load_policy(bf16_dir, args, runtime)
        if mode:
            assert next(policy.parameters()).dtype == torch.bfloat16
        else:
            assert next(policy.parameters()).dtype == torch.float32
        before = [p.detach().clone() for p in policy.parameters()]
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5, betas=(0.9, 0.95))
        grpo.train_step(learner(policy, optimizer), live["batch"], args, runtime, 0)
        diff = torch.cat([(a != p.detach()).flatten() for a, p in zip(before, policy.parameters())])
        changed[bool(mode)] = diff.float().mean().item()
    assert changed[False] >= 0.95 and changed[True] < 0.5, changed


def test_trainer_scores_the_min_tokens_ban_like_the_engine(live):
    """vLLM bans stop tokens before min_tokens; with the ban applied, trainer and engine agree
    there to 1e-5."""
    args = live["args"]
    runtime = live["runtime"]
    batch = live["batch"]
    assert batch["ban_token_ids"], "the engine bans its stop tokens before --min-tokens"
    tensors = grpo.collate(batch, args)
    policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
    ban = tensors["ban_mask"] & tensors["response_mask"]
    with_ban = grpo.batch_log_probs(policy, tensors, args, runtime, batch["ban_token_ids"])
    without = grpo.batch_log_probs(policy, tensors, args, runtime, [])
    eng = tensors["engine_log_probs"]
    at_ban = (with_ban - eng)[ban].abs()
    elsewhere = (with_ban - eng)[tensors["response_mask"] & ~ban].abs()
    # fp32 kernels differ by ~1e-5 at every position (the engine's matmul blocking is not HF's): at
    # the banned positions the ban leaves only that noise, on average below 1e-5
    assert at_ban.mean() <= 1e-5, (at_ban.max(), elsewhere.max())
    assert at_ban.max() <= max(2 * elsewhere.max(), 2e-5), (at_ban.max(), elsewhere.max())
    # the mismatch that the ban removes (-log(1 - p_stop))
    assert (without - eng)[ban].abs().mean() > 3 * at_ban.mean()


def test_dropout_is_off_for_rl(live, tmp_path):
    """A model with dropout (GPT-2: embedding, attention and residual dropout 0.5): pi_old, pi and
    the training forward are the same function, so the first epoch's on-policy ratio is exactly
    1."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(live["model_dir"])
    d = str(tmp_path / "gpt2")
    cfg = GPT2Config(
        vocab_size=64 * (len(tok) // 64 + 1),
        n_embd=64,
        n_layer=1,
        n_head=1,
        n_positions=512,
        resid_pdrop=0.5,
        embd_pdrop=0.5,
        attn_pdrop=0.5,
    )
    GPT2LMHeadModel(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    args, runtime = make(live, "--loss", "grpo_clip", "--epochs-per-rollout-batch", "2")
    policy, _ = grpo.load_policy(d, args, runtime)
    assert policy.training
    assert all(m.p == 0.0 for m in policy.modules() if isinstance(m, torch.nn.Dropout))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    hist, _ = grpo.train_step(learner(policy, optimizer), live["batch"], args, runtime, 0)
    assert hist[0]["train/ratio_min"] == pytest.approx(1.0, abs=1e-6)
    assert hist[0]["train/ratio_max"] == pytest.approx(1.0, abs=1e-6)


def test_rollout_is_and_engine_old_log_probs(live):
    args, runtime = make(
        live, "--loss", "grpo_clip", "--rollout-is", "tis", "--rollout-is-cap", "1.5"
    )
    policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    hist, m = grpo.train_step(learner(policy, optimizer), live["batch"], args, runtime, 0)
    for k in (
        "train/mismatch_kl",
        "train/is_weight_mean",
        "train/is_weight_min",
        "train/is_weight_max",
        "train/is_weight_outside_frac",
    ):
        assert k in m
    # fp32 on CPU: the same kernels
    assert m["train/mismatch_kl"] < 1e-6
    assert m["train/is_weight_max"] == pytest.approx(1.0, abs=1e-4)
    args, runtime = make(live, "--loss", "grpo_clip", "--old-log-probs", "engine")
    policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
    calls = count_forwards(policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    hist, m = grpo.train_step(learner(policy, optimizer), live["batch"], args, runtime, 0)
    # no no-grad pass: pi_old is the engine's
    assert calls and all(calls)
    assert "train/mismatch_kl" not in m
    assert hist[0]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(SystemExit):
        make(live, "--rollout-is", "tis", "--old-log-probs", "engine")


def test_dynamic_sampling_never_trains_on_a_zero_variance_group(live):
    sizes = ["--rollout-batch-size", "32", "--train-batch-size", "32"]
    args, _ = make(live, "--dynamic-sampling", *sizes)
    batch, m = collect(live["engine"], live["rows"], args, 1)
    raw = batch["raw"].view(-1, args.group_size)
    assert (raw.max(1).values > raw.min(1).values).all(), (
        "a zero-variance group reached the train batch"
    )
    assert len(batch["raw"]) <= args.rollout_batch_size
    assert m["train/dynamic_prompts_sampled"] >= len(raw)
    assert 0 <= m["train/dynamic_filtered_frac"] < 1
    assert m["time/dynamic_extra_generation"] >= 0
    plain_args, _ = make(live, *sizes)
    plain, _ = collect(live["engine"], live["rows"], plain_args, 1)
    # round 0 is the plain batch: its first group is kept unless it is flat
    G = args.group_size
    first_group_flat = plain["raw"][:G].max() == plain["raw"][:G].min()
    assert plain["responses"][:G] == batch["responses"][:G] or first_group_flat


def test_dynamic_sampling_with_no_variance_anywhere_trains_one_flat_batch(
    live, monkeypatch, capsys
):
    flat = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}

    def never_varies(response, ground_truth):
        return flat

    monkeypatch.setitem(grader.REWARD_FNS, "keyword", never_varies)
    args, _ = make(live, "--dynamic-sampling", "--dynamic-sampling-max-rounds", "2")
    batch, m = collect(live["engine"], live["rows"], args, 1)
    # a batch's worth, no more
    assert len(batch["raw"]) == args.rollout_batch_size
    assert not batch["advantages"].any()
    assert m["train/dynamic_filtered_frac"] == 1.0
    assert "no group with answer_reward variance" in capsys.readouterr().out


def scripted_rewards(monkeypatch, rewards):
    """The keyword reward replaced by a script: call i gets rewards[i] (then the last one). The
    grader runs in this process (--grader-workers 0) in input order, so the script decides each
    group's rewards."""
    calls = []

    def reward(response, ground_truth):
        calls.append(response)
        return rewards[min(len(calls), len(rewards)) - 1]

    monkeypatch.setitem(grader.REWARD_FNS, "keyword", reward)


def test_dynamic_filtered_frac_counts_flat_groups_only(live, monkeypatch):
    """4 prompts wanted; round 0: group 0 flat, groups 1-3 varied (3 kept); round 1 samples 2
    prompts, both varied, one needed. 1 flat group of 6 sampled: 1/6 (groups merely not needed
    are not "filtered")."""
    flat = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}
    right = {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}
    scripted_rewards(monkeypatch, [flat] * 4 + [flat, right] * 100)
    args, _ = make(live, "--dynamic-sampling")
    batch, m = collect(live["engine"], live["rows"], args, 1)
    assert m["train/dynamic_prompts_sampled"] == 6
    assert m["train/dynamic_filtered_frac"] == pytest.approx(1 / 6)
    assert len(batch["raw"]) == args.rollout_batch_size
    # the flat group the filter dropped counts: correctness over every group sampled
    assert m["train/all_wrong_frac"] == pytest.approx(1 / 6)
    assert m["train/all_correct_frac"] == 0.0


def test_dynamic_sampling_filters_on_accuracy_by_default(live, monkeypatch, capsys):
    """Groups that differ only in format reward (1.0 / 0.1 with the answer wrong everywhere) carry
    no accuracy signal: DAPO's filter drops them; --dynamic-sampling-on reward keeps them."""
    formatted = {"reward": 0.1, "format_reward": 1.0, "answer_reward": 0.0}
    unformatted = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}
    scripted_rewards(monkeypatch, [formatted, unformatted] * 1000)
    args, _ = make(live, "--dynamic-sampling", "--dynamic-sampling-max-rounds", "1")
    batch, m = collect(live["engine"], live["rows"], args, 1)
    assert m["train/dynamic_filtered_frac"] == 1.0
    assert "no group with answer_reward variance" in capsys.readouterr().out
    # the fallback trains nothing the filter calls signal: format differences get no advantage
    assert batch["raw"].view(-1, args.group_size).std(1).min() > 0
    assert not batch["advantages"].any()
    scripted_rewards(monkeypatch, [formatted, unformatted] * 1000)
    args, _ = make(live, "--dynamic-sampling", "--dynamic-sampling-on", "reward")
    batch, m = collect(live["engine"], live["rows"], args, 1)
    assert m["train/dynamic_filtered_frac"] == 0.0
    assert batch["advantages"].abs().min() > 0


def test_kl_to_the_initial_policy_is_exactly_zero_at_step_0_under_bf16(live):
    """bf16 autocast over fp32 master weights: the frozen pi_init keeps the policy's fp32 weights
    and runs under the same autocast, so at step 0 KL(pi || pi_init) and the KL penalty's gradient
    are exactly 0."""
    flags = ["--dtype", "bfloat16", "--kl-every", "1", "--loss", "grpo_clip"]
    flags += ["--max-grad-norm", "1e30"]  # no clipping
    args, runtime = make(live, "--kl-beta", "0.5", *flags)
    built = grpo.build_learner(args, runtime)
    policy = built["policy"]
    ref_model = built["ref_model"]
    assert next(ref_model.parameters()).dtype == torch.float32
    assert next(policy.parameters()).dtype == torch.float32
    grads = []
    for beta in ("0.5", "0.0"):
        args, _ = make(live, "--kl-beta", beta, *flags)
        params = list(policy.parameters())
        probe = torch.optim.SGD(params, lr=0.0)  # reads the gradient, moves nothing
        read_gradients(probe, params, grads)
        step_learner = learner(policy, probe, ref_model)
        _, m = grpo.train_step(step_learner, live["batch"], args, runtime, 0)
        assert m["train/kl_ref"] == 0.0
    assert grads[0].norm() > 0
    assert torch.equal(grads[0], grads[1])  # the penalty adds exactly nothing


def scratch_grpo(folder, edits):
    """grpo.py with `edits` ((anchor, replacement) pairs, each anchor found exactly once), written
    to folder and imported as a module of its own (grpo_scratch): a fork's change, tried."""
    import importlib.util

    with open(os.path.join(ROOT, "grpo.py")) as f:
        source = f.read()
    for anchor, replacement in edits:
        assert source.count(anchor) == 1, anchor
        source = source.replace(anchor, replacement)
    path = folder / "grpo_scratch.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("grpo_scratch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def moved_reference(live, args, runtime):
    """A reference policy moved off the initial weights by seeded noise, so that KL != 0."""
    ref = grpo.load_policy(live["model_dir"], args, runtime)[0]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return ref


def test_kl_in_reward_penalises_each_reward_and_adds_nothing_to_the_loss(live):
    """--kl-in reward (beta 0.5): each response's reward loses p = beta x sum_t (log pi - log
    pi_ref) over its response tokens; its advantage is the task reward's, group-normalised, minus p
    centred in its group (not divided by the reward std), as computed here by hand; train/reward
    stays the unpenalised mean and train/kl_penalty is the mean penalty. The loss has no KL term:
    the step's gradient is that of a --kl-beta 0 step trained on the same advantages."""
    flags = ["--kl-beta", "0.5", "--kl-in", "reward", "--max-grad-norm", "1e30"]
    args, runtime = make(live, *flags)
    assert (args.kl_in_reward, args.kl_in_loss, args.needs_ref) == (True, False, True)
    assert args.advantages_read_log_probs
    assert args.kl_estimator == "k1"
    policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
    ref_model = moved_reference(live, args, runtime)
    batch = live["batch"]
    tensors = grpo.collate(batch, args)
    ban = batch["ban_token_ids"]
    cur = grpo.batch_log_probs(policy, tensors, args, runtime, ban)
    ref = grpo.batch_log_probs(ref_model, tensors, args, runtime, ban)
    mask = tensors["response_mask"]
    penalty = [0.5 * ((cur[i] - ref[i]) * mask[i]).sum().item() for i in range(len(mask))]
    raw = batch["raw"].tolist()
    rewards = [r - p for r, p in zip(raw, penalty)]
    want = []  # by hand: (r - group mean) / (group std + eps), 0 for a flat group; - (p - mean p)
    G = args.group_size
    for g in range(0, len(raw), G):
        group = raw[g : g + G]
        std = statistics.stdev(group)
        for r, p in zip(group, penalty[g : g + G]):
            task = 0.0
            if max(group) > min(group):
                task = (r - statistics.fmean(group)) / (std + args.advantage_eps)
            want.append(task - (p - statistics.fmean(penalty[g : g + G])))
    seen = []
    real = grpo.advantages

    def spy(*a):
        seen.append(real(*a))
        return seen[-1]

    params = list(policy.parameters())
    grads = []
    probe = torch.optim.SGD(params, lr=0.0)
    read_gradients(probe, params, grads)
    grpo.advantages = spy
    try:
        _, m = grpo.train_step(learner(policy, probe, ref_model), batch, args, runtime, 0)
    finally:
        grpo.advantages = real
    adv = seen[0][0]
    trained_on = seen[0][1]
    assert trained_on.tolist() == pytest.approx(rewards, rel=1e-5, abs=1e-6)
    assert adv.tolist() == pytest.approx(want, rel=1e-4, abs=1e-5)
    plain_args, _ = make(live)
    assert not torch.allclose(adv, step_advantages(batch, plain_args)), "the penalty did nothing"
    assert m["train/kl_penalty"] == pytest.approx(statistics.fmean(penalty), rel=1e-5)
    g_plain, _, _ = step_gradient(live, "--max-grad-norm", "1e30", advantages=adv)
    assert grads[0].norm() > 0
    assert ((grads[0] - g_plain).norm() / g_plain.norm()).item() <= 1e-6


def test_kl_in_reward_no_baseline_trains_on_the_penalised_reward(live):
    """--loss no_baseline trains on the raw reward: with --kl-in reward, on the penalised one, so
    its gradient is a plain no_baseline step's on rewards minus the penalty."""
    flags = ["--loss", "no_baseline", "--max-grad-norm", "1e30"]
    args, runtime = make(live, "--kl-beta", "0.5", "--kl-in", "reward", *flags)
    policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
    ref_model = moved_reference(live, args, runtime)
    batch = live["batch"]
    tensors = grpo.collate(batch, args)
    log_probs = {
        "policy": grpo.batch_log_probs(policy, tensors, args, runtime, batch["ban_token_ids"]),
        "ref": grpo.batch_log_probs(ref_model, tensors, args, runtime, batch["ban_token_ids"]),
    }
    _, penalised, _ = grpo.advantages(batch, tensors, log_probs, args)
    params = list(policy.parameters())
    grads = []
    probe = torch.optim.SGD(params, lr=0.0)
    read_gradients(probe, params, grads)
    grpo.train_step(learner(policy, probe, ref_model), batch, args, runtime, 0)
    want, _, _ = step_gradient(live, *flags, batch=dict(batch, raw=penalised))
    assert not torch.equal(penalised, batch["raw"])
    assert ((grads[0] - want).norm() / want.norm()).item() <= 1e-6


def test_kl_in_reward_keeps_the_filters_score_and_zero_fallback_groups():
    """--dynamic-sampling with --kl-in reward: the filter reads its own score before the penalty,
    so group 1 (flat in answer reward, only its format and penalty vary) keeps zero advantages
    while group 0's move by its centred penalty. Without the filter a group of equal rewards gets
    the centred penalty alone: a KL-sized advantage, not a normalised +-1."""
    rewards = [RIGHT, FORMATTED, RIGHT, UNFORMATTED] + [UNFORMATTED] * 4
    batch = scored_batch(rewards)
    mask = torch.ones(8, 3, dtype=torch.bool)
    policy = torch.linspace(-2.0, -1.0, 24).view(8, 3)  # (N, T) log-probs
    log_probs = {"policy": policy, "ref": torch.full((8, 3), -1.5)}
    penalty = 0.5 * (policy + 1.5).sum(dim=1)  # (N,)
    centred = penalty.view(2, 4) - penalty.view(2, 4).mean(dim=1, keepdim=True)  # (groups, G)
    for flags in (["--dynamic-sampling"], []):
        args = summarize_args(*flags, "--kl-beta", "0.5", "--kl-in", "reward")
        adv, rewards_out, m = grpo.advantages(batch, {"policy_mask": mask}, log_probs, args)
        plain = step_advantages(batch, summarize_args(*flags))
        assert torch.allclose(rewards_out, batch["raw"] - penalty)
        assert torch.allclose(adv[:4], plain[:4] - centred[0])
        assert m["train/kl_penalty"] == pytest.approx(penalty.mean().item())
        if flags:
            assert adv[4:].tolist() == [0.0] * 4  # the filter's flat group
        else:
            assert torch.allclose(adv[4:], -centred[1])  # equal rewards: the penalty alone
            assert adv[4:].abs().max() < 0.5


def test_a_reward_that_reads_the_policy_is_a_resolve_line_and_the_phase(live, tmp_path):
    """The promise at grpo.advantages, kept in a scratch copy of grpo.py: a fork sets
    args.advantages_read_log_probs in resolve (one line) and reads log_probs in the phase (one
    line here); under otherwise default flags train_step then scores pi_t and pi_ref and hands
    them over (equal at step 0: the reference is the initial policy)."""
    derived = "    args.advantages_read_log_probs = args.kl_in_reward\n"
    phase_end = "    return adv, rewards, metrics\n"
    reads = "    metrics['x'] = (log_probs['policy'] - log_probs['ref']).abs().sum()\n"
    forked = derived.replace("args.kl_in_reward", "True")
    edits = [(derived, forked), (phase_end, reads + phase_end)]
    fork = scratch_grpo(tmp_path, edits)
    flags = ["--out", str(tmp_path / "run"), "--min-tokens", "4"]
    args = fork.parse_args(tiny_flags(live["model_dir"], live["task"], *flags))
    assert args.needs_ref and args.kl_beta == 0
    runtime = fork.setup_runtime(args)
    learner_ = fork.build_learner(args, runtime)
    assert learner_["ref_model"] is not None
    _, m = fork.train_step(learner_, live["batch"], args, runtime, 0)
    assert m["x"].item() == 0.0


def test_where_the_kl_acts_is_derived_once_and_saved(tmp_path, capsys):
    """resolve derives where the KL acts (kl_in_loss, kl_in_reward) and whether the reference
    policy is needed (needs_ref); args.json holds them. --kl-in reward wants k1 and a beta."""
    cases = [
        ([], (False, False, False)),
        (["--kl-every", "2"], (False, False, True)),
        (["--kl-beta", "0.1"], (True, False, True)),
        (["--kl-beta", "0.1", "--kl-in", "reward"], (False, True, True)),
    ]
    for flags, want in cases:
        args = grpo.parse_args(["--out", str(tmp_path / "run"), *flags])
        assert (args.kl_in_loss, args.kl_in_reward, args.needs_ref) == want, flags
    (tmp_path / "run").mkdir()
    grpo.write_settings(args, {})
    with open(tmp_path / "run" / "args.json") as f:
        saved = json.load(f)
    assert (saved["kl_in_loss"], saved["kl_in_reward"], saved["needs_ref"]) == want
    one_line_refusal(capsys, ["--kl-in", "reward"], "set --kl-beta > 0")
    flags = ["--kl-in", "reward", "--kl-beta", "0.1", "--kl-estimator", "k3"]
    one_line_refusal(capsys, flags, "pass --kl-estimator k1 (not k3")


def test_mismatch_kernel_kl_is_kl_of_the_engine_to_the_generating_policy(live):
    """On a one-version-stale batch (lag 1), train/mismatch_kernel_kl = KL(mu || pi_prev),
    estimated by k3 on the engine's samples: E_mu[pi_prev / mu - 1 - log(pi_prev / mu)]. mu is
    shifted 1 nat below the engine's own log-probs, so the right order reads about e - 2 = 0.72
    and the swapped one (chi^2 - KL) about 0.37."""
    args, runtime = make(live, "--loss", "grpo_clip", "--kl-every", "1")
    policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
    prev_model = grpo.load_policy(live["model_dir"], args, runtime)[0]
    prev_model.holds_step = -1  # it generated the batch of step 0: the policy one update before
    mu = [[x - 1.0 for x in lp] for lp in live["batch"]["engine_logprobs"]]
    batch = dict(live["batch"], engine_logprobs=mu)
    tensors = grpo.collate(batch, args)
    prev = grpo.batch_log_probs(prev_model, tensors, args, runtime, batch["ban_token_ids"])
    log_r = (prev - tensors["engine_log_probs"])[tensors["response_mask"]]  # log(pi_prev / mu)
    want = (log_r.exp() - 1 - log_r).mean().item()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    ref_model = grpo.load_policy(live["model_dir"], args, runtime)[0]
    stale = learner(policy, optimizer, ref_model, prev_model)
    _, m = grpo.train_step(stale, batch, args, runtime, 0, lag=1)
    assert m["train/mismatch_kernel_kl"] == pytest.approx(want, rel=1e-5)
    assert m["train/mismatch_kernel_kl"] == pytest.approx(math.e - 2, abs=1e-3)


def test_mask_truncated_and_overlong_buffer(live):
    """The overlong penalty by hand; --mask-truncated takes a truncated row out of the loss mask,
    not out of the response mask: a KL still measures its tokens (here --kl-in reward's penalty,
    beta x its length for log pi - log pi_ref = 1 per token)."""
    flags = ["--mask-truncated", "--overlong-buffer", "8", "--kl-beta", "0.5", "--kl-in", "reward"]
    args, _ = make(live, *flags)
    batch = {}  # a copy of the live batch: score writes into it
    for k, v in live["batch"].items():
        if isinstance(v, list):
            batch[k] = list(v)
        elif torch.is_tensor(v):
            batch[k] = v.clone()
        else:
            batch[k] = v
    lens = [len(r) for r in batch["response_ids"]]
    grpo.score(batch, args)  # max_tokens 16, buffer 8: penalty 0 up to 8 tokens, linear to -1 at 16
    for n, raw, d in zip(lens, batch["raw"], batch["rewards"]):
        assert raw == pytest.approx(d["reward"] - max(0.0, min(1.0, (n - 8) / 8)))
    tensors = grpo.collate(batch, args)
    trunc = torch.tensor(batch["truncated"])
    assert trunc.any()
    assert not tensors["loss_mask"][trunc].any()
    assert tensors["loss_mask"][~trunc].any(1).all()
    assert tensors["response_mask"].sum(1).tolist() == lens  # every response token, each row
    shape = tensors["response_mask"].shape
    log_probs = {"policy": torch.zeros(shape), "ref": torch.full(shape, -1.0)}
    _, penalised, _ = grpo.advantages(batch, tensors, log_probs, args)
    want = [raw - 0.5 * n for raw, n in zip(batch["raw"].tolist(), lens)]
    assert penalised.tolist() == pytest.approx(want)


def kimi_by_hand(lengths, correct, G):
    """Kimi k1.5's length reward of each response, in plain Python (group by group)."""
    out = []
    for g in range(0, len(lengths), G):
        lo = min(lengths[g : g + G])
        hi = max(lengths[g : g + G])
        for n, right in zip(lengths[g : g + G], correct[g : g + G]):
            lam = 0.0
            if hi > lo:
                lam = 0.5 - (n - lo) / (hi - lo)
            if not right:
                lam = min(0.0, lam)
            out.append(lam)
    return out


def test_length_and_language_rewards_add_to_the_overlong_penalty(live):
    """grpo.score: each shaping term by hand, and their sum is the reward trained on; summarize
    logs their means."""
    flags = ["--overlong-buffer", "8", "--length-reward-weight", "0.5"]
    flags += ["--language-reward-weight", "0.25"]
    args, _ = make(live, *flags)
    batch = {}  # a copy of the live batch: score writes into it
    for k, v in live["batch"].items():
        if isinstance(v, list):
            batch[k] = list(v)
        else:
            batch[k] = v
    grpo.score(batch, args)
    lens = [len(r) for r in batch["response_ids"]]
    correct = [grader.is_correct(d) for d in batch["rewards"]]
    kimi = kimi_by_hand(lens, correct, args.group_size)
    assert len(set(kimi)) > 1, "the live groups should differ in length"
    language = [grader.language_fraction(r) for r in batch["responses"]]
    for i, (n, d) in enumerate(zip(lens, batch["rewards"])):
        overlong = -max(0.0, min(1.0, (n - 8) / 8))
        want = d["reward"] + overlong + 0.5 * kimi[i] + 0.25 * language[i]
        assert batch["raw"][i].item() == pytest.approx(want, abs=1e-6)
    stats = shard_stats(1.0, 0.5, 0.0, len(lens) // args.group_size, 0)
    m = grpo.summarize(batch, [stats], args)
    assert m["train/length_reward"] == pytest.approx(0.5 * statistics.fmean(kimi), abs=1e-6)
    assert m["train/language_fraction"] == pytest.approx(statistics.fmean(language))
    assert {"train/length_reward", "train/language_fraction"} <= glossary_keys()


def test_curriculum_weights_and_draws_follow_the_success_rates():
    """After a step where prompt 0 is always solved its weight is 1 - (0.5 x 0.5 + 0.5 x 1) =
    0.25, a half-solved one keeps 0.5; solved again and again it reaches the floor. Draws are
    without replacement, by weight, fixed by the step's seed; a prompt written twice moves as
    one."""
    args = summarize_args("--curriculum")  # 2 prompts x G = 4 a step, decay 0.5, floor 0.05
    rows = [{"prompt": f"question {i}"} for i in range(5)] + [{"prompt": "question 1"}]
    cur = grpo.Curriculum(rows, args)
    assert cur.weights().tolist() == [0.5] * 6  # unseen: s = 0.5
    batch = {
        "prompts": ["question 0"] * 4 + ["question 1"] * 4,
        "correct": [True] * 4 + [True, False, True, False],
    }
    outcomes = grpo.group_outcomes(batch, args)
    assert outcomes == [("question 0", 1.0), ("question 1", 0.5)]
    cur.update(outcomes)
    assert cur.weights().tolist() == [0.25, 0.5, 0.5, 0.5, 0.5, 0.5]
    for _ in range(5):
        cur.update(outcomes)
    s0 = 1 - 0.5**7  # six updates towards 1 from 0.5
    assert cur.success[0] == pytest.approx(s0)
    assert cur.weights()[0].item() == 0.05  # max(floor, 1 - s0 = 0.0078)
    assert cur.success[1] == cur.success[5] == 0.5
    counts = [0] * 6
    for step in range(300):
        picks = cur.choose(step)
        assert len(set(picks)) == len(picks) == 2
        assert picks == cur.choose(step)
        for j in picks:
            counts[j] += 1
    assert counts[0] < min(counts[1:]) / 3, counts  # weight 0.05 against 0.5
    with pytest.raises(SystemExit):  # a resumed state of another data set: one line
        grpo.Curriculum(rows[:3], args, cur.success)


def test_curriculum_resume_refuses_the_rates_of_other_prompts(capsys):
    """The checkpoint's rates name their prompts (a hash, in order): the same number of prompts
    in another order (another --data-seed, --keep-pass-rate) is one line, not a silent shift; a
    checkpoint from before the hash (a bare list) is checked by its length."""
    args = summarize_args("--curriculum")
    rows = [{"prompt": f"question {i}"} for i in range(5)]
    cur = grpo.Curriculum(rows, args)
    cur.update([("question 0", 1.0)])
    saved = cur.state()
    assert grpo.Curriculum(rows, args, saved).success == cur.success
    assert grpo.Curriculum(rows, args, saved["success"]).success == cur.success
    with pytest.raises(SystemExit):
        grpo.Curriculum(rows[::-1], args, saved)
    assert "curriculum's prompts differ" in capsys.readouterr().err


def test_curriculum_learns_from_the_groups_dynamic_sampling_drops(monkeypatch):
    """--dynamic-sampling drops an always-solved prompt's flat group from the batch, but collect's
    stats["group_outcomes"] keep it: the curriculum lowers that prompt's weight below a
    half-solved one's (learning from the kept batch alone left it at 0.5, above)."""
    args = summarize_args("--curriculum", "--dynamic-sampling", "--min-tokens", "0")
    G = args.group_size
    script = {"easy": [RIGHT] * G, "half": [RIGHT, UNFORMATTED] * (G // 2)}
    rows = [{"prompt": "easy"}, {"prompt": "half"}, {"prompt": "half"}]

    def fake_rollout(engine, rows, args, seed, tool=None):
        prompts = [row["prompt"] for row in rows for _ in range(G)]
        return {"prompts": prompts, "response_ids": [[1]] * len(prompts)}

    def fake_score(batch, args):
        rewards = []
        for g in range(0, len(batch["prompts"]), G):
            rewards += script[batch["prompts"][g]]
        batch["rewards"] = rewards
        batch["correct"] = [grader.is_correct(d) for d in rewards]
        batch["raw"] = torch.tensor([d["reward"] for d in rewards])
        return batch

    monkeypatch.setattr(grpo, "rollout", fake_rollout)
    monkeypatch.setattr(grpo, "score", fake_score)
    cur = grpo.Curriculum(rows, args)
    batch, stats = grpo.collect(None, rows, args, 0, picks=[0, 1])
    assert "easy" not in batch["prompts"]  # the filter dropped it
    assert stats["group_outcomes"][:2] == [("easy", 1.0), ("half", 0.5)]
    cur.update(stats["group_outcomes"])
    weights = cur.weights().tolist()
    assert weights[0] <= 0.25 and weights[1] == weights[2] == 0.5  # (easy again in round 1?)


def test_length_reward_counts_the_tokens_the_policy_sampled(monkeypatch):
    """With policy masks (--tools, --thinking-budget) a response's length is sum(mask), the count
    train/response_len_mean logs: four responses of 10 tokens, of which the policy sampled 2, 4,
    6, 8, get lambda 0.5 - (n - 2) / 6, not the 0 of equal lengths."""
    args = summarize_args("--length-reward-weight", "1", "--grader-workers", "0")
    monkeypatch.setitem(grader.REWARD_FNS, args.reward, lambda response, truth: RIGHT)
    sampled = [2, 4, 6, 8]
    batch = {
        "responses": ["r"] * 4,
        "ground_truths": ["t"] * 4,
        "response_ids": [[1] * 10] * 4,
        "policy_masks": [[1] * n + [0] * (10 - n) for n in sampled],
    }
    grpo.score(batch, args)
    want = kimi_by_hand(sampled, [True] * 4, 4)
    assert batch["length_reward"].tolist() == pytest.approx(want)
    assert want == pytest.approx([0.5, 1 / 6, -1 / 6, -0.5])


def test_pass_rate_filter_errors_name_the_flag_to_change(tmp_path, capsys):
    """A pass-rate file short of the training prompts names the eval's --limit; a --keep-pass-rate
    that keeps none, or fewer than a step draws (2), names --keep-pass-rate."""
    flags = [
        "--train-n",
        "8",
        "--group-size",
        "4",
        "--rollout-batch-size",
        "8",
        "--train-batch-size",
        "8",
    ]
    rows = grpo.load_rows(grpo.parse_args(flags))[0]
    path = tmp_path / "pass_rates.jsonl"
    with open(path, "w") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({"prompt": row["prompt"], "pass_rate": min(i, 1) * 0.5}) + "\n")
    cases = [
        (["--train-n", "16", "--keep-pass-rate", "0", "1"], "a --limit that covers"),
        (["--keep-pass-rate", "0.9", "1"], "--keep-pass-rate 0.9 1 keeps no prompt"),
        (
            ["--keep-pass-rate", "0", "0"],
            "1 train questions < 2 prompts per rollout batch: a wider",
        ),
    ]
    for extra, message in cases:
        args = grpo.parse_args(flags + ["--pass-rates", str(path)] + extra)
        with pytest.raises(SystemExit):
            grpo.load_data(args)
        assert message in capsys.readouterr().err, extra


def test_sample_seeds_never_overlap():
    """Each (step, round) owns a block of 2^20 seeds; a call uses prompts x G of them."""
    args = grpo.parse_args(["--seed", "3"])
    starts = []
    for s in range(50):
        for r in range(4):
            starts.append(grpo.sample_seed(args, s, r))
    starts.sort()
    assert all(b - a >= 2**20 for a, b in zip(starts, starts[1:]))
    assert args.rollout_batch_size * 4 <= 2**20


def test_shared_prefix_gives_the_same_step(live):
    """--shared-prefix (each group's prompt once, its G responses packed on the prompt's KV cache)
    changes no number: no-grad log-probs within 2e-5 (fp32 rounding: the packed path's masked
    attention sums in another order, and this model's N(0, 0.2) weights amplify it; on the
    embedded model's weights the bound is 1e-5, test_losses), step 0's loss, grad norm and entropy
    within 1e-5 relative."""
    log_probs = {}  # flag -> (N, T) no-grad log-probs
    first = {}  # flag -> step 0's history row
    for flag in ("--shared-prefix", "--no-shared-prefix"):
        args, runtime = make(live, "--loss", "grpo_clip", flag)
        policy = grpo.load_policy(live["model_dir"], args, runtime)[0]
        # the flag as given, and the model's cache check kept it
        assert args.shared_prefix == (flag == "--shared-prefix")
        assert runtime["shared_prefix"] == (flag == "--shared-prefix")
        tensors = grpo.collate(live["batch"], args)
        log_probs[flag] = grpo.batch_log_probs(
            policy, tensors, args, runtime, live["batch"]["ban_token_ids"]
        )
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        hist, _ = grpo.train_step(learner(policy, optimizer), live["batch"], args, runtime, 0)
        first[flag] = hist[0]
    mask = tensors["response_mask"]
    diff = log_probs["--shared-prefix"] - log_probs["--no-shared-prefix"]
    assert diff[mask].abs().max() <= 2e-5
    # (Adam's first step is sign(g): not compared)
    for k in ("train/loss", "train/grad_norm", "train/entropy"):
        want = pytest.approx(first["--no-shared-prefix"][k], rel=1e-5, abs=1e-7)
        assert first["--shared-prefix"][k] == want, k


def test_sync_makes_engine_match_policy(live):
    args = live["args"]
    runtime = live["runtime"]
    policy, tok = grpo.load_policy(live["model_dir"], args, runtime)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-2)
    grpo.train_step(learner(policy, optimizer), live["batch"], args, runtime, 0)
    grpo.engines.load_policy_into_vllm(policy, live["engine"])
    prompts = [r["prompt"] for r in live["rows"][:4]]
    outs = grpo.engines.generate(live["engine"], prompts, n=1, temperature=0.0, max_tokens=10)
    policy.eval()
    for o in outs:
        ids = torch.tensor([o[0]["prompt_token_ids"]])
        with torch.no_grad():
            out = policy.generate(
                ids, max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id
            )
        hf = out[0, ids.shape[1] :]
        engine_ids = o[0]["token_ids"]
        assert hf.tolist()[: len(engine_ids)] == engine_ids, (
            "engine greedy tokens differ from the policy's"
        )


# ----------------------------------------------------------------------------- LoRA (lora.py)
def lora_learner(live, *flags):
    """(args, runtime, grpo.build_learner's dict) of a rank-4 LoRA run on the live batch's flags."""
    args, runtime = make(live, "--lora-rank", "4", *flags)
    return args, runtime, grpo.build_learner(args, runtime)


def test_lora_push_gives_the_engine_the_merged_model(live, tmp_path):
    """A LoRA policy with B != 0, pushed: the vLLM engine's greedy tokens are those of peft's own
    merge (PeftModel.from_pretrained on the saved adapter, merge_and_unload) in transformers. The
    chunked log-prob head and the shared-prefix path score the LoRA policy as that merged model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    args, runtime, built = lora_learner(live)
    policy = built["policy"]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    lora.save_adapter(policy, str(tmp_path), base=live["model_dir"])
    base = AutoModelForCausalLM.from_pretrained(live["model_dir"], dtype=torch.float32).eval()
    fresh = AutoModelForCausalLM.from_pretrained(live["model_dir"], dtype=torch.float32)
    merged = PeftModel.from_pretrained(fresh, str(tmp_path)).merge_and_unload().eval()
    prompts = [r["prompt"] for r in live["rows"][:4]]
    changed = 0  # prompts whose greedy tokens the adapters change
    try:
        grpo.engines.load_policy_into_vllm(policy, live["engine"])
        outs = grpo.engines.generate(live["engine"], prompts, n=1, temperature=0.0, max_tokens=10)
    finally:  # the other tests' engine holds the base
        grpo.engines.load_policy_into_vllm(base, live["engine"])
    for o in outs:
        ids = torch.tensor([o[0]["prompt_token_ids"]])
        engine_ids = o[0]["token_ids"]
        with torch.no_grad():
            hf = merged.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0)
            plain = base.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert hf[0, ids.shape[1] :].tolist()[: len(engine_ids)] == engine_ids
        changed += plain[0, ids.shape[1] :].tolist()[: len(engine_ids)] != engine_ids
    assert changed > 0
    # the chunked head runs over the LoRA body; with and without the shared prefix
    assert policy._logprob_fast_path and runtime["shared_prefix"]
    tensors = grpo.collate(live["batch"], args)
    mask = tensors["response_mask"]
    ban = live["batch"]["ban_token_ids"]
    plain_runtime = dict(runtime, shared_prefix=False)
    want = grpo.batch_log_probs(merged, tensors, args, plain_runtime, ban)
    before = grpo.batch_log_probs(base, tensors, args, plain_runtime, ban)
    assert (want - before)[mask].abs().max() > 0.1
    for shared in (True, False):
        got = grpo.batch_log_probs(policy, tensors, args, dict(runtime, shared_prefix=shared), ban)
        assert (got - want)[mask].abs().max() <= 1e-4, shared


def test_lora_trains_only_fp32_adapters_against_the_base_with_adapters_off(live):
    """LoRA: the optimizer holds the adapters only (fp32), the base never moves; the KL reference is
    the policy with its adapters off (no frozen copy): KL 0 at step 0, the base model's own
    log-probs later; pi_{t-1} is a copy of the adapters (at step 1 it is pi_0, whose B = 0: the
    base, so kl_prev = kl_ref)."""
    flags = ["--kl-beta", "0.5", "--kl-every", "1", "--loss", "grpo_clip"]
    args, runtime, built = lora_learner(live, *flags)
    policy = built["policy"]
    assert args.frozen_models == 0
    assert built["ref_model"] is policy and built["prev_model"] is None
    adapters = {}
    for name, p in policy.named_parameters():
        if ".lora_" in name:
            adapters[name] = p
    held = [p for group in built["optimizer"].param_groups for p in group["params"]]
    n_linear = 7 * policy.config.num_hidden_layers  # q k v o gate up down
    assert len(held) == len(adapters) == 2 * n_linear
    assert {id(p) for p in held} == {id(p) for p in adapters.values()}
    assert all(p.dtype == torch.float32 for p in held)
    frozen = {}
    for name, p in policy.named_parameters():
        if ".lora_" not in name:
            frozen[name] = p.detach().clone()
    _, m0 = grpo.train_step(built, live["batch"], args, runtime, 0)
    assert m0["train/kl_ref"] == 0.0
    _, m1 = grpo.train_step(built, live["batch"], args, runtime, 1)
    assert m1["train/kl_ref"] > 0
    assert m1["train/kl_prev"] == m1["train/kl_ref"]
    for name, p in policy.named_parameters():
        if ".lora_" not in name:
            assert torch.equal(p, frozen[name]), name
    tensors = grpo.collate(live["batch"], args)
    ban = live["batch"]["ban_token_ids"]
    base = grpo.load_policy(live["model_dir"], args, runtime)[0]
    with lora.adapters_off(policy):
        off = grpo.batch_log_probs(policy, tensors, args, runtime, ban)
    assert torch.equal(off, grpo.batch_log_probs(base, tensors, args, runtime, ban))
    on = grpo.batch_log_probs(policy, tensors, args, runtime, ban)
    assert not torch.equal(on, off)  # and the adapters are back on


def test_engine_share_on_a_shared_gpu_counts_the_trainers_memory(monkeypatch):
    """The one-GPU split: the policy's fp32 weights + AdamW moments (12 B/param), 2 frozen copies
    for --kl-every in the weights' dtype (fp32: 8 B/param), fp32 grads unless --sleep-engine
    (4 B/param), a 15% margin. No policy beside it (a Ray generator actor): 0.85. The GPU's size
    is the one stand-in (no CUDA here)."""
    from types import SimpleNamespace

    def one_gigabyte_gpu(dev):
        return SimpleNamespace(total_memory=10**9)

    monkeypatch.setattr(torch.cuda, "get_device_properties", one_gigabyte_gpu)
    policy = torch.nn.Linear(1000, 10_000, bias=False)  # 10M params
    # the policy on cuda:0, the engine on "cuda" (= cuda:0), fp32 master weights
    shared = ("cuda:0", "cuda", torch.float32)
    share = hardware.engine_share(*shared, False, policy, extra_models=2)
    assert share == pytest.approx(1 - 0.24 - 0.15)
    assert hardware.engine_share(*shared, False, policy=None) == 0.85
    assert hardware.engine_share("cuda:0", "cuda:1", torch.float32, False, policy) == 0.85
    share = hardware.engine_share(*shared, True, policy, extra_models=2)  # --sleep-engine
    assert share == pytest.approx(1 - 0.2 - 0.15)


def recorded(calls, name, real):
    """`real`, appending `name` to `calls` before each call."""

    def call(*a, **kw):
        calls.append(name)
        return real(*a, **kw)

    return call


def test_sleep_engine_call_order(live, monkeypatch, tmp_path):
    """--sleep-engine (one shared GPU): the engine sleeps once the step's generations (and eval)
    are done and wakes, the new weights pushed in, before the next generation. On CPU sleep is a
    no-op (vLLM's sleep mode needs CUDA): this checks the order a GPU run takes; the memory it
    frees there is not measured here."""
    calls = []

    def make_engine(path, args, runtime, policy=None):
        return live["engine"]

    monkeypatch.setattr(grpo, "make_engine", make_engine)
    for name in ("sleep_engine", "wake_engine", "generate"):
        monkeypatch.setattr(grpo.engines, name, recorded(calls, name, getattr(grpo.engines, name)))
    monkeypatch.setattr(grpo, "train_step", recorded(calls, "train", grpo.train_step))
    flags = tiny_flags(live["model_dir"], live["task"], "--sleep-engine", "--n-grpo-steps", "2")
    grpo.main(grpo.parse_args(flags + ["--out", str(tmp_path / "run")]))
    step = ["generate", "generate", "sleep_engine", "train", "wake_engine"]
    # each step: rollout, eval, sleep, train, wake + push; then the final eval on the woken engine
    assert calls == step + step + ["generate"], calls
    monkeypatch.undo()
    # the flags as given, and next to them what grpo.main decided from them
    with open(tmp_path / "run" / "args.json") as f:
        args = json.load(f)
    assert args["vllm_device"] is None
    assert args["shared_prefix"] is None
    with open(tmp_path / "run" / "runtime.json") as f:
        runtime = json.load(f)
    assert set(runtime) == RUNTIME_KEYS
    assert runtime["vllm_device"] == args["policy_device"]
    # the fixture's weights back
    initial = grpo.load_policy(live["model_dir"], live["args"], live["runtime"])[0]
    grpo.engines.load_policy_into_vllm(initial, live["engine"])


def test_collate_uses_engine_token_ids(live):
    b = live["batch"]
    t = grpo.collate(b, live["args"])
    p = b["prompt_ids"][0]
    r = b["response_ids"][0]
    s = len(p) - 1  # the label of the first response token
    assert t["labels"][0, s : s + len(r)].tolist() == r
    assert t["response_mask"][0].sum() == len(r)
    assert t["response_mask"][0, s]
    assert t["ban_mask"][0].sum() == min(len(r), 4)
    assert t["ban_mask"][0, s]


# ----------------------------------------------------------------------------- Ctrl-C, bad input
def test_ctrl_c_mid_update_saves_a_consistent_step(
    tiny_model_dir, task_file, tmp_path, monkeypatch, ctrl_c
):
    """SIGINT during step 1's first microbatch: the step finishes, is counted and saved; resuming
    trains step 2 only, and the weights equal a straight run's."""
    flags = tiny_flags(
        tiny_model_dir, task_file, "--engine", "hf", "--eval-every", "0", "--n-grpo-steps", "3"
    )
    real_step = grpo.train_step
    real_microbatch = losses.grpo_microbatch_loss
    calls = {}  # step -> microbatch calls

    def train_step(learner, batch, args, runtime, step, *a, **kw):
        calls[step] = 0
        return real_step(learner, batch, args, runtime, step, *a, **kw)

    def microbatch(*a, **kw):
        step = max(calls)
        if step == 1 and calls[step] == 0:
            os.kill(os.getpid(), signal.SIGINT)
        calls[step] += 1
        return real_microbatch(*a, **kw)

    monkeypatch.setattr(grpo, "train_step", train_step)
    monkeypatch.setattr(losses, "grpo_microbatch_loss", microbatch)
    assert threading.current_thread() is threading.main_thread()
    with pytest.raises(SystemExit) as exit_:
        grpo.main(grpo.parse_args(flags + ["--out", str(tmp_path / "cut")]))
    assert exit_.value.code == 130
    monkeypatch.undo()
    with open(tmp_path / "cut" / "checkpoint" / "state.json") as f:
        state = json.load(f)
    # step 1 finished after the signal
    assert state["step"] == 2
    assert sorted(calls) == [0, 1]
    assert calls[1] == calls[0]
    run_grpo(["--resume", str(tmp_path / "cut")])
    run_grpo(flags, tmp_path / "straight")
    assert [r["step"] for r in train_metrics(metrics(tmp_path / "cut"))] == [0, 1, 2]
    from safetensors.torch import load_file

    cut = load_file(str(tmp_path / "cut" / "checkpoint" / "model.safetensors"))
    straight = load_file(str(tmp_path / "straight" / "checkpoint" / "model.safetensors"))
    assert all(torch.allclose(cut[k], straight[k], atol=1e-6) for k in cut)


# the SIGTERM tests' steps: 2 prompts x 4 samples of <= 8 tokens (a step's cost is not the point)
STOP_FLAGS = ["--engine", "hf", "--eval-every", "0", "--rollout-batch-size", "8"]
STOP_FLAGS += ["--train-batch-size", "8", "--max-tokens", "8"]


def send_sigterm_before(module, name, when=None):
    """Wrap module.name so that it sends this process a SIGTERM (when when(*args) holds) and then
    runs."""
    real = getattr(module, name)

    def call(*a, **kw):
        if when is None or when(*a):
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **kw)

    return call


def test_sigterm_saves_the_steps_done_with_save_every_0(
    tiny_model_dir, task_file, tmp_path, monkeypatch, sigterm, capsys
):
    """SIGTERM (a scheduler's stop) with the demo's --save-every 0: during step 1's rollout, the
    step done is saved and exit 143; --resume trains steps 1 and 2, and a SIGTERM during its final
    eval still saves them."""
    flags = tiny_flags(tiny_model_dir, task_file, *STOP_FLAGS)
    flags += ["--save-every", "0", "--n-grpo-steps", "3", "--out", str(tmp_path / "run")]

    def step_1(engine, train_rows, args, step, *a):
        return step == 1

    monkeypatch.setattr(grpo, "collect", send_sigterm_before(grpo, "collect", step_1))
    with pytest.raises(SystemExit) as exit_:
        grpo.main(grpo.parse_args(flags))
    assert exit_.value.code == 143
    assert "SIGTERM: saving checkpoint" in capsys.readouterr().out
    monkeypatch.undo()
    with open(tmp_path / "run" / "checkpoint" / "state.json") as f:
        state = json.load(f)
    rows = train_metrics(metrics(tmp_path / "run"))
    assert state["step"] == 1
    assert [r["step"] for r in rows] == [0]
    assert state["opt_step"] == rows[-1]["opt_step"]

    monkeypatch.setattr(validation, "greedy_eval", send_sigterm_before(validation, "greedy_eval"))
    with pytest.raises(SystemExit) as exit_:
        grpo.main(grpo.parse_args(["--resume", str(tmp_path / "run")]))
    assert exit_.value.code == 143
    assert "SIGTERM: final eval skipped; saving checkpoint" in capsys.readouterr().out
    with open(tmp_path / "run" / "checkpoint" / "state.json") as f:
        assert json.load(f)["step"] == 3
    assert [r["step"] for r in train_metrics(metrics(tmp_path / "run"))] == [0, 1, 2]


def test_sigterm_while_loading_is_one_line(
    tiny_model_dir, task_file, tmp_path, monkeypatch, sigterm, capsys
):
    """SIGTERM before the first step (the model loading): exit 143 with one line, no traceback."""
    flags = tiny_flags(tiny_model_dir, task_file, *STOP_FLAGS, "--out", str(tmp_path / "run"))
    monkeypatch.setattr(grpo, "build_learner", send_sigterm_before(grpo, "build_learner"))
    with pytest.raises(SystemExit) as exit_:
        grpo.main(grpo.parse_args(flags))
    assert exit_.value.code == 143
    err = capsys.readouterr().err
    assert err.strip() == "SIGTERM while loading: stopped before training; nothing saved"


def test_a_second_sigterm_stops_at_once_keeping_the_last_checkpoint(
    tiny_model_dir, task_file, tmp_path, monkeypatch, sigterm, capsys
):
    """Two SIGTERMs in step 1's first microbatch: the first would let the step finish, the second
    stops at once (no further microbatch) with exit 143 and one line; the checkpoint of step 1
    (--save-every 1) stays."""
    flags = tiny_flags(tiny_model_dir, task_file, *STOP_FLAGS)
    flags += ["--save-every", "1", "--n-grpo-steps", "3", "--out", str(tmp_path / "run")]
    real_step = grpo.train_step
    real_microbatch = losses.grpo_microbatch_loss
    calls = {}  # step -> microbatch calls

    def train_step(learner, batch, args, runtime, step, *a, **kw):
        calls[step] = 0
        return real_step(learner, batch, args, runtime, step, *a, **kw)

    def microbatch(*a, **kw):
        step = max(calls)
        calls[step] += 1
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_microbatch(*a, **kw)

    monkeypatch.setattr(grpo, "train_step", train_step)
    monkeypatch.setattr(losses, "grpo_microbatch_loss", microbatch)
    with pytest.raises(SystemExit) as exit_:
        grpo.main(grpo.parse_args(flags))
    assert exit_.value.code == 143
    err = capsys.readouterr().err
    assert "aborted inside step 1's updates: nothing saved" in err
    assert "Traceback" not in err
    assert calls[1] == 1
    with open(tmp_path / "run" / "checkpoint" / "state.json") as f:
        assert json.load(f)["step"] == 1


@pytest.mark.parametrize(
    "bad,msg",
    [
        ("--train-batch-size 10 --gradient-accumulation-steps 3", "divisible"),
        ("--rollout-batch-size 12 --group-size 8", "--group-size"),
        (
            "--train-batch-size 4 --group-size 8 --gradient-accumulation-steps 1",
            ">= --group-size",
        ),
        (
            "--rollout-batch-size 64 --train-batch-size 48 --gradient-accumulation-steps 1",
            "multiple of",
        ),
        ("--gradient-accumulation-steps 0", "integer > 0"),
        ("--group-size 0", "integer > 0"),
        ("--max-tokens 0", "integer > 0"),
        ("--top-p 2", "probability"),
        ("--temperature inf", "finite"),
        ("--min-tokens 500", "--min-tokens 500 must be <= --max-tokens"),
        ("--rollout-batch-size 0", "integer > 0"),
        ("--eval-n 0", "integer > 0"),
        ("--epochs-per-rollout-batch 0", "integer > 0"),
        ("--max-grad-norm -1", "> 0"),
        ("--train-n -1", ">= 0"),
        ("--prompt nosuch", "--prompt nosuch"),
        ("--train-path /no/such.jsonl", "no such file"),
        ("--val-path /tmp", "is a directory"),
        ("--model /tmp", "no config.json"),
        ("--resume /tmp", "no complete checkpoint"),
        ("--wandb proj", "--wandb needs the wandb package"),  # (not installed here)
        (
            "--attn-implementation flash_attention_2 --shared-prefix",
            "cannot run --shared-prefix (its packed rows need a 4-D block mask",
        ),
        ("--attn-implementation flash_attention_2", "needs the flash-attn package"),
        ("--keep-pass-rate 0.1 0.9", "--pass-rates FILE and --keep-pass-rate LO HI go together"),
        ("--pass-rates README.md --keep-pass-rate 0.9 0.1", "LO must be <= HI"),
        ("--target-language zh", "set that weight > 0"),
        ("--curriculum-floor 0", "probability"),
    ],
)
def test_bad_values_fail_in_one_line_before_loading(bad, msg, tmp_path):
    proc = run_grpo([*bad.split(), "--out", str(tmp_path / "o")], check=False)
    err = proc.stderr.strip()
    assert proc.returncode != 0, err
    assert err.startswith("error:"), err
    assert msg in err, err
    assert len(err.splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "o")


def test_existing_run_is_refused_and_data_checked_before_loading(
    tiny_model_dir, task_file, tmp_path
):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "run" / "run.lock").write_text("")  # the project's run marker
    flags = tiny_flags(tiny_model_dir, task_file, "--out", str(tmp_path / "run"))
    proc = run_grpo(flags, check=False)
    assert proc.returncode != 0
    assert "already holds a run" in proc.stderr
    assert "--resume" in proc.stderr
    run = tmp_path / "broken"  # a checkpoint whose weights are gone: named before anything loads
    (run / "checkpoint").mkdir(parents=True)
    (run / "run.lock").write_text("")
    for name in ("state.json", "config.json", "tokenizer.json", "optimizer.pt"):
        (run / "checkpoint" / name).write_text("{}")
    proc = run_grpo(["--resume", str(run)], check=False)
    assert proc.returncode != 0
    assert "no weights" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    flags = tiny_flags(tiny_model_dir, str(empty), "--out", str(tmp_path / "o2"))
    proc = run_grpo(flags, check=False)
    assert proc.returncode != 0
    assert proc.stderr.startswith("error:")
    assert "Traceback" not in proc.stderr


def test_dry_run_prints_the_effective_settings():
    proc = run_grpo(["--model", "Qwen/Qwen2.5-Math-1.5B", "--dry-run"])
    cfg = json.loads(proc.stdout.strip().splitlines()[-1])
    assert cfg["profile"] == "hub"
    assert cfg["lr"] == 1e-5
    assert cfg["rollout_batch_size"] == 256
    assert cfg["prompt"] == "countdown"
    assert cfg["micro_train_batch_size"] == 2
    assert cfg["kl_every"] == 0
    assert cfg["train_path"] is None
    cfg = json.loads(run_grpo(["--dry-run"]).stdout.strip().splitlines()[-1])
    assert cfg["profile"] == "demo"
    assert cfg["prompt"] == "r1_zero"
    assert cfg["train_path"] == "synthetic"


def test_every_profile_entry_fills_its_flag(tmp_path):
    """A PROFILES value reaches the run only for a flag whose argparse default is None: each entry
    of the demo row (a superset of the hub row's keys) is the parsed value."""
    assert set(grpo.PROFILES["hub"]) <= set(grpo.PROFILES["demo"])
    args = grpo.parse_args(["--out", str(tmp_path / "run")])
    assert args.profile == "demo"
    for name, value in grpo.PROFILES["demo"].items():
        assert getattr(args, name) == value, name


def test_a_flag_with_a_profile_default_is_a_group_line_and_a_profiles_line(tmp_path, monkeypatch):
    """The promise at grpo.py's flag groups, kept in a scratch copy: a new flag whose default comes
    from the profiles is one line in its flag group and one line in PROFILES["hub"], and nothing
    else. The demo profile inherits it, the command line overrides it, args.json holds it."""
    group = '    g = p.add_argument_group("loss")  # --- loss ---\n'
    profile = "        lr=1e-5,  # the seeds\n"
    flag = '    g.add_argument("--throwaway", type=float, default=None, help="a scratch flag")\n'
    edits = [(group, group + flag), (profile, profile + "        throwaway=0.5,\n")]
    scratch = scratch_grpo(tmp_path, edits)  # two lines added, nothing else
    monkeypatch.chdir(tmp_path)
    demo = scratch.parse_args(["--out", str(tmp_path / "demo")])
    assert demo.profile == "demo"
    assert demo.throwaway == 0.5
    typed = scratch.parse_args(["--out", str(tmp_path / "typed"), "--throwaway", "2"])
    assert typed.throwaway == 2.0
    (tmp_path / "demo").mkdir()
    scratch.write_settings(demo, {})
    with open(tmp_path / "demo" / "args.json") as f:
        assert json.load(f)["throwaway"] == 0.5


def test_common_checkpoint_swap_recovery(tmp_path):
    """A crash between the two renames of a checkpoint swap leaves .old and .tmp: resume finds the
    newest complete one, and a truncated last metrics line is dropped."""
    run = tmp_path / "run"
    for name, step in (("checkpoint.old", 1), ("checkpoint.tmp", 2)):
        (run / name).mkdir(parents=True)
        (run / name / "state.json").write_text(json.dumps({"step": step}))
    path = runs.find_checkpoint(str(run), repair=False)  # a --dry-run --resume only looks
    assert path == str(run / "checkpoint.tmp")
    assert sorted(os.listdir(run)) == ["checkpoint.old", "checkpoint.tmp"]
    path = runs.find_checkpoint(str(run))
    with open(os.path.join(path, "state.json")) as f:
        assert json.load(f)["step"] == 2
    assert sorted(os.listdir(run)) == ["checkpoint"]
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"ste')
    assert runs.read_metrics(str(run / "metrics.jsonl")) == [{"step": 0}, {"step": 1}]


def test_resume_names_the_flags_a_saved_run_predates(capsys):
    """A run saved before a flag existed resumes with that flag's default: the notice says which,
    so a changed default (e.g. --dynamic-sampling-on) is never silent. Given flags are not."""
    parser = common.Parser()
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dynamic-sampling-on", default="answer_reward")
    parser.add_argument("--rollout-is-floor", type=float, default=0.0)
    argv = ["--rollout-is-floor", "0.5"]
    args = parser.parse_args(argv)
    runs.resume_args(parser, argv, args, {"lr": 3e-4})
    out = capsys.readouterr().out
    assert args.lr == 3e-4
    assert "notice: the saved run predates dynamic_sampling_on='answer_reward'" in out
    assert "rollout_is_floor" not in out


# ----------------------------------------------------------------------------- seed spellings
def test_the_seeds_loss_spellings_run_as_their_losses():
    """Seed 001 §6 names its losses "GRPO-Clip" and "GRPO-No-Clip": accepted and saved as the
    LOSSES keys (one mapping, not second table rows)."""
    assert summarize_args("--loss", "GRPO-No-Clip").loss == "grpo_no_clip"
    assert summarize_args("--loss", "GRPO-Clip").loss == "grpo_clip"
    assert set(grpo.LOSS_ALIASES.values()) <= set(losses.LOSSES)
    assert not set(grpo.LOSS_ALIASES) & set(losses.LOSSES)
    proc = run_grpo(["--loss", "GRPO-Nope", "--dry-run"], check=False)
    assert proc.returncode == 2
    assert "invalid choice: 'GRPO-Nope'" in proc.stderr


# ----------------------------------------------------------------------------- lr schedule
def test_the_default_lr_is_constant_to_the_bit():
    args = summarize_args()
    assert (args.warmup_frac, args.min_lr_frac) == (0.0, 1.0)
    total = args.n_grpo_steps * args.optimizer_steps_per_rollout_batch
    assert {grpo.lr_factor(k, args) for k in range(total)} == {1.0}


def test_lr_schedule_per_optimizer_step_and_resume_continues_it(
    tiny_model_dir, task_file, tmp_path, monkeypatch, sigterm
):
    """Warmup then cosine (sft.py's flags) over 3 steps x 2 optimizer steps: the lr AdamW takes
    at each optimizer step, with a SIGTERM after step 0 and a --resume in between."""
    flags = tiny_flags(tiny_model_dir, task_file, *STOP_FLAGS)
    flags += ["--train-batch-size", "4", "--loss", "grpo_clip", "--n-grpo-steps", "3"]
    flags += ["--warmup-frac", "0.34", "--min-lr-frac", "0.1", "--out", str(tmp_path / "run")]
    used = []  # the lr of each AdamW step, read as it steps

    def record(optimizer, *_):
        used.append(optimizer.param_groups[0]["lr"])

    def step_1(engine, train_rows, args, step, *a):
        return step == 1

    hook = optimizer_hooks.register_optimizer_step_pre_hook(record)
    try:
        monkeypatch.setattr(grpo, "collect", send_sigterm_before(grpo, "collect", step_1))
        with pytest.raises(SystemExit) as exit_:
            grpo.main(grpo.parse_args(flags))
        assert exit_.value.code == 143
        monkeypatch.undo()
        assert len(used) == 2  # step 0's
        # the resume doubles --lr: the schedule continues from the new base lr
        grpo.main(grpo.parse_args(["--resume", str(tmp_path / "run"), "--lr", "2e-3"]))
    finally:
        hook.remove()
    # 6 optimizer steps, warmup int(0.34 x 6) = 2: 1/2, 2/2, then cosine from 1 to 0.1 over the
    # other 4: 0.1 + 0.9 x (1 + cos(pi x k / 4)) / 2 for k = 0..3
    want = [0.5, 1.0, 1.0, 0.8681980515, 0.55, 0.2318019485]
    base = [1e-3, 1e-3, 2e-3, 2e-3, 2e-3, 2e-3]
    assert used == pytest.approx([b * f for b, f in zip(base, want)], rel=1e-9)
    rows = train_metrics(metrics(tmp_path / "run"))
    assert [r["opt_step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["train/lr"] for r in rows] == used  # logged as taken


# ----------------------------------------------------------------------------- --chat-template
def test_chat_template_shapes_the_train_and_validation_prompts(
    tiny_qwen3_chat_dir, tiny_qwen3_dir, task_file, capsys
):
    """Applied once at load, to both splits (the engine and the trainer then see those tokens)."""
    plain = grpo.parse_args(tiny_flags(tiny_qwen3_chat_dir, task_file, "--out", "/tmp/unused"))
    wrapped = grpo.parse_args(
        tiny_flags(tiny_qwen3_chat_dir, task_file, "--out", "/tmp/unused")
        + ["--chat-template", "no_thinking"]
    )
    for raw, chat in zip(grpo.load_data(plain), grpo.load_data(wrapped)):
        for before, after in zip(raw, chat):
            assert after["prompt"] == (
                f"<|im_start|>user\n{before['prompt']}<|im_end|>\n<|im_start|>assistant\n"
                "<think>\n\n</think>\n\n"
            )
    no_template = grpo.parse_args(
        tiny_flags(tiny_qwen3_dir, task_file, "--out", "/tmp/unused", "--chat-template", "on")
    )
    with pytest.raises(SystemExit):
        grpo.load_data(no_template)
    assert "has no chat template: drop --chat-template on" in capsys.readouterr().err


# ----------------------------------------------------------------------------- sampled validation
def test_sampled_metrics_by_hand():
    """3 questions x 4 samples: avg@4, pass@4, maj@4 and their standard errors over questions,
    each computed here by hand."""
    correct = [
        [True, False, False, False],  # 1 of 4 right; the right answer "7" is outvoted by "8" x 2
        [False, False, False, False],  # none right
        [True, True, True, False],  # 3 of 4 right: "5" wins the vote
    ]
    answers = [["7", "8", "8", None], ["1", "2", None, None], ["5", "5", "5", "6"]]
    m = validation.sampled_metrics(correct, answers, 4)
    # avg@4: 1/4, 0, 3/4 -> mean 1/3; SE = sample std / sqrt(3)
    avg = [0.25, 0.0, 0.75]
    assert m["eval/avg@k"] == pytest.approx(1 / 3)
    assert m["eval/avg@k_se"] == pytest.approx(statistics.stdev(avg) / math.sqrt(3))
    # pass@4 with n = k = 4: "any of the 4 right": 1, 0, 1
    assert m["eval/pass@k"] == pytest.approx(2 / 3)
    assert m["eval/pass@k_se"] == pytest.approx(statistics.stdev([1, 0, 1]) / math.sqrt(3))
    # maj@4 (all 4 samples vote): "8" beats "7"; no right answer; "5" wins -> 0, 0, 1
    assert m["eval/maj@k"] == pytest.approx(1 / 3)
    assert m["eval/maj@k_se"] == pytest.approx(statistics.stdev([0, 0, 1]) / math.sqrt(3))
    # k = 2 of 4 (the unbiased estimators): question 0's pass@2 = 1 - C(3,2)/C(4,2) = 1/2
    m2 = validation.sampled_metrics(correct, answers, 2)
    assert m2["eval/pass@k"] == pytest.approx((0.5 + 0 + 1) / 3)
    # a tie splits: answers "a" (right) and "b" 1 vote each -> maj@2 = 1/2
    tie = validation.sampled_metrics([[True, False]], [["a", "b"]], 2)
    assert tie["eval/maj@k"] == pytest.approx(0.5)
    assert math.isnan(tie["eval/maj@k_se"])  # one question: no standard error
    assert set(m) <= glossary_keys()


def test_snapshots_written_rotated_and_resumed(tiny_model_dir, task_file, tmp_path):
    """--keep-checkpoints 1 --save-every 1 over 2 steps keeps checkpoints/step_0002 (weights
    only, beside the resumable checkpoint/); a directory of the user's in checkpoints/ stays; a
    resume to 3 steps rotates on (step_0003). --eval-samples 2 adds the sampled keys to the final
    eval row, which says how many questions it used."""
    out = tmp_path / "run"
    flags = tiny_flags(tiny_model_dir, task_file, *STOP_FLAGS, "--n-grpo-steps", "2")
    flags += ["--save-every", "1", "--keep-checkpoints", "1", "--eval-samples", "2"]
    os.makedirs(out / "checkpoints" / "mine")  # the user's: never deleted
    (out / "run.lock").write_text("")  # a run directory (runs.check_is_run) the user added to
    with open(out / "checkpoints" / "mine" / "notes.txt", "w") as f:
        f.write("keep")
    # the user's own step_0001, shaped like a snapshot: neither overwritten nor rotated away
    # (issue 44: --keep-checkpoints deleted it)
    os.makedirs(out / "checkpoints" / "step_0001")
    (out / "checkpoints" / "step_0001" / "state.json").write_text('{"step": 1, "mine": true}')
    grpo.main(grpo.parse_args(flags + ["--out", str(out), "--threads", "1"]))
    assert [s for s, _ in runs.snapshots(out)] == [1, 2]
    assert sorted(os.listdir(out / "checkpoints")) == [
        "mine",
        "step_0001",
        "step_0002",
        "written.json",
    ]
    assert (out / "checkpoints" / "step_0001" / "state.json").read_text().endswith("true}")
    snapshot = set(os.listdir(out / "checkpoints" / "step_0002"))
    assert {"config.json", "model.safetensors", "state.json"} <= snapshot
    assert "optimizer.pt" not in snapshot  # weights only
    assert "optimizer.pt" in os.listdir(out / "checkpoint")
    evals = [r for r in metrics(out) if "eval/accuracy" in r]
    assert evals[-1]["eval/n_questions"] == 8
    for key in ("avg@k", "pass@k", "maj@k"):
        assert 0 <= evals[-1][f"eval/{key}"] <= 1
        assert f"eval/{key}_se" in evals[-1]
    assert evals[-1]["eval/avg@k"] <= evals[-1]["eval/pass@k"]
    missing = sorted(logged_keys(metrics(out)) - glossary_keys())
    assert not missing, missing
    grpo.main(grpo.parse_args(["--resume", str(out), "--n-grpo-steps", "3"]))
    assert [s for s, _ in runs.snapshots(out)] == [1, 3]
    assert os.path.exists(out / "checkpoints" / "mine" / "notes.txt")


def test_keep_checkpoints_needs_save_every(tiny_model_dir, task_file, capsys):
    flags = tiny_flags(tiny_model_dir, task_file, "--keep-checkpoints", "2", "--save-every", "0")
    with pytest.raises(SystemExit):
        grpo.parse_args(flags + ["--out", "/tmp/unused"])
    assert "--keep-checkpoints keeps the --save-every checkpoints" in capsys.readouterr().err


# ------------------------------------------------------------------- seed 003's menu, end to end
def test_the_lecture_menu_on_the_embedded_model(tmp_path):
    """The offline difficulty filter made and read: eval_zero_shot.py --pass-rate-samples 4 on the
    demo's training prompts writes each prompt's fraction of correct samples (by hand from its
    generations), grpo.py --pass-rates --keep-pass-rate keeps the prompts in range and says how
    many; one step of the embedded model with --curriculum and the length and language rewards
    logs their metrics and saves the curriculum. A file without the run's prompts is refused in
    one line before the model loads. (--engine hf: the rollouts' engine plays no part here.)"""
    rates = tmp_path / "rates"
    sample = ["--data", "synthetic", "--split", "train", "--limit", "16", "--max-tokens", "48"]
    sample += ["--pass-rate-samples", "4", "--engine", "hf", "--workers", "1", "--show", "0"]
    proc = run_script(["eval_zero_shot.py", *sample, "--out", str(rates)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(rates / "generations.jsonl") as f:
        generations = [json.loads(line) for line in f]
    with open(rates / "pass_rates.jsonl") as f:
        pass_rates = [json.loads(line) for line in f]
    assert len(generations) == 64 and len(pass_rates) == 16
    for i, row in enumerate(pass_rates):
        samples = [g for g in generations if g["index"] == i]
        assert [g["sample"] for g in samples] == [0, 1, 2, 3]
        assert row["prompt"] == samples[0]["prompt"] and row["samples"] == 4
        assert row["pass_rate"] == statistics.fmean(grader.is_correct(g) for g in samples)
    kept = [r for r in pass_rates if r["pass_rate"] <= 0.5]
    assert len(kept) >= 4, "a step needs 4 prompts"
    out = tmp_path / "run"
    flags = [
        "--train-n", "16", "--pass-rates", str(rates / "pass_rates.jsonl"),
        "--keep-pass-rate", "0", "0.5", "--curriculum", "--length-reward-weight", "0.5",
        "--language-reward-weight", "0.5", "--n-grpo-steps", "1", "--rollout-batch-size", "16",
        "--group-size", "4", "--train-batch-size", "16", "--gradient-accumulation-steps", "2",
        "--max-tokens", "48", "--eval-n", "4", "--eval-every", "0", "--grader-workers", "0",
        "--engine", "hf", "--thinking-budget", "24",
    ]  # fmt: skip
    proc = run_grpo(flags, out)
    assert f"data: kept {len(kept)} of 16 prompts" in proc.stdout
    step = train_metrics(metrics(out))[0]
    assert 0 <= step["train/thinking_cut_frac"] <= 1  # and the thinking budget's step ran
    assert -0.25 <= step["train/length_reward"] <= 0.25  # w x a mean lambda in [-0.5, 0.5]
    assert 0 <= step["train/language_fraction"] <= 1
    with open(out / "checkpoint" / "state.json") as f:
        success = json.load(f)["curriculum"]["success"]
    moved = [s for s in success if s != 0.5]  # the step's 4 prompts: 0.25 + 0.5 x f
    assert len(success) == len(kept) and len(moved) <= 4
    assert set(moved) <= {0.25, 0.375, 0.625, 0.75}
    proc = run_grpo(flags[2:] + ["--train-n", "32"], tmp_path / "more", check=False)
    one_line_error(proc, "has no pass rate for 16 of the 32 training prompts")
    assert not os.path.exists(tmp_path / "more" / "checkpoint")


# ----------------------------------------------------------------------------- --tools
def test_tools_calculator_run_logs_the_tool_metrics_and_transcripts(tmp_path):
    """grpo.py --tools calculator on the embedded model (its default prompt, r1_zero_calculator):
    the step row has every tool/ metric the table lists for grpo.py's tool runs, the step line
    shows the calls, validation uses the tool, and the rollouts show each transcript."""
    out = tmp_path / "run"
    flags = [
        "--tools", "calculator", "--n-grpo-steps", "1", "--rollout-batch-size", "16",
        "--group-size", "4", "--train-batch-size", "16", "--gradient-accumulation-steps", "2",
        "--max-tokens", "96", "--eval-n", "8", "--eval-every", "1", "--grader-workers", "0",
        "--eager",
    ]  # fmt: skip
    proc = run_grpo(flags, out)
    rows = metrics(out)
    step = train_metrics(rows)[0]
    tool_keys = [k for k in metric_table.some_keys("grpo") if k.startswith("tool/")]
    assert tool_keys and all(k in step for k in tool_keys)
    assert step["train/response_len_total_mean"] > step["train/response_len_mean"]
    assert step["tool/calls_mean"] > 0 and step["time/tool"] > 0
    assert "| calls_mean " in proc.stdout + proc.stderr
    evals = [r for r in rows if "eval/accuracy" in r]
    assert all(r["eval/tool_calls_mean"] > 0 for r in evals)
    with open(out / "args.json") as f:
        saved = json.load(f)
    assert (saved["prompt"], saved["max_tool_calls"]) == ("r1_zero_calculator", 8)


def test_tools_flags_refuse_in_one_line(tmp_path):
    """A prompt without a trigger, a missing tool prompt, tool flags or a tool prompt without
    --tools."""
    one_line_error(run_script(["grpo.py", "--tools", "calculator", "--prompt", "r1_zero"]),
                   "needs a prompt that declares its trigger")  # fmt: skip
    one_line_error(
        run_script(["grpo.py", "--task", "keyword", "--tools", "python"]), "keyword_python"
    )
    one_line_error(run_script(["grpo.py", "--max-tool-calls", "2"]), "need --tools")
    one_line_error(run_script(["grpo.py", "--prompt", "r1_zero_calculator"]), "pass --tools")
    args = grpo.parse_args(["--tools", "calculator", "--out", str(tmp_path / "r")])
    assert args.prompt == "r1_zero_calculator" and args.tool_isolated is False
    assert args.tool_timeout == 3.0


def test_attn_implementation_reaches_the_policy(tiny_model_dir, task_file, tmp_path):
    """--attn-implementation (seed 000 loads with FlashAttention-2) is from_pretrained's
    attn_implementation and is recorded with the flags; sdpa, the default, is what transformers
    picks for these models without it (so the default changes nothing)."""
    for impl in ("eager", "sdpa"):
        argv = tiny_flags(tiny_model_dir, task_file, "--attn-implementation", impl)
        args = grpo.parse_args(argv + ["--out", str(tmp_path / impl)])
        assert vars(args)["attn_implementation"] == impl  # args.json is vars(args)
        runtime = grpo.setup_runtime(args)
        policy = grpo.load_policy(args.model, args, runtime)[0]
        assert policy.config._attn_implementation == impl
    default = grpo.parse_args(tiny_flags(tiny_model_dir, task_file))
    assert default.attn_implementation == "sdpa"


def test_flash_attention_2_needs_cuda(monkeypatch, capsys):
    """Where flash-attn is installed (faked here: no such package nor GPU on this machine), a CPU
    policy is still one line."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: name == "flash_attn" or real(name, *a)
    )
    with pytest.raises(SystemExit):
        hardware.check_attn_implementation("flash_attention_2", "cpu", None)
    assert "runs on CUDA only" in capsys.readouterr().err
