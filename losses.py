"""Tensor primitives for SFT and GRPO: tokenisation, log-probs, entropy, masked reductions, PG losses.

Names, signatures and keyword spellings follow the handouts (seed 000 §4.2/§7.2, 001 §5.2, 002 §1.4); pure functions
of tensors (+ `model` / `tokenizer` where a seed signature has one). B batch, T sequence, V vocab, H hidden. LOSSES and
RATIO_LOSSES hold every fact about a loss. get_response_log_probs never builds a float32 (B, T, V) tensor, scores what
vLLM sampled (temperature, min_tokens ban) and runs a prompt shared by its rows once, the rows packed (prefix_len).
"""

import contextlib

import torch

LENGTH_NORMS = ("masked_mean", "masked_normalize", "token")
KL_ESTIMATORS = ("k1", "k2", "k3", "seq")  # "seq" = seed 004 Eq. 8 (monitoring only)
ROLLOUT_IS = ("none", "tis", "mis")
BANNED = (
    -1e30
)  # logit of a banned token: exp() is 0 and 0 * BANNED is 0 (with -inf, entropy would be NaN)


# ----------------------------------------------------------------------------- tokenisation
def tokenize_prompt_and_output(prompt_strs, output_strs, tokenizer):
    """Tokenise prompts (with the tokenizer's special tokens, as vLLM does) and outputs (without) apart, concatenate,
    right-pad -> (B, L-1) input_ids (all but the last token), labels (all but the first), bool response_mask."""
    _need(
        len(prompt_strs) == len(output_strs),
        f"got {len(prompt_strs)} prompts but {len(output_strs)} outputs; pass one output per prompt",
    )
    prompt_ids = tokenizer(list(prompt_strs))["input_ids"]
    output_ids = tokenizer(list(output_strs), add_special_tokens=False)["input_ids"]
    pad_id = (
        tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else (tokenizer.eos_token_id or 0)
    )
    ids = torch.full(
        (len(prompt_ids), max(len(p) + len(o) for p, o in zip(prompt_ids, output_ids))), pad_id
    )  # (B, L)
    mask = torch.zeros(ids.shape, dtype=torch.bool)  # (B, L), True on output tokens
    for i, (p, o) in enumerate(zip(prompt_ids, output_ids)):
        ids[i, : len(p) + len(o)] = torch.tensor(p + o, dtype=torch.long)
        mask[i, len(p) : len(p) + len(o)] = True
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "response_mask": mask[:, 1:]}


