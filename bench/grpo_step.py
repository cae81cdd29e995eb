"""Benchmark one GRPO step of grpo.py on the embedded model, variants side by side in ONE process on ONE frozen
rollout batch: --shared-prefix off vs on (the ratio; targets: training <= 0.5x, whole step <= 0.6x; the first
update's loss and grad norm must agree), --old-log-probs trainer vs engine (the no-grad pass it saves), and the
training phase's achieved FLOP/s next to a plain fp32 matmul's measured in the same run. Then (optionally) the
no-flag demo's learning curve. Prints one JSON object.

  python bench/grpo_step.py                  # step variants (~2-3 min on 2 idle cores), then the demo (~4 min)
  python bench/grpo_step.py --skip-demo      # step variants only
  python bench/grpo_step.py --threads 1      # on a busy shared box: 2 OpenMP threads stall behind other jobs

Method: grpo.collect samples one batch (16 prompts x 8 samples, <= 64 new tokens, on-policy, micro batch 32), then
each round runs every variant's grpo.train_step from the same initial weights and a fresh AdamW (alternating the
order between rounds: the box is shared, load drifts), re-times the rollout (collect) and the weight push, and a
matmul. Each number is its best over the rounds (other jobs only ever add time; every sample is in the JSON). A
variant's whole step = its train_step + the best rollout, grading and weight-sync times (the flags do not touch
those). Times come as wall and as process CPU time (*_cpu): with --threads 1 the CPU time is the work alone, what a
busy box cannot inflate, so the *_cpu ratios and FLOP/CPU-s are the steadier numbers there. The shared-prefix pair
logs KL every step (reference and previous-policy no-grad passes, as the README's numbers); the old-log-probs pair
uses grpo_clip without KL logging, so pi_old's is the only no-grad pass. Training FLOPs are model FLOPs of the forwards that ran with grad (counted by a hook on the
transformer, so padding and shared prompts count as run): 6 x (linear + lm_head weights) x tokens, plus causal
attention 12 x layers x d_attn x (sum of context lengths); the chunked lm_head's recompute is not counted.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

import common  # noqa: E402
import data  # noqa: E402
import grpo  # noqa: E402
import rollout as engines  # noqa: E402  (sets vLLM's environment before anything imports vllm)

CONFIG = [
    "--rollout-batch-size",
    "128",
    "--group-size",
    "8",
    "--train-batch-size",
    "128",
    "--gradient-accumulation-steps",
    "4",
    "--max-tokens",
    "64",
    "--eval-every",
    "0",
    "--eval-n",
    "16",
]
QUICK = [
    "--rollout-batch-size",
    "16",
    "--group-size",
    "8",
    "--train-batch-size",
    "16",
    "--gradient-accumulation-steps",
    "2",
    "--max-tokens",
    "32",
    "--eval-every",
    "0",
    "--eval-n",
    "4",
    "--grader-workers",
    "0",
]
VARIANTS = {  # name -> grpo.py flags on top of CONFIG
    "shared_prefix_off": ["--kl-every", "1", "--no-shared-prefix"],
    "shared_prefix_on": ["--kl-every", "1", "--shared-prefix"],
    "old_log_probs_trainer": ["--loss", "grpo_clip", "--old-log-probs", "trainer"],
    "old_log_probs_engine": ["--loss", "grpo_clip", "--old-log-probs", "engine"],
}
TIMES = (
    "train_step",
    "train_step_cpu",
    "old_log_probs",
    "training",
    "training_cpu",
)  # per variant and round, seconds


def parse():
    p = common.Parser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", default="vllm", choices=engines.ENGINES, help="rollout engine")
    p.add_argument(
        "--rounds",
        type=common.positive_int,
        default=3,
        help="repetitions of every variant (best reported)",
    )
    p.add_argument(
        "--threads",
        type=common.positive_int,
        default=None,
        help="torch threads (default torch's; also the demo's OMP_NUM_THREADS)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke size: 2 prompts x 8, <= 32 tokens, 1 round, no demo",
    )
    p.add_argument(
        "--skip-demo", action="store_true", help="only the step variants, not the demo's curve"
    )
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args()
    if a.quick:
        a.rounds, a.skip_demo = 1, True
    return a


def matmul_flops(n=1024, k=1024, m=1024, seconds=0.5):
    """Best fp32 FLOP/s of an (n, k) @ (k, m) matmul over ~`seconds`, in 5 timed slices: (per wall s, per CPU s)."""
    x, y, best = torch.randn(n, k), torch.randn(k, m), (0.0, 0.0)
    for _ in range(5):
        t, c, reps = time.perf_counter(), time.process_time(), 0
        while time.perf_counter() - t < seconds / 5:
            x @ y
            reps += 1
        flops = 2 * n * k * m * reps
        best = (
            max(best[0], flops / (time.perf_counter() - t)),
            max(best[1], flops / max(time.process_time() - c, 1e-9)),
        )
    return best


def count_training_flops(policy):
    """A forward pre-hook on the transformer that adds each grad-enabled forward's model FLOPs (fwd + bwd) to
    the returned dict's "flops" and its tokens (B x T, padding included where it runs) to "tokens"."""
    cfg, counter = policy.config, {"flops": 0.0, "tokens": 0}
    weights = sum(
        m.weight.numel() for m in policy.base_model.modules() if isinstance(m, torch.nn.Linear)
    )
    weights += (
        policy.get_output_embeddings().weight.numel()
    )  # the lm_head (tied: the embedding matrix)
    d_attn = cfg.num_attention_heads * getattr(
        cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads
    )

    def hook(module, args, kwargs):
        if not torch.is_grad_enabled():
            return
        B, T = kwargs["input_ids"].shape
        cache = kwargs.get("past_key_values")
        past = cache.get_seq_length() if cache is not None else 0
        context = (
            T * past + T * (T + 1) // 2
        )  # sum over this call's queries of the keys they attend to (causal)
        mask = kwargs.get("attention_mask")
        if (
            mask is not None and mask.dim() == 4
        ):  # the shared prefix's block mask: the (query, key) pairs it allows
            context = int((mask if mask.dtype == torch.bool else mask == 0).sum())
        counter["flops"] += 3 * (
            2 * weights * B * T + 4 * cfg.num_hidden_layers * d_attn * B * context
        )
        counter["tokens"] += B * T

    policy.base_model.register_forward_pre_hook(hook, with_kwargs=True)
    return counter


