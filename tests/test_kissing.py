"""kissing.py: exact verifier, sandboxed evaluator, constructions, LLM search loop (HTTP and local
engine)."""

import http.server
import itertools
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import kissing
import sandbox
from conftest import ROOT, requires_bwrap, requires_vllm

SITE = [p for p in sys.path if p.endswith("site-packages")][0]


def d11_roots():
    """The D11 roots ±e_i ± e_j: 220 points, valid."""
    points = []
    for i, j in itertools.combinations(range(11), 2):
        for s in (1, -1):
            for t in (1, -1):
                v = [0] * 11
                v[i] = s
                v[j] = t
                points.append(v)
    return points


D11 = d11_roots()


def cli(*args):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "kissing.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def alive(marker):
    """Processes on this machine whose command line contains `marker` (an escape that outlived its
    sandbox)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def brute(P):
    """Independent reference: (max norm², min dist², first closest pair in i<j order, #violations,
    #contacts)."""
    M = max(sum(c * c for c in p) for p in P)
    d = {
        (i, j): sum((a - b) ** 2 for a, b in zip(P[i], P[j]))
        for i, j in itertools.combinations(range(len(P)), 2)
    }
    best = min(d.values())
    pair = next(k for k, v in d.items() if v == best)
    violations = sum(1 for v in d.values() if v < M)
    contacts = sum(1 for v in d.values() if v == M)
    return M, best, list(pair), violations, contacts


def summary(m):
    return m["max_sq_norm"], m["min_sq_dist"], m["closest_pair"], m["num_violations"], m["contacts"]


def rational_rotation(points, rng, reflections=2, radius=700):
    """Integer Householder reflections q·x − 2(v·x)v, q = v·v: an exact rotation scaled by Πq (~2^43
    here)."""
    for _ in range(reflections):
        v = [rng.randint(-radius, radius) for _ in points[0]]
        q = sum(c * c for c in v)
        points = [
            [q * a - 2 * sum(b * c for b, c in zip(v, x)) * b for a, b in zip(x, v)] for x in points
        ]
    return points


# ----------------------------------------------------------------------------- verifier
def test_constructions_valid_and_cli(tmp_path):
    m = kissing.verify(D11)
    assert m["valid"]
    assert m["num_points"] == 220
    assert (m["max_sq_norm"], m["min_sq_dist"]) == (2, 2)
    code = kissing.construct_code(11)
    assert len(code) == 582
    assert all(sum(c * c for c in p) == 4 for p in code)
    out = tmp_path / "c.json"  # the README recipe, end to end through the CLI
    r = cli("construct", "--method", "code", "--out", out)
    assert r.returncode == 0, r.stderr
    r = cli("verify", out)
    m = json.loads(r.stdout)
    assert r.returncode == 0
    assert m["valid"]
    assert m["num_points"] == 582
    assert m["margin"] == 0
    assert m["num_violations"] == 0
    # E8's kissing configuration, P9a and P10b from the same construction
    for dim, size in [(8, 240), (9, 306), (10, 500)]:
        points = [list(p) for p in kissing.construct_code(dim)]
        assert kissing.verify(points, dim)["num_points"] == size


def test_shell_search_is_verified_and_bounded_by_its_cap():
    pts = kissing.construct_shell_search(8, 4, seconds=1.0)
    m = kissing.verify([list(p) for p in pts], 8)
    assert m["valid"]
    assert m["num_points"] >= 200  # E8 has 240 on this shell

    def reference(dim, norm):  # the old recursive enumeration of the whole shell
        r = math.isqrt(norm)
        if dim == 0:
            if norm == 0:
                return [()]
            return []
        return [(c,) + x for c in range(-r, r + 1) for x in reference(dim - 1, norm - c * c)]

    for dim, norm in [(1, 4), (1, 3), (2, 25), (4, 5), (11, 4), (5, 12)]:
        assert kissing.shell_vectors(dim, norm) == reference(dim, norm)
    # huge shells (11-D norm 1000: ~10^13 vectors), sparse ones (no vector of norm 7·4^k in 3-D),
    # norms past float64
    for dim, norm in [(11, 1000), (40, 4), (3, 7 * 4**12), (2, 10**15 + 3), (1, 10**30)]:
        t0 = time.time()
        with pytest.raises(ValueError, match="too large to list"):
            kissing.shell_vectors(dim, norm)
        assert time.time() - t0 < 10, (dim, norm)


def test_invalid_sets_rejected_with_the_right_pair():
    e3 = [0, 0, 0, 1] + [0] * 7
    m = kissing.verify([[2] + [0] * 10, e3, [1, 1] + [0] * 9])
    assert not m["valid"]
    assert m["closest_pair"] == [0, 2]
    assert m["num_violations"] == 2
    assert m["message"].startswith("Minimum squared distance 2 < maximum squared norm 4")
    code = [list(p) for p in kissing.construct_code(11)]
    bad = code + [[1, 1] + [0] * 9]
    assert summary(kissing.verify(bad)) == tuple(brute(bad))
    rng = random.Random(0)
    for _ in range(5):
        P = list({tuple(rng.randint(-3, 3) for _ in range(11)) for _ in range(40)} - {(0,) * 11})
        assert summary(kissing.verify([list(p) for p in P])) == tuple(brute(P))
    for bad, why in [
        (code + [[0] * 11], "zero vector"),
        (code + [code[5]], "vectors 5 and 582 are duplicates"),
        ([[2.5] + [0] * 10], "non-integer"),
        ([[float("nan")] + [0] * 10], "non-finite"),
        ([[float("inf")] + [0] * 10], "non-finite"),
        ([[1] * 10], "not a list of 11"),
        ([[True] + [0] * 10], "non-number"),
        ("abc", "non-empty list"),
        ([], "non-empty list"),
    ]:
        m = kissing.verify(bad)
        assert not m["valid"], (why, m["message"])
        assert why in m["message"], (why, m["message"])
    assert kissing.verify([[2.0] + [0] * 10])["valid"]  # integral floats are accepted as integers
    assert kissing.verify([[1, 0, 0], [0, 1, 0]], dim=3)["valid"]  # --dim


def test_large_coordinates_checked_exactly():
    rng = random.Random(1)
    c12 = [list(p) for p in kissing.construct_code(12)]  # 840 in 12-D
    sub = rng.sample(c12, 593)
    big = rational_rotation(sub, rng)  # exact rotation: same geometry, ~43-bit coordinates
    assert 40 <= max(abs(c) for p in big for c in p).bit_length() <= 48
    m = kissing.verify(big, 12)
    small = kissing.verify(sub, 12)
    assert m["path"] == "limb"
    assert m["valid"]
    assert m["num_points"] == 593
    assert m["margin"] == 0
    assert m["contacts"] == small["contacts"] > 1000
    assert m["closest_pair"] == small["closest_pair"]
    # 11-D, 593 points: scale a float configuration by 2^42 and round (a random orthogonal rotation
    # of the 582 code plus 11 extra directions); rounding makes ties go either way, only exact
    # arithmetic can tell
    Q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((11, 11)))
    F = np.vstack(
        [
            np.array(kissing.construct_code(11), float) / 2,
            np.random.default_rng(1).standard_normal((11, 11)),
        ]
    )
    F = F @ Q.T / np.linalg.norm(F, axis=1, keepdims=True)  # every row on the unit sphere
    pts = [[int(c) for c in row] for row in np.rint(F * 2.0**42).astype(np.int64)]
    m = kissing.verify(pts)
    assert m["path"] == "limb"
    assert m["num_points"] == 593
    assert summary(m) == tuple(brute(pts))
    # the float error is ≫ 1 here
    twin = [
        [2**45, 0, 7] + [0] * 8,
        [2**45 + 1, 0, 7] + [0] * 8,
        [0, 2**45] + [0] * 9,
    ]
    assert summary(kissing.verify(twin)) == tuple(brute(twin))
    assert tuple(brute(twin)) == (2**90 + 2**46 + 50, 1, [0, 1], 1, 0)
    # ~72-bit coordinates: refused, not checked inexactly
    huge = [[c << 30 for c in p] for p in pts[:60]]
    m = kissing.verify(huge)
    assert not m["valid"]
    assert "not exact" in m["message"]
    assert "2^62" in m["message"]


