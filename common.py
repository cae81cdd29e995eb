"""What every root script shares, so that a bad input fails fast and no run loses or mixes data.

- One-line errors: a bad value, path or size is one line on stderr ("error: ...", exit code 2)
  before anything loads: `Parser`, `fail`, `check`, the typed flags (`positive_int`, ...), model
  directories (`check_model_dir`) and hub ids (`check_hub_ids`).
- Runs: `--dry-run` prints the effective flags; `--resume RUN` restores the run's saved flags
  (`resume_from`); a run directory is claimed once (`claim_run_dir`); checkpoints are swapped in
  whole (`save_checkpoint`), so a crash leaves one complete copy; metrics.jsonl rows are appended
  one at a time and cut back to the checkpoint on resume (`restore_checkpoint`).
- The validation every trainer logs (`greedy_eval`), precision (fp32 master weights + bf16
  autocast, `resolve_precision`), the GPU share of a vLLM engine next to the policy
  (`engine_share`), and a Ctrl-C that finishes the step before it stops (`finish_then_interrupt`).

Not a script: the root scripts import it, e.g.

    args = Parser(description="...").parse_args(argv)
    check(args.batch_size % args.group_size == 0, "--batch-size must be a multiple of --group-size")
    claim_run_dir(args.out, args.resume)
"""

import argparse
import contextlib
import glob
import json
import math
import os
import shutil
import signal
import sys
import threading


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


# ----------------------------------------------------------------------------- resume and dry runs
def resume_from(parser, argv, args, needs=()):
    """--resume RUN: the run's complete checkpoint (an interrupted save recovered), checked for the
    files a model and `needs` (optimizer.pt, ...) need, its saved flags restored into args (flags
    given on this command line override them)."""
    dry = getattr(args, "dry_run", False)
    ckpt = find_checkpoint(args.resume, repair=not dry)  # a dry run only looks
    if not ckpt:
        fail(
            f"--resume {args.resume}: no complete checkpoint there "
            f"(expected <run>/checkpoint/state.json)"
        )
    check_model_dir(ckpt, "--resume")  # a broken checkpoint names its missing file
    for f in needs:
        check(
            os.path.isfile(os.path.join(ckpt, f)),
            f"--resume {ckpt}: {f} is missing (a broken checkpoint)",
        )
    state = read_json(os.path.join(ckpt, "state.json"), "step")
    if not state:
        fail(f"--resume {ckpt}: its state.json is corrupt")
    run_dir = os.path.dirname(ckpt)
    read_metrics(os.path.join(run_dir, "metrics.jsonl"), quiet=True)  # a corrupt row: refused now
    saved = {**state.get("args", {}), "out": run_dir}
    resume_args(parser, argv, args, saved)
    args.resume = ckpt
    return args


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


def resume_args(parser, argv, args, saved, keep=("resume", "dry_run")):
    """Take every flag of a resumed run from `saved` (its args.json) unless given again on this
    command line; print the overrides. Keys that are not this parser's flags (derived sizes) are
    ignored."""
    given = explicit_dests(parser, argv) | set(keep)
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    overrides = []
    for k in sorted(dests & set(saved) - set(keep)):
        if k not in given:
            setattr(args, k, saved[k])
        elif getattr(args, k) != saved[k]:
            overrides.append(f"{k} {saved[k]!r} -> {getattr(args, k)!r}")
    message = "resume: restored the run's flags from its checkpoint"
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


