"""GRPO with verifiable rewards: the training loop of seed 000 §7 (Algorithm 2), one flat loop.

Each step: collect (G engine samples per question -> grades -> group-normalised advantages) -> train_step (pi_old by
a no-grad pass when a ratio needs it -> epochs x train batches x microbatches, clip, AdamW) -> log -> save -> weights
into the engine; grpo_ray.py runs both in Ray actors. No --model: the offline demo. Departures from the seeds
(PROFILES): trains on the engine's tokens, scored at its temperature and min_tokens ban; hub sizes: seed 001's
256/256/128 (seed 000's starter sizes fail its own asserts); bf16 compute keeps fp32 master weights (--pure-bf16: the
seeds' choice, which rounds most lr-1e-5 updates away); -A log pi on stale data is refused. Extras: README.

Examples:
  python grpo.py                                                       # offline CPU demo
  python grpo.py --model Qwen/Qwen2.5-Math-1.5B --lr 3e-5               # seed 000, 2 GPUs
  python grpo.py --model Qwen/Qwen2.5-Math-1.5B --loss grpo_clip --epochs-per-rollout-batch 2 \\
      --train-batch-size 128 --gradient-accumulation-steps 64           # off-policy
  python grpo.py --model Qwen/Qwen3-1.7B --dry-run                      # print the effective settings
"""

import math
import os
import random
import time
from statistics import fmean

import torch

import common
import data
import grader
import losses
import rollout as engines

