"""Supervised finetuning (seed 000 §4, Algorithm 1) with periodic greedy validation through the rollout engine.

Each step: --batch-size pairs in --gradient-accumulation-steps length-sorted microbatches (losses.sft_microbatch_train_step:
summed response NLL / --normalize-constant), AdamW, warmup + cosine, clip; fp32 master weights, bf16 autocast on CUDA.
Every --eval-every steps the engine gets the weights and greedy answers to held-out problems are graded (2048 tokens,
seed 000 §3.2); eval rows carry "eval_step" too (the seed's two wandb axes). Departures: `--data countdown` (synthetic
Countdown, search-trace answers) and `--init-config tiny` (fresh BPE + random small model: see models/countdown-tiny).

Examples:
  python sft.py --model Qwen/Qwen2.5-Math-1.5B --data MATH/sft.jsonl --n-examples 512 --eval-task math500 \\
      --eval-path MATH/validation.jsonl --batch-size 32 --gradient-accumulation-steps 16 --lr 2e-5 --out runs/sft512
  python sft.py --init-config tiny --data countdown --out runs/countdown-tiny --save-dir models/countdown-tiny
  python sft.py --resume runs/countdown-tiny --steps 1200    # the run's flags, weights and optimizer state
"""

import functools
import importlib.util
import math
import os
import random
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import rollout  # noqa: I001  (sets vLLM's environment before anything imports vllm)
import torch

import common
import data
import plot
from common import check, fraction, nonneg_float, nonneg_int, positive_float, positive_int
from losses import (
    get_response_log_probs,
    masked_mean,
    sft_microbatch_train_step,
    shared_prefix_works,
    tokenize_prompt_and_output,
)

