"""The README's recipes, checked.

Every command of its recipe table runs with --dry-run, and its effective settings match the settings
tables of docs/settings.md (where the command does not set the flag itself). Then every recipe row
runs end to end (STAND_INS) with the hub id replaced by a local tiny model of the same family (Qwen2
for Qwen2.5-Math, Qwen3 for Qwen3), on data the test writes, for one to four tiny steps: the hub
profile, the seeds' prompts and graders and the device logic a GPU user's run takes, before anyone
pays for a GPU. A stand-in's saved configuration is checked against the settings tables and against
each row's flags.
"""

import json
import os
import re
import shlex

import pytest

from conftest import doc_section, run_script

DRY_RUN = {
    "eval_zero_shot.py",
    "best_of_n.py",
    "sft.py",
    "grpo.py",
    "grpo_ray.py",
    "expert_iteration.py",
}
DATA_FLAGS = ("--data", "--train-path", "--val-path", "--eval-path")


def table(title, marker):
    """Rows (lists of cells) of the markdown table after `<!-- marker -->` in the section headed
    `title` (conftest.doc_section: README.md or docs/*.md), header first."""
    lines = doc_section(title).split(f"<!-- {marker} -->", 1)[1].strip().split("\n")
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
    for what, cmd in table("Experiments", "recipes")[1:]:
        for part in re.findall(r"`([^`]+)`", cmd):
            for c in part.split("&&"):
                argv = shlex.split(c)
                if argv[:1] == ["python"] and argv[1] in DRY_RUN:
                    out.append((f"{what}: {argv[1]}", argv[1:]))
    return out


def write_data(path, task):
    """A small valid data file for `task` (what the recipe's file would hold)."""
    if task == "keyword":
        # numbers, which the embedded model writes often (reward variance); ~10% of words hash to
        # the test split
        words = ["apple", "river", "the", "and"] + [str(i) for i in range(100)]
        with open(path, "w") as f:
            f.write("\n".join(words))
        return
    rows = []
    if task == "countdown":
        rows = [{"numbers": [3, 4, 5], "target": 17}, {"numbers": [2, 9, 6], "target": 12}] * 4
    elif task == "gsm8k":
        for i in range(8):
            question = f"Tom has {i} apples and buys 3. How many?"
            rows.append({"question": question, "answer": f"{i} + 3 = {i + 3}\n#### {i + 3}"})
    elif task in ("math500", "math"):
        for i in range(8):
            problem = f"What is ${i} + 1$?"
            solution = f"$\\boxed{{{i + 1}}}$"
            rows.append({"problem": problem, "answer": str(i + 1), "solution": solution})
    elif task == "sft":
        for i in range(8):
            response = f" {i + 1}. The final answer is: $\\boxed{{{i + 1}}}$"
            rows.append({"prompt": f"What is {i} + 1? Answer:", "response": response})
    else:
        raise KeyError(task)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def task_of(argv, flag):
    """The data kind a data flag of this command holds."""
    if argv[0] == "sft.py" and flag == "--data":
        return "sft"
    if argv[0] == "sft.py":
        return argv[argv.index("--eval-task") + 1]
    if "--task" in argv:
        return argv[argv.index("--task") + 1]
    return "countdown"


def localise(argv, tmp):
    """The command with its data files written under tmp and --out / --save-dir moved there."""
    argv = list(argv)
    for i, a in enumerate(argv[:-1]):
        if a in DATA_FLAGS and argv[i + 1] not in ("countdown", "synthetic"):
            path = os.path.join(tmp, os.path.basename(argv[i + 1]))
            write_data(path, task_of(argv, a))
            argv[i + 1] = path
        if a in ("--out", "--save-dir"):  # apart: runs/x and models/x may share a name
            argv[i + 1] = os.path.join(tmp, "out", a[2:], os.path.basename(argv[i + 1]))
    return argv


