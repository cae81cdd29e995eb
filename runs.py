"""A run on disk: its directory claimed and locked, resume, checkpoints and snapshots, metric rows,
stop signals, and a full or read-only disk in one line. No run loses or mixes data.

- `--dry-run` prints the effective flags (`dry_run`); `--resume RUN` checks the whole run (the
  script that wrote it, state.json, every metrics row) before it touches a file, then restores the
  run's saved flags (`resume_from`); a run without a checkpoint restarts from step 0.
- A run directory is claimed at start and locked for the run's life (`claim_run_dir`,
  `lock_run_dir`): a second run there is refused naming the first one's pid.
- Checkpoints are swapped in whole (`save_checkpoint`, `save_model_checkpoint`), so a crash leaves
  one complete copy; --keep-checkpoints keeps a weights-only series (`save_snapshot`).
- metrics.jsonl rows are appended one at a time (`log_row`), read back checked (`read_metrics`) and
  cut back to the checkpoint on resume (`restore_checkpoint`).
- A full or read-only disk is one line naming the problem and what to do; the run stays resumable
  (`storage_error_line`).
- Ctrl-C and SIGTERM finish the step before the run stops (`finish_then_interrupt`).

    claim_run_dir(args.out, args.resume)
    with finish_then_interrupt():
        log_row(args.out, row)
"""

import argparse
import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time

from common import check, check_hub_ids, check_model_dir, fail, read_json
from storage import storage_line, storage_problem


# ----------------------------------------------------------------------------- resume and dry runs
def resume_from(parser, argv, args, needs=(), script=None):
    """--resume RUN: its saved flags restored into args (flags given on this command line override
    them), after every check and before any file changes.

    The script that wrote the run (state.json's "script", else run.lock's) must be this one
    (`script`, by default the __main__ file; unknown on either side: not checked). Then the run
    directory is locked (lock_run_dir: a run still going there is refused), and, touching nothing,
    the complete checkpoint must hold a model and `needs` (optimizer.pt, ...), its state.json valid
    counters (check_state) and every metrics.jsonl row must be valid (read_metrics). Only then is an
    interrupted save recovered. A dry run only looks: no lock, nothing moves.

    A run without a checkpoint (stopped or failed before its first save) restarts from step 0 with
    the flags of its args.json: args.resume becomes None, and claim_run_dir drops its logged rows.
    """
    dry = getattr(args, "dry_run", False)
    if script is None:
        script = this_script()
    run_dir = run_dir_of(args.resume)
    check(
        run_markers(run_dir),
        f"--resume {args.resume}: no complete checkpoint there, nor any other file of a run "
        f"(args.json, metrics.jsonl); start a run there with --out",
    )
    check_is_run(run_dir, "--resume")  # another tool's metrics.jsonl is not ours to cut
    # a resumed run goes on in its own directory: --out elsewhere would fork it without its rows
    out = getattr(args, "out", None)
    check(
        "out" not in explicit_dests(parser, argv)
        or os.path.realpath(out) == os.path.realpath(run_dir),
        f"--resume {args.resume} --out {out}: a resumed run continues in its own directory; drop "
        f"--out, or copy the run there first (cp -a {run_dir} {out}) and resume the copy",
    )
    # the script that wrote the run: its checkpoint's, else its last claim's (read before this
    # process's claim replaces that record)
    written_by = read_claim(run_dir).get("script")
    ckpt = find_checkpoint(args.resume, repair=False)
    if ckpt:
        state = read_json(os.path.join(ckpt, "state.json"), "step") or {}
        if isinstance(state.get("script"), str):
            written_by = state["script"]
    if written_by and script and written_by != script:
        fail(
            f"--resume {args.resume}: this run was written by {written_by}, not {script}; "
            f"continue it with `python {written_by} --resume {run_dir}`"
        )
    if not dry:
        lock_run_dir(run_dir, "--resume", script)
    ckpt = find_checkpoint(args.resume, repair=False)  # again: now no other run can change it
    state = {}
    if ckpt:
        if os.path.isfile(os.path.join(ckpt, "adapter_config.json")):
            # a LoRA run's checkpoint: the adapter; its base is the run's --model
            needs = ("adapter_model.safetensors", *needs)
        elif os.path.isfile(os.path.join(ckpt, SHARDS_FILE)):
            # grpo_ray.py --learner-sharding fsdp: each learner's shard of the weights and the
            # optimizer state (check_files below checks them), a model only at the run's end
            needs = ()
        else:
            check_model_dir(ckpt, "--resume")  # a broken checkpoint names its missing file
        for f in needs:
            check(
                os.path.isfile(os.path.join(ckpt, f)),
                f"--resume {ckpt}: {f} is missing (a broken checkpoint)",
            )
        state = check_state(ckpt)
        check_files(ckpt, state)
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"), quiet=True)  # bad rows: refused
    if ckpt:
        if not dry:
            ckpt = find_checkpoint(args.resume)  # every check passed: recover a half-done swap
        saved = {**state.get("args", {}), "out": run_dir}
        resume_args(parser, argv, args, saved)
        args.resume = ckpt
        return args
    # no checkpoint: nothing to continue, so the run starts again, with its flags when it has them
    saved = read_json(os.path.join(run_dir, "args.json"), "out")
    flags = "its args.json's flags"
    if saved is None:
        flags = "this command line's flags (it has no args.json)"
    print(
        f"notice: --resume {args.resume}: no checkpoint (the run stopped before its first save): "
        f"restarting it from step 0 with {flags}; its {len(rows)} logged rows are dropped",
        flush=True,
    )
    if saved is not None:
        resume_args(parser, argv, args, {**saved, "out": run_dir}, source="its args.json")
    elif "out" not in explicit_dests(parser, argv):
        args.out = run_dir
    if not dry:
        _RESTARTS.add(os.path.realpath(args.out))
    args.resume = None
    return args