FAMILIES = ("llama", "qwen2", "qwen3")
# GPT-2's split: a number with its leading space is one pre-token, so frequent numbers become single tokens
NUMBER_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def parse_args(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    p = common.Parser(description=__doc__.split("\n")[0])
    g = p.add_argument_group("model")  # --- model ---
    g.add_argument(
        "--model", default=data.EMBEDDED_MODEL, help="HF model dir or hub id to start from"
    )
    g.add_argument(
        "--init-config",
        choices=["none", "tiny"],
        default="none",
        help="tiny: a BPE + random small model instead",
    )
    g.add_argument(
        "--family",
        choices=FAMILIES,
        default="llama",
        help="tiny init: architecture (qwen*: one digit a token)",
    )
    g.add_argument(
        "--hidden-size",
        type=positive_int,
        default=256,
        help="tiny init: hidden size (a multiple of 64)",
    )
    g.add_argument(
        "--layers", type=positive_int, default=3, help="tiny init: number of transformer layers"
    )
    g.add_argument(
        "--vocab-size",
        type=positive_int,
        default=1024,
        help="tiny init: BPE vocabulary size (at most)",
    )
    g.add_argument(
        "--gradient-checkpointing", action="store_true", help="recompute activations in backward"
    )
    g.add_argument(
        "--shared-prefix",
        "--share-prefix",
        action="store_true",
        help="run a microbatch's shared prompt once (exact)",
    )
    g = p.add_argument_group("data")  # --- data ---
    g.add_argument(
        "--data",
        default="countdown",
        help="SFT .jsonl with prompt/response, or 'countdown' (synthetic)",
    )
    g.add_argument(
        "--n-examples", default="all", help="128|256|...|all unique examples (a subset by --seed)"
    )
    g.add_argument(
        "--countdown-n",
        type=positive_int,
        default=8000,
        help="--data countdown: problems from the train split",
    )
    g.add_argument(
        "--prompt",
        default=None,
        help="--data countdown: prompts/<name>.prompt; default data.task_defaults",
    )
    g.add_argument(
        "--give-up",
        type=fraction,
        default=0.0,
        help="--data countdown: share of traces that answer a first miss",
    )
    g.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=1024,
        help="drop pairs longer than this many tokens",
    )
    g = p.add_argument_group("optimisation")  # --- optimisation ---
    g.add_argument("--lr", type=positive_float, default=2e-5, help="peak learning rate")
    g.add_argument("--min-lr-frac", type=fraction, default=0.1, help="cosine decays to lr * this")
    g.add_argument(
        "--warmup-frac", type=fraction, default=0.05, help="fraction of steps with linear warmup"
    )
    g.add_argument("--weight-decay", type=nonneg_float, default=0.0, help="AdamW weight decay")
    g.add_argument(
        "--batch-size", type=positive_int, default=32, help="examples per optimizer step"
    )
    g.add_argument(
        "--gradient-accumulation-steps",
        "--grad-accum",
        type=positive_int,
        default=4,
        help="microbatches a step",
    )
    g.add_argument(
        "--normalize-constant",
        type=positive_float,
        default=1.0,
        help="per-example summed NLL is divided by this",
    )
    g.add_argument(
        "--epochs",
        type=positive_float,
        default=1.0,
        help="passes over the data (ignored if --steps > 0)",
    )
    g.add_argument(
        "--steps", type=nonneg_int, default=0, help="total optimizer steps (overrides --epochs)"
    )
    g.add_argument(
        "--max-grad-norm", "--clip", type=positive_float, default=1.0, help="gradient-norm clip"
    )
    g.add_argument(
        "--dtype",
        choices=common.DTYPES,
        default="auto",
        help="compute dtype (auto: bf16 on CUDA, fp32 on CPU)",
    )
    g.add_argument(
        "--pure-bf16",
        action="store_true",
        help="bf16 weights + AdamW state: half the memory, updates < half a bf16 step lost",
    )
    g = p.add_argument_group("eval")  # --- eval ---
    g.add_argument(
        "--eval-every",
        type=nonneg_int,
        default=100,
        help="validate every N steps (0: only at the end)",
    )
    g.add_argument(
        "--eval-task",
        choices=sorted(data.TASKS),
        default=None,
        help="default: countdown with --data countdown",
    )
    g.add_argument(
        "--eval-path", default=None, help="local file for --eval-task; default: data.task_defaults"
    )
    g.add_argument(
        "--eval-prompt", default=None, help="prompt template for eval; default: data.task_defaults"
    )
    g.add_argument(
        "--eval-n",
        type=nonneg_int,
        default=200,
        help="held-out problems per validation (0: no validation)",
    )
    g.add_argument(
        "--eval-max-tokens",
        type=positive_int,
        default=None,
        help="default 2048; 128 for the embedded model",
    )
    g.add_argument("--wandb", default=None, help="wandb project name (off when omitted)")
    g = p.add_argument_group("systems")  # --- systems ---
    g.add_argument(
        "--engine", choices=rollout.ENGINES, default="vllm", help="rollout engine for validation"
    )
    g.add_argument(
        "--policy-device", default=None, help="training device; default cuda:0, else cpu"
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
        help="shared GPU: free the engine between validations",
    )
    g = p.add_argument_group("run")  # --- run ---
    g.add_argument(
        "--out", default=None, help="run dir (args.json, metrics.jsonl, rollouts/, checkpoint/)"
    )
    g.add_argument(
        "--save-dir",
        default=None,
        help="final model dir (default: <out>/model); *.md files there are kept",
    )
    g.add_argument(
        "--save-every",
        type=nonneg_int,
        default=200,
        help="write <out>/checkpoint every N steps (0: at the end)",
    )
    g.add_argument(
        "--resume",
        default=None,
        help="run or checkpoint dir: its flags (given ones override) and state",
    )
    g.add_argument(
        "--seed", type=int, default=0, help="seed for data subset/order, init and sampling"
    )
    g.add_argument(
        "--dry-run", action="store_true", help="print the effective configuration as JSON and exit"
    )
    args = p.parse_args(argv)
    if args.resume:
        common.resume_from(p, argv, args, needs=("optimizer.pt", "scheduler.pt"))
    resolve(args)
    if args.dry_run:
        common.dry_run(args)
    return args


