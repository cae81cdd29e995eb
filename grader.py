"""Reward functions: fn(response: str, ground_truth) -> {"reward", "format_reward", "answer_reward"}.

Pure (no printing, no randomness); no verdict takes more than ~1 s whatever the input (after a
one-time ~1 s sympy warm-up). Math equivalence = light normalisation with an exact fast path (string
/ rational equality: GSM8K-style answers never reach sympy) + math-verify (sympy). The time bound:
  1. a guard keeps long answers, unbalanced braces, huge literals, big/nested exponents and big
     factorials away from sympy (they are compared as strings/numbers only);
  2. in a main thread, math-verify runs under a sub-second setitimer alarm (its own timeouts are
     whole-second signal.alarm that refuse threads, so they are off); no signal can stop C code;
  3. in other threads the sympy step runs in a helper process (`grader._serve`, via subprocess, so
     it works in daemonic workers and Ray actors); one silent for HARD_LIMIT_S is killed and the
     verdict is "not equal". `grade_batch` runs whole verdicts on a pool of these helpers.

Countdown decision: seed 002 says "each number n_i must be used in E exactly once", but its
`_validate_numbers` accepts a subset. `countdown_reward_fn` requires ALL numbers, each exactly once
(the problem statement; the Countdown-Tasks-3to4 convention); require_all=False (functools.partial)
gives the subset rule. `_validate_numbers` keeps the subset default so the seed's asserts hold.
"""
import ast, logging, operator, os, pickle, re, select, signal, struct, subprocess, sys, threading, time  # noqa: E401
from collections import Counter
from fractions import Fraction
from functools import lru_cache

from data import gsm8k_answer, last_boxed

SYMPY_BUDGET_S = 0.6   # wall budget of the sympy step of one verdict
HARD_LIMIT_S = 1.0     # a helper silent this long on one item is killed
MAX_SYMPY_CHARS = 256  # longer answers never reach sympy
MAX_EXPR_CHARS = 1000  # longer answers: not normalised, and an invalid countdown expression (0.1)
ZERO = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}
_verdict = lambda fmt, ans, reward=None: {"reward": float(ans if reward is None else reward),  # noqa: E731
                                          "format_reward": float(fmt), "answer_reward": float(ans)}
logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns once that we disabled its timeouts


# ----------------------------------------------------------------------------- normalisation
def _clean(s):
    """Light, LaTeX-preserving normalisation of one final answer."""
    if len(s := str(s).strip()) > MAX_EXPR_CHARS:
        return s
    s = (last_boxed(s) or s).strip()
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\(left|right|displaystyle)\b|\\[!,;: ]|\^\s*\{?\\circ\}?|\\circ|°|\\?%|\\?\$", " ", s)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s).strip().rstrip(".").strip()
    if s.count("=") == 1 and re.match(r"^\\?[a-zA-Z]\w*\s*=", s):  # "x = 5" -> "5"
        s = s.split("=", 1)[1].strip()
    m = re.fullmatch(r"(-?[\d,]*\.?\d+)\s+[a-zA-Z]{2,}(\s+[a-zA-Z]+)?", s)  # "18 dollars", "10 cm"
    s = m.group(1) if m else s
    return s.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s) else s  # thousands separators


def _number(k):
    """Exact value of a normalised plain number, decimal, a/b or \\frac{a}{b}; else None."""
    m = re.fullmatch(r"(-?)(?:\\frac(?:\{(\d+)\}|(\d))(?:\{(\d+)\}|(\d))|(\d+)/(\d+))", k) if len(k) < 60 else None
    if m and int(m.group(4) or m.group(5) or m.group(7)):
        num, den = int(m.group(2) or m.group(3) or m.group(6)), int(m.group(4) or m.group(5) or m.group(7))
        return Fraction(-num if m.group(1) else num, den)
    return Fraction(k) if len(k) < 60 and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)", k) else None


def _safe_for_sympy(s):
    """False for inputs that could keep sympy busy for long (in C code, where no signal helps)."""
    if len(s) > MAX_SYMPY_CHARS or re.search(r"\d{40,}", s):
        return False
    t = s
    while (u := re.sub(r"\{[^{}]*\}", "", t)) != t:  # balanced braces
        t = u
    exps = re.findall(r"(?:\^|\*\*)\s*[{(]?\s*[-+]?\s*(\d+)", s)
    return not ("{" in t or "}" in t or any(len(e) >= 4 for e in exps) or sum(len(e) >= 2 for e in exps) >= 2
                or re.search(r"(?:\^|\*\*)\s*\{[^{}]*(?:\^|\*\*)|(?:\^|\*\*)\s*[\w.\\]+\s*(?:\^|\*\*)|\\uparrow", s)
                or re.search(r"\d{3,}\s*!|!\s*\)?\s*!|\)\s*!", s))  # nested exponents, big factorials


