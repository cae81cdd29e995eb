"""Expert iteration (rejection-sampling fine-tuning): sample, keep the correct, SFT on it, repeat.

Seed 001 (Problem 15) compares GRPO's entropy with "what you observed in the EI experiment", and the
lecture sets expert iteration beside policy gradients; no seed gives its settings, so PROFILES holds
ours (the README lists them). Each step of `main`:
  rollout + reward  `sample`: --ei-batch-size questions, --group-size engine samples each, graded
  keep              `keep_correct`: the responses with answer reward 1 (at most --max-per-question
                    of a question's)
  (eval)            every --eval-every steps, greedy, on the engine's weights (grpo.py's)
  entropy           `response_entropy`: a no-grad pass of the policy over every sampled response,
                    at the sampling temperature, as grpo.py's train/entropy reads it
  train             SFT on the kept pairs: ceil(--epochs x kept / --batch-size) optimizer steps of
                    sft.py's `train_step` (its loss, microbatches and clipping); log
  save, sync        a checkpoint every --save-every steps; the new weights into the engine
It reuses grpo.py's engine, sampling, validation and policy loading and sft.py's train step.

How it departs from the lecture's loop and from grpo.py:
- it trains on the kept responses' text, re-tokenised (sft.py's train step), not on the engine's
  token ids: what SFT on a data set of filtered samples does;
- the lr is constant: how many optimizer steps a run takes depends on how much is kept;
- the policy and its AdamW state carry over from step to step (no restart from the base model);
- an optimizer step always holds --batch-size pairs: the kept pairs are drawn in seeded
  permutations, one after another (sft.py's order), so a step with fewer kept pairs than
  --batch-size repeats some;
- a step that keeps nothing trains nothing (its row has no train/loss).
Without --model this is the offline demo: the embedded model on CPU, 5 steps of 48 questions x 8
samples, the 1920 sampled responses of grpo.py's demo (30 steps x 64).

Examples:
  python expert_iteration.py                                     # offline CPU demo
  python expert_iteration.py --model Qwen/Qwen3-0.6B --task gsm8k \\
      --train-path gsm8k_train.jsonl --val-path gsm8k_test.jsonl --out runs/gsm8k_ei
  python expert_iteration.py --group-size 16 --max-per-question 2 --epochs 1 --dry-run
"""

import contextlib
import math
import os
import random
import time
from statistics import fmean

import torch

import common
import data
import grader
import grpo
import losses
import rollout as engines
import sft

