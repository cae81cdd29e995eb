"""GRPO with verifiable rewards: the training loop of seed 000 §7 (Algorithm 2), one flat loop.

Each step: sample questions -> G samples each from the engine (vLLM, or transformers with --engine hf)
-> grade -> group-normalised advantages -> old log-probs once per rollout batch (inference mode) when
off-policy -> epochs x train batches x microbatches with gradient accumulation, clip, AdamW -> log ->
eval -> save -> push the new weights into the engine.

Departures from the seeds (all visible as flags):
  * trains on the engine's sampled token ids (prompt_token_ids + token_ids), never re-tokenised text,
    scored with log_softmax(logits / temperature): exactly the tokens and distribution vLLM sampled;
  * seed 000's starter block says rollout 16 / train batch 64 / grad-acc 128, which fails its own
    asserts (64 % 128) and its "on-policy: train = rollout" rule; the hub defaults here are the
    consistent 256 / 256 / 128 of seed 001 (micro batch 2), with seed 000's temperature 0.7;
  * extra loss types grpo_no_clip / gspo, --cliprange-high (DAPO), --length-norm token, --kl-beta;
  * KL to the initial policy and between consecutive policies is logged (seed 004 §3.2, k3);
  * eval at step s is greedy on the engine's weights, i.e. the policy after s GRPO steps (step 0 =
    the starting model); the final eval runs after the last weight push.
With no --model it is the offline demo: embedded tiny model, synthetic Countdown, engine on CPU,
small batches (the DEMO profile below). It learns only if the starting model solves a few percent of
sampled problems: a group whose samples all score the same has zero advantage and no gradient.

Examples:
  python grpo.py                                                       # offline CPU demo
  python grpo.py --model Qwen/Qwen2.5-Math-1.5B --lr 3e-5               # seed 000 starter, 2 GPUs
  python grpo.py --model Qwen/Qwen2.5-Math-1.5B --loss grpo_clip --epochs-per-rollout-batch 2 \\
      --train-batch-size 128 --gradient-accumulation-steps 64           # off-policy
  python plot.py runs/a runs/b                                         # overlay runs

Per-step API (grpo_ray.py imports these; names and signatures are kept stable):
  parse_args(argv=None) -> args            flags, profile defaults, derived sizes, asserts; loads nothing
  load_data(args) -> (train_rows, val_rows, template, stop, reward_fn)
  load_policy(path, args) -> (policy, tokenizer)      HF causal LM on args.policy_device
  make_engine(path, args) -> engine                   rollout.init_engine for this run
  sample_questions(train_rows, args, step) -> rows    n_prompts rows, a function of (seed, step) only
  rollout(engine, rows, template, stop, args, step) -> batch    dict of lists, N = rows * G, group-major
  score(batch, reward_fn, args) -> (advantages (N,), raw_rewards (N,), metrics)
  collate(batch, pad_id) -> {"input_ids", "labels", "response_mask" (N, T), "lengths" (N,)}  CPU tensors
  batch_log_probs(model, tensors, args) -> (N, T)      inference mode, micro-batched, at args.temperature
  train_on_batch(policy, optimizer, tensors, advantages, raw_rewards, old_log_probs, ref_log_probs, args, step)
      -> list of metric dicts, one per optimizer step (epochs x train batches x grad-acc microbatches)
  kl_metrics(before, after, ref, tensors) -> {"train/kl_ref", "train/kl_prev"}
  evaluate(engine, val_rows, template, stop, reward_fn, args) -> (metrics, sample rows)
  sync_weights(policy, engine) -> seconds
  save_checkpoint(out_dir, policy, tokenizer, optimizer, args, state) / load_checkpoint(path, policy, optimizer) -> state
  log_row(out_dir, row, wandb_run=None)
"""
import argparse
import json
import math
import os
import random
import shutil
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: weights pushed by reference
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the per-step lines readable
import torch

import data
import grader
import losses
import rollout as engines

ROOT = os.path.dirname(os.path.abspath(__file__))
EMBEDDED = os.path.join(ROOT, "models", "countdown-tiny")

