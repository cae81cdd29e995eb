"""GRPO as Ray actors (seed 004 §3): the rollout engines and the learners run grpo.py's own phases
(grpo.collect, grpo.train_step) inside Ray actors, and the driver logs grpo.step_rows: the same keys
as grpo.py, plus ray/*. Every phase is timed into a per-actor timeline.

Placement:
- colocated: engine and learner in one actor, taking turns; weights synced by an in-process copy.
  --steps-per-rollout k: k batches from version v, k GRPO-Clip steps, one sync (Problem 7 B).
- disaggregated: engines and learners apart; synchronous, or --async: batch j starts once version
  j - --max-staleness is pushed, so no batch lags more (Problem 8).

Scale-out: --num-generators N engines each sample a contiguous share of every step's groups, joined
in shard order, all at one policy version (checked), then summarised once by the driver
(grpo.summarize: the metrics of the whole batch; every learner computes its advantages in
grpo.train_step's rewards -> advantages phase, the same ones); a version goes out as ONE
object-store put that every engine without a learner beside it reads. --num-learners M: a
data-parallel group where each trains 1/M of every optimizer step's rows and the gradients are
all-reduced, so all M take one learner's step. The group is a torch.distributed process group of its
own (gloo on CPU / NCCL on GPU), not the default group, which an in-process vLLM engine owns.
Colocated, actor i is generator i and learner i for i < min(N, M) (N = M is verl's layout: an engine
and a learner shard per device, taking turns); each such engine copies the weights of the learner
beside it (the learners are in lockstep).
--learner-sharding fsdp (disaggregated, M >= 2): the learners own the default group and shard the
policy, its gradients and AdamW state and the frozen copies with FSDP2 (sharding.py), so each holds
1/M; every learner joins each push's gather and saves its own shard of each checkpoint.
The actors sit in one Ray placement group (--placement-strategy; --address auto joins a cluster);
each applies grpo.py's --threads (default: Ray's OMP_NUM_THREADS = the actor's CPUs). A dead actor
ends the run in one line naming it and its logs; Ctrl-C or SIGTERM saves the steps logged (exit
130 / 143); --resume continues. --address fails in one line when no cluster answers within
--connect-timeout-s.
--tools python / calculator: each generator runs grpo.py's multi-turn rollout with a tool of its own
(a python tool's sandbox pool lives in that actor's process); the policy masks travel with the
joined batch, so every learner leaves tool output out of the loss, as grpo.py does.
--weight-sync gloo / nccl: Ray Direct Transport (one learner, one generator; nccl is Ray's
documented API, NOT exercised in CI).
--curriculum (grpo.Curriculum): the driver holds the run's one sampler; it chooses a step's prompts
when it launches the step, hands them to every generator, and learns from the joined batch.

Departures from the seed: a version is one trained rollout batch; lag = learner version -
generating version; a stale batch takes pi_old from the engine's log-probs (the only holder of that
version) or, with --rollout-is, the current policy, with pi_old / mu correcting staleness and kernel
mismatch together; timestamps are each actor's own clock.

  python grpo_ray.py --placement colocated --steps-per-rollout 4 --loss grpo_clip     # Problem 7 B
  python grpo_ray.py --placement disaggregated --async --loss grpo_clip                # Problem 8
  python grpo_ray.py --placement disaggregated --num-generators 2 --tools calculator
  python grpo_ray.py --address auto --model Qwen/Qwen2.5-Math-1.5B-Instruct \\
      --placement disaggregated --async --loss grpo_clip \\
      --num-generators 6 --num-learners 2                            # 8 GPUs, on any nodes
  python grpo_ray.py --address auto --model Qwen/Qwen2.5-Math-1.5B-Instruct \\
      --placement colocated --num-generators 8 --num-learners 8      # 8 GPUs, engine + learner each
  python grpo_ray.py --address auto --model Qwen/Qwen2.5-Math-7B --placement disaggregated \\
      --num-generators 4 --num-learners 4 --learner-sharding fsdp     # 7B: a quarter per learner
"""

import datetime
import json
import math
import os
import shutil
import socket
import threading
import time

import ray
import torch

import common
import data
import grpo
import lora
import losses
import plot
import rollout
import runs
import sharding
import tools
import validation

ROOT = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    p = common.Parser(
        description="GRPO on Ray: colocated / disaggregated, sync / async, N engines x M learners.",
        epilog="Every grpo.py flag is accepted as well (python grpo.py --help).",
    )
    pos = common.positive_int

    g = p.add_argument_group("placement")
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
    g.add_argument(
        "--learner-sharding",
        default="replicate",
        choices=["replicate", "fsdp"],
        help="each learner a whole copy, or 1/M of weights, gradients, AdamW (FSDP2)",
    )

    g = p.add_argument_group("ray")
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
    g.add_argument(
        "--connect-timeout-s",
        type=common.positive_float,
        default=30,
        help="--address: a cluster must answer within this, else one line",
    )

    ray_args, rest = p.parse_known_args(argv)
    args = grpo.parse_args(rest)  # every other flag is grpo.py's
    if args.resume:  # the placement flags of the resumed run too
        with open(os.path.join(args.resume, "state.json")) as f:
            saved = json.load(f)
        runs.resume_args(p, argv, ray_args, saved["args"], keep=())
    vars(args).update(vars(ray_args))
    return resolve(args)