def setup(a):
    """Everything grpo.main sets up, once: args of each variant, data, policy, KL models, engine, frozen batch."""
    base = CONFIG if not a.quick else QUICK
    vargs = {
        name: grpo.parse_args([*base, "--engine", a.engine, *flags])
        for name, flags in VARIANTS.items()
    }
    args = vargs["shared_prefix_on"]
    for v in vargs.values():
        grpo.setup_devices(v)
    train_rows, _ = grpo.load_data(args)
    torch.manual_seed(args.seed)
    policy, _ = grpo.load_policy(args.model, args)
    for v in vargs.values():  # load_policy's probe turns the option off where it is not exact
        v.shared_prefix = v.shared_prefix and args.shared_prefix
    kl = [
        grpo.load_policy(args.model, args, dtype=args.compute_dtype)[0].eval().requires_grad_(False)
        for _ in range(2)
    ]
    engine = grpo.make_engine(args.model, args, policy)
    batch, cm = grpo.collect(engine, train_rows, args, 0)
    return vargs, train_rows, policy, kl, engine, batch, cm


def cpu_timed(fn, sink):
    """fn, with the process CPU time of each call appended to sink: on a shared box CPU time is what the work
    cost, wall time is that plus waiting for a core (with 1 thread; 2 threads also count their spin-waits)."""

    def wrapped(*a, **kw):
        c = time.process_time()
        try:
            return fn(*a, **kw)
        finally:
            sink.append(time.process_time() - c)

    return wrapped


