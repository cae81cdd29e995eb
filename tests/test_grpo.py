"""grpo.py: end-to-end runs as subprocesses (on-/off-policy, resume with the saved flags, --engine hf),
grpo.train_step on real rollout batches in-process (every loss and length norm, bf16 master weights, dropout,
the min_tokens ban, stale-data refusal, rollout IS, dynamic sampling), Ctrl-C consistency, early failures.

Everything uses the tiny random model of conftest and a generated keyword task (reward 1 when the response
contains the keyword), because a random model never earns a Countdown reward and a zero-variance batch has
no gradient.
"""

import json
import math
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

import common
import grader
import grpo
import losses
from conftest import HAS_VLLM, ROOT

STEP_KEYS = [
    "train/loss",
    "train/grad_norm",
    "train/entropy",
    "train/clip_fraction",
    "train/ratio_mean",
    "train/ratio_min",
    "train/ratio_max",
    "train/reward",
    "train/format_reward",
    "train/answer_reward",
    "train/response_len_mean",
    "train/response_len_max",
    "train/truncation_rate",
    "train/zero_var_frac",
    "train/lr",
    "train/epoch",
    "time/generation",
    "time/grading",
    "time/old_log_probs",
    "time/training",
    "time/weight_sync",
    "time/step",
    "time/tokens_per_s",
    "time/wall",
    "step",
    "opt_step",
]
EVAL_KEYS = [
    "eval/accuracy",
    "eval/reward",
    "eval/format_reward",
    "eval/answer_reward",
    "eval/response_len",
]
KEYWORD = "the"


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kw") / "task.jsonl"
    with open(path, "w") as f:
        for i in range(64):
            f.write(
                json.dumps(
                    {
                        "question": f"Write a sentence about the numbers {i} and {i + 3}.",
                        "ground_truth": [KEYWORD],
                    }
                )
                + "\n"
            )
    return str(path)


def tiny_flags(model, task, *extra):
    return [
        "--model",
        model,
        "--task",
        "jsonl",
        "--train-path",
        task,
        "--val-path",
        task,
        "--prompt",
        "question_only",
        "--reward",
        "keyword",
        "--rollout-batch-size",
        "16",
        "--group-size",
        "4",
        "--train-batch-size",
        "16",
        "--gradient-accumulation-steps",
        "2",
        "--max-tokens",
        "16",
        "--min-tokens",
        "2",
        "--eval-n",
        "8",
        "--eval-every",
        "1",
        "--lr",
        "1e-3",
        "--policy-device",
        "cpu",
        "--grader-workers",
        "0",
        *extra,
    ]