def resolve(args):
    """The mode checks, each a one-line error saying what to change, and the derived settings:
    devices (actors), staleness (versions a batch may lag) and mode (its name)."""
    k = args.steps_per_rollout
    N = args.num_generators
    M = args.num_learners
    colocated = args.placement == "colocated"
    if args.resume:
        check_resumed_sharding(args)
    if args.learner_sharding == "fsdp":
        check_sharding(args)
    common.check(
        (k == 1 or colocated) and not (args.async_mode and colocated),
        "--steps-per-rollout > 1 needs --placement colocated, --async disaggregated",
    )
    ratio_losses = ", ".join(losses.RATIO_LOSSES)
    common.check(
        k == 1 or losses.LOSSES[args.loss].needs_old,
        f"--steps-per-rollout {k} trains on stale batches: pass a --loss with a ratio "
        f"({ratio_losses})",
    )
    common.check(
        args.n_grpo_steps % k == 0,
        f"--n-grpo-steps {args.n_grpo_steps} must be a multiple of --steps-per-rollout {k}",
    )
    common.check(
        not args.async_mode or losses.LOSSES[args.loss].needs_old,
        f"--async trains on stale batches: pass a --loss with a ratio ({ratio_losses})",
    )
    common.check(
        args.weight_sync == "object_store" or (not colocated and N == M == 1),
        "--weight-sync gloo/nccl moves weights from one learner actor to one generator actor: "
        "--placement disaggregated, or --weight-sync object_store with N or M > 1",
    )
    common.check(
        args.weight_sync != "gloo" or args.engine == "hf",
        "--weight-sync gloo needs --engine hf: the in-process vLLM engine owns torch.distributed's "
        "default group, so Ray cannot build its torch_gloo group beside it",
    )
    common.check(
        not args.sleep_engine,
        "--sleep-engine is grpo.py's single-GPU mode; Ray places engine and learner itself",
    )
    if args.learner_sharding == "fsdp":
        # FSDP2 gathers a layer again for its backward when the gradient reaches the layer's
        # output; the shared prefix's reaches the prefix pass's layers through the KV cache, where
        # no hook sees it, so sharded learners run each row whole
        args.shared_prefix = False
    common.check(
        N <= args.n_prompts_per_rollout_batch,
        f"--num-generators {N} > {args.n_prompts_per_rollout_batch} prompts per rollout "
        "batch (--rollout-batch-size / --group-size): each engine needs a whole group",
    )

    # actors, a device (placement-group bundle) each; colocated, min(N, M) of them hold both roles
    args.devices = len(actor_specs(args))
    common.check(
        args.address or not args.num_cpus or args.devices * args.cpus_per_actor <= args.num_cpus,
        f"{args.devices} actors x {args.cpus_per_actor:g} CPU > --num-cpus {args.num_cpus}: "
        "raise --num-cpus (logical) or lower --cpus-per-actor",
    )

    # versions a batch may lag: 0 = sync; colocated, batch t + j of a k-schedule is j stale
    if args.async_mode:
        args.staleness = args.max_staleness
    else:
        args.staleness = k - 1

    # the mode's name in logs, summaries and the timeline
    if colocated:
        args.mode = f"colocated-k{k}"
    elif args.async_mode:
        args.mode = f"disaggregated-async-s{args.max_staleness}"
    else:
        args.mode = "disaggregated-sync"
    if N * M > 1:
        args.mode += f"-N{N}M{M}"
    if args.learner_sharding == "fsdp":
        args.mode += "-fsdp"
    return args


def check_sharding(args):
    """--learner-sharding fsdp's refusals, each a one-line error naming the fix."""
    M = args.num_learners
    common.check(
        args.placement == "disaggregated",
        "--learner-sharding fsdp needs --placement disaggregated: the learners shard over "
        "torch.distributed's default group, which a colocated actor's vLLM engine owns",
    )
    common.check(
        M >= 2, "--learner-sharding fsdp shards over the learners: --num-learners 2 or more"
    )
    common.check(
        not args.lora_rank,
        "--learner-sharding fsdp shards whole models; LoRA's adapters are small: drop "
        "--lora-rank or use --learner-sharding replicate",
    )
    common.check(
        args.weight_sync == "object_store",
        "--learner-sharding fsdp pushes weights through the object store (every learner gathers "
        "them): --weight-sync object_store",
    )
    common.check(
        args.shared_prefix is not True,
        "--learner-sharding fsdp runs each row whole (FSDP2 does not see the shared prefix's "
        "gradient through the KV cache): drop --shared-prefix",
    )
    common.check(
        not args.keep_checkpoints,
        "--learner-sharding fsdp checkpoints shards, not models: drop --keep-checkpoints (the "
        "run's final checkpoint holds the whole model)",
    )


def check_resumed_sharding(args):
    """A resumed checkpoint's layout must be this run's: a sharded one (runs.SHARDS_FILE names its
    learner count) resumes with fsdp and as many learners, a whole model with replicate."""
    manifest = common.read_json(os.path.join(args.resume, runs.SHARDS_FILE), "learners")
    if manifest is None:
        common.check(
            args.learner_sharding == "replicate",
            f"--resume {args.resume} holds a whole model: resume it with --learner-sharding "
            "replicate",
        )
        return
    M = manifest["learners"]
    common.check(
        args.learner_sharding == "fsdp" and args.num_learners == M,
        f"--resume {args.resume} holds the shards of {M} learners: resume it with "
        f"--learner-sharding fsdp --num-learners {M}",
    )


# ----------------------------------------------------------------------------- actor
def _span(actor, phase, t0, step, t1=None):
    """One bar of the timeline: `actor` ran `phase` of `step` from t0 to t1 (default: now)."""
    if t1 is None:
        t1 = time.time()
    return {"actor": actor, "phase": phase, "t0": t0, "t1": t1, "step": step}


def _start(args):
    """(start weights, {"step" (= version), "opt_step", "wall"}): a resumed run's checkpoint, else
    the model at step 0."""
    if not args.resume:
        return args.model, {"step": 0, "opt_step": 0, "wall": 0.0}
    with open(os.path.join(args.resume, "state.json")) as f:
        return args.resume, json.load(f)


