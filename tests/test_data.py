"""data.py: prompts, loaders on files written here, the synthetic Countdown generator and its
CLI."""

import json
import os
import subprocess
import sys

import pytest

import data
from grader import countdown_reward_fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- prompts
def test_prompts_are_the_seed_texts():
    r1 = data.load_prompt("r1_zero")
    assert r1.startswith(
        "A conversation between User and Assistant. The User takes a question, and the "
        "Assistant solves it. The Assistant first thinks about the reasoning process in the "
        "mind and them provides the User with the answer."
    )
    assert r1.endswith(
        "<think> reasoning process here </think> <answer> answer here </answer>.\n"
        "User: {question}\nAssistant: <think>"
    )
    assert data.load_prompt("question_only") == "{question}"
    assert (
        "Therefore, the final answer is: $\\boxed{\\text{answer}}$. I hope it is correct."
        in data.load_prompt("intellect")
    )
    assert "Step 2: 3 / 3 = 1" in data.load_prompt("countdown")
    assert (
        data.format_prompt(data.load_prompt("keyword"), "apple")
        == "Write a story that includes the word: apple"
    )
    for name in ["r1_zero", "question_only", "intellect", "countdown", "keyword"]:
        assert data.load_prompt(name).count("{question}") == 1


def test_format_prompt_and_stop_strings():
    t = data.load_prompt("r1_zero")
    p = data.format_prompt(t, "What is {x}? \\frac{1}{2}")
    assert p.endswith("User: What is {x}? \\frac{1}{2}\nAssistant: <think>")
    assert data.stop_strings(t) == ["</answer>"]
    assert data.stop_strings(data.load_prompt("countdown")) == ["</answer>"]
    assert data.stop_strings(data.load_prompt("intellect")) == []
    with pytest.raises(ValueError, match="no prompt file"):
        data.load_prompt("nope")
    with pytest.raises(ValueError, match="placeholder"):
        data.format_prompt("no slot", "q")
    # countdown prompt filled with the seed's example question reproduces the seed's problem text
    filled = data.format_prompt(
        data.load_prompt("countdown"), data.countdown_question([96, 97, 68], 125)
    )
    assert (
        "Problem\n\nUsing the numbers in the list [96, 97, 68], create an equation that equals "
        "125.\n\nYou can use basic arithmetic operations (+, -, *, /) and each number can only be "
        "used once."
    ) in filled