# ----------------------------------------------------------------------------- entropy / log-probs
def compute_entropy(logits):
    """Entropy of softmax(logits) over the last dim: (..., V) -> (...). Stable: H = lse - sum(p * z)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(
        dim=-1
    )  # (...)


def _chunk_logits(h, w, temperature, ban, ban_ids, acc):
    """A fresh (c, V) float tensor of logits / temperature (h @ W^T; h itself if W is None), banned ids BANNED."""
    z = h.to(acc, copy=True) if w is None else (h @ w.t()).to(acc)  # (c, V), the only big tensor
    if temperature != 1.0:
        z.div_(temperature)
    if ban is not None and bool(ban.any()):
        z[ban.nonzero().squeeze(-1)[:, None], ban_ids[None, :]] = BANNED
    return z


class _ChunkedLogProbs(torch.autograd.Function):
    """log p(label) and entropy of softmax((h @ W^T).float() / temperature), `chunk` tokens at a time (W None:
    h are logits). Forward keeps per-token scalars (lse, entropy); backward recomputes each chunk's logits: peak
    extra memory O(chunk * V), not O(N * V). d logp_y / dz = onehot(y) - p, dH / dz = -p (log p + H), both
    / temperature. W is cast to h's dtype (bf16 under autocast over fp32 master weights); its grad keeps W's."""

    @staticmethod
    def forward(
        ctx, h, weight, labels, temperature, chunk, want_ent, ban, ban_ids
    ):  # h (N, H) or (N, V), W (V, H)
        ctx.set_materialize_grads(
            False
        )  # unused outputs give None grads, so backward skips their work
        n, acc = h.shape[0], torch.promote_types(h.dtype, torch.float32)
        w = None if weight is None else weight.to(h.dtype)
        logp, lse, ent = (
            h.new_empty(n, dtype=acc),
            h.new_empty(n, dtype=acc),
            h.new_zeros(n, dtype=acc),
        )  # (N,) each
        for s in range(0, n, chunk):
            z = _chunk_logits(
                h[s : s + chunk],
                w,
                temperature,
                None if ban is None else ban[s : s + chunk],
                ban_ids,
                acc,
            )
            lse[s : s + chunk] = lse_c = torch.logsumexp(z, dim=-1)  # (c,)
            logp[s : s + chunk] = z.gather(-1, labels[s : s + chunk, None]).squeeze(-1) - lse_c
            if want_ent:
                z.sub_(lse_c[:, None])  # log p, in place
                ent[s : s + chunk] = -(z.exp() * z).sum(-1)
        ctx.save_for_backward(h, weight, labels, lse, ent, ban, ban_ids)
        ctx.temperature, ctx.chunk = temperature, chunk
        # backward must recompute exactly these logits: under autocast h @ W^T ran in the autocast dtype, and the
        # softmax built from an fp32 recomputation minus this lse would not sum to 1
        device_type = h.device.type
        ctx.autocast = (
            device_type,
            torch.is_autocast_enabled(device_type),
            torch.get_autocast_dtype(device_type),
        )
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):  # g_logp, g_ent (N,) or None
        device_type, enabled, dtype = ctx.autocast
        with torch.autocast(
            device_type, dtype=dtype, enabled=enabled
        ):  # the forward's precision, on CPU and CUDA
            return _ChunkedLogProbs._backward(ctx, g_logp, g_ent)

    @staticmethod
    def _backward(ctx, g_logp, g_ent):
        h, weight, labels, lse, ent, ban, ban_ids = ctx.saved_tensors
        c, w = ctx.chunk, None if weight is None else weight.to(h.dtype)
        need_h, need_w = ctx.needs_input_grad[0], w is not None and ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(h) if need_h else None
        grad_w = (
            torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if need_w else None
        )
        for s in range(0, h.shape[0], c):
            z = _chunk_logits(
                h[s : s + c],
                w,
                ctx.temperature,
                None if ban is None else ban[s : s + c],
                ban_ids,
                lse.dtype,
            )
            p = z.sub_(lse[s : s + c, None]).exp()  # z is now log p; p (c, V)
            gl = (
                g_logp[s : s + c, None] if g_logp is not None else p.new_zeros(p.shape[0], 1)
            )  # (c, 1)
            # gz = p * (-(log p + H) * g_ent - g_logp), built in place in z (without entropy: -p g_logp)
            gz = (
                z.add_(ent[s : s + c, None]).mul_(-g_ent[s : s + c, None]).sub_(gl).mul_(p)
                if g_ent is not None
                else p.mul_(-gl)
            )
            gz.scatter_add_(
                -1, labels[s : s + c, None], gl
            )  # + g_logp at the label: (onehot - p) g
            gz = gz.div_(ctx.temperature).to(
                h.dtype
            )  # the naive graph casts here too (backward of .float())
            if need_h:
                grad_h[s : s + c] = gz if w is None else gz @ w
            if need_w:
                grad_w += (gz.t() @ h[s : s + c]).to(grad_w.dtype)
        return (
            grad_h,
            (grad_w.to(weight.dtype) if need_w else None),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def _check_model(model):
    """Once per model, on 3 rows sharing 5 tokens: does body(x) @ W^T give its logits (flags scale or cap them in
    ways no attribute list keeps up with: Granite, Gemma)? does prefix_len's KV-cache reuse give its plain
    log-probs? A model failing one gets the plain computation (its own logits; no prefix sharing)."""
    w, was, verdicts = (
        next(model.parameters()),
        model.training,
        ("_logprob_fast_path", "_logprob_shared_prefix"),
    )
    if all(getattr(model, v, None) is not None for v in verdicts):
        return
    ids = torch.randint(
        1, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0)
    ).to(w.device)
    ids[:, :5] = ids[:1, :5]
    try:
        with torch.no_grad(), torch.autocast(w.device.type, enabled=False):
            model.eval()  # no dropout in the checks
            if getattr(model, verdicts[0], None) is None:
                head, body, ok = (
                    getattr(model, "get_output_embeddings", lambda: None)(),
                    getattr(model, "base_model", None),
                    False,
                )
                if (
                    body is not None
                    and body is not model
                    and isinstance(head, torch.nn.Linear)
                    and head.bias is None
                ):
                    fast = (
                        body(input_ids=ids, use_cache=False).last_hidden_state @ head.weight.t()
                    ).float()
                    ref = model(input_ids=ids, use_cache=False).logits.float()
                    ok = bool(
                        torch.allclose(
                            fast, ref, rtol=1e-2, atol=1e-3 * float(ref.abs().max()) + 1e-5
                        )
                    )
                model._logprob_fast_path = ok
            if (
                getattr(model, verdicts[1], None) is None
            ):  # a sliding window: the one 4D mask would skip it, so no
                cfg, model._logprob_shared_prefix = (
                    model.config,
                    False,
                )  # (False while the check runs)
                windowed = "sliding_attention" in (getattr(cfg, "layer_types", None) or ()) or bool(
                    getattr(cfg, "sliding_window", None)
                    and getattr(cfg, "use_sliding_window", True)
                )
                with contextlib.suppress(
                    TypeError, ValueError, RuntimeError, AttributeError
                ):  # no usable KV cache
                    a, b = (
                        get_response_log_probs(model, ids[:, :-1], ids[:, 1:], prefix_len=p)[
                            "log_probs"
                        ][:, 4:]
                        for p in (4, 0)
                    )
                    model._logprob_shared_prefix = not windowed and bool(
                        torch.allclose(a, b, atol=1e-4 if w.dtype == torch.float32 else 5e-2)
                    )
    finally:
        model.train(was)


def shared_prefix_works(model):
    """Does prefix_len (a shared prompt run once, its KV cache reused) reproduce this model's plain log-probs?"""
    _check_model(model)
    return model._logprob_shared_prefix


