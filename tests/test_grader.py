"""grader.py: verdict tables for every rule, the seeds' examples verbatim, a fuzz test with a
per-call time bound, and grade_batch (order, threads, a stuck worker killed, daemonic callers)."""

import functools
import json
import multiprocessing
import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grader
from conftest import ROOT, doc_section
from grader import (
    REWARD_FNS,
    _evaluate_equation,
    _validate_numbers,
    countdown_reward_fn,
    grade_batch,
    gsm8k_reward_fn,
    intellect_reward_fn,
    keyword_inclusion_reward_fn,
    question_only_reward_fn,
    r1_zero_reward_fn,
)

KEYS = {"reward", "format_reward", "answer_reward"}


def V(reward, fmt, ans):
    return {"reward": reward, "format_reward": fmt, "answer_reward": ans}


def R1(ans):
    return f"Let me think. </think> <answer> {ans} </answer>"


# ------------------------------------------------------------------------- seed examples, verbatim
def test_seed_002_asserts():
    # Example 1: Valid Usage (subset)
    assert _validate_numbers("(64 + 14) - 16", [64, 14, 16, 7]) == True  # noqa: E712
    # Example 2: Invalid Usage (number used too many times)
    assert _validate_numbers((7 + 7) + 7, [7, 7, 65]) == False  # noqa: E712
    # Example 3: Invalid Usage (number not available)
    assert _validate_numbers("10 + 9", [10, 8, 2]) == False  # noqa: E712
    assert _evaluate_equation("(65 - 7) - 7") == 51.0
    # the seed's section 1.1 examples are correct answers
    for nums, t, e in [
        ([7, 7, 65], 51, "(65 - 7) - 7"),
        ([34, 84, 83, 72], 39, "(72 - 34) + (84 - 83)"),
        ([9, 4, 3, 7], 101, "(9 * (4 * 3)) - 7"),
    ]:
        verdict = countdown_reward_fn(f"<answer>{e}</answer>", {"numbers": nums, "target": t})
        assert verdict["reward"] == 1.0


def test_seed_004_keyword_example():
    sentence = "The red apple fell from the tree."
    assert keyword_inclusion_reward_fn(sentence, ["apple", "red"])["reward"] == 1
    assert keyword_inclusion_reward_fn(sentence, "apple")["reward"] == 1
    assert keyword_inclusion_reward_fn(sentence, ["apple", "pear"])["reward"] == 0  # every one
    assert REWARD_FNS["keyword"] is keyword_inclusion_reward_fn  # the seed's rule by default


# ----------------------------------------------------------------------------- tables
R1_TABLE = [  # (response, ground truth, (reward, format, answer))
    (R1("18"), "18", (1, 1, 1)),
    (R1("17"), "18", (0, 1, 0)),  # formatted wrong answer
    ("</think><answer> 18 </answer>", "18", (0, 0, 0)),  # strict: '</think> <answer>'
    ("</think> <answer> 18", "18", (0, 0, 0)),  # no </answer>
    ("18", "18", (0, 0, 0)),
    (R1("17") + " <answer> 18 </answer>", "18", (1, 1, 1)),  # last <answer> counts
    (R1("\\boxed{\\dfrac{1}{2}}"), "0.5", (1, 1, 1)),  # \boxed unwrapped, frac vs decimal
    (R1("\\frac12"), "\\dfrac{1}{2}", (1, 1, 1)),
    (R1("1/3"), "0.33", (0, 1, 0)),
    (R1("\\left( 3, \\frac{\\pi}{2} \\right)"), "(3,\\frac{\\pi}{2})", (1, 1, 1)),
    (R1("(3, \\pi/2)"), "\\left( 3, \\frac{\\pi}{2} \\right)", (1, 1, 1)),
    (R1("[1, 2)"), "[1,2)", (1, 1, 1)),
    (R1("(1, 2]"), "[1,2)", (0, 1, 0)),
    (R1("30^\\circ"), "30", (1, 1, 1)),
    (R1("30^{\\circ}"), "30", (1, 1, 1)),
    (R1("10\\text{ cm}"), "10", (1, 1, 1)),
    (R1("18 dollars"), "18", (1, 1, 1)),
    (R1("1,234 dollars"), "1234", (1, 1, 1)),
    (R1("58, 500"), "58500", (0, 1, 0)),  # a tuple, not a thousands separator
    (R1("$18.00"), "18", (1, 1, 1)),
    (R1("18."), "18", (1, 1, 1)),
    (R1("x = 5"), "5", (1, 1, 1)),
    (R1("007"), "7", (1, 1, 1)),
    (R1("1,234"), "1234", (1, 1, 1)),
    (R1("1,234"), 1234, (1, 1, 1)),  # numeric ground truth
    (R1("50\\%"), "50", (1, 1, 1)),
    (R1("x^2+2x+1"), "(x+1)^2", (1, 1, 1)),  # sympy equivalence
    (R1("\\sqrt{2}/2"), "\\frac{\\sqrt{2}}{2}", (1, 1, 1)),
    (R1("\\text{(B)}"), "B", (1, 1, 1)),
    (R1("2"), ["3", "2"], (1, 1, 1)),  # list of acceptable answers
    (R1("10^{10^{10}}"), "10", (0, 1, 0)),  # guarded, no hang
    (R1("\\frac{1}{2"), "\\frac{1}{2}", (0, 1, 0)),  # unbalanced braces
    (R1(""), "5", (0, 1, 0)),
]


