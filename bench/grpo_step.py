"""Benchmark grpo.py on the embedded model: seconds per GRPO step with its time split, and the demo's
learning curve (validation accuracy vs wall-clock time). Prints one JSON object.

  python bench/grpo_step.py                  # both parts (~5 min on 2 CPU cores)
  python bench/grpo_step.py --skip-demo      # step timing only (~1 min)
  python bench/grpo_step.py --engine hf      # same with the transformers fallback engine

Step timing runs grpo.py as a subprocess at a fixed config (16 prompts x 8 samples, <= 64 new tokens,
on-policy, micro batch 32, KL logging on) and averages the steps after the first (warm-up).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIME_KEYS = ["time/generation", "time/grading", "time/old_log_probs", "time/training", "time/weight_sync", "time/step"]


def run(cmd, out):
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "grpo.py"), *cmd, "--out", out],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"error: grpo.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f], time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5, help="GRPO steps for the timing run (first is warm-up)")
    p.add_argument("--engine", default="vllm", choices=["vllm", "hf"], help="rollout engine")
    p.add_argument("--skip-demo", action="store_true", help="only time the fixed-config steps")
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args()
    result = {"engine": a.engine, "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ["--rollout-batch-size", "128", "--group-size", "8", "--train-batch-size", "128",
               "--gradient-accumulation-steps", "4", "--max-tokens", "64", "--n-grpo-steps", str(a.steps),
               "--eval-every", "0", "--eval-n", "16", "--kl-every", "1", "--engine", a.engine]
        rows, wall = run(cfg, os.path.join(tmp, "step"))
        train = [r for r in rows if "train/loss" in r and r["step"] >= 1]
        result["step_config"] = "16 prompts x 8 samples, max 64 new tokens, on-policy, micro batch 32, kl logging on"
        result["seconds_per_step"] = {k[5:]: round(sum(r[k] for r in train) / len(train), 3) for k in TIME_KEYS}
        result["response_tokens_per_step"] = round(sum(r["train/response_len_mean"] * 128 for r in train) / len(train))
        result["tokens_per_s"] = round(sum(r["time/tokens_per_s"] for r in train) / len(train), 1)
        result["gen_tokens_per_s"] = round(sum(r["time/gen_tokens_per_s"] for r in train) / len(train), 1)
        result["timing_run_wall_s"] = round(wall, 1)
        if not a.skip_demo:
            rows, wall = run(["--engine", a.engine], os.path.join(tmp, "demo"))
            evals = [r for r in rows if "eval/accuracy" in r]
            result["demo_wall_s"] = round(wall, 1)
            result["demo_curve"] = [{"step": r["step"], "wall_s": round(r["time/wall"], 1),
                                     "accuracy": round(r["eval/accuracy"], 4)} for r in evals]
            result["demo_accuracy_gain"] = round(evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"], 4)
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            f.write(text + "\n")
        os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
