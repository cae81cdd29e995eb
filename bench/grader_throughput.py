"""Grader throughput and worst-case latency; prints one JSON object.

* responses/s of r1_zero_reward_fn on GSM8K-style answers (ground truths from gsm8k_test.jsonl) and
  MATH-style answers (MATH-500 boxed answers), each set 1/3 exact, 1/3 re-written but equivalent
  ("$1,234.00", "\\dfrac", "x = ..."), 1/3 another problem's answer (the slow, sympy path); measured
  in this process (serial, main thread) and with grade_batch(workers=2) pool processes;
* the worst single-call latency over a fuzzed adversarial set (10^10^10, nested exponents, 50 kB
  responses, unbalanced braces, ...) for every reward function, in the main thread and in a thread;
* the pool's start-up, and its recovery from a worker stuck in C code: the batch with the stuck item
  (killed at grader.HARD_LIMIT_S) and the next batch, which must not wait for the replacement.
Targets on the 2-core dev machine: >= 3,000/s GSM8K-style, >= 300/s MATH-style, worst <= 1.2 s.
Needs ../shared/data (relative to the repo root); skips with a message when it is absent.

  .venv/bin/python bench/grader_throughput.py
  .venv/bin/python bench/grader_throughput.py --fuzz 2000 --workers 2
"""

import argparse
import json
import multiprocessing
import os
import random
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import data  # noqa: E402
import grader  # noqa: E402

R1 = "Let me work it out step by step. </think> <answer> {} </answer>"
rng = random.Random(0)  # re-seeded from --seed in main


def gsm_variant(a):
    """An equivalent rewrite of a GSM8K answer: '$1,234.00', '1,234 dollars' or '1234.'."""
    if not a.lstrip("-").isdigit():
        return a
    n = int(a)
    return rng.choice([f"${n:,}.00", f"{n:,} dollars", f"{n}."])


def math_variant(a):
    """An equivalent MATH answer: \\dfrac for \\frac, spaces after commas, or 'x = ...'."""
    if "\\frac" in a:
        b = a.replace("\\frac", "\\dfrac")
    elif "\\" in a:
        b = a.replace(",", ", ")
    else:
        b = a
    if b == a and "=" not in a:
        return f"x = {b}"
    return b


def make_set(gts, variant):
    """Three responses per ground truth: exact, re-written, and another problem's answer."""
    resps = []
    golds = []
    for i, g in enumerate(gts):
        other = gts[(i * 7 + 1) % len(gts)]
        resps += [R1.format(g), R1.format(variant(g)), R1.format(other)]
        golds += [g, g, g]
    return resps, golds


