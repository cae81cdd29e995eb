"""Reward functions, each fn(response: str, ground_truth) -> {"reward", "format_reward",
"answer_reward"}, and grade_batch, which grades a batch on a pool of processes with time limits.

Every grader is pure (no printing, no randomness), and no verdict takes more than ~1 s whatever the
input (after a one-time ~1 s sympy warm-up), in a pool worker or in-process (`--grader-workers 0`):
a response longer than MAX_RESPONSE_CHARS gets the all-zero verdict unread, Countdown "Step" answers
longer than MAX_STEPS_CHARS are invalid (0.1), and the sympy steps of one verdict share one budget.

r1_zero and question_only, the seeds' math rules, find the answer exactly where the course's
drgrpo_grader does (tests/course_grader/ holds its verdicts); intellect and gsm8k read answers
leniently, on purpose ("the answer is 4" counts), and no seed default uses them.

Math equivalence is ours, not the course's: a light normalisation (redundant grouping dropped:
"((42))" is 42), then an exact fast path (string or rational equality), then math-verify (sympy);
docs/grading.md lists where it is known to differ from the course's. math-verify never sees long
answers, unbalanced braces, huge literals, big or nested exponents, big factorials, logic (which it
reads as one operand: "\\neg 5" is 5, "5 \\lor 6" is 6), set operations and relations
("5 \\cup 6", "5 | 6") the reference lacks, nor the word "answer" (it would find 18 in "the answer
is 18", an extraction of its own).

Time bound: in a main thread, a sub-second setitimer alarm (math-verify's own signal.alarm timeouts
refuse threads, so they are off). Elsewhere, a pebble ProcessPool worker, killed at HARD_LIMIT_S
(verdict "not equal") and replaced. `grade_batch` grades on that pool (Ray actors too); the pool's
forkserver imports the main script, which therefore needs the `if __name__ == "__main__"` guard.

Countdown departs from seed 002's code: the seed says "each number n_i must be used in E exactly
once", but its `_validate_numbers` accepts a subset. "countdown" requires ALL numbers, once each
(the problem statement, Countdown-Tasks-3to4); "countdown_subset", `reward_fn` (the seed's float)
and `_validate_numbers`'s default follow the seed's code.

  .venv/bin/python -c "import grader; print(grader.REWARD_FNS['gsm8k']('#### 1,234', '1234'))"
  .venv/bin/python bench/grader_throughput.py   # responses/s and worst-case latency
"""

import ast
import atexit
import logging
import multiprocessing
import operator
import os
import pickle
import re
import signal
import threading
import time
from collections import Counter
from fractions import Fraction
from functools import lru_cache, partial

SYMPY_BUDGET_S = 0.6  # wall budget of the sympy step of one verdict
HARD_LIMIT_S = 1.0  # an item running this long in a pool worker is killed with the worker
CHUNK = 8  # items per pool task in grade_batch (a task costs ~0.1 ms of pool overhead)
MAX_SYMPY_CHARS = 256  # longer answers never reach sympy
MAX_EXPR_CHARS = 1000  # longer answers: not normalised, and an invalid countdown expression (0.1)
# longer Countdown "Step k:" answers are invalid (0.1): a correct chain for 6 numbers takes ~150
# characters, and a checked step costs ~0.2 ms (a 1 MB chain took 10 s)
MAX_STEPS_CHARS = 10_000
# longer responses get the all-zero verdict unread: ~50k tokens, beyond any --max-tokens used here;
# every rule reads a response of this length in well under a second
MAX_RESPONSE_CHARS = 200_000
ZERO = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}

# math-verify warns once that we disabled its timeouts
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _verdict(fmt, ans, reward=None):
    """The verdict dict, all floats; the reward is the answer reward unless given."""
    if reward is None:
        reward = ans
    return {"reward": float(reward), "format_reward": float(fmt), "answer_reward": float(ans)}


