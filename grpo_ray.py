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

The actors run grpo.py's own phases: the Generator calls grpo.collect (rollout + reward, dynamic sampling
included), the Learner grpo.train_step (pi_old, KL, epochs x microbatches, AdamW), and the driver logs
grpo.step_rows, so both trainers log the same keys (plus ray/*); every grpo.py flag works here.
Departures: a version is one trained rollout batch; a batch's lag = learner version - the version that
generated it; a stale batch (lag > 0: --steps-per-rollout k > 1, or --async) takes pi_old from the engine's
sampled log-probs (the engine is the only holder of that version), or, with --rollout-is, the learner's
current policy with the importance weight pi_old / mu correcting staleness and kernel mismatch together;
eval runs at start and end (plus every --eval-every versions); timestamps are each actor's time.time(), so
a multi-node timeline is only as good as the nodes' clock sync. --resume continues from the run's checkpoint.
Outputs in --out: args.json, metrics.jsonl, timeline.json, timeline.png, summary.json, dashboard.png, checkpoint/.

Examples:
  python grpo_ray.py --placement colocated --n-grpo-steps 20                    # Problem 5 on the demo model
  python grpo_ray.py --placement colocated --steps-per-rollout 4 --loss grpo_clip      # Problem 7 B
  python grpo_ray.py --placement disaggregated --async --loss grpo_clip                # Problem 8
  python grpo_ray.py --address auto --model Qwen/Qwen2.5-Math-1.5B --placement disaggregated --async \\
      --weight-sync nccl                                                        # 2 GPUs, Problem 9
"""
import copy
import json
import os
import time

import ray
import torch

import common
import data
import grpo
import losses
import rollout

ROOT = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    p = common.Parser(description="GRPO on Ray: colocated / disaggregated, sync / async (seed 004 §3).",
                      epilog="Every grpo.py flag is accepted as well (python grpo.py --help).")
    g = p.add_argument_group("placement")  # --- placement ---
    g.add_argument("--placement", default="colocated", choices=["colocated", "disaggregated"],
                   help="one actor with engine + learner, or a Generator and a Learner actor")
    g.add_argument("--async", dest="async_mode", action="store_true",
                   help="disaggregated only: generate batch t+1 while training on batch t")
    g.add_argument("--max-staleness", type=common.positive_int, default=1, help="--async: most versions a batch may lag")
    g.add_argument("--steps-per-rollout", type=int, default=1, choices=[1, 2, 4, 8],
                   help="colocated: k rollout batches per weight sync, then k steps (Problem 7 B)")
    g.add_argument("--weight-sync", default="object_store", choices=["object_store", "gloo", "nccl"],
                   help="disaggregated Learner->Generator transport: Ray object store or Ray Direct Transport")
    g = p.add_argument_group("ray")  # --- ray ---
    g.add_argument("--address", default=None, help="existing cluster (e.g. auto); default: start a local one")
    g.add_argument("--num-cpus", type=common.positive_int, default=2, help="CPUs of the local cluster")
    g.add_argument("--object-store-mb", type=common.positive_int, default=256, help="object store of the local cluster (MiB)")
    g.add_argument("--ray-tmp", default="/tmp/ray_grpo", help="session/log dir of the local cluster (short path)")
    g.add_argument("--cpus-per-actor", type=common.positive_float, default=1, help="num_cpus of each actor")
    g.add_argument("--gpus-per-actor", type=common.nonneg_float, default=None, help="num_gpus of each actor; default 1 with GPUs")
    g.add_argument("--timeout-s", type=common.positive_float, default=900, help="bound on every ray.get: a dead or hung actor raises")
    ray_args, rest = p.parse_known_args(argv)
    args = grpo.parse_args(rest)
    if args.resume:  # the placement flags of the resumed run too
        with open(os.path.join(args.resume, "state.json")) as f:
            common.resume_args(p, argv, ray_args, json.load(f)["args"], keep=())
    vars(args).update(vars(ray_args))
    # derived sizes and mode checks, each saying what to change
    k, c = args.steps_per_rollout, common.check
    c(k == 1 or args.placement == "colocated", "--steps-per-rollout > 1 is the colocated schedule (Problem 7)")
    c(k == 1 or args.loss in losses.RATIO_LOSSES, f"--steps-per-rollout {k} trains on stale batches: pass --loss grpo_clip")
    c(args.n_grpo_steps % k == 0, f"--n-grpo-steps {args.n_grpo_steps} must be a multiple of --steps-per-rollout {k}")
    c(not args.async_mode or args.placement == "disaggregated", "--async needs --placement disaggregated")
    c(not args.async_mode or args.loss in losses.RATIO_LOSSES, "--async trains on batches one version stale: "
      "pass --loss grpo_clip (a plain -A log pi would apply the old policy's samples uncorrected)")
    c(args.weight_sync == "object_store" or args.placement == "disaggregated",
      "--weight-sync gloo/nccl moves weights between two actors: use --placement disaggregated")
    c(args.weight_sync != "gloo" or args.engine == "hf", "--weight-sync gloo needs --engine hf: the in-process vLLM "
      "engine owns torch.distributed's default group, so Ray cannot build its torch_gloo group beside it")
    c(not args.sleep_engine, "--sleep-engine is grpo.py's single-GPU mode; Ray places engine and learner itself")
    args.staleness = args.max_staleness if args.async_mode else 0  # 0 = sync
    args.devices = 1 if args.placement == "colocated" else 2
    args.mode = (f"colocated-k{k}" if args.placement == "colocated" else
                 f"disaggregated-async-s{args.max_staleness}" if args.async_mode else "disaggregated-sync")
    return args


# ----------------------------------------------------------------------------- actors
def _span(phase, t0, step, t1=None):
    return {"phase": phase, "t0": t0, "t1": time.time() if t1 is None else t1, "step": step}


def _start(args):
    """(start weights, start version): the checkpoint of a resumed run, else the model at version 0."""
    if not args.resume:
        return args.model, 0
    with open(os.path.join(args.resume, "state.json")) as f:
        return args.resume, json.load(f)["step"]


class Generator:
    """Holds the rollout engine; one call = grpo.collect: a scored rollout batch of the engine's version."""

    def __init__(self, args):
        self.engine = None
        self.reset(args)

    def reset(self, args):
        """(Re)start a run on this actor: flags, data, start weights and version (tests and bench reuse actors)."""
        self.args = args = copy.copy(args)
        torch.manual_seed(args.seed)
        grpo.setup_devices(args)  # inside the actor: Ray has set CUDA_VISIBLE_DEVICES to its own GPU(s)
        self.train_rows, self.val_rows = grpo.load_data(args)
        path, self.engine_version = _start(args)  # the policy version whose weights the engine holds
        if self.engine is None:
            self.engine = grpo.make_engine(path, args)
        else:
            grpo.sync_weights(grpo.load_policy(path, args)[0].state_dict(), self.engine)
        return os.getpid()

    def generate(self, step):
        t0 = time.time()
        batch, metrics = grpo.collect(self.engine, self.train_rows, self.args, step)
        t_gen = t0 + metrics["time/generation"]  # collect times generation and grading apart
        return {"step": step, "version": self.engine_version, "batch": batch, "metrics": metrics,
                "spans": [_span("generate", t0, step, t_gen), _span("score", t_gen, step)]}

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
        common.check(version == self.engine_version, f"eval expected version {version}, engine holds {self.engine_version}")
        metrics, samples = grpo.evaluate(self.engine, self.val_rows, self.args)
        return {"version": version, "metrics": metrics, "samples": samples[:16], "spans": [_span("eval", t0, version)]}


class Learner:
    """Holds the policy, AdamW and, for KL, the frozen initial policy and the previous one (grpo.train_step's)."""

    def __init__(self, args):
        self.reset(args)

    def reset(self, args):
        self.args = args = copy.copy(args)
        torch.manual_seed(args.seed)
        grpo.setup_devices(args)
        path, self.version = _start(args)  # rollout batches trained on so far
        self.policy, self.tokenizer = grpo.load_policy(path, args)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
        if args.resume:
            grpo.load_checkpoint(args.resume, self.optimizer)
        kl = [grpo.load_policy(args.model, args, dtype=args.compute_dtype)[0].eval().requires_grad_(False)
              for _ in range((args.kl_beta > 0 or args.kl_every > 0) + (args.kl_every > 0))]
        self.ref, self.prev = (kl + [None, None])[:2]
        return os.getpid()

    def save(self, out_dir, state):
        return grpo.save_checkpoint(out_dir, self.policy, self.tokenizer, self.optimizer, self.args, state)

    def train(self, gen):
        """One rollout batch through grpo.train_step (lag = versions the batch is behind); version + 1."""
        t0, step, lag = time.time(), gen["step"], self.version - gen["version"]
        history, metrics = grpo.train_step(self.policy, self.optimizer, gen["batch"], self.args, step, self.ref, self.prev, lag)
        self.version += 1
        t_old = t0 + metrics["time/old_log_probs"]
        return {"step": step, "lag": lag, "version": self.version, "history": history, "metrics": metrics,
                "spans": [_span("old_log_probs", t0, step, t_old), _span("train", t_old, step)]}

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
    """Start (or join, with --address) a cluster once per process; workers get the engine's env vars."""
    if ray.is_initialized():
        return
    env = {"env_vars": {**rollout.ENGINE_ENV, "TOKENIZERS_PARALLELISM": "false"}}
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
                           f"{args.ray_tmp}/session_latest/logs; --resume {args.out} continues from the last checkpoint") from e


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
    common.claim_run_dir(args.out, args.resume)
    start, metrics_path = _start(args)[1], os.path.join(args.out, "metrics.jsonl")
    state = {"step": start, "opt_step": 0, "wall": 0.0, "spans": [], "rows": [], "last": time.time(), "sync_s": 0.0}
    if args.resume:
        with open(os.path.join(args.resume, "state.json")) as f:
            state.update({k: v for k, v in json.load(f).items() if k in ("opt_step", "wall")})
    data.write_jsonl_atomic(metrics_path, [r for r in common.read_metrics(metrics_path) if r["step"] < start])
    data.write_json_atomic(os.path.join(args.out, "args.json"), common.jsonable(vars(args)))
    os.makedirs(os.path.join(args.out, "rollouts"), exist_ok=True)
    _evaluate(args, actors, state, start)
    t_run = state["t_run"] = time.time() - state["wall"]
    if args.placement == "colocated":
        w, k = actors["colocated"], args.steps_per_rollout
        for t in range(start, args.n_grpo_steps, k):
            # --- rollout + reward: k batches from the engine at version t (grpo.collect) ---
            gens = [w.generate.remote(s) for s in range(t, t + k)]
            # --- train: one rollout batch per update; batch t + j is j versions stale (grpo.train_step) ---
            trains = [w.train.remote(g) for g in gens]
            # --- sync weights into the engine (in-process) ---
            sync = w.sync.remote()
            for g, tr in zip(get(gens, f"rollout steps {t}..{t + k - 1}", args), get(trains, f"train step {t}", args)):
                _log_step(args, state, g, tr, t_run, "colocated", "colocated")
            _add_spans(state, "colocated", get(sync, f"weight sync after step {t + k - 1}", args))
            _checkpoint_and_eval(args, actors, state, t + k, t_run)
    else:
        gen, lrn = actors["generator"], actors["learner"]
        transport = {} if args.weight_sync == "object_store" else {"tensor_transport": args.weight_sync}
        pending, pushed, nxt, sync = {}, start, start, None
        for t in range(start, args.n_grpo_steps):
            # --- rollout + reward: launch every batch the staleness bound allows (j needs version j - s pushed) ---
            while nxt < args.n_grpo_steps and nxt - args.staleness <= pushed:
                pending[nxt], nxt = gen.generate.remote(nxt), nxt + 1
            ref = pending.pop(t)
            g = get(ref, f"rollout step {t}", args)
            common.check(t - g["version"] <= args.staleness, f"batch {t} is {t - g['version']} versions stale")
            # --- old log-probs + train on the learner (the batch goes actor to actor, not through here) ---
            tr = get(lrn.train.remote(ref), f"train step {t}", args)
            # --- sync weights: learner -> generator, queued behind the generations already launched ---
            if sync is not None:
                _add_spans(state, "generator", get(sync, f"weight sync of version {pushed}", args))
            _log_step(args, state, g, tr, t_run, "generator", "learner")
            weights = lrn.get_weights.options(**transport).remote(clone=bool(transport))
            sync, pushed = gen.set_weights.remote(weights, tr["version"]), tr["version"]
            if _due(args, pushed):  # eval and checkpoint need the engine / learner at version `pushed`
                _add_spans(state, "generator", get(sync, f"weight sync of version {pushed}", args))
                sync = None
                _checkpoint_and_eval(args, actors, state, pushed, t_run)
        if sync is not None:
            _add_spans(state, "generator", get(sync, f"weight sync of version {pushed}", args))
    wall = time.time() - t_run
    _evaluate(args, actors, state, args.n_grpo_steps)
    _save(args, actors, state, args.n_grpo_steps, wall)
    summary = summarize(args, state["rows"], state["spans"], wall - state["wall"], args.n_grpo_steps - start)
    data.write_json_atomic(os.path.join(args.out, "timeline.json"), state["spans"])
    data.write_json_atomic(os.path.join(args.out, "summary.json"), summary)
    plot_timeline([(args.mode, state["spans"])], os.path.join(args.out, "timeline.png"))
    return summary


def _due(args, version):
    return version < args.n_grpo_steps and ((args.eval_every and version % args.eval_every == 0)
                                            or (args.save_every and version % args.save_every == 0))


def _checkpoint_and_eval(args, actors, state, version, t_run):
    """At a version where --eval-every / --save-every fall (not the last: run() does those)."""
    if version >= args.n_grpo_steps:
        return
    if args.eval_every and version % args.eval_every == 0:
        _evaluate(args, actors, state, version)
    if args.save_every and version % args.save_every == 0:
        _save(args, actors, state, version, time.time() - t_run)


def _save(args, actors, state, version, wall):
    learner = actors.get("learner", actors.get("colocated"))
    meta = {"step": version, "opt_step": state["opt_step"], "wall": wall}
    get(learner.save.remote(args.out, meta), f"checkpoint of version {version}", args)


def _add_spans(state, role, out):
    state["spans"].extend({"actor": role, **s} for s in out["spans"])


def _evaluate(args, actors, state, version):
    out = get(actors.get("generator", actors.get("colocated")).evaluate.remote(version), f"eval at version {version}", args)
    _add_spans(state, "generator" if "generator" in actors else "colocated", out)
    row = {"step": version, "opt_step": state["opt_step"], "time/wall": time.time() - state.get("t_run", time.time()),
           "time/eval": out["spans"][0]["t1"] - out["spans"][0]["t0"]}
    common.log_row(args.out, row | out["metrics"])
    data.write_jsonl_atomic(os.path.join(args.out, "rollouts", f"eval_v{version:04d}.jsonl"), out["samples"])
    print(f"eval version {version} | " + " | ".join(f"{k} {v:.3f}" for k, v in out["metrics"].items()), flush=True)


def _log_step(args, state, g, tr, t_run, gen_role, train_role):
    """grpo.step_rows (grpo.py's keys, one row per optimizer step) plus the Ray bookkeeping: version and lag."""
    _add_spans(state, gen_role, g)
    _add_spans(state, train_role, tr)
    now, syncs = time.time(), [s for s in state["spans"] if s["phase"] == "weight_sync"]
    ray_m = {"ray/lag": tr["lag"], "ray/version": tr["version"], "ray/gen_version": g["version"]}
    rows = grpo.step_rows(g["step"], state["opt_step"], g["batch"], tr["history"], g["metrics"] | tr["metrics"] | ray_m,
                          now - state["last"], syncs[-1]["t1"] - syncs[-1]["t0"] if syncs else 0.0, now - t_run)
    for row in rows:
        common.log_row(args.out, row)
    state["rows"] += rows
    state.update(last=now, opt_step=rows[-1]["opt_step"])
    d, h = {s["phase"]: s["t1"] - s["t0"] for s in g["spans"] + tr["spans"]}, rows[-1]
    print(f"[{args.mode}] step {g['step'] + 1}/{args.n_grpo_steps} | reward {h['train/reward']:.3f} | "
          f"loss {h['train/loss']:+.4f} | lag {tr['lag']} | gen {d['generate']:.2f}s score {d['score']:.2f}s "
          f"train {d['train']:.2f}s", flush=True)


# ----------------------------------------------------------------------------- profiling
def summarize(args, rows, spans, wall, steps):
    """Throughput, per-phase mean seconds per step, lags, device-hours (wall x devices) of this session's steps."""
    samples = steps * args.rollout_batch_size
    phases = {}
    for s in spans:
        if s["phase"] != "eval":
            phases.setdefault(s["phase"], []).append(s["t1"] - s["t0"])
    lags = list({r["step"]: r["ray/lag"] for r in rows if "ray/lag" in r}.values())  # one per rollout batch
    return {"mode": args.mode, "placement": args.placement, "async": args.async_mode, "max_staleness": args.staleness,
            "steps_per_rollout": args.steps_per_rollout, "weight_sync": args.weight_sync, "engine": args.engine,
            "steps": steps, "samples": samples, "wall_s": wall, "samples_per_s": samples / wall,
            "step_time_s": wall / max(steps, 1), "devices": args.devices,
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
    if args.dry_run:
        common.dry_run(args)  # the effective settings as one JSON line; no Ray, no model
    common.claim_run_dir(args.out, args.resume)  # before any actor starts
    init_ray(args)
    print(f"ray: {ray.cluster_resources()} | mode {args.mode} | {args.n_grpo_steps} steps x "
          f"{args.rollout_batch_size} samples | weight sync {args.weight_sync} | out {args.out}", flush=True)
    actors = build_actors(args)
    try:
        summary = run(args, actors)
    finally:
        kill_actors(actors)
    plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
    print(json.dumps({k: v for k, v in summary.items() if k != "lags"}))


if __name__ == "__main__":
    main(parse_args())
