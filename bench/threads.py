"""Benchmark one GRPO step of grpo.py on a shared machine: quiet, and beside a CPU-bound competitor
this bench starts itself, for torch's default thread count and for --threads N. Prints one JSON
object.

Why: torch runs each op on its OpenMP threads, which meet at a barrier when the op ends. When
another process takes one of two cores, the thread that shares it runs at half speed and the
other waits for it (spinning) at every barrier, so the whole step slows by more than the core it
lost. One thread has no one to wait for.

  python bench/threads.py                      # the bench config, 3 pairs of rounds, --threads 1
  python bench/threads.py --threads 2 --rounds 5 --competitors 2
  python bench/threads.py --quick --engine hf  # smoke size (tests/test_bench.py)

Method: one child process per setting, each a grpo.py run's set-up with grpo.py's own --threads
(applied before the engine starts, as a run applies it) and bench/grpo_step.py's config (16 prompts
x 8 samples, <= 64 new tokens, micro batch 32; --quick: its smoke config). A child loads the data,
the policy and the engine once, runs one untimed step, then --rounds pairs of rounds: quiet, loaded,
quiet, loaded, ... (other jobs' load drifts; alternating spreads it over both kinds). A round is one
whole step from the same start: collect (generation + grading), grpo.summarize, train_step, then
the weight sync, which pushes the start weights (put back into the policy; the optimizer gets its
empty state back too), so every round computes the same thing. A loaded round starts --competitors
busy loops (`while True: pass`) half a second before its step and kills them after it; the cores
they got during the step are in the JSON (competitor_cores: 1 each would be a fair share). Each
number is its best over the rounds (other jobs only ever add time); every sample is in the JSON.
The ratios: a setting's loaded step over its quiet one, and --threads N's step over the default's,
quiet and loaded.
"""

import contextlib
import copy
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import rollout as engines  # noqa: E402,I001  (sets vLLM's environment before anything imports vllm)
import torch  # noqa: E402
from grpo_step import CONFIG, QUICK  # noqa: E402  (bench/ is this script's sys.path[0])

import common  # noqa: E402
import data  # noqa: E402
import grpo  # noqa: E402

BUSY = "while True: pass"  # a competitor: one core, all the time
# per round, in seconds: the whole step and its phases
PHASES = ["step", "generation", "grading", "training", "weight_sync", "step_cpu"]


def parse():
    p = common.Parser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", default="vllm", choices=engines.ENGINES, help="rollout engine")
    p.add_argument(
        "--threads",
        type=common.positive_int,
        default=1,
        help="the thread count compared with torch's default",
    )
    p.add_argument(
        "--rounds",
        type=common.positive_int,
        default=3,
        help="pairs of rounds (quiet, loaded) per setting (best reported)",
    )
    p.add_argument(
        "--competitors",
        type=common.positive_int,
        default=1,
        help="busy-loop processes beside a loaded round's step",
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke size: 2 prompts x 8, <= 32 tokens, 1 round"
    )
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument(
        "--child",
        default=None,
        help="internal: measure one setting ('default' or a thread count) in this process",
    )
    a = p.parse_args()
    if a.quick:
        a.rounds = 1
    return a


# ----------------------------------------------------------------------------- one setting (child)
def cpu_seconds(pid):
    """The CPU seconds (user + system) process pid has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    utime = int(fields[11])  # the fields after "(comm)" start at the 3rd, state
    stime = int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def competitors(n):
    """n busy loops, under way, for the block; yields their pids. Killed whatever happens."""
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", BUSY]))
        time.sleep(0.5)  # past the interpreter's start-up: each one spins
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def one_step(engine, learner, train_rows, args, runtime, start):
    """One whole GRPO step from `start` (the policy's and optimizer's state dicts), which the
    policy, the engine and the optimizer get back at its end. -> seconds per phase."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    batch, stats = grpo.collect(engine, train_rows, args, 0)
    grpo.summarize(batch, [stats], args)
    t1 = time.perf_counter()
    grpo.train_step(learner, batch, args, runtime, 0)
    t2 = time.perf_counter()
    learner["policy"].load_state_dict(start["policy"])
    learner["optimizer"].load_state_dict(start["optimizer"])
    engines.load_policy_into_vllm(learner["policy"], engine)
    t3 = time.perf_counter()
    return {
        "step": t3 - t0,
        "generation": stats["generation_s"],
        "grading": stats["grading_s"],
        "training": t2 - t1,
        "weight_sync": t3 - t2,
        "step_cpu": time.process_time() - c0,
    }