class Worker:
    """One actor: a rollout engine (generator), a learner (policy, AdamW and, for KL, the initial
    and previous policy), or both on one device (colocated: seed 004 §3.1's ColocatedWorker).
    name ("generator 1") labels its spans."""

    # grpo.train_step's {"rank", "world", "reduce", "sharded"} once init_dp has joined a learner
    # group; with --learner-sharding fsdp, also the group's DeviceMesh
    dp = None
    mesh = None

    def __init__(self, args, name, generator, learner):
        self.name = name
        self.is_generator = generator  # holds a rollout engine
        self.is_learner = learner  # holds a policy and its optimizer
        self.learner = None  # grpo.build_learner's dict
        self.engine = None
        self.tool = None  # a generator's tools.Tool (--tools), else None
        self.reset(args)

    def reset(self, args):
        """(Re)start a run on this actor: flags, data, start weights and version (the tests and the
        bench reuse actors across runs)."""
        self.args = args
        # when this actor's last call ended: an RDT weight_sync span starts no earlier
        self.free_at = time.time()
        torch.manual_seed(args.seed)
        # inside the actor: Ray has set CUDA_VISIBLE_DEVICES to its own GPU(s)
        self.runtime = grpo.setup_runtime(args)
        saved = _start(args)[1]
        self.version = saved["step"]  # batches the learner trained on
        self.engine_version = saved["step"]  # the version of the engine's weights
        # the learner first: a colocated engine's memory share is sized from the policy beside it
        beside = None  # colocated: the policy in this actor
        if self.is_learner:
            self.learner = None
            if args.learner_sharding == "replicate":
                self.learner = grpo.build_learner(args, self.runtime)
                beside = self.learner["policy"]
            elif self.dp is not None:  # a reused actor: its group and mesh are up
                common.check(
                    self.mesh is not None,
                    f"{self.name}: its learner group was built unsharded: build new actors",
                )
                self.learner = grpo.build_learner(args, self.runtime, self.mesh)
            # else: init_dp builds the sharded learner, once the group's mesh exists
        if self.is_generator:
            # in the run dir on this actor's node; its WARNINGs reach the driver's console via Ray
            log = f"engine_{self.name.replace(' ', '_')}.log"
            rollout.engine_log(os.path.join(args.out, log))
            self.train_rows, self.val_rows = grpo.load_data(args)
            # the run's tool in this actor, so a python tool's sandbox pool lives in this process.
            # Its bubblewrap probe (args.tool_isolated) ran on the driver: on a remote node without
            # bwrap the first python call fails, not the start-up
            self.close()  # a reused actor: the previous run's pool
            self.tool = tools.make(args)
            # a LoRA checkpoint holds the adapter: the engine starts from the base, then takes the
            # merged weights
            stale = bool(args.resume and args.lora_rank)
            path = lora.model_path(args)
            if args.learner_sharding == "fsdp":
                path = args.model  # a sharded checkpoint: run() pushes the learners' weights first
            if self.engine is None:
                self.engine = grpo.make_engine(path, args, self.runtime, beside)
            else:  # a reused actor: its engine takes the new run's start weights
                stale = True
            if stale:
                dtype = (
                    None  # the master-weight dtype, as the learners load it (grpo.build_learner)
                )
                if args.lora_rank:
                    dtype = self.runtime["compute_dtype"]
                policy = grpo.load_policy(path, args, self.runtime, dtype)[0]
                policy = lora.wrap(policy, args)  # LoRA: the adapter from --resume
                rollout.load_policy_into_vllm(policy, self.engine)
        return os.getpid()

    def close(self):
        """Close the tool's sandbox pool, if any (a reused actor's reset, and the driver before
        it kills the actors)."""
        if self.tool is not None:
            self.tool.close()
        self.tool = None

    def runtime_record(self):
        """What this actor decided at run time (grpo.setup_runtime, after loading its models)."""
        return self.runtime

    def generate(self, step, shard=(0, 1), picks=None):
        """This engine's shard (i, n) of step `step`'s rollout batch, graded (grpo.collect; with
        the run's tool, multi-turn: the batch holds grpo.TOOL_KEYS' columns, its policy masks
        among them). picks: the step's prompts as the driver's curriculum chose them, else None
        (collect's own draw)."""
        t0 = time.time()
        batch, stats = grpo.collect(
            self.engine, self.train_rows, self.args, step, shard, tool=self.tool, picks=picks
        )
        t_gen = t0 + stats["generation_s"]  # collect times generation and grading apart
        spans = [
            _span(self.name, "generate", t0, step, t_gen),
            _span(self.name, "score", t_gen, step),
        ]
        self.free_at = spans[-1]["t1"]
        return {
            "step": step,
            "version": self.engine_version,
            "batch": batch,
            "stats": stats,
            "spans": spans,
        }

    def set_weights(self, pushed, version):
        """Load a version pushed by learner 0 into the engine. Its weight_sync span
        (time/weight_sync) holds the transfer and the load; the learner's copy is its own
        get_weights span.
        pushed: [ref] to learner 0's put (object store): wrapped in a list, so Ray leaves the fetch
        and deserialisation to this call, timed once the put exists. Or the state dict itself (Ray
        Direct Transport): Ray starts the receive in a thread of its own when the push is submitted
        and ends it before this call starts (ray.get refuses gloo / nccl refs, and an RDT ref cannot
        travel inside a list), so the span starts when the engine was free and the learner's copy
        existed (the learner's clock): it holds the part of the receive the engine waited for."""
        if isinstance(pushed, list):
            ray.wait(pushed, fetch_local=False)  # learner 0's copy exists (nothing fetched yet)
            t0 = time.time()
            pushed = ray.get(pushed[0])
        else:
            made = pushed["spans"][0]["t1"]  # the end of learner 0's get_weights span
            t0 = max(self.free_at, made)
        return self._load(pushed, version, t0)

    def _load(self, pushed, version, t0):
        """The pushed state dict into the engine; the weight_sync span runs from t0 to now."""
        # rollout.load_policy_into_vllm takes a state dict
        rollout.load_policy_into_vllm(pushed["weights"], self.engine)
        self.engine_version = version
        sync = _span(self.name, "weight_sync", t0, version - 1)
        self.free_at = sync["t1"]
        return {"version": version, "spans": pushed["spans"] + [sync]}

    def evaluate(self, version):
        """Greedy (and --eval-samples) validation with the engine, which must hold `version`, and
        the run's tool, if any."""
        t0 = time.time()
        common.check(
            version == self.engine_version,
            f"eval expected version {version}, engine holds {self.engine_version}",
        )
        a = self.args
        metrics, samples = validation.greedy_eval(
            self.engine,
            self.val_rows,
            a.reward,
            a.max_tokens,
            a.min_tokens,
            a.grader_workers,
            tool=self.tool,
            thinking=tools.thinking(a),
        )
        if a.eval_samples:
            metrics |= validation.sampled_eval(
                self.engine,
                self.val_rows,
                a.reward,
                a.eval_samples,
                a.eval_temperature,
                a.max_tokens,
                a.min_tokens,
                a.grader_workers,
                a.seed,
                tool=self.tool,
                thinking=tools.thinking(a),
            )
        span = _span(self.name, "eval", t0, version)
        self.free_at = span["t1"]
        return {
            "version": version,
            "metrics": metrics,
            "samples": samples[:16],
            "spans": [span],
        }

    def dp_address(self):
        """(this node's IP, a free port): rank 0 hosts the learner group's TCP rendezvous."""
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def init_dp(self, address, rank, world):
        """Join the data-parallel learner group, built on rank 0's TCP store. Replicated: a process
        group of its own, not torch.distributed's default group: an in-process vLLM engine has
        made that one (world size 1) and its parallel state lives on it, so the learners leave it
        alone. Sharded (--learner-sharding fsdp, disaggregated learners: no engine here): the
        default group itself, which FSDP2's DeviceMesh needs; then the sharded learner is built."""
        dev = self.runtime["policy_device"]
        dist = torch.distributed
        timeout = datetime.timedelta(seconds=self.args.timeout_s)
        host, port = address
        store = dist.TCPStore(host, port, world, rank == 0, timeout=timeout)
        store = dist.PrefixStore("grpo_ray/learners", store)  # its keys apart from anyone else's
        sharded = self.args.learner_sharding == "fsdp"
        if sharded:
            from torch.distributed.device_mesh import init_device_mesh

            backend = "gloo"
            if dev.startswith("cuda"):  # NOT run in CI (no GPU)
                backend = "nccl"
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world, timeout=timeout
            )
            group = dist.group.WORLD
            self.mesh = init_device_mesh(dev.split(":")[0], (world,))
        elif dev.startswith("cuda"):  # NOT run in CI (no GPU)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            group = dist.ProcessGroupNCCL(store, rank, world, options)
        else:
            group = dist.ProcessGroupGloo(store, rank, world, timeout)

        def reduce(t, op):
            """All-reduce t in place over the learner group. NCCL reduces device tensors only, so
            CPU metric sums go over to the device and back."""
            x = t.to(dev)
            options = dist.AllreduceOptions()
            options.reduceOp = getattr(dist.ReduceOp, op.upper())
            group.allreduce([x], options).wait()
            return t.copy_(x)

        self.dp = {"rank": rank, "world": world, "reduce": reduce, "sharded": sharded}
        if sharded and self.learner is None:
            self.learner = grpo.build_learner(self.args, self.runtime, self.mesh)

    def train(self, gen):
        """One rollout batch through grpo.train_step (lag = versions the batch is behind);
        version + 1."""
        t0 = time.time()
        step = gen["step"]
        lag = self.version - gen["version"]
        history, metrics = grpo.train_step(
            self.learner, gen["batch"], self.args, self.runtime, step, lag, self.dp
        )
        self.version += 1
        t_old = t0 + metrics["time/old_log_probs"]
        spans = [
            _span(self.name, "old_log_probs", t0, step, t_old),
            _span(self.name, "train", t_old, step),
        ]
        return {
            "step": step,
            "lag": lag,
            "version": self.version,
            "history": history,
            "metrics": metrics,
            "spans": spans,
        }

    def save(self, out_dir, state, final=False):
        """Checkpoint (and --keep-checkpoints' snapshot); the final save of a run, finished or
        stopped, also writes --export-merged's model. Sharded: every learner saves its shard."""
        if self.dp and self.dp["sharded"]:
            return self._save_shards(out_dir, state, final)
        path = runs.save_model_checkpoint(
            out_dir,
            self.learner["policy"],
            self.learner["tokenizer"],
            self.args,
            state,
            {"optimizer.pt": self.learner["optimizer"].state_dict()},
        )
        if self.args.keep_checkpoints:
            runs.save_snapshot(
                out_dir,
                self.learner["policy"],
                self.learner["tokenizer"],
                self.args,
                state,
                self.args.keep_checkpoints,
            )
        if self.args.export_merged and final:
            lora.export_merged(
                self.learner["policy"],
                self.learner["tokenizer"],
                self.args.export_merged,
                self.args.out,
            )
        return path

    def _save_shards(self, out_dir, state, final):
        """--learner-sharding fsdp's checkpoint: every learner stages its shard (weights and AdamW
        state, sharding.save_shard) beside the checkpoint, then learner 0 swaps the checkpoint in
        whole (runs.save_checkpoint): the shards, runs.SHARDS_FILE, the tokenizer, state.json with
        every file's record; at the run's end (final) also the whole model as an HF directory,
        gathered by all. A mid-run checkpoint holds no model: only grpo_ray.py --resume reads it.
        -> the checkpoint's path on learner 0, None on the others."""
        policy = self.learner["policy"]
        rank = self.dp["rank"]
        world = self.dp["world"]
        weights = None
        if final:  # a collective: every learner gathers, learner 0 keeps the tensors
            weights = sharding.full_state_dict(policy, keep=rank == 0)
        staging = os.path.join(out_dir, "checkpoint.shards")
        path = os.path.join(staging, sharding.shard_name(rank, world))
        error = None
        line = None  # the one line of a storage error
        try:
            os.makedirs(staging, exist_ok=True)
            sharding.save_shard(path, policy, self.learner["optimizer"])
        except Exception as e:  # torch.save on a full disk raises RuntimeError, not OSError
            error = e
            line = runs.storage_error_line(e, staging, "saving")  # before the file frees space
            try:
                os.remove(path)  # nothing half-written stays behind
            except OSError:
                pass
        # every learner, the failed one too, learns whether all shards are staged: one failure
        # stops them all
        staged = self.dp["reduce"](torch.tensor(float(error is None)), "min").item()
        if line:
            runs.stop(line)
        if error is not None:
            raise error
        common.check(staged == 1, f"{self.name}: another learner failed to stage its shard")
        if rank != 0:
            return None
        names = []
        for r in range(world):
            names.append(sharding.shard_name(r, world))
        script = runs.this_script() or runs.read_claim(out_dir).get("script")  # the driver's

        def write(tmp):
            for name in names:
                os.replace(os.path.join(staging, name), os.path.join(tmp, name))
            data.write_json_atomic(
                os.path.join(tmp, runs.SHARDS_FILE), {"learners": world, "files": names}
            )
            if final:
                policy.save_pretrained(tmp, state_dict=weights)
            self.learner["tokenizer"].save_pretrained(tmp)
            runs.write_state(tmp, state, self.args, script)

        path = runs.save_checkpoint(out_dir, write)
        shutil.rmtree(staging, ignore_errors=True)  # (a failed save's leftovers too)
        return path

    def get_weights(self, clone=False):
        """{"weights", "spans"} to push: a CPU copy, or with clone=True a device clone for RDT (Ray
        keeps a reference to the tensors it sends, not a copy). Sharded, every learner gathers
        (sharding.full_state_dict) and learner 0's copy is the one pushed; the others' weights
        are {}."""
        t0 = time.time()
        policy = self.learner["policy"]
        weights = {}
        if sharding.is_sharded(policy):
            weights = sharding.full_state_dict(policy, keep=self.dp["rank"] == 0)
        else:
            # with LoRA: the merged W + (alpha / r) B A under the base's names
            for name, tensor in lora.merged_state_dict(policy).items():
                if clone:
                    weights[name] = tensor.detach().clone()
                else:
                    weights[name] = tensor.detach().cpu()
        return {
            "weights": weights,
            "spans": [_span(self.name, "get_weights", t0, self.version - 1)],
        }

    def sync(self, version):
        """Colocated: the policy into this actor's own engine, an in-process copy (no transport).
        Every colocated learner must hold `version`: their engines then sample one policy."""
        common.check(
            version == self.version,
            f"{self.name}: push of version {version}, but its learner holds {self.version}",
        )
        t0 = time.time()  # the weight_sync span: the copy
        weights = lora.merged_state_dict(self.learner["policy"])
        return self._load({"weights": weights, "spans": []}, self.version, t0)


