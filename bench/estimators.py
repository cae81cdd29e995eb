"""The estimator lab: every policy-gradient estimator and loss of losses.py measured against the
EXACT gradient of its objective, on a toy policy small enough to enumerate.

The toy. 3 prompts x; a response is up to 4 tokens from {0, 1, 2, END}: it stops at END (which
counts as a token) or is truncated at 4 tokens, so there are 121 responses per prompt and their
lengths vary (1-4). The policy is autoregressive: a logits table theta[x, t, s] (V = 4 logits) for
prompt x, position t and s = the sum of the digits so far mod 3 (144 parameters). The reward is
verifiable and binary: 1 if the response ends with END and its digits sum to x mod 3, else 0.

The exact gradients, by enumerating all 363 (prompt, response) pairs and autograd:
- the expected reward J = mean over x of E_y[r(x, y)] (every estimator but passk);
- the pass@k objective mean over x of 1 - (1 - p_x)^k, p_x = E_y[r(x, y)] (passk, k from its
  --passk-k; its cells need G > k, at G = k its advantages are all 0).

The estimators (ESTIMATORS): REINFORCE (raw reward), RLOO, the seeds' GRPO (group std, clipped
ratio, 1/L per token) and it without the std or the clip, Dr. GRPO, DAPO's token norm and
clip-higher, GSPO, CISPO and pass@k, each the grpo.py command line that trains it, resolved by
grpo.parse_args: its advantages and loss settings are what grpo.py would compute.

The estimates are OUR code: each seed samples one batch (3 prompts x G responses, the G of a prompt
consecutive, as grpo.py lays them out), losses.compute_advantages computes its advantages and
losses.grpo_microbatch_loss its loss with grpo.loss_settings(args), and autograd takes the loss's
gradient in theta (torch.func.vmap runs the seeds at once; the estimate is minus that gradient).
Two behaviour policies: on-policy (the samples come from pi = pi_old) and stale (the samples and
pi_old come from the policy one normalised ascent step before pi, so the ratios pi / pi_old differ
from 1 and the ratio losses differ from REINFORCE). The seeds of a (policy, G) pair share their
samples across estimators, so the rows of the table differ by the estimator alone.

Per cell (estimator, G, behaviour policy), over S seeds with estimates e_s, their mean m and the
exact gradient g:
- cosine(m, g); scale = <m, g> / |g|^2 (1 for an unbiased estimator; std normalisation and length
  norms multiply it); rel_err = |m - g| / |g| (bias, scale included);
- variance = mean_s |e_s - m|^2 / |g|^2, and variance_at_scale_1 = variance / scale^2 (the noise of
  the estimator rescaled to g's size: what an lr tuned for it sees);
- noise_floor = sqrt(variance / S): the rel_err an UNBIASED estimator with this variance shows at S
  seeds (E|m - g|^2 = tr Cov / S); a rel_err well above it is bias, not noise.

Prints one JSON line per cell, then one line with the config and the run time; draws
docs/estimators.png.

  python bench/estimators.py                  # all estimators, G in 2,4,8,16, 10000 seeds a cell
  python bench/estimators.py --quick          # 5 estimators, G 4 and 8, seconds (the test's)
  python bench/estimators.py --groups 2,4 --estimators reinforce,grpo --seeds 20000
"""

import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402
from torch.func import grad, vmap  # noqa: E402

import common  # noqa: E402
import grpo  # noqa: E402
import losses  # noqa: E402

N_PROMPTS = 3  # prompt x asks for digits summing to x mod 3
DIGITS = 3  # tokens 0, 1, 2
END = 3  # the end token
VOCAB = 4
MAX_LEN = 4  # tokens per response, END included
CLIPRANGE = 0.2  # grpo.py's default --cliprange (ratio_stats' band)
# the lab's masked_normalize divides by 1, the sequence's sum (REINFORCE's own scale); grpo.py's
# default --normalize-constant, --max-tokens, only divides the same gradient by a number
SUM = "--length-norm masked_normalize --normalize-constant 1"