# One settings table: an unset flag takes its profile's value, "demo" (the embedded model, offline on CPU) or "hub"
# (any other model), then its task's row; the README's settings table gives each entry's seed.
PROFILES = {
    "hub": dict(
        lr=1e-5,
        n_grpo_steps=200,
        rollout_batch_size=256,
        group_size=8,
        train_batch_size=256,
        gradient_accumulation_steps=128,
        temperature=0.7,
        min_tokens=4,
        max_tokens=1024,
        advantage_eps=1e-6,
        loss="reinforce_with_baseline",
        eval_every=10,
        eval_n=1024,
        save_every=50,
        train_n=0,
        kl_estimator="k3",
    ),
    "demo": dict(
        lr=1e-4,
        n_grpo_steps=30,
        rollout_batch_size=64,
        group_size=8,
        train_batch_size=64,
        gradient_accumulation_steps=2,
        temperature=1.0,
        min_tokens=4,
        max_tokens=192,
        advantage_eps=1e-6,
        loss="reinforce_with_baseline",
        eval_every=5,
        eval_n=200,
        save_every=0,
        train_n=2000,
        kl_estimator="k3",
    ),
}
TASK_PROFILES = {
    "gsm8k": dict(temperature=1.0),
    "math": dict(temperature=1.0),
    "math500": dict(temperature=1.0),  # seed 001 §5
    "keyword": dict(
        lr=5e-4,
        n_grpo_steps=100,
        group_size=4,
        temperature=0.8,
        max_tokens=60,
        advantage_eps=1e-8,
        loss="grpo_clip",
        kl_estimator="seq",
    ),  # seed 004 §3.1.2; Eq. 8 for KL monitoring
}
SEED_SPACE = 2**16  # --seed and step each index 16 bits of the sampling seed (see sample_seed)


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    p = common.Parser(
        description="GRPO on a verifiable-reward task (seed 000 §7). Unset flags come from PROFILES."
    )
    pos, nonneg, pfloat = common.positive_int, common.nonneg_int, common.positive_float
    g = p.add_argument_group("model and data")  # --- model and data ---
    g.add_argument(
        "--model",
        default=None,
        help="HF hub id or local dir; omitted = the embedded model (demo profile)",
    )
    g.add_argument(
        "--task", default="countdown", choices=sorted(data.TASKS), help="task (data.load_task)"
    )
    g.add_argument(
        "--prompt", default=None, help="prompts/<name>.prompt; default: data.task_defaults"
    )
    g.add_argument(
        "--reward",
        default=None,
        choices=sorted(grader.REWARD_FNS),
        help="reward fn; default: the task's",
    )
    g.add_argument(
        "--train-path",
        type=common.data_path,
        default=None,
        help="train JSONL, 'synthetic' (Countdown), or the hub set",
    )
    g.add_argument(
        "--val-path",
        type=common.data_path,
        default=None,
        help="validation file; default: the task's test split",
    )
    g.add_argument("--train-n", type=nonneg, default=None, help="train questions to load (0 = all)")
    g.add_argument(
        "--data-seed",
        type=nonneg,
        default=0,
        help="seed of the synthetic data set (kept apart from --seed)",
    )
    g = p.add_argument_group("optimisation")  # --- optimisation ---
    g.add_argument("--lr", type=pfloat, default=None, help="AdamW learning rate")
    g.add_argument("--n-grpo-steps", type=pos, default=None, help="rollout batches to train on")
    g.add_argument(
        "--rollout-batch-size",
        type=pos,
        default=None,
        help="responses per step = prompts x group size",
    )
    g.add_argument("--group-size", type=pos, default=None, help="G samples per question")
    g.add_argument(
        "--train-batch-size", type=pos, default=None, help="responses per optimizer step"
    )
    g.add_argument(
        "--gradient-accumulation-steps",
        type=pos,
        default=None,
        help="microbatches per optimizer step",
    )
    g.add_argument(
        "--epochs-per-rollout-batch",
        type=pos,
        default=1,
        help="passes over each rollout batch (>1 = off-policy)",
    )
    g.add_argument("--max-grad-norm", type=pfloat, default=1.0, help="gradient-norm clip")
    g.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute activations (memory for time)",
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=common.DTYPES,
        help="compute dtype (auto: bf16 on CUDA, fp32 on CPU)",
    )
    g.add_argument(
        "--pure-bf16",
        action="store_true",
        help="bf16 weights + AdamW state (half the memory; drops small updates)",
    )
    g = p.add_argument_group("loss")  # --- loss ---
    g.add_argument("--loss", default=None, choices=losses.LOSS_TYPES, help="policy-gradient loss")
    g.add_argument("--cliprange", type=pfloat, default=0.2, help="epsilon of GRPO-Clip / GSPO")
    g.add_argument(
        "--cliprange-high",
        type=pfloat,
        default=None,
        help="upper epsilon (DAPO clip-higher); default --cliprange",
    )
    g.add_argument(
        "--length-norm",
        default="masked_mean",
        choices=losses.LENGTH_NORMS,
        help="per-sequence reduction",
    )
    g.add_argument(
        "--normalize-constant",
        type=pfloat,
        default=None,
        help="masked_normalize divisor; default --max-tokens",
    )
    g.add_argument(
        "--std-norm",
        action=common.argparse.BooleanOptionalAction,
        default=True,
        help="divide advantages by group std",
    )
    g.add_argument("--advantage-eps", type=pfloat, default=None, help="added to the group std")
    g.add_argument(
        "--kl-beta",
        type=common.nonneg_float,
        default=0.0,
        help="KL(pi || initial policy) penalty weight",
    )
    g.add_argument(
        "--kl-estimator",
        default=None,
        choices=losses.KL_ESTIMATORS,
        help="KL estimator (seq = seed 004 Eq. 8)",
    )
    g = p.add_argument_group("off-policy correction and DAPO")  # --- correction ---
    g.add_argument(
        "--old-log-probs",
        default="trainer",
        choices=["trainer", "engine"],
        help="pi_old source (engine: skip a pass)",
    )
    g.add_argument(
        "--rollout-is",
        default="none",
        choices=losses.ROLLOUT_IS,
        help="correct engine/trainer mismatch",
    )
    g.add_argument(
        "--rollout-is-cap",
        type=pfloat,
        default=2.0,
        help="TIS truncation / MIS cap: rho > C gets weight 0",
    )
    g.add_argument(
        "--rollout-is-floor",
        type=common.nonneg_float,
        default=0.0,
        help="MIS only: also weight 0 where rho < this (0 = no lower bound, as MIS defines it)",
    )
    g.add_argument(
        "--rollout-is-level",
        default="token",
        choices=["token", "sequence"],
        help="ratio per token or sequence",
    )
    g.add_argument(
        "--dynamic-sampling",
        action="store_true",
        help="drop equal-reward groups, resample to fill (DAPO)",
    )
    g.add_argument(
        "--dynamic-sampling-max-rounds",
        type=nonneg,
        default=3,
        help="extra generation rounds at most",
    )
    g.add_argument(
        "--dynamic-sampling-on",
        default="answer_reward",
        choices=["answer_reward", "reward"],
        help="the score whose within-group variance keeps a group: accuracy (DAPO) or the total reward",
    )
    g.add_argument(
        "--mask-truncated", action="store_true", help="truncated responses leave the loss (DAPO)"
    )
    g.add_argument(
        "--overlong-buffer",
        type=nonneg,
        default=0,
        help="DAPO soft length penalty over the last N tokens",
    )
    g = p.add_argument_group("sampling")  # --- sampling ---
    g.add_argument(
        "--temperature",
        type=pfloat,
        default=None,
        help="rollout temperature; log-probs use the same",
    )
    g.add_argument(
        "--top-p", type=common.probability, default=1.0, help="nucleus sampling (keep 1.0 for RL)"
    )
    g.add_argument(
        "--min-tokens",
        type=nonneg,
        default=None,
        help="minimum response tokens (stop tokens banned before)",
    )
    g.add_argument("--max-tokens", type=pos, default=None, help="maximum response tokens")
    g = p.add_argument_group("eval and logging")  # --- eval and logging ---
    g.add_argument(
        "--eval-every",
        type=nonneg,
        default=None,
        help="greedy validation every N steps (0 = start/end)",
    )
    g.add_argument("--eval-n", type=pos, default=None, help="validation questions")
    g.add_argument(
        "--kl-every",
        type=nonneg,
        default=0,
        help="log KL to the initial and previous policy every N steps",
    )
    g.add_argument(
        "--grader-workers", type=nonneg, default=2, help="grading processes (0 = in this process)"
    )
    g.add_argument("--wandb", default=None, help="wandb project name (off when omitted)")
    g = p.add_argument_group("systems")  # --- systems ---
    g.add_argument(
        "--engine",
        default="vllm",
        choices=engines.ENGINES,
        help="rollout engine (hf = transformers)",
    )
    g.add_argument(
        "--policy-device", default=None, help="trained policy's device; default cuda:0, else cpu"
    )
    g.add_argument(
        "--vllm-device",
        default=None,
        help="engine device; default cuda:1 with 2 GPUs, else the policy's",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=common.probability,
        default=None,
        help="engine GPU share; default sized",
    )
    g.add_argument(
        "--sleep-engine",
        action="store_true",
        help="one shared GPU: free the engine's memory while training",
    )
    g.add_argument(
        "--shared-prefix",
        action=common.argparse.BooleanOptionalAction,
        default=None,
        help="run each group's prompt once for its G responses (exact); default on for a CPU policy",
    )
    g = p.add_argument_group("run")  # --- run ---
    g.add_argument(
        "--seed",
        type=nonneg,
        default=0,
        help="seeds prompt sampling, engine sampling, shuffling, torch",
    )
    g.add_argument(
        "--out",
        default=None,
        help="run dir (args.json, metrics.jsonl, rollouts/, dashboard.png, checkpoint/)",
    )
    g.add_argument(
        "--save-every",
        type=nonneg,
        default=None,
        help="checkpoint every N steps (0 = only at the end)",
    )
    g.add_argument(
        "--resume",
        default=None,
        help="run dir (or its checkpoint/) to continue, with its saved flags",
    )
    g.add_argument(
        "--dry-run", action="store_true", help="print the effective settings as JSON and exit"
    )
    args = p.parse_args(argv)
    if args.resume:
        common.resume_from(p, argv, args, needs=("optimizer.pt",))
    return resolve(args)


