"""expert_iteration.py: keep_correct on hand-built batches (the correct responses exactly, the
--max-per-question cap), the entropy it logs against grpo.py's train/entropy on one real batch, and
two steps end to end on the embedded model as subprocesses (--engine hf: no engine start-up),
straight through and as one step plus a --resume: the logged keys (each in the README's glossary),
the kept fraction equal to the fraction answered correctly, the resumed step equal to the straight
run's, refused bad input.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from test_grpo import readme_glossary

import data
import expert_iteration as ei
import grpo
import plot
from conftest import ROOT, one_line_error

# 2 questions x 4 samples a step, SFT in microbatches of 2, greedy validation on 2 questions at the
# end only, on CPU: the embedded model answers a Countdown question in 30-60 tokens
TINY_FLAGS = (
    "--ei-batch-size 2 --group-size 4 --batch-size 4 --gradient-accumulation-steps 2 "
    "--max-tokens 64 --eval-n 2 --eval-every 0 --grader-workers 0 --engine hf --lr 1e-3"
).split()

RIGHT = {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}
WRONG = {"reward": 0.1, "format_reward": 1.0, "answer_reward": 0.0}


def run_ei(flags, check=True):
    cmd = [sys.executable, os.path.join(ROOT, "expert_iteration.py"), *flags]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def step_rows(rows):
    """The EI step rows (not the eval rows)."""
    return [r for r in rows if "train/kept_frac" in r]


# ----------------------------------------------------------------------------- keep_correct
@pytest.mark.parametrize("cap,want", [(0, [0, 2, 3, 7]), (1, [0, 7]), (2, [0, 2, 7])])
def test_keep_correct_keeps_the_correct_responses_up_to_the_cap(cap, want):
    """Two questions x 4 samples: question 0 answered right by samples 0, 2, 3; question 1 by its
    last. A wrong answer in the right format is not kept."""
    args = ei.parse_args(["--group-size", "4", "--max-per-question", str(cap)])
    rewards = [RIGHT, WRONG, RIGHT, RIGHT] + [WRONG] * 3 + [RIGHT]
    assert ei.keep_correct({"rewards": rewards}, args) == want


# ----------------------------------------------------------------------------- entropy
def test_entropy_over_all_responses_is_grpo_train_entropy(tmp_path):
    """On one real batch of the embedded model, the entropy expert_iteration.py logs over all
    sampled responses equals grpo.py's train/entropy (its training forward, one optimizer step on
    the same batch): the two curves compare."""
    args = ei.parse_args(TINY_FLAGS + ["--out", str(tmp_path / "ei")])
    runtime = grpo.setup_runtime(args)
    train_rows, _ = ei.load_data(args)
    learner = ei.build_learner(args, runtime)
    engine = grpo.make_engine(args.model, args, runtime)
    batch, stats = ei.sample(engine, train_rows, args, 0)
    kept = ei.keep_correct(batch, args)
    logged = ei.summarize(
        batch, kept, ei.response_entropy(learner["policy"], batch, args, runtime), stats
    )
    sizes = ["--rollout-batch-size", "8", "--group-size", "4", "--train-batch-size", "8"]
    gargs = grpo.parse_args(sizes + ["--gradient-accumulation-steps", "2", "--max-tokens", "64"])
    batch["raw"] = torch.tensor([d["reward"] for d in batch["rewards"]])
    grpo.summarize(batch, [stats], gargs)
    history, _ = grpo.train_step(grpo.build_learner(gargs, runtime), batch, gargs, runtime, 0)
    assert logged["train/entropy"] == pytest.approx(history[0]["train/entropy"], rel=1e-4)
    # the kept ones: the same per-token entropies, weighted over the kept responses' tokens only
    assert logged["train/kept_frac"] == len(kept) / 8
    if kept:
        assert logged["train/entropy_kept"] > 0


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two steps straight through; one step, then --resume naming only the run and the new step
    count."""
    d = tmp_path_factory.mktemp("ei")
    straight = run_ei(TINY_FLAGS + ["--n-ei-steps", "2", "--out", str(d / "straight")])
    run_ei(TINY_FLAGS + ["--n-ei-steps", "1", "--out", str(d / "resumed")])
    resumed = run_ei(["--resume", str(d / "resumed"), "--n-ei-steps", "2"])
    return {
        "dir": d,
        "straight": metrics(d / "straight"),
        "resumed": metrics(d / "resumed"),
        "stdout": straight.stdout,
        "resume_stdout": resumed.stdout,
    }