@pytest.mark.parametrize("response,gt,expected", R1_TABLE)
def test_r1_zero_table(response, gt, expected):
    assert r1_zero_reward_fn(response, gt) == V(*map(float, expected))


OTHER_TABLE = [  # (fn, response, ground truth, (reward, format, answer))
    (question_only_reward_fn, "so 2+2 is \\boxed{4}.", "4", (1, 1, 1)),
    (question_only_reward_fn, "\\boxed{3} no wait \\boxed{4}", "4", (1, 1, 1)),
    (question_only_reward_fn, "The answer is 4.", "4", (0, 0, 0)),  # the course's rule: no box
    (question_only_reward_fn, "\\boxed{5}", "4", (0, 1, 0)),
    (question_only_reward_fn, "it is 4", "4", (0, 0, 0)),
    (
        intellect_reward_fn,
        "Work.\nTherefore, the final answer is: $\\boxed{\\frac{3}{4}}$. I hope it is correct.",
        "0.75",
        (1, 1, 1),
    ),
    (
        intellect_reward_fn,
        "Therefore, the final answer is: $\\boxed{2}$. I hope it is correct.",
        "3",
        (0, 1, 0),
    ),
    (intellect_reward_fn, "so \\boxed{3}", "3", (1, 0, 1)),  # answer graded, format 0
    (intellect_reward_fn, "The answer is 3.", "3", (1, 0, 1)),  # lenient: no box needed
    (intellect_reward_fn, "no idea", "3", (0, 0, 0)),
    (gsm8k_reward_fn, "9 * 2 = 18\n#### 18", "18", (1, 1, 1)),
    (gsm8k_reward_fn, "#### 1,234", "Janet... <<1+1=2>>\n#### 1234", (1, 1, 1)),  # a solution
    (gsm8k_reward_fn, R1("$18.00."), "18", (1, 1, 1)),
    (gsm8k_reward_fn, "The answer is 18 dollars.", "18", (1, 1, 1)),
    (gsm8k_reward_fn, "16 - 3 - 4 = 9 eggs, 9 * 2 = 18", "18", (1, 0, 1)),  # no marker: last number
    (gsm8k_reward_fn, "#### 19", "18", (0, 1, 0)),
    (gsm8k_reward_fn, "#### 18.5", "18", (0, 1, 0)),
    # seed 004: every keyword appears, case-insensitively, inside a word too
    (keyword_inclusion_reward_fn, "An APPLE a day", ["apple"], (1, 1, 1)),
    (keyword_inclusion_reward_fn, "Apples are red", ["apple"], (1, 1, 1)),
    (keyword_inclusion_reward_fn, "pineapple", ["Apple"], (1, 1, 1)),
    (keyword_inclusion_reward_fn, "red apple", ["apple", "tree"], (0, 1, 0)),
    (keyword_inclusion_reward_fn, "an ap ple", ["apple"], (0, 1, 0)),
    (keyword_inclusion_reward_fn, "c++ rocks", ["c++"], (1, 1, 1)),
    (keyword_inclusion_reward_fn, "", ["apple"], (0, 0, 0)),
    (keyword_inclusion_reward_fn, "anything", [" "], (0, 1, 0)),  # a blank keyword never appears
    (keyword_inclusion_reward_fn, "anything", [], (0, 1, 0)),
    # "keyword_whole_word": no letter, digit or _ may touch the keyword
    (REWARD_FNS["keyword_whole_word"], "An APPLE a day", ["apple"], (1, 1, 1)),
    (REWARD_FNS["keyword_whole_word"], "Apples are red", ["apple"], (0, 1, 0)),
    (REWARD_FNS["keyword_whole_word"], "pineapple", ["apple"], (0, 1, 0)),
    (REWARD_FNS["keyword_whole_word"], "apple_pie, apple2", ["apple"], (0, 1, 0)),
    (REWARD_FNS["keyword_whole_word"], "(apple), red.", ["apple", "red"], (1, 1, 1)),
    (REWARD_FNS["keyword_whole_word"], "c++ rocks", ["c++"], (1, 1, 1)),
]


@pytest.mark.parametrize("fn,response,gt,expected", OTHER_TABLE)
def test_other_tables(fn, response, gt, expected):
    assert fn(response, gt) == V(*map(float, expected))


# ----------------------------------------------------------------------------- the course's grader
# the verdicts of the course's drgrpo_grader.py on chosen inputs; how they were made: its header
with open(os.path.join(ROOT, "tests", "course_grader", "verdicts.json"), encoding="utf-8") as f:
    COURSE = json.load(f)