class _Timeout(BaseException):  # not Exception: math-verify's `except Exception` must not swallow it
    def on_alarm(signum, frame):  # the SIGALRM handler
        raise _Timeout()


_WARMUP = ["x^2+2x+1", "(x+1)^2", "[1,2)", "(3,\\pi)", "\\left( 3, \\frac{\\pi}{2} \\right)", "\\frac{\\sqrt{3}}{2}", "\\{1,2\\}",
           "(-\\infty, 2] \\cup (3, 5)", "y \\le 3", "\\text{(A)}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\log_2 8", "\\sin x"]


def _sympy_equal(pred, gold):
    """math-verify equivalence under a sub-second alarm (call it in a main thread only)."""
    from math_verify import parse, verify
    if not getattr(_sympy_equal, "warm", False):  # one-time ~1 s of lazy imports and parser caches, not under the alarm
        _sympy_equal.warm = [verify(parse(f"${a}$"), parse(f"${b}$")) for a, b in zip(_WARMUP, _WARMUP[1:])]
    old = signal.signal(signal.SIGALRM, _Timeout.on_alarm) or signal.SIG_DFL
    try:
        try:  # the alarm re-fires every 50 ms in case something swallows it
            signal.setitimer(signal.ITIMER_REAL, SYMPY_BUDGET_S, 0.05)
            g, p = parse(f"${gold}$", parsing_timeout=None), parse(f"${pred}$", parsing_timeout=None)
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
    return grade_batch(_sympy_equal, [pred], [gold], workers=1)[0] is True  # a stuck helper gives ZERO


def math_equal(pred, gold):
    """Is the answer `pred` equivalent to the reference `gold` (both strings)? Bounded time."""
    cp, cg = _clean(pred), _clean(gold)
    kp, kg = re.sub(r"\s+", "", cp), re.sub(r"\s+", "", cg)
    if not kp or not kg or kp == kg:
        return bool(kp) and kp == kg
    np_, ng = _number(kp), _number(kg)
    if (np_ is not None and ng is not None) or kp.count(",") != kg.count(","):  # 5 vs (1,2): no sympy
        return np_ is not None and np_ == ng
    return _safe_for_sympy(cp) and _safe_for_sympy(cg) and _sympy_equal_any_thread(cp, cg)


def _any_equal(pred, ground_truth):
    ground_truth = [ground_truth] if isinstance(ground_truth, (str, int, float, Fraction)) else ground_truth
    if not isinstance(ground_truth, (list, tuple)):
        raise ValueError(f"ground truth must be a string, a number or a list of strings, got {type(ground_truth).__name__}")
    return any(math_equal(pred, str(g)) for g in ground_truth)


def _check(response):
    if not isinstance(response, str):
        raise ValueError(f"response must be a str, got {type(response).__name__}")


def _extract_answer(text):
    """Seed 002 helper: content of the last <answer>...</answer>, or None."""
    i = text.rfind("<answer>")
    j = text.find("</answer>", i) if i >= 0 else -1
    return text[i + 8:j].strip() if 0 <= i < j else None