def resolve(args):
    """Defaults that depend on other flags, derived sizes, and the checks that need no model (one-line errors)."""
    tiny = args.init_config == "tiny"
    model = data.EMBEDDED_MODEL if tiny else args.model  # a tiny init is the embedded kind of model
    check(
        args.n_examples == "all" or args.n_examples.isdigit() and int(args.n_examples) > 0,
        f"--n-examples {args.n_examples}: pass 'all' or an integer > 0",
    )
    check(
        args.batch_size % args.gradient_accumulation_steps == 0,
        f"--batch-size {args.batch_size} must be a multiple "
        f"of --gradient-accumulation-steps {args.gradient_accumulation_steps}",
    )
    args.micro_batch_size = args.batch_size // args.gradient_accumulation_steps
    check(
        not (args.shared_prefix and args.gradient_checkpointing),
        "--shared-prefix needs the KV cache: drop it or --gradient-checkpointing",
    )
    check(
        not tiny or args.hidden_size % 64 == 0,
        f"--hidden-size {args.hidden_size}: use a multiple of 64 (head_dim 64)",
    )
    for flag, path, keyword in (
        ("--data", args.data, "countdown"),
        ("--eval-path", args.eval_path, "synthetic"),
    ):
        check(
            path in (None, keyword) or os.path.isfile(path) and os.path.getsize(path),
            f"{flag} {path}: no such file, or an empty one",
        )
    if not tiny and not args.resume:
        common.check_model_dir(args.model)
    args.prompt = args.prompt or (
        data.task_defaults("countdown", model)["prompt"] if args.data == "countdown" else None
    )
    args.eval_task = args.eval_task or ("countdown" if args.data == "countdown" else None)
    args.eval_reward = None
    if args.eval_task and args.eval_n:
        defaults = data.task_defaults(args.eval_task, model)
        args.eval_prompt, args.eval_reward = (
            args.eval_prompt or defaults["prompt"],
            defaults["reward"],
        )
        args.eval_path = args.eval_path or defaults["path"]
    args.eval_max_tokens = args.eval_max_tokens or (
        128 if data.is_embedded(model) and args.eval_task == "countdown" else 2048
    )
    n_gpu = torch.cuda.device_count()
    args.policy_device = args.policy_device or ("cuda:0" if n_gpu else "cpu")
    args.vllm_device = args.vllm_device or ("cuda:1" if n_gpu > 1 else args.policy_device)
    check(
        not args.sleep_engine or torch.device(args.vllm_device) == torch.device(args.policy_device),
        "--sleep-engine is for an engine that shares the policy's GPU; drop it",
    )
    weights, compute = common.resolve_precision(args.policy_device, args.dtype, args.pure_bf16)
    check(
        not args.pure_bf16 or compute == torch.bfloat16,
        "--pure-bf16 needs bf16 compute: add --dtype bfloat16",
    )
    args.param_dtype, args.compute_dtype = str(weights).split(".")[-1], str(compute).split(".")[-1]
    check(
        not args.wandb or importlib.util.find_spec("wandb"),
        "--wandb needs the wandb package (pip install wandb)",
    )
    args.out = args.out or os.path.join("runs", time.strftime("sft-%Y%m%d-%H%M%S"))
    args.save_dir = args.save_dir or os.path.join(args.out, "model")
    return args