def course_id(case):
    return f"{case['rule']}:{case['response'][-40:]!r}"


@pytest.mark.parametrize("case", COURSE["rewards"], ids=course_id)
def test_seed_rules_read_the_answer_as_the_course_does(case):
    """Issue 28: r1_zero and question_only find the answer where the course's grader does (the same
    text graded, or none) and give its verdict. question_only used to read 'the answer is 4'."""
    response = case["response"]
    answer = None
    if case["rule"] == "question_only":
        answer = grader.boxed_answer(response)
    elif "</think> <answer>" in response and "</answer>" in response:
        answer = grader.r1_zero_answer(response)
    assert answer == case["course_answer"]
    assert REWARD_FNS[case["rule"]](response, case["ground_truth"]) == case["course"]


def test_seed_000_categories_follow_the_course_extraction():
    """Seed 000 §3.2's three categories (eval_zero_shot.category) under question_only: an unboxed
    answer is category 3, as the course counts it (it was category 1 before issue 28)."""
    from eval_zero_shot import category

    expected = {
        "so \\boxed{4}.": "format1_answer1",
        "so \\boxed{5}.": "format1_answer0",
        "The answer is 4.": "format0_answer0",
        "so \\fbox{4}.": "format0_answer0",
    }
    for response, name in expected.items():
        assert category(question_only_reward_fn(response, "4")) == name, response
    assert category(intellect_reward_fn("The answer is 4.", "4")) == "format0_answer1"


def readme_differences():
    """The table of known equivalence differences (docs/grading.md): {(answer, reference): (course,
    ours)}."""
    text = doc_section("Grading: the course's rules")
    lines = text.split("<!-- grader-differences -->")[1].strip().splitlines()
    rows = {}
    for line in lines[2:]:  # after the header and its rule
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        rows[(cells[0], cells[1])] = (int(cells[2]), int(cells[3]))
    return rows


def test_equivalence_differs_from_the_course_only_as_the_readme_says():
    """Issue 28: equivalence stays on math-verify. On the recorded cases it agrees with the course's
    grade() except on docs/grading.md's list, which pins our verdict there (1 = equal)."""
    found = {}
    for case in COURSE["equivalence"]:
        ours = grader.math_equal(case["answer"], case["gold"])
        if ours != case["course"]:
            found[(case["answer"], case["gold"])] = (int(case["course"]), int(ours))
    assert len(COURSE["equivalence"]) > 50
    assert found == readme_differences()


CD = {"numbers": [1, 2, 3], "target": 1}
COUNTDOWN_TABLE = [  # (response, ground truth, reward)
    ("<answer>(1 + 2) / 3</answer>", CD, 1.0),
    ("<answer>\nStep 1: 1 + 2 = 3\nStep 2: 3 / 3 = 1\n</answer>", CD, 1.0),  # the seed 000 example
    ("<answer>Step 1: 1 + 2 = 3 Step 2: 3 / 3 = 1</answer>", CD, 1.0),
    ("<answer>Step 1: 1 + 2 = 4\nStep 2: 4 / 3 = 1</answer>", CD, 0.1),  # false step
    # 2 already used
    ("<answer>Step 1: 1 + 2 = 3\nStep 2: 3 / 3 = 1\nStep 3: 3 - 2 = 1</answer>", CD, 0.1),
    ("<answer>Step 1: 3 - 2 = 1</answer>", CD, 0.1),  # 1 unused (all required)
    ("<answer>(1 + 2) / 3 = 1</answer>", CD, 1.0),
    ("<answer>(1 + 2) / 3 = 2</answer>", CD, 0.1),
    ("<answer>3 - 2</answer>", CD, 0.1),  # subset: all numbers required
    ("<answer>(1 + 1) / 2 * 3 / 3</answer>", CD, 0.1),  # reused number
    ("<answer>1 / (3 - 3) + 2</answer>", CD, 0.1),  # division by zero: wrong, no crash
    ("<answer>-1 + 2 * 1 / 3</answer>", CD, 0.1),  # unary minus not allowed
    ("<answer>1 ** 2 * 3 / 3</answer>", CD, 0.1),  # power not allowed
    ("<answer>(1 + 2) ÷ 3</answer>", CD, 0.1),  # unicode operator
    ("<answer>2(1 + 3)</answer>", CD, 0.1),  # implicit multiplication
    ("<answer>__import__('os').system('true')</answer>", CD, 0.1),  # never eval'd
    ("<answer>1.0 + 2 - 3</answer>", CD, 0.1),  # floats not allowed
    ("<answer>" + "(" * 5000 + "1" + ")" * 5000 + "</answer>", CD, 0.1),
    ("<answer>(1 + 2) / 3", CD, 0.0),
    ("(1 + 2) / 3", CD, 0.0),
    ("<answer>3 * 9 - 5</answer>", {"numbers": [3, 9, 5, 1], "target": 22}, 0.1),
    ("<answer>3 * 9 - 5 * 1</answer>", {"numbers": [3, 9, 5, 1], "target": 22}, 1.0),
]


