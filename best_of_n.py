"""Best-of-N test-time scaling (seed 001 §3.3): pass@k, Best@k and maj@k from one pass of N samples.

One generation pass draws N samples per prompt (default T=1.0) with per-token log-probs, grades them
and saves everything to DIR/generations.jsonl; `--from-generations FILE` recomputes the metrics from
such a file without a model. Metrics are exact expectations over a uniformly random k-subset of a
prompt's n samples (not "the first k"), averaged over prompts, computed in closed form with exact
fractions (c = correct samples; correct = format_reward == 1 and answer_reward == 1):
  pass@k = 1 - C(n-c, k) / C(n, k)                                      (Chen et al. 2021)
  Best@k : sort samples by mean token log-prob (descending, ties by sample index); the sample of
           rank i is the pick iff it is in the subset and no better-ranked one is, which has
           probability C(n-1-i, k-1) / C(n, k); Best@k = sum_i correct_i * that.
  maj@k  : samples vote with their normalised answer (see `answer`); samples with no answer do not
           vote, a subset with no votes scores 0, a tie at the top is split evenly among the tied
           answers; an answer is correct if any sample carrying it is correct. Counted exactly by
           a small DP over the other answers' vote counts (see `maj_at_k`).
  oracle gap = pass@k - Best@k (what a perfect verifier would add over likelihood selection).
Best@1 == pass@1 == mean accuracy over all samples, exactly (asserted). Sample 0 of prompt i is drawn
with seed + i as eval_zero_shot.py draws its one sample, so `first_sample_accuracy` is exactly its
accuracy at the same --seed/--temperature/--max-tokens (tested). Departure: the seed draws N samples
per N; we draw --n once and average over k-subsets (unbiased, lower variance). Log-probs are of the
sampled (temperature-scaled) distribution, as rollout.generate returns them; at T=1, the model's.

Examples:
  python best_of_n.py                                       # embedded model, synthetic Countdown
  python best_of_n.py --model Qwen/Qwen3-0.6B --task gsm8k --data gsm8k_test.jsonl --n 16 --ns 1,4,8,16
  python best_of_n.py --from-generations runs/bon_gsm8k/generations.jsonl --ns 1,2,4,8,16
"""
import argparse
import os
import re
import sys
from collections import Counter
from fractions import Fraction
from math import comb

from data import (TASKS, format_prompt, last_boxed, load_prompt, load_task, read_jsonl, stop_strings,
                  write_json_atomic, write_jsonl_atomic)
from grader import REWARD_FNS, grade_batch

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "countdown-tiny")


# ----------------------------------------------------------------------------- estimators
def pass_at_k(n, c, k):
    """P(at least one of a random k-subset of n samples, c of them correct, is correct)."""
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def best_at_k(correct, scores, k):
    """P(the highest-scoring sample of a random k-subset is correct); ties go to the lower index."""
    n = len(correct)
    order = sorted(range(n), key=lambda j: (-scores[j], j))
    return Fraction(sum(comb(n - 1 - i, k - 1) for i, j in enumerate(order) if correct[j]), comb(n, k))


def maj_at_k(answers, correct, k):
    """Expected correctness of the plurality answer of a random k-subset (answers: str or None)."""
    n, m0 = len(answers), sum(a is None for a in answers)
    size = Counter(a for a in answers if a is not None)
    good = {a for a, ok in zip(answers, correct) if ok and a is not None}
    total = Fraction(0)
    for g in good:
        others = [m for a, m in size.items() if a != g]
        for x in range(1, min(k, size[g]) + 1):  # g gets x votes; every other answer gets <= x
            ways = {(0, 0): 1}  # (votes drawn from other answers, how many of them tie at x) -> count
            for m in others:
                nxt = {}
                for (s, t), w in ways.items():
                    for y in range(0, min(m, x, k - x - s) + 1):
                        key = (s + y, t + (y == x))
                        nxt[key] = nxt.get(key, 0) + w * comb(m, y)
                ways = nxt
            for (s, t), w in ways.items():  # the rest of the subset comes from answer-less samples
                total += Fraction(comb(size[g], x) * w * comb(m0, k - x - s), t + 1)
    return total / comb(n, k)


