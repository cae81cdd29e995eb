"""Zero-shot evaluation: prompt a model on a task, generate, grade, sort into the seeds' categories.

Follows seed 000 §3.2 (MATH: intellect prompt, question_only grading, greedy, 2048 tokens), seed
001 §3.2 (GSM8K: r1_zero prompt, T = 1, 1024 tokens) and seed 002 §1.6.1 (Countdown at 256/512/1024
max tokens). Prompt, grader and data default to data.task_defaults(task, model), the one rule every
script uses: hub models get the task's seed prompt and hub set; the embedded model gets Countdown
with the r1_zero prompt it was trained on, on data.py's synthetic problems. --max-tokens and
--temperature default to SEED_SETTINGS below. Generation comes from rollout.py (vLLM, or
transformers with --engine hf), grading from grader.py in parallel (grade_batch). Generation stops
at "</answer>" when the prompt uses it.

Accuracy = the fraction of examples with answer_reward == 1, as sft.py and grpo.py count it. The
seeds' three categories are still reported: (1) format 1 & answer 1, (2) format 1 & answer 0,
(3) format 0 & answer 0; a grader that returns format 0 & answer 1 gets a fourth row (counted as
accurate) so that the counts add up. The seed graders (question_only, r1_zero) find the answer
where the course's drgrpo_grader does (docs/grading.md): under question_only an answer with no
\\boxed{}, "the answer is 4" included, is category 3; only the lenient intellect rule fills the
fourth row.

Departures: --chat-template (off by default: the seeds' raw prompt text) wraps each prompt in the
model's chat template, since a chat model's zero-shot numbers depend on it (Qwen3 thinking on or
off). --max-tokens takes a comma list and runs one generation pass per value on one engine
(one summary row each); every row of generations.jsonl carries its max_tokens. --out is checked
before any work, and existing results are kept unless --overwrite; --dry-run prints the effective
configuration (one JSON line) and stops before anything loads. --out is held for the run's life (a
second run there is refused). Ctrl-C or SIGTERM (a scheduler's stop) writes the examples graded so
far (summary.json says where it stopped) and exits 130 / 143.

--tools python|calculator (tools.py, docs/tools.md) lets the policy call a tool mid-response: the
default prompt is the task's with _<tool> appended, the policy's own text is graded (a tool output
that prints an answer earns nothing), and each row of generations.jsonl shows the turns and the
tool outputs apart ("segments"); summary.json adds the tool's rates.

--thinking-budget N (tools.generate_thinking, docs/tools.md) closes a thinking model's thinking at
N tokens: a response still thinking then gets </think> appended, graded with it; its row shows the
close apart ("segments") and "thinking_cut"; summary.json adds the fraction cut.

--pass-rate-samples K (the offline difficulty filter of Kimi k1.5 and Qwen3, docs/objectives.md):
K samples per example, at T 1.0 unless --temperature says otherwise, and pass_rates.jsonl in
--out, each example's fraction of correct samples. Run it on the training prompts (--data FILE
--split train, a --limit that covers the trainer's --train-n, its --prompt and --chat-template)
and give the file to grpo.py, grpo_ray.py or expert_iteration.py: --pass-rates FILE
--keep-pass-rate LO HI. generations.jsonl then holds K rows per example (its "sample" 0..K-1,
sample j of example i seeded seed + i * K + j whatever --chunk), and the accuracy is over all of
them.

Examples:
  python eval_zero_shot.py                      # embedded tiny model, synthetic Countdown
  python eval_zero_shot.py --model Qwen/Qwen2.5-Math-1.5B --task math500 --data math500_test.jsonl
  python eval_zero_shot.py --model Qwen/Qwen3-1.7B --task countdown --max-tokens 256,512,1024 \\
      --dry-run
  python eval_zero_shot.py --tools calculator --limit 100   # prompt r1_zero_calculator
  python eval_zero_shot.py --split train --limit 2000 --pass-rate-samples --out runs/pass_rates
"""

import argparse
import importlib.util
import json
import os
import sys
import time

import tools
from common import (
    Parser,
    check,
    check_hub_ids,
    check_model_dir,
    existing_file,
    fail,
    int_list,
    nonneg_float,
    nonneg_int,
    positive_int,
    probability,
    read_json,
    thread_count,
)
from data import (
    CHAT_TEMPLATES,
    EMBEDDED_MODEL,
    TASKS,
    apply_chat_template,
    is_embedded,
    load_prompt,
    load_task,
    task_defaults,
    write_json_atomic,
    write_jsonl_atomic,
)
from grader import REWARD_FNS, grade_batch, is_correct
from hardware import set_threads
from runs import (
    dry_run,
    find_checkpoint,
    finish_then_interrupt,
    lock_run_dir,
    run_markers,
    snapshots,
    stop_exit_code,
    stop_name,
    stop_on_sigterm,
)
from validation import mean_se

