"""Tensor primitives for SFT and GRPO: tokenisation, log-probs, entropy, masked reductions and the
policy-gradient losses.

The functions are pure functions of tensors (plus `model` / `tokenizer` where a seed signature
has one). Shapes: B batch, T sequence, V vocabulary, H hidden size, N tokens run. The handouts'
names and signatures (seed 000 §4.2/§7.2, 001 §5.2, 002 §1.4) that differ from the project's own
sit together in the "course spellings" section at the end, each delegating to the functions above.

Where this departs from the handouts:
- Every policy-gradient loss takes the same inputs (log-probs, mask, advantages, raw rewards,
  pi_old's log-probs, LossSettings); LOSSES holds each loss's function and whether it needs pi_old.
- get_response_log_probs never builds a float32 (B, T, V) tensor (the lm_head and log-softmax run a
  chunk of tokens at a time, and the backward recomputes each chunk); it scores what vLLM sampled
  (logits / temperature, the min_tokens ban); and it runs a prompt shared by its rows once, the rows
  packed after it on its KV cache (prefix_len).

Example:
    out = get_response_log_probs(model, input_ids, labels, return_token_entropy=True)
    settings = LossSettings(loss="grpo_clip", cliprange=0.2)
    loss, meta = grpo_microbatch_loss(
        out["log_probs"], response_mask, adv, raw, settings, old_log_probs=old
    )
"""

import contextlib
import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction
from typing import NamedTuple

import torch

LENGTH_NORMS = ("masked_mean", "masked_normalize", "token")
KL_ESTIMATORS = ("k1", "k2", "k3", "seq")  # "seq" = seed 004 Eq. 8 (monitoring only)
ROLLOUT_IS = ("none", "tis", "mis")
# the logit of a banned token: exp() is 0 and 0 * BANNED is 0 (with -inf, the entropy would be NaN)
BANNED = -1e30


# ----------------------------------------------------------------------------- tokenisation
def tokenize_prompt_and_output(prompt_strs, output_strs, tokenizer):
    """Tokenise the prompts (with the tokenizer's special tokens, as vLLM does) and the outputs
    (without) apart, concatenate and right-pad. Returns input_ids (B, L-1) (all but the last
    token), labels (B, L-1) (all but the first) and a bool response_mask (B, L-1)."""
    _need(
        len(prompt_strs) == len(output_strs),
        f"got {len(prompt_strs)} prompts but {len(output_strs)} outputs; "
        "pass one output per prompt",
    )
    prompt_ids = tokenizer(list(prompt_strs))["input_ids"]
    output_ids = tokenizer(list(output_strs), add_special_tokens=False)["input_ids"]
    if tokenizer.pad_token_id is not None:
        pad_id = tokenizer.pad_token_id
    else:
        pad_id = tokenizer.eos_token_id or 0
    longest = max(len(p) + len(o) for p, o in zip(prompt_ids, output_ids))
    ids = torch.full((len(prompt_ids), longest), pad_id)  # (B, L)
    mask = torch.zeros(ids.shape, dtype=torch.bool)  # (B, L), True on output tokens
    for i, (p, o) in enumerate(zip(prompt_ids, output_ids)):
        ids[i, : len(p) + len(o)] = torch.tensor(p + o, dtype=torch.long)
        mask[i, len(p) : len(p) + len(o)] = True
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "response_mask": mask[:, 1:]}


