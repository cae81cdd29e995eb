"""Best-of-N test-time scaling (seed 001 §3.3): pass@k, Best@k and maj@k from one pass of N samples.

One generation pass draws N samples per prompt (default T=1.0) with per-token log-probs, grades
them and saves everything to DIR/generations.jsonl; `--from-generations FILE` recomputes the
metrics from such a file without a model. Metrics are exact expectations over a uniformly random
k-subset of a prompt's n samples (not "the first k"), averaged over prompts, computed in closed
form with exact fractions (c = correct samples; correct = answer_reward == 1, the accuracy of
every script):
  pass@k = 1 - C(n-c, k) / C(n, k)                     (Chen et al. 2021; losses.pass_at_k)
  Best@k : sort samples by mean token log-prob (descending, ties by sample index); the sample of
           rank i is the pick iff it is in the subset and no better-ranked one is, which has
           probability C(n-1-i, k-1) / C(n, k); Best@k = sum_i correct_i * that.
  maj@k  : samples vote with their normalised answer (see `answer`); samples with no answer do
           not vote, a subset with no votes scores 0, a tie at the top is split evenly among the
           tied answers; an answer is correct if any sample carrying it is correct. Counted
           exactly by a small DP over the other answers' vote counts (see `validation.maj_at_k`).
  oracle gap = pass@k - Best@k (what a perfect verifier would add over likelihood selection).
With --tools (tools.py) a sample's mean log-prob is over the tokens the policy sampled
("policy_mask" 1): a tool's output was not the policy's choice, and its log-probs read 0.
Best@1 == pass@1 == mean accuracy over all samples, exactly (asserted).

Data, prompt, grader, engine and --out checks are eval_zero_shot.py's, and sample 0 of prompt i
is drawn with seed + i as that script draws its one sample, so `first_sample_accuracy` is exactly
its accuracy at the same --seed/--temperature/--max-tokens (tested). Departure: the seed draws N
samples per N; we draw --n once and average over k-subsets (unbiased, lower variance). Log-probs
are of the sampled (temperature-scaled) distribution, as rollout.generate returns them; at T=1,
the model's.

--tools python|calculator samples with tools.py's multi-turn loop (flags and default prompt as in
eval_zero_shot.py): each sample's policy text is graded and voted, and generations.jsonl shows
its "segments" (each turn and each tool output apart) and "policy_mask". Turn t of sample j of
prompt i uses seed + j*P + i + t * eval_zero_shot.TOOL_TURN_STRIDE, so sample 0 is still
eval_zero_shot's sample at the same flags. --thinking-budget N (tools.generate_thinking) does the
same for a thinking model whose thinking is closed at N tokens: the appended </think> is graded
with the response but left out of its mean log-prob ("policy_mask" 0), with the same seeds.

Ctrl-C or SIGTERM (a scheduler's stop) exits 130 / 143 naming what was written: nothing until the
samples are graded (one generation pass), then generations.jsonl, then best_of_n.json. --out is
held for the run's life: a second run there is refused in one line naming the first.

Examples:
  python best_of_n.py                              # embedded model, synthetic Countdown
  python best_of_n.py --model Qwen/Qwen3-0.6B --task gsm8k --data gsm8k_test.jsonl --n 16 \\
      --ns 1,4,8,16
  python best_of_n.py --from-generations runs/bon_gsm8k/generations.jsonl --ns 1,2,4,8,16 \\
      --overwrite                                  # replaces the run's best_of_n.json
  python best_of_n.py --tools calculator --limit 50 --n 8 --ns 1,2,4,8
"""

import os
import sys
from fractions import Fraction
from math import comb

import tools
from common import (
    Parser,
    check,
    existing_file,
    fail,
    int_list,
    nonneg_int,
    positive_float,
    positive_int,
    probability,
    thread_count,
)
from data import read_jsonl, write_json_atomic, write_jsonl_atomic
from eval_zero_shot import (
    add_data_flags,
    add_model_flag,
    check_engine,
    check_out,
    check_sweep_out,
    claim_out,
    default_max_tokens,
    describe,
    expand_models,
    load_examples,
    sample_responses,
    start_engine,
    sweep_args,
    task_flags,
    write_sweep,
)
from grader import REWARD_FNS, grade_batch, is_correct
from hardware import set_threads
from losses import pass_at_k
from runs import dry_run, stop_exit_code, stop_name, stop_on_sigterm
from validation import answer, maj_at_k, mean_se


# --------------------------------------------------------------------------------------- estimators
def best_at_k(correct, scores, k):
    """P(the highest-scoring sample of a random k-subset is correct); ties go to the lower index."""
    n = len(correct)
    order = sorted(range(n), key=lambda j: (-scores[j], j))  # best first
    picked = 0  # k-subsets whose best sample is correct
    for i, j in enumerate(order):
        if correct[j]:
            picked += comb(n - 1 - i, k - 1)  # j is in the subset, the i better ones are not
    return Fraction(picked, comb(n, k))