# Defaults that differ between a hub model on GPUs (seed 000's starter hyperparameters) and the offline
# CPU demo on the embedded model. A flag left at None takes its value from the profile in use.
STARTER = dict(lr=1e-5, n_grpo_steps=200, rollout_batch_size=256, group_size=8, train_batch_size=256,
               gradient_accumulation_steps=128, max_tokens=1024, temperature=0.7, eval_every=10, eval_n=1024,
               save_every=50, kl_every=1, train_n=0)
DEMO = dict(lr=1e-4, n_grpo_steps=30, rollout_batch_size=64, group_size=8, train_batch_size=64,
            gradient_accumulation_steps=2, max_tokens=192, temperature=1.0, eval_every=5, eval_n=200,
            save_every=0, kl_every=5, train_n=2000)


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    p = argparse.ArgumentParser(description="GRPO on a verifiable-reward task (seed 000 §7).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model")  # --- model ---
    g.add_argument("--model", default=None, help="HF hub id or local dir (STARTER profile); omitted or models/countdown-tiny = the DEMO profile")
    g.add_argument("--task", default="countdown", choices=sorted(data.TASKS), help="task (data.load_task)")
    g.add_argument("--prompt", default=None, help="prompts/<name>.prompt; default: the task's (data.TASKS)")
    g.add_argument("--reward", default=None, choices=sorted(grader.REWARD_FNS), help="reward fn; default: the task's")
    g.add_argument("--train-path", default=None, help="local train file (json/jsonl); default: synthetic / hub")
    g.add_argument("--val-path", default=None, help="local validation file; default: the task's test split")
    g.add_argument("--train-n", type=int, default=None, help="train questions to load (0 = all; demo 2000: generating is slow)")
    g.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic data set (kept apart from --seed)")
    g = p.add_argument_group("optimisation")  # --- optimisation ---
    g.add_argument("--lr", type=float, default=None, help="AdamW learning rate (starter 1e-5, demo 1e-4)")
    g.add_argument("--n-grpo-steps", type=int, default=None, help="rollout batches to train on (starter 200)")
    g.add_argument("--rollout-batch-size", type=int, default=None, help="responses per step = prompts x group size")
    g.add_argument("--group-size", type=int, default=None, help="G samples per question")
    g.add_argument("--train-batch-size", type=int, default=None, help="responses per optimizer step")
    g.add_argument("--gradient-accumulation-steps", type=int, default=None, help="microbatches per optimizer step")
    g.add_argument("--epochs-per-rollout-batch", type=int, default=1, help="passes over each rollout batch (>1 = off-policy)")
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping value")
    g.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations (memory for time)")
    g = p.add_argument_group("loss")  # --- loss ---
    g.add_argument("--loss", default="reinforce_with_baseline", choices=losses.LOSS_TYPES, help="policy-gradient loss")
    g.add_argument("--cliprange", type=float, default=0.2, help="epsilon of GRPO-Clip / GSPO")
    g.add_argument("--cliprange-high", type=float, default=None, help="upper epsilon (DAPO clip-higher); default = --cliprange")
    g.add_argument("--length-norm", default="masked_mean", choices=losses.LENGTH_NORMS, help="per-sequence reduction")
    g.add_argument("--normalize-constant", type=float, default=None, help="divisor for masked_normalize; default --max-tokens")
    g.add_argument("--std-norm", action=argparse.BooleanOptionalAction, default=True, help="divide advantages by group std")
    g.add_argument("--advantage-eps", type=float, default=1e-6, help="added to the group std")
    g.add_argument("--kl-beta", type=float, default=0.0, help="KL(pi || initial policy) penalty weight (0 = off)")
    g = p.add_argument_group("sampling")  # --- sampling ---
    g.add_argument("--temperature", type=float, default=None, help="rollout temperature; log-probs use the same")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (keep 1.0: log-probs assume full softmax)")
    g.add_argument("--min-tokens", type=int, default=4, help="minimum response tokens (no empty answers)")
    g.add_argument("--max-tokens", type=int, default=None, help="maximum response tokens (seed 002: 256 / 512)")
    g = p.add_argument_group("eval and logging")  # --- eval / logging ---
    g.add_argument("--eval-every", type=int, default=None, help="greedy validation every N steps (0 = start/end only)")
    g.add_argument("--eval-n", type=int, default=None, help="validation questions")
    g.add_argument("--kl-every", type=int, default=None, help="log KL to initial/previous policy every N steps (0 = never)")
    g.add_argument("--grader-workers", type=int, default=2, help="processes for grading")
    g.add_argument("--wandb", default=None, help="wandb project name (off when omitted)")
    g = p.add_argument_group("systems")  # --- systems ---
    g.add_argument("--engine", default="vllm", choices=["vllm", "hf"], help="rollout engine (hf = transformers fallback)")
    g.add_argument("--policy-device", default=None, help="device of the trained policy; default cuda:0, else cpu")
    g.add_argument("--vllm-device", default=None, help="engine device; default cuda:1 with 2 GPUs, else the policy's")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.8, help="vLLM GPU memory fraction (CUDA)")
    g = p.add_argument_group("run")  # --- run ---
    g.add_argument("--seed", type=int, default=0, help="seeds prompts sampling, engine sampling, shuffling, torch")
    g.add_argument("--out", default=None, help="run dir (metrics.jsonl, rollouts/, plots, checkpoint/)")
    g.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (0 = only at the end)")
    g.add_argument("--resume", default=None, help="checkpoint dir (or run dir holding checkpoint/) to continue from")
    args = p.parse_args(argv)

    args.demo = args.model is None or os.path.abspath(args.model) == EMBEDDED
    for k, v in (DEMO if args.demo else STARTER).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.model = args.model or EMBEDDED
    # seed 000 trains Countdown with its own prompt; the embedded model was SFT'd on r1_zero
    args.prompt = args.prompt or ("countdown" if args.task == "countdown" and not args.demo else data.TASKS[args.task]["prompt"])
    args.reward = args.reward or data.TASKS[args.task]["reward"]
    if args.normalize_constant is None:
        args.normalize_constant = float(args.max_tokens)
    args.out = args.out or (os.path.dirname(_ckpt_dir(args.resume)) if args.resume else
                            os.path.join("runs", time.strftime("%Y%m%d-%H%M%S")))

    # derived sizes (seed 000 §7.2 sanity asserts, with what to change)
    assert args.train_batch_size % args.gradient_accumulation_steps == 0, (
        f"--train-batch-size {args.train_batch_size} must be divisible by --gradient-accumulation-steps "
        f"{args.gradient_accumulation_steps}")
    args.micro_train_batch_size = args.train_batch_size // args.gradient_accumulation_steps
    assert args.rollout_batch_size % args.group_size == 0, (
        f"--rollout-batch-size {args.rollout_batch_size} must be divisible by --group-size {args.group_size}")
    args.n_prompts_per_rollout_batch = args.rollout_batch_size // args.group_size
    assert args.train_batch_size >= args.group_size, (
        f"--train-batch-size {args.train_batch_size} must be >= --group-size {args.group_size}")
    assert args.rollout_batch_size % args.train_batch_size == 0, (
        f"--rollout-batch-size {args.rollout_batch_size} must be a multiple of --train-batch-size {args.train_batch_size}")
    args.n_microbatches_per_rollout_batch = args.rollout_batch_size // args.micro_train_batch_size
    args.optimizer_steps_per_rollout_batch = args.epochs_per_rollout_batch * args.rollout_batch_size // args.train_batch_size
    args.off_policy = args.optimizer_steps_per_rollout_batch > 1
    # ratio losses need pi_old; on-policy their ratio is 1 (seed 000: use GRPO-Clip off-policy)
    args.needs_old = args.off_policy or args.loss not in ("no_baseline", "reinforce_with_baseline")
    assert not (args.std_norm and args.group_size < 2), "--std-norm needs --group-size >= 2 (or pass --no-std-norm)"
    assert args.temperature > 0, "--temperature must be > 0 (log-probs of greedy samples are not defined)"
    assert args.n_prompts_per_rollout_batch < 1000, "--rollout-batch-size / --group-size must be < 1000 prompts"
    assert not args.resume or os.path.exists(os.path.join(_ckpt_dir(args.resume), "state.json")), (
        f"--resume {args.resume}: no checkpoint there (expected <run>/checkpoint/state.json)")
    return args