def claim_run_dir(out, resume=None, flag="--out"):
    """Refuse an existing run without --resume; create `out` and check it is writable, before any
    work."""
    check_hub_ids()  # the run starts (a dry run never gets here): the hub ids too
    check(
        not os.path.exists(out) or os.path.isdir(out), f"{flag} {out}: is a file; pass a directory"
    )
    held = []
    if not resume:
        held = [m for m in RUN_MARKERS if os.path.exists(os.path.join(out, m))]
    check(
        not held,
        f"{flag} {out} already holds a run ({', '.join(held)}); "
        f"pass --resume {out} to continue it, or choose a new {flag}",
    )
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, f".write_probe{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        fail(f"{flag} {out}: not writable ({e.strerror})")
    return out


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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays behind
        raise
    if not os.path.exists(os.path.join(tmp, marker)):
        raise RuntimeError(f"save_checkpoint: the writer did not write {marker}")
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def restore_checkpoint(ckpt, out_dir, through_step=False, **objects):
    """Load each object from ckpt/<name>.pt (optimizer=...) and cut out_dir/metrics.jsonl back to
    the checkpoint: later steps and a truncated last line go; through_step keeps the checkpoint's
    own step (sft.py's numbering). Returns state.json's dict."""
    import torch

    import data

    for name, obj in objects.items():
        obj.load_state_dict(torch.load(os.path.join(ckpt, f"{name}.pt"), map_location="cpu"))
    state = read_json(os.path.join(ckpt, "state.json"), "step")  # resume_from checked it
    path = os.path.join(out_dir, "metrics.jsonl")
    step = state["step"]
    kept = []
    for r in read_metrics(path):
        if r["step"] < step or (through_step and r["step"] == step):
            kept.append(r)
    data.write_jsonl_atomic(path, kept)
    print(f"resumed from {ckpt} at step {step}", flush=True)
    return state


def jsonable(d):
    """A dict with every value JSON can hold (dtypes, paths -> str)."""
    return json.loads(json.dumps(d, default=str))


