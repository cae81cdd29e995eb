"""The sandbox: untrusted Python text run in a subprocess under two layers, with a wall clock.

kissing.py's evaluator runs an LLM's program through it, and the RL tool `python` runs the model's
code through it once per call (`run_tool`, `ToolPool` for a batch of calls, `isolation` to check
the OS layer before a run starts).

Two layers.
- The OS (bwrap_cmd), when bubblewrap works here. The program sees an allowlist, not the host: its
  root is an empty read-only tmpfs holding only what the interpreter needs (sandbox_view: the
  python binary, its standard library with site-packages hidden, the PACKAGES installed here, and
  the shared libraries these load), a private size-capped /tmp as working directory, a minimal /dev
  and a /proc of its own PID namespace. The project, the home, /etc and the data do not exist
  inside, so no read path finds them, audited or not (readline's history loader reads files in C,
  unseen by the hook). Own user, PID, UTS and network namespaces (the child is PID 1, so whatever
  it starts dies with it), no capabilities, and a seccomp filter against new processes
  (RLIMIT_NPROC spares root).
- In-process (HOOK): rlimits, then an audit hook against processes, sockets, ctypes, rlimit
  changes and file access outside the working directory. Each runner appends an epilogue that runs
  the program (kissing's sends json(points) to the channel `out`, TOOL runs it and nothing more).
  Without bwrap only this layer runs: `none` is not isolated (C-level reads and writes the hook
  cannot see reach the host).
The parent reads bounded amounts of what comes back: at most MAX_OUTPUT_BYTES of the channel, the
tails of stderr, the head and tail of a tool's stdout.

    result = run_tool("import sympy\\nprint(sympy.factor(sympy.Symbol('x')**2 - 1))", 10, True)
    with ToolPool(8, timeout=10, isolated=isolation("bwrap")) as pool:
        results = pool.run(codes)  # [{"output": str, "status": "ok" | "error" | "timeout"}]
"""

import concurrent.futures
import contextlib
import functools
import glob
import importlib.util
import os
import platform
import re
import shutil
import signal
import site
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

from common import check