def resolve(args):
    """Profile defaults, derived sizes and every consistency check (one line naming the fix), nothing loaded."""
    args.profile = "demo" if data.is_embedded(args.model) else "hub"
    args.frozen_models = (args.kl_beta > 0 or args.kl_every > 0) + (
        args.kl_every > 0
    )  # pi_init, pi_{t-1} (KL)
    skip = (
        args.resume and not args.frozen_models
    )  # a resumed run loads its checkpoint; --model only as KL reference
    args.model = args.model if skip else common.check_model_dir(args.model or data.EMBEDDED_MODEL)
    for k, v in {**PROFILES[args.profile], **TASK_PROFILES.get(args.task, {})}.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    task = data.task_defaults(args.task, args.model)
    args.prompt, args.reward = args.prompt or task["prompt"], args.reward or task["reward"]
    args.train_path, args.val_path = args.train_path or task["path"], args.val_path or task["path"]
    common.attempt(
        data.load_prompt, args.prompt, what=f"--prompt {args.prompt}"
    )  # a missing prompt: one line now
    args.normalize_constant = args.normalize_constant or float(args.max_tokens)
    args.out = args.out or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))  # --resume: its run
    # derived sizes (seed 000 §7.2's sanity asserts, each naming what to change)
    c = common.check
    c(
        args.train_batch_size % args.gradient_accumulation_steps == 0,
        "--train-batch-size must be divisible by --gradient-accumulation-steps",
    )
    args.micro_train_batch_size = args.train_batch_size // args.gradient_accumulation_steps
    c(
        args.rollout_batch_size % args.group_size == 0,
        "--rollout-batch-size must be divisible by --group-size",
    )
    args.n_prompts_per_rollout_batch = args.rollout_batch_size // args.group_size
    c(args.train_batch_size >= args.group_size, "--train-batch-size must be >= --group-size")
    c(
        args.rollout_batch_size % args.train_batch_size == 0,
        "--rollout-batch-size must be a multiple of --train-batch-size",
    )
    args.optimizer_steps_per_rollout_batch = (
        args.epochs_per_rollout_batch * args.rollout_batch_size // args.train_batch_size
    )
    args.off_policy = args.optimizer_steps_per_rollout_batch > 1
    c(
        not args.off_policy or args.loss in losses.RATIO_LOSSES,
        f"--loss {args.loss} with {args.optimizer_steps_per_rollout_batch}"
        f" optimizer steps per rollout batch trains -A log pi on data from an older policy, uncorrected: use --loss grpo_clip",
    )
    args.needs_old = (
        args.loss in losses.RATIO_LOSSES or args.rollout_is != "none"
    )  # (seed 000 asks on-policy too)
    c(
        not args.std_norm or args.group_size >= 2,
        "--std-norm needs --group-size >= 2 (or pass --no-std-norm)",
    )
    c(
        args.min_tokens <= args.max_tokens,
        f"--min-tokens {args.min_tokens} must be <= --max-tokens {args.max_tokens}",
    )
    c(
        args.overlong_buffer < args.max_tokens,
        f"--overlong-buffer {args.overlong_buffer} must be < --max-tokens {args.max_tokens}",
    )
    c(
        args.rollout_is == "none" or args.old_log_probs == "trainer",
        "--rollout-is needs the trainer's pi_old: drop --old-log-probs engine",
    )
    c(
        args.rollout_is_floor == 0 or args.rollout_is == "mis",
        "--rollout-is-floor is a bound of --rollout-is mis",
    )
    c(
        args.rollout_is_floor < args.rollout_is_cap,
        "--rollout-is-floor must be below --rollout-is-cap",
    )
    c(
        args.kl_beta == 0 or args.kl_estimator != "seq",
        "--kl-estimator seq is for monitoring; the penalty needs k1, k2 or k3",
    )
    c(
        args.sleep_engine is False or args.engine == "vllm",
        "--sleep-engine frees vLLM's GPU memory: use --engine vllm",
    )
    c(
        args.seed < SEED_SPACE and args.n_grpo_steps < SEED_SPACE,
        f"--seed and --n-grpo-steps must be < {SEED_SPACE}",
    )
    c(
        args.dynamic_sampling_max_rounds < 16
        and 2 * args.rollout_batch_size <= 2**20,  # sample_seed's blocks
        "--dynamic-sampling-max-rounds must be < 16 and --rollout-batch-size <= 2^19",
    )
    return args


# ----------------------------------------------------------------------------- setup
def setup_devices(args):
    """Policy on cuda:0 and engine on cuda:1 with 2 GPUs (seed 000 layout); one GPU: shared; else CPU."""
    n_gpu = torch.cuda.device_count()
    args.policy_device = args.policy_device or ("cuda:0" if n_gpu else "cpu")
    args.vllm_device = args.vllm_device or ("cuda:1" if n_gpu > 1 else args.policy_device)
    args.param_dtype, args.compute_dtype = common.resolve_precision(
        args.policy_device, args.dtype, args.pure_bf16
    )
    if (
        args.shared_prefix is None
    ):  # on CUDA the saving is the prompt's share of a long response: see the README
        args.shared_prefix = args.policy_device == "cpu" and not args.gradient_checkpointing
    print(
        f"devices: policy {args.policy_device} (weights {args.param_dtype}, compute {args.compute_dtype}), engine "
        f"{args.engine} on {args.vllm_device} ({n_gpu} GPUs visible)"
    )


