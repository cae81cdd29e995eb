"""Replay ONE frozen rollout batch of the embedded model through grpo.py's objective menu and
compare what each objective does with it: the loss, the per-token gradient weight as a function of
the response length (the length bias), and the cosine between every pair of parameter gradients.
The objectives include the advantage estimators (rloo, REINFORCE++-baseline, pass@k), CISPO, the
exploration controls (an entropy bonus, the top-20% entropy tokens) and seed 003's reward shaping
(Kimi k1.5's length reward, DeepSeek-R1's language consistency: the frozen batch re-scored by
grpo.score with the flag, SHAPED). Prints one JSON object.

The off-policy situation is emulated honestly, the way grpo.py meets it: the batch is sampled by
the engine (mu = its sampled log-probs) at the initial weights theta_0; pi_old = the trainer's
no-grad log-probs at theta_0; then ONE grpo.train_step (the demo's reinforce_with_baseline, its lr
and AdamW) on this same batch gives theta_1, the policy of a second optimizer step on this batch
(--epochs-per-rollout-batch 2, or a second train batch). Every objective's loss and gradient are
taken at theta_1, so the ratios pi / pi_old are not all 1. Each objective is the grpo.py command
line that trains it (OBJECTIVES), resolved by grpo.parse_args: nothing is re-derived here.

The per-token weight w = -(d loss / d log pi_t) / A_i x N (N = responses in the step), for the
responses with a nonzero advantage: masked_mean reads 1/L (x ratio, x IS weight), Dr. GRPO's
masked_normalize 1/max_tokens, DAPO's token norm N / N_tokens = 1 / mean length.
length_exponent = the slope of log(row-mean w) on log L (-1 vs 0).

  python bench/objectives.py                # 64 responses (8 prompts x 8), <= 192 tokens, HF engine
  python bench/objectives.py --step-lr 0    # on-policy (pi = pi_old): ratio losses = REINFORCE
  python bench/objectives.py --engine vllm  # the batch from the vLLM CPU engine (a real mismatch)
  python bench/objectives.py --batch-file /tmp/objectives_batch.pt  # cache the batch (reused)
"""

import contextlib
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

import common  # noqa: E402
import data  # noqa: E402
import grpo  # noqa: E402
import losses  # noqa: E402
import rollout  # noqa: E402,F401  (sets vLLM's environment before anything imports vllm)

# name -> the grpo.py flags that train it (on top of the demo profile)
OBJECTIVES = {
    "grpo_clip": "--loss grpo_clip",
    "grpo_no_clip": "--loss grpo_no_clip",
    # Liu et al. 2025
    "dr_grpo": "--loss grpo_clip --no-std-norm --length-norm masked_normalize",
    # Yu et al. 2025
    "dapo": "--loss grpo_clip --length-norm token --cliprange-high 0.28",
    "gspo": "--loss gspo",  # grpo.py's default --cliprange 0.2
    # Zheng et al. 2025
    "gspo_paper_clip": "--loss gspo --cliprange 3e-4 --cliprange-high 4e-4",
    "reinforce_with_baseline": "--loss reinforce_with_baseline",
    "grpo_clip_tis": "--loss grpo_clip --rollout-is tis",  # Yao et al. 2025, cap 2
    "grpo_clip_tis_lag1": "--loss grpo_clip --rollout-is tis",  # grpo_ray.py async, 1 update stale
    # the advantage estimators, with the seeds' loss
    "rloo": "--loss reinforce_with_baseline --advantage rloo",  # Ahmadian et al. 2024
    "reinforce_pp_baseline": "--loss reinforce_with_baseline --adv-std batch",  # Hu et al. 2025
    "passk_4": "--loss reinforce_with_baseline --advantage passk --passk-k 4",  # Chen et al. 2025
    # MiniMax-M1's CISPO, its token-level reduction
    "cispo": "--loss cispo --length-norm token --cliprange-high 0.28",
    # exploration controls on grpo_clip
    "grpo_clip_entropy_bonus": "--loss grpo_clip --entropy-coef 0.01",
    "grpo_clip_top20_entropy": "--loss grpo_clip --entropy-top-quantile 0.2",  # Wang et al. 2025
    # reward shaping on grpo_clip (seed 003's lecture)
    "grpo_clip_kimi_length": "--loss grpo_clip --length-reward-weight 0.5",  # Kimi k1.5
    "grpo_clip_language": "--loss grpo_clip --language-reward-weight 0.5",  # DeepSeek-R1
}
# train_step(lag=1): pi_old = the current policy (theta_1), mu = the engine (theta_0)
LAGGED = {"grpo_clip_tis_lag1"}
# the batch re-scored (grpo.score) with the objective's shaping flags before its advantages
SHAPED = {"grpo_clip_kimi_length", "grpo_clip_language"}
BUCKETS = [1, 9, 17, 33, 65, 129, 257, 513]  # response-length bucket edges: [1, 8], [9, 16], ...


