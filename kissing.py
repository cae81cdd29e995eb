"""Kissing-number challenge (seed 001 §7): exact verifier, sandboxed evaluator, baselines, LLM search.

Find C ⊂ Z^d, 0 ∉ C, with min_{x≠y} ‖x−y‖ ≥ max_x ‖x‖; then τ_d ≥ |C| (d = 11 by default).
Subcommands: `verify FILE` (exact check of a JSON / .npy list of vectors); `evaluate PROG.py` (run an
untrusted program in a sandboxed child, verify its `points` here); `construct` (non-LLM baselines: D_d roots,
the binary-code construction reaching 582, norm-shell local search, sphere optimisation + rounding);
`search` (the seed's agentic loop, refine / best-of-n / evolve, with an OpenAI-compatible server or a local
model through rollout.py; every prompt, response, program and metric goes to conversation_log.json).
Departures from the seed: exact integer metrics, zero / duplicate / non-integer vectors rejected outright.

  python kissing.py construct --method code --out c582.json && python kissing.py verify c582.json
  OPENAI_API_KEY=... python kissing.py search --llm openai:https://host/v1 --model Qwen/Qwen3-32B --mode refine
  python kissing.py search --llm local:models/countdown-tiny --mode best-of-n --iters 8
"""
import argparse, contextlib, itertools, json, math, os, random, re, resource, signal, subprocess, sys, tempfile
import time, urllib.request

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # tiny matrices: threads only add contention (shared CPUs)
import numpy as np  # noqa: E402

# ----------------------------------------------------------------------------- exact verifier
# Exactness bounds. With L = max|coordinate|, every squared distance is ≤ 4·d·L², so the int64 Gram path
# is exact when 4·d·L² < 2^63 (d = 11: L ≤ 4.5e8). The Gram itself goes through float64 BLAS when
# d·L² ≤ 2^53 (every partial sum is an integer below 2^53, hence exact). For L < 2^62 (e.g. the ~43-bit
# published 593) we screen all pairs in float64 and recheck every pair that could matter exactly with
# 21-bit limbs in int64; beyond that, plain Python ints.
LIMB, MASK = 21, (1 << 21) - 1


def parse_points(obj, dim):
    """JSON-ish object -> list of int tuples. Raises ValueError naming the first bad vector."""
    obj = obj.get("points") if isinstance(obj, dict) else obj.tolist() if isinstance(obj, np.ndarray) else obj
    if not isinstance(obj, (list, tuple)) or not obj:
        raise ValueError("expected a non-empty list of vectors (or {\"points\": [...]})")
    pts = [tuple(v) if isinstance(v, (list, tuple)) else () for v in obj]
    for i, v in enumerate(pts):
        if len(v) != dim:
            raise ValueError(f"vector {i} is not a list of {dim} numbers (use --dim to change the dimension)")
    if set(map(type, itertools.chain.from_iterable(pts))) - {int}:  # slow path: floats, bools, strings...
        for i, v in enumerate(pts):
            for c in v:
                why = ("non-number" if isinstance(c, bool) or not isinstance(c, (int, float)) else
                       "non-finite" if not math.isfinite(c) else
                       "non-integer" if isinstance(c, float) and (not c.is_integer() or abs(c) > 2 ** 53) else "")
                if why:
                    raise ValueError(f"vector {i} has a {why} coordinate {c!r}")
            pts[i] = tuple(int(c) for c in v)
    if len(set(pts)) < len(pts) or (0,) * dim in pts:
        seen = {}
        for i, p in enumerate(pts):
            if not any(p) or p in seen:
                raise ValueError(f"vector {i} is the zero vector" if not any(p) else f"vectors {seen[p]} and {i} are duplicates")
            seen[p] = i
    return pts


def _limb_sq_dists(X, I, J):
    """Exact ‖X[I]−X[J]‖² for |X| < 2^62 as 5 base-2^21 digits (P, 5), digits 0..3 in [0, 2^21)."""
    diff = X[I] - X[J]  # (P, d), exact: |diff| < 2^63
    d0, d1, d2 = diff & MASK, (diff >> LIMB) & MASK, diff >> (2 * LIMB)  # diff = d2·B² + d1·B + d0
    c = np.stack([(d0 * d0).sum(1), (2 * d0 * d1).sum(1), (d1 * d1 + 2 * d0 * d2).sum(1),
                  (2 * d1 * d2).sum(1), (d2 * d2).sum(1)], axis=1)  # (P, 5), each < 3·d·2^42
    for k in range(4):  # carry propagation; >> is floor division, so the low digits end up in [0, B)
        c[:, k + 1] += c[:, k] >> LIMB
        c[:, k] &= MASK
    return c


