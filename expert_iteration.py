"""Expert iteration (rejection-sampling fine-tuning): sample, keep the correct, SFT on it, repeat.

Seed 001 (Problem 15) compares GRPO's entropy with "what you observed in the EI experiment", and the
lecture sets expert iteration beside policy gradients; no seed gives its settings, so PROFILES holds
ours (docs/settings.md lists them). Each step of `main`:
  rollout + reward  `sample`: --ei-batch-size questions, --group-size engine samples each, graded
                    (with --tools, multi-turn: the policy calls a tool mid-response, tools.py)
  keep              `keep_correct`: the responses with answer reward 1 that the engine finished
                    (at most --max-per-question of a question's)
  (eval)            every --eval-every steps, greedy, on the engine's weights (grpo.py's)
  entropy           `response_entropy`: a no-grad pass of the policy over every sampled response,
                    at the sampling temperature, as grpo.py's train/entropy reads it
  train             SFT on the kept pairs, --epochs passes of --batch-size optimizer steps of
                    sft.py's `train_step` (its loss, microbatches and clipping); log
  save, sync        a checkpoint every --save-every steps; the new weights into the engine
It reuses grpo.py's flag groups, data loading, learner, engine, sampling, validation, checkpoint
and run end, tools.py's flags and tool, and sft.py's train step.

How it departs from the lecture's loop and from grpo.py:
- it trains on the kept responses' text, re-tokenised (sft.py's train step), not on the engine's
  token ids: what SFT on a data set of filtered samples does; a response the engine ended with its
  EOS token keeps it (as text), so the model learns to stop;
- with --tools it trains on the engine's token ids instead (a transcript re-tokenised would not
  give them back), with loss only on the tokens the policy sampled: the tool output is context.
  A kept response is one whose own text (tool output left out) is correct and that the engine
  finished; train/loss sums, and train/nll_per_token averages, over its policy tokens only;
- a correct response cut at --max-tokens is not kept (train/truncated_correct_frac counts them);
- the lr is constant: how many optimizer steps a run takes depends on how much is kept;
- the policy and its AdamW state carry over from step to step (no restart from the base model);
- each epoch is a seeded permutation of the kept pairs cut into optimizer steps of --batch-size,
  the last one smaller (its loss still the mean over its pairs): no pair is repeated to fill a step;
- a step that keeps nothing trains nothing (a notice; its row has no train/loss).
Without --model this is the offline demo: the embedded model on CPU, 5 steps of 48 questions x 8
samples, the 1920 sampled responses of grpo.py's demo (30 steps x 64).

Examples:
  python expert_iteration.py                                     # offline CPU demo
  python expert_iteration.py --model Qwen/Qwen3-0.6B --task gsm8k \\
      --train-path gsm8k_train.jsonl --val-path gsm8k_test.jsonl --out runs/gsm8k_ei
  python expert_iteration.py --group-size 16 --max-per-question 2 --epochs 1 --dry-run
  python expert_iteration.py --tools calculator --out runs/ei_calculator   # the demo, with a tool
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
import grpo
import hardware
import lora
import losses
import metric_table
import rollout as engines
import runs
import sft
import tools

# The settings table (no seed defines expert iteration's: these are our choices, listed in
# docs/settings.md). An unset flag takes its value from the run's profile: "demo" (the embedded
# model, offline on CPU) or "hub" (any other model).
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
    """The flags, grouped as --help shows them; an unset flag comes from PROFILES (see resolve).
    The groups named in grpo.py are grpo.py's flags, with the same meaning."""
    p = common.Parser(
        description="Expert iteration: SFT on the policy's own correct samples. "
        "Unset flags come from PROFILES."
    )
    pos = common.positive_int
    grpo.model_and_data_flags(p)  # --- model and data ---
    g = p.add_argument_group("expert iteration")  # --- expert iteration ---
    g.add_argument("--n-ei-steps", type=pos, default=None, help="sample-filter-SFT rounds")
    g.add_argument("--ei-batch-size", type=pos, default=None, help="questions sampled per step")
    g.add_argument("--group-size", type=pos, default=None, help="G samples per question")
    g.add_argument(
        "--max-per-question",
        type=common.nonneg_int,
        default=0,
        help="keep at most this many correct responses of a question (0 = all)",
    )
    g = p.add_argument_group("SFT (sft.py's train step)")  # --- SFT ---
    g.add_argument(
        "--lr", type=common.positive_float, default=None, help="AdamW learning rate (constant)"
    )
    g.add_argument(
        "--epochs",
        type=common.positive_float,
        default=None,
        help="passes over each step's kept pairs",
    )
    g.add_argument(
        "--batch-size", type=pos, default=None, help="pairs per optimizer step (at most)"
    )
    g.add_argument(
        "--gradient-accumulation-steps",
        type=pos,
        default=None,
        help="microbatches per optimizer step of --batch-size pairs",
    )
    g.add_argument(
        "--normalize-constant",
        type=common.positive_float,
        default=1.0,
        help="per-pair summed NLL is divided by this (sft.py's)",
    )
    grpo.trainer_flags(g)  # --max-grad-norm, --gradient-checkpointing, --dtype, --pure-bf16
    grpo.sampling_flags(p)  # --- sampling ---
    tools.add_flags(p)  # --- tools: --tools, --max-tool-calls, ... (tools.py) ---
    grpo.eval_flags(p)  # --- eval and logging ---
    grpo.systems_flags(p)  # --- systems ---
    grpo.run_flags(p)  # --- run ---
    lora.add_flags(p)  # --- lora: --lora-rank, ... (lora.py) ---
    args = p.parse_args(argv)
    if args.resume:
        runs.resume_from(p, argv, args, needs=("optimizer.pt",))
    return resolve(args)