def check_state(ckpt):
    """A checkpoint's state.json, each field checked: the step counters integers >= 0, the clock a
    finite number >= 0, the flags an object. A bad one is a one-line error naming it."""
    state = read_json(os.path.join(ckpt, "state.json"), "step")
    if not state:
        fail(f"--resume {ckpt}: its state.json is corrupt")
    bad = None
    for key in ("step", "opt_step"):
        if key in state and not is_count(state[key]):
            bad = f"{key} {state[key]!r}, not an integer >= 0"
    wall = state.get("wall", 0)
    if not isinstance(wall, (int, float)) or isinstance(wall, bool):
        bad = f"wall {wall!r}, not a number"
    elif not (math.isfinite(wall) and wall >= 0):
        bad = f"wall {wall!r}, not a finite number >= 0"
    if not isinstance(state.get("args", {}), dict):
        bad = "args that are not an object"
    if not isinstance(state.get("script", ""), (str, type(None))):
        bad = f"script {state['script']!r}, not a file name"
    if bad:
        fail(
            f"--resume {ckpt}: its state.json has {bad} (a damaged file: restore it from a copy, "
            f"or start a new run)"
        )
    return state


def is_count(value):
    """An integer >= 0 (a step counter), and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def explicit_dests(parser, argv):
    """Destinations of the flags actually given in argv (their defaults suppressed)."""
    saved = [(a, a.default) for a in parser._actions]
    for a, _ in saved:
        a.default = argparse.SUPPRESS
    try:
        ns, _ = parser.parse_known_args(argv)
    finally:
        for a, d in saved:
            a.default = d
    return set(vars(ns))


def check_restored(action, value, source):
    """A flag's value restored from a saved run passes the checks a typed one does (its type and
    choices; a switch is a bool): a hand-edited or corrupt args.json is one line, not a step -5 row
    or a traceback."""
    flag = action.option_strings[0] if action.option_strings else action.dest
    bad = f"--resume: {source} has {flag} {value!r}"
    if value is None:
        return
    switch = isinstance(action.const, bool) and action.nargs == 0  # store_true / store_false
    if switch or isinstance(action, argparse.BooleanOptionalAction):  # --x / --no-x
        check(isinstance(value, bool), f"{bad}, not true or false; fix or drop it there")
        return
    values = value
    if not isinstance(value, list):
        values = [value]
    for v in values:
        converted = v
        if action.type is not None:
            try:
                converted = action.type(str(v))
            except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
                # a flag typed now wins (--threads saved on a larger machine, say)
                fail(f"{bad}: {e}; pass {flag} on this command line, or fix it there")
        if action.choices is not None:
            check(converted in action.choices, f"{bad}, not one of {list(action.choices)}")


def resume_args(parser, argv, args, saved, keep=("resume", "dry_run"), source="its checkpoint"):
    """Take every flag of a resumed run from `saved` (its args.json) unless given again on this
    command line; print the overrides (and where the flags came from: `source`). Keys that are not
    this parser's flags (derived sizes) are ignored."""
    given = explicit_dests(parser, argv) | set(keep)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    dests = set(actions)
    overrides = []
    for k in sorted(dests & set(saved) - set(keep)):
        if k not in given:
            check_restored(actions[k], saved[k], source)
            setattr(args, k, saved[k])
        elif getattr(args, k) != saved[k]:
            overrides.append(f"{k} {saved[k]!r} -> {getattr(args, k)!r}")
    message = f"resume: restored the run's flags from {source}"
    if overrides:
        message += f"; overriding {', '.join(overrides)}"
    print(message, flush=True)
    # flags added since the run was saved: it resumes with their defaults, which may change what it
    # does (say which, so a changed default is never silent)
    newer = []
    for k in sorted(dests - set(saved) - given):
        newer.append(f"{k}={getattr(args, k)!r}")
    if newer:
        print(f"notice: the saved run predates {', '.join(newer)} (their defaults)", flush=True)
    return args