# ----------------------------------------------------------------------------- entropy / log-probs
def compute_entropy(logits):
    """Entropy of softmax(logits) over the last dim: (..., V) -> (...).
    Stable: H = logsumexp(z) - sum(p * z)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_normaliser = torch.logsumexp(logits, dim=-1)  # (...)
    expected_logit = (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)  # (...)
    return log_normaliser - expected_logit


def _chunk_logits(h, w, temperature, ban, ban_ids, acc):
    """A fresh (c, V) tensor in dtype `acc` of logits / temperature: h @ W^T, or h itself if W is
    None (h are then logits). Banned ids (ban_ids (k,), on the rows where ban (c,) is set) read
    BANNED."""
    if w is None:
        z = h.to(acc, copy=True)  # (c, V), the only big tensor
    else:
        z = (h @ w.t()).to(acc)  # (c, V), the only big tensor
    if temperature != 1.0:
        z.div_(temperature)
    if ban is not None and bool(ban.any()):
        z[ban.nonzero().squeeze(-1)[:, None], ban_ids[None, :]] = BANNED
    return z


class _ChunkedLogProbs(torch.autograd.Function):
    """log p(label) and the entropy of softmax((h @ W^T).float() / temperature), `chunk` tokens at a
    time (W None: h are the logits).

    The forward keeps per-token scalars (lse, entropy); the backward recomputes each chunk's logits,
    so the peak extra memory is O(chunk * V), not O(N * V). With p the softmax:
    d logp_y / dz = onehot(y) - p and dH / dz = -p (log p + H), both divided by the temperature.
    W is cast to h's dtype (bf16 under autocast over fp32 master weights); its gradient keeps W's.
    """

    @staticmethod
    def forward(ctx, h, weight, labels, temperature, chunk, want_ent, ban, ban_ids):
        # h (N, H) or (N, V), weight (V, H) or None, labels (N,), ban (N,) or None, ban_ids (k,)
        # unused outputs give None gradients, so the backward skips their work
        ctx.set_materialize_grads(False)
        n = h.shape[0]
        acc = torch.promote_types(h.dtype, torch.float32)
        w = None if weight is None else weight.to(h.dtype)
        logp = h.new_empty(n, dtype=acc)  # (N,)
        lse = h.new_empty(n, dtype=acc)  # (N,)
        ent = h.new_zeros(n, dtype=acc)  # (N,)
        for s in range(0, n, chunk):
            ban_chunk = None if ban is None else ban[s : s + chunk]
            z = _chunk_logits(h[s : s + chunk], w, temperature, ban_chunk, ban_ids, acc)  # (c, V)
            lse_c = torch.logsumexp(z, dim=-1)  # (c,)
            lse[s : s + chunk] = lse_c
            logp[s : s + chunk] = z.gather(-1, labels[s : s + chunk, None]).squeeze(-1) - lse_c
            if want_ent:
                z.sub_(lse_c[:, None])  # log p, in place
                ent[s : s + chunk] = -(z.exp() * z).sum(-1)
        ctx.save_for_backward(h, weight, labels, lse, ent, ban, ban_ids)
        ctx.temperature = temperature
        ctx.chunk = chunk
        # the backward must recompute exactly these logits: under autocast h @ W^T ran in the
        # autocast dtype, and a softmax built from an fp32 recomputation minus this lse would not
        # sum to 1
        ctx.autocast_device_type = h.device.type
        ctx.autocast_enabled = torch.is_autocast_enabled(ctx.autocast_device_type)
        ctx.autocast_dtype = torch.get_autocast_dtype(ctx.autocast_device_type)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):  # g_logp, g_ent (N,) or None
        # the forward's precision, on CPU and CUDA
        with torch.autocast(
            ctx.autocast_device_type, dtype=ctx.autocast_dtype, enabled=ctx.autocast_enabled
        ):
            return _ChunkedLogProbs._backward(ctx, g_logp, g_ent, *ctx.saved_tensors)

    @staticmethod
    def _backward(ctx, g_logp, g_ent, h, weight, labels, lse, ent, ban, ban_ids):
        # h (N, H) or (N, V), weight (V, H) or None, labels (N,), lse (N,), ent (N,), ban (N,) or
        # None, ban_ids (k,) or None
        c = ctx.chunk
        w = None if weight is None else weight.to(h.dtype)
        need_h = ctx.needs_input_grad[0]
        need_w = w is not None and ctx.needs_input_grad[1]
        grad_h = None
        if need_h:
            grad_h = torch.zeros_like(h)
        grad_w = None
        if need_w:
            grad_w = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device)
        for s in range(0, h.shape[0], c):
            ban_chunk = None if ban is None else ban[s : s + c]
            z = _chunk_logits(h[s : s + c], w, ctx.temperature, ban_chunk, ban_ids, lse.dtype)
            p = z.sub_(lse[s : s + c, None]).exp()  # z is now log p; p (c, V)
            if g_logp is not None:
                gl = g_logp[s : s + c, None]  # (c, 1)
            else:
                gl = p.new_zeros(p.shape[0], 1)  # (c, 1)
            # gz = p * (-(log p + H) * g_ent - g_logp), built in place in z
            # (without entropy: -p g_logp, in place in p)
            if g_ent is not None:
                gz = z.add_(ent[s : s + c, None]).mul_(-g_ent[s : s + c, None]).sub_(gl).mul_(p)
            else:
                gz = p.mul_(-gl)
            # + g_logp at the label: (onehot - p) g
            gz.scatter_add_(-1, labels[s : s + c, None], gl)
            # the naive graph casts here too (the backward of .float())
            gz = gz.div_(ctx.temperature).to(h.dtype)
            if need_h:
                if w is None:
                    grad_h[s : s + c] = gz
                else:
                    grad_h[s : s + c] = gz @ w
            if need_w:
                grad_w += (gz.t() @ h[s : s + c]).to(grad_w.dtype)
        if need_w:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None, None, None, None


def _check_model(model):
    """Once per model, on 3 rows sharing their first 5 tokens, two checks whose verdicts are kept
    on the model (a model failing one gets the plain computation):
    - `_logprob_fast_path`: does body(x) @ W^T give the model's logits? Config flags scale or cap
      them in ways no attribute list keeps up with (Granite, Gemma); failing it, the chunked head
      reads the model's own logits.
    - `_logprob_shared_prefix`: does prefix_len's KV-cache reuse give the plain log-probs?
      Failing it, no prefix sharing."""
    fast_known = getattr(model, "_logprob_fast_path", None) is not None
    prefix_known = getattr(model, "_logprob_shared_prefix", None) is not None
    if fast_known and prefix_known:
        return
    w = next(model.parameters())
    was_training = model.training
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, model.config.vocab_size, (3, 9), generator=generator).to(w.device)
    ids[:, :5] = ids[:1, :5]  # (3, 9), the rows share their first 5 tokens
    try:
        with torch.no_grad(), torch.autocast(w.device.type, enabled=False):
            model.eval()  # no dropout in the checks
            if getattr(model, "_logprob_fast_path", None) is None:
                model._logprob_fast_path = _fast_path_works(model, ids)
            if getattr(model, "_logprob_shared_prefix", None) is None:
                _check_shared_prefix(model, ids, w.dtype)
    finally:
        model.train(was_training)


def _fast_path_works(model, ids):
    """Do the model's body and its bias-free linear head give its own logits on ids (3, 9)?"""
    get_head = getattr(model, "get_output_embeddings", None)
    head = None
    if get_head is not None:
        head = get_head()
    body = getattr(model, "base_model", None)
    if body is None or body is model:
        return False
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return False
    hidden = body(input_ids=ids, use_cache=False).last_hidden_state  # (3, 9, H)
    fast = (hidden @ head.weight.t()).float()  # (3, 9, V)
    ref = model(input_ids=ids, use_cache=False).logits.float()  # (3, 9, V)
    atol = 1e-3 * float(ref.abs().max()) + 1e-5
    return bool(torch.allclose(fast, ref, rtol=1e-2, atol=atol))


def _check_shared_prefix(model, ids, dtype):
    """Sets model._logprob_shared_prefix: do the log-probs after a 4-token prefix run once (its KV
    cache reused) equal the plain ones? A sliding window says no: the one 4D block mask would serve
    a windowed layer as a full one. A model without a usable KV cache stays False."""
    cfg = model.config
    model._logprob_shared_prefix = False  # False while the check runs (it calls back in here)
    layer_types = getattr(cfg, "layer_types", None) or ()
    has_window = bool(
        getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True)
    )
    windowed = "sliding_attention" in layer_types or has_window
    if dtype == torch.float32:
        atol = 1e-4
    else:
        atol = 5e-2  # bf16 / fp16 weights
    with contextlib.suppress(TypeError, ValueError, RuntimeError, AttributeError):
        shared = get_response_log_probs(model, ids[:, :-1], ids[:, 1:], prefix_len=4)
        plain = get_response_log_probs(model, ids[:, :-1], ids[:, 1:], prefix_len=0)
        a = shared["log_probs"][:, 4:]  # (3, 4), the tokens after the prefix
        b = plain["log_probs"][:, 4:]  # (3, 4)
        model._logprob_shared_prefix = not windowed and bool(torch.allclose(a, b, atol=atol))