def policy_score(sample):
    """The mean log-prob of the tokens the policy sampled: all of them, or with a "policy_mask"
    (--tools) those marked 1, not the tool output's (read 0); -inf with none (never the pick)."""
    logprobs = sample["logprobs"]
    if "policy_mask" in sample:
        logprobs = [lp for lp, m in zip(logprobs, sample["policy_mask"]) if m]
    if not logprobs:
        return float("-inf")
    return sum(logprobs) / len(logprobs)


def _mean(values):
    """The exact mean of per-prompt values (Fractions or ints)."""
    return sum(values, Fraction(0)) / len(values)


def metrics(rows, ks):
    """pass@k, Best@k, maj@k and the oracle gap for every k, from rows of graded samples."""
    prompts = []  # per prompt: correct flags, mean token log-probs, normalised answers
    for r in rows:
        correct = []
        scores = []
        answers = []
        for x in r["samples"]:
            correct.append(is_correct(x))
            scores.append(policy_score(x))
            answers.append(x["answer"])
        prompts.append({"correct": correct, "scores": scores, "answers": answers})

    accuracy = []  # per prompt
    first_sample = []
    best_at_1 = []
    pass_at_1 = []
    for q in prompts:
        n = len(q["correct"])
        c = q["correct"].count(True)
        accuracy.append(Fraction(c, n))
        first_sample.append(1 if q["correct"][0] else 0)
        best_at_1.append(best_at_k(q["correct"], q["scores"], 1))
        pass_at_1.append(pass_at_k(n, c, 1))
    acc = _mean(accuracy)
    best1 = _mean(best_at_1)
    pass1 = _mean(pass_at_1)
    assert best1 == pass1 == acc, f"Best@1 {best1} != pass@1 {pass1} != accuracy {acc}"

    out = []
    for k in ks:
        pass_k = []  # per prompt
        best_k = []
        maj_k = []
        for q in prompts:
            pass_k.append(pass_at_k(len(q["correct"]), q["correct"].count(True), k))
            best_k.append(best_at_k(q["correct"], q["scores"], k))
            maj_k.append(maj_at_k(q["answers"], q["correct"], k))
        p = _mean(pass_k)
        b = _mean(best_k)
        m = _mean(maj_k)
        out.append(
            {
                "k": k,
                "pass@k": float(p),
                "best@k": float(b),
                "maj@k": float(m),
                "oracle_gap": float(p - b),
            }
        )
    tokens = []
    for r in rows:
        for x in r["samples"]:
            tokens.append(x["num_tokens"])
    return {
        "accuracy": float(acc),
        "first_sample_accuracy": float(_mean(first_sample)),
        "mean_tokens": sum(tokens) / len(tokens),
        "rows": out,
    }


def plot(result, path, title):
    """pass@k, Best@k and maj@k against k (log scale) as a PNG at `path` (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["k"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for key in ["pass@k", "best@k", "maj@k"]:
        ax.plot(ks, [r[key] for r in result["rows"]], marker="o", label=key)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.legend()
    ax.set(xlabel="k (samples)", ylabel="accuracy", title=title)
    fig.tight_layout()
    fig.savefig(path + ".tmp", format="png", dpi=120)
    os.replace(path + ".tmp", path)


# -------------------------------------------------------------------------------- generations.jsonl
SAMPLE_FIELDS = ("answer_reward", "logprobs", "answer", "num_tokens")  # what `metrics` reads


def _is_number(v):
    """An int or a float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_generations(path):
    """Rows of a best_of_n.py generations.jsonl; every sample must carry the fields `metrics`
    reads."""
    try:
        rows = read_jsonl(path)
    except ValueError as e:
        fail(str(e))
    check(rows, f"--from-generations {path}: no rows")
    for i, r in enumerate(rows, 1):
        samples = None
        if isinstance(r, dict):
            samples = r.get("samples")
        check(
            isinstance(samples, list) and samples,
            f'{path}: row {i} has no "samples" list; not a best_of_n.py generations.jsonl',
        )
        for j, x in enumerate(samples):
            for key in SAMPLE_FIELDS:
                check(
                    isinstance(x, dict) and key in x,
                    f"{path}: row {i} sample {j}: missing field {key!r}",
                )
            check(
                _is_number(x["answer_reward"])
                and isinstance(x["num_tokens"], int)
                and isinstance(x["logprobs"], list)
                and all(map(_is_number, x["logprobs"]))
                and isinstance(x["answer"], (str, type(None))),
                f"{path}: row {i} sample {j}: need a number answer_reward, an int num_tokens, "
                f"a list of numbers logprobs and a string/null answer",
            )
            mask = x.get("policy_mask", [1] * len(x["logprobs"]))  # older files: no tool
            check(
                isinstance(mask, list)
                and len(mask) == len(x["logprobs"])
                and all(m in (0, 1) for m in mask),
                f"{path}: row {i} sample {j}: policy_mask must be one 0/1 per logprob",
            )
    return rows


