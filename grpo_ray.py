"""GRPO as Ray actors (seed 004 §3): a Generator (rollout engine) and a Learner (policy, AdamW, frozen
reference) either in one actor or in two, driven synchronously or one-step-off asynchronously, with
every phase timed into a per-actor timeline.

Schedules (seed 004 Problems 5-8):
  --placement colocated        one actor holds engine + policy (+ reference); weight sync is an in-process
                               copy. --steps-per-rollout k: generate k rollout batches with version v,
                               store their old log-probs under v, take k GRPO-Clip steps, sync (Problem 7 B).
  --placement disaggregated    a Generator actor and a Learner actor, one device each. Without --async
                               every step waits for the previous one (sync). With --async the generation
                               of batch t+1 overlaps the training on batch t: batch j starts only once
                               policy version j - --max-staleness has been pushed to the generator, so no
                               batch is more than --max-staleness versions behind (checked for every batch).
Weight sync Learner -> Generator (Problem 9): --weight-sync object_store (default; the state dict goes
through Ray's object store), gloo (Ray Direct Transport over a Gloo group; CPU, --engine hf only) or nccl
(RDT over NCCL, CUDA + cupy: written against Ray's documented API, NOT exercised in CI).

Every phase is a grpo.py per-step function called inside the actors (rollout, score, collate,
batch_log_probs, train_on_batch, kl_metrics, evaluate, sync_weights); every grpo.py flag works here.
Departures: a version is one trained rollout batch and a batch's lag = learner version - the version that
generated it; a stale batch (lag > 0 in the disaggregated modes) takes pi_old from the engine's sampled
log-probs, since the learner no longer holds that version; eval runs at start and end (plus every
--eval-every versions, inside the timed loop); timestamps are each actor's time.time(), so a multi-node
timeline is only as good as the nodes' clock sync.
Outputs in --out: metrics.jsonl (grpo.py keys + ray/ keys), timeline.json, timeline.png, summary.json, plots.

Examples:
  python grpo_ray.py --placement colocated --n-grpo-steps 20                    # Problem 5 on the demo model
  python grpo_ray.py --placement colocated --steps-per-rollout 4 --loss grpo_clip      # Problem 7 B
  python grpo_ray.py --placement disaggregated --async --loss grpo_clip                # Problem 8
  python grpo_ray.py --address auto --model Qwen/Qwen2.5-Math-1.5B --placement disaggregated --async \\
      --weight-sync nccl                                                        # 2 GPUs, Problem 9
"""
import argparse
import copy
import json
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine inside the actor
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import ray
import torch

import data
import grpo