# ----------------------------------------------------------------------------- answers
def last_boxed(text):
    """Content of the last \\boxed{...} / \\fbox{...} in text (brace-matched), or None. Lenient
    (data gold answers, Best-of-N votes, the intellect rule); the seed rules use boxed_answer."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    j = text.find("{", i)
    if j < 0 or text[i:j].strip() not in ("\\boxed", "\\fbox"):
        m = re.match(r"\\boxed ([^\s$]+)", text[i:])  # the "\boxed 5" form
        if m:
            return m.group(1)
        return None
    depth = 0
    for k in range(j, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
        if depth == 0:
            return text[j + 1 : k]
    return None  # unbalanced


def boxed_answer(text):
    """The course's reading of a \\boxed answer (drgrpo_grader's extract_answer): the content of the
    LAST "\\boxed", brace-matched, or None when there is none, when it is not directly followed by
    "{" ("\\boxed 5", "\\boxed {5}") or when its braces never close. \\fbox is not read, and an
    earlier, readable \\boxed{} does not stand in for an unreadable last one."""
    i = text.rfind("\\boxed")
    if i < 0:
        return None
    if not text.startswith("\\boxed{", i):
        return None
    depth = 0
    for k in range(i, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[i + len("\\boxed{") : k]
    return None  # unbalanced


def r1_zero_answer(response):
    """The text r1_zero grades, as the course finds it: everything after the last "<answer>", each
    "</answer>" removed (text after the closing tag stays); if it holds a \\boxed, that box's
    content (boxed_answer: None if unreadable). Not stripped: the equivalence ignores spaces."""
    answer = response.split("<answer>")[-1].replace("</answer>", "")
    if "\\boxed" in answer:
        return boxed_answer(answer)
    return answer


def gsm8k_answer(solution):
    """'... #### 1,234' -> '1234'."""
    if "####" not in solution:
        raise ValueError(f"GSM8K answer has no '####': {solution[-80:]!r}")
    return solution.split("####")[-1].strip().replace(",", "")


def gsm8k_gold(ground_truth):
    """The exact number a GSM8K ground truth states (the number, or a solution '... #### N'); a
    ValueError when it states none (data.py checks every row with it at load)."""
    gt = str(ground_truth)
    if "####" in gt:
        gold = _number(gsm8k_answer(gt))
    else:
        gold = _number(gt.replace(",", "").strip())
    if gold is None:
        raise ValueError(f"GSM8K ground truth is not a number: {gt[-80:]!r}")
    return gold


def math_answer(text):
    """Final answer of a MATH solution: the last \\boxed{}, else the text after 'The answer is:',
    else the whole text."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    m = re.search(r"The answer is:?\s*(.+?)\s*$", text, re.S)
    if m:
        return m.group(1).strip()
    return text.strip()


# ----------------------------------------------------------------------------- normalisation
def _clean(s):
    """Light, LaTeX-preserving normalisation of one final answer."""
    s = str(s).strip()
    if len(s) > MAX_EXPR_CHARS:
        return s
    s = (last_boxed(s) or s).strip()
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    # sizing commands, LaTeX spaces, degrees, percent and dollar signs: each becomes a space
    # (a LaTeX space "\\ " is not the end of a row break "\\\\ ")
    decorations = (
        r"\\(left|right|displaystyle)\b|(?<!\\)\\[!,;: ]|\^\s*\{?\\circ\}?|\\circ|°|\\?%|\\?\$"
    )
    s = re.sub(decorations, " ", s)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = s.strip().rstrip(".").strip()
    if s.count("=") == 1 and re.match(r"^\\?[a-zA-Z]\w*\s*=", s):  # "x = 5" -> "5"
        s = s.split("=", 1)[1].strip()
    m = re.fullmatch(r"(-?[\d,]*\.?\d+)\s+[a-zA-Z]{2,}(\s+[a-zA-Z]+)?", s)  # "18 dollars", "10 cm"
    if m:
        s = m.group(1)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # thousands separators
        s = s.replace(",", "")
    return _ungroup(s)


def _ungroup(s):
    """s without redundant grouping: "((x))" is "(x)" anywhere, and a pair around the whole answer
    goes unless its content holds a comma at its top level ("(1, 2)" is a tuple or an interval).
    Why: math-verify's parser slows down with nesting, and 12 pairs around 42 ran out its budget."""
    double_parens = r"\(\(([^(),]*)\)\)"  # "((x))": the outer pair holds exactly the inner one
    double_braces = r"\{\{([^{},]*)\}\}"
    t = None
    while t != s:
        t = s
        s = re.sub(double_parens, r"(\1)", s)
        s = re.sub(double_braces, r"{\1}", s)
    while len(s) >= 2 and (s[0] + s[-1]) in ("()", "{}") and _one_group(s):
        s = s[1:-1].strip()
    return s


