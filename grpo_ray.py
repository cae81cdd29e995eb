"""GRPO as Ray actors (seed 004 §3): rollout engines and learners in one actor (--placement colocated, weights
synced by an in-process copy; --steps-per-rollout k: k batches from version v, k GRPO-Clip steps, one sync: Problem
7 B) or apart (disaggregated; sync, or --async: batch j starts once version j - --max-staleness is pushed, so no
batch lags more: Problem 8), every phase timed into a per-actor timeline. The actors run grpo.py's own phases
(grpo.collect, grpo.train_step) and the driver logs grpo.step_rows: the same keys as grpo.py (plus ray/*).
Scale-out: --num-generators N engines each sample a contiguous share of every step's groups, joined in shard order,
all at one policy version (checked); a version goes out as ONE object-store put that all N read. --num-learners M:
a data-parallel group (torch.distributed, gloo on CPU / NCCL on GPU) where each trains 1/M of every optimizer
step's rows and the gradients are all-reduced, so all M take one learner's step. Colocated, that actor is generator
0 and learner 0. Actors sit in one Ray placement group (--placement-strategy; --address auto joins a cluster); a
dead actor ends the run in one line naming it; Ctrl-C saves the steps logged; --resume continues. --weight-sync
gloo / nccl: Ray Direct Transport (one learner, one generator; nccl: Ray's documented API, NOT exercised in CI).
Departures: a version is one trained rollout batch; lag = learner version - generating version; a stale batch takes
pi_old from the engine's log-probs (the only holder of that version) or, with --rollout-is, the current policy with
pi_old / mu correcting staleness and kernel mismatch together; timestamps are each actor's clock.

  python grpo_ray.py --placement disaggregated --async --loss grpo_clip                # Problem 8
  python grpo_ray.py --address auto --model Qwen/Qwen2.5-Math-1.5B --placement disaggregated --async --loss grpo_clip \\
      --num-generators 6 --num-learners 2                       # 8 GPUs, on any nodes of the cluster
"""

import copy
import datetime
import json
import math
import os
import socket
import time

import ray
import torch

import common
import data
import grpo
import losses
import plot
import rollout