# ----------------------------------------------------------------------------- driver
def check_address(args):
    """--address: a Ray cluster must answer there within --connect-timeout-s, else one line
    (ray.init alone retries for over five minutes). First a TCP connect (nothing listening: refused
    at once), then the cluster's GCS asked for its id from a thread the driver stops waiting for."""
    from ray._private.services import canonicalize_bootstrap_address_or_die
    from ray._raylet import GcsClient

    if args.address == "local":  # Ray's name for "start a new local cluster"
        return
    flag = f"--address {args.address}"
    try:
        address = canonicalize_bootstrap_address_or_die(args.address)  # "auto": the running one
    except (ConnectionError, ValueError) as e:
        common.fail(f"{flag}: {e}")
    timeout = args.connect_timeout_s
    host, port = address.rsplit(":", 1)
    t0 = time.time()
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        common.fail(
            f"{flag}: no Ray cluster answers at {address} ({e.strerror or e}); start one there "
            "(ray start --head) or fix --address"
        )
    answer = {}

    def ask():
        try:
            answer["cluster_id"] = GcsClient(address=address).cluster_id
        except Exception as e:  # noqa: BLE001 - reported below, in one line
            answer["error"] = e

    thread = threading.Thread(target=ask, daemon=True)  # left blocked if nothing answers
    thread.start()
    thread.join(max(timeout - (time.time() - t0), 0))
    common.check(
        "cluster_id" in answer,
        f"{flag}: {address} accepts connections but no Ray cluster answered within "
        f"--connect-timeout-s {timeout:g} ({answer.get('error', 'no reply')}); is it a Ray head "
        "node's GCS port?",
    )