@pytest.mark.parametrize("response,gt,reward", COUNTDOWN_TABLE)
def test_countdown_table(response, gt, reward):
    v = countdown_reward_fn(response, gt)
    assert v["reward"] == reward
    assert v["format_reward"] == (1.0 if reward else 0.0)
    assert v["answer_reward"] == (1.0 if reward == 1.0 else 0.0)


def test_countdown_subset_flag_and_exactness():
    sub = functools.partial(countdown_reward_fn, require_all=False)
    assert sub("<answer>3 - 2</answer>", CD)["reward"] == 1.0
    assert sub("<answer>Step 1: 3 - 2 = 1</answer>", CD)["reward"] == 1.0
    assert _validate_numbers("1 + 2 + 3", [1, 2, 3], require_all=True)
    assert not _validate_numbers("1 + 2", [1, 2, 3], require_all=True)
    # exact rationals: 8 / (3 - 8 / 3) == 24 exactly (float arithmetic gives 23.999999999999993)
    gt = {"numbers": [8, 3, 8, 3], "target": 24}
    assert countdown_reward_fn("<answer>8 / (3 - 8 / 3)</answer>", gt)["reward"] == 1.0
    assert _evaluate_equation("1 / 0") is None
    assert _evaluate_equation("2 x 3") is None


# ----------------------------------------------------------------------------- fixed defects
# each of these failed before its fix
FIXED = [  # (reward name, response, ground truth, reward)
    ("r1_zero", R1("\\neg 5"), "5", 0.0),  # 16.4: math-verify dropped the negation
    ("r1_zero", R1("5 \\lor 6"), "6", 0.0),  # 16.4: ... and kept the last disjunct
    ("r1_zero", R1("5 \\implies 6"), "6", 0.0),
    ("question_only", "\\boxed{5 \\wedge 6}", "6", 0.0),
    ("r1_zero", R1("p \\lor q"), "p \\lor q", 1.0),  # the same statement still matches
    ("gsm8k", "<answer>1,0</answer>", "10", 0.0),  # 16.4: "1,0" is no thousands-separated number
    ("gsm8k", "<answer>12,34</answer>", "1234", 0.0),
    ("gsm8k", "<answer>1,234,567</answer>", "1234567", 1.0),
    (  # 14.10
        "countdown",
        "<answer>Step 1: 3 / 2 = 3/2\nStep 2: 3/2 * 4 = 6</answer>",
        {"numbers": [3, 2, 4], "target": 6},
        1.0,
    ),
    (
        "countdown",
        "<answer>Step 1: 3 / 2 = 1.5\nStep 2: 4 * 1.5 = 6</answer>",
        {"numbers": [3, 2, 4], "target": 6},
        1.0,
    ),
    (
        "countdown",
        "<answer>Step 1: 4 / 3 = 4/3\nStep 2: 6 / (4/3) = 9/2\nStep 3: 9/2 * 2 = 9</answer>",
        {"numbers": [4, 3, 6, 2], "target": 9},
        1.0,
    ),
    (  # reused
        "countdown",
        "<answer>Step 1: 3 / 2 = 3/2\nStep 2: 3/2 * 3/2 = 9/4</answer>",
        {"numbers": [3, 2], "target": "9/4"},
        0.1,
    ),
    (
        "countdown",
        "<answer>Step 1: 3 / 2 = 1.4\nStep 2: 1.4 * 4 = 5.6</answer>",
        {"numbers": [3, 2, 4], "target": "28/5"},
        0.1,
    ),
    ("countdown", "<answer>03*5+7</answer>", {"numbers": [3, 5, 7], "target": 22}, 1.0),  # 03 is 3
    ("countdown", "<answer>(1 + 2)\n/ 3</answer>", CD, 1.0),  # 16.4: a newline inside
    ("countdown", "<answer>\n(1 + 2)\n/ 3\n= 1\n</answer>", CD, 1.0),
    ("countdown", "<answer>Step 1: 1 + 2 = 3\nStep 2: 3 / 3 = 1.</answer>", CD, 1.0),  # a period
    ("countdown_subset", "<answer>3 - 2</answer>", CD, 1.0),  # 15.7: seed 002's rule
    ("countdown_subset", "<answer>3 - 3 + 1</answer>", CD, 0.1),
    (  # not 6/1 .5
        "countdown",
        "<answer>Step 1: 3 / 2 = 1.5\nStep 2: 6 / 1.5 = 4</answer>",
        {"numbers": [3, 2, 6], "target": 4},
        1.0,
    ),
    (
        "countdown",
        "<answer>Step 1: 3 / 2 = 1.5\nStep 2: 6 / 1.5 = 6</answer>",
        {"numbers": [3, 2, 6], "target": 6},
        0.1,
    ),
    # 16: operators math-verify reads as their last operand (set operations, relations, a lone
    # bar, logic symbols and words)
    ("r1_zero", R1("5 ∨ 6"), "6", 0.0),
    ("question_only", "\\boxed{5 ∧ 6}", "6", 0.0),
    ("r1_zero", R1("5 \\mid 6"), "6", 0.0),
    ("r1_zero", R1("5 | 6"), "6", 0.0),
    ("r1_zero", R1("5 \\vert 6"), "6", 0.0),
    ("question_only", "\\boxed{5 \\cup 6}", "6", 0.0),
    ("r1_zero", R1("5 \\setminus 6"), "6", 0.0),
    ("question_only", "\\boxed{\\operatorname{not} 5}", "5", 0.0),
    ("r1_zero", R1("6"), "5 \\cup 6", 0.0),
    # ... while absolute values, unions of intervals and "x \in" an interval still match
    ("r1_zero", R1("|-3|"), "3", 1.0),
    ("r1_zero", R1("\\lvert x \\rvert"), "|x|", 1.0),
    ("question_only", "\\boxed{(-\\infty, 2] \\cup (3, 5)}", "(-\\infty,2]\\cup(3,5)", 1.0),
    ("question_only", "\\boxed{[1, 2] \\cup [3, 4]}", "[3,4] \\cup [1,2]", 1.0),
    ("question_only", "\\boxed{x \\in [2, 5)}", "[2,5)", 1.0),
    (  # ∪ is \cup
        "question_only",
        "\\boxed{(-\\infty, 2) ∪ (3, \\infty)}",
        "(-\\infty,2)\\cup(3,\\infty)",
        1.0,
    ),
    ("question_only", "\\boxed{5 ∪ 6}", "6", 0.0),
    ("question_only", "\\boxed{5 ∩ 6}", "6", 0.0),
    # \mid is the bar of set-builder notation
    ("question_only", "\\boxed{\\{x \\mid x > 2\\}}", "\\{x | x > 2\\}", 1.0),
]


