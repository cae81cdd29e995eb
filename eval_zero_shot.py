"""Zero-shot evaluation: prompt a model on a task, generate, grade, sort into the seeds' categories.

Follows seed 000 §3.2 (MATH, intellect prompt, greedy, 2048 tokens), seed 001 §3.2 (GSM8K, r1_zero
prompt) and seed 002 §1.6.1 (Countdown at 256/512/1024 max tokens). Prompts come from prompts/ via
data.py, generation from rollout.py (vLLM, or the transformers fallback with --engine hf), grading
from grader.py in parallel (grade_batch). Generation stops at "</answer>" when the prompt uses it.

Accuracy = fraction of examples with format_reward == 1 and answer_reward == 1 (category 1). The
three categories of the seeds are (1) format 1 & answer 1, (2) format 1 & answer 0, (3) format 0 &
answer 0; a grader that ever returns format 0 & answer 1 gets a fourth row so the counts add up.
Departures: --max-tokens takes a comma list and runs one generation pass per value on one engine
(one summary row each); every row of generations.jsonl carries its max_tokens. The seeds use one
engine per setting and a fixed dataset; Countdown here defaults to data.py's synthetic test split.

Examples:
  python eval_zero_shot.py                                 # embedded tiny model, synthetic Countdown
  python eval_zero_shot.py --model Qwen/Qwen2.5-Math-1.5B --task math500 --data math500_test.jsonl \
      --prompt intellect --max-tokens 2048
  python eval_zero_shot.py --model Qwen/Qwen3-1.7B --task countdown --max-tokens 256,512,1024
"""
import argparse
import json
import os
import sys
import time

from data import TASKS, format_prompt, load_prompt, load_task, stop_strings, write_json_atomic, write_jsonl_atomic
from grader import REWARD_FNS, grade_batch

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "countdown-tiny")
CATEGORIES = ["format1_answer1", "format1_answer0", "format0_answer0", "format0_answer1"]


def category(r):
    """Category name of one reward dict {"reward", "format_reward", "answer_reward"}."""
    return f"format{int(r['format_reward'] >= 1)}_answer{int(r['answer_reward'] >= 1)}"


def summarize(rows):
    """Accuracy, category counts and length stats of graded rows (one max_tokens setting)."""
    n = len(rows)
    counts = {c: sum(r["category"] == c for r in rows) for c in CATEGORIES}
    return {"n": n, "accuracy": counts["format1_answer1"] / max(n, 1), "counts": counts,
            "mean_reward": sum(r["reward"] for r in rows) / max(n, 1),
            "mean_tokens": sum(r["num_tokens"] for r in rows) / max(n, 1),
            "frac_truncated": sum(r["finish_reason"] == "length" for r in rows) / max(n, 1)}


