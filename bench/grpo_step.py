"""Benchmark one GRPO step of grpo.py on the embedded model, its variants side by side in ONE
process on ONE frozen rollout batch. Prints one JSON object.

- --shared-prefix off vs on: the ratio (targets: training <= 0.5x, the whole step <= 0.6x), and the
  first update's loss and gradient norm must agree;
- --old-log-probs trainer vs engine: the no-grad pass it saves;
- the training phase's achieved FLOP/s next to a plain fp32 matmul's, measured in the same run;
- then (optionally) the no-flag demo's learning curve.

  python bench/grpo_step.py              # the variants (~2-3 min on 2 idle cores), demo (~4 min)
  python bench/grpo_step.py --skip-demo  # the step variants only
  python bench/grpo_step.py --threads 1  # a busy shared box: 2 OpenMP threads stall behind others

Method: grpo.collect samples one batch (16 prompts x 8 samples, <= 64 new tokens, on-policy, micro
batch 32). Then each round runs every variant's grpo.train_step from the same initial weights and a
fresh AdamW (alternating the order between rounds: the box is shared, load drifts), re-times the
rollout (collect) and the weight push, and a matmul. Each number is its best over the rounds (other
jobs only ever add time; every sample is in the JSON). A variant's whole step = its train_step + the
best rollout, grading and weight-sync times (the flags do not touch those).

Times come as wall and as process CPU time (*_cpu): with --threads 1 the CPU time is the work
alone, which a busy box cannot inflate, so the *_cpu ratios and FLOP/CPU-s are the steadier numbers
there. The shared-prefix pair logs KL every step (the reference and previous-policy no-grad passes,
as docs/shared_prefix.md's numbers); the old-log-probs pair uses grpo_clip without KL logging, so
pi_old's is the only no-grad pass.

Training FLOPs are the model FLOPs of the forwards that ran with grad (counted by a hook on the
transformer, so padding and shared prompts count as run): 6 x (linear + lm_head weights) x tokens,
plus causal attention 12 x layers x d_attn x (the sum of context lengths); the chunked lm_head's
recompute is not counted.
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

# grpo.py flags of the measured step: 16 prompts x 8 samples, <= 64 new tokens, micro batch 32
CONFIG = [
    "--rollout-batch-size 128",
    "--group-size 8",
    "--train-batch-size 128",
    "--gradient-accumulation-steps 4",
    "--max-tokens 64",
    "--eval-every 0",
    "--eval-n 16",
]
# --quick: 2 prompts x 8 samples, <= 32 new tokens, grading in this process
QUICK = [
    "--rollout-batch-size 16",
    "--group-size 8",
    "--train-batch-size 16",
    "--gradient-accumulation-steps 2",
    "--max-tokens 32",
    "--eval-every 0",
    "--eval-n 4",
    "--grader-workers 0",
]
VARIANTS = {  # name -> grpo.py flags on top of CONFIG
    "shared_prefix_off": ["--kl-every", "1", "--no-shared-prefix"],
    "shared_prefix_on": ["--kl-every", "1", "--shared-prefix"],
    "old_log_probs_trainer": ["--loss", "grpo_clip", "--old-log-probs", "trainer"],
    "old_log_probs_engine": ["--loss", "grpo_clip", "--old-log-probs", "engine"],
}
# per variant and round, in seconds
TIMES = ["train_step", "train_step_cpu", "old_log_probs", "training", "training_cpu"]
# per round, shared by the variants: seconds, and FLOP/s of the matmuls
SHARED = ["generation", "grading", "weight_sync", "matmul", "matmul_cpu", "matmul_model"]


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
        a.rounds = 1
        a.skip_demo = True
    return a


def matmul_flops(n=1024, k=1024, m=1024, seconds=0.5):
    """The best fp32 FLOP/s of an (n, k) @ (k, m) matmul over ~`seconds`, in 5 timed slices.
    Returns (per wall second, per CPU second)."""
    x = torch.randn(n, k)
    y = torch.randn(k, m)
    best_wall = 0.0
    best_cpu = 0.0
    for _ in range(5):
        t = time.perf_counter()
        c = time.process_time()
        reps = 0
        while time.perf_counter() - t < seconds / 5:
            x @ y
            reps += 1
        flops = 2 * n * k * m * reps
        best_wall = max(best_wall, flops / (time.perf_counter() - t))
        best_cpu = max(best_cpu, flops / max(time.process_time() - c, 1e-9))
    return best_wall, best_cpu


def count_training_flops(policy):
    """A forward pre-hook on the transformer that adds each grad-enabled forward's model FLOPs
    (forward + backward) to the returned dict's "flops", and its tokens (B x T, padding included
    where it runs) to "tokens"."""
    cfg = policy.config
    counter = {"flops": 0.0, "tokens": 0}
    linears = [m for m in policy.base_model.modules() if isinstance(m, torch.nn.Linear)]
    weights = sum(m.weight.numel() for m in linears)
    weights += policy.get_output_embeddings().weight.numel()  # the lm_head (tied: the embedding)
    head_dim = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    d_attn = cfg.num_attention_heads * head_dim

    def hook(module, args, kwargs):
        if not torch.is_grad_enabled():
            return
        B, T = kwargs["input_ids"].shape
        cache = kwargs.get("past_key_values")
        past = 0
        if cache is not None:
            past = cache.get_seq_length()
        # the sum over this call's queries of the keys they attend to (causal)
        context = T * past + T * (T + 1) // 2
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 4:
            # the shared prefix's block mask: the (query, key) pairs it allows
            if mask.dtype == torch.bool:
                allowed = mask
            else:
                allowed = mask == 0  # an additive mask: 0 where allowed
            context = int(allowed.sum())
        forward_flops = 2 * weights * B * T + 4 * cfg.num_hidden_layers * d_attn * B * context
        counter["flops"] += 3 * forward_flops  # the backward costs twice the forward
        counter["tokens"] += B * T

    policy.base_model.register_forward_pre_hook(hook, with_kwargs=True)
    return counter


def setup(a):
    """Everything grpo.main sets up, once: the args and runtime record of each variant, the data,
    the policy, the KL models, the engine and the frozen batch (summarised by grpo.summarize;
    train_step computes its advantages) with its rollout stats."""
    if a.quick:
        base = " ".join(QUICK).split()
    else:
        base = " ".join(CONFIG).split()
    vargs = {}
    runtimes = {}
    for name, flags in VARIANTS.items():
        vargs[name] = grpo.parse_args([*base, "--engine", a.engine, *flags])
        runtimes[name] = grpo.setup_runtime(vargs[name])
    args = vargs["shared_prefix_on"]
    runtime = runtimes["shared_prefix_on"]
    train_rows, _ = grpo.load_data(args)
    torch.manual_seed(args.seed)
    policy, _ = grpo.load_policy(args.model, args, runtime)
    for r in runtimes.values():  # load_policy's probe turns the option off where it is not exact
        r["shared_prefix"] = r["shared_prefix"] and runtime["shared_prefix"]
    kl = []  # the reference model and the previous policy, frozen
    for _ in range(2):
        # the policy's weight dtype, as build_learner
        model, _ = grpo.load_policy(args.model, args, runtime)
        kl.append(model.eval().requires_grad_(False))
    engine = grpo.make_engine(args.model, args, runtime, policy)
    batch, stats = grpo.collect(engine, train_rows, args, 0)
    grpo.summarize(batch, [stats], args)
    return vargs, runtimes, train_rows, policy, kl, engine, batch, stats


def cpu_timed(fn, sink):
    """fn, with the process CPU time of each call appended to sink. On a shared box the CPU time is
    what the work cost; the wall time is that plus waiting for a core (with 1 thread; 2 threads
    also count their spin-waits)."""

    def wrapped(*a, **kw):
        c = time.process_time()
        try:
            return fn(*a, **kw)
        finally:
            sink.append(time.process_time() - c)

    return wrapped


def run_variant(policy, kl, theta0, batch, args, runtime, counter):
    """One train_step from theta_0 with a fresh AdamW, as grpo.py's step 1 (so the previous-policy
    KL pass runs)."""
    policy.load_state_dict(theta0)
    ref_model = None
    prev_model = None
    if args.kl_every:
        ref_model, prev_model = kl
    if prev_model is not None:
        prev_model.load_state_dict(theta0)
        prev_model.holds_step = 0
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    learner = {  # as grpo.build_learner's
        "policy": policy,
        "tokenizer": None,  # train_step does not tokenize
        "optimizer": opt,
        "ref_model": ref_model,
        "prev_model": prev_model,
    }
    counter.update(flops=0.0, tokens=0)
    counter["training_cpu"].clear()
    t = time.perf_counter()
    c = time.process_time()
    history, m = grpo.train_step(learner, batch, args, runtime, 1)
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
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    vargs, runtimes, train_rows, policy, kl, engine, batch, stats = setup(a)
    theta0 = {k: v.clone() for k, v in policy.state_dict().items()}
    counter = count_training_flops(policy)
    counter["training_cpu"] = []
    names = list(VARIANTS)
    # train_step's training phase (its callee), timed in CPU seconds
    grpo._updates = cpu_timed(grpo._updates, counter["training_cpu"])
    runs = {name: [] for name in names}  # name -> its rounds' run_variant results
    shared = {key: [] for key in SHARED}  # key -> its rounds' samples
    for r in range(a.rounds):
        if r:
            # round 0 times the frozen batch's own collect; later ones repeat it (the same step:
            # the same prompts and seeds)
            _, stats = grpo.collect(engine, train_rows, vargs["shared_prefix_on"], 0)
        shared["generation"].append(stats["generation_s"])
        shared["grading"].append(stats["grading_s"])
        order = names
        if r % 2 == 1:
            order = names[::-1]
        for name in order:
            result = run_variant(policy, kl, theta0, batch, vargs[name], runtimes[name], counter)
            runs[name].append(result)
        policy.load_state_dict(theta0)
        sync_s = grpo.engines.load_policy_into_vllm(policy, engine)  # the engine keeps theta_0
        shared["weight_sync"].append(sync_s)
        wall, cpu = matmul_flops()  # square
        model_shaped, _ = matmul_flops(2048, 256, 768)  # tokens x hidden @ hidden x MLP
        shared["matmul"].append(wall)
        shared["matmul_cpu"].append(cpu)
        shared["matmul_model"].append(model_shaped)
    best = {}  # FLOP/s: the max; seconds: the min
    for key, samples in shared.items():
        if key.startswith("matmul"):
            best[key] = max(samples)
        else:
            best[key] = min(samples)
    args = vargs["shared_prefix_on"]
    out = {
        "config": {
            "engine": a.engine,
            "rounds": a.rounds,
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "responses": len(batch["raw"]),
            "group_size": args.group_size,
            "max_tokens": args.max_tokens,
            "micro_batch": args.micro_train_batch_size,
            "response_tokens": sum(len(x) for x in batch["response_ids"]),
            "prompt_tokens": sum(len(x) for x in batch["prompt_ids"]),
        },
        "shared_s": {k: round(v, 4) for k, v in best.items() if not k.startswith("matmul")},
        "variants": {},
    }
    for name in names:
        out["variants"][name] = summarize_variant(name, runs[name], best)
    out |= summarize(out["variants"], best)
    out["load_avg_1m"] = {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2)}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def summarize_variant(name, rs, best):
    """One variant's numbers from its rounds rs: the best of each time, its whole step, its FLOPs
    (the same every round) and rate, its first update, every sample."""
    v = {"flags": " ".join(VARIANTS[name])}
    for k in TIMES:
        v[k] = round(min(x[k] for x in rs), 4)
    v["step"] = round(
        v["train_step"] + best["generation"] + best["grading"] + best["weight_sync"], 4
    )
    v["train_tokens_run"] = rs[0]["train_tokens_run"]
    v["train_gflops"] = round(rs[0]["train_flops"] / 1e9, 2)
    v["train_gflop_per_s"] = round(rs[0]["train_flops"] / 1e9 / v["training"], 2)
    v["train_gflop_per_cpu_s"] = round(rs[0]["train_flops"] / 1e9 / v["training_cpu"], 2)
    v["first_update"] = {"loss": rs[0]["loss"], "grad_norm": rs[0]["grad_norm"]}
    v["samples_s"] = {k: [round(x[k], 3) for x in rs] for k in TIMES}
    return v


def relative_difference(x, y):
    return abs(x - y) / max(abs(x), abs(y), 1e-12)


def summarize(v, best):
    """The side-by-side ratios and checks."""
    off = v["shared_prefix_off"]
    on = v["shared_prefix_on"]
    tr = v["old_log_probs_trainer"]
    en = v["old_log_probs_engine"]
    sp = {
        "training_ratio": round(on["training"] / off["training"], 3),
        "step_ratio": round(on["step"] / off["step"], 3),
        "training_cpu_ratio": round(on["training_cpu"] / off["training_cpu"], 3),
        "train_step_cpu_ratio": round(on["train_step_cpu"] / off["train_step_cpu"], 3),
        "old_log_probs_ratio": round(on["old_log_probs"] / off["old_log_probs"], 3),
        "train_tokens_ratio": round(on["train_tokens_run"] / off["train_tokens_run"], 3),
        "first_update_loss_rel_diff": relative_difference(
            on["first_update"]["loss"], off["first_update"]["loss"]
        ),
        "first_update_grad_norm_rel_diff": relative_difference(
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
    # the training phase's share of the matmul's rate
    for k in ["shared_prefix_off", "shared_prefix_on"]:
        wall_share = v[k]["train_gflop_per_s"] * 1e9 / best["matmul"]
        cpu_share = v[k]["train_gflop_per_cpu_s"] * 1e9 / best["matmul_cpu"]
        mm[f"training_{k}_vs_matmul"] = round(wall_share, 3)
        mm[f"training_{k}_vs_matmul_cpu"] = round(cpu_share, 3)
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
    env = dict(os.environ)
    if a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    out = os.path.join(tmp, "demo")
    t0 = time.perf_counter()
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
    curve = []
    for r in evals:
        point = {
            "step": r["step"],
            "wall_s": round(r["time/wall"], 1),
            "accuracy": round(r["eval/accuracy"], 4),
        }
        curve.append(point)
    return {
        "demo_wall_s": round(time.perf_counter() - t0, 1),
        "demo_curve": curve,
        "demo_accuracy_gain": round(evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"], 4),
    }


def main():
    a = parse()
    if a.threads:
        torch.set_num_threads(a.threads)
    # grpo.py's progress lines go to stderr; stdout is the JSON alone
    with contextlib.redirect_stdout(sys.stderr):
        result = measure(a)
        if not a.skip_demo:
            with tempfile.TemporaryDirectory() as tmp:
                result |= demo_curve(a, tmp)
    print(json.dumps(result, indent=1))
    if a.out:
        data.write_json_atomic(a.out, result)


if __name__ == "__main__":
    main()