@pytest.mark.parametrize("name,response,gt,reward", FIXED)
def test_fixed_defects(name, response, gt, reward):
    v = REWARD_FNS[name](response, gt)
    assert v["reward"] == reward
    assert v["answer_reward"] == float(reward == 1.0)


def test_seed_002_rule_as_countdown_subset():
    """Seed 002 §1.2-1.3 with its own spellings: the helpers by keyword, its reward examples."""
    valid = _validate_numbers(equation_str="(64 + 14) - 16", available_numbers=[64, 14, 16, 7])
    assert valid is True
    assert _validate_numbers(equation_str=(7 + 7) + 7, available_numbers=[7, 7, 65]) is False
    assert _validate_numbers(equation_str="10 + 9", available_numbers=[10, 8, 2]) is False
    assert _evaluate_equation(equation_str="(65 - 7) - 7") == 51.0
    assert _evaluate_equation("2(3)") is None  # implicit multiplication
    assert _evaluate_equation("2 × 3") is None  # a unicode operator
    answer = grader._extract_answer("<answer>1</answer> ... <answer> (79 - (60 - 17)) </answer>")
    assert answer == "(79 - (60 - 17))"

    def reward_fn(g, t):  # the seed returns a float
        return REWARD_FNS["countdown_subset"](g, t)["reward"]

    ground_truth = {"numbers": [79, 17, 60], "target": 36}
    assert reward_fn("...thinking... <answer>(79 - (60 - 17))</answer>", ground_truth) == 1.0
    assert reward_fn("...thinking...<answer>(79 + 60) + 17</answer>", ground_truth) == 0.1
    assert reward_fn("...thinking...The final answer is 62.", ground_truth) == 0.0
    assert reward_fn("<answer>79 - 60 + 17</answer>", ground_truth) == 1.0
    assert reward_fn("<answer>79 - 43</answer>", ground_truth) == 0.1  # 43 is not available
    subset = {"numbers": [64, 14, 16, 7], "target": 62}  # 7 is left unused
    assert REWARD_FNS["countdown"]("<answer>(64 + 14) - 16</answer>", subset)["reward"] == 0.1
    assert reward_fn("<answer>(64 + 14) - 16</answer>", subset) == 1.0