def shared_prefix_works(model):
    """Does prefix_len (a shared prompt run once, its KV cache reused) reproduce this model's plain
    log-probs?"""
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
    """Per-token log p(labels | prefix) and optionally the entropy, (B, T) float32 each, of
    logits / temperature (the distribution vLLM samples from).

    - ban_token_ids (k,) are taken out of the softmax where ban_mask (B, T) is set (min_tokens).
    - chunk_size tokens' logits are built at a time (see _ChunkedLogProbs).
    - prefix_len P: input_ids[:, :P], shared by the rows (a group's prompt), runs once; the rows'
      later tokens run packed in one sequence on its KV cache under a block mask (each token sees
      the prefix and its own row). lengths (B,): the rows' real tokens, prefix included, so padding
      is not run. Gradients flow through the cache; positions not run read 0.
    Returns {"log_probs": (B, T)} and, with return_token_entropy, "token_entropy": (B, T)."""
    _need(
        input_ids.shape == labels.shape and input_ids.dim() == 2,
        f"input_ids {tuple(input_ids.shape)}, labels {tuple(labels.shape)}: both (B, T)",
    )
    _need(
        temperature > 0,
        f"temperature must be > 0 (got {temperature}); greedy decoding has no log-probs to match",
    )
    B, T = labels.shape
    P = 0  # a single row has nothing to share
    if input_ids.shape[0] > 1:
        P = int(prefix_len)
    dev = input_ids.device
    _need(
        not P or (P < T and torch.equal(input_ids[:, :P], input_ids[:1, :P].expand(B, P))),
        f"prefix_len {P}: the rows do not share their first {P} tokens (or nothing follows them)",
    )
    if P and lengths is not None:
        lens = torch.as_tensor(lengths).tolist()  # each row's tokens, prefix included
    else:
        lens = [T] * B
    _need(
        len(lens) == B and all(P <= n <= T for n in lens),
        f"lengths {lens}: one per row, each in [prefix_len {P}, {T}]",
    )
    # the N tokens that run, row by row: row (N,) is each one's row, col (N,) its column, which is
    # also its position id
    row = torch.arange(B, device=dev).repeat_interleave(torch.tensor(lens, device=dev) - P)
    col = torch.cat([torch.arange(P, n, device=dev) for n in lens])
    # HF-style -100 "ignore" labels score token 0; the mask drops them
    labels = labels[row, col].clamp(min=0)  # (N,)
    ban = None  # (N,)
    ban_ids = None  # (k,)
    if ban_token_ids is not None and len(ban_token_ids) and ban_mask is not None:
        ban = ban_mask.to(dev, torch.bool)[row, col]
        ban_ids = torch.as_tensor(ban_token_ids, dtype=torch.long, device=dev)
    _check_model(model)
    fast = model._logprob_fast_path  # body @ head in chunks, else the model's own logits
    fwd = model
    if fast:
        # a model sharded by sharding.shard (FSDP2) runs its body through the root's hooks, which
        # gather the embeddings, the final norm and the head (kept gathered until the backward)
        fwd = getattr(model, "gathering_body", model.base_model)
    ids = input_ids
    kw = {"use_cache": False}
    if P:
        ids, kw = _packed_after_prefix(model, fwd, input_ids, row, col, P)
    out = fwd(input_ids=ids, **kw)
    head_weight = None
    if fast:
        head_weight = model.get_output_embeddings().weight  # (V, H), read after the body ran
        h = out.last_hidden_state.reshape(len(col), -1)  # (N, H)
    else:
        h = out.logits.reshape(len(col), -1)  # (N, V)
    logp, ent = _ChunkedLogProbs.apply(
        h,
        head_weight,
        labels,
        float(temperature),
        int(chunk_size),
        return_token_entropy,
        ban,
        ban_ids,
    )  # (N,) each
    result = {"log_probs": logp.new_zeros(B, T).index_put((row, col), logp)}  # (B, T)
    if return_token_entropy:
        result["token_entropy"] = ent.new_zeros(B, T).index_put((row, col), ent)  # (B, T)
    return result


def _packed_after_prefix(model, fwd, input_ids, row, col, P):
    """Runs the shared prefix input_ids[:1, :P] once into a KV cache, and returns the input_ids
    (1, N) and keyword arguments of one packed forward of every row's later tokens on that cache:
    each token attends to the prefix and to its own row's earlier tokens."""
    from transformers import DynamicCache

    _need(
        not (getattr(model, "is_gradient_checkpointing", False) and model.training),
        "prefix_len needs the KV cache: no gradient checkpointing",
    )
    dev = input_ids.device
    cache = DynamicCache(config=model.config)
    fwd(input_ids=input_ids[:1, :P], past_key_values=cache, use_cache=True)  # the prefix, once
    sees_prefix = torch.ones(len(col), P, dtype=torch.bool, device=dev)  # (N, P)
    sees_own_row = (row[:, None] == row) & (col[:, None] >= col)  # (N, N), causal within a row
    keep = torch.cat([sees_prefix, sees_own_row], 1)  # (N, P + N)
    if "sdpa" not in str(model.config._attn_implementation):
        # eager and the others add the mask to the attention scores
        keep = torch.zeros(keep.shape, device=dev).masked_fill(
            ~keep, torch.finfo(torch.float32).min
        )
    kw = {
        "past_key_values": cache,
        "use_cache": True,
        "position_ids": col[None],  # (1, N)
        "attention_mask": keep[None, None],  # (1, 1, N, P + N)
    }
    return input_ids[row, col][None], kw  # (1, N)


# ----------------------------------------------------------------------------- masked reductions
def masked_mean(tensor, mask, dim=None):
    """Seed 000's masked_mean: the mean where mask is true, along `dim` (all elements if None; NaN
    if none is kept). Seed 002's masked_mean is masked_mean_per_sequence."""
    return masked_normalize(tensor, mask, mask.bool().sum(dim), dim)


def masked_normalize(tensor, mask, normalize_constant=None, dim=None, *, constant_normalizer=None):
    """The sum of `tensor` where mask is true, along `dim` (all elements if None), divided by
    normalize_constant (seed 000 also spells it constant_normalizer=)."""
    if normalize_constant is not None:
        c = normalize_constant
    else:
        c = constant_normalizer
    _need(c is not None, "masked_normalize needs normalize_constant")
    return torch.where(mask.bool(), tensor, 0.0).sum(dim) / c  # dim None: all elements


def masked_mean_per_sequence(tensor, mask):
    """Seed 002's masked_mean(tensor, mask), not seed 000's (above): each row's mean (0 if it has
    no tokens), then the mean over rows."""
    return masked_normalize(tensor, mask, mask.bool().sum(-1).clamp(min=1), dim=-1).mean()


def _need(cond, message):
    if not cond:
        raise ValueError(message)


def _check_2d(name, t, shape):
    _need(
        t.shape == shape,
        f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} (batch_size, sequence_length)",
    )