def get_response_log_probs(
    model,
    input_ids,
    labels,
    return_token_entropy=False,
    temperature=1.0,
    chunk_size=256,
    ban_token_ids=None,
    ban_mask=None,
    prefix_len=0,
    lengths=None,
):
    """Per-token log p(labels | prefix) and optionally entropy, (B, T) float32, of logits / temperature (as vLLM
    samples), ban_token_ids (k,) out of the softmax where ban_mask (B, T) is set (min_tokens); chunk_size tokens'
    logits at a time. prefix_len P: input_ids[:, :P], shared by the rows (a group's prompt), runs once; the rows'
    later tokens run packed in one sequence on its KV cache under a block mask (each sees the prefix and itself;
    lengths (B,): the rows' real tokens, so padding is not run). Gradients flow through the cache; unrun reads 0."""
    _need(
        input_ids.shape == labels.shape and input_ids.dim() == 2,
        f"input_ids {tuple(input_ids.shape)}, labels {tuple(labels.shape)}: both (B, T)",
    )
    _need(
        temperature > 0,
        f"temperature must be > 0 (got {temperature}); greedy decoding has no log-probs to match",
    )
    (B, T), P, dev = (
        labels.shape,
        int(prefix_len) if input_ids.shape[0] > 1 else 0,
        input_ids.device,
    )
    _need(
        not P or (P < T and torch.equal(input_ids[:, :P], input_ids[:1, :P].expand(B, P))),
        f"prefix_len {P}: the rows do not share their first {P} tokens (or nothing follows them)",
    )
    lens = (
        torch.as_tensor(lengths).tolist() if P and lengths is not None else [T] * B
    )  # each row's tokens, prefix included
    _need(
        len(lens) == B and all(P <= n <= T for n in lens),
        f"lengths {lens}: one per row, each in [prefix_len {P}, {T}]",
    )
    row = torch.arange(B, device=dev).repeat_interleave(
        torch.tensor(lens, device=dev) - P
    )  # (N,) of each token run
    col = torch.cat(
        [torch.arange(P, n, device=dev) for n in lens]
    )  # (N,) its column = its position id
    labels = labels[row, col].clamp(
        min=0
    )  # HF-style -100 "ignore" labels score token 0; the mask drops them
    banned = (
        ban_token_ids is not None and len(ban_token_ids) and ban_mask is not None
    )  # ban (N,), ban_ids (k,)
    ban, ban_ids = (
        (
            ban_mask.to(dev, torch.bool)[row, col],
            torch.as_tensor(ban_token_ids, dtype=torch.long, device=dev),
        )
        if banned
        else (None, None)
    )
    _check_model(model)
    parts = (
        (model.base_model, model.get_output_embeddings().weight)
        if model._logprob_fast_path
        else None
    )
    fwd, kw, ids = parts[0] if parts else model, {"use_cache": False}, input_ids
    if P:
        from transformers import DynamicCache

        _need(
            not (getattr(model, "is_gradient_checkpointing", False) and model.training),
            "prefix_len needs the KV cache: no gradient checkpointing",
        )
        cache = DynamicCache(config=model.config)
        fwd(
            input_ids=input_ids[:1, :P], past_key_values=cache, use_cache=True
        )  # the shared prefix, once
        keep = torch.cat(
            [
                torch.ones(len(col), P, dtype=torch.bool, device=dev),
                (row[:, None] == row) & (col[:, None] >= col),
            ],
            1,
        )
        keep = (
            keep
            if "sdpa" in str(model.config._attn_implementation)
            else torch.zeros(keep.shape, device=dev).masked_fill(
                ~keep, torch.finfo(torch.float32).min
            )
        )  # eager and others add the mask to the scores
        ids, kw = (
            input_ids[row, col][None],
            {
                "past_key_values": cache,
                "use_cache": True,
                "position_ids": col[None],
                "attention_mask": keep[None, None],
            },
        )  # (1, 1, N, P + N)
    out = fwd(input_ids=ids, **kw)
    h = (out.last_hidden_state if parts else out.logits).reshape(len(col), -1)  # (N, H) or (N, V)
    logp, ent = _ChunkedLogProbs.apply(
        h,
        parts[1] if parts else None,
        labels,
        float(temperature),
        int(chunk_size),
        return_token_entropy,
        ban,
        ban_ids,
    )
    put = lambda x: x.new_zeros(B, T).index_put((row, col), x)  # noqa: E731  (N,) -> (B, T)
    return {"log_probs": put(logp)} | ({"token_entropy": put(ent)} if return_token_entropy else {})