def answer(text):
    """Normalised final answer: last <answer>...</answer> (a \\boxed{} in it unwrapped), else last
    \\boxed{}; None if neither.
    Spaces, $ and a trailing period are dropped; numbers are canonicalised (1,000.0 -> 1000);
    Countdown expressions vote as strings, so "3+4" and "4+3" are different answers."""
    tags = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    a = tags[-1] if tags else last_boxed(text)
    if a is None:
        return None
    a = last_boxed(a) or a  # "<answer> \boxed{72} </answer>" votes with "<answer> 72 </answer>"
    a = re.sub(r"\s+|\$", "", a).rstrip(".")
    try:
        v = float(a.replace(",", ""))
        return str(int(v)) if v.is_integer() else repr(v)
    except (ValueError, OverflowError):
        return a or None


def metrics(rows, ks):
    """pass@k / Best@k / maj@k / oracle gap for every k, from generation rows with graded samples."""
    per = []  # per prompt: (correct flags, mean token log-probs, normalised answers)
    for r in rows:
        s = r["samples"]
        per.append(([x["format_reward"] >= 1 and x["answer_reward"] >= 1 for x in s],
                    [sum(x["logprobs"]) / len(x["logprobs"]) if x["logprobs"] else float("-inf") for x in s],
                    [x["answer"] for x in s]))
    mean = lambda f: sum((f(*q) for q in per), Fraction(0)) / len(per)  # noqa: E731
    acc = mean(lambda ok, sc, a: Fraction(sum(ok), len(ok)))
    best1, pass1 = mean(lambda ok, sc, a: best_at_k(ok, sc, 1)), mean(lambda ok, sc, a: pass_at_k(len(ok), sum(ok), 1))
    assert best1 == pass1 == acc, f"Best@1 {best1} != pass@1 {pass1} != accuracy {acc}"
    out = []
    for k in ks:
        p = mean(lambda ok, sc, a: pass_at_k(len(ok), sum(ok), k))
        b = mean(lambda ok, sc, a: best_at_k(ok, sc, k))
        m = mean(lambda ok, sc, a: maj_at_k(a, ok, k))
        out.append({"k": k, "pass@k": float(p), "best@k": float(b), "maj@k": float(m), "oracle_gap": float(p - b)})
    tokens = [x["num_tokens"] for r in rows for x in r["samples"]]
    return {"accuracy": float(acc), "first_sample_accuracy": float(mean(lambda ok, sc, a: ok[0])),
            "mean_tokens": sum(tokens) / len(tokens), "rows": out}