def init_ray(args):
    """Start (or join, with --address) a cluster once per process; workers get the engine's env
    vars."""
    if ray.is_initialized():
        return
    engine_env = {}  # rollout.ENGINE_ENV, where this process's environment does not set one
    for key, value in rollout.ENGINE_ENV.items():
        engine_env[key] = os.environ.get(key, value)
    env = {"env_vars": {**engine_env, "TOKENIZERS_PARALLELISM": "false"}}
    local = {}  # the settings of a cluster this process starts
    if args.address:
        # remote nodes need the code and the embedded model: ship the repo, not the venv
        env.update(working_dir=ROOT, excludes=[".venv/", ".git/", "runs/", "out/"])
    else:
        local = dict(
            num_cpus=args.num_cpus or math.ceil(args.devices * args.cpus_per_actor),
            include_dashboard=False,
            object_store_memory=args.object_store_mb * 2**20,
            _temp_dir=args.ray_tmp,
        )
    # A local cluster's processes (GCS, raylet, workers) start in a process group of their own:
    # a SIGTERM to the driver's group (`timeout` sends one) then stops the driver, which saves
    # through the cluster, and not the cluster too. The driver rejoins its group (a group leader,
    # e.g. started from an interactive shell, cannot leave it: it receives signals alone anyway).
    group = os.getpgrp()
    apart = not args.address and group != os.getpid()
    if apart:
        os.setpgid(0, 0)
    try:
        ray.init(address=args.address, runtime_env=env, namespace="grpo_ray", **local)
    finally:
        if apart:
            os.setpgid(0, group)


class RayFailure(RuntimeError):
    """A phase the actors did not finish (hung past --timeout-s, or an actor died): a one-line
    message, which main prints alone."""


def get(refs, what, args, actors=None):
    """ray.get bounded by --timeout-s, failing at the first failed ref. A hang or a dead actor
    becomes one line; a death names the actor (role and index, from actors["names"]) and why (Ray's
    error type and cause)."""
    if isinstance(refs, list):
        todo = list(refs)
    else:
        todo = [refs]
    deadline = time.time() + args.timeout_s
    try:
        while todo:
            done, todo = ray.wait(todo, timeout=max(deadline - time.time(), 0))
            if not done:
                raise RayFailure(
                    f"grpo_ray: {what} did not finish within --timeout-s {args.timeout_s:g}s "
                    "(hung or unschedulable)"
                )
            ray.get(done)
        return ray.get(refs)
    except ray.exceptions.RayError as e:
        # a dead learner fails its group's collectives: give the others a moment to find the death
        ray.wait(todo, num_returns=len(todo), timeout=10)
        errors = [e] + [_error(r) for r in todo]
        dead = [x for x in errors if isinstance(x, ray.exceptions.RayActorError)]
        if not dead:
            raise
        names = (actors or {}).get("names", {})
        who = names.get(dead[0].actor_id, "an actor")
        why = str(dead[0]).strip().splitlines()[-1]
        raise RayFailure(
            f"grpo_ray: {who} died during {what} ({type(dead[0]).__name__}: {why.strip()[:160]}); "
            f"logs under {logs_dir(args)}; --resume {args.out} continues from the last checkpoint"
        ) from e


def logs_dir(args):
    """Where the actors' logs are: the session's logs/ in the cluster's temp dir (--ray-tmp for a
    cluster this driver started; a cluster joined with --address keeps its own, on each node)."""
    context = ray.get_runtime_context()
    path = os.path.join(context.get_temp_dir(), context.get_session_name(), "logs")
    if args.address:
        path += " on the actor's node"
    return path


def _error(ref):
    """The ref's error if it failed, else None; a GetTimeoutError (a RayError too) if it is still
    running."""
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayError as e:
        return e


def actor_specs(args):
    """(name, generator, learner) of each actor, in bundle order. Colocated, actor i is generator i
    and learner i for i < min(N, M) (an engine and a learner shard per device); the generators
    and learners left over get an actor each."""
    N = args.num_generators
    M = args.num_learners
    both = 0  # actors with both roles
    if args.placement == "colocated":
        both = min(N, M)
    specs = []
    for i in range(both):
        specs.append((f"colocated {i}", True, True))
    for i in range(both, N):
        specs.append((f"generator {i}", True, False))
    for r in range(both, M):
        specs.append((f"learner {r}", False, True))
    return specs