# ----------------------------------------------------------------------------- the two layers
# The in-process layer, the runner's first part: the program's path is `prog`, the channel `out`.
HOOK = r"""
import sys, os, json, runpy, resource, importlib.util
out = os.fdopen(int(sys.argv[1]), "w")
prog = sys.argv[2]
if sys.argv[3]:
    sys.path.append(sys.argv[3])  # inside bwrap: where sandbox_view put the packages
with open(prog, encoding="utf-8", errors="replace") as f:
    source = f.read()
named = any(name in source for name in ("numpy", "sympy", "mpmath"))
# numpy loads ctypes, which the hook blocks: imported before it (programs then find it in
# sys.modules) by a program that names a package that may load it; the others start ~4x sooner,
# and a numpy import they spell another way fails closed
if named and importlib.util.find_spec("numpy"):
    import numpy
root = os.path.realpath(os.getcwd())
for lim, val in zip(("AS", "CPU", "FSIZE", "CORE", "NPROC"), sys.argv[4:]):
    resource.setrlimit(getattr(resource, "RLIMIT_" + lim), (int(val), int(val)))
prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix] + sys.path
ro = tuple({os.path.realpath(p) for p in prefixes if p})
BLOCK = (
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.",
    "pty.", "socket.", "ctypes.", "os.kill", "os.chdir", "os.fchdir", "os.chroot", "os.putenv",
    "os.unsetenv", "os.symlink", "os.link", "gc.get_", "resource.", "sys.setprofile",
    "sys.settrace", "setopencode", "code.__new__", "urllib.", "http.", "ftplib.", "smtplib.",
    "webbrowser.",
)
PATHS = (
    "os.listdir", "os.scandir", "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod",
    "os.chown", "os.utime", "os.truncate", "shutil.", "glob.glob",
)
# event -> index of its dir_fd argument(s); CPython passes -1 (or None) when there is none
DIRFD = {
    "os.mkdir": 2, "os.remove": 1, "os.rmdir": 1, "os.rename": 2, "os.chmod": 2, "os.chown": 3,
    "os.utime": 3, "shutil.rmtree": 1,
}
# the defaults make the hook immune to monkeypatching
def hook(event, args, BLOCK=BLOCK, PATHS=PATHS, DIRFD=DIRFD, root=root, ro=ro, cwd=os.getcwd,
         fsdecode=os.fsdecode, any=any, isinstance=isinstance, int=int, repr=repr,
         PermissionError=PermissionError, getattr=getattr, own=None):
    if event.startswith(BLOCK):
        raise PermissionError("sandbox: " + event + " is blocked")
    # No function's code changes. Defaults change on any function but this hook (`own` is its
    # code): namedtuple(defaults=...) sets __new__.__defaults__, as sympy's import does.
    if event in ("object.__setattr__", "object.__delattr__") and args[1] in (
        "__code__", "__defaults__", "__kwdefaults__", "__globals__"
    ):
        if args[1] == "__code__" or getattr(args[0], "__code__", None) is own:
            raise PermissionError("sandbox: setting " + args[1] + " is blocked")
    if event == "open" or event.startswith(PATHS):
        # A listing writes nothing, so the installation's directories may be listed too: the
        # importer lists a package's directory to find its submodules (`import mpmath`, sympy).
        write = event not in ("open", "os.listdir", "os.scandir", "glob.glob")
        if event == "open":
            write = (args[2] or 0) & 0o3103 or any(ch in (args[1] or "r") for ch in "wax+")
        readonly = not write
        # The kernel resolves a relative path against dir_fd, this check against cwd: writes
        # through a descriptor (an fd as the path, a dir_fd, os.open of a relative path, whose
        # dir_fd the event does not show) are refused.
        if not readonly and (
            isinstance(args[0], int)
            or any(a not in (None, -1) for a in args[DIRFD.get(event, 9):])
            or event == "open" and args[1] is None and not fsdecode(args[0]).startswith("/")
        ):
            raise PermissionError(
                "sandbox: " + event
                + " through a file descriptor (fd, dir_fd, relative os.open) is blocked"
            )
        # rename/copy: both ends
        for path in args[:2 if event == "os.rename" or event.startswith("shutil.") else 1]:
            path = "." if path is None or isinstance(path, int) else path
            # normalise without os.path (patchable) or symlink resolution (os.symlink is blocked)
            if fsdecode(path).startswith("/"):
                full = fsdecode(path)
            else:
                full = cwd() + "/" + fsdecode(path)
            parts = []
            for part in full.split("/"):
                if part == "..":
                    parts = parts[:-1]
                elif part not in ("", "."):
                    parts = parts + [part]
            p = "/" + "/".join(parts)
            if readonly:
                allowed = (root,) + ro
            else:
                allowed = (root,)
            if not any(p == r or p.startswith(r + "/") for r in allowed):
                raise PermissionError(
                    "sandbox: " + event + "(" + repr(path)
                    + ") outside the working directory is blocked"
                )
hook.__defaults__ = hook.__defaults__[:-1] + (hook.__code__,)  # own: set before it runs
sys.addaudithook(hook)
"""
# AUDIT_ARCH, clone, fork, vfork (aarch64 has no fork nor vfork: -1 matches no call)
SYSCALLS = {
    "x86_64": (0xC000003E, 56, 57, 58),
    "aarch64": (0xC00000B7, 220, -1, -1),
}