CATEGORIES = ["format1_answer1", "format1_answer0", "format0_answer0", "format0_answer1"]
PASS_RATES = "pass_rates.jsonl"  # --pass-rate-samples: each example's pass rate (data.py reads it)
# zero-shot (max generated tokens, temperature) per task, as the seeds set them; flags override
SEED_SETTINGS = {
    "math": (2048, 0.0),
    "math500": (2048, 0.0),  # seed 000 §3.2
    "gsm8k": (1024, 1.0),  # seed 001 §3.2
    "countdown": (1024, 0.0),  # seed 002 §1.6.1: its longest budget, L1024
    "keyword": (60, 0.0),  # seed 004's budget
    "jsonl": (1024, 0.0),
}
# the embedded model answers in ~50 tokens (model card); grpo.py's demo budget
EMBEDDED_MAX_TOKENS = 192
NO_HUB_DATA = ("keyword", "jsonl")  # tasks whose data is always a local file
# cut at the budget: by the response's own length, or by a tool output that left no room
TRUNCATED = ("length", "truncated_by_tool")
# --tools: turn t of a sample draws with its turn-0 seed + t * TOOL_TURN_STRIDE (tools.generate's
# turn_stride). A constant above every (sample, example) offset j*P + i, so no turn's seed meets
# another sample's or example's, whatever the chunking; and since it depends on neither --n nor
# the chunk, best_of_n.py's sample 0 of prompt i draws every turn with the seeds this script's
# example i draws with (both start from seed + i at turn 0). torch seeds take 64 bits.
TOOL_TURN_STRIDE = 2**32


def category(r):
    """Category name of one reward dict {"reward", "format_reward", "answer_reward"}."""
    return f"format{int(r['format_reward'] >= 1)}_answer{int(r['answer_reward'] >= 1)}"


def summarize(rows):
    """Accuracy (answer_reward == 1), category counts and length stats of graded rows (of one
    max_tokens)."""
    n = len(rows)
    counts = {}
    for c in CATEGORIES:
        counts[c] = len([r for r in rows if r["category"] == c])
    correct = len([r for r in rows if is_correct(r)])
    truncated = len([r for r in rows if r["finish_reason"] in TRUNCATED])
    out = {
        "n": n,
        "correct": correct,
        "accuracy": correct / max(n, 1),
        "counts": counts,
        "mean_reward": sum(r["reward"] for r in rows) / max(n, 1),
        "mean_tokens": sum(r["num_tokens"] for r in rows) / max(n, 1),
        "frac_truncated": truncated / max(n, 1),
    }
    if rows and "calls" in rows[0]:  # --tools
        out.update(tool_summary(rows))
    if rows and "thinking_cut" in rows[0]:  # --thinking-budget
        out["frac_thinking_cut"] = len([r for r in rows if r["thinking_cut"]]) / n
        out["mean_policy_tokens"] = sum(r["policy_tokens"] for r in rows) / n
    return out


def tool_summary(rows):
    """The tool's rates over graded rows (--tools): calls per response, errors (and timeouts) per
    call, the fraction of responses that called it, and of those a tool output cut short."""
    n = len(rows)
    calls = sum(r["calls"] for r in rows)
    errors = sum(r["errors"] for r in rows)
    cut = len([r for r in rows if r["finish_reason"] == "truncated_by_tool"])
    return {
        "tool_calls_mean": calls / n,
        "tool_error_rate": errors / max(calls, 1),
        "frac_with_call": len([r for r in rows if r["calls"]]) / n,
        "frac_truncated_by_tool": cut / n,
        "mean_policy_tokens": sum(r["policy_tokens"] for r in rows) / n,
    }


# ---------------------------------------------------------------- checks (shared with best_of_n.py)
def data_path(s):
    """argparse type for --data: "synthetic" (data.py's Countdown generator) or a non-empty file."""
    return s if s == "synthetic" else existing_file(s)


def check_engine(engine):
    """--engine must be one of rollout.ENGINES.

    rollout is imported here, after the cheap checks, not at the top: it imports torch (~2 s),
    which would slow every one-line error; it sets vLLM's environment itself."""
    import rollout

    check(engine in rollout.ENGINES, f"--engine {engine}: choose from {', '.join(rollout.ENGINES)}")