# The settings table (no seed defines expert iteration's: these are our choices, listed in the
# README). An unset flag takes its value from the run's profile: "demo" (the embedded model,
# offline on CPU) or "hub" (any other model).
PROFILES = {
    "hub": dict(
        n_ei_steps=5,
        ei_batch_size=512,  # questions per step
        group_size=4,
        lr=2e-5,  # sft.py's (seed 000 §4.3)
        epochs=1,
        batch_size=32,  # sft.py's
        gradient_accumulation_steps=16,  # seed 000 §4.3's SFT recipe: 2 pairs a microbatch
        temperature=1.0,  # seed 001
        min_tokens=4,  # the seeds
        max_tokens=1024,  # the seeds
        eval_every=1,
        eval_n=1024,  # seed 001 §5: validate on >= 1024 examples
        save_every=1,
        train_n=0,  # all the questions
    ),
    # grpo.py's demo budget: 5 x 48 x 8 = 1920 sampled responses
    "demo": dict(
        n_ei_steps=5,
        ei_batch_size=48,
        group_size=8,
        lr=1e-4,  # grpo.py's demo lr
        epochs=2,
        batch_size=32,
        gradient_accumulation_steps=2,
        temperature=1.0,
        min_tokens=4,
        max_tokens=192,
        eval_every=1,
        eval_n=200,
        save_every=0,
        train_n=2000,
    ),
}


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    """The flags, grouped as --help shows them; an unset flag comes from PROFILES (see resolve)."""
    p = common.Parser(
        description="Expert iteration: SFT on the policy's own correct samples. "
        "Unset flags come from PROFILES."
    )
    pos = common.positive_int
    nonneg = common.nonneg_int
    pfloat = common.positive_float
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
        help="reward fn; default: the task's (kept = answer reward 1)",
    )
    g.add_argument(
        "--chat-template",
        default="off",
        choices=data.CHAT_TEMPLATES,
        help="wrap each prompt in the model's chat template (on; no_thinking: Qwen3's switch off)",
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
    g = p.add_argument_group("expert iteration")  # --- expert iteration ---
    g.add_argument("--n-ei-steps", type=pos, default=None, help="sample-filter-SFT rounds")
    g.add_argument("--ei-batch-size", type=pos, default=None, help="questions sampled per step")
    g.add_argument("--group-size", type=pos, default=None, help="G samples per question")
    g.add_argument(
        "--max-per-question",
        type=nonneg,
        default=0,
        help="keep at most this many correct responses of a question (0 = all)",
    )
    g = p.add_argument_group("SFT (sft.py's train step)")  # --- SFT ---
    g.add_argument("--lr", type=pfloat, default=None, help="AdamW learning rate (constant)")
    g.add_argument("--epochs", type=pfloat, default=None, help="passes over each step's kept pairs")
    g.add_argument("--batch-size", type=pos, default=None, help="pairs per optimizer step")
    g.add_argument(
        "--gradient-accumulation-steps",
        type=pos,
        default=None,
        help="microbatches per optimizer step",
    )
    g.add_argument(
        "--normalize-constant",
        type=pfloat,
        default=1.0,
        help="per-pair summed NLL is divided by this (sft.py's)",
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
    g = p.add_argument_group("sampling")  # --- sampling ---
    g.add_argument(
        "--temperature",
        type=pfloat,
        default=None,
        help="rollout temperature; the entropy is read at the same",
    )
    g.add_argument("--top-p", type=common.probability, default=1.0, help="nucleus sampling")
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
        "--eager",
        action="store_true",
        help="vllm without torch.compile: fast start, slower decoding (smoke tests, debugging)",
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
        help="run a prompt once for its responses (exact); default: on for CPU",
    )
    g.add_argument(
        "--threads",
        type=common.positive_int,
        default=None,
        help="torch CPU threads (default: torch's, one per core); 1 on a busy shared machine",
    )
    g = p.add_argument_group("run")  # --- run ---
    g.add_argument(
        "--seed", type=nonneg, default=0, help="seeds question sampling, engine sampling, order"
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
    """Profile defaults, derived sizes and every consistency check, each a one-line error naming
    the fix. Nothing is loaded."""
    if data.is_embedded(args.model):
        args.profile = "demo"
    else:
        args.profile = "hub"
    if not args.resume:  # a resumed run loads its checkpoint
        args.model = common.check_model_dir(args.model or data.EMBEDDED_MODEL)
    for name, value in PROFILES[args.profile].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    task = data.task_defaults(args.task, args.model)
    args.prompt = args.prompt or task["prompt"]
    args.reward = args.reward or task["reward"]
    args.train_path = args.train_path or task["path"]
    args.val_path = args.val_path or task["path"]
    common.attempt(data.load_prompt, args.prompt, what=f"--prompt {args.prompt}")
    if not args.out:  # (--resume has set it to its run)
        args.out = os.path.join("runs", time.strftime("ei-%Y%m%d-%H%M%S"))
    # sft.train_step reads the device and the compute dtype's name from args, as sft.py resolves
    # them; grpo.setup_runtime reads the same flags for the engine
    if not args.policy_device:
        args.policy_device = "cpu"
        if torch.cuda.device_count():
            args.policy_device = "cuda:0"
    compute = common.resolve_precision(args.policy_device, args.dtype, args.pure_bf16)[1]
    args.compute_dtype = str(compute).split(".")[-1]  # torch.float32 -> "float32"
    # what grpo.py's functions read that this script has no flag for: no frozen reference model
    # (grpo.make_engine sizes the engine's GPU share with it), every response token scored
    # (grpo.collate)
    args.frozen_models = 0
    args.mask_truncated = False

    check = common.check
    check(
        args.batch_size % args.gradient_accumulation_steps == 0,
        "--batch-size must be divisible by --gradient-accumulation-steps",
    )
    args.micro_batch_size = args.batch_size // args.gradient_accumulation_steps
    check(
        args.min_tokens <= args.max_tokens,
        f"--min-tokens {args.min_tokens} must be <= --max-tokens {args.max_tokens}",
    )
    check(
        not (args.shared_prefix and args.gradient_checkpointing),
        "--shared-prefix runs the prompt once into the KV cache, which gradient checkpointing"
        " turns off: pass --no-shared-prefix or drop --gradient-checkpointing",
    )
    check(
        args.sleep_engine is False or args.engine == "vllm",
        "--sleep-engine frees vLLM's GPU memory: use --engine vllm",
    )
    # grpo.sample_seed's blocks: 16 bits each for --seed and the step, 2^20 seeds a step
    check(
        args.seed < grpo.SEED_SPACE and args.n_ei_steps < grpo.SEED_SPACE,
        f"--seed and --n-ei-steps must be < {grpo.SEED_SPACE}",
    )
    check(
        args.ei_batch_size * args.group_size <= 2**20,
        "--ei-batch-size x --group-size must be <= 2^20",
    )
    return args


def load_data(args):
    """(train rows, validation rows), each row with its formatted "prompt". Missing or empty data
    is a one-line error."""
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
    tokenizer_path = args.resume or args.model  # a checkpoint holds the tokenizer
    train = common.attempt(
        data.apply_chat_template, train, tokenizer_path, args.chat_template, what="--chat-template"
    )
    val = common.attempt(
        data.apply_chat_template, val, tokenizer_path, args.chat_template, what="--chat-template"
    )
    common.check(
        len(train) >= args.ei_batch_size,
        f"{len(train)} train questions < --ei-batch-size {args.ei_batch_size}: more data or a"
        " smaller --ei-batch-size",
    )
    common.check(len(val) > 0, "the validation set is empty: check --val-path")
    return train, val


# ----------------------------------------------------------------------------- sample / keep
def sample(engine, train_rows, args, step):
    """--ei-batch-size questions, G engine samples each, graded -> (batch: grpo.rollout's
    group-major lists plus "rewards" (the reward dicts) and "ban_token_ids", stats: seconds of
    generation and grading). The questions and seeds are grpo.py's for the step."""
    t0 = time.perf_counter()
    seed = grpo.sample_seed(args, step)
    questions = random.Random(seed).sample(train_rows, args.ei_batch_size)
    batch = grpo.rollout(engine, questions, args, seed)
    t1 = time.perf_counter()
    batch["rewards"] = grader.grade_batch(
        grader.REWARD_FNS[args.reward],
        batch["responses"],
        batch["ground_truths"],
        workers=args.grader_workers,
    )
    batch["ban_token_ids"] = []
    if args.min_tokens:
        batch["ban_token_ids"] = engines.min_tokens_banned_ids(engine)  # the entropy bans them too
    stats = {"generation_s": t1 - t0, "grading_s": time.perf_counter() - t1}
    return batch, stats


def keep_correct(batch, args):
    """The rows of `batch` to train on: each response with answer reward 1 (the one meaning of
    accuracy), the first --max-per-question of a question's G when that is set."""
    G = args.group_size
    kept = []
    for start in range(0, len(batch["rewards"]), G):
        n_kept = 0  # this question's kept responses
        for i in range(start, start + G):
            if batch["rewards"][i]["answer_reward"] < 1:
                continue
            if args.max_per_question and n_kept == args.max_per_question:
                break
            kept.append(i)
            n_kept += 1
    return kept


def response_entropy(policy, batch, args, runtime):
    """-> (N,) summed token entropy of each response and (N,) its token count, under `policy` at the
    sampling temperature with the min_tokens ban, on the engine's tokens: what grpo.py's training
    forward reads as train/entropy, here from a no-grad pass."""
    tensors = grpo.collate(batch, args)  # (N, T) ids, labels, masks
    mask = tensors["response_mask"]  # (N, T)
    N = mask.shape[0]
    sums = torch.zeros(N)  # (N,)
    device = runtime["policy_device"]
    rows = torch.arange(N)
    policy.eval()
    with torch.inference_mode(), common.autocast(device, runtime["compute_dtype"]):
        for start in range(0, N, args.micro_batch_size):
            chunk = rows[start : start + args.micro_batch_size]
            for idx, mb, L, P in grpo._forwards(tensors, chunk, runtime["shared_prefix"], device):
                out = losses.get_response_log_probs(
                    policy,
                    **mb,
                    return_token_entropy=True,
                    temperature=args.temperature,
                    ban_token_ids=batch["ban_token_ids"],
                    prefix_len=P,
                )
                entropy = out["token_entropy"].float().cpu()  # (rows, L)
                sums[idx] = (entropy * mask[idx, :L]).sum(-1)
    policy.train()
    return sums, mask.sum(-1).float()


def summarize(batch, kept, entropy, stats):
    """The step's sampling metrics: rewards, kept fraction, response entropy over all sampled
    responses and over the kept ones (token-weighted, as grpo.py's train/entropy), lengths."""
    sums, counts = entropy
    rewards = batch["rewards"]
    lengths = [len(ids) for ids in batch["response_ids"]]
    metrics = {
        "train/reward": fmean([d["reward"] for d in rewards]),
        "train/format_reward": fmean([d["format_reward"] for d in rewards]),
        "train/answer_reward": fmean([d["answer_reward"] for d in rewards]),
        "train/kept_frac": len(kept) / len(rewards),
        "train/entropy": (sums.sum() / counts.sum().clamp(min=1)).item(),
        "train/response_len_mean": fmean(lengths),
        "train/response_len_max": max(lengths),
        "train/truncation_rate": fmean(batch["truncated"]),
        "time/generation": stats["generation_s"],
        "time/grading": stats["grading_s"],
    }
    if kept:  # nothing kept: no kept-response metrics
        rows = torch.tensor(kept)
        metrics["train/entropy_kept"] = (sums[rows].sum() / counts[rows].sum().clamp(min=1)).item()
        metrics["train/kept_len_mean"] = fmean([lengths[i] for i in kept])
    return metrics


# ----------------------------------------------------------------------------- train
def sft_on_kept(learner, batch, kept, args, runtime, step):
    """SFT on the kept responses: ceil(--epochs x kept / --batch-size) optimizer steps of
    sft.train_step, each on --batch-size pairs taken in order from seeded permutations of the kept
    pairs (sft.py's order). -> the step's train metrics ({} when nothing is kept)."""
    if not kept:
        return {}
    pairs = []
    for i in kept:
        n_tokens = len(batch["prompt_ids"][i]) + len(batch["response_ids"][i])  # sorts microbatches
        pairs.append(
            {"prompt": batch["prompts"][i], "response": batch["responses"][i], "n_tokens": n_tokens}
        )
    n_steps = math.ceil(args.epochs * len(pairs) / args.batch_size)
    order = []
    for epoch in range(math.ceil(n_steps * args.batch_size / len(pairs))):
        perm = list(range(len(pairs)))
        random.Random(f"{args.seed}-{step}-{epoch}").shuffle(perm)
        order += perm
    history = []
    for k in range(n_steps):
        chosen = order[k * args.batch_size : (k + 1) * args.batch_size]
        history.append(
            sft.train_step(
                learner["policy"],
                learner["tokenizer"],
                learner["optimizer"],
                learner["scheduler"],
                [pairs[j] for j in chosen],
                args,
                runtime["shared_prefix"],
            )
        )
    # the optimizer steps' means (sft.py's train/entropy is on the kept pairs during training:
    # train/entropy_kept reads them before it, as train/entropy reads all)
    return {
        "train/loss": fmean([h["train/loss"] for h in history]),
        "train/nll_per_token": fmean([h["train/nll_per_token"] for h in history]),
        "train/grad_norm": fmean([h["train/grad_norm"] for h in history]),
        "train/lr": history[-1]["train/lr"],
        "train/tokens_per_s": fmean([h["train/tokens_per_s"] for h in history]),
        "train/sft_steps": n_steps,
    }


def build_learner(args, runtime):
    """{"policy", "tokenizer", "optimizer" (AdamW, sft.py's betas), "scheduler" (constant: the
    number of optimizer steps depends on what is kept)}; a resumed run's optimizer state."""
    policy, tokenizer = grpo.load_policy(args.resume or args.model, args, runtime)
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95)
    )
    if args.resume:
        saved = torch.load(os.path.join(args.resume, "optimizer.pt"), map_location="cpu")
        optimizer.load_state_dict(saved)
        # this run's --lr (a resume may override it): the saved groups hold the old one
        for group in optimizer.param_groups:
            group["lr"] = args.lr
            group["initial_lr"] = args.lr
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
    return {
        "policy": policy,
        "tokenizer": tokenizer,
        "optimizer": optimizer,
        "scheduler": scheduler,
    }