def _one_group(s):
    """Whether s[0] opens a bracket that closes at s[-1], with no comma between at that level."""
    depth = 0
    for k, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if depth == 0 and k < len(s) - 1:
            return False  # closed early: "(a) + (b)"
        if depth == 1 and c == ",":
            return False
    return depth == 0


def _number(k):
    """Exact value of a normalised plain number, decimal, a/b or \\frac{a}{b}; else None."""
    if len(k) >= 60:
        return None
    # groups: 1 the sign; 2 or 3 \frac's numerator, 4 or 5 its denominator; 6 / 7 those of a/b
    fraction = r"(-?)(?:\\frac(?:\{(\d+)\}|(\d))(?:\{(\d+)\}|(\d))|(\d+)/(\d+))"
    m = re.fullmatch(fraction, k)
    if m:
        num = int(m.group(2) or m.group(3) or m.group(6))
        den = int(m.group(4) or m.group(5) or m.group(7))
        if den:
            if m.group(1):
                num = -num
            return Fraction(num, den)
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)", k):
        return Fraction(k)
    return None


def _safe_for_sympy(s):
    """False for inputs that could keep sympy busy for long (in C code: no signal helps it) and
    for logic statements."""
    if len(s) > MAX_SYMPY_CHARS or re.search(r"\d{40,}", s):
        return False
    # remove balanced {...} pairs, innermost first: a brace left over is unbalanced
    t = s
    u = re.sub(r"\{[^{}]*\}", "", t)
    while u != t:
        t = u
        u = re.sub(r"\{[^{}]*\}", "", t)
    if "{" in t or "}" in t:
        return False
    exponents = re.findall(r"(?:\^|\*\*)\s*[{(]?\s*[-+]?\s*(\d+)", s)
    if any(len(e) >= 4 for e in exponents):
        return False
    two_digit_or_more = [e for e in exponents if len(e) >= 2]
    if len(two_digit_or_more) >= 2:
        return False
    logic = (
        r"\\(neg|lnot|lor|land|vee|wedge|oplus|implies|iff|to|([Ll]eft|[Rr]ight)+arrow)(?![a-z])"
    )
    if re.search(logic, s):
        return False
    nested_exponents = (
        r"(?:\^|\*\*)\s*\{[^{}]*(?:\^|\*\*)|(?:\^|\*\*)\s*[\w.\\]+\s*(?:\^|\*\*)|\\uparrow"
    )
    if re.search(nested_exponents, s):
        return False
    big_factorials = r"\d{3,}\s*!|!\s*\)?\s*!|\)\s*!"
    if re.search(big_factorials, s):
        return False
    return True


def _ops(s):
    """What math-verify reads as one operand ("5 \\cup 6", "5 | 6", "5 ∨ 6" all read as 6): set
    operations, relations, logic and an unpaired bar. Not \\in ("x \\in [2, 5)" is fine)."""
    # one spelling each
    s = s.translate({ord("∪"): r" \cup ", ord("∩"): r" \cap ", ord("∖"): r" \setminus "})
    ops = re.findall(
        r"\\(?:cup|cap|setminus|backslash|parallel|perp|su[bp]set(?:eq)?|otimes)(?![a-z])|[¬∨∧]"
        r"|\\operatorname\{(?i:not|or|and|xor)\}",
        s,
    )
    # \mid is a bar: {x \mid x > 2} is {x | x > 2}
    bars = re.findall(r"\\(?:[lr]?[vV]ert|mid)(?![a-z])|\|", s)
    found = set(ops)
    if len(bars) % 2:  # |x| pairs up; an odd bar is an operator
        found.add("|")
    return found


class _Timeout(BaseException):
    """Raised by the alarm. Not an Exception: math-verify's `except Exception` must not swallow
    it."""

    @staticmethod
    def on_alarm(signum, frame):  # the SIGALRM handler
        raise _Timeout()


