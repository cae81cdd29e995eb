"""Peak memory and time of losses.get_response_log_probs (the chunked lm_head + log-softmax) against
the naive log_softmax(model(ids).logits.float()), on a bf16 model with a Qwen-sized vocabulary, on
CPU. Prints one JSON object.

Method: every (variant, mode) runs in a fresh subprocess. After building the model and the inputs,
the child resets the kernel's RSS high-water mark (writes "5" to /proc/self/clear_refs), records
VmRSS, runs the call once and reads VmHWM: the peak extra memory is VmHWM - VmRSS before the call.
This sees every byte torch allocates (tracemalloc does not), and the fresh process keeps one
variant's allocator state out of the other's. Time is the best of --reps further calls, as wall
time and as process CPU time (the latter is the fair comparison on a machine shared with other
jobs). Modes: "train" = forward + backward of sum(log_probs * mask), "no_grad" = the old-log-probs
forward. The naive variant peaks at ~2.3 x B*T*V*4 bytes (9.5 GB at the default sizes), so run it
where there is room.

    python bench/logprobs_memory.py                     # vocab 151936, seq 1024, batch 4, hidden 64
    python bench/logprobs_memory.py --seq 256 --reps 1  # a quick look
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
# --- model ---
parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen2.5: 151936)")
parser.add_argument(
    "--hidden", type=int, default=64, help="hidden size of the bf16 Qwen2 (a multiple of 64)"
)
parser.add_argument("--layers", type=int, default=1, help="number of transformer layers")
# --- workload ---
parser.add_argument("--batch", type=int, default=4, help="sequences per call")
parser.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
parser.add_argument(
    "--chunk-size", type=int, default=256, help="tokens per lm_head chunk in get_response_log_probs"
)
parser.add_argument(
    "--temperature", type=float, default=1.0, help="sampling temperature applied to the logits"
)
parser.add_argument(
    "--reps", type=int, default=2, help="timed calls after the measured first call (best is kept)"
)
# --- internal ---
parser.add_argument("--child", default=None, help="internal: 'variant:mode' to run in this process")
args = parser.parse_args()

METHOD = (
    "fresh subprocess per variant/mode; peak extra = VmHWM - VmRSS before the call after resetting "
    "the high-water mark via /proc/self/clear_refs; time_s (wall) and cpu_s (process CPU time, "
    "robust to other load on a shared machine) = best of --reps calls after the first"
)


def proc_kb(key):
    """The value in kB of `key` (VmRSS, VmHWM) in /proc/self/status."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def child(variant, mode):
    """Measure one variant ("naive" or "chunked") in one mode ("train" or "no_grad") in this
    process; print its numbers as one JSON line."""
    import gc

    import torch

    import losses
    from sft import tiny_model  # the repo's one tiny-model builder

    model = tiny_model(
        "qwen2", args.vocab, args.hidden, args.layers, max_position_embeddings=args.seq + 1
    ).to(torch.bfloat16)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    input_ids = ids[:, :-1]  # (B, T)
    labels = ids[:, 1:]  # (B, T)
    mask = (torch.rand(args.batch, args.seq) > 0.3).float()  # (B, T)

    def call():
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(mode == "train"):
            if variant == "naive":
                # (B, T, V) float32: the tensor the chunked head never builds
                logits = model(input_ids, use_cache=False).logits.float() / args.temperature
                lp = torch.log_softmax(logits, dim=-1).gather(-1, labels[..., None]).squeeze(-1)
            else:
                lp = losses.get_response_log_probs(
                    model,
                    input_ids,
                    labels,
                    temperature=args.temperature,
                    chunk_size=args.chunk_size,
                )["log_probs"]
            if mode == "train":
                (lp * mask).sum().backward()
        return lp.detach().double().sum().item()

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = proc_kb("VmRSS")
    t0 = time.perf_counter()
    c0 = time.process_time()
    checksum = call()
    first = time.perf_counter() - t0
    first_cpu = time.process_time() - c0
    peak = proc_kb("VmHWM")
    times = [first]  # wall seconds per call
    cpus = [first_cpu]  # process CPU seconds per call
    for _ in range(args.reps):
        t0 = time.perf_counter()
        c0 = time.process_time()
        call()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    grad = model.model.embed_tokens.weight.grad
    if grad is None:
        embed_grad_norm = None
    else:
        embed_grad_norm = grad.float().norm().item()
    record = {
        "peak_extra_mb": round((peak - base) / 1024, 1),
        "rss_before_mb": round(base / 1024, 1),
        "time_s": round(min(times[1:] or times), 3),
        "first_call_s": round(first, 3),
        "cpu_s": round(min(cpus[1:] or cpus), 3),
        "log_probs_sum": checksum,
        "embed_grad_norm": embed_grad_norm,
    }
    print(json.dumps(record))


def main():
    import torch

    result = {
        "config": {k: v for k, v in vars(args).items() if k != "child"},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "method": METHOD,
        "runs": {},
    }
    for mode in ("train", "no_grad"):
        for variant in ("naive", "chunked"):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{variant}:{mode}"]
            cmd += sys.argv[1:]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(
                    f"error: {variant}:{mode} failed (rc {out.returncode}):\n{out.stderr[-2000:]}"
                )
            result["runs"][f"{variant}:{mode}"] = json.loads(out.stdout.strip().splitlines()[-1])
        n = result["runs"][f"naive:{mode}"]
        c = result["runs"][f"chunked:{mode}"]
        result[f"{mode}_memory_ratio"] = round(c["peak_extra_mb"] / n["peak_extra_mb"], 4)
        result[f"{mode}_time_ratio"] = round(c["time_s"] / n["time_s"], 3)
        result[f"{mode}_cpu_time_ratio"] = round(c["cpu_s"] / n["cpu_s"], 3)
        difference = abs(c["log_probs_sum"] - n["log_probs_sum"])
        result[f"{mode}_log_probs_sum_rel_diff"] = difference / abs(n["log_probs_sum"])
    result["targets"] = {"memory_ratio_max": 0.25, "time_ratio_max": 1.5}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    if args.child:
        variant, mode = args.child.split(":")
        child(variant, mode)
    else:
        main()