def dry_run(args, runtime=None):
    """Print the effective configuration (argparse destination names as keys, and the runtime
    record under "runtime" when there is one) as the last line; exit 0."""
    settings = dict(vars(args))
    if runtime is not None:
        settings["runtime"] = runtime
    print(json.dumps(settings, sort_keys=True, default=str), flush=True)
    sys.exit(0)


# ----------------------------------------------------------------------------- run directories
RUN_MARKERS = ("metrics.jsonl", "checkpoint", "checkpoint.tmp", "checkpoint.old", "args.json")
LOCK_FILE = "run.lock"  # held while a process runs on the directory; names its last holder
_LOCKS = {}  # real path of a run directory this process holds -> (the path as given, fd)
_RESTARTS = set()  # real paths of run directories this process starts again from step 0
_CLAIMED = set()  # real paths claimed as runs (claim_run_dir): they go on with --resume


def claim_run_dir(out, resume=None, flag="--out", script=None):
    """Claim `out` for this run before any work: create it, lock it (lock_run_dir: a second run is
    refused naming the first one's pid), refuse a run it holds unless resumed, check it writable.

    A directory without a checkpoint is never stuck: with no logged row (a run that failed at
    start) a new run takes it over with a notice; with rows, --resume restarts it (resume_from)."""
    check_hub_ids()  # the run starts (a dry run never gets here): the hub ids too
    check(
        not os.path.exists(out) or os.path.isdir(out), f"{flag} {out}: is a file; pass a directory"
    )
    check_is_run(out, flag)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        stop_on_storage_error(e, out, "creating")
        fail(f"{flag} {out}: cannot create it ({e.strerror})")
    lock_run_dir(out, flag, script)
    _CLAIMED.add(os.path.realpath(out))
    metrics = os.path.join(out, "metrics.jsonl")
    held = run_markers(out)
    restart = os.path.realpath(out) in _RESTARTS
    if held and not resume and not restart:
        logged = count_rows(metrics)
        ckpt = find_checkpoint(out, repair=False)
        if ckpt or logged:
            what = ", ".join(held)
            if not ckpt:
                what = f"{logged} logged rows, no checkpoint: --resume restarts it from step 0"
            fail(
                f"{flag} {out} already holds a run ({what}); "
                f"pass --resume {out} to continue it, or choose a new {flag}"
            )
        print(
            f"notice: {flag} {out} holds a run that stopped before its first logged row: "
            f"starting afresh there",
            flush=True,
        )
        restart = True
        _RESTARTS.add(os.path.realpath(out))
    if restart and os.path.exists(metrics):
        _write_rows(metrics, [])  # the rows of steps never saved: they run again
    probe = os.path.join(out, f".write_probe{os.getpid()}")
    try:
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        stop_on_storage_error(e, probe, "creating")
        fail(f"{flag} {out}: not writable ({e.strerror})")
    return out


def check_is_run(out, flag="--out"):
    """A folder that is not empty is a run only if it carries this project's run marker (run.lock,
    which a run's first claim makes): anything else (the user's own checkpoint/, another tool's
    metrics.jsonl) is refused in one line, never taken over, overwritten or deleted."""
    if not os.path.isdir(out):
        return
    entries = []  # what makes the folder not empty (.gitkeep, .DS_Store and the like do not)
    for name in os.listdir(out):
        if not name.startswith(".") and name != "lost+found":
            entries.append(name)
    if not entries or LOCK_FILE in entries or _saved_before_the_marker(out):
        return
    fail(
        f"{flag} {out} is not empty and is not a run of this project (it has no {LOCK_FILE}): "
        f"choose a new {flag}, or an empty folder"
    )


def _saved_before_the_marker(out):
    """A run saved by this project before runs carried run.lock: a checkpoint whose state.json
    holds the step and the run's flags, as only save_model_checkpoint writes it."""
    for name in ("checkpoint", "checkpoint.old", "checkpoint.tmp"):
        state = read_json(os.path.join(out, name, "state.json"), "step")
        if state and isinstance(state.get("args"), dict) and state.get("script"):
            return True
    return False


