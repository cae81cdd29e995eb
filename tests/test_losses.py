"""losses.py: hand-computed cases for every function and option, float64 gradchecks, the
chunked log-prob path checked against the naive full-vocab computation on the tiny HF model, and
the handouts' signatures (COURSE_API, the "Course API" table of docs/course_api.md)."""

import ast
import copy
import dataclasses
import inspect
import math
import os
import re

import pytest
import torch

import losses as L
from conftest import ROOT, doc_section

T = torch.tensor


def close(a, b, tol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(a, dtype=torch.float64),
        torch.as_tensor(b, dtype=torch.float64),
        atol=tol,
        rtol=tol,
    )


# ----------------------------------------------------------------------------- tokenisation
@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return model, tokenizer


def test_tokenize_prompt_and_output(tiny):
    tok = tiny[1]
    prompts = ["User: 3 + 4", "Hi"]
    outputs = [" <answer> 7 </answer>", " ok"]
    out = L.tokenize_prompt_and_output(prompts, outputs, tok)
    p = [tok(s)["input_ids"] for s in prompts]
    o = [tok(s, add_special_tokens=False)["input_ids"] for s in outputs]
    full = [a + b for a, b in zip(p, o)]
    n = max(map(len, full))
    assert out["input_ids"].shape == out["labels"].shape == out["response_mask"].shape == (2, n - 1)
    for i, seq in enumerate(full):
        padded = seq + [tok.pad_token_id] * (n - len(seq))
        assert out["input_ids"][i].tolist() == padded[:-1]
        assert out["labels"][i].tolist() == padded[1:]
        want = [len(p[i]) <= j + 1 < len(seq) for j in range(n - 1)]  # label j is token j + 1
        assert out["response_mask"][i].tolist() == want
    with pytest.raises(ValueError, match="one output per prompt"):
        L.tokenize_prompt_and_output(["a"], [], tok)


# ----------------------------------------------------------------------------- entropy / reductions
def test_compute_entropy():
    close(L.compute_entropy(torch.zeros(2, 3, 4)), torch.full((2, 3), math.log(4)))
    close(L.compute_entropy(T([[1e4, 0.0, 0.0]])), [0.0])  # stable: no NaN/inf from exp(1e4)
    z = torch.randn(5, 7, dtype=torch.float64)
    p = z.softmax(-1)
    close(L.compute_entropy(z), -(p * p.log()).sum(-1), 1e-12)


def test_masked_mean_and_normalize():
    x = T([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0]])
    m = T([[1, 1, 0], [0, 0, 1]])
    close(L.masked_mean(x, m), 3.0)
    close(L.masked_mean(x, m, dim=1), [1.5, 6.0])
    close(L.masked_mean(x, m.bool(), dim=0)[:1], [1.0])  # column 0 has one kept element
    close(L.masked_normalize(x, m, 2.0), 4.5)
    close(L.masked_normalize(x, m, 2.0, dim=1), [1.5, 3.0])
    close(L.masked_normalize(x, m, 4.0, dim=-1), [0.75, 1.5])