def parse():
    p = common.Parser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--engine",
        default="hf",
        choices=rollout.ENGINES,
        help="engine that samples the frozen batch",
    )
    p.add_argument(
        "--batch-file",
        default=None,
        help="load the frozen batch from here if it exists, else save it here",
    )
    p.add_argument(
        "--seed",
        type=common.nonneg_int,
        default=0,
        help="grpo.py --seed (which prompts, which samples)",
    )
    p.add_argument(
        "--step-lr",
        type=common.nonneg_float,
        default=None,
        help="lr of the emulated step (default the demo's; 0 = on-policy)",
    )
    p.add_argument(
        "--threads",
        type=common.positive_int,
        default=1,
        help="torch threads: the numbers do not depend on it; "
        "2 spin-wait behind other jobs on a shared box",
    )
    p.add_argument("--quick", action="store_true", help="smoke size: 2 prompts x 8, <= 64 tokens")
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p.parse_args()


def grpo_args(a, flags=""):
    """grpo.py's resolved args for this bench's engine, seed and size plus `flags`."""
    size = []
    if a.quick:
        size = ["--rollout-batch-size", "16", "--train-batch-size", "16", "--max-tokens", "64"]
    return grpo.parse_args(
        [
            "--engine",
            a.engine,
            "--seed",
            str(a.seed),
            "--grader-workers",
            "0",
            *size,
            *flags.split(),
        ]
    )


def frozen_batch(a, args, runtime, policy):
    """The scored rollout batch of step 0 and its rollout stats (grpo.collect), from --batch-file
    if it is there (made by the same engine, seed, size and batch layout)."""
    # layout 3: collect's batch (with its correctness) and its stats
    key = {"engine": a.engine, "seed": a.seed, "quick": a.quick, "layout": 3}
    if a.batch_file and os.path.exists(a.batch_file):
        saved = torch.load(a.batch_file, weights_only=False)
        common.check(
            saved["key"] == key,
            f"--batch-file {a.batch_file} holds a batch of {saved['key']}, not {key}: "
            f"delete it or name another file",
        )
        return saved["batch"], saved["stats"]
    train_rows, _ = grpo.load_data(args)
    engine = grpo.make_engine(args.model, args, runtime, policy)
    batch, stats = grpo.collect(engine, train_rows, args, 0)
    if a.batch_file:
        torch.save({"key": key, "batch": batch, "stats": stats}, a.batch_file)
    return batch, stats


def objective_loss(logp, entropy, old, batch, tensors, args):
    """The whole optimizer step's loss of one objective from log-probs and token entropies (N, T),
    as grpo._updates computes it with the step as a single microbatch (the sum over equal
    microbatches is the same; the step's entropy quantile is over the same tokens), on the
    advantages train_step's phase (grpo.advantages) gives with this objective's flags (none of them
    puts a KL in the reward). Returns (loss, meta, A (N,))."""
    no_kl = {"policy": old, "ref": None}
    adv, rewards, _ = grpo.advantages(batch, tensors, no_kl, args)  # (N,) each
    mask = tensors["loss_mask"]  # (N, T)
    weights = None  # rollout IS weights (N, T)
    if args.rollout_is != "none":
        weights, _ = losses.compute_rollout_is(
            old,
            tensors["engine_log_probs"],
            mask,
            args.rollout_is,
            args.rollout_is_cap,
            args.rollout_is_level,
            args.rollout_is_floor,
        )
    n_tok = max(int(mask.sum()), 1)  # the step's response tokens (DAPO's token norm)
    keep = None  # --entropy-top-quantile's tokens
    if args.entropy_top_quantile < 1:
        keep = losses.top_entropy_mask(entropy, mask, args.entropy_top_quantile)
    loss, meta = losses.grpo_microbatch_loss(
        logp,
        mask,
        adv,
        rewards,
        grpo.loss_settings(args),
        old_log_probs=old,
        is_weights=weights,
        gradient_accumulation_steps=1,
        step_tokens=n_tok,
        token_entropy=entropy,
        entropy_mask=keep,
    )
    return loss, meta, adv