# ----------------------------------------------------------------------------- main
# The keys every step row has (a step that keeps nothing lacks the SFT ones: train/loss,
# train/nll_per_token, train/grad_norm, train/lr, train/tokens_per_s, train/sft_steps, and the
# kept ones: train/entropy_kept, train/kept_len_mean). The README's glossary explains each.
STEP_KEYS = [
    "step",
    "opt_step",
    "train/reward",
    "train/format_reward",
    "train/answer_reward",
    "train/kept_frac",
    "train/entropy",
    "train/response_len_mean",
    "train/response_len_max",
    "train/truncation_rate",
    "time/generation",
    "time/grading",
    "time/entropy",
    "time/training",
    "time/weight_sync",
    "time/step",
    "time/wall",
]
SFT_KEYS = [
    "train/loss",
    "train/nll_per_token",
    "train/grad_norm",
    "train/lr",
    "train/tokens_per_s",
    "train/sft_steps",
    "train/entropy_kept",
    "train/kept_len_mean",
]
# The per-step stdout line: (key, format) of each metric it shows
STEP_LINE = [
    ("train/answer_reward", ".3f"),
    ("train/kept_frac", ".3f"),
    ("train/entropy", ".3f"),
    ("train/entropy_kept", ".3f"),
    ("train/response_len_mean", ".1f"),
    ("train/loss", ".4f"),
    ("train/sft_steps", "d"),
    ("time/generation", ".1f"),
    ("time/training", ".1f"),
]