def load_data(args):
    """(train rows, validation rows), each with its formatted "prompt"; one-line errors on missing/empty data."""
    train = common.attempt(
        data.load_task,
        args.task,
        "train",
        args.train_path,
        args.train_n or None,
        args.data_seed,
        prompt=args.prompt,
        what="--train-path",
    )
    val = common.attempt(
        data.load_task,
        args.task,
        "test",
        args.val_path,
        args.eval_n,
        args.data_seed,
        prompt=args.prompt,
        what="--val-path",
    )
    common.check(
        len(train) >= args.n_prompts_per_rollout_batch,
        f"{len(train)} train questions < "
        f"{args.n_prompts_per_rollout_batch} prompts per rollout batch: more data or a smaller --rollout-batch-size",
    )
    common.check(len(val) > 0, "the validation set is empty: check --val-path")
    if args.train_path == "synthetic":
        print(
            f"data: synthetic Countdown (data.generate_countdown), {len(train)} train / {len(val)} test problems"
        )
    return train, val


def load_policy(path, args, dtype=None):
    """HF causal LM on args.policy_device in `dtype` (default: the master-weight dtype), dropout off: RL scores
    pi_old, pi_ref and pi (training forwards too) with one function."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or args.param_dtype).to(
        args.policy_device
    )
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    policy.config.use_cache = False
    tok, rows = AutoTokenizer.from_pretrained(path), policy.get_input_embeddings().weight.shape[0]
    common.check(
        len(tok) <= rows,
        f"{path}: the tokenizer has {len(tok)} tokens but the model only {rows} embeddings",
    )
    if args.shared_prefix and (
        args.gradient_checkpointing or not losses.shared_prefix_works(policy)
    ):
        args.shared_prefix = False
        print(
            "notice: --shared-prefix off (gradient checkpointing, or this model's cache did not reproduce its log-probs)"
        )
    for m in policy.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(
            getattr(m, "attention_dropout", None), float
        ):  # HF attention modules keep a float
            m.attention_dropout = 0.0
    return policy.train(), tok


def build_learner(args):
    """grpo.py's and each grpo_ray.py learner's (policy, tokenizer, AdamW, frozen pi_init, pi_{t-1} or None)."""
    policy, tokenizer = load_policy(args.resume or args.model, args)
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95)
    )
    if (
        args.resume
    ):  # every grpo_ray.py learner loads the one checkpoint: the group stays in lockstep
        optimizer.load_state_dict(
            torch.load(os.path.join(args.resume, "optimizer.pt"), map_location="cpu")
        )
    # in the policy's own weight dtype (fp32 master weights stay fp32), run under the same autocast: at step 0
    # KL(pi || pi_init) and its gradient are exactly 0, not bf16 rounding
    frozen = [
        load_policy(args.model, args)[0].eval().requires_grad_(False)
        for _ in range(args.frozen_models)
    ]
    return policy, tokenizer, optimizer, *(frozen + [None, None])[:2]


def make_engine(path, args, policy=None):
    """rollout.init_engine for this run. One shared GPU: the engine's share leaves room for the policy."""
    from transformers import AutoConfig

    max_len = min(getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 4096), 4096)
    kw = dict(max_model_len=max_len) if args.engine == "vllm" else {}
    if args.engine == "vllm" and args.vllm_device.startswith("cuda"):
        kw.update(
            gpu_memory_utilization=args.gpu_memory_utilization
            or common.engine_share(args, policy, extra_models=args.frozen_models),
            enable_sleep_mode=args.sleep_engine,
        )
    return engines.init_engine(args.engine, path, device=args.vllm_device, seed=args.seed, **kw)


# ----------------------------------------------------------------------------- rollout / reward
def sample_seed(args, step, rnd=0):
    """First seed of step `step`, round `rnd`: disjoint 2^20-seed blocks (generate uses [seed, seed + prompts x G))."""
    return ((args.seed * SEED_SPACE + step) * 16 + rnd) * 2**20


def rollout(engine, rows, args, seed):
    """G samples of each row's prompt -> batch: dict of group-major lists (N = rows x G)."""
    outs = engines.generate(
        engine,
        [r["prompt"] for r in rows],
        n=args.group_size,
        temperature=args.temperature,
        seed=seed,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        stop=rows[0]["stop"],
    )
    flat = [(r, o) for r, os_ in zip(rows, outs) for o in os_]  # group-major: G per prompt
    keys = {
        "prompts": "prompt",
        "ground_truths": "ground_truth",
        "responses": "text",
        "prompt_ids": "prompt_token_ids",
        "response_ids": "token_ids",
        "engine_logprobs": "logprobs",
    }  # batch key -> the row's or the sample's
    return {k: [o[v] if v in o else r[v] for r, o in flat] for k, v in keys.items()} | {
        "truncated": [o["finish_reason"] == "length" for _, o in flat]
    }


def score(batch, args):
    """Grade every response (+ DAPO's overlong penalty); batch["rewards"] = the reward dicts, batch["raw"] (N,)."""
    dicts = grader.grade_batch(
        grader.REWARD_FNS[args.reward],
        batch["responses"],
        batch["ground_truths"],
        workers=args.grader_workers,
    )
    raw = torch.tensor([d["reward"] for d in dicts], dtype=torch.float32)  # (N,)
    if args.overlong_buffer:  # 0 up to max - buffer tokens, then linear down to -1 at max_tokens
        n = torch.tensor([len(r) for r in batch["response_ids"]], dtype=torch.float32)
        raw += ((args.max_tokens - args.overlong_buffer - n) / args.overlong_buffer).clamp(
            -1.0, 0.0
        )
    batch["rewards"], batch["raw"] = dicts, raw
    return batch


