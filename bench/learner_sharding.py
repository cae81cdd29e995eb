"""Per-learner memory and step time of grpo_ray.py's M = 2 disaggregated learners,
--learner-sharding replicate vs fsdp, on one machine. Prints one JSON object.

Each layout runs --steps synchronous GRPO steps (one HF-engine generator, two learners, KL
monitoring on, so each learner also keeps pi_ref and pi_{t-1}) on a stand-in model
(sft.build_tiny_model at --hidden x --layers, random weights, synthetic Countdown) or on --model.
Per learner, measured from its tensors after the last step (sharding.held_bytes: a DTensor counts
its local shard): the policy's parameters, the AdamW state, the frozen copies; gradients are freed
at each step's end and peak at the parameters' size (their shard's, sharded). Also each learner
process's resident memory now and at its peak (the peak includes loading: every learner loads the
whole model once, then keeps its shard). Per layout: the mean seconds per step of the learners'
train and old_log_probs spans, and of the push's get_weights (sharded: a gather by both learners).

Honest about small machines: the two learners are processes on the same cores, gloo carries the
all-gathers and reduce-scatters through memory, and the tiny models' steps are dominated by
per-call overhead: the memory column is the point here (half per learner, within dim-0 padding);
the step times show the price of the extra collectives on CPU, not what NCCL costs on GPUs.

  python bench/learner_sharding.py                      # stand-in 512 x 4, 3 steps per layout
  python bench/learner_sharding.py --hidden 1024 --layers 8 --steps 4
  python bench/learner_sharding.py --model models/countdown-tiny
"""

import argparse
import json
import os
import resource
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import ray  # noqa: E402

import grpo_ray  # noqa: E402
import sft  # noqa: E402
import sharding  # noqa: E402

# the measured run: 4 prompts x 8 samples, <= 64 new tokens, 2 optimizer steps per batch
FLAGS = (
    "--placement disaggregated --engine hf --num-learners 2 --loss grpo_clip --kl-every 1 "
    "--task countdown --train-path synthetic --val-path synthetic --eval-n 4 --eval-every 0 "
    "--rollout-batch-size 32 --group-size 8 --train-batch-size 16 --gradient-accumulation-steps 2 "
    "--max-tokens 64 --grader-workers 0 --no-shared-prefix --num-cpus 4"
).split()
LAYOUTS = ["replicate", "fsdp"]


def memory(worker):
    """Runs in a learner (__ray_call__): bytes of the tensors it holds, and its resident memory
    now and at its peak (bytes)."""
    learner = worker.learner
    frozen = 0
    for key in ("ref_model", "prev_model"):
        if learner[key] is not None:
            frozen += sharding.held_bytes(learner[key])
    policy = sharding.held_bytes(learner["policy"])
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {
        "policy_bytes": policy,
        "adamw_bytes": sharding.held_bytes(learner["policy"], learner["optimizer"]) - policy,
        "frozen_bytes": frozen,
        "rss_bytes": resident,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3, help="GRPO steps per layout")
    p.add_argument("--hidden", type=int, default=512, help="the stand-in's hidden size")
    p.add_argument("--layers", type=int, default=4, help="the stand-in's decoder layers")
    p.add_argument("--model", default=None, help="a model directory instead of the stand-in")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "learner_sharding"), help="run dirs")
    a, rest = p.parse_known_args()  # rest: grpo.py / grpo_ray.py flags
    model = a.model
    if model is None:
        model = sft.build_tiny_model(
            tempfile.mkdtemp(prefix="stand_in_"), None, "qwen2", a.hidden, a.layers
        )
    result = {
        "model": a.model or f"stand-in {a.hidden} x {a.layers}",
        "cpu_count": os.cpu_count(),
        "steps": a.steps,
        "loadavg_1m_start": os.getloadavg()[0],
    }
    for layout in LAYOUTS:
        flags = FLAGS + ["--model", model, "--n-grpo-steps", str(a.steps)]
        flags += ["--learner-sharding", layout, "--out", os.path.join(a.out, layout)] + rest
        args = grpo_ray.parse_args(flags)
        grpo_ray.init_ray(args)
        actors = grpo_ray.build_actors(args)
        try:
            summary = grpo_ray.run(args, actors)
            probes = [x.__ray_call__.remote(memory) for x in actors["learner"]]
            learners = ray.get(probes, timeout=args.timeout_s)
        finally:
            grpo_ray.kill_actors(actors)
        per_step = {}
        for phase in ("old_log_probs", "train", "get_weights"):
            # every learner's spans: the per-step mean over learners
            per_step[phase] = summary["phase_total_s"][phase] / (2 * a.steps)
        if layout == "replicate":  # learner 0 alone gathers nothing: one span per step
            per_step["get_weights"] *= 2
        result[layout] = {
            "learners": learners,
            "seconds_per_step": per_step,
            "wall_s": summary["wall_s"],
        }
    ratios = {}
    for key in ("policy_bytes", "adamw_bytes", "frozen_bytes", "rss_bytes"):
        ratios[key] = result["fsdp"]["learners"][0][key] / result["replicate"]["learners"][0][key]
    result["fsdp_over_replicate"] = ratios
    result["loadavg_1m_end"] = os.getloadavg()[0]
    ray.shutdown()  # the actors' forwarded log lines first: the JSON is the last line of stdout
    print(json.dumps(result))


if __name__ == "__main__":
    main()