def run_grpo(flags, out=None, check=True):
    cmd = [sys.executable, os.path.join(ROOT, "grpo.py"), *flags] + (
        ["--out", str(out)] if out else []
    )
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def on_policy(tiny_model_dir, task_file, tmp_path_factory):
    """2 steps with KL monitoring, then a resume that names only --resume and two overrides; and 3 steps
    straight through with the same seed."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed (the --engine hf runs below still run)")
    d = tmp_path_factory.mktemp("runs")
    flags = tiny_flags(
        tiny_model_dir, task_file, "--loss", "reinforce_with_baseline", "--kl-every", "1"
    )
    proc = run_grpo(flags + ["--n-grpo-steps", "2"], d / "a")
    first = metrics(d / "a")
    resumed = run_grpo(["--resume", str(d / "a"), "--n-grpo-steps", "3", "--eval-every", "0"])
    run_grpo(flags + ["--n-grpo-steps", "3", "--eval-every", "0"], d / "b")  # straight through
    return {
        "dir": d / "a",
        "first": first,
        "resumed": metrics(d / "a"),
        "straight": metrics(d / "b"),
        "stdout": proc.stdout,
        "resume_stdout": resumed.stdout,
    }


def test_on_policy_run_logs_every_key_dashboard_and_checkpoint(on_policy):
    rows = on_policy["first"]
    train = [r for r in rows if "train/loss" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in train] == [0, 1]
    for r in train:
        assert set(STEP_KEYS) <= set(r), set(STEP_KEYS) - set(r)
        assert r["train/ratio_mean"] == 1.0 and r["train/clip_fraction"] == 0.0  # on-policy
        assert r["train/kl_ref"] >= 0 and "train/mismatch_kl" in r
    assert (
        "train/kl_prev" not in train[0] and train[1]["train/kl_prev"] >= 0
    )  # pi_1 vs pi_0 on step 1's samples
    assert (
        train[1]["train/kl_prev"] > 0 or train[0]["train/grad_norm"] == 0
    )  # the policy moved iff step 0 had a gradient
    assert train[0]["train/kl_ref"] == pytest.approx(
        0.0, abs=1e-6
    )  # step 0: the policy is the reference
    assert [r["step"] for r in evals] == [0, 1, 2] and all(set(EVAL_KEYS) <= set(r) for r in evals)
    assert any(r["train/grad_norm"] > 0 for r in train), "keyword task should give reward variance"
    d = on_policy["dir"]
    assert os.path.getsize(d / "dashboard.png") > 10_000 and os.path.exists(d / "args.json")
    assert sorted(os.listdir(d / "rollouts"))[:3] == [
        "step_0000.jsonl",
        "step_0001.jsonl",
        "step_0002.jsonl",
    ]
    assert {"config.json", "model.safetensors", "optimizer.pt", "state.json"} <= set(
        os.listdir(d / "checkpoint")
    )
    assert not any(n.startswith("checkpoint.") for n in os.listdir(d))  # no tmp/old leftovers
    assert "step 2/2 |" in on_policy["stdout"] and "eval step 2 | accuracy" in on_policy["stdout"]


def test_resume_restores_the_run_flags_and_continues_identically(on_policy):
    out = on_policy["resume_stdout"]
    assert (
        "resume: restored the run's flags" in out
        and "overriding" in out
        and "n_grpo_steps 2 -> 3" in out
    )
    args = json.load(open(on_policy["dir"] / "args.json"))
    assert (
        args["lr"] == 1e-3 and args["rollout_batch_size"] == 16 and args["kl_every"] == 1
    )  # not a profile default

    def step_row(rows, s):
        return next(r for r in rows if r.get("step") == s and "train/loss" in r)

    a, b = step_row(on_policy["resumed"], 2), step_row(on_policy["straight"], 2)
    for k in ("train/reward", "train/response_len_mean"):
        assert a[k] == b[k], k
    assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4, abs=1e-6)
    assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-3)
    assert [r["step"] for r in on_policy["resumed"] if "train/loss" in r] == [
        0,
        1,
        2,
    ]  # rows past the checkpoint dropped


def test_off_policy_run_ratio_starts_at_one_and_hf_engine_smoke(
    tiny_model_dir, task_file, tmp_path
):
    flags = tiny_flags(
        tiny_model_dir,
        task_file,
        "--loss",
        "grpo_clip",
        "--length-norm",
        "masked_normalize",
        "--epochs-per-rollout-batch",
        "2",
        "--train-batch-size",
        "8",
        "--gradient-accumulation-steps",
        "2",
        "--no-std-norm",
        "--n-grpo-steps",
        "2",
        "--eval-every",
        "0",
        "--engine",
        "hf",
    )
    run_grpo(flags, tmp_path)
    train = [r for r in metrics(tmp_path) if "train/loss" in r]
    assert [r["opt_step"] for r in train] == list(
        range(1, 9)
    )  # 2 epochs x 2 train batches x 2 steps
    for s in (0, 1):
        first = next(r for r in train if r["step"] == s)
        assert first["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert first["train/ratio_min"] == pytest.approx(1.0, abs=1e-4) and first[
            "train/ratio_max"
        ] == pytest.approx(1.0, abs=1e-4)
    assert all(set(STEP_KEYS) <= set(r) for r in train)
    assert any(
        r["train/ratio_max"] > 1.0 + 1e-4 for r in train
    )  # later steps really move off-policy


# ----------------------------------------------------------------------------- in-process, one engine
@pytest.fixture(scope="module")
def live(tiny_model_dir, task_file):
    """One in-process vLLM engine and a real scored rollout batch on the tiny model."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed (the --engine hf runs still run)")
    args = grpo.parse_args(
        tiny_flags(tiny_model_dir, task_file, "--out", "/tmp/unused", "--min-tokens", "4")
    )
    grpo.setup_devices(args)
    train_rows, _ = grpo.load_data(args)
    engine = grpo.make_engine(tiny_model_dir, args)
    batch, _ = grpo.collect(engine, train_rows, args, 0)
    return {
        "args": args,
        "engine": engine,
        "batch": batch,
        "rows": train_rows,
        "model_dir": tiny_model_dir,
        "task": task_file,
    }


def count_forwards(policy):
    """Records torch.is_grad_enabled() for every scoring forward: one of several rows, or the packed responses
    on a shared prompt's KV cache (not the prompt's own forward; the self-check runs before the counting)."""
    losses.shared_prefix_works(policy)
    calls = []

    def scoring(m, a, kw):
        cache = kw.get("past_key_values")
        if kw["input_ids"].shape[0] > 1 or (cache is not None and cache.get_seq_length() > 0):
            calls.append(torch.is_grad_enabled())

    policy.base_model.register_forward_pre_hook(scoring, with_kwargs=True)
    return calls


def make(live, *flags):
    args = grpo.parse_args(
        tiny_flags(
            live["model_dir"], live["task"], "--out", "/tmp/unused", "--min-tokens", "4", *flags
        )
    )
    grpo.setup_devices(args)
    return args


def step_gradient(live, *flags, batch=None):
    """(gradient BEFORE clipping (flat), history row, metrics) of the first optimizer step on the live batch from
    the initial weights: --max-grad-norm inf; an SGD at lr 0 reads the gradient when it steps and moves nothing."""
    args = make(live, *flags)
    args.max_grad_norm = math.inf
    policy = grpo.load_policy(live["model_dir"], args)[0]
    params, grads = list(policy.parameters()), []
    probe = torch.optim.SGD(params, lr=0.0)
    probe.register_step_pre_hook(
        lambda *_: grads.append(torch.cat([p.grad.flatten() for p in params]))
    )
    hist, m = grpo.train_step(policy, probe, live["batch"] if batch is None else batch, args, 0)
    return grads[0], hist[0], m


