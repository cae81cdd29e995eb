"""Full fine-tuning vs LoRA in one GRPO training step: trainable parameters, optimizer-state bytes
and step time, on the embedded model and on a larger stand-in. Prints one JSON line per cell
(model x rank), then one line with the config.

Method: grpo.collect samples ONE batch with the embedded model (the transformers engine, the
demo's loss and lr); then, per model and per rank (0 = full fine-tuning), grpo.build_learner builds
the learner grpo.py would (under LoRA: the base in the compute dtype, fp32 adapters, AdamW over
the adapters only) and grpo.train_step trains on that same frozen batch, --rounds times from the
same initial weights (the best time is reported; other jobs on a shared box only add time).

The stand-in is sft.build_tiny_model at --stand-in-hidden x --stand-in-layers with random weights
(the step's cost does not depend on the weights); it trains on the embedded model's token ids (its
tokenizer's vocabulary is larger, so every id is valid).

Per cell: trainable and total parameters; optimizer_state_bytes (every tensor AdamW holds after
the step) and adam_moment_bytes (exp_avg + exp_avg_sq: 8 bytes per trainable fp32 parameter);
weight_bytes (base + adapters); train_step_s and train_step_cpu_s (process CPU time: with
--threads 1, the work alone); the first update's loss and gradient norm. LoRA's step still runs
the base's forward and the activation gradients; it skips the base's weight gradients and their
AdamW update.

  python bench/lora.py --threads 1                        # ranks 0,1,8; stand-in 512 x 4
  python bench/lora.py --ranks 0,1,8,32 --stand-in-hidden 1024
  python bench/lora.py --quick                            # seconds: the accounting (the test's)
"""

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

import common  # noqa: E402
import grpo  # noqa: E402
import lora  # noqa: E402
import rollout  # noqa: E402,F401  (sets vLLM's environment before anything imports vllm)
import sft  # noqa: E402

# grpo.py flags of the measured step: the demo's (8 prompts x 8 samples, <= 192 tokens)
CONFIG = ["--engine", "hf", "--grader-workers", "0", "--eval-every", "0"]
# --quick: 2 prompts x 8 samples, <= 32 new tokens, micro batch 8
QUICK = [
    *CONFIG,
    "--rollout-batch-size",
    "16",
    "--train-batch-size",
    "16",
    "--max-tokens",
    "32",
]


def parse(argv=None):
    p = common.Parser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--ranks",
        default="0,1,8",
        help="comma list of LoRA ranks to measure (0 = full fine-tuning)",
    )
    p.add_argument(
        "--stand-in-hidden",
        type=common.positive_int,
        default=512,
        help="the stand-in's hidden size (a multiple of 64; MLP 3x)",
    )
    p.add_argument(
        "--stand-in-layers",
        type=common.positive_int,
        default=4,
        help="the stand-in's transformer layers",
    )
    p.add_argument(
        "--rounds",
        type=common.positive_int,
        default=2,
        help="train steps per cell from the same weights (best time reported)",
    )
    p.add_argument(
        "--threads",
        type=common.positive_int,
        default=None,
        help="torch threads (default torch's); 1 on a busy shared box",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke size: 2 prompts x 8, <= 32 tokens, stand-in 128 x 1, 1 round",
    )
    a = p.parse_args(argv)
    a.ranks = [int(r) for r in a.ranks.split(",")]
    common.check(min(a.ranks) >= 0, f"--ranks {a.ranks}: ranks are >= 0 (0 = full fine-tuning)")
    common.check(
        a.stand_in_hidden % 64 == 0,
        f"--stand-in-hidden {a.stand_in_hidden}: use a multiple of 64 (head_dim 64)",
    )
    if a.quick:
        a.stand_in_hidden = 128
        a.stand_in_layers = 1
        a.rounds = 1
    return a


