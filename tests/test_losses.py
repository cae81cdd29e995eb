"""losses.py: hand-computed cases for every function and option, float64 gradchecks, and the
chunked log-prob path checked against the naive full-vocab computation on the tiny HF model."""

import copy
import math
import os

import pytest
import torch

import losses as L
from conftest import ROOT

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
    """Seed 000 §7.2 worked example (floats: an int tensor cannot require grad; the seed's
    `constant_normalizer=` keyword is this module's `normalize_constant`)."""
    ratio = torch.ones(2, 7, requires_grad=True)
    advs = torch.full((2, 7), 2.0)
    masks = T([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    max_gen_len = 7
    masked_mean_result = L.masked_mean(ratio * advs, masks, dim=1)
    masked_normalize_result = L.masked_normalize(
        ratio * advs, masks, dim=1, normalize_constant=max_gen_len
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

    def boom(r, gt):
        raise AssertionError("reward_fn must not run when reward_dicts is given")

    reward_dicts = [fn(r, g) for r, g in zip(resp, gts)]
    adv2, raw2, _ = L.compute_group_normalized_rewards(
        boom, resp, gts, 2, 1e-6, False, reward_dicts=reward_dicts
    )
    close(adv2, adv)
    close(raw2, raw)
    # eight equal 0.1 rewards: the float32 mean != 0.1, yet the advantages must be exactly 0
    # (no random Adam step)
    flat = [{"reward": 0.1}] * 8
    adv, _, meta = L.compute_group_normalized_rewards(
        None, ["r"] * 8, ["x"] * 8, 8, 1e-6, True, reward_dicts=flat
    )
    assert torch.equal(adv, torch.zeros(8))
    assert meta["frac_groups_zero_std"] == 1.0
    with pytest.raises(ValueError, match="does not divide"):
        L.compute_group_normalized_rewards(fn, resp[:3], gts[:3], 2, 1e-6, True)
    with pytest.raises(ValueError, match="ground truths"):
        L.compute_group_normalized_rewards(fn, resp, gts[:3], 2, 1e-6, True)


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
    loss, _ = L.compute_grpo_clip_loss(a, lp, old, 0.2, cliprange_high=0.4)  # DAPO clip-higher
    close(loss, [[-1.4, -0.5, -1.0], [1.5, 0.8, 1.0]])
    loss, meta = L.compute_policy_gradient_loss(lp, "grpo_no_clip", advantages=a, old_log_probs=old)
    close(loss, [[-1.5, -0.5, -1.0], [1.5, 0.5, 1.0]])
    # GSPO: s = exp(mean of the log-ratio over response tokens), clipped per sequence, broadcast
    # to the tokens
    lp = T([[0.2, 0.4, 9.0], [-0.1, -0.1, 0.0]])
    mask = T([[1, 1, 0], [1, 1, 1]])
    loss, meta = L.compute_policy_gradient_loss(
        lp, "gspo", advantages=a, old_log_probs=torch.zeros(2, 3), cliprange=0.2, response_mask=mask
    )
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
        ("grpo_clip", {"advantages": torch.ones(2, 1)}, "old_log_probs"),
        (
            "grpo_clip",
            {"advantages": torch.ones(2, 1), "old_log_probs": torch.zeros(2, 3)},
            "cliprange",
        ),
        ("grpo_no_clip", {"advantages": torch.ones(2, 1)}, "old_log_probs"),
        (
            "gspo",
            {"advantages": torch.ones(2, 1), "old_log_probs": torch.zeros(2, 3), "cliprange": 0.2},
            "response_mask",
        ),
    ],
)
def test_policy_gradient_loss_missing_args(loss_type, kwargs, missing):
    with pytest.raises(ValueError, match=f"requires {missing}"):
        L.compute_policy_gradient_loss(torch.zeros(2, 3), loss_type, **kwargs)


def test_shape_and_option_errors():
    lp = torch.zeros(2, 3, requires_grad=True)
    m = torch.ones(2, 3)
    with pytest.raises(ValueError, match="unknown loss_type"):
        L.compute_policy_gradient_loss(lp, "ppo")
    with pytest.raises(ValueError, match="advantages has shape"):
        L.compute_policy_gradient_loss(lp, "reinforce_with_baseline", advantages=torch.ones(3, 1))
    with pytest.raises(ValueError, match="old_log_probs has shape"):
        L.compute_grpo_clip_loss(torch.ones(2, 1), lp, torch.zeros(2, 4), 0.2)

    def step(mask=m, **kw):
        return L.grpo_microbatch_train_step(
            lp, mask, 1, "no_baseline", raw_rewards=torch.ones(2, 1), **kw
        )

    with pytest.raises(ValueError, match="unknown length_norm"):
        step(length_norm="sum")
    with pytest.raises(ValueError, match="requires normalize_constant"):
        step(length_norm="masked_normalize")
    with pytest.raises(ValueError, match="requires ref_log_probs"):
        step(kl_beta=0.1)
    with pytest.raises(ValueError, match="response_mask has shape"):
        step(mask=torch.ones(2, 4))


@pytest.mark.parametrize(
    "length_norm,const,g0,g1",
    [
        ("masked_mean", None, -1 / 8, 2 / 4),  # -A_b / (B * n_b * gas), n = (2, 1)
        ("masked_normalize", 4.0, -1 / 16, 2 / 16),  # -A_b / (B * c * gas)
        ("token", None, -1 / 6, 2 / 6),  # -A_b / (n_total * gas)
    ],
)
def test_grpo_microbatch_train_step_length_norms(length_norm, const, g0, g1):
    lp = T([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    mask = T([[1, 1, 0], [1, 0, 0]])
    adv = T([[1.0], [-2.0]])
    loss, meta = L.grpo_microbatch_train_step(
        lp,
        mask,
        2,
        "reinforce_with_baseline",
        advantages=adv,
        length_norm=length_norm,
        normalize_constant=const,
    )
    close(lp.grad, [[g0, g0, 0.0], [g1, 0.0, 0.0]])
    close(loss, (lp.grad * lp.detach()).sum())  # the loss is linear in log-probs here
    assert meta["num_response_tokens"] == 3


def test_grpo_microbatch_train_step_clip_kl_and_empty_rows():
    lp = torch.log(T([[1.5, 0.5, 1.0], [1.0, 1.0, 1.0]])).requires_grad_()
    old = torch.zeros(2, 3)
    ref = torch.zeros(2, 3)
    mask = T([[1, 1, 1], [0, 0, 0]])  # row 1 empty
    loss, meta = L.grpo_microbatch_train_step(
        lp,
        mask,
        1,
        "grpo_clip",
        advantages=T([1.0, 1.0]),
        old_log_probs=old,
        cliprange=0.2,
        ref_log_probs=ref,
        kl_beta=0.5,
        kl_estimator="k1",
    )
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
    loss, meta = L.grpo_microbatch_train_step(
        lp,
        mask,
        1,
        "grpo_clip",
        advantages=T([1.0, 1.0]),
        old_log_probs=old,
        cliprange=0.2,
        ref_log_probs=far,
        kl_beta=0.0,
    )
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
        return L.compute_grpo_clip_loss(adv, x, old, 0.2, cliprange_high=0.3)[0]

    def grpo_no_clip(x):
        return L.compute_policy_gradient_loss(x, "grpo_no_clip", advantages=adv, old_log_probs=old)[
            0
        ]

    def gspo(x):
        return L.compute_policy_gradient_loss(
            x, "gspo", advantages=adv, old_log_probs=old, cliprange=0.2, response_mask=mask
        )[0]

    def mean_rows(x):
        return L.masked_mean(x, mask, dim=1)

    def normalize_columns(x):
        return L.masked_normalize(x, mask, 3.0, dim=0)

    functions = [naive, grpo_clip, grpo_no_clip, gspo, mean_rows, normalize_columns]
    functions.append(L.compute_entropy)
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
    """DAPO: with normalize_constant = N_step, every response token's log-prob gets the gradient
    -A_i / N_step, whatever microbatch it sits in (two microbatches of 3 and 9 tokens,
    N_step = 12)."""
    a1 = T([[1.5]])
    a2 = T([[-0.5], [2.0]])
    lp1 = torch.zeros(1, 5, requires_grad=True)
    m1 = T([[1, 1, 1, 0, 0]])  # 3 tokens
    lp2 = torch.zeros(2, 5, requires_grad=True)
    m2 = T([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])  # 9 tokens
    for lp, m, a in [(lp1, m1, a1), (lp2, m2, a2)]:
        L.grpo_microbatch_train_step(
            lp,
            m,
            2,
            "reinforce_with_baseline",
            advantages=a,
            length_norm="token",
            normalize_constant=12,
        )
    close(lp1.grad, -a1 / 12 * m1)
    close(lp2.grad, -a2 / 12 * m2)


def test_loss_table_owns_every_fact():
    assert L.RATIO_LOSSES == ("grpo_clip", "grpo_no_clip", "gspo")
    assert set(L.LOSS_TYPES) == set(L.LOSSES)
    lp = torch.log(T([[1.5, 0.5]]))
    old = torch.zeros(1, 2)
    a = T([1.0])
    close(
        L.compute_policy_gradient_loss(lp, "grpo_no_clip", advantages=a, old_log_probs=old)[0],
        L.compute_grpo_no_clip_loss(a, lp, old)[0],
    )
    mask = T([[1, 1]])
    close(
        L.compute_policy_gradient_loss(
            lp, "gspo", advantages=a, old_log_probs=old, cliprange=0.2, response_mask=mask
        )[0],
        L.compute_gspo_loss(a, lp, old, mask, 0.2)[0],
    )
    loss, _ = L.grpo_microbatch_loss(
        lp.clone().requires_grad_(),
        mask,
        1,
        "grpo_clip",
        advantages=a,
        old_log_probs=old,
        cliprange=0.2,
    )
    assert loss.requires_grad  # pure: no backward happened, the caller owns it


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
        got, _ = L.grpo_microbatch_loss(
            lp,
            m,
            4,
            "reinforce_with_baseline",
            advantages=adv,
            length_norm=norm,
            normalize_constant=6,
        )
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
    L.grpo_microbatch_train_step(
        lp,
        mask,
        1,
        "reinforce_with_baseline",
        advantages=T([1.0, 1.0]),
        length_norm="token",
        normalize_constant=5,
        is_weights=w.requires_grad_(),
    )
    close(lp.grad[mask], -w.detach()[mask] / 5)


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
    L.grpo_microbatch_train_step(
        lp,
        mask,
        1,
        "reinforce_with_baseline",
        advantages=T([1.0]),
        length_norm="token",
        normalize_constant=3,
        is_weights=w,
    )
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