def test_dapo_token_norm_divides_by_the_whole_steps_tokens(live):
    """--length-norm token (DAPO): every response token's gradient is -A_i / N_step, N_step = the optimizer step's
    response tokens, so 1 or 4 microbatches (of unequal token counts: rows sorted by length) give one gradient."""
    batch = dict(
        live["batch"], advantages=torch.linspace(-1.0, 1.0, len(live["batch"]["advantages"]))
    )
    tokens = sorted(len(r) for r in batch["response_ids"])
    assert len({sum(tokens[i : i + 4]) for i in range(0, 16, 4)}) > 1, (
        "equal microbatches would not tell"
    )
    (g1, h1, _), (g4, h4, _) = (
        step_gradient(
            live,
            "--length-norm",
            "token",
            "--no-shared-prefix",
            "--gradient-accumulation-steps",
            n,
            batch=batch,
        )
        for n in ("1", "4")
    )
    assert g1.norm() > 0 and ((g4 - g1).norm() / g1.norm()).item() <= 1e-6
    assert h4["train/grad_norm"] == pytest.approx(h1["train/grad_norm"], rel=1e-6)
    assert h4["train/loss"] == pytest.approx(h1["train/loss"], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize(
    "mode,level", [("tis", "token"), ("tis", "sequence"), ("mis", "token"), ("mis", "sequence")]
)
def test_rollout_is_weights_and_masks_the_step(live, mode, level):
    """mu lowered on rows 0-3 so pi_old / mu = 3 per token (TIS: the cap 2; MIS: weight 0) and on rows 4-7 to 1.5
    (TIS 1.5 per token, the cap 2 per sequence of >= 2 tokens; MIS: weight 1.5 per token, 0 per sequence). With the
    seed's masked_mean a row's weight scales its advantage and a dropped row counts 0, so each step's gradient is
    that of a --rollout-is none step on hand-rescaled advantages."""
    b, n = live["batch"], len(live["batch"]["advantages"])
    ratio = torch.tensor([3.0] * 4 + [1.5] * 4 + [1.0] * (n - 8))
    seq_ratio = ratio ** torch.tensor([len(r) for r in b["response_ids"]])
    assert seq_ratio[:8].min() > 2  # every shifted response has >= 2 tokens
    r = seq_ratio if level == "sequence" else ratio
    if mode == "tis":
        scale = r.clamp(max=2.0)  # (n,)
    else:
        scale = torch.where(r <= 2.0, r, 0.0)  # (n,) MIS: rho where kept
    adv = torch.linspace(-1.0, 1.0, n)
    mu = [
        [x - math.log(q) for x in lp] for lp, q in zip(b["engine_logprobs"], ratio.tolist())
    ]  # the engine's, shifted
    g, h, m = step_gradient(
        live,
        "--rollout-is",
        mode,
        "--rollout-is-level",
        level,
        batch=dict(b, advantages=adv, engine_logprobs=mu),
    )
    want, h_want, _ = step_gradient(live, batch=dict(b, advantages=adv * scale))
    assert want.norm() > 0 and ((g - want).norm() / want.norm()).item() <= 1e-4, (mode, level)
    assert h["train/loss"] == pytest.approx(h_want["train/loss"], rel=1e-4)
    tokens = torch.tensor([len(x) for x in b["response_ids"]], dtype=torch.float)
    assert m["train/is_dropped_frac"] == pytest.approx(
        ((scale == 0) * tokens).sum().item() / tokens.sum().item()
    )


@pytest.mark.parametrize(
    "loss,norm",
    [
        ("no_baseline", "masked_mean"),
        ("reinforce_with_baseline", "token"),
        ("grpo_clip", "masked_normalize"),
        ("grpo_no_clip", "masked_mean"),
        ("gspo", "token"),
    ],
)
def test_each_loss_and_length_norm_trains(live, loss, norm):
    epochs = ["--epochs-per-rollout-batch", "2"] if loss in losses.RATIO_LOSSES else []
    args = make(
        live, "--loss", loss, "--length-norm", norm, "--no-shared-prefix", *epochs
    )  # one forward per microbatch
    policy, _ = grpo.load_policy(live["model_dir"], args)
    before = [p.detach().clone() for p in policy.parameters()]
    calls = count_forwards(policy)
    hist, m = grpo.train_step(
        policy, torch.optim.AdamW(policy.parameters(), lr=args.lr), live["batch"], args, 0
    )
    assert len(hist) == len(epochs) // 2 + 1 and all(
        torch.isfinite(torch.tensor(h["train/loss"])) for h in hist
    )
    assert hist[0]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # first epoch: pi == pi_old
    n_grad = sum(
        calls
    )  # forwards with grad = epochs x microbatches: pi_old is computed once, not per epoch
    assert n_grad == len(hist) * args.gradient_accumulation_steps
    assert len(calls) - n_grad == (loss in losses.RATIO_LOSSES) * args.gradient_accumulation_steps
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.parameters()))


def test_stale_data_with_a_plain_loss_is_refused(capsys):
    with pytest.raises(SystemExit):
        grpo.parse_args(["--epochs-per-rollout-batch", "2", "--loss", "reinforce_with_baseline"])
    assert "use --loss grpo_clip" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # several train batches per rollout batch: stale too
        grpo.parse_args(["--train-batch-size", "32", "--loss", "no_baseline"])