# ----------------------------------------------------------------------------- masked reductions
def masked_mean(tensor, mask, dim=None):
    """Seed 000's: mean where mask is true, along `dim` (all if None; NaN if none). 002's: masked_mean_per_sequence."""
    return masked_normalize(tensor, mask, mask.bool().sum(dim), dim)


def masked_normalize(tensor, mask, normalize_constant=None, dim=None, *, constant_normalizer=None):
    """Sum of `tensor` where mask is true, along `dim` (all if None), / normalize_constant (or constant_normalizer=)."""
    c = normalize_constant if normalize_constant is not None else constant_normalizer
    _need(c is not None, "masked_normalize needs normalize_constant")
    return torch.where(mask.bool(), tensor, 0.0).sum(dim) / c  # dim None: all elements


def masked_mean_per_sequence(tensor, mask):
    """Seed 002's masked_mean(tensor, mask), not 000's (above): each row's mean (0 if no tokens), then their mean."""
    return masked_normalize(tensor, mask, mask.bool().sum(-1).clamp(min=1), dim=-1).mean()


def masked_mean_drgrpo(tensor, mask, num_tokens):
    """Seed 002's Dr. GRPO reduction: sum over response tokens / (num_tokens * B), a scalar."""
    return masked_normalize(tensor, mask, num_tokens * tensor.shape[0])


def _need(cond, message):
    if not cond:
        raise ValueError(message)


def _check_2d(name, t, shape):
    _need(
        t.shape == shape,
        f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} (batch_size, sequence_length)",
    )


def _per_example(x, batch, name):  # (B,) or (B, 1) -> (B, 1), broadcast over the sequence
    _need(
        tuple(x.shape) in ((batch,), (batch, 1)),
        f"{name} has shape {tuple(x.shape)}, expected ({batch},) or ({batch}, 1)",
    )
    return x.reshape(batch, 1)


# ----------------------------------------------------------------------------- SFT
def sft_microbatch_loss(
    policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant=1.0
):
    """Pure: -masked_normalize(log_probs, mask, c, dim=-1) per example, batch mean, / grad-acc -> (loss, meta)."""
    _check_2d("response_mask", response_mask, policy_log_probs.shape)
    loss = -masked_normalize(
        policy_log_probs, response_mask, normalize_constant, dim=-1
    ).mean()  # row sums, batch mean
    return loss / gradient_accumulation_steps, {
        "nll_per_token": -masked_mean(policy_log_probs, response_mask).detach(),
        "num_response_tokens": response_mask.sum().detach(),
    }