def parse_args(argv=None):
    p = Parser(description="pass@k, Best@k (log-prob selection) and maj@k from N samples.")
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
    p.add_argument(
        "--from-generations",
        type=existing_file,
        default=None,
        help="re-score this generations.jsonl (no model); writes next to it unless --out",
    )
    # --- data: --task --data --split --prompt --reward --limit --data-seed, as eval_zero_shot ---
    add_data_flags(p)
    # --- sampling ---
    p.add_argument("--n", type=positive_int, default=16, help="samples per prompt")
    p.add_argument(
        "--ns", type=int_list, default="1,4,8,16", help="k values to report, comma list, each <= n"
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        help="max generated tokens per sample (default: eval_zero_shot.py's for the task/model)",
    )
    p.add_argument(
        "--temperature",
        type=positive_float,
        default=1.0,
        help="sampling temperature (seed 001: 1.0)",
    )
    p.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling mass")
    p.add_argument(
        "--seed",
        type=nonneg_int,
        default=0,
        help="engine seed; sample j of prompt i uses seed + j*P + i (P prompts): "
        "sample 0 = eval_zero_shot's (--tools: turn t adds t * 2^32)",
    )
    # --- output ---
    p.add_argument(
        "--out",
        default=None,
        help="output dir (default runs/bon_<task>, or the re-scored file's dir)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace generations.jsonl/best_of_n.json in --out"
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
    # --- tools: --tools --max-tool-calls --max-obs-tokens --tool-timeout ... (tools.py) ---
    tools.add_flags(p)
    args = p.parse_args(argv)
    return resolve(args)


def resolve(args):
    """The defaults that depend on other flags, and the checks that need no model: each a
    one-line error. After this, args is only read."""
    args.ns = sorted(set(args.ns))
    args.sweep, args.model = expand_models(args.model)
    if args.from_generations:
        check(not args.sweep, "--from-generations re-scores one file: drop the --model sweep")
        check(
            not args.tools and not args.thinking_budget,
            "--from-generations re-scores the file's samples as they are: drop --tools and "
            "--thinking-budget",
        )
        here = os.path.dirname(os.path.abspath(args.from_generations))
        args.out = args.out or here
        # what --out may hold only with --overwrite: next to the file too, the metrics there are
        # the user's (issue 44: a re-score replaced them unasked)
        check_out(args.out, ["best_of_n.json"], args.overwrite)
        return args
    check(args.ns[-1] <= args.n, f"--ns values must be in 1..--n ({args.n}), got {args.ns}")
    args.reward, args.data = task_flags(args)  # and args.prompt, through tools.resolve
    args.max_tokens = args.max_tokens or default_max_tokens(args.task, args.model)
    args.out = args.out or os.path.join("runs", f"bon_{args.task}")
    results = ["generations.jsonl", "best_of_n.json"]
    if args.sweep:
        check_sweep_out(args, results)
    else:
        check_out(args.out, results, args.overwrite)
    check_engine(args.engine)
    args.tool_isolated = tools.isolated(args)  # last: it may probe bubblewrap with a call
    return args


def generate_rows(args, tool=None):
    """One pass of args.n samples per prompt (with --tools, tools.py's multi-turn ones: `tool`),
    graded; returns the rows written to generations.jsonl."""
    examples, stop = load_examples(args)
    prompts = [ex["prompt"] for ex in examples]
    print(
        f"{len(prompts)} prompts x {args.n} samples | max_tokens {args.max_tokens} | "
        f"temperature {args.temperature}"
    )
    llm = start_engine(args, prompts, args.max_tokens)
    outs = sample_responses(
        llm,
        prompts,
        tool,
        tools.thinking(args),
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        stop=stop,
        seed=args.seed,
    )
    # graded in one flat batch: prompt 0's samples, then prompt 1's, ...
    flat = []
    truths = []
    for per_prompt, ex in zip(outs, examples):
        flat += per_prompt
        truths += [ex["ground_truth"]] * args.n
    texts = []  # what is graded and votes: with --tools the policy's own text, not the tool's
    for o in flat:
        if args.tools:
            texts.append(o["policy_text"])
        else:
            texts.append(o["text"])
    rewards = grade_batch(REWARD_FNS[args.reward], texts, truths, workers=args.workers)
    samples = []
    for o, text, r in zip(flat, texts, rewards):
        sample = {
            "response": o["text"],
            "answer": answer(text),
            **r,
            "num_tokens": len(o["token_ids"]),
            "finish_reason": o["finish_reason"],
            "logprobs": o["logprobs"],
        }
        if args.tools:
            sample["policy_mask"] = o["policy_mask"]  # Best@k scores the 1s (policy_score)
            sample["segments"] = o["segments"]  # each turn and each tool output apart
            sample["calls"] = o["calls"]
            sample["errors"] = o["errors"]
        if args.thinking_budget:
            sample["policy_mask"] = o["policy_mask"]  # Best@k scores the 1s: not the close
            sample["segments"] = o["segments"]  # the policy's turns and the appended </think>
            sample["thinking_cut"] = o["thinking_cut"]
        samples.append(sample)
    rows = []
    for i, (p, ex) in enumerate(zip(prompts, examples)):
        row = {
            "index": i,
            "prompt": p,
            "ground_truth": ex["ground_truth"],
            "samples": samples[i * args.n : (i + 1) * args.n],
        }
        rows.append(row)
    return rows


def main(argv=None):
    # SIGTERM (a scheduler's time limit, `timeout`, a container stop) stops as Ctrl-C does
    stop_on_sigterm()
    args = parse_args(argv)
    if args.from_generations:
        print(f"re-scoring {args.from_generations}", flush=True)
    else:
        print(describe(args), flush=True)
        set_threads(args.threads)  # before the engine starts
    if args.dry_run:
        dry_run(args)
    claim_out(args.out)  # held for this run's life: a second run there is refused
    written = []  # the files written so far, for a stop request's message
    tool = None
    if not args.from_generations:
        tool = tools.make(args)  # --tools: one tool (python: one sandbox pool) for the run
    try:
        if not args.sweep:
            score(args, written, tool)
            return
        # a checkpoint sweep: each snapshot scored into --out/<label>, one row each
        rows = []
        for snapshot, one in sweep_args(args):
            print(f"== {snapshot['label']}: {snapshot['model']}", flush=True)
            result, graded = score(one, written, tool)
            accuracy = []  # per prompt: the fraction of its samples that are right
            for r in graded:
                right = [is_correct(x) for x in r["samples"]]
                accuracy.append(sum(right) / len(right))
            row = {**snapshot, "num_prompts": result["num_prompts"]}
            row["accuracy"], row["accuracy_se"] = mean_se(accuracy)
            row["ks"] = result["rows"]
            rows.append(row)
        write_sweep(args.out, rows, f"{args.task} T={args.temperature} n={args.n}")
    except KeyboardInterrupt:
        message = f"{stop_name()}: stopped before anything was written"
        if written:
            message = f"{stop_name()}: stopped after writing {', '.join(written)}"
        if len(written) == 1 and not args.from_generations:
            message += f"; re-score it with --from-generations {written[0]}"
        print(f"\n{message}", file=sys.stderr)
        raise SystemExit(stop_exit_code()) from None
    finally:
        if tool is not None:
            tool.close()


def score(args, written, tool=None):
    """Generate (or read) the samples (with --tools, calling `tool`), compute the metrics, write
    them and the plot; each file written is added to `written`. -> (the metrics, the graded
    rows)."""
    out = args.out
    os.makedirs(out, exist_ok=True)  # (a sweep's snapshot folder)
    if args.from_generations:
        rows = read_generations(args.from_generations)
        n = min(len(r["samples"]) for r in rows)
        check(
            args.ns[-1] <= n,
            f"--ns values must be in 1..{n} (samples per prompt in {args.from_generations})",
        )
    else:
        rows = generate_rows(args, tool)
        path = os.path.join(out, "generations.jsonl")
        write_jsonl_atomic(path, rows)
        written.append(path)
        # --overwrite: the previous run's metrics must not sit beside these samples
        for name in ("best_of_n.json", "best_of_n.png"):
            if os.path.exists(os.path.join(out, name)):
                os.remove(os.path.join(out, name))

    # --- metrics, plot, JSON (all recomputed from the rows, so --from-generations reproduces
    # them) ---
    result = {**metrics(rows, args.ns), "num_prompts": len(rows)}
    for r in result["rows"]:
        print(
            f"k {r['k']:>3} | pass@k {r['pass@k']:.4f} | best@k {r['best@k']:.4f} | "
            f"maj@k {r['maj@k']:.4f} | oracle_gap {r['oracle_gap']:.4f}"
        )
    path = os.path.join(out, "best_of_n.json")
    write_json_atomic(path, {"args": vars(args), **result})
    written.append(path)
    title = args.from_generations
    if not title:
        model_name = os.path.basename(args.model.rstrip("/"))
        title = f"{model_name} {args.task} T={args.temperature}"
    plot(result, os.path.join(out, "best_of_n.png"), title[-60:])
    print(
        f"accuracy (mean over all samples = pass@1) {result['accuracy']:.4f} | "
        f"wrote {path} and best_of_n.png"
    )
    return result, rows


if __name__ == "__main__":
    main()