def build_actors(args):
    """{"generator": N handles, "learner": M handles, "colocated", "all", "names", "pg"}: one
    placement-group bundle per actor (actor_specs), engines and policies loaded, the learner group
    joined. Colocated: the first min(N, M) actors ("colocated") are generator i and learner i."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as InGroup

    # the run directory is this run's before an actor writes its engine log there (runs.py: a
    # folder without run.lock that is not empty is not taken for a run)
    runs.claim_run_dir(args.out, args.resume)
    M = args.num_learners
    gpus = args.gpus_per_actor
    if gpus is None:  # default: one GPU per actor on a cluster that has GPUs
        gpus = 0.0
        if ray.cluster_resources().get("GPU", 0) > 0:
            gpus = 1.0

    specs = actor_specs(args)
    bundle = {"CPU": args.cpus_per_actor}
    if gpus:
        bundle["GPU"] = gpus
    pg = ray.util.placement_group([bundle] * len(specs), strategy=args.placement_strategy.upper())
    get(pg.ready(), f"placement group of {len(specs)} x {bundle} ({args.placement_strategy})", args)
    # RDT is enabled on the class
    cls = ray.remote(enable_tensor_transport=args.weight_sync != "object_store")(Worker)
    handles = []
    for i, spec in enumerate(specs):
        options = cls.options(
            num_cpus=args.cpus_per_actor, num_gpus=gpus, scheduling_strategy=InGroup(pg, i)
        )
        handles.append(options.remote(args, *spec))
    actors = {"generator": [], "learner": [], "colocated": [], "all": handles, "pg": pg}
    actors["sharded"] = args.learner_sharding == "fsdp"  # every learner saves and gathers
    actors["names"] = {}  # actor id -> its name, for error messages
    for handle, (name, generator, learner) in zip(handles, specs):
        actors["names"][handle._actor_id.hex()] = name
        if generator:
            actors["generator"].append(handle)
        if learner:
            actors["learner"].append(handle)
        if generator and learner:
            actors["colocated"].append(handle)
    ready = [a.__ray_ready__.remote() for a in handles]
    get(ready, "actor start-up (engine / policy load)", args, actors)
    if M > 1:  # the data-parallel group: rank 0 picks the rendezvous, all M join it at once
        address = actors["learner"][0].dp_address.remote()
        joins = [a.init_dp.remote(address, r, M) for r, a in enumerate(actors["learner"])]
        get(joins, "learner group start-up", args, actors)
    if args.weight_sync != "object_store":
        # RDT: collective transports need a group first (ranks: learner 0, then the generator)
        from ray.experimental.collective import create_collective_group

        create_collective_group(actors["learner"] + actors["generator"], backend=args.weight_sync)
    return actors


def kill_actors(actors):
    """End the actors and their placement group, the generators' tool pools closed first."""
    from ray.experimental.collective import destroy_collective_group, get_collective_groups

    # a finished run's generators are idle: their pools close cleanly. Waited for a few seconds
    # only: a dead actor's close fails at once, a busy one's (a failed run) waits behind its call,
    # and ray.kill ends both (a running bwrap call dies with its parent)
    closing = [g.close.remote() for g in actors["generator"]]
    ray.wait(closing, num_returns=len(closing), timeout=5)
    for group in get_collective_groups(actors["all"]):  # RDT: no half-done transfer to report
        destroy_collective_group(group)
    for a in actors["all"]:
        ray.kill(a)
    ray.util.remove_placement_group(actors["pg"])


def join_shards(shards):
    """One step's rollout batch from its generators' shards, in shard order: lists and tensors
    concatenated (with --tools grpo.TOOL_KEYS' columns too: the policy masks reach the learners),
    each shard's stats kept in a list (grpo.summarize reads them). All shards must share one
    policy version."""
    versions = sorted({s["version"] for s in shards})
    common.check(
        len(versions) == 1,
        f"step {shards[0]['step']}: its shards come from policy versions {versions}, not one",
    )

    batch = {}
    for key, value in shards[0]["batch"].items():
        if key == "ban_token_ids":  # the engine's banned ids: the same in every shard
            batch[key] = value
        elif torch.is_tensor(value):
            batch[key] = torch.cat([s["batch"][key] for s in shards])
        else:
            batch[key] = []
            for s in shards:
                batch[key] += s["batch"][key]

    spans = []
    for s in shards:
        spans += s["spans"]
    return {
        "step": shards[0]["step"],
        "version": versions[0],
        "batch": batch,
        "stats": [s["stats"] for s in shards],
        "spans": spans,
    }


def _push(actors, version, transport):
    """Version `version` into every engine (refs): each colocated one in-process from the learner
    beside it (the learners are in lockstep: the same weights), the others from ONE put of learner
    0's weights (sharded learners all gather them: their refs are waited for too)."""
    lead = actors["learner"][0]
    colocated = actors["colocated"]
    syncs = []
    for a in colocated:
        syncs.append(a.sync.remote(version))
    others = actors["generator"][len(colocated) :]
    if actors["sharded"]:  # every learner takes part in the gather; learner 0's copy is pushed
        for a in actors["learner"][1:]:
            syncs.append(a.get_weights.remote())
    if others:
        weights = lead.get_weights.options(**transport).remote(clone=bool(transport))
        for g in others:
            if transport:  # RDT: Ray moves the tensors before set_weights starts
                syncs.append(g.set_weights.remote(weights, version))
            else:  # in a list: set_weights fetches it inside its timed span
                syncs.append(g.set_weights.remote([weights], version))
    return syncs