@pytest.mark.parametrize("rule", ["seed's reward_fn", "countdown (all numbers)"])
def test_seed_002_reward_fn_verbatim(rule):
    """Seed 002 §1.3's reward_fn, under its name and signature (a float, the subset rule), with the
    seed's asserts; our default Countdown reward passes them too."""
    from grader import reward_fn as seed_fn

    def ours(generated_text, ground_truth):
        return countdown_reward_fn(generated_text, ground_truth)["reward"]

    if rule == "seed's reward_fn":
        reward_fn = seed_fn
    else:
        reward_fn = ours
    numbers = [79, 17, 60]
    target = 36
    ground_truth = {"numbers": numbers, "target": target}
    # Example 1: Correct Answer
    rollout = "...thinking... <answer>(79 - (60 - 17))</answer>"
    assert reward_fn(rollout, ground_truth) == 1.0
    # Example 2: Correct usage, Wrong Answer (Partial, R = 0.1)
    rollout = "...thinking...<answer>(79 + 60) + 17</answer>"
    assert reward_fn(rollout, ground_truth) == 0.1  # valid format of <answer>
    # Example 3: No Answer Tag (Failed Format, R = 0.0)
    rollout = "...thinking...The final answer is 62."
    assert reward_fn(rollout, ground_truth) == 0.0
    # the seed's keywords
    assert reward_fn(generated_text="<answer>79 - 43</answer>", ground_truth=ground_truth) == 0.1
    assert type(reward_fn(rollout, ground_truth)) is float
    subset = reward_fn(
        "<answer>(64 + 14) - 16</answer>", {"numbers": [64, 14, 16, 7], "target": 62}
    )
    # numbers left unused: right under the seed's rule, wrong under ours
    if rule == "seed's reward_fn":
        assert subset == 1.0
    else:
        assert subset == 0.1


def test_bad_inputs_raise_clearly():
    with pytest.raises(ValueError, match="response must be a str"):
        r1_zero_reward_fn(None, "1")
    with pytest.raises(ValueError, match="ground truth"):
        r1_zero_reward_fn(R1("1"), {"a": 1})
    with pytest.raises(ValueError, match="3 responses but 2"):
        grade_batch(r1_zero_reward_fn, ["a", "b", "c"], ["1", "2"])


# ----------------------------------------------------------------------------- bounded time
ADVERSARIAL = [
    "10^10^10",
    "10^{10^{10}}",
    "9^{9^{9^{9}}}",
    "(10^{999})^{999}",
    "2^{99999}",
    "99999!",
    "(5!)!",
    "1" * 5000,
    "\\frac{" * 300,
    "}" * 300 + "{",
    "\\sqrt{" * 100 + "2" + "}" * 100,
    "x" * 50_000,
    "\\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}",
    "e^{e^{e^{e^{e^{10}}}}}",
    "\\sum_{k=1}^{10^{9}} k",
    "\\prod_{k=1}^{100000} k",
    "10**10**10",
    "\\left(" * 200,
]


def _gt_for(name):
    return {
        "countdown": {"numbers": [1, 2, 3], "target": 6},
        "keyword": ["apple", "tree"],
        "gsm8k": "18",
    }.get(name.replace("_subset", ""), "\\frac{1}{2}")


@pytest.mark.parametrize("name", sorted(REWARD_FNS))
def test_adversarial_inputs_are_fast(name):
    fn = REWARD_FNS[name]
    fn(R1("x^2+1"), _gt_for(name))  # one-time sympy warm-up is not part of any verdict's bound
    for a in ADVERSARIAL:
        responses = [
            R1(a),
            a,
            "Therefore, the final answer is: $\\boxed{" + a + "}$",
            "<answer>" + a + "</answer>" * 3,
        ]
        for resp in responses:
            t = time.monotonic()
            v = fn(resp, _gt_for(name))
            elapsed = time.monotonic() - t
            assert set(v) == KEYS, (name, a[:40])
            assert elapsed <= 1.2, (name, a[:40])


def _step_chain(chars):
    """A Countdown answer of about `chars` characters: valid "Step k:" lines that reach 6 from
    [1, 2, 3] (the middle steps restate 3), so a grader has to check every one."""
    steps = ["Step 1: 1 + 2 = 3"]
    length = len(steps[0])
    while length < chars:
        steps.append(f"Step {len(steps) + 1}: 3 = 3")
        length += len(steps[-1]) + 1
    steps.append(f"Step {len(steps) + 1}: 3 + 3 = 6")
    return "<answer>" + "\n".join(steps) + "</answer>"


def test_long_step_chains_are_bounded_in_process():
    """Issue 26: a 1 MB chain of Step lines took 1.4 s in-process (5.9 s at 4 MB; 10 s on this
    machine), with no time bound on that path. Now a Step answer over grader.MAX_STEPS_CHARS is
    invalid (0.1) and a response over grader.MAX_RESPONSE_CHARS gets the zero verdict unread."""
    gt = {"numbers": [1, 2, 3], "target": 6}
    short = _step_chain(0)
    assert countdown_reward_fn(short, gt)["reward"] == 1.0
    explained = short.replace("= 3\n", "= 3\nsince one and two make three\n")
    assert countdown_reward_fn(explained, gt)["reward"] == 1.0  # a step's later lines are prose
    near_cap = _step_chain(grader.MAX_RESPONSE_CHARS - 100)
    huge = _step_chain(4_000_000)
    for name in ["countdown", "countdown_subset"]:
        t = time.monotonic()
        verdicts = grade_batch(REWARD_FNS[name], [near_cap, huge], [gt, gt], workers=0)
        assert time.monotonic() - t < 1.0
        assert verdicts == [V(0.1, 1.0, 0.0), grader.ZERO]