def check_model(model):
    """Local-looking paths must be model directories; anything else is left to the hub."""
    local = os.path.isabs(model) or model.startswith((".", "~")) or os.path.isdir(os.path.dirname(model) or ".")
    if local and not os.path.isfile(os.path.join(os.path.expanduser(model), "config.json")):
        hint = " (the embedded model comes with sft.py; see README)" if model == DEFAULT_MODEL else ""
        raise SystemExit(f"error: --model {model}: no config.json there{hint}; pass a model dir or hub id")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Zero-shot evaluation with the seeds' three reward categories.")
    p.error = lambda msg: sys.exit(f"error: {msg} (see --help)")  # one line, not usage + error
    # --- model ---
    p.add_argument("--model", default=DEFAULT_MODEL, help="model dir or hub id (default: embedded tiny model)")
    p.add_argument("--engine", default="vllm", choices=["vllm", "hf"], help="rollout engine (hf = transformers)")
    # --- data ---
    p.add_argument("--task", default="countdown", choices=sorted(TASKS), help="task (data.load_task)")
    p.add_argument("--data", default=None, help="local JSON/JSONL for the task (countdown: synthetic if unset)")
    p.add_argument("--split", default="test", help="split for the synthetic/hub data")
    p.add_argument("--prompt", default=None, help="prompts/<name>.prompt (default: the task's, see data.TASKS)")
    p.add_argument("--reward", default=None, choices=sorted(REWARD_FNS), help="grader (default: the task's)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N examples")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic Countdown set (0 = sft/grpo's)")
    # --- sampling ---
    p.add_argument("--max-tokens", default="1024", help="max generated tokens; comma list = sweep (256,512,1024)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    p.add_argument("--seed", type=int, default=0, help="engine seed; prompt i is sampled with seed + i")
    # --- output ---
    p.add_argument("--out", default=None, help="output dir (default runs/eval_<task>)")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="grading processes")
    p.add_argument("--show", type=int, default=3, help="examples printed per category")
    p.add_argument("--chunk", type=int, default=512, help="prompts per generate call (progress bar step)")
    args = p.parse_args(argv)
    # derived settings, each checked before any model is loaded
    try:
        args.max_tokens = [int(x) for x in args.max_tokens.split(",")]
    except ValueError:
        p.error(f"--max-tokens must be integers separated by commas, got {args.max_tokens!r}")
    assert all(m > 0 for m in args.max_tokens), "error: --max-tokens values must be > 0"
    assert args.temperature >= 0 and 0 < args.top_p <= 1, "error: need --temperature >= 0 and 0 < --top-p <= 1"
    assert args.limit is None or args.limit > 0, "error: --limit must be > 0"
    assert args.workers > 0 and args.chunk > 0, "error: --workers and --chunk must be > 0"
    args.prompt = args.prompt or TASKS[args.task]["prompt"]
    args.reward = args.reward or TASKS[args.task]["reward"]
    args.out = args.out or os.path.join("runs", f"eval_{args.task}")
    if args.data is not None and not os.path.exists(args.data):
        p.error(f"--data {args.data}: file not found")
    check_model(args.model)
    return args


def main(argv=None):
    try:
        args = parse_args(argv)
    except AssertionError as e:
        raise SystemExit(str(e))
    try:  # data and prompt problems are one-line errors, raised before the engine starts
        template = load_prompt(args.prompt)
        examples = load_task(args.task, split=args.split, path=args.data, limit=args.limit, seed=args.data_seed)
        prompts = [format_prompt(template, ex["question"]) for ex in examples]
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    if not examples:
        raise SystemExit("error: no examples loaded; check --data/--split/--limit")
    stop = stop_strings(template)
    reward_fn = REWARD_FNS[args.reward]
    print(f"{len(examples)} {args.task} examples | prompt {args.prompt} | reward {args.reward} | stop {stop}")

    import torch
    from tqdm import tqdm
    from rollout import generate, init_engine
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device {device} ({'CUDA available' if device == 'cuda' else 'no CUDA'}) | engine {args.engine}")
    extra = {}
    if args.engine == "vllm":  # context = longest prompt + longest generation (init_vllm caps it at the model's)
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.model)
        extra["max_model_len"] = max(len(tok(p).input_ids) for p in prompts) + max(args.max_tokens)
    llm = init_engine(args.engine, args.model, device=device, seed=args.seed, **extra)

    all_rows, summary_rows = [], []
    for max_tokens in args.max_tokens:
        # --- generate (in chunks only so the progress bar moves; seeds are per prompt, so chunking
        # does not change the samples) ---
        t0, outs = time.time(), []
        with tqdm(total=len(prompts), desc=f"generate max_tokens={max_tokens}", file=sys.stdout) as bar:
            for i in range(0, len(prompts), args.chunk):
                batch = prompts[i:i + args.chunk]
                outs += [o[0] for o in generate(llm, batch, n=1, temperature=args.temperature, top_p=args.top_p,
                                                max_tokens=max_tokens, stop=stop, seed=args.seed + i)]
                bar.update(len(batch))
        gen_s = time.time() - t0
        # --- grade ---
        rewards = grade_batch(reward_fn, [o["text"] for o in outs], [ex["ground_truth"] for ex in examples],
                              workers=args.workers)
        rows = [{"max_tokens": max_tokens, "index": i, "prompt": p, "response": o["text"],
                 "ground_truth": ex["ground_truth"], "reward": r["reward"], "format_reward": r["format_reward"],
                 "answer_reward": r["answer_reward"], "category": category(r),
                 "num_tokens": len(o["token_ids"]), "finish_reason": o["finish_reason"]}
                for i, (p, o, ex, r) in enumerate(zip(prompts, outs, examples, rewards))]
        s = {"max_tokens": max_tokens, **summarize(rows), "time/generate_s": round(gen_s, 2)}
        # --- report ---
        print(f"max_tokens {max_tokens} | accuracy {s['accuracy']:.4f} ({s['counts']['format1_answer1']}/{s['n']}) | "
              + " | ".join(f"{c} {s['counts'][c]}" for c in CATEGORIES if c != CATEGORIES[-1] or s["counts"][c])
              + f" | mean_reward {s['mean_reward']:.4f} | mean_tokens {s['mean_tokens']:.1f}"
              + f" | truncated {s['frac_truncated']:.3f} | generate {gen_s:.1f}s")
        for c in CATEGORIES:
            for r in [r for r in rows if r["category"] == c][:args.show]:
                print(f"  [{c}] gt={json.dumps(r['ground_truth'])} response={r['response'][-300:]!r}")
        all_rows += rows
        summary_rows.append(s)

    # --- save (atomic: tmp + os.replace) ---
    os.makedirs(args.out, exist_ok=True)
    write_jsonl_atomic(os.path.join(args.out, "generations.jsonl"), all_rows)
    path = os.path.join(args.out, "summary.json")
    write_json_atomic(path, {"args": vars(args), "rows": summary_rows})
    print(f"wrote {args.out}/generations.jsonl ({len(all_rows)} rows) and {path}")


if __name__ == "__main__":
    main()