# ----------------------------------------------------------------------------- loaders
def _write(path, rows):
    lines = [json.dumps(r) for r in rows]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def test_gsm8k_math_jsonl_loaders(tmp_path):
    g = _write(
        tmp_path / "g.jsonl",
        [
            {"question": "q1", "answer": "2+2=<<2+2=4>>4\n#### 1,234"},
            {"question": "q2", "answer": "#### 7"},
        ],
    )
    rows = data.load_task("gsm8k", path=g)
    assert [r["ground_truth"] for r in rows] == ["1234", "7"]
    assert rows[0]["question"] == "q1"
    assert len(data.load_task("gsm8k", path=g, limit=1)) == 1
    m = _write(
        tmp_path / "m.jsonl",
        [
            {"question": "q", "answer": "So $\\boxed{\\frac{1}{2}}$.The answer is: \\frac{1}{2}"},
            {"problem": "p", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)"},
            {"problem": "p", "solution": "x \\boxed{5}"},
        ],
    )
    truths = [r["ground_truth"] for r in data.load_task("math500", path=m)]
    assert truths == ["\\frac{1}{2}", "\\left( 3, \\frac{\\pi}{2} \\right)", "5"]
    j = _write(tmp_path / "j.jsonl", [{"q": "a", "gt": ["1", "one"], "extra": 3}])
    rows = data.load_task("jsonl", path=j, question_key="q", answer_key="gt")
    assert rows == [
        {"q": "a", "gt": ["1", "one"], "extra": 3, "question": "a", "ground_truth": ["1", "one"]}
    ]
    c = _write(tmp_path / "c.jsonl", [{"nums": [7, 7, 65], "target": 51}])
    gt = data.load_task("countdown", path=c)[0]["ground_truth"]
    assert gt == {"numbers": [7, 7, 65], "target": 51}


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="file not found: .*missing.jsonl"):
        data.load_task("gsm8k", path=str(tmp_path / "missing.jsonl"))
    bad = _write(tmp_path / "b.jsonl", [{"question": "q"}])
    with pytest.raises(ValueError, match="row 0 has no field 'answer'"):
        data.load_task("gsm8k", path=bad)
    with pytest.raises(ValueError, match="no field 'prompt'"):
        data.load_sft_jsonl(_write(tmp_path / "s.jsonl", [{"response": "r"}]))
    with pytest.raises(ValueError, match="unknown task"):
        data.load_task("mnist")
    with pytest.raises(ValueError, match="needs path"):
        data.load_task("keyword")
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n{broken\n')
    with pytest.raises(ValueError, match="x.jsonl:2: invalid JSON"):
        data.read_jsonl(str(tmp_path / "x.jsonl"))
    try:
        import datasets  # noqa: F401
    except ImportError:  # the hub set without `datasets`: one line naming what to pass instead
        with pytest.raises(ValueError, match="no local file given .* pass a local .jsonl"):
            data.load_task("gsm8k")
        with pytest.raises(ValueError, match="or 'synthetic'"):
            data.load_task("countdown")


def test_keyword_split_and_sft_roundtrip(tmp_path):
    kw = tmp_path / "kw.txt"
    kw.write_text("\n".join(f"word{i}" for i in range(300)) + "\n\n")
    train = data.load_task("keyword", split="train", path=str(kw), seed=1)
    test = data.load_task("keyword", split="test", path=str(kw), seed=1)
    train_words = {r["question"] for r in train}
    test_words = {r["question"] for r in test}
    assert len(train) + len(test) == 300
    assert not train_words & test_words
    assert test[0]["ground_truth"] == [test[0]["question"]]
    assert data.load_task("keyword", split="test", path=str(kw), seed=1) == test
    rows = [{"prompt": "p", "response": "r ü"}, {"prompt": "p2", "response": "r2"}]
    data.write_jsonl_atomic(str(tmp_path / "d" / "sft.jsonl"), rows)
    assert data.load_sft_jsonl(str(tmp_path / "d" / "sft.jsonl")) == rows
    assert not [f for f in os.listdir(tmp_path / "d") if ".tmp" in f]


# ----------------------------------------------------------------------------- countdown
def test_generator_solvable_reference_scores_one_deterministic_disjoint():
    train = data.generate_countdown(300, seed=3, split="train")
    test = data.generate_countdown(100, seed=3, split="test")
    assert train == data.generate_countdown(300, seed=3, split="train")
    assert train != data.generate_countdown(300, seed=4, split="train")

    def as_listed(r):
        return (tuple(r["ground_truth"]["numbers"]), r["ground_truth"]["target"])

    def multiset(r):
        return (tuple(sorted(r["ground_truth"]["numbers"])), r["ground_truth"]["target"])

    assert len({as_listed(r) for r in train}) == 300  # distinct as listed
    # splits disjoint by number multiset and target
    assert not {multiset(r) for r in train} & {multiset(r) for r in test}
    for r in train + test:
        gt = r["ground_truth"]
        assert 3 <= len(gt["numbers"]) <= 4
        assert all(1 <= x <= 10 for x in gt["numbers"])
        assert 1 <= gt["target"] <= 50
        assert data.solve_countdown(gt["numbers"], gt["target"]) is not None
        answer = f"think </think> <answer> {r['solution']} </answer>"
        assert countdown_reward_fn(answer, gt)["reward"] == 1.0
        assert r["question"] == data.countdown_question(gt["numbers"], gt["target"])
    loaded = data.load_task("countdown", split="test", path="synthetic", limit=20, seed=3)
    assert loaded == test[:20]


def test_solver_exact():
    assert data.solve_countdown([7, 7, 65], 51) is not None
    s = data.solve_countdown([8, 3, 8, 3], 24)  # needs a fractional intermediate: 8 / (3 - 8 / 3)
    assert s is not None
    gt = {"numbers": [3, 3, 8, 8], "target": 24}
    assert countdown_reward_fn(f"<answer>{s}</answer>", gt)["reward"] == 1.0
    assert data.solve_countdown([1, 1, 1], 100) is None
    with pytest.raises(ValueError, match="distinct countdown problems"):
        data.generate_countdown(50, numbers=(3, 3), max_value=1, max_target=3)


def test_cli_writes_jsonl(tmp_path):
    out = tmp_path / "cd.jsonl"
    script = os.path.join(ROOT, "data.py")
    flags = ["--numbers", "3..3", "--max-value", "6", "--seed", "1", "--n", "20", "--out", str(out)]
    r = subprocess.run(
        [sys.executable, script, "countdown", *flags], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    rows = data.read_jsonl(str(out))
    assert len(rows) == 20
    assert all(len(x["ground_truth"]["numbers"]) == 3 for x in rows)
    # what the CLI writes, the loader reads back
    loaded = data.load_task("countdown", path=str(out))
    assert [x["ground_truth"] for x in loaded] == [x["ground_truth"] for x in rows]

    flags = ["--path", str(tmp_path / "no.jsonl"), "--out", str(tmp_path / "o.jsonl")]
    r = subprocess.run(
        [sys.executable, script, "gsm8k", *flags], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1
    assert r.stderr.strip().startswith("error: file not found")


def test_task_defaults_and_prompts_formatted_once():
    """One rule for every script: hub models get the seeds' countdown prompt and hub set, the
    embedded model the r1_zero prompt it was trained on and synthetic problems; MATH is graded by
    question_only (seed 000 §3.2)."""
    assert data.task_defaults("countdown", None) == {
        "prompt": "r1_zero",
        "reward": "countdown",
        "path": "synthetic",
    }
    assert data.task_defaults("countdown", "Qwen/Qwen3-1.7B") == {
        "prompt": "countdown",
        "reward": "countdown",
        "path": None,
    }
    assert data.task_defaults("math500", "Qwen/Qwen2.5-Math-1.5B")["reward"] == "question_only"
    assert data.is_embedded(data.EMBEDDED_MODEL)
    assert not data.is_embedded("Qwen/Qwen3-0.6B")
    rows = data.load_task("countdown", "test", path="synthetic", limit=3, prompt="countdown")
    template = data.load_prompt("countdown")
    assert all(r["prompt"] == data.format_prompt(template, r["question"]) for r in rows)