def run_variant(policy, kl, theta0, batch, args, counter):
    """One train_step from theta_0 with a fresh AdamW, as grpo.py's step 1 (so the previous-policy KL pass runs)."""
    policy.load_state_dict(theta0)
    ref_model, prev_model = kl if args.kl_every else (None, None)
    if prev_model is not None:
        prev_model.load_state_dict(theta0)
        prev_model.holds_step = 0
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    counter.update(flops=0.0, tokens=0)
    counter["training_cpu"].clear()
    t, c = time.perf_counter(), time.process_time()
    history, m = grpo.train_step(policy, opt, batch, args, 1, ref_model, prev_model)
    return {
        "train_step": time.perf_counter() - t,
        "train_step_cpu": time.process_time() - c,
        "old_log_probs": m["time/old_log_probs"],
        "training": m["time/training"],
        "training_cpu": sum(counter["training_cpu"]),
        "train_flops": counter["flops"],
        "train_tokens_run": counter["tokens"],
        "loss": history[0]["train/loss"],
        "grad_norm": history[0]["train/grad_norm"],
    }


def measure(a):
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    vargs, train_rows, policy, kl, engine, batch, cm = setup(a)
    theta0 = {k: v.clone() for k, v in policy.state_dict().items()}
    counter, names = count_training_flops(policy), list(VARIANTS)
    counter["training_cpu"] = []
    grpo._updates = cpu_timed(
        grpo._updates, counter["training_cpu"]
    )  # train_step's training phase (its callee)
    runs, shared = (
        {n: [] for n in names},
        {
            k: []
            for k in (
                "generation",
                "grading",
                "weight_sync",
                "matmul",
                "matmul_cpu",
                "matmul_model",
            )
        },
    )
    for r in range(a.rounds):
        if r:  # round 0 times the frozen batch's own collect; later ones repeat it (same step: same prompts, seeds)
            _, cm = grpo.collect(engine, train_rows, vargs["shared_prefix_on"], 0)
        shared["generation"].append(cm["time/generation"])
        shared["grading"].append(cm["time/grading"])
        for name in names if r % 2 == 0 else names[::-1]:
            runs[name].append(run_variant(policy, kl, theta0, batch, vargs[name], counter))
        policy.load_state_dict(theta0)
        shared["weight_sync"].append(
            grpo.engines.load_policy_into_vllm(policy, engine)
        )  # the engine keeps theta_0
        (wall, cpu), (model, _) = (
            matmul_flops(),
            matmul_flops(2048, 256, 768),
        )  # square; tokens x hidden @ hidden x MLP
        shared["matmul"].append(wall)
        shared["matmul_cpu"].append(cpu)
        shared["matmul_model"].append(model)
    best = {
        k: (max if k.startswith("matmul") else min)(v) for k, v in shared.items()
    }  # FLOP/s: max; seconds: min
    out = {
        "config": {
            "engine": a.engine,
            "rounds": a.rounds,
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "responses": len(batch["raw"]),
            "group_size": vargs["shared_prefix_on"].group_size,
            "max_tokens": vargs["shared_prefix_on"].max_tokens,
            "micro_batch": vargs["shared_prefix_on"].micro_train_batch_size,
            "response_tokens": sum(len(x) for x in batch["response_ids"]),
            "prompt_tokens": sum(len(x) for x in batch["prompt_ids"]),
        },
        "shared_s": {k: round(v, 4) for k, v in best.items() if not k.startswith("matmul")},
        "variants": {},
    }
    for name in names:
        rs, v = runs[name], {"flags": " ".join(VARIANTS[name])}
        v |= {k: round(min(x[k] for x in rs), 4) for k in TIMES}
        v["step"] = round(
            v["train_step"] + best["generation"] + best["grading"] + best["weight_sync"], 4
        )
        v["train_tokens_run"], v["train_gflops"] = (
            rs[0]["train_tokens_run"],
            round(rs[0]["train_flops"] / 1e9, 2),
        )
        v["train_gflop_per_s"] = round(rs[0]["train_flops"] / 1e9 / v["training"], 2)
        v["train_gflop_per_cpu_s"] = round(rs[0]["train_flops"] / 1e9 / v["training_cpu"], 2)
        v["first_update"] = {"loss": rs[0]["loss"], "grad_norm": rs[0]["grad_norm"]}
        v["samples_s"] = {k: [round(x[k], 3) for x in rs] for k in TIMES}
        out["variants"][name] = v
    out |= summarize(out["variants"], best)
    out["load_avg_1m"] = {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2)}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def summarize(v, best):
    """The side-by-side ratios and checks."""
    off, on, tr, en = (v[k] for k in VARIANTS)
    rel = lambda x, y: abs(x - y) / max(abs(x), abs(y), 1e-12)  # noqa: E731
    sp = {
        "training_ratio": round(on["training"] / off["training"], 3),
        "step_ratio": round(on["step"] / off["step"], 3),
        "training_cpu_ratio": round(on["training_cpu"] / off["training_cpu"], 3),
        "train_step_cpu_ratio": round(on["train_step_cpu"] / off["train_step_cpu"], 3),
        "old_log_probs_ratio": round(on["old_log_probs"] / off["old_log_probs"], 3),
        "train_tokens_ratio": round(on["train_tokens_run"] / off["train_tokens_run"], 3),
        "first_update_loss_rel_diff": rel(on["first_update"]["loss"], off["first_update"]["loss"]),
        "first_update_grad_norm_rel_diff": rel(
            on["first_update"]["grad_norm"], off["first_update"]["grad_norm"]
        ),
    }
    sp["first_update_equal"] = (
        sp["first_update_loss_rel_diff"] < 1e-5 and sp["first_update_grad_norm_rel_diff"] < 1e-5
    )
    sp["targets_met"] = {
        "training_le_0.5": sp["training_ratio"] <= 0.5,
        "step_le_0.6": sp["step_ratio"] <= 0.6,
    }
    old = {
        "trainer_old_log_probs_s": tr["old_log_probs"],
        "engine_old_log_probs_s": en["old_log_probs"],
        "saved_s": round(tr["old_log_probs"] - en["old_log_probs"], 4),
        "step_ratio": round(en["step"] / tr["step"], 3),
        "train_step_cpu_ratio": round(en["train_step_cpu"] / tr["train_step_cpu"], 3),
    }
    mm = {
        "matmul_1024_gflop_per_s": round(best["matmul"] / 1e9, 1),
        "matmul_1024_gflop_per_cpu_s": round(best["matmul_cpu"] / 1e9, 1),
        "matmul_model_shaped_gflop_per_s": round(best["matmul_model"] / 1e9, 1),
    }
    for k in (
        "shared_prefix_off",
        "shared_prefix_on",
    ):  # the training phase's share of the matmul's rate
        mm[f"training_{k}_vs_matmul"] = round(v[k]["train_gflop_per_s"] * 1e9 / best["matmul"], 3)
        mm[f"training_{k}_vs_matmul_cpu"] = round(
            v[k]["train_gflop_per_cpu_s"] * 1e9 / best["matmul_cpu"], 3
        )
    secs = {
        "generation": best["generation"],
        "grading": best["grading"],
        "old_log_probs": on["old_log_probs"],
        "training": on["training"],
        "weight_sync": best["weight_sync"],
        "step": on["step"],
    }
    return {
        "shared_prefix": sp,
        "old_log_probs": old,
        "flops": mm,
        "seconds_per_step": {k: round(x, 3) for k, x in secs.items()},
    }


