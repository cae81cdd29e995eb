"""Bad input is one line: the parser, `fail` / `check`, typed flags, files and model directories.

Every root script reads its flags through here, so a bad value, path or size stops with one line on
stderr ("error: ...", exit code 2) before anything loads: `Parser` (argparse without the usage
block), `fail`, `check` (a consistency check whose message names the fix), `attempt` (a ValueError
as one line), the typed flags (`positive_int`, `fraction`, `existing_file`, ...), local model
directories (`check_model_dir`) and hub ids (`check_hub_ids`, asked when a run starts).

The bottom layer: it imports nothing of the project. A run on disk (directories, resume,
checkpoints, metric rows, stop signals) is runs.py; precision and threads are hardware.py; the
validation every trainer logs is validation.py.

    args = Parser(description="...").parse_args(argv)
    check(args.batch_size % args.group_size == 0, "--batch-size must be a multiple of --group-size")
"""

import argparse
import json
import math
import os
import sys


# ----------------------------------------------------------------------------- one-line errors
class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line on stderr (no usage block), exit code 2."""

    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*a, **kw)

    def error(self, message):
        sys.stderr.write(f"error: {message} (see --help)\n")
        sys.exit(2)


def fail(message):
    """Stop with a one-line error (exit code 2), the way a bad flag does."""
    sys.stderr.write(f"error: {message}\n")
    sys.exit(2)


def attempt(fn, *a, what=None, **kw):
    """fn(*a, **kw), its ValueError (a bad file, prompt or task) turned into a one-line error."""
    try:
        return fn(*a, **kw)
    except ValueError as e:
        message = str(e)
        if what:
            message = f"{what}: {e}"
        fail(message)


def check(cond, message):
    """A derived-size or consistency check whose message names the fix.

    Not assert: it survives python -O.
    """
    if not cond:
        fail(message)


def _typed(name, convert, ok, what):
    """An argparse type: convert(s), accepted when ok(value) holds, else "'s' is not <what>"."""

    def parse(s):
        try:
            value = convert(s)
            accepted = ok(value)
        except (TypeError, ValueError):
            accepted = False
        if accepted:
            return value
        raise argparse.ArgumentTypeError(f"{s!r} is not {what}")

    parse.__name__ = name  # argparse names the type in its message
    return parse


def _writable_file_path(s):
    """Not a directory, and its directory exists and is writable (checked before any work)."""
    if os.path.isdir(s):
        return False
    return os.access(os.path.dirname(os.path.abspath(s)), os.W_OK)


def _comma_ints(s):
    return [int(x) for x in str(s).split(",")]


def _all_positive(values):
    return values and all(x > 0 for x in values)


positive_int = _typed("positive_int", int, lambda v: v > 0, "an integer > 0")
nonneg_int = _typed("nonneg_int", int, lambda v: v >= 0, "an integer >= 0")
positive_float = _typed(
    "positive_float", float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0"
)
nonneg_float = _typed(
    "nonneg_float", float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"
)
# --threads: more than the machine's CPUs only oversubscribes (and 50000 crashes OpenMP)
thread_count = _typed(
    "thread_count",
    int,
    lambda v: 0 < v <= (os.cpu_count() or 1),
    f"an integer in 1..{os.cpu_count() or 1} (this machine's CPUs)",
)
probability = _typed("probability", float, lambda v: 0 < v <= 1, "a probability in (0, 1]")
fraction = _typed("fraction", float, lambda v: 0 <= v <= 1, "a fraction in [0, 1]")
output_file = _typed(
    "output_file", str, _writable_file_path, "a file path in an existing, writable directory"
)
int_list = _typed(
    "int_list", _comma_ints, _all_positive, "a comma list of integers > 0 (e.g. 256,512,1024)"
)


def existing_file(s):
    """argparse type: a readable, non-empty regular file."""
    if not os.path.exists(s):
        raise argparse.ArgumentTypeError(f"{s}: no such file")
    if not os.path.isfile(s):
        raise argparse.ArgumentTypeError(f"{s}: is a directory, expected a file")
    if os.path.getsize(s) == 0:
        raise argparse.ArgumentTypeError(f"{s}: file is empty")
    return s


def data_path(s):
    """argparse type for a task's data: "synthetic" (data.py's Countdown generator) or a non-empty
    file."""
    if s == "synthetic":
        return s
    return existing_file(s)


# flag -> hub id, checked when a run starts (claim_run_dir): a dry run or a bad flag needs no
# network
_HUB_IDS = {}

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".safetensors.index.json")
_TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model"}


def _is_local_path(path):
    """A path that exists, is absolute, starts with . or ~, or whose parent directory exists."""
    if os.path.exists(path) or os.path.isabs(path):
        return True
    if path.startswith((".", "~")):
        return True
    return os.path.isdir(os.path.dirname(path) or ".")


def check_model_dir(path, flag="--model"):
    """A local model directory must be loadable: config.json naming a model_type, weights and a
    tokenizer. A hub id (anything that is not a local path, see _is_local_path) waits for
    check_hub_ids."""
    if not _is_local_path(path):
        _HUB_IDS[flag] = path
        return path
    _HUB_IDS.pop(flag, None)
    p = os.path.expanduser(path)
    if not os.path.isdir(p):
        fail(
            f"{flag} {path}: no such directory "
            f"(pass a model directory or a hub id like Qwen/Qwen2.5-Math-1.5B)"
        )
    files = set(os.listdir(p))
    config = os.path.join(p, "config.json")
    if "config.json" not in files:
        fail(f"{flag} {path}: no config.json there; this is not a model directory")
    weights = [f for f in files if f.endswith(_WEIGHT_SUFFIXES)]
    if not weights:
        fail(
            f"{flag} {path}: no weights (model.safetensors or pytorch_model.bin) "
            f"— a broken or half-written checkpoint"
        )
    if not files & _TOKENIZER_FILES:
        fail(
            f"{flag} {path}: no tokenizer files (tokenizer.json / tokenizer_config.json) "
            f"next to the weights"
        )
    check(
        read_json(config, "model_type"), f"{flag} {path}: {config} is not JSON naming a model_type"
    )
    return path


def check_hub_ids():
    """Each hub id check_model_dir saw is in the local hub cache (offline use works) or served by
    the hub: one request, no retries (online, an uncached model still downloads when it loads).
    Else one line now, not a traceback 30 s later."""
    for flag, repo in list(_HUB_IDS.items()):
        from huggingface_hub import HfApi, try_to_load_from_cache

        del _HUB_IDS[flag]
        try:
            cached = try_to_load_from_cache(repo, "config.json")
            if not isinstance(cached, str):
                # private / gated: needs `hf auth login`, as its load would
                HfApi().model_info(repo, timeout=10)
        except Exception as e:  # network, HTTP, offline-mode and id errors alike: one line
            lines = str(e).strip().splitlines()
            first_line = ""
            if lines:
                first_line = lines[0]
            fail(
                f"{flag} {repo}: not in the local hub cache and the hub does not serve it "
                f"({type(e).__name__}: {first_line[:150]}); "
                f"pass a model directory or check the id/network"
            )


def read_json(path, key):
    """The JSON object in a file if it parses and holds `key`, else None (missing, unreadable,
    corrupt or foreign)."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(obj, dict) and key in obj:
        return obj
    return None