LONG_SHAPES = {  # what a runaway generation could hold, repeated up to the response cap
    "steps": "Step 1: 1 + 2 = 3\n",
    "open boxes": "\\boxed{",
    "boxes": "\\boxed{1}",
    "answers": "<answer>1</answer>",
    "answer is": "the answer is 5. ",
    "hashes": "#### 5 ",
    "digits": "1",
    "newlines": "\n",
    "final answers": "final answer is: $\\boxed{",
}


@pytest.mark.parametrize("name", sorted(REWARD_FNS))
def test_every_rule_reads_a_response_up_to_the_cap_fast(name):
    """Every verdict is bounded in time in-process: a response of MAX_RESPONSE_CHARS of any shape
    takes under a second, and a longer one is not read (the all-zero verdict)."""
    fn = REWARD_FNS[name]
    grader.math_equal("x^2", "x^3")  # one-time sympy warm-up
    for shape, unit in LONG_SHAPES.items():
        body = unit * ((grader.MAX_RESPONSE_CHARS - 100) // len(unit))
        for resp in [R1(body), "<answer>" + body + "</answer>", body]:
            assert len(resp) <= grader.MAX_RESPONSE_CHARS
            t = time.monotonic()
            v = fn(resp, _gt_for(name))
            assert time.monotonic() - t <= 1.0, (name, shape)
            assert set(v) == KEYS
        too_long = R1("18") + " " * grader.MAX_RESPONSE_CHARS
        assert fn(too_long, _gt_for(name)) == grader.ZERO


def test_redundant_grouping_is_stripped_before_sympy():
    """Issue 26: a correct answer inside 12 pairs of parentheses was graded wrong once the sympy
    budget ran out. Redundant grouping goes first, so it takes the exact fast path."""
    grader.math_equal("x^2", "x^3")  # warm-up
    for wrapped in ["(" * 12 + "42" + ")" * 12, "{" * 12 + "42" + "}" * 12, "( ( ( 42 ) ) )"]:
        t = time.monotonic()
        assert r1_zero_reward_fn(R1(wrapped), "42")["reward"] == 1.0
        assert question_only_reward_fn("\\boxed{" + wrapped + "}", "42")["reward"] == 1.0
        assert time.monotonic() - t < 0.1, wrapped  # no sympy: the fast path
    assert r1_zero_reward_fn(R1("(" * 12 + "41" + ")" * 12), "42")["reward"] == 0.0
    assert r1_zero_reward_fn(R1("((((x+1))))"), "(x+1)")["reward"] == 1.0
    cases = {  # what _ungroup leaves
        "((((42))))": "42",
        "((x+1))": "x+1",
        "2((((x))))": "2(x)",
        "\\frac{{1}}{{2}}": "\\frac{1}{2}",
        "(1, 2)": "(1, 2)",  # a tuple or an interval keeps its brackets
        "((1, 2))": "(1, 2)",
        "(1, 2]": "(1, 2]",
        "(a) + (b)": "(a) + (b)",
        "\\{1, 2\\}": "\\{1, 2\\}",
        "f((1, 2))": "f((1, 2))",  # a tuple argument is not two arguments
    }
    for text, left in cases.items():
        assert grader._ungroup(text) == left, text
    assert r1_zero_reward_fn(R1("((1, 2))"), "[1, 2]")["reward"] == 0.0  # still an open interval


def test_sympy_budget_is_per_verdict():
    """A list of accepted answers used to give each its own sympy budget: four slow ones took four
    budgets in one verdict. They share one now."""
    grader.math_equal("x^2", "x^3")  # warm-up
    grader._sympy_equal_any_thread.cache_clear()
    slow = [f"x^9+{k}" for k in range(1, 5)]  # each alone runs out the budget (~2.5 s)
    t = time.monotonic()
    assert r1_zero_reward_fn(R1("(x+y+z+w)^{9}"), slow) == V(0.0, 1.0, 0.0)
    assert time.monotonic() - t < grader.SYMPY_BUDGET_S + 0.5


FRAGMENTS = [
    "</think> <answer>",
    "</answer>",
    "<answer>",
    "\\boxed{",
    "}",
    "{",
    "^",
    "^{",
    "10",
    "9",
    "!",
    "\\frac",
    "(",
    ")",
    " + ",
    " * ",
    " / ",
    " - ",
    "=",
    "Step 1:",
    "####",
    "x",
    "\\left(",
    "\\right)",
    ".",
    ",",
    "$",
    "\\sqrt",
    "e",
    "\\pi",
    "\\infty",
    "%",
    "\\text{cm}",
    "apple",
    "\n",
    "1" * 30,
]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    parts=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=40),
    name=st.sampled_from(sorted(REWARD_FNS)),
)
def test_fuzz_no_exception_right_keys_bounded(parts, name):
    resp = "".join(parts)
    t = time.monotonic()
    v = REWARD_FNS[name](resp, _gt_for(name))
    elapsed = time.monotonic() - t
    assert set(v) == KEYS
    assert all(isinstance(x, float) for x in v.values())
    assert elapsed <= 1.2