# ----------------------------------------------------------------------------- setup
def resolve_devices(args):
    """Policy on cuda:0 and the engine on cuda:1 when there are 2 GPUs (seed 000 layout); one GPU: shared; else CPU."""
    n_gpu = torch.cuda.device_count()
    if args.policy_device is None:
        args.policy_device = "cuda:0" if n_gpu else "cpu"
    if args.vllm_device is None:
        args.vllm_device = "cuda:1" if n_gpu > 1 else args.policy_device
    args.dtype = "bfloat16" if args.policy_device.startswith("cuda") else "float32"  # CPU bf16 is slow and inexact
    print(f"devices: policy {args.policy_device} ({args.dtype}), engine {args.engine} on {args.vllm_device} "
          f"({n_gpu} GPUs visible)" + (" | one GPU shared: lower --gpu-memory-utilization (e.g. 0.3) to leave room "
                                      "for training" if n_gpu == 1 and args.vllm_device == args.policy_device else ""))


def load_data(args):
    train = data.load_task(args.task, "train", path=args.train_path, limit=args.train_n or None, seed=args.data_seed)
    val = data.load_task(args.task, "test", path=args.val_path, limit=args.eval_n, seed=args.data_seed)
    template = data.load_prompt(args.prompt)
    return train, val, template, data.stop_strings(template), grader.REWARD_FNS[args.reward]


