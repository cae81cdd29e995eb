"""Task data and prompts: the one shared helper module (loaders, prompt files, the Countdown
generator).

Every task loader returns a list of dicts {"question": str, "ground_truth": ..., ...}; given a
prompt name, `load_task` also fills its template (prompts/<name>.prompt) once, into each row's
"prompt" (and its stop strings into "stop"). Rows are graded by
`grader.REWARD_FNS[TASKS[task]["reward"]]`.

The seeds' hub sets (HUB: openai/gsm8k, hiyouga/math12k, HuggingFaceH4/MATH-500,
justinphan3110/Countdown-Tasks-3to4) load through `datasets` (in requirements.txt) when no path is
given; every task also takes a local JSON/JSONL path, which is what the README's recipes, the tests
and offline runs use. `python data.py prepare NAME --out FILE` writes that file from the hub set,
or from a local copy of it (`--from`: a hub snapshot directory or one of its .parquet/.json/.jsonl
files, for machines without hub access). NAME "sft" converts the Prime Intellect SFT set, which has
no hub id in the seeds, from {"prompt", "response"} or chat "messages" rows (`load_sft_jsonl`, and
so sft.py, reads both); its test split (`--split test`, the same rows) becomes {"question",
"answer"} rows that `load_task("math", path=FILE)` reads: the question recovered from the prompt
by the prompts/*.prompt template it was formatted with, the answer read off the response. The
Countdown hub set has one split: its last COUNTDOWN_TEST_ROWS (1024) rows are held out as the test
split (seed 000's course ships its own 10k / 1024 / 1024 subset; the README's recipes use this test
split as its dev set). `load_task("countdown", path="synthetic")`
uses the synthetic generator below, which needs nothing.

Every row read from a file or hub set is checked at load, and nothing is coerced: a wrong type (a
string for a list of numbers, a float or a boolean for an integer, Infinity, a row that is not an
object) or a field over MAX_FIELD_CHARS is a one-line ValueError naming the file, the line and the
field. Countdown rows whose target no expression of their numbers reaches are counted in one
notice (they load: the caller decides).

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
  python data.py prepare gsm8k --split test --out gsm8k_test.jsonl
  python data.py prepare countdown --split train --from Countdown-Tasks-3to4/ --out cd34_train.jsonl
  python data.py prepare sft --from prime_intellect_sft.jsonl --out sft.jsonl
  python data.py prepare sft --split test --from prime_intellect_test.jsonl --out pi_test.jsonl
  python data.py countdown --numbers 3..4 --max-value 10 --seed 0 --n 1000 --out /tmp/cd_train.jsonl
  python data.py countdown --split test --n 200 --out /tmp/cd_test.jsonl
  python data.py gsm8k --path ../shared/data/gsm8k_test.jsonl --n 5 --out /tmp/gsm8k5.jsonl
"""

import contextlib
import hashlib
import json
import math
import os
import random
import re
import sys
from fractions import Fraction
from functools import lru_cache
from itertools import combinations

# ground truths are parsed and checked by the grader's own rules
from common import Parser
from grader import gsm8k_answer, gsm8k_gold, last_boxed, math_answer, r1_zero_answer
from storage import storage_line, unwritable

ROOT = os.path.dirname(os.path.abspath(__file__))
PROMPTS_DIR = os.path.join(ROOT, "prompts")
TEMPLATE_BREAK = "--- or ---"  # a line between alternative templates in one .prompt file
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
# the seeds' hub sets: task -> dataset id, config, and the splits `prepare` writes
HUB = {
    "gsm8k": {"id": "openai/gsm8k", "config": "main", "splits": ("train", "test")},  # seed 001
    # seed 000; "val" is a held-out part of the train split (VAL_BUCKETS), which "train" excludes
    "math": {"id": "hiyouga/math12k", "config": None, "splits": ("train", "val", "test")},
    "math500": {"id": "HuggingFaceH4/MATH-500", "config": None, "splits": ("test",)},  # seed 000
    # seed 002; one split on the hub, whose last COUNTDOWN_TEST_ROWS rows are held out as "test"
    "countdown": {
        "id": "justinphan3110/Countdown-Tasks-3to4",
        "config": None,
        "splits": ("train", "test"),
    },
}
COUNTDOWN_TEST_ROWS = 1024  # held out of the Countdown hub set (seed 000's dev and test size)
TEST_BUCKETS = 10  # of 100 hash buckets go to the test split (countdown, keyword)
# of 100 hash buckets of math12k's train problems form its "val" split (~600 of 12,000): a
# validation set apart from MATH-500, the final test (math12k's test split is those 500 problems)
VAL_BUCKETS = 5
# a longer question, answer, prompt, response or keyword is refused at load, naming its file and
# line (a 10 MB question used to load, then fail late); ~25k tokens, beyond any context used here
MAX_FIELD_CHARS = 100_000
# Countdown rows of a file or hub set searched for a solution at load (evenly spread over the set),
# and the search steps each may take: every row of up to 4 numbers is decided (a few ms at worst), a
# larger one only when a solution turns up early. Rows with no solution are counted in one notice.
SOLVE_CHECK_ROWS = 200
SOLVE_CHECK_STEPS = 40


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
# A prompt for a tool-using policy opens with a header, one `# key: "value"` line per key (the value
# a JSON string, so its spaces and newlines are exact), before the template:
#   # trigger: "="          the text that ends a turn and calls the tool (tools.py)
#   # output: " {}"         how the tool's output is appended: {} is the output
#   # template: "r1_zero"   (optional, with no text below) another prompt file's template
HEADER_KEYS = ("trigger", "output", "template")