def _stats_python(P):  # reference path: Python ints over all pairs, any coordinate size
    M = max(sum(c * c for c in p) for p in P)
    D = [(sum((a - b) * (a - b) for a, b in zip(P[i], P[j])), (i, j)) for i, j in itertools.combinations(range(len(P)), 2)]
    best, pair = min(D, key=lambda t: t[0])  # min keeps the first of equal keys: (i, j) order
    return M, best, pair, sum(s < M for s, _ in D), sum(s == M for s, _ in D)


def _stats_numpy(P, path):
    n, d = len(P), len(P[0])
    X, Xf = np.array(P, dtype=np.int64), np.array(P, dtype=np.float64)  # (n, d)
    G = Xf @ Xf.T  # (n, n) Gram, exact in float64 when d·L² ≤ 2^53
    if path == "int64":
        G = G.astype(np.int64) if d * int(np.abs(X).max()) ** 2 <= 2 ** 53 else X @ X.T
        nrm = np.diag(G).copy()
        D = nrm[:, None] + nrm[None, :] - 2 * G  # (n, n) exact squared distances
        M = int(nrm.max())
        viol, contacts = int((D < M).sum() - n) // 2, int((D == M).sum()) // 2  # the diagonal is 0 < M
        np.fill_diagonal(D, np.iinfo(np.int64).max)
        i, j = divmod(int(np.argmin(D)), n)  # first minimum in row-major order has i < j
        return M, int(D[i, j]), (i, j), viol, contacts
    # limb path: the float screen decides every pair farther than tol from M; the pairs within tol of M or
    # of the minimum are recomputed exactly. tol ≥ the float error of D (entries ≤ 4M, γ_(d+3) rounding).
    M, nf = max(sum(c * c for c in p) for p in P), np.diag(G).copy()
    Df = nf[:, None] + nf[None, :] - 2 * G  # (n, n) approximate squared distances
    up, tol = np.triu(np.ones((n, n), bool), 1), 8 * (d + 8) * 2.0 ** -53 * float(M) + 1.0
    near = up & (np.abs(Df - float(M)) <= tol)
    I, J = np.nonzero(near | (up & (Df <= Df[up].min() + 2 * tol)))  # row-major: i < j order
    c = _limb_sq_dists(X, I, J)  # (P, 5)
    m = np.array([(M >> (LIMB * k)) & MASK for k in range(4)] + [M >> (4 * LIMB)], dtype=np.int64)
    sign = np.zeros(len(I), dtype=np.int64)
    for k in range(4, -1, -1):  # lexicographic compare, most significant digit first
        sign = np.where(sign == 0, np.sign(c[:, k] - m[k]), sign)
    k, near = int(np.lexsort(c.T)[0]), near[I, J]  # lexsort: last key primary, stable (ties keep (i, j) order)
    viol = int((up & (Df < float(M) - tol)).sum()) + int(((sign < 0) & near).sum())  # sure + rechecked
    best = sum(int(c[k, t]) << (LIMB * t) for t in range(5))
    return M, best, (int(I[k]), int(J[k])), viol, int(((sign == 0) & near).sum())


def verify(points, dim=11, path="auto"):
    """Exact check. Returns the metrics dict; bad input gives valid=False and the reason, never an exception."""
    out = dict(num_points=len(points) if isinstance(points, (list, tuple, np.ndarray)) else 0, dimension=dim, valid=False, path=None,
               **dict.fromkeys(["max_sq_norm", "min_sq_dist", "closest_pair", "margin", "num_violations", "contacts"]))
    try:
        P = parse_points(points, dim)
    except ValueError as e:
        return dict(out, message=f"invalid input: {e}")
    L = max(max(map(abs, p)) for p in P)
    exact = {"int64": 4 * dim * L * L < 2 ** 63, "limb": L < 2 ** 62, "python": True}
    path = next(p for p in exact if exact[p]) if path == "auto" else path
    if not exact[path]:
        return dict(out, message=f"invalid input: path {path} is not exact for coordinates up to {L}")
    M, best, pair, viol, contacts = ((sum(c * c for c in P[0]), None, None, 0, 0) if len(P) == 1 else
                                     _stats_python(P) if path == "python" else _stats_numpy(P, path))
    valid = best is None or best >= M
    out.update(num_points=len(P), valid=valid, max_sq_norm=M, min_sq_dist=best, closest_pair=pair and list(pair),
               margin=None if best is None else best - M, num_violations=viol, contacts=contacts, path=path)
    out["message"] = (f"valid: {len(P)} points, min squared distance {best} >= max squared norm {M}" if valid else
                      f"Minimum squared distance {best} < maximum squared norm {M} (pair {pair[0]}, {pair[1]}: "
                      f"{list(P[pair[0]])} and {list(P[pair[1]])}; {viol} violating pairs)")
    return out