def test_seed_length_normalization_example():
    """Seed 000 §7.2 worked example, with its `constant_normalizer=` spelling (floats: an int
    tensor cannot require grad)."""
    ratio = torch.ones(2, 7, requires_grad=True)
    advs = torch.full((2, 7), 2.0)
    masks = T([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    max_gen_len = 7
    masked_mean_result = L.masked_mean(ratio * advs, masks, dim=1)
    masked_normalize_result = L.masked_normalize(
        ratio * advs, masks, dim=1, constant_normalizer=max_gen_len
    )
    close(masked_mean_result, [2.0, 2.0])
    close(masked_normalize_result, [1.1429, 2.0], 1e-4)
    masked_mean_result.mean().backward()
    close(ratio.grad, [[0.25] * 4 + [0.0] * 3, [1 / 7] * 7])
    ratio.grad.zero_()
    masked_normalize_result.mean().backward()
    close(ratio.grad, [[1 / 7] * 4 + [0.0] * 3, [1 / 7] * 7])


# ----------------------------------------------------------------------------- SFT
def test_sft_microbatch_train_step():
    lp = T([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    mask = T([[0, 1, 1], [1, 0, 0]])
    loss, meta = L.sft_microbatch_train_step(
        lp, mask, gradient_accumulation_steps=2, normalize_constant=2.0
    )
    close(loss, (2.5 + 2.0) / 2 / 2)  # per example -(masked sum)/2 = [2.5, 2.0] -> mean -> / 2
    close(lp.grad, -0.125 * mask)  # -1 / (c * B * gas) on response tokens
    close(meta["nll_per_token"], 3.0)  # (2 + 3 + 4) / 3
    with pytest.raises(ValueError, match="response_mask"):
        L.sft_microbatch_train_step(lp, mask[:, :2], 1)


# ----------------------------------------------------------------------------- GRPO
def test_compute_group_normalized_rewards():
    table = {"a": 1.0, "b": 0.0, "c": 0.5}

    def fn(r, gt):
        return {"reward": table[r], "format_reward": 1.0, "answer_reward": table[r]}

    resp = ["a", "b", "c", "c"]
    gts = ["x"] * 4
    adv, raw, meta = L.compute_group_normalized_rewards(fn, resp, gts, 2, 1e-6, True)
    s = 1 / math.sqrt(2)  # unbiased std of (1, 0); the biased std would be 0.5
    close(raw, [1.0, 0.0, 0.5, 0.5])
    close(adv, [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.0, 0.0])
    assert meta["frac_groups_zero_std"] == 0.5
    assert meta["mean"] == 0.5
    assert meta["max"] == 1.0
    adv, _, _ = L.compute_group_normalized_rewards(fn, resp, gts, 2, 1e-6, False)
    close(adv, [0.5, -0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="does not divide"):
        L.compute_group_normalized_rewards(fn, resp[:3], gts[:3], 2, 1e-6, True)
    with pytest.raises(ValueError, match="ground truths"):
        L.compute_group_normalized_rewards(fn, resp, gts[:3], 2, 1e-6, True)


def test_group_normalized_advantages():
    """The trainers' function: the step's total rewards (N,) in, the same advantages and metadata
    as the course spelling that grades them first."""
    raw = T([1.0, 0.0, 0.5, 0.5])
    s = 1 / math.sqrt(2)  # unbiased std of (1, 0)
    adv, meta = L.group_normalized_advantages(raw, 2, 1e-6, True)
    close(adv, [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.0, 0.0])
    assert meta["frac_groups_zero_std"] == 0.5
    adv, _ = L.group_normalized_advantages(raw, 2, 1e-6, False)
    close(adv, [0.5, -0.5, 0.0, 0.0])
    # eight equal 0.1 rewards: the float32 mean != 0.1, yet the advantages must be exactly 0
    # (no random Adam step)
    adv, meta = L.group_normalized_advantages(torch.full((8,), 0.1), 8, 1e-6, True)
    assert torch.equal(adv, torch.zeros(8))
    assert meta["frac_groups_zero_std"] == 1.0

    def reward_fn(r, gt):
        return {"reward": 0.1}

    adv, _, _ = L.compute_group_normalized_rewards(reward_fn, ["r"] * 8, ["x"] * 8, 8, 1e-6, True)
    assert torch.equal(adv, torch.zeros(8))
    with pytest.raises(ValueError, match="does not divide"):
        L.group_normalized_advantages(raw[:3], 2, 1e-6, True)
    with pytest.raises(ValueError, match="group_size >= 2"):
        L.group_normalized_advantages(raw, 1, 1e-6, True)


def test_kimi_length_reward_by_hand():
    """Kimi k1.5's length reward per group: lambda = 0.5 - (len - min) / (max - min); a correct
    response gets lambda, an incorrect one min(0, lambda); a group of one length gets 0."""
    lengths = [10, 20, 30, 40] + [7, 7, 7, 7] + [5, 15, 25, 5]
    correct = [True, False, True, False] + [True, False, True, True] + [False, True, False, True]
    got = L.kimi_length_reward(lengths, correct, 4)
    # group 0: lambda = 0.5, 1/6, -1/6, -0.5; the wrong 20-token one keeps min(0, 1/6) = 0
    want = [0.5, 0.0, -1 / 6, -0.5]
    want += [0.0] * 4  # one length: no signal, right or wrong
    want += [0.0, 0.0, -0.5, 0.5]  # lambda = 0.5, 0, -0.5, 0.5 (min 5, max 25)
    close(got, want)
    assert got.dtype == torch.float32


def test_per_token_losses():
    lp = torch.log(T([[1.5, 0.5, 1.0], [1.5, 0.5, 1.0]]))  # old = 0 so ratio = (1.5, 0.5, 1.0)
    old = torch.zeros(2, 3)
    a = T([[1.0], [-1.0]])
    close(L.compute_naive_policy_gradient_loss(a, lp), -a * lp)
    close(L.compute_naive_policy_gradient_loss(a.view(2), lp), -a * lp)  # (B,) advantages accepted
    close(L.compute_policy_gradient_loss(lp, "no_baseline", raw_rewards=a)[0], -a * lp)
    close(L.compute_policy_gradient_loss(lp, "reinforce_with_baseline", advantages=a)[0], -a * lp)
    loss, meta = L.compute_grpo_clip_loss(a, lp, old, 0.2)
    close(loss, [[-1.2, -0.5, -1.0], [1.5, 0.8, 1.0]])
    assert meta["clipped"].tolist() == [[True, False, False], [False, True, False]]
    mask = torch.ones(2, 3)
    # DAPO clip-higher
    settings = L.LossSettings(loss="grpo_clip", cliprange=0.2, cliprange_high=0.4)
    loss, _ = L.grpo_clip_loss(lp, mask, a, None, old, settings)
    close(loss, [[-1.4, -0.5, -1.0], [1.5, 0.8, 1.0]])
    loss, meta = L.compute_policy_gradient_loss(lp, "grpo_no_clip", advantages=a, old_log_probs=old)
    close(loss, [[-1.5, -0.5, -1.0], [1.5, 0.5, 1.0]])
    # GSPO: s = exp(mean of the log-ratio over response tokens), clipped per sequence, broadcast
    # to the tokens
    lp = T([[0.2, 0.4, 9.0], [-0.1, -0.1, 0.0]])
    mask = T([[1, 1, 0], [1, 1, 1]])
    settings = L.LossSettings(loss="gspo", cliprange=0.2)
    loss, meta = L.gspo_loss(lp, mask, a, None, torch.zeros(2, 3), settings)
    s2 = math.exp(-0.2 / 3)
    close(loss, [[-1.2] * 3, [s2] * 3])
    assert meta["clipped"][:, 0].tolist() == [True, False]
    lp = lp.clone().requires_grad_()  # a row without response tokens must not give NaN gradients
    L.grpo_microbatch_train_step(
        lp,
        T([[1, 1, 0], [0, 0, 0]]),
        1,
        "gspo",
        advantages=a,
        old_log_probs=torch.zeros(2, 3),
        cliprange=0.2,
    )
    assert torch.isfinite(lp.grad).all()
    assert lp.grad[1].abs().sum() == 0


def test_compute_kl():
    lp = torch.log(T([[0.5]]))
    ref = torch.log(T([[0.25]]))
    log_r = math.log(0.5)
    close(L.compute_kl(lp, ref, "k1"), [[-log_r]])
    close(L.compute_kl(lp, ref, "k2"), [[0.5 * log_r**2]])
    close(L.compute_kl(lp, ref, "k3"), [[0.5 - 1 - log_r]])
    with pytest.raises(ValueError, match="unknown kl"):
        L.compute_kl(lp, ref, "k4")


@pytest.mark.parametrize(
    "loss_type,kwargs,missing",
    [
        ("no_baseline", {}, "raw_rewards"),
        ("reinforce_with_baseline", {}, "advantages"),
        ("grpo_clip", {"advantages": torch.ones(2, 1), "cliprange": 0.2}, "old_log_probs"),
        (
            "grpo_clip",
            {"advantages": torch.ones(2, 1), "old_log_probs": torch.zeros(2, 3)},
            "cliprange",
        ),
        (
            "gspo",
            {"advantages": torch.ones(2, 1), "old_log_probs": torch.zeros(2, 3)},
            "cliprange",
        ),
    ],
)
def test_policy_gradient_loss_missing_args(loss_type, kwargs, missing):
    with pytest.raises(ValueError, match=f"requires {missing}"):
        L.compute_policy_gradient_loss(torch.zeros(2, 3), loss_type, **kwargs)


def test_shape_and_option_errors():
    lp = torch.zeros(2, 3, requires_grad=True)
    m = torch.ones(2, 3)
    with pytest.raises(ValueError, match="unknown loss 'ppo'"):
        L.compute_policy_gradient_loss(lp, "ppo")
    with pytest.raises(ValueError, match="advantages has shape"):
        L.compute_policy_gradient_loss(lp, "reinforce_with_baseline", advantages=torch.ones(3, 1))
    with pytest.raises(ValueError, match="old_log_probs has shape"):
        L.compute_grpo_clip_loss(torch.ones(2, 1), lp, torch.zeros(2, 4), 0.2)
    with pytest.raises(ValueError, match="unknown loss 'ppo'"):
        L.LossSettings(loss="ppo")
    with pytest.raises(ValueError, match="unknown length_norm"):
        L.LossSettings(length_norm="sum")
    with pytest.raises(ValueError, match="requires normalize_constant"):
        L.LossSettings(length_norm="masked_normalize")
    with pytest.raises(ValueError, match="unknown kl estimator"):
        L.LossSettings(kl_estimator="k4")

    def loss(mask=m, **settings):
        return L.grpo_microbatch_loss(
            lp, mask, None, torch.ones(2, 1), L.LossSettings(loss="no_baseline", **settings)
        )

    with pytest.raises(ValueError, match="requires ref_log_probs"):
        loss(kl_beta=0.1)
    with pytest.raises(ValueError, match="response_mask has shape"):
        loss(mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="response_mask has shape"):
        L.grpo_microbatch_train_step(
            lp, torch.ones(2, 4), 1, "no_baseline", raw_rewards=torch.ones(2, 1)
        )


@pytest.mark.parametrize(
    "length_norm,const,g0,g1",
    [
        ("masked_mean", None, -1 / 8, 2 / 4),  # -A_b / (B * n_b * gas), n = (2, 1)
        ("masked_normalize", 4.0, -1 / 16, 2 / 16),  # -A_b / (B * c * gas)
        ("token", None, -1 / 6, 2 / 6),  # -A_b / (n_total * gas)
    ],
)
def test_grpo_microbatch_loss_length_norms(length_norm, const, g0, g1):
    lp = T([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    mask = T([[1, 1, 0], [1, 0, 0]])
    adv = T([[1.0], [-2.0]])
    settings = L.LossSettings(
        loss="reinforce_with_baseline", length_norm=length_norm, normalize_constant=const
    )
    loss, meta = L.grpo_microbatch_loss(
        lp, mask, adv, None, settings, gradient_accumulation_steps=2
    )
    loss.backward()
    close(lp.grad, [[g0, g0, 0.0], [g1, 0.0, 0.0]])
    close(loss, (lp.grad * lp.detach()).sum())  # the loss is linear in log-probs here
    assert meta["num_response_tokens"] == 3
    if length_norm == "masked_mean":
        # seed 000's train step: this norm, then the backward
        lp.grad = None
        seed_loss, _ = L.grpo_microbatch_train_step(
            lp, mask, 2, "reinforce_with_baseline", advantages=adv
        )
        close(seed_loss, loss)
        close(lp.grad, [[g0, g0, 0.0], [g1, 0.0, 0.0]])


def test_grpo_microbatch_loss_clip_kl_and_empty_rows():
    lp = torch.log(T([[1.5, 0.5, 1.0], [1.0, 1.0, 1.0]])).requires_grad_()
    old = torch.zeros(2, 3)
    ref = torch.zeros(2, 3)
    mask = T([[1, 1, 1], [0, 0, 0]])  # row 1 empty
    adv = T([1.0, 1.0])
    settings = L.LossSettings(loss="grpo_clip", cliprange=0.2, kl_beta=0.5, kl_estimator="k1")
    loss, meta = L.grpo_microbatch_loss(
        lp, mask, adv, None, settings, old_log_probs=old, ref_log_probs=ref
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(lp.grad).all()
    close(meta["clip_fraction"], 1 / 3)
    close(meta["ratio_mean"], 1.0)
    close(meta["ratio_max"], 1.5)
    close(meta["kl"], (math.log(1.5) + math.log(0.5)) / 3)  # k1 = logp - ref
    # per-token loss (-1.2, -0.5 * ..., ...) + 0.5 * k1, masked mean over row 0, batch mean over
    # 2 rows
    close(loss, ((-1.2 - 0.5 - 1.0) + 0.5 * (math.log(1.5) + math.log(0.5))) / 3 / 2)
    # grad row 0: the clipped token only gets the KL term; the others ratio * A * (-1) + beta,
    # / (3 * 2)
    close(lp.grad[0], [(0.5) / 6, (-0.5 + 0.5) / 6, (-1.0 + 0.5) / 6])
    # a reference 100 nats away: k3 overflows; monitored only (kl_beta 0), it stays out of the loss
    far = torch.full((2, 3), 100.0)
    lp.grad = None
    settings = L.LossSettings(loss="grpo_clip", cliprange=0.2, kl_beta=0.0)
    loss, meta = L.grpo_microbatch_loss(
        lp, mask, adv, None, settings, old_log_probs=old, ref_log_probs=far
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(lp.grad).all()
    assert not torch.isfinite(meta["kl"])


def test_gradcheck_losses_float64():
    torch.manual_seed(0)
    d = dict(dtype=torch.float64)
    lp = (torch.randn(3, 5, **d) * 0.3).requires_grad_()
    old = torch.randn(3, 5, **d) * 0.3
    ref = torch.randn(3, 5, **d) * 0.3
    adv = torch.randn(3, 1, **d)
    mask = torch.rand(3, 5) > 0.3
    mask[:, 0] = True

    def naive(x):
        return L.compute_naive_policy_gradient_loss(adv, x)

    def grpo_clip(x):
        return L.compute_grpo_clip_loss(adv, x, old, 0.2)[0]

    def mean_rows(x):
        return L.masked_mean(x, mask, dim=1)

    def normalize_columns(x):
        return L.masked_normalize(x, mask, 3.0, dim=0)

    functions = [naive, grpo_clip, mean_rows, normalize_columns]
    functions.append(L.compute_entropy)
    for name, loss in L.LOSSES.items():
        if name == "cispo":
            continue  # its weight is a stop-gradient by definition: test_cispo_gradient_by_hand
        # clip-higher where the loss clips
        settings = L.LossSettings(loss=name, cliprange=0.2, cliprange_high=0.3)
        functions.append(lambda x, fn=loss.fn, s=settings: fn(x, mask, adv, adv, old, s)[0])
    for k in ("k1", "k2", "k3"):
        functions.append(lambda x, k=k: L.compute_kl(x, ref, k))
    for fn in functions:
        assert torch.autograd.gradcheck(fn, (lp,))
    h = torch.randn(7, 4, **d, requires_grad=True)
    w = torch.randn(11, 4, **d, requires_grad=True)
    labels = torch.randint(0, 11, (7,))
    for want_ent in (False, True):

        def chunked(h, w, want_ent=want_ent):
            logp, ent = L._ChunkedLogProbs.apply(h, w, labels, 0.7, 3, want_ent, None, None)
            if want_ent:
                return logp, ent
            return logp

        assert torch.autograd.gradcheck(chunked, (h, w))


# ------------------------------------------------------------- chunked log-probs on a real model
def _naive(model, ids, labels, temperature):
    logits = model(ids).logits.float() / temperature  # (B, T, V)
    lp = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    return lp, L.compute_entropy(logits)


def _grads(model, out_lp, out_ent, w):
    model.zero_grad()
    ((out_lp * w).sum() + out_ent.sum()).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("temperature,fallback", [(1.0, False), (0.7, False), (0.7, True)])
def test_get_response_log_probs_matches_naive(tiny, temperature, fallback):
    model = tiny[0]
    # False forces the model's-own-logits path; None lets the model check itself
    model._logprob_fast_path = None
    if fallback:
        model._logprob_fast_path = False
    torch.manual_seed(0)
    ids = torch.randint(0, 500, (3, 19))
    labels = torch.randint(0, 500, (3, 19))
    w = torch.randn(3, 19)
    # 57 tokens: the chunks of 8 do not divide them evenly
    out = L.get_response_log_probs(
        model, ids, labels, return_token_entropy=True, temperature=temperature, chunk_size=8
    )
    lp, ent = _naive(model, ids, labels, temperature)
    close(out["log_probs"], lp, 1e-5)
    close(out["token_entropy"], ent, 1e-5)
    ours = _grads(model, out["log_probs"], out["token_entropy"], w)
    reference = _grads(model, lp, ent, w)
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, atol=1e-5 * b.abs().max().item(), rtol=1e-4)
    with torch.no_grad():  # the old log-probs path; no entropy key unless asked
        out = L.get_response_log_probs(model, ids, labels, temperature=temperature)
    assert set(out) == {"log_probs"}
    assert not out["log_probs"].requires_grad
    close(out["log_probs"], lp, 1e-5)
    model._logprob_fast_path = None


def test_get_response_log_probs_bf16_and_errors(tiny):
    model = copy.deepcopy(tiny[0]).to(torch.bfloat16)
    ids = torch.randint(0, 500, (2, 9))
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits.float(), -1)[:, :-1]
        out = L.get_response_log_probs(model, ids[:, :-1], ids[:, 1:])["log_probs"]
    assert out.dtype == torch.float32
    # bf16 logits, a different matmul blocking
    close(out, ref.gather(-1, ids[:, 1:, None]).squeeze(-1), 5e-2)
    with torch.no_grad():  # HF-style -100 labels are scored (as token 0) instead of crashing gather
        ignored = L.get_response_log_probs(model, ids, torch.full_like(ids, -100))["log_probs"]
    assert torch.isfinite(ignored).all()
    with pytest.raises(ValueError, match=r"both \(B, T\)"):
        L.get_response_log_probs(model, ids, ids[:, 1:])
    with pytest.raises(ValueError, match="temperature"):
        L.get_response_log_probs(model, ids, ids, temperature=0.0)


# ------------------------------------------------------- issue fixes, checked at the gradient level
def test_token_norm_divides_by_the_whole_optimizer_step():
    """DAPO: with step_tokens = N_step, every response token's log-prob gets the gradient
    -A_i / N_step, whatever microbatch it sits in (two microbatches of 3 and 9 tokens,
    N_step = 12)."""
    a1 = T([[1.5]])
    a2 = T([[-0.5], [2.0]])
    lp1 = torch.zeros(1, 5, requires_grad=True)
    m1 = T([[1, 1, 1, 0, 0]])  # 3 tokens
    lp2 = torch.zeros(2, 5, requires_grad=True)
    m2 = T([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])  # 9 tokens
    settings = L.LossSettings(loss="reinforce_with_baseline", length_norm="token")
    for lp, m, a in [(lp1, m1, a1), (lp2, m2, a2)]:
        loss, _ = L.grpo_microbatch_loss(
            lp, m, a, None, settings, gradient_accumulation_steps=2, step_tokens=12
        )
        loss.backward()
    close(lp1.grad, -a1 / 12 * m1)
    close(lp2.grad, -a2 / 12 * m2)


def test_the_loss_table_owns_which_losses_need_pi_old():
    """RATIO_LOSSES is derived from LOSSES, and the losses agree with it: each ratio loss refuses a
    missing pi_old with a one-line error, the others do not read it."""
    want = []
    for name, loss in L.LOSSES.items():
        if loss.needs_old:
            want.append(name)
    assert L.RATIO_LOSSES == tuple(want)
    assert L.LOSS_TYPES == tuple(L.LOSSES)
    lp = torch.log(T([[1.5, 0.5]])).requires_grad_()
    mask = T([[1, 1]])
    a = T([1.0])
    for name in L.RATIO_LOSSES:
        settings = L.LossSettings(loss=name, cliprange=0.2)
        with pytest.raises(ValueError, match="old_log_probs") as error:
            L.grpo_microbatch_loss(lp, mask, a, a, settings, old_log_probs=None)
        assert "\n" not in str(error.value)
    for name, loss in L.LOSSES.items():
        if not loss.needs_old:
            settings = L.LossSettings(loss=name)
            without, _ = loss.fn(lp, mask, a, a, None, settings)
            with_old, _ = loss.fn(lp, mask, a, a, torch.zeros(1, 2), settings)
            close(without, with_old)


@pytest.mark.parametrize("name", L.LOSS_TYPES)
def test_every_loss_takes_the_same_inputs(name):
    """One set of inputs for every loss: a (B, T) per-token loss, a finite (B, T) gradient through
    grpo_microbatch_loss (pure: the caller owns the backward), and compute_policy_gradient_loss's
    seed spelling dispatching to it (every token a response token)."""
    torch.manual_seed(0)
    lp = (torch.randn(3, 4) * 0.3).requires_grad_()
    old = torch.randn(3, 4) * 0.3
    mask = T([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # row 2 empty
    adv = T([1.0, -0.5, 2.0])
    raw = T([1.0, 0.0, 1.0])
    settings = L.LossSettings(loss=name, cliprange=0.2)
    per_token, meta = L.LOSSES[name].fn(lp, mask, adv, raw, old, settings)
    assert per_token.shape == (3, 4)
    for value in meta.values():
        assert value.shape == (3, 4)
    loss, _ = L.grpo_microbatch_loss(lp, mask, adv, raw, settings, old_log_probs=old)
    assert loss.dim() == 0
    assert loss.requires_grad
    assert lp.grad is None  # no backward happened
    loss.backward()
    assert lp.grad.shape == (3, 4)
    assert torch.isfinite(lp.grad).all()
    assert lp.grad[~mask.bool()].abs().sum() == 0  # prompt, padding and the empty row: none
    every_token = torch.ones(3, 4)
    seed, _ = L.compute_policy_gradient_loss(lp, name, raw, adv, old, 0.2)
    close(seed, L.LOSSES[name].fn(lp, every_token, adv, raw, old, settings)[0])


@pytest.mark.parametrize("name", L.RATIO_LOSSES)
def test_ratio_losses_on_policy_are_reinforce(name):
    """At pi = pi_old every ratio is 1: each ratio loss's gradient is REINFORCE's, -A / n_i per
    response token under the masked mean."""
    lp = T([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = T([[1, 1, 0], [1, 1, 1]])
    adv = T([1.0, -2.0])
    settings = L.LossSettings(loss=name, cliprange=0.2)
    loss, meta = L.grpo_microbatch_loss(lp, mask, adv, None, settings, old_log_probs=lp.detach())
    loss.backward()
    close(lp.grad, [[-1 / 2 / 2, -1 / 2 / 2, 0.0], [2 / 3 / 2] * 3])
    close(meta["ratio_mean"], 1.0)


def test_a_new_loss_is_one_function_and_one_table_line(monkeypatch):
    """The extension point: a loss with its own hyperparameter (a field of a LossSettings subclass),
    registered in LOSSES, trains through grpo_microbatch_loss like the built-in ones."""

    @dataclasses.dataclass
    class CappedSettings(L.LossSettings):
        ratio_cap: float = 2.0  # the new loss's hyperparameter

    def capped_ratio_loss(
        policy_log_probs, response_mask, advantages, raw_rewards, old_log_probs, settings
    ):
        """-min(r, cap) A per token, r = pi / pi_old."""
        ratio = torch.exp(policy_log_probs - old_log_probs)  # (B, T)
        capped = torch.clamp(ratio, max=settings.ratio_cap)  # (B, T)
        return -capped * advantages[:, None], {"ratio": ratio.detach()}

    monkeypatch.setitem(L.LOSSES, "mine", L.Loss(capped_ratio_loss, needs_old=True))
    settings = CappedSettings(loss="mine", ratio_cap=2.0)
    lp = torch.log(T([[1.5, 3.0, 1.0]])).requires_grad_()  # old = 0: the ratios are 1.5, 3, 1
    mask = T([[1, 1, 0]])
    loss, meta = L.grpo_microbatch_loss(
        lp, mask, T([1.0]), None, settings, old_log_probs=torch.zeros(1, 3)
    )
    loss.backward()
    close(loss, -(1.5 + 2.0) / 2)  # the masked mean of -min(r, 2) over two tokens
    close(lp.grad, [[-1.5 / 2, 0.0, 0.0]])  # d(-r) / d log p = -r; the capped token has none
    close(meta["ratio_max"], 3.0)


def test_seed_spellings():
    """The handouts' keyword spellings and seed 002's function names work."""
    ratio = torch.ones(2, 7)
    advs = torch.full((2, 7), 2.0)
    masks = T([[1, 1, 1, 1, 0, 0, 0], [1] * 7])
    close(L.masked_normalize(ratio * advs, masks, dim=1, constant_normalizer=7), [8 / 7, 2.0])
    table = {"a": 1.0, "b": 0.0}

    def fn(r, gt):
        return {"reward": table[r]}

    def float_reward(r, gt):
        return table[r]

    adv, _, _ = L.compute_group_normalized_rewards(
        fn, ["a", "b"], ["x", "x"], 2, 1e-6, normalized_by_std=False
    )
    close(adv, [0.5, -0.5])
    adv, raw, meta = L.compute_group_normalized_advantages(
        ["a", "b"], ["x", "x"], float_reward, 2, 1e-6, False
    )
    close(adv, [0.5, -0.5])
    assert {"mean", "std", "max", "min"} <= set(meta)
    # seed 002: short (3 tokens) and long (6 tokens) responses, num_tokens = 6 -> every token's
    # gradient is 1 / (6 * 2)
    x = torch.ones(2, 6, requires_grad=True)
    m = T([[1, 1, 1, 0, 0, 0], [1] * 6])
    L.masked_mean_drgrpo(x, m, 6).backward()
    close(x.grad, m / 12)


def test_seed_002_api():
    """Seed 002's compute_loss(advantages, policy_log_probs, old_log_probs, clip_range), its
    masked_mean (the rows' means, then the batch mean: masked_mean_per_sequence, since seed 000's
    masked_mean averages all kept tokens) and its Dict[str, torch.Tensor] metadata, on the seed's
    own short/long example."""
    a = T([1.0, -1.0])  # advantages (B,), as seed 002 passes them
    old = torch.zeros(2, 2)
    lp = torch.log(T([[1.5, 0.5], [1.5, 0.9]]))  # the ratios
    loss, meta = L.compute_loss(a, lp, old, clip_range=0.2)
    close(loss, [[-1.2, -0.5], [1.5, 0.9]])  # -min(r A, clip(r, 0.8, 1.2) A)
    assert meta["clipped"].tolist() == [[True, False], [False, False]]
    assert all(map(torch.is_tensor, meta.values()))
    close(L.compute_loss(a, lp, old, 0.2)[0], L.compute_grpo_clip_loss(a, lp, old, 0.2)[0])
    table = {"a": 1.0, "b": 0.0, "c": 0.0}

    def float_reward(r, gt):
        return table[r]

    _, _, meta = L.compute_group_normalized_advantages(
        ["a", "b", "c", "c"], ["x"] * 4, float_reward, 2, 1e-6, True
    )
    assert all(torch.is_tensor(v) and v.dim() == 0 for v in meta.values())
    torch.testing.assert_close(meta["mean"], torch.tensor(0.25))
    torch.testing.assert_close(meta["max"], torch.tensor(1.0))
    # seed 002 §1.4.2: a short response (3 tokens, 3 masked) and a long one (6 tokens);
    # masked_mean weighs each token 1 / (B |o_i|), masked_mean_drgrpo with num_tokens 6 weighs
    # every token 1 / (B * 6)
    x = torch.ones(2, 6, requires_grad=True)
    m = T([[1, 1, 1, 0, 0, 0], [1] * 6])
    close(L.masked_mean_per_sequence(x * T([[2.0] * 6, [4.0] * 6]), m), (2.0 + 4.0) / 2)
    L.masked_mean_per_sequence(x, m).backward()
    close(x.grad, T([[1 / 6] * 3 + [0] * 3, [1 / 12] * 6]))
    # seed 000's masked_mean: over all 9 tokens
    close(L.masked_mean(x * T([[2.0] * 6, [4.0] * 6]), m), (3 * 2.0 + 6 * 4.0) / 9)
    # rows with no tokens count 0, not NaN
    close(L.masked_mean_per_sequence(x, torch.zeros(2, 6)), 0.0)
    # the trainer's two per-row reductions are seed 002's two functions
    lp = torch.randn(2, 6)
    adv = T([0.5, -1.0])

    def per_sequence(t):
        return L.masked_mean_per_sequence(t, m)

    def drgrpo(t):
        return L.masked_mean_drgrpo(t, m, 6)

    for norm, reduce in [("masked_mean", per_sequence), ("masked_normalize", drgrpo)]:
        settings = L.LossSettings(
            loss="reinforce_with_baseline", length_norm=norm, normalize_constant=6
        )
        got, _ = L.grpo_microbatch_loss(lp, m, adv, None, settings, gradient_accumulation_steps=4)
        close(got, reduce(-adv[:, None] * lp) / 4)


def test_kl_divergence_seq_is_seed_004_eq8():
    lp = T([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    ref = T([[-1.5, -1.0, 0.0], [-1.0, -1.0, 9.0]])
    mask = T([[1, 1, 0], [1, 1, 1]])
    # (1/N) sum_i sum_t (lp - ref): row 0: 0.5 - 1.0 = -0.5; row 1: 0.5 + 0.5 - 9.5 = -8.5
    close(L.kl_divergence(lp, ref, mask, "seq"), (-0.5 - 8.5) / 2)
    close(L.kl_divergence(lp, ref, mask, "k1"), (0.5 - 1.0 + 0.5 + 0.5 - 9.5) / 5)


def test_rollout_is_tis_and_mis_on_a_hand_made_batch():
    old = torch.log(T([[0.5, 0.9, 0.3], [0.2, 0.2, 0.6]]))
    mu = torch.log(T([[0.1, 0.9, 0.9], [0.1, 0.3, 0.6]]))  # token ratios 5, 1, 1/3 | 2, 2/3, 1
    mask = T([[1, 1, 1], [1, 1, 0]]).bool()
    w, m = L.compute_rollout_is(old, mu, mask, "tis", cap=2.0)
    close(w[mask], [2.0, 1.0, 1 / 3, 2.0, 2 / 3])
    assert m["is_weight_max"] == pytest.approx(5.0)
    assert m["is_weight_min"] == pytest.approx(1 / 3)
    assert m["is_weight_outside_frac"] == pytest.approx(2 / 5)  # 5 and 1/3 are outside [0.5, 2]
    assert m["is_dropped_frac"] == 0.0
    lr = (old - mu)[mask]
    assert m["mismatch_kl"] == pytest.approx(float((lr.exp() - 1 - lr).mean()))
    # MIS: rho where rho <= cap, 0 beyond; no lower bound unless floor is given
    w, m = L.compute_rollout_is(old, mu, mask, "mis", cap=2.0)
    close(w[mask], [0.0, 1.0, 1 / 3, 2.0, 2 / 3])
    assert m["is_dropped_frac"] == pytest.approx(1 / 5)
    w, m = L.compute_rollout_is(old, mu, mask, "mis", cap=2.0, floor=0.5)
    close(w[mask], [0.0, 1.0, 0.0, 2.0, 2 / 3])
    assert m["is_dropped_frac"] == pytest.approx(2 / 5)
    # per sequence: the row ratios are 5/3 and 4/3
    w, _ = L.compute_rollout_is(old, mu, mask, "tis", cap=2.0, level="sequence")
    close(w[0], [5 / 3] * 3)
    close(w[1, :2], [4 / 3] * 2)
    w, _ = L.compute_rollout_is(old, mu, mask, "mis", cap=1.5, level="sequence")
    close(w[mask], [0.0] * 3 + [4 / 3] * 2)
    # TIS weights scale each token's gradient and carry none themselves
    w, _ = L.compute_rollout_is(old, mu, mask, "tis", cap=2.0)
    lp = old.clone().requires_grad_()
    settings = L.LossSettings(loss="reinforce_with_baseline", length_norm="token")
    loss, _ = L.grpo_microbatch_loss(
        lp, mask, T([1.0, 1.0]), None, settings, is_weights=w.requires_grad_(), step_tokens=5
    )
    loss.backward()
    close(lp.grad[mask], -w.detach()[mask] / 5)
    assert w.grad is None  # the weights are detached


def test_mis_weights_kept_tokens_by_their_ratio():
    """Masked IS as defined: rho = [1.8, 0.4, 3.0] with cap 2 weighs the tokens [1.8, 0.4, 0] (a
    drop-only filter would give [1, 1, 0], or [1, 0, 0] with a 1/C lower bound); the gradient
    follows the weights."""
    rho = T([[1.8, 0.4, 3.0]])
    mu = torch.log(T([[0.5, 0.5, 0.2]]))
    old = mu + rho.log()
    mask = torch.ones(1, 3, dtype=torch.bool)
    w, _ = L.compute_rollout_is(old, mu, mask, "mis", cap=2.0)
    close(w, [[1.8, 0.4, 0.0]])
    lp = old.clone().requires_grad_()
    settings = L.LossSettings(loss="reinforce_with_baseline", length_norm="token")
    loss, _ = L.grpo_microbatch_loss(
        lp, mask, T([1.0]), None, settings, is_weights=w, step_tokens=3
    )
    loss.backward()
    close(lp.grad, [[-1.8 / 3, -0.4 / 3, 0.0]])


def test_clip_fraction_is_zero_for_a_pass_with_no_response_token():
    """--mask-truncated can leave a forward pass with no response token: it clips nothing (0, not
    NaN)."""
    lp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss, meta = L.grpo_microbatch_train_step(
        lp,
        mask,
        1,
        "grpo_clip",
        advantages=T([1.0, -1.0]),
        old_log_probs=torch.zeros(2, 3),
        cliprange=0.2,
    )
    assert meta["clip_fraction"].item() == 0.0
    assert loss.item() == 0.0
    assert torch.equal(lp.grad, torch.zeros(2, 3))


def _naive_banned(model, ids, labels, ban_ids, ban_mask, temperature):
    logits = model(ids).logits.float() / temperature  # (B, T, V)
    banned = torch.zeros_like(logits, dtype=torch.bool)  # (B, T, V)
    banned[..., ban_ids] = True
    logits = logits.masked_fill(banned & ban_mask[..., None], float("-inf"))
    logp = torch.log_softmax(logits, -1)
    ent = -(logp.exp() * torch.where(logp.isfinite(), logp, 0.0)).sum(-1)
    return logp.gather(-1, labels[..., None]).squeeze(-1), ent


@pytest.mark.parametrize("fallback", [False, True])
def test_min_tokens_ban_scores_the_sampled_distribution(tiny, fallback):
    """vLLM bans stop tokens for the first min_tokens tokens; the trainer scores that same
    distribution."""
    model = tiny[0]
    model._logprob_fast_path = None
    if fallback:
        model._logprob_fast_path = False
    torch.manual_seed(1)
    ids = torch.randint(1, 500, (2, 11))
    labels = torch.randint(1, 500, (2, 11))
    w = torch.randn(2, 11)
    ban_ids = [0, 7]
    ban_mask = torch.zeros(2, 11, dtype=torch.bool)
    ban_mask[:, 3:6] = True
    out = L.get_response_log_probs(
        model, ids, labels, True, 0.7, chunk_size=4, ban_token_ids=ban_ids, ban_mask=ban_mask
    )
    lp, ent = _naive_banned(model, ids, labels, ban_ids, ban_mask, 0.7)
    close(out["log_probs"], lp, 1e-5)
    close(out["token_entropy"], ent, 1e-5)
    plain = L.get_response_log_probs(model, ids, labels, temperature=0.7)["log_probs"]
    moved = (plain - out["log_probs"])[ban_mask].abs()
    assert moved.min() > 1e-6  # the ban moves every banned position
    close(plain[~ban_mask], out["log_probs"][~ban_mask], 1e-6)  # and nothing else
    ours = _grads(model, out["log_probs"], out["token_entropy"], w)
    reference = _grads(model, lp, ent, w)
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, atol=1e-5 * b.abs().max().item(), rtol=1e-4)
    model._logprob_fast_path = None


def test_fast_path_checks_itself_against_the_models_logits():
    """Granite divides its logits by logits_scaling: a fast path that trusted the head would be
    0.2+ nats off."""
    from transformers import GraniteConfig, GraniteForCausalLM

    torch.manual_seed(0)
    cfg = GraniteConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        logits_scaling=4.0,
        tie_word_embeddings=False,
    )
    model = GraniteForCausalLM(cfg)
    ids = torch.randint(0, 64, (2, 9))
    out = L.get_response_log_probs(model, ids, ids, return_token_entropy=True)
    lp, ent = _naive(model, ids, ids, 1.0)
    close(out["log_probs"], lp, 1e-5)
    close(out["token_entropy"], ent, 1e-5)
    assert model._logprob_fast_path is False


def test_bf16_autocast_over_fp32_weights(tiny):
    """fp32 master weights, bf16 compute: the chunked head casts the weight and returns an fp32
    gradient."""
    model = copy.deepcopy(tiny[0])
    ids = torch.randint(0, 500, (2, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = L.get_response_log_probs(model, ids, ids, return_token_entropy=True)
    out["log_probs"].sum().backward()
    head = model.get_output_embeddings().weight
    assert head.grad is not None
    assert head.grad.dtype == torch.float32
    assert torch.isfinite(head.grad).all()
    with torch.no_grad():
        lp, _ = _naive(model, ids, ids, 1.0)
    close(out["log_probs"], lp, 5e-2)


def test_chunked_head_backward_recomputes_the_forwards_bf16_logits():
    """Under CPU bf16 autocast over fp32 weights, the forward's h @ W^T runs in bf16; the backward
    must recompute the same logits (not fp32 ones) before subtracting the forward's log-sum-exp.
    Checked on confident tokens (p > 0.99), where a mismatched softmax multiplies the gradient:
    d logp / d h stays within the autograd reference's own bf16 error, and the softmax sums to 1
    (each column sum of d logp / d W is 1 - sum(p))."""
    torch.manual_seed(0)
    n = 64  # tokens
    hidden = 32
    vocab = 96
    temperature = 0.7
    h = torch.randn(n, hidden)
    w = torch.randn(vocab, hidden)
    labels = (h @ w.t()).argmax(-1)  # the most likely token: confident rows

    def grads(fn, dtype=torch.float32, bf16=True):
        hh = h.to(dtype, copy=True).requires_grad_()
        ww = w.to(dtype, copy=True).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logp = fn(hh, ww)
        logp.sum().backward()
        return logp.detach(), hh.grad, ww.grad

    def chunked(hh, ww):
        return L._ChunkedLogProbs.apply(hh, ww, labels, temperature, 16, False, None, None)[0]

    def autograd(hh, ww):
        z = (hh @ ww.t()).float() / temperature  # (N, V)
        return torch.log_softmax(z, -1).gather(-1, labels[:, None]).squeeze(-1)

    _, ours_h, ours_w = grads(chunked)
    _, ref_h, _ = grads(autograd)
    exact_lp, exact_h, _ = grads(autograd, torch.float64, bf16=False)
    confident = exact_lp.exp() > 0.99
    assert confident.sum() >= 8
    ours_err = (ours_h - exact_h).norm(dim=1)[confident]
    ref_err = (ref_h - exact_h).norm(dim=1)[confident]
    assert ours_err.median() <= 2 * ref_err.median()
    assert ours_err.max() <= 2 * ref_err.max()
    # |1 - sum(p)| relative to the gradient's size
    column_sums = ours_w.sum(0).abs() / ours_w.abs().sum(0)
    assert column_sums.max() <= 1e-2


def test_shared_prefix_is_exact(tiny):
    """prefix_len runs the shared prompt once and reuses its KV cache: the same log-probs,
    entropies and parameter gradients as the plain computation, to fp32 rounding (HF's RMSNorm and
    eager softmax compute in float32 even for a float64 model, so 1e-7 relative is the floor there
    too). The embedded model's weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "models", "countdown-tiny"))
    torch.manual_seed(3)
    ids = torch.randint(0, 500, (8, 60))
    labels = torch.randint(0, 500, (8, 60))
    w = torch.randn(8, 60)
    ids[:, :30] = ids[:1, :30]
    # real tokens per row (the prompt included): the rest is padding
    n = torch.tensor([60, 41, 35, 52, 60, 38, 47, 31])
    w = w * (torch.arange(60) < n[:, None])  # only real tokens count
    real = (torch.arange(60) < n[:, None])[:, 29:]  # (8, 31)
    # plain; the prompt once + the padded rows packed; the padding not run
    settings = [(0, None), (29, None), (29, n)]
    lps = []  # the response columns' log-probs of each setting, padding zeroed
    ents = []  # their entropies
    grads = []  # the parameter gradients
    for P, lengths in settings:
        out = L.get_response_log_probs(
            model,
            ids,
            labels,
            return_token_entropy=True,
            temperature=0.7,
            chunk_size=64,
            prefix_len=P,
            lengths=lengths,
        )
        lp = out["log_probs"][:, 29:]
        ent = out["token_entropy"][:, 29:]
        grads.append(_grads(model, lp, ent * real, w[:, 29:]))
        lps.append(lp.detach() * real)
        ents.append(ent.detach() * real)
    for k in (1, 2):
        assert (lps[k] - lps[0]).abs().max() <= 1e-5
        assert (ents[k] - ents[0]).abs().max() <= 1e-5
        relative = [
            ((a - b).abs().max() / b.abs().max()).item() for a, b in zip(grads[k], grads[0])
        ]
        assert max(relative) <= 1e-5
    assert lps[2][~real].eq(0).all()  # padding is not run: it reads 0
    assert L.shared_prefix_works(model)
    with pytest.raises(ValueError, match="do not share"):
        L.get_response_log_probs(
            model, torch.randint(0, 500, (2, 9)), torch.randint(0, 500, (2, 9)), prefix_len=5
        )
    with pytest.raises(ValueError, match="one per row"):
        # a row longer than T
        L.get_response_log_probs(model, ids, labels, prefix_len=29, lengths=n + 1)


def test_shared_prefix_is_off_for_sliding_window_attention():
    """One 4D block mask would serve a windowed layer as a full one: a sliding-window model scores
    the plain way, also where the 9-token self-check cannot see the window (64)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    for window, works in [(True, False), (False, True)]:
        cfg = Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            use_sliding_window=window,
            sliding_window=64,
            max_window_layers=0,
        )
        assert L.shared_prefix_works(Qwen2ForCausalLM(cfg)) == works


# ----------------------------------------------------------------------------- course signatures
# The handouts' functions as the handouts write them: (function, seed and section, its name in
# losses.py, its parameters). docs/course_api.md's table lists the same rows.
COURSE_API = [
    (
        "tokenize_prompt_and_output",
        "000 §4.2",
        "tokenize_prompt_and_output",
        "prompt_strs, output_strs, tokenizer",
    ),
    ("compute_entropy", "000 §4.2", "compute_entropy", "logits"),
    (
        "get_response_log_probs",
        "000 §4.2",
        "get_response_log_probs",
        "model, input_ids, labels, return_token_entropy=False",
    ),
    (
        "masked_normalize",
        "000 §4.2",
        "masked_normalize",
        "tensor, mask, normalize_constant, dim=None",
    ),
    (
        "sft_microbatch_train_step",
        "000 §4.2",
        "sft_microbatch_train_step",
        "policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant=1.0",
    ),
    (
        "compute_group_normalized_rewards",
        "000 §7.2",
        "compute_group_normalized_rewards",
        "reward_fn, rollout_responses, repeated_ground_truths, group_size, advantage_eps, "
        "normalize_by_std",
    ),
    (
        "compute_group_normalized_rewards",
        "001 §5.2",
        "compute_group_normalized_rewards",
        "reward_fn, rollout_responses, repeated_ground_truths, group_size, advantage_eps, "
        "normalized_by_std",
    ),
    (
        "compute_naive_policy_gradient_loss",
        "000 §7.2",
        "compute_naive_policy_gradient_loss",
        "raw_rewards_or_advantages, policy_log_probs",
    ),
    (
        "compute_grpo_clip_loss",
        "000 §7.2",
        "compute_grpo_clip_loss",
        "advantages, policy_log_probs, old_log_probs, cliprange",
    ),
    (
        "compute_policy_gradient_loss",
        "000 §7.2",
        "compute_policy_gradient_loss",
        "policy_log_probs, loss_type, raw_rewards=None, advantages=None, old_log_probs=None, "
        "cliprange=None",
    ),
    ("masked_mean", "000 §7.2", "masked_mean", "tensor, mask, dim=None"),
    (
        "grpo_microbatch_train_step",
        "000 §7.2",
        "grpo_microbatch_train_step",
        "policy_log_probs, response_mask, gradient_accumulation_steps, loss_type, "
        "raw_rewards=None, advantages=None, old_log_probs=None, cliprange=None",
    ),
    (
        "compute_group_normalized_advantages",
        "002 §1.4.1",
        "compute_group_normalized_advantages",
        "rollout_responses, repeated_ground_truths, reward_fn, group_size, advantage_eps, "
        "normalize_by_std",
    ),
    (
        "compute_loss",
        "002 §1.4.2",
        "compute_loss",
        "advantages, policy_log_probs, old_log_probs, clip_range",
    ),
    ("masked_mean", "002 §1.4, Task 5", "masked_mean_per_sequence", "tensor, mask"),
    ("masked_mean_drgrpo", "002 §1.4, Task 5", "masked_mean_drgrpo", "tensor, mask, num_tokens"),
]


def handout_parameters(params):
    """[(name, default)] of a parameter list as written ("x, dim=None"); inspect's `empty` where
    it has no default."""
    args = ast.parse(f"def f({params}): pass").body[0].args
    names = [a.arg for a in args.args]
    defaults = [inspect.Parameter.empty] * (len(names) - len(args.defaults))
    for node in args.defaults:
        defaults.append(ast.literal_eval(node))
    return list(zip(names, defaults))


def course_section():
    """The names of the functions losses.py defines in its marked "course spellings" section."""
    source = inspect.getsource(L)
    banner = source.index("course spellings\n")
    first_line = source[:banner].count("\n") + 1
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.lineno > first_line:
            names.append(node.name)
    return names


def readme_course_rows():
    """The rows (lists of cells) of the "Course API" table (docs/course_api.md), without the
    header."""
    section = doc_section("Course API")
    rows = []
    for line in section.split("\n"):
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[2:]  # the header and the |---| line


@pytest.mark.parametrize("handout,seed,ours,params", COURSE_API)
def test_course_signatures(handout, seed, ours, params):
    """Every call the handout's signature allows works on ours: the handout's parameters come
    first, in order, under its names (seed 001's normalized_by_std: a keyword-only second spelling
    at that place), with its defaults; our further parameters are optional."""
    signature = inspect.signature(getattr(L, ours))
    positional = []
    for p in signature.parameters.values():
        if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
            positional.append(p)
    wanted = handout_parameters(params)
    assert len(positional) >= len(wanted), f"{ours}{signature} lacks parameters of {params}"
    for i, (name, default) in enumerate(wanted):
        ours_p = positional[i]
        if ours_p.name != name:
            ours_p = signature.parameters.get(name)
            assert ours_p is not None, f"{ours}{signature}: no parameter {name} ({seed})"
            assert ours_p.kind == inspect.Parameter.KEYWORD_ONLY, f"{ours}: {name} out of place"
        if default is not inspect.Parameter.empty:
            assert ours_p.default == default, f"{ours}: {name} defaults to {ours_p.default!r}"
    for p in list(signature.parameters.values())[len(wanted) :]:
        assert p.default is not inspect.Parameter.empty, (
            f"{ours}: extra parameter {p.name} needs a default"
        )


def test_readme_course_api_table_is_the_pinned_one():
    """docs/course_api.md's table lists COURSE_API's rows, and its last column tells the truth: "the
    project's own" for a function above losses.py's course section, else a function of the section
    that calls the first name given."""
    rows = readme_course_rows()
    listed = []
    for handout, seed, ours, params in COURSE_API:
        listed.append([f"`{handout}({params})`", seed, f"`{ours}`"])
    assert [row[:3] for row in rows] == listed
    section = course_section()
    for row in rows:
        ours = row[2].strip("`")
        delegate = row[3]
        if delegate == "the project's own":
            assert ours not in section
        else:
            assert ours in section
            first = re.match(r"`(\w+)`", delegate).group(1)
            assert hasattr(L, first)
            assert first in inspect.getsource(getattr(L, ours))
    # every function of the course section is in the table
    assert set(section) <= {row[2].strip("`") for row in rows}


# ----------------------------------------------------------------------------- advantage estimators
def test_each_advantage_estimator_by_hand():
    """One group of 4, two correct, and one with one correct: each estimator's scores computed by
    hand (passk at k = 2 from Chen et al.'s A_correct = 1 - rho, A_wrong = 1 - rho - C(n - c - 1,
    k - 1) / C(n - 1, k - 1))."""
    two = T([[1.0, 0.0, 0.0, 1.0]])
    one = T([[0.0, 1.0, 0.0, 0.0]])
    close(L.ADVANTAGES["grpo"](two, 2), [[0.5, -0.5, -0.5, 0.5]])
    close(
        L.ADVANTAGES["rloo"](two, 2), [[2 / 3, -2 / 3, -2 / 3, 2 / 3]]
    )  # r - mean of the 3 others
    close(L.ADVANTAGES["rloo"](one, 2), [[-1 / 3, 1.0, -1 / 3, -1 / 3]])
    # two correct of 4, k = 2: rho = 1 - C(2, 2) / C(4, 2) = 5/6; wrong: 1/6 - C(1, 1) / C(3, 1)
    close(L.ADVANTAGES["passk"](two, 2), [[1 / 6, -1 / 6, -1 / 6, 1 / 6]])
    # one correct of 4, k = 2: rho = 1 - C(3, 2) / C(4, 2) = 1/2; wrong: 1/2 - C(2, 1) / C(3, 1)
    close(L.ADVANTAGES["passk"](one, 2), [[-1 / 6, 1 / 2, -1 / 6, -1 / 6]])
    # one correct of 4, k = 3: rho = 1 - C(3, 3) / C(4, 3) = 3/4; wrong: 1/4 - C(2, 2) / C(3, 2)
    close(L.ADVANTAGES["passk"](one, 3), [[-1 / 12, 1 / 4, -1 / 12, -1 / 12]])
    assert sorted(L.ADVANTAGES) == ["grpo", "passk", "rloo"]


def test_passk_advantages_match_the_enumerated_subsets():
    """For rewards that are not 0/1 (ties included) and every k < G <= 6: A_i = the mean maximum
    of the k-subsets holding y_i minus the mean maximum of all k-subsets, enumerated; k = 1 is
    GRPO; 0/1 rewards give 1 - pass_at_k for a correct response."""
    import itertools

    gen = torch.Generator().manual_seed(0)
    for G in range(2, 7):
        rewards = torch.randint(0, 4, (3, G), generator=gen).float() / 3  # ties likely
        for k in range(1, G):
            got = L.passk_advantages(rewards, k)
            subsets = list(itertools.combinations(range(G), k))
            for row in range(3):
                r = rewards[row].tolist()
                best = {s: max(r[j] for j in s) for s in subsets}
                rho = sum(best.values()) / len(subsets)
                want = []
                for i in range(G):
                    holding = [best[s] for s in subsets if i in s]
                    want.append(sum(holding) / len(holding) - rho)
                close(got[row], want, tol=1e-6)
        close(L.passk_advantages(rewards, 1), L.grpo_advantages(rewards, 1))
    binary = T([[1.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    for k in range(1, 6):
        correct_adv = 1 - float(L.pass_at_k(6, 2, k))
        close(L.passk_advantages(binary, k)[0, 0], correct_adv)


def test_pass_at_k_is_the_unbiased_estimator_in_one_place():
    """pass_at_k(n, c, k) is exact (a Fraction) and is the chance that a random k-subset holds a
    correct sample, counted; best_of_n.py uses this one."""
    import itertools
    from fractions import Fraction

    import best_of_n

    assert best_of_n.pass_at_k is L.pass_at_k
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                hit = sum(1 for s in subsets if min(s) < c)  # samples 0..c-1 are the correct ones
                assert L.pass_at_k(n, c, k) == Fraction(hit, len(subsets))
    with pytest.raises(ValueError, match="pass@k needs"):
        L.pass_at_k(4, 1, 5)


def test_compute_advantages_normalisers_by_hand():
    """group: / (the group's reward std + eps) (today's GRPO, the same bits as
    group_normalized_advantages); batch: / (the std of all centred scores + eps); none: the
    scores. A flat group is exactly 0 under every estimator."""
    raw = T([1.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.1, 0.1])  # group 1 flat, with a float32 mean != 0.1
    for name in L.ADVANTAGES:
        for adv_std in L.ADV_STDS:
            adv, meta = L.compute_advantages(raw, 4, name, adv_std, 1e-6, 2)
            assert adv[4:].tolist() == [0.0] * 4, (name, adv_std)
            assert meta["frac_groups_zero_std"] == 0.5
    centred = T([0.75, -0.25, -0.25, -0.25])
    adv, _ = L.compute_advantages(raw, 4, "grpo", "none", 1e-6)
    close(adv[:4], centred)
    adv, _ = L.compute_advantages(raw, 4, "grpo", "group", 1e-6)
    close(adv[:4], centred / (0.5 + 1e-6))  # the unbiased std of (1, 0, 0, 0) is 1/2
    assert torch.equal(adv, L.group_normalized_advantages(raw, 4, 1e-6, True)[0])
    batch_std = torch.cat([centred, torch.zeros(4)]).std()  # over all 8 scores
    adv, _ = L.compute_advantages(raw, 4, "grpo", "batch", 1e-6)
    close(adv[:4], centred / (batch_std + 1e-6))
    adv, _ = L.compute_advantages(raw, 4, "rloo", "none", 1e-6)
    close(adv[:4], centred * 4 / 3)
    # keep: a dropped group is zeroed before the batch std, as a flat one is
    varied = T([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])  # group 1 varies
    adv, _ = L.compute_advantages(varied, 4, "grpo", "batch", 1e-6, keep=[True, False])
    close(adv, torch.cat([centred / (batch_std + 1e-6), torch.zeros(4)]))
    all_kept, _ = L.compute_advantages(varied, 4, "grpo", "batch", 1e-6, keep=[True, True])
    assert torch.equal(all_kept, L.compute_advantages(varied, 4, "grpo", "batch", 1e-6)[0])
    bad = [
        (dict(keep=[True]), "one per group"),
        (dict(estimator="ppo"), "unknown advantage"),
        (dict(adv_std="global"), "unknown adv_std"),
        (dict(passk_k=4), "passk needs 1 <= k < group_size"),
        (dict(passk_k=0), "passk needs 1 <= k < group_size"),
    ]
    for change, msg in bad:
        kw = dict(estimator="passk", adv_std="group", advantage_eps=1e-6, passk_k=2)
        kw.update(change)
        with pytest.raises(ValueError, match=msg):
            L.compute_advantages(raw, 4, **kw)
    with pytest.raises(ValueError, match="rloo needs group_size >= 2"):
        L.compute_advantages(raw, 1, "rloo", "none", 1e-6)


@pytest.mark.parametrize("name,k", [("grpo", 1), ("rloo", 1), ("passk", 2), ("passk", 3)])
def test_each_estimator_gradient_in_expectation(name, k):
    """Gradient level, exactly: a one-token policy over 3 answers (rewards 0, 0.5, 1), every one
    of the 3^4 groups of G = 4 enumerated. E[sum_i A_i grad log pi(y_i)] (adv_std none) is
    (G - 1) grad E[r] for grpo, G grad E[r] for rloo (unbiased), and (G - k) / k grad E[max of k
    rewards] for passk (the pass@k objective; k = 1 would be E[r])."""
    import itertools

    G = 4
    reward = T([0.0, 0.5, 1.0], dtype=torch.float64)
    theta = T([0.3, -0.2, 0.1], dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(theta, 0)  # (3,)
    surrogate = 0.0
    for group in itertools.product(range(3), repeat=G):
        y = torch.tensor(group)
        p = logp[y].sum().exp().detach()  # the group's probability
        adv, _ = L.compute_advantages(reward[y].float(), G, name, "none", 1e-6, k)
        surrogate = surrogate + p * (adv.double() * logp[y]).sum()
    (estimate,) = torch.autograd.grad(surrogate, theta)
    logp = torch.log_softmax(theta, 0)  # a fresh graph
    objective = 0.0
    for draw in itertools.product(range(3), repeat=k):
        y = torch.tensor(draw)
        objective = objective + logp[y].sum().exp() * reward[y].max()
    (exact,) = torch.autograd.grad(objective, theta)
    factor = {"grpo": G - 1, "rloo": G, "passk": (G - k) / k}[name]
    close(estimate, factor * exact, tol=1e-6)


# ----------------------------------------------------------------------------- cispo, entropy
def test_cispo_gradient_by_hand():
    """CISPO's gradient on log pi is -clip(r, 1 - eps, 1 + eps_high) A / n per token: a clipped
    token keeps a (clipped) gradient where GRPO-Clip's is 0."""
    lp = torch.log(T([[1.5, 0.5, 1.0, 1.1]])).requires_grad_()  # old = 0: r = 1.5, 0.5, 1, 1.1
    old = torch.zeros(1, 4)
    mask = T([[1, 1, 1, 1]])
    a = T([2.0])
    settings = L.LossSettings(loss="cispo", cliprange=0.2, cliprange_high=0.3)
    loss, meta = L.grpo_microbatch_loss(lp, mask, a, None, settings, old_log_probs=old)
    loss.backward()
    close(lp.grad, [[-1.3 * 2 / 4, -0.8 * 2 / 4, -1.0 * 2 / 4, -1.1 * 2 / 4]])
    close(meta["clip_fraction"], 0.5)
    clip = L.LossSettings(loss="grpo_clip", cliprange=0.2, cliprange_high=0.3)
    lp.grad = None
    L.grpo_microbatch_loss(lp, mask, a, None, clip, old_log_probs=old)[0].backward()
    close(lp.grad, [[0.0, -0.5 * 2 / 4, -1.0 * 2 / 4, -1.1 * 2 / 4]])  # r 1.5 clipped: 0


def _toy_policy(seed=0):
    """logits (2, 3, 5) with grad, labels, a mask and the log-probs / entropies they give."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, 5, (2, 3), generator=gen)
    lp = torch.log_softmax(z, -1).gather(-1, labels[..., None]).squeeze(-1)  # (2, 3)
    ent = L.compute_entropy(z)  # (2, 3)
    return z, lp, ent


def test_entropy_coef_adds_the_entropy_gradient():
    """entropy_coef c: the gradient is the plain loss's minus c x the gradient of the entropy's
    masked mean (per sequence, as the loss reduces)."""
    mask = T([[1, 1, 0], [1, 1, 1]])
    adv = T([1.0, -0.5], dtype=torch.float64)
    grads = {}
    for c in (0.0, 0.1):
        z, lp, ent = _toy_policy()
        settings = L.LossSettings(loss="reinforce_with_baseline", entropy_coef=c)
        loss, _ = L.grpo_microbatch_loss(lp, mask, adv, None, settings, token_entropy=ent)
        loss.backward()
        grads[c] = z.grad
    z, _, ent = _toy_policy()
    L.masked_mean_per_sequence(ent, mask).backward()
    close(grads[0.1], grads[0.0] - 0.1 * z.grad, tol=1e-9)
    with pytest.raises(ValueError, match="requires token_entropy"):
        settings = L.LossSettings(loss="reinforce_with_baseline", entropy_coef=0.1)
        L.grpo_microbatch_loss(lp, mask, adv, None, settings)


def test_top_entropy_mask_by_hand_and_at_the_gradient():
    """The top ceil(q n) entropies of the response tokens (ties with the lowest kept); with the
    mask, only those tokens' log-probs get the policy gradient, each the same as without it (the
    normaliser keeps every token), and the KL still reaches every token."""
    ent = T([[0.1, 0.9, 0.5, 7.0], [0.7, 0.2, 0.3, 0.5]])
    mask = T([[1, 1, 1, 0], [1, 1, 1, 1]])  # 7.0 is padding
    want = [[False, True, True, False], [True, False, False, True]]  # 0.9, 0.7, 0.5, 0.5
    assert L.top_entropy_mask(ent, mask, 3 / 7).tolist() == want  # ceil(3) plus the tie
    assert L.top_entropy_mask(ent, mask, 1.0).tolist() == mask.bool().tolist()
    assert L.top_entropy_mask(ent, mask, 0.2).sum() == 2  # ceil(1.4), not 1 or 3
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        L.top_entropy_mask(ent, mask, 0.0)
    lp = torch.log(T([[0.5, 0.4, 0.3, 0.2], [0.6, 0.7, 0.8, 0.9]])).requires_grad_()
    adv = T([1.0, -2.0])
    keep = L.top_entropy_mask(ent, mask, 3 / 7)
    settings = L.LossSettings(loss="reinforce_with_baseline", kl_beta=0.5)
    ref = torch.zeros(2, 4)
    grads = []
    for m in (None, keep):
        lp.grad = None
        kw = dict(ref_log_probs=ref, entropy_mask=m)
        L.grpo_microbatch_loss(lp, mask, adv, None, settings, **kw)[0].backward()
        grads.append(lp.grad.clone())
    lp.grad = None
    kl = L.LossSettings(loss="reinforce_with_baseline", kl_beta=0.5)
    L.grpo_microbatch_loss(lp, mask, adv * 0, None, kl, ref_log_probs=ref)[0].backward()
    kl_grad = lp.grad.clone()
    close(grads[1], torch.where(keep, grads[0], kl_grad))
