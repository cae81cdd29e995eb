"""Task data and prompts: the one shared helper module (loaders, prompt files, the Countdown
generator).

Every task loader returns a list of dicts {"question": str, "ground_truth": ..., ...}; given a
prompt name, `load_task` also fills its template (prompts/<name>.prompt) once, into each row's
"prompt" (and its stop strings into "stop"). Rows are graded by
`grader.REWARD_FNS[TASKS[task]["reward"]]`.

Hub datasets (openai/gsm8k, hiyouga/math12k, HuggingFaceH4/MATH-500,
justinphan3110/Countdown-Tasks-3to4) load through `datasets` only when it is importable (it is
optional and not in requirements); every task also takes a local JSON/JSONL path, which is how tests
and offline runs use it. `load_task("countdown", path="synthetic")` uses the synthetic generator
below, which needs nothing; without a path Countdown is the seeds' hub set
(justinphan3110/Countdown-Tasks-3to4, its last 1024 rows held out as the test split).

Synthetic Countdown (departures from the seed's hub dataset, chosen so a tiny model can learn it):
  * k numbers (k from `numbers`, default 3, at most 5) in 1..max_value (default 10), duplicates
    allowed; target a positive integer <= max_target (default 50) reachable using ALL k numbers
    exactly once;
  * the target may also be reachable from a proper subset: the default reward requires every number
    (see grader.py), so a subset answer scores 0.1, not 1.0;
  * the reference solution keeps every intermediate value a non-negative integer (Countdown-game
    rule), fully parenthesised like the seed's examples: "(9 * (4 * 3)) - 7";
  * train/test are disjoint by a stable hash of (sorted numbers, target): ~10% of problems are test.

Examples:
  python data.py countdown --numbers 3..4 --max-value 10 --seed 0 --n 1000 --out /tmp/cd_train.jsonl
  python data.py countdown --split test --n 200 --out /tmp/cd_test.jsonl
  python data.py gsm8k --path ../shared/data/gsm8k_test.jsonl --n 5 --out /tmp/gsm8k5.jsonl
"""

import argparse
import contextlib
import hashlib
import json
import os
import random
from fractions import Fraction
from functools import lru_cache
from itertools import combinations

from grader import gsm8k_answer, math_answer  # ground truths are parsed by the grader's own rules

ROOT = os.path.dirname(os.path.abspath(__file__))
PROMPTS_DIR = os.path.join(ROOT, "prompts")
EMBEDDED_MODEL = os.path.join(ROOT, "models", "countdown-tiny")  # every script's offline default

# default prompt and reward (grader.REWARD_FNS key) per task, for hub models (see task_defaults)
TASKS = {
    "countdown": {"prompt": "countdown", "reward": "countdown"},  # seeds 000/002
    "gsm8k": {"prompt": "r1_zero", "reward": "r1_zero"},
    # seed 000 §3.2: Dr. GRPO's question_only grader
    "math": {"prompt": "intellect", "reward": "question_only"},
    "math500": {"prompt": "intellect", "reward": "question_only"},
    "keyword": {"prompt": "keyword", "reward": "keyword"},
    "jsonl": {"prompt": "r1_zero", "reward": "r1_zero"},
}
HUB = {  # task -> (dataset id, config) when `datasets` is importable and no path is given
    "gsm8k": ("openai/gsm8k", "main"),
    "math": ("hiyouga/math12k", None),
    "math500": ("HuggingFaceH4/MATH-500", None),
    "countdown_hub": ("justinphan3110/Countdown-Tasks-3to4", None),
}
TEST_BUCKETS = 10  # of 100 hash buckets go to the test split (countdown, keyword)


def is_embedded(model):
    """True for the embedded model (also when no --model was given)."""
    return model is None or os.path.abspath(os.path.expanduser(model)) == EMBEDDED_MODEL


def task_defaults(task, model):
    """{"prompt", "reward", "path"} a task uses when the flags leave them out.

    Hub models: TASKS and the hub set (path None). The embedded model does Countdown with the
    r1_zero prompt it was trained on and on synthetic problems, since it is offline by design. One
    rule for every script, so zero-shot, Best-of-N, SFT and GRPO runs of one model use one prompt.
    """
    out = {**TASKS[task], "path": None}
    if task == "countdown" and is_embedded(model):
        out.update(prompt="r1_zero", path="synthetic")
    return out