def sft_microbatch_train_step(
    policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant=1.0
):
    """Seed 000 §4.2: sft_microbatch_loss, then backward(). Returns (detached loss, metadata)."""
    loss, meta = sft_microbatch_loss(
        policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant
    )
    loss.backward()
    return loss.detach(), meta


# ----------------------------------------------------------------------------- advantages
def compute_group_normalized_rewards(
    reward_fn,
    rollout_responses,
    repeated_ground_truths,
    group_size,
    advantage_eps,
    normalize_by_std=None,
    *,
    normalized_by_std=None,
    reward_dicts=None,
):
    """A = (r - group mean) / (group std + eps) (unbiased std), or r - mean without std (Dr. GRPO; seed 001 spells
    it normalized_by_std) for N = prompts x G responses; reward_fn -> dict or float. -> (adv (N,), raw (N,), meta)."""
    std_norm, n = (
        normalize_by_std if normalize_by_std is not None else normalized_by_std,
        len(rollout_responses),
    )
    _need(std_norm is not None, "compute_group_normalized_rewards needs normalize_by_std")
    _need(
        len(repeated_ground_truths) == n,
        f"{n} responses but {len(repeated_ground_truths)} ground truths; repeat each G times",
    )
    _need(
        group_size >= 1 and n % group_size == 0,
        f"group_size {group_size} does not divide the batch of {n} responses",
    )
    _need(
        not std_norm or group_size >= 2,
        "normalize_by_std needs group_size >= 2 (the std of one sample is undefined)",
    )
    if reward_dicts is None:
        reward_dicts = [reward_fn(r, g) for r, g in zip(rollout_responses, repeated_ground_truths)]
    _need(
        len(reward_dicts) == n,
        f"{len(reward_dicts)} reward_dicts for {n} responses; pass one per response",
    )
    raw = torch.tensor(
        [float(d["reward"] if isinstance(d, dict) else d) for d in reward_dicts]
    )  # (N,) float32
    grouped = raw.view(-1, group_size)  # (n_prompts, G)
    # equal rewards carry no signal, but float32 leaves r - mean ~ 1e-8, / eps a ~1e-2 advantage: Adam (scale-free)
    # would take a full-size random step on it, so it is zeroed exactly
    flat = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)  # (n_prompts, 1)
    centered = torch.where(flat, 0.0, grouped - grouped.mean(dim=1, keepdim=True))
    adv = (
        centered / (grouped.std(dim=1, keepdim=True) + advantage_eps) if std_norm else centered
    )  # std (n_prompts, 1)
    meta = {
        "mean": raw.mean().item(),
        "std": raw.std().item() if n > 1 else 0.0,
        "max": raw.max().item(),
        "min": raw.min().item(),
        "frac_groups_zero_std": flat.float().mean().item(),
    }  # seed 002's keys
    return adv.reshape(-1), raw, meta


def compute_group_normalized_advantages(
    rollout_responses,
    repeated_ground_truths,
    reward_fn,
    group_size,
    advantage_eps,
    normalize_by_std,
):
    """Seed 002 §1.4.1's spelling: its argument order, reward_fn returning a float, metadata values 0-d tensors."""
    adv, raw, meta = compute_group_normalized_rewards(
        reward_fn,
        rollout_responses,
        repeated_ground_truths,
        group_size,
        advantage_eps,
        normalize_by_std,
    )
    return adv, raw, {k: torch.tensor(v) for k, v in meta.items()}


# ----------------------------------------------------------------------------- per-token losses
def compute_naive_policy_gradient_loss(raw_rewards_or_advantages, policy_log_probs):
    """Per-token -A * log p: A (B, 1) or (B,), log p (B, T) -> (B, T)."""
    a = _per_example(
        raw_rewards_or_advantages, policy_log_probs.shape[0], "raw_rewards_or_advantages"
    )
    return -a.to(policy_log_probs.dtype) * policy_log_probs