def default_max_tokens(task, model):
    """--max-tokens when not given: the seed's budget for the task, or the embedded model's."""
    if task == "countdown" and is_embedded(model):
        return EMBEDDED_MAX_TOKENS
    return SEED_SETTINGS[task][0]


def task_flags(args):
    """Check --model; resolve --prompt and the tool flags through tools.resolve (--prompt unset:
    data.task_defaults', with _<tool> appended under --tools); return --reward and --data, each as
    given or data.task_defaults', checked. Loads nothing; each script's resolve stores them."""
    check_model_dir(args.model)
    d = task_defaults(args.task, args.model)
    tools.resolve(args, d)  # sets args.prompt; a tool prompt's header checked
    reward = args.reward or d["reward"]
    path = args.data or d["path"]
    try:
        load_prompt(args.prompt)
    except ValueError as e:
        fail(f"--prompt {args.prompt}: {e}")
    check(
        path != "synthetic" or args.task == "countdown",
        f"--data synthetic is data.py's Countdown generator; --task {args.task} needs a file",
    )
    check(
        path is not None or args.task not in NO_HUB_DATA,
        f"--task {args.task} needs --data FILE",
    )
    return reward, path


def check_out(out, results, overwrite):
    """--out must be a directory this run can create or write, holding none of `results` unless
    --overwrite. Checked at parse time (nothing is created), so a bad --out never costs a
    generation pass."""
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"--out {out}: is a file; pass a directory")
    # a training run's directory: its run.lock and files are its own (issue 44: an eval took over
    # the lock and wrote beside the checkpoint)
    trained = run_markers(out) if os.path.isdir(out) else []
    check(
        not trained,
        f"--out {out} is a training run's directory (it holds {', '.join(trained)}); pass "
        f"another --out, e.g. {os.path.join(out, 'eval')}",
    )
    held = [f for f in results if os.path.exists(os.path.join(out, f))]
    if held and not overwrite:
        fail(
            f"--out {out} already holds {', '.join(held)}; "
            f"pass --overwrite to replace them, or choose a new --out"
        )
    # the nearest existing ancestor is where the directory gets created
    parent = os.path.abspath(out)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        fail(f"--out {out}: cannot create or write it ({parent} is not a writable directory)")


def claim_out(out):
    """Hold --out for this run's life (runs.lock_run_dir): a second run there is refused in one
    line naming this one, instead of both writing the same files."""
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        fail(f"--out {out}: cannot create it ({e.strerror})")
    lock_run_dir(out)


def describe(args):
    """The configuration line printed first: which data, prompt and grader this run uses."""
    if args.data == "synthetic":
        data = (
            f"synthetic Countdown (data.py's generator, {args.split} split, "
            f"--data-seed {args.data_seed}"
        )
        if is_embedded(args.model):
            data += "; the embedded model's default set)"
        else:
            data += ")"
    elif args.data:
        data = args.data
    else:
        data = f"the {args.task} hub set (needs `datasets`)"
    line = (
        f"task {args.task} | data {data} | prompt {args.prompt} | reward {args.reward} | "
        f"model {args.model}"
    )
    if args.tools:
        line += f" | tools {args.tools} (up to {args.max_tool_calls} calls)"
    if args.thinking_budget:
        line += f" | thinking budget {args.thinking_budget} tokens"
    return line


# ------------------------------------------------------------------ load (shared with best_of_n.py)
def load_examples(args):
    """The task's rows, each with its "prompt" formatted once, and their stop strings."""
    if args.data is None and importlib.util.find_spec("datasets") is None:
        message = (
            f"the {args.task} hub set needs the `datasets` package (pip install datasets); "
            f"pass --data FILE"
        )
        if args.task == "countdown":
            message += " or --data synthetic"
        fail(message)
    try:
        examples = load_task(
            args.task,
            split=args.split,
            path=args.data,
            limit=args.limit,
            seed=args.data_seed,
            prompt=args.prompt,
        )
    except ValueError as e:
        fail(str(e))
    check(examples, f"--data {args.data}: no examples loaded; check the file, --split and --limit")
    try:
        examples = apply_chat_template(examples, args.model, args.chat_template)
    except ValueError as e:
        fail(f"--chat-template: {e}")
    return examples, examples[0]["stop"]  # shaped with the prompts, by load_task