def test_bf16_compute_keeps_fp32_master_weights(live, tmp_path):
    """One AdamW step at lr 1e-5 from bf16-loaded weights changes >= 95% of them by default; pure bf16 rounds
    most of those updates away."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bf16_dir = str(tmp_path / "bf16")
    AutoModelForCausalLM.from_pretrained(live["model_dir"], dtype=torch.bfloat16).save_pretrained(
        bf16_dir
    )
    AutoTokenizer.from_pretrained(live["model_dir"]).save_pretrained(bf16_dir)
    changed = {}
    for mode in ([], ["--pure-bf16"]):
        args = make(live, "--dtype", "bfloat16", "--lr", "1e-5", *mode)
        policy, _ = grpo.load_policy(bf16_dir, args)
        assert next(policy.parameters()).dtype == (torch.bfloat16 if mode else torch.float32)
        before = [p.detach().clone() for p in policy.parameters()]
        grpo.train_step(
            policy,
            torch.optim.AdamW(policy.parameters(), lr=1e-5, betas=(0.9, 0.95)),
            live["batch"],
            args,
            0,
        )
        diff = torch.cat([(a != p.detach()).flatten() for a, p in zip(before, policy.parameters())])
        changed[bool(mode)] = diff.float().mean().item()
    assert changed[False] >= 0.95 and changed[True] < 0.5, changed


def test_trainer_scores_the_min_tokens_ban_like_the_engine(live):
    """vLLM bans stop tokens before min_tokens; with the ban applied, trainer and engine agree there to 1e-5."""
    args, batch = live["args"], live["batch"]
    assert batch["ban_token_ids"], "the engine bans its stop tokens before --min-tokens"
    tensors = grpo.collate(batch, args)
    policy = grpo.load_policy(live["model_dir"], args)[0]
    ban = tensors["ban_mask"] & tensors["response_mask"]
    with_ban = grpo.batch_log_probs(policy, tensors, args, batch["ban_token_ids"])
    without = grpo.batch_log_probs(policy, tensors, args, [])
    eng = tensors["engine_log_probs"]
    at_ban, elsewhere = (
        (with_ban - eng)[ban].abs(),
        (with_ban - eng)[tensors["response_mask"] & ~ban].abs(),
    )
    # fp32 kernels differ by ~1e-5 at every position (the engine's matmul blocking is not HF's): at the banned
    # positions the ban leaves only that noise, on average below 1e-5
    assert at_ban.mean() <= 1e-5 and at_ban.max() <= max(2 * elsewhere.max(), 2e-5), (
        at_ban.max(),
        elsewhere.max(),
    )
    assert (without - eng)[
        ban
    ].abs().mean() > 3 * at_ban.mean()  # the mismatch the ban removes (-log(1 - p_stop))


def test_dropout_is_off_for_rl(live, tmp_path):
    """A model with dropout (GPT-2: embedding, attention and residual dropout 0.5): pi_old, pi and the training
    forward are the same function, so the first epoch's on-policy ratio is exactly 1."""
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
    args = make(live, "--loss", "grpo_clip", "--epochs-per-rollout-batch", "2")
    policy, _ = grpo.load_policy(d, args)
    assert policy.training and all(
        m.p == 0.0 for m in policy.modules() if isinstance(m, torch.nn.Dropout)
    )
    hist, _ = grpo.train_step(
        policy, torch.optim.AdamW(policy.parameters(), lr=1e-3), live["batch"], args, 0
    )
    assert hist[0]["train/ratio_min"] == pytest.approx(1.0, abs=1e-6) and hist[0][
        "train/ratio_max"
    ] == pytest.approx(1.0, abs=1e-6)


def test_rollout_is_and_engine_old_log_probs(live):
    args = make(live, "--loss", "grpo_clip", "--rollout-is", "tis", "--rollout-is-cap", "1.5")
    policy = grpo.load_policy(live["model_dir"], args)[0]
    hist, m = grpo.train_step(
        policy, torch.optim.AdamW(policy.parameters(), lr=1e-3), live["batch"], args, 0
    )
    for k in (
        "train/mismatch_kl",
        "train/is_weight_mean",
        "train/is_weight_min",
        "train/is_weight_max",
        "train/is_weight_outside_frac",
    ):
        assert k in m
    assert m["train/mismatch_kl"] < 1e-6 and m["train/is_weight_max"] == pytest.approx(
        1.0, abs=1e-4
    )  # fp32 CPU: same kernels
    args = make(live, "--loss", "grpo_clip", "--old-log-probs", "engine")
    policy = grpo.load_policy(live["model_dir"], args)[0]
    calls = count_forwards(policy)
    hist, m = grpo.train_step(
        policy, torch.optim.AdamW(policy.parameters(), lr=1e-3), live["batch"], args, 0
    )
    assert (
        calls and all(calls) and "train/mismatch_kl" not in m
    )  # no no-grad pass: pi_old is the engine's
    assert hist[0]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(SystemExit):
        make(live, "--rollout-is", "tis", "--old-log-probs", "engine")