def run(args, actors):
    """The driver loop (single controller). Returns the summary; writes metrics, timeline and
    summary to --out."""
    runs.claim_run_dir(args.out, args.resume)
    if args.resume:
        saved = runs.restore_checkpoint(args.resume, args.out)  # metrics cut back to it
    else:
        saved = _start(args)[1]
    data.write_json_atomic(os.path.join(args.out, "args.json"), runs.jsonable(vars(args)))
    write_runtime_records(args, actors)
    start = saved["step"]
    state = {
        "opt_step": saved["opt_step"],  # optimizer steps taken
        "wall": saved["wall"],  # training seconds of the run before this session
        "spans": [],  # the timeline
        "rows": [],  # this session's step rows
        "last": time.time(),  # when the previous step was logged: the next time/step starts here
    }
    if args.resume and actors["sharded"]:
        # a sharded checkpoint holds no model: the engines, started from --model, take the
        # learners' resumed weights before the first eval
        _synced(args, actors, state, _push(actors, start, {}), start)
    _evaluate(args, actors, state, start)
    t_run = time.time() - state["wall"]  # time/wall: the eval before the first step not counted
    state["t_run"] = t_run
    gens = actors["generator"]
    n = args.n_grpo_steps
    s = args.staleness
    transport = {}  # options of the get_weights call that pushes a version
    if args.weight_sync != "object_store":
        transport = {"tensor_transport": args.weight_sync}
    pending = {}  # step -> its shards' refs, launched ahead of training
    pushed = start  # the newest version sent to the engines
    nxt = start  # the next step to launch
    syncs = []  # refs of the push not yet waited for
    state.update(done=start, dirty=False)  # steps logged; inside a train step
    # --curriculum: the one sampler, here where each step's prompts are chosen (at launch: with
    # staleness s, step j's choice has seen the batches up to j - s - 1)
    curriculum = start_curriculum(args, saved, state)
    try:
        for t in range(start, n):
            # --- rollout + reward: launch every batch the staleness bound allows (j needs version
            # j - s pushed; the colocated k-schedule is s = k - 1), each generator sampling its
            # shard; shards joined in order ---
            while nxt < n and nxt - s <= pushed:
                picks = None  # each generator's own uniform draw (the same one)
                if curriculum is not None:
                    picks = curriculum.choose(nxt)
                shards = []
                for i, g in enumerate(gens):
                    shards.append(g.generate.remote(nxt, (i, len(gens)), picks))
                pending[nxt] = shards
                nxt += 1
            gen = join_shards(get(pending.pop(t), f"rollout step {t}", args, actors))
            if curriculum is not None:
                # once per step, from every group each shard scored (the dropped ones too)
                for shard_stats in gen["stats"]:
                    curriculum.update(shard_stats["group_outcomes"])
            # --- the batch's metrics: once, on the joined batch ---
            gen["metrics"] = grpo.summarize(gen["batch"], gen["stats"], args)
            lag = t - gen["version"]
            common.check(lag <= s, f"batch {t} is {lag} versions stale")

            # --- old log-probs + train: every learner reads the batch from one put and trains its
            # share of it ---
            batch = ray.put(gen)
            # a first stop request (Ctrl-C, SIGTERM): this step is trained and logged
            with runs.finish_then_interrupt(f"train step {t}"):
                state["dirty"] = True
                trains = [a.train.remote(batch) for a in actors["learner"]]
                trs = get(trains, f"train step {t}", args, actors)
                # the previous push: done by now
                syncs = _synced(args, actors, state, syncs, pushed)
                _log_step(args, state, gen, trs, t_run)
                state.update(done=t + 1, dirty=False)
                if curriculum is not None:
                    state["curriculum"] = curriculum.state()  # saved with the steps trained

            # --- sync weights after every k-th batch, queued behind the generations already
            # launched ---
            if (t + 1) % args.steps_per_rollout == 0:
                syncs = _push(actors, trs[0]["version"], transport)
                pushed = trs[0]["version"]
                syncs = _checkpoint_and_eval(args, actors, state, syncs, pushed, t_run)
    except KeyboardInterrupt:
        # save the steps logged so far (a second stop request inside a step: nothing saved)
        if state["dirty"]:
            grpo.stopped(
                f"aborted inside train step {state['done']}: nothing saved; --resume {args.out} "
                "restarts from the last checkpoint"
            )
        print(f"\n{runs.stop_name()}: saving the steps logged", flush=True)
        _save_on_stop(args, actors, state, state["done"], time.time() - t_run)

    # --- the end: the last push, the final eval, the save, the summary ---
    return _finish(args, actors, state, syncs, pushed, start)


def start_curriculum(args, saved, state):
    """The driver's --curriculum sampler (grpo.start_curriculum; None without --curriculum), from
    the checkpoint `saved`'s rates when resumed. Its state() goes into `state` at once: a save
    before this session's first step (a stop, or nothing left to train) keeps it."""
    if not args.curriculum:
        return None
    curriculum = grpo.start_curriculum(grpo.load_data(args)[0], args, saved)
    state["curriculum"] = curriculum.state()
    return curriculum


def _finish(args, actors, state, syncs, pushed, start):
    """The end of `run` after its last step: wait for the last push, the final eval, the final
    checkpoint (a stop request lets it finish), then the summary, timeline.json and
    summary.json. -> the summary."""
    n = args.n_grpo_steps
    t_run = state["t_run"]
    try:
        _synced(args, actors, state, syncs, pushed)
        wall = time.time() - t_run
        _evaluate(args, actors, state, n)
    except KeyboardInterrupt:  # every step is trained: save them; a resume runs the final eval
        print(f"\n{runs.stop_name()}: final eval skipped; saving the steps", flush=True)
        _save_on_stop(args, actors, state, n, time.time() - t_run)
    # a stop request lets the save finish, then stops the run (a second one stops at once: the
    # previous checkpoint stays)
    saved = False
    try:
        with runs.finish_then_interrupt("the checkpoint save"):
            _save(args, actors, state, n, wall, final=True)
            saved = True
    except KeyboardInterrupt:
        if not saved:
            grpo.stopped(
                f"{runs.stop_name()} again while saving: stopped; {args.out} keeps its last "
                "complete checkpoint"
            )
        print(f"{runs.stop_name()}: checkpoint saved after step {n}", flush=True)
        raise SystemExit(runs.stop_exit_code()) from None
    summary = summarize(args, state["rows"], state["spans"], wall - state["wall"], n - start)
    data.write_json_atomic(os.path.join(args.out, "timeline.json"), state["spans"])
    data.write_json_atomic(os.path.join(args.out, "summary.json"), summary)
    plot.plot_timeline([(args.mode, state["spans"])], os.path.join(args.out, "timeline.png"))
    return summary


def _save_on_stop(args, actors, state, version, wall):
    """After a stop request (Ctrl-C, SIGTERM): checkpoint `version`, the steps logged, then exit
    130 / 143. A second request while saving stops at once; the last complete checkpoint stays."""
    try:
        _save(args, actors, state, version, wall, final=True)
    except KeyboardInterrupt:
        grpo.stopped(
            f"{runs.stop_name()} again while saving: stopped; {args.out} keeps its last "
            "complete checkpoint"
        )
    print(
        f"{runs.stop_name()}: checkpoint saved after step {version}; continue with --resume "
        f"{args.out}",
        flush=True,
    )
    raise SystemExit(runs.stop_exit_code())


def write_runtime_records(args, actors):
    """runtime.json: each actor's runtime record (devices, dtypes, shared prefix), by actor name."""
    records = get([a.runtime_record.remote() for a in actors["all"]], "runtime records", args)
    runtime = {}
    for handle, record in zip(actors["all"], records):
        runtime[actors["names"][handle._actor_id.hex()]] = record
    data.write_json_atomic(os.path.join(args.out, "runtime.json"), runs.jsonable(runtime))


def _synced(args, actors, state, syncs, version):
    """Wait for a push and keep its spans. Returns [] (nothing in flight)."""
    outs = get(syncs, f"weight sync of version {version}", args, actors)
    # the learner's get_weights span comes back from all N readers: keep it once
    unique = {}
    for out in outs:
        for span in out["spans"]:
            unique[(span["actor"], span["phase"], span["t0"])] = span
    state["spans"] += list(unique.values())
    return []


