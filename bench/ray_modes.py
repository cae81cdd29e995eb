"""Benchmark grpo_ray.py's schedules on one machine: samples/s, step time and device-hours per mode, the
sync/async speedup, weight-transfer latency (object store vs Ray Direct Transport over gloo) and one
Gantt timeline PNG with a panel per mode. Prints one JSON object.

  python bench/ray_modes.py                              # embedded model, 8 steps per mode (~4 min on 2 idle cores)
  python bench/ray_modes.py --steps 16 --max-tokens 64   # any grpo.py / grpo_ray.py flag passes through

Every mode processes the same samples (--steps rollout batches of --rollout-batch-size). Actors are
built once per placement and reset between modes; wall time starts after the initial eval (warm engine).
Modes: colocated-k1 (on-policy), colocated-k4 (4 GRPO-Clip steps per sync), disaggregated-sync,
disaggregated-async-s1. Devices: colocated 1, disaggregated 2, so device-hours = wall x devices.
On a CPU-only machine the "devices" are processes sharing the same cores: the async overlap can only
pay off when both actors have cores of their own.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import grpo_ray  # noqa: E402
import ray  # noqa: E402

# <= ~4k prompt tokens per rollout batch: a seeded request split by vLLM's chunked prefill crashes the CPU
# sampler ("CPU Generator does not use offset"), and the tiny tokenizers spend ~700 tokens on a countdown prompt.
SIZES = {"--rollout-batch-size": "32", "--group-size": "8", "--train-batch-size": "32",
         "--gradient-accumulation-steps": "2", "--max-tokens": "128", "--loss": "grpo_clip"}  # seed 004's loss, all modes
MODES = {"colocated-k1": ["--placement", "colocated"],
         "colocated-k4": ["--placement", "colocated", "--steps-per-rollout", "4"],
         "disaggregated-sync": ["--placement", "disaggregated"],
         "disaggregated-async-s1": ["--placement", "disaggregated", "--async", "--max-staleness", "1"]}


def transfer_latency(actors, transport, reps):
    """Seconds from get_weights to the generator holding the tensors (no engine load), median of reps."""
    opts = {"tensor_transport": transport} if transport else {}
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pushed = actors["learner"].get_weights.options(**opts).remote(clone=bool(transport))
        n_bytes = ray.get(actors["generator"].receive.remote(pushed), timeout=300)
        times.append(time.perf_counter() - t0)
        del pushed
    return {"median_s": statistics.median(times), "bytes": n_bytes}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8, help="rollout batches per mode (a multiple of 4)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    p.add_argument("--transfer-reps", type=int, default=5, help="weight transfers timed per transport (0 = skip)")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "ray_modes"), help="run dirs, timeline.png, summary.json")
    a, rest = p.parse_known_args()
    assert a.steps % 4 == 0, "--steps must be a multiple of 4 (colocated-k4 syncs every 4 batches)"
    if "--model" not in rest and not os.path.isdir(grpo_ray.grpo.EMBEDDED):  # before the sft engineer's model lands
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from conftest import build_tiny_model
        rest += ["--model", build_tiny_model(os.path.join(a.out, "tiny_model")), "--lr", "3e-4", "--temperature", "1.0"]
    result_model = rest[rest.index("--model") + 1] if "--model" in rest else "embedded models/countdown-tiny"
    for k, v in SIZES.items():  # unless given: 4 prompts x 8 samples, <= 128 new tokens, GRPO-Clip
        rest += [] if k in rest else [k, v]
    flags = ["--n-grpo-steps", str(a.steps), "--eval-every", "0", "--eval-n", "8", "--kl-every", "0"] + rest
    result = {"model": result_model, "cpu_count": os.cpu_count(), "steps": a.steps, "loadavg_1m_start": os.getloadavg()[0]}
    runs, actors, placement = [], None, None
    for mode in a.modes.split(","):
        args = grpo_ray.parse_args(flags + MODES[mode] + ["--out", os.path.join(a.out, mode)])
        grpo_ray.init_ray(args)
        if args.placement != placement:  # one actor set per placement, reset between its modes
            if actors:
                grpo_ray.kill_actors(actors)
            actors, placement = grpo_ray.build_actors(args), args.placement
        else:
            ray.get([x.reset.remote(args) for x in actors.values()], timeout=args.timeout_s)
        summary = grpo_ray.run(args, actors)
        result[mode] = {k: v for k, v in summary.items() if k not in ("placement", "async", "engine", "mode")}
        with open(os.path.join(args.out, "timeline.json")) as f:
            runs.append((mode, json.load(f)))
    if actors:
        grpo_ray.kill_actors(actors)
    wall = {m: result[m]["wall_s"] for m in MODES if m in result}
    if "disaggregated-sync" in wall and "disaggregated-async-s1" in wall:
        result["speedup_async_vs_sync"] = wall["disaggregated-sync"] / wall["disaggregated-async-s1"]
    if "colocated-k1" in wall and "disaggregated-async-s1" in wall:
        result["speedup_async_vs_colocated"] = wall["colocated-k1"] / wall["disaggregated-async-s1"]
    if a.transfer_reps:  # Problem 9: gloo RDT needs HF-engine actors (vLLM owns torch.distributed)
        args = grpo_ray.parse_args(flags + ["--placement", "disaggregated", "--engine", "hf", "--weight-sync", "gloo",
                                            "--out", os.path.join(a.out, "transfer")])
        pair = grpo_ray.build_actors(args)
        result["weight_transfer"] = {t or "object_store": transfer_latency(pair, t, a.transfer_reps) for t in (None, "gloo")}
        grpo_ray.kill_actors(pair)
    grpo_ray.plot_timeline(runs, os.path.join(a.out, "timeline.png"))
    result["timeline_png"], result["loadavg_1m_end"] = os.path.join(a.out, "timeline.png"), os.getloadavg()[0]
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(result, f, indent=1)
    ray.shutdown()  # flush the actors' forwarded log lines first: the JSON is the last line of stdout
    print(json.dumps(result))


if __name__ == "__main__":
    main()