def load_policy(path, args):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(args.policy_device)
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    policy.config.use_cache = False
    return policy.train(), AutoTokenizer.from_pretrained(path)


def make_engine(path, args):
    from transformers import AutoConfig
    max_len = min(getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 4096), 4096)
    kw = dict(gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=max_len) if args.engine == "vllm" else {}
    return engines.init_engine(args.engine, path, device=args.vllm_device, seed=args.seed, **kw)


# ----------------------------------------------------------------------------- rollout / reward
def _step_seed(args, step):
    return args.seed * 1_000_003 + step * 1000  # per-step; rollout.generate adds the prompt index


def sample_questions(train_rows, args, step):
    return random.Random(_step_seed(args, step)).sample(train_rows, args.n_prompts_per_rollout_batch)


def rollout(engine, rows, template, stop, args, step):
    prompts = [data.format_prompt(template, r["question"]) for r in rows]
    outs = engines.generate(engine, prompts, n=args.group_size, temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_tokens, min_tokens=args.min_tokens, stop=stop,
                            seed=_step_seed(args, step))
    flat = [(p, r, o) for p, r, os_ in zip(prompts, rows, outs) for o in os_]  # group-major: G per prompt
    return {"prompts": [p for p, _, _ in flat], "ground_truths": [r["ground_truth"] for _, r, _ in flat],
            "responses": [o["text"] for _, _, o in flat], "prompt_ids": [o["prompt_token_ids"] for _, _, o in flat],
            "response_ids": [o["token_ids"] for _, _, o in flat], "engine_logprobs": [o["logprobs"] for _, _, o in flat],
            "truncated": [o["finish_reason"] == "length" for _, _, o in flat]}


def score(batch, reward_fn, args):
    dicts = grader.grade_batch(reward_fn, batch["responses"], batch["ground_truths"], workers=args.grader_workers)
    batch["rewards"] = dicts
    adv, raw, meta = losses.compute_group_normalized_rewards(
        reward_fn, batch["responses"], batch["ground_truths"], args.group_size, args.advantage_eps, args.std_norm,
        reward_dicts=dicts)
    lens = [len(r) for r in batch["response_ids"]]
    return adv, raw, {
        "train/reward": meta["reward_mean"], "train/format_reward": _mean([d["format_reward"] for d in dicts]),
        "train/answer_reward": _mean([d["answer_reward"] for d in dicts]),
        "train/zero_var_frac": meta["frac_groups_zero_std"], "train/response_len_mean": _mean(lens),
        "train/response_len_max": max(lens), "train/truncation_rate": _mean(batch["truncated"])}


def _mean(xs):
    xs = [float(x) for x in xs]
    return sum(xs) / max(len(xs), 1)


