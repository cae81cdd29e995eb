"""Where and how a run computes: precision (fp32 master weights + bf16 autocast), the GPU share of a
vLLM engine beside the policy, and the CPU threads.

- `resolve_precision`: (the weights' and AdamW's dtype, the forward/backward dtype) from --dtype
  and --pure-bf16; `autocast` is the context every forward/backward runs in.
- `engine_share`: vLLM's gpu_memory_utilization when it shares the policy's GPU.
- `set_threads`: --threads, applied before an engine starts (a vLLM CPU engine makes
  torch.set_num_threads a no-op).
"""

import contextlib
import importlib.util
import os

from common import check, fail


# ----------------------------------------------------------------------------- devices
def check_device(flag, device):
    """--policy-device / --vllm-device (None: chosen at run time): a device torch can name and
    this torch build can reach, else one line before anything loads, not a traceback once it
    does. A CUDA index is checked where torch sees GPUs (a Ray driver without one places actors
    that have them)."""
    if device is None:
        return
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        fail(f"{flag} {device}: not a device; pass cpu, cuda or cuda:N")
    check(parsed.type in ("cpu", "cuda"), f"{flag} {device}: pass cpu, cuda or cuda:N")
    if parsed.type != "cuda":
        return
    check(
        torch.backends.cuda.is_built(),
        f"{flag} {device}: this torch is built without CUDA; pass {flag} cpu, or install a CUDA "
        "build of torch",
    )
    n = torch.cuda.device_count()
    check(
        parsed.index is None or n == 0 or parsed.index < n,
        f"{flag} {device}: torch sees {n} GPU(s), cuda:0 to cuda:{n - 1}",
    )


# --attn-implementation, passed to from_pretrained (sdpa: what transformers picks for these models)
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


def check_attn_implementation(impl, device, shared_prefix):
    """--attn-implementation against the run, before anything loads, each a one-line error:
    flash_attention_2 (seed 000's) cannot run --shared-prefix (its packed rows need a 4-D block
    mask, which FlashAttention-2 does not take), needs the flash-attn package and a CUDA policy
    device (`device` None: CUDA where torch sees it)."""
    if impl != "flash_attention_2":
        return
    flag = "--attn-implementation flash_attention_2"
    check(
        not shared_prefix,
        f"{flag} cannot run --shared-prefix (its packed rows need a 4-D block mask that "
        "FlashAttention-2 does not take): drop --shared-prefix (grpo.py: --no-shared-prefix), "
        "or pass --attn-implementation sdpa",
    )
    check(
        importlib.util.find_spec("flash_attn") is not None,
        f"{flag} needs the flash-attn package (pip install flash-attn --no-build-isolation), or "
        "pass --attn-implementation sdpa",
    )
    import torch

    on_cuda = torch.cuda.is_available()
    if device:
        on_cuda = str(device).startswith("cuda")
    check(on_cuda, f"{flag} runs on CUDA only: pass --attn-implementation sdpa on this device")


# ----------------------------------------------------------------------------- precision
DTYPES = ("auto", "float32", "bfloat16")


def resolve_precision(device, dtype="auto", pure_bf16=False):
    """(the weights' and AdamW's dtype, the forward/backward dtype).

    auto: bf16 compute on CUDA, fp32 on CPU. bf16 compute keeps fp32 master weights (autocast):
    pure bf16 (--pure-bf16) rounds away updates under half a bf16 step (at lr 1e-5: any
    |w| >~ 0.004).
    """
    import torch

    on_cuda = str(device).startswith("cuda")
    if dtype == "bfloat16" or (dtype == "auto" and on_cuda):
        compute = torch.bfloat16
    else:
        compute = torch.float32
    if pure_bf16:
        return compute, compute
    return torch.float32, compute


def _dtype_bytes(dtype):
    """Bytes per element of a torch dtype or its name ("bfloat16")."""
    import torch

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.finfo(dtype).bits // 8


def engine_share(
    policy_device, vllm_device, param_dtype, sleep_engine, policy=None, extra_models=0
):
    """vLLM's GPU fraction (gpu_memory_utilization).

    0.85 on its own GPU (seed 001) or with no policy beside it. On the policy's GPU, what the
    trainer leaves: the weights and AdamW's two moments (+ extra_models frozen copies in the
    weights' dtype) stay resident, gradients only while training (not with --sleep-engine);
    activations and the allocator get a 15% margin.
    """
    import torch

    pol = torch.device(policy_device)
    eng = torch.device(vllm_device)
    if policy is None:
        return 0.85
    same_gpu = pol.type == eng.type == "cuda" and (pol.index or 0) == (eng.index or 0)
    if not same_gpu:
        return 0.85
    w = _dtype_bytes(param_dtype)  # bytes per weight
    n = sum(p.numel() for p in policy.parameters())
    resident = n * 3 * w + w * n * int(extra_models)  # weights + 2 AdamW moments + frozen copies
    grads = n * w
    total = torch.cuda.get_device_properties(pol).total_memory
    in_use = resident
    if not sleep_engine:
        in_use = resident + grads  # gradients are held only while training
    share = 1 - in_use / total - 0.15
    check(
        share > 0.05,
        f"the policy needs {(resident + grads) / 2**30:.1f} GiB of this GPU's {total / 2**30:.1f}: "
        f"use a second GPU (--vllm-device cuda:1), --pure-bf16 or --sleep-engine",
    )
    print(f"engine: gpu_memory_utilization {share:.2f} (the rest is the trainer's)", flush=True)
    return share


def autocast(device, compute_dtype):
    """Context for forward/backward in compute_dtype over fp32 weights (a no-op when they match)."""
    import torch

    if compute_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(str(device).split(":")[0], compute_dtype)


# ----------------------------------------------------------------------------- CPU threads
_TORCH_THREADS = {}  # "default": torch's own choice in this process, read before any change


def set_threads(threads=None):
    """Apply --threads: the torch (OpenMP) threads of everything this process computes, its rollout
    engine included. None keeps torch's own choice (one per core, or $OMP_NUM_THREADS), so a run
    without the flag computes exactly what it did before the flag existed. Prints the choice in
    one line; returns the thread count.

    Call it before the engine starts: a vLLM CPU engine replaces torch.set_num_threads with a
    no-op when it starts (vllm/v1/worker/cpu_worker.py). torch._C's setter is the real one; the
    in-process engine runs on this thread's pool, so it follows even a later call (a test, a
    notebook or a reused Ray actor that starts a second run)."""
    import torch

    default = _TORCH_THREADS.setdefault("default", torch.get_num_threads())
    want = default
    how = "torch default; --threads N to change"
    omp = os.environ.get("OMP_NUM_THREADS")
    if omp:  # (a Ray actor's: Ray sets it to the actor's num_cpus)
        how = f"torch default, from OMP_NUM_THREADS={omp}; --threads N to change"
    if threads:
        want = threads
        how = "--threads"
    if torch.get_num_threads() != want:
        torch._C.set_num_threads(want)
    print(f"threads: {want} ({how})", flush=True)
    return torch.get_num_threads()