def test_fast_path_matches_exact_paths():
    rng = np.random.default_rng(0)
    for scale in (3, 1000, 2**26):
        X = np.unique(rng.integers(-scale, scale + 1, (80, 11)), axis=0)
        X = [list(map(int, r)) for r in X if r.any()]
        ms = [summary(kissing.verify(X, path=p)) for p in ("int64", "limb")]
        assert ms[0] == ms[1] == tuple(brute(X))


# ----------------------------------------------------------------------------- sandboxed evaluator
# a repo under /tmp: bwrap's own /tmp hides it
if ROOT.startswith("/tmp/") and shutil.which("bwrap"):
    REPO_READ_REFUSED = "No such file"
else:
    REPO_READ_REFUSED = "outside the working directory"


@pytest.mark.parametrize(
    "source, why",
    [
        ("while True:\n    pass\n", "timeout"),
        ("buf = bytearray(10 * 2**30)\npoints = [[1] + [0] * 10]\n", "MemoryError"),
        (
            "import os\nos.system('touch {marker}')\npoints = [[1] + [0] * 10]\n",
            "os.system is blocked",
        ),
        (
            "import subprocess\nsubprocess.run(['touch', '{marker}'])\npoints = [[1] + [0] * 10]\n",
            "is blocked",
        ),
        (
            "data = open('/etc/passwd').read()\npoints = [[1] + [0] * 10]\n",
            "outside the working directory",
        ),
        (
            "data = open('{repo}/kissing.py').read()\npoints = [[1] + [0] * 10]\n",
            REPO_READ_REFUSED,
        ),
        ("print('garbage ' * 10000)\npoints = 'not vectors'\n", "invalid input"),
        (
            "import os, sys\nos.write(int(sys.argv[1]), b'{{{{not json')\nos._exit(0)\n",
            "malformed output",
        ),
        ("def broken(:\n", "SyntaxError"),
        ("x = 1\n", "no `points`"),
    ],
)
def test_evaluator_failures_are_clean(tmp_path, source, why):
    marker = tmp_path / "pwned"
    t0 = time.time()
    res = kissing.evaluate_program(source.format(marker=marker, repo=ROOT), timeout=3)
    assert time.time() - t0 < 20
    assert res["validity"] == 0.0, res
    assert res["score"] == 0, res
    assert why in res["reason"], res
    assert not marker.exists()