def length_bias(g_tok, adv, mask):
    """The per-token weight w = -g / A x N by response-length bucket, and the slope of log w on
    log L."""
    N = len(adv)
    L = mask.sum(-1)  # (N,)
    rows = (adv.abs() > 1e-8) & (L > 0)  # (N,), the responses with a signal
    safe_adv = adv[:, None].where(rows[:, None], 1.0)  # (N, 1)
    w = torch.where(mask, -g_tok / safe_adv * N, 0.0)  # (N, T)
    row_w = w.sum(-1) / L.clamp(min=1)  # (N,) the mean over the response's tokens
    out = {}
    for lo, hi in zip(BUCKETS, BUCKETS[1:]):
        sel = rows & (L >= lo) & (L < hi)
        if sel.any():
            out[f"{lo}-{hi - 1}"] = {
                "responses": int(sel.sum()),
                "per_token_weight": round(row_w[sel].mean().item(), 6),
            }
    fit = rows & (row_w > 0)
    x = L[fit].double().log()
    y = row_w[fit].double().log()
    if fit.sum() < 2 or x.std() == 0:
        return out, None  # one length: no slope
    # the least-squares slope of y on x
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return out, round(float(slope), 3)


def flat_grads(policy, tensors, args, runtime, ban_ids, g_toks, g_ents):
    """The parameter gradient of each objective, flattened: the sum over the step's forwards of
    (d log pi / d theta)^T g_tok (+ (d H / d theta)^T g_ent). One forward per group (its prompt
    once with --shared-prefix), one backward per objective: the loss is a function of the log-probs
    and the entropies alone, so g_tok and g_ent (N, T) carry it (g_ent None: no entropy term)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    size = sum(p.numel() for p in params)
    out = [torch.zeros(size) for _ in g_toks]  # (D,) each
    N = tensors["labels"].shape[0]
    mbs = args.micro_train_batch_size
    for s in range(0, N, mbs):
        idx = torch.arange(s, min(s + mbs, N))
        for rows, mb, L, P in grpo.forward_passes(tensors, idx, runtime["shared_prefix"], "cpu"):
            scored = losses.get_response_log_probs(
                policy,
                **mb,
                return_token_entropy=True,
                temperature=args.temperature,
                ban_token_ids=ban_ids,
                prefix_len=P,
            )
            for k, g in enumerate(g_toks):
                last = k == len(g_toks) - 1
                outputs = [scored["log_probs"]]
                grad_outputs = [g[rows, :L]]
                if g_ents[k] is not None:
                    outputs.append(scored["token_entropy"])
                    grad_outputs.append(g_ents[k][rows, :L])
                gs = torch.autograd.grad(
                    outputs, params, grad_outputs, retain_graph=not last, allow_unused=True
                )
                flat = []
                for x, p in zip(gs, params):
                    if x is None:  # a parameter this forward does not use
                        x = torch.zeros_like(p)
                    flat.append(x.reshape(-1))
                out[k] += torch.cat(flat)
    return out


def run(a):
    t0 = time.perf_counter()
    c0 = time.process_time()
    times = {}  # phase -> wall seconds
    base = grpo_args(a)
    runtime = grpo.setup_runtime(base)
    torch.manual_seed(base.seed)
    policy, tokenizer = grpo.load_policy(base.model, base, runtime)
    batch, _ = frozen_batch(a, base, runtime, policy)
    tensors = grpo.collate(batch, base)
    ban_ids = batch["ban_token_ids"]
    times["rollout"] = time.perf_counter() - t0
    # theta_0: pi_old by the trainer's no-grad pass; then one real grpo.py update on this batch
    # gives theta_1
    old = grpo.batch_log_probs(policy, tensors, base, runtime, ban_ids)
    lr = base.lr
    if a.step_lr is not None:
        lr = a.step_lr
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    learner = {  # as grpo.build_learner's, without the frozen KL models
        "policy": policy,
        "tokenizer": tokenizer,
        "optimizer": opt,
        "ref_model": None,
        "prev_model": None,
    }
    (step,), _ = grpo.train_step(learner, batch, base, runtime, 0)
    cur = grpo.batch_log_probs(policy, tensors, base, runtime, ban_ids)
    cur_entropy = grpo.batch_log_probs(policy, tensors, base, runtime, ban_ids, entropy=True)
    times["emulated_step"] = time.perf_counter() - t0 - sum(times.values())
    mask = tensors["response_mask"]
    ratio = (cur - old).exp()[mask]
    _, is_m = losses.compute_rollout_is(old, tensors["engine_log_probs"], mask, "tis")
    lengths = mask.sum(-1)  # (N,)
    result = {
        "config": {
            "engine": base.engine,
            "prompts": base.n_prompts_per_rollout_batch,
            "group_size": base.group_size,
            "max_tokens": base.max_tokens,
            "temperature": base.temperature,
            "shared_prefix": runtime["shared_prefix"],
            "threads": torch.get_num_threads(),
            "load_avg_1m": os.getloadavg()[0],
            "emulated_step": f"grpo.train_step {base.loss}, lr {lr}, AdamW (0.9, 0.95), "
            "on this batch",
        },
        "batch": {
            "responses": len(batch["raw"]),
            "response_tokens": int(mask.sum()),
            "groups_with_signal": int((batch["raw"].view(-1, base.group_size).std(-1) > 0).sum()),
            "reward_mean": round(batch["raw"].mean().item(), 4),
            "response_len": {
                "min": int(lengths.min()),
                "mean": round(lengths.float().mean().item(), 1),
                "max": int(lengths.max()),
            },
        },
        "emulated_step": {"loss": step["train/loss"], "grad_norm": step["train/grad_norm"]},
        "ratio_pi_over_pi_old": {
            "mean": ratio.mean().item(),
            "min": ratio.min().item(),
            "max": ratio.max().item(),
            "outside_0.8_1.2": ((ratio - 1).abs() > 0.2).float().mean().item(),
        },
        "engine_mismatch": {k: v for k, v in is_m.items() if k != "is_dropped_frac"},
        "objectives": {},
    }
    names = list(OBJECTIVES)
    g_toks = []  # each objective's d loss / d log-probs, (N, T)
    g_ents = []  # and d loss / d token entropies, (N, T), or None
    for name in names:
        args = grpo_args(a, OBJECTIVES[name])
        logp = cur.clone().requires_grad_(True)
        entropy = cur_entropy.clone().requires_grad_(True)
        pi_old = old
        if name in LAGGED:
            pi_old = cur
        scored = batch
        if name in SHAPED:
            scored = grpo.score(dict(batch), args)  # a copy: the same responses, shaped rewards
        loss, meta, adv = objective_loss(logp, entropy, pi_old, scored, tensors, args)
        g_tok, g_ent = torch.autograd.grad(loss, (logp, entropy), allow_unused=True)
        buckets, slope = length_bias(g_tok, adv, mask)
        g_toks.append(g_tok)
        g_ents.append(g_ent)
        result["objectives"][name] = {
            "flags": OBJECTIVES[name],
            "loss": loss.item(),
            "reward_mean": scored["raw"].mean().item(),
            "clip_fraction": float(meta.get("clip_fraction", 0.0)),
            "length_exponent": slope,
            "per_token_weight_by_length": buckets,
        }
    grads = flat_grads(policy, tensors, base, runtime, ban_ids, g_toks, g_ents)
    G = torch.stack(grads).double()  # (K, D)
    norms = G.norm(dim=1)  # (K,)
    cos = (G @ G.t()) / (norms[:, None] * norms[None, :]).clamp(min=1e-30)  # (K, K)
    for name, n in zip(names, norms):
        result["objectives"][name]["grad_norm"] = n.item()
    result["grad_cosine"] = {}
    for i, x in enumerate(names):
        result["grad_cosine"][x] = {y: round(cos[i, j].item(), 4) for j, y in enumerate(names)}
    times["objectives"] = time.perf_counter() - t0 - sum(times.values())
    result["time_s"] = {k: round(v, 1) for k, v in times.items()}
    result["time_s"]["total"] = round(time.perf_counter() - t0, 1)
    result["time_s"]["cpu_total"] = round(time.process_time() - c0, 1)
    return result


def main():
    a = parse()
    torch.set_num_threads(a.threads)
    # grpo.py's progress lines go to stderr; stdout is the JSON alone
    with contextlib.redirect_stdout(sys.stderr):
        result = run(a)
    print(json.dumps(result, indent=1))
    if a.out:
        data.write_json_atomic(a.out, result)


if __name__ == "__main__":
    main()