def grpo_args(a, rank):
    """grpo.py's resolved args for this bench's size at LoRA rank `rank`."""
    flags = CONFIG
    if a.quick:
        flags = QUICK
    extra = []
    if a.threads:
        extra = ["--threads", str(a.threads)]
    return grpo.parse_args([*flags, *extra, "--lora-rank", str(rank)])


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


def measure_cell(args, runtime, batch, rounds):
    """One model at one rank: build_learner's learner, then `rounds` train_steps on the frozen
    batch, each from the initial trainable weights with a fresh optimizer state."""
    torch.manual_seed(args.seed)
    learner = grpo.build_learner(args, runtime)
    policy = learner["policy"]
    optimizer = learner["optimizer"]
    start = [p.detach().clone() for p in lora.trainable(policy)]
    times = []
    cpu_times = []
    history = None
    for _ in range(rounds):
        with torch.no_grad():
            for p, p0 in zip(lora.trainable(policy), start):
                p.copy_(p0)
        optimizer.state.clear()
        t = time.perf_counter()
        c = time.process_time()
        history, _ = grpo.train_step(learner, batch, args, runtime, 1)
        times.append(time.perf_counter() - t)
        cpu_times.append(time.process_time() - c)
    state = []
    moments = []
    for s in optimizer.state.values():
        state.extend(s.values())
        moments.extend([s["exp_avg"], s["exp_avg_sq"]])
    held = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    return {
        "trainable": sum(p.numel() for p in lora.trainable(policy)),
        "optimizer_params": held,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "weight_bytes": tensor_bytes(policy.parameters()),
        "optimizer_state_bytes": tensor_bytes(state),
        "adam_moment_bytes": tensor_bytes(moments),
        "lora_layers": len(lora.lora_layers(policy)),
        "train_step_s": round(min(times), 4),
        "train_step_cpu_s": round(min(cpu_times), 4),
        "samples_s": [round(x, 3) for x in times],
        "first_update": {
            "loss": history[0]["train/loss"],
            "grad_norm": history[0]["train/grad_norm"],
        },
    }


def run(a, emit=print):
    """Every cell (emit(json line) as each is done) and the config; returns (rows, config)."""
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    base = grpo_args(a, 0)
    runtime = grpo.setup_runtime(base)
    train_rows, _ = grpo.load_data(base)
    torch.manual_seed(base.seed)
    policy, _ = grpo.load_policy(base.model, base, runtime)
    engine = grpo.make_engine(base.model, base, runtime, policy)
    batch, stats = grpo.collect(engine, train_rows, base, 0)
    grpo.summarize(batch, [stats], base)
    del engine, policy
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        stand_in = sft.build_tiny_model(
            os.path.join(tmp, "stand_in"),
            hidden_size=a.stand_in_hidden,
            num_layers=a.stand_in_layers,
        )
        models = {"embedded": base.model, "stand_in": stand_in}
        for name, path in models.items():
            for rank in a.ranks:
                args = grpo_args(a, rank)
                # the same resolved settings with this model as the base (not a new profile)
                args = argparse.Namespace(**{**vars(args), "model": path})
                row = {"model": name, "lora_rank": rank}
                row |= measure_cell(args, runtime, batch, a.rounds)
                rows.append(row)
                emit(json.dumps(row))
    config = {
        "ranks": a.ranks,
        "lora_alpha": base.lora_alpha,
        "lora_targets": base.lora_targets,
        "stand_in": {"hidden": a.stand_in_hidden, "layers": a.stand_in_layers},
        "responses": len(batch["raw"]),
        "response_tokens": sum(len(x) for x in batch["response_ids"]),
        "max_tokens": base.max_tokens,
        "micro_batch": base.micro_train_batch_size,
        "rounds": a.rounds,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2)},
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    return rows, config


def main():
    a = parse()
    stdout = sys.stdout
    # grpo.py's progress lines go to stderr; stdout is the JSON lines alone
    with contextlib.redirect_stdout(sys.stderr):
        _, config = run(a, emit=functools.partial(print, file=stdout, flush=True))
    print(json.dumps({"config": config}))


if __name__ == "__main__":
    main()