def test_evaluator_scores_a_valid_program_and_ignores_its_claims():
    src = (
        "import numpy as np\n"
        "print('score: 10000 valid: 1.0')\n"
        "points = np.array([[2 * s * (k == i) for k in range(11)] for i in range(11) "
        "for s in (1, -1)])\n"
    )
    res = kissing.evaluate_program(src, timeout=20)
    assert res["validity"] == 1.0
    assert res["score"] == 22
    assert "score: 10000" in res["stdout_tail"]


# fork_exec as subprocess calls it (Python 3.11-3.13 signature): no audit event, so only the OS
# layer can stop it
SPAWN = """import os, _posixsubprocess
def spawn(*argv):
    r, w = os.pipe()
    return _posixsubprocess.fork_exec(
        [a.encode() for a in argv], [argv[0].encode()], True, (), None, None, -1, -1, -1, -1,
        -1, -1, r, w, False, True, -1, None, None, None, -1, None, False,
    )
"""
# each prints "escaped" if it got out, "refused <errno>" if the kernel said no
ESCAPES = {
    "fork_exec": SPAWN + "try:\n"
    "    spawn('/bin/sleep', '{marker}')\n"
    "    print('escaped', flush=True)\n"
    "except OSError as e:\n"
    "    print('refused', e, flush=True)\n"
    "while True:\n"
    "    pass\n",
    "fork loop": SPAWN + "n, err = 0, None\n"
    "for _ in range(200):\n"
    "    try:\n"
    "        spawn('/bin/sleep', '{marker}')\n"
    "        n += 1\n"
    "    except OSError as e:\n"
    "        err = e\n"
    "print('escaped' if n else 'refused', err, flush=True)\n"
    "points = [[1] + [0] * 10]\n",
    "dir_fd write": "import os\n"
    "fd = os.open({site!r}, os.O_RDONLY)\n"
    "w = os.open('{pth}', os.O_WRONLY | os.O_CREAT, dir_fd=fd)\n"
    "os.write(w, b'# escaped\\n')\n"
    "print('escaped', flush=True)\n"
    "points = [[1] + [0] * 10]\n",
}


@requires_bwrap
@pytest.mark.parametrize("name", list(ESCAPES))
def test_sandbox_contains_the_escapes(name):
    """The issue's escapes, a fork loop (a fork bomb bounded at 200 so that a failure cannot hurt
    the machine) and a dir_fd write into site-packages (a .pth there would run at every
    interpreter start): none gets out."""
    marker = f"4242.{os.getpid()}{random.randrange(10**6)}"
    pth = f"kissing_escape_{os.getpid()}.pth"
    try:
        source = ESCAPES[name].format(marker=marker, site=SITE, pth=pth)
        res = kissing.evaluate_program(source, timeout=5)
        time.sleep(0.2)  # the PID namespace is torn down with the sandbox
        assert res["sandbox"] == "bwrap", res
        assert "escaped" not in res["stdout_tail"], res
        assert not alive(marker)
        assert not os.path.exists(os.path.join(SITE, pth))
        # refused by the hook or the seccomp filter, or (the allowlist root) the target does not
        # exist inside the sandbox at all
        refused = "refused [Errno 1]" in res["stdout_tail"] or "is blocked" in res["reason"]
        absent = "No such file or directory" in res["reason"]
        assert refused or absent, res
    finally:
        for pid in alive(marker):
            os.kill(int(pid), 9)
        if os.path.exists(os.path.join(SITE, pth)):
            os.remove(os.path.join(SITE, pth))