def resolve(args):
    """Profile defaults, derived sizes and every consistency check, each a one-line error naming
    the fix. Nothing is loaded."""
    if data.is_embedded(args.model):
        args.profile = "demo"
    else:
        args.profile = "hub"
    lora.check_flags(args)
    # a resumed run loads its checkpoint (a LoRA checkpoint's adapter goes on --model's base)
    if not args.resume or args.lora_rank:
        args.model = common.check_model_dir(args.model or data.EMBEDDED_MODEL)
    for name, value in PROFILES[args.profile].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    task = data.task_defaults(args.task, args.model)
    tools.resolve(args, task)  # --prompt's default, --tools' defaults and checks
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
    compute = hardware.resolve_precision(args.policy_device, args.dtype, args.pure_bf16)[1]
    args.compute_dtype = str(compute).split(".")[-1]  # torch.float32 -> "float32"
    # what grpo.py's functions read that this script has no flag for: no frozen reference model
    # (grpo.make_engine sizes the engine's GPU share with it), every response token scored
    # (grpo.collate)
    args.frozen_models = 0
    args.needs_ref = False  # no KL anywhere: grpo.build_learner keeps no reference model
    args.advantages_read_log_probs = False
    args.kl_every = 0
    args.mask_truncated = False
    args.mask_void_turns = False
    # grpo.rollout spaces a tool run's turns by 2 x the step's samples (its seeds: checked below)
    args.rollout_batch_size = args.ei_batch_size * args.group_size

    check = common.check
    check(
        args.batch_size % args.gradient_accumulation_steps == 0,
        "--batch-size must be divisible by --gradient-accumulation-steps",
    )
    args.micro_batch_size = args.batch_size // args.gradient_accumulation_steps
    grpo.check_data(args)  # --pass-rates with --keep-pass-rate (grpo.load_rows filters)
    grpo.check_sampling(args)
    grpo.check_systems(args)
    grpo.check_keep_checkpoints(args)
    lora.check_export_dir(args)
    # grpo.sample_seed's blocks: 16 bits each for --seed and the step, 2^20 seeds a step
    check(
        args.seed < grpo.SEED_SPACE and args.n_ei_steps < grpo.SEED_SPACE,
        f"--seed and --n-ei-steps must be < {grpo.SEED_SPACE}",
    )
    check(
        args.ei_batch_size * args.group_size <= 2**20,
        "--ei-batch-size x --group-size must be <= 2^20",
    )
    # with a tool, turn t samples from seed + t x that stride: all turns in the step's 2^20 seeds
    check(
        not args.tools
        or (args.max_tool_calls + 1) * 2 * args.ei_batch_size * args.group_size <= 2**20,
        "(--max-tool-calls + 1) x 2 x --ei-batch-size x --group-size must be <= 2^20 (the step's "
        "seeds)",
    )
    check(
        not args.thinking_budget or 2 * 2 * args.ei_batch_size * args.group_size <= 2**20,
        "--thinking-budget: 2 x 2 x --ei-batch-size x --group-size must be <= 2^20 (the step's "
        "seeds)",
    )
    args.tool_isolated = tools.isolated(args)  # last: it may start a probe call
    return args