def compute_grpo_clip_loss(
    advantages, policy_log_probs, old_log_probs, cliprange, *, cliprange_high=None
):
    """Per-token -min(r A, clip(r, 1 - eps, 1 + eps_high) A), r = exp(logp - old_logp), eps_high default eps.
    A (B, 1) or (B,), log-probs (B, T) -> (loss (B, T), {"clipped": (B, T) bool, clip was active; "ratio"})."""
    _check_2d("old_log_probs", old_log_probs, policy_log_probs.shape)
    a = _per_example(advantages, policy_log_probs.shape[0], "advantages").to(
        policy_log_probs.dtype
    )  # (B, 1)
    hi = cliprange if cliprange_high is None else cliprange_high
    ratio = torch.exp(policy_log_probs - old_log_probs)  # (B, T)
    unclipped, clipped = ratio * a, torch.clamp(ratio, 1.0 - cliprange, 1.0 + hi) * a
    return -torch.minimum(unclipped, clipped), {
        "clipped": (clipped < unclipped).detach(),
        "ratio": ratio.detach(),
    }


def compute_loss(advantages, policy_log_probs, old_log_probs, clip_range):
    """Seed 002 §1.4.2's name and spelling of compute_grpo_clip_loss: A (B,), (B, T) -> (loss (B, T), metadata)."""
    return compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, clip_range)


def compute_grpo_no_clip_loss(advantages, policy_log_probs, old_log_probs):
    """Seed 001's GRPO-No-Clip: per-token -r A = GRPO-Clip with an infinite clip range -> (loss (B, T), {"ratio"})."""
    loss, meta = compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, float("inf"))
    return loss, {"ratio": meta["ratio"]}


def compute_gspo_loss(
    advantages, policy_log_probs, old_log_probs, response_mask, cliprange, *, cliprange_high=None
):
    """GSPO: s = exp(mean over response tokens of (logp - old_logp)) per sequence, clipped like PPO, the sequence
    loss broadcast to its tokens. A (B, 1) or (B,), (B, T) -> (loss (B, T), {"clipped", "ratio"} as (B, T))."""
    _check_2d("response_mask", response_mask, policy_log_probs.shape)
    _check_2d("old_log_probs", old_log_probs, policy_log_probs.shape)
    n = (
        response_mask.bool().sum(-1, keepdim=True).clamp(min=1)
    )  # (B, 1); empty rows give 0, not NaN grads
    mean_log_ratio = (
        masked_normalize(policy_log_probs - old_log_probs, response_mask, 1.0, dim=-1)[:, None] / n
    )
    loss_seq, meta = compute_grpo_clip_loss(
        advantages,
        mean_log_ratio,
        torch.zeros_like(mean_log_ratio),
        cliprange,
        cliprange_high=cliprange_high,
    )  # (B, 1)
    return loss_seq.expand(policy_log_probs.shape), {
        k: v.expand(policy_log_probs.shape) for k, v in meta.items()
    }


LOSSES = {  # loss_type -> (function, its arguments in order). A new loss is one function above and one line here.
    "no_baseline": (compute_naive_policy_gradient_loss, ("raw_rewards", "policy_log_probs")),
    "reinforce_with_baseline": (
        compute_naive_policy_gradient_loss,
        ("advantages", "policy_log_probs"),
    ),
    "grpo_clip": (
        compute_grpo_clip_loss,
        ("advantages", "policy_log_probs", "old_log_probs", "cliprange"),
    ),
    "grpo_no_clip": (
        compute_grpo_no_clip_loss,
        ("advantages", "policy_log_probs", "old_log_probs"),
    ),
    "gspo": (
        compute_gspo_loss,
        ("advantages", "policy_log_probs", "old_log_probs", "response_mask", "cliprange"),
    ),
}
LOSS_TYPES = tuple(LOSSES)
RATIO_LOSSES = tuple(
    k for k, (_, names) in LOSSES.items() if "old_log_probs" in names
)  # those needing pi_old


def compute_policy_gradient_loss(
    policy_log_probs,
    loss_type,
    raw_rewards=None,
    advantages=None,
    old_log_probs=None,
    cliprange=None,
    *,
    cliprange_high=None,
    response_mask=None,
):
    """Per-token loss of `loss_type` (seed 000 §7.2): returns (loss (B, T), metadata of (B, T) tensors)."""
    _need(loss_type in LOSSES, f"unknown loss_type {loss_type!r}; choose one of {LOSS_TYPES}")
    fn, names = LOSSES[loss_type]
    given = dict(locals())  # the arguments by name
    for name in names:
        _need(given[name] is not None, f"loss_type {loss_type!r} requires {name}")
    out = fn(
        *[given[n] for n in names],
        **({"cliprange_high": cliprange_high} if "cliprange" in names else {}),
    )
    return out if isinstance(out, tuple) else (out, {})