def test_dynamic_sampling_never_trains_on_a_zero_variance_group(live):
    args = make(
        live, "--dynamic-sampling", "--rollout-batch-size", "32", "--train-batch-size", "32"
    )
    batch, m = grpo.collect(live["engine"], live["rows"], args, 1)
    raw = batch["raw"].view(-1, args.group_size)
    assert (raw.max(1).values > raw.min(1).values).all(), (
        "a zero-variance group reached the train batch"
    )
    assert len(batch["raw"]) <= args.rollout_batch_size and m[
        "train/dynamic_prompts_sampled"
    ] >= len(raw)
    assert 0 <= m["train/dynamic_filtered_frac"] < 1 and m["time/dynamic_extra_generation"] >= 0
    plain, _ = grpo.collect(
        live["engine"],
        live["rows"],
        make(live, "--rollout-batch-size", "32", "--train-batch-size", "32"),
        1,
    )
    assert (
        plain["responses"][: args.group_size] == batch["responses"][: args.group_size]
        or plain["raw"][: args.group_size].max() == plain["raw"][: args.group_size].min()
    )  # round 0 is the plain batch


def test_dynamic_sampling_with_no_variance_anywhere_trains_one_flat_batch(
    live, monkeypatch, capsys
):
    flat = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}
    monkeypatch.setitem(
        grader.REWARD_FNS, "keyword", lambda response, ground_truth: flat
    )  # a reward that never varies
    args = make(live, "--dynamic-sampling", "--dynamic-sampling-max-rounds", "2")
    batch, m = grpo.collect(live["engine"], live["rows"], args, 1)
    assert (
        len(batch["raw"]) == args.rollout_batch_size and not batch["advantages"].any()
    )  # a batch's worth, no more
    assert (
        m["train/dynamic_filtered_frac"] == 1.0
        and "no group with reward variance" in capsys.readouterr().out
    )


def scripted_rewards(monkeypatch, rewards):
    """The keyword reward replaced by a script: call i gets rewards[i] (then the last one). The grader runs in this
    process (--grader-workers 0) in input order, so the script decides each group's rewards."""
    calls = []

    def reward(response, ground_truth):
        calls.append(response)
        return rewards[min(len(calls), len(rewards)) - 1]

    monkeypatch.setitem(grader.REWARD_FNS, "keyword", reward)


def test_dynamic_filtered_frac_counts_flat_groups_only(live, monkeypatch):
    """4 prompts wanted; round 0: group 0 flat, groups 1-3 varied (3 kept); round 1 samples 2 prompts, both varied,
    one needed. 1 flat group of 6 sampled: 1/6 (groups merely not needed are not "filtered")."""
    flat = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}
    right = {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}
    scripted_rewards(monkeypatch, [flat] * 4 + [flat, right] * 100)
    args = make(live, "--dynamic-sampling")
    batch, m = grpo.collect(live["engine"], live["rows"], args, 1)
    assert m["train/dynamic_prompts_sampled"] == 6
    assert m["train/dynamic_filtered_frac"] == pytest.approx(1 / 6)
    assert len(batch["raw"]) == args.rollout_batch_size


def test_dynamic_sampling_filters_on_accuracy_by_default(live, monkeypatch, capsys):
    """Groups that differ only in format reward (1.0 / 0.1 with the answer wrong everywhere) carry no accuracy
    signal: DAPO's filter drops them; --dynamic-sampling-on reward keeps them."""
    formatted = {"reward": 0.1, "format_reward": 1.0, "answer_reward": 0.0}
    unformatted = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}
    scripted_rewards(monkeypatch, [formatted, unformatted] * 1000)
    args = make(live, "--dynamic-sampling", "--dynamic-sampling-max-rounds", "1")
    _, m = grpo.collect(live["engine"], live["rows"], args, 1)
    assert m["train/dynamic_filtered_frac"] == 1.0
    assert "no group with reward variance" in capsys.readouterr().out
    scripted_rewards(monkeypatch, [formatted, unformatted] * 1000)
    args = make(live, "--dynamic-sampling", "--dynamic-sampling-on", "reward")
    batch, m = grpo.collect(live["engine"], live["rows"], args, 1)
    assert m["train/dynamic_filtered_frac"] == 0.0 and batch["advantages"].abs().min() > 0


def test_kl_to_the_initial_policy_is_exactly_zero_at_step_0_under_bf16(live):
    """bf16 autocast over fp32 master weights: the frozen pi_init keeps the policy's fp32 weights and runs under
    the same autocast, so at step 0 KL(pi || pi_init) and the KL penalty's gradient are exactly 0."""
    args = make(
        live, "--dtype", "bfloat16", "--kl-beta", "0.5", "--kl-every", "1", "--loss", "grpo_clip"
    )
    args.max_grad_norm = math.inf
    policy, _, _, ref_model, _ = grpo.build_learner(args)
    assert next(ref_model.parameters()).dtype == next(policy.parameters()).dtype == torch.float32
    grads = []
    for beta in (0.5, 0.0):
        args.kl_beta = beta
        params = list(policy.parameters())
        probe = torch.optim.SGD(params, lr=0.0)  # reads the gradient, moves nothing
        probe.register_step_pre_hook(
            lambda *_: grads.append(torch.cat([p.grad.flatten() for p in params]))
        )
        _, m = grpo.train_step(policy, probe, live["batch"], args, 0, ref_model=ref_model)
        assert m["train/kl_ref"] == 0.0
    assert grads[0].norm() > 0 and torch.equal(
        grads[0], grads[1]
    )  # the penalty adds exactly nothing