def load_data(args):
    """(train rows, validation rows), each row with its formatted "prompt" (grpo.load_rows). Missing
    or empty data, or fewer questions than --ei-batch-size, is a one-line error."""
    train, val = grpo.load_rows(args)
    fix = "more data or a smaller --ei-batch-size"
    if args.pass_rates:
        fix = "a wider --keep-pass-rate, more data or a smaller --ei-batch-size"
    common.check(
        len(train) >= args.ei_batch_size,
        f"{len(train)} train questions < --ei-batch-size {args.ei_batch_size}: {fix}",
    )
    return train, val


# ----------------------------------------------------------------------------- sample / keep
def sample(engine, train_rows, args, step, tool=None):
    """--ei-batch-size questions, G engine samples each, graded -> (batch: grpo.rollout's
    group-major lists plus "rewards" (the reward dicts), "stop_token_ids" (the engine's) and
    "ban_token_ids" (those, with --min-tokens), stats: seconds of generation and grading, and with
    a tool of its calls). The questions and seeds are grpo.py's for the step. tool: the run's
    tools.Tool (--tools: multi-turn samples, their policy's own text graded), else None."""
    t0 = time.perf_counter()
    seed = grpo.sample_seed(args, step)
    questions = random.Random(seed).sample(train_rows, args.ei_batch_size)
    tool_s = 0.0  # the tool's clock before this rollout
    if tool is not None:
        tool_s = tool.seconds
    batch = grpo.rollout(engine, questions, args, seed, tool)
    t1 = time.perf_counter()
    batch["rewards"] = grader.grade_batch(
        grader.REWARD_FNS[args.reward],
        batch["responses"],
        batch["ground_truths"],
        workers=args.grader_workers,
    )
    # the engine's stop token ids (its EOS): a kept response that ended with one trains on it
    batch["stop_token_ids"] = engines.min_tokens_banned_ids(engine)
    batch["ban_token_ids"] = []
    if args.min_tokens:
        batch["ban_token_ids"] = batch["stop_token_ids"]  # the entropy bans them too
    stats = {"generation_s": t1 - t0, "grading_s": time.perf_counter() - t1}
    if tool is not None:
        stats["tool_s"] = tool.seconds - tool_s
        stats["generation_s"] -= stats["tool_s"]  # as grpo.py's time/generation: not the calls
    return batch, stats


def keep_correct(batch, args):
    """The rows of `batch` to train on: each response with answer reward 1 (the one meaning of
    accuracy) that the engine finished (one cut at --max-tokens would teach the model to ramble
    on: summarize counts those), the first --max-per-question of a question's G when that is set.
    With --tools the reward is the policy's own text's and a response a tool output ended
    (truncated_by_tool) is not finished."""
    G = args.group_size
    kept = []
    for start in range(0, len(batch["rewards"]), G):
        n_kept = 0  # this question's kept responses
        for i in range(start, start + G):
            if not grader.is_correct(batch["rewards"][i]) or batch["truncated"][i]:
                continue
            if args.max_per_question and n_kept == args.max_per_question:
                break
            kept.append(i)
            n_kept += 1
    return kept