def run_markers(run_dir):
    """The files and directories of RUN_MARKERS that run_dir holds."""
    held = []
    for m in RUN_MARKERS:
        if os.path.exists(os.path.join(run_dir, m)):
            held.append(m)
    return held


def run_dir_of(path):
    """The run directory of a run or checkpoint directory (what --resume accepts)."""
    path = path.rstrip("/")
    if os.path.basename(path).startswith("checkpoint"):
        return os.path.dirname(path) or "."
    return path


def count_rows(path):
    """How many lines of a metrics.jsonl parse as JSON (0 without the file), checking nothing."""
    count = 0
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        for line in f:
            try:
                json.loads(line)
                count += 1
            except ValueError:
                pass
    return count


def this_script():
    """The root script this process runs ("grpo.py"), or None (a test, a notebook, a Ray worker).

    It is recorded with a run (state.json, run.lock) so that another script's --resume is
    refused."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:
        return None
    path = os.path.abspath(path)
    if os.path.dirname(path) != os.path.dirname(os.path.abspath(__file__)):
        return None
    return os.path.basename(path)


def lock_run_dir(out, flag="--out", script=None):
    """Hold <out>/run.lock for the rest of this process's life, or stop with one line naming the
    process that holds it.

    An exclusive POSIX lock (fcntl.lockf): the kernel drops it when its process ends, however it
    ends (kill -9 included), so a lock left by a dead run is free by construction, and processes
    forked by the holder (engine, grader workers) do not inherit it. run.lock itself stays: it
    names the pid, host, script and command line of its last holder (read_claim). Idempotent
    within a process. A POSIX lock also goes when its process closes any descriptor of the file,
    so this process reads run.lock only through the descriptor it holds.

    A process started by the holder (a test or a notebook that ran a main() in-process, then the
    script) may use the directory: its holder waits on it."""
    key = os.path.realpath(out)
    if key in _LOCKS:
        return
    if script is None:
        script = this_script()
    path = os.path.join(out, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        stop_on_storage_error(e, path, "creating")
        fail(f"{flag} {out}: cannot create {path} ({e.strerror})")
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)  # this process holds no lock on the file: closing it drops nothing
        if e.errno not in (errno.EACCES, errno.EAGAIN):  # ENOLCK: a filesystem without locks
            print(
                f"notice: {flag} {out}: no file locks on this filesystem ({e.strerror}): "
                f"a second run on this directory would not be refused",
                flush=True,
            )
            return
        holder = _wait_for_claim(out)
        if _started_us(holder):
            return
        fail(
            f"{flag} {out} is in use by another run ({_describe(holder, path)}); "
            f"wait for it to end or stop it, or choose a new {flag}"
        )
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "script": script,
        "command": " ".join(sys.argv)[:300],
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError as e:
        stop_on_storage_error(e, path, "writing")
        raise
    _LOCKS[key] = (out, fd)
    _report_storage_errors()  # from here on, a full or read-only disk is one line


def release_run_dir(out):
    """Let go of a run directory this process holds (a notebook or a test that ran a main()
    in-process and now hands the directory to another process)."""
    held = _LOCKS.pop(os.path.realpath(out), None)
    _RESTARTS.discard(os.path.realpath(out))
    _CLAIMED.discard(os.path.realpath(out))
    if held:
        os.close(held[1])


def read_claim(run_dir):
    """The record in run_dir/run.lock ({"pid", "host", "script", ...}), or {} (none, or corrupt)."""
    held = _LOCKS.get(os.path.realpath(run_dir))
    try:
        if held:
            raw = os.pread(held[1], 4096, 0)
        else:
            with open(os.path.join(run_dir, LOCK_FILE), "rb") as f:
                raw = f.read(4096)
        record = json.loads(raw)
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    return record


def _wait_for_claim(out):
    """The holder's record. It writes it right after taking the lock, over its predecessor's: wait
    a moment for one that names a live process."""
    record = {}
    for _ in range(20):
        record = read_claim(out)
        if "pid" in record and _alive(record):
            return record
        time.sleep(0.05)
    return record


def _alive(record):
    """Whether the record's pid is a running process (one on another host is taken to be)."""
    if record.get("host") != socket.gethostname():
        return True
    return os.path.exists(f"/proc/{record['pid']}")


def _started_us(holder):
    """Whether the holder is this process's parent, or its parent's parent, ... (same host)."""
    if holder.get("host") != socket.gethostname():
        return False
    pid = os.getppid()
    for _ in range(64):
        if pid <= 1:
            return False
        if pid == holder.get("pid"):
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the fields after "(comm)": state, ppid
    return False