def read_prompt_file(name):
    """(template text, header dict) of prompts/<name>.prompt: the header (HEADER_KEYS, each once,
    at the top) is not part of the template; the dict holds its trigger and output ({} without
    one). One trailing newline, if an editor
    added it, is dropped."""
    path = os.path.join(PROMPTS_DIR, f"{name}.prompt")
    if not os.path.exists(path):
        have = sorted(f[:-7] for f in os.listdir(PROMPTS_DIR) if f.endswith(".prompt"))
        raise ValueError(f"no prompt file {path}; available prompts: {have}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.endswith("\n"):
        text = text[:-1]
    header = {}
    lines = text.split("\n")
    while lines:
        match = re.fullmatch(r"# (\w+): (.*)", lines[0])
        if not match or match[1] not in HEADER_KEYS:
            break
        key = match[1]
        try:
            value = json.loads(match[2])
        except ValueError:
            value = None
        if not isinstance(value, str) or key in header:
            raise ValueError(
                f"prompts/{name}.prompt: header line {lines[0]!r} needs one JSON string per key"
                f' (e.g. # {key}: "=")'
            )
        header[key] = value
        lines = lines[1:]
    template = "\n".join(lines)
    if "template" in header:
        if template.strip():
            raise ValueError(f"prompts/{name}.prompt: a `# template:` header has no text below")
        template = load_prompt(header.pop("template"))
    if header and set(header) != {"trigger", "output"}:
        raise ValueError(f"prompts/{name}.prompt: a tool header needs a trigger and an output")
    if header.get("output", "{}").count("{}") != 1:
        raise ValueError(f"prompts/{name}.prompt: the output header needs one {{}}")
    if header.get("trigger") == "":
        raise ValueError(f"prompts/{name}.prompt: the trigger is empty")
    return template, header


def load_prompt(name):
    """Template text of prompts/<name>.prompt, without its header (read_prompt_file)."""
    return read_prompt_file(name)[0]


def prompt_header(name):
    """The header of prompts/<name>.prompt: {"trigger", "output"} for a tool prompt, else {}."""
    return read_prompt_file(name)[1]


def load_templates(name):
    """The templates of prompts/<name>.prompt: most files hold one; keyword.prompt holds several,
    each on its own, separated by lines that read TEMPLATE_BREAK. Each needs a {question}, and
    all must share their stop strings (a script reads them off any row)."""
    templates = load_prompt(name).split("\n" + TEMPLATE_BREAK + "\n")
    for t in templates:
        if "{question}" not in t:
            raise ValueError(f"prompts/{name}.prompt: a template has no {{question}}: {t[:60]!r}")
        if stop_strings(t) != stop_strings(templates[0]):
            raise ValueError(
                f"prompts/{name}.prompt: its templates must all ask for <answer> tags, or none"
            )
    return templates


def pick_template(templates, question, seed):
    """The template a question gets: drawn by (seed, question), so a row keeps its template
    whatever the file order, --limit or split."""
    if len(templates) == 1:
        return templates[0]
    return random.Random(f"template-{seed}-{question}").choice(templates)


def format_prompt(template, question):
    """Fill {question}. Plain replace, not str.format: templates contain LaTeX braces."""
    if "{question}" not in template:
        raise ValueError("prompt template has no {question} placeholder")
    return template.replace("{question}", question)


def stop_strings(template):
    """Where generation stops for a prompt: after the answer tag, when the template asks for one."""
    return ["</answer>"] if "<answer>" in template else []


CHAT_TEMPLATES = ["off", "on", "no_thinking"]  # --chat-template (eval_zero_shot.py, grpo.py)


def apply_chat_template(rows, model, mode):
    """--chat-template: each row's formatted "prompt" becomes one user turn of the model's chat
    template, the assistant's turn opened after it. "off" keeps the seeds' raw prompt text; "on"
    applies the template as it is (Qwen3: thinking on); "no_thinking" passes enable_thinking=False
    (Qwen3's non-thinking mode), refused for a template without that switch. -> new rows (the stop
    strings stay the prompt's). A model without a chat template is a ValueError."""
    if mode == "off":
        return rows
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except OSError as e:  # no such directory, no hub access
        cause = str(e).strip().split("\n")[0]
        message = f"cannot load the tokenizer of {model} for its chat template ({cause})"
        raise ValueError(message) from None
    template = tokenizer.chat_template
    if not template:
        raise ValueError(f"{model} has no chat template: drop --chat-template {mode}")
    switch = {}  # the template's own default unless asked
    if mode == "no_thinking":
        if "enable_thinking" not in template:
            raise ValueError(
                f"the chat template of {model} has no thinking switch: use --chat-template on"
            )
        switch["enable_thinking"] = False
    out = []
    for row in rows:
        turn = [{"role": "user", "content": row["prompt"]}]
        text = tokenizer.apply_chat_template(
            turn, tokenize=False, add_generation_prompt=True, **switch
        )
        out.append({**row, "prompt": text})
    return out


# ----------------------------------------------------------------------------- jsonl io
def read_jsonl(path):
    """Rows of a .jsonl file (a .json file holding a list also works)."""
    return [row for _where, row in read_located(path)]


def read_located(path):
    """[(where, row)] of a .jsonl file, where = "path line N" (a .json list: "path item N"), for
    errors that name the line. Bad UTF-8 and bad JSON are one-line ValueErrors naming it too."""
    if not os.path.exists(path):
        raise ValueError(f"file not found: {path}")
    if path.endswith(".json"):
        with open(path, "rb") as f:
            text = _utf8(f.read(), path)
        try:
            rows = json.loads(text)
        except ValueError as e:  # JSONDecodeError, or an integer of over 4300 digits
            raise ValueError(f"{path}: invalid JSON ({e})") from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of objects")
        return [(f"{path} item {i}", row) for i, row in enumerate(rows, 1)]
    out = []
    for n, line in text_lines(path):
        if not line.strip():
            continue
        try:
            out.append((f"{path} line {n}", json.loads(line)))
        except ValueError as e:  # JSONDecodeError, or an integer of over 4300 digits
            reason = getattr(e, "msg", str(e))
            raise ValueError(f"{path} line {n}: invalid JSON ({reason})") from None
    return out


def text_lines(path):
    """[(line number, text)] of a UTF-8 text file; a byte that is not UTF-8 is a one-line
    ValueError naming its line."""
    out = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            out.append((n, _utf8(raw, f"{path} line {n}")))
    return out


def _utf8(raw, where):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{where}: byte {raw[e.start]:#04x} at offset {e.start} is not UTF-8; "
            f"save the file as UTF-8"
        ) from None


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


# ----------------------------------------------------------------------------- row checks
# Every field a loader reads is checked for its type and size, each failure one line naming the
# file, the line and the field: nothing is coerced ("345" is not [3, 4, 5], 2.5 is not 2, true is
# not 1).
def _shown(value):
    """A value as JSON spells it (Infinity, true, "345"), cut to ~60 characters, for messages."""
    if isinstance(value, str) and len(value) > 60:
        value = value[:57] + "..."
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > 60:
        text = text[:57] + "..."
    return text


def _object(row, where):
    """The row, when it is a JSON object; else a ValueError."""
    if not isinstance(row, dict):
        raise ValueError(
            f"{where}: a row must be a JSON object {{...}}, got {_shown(row)}; "
            f"write one object per line"
        )
    return row


def _field(row, names, where):
    """(name, value) of the first of `names` the row holds (not None), else a ValueError naming
    them."""
    for n in names:
        if n in row and row[n] is not None:
            return n, row[n]
    raise ValueError(f"{where}: the row has no field {' or '.join(repr(n) for n in names)}")


def _sized(name, text, where):
    """text, when it has at most MAX_FIELD_CHARS characters; else a ValueError."""
    if len(text) > MAX_FIELD_CHARS:
        raise ValueError(
            f'{where}: "{name}" is {len(text):,} characters, over the {MAX_FIELD_CHARS:,} of '
            f"data.MAX_FIELD_CHARS; shorten it or drop the row"
        )
    return text


def _string(row, names, where):
    """The first of `names` the row holds, which must be a string of at most MAX_FIELD_CHARS."""
    name, value = _field(row, names, where)
    if not isinstance(value, str):
        raise ValueError(
            f'{where}: "{name}" must be a string, got {_shown(value)}; quote it in the file'
        )
    return _sized(name, value, where)


def _is_int(x):
    return type(x) is int  # not bool (True is an int to Python), not float


def _is_finite_number(x):
    return _is_int(x) or (type(x) is float and math.isfinite(x))


def load_sft_jsonl(path):
    """SFT pairs [{"prompt", "response"}] from a JSONL file of such rows or of chat "messages"
    rows (the Prime Intellect format; see _sft_pair)."""
    return [_sft_pair(r, where) for where, r in read_located(path)]


def _sft_pair(r, where):
    """{"prompt", "response"} of one SFT row: its two fields, or its "messages", one user turn then
    the assistant's. The user's text is the prompt as it stands (it is already formatted: the
    seeds' intellect prompt comes from this data set)."""
    r = _object(r, where)
    if "response" in r or "messages" not in r:  # a pair (a row with neither: "prompt" is named)
        return {
            "prompt": _string(r, ["prompt"], where),
            "response": _string(r, ["response"], where),
        }
    turns = r["messages"]
    roles = turns
    if isinstance(turns, list) and all(isinstance(t, dict) for t in turns):
        roles = [t.get("role") for t in turns]
    if roles != ["user", "assistant"]:
        raise ValueError(
            f'{where}: "messages" must be a user turn then an assistant turn, got roles '
            f"{_shown(roles)}; merge or drop the other turns"
        )
    prompt = _string(turns[0], ["content"], f'{where}: "messages" user turn')
    response = _string(turns[1], ["content"], f'{where}: "messages" assistant turn')
    return {"prompt": prompt, "response": response}


# ----------------------------------------------------------------------------- pass rates
# An offline difficulty filter (Kimi k1.5, Qwen3): eval_zero_shot.py --pass-rate-samples k writes
# pass_rates.jsonl, one row per prompt {"prompt", "ground_truth", "samples", "pass_rate"}; the
# trainers' --pass-rates FILE --keep-pass-rate LO HI keep the prompts whose rate is in [LO, HI].
def read_pass_rates(path):
    """{formatted prompt: pass rate} of a pass_rates.jsonl file; a row without a string "prompt"
    and a "pass_rate" in [0, 1] is a one-line ValueError naming its line."""
    rates = {}
    for where, r in read_located(path):
        r = _object(r, where)
        prompt = _string(r, ["prompt"], where)
        rate = r.get("pass_rate")
        if not (_is_finite_number(rate) and 0 <= rate <= 1):
            raise ValueError(
                f'{where}: "pass_rate" is {_shown(rate)}, not a number in [0, 1]; write the file '
                f"with eval_zero_shot.py --pass-rate-samples"
            )
        rates[prompt] = rate
    return rates


def keep_by_pass_rate(rows, path, low, high):
    """The rows whose prompt's pass rate in `path` (read_pass_rates) lies in [low, high], in
    their order. The file must hold every row's prompt, formatted as the rows' (same --prompt and
    --chat-template): else a one-line ValueError saying how many it lacks and how to remake it."""
    rates = read_pass_rates(path)
    missing = [r for r in rows if r["prompt"] not in rates]
    if missing:
        raise ValueError(
            f"{path} has no pass rate for {len(missing)} of the {len(rows)} training prompts "
            f"(e.g. {_shown(missing[0]['prompt'][-60:])}): write it on this training data with "
            "eval_zero_shot.py --pass-rate-samples K --data <the --train-path> --split train, "
            "a --limit that covers the trainer's --train-n, and the same --prompt and "
            "--chat-template"
        )
    return [r for r in rows if low <= rates[r["prompt"]] <= high]


# ----------------------------------------------------------------------------- sources
# Where a task's rows come from: its hub set, or a local copy of it (prepare's --from).
def _datasets(task):
    """The `datasets` package; a one-line ValueError naming what to pass instead when missing."""
    try:
        import datasets  # in requirements.txt, but a minimal install may lack it
    except ImportError:
        extra = ""
        if task == "countdown":
            extra = " or 'synthetic' (data.py's generator)"
        raise ValueError(
            f"task {task!r}: no local file given and the `datasets` package is not installed "
            f"for the hub set {HUB[task]['id']}; pass a local .jsonl{extra}"
        ) from None
    return datasets


def _hub_rows(task, split):
    """The rows (dicts) of one split of a HUB set, through `datasets`. An unreachable hub is one
    line naming prepare's --from (after the hub client's own retries, ~25 s)."""
    datasets = _datasets(task)
    hub = HUB[task]
    try:
        ds = datasets.load_dataset(hub["id"], hub["config"], split=split)
    except OSError as e:  # ConnectionError (no network, offline mode), a missing set, a full disk
        cause = str(e).strip().split("\n")[0]
        raise ValueError(
            f"`datasets` cannot load the hub set {hub['id']} ({cause}); without hub access, "
            f"download it elsewhere and convert the copy here: python data.py prepare {task} "
            f"--from LOCAL_COPY --out FILE"
        ) from None
    return ds.to_list()  # 490k Countdown rows: 4 s; iterating the Dataset row by row took 66 s


def _copy_rows(path, task, split):
    """[(where, row)] of one split of a local copy of a hub set: a .json/.jsonl file (read here,
    errors naming the line) or a .parquet file holds one split; a hub snapshot directory
    (`huggingface-cli download --repo-type dataset ID --local-dir DIR`) holds them all, under
    the set's config directory when it has one (gsm8k: main/)."""
    if not os.path.exists(path):
        raise ValueError(f"--from {path}: no such file or directory")
    if path.endswith((".json", ".jsonl")):
        return read_located(path)
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"--from {path}: a .parquet file or a snapshot directory is read by the `datasets` "
            f"package (pip install -r requirements.txt); or pass a .jsonl copy"
        ) from None
    config = HUB.get(task, {}).get("config")
    try:
        if os.path.isdir(path):
            if config and os.path.isdir(os.path.join(path, config)):
                path = os.path.join(path, config)
            ds = datasets.load_dataset(path, split=split)
        elif path.endswith(".parquet"):
            ds = datasets.load_dataset("parquet", data_files=path, split="train")
        else:
            raise ValueError("expected a .jsonl, .json or .parquet file or a snapshot directory")
    except (OSError, ValueError) as e:  # a missing split, an unreadable file
        cause = str(e).strip().split("\n")[0]
        raise ValueError(f"--from {path}: {cause}") from None
    return [(f"{path} row {i}", r) for i, r in enumerate(ds.to_list())]