ROOT = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    p = common.Parser(
        description="GRPO on Ray: colocated / disaggregated, sync / async, N engines x M learners.",
        epilog="Every grpo.py flag is accepted as well (python grpo.py --help).",
    )
    pos, g = common.positive_int, p.add_argument_group("placement")  # --- placement ---
    g.add_argument(
        "--placement",
        default="colocated",
        choices=["colocated", "disaggregated"],
        help="one actor or apart",
    )
    g.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help="disaggregated: generate t+1 while training t",
    )
    g.add_argument(
        "--max-staleness", type=pos, default=1, help="--async: most versions a batch may lag"
    )
    g.add_argument(
        "--steps-per-rollout",
        type=int,
        default=1,
        choices=[1, 2, 4, 8],
        help="colocated: k batches per sync",
    )
    g.add_argument(
        "--weight-sync",
        default="object_store",
        choices=["object_store", "gloo", "nccl"],
        help="weight transport",
    )
    g.add_argument(
        "--num-generators",
        type=pos,
        default=1,
        help="rollout engines, each sampling its shard of a batch",
    )
    g.add_argument(
        "--num-learners", type=pos, default=1, help="data-parallel learners (a gloo / NCCL group)"
    )
    g = p.add_argument_group("ray")  # --- ray ---
    g.add_argument(
        "--address", default=None, help="existing cluster (e.g. auto); default: start a local one"
    )
    g.add_argument(
        "--placement-strategy",
        default="pack",
        choices=["pack", "spread"],
        help="placement group: few or many nodes",
    )
    g.add_argument(
        "--num-cpus",
        type=pos,
        default=None,
        help="CPUs of the local cluster; default: what the actors ask",
    )
    g.add_argument(
        "--object-store-mb", type=pos, default=256, help="object store of the local cluster (MiB)"
    )
    g.add_argument(
        "--ray-tmp",
        default="/tmp/ray_grpo",
        help="session/log dir of the local cluster (short path)",
    )
    g.add_argument(
        "--cpus-per-actor", type=common.positive_float, default=1, help="num_cpus of each actor"
    )
    g.add_argument(
        "--gpus-per-actor",
        type=common.nonneg_float,
        default=None,
        help="num_gpus of each actor; default 1 with GPUs",
    )
    g.add_argument(
        "--timeout-s",
        type=common.positive_float,
        default=900,
        help="bound on every ray.get: a dead or hung actor raises",
    )
    ray_args, rest = p.parse_known_args(argv)
    args = grpo.parse_args(rest)
    if args.resume:  # the placement flags of the resumed run too
        with open(os.path.join(args.resume, "state.json")) as f:
            common.resume_args(p, argv, ray_args, json.load(f)["args"], keep=())
    vars(args).update(vars(ray_args))
    # derived sizes and mode checks, each saying what to change
    k, c, N, M, colo = (
        args.steps_per_rollout,
        common.check,
        args.num_generators,
        args.num_learners,
        args.placement == "colocated",
    )
    c(
        (k == 1 or colo) and not (args.async_mode and colo),
        "--steps-per-rollout > 1 needs --placement colocated, --async disaggregated",
    )
    c(
        k == 1 or args.loss in losses.RATIO_LOSSES,
        f"--steps-per-rollout {k} trains on stale batches: pass --loss grpo_clip",
    )
    c(
        args.n_grpo_steps % k == 0,
        f"--n-grpo-steps {args.n_grpo_steps} must be a multiple of --steps-per-rollout {k}",
    )
    c(
        not args.async_mode or args.loss in losses.RATIO_LOSSES,
        "--async trains on stale batches: pass --loss grpo_clip",
    )
    c(
        args.weight_sync == "object_store" or (not colo and N == M == 1),
        "--weight-sync gloo/nccl moves weights from one "
        "learner actor to one generator actor: --placement disaggregated, or --weight-sync object_store with N or M > 1",
    )
    c(
        args.weight_sync != "gloo" or args.engine == "hf",
        "--weight-sync gloo needs --engine hf: the in-process vLLM "
        "engine owns torch.distributed's default group, so Ray cannot build its torch_gloo group beside it",
    )
    c(
        not args.sleep_engine,
        "--sleep-engine is grpo.py's single-GPU mode; Ray places engine and learner itself",
    )
    c(
        N <= args.n_prompts_per_rollout_batch,
        f"--num-generators {N} > {args.n_prompts_per_rollout_batch} prompts per rollout "
        "batch (--rollout-batch-size / --group-size): each engine needs a whole group",
    )
    c(
        M == 1 or not colo or args.engine == "hf",
        "--num-learners > 1 with --placement colocated needs --engine hf (the "
        "in-process vLLM engine owns torch.distributed's default group): or use --placement disaggregated",
    )
    args.devices = N + M - colo  # actors, a device (placement-group bundle) each
    c(
        args.address or not args.num_cpus or args.devices * args.cpus_per_actor <= args.num_cpus,
        f"{args.devices} actors x "
        f"{args.cpus_per_actor:g} CPU > --num-cpus {args.num_cpus}: raise --num-cpus (logical) or lower --cpus-per-actor",
    )
    args.staleness = (
        args.max_staleness if args.async_mode else k - 1
    )  # 0 = sync; colocated: batch t + j is j stale
    args.mode = (
        f"colocated-k{k}"
        if colo
        else f"disaggregated-async-s{args.max_staleness}"
        if args.async_mode
        else "disaggregated-sync"
    ) + (f"-N{N}M{M}" if N * M > 1 else "")
    return args


# ----------------------------------------------------------------------------- actor
def _span(actor, phase, t0, step, t1=None):
    return {
        "actor": actor,
        "phase": phase,
        "t0": t0,
        "t1": time.time() if t1 is None else t1,
        "step": step,
    }


def _start(args):
    """(start weights, {"step" (= version), "opt_step", "wall"}): a resumed run's checkpoint, else the model at 0."""
    if not args.resume:
        return args.model, {"step": 0, "opt_step": 0, "wall": 0.0}
    with open(os.path.join(args.resume, "state.json")) as f:
        return args.resume, json.load(f)