LAYER = """import os, socket, sys, threading
def attempt(name, fn):
    try:
        fn()
        print(name, "ok", flush=True)
    except Exception as e:
        print(name, "refused", type(e).__name__, flush=True)
attempt("write site-packages", lambda: open(sys.argv[1], "w"))
attempt("write repo", lambda: open(sys.argv[2], "w"))
attempt("write tmp", lambda: open("/tmp/scratch", "w").write("x"))
attempt("write root", lambda: open("/scratch", "w").write("x"))
attempt("read /root", lambda: os.listdir("/root/.ssh"))
attempt("connect", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=2))
attempt("thread", lambda: threading.Thread(target=print).start())
attempt("fork", os.fork)
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), flush=True)
print("host", socket.gethostname(), flush=True)
for d, subdirs, files in os.walk("/"):
    if d in ("/proc", "/dev"):  # the sandbox's own
        subdirs[:] = []
        continue
    for name in files:
        print("file", os.path.join(d, name))
"""


def run_os_layer(source, *argv, seccomp=True):
    """Run `source` as /tmp/program.py under bwrap_cmd alone (no audit hook) -> CompletedProcess."""
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryFile() as bpf:
        with open(os.path.join(d, "program.py"), "w") as f:
            f.write(source)
        bpf.write(sandbox.seccomp_filter())
        bpf.seek(0)
        cmd = sandbox.bwrap_cmd(f.name, 1 << 20, bpf.fileno())
        if not seccomp:
            i = cmd.index("--seccomp")
            cmd = cmd[:i] + cmd[i + 2 :]
        return subprocess.run(
            cmd + [sandbox.sandbox_view()["python"], "-I", "program.py", *map(str, argv)],
            pass_fds=(bpf.fileno(),),
            capture_output=True,
            text=True,
            timeout=60,
        )


@requires_bwrap
def test_os_layer_alone():
    """bwrap_cmd without the audit hook: an allowlist root (every file inside is one sandbox_view
    binds, or the program), read-only but for a private /tmp; no network, one process, no fork;
    and, without the seccomp filter, a daemon started with its own session still dies with the
    sandbox."""
    pth = os.path.join(SITE, f"kissing_layer_{os.getpid()}.pth")
    repo_file = os.path.join(ROOT, f"kissing_layer_{os.getpid()}")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        r = run_os_layer(LAYER, pth, repo_file, srv.getsockname()[1])
    assert r.returncode == 0, r.stderr
    for line in (
        "write site-packages refused",
        "write repo refused",
        "write tmp ok",
        "write root refused",
        "read /root refused",
        "connect refused",
        "thread ok",
        "fork refused PermissionError",
        "pids [1]",
        "host sandbox",
    ):
        assert line in r.stdout, (line, r.stdout)
    assert not os.path.exists(pth)
    assert not os.path.exists(repo_file)
    # the allowlist: what is inside is what sandbox_view binds (host paths and contents), no more
    binds = sandbox.sandbox_view()["binds"]
    # the private /tmp holds the program and what it wrote
    inside = [line[5:] for line in r.stdout.splitlines() if line.startswith("file ")]
    assert "/tmp/program.py" in inside
    assert len(inside) > 100  # the walk saw the standard library
    for path in inside:
        assert path.startswith("/tmp/") or any(
            path == dst or path.startswith(dst + "/") for _, dst in binds
        ), path
    for src, dst in binds:
        assert os.path.basename(src) == os.path.basename(dst), (src, dst)
        outside_root = src.startswith(ROOT + "/") and not dst.startswith(sandbox.SANDBOX_SITE + "/")
        assert not outside_root, (src, dst)  # of the project only its PACKAGES, at /opt/site
    assert not any(p.startswith(("/etc/", ROOT + "/", "/home/", "/var/")) for p in inside)
    marker = f"4243.{os.getpid()}"
    daemon = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', "
        f"{marker!r}])\n"
        "time.sleep(0.3)\n"
        "print('started', flush=True)\n"
    )
    r = run_os_layer(daemon, seccomp=False)
    time.sleep(0.2)
    assert "started" in r.stdout, r
    assert not alive(marker), r