def start_engine(args, prompts, max_tokens):
    """The rollout engine. vLLM's context = the longest prompt + max_tokens (init_vllm caps it at
    the model's)."""
    import torch

    import rollout

    # a hub id nothing serves: one line now, not a traceback once loading has retried
    check_hub_ids()
    if torch.cuda.is_available():
        device = "cuda"
        found = "CUDA available"
    else:
        device = "cpu"
        found = "no CUDA"
    print(f"device {device} ({found}) | engine {args.engine}")
    extra = {}
    if args.engine == "vllm":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model)
        extra["max_model_len"] = max(len(tok(p).input_ids) for p in prompts) + max_tokens
        extra["enforce_eager"] = args.eager
    rollout.engine_log(os.path.join(args.out, "engine.log"))  # console: real problems only
    return rollout.init_engine(args.engine, args.model, device=device, seed=args.seed, **extra)


def sample_responses(llm, prompts, tool, thinking=None, **sampling):
    """rollout.generate's samples of the prompts; with a tool (--tools), tools.generate's
    multi-turn ones, turn t seeded t * TOOL_TURN_STRIDE above turn 0; with a thinking budget
    (tools.Thinking), tools.generate_thinking's, seeded so too."""
    import rollout

    if tool is None and thinking is None:
        return rollout.generate(llm, prompts, **sampling)
    if tool is None:
        return tools.generate_thinking(
            llm, prompts, thinking, turn_stride=TOOL_TURN_STRIDE, **sampling
        )
    return tools.generate(llm, prompts, tool, turn_stride=TOOL_TURN_STRIDE, **sampling)


def add_data_flags(p):
    """The flags task_flags and load_examples read (best_of_n.py uses the same ones)."""
    p.add_argument(
        "--task", default="countdown", choices=sorted(TASKS), help="task (data.load_task)"
    )
    p.add_argument(
        "--data",
        type=data_path,
        default=None,
        help="local JSON/JSONL, or 'synthetic' (Countdown generator); default: data.task_defaults",
    )
    p.add_argument(
        "--split", default="test", choices=["train", "test"], help="split of the synthetic/hub data"
    )
    p.add_argument(
        "--prompt", default=None, help="prompts/<name>.prompt (default: data.task_defaults)"
    )
    p.add_argument(
        "--reward",
        default=None,
        choices=sorted(REWARD_FNS),
        help="grader (default: data.task_defaults)",
    )
    p.add_argument(
        "--chat-template",
        default="off",
        choices=CHAT_TEMPLATES,
        help="wrap each prompt in the model's chat template (on; no_thinking: Qwen3's switch off)",
    )
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N examples")
    p.add_argument(
        "--data-seed",
        type=nonneg_int,
        default=0,
        help="seed of the synthetic Countdown set (0 = sft/grpo's)",
    )


def add_model_flag(p):
    """--model: one model, or several / a run directory for a checkpoint sweep (best_of_n.py's
    too)."""
    p.add_argument(
        "--model",
        nargs="+",
        default=[EMBEDDED_MODEL],
        help="model dir or hub id (default: the embedded tiny model); several, or a run dir "
        "(its checkpoints/ series and checkpoint/): one summary row per snapshot",
    )


def parse_args(argv=None):
    p = Parser(description="Zero-shot evaluation with the seeds' three reward categories.")
    # --- model ---
    add_model_flag(p)
    p.add_argument(
        "--engine",
        default="vllm",
        help="rollout engine, one of rollout.ENGINES (hf = transformers)",
    )
    p.add_argument(
        "--eager",
        action="store_true",
        help="vllm without torch.compile: fast start, slower decoding (smoke tests, debugging)",
    )
    # --- data: --task --data --split --prompt --reward --limit --data-seed ---
    add_data_flags(p)
    # --- sampling ---
    p.add_argument(
        "--max-tokens",
        type=int_list,
        default=None,
        help="max generated tokens; comma list = sweep (256,512,1024); default: SEED_SETTINGS",
    )
    p.add_argument(
        "--temperature", type=nonneg_float, default=None, help="0 = greedy; default: SEED_SETTINGS"
    )
    p.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling mass")
    p.add_argument(
        "--pass-rate-samples",
        type=positive_int,
        nargs="?",
        const=8,
        default=0,
        metavar="K",
        help="K samples per example (8 if K is omitted; --temperature default 1.0) and each "
        "example's pass rate in pass_rates.jsonl: the trainers' --pass-rates file",
    )
    p.add_argument(
        "--seed",
        type=nonneg_int,
        default=0,
        help="engine seed; example i is sampled with seed + i (--pass-rate-samples K: its sample j"
        " with seed + i * K + j), whatever --chunk",
    )
    # --- output ---
    p.add_argument("--out", default=None, help="output dir (default runs/eval_<task>)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace generations.jsonl/summary.json in --out"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the effective configuration as JSON and exit"
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=min(8, os.cpu_count() or 1),
        help="grading processes",
    )
    p.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        help="torch CPU threads (default: torch's, one per core); 1 on a busy shared machine",
    )
    p.add_argument("--show", type=nonneg_int, default=3, help="examples printed per category")
    p.add_argument(
        "--chunk",
        type=positive_int,
        default=512,
        help="prompts per generate call (progress bar step)",
    )
    # --- tools: --tools --max-tool-calls --max-obs-tokens --tool-timeout ... (tools.py) ---
    tools.add_flags(p)
    args = p.parse_args(argv)
    return resolve(args)