_WARMUP = [
    "x^2+2x+1",
    "(x+1)^2",
    "[1,2)",
    "(3,\\pi)",
    "\\left( 3, \\frac{\\pi}{2} \\right)",
    "\\frac{\\sqrt{3}}{2}",
    "\\{1,2\\}",
    "(-\\infty, 2] \\cup (3, 5)",
    "y \\le 3",
    "\\text{(A)}",
    "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
    "\\log_2 8",
    "\\sin x",
]


def _sympy_equal(pred, gold, budget=None):
    """math-verify equivalence under an alarm of `budget` seconds (default SYMPY_BUDGET_S; call it
    in a main thread only)."""
    if budget is None:
        budget = SYMPY_BUDGET_S
    from math_verify import parse, verify

    if not getattr(_sympy_equal, "warm", False):
        # one-time ~1 s of lazy imports and parser caches, not under the alarm
        pairs = zip(_WARMUP, _WARMUP[1:])
        _sympy_equal.warm = [verify(parse(f"${a}$"), parse(f"${b}$")) for a, b in pairs]
    old = signal.signal(signal.SIGALRM, _Timeout.on_alarm) or signal.SIG_DFL
    try:
        try:
            # the alarm re-fires every 50 ms in case something swallows it
            signal.setitimer(signal.ITIMER_REAL, budget, 0.05)
            g = parse(f"${gold}$", parsing_timeout=None)
            p = parse(f"${pred}$", parsing_timeout=None)
            return bool(g and p and verify(g, p, timeout_seconds=None))
        finally:  # a late alarm raised in here is still caught below
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Timeout:
        return False
    finally:
        signal.signal(signal.SIGALRM, old)


@lru_cache(maxsize=1 << 14)
def _sympy_equal_any_thread(pred, gold, budget):
    """_sympy_equal here in a main thread, else in a pool worker (killed: not equal). The arguments
    are at most MAX_SYMPY_CHARS long, so the cache stays small."""
    if threading.current_thread() is threading.main_thread():
        return _sympy_equal(pred, gold, budget)
    future = _pool().schedule(_sympy_equal, (pred, gold, budget), timeout=HARD_LIMIT_S)
    return _result(future, False)


def math_equal(pred, gold, budget=None):
    """Is the answer `pred` equivalent to the reference `gold` (both strings)? Bounded time: the
    sympy step gets `budget` seconds (default SYMPY_BUDGET_S; 0: not equal unless the fast path
    says so)."""
    if budget is None:
        budget = SYMPY_BUDGET_S
    cp = _clean(pred)
    cg = _clean(gold)
    kp = re.sub(r"\s+", "", cp)  # without spaces: for the exact comparisons
    kg = re.sub(r"\s+", "", cg)
    if kp == kg:
        return bool(kp)  # two empty answers match nothing
    if not kp or not kg:
        return False
    np_ = _number(kp)
    ng = _number(kg)
    both_numbers = np_ is not None and ng is not None
    if both_numbers or kp.count(",") != kg.count(","):  # 5 vs (1,2): no sympy
        return np_ is not None and np_ == ng
    if not (_safe_for_sympy(cp) and _safe_for_sympy(cg)):
        return False
    if re.search(r"answer", cp + cg, re.I):
        # math-verify would find "18" in "the answer is 18" (its own extraction); the seed rules
        # grade the answer as the course's extraction found it, and that text is not 18
        return False
    if _ops(cp) != _ops(cg):
        return False
    if budget <= 0:
        return False
    return _sympy_equal_any_thread(cp, cg, budget)


def _any_equal(pred, ground_truth):
    if isinstance(ground_truth, (str, int, float, Fraction)):
        ground_truth = [ground_truth]
    if not isinstance(ground_truth, (list, tuple)):
        raise ValueError(
            "ground truth must be a string, a number or a list of strings, "
            f"got {type(ground_truth).__name__}"
        )
    # the sympy steps of one verdict share one budget, however many answers are accepted
    deadline = time.monotonic() + SYMPY_BUDGET_S
    for g in ground_truth:
        if math_equal(pred, str(g), round(deadline - time.monotonic(), 2)):
            return True
    return False