def response_entropy(policy, batch, args, runtime):
    """-> (N,) summed token entropy of each response and (N,) its token count, under `policy` at the
    sampling temperature with the min_tokens ban, on the engine's tokens: what grpo.py's training
    forward reads as train/entropy, here from a no-grad pass. With --tools, over the tokens the
    policy sampled (not the tool output)."""
    tensors = grpo.collate(batch, args)  # (N, T) ids, labels, masks
    mask = tensors["policy_mask"]  # (N, T) the sampled tokens: every response token without a tool
    N = mask.shape[0]
    sums = torch.zeros(N)  # (N,)
    device = runtime["policy_device"]
    rows = torch.arange(N)
    policy.eval()
    with torch.inference_mode(), hardware.autocast(device, runtime["compute_dtype"]):
        for start in range(0, N, args.micro_batch_size):
            chunk = rows[start : start + args.micro_batch_size]
            for idx, mb, L, P in grpo.forward_passes(
                tensors, chunk, runtime["shared_prefix"], device
            ):
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
    responses and over the kept ones (token-weighted, as grpo.py's train/entropy), lengths (with
    --tools, the tokens the policy sampled, and grpo.py's tool/ metrics)."""
    sums, counts = entropy
    rewards = batch["rewards"]
    lengths = [len(ids) for ids in batch["response_ids"]]
    if "policy_masks" in batch:
        lengths = [sum(mask) for mask in batch["policy_masks"]]  # the tokens the policy sampled
    cut_correct = []  # 1 for a correct response cut at --max-tokens (not kept), else 0
    for d, truncated in zip(rewards, batch["truncated"]):
        cut_correct.append(int(grader.is_correct(d) and truncated))
    metrics = {
        "train/reward": fmean([d["reward"] for d in rewards]),
        "train/format_reward": fmean([d["format_reward"] for d in rewards]),
        "train/answer_reward": fmean([d["answer_reward"] for d in rewards]),
        "train/kept_frac": len(kept) / len(rewards),
        "train/truncated_correct_frac": fmean(cut_correct),
        "train/entropy": (sums.sum() / counts.sum().clamp(min=1)).item(),
        "train/response_len_mean": fmean(lengths),
        "train/response_len_max": max(lengths),
        "train/truncation_rate": fmean(batch["truncated"]),
        "time/generation": stats["generation_s"],
        "time/grading": stats["grading_s"],
    }
    if "calls" in batch:  # --tools
        metrics |= grpo.tool_metrics(batch)
        metrics["time/tool"] = stats["tool_s"]
    if kept:  # nothing kept: no kept-response metrics
        rows = torch.tensor(kept)
        metrics["train/entropy_kept"] = (sums[rows].sum() / counts[rows].sum().clamp(min=1)).item()
        metrics["train/kept_len_mean"] = fmean([lengths[i] for i in kept])
    return metrics


# ----------------------------------------------------------------------------- train
def sft_pairs(batch, kept, tokenizer):
    """The kept responses as sft.py's pairs {"prompt", "response", "n_tokens"}. The response is the
    engine's text; when its token ids ended with a stop token (the engine's EOS) that token is
    appended as text, which the tokenizer reads back as the one special id: the decoded text drops
    it, and without it a prompt with no stop string never teaches the model to stop.
    With --tools or --thinking-budget, id pairs instead (tool_pairs)."""
    if "policy_masks" in batch:
        return tool_pairs(batch, kept)
    stop_ids = set(batch["stop_token_ids"])
    pairs = []
    for i in kept:
        response = batch["responses"][i]
        response_ids = batch["response_ids"][i]
        if response_ids and response_ids[-1] in stop_ids:
            response = response + tokenizer.decode(response_ids[-1:])  # e.g. "<|im_end|>"
        n_tokens = len(batch["prompt_ids"][i]) + len(response_ids)  # sorts microbatches
        pairs.append({"prompt": batch["prompts"][i], "response": response, "n_tokens": n_tokens})
    return pairs


def tool_pairs(batch, kept):
    """--tools: the kept responses as sft.py's id pairs {"prompt_ids", "response_ids", "loss_mask",
    "n_tokens"}: the engine's ids as they are, its EOS included (re-tokenising the transcript
    would not give them back), and the policy mask as the loss mask: the tool output is context,
    with no loss (the policy did not write it); so is --thinking-budget's appended </think>.
    n_tokens counts every token (it sorts microbatches); the loss and train/nll_per_token count
    the policy's."""
    pairs = []
    for i in kept:
        pairs.append(
            {
                "prompt_ids": batch["prompt_ids"][i],
                "response_ids": batch["response_ids"][i],
                "loss_mask": batch["policy_masks"][i],
                "n_tokens": len(batch["prompt_ids"][i]) + len(batch["response_ids"][i]),
            }
        )
    return pairs


def sft_batches(n_pairs, args, step):
    """The optimizer steps of one EI step's SFT on n_pairs kept pairs, as lists of pair indices:
    each epoch a seeded permutation of the pairs cut into ceil(pairs / --batch-size) steps of
    nearly equal size (33 pairs at --batch-size 32: 17 + 16, not 32 + a lone pair taking a full
    Adam step); a fractional last epoch takes the first ceil(fraction x n_pairs) of its
    permutation. No pair is in a step twice."""
    n_visits = math.ceil(args.epochs * n_pairs)  # pair visits over all epochs
    batches = []
    for epoch in range(math.ceil(args.epochs)):
        perm = list(range(n_pairs))
        random.Random(f"{args.seed}-{step}-{epoch}").shuffle(perm)
        perm = perm[: n_visits - epoch * n_pairs]  # all of it, but in a fractional last epoch
        n_steps = math.ceil(len(perm) / args.batch_size)  # this epoch's optimizer steps
        size, extra = divmod(len(perm), n_steps)  # the first `extra` steps take one pair more
        start = 0
        for i in range(n_steps):
            n = size
            if i < extra:
                n += 1
            batches.append(perm[start : start + n])
            start += n
    return batches


def sft_on_kept(learner, batch, kept, args, runtime, step):
    """SFT on the kept responses: sft.train_step on each of sft_batches' steps (the loss is the
    mean over a step's pairs, also in a smaller last one). -> the step's train metrics ({} with a
    notice when nothing is kept: no update)."""
    if not kept:
        print(f"notice: step {step}: no correct response kept; no SFT update this step")
        return {}
    pairs = sft_pairs(batch, kept, learner["tokenizer"])
    history = []
    for chosen in sft_batches(len(pairs), args, step):
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
        "train/sft_steps": len(history),
    }