class Worker:
    """One actor: a rollout engine (generator), a learner (policy, AdamW, for KL the initial and previous policy), or
    both on one device (colocated: seed 004 §3.1's ColocatedWorker). name ("generator 1") labels its spans."""

    dp = None  # grpo.train_step's {"rank", "world", "reduce"} once init_dp has joined a learner group

    def __init__(self, args, name, generator, learner):
        self.name, self.generator, self.learner, self.engine = name, generator, learner, None
        self.reset(args)

    def reset(self, args):
        """(Re)start a run on this actor: flags, data, start weights and version (tests and bench reuse actors)."""
        self.args = args = copy.copy(args)
        torch.manual_seed(args.seed)
        grpo.setup_devices(
            args
        )  # inside the actor: Ray has set CUDA_VISIBLE_DEVICES to its own GPU(s)
        path, saved = _start(args)
        self.version = self.engine_version = saved[
            "step"
        ]  # batches the learner trained on; the engine's weights
        if (
            self.learner
        ):  # first: a colocated engine's memory share is sized from the policy beside it
            self.policy, self.tokenizer, self.optimizer, self.ref, self.prev = grpo.build_learner(
                args
            )
        if self.generator:
            self.train_rows, self.val_rows = grpo.load_data(args)
            if self.engine is None:
                self.engine = grpo.make_engine(path, args, self.policy if self.learner else None)
            else:
                rollout.load_policy_into_vllm(
                    grpo.load_policy(path, args)[0].state_dict(), self.engine
                )
        return os.getpid()

    def generate(self, step, shard=(0, 1)):
        t0 = time.time()
        batch, metrics = grpo.collect(self.engine, self.train_rows, self.args, step, shard)
        t_gen = t0 + metrics["time/generation"]  # collect times generation and grading apart
        return {
            "step": step,
            "version": self.engine_version,
            "batch": batch,
            "metrics": metrics,
            "spans": [
                _span(self.name, "generate", t0, step, t_gen),
                _span(self.name, "score", t_gen, step),
            ],
        }

    def set_weights(self, pushed, version):
        """Load a pushed state dict (Ray resolved it from the object store or by an RDT transfer) into the engine."""
        t0 = time.time()
        rollout.load_policy_into_vllm(
            pushed["weights"], self.engine
        )  # rollout.load_policy_into_vllm takes a state dict
        self.engine_version = version
        return {
            "version": version,
            "spans": pushed["spans"] + [_span(self.name, "weight_sync", t0, version - 1)],
        }

    def evaluate(self, version):
        t0 = time.time()
        common.check(
            version == self.engine_version,
            f"eval expected version {version}, engine holds {self.engine_version}",
        )
        a = self.args
        metrics, samples = common.greedy_eval(
            self.engine, self.val_rows, a.reward, a.max_tokens, a.min_tokens, a.grader_workers
        )
        return {
            "version": version,
            "metrics": metrics,
            "samples": samples[:16],
            "spans": [_span(self.name, "eval", t0, version)],
        }

    def dp_address(self):
        """(this node's IP, a free port): rank 0 hosts the learner group's TCP rendezvous."""
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def init_dp(self, address, rank, world):
        """Join the data-parallel learner group: this process's default torch.distributed group."""
        dev, dist = self.args.policy_device, torch.distributed
        dist.init_process_group(
            "nccl" if dev.startswith("cuda") else "gloo",
            init_method="tcp://%s:%d" % tuple(address),
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=self.args.timeout_s),
        )

        def reduce(
            t, op
        ):  # in place; NCCL reduces device tensors only, so CPU metric sums go over and back
            x = t.to(dev)
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op.upper()))
            return t.copy_(x)

        self.dp = {"rank": rank, "world": world, "reduce": reduce}

    def train(self, gen):
        """One rollout batch through grpo.train_step (lag = versions the batch is behind); version + 1."""
        t0, step, lag = time.time(), gen["step"], self.version - gen["version"]
        history, metrics = grpo.train_step(
            self.policy,
            self.optimizer,
            gen["batch"],
            self.args,
            step,
            self.ref,
            self.prev,
            lag,
            self.dp,
        )
        self.version += 1
        t_old = t0 + metrics["time/old_log_probs"]
        return {
            "step": step,
            "lag": lag,
            "version": self.version,
            "history": history,
            "metrics": metrics,
            "spans": [
                _span(self.name, "old_log_probs", t0, step, t_old),
                _span(self.name, "train", t_old, step),
            ],
        }

    def save(self, out_dir, state):
        return common.save_model_checkpoint(
            out_dir,
            self.policy,
            self.tokenizer,
            self.args,
            state,
            {"optimizer.pt": self.optimizer.state_dict()},
        )

    def get_weights(self, clone=False):
        """{"weights", "spans"} to push: a CPU copy, or clone=True for RDT (Ray keeps a reference, not a copy)."""
        t0 = time.time()
        sd = {
            k: (v.detach().clone() if clone else v.detach().cpu())
            for k, v in self.policy.state_dict().items()
        }
        return {"weights": sd, "spans": [_span(self.name, "get_weights", t0, self.version - 1)]}

    def sync(self):
        """Colocated: the policy into this actor's own engine, an in-process copy (no transport)."""
        return self.set_weights({"weights": self.policy.state_dict(), "spans": []}, self.version)