def save_model_checkpoint(
    out_dir, model, tokenizer, args, state, extra=None, name="checkpoint", keep=()
):
    """out_dir/<name>/: HF weights + tokenizer + `extra` torch objects ({"optimizer.pt": ...}) +
    state.json (the step counters and the run's flags, written last), swapped in whole by
    save_checkpoint."""
    import torch

    import data

    def write(tmp):
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, obj in (extra or {}).items():
            torch.save(obj, os.path.join(tmp, name))
        # state.json last and atomically: a crash mid-write leaves no half file that looks complete
        state_with_args = {**state, "args": jsonable(vars(args))}
        data.write_json_atomic(os.path.join(tmp, "state.json"), state_with_args)

    return save_checkpoint(out_dir, write, name=name, keep=keep)


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
    """Append one row to out_dir/metrics.jsonl (and wandb)."""
    with open(os.path.join(out_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    if wandb_run is not None:
        wandb_run.log(row)


def read_metrics(path, quiet=False):
    """Rows of a metrics.jsonl; a truncated last line (a crash mid-append) is dropped, and said
    unless quiet. A corrupt line before the last is a one-line error."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    numbered = []  # (line number, line) of the non-blank lines
    for i, line in enumerate(text.split("\n"), 1):
        if line.strip():
            numbered.append((i, line))
    rows = []
    for k, (i, line) in enumerate(numbered):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if k < len(numbered) - 1:
                fail(f"{path}:{i}: corrupt line in the middle of the file; fix or remove it")
            if not quiet:
                print(f"{path}: dropped a truncated last line (a crash mid-write)", flush=True)
    return rows


# ----------------------------------------------------------------------------- validation
def greedy_eval(engine, rows, reward, max_tokens, min_tokens=0, workers=None):
    """The validation every trainer logs: greedy answers to the rows' prompts (stopped at their
    "stop" strings) on the engine's weights, graded -> (eval/ metrics, sample rows).
    eval/accuracy is the fraction with answer reward 1, in every script."""
    import grader
    import rollout

    prompts = [r["prompt"] for r in rows]
    stop = []
    if rows:
        stop = rows[0]["stop"]
    generations = rollout.generate(
        engine,
        prompts,
        n=1,
        temperature=0.0,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop=stop,
    )
    outs = [samples[0] for samples in generations]  # n=1: one sample per prompt
    texts = [o["text"] for o in outs]
    gts = [r["ground_truth"] for r in rows]
    dicts = grader.grade_batch(grader.REWARD_FNS[reward], texts, gts, workers=workers)

    n = max(len(outs), 1)
    metrics = {}
    for k in ("reward", "format_reward", "answer_reward"):
        metrics[f"eval/{k}"] = sum(d[k] for d in dicts) / n
    metrics["eval/accuracy"] = sum(1 for d in dicts if d["answer_reward"] >= 1) / n
    metrics["eval/response_len"] = sum(len(o["token_ids"]) for o in outs) / n
    metrics["eval/truncation_rate"] = sum(1 for o in outs if o["finish_reason"] == "length") / n

    samples = []
    for r, o, g, d in zip(rows, outs, gts, dicts):
        samples.append(
            {"split": "eval", "prompt": r["prompt"], "response": o["text"], "ground_truth": g, **d}
        )
    return metrics, samples


# ----------------------------------------------------------------------------- precision
DTYPES = ("auto", "float32", "bfloat16")


def resolve_precision(device, dtype="auto", pure_bf16=False):
    """(the weights' and AdamW's dtype, the forward/backward dtype).

    auto: bf16 compute on CUDA, fp32 on CPU. bf16 compute keeps fp32 master weights (autocast):
    pure bf16 (--pure-bf16) rounds away updates under half a bf16 step (at lr 1e-5: any
    |w| >~ 0.004).
    """
    import torch

    on_cuda = str(device).startswith("cuda")
    if dtype == "bfloat16" or (dtype == "auto" and on_cuda):
        compute = torch.bfloat16
    else:
        compute = torch.float32
    if pure_bf16:
        return compute, compute
    return torch.float32, compute


def _dtype_bytes(dtype):
    """Bytes per element of a torch dtype or its name ("bfloat16")."""
    import torch

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.finfo(dtype).bits // 8


def engine_share(
    policy_device, vllm_device, param_dtype, sleep_engine, policy=None, extra_models=0
):
    """vLLM's GPU fraction (gpu_memory_utilization).

    0.85 on its own GPU (seed 001) or with no policy beside it. On the policy's GPU, what the
    trainer leaves: the weights and AdamW's two moments (+ extra_models frozen copies in the
    weights' dtype) stay resident, gradients only while training (not with --sleep-engine);
    activations and the allocator get a 15% margin.
    """
    import torch

    pol = torch.device(policy_device)
    eng = torch.device(vllm_device)
    if policy is None:
        return 0.85
    same_gpu = pol.type == eng.type == "cuda" and (pol.index or 0) == (eng.index or 0)
    if not same_gpu:
        return 0.85
    w = _dtype_bytes(param_dtype)  # bytes per weight
    n = sum(p.numel() for p in policy.parameters())
    resident = n * 3 * w + w * n * int(extra_models)  # weights + 2 AdamW moments + frozen copies
    grads = n * w
    total = torch.cuda.get_device_properties(pol).total_memory
    in_use = resident
    if not sleep_engine:
        in_use = resident + grads  # gradients are held only while training
    share = 1 - in_use / total - 0.15
    check(
        share > 0.05,
        f"the policy needs {(resident + grads) / 2**30:.1f} GiB of this GPU's {total / 2**30:.1f}: "
        f"use a second GPU (--vllm-device cuda:1), --pure-bf16 or --sleep-engine",
    )
    print(f"engine: gpu_memory_utilization {share:.2f} (the rest is the trainer's)", flush=True)
    return share


def autocast(device, compute_dtype):
    """Context for forward/backward in compute_dtype over fp32 weights (a no-op when they match)."""
    import torch

    if compute_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(str(device).split(":")[0], compute_dtype)


# ----------------------------------------------------------------------------- Ctrl-C and SIGTERM
# SIGTERM (schedulers, `timeout`, container stops) is handled like Ctrl-C: both raise
# KeyboardInterrupt, so each script's Ctrl-C path (finish the step, save, exit) runs for either.
# The exit code says which: 130 for SIGINT, 143 for SIGTERM (the shell's 128 + signal number).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_last_stop = {"signal": signal.SIGINT}  # the signal of the last stop request


def stop_on_sigterm():
    """Make SIGTERM raise KeyboardInterrupt, as Ctrl-C does. Call once at the start of a script's
    main (the main thread only; a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        _last_stop["signal"] = signum
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


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