def _per_example(x, batch, name):
    """(B,) or (B, 1) -> (B, 1), to broadcast over the sequence."""
    _need(
        tuple(x.shape) in ((batch,), (batch, 1)),
        f"{name} has shape {tuple(x.shape)}, expected ({batch},) or ({batch}, 1)",
    )
    return x.reshape(batch, 1)


# ----------------------------------------------------------------------------- SFT
def sft_microbatch_loss(
    policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant=1.0
):
    """Pure: -masked_normalize(log_probs, mask, c, dim=-1) per example, its batch mean, divided by
    the gradient accumulation steps. Returns (loss, metadata)."""
    _check_2d("response_mask", response_mask, policy_log_probs.shape)
    row_sums = masked_normalize(policy_log_probs, response_mask, normalize_constant, dim=-1)  # (B,)
    loss = -row_sums.mean()
    loss = loss / gradient_accumulation_steps
    meta = {
        "nll_per_token": -masked_mean(policy_log_probs, response_mask).detach(),
        "num_response_tokens": response_mask.sum().detach(),
    }
    return loss, meta


# ----------------------------------------------------------------------------- advantages
# Each estimator maps a step's rewards, grouped (n_prompts, G) float32, to centred scores of the
# same shape; compute_advantages then divides them by the --adv-std normaliser. k is passk's.
def grpo_advantages(grouped, k):
    """GRPO: r_i - mean(group). In expectation sum_i A_i grad log pi(y_i) is (G - 1) grad E[r]
    (y_i's own reward is in its baseline)."""
    return grouped - grouped.mean(dim=1, keepdim=True)


def rloo_advantages(grouped, k):
    """RLOO (Ahmadian et al. 2024): r_i - the mean of the other G - 1 rewards, a baseline
    independent of y_i, so sum_i A_i grad log pi(y_i) is G grad E[r], unbiased. It is
    G / (G - 1) x GRPO's."""
    G = grouped.shape[1]
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (G - 1)  # (n_prompts, G)
    return grouped - others


def passk_advantages(grouped, k):
    """pass@k (Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and
    Exploitation of Large Reasoning Models", the analytic group advantage; Walder & Karkhanis
    2025, "Pass@K Policy Optimization", for rewards that are not 0/1):
    A_i = mean over the k-subsets of the group that hold y_i of max(rewards in the subset)
          - mean over all k-subsets of the same (the unbiased pass@k estimate of the group).
    With c correct of n = G and 0/1 rewards, rho = 1 - C(n - c, k) / C(n, k) (pass_at_k) and
    A_correct = 1 - rho,  A_wrong = 1 - rho - C(n - c - 1, k - 1) / C(n - 1, k - 1).
    In expectation sum_i A_i grad log pi(y_i) = (G - k) / k x grad E[max of k rewards] (0 at
    k = G); k = 1 is GRPO. Counted in sorted order: the j-th smallest reward (0-based) is the
    maximum of C(j, k - 1) subsets, and of C(j - 1, k - 2) of those that also hold a smaller
    y_i. This computes rho with its own table (any rewards), not with pass_at_k (0/1 only).
    Departure: Chen et al. divide these scores by the std of the group's pass@k,
    sqrt(rho (1 - rho)); compute_advantages' "group" normaliser divides by the std of the group's
    rewards instead, a per-group reweighting neither the paper nor the pass@k gradient has. With
    passk use adv_std "none" (the scores as derived) or "batch" (one scale for the step)."""
    n_prompts, G = grouped.shape
    values, order = grouped.sort(dim=1, stable=True)  # (n_prompts, G) ascending
    # w[p, q]: how many k-subsets holding the p-th smallest have the q-th smallest as maximum
    w = torch.zeros(G, G, dtype=torch.float64)
    for p in range(G):
        w[p, p] = math.comb(p, k - 1)
        for q in range(p + 1, G):
            if k >= 2:  # (k = 1: a subset holding y_i is y_i alone)
                w[p, q] = math.comb(q - 1, k - 2)
    w = w / math.comb(G - 1, k - 1)
    as_max = torch.tensor([math.comb(q, k - 1) for q in range(G)], dtype=torch.float64)
    as_max = as_max / math.comb(G, k)  # (G,): subsets whose maximum is the q-th smallest
    v = values.double()
    holding = v @ w.t()  # (n_prompts, G): the mean maximum of the subsets holding each
    rho = v @ as_max  # (n_prompts,): the mean maximum of all subsets
    scores = (holding - rho[:, None]).to(grouped.dtype)
    return torch.empty_like(grouped).scatter_(1, order, scores)  # back to the group's order


def pass_at_k(n, c, k):
    """The unbiased pass@k estimator (Chen et al. 2021): the chance that a random k-subset of n
    samples, c of them correct, holds a correct one, 1 - C(n - c, k) / C(n, k), exact (a
    Fraction)."""
    _need(
        0 <= c <= n and 1 <= k <= n,
        f"pass@k needs 0 <= c <= n and 1 <= k <= n (got {n=}, {c=}, {k=})",
    )
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


# A new estimator is one function above and one line here.
ADVANTAGES = {"grpo": grpo_advantages, "rloo": rloo_advantages, "passk": passk_advantages}
ADV_STDS = ("group", "batch", "none")


