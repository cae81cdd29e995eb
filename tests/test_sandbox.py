"""sandbox.py: the RL tool `python` (run_tool's output and status for each way a call can end, no
host file or path in what it returns), the bounded ToolPool (order, no process left behind, an
interrupt), and `isolation`. kissing.py's evaluator runs through the same layers: test_kissing.py
holds the escapes and the OS layer alone."""

import glob
import os
import shutil
import signal
import tempfile
import threading
import time

import pytest

import sandbox
from conftest import ROOT, requires_bwrap

MODES = [False, pytest.param(True, marks=requires_bwrap, id="bwrap")]


def children():
    """The PIDs of this process's living children (any thread's)."""
    found = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(path) as f:
                found |= set(f.read().split())
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
    return found


def one_line(output):
    """An error a model sees: one line, no traceback, no file of the host."""
    return "\n" not in output and "Traceback" not in output and 'File "' not in output


@pytest.mark.parametrize("isolated", MODES)
def test_each_way_a_call_ends(isolated):
    cases = [
        # (code, status, the output or, for errors, how it starts)
        ("print('ok')", "ok", "ok\n"),
        ("def broken(:\n", "error", "SyntaxError: "),
        ("print(x)", "error", "NameError: name 'x' is not defined"),
        ("import socket\nsocket.socket()", "error", "PermissionError: sandbox: socket."),
        ("import os\nos.fork()", "error", "PermissionError: sandbox: os.fork is blocked"),
        ("x = bytearray(10**10)", "error", "MemoryError"),
        ("x = []\nwhile True:\n    x.append(' ' * 2**20)", "error", "MemoryError"),
        ("import sys\nsys.exit(3)", "error", "SystemExit: 3"),
        # stdout, then the error line (ToRL's interpreter shows both)
        ("print('partial')\nraise ValueError('bad')", "error", "partial\nValueError: bad"),
    ]
    for code, status, output in cases:
        res = sandbox.run_tool(code, timeout=10, isolated=isolated)
        assert res["status"] == status, (code, res)
        if status == "ok":
            assert res["output"] == output, (code, res)
        else:
            assert res["output"].startswith(output), (code, res)
            assert one_line(res["output"].split("\n")[-1]), (code, res)
        assert one_line(res["output"]) or code.startswith("print"), (code, res)