def collate(batch, pad_id):
    """Right-padded engine token ids; labels are the next tokens, the mask marks sampled response tokens."""
    seqs = [p + r for p, r in zip(batch["prompt_ids"], batch["response_ids"])]
    ids = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)  # (N, T+1)
    mask = torch.zeros(ids.shape, dtype=torch.bool)  # (N, T+1)
    for i, (p, r) in enumerate(zip(batch["prompt_ids"], batch["response_ids"])):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        mask[i, len(p):len(p) + len(r)] = True
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "response_mask": mask[:, 1:],  # (N, T)
            "lengths": torch.tensor([len(s) - 1 for s in seqs])}  # (N,) label positions per row


def _micro(tensors, idx, device):
    """Rows idx, trimmed to their longest sequence (less padding per microbatch), on device."""
    L = int(tensors["lengths"][idx].max())
    return {k: tensors[k][idx, :L].to(device) for k in ("input_ids", "labels", "response_mask")}, L


# ----------------------------------------------------------------------------- log-probs / train
def batch_log_probs(model, tensors, args):
    """(N, T) log-probs of the labels at the sampling temperature, no grad (old / ref / post-step policy)."""
    N, T = tensors["labels"].shape
    out = torch.zeros(N, T)
    dev = next(model.parameters()).device
    with torch.inference_mode():
        for s in range(0, N, args.micro_train_batch_size):
            idx = torch.arange(s, min(s + args.micro_train_batch_size, N))
            mb, L = _micro(tensors, idx, dev)
            out[idx, :L] = losses.get_response_log_probs(model, mb["input_ids"], mb["labels"],
                                                         temperature=args.temperature)["log_probs"].float().cpu()
    return out.clone()  # a normal tensor: inference tensors cannot enter autograd later


def train_on_batch(policy, optimizer, tensors, advantages, raw_rewards, old_log_probs, ref_log_probs, args, step):
    """epochs x (rollout / train batch) optimizer steps, each over grad-acc microbatches; one metrics dict per step."""
    N, dev = len(advantages), args.policy_device
    gen = torch.Generator().manual_seed(_step_seed(args, step))
    params = [p for p in policy.parameters() if p.requires_grad]
    history = []
    for epoch in range(args.epochs_per_rollout_batch):
        order = torch.randperm(N, generator=gen) if args.off_policy else torch.arange(N)
        for b in range(0, N, args.train_batch_size):
            m = {"loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0,
                                          "ratio_mean": 0.0, "ratio_min": math.inf, "ratio_max": -math.inf}
            for s in range(b, b + args.train_batch_size, args.micro_train_batch_size):
                idx = order[s:s + args.micro_train_batch_size]
                mb, L = _micro(tensors, idx, dev)
                out = losses.get_response_log_probs(policy, mb["input_ids"], mb["labels"], return_token_entropy=True,
                                                    temperature=args.temperature)
                lp, mask = out["log_probs"], mb["response_mask"]  # (n, L)
                old = old_log_probs[idx, :L].to(dev) if old_log_probs is not None else None
                ref = ref_log_probs[idx, :L].to(dev) if (ref_log_probs is not None and args.kl_beta) else None
                loss, meta = losses.grpo_microbatch_train_step(
                    lp, mask, args.gradient_accumulation_steps, args.loss, raw_rewards=raw_rewards[idx, None].to(dev),
                    advantages=advantages[idx, None].to(dev), old_log_probs=old, cliprange=args.cliprange,
                    cliprange_high=args.cliprange_high, length_norm=args.length_norm,
                    normalize_constant=args.normalize_constant, ref_log_probs=ref, kl_beta=args.kl_beta)
                m["loss"] += loss.item()
                m["entropy"] += losses.masked_mean(out["token_entropy"].detach(), mask).item() / args.gradient_accumulation_steps
                if old is not None:  # importance ratio pi / pi_old over response tokens
                    ratio = torch.exp(lp.detach() - old)[mask]
                    m["ratio_mean"] += ratio.mean().item() / args.gradient_accumulation_steps
                    m["ratio_min"], m["ratio_max"] = min(m["ratio_min"], ratio.min().item()), max(m["ratio_max"], ratio.max().item())
                    m["clip_fraction"] += float(meta.get("clip_fraction", 0.0)) / args.gradient_accumulation_steps
            grad_norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if old_log_probs is None:
                m.update(ratio_mean=1.0, ratio_min=1.0, ratio_max=1.0)  # on-policy: pi_old is pi by construction
            history.append({f"train/{k}": v for k, v in m.items()} | {
                "train/grad_norm": grad_norm.item(), "train/epoch": epoch})
    return history