def compute_advantages(
    rewards, group_size, estimator, adv_std, advantage_eps, passk_k=1, keep=None
):
    """A step's advantages from its rewards (N,) = prompts x G, each group G consecutive rows:
    ADVANTAGES[estimator]'s centred scores, divided by
    - "group": the group's reward std + eps (GRPO; unbiased std),
    - "batch": the std of all N centred scores + eps (REINFORCE++-baseline, Hu et al. 2025:
      the group mean, then the batch's scale),
    - "none": nothing (Dr. GRPO).
    A group whose rewards are all equal gets exactly 0, and so does a group that keep
    (n_prompts,) bool, if given, marks False (a group the caller drops from the loss): it is zeroed
    before the batch std (as a flat group is), so its scores scale no other group. Returns
    (advantages (N,), metadata: the rewards' mean/std/max/min and the fraction of groups whose
    rewards are all equal)."""
    raw = torch.as_tensor(rewards, dtype=torch.float32)  # (N,)
    n = len(raw)
    _need(
        estimator in ADVANTAGES,
        f"unknown advantage {estimator!r}; choose one of {tuple(ADVANTAGES)}",
    )
    _need(adv_std in ADV_STDS, f"unknown adv_std {adv_std!r}; choose one of {ADV_STDS}")
    _need(
        group_size >= 1 and n % group_size == 0,
        f"group_size {group_size} does not divide the batch of {n} responses",
    )
    _need(
        adv_std != "group" or group_size >= 2,
        "normalising by the std needs group_size >= 2 (the std of one sample is undefined)",
    )
    _need(
        estimator != "rloo" or group_size >= 2, "rloo needs group_size >= 2 (a leave-one-out mean)"
    )
    _need(
        estimator != "passk" or 1 <= passk_k < group_size,
        f"passk needs 1 <= k < group_size {group_size} (got k={passk_k}; at k = G every "
        "advantage is 0)",
    )
    _need(adv_std != "batch" or n >= 2, "normalising by the batch std needs >= 2 responses")
    grouped = raw.view(-1, group_size)  # (n_prompts, G)
    # Equal rewards carry no signal, but float32 leaves r - mean ~ 1e-8, and / eps that is a ~1e-2
    # advantage: Adam (scale-free) would take a full-size random step on it, so it is zeroed
    # exactly.
    flat = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)  # (n_prompts, 1)
    zero = flat  # (n_prompts, 1): the groups whose scores are exactly 0
    if keep is not None:
        keep = torch.as_tensor(keep, dtype=torch.bool)
        _need(
            keep.shape == (len(grouped),),
            f"keep has shape {tuple(keep.shape)}, expected ({len(grouped)},): one per group",
        )
        zero = flat | ~keep[:, None]
    centered = torch.where(zero, 0.0, ADVANTAGES[estimator](grouped, passk_k))
    if adv_std == "group":
        adv = centered / (grouped.std(dim=1, keepdim=True) + advantage_eps)  # (n_prompts, G)
    elif adv_std == "batch":
        adv = centered / (centered.std() + advantage_eps)  # (n_prompts, G)
    else:
        adv = centered  # (n_prompts, G)
    return adv.reshape(-1), reward_stats(raw, group_size)


def reward_stats(rewards, group_size):
    """A step's rewards (N,) = prompts x G, summarised (seed 002's keys): their mean, std, max and
    min, and the fraction of groups whose G rewards are all equal (no signal)."""
    raw = torch.as_tensor(rewards, dtype=torch.float32)  # (N,)
    grouped = raw.view(-1, group_size)  # (n_prompts, G)
    flat = grouped.amax(dim=1) == grouped.amin(dim=1)  # (n_prompts,)
    std = 0.0
    if len(raw) > 1:
        std = raw.std().item()
    return {
        "mean": raw.mean().item(),
        "std": std,
        "max": raw.max().item(),
        "min": raw.min().item(),
        "frac_groups_zero_std": flat.float().mean().item(),
    }


def group_normalized_advantages(rewards, group_size, advantage_eps, std_norm):
    """GRPO's advantages, A = (r - group mean) / (group std + eps), or r - group mean without the
    std (Dr. GRPO): compute_advantages with estimator "grpo"."""
    adv_std = "none"
    if std_norm:
        adv_std = "group"
    return compute_advantages(rewards, group_size, "grpo", adv_std, advantage_eps)


# ----------------------------------------------------------------------------- reward shaping
def kimi_length_reward(lengths, correct, group_size):
    """Kimi k1.5's length reward (its §2.3.3), unweighted: within each group of G responses,
    lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len), 0 for the whole group when
    max_len = min_len; a correct response gets lambda_i, an incorrect one min(0, lambda_i).
    lengths (N,) response lengths, correct (N,) bool, N = prompts x G, G consecutive rows per
    group -> (N,) float32."""
    L = torch.as_tensor(lengths, dtype=torch.float32).view(-1, group_size)  # (n_prompts, G)
    right = torch.as_tensor(correct, dtype=torch.bool).view(-1, group_size)  # (n_prompts, G)
    shortest = L.amin(dim=1, keepdim=True)  # (n_prompts, 1)
    spread = L.amax(dim=1, keepdim=True) - shortest  # (n_prompts, 1)
    lam = 0.5 - (L - shortest) / spread.clamp(min=1e-9)  # (n_prompts, G)
    lam = torch.where(spread > 0, lam, 0.0)  # one length in the group: no length signal
    reward = torch.where(right, lam, lam.clamp(max=0.0))  # (n_prompts, G)
    return reward.reshape(-1)


# ----------------------------------------------------------------------------- policy-gradient loss
@dataclasses.dataclass
class LossSettings:
    """The loss's hyperparameters, built once from the flags (grpo.loss_settings). A loss reads
    the fields it uses; a new hyperparameter is a new field here, a flag of the same name and one
    line in grpo.loss_settings."""

    loss: str = "reinforce_with_baseline"  # a key of LOSSES
    cliprange: float | None = None  # epsilon of the clipped losses (grpo_clip, gspo, cispo)
    cliprange_high: float | None = None  # upper epsilon (DAPO clip-higher); None = cliprange
    length_norm: str = "masked_mean"  # one of LENGTH_NORMS
    normalize_constant: float | None = None  # masked_normalize's divisor
    kl_beta: float = 0.0  # weight of the KL(pi || pi_ref) penalty
    kl_estimator: str = "k3"  # one of KL_ESTIMATORS ("seq" is for monitoring: the penalty uses k3)
    entropy_coef: float = 0.0  # weight of the entropy bonus (the loss minus coef x token entropy)

    def __post_init__(self):
        _need(self.loss in LOSSES, f"unknown loss {self.loss!r}; choose one of {LOSS_TYPES}")
        _need(
            self.length_norm in LENGTH_NORMS,
            f"unknown length_norm {self.length_norm!r}; choose one of {LENGTH_NORMS}",
        )
        _need(
            self.length_norm != "masked_normalize" or self.normalize_constant is not None,
            "masked_normalize requires normalize_constant",
        )
        _need(
            self.kl_estimator in KL_ESTIMATORS,
            f"unknown kl estimator {self.kl_estimator!r}; choose one of {KL_ESTIMATORS}",
        )
        if self.cliprange_high is None:
            self.cliprange_high = self.cliprange


# Every loss takes the same inputs: log-probs (B, T), response_mask (B, T), advantages (B,) or
# (B, 1), raw rewards (same), pi_old's log-probs (B, T) or None, and LossSettings; it uses what it
# needs and returns (per-token loss (B, T), metadata of (B, T) tensors: "ratio", "clipped").
def no_baseline_loss(
    policy_log_probs, response_mask, advantages, raw_rewards, old_log_probs, settings
):
    """Seed 000's no_baseline: -r log pi with the raw reward r."""
    return _reinforce(raw_rewards, policy_log_probs, "raw_rewards"), {}


def reinforce_with_baseline_loss(
    policy_log_probs, response_mask, advantages, raw_rewards, old_log_probs, settings
):
    """-A log pi with the group-normalised advantage A."""
    return _reinforce(advantages, policy_log_probs, "advantages"), {}