def run(argv, cwd):
    """A recipe's command, in this process (conftest.run_script), in the working directory cwd."""
    return run_script(argv, cwd)


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
    header, *rows = table("grpo.py and grpo_ray.py", "settings:grpo")
    col = header.index(cfg["profile"])
    task_col = None  # a task's own column overrides the profile's where it has a value
    if cfg["task"] == "keyword":
        task_col = header.index("keyword")
    elif cfg["task"] in ("gsm8k", "math", "math500"):
        task_col = header.index("gsm8k, math, math500")
    out = {}
    for row in rows:
        dest = re.search(r"`--([a-z-]+)`", row[2]).group(1).replace("-", "_")
        if dest in given:
            continue
        if "countdown task" in row[2] and cfg["task"] != "countdown":
            continue
        cell = row[col]
        if task_col is not None and row[task_col]:
            cell = row[task_col]
        out[dest] = value(cell)
    return out


def bon_temperature():
    """best_of_n.py's sampling temperature, as the sentence under the eval_zero_shot table states
    it."""
    sentence = r"`best_of_n.py` uses .*? samples at `--temperature ([0-9.]+)`"
    section = doc_section("eval_zero_shot.py and best_of_n.py")
    return float(re.search(sentence, section, re.S).group(1))


def expect_eval(cfg, given):
    """The eval_zero_shot table's row for the task (the embedded model's Countdown row apart);
    best_of_n shares the prompt, reward and max tokens, and samples at its own temperature
    (bon_temperature)."""
    header, *rows = table("eval_zero_shot.py and best_of_n.py", "settings:eval_zero_shot")
    key = cfg["task"]
    if cfg["task"] == "countdown" and "countdown-tiny" in cfg["model"]:
        key = "countdown, embedded model"

    def matches(r):
        name = r[0].split(" (")[0]  # "gsm8k (seed 001)" -> "gsm8k"
        return name == key or (key in name.split(", ") and "embedded" not in r[0])

    row = next(r for r in rows if matches(r))
    out = {"prompt": row[2], "reward": row[3], "max_tokens": value(row[4])}
    if "n" in cfg:  # "n": best_of_n
        out["temperature"] = bon_temperature()
    else:
        out["temperature"] = value(row[5])
    return {k: v for k, v in out.items() if k not in given}


def expect_sft(cfg, given):
    """The sft table's column for the model. A row whose flag cell is `--eval-task T` is the grader
    a validation on task T uses (eval_reward; its cell, or the seed value where the cell is
    empty)."""
    header, *rows = table("sft.py", "settings:sft")
    if "countdown-tiny" in cfg["model"]:
        col = header.index("embedded model")
    else:
        col = header.index("hub model")
    out = {}
    for row in rows:
        dest, task = re.search(r"`--([a-z-]+) ?([a-z0-9_]*)`", row[2]).groups()
        dest = dest.replace("-", "_")
        # a validation grader: applies when the run validates on that task, whoever chose it
        if task:
            if cfg["eval_task"] == task and cfg["eval_n"]:
                out["eval_reward"] = value(row[col] or row[1])
        elif row[col] and dest not in given:
            out[dest] = value(row[col])
    return out


def expect_ei(cfg, given):
    """The expert-iteration table's column for the run's profile (demo or hub), every flag the
    command leaves open."""
    header, *rows = table("expert_iteration.py", "settings:expert_iteration")
    col = header.index(cfg["profile"])
    out = {}
    for row in rows:
        dest = re.search(r"`--([a-z-]+)`", row[1]).group(1).replace("-", "_")
        if dest not in given:
            out[dest] = value(row[col])
    return out