def test_mismatch_kernel_kl_is_kl_of_the_engine_to_the_generating_policy(live):
    """On a one-version-stale batch (lag 1), train/mismatch_kernel_kl = KL(mu || pi_prev), estimated by k3 on the
    engine's samples: E_mu[pi_prev / mu - 1 - log(pi_prev / mu)]. mu is shifted 1 nat below the engine's own
    log-probs, so the right order reads about e - 2 = 0.72 and the swapped one (chi^2 - KL) about 0.37."""
    args = make(live, "--loss", "grpo_clip", "--kl-every", "1")
    policy = grpo.load_policy(live["model_dir"], args)[0]
    prev_model = grpo.load_policy(live["model_dir"], args)[0]
    prev_model.holds_step = -1  # it generated the batch of step 0: the policy one update before
    mu = [[x - 1.0 for x in lp] for lp in live["batch"]["engine_logprobs"]]
    batch = dict(live["batch"], engine_logprobs=mu)
    tensors = grpo.collate(batch, args)
    prev = grpo.batch_log_probs(prev_model, tensors, args, batch["ban_token_ids"])
    log_r = (prev - tensors["engine_log_probs"])[
        tensors["response_mask"]
    ]  # log(pi_prev / mu) per token
    want = (log_r.exp() - 1 - log_r).mean().item()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    ref_model = grpo.load_policy(live["model_dir"], args)[0]
    _, m = grpo.train_step(policy, optimizer, batch, args, 0, ref_model, prev_model, lag=1)
    assert m["train/mismatch_kernel_kl"] == pytest.approx(want, rel=1e-5)
    assert m["train/mismatch_kernel_kl"] == pytest.approx(math.e - 2, abs=1e-3)


def test_mask_truncated_and_overlong_buffer(live):
    args = make(live, "--mask-truncated", "--overlong-buffer", "8")
    batch = {
        k: (list(v) if isinstance(v, list) else v.clone() if torch.is_tensor(v) else v)
        for k, v in live["batch"].items()
    }
    lens = [len(r) for r in batch["response_ids"]]
    raw = batch["raw"].clone()
    grpo.score(batch, args)  # max_tokens 16, buffer 8: penalty 0 up to 8 tokens, linear to -1 at 16
    for n, a, b, d in zip(lens, raw, batch["raw"], batch["rewards"]):
        assert b == pytest.approx(d["reward"] - max(0.0, min(1.0, (n - 8) / 8)))
    tensors = grpo.collate(batch, args)
    trunc = torch.tensor(batch["truncated"])
    assert (
        trunc.any()
        and not tensors["response_mask"][trunc].any()
        and tensors["response_mask"][~trunc].any(1).all()
    )


def test_sample_seeds_never_overlap():
    """Each (step, round) owns a block of 2^20 seeds; a call uses prompts x G of them."""
    args = grpo.parse_args(["--seed", "3"])
    starts = sorted(grpo.sample_seed(args, s, r) for s in range(50) for r in range(4))
    assert all(b - a >= 2**20 for a, b in zip(starts, starts[1:]))
    assert args.rollout_batch_size * 4 <= 2**20


def test_shared_prefix_gives_the_same_step(live):
    """--shared-prefix (each group's prompt once, its G responses packed on the prompt's KV cache) changes no
    number: no-grad log-probs within 2e-5 (fp32 rounding: the packed path's masked attention sums in another order,
    and this model's N(0, 0.2) weights amplify it; on the embedded model's weights the bound is 1e-5, test_losses),
    step 0's loss, grad norm and entropy within 1e-5 relative."""
    results = []
    for flag in ("--shared-prefix", "--no-shared-prefix"):
        args = make(live, "--loss", "grpo_clip", flag)
        assert args.shared_prefix == (flag == "--shared-prefix")
        policy = grpo.load_policy(live["model_dir"], args)[0]
        tensors = grpo.collate(live["batch"], args)
        lp = grpo.batch_log_probs(policy, tensors, args, live["batch"]["ban_token_ids"])
        hist, _ = grpo.train_step(
            policy, torch.optim.AdamW(policy.parameters(), lr=1e-3), live["batch"], args, 0
        )
        results.append((lp, hist[0], tensors["response_mask"]))
    (lp_on, h_on, mask), (lp_off, h_off, _) = results
    assert (lp_on - lp_off)[mask].abs().max() <= 2e-5
    for k in (
        "train/loss",
        "train/grad_norm",
        "train/entropy",
    ):  # (Adam's first step is sign(g): not compared)
        assert h_on[k] == pytest.approx(h_off[k], rel=1e-5, abs=1e-7), k


def test_sync_makes_engine_match_policy(live):
    args = live["args"]
    policy, tok = grpo.load_policy(live["model_dir"], args)
    grpo.train_step(policy, torch.optim.AdamW(policy.parameters(), lr=3e-2), live["batch"], args, 0)
    grpo.engines.load_policy_into_vllm(policy, live["engine"])
    prompts = [r["prompt"] for r in live["rows"][:4]]
    outs = grpo.engines.generate(live["engine"], prompts, n=1, temperature=0.0, max_tokens=10)
    policy.eval()
    for o in outs:
        ids = torch.tensor([o[0]["prompt_token_ids"]])
        with torch.no_grad():
            hf = policy.generate(
                ids, max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id
            )[0, ids.shape[1] :]
        assert hf.tolist()[: len(o[0]["token_ids"])] == o[0]["token_ids"], (
            "engine greedy tokens differ from the policy's"
        )


