"""Reward functions: fn(response: str, ground_truth) -> {"reward", "format_reward", "answer_reward"}.

Pure (no printing, no randomness); no verdict takes more than ~1 s whatever the input (after a ~1 s sympy warm-up).
Math equivalence = light normalisation, an exact fast path (string / rational equality), then math-verify (sympy),
which never sees long answers, unbalanced braces, huge literals, big/nested exponents, big factorials, logic (read as
one operand: "\\neg 5" is 5, "5 \\lor 6" is 6), or set operations and relations ("5 \\cup 6", "5 | 6") the reference
lacks. Time bound: in a main thread a sub-second setitimer alarm (its own signal.alarm timeouts refuse threads: off);
elsewhere a pebble ProcessPool worker, killed at HARD_LIMIT_S (verdict "not equal") and replaced: `grade_batch` grades
on that pool (Ray actors too); its forkserver imports the main script, which needs the `__main__` guard.

Countdown: seed 002 says "each number n_i must be used in E exactly once", but its `_validate_numbers` accepts a subset.
"countdown" requires ALL numbers, once each (the problem statement, Countdown-Tasks-3to4); "countdown_subset",
`reward_fn` (the seed's float) and `_validate_numbers`'s default follow the seed's code.
"""

import ast  # noqa: E401
import atexit
import logging
import multiprocessing
import operator
import os
import pickle
import re
import signal
import threading
from collections import Counter
from fractions import Fraction
from functools import lru_cache, partial

SYMPY_BUDGET_S = 0.6  # wall budget of the sympy step of one verdict
HARD_LIMIT_S = (
    1.0  # an item running this long in a pool worker is killed with the worker (grade_batch)
)
CHUNK = 8  # items per pool task in grade_batch (a task costs ~0.1 ms of pool overhead)
MAX_SYMPY_CHARS = 256  # longer answers never reach sympy
MAX_EXPR_CHARS = 1000  # longer answers: not normalised, and an invalid countdown expression (0.1)
ZERO = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}
_verdict = lambda fmt, ans, reward=None: {
    "reward": float(ans if reward is None else reward),  # noqa: E731
    "format_reward": float(fmt),
    "answer_reward": float(ans),
}
logging.getLogger("math_verify").setLevel(
    logging.ERROR
)  # it warns once that we disabled its timeouts