def collect(engine, train_rows, args, step, shard=(0, 1)):
    """Rollout + reward phases of a step -> (scored batch with advantages, metrics). --dynamic-sampling (DAPO) drops
    flat groups and samples fresh prompts for up to --dynamic-sampling-max-rounds rounds, then trains what it has.
    shard (i, n): generator i of n (grpo_ray.py) takes its part of the prompts and seeds; joined in order = one batch."""
    (i, n), G, total = shard, args.group_size, args.n_prompts_per_rollout_batch
    start, rng = (
        i * total // n,
        random.Random(f"{sample_seed(args, step)}-{i}"),
    )  # extra rounds: this shard's own draws
    rows = random.Random(sample_seed(args, step)).sample(train_rows, total)[
        start : (i + 1) * total // n
    ]
    want, batch, sampled, t0, t_grade, t_round0 = len(rows), None, 0, time.perf_counter(), 0.0, None
    n_flat = 0  # sampled groups dropped for no variance (--dynamic-sampling)
    for rnd in range(1 + args.dynamic_sampling_max_rounds * args.dynamic_sampling):
        part, t1 = (
            rollout(engine, rows, args, sample_seed(args, step, rnd) + 2 * start * G),
            time.perf_counter(),
        )
        part, sampled, t_grade = (
            score(part, args),
            sampled + len(rows),
            t_grade + time.perf_counter() - t1,
        )
        if (
            args.dynamic_sampling
        ):  # keep the groups with variance (DAPO: of accuracy), up to the batch size
            if args.dynamic_sampling_on == "answer_reward":
                signal = torch.tensor(
                    [d["answer_reward"] for d in part["rewards"]], dtype=torch.float32
                )
            else:
                signal = part["raw"]  # the total reward, length shaping included
            varied = [
                g
                for g in range(len(rows))
                if signal[g * G : (g + 1) * G].max() > signal[g * G : (g + 1) * G].min()
            ]
            n_flat += len(rows) - len(varied)
            have = 0 if batch is None else len(batch["raw"]) // G
            keep = [g * G + j for g in varied for j in range(G)][: (want - have) * G]
            flat, part = (
                part,
                {
                    k: (v[keep] if torch.is_tensor(v) else [v[i] for i in keep])
                    for k, v in part.items()
                },
            )
        batch = (
            part
            if batch is None
            else {
                k: (torch.cat([batch[k], v]) if torch.is_tensor(v) else batch[k] + v)
                for k, v in part.items()
            }
        )
        t_round0 = t_round0 or time.perf_counter() - t0
        missing = want - len(batch["raw"]) // G
        if not args.dynamic_sampling or missing <= 0:
            break
        rows = rng.sample(
            train_rows, min(len(train_rows), 2 * missing)
        )  # oversample: some groups come out flat
    if (
        len(batch["raw"]) == 0
    ):  # nothing to learn from this step: a batch of flat groups (zero advantage)
        print(
            f"notice: step {step}: no group with reward variance in {sampled} prompts (--dynamic-sampling)"
        )
        batch = {k: v[: want * G] for k, v in flat.items()}
    batch["advantages"], _, meta = losses.compute_group_normalized_rewards(
        None,
        batch["responses"],
        batch["ground_truths"],
        G,
        args.advantage_eps,
        args.std_norm,
        reward_dicts=batch["raw"].tolist(),
    )
    batch["raw_rewards"], batch["ban_token_ids"] = (
        batch["raw"],
        engines.min_tokens_banned_ids(engine) if args.min_tokens else [],
    )
    lens, d = [len(r) for r in batch["response_ids"]], batch["rewards"]
    m = {
        "train/reward": meta["mean"],
        "train/format_reward": fmean([x["format_reward"] for x in d]),
        "train/answer_reward": fmean([x["answer_reward"] for x in d]),
        "train/zero_var_frac": meta["frac_groups_zero_std"],
        "train/response_len_mean": fmean(lens),
        "train/response_len_max": max(lens),
        "train/truncation_rate": fmean(batch["truncated"]),
        "time/generation": time.perf_counter() - t0 - t_grade,
        "time/grading": t_grade,
    }
    if args.dynamic_sampling:
        m.update(
            {
                "train/dynamic_filtered_frac": n_flat / sampled,
                "train/dynamic_prompts_sampled": sampled,
                "time/dynamic_extra_generation": time.perf_counter() - t0 - t_round0,
            }
        )
    return batch, m


def collate(batch, args, pad_id=0):
    """Right-padded engine token ids: input_ids / labels / response_mask / engine_log_probs / ban_mask (N, T),
    lengths (N,). ban_mask marks the first --min-tokens response positions (stop tokens banned there)."""
    seqs = [p + r for p, r in zip(batch["prompt_ids"], batch["response_ids"])]
    N, T = len(seqs), max(map(len, seqs)) - 1
    ids = torch.full((N, T + 1), pad_id, dtype=torch.long)  # (N, T+1)
    mask, ban = (
        torch.zeros(N, T, dtype=torch.bool),
        torch.zeros(N, T, dtype=torch.bool),
    )  # (N, T) over labels
    eng = torch.zeros(N, T)
    for i, (p, r, lp) in enumerate(
        zip(batch["prompt_ids"], batch["response_ids"], batch["engine_logprobs"])
    ):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        s = len(p) - 1  # label s is the first response token
        mask[i, s : s + len(r)] = True
        ban[i, s : s + min(len(r), args.min_tokens)] = True
        eng[i, s : s + len(r)] = torch.tensor(lp, dtype=torch.float32)
    if args.mask_truncated:  # DAPO overlong filtering: truncated responses leave the loss
        mask[torch.tensor(batch["truncated"], dtype=torch.bool)] = False
    return {
        "input_ids": ids[:, :-1],
        "labels": ids[:, 1:],
        "response_mask": mask,
        "engine_log_probs": eng,
        "ban_mask": ban,
        "lengths": torch.tensor([len(s) - 1 for s in seqs]),
        "group": torch.arange(N) // args.group_size,
        "prompt_len": torch.tensor([len(p) for p in batch["prompt_ids"]]),
    }