def test_two_steps_log_every_key_keep_the_correct_ones_and_save(runs):
    rows = runs["straight"]
    steps = step_rows(rows)
    assert [r["step"] for r in steps] == [0, 1]
    for r in steps:
        assert set(ei.STEP_KEYS) <= set(r), set(ei.STEP_KEYS) - set(r)
        # answer rewards are 0 or 1 and nothing is capped: kept = answered correctly
        assert r["train/kept_frac"] == r["train/answer_reward"]
        if r["train/kept_frac"] > 0:
            assert set(ei.SFT_KEYS) <= set(r), set(ei.SFT_KEYS) - set(r)
            # ceil(1 epoch x kept / 4 pairs a step)
            assert r["train/sft_steps"] == -(-round(r["train/kept_frac"] * 8) // 4)
        else:
            assert "train/loss" not in r
    assert steps[1]["opt_step"] == steps[0]["opt_step"] + steps[1].get("train/sft_steps", 0)
    assert any(r["train/kept_frac"] > 0 for r in steps), "the embedded model should solve some"
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [2]  # --eval-every 0: the end only
    missing = sorted(set().union(*rows) - readme_glossary())
    assert not missing, missing
    d = runs["dir"] / "straight"
    assert {"config.json", "model.safetensors", "optimizer.pt", "state.json"} <= set(
        os.listdir(d / "checkpoint")
    )
    assert os.path.getsize(d / "dashboard.png") > 10_000
    # the dashboard draws both entropies and the kept fraction, and times the entropy pass
    fig = plot.build_figure([str(d)])
    titles = {ax.get_title(): ax for ax in fig.axes}
    drawn = []
    for title in ("token entropy", "train reward"):
        drawn += [line.get_label().split()[-1] for line in titles[title].lines]
    assert {"train/entropy", "train/entropy_kept", "train/kept_frac"} <= set(drawn)
    assert "time/entropy" in plot.time_split(rows)
    with open(d / "args.json") as f:
        assert json.load(f)["profile"] == "demo"
    assert "step 2/2 | answer_reward" in runs["stdout"]


def test_resume_continues_as_the_straight_run(runs):
    assert "resume: restored the run's flags" in runs["resume_stdout"]
    assert "n_ei_steps 1 -> 2" in runs["resume_stdout"]
    resumed = step_rows(runs["resumed"])
    straight = step_rows(runs["straight"])
    assert [r["step"] for r in resumed] == [0, 1]
    assert [r["opt_step"] for r in resumed] == [r["opt_step"] for r in straight]
    for key in ("train/answer_reward", "train/kept_frac", "train/response_len_mean"):
        assert resumed[1][key] == straight[1][key], key
    assert resumed[1]["train/entropy"] == pytest.approx(straight[1]["train/entropy"], rel=1e-4)
    if "train/loss" in straight[1]:
        assert resumed[1]["train/loss"] == pytest.approx(straight[1]["train/loss"], rel=1e-4)


def test_bad_input_is_one_line_before_loading(tmp_path):
    proc = run_ei(["--batch-size", "3", "--gradient-accumulation-steps", "2"], check=False)
    one_line_error(proc, "--batch-size must be divisible by --gradient-accumulation-steps")
    path = tmp_path / "two.jsonl"
    rows = [{"numbers": [3, 4, 5], "target": 17}] * 2
    data.write_jsonl_atomic(str(path), rows)
    flags = ["--train-path", str(path), "--ei-batch-size", "4", "--out", str(tmp_path / "o")]
    proc = run_ei(flags + ["--engine", "hf"], check=False)
    one_line_error(proc, "--ei-batch-size 4")


def test_sigterm_saves_the_steps_done(tmp_path, monkeypatch, sigterm, capsys):
    """SIGTERM during step 1's rollout, with the demo's --save-every 0: step 0 is saved (weights,
    optimizer, counters) and the run exits 143."""
    flags = TINY_FLAGS + ["--max-tokens", "8", "--n-ei-steps", "3", "--out", str(tmp_path)]
    real = ei.sample

    def sample(engine, train_rows, args, step):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(engine, train_rows, args, step)

    monkeypatch.setattr(ei, "sample", sample)
    with pytest.raises(SystemExit) as exit_:
        ei.main(ei.parse_args(flags))
    assert exit_.value.code == 143
    assert "SIGTERM: saving checkpoint" in capsys.readouterr().out
    with open(tmp_path / "checkpoint" / "state.json") as f:
        state = json.load(f)
    rows = step_rows(metrics(tmp_path))
    assert state["step"] == 1
    assert [r["step"] for r in rows] == [0]
    assert state["opt_step"] == rows[-1]["opt_step"]
    assert os.path.isfile(tmp_path / "checkpoint" / "optimizer.pt")
