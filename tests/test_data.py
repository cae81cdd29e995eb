"""data.py: prompts, loaders on files written here, the synthetic Countdown generator and its
CLI."""

import json
import os
import random
import shlex
import subprocess
import sys
import time

import pytest

import data
from conftest import doc_section, one_line_error
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
    for name in ["r1_zero", "question_only", "intellect", "countdown"]:
        assert data.load_templates(name) == [data.load_prompt(name)]
        assert data.load_prompt(name).count("{question}") == 1


def test_keyword_prompts_come_from_several_seeded_story_templates(tmp_path):
    """Seed 004 §3.1: keywords go into templates "such as 'Generate a story that includes
    KEYWORD'"; the seed's own wordings are among them, and each row's template is a function of
    (seed, keyword) alone."""
    filled = [data.format_prompt(t, "apple") for t in data.load_templates("keyword")]
    assert filled == [
        "Write a story that includes the word: apple",  # the seed's example prompt
        "Generate a story that includes apple",  # the seed's template
        "Write a sentence that includes the word: apple",  # its reward example, one word
        'Write a short story that uses the word "apple".',
    ]
    kw = tmp_path / "kw.txt"
    kw.write_text("\n".join(f"word{i}" for i in range(300)))
    rows = data.load_task("keyword", "train", str(kw), seed=0, prompt="keyword")
    assert {r["prompt"].replace(r["question"], "KW") for r in rows} == {
        data.format_prompt(t, "KW") for t in data.load_templates("keyword")
    }
    for r in rows:
        assert r["prompt"] in [
            data.format_prompt(t, r["question"]) for t in data.load_templates("keyword")
        ]
        assert r["stop"] == []
    # deterministic, and a row keeps its template under another --limit or file order
    assert data.load_task("keyword", "train", str(kw), seed=0, prompt="keyword") == rows
    kw.write_text("\n".join(f"word{i}" for i in reversed(range(300))))
    first = data.load_task("keyword", "train", str(kw), limit=5, seed=0, prompt="keyword")
    by_word = {r["question"]: r["prompt"] for r in rows}
    assert [r["prompt"] for r in first] == [by_word[r["question"]] for r in first]
    # another seed draws other templates
    reseeded = data.load_task("keyword", "train", str(kw), seed=1, prompt="keyword")
    changed = [r for r in reseeded if r["prompt"] != by_word.get(r["question"], r["prompt"])]
    assert len(changed) > len(rows) // 2