def grpo_clip_loss(
    policy_log_probs, response_mask, advantages, raw_rewards, old_log_probs, settings
):
    """GRPO-Clip: -min(r A, clip(r, 1 - eps, 1 + eps_high) A), r = pi / pi_old per token."""
    _need(settings.cliprange is not None, "grpo_clip requires cliprange")
    return _clipped(
        advantages, policy_log_probs, old_log_probs, settings.cliprange, settings.cliprange_high
    )


def grpo_no_clip_loss(
    policy_log_probs, response_mask, advantages, raw_rewards, old_log_probs, settings
):
    """Seed 001's GRPO-No-Clip: -r A, i.e. GRPO-Clip with an infinite clip range."""
    loss, meta = _clipped(advantages, policy_log_probs, old_log_probs, math.inf, math.inf)
    return loss, {"ratio": meta["ratio"]}


def gspo_loss(policy_log_probs, response_mask, advantages, raw_rewards, old_log_probs, settings):
    """GSPO: per sequence s = exp(mean over its response tokens of (logp - old_logp)), clipped like
    GRPO-Clip; the sequence's loss is broadcast to its tokens."""
    _need(settings.cliprange is not None, "gspo requires cliprange")
    _need(old_log_probs is not None, "gspo requires old_log_probs")
    _check_2d("response_mask", response_mask, policy_log_probs.shape)
    _check_2d("old_log_probs", old_log_probs, policy_log_probs.shape)
    # (B, 1) response tokens per row; an empty row gives 0, not NaN gradients
    n = response_mask.bool().sum(-1, keepdim=True).clamp(min=1)
    log_ratio_sum = masked_normalize(policy_log_probs - old_log_probs, response_mask, 1.0, dim=-1)
    mean_log_ratio = log_ratio_sum[:, None] / n  # (B, 1)
    zeros = torch.zeros_like(mean_log_ratio)  # (B, 1)
    loss_seq, meta = _clipped(
        advantages, mean_log_ratio, zeros, settings.cliprange, settings.cliprange_high
    )
    loss = loss_seq.expand(policy_log_probs.shape)  # (B, T)
    token_meta = {k: v.expand(policy_log_probs.shape) for k, v in meta.items()}  # (B, T) each
    return loss, token_meta


def cispo_loss(policy_log_probs, response_mask, advantages, raw_rewards, old_log_probs, settings):
    """CISPO (MiniMax-M1, 2025): -sg(clip(r, 1 - eps, 1 + eps_high)) A log pi, r = pi / pi_old per
    token. The clipped ratio is a detached weight, so a clipped token still carries the REINFORCE
    gradient (GRPO-Clip drops it). MiniMax-M1 reduces it over the step's tokens (--length-norm
    token) and bounds only the ratio's top (a large --cliprange)."""
    _need(settings.cliprange is not None, "cispo requires cliprange")
    _need(advantages is not None, "cispo requires advantages")
    _need(old_log_probs is not None, "cispo requires old_log_probs (pi_old)")
    _check_2d("old_log_probs", old_log_probs, policy_log_probs.shape)
    a = _per_example(advantages, policy_log_probs.shape[0], "advantages")
    a = a.to(policy_log_probs.dtype)  # (B, 1)
    ratio = torch.exp(policy_log_probs - old_log_probs).detach()  # (B, T)
    low = 1.0 - settings.cliprange
    high = 1.0 + settings.cliprange_high
    weight = torch.clamp(ratio, low, high)  # (B, T), detached
    loss = -weight * a * policy_log_probs
    meta = {"clipped": (weight != ratio), "ratio": ratio}
    return loss, meta


def _reinforce(scores, policy_log_probs, name):
    """Per-token -A * log p: A (B, 1) or (B,), log p (B, T) -> (B, T)."""
    _need(scores is not None, f"this loss requires {name}")
    a = _per_example(scores, policy_log_probs.shape[0], name)
    return -a.to(policy_log_probs.dtype) * policy_log_probs


def _clipped(advantages, policy_log_probs, old_log_probs, low, high):
    """Per-token -min(r A, clip(r, 1 - low, 1 + high) A), r = exp(logp - old_logp). A (B, 1) or
    (B,), log-probs (B, T) -> (loss (B, T), {"clipped": (B, T) bool where the clip was active,
    "ratio": (B, T)})."""
    _need(advantages is not None, "this loss requires advantages")
    _need(old_log_probs is not None, "this loss requires old_log_probs (pi_old)")
    _check_2d("old_log_probs", old_log_probs, policy_log_probs.shape)
    a = _per_example(advantages, policy_log_probs.shape[0], "advantages")
    a = a.to(policy_log_probs.dtype)  # (B, 1)
    ratio = torch.exp(policy_log_probs - old_log_probs)  # (B, T)
    unclipped = ratio * a  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - low, 1.0 + high) * a  # (B, T)
    loss = -torch.minimum(unclipped, clipped)
    meta = {"clipped": (clipped < unclipped).detach(), "ratio": ratio.detach()}
    return loss, meta


class Loss(NamedTuple):
    fn: Callable  # the per-token loss, with the inputs above
    needs_old: bool  # does it need pi_old (a ratio)?


# A new loss is one function above and one line here (and, if it has a new hyperparameter, one
# LossSettings field, one flag and one line in grpo.loss_settings).
LOSSES = {
    "no_baseline": Loss(no_baseline_loss, needs_old=False),
    "reinforce_with_baseline": Loss(reinforce_with_baseline_loss, needs_old=False),
    "grpo_clip": Loss(grpo_clip_loss, needs_old=True),
    "grpo_no_clip": Loss(grpo_no_clip_loss, needs_old=True),
    "gspo": Loss(gspo_loss, needs_old=True),
    "cispo": Loss(cispo_loss, needs_old=True),
}
LOSS_TYPES = tuple(LOSSES)
RATIO_LOSSES = tuple(name for name, loss in LOSSES.items() if loss.needs_old)


# ------------------------------------------------------------------------ KL and rollout correction
def compute_kl(policy_log_probs, ref_log_probs, estimator="k3"):
    """Per-token estimate of KL(pi || ref) from samples of pi (Schulman's k1/k2/k3),
    (B, T) -> (B, T). With log r = ref - logp: k1 = -log r, k2 = (log r)^2 / 2,
    k3 = r - 1 - log r (seed 003 Eq. 2)."""
    _check_2d("ref_log_probs", ref_log_probs, policy_log_probs.shape)
    _need(
        estimator in ("k1", "k2", "k3"),
        f"unknown kl estimator {estimator!r}; choose one of k1, k2, k3",
    )
    log_r = ref_log_probs - policy_log_probs  # (B, T)
    if estimator == "k1":
        kl = -log_r
    elif estimator == "k2":
        kl = 0.5 * log_r**2
    else:  # k3
        kl = torch.exp(log_r) - 1.0 - log_r
    return kl