def due(every, version, k):
    """Does a multiple of `every` (0: never) fall in (version - k, version], the steps since the
    previous push?"""
    return bool(every) and version // every > (version - k) // every


def _checkpoint_and_eval(args, actors, state, syncs, version, t_run):
    """Evaluate and save at the first push at or past each multiple of --eval-every /
    --save-every (pushes come every k steps; not the last version: run() does those), once the
    engines hold it."""
    k = args.steps_per_rollout
    last = args.n_grpo_steps
    evaluate = due(args.eval_every, version, k) and version < last
    save = due(args.save_every, version, k) and version < last
    if evaluate or save:
        syncs = _synced(args, actors, state, syncs, version)
    if evaluate:
        _evaluate(args, actors, state, version)
    if save:
        _save(args, actors, state, version, time.time() - t_run)
    return syncs


def _save(args, actors, state, version, wall, final=False):
    """Checkpoint `version`: the learners are in lockstep, so rank 0 saves (sharded: every learner
    its shard, rank 0 the checkpoint). final: the run's last save (finished or stopped)."""
    meta = {"step": version, "opt_step": state["opt_step"], "wall": wall}
    if "curriculum" in state:  # --curriculum's success rates after `version` steps
        meta["curriculum"] = state["curriculum"]
    savers = actors["learner"][:1]
    if actors["sharded"]:
        savers = actors["learner"]
    refs = [a.save.remote(args.out, meta, final) for a in savers]
    get(refs, f"checkpoint of version {version}", args, actors)


def _evaluate(args, actors, state, version):
    """Greedy validation on generator 0, which holds `version`: a metrics row, 16 samples and a
    printed line."""
    t0 = time.time()
    ref = actors["generator"][0].evaluate.remote(version)
    out = get(ref, f"eval at version {version}", args, actors)
    state["spans"] += out["spans"]
    span = out["spans"][0]
    # before run() sets t_run (the first eval), time/wall is 0
    wall = time.time() - state.get("t_run", time.time())
    row = {
        "step": version,
        "opt_step": state["opt_step"],
        "time/wall": wall,
        "time/eval": span["t1"] - span["t0"],
    }
    runs.log_row(args.out, row | out["metrics"])
    path = os.path.join(args.out, "rollouts", f"eval_v{version:04d}.jsonl")
    data.write_jsonl_atomic(path, out["samples"])
    parts = [f"{k} {v:.3f}" for k, v in out["metrics"].items()]
    print(f"eval version {version} | " + " | ".join(parts), flush=True)
    state["last"] += time.time() - t0  # the next row's time/step: not this eval (as in grpo.py)


def _log_step(args, state, gen, trs, t_run):
    """grpo.step_rows (grpo.py's keys, one row per optimizer step) plus the Ray bookkeeping:
    version and lag."""
    for out in [gen] + trs:
        state["spans"] += out["spans"]
    tr = trs[0]  # every learner took the same step: learner 0's numbers
    now = time.time()
    weight_syncs = [s for s in state["spans"] if s["phase"] == "weight_sync"]
    weight_sync_s = 0.0
    if weight_syncs:
        weight_sync_s = weight_syncs[-1]["t1"] - weight_syncs[-1]["t0"]
    ray_metrics = {
        "ray/lag": tr["lag"],
        "ray/version": tr["version"],
        "ray/gen_version": gen["version"],
    }
    rows = grpo.step_rows(
        gen["step"],
        state["opt_step"],
        gen["batch"],
        tr["history"],
        gen["metrics"] | tr["metrics"] | ray_metrics,
        now - state["last"],
        weight_sync_s,
        now - t_run,
    )
    for row in rows:
        runs.log_row(args.out, row)
    state["rows"] += rows
    state.update(last=now, opt_step=rows[-1]["opt_step"])
    line = grpo.step_line(gen["step"], args, rows[-1])
    print(f"[{args.mode}] {line} | lag {tr['lag']}", flush=True)


# ----------------------------------------------------------------------------- profiling
def summarize(args, rows, spans, wall, steps):
    """Throughput, per-phase mean seconds per step, lags, device-seconds (wall x actors) of this
    session's steps."""
    samples = steps * args.rollout_batch_size
    phases = {}  # phase -> the durations of its spans
    for s in spans:
        if s["phase"] != "eval":
            phases.setdefault(s["phase"], []).append(s["t1"] - s["t0"])
    lag_of = {}  # one lag per rollout batch (a batch logs a row per optimizer step)
    for r in rows:
        if "ray/lag" in r:
            lag_of[r["step"]] = r["ray/lag"]
    lags = list(lag_of.values())
    return {
        "mode": args.mode,
        "weight_sync": args.weight_sync,
        "engine": args.engine,
        "num_generators": args.num_generators,
        "num_learners": args.num_learners,
        "devices": args.devices,
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
    # SIGTERM (a scheduler's time limit, `timeout`, a container stop) stops the run as Ctrl-C does:
    # the train step in flight finishes, the steps logged are saved, exit 143
    runs.stop_on_sigterm()
    if args.dry_run:
        runs.dry_run(args)  # the effective settings as one JSON line; no Ray, no model
    # bad data: one line now, not a traceback from an actor once Ray and the policy are up
    grpo.load_data(args)
    if args.address:
        check_address(args)  # one line within --connect-timeout-s, not minutes of retries
    runs.claim_run_dir(args.out, args.resume)  # before any actor starts
    init_ray(args)
    runs.stop_on_sigterm()  # ray.init replaced our SIGTERM handler with a plain exit
    print(
        f"ray: {ray.cluster_resources()} | mode {args.mode} | {args.n_grpo_steps} steps x "
        f"{args.rollout_batch_size} samples | weight sync {args.weight_sync} | out {args.out}",
        flush=True,
    )
    actors = None
    failure = None  # a dead or hung actor's one line (RayFailure), printed after Ray's output
    stopped_early = False  # a stop request before the first step (run() handles the later ones)
    try:
        actors = build_actors(args)
        summary = run(args, actors)
    except RayFailure as e:
        failure = str(e)
    except KeyboardInterrupt:
        stopped_early = True
    finally:
        if actors is not None:
            kill_actors(actors)
        # flushes the actors' forwarded log lines: what follows is the last output
        ray.shutdown()
    if failure:
        raise SystemExit(f"error: {failure}")
    if stopped_early:
        grpo.stopped(f"{runs.stop_name()} while starting: stopped before training")
    plot.plot_runs([args.out], os.path.join(args.out, "dashboard.png"))
    printed = {k: v for k, v in summary.items() if k != "lags"}
    print(json.dumps(printed))


if __name__ == "__main__":
    main(parse_args())