# ----------------------------------------------------------------------------- driver
def init_ray(args):
    """Start (or join, with --address) a cluster once per process; workers get the engine's env vars."""
    if ray.is_initialized():
        return
    env = {"env_vars": {**rollout.ENGINE_ENV, "TOKENIZERS_PARALLELISM": "false"}}
    if (
        args.address
    ):  # remote nodes need the code and the embedded model: ship the repo, not the venv
        env.update(working_dir=ROOT, excludes=[".venv/", ".git/", "runs/", "out/"])
    local = (
        {}
        if args.address
        else dict(
            num_cpus=args.num_cpus or math.ceil(args.devices * args.cpus_per_actor),
            include_dashboard=False,
            object_store_memory=args.object_store_mb * 2**20,
            _temp_dir=args.ray_tmp,
        )
    )
    ray.init(address=args.address, runtime_env=env, namespace="grpo_ray", **local)


def get(refs, what, args, actors=None):
    """ray.get bounded by --timeout-s, failing at the first failed ref: a hang or a dead actor becomes one line, the
    latter naming the actor (role and index, from actors["names"]) and why (Ray's error type and cause)."""
    todo, deadline = list(refs) if isinstance(refs, list) else [refs], time.time() + args.timeout_s
    try:
        while todo:
            done, todo = ray.wait(todo, timeout=max(deadline - time.time(), 0))
            if not done:
                raise RuntimeError(
                    f"grpo_ray: {what} did not finish within --timeout-s {args.timeout_s:g}s (hung or unschedulable)"
                )
            ray.get(done)
        return ray.get(refs)
    except ray.exceptions.RayError as e:
        ray.wait(
            todo, num_returns=len(todo), timeout=10
        )  # a dead learner fails its group's collectives: find the death
        dead = [
            x
            for x in [e] + [_error(r) for r in todo]
            if isinstance(x, ray.exceptions.RayActorError)
        ]
        if not dead:
            raise
        who, why = (
            (actors or {}).get("names", {}).get(dead[0].actor_id, "an actor"),
            str(dead[0]).strip().splitlines()[-1],
        )
        raise RuntimeError(
            f"grpo_ray: {who} died during {what} ({type(dead[0]).__name__}: {why.strip()[:160]}); logs "
            f"under {args.ray_tmp}/session_latest/logs; --resume {args.out} continues from the last checkpoint"
        ) from e


def _error(ref):
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayError as e:  # GetTimeoutError too: still running
        return e