def resolve(args):
    """The defaults that depend on --task/--model, and the checks that need no model: each a
    one-line error. After this, args is only read."""
    args.sweep, args.model = expand_models(args.model)
    args.reward, args.data = task_flags(args)  # and args.prompt, through tools.resolve
    args.max_tokens = args.max_tokens or [default_max_tokens(args.task, args.model)]
    if args.temperature is None:
        args.temperature = SEED_SETTINGS[args.task][1]
        if args.pass_rate_samples:
            args.temperature = 1.0  # Kimi k1.5 samples "at a relatively high temperature"
    args.out = args.out or os.path.join("runs", f"eval_{args.task}")
    results = ["generations.jsonl", "summary.json"]
    # samples per example: one, or --pass-rate-samples K for pass_rates.jsonl
    args.samples_per_example = 1
    if args.pass_rate_samples:
        args.samples_per_example = args.pass_rate_samples
        results.append(PASS_RATES)
        check(
            args.temperature > 0,
            "--pass-rate-samples needs --temperature > 0 (greedy samples are all the same)",
        )
        check(len(args.max_tokens) == 1, "--pass-rate-samples takes one --max-tokens")
    if args.sweep:
        check(
            len(args.max_tokens) == 1,
            "a checkpoint sweep evaluates one --max-tokens: pass one value",
        )
        check_sweep_out(args, results)
    else:
        check_out(args.out, results, args.overwrite)
    check_engine(args.engine)
    args.tool_isolated = tools.isolated(args)  # last: it may probe bubblewrap with a call
    return args


def report(summary, rows, show):
    """A pass's line (the fourth category only when a grader produced it), then `show` examples of
    each category."""
    parts = [
        f"max_tokens {summary['max_tokens']}",
        f"accuracy {summary['accuracy']:.4f} ({summary['correct']}/{summary['n']})",
    ]
    for c in CATEGORIES:
        if c != CATEGORIES[-1] or summary["counts"][c]:
            parts.append(f"{c} {summary['counts'][c]}")
    parts.append(f"mean_reward {summary['mean_reward']:.4f}")
    parts.append(f"mean_tokens {summary['mean_tokens']:.1f}")
    parts.append(f"truncated {summary['frac_truncated']:.3f}")
    if "tool_calls_mean" in summary:
        parts.append(f"tool_calls {summary['tool_calls_mean']:.2f}")
        parts.append(f"tool_errors/call {summary['tool_error_rate']:.3f}")
    if "frac_thinking_cut" in summary:
        parts.append(f"thinking_cut {summary['frac_thinking_cut']:.3f}")
    parts.append(f"generate {summary['time/generate_s']:.1f}s")
    print(" | ".join(parts))
    for c in CATEGORIES:
        in_category = [r for r in rows if r["category"] == c]
        for r in in_category[:show]:
            print(f"  [{c}] gt={json.dumps(r['ground_truth'])} response={r['response'][-300:]!r}")


def pass_summary(p):
    """The summary row of one pass {"max_tokens", "rows", "generate_s"}."""
    return {
        "max_tokens": p["max_tokens"],
        **summarize(p["rows"]),
        "time/generate_s": round(p["generate_s"], 2),
    }