def _describe(holder, path):
    """ "pid 123 on host h: python grpo.py ..., since ..." for a refusal."""
    if "pid" not in holder:
        return f"a process that names none in {path}; `fuser -v {path}` finds it"
    words = f"pid {holder['pid']}"
    if holder.get("host") != socket.gethostname():
        words += f" on {holder.get('host')}"
    elif not _alive(holder):
        words += f", not running: `fuser -v {path}` finds the holder"
    if holder.get("command"):
        words += f": {holder['command']}"
    if holder.get("started"):
        words += f", since {holder['started']}"
    return words


def find_checkpoint(path, repair=True):
    """The complete checkpoint (its directory, or None) of a run or checkpoint directory.

    An interrupted swap is recovered: a copy is complete when its state.json (written last)
    parses. repair=False (a dry run) only looks: nothing moves.
    """
    path = path.rstrip("/")  # a run directory, or its checkpoint directory
    if os.path.basename(path).startswith("checkpoint"):
        final = path
    else:
        final = os.path.join(path, "checkpoint")
    tmp = final + ".tmp"
    old = final + ".old"
    # a corrupt state.json in final itself is not recovered here: resume_from names it
    if not os.path.exists(os.path.join(final, "state.json")):
        complete = None
        for cand in (tmp, old):  # tmp is newer than old: prefer it when it was finished
            if read_json(os.path.join(cand, "state.json"), "step"):
                complete = cand
                break
        if complete is None:
            return None
        if not repair:
            return complete
        shutil.rmtree(final, ignore_errors=True)
        os.replace(complete, final)
        print(
            f"resume: recovered {final} from an interrupted save ({os.path.basename(complete)})",
            flush=True,
        )
    if repair:
        for leftover in (tmp, old):
            shutil.rmtree(leftover, ignore_errors=True)
    return final


def save_checkpoint(out_dir, write, marker="state.json", name="checkpoint", keep=()):
    """Swap out_dir/<name> in whole, so a crash leaves one complete copy.

    write(tmp_dir) fills a fresh tmp directory, `marker` last; then checkpoint -> .old,
    tmp -> checkpoint, and .old is removed. keep: globs of old files to carry over (a model card).
    A full or read-only disk is one line (the previous copy stays whole).
    """
    final = os.path.join(out_dir, name)
    tmp = final + ".tmp"
    old = final + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.makedirs(tmp)
        for pattern in keep:
            for f in glob.glob(os.path.join(final, pattern)):
                shutil.copy2(f, tmp)
        write(tmp)
    except BaseException as e:
        line = None
        if isinstance(e, Exception):
            line = storage_error_line(e, tmp, "saving", final)  # asked before tmp frees its space
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays behind
        if line:
            stop(line)
        raise
    if not os.path.exists(os.path.join(tmp, marker)):
        raise RuntimeError(f"save_checkpoint: the writer did not write {marker}")
    try:
        if os.path.exists(final):
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
    except OSError as e:
        stop_on_storage_error(e, final, "saving")
        raise
    shutil.rmtree(old, ignore_errors=True)
    return final


def restore_checkpoint(ckpt, out_dir, through_step=False, **objects):
    """Load each object from ckpt/<name>.pt (optimizer=...) and cut out_dir/metrics.jsonl back to
    the checkpoint: later steps and a truncated last line go; through_step keeps the checkpoint's
    own step (sft.py's numbering). Returns state.json's dict."""
    import torch

    for name, obj in objects.items():
        obj.load_state_dict(torch.load(os.path.join(ckpt, f"{name}.pt"), map_location="cpu"))
    state = read_json(os.path.join(ckpt, "state.json"), "step")  # resume_from checked it
    path = os.path.join(out_dir, "metrics.jsonl")
    step = state["step"]
    kept = []
    for r in read_metrics(path):
        if r["step"] < step or (through_step and r["step"] == step):
            kept.append(r)
    _write_rows(path, kept)
    print(f"resumed from {ckpt} at step {step}", flush=True)
    return state


def _write_rows(path, rows):
    """data.write_jsonl_atomic, a full or read-only disk in one line (the old file stays)."""
    import data

    try:
        data.write_jsonl_atomic(path, rows)
    except OSError as e:
        stop_on_storage_error(e, path, "writing")
        raise


FINGERPRINT_BYTES = 1 << 20  # a file's head and tail, hashed at save and checked at resume