def build_actors(args):
    """{"generator": N handles, "learner": M handles, "all", "names", "pg"}: one placement-group bundle per actor,
    engines and policies loaded, the learner group joined. Colocated: generator 0 is learner 0."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as InGroup

    N, M, colo = args.num_generators, args.num_learners, int(args.placement == "colocated")
    gpus = (
        args.gpus_per_actor
        if args.gpus_per_actor is not None
        else float(ray.cluster_resources().get("GPU", 0) > 0)
    )
    specs = (
        [("colocated", True, True)] * colo
        + [(f"generator {i}", True, False) for i in range(colo, N)]
        + [(f"learner {r}", False, True) for r in range(colo, M)]
    )  # (name, generator, learner)
    bundle = {"CPU": args.cpus_per_actor} | ({"GPU": gpus} if gpus else {})
    pg = ray.util.placement_group([bundle] * len(specs), strategy=args.placement_strategy.upper())
    get(pg.ready(), f"placement group of {len(specs)} x {bundle} ({args.placement_strategy})", args)
    cls = ray.remote(enable_tensor_transport=args.weight_sync != "object_store")(
        Worker
    )  # RDT: set on the class
    handles = [
        cls.options(
            num_cpus=args.cpus_per_actor, num_gpus=gpus, scheduling_strategy=InGroup(pg, i)
        ).remote(args, *spec)
        for i, spec in enumerate(specs)
    ]
    actors = {
        "generator": handles[:N],
        "learner": handles[:colo] + handles[N:],
        "all": handles,
        "pg": pg,
        "names": {h._actor_id.hex(): spec[0] for h, spec in zip(handles, specs)},
    }
    get(
        [a.__ray_ready__.remote() for a in handles],
        "actor start-up (engine / policy load)",
        args,
        actors,
    )
    if M > 1:  # the data-parallel group: rank 0 picks the rendezvous, all M join it at once
        address = actors["learner"][0].dp_address.remote()
        get(
            [a.init_dp.remote(address, r, M) for r, a in enumerate(actors["learner"])],
            "learner group start-up",
            args,
            actors,
        )
    if (
        args.weight_sync != "object_store"
    ):  # RDT: collective transports need a group first (ranks: learner 0)
        from ray.experimental.collective import create_collective_group

        create_collective_group(actors["learner"] + actors["generator"], backend=args.weight_sync)
    return actors


def kill_actors(actors):
    from ray.experimental.collective import destroy_collective_group, get_collective_groups

    for group in get_collective_groups(actors["all"]):  # RDT: no half-done transfer to report
        destroy_collective_group(group)
    for a in actors["all"]:
        ray.kill(a)
    ray.util.remove_placement_group(actors["pg"])


def join_shards(shards):
    """One step's rollout batch from its generators' shards, in shard order: lists and tensors concatenated,
    collect's metrics combined (means weighted by rows, the filtered fraction by prompts sampled; *_max and the
    times, which ran in parallel, the max; prompts sampled summed). All shards must share one policy version."""
    versions, rows = (
        sorted({s["version"] for s in shards}),
        [len(s["batch"]["raw"]) for s in shards],
    )
    common.check(
        len(versions) == 1,
        f"step {shards[0]['step']}: its shards come from policy versions {versions}, not one",
    )
    batch = {
        k: v
        if k == "ban_token_ids"
        else torch.cat([s["batch"][k] for s in shards])
        if torch.is_tensor(v)
        else [x for s in shards for x in s["batch"][k]]
        for k, v in shards[0]["batch"].items()
    }
    metrics = {}
    for k in shards[0]["metrics"]:
        vals = [s["metrics"][k] for s in shards]
        w = (
            [s["metrics"]["train/dynamic_prompts_sampled"] for s in shards]
            if k == "train/dynamic_filtered_frac"
            else rows
        )
        metrics[k] = (
            max(vals)
            if k.endswith("_max") or k.startswith("time/")
            else sum(vals)
            if k.endswith("_sampled")
            else sum(v * n for v, n in zip(vals, w)) / sum(w)
        )
    return {
        "step": shards[0]["step"],
        "version": versions[0],
        "batch": batch,
        "metrics": metrics,
        "spans": [sp for s in shards for sp in s["spans"]],
    }


def _push(actors, version, transport):
    """Version `version` into every engine (refs): the colocated one in-process, the others from ONE put of learner 0's."""
    lead, gens = actors["learner"][0], actors["generator"]
    syncs, others = (
        [lead.sync.remote()] if gens[0] is lead else [],
        [g for g in gens if g is not lead],
    )
    if others:
        weights = lead.get_weights.options(**transport).remote(clone=bool(transport))
        syncs += [g.set_weights.remote(weights, version) for g in others]
    return syncs