def write_pass_rates(args, rows):
    """--pass-rate-samples: PASS_RATES in --out, one row per example graded {"prompt",
    "ground_truth", "samples", "pass_rate"} (the fraction of its samples that are correct), and a
    line counting the never and the always solved."""
    by_example = {}  # index -> its graded samples
    for r in rows:
        by_example.setdefault(r["index"], []).append(r)
    out = []
    for group in by_example.values():
        correct = len([r for r in group if is_correct(r)])
        out.append(
            {
                "prompt": group[0]["prompt"],
                "ground_truth": group[0]["ground_truth"],
                "samples": len(group),
                "pass_rate": correct / len(group),
            }
        )
    path = os.path.join(args.out, PASS_RATES)
    write_jsonl_atomic(path, out)
    never = len([r for r in out if r["pass_rate"] == 0])
    always = len([r for r in out if r["pass_rate"] == 1])
    print(
        f"pass rates of {len(out)} examples ({args.pass_rate_samples} samples each at T "
        f"{args.temperature}): {never} never solved, {always} always solved -> {path}"
    )


def sample_chunk(llm, args, chunk, start, tool, max_tokens, stop):
    """The samples of a chunk of prompts, the first example `start`: one list per prompt of
    --pass-rate-samples K (else 1) samples. Each prompt goes K times into one call with n = 1, so
    sample j of example i draws with seed + i * K + j (and its turns above that, --tools), not
    with a seed that depends on --chunk."""
    k = args.samples_per_example
    repeated = []  # each prompt k times, in (example, sample) order
    for prompt in chunk:
        repeated += [prompt] * k
    outs = sample_responses(
        llm,
        repeated,
        tool,
        tools.thinking(args),
        n=1,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=max_tokens,
        stop=stop,
        seed=args.seed + start * k,
    )
    samples = []  # each example's k samples
    for i in range(0, len(outs), k):
        samples.append([out[0] for out in outs[i : i + k]])
    return samples


def grade_chunk(args, examples, start, samples, max_tokens):
    """The rows of generations.jsonl for examples start, start + 1, ... (one sample each; with
    --pass-rate-samples K > 1, K each, numbered by "sample")."""
    k = len(samples[0])  # samples per example
    outs = []
    chunk = []  # each sample's example
    for ex, per_prompt in zip(examples[start:], samples):
        for o in per_prompt:
            outs.append(o)
            chunk.append(ex)
    texts = []  # what is graded: with --tools the policy's own text, not the tool output
    for o in outs:
        if args.tools:
            texts.append(o["policy_text"])
        else:
            texts.append(o["text"])
    truths = [ex["ground_truth"] for ex in chunk]
    rewards = grade_batch(REWARD_FNS[args.reward], texts, truths, workers=args.workers)
    rows = []
    for n, (o, ex, r) in enumerate(zip(outs, chunk, rewards)):
        row = {
            "max_tokens": max_tokens,
            "index": start + n // k,
            "prompt": ex["prompt"],
            "response": o["text"],
            "ground_truth": ex["ground_truth"],
            "reward": r["reward"],
            "format_reward": r["format_reward"],
            "answer_reward": r["answer_reward"],
            "category": category(r),
            "num_tokens": len(o["token_ids"]),
            "finish_reason": o["finish_reason"],
        }
        if k > 1:
            row["sample"] = n % k
        if args.tools:
            # the transcript turn by turn: the policy's turns and the tool outputs apart
            row["segments"] = o["segments"]
            row["calls"] = o["calls"]
            row["errors"] = o["errors"]
            row["policy_tokens"] = sum(o["policy_mask"])  # num_tokens counts the tool output too
        if args.thinking_budget:
            row["segments"] = o["segments"]  # the policy's turns and the appended </think> apart
            row["thinking_cut"] = o["thinking_cut"]
            row["policy_tokens"] = sum(o["policy_mask"])  # num_tokens counts the close too
        rows.append(row)
    return rows


def main(argv=None):
    # SIGTERM (a scheduler's time limit, `timeout`, a container stop) stops as Ctrl-C does
    stop_on_sigterm()
    args = parse_args(argv)
    print(describe(args), flush=True)
    set_threads(args.threads)  # before the engine starts
    if args.dry_run:
        dry_run(args)
    tool = tools.make(args)  # --tools: one tool (python: one sandbox pool) for every snapshot
    try:
        if not args.sweep:
            evaluate(args, tool)
            return
        claim_out(args.out)
        rows = []
        for snapshot, one in sweep_args(args):
            print(f"== {snapshot['label']}: {snapshot['model']}", flush=True)
            summary, graded = evaluate(one, tool, claim=False)
            row = {**snapshot, **summary["rows"][0]}
            row["accuracy_se"] = mean_se([int(is_correct(r)) for r in graded])[1]
            rows.append(row)
        write_sweep(args.out, rows, f"{args.task} T={args.temperature}")
    finally:
        if tool is not None:
            tool.close()  # also on a stop request or an error