def _readable(response):
    """Whether a rule reads the response: a str (else a ValueError) of at most MAX_RESPONSE_CHARS
    (longer ones get the all-zero verdict)."""
    if not isinstance(response, str):
        raise ValueError(f"response must be a str, got {type(response).__name__}")
    return len(response) <= MAX_RESPONSE_CHARS


def _extract_answer(text):
    """Seed 002 helper: the content of the last <answer>...</answer>, or None."""
    start = text.rfind("<answer>")
    if start < 0:
        return None
    end = text.find("</answer>", start)
    if end < 0:
        return None
    return text[start + len("<answer>") : end].strip()


def _answer_is(response):
    """The text after the last 'answer is' (or 'answer is:') marker, or None."""
    matches = list(re.finditer(r"answer is:?\s*([^\n]{1,200})", response[-5000:], re.I))
    if not matches:
        return None
    return matches[-1].group(1).strip().rstrip(".")


# ----------------------------------------------------------------------------- math rewards
R1_ZERO_TAGS = "</think> <answer>"  # what r1_zero's format needs: the close, a space, the open


def r1_zero_reward_fn(response, ground_truth):
    """The course's r1_zero rule: format 1 iff '</think> <answer>' and '</answer>' both appear;
    then the answer is r1_zero_answer's (an unreadable \\boxed in it: answer 0). Formatted but
    wrong: format 1, reward 0."""
    if not _readable(response):
        return dict(ZERO)
    if R1_ZERO_TAGS not in response or "</answer>" not in response:
        return dict(ZERO)
    answer = r1_zero_answer(response)
    if answer is None:
        return _verdict(1.0, 0.0)
    return _verdict(1.0, _any_equal(answer, ground_truth))


def question_only_reward_fn(response, ground_truth):
    """The course's question_only rule: the answer is the last \\boxed{} (boxed_answer), format 1
    iff there is one; no readable box, all 0 ("the answer is 4" included: see intellect_reward_fn
    for a lenient reading)."""
    if not _readable(response):
        return dict(ZERO)
    answer = boxed_answer(response)
    if answer is None:
        return dict(ZERO)
    return _verdict(1.0, _any_equal(answer, ground_truth))


def intellect_reward_fn(response, ground_truth):
    """MATH with the intellect prompt, read leniently (the seeds grade it with question_only):
    format 1 iff 'final answer is: $\\boxed{...}$' is there; the answer (the last \\boxed{} or
    \\fbox{}, else the text after 'answer is') is graded either way; reward = answer."""
    if not _readable(response):
        return dict(ZERO)
    fmt = bool(re.search(r"final answer is:?\s*\$?\\boxed\{", response, re.I))
    ans = last_boxed(response) or _answer_is(response)
    return _verdict(fmt, ans is not None and _any_equal(ans, ground_truth))


def gsm8k_reward_fn(response, ground_truth):
    """GSM8K numeric equality. The answer: the last <answer>...</answer>, else the text after the
    last '####', else after 'answer is', else the whole response; its last number is compared
    exactly ('$1,234.00.' == 1234). format 1 iff one of those markers was found.
    ground_truth: the number, or a solution '... #### N'."""
    if not _readable(response):
        return dict(ZERO)
    gold = gsm8k_gold(ground_truth)
    ans = _extract_answer(response)
    if ans is None and "####" in response:
        ans = response.rsplit("####", 1)[1][:200]
    elif ans is None:
        ans = _answer_is(response)
    searched = response if ans is None else ans
    number = r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|-?\.\d+"  # 1,234.5 or 1234 or .5
    nums = re.findall(number, searched[-2000:])
    correct = bool(nums) and _number(nums[-1].replace(",", "")) == gold
    return _verdict(ans is not None, correct)