# name -> the grpo.py flags that train it, resolved by grpo.parse_args: the advantages are
# losses.compute_advantages of those args (as grpo.advantages calls it), the loss settings
# grpo.loss_settings(args). --advantage passk is measured against the pass@k objective, the others
# against the expected reward.
ESTIMATORS = {
    "reinforce": f"--loss no_baseline {SUM}",
    "rloo": f"--advantage rloo --adv-std none {SUM}",  # Ahmadian et al. 2024
    "grpo": "--loss grpo_clip",  # the seeds' GRPO
    "grpo_no_std": "--loss grpo_clip --adv-std none",
    "grpo_no_clip": "--loss grpo_no_clip",  # seed 001's unclipped ratio
    "dr_grpo": f"--loss grpo_clip --adv-std none {SUM}",  # Liu et al. 2025
    "dapo": "--loss grpo_clip --length-norm token --cliprange-high 0.28",  # Yu et al. 2025
    "gspo": "--loss gspo",  # Zheng et al. 2025, grpo.py's default clip range
    # MiniMax-M1 2025: the step's tokens, no lower bound on the ratio, upper 1.28
    "cispo": "--loss cispo --length-norm token --cliprange 1 --cliprange-high 0.28",
    # Chen et al. 2025's pass@k advantages
    "passk": f"--advantage passk --passk-k 2 --adv-std none {SUM}",
}
POLICY_TITLES = {"on_policy": "on-policy", "stale": "stale sampler"}
# the figure: a marker per estimator, so lines that coincide (on-policy every ratio is 1) show
MARKERS = ["o", "s", "^", "v", "D", "x", "+", "*", "<", ">", "P", "h"]
QUICK_ESTIMATORS = ["reinforce", "rloo", "dr_grpo", "grpo", "passk"]


def parse(argv=None):
    p = common.Parser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--estimators",
        default=",".join(ESTIMATORS),
        help=f"comma list of estimators to measure, from {', '.join(ESTIMATORS)}",
    )
    p.add_argument("--groups", type=common.int_list, default=[2, 4, 8, 16], help="group sizes G")
    p.add_argument(
        "--seeds",
        type=common.positive_int,
        default=10000,
        help="batches (seeds) per cell, each 3 prompts x G responses",
    )
    p.add_argument(
        "--stale-step",
        type=common.nonneg_float,
        default=1.0,
        help="the stale behaviour policy is this far (L2, in theta) behind pi, one normalised "
        "ascent step on the expected reward",
    )
    p.add_argument("--seed", type=common.nonneg_int, default=3, help="seed of theta and samples")
    p.add_argument(
        "--figure",
        default=os.path.join(ROOT, "docs", "estimators.png"),
        help="where to draw the figure ('' for none)",
    )
    p.add_argument("--threads", type=common.positive_int, default=1, help="torch threads")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"test size: {', '.join(QUICK_ESTIMATORS)}, G 4 and 8, 2000 seeds, no figure",
    )
    a = p.parse_args(argv)
    resolve(a)
    return a


def resolve(a):
    """The --quick sizes, and one-line errors for a bad list."""
    if a.quick:
        a.estimators = ",".join(QUICK_ESTIMATORS)
        a.groups = [4, 8]
        a.seeds = 2000
        a.figure = ""
    unknown = [e for e in a.estimators.split(",") if e not in ESTIMATORS]
    common.check(not unknown, f"--estimators: unknown {unknown}; choose from {list(ESTIMATORS)}")
    common.check(min(a.groups) >= 2, "--groups: each G must be >= 2 (a group needs a baseline)")