def _forwards(tensors, idx, args, device):
    """Microbatch rows idx as forward passes (rows, tensors trimmed to their longest L on device + the rows' lengths,
    L, prefix_len P): one per group with --shared-prefix (its prompt once; its last token predicts each response's first)."""
    groups = (
        [idx[tensors["group"][idx] == g] for g in tensors["group"][idx].unique()]
        if args.shared_prefix
        else [idx]
    )
    for rows in groups:
        L, P = (
            int(tensors["lengths"][rows].max()),
            int(tensors["prompt_len"][rows].min()) - 1 if len(rows) > 1 else 0,
        )
        mb = {k: tensors[k][rows, :L].to(device) for k in ("input_ids", "labels", "ban_mask")} | {
            "lengths": tensors["lengths"][rows]
        }
        yield rows, mb, L, P * (args.shared_prefix and P < L)


# ----------------------------------------------------------------------------- log-probs / train
def _shard(rows, dp):
    """This learner's contiguous part of `rows` (all of them without data parallelism)."""
    return (
        rows
        if dp is None
        else rows[
            dp["rank"] * len(rows) // dp["world"] : (dp["rank"] + 1) * len(rows) // dp["world"]
        ]
    )


def batch_log_probs(model, tensors, args, ban_ids, dp=None):
    """(N, T) label log-probs under `model` at the sampling temperature, no grad; dp: shard per learner, then summed."""
    N, T = tensors["labels"].shape
    out, dev, was_training, rows = (
        torch.zeros(N, T),
        next(model.parameters()).device,
        model.training,
        _shard(torch.arange(N), dp),
    )
    model.eval()
    with torch.inference_mode(), common.autocast(dev, args.compute_dtype):
        for s in range(0, len(rows), args.micro_train_batch_size):
            for idx, mb, L, P in _forwards(
                tensors, rows[s : s + args.micro_train_batch_size], args, dev
            ):
                out[idx, :L] = (
                    losses.get_response_log_probs(
                        model,
                        **mb,
                        temperature=args.temperature,
                        ban_token_ids=ban_ids,
                        prefix_len=P,
                    )["log_probs"]
                    .float()
                    .cpu()
                )
    model.train(was_training)
    out = out.clone()  # a normal tensor: inference tensors cannot enter autograd later
    return out if dp is None else dp["reduce"](out, "sum")


def train_step(
    policy, optimizer, batch, args, step, ref_model=None, prev_model=None, lag=0, dp=None
):
    """One scored rollout batch -> (history: one dict per optimizer step, the step's metrics): pi_old (reference,
    previous policy for KL) by no-grad passes, then epochs x train batches x microbatches. lag: updates the policy
    is ahead of the batch's generator (grpo_ray.py); a stale batch takes pi_old from the engine unless --rollout-is
    corrects it. prev_model holds pi_{t-1}, refreshed here. dp (grpo_ray.py's M learners): {"rank", "world",
    "reduce": in-place all-reduce(tensor, op)}: each runs 1/M of every row set, gradients and metrics are summed."""
    t0, ban_ids, tensors, m = time.perf_counter(), batch["ban_token_ids"], collate(batch, args), {}
    do_kl = bool(args.kl_every) and step % args.kl_every == 0
    engine_old = args.old_log_probs == "engine" or (lag > 0 and args.rollout_is == "none")
    need_cur = do_kl or (not engine_old and (args.needs_old or lag > 0))
    cur = (
        batch_log_probs(policy, tensors, args, ban_ids, dp) if need_cur else None
    )  # pi_t, the policy before this step
    old = tensors["engine_log_probs"] if engine_old else cur
    mask, weights = tensors["response_mask"], None
    if cur is not None:  # engine-trainer mismatch (kernels, precision; staleness when lag > 0)
        weights, is_m = losses.compute_rollout_is(
            cur,
            tensors["engine_log_probs"],
            mask,
            args.rollout_is,
            args.rollout_is_cap,
            args.rollout_is_level,
            args.rollout_is_floor,
        )
        m.update({f"train/{k}": v for k, v in is_m.items()})
        m["train/logprob_mismatch"] = losses.masked_mean(
            (cur - tensors["engine_log_probs"]).abs(), mask
        ).item()
        if args.rollout_is == "none":
            weights = None
    ref = (
        batch_log_probs(ref_model, tensors, args, ban_ids, dp)
        if (args.kl_beta or do_kl) and ref_model is not None
        else None
    )
    if do_kl:
        m["train/kl_ref"] = losses.kl_divergence(
            cur, ref, tensors["response_mask"], args.kl_estimator
        ).item()
        if prev_model is not None and getattr(prev_model, "holds_step", None) == step - 1:
            prev = batch_log_probs(prev_model, tensors, args, ban_ids, dp)
            m["train/kl_prev"] = losses.kl_divergence(
                cur, prev, tensors["response_mask"], args.kl_estimator
            ).item()
            if (
                lag == 1
            ):  # prev generated this batch: split the mismatch into kernel and staleness parts
                m["train/mismatch_kernel_kl"] = losses.kl_divergence(
                    tensors["engine_log_probs"], prev, mask, "k3"
                ).item()  # KL(mu || pi_prev)
                m["train/mismatch_staleness_kl"] = losses.kl_divergence(
                    prev, cur, mask, "k3"
                ).item()
    if prev_model is not None and args.kl_every and (step + 1) % args.kl_every == 0:
        prev_model.load_state_dict(
            policy.state_dict()
        )  # pi_t, the previous policy of the next step
        prev_model.holds_step = step
    m["time/old_log_probs"], t1 = time.perf_counter() - t0, time.perf_counter()
    history = _updates(policy, optimizer, batch, tensors, mask, old, ref, weights, args, step, dp)
    return history, m | {"time/training": time.perf_counter() - t1}