def evaluate(args, tool=None, claim=True):
    """One model: generate (with --tools, tools.py's multi-turn loop, `tool`), grade and write
    generations.jsonl and summary.json into args.out (held while it runs; claim=False: a sweep's
    snapshot folder, in the --out the sweep holds). -> (summary, graded rows)."""
    try:
        examples, stop = load_examples(args)
        prompts = [ex["prompt"] for ex in examples]
        print(
            f"{len(examples)} examples | max_tokens {args.max_tokens} | "
            f"temperature {args.temperature} | stop {stop}"
        )
        # held for this run's life; taken once the data loaded, so bad data leaves no --out behind
        if claim:
            claim_out(args.out)
        os.makedirs(args.out, exist_ok=True)
        llm = start_engine(args, prompts, max(args.max_tokens))
    except KeyboardInterrupt:
        print(f"\n{stop_name()} while loading: stopped; nothing written", file=sys.stderr)
        raise SystemExit(stop_exit_code()) from None
    from tqdm import tqdm

    passes = []  # per max_tokens: {"max_tokens", "rows" (graded so far), "generate_s"}
    stopped = None  # where a stop request (Ctrl-C, SIGTERM) ended the evaluation
    try:
        for max_tokens in args.max_tokens:
            p = {"max_tokens": max_tokens, "rows": [], "generate_s": 0.0}
            passes.append(p)
            # --- generate, then grade, a chunk at a time: a stop keeps the chunks graded. Example
            # i is sampled with seed + i whatever the chunking, as rollout.generate seeds prompt k
            # of a call with seed + k (--tools: turn t with seed + i + t * TOOL_TURN_STRIDE).
            # --pass-rate-samples K: each prompt K times in the call (n = 1), so sample j of
            # example i has seed + i * K + j whatever the chunking ---
            bar = tqdm(
                total=len(prompts), desc=f"generate max_tokens={max_tokens}", file=sys.stdout
            )
            with bar:
                for start in range(0, len(prompts), args.chunk):
                    t0 = time.time()
                    chunk = prompts[start : start + args.chunk]
                    samples = sample_chunk(llm, args, chunk, start, tool, max_tokens, stop)
                    p["generate_s"] += time.time() - t0
                    p["rows"] += grade_chunk(args, examples, start, samples, max_tokens)
                    bar.update(len(samples))
            report(pass_summary(p), p["rows"], args.show)
    except KeyboardInterrupt:
        stopped = f"{stop_name()} before the first chunk"
        if passes:
            p = passes[-1]
            stopped = (
                f"{stop_name()} at max_tokens {p['max_tokens']}, after "
                f"{len(p['rows']) // args.samples_per_example} of {len(examples)} examples"
            )

    # --- save (atomic: tmp + os.replace; --out was checked before any work) ---
    all_rows = []
    for p in passes:
        all_rows += p["rows"]
    summary_rows = []
    for p in passes:
        if p["rows"]:  # a pass stopped before its first chunk was graded has no row
            summary_rows.append(pass_summary(p))
    summary = {"args": vars(args), "rows": summary_rows}
    if stopped:
        summary["stopped"] = stopped
    path = os.path.join(args.out, "summary.json")
    written = False
    try:
        # a stop here waits for both files (a second one aborts): the graded rows are not lost
        with finish_then_interrupt("writing the results"):
            write_jsonl_atomic(os.path.join(args.out, "generations.jsonl"), all_rows)
            if args.pass_rate_samples:
                write_pass_rates(args, all_rows)
            write_json_atomic(path, summary)
            written = True
    except KeyboardInterrupt:
        message = f"\n{stop_name()} while writing the results: stopped, nothing written"
        if written:
            message = (
                f"\n{stop_name()}: stopped after writing {args.out}/generations.jsonl "
                f"({len(all_rows)} rows) and {path}"
            )
        print(message, file=sys.stderr)
        raise SystemExit(stop_exit_code()) from None
    print(f"wrote {args.out}/generations.jsonl ({len(all_rows)} rows) and {path}")
    if stopped:
        print(
            f'{stopped}: the rows graded so far are written (summary.json\'s "stopped"); '
            "pass --overwrite to run it again",
            file=sys.stderr,
        )
        raise SystemExit(stop_exit_code())
    return summary, all_rows


# -------------------------------------------------- a checkpoint sweep (shared with best_of_n.py)
SWEEP_FILES = ("checkpoints.json", "checkpoints.png")  # a sweep's summary rows and its plot


def snapshot_step(path):
    """The step in a checkpoint's state.json, else None (a model dir or hub id)."""
    state = read_json(os.path.join(path, "state.json"), "step")
    if state is None:
        return None
    return state["step"]