def write_json(path, obj):  # atomic: readers never see a half-written file
    with open(f"{path}.tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(f"{path}.tmp", path)


# ----------------------------------------------------------------------------- sandboxed evaluator
# The child runs `python -I -c RUNNER fd program.py`: an audit hook blocks process creation, sockets, ctypes
# calls, gc introspection and file access outside the working directory (imports may read the Python
# installation); then the program runs and json(points) goes to the dedicated channel `fd`.
RUNNER = r'''
import sys, os, json, runpy, importlib.util
if importlib.util.find_spec("numpy"):
    import numpy  # loads ctypes before the hook exists; programs then find it in sys.modules
out, prog, root = os.fdopen(int(sys.argv[1]), "w"), sys.argv[2], os.path.realpath(os.getcwd())
ro = tuple({os.path.realpath(p) for p in [sys.prefix, sys.base_prefix, sys.exec_prefix] + sys.path if p})
BLOCK = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.", "pty.", "socket.",
         "ctypes.", "os.kill", "os.chdir", "os.fchdir", "os.chroot", "os.putenv", "os.unsetenv", "os.symlink", "os.link",
         "gc.get_", "sys.setprofile", "sys.settrace", "setopencode", "urllib.", "http.", "ftplib.", "smtplib.", "webbrowser.")
PATHS = ("os.listdir", "os.scandir", "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown",
         "os.utime", "os.truncate", "shutil.", "glob.glob")
def hook(event, args, BLOCK=BLOCK, PATHS=PATHS, root=root, ro=ro, cwd=os.getcwd, fsdecode=os.fsdecode, any=any,
         isinstance=isinstance, repr=repr, PermissionError=PermissionError):  # defaults: immune to monkeypatching
    if event.startswith(BLOCK):
        raise PermissionError("sandbox: " + event + " is blocked")
    if event == "object.__setattr__" and args[1] in ("__code__", "__defaults__", "__kwdefaults__", "__globals__"):
        raise PermissionError("sandbox: setting " + args[1] + " is blocked")
    if event == "open" or event.startswith(PATHS):
        path = args[0] if args and args[0] is not None and not isinstance(args[0], int) else "."
        parts = []  # normalise without os.path (patchable) or symlink resolution (os.symlink is blocked)
        for part in (fsdecode(path) if fsdecode(path).startswith("/") else cwd() + "/" + fsdecode(path)).split("/"):
            parts = parts[:-1] if part == ".." else parts + [part] if part not in ("", ".") else parts
        p = "/" + "/".join(parts)
        write = event != "open" or (args[2] or 0) & 0o3103 or any(ch in (args[1] or "r") for ch in "wax+")
        readonly = event in ("open", "os.listdir", "os.scandir", "glob.glob") and not write
        if not any(p == r or p.startswith(r + "/") for r in ((root,) + ro if readonly else (root,))):
            raise PermissionError("sandbox: " + event + "(" + repr(path) + ") outside the working directory is blocked")
sys.addaudithook(hook)
ns = runpy.run_path(prog, run_name="__main__")
pts = ns.get("points", ns.get("get_points"))
pts = pts() if callable(pts) else pts
assert pts is not None, "program defines no `points` (nor get_points())"
pts = pts.tolist() if hasattr(pts, "tolist") else [v.tolist() if hasattr(v, "tolist") else list(v) for v in pts]
out.write(json.dumps(pts, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
out.close()
'''


def evaluate_program(source, dim=11, timeout=30.0, mem_mb=2048, fsize_mb=64, keep_points=False):
    """Run untrusted program text in a sandboxed child, verify its points here; never raises. The sandbox:
    `python -I` in a fresh temp dir, scrubbed env, own session, rlimits (address space, CPU, file size,
    core, process count; root ignores RLIMIT_NPROC), wall-clock kill of the process group, and RUNNER's
    audit hook. NOT isolation against adversarial code: no seccomp, no namespaces (network included), the
    hook is in-process and best-effort, reads of the Python installation are allowed."""
    t0, res = time.time(), {"validity": 0.0, "score": 0, "reason": "", "stdout_tail": "", "stderr_tail": ""}

    def limits():  # runs in the child between fork and exec
        for lim, val in ((resource.RLIMIT_AS, mem_mb << 20), (resource.RLIMIT_CPU, int(timeout) + 2),
                         (resource.RLIMIT_FSIZE, fsize_mb << 20), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, 0)):
            resource.setrlimit(lim, (val, val))
    with tempfile.TemporaryDirectory(prefix="kissing_eval_") as work, tempfile.TemporaryFile() as chan, \
            tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        with open(os.path.join(work, "program.py"), "w") as f:
            f.write(source)
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        try:  # the points come back on `chan`, an anonymous file passed as an fd: the dedicated channel
            proc = subprocess.Popen([sys.executable, "-I", "-c", RUNNER, str(chan.fileno()), "program.py"], cwd=work,
                                    env=env, stdin=subprocess.DEVNULL, stdout=so, stderr=se, pass_fds=(chan.fileno(),),
                                    start_new_session=True, preexec_fn=limits)
        except OSError as err:
            return dict(res, reason=f"could not start the sandbox: {err}")
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            res["reason"] = f"timeout after {timeout:g} s"
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it managed to start
        proc.wait()
        for key, f in (("stdout_tail", so), ("stderr_tail", se)):
            f.seek(max(0, f.seek(0, 2) - 2000))
            res[key] = f.read().decode("utf-8", "replace")
        chan.seek(0)
        raw = chan.read()
    res.update(returncode=proc.returncode, time_s=round(time.time() - t0, 3))
    if not res["reason"] and proc.returncode != 0:
        rc, last = proc.returncode, (res["stderr_tail"].strip().splitlines() or [""])[-1][:300]
        why = {-signal.SIGXCPU: ", CPU time limit", -signal.SIGKILL: ", killed", -signal.SIGXFSZ: ", file size limit"}
        res["reason"] = f"program failed (exit {rc}{why.get(rc, '')}): {last}"
    try:
        pts = None if res["reason"] else json.loads(raw)
    except (ValueError, RecursionError) as e:
        res["reason"] = f"malformed output: {str(e)[:200]}"
    if res["reason"]:
        return res
    m = verify(pts, dim)
    res.update(m, validity=float(m["valid"]), score=m["num_points"] if m["valid"] else 0,
               reason="" if m["valid"] else m["message"], **({"points": pts} if keep_points and m["valid"] else {}))
    return res


