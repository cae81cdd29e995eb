"""grpo.py: end-to-end runs as subprocesses (on-/off-policy, resume), per-loss training on one real
rollout batch in-process, engine weight sync, and early failure on bad batch sizes.

Everything uses the tiny random Qwen2 of conftest and a generated keyword task (reward 1 when the
response contains the keyword), because a random model never earns a Countdown reward and a
zero-variance batch has no gradient. One vLLM engine per subprocess run plus one in-process engine.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, requires_vllm

import grpo

pytestmark = requires_vllm
STEP_KEYS = ["train/loss", "train/grad_norm", "train/entropy", "train/clip_fraction", "train/ratio_mean",
             "train/ratio_min", "train/ratio_max", "train/reward", "train/format_reward", "train/answer_reward",
             "train/response_len_mean", "train/response_len_max", "train/truncation_rate", "train/kl_ref",
             "train/kl_prev", "train/zero_var_frac", "time/generation", "time/grading", "time/old_log_probs",
             "time/training", "time/weight_sync", "time/tokens_per_s", "time/wall"]
EVAL_KEYS = ["eval/accuracy", "eval/reward", "eval/format_reward", "eval/answer_reward", "eval/response_len"]
KEYWORD = "the"


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kw") / "task.jsonl"
    with open(path, "w") as f:
        for i in range(64):
            f.write(json.dumps({"question": f"Write a sentence about the numbers {i} and {i + 3}.",
                                "ground_truth": [KEYWORD]}) + "\n")
    return str(path)


def tiny_flags(model, task, *extra):
    return ["--model", model, "--task", "jsonl", "--train-path", task, "--val-path", task, "--prompt", "question_only",
            "--reward", "keyword", "--rollout-batch-size", "16", "--group-size", "4", "--train-batch-size", "16",
            "--gradient-accumulation-steps", "2", "--max-tokens", "16", "--min-tokens", "2", "--eval-n", "8",
            "--eval-every", "1", "--lr", "1e-3", "--policy-device", "cpu", "--grader-workers", "0", *extra]


def run_grpo(flags, out):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "grpo.py"), *flags, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f], proc


@pytest.fixture(scope="module")
def on_policy(tiny_model_dir, task_file, tmp_path_factory):
    """2 steps, then resume for a 3rd; and 3 steps straight through with the same seed."""
    d = tmp_path_factory.mktemp("runs")
    flags = tiny_flags(tiny_model_dir, task_file, "--loss", "reinforce_with_baseline", "--length-norm", "masked_mean")
    first, proc = run_grpo(flags + ["--n-grpo-steps", "2"], d / "a")
    quiet = ["--eval-every", "0", "--kl-every", "0"]  # neither touches training; keeps these two runs cheap
    resumed, _ = run_grpo(flags + quiet + ["--n-grpo-steps", "3", "--resume", str(d / "a")], d / "a")
    straight, _ = run_grpo(flags + quiet + ["--n-grpo-steps", "3"], d / "b")
    return {"dir": d / "a", "first": first, "resumed": resumed, "straight": straight, "stdout": proc.stdout}


def test_on_policy_run_logs_every_key_plots_and_checkpoint(on_policy):
    rows = on_policy["first"]
    train = [r for r in rows if "train/loss" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in train] == [0, 1]
    for r in train:
        assert set(STEP_KEYS) <= set(r), set(STEP_KEYS) - set(r)
        assert r["train/ratio_mean"] == 1.0 and r["train/clip_fraction"] == 0.0  # on-policy
    assert [r["step"] for r in evals] == [0, 1, 2] and all(set(EVAL_KEYS) <= set(r) for r in evals)
    assert any(r["train/grad_norm"] > 0 for r in train), "keyword task should give reward variance"
    d = on_policy["dir"]
    for name in ("eval_accuracy", "train_reward", "train_entropy", "train_grad_norm", "train_response_len_mean",
                 "train_kl_ref", "time_split"):
        assert os.path.getsize(d / f"{name}.png") > 1000, name
    assert sorted(os.listdir(d / "rollouts"))[:3] == ["step_0000.jsonl", "step_0001.jsonl", "step_0002.jsonl"]
    ckpt = d / "checkpoint"
    assert {"config.json", "model.safetensors", "optimizer.pt", "state.json"} <= set(os.listdir(ckpt))
    assert "step 2/2 |" in on_policy["stdout"] and "eval step 2 | accuracy" in on_policy["stdout"]


def test_resume_continues_identically(on_policy):
    def step_row(rows, s):
        return next(r for r in rows if r.get("step") == s and "train/loss" in r)
    a, b = step_row(on_policy["resumed"], 2), step_row(on_policy["straight"], 2)
    for k in ("train/reward", "train/response_len_mean"):
        assert a[k] == b[k], k
    assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4, abs=1e-6)
    assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-3)
    assert len([r for r in on_policy["resumed"] if "train/loss" in r]) == 3  # rows past the checkpoint dropped


def test_off_policy_run_ratio_starts_at_one(tiny_model_dir, task_file, tmp_path):
    flags = tiny_flags(tiny_model_dir, task_file, "--loss", "grpo_clip", "--length-norm", "masked_normalize",
                       "--epochs-per-rollout-batch", "2", "--train-batch-size", "8", "--gradient-accumulation-steps", "2",
                       "--no-std-norm", "--n-grpo-steps", "2", "--eval-every", "0")
    rows, _ = run_grpo(flags, tmp_path)
    train = [r for r in rows if "train/loss" in r]
    assert [r["opt_step"] for r in train] == list(range(1, 9))  # 2 epochs x 2 train batches x 2 steps
    for s in (0, 1):
        first = next(r for r in train if r["step"] == s)
        assert first["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert first["train/ratio_min"] == pytest.approx(1.0, abs=1e-3) and first["train/ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert all(set(STEP_KEYS) <= set(r) for r in train)
    assert any(r["train/ratio_max"] > 1.0 + 1e-4 for r in train)  # later steps really move off-policy


@pytest.fixture(scope="module")
def live(tiny_model_dir, task_file):
    """One in-process engine + a real rollout batch on the tiny model."""
    args = grpo.parse_args(tiny_flags(tiny_model_dir, task_file, "--out", "/tmp/unused"))
    grpo.resolve_devices(args)
    train_rows, _, template, stop, reward_fn = grpo.load_data(args)
    engine = grpo.make_engine(tiny_model_dir, args)
    batch = grpo.rollout(engine, grpo.sample_questions(train_rows, args, 0), template, stop, args, 0)
    adv, raw, _ = grpo.score(batch, reward_fn, args)
    policy, tok = grpo.load_policy(tiny_model_dir, args)
    tensors = grpo.collate(batch, tok.pad_token_id)
    return {"args": args, "engine": engine, "batch": batch, "adv": adv, "raw": raw, "tensors": tensors,
            "model_dir": tiny_model_dir, "template": template}


@pytest.mark.parametrize("loss,norm", [("no_baseline", "masked_mean"), ("reinforce_with_baseline", "token"),
                                       ("grpo_clip", "masked_normalize"), ("grpo_no_clip", "masked_mean"),
                                       ("gspo", "token")])
def test_each_loss_and_length_norm_trains(live, loss, norm):
    args = grpo.parse_args(tiny_flags(live["model_dir"], "x", "--loss", loss, "--length-norm", norm,
                                      "--epochs-per-rollout-batch", "2", "--out", "/tmp/unused"))
    args.policy_device, args.dtype = "cpu", "float32"
    policy, _ = grpo.load_policy(live["model_dir"], args)
    before = [p.detach().clone() for p in policy.parameters()]
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    old = grpo.batch_log_probs(policy, live["tensors"], args)
    assert not old.requires_grad and not old.is_inference()
    old_copy = old.clone()
    calls = []
    policy.base_model.register_forward_hook(lambda *a: calls.append(torch.is_grad_enabled()))
    hist = grpo.train_on_batch(policy, opt, live["tensors"], live["adv"], live["raw"], old, None, args, 0)
    assert len(hist) == 2 and all(torch.isfinite(torch.tensor(h["train/loss"])) for h in hist)
    assert hist[0]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # first epoch: pi == pi_old
    assert all(calls) and len(calls) == 2 * args.gradient_accumulation_steps  # no hidden no-grad recompute of pi_old
    assert torch.equal(old, old_copy)  # old log-probs computed once, reused untouched across epochs
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.parameters()))


def test_sync_makes_engine_match_policy(live):
    args = live["args"]
    policy, tok = grpo.load_policy(live["model_dir"], args)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-2)
    grpo.train_on_batch(policy, opt, live["tensors"], live["adv"], live["raw"], None, None, args, 0)
    grpo.sync_weights(policy, live["engine"])
    prompts = [live["template"].replace("{question}", f"Write about {i}.") for i in range(4)]
    outs = grpo.engines.generate(live["engine"], prompts, n=1, temperature=0.0, max_tokens=10)
    policy.eval()
    for prompt, o in zip(prompts, outs):
        ids = torch.tensor([o[0]["prompt_token_ids"]])
        with torch.no_grad():
            hf = policy.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
        n = len(o[0]["token_ids"])
        assert hf.tolist()[:n] == o[0]["token_ids"], "engine greedy tokens differ from the trained policy's"


def test_collate_uses_engine_token_ids(live):
    b, t = live["batch"], live["tensors"]
    i = 0
    p, r = b["prompt_ids"][i], b["response_ids"][i]
    assert t["labels"][i, len(p) - 1:len(p) - 1 + len(r)].tolist() == r
    assert t["response_mask"][i].sum() == len(r) and t["response_mask"][i, len(p) - 1]
    lp = grpo.batch_log_probs(grpo.load_policy(live["model_dir"], live["args"])[0], t, live["args"])
    eng = torch.tensor(b["engine_logprobs"][i])
    assert torch.allclose(lp[i, len(p) - 1:len(p) - 1 + len(r)], eng, atol=5e-3)  # same tokens, same temperature


@pytest.mark.parametrize("bad,msg", [(["--train-batch-size", "10", "--gradient-accumulation-steps", "3"], "divisible"),
                                     (["--rollout-batch-size", "12", "--group-size", "8"], "--group-size"),
                                     (["--train-batch-size", "4", "--group-size", "8", "--gradient-accumulation-steps", "1"],
                                      ">= --group-size"),
                                     (["--rollout-batch-size", "64", "--train-batch-size", "48", "--gradient-accumulation-steps", "1"],
                                      "multiple of --train-batch-size")])
def test_bad_batch_sizes_are_rejected_by_parse_args(bad, msg):
    with pytest.raises(AssertionError, match=msg):
        grpo.parse_args(["--model", "/no/such/model", *bad])


def test_bad_batch_sizes_fail_before_loading_a_model(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "grpo.py"), "--model", str(tmp_path / "no_such_model"),
                           "--train-batch-size", "10", "--gradient-accumulation-steps", "3", "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stderr.strip().startswith("error:"), proc.stderr
    assert "--gradient-accumulation-steps" in proc.stderr and "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "o")
