"""Kissing number (seed 001 §7): exact verifier, sandboxed evaluator, baselines, LLM search.

Find C ⊂ Z^d, 0 ∉ C, with min_{x≠y} ‖x−y‖ ≥ max_x ‖x‖; then τ_d ≥ |C| (d = 11 by default).

Subcommands:
- `verify FILE`: exact check of a JSON / .npy list of vectors.
- `evaluate PROG.py`: run an untrusted program in a sandbox, verify its `points` here.
- `construct`: non-LLM baselines, the binary-code construction reaching 582 and a norm-shell
  local search.
- `search`: the seed's agentic loop (refine / best-of-n / evolve) with an OpenAI-compatible server
  or a local model through rollout.py; every prompt, response, program and metric goes to
  conversation_log.json.

Departures from the seed: the metrics are exact integers; zero, duplicate and non-integer vectors
and sets over --mem-mb are rejected outright; an invalid set makes `verify` / `evaluate` exit 1.

  python kissing.py construct --method code --out c582.json && python kissing.py verify c582.json
  OPENAI_API_KEY=... python kissing.py search --llm openai:https://host/v1 --model Qwen/Qwen3-32B
  python kissing.py search --llm local:models/countdown-tiny --mode best-of-n --iters 8
"""

import argparse
import itertools
import json
import math
import os
import random
import re
import sys
import time
import urllib.request

# tiny matrices: BLAS threads only add contention (shared CPUs)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from common import (
    Parser,
    attempt,
    check,
    check_hub_ids,
    check_model_dir,
    existing_file,
    fail,
    nonneg_float,
    output_file,
    positive_float,
    positive_int,
    thread_count,
)
from data import load_prompt, write_json_atomic  # noqa: E402
from hardware import set_threads  # noqa: E402
from runs import (  # noqa: E402
    claim_run_dir,
    finish_then_interrupt,
    stop_exit_code,
    stop_name,
    stop_on_sigterm,
)
from sandbox import (  # noqa: E402
    MAX_OUTPUT_BYTES,
    exit_reason,
    run_sandboxed,
    sandbox_missing,
)

# ----------------------------------------------------------------------------- exact verifier
# Exactness bounds. With L = max|coordinate|, every squared distance is ≤ 4·d·L², so the int64 Gram
# path is exact when 4·d·L² < 2^63 (d = 11: L ≤ 4.5e8); its Gram goes through float64 BLAS when
# d·L² ≤ 2^53 (partial sums are integers below 2^53, hence exact). For L < 2^62 (e.g. the ~43-bit
# published 593) we screen all pairs in float64 and recheck every pair that could matter exactly,
# with 21-bit limbs in int64; larger coordinates are refused.
LIMB = 21  # bits per limb
MASK = (1 << 21) - 1
# peak memory per (point, point) pair in the worst case (a tight cluster: every pair rechecked in
# limbs)
BYTES_PER_PAIR = 80


def _coordinate_problem(c):
    """What is wrong with one coordinate ("non-number", "non-finite", "non-integer"), or ""."""
    if isinstance(c, bool) or not isinstance(c, (int, float)):
        return "non-number"
    if not math.isfinite(c):
        return "non-finite"
    if isinstance(c, float) and (not c.is_integer() or abs(c) > 2**53):
        return "non-integer"
    return ""


def parse_points(obj, dim, max_points=None):
    """JSON-ish object -> list of int tuples.

    Raises ValueError naming the first bad vector, or the count when it exceeds max_points
    (checked first: the pair check's memory grows with the square of the count).
    """
    if isinstance(obj, dict):
        obj = obj.get("points")
    sized = max_points is not None and (isinstance(obj, (list, tuple)) or getattr(obj, "ndim", 0))
    if sized and len(obj) > max_points:
        raise ValueError(
            f"{len(obj)} vectors; checking more than {max_points} needs more than --mem-mb "
            f"allows (raise it)"
        )
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    if not isinstance(obj, (list, tuple)) or not obj:
        raise ValueError('expected a non-empty list of vectors (or {"points": [...]})')
    pts = []
    for v in obj:
        if isinstance(v, (list, tuple)):
            pts.append(tuple(v))
        else:
            pts.append(())  # not a vector: refused by the length check below
    for i, v in enumerate(pts):
        if len(v) != dim:
            raise ValueError(
                f"vector {i} is not a list of {dim} numbers (use --dim to change the dimension)"
            )
    kinds = set(map(type, itertools.chain.from_iterable(pts)))
    if kinds - {int}:  # the slow path: floats, bools, strings...
        for i, v in enumerate(pts):
            for c in v:
                why = _coordinate_problem(c)
                if why:
                    raise ValueError(f"vector {i} has a {why} coordinate {c!r}")
            pts[i] = tuple(int(c) for c in v)
    if len(set(pts)) < len(pts) or (0,) * dim in pts:
        seen = {}  # vector -> its first index
        for i, p in enumerate(pts):
            if not any(p):
                raise ValueError(f"vector {i} is the zero vector")
            if p in seen:
                raise ValueError(f"vectors {seen[p]} and {i} are duplicates")
            seen[p] = i
    return pts


