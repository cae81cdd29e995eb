"""Run doctor: reads a training run's own logs and says, in plain language, what went wrong.

For each run directory it reads args.json (the flags), metrics.jsonl (train and eval rows) and
rollouts/ (grpo.py's step_NNNN.jsonl, grpo_ray.py's eval_vNNNN.jsonl, sft.py's step files), then
prints each pathology it finds with its evidence (steps, values) and the usual fixes, most severe
first. Three levels: a problem (the run is not learning, or its numbers are broken), a warning
(it learns, but something is going wrong), a notice (true and worth knowing, not wrong). Exit
status: 0 when no problem or warning was found, 1 otherwise; a missing run directory or
metrics.jsonl is a one-line error (exit 2). The thresholds are the named constants below; the
docs/doctor.md lists them.

The checks read grpo.py's and grpo_ray.py's keys (grpo.STEP_KEYS and docs/metrics.md).
expert_iteration.py and sft.py runs are not GRPO runs: the doctor says so and runs only the checks
their keys support (expert iteration: rewards, entropy, lengths, gradients, validation; sft: the
gradients and the evaluation). Not in any paper or seed: the diagnoses are the common questions of
RL-library issue threads ("reward stuck at 0", "loss is 0", "entropy collapsed", ...) answered from
the run's logs.

Examples:
  python doctor.py runs/20261126-074901
  python doctor.py runs/lr1e-5 runs/lr3e-5          # several runs; also compares final accuracy
  python doctor.py runs/a --json                    # one JSON object for machines
"""

import json
import math
import os
import statistics
import sys

import common
import runs

# ----------------------------------------------------------------------------- thresholds
# Each is documented in docs/doctor.md's table. A trend compares the mean of the first
# WINDOW rollout steps with the mean of the last WINDOW (a third of the run when it is shorter).
WINDOW = 5  # rollout steps averaged at each end of a run when a trend is judged
MIN_STEPS = 4  # fewer logged rollout steps: no trend is judged
ZERO_REWARD = 0.01  # a mean reward below this is "0"
ZERO_VAR_WARN = 0.5  # mean fraction of groups whose G rewards are all equal: a warning
ZERO_VAR_PROBLEM = 0.9  # ... and a problem: almost no group teaches anything
LOSS_NEAR_ZERO = 0.05  # median |train/loss| below this: the "loss ~ 0 is expected" notice
ENTROPY_COLLAPSE = 0.25  # the end's mean entropy below this fraction of the start's
LENGTH_GROWTH = 2.0  # the end's mean response length over the start's: a notice
TRUNCATION_WARN = 0.1  # the end's mean fraction of responses cut at --max-tokens: a warning
TRUNCATION_PROBLEM = 0.3  # ... and a problem
RATIO_SPIKE = 10.0  # train/ratio_max above this, or train/ratio_min below its inverse
IS_WEIGHT_SPIKE = 10.0  # train/is_weight_max above this (rollout importance weight pi_old / mu)
IS_OUTSIDE_FRAC = 0.05  # train/is_weight_outside_frac above this (tokens outside [0.5, 2])
MISMATCH_KL = 1e-2  # train/mismatch_kl above this: the engine samples another distribution
GRAD_SPIKE = 10.0  # a grad norm this many times the run's median
CLIP_ALWAYS = 0.9  # this fraction of optimizer steps (or more) clipped at --max-grad-norm
REWARD_RISE = 0.05  # the end's mean train reward minus the start's: "rising"
KL_REF_MAX = 0.1  # train/kl_ref per response token (seq: divided by the mean length), nats
TOOL_ERROR_RATE = 0.5  # the end's mean tool/error_rate above this (--tools)
TOOL_CALLS_ZERO = 0.05  # tool calls per response below this are "none" (--tools)
TRUNCATED_BY_TOOL = 0.1  # the end's mean tool/truncated_by_tool_rate above this (--tools)
MISMATCH_MULTI_TURN = 2.0  # multi-turn rows' median log-prob mismatch over single-turn rows'
MISMATCH_FLOOR = 1e-3  # ... when above this (nats per token): smaller is float noise
Z = 2.0  # standard errors that make a difference "resolved" (about 95%)
EVAL_RESOLUTION = 0.05  # the accuracy difference an evaluation should resolve at Z SEs

SEVERITIES = ("problem", "warning", "notice")  # most severe first
GRPO = ("grpo.py", "grpo_ray.py")
RL = ("grpo.py", "grpo_ray.py", "expert_iteration.py")  # runs that sample and reward


def parse_args(argv=None):
    p = common.Parser(
        description="Diagnose training runs from their logs: each pathology with its evidence "
        "and the usual fixes, most severe first. Exit 0 when none is found, 1 otherwise."
    )
    p.add_argument(
        "runs",
        nargs="+",
        help="run directories (the --out of grpo.py, grpo_ray.py, expert_iteration.py, sft.py)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (runs, findings, comparisons, exit) instead of text",
    )
    args = p.parse_args(argv)
    for run in args.runs:
        common.check(
            os.path.isdir(run), f"{run}: no such run directory; pass a run's --out directory"
        )
        common.check(
            os.path.isfile(os.path.join(run, "metrics.jsonl")),
            f"{run}: no metrics.jsonl; pass a run directory that logged at least one row",
        )
    return args