def test_alarm_stops_sympy_and_leaks_nothing(monkeypatch):
    grader._sympy_equal("x", "y")  # warm-up
    monkeypatch.setattr(grader, "SYMPY_BUDGET_S", 1e-4)
    t = time.monotonic()
    assert grader._sympy_equal("(x+1)^{20}", "x^{20}+20x^{19}+1") is False  # timed out -> not equal
    assert time.monotonic() - t < 0.5
    monkeypatch.undo()
    time.sleep(0.12)  # a stray re-fired alarm would raise here
    assert grader._sympy_equal("(x+1)^2", "x^2+2x+1") is True


# ----------------------------------------------------------------------------- grade_batch
def test_grade_batch_order_threads_and_stuck_helper():
    resps = [R1(i) for i in range(60)] + [R1("x^2+2x+1"), R1("\\frac{1}{3}")]
    gts = [str(i if i % 3 else i + 1) for i in range(60)] + ["(x+1)^2", "1/3"]
    serial = [r1_zero_reward_fn(r, g) for r, g in zip(resps, gts)]
    assert grade_batch(r1_zero_reward_fn, resps, gts, workers=2) == serial
    assert grade_batch(r1_zero_reward_fn, resps, gts, workers=0) == serial

    def not_picklable(r, g):  # a local function: graded here, not in the pool
        return r1_zero_reward_fn(r, g)

    assert grade_batch(not_picklable, resps[:3], gts[:3], workers=2) == serial[:3]
    out = []

    def grade_in_thread():  # from a non-main thread (e.g. a Ray actor's worker thread)
        out.append(grade_batch(r1_zero_reward_fn, resps, gts, workers=2))

    th = threading.Thread(target=grade_in_thread)
    th.start()
    th.join(60)
    assert out == [serial]

    def verdicts_in_thread():  # single verdicts from a thread run sympy in a pool worker
        equal = grader.math_equal("(y+1)^2", "y^2+2y+1")
        not_equal = grader.math_equal("y^3", "y^2")
        out.append((equal, not_equal))

    th = threading.Thread(target=verdicts_in_thread)
    th.start()
    th.join(60)
    assert out[-1] == (True, False)
    # a worker stuck in C code (no signal can interrupt pow) is killed; its item gets the zero
    # verdict
    t = time.monotonic()
    res = grade_batch(pow, [2, 3, 5, 7], [3, 10**8, 2, 2], workers=2)
    elapsed = time.monotonic() - t
    assert res == [8, grader.ZERO, 25, 49]
    assert elapsed < 10
    with pytest.raises(ValueError, match="grading item 1: ValueError: ground truth must be"):
        grade_batch(r1_zero_reward_fn, [R1("1")] * 2, ["1", {"bad": 1}], workers=1)
    assert grade_batch(r1_zero_reward_fn, resps, gts, workers=2) == serial  # the pool recovered


def test_grade_batch_stuck_item_inside_a_chunk():
    """A chunk that hits the time limit is graded again item by item: only the stuck item gets
    ZERO."""
    bases = list(range(16))
    exps = [2] * 16
    bases[5] = 3
    exps[5] = 10**8  # stuck
    res = grade_batch(pow, bases, exps, workers=2)  # chunks of 2
    assert res[5] == grader.ZERO
    assert res[:5] + res[6:] == [b * b for b in bases[:5] + bases[6:]]


def test_grade_batch_in_a_daemonic_process():
    """multiprocessing refuses children to a daemonic process (a Pool worker, a DataLoader worker)
    by default."""
    with multiprocessing.get_context("spawn").Pool(1) as daemonic:
        res = daemonic.apply(grade_batch, (pow, [2, 3, 5], [3, 10**8, 2]), {"workers": 1})
        assert res == [8, grader.ZERO, 25]


@pytest.mark.parametrize(
    "response,en,zh",
    [
        # the reasoning ends at </think>: the answer's words are not read
        (" I add 3 and 5 </think> <answer> eight </answer>", 1.0, 0.0),
        # each Chinese character is a word: 3 English of 7
        (" we compute 我们计算 then 3+5=8 </think> <answer>8</answer>", 3 / 7, 4 / 7),
        # a word with a letter outside ASCII is not English; digits and symbols are no words
        ("<think> naïve café ok 12 * 3 <answer> 36 </answer>", 1 / 3, 0.0),
        # no tag: the whole response; Cyrillic is another script
        ("Ответ yes", 1 / 2, 0.0),
        # no word at all: 0
        (" 3 + 5 = 8 </think> <answer> 8 </answer>", 0.0, 0.0),
        ("x" * (grader.MAX_RESPONSE_CHARS + 1), 0.0, 0.0),  # unread, as the graders do
    ],
)
def test_language_fraction_counts_the_reasonings_words(response, en, zh):
    assert grader.language_fraction(response, "en") == pytest.approx(en)
    assert grader.language_fraction(response, "zh") == pytest.approx(zh)