def seccomp_filter():
    """BPF for `bwrap --seccomp`: fork, vfork, and clone without CLONE_THREAD -> EPERM; clone3 ->
    ENOSYS (libc then makes threads with clone); another ABI is killed. KeyError on other CPUs."""
    numbers = SYSCALLS[platform.machine()]
    arch = numbers[0] % 2**32
    clone = numbers[1] % 2**32
    fork = numbers[2] % 2**32
    vfork = numbers[3] % 2**32
    ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
    EPERM = 0x50001  # SECCOMP_RET_ERRNO | EPERM
    ENOSYS = 0x50026  # SECCOMP_RET_ERRNO | ENOSYS
    # (opcode, jump if true, jump if false, operand); jumps count the instructions skipped
    program = [
        (0x20, 0, 0, 4),  # 0: load the arch
        (0x15, 1, 0, arch),  # 1: our ABI: go to 3
        (0x06, 0, 0, 0x80000000),  # 2: another ABI: kill
        (0x20, 0, 0, 0),  # 3: load the syscall number
        (0x35, 8, 0, 0x40000000),  # 4: the x32 ABI: EPERM
        (0x15, 8, 0, 435),  # 5: clone3: ENOSYS
        (0x15, 6, 0, fork),  # 6: fork: EPERM
        (0x15, 5, 0, vfork),  # 7: vfork: EPERM
        (0x15, 1, 0, clone),  # 8: clone: check its flags at 10
        (0x06, 0, 0, ALLOW),  # 9: any other call
        (0x20, 0, 0, 16),  # 10: load clone's flags (its first argument)
        (0x45, 0, 1, 0x10000),  # 11: CLONE_THREAD set: allow, else EPERM
        (0x06, 0, 0, ALLOW),  # 12
        (0x06, 0, 0, EPERM),  # 13
        (0x06, 0, 0, ENOSYS),  # 14
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in program)


# where sandbox_view puts the PACKAGES (and the libraries their wheels bundle) inside the sandbox
SANDBOX_SITE = "/opt/site"
# the third-party packages a sandboxed program may import, those of them installed here
PACKAGES = ("numpy", "sympy", "mpmath")


@functools.lru_cache(maxsize=1)
def sandbox_view():
    """What of the host the sandbox holds, read-only: {"python": the interpreter to run inside,
    "binds": [(host path, sandbox path)], "hidden": [empty dirs over a bound one], "site": the
    sys.path entry for the packages}. The interpreter's standard library (its site-packages
    hidden), the PACKAGES installed here, and every shared library these load, as ldd resolves
    them; nothing else."""
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))  # not the venv's
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    dynload = os.path.realpath(sysconfig.get_config_var("DESTSHARED") or stdlib)
    binds = [(python, python), (stdlib, stdlib)]
    if not dynload.startswith(stdlib + "/"):
        binds.append((dynload, dynload))
    objects = [python] + glob.glob(dynload + "/*.so")
    sites = []  # where the packages live on the host: their libraries come with them
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue  # not installed here: not bound, so not importable inside
        package_dir = os.path.realpath(spec.submodule_search_locations[0])
        binds.append((package_dir, SANDBOX_SITE + "/" + name))
        if os.path.isdir(
            package_dir + ".libs"
        ):  # a wheel's own libraries (numpy's BLAS), via $ORIGIN
            binds.append((package_dir + ".libs", SANDBOX_SITE + "/" + name + ".libs"))
        objects += glob.glob(package_dir + "/**/*.so", recursive=True)
        sites.append(os.path.dirname(package_dir) + "/")
    # the installation's other packages stay outside (their .pth files would run at start)
    hidden = []
    for d in site.getsitepackages([sys.base_prefix]):
        d = os.path.realpath(d)
        if os.path.isdir(d) and d.startswith(stdlib + "/"):
            hidden.append(d)
    # ldd prints "libz.so.1 => /lib/.../libz.so.1 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)"
    listing = subprocess.run(["ldd"] + objects, capture_output=True, text=True, check=False)
    libs = set(re.findall(r"^\s+(?:\S+ => )?(/\S+) \(0x", listing.stdout, flags=re.M))
    for lib in sorted(libs):
        if not lib.startswith((stdlib + "/",) + tuple(sites)):
            binds.append((lib, lib))
    return {"python": python, "binds": binds, "hidden": hidden, "site": SANDBOX_SITE}