def kl_metrics(before, after, ref, tensors):
    """k3 KL on this batch's response tokens: kl_ref = KL(pi_t || pi_init), kl_prev = KL(pi_t || pi_t+1),
    both estimated on samples of pi_t (the policy that generated the batch)."""
    mask = tensors["response_mask"]
    out = {}
    if ref is not None:
        out["train/kl_ref"] = losses.masked_mean(losses.compute_kl(before, ref), mask).item()
    if after is not None:
        out["train/kl_prev"] = losses.masked_mean(losses.compute_kl(before, after), mask).item()
    return out


# ----------------------------------------------------------------------------- eval / io
def evaluate(engine, val_rows, template, stop, reward_fn, args):
    prompts = [data.format_prompt(template, r["question"]) for r in val_rows]
    outs = [o[0] for o in engines.generate(engine, prompts, n=1, temperature=0.0, max_tokens=args.max_tokens,
                                           min_tokens=args.min_tokens, stop=stop)]
    gts = [r["ground_truth"] for r in val_rows]
    dicts = grader.grade_batch(reward_fn, [o["text"] for o in outs], gts, workers=args.grader_workers)
    metrics = {"eval/accuracy": _mean([d["answer_reward"] > 0 for d in dicts]),
               "eval/reward": _mean([d["reward"] for d in dicts]),
               "eval/format_reward": _mean([d["format_reward"] for d in dicts]),
               "eval/answer_reward": _mean([d["answer_reward"] for d in dicts]),
               "eval/response_len": _mean([len(o["token_ids"]) for o in outs]),
               "eval/truncation_rate": _mean([o["finish_reason"] == "length" for o in outs])}
    samples = [{"split": "eval", "prompt": p, "response": o["text"], "ground_truth": g, **d}
               for p, o, g, d in zip(prompts, outs, gts, dicts)]
    return metrics, samples


def sync_weights(policy, engine):
    return engines.load_policy_into_vllm(policy, engine)


