"""A failed write explained in one line: a full, read-only or size-limited disk, and what to do.

The bottom layer (it imports nothing of the project), so every writer can use it: data.py's files,
convert_lm.py's model directory, runs.py's checkpoints (runs.storage_error_line adds how a run goes
on: its --resume).

    try:
        write(path)
    except Exception as e:
        line = storage_line(e, path, "writing", then="run it again")
        if line is None:
            raise
        sys.exit(f"error: {line}")
"""

import errno
import os
import resource

# Writes fail on a full disk in many dialects: OSError(ENOSPC) from Python, "No space left on
# device" inside a safetensors error, and torch.save's "unexpected pos 704 vs 598", which names
# nothing. So the filesystem itself is asked too, right after the failure.
FULL_BYTES = 1 << 20  # less free space than this after a failed write: the disk is full
_ERRNOS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EFBIG: "file too large",  # over the file-size limit (ulimit -f), or the filesystem's
}
# how the errnos read inside another library's message (safetensors, tokenizers: Rust's io errors)
_MESSAGES = {
    "No space left on device": "disk full",
    "Disk quota exceeded": "disk quota exceeded",
    "Read-only file system": "read-only file system",
    "File too large": "file too large",
}


def storage_problem(exc, path):
    """What about the filesystem of `path` explains `exc`: "disk full", "disk quota exceeded",
    "read-only file system", "permission denied", "file too large", or None (something else: raise
    it as is)."""
    if isinstance(exc, OSError):
        return _ERRNOS.get(exc.errno)  # other errnos (a missing file...) are no disk's
    for text, problem in _MESSAGES.items():
        if text in str(exc):
            return problem
    try:
        fs = os.statvfs(existing(path))
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        return "read-only file system"
    if fs.f_bavail * fs.f_frsize < FULL_BYTES:
        return "disk full"
    return None


def storage_line(exc, path, doing, target=None, then="run it again"):
    """The one line for a write that `exc` ended, or None when the filesystem does not explain it:
    "disk full: saving models/x failed (...); free space on /mnt (0.1 MiB free now), then run it
    again". target: what was being written (default: path); then: how the user goes on."""
    problem = storage_problem(exc, path)
    if problem is None:
        return None
    if target is None:
        target = path
    detail = getattr(exc, "strerror", None)
    if not detail:
        text = str(exc).strip().splitlines() or [""]
        detail = f"{type(exc).__name__}: {text[0][:150]}"
    mount = mount_point(path)
    if problem == "read-only file system":
        fix = f"make {mount} writable again"
    elif problem == "permission denied":
        fix = f"make {os.path.dirname(os.path.abspath(target))} writable for this user"
    elif problem == "file too large":
        fix = f"raise the file-size limit ({size_limit()}) or write to a filesystem without one"
    else:
        fs = os.statvfs(mount)
        fix = f"free space on {mount} ({fs.f_bavail * fs.f_frsize / 2**20:.1f} MiB free now)"
    return f"{problem}: {doing} {target} failed ({detail}); {fix}, then {then}"


def unwritable(path):
    """Why `path` (a file or directory to be made) cannot be written: "read-only file system" or
    "permission denied" on its nearest existing ancestor, or None. Asked before any work; a full
    disk shows only when a write fails."""
    parent = existing(os.path.dirname(os.path.abspath(path)))
    if os.access(parent, os.W_OK | os.X_OK):
        return None
    if os.statvfs(parent).f_flag & os.ST_RDONLY:
        return f"read-only file system ({mount_point(parent)})"
    return f"permission denied ({parent} is not writable for this user)"


def size_limit():
    """This process's file-size limit as a user sets it: "ulimit -f 200" (1 KiB blocks) or
    "ulimit -f: unlimited" (the filesystem's own limit, then)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        return "ulimit -f: unlimited"
    return f"ulimit -f {soft // 1024}"


def existing(path):
    """path, or its nearest ancestor that exists."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def mount_point(path):
    """The mount point of the filesystem holding path: the longest listed in /proc/self/mounts
    that holds it (a bind mount on the same device included), else found by os.path.ismount."""
    path = os.path.realpath(existing(path))
    best = None
    try:
        with open("/proc/self/mounts") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 2:
            continue
        point = fields[1].replace("\\040", " ")  # (mounts escapes a space as \040)
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) > len(best):
                best = point
    if best is None:
        best = path
        while not os.path.ismount(best):
            best = os.path.dirname(best)
    return best