def _source_rows(task, split, source):
    """[(where, row)] of one split of a task's hub set (source None) or of a local copy of it
    (source a path). The Countdown set has one split on the hub: its last COUNTDOWN_TEST_ROWS
    rows are "test", the rest "train"."""
    if split not in HUB[task]["splits"]:
        raise ValueError(
            f"{HUB[task]['id']} has no {split!r} split; choose from {list(HUB[task]['splits'])}"
        )
    stored = split
    if task == "countdown" or split == "val":
        stored = "train"
    if source is None:
        rows = _hub_rows(task, stored)
        located = [(f"{HUB[task]['id']} row {i}", r) for i, r in enumerate(rows)]
    else:
        located = _copy_rows(source, task, stored)
    if task == "math" and split in ("train", "val"):
        return [(where, r) for where, r in located if _in_val(r) == (split == "val")]
    if task != "countdown":
        return located
    if split == "test":
        return located[-COUNTDOWN_TEST_ROWS:]
    return located[:-COUNTDOWN_TEST_ROWS]


# ----------------------------------------------------------------------------- loaders
def _bucket(key):
    """A stable hash bucket in 0..99 (sha1: the same on every machine and Python run)."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % 100


def _in_val(row):
    """Whether a math12k train row is in the "val" split: VAL_BUCKETS of 100 buckets by a stable
    hash of its problem text (a row without one is left to the loader's checks, in train)."""
    question = None
    if isinstance(row, dict):
        question = row.get("problem", row.get("question"))
    if not isinstance(question, str):
        return False
    return _bucket("math-val:" + question.strip()) < VAL_BUCKETS


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
    the synthetic countdown, the keyword split and the choice among a prompt's templates); `limit`
    keeps the first rows. For "jsonl", question_key/answer_key name the fields (defaults:
    "question"/"problem" and "ground_truth"/"answer").
    prompt: a prompts/<name>.prompt name; each row then also carries "prompt", the filled template
    (one of several for keyword.prompt: pick_template), and "stop", its stop strings (shaped once,
    here, not threaded through every caller).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    rows = _load_rows(task, split, path, limit, seed, question_key, answer_key)
    if prompt is None:
        return rows
    templates = load_templates(prompt)
    prompted = []
    for r in rows:
        template = pick_template(templates, r["question"], seed)
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
            count = COUNTDOWN_TEST_ROWS
        return generate_countdown(count, seed=seed, split=split)
    if task == "keyword":
        return _keyword_rows(path, split, n, seed)
    if path is None and task == "jsonl":
        raise ValueError("task 'jsonl' needs path=<local .jsonl>")
    if path is None:
        located = _source_rows(task, split, None)
        path = HUB[task]["id"]  # notices name the hub set
    else:
        located = read_located(path)
    if n is not None:
        located = located[:n]
    return _task_rows(task, located, path, question_key, answer_key)


def _task_rows(task, located, source, question_key=None, answer_key=None):
    """Rows {"question", "ground_truth", ...} of [(where, row)], each field checked (a bad one is
    a ValueError naming `where`); Countdown rows no expression solves are counted in one notice
    naming `source`."""
    if task == "countdown":
        out = [_countdown_row(_object(r, where), where) for where, r in located]
        _notice_unsolvable(out, source)
        return out
    question_fields = _QUESTION_FIELDS
    if question_key:
        question_fields = [question_key]
    answer_fields = _ANSWER_FIELDS.get(task)
    if answer_key:
        answer_fields = [answer_key]
    out = []
    for where, r in located:
        r = _object(r, where)
        q = _string(r, question_fields, where)
        if task == "gsm8k":
            sol = _string(r, answer_fields, where)
            out.append({"question": q, "ground_truth": _gsm8k_truth(sol, where), "solution": sol})
        elif task in ("math", "math500"):
            a = _string(r, answer_fields, where)
            solution = a
            if r.get("solution") is not None:
                solution = _string(r, ["solution"], where)
            out.append({"question": q, "ground_truth": math_answer(a), "solution": solution})
        else:  # jsonl: ground truth taken as is, once its type is one the graders read
            name, gt = _field(r, answer_fields, where)
            _check_truth(name, gt, where)
            out.append({**r, "question": q, "ground_truth": gt})
    return out


def _gsm8k_truth(solution, where):
    """The number after a GSM8K solution's '####', checked by the grader's own rule."""
    try:
        truth = gsm8k_answer(solution)
        gsm8k_gold(truth)
    except ValueError:
        raise ValueError(
            f'{where}: "answer" must end in "#### <number>", got {_shown(solution[-40:])}'
        ) from None
    return truth


def _check_truth(name, gt, where):
    """A jsonl ground truth: a string, a finite number or a non-empty list of those."""
    items = gt
    if not isinstance(gt, list):
        items = [gt]
    ok = len(items) > 0 and all(isinstance(g, str) or _is_finite_number(g) for g in items)
    if not ok:
        raise ValueError(
            f'{where}: "{name}" must be a string, a number or a list of those, got {_shown(gt)}'
        )
    for g in items:
        if isinstance(g, str):
            _sized(name, g, where)


def _countdown_row(r, where):
    """{"question", "ground_truth": {"numbers", "target"}} of a Countdown row, its fields checked:
    numbers a non-empty list of integers >= 0 (the grader reads no minus sign), target an
    integer."""
    if isinstance(r.get("ground_truth"), dict):
        # rows written by `python data.py countdown` nest numbers and target in ground_truth
        r = {**r, **r["ground_truth"]}
    name, nums = _field(r, ["numbers", "nums"], where)
    ok = isinstance(nums, list) and len(nums) > 0
    if ok:
        ok = all(_is_int(x) and x >= 0 for x in nums)
    if not ok:
        raise ValueError(
            f'{where}: "{name}" must be a non-empty list of integers >= 0, got {_shown(nums)}'
        )
    _, target = _field(r, ["target"], where)
    if not _is_int(target):
        raise ValueError(f'{where}: "target" must be an integer, got {_shown(target)}')
    question = _sized(name, countdown_question(nums, target), where)
    return {"question": question, "ground_truth": {"numbers": nums, "target": target}}


def _notice_unsolvable(rows, source):
    """Print one notice counting the Countdown rows no expression of their numbers solves (up to
    SOLVE_CHECK_ROWS rows, evenly spread); no answer to them can be right. Nothing when all are
    solvable."""
    every = max(1, -(-len(rows) // SOLVE_CHECK_ROWS))  # ceil: the stride that checks <= the cap
    checked = rows[::every]
    verdicts = [countdown_solvable(**r["ground_truth"]) for r in checked]
    impossible = verdicts.count(False)
    if not impossible:
        return
    scope = f"{len(checked)} Countdown rows"
    if len(checked) < len(rows):
        scope = f"{len(checked)} Countdown rows checked (of {len(rows)})"
    if impossible == len(checked):
        print(
            f"notice: {source}: none of its {scope} has a solution with its numbers: no answer "
            f"can be right, so every reward is the same and nothing is learned from them",
            flush=True,
        )
        return
    print(
        f"notice: {source}: {impossible} of {scope} have no solution with their numbers (no "
        f"answer to them can be right)",
        flush=True,
    )


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
    words = set()
    for n, line in text_lines(path):
        if line.strip():
            words.add(_sized("keyword", line.strip(), f"{path} line {n}"))
    words = sorted(words)
    words = [w for w in words if _in_split("kw:" + w.lower(), split)]
    random.Random(seed).shuffle(words)
    return [{"question": w, "ground_truth": [w]} for w in words[:n]]


# ----------------------------------------------------------------------------- prepare
PREPARE_NAMES = (*HUB, "sft")  # what `python data.py prepare NAME` writes
SFT_SPLITS = ("train", "test")  # prepare sft: training pairs, or test rows to evaluate on


def default_split(name):
    """prepare's split when none is given: sft's training pairs, every other set's test split."""
    if name == "sft":
        return "train"
    return "test"


def prepare(name, split=None, source=None, limit=None, exclude=None):
    """Rows of one of the seeds' data sets in the local format the recipes read: {"question",
    "answer"} for gsm8k, math and math500 (plus "solution" when the source has one),
    {"numbers", "target"} for countdown, {"prompt", "response"} for sft's train split and
    {"question", "answer", "solution"} for its test split (sft_test_rows). split None: the
    name's default_split.

    source: None = the hub set (HUB); a path = a local copy of it (see _copy_rows); sft has no hub
    id in the seeds, so it needs one. limit keeps the first rows of the split. exclude: a JSONL
    file of held-out problems (prepare math --split val's): rows whose question or prompt holds
    one of them are dropped, and counted in a notice, so training never sees a validation
    problem. Every row passes the loaders' own checks here, so a written file loads as the hub
    set does: load_task(name, split, path=FILE) == load_task(name, split).
    """
    from tqdm import tqdm

    if limit is not None and limit < 1:
        raise ValueError(f"--n {limit}: keep at least 1 row (or leave --n out for all)")
    if name == "sft" and source is None:
        raise ValueError(
            "prepare sft needs --from LOCAL_FILE: the Prime Intellect SFT set comes with the "
            "course's data, not from a hub id"
        )
    if split is None:
        split = default_split(name)
    if name == "sft" and split not in SFT_SPLITS:
        raise ValueError(f"prepare sft has no {split!r} split; choose from {list(SFT_SPLITS)}")
    if name == "sft":
        located = _copy_rows(source, name, "train")  # a local file holds one split
    else:
        located = _source_rows(name, split, source)
    if limit is not None:
        located = located[:limit]
    if not located:
        raise ValueError(f"prepare {name} --split {split}: the source has no rows for it")
    out = []
    for where, r in tqdm(located, f"prepare {name}", unit=" rows", file=sys.stdout, mininterval=1):
        out.append(_prepared_row(name, r, where))
    if name == "sft" and split == "test":
        out = sft_test_rows(out, source)
    if exclude is not None:
        out = _without(out, exclude)
    if name == "countdown":
        _notice_unsolvable([{"ground_truth": r} for r in out], source or HUB[name]["id"])
    return out


def _without(rows, exclude):
    """rows less those whose question (or SFT prompt) holds a problem of the `exclude` file."""
    held_out = []
    for where, r in read_located(exclude):
        held_out.append(_string(_object(r, where), _QUESTION_FIELDS, where).strip())
    kept = []
    for r in rows:
        text = r.get("question", r.get("prompt", ""))
        if not any(q in text for q in held_out):
            kept.append(r)
    print(f"--exclude {exclude}: dropped {len(rows) - len(kept)} of {len(rows)} rows")
    return kept


def sft_test_rows(pairs, source):
    """{"question", "answer", "solution"} rows of SFT {"prompt", "response"} pairs, for evaluation
    (seed 000 §4.3 asks for the SFT model's accuracy on the Prime Intellect test set): the question
    is the prompt less the prompts/*.prompt template it was formatted with (one line naming the
    first prompt no template fits), the answer the response's final one (r1_zero's <answer>, else
    its last \\boxed{}), the response kept as "solution". A pair whose response states no answer
    cannot be graded: it is dropped and counted in a notice."""
    templates = _question_templates()
    out = []
    used = {}  # template name -> rows formatted with it
    no_answer = 0
    for i, pair in enumerate(pairs):
        found = _question_of(pair["prompt"], templates)
        if found is None:
            raise ValueError(
                f"{source} row {i}: the prompt is none of prompts/*.prompt's templates "
                f"({', '.join(templates)}) filled with a question, so its question cannot be "
                f"recovered: add its template as prompts/NAME.prompt, or write the test rows as "
                f'{{"question", "answer"}} and evaluate with --task math'
            )
        template, question = found
        answer = _final_answer(pair["response"])
        if not answer:
            no_answer += 1
            continue
        used[template] = used.get(template, 0) + 1
        out.append({"question": question, "answer": answer, "solution": pair["response"]})
    if no_answer:
        print(f"notice: {source}: {no_answer} of {len(pairs)} responses state no answer: dropped")
    for template, n in used.items():
        print(
            f"{source}: {n} questions recovered from the {template} template (evaluate with "
            f"--prompt {template} for the format the model was trained on)"
        )
    if not out:
        raise ValueError(f"{source}: no response states an answer; nothing to evaluate on")
    return out


def _question_templates():
    """{name: (text before {question}, text after)} of every one-template prompt file that takes
    a question, longest head first (a template whose head holds another's wins)."""
    out = {}
    for f in sorted(os.listdir(PROMPTS_DIR)):
        if not f.endswith(".prompt"):
            continue
        name = f[: -len(".prompt")]
        template, header = read_prompt_file(name)
        if header or template.count("{question}") != 1 or TEMPLATE_BREAK in template:
            continue  # tool prompts share their task prompt's template; kissing's take none
        head, tail = template.split("{question}")
        out[name] = (head, tail)
    return dict(sorted(out.items(), key=lambda item: -len(item[1][0])))


def _question_of(prompt, templates):
    """(template name, question) of a formatted prompt, or None when no template fits."""
    for name, (head, tail) in templates.items():
        text = prompt.strip()
        if not head.strip() and not tail.strip():
            continue  # question_only: every prompt would fit, an unknown template's text too
        if text.startswith(head.strip()) and text.endswith(tail.strip()):
            question = text[len(head.strip()) : len(text) - len(tail.strip())].strip()
            if question:
                return name, question
    return None


def _final_answer(response):
    """The final answer an SFT response states: r1_zero's <answer> tag, else its last \\boxed{}."""
    if "<answer>" in response:
        answer = r1_zero_answer(response)
    else:
        answer = last_boxed(response)
    if answer is None:
        return None
    return answer.strip()


def _prepared_row(name, r, where):
    """The row `prepare` writes for one source row, once the loader's checks pass."""
    if name == "sft":
        return _sft_pair(r, where)
    if name == "countdown":
        return _countdown_row(_object(r, where), where)["ground_truth"]  # {"numbers", "target"}
    loaded = _task_rows(name, [(where, r)], where)[0]
    out = {"question": loaded["question"], "answer": _string(r, _ANSWER_FIELDS[name], where)}
    if r.get("solution") is not None:
        out["solution"] = loaded["solution"]
    return out


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


def countdown_solvable(numbers, target):
    """Whether an expression using every number once equals target: True, False, or None when
    undecided (more than 6 numbers, numbers beyond 2**53, or over SOLVE_CHECK_STEPS search steps).

    A depth-first search that stops at the first hit, for checking rows at load; floats with a
    relative tolerance of 1e-9 stand in for exact fractions (8 / (3 - 8 / 3) is 23.999...), ~20x
    faster, and exact enough for numbers this small. solve_countdown finds the expression."""
    if len(numbers) > 6 or max(abs(x) for x in [*numbers, target]) > 2**53:
        return None
    if len(numbers) < 2:
        return list(numbers) == [target]
    tolerance = 1e-9 * max(1.0, abs(target))
    seen = set()  # sorted value tuples already searched
    steps = 0

    def search(values):
        nonlocal steps
        if len(values) == 2:
            return any(abs(v - target) <= tolerance for v in _pair_values(*values))
        key = tuple(sorted(values))
        if key in seen:
            return False
        seen.add(key)
        steps += 1
        if steps > SOLVE_CHECK_STEPS:
            raise _Undecided()
        for i, j in combinations(range(len(values)), 2):
            rest = [v for k, v in enumerate(values) if k != i and k != j]
            for v in _pair_values(values[i], values[j]):
                if search([*rest, v]):
                    return True
        return False

    try:
        return search([float(x) for x in numbers])
    except _Undecided:
        return None


class _Undecided(Exception):
    """countdown_solvable ran out of search steps."""


def _pair_values(a, b):
    """Every value one operation makes of a and b (float)."""
    out = [a + b, a * b, a - b, b - a]
    if b:
        out.append(a / b)
    if a:
        out.append(b / a)
    return out


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
def check_out(path):
    """--out can be written: refused in one line before any row is read or made."""
    if os.path.isdir(path):
        raise SystemExit(f"error: --out {path}: is a directory; pass a .jsonl file path")
    problem = unwritable(path)
    if problem:
        raise SystemExit(f"error: --out {path}: {problem}; choose another --out")


def write_out(path, rows):
    """The CLI's output, written atomically: a full, read-only or size-limited disk is one line
    (exit code 1) and leaves no file behind."""
    try:
        write_jsonl_atomic(path, rows)
    except OSError as e:
        line = storage_line(e, path, "writing")
        if line is None:
            raise
        raise SystemExit(f"error: {line}") from None
    print(f"wrote {len(rows)} rows to {path}")


def prepare_main(argv):
    """`python data.py prepare NAME --out FILE`: one of the seeds' data sets as local JSONL."""
    p = Parser(
        prog="data.py prepare",
        description="Write one of the seeds' data sets as the local JSONL the README's recipes "
        "read, from the hub or from a local copy of it.",
    )
    p.add_argument(
        "name",
        choices=PREPARE_NAMES,
        help="gsm8k, math (hiyouga/math12k), math500, countdown (Countdown-Tasks-3to4) or sft "
        "(the Prime Intellect SFT set, from a local file)",
    )
    p.add_argument(
        "--split",
        default=None,
        choices=("train", "val", "test"),
        help="default test (sft: train). math500 has test only; countdown's test split is the "
        "hub set's last 1024 rows; math's val is a held-out part of its train split "
        "(VAL_BUCKETS), which its train split excludes; sft's test split is written as "
        "{question, answer} rows to evaluate on (--task math); a single-file --from is one "
        "split already",
    )
    p.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="LOCAL_COPY",
        help="a local copy instead of the hub (offline machines; required for sft): a hub "
        "snapshot directory, or one .parquet/.json/.jsonl file of it",
    )
    p.add_argument("--n", type=int, default=None, help="keep the first N rows of the split")
    p.add_argument(
        "--exclude",
        default=None,
        metavar="HELD_OUT.jsonl",
        help="drop rows holding a problem of this file (e.g. prepare math --split val's), so "
        "training data never holds a validation problem",
    )
    p.add_argument("--out", required=True, help="output .jsonl path (written atomically)")
    args = p.parse_args(argv)
    check_out(args.out)
    try:
        rows = prepare(args.name, args.split, args.source, args.n, args.exclude)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None  # one line, exit code 1
    write_out(args.out, rows)


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["prepare"]:
        prepare_main(argv[1:])
        return
    p = Parser(
        description="Write task data as JSONL (synthetic Countdown or a loaded task); "
        "`python data.py prepare --help` writes the seeds' data sets."
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
    args = p.parse_args(argv)
    check_out(args.out)
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
    write_out(args.out, rows)


if __name__ == "__main__":
    main()