def kl_divergence(policy_log_probs, ref_log_probs, response_mask, estimator="k3"):
    """KL(pi || ref), a scalar: the mean of k1/k2/k3 over response tokens, or "seq" (seed 004 Eq. 8:
    the rows' sums of k1, averaged over rows)."""
    if estimator == "seq":
        per_token = compute_kl(policy_log_probs, ref_log_probs, "k1")  # (B, T)
        return masked_normalize(per_token, response_mask, 1.0, dim=-1).mean()
    return masked_mean(compute_kl(policy_log_probs, ref_log_probs, estimator), response_mask)


def compute_rollout_is(
    old_log_probs, engine_log_probs, response_mask, mode="tis", cap=2.0, level="token", floor=0.0
):
    """Rollout correction. The engine samples from mu and the trainer scores pi_old (they differ by
    kernels, precision, staleness): rho = pi_old / mu per token, or per sequence (the product over
    its tokens).
    - tis (truncated IS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
      Off-Policy RL Training"): weight min(rho, cap).
    - mis (masked IS; Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from
      the Training-Inference Mismatch"): weight rho where rho <= cap, 0 beyond it. A dropped token
      (sequence) keeps its place in the loss's normaliser with weight 0, as in the estimator
      E_mu[1(rho <= C) rho A grad log pi]. floor > 0 also drops rho < floor (an explicit option;
      the definition has no lower bound).
    Returns (detached weights (B, T), metrics): the k3 KL(mu || pi_old), rho's mean/min/max over
    response tokens, the fraction of tokens with rho outside [0.5, 2], the fraction of response
    tokens MIS weights 0."""
    _need(mode in ROLLOUT_IS, f"rollout IS mode {mode!r}: choose one of {ROLLOUT_IS}")
    _need(level in ("token", "sequence"), f"rollout IS level {level!r}: choose token or sequence")
    mask = response_mask.bool()
    log_ratio = torch.where(mask, old_log_probs - engine_log_probs, 0.0)  # (B, T)
    if level == "sequence":
        row_log_ratio = log_ratio.sum(-1, keepdim=True)  # (B, 1)
        ratio = torch.where(mask, row_log_ratio, 0.0).exp()  # (B, T), the row's rho on its tokens
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


def top_entropy_mask(token_entropy, response_mask, quantile):
    """The response tokens whose entropy is in the top `quantile` fraction of response_mask's
    tokens (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
    RL for LLM Reasoning"): the ceil(quantile x n) highest of the n, and any tied with the lowest
    of them. token_entropy, response_mask (B, T) -> (B, T) bool. The population is what the
    caller passes: grpo.py passes the whole optimizer step's tokens."""
    _need(0 < quantile <= 1, f"the entropy quantile must be in (0, 1] (got {quantile})")
    _check_2d("response_mask", response_mask, token_entropy.shape)
    mask = response_mask.bool()
    values = token_entropy[mask].detach()  # (n,)
    if len(values) == 0:
        return mask
    keep = max(1, math.ceil(quantile * len(values) - 1e-9))  # 0.2 x 10 is 2.0000000000000004
    threshold = values.topk(keep).values.min()
    return mask & (token_entropy.detach() >= threshold)


# ----------------------------------------------------------------------------- GRPO microbatch
def grpo_microbatch_loss(
    policy_log_probs,
    response_mask,
    advantages,
    raw_rewards,
    settings,
    old_log_probs=None,
    ref_log_probs=None,
    is_weights=None,
    gradient_accumulation_steps=1,
    step_tokens=None,
    token_entropy=None,
    entropy_mask=None,
):
    """Pure: the per-token loss settings.loss (x the detached is_weights, x entropy_mask)
    (+ kl_beta * KL) (- entropy_coef * token_entropy), reduced by settings.length_norm to this
    microbatch's share of the step's loss. Returns (loss, detached 0-d metadata).

    entropy_mask (B, T) bool (top_entropy_mask): the tokens that carry the policy-gradient term;
    the others keep their place in the normaliser, the KL and the entropy bonus. token_entropy
    (B, T): get_response_log_probs' entropy, with its gradient (settings.entropy_coef needs it).

    length_norm: masked_mean or masked_normalize (seed 002's two per-row reductions, then the batch
    mean, / gradient_accumulation_steps), or token (DAPO: the sum / step_tokens, the optimizer
    step's response tokens, so each token's gradient is -A_i / N; without step_tokens, this
    microbatch's tokens x gradient_accumulation_steps stand in for them)."""
    _need(
        policy_log_probs.dim() == 2,
        f"policy_log_probs has shape {tuple(policy_log_probs.shape)}, expected (B, T)",
    )
    _check_2d("response_mask", response_mask, policy_log_probs.shape)
    _need(
        not settings.kl_beta or ref_log_probs is not None,
        f"kl_beta={settings.kl_beta} requires ref_log_probs",
    )
    loss_fn = LOSSES[settings.loss].fn
    per_token, loss_meta = loss_fn(
        policy_log_probs, response_mask, advantages, raw_rewards, old_log_probs, settings
    )  # (B, T)
    if is_weights is not None:
        _check_2d("is_weights", is_weights, policy_log_probs.shape)
        per_token = per_token * is_weights.detach()
    if entropy_mask is not None:
        _check_2d("entropy_mask", entropy_mask, policy_log_probs.shape)
        per_token = torch.where(entropy_mask.bool(), per_token, 0.0)
    meta = {}
    if ref_log_probs is not None:
        # "seq" is a monitoring estimator: the per-token penalty uses k3
        estimator = settings.kl_estimator.replace("seq", "k3")
        kl = compute_kl(policy_log_probs, ref_log_probs, estimator)  # (B, T)
        meta["kl"] = masked_mean(kl.detach(), response_mask)
        if settings.kl_beta:
            per_token = per_token + settings.kl_beta * kl
    if settings.entropy_coef:
        _need(
            token_entropy is not None,
            f"entropy_coef={settings.entropy_coef} requires token_entropy",
        )
        _check_2d("token_entropy", token_entropy, policy_log_probs.shape)
        per_token = per_token - settings.entropy_coef * token_entropy  # the bonus: more entropy
    mask = response_mask.bool()
    if settings.length_norm == "token":
        # DAPO: every token of the optimizer step weighs the same
        constant = step_tokens or mask.sum().clamp(min=1) * gradient_accumulation_steps
        loss = masked_normalize(per_token, mask, constant)
    else:
        # per row: its mean (seed 002's masked_mean) or its sum / a constant (Dr. GRPO); then the
        # batch mean, / the accumulation steps
        if settings.length_norm == "masked_mean":
            batch_mean = masked_mean_per_sequence(per_token, mask)
        else:
            row_sums = masked_normalize(per_token, mask, settings.normalize_constant, dim=-1)
            batch_mean = row_sums.mean()
        loss = batch_mean / gradient_accumulation_steps
    if "clipped" in loss_meta:
        # a pass with no response token left clips nothing: 0, not NaN
        n_tokens = mask.sum().clamp(min=1)
        meta["clip_fraction"] = masked_normalize(loss_meta["clipped"].float(), mask, n_tokens)
    if "ratio" in loss_meta:
        r = loss_meta["ratio"]
        meta["ratio_mean"] = masked_mean(r, mask)
        meta["ratio_max"] = torch.where(mask, r, -torch.inf).max()
        meta["ratio_min"] = torch.where(mask, r, torch.inf).min()
    meta["num_response_tokens"] = mask.sum()
    return loss, meta