def fingerprint(path):
    """{"bytes", "blake2b"}: a file's size and a hash of its first and last MiB. It tells a
    truncated or replaced file (another model's optimizer.pt) from the one a save wrote, at a cost
    that does not grow with the file (a full hash of a 1.5B model's 18 GB checkpoint would take
    seconds at every save)."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        h.update(f.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            f.seek(max(size - FINGERPRINT_BYTES, FINGERPRINT_BYTES))
            h.update(f.read())
    return {"bytes": size, "blake2b": h.hexdigest()}


def file_records(directory):
    """{name: fingerprint} of the files in a checkpoint directory (its subdirectories' too)."""
    records = {}
    for parent, _, files in os.walk(directory):
        for name in sorted(files):
            path = os.path.join(parent, name)
            records[os.path.relpath(path, directory)] = fingerprint(path)
    return records


def check_files(ckpt, state):
    """Every file a checkpoint's save recorded (state.json's "files"; a checkpoint saved before
    they were recorded has none) is there, whole and the same, else one line before anything
    loads: a truncated model.safetensors or another run's optimizer.pt is not a traceback."""
    records = state.get("files")
    if not isinstance(records, dict):
        return
    for name, saved in sorted(records.items()):
        path = os.path.join(ckpt, name)
        problem = None
        if not os.path.isfile(path):
            problem = "is missing"
        elif not isinstance(saved, dict):
            problem = "has a damaged record in state.json"
        else:
            now = fingerprint(path)
            if now["bytes"] != saved.get("bytes"):
                problem = f"has {now['bytes']} bytes, the save wrote {saved.get('bytes')}"
            elif now["blake2b"] != saved.get("blake2b"):
                problem = "is not the file the save wrote (its content differs)"
        check(
            problem is None,
            f"--resume {ckpt}: {name} {problem} (truncated or replaced): restore the checkpoint "
            f"from a copy, or start a new run",
        )


def jsonable(d):
    """A dict with every value JSON can hold (dtypes, paths -> str)."""
    return json.loads(json.dumps(d, default=str))


def save_model_checkpoint(
    out_dir, model, tokenizer, args, state, extra=None, name="checkpoint", keep=(), script=None
):
    """out_dir/<name>/: HF weights + tokenizer + `extra` torch objects ({"optimizer.pt": ...}) +
    state.json (the step counters, the script that wrote the run and its flags, written last),
    swapped in whole by save_checkpoint.

    script: by default this process's (this_script), else the one that claimed out_dir (a Ray
    actor saves a run its driver claimed)."""
    import torch

    import lora

    if script is None:
        script = this_script() or read_claim(out_dir).get("script")

    def write(tmp):
        if lora.lora_layers(model):
            lora.save_adapter(model, tmp, base=args.model)  # LoRA: the adapter only (small)
        else:
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, obj in (extra or {}).items():
            torch.save(obj, os.path.join(tmp, name))
        write_state(tmp, state, args, script)

    return save_checkpoint(out_dir, write, name=name, keep=keep)


def write_state(tmp, state, args, script):
    """A checkpoint's state.json, written last and atomically (a crash mid-write leaves no half file
    that looks complete): `state`, the records of the files beside it (what a resume checks,
    check_files), the script that wrote the run and its flags."""
    import data

    state_with_args = dict(state)
    state_with_args["files"] = file_records(tmp)
    if script:
        state_with_args["script"] = script
    state_with_args["args"] = jsonable(vars(args))
    data.write_json_atomic(os.path.join(tmp, "state.json"), state_with_args)


# in a checkpoint of grpo_ray.py --learner-sharding fsdp: {"learners": M, "files": each learner's
# shard}. Such a checkpoint holds no model until the run's end; only grpo_ray.py resumes it
SHARDS_FILE = "shards.json"


SNAPSHOTS = "checkpoints"  # a run's weights-only series (--keep-checkpoints), beside checkpoint/
SNAPSHOT_NAME = re.compile(r"step_(\d{4,})")  # checkpoints/step_0040: the weights after 40 steps


def snapshots(run_dir):
    """[(step, path)] of the series a run wrote in run_dir/checkpoints/, oldest first: directories
    named step_NNNN that hold the state.json a save writes last. Anything else there is the
    user's, never listed (so never deleted)."""
    folder = os.path.join(run_dir, SNAPSHOTS)
    found = []
    if not os.path.isdir(folder):
        return found
    for name in sorted(os.listdir(folder)):
        match = SNAPSHOT_NAME.fullmatch(name)
        path = os.path.join(folder, name)
        if match and read_json(os.path.join(path, "state.json"), "step"):
            found.append((int(match.group(1)), path))
    found.sort()
    return found


SNAPSHOTS_WRITTEN = "written.json"  # in checkpoints/: the snapshots this run wrote, by name


def save_snapshot(out_dir, model, tokenizer, args, state, keep):
    """--keep-checkpoints N: the weights after state["step"] steps as out_dir/checkpoints/step_NNNN
    (model, tokenizer, state.json; no optimizer), swapped in whole like checkpoint/; then the
    oldest snapshots beyond `keep` are deleted, among those the run wrote (checkpoints/written.json
    lists them, each named before its save starts): a step_NNNN of anyone else's is never deleted
    nor overwritten. Saving a step twice (the last periodic save and the run's end) writes it
    once. -> its path."""
    import data

    step_name = f"step_{state['step']:04d}"
    path = os.path.join(out_dir, SNAPSHOTS, step_name)
    manifest = os.path.join(out_dir, SNAPSHOTS, SNAPSHOTS_WRITTEN)
    record = read_json(manifest, "written")
    if record is None:  # a run saved before the record: its own snapshots, by their state.json
        record = {"written": []}
        for _, snapshot in snapshots(out_dir):
            state = read_json(os.path.join(snapshot, "state.json"), "step")
            if isinstance(state.get("args"), dict) and state.get("script") == this_script():
                record["written"].append(os.path.basename(snapshot))
    written = record["written"]
    if not read_json(os.path.join(path, "state.json"), "step"):
        if step_name not in written:
            written = written + [step_name]
            os.makedirs(os.path.dirname(manifest), exist_ok=True)
            data.write_json_atomic(manifest, {"written": written})
        name = os.path.join(SNAPSHOTS, step_name)
        save_model_checkpoint(out_dir, model, tokenizer, args, state, name=name)
    series = []
    for _, snapshot in snapshots(out_dir):
        if os.path.basename(snapshot) in written:
            series.append(snapshot)
    for old in series[: max(len(series) - keep, 0)]:
        shutil.rmtree(old)
    return path


def start_wandb(project, args, axes):
    """A wandb run (None without a project) with the run's flags, each key pattern on its x-axis
    (seed 000 §4.3)."""
    if not project:
        return None
    import wandb

    run = wandb.init(project=project, config=jsonable(vars(args)))
    for keys, axis in axes.items():
        run.define_metric(axis)
        run.define_metric(keys, step_metric=axis)
    return run


def log_row(out_dir, row, wandb_run=None):
    """Append one row to out_dir/metrics.jsonl (and wandb). A full or read-only disk is one line;
    a row cut short there is the truncated last line that resume drops."""
    path = os.path.join(out_dir, "metrics.jsonl")
    try:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as e:
        stop_on_storage_error(e, path, "appending a row to")
        raise
    if wandb_run is not None:
        wandb_run.log(row)


def read_metrics(path, quiet=False):
    """Rows of a metrics.jsonl, each checked: UTF-8 text, a JSON object, an integer "step" >= 0.

    A bad row is a one-line error naming the file, line and problem. A last line that does not
    parse (a crash mid-append) is dropped, and said unless quiet."""
    if not os.path.exists(path):
        return []
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        fail(f"{path}: cannot read it ({e.strerror})")
    numbered = []  # (line number, line) of the non-blank lines
    for i, line in enumerate(raw.split(b"\n"), 1):
        if line.strip():
            numbered.append((i, line))
    rows = []
    for k, (i, line) in enumerate(numbered):
        last = k == len(numbered) - 1
        problem = None
        row = None
        try:
            row = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            problem = f"not UTF-8 text (byte {line[e.start]:#04x} at column {e.start + 1})"
        except ValueError:
            problem = "corrupt line in the middle of the file"
        if problem and last:
            if not quiet:
                print(f"{path}: dropped a truncated last line (a crash mid-write)", flush=True)
            break
        if problem is None and not isinstance(row, dict):
            problem = f"a JSON {type(row).__name__}, not an object"
        elif problem is None and "step" not in row:
            problem = 'a row without "step"'
        elif problem is None and not is_count(row["step"]):
            problem = f"step {row['step']!r} is not an integer >= 0"
        if problem:
            fail(f"{path}:{i}: {problem}; fix or remove the line")
        rows.append(row)
    return rows


# ------------------------------------------------------------------------- a full or read-only disk
# storage.py says what about the filesystem explains a failed write; here the line adds how the run
# goes on (its --resume). Either way the run stops with one line naming the problem and what to
# do; the last checkpoint stays whole.
def storage_error_line(exc, path, doing, target=None):
    """The one line for a write that `exc` ended, or None when the filesystem does not explain it:
    "disk full: saving runs/x/checkpoint failed (...); free space on /mnt (0.1 MiB free), then
    --resume runs/x continues from its last checkpoint (step 4)". target: what was being written
    (default: path)."""
    if storage_problem(exc, path) is None:
        return None
    return storage_line(exc, path, doing, target, then=_how_to_go_on(path))


def stop_on_storage_error(exc, path, doing, target=None):
    """Stop with storage_error_line's one line (exit code 1) when the filesystem explains `exc`;
    else return, and the caller raises it."""
    line = storage_error_line(exc, path, doing, target)
    if line:
        stop(line)


def stop(line, code=1):
    """One `error:` line on stderr and exit: a failure of the machine, not of the input (fail)."""
    sys.stderr.write(f"error: {line}\n")
    sys.exit(code)


def _how_to_go_on(path):
    """How the run that `path` belongs to continues once the disk is fixed."""
    real = os.path.realpath(path)
    run = None
    for key, (given, _) in _LOCKS.items():
        if real == key or real.startswith(key + os.sep):
            run = given
    if run is None and _LOCKS:
        run = list(_LOCKS.values())[-1][0]  # the run this process claimed (sft's --save-dir)
    if run is not None and os.path.realpath(run) not in _CLAIMED:
        # locked but not claimed as a run: eval_zero_shot.py's or best_of_n.py's --out (no --resume)
        return "run it again (with --overwrite if --out holds results it wrote)"
    parent = real
    for _ in range(3):  # a Ray actor's save, out/checkpoint.tmp/...: its driver claimed out
        parent = os.path.dirname(parent)
        if run is None and run_markers(parent):
            run = parent
    if run is None:
        return "run it again"
    ckpt = find_checkpoint(run, repair=False)
    if ckpt is None:
        return f"--resume {run} restarts it from step 0 (it has no checkpoint yet)"
    state = read_json(os.path.join(ckpt, "state.json"), "step") or {"step": "?"}
    return f"--resume {run} continues from its last checkpoint (step {state['step']})"


def _report_storage_errors():
    """From the first claimed run on, an uncaught exception that a full or read-only disk explains
    (a write outside common's writers: args.json, rollouts/) ends in one line, not a traceback."""
    previous = sys.excepthook
    if getattr(previous, "reports_storage_errors", False):
        return

    def hook(kind, exc, tb):
        path = getattr(exc, "filename", None)
        if not path and _LOCKS:
            path = list(_LOCKS.values())[-1][0]  # not a file's error: ask the run's disk
        problem = None
        if isinstance(exc, Exception) and path:
            problem = storage_problem(exc, path)
        if problem and problem != "permission denied":  # (a read may be refused too)
            sys.stderr.write(f"error: {storage_error_line(exc, path, 'writing')}\n")
            return
        previous(kind, exc, tb)

    hook.reports_storage_errors = True
    sys.excepthook = hook


# ----------------------------------------------------------------------------- Ctrl-C and SIGTERM
# SIGTERM (schedulers, `timeout`, container stops) is handled like Ctrl-C: both raise
# KeyboardInterrupt, so each script's Ctrl-C path (finish the step, save, exit) runs for either.
# The exit code says which: 130 for SIGINT, 143 for SIGTERM (the shell's 128 + signal number).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_last_stop = {"signal": signal.SIGINT}  # the signal of the last stop request


def stop_on_sigterm():
    """Make SIGTERM raise KeyboardInterrupt, as Ctrl-C does, and remember which of the two came
    last. Call once at the start of a script's main (the main thread only; a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        _last_stop["signal"] = signum
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    # Ctrl-C too, so the exit code names the last signal (a SIGINT the process ignores stays so)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handler)


def stop_exit_code():
    """The exit code after a stop request has been handled (the state saved): 143 after SIGTERM,
    130 after Ctrl-C."""
    return 128 + int(_last_stop["signal"])


def stop_name():
    """ "SIGTERM" or "Ctrl-C": what the last stop request was, for messages."""
    if _last_stop["signal"] == signal.SIGTERM:
        return "SIGTERM"
    return "Ctrl-C"


@contextlib.contextmanager
def finish_then_interrupt(what="this step"):
    """Defer a first Ctrl-C or SIGTERM until the block ends (then raise KeyboardInterrupt); a
    second one aborts now. A no-op outside the main thread (only it receives signals); a signal
    the process ignores (SIGINT in a nohup / background job) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hits = []

    def handler(signum, frame):
        _last_stop["signal"] = signum
        if hits:
            raise KeyboardInterrupt
        hits.append(signum)
        name = stop_name()
        print(
            f"\n{name}: finishing {what} so the saved state is consistent ({name} again to abort "
            f"without saving)",
            file=sys.stderr,
            flush=True,
        )

    old = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
    if hits:
        raise KeyboardInterrupt