# ----------------------------------------------------------------------------- KL and rollout correction
def compute_kl(policy_log_probs, ref_log_probs, estimator="k3"):
    """Per-token estimate of KL(pi || ref) from samples of pi (Schulman's k1/k2/k3), (B, T) -> (B, T).
    With log r = ref - logp: k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r (seed 003 Eq. 2)."""
    _check_2d("ref_log_probs", ref_log_probs, policy_log_probs.shape)
    _need(
        estimator in ("k1", "k2", "k3"),
        f"unknown kl estimator {estimator!r}; choose one of k1, k2, k3",
    )
    log_r = ref_log_probs - policy_log_probs  # (B, T)
    return (
        -log_r
        if estimator == "k1"
        else 0.5 * log_r**2
        if estimator == "k2"
        else torch.exp(log_r) - 1.0 - log_r
    )


def kl_divergence(policy_log_probs, ref_log_probs, response_mask, estimator="k3"):
    """KL(pi || ref), a scalar: k1/k2/k3 over response tokens, or "seq" (004 Eq. 8: rows' k1 sums, averaged)."""
    if estimator == "seq":
        return masked_normalize(
            compute_kl(policy_log_probs, ref_log_probs, "k1"), response_mask, 1.0, dim=-1
        ).mean()
    return masked_mean(compute_kl(policy_log_probs, ref_log_probs, estimator), response_mask)


def compute_rollout_is(
    old_log_probs, engine_log_probs, response_mask, mode="tis", cap=2.0, level="token", floor=0.0
):
    """Rollout correction: the engine samples mu, the trainer scores pi_old (kernels, precision, staleness), and
    rho = pi_old / mu per token, or per sequence (the product over its tokens).
    - tis (truncated IS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
      Training"): weight min(rho, cap).
    - mis (masked IS; Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
      Training-Inference Mismatch"): weight rho where rho <= cap, 0 beyond it. A dropped token (sequence) keeps
      its place in the loss's normaliser with weight 0, as in the estimator E_mu[1(rho <= C) rho A grad log pi].
      floor > 0 also drops rho < floor (an explicit option; the definition has no lower bound).
    -> (detached weights (B, T), metrics: k3 KL(mu || pi_old), rho's mean/min/max over response tokens, the
    fraction of tokens with rho outside [0.5, 2], the fraction of response tokens MIS weights 0)."""
    _need(mode in ROLLOUT_IS, f"rollout IS mode {mode!r}: choose one of {ROLLOUT_IS}")
    _need(level in ("token", "sequence"), f"rollout IS level {level!r}: choose token or sequence")
    mask = response_mask.bool()
    log_ratio = torch.where(mask, old_log_probs - engine_log_probs, 0.0)  # (B, T)
    if level == "sequence":
        ratio = torch.where(
            mask, log_ratio.sum(-1, keepdim=True), 0.0
        ).exp()  # (B, T), the row's rho on its tokens
    else:
        ratio = log_ratio.exp()  # (B, T)
    kept = torch.ones_like(mask)  # (B, T)
    if mode == "tis":
        weights = ratio.clamp(max=cap)
    elif mode == "mis":
        kept = (ratio <= cap) & (ratio >= floor)
        weights = torch.where(kept, ratio, 0.0)
    else:
        weights = torch.ones_like(ratio)
    dropped = mask & ~kept
    if mask.any():
        lr = log_ratio[mask]  # (n,) per response token
        r = ratio[mask]
    else:
        lr = torch.zeros(1)
        r = torch.ones(1)
    metrics = {
        "mismatch_kl": (lr.exp() - 1 - lr).mean().item(),
        "is_weight_mean": r.mean().item(),
        "is_weight_min": r.min().item(),
        "is_weight_max": r.max().item(),
        "is_weight_outside_frac": (lr.abs() > 0.6931472).float().mean().item(),  # |log rho| > log 2
        "is_dropped_frac": dropped.sum().item() / max(mask.sum().item(), 1),
    }
    return weights.detach(), metrics


