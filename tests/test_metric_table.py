"""metric_table.py: the one table of every logged metric. The table is consistent; docs/metrics.md's
glossary is the table's; every key the run doctor reads is in it; grpo.py's console line keeps its
format; and the promise in its docstring holds: a new metric is one entry in the table and one line
where it is computed, made here in a scratch copy of the scripts, whose one-step run logs the key
to metrics.jsonl and prints it on the step line, and whose glossary check names it until the docs
are rewritten.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import doctor
import expert_iteration
import grpo
import metric_table
from conftest import ROOT
from test_grpo import KEYWORD, tiny_flags


def test_the_table_is_consistent():
    assert metric_table.check() == []
    assert set(grpo.STEP_KEYS) >= {"step", "train/loss", "train/reward", "time/step"}
    assert set(expert_iteration.SFT_KEYS) == {
        "train/loss",
        "train/nll_per_token",
        "train/grad_norm",
        "train/lr",
        "train/tokens_per_s",
        "train/sft_steps",
        "train/entropy_kept",
        "train/kept_len_mean",
    }


def test_the_check_catches_what_it_names(monkeypatch):
    first = metric_table.METRICS[0]
    twice = metric_table.METRICS + [first]
    monkeypatch.setattr(metric_table, "METRICS", twice)
    monkeypatch.setattr(metric_table, "KEYS", [m.key for m in twice])
    assert metric_table.check() == ["a key is listed twice"]
    stray = metric_table.Metric("train/x", "grpo", "", {"sft": ".2f", "nanochat": "d"}, "x")
    monkeypatch.setattr(metric_table, "METRICS", [stray])
    monkeypatch.setattr(metric_table, "KEYS", ["train/x"])
    assert metric_table.check() == [
        "train/x: unknown script 'nanochat'",
        "train/x: on sft's line but not logged by it",
        "train/x: on nanochat's line but not logged by it",
    ]


def test_the_docs_glossary_is_the_tables():
    assert metric_table.documented_glossary() == metric_table.glossary(), (
        "docs/metrics.md's glossary is not the table's: run python metric_table.py --write"
    )


def test_every_key_the_run_doctor_reads_is_in_the_table():
    with open(doctor.__file__) as f:
        source = f.read()
    keys = set(re.findall(r"[\"']((?:train|eval|time|ray)/[\w@]+)[\"']", source))
    assert len(keys) >= 10, "the pattern finds the doctor's keys"
    assert sorted(keys - set(metric_table.KEYS)) == []


def test_grpos_step_line():
    row = {
        "train/loss": -0.01234,
        "train/reward": 0.5,
        "train/answer_reward": 0.25,
        "train/all_correct_frac": 0.125,
        "train/all_wrong_frac": 0.5,
        "train/response_len_mean": 60.75,
        "train/truncation_rate": 0.05,
        "train/entropy": 0.0671,
        "train/grad_norm": 0.2014,
        "train/clip_fraction": 0.0,
        "train/lr": 1e-4,  # not on grpo.py's line
        "time/generation": 15.43,
        "time/training": 6.52,
        "time/tokens_per_s": 141.2,
    }
    args = grpo.parse_args([])
    assert grpo.step_line(0, args, row) == (
        "step 1/30 | loss -0.0123 | reward 0.500 | answer_reward 0.25 | all_correct_frac 0.12 | "
        "all_wrong_frac 0.50 | response_len_mean 60.8 | "
        "truncation_rate 0.05 | entropy 0.067 | grad_norm 0.201 | clip_fraction 0.000 | "
        "generation 15.4 | training 6.5 | tokens_per_s 141"
    )


# ----------------------------------------------------------------------------- a new metric
ENTRY = '    M("train/scratch_metric", GRPO, "", {"grpo": ".2f"}, "added in a scratch copy"),\n'
LINE = '        "train/scratch_metric": 0.25,\n'


def scratch_copy(folder):
    """The root scripts, prompts/ and docs/ copied to folder, with one metric added: its entry in
    the table and its line in grpo.summarize."""
    for name in os.listdir(ROOT):
        if name.endswith(".py"):
            shutil.copy(os.path.join(ROOT, name), folder / name)
    for sub in ("prompts", "docs"):
        shutil.copytree(os.path.join(ROOT, sub), folder / sub)
    table = (folder / "metric_table.py").read_text()
    end = "\n]\n# fmt: on\n"
    assert table.count(end) == 1
    (folder / "metric_table.py").write_text(table.replace(end, "\n" + ENTRY.rstrip("\n") + end))
    source = (folder / "grpo.py").read_text()
    anchor = '        "train/zero_var_frac": stats["frac_groups_zero_std"],\n'
    assert source.count(anchor) == 1
    (folder / "grpo.py").write_text(source.replace(anchor, anchor + LINE))


def test_a_new_metric_is_a_table_entry_and_one_line(tmp_path, tiny_model_dir):
    task_file = tmp_path / "task.jsonl"
    with open(task_file, "w") as f:
        for i in range(16):
            f.write(json.dumps({"question": f"Say {i}.", "ground_truth": [KEYWORD]}) + "\n")
    folder = tmp_path / "scratch"
    folder.mkdir()
    scratch_copy(folder)
    out = tmp_path / "run"
    flags = tiny_flags(tiny_model_dir, str(task_file), "--n-grpo-steps", "1", "--eval-every", "0")
    flags += ["--engine", "hf", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(folder))
    run = subprocess.run(
        [sys.executable, "grpo.py", *flags], cwd=folder, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with open(out / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["train/scratch_metric"] for r in rows if "train/loss" in r] == [0.25]
    assert "| scratch_metric 0.25" in run.stdout
    # the glossary check names the new key until the docs are rewritten, then passes
    check = (
        "import metric_table as t; "
        "print(t.documented_glossary() == t.glossary(), 'scratch_metric' in t.glossary())"
    )
    before = subprocess.run(
        [sys.executable, "-c", check], cwd=folder, env=env, capture_output=True, text=True
    )
    assert before.stdout.split() == ["False", "True"], before.stderr
    subprocess.run([sys.executable, "metric_table.py", "--write"], cwd=folder, env=env, check=True)
    after = subprocess.run(
        [sys.executable, "-c", check], cwd=folder, env=env, capture_output=True, text=True
    )
    assert after.stdout.split() == ["True", "True"], after.stderr
    assert "`train/scratch_metric`" in (folder / "docs" / "metrics.md").read_text()


@pytest.mark.parametrize("script", metric_table.SCRIPTS)
def test_each_trainers_step_keys_come_from_the_table(script):
    keys = metric_table.step_keys(script)
    assert "step" in keys
    for key in keys:
        assert key in metric_table.KEYS