# ----------------------------------------------------------------------------- countdown traces
def _steps(x, y):
    """The exact one-step results of x and y, in a fixed order: x + y, x * y, larger - smaller, larger / smaller."""
    hi, lo = max(x, y), min(x, y)
    out = [(f"{x} + {y}", x + y), (f"{x} * {y}", x * y), (f"{hi} - {lo}", hi - lo)]
    return out + [(f"{hi} / {lo}", hi // lo)] if lo > 1 and hi % lo == 0 else out


def countdown_attempts(numbers, target):
    """[(text, answer expression, hit)]: each first step in order, finished by the second step nearest the target."""
    out = []
    for i, j in ((0, 1), (0, 2), (1, 2)):
        c = numbers[3 - i - j]
        for t1, x in _steps(numbers[i], numbers[j]):
            t2, y = min(_steps(x, c), key=lambda s: abs(s[1] - target))
            left, op, _ = t2.split()
            expr = f"({t1}) {op} {c}" if left == str(x) else f"{c} {op} ({t1})"
            out.append((f"{t1} = {x}, {t2} = {y}", expr, y == target))
    return out


def countdown_trace(numbers, target, give_up=0.0, rng=random):
    """A search trace: attempts in order, each checked against the target until one hits, e.g. (target 30)
    ' 10 + 1 = 11, 11 * 3 = 33 vs 30 no. 10 * 1 = 10, 10 * 3 = 30 vs 30 yes. </think> <answer> (10 * 1) * 3 </answer>'.
    Restating the target lets a tiny model compare two adjacent numbers instead of recalling the prompt's.
    With probability give_up it answers the first (missed) attempt."""
    assert len(numbers) == 3, "countdown_trace searches 3-number problems (data.py's default)"
    said = []
    for k, (text, expr, hit) in enumerate(countdown_attempts(numbers, target)):
        said.append(f"{text} vs {target} {'yes' if hit else 'no'}.")
        if hit or (k == 0 and rng.random() < give_up):
            return f" {' '.join(said)} </think> <answer> {expr} </answer>"
    raise ValueError(f"{numbers} cannot reach {target}")


# ----------------------------------------------------------------------------- tiny models from scratch
def tiny_model(family, vocab_size, hidden_size=256, num_layers=3, init_std=0.02, seed=0, **config):
    """A random causal LM of `family` (FAMILIES): head_dim 64 (vLLM-CPU needs it), tied embeddings, HF's init; for
    init_std != 0.02 every matrix is redrawn from N(0, init_std) (the test models: 0.2, so greedy outputs vary)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(
            family,
            **{
                "vocab_size": vocab_size,
                "hidden_size": hidden_size,
                "intermediate_size": 3 * hidden_size,
                "num_hidden_layers": num_layers,
                "num_attention_heads": hidden_size // 64,
                "num_key_value_heads": hidden_size // 64,
                "head_dim": 64,
                "max_position_embeddings": 2048,
                "tie_word_embeddings": True,
                "rope_theta": 10000.0,
                **config,
            },
        )
    )
    with torch.no_grad():
        for p in [p for p in model.parameters() if p.dim() > 1 and init_std != 0.02]:
            p.normal_(0.0, init_std)
    return model


def build_tiny_model(
    out_dir,
    corpus=None,
    family="llama",
    hidden_size=256,
    num_layers=3,
    vocab_size=1024,
    seed=0,
    init_std=0.02,
    **config,
):
    """A byte-level BPE trained on `corpus` (None: 400 Countdown SFT pairs) + tiny_model, saved in out_dir (vocab
    rounded up to 64s as vLLM pads it). GPT-2's split makes whole numbers tokens (' 15': a lookup, not digit
    arithmetic); transformers reloads any qwen2 checkpoint with Qwen2's pipeline (one digit a pre-token), so
    qwen2/qwen3 get that pipeline before saving and reload unchanged."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(NUMBER_SPLIT), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = corpus or [
        r["prompt"] + countdown_trace(**r["ground_truth"])
        for r in data.load_task(
            "countdown", "train", path="synthetic", limit=400, seed=seed, prompt="r1_zero"
        )
    ]
    tok.train_from_iterator(
        corpus,
        trainer=trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|endoftext|>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            max_token_length=64,
        ),
    )
    if family != "llama":
        qwen = Qwen2Tokenizer().backend_tokenizer
        tok.normalizer, tok.pre_tokenizer, tok.decoder = (
            qwen.normalizer,
            qwen.pre_tokenizer,
            qwen.decoder,
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tok.save_pretrained(out_dir)
    tiny_model(
        family,
        64 * math.ceil(len(tok) / 64),
        hidden_size,
        num_layers,
        init_std,
        seed,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **config,
    ).save_pretrained(out_dir)
    return out_dir


# ----------------------------------------------------------------------------- data / model / engine
def subset(rows, n, seed):
    """First n of a seed-determined permutation (so smaller subsets are nested in larger ones)."""
    if n == "all":
        return rows
    check(
        int(n) <= len(rows),
        f"--n-examples {n}: the data has {len(rows)} pairs; pass at most that or 'all'",
    )
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[i] for i in sorted(order[: int(n)])]