def run(args, actors):
    """The driver loop (single controller). Returns the summary; writes metrics, timeline and summary to --out."""
    common.claim_run_dir(args.out, args.resume)
    saved = (
        common.restore_checkpoint(args.resume, args.out) if args.resume else _start(args)[1]
    )  # metrics cut back to it
    data.write_json_atomic(os.path.join(args.out, "args.json"), common.jsonable(vars(args)))
    start, state = (
        saved["step"],
        {
            "opt_step": saved["opt_step"],
            "wall": saved["wall"],
            "spans": [],
            "rows": [],
            "last": time.time(),
        },
    )
    _evaluate(args, actors, state, start)
    state["t_run"] = t_run = (
        time.time() - state["wall"]
    )  # time/wall: the eval before the first step not counted
    gens, n, s = actors["generator"], args.n_grpo_steps, args.staleness
    transport = {} if args.weight_sync == "object_store" else {"tensor_transport": args.weight_sync}
    pending, pushed, nxt, syncs = {}, start, start, []
    state.update(done=start, dirty=False)
    try:
        for t in range(start, n):
            # --- rollout + reward: launch every batch the staleness bound allows (j needs version j - s pushed; the
            # colocated k-schedule is s = k - 1), each generator sampling its shard; shards joined in order ---
            while nxt < n and nxt - s <= pushed:
                pending[nxt], nxt = (
                    [g.generate.remote(nxt, (i, len(gens))) for i, g in enumerate(gens)],
                    nxt + 1,
                )
            g = join_shards(get(pending.pop(t), f"rollout step {t}", args, actors))
            common.check(t - g["version"] <= s, f"batch {t} is {t - g['version']} versions stale")
            # --- old log-probs + train: every learner reads the batch from one put and trains its share of it ---
            batch = ray.put(g)
            with common.finish_then_interrupt(
                f"train step {t}"
            ):  # a first Ctrl-C: this step is trained and logged
                state["dirty"] = True
                trs = get(
                    [a.train.remote(batch) for a in actors["learner"]],
                    f"train step {t}",
                    args,
                    actors,
                )
                syncs = _synced(
                    args, actors, state, syncs, pushed
                )  # the previous push: done by now
                _log_step(args, state, g, trs, t_run)
                state.update(done=t + 1, dirty=False)
            # --- sync weights after every k-th batch, queued behind the generations already launched ---
            if (t + 1) % args.steps_per_rollout == 0:
                syncs, pushed = _push(actors, trs[0]["version"], transport), trs[0]["version"]
                syncs = _checkpoint_and_eval(args, actors, state, syncs, pushed, t_run)
    except (
        KeyboardInterrupt
    ):  # save the steps logged so far (a second Ctrl-C inside a step: nothing saved)
        if state["dirty"]:
            raise SystemExit(
                f"\naborted inside train step {state['done']}: nothing saved; --resume {args.out} restarts "
                f"from the last checkpoint"
            )
        _save(args, actors, state, state["done"], time.time() - t_run)
        print(
            f"\ninterrupted: checkpoint saved after step {state['done']}; continue with --resume {args.out}",
            flush=True,
        )
        raise SystemExit(130)  # the shell's code for Ctrl-C, after the save
    _synced(args, actors, state, syncs, pushed)
    wall = time.time() - t_run
    _evaluate(args, actors, state, n)
    _save(args, actors, state, n, wall)
    summary = summarize(args, state["rows"], state["spans"], wall - state["wall"], n - start)
    for name, obj in (("timeline.json", state["spans"]), ("summary.json", summary)):
        data.write_json_atomic(os.path.join(args.out, name), obj)
    plot.plot_timeline([(args.mode, state["spans"])], os.path.join(args.out, "timeline.png"))
    return summary


def _synced(args, actors, state, syncs, version):
    """Wait for a push; keep its spans (the learner's get_weights span comes back from all N readers: once)."""
    outs = get(syncs, f"weight sync of version {version}", args, actors)
    state["spans"] += list(
        {(s["actor"], s["phase"], s["t0"]): s for out in outs for s in out["spans"]}.values()
    )
    return []


def due(every, version, k):
    """Does a multiple of `every` (0: never) fall in (version - k, version], the steps since the previous push?"""
    return bool(every) and version // every > (version - k) // every


def _checkpoint_and_eval(args, actors, state, syncs, version, t_run):
    """At the first push at or past each multiple of --eval-every / --save-every (pushes come every k steps; not the
    last version: run() does those), once the engines hold it."""
    ev, sv = (
        due(every, version, args.steps_per_rollout) and version < args.n_grpo_steps
        for every in (args.eval_every, args.save_every)
    )
    syncs = _synced(args, actors, state, syncs, version) if ev or sv else syncs
    if ev:
        _evaluate(args, actors, state, version)
    if sv:
        _save(args, actors, state, version, time.time() - t_run)
    return syncs


def _save(args, actors, state, version, wall):
    meta = {
        "step": version,
        "opt_step": state["opt_step"],
        "wall": wall,
    }  # the learners are in lockstep: rank 0 saves
    get(
        actors["learner"][0].save.remote(args.out, meta),
        f"checkpoint of version {version}",
        args,
        actors,
    )