def check_tables(label, script, cfg, given):
    """An effective configuration agrees with docs/settings.md's tables on every flag `given` leaves
    open."""
    if script in ("grpo.py", "grpo_ray.py"):
        expected = expect_grpo(cfg, given)
    elif script == "sft.py":
        expected = expect_sft(cfg, given)
    elif script == "expert_iteration.py":
        expected = expect_ei(cfg, given)
    else:
        expected = expect_eval(cfg, given)
    for k, v in expected.items():
        got = cfg[k]
        if isinstance(got, list) and len(got) == 1:  # a one-value sweep (--max-tokens 512)
            got = got[0]
        assert same(got, v), f"{label}: {k} = {got!r}, docs/settings.md says {v!r}"


@pytest.mark.parametrize("label,argv", recipes(), ids=[r[0] for r in recipes()])
def test_recipe_dry_run_matches_the_settings_tables(label, argv, tmp_path):
    proc = run(localise(argv, str(tmp_path)) + ["--dry-run"], str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads(proc.stdout.strip().splitlines()[-1])  # dry_run's last line
    check_tables(label, argv[0], cfg, explicit(argv))
    assert not {"out", "runs"} & set(os.listdir(tmp_path)), "a dry run created its output directory"


def test_every_script_has_a_recipe():
    assert {a[0] for _, a in recipes()} == DRY_RUN


# the model each seed's experiments use: seed 000 runs zero-shot and SFT on the base model and GRPO
# on the Instruct one ("For the GRPO portion, we will use the Qwen 2.5 Math 1.5B Instruct model");
# seed 001 uses Qwen3-0.6B, seed 002 Qwen3-1.7B
SEED_MODELS = {
    ("000", "eval_zero_shot.py"): "Qwen/Qwen2.5-Math-1.5B",
    ("000", "sft.py"): "Qwen/Qwen2.5-Math-1.5B",
    ("000", "grpo.py"): "Qwen/Qwen2.5-Math-1.5B-Instruct",
    ("001", "eval_zero_shot.py"): "Qwen/Qwen3-0.6B",
    ("001", "best_of_n.py"): "Qwen/Qwen3-0.6B",
    ("001", "grpo.py"): "Qwen/Qwen3-0.6B",
    ("001", "expert_iteration.py"): "Qwen/Qwen3-0.6B",
    ("002", "eval_zero_shot.py"): "Qwen/Qwen3-1.7B",
    ("002", "grpo.py"): "Qwen/Qwen3-1.7B",
    ("004", "grpo_ray.py"): "models/my-lm",  # the student's own model, the table's convert_lm row
}


def test_seed_004_converts_the_model_its_rows_run():
    """The table's convert_lm.py row writes the directory every seed-004 row names."""
    converts = []
    for _what, cmd in table("Experiments", "recipes")[1:]:
        for part in re.findall(r"`([^`]+)`", cmd):
            argv = shlex.split(part)
            if argv[:2] == ["python", "convert_lm.py"]:
                converts.append(argv[argv.index("--out") + 1])
    assert converts == [SEED_MODELS[("004", "grpo_ray.py")]]


def trained_from(model):
    """The hub model a recipe row trains into `model` (its --out's model/ directory: an SFT run's
    final model), or None when no row writes it."""
    for _label, argv in recipes():
        if argv[0] == "sft.py" and os.path.join(argv[argv.index("--out") + 1], "model") == model:
            return argv[argv.index("--model") + 1]
    return None


def test_every_seed_row_runs_the_seeds_model():
    """Each seed's rows name its model, or (seed 000's test numbers of the SFT model) the model a
    row of the seed trained from it."""
    checked = set()
    for label, argv in recipes():
        seed = re.search(r"\((\d{3})\b", label)
        if seed is None or "--model" not in argv:  # the embedded model's rows
            continue
        key = (seed.group(1), argv[0])
        model = argv[argv.index("--model") + 1]
        if trained_from(model) is not None:
            assert trained_from(model) == SEED_MODELS[(key[0], "sft.py")], label
            continue
        assert model == SEED_MODELS[key], label
        checked.add(key)
    assert checked == set(SEED_MODELS)


def test_seed_001_trainer_rows_validate_sampled_at_t_1():
    """Seed 001 evaluates GSM8K at T 1.0: each of its GSM8K trainer rows adds sampled validation
    at that temperature."""
    rows = [(label, argv) for label, argv in recipes() if "gsm8k_train.jsonl" in argv]
    assert len(rows) >= 9
    for label, argv in rows:
        flags = dict(pairs(argv))
        assert int(flags.get("--eval-samples", 0)) > 0, label
        assert flags.get("--eval-temperature") == "1.0", label


def test_seed_001_problems_8_to_13_each_have_a_gsm8k_row():
    """Problem 11 asks for no run; the others train on GSM8K with seed 001's model."""
    for problem in ("Problem 8", "Problem 9", "Problem 10", "Problems 11–12", "Problem 13"):
        rows = [a for label, a in recipes() if f"(001 {problem}" in label]
        assert len(rows) == 1, problem
        assert rows[0][rows[0].index("--task") + 1] == "gsm8k", problem
    assert "Problem 8's own text says to train on MATH" in doc_section("Recipes")


def test_seed_002_rows_use_its_reward_and_clipped_loss():
    """Its reward_fn (a subset of the numbers may be used) and compute_loss (the clipped ratio)."""
    rows = [(label, a) for label, a in recipes() if "(002 " in label]
    assert len(rows) == 5  # zero-shot and the 2 x 2 grid
    for label, argv in rows:
        assert argv[argv.index("--reward") + 1] == "countdown_subset", label
        if argv[0] == "grpo.py":
            assert argv[argv.index("--loss") + 1] == "grpo_clip", label


def kissing_commands():
    """Every `python kissing.py ...` command of the recipe table, as argv after the script."""
    out = []
    for _what, cmd in table("Experiments", "recipes")[1:]:
        for part in re.findall(r"`([^`]+)`", cmd):
            for c in part.split("&&"):
                argv = shlex.split(c)
                if argv[:2] == ["python", "kissing.py"]:
                    out.append(argv[2:])
    return out


def test_kissing_rows_parse_and_the_llm_search_uses_a_local_server():
    """The seed's Problem 17 is an LLM search: a row runs `search` against an OpenAI-compatible
    server on this machine (vLLM's), writing the conversation log the seed requires to --out-dir
    (tests/test_kissing.py runs the loop and checks the log)."""
    import kissing

    searches = []
    for argv in kissing_commands():
        args = kissing.parse_args(argv)
        if args.cmd == "search":
            searches.append(args)
    assert len(searches) == 1
    assert searches[0].llm.startswith("openai:http://127.0.0.1:")
    assert searches[0].out_dir.startswith("runs/")
    assert "`vllm serve " in doc_section("Experiments")


def test_the_readme_states_the_seeds_kissing_bound_and_its_name_exception():
    kissing = doc_section("The kissing-number challenge (seed 001 §7)")  # docs/kissing.md
    assert "595 ≤ τ₁₁ ≤ 870" in kissing.split("| 582 |")[0]  # beside the published results
    intro = doc_section("nano-reasoning-rl").split("\n## ")[0]  # the README before its sections
    assert "exact" not in intro  # the names claim says which handouts, and its one exception
    assert "seeds 000–002" in intro
    assert "`masked_mean_per_sequence`" in intro


# ----------------------------------------------------------------------------- stand-ins
# the stand-ins' sizes: one to four tiny steps or a handful of prompts
GRPO_TINY = (
    "--rollout-batch-size 4 --group-size 2 --train-batch-size 4 --gradient-accumulation-steps 2 "
    "--max-tokens 12 --eval-n 2 --eval-every 0 --grader-workers 0 --eager"
).split()
TINY = {
    # 2 prompts x 2 samples: the countdown prompt is 600 tokens
    "grpo.py": ["--n-grpo-steps", "1"] + GRPO_TINY,
    # 4 steps: a --steps-per-rollout 4 cycle
    "grpo_ray.py": ["--n-grpo-steps", "4", "--timeout-s", "300"] + GRPO_TINY,
    "eval_zero_shot.py": "--limit 4 --max-tokens 12 --workers 1 --eager".split(),
    "best_of_n.py": "--limit 2 --n 4 --ns 1,2,4 --max-tokens 12 --workers 1 --eager".split(),
    # 2 questions x 2 samples: a step that keeps nothing is a full step too
    "expert_iteration.py": (
        "--n-ei-steps 1 --ei-batch-size 2 --group-size 2 --batch-size 2 "
        "--gradient-accumulation-steps 1 --max-tokens 12 --eval-n 2 --eval-every 0 "
        "--grader-workers 0 --eager"
    ).split(),
    "sft.py": (
        "--n-examples 4 --batch-size 2 --gradient-accumulation-steps 1 --steps 1 --eval-n 2 "
        "--eval-max-tokens 8 --eval-every 1 --eager"
    ).split(),
}
# Every recipe row, each in exactly one stand-in: (row label prefixes, engine, flags the stand-in
# adds). Rows that differ in flags that do not clash run as one command carrying all their flags;
# the sizes TINY sets (--max-tokens 256 vs 512 too) are the stand-in's own. vLLM where a GPU user's
# path differs most (the hub-profile eval and GRPO).
GRPO_COUNTDOWN_ROWS = (
    "GRPO on Countdown, one lr",
    "baselines",
    "length normalisation",
    "group std normalisation",
)
# seed 001's GSM8K rows: the on-policy ablations join the off-policy run; the baselines row's loss
# clashes with every other row's, so it runs alone
GSM8K_ROWS = (
    "off-policy, one (E, B)",
    "prompt ablation",
    "GSM8K GRPO train loop",
    "GSM8K GRPO, one lr",
    "GSM8K GRPO length normalisation",
    "GSM8K GRPO std normalisation",
)
# seed 002's 2 x 2 grid: {GRPO, Dr. GRPO} x {256, 512 tokens} (the token budget is the stand-in's)
COUNTDOWN_GRID_ROWS = (
    "Countdown GRPO at 256",
    "Countdown GRPO at 512",
    "Countdown Dr. GRPO at 256",
    "Countdown Dr. GRPO at 512",
)
RAY_ROWS = ("keyword-inclusion GRPO on Ray", "KL drift", "colocated, k steps per rollout")
STAND_INS = [
    (("embedded model, offline: zero-shot",), "hf", []),
    (("embedded model, offline: Best-of-N",), "hf", []),
    (("MATH zero-shot baseline",), "vllm", []),
    (("GSM8K zero-shot",), "hf", []),
    (("Countdown zero-shot at 256/512/1024",), "hf", ["--max-tokens", "4,8,12"]),  # still a sweep
    (("Best-of-N at 1/4/8/16",), "hf", []),
    (("SFT, one size",), "hf", []),
    (("the SFT model on the Prime Intellect test split",), "hf", []),
    (("the SFT model on MATH-500",), "hf", []),
    (("embedded model, offline: expert iteration",), "hf", []),
    (("GSM8K expert iteration",), "hf", []),
    (("embedded model from scratch",), "hf", ["--countdown-n", "32"]),
    (GRPO_COUNTDOWN_ROWS, "vllm", []),
    # LoRA: each row its own run (their --lora-rank and --lr clash with the rows above)
    (("GRPO on Countdown with LoRA",), "hf", []),
    (("GRPO on Countdown with rank-1 LoRA",), "hf", []),
    (GSM8K_ROWS, "hf", []),
    (("GSM8K GRPO baselines",), "hf", []),
    (("GSM8K GRPO with a Python tool",), "hf", []),
    (("ToRL-1.5B",), "hf", []),
    (("no-clip ablation",), "hf", []),
    (COUNTDOWN_GRID_ROWS, "hf", []),
    (RAY_ROWS, "hf", []),
    # NCCL needs GPUs: Problem 9's Ray Direct Transport runs over gloo here (the same code path but
    # the backend)
    (
        ("disaggregated async", "weight transfer over Ray Direct Transport"),
        "hf",
        ["--weight-sync", "gloo"],
    ),
]
ALIASES = {"async": "async_mode"}  # flag -> argparse destination where the two differ


def pairs(argv):
    """[(flag, value or None)] of a command's flags, in order."""
    out = []
    for a, b in zip(argv, argv[1:] + [None]):
        if not a.startswith("--"):
            continue
        if b is not None and b.startswith("--"):
            b = None  # a switch: the next word is the next flag
        out.append((a, b))
    return out


def stand_in(prefixes, extra):
    """The rows' commands merged into one (their flags' union; a clash outside the stand-in's own
    flags fails)."""
    rows = [next(r for r in recipes() if r[0].startswith(p)) for p in prefixes]
    own = {f for f, _ in pairs(TINY[rows[0][1][0]] + extra)} | {"--out", "--save-dir"}
    argv = list(rows[0][1])
    for label, other in rows[1:]:
        assert other[0] == argv[0], f"{label}: another script than {prefixes[0]}"
        have = dict(pairs(argv))
        for flag, val in pairs(other[1:]):
            assert flag in own or have.get(flag, val) == val, (
                f"{label}: {flag} {val} clashes with {have[flag]}"
            )
            if flag in have:
                continue
            argv.append(flag)
            if val is not None:
                argv.append(val)
    return rows, argv


def saved_config(out):
    """The run's saved flags: args.json, or the "args" of a summary the evaluators write."""
    for name, key in (("args.json", None), ("summary.json", "args"), ("best_of_n.json", "args")):
        path = os.path.join(out, name)
        if os.path.exists(path):
            with open(path) as f:
                cfg = json.load(f)
            if key:
                return cfg[key]
            return cfg
    raise AssertionError(f"no saved configuration in {out}: {os.listdir(out)}")


@pytest.fixture(scope="module")
def tiny_converted_lm_dir(tmp_path_factory):
    """convert_lm.py's output for a tiny random assignment-1 model (handout names, 1 layer) with a
    byte-level tokenizer (no merges): the stand-in for seed 004's models/my-lm."""
    import pickle

    import torch

    import convert_lm

    d = tmp_path_factory.mktemp("my_lm")
    gen = torch.Generator().manual_seed(0)
    V = 260
    D = 64
    F = 128
    sd = {"token_embeddings.weight": torch.randn(V, D, generator=gen)}
    for name in ("q_proj", "k_proj", "v_proj", "output_proj"):
        sd[f"layers.0.attn.{name}.weight"] = 0.1 * torch.randn(D, D, generator=gen)
    sd["layers.0.ln1.weight"] = torch.ones(D)
    sd["layers.0.ln2.weight"] = torch.ones(D)
    sd["layers.0.ffn.w1.weight"] = 0.1 * torch.randn(F, D, generator=gen)
    sd["layers.0.ffn.w3.weight"] = 0.1 * torch.randn(F, D, generator=gen)
    sd["layers.0.ffn.w2.weight"] = 0.1 * torch.randn(D, F, generator=gen)
    sd["ln_final.weight"] = torch.ones(D)
    sd["lm_head.weight"] = 0.1 * torch.randn(V, D, generator=gen)
    torch.save({"model": sd, "iteration": 1}, d / "ckpt.pt")
    vocab = {0: b"<|endoftext|>"}
    for b in range(256):
        vocab[1 + b] = bytes([b])
    with open(d / "tokenizer.pkl", "wb") as f:
        pickle.dump((vocab, []), f)
    argv = ["--checkpoint", str(d / "ckpt.pt"), "--vocab", str(d / "tokenizer.pkl")]
    return convert_lm.main(argv + ["--out", str(d / "my-lm")])


def test_every_recipe_row_has_one_stand_in():
    prefixes = [p for ps, _, _ in STAND_INS for p in ps]
    for label, _ in recipes():
        matches = [p for p in prefixes if label.startswith(p)]
        assert len(matches) == 1, f"{label}: not in one stand-in"


@pytest.mark.parametrize("prefixes,engine,extra", STAND_INS, ids=[s[0][0] for s in STAND_INS])
def test_recipe_runs_end_to_end_on_a_stand_in(
    prefixes, engine, extra, tiny_qwen2_dir, tiny_qwen3_dir, tmp_path, request
):
    rows, argv = stand_in(prefixes, extra)
    hub = "--model" in argv
    argv = localise(argv, str(tmp_path))
    # the hub id -> a tiny local model of its family (Qwen2 for Qwen2.5-Math, Qwen3 for Qwen3);
    # seed 004's converted model -> a tiny converted one
    if hub:
        i = argv.index("--model") + 1
        if trained_from(argv[i]) is not None:  # an SFT run's model: the model it trains
            argv[i] = trained_from(argv[i])
        if argv[i] == SEED_MODELS[("004", "grpo_ray.py")]:
            argv[i] = request.getfixturevalue("tiny_converted_lm_dir")
        elif "Qwen2" in argv[i]:
            argv[i] = tiny_qwen2_dir
        else:
            argv[i] = tiny_qwen3_dir
    if "--out" not in argv:  # the embedded-model recipes write to runs/<name> under the working dir
        argv += ["--out", str(tmp_path / "out" / "run")]
    cmd = argv + TINY[argv[0]] + extra + ["--engine", engine]
    proc = run(cmd, str(tmp_path))
    assert proc.returncode == 0, f"{prefixes}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
    out = argv[argv.index("--out") + 1]
    cfg = saved_config(out)
    check_tables(prefixes[0], argv[0], cfg, explicit(cmd))  # every flag no row and no size sets

    # and every row's own flags reached the run
    own = {f for f, _ in pairs(TINY[argv[0]] + extra)}
    own |= set(DATA_FLAGS) | {"--model", "--out", "--save-dir"}
    for label, row in rows:
        for flag, val in pairs(row[1:]):
            if flag in own:
                continue
            name = flag[2:].removeprefix("no-").replace("-", "_")
            got = cfg[ALIASES.get(name, name)]
            if val is None:  # a switch: --x is True, --no-x False
                want = not flag.startswith("--no-")
            else:
                want = value(val)
            assert same(got, want), f"{label}: {flag} {val or ''} ran as {got!r}"

    if hub and argv[0] in ("grpo.py", "grpo_ray.py"):  # the hub profile, trained
        assert cfg["profile"] == "hub"
    if argv[0] == "expert_iteration.py":  # the profile of the model, and a step ran
        profile = "demo"
        if hub:
            profile = "hub"
        assert cfg["profile"] == profile
        with open(os.path.join(out, "metrics.jsonl")) as f:
            assert any("train/kept_frac" in json.loads(line) for line in f)
    if argv[0] in ("grpo.py", "grpo_ray.py"):
        with open(os.path.join(out, "metrics.jsonl")) as f:
            metrics = [json.loads(line) for line in f]
        assert any("train/loss" in m for m in metrics)
        # KL drift only when asked
        assert any("train/kl_ref" in m for m in metrics) == (cfg["kl_every"] > 0)
    if cfg.get("eval_samples"):  # seed 001's GSM8K rows: sampled validation at T 1.0, logged
        assert cfg["eval_temperature"] == 1.0
        with open(os.path.join(out, "metrics.jsonl")) as f:
            assert any("eval/pass@k" in json.loads(line) for line in f)
    if argv[0] == "grpo_ray.py":  # the schedule and transport asked for
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        assert summary["mode"] == cfg["mode"]
        assert summary["weight_sync"] == cfg["weight_sync"]
        assert summary["steps"] == 4
    if argv[0] == "eval_zero_shot.py":  # --limit 4 per max-tokens value
        with open(os.path.join(out, "generations.jsonl")) as f:
            assert sum(1 for _ in f) == len(cfg["max_tokens"]) * 4
    if argv[0] == "sft.py" and cfg["eval_task"] == "math":
        # MATH validation graded by question_only, and it ran
        assert cfg["eval_reward"] == "question_only"
        with open(os.path.join(out, "metrics.jsonl")) as f:
            assert any("eval/accuracy" in json.loads(line) for line in f)
    if argv[0] == "best_of_n.py":
        assert cfg["temperature"] == bon_temperature() == 1.0
    if prefixes == COUNTDOWN_GRID_ROWS:  # and seed 002's deliverable, on this run
        final_table_on_stand_ins(out, argv[argv.index("--model") + 1], tmp_path)


# ----------------------------------------------------------------------------- seed 002's table
def compare_row():
    """The argv of the recipe table's `plot.py --compare` command (seed 002's deliverable)."""
    for _what, cmd in table("Experiments", "recipes")[1:]:
        for part in re.findall(r"`([^`]+)`", cmd):
            argv = shlex.split(part)
            if argv[:3] == ["python", "plot.py", "--compare"]:
                return argv[1:]
    raise AssertionError("no `python plot.py --compare` row in the recipe table")


def compared_runs(argv):
    """The run directories a --compare command names (its positional arguments)."""
    out = argv[argv.index("--out") + 1]
    return [a for a in argv[2:] if not a.startswith("--") and a != out]


def out_of(prefix):
    """The --out of the recipe row whose label starts with prefix."""
    argv = next(a for label, a in recipes() if label.startswith(prefix))
    return argv[argv.index("--out") + 1]


def test_the_final_table_compares_the_grid_with_the_zero_shot_row():
    """Seed 002 §1.6.2's deliverable row reads what its rows write: the zero-shot row's output and
    the four runs of the 2 x 2 grid."""
    want = [out_of("Countdown zero-shot")]
    for prefix in COUNTDOWN_GRID_ROWS:
        want.append(out_of(prefix))
    assert compared_runs(compare_row()) == want


def final_table_on_stand_ins(grpo_out, model, tmp_path):
    """The --compare row on real outputs: the zero-shot row run on the stand-in model at two
    budgets, and the grid's stand-in run (its four rows ran as one) in place of each grid run."""
    zero = localise(
        next(a for label, a in recipes() if label.startswith("Countdown zero-shot")), str(tmp_path)
    )
    zero[zero.index("--model") + 1] = model
    flags = TINY["eval_zero_shot.py"] + ["--max-tokens", "4,8", "--engine", "hf"]
    proc = run(zero + flags, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    argv = compare_row()
    zero_out = zero[zero.index("--out") + 1]
    figure = str(tmp_path / "final" / "cd_final.png")
    cmd = []
    for a in argv:
        if a == out_of("Countdown zero-shot"):
            a = zero_out
        elif a in compared_runs(argv):
            a = grpo_out
        elif a == argv[argv.index("--out") + 1]:
            a = figure
        cmd.append(a)
    proc = run(cmd, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    # (method, max tokens) of each row: zero-shot at both budgets, then the grid's four runs (the
    # stand-in ran Dr. GRPO, the union of the rows' flags, at 12 tokens)
    got = [(c[1], c[2]) for c in cells]
    assert got == [("zero-shot", "4"), ("zero-shot", "8")] + [("Dr. GRPO", "12")] * 4
    with open(figure.replace(".png", ".md")) as f:
        assert f.read().strip() == "\n".join(lines)
    assert os.path.getsize(figure) > 5_000