# ----------------------------------------------------------------------------- the toy policy
def enumerate_responses():
    """Every response: tokens (R, T) (0 past the end), mask (R, T), state (R, T) = the digit sum
    mod 3 before each token, and reward (N_PROMPTS, R)."""
    rows = [[]]
    done = []
    while rows:
        r = rows.pop()
        done.append(r + [END])  # stop here
        if len(r) + 1 == MAX_LEN:
            for d in range(DIGITS):
                done.append(r + [d])  # truncated
        else:
            for d in range(DIGITS):
                rows.append(r + [d])
    done.sort(key=lambda r: (len(r), r))
    R = len(done)
    tokens = torch.zeros(R, MAX_LEN, dtype=torch.long)  # (R, T)
    mask = torch.zeros(R, MAX_LEN, dtype=torch.bool)  # (R, T)
    state = torch.zeros(R, MAX_LEN, dtype=torch.long)  # (R, T)
    reward = torch.zeros(N_PROMPTS, R)  # (P, R)
    for i, r in enumerate(done):
        tokens[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
        total = 0
        for t, tok in enumerate(r):
            state[i, t] = total % 3
            if tok != END:
                total += tok
        if r[-1] == END:
            reward[total % 3, i] = 1.0
    return {"tokens": tokens, "mask": mask, "state": state, "reward": reward}


def token_log_probs(theta, prompt, tokens, state, mask):
    """log pi(token_t | prompt, t, state_t) per token, 0 past the end: theta (P, T, 3, V), prompt
    (...) or broadcastable, tokens/state/mask (..., T) -> (..., T)."""
    log_p = torch.log_softmax(theta, dim=-1)  # (P, T, 3, V)
    pos = torch.arange(MAX_LEN)  # (T,)
    lp = log_p[prompt[..., None], pos, state, tokens]  # (..., T)
    return torch.where(mask, lp, 0.0)


def response_probs(theta, toy):
    """pi(y | x) for every prompt and response: (P, R)."""
    prompt = torch.arange(N_PROMPTS)[:, None]  # (P, 1)
    lp = token_log_probs(theta, prompt, toy["tokens"], toy["state"], toy["mask"])  # (P, R, T)
    return lp.sum(-1).exp()


def exact_gradient(theta, toy, objective, k):
    """The gradient in theta (flattened, (D,)) of the expected reward or the pass@k objective,
    by enumeration."""
    theta = theta.detach().requires_grad_(True)
    p = (response_probs(theta, toy) * toy["reward"]).sum(-1)  # (P,) success probability
    if objective == "passk":
        value = (1 - (1 - p) ** k).mean()
    else:
        value = p.mean()
    (g,) = torch.autograd.grad(value, theta)
    return g.reshape(-1)


def objective_of(args):
    """The objective an estimator's resolved grpo.py args estimate the gradient of, and its k:
    ("passk", k) for --advantage passk, else ("reward", 1)."""
    if args.advantage == "passk":
        return "passk", args.passk_k
    return "reward", 1


def policies(toy, seed, stale_step):
    """theta (pi, at which the gradients are taken) and theta_old (the stale behaviour policy, one
    ascent step of L2 length stale_step before theta)."""
    gen = torch.Generator().manual_seed(seed)
    theta_old = torch.randn(N_PROMPTS, MAX_LEN, 3, VOCAB, generator=gen)  # (P, T, 3, V)
    g = exact_gradient(theta_old, toy, "reward", 1).reshape(theta_old.shape)
    theta = theta_old + stale_step * g / g.norm()
    return theta, theta_old


# ----------------------------------------------------------------------------- the estimates
def sample_batches(toy, theta_behaviour, G, seeds, gen):
    """seeds batches of N_PROMPTS x G responses from theta_behaviour, each prompt's G rows
    consecutive: response index (S, B), prompt (B,), B = N_PROMPTS x G."""
    probs = response_probs(theta_behaviour, toy)  # (P, R)
    idx = torch.multinomial(probs, seeds * G, replacement=True, generator=gen)  # (P, S * G)
    idx = idx.view(N_PROMPTS, seeds, G).permute(1, 0, 2).reshape(seeds, N_PROMPTS * G)  # (S, B)
    prompt = torch.arange(N_PROMPTS).repeat_interleave(G)  # (B,)
    return idx, prompt


def advantages(args, raw, G):
    """The advantages grpo.advantages computes for rewards raw (S, B): groups are G consecutive
    rows, so all seeds go through at once (no estimator here normalises by the batch). (S, B)."""
    flat = raw.reshape(-1)  # (S * B,)
    adv, _ = losses.compute_advantages(
        flat, G, args.advantage, args.adv_std, args.advantage_eps, args.passk_k or 1
    )
    return adv.view(raw.shape)


def estimates(args, theta, theta_old, toy, idx, prompt, G):
    """One estimate per seed of the objective's gradient: (S, D) and the mean clip fraction."""
    settings = grpo.loss_settings(args)
    tokens = toy["tokens"][idx]  # (S, B, T)
    state = toy["state"][idx]  # (S, B, T)
    mask = toy["mask"][idx]  # (S, B, T)
    raw = toy["reward"][prompt, idx]  # (S, B)
    adv = advantages(args, raw, G)  # (S, B)
    old = token_log_probs(theta_old, prompt, tokens, state, mask)  # (S, B, T)

    def loss_of(th, tok, st, m, a, r, o):  # one seed's batch: (B, T) each, a and r (B,)
        lp = token_log_probs(th, prompt, tok, st, m)  # (B, T)
        loss, meta = losses.grpo_microbatch_loss(lp, m, a, r, settings, old_log_probs=o)
        clip = meta.get("clip_fraction", torch.zeros(()))
        return loss, clip

    per_seed = vmap(grad(loss_of, has_aux=True), in_dims=(None, 0, 0, 0, 0, 0, 0))
    g, clip = per_seed(theta, tokens, state, mask, adv, raw, old)  # (S, P, T, 3, V), (S,)
    return -g.reshape(len(idx), -1), clip.mean().item()


def cell_stats(est, exact):
    """Bias and variance of estimates est (S, D) against the exact gradient (D,), and the scale
    of each prompt's block of parameters alone (std normalisation weighs prompts apart)."""
    est = est.double()
    exact = exact.double()
    m = est.mean(0)  # (D,)
    g2 = exact.dot(exact)
    m_x = m.view(N_PROMPTS, -1)  # (P, D / P), theta's rows are the prompts'
    g_x = exact.view(N_PROMPTS, -1)  # (P, D / P)
    scale_x = (m_x * g_x).sum(-1) / (g_x * g_x).sum(-1)  # (P,)
    scale = (m.dot(exact) / g2).item()
    variance = ((est - m) ** 2).sum(-1).mean() / g2
    out = {
        "cosine": (m.dot(exact) / (m.norm() * exact.norm()).clamp(min=1e-30)).item(),
        "rel_err": ((m - exact).norm() / exact.norm()).item(),
        "scale": scale,
        "variance": variance.item(),
        "variance_at_scale_1": variance.item() / max(scale**2, 1e-30),
        "noise_floor": math.sqrt(variance.item() / len(est)),
    }
    out = {key: round(v, 5) for key, v in out.items()}
    out["scale_by_prompt"] = [round(v, 4) for v in scale_x.tolist()]
    return out


def ratio_stats(theta, theta_old, toy, idx, prompt):
    """How far pi is from the stale behaviour policy on its samples: the mean |log ratio| per token
    and the fraction of tokens outside [1 - clip, 1 + clip]."""
    tokens = toy["tokens"][idx]
    state = toy["state"][idx]
    mask = toy["mask"][idx]
    new = token_log_probs(theta, prompt, tokens, state, mask)
    old = token_log_probs(theta_old, prompt, tokens, state, mask)
    log_ratio = (new - old)[mask]
    outside = (log_ratio.exp() - 1).abs() > CLIPRANGE
    return {
        "mean_abs_log_ratio": round(log_ratio.abs().mean().item(), 4),
        "outside_clip_frac": round(outside.float().mean().item(), 4),
    }


def run(a, emit=print):
    """Every cell's stats (emit(json line) as each is done) and the config; returns (rows,
    config)."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    toy = enumerate_responses()
    theta, theta_old = policies(toy, a.seed, a.stale_step)
    names = a.estimators.split(",")
    flags = {name: grpo.parse_args(ESTIMATORS[name].split()) for name in names}
    objectives = {name: objective_of(args) for name, args in flags.items()}
    exact = {}  # (objective, k) -> its exact gradient (D,)
    for objective, k in objectives.values():
        exact[(objective, k)] = exact_gradient(theta, toy, objective, k)
    rows = []
    behaviours = {"on_policy": theta, "stale": theta_old}
    config = {"ratios": {}}
    for policy, theta_b in behaviours.items():
        for G in a.groups:
            gen = torch.Generator().manual_seed(a.seed * 1000 + G)
            idx, prompt = sample_batches(toy, theta_b, G, a.seeds, gen)
            if policy == "stale":
                config["ratios"][f"G{G}"] = ratio_stats(theta, theta_old, toy, idx, prompt)
            for name in names:
                objective, k = objectives[name]
                if objective == "passk" and G <= k:
                    continue  # passk needs G > k (at G = k every advantage is 0)
                est, clip = estimates(flags[name], theta, theta_b, toy, idx, prompt, G)
                row = {"estimator": name, "policy": policy, "G": G, "seeds": a.seeds}
                row.update(cell_stats(est, exact[(objective, k)]))
                row["clip_fraction"] = round(clip, 4)
                rows.append(row)
                emit(json.dumps(row))
    probs = response_probs(theta, toy)
    config.update(
        {
            "responses_per_prompt": toy["tokens"].shape[0],
            "parameters": theta.numel(),
            "success_prob": [round(p, 4) for p in (probs * toy["reward"]).sum(-1).tolist()],
            "mean_len": round((probs * toy["mask"].sum(-1)).sum(-1).mean().item(), 3),
            "stale_step": a.stale_step,
            "flags": {name: ESTIMATORS[name] for name in names},
            "objectives": objectives,
            "threads": torch.get_num_threads(),
            "load_avg_1m": os.getloadavg()[0],
            "time_s": round(time.perf_counter() - t0, 1),
            "cpu_s": round(time.process_time() - c0, 1),
        }
    )
    return rows, config


# ----------------------------------------------------------------------------- the figure
def draw(rows, path):
    """docs/estimators.png: cosine, scale and variance at scale 1 against G, one row of panels per
    behaviour policy, one line per estimator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("cosine", "cosine(mean estimate, exact)", "linear"),
        ("scale", "scale <m, g> / |g|^2", "linear"),
        ("variance_at_scale_1", "variance at scale 1", "log"),
    ]
    policies_run = list(dict.fromkeys(r["policy"] for r in rows))  # on_policy, stale
    names = list(dict.fromkeys(r["estimator"] for r in rows))
    fig, axes = plt.subplots(
        len(policies_run), len(panels), figsize=(13, 3.6 * len(policies_run)), squeeze=False
    )
    for i, policy in enumerate(policies_run):
        for j, (key, title, yscale) in enumerate(panels):
            ax = axes[i, j]
            for n, name in enumerate(names):
                cells = [r for r in rows if r["policy"] == policy and r["estimator"] == name]
                xs = [r["G"] for r in cells]
                ys = [r[key] for r in cells]
                marker = MARKERS[n % len(MARKERS)]
                ax.plot(xs, ys, marker=marker, markersize=5, fillstyle="none", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale(yscale)
            ax.set_xlabel("group size G")
            ax.set_title(f"{POLICY_TITLES[policy]}: {title}", fontsize=10)
            ax.grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def main():
    a = parse()
    torch.set_num_threads(a.threads)
    rows, config = run(a)
    print(json.dumps({"config": config}))
    if a.figure:
        draw(rows, a.figure)


if __name__ == "__main__":
    main()