@pytest.mark.parametrize("isolated", MODES)
def test_host_files_stay_out_of_the_output(isolated, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the test's secret\n")
    with open(os.path.join(ROOT, "sandbox.py")) as f:
        first_line = f.readline().strip()
    for path in (os.path.join(ROOT, "sandbox.py"), "/etc/hostname", str(secret)):
        res = sandbox.run_tool(f"print(open({path!r}).read())", timeout=10, isolated=isolated)
        assert res["status"] == "error", res
        assert one_line(res["output"]), res
        refused = "outside the working directory is blocked" in res["output"]
        assert refused or "No such file" in res["output"], res
        assert first_line not in res["output"]
        assert "the test's secret" not in res["output"]


@pytest.mark.parametrize("isolated", MODES)
def test_a_wall_clock_timeout(isolated):
    t0 = time.monotonic()
    res = sandbox.run_tool("while True:\n    pass\n", timeout=1, isolated=isolated)
    assert time.monotonic() - t0 < 1 + 2
    assert res == {"output": "TimeoutError", "status": "timeout"}


@pytest.mark.parametrize("isolated", MODES)
def test_a_long_output_keeps_its_head_and_tail(isolated):
    code = "print('HEAD' + 'x' * 10**7 + 'TAIL')"
    t0 = time.monotonic()
    res = sandbox.run_tool(code, timeout=10, isolated=isolated, max_chars=1000)
    assert time.monotonic() - t0 < 5
    assert res["status"] == "ok", res
    assert len(res["output"]) <= 1000
    assert res["output"].startswith("HEADxxx")
    assert res["output"].endswith("xxxTAIL\n")
    assert sandbox.CUT in res["output"]
    # the error line fits in the same budget
    res = sandbox.run_tool(code + "\nprint(x)", timeout=10, isolated=isolated, max_chars=1000)
    assert len(res["output"]) <= 1000
    assert res["output"].endswith("xxxTAIL\nNameError: name 'x' is not defined"), res["output"][
        -80:
    ]


def test_middle_truncated_counts_characters_and_reads_a_bounded_amount():
    with tempfile.TemporaryFile() as f:
        f.write(("é" * 50 + "z" * 50).encode())
        assert sandbox.middle_truncated(f, 100) == "é" * 50 + "z" * 50
        assert sandbox.middle_truncated(f, 25) == "é" * 10 + sandbox.CUT + "z" * 10
        f.write(b"y" * (10 << 20))
        assert sandbox.middle_truncated(f, 25) == "é" * 10 + sandbox.CUT + "y" * 10


@pytest.mark.parametrize("isolated", MODES)
def test_sympy_numpy_and_mpmath_work(isolated):
    code = (
        "import numpy as np, sympy, mpmath\n"
        "from typing import NamedTuple\n"
        "class P(NamedTuple):\n"  # namedtuple defaults: a function's __defaults__ set
        "    a: int = 1\n"
        "x = sympy.Symbol('x')\n"
        "print(sympy.factor(x**2 - 1), np.arange(4).sum(), mpmath.mpf(2) ** 10, P())\n"
    )
    res = sandbox.run_tool(code, timeout=30, isolated=isolated)
    assert res == {"output": "(x - 1)*(x + 1) 6 1024.0 P(a=1)\n", "status": "ok"}


@pytest.mark.parametrize("isolated", MODES)
def test_numpy_is_imported_before_the_hook_only_for_code_that_names_a_package(isolated):
    """A package named anywhere in the code gets numpy (and ctypes) before the hook: sympy alone
    imports (its own import loads ctypes); code naming none starts without numpy, and importing it
    by another spelling fails closed."""
    res = sandbox.run_tool("import sympy\nprint(sympy.Integer(6) * 7)", 30, isolated)
    assert res == {"output": "42\n", "status": "ok"}
    res = sandbox.run_tool("import sys\nprint('nu' + 'mpy' in sys.modules)", 30, isolated)
    assert res == {"output": "False\n", "status": "ok"}
    res = sandbox.run_tool("__import__('nu' + 'mpy')", 30, isolated)
    assert res["status"] == "error" and res["output"].startswith("PermissionError: sandbox")


@pytest.mark.parametrize(
    "name, value",
    [
        ("__defaults__", "(None,) * len(hook.__defaults__)"),
        ("__defaults__", "None"),  # deletes them
        ("__code__", "(lambda *a, **k: None).__code__"),
    ],
)
def test_the_hook_refuses_changes_to_itself(name, value):
    """Other functions' defaults may change (namedtuple); the hook's own, found through the frames,
    may not, nor any function's code."""
    code = (
        "import sys\n"
        "f = sys._getframe()\n"
        "while f.f_back:\n"
        "    f = f.f_back\n"
        "hook = f.f_globals['hook']\n"
        f"hook.{name} = {value}\n"
        "print('escaped')\n"
    )
    res = sandbox.run_tool(code, timeout=10, isolated=False)
    assert res == {
        "output": f"PermissionError: sandbox: setting {name} is blocked",
        "status": "error",
    }


def test_pool_runs_in_order_and_leaves_no_process():
    """200 calls through 8 workers, under bwrap where it works, the mode a run uses."""
    isolated = shutil.which("bwrap") is not None
    before = children()
    codes = []
    for i in range(200):
        codes.append(f"print({i} * 2)")
    codes[7] = "while True:\n    pass\n"  # one timeout among them
    with sandbox.ToolPool(8, timeout=3, isolated=isolated) as pool:
        results = pool.run(codes)
    assert len(results) == 200
    assert results[7] == {"output": "TimeoutError", "status": "timeout"}
    for i in range(200):
        if i != 7:
            assert results[i] == {"output": f"{i * 2}\n", "status": "ok"}, (i, results[i])
    assert children() <= before


class Interrupted(Exception):
    pass


def test_an_interrupt_kills_every_call():
    """Ctrl-C while the pool waits: the calls running are killed at once, not at their timeout."""

    def interrupt(signum, frame):
        raise Interrupted

    before = children()
    previous = signal.signal(signal.SIGUSR1, interrupt)
    main = threading.main_thread().ident
    timer = threading.Timer(1.0, signal.pthread_kill, (main, signal.SIGUSR1))
    pool = sandbox.ToolPool(4, timeout=60, isolated=False)
    t0 = time.monotonic()
    try:
        timer.start()
        with pytest.raises(Interrupted):
            pool.run(["while True:\n    pass\n"] * 8)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        pool.close()
    assert time.monotonic() - t0 < 5
    assert children() <= before


def test_isolation(monkeypatch, capsys):
    assert sandbox.isolation("none") is False
    with pytest.raises(SystemExit):
        sandbox.isolation("docker")
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap on PATH
    with pytest.raises(SystemExit):
        sandbox.isolation("bwrap")
    err = capsys.readouterr().err
    assert err.count("\n") == 2  # one line each
    assert "apt-get install bubblewrap" in err
    assert "--tool-sandbox none" in err


@requires_bwrap
def test_isolation_with_bubblewrap():
    assert sandbox.isolation("bwrap") is True


ORDINARY = """from dataclasses import dataclass, field
import logging
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from numpy.polynomial import Polynomial

@dataclass
class Point:
    x: int = 1
    tags: list = field(default_factory=list)

logging.basicConfig(level=logging.INFO)
logging.getLogger("probe").info("logged")
Path("a.txt").write_text("x")
with ThreadPoolExecutor(2) as pool:
    squares = list(pool.map(lambda v: v * v, range(4)))
fit = Polynomial.fit([0, 1, 2], [1, 3, 5], 1).convert().coef.round(3).tolist()
print(Point(2), "a.txt" in [p.name for p in Path(".").iterdir()], squares, fit)
"""


@pytest.mark.parametrize("isolated", [pytest.param(True, marks=requires_bwrap), False])
def test_ordinary_standard_library_programs_run(isolated):
    """Issue 44's probes: dataclasses, logging, pathlib, concurrent.futures and numpy.polynomial
    are ordinary programs' modules, reaching no host resource: both layers let them run."""
    r = sandbox.run_tool(ORDINARY, timeout=30, isolated=isolated)
    assert r["output"] == "Point(x=2, tags=[]) True [0, 1, 4, 9] [1.0, 2.0]\n", r