def _updates(policy, optimizer, batch, tensors, mask, old, ref, weights, args, step, dp=None):
    """epochs x train batches of --train-batch-size x microbatches of --micro-train-batch-size (the last ones
    may be smaller: each microbatch's loss is scaled by its share of the step's rows). One dict per step."""
    N, dev, ban_ids = len(batch["advantages"]), args.policy_device, batch["ban_token_ids"]
    gen, params, history = (
        torch.Generator().manual_seed(sample_seed(args, step)),
        [p for p in policy.parameters() if p.requires_grad],
        [],
    )
    for epoch in range(args.epochs_per_rollout_batch):
        # on-policy the order is free: microbatches of similar lengths pad less (groups stay whole for --shared-prefix)
        order = (
            torch.randperm(N, generator=gen)
            if args.off_policy
            else torch.arange(N)
            if args.shared_prefix
            else torch.argsort(tensors["lengths"], stable=True)
        )
        for b in range(0, N, args.train_batch_size):
            rows = order[b : b + args.train_batch_size]
            h = {
                "loss": 0.0,
                "entropy": 0.0,
                "clip_fraction": 0.0,
                "ratio_mean": 0.0,
                "ratio_min": math.inf,
                "ratio_max": -math.inf,
            }
            n_tok = max(
                int(mask[rows].sum()), 1
            )  # DAPO token norm: the tokens of the whole optimizer step
            mine = _shard(rows, dp)
            for idx, mb, L, P in (
                f
                for s in range(0, len(mine), args.micro_train_batch_size)
                for f in _forwards(tensors, mine[s : s + args.micro_train_batch_size], args, dev)
            ):
                share = len(idx) / len(rows)  # this forward's part of the optimizer step's loss
                with common.autocast(dev, args.compute_dtype):
                    out = losses.get_response_log_probs(
                        policy,
                        **mb,
                        return_token_entropy=True,
                        temperature=args.temperature,
                        ban_token_ids=ban_ids,
                        prefix_len=P,
                    )
                mbm = mask[idx, :L].to(dev)
                loss, meta = losses.grpo_microbatch_train_step(
                    out["log_probs"],
                    mbm,
                    1 / share,
                    args.loss,
                    raw_rewards=batch["raw_rewards"][idx].to(dev),
                    advantages=batch["advantages"][idx].to(dev),
                    old_log_probs=None if old is None else old[idx, :L].to(dev),
                    cliprange=args.cliprange,
                    cliprange_high=args.cliprange_high,
                    length_norm=args.length_norm,
                    normalize_constant=n_tok
                    if args.length_norm == "token"
                    else args.normalize_constant,
                    ref_log_probs=ref[idx, :L].to(dev)
                    if (ref is not None and args.kl_beta)
                    else None,
                    kl_beta=args.kl_beta,
                    kl_estimator=args.kl_estimator,
                    is_weights=None if weights is None else weights[idx, :L].to(dev),
                )
                tok = (
                    float(mbm.sum()) / n_tok
                )  # token averages over the whole step, whatever the forwards' split
                h["loss"] += loss.item()
                h["entropy"] += (
                    losses.masked_mean(out["token_entropy"].detach(), mbm).nan_to_num().item() * tok
                )
                h["clip_fraction"] += float(meta.get("clip_fraction", 0.0)) * tok
                if "ratio_mean" in meta:
                    h["ratio_mean"] += meta["ratio_mean"].nan_to_num(1.0).item() * tok
                    h["ratio_min"], h["ratio_max"] = (
                        min(h["ratio_min"], meta["ratio_min"].item()),
                        max(h["ratio_max"], meta["ratio_max"].item()),
                    )
            if (
                dp is not None
            ):  # the step's gradient and metrics are the sums of every learner's part
                _reduce(params, h, dp)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if (
                h["ratio_min"] == math.inf
            ):  # no ratio in the loss (on-policy by construction), or no token: pi_old is pi
                h.update(ratio_mean=1.0, ratio_min=1.0, ratio_max=1.0)
            history.append(
                {f"train/{k}": v for k, v in h.items()}
                | {"train/grad_norm": grad_norm.item(), "train/epoch": epoch, "train/lr": args.lr}
            )
    return history


def _reduce(params, h, dp):
    """All-reduce the accumulated gradients (one flat buffer) and the step's metric sums / extremes over learners."""
    flat = dp["reduce"](
        torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
        ),
        "sum",
    )
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad = g.view_as(p).clone()
    keys = ("loss", "entropy", "clip_fraction", "ratio_mean")
    h.update(
        zip(
            keys,
            dp["reduce"](torch.tensor([h[k] for k in keys], dtype=torch.float64), "sum").tolist(),
        )
    )
    h["ratio_min"], h["ratio_max"] = (
        dp["reduce"](torch.tensor(h[k]), op).item()
        for k, op in (("ratio_min", "min"), ("ratio_max", "max"))
    )


def step_rows(step, opt_step, batch, history, metrics, step_s, weight_sync_s, wall_s):
    """One GRPO step's metric rows (one per optimizer step) for grpo.py and grpo_ray.py: metrics = collect's | train_step's."""
    n_tok = sum(len(r) for r in batch["response_ids"])
    row = metrics | {
        "time/weight_sync": weight_sync_s,
        "time/step": step_s,
        "time/wall": wall_s,
        "time/tokens_per_s": n_tok / max(step_s, 1e-9),
        "time/gen_tokens_per_s": n_tok / max(metrics["time/generation"], 1e-9),
    }
    return [{"step": step, "opt_step": opt_step + i + 1} | row | h for i, h in enumerate(history)]


# ----------------------------------------------------------------------------- eval / io
LINE = (
    "loss +.4f reward .3f answer_reward .2f response_len_mean .1f truncation_rate .2f entropy .3f grad_norm .3f "
    "clip_fraction .3f kl_ref .2e kl_prev .2e generation .1f training .1f tokens_per_s .0f".split()
)  # (name, format)


def step_line(step, args, row):
    """The per-step stdout line: the LINE keys present in the row (train/ or time/)."""
    return f"step {step + 1}/{args.n_grpo_steps} | " + " | ".join(
        f"{n} {row[p + n]:{f}}"
        for n, f in zip(LINE[::2], LINE[1::2])
        for p in ("train/", "time/")
        if p + n in row
    )