# ----------------------------------------------------------------------------- non-LLM constructions
def construct_roots(dim):
    """The D_d root system: all ±e_i ± e_j (2·d·(d−1) vectors, norm² 2, min distance² 2): 220 in 11-D."""
    return [tuple(s if k == i else t if k == j else 0 for k in range(dim))
            for i, j in itertools.combinations(range(dim), 2) for s in (1, -1) for t in (1, -1)]


def weight4_code(n, seed=0, max_steps=1_000_000, restart=30_000):
    """4-subsets of range(n) pairwise meeting in ≤ 2 points (constant-weight code, weight 4, distance 4: no
    triple covered twice) by swap local search: add a random block clashing with ≤ 1 block (evicting it),
    restart every `restart` steps. Finds the optima 14, 18, 30, 35, 51 for n = 8..12 (n = 11: < 0.2 s)."""
    rng = random.Random(seed)
    # Johnson bound A(n,4,4) ≤ ⌊n/4 ⌊(n−1)/3 ⌊(n−2)/2⌋⌋⌋, or the known optimum where it is lower (n ≤ 12)
    bound = {12: 51}.get(n, n * ((n - 1) * ((n - 2) // 2) // 3) // 4)
    blocks = list(itertools.combinations(range(n), 4))
    owner, chosen, best = {}, set(), []  # owner: covered triple -> its block
    for step in range(max_steps):
        if step % restart == 0:  # a stuck run rarely recovers: restart from empty
            owner, chosen = {}, set()
        b = rng.choice(blocks)
        clash = {owner[t] for t in itertools.combinations(b, 3) if t in owner}
        if b in clash or len(clash) > 1:
            continue
        for c in clash:  # evict the (at most one) clashing block
            chosen.discard(c)
            for t in itertools.combinations(c, 3):
                del owner[t]
        chosen.add(b)
        owner.update((t, b) for t in itertools.combinations(b, 3))
        if len(chosen) > len(best):
            best = sorted(chosen)
            if len(best) >= bound:
                break
    return best


def construct_code(dim, seed=0):
    """±2e_i (2d vectors) plus all 16 sign patterns (±1) on each block of a weight-4 code: every vector
    has norm² 4; two patterns on one block differ by 2 somewhere (dist² ≥ 4), blocks meeting in ≤ 2
    points give dist² ≥ 8 − 2·2 = 4, and ±2e_i vs a pattern gives ≥ 1 + 3. 22 + 16·35 = 582 in 11-D."""
    return [tuple(s * 2 * (k == i) for k in range(dim)) for i in range(dim) for s in (1, -1)] + [
        tuple(dict(zip(block, signs)).get(k, 0) for k in range(dim))
        for block in weight4_code(dim, seed) for signs in itertools.product((1, -1), repeat=4)]


def shell_vectors(dim, norm):
    """All integer vectors of squared norm `norm` in Z^dim."""
    if dim == 0:
        return [()] if norm == 0 else []
    r = math.isqrt(norm)
    return [(c,) + rest for c in range(-r, r + 1) for rest in shell_vectors(dim - 1, norm - c * c)]


def construct_shell_search(dim, norm=4, seconds=10.0, seed=0, p_force=0.05, tabu_len=1000):
    """Max independent set on one norm shell (x, y clash iff ‖x−y‖² < norm ⇔ 2·x·y > norm): add a random
    non-member clashing with ≤ 1 member (evicting it), or with 2 with probability p_force; evicted vectors
    are tabu for tabu_len steps. `seconds` is CPU time; 11-D norm 4 (5302 vectors), 10 s: 550–582 by seed."""
    V = np.array(shell_vectors(dim, norm), dtype=np.int64)  # (m, dim)
    if len(V) > 20000:
        raise ValueError(f"the shell of norm {norm} has {len(V)} vectors (> 20000); pick a smaller --norm")
    adj = (V @ V.T) * 2 > norm  # (m, m) clash matrix (the diagonal never matters: members are skipped)
    rng = np.random.default_rng(seed)
    member, tabu = np.zeros(len(V), bool), np.zeros(len(V), np.int64)
    best, t0, step = member.copy(), time.process_time(), 0
    while time.process_time() - t0 < seconds:
        for v in rng.integers(0, len(V), 2000):
            step += 1
            if member[v] or tabu[v] > step:
                continue
            clash = np.flatnonzero(adj[v] & member)
            if len(clash) > 2 or (len(clash) == 2 and rng.random() >= p_force):
                continue
            member[clash], tabu[clash], member[v] = False, step + tabu_len, True
            if len(clash) == 0 and member.sum() > best.sum():
                best = member.copy()
    return [tuple(int(c) for c in v) for v in V[best]]


def construct_optimize(dim, seconds=20.0, seed=0, add=8, margin=0.01, scale=10 ** 6):
    """Grow a spherical code by projected gradient descent on a hinge penalty for pairs closer than 60°:
    when feasible, keep it and add the random candidates farthest from it; when stuck, drop the worst point.
    Then scale, round to integers and check exactly (dropping a point of the closest pair until valid)."""
    rng = np.random.default_rng(seed)
    unit = lambda A: A / np.linalg.norm(A, axis=1, keepdims=True)
    U, best, t0 = unit(rng.standard_normal((2 * dim * dim, dim))), None, time.time()  # (n, dim) on the sphere
    while time.time() - t0 < seconds or best is None:
        for step in range(300):
            C = U @ U.T - 2 * np.eye(len(U))  # (n, n) cosines, diagonal pushed out of the way
            if C.max() < 0.5 - margin / 2:
                break
            U = unit(U - 0.1 * np.maximum(C - 0.5 + margin, 0.0) @ U)  # push apart the clashing pairs
        if C.max() < 0.5 - margin / 2:
            best = U.copy()
        else:
            U = np.delete(U, C.max(1).argmax(), axis=0)
            if best is None or len(U) > len(best):
                continue
            U, add = best.copy(), max(1, add // 2)  # back to the last feasible set, grow more slowly
        cand = unit(rng.standard_normal((2000, dim)))
        U = np.vstack([U, cand[np.argsort((cand @ U.T).max(1))[:add]]])
    pts = [tuple(int(c) for c in row) for row in np.rint(best * scale).astype(np.int64)]
    while not (m := verify(pts, dim))["valid"]:
        pts.pop(m["closest_pair"][1])
    return pts


# ----------------------------------------------------------------------------- LLM search
def prompt(name, **fields):
    """prompts/kissing_<name>.prompt (seed 001 §7.4's texts; ours for crash/evolve) with {field}s filled.
    str.replace, not str.format: the texts hold LaTeX braces."""
    import data
    text = data.load_prompt(f"kissing_{name}")
    for k, v in fields.items():
        text = text.replace("{" + k + "}", str(v))
    return text


STARTER = "# starter: the 2*d unit vectors +-e_i (valid, tiny)\nd = {dim}\npoints = [[s if k == i else 0 for k in range(d)] for i in range(d) for s in (1, -1)]\n"


def feedback(metrics):
    return (prompt("ok", score=metrics["score"]) if metrics["validity"] == 1.0 else
            prompt("fail", error=metrics["reason"].split(" (pair")[0]) if metrics.get("num_violations") else
            prompt("crash", error=metrics["reason"][:500]))


def extract_program(text, parent=None):
    """The last ```python block; else SEARCH/REPLACE edits applied to `parent`; else the raw text."""
    text = re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.S)
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", text, flags=re.S)
    edits = re.findall(r"<<<<<<< SEARCH\n(.*?)\n=======\n(.*?)\n>>>>>>> REPLACE", text, flags=re.S)
    if blocks or parent is None or not edits:
        return blocks[-1] if blocks else text
    for old, new in edits:
        parent = parent.replace(old, new, 1)
    return parent


def openai_chat(base_url, model, messages, temperature, max_tokens, seed, timeout=600, retries=3):
    """Stdlib client for POST {base_url}/chat/completions. Returns (text, prompt_tokens, completion_tokens)."""
    body = json.dumps({"model": model, "messages": messages, "temperature": temperature,
                       "max_tokens": max_tokens, "seed": seed}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'none')}"}
    for attempt in range(retries):  # a garbage reply is retried, then logged as the response
        try:
            req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", body, headers)
            with urllib.request.urlopen(req, timeout=timeout) as r:
                data = json.loads(r.read())
            usage = data.get("usage") or {}
            return str(data["choices"][0]["message"]["content"] or ""), usage.get("prompt_tokens"), usage.get("completion_tokens")
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:  # URLError is an OSError
            error = f"[client error: {type(e).__name__}: {str(e)[:200]}]"
            time.sleep(2 ** attempt if attempt < retries - 1 else 0)
    return error, None, None


def make_backend(args):
    """Returns chat(messages, seed) -> (text, prompt_tokens, completion_tokens)."""
    kind, _, target = args.llm.partition(":")
    if kind == "openai":
        url = target or os.environ.get("OPENAI_BASE_URL", "")
        model = args.model or os.environ.get("OPENAI_MODEL", "")
        if not url or not model:
            raise SystemExit("error: --llm openai:URL needs a base URL (or $OPENAI_BASE_URL) and --model (or $OPENAI_MODEL)")
        return lambda msgs, seed: openai_chat(url, model, msgs, args.temperature, args.max_tokens, seed)
    if kind != "local" or not target:
        raise SystemExit(f"error: --llm must be openai:URL or local:MODEL_PATH, got {args.llm!r}")
    import rollout  # lazily: pulls in torch / vLLM
    from transformers import AutoConfig, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(target)
    ctx = min(args.max_model_len, getattr(AutoConfig.from_pretrained(target), "max_position_embeddings", 10 ** 9))
    max_new = min(args.max_tokens, ctx // 2)  # room for the prompt (the tiny test model has 1024 positions)
    llm = rollout.init_engine(args.engine, target, args.device, args.seed,
                              **({"max_model_len": ctx, "enforce_eager": args.eager} if args.engine == "vllm" else {}))

    def chat(msgs, seed):
        prompt = (tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) if tok.chat_template else
                  "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs) + "Assistant:")
        ids = tok(prompt)["input_ids"][-(ctx - max_new - 16):]  # keep the tail if it does not fit
        out = rollout.generate(llm, [tok.decode(ids)], n=1, temperature=args.temperature, max_tokens=max_new,
                               seed=seed)[0][0]
        return out["text"], len(out["prompt_token_ids"]), len(out["token_ids"])
    return chat


def search(args):
    log_path = os.path.join(args.out_dir, "conversation_log.json")
    log = {"task": f"kissing number, d={args.dim}", "args": vars(args), "entries": [], "best": {"iter": None, "score": 0}}
    if os.path.exists(log_path):
        if not args.resume:
            raise SystemExit(f"error: {log_path} exists: pass --resume to continue it or choose another --out-dir")
        with open(log_path) as f:
            log = json.load(f)
        if log["args"]["mode"] != args.mode:
            raise SystemExit(f"error: the log in {args.out_dir} was made with --mode {log['args']['mode']}")
    os.makedirs(args.out_dir, exist_ok=True)
    chat, base = make_backend(args), prompt("base", dim=args.dim)
    islands = [[(0, STARTER.format(dim=args.dim))] for _ in range(args.islands)]  # evolve: (score, program)

    def add(island, score, program):  # keep each island's best island_size programs
        islands[island] = sorted(islands[island] + [(score, program)], key=lambda p: -p[0])[:args.island_size]
    for e in (e for e in log["entries"] if e["island"] is not None):  # resume: replay the log into the database
        add(e["island"], e["metrics"]["score"], e["program"])
    for it in range(len(log["entries"]), args.iters):
        seed = args.seed * 1_000_003 + it
        rng, island, parent, last = random.Random(seed), None, None, (log["entries"] or [None])[-1]
        # --- prompt
        if args.mode == "best-of-n" or (args.mode == "refine" and last is None):
            msgs = [{"role": "user", "content": base}]
        elif args.mode == "refine":  # the task, then the most recent exchanges with the verifier's feedback
            msgs = last["messages"] + [{"role": "assistant", "content": last["response"]},
                                       {"role": "user", "content": last["feedback"]}]
            msgs = msgs[:1] + msgs[1:][-2 * max(1, args.history):]
        else:  # evolve: a parent (usually the island's best), the other islands' best, one random member
            island = it % args.islands
            parent = islands[island][0] if rng.random() < 0.7 else rng.choice(islands[island])
            others = [isl[0] for k, isl in enumerate(islands) if k != island]
            shown = [parent] + rng.sample(others, min(2, len(others))) + [rng.choice(islands[island])]
            text = "\n\n".join(f"### Program (score {sc})\n```python\n{pr[:args.max_program_chars]}\n```" for sc, pr in shown)
            msgs = [{"role": "user", "content": prompt("evolve", base=base, shown=text)}]
        # --- generate -> evaluate (our verifier, never the program's own claims)
        t0, (response, ptok, ctok) = time.time(), chat(msgs, seed)
        program = extract_program(response, parent[1] if parent else None)
        metrics = evaluate_program(program, args.dim, args.timeout, args.mem_mb, keep_points=True)
        points = metrics.pop("points", None)  # kept out of the log; best_points.json holds the best
        log["entries"].append({"iter": it, "mode": args.mode, "seed": seed, "island": island, "messages": msgs,
                               "response": response, "program": program, "metrics": metrics,
                               "feedback": feedback(metrics), "prompt_tokens": ptok, "completion_tokens": ctok,
                               "time_s": round(time.time() - t0, 3)})
        if island is not None:
            add(island, metrics["score"], program)
        if metrics["score"] > log["best"]["score"]:
            log["best"] = {"iter": it, "score": metrics["score"]}
            write_json(os.path.join(args.out_dir, "best_points.json"), points)
            with open(os.path.join(args.out_dir, "program.py"), "w") as f:
                f.write(program)
        # --- log
        write_json(log_path, log)
        print(f"iter {it} | score {metrics['score']} | best {log['best']['score']} | tokens {ptok}/{ctok} | "
              f"{metrics['reason'][:80] or 'valid'}")
    return {"best": log["best"], "entries": len(log["entries"]), "out_dir": args.out_dir}


# ----------------------------------------------------------------------------- CLI
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    dim = argparse.ArgumentParser(add_help=False)
    dim.add_argument("--dim", type=int, default=11, help="dimension d of the vectors")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", parents=[dim], help="exact check of a JSON / .npy configuration")
    v.add_argument("file", help="JSON list of vectors, {\"points\": [...]}, or .npy integer array")
    v.add_argument("--path", default="auto", choices=["auto", "int64", "limb", "python"], help="force an exact path")
    e = sub.add_parser("evaluate", parents=[dim], help="run an untrusted program in the sandbox, verify its `points`")
    e.add_argument("program", help="Python file defining `points` (or get_points())")
    c = sub.add_parser("construct", parents=[dim], help="non-LLM baselines that write a verified configuration")
    c.add_argument("--method", default="code", choices=["d11", "code", "shell-search", "optimize"],
                   help="d11: D_d roots (220); code: ±2e_i + signs on a weight-4 code (582); shell-search: local "
                        "search on one norm shell; optimize: sphere descent + rounding")
    c.add_argument("--out", default=None, help="write the points here (JSON)")
    c.add_argument("--norm", type=int, default=4, help="shell-search: squared norm of the shell")
    c.add_argument("--seconds", type=float, default=10.0, help="shell-search (CPU) / optimize (wall) time budget (s)")
    s = sub.add_parser("search", parents=[dim], help="LLM-driven search (seed §7.4): refine, best-of-n or evolve")
    # --- model
    s.add_argument("--llm", required=True, help="openai:BASE_URL (key in $OPENAI_API_KEY) or local:MODEL_PATH")
    s.add_argument("--model", default=None, help="model name for openai: (default $OPENAI_MODEL)")
    s.add_argument("--engine", default="vllm", choices=["vllm", "hf"], help="local: rollout.py engine")
    s.add_argument("--device", default="cpu", help="local: engine device (cpu, cuda, cuda:N)")
    s.add_argument("--max-model-len", type=int, default=8192, help="local: context length (capped by the model)")
    s.add_argument("--eager", action="store_true", help="local vllm: skip torch.compile (fast start, slower decode)")
    # --- sampling
    s.add_argument("--temperature", type=float, default=0.8, help="sampling temperature")
    s.add_argument("--max-tokens", type=int, default=4096, help="max new tokens per response")
    # --- loop
    s.add_argument("--mode", default="refine", choices=["refine", "best-of-n", "evolve"],
                   help="refine: one conversation fed the exact error; best-of-n: independent samples, the verifier "
                        "picks; evolve: island program database, best + diverse parents, full or diff edits")
    s.add_argument("--iters", type=int, default=20, help="total LLM calls (including resumed ones)")
    s.add_argument("--history", type=int, default=4, help="refine: recent exchanges kept in the prompt (at least 1)")
    s.add_argument("--islands", type=int, default=3, help="evolve: number of islands")
    s.add_argument("--island-size", type=int, default=8, help="evolve: programs kept per island")
    s.add_argument("--max-program-chars", type=int, default=6000, help="evolve: program text shown per parent")
    s.add_argument("--out-dir", default="runs/kissing", help="conversation_log.json, program.py, best_points.json")
    s.add_argument("--resume", action="store_true", help="continue the log in --out-dir")
    for q in (c, s):
        q.add_argument("--seed", type=int, default=0, help="seed (search: call i samples with seed*1000003 + i)")
    for q in (e, s):  # --- sandbox
        q.add_argument("--timeout", type=float, default=30.0, help="sandbox wall-clock limit per program (s)")
        q.add_argument("--mem-mb", type=int, default=2048, help="sandbox address-space limit (MiB)")
    args = p.parse_args(argv)

    if args.cmd == "verify":
        try:
            with open(args.file, "rb") as f:
                m = verify(np.load(f, allow_pickle=False) if args.file.endswith(".npy") else json.load(f), args.dim, args.path)
        except (OSError, ValueError) as err:
            raise SystemExit(f"error: cannot read {args.file}: {err}")
    elif args.cmd == "evaluate":
        with open(args.program) as f:
            m = evaluate_program(f.read(), args.dim, args.timeout, args.mem_mb)
    elif args.cmd == "construct":
        t0 = time.time()
        pts = [list(x) for x in {"d11": lambda: construct_roots(args.dim), "code": lambda: construct_code(args.dim, args.seed),
               "shell-search": lambda: construct_shell_search(args.dim, args.norm, args.seconds, args.seed),
               "optimize": lambda: construct_optimize(args.dim, args.seconds, args.seed)}[args.method]()]
        m = dict(verify(pts, args.dim), method=args.method, construct_s=round(time.time() - t0, 3))
        if args.out:
            write_json(args.out, pts)
    else:
        m = search(args)
    print(json.dumps(m))
    return m


if __name__ == "__main__":
    main()