def test_engine_share_on_a_shared_gpu_counts_the_trainers_memory(monkeypatch):
    """The one-GPU split: the policy's fp32 weights + AdamW moments (12 B/param), 2 frozen copies for --kl-every in
    the weights' dtype (fp32: 8 B/param), fp32 grads unless --sleep-engine (4 B/param), a 15% margin. No policy beside it (a Ray generator
    actor): 0.85. The GPU's size is the one stand-in (no CUDA here)."""
    from types import SimpleNamespace

    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(total_memory=10**9)
    )
    policy = torch.nn.Linear(1000, 10_000, bias=False)  # 10M params
    args = SimpleNamespace(
        policy_device="cuda:0",
        vllm_device="cuda",
        param_dtype=torch.float32,
        compute_dtype=torch.bfloat16,
        sleep_engine=False,
    )
    assert common.engine_share(args, policy, extra_models=2) == pytest.approx(1 - 0.24 - 0.15)
    assert common.engine_share(args, policy=None) == 0.85
    assert (
        common.engine_share(SimpleNamespace(**vars(args) | {"vllm_device": "cuda:1"}), policy)
        == 0.85
    )
    args.sleep_engine = True
    assert common.engine_share(args, policy, extra_models=2) == pytest.approx(1 - 0.2 - 0.15)


def test_sleep_engine_call_order(live, monkeypatch, tmp_path):
    """--sleep-engine (one shared GPU): the engine sleeps once the step's generations (and eval) are done and
    wakes, the new weights pushed in, before the next generation. On CPU sleep is a no-op (vLLM's sleep mode
    needs CUDA): this checks the order a GPU run takes; the memory it frees there is not measured here."""
    calls = []
    monkeypatch.setattr(grpo, "make_engine", lambda path, args, policy=None: live["engine"])
    for name in ("sleep_engine", "wake_engine", "generate"):
        real = getattr(grpo.engines, name)
        monkeypatch.setattr(
            grpo.engines,
            name,
            lambda *a, _r=real, _n=name, **kw: (calls.append(_n), _r(*a, **kw))[1],
        )
    real_step = grpo.train_step
    monkeypatch.setattr(
        grpo, "train_step", lambda *a, **kw: (calls.append("train"), real_step(*a, **kw))[1]
    )
    grpo.main(
        grpo.parse_args(
            tiny_flags(
                live["model_dir"],
                live["task"],
                "--sleep-engine",
                "--n-grpo-steps",
                "2",
                "--out",
                str(tmp_path / "run"),
            )
        )
    )
    step = [
        "generate",
        "generate",
        "sleep_engine",
        "train",
        "wake_engine",
    ]  # rollout, eval, sleep, train, wake + push
    assert calls == step + step + ["generate"], calls  # then the final eval on the woken engine
    monkeypatch.undo()
    grpo.engines.load_policy_into_vllm(
        grpo.load_policy(live["model_dir"], live["args"])[0], live["engine"]
    )  # the fixture's weights back


def test_collate_uses_engine_token_ids(live):
    b, t = live["batch"], grpo.collate(live["batch"], live["args"])
    p, r = b["prompt_ids"][0], b["response_ids"][0]
    assert t["labels"][0, len(p) - 1 : len(p) - 1 + len(r)].tolist() == r
    assert t["response_mask"][0].sum() == len(r) and t["response_mask"][0, len(p) - 1]
    assert t["ban_mask"][0].sum() == min(len(r), 4) and t["ban_mask"][0, len(p) - 1]