def _limb_sq_dists(X, rows, cols):
    """Exact ‖X[rows]−X[cols]‖² for |X| < 2^62, as 5 base-2^21 digits (P, 5); digits 0..3 are in
    [0, 2^21)."""
    diff = X[rows] - X[cols]  # (P, d), exact: |diff| < 2^63
    # diff = d2·B² + d1·B + d0
    d0 = diff & MASK
    d1 = (diff >> LIMB) & MASK
    d2 = diff >> (2 * LIMB)
    c = np.stack(
        [
            (d0 * d0).sum(1),
            (2 * d0 * d1).sum(1),
            (d1 * d1 + 2 * d0 * d2).sum(1),
            (2 * d1 * d2).sum(1),
            (d2 * d2).sum(1),
        ],
        axis=1,
    )  # (P, 5), each < 3·d·2^42
    # carry propagation; >> is floor division, so the low digits end up in [0, B)
    for k in range(4):
        c[:, k + 1] += c[:, k] >> LIMB
        c[:, k] &= MASK
    return c


def _stats_numpy(P, path):
    """(max squared norm, min squared distance, closest pair, violations, contacts) of P (n ≥ 2),
    exactly, on the "int64" or the "limb" path."""
    n = len(P)
    d = len(P[0])
    X = np.array(P, dtype=np.int64)  # (n, d)
    Xf = np.array(P, dtype=np.float64)  # (n, d)
    G = Xf @ Xf.T  # (n, n) Gram, exact in float64 when d·L² ≤ 2^53
    if path == "int64":
        if d * int(np.abs(X).max()) ** 2 <= 2**53:
            G = G.astype(np.int64)
        else:
            G = X @ X.T
        nrm = np.diag(G).copy()
        D = nrm[:, None] + nrm[None, :] - 2 * G  # (n, n) exact squared distances
        M = int(nrm.max())
        # the diagonal is 0 < M
        viol = int((D < M).sum() - n) // 2
        contacts = int((D == M).sum()) // 2
        np.fill_diagonal(D, np.iinfo(np.int64).max)
        i, j = divmod(int(np.argmin(D)), n)  # the first minimum in row-major order has i < j
        return M, int(D[i, j]), (i, j), viol, contacts
    # The limb path: the float screen decides every pair farther than tol from M; the pairs within
    # tol of M or of the minimum are recomputed exactly. tol ≥ the float error of D (entries ≤ 4M,
    # γ_(d+3) rounding).
    M = max(sum(c * c for c in p) for p in P)
    nf = np.diag(G).copy()
    Df = nf[:, None] + nf[None, :] - 2 * G  # (n, n) approximate squared distances
    up = np.triu(np.ones((n, n), bool), 1)  # (n, n) pairs i < j
    tol = 8 * (d + 8) * 2.0**-53 * float(M) + 1.0
    near = up & (np.abs(Df - float(M)) <= tol)
    rows, cols = np.nonzero(near | (up & (Df <= Df[up].min() + 2 * tol)))  # row-major: i < j
    chunks = []
    for k in range(0, len(rows), 2**16):
        chunks.append(_limb_sq_dists(X, rows[k : k + 2**16], cols[k : k + 2**16]))
    c = np.concatenate(chunks)  # (P, 5)
    digits = [(M >> (LIMB * k)) & MASK for k in range(4)] + [M >> (4 * LIMB)]
    m = np.array(digits, dtype=np.int64)  # M in the same 5 digits
    sign = np.zeros(len(rows), dtype=np.int64)
    for k in range(4, -1, -1):  # lexicographic compare, most significant digit first
        sign = np.where(sign == 0, np.sign(c[:, k] - m[k]), sign)
    # lexsort: the last key is the primary one, stable (ties keep the (i, j) order)
    k = int(np.lexsort(c.T)[0])
    near = near[rows, cols]
    sure = int((up & (Df < float(M) - tol)).sum())  # violations the float screen is sure of
    viol = sure + int(((sign < 0) & near).sum())  # plus the rechecked ones
    best = sum(int(c[k, t]) << (LIMB * t) for t in range(5))
    contacts = int(((sign == 0) & near).sum())
    return M, best, (int(rows[k]), int(cols[k])), viol, contacts