def expand_models(paths):
    """--model's values -> (the snapshots of a checkpoint sweep, the model to check the task
    against). One model dir or hub id is no sweep ([], it). A run directory (it holds
    checkpoint/ or checkpoints/) gives its series, oldest first, then checkpoint/ unless the
    series has its step; several values are each expanded so. A snapshot is {"label" (its folder
    in --out), "step" (None when unknown), "model"}."""
    is_run = []
    for path in paths:
        has_checkpoint = os.path.isdir(os.path.join(path, "checkpoint"))
        is_run.append(has_checkpoint or bool(snapshots(path)))
    if len(paths) == 1 and not is_run[0]:
        return [], paths[0]
    sweep = []
    for path, run in zip(paths, is_run):
        found = []
        if run:
            for step, snapshot in snapshots(path):
                found.append((step, snapshot))
            final = find_checkpoint(path, repair=False)
            if final is not None and snapshot_step(final) not in [s for s, _ in found]:
                found.append((snapshot_step(final), final))
            check(found, f"--model {path}: a run directory with no complete checkpoint")
        else:
            found.append((snapshot_step(path), path))
        for step, model in found:
            if step is None:  # a model directory of no run: its own name
                label = os.path.basename(model.rstrip("/")) or model
            else:
                label = f"step_{step:04d}"
            sweep.append({"label": label, "step": step, "model": model})
    labels = [s["label"] for s in sweep]
    for label in labels:
        check(
            labels.count(label) == 1,
            f"--model: two snapshots would both write {label}/; sweep one run directory at a "
            "time, or models with different names",
        )
    for s in sweep:
        check_model_dir(s["model"])
    return sweep, sweep[0]["model"]


def check_sweep_out(args, results):
    """A sweep's --out: free of SWEEP_FILES, and each snapshot's folder of `results`, unless
    --overwrite (as check_out)."""
    check_out(args.out, list(SWEEP_FILES), args.overwrite)
    for s in args.sweep:
        check_out(os.path.join(args.out, s["label"]), results, args.overwrite)


def sweep_args(args):
    """[(snapshot, its args)]: each snapshot evaluated as a one-model run into --out/<label>
    (a copy of args; args itself stays as parsed)."""
    out = []
    for s in args.sweep:
        one = dict(vars(args))
        one["model"] = s["model"]
        one["out"] = os.path.join(args.out, s["label"])
        one["sweep"] = []
        out.append((s, argparse.Namespace(**one)))
    return out


def best_snapshot(rows):
    """The row with the highest accuracy (the earliest on a tie)."""
    best = rows[0]
    for row in rows[1:]:
        if row["accuracy"] > best["accuracy"]:
            best = row
    return best


def write_sweep(out, rows, title):
    """checkpoints.json (one summary row per snapshot, and the best) and checkpoints.png
    (accuracy ± SE against step); prints the table and names the best snapshot. -> the best."""
    best = best_snapshot(rows)
    for row in rows:
        se = row["accuracy_se"]
        mark = ""
        if row is best:
            mark = "  <- best"
        print(f"{row['label']:>14} | accuracy {row['accuracy']:.4f} ± {se:.4f}{mark}")
    steps = [row["step"] for row in rows]
    xlabel = "step"
    if None in steps:
        steps = list(range(len(rows)))  # some snapshot has no step: their order
        xlabel = "snapshot (--model order)"
    write_json_atomic(os.path.join(out, SWEEP_FILES[0]), {"rows": rows, "best": best})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    accuracy = [row["accuracy"] for row in rows]
    se = [row["accuracy_se"] for row in rows]
    ax.errorbar(steps, accuracy, yerr=se, marker="o", capsize=3, label="accuracy ± SE")
    ax.plot(steps[rows.index(best)], best["accuracy"], "r*", markersize=12, label="best")
    ax.legend()
    ax.set(xlabel=xlabel, ylabel="accuracy", title=title[-60:])
    fig.tight_layout()
    path = os.path.join(out, SWEEP_FILES[1])
    fig.savefig(path + ".tmp", format="png", dpi=120)
    plt.close(fig)
    os.replace(path + ".tmp", path)
    print(
        f"best: {best['label']} ({best['model']}) accuracy {best['accuracy']:.4f} ± "
        f"{best['accuracy_se']:.4f} | wrote {out}/{SWEEP_FILES[0]} and {SWEEP_FILES[1]}"
    )
    return best


if __name__ == "__main__":
    main()