# ----------------------------------------------------------------------------- Ctrl-C, bad input
def test_ctrl_c_mid_update_saves_a_consistent_step(
    tiny_model_dir, task_file, tmp_path, monkeypatch, ctrl_c
):
    """SIGINT during step 1's first microbatch: the step finishes, is counted and saved; resuming trains step 2
    only, and the weights equal a straight run's."""
    flags = tiny_flags(
        tiny_model_dir, task_file, "--engine", "hf", "--eval-every", "0", "--n-grpo-steps", "3"
    )
    real_step, real_mb = grpo.train_step, losses.grpo_microbatch_train_step
    calls = {}  # step -> microbatch calls

    def train_step(policy, optimizer, batch, args, step, *a, **kw):
        calls[step] = 0
        return real_step(policy, optimizer, batch, args, step, *a, **kw)

    def microbatch(*a, **kw):
        step = max(calls)
        if step == 1 and calls[step] == 0:
            os.kill(os.getpid(), signal.SIGINT)
        calls[step] += 1
        return real_mb(*a, **kw)

    monkeypatch.setattr(grpo, "train_step", train_step)
    monkeypatch.setattr(losses, "grpo_microbatch_train_step", microbatch)
    assert threading.current_thread() is threading.main_thread()
    with pytest.raises(SystemExit) as exit_:
        grpo.main(grpo.parse_args(flags + ["--out", str(tmp_path / "cut")]))
    assert exit_.value.code == 130
    monkeypatch.undo()
    state = json.load(open(tmp_path / "cut" / "checkpoint" / "state.json"))
    assert (
        state["step"] == 2 and sorted(calls) == [0, 1] and calls[1] == calls[0]
    )  # step 1 finished after the signal
    run_grpo(["--resume", str(tmp_path / "cut")])
    run_grpo(flags, tmp_path / "straight")
    assert [r["step"] for r in metrics(tmp_path / "cut") if "train/loss" in r] == [0, 1, 2]
    from safetensors.torch import load_file

    a, b = (
        load_file(str(tmp_path / n / "checkpoint" / "model.safetensors"))
        for n in ("cut", "straight")
    )
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize(
    "bad,msg",
    [
        (["--train-batch-size", "10", "--gradient-accumulation-steps", "3"], "divisible"),
        (["--rollout-batch-size", "12", "--group-size", "8"], "--group-size"),
        (
            ["--train-batch-size", "4", "--group-size", "8", "--gradient-accumulation-steps", "1"],
            ">= --group-size",
        ),
        (
            [
                "--rollout-batch-size",
                "64",
                "--train-batch-size",
                "48",
                "--gradient-accumulation-steps",
                "1",
            ],
            "multiple of",
        ),
        (["--gradient-accumulation-steps", "0"], "integer > 0"),
        (["--group-size", "0"], "integer > 0"),
        (["--max-tokens", "0"], "integer > 0"),
        (["--top-p", "2"], "probability"),
        (["--temperature", "inf"], "finite"),
        (["--min-tokens", "500"], "--min-tokens 500 must be <= --max-tokens"),
        (["--rollout-batch-size", "0"], "integer > 0"),
        (["--eval-n", "0"], "integer > 0"),
        (["--epochs-per-rollout-batch", "0"], "integer > 0"),
        (["--max-grad-norm", "-1"], "> 0"),
        (["--train-n", "-1"], ">= 0"),
        (["--prompt", "nosuch"], "--prompt nosuch"),
        (["--train-path", "/no/such.jsonl"], "no such file"),
        (["--val-path", "/tmp"], "is a directory"),
        (["--model", "/tmp"], "no config.json"),
        (["--resume", "/tmp"], "no complete checkpoint"),
    ],
)
def test_bad_values_fail_in_one_line_before_loading(bad, msg, tmp_path):
    proc = run_grpo([*bad, "--out", str(tmp_path / "o")], check=False)
    err = proc.stderr.strip()
    assert (
        proc.returncode != 0
        and err.startswith("error:")
        and msg in err
        and len(err.splitlines()) == 1
    ), err
    assert not os.path.exists(tmp_path / "o")


def test_existing_run_is_refused_and_data_checked_before_loading(
    tiny_model_dir, task_file, tmp_path
):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    proc = run_grpo(
        tiny_flags(tiny_model_dir, task_file, "--out", str(tmp_path / "run")), check=False
    )
    assert (
        proc.returncode != 0 and "already holds a run" in proc.stderr and "--resume" in proc.stderr
    )
    run = tmp_path / "broken"  # a checkpoint whose weights are gone: named before anything loads
    (run / "checkpoint").mkdir(parents=True)
    for name in ("state.json", "config.json", "tokenizer.json", "optimizer.pt"):
        (run / "checkpoint" / name).write_text("{}")
    proc = run_grpo(["--resume", str(run)], check=False)
    assert (
        proc.returncode != 0
        and "no weights" in proc.stderr
        and len(proc.stderr.strip().splitlines()) == 1
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    proc = run_grpo(
        tiny_flags(tiny_model_dir, str(empty), "--out", str(tmp_path / "o2")), check=False
    )
    assert (
        proc.returncode != 0 and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr
    )


def test_dry_run_prints_the_effective_settings():
    proc = run_grpo(["--model", "Qwen/Qwen2.5-Math-1.5B", "--dry-run"])
    cfg = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (
        cfg["profile"] == "hub"
        and cfg["lr"] == 1e-5
        and cfg["rollout_batch_size"] == 256
        and cfg["prompt"] == "countdown"
    )
    assert cfg["micro_train_batch_size"] == 2 and cfg["kl_every"] == 0 and cfg["train_path"] is None
    cfg = json.loads(run_grpo(["--dry-run"]).stdout.strip().splitlines()[-1])
    assert (
        cfg["profile"] == "demo" and cfg["prompt"] == "r1_zero" and cfg["train_path"] == "synthetic"
    )


def test_common_checkpoint_swap_recovery(tmp_path):
    """A crash between the two renames of a checkpoint swap leaves .old and .tmp: resume finds the newest
    complete one, and a truncated last metrics line is dropped."""
    run = tmp_path / "run"
    for name, step in (("checkpoint.old", 1), ("checkpoint.tmp", 2)):
        (run / name).mkdir(parents=True)
        (run / name / "state.json").write_text(json.dumps({"step": step}))
    path = common.find_checkpoint(str(run), repair=False)  # a --dry-run --resume only looks
    assert path == str(run / "checkpoint.tmp") and sorted(os.listdir(run)) == [
        "checkpoint.old",
        "checkpoint.tmp",
    ]
    path = common.find_checkpoint(str(run))
    assert json.load(open(os.path.join(path, "state.json")))["step"] == 2 and sorted(
        os.listdir(run)
    ) == ["checkpoint"]
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"ste')
    assert common.read_metrics(str(run / "metrics.jsonl")) == [{"step": 0}, {"step": 1}]