# Reads in C that raise no audit event: readline's history loader (the probe) and os.stat.
LEAK = """import os, readline
found = []
for path in {paths!r}:
    try:
        readline.clear_history()
        readline.read_history_file(path)
        found.append(path + ": " + str(readline.get_history_item(1)))
    except OSError:
        pass
    if os.path.exists(path):
        found.append(path + " exists")
if found:
    raise ValueError("LEAK " + " | ".join(found))
points = [[1] + [0] * 10]
"""


def host_files(tmp_path):
    """Files outside the sandbox a program must not see: the project's source, /etc/hostname, one
    this test writes."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the test's secret\n")
    return [os.path.join(ROOT, "kissing.py"), "/etc/hostname", str(secret)]


@requires_bwrap
def test_sandbox_holds_no_host_file_whatever_the_read_path(tmp_path):
    """The issue's probe: readline reads a file in C, unseen by the audit hook; inside bwrap the
    file does not exist. With --sandbox none (documented as not isolated) the same read works."""
    source = LEAK.format(paths=host_files(tmp_path))
    res = kissing.evaluate_program(source, timeout=20)
    assert res["sandbox"] == "bwrap", res
    assert "LEAK" not in res["reason"] + res["stderr_tail"], res
    assert res["validity"] == 1.0, res
    res = kissing.evaluate_program(source, timeout=20, sandbox="none")
    assert "LEAK" in res["reason"], res  # why `none` is documented as not isolated


def serve(replies):
    """A stdlib OpenAI-compatible server answering call i with replies[min(i, last)] ->
    (url, request bodies, server)."""
    calls = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            calls.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            text = replies[min(len(calls) - 1, len(replies) - 1)]
            data = json.dumps({"choices": [{"message": {"content": text}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}/v1", calls, srv


@requires_bwrap
def test_search_sends_no_host_file_to_the_llm(tmp_path):
    """In refine mode the program's error text goes back to the endpoint: it carries nothing of the
    host, since the host's files are not in the sandbox."""
    paths = host_files(tmp_path)
    url, calls, srv = serve([f"```python\n{LEAK.format(paths=paths)}```"])
    try:
        argv = ["search", "--llm", f"openai:{url}", "--model", "m", "--iters", "2"]
        kissing.main(argv + ["--timeout", "20", "--out-dir", str(tmp_path / "run")])
    finally:
        srv.shutdown()
    assert len(calls) == 2
    with open(os.path.join(ROOT, "kissing.py")) as f:
        first_line = f.readline().strip()
    for body in calls[1:]:  # the second call carries the first program's feedback
        for path in paths:  # what the program reports when it finds a file
            assert path + ": " not in body
            assert path + " exists" not in body
        assert first_line not in body
        assert "the test's secret" not in body