def plot(result, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ks = [r["k"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for key in ["pass@k", "best@k", "maj@k"]:
        ax.plot(ks, [r[key] for r in result["rows"]], marker="o", label=key)
    ax.set_xscale("log", base=2), ax.set_xticks(ks, [str(k) for k in ks]), ax.legend()
    ax.set(xlabel="k (samples)", ylabel="accuracy", title=title), fig.tight_layout()
    fig.savefig(path + ".tmp", format="png", dpi=120)
    os.replace(path + ".tmp", path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="pass@k, Best@k (log-prob selection) and maj@k from N samples.")
    p.error = lambda msg: sys.exit(f"error: {msg} (see --help)")  # one line, not usage + error
    # --- model ---
    p.add_argument("--model", default=DEFAULT_MODEL, help="model dir or hub id (default: embedded tiny model)")
    p.add_argument("--engine", default="vllm", choices=["vllm", "hf"], help="rollout engine (hf = transformers)")
    p.add_argument("--from-generations", default=None, help="recompute metrics from this generations.jsonl")
    # --- data ---
    p.add_argument("--task", default="countdown", choices=sorted(TASKS), help="task (data.load_task)")
    p.add_argument("--data", default=None, help="local JSON/JSONL for the task (countdown: synthetic if unset)")
    p.add_argument("--prompt", default=None, help="prompts/<name>.prompt (default: the task's)")
    p.add_argument("--reward", default=None, choices=sorted(REWARD_FNS), help="grader (default: the task's)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N problems")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic Countdown set (0 = sft/grpo's)")
    # --- sampling ---
    p.add_argument("--n", type=int, default=16, help="samples per prompt")
    p.add_argument("--ns", default="1,4,8,16", help="k values to report, comma list, each <= n")
    p.add_argument("--max-tokens", type=int, default=1024, help="max generated tokens per sample")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    p.add_argument("--seed", type=int, default=0, help="engine seed; prompt i is sampled with seed + i")
    # --- output ---
    p.add_argument("--out", default=None, help="output dir (default runs/bon_<task>, or the file's dir)")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="grading processes")
    args = p.parse_args(argv)
    try:
        args.ns = sorted({int(k) for k in args.ns.split(",")})
    except ValueError:
        p.error(f"--ns must be integers separated by commas, got {args.ns!r}")
    if args.from_generations:
        if not os.path.isfile(args.from_generations):
            p.error(f"--from-generations {args.from_generations}: file not found")
        args.out = args.out or os.path.dirname(os.path.abspath(args.from_generations))
        return args
    if args.ns[0] < 1 or args.ns[-1] > args.n:
        p.error(f"--ns values must be in 1..--n ({args.n}), got {args.ns}")
    if args.temperature <= 0 or args.max_tokens < 1 or (args.limit is not None and args.limit < 1):
        p.error("need --temperature > 0 (N greedy samples are identical), --max-tokens >= 1, --limit >= 1")
    if args.data is not None and not os.path.exists(args.data):
        p.error(f"--data {args.data}: file not found")
    m = args.model  # a local-looking path must be a model dir; anything else is left to the hub
    if (os.path.isabs(m) or m.startswith((".", "~")) or os.path.isdir(os.path.dirname(m) or ".")) \
            and not os.path.isfile(os.path.join(os.path.expanduser(m), "config.json")):
        p.error(f"--model {m}: no config.json there; pass a model dir or hub id")
    args.prompt = args.prompt or TASKS[args.task]["prompt"]
    args.reward = args.reward or TASKS[args.task]["reward"]
    args.out = args.out or os.path.join("runs", f"bon_{args.task}")
    return args


def generate_rows(args):
    """One pass of args.n samples per prompt, graded; returns the rows written to generations.jsonl."""
    try:  # data / prompt problems are one-line errors before the engine starts
        template = load_prompt(args.prompt)
        examples = load_task(args.task, path=args.data, limit=args.limit, seed=args.data_seed)
        prompts = [format_prompt(template, ex["question"]) for ex in examples]
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    import torch
    from rollout import generate, init_engine
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{len(prompts)} prompts x {args.n} samples | device {device} | engine {args.engine}")
    extra = {}
    if args.engine == "vllm":  # context = longest prompt + generation (init_vllm caps it at the model's)
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.model)
        extra["max_model_len"] = max(len(tok(p).input_ids) for p in prompts) + args.max_tokens
    llm = init_engine(args.engine, args.model, device=device, seed=args.seed, **extra)
    outs = generate(llm, prompts, n=args.n, temperature=args.temperature, top_p=args.top_p,
                    max_tokens=args.max_tokens, stop=stop_strings(template), seed=args.seed)
    flat = [o for per_prompt in outs for o in per_prompt]
    gts = [ex["ground_truth"] for ex in examples for _ in range(args.n)]
    rewards = grade_batch(REWARD_FNS[args.reward], [o["text"] for o in flat], gts, workers=args.workers)
    samples = [{"response": o["text"], "answer": answer(o["text"]), **r, "num_tokens": len(o["token_ids"]),
                "finish_reason": o["finish_reason"], "logprobs": o["logprobs"]} for o, r in zip(flat, rewards)]
    return [{"index": i, "prompt": p, "ground_truth": ex["ground_truth"], "samples": samples[i * args.n:(i + 1) * args.n]}
            for i, (p, ex) in enumerate(zip(prompts, examples))]


def main(argv=None):
    args = parse_args(argv)
    if args.from_generations:
        try:
            rows = read_jsonl(args.from_generations)
            n = min(len(r["samples"]) for r in rows)
        except (ValueError, KeyError, TypeError):
            raise SystemExit(f"error: {args.from_generations} is not a best_of_n.py generations.jsonl")
        if args.ns[0] < 1 or args.ns[-1] > n:
            raise SystemExit(f"error: --ns values must be in 1..{n} (samples per prompt in the file)")
    else:
        rows = generate_rows(args)
        write_jsonl_atomic(os.path.join(args.out, "generations.jsonl"), rows)
    # --- metrics, plot, JSON (all recomputed from the rows, so --from-generations reproduces them) ---
    result = {**metrics(rows, args.ns), "num_prompts": len(rows)}
    for r in result["rows"]:
        print(f"k {r['k']:>3} | pass@k {r['pass@k']:.4f} | best@k {r['best@k']:.4f} | maj@k {r['maj@k']:.4f}"
              f" | oracle_gap {r['oracle_gap']:.4f}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "best_of_n.json")
    write_json_atomic(path, {"args": vars(args), **result})
    title = args.from_generations or f"{os.path.basename(args.model.rstrip('/'))} {args.task} T={args.temperature}"
    plot(result, os.path.join(args.out, "best_of_n.png"), title[-60:])
    print(f"accuracy (mean over all samples = pass@1) {result['accuracy']:.4f} | wrote {path} and best_of_n.png")


if __name__ == "__main__":
    main()