def log_row(out_dir, row, wandb_run=None):
    with open(os.path.join(out_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    if wandb_run is not None:
        wandb_run.log(row)


def _ckpt_dir(path):
    return os.path.join(path, "checkpoint") if os.path.isdir(os.path.join(path, "checkpoint")) else path.rstrip("/")


def save_checkpoint(out_dir, policy, tokenizer, optimizer, args, state):
    """out_dir/checkpoint/ = HF weights + tokenizer + optimizer + state.json, swapped in whole (tmp + rename)."""
    final, tmp = os.path.join(out_dir, "checkpoint"), os.path.join(out_dir, "checkpoint.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({**state, "args": vars(args)}, f, indent=1)
    if os.path.exists(final):
        os.replace(final, final + ".old")
    os.replace(tmp, final)
    shutil.rmtree(final + ".old", ignore_errors=True)
    return final


def load_checkpoint(path, policy, optimizer):
    path = _ckpt_dir(path)
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt"), map_location=next(policy.parameters()).device))
    return state


def _line(step, args, row):
    g = row.get
    s = (f"step {step + 1}/{args.n_grpo_steps} | loss {g('train/loss'):+.4f} | reward {g('train/reward'):.3f} "
         f"(fmt {g('train/format_reward'):.2f} ans {g('train/answer_reward'):.2f}) | len {g('train/response_len_mean'):.1f}"
         f"/{g('train/response_len_max')} trunc {g('train/truncation_rate'):.2f} | ent {g('train/entropy'):.3f} "
         f"| gnorm {g('train/grad_norm'):.3f} | clip {g('train/clip_fraction'):.3f} | zero-var {g('train/zero_var_frac'):.2f}")
    if "train/kl_ref" in row:
        s += f" | kl_ref {g('train/kl_ref'):.2e} kl_prev {g('train/kl_prev', float('nan')):.2e}"
    return s + (f" | gen {g('time/generation'):.1f}s train {g('time/training'):.1f}s sync {g('time/weight_sync'):.2f}s"
                f" | {g('time/tokens_per_s'):.0f} tok/s")


# ----------------------------------------------------------------------------- main
def main(args):
    from tqdm import tqdm
    import plot
    torch.manual_seed(args.seed)
    resolve_devices(args)
    os.makedirs(os.path.join(args.out, "rollouts"), exist_ok=True)
    train_rows, val_rows, template, stop, reward_fn = load_data(args)
    start = _ckpt_dir(args.resume) if args.resume else args.model
    policy, tokenizer = load_policy(start, args)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    state = {"step": 0, "opt_step": 0, "wall": 0.0}
    if args.resume:
        state = load_checkpoint(args.resume, policy, optimizer)
        state.pop("args")
        rows = [r for r in data.read_jsonl(os.path.join(args.out, "metrics.jsonl")) if r["step"] < state["step"]] \
            if os.path.exists(os.path.join(args.out, "metrics.jsonl")) else []
        data.write_jsonl_atomic(os.path.join(args.out, "metrics.jsonl"), rows)  # drop rows past the checkpoint
        print(f"resumed from {start} at step {state['step']}")
    need_ref = args.kl_beta > 0 or args.kl_every > 0
    ref_model = load_policy(args.model, args)[0].eval().requires_grad_(False) if need_ref else None  # frozen pi_init
    engine = make_engine(start, args)
    with open(os.path.join(args.out, "args.json"), "w") as f:
        json.dump(vars(args), f, indent=1)
    wandb_run = None
    if args.wandb:
        import wandb
        wandb_run = wandb.init(project=args.wandb, config=vars(args))
        wandb_run.define_metric("train/*", step_metric="opt_step")
        wandb_run.define_metric("eval/*", step_metric="step")  # validation on its own x-axis
    print(f"{len(train_rows)} train / {len(val_rows)} val questions | {args.n_prompts_per_rollout_batch} prompts x "
          f"{args.group_size} samples | {args.optimizer_steps_per_rollout_batch} optimizer steps per rollout batch "
          f"({'off' if args.off_policy else 'on'}-policy) | out {args.out}")

    t_run, sync_s, interrupted = time.perf_counter() - state["wall"], 0.0, False
    step = state["step"]
    try:
        for step in tqdm(range(state["step"], args.n_grpo_steps), initial=state["step"], total=args.n_grpo_steps):
            t_step = time.perf_counter()
            # --- rollout: G samples per question from the engine (holds the current policy) ---
            batch = rollout(engine, sample_questions(train_rows, args, step), template, stop, args, step)
            t_gen = time.perf_counter() - t_step
            # --- reward / advantage ---
            t0 = time.perf_counter()
            advantages, raw_rewards, roll_m = score(batch, reward_fn, args)
            tensors = collate(batch, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
            t_grade = time.perf_counter() - t0
            # --- old log-probs, once per rollout batch, no grad (off-policy ratio; also pi_t for KL) ---
            t0 = time.perf_counter()
            do_kl = args.kl_every > 0 and step % args.kl_every == 0
            old = batch_log_probs(policy, tensors, args) if (args.needs_old or do_kl) else None
            ref = batch_log_probs(ref_model, tensors, args) if (args.kl_beta or do_kl) else None
            t_old = time.perf_counter() - t0
            # --- train: epochs x train batches x microbatches ---
            t0 = time.perf_counter()
            history = train_on_batch(policy, optimizer, tensors, advantages, raw_rewards,
                                     old if args.needs_old else None, ref, args, step)
            t_train = time.perf_counter() - t0
            state["step"] = step + 1  # the policy now holds this step's update (what a Ctrl-C from here saves)
            t0 = time.perf_counter()
            after = batch_log_probs(policy, tensors, args) if do_kl else None  # pi_t+1 on the same tokens
            t_old += time.perf_counter() - t0  # no-grad forwards: old, ref and post-step log-probs
            # --- log: one row per optimizer step ---
            n_tok = int(tensors["response_mask"].sum())
            common = roll_m | (kl_metrics(old, after, ref, tensors) if do_kl else {}) | {
                "train/lr": args.lr, "train/logprob_mismatch": _mismatch(old, batch, tensors),
                "time/generation": t_gen, "time/grading": t_grade, "time/old_log_probs": t_old, "time/training": t_train,
                "time/weight_sync": sync_s, "time/step": time.perf_counter() - t_step + sync_s,
                "time/gen_tokens_per_s": n_tok / max(t_gen, 1e-9)}
            common["time/tokens_per_s"] = n_tok / common["time/step"]
            for h in history:
                state["opt_step"] += 1
                row = {"step": step, "opt_step": state["opt_step"], "time/wall": time.perf_counter() - t_run} | common | h
                log_row(args.out, row, wandb_run)
                tqdm.write(_line(step, args, row))
            # --- eval (greedy, on the engine = policy after `step` updates) ---
            if args.eval_every and step % args.eval_every == 0:
                _eval_and_dump(engine, val_rows, template, stop, reward_fn, args, step, state, t_run, batch, wandb_run)
            # --- save ---
            state["wall"] = time.perf_counter() - t_run
            if args.save_every and (step + 1) % args.save_every == 0:
                save_checkpoint(args.out, policy, tokenizer, optimizer, args, state)
            # --- sync weights into the engine for the next rollout ---
            sync_s = sync_weights(policy, engine)
    except KeyboardInterrupt:
        interrupted = True
        print(f"\ninterrupted at step {step}: saving checkpoint and plots (resume restarts step {state['step']})")
    if not interrupted:
        _eval_and_dump(engine, val_rows, template, stop, reward_fn, args, args.n_grpo_steps, state, t_run, None, wandb_run)
    state["wall"] = time.perf_counter() - t_run
    path = save_checkpoint(args.out, policy, tokenizer, optimizer, args, state)
    plot.plot_runs([args.out], args.out)
    print(f"checkpoint {path} | plots + metrics in {args.out} | {state['wall']:.0f}s")
    if wandb_run is not None:
        wandb_run.finish()


def _mismatch(lp, batch, tensors):
    """Mean |policy - engine| log-prob of the sampled tokens (None when no old log-probs were computed)."""
    if lp is None:
        return None
    eng = torch.zeros_like(lp)
    for i, (p, r) in enumerate(zip(batch["prompt_ids"], batch["engine_logprobs"])):
        eng[i, len(p) - 1:len(p) - 1 + len(r)] = torch.tensor(r, dtype=torch.float32)
    return losses.masked_mean((lp - eng).abs(), tensors["response_mask"]).item()


def _eval_and_dump(engine, val_rows, template, stop, reward_fn, args, step, state, t_run, batch, wandb_run):
    t0 = time.perf_counter()
    metrics, samples = evaluate(engine, val_rows, template, stop, reward_fn, args)
    row = {"step": step, "opt_step": state["opt_step"], "time/wall": time.perf_counter() - t_run,
           "time/eval": time.perf_counter() - t0} | metrics
    log_row(args.out, row, wandb_run)
    print(f"eval step {step} | accuracy {metrics['eval/accuracy']:.3f} | reward {metrics['eval/reward']:.3f} | "
          f"format {metrics['eval/format_reward']:.3f} | len {metrics['eval/response_len']:.1f}", flush=True)
    train = [] if batch is None else [{"split": "train", "prompt": p, "response": r, "ground_truth": g, **d}
                                      for p, r, g, d in zip(batch["prompts"], batch["responses"],
                                                            batch["ground_truths"], batch["rewards"])][:2 * args.group_size]
    data.write_jsonl_atomic(os.path.join(args.out, "rollouts", f"step_{step:04d}.jsonl"), samples[:32] + train)


if __name__ == "__main__":
    try:
        cli_args = parse_args()
    except AssertionError as e:  # bad sizes: one line naming the fix, before anything is loaded
        raise SystemExit(f"error: {e}")
    main(cli_args)