def verify(points, dim=11, path="auto", mem_mb=2048):
    """Exact check. Returns the metrics dict; bad input gives valid=False and the reason, never an
    exception. More than isqrt(mem_mb MiB / BYTES_PER_PAIR) points are refused before any pair is
    looked at."""
    if isinstance(points, (list, tuple, np.ndarray)):
        num_points = len(points)
    else:
        num_points = 0
    metric_keys = [
        "max_sq_norm",
        "min_sq_dist",
        "closest_pair",
        "margin",
        "num_violations",
        "contacts",
    ]
    out = dict(
        num_points=num_points,
        dimension=dim,
        valid=False,
        path=None,
        **dict.fromkeys(metric_keys),
    )
    try:
        P = parse_points(points, dim, math.isqrt((mem_mb << 20) // BYTES_PER_PAIR))
    except ValueError as e:
        return dict(out, message=f"invalid input: {e}")
    L = max(max(map(abs, p)) for p in P)
    exact = {"int64": 4 * dim * L * L < 2**63, "limb": L < 2**62}
    if path == "auto":
        path = next((p for p in exact if exact[p]), "limb")
    if not exact[path]:
        return dict(
            out,
            message=f"invalid input: path {path} is not exact for coordinates up to {L} "
            f"(limb: < 2^62)",
        )
    if len(P) == 1:
        M = sum(c * c for c in P[0])
        best = None
        pair = None
        viol = 0
        contacts = 0
    else:
        M, best, pair, viol, contacts = _stats_numpy(P, path)
    valid = best is None or best >= M
    if best is None:
        margin = None
    else:
        margin = best - M
    out.update(
        num_points=len(P),
        valid=valid,
        max_sq_norm=M,
        min_sq_dist=best,
        closest_pair=pair and list(pair),
        margin=margin,
        num_violations=viol,
        contacts=contacts,
        path=path,
    )
    if valid:
        out["message"] = (
            f"valid: {len(P)} points, min squared distance {best} >= max squared norm {M}"
        )
    else:
        out["message"] = (
            f"Minimum squared distance {best} < maximum squared norm {M} "
            f"(pair {pair[0]}, {pair[1]}: {list(P[pair[0]])} and {list(P[pair[1]])}; "
            f"{viol} violating pairs)"
        )
    return out


# ----------------------------------------------------------------------------- sandboxed evaluator
# kissing's epilogue to sandbox.HOOK: run the program, send json(points) down the channel `out`.
POINTS = r"""
ns = runpy.run_path(prog, run_name="__main__")
pts = ns.get("points", ns.get("get_points"))
pts = pts() if callable(pts) else pts
assert pts is not None, "program defines no `points` (nor get_points())"
if hasattr(pts, "tolist"):
    pts = pts.tolist()
else:
    pts = [v.tolist() if hasattr(v, "tolist") else list(v) for v in pts]
out.write(json.dumps(pts, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
out.close()
"""


def evaluate_program(
    source, dim=11, timeout=30.0, mem_mb=2048, fsize_mb=64, keep_points=False, sandbox="bwrap"
):
    """Run untrusted program text in the sandbox (sandbox.py) and verify its points here within
    the same mem_mb; never raises. sandbox: bwrap (fails closed: without bubblewrap nothing runs)
    | none (rlimits and the audit hook only, on purpose)."""
    missing = sandbox_missing("--sandbox")
    isolated = sandbox != "none" and missing is None
    t0 = time.time()
    res = {
        "validity": 0.0,
        "score": 0,
        "reason": "",
        "stdout_tail": "",
        "stderr_tail": "",
        "sandbox": "bwrap" if isolated else "none",
    }
    if sandbox != "none" and not isolated:
        return dict(res, reason=f"could not start the sandbox: {missing}")
    try:
        run, raw = run_sandboxed(source, timeout, mem_mb, fsize_mb, isolated, POINTS)
    except OSError as err:
        return dict(res, reason=f"could not start the sandbox: {err}")
    timed_out = run.pop("timed_out")
    res.update(run, time_s=round(time.time() - t0, 3))
    if timed_out:
        res["reason"] = f"timeout after {timeout:g} s"
    elif run["returncode"] != 0:
        res["reason"] = exit_reason(run["returncode"], res["stderr_tail"])
    elif len(raw) > MAX_OUTPUT_BYTES:
        res["reason"] = (
            f"output over {MAX_OUTPUT_BYTES} bytes: the points as JSON must fit in that "
            f"(sandbox.MAX_OUTPUT_BYTES)"
        )
    else:
        try:
            pts = json.loads(raw)
        except (ValueError, RecursionError) as e:
            res["reason"] = f"malformed output: {str(e)[:200]}"
    if res["reason"]:
        return res
    m = verify(pts, dim, mem_mb=mem_mb)
    res.update(m)
    res["validity"] = float(m["valid"])
    if m["valid"]:
        res["score"] = m["num_points"]
        res["reason"] = ""
        if keep_points:
            res["points"] = pts
    else:
        res["score"] = 0
        res["reason"] = m["message"]
    return res


# --------------------------------------------------------------------------- non-LLM constructions
def weight4_code(n, seed=0, max_steps=1_000_000, restart=30_000):
    """4-subsets of range(n) pairwise meeting in ≤ 2 points (a constant-weight code, weight 4,
    distance 4: no triple covered twice), by swap local search: add a random block clashing with
    ≤ 1 block (evicting it), restart every `restart` steps. Finds the optima 14, 18, 30, 35, 51 for
    n = 8..12 (n = 11: < 0.2 s)."""
    rng = random.Random(seed)
    blocks = list(itertools.combinations(range(n), 4))
    best = []
    # the Johnson bound A(n,4,4), or the optimum (n = 12)
    bound = {12: 51}.get(n, n * ((n - 1) * ((n - 2) // 2) // 3) // 4)
    if blocks:
        steps = max_steps
    else:
        steps = 0  # n < 4: no block at all
    for step in range(steps):
        if step % restart == 0:  # a stuck run rarely recovers: restart from empty
            owner = {}  # covered triple -> its block; the code is set(owner.values())
        b = rng.choice(blocks)
        clash = {owner[t] for t in itertools.combinations(b, 3) if t in owner}
        if b in clash or len(clash) > 1:
            continue
        # evict the (at most one) clashing block
        owner = {t: o for t, o in owner.items() if o not in clash}
        owner.update((t, b) for t in itertools.combinations(b, 3))
        if len(set(owner.values())) > len(best):
            best = sorted(set(owner.values()))
            if len(best) >= bound:
                break
    return best


def construct_code(dim, seed=0):
    """±2e_i (2d vectors) plus all 16 sign patterns (±1) on each block of a weight-4 code.

    Every vector has norm² 4; two patterns on one block differ by 2 somewhere (dist² ≥ 4), blocks
    meeting in ≤ 2 points give dist² ≥ 8 − 2·2 = 4, and ±2e_i vs a pattern gives ≥ 1 + 3.
    22 + 16·35 = 582 in 11-D.
    """
    points = []
    for i in range(dim):
        for s in (1, -1):
            v = [0] * dim
            v[i] = s * 2
            points.append(tuple(v))
    for block in weight4_code(dim, seed):
        for signs in itertools.product((1, -1), repeat=4):
            sign_of = dict(zip(block, signs))
            points.append(tuple(sign_of.get(k, 0) for k in range(dim)))
    return points


def shell_vectors(dim, norm, cap=20000):
    """The vectors of squared norm `norm` in Z^dim, lexicographic, depth first without recursion.

    ValueError past `cap` vectors or 20·cap search steps (a huge or a sparse shell): the cost
    follows the cap, not the shell.
    """
    out = []
    stack = [((), norm)]  # (prefix, squared norm left for the other coordinates)
    steps = 0
    # 2^53: the float64 clash test is exact
    while stack and len(out) <= cap and steps <= 20 * cap and norm < 2**53:
        prefix, m = stack.pop()
        r = math.isqrt(m)
        if len(prefix) == dim - 1:  # the last coordinate: ±r if m is a square
            if r:
                last = (-r, r)
            else:
                last = (0,)
            for c in last:
                if c * c == m:
                    out.append(prefix + (c,))
        else:
            steps += 2 * r + 1
            if steps <= 20 * cap:
                # popped from -r up
                stack += [(prefix + (c,), m - c * c) for c in range(r, -r - 1, -1)]
    if len(out) > cap or steps > 20 * cap or norm >= 2**53:
        raise ValueError(
            f"the shell of squared norm {norm} in {dim} dimensions is too large to list (over "
            f"{cap} vectors, {20 * cap} search steps or 2^53); pick a smaller --norm"
        )
    return out


def construct_shell_search(dim, norm=4, seconds=10.0, seed=0, p_force=0.05, tabu_len=1000):
    """Max independent set on one norm shell (x, y clash iff ‖x−y‖² < norm ⇔ 2·x·y > norm).

    Add a random non-member clashing with ≤ 1 member (evicting it), or with 2 with probability
    p_force; evicted vectors are tabu for tabu_len steps. `seconds` is CPU time; 11-D norm 4 (5302
    vectors), 10 s: 550–582 by seed.
    """
    V = np.array(shell_vectors(dim, norm), dtype=np.int64)  # (m, dim), m ≤ 20000
    # exact: |x·y| ≤ norm < 2^53; row blocks keep the temporaries at (1024, m)
    Vf = V.astype(np.float64)
    blocks = [2 * (Vf[i : i + 1024] @ Vf.T) > norm for i in range(0, len(V), 1024)]
    adj = np.concatenate(blocks)  # (m, m) clash matrix
    rng = np.random.default_rng(seed)
    member = np.zeros(len(V), bool)
    tabu = np.zeros(len(V), np.int64)  # the step until which a vector stays out
    best = member.copy()
    t0 = time.process_time()
    step = 0
    while time.process_time() - t0 < seconds:
        for v in rng.integers(0, len(V), 2000):
            step += 1
            if member[v] or tabu[v] > step:
                continue
            clash = np.flatnonzero(adj[v] & member)
            if len(clash) > 2 or (len(clash) == 2 and rng.random() >= p_force):
                continue
            member[clash] = False
            tabu[clash] = step + tabu_len
            member[v] = True
            if len(clash) == 0 and member.sum() > best.sum():
                best = member.copy()
    return [tuple(int(c) for c in v) for v in V[best]]


# ----------------------------------------------------------------------------- LLM search
def prompt(name, **fields):
    """prompts/kissing_<name>.prompt (seed 001 §7.4's texts; ours for crash/evolve), with its
    {field}s filled by str.replace."""
    text = load_prompt(f"kissing_{name}")
    for k, v in fields.items():
        text = text.replace("{" + k + "}", str(v))
    return text


STARTER = (
    "# starter: the 2*d unit vectors +-e_i (valid, tiny)\n"
    "d = {dim}\n"
    "points = [[s if k == i else 0 for k in range(d)] for i in range(d) for s in (1, -1)]\n"
)


def feedback(metrics):
    """The verifier's answer to one program, as the next user message."""
    if metrics["validity"] == 1.0:
        return prompt("ok", score=metrics["score"])
    if metrics.get("num_violations"):
        return prompt("fail", error=metrics["reason"].split(" (pair")[0])
    return prompt("crash", error=metrics["reason"][:500])


def extract_program(text, parent=None):
    """The last ```python block; else SEARCH/REPLACE edits applied to `parent`; else the raw
    text."""
    text = re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.S)
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", text, flags=re.S)
    edits = re.findall(r"<<<<<<< SEARCH\n(.*?)\n=======\n(.*?)\n>>>>>>> REPLACE", text, flags=re.S)
    if blocks:
        return blocks[-1]
    if parent is None or not edits:
        return text
    for old, new in edits:
        parent = parent.replace(old, new, 1)
    return parent


def openai_chat(base_url, model, messages, temperature, max_tokens, seed, timeout=600, retries=3):
    """Stdlib client for POST {base_url}/chat/completions -> (text, prompt_tokens,
    completion_tokens).

    A failed call (no server, 5xx/408/429, garbage) is retried; `retries` failed calls in a row
    (at least one call is made) stop the search. Another 4xx is an empty reply.
    """
    calls = max(1, retries)
    request = dict(
        model=model,
        messages=messages,
        temperature=temperature,
        max_tokens=max_tokens,
        seed=seed,
    )
    body = json.dumps(request).encode()
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'none')}",
    }
    for i in range(calls):
        try:
            req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", body, headers)
            with urllib.request.urlopen(req, timeout=timeout) as r:
                data = json.loads(r.read())
            usage = data.get("usage") or {}
            text = str(data["choices"][0]["message"]["content"] or "")
            return text, usage.get("prompt_tokens"), usage.get("completion_tokens")
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            # no server: URLError, an OSError; a refusal or a server error: HTTPError, one too
            error = f"{type(e).__name__}: {str(e)[:200]}"
            refused = (
                isinstance(e, urllib.error.HTTPError)
                and 400 <= e.code < 500
                and e.code not in (408, 429)
            )
            if refused:
                # this request refused (e.g. longer than the server's context): no program, go on
                return "", None, None
            if i < calls - 1:
                time.sleep(2**i)
    fail(
        f"--llm openai:{base_url}: {calls} calls failed in a row, the last: {error} "
        f"(--resume continues the log)"
    )


def make_backend(args):
    """Returns chat(messages, seed) -> (text, prompt_tokens, completion_tokens)."""
    kind, _, target = args.llm.partition(":")
    if kind == "openai":
        url = target or os.environ.get("OPENAI_BASE_URL", "")
        model = args.model or os.environ.get("OPENAI_MODEL", "")
        check(
            url and model,
            "--llm openai:URL needs a base URL (or $OPENAI_BASE_URL) and --model "
            "(or $OPENAI_MODEL)",
        )

        check(
            args.threads is None,
            "--threads sets the torch threads of a local:MODEL engine; --llm openai runs no model",
        )

        def remote_chat(msgs, seed):
            return openai_chat(url, model, msgs, args.temperature, args.max_tokens, seed)

        return remote_chat
    check(
        kind == "local" and target,
        f"--llm must be openai:URL or local:MODEL_PATH, got {args.llm!r}",
    )
    import rollout  # lazily: pulls in torch / vLLM

    check(
        args.engine in rollout.ENGINES,
        f"--engine {args.engine}: use one of {', '.join(rollout.ENGINES)}",
    )
    check_model_dir(target, "--llm local:")  # before the model loads; a hub id: cached or served
    check_hub_ids()
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    positions = getattr(AutoConfig.from_pretrained(target), "max_position_embeddings", 10**9)
    ctx = min(args.max_model_len, positions)
    # room for the prompt (the tiny test model has 1024 positions)
    max_new = min(args.max_tokens, ctx // 2)
    engine_kwargs = {}
    if args.engine == "vllm":
        engine_kwargs = {"max_model_len": ctx, "enforce_eager": args.eager}
    set_threads(args.threads)  # before the engine starts
    rollout.engine_log(os.path.join(args.out_dir, "engine.log"))  # console: real problems only
    llm = rollout.init_engine(args.engine, target, args.device, args.seed, **engine_kwargs)

    def chat(msgs, seed):
        if tok.chat_template:
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        else:
            turns = [f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs]
            text = "".join(turns) + "Assistant:"
        ids = tok(text)["input_ids"][-(ctx - max_new - 16) :]  # keep the tail if it does not fit
        outs = rollout.generate(
            llm, [tok.decode(ids)], n=1, temperature=args.temperature, max_tokens=max_new, seed=seed
        )
        out = outs[0][0]
        return out["text"], len(out["prompt_token_ids"]), len(out["token_ids"])

    return chat


def _load_log(args, log_path):
    """A new search log, or (--resume) the one in --out-dir; refuses to overwrite one otherwise."""
    log = {
        "task": f"kissing number, d={args.dim}",
        "args": vars(args),
        "entries": [],
        "best": {"iter": None, "score": 0},
    }
    if not os.path.exists(log_path):
        return log
    check(
        args.resume, f"{log_path} exists: pass --resume to continue it or choose another --out-dir"
    )
    try:
        with open(log_path) as f:
            log = json.load(f)
        check(
            log["args"]["mode"] == args.mode,
            f"{log_path} was made with --mode {log['args']['mode']}",
        )
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        fail(
            f"--resume: {log_path} is not a search log ({type(e).__name__}: {str(e)[:200]}); "
            f"fix or move it"
        )
    return log


def next_prompt(args, it, log, islands, base, rng):
    """The messages of call `it` by --mode, and for evolve the island it works on and the
    (score, program) it improves (else None, None)."""
    last = (log["entries"] or [None])[-1]
    if args.mode == "best-of-n" or (args.mode == "refine" and last is None):
        return [{"role": "user", "content": base}], None, None
    if args.mode == "refine":
        # the task, then the most recent exchanges with the verifier's feedback
        msgs = last["messages"] + [
            {"role": "assistant", "content": last["response"]},
            {"role": "user", "content": last["feedback"]},
        ]
        return msgs[:1] + msgs[1:][-2 * max(1, args.history) :], None, None
    # evolve: a parent (usually the island's best), the other islands' best, one random member
    island = it % args.islands
    if rng.random() < 0.7:
        parent = islands[island][0]
    else:
        parent = rng.choice(islands[island])
    others = [isl[0] for k, isl in enumerate(islands) if k != island]
    shown = [parent] + rng.sample(others, min(2, len(others)))
    shown = shown + [rng.choice(islands[island])]
    text = "\n\n".join(
        f"### Program (score {sc})\n```python\n{pr[: args.max_program_chars]}\n```"
        for sc, pr in shown
    )
    return [{"role": "user", "content": prompt("evolve", base=base, shown=text)}], island, parent


def search(args):
    """The LLM loop: --iters calls, each program verified and logged. Returns {best, entries,
    out_dir}. Ctrl-C or SIGTERM during a call drops it (--resume repeats it, same seed); during an
    evaluation, that evaluation is finished and logged first; then exit 130 / 143."""
    log_path = os.path.join(args.out_dir, "conversation_log.json")
    log = _load_log(args, log_path)
    # a file or not writable: refused before any model loads
    claim_run_dir(args.out_dir, flag="--out-dir")
    base = prompt("base", dim=args.dim)
    # evolve: each island's (score, program)s, best first
    islands = [[(0, STARTER.format(dim=args.dim))] for _ in range(args.islands)]

    def add(island, score, program):  # keep each island's best island_size programs
        ranked = sorted(islands[island] + [(score, program)], key=lambda p: -p[0])
        islands[island] = ranked[: args.island_size]

    for e in log["entries"]:  # resume: replay the log into the database
        if e["island"] is not None:
            add(e["island"], e["metrics"]["score"], e["program"])
    try:
        chat = make_backend(args)  # a stop while a local model loads: nothing to save yet
        for it in range(len(log["entries"]), args.iters):
            seed = args.seed * 1_000_003 + it
            # --- prompt
            msgs, island, parent = next_prompt(args, it, log, islands, base, random.Random(seed))
            # --- generate (a stop here loses only this call)
            t0 = time.time()
            response, ptok, ctok = chat(msgs, seed)
            # --- evaluate (our verifier, never the program's own claims) -> log; a first stop
            # waits for it (at most --timeout plus the exact check)
            with finish_then_interrupt(f"iteration {it}'s evaluation"):
                program = extract_program(response, parent[1] if parent else None)
                metrics = evaluate_program(
                    program,
                    args.dim,
                    args.timeout,
                    args.mem_mb,
                    keep_points=True,
                    sandbox=args.sandbox,
                )
                # kept out of the log; best_points.json holds the best
                points = metrics.pop("points", None)
                log["entries"].append(
                    {
                        "iter": it,
                        "mode": args.mode,
                        "seed": seed,
                        "island": island,
                        "messages": msgs,
                        "response": response,
                        "program": program,
                        "metrics": metrics,
                        "feedback": feedback(metrics),
                        "prompt_tokens": ptok,
                        "completion_tokens": ctok,
                        "time_s": round(time.time() - t0, 3),
                    }
                )
                if island is not None:
                    add(island, metrics["score"], program)
                if metrics["score"] > log["best"]["score"]:
                    log["best"] = {"iter": it, "score": metrics["score"]}
                    write_json_atomic(os.path.join(args.out_dir, "best_points.json"), points)
                    with open(os.path.join(args.out_dir, "program.py"), "w") as f:
                        f.write(program)
                write_json_atomic(log_path, log)
                print(
                    f"iter {it} | score {metrics['score']} | best {log['best']['score']} | "
                    f"tokens {ptok}/{ctok} | {metrics['reason'][:80] or 'valid'}",
                    flush=True,
                )
    except KeyboardInterrupt:
        print(
            f"\n{stop_name()}: stopped with {len(log['entries'])} iterations in {log_path} "
            f"(--resume continues it)",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(stop_exit_code()) from None
    return {"best": log["best"], "entries": len(log["entries"]), "out_dir": args.out_dir}


# ----------------------------------------------------------------------------- CLI
def parse_args(argv=None):
    """The subcommands verify, evaluate, construct and search, with their flags."""
    p = Parser(description=__doc__.split("\n")[0])
    dim = argparse.ArgumentParser(add_help=False)
    dim.add_argument("--dim", type=positive_int, default=11, help="dimension d of the vectors")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser(
        "verify",
        parents=[dim],
        help="exact check of a JSON / .npy configuration (exit 1 if invalid)",
    )
    v.add_argument("file", help='JSON list of vectors, {"points": [...]}, or .npy integer array')
    e = sub.add_parser(
        "evaluate",
        parents=[dim],
        help="run an untrusted program in the sandbox, verify its `points`",
    )
    e.add_argument(
        "program", type=existing_file, help="Python file defining `points` (or get_points())"
    )
    c = sub.add_parser(
        "construct", parents=[dim], help="non-LLM baselines that write a verified configuration"
    )
    c.add_argument(
        "--method",
        default="code",
        choices=["code", "shell-search"],
        help="code: 582 in 11-D; shell-search",
    )
    c.add_argument("--out", type=output_file, default=None, help="write the points here (JSON)")
    c.add_argument(
        "--norm", type=positive_int, default=4, help="shell-search: squared norm of the shell"
    )
    c.add_argument(
        "--seconds", type=positive_float, default=10.0, help="shell-search: CPU time budget (s)"
    )
    s = sub.add_parser(
        "search", parents=[dim], help="LLM-driven search (seed §7.4): refine, best-of-n or evolve"
    )
    # --- model and sampling
    s.add_argument(
        "--llm", required=True, help="openai:BASE_URL (key in $OPENAI_API_KEY) or local:MODEL_PATH"
    )
    s.add_argument("--model", default=None, help="model name for openai: (default $OPENAI_MODEL)")
    s.add_argument("--engine", default="vllm", help="local: a rollout.ENGINES kind (vllm, hf)")
    s.add_argument("--device", default="cpu", help="local: engine device (cpu, cuda, cuda:N)")
    s.add_argument(
        "--max-model-len",
        type=positive_int,
        default=8192,
        help="local: context length (capped by the model)",
    )
    s.add_argument(
        "--eager",
        action="store_true",
        help="local vllm: skip torch.compile (fast start, slower decode)",
    )
    s.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        help="local: torch CPU threads (default: torch's, one per core); 1 on a busy machine",
    )
    s.add_argument("--temperature", type=nonneg_float, default=0.8, help="sampling temperature")
    s.add_argument(
        "--max-tokens", type=positive_int, default=4096, help="max new tokens per response"
    )
    # --- loop
    s.add_argument(
        "--mode",
        default="refine",
        choices=["refine", "best-of-n", "evolve"],
        help="refine: one conversation fed the exact error; best-of-n: independent samples, the "
        "verifier picks; evolve: island program database, best + diverse parents, full or diff "
        "edits",
    )
    s.add_argument(
        "--iters", type=positive_int, default=20, help="total LLM calls (including resumed ones)"
    )
    s.add_argument(
        "--history",
        type=positive_int,
        default=4,
        help="refine: recent exchanges kept in the prompt",
    )
    s.add_argument("--islands", type=positive_int, default=3, help="evolve: number of islands")
    s.add_argument(
        "--island-size", type=positive_int, default=8, help="evolve: programs kept per island"
    )
    s.add_argument(
        "--max-program-chars",
        type=positive_int,
        default=6000,
        help="evolve: program text shown per parent",
    )
    s.add_argument(
        "--out-dir",
        default="runs/kissing",
        help="conversation_log.json, program.py, best_points.json",
    )
    s.add_argument("--resume", action="store_true", help="continue the log in --out-dir")
    for q in (c, s):
        q.add_argument(
            "--seed",
            type=int,
            default=0,
            help="seed (search: call i samples with seed*1000003 + i)",
        )
    # --- sandbox and verifier limits
    for q in (v, e, s):
        q.add_argument(
            "--mem-mb",
            type=positive_int,
            default=2048,
            help="memory limit (MiB), sandbox and verifier",
        )
    for q in (e, s):
        q.add_argument(
            "--timeout",
            type=positive_float,
            default=30.0,
            help="sandbox wall-clock limit per program (s)",
        )
        q.add_argument(
            "--sandbox",
            default="bwrap",
            choices=["bwrap", "none"],
            help="bwrap: bubblewrap, refused in one line where it does not run; none: rlimits and "
            "the audit hook alone, NOT isolated (reads and writes in C, unseen by the hook, reach "
            "the host): on purpose only",
        )
    return p.parse_args(argv)


def check_sandbox(mode):
    """--sandbox bwrap fails closed: without bubblewrap, one line before anything runs (a bwrap
    that is installed but cannot start fails each evaluation, naming why, in its result)."""
    missing = None
    if mode != "none":
        missing = sandbox_missing("--sandbox")
    check(missing is None, missing)


def main(argv=None):
    """Run one subcommand and print its result as one JSON line; returns it."""
    args = parse_args(argv)
    if args.cmd == "verify":
        try:
            with open(args.file, "rb") as f:
                if args.file.endswith(".npy"):
                    pts = np.load(f, allow_pickle=False)
                else:
                    pts = json.load(f)
            m = verify(pts, args.dim, mem_mb=args.mem_mb)
        except (OSError, ValueError, RecursionError) as err:  # RecursionError: absurdly nested JSON
            fail(f"cannot read {args.file}: {str(err)[:300]}")
    elif args.cmd == "evaluate":
        check_sandbox(args.sandbox)
        # existing_file checked it
        with open(args.program, encoding="utf-8", errors="replace") as f:
            source = f.read()
        m = evaluate_program(source, args.dim, args.timeout, args.mem_mb, sandbox=args.sandbox)
    elif args.cmd == "construct":
        t0 = time.time()
        check(
            args.dim <= 32,
            "construct works up to --dim 32 (the code search keeps all dim^4 / 24 blocks)",
        )
        if args.method == "code":
            found = attempt(construct_code, args.dim, args.seed)
        else:
            found = attempt(construct_shell_search, args.dim, args.norm, args.seconds, args.seed)
        pts = [list(x) for x in found]
        m = dict(verify(pts, args.dim), method=args.method, construct_s=round(time.time() - t0, 3))
        if args.out:
            write_json_atomic(args.out, pts)
    else:
        check_sandbox(args.sandbox)
        stop_on_sigterm()  # SIGTERM (a scheduler, `timeout`) stops the search as Ctrl-C does
        m = search(args)
    print(json.dumps(m))
    if args.cmd != "search" and not m.get("valid"):
        # an invalid set fails the command: `construct && verify` and scripts can rely on it
        sys.exit(1)
    return m


if __name__ == "__main__":
    main()