# ----------------------------------------------------------------------------- prompts
def load_prompt(name):
    """Template text of prompts/<name>.prompt (one trailing newline, if an editor added it, is
    dropped)."""
    path = os.path.join(PROMPTS_DIR, f"{name}.prompt")
    if not os.path.exists(path):
        have = sorted(f[:-7] for f in os.listdir(PROMPTS_DIR) if f.endswith(".prompt"))
        raise ValueError(f"no prompt file {path}; available prompts: {have}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.endswith("\n"):
        return text[:-1]
    return text


def format_prompt(template, question):
    """Fill {question}. Plain replace, not str.format: templates contain LaTeX braces."""
    if "{question}" not in template:
        raise ValueError("prompt template has no {question} placeholder")
    return template.replace("{question}", question)


def stop_strings(template):
    """Where generation stops for a prompt: after the answer tag, when the template asks for one."""
    return ["</answer>"] if "<answer>" in template else []


# ----------------------------------------------------------------------------- jsonl io
def read_jsonl(path):
    """Rows of a .jsonl file (a .json file holding a list also works)."""
    if not os.path.exists(path):
        raise ValueError(f"file not found: {path}")
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            rows = json.load(f)
            if not isinstance(rows, list):
                raise ValueError(f"{path}: expected a JSON list of objects")
            return rows
        rows = []
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: invalid JSON ({e.msg})") from None
        return rows


def write_jsonl_atomic(path, rows):
    """Write rows as JSONL via tmp file + os.replace, so readers never see a half-written file."""
    _write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_json_atomic(path, obj):
    """Write one JSON document (summaries, timelines) atomically, like write_jsonl_atomic."""
    _write_atomic(path, json.dumps(obj, indent=1))


def _write_atomic(path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:  # a full disk or Ctrl-C: no half-written tmp file stays behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _field(row, names, path, i):
    """The first of `names` that row i of `path` holds (not None), else a ValueError naming them."""
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
    raise ValueError(f"{path}: row {i} has no field {' or '.join(repr(n) for n in names)}")


def load_sft_jsonl(path):
    """SFT pairs [{"prompt", "response"}] from a JSONL file with those two fields."""
    pairs = []
    for i, r in enumerate(read_jsonl(path)):
        prompt = _field(r, ["prompt"], path, i)
        response = _field(r, ["response"], path, i)
        pairs.append({"prompt": prompt, "response": response})
    return pairs


# ----------------------------------------------------------------------------- loaders
def _hub_rows(task, split):
    """The rows of a HUB set's split, through `datasets` (optional: else a ValueError)."""
    try:
        import datasets  # optional dependency
    except ImportError:
        extra = ""
        if task == "countdown_hub":
            extra = " or 'synthetic' (data.py's generator)"
        raise ValueError(
            f"task {task.replace('_hub', '')!r}: no local file given and the `datasets` package "
            f"is not installed for the hub set {HUB[task][0]}; pass a local .jsonl{extra}"
        ) from None
    name, config = HUB[task]
    return list(datasets.load_dataset(name, config, split=split))


def _bucket(key):
    """A stable hash bucket in 0..99 (sha1: the same on every machine and Python run)."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % 100


def _in_split(key, split):
    """Whether a problem's key falls in split: TEST_BUCKETS of the 100 buckets are "test"."""
    if split is None:
        return True
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return (_bucket(key) < TEST_BUCKETS) == (split == "test")


def load_task(
    task,
    split="test",
    path=None,
    limit=None,
    seed=0,
    question_key=None,
    answer_key=None,
    prompt=None,
):
    """[{"question", "ground_truth", ...}] for one task; see the module docstring.

    path: a local JSON/JSONL file; None = the task's hub set (needs `datasets`); for countdown, the
    string "synthetic" = this module's generator. Local files keep their order (seed is only used by
    the synthetic countdown and the keyword split); `limit` keeps the first rows. For "jsonl",
    question_key/answer_key name the fields (defaults: "question"/"problem" and
    "ground_truth"/"answer").
    prompt: a prompts/<name>.prompt name; each row then also carries "prompt", the filled template,
    and "stop", its stop strings (shaped once, here, not threaded through every caller).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    rows = _load_rows(task, split, path, limit, seed, question_key, answer_key)
    if prompt is None:
        return rows
    template = load_prompt(prompt)
    prompted = []
    for r in rows:
        prompt_text = format_prompt(template, r["question"])
        prompted.append({**r, "prompt": prompt_text, "stop": stop_strings(template)})
    return prompted


# where a loaded row's question and answer are read from (first field present), unless
# question_key / answer_key name the field
_QUESTION_FIELDS = ["question", "problem"]
_ANSWER_FIELDS = {
    "gsm8k": ["answer"],
    "math": ["answer", "solution"],
    "math500": ["answer", "solution"],
    "jsonl": ["ground_truth", "answer"],
}


def _load_rows(task, split, path, n, seed, question_key, answer_key):
    """load_task's rows before any prompt is filled in."""
    if task == "countdown" and path == "synthetic":
        if n is not None:
            count = n
        elif split == "train":
            count = 10000
        else:
            count = 1024
        return generate_countdown(count, seed=seed, split=split)
    if task == "keyword":
        return _keyword_rows(path, split, n, seed)
    if path is None:
        if task == "jsonl":
            raise ValueError("task 'jsonl' needs path=<local .jsonl>")
        hub_task = task
        hub_split = split
        if task == "countdown":
            hub_task = "countdown_hub"
            hub_split = "train"  # the hub set has only a train split
        rows = _hub_rows(hub_task, hub_split)
        path = HUB[hub_task][0]  # errors name the hub set
        if task == "countdown":  # hold out its last 1024 rows as the test split
            if split == "test":
                rows = rows[-1024:]
            else:
                rows = rows[:-1024]
    else:
        rows = read_jsonl(path)
    if n is not None:
        rows = rows[:n]

    question_fields = _QUESTION_FIELDS
    if question_key:
        question_fields = [question_key]
    answer_fields = _ANSWER_FIELDS.get(task)
    if answer_key:
        answer_fields = [answer_key]
    out = []
    for i, r in enumerate(rows):
        if task == "countdown":
            # rows written by `python data.py countdown` nest numbers and target in ground_truth
            if isinstance(r.get("ground_truth"), dict):
                r = {**r, **r["ground_truth"]}
            nums = [int(x) for x in _field(r, ["numbers", "nums"], path, i)]
            target = int(_field(r, ["target"], path, i))
            gt = {"numbers": nums, "target": target}
            out.append({"question": countdown_question(nums, gt["target"]), "ground_truth": gt})
            continue
        q = _field(r, question_fields, path, i)
        if task == "gsm8k":
            sol = _field(r, answer_fields, path, i)
            out.append({"question": q, "ground_truth": gsm8k_answer(sol), "solution": sol})
        elif task in ("math", "math500"):
            a = _field(r, answer_fields, path, i)
            gt = math_answer(str(a))
            out.append({"question": q, "ground_truth": gt, "solution": r.get("solution", a)})
        else:  # jsonl: ground truth taken as is
            gt = _field(r, answer_fields, path, i)
            out.append({**r, "question": q, "ground_truth": gt})
    return out


def _keyword_rows(path, split, n, seed):
    """Keyword-inclusion rows from a word list (one word per line): each word is its own ground
    truth; the split is by a hash of the word, then the words are shuffled by seed."""
    if path is None:
        raise ValueError(
            "task 'keyword' needs path=<keyword list file, one word per line> "
            "(e.g. ../shared/data/keywords.txt)"
        )
    if not os.path.exists(path):
        raise ValueError(f"file not found: {path}")
    with open(path, encoding="utf-8") as f:
        words = sorted({w.strip() for w in f if w.strip()})
    words = [w for w in words if _in_split("kw:" + w.lower(), split)]
    random.Random(seed).shuffle(words)
    return [{"question": w, "ground_truth": [w]} for w in words[:n]]


# ----------------------------------------------------------------------------- countdown
def countdown_question(numbers, target):
    """The problem statement of seed 000 §5 (fills {question} of countdown.prompt and
    r1_zero.prompt)."""
    listed = ", ".join(str(x) for x in numbers)
    return (
        f"Using the numbers in the list [{listed}], create an equation "
        f"that equals {target}.\n\nYou can use basic arithmetic operations (+, -, *, /) and each "
        f"number can only be used once."
    )


def _combine(va, ea, vb, eb, nice):
    """(value, expr, nice) of every operation on two operands (value va, expression ea; vb, eb).

    nice: both operands are nice (every intermediate value an integer >= 0 so far); a result is
    nice when it is too.
    """
    pa = ea
    if not ea.isdigit():
        pa = f"({ea})"
    pb = eb
    if not eb.isdigit():
        pb = f"({eb})"
    out = [
        (va + vb, f"{pa} + {pb}", nice),
        (va * vb, f"{pa} * {pb}", nice),
        (va - vb, f"{pa} - {pb}", nice and va >= vb),
        (vb - va, f"{pb} - {pa}", nice and vb >= va),
    ]
    if vb != 0:
        out.append((va / vb, f"{pa} / {pb}", nice and va % vb == 0))
    if va != 0:
        out.append((vb / va, f"{pb} / {pa}", nice and vb % va == 0))
    return out


@lru_cache(maxsize=4096)
def _reachable(nums):
    """{value: (expr, nice)} for every value an expression using ALL of `nums` (a sorted tuple)
    exactly once can take, exact over Fractions; a nice (all-integer, non-negative) expression is
    kept over a non-nice one, else the first found (deterministic order)."""
    if len(nums) == 1:
        return {Fraction(nums[0]): (str(nums[0]), True)}
    out = {}
    idx = range(len(nums))
    for r in range(1, len(nums) // 2 + 1):
        for left in combinations(idx, r):
            if r * 2 == len(nums) and 0 not in left:
                continue  # each unordered split once
            a = tuple(nums[i] for i in left)
            b = tuple(nums[i] for i in idx if i not in left)
            reach_a = _reachable(a)
            reach_b = _reachable(b)
            for va, (ea, na) in reach_a.items():
                for vb, (eb, nb) in reach_b.items():
                    for v, e, nice in _combine(va, ea, vb, eb, na and nb):
                        if v not in out or (nice and not out[v][1]):
                            out[v] = (e, nice)
    return out


@lru_cache(maxsize=1 << 16)
def _targets(nums, max_target, split):
    """Sorted integer targets in 1..max_target of `split` that `nums` reach with a nice
    expression."""
    return [
        int(v)
        for v, (_expr, nice) in sorted(_reachable(nums).items())
        if nice
        and v.denominator == 1
        and 1 <= v <= max_target
        and _in_split(f"cd:{nums}:{int(v)}", split)
    ]


def solve_countdown(numbers, target):
    """An expression using every number exactly once that equals target (exact rationals), or
    None. Exhaustive: instant for <= 4 numbers, ~1 s for 5; more than 6 is refused."""
    if len(numbers) > 6:
        raise ValueError(f"solve_countdown handles at most 6 numbers, got {len(numbers)}")
    key = tuple(sorted(int(x) for x in numbers))
    hit = _reachable(key).get(Fraction(target))
    if hit:
        return hit[0]
    return None


def _parse_range(s):
    """(lo, hi) of "lo..hi", or of "k" (lo = hi = k)."""
    lo, _, hi = str(s).partition("..")
    return int(lo), int(hi or lo)


def generate_countdown(n, numbers=(3, 3), max_value=10, seed=0, max_target=50, split=None):
    """n distinct solvable problems [{"question", "ground_truth", "solution"}] (distinct as listed:
    the numbers' order counts).

    numbers: (lo, hi) count of numbers (or "3..4"); values in 1..max_value; targets in
    1..max_target. split: None (any), "train" or "test" (disjoint by a hash of the sorted numbers
    and the target).
    """
    if isinstance(numbers, str):
        lo, hi = _parse_range(numbers)
    else:
        lo = int(numbers[0])
        hi = int(numbers[-1])
    if not (2 <= lo <= hi <= 5):
        raise ValueError(f"numbers must be a range within 2..5, got {numbers!r}")
    if max_value < 1 or max_target < 1:
        raise ValueError("max_value and max_target must be >= 1")
    rng = random.Random(f"countdown-{seed}-{split}")
    seen = set()  # (numbers as listed, target) already generated
    out = []
    for _ in range(50 * n + 1000):
        if len(out) == n:
            break
        count = rng.randint(lo, hi)
        nums = [rng.randint(1, max_value) for _ in range(count)]
        key = tuple(sorted(nums))
        cands = [t for t in _targets(key, max_target, split) if (tuple(nums), t) not in seen]
        if not cands:
            continue
        t = rng.choice(cands)
        seen.add((tuple(nums), t))
        out.append(
            {
                "question": countdown_question(nums, t),
                "ground_truth": {"numbers": nums, "target": t},
                "solution": _reachable(key)[Fraction(t)][0],
            }
        )
    if len(out) < n:
        raise ValueError(
            f"only {len(out)} distinct countdown problems found for n={n}; "
            f"raise --max-value/--max-target or widen --numbers"
        )
    return out


# ----------------------------------------------------------------------------- CLI
def main():
    p = argparse.ArgumentParser(
        description="Write task data as JSONL (synthetic Countdown or a loaded task)."
    )
    p.add_argument("task", choices=sorted(TASKS), help="task to generate/load")
    # --- countdown generator ---
    p.add_argument(
        "--numbers", default="3", help="how many numbers per problem, 'lo..hi' (e.g. 3..4)"
    )
    p.add_argument("--max-value", type=int, default=10, help="numbers are drawn from 1..max-value")
    p.add_argument("--max-target", type=int, default=50, help="targets are in 1..max-target")
    p.add_argument("--n", type=int, default=1000, help="number of problems (countdown) / rows kept")
    # --- loading ---
    p.add_argument("--split", default=None, help="train|test (countdown default: no split filter)")
    p.add_argument("--path", default=None, help="local JSON/JSONL file (keyword: word list)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out", required=True, help="output .jsonl path (written atomically)")
    args = p.parse_args()
    try:
        if args.task == "countdown" and args.path in (None, "synthetic"):
            rows = generate_countdown(
                args.n,
                _parse_range(args.numbers),
                args.max_value,
                args.seed,
                args.max_target,
                args.split,
            )
        else:
            rows = load_task(args.task, args.split or "test", args.path, args.n, args.seed)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None  # one line, exit code 1
    write_jsonl_atomic(args.out, rows)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