def build_learner(args, runtime):
    """grpo.build_learner's {"policy", "tokenizer", "optimizer" (AdamW; a resumed run's state)}
    (no frozen models), plus "scheduler" for sft.train_step: constant, as the number of optimizer
    steps depends on what is kept."""
    learner = grpo.build_learner(args, runtime)
    learner["scheduler"] = torch.optim.lr_scheduler.ConstantLR(learner["optimizer"], factor=1.0)
    return learner


# ----------------------------------------------------------------------------- main
# The keys every step row has (metric_table.py's), those a --tools run adds, and those a step that
# keeps nothing lacks: the SFT's on the kept responses (the other train/ keys of some rows).
STEP_KEYS = metric_table.step_keys("expert_iteration")
TOOL_KEYS = metric_table.tool_keys("expert_iteration")
SFT_KEYS = [
    key
    for key in metric_table.some_keys("expert_iteration")
    if key.startswith("train/") and key not in TOOL_KEYS
]


def step_line(step, args, row):
    """The per-step stdout line: the metrics the table puts on this script's line."""
    return metric_table.step_line("expert_iteration", f"step {step + 1}/{args.n_ei_steps}", row)


def main(args):
    from tqdm import tqdm

    # SIGTERM stops the run as Ctrl-C does: the step in flight finishes, the steps done are saved
    runs.stop_on_sigterm()
    runtime = grpo.setup_runtime(args)
    if args.dry_run:
        runs.dry_run(args, runtime)  # the effective settings as one JSON line; nothing loaded
    torch.manual_seed(args.seed)
    runs.claim_run_dir(args.out, args.resume)  # an existing run needs --resume; checked writable
    engines.engine_log(os.path.join(args.out, "engine.log"))  # console: real problems only
    try:
        train_rows, val_rows = load_data(args)
        learner = build_learner(args, runtime)
        policy = learner["policy"]
        state = grpo.start_state(args)  # a resumed run's counters
        engine = grpo.make_engine(lora.model_path(args), args, runtime, policy)
        if args.resume and args.lora_rank:
            engines.load_policy_into_vllm(policy, engine)  # the base + the checkpoint's adapter
        tool = tools.make(args)  # --tools: the tool the rollouts and validation call, else None
    except KeyboardInterrupt:
        grpo.stopped(f"{runs.stop_name()} while loading: stopped before training; nothing saved")
    grpo.write_settings(args, runtime)  # args.json, runtime.json
    wandb_run = runs.start_wandb(args.wandb, args, {"train/*": "step", "eval/*": "step"})
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
    # python's sandbox pool closes however the run ends: finished, stopped (Ctrl-C, SIGTERM: both
    # exit through SystemExit) or failed
    try:
        try:
            steps = tqdm(
                range(state["step"], args.n_ei_steps), initial=state["step"], total=args.n_ei_steps
            )
            for step in steps:
                t_step = time.perf_counter()
                # --- rollout + reward: G samples per question from the engine (pi_step) ---
                batch, stats = sample(engine, train_rows, args, step, tool)
                # --- keep: the correct responses ---
                kept = keep_correct(batch, args)
                # --- eval: greedy on the engine's weights, the policy after `step` EI steps ---
                if args.eval_every and step % args.eval_every == 0:
                    eval_s = grpo.evaluate_and_dump(
                        engine, val_rows, args, step, state, t_run, batch, wandb_run, tool
                    )
                    t_step += eval_s  # not step time
                # --- entropy of every sampled response under pi_step (grpo.py's train/entropy) ---
                t1 = time.perf_counter()
                entropy = response_entropy(policy, batch, args, runtime)
                metrics = summarize(batch, kept, entropy, stats)
                metrics["time/entropy"] = time.perf_counter() - t1
                if args.sleep_engine:
                    # one shared GPU: the engine leaves it while training
                    engines.sleep_engine(engine)
                # --- train: SFT on the kept responses; log. A first Ctrl-C lets this finish, so
                # the saved weights, optimizer and step counter agree ---
                with runs.finish_then_interrupt("this step's updates"):
                    dirty = True
                    t2 = time.perf_counter()
                    train_metrics = sft_on_kept(learner, batch, kept, args, runtime, step)
                    metrics["time/training"] = time.perf_counter() - t2
                    opt_step = state["opt_step"] + train_metrics.get("train/sft_steps", 0)
                    row = {"step": step, "opt_step": opt_step, **metrics, **train_metrics}
                    row["time/weight_sync"] = sync_s
                    row["time/step"] = time.perf_counter() - t_step + sync_s
                    row["time/wall"] = time.perf_counter() - t_run
                    runs.log_row(args.out, row, wandb_run)
                    tqdm.write(step_line(step, args, row))
                    state["step"] = step + 1
                    state["opt_step"] = opt_step
                    state["wall"] = time.perf_counter() - t_run
                    dirty = False
                # --- save ---
                if args.save_every and (step + 1) % args.save_every == 0:
                    grpo.save_checkpoint(learner, args, state)
                # --- sync weights into the engine for the next rollout ---
                sync_s = grpo.sync_weights(engine, policy, args)
        except KeyboardInterrupt:
            interrupted = True
            grpo.stopped_in_loop(args, state, dirty)  # exits if inside a step's updates
        # --- final eval (not after a stop request), save, exit ---
        grpo.finish_run(
            engine,
            val_rows,
            learner,
            args,
            args.n_ei_steps,
            state,
            t_run,
            wandb_run,
            interrupted,
            tool,
        )
    finally:
        if tool is not None:
            tool.close()  # the sandbox workers


if __name__ == "__main__":
    main(parse_args())