def measure(a):
    """The child: one setting's quiet and loaded rounds."""
    flags = " ".join(CONFIG).split()
    if a.quick:
        flags = " ".join(QUICK).split()
    flags += ["--engine", a.engine]
    if a.child != "default":
        flags += ["--threads", a.child]
    args = grpo.parse_args(flags)
    runtime = grpo.setup_runtime(args)  # applies --threads, before the engine starts
    train_rows, _ = grpo.load_data(args)
    torch.manual_seed(args.seed)
    learner = grpo.build_learner(args, runtime)
    engine = grpo.make_engine(args.model, args, runtime, learner["policy"])
    start = {
        "policy": copy.deepcopy(learner["policy"].state_dict()),
        "optimizer": copy.deepcopy(learner["optimizer"].state_dict()),  # no state yet
    }
    one_step(engine, learner, train_rows, args, runtime, start)  # warm-up, not timed
    rounds = {"quiet": [], "loaded": []}
    competitor_cpu = []  # per loaded round: each competitor's CPU seconds during the step
    competitor_pids = []
    for r in range(a.rounds):
        rounds["quiet"].append(one_step(engine, learner, train_rows, args, runtime, start))
        with competitors(a.competitors) as pids:
            before = [cpu_seconds(pid) for pid in pids]
            rounds["loaded"].append(one_step(engine, learner, train_rows, args, runtime, start))
            after = [cpu_seconds(pid) for pid in pids]
        competitor_cpu.append([round(y - x, 2) for x, y in zip(before, after)])
        competitor_pids += pids
        quiet = rounds["quiet"][-1]["step"]
        loaded = rounds["loaded"][-1]["step"]
        print(f"threads {a.child}, round {r}: step {quiet:.2f} s quiet, {loaded:.2f} s loaded")
    return {
        "threads_flag": args.threads,  # grpo.py's --threads as parsed (None: torch's default)
        "threads": runtime["threads"],
        "threads_after_engine_start": torch.get_num_threads(),
        "rounds": rounds,
        "competitor_cpu_s": competitor_cpu,
        "competitor_pids": competitor_pids,
    }


# ----------------------------------------------------------------------------- both (parent)
def run_child(a, setting):
    """One setting measured in a process of its own (stderr passes through). -> its JSON."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", setting, "--engine", a.engine]
    cmd += ["--rounds", str(a.rounds), "--competitors", str(a.competitors)]
    if a.quick:
        cmd += ["--quick"]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        sys.exit(f"error: the {setting} setting's child failed ({proc.returncode}); see above")
    return json.loads(proc.stdout)


def summarize_setting(child):
    """A setting's best time per phase, quiet and loaded, their ratios, and every sample."""
    s = {
        "threads_flag": child["threads_flag"],
        "threads": child["threads"],
        "threads_after_engine_start": child["threads_after_engine_start"],
    }
    for kind in ("quiet", "loaded"):
        best = {}
        for k in PHASES:
            best[k] = round(min(r[k] for r in child["rounds"][kind]), 3)
        s[f"{kind}_s"] = best
    ratios = {}
    for k in PHASES:
        ratios[k] = round(s["loaded_s"][k] / max(s["quiet_s"][k], 1e-9), 3)
    s["loaded_over_quiet"] = ratios
    steps = [r["step"] for r in child["rounds"]["loaded"]]
    shares = []  # the cores the competitors took during the step: ~ --competitors
    for step, cpus in zip(steps, child["competitor_cpu_s"]):
        shares.append(round(sum(cpus) / step, 2))
    s["competitor_cores"] = shares
    s["samples_s"] = {}
    for kind in ("quiet", "loaded"):
        s["samples_s"][kind] = {k: [round(r[k], 3) for r in child["rounds"][kind]] for k in PHASES}
    s["competitor_cpu_s"] = child["competitor_cpu_s"]
    s["competitor_pids"] = child["competitor_pids"]  # all gone by now
    return s


def main():
    a = parse()
    if a.child:
        # grpo.py's progress lines go to stderr; stdout is the JSON alone
        with contextlib.redirect_stdout(sys.stderr):
            result = measure(a)
        print(json.dumps(result))
        return
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    name = f"threads_{a.threads}"
    settings = {
        "default": summarize_setting(run_child(a, "default")),
        name: summarize_setting(run_child(a, str(a.threads))),
    }
    default = settings["default"]
    chosen = settings[name]
    flags = CONFIG
    if a.quick:
        flags = QUICK
    out = {
        "config": {
            "engine": a.engine,
            "flags": " ".join(flags),
            "rounds": a.rounds,
            "competitors": a.competitors,
            "cpu_count": os.cpu_count(),
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        },
        "settings": settings,
        f"{name}_over_default": {
            "quiet": round(chosen["quiet_s"]["step"] / default["quiet_s"]["step"], 3),
            "loaded": round(chosen["loaded_s"]["step"] / default["loaded_s"]["step"], 3),
        },
        "load_avg_1m": {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2)},
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out, indent=1))
    if a.out:
        data.write_json_atomic(a.out, out)


if __name__ == "__main__":
    main()