# ----------------------------------------------------------------------------- GRPO microbatch
def grpo_microbatch_loss(
    policy_log_probs,
    response_mask,
    gradient_accumulation_steps,
    loss_type,
    raw_rewards=None,
    advantages=None,
    old_log_probs=None,
    cliprange=None,
    *,
    cliprange_high=None,
    length_norm="masked_mean",
    normalize_constant=None,
    ref_log_probs=None,
    kl_beta=0.0,
    kl_estimator="k3",
    is_weights=None,
):
    """Pure: per-token PG loss (x detached is_weights) (+ kl_beta * KL) -> length_norm -> this microbatch's share of
    the step's loss -> (loss, detached 0-d metadata). length_norm: masked_mean / masked_normalize (seed 002's two
    reductions, / grad-acc) or token (DAPO: sum / normalize_constant = the step's response tokens: grads -A_i / N)."""
    _need(
        policy_log_probs.dim() == 2,
        f"policy_log_probs has shape {tuple(policy_log_probs.shape)}, expected (B, T)",
    )
    _check_2d("response_mask", response_mask, policy_log_probs.shape)
    _need(
        length_norm in LENGTH_NORMS,
        f"unknown length_norm {length_norm!r}; choose one of {LENGTH_NORMS}",
    )
    _need(
        length_norm != "masked_normalize" or normalize_constant is not None,
        "masked_normalize requires normalize_constant",
    )
    _need(not kl_beta or ref_log_probs is not None, f"kl_beta={kl_beta} requires ref_log_probs")
    per_token, loss_meta = compute_policy_gradient_loss(
        policy_log_probs,
        loss_type,
        raw_rewards,
        advantages,
        old_log_probs,
        cliprange,
        cliprange_high=cliprange_high,
        response_mask=response_mask,
    )
    if is_weights is not None:
        _check_2d("is_weights", is_weights, policy_log_probs.shape)
        per_token = per_token * is_weights.detach()
    meta, kl = (
        {},
        None
        if ref_log_probs is None
        else compute_kl(policy_log_probs, ref_log_probs, kl_estimator.replace("seq", "k3")),
    )
    if kl is not None:  # (B, T)
        meta["kl"], per_token = (
            masked_mean(kl.detach(), response_mask),
            per_token + kl_beta * kl if kl_beta else per_token,
        )
    mask = response_mask.bool()
    if length_norm == "token":  # DAPO: every token of the optimizer step weighs the same
        loss = masked_normalize(
            per_token,
            mask,
            normalize_constant or mask.sum().clamp(min=1) * gradient_accumulation_steps,
        )
    else:  # per row: its mean (seed 002's masked_mean) or its sum / a constant (Dr. GRPO); batch mean, / grad-acc
        loss = (
            masked_mean_per_sequence(per_token, mask)
            if length_norm == "masked_mean"
            else masked_normalize(per_token, mask, normalize_constant, dim=-1).mean()
        ) / gradient_accumulation_steps
    if "clipped" in loss_meta:
        n_tokens = mask.sum().clamp(
            min=1
        )  # a pass with no response token left clips nothing: 0, not NaN
        meta["clip_fraction"] = masked_normalize(loss_meta["clipped"].float(), mask, n_tokens)
    if "ratio" in loss_meta:
        r = loss_meta["ratio"]
        meta.update(
            ratio_mean=masked_mean(r, mask),
            ratio_max=torch.where(mask, r, -torch.inf).max(),
            ratio_min=torch.where(mask, r, torch.inf).min(),
        )
    return loss, meta | {"num_response_tokens": mask.sum()}


def grpo_microbatch_train_step(
    policy_log_probs,
    response_mask,
    gradient_accumulation_steps,
    loss_type,
    raw_rewards=None,
    advantages=None,
    old_log_probs=None,
    cliprange=None,
    **kwargs,
):
    """Seed 000 §7.2: grpo_microbatch_loss (its keyword options), then backward() -> (detached loss, metadata)."""
    loss, meta = grpo_microbatch_loss(
        policy_log_probs,
        response_mask,
        gradient_accumulation_steps,
        loss_type,
        raw_rewards,
        advantages,
        old_log_probs,
        cliprange,
        **kwargs,
    )
    loss.backward()
    return loss.detach(), meta