def _evaluate(args, actors, state, version):
    t0 = time.time()
    out = get(
        actors["generator"][0].evaluate.remote(version), f"eval at version {version}", args, actors
    )
    state["spans"] += out["spans"]
    row = {
        "step": version,
        "opt_step": state["opt_step"],
        "time/wall": time.time() - state.get("t_run", time.time()),
        "time/eval": out["spans"][0]["t1"] - out["spans"][0]["t0"],
    }
    common.log_row(args.out, row | out["metrics"])
    data.write_jsonl_atomic(
        os.path.join(args.out, "rollouts", f"eval_v{version:04d}.jsonl"), out["samples"]
    )
    print(
        f"eval version {version} | "
        + " | ".join(f"{k} {v:.3f}" for k, v in out["metrics"].items()),
        flush=True,
    )
    state["last"] += time.time() - t0  # the next row's time/step: not this eval (as in grpo.py)


def _log_step(args, state, g, trs, t_run):
    """grpo.step_rows (grpo.py's keys, one row per optimizer step) plus the Ray bookkeeping: version and lag."""
    state["spans"] += [sp for out in [g] + trs for sp in out["spans"]]
    tr, now = trs[0], time.time()  # every learner took the same step: learner 0's numbers
    syncs = [s for s in state["spans"] if s["phase"] == "weight_sync"]
    ray_m = {"ray/lag": tr["lag"], "ray/version": tr["version"], "ray/gen_version": g["version"]}
    rows = grpo.step_rows(
        g["step"],
        state["opt_step"],
        g["batch"],
        tr["history"],
        g["metrics"] | tr["metrics"] | ray_m,
        now - state["last"],
        syncs[-1]["t1"] - syncs[-1]["t0"] if syncs else 0.0,
        now - t_run,
    )
    for row in rows:
        common.log_row(args.out, row)
    state["rows"] += rows
    state.update(last=now, opt_step=rows[-1]["opt_step"])
    print(
        f"[{args.mode}] {grpo.step_line(g['step'], args, rows[-1])} | lag {tr['lag']}", flush=True
    )


# ----------------------------------------------------------------------------- profiling
def summarize(args, rows, spans, wall, steps):
    """Throughput, per-phase mean seconds per step, lags, device-seconds (wall x actors) of this session's steps."""
    phases, samples = {}, steps * args.rollout_batch_size
    for s in (s for s in spans if s["phase"] != "eval"):
        phases.setdefault(s["phase"], []).append(s["t1"] - s["t0"])
    lags = list(
        {r["step"]: r["ray/lag"] for r in rows if "ray/lag" in r}.values()
    )  # one per rollout batch
    return {
        k: getattr(args, k)
        for k in ("mode", "weight_sync", "engine", "num_generators", "num_learners", "devices")
    } | {
        "steps": steps,
        "samples": samples,
        "wall_s": wall,
        "samples_per_s": samples / wall,
        "step_time_s": wall / max(steps, 1),
        "device_s": wall * args.devices,
        "lags": lags,
        "max_lag": max(lags, default=0),
        "phase_mean_s": {k: sum(v) / len(v) for k, v in phases.items()},
        "phase_total_s": {k: sum(v) for k, v in phases.items()},
    }


# ----------------------------------------------------------------------------- main
def main(args):
    if args.dry_run:
        common.dry_run(args)  # the effective settings as one JSON line; no Ray, no model
    grpo.load_data(
        args
    )  # bad data: one line now, not a traceback from an actor once Ray and the policy are up
    common.claim_run_dir(args.out, args.resume)  # before any actor starts
    init_ray(args)
    print(
        f"ray: {ray.cluster_resources()} | mode {args.mode} | {args.n_grpo_steps} steps x {args.rollout_batch_size} "
        f"samples | weight sync {args.weight_sync} | out {args.out}",
        flush=True,
    )
    actors = build_actors(args)
    try:
        summary = run(args, actors)
    finally:
        kill_actors(actors)
        ray.shutdown()  # flushes the actors' forwarded log lines: the JSON below is the last line of stdout
    plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
    print(json.dumps({k: v for k, v in summary.items() if k != "lags"}))


if __name__ == "__main__":
    main(parse_args())