def _answer_is(response):
    """Text after the last 'answer is' (', answer is:') marker, or None."""
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
    ans = ans if ans is not None else response.rsplit("####", 1)[1][:200] if "####" in response else _answer_is(response)
    nums = re.findall(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+", (response if ans is None else ans)[-2000:])
    return _verdict(ans is not None, bool(nums) and _number(nums[-1].replace(",", "")) == gold)


# ----------------------------------------------------------------------------- countdown
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _eval_exact(expr):
    """Exact Fraction value of an expression of positive integers, + - * / and parentheses, else None.
    Parsed with ast (never eval); unary minus, powers, calls, floats, unicode operators -> None."""
    if len(expr := str(expr)) > MAX_EXPR_CHARS or not re.fullmatch(r"[\d\s+\-*/()]+", expr):
        return None

    def ev(node):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        raise ValueError("disallowed syntax")
    try:
        return ev(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def _evaluate_equation(equation_str):
    """Seed 002 helper: float value of the equation, or None if invalid (incl. division by zero)."""
    return None if (v := _eval_exact(equation_str)) is None else float(v)


def _validate_numbers(equation_str, available_numbers, require_all=False):
    """Seed 002 helper: the equation's numbers are a sub-multiset of available_numbers (each used at
    most once); with require_all, exactly that multiset (each used exactly once)."""
    used = Counter(int(x) for x in re.findall(r"\d+", str(equation_str)))
    avail = Counter(int(x) for x in available_numbers)
    return used == avail if require_all else not (used - avail)


def _countdown_steps(answer, numbers, target, require_all):
    """'Step k: a op b = c' lines: each left side uses available numbers (originals or earlier
    results) once and equals its right side; the last result is the target."""
    orig, inter, last = Counter(Fraction(n) for n in numbers), Counter(), None
    for step in re.split(r"Step\s*\d+\s*:", answer)[1:]:
        lhs, eq, rhs = step.strip().partition("=")
        val, stated = _eval_exact(lhs), _eval_exact(rhs.strip().split("\n")[0])
        if not eq or val is None or val != stated:
            return False
        for lit in map(Fraction, re.findall(r"\d+", lhs)):
            pool = inter if inter[lit] else orig  # an earlier result before an original number
            if not pool[lit]:
                return False
            pool[lit] -= 1
        inter[val], last = inter[val] + 1, val
    return last == target and (not require_all or (sum(orig.values()) == 0 and sum(inter.values()) == 1))


def countdown_reward_fn(response, ground_truth, require_all=True):
    """Seed 002 §1.3: 1.0 correct; 0.1 an <answer> tag with a wrong value, wrong/reused numbers or an
    invalid expression; 0.0 no <answer>...</answer>. The answer is one expression (optionally
    '= target') or 'Step k:' lines. require_all: every number used exactly once (module docstring)."""
    _check(response)
    numbers, target = list(ground_truth["numbers"]), Fraction(ground_truth["target"])
    if (ans := _extract_answer(response)) is None:
        return dict(ZERO)
    if re.search(r"Step\s*\d+\s*:", ans):
        ok = _countdown_steps(ans, numbers, target, require_all)
    else:
        lhs, _, rhs = ans.partition("=")
        val = _eval_exact(lhs)
        ok = (val is not None and val == target and _validate_numbers(lhs, numbers, require_all)
              and (not rhs.strip() or _eval_exact(rhs) == val))
    return _verdict(1.0, ok, 1.0 if ok else 0.1)


def keyword_inclusion_reward_fn(response, keywords):
    """Seed 004: 1 iff every keyword appears in the response as a whole word, case-insensitively."""
    _check(response)
    kws = [keywords] if isinstance(keywords, str) else list(keywords)
    ok = bool(kws) and all(re.search(r"(?<!\w)" + re.escape(str(k).strip()) + r"(?!\w)", response, re.I) for k in kws)
    return _verdict(bool(response.strip()), ok)


REWARD_FNS = {"r1_zero": r1_zero_reward_fn, "question_only": question_only_reward_fn, "intellect": intellect_reward_fn,
              "gsm8k": gsm8k_reward_fn, "countdown": countdown_reward_fn, "keyword": keyword_inclusion_reward_fn}


# ----------------------------------------------------------------------------- helper processes
def _send(fd, obj):
    data = struct.pack("<I", len(p := pickle.dumps(obj))) + p
    while data:
        data = data[os.write(fd, data):]


def _serve():
    """Helper process loop: read (fn, [(i, args), ...]) frames on stdin, stream (i, ok, result) back."""
    inp, out = sys.stdin.buffer, sys.stdout.fileno()
    sys.stdout = sys.stderr  # a stray print must not corrupt the pipe
    _sympy_equal("1", "2")  # warm up before announcing readiness
    _send(out, "ready")
    while len(hdr := inp.read(4)) == 4:
        fn, items = pickle.loads(inp.read(struct.unpack("<I", hdr)[0]))
        for i, args in items:
            try:
                _send(out, (i, True, fn(*args)))
            except Exception as e:  # e.g. a bad ground truth: re-raised in the caller
                _send(out, (i, False, f"{type(e).__name__}: {e}"))


class _Helper:
    """One `grader._serve` subprocess and the framed pipes to it; __init__ starts it, wait_ready() waits."""
    def __init__(self):
        code = f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import grader; grader._serve()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.fd, self.buf, self.pid, self.ready = self.proc.stdout.fileno(), b"", os.getpid(), False

    def wait_ready(self):
        if not self.ready and self.recv(timeout=120) != ["ready"]:
            self.kill()
            raise RuntimeError(f"grader helper process failed to start (exit code {self.proc.poll()})")
        self.ready = True
        return self

    def recv(self, timeout):
        """The messages that arrive within `timeout` s: waits for at least one, [] if none came."""
        msgs, end = [], time.monotonic() + timeout
        while not msgs:
            if not select.select([self.fd], [], [], max(0.0, end - time.monotonic()))[0]:
                return msgs
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"grader helper process died (exit code {self.proc.wait()})")
            self.buf += chunk
            while len(self.buf) >= 4 and len(self.buf) >= 4 + (n := struct.unpack("<I", self.buf[:4])[0]):
                msgs.append(pickle.loads(self.buf[4:4 + n]))
                self.buf = self.buf[4 + n:]
        return msgs

    def kill(self):
        self.proc.kill()
        self.proc.wait()


_IDLE, _LOCK = [], threading.Lock()


def _checkout(n):
    with _LOCK:
        _IDLE[:] = [h for h in _IDLE if h.pid == os.getpid() and h.proc.poll() is None]  # not a forked copy
        got = [_IDLE.pop() for _ in range(min(n, len(_IDLE)))]
    return [h.wait_ready() for h in got + [_Helper() for _ in range(n - len(got))]]  # new ones start in parallel


def _checkin(helpers):
    with _LOCK:
        _IDLE.extend(h for h in helpers if h.proc.poll() is None)


def warmup(workers=1):
    """Start `workers` helpers now (~1-2 s, in parallel), so no threaded verdict / grade_batch waits."""
    _checkin(_checkout(workers))


def grade_batch(fn, responses, ground_truths, workers=None):
    """[fn(r, g) for r, g in zip(...)] in input order, on `workers` helper processes (default
    os.cpu_count(); 0 = in this process). An item a helper is stuck on for HARD_LIMIT_S gets the
    all-zero verdict and that helper is killed. fn must be picklable (a grader function or a
    functools.partial of one); other callables are graded in this process."""
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
    workers = (os.cpu_count() or 1) if workers is None else workers
    try:
        pickle.dumps(fn)
    except Exception:
        workers = 0
    if workers <= 0 or not responses:
        return [fn(r, g) for r, g in zip(responses, ground_truths)]
    n = len(responses)
    size = max(1, min(64, -(-n // (4 * workers))))  # ~4 chunks per helper balance the load
    todo = [list(range(s, min(n, s + size))) for s in range(0, n, size)]
    helpers, results, busy = _checkout(min(workers, len(todo))), [None] * n, {}
    try:
        while todo or busy:
            for h in helpers:
                if h not in busy and todo:
                    idx = todo.pop(0)
                    _send(h.proc.stdin.fileno(), (fn, [(i, (responses[i], ground_truths[i])) for i in idx]))
                    busy[h] = [idx, time.monotonic()]  # [pending items in order, time of last progress]
            wait = min(t + HARD_LIMIT_S for _, t in busy.values()) - time.monotonic()
            ready = set(select.select([h.fd for h in busy], [], [], max(0.0, wait))[0])
            for h in list(busy):
                msgs = h.recv(0) if h.fd in ready else []
                for i, ok, res in msgs:
                    if not ok:
                        raise ValueError(f"grading item {i}: {res}")
                    results[i] = res
                    busy[h][0].remove(i)
                    busy[h][1] = time.monotonic()
                if not busy[h][0]:
                    del busy[h]
                elif not msgs and time.monotonic() - busy[h][1] > HARD_LIMIT_S:
                    pending = busy.pop(h)[0]  # a helper works in order: the first pending item is stuck
                    results[pending[0]] = dict(ZERO)
                    h.kill()  # go on with the others
                    helpers.remove(h)
                    todo[:0] = [pending[1:]] if pending[1:] else []
                    if todo and not helpers:
                        helpers.append(_Helper().wait_ready())
                    else:  # a spare starts in the background, so the next call does not wait for it
                        _checkin([_Helper()])
    except BaseException:
        for h in busy:  # their pipes hold unread work: never reuse them
            h.kill()
        raise
    finally:
        _checkin(helpers)
    return results