def test_output_is_read_up_to_a_bound(tmp_path):
    """A program whose points come to more than MAX_OUTPUT_BYTES as JSON gets one line; the parent
    reads no more than the bound (its peak memory grows by far less than the output's size)."""
    n = 2 * sandbox.MAX_OUTPUT_BYTES // 40  # ~40 bytes per point as JSON: twice the bound
    source = f"points = [[i] + [1] * 10 for i in range({n})]\n"
    probe = (
        "import resource, sys, kissing\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "res = kissing.evaluate_program(sys.argv[1], timeout=60)\n"
        "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(res['reason'])\n"
        "print(grown)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, source],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    reason, grown_kib = r.stdout.strip().splitlines()
    assert reason.startswith(f"output over {sandbox.MAX_OUTPUT_BYTES} bytes"), r.stdout
    # reading all 8 MB and parsing it costs ~50 MB; the bounded read costs one read of 4 MiB
    assert int(grown_kib) < 3 * sandbox.MAX_OUTPUT_BYTES >> 10, r.stdout


@pytest.mark.parametrize(
    "source",
    # the second layer alone (no bwrap): writes through descriptors or to the far end
    [
        "import os\n"
        "fd = os.open({site!r}, os.O_RDONLY)\n"
        "os.close(os.open('{name}', os.O_WRONLY | os.O_CREAT, dir_fd=fd))\n",
        "import os\nfd = os.open({site!r}, os.O_RDONLY)\nos.mkdir('{name}', dir_fd=fd)\n",
        "open('x', 'w').close()\nimport os\nos.rename('x', {site!r} + '/{name}')\n",
        "import shutil\nopen('x', 'w').close()\nshutil.copyfile('x', {site!r} + '/{name}')\n",
        # a read-only fd of an outside file
        "import os\nos.chmod(os.open({site!r} + '/{name}.txt', os.O_RDONLY), 0o777)\n",
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n",
    ],
)
def test_audit_hook_alone_blocks_descriptor_writes(source):
    target = os.path.join(SITE, f"kissing_hook_{os.getpid()}")
    # an outside file the program may read (the installation) but not change
    with open(target + ".txt", "w") as f:
        os.chmod(f.name, 0o644)
    try:
        res = kissing.evaluate_program(
            source.format(site=SITE, name=os.path.basename(target)) + "points = [[1] + [0] * 10]\n",
            timeout=20,
            sandbox="none",
        )
        assert res["sandbox"] == "none", res
        assert "is blocked" in res["reason"], res
        assert not os.path.exists(target)
        assert os.stat(target + ".txt").st_mode & 0o777 == 0o644
    finally:
        os.remove(target + ".txt")
        if os.path.isdir(target):
            os.rmdir(target)
        elif os.path.exists(target):
            os.remove(target)


@pytest.mark.parametrize("sandbox", ["none", pytest.param("bwrap", marks=requires_bwrap)])
def test_program_may_change_its_own_working_directory(sandbox):
    """CPython's audit events carry dir_fd=-1 for a plain os.mkdir, os.rename...: not a descriptor,
    so these are allowed inside the working directory."""
    source = (
        "import os\n"
        "os.mkdir('d')\n"
        "open('d/f', 'w').write('x')\n"
        "os.chmod('d/f', 0o600)\n"
        "os.utime('d/f')\n"
        "os.rename('d/f', 'd/g')\n"
        "os.remove('d/g')\n"
        "os.makedirs('e/f')\n"
        "os.rmdir('e/f')\n"
        "os.rmdir('d')\n"
        "points = [[1] + [0] * 10]\n"
    )
    res = kissing.evaluate_program(source, timeout=20, sandbox=sandbox)
    assert res["sandbox"] == sandbox, res
    assert res["validity"] == 1.0, res


def test_without_bubblewrap_nothing_runs_unless_none_says_so(monkeypatch, tmp_path):
    """The default fails closed (issue 44: `auto` used to fall back to the audit hook alone, which
    read /etc/passwd through readline): without bwrap the program does not run, and the CLI refuses
    in one line naming the fix; --sandbox none runs it on purpose."""
    source = "print('it ran')\npoints = [[1] + [0] * 10]\n"
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap on PATH
    res = kissing.evaluate_program(source, timeout=20)
    assert res["validity"] == 0.0
    assert res["reason"].startswith("could not start the sandbox: bubblewrap (bwrap) is not")
    assert "it ran" not in res["stdout_tail"]
    program = tmp_path / "prog.py"
    program.write_text(source)
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "kissing.py"), "evaluate", str(program)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "it ran" not in r.stdout
    assert r.stderr.count("\n") == 1, r.stderr
    assert "apt-get install bubblewrap, or pass --sandbox none" in r.stderr
    res = kissing.evaluate_program(source, timeout=20, sandbox="none")
    assert (res["sandbox"], res["validity"]) == ("none", 1.0)
    assert "it ran" in res["stdout_tail"]


def test_point_count_bounded_by_the_memory_limit():
    """The parent's pair check needs ~80 B per pair: too many points are refused before any of that
    work."""
    big = [[i] + [1] * 10 for i in range(1, 6001)]
    m = kissing.verify(big)  # 2048 MiB: at most isqrt(2048 MiB / 80 B) = 5181 points
    assert not m["valid"]
    assert m["message"].startswith("invalid input: 6000 vectors; checking more than 5181")
    m = kissing.verify(np.ones((6000, 11), dtype=np.int64))
    assert "invalid input: 6000 vectors" in m["message"]
    assert "more than 114" in kissing.verify(D11, mem_mb=1)["message"]
    assert kissing.verify(D11, mem_mb=4)["valid"]
    source = "points = [[i] + [1] * 10 for i in range(1, 6001)]\n"
    res = kissing.evaluate_program(source, timeout=20)
    assert res["validity"] == 0.0
    assert "checking more than 5181" in res["reason"]