def load_data(args):
    """(SFT pairs [{"prompt", "response"}], validation rows with "prompt" and "stop"); one-line errors."""
    if args.data == "countdown":  # synthetic problems answered by a search trace
        rng = random.Random(f"trace-{args.seed}")
        pairs = [
            {
                "prompt": r["prompt"],
                "response": countdown_trace(**r["ground_truth"], give_up=args.give_up, rng=rng),
            }
            for r in common.attempt(
                data.load_task,
                "countdown",
                "train",
                path="synthetic",
                limit=args.countdown_n,
                seed=args.seed,
                prompt=args.prompt,
                what="--prompt",
            )
        ]
    else:
        pairs = common.attempt(data.load_sft_jsonl, args.data, what="--data")
    check(pairs, f"--data {args.data}: no pairs in it")
    if not args.eval_reward:
        return subset(pairs, args.n_examples, args.seed), []
    val = common.attempt(
        data.load_task,
        args.eval_task,
        "test",
        path=args.eval_path,
        limit=args.eval_n,
        prompt=args.eval_prompt,
        what=f"--eval-task {args.eval_task}",
    )
    check(val, f"--eval-task {args.eval_task}: an empty validation set; fix --eval-path")
    return subset(pairs, args.n_examples, args.seed), val


def fit_pairs(rows, tokenizer, args):
    """Pairs within --max-seq-len, each with its token count "n_tokens"."""
    lens = [
        len(tokenizer(r["prompt"])["input_ids"])
        + len(tokenizer(r["response"], add_special_tokens=False)["input_ids"])
        for r in rows
    ]
    keep = [dict(r, n_tokens=n) for r, n in zip(rows, lens) if n <= args.max_seq_len]
    print(
        f"{len(keep)}/{len(rows)} pairs within --max-seq-len {args.max_seq_len}, mean {sum(lens) / len(lens):.0f} tokens"
    )
    fix = (
        f"raise it or lower --batch-size to at most {len(keep)}"
        if keep
        else f"raise it to at least {min(lens)}"
    )
    check(
        len(keep) >= args.batch_size,
        f"only {len(keep)} pairs fit --max-seq-len {args.max_seq_len}: {fix}",
    )
    return keep


# ----------------------------------------------------------------------------- train / eval
def lr_lambda(step, total, warmup, min_frac):
    """Linear warmup to 1, then cosine to min_frac at `total`."""
    progress = min(1.0, max(0, step - warmup) / max(1, total - warmup))
    return (
        (step + 1) / warmup
        if step < warmup
        else min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * progress))
    )


def train_step(model, tokenizer, optimizer, scheduler, pairs, args):
    """One optimizer step over `pairs`, sorted by length into microbatches (little padding). -> train/ metrics."""
    t0 = time.perf_counter()
    pairs = sorted(pairs, key=lambda r: r["n_tokens"])
    loss_sum, nll_tok, ent_tok, n_tok = 0.0, 0.0, 0.0, 0
    for m in range(0, len(pairs), args.micro_batch_size):
        mb = pairs[m : m + args.micro_batch_size]
        batch = tokenize_prompt_and_output(
            [r["prompt"] for r in mb], [r["response"] for r in mb], tokenizer
        )
        input_ids, labels, mask = (
            batch[k].to(args.policy_device) for k in ("input_ids", "labels", "response_mask")
        )
        # --shared-prefix: the rows' common prompt prefix (the template) runs once, up to the first response label
        P = (
            min(
                int((input_ids == input_ids[:1]).all(0).long().cumprod(0).sum()),
                int(mask.long().argmax(-1).min()),
            )
            if args.shared_prefix and len(mb) > 1
            else 0
        )
        with common.autocast(
            args.policy_device, getattr(torch, args.compute_dtype)
        ):  # fp32 weights, bf16 matmuls
            out = get_response_log_probs(
                model,
                input_ids,
                labels,
                return_token_entropy=True,
                prefix_len=P * (P > 1),
                lengths=mask.shape[1] - mask.flip(-1).long().argmax(-1),
            )  # padding not run
        loss, meta = sft_microbatch_train_step(
            out["log_probs"], mask, args.gradient_accumulation_steps, args.normalize_constant
        )  # backward, outside autocast
        k = int(meta["num_response_tokens"])
        loss_sum, nll_tok, n_tok = (
            loss_sum + float(loss),
            nll_tok + float(meta["nll_per_token"]) * k,
            n_tok + k,
        )
        ent_tok += float(masked_mean(out["token_entropy"].detach(), mask)) * k
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t0
    return {
        "train/loss": loss_sum,
        "train/nll_per_token": nll_tok / n_tok,
        "train/grad_norm": grad_norm,
        "train/entropy": ent_tok / n_tok,
        "train/lr": lr,
        "train/tokens_per_s": sum(r["n_tokens"] for r in pairs) / dt,
        "time/step": dt,
    }