# ----------------------------------------------------------------------------- answers
def last_boxed(text):
    """Content of the last \\boxed{...} / \\fbox{...} in text (brace-matched), or None."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    j = text.find("{", i)
    if j < 0 or text[i:j].strip() not in ("\\boxed", "\\fbox"):
        m = re.match(r"\\boxed ([^\s$]+)", text[i:])  # "\boxed 5" form
        return m.group(1) if m else None
    depth = 0
    for k in range(j, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[j + 1 : k]
    return None  # unbalanced


def gsm8k_answer(solution):
    """'... #### 1,234' -> '1234'."""
    if "####" not in solution:
        raise ValueError(f"GSM8K answer has no '####': {solution[-80:]!r}")
    return solution.split("####")[-1].strip().replace(",", "")


def math_answer(text):
    """Final answer of a MATH solution: last \\boxed{}, else the text after 'The answer is:', else text."""
    if (b := last_boxed(text)) is not None:
        return b.strip()
    m = re.search(r"The answer is:?\s*(.+?)\s*$", text, re.S)
    return (m.group(1) if m else text).strip()


# ----------------------------------------------------------------------------- normalisation
def _clean(s):
    """Light, LaTeX-preserving normalisation of one final answer."""
    if len(s := str(s).strip()) > MAX_EXPR_CHARS:
        return s
    s = (last_boxed(s) or s).strip()
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(
        r"\\(left|right|displaystyle)\b|\\[!,;: ]|\^\s*\{?\\circ\}?|\\circ|°|\\?%|\\?\$", " ", s
    )
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s).strip().rstrip(".").strip()
    if s.count("=") == 1 and re.match(r"^\\?[a-zA-Z]\w*\s*=", s):  # "x = 5" -> "5"
        s = s.split("=", 1)[1].strip()
    m = re.fullmatch(r"(-?[\d,]*\.?\d+)\s+[a-zA-Z]{2,}(\s+[a-zA-Z]+)?", s)  # "18 dollars", "10 cm"
    s = m.group(1) if m else s
    return (
        s.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s) else s
    )  # thousands separators


def _number(k):
    """Exact value of a normalised plain number, decimal, a/b or \\frac{a}{b}; else None."""
    m = (
        re.fullmatch(r"(-?)(?:\\frac(?:\{(\d+)\}|(\d))(?:\{(\d+)\}|(\d))|(\d+)/(\d+))", k)
        if len(k) < 60
        else None
    )
    if m and int(m.group(4) or m.group(5) or m.group(7)):
        num, den = (
            int(m.group(2) or m.group(3) or m.group(6)),
            int(m.group(4) or m.group(5) or m.group(7)),
        )
        return Fraction(-num if m.group(1) else num, den)
    return Fraction(k) if len(k) < 60 and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)", k) else None


def _safe_for_sympy(s):
    """False for inputs that could keep sympy busy for long (in C code: no signal helps) and logic statements."""
    if len(s) > MAX_SYMPY_CHARS or re.search(r"\d{40,}", s):
        return False
    t = s
    while (u := re.sub(r"\{[^{}]*\}", "", t)) != t:  # balanced braces
        t = u
    exps = re.findall(r"(?:\^|\*\*)\s*[{(]?\s*[-+]?\s*(\d+)", s)
    return not (
        "{" in t
        or "}" in t
        or any(len(e) >= 4 for e in exps)
        or sum(len(e) >= 2 for e in exps) >= 2
        or re.search(
            r"\\(neg|lnot|lor|land|vee|wedge|oplus|implies|iff|to|([Ll]eft|[Rr]ight)+arrow)(?![a-z])",
            s,
        )
        or re.search(
            r"(?:\^|\*\*)\s*\{[^{}]*(?:\^|\*\*)|(?:\^|\*\*)\s*[\w.\\]+\s*(?:\^|\*\*)|\\uparrow", s
        )
        or re.search(r"\d{3,}\s*!|!\s*\)?\s*!|\)\s*!", s)
    )  # nested exponents, big factorials


def _ops(
    s,
):  # what math-verify reads as one operand ("5 \cup 6", "5 | 6", "5 ∨ 6": 6); not \in ("x \in [2, 5)")
    s = s.translate(
        {ord("∪"): r" \cup ", ord("∩"): r" \cap ", ord("∖"): r" \setminus "}
    )  # one spelling each
    ops = re.findall(
        r"\\(?:cup|cap|setminus|backslash|parallel|perp|su[bp]set(?:eq)?|otimes)(?![a-z])|[¬∨∧]"
        r"|\\operatorname\{(?i:not|or|and|xor)\}",
        s,
    )  # set operations, relations, logic
    bars = re.findall(
        r"\\(?:[lr]?[vV]ert|mid)(?![a-z])|\|", s
    )  # \mid is a bar: {x \mid x > 2} = {x | x > 2}
    return set(ops) | ({"|"} if len(bars) % 2 else set())  # |x| pairs up


class _Timeout(
    BaseException
):  # not Exception: math-verify's `except Exception` must not swallow it
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


def _sympy_equal(pred, gold):
    """math-verify equivalence under a sub-second alarm (call it in a main thread only)."""
    from math_verify import parse, verify

    if not getattr(
        _sympy_equal, "warm", False
    ):  # one-time ~1 s of lazy imports and parser caches, not under the alarm
        _sympy_equal.warm = [
            verify(parse(f"${a}$"), parse(f"${b}$")) for a, b in zip(_WARMUP, _WARMUP[1:])
        ]
    old = signal.signal(signal.SIGALRM, _Timeout.on_alarm) or signal.SIG_DFL
    try:
        try:  # the alarm re-fires every 50 ms in case something swallows it
            signal.setitimer(signal.ITIMER_REAL, SYMPY_BUDGET_S, 0.05)
            g, p = (
                parse(f"${gold}$", parsing_timeout=None),
                parse(f"${pred}$", parsing_timeout=None),
            )
            return bool(g and p and verify(g, p, timeout_seconds=None))
        finally:  # a late alarm raised in here is still caught below
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Timeout:
        return False
    finally:
        signal.signal(signal.SIGALRM, old)


@lru_cache(maxsize=1 << 14)
def _sympy_equal_any_thread(pred, gold):  # args are <= MAX_SYMPY_CHARS, so the cache stays small
    if threading.current_thread() is threading.main_thread():
        return _sympy_equal(pred, gold)
    return _result(
        _pool().schedule(_sympy_equal, (pred, gold), timeout=HARD_LIMIT_S), False
    )  # killed: not equal


def math_equal(pred, gold):
    """Is the answer `pred` equivalent to the reference `gold` (both strings)? Bounded time."""
    cp, cg = _clean(pred), _clean(gold)
    kp, kg = re.sub(r"\s+", "", cp), re.sub(r"\s+", "", cg)
    if not kp or not kg or kp == kg:
        return bool(kp) and kp == kg
    np_, ng = _number(kp), _number(kg)
    if (np_ is not None and ng is not None) or kp.count(",") != kg.count(
        ","
    ):  # 5 vs (1,2): no sympy
        return np_ is not None and np_ == ng
    return (
        _safe_for_sympy(cp)
        and _safe_for_sympy(cg)
        and _ops(cp) == _ops(cg)
        and _sympy_equal_any_thread(cp, cg)
    )


def _any_equal(pred, ground_truth):
    ground_truth = (
        [ground_truth] if isinstance(ground_truth, (str, int, float, Fraction)) else ground_truth
    )
    if not isinstance(ground_truth, (list, tuple)):
        raise ValueError(
            f"ground truth must be a string, a number or a list of strings, got {type(ground_truth).__name__}"
        )
    return any(math_equal(pred, str(g)) for g in ground_truth)


def _check(response):
    if not isinstance(response, str):
        raise ValueError(f"response must be a str, got {type(response).__name__}")


def _extract_answer(text):  # seed 002 helper: content of the last <answer>...</answer>, or None
    i = text.rfind("<answer>")
    j = text.find("</answer>", i) if i >= 0 else -1
    return text[i + 8 : j].strip() if 0 <= i < j else None


def _answer_is(response):  # text after the last 'answer is' (', answer is:') marker, or None
    m = list(re.finditer(r"answer is:?\s*([^\n]{1,200})", response[-5000:], re.I))
    return m[-1].group(1).strip().rstrip(".") if m else None


# ----------------------------------------------------------------------------- math rewards
def r1_zero_reward_fn(response, ground_truth):
    """Strict r1_zero format ('</think> <answer>' and '</answer>'); answer = last <answer>...</answer>,
    a \\boxed{} inside it unwrapped. Formatted but wrong: format 1, reward 0."""
    _check(response)
    if "</think> <answer>" not in response or "</answer>" not in response:
        return dict(ZERO)
    return _verdict(1.0, _any_equal(_extract_answer(response) or "", ground_truth))


def question_only_reward_fn(response, ground_truth):
    """Plain response (question_only prompt): grade the last \\boxed{} (else 'The answer is X')."""
    _check(response)
    ans = last_boxed(response) or _answer_is(response)
    return dict(ZERO) if ans is None else _verdict(1.0, _any_equal(ans, ground_truth))


def intellect_reward_fn(response, ground_truth):
    """MATH with the intellect prompt. format 1 iff 'final answer is: $\\boxed{...}$' is there; the
    answer (last \\boxed{}, else 'answer is X') is graded either way; reward = answer."""
    _check(response)
    fmt = bool(re.search(r"final answer is:?\s*\$?\\boxed\{", response, re.I))
    ans = last_boxed(response) or _answer_is(response)
    return _verdict(fmt, ans is not None and _any_equal(ans, ground_truth))


def gsm8k_reward_fn(response, ground_truth):
    """GSM8K numeric equality. Answer: last <answer>...</answer>, else after the last '####', else after
    'answer is', else the whole response; its last number is compared exactly ('$1,234.00.' == 1234).
    format 1 iff one of those markers was found. ground_truth: the number or a solution '... #### N'."""
    _check(response)
    gt = str(ground_truth)
    gold = _number(gsm8k_answer(gt) if "####" in gt else gt.replace(",", "").strip())
    if gold is None:
        raise ValueError(f"GSM8K ground truth is not a number: {gt[-80:]!r}")
    ans = _extract_answer(response)
    ans = (
        ans
        if ans is not None
        else response.rsplit("####", 1)[1][:200]
        if "####" in response
        else _answer_is(response)
    )
    nums = re.findall(
        r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|-?\.\d+",
        (response if ans is None else ans)[-2000:],
    )
    return _verdict(ans is not None, bool(nums) and _number(nums[-1].replace(",", "")) == gold)


# ----------------------------------------------------------------------------- countdown
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _eval_exact(expr):
    """Exact Fraction value of an expression of positive integers, + - * / and parentheses, else None.
    Parsed with ast (never eval); unary minus, powers, calls, floats, unicode operators -> None. Line
    breaks are spaces, and a leading zero is dropped (03 is 3, as _validate_numbers reads it)."""
    if len(expr := str(expr)) > MAX_EXPR_CHARS or not re.fullmatch(r"[\d\s+\-*/()]+", expr):
        return None
    expr = re.sub(r"(?<!\d)0+(?=\d)", "", " ".join(expr.split()))

    def ev(node):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        raise ValueError("disallowed syntax")

    try:
        return ev(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def _evaluate_equation(
    equation_str,
):  # seed 002 helper: its float value, None if invalid (incl. division by zero)
    return None if (v := _eval_exact(equation_str)) is None else float(v)


def _validate_numbers(equation_str, available_numbers, require_all=False):
    """Seed 002 helper: the equation's numbers are a sub-multiset of available_numbers (each used at
    most once); with require_all, exactly that multiset (each used exactly once)."""
    used = Counter(int(x) for x in re.findall(r"\d+", str(equation_str)))
    avail = Counter(int(x) for x in available_numbers)
    return used == avail if require_all else not (used - avail)


def _stated(text):
    """Value of a right side: an expression ('3/2') or a decimal ('1.5'); a closing period is dropped."""
    text = text.strip().rstrip(".")
    return Fraction(text) if re.fullmatch(r"\d+\.\d+", text) else _eval_exact(text)


def _countdown_steps(answer, numbers, target, require_all):
    """'Step k: a op b = c' lines: each left side uses available numbers (originals or earlier results) once and equals
    its right side; the last result is the target. An earlier non-integer result is used again as written on its
    right side ('3/2' or '1.5': '6 / 1.5' divides by it), and counts as one number."""
    orig, inter, last = Counter(Fraction(n) for n in numbers), Counter(), None
    for step in re.split(r"Step\s*\d+\s*:", answer)[1:]:
        lhs, eq, rhs = step.strip().partition("=")
        parts, lits = (
            re.split(r"(\d+\.\d+|\d+\s*/\s*\d+(?!\.?\d))", lhs),
            [],
        )  # odd parts: maybe an earlier result
        for k, part in enumerate(parts):
            v = _stated(part) if k % 2 else None
            if v is not None and v.denominator > 1 and inter[v]:
                inter[v], parts[k] = inter[v] - 1, f"({v.numerator}/{v.denominator})"
            else:
                lits += re.findall(r"\d+", part)
        val, stated = _eval_exact("".join(parts)), _stated(rhs.strip().split("\n")[0])
        if not eq or val is None or val != stated:
            return False
        for lit in map(Fraction, lits):
            pool = inter if inter[lit] else orig  # an earlier result before an original number
            if not pool[lit]:
                return False
            pool[lit] -= 1
        inter[val], last = inter[val] + 1, val
    return last == target and (
        not require_all or (sum(orig.values()) == 0 and sum(inter.values()) == 1)
    )


def countdown_reward_fn(response, ground_truth, require_all=True):
    """Seed 002 §1.3: 1.0 correct; 0.1 an <answer> tag with a wrong value, wrong/reused numbers or an invalid
    expression; 0.0 no <answer>...</answer>. The answer is one expression (optionally '= target'; line breaks are
    spaces; 03 = 3: a typo, not an octal or a new number) or 'Step k:' lines. require_all: module docstring."""
    _check(response)
    numbers, target = list(ground_truth["numbers"]), Fraction(ground_truth["target"])
    if (ans := _extract_answer(response)) is None:
        return dict(ZERO)
    if re.search(r"Step\s*\d+\s*:", ans):
        ok = _countdown_steps(ans, numbers, target, require_all)
    else:
        lhs, _, rhs = ans.partition("=")
        val = _eval_exact(lhs)
        ok = (
            val is not None
            and val == target
            and _validate_numbers(lhs, numbers, require_all)
            and (not rhs.strip() or _stated(rhs) == val)
        )
    return _verdict(1.0, ok, 1.0 if ok else 0.1)


def keyword_inclusion_reward_fn(response, keywords):
    """Seed 004: 1 iff every keyword appears in the response as a whole word, case-insensitively."""
    _check(response)
    kws = [keywords] if isinstance(keywords, str) else list(keywords)
    ok = bool(kws) and all(
        re.search(r"(?<!\w)" + re.escape(str(k).strip()) + r"(?!\w)", response, re.I) for k in kws
    )
    return _verdict(bool(response.strip()), ok)


def reward_fn(
    generated_text, ground_truth
):  # seed 002 §1.3's name and signature (a float): countdown_subset
    return countdown_reward_fn(generated_text, ground_truth, require_all=False)["reward"]


REWARD_FNS = {
    "r1_zero": r1_zero_reward_fn,
    "question_only": question_only_reward_fn,
    "intellect": intellect_reward_fn,
    "gsm8k": gsm8k_reward_fn,
    "countdown": countdown_reward_fn,
    "keyword": keyword_inclusion_reward_fn,
    "countdown_subset": partial(countdown_reward_fn, require_all=False),
}  # seed 002's rule (module docstring)


# ----------------------------------------------------------------------------- worker pool
_POOLS, _LOCK = (
    {},
    threading.Lock(),
)  # (pid, workers) -> pebble ProcessPool; a forked child never uses its parent's


def _stop_pools():  # at exit no worker may still be starting (it would fail without our semaphores, loudly)
    for pool in [p for (pid, _), p in _POOLS.items() if pid == os.getpid()]:
        pool.stop(), pool.join()


def _start_worker():
    signal.signal(
        signal.SIGTERM, signal.SIG_DFL
    )  # pebble stops a timed-out worker by SIGTERM: die even in C code
    _sympy_equal(
        "1", "2"
    )  # one-time warm-up before the worker takes a task (a task's clock starts then)


def _pool(workers=None):
    """This process's pool of `workers` processes (None: any it has, else one). They fork from
    multiprocessing's forkserver: single-threaded, so safe next to torch/vLLM/Ray threads."""
    from pebble import (
        ProcessPool,  # here: `import grader` (and data.py) stays light for scripts that never need it
    )

    with _LOCK:
        mine = {w: p for (pid, w), p in _POOLS.items() if pid == os.getpid() and p.active}
        if (workers := workers or max(mine, default=1)) not in mine:
            if (
                me := multiprocessing.current_process()
            ).daemon:  # multiprocessing refuses children to a daemonic
                me.daemon = False  # process (a Pool worker) lest they outlive it; pebble's exit with their parent
            mine[workers] = _POOLS[(os.getpid(), workers)] = ProcessPool(
                workers,
                initializer=_start_worker,
                context=multiprocessing.get_context("forkserver"),
            )
            atexit.unregister(
                _stop_pools
            )  # registered after pebble's own exit hook, so it runs first
            atexit.register(_stop_pools)
        return mine[workers]


