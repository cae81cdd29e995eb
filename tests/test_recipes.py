"""The README's recipes, checked: every command of its recipe table runs with --dry-run and its effective
settings match the README's settings tables (where the command does not set the flag itself); then each
script runs a recipe end to end with the hub id replaced by a local tiny model of the same family (Qwen2
for Qwen2.5-Math, Qwen3 for Qwen3), on data the test writes, for one or two tiny steps: the hub profile,
the seeds' prompts and graders and the device logic a GPU user's run takes, before anyone pays for a GPU.
"""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT

README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
DRY_RUN = {"eval_zero_shot.py", "best_of_n.py", "sft.py", "grpo.py", "grpo_ray.py"}
DATA_FLAGS = ("--data", "--train-path", "--val-path", "--eval-path")


def table(marker):
    """Rows (lists of cells) of the markdown table after `<!-- marker -->`, header first."""
    lines = README.split(f"<!-- {marker} -->", 1)[1].strip().split("\n")
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not all(set(c) <= set("-: ") for c in cells):
            rows.append(cells)
    return rows


def recipes():
    """(label, argv) of every `python <script>.py ...` command in the recipe table."""
    out = []
    for what, cmd in table("recipes")[1:]:
        for part in re.findall(r"`([^`]+)`", cmd):
            for c in part.split("&&"):
                argv = shlex.split(c)
                if argv[:1] == ["python"] and argv[1] in DRY_RUN:
                    out.append((f"{what}: {argv[1]}", argv[1:]))
    return out


def write_data(path, task):
    """A small valid data file for `task` (what the recipe's file would hold)."""
    rows = {"countdown": [{"numbers": [3, 4, 5], "target": 17}, {"numbers": [2, 9, 6], "target": 12}] * 4,
            "gsm8k": [{"question": f"Tom has {i} apples and buys 3. How many?", "answer": f"{i} + 3 = {i + 3}\n#### {i + 3}"}
                      for i in range(8)],
            "math": [{"problem": f"What is ${i} + 1$?", "answer": str(i + 1), "solution": f"$\\boxed{{{i + 1}}}$"}
                     for i in range(8)],
            "sft": [{"prompt": f"What is {i} + 1? Answer:", "response": f" {i + 1}. The final answer is: $\\boxed{{{i + 1}}}$"}
                    for i in range(8)]}
    if task == "keyword":
        open(path, "w").write("\n".join(["apple", "river", "stone", "cloud", "the", "a", "and", "of"] * 2))
        return
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows["math" if task in ("math500", "math") else task])


def task_of(argv, flag):
    """The data kind a data flag of this command holds."""
    if argv[0] == "sft.py" and flag == "--data":
        return "sft"
    if argv[0] == "sft.py":
        return argv[argv.index("--eval-task") + 1]
    return argv[argv.index("--task") + 1] if "--task" in argv else "countdown"


def localise(argv, tmp):
    """The command with its data files written under tmp and --out / --save-dir moved there."""
    argv = list(argv)
    for i, a in enumerate(argv[:-1]):
        if a in DATA_FLAGS and argv[i + 1] not in ("countdown", "synthetic"):
            path = os.path.join(tmp, os.path.basename(argv[i + 1]))
            write_data(path, task_of(argv, a))
            argv[i + 1] = path
        if a in ("--out", "--save-dir"):
            argv[i + 1] = os.path.join(tmp, "out", os.path.basename(argv[i + 1]))
    return argv