def bwrap_cmd(program, fsize, bpf_fd):
    """The OS layer's command prefix: /tmp/program.py is `program`, the seccomp filter is read
    from bpf_fd; run sandbox_view()["python"] after it."""
    view = sandbox_view()
    cmd = [shutil.which("bwrap") or "bwrap"]
    # new namespaces of every kind (user, PID, network, UTS...); no nested user namespaces
    cmd += ["--unshare-all", "--unshare-user", "--disable-userns", "--hostname", "sandbox"]
    # dies with us, no controlling terminal, the program is PID 1 (its children die with it)
    cmd += ["--die-with-parent", "--new-session", "--as-pid-1"]
    # no capabilities; seccomp_filter() read from bpf_fd
    cmd += ["--cap-drop", "ALL", "--seccomp", str(bpf_fd)]
    # the root is bwrap's empty tmpfs; into it only the allowlist, read-only
    for src, dst in view["binds"]:
        cmd += ["--ro-bind", src, dst]
    for d in view["hidden"]:
        cmd += ["--tmpfs", d, "--remount-ro", d]
    # a read-only /dev of its own, the /proc of its PID namespace
    cmd += ["--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc"]
    # a private size-capped /tmp holding the program, the one writable place
    cmd += ["--size", str(fsize), "--tmpfs", "/tmp", "--ro-bind", program, "/tmp/program.py"]
    cmd += ["--remount-ro", "/", "--chdir", "/tmp"]
    return cmd


def exit_reason(rc, stderr_tail):
    """Why the sandboxed program exited with code rc != 0, from the last line of its stderr."""
    last = (stderr_tail.strip().splitlines() or [""])[-1][:300]
    why = {
        signal.SIGXCPU: ", CPU time limit",
        signal.SIGKILL: ", killed",
        signal.SIGXFSZ: ", file size limit",
    }
    if rc < 0:
        sig = -rc  # the child, killed by a signal
    else:
        sig = rc - 128  # bwrap reports its child's signal N as 128 + N
    if last.startswith("bwrap:"):
        return f"could not start the sandbox: {last} (--sandbox none runs without it)"
    return f"program failed (exit {rc}{why.get(sig, '')}): {last}"


# The parent reads at most this much of the channel before parsing it: room for kissing's largest
# set (5181 points at --mem-mb 2048) of 11 coordinates near 2^62, thrice over. Parsing costs the
# parent up to ~20x the bytes read.
MAX_OUTPUT_BYTES = 4 << 20


@contextlib.contextmanager
def sandboxed(source, timeout, mem_mb, fsize_mb, isolated, epilogue, stop=None):
    """Run program text under the layers above (`python -I`, a scrubbed environment, a wall-clock
    kill; bwrap if `isolated`), HOOK then `epilogue` as the runner. Yields {returncode, timed_out,
    stopped, stdout, stderr, channel}, the last three files the caller reads (bounded) inside the
    with block. `stop`, a threading.Event, kills the program early when set. OSError if it cannot
    start."""
    # HOOK's rlimits: AS, CPU, FSIZE, CORE, NPROC
    limits = (mem_mb << 20, int(timeout) + 2, fsize_mb << 20, 0, 0)
    with (
        tempfile.TemporaryDirectory(prefix="sandbox_") as work,
        tempfile.TemporaryFile() as chan,
        tempfile.TemporaryFile() as so,
        tempfile.TemporaryFile() as se,
        tempfile.TemporaryFile() as bpf,
    ):
        with open(os.path.join(work, "program.py"), "w", encoding="utf-8", errors="replace") as f:
            f.write(source)
        cmd = [sys.executable]
        site_dir = ""  # the packages are on the interpreter's own path
        home = work
        if isolated:
            bpf.write(seccomp_filter())
            bpf.seek(0)
            view = sandbox_view()
            cmd = bwrap_cmd(f.name, fsize_mb << 20, bpf.fileno()) + [view["python"]]
            site_dir = view["site"]
            home = "/tmp"
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": home,
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        # the channel `out` is an anonymous file passed as an fd, apart from stdout
        cmd += ["-I", "-c", HOOK + epilogue, str(chan.fileno()), "program.py", site_dir]
        proc = subprocess.Popen(
            cmd + [str(x) for x in limits],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=so,
            stderr=se,
            pass_fds=(chan.fileno(), bpf.fileno()),
            start_new_session=True,
        )
        run = {"timed_out": False, "stopped": False}
        try:
            if stop is None:
                proc.wait(timeout=timeout)
            else:
                run["stopped"] = not _wait_unless(proc, timeout, stop)
        except subprocess.TimeoutExpired:
            run["timed_out"] = True
        finally:
            # bwrap (its child, PID 1 inside, then takes everything down) or the child; also when
            # a second Ctrl-C or SIGTERM interrupts the wait
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        run["returncode"] = proc.returncode
        run["stdout"] = so
        run["stderr"] = se
        run["channel"] = chan
        yield run