# ----------------------------------------------------------------------------- countdown
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _eval_exact(expr):
    """Exact Fraction value of an expression of positive integers, + - * / and parentheses, else
    None. Parsed with ast (never eval); unary minus, powers, calls, floats and unicode operators
    give None. Line breaks are spaces, and a leading zero is dropped (03 is 3, as
    _validate_numbers reads it)."""
    expr = str(expr)
    if len(expr) > MAX_EXPR_CHARS or not re.fullmatch(r"[\d\s+\-*/()]+", expr):
        return None
    expr = " ".join(expr.split())
    expr = re.sub(r"(?<!\d)0+(?=\d)", "", expr)

    def value(node):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        raise ValueError("disallowed syntax")

    try:
        return value(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def _evaluate_equation(equation_str):
    """Seed 002 helper: the equation's float value, None if invalid (division by zero included)."""
    value = _eval_exact(equation_str)
    if value is None:
        return None
    return float(value)


def _validate_numbers(equation_str, available_numbers, require_all=False):
    """Seed 002 helper: the equation's numbers are a sub-multiset of available_numbers (each used at
    most once); with require_all, exactly that multiset (each used exactly once)."""
    used = Counter(int(x) for x in re.findall(r"\d+", str(equation_str)))
    avail = Counter(int(x) for x in available_numbers)
    if require_all:
        return used == avail
    return not (used - avail)


def _stated(text):
    """Value of a right side: an expression ('3/2') or a decimal ('1.5'); a closing period is
    dropped."""
    text = text.strip().rstrip(".")
    if re.fullmatch(r"\d+\.\d+", text):
        return Fraction(text)
    return _eval_exact(text)


def _countdown_steps(answer, numbers, target, require_all):
    """'Step k: a op b = c' lines: each left side uses available numbers (the originals or earlier
    results) once each and equals its right side; the last result is the target. An earlier
    non-integer result is used again as written on its right side ('3/2' or '1.5': '6 / 1.5'
    divides by it), and counts as one number."""
    orig = Counter(Fraction(n) for n in numbers)  # the puzzle's numbers not used yet
    inter = Counter()  # earlier steps' results not used yet
    last = None  # the latest step's result
    steps = re.split(r"Step\s*\d+\s*:", answer)[1:]
    for step in steps:
        lhs, eq, rhs = step.strip().partition("=")
        # odd parts are decimals and fractions a/b: maybe an earlier result, as it was written
        parts = re.split(r"(\d+\.\d+|\d+\s*/\s*\d+(?!\.?\d))", lhs)
        lits = []  # the numbers this left side takes from the pools
        for k, part in enumerate(parts):
            v = None
            if k % 2:
                v = _stated(part)
            if v is not None and v.denominator > 1 and inter[v]:
                inter[v] -= 1
                parts[k] = f"({v.numerator}/{v.denominator})"
            else:
                lits += re.findall(r"\d+", part)
        val = _eval_exact("".join(parts))
        stated = _stated(rhs.strip().split("\n")[0])
        if not eq or val is None or val != stated:
            return False
        for lit in lits:
            number = Fraction(lit)
            pool = orig
            if inter[number]:
                pool = inter  # an earlier result before an original number
            if not pool[number]:
                return False
            pool[number] -= 1
        inter[val] += 1
        last = val
    if last != target:
        return False
    if not require_all:
        return True
    # every number used, and one result left: the last one
    return sum(orig.values()) == 0 and sum(inter.values()) == 1


def countdown_reward_fn(response, ground_truth, require_all=True):
    """Seed 002 §1.3: 1.0 correct; 0.1 an <answer> tag with a wrong value, wrong or reused numbers
    or an invalid expression; 0.0 no <answer>...</answer>. The answer is one expression (optionally
    '= target'; line breaks are spaces; 03 is 3: a typo, not an octal or a new number) or 'Step k:'
    lines. require_all: see the module docstring."""
    if not _readable(response):
        return dict(ZERO)
    numbers = list(ground_truth["numbers"])
    target = Fraction(ground_truth["target"])
    ans = _extract_answer(response)
    if ans is None:
        return dict(ZERO)
    if re.search(r"Step\s*\d+\s*:", ans):
        ok = len(ans) <= MAX_STEPS_CHARS and _countdown_steps(ans, numbers, target, require_all)
    else:
        lhs, _, rhs = ans.partition("=")
        val = _eval_exact(lhs)
        ok = val is not None and val == target and _validate_numbers(lhs, numbers, require_all)
        if ok and rhs.strip():
            ok = _stated(rhs) == val  # a stated '= result' must be right too
    return _verdict(1.0, ok, 1.0 if ok else 0.1)


def keyword_inclusion_reward_fn(response, keywords, whole_word=False):
    """Seed 004 §3.1: 1 iff every keyword appears in the response, case-insensitively; a keyword
    inside a longer word counts ("Apples are red" earns "apple"), as the seed's "appear" reads.
    whole_word=True ("keyword_whole_word") counts a keyword only with no letter, digit or _ on
    either side, so "pineapple" does not earn "apple". keywords: one string or a list of them."""
    if not _readable(response):
        return dict(ZERO)
    if isinstance(keywords, str):
        kws = [keywords]
    else:
        kws = list(keywords)
    ok = bool(kws) and all(_has_keyword(response, k, whole_word) for k in kws)
    return _verdict(bool(response.strip()), ok)


def _has_keyword(response, keyword, whole_word):
    """Whether `keyword` (a blank one never matches) is in `response`, both case-folded."""
    word = str(keyword).strip().casefold()
    if not word:
        return False
    text = response.casefold()
    if not whole_word:
        return word in text
    return re.search(r"(?<!\w)" + re.escape(word) + r"(?!\w)", text) is not None


def reward_fn(generated_text, ground_truth):
    """Seed 002 §1.3's name and signature (a float): the countdown_subset rule."""
    return countdown_reward_fn(generated_text, ground_truth, require_all=False)["reward"]


REWARD_FNS = {
    "r1_zero": r1_zero_reward_fn,
    "question_only": question_only_reward_fn,
    "intellect": intellect_reward_fn,
    "gsm8k": gsm8k_reward_fn,
    "countdown": countdown_reward_fn,
    "keyword": keyword_inclusion_reward_fn,  # seed 004: substring, case-insensitive
    "keyword_whole_word": partial(keyword_inclusion_reward_fn, whole_word=True),
    "countdown_subset": partial(countdown_reward_fn, require_all=False),  # seed 002's rule
}


def is_correct(grades):
    """The one meaning of "correct": a reward dict whose answer reward is 1 (the format reward and
    any shaping aside). eval/accuracy, the responses expert iteration keeps and the all-correct /
    all-wrong group fractions all count this."""
    return grades["answer_reward"] >= 1


# ----------------------------------------------------------------------------- reasoning language
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # Chinese characters (CJK ideographs)
# Han, kana and Hangul: scripts written without spaces, so each character counts as one word
CJK = HAN + "\u3040-\u30ff\uac00-\ud7af"
# a word: one CJK character, or a maximal run of other letters (any script; digits, "_",
# punctuation and symbols are not letters)
WORD = re.compile(rf"[{CJK}]|[^\W\d_{CJK}]+")
# --target-language: is this word in the language?
LANGUAGES = {
    "en": lambda word: word.isascii(),  # ASCII letters only
    "zh": lambda word: re.fullmatch(f"[{HAN}]", word) is not None,  # one Chinese character
}


def reasoning(response):
    """The reasoning part of a response: the text before its first "</think>" or "<answer>"
    (whichever comes first; the whole response when it has neither), "<think>" tags removed. The
    prompt is not part of a response, and the answer is cut off."""
    end = len(response)
    for tag in ("</think>", "<answer>"):
        at = response.find(tag)
        if 0 <= at < end:
            end = at
    return response[:end].replace("<think>", "")


def language_fraction(response, language="en"):
    """DeepSeek-R1's language-consistency score: the fraction of the reasoning's words (WORD, in
    `reasoning(response)`) that are in `language` (LANGUAGES); 0.0 when the reasoning has no word,
    or the response is longer than MAX_RESPONSE_CHARS (unread). One pass over the text."""
    if not _readable(response):
        return 0.0
    words = WORD.findall(reasoning(response))
    if not words:
        return 0.0
    in_language = LANGUAGES[language]
    return len([w for w in words if in_language(w)]) / len(words)


# ----------------------------------------------------------------------------- worker pool
_POOLS = {}  # (pid, workers) -> pebble ProcessPool; a forked child never uses its parent's
_LOCK = threading.Lock()


def _stop_pools():
    """At exit: stop this process's pools. No worker may still be starting then (it would fail
    without our semaphores, loudly)."""
    mine = [pool for (pid, _), pool in _POOLS.items() if pid == os.getpid()]
    for pool in mine:
        pool.stop()
        pool.join()


def _start_worker():
    # pebble stops a timed-out worker by SIGTERM: die even in C code
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # one-time warm-up before the worker takes a task (a task's clock starts then)
    _sympy_equal("1", "2")


def _pool(workers=None):
    """This process's pool of `workers` processes (None: the largest it has, else one). They fork
    from multiprocessing's forkserver: single-threaded, so safe next to torch/vLLM/Ray threads."""
    # imported here: `import grader` (and data.py) stays light for scripts that never need it
    from pebble import ProcessPool

    with _LOCK:
        mine = {w: p for (pid, w), p in _POOLS.items() if pid == os.getpid() and p.active}
        if not workers:
            workers = max(mine, default=1)
        if workers not in mine:
            me = multiprocessing.current_process()
            if me.daemon:
                # multiprocessing refuses children to a daemonic process (a Pool worker) lest they
                # outlive it; pebble's exit with their parent
                me.daemon = False
            context = multiprocessing.get_context("forkserver")
            pool = ProcessPool(workers, initializer=_start_worker, context=context)
            mine[workers] = pool
            _POOLS[(os.getpid(), workers)] = pool
            # registered after pebble's own exit hook, so that it runs first
            atexit.unregister(_stop_pools)
            atexit.register(_stop_pools)
        return mine[workers]


def _run(fn, items, start):
    """In a worker: [fn(r, g) for r, g in items]; an error names its item and is re-raised in the
    caller."""
    out = []
    for i, (r, g) in enumerate(items, start):
        try:
            out.append(fn(r, g))
        except Exception as e:  # e.g. a bad ground truth
            raise ValueError(f"grading item {i}: {type(e).__name__}: {e}") from None
    return out


def _result(future, on_kill):
    """The future's result, or on_kill if its worker was killed or died."""
    try:
        return future.result()
    except OSError:
        # pebble's TimeoutError (killed at its limit) or ProcessExpired (it died); a new worker
        # takes its place
        return on_kill


def grade_batch(fn, responses, ground_truths, workers=None):
    """[fn(r, g) for r, g in zip(...)] in input order, on a pool of `workers` processes (default
    os.cpu_count(); 0 = here). fn must be picklable (a grader function or a functools.partial of
    one), else it runs here. Items go in chunks of <= CHUNK with HARD_LIMIT_S per item; a chunk
    over its limit is killed and graded again item by item: the item that overruns gets the
    all-zero verdict, after <= (CHUNK + 1) * HARD_LIMIT_S."""
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
    if workers is None:
        workers = os.cpu_count() or 1
    try:
        pickle.dumps(fn)
    except Exception:  # a lambda or a local function cannot reach a worker: grade here
        workers = 0
    if workers <= 0 or not responses:
        return [fn(r, g) for r, g in zip(responses, ground_truths)]
    pool = _pool(workers)
    items = list(zip(responses, ground_truths))
    # ceil(len(items) / (4 * workers)): >= 4 chunks per worker balance the load
    size = max(1, min(CHUNK, -(-len(items) // (4 * workers))))

    def submit(part, start):
        return pool.schedule(_run, (fn, part, start), timeout=HARD_LIMIT_S * len(part))

    parts = [(start, items[start : start + size]) for start in range(0, len(items), size)]
    futures = [submit(part, start) for start, part in parts]
    out = []
    try:
        for (start, part), future in zip(parts, futures):
            on_kill = None  # a chunk over its limit: graded again below
            if len(part) == 1:
                on_kill = [dict(ZERO)]
            res = _result(future, on_kill)
            if res is None:  # a slow chunk: item by item
                singles = [submit([item], i) for i, item in enumerate(part, start)]
                res = [_result(single, [dict(ZERO)])[0] for single in singles]
            out += res
        return out
    finally:  # after an error nothing keeps running for us
        for future in futures:
            future.cancel()