def demo_curve(a, tmp):
    """The no-flag demo (grpo.py as a subprocess): greedy accuracy vs wall-clock time."""
    env = os.environ | ({"OMP_NUM_THREADS": str(a.threads)} if a.threads else {})
    out, t0 = os.path.join(tmp, "demo"), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "grpo.py"), "--engine", a.engine, "--out", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode:
        sys.exit(f"error: grpo.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        evals = [r for r in map(json.loads, f) if "eval/accuracy" in r]
    return {
        "demo_wall_s": round(time.perf_counter() - t0, 1),
        "demo_curve": [
            {
                "step": r["step"],
                "wall_s": round(r["time/wall"], 1),
                "accuracy": round(r["eval/accuracy"], 4),
            }
            for r in evals
        ],
        "demo_accuracy_gain": round(evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"], 4),
    }


def main():
    a = parse()
    if a.threads:
        torch.set_num_threads(a.threads)
    with contextlib.redirect_stdout(
        sys.stderr
    ):  # grpo.py's progress lines; stdout is the JSON alone
        result = measure(a)
        if not a.skip_demo:
            with tempfile.TemporaryDirectory() as tmp:
                result |= demo_curve(a, tmp)
    print(json.dumps(result, indent=1))
    if a.out:
        data.write_json_atomic(a.out, result)


if __name__ == "__main__":
    main()