def _eval_and_dump(engine, val_rows, args, step, state, t_run, batch, wandb_run):
    t0 = time.perf_counter()
    metrics, samples = common.greedy_eval(
        engine, val_rows, args.reward, args.max_tokens, args.min_tokens, args.grader_workers
    )
    common.log_row(
        args.out,
        {
            "step": step,
            "opt_step": state["opt_step"],
            "time/wall": time.perf_counter() - t_run,
            "time/eval": time.perf_counter() - t0,
        }
        | metrics,
        wandb_run,
    )
    print(
        f"eval step {step} | accuracy {metrics['eval/accuracy']:.3f} | reward {metrics['eval/reward']:.3f} | "
        f"format {metrics['eval/format_reward']:.3f} | len {metrics['eval/response_len']:.1f}",
        flush=True,
    )
    train = (
        []
        if batch is None
        else [
            {"split": "train", "prompt": p, "response": r, "ground_truth": g, **d}
            for p, r, g, d in zip(
                batch["prompts"], batch["responses"], batch["ground_truths"], batch["rewards"]
            )
        ]
    )
    data.write_jsonl_atomic(
        os.path.join(args.out, "rollouts", f"step_{step:04d}.jsonl"),
        samples[:32] + train[: 2 * args.group_size],
    )
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- main
def main(args):
    from tqdm import tqdm

    import plot

    setup_devices(args)
    if args.dry_run:
        common.dry_run(args)  # the effective settings as one JSON line; nothing loaded
    torch.manual_seed(args.seed)
    common.claim_run_dir(
        args.out, args.resume
    )  # an existing run needs --resume; checked writable first
    train_rows, val_rows = load_data(args)
    policy, tokenizer, optimizer, ref_model, prev_model = build_learner(args)
    state = {"step": 0, "opt_step": 0, "wall": 0.0}
    if args.resume:
        state = {
            k: v for k, v in common.restore_checkpoint(args.resume, args.out).items() if k in state
        }
    engine = make_engine(args.resume or args.model, args, policy)
    data.write_json_atomic(os.path.join(args.out, "args.json"), common.jsonable(vars(args)))
    wandb_run = common.start_wandb(
        args.wandb, args, {"train/*": "opt_step", "eval/*": "step"}
    )  # eval: its own x
    print(
        f"{len(train_rows)} train / {len(val_rows)} val questions | {args.n_prompts_per_rollout_batch} prompts x "
        f"{args.group_size} samples | {args.optimizer_steps_per_rollout_batch} optimizer steps per rollout batch "
        f"({'off' if args.off_policy else 'on'}-policy) | {args.profile} profile | out {args.out}",
        flush=True,
    )
    t_run, sync_s, dirty, interrupted = time.perf_counter() - state["wall"], 0.0, False, False
    os.makedirs(os.path.join(args.out, "rollouts"), exist_ok=True)
    try:
        for step in tqdm(
            range(state["step"], args.n_grpo_steps), initial=state["step"], total=args.n_grpo_steps
        ):
            t_step = time.perf_counter()
            # --- rollout + reward / advantage: G samples per question from the engine (it holds pi_step) ---
            batch, metrics = collect(engine, train_rows, args, step)
            # --- eval: greedy on the engine's weights, the policy after `step` updates ---
            if args.eval_every and step % args.eval_every == 0:
                t_step += _eval_and_dump(
                    engine, val_rows, args, step, state, t_run, batch, wandb_run
                )  # not step time
            if args.sleep_engine:
                engines.sleep_engine(
                    engine
                )  # one shared GPU: the engine's weights and KV cache leave it
            # --- old log-probs, then train (epochs x train batches x microbatches); log. A first Ctrl-C lets
            # this finish, so the saved weights, optimizer and step counter always agree ---
            with common.finish_then_interrupt("this step's updates"):
                dirty = True
                history, train_m = train_step(
                    policy, optimizer, batch, args, step, ref_model, prev_model
                )
                rows = step_rows(
                    step,
                    state["opt_step"],
                    batch,
                    history,
                    metrics | train_m,
                    time.perf_counter() - t_step + sync_s,
                    sync_s,
                    time.perf_counter() - t_run,
                )
                for row in rows:
                    common.log_row(args.out, row, wandb_run)
                    tqdm.write(step_line(step, args, row))
                state.update(
                    step=step + 1, opt_step=rows[-1]["opt_step"], wall=time.perf_counter() - t_run
                )
                dirty = False
            # --- save ---
            if args.save_every and (step + 1) % args.save_every == 0:
                common.save_model_checkpoint(
                    args.out,
                    policy,
                    tokenizer,
                    args,
                    state,
                    {"optimizer.pt": optimizer.state_dict()},
                )
            # --- sync weights into the engine for the next rollout ---
            sync_s = (
                engines.wake_engine(engine, policy)
                if args.sleep_engine
                else engines.load_policy_into_vllm(policy, engine)
            )
    except KeyboardInterrupt:
        interrupted = True
        if dirty:
            raise SystemExit(
                f"\naborted inside step {state['step']}'s updates: nothing saved; --resume {args.out} "
                f"restarts from the last checkpoint"
            )
        print(
            f"\ninterrupted: saving checkpoint and plots (resume restarts at step {state['step']})"
        )
    if not interrupted:
        _eval_and_dump(engine, val_rows, args, args.n_grpo_steps, state, t_run, None, wandb_run)
    state["wall"] = time.perf_counter() - t_run
    path = common.save_model_checkpoint(
        args.out, policy, tokenizer, args, state, {"optimizer.pt": optimizer.state_dict()}
    )
    plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
    print(f"checkpoint {path} | dashboard + metrics in {args.out} | {state['wall']:.0f}s")
    if wandb_run is not None:
        wandb_run.finish()
    if interrupted:
        raise SystemExit(130)  # the shell's code for Ctrl-C, after everything is saved


if __name__ == "__main__":
    main(parse_args())