def run(argv, cwd, timeout=600):
    return subprocess.run([sys.executable, os.path.join(ROOT, argv[0]), *argv[1:]], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def value(cell):
    cell = cell.strip("`").strip()
    if cell in ("true", "false"):
        return cell == "true"
    try:
        return float(cell)
    except ValueError:
        return cell


def same(a, b):
    if isinstance(b, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= 1e-12 * max(1.0, abs(b))
    return a == b


def explicit(argv):
    return {a.lstrip("-").removeprefix("no-").replace("-", "_") for a in argv if a.startswith("--")}


def expect_grpo(cfg, given):
    """The grpo settings table's value for every flag the command leaves to the profile."""
    header, *rows = table("settings:grpo")
    col = header.index(cfg["profile"])
    task_col = header.index("keyword") if cfg["task"] == "keyword" else \
        header.index("gsm8k, math, math500") if cfg["task"] in ("gsm8k", "math", "math500") else None
    out = {}
    for row in rows:
        dest = re.search(r"`--([a-z-]+)`", row[2]).group(1).replace("-", "_")
        if dest in given or ("countdown task" in row[2] and cfg["task"] != "countdown"):
            continue
        cell = row[task_col] if task_col is not None and row[task_col] else row[col]
        out[dest] = value(cell)
    return out


def expect_eval(cfg, given):
    """The eval_zero_shot table's row for the task (the embedded model's Countdown row apart); best_of_n shares
    the prompt, reward and max tokens, and samples at its own temperature."""
    header, *rows = table("settings:eval_zero_shot")
    key = "countdown, embedded model" if cfg["task"] == "countdown" and "countdown-tiny" in cfg["model"] else cfg["task"]
    name = lambda r: r[0].split(" (")[0]  # noqa: E731
    row = next(r for r in rows if name(r) == key or (key in name(r).split(", ") and "embedded" not in r[0]))
    out = {"prompt": row[2], "reward": row[3], "max_tokens": value(row[4])}
    if "n" not in cfg:  # eval_zero_shot
        out["temperature"] = value(row[5])
    return {k: v for k, v in out.items() if k not in given}


def expect_sft(cfg, given):
    header, *rows = table("settings:sft")
    col = header.index("embedded model") if "countdown-tiny" in cfg["model"] else header.index("hub model")
    out = {}
    for row in rows:
        dest = re.search(r"`--([a-z-]+)", row[2]).group(1).replace("-", "_")
        if row[col] and dest not in given:
            out[dest] = value(row[col])
    return out


@pytest.mark.parametrize("label,argv", recipes(), ids=[r[0] for r in recipes()])
def test_recipe_dry_run_matches_the_settings_tables(label, argv, tmp_path):
    proc = run(localise(argv, str(tmp_path)) + ["--dry-run"], str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads(proc.stdout.strip().splitlines()[-1])
    given = explicit(argv)
    want = {"grpo.py": expect_grpo, "grpo_ray.py": expect_grpo, "sft.py": expect_sft}.get(argv[0], expect_eval)(cfg, given)
    for k, v in want.items():
        got = cfg[k][0] if isinstance(cfg[k], list) and len(cfg[k]) == 1 else cfg[k]
        assert same(got, v), f"{label}: {k} = {got!r}, the README's table says {v!r}"
    assert not os.path.exists(tmp_path / "out"), "a dry run created its output directory"


def test_every_script_has_a_recipe():
    assert {a[0] for _, a in recipes()} == DRY_RUN


# ----------------------------------------------------------------------------- stand-ins
TINY = {"grpo.py": ["--n-grpo-steps", "1", "--rollout-batch-size", "8", "--group-size", "4", "--train-batch-size", "8",
                    "--gradient-accumulation-steps", "2", "--max-tokens", "12", "--eval-n", "4", "--eval-every", "0",
                    "--grader-workers", "0"],
        "eval_zero_shot.py": ["--limit", "4", "--max-tokens", "12", "--workers", "1"],
        "best_of_n.py": ["--limit", "2", "--n", "4", "--ns", "1,2,4", "--max-tokens", "12", "--workers", "1"],
        "sft.py": ["--n-examples", "4", "--batch-size", "2", "--gradient-accumulation-steps", "1", "--steps", "1",
                   "--eval-n", "2", "--eval-max-tokens", "8", "--eval-every", "1"]}
STAND_INS = [  # (recipe label prefix, engine): one per script and family; vLLM where a GPU user's path differs most
    ("MATH zero-shot baseline", "vllm"), ("Best-of-N at 1/4/8/16", "hf"), ("SFT, one size", "hf"),
    ("GRPO on Countdown, one lr", "vllm"), ("off-policy, one (E, B)", "hf")]


@pytest.mark.parametrize("prefix,engine", STAND_INS, ids=[s[0] for s in STAND_INS])
def test_recipe_runs_end_to_end_on_a_stand_in(prefix, engine, tiny_qwen2_dir, tiny_qwen3_dir, tmp_path):
    label, argv = next(r for r in recipes() if r[0].startswith(prefix))
    argv = localise(argv, str(tmp_path))
    i = argv.index("--model") + 1
    family = "qwen2" if "Qwen2" in argv[i] else "qwen3"
    argv[i] = tiny_qwen2_dir if family == "qwen2" else tiny_qwen3_dir
    proc = run(argv + TINY[argv[0]] + ["--engine", engine], str(tmp_path))
    assert proc.returncode == 0, f"{label}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
    out = argv[argv.index("--out") + 1]
    assert os.listdir(out)
    if argv[0] == "grpo.py":  # the hub profile, the countdown prompt / GSM8K's r1_zero, trained a step
        cfg = json.load(open(os.path.join(out, "args.json")))
        assert cfg["profile"] == "hub" and cfg["prompt"] == ("countdown" if cfg["task"] == "countdown" else "r1_zero")
        assert any("train/loss" in json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")))
    if "MATH" in label:
        rows = [json.loads(line) for line in open(os.path.join(out, "generations.jsonl"))]
        summary = json.load(open(os.path.join(out, "summary.json")))
        assert summary["args"]["prompt"] == "intellect" and summary["args"]["reward"] == "question_only" and len(rows) == 4