def test_cli_refuses_bad_input_in_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    bad = tmp_path / "bad.json"
    prog = tmp_path / "bad.py"
    deep.write_text("[" * 10**5 + "]" * 10**5)
    bad.write_text(json.dumps([[2] + [0] * 10, [1, 1] + [0] * 9]))
    prog.write_text(f"points = {json.load(open(bad))}\n")
    for args, says in [
        (["evaluate", "/nonexistent.py"], "no such file"),
        (["construct", "--dim", "0"], "--dim"),
        (["construct", "--dim", "1000"], "--dim 32"),
        (["verify", deep], "recursion"),
        (["construct", "--method", "shell-search", "--norm", "1000"], "too large to list"),
        (["search", "--llm", "x", "--iters", "0"], "--iters"),
        (
            [
                "search",
                "--llm",
                f"local:{tmp_path}",
                "--engine",
                "sglang",
                "--out-dir",
                tmp_path / "s",
            ],
            "vllm, hf",
        ),
    ]:
        t0 = time.time()
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error:"), (args, r.stderr)
        assert says in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert time.time() - t0 < 30, (args, r.stderr)
    # an invalid set fails the command (`construct && verify`)
    for args in (["verify", bad], ["evaluate", prog]):
        r = cli(*args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert not json.loads(r.stdout)["valid"], (args, r.stdout, r.stderr)


# ----------------------------------------------------------------------------- search loop
GOOD = (
    "```python\n"
    "points = [[s * (k == i) for k in range(11)] for i in range(11) for s in (1, -1)]\n"
    "```"
)
BAD = "```python\npoints = [[2] + [0] * 10, [1, 1] + [0] * 9]\n```"


@pytest.fixture(scope="module")
def server():
    """A stdlib OpenAI-compatible /chat/completions server: canned good, bad and garbage answers."""
    replies = [GOOD, "I cannot do that.", BAD, "<<garbage>>", GOOD]
    calls = []  # the request bodies, in order

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(body)
            if len(calls) % 7 == 3:  # a non-JSON 200 response: the client must survive it
                data = b"not json at all"
            else:
                text = replies[len(calls) % len(replies)]
                data = json.dumps(
                    {
                        "choices": [{"message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 7},
                    }
                ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", calls
    srv.shutdown()


@pytest.mark.parametrize("mode", ["refine", "best-of-n", "evolve"])
def test_search_end_to_end_and_resume(tmp_path, server, mode):
    url, calls = server
    argv = [
        "search",
        "--llm",
        f"openai:{url}",
        "--model",
        "m",
        "--mode",
        mode,
        "--timeout",
        "10",
        "--out-dir",
        str(tmp_path),
        "--iters",
        "3",
    ]
    kissing.main(argv)
    with open(tmp_path / "conversation_log.json") as f:
        log = json.load(f)
    assert len(log["entries"]) == 3
    assert calls[-1]["model"] == "m"
    for e in log["entries"]:
        assert {
            "messages",
            "response",
            "program",
            "metrics",
            "seed",
            "prompt_tokens",
            "completion_tokens",
        } <= set(e)
    with pytest.raises(SystemExit):  # an existing log is never silently overwritten
        kissing.main(argv)
    kissing.main(argv[:-1] + ["5", "--resume"])
    with open(tmp_path / "conversation_log.json") as f:
        log2 = json.load(f)
    assert len(log2["entries"]) == 5
    assert log2["entries"][:3] == log["entries"]
    assert log2["best"]["score"] == 22  # GOOD is among the canned replies
    assert kissing.verify(json.load(open(tmp_path / "best_points.json")))["num_points"] == 22
    assert "points" in open(tmp_path / "program.py").read()
    if mode == "refine":  # the seed's feedback texts went back into the conversation
        fb = " ".join(e["feedback"] for e in log2["entries"])
        assert "This is great!" in fb or "Minimum squared distance 2 < maximum squared norm 4" in fb
        assert log2["entries"][1]["messages"][-1]["content"] == log2["entries"][0]["feedback"]


def test_openai_chat_refused_request_is_an_empty_reply_server_errors_stop(capsys):
    """A 4xx (e.g. a prompt longer than the server's context) would fail again on --resume: it is an
    empty reply and the search goes on. A 5xx `retries` times in a row stops the search in one
    line."""
    code = []  # the status the server answers with
    calls = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            calls.append(code[0])
            self.send_response(code[0])
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    msgs = [{"role": "user", "content": "points?"}]
    try:
        code[:] = [400]
        assert kissing.openai_chat(url, "m", msgs, 1.0, 8, 0, timeout=10) == ("", None, None)
        code[:] = [503]
        with pytest.raises(SystemExit):
            kissing.openai_chat(url, "m", msgs, 1.0, 8, 0, timeout=10, retries=2)
        assert "2 calls failed in a row" in capsys.readouterr().err
        calls.clear()
        with pytest.raises(SystemExit):  # it was a NameError
            kissing.openai_chat(url, "m", msgs, 1.0, 8, 0, timeout=10, retries=0)
        assert "1 calls failed in a row" in capsys.readouterr().err
        assert calls == [503]  # retries=0 still makes the one call
    finally:
        srv.shutdown()


def start_search(tmp_path, replies):
    """`kissing.py search` in a subprocess against serve(replies) -> (process, server)."""
    url, _, srv = serve(replies)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "kissing.py"), "search", "--llm", f"openai:{url}"]
        + ["--model", "m", "--mode", "best-of-n", "--iters", "50", "--timeout", "60"]
        + ["--out-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, srv


def wait_for(condition, what, seconds=60):
    t0 = time.time()
    while not condition():
        assert time.time() - t0 < seconds, f"no {what} after {seconds} s"
        time.sleep(0.05)


def sandboxes_of(pid):
    """The running evaluations of process pid (its child processes)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return f.read().split()
    except OSError:
        return []


def logged(tmp_path):
    try:
        with open(tmp_path / "conversation_log.json") as f:
            return len(json.load(f)["entries"])
    except (OSError, ValueError):
        return 0


def test_sigterm_finishes_the_evaluation_then_exits_143(tmp_path):
    """SIGTERM in the middle of an evaluation: it finishes, is logged, and the search exits 143 with
    one line saying so; --resume continues from there."""
    slow = "```python\nimport time\ntime.sleep(2)\npoints = [[1] + [0] * 10]\n```"
    proc, srv = start_search(tmp_path, [GOOD, slow])
    try:
        wait_for(lambda: logged(tmp_path) == 1, "first iteration")
        wait_for(lambda: sandboxes_of(proc.pid), "second evaluation")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        srv.shutdown()
    assert proc.returncode == 143, (out, err)
    assert "SIGTERM: finishing iteration 1's evaluation" in err, err
    assert "SIGTERM: stopped with 2 iterations" in err, err
    assert "Traceback" not in err, err
    assert "iter 1 | score 1" in out, out
    assert logged(tmp_path) == 2


def test_second_sigterm_exits_at_once(tmp_path):
    """A second SIGTERM does not wait for the evaluation: the search exits 143 within seconds, the
    sandbox with it, the log as it was."""
    slow = "```python\nimport time\ntime.sleep(60)\npoints = [[1] + [0] * 10]\n```"
    proc, srv = start_search(tmp_path, [slow])
    try:
        wait_for(lambda: sandboxes_of(proc.pid), "evaluation")
        child = sandboxes_of(proc.pid)[0]
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took = time.time() - t0
    finally:
        proc.kill()
        srv.shutdown()
    assert proc.returncode == 143, (out, err)
    assert took < 10, took
    assert "SIGTERM: stopped with 0 iterations" in err, err
    assert "Traceback" not in err, err
    assert not os.path.exists(f"/proc/{child}"), "the sandbox outlived the search"
    assert logged(tmp_path) == 0


def test_extract_program_blocks_and_diff_edits():
    parent = "d = 11\npoints = [[1] + [0] * 10]\n"
    answer = "<think>```python\nx = 0\n```</think> ok ```python\ny = 1\n```"
    assert kissing.extract_program(answer) == "y = 1\n"
    edit = (
        "<<<<<<< SEARCH\n"
        "points = [[1] + [0] * 10]\n"
        "=======\n"
        "points = [[2] + [0] * 10]\n"
        ">>>>>>> REPLACE"
    )
    assert kissing.extract_program(edit, parent) == "d = 11\npoints = [[2] + [0] * 10]\n"
    assert kissing.extract_program("no code here") == "no code here"
    source = "def get_points():\n    return [[0, 1, 0], [1, 0, 0]]\n"
    res = kissing.evaluate_program(source, dim=3, timeout=20)
    assert res["score"] == 2


@pytest.mark.parametrize("engine", [pytest.param("vllm", marks=requires_vllm), "hf"])
def test_search_local_backend(tmp_path, tiny_model_dir, engine):
    kissing.main(
        [
            "search",
            "--llm",
            f"local:{tiny_model_dir}",
            "--engine",
            engine,
            "--mode",
            "best-of-n",
            "--iters",
            "2",
            "--max-tokens",
            "24",
            "--timeout",
            "10",
            "--eager",
            "--out-dir",
            str(tmp_path),
        ]
    )
    log = json.load(open(tmp_path / "conversation_log.json"))
    assert len(log["entries"]) == 2
    assert all(e["completion_tokens"] > 0 for e in log["entries"])
    assert all(e["metrics"]["validity"] == 0.0 for e in log["entries"])
    assert all(e["metrics"]["reason"] for e in log["entries"])