def _run(fn, items, start):
    """In a worker: [fn(r, g) for r, g in items]; an error names its item and is re-raised in the caller."""
    out = []
    for i, (r, g) in enumerate(items, start):
        try:
            out.append(fn(r, g))
        except Exception as e:  # e.g. a bad ground truth
            raise ValueError(f"grading item {i}: {type(e).__name__}: {e}") from None
    return out


def _result(future, on_kill):
    try:
        return future.result()
    except OSError:  # pebble's TimeoutError (killed at its limit) or ProcessExpired (it died): a new worker starts
        return on_kill


def grade_batch(fn, responses, ground_truths, workers=None):
    """[fn(r, g) for r, g in zip(...)] in input order, on a pool of `workers` processes (default os.cpu_count();
    0 = here). fn must be picklable (a grader function or a functools.partial of one), else it runs here.
    Items go in chunks of <= CHUNK with HARD_LIMIT_S per item; a chunk over its limit is killed and graded
    again item by item: the item that overruns gets the all-zero verdict, after <= (CHUNK + 1) * HARD_LIMIT_S."""
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
    workers = (os.cpu_count() or 1) if workers is None else workers
    try:
        pickle.dumps(fn)
    except Exception:
        workers = 0
    if workers <= 0 or not responses:
        return [fn(r, g) for r, g in zip(responses, ground_truths)]
    pool, items = _pool(workers), list(zip(responses, ground_truths))
    size = max(
        1, min(CHUNK, -(-len(items) // (4 * workers)))
    )  # >= 4 chunks per worker balance the load
    submit = lambda part, s: pool.schedule(_run, (fn, part, s), timeout=HARD_LIMIT_S * len(part))  # noqa: E731
    parts = [(s, items[s : s + size]) for s in range(0, len(items), size)]
    futures, out = [submit(part, s) for s, part in parts], []
    try:
        for (s, part), f in zip(parts, futures):
            if (
                res := _result(f, [dict(ZERO)] if len(part) == 1 else None)
            ) is None:  # a slow chunk: item by item
                res = [
                    _result(g, [dict(ZERO)])[0]
                    for g in [submit([it], i) for i, it in enumerate(part, s)]
                ]
            out += res
        return out
    finally:  # after an error nothing keeps running for us
        for f in futures:
            f.cancel()