# ============================================================================= course spellings
# The handouts' names and signatures for what the functions above do, each delegating to them.
# Seed 000's own names and signatures are kept above where they are the project's too
# (tokenize_prompt_and_output, compute_entropy, get_response_log_probs, masked_mean,
# masked_normalize, which also takes seed 000's example spelling constant_normalizer=). Seed 002's
# masked_mean (each row's mean, then the batch mean) is masked_mean_per_sequence above.
def compute_group_normalized_rewards(
    reward_fn,
    rollout_responses,
    repeated_ground_truths,
    group_size,
    advantage_eps,
    normalize_by_std=None,
    *,
    normalized_by_std=None,
):
    """Seed 000 §7.2 (seed 001 spells the switch normalized_by_std): grade each response with
    reward_fn (a dict with "reward", or a float), then group_normalized_advantages. Returns
    (advantages (N,), raw rewards (N,), metadata)."""
    _need(
        normalize_by_std is None or normalized_by_std is None,
        "pass normalize_by_std or its seed 001 spelling normalized_by_std, not both",
    )
    std_norm = normalize_by_std
    if std_norm is None:
        std_norm = normalized_by_std
    _need(std_norm is not None, "compute_group_normalized_rewards needs normalize_by_std")
    n = len(rollout_responses)
    _need(
        len(repeated_ground_truths) == n,
        f"{n} responses but {len(repeated_ground_truths)} ground truths; repeat each G times",
    )
    rewards = []
    for response, truth in zip(rollout_responses, repeated_ground_truths):
        result = reward_fn(response, truth)
        if isinstance(result, dict):
            rewards.append(float(result["reward"]))
        else:
            rewards.append(float(result))
    raw = torch.tensor(rewards)  # (N,) float32
    adv, meta = group_normalized_advantages(raw, group_size, advantage_eps, std_norm)
    return adv, raw, meta


def compute_group_normalized_advantages(
    rollout_responses,
    repeated_ground_truths,
    reward_fn,
    group_size,
    advantage_eps,
    normalize_by_std,
):
    """Seed 002 §1.4.1: its argument order, a reward_fn returning a float, metadata values as 0-d
    tensors."""
    adv, raw, meta = compute_group_normalized_rewards(
        reward_fn,
        rollout_responses,
        repeated_ground_truths,
        group_size,
        advantage_eps,
        normalize_by_std,
    )
    return adv, raw, {k: torch.tensor(v) for k, v in meta.items()}


def compute_naive_policy_gradient_loss(raw_rewards_or_advantages, policy_log_probs):
    """Seed 000: per-token -A * log p, A (B, 1) or (B,), log p (B, T) -> (B, T)."""
    return _reinforce(raw_rewards_or_advantages, policy_log_probs, "raw_rewards_or_advantages")


def compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange):
    """Seed 000: GRPO-Clip with one clip range -> (loss (B, T), {"clipped", "ratio"})."""
    return _clipped(advantages, policy_log_probs, old_log_probs, cliprange, cliprange)


def compute_loss(advantages, policy_log_probs, old_log_probs, clip_range):
    """Seed 002 §1.4.2's name for compute_grpo_clip_loss: A (B,), log-probs (B, T)
    -> (loss (B, T), metadata)."""
    return _clipped(advantages, policy_log_probs, old_log_probs, clip_range, clip_range)


def compute_policy_gradient_loss(
    policy_log_probs,
    loss_type,
    raw_rewards=None,
    advantages=None,
    old_log_probs=None,
    cliprange=None,
):
    """Seed 000 §7.2: the per-token loss of `loss_type` (any key of LOSSES) -> (loss (B, T),
    metadata). With no response mask in this signature, gspo counts every token as a response
    token."""
    settings = LossSettings(loss=loss_type, cliprange=cliprange)
    every_token = torch.ones_like(policy_log_probs, dtype=torch.bool)  # (B, T)
    loss_fn = LOSSES[loss_type].fn
    return loss_fn(policy_log_probs, every_token, advantages, raw_rewards, old_log_probs, settings)


def grpo_microbatch_train_step(
    policy_log_probs,
    response_mask,
    gradient_accumulation_steps,
    loss_type,
    raw_rewards=None,
    advantages=None,
    old_log_probs=None,
    cliprange=None,
):
    """Seed 000 §7.2: grpo_microbatch_loss with the per-sequence masked mean, then backward().
    Returns (detached loss, metadata)."""
    settings = LossSettings(loss=loss_type, cliprange=cliprange)
    loss, meta = grpo_microbatch_loss(
        policy_log_probs,
        response_mask,
        advantages,
        raw_rewards,
        settings,
        old_log_probs=old_log_probs,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )
    loss.backward()
    return loss.detach(), meta


def sft_microbatch_train_step(
    policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant=1.0
):
    """Seed 000 §4.2: sft_microbatch_loss, then backward(). Returns (detached loss, metadata)."""
    loss, meta = sft_microbatch_loss(
        policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant
    )
    loss.backward()
    return loss.detach(), meta


def masked_mean_drgrpo(tensor, mask, num_tokens):
    """Seed 002's Dr. GRPO reduction: the sum over response tokens / (num_tokens * B), a scalar."""
    return masked_normalize(tensor, mask, num_tokens * tensor.shape[0])
