"""Benchmark grpo_ray.py's schedules (placement, sync / async, scale-out) on one machine.

Measures samples/s, step time and device-seconds per mode, the sync/async speedup, the scale-out
grid (N generators x M data-parallel learners), the weight-transfer latency (object store vs Ray
Direct Transport over gloo) and draws one Gantt timeline PNG with a panel per mode. Prints one JSON
object.

Every mode processes the same samples (--steps rollout batches of --rollout-batch-size). Actors are
built once per actor layout and reset between modes; wall time starts after the initial eval (warm
engines). Modes: colocated-k1 (on-policy), colocated-k4 (4 GRPO-Clip steps per sync),
colocated-k1-N2M2 (colocated x 2: two actors, each a vLLM engine and a data-parallel learner shard),
disaggregated-sync, disaggregated-async-s1, and --scale's NxM points (disaggregated-async-s1 with N
engines and M learners). device_s = wall x actors.

Honest about small machines: the actors' "devices" here are processes sharing the same CPU cores
(cpu_count is in the JSON), so extra engines and learners add processes, not compute: on 2 cores the
scale grid measures the mechanics' overhead (sharding, one weight put read N times, the learners'
gloo all-reduce), not a speedup. On a GPU cluster each actor has its own device and the same command
measures the scaling.

  python bench/ray_modes.py        # the embedded model, 8 steps per mode (~10 min on 2 idle cores)
  python bench/ray_modes.py --modes '' --scale 1x1,2x1,1x2,2x2 --transfer-reps 0   # scale grid only
  python bench/ray_modes.py --steps 16 --max-tokens 64   # any grpo.py / grpo_ray.py flag too
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import ray  # noqa: E402

import grpo_ray  # noqa: E402
import plot  # noqa: E402
import runs as run_dirs  # noqa: E402

# <= ~4k prompt tokens per rollout batch: a seeded request split by vLLM's chunked prefill crashes
# the CPU sampler ("CPU Generator does not use offset"), and the tiny tokenizers spend ~700 tokens
# on a countdown prompt.
SIZES = {
    "--rollout-batch-size": "32",
    "--group-size": "8",
    "--train-batch-size": "32",
    "--gradient-accumulation-steps": "2",
    "--max-tokens": "128",
    "--loss": "grpo_clip",  # seed 004's loss, all modes
    # logical CPUs of the local cluster: room for the largest actor layout (2 x 2 + spare)
    "--num-cpus": "8",
}
MODES = {
    "colocated-k1": ["--placement", "colocated"],
    "colocated-k4": ["--placement", "colocated", "--steps-per-rollout", "4"],
    "colocated-k1-N2M2": "--placement colocated --num-generators 2 --num-learners 2".split(),
    "disaggregated-sync": ["--placement", "disaggregated"],
    "disaggregated-async-s1": ["--placement", "disaggregated", "--async", "--max-staleness", "1"],
}


def received_bytes(worker, pushed):
    """Runs in the generator (__ray_call__): the bytes Ray resolved for a push, nothing loaded into
    the engine."""
    return sum(v.numel() * v.element_size() for v in pushed["weights"].values())


def transfer_latency(actors, transport, reps):
    """Seconds from get_weights to the generator holding the tensors (no engine load), median of
    reps."""
    opts = {}
    if transport:
        opts = {"tensor_transport": transport}
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pushed = actors["learner"][0].get_weights.options(**opts).remote(clone=bool(transport))
        probe = actors["generator"][0].__ray_call__.remote(received_bytes, pushed)
        n_bytes = ray.get(probe, timeout=300)
        times.append(time.perf_counter() - t0)
        del pushed
    return {"median_s": statistics.median(times), "bytes": n_bytes}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--steps", type=int, default=8, help="rollout batches per mode (a multiple of 4)"
    )
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated subset of " + ", ".join(MODES) + " ('' = none)",
    )
    p.add_argument(
        "--scale",
        default="1x1,2x1,1x2,2x2",
        help="NxM points: N generators x M learners, async ('' = none)",
    )
    p.add_argument(
        "--transfer-reps",
        type=int,
        default=5,
        help="weight transfers timed per transport (0 = skip)",
    )
    p.add_argument(
        "--out",
        default=os.path.join(ROOT, "runs", "ray_modes"),
        help="run dirs, timeline.png, summary.json",
    )
    a, rest = p.parse_known_args()  # rest: grpo.py / grpo_ray.py flags
    assert a.steps % 4 == 0, "--steps must be a multiple of 4 (colocated-k4 syncs every 4 batches)"
    # unless given: 4 prompts x 8 samples, <= 128 new tokens, GRPO-Clip
    for k, v in SIZES.items():
        if k not in rest:
            rest += [k, v]
    flags = ["--n-grpo-steps", str(a.steps), "--eval-every", "0", "--eval-n", "8"]
    flags += ["--kl-every", "0"]
    flags += rest

    modes = {}  # name -> its flags
    for m in a.modes.split(","):
        if m:
            modes[m] = MODES[m]
    for nm in a.scale.split(","):
        if not nm:
            continue
        n, m = nm.split("x")
        scale_flags = ["--num-generators", n, "--num-learners", m]
        modes[f"async-N{n}M{m}"] = MODES["disaggregated-async-s1"] + scale_flags

    model = "embedded models/countdown-tiny"
    if "--model" in rest:
        model = rest[rest.index("--model") + 1]
    result = {
        "model": model,
        "cpu_count": os.cpu_count(),
        "steps": a.steps,
        "loadavg_1m_start": os.getloadavg()[0],
    }

    # --- one run per mode, on one actor set per layout ---
    runs = []  # (mode, timeline) for the Gantt chart
    actors = None
    layout = None  # (placement, N, M) of the actors built
    for mode, mode_flags in modes.items():
        args = grpo_ray.parse_args(flags + mode_flags + ["--out", os.path.join(a.out, mode)])
        grpo_ray.init_ray(args)
        mode_layout = (args.placement, args.num_generators, args.num_learners)
        if mode_layout != layout:
            if actors:
                grpo_ray.kill_actors(actors)
            actors = grpo_ray.build_actors(args)
            layout = mode_layout
        else:
            run_dirs.claim_run_dir(args.out, args.resume)  # before the actors' engine logs
            ray.get([x.reset.remote(args) for x in actors["all"]], timeout=args.timeout_s)
        summary = grpo_ray.run(args, actors)
        result[mode] = {k: v for k, v in summary.items() if k not in ("engine", "mode")}
        with open(os.path.join(args.out, "timeline.json")) as f:
            runs.append((mode, json.load(f)))
    if actors:
        grpo_ray.kill_actors(actors)

    wall = {m: result[m]["wall_s"] for m in modes}
    if "disaggregated-sync" in wall and "disaggregated-async-s1" in wall:
        result["speedup_async_vs_sync"] = (
            wall["disaggregated-sync"] / wall["disaggregated-async-s1"]
        )
    if "colocated-k1" in wall and "disaggregated-async-s1" in wall:
        result["speedup_async_vs_colocated"] = wall["colocated-k1"] / wall["disaggregated-async-s1"]

    # --- Problem 9: weight-transfer latency; gloo RDT needs HF-engine actors (vLLM owns
    # torch.distributed) ---
    if a.transfer_reps:
        pair_flags = ["--placement", "disaggregated", "--engine", "hf", "--weight-sync", "gloo"]
        pair_flags += ["--out", os.path.join(a.out, "transfer")]
        args = grpo_ray.parse_args(flags + pair_flags)
        grpo_ray.init_ray(args)
        pair = grpo_ray.build_actors(args)
        result["weight_transfer"] = {
            "object_store": transfer_latency(pair, None, a.transfer_reps),
            "gloo": transfer_latency(pair, "gloo", a.transfer_reps),
        }
        grpo_ray.kill_actors(pair)

    if runs:
        plot.plot_timeline(runs, os.path.join(a.out, "timeline.png"))
        result["timeline_png"] = os.path.join(a.out, "timeline.png")
    result["loadavg_1m_end"] = os.getloadavg()[0]
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(result, f, indent=1)
    # flush the actors' forwarded log lines first: the JSON is the last line of stdout
    ray.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