def _wait_unless(proc, timeout, stop):
    """proc.wait(timeout) that gives up early, returning False, once `stop` is set; checked every
    50 ms (Popen.wait itself polls no less often)."""
    deadline = time.monotonic() + timeout
    while not stop.is_set():
        left = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(0.0, min(0.05, left)))
            return True
        except subprocess.TimeoutExpired:
            if left <= 0.05:
                raise
    return False


def tail(f, n):
    """The last n bytes of a binary file, as text."""
    f.seek(max(0, f.seek(0, 2) - n))
    return f.read().decode("utf-8", "replace")


def run_sandboxed(source, timeout, mem_mb, fsize_mb, isolated, epilogue):
    """sandboxed(...) with its output read: ({returncode, stdout_tail, stderr_tail, timed_out}, the
    first MAX_OUTPUT_BYTES + 1 bytes of the channel). OSError if it cannot start."""
    with sandboxed(source, timeout, mem_mb, fsize_mb, isolated, epilogue) as run:
        res = {"timed_out": run["timed_out"], "returncode": run["returncode"]}
        res["stdout_tail"] = tail(run["stdout"], 2000)
        res["stderr_tail"] = tail(run["stderr"], 2000)
        run["channel"].seek(0)
        raw = run["channel"].read(MAX_OUTPUT_BYTES + 1)  # bounded before anything parses it
    return res, raw


# ----------------------------------------------------------------------------- the RL tool `python`
# The tool's runner runs the program as __main__ and nothing more: what it prints is the output.
TOOL = 'runpy.run_path(prog, run_name="__main__")\n'
TOOL_MAX_CHARS = 4000  # a tool call's output, in characters, before the middle is cut
TOOL_FSIZE_MB = 32  # the files a call writes, its stdout included (its /tmp under bwrap)
CUT = " ... "  # stands where the middle of a long output was cut