# ----------------------------------------------------------------------------- reading a run
def read_rows(path):
    """The rows of a metrics.jsonl that are JSON objects with an integer "step" >= 0, and the
    line numbers of those that are not (a crash mid-write, a hand edit): skipped, not fatal."""
    rows = []
    skipped = []
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError as e:
        common.fail(f"{path}: cannot read it ({e.strerror})")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except ValueError:  # not UTF-8 (UnicodeDecodeError) or not JSON
            skipped.append(number)
            continue
        if not isinstance(row, dict) or not runs.is_count(row.get("step")):
            skipped.append(number)
            continue
        rows.append(row)
    return rows, skipped


def read_json_object(path):
    """A JSON file's object, or {} when it is missing or not a JSON object."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    return value


def read_rollouts(run_dir):
    """[(file name, sample rows)] of rollouts/*.jsonl in name order; unreadable lines skipped."""
    folder = os.path.join(run_dir, "rollouts")
    if not os.path.isdir(folder):
        return []
    found = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        samples = []
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                for line in f:
                    try:
                        sample = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(sample, dict):
                        samples.append(sample)
        except (OSError, UnicodeDecodeError):
            continue
        found.append((name, samples))
    return found


def script_of(run_dir, saved, rows):
    """Which script wrote the run: from its flags, else its run.lock, else its metric keys."""
    if "placement" in saved:
        return "grpo_ray.py"
    if "n_ei_steps" in saved:
        return "expert_iteration.py"
    if "n_grpo_steps" in saved:
        return "grpo.py"
    claimed = runs.read_claim(run_dir).get("script")
    if isinstance(claimed, str) and claimed:
        return claimed
    keys = set()
    for row in rows:
        keys.update(row)
    if "ray/lag" in keys:
        return "grpo_ray.py"
    if "train/kept_frac" in keys:
        return "expert_iteration.py"
    if "train/zero_var_frac" in keys:
        return "grpo.py"
    if "eval_step" in keys or "train/nll_per_token" in keys:
        return "sft.py"
    return "unknown"


def read_run(run_dir):
    """Everything the checks read: the flags, the train rows (one per optimizer step), the step
    rows (the last train row of each rollout step), the eval rows, the rollouts."""
    rows, skipped = read_rows(os.path.join(run_dir, "metrics.jsonl"))
    saved = read_json_object(os.path.join(run_dir, "args.json"))
    train = []
    evals = {}  # step -> its eval row (a repeated step: the last one)
    last_of_step = {}  # step -> the last train row of that rollout step
    for row in rows:
        if "eval/accuracy" in row:
            evals[row["step"]] = row
        elif any(key.startswith("train/") for key in row):
            train.append(row)
            last_of_step[row["step"]] = row
    steps = []
    for step in sorted(last_of_step):
        steps.append(last_of_step[step])
    eval_rows = []
    for step in sorted(evals):
        eval_rows.append(evals[step])
    return {
        "dir": run_dir,
        "script": script_of(run_dir, saved, rows),
        "args": saved,
        "has_args": bool(saved),
        "train": train,
        "steps": steps,
        "evals": eval_rows,
        "skipped": skipped,
        "rollouts": read_rollouts(run_dir),
    }


# ----------------------------------------------------------------------------- helpers
def number(value):
    """value as a float when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value):
        return None
    return float(value)


def series(rows, key):
    """[(row, value)] of the rows holding a finite number under key."""
    found = []
    for row in rows:
        value = number(row.get(key))
        if value is not None:
            found.append((row, value))
    return found


def ends(points):
    """(mean of the first window, mean of the last window, window) of a series' values."""
    window = max(1, min(WINDOW, len(points) // 3))
    first = []
    last = []
    for _, value in points[:window]:
        first.append(value)
    for _, value in points[-window:]:
        last.append(value)
    return statistics.fmean(first), statistics.fmean(last), window


def where(row):
    """A row's place in words: its optimizer step when it has one, else its step."""
    if "opt_step" in row:
        return f"opt step {row['opt_step']}"
    return f"step {row['step']}"


def span(points, window, at_end):
    """ "steps a-b" of a trend window, for the evidence."""
    chosen = points[:window]
    if at_end:
        chosen = points[-window:]
    first = chosen[0][0]["step"]
    last = chosen[-1][0]["step"]
    if first == last:
        return f"step {first}"
    return f"steps {first}-{last}"


def fmt(value):
    return f"{value:.3g}"


def listing(points, limit=5):
    """ "opt step 3: 41.2, opt step 9: 55" for up to `limit` points, then how many more."""
    parts = []
    for row, value in points[:limit]:
        parts.append(f"{where(row)}: {fmt(value)}")
    text = ", ".join(parts)
    if len(points) > limit:
        text += f" and {len(points) - limit} more"
    return text


def sample_excerpt(run, split, best=False, chars=160):
    """A rollout sample of `split` from the newest file holding one (best: its highest-reward
    one, else its first) as one line of evidence, or "" when none is saved."""
    for name, samples in reversed(run["rollouts"]):
        chosen = None
        for sample in samples:
            if sample.get("split") != split or not isinstance(sample.get("response"), str):
                continue
            reward = number(sample.get("reward"))
            if chosen is None:
                chosen = sample
            elif best and reward is not None and reward > (number(chosen.get("reward")) or 0):
                chosen = sample
        if chosen is None:
            continue
        text = chosen["response"].strip().replace("\n", "\\n")
        if len(text) > chars:
            text = "..." + text[-chars:]
        scores = []
        for key in ("reward", "format_reward", "answer_reward"):
            value = number(chosen.get(key))
            if value is not None:
                scores.append(f"{key} {fmt(value)}")
        return f'a {split} sample in rollouts/{name} ({", ".join(scores)}): "{text}"'
    return ""


def finding(severity, code, title, evidence, fixes, values):
    """One diagnosis: what (title), the numbers behind it (evidence, values) and what to do."""
    return {
        "severity": severity,
        "code": code,
        "title": title,
        "evidence": evidence,
        "fixes": fixes,
        "values": values,
    }


def flag(run, name):
    """A flag of the run's args.json, or None."""
    return run["args"].get(name)


def standard_error(p, n):
    """The standard error of a fraction p measured on n independent questions."""
    return math.sqrt(max(p * (1 - p), 0.0) / n)


# ----------------------------------------------------------------------------- the checks
# Each takes the run (read_run) and returns a list of findings. CHECKS below says which scripts'
# runs each applies to; a check whose keys a run lacks finds nothing.
def check_nonfinite(run):
    """NaN or infinite train/ values: the run's numbers are broken from that row on."""
    bad = []
    for row in run["train"]:
        for key, value in row.items():
            if key.startswith("train/") and isinstance(value, float) and not math.isfinite(value):
                bad.append((row, key, value))
    if not bad:
        return []
    row = bad[0][0]  # the first bad row, key and value
    key = bad[0][1]
    value = bad[0][2]
    keys = sorted({name for _, name, _ in bad})
    return [
        finding(
            "problem",
            "nonfinite",
            "NaN or infinite training values",
            f"{len(bad)} NaN/inf values in {', '.join(keys)}, the first at {where(row)} "
            f"({key} = {value})",
            [
                "lower --lr, keep --max-grad-norm on (a finite clip)",
                "bf16 overflow: keep fp32 master weights (drop --pure-bf16) or try --dtype float32",
                "resume from a checkpoint saved before the first NaN",
            ],
            {"first_step": row["step"], "keys": keys, "count": len(bad)},
        )
    ]


def check_reward_stuck(run):
    """Format reward (or answer reward) at 0 over the run's last WINDOW steps: nothing to learn."""
    fmt_points = series(run["steps"], "train/format_reward")
    answer_key = "train/answer_reward"
    answer_points = series(run["steps"], answer_key)
    if not answer_points:
        answer_key = "train/reward"
        answer_points = series(run["steps"], answer_key)
    window = min(WINDOW, len(answer_points))
    if window == 0:
        return []
    sample = sample_excerpt(run, "train") or sample_excerpt(run, "eval")
    tail = fmt_points[-window:]
    if tail and max(value for _, value in tail) < ZERO_REWARD:
        evidence = (
            f"train/format_reward below {ZERO_REWARD} at every one of the last {len(tail)} steps "
            f"({span(fmt_points, len(tail), True)}; the run's best: "
            f"{fmt(max(value for _, value in fmt_points))})"
        )
        if sample:
            evidence += f"; {sample}"
        return [
            finding(
                "problem",
                "format_reward_zero",
                "format reward stuck at 0: the grader never finds an answer in the format it reads",
                evidence,
                [
                    "read a sample above: does the response end in the format --reward parses "
                    "(e.g. r1_zero's </think> <answer> ... </answer>)?",
                    "match --prompt to --reward, or use a model that follows the prompt "
                    "(an instruct model, or SFT on formatted answers first)",
                    "if responses are cut off before the answer, raise --max-tokens",
                ],
                {"steps": [row["step"] for row, _ in tail], "values": [v for _, v in tail]},
            )
        ]
    tail = answer_points[-window:]
    if max(value for _, value in tail) >= ZERO_REWARD:
        return []
    evidence = (
        f"{answer_key} below {ZERO_REWARD} at every one of the last {window} steps "
        f"({span(answer_points, window, True)}; the run's best: "
        f"{fmt(max(value for _, value in answer_points))})"
    )
    if fmt_points:
        evidence += f"; the format reward is {fmt(fmt_points[-1][1])}, so answers are read"
    if sample:
        evidence += f"; {sample}"
    return [
        finding(
            "problem",
            "reward_zero",
            "reward stuck at 0: no sampled answer is correct, so no group has a signal",
            evidence,
            [
                "easier questions (or a curriculum), or a stronger starting model",
                "more samples per question (--group-size) or a higher --temperature, so that "
                "some group holds a correct answer",
                "check the grader on a known-correct answer (grader.py's reward functions)",
            ],
            {"steps": [row["step"] for row, _ in tail], "values": [v for _, v in tail]},
        )
    ]


def check_zero_variance(run):
    """Most groups with G equal rewards: zero advantages, no gradient from them."""
    points = series(run["steps"], "train/zero_var_frac")
    if not points:
        return []
    mean = statistics.fmean(value for _, value in points)
    if mean < ZERO_VAR_WARN:
        return []
    severity = "warning"
    if mean >= ZERO_VAR_PROBLEM:
        severity = "problem"
    rewards = series(run["steps"], "train/answer_reward")
    kind = "too hard or too easy"
    if rewards:
        accuracy = statistics.fmean(value for _, value in rewards)
        kind = f"mean answer reward {fmt(accuracy)}: mostly "
        if accuracy >= 0.5:
            kind += "all-correct groups (too easy)"
        else:
            kind += "all-wrong groups (too hard)"
    first, last, window = ends(points)
    return [
        finding(
            severity,
            "zero_variance",
            "most groups have zero reward variance: nothing to learn from them",
            f"train/zero_var_frac averages {fmt(mean)} over {len(points)} steps "
            f"({fmt(first)} at {span(points, window, False)}, {fmt(last)} at "
            f"{span(points, window, True)}); G = {flag(run, 'group_size')}, temperature "
            f"{flag(run, 'temperature')}; {kind}",
            [
                "raise --group-size (G) so a group more often holds both outcomes",
                "raise --temperature for more varied samples",
                "filter the prompts: drop those always solved or never solved, or "
                "--dynamic-sampling (DAPO) to resample flat groups",
            ],
            {"mean": mean, "first": first, "last": last},
        )
    ]


def check_entropy(run):
    """Token entropy falling to a small fraction of its start: the policy stops exploring."""
    points = series(run["steps"], "train/entropy")
    if len(points) < MIN_STEPS:
        return []
    first, last, window = ends(points)
    if first <= 0 or last >= ENTROPY_COLLAPSE * first:
        return []
    return [
        finding(
            "warning",
            "entropy_collapse",
            "entropy collapse: the policy samples nearly the same tokens every time",
            f"train/entropy {fmt(first)} at {span(points, window, False)} -> {fmt(last)} at "
            f"{span(points, window, True)} ({fmt(100 * last / first)}% of its start; warned "
            f"below {fmt(100 * ENTROPY_COLLAPSE)}%)",
            [
                "lower --lr",
                "clip-higher for the clip losses (--cliprange-high 0.28, DAPO)",
                "a KL penalty to the initial policy (--kl-beta) or a higher --temperature",
                "fewer updates per batch (--epochs-per-rollout-batch 1)",
            ],
            {"first": first, "last": last},
        )
    ]


def check_truncation(run):
    """Responses cut at --max-tokens: their answer is lost and the length signal is noise."""
    points = series(run["steps"], "train/truncation_rate")
    if len(points) < MIN_STEPS:
        return []
    first, last, window = ends(points)
    if last < TRUNCATION_WARN:
        return []
    severity = "warning"
    if last >= TRUNCATION_PROBLEM:
        severity = "problem"
    trend = "rising from"
    if last <= first:
        trend = "already"
    return [
        finding(
            severity,
            "truncation",
            "many responses are cut off at --max-tokens",
            f"train/truncation_rate {fmt(last)} at {span(points, window, True)} ({trend} "
            f"{fmt(first)} at {span(points, window, False)}); --max-tokens "
            f"{flag(run, 'max_tokens')}",
            [
                "raise --max-tokens if the answers need the room",
                "a soft length penalty (--overlong-buffer N) or --mask-truncated (DAPO)",
                "a length-neutral loss normaliser (--length-norm masked_normalize or token): "
                "the per-response mean favours long wrong answers",
            ],
            {"first": first, "last": last},
        )
    ]


def check_length(run):
    """Mean response length doubling: often the RL at work, worth watching against truncation."""
    points = series(run["steps"], "train/response_len_mean")
    if len(points) < MIN_STEPS:
        return []
    first, last, window = ends(points)
    if first <= 0 or last < LENGTH_GROWTH * first:
        return []
    return [
        finding(
            "notice",
            "length_growth",
            "responses are getting longer",
            f"train/response_len_mean {fmt(first)} tokens at {span(points, window, False)} -> "
            f"{fmt(last)} at {span(points, window, True)} (x{fmt(last / first)})",
            [
                "longer reasoning can be the point; watch train/truncation_rate and the "
                "validation accuracy: length without accuracy is padding",
                "the per-response mean (--length-norm masked_mean) favours long wrong answers; "
                "Dr. GRPO's masked_normalize does not",
            ],
            {"first": first, "last": last},
        )
    ]


def check_ratios(run):
    """Spikes in the policy ratio, the rollout importance weights, or the engine/trainer KL."""
    spikes = []
    values = {}
    high = []
    for row, value in series(run["train"], "train/ratio_max"):
        if value > RATIO_SPIKE:
            high.append((row, value))
    low = []
    for row, value in series(run["train"], "train/ratio_min"):
        if value < 1 / RATIO_SPIKE:
            low.append((row, value))
    if high:
        spikes.append(f"train/ratio_max above {fmt(RATIO_SPIKE)} at {listing(high)}")
        values["ratio_max"] = len(high)
    if low:
        spikes.append(f"train/ratio_min below {fmt(1 / RATIO_SPIKE)} at {listing(low)}")
        values["ratio_min"] = len(low)
    limits = [
        ("train/is_weight_max", IS_WEIGHT_SPIKE),
        ("train/is_weight_outside_frac", IS_OUTSIDE_FRAC),
        ("train/mismatch_kl", MISMATCH_KL),
    ]
    for key, limit in limits:
        over = []
        for row, value in series(run["steps"], key):
            if value > limit:
                over.append((row, value))
        if over:
            spikes.append(f"{key} above {fmt(limit)} at {listing(over)}")
            values[key] = len(over)
    if not spikes:
        return []
    return [
        finding(
            "warning",
            "ratio_spikes",
            "importance-ratio / mismatch spikes: updates on samples the policy no longer "
            "(or never) made",
            "; ".join(spikes),
            [
                "correct the engine-trainer mismatch: --rollout-is tis (or mis)",
                "less off-policy: fewer --epochs-per-rollout-batch, a larger --train-batch-size, "
                "grpo_ray.py --max-staleness 0",
                "lower --lr; keep a clip loss (--loss grpo_clip) for off-policy steps",
                "a mismatch at one version (mismatch_kl) is numerics: the same dtype in engine "
                "and trainer (--dtype float32)",
            ],
            values,
        )
    ]


def check_tool_errors(run):
    """--tools runs: most calls fail (judged on the steps that call the tool: a rate over a
    handful of calls is noise)."""
    errors = []
    for row, value in series(run["steps"], "tool/error_rate"):
        if (number(row.get("tool/calls_mean")) or 0) >= TOOL_CALLS_ZERO:
            errors.append((row, value))
    if len(errors) < MIN_STEPS:
        return []
    first, last, window = ends(errors)
    if last <= TOOL_ERROR_RATE:
        return []
    evidence = f"tool/error_rate {fmt(last)} at {span(errors, window, True)} (from {fmt(first)})"
    excerpt = sample_excerpt(run, "train")
    if excerpt:
        evidence += f"; {excerpt}"
    return [
        finding(
            "warning",
            "tool_errors",
            "most tool calls fail",
            evidence,
            [
                "read the transcripts in rollouts/: a syntax error, a missing import, "
                "code the sandbox refuses, or --tool-timeout too short",
                "the prompt's output format and trigger: does the model see where its "
                "code ends and the output starts?",
            ],
            {"first": first, "last": last},
        )
    ]


def check_tool_calls(run):
    """--tools runs: the policy stopped calling the tool."""
    calls = series(run["steps"], "tool/calls_mean")
    if len(calls) < MIN_STEPS:
        return []
    first, last, window = ends(calls)
    if first < TOOL_CALLS_ZERO or last >= TOOL_CALLS_ZERO:
        return []
    return [
        finding(
            "warning",
            "tool_calls_collapse",
            "the policy stopped calling the tool",
            f"tool/calls_mean {fmt(first)} at {span(calls, window, False)} -> "
            f"{fmt(last)} at {span(calls, window, True)}",
            [
                "calls that error or time out teach the policy to avoid the tool: "
                "check tool/error_rate and the transcripts",
                "SimpleTIR's fix for collapse: --mask-void-turns (responses with a call "
                "that had nothing to run, or with no answer and no code, carry no loss)",
            ],
            {"first": first, "last": last},
        )
    ]


def check_truncated_by_tool(run):
    """--tools runs: tool output ends many responses before their answer."""
    cut = series(run["steps"], "tool/truncated_by_tool_rate")
    if len(cut) < MIN_STEPS:
        return []
    first, last, window = ends(cut)
    if last <= TRUNCATED_BY_TOOL:
        return []
    return [
        finding(
            "warning",
            "truncated_by_tool",
            "tool output ends many responses before their answer",
            f"tool/truncated_by_tool_rate {fmt(last)} at {span(cut, window, True)}; "
            f"--max-tokens {flag(run, 'max_tokens')}, --max-obs-tokens "
            f"{flag(run, 'max_obs_tokens')}, --max-tool-calls "
            f"{flag(run, 'max_tool_calls')}",
            [
                "raise --max-tokens (it counts the tool's output too)",
                "a smaller --max-obs-tokens, or fewer --max-tool-calls",
            ],
            {"first": first, "last": last},
        )
    ]


def check_multi_turn_mismatch(run):
    """--tools runs that score pi_old: rows with tool output disagree with the engine more than
    rows without (a context the trainer gets wrong)."""
    multi = series(run["steps"], "train/logprob_mismatch_multi_turn")
    single = series(run["steps"], "train/logprob_mismatch_single_turn")
    if len(multi) < MIN_STEPS or len(single) < MIN_STEPS:
        return []
    m = statistics.median(value for _, value in multi)  # multi-turn rows
    s = statistics.median(value for _, value in single)  # single-turn rows
    if m <= MISMATCH_FLOOR or m <= MISMATCH_MULTI_TURN * s:
        return []
    return [
        finding(
            "warning",
            "multi_turn_mismatch",
            "the trainer scores multi-turn rows differently from the engine",
            f"train/logprob_mismatch_multi_turn median {fmt(m)} over {len(multi)} steps "
            f"against {fmt(s)} on single-turn rows (x{fmt(m / max(s, 1e-12))})",
            [
                "the trainer must see exactly the engine's token ids: a fork that "
                "re-tokenises text, or trims ids at the trigger, breaks the ratios",
                "a chat template or prompt change between sampling and training",
            ],
            {"multi_turn": m, "single_turn": s},
        )
    ]


def check_grad_norm(run):
    """Gradient-norm spikes against the run's median, and clipping on at nearly every step."""
    points = series(run["train"], "train/grad_norm")
    if len(points) < MIN_STEPS:
        return []
    found = []
    median = statistics.median(value for _, value in points)
    spikes = []
    for row, value in points:
        if median > 0 and value > GRAD_SPIKE * median:
            spikes.append((row, value))
    if spikes:
        found.append(
            finding(
                "warning",
                "grad_spikes",
                "gradient-norm spikes",
                f"train/grad_norm above {fmt(GRAD_SPIKE)}x the run's median ({fmt(median)}) at "
                f"{listing(spikes)}",
                [
                    "lower --lr (or add warm-up: --warmup-frac)",
                    "look at the spike steps' rollouts for degenerate responses",
                    "keep clipping on (--max-grad-norm 1.0); off-policy, a clip loss bounds "
                    "the ratios",
                ],
                {"median": median, "spikes": len(spikes)},
            )
        )
    clip = number(flag(run, "max_grad_norm"))
    if clip is not None and clip > 0:
        clipped = []
        for row, value in points:
            if value > clip:
                clipped.append((row, value))
        fraction = len(clipped) / len(points)
        if fraction >= CLIP_ALWAYS:
            found.append(
                finding(
                    "warning",
                    "clipping_always",
                    "gradient clipping is on at nearly every step: the step size is set by the "
                    "clip, not by --lr",
                    f"train/grad_norm above --max-grad-norm {fmt(clip)} at {len(clipped)} of "
                    f"{len(points)} optimizer steps ({fmt(100 * fraction)}%; median "
                    f"{fmt(median)})",
                    [
                        "lower --lr until most steps pass unclipped",
                        "or raise --max-grad-norm if the norms are stable and the clip is "
                        "simply too tight for this loss's scale",
                    ],
                    {"fraction": fraction, "median": median, "max_grad_norm": clip},
                )
            )
    return found


def check_reward_vs_validation(run):
    """Train reward rising while validation accuracy falls below its best: the reward is being
    gamed, or the model overfits the training questions."""
    rewards = series(run["steps"], "train/reward")
    accuracy = series(run["evals"], "eval/accuracy")
    n = eval_size(run)
    if len(rewards) < MIN_STEPS or len(accuracy) < 3 or n is None:
        return []
    first, last, window = ends(rewards)
    if last - first < REWARD_RISE:
        return []
    best_row, best = max(accuracy, key=lambda point: point[1])
    final_row, final = accuracy[-1]
    se = math.sqrt(standard_error(best, n) ** 2 + standard_error(final, n) ** 2)
    if best_row is final_row or best - final <= Z * se:
        return []
    evidence = (
        f"train/reward {fmt(first)} at {span(rewards, window, False)} -> {fmt(last)} at "
        f"{span(rewards, window, True)}, while eval/accuracy fell from {fmt(best)} (step "
        f"{best_row['step']}) to {fmt(final)} (step {final_row['step']}): {fmt(best - final)} "
        f"is {fmt((best - final) / se)} standard errors on {n} questions"
    )
    sample = sample_excerpt(run, "train", best=True)
    if sample:
        evidence += f"; the best-rewarded {sample.removeprefix('a ')}"
    return [
        finding(
            "warning",
            "reward_up_validation_down",
            "training reward rises while validation accuracy falls",
            evidence,
            [
                f"the best weights were at step {best_row['step']}: keep checkpoints "
                "(--save-every) and pick by validation",
                "read the high-reward train samples: a reward the grader gives to a wrong or "
                "degenerate answer (reward hacking) needs a stricter grader",
                "a KL penalty (--kl-beta), a lower --lr, or more varied training questions",
            ],
            {"best": best, "best_step": best_row["step"], "final": final, "se": se},
        )
    ]


def check_kl(run):
    """KL(pi_t || pi_init) beyond KL_REF_MAX per token: the policy has drifted far."""
    points = series(run["steps"], "train/kl_ref")
    if not points:
        return []
    per_token = points
    unit = "nats per token"
    if flag(run, "kl_estimator") == "seq":
        # seed 004 Eq. 8 sums over each response: per token, divide by the mean length
        per_token = []
        for row, value in points:
            length = number(row.get("train/response_len_mean"))
            if length:
                per_token.append((row, value / length))
        unit = "nats per token (seq estimate / mean response length)"
    over = []
    for row, value in per_token:
        if value > KL_REF_MAX:
            over.append((row, value))
    if not over:
        return []
    return [
        finding(
            "warning",
            "kl_drift",
            "the policy has drifted far from its initial weights",
            f"train/kl_ref above {fmt(KL_REF_MAX)} {unit} at {listing(over)} (the last: "
            f"{fmt(per_token[-1][1])}); --kl-beta {flag(run, 'kl_beta')}",
            [
                "a KL penalty (--kl-beta, e.g. 0.001-0.04) or a larger one",
                "lower --lr; compare validation accuracy with the drift before trusting it",
            ],
            {"count": len(over), "last": per_token[-1][1]},
        )
    ]


def eval_size(run):
    """Questions per evaluation: the eval rows' eval/n_questions, else the run's --eval-n (an
    upper bound: a smaller validation file evaluates fewer), else None."""
    for row in reversed(run["evals"]):
        n = number(row.get("eval/n_questions"))
        if n is not None and n >= 1:
            return int(n)
    n = number(flag(run, "eval_n"))
    if n is not None and n >= 1:
        return int(n)
    return None


def eval_metrics(run):
    """[(key, [(row, value, se)])] of the evaluated metrics with a standard error: eval/accuracy
    (its logged eval/accuracy_se, else from the question count) and every eval/ key logged with
    an `_se` twin (eval/avg@k, eval/pass@k, ...)."""
    n = eval_size(run)
    keys = ["eval/accuracy"]
    for row in run["evals"]:
        for key in row:
            if key.endswith("_se") and key[: -len("_se")] not in keys:
                keys.append(key[: -len("_se")])
    found = []
    for key in keys:
        points = []
        for row, value in series(run["evals"], key):
            se = number(row.get(key + "_se"))
            if se is None and key == "eval/accuracy" and n is not None:
                se = standard_error(value, n)
            if se is not None:
                points.append((row, value, se))
        if len(points) >= 2:
            found.append((key, points))
    return found


def check_eval_size(run):
    """An evaluation whose standard error hides the differences the run's curve shows."""
    found = []
    n = eval_size(run)
    for key, points in eval_metrics(run):
        se = statistics.fmean(se for _, _, se in points)
        resolution = Z * math.sqrt(2) * se  # a difference between two evaluations at Z SEs
        if resolution <= EVAL_RESOLUTION:
            continue
        first = points[0][1]
        largest = max(abs(value - first) for _, value, _ in points)
        unresolved = []
        for (row_a, a, _), (row_b, b, _) in zip(points, points[1:]):
            if abs(b - a) < resolution:
                unresolved.append(f"{row_a['step']}->{row_b['step']} {b - a:+.3g}")
        size = "its standard error"
        needed = ""
        if n is not None:
            size = f"{n} questions"
            mean = statistics.fmean(value for _, value, _ in points)
            spread = max(mean * (1 - mean), 0.01)
            need = math.ceil(2 * Z**2 * spread / EVAL_RESOLUTION**2)
            needed = f" {need} (what resolves {fmt(EVAL_RESOLUTION)} at this accuracy)"
        evidence = (
            f"{key} on {size}: SE {fmt(se)}, so two evaluations must differ by "
            f"{fmt(resolution)} ({fmt(Z)} SEs of a difference) to count"
        )
        fixes = [
            f"more validation questions: --eval-n{needed}",
            "compare runs or steps only by differences larger than the resolution above",
        ]
        values = {"se": se, "resolution": resolution, "n_questions": n}
        if largest < resolution:
            evidence += (
                f"; the run's largest change from the first evaluation is {fmt(largest)}: "
                "it cannot show whether training changed this metric"
            )
            found.append(
                finding(
                    "warning",
                    "eval_too_small",
                    f"the evaluation is too small to show any change in {key}",
                    evidence,
                    fixes,
                    values,
                )
            )
        elif unresolved:
            evidence += (
                f"; the change from the first evaluation ({fmt(largest)}) is resolved, but "
                f"{len(unresolved)} of {len(points) - 1} changes between evaluations are not "
                f"({', '.join(unresolved[:6])}): read them as noise"
            )
            found.append(
                finding(
                    "notice",
                    "eval_resolution",
                    f"the evaluation cannot resolve step-to-step changes in {key}",
                    evidence,
                    fixes,
                    values,
                )
            )
    return found


def on_policy(run):
    """Every update on samples of the current weights: one optimizer step per rollout batch, and
    (grpo_ray.py) no stale batches."""
    if flag(run, "off_policy") is not False:
        return False
    return flag(run, "staleness") in (None, 0)


def check_loss_zero(run):
    """train/loss near 0 in on-policy GRPO is how the loss is built, not a bug."""
    points = series(run["train"], "train/loss")
    if len(points) < MIN_STEPS or not on_policy(run):
        return []
    median = statistics.median(abs(value) for _, value in points)
    if median >= LOSS_NEAR_ZERO:
        return []
    grads = series(run["train"], "train/grad_norm")
    grad = ""
    if grads:
        median_grad = statistics.median(value for _, value in grads)
        grad = f", while train/grad_norm (median {fmt(median_grad)}) is not near 0"
    low = min(value for _, value in points)
    high = max(value for _, value in points)
    return [
        finding(
            "notice",
            "loss_near_zero",
            "loss ~ 0 is expected: on-policy GRPO's loss value says little",
            f"train/loss median |loss| {fmt(median)} (from {fmt(low)} to {fmt(high)}) over "
            f"{len(points)} optimizer steps{grad}. The advantages average 0 within each group, "
            "so the loss sums terms of both signs that nearly cancel; its gradient does not",
            [
                "nothing to fix: read train/reward, eval/accuracy and train/grad_norm for progress",
            ],
            {"median_abs": median, "min": low, "max": high},
        )
    ]


def check_incomplete(run):
    """Fewer rollout steps logged than the run asked for: stopped, crashed, or still running."""
    wanted = number(flag(run, "n_grpo_steps"))
    if wanted is None:
        wanted = number(flag(run, "n_ei_steps"))
    if wanted is None:
        return []
    done = 0
    if run["steps"]:
        done = run["steps"][-1]["step"] + 1
    if done >= wanted:
        return []
    return [
        finding(
            "notice",
            "incomplete",
            "the run logged fewer steps than it asked for",
            f"{done} of {int(wanted)} steps logged: stopped, crashed or still running; the "
            "diagnoses cover the steps logged",
            ["--resume the run directory to continue it"],
            {"done": done, "wanted": int(wanted)},
        )
    ]


def check_skipped(run):
    """Lines of metrics.jsonl that are not valid rows: skipped by the doctor."""
    if not run["skipped"]:
        return []
    lines = ", ".join(str(n) for n in run["skipped"][:10])
    return [
        finding(
            "notice",
            "malformed_rows",
            "metrics.jsonl has lines that are not valid rows; the doctor skipped them",
            f"{len(run['skipped'])} lines skipped (lines {lines}): not UTF-8 JSON objects with "
            "an integer step",
            ["a truncated last line is a crash mid-write; other bad lines were edited by hand"],
            {"lines": run["skipped"]},
        )
    ]


# (check, the scripts whose runs it applies to): a new diagnosis is one function and one line
CHECKS = [
    (check_nonfinite, None),  # None: every run
    (check_reward_stuck, RL),
    (check_zero_variance, GRPO),
    (check_entropy, RL),
    (check_truncation, RL),
    (check_length, RL),
    (check_ratios, GRPO),
    (check_tool_errors, GRPO),
    (check_tool_calls, GRPO),
    (check_truncated_by_tool, GRPO),
    (check_multi_turn_mismatch, GRPO),
    (check_grad_norm, None),
    (check_reward_vs_validation, RL),
    (check_kl, GRPO),
    (check_eval_size, None),
    (check_loss_zero, GRPO),
    (check_incomplete, None),
    (check_skipped, None),
]


# ----------------------------------------------------------------------------- reports
def diagnose(run_dir):
    """The report of one run: what it is, and its findings, most severe first."""
    run = read_run(run_dir)
    script = run["script"]
    findings = []
    for check, scripts in CHECKS:
        if scripts is None or script in scripts:
            findings += check(run)
    order = []
    for f in findings:
        order.append((SEVERITIES.index(f["severity"]), len(order), f))
    order.sort(key=lambda item: item[:2])
    note = ""
    if script not in GRPO:
        note = (
            f"not a GRPO run ({script}): only the checks its keys support ran; the GRPO ones "
            "(zero-variance groups, loss, ratios, KL) do not apply"
        )
    if not run["has_args"]:
        note += (
            " no readable args.json: the checks that need the run's flags (clip, eval size) "
            "are skipped"
        )
    return {
        "run": run_dir,
        "script": script,
        "is_grpo": script in GRPO,
        "note": note.strip(),
        "steps": len(run["steps"]),
        "opt_steps": len(run["train"]),
        "evals": len(run["evals"]),
        "findings": [f for _, _, f in order],
        "final_eval": final_eval(run),
    }


def final_eval(run):
    """{"step", "accuracy", "se"} of the run's last evaluation with a standard error, or None."""
    for key, points in eval_metrics(run):
        if key == "eval/accuracy":
            last = points[-1]  # (row, value, se)
            return {"step": last[0]["step"], "accuracy": last[1], "se": last[2]}
    return None


def compare(reports):
    """Notices for pairs of runs whose final accuracies differ by less than Z SEs: the
    evaluation cannot rank them."""
    found = []
    for i, a in enumerate(reports):
        for b in reports[i + 1 :]:
            if a["final_eval"] is None or b["final_eval"] is None:
                continue
            x = a["final_eval"]
            y = b["final_eval"]
            diff = y["accuracy"] - x["accuracy"]
            resolution = Z * math.sqrt(x["se"] ** 2 + y["se"] ** 2)
            if abs(diff) >= resolution:
                continue
            item = finding(
                "notice",
                "runs_unresolved",
                "the evaluation cannot rank these runs",
                f"{a['run']} ends at eval/accuracy {fmt(x['accuracy'])} (step {x['step']}), "
                f"{b['run']} at {fmt(y['accuracy'])} (step {y['step']}): the difference "
                f"{diff:+.3g} is under {fmt(Z)} SEs of a difference ({fmt(resolution)})",
                ["more validation questions (--eval-n), or several seeds per setting"],
                {"difference": diff, "resolution": resolution},
            )
            item["runs"] = [a["run"], b["run"]]
            found.append(item)
    return found


def exit_code(reports):
    """1 when any run has a problem or a warning, else 0 (notices are not pathologies)."""
    for report in reports:
        for f in report["findings"]:
            if f["severity"] != "notice":
                return 1
    return 0


def render_finding(f):
    lines = [f"{f['severity']}: {f['title']}", f"  evidence: {f['evidence']}"]
    for fix in f["fixes"]:
        lines.append(f"  fix: {fix}")
    return lines


def plural(n, word):
    """ "1 warning", "2 warnings", "0 problems"."""
    if n == 1:
        return f"1 {word}"
    return f"{n} {word}s"


def render(reports, comparisons):
    """The plain-text report of every run, then the comparisons."""
    lines = []
    for report in reports:
        steps = f"{report['steps']} steps"
        if report["script"] in RL:
            steps = f"{report['steps']} rollout steps ({report['opt_steps']} optimizer steps)"
        evals = plural(report["evals"], "evaluation")
        lines.append(f"== {report['run']}: {report['script']}, {steps}, {evals}")
        if report["note"]:
            lines.append(report["note"])
        for f in report["findings"]:
            lines += render_finding(f)
        counts = {"problem": 0, "warning": 0, "notice": 0}
        for f in report["findings"]:
            counts[f["severity"]] += 1
        if counts["problem"] or counts["warning"]:
            summary = (
                f"-> {plural(counts['problem'], 'problem')}, {plural(counts['warning'], 'warning')}"
            )
        else:
            summary = "-> clean: no problems or warnings"
        lines.append(f"{summary}, {plural(counts['notice'], 'notice')}")
        lines.append("")
    if comparisons:
        lines.append("== comparing the runs")
        for f in comparisons:
            lines += render_finding(f)
    return "\n".join(lines).rstrip()


def main(args):
    reports = []
    for run_dir in args.runs:
        reports.append(diagnose(run_dir))
    comparisons = compare(reports)
    code = exit_code(reports)
    if args.json:
        print(json.dumps({"runs": reports, "comparisons": comparisons, "exit": code}, indent=1))
    else:
        print(render(reports, comparisons))
    return code


if __name__ == "__main__":
    sys.exit(main(parse_args()))