def save_checkpoint(args, model, tokenizer, optimizer, scheduler, step):
    """<out>/checkpoint: common.save_model_checkpoint's layout (as grpo.py's), plus the lr schedule's position."""
    return common.save_model_checkpoint(
        args.out,
        model,
        tokenizer,
        args,
        {"step": step},
        extra={"optimizer.pt": optimizer.state_dict(), "scheduler.pt": scheduler.state_dict()},
    )


# ----------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    common.claim_run_dir(args.out, args.resume)
    torch.manual_seed(args.seed)
    # --- data (before any model loads: a bad file fails in a second) ---
    pairs, val_rows = load_data(args)
    # --- model, optimizer, resume ---
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = args.resume or args.model
    if args.init_config == "tiny" and not args.resume:
        src = build_tiny_model(
            os.path.join(args.out, "init"),
            [r["prompt"] + r["response"] for r in pairs],
            args.family,
            args.hidden_size,
            args.layers,
            args.vocab_size,
            args.seed,
        )
    tokenizer = AutoTokenizer.from_pretrained(src)
    pairs = fit_pairs(pairs, tokenizer, args)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, args.param_dtype)).to(
        args.policy_device
    )
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if args.shared_prefix and not shared_prefix_works(model):
        args.shared_prefix = False
        print(
            "notice: --shared-prefix off: this model's KV cache did not reproduce its plain log-probs"
        )
    print(
        f"model {src}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params on {args.policy_device} | "
        f"weights {args.param_dtype}, compute {args.compute_dtype} | engine {args.engine} on {args.vllm_device}"
    )
    steps = args.steps or math.ceil(args.epochs * len(pairs) / args.batch_size)
    order = []  # pair indices of every step, a function of (seed, step): a resumed run continues the same order
    for epoch in range(math.ceil(steps * args.batch_size / len(pairs))):
        perm = list(range(len(pairs)))
        random.Random(f"{args.seed}-{epoch}").shuffle(perm)
        order += perm
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay
    )
    warmup = max(1, int(args.warmup_frac * steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        functools.partial(lr_lambda, total=steps, warmup=warmup, min_frac=args.min_lr_frac),
    )
    start = (
        common.restore_checkpoint(
            args.resume, args.out, True, optimizer=optimizer, scheduler=scheduler
        )["step"]
        if args.resume
        else 0
    )
    n_evals = sum(
        "eval_step" in r for r in common.read_metrics(os.path.join(args.out, "metrics.jsonl"))
    )
    # --- eval engine: loads the starting weights from disk, later receives pushes ---
    llm = None
    if val_rows:
        kw = (
            {}
            if args.engine == "hf"
            else {  # a context that fits the longest prompt and the budget
                "max_model_len": max(len(tokenizer(r["prompt"])["input_ids"]) for r in val_rows)
                + args.eval_max_tokens,
                "gpu_memory_utilization": args.gpu_memory_utilization
                or common.engine_share(args, model),
                "enable_sleep_mode": args.sleep_engine and args.vllm_device.startswith("cuda"),
            }
        )
        llm = rollout.init_engine(args.engine, src, device=args.vllm_device, seed=args.seed, **kw)
        if args.sleep_engine:
            rollout.sleep_engine(llm)  # not needed until the first validation
    wandb_run = common.start_wandb(
        args.wandb, args, {"train/*": "step", "time/*": "step", "eval/*": "eval_step"}
    )
    data.write_json_atomic(
        os.path.join(args.out, "args.json"), common.jsonable(vars(args))
    )  # the run starts here
    print(
        f"{len(pairs)} pairs, {steps} steps of {args.batch_size} ({args.gradient_accumulation_steps} microbatches), "
        f"warmup {warmup}, {len(val_rows)} validation problems | out {args.out}"
    )

    t_run, done, in_step = time.perf_counter(), start, False
    try:
        for step in range(start, steps):
            # --- train: one optimizer step; a first Ctrl-C waits for its end, so what is saved is consistent ---
            with common.finish_then_interrupt("this optimizer step"):
                in_step = True
                row = train_step(
                    model,
                    tokenizer,
                    optimizer,
                    scheduler,
                    [
                        pairs[i]
                        for i in order[step * args.batch_size : (step + 1) * args.batch_size]
                    ],
                    args,
                )
                done = step + 1
                common.log_row(
                    args.out,
                    {"step": done, **row, "time/wall": time.perf_counter() - t_run},
                    wandb_run,
                )
                in_step = False
            print(
                f"step {done}/{steps} | loss {row['train/loss']:.4f} | nll/tok {row['train/nll_per_token']:.4f} | "
                f"grad {row['train/grad_norm']:.3f} | ent {row['train/entropy']:.3f} | lr {row['train/lr']:.2e} | "
                f"{row['train/tokens_per_s']:.0f} tok/s",
                flush=True,
            )
            # --- eval (greedy, on the engine after a push) ---
            if llm is not None and (
                done == steps or (args.eval_every and done % args.eval_every == 0)
            ):
                t0, n_evals = time.perf_counter(), n_evals + 1
                push_s = (
                    rollout.wake_engine(llm, model)
                    if args.sleep_engine
                    else rollout.load_policy_into_vllm(model, llm)
                )
                metrics, samples = common.greedy_eval(
                    llm, val_rows, args.eval_reward, args.eval_max_tokens
                )
                if args.sleep_engine:
                    rollout.sleep_engine(
                        llm
                    )  # its memory goes back to training until the next validation
                common.log_row(
                    args.out,
                    {
                        "step": done,
                        "eval_step": n_evals,
                        **metrics,
                        "time/weight_sync": push_s,
                        "time/eval": time.perf_counter() - t0,
                        "time/wall": time.perf_counter() - t_run,
                    },
                    wandb_run,
                )
                print(
                    f"eval {n_evals} @ step {done} | accuracy {metrics['eval/accuracy']:.3f} | format "
                    f"{metrics['eval/format_reward']:.3f} | {time.perf_counter() - t0:.1f}s",
                    flush=True,
                )
                data.write_jsonl_atomic(
                    os.path.join(args.out, "rollouts", f"step_{done:04d}.jsonl"), samples[:32]
                )
            # --- save ---
            if done == steps or (args.save_every and done % args.save_every == 0):
                save_checkpoint(args, model, tokenizer, optimizer, scheduler, done)
    except KeyboardInterrupt:
        if (
            in_step
        ):  # a second Ctrl-C mid-step: the weights may be half-updated, so nothing is saved
            raise SystemExit(
                f"\naborted inside step {done + 1}: nothing saved; --resume {args.out} restarts from the last checkpoint"
            )
        print(
            f"\ninterrupted after step {done}: saving the checkpoint; continue with --resume {args.out}",
            flush=True,
        )
        save_checkpoint(args, model, tokenizer, optimizer, scheduler, done)
        plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
        sys.exit(130)
    if start < steps or not os.path.isdir(args.save_dir):
        path = os.path.normpath(
            args.save_dir
        )  # the final model: a hand-written model card there stays
        common.save_model_checkpoint(
            os.path.dirname(path) or ".",
            model,
            tokenizer,
            args,
            {"step": steps},
            name=os.path.basename(path),
            keep=("*.md",),
        )
    dashboard = plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
    print(f"saved {args.save_dir}; metrics in {args.out}; dashboard {dashboard}")
    if wandb_run is not None:
        wandb_run.finish()
    return common.read_metrics(os.path.join(args.out, "metrics.jsonl"))


if __name__ == "__main__":
    main()