def pool_cpu_s():
    """CPU seconds used so far by the live grader pool processes (children of this one)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in multiprocessing.active_children():
        try:
            with open(f"/proc/{p.pid}/stat") as f:
                stat = f.read()
            # the fields after the command name (which may hold spaces); 11 and 12: utime, stime
            fields = stat.rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:13]) / tick
        except OSError:  # it just exited
            pass
    return total


def throughput(resps, golds, workers):
    """(responses per wall second, per CPU second of this process + helpers, mean reward)."""
    t = time.perf_counter()
    c = time.process_time()
    helpers_cpu = pool_cpu_s()
    out = grader.grade_batch(grader.r1_zero_reward_fn, resps, golds, workers=workers)
    wall = time.perf_counter() - t
    cpu = time.process_time() - c + pool_cpu_s() - helpers_cpu
    return (
        round(len(resps) / wall, 1),
        round(len(resps) / cpu, 1),
        round(sum(o["reward"] for o in out) / len(out), 3),
    )


# ----------------------------------------------------------------------------- adversarial latency
ADV = [
    "10^10^10",
    "10^{10^{10}}",
    "9^{9^{9^{9}}}",
    "(10^{999})^{999}",
    "2^{99999}",
    "99999!",
    "(5!)!",
    "\\sqrt{" * 200,
    "}" * 500 + "{",
    "1" * 5000,
    "\\frac{" * 300,
    "x" * 50_000,
    "e^{e^{e^{e^{10}}}}",
    "\\sum_{k=1}^{10^{9}} k",
    "\\int_0^1 x^{99} \\sin(x^{99}) dx",
    "(x+1)^{99}",
    "\\prod_{k=1}^{100000} k",
    "10**10**10",
    "\\left(" * 300,
    "<answer>" * 2000,
    "Step 1: " * 3000,
    "(" * 5000 + "1" + ")" * 5000,
    "\\boxed{" * 1000,
    "10^{-99999}",
    "x^{x^{x^{x}}}",
    "\\binom{10000}{5000}",
    "\\lfloor 10^{100} \\pi \\rfloor",
    "2^{2^{2^{2^{2}}}}",
]
FRAG = [
    "</think> <answer>",
    "</answer>",
    "\\boxed{",
    "}",
    "{",
    "^",
    "^{",
    "10",
    "99",
    "!",
    "\\frac",
    "(",
    ")",
    "+",
    "*",
    "/",
    "-",
    "=",
    "Step 1:",
    "####",
    "x",
    "\\left(",
    "\\right)",
    "\\sqrt",
    "e",
    "\\pi",
    "%",
    "\\text{cm}",
    " ",
]
GT = {
    "countdown": {"numbers": [1, 2, 3], "target": 6},
    "countdown_subset": {"numbers": [1, 2, 3], "target": 6},
    "keyword": ["apple"],
    "gsm8k": "18",
}


def fuzz_inputs(n):
    for a in ADV:
        yield R1.format(a)
        yield "Therefore, the final answer is: $\\boxed{" + a + "}$"
    for _ in range(n):
        k = rng.choice([5, 20, 60, 400])  # pieces
        pieces = []
        for _ in range(k):
            if rng.random() < 0.1:
                pieces.append(rng.choice(FRAG + ADV[:8]))  # now and then an adversarial piece
            else:
                pieces.append(rng.choice(FRAG))
        body = "".join(pieces)
        yield rng.choice(
            [R1.format(body), body, "<answer>" + body + "</answer>", "\\boxed{" + body + "}"]
        )


def worst_latency(inputs):
    """The slowest call of every reward function over inputs, and the 99th percentile."""
    worst = (0.0, "")  # (seconds, which call)
    lat = []
    for name, fn in grader.REWARD_FNS.items():
        for resp in inputs:
            t = time.perf_counter()
            fn(resp, GT.get(name, "\\frac{1}{2}"))
            dt = time.perf_counter() - t
            lat.append(dt)
            worst = max(worst, (dt, f"{name}: {resp[:60]!r}"))
    lat.sort()
    return {
        "calls": len(lat),
        "worst_s": round(worst[0], 3),
        "p99_s": round(lat[int(0.99 * len(lat))], 4),
        "worst_input": worst[1],
    }


def worker_pid(response, ground_truth):
    """A picklable stand-in grader: which worker graded this."""
    time.sleep(0.05)
    return os.getpid()


def start_pool(workers):
    """Seconds until every worker of the pool has graded something (the first grade_batch starts
    it)."""
    t = time.perf_counter()
    seen = set()
    while len(seen) < workers:
        seen |= set(grader.grade_batch(worker_pid, [0] * workers, [0] * workers, workers=workers))
    return round(time.perf_counter() - t, 2)


def recovery(workers):
    """Seconds of the batch holding one item stuck in C code (pow: no signal stops it) and of the
    next batch."""
    t = time.perf_counter()
    res = grader.grade_batch(pow, [2, 3, 5, 7], [3, 10**8, 2, 2], workers=workers)
    stuck = time.perf_counter() - t
    assert res == [8, grader.ZERO, 25, 49], res
    t = time.perf_counter()
    grader.grade_batch(pow, list(range(100)), [2] * 100, workers=workers)
    return {"stuck_batch_s": round(stuck, 2), "next_batch_s": round(time.perf_counter() - t, 3)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--data-dir",
        default=os.path.join(ROOT, "..", "shared", "data"),
        help="folder with gsm8k_test.jsonl, math500_test.jsonl",
    )
    p.add_argument(
        "--workers", type=int, default=2, help="pool processes for the grade_batch measurement"
    )
    p.add_argument(
        "--fuzz", type=int, default=600, help="fuzzed adversarial responses per reward function"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="random seed for the rewrites and the fuzzing"
    )
    args = p.parse_args()
    gsm_path = os.path.join(args.data_dir, "gsm8k_test.jsonl")
    math_path = os.path.join(args.data_dir, "math500_test.jsonl")
    if not (os.path.exists(gsm_path) and os.path.exists(math_path)):
        why = (
            f"dev data not found in {os.path.abspath(args.data_dir)} "
            "(needs gsm8k_test.jsonl, math500_test.jsonl)"
        )
        print(json.dumps({"skipped": why}))
        return
    rng.seed(args.seed)
    results = {}
    gsm_gts = [r["ground_truth"] for r in data.load_task("gsm8k", path=gsm_path)]
    gsm = make_set(gsm_gts, gsm_variant)
    math_gts = [r["ground_truth"] for r in data.load_task("math500", path=math_path)]
    math = make_set(math_gts, math_variant)
    grader.math_equal("x^2", "x^3")  # one-time sympy warm-up in this process (~1 s), not a verdict
    results["pool_startup_s"] = start_pool(args.workers)
    for name, (resps, golds) in [("gsm8k_style", gsm), ("math_style", math)]:
        serial, serial_cpu, acc = throughput(resps, golds, workers=0)
        batch, batch_cpu, acc_b = throughput(resps, golds, workers=args.workers)
        results[name] = {
            "n": len(resps),
            "serial_wall_per_s": serial,
            "serial_per_cpu_s": serial_cpu,
            f"grade_batch_{args.workers}w_wall_per_s": batch,
            f"grade_batch_{args.workers}w_per_cpu_s": batch_cpu,
            "mean_reward": acc,
            "mean_reward_batch": acc_b,
        }
    inputs = list(fuzz_inputs(args.fuzz))
    results["adversarial_main_thread"] = worst_latency(inputs)
    box = {}
    grader._sympy_equal_any_thread.cache_clear()  # the thread pass must really use the pool

    def in_a_thread():  # sympy then runs in a pool worker
        box.update(worst_latency(inputs[: len(ADV) * 2 + 100]))

    th = threading.Thread(target=in_a_thread)
    th.start()
    th.join()
    results["adversarial_other_thread"] = box
    results["stuck_worker_recovery"] = recovery(args.workers)
    # targets judged on one core's CPU rate (wall rates depend on how busy the shared machine is)
    worst_s = max(results["adversarial_main_thread"]["worst_s"], box["worst_s"])
    results["targets_met"] = {
        "gsm8k_style_3000_per_s": results["gsm8k_style"]["serial_per_cpu_s"] >= 3000,
        "math_style_300_per_s": results["math_style"]["serial_per_cpu_s"] >= 300,
        "worst_1.2_s": worst_s <= 1.2,
    }
    results["load_average_1min"] = os.getloadavg()[0]
    results["cpu_count"] = os.cpu_count()
    print(json.dumps(results, indent=1))


# the grader pool's forkserver imports this file: nothing may run at import
if __name__ == "__main__":
    main()