ROOT = os.path.dirname(os.path.abspath(__file__))
RATIO_LOSSES = ("grpo_clip", "grpo_no_clip", "gspo")  # losses that use pi_old


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    p = argparse.ArgumentParser(description="GRPO on Ray: colocated / disaggregated, sync / async (seed 004 §3).",
                                epilog="Every grpo.py flag is accepted as well (python grpo.py --help).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("placement")  # --- placement ---
    g.add_argument("--placement", default="colocated", choices=["colocated", "disaggregated"],
                   help="one actor with engine + learner, or a Generator and a Learner actor")
    g.add_argument("--async", dest="async_mode", action="store_true",
                   help="disaggregated only: generate batch t+1 while training on batch t")
    g.add_argument("--max-staleness", type=int, default=1, help="--async: most policy versions a batch may lag")
    g.add_argument("--steps-per-rollout", type=int, default=1, choices=[1, 2, 4, 8],
                   help="colocated: k rollout batches per weight sync, k GRPO-Clip steps on old log-probs of version v")
    g.add_argument("--weight-sync", default="object_store", choices=["object_store", "gloo", "nccl"],
                   help="disaggregated Learner->Generator transport: Ray object store or Ray Direct Transport")
    g = p.add_argument_group("ray")  # --- ray ---
    g.add_argument("--address", default=None, help="existing cluster (e.g. auto); default: start a local one")
    g.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local cluster")
    g.add_argument("--object-store-mb", type=int, default=256, help="object store of the local cluster (MiB)")
    g.add_argument("--ray-tmp", default="/tmp/ray_grpo", help="session/log dir of the local cluster (short path)")
    g.add_argument("--cpus-per-actor", type=float, default=1, help="num_cpus of each actor")
    g.add_argument("--gpus-per-actor", type=float, default=None, help="num_gpus of each actor; default 1 if the cluster has GPUs")
    g.add_argument("--timeout-s", type=float, default=900, help="bound on every ray.get: a dead or hung actor raises")
    ray_args, rest = p.parse_known_args(argv)
    args = grpo.parse_args(rest)
    vars(args).update(vars(ray_args))

    # derived sizes and mode checks, each saying what to change
    k = args.steps_per_rollout
    assert k == 1 or args.placement == "colocated", "--steps-per-rollout > 1 is the colocated schedule (Problem 7)"
    assert k == 1 or args.loss in RATIO_LOSSES, f"--steps-per-rollout {k} needs a ratio loss: pass --loss grpo_clip"
    assert args.n_grpo_steps % k == 0, f"--n-grpo-steps {args.n_grpo_steps} must be a multiple of --steps-per-rollout {k}"
    assert not args.async_mode or args.placement == "disaggregated", "--async needs --placement disaggregated"
    assert args.max_staleness >= 1, "--max-staleness must be >= 1 (0 is the synchronous schedule: drop --async)"
    assert args.weight_sync == "object_store" or args.placement == "disaggregated", (
        "--weight-sync gloo/nccl moves weights between two actors: use --placement disaggregated")
    assert args.weight_sync != "gloo" or args.engine == "hf", (
        "--weight-sync gloo needs --engine hf: the in-process vLLM engine owns torch.distributed's default group "
        "(world size 1), so Ray cannot build its torch_gloo group beside it (nccl uses cupy and is unaffected)")
    args.staleness = args.max_staleness if args.async_mode else 0  # 0 = sync
    args.devices = 1 if args.placement == "colocated" else 2
    args.mode = (f"colocated-k{k}" if args.placement == "colocated" else
                 f"disaggregated-async-s{args.max_staleness}" if args.async_mode else "disaggregated-sync")
    return args


# ----------------------------------------------------------------------------- actors
def _span(phase, t0, step):
    return {"phase": phase, "t0": t0, "t1": time.time(), "step": step}


def engine_log_probs(batch, tensors):
    """(N, T) engine log-probs of the sampled tokens, aligned with grpo.collate's labels (0 elsewhere)."""
    out = torch.zeros(tensors["labels"].shape)
    for i, (p, r) in enumerate(zip(batch["prompt_ids"], batch["engine_logprobs"])):
        out[i, len(p) - 1:len(p) - 1 + len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


class Generator:
    """Holds the rollout engine; samples and grades one rollout batch per call (grpo.rollout + grpo.score)."""

    def __init__(self, args):
        self.engine = None
        self.reset(args)

    def reset(self, args):
        """(Re)start a run on this actor: flags, data, initial weights, version 0 (tests and bench reuse actors)."""
        self.args = args = copy.copy(args)
        torch.manual_seed(args.seed)
        grpo.resolve_devices(args)  # inside the actor: Ray has set CUDA_VISIBLE_DEVICES to its own GPU(s)
        self.train_rows, self.val_rows, self.template, self.stop, self.reward_fn = grpo.load_data(args)
        if self.engine is None:
            self.engine = grpo.make_engine(args.model, args)
        else:
            grpo.sync_weights(grpo.load_policy(args.model, args)[0].state_dict(), self.engine)
        self.engine_version = 0  # policy version whose weights the engine holds
        return os.getpid()

    def generate(self, step):
        t0 = time.time()
        rows = grpo.sample_questions(self.train_rows, self.args, step)
        batch = grpo.rollout(self.engine, rows, self.template, self.stop, self.args, step)
        spans = [_span("generate", t0, step)]
        t0 = time.time()
        advantages, raw_rewards, metrics = grpo.score(batch, self.reward_fn, self.args)
        spans.append(_span("score", t0, step))
        return {"step": step, "version": self.engine_version, "batch": batch, "advantages": advantages,
                "raw_rewards": raw_rewards, "metrics": metrics, "spans": spans}

    def set_weights(self, pushed, version):
        """Load a pushed state dict (Ray resolved it from the object store or by an RDT transfer) into the engine."""
        t0 = time.time()
        grpo.sync_weights(pushed["weights"], self.engine)  # rollout.load_policy_into_vllm takes a state dict
        self.engine_version = version
        return {"version": version, "spans": pushed["spans"] + [_span("weight_sync", t0, version - 1)]}

    def receive(self, pushed):
        """Transfer-only probe for the weight-sync benchmark: bytes received, nothing loaded."""
        return sum(v.numel() * v.element_size() for v in pushed["weights"].values())

    def evaluate(self, version):
        t0 = time.time()
        metrics, samples = grpo.evaluate(self.engine, self.val_rows, self.template, self.stop, self.reward_fn, self.args)
        assert version == self.engine_version, f"eval expected version {version}, engine holds {self.engine_version}"
        return {"version": version, "metrics": metrics, "samples": samples[:16], "spans": [_span("eval", t0, version)]}


class Learner:
    """Holds the policy, AdamW and, for --kl-beta > 0 or --kl-every > 0, the frozen reference (initial policy)."""

    def __init__(self, args):
        self.reset(args)

    def reset(self, args):
        self.args = args = copy.copy(args)
        torch.manual_seed(args.seed)
        grpo.resolve_devices(args)
        self.policy, self.tokenizer = grpo.load_policy(args.model, args)
        tok = self.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
        need_ref = args.kl_beta > 0 or args.kl_every > 0
        self.ref = grpo.load_policy(args.model, args)[0].eval().requires_grad_(False) if need_ref else None
        self.version = 0  # rollout batches trained on so far
        return os.getpid()

    def save(self, out_dir, state):
        return grpo.save_checkpoint(out_dir, self.policy, self.tokenizer, self.optimizer, self.args, state)

    def old_log_probs(self, gen):
        """pi_old of a rollout batch: the version that generated it. Returns {"old": (N, T), "spans"}."""
        t0 = time.time()
        tensors = grpo.collate(gen["batch"], self.pad_id)
        if gen["version"] == self.version:  # the policy still is the generating version
            old = grpo.batch_log_probs(self.policy, tensors, self.args)
        else:  # stale batch: that version is gone here; the engine's sampled log-probs are exactly it
            old = engine_log_probs(gen["batch"], tensors)
        return {"old": old, "version": self.version, "spans": [_span("old_log_probs", t0, gen["step"])]}

    def train(self, gen, old=None):
        """One rollout batch: old/ref log-probs, grpo.train_on_batch, KL monitoring; the version goes up by one."""
        a, step, lag = self.args, gen["step"], self.version - gen["version"]
        tensors = grpo.collate(gen["batch"], self.pad_id)
        do_kl = a.kl_every > 0 and step % a.kl_every == 0
        old = self.old_log_probs(gen) if old is None and a.needs_old else old
        spans = old["spans"] if old else []
        t0 = time.time()
        # pi_t on this batch for KL: pi_old itself when the current policy computed it
        before = (old["old"] if old and lag == 0 and old["version"] == gen["version"] else
                  grpo.batch_log_probs(self.policy, tensors, a)) if do_kl else None
        old = old["old"] if old else None
        ref = grpo.batch_log_probs(self.ref, tensors, a) if (a.kl_beta or do_kl) else None
        history = grpo.train_on_batch(self.policy, self.optimizer, tensors, gen["advantages"], gen["raw_rewards"],
                                      old, ref, a, step)
        after = grpo.batch_log_probs(self.policy, tensors, a) if do_kl else None  # pi_t+1 on the same tokens
        self.version += 1
        spans.append(_span("train", t0, step))
        kl = grpo.kl_metrics(before, after, ref, tensors) if do_kl else {}
        return {"step": step, "lag": lag, "version": self.version, "history": history, "metrics": kl,
                "n_tokens": int(tensors["response_mask"].sum()), "spans": spans}

    def get_weights(self, clone=False):
        """{"weights": state dict, "spans"} to push. clone=True for RDT: Ray keeps a *reference* to RDT
        tensors and the next optimizer step would mutate them mid-transfer. Object store: a CPU copy."""
        t0 = time.time()
        sd = {k: (v.detach().clone() if clone else v.detach().cpu()) for k, v in self.policy.state_dict().items()}
        return {"weights": sd, "spans": [{"actor": "learner", **_span("get_weights", t0, self.version - 1)}]}


class Colocated(Generator, Learner):
    """Generator, Learner and reference in one actor on one device (seed 004 §3.1: ColocatedWorker)."""

    def reset(self, args):
        Generator.reset(self, args)
        return Learner.reset(self, args)

    def sync(self):
        t0 = time.time()
        grpo.sync_weights(self.policy, self.engine)  # in-process copy, no transport
        self.engine_version = self.version
        return {"version": self.version, "spans": [_span("weight_sync", t0, self.version - 1)]}


# ----------------------------------------------------------------------------- driver
def init_ray(args):
    """Start (or join, with --address) a cluster once per process; workers get the engine env vars."""
    if ray.is_initialized():
        return
    env = {"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}}
    if args.address:  # remote nodes need the code and the embedded model: ship the repo, not the venv
        env.update(working_dir=ROOT, excludes=[".venv/", ".git/", "runs/", "out/"])
        ray.init(address=args.address, runtime_env=env, namespace="grpo_ray")
    else:
        ray.init(num_cpus=args.num_cpus, object_store_memory=args.object_store_mb * 2**20, include_dashboard=False,
                 _temp_dir=args.ray_tmp, runtime_env=env, namespace="grpo_ray")


def get(refs, what, args):
    """ray.get bounded by --timeout-s: a dead actor or a hang becomes one clear error instead of a hang."""
    try:
        return ray.get(refs, timeout=args.timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(f"grpo_ray: {what} did not finish within --timeout-s {args.timeout_s:g}s "
                           f"(actor hung, or not schedulable: free CPUs/GPUs?)") from None
    except ray.exceptions.RayActorError as e:
        raise RuntimeError(f"grpo_ray: the actor running {what} died ({type(e).__name__}); its log is under "
                           f"{args.ray_tmp}/session_latest/logs") from e


def build_actors(args):
    """{"colocated"} or {"generator", "learner"}, created and ready (engines loaded) within --timeout-s."""
    gpus = args.gpus_per_actor if args.gpus_per_actor is not None else float(ray.cluster_resources().get("GPU", 0) > 0)
    opts = dict(num_cpus=args.cpus_per_actor, num_gpus=gpus, enable_tensor_transport=args.weight_sync != "object_store")
    roles = {"colocated": Colocated} if args.placement == "colocated" else {"generator": Generator, "learner": Learner}
    actors = {role: ray.remote(**opts)(cls).remote(args) for role, cls in roles.items()}
    get([a.__ray_ready__.remote() for a in actors.values()], "actor start-up (engine / policy load)", args)
    if args.weight_sync != "object_store":  # RDT: collective transports need a group first (ranks: learner 0)
        from ray.experimental.collective import create_collective_group
        create_collective_group([actors["learner"], actors["generator"]], backend=args.weight_sync)
    return actors


def kill_actors(actors):
    from ray.experimental.collective import destroy_collective_group, get_collective_groups
    for group in get_collective_groups(list(actors.values())):  # RDT: no half-done transfer to report
        destroy_collective_group(group)
    for a in actors.values():
        ray.kill(a)


def run(args, actors):
    """The driver loop (single controller). Returns the summary; writes metrics, timeline and summary to --out."""
    os.makedirs(os.path.join(args.out, "rollouts"), exist_ok=True)
    with open(os.path.join(args.out, "args.json"), "w") as f:
        json.dump(vars(args), f, indent=1)
    open(os.path.join(args.out, "metrics.jsonl"), "w").close()  # grpo.log_row appends: start this run empty
    gen_actor = actors.get("generator", actors.get("colocated"))
    spans, rows = [], []

    def add_spans(role, out):
        spans.extend({"actor": role, **s} for s in out["spans"])

    def evaluate(version):
        out = get(gen_actor.evaluate.remote(version), f"eval at version {version}", args)
        add_spans("generator" if "generator" in actors else "colocated", out)
        _log(args, rows, {"step": version, "time/eval": out["spans"][0]["t1"] - out["spans"][0]["t0"]} | out["metrics"])
        data.write_jsonl_atomic(os.path.join(args.out, "rollouts", f"eval_v{version:04d}.jsonl"), out["samples"])
        print(f"eval version {version} | " + " | ".join(f"{k} {v:.3f}" for k, v in out["metrics"].items()), flush=True)

    evaluate(0)
    t_run = time.time()
    if args.placement == "colocated":
        w, k = actors["colocated"], args.steps_per_rollout
        for t in range(0, args.n_grpo_steps, k):
            # --- rollout + reward: k batches from the engine at version v ---
            gens = [w.generate.remote(s) for s in range(t, t + k)]
            # --- old log-probs of all k batches under version v, queued before any update (Problem 7 B) ---
            olds = [w.old_log_probs.remote(g) for g in gens] if k > 1 else [None] * k
            # --- train: one rollout batch per update ---
            trains = [w.train.remote(g, o) for g, o in zip(gens, olds)]
            # --- sync weights into the engine (in-process) ---
            sync = w.sync.remote()
            for g, tr in zip(get(gens, f"rollout steps {t}..{t + k - 1}", args), get(trains, f"train step {t}", args)):
                add_spans("colocated", g)
                add_spans("colocated", tr)
                _log_step(args, rows, g, tr, t_run)
            add_spans("colocated", get(sync, f"weight sync after step {t + k - 1}", args))
            if args.eval_every and (t + k) % args.eval_every == 0 and t + k < args.n_grpo_steps:
                evaluate(t + k)
    else:
        gen, lrn = actors["generator"], actors["learner"]
        transport = {} if args.weight_sync == "object_store" else {"tensor_transport": args.weight_sync}
        pending, pushed, nxt, sync = {}, 0, 0, None
        for t in range(args.n_grpo_steps):
            # --- rollout + reward: launch every batch the staleness bound allows (j needs version j - s pushed) ---
            while nxt < args.n_grpo_steps and nxt - args.staleness <= pushed:
                pending[nxt], nxt = gen.generate.remote(nxt), nxt + 1
            ref = pending.pop(t)
            g = get(ref, f"rollout step {t}", args)
            add_spans("generator", g)
            if t - g["version"] > args.staleness:  # the learner is at version t when it trains batch t
                raise RuntimeError(f"grpo_ray: batch {t} is {t - g['version']} versions stale > bound {args.staleness}")
            # --- old log-probs + train on the learner (the batch goes actor to actor, not through here) ---
            tr = get(lrn.train.remote(ref), f"train step {t}", args)
            add_spans("learner", tr)
            _log_step(args, rows, g, tr, t_run)
            # --- sync weights: learner -> generator, queued behind the generations already launched ---
            if sync is not None:
                add_spans("generator", get(sync, f"weight sync of version {pushed}", args))
            weights = lrn.get_weights.options(**transport).remote(clone=bool(transport))
            sync, pushed = gen.set_weights.remote(weights, tr["version"]), tr["version"]
            if args.eval_every and pushed % args.eval_every == 0 and pushed < args.n_grpo_steps:
                add_spans("generator", get(sync, f"weight sync of version {pushed}", args))
                sync = None
                evaluate(pushed)
        add_spans("generator", get(sync, f"weight sync of version {pushed}", args))
    wall = time.time() - t_run
    evaluate(args.n_grpo_steps)
    learner = actors.get("learner", actors.get("colocated"))
    get(learner.save.remote(args.out, {"step": args.n_grpo_steps, "wall": wall}), "save checkpoint", args)
    summary = summarize(args, rows, spans, wall)
    data.write_json_atomic(os.path.join(args.out, "timeline.json"), spans)
    data.write_json_atomic(os.path.join(args.out, "summary.json"), summary)
    plot_timeline([(args.mode, spans)], os.path.join(args.out, "timeline.png"))
    return summary


def _log_step(args, rows, g, tr, t_run):
    """One row per optimizer step (grpo.py's keys) plus the Ray bookkeeping: version, lag, phase times."""
    d = {s["phase"]: s["t1"] - s["t0"] for s in g["spans"] + tr["spans"]}
    common = g["metrics"] | tr["metrics"] | {
        "ray/lag": tr["lag"], "ray/version": tr["version"], "ray/gen_version": g["version"],
        "time/generation": d["generate"], "time/grading": d["score"], "time/old_log_probs": d.get("old_log_probs", 0.0),
        "time/training": d["train"], "time/gen_tokens_per_s": tr["n_tokens"] / max(d["generate"], 1e-9)}
    for h in tr["history"]:
        _log(args, rows, {"step": g["step"], "time/wall": time.time() - t_run} | common | h)
    print(f"[{args.mode}] step {g['step'] + 1}/{args.n_grpo_steps} | reward {common['train/reward']:.3f} | "
          f"loss {h['train/loss']:+.4f} | lag {tr['lag']} | gen {d['generate']:.2f}s score {d['score']:.2f}s "
          f"train {d['train']:.2f}s", flush=True)


def _log(args, rows, row):
    rows.append(row)
    grpo.log_row(args.out, row)


# ----------------------------------------------------------------------------- profiling
def summarize(args, rows, spans, wall):
    """Throughput, per-phase mean seconds per step, lags, device-hours (wall x devices) for one run."""
    samples = args.n_grpo_steps * args.rollout_batch_size
    phases = {}
    for s in spans:
        if s["phase"] != "eval":
            phases.setdefault(s["phase"], []).append(s["t1"] - s["t0"])
    lags = list({r["step"]: r["ray/lag"] for r in rows if "ray/lag" in r}.values())  # one per rollout batch
    return {"mode": args.mode, "placement": args.placement, "async": args.async_mode, "max_staleness": args.staleness,
            "steps_per_rollout": args.steps_per_rollout, "weight_sync": args.weight_sync, "engine": args.engine,
            "steps": args.n_grpo_steps, "samples": samples, "wall_s": wall, "samples_per_s": samples / wall,
            "step_time_s": wall / args.n_grpo_steps, "devices": args.devices,
            "device_hours": wall * args.devices / 3600, "lags": lags, "max_lag": max(lags, default=0),
            "phase_mean_s": {k: sum(v) / len(v) for k, v in phases.items()},
            "phase_total_s": {k: sum(v) for k, v in phases.items()}}


COLORS = {"generate": "tab:blue", "score": "tab:cyan", "old_log_probs": "tab:olive", "train": "tab:red",
          "get_weights": "tab:purple", "weight_sync": "tab:green", "eval": "lightgray"}


def plot_timeline(runs, path):
    """Gantt chart, one panel per run and one row per actor; bars are phases, labelled with their step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 1.2 + 1.1 * sum(len({s["actor"] for s in sp}) for _, sp in runs)),
                             squeeze=False)
    for ax, (title, spans) in zip(axes[:, 0], runs):
        spans = [s for s in spans if s["phase"] != "eval"]
        t_min = min(s["t0"] for s in spans)
        actors = sorted({s["actor"] for s in spans})
        for y, actor in enumerate(actors):
            for s in (s for s in spans if s["actor"] == actor):
                ax.broken_barh([(s["t0"] - t_min, s["t1"] - s["t0"])], (y - 0.4, 0.8), color=COLORS[s["phase"]])
                if s["phase"] in ("generate", "train"):
                    ax.text(s["t0"] - t_min, y, str(s["step"]), va="center", fontsize=7)
        ax.set_yticks(range(len(actors)), actors)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("seconds")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.legend(handles, list(COLORS), loc="upper right", ncol=len(COLORS), fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path + ".tmp.png", dpi=110)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


# ----------------------------------------------------------------------------- main
def main(args):
    import plot
    init_ray(args)
    print(f"ray: {ray.cluster_resources()} | mode {args.mode} | {args.n_grpo_steps} steps x "
          f"{args.rollout_batch_size} samples | weight sync {args.weight_sync} | out {args.out}", flush=True)
    actors = build_actors(args)
    try:
        summary = run(args, actors)
    finally:
        kill_actors(actors)
    plot.plot_runs([args.out], args.out)
    print(json.dumps({k: v for k, v in summary.items() if k != "lags"}))


if __name__ == "__main__":
    main(parse_args())