def step_line(step, args, row):
    """The per-step stdout line: the STEP_LINE metrics that the row has."""
    parts = []
    for key, fmt in STEP_LINE:
        if key in row:
            parts.append(f"{key.split('/')[1]} {row[key]:{fmt}}")
    return f"step {step + 1}/{args.n_ei_steps} | " + " | ".join(parts)


def main(args):
    from tqdm import tqdm

    import plot

    # SIGTERM stops the run as Ctrl-C does: the step in flight finishes, the steps done are saved
    common.stop_on_sigterm()
    runtime = grpo.setup_runtime(args)
    if args.dry_run:
        common.dry_run(args, runtime)  # the effective settings as one JSON line; nothing loaded
    torch.manual_seed(args.seed)
    common.claim_run_dir(args.out, args.resume)  # an existing run needs --resume; checked writable
    try:
        train_rows, val_rows = load_data(args)
        learner = build_learner(args, runtime)
        policy = learner["policy"]
        state = {"step": 0, "opt_step": 0, "wall": 0.0}
        if args.resume:
            saved = common.restore_checkpoint(args.resume, args.out)
            state = {k: v for k, v in saved.items() if k in state}
        engine = grpo.make_engine(args.resume or args.model, args, runtime, policy)
    except KeyboardInterrupt:
        grpo.stopped(f"{common.stop_name()} while loading: stopped before training; nothing saved")
    data.write_json_atomic(os.path.join(args.out, "args.json"), common.jsonable(vars(args)))
    data.write_json_atomic(os.path.join(args.out, "runtime.json"), common.jsonable(runtime))
    wandb_run = common.start_wandb(args.wandb, args, {"train/*": "step", "eval/*": "step"})
    print(
        f"{len(train_rows)} train / {len(val_rows)} val questions | "
        f"{args.ei_batch_size} questions x {args.group_size} samples a step | "
        f"{args.profile} profile | out {args.out}",
        flush=True,
    )
    t_run = time.perf_counter() - state["wall"]  # a resumed run's clock goes on
    sync_s = 0.0  # the last weight sync: counted in the next step's time
    dirty = False  # inside a step's updates: nothing consistent to save
    interrupted = False
    os.makedirs(os.path.join(args.out, "rollouts"), exist_ok=True)
    try:
        steps = tqdm(
            range(state["step"], args.n_ei_steps), initial=state["step"], total=args.n_ei_steps
        )
        for step in steps:
            t_step = time.perf_counter()
            # --- rollout + reward: G samples per question from the engine, which holds pi_step ---
            batch, stats = sample(engine, train_rows, args, step)
            # --- keep: the correct responses ---
            kept = keep_correct(batch, args)
            # --- eval: greedy on the engine's weights, the policy after `step` EI steps ---
            if args.eval_every and step % args.eval_every == 0:
                eval_s = grpo._eval_and_dump(
                    engine, val_rows, args, step, state, t_run, batch, wandb_run
                )
                t_step += eval_s  # not step time
            # --- entropy of every sampled response under pi_step (grpo.py's train/entropy) ---
            t1 = time.perf_counter()
            entropy = response_entropy(policy, batch, args, runtime)
            metrics = summarize(batch, kept, entropy, stats)
            metrics["time/entropy"] = time.perf_counter() - t1
            if args.sleep_engine:
                engines.sleep_engine(engine)  # one shared GPU: the engine leaves it while training
            # --- train: SFT on the kept responses; log. A first Ctrl-C lets this finish, so the
            # saved weights, optimizer and step counter agree ---
            with common.finish_then_interrupt("this step's updates"):
                dirty = True
                t2 = time.perf_counter()
                train_metrics = sft_on_kept(learner, batch, kept, args, runtime, step)
                metrics["time/training"] = time.perf_counter() - t2
                opt_step = state["opt_step"] + train_metrics.get("train/sft_steps", 0)
                row = {"step": step, "opt_step": opt_step, **metrics, **train_metrics}
                row["time/weight_sync"] = sync_s
                row["time/step"] = time.perf_counter() - t_step + sync_s
                row["time/wall"] = time.perf_counter() - t_run
                common.log_row(args.out, row, wandb_run)
                tqdm.write(step_line(step, args, row))
                state["step"] = step + 1
                state["opt_step"] = opt_step
                state["wall"] = time.perf_counter() - t_run
                dirty = False
            # --- save ---
            if args.save_every and (step + 1) % args.save_every == 0:
                common.save_model_checkpoint(
                    args.out,
                    policy,
                    learner["tokenizer"],
                    args,
                    state,
                    {"optimizer.pt": learner["optimizer"].state_dict()},
                )
            # --- sync weights into the engine for the next rollout ---
            if args.sleep_engine:
                sync_s = engines.wake_engine(engine, policy)  # wakes it, then pushes the weights
            else:
                sync_s = engines.load_policy_into_vllm(policy, engine)
    except KeyboardInterrupt:
        interrupted = True
        if dirty:
            grpo.stopped(
                f"aborted inside step {state['step']}'s updates: nothing saved; "
                f"--resume {args.out} restarts from the last checkpoint"
            )
        print(
            f"\n{common.stop_name()}: saving checkpoint and plots (resume restarts at step "
            f"{state['step']})",
            flush=True,
        )
    if not interrupted:
        try:
            grpo._eval_and_dump(
                engine, val_rows, args, args.n_ei_steps, state, t_run, None, wandb_run
            )
        except KeyboardInterrupt:
            interrupted = True  # every step is trained: save them; a resume runs the eval
            print(f"\n{common.stop_name()}: final eval skipped; saving checkpoint", flush=True)
    # --- save: a stop request lets it finish, unless the run is stopping already ---
    state["wall"] = time.perf_counter() - t_run
    guard = common.finish_then_interrupt("the checkpoint save")
    if interrupted:
        guard = contextlib.nullcontext()
    path = None
    try:
        with guard:
            path = common.save_model_checkpoint(
                args.out,
                policy,
                learner["tokenizer"],
                args,
                state,
                {"optimizer.pt": learner["optimizer"].state_dict()},
            )
            plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
    except KeyboardInterrupt:
        interrupted = True
        if path is None:
            grpo.stopped(
                f"{common.stop_name()} again while saving: stopped; {args.out} keeps its last "
                f"complete checkpoint"
            )
    print(f"checkpoint {path} | dashboard + metrics in {args.out} | {state['wall']:.0f}s")
    if wandb_run is not None:
        wandb_run.finish()
    if interrupted:
        raise SystemExit(common.stop_exit_code())  # 130 / 143, after everything is saved


if __name__ == "__main__":
    main(parse_args())