def test_a_template_without_question_or_with_other_stops_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "PROMPTS_DIR", str(tmp_path))
    (tmp_path / "two.prompt").write_text("Say {question}\n--- or ---\nSay nothing\n")
    with pytest.raises(ValueError, match="two.prompt: a template has no {question}"):
        data.load_templates("two")
    (tmp_path / "tags.prompt").write_text("{question} <answer>\n--- or ---\n{question}")
    with pytest.raises(ValueError, match="tags.prompt: .* <answer> tags, or none"):
        data.load_templates("tags")


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
    with pytest.raises(ValueError, match="b.jsonl line 1: the row has no field 'answer'"):
        data.load_task("gsm8k", path=bad)
    with pytest.raises(ValueError, match="no field 'prompt'"):
        data.load_sft_jsonl(_write(tmp_path / "s.jsonl", [{"response": "r"}]))
    with pytest.raises(ValueError, match="unknown task"):
        data.load_task("mnist")
    with pytest.raises(ValueError, match="needs path"):
        data.load_task("keyword")
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n{broken\n')
    with pytest.raises(ValueError, match="x.jsonl line 2: invalid JSON"):
        data.read_jsonl(str(tmp_path / "x.jsonl"))
    try:
        import datasets  # noqa: F401
    except ImportError:  # the hub set without `datasets`: one line naming what to pass instead
        with pytest.raises(ValueError, match="no local file given .* pass a local .jsonl"):
            data.load_task("gsm8k")
        with pytest.raises(ValueError, match="or 'synthetic'"):
            data.load_task("countdown")


# each bad row follows a good one, so the message must name line 2; (task, line, message)
COERCED = [
    (
        "countdown",
        '{"numbers": "345", "target": 12}',
        r'"numbers" must be a .*list of integers.*, got "345"',
    ),
    (
        "countdown",
        '{"numbers": [3.5, 4, 5], "target": 12}',
        r'"numbers" must .*, got \[3\.5, 4, 5\]',
    ),
    (
        "countdown",
        '{"numbers": [true, 4, 5], "target": 9}',
        r'"numbers" must .*, got \[true, 4, 5\]',
    ),
    (
        "countdown",
        '{"numbers": [], "target": 3}',
        r'"numbers" must be a non-empty list.*, got \[\]',
    ),
    ("countdown", '{"numbers": 5, "target": 5}', r'"numbers" must .*, got 5$'),
    ("countdown", '{"nums": [-3, 4], "target": 1}', r'"nums" must .* integers >= 0, got \[-3, 4\]'),
    (
        "countdown",
        '{"numbers": [1, 2], "target": Infinity}',
        r'"target" must be an integer, got Infinity',
    ),
    ("countdown", '{"numbers": [1, 2], "target": 2.5}', r'"target" must be an integer, got 2\.5'),
    ("countdown", '{"numbers": [1, 2], "target": true}', r'"target" must be an integer, got true'),
    ("countdown", '{"numbers": [1, 2], "target": "3"}', r'"target" must be an integer, got "3"'),
    ("countdown", "[1, 2, 3]", r"a row must be a JSON object .*, got \[1, 2, 3\]"),
    ("gsm8k", '{"question": 5, "answer": "#### 5"}', r'"question" must be a string, got 5'),
    ("gsm8k", '{"question": "q", "answer": 42}', r'"answer" must be a string, got 42'),
    ("gsm8k", '{"question": "q", "answer": "#### many"}', r'"answer" must end in "#### <number>"'),
    ("gsm8k", '{"question": "q", "answer": "no marker"}', r'"answer" must end in "#### <number>"'),
    ("gsm8k", '"q"', r'a row must be a JSON object .*, got "q"'),
    ("math500", '{"problem": "p", "answer": 5}', r'"answer" must be a string, got 5'),
    ("math500", '{"problem": ["p"], "answer": "5"}', r'"problem" must be a string, got \["p"\]'),
    (
        "jsonl",
        '{"question": "q", "ground_truth": Infinity}',
        r'"ground_truth" must be a string, a number or a list',
    ),
    (
        "jsonl",
        '{"question": "q", "answer": {"a": 1}}',
        r'"answer" must be a string, a number.*got \{"a": 1\}',
    ),
    ("jsonl", '{"question": "q", "answer": []}', r'"answer" must be .*got \[\]'),
    ("jsonl", '{"question": "q", "answer": true}', r'"answer" must be .*got true'),
    ("sft", '{"prompt": 5, "response": "r"}', r'"prompt" must be a string, got 5'),
    ("sft", '{"prompt": "p", "response": NaN}', r'"response" must be a string, got NaN'),
    ("sft", '["p", "r"]', r"a row must be a JSON object"),
    (
        "sft",
        '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, '
        '{"role": "assistant", "content": "a"}]}',
        r'"messages" must be a user turn then an assistant turn, got roles \["system", "user", ',
    ),
    ("sft", '{"messages": "q"}', r'"messages" must be a user turn .*, got roles "q"'),
    (
        "sft",
        '{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "a"}]}',
        r'"messages" user turn: "content" must be a string, got 5',
    ),
]
GOOD = {
    "countdown": {"numbers": [1, 2, 3], "target": 6},
    "gsm8k": {"question": "q", "answer": "#### 5"},
    "math500": {"problem": "p", "answer": "5"},
    "jsonl": {"question": "q", "answer": "5"},
    "sft": {"prompt": "p", "response": "r"},
}


def _load(task, path):
    if task == "sft":
        return data.load_sft_jsonl(path)
    return data.load_task(task, path=path)


@pytest.mark.parametrize("task, line, message", COERCED)
def test_wrong_types_are_refused_not_coerced(tmp_path, task, line, message):
    """Issue 26: "345" became [3, 4, 5], 2.5 became 2, true became 1, Infinity and a list row
    reached the trainer. Now: one line naming the file, the line and the field."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD[task]) + "\n\n" + line + "\n")  # a blank line between
    with pytest.raises(ValueError, match="bad.jsonl line 3: " + message) as e:
        _load(task, str(path))
    assert "\n" not in str(e.value)
    # the same file without the bad line loads
    path.write_text(json.dumps(GOOD[task]) + "\n")
    assert len(_load(task, str(path))) == 1


@pytest.mark.parametrize("task", sorted(GOOD))
def test_oversized_fields_are_refused_at_load(tmp_path, task):
    """A 10 MB question loaded, then failed late. Every text field (a countdown question too) is
    bounded by data.MAX_FIELD_CHARS, refused in one line naming the field and the bound."""
    row = dict(GOOD[task])
    big = "x" * (data.MAX_FIELD_CHARS + 1)
    field = {"countdown": "numbers", "gsm8k": "question", "math500": "problem"}.get(task)
    if task == "countdown":
        row["numbers"] = [1] * (data.MAX_FIELD_CHARS // 3)  # a question over the bound
    elif task == "gsm8k":
        row["question"] = big
    elif task == "math500":
        row["problem"] = big
    elif task == "jsonl":
        row["answer"] = ["5", big]
        field = "answer"
    else:
        row["response"] = big
        field = "response"
    path = _write(tmp_path / "big.jsonl", [GOOD[task], row])
    bound = f"{data.MAX_FIELD_CHARS:,}"
    with pytest.raises(ValueError, match=f'big.jsonl line 2: "{field}" is .* over the {bound}'):
        _load(task, path)
    kw = tmp_path / "kw.txt"
    kw.write_text("apple\n" + big + "\n")
    with pytest.raises(ValueError, match=f'kw.txt line 2: "keyword" is .* over the {bound}'):
        data.load_task("keyword", path=str(kw))


def test_bad_bytes_and_numbers_name_their_line(tmp_path):
    """Not UTF-8, or an integer JSON cannot read: one line naming the line, not a traceback from
    the codec or from int()."""
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "#### 5"}\n{"question": "\xff"}\n')
    with pytest.raises(ValueError, match=r"b.jsonl line 2: byte 0xff at offset \d+ is not UTF-8"):
        data.load_task("gsm8k", path=str(path))
    path.write_text(
        '{"numbers": [1], "target": 1}\n{"numbers": [1], "target": ' + "9" * 5000 + "}\n"
    )
    with pytest.raises(ValueError, match="b.jsonl line 2: invalid JSON"):
        data.load_task("countdown", path=str(path))
    kw = tmp_path / "kw.txt"
    kw.write_bytes(b"apple\n\xfe\n")
    with pytest.raises(ValueError, match="kw.txt line 2: byte 0xfe"):
        data.load_task("keyword", path=str(kw))
    listed = tmp_path / "l.json"
    listed.write_text(
        '[{"question": "q", "answer": "#### 5"}, {"question": 7, "answer": "#### 1"}]'
    )
    with pytest.raises(ValueError, match='l.json item 2: "question" must be a string, got 7'):
        data.load_task("gsm8k", path=str(listed))


def _notices(capsys):
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("notice:")]


def test_unsolvable_countdown_rows_are_counted_in_one_notice(tmp_path, capsys, monkeypatch):
    """Impossible targets were accepted silently; a set of them trained with every reward 0."""
    solvable = [{"numbers": [1, 2, 3], "target": 6}, {"numbers": [3, 3, 8, 8], "target": 24}]
    impossible = [{"numbers": [1, 1, 1], "target": 100}, {"numbers": [2, 2], "target": 7}]
    mixed = _write(tmp_path / "mixed.jsonl", solvable * 4 + impossible * 3)
    rows = data.load_task("countdown", path=mixed)
    assert len(rows) == 14  # loaded: the caller decides
    assert _notices(capsys) == [
        f"notice: {mixed}: 6 of 14 Countdown rows have no solution with their numbers (no answer "
        f"to them can be right)"
    ]
    every = _write(tmp_path / "every.jsonl", impossible * 2)
    data.load_task("countdown", path=every)
    notices = _notices(capsys)
    assert len(notices) == 1
    assert "none of its 4 Countdown rows has a solution" in notices[0]
    assert "nothing is learned" in notices[0]
    data.load_task("countdown", path=_write(tmp_path / "fine.jsonl", solvable * 3))
    data.load_task("countdown", path="synthetic", limit=50)
    assert _notices(capsys) == []
    # a large set: an evenly spread sample of SOLVE_CHECK_ROWS, said so
    monkeypatch.setattr(data, "SOLVE_CHECK_ROWS", 200)  # every third row of 600
    big = _write(tmp_path / "big.jsonl", (solvable + impossible + solvable[:1]) * 120)
    data.load_task("countdown", path=big)
    notices = _notices(capsys)
    assert len(notices) == 1
    assert "80 of 200 Countdown rows checked (of 600) have no solution" in notices[0]


def test_countdown_solvable_matches_the_exact_solver():
    """The load-time check (floats, bounded steps) agrees with solve_countdown (exact fractions) on
    every problem of up to 4 small numbers, and is bounded for larger ones."""
    rng = random.Random(0)
    for _ in range(300):
        numbers = [rng.randint(0, 9) for _ in range(rng.randint(1, 4))]
        target = rng.randint(-20, 60)
        exact = data.solve_countdown(numbers, target) is not None
        assert data.countdown_solvable(numbers, target) == exact, (numbers, target)
    assert data.countdown_solvable([8, 3, 8, 3], 24) is True  # 8 / (3 - 8 / 3)
    assert data.countdown_solvable(list(range(1, 8)), 28) is None  # 7 numbers: undecided
    t = time.monotonic()
    assert data.countdown_solvable([97, 89, 83, 79, 73, 71], 10**9 + 7) is None  # over its steps
    assert time.monotonic() - t < 1


def test_cli_refuses_bad_rows_in_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"numbers": "345", "target": 12}\n')
    out = tmp_path / "o.jsonl"
    script = os.path.join(ROOT, "data.py")
    r = subprocess.run(
        [sys.executable, script, "countdown", "--path", str(bad), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f'error: {bad} line 1: "numbers" must be a non-empty list of integers >= 0, got "345"'
    )
    assert not out.exists()


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


# ----------------------------------------------------------------------------- prepare
# Local copies of the seeds' hub sets in each set's own schema and snapshot layout (what
# `huggingface-cli download --repo-type dataset ID --local-dir DIR` gives), read through `datasets`
# as a user's offline copy is; the Countdown copy is one train split a little over the hold-out.
CD_ROWS = data.COUNTDOWN_TEST_ROWS + 40


def _parquet(path, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table(columns), str(path))


@pytest.fixture(scope="module")
def hub_copies(tmp_path_factory):
    """({name: local copy}, {(name, split): the (question, ground truth) pairs it must load as}),
    with `datasets` caching under a temporary directory."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("hub")
    expect = {}
    # openai/gsm8k: configs main and socratic (only main is the seeds'), one parquet per split
    for config in ("main", "socratic"):
        for split, n in (("train", 6), ("test", 4)):
            questions = [
                f"{config} {split} {i}: Tom has {i} apples, buys 3. How many?" for i in range(n)
            ]
            answers = [f"{i} + 3 = <<{i}+3={i + 3}>>{i + 3}\n#### {i + 3}" for i in range(n)]
            path = root / "gsm8k" / config / f"{split}-00000-of-00001.parquet"
            _parquet(path, {"question": questions, "answer": answers})
            if config == "main":
                expect["gsm8k", split] = [(q, str(i + 3)) for i, q in enumerate(questions)]
    # hiyouga/math12k: problem, answer (no solution); train and test
    for split, n in (("train", 60), ("test", 3)):  # 60: a few of them fall in "val"
        problems = [f"{split} {i}: what is $\\frac{{{i}}}{{2}}$ doubled?" for i in range(n)]
        answers = [str(i) for i in range(n)]
        path = root / "math12k" / "data" / f"{split}-00000-of-00001.parquet"
        _parquet(path, {"problem": problems, "answer": answers})
        expect["math", split] = list(zip(problems, answers))
    # its train split less the held-out val problems (data.VAL_BUCKETS), and those
    train = expect["math", "train"]
    expect["math", "val"] = [(q, a) for q, a in train if data._in_val({"problem": q})]
    expect["math", "train"] = [(q, a) for q, a in train if not data._in_val({"problem": q})]
    assert expect["math", "val"]
    # HuggingFaceH4/MATH-500: test.jsonl, the answer column apart from the worked solution
    rows = []
    for i in range(3):
        solution = f"Half of {2 * i} is $\\boxed{{{i}}}$."
        rows.append(
            {
                "problem": f"Halve {2 * i}.",
                "solution": solution,
                "answer": str(i),
                "subject": "Algebra",
                "level": 1,
                "unique_id": f"test/algebra/{i}.json",
            }
        )
    os.makedirs(root / "math500")
    _write(root / "math500" / "test.jsonl", rows)
    expect["math500", "test"] = [(r["problem"], r["answer"]) for r in rows]
    # justinphan3110/Countdown-Tasks-3to4: one train split of {target, nums}
    rng = random.Random(0)
    nums = [[rng.randint(1, 99) for _ in range(rng.choice([3, 4]))] for _ in range(CD_ROWS)]
    targets = [sum(n) for n in nums]
    path = root / "countdown" / "data" / "train-00000-of-00001.parquet"
    _parquet(path, {"target": targets, "nums": nums})
    pairs = [
        (data.countdown_question(n, t), {"numbers": n, "target": t}) for n, t in zip(nums, targets)
    ]
    expect["countdown", "test"] = pairs[-data.COUNTDOWN_TEST_ROWS :]
    expect["countdown", "train"] = pairs[: -data.COUNTDOWN_TEST_ROWS]
    # the SFT set: Prime Intellect's chat "messages" rows
    turns = [
        [
            {"role": "user", "content": f"Solve {i} + 1."},
            {"role": "assistant", "content": f"{i + 1}"},
        ]
        for i in range(4)
    ]
    _write(root / "sft_messages.jsonl", [{"messages": t} for t in turns])
    expect["sft", None] = [(t[0]["content"], t[1]["content"]) for t in turns]
    # its test file: {"prompt", "response"} pairs, the prompts formatted with the intellect prompt
    intellect = data.load_prompt("intellect")
    pairs = []
    for i in range(3):
        prompt = data.format_prompt(intellect, f"Double {i}.")
        response = f"Twice {i}.\nTherefore, the final answer is: $\\boxed{{{2 * i}}}$. I hope"
        pairs.append({"prompt": prompt, "response": response})
    _write(root / "sft_test.jsonl", pairs)
    expect["sft", "test"] = [(f"Double {i}.", str(2 * i)) for i in range(3)]
    copies = {
        "gsm8k": str(root / "gsm8k"),
        "math": str(root / "math12k"),
        "math500": str(root / "math500"),
        "countdown": str(root / "countdown"),
        "sft": str(root / "sft_messages.jsonl"),
        "sft_test": str(root / "sft_test.jsonl"),
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(root / "cache"))
        yield copies, expect


def _loaded(name, path, split):
    """(question, ground truth) pairs of a written file as the recipes load it."""
    if name == "sft" and split == "test":  # its test rows are read as MATH problems
        name = "math"
    if name == "sft":
        return [(p["prompt"], p["response"]) for p in data.load_sft_jsonl(path)]
    return [(r["question"], r["ground_truth"]) for r in data.load_task(name, split, path=path)]


FIELDS = {  # the fields each prepared file holds
    "gsm8k": {"question", "answer"},
    "math": {"question", "answer"},
    "math500": {"question", "answer", "solution"},
    "countdown": {"numbers", "target"},
    "sft": {"prompt", "response"},
}


@pytest.mark.parametrize(
    "name, split",
    [
        ("gsm8k", "train"),
        ("gsm8k", "test"),
        ("math", "train"),
        ("math", "val"),
        ("math", "test"),
        ("math500", "test"),
        ("countdown", "train"),
        ("countdown", "test"),
        ("sft", None),
    ],
)
def test_prepare_writes_what_the_loaders_read(hub_copies, tmp_path, name, split, capsys):
    """Issue 28: every recipe read a local JSONL nothing wrote. `prepare` converts a local copy of
    each hub set (a snapshot directory; gsm8k's main config, not socratic) into the rows the
    loaders read, with the Countdown set's last 1024 rows held out as its test split."""
    copies, expect = hub_copies
    out = str(tmp_path / "out.jsonl")
    argv = ["prepare", name, "--from", copies[name], "--out", out]
    if split:
        argv += ["--split", split]
    data.main(argv)
    printed = capsys.readouterr().out
    assert f"prepare {name}: 100%" in printed  # the progress bar
    assert printed.splitlines()[-1] == f"wrote {len(expect[name, split])} rows to {out}"
    assert _loaded(name, out, split) == expect[name, split]
    assert all(set(r) == FIELDS[name] for r in data.read_jsonl(out))
    if name == "sft":  # sft.py reads the chat rows directly too
        assert _loaded(name, copies[name], split) == expect[name, split]
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_math_val_is_held_out_of_every_training_file(tmp_path, capsys):
    """Issue 45: SFT validated on MATH's 500 test problems, the final test. `prepare math --split
    val` is a hash-chosen ~5 % of math12k's train split, which `--split train` leaves out, and
    `prepare sft --exclude` drops the SFT pairs whose prompt holds a val problem: validation,
    GRPO training and SFT training sets are disjoint."""
    rows = []
    for i in range(400):
        rows.append({"problem": f"Problem {i}: what is {i} + {i}?", "answer": str(2 * i)})
    source = tmp_path / "math12k_train.jsonl"
    _write(source, rows)
    val = tmp_path / "math_val.jsonl"
    train = tmp_path / "math_train.jsonl"
    data.main(["prepare", "math", "--split", "val", "--from", str(source), "--out", str(val)])
    data.main(["prepare", "math", "--split", "train", "--from", str(source), "--out", str(train)])
    val_q = {r["question"] for r in data.read_jsonl(str(val))}
    train_q = {r["question"] for r in data.read_jsonl(str(train))}
    assert 8 <= len(val_q) <= 40  # ~5 % of 400
    assert not val_q & train_q and len(val_q | train_q) == 400
    # the same split whatever the source's order or size: by each problem's text
    again = tmp_path / "val_again.jsonl"
    _write(source, rows[::-1][:300])
    data.main(["prepare", "math", "--split", "val", "--from", str(source), "--out", str(again)])
    assert {r["question"] for r in data.read_jsonl(str(again))} <= val_q
    # SFT pairs quoting a val problem in their (already formatted) prompt are dropped
    pairs = []
    for i in range(0, 400, 4):
        prompt = f"A conversation. User: Problem {i}: what is {i} + {i}?\nAssistant: <think>"
        pairs.append({"prompt": prompt, "response": f" {2 * i}</think> <answer>{2 * i}</answer>"})
    sft_source = tmp_path / "pi.jsonl"
    _write(sft_source, pairs)
    sft_out = tmp_path / "sft.jsonl"
    capsys.readouterr()
    data.main(
        ["prepare", "sft", "--from", str(sft_source), "--exclude", str(val), "--out", str(sft_out)]
    )
    kept = data.read_jsonl(str(sft_out))
    quoted = [p for p in pairs if any(q in p["prompt"] for q in val_q)]
    assert len(kept) == len(pairs) - len(quoted) and quoted  # some were dropped
    assert not [p for p in kept if any(q in p["prompt"] for q in val_q)]
    assert f"dropped {len(quoted)} of {len(pairs)} rows" in capsys.readouterr().out


def test_prepare_sft_test_split_is_math_problems_to_evaluate_on(hub_copies, tmp_path, capsys):
    """Seed 000 §4.3 asks for the SFT model's accuracy on the Prime Intellect test set: `prepare
    sft --split test` recovers each question from its formatted prompt (intellect or r1_zero) and
    the answer from its response, so `--task math` evaluates on it; a response stating no answer
    is dropped with a count, a prompt no template fits is refused in one line."""
    copies, expect = hub_copies
    out = str(tmp_path / "pi_test.jsonl")
    data.main(["prepare", "sft", "--split", "test", "--from", copies["sft_test"], "--out", out])
    assert "3 questions recovered from the intellect template" in capsys.readouterr().out
    assert _loaded("math", out, "test") == expect["sft", "test"]
    assert all(set(r) == {"question", "answer", "solution"} for r in data.read_jsonl(out))
    # r1_zero-formatted pairs (the <answer> tag, a boxed one inside it) and one with no answer
    r1 = data.load_prompt("r1_zero")
    pairs = [
        {"prompt": data.format_prompt(r1, "What is 2 + 3?"), "response": " 5 </think> <answer>5"},
        {
            "prompt": data.format_prompt(r1, "Halve $\\frac{1}{2}$."),
            "response": " half </think> <answer>$\\boxed{\\frac{1}{4}}$</answer>",
        },
        {"prompt": data.format_prompt(r1, "What is 1 + 1?"), "response": " I do not know"},
    ]
    source = _write(tmp_path / "r1.jsonl", pairs)
    rows = data.prepare("sft", "test", source)
    assert [(r["question"], r["answer"]) for r in rows] == [
        ("What is 2 + 3?", "5"),
        ("Halve $\\frac{1}{2}$.", "\\frac{1}{4}"),
    ]
    printed = capsys.readouterr().out
    assert "1 of 3 responses state no answer: dropped" in printed
    assert "--prompt r1_zero" in printed
    # the grader reads the written answer back: the recovered row scores a correct response 1
    import grader

    loaded = data.load_task(
        "math", path=_write(tmp_path / "r1_test.jsonl", rows), prompt="intellect"
    )
    verdict = grader.question_only_reward_fn(
        "The answer is $\\boxed{5}$.", loaded[0]["ground_truth"]
    )
    assert verdict["reward"] == 1.0
    # refusals: a prompt of no template, sft's val split
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": "Q: 2 + 2?\nA:", "response": "\\boxed{4}"}])
    with pytest.raises(ValueError, match=r"row 0: the prompt is none of prompts/\*\.prompt") as e:
        data.prepare("sft", "test", bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"prepare sft has no 'val' split"):
        data.prepare("sft", "val", bad)


def test_prepare_limits_and_refuses_in_one_line(hub_copies, tmp_path):
    copies, expect = hub_copies
    rows = data.prepare("countdown", "train", copies["countdown"], limit=7)
    assert [(data.countdown_question(**r), r) for r in rows] == expect["countdown", "train"][:7]
    refusals = [
        (("math500", "train", copies["math500"]), r"has no 'train' split; choose from \['test'\]"),
        (("sft", None, None), "prepare sft needs --from LOCAL_FILE"),
        (("gsm8k", "test", str(tmp_path / "nowhere")), "nowhere: no such file or directory"),
        (("gsm8k", "train", copies["countdown"]), "the row has no field .question."),
        (("countdown", "test", copies["countdown"], 0), "--n 0: keep at least 1 row"),
    ]
    for call, message in refusals:
        with pytest.raises(ValueError, match=message) as e:
            data.prepare(*call)
        assert "\n" not in str(e.value)
    # a bad row of a parquet copy is named by its row
    bad = tmp_path / "bad" / "train-00000-of-00001.parquet"
    _parquet(bad, {"target": [3, 4], "nums": [[1, 2], [-1, 5]]})
    with pytest.raises(ValueError, match=r'bad row 1: "nums" must be a non-empty list of integers'):
        data.prepare("countdown", "test", str(bad.parent))


def test_prepare_without_the_hub_names_from(tmp_path):
    """An unreachable hub (here: offline mode, which fails at once; no network takes ~25 s of the
    hub client's retries to the same error) is one line naming --from, and nothing is written."""
    pytest.importorskip("datasets")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = tmp_path / "gsm8k_test.jsonl"
    cmd = [sys.executable, os.path.join(ROOT, "data.py"), "prepare", "gsm8k", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    one_line_error(r, "`datasets` cannot load the hub set openai/gsm8k")
    assert "python data.py prepare gsm8k --from LOCAL_COPY --out FILE" in r.stderr
    assert not out.exists()


def readme_prepare_lines():
    """argv of every line of the README's data preparation block."""
    readme = doc_section("Data preparation")
    block = readme.split("<!-- prepare -->", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def test_readme_recipes_read_what_its_prepare_lines_write(hub_copies, tmp_path, capsys):
    """Every data file a recipe reads is written by exactly one line of the README's data
    preparation block, with the data set the recipe reads it as; run here on the local copies."""
    from test_recipes import DATA_FLAGS, recipes, task_of

    copies, _ = hub_copies
    writes = {}  # file -> the line writing it
    for argv in readme_prepare_lines():
        target = argv[-1]
        if argv[0] != "cp":
            target = argv[argv.index("--out") + 1]
        assert target not in writes, f"two prepare lines write {target}"
        writes[target] = argv
    reads = {}  # file -> the data sets the recipes read it as
    for _label, argv in recipes():
        for flag, value in zip(argv, argv[1:]):
            if flag in DATA_FLAGS and value not in ("countdown", "synthetic"):
                reads.setdefault(value, set()).add(task_of(argv, flag))
    assert sorted(reads) == sorted(writes)
    # a line that --exclude's another line's file runs after it (sft.jsonl after math_val.jsonl)
    order = sorted(reads, key=lambda path: "--exclude" in writes[path])
    for path in order:
        tasks = reads[path]
        argv = writes[path]
        if argv[0] == "cp":  # seed 004's keyword list comes with the course repository
            assert tasks == {"keyword"}
            assert argv[1].endswith("/prompts/keywords.txt")
            continue
        assert argv[:3] == ["python", "data.py", "prepare"]
        flags = argv[3:]
        split = data.default_split(argv[3])
        if "--split" in flags:
            split = flags[flags.index("--split") + 1]
        read_as = argv[3]
        copy = copies[argv[3]]
        if argv[3] == "sft" and split == "test":  # the SFT set's test rows are MATH problems
            read_as = "math"
            copy = copies["sft_test"]
        assert tasks == {read_as}, f"{path} is written as {read_as}, read as {tasks}"
        if "--from" in flags:
            flags[flags.index("--from") + 1] = copy
        else:
            flags += ["--from", copy]
        out = str(tmp_path / path)
        flags[flags.index("--out") + 1] = out
        if "--exclude" in flags:
            held_out = flags.index("--exclude") + 1
            flags[held_out] = str(tmp_path / flags[held_out])
        data.main(["prepare", *flags])
        assert _loaded(argv[3], out, split), path
    capsys.readouterr()