def middle_truncated(f, max_chars):
    """A binary file's text, its middle cut to CUT when over max_chars characters (head and tail
    kept); reads at most 4 bytes per character kept, however large the file."""
    keep = max(0, max_chars - len(CUT))
    size = f.seek(0, 2)
    f.seek(0)
    if size <= 4 * max_chars:  # UTF-8 takes at most 4 bytes a character
        text = f.read().decode("utf-8", "replace")
        if len(text) <= max_chars:
            return text
        head = text[: keep - keep // 2]
        rest = text[len(text) - keep // 2 :]
        return head + CUT + rest
    head = f.read(4 * keep).decode("utf-8", "replace")[: keep - keep // 2]
    f.seek(size - 4 * (keep // 2))
    rest = f.read().decode("utf-8", "replace")
    return head + CUT + rest[len(rest) - keep // 2 :]


def error_line(rc, stderr_tail):
    """What a failed call shows of its error: the last line of stderr, which for an exception is
    "Type: message" (the traceback above it names the host's files under `none`); the signal that
    ended it when stderr is empty."""
    last = (stderr_tail.strip().splitlines() or [""])[-1][:300]
    if last:
        return last
    if rc < 0:
        sig = -rc  # the child, killed by a signal
    else:
        sig = rc - 128  # bwrap reports its child's signal N as 128 + N
    names = {signal.SIGXCPU: "CPU time limit", signal.SIGXFSZ: "file size limit"}
    if sig in names:
        return f"killed: {names[sig]}"
    return f"SystemExit: {rc}"


def run_tool(code, timeout, isolated, mem_mb=1024, max_chars=TOOL_MAX_CHARS, stop=None):
    """Run one tool call's code as __main__ in the sandbox (bwrap when `isolated`, the hook and
    rlimits always) -> {"output": str, "status": "ok" | "error" | "timeout"}.

    output: stdout, its middle cut to fit max_chars; after an exception, stdout (if any) and then
    the error's one line ("NameError: name 'x' is not defined", "MemoryError"), as ToRL's
    interpreter shows both; after the wall clock, "TimeoutError" likewise. `stop` (an Event) ends
    the call early, "InterruptedError" (ToolPool.close)."""
    with sandboxed(code, timeout, mem_mb, TOOL_FSIZE_MB, isolated, TOOL, stop=stop) as run:
        status = "ok"
        error = ""
        if run["timed_out"]:
            status = "timeout"
            error = "TimeoutError"
        elif run["stopped"]:
            status = "error"
            error = "InterruptedError: the tool pool was closed"
        elif run["returncode"] != 0:
            status = "error"
            error = error_line(run["returncode"], tail(run["stderr"], 2000))
        error = error[:max_chars]
        budget = max_chars
        if error:
            budget = max(0, max_chars - len(error) - 1)  # the error line and its newline
        output = middle_truncated(run["stdout"], budget)
    if output and error and not output.endswith("\n"):
        output += "\n"
    return {"output": output + error, "status": status}


class ToolPool:
    """Tool calls run concurrently, at most `workers` at a time (a thread waits on each sandboxed
    process), results in input order. close() (or leaving the with block, an interrupt included)
    kills every running call's process group and drops the calls not started."""

    def __init__(self, workers, timeout, isolated, mem_mb=1024, max_chars=TOOL_MAX_CHARS):
        self.timeout = timeout
        self.isolated = isolated
        self.mem_mb = mem_mb
        self.max_chars = max_chars
        self.stop = threading.Event()
        if isolated:
            sandbox_view()  # ldd once, before the threads ask for it
        self.executor = concurrent.futures.ThreadPoolExecutor(workers, "tool")

    def run(self, codes):
        """[run_tool's dict for each code], in the order of `codes`."""
        futures = []
        for code in codes:
            future = self.executor.submit(
                run_tool, code, self.timeout, self.isolated, self.mem_mb, self.max_chars, self.stop
            )
            futures.append(future)
        try:
            return [future.result() for future in futures]
        except BaseException:  # Ctrl-C while waiting: no call outlives it
            self.close()
            raise

    def close(self):
        """Kill the running calls (within 50 ms), drop those not started, join the threads."""
        self.stop.set()
        self.executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sandbox_missing(flag):
    """Why bubblewrap cannot isolate code here, with the fix naming `flag`; None when it can
    (installed, and a seccomp filter for this CPU)."""
    fix = f"apt-get install bubblewrap, or pass {flag} none to run the code unisolated on purpose"
    if not shutil.which("bwrap"):
        return f"bubblewrap (bwrap) is not installed: {fix}"
    if platform.machine() not in SYSCALLS:
        return f"no seccomp filter for {platform.machine()}: {fix}"
    return None


def isolation(mode, flag="--tool-sandbox"):
    """`flag` bwrap | none -> whether code runs under bwrap. Fails closed: `bwrap` starts one call
    to check that bubblewrap works here, and stops with a one-line error if it does not."""
    check(mode in ("bwrap", "none"), f"{flag} {mode}: expected bwrap or none")
    if mode == "none":
        return False
    missing = sandbox_missing(flag)
    check(missing is None, missing)
    probe = run_tool("print(6 * 7)", timeout=60, isolated=True)
    fix = f"pass {flag} none to run the code unisolated on purpose"
    check(probe["output"] == "42\n", f"bubblewrap does not run here ({probe['output']}): {fix}")
    return True
