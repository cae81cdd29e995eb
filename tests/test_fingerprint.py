"""Bit-for-bit fingerprint of grpo.train_step: a rewrite that promises to leave the arithmetic alone
must reproduce it exactly.

Each configuration in CONFIGS starts from the embedded model's weights (grpo.build_learner: the
policy and its AdamW) and calls grpo.train_step twice (steps 0 and 1) on one frozen rollout batch.
After each call it records the history rows (loss, gradient norm, entropy, ratios), the step's
metrics (time/ keys left out) and a sha256 of every parameter's bytes in named_parameters() order.
The test reruns this and compares every number by its repr and every hash as a string: a single
changed bit fails.

Files (tests/fingerprint/):
- batch.json: 4 Countdown prompts x 4 responses of at most 64 tokens, sampled once by grpo.collect
  with the vLLM engine (BATCH_FLAGS). The test needs no engine: train_step's advantages phase
  computes the advantages from the stored rewards.
- expected.json: the numbers the configurations produced on it, and the software they ran on.

Exact numbers hold for one stack only: torch, transformers, the CPU's vector unit
(torch.backends.cpu.get_cpu_capability()) and the thread count, pinned to 1 here. expected.json
names the first three. The comparison runs in one subprocess with ATEN_CPU_CAPABILITY set to the
recorded unit (torch reads it once, at its first dispatch), so an AVX-512 machine computes the
AVX2 numbers too: it is skipped only on a CPU that lacks the recorded unit, and
test_the_comparison_runs_where_the_cpu_can guards that skip.

Re-record, from the repository root, on the commit whose arithmetic is the reference:
  PYTHONPATH=. .venv/bin/python tests/test_fingerprint.py --record     # expected.json
  PYTHONPATH=. .venv/bin/python tests/test_fingerprint.py --new-batch  # new batch.json (vLLM), too
(PYTHONPATH: the root scripts are imported as top-level modules, as under pytest.)
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import transformers

import grader
import grpo
from conftest import ROOT

FOLDER = os.path.join(ROOT, "tests", "fingerprint")
BATCH_PATH = os.path.join(FOLDER, "batch.json")
EXPECTED_PATH = os.path.join(FOLDER, "expected.json")
N_STEPS = 2  # train_step calls per configuration: the second one uses AdamW's state from the first
# how batch.json was sampled; training reads the same sizes, temperature and min_tokens ban
BATCH_FLAGS = [
    "--rollout-batch-size 16",
    "--group-size 4",
    "--max-tokens 64",
    "--min-tokens 4",
    "--temperature 0.9",  # not 1.0, so the division of the logits by it is pinned too
    "--seed 0",
]
TRAIN_FLAGS = [
    "--train-batch-size 16",
    "--gradient-accumulation-steps 2",  # microbatches of 8 rows (2 groups) per optimizer step
    "--lr 1e-4",
    "--policy-device cpu",
    "--dtype float32",
    "--grader-workers 0",
]
# name -> its flags. Each names --shared-prefix or --no-shared-prefix: the default may move
CONFIGS = {
    "reinforce": "--loss reinforce_with_baseline --shared-prefix",
    "reinforce_no_shared_prefix": "--loss reinforce_with_baseline --no-shared-prefix",
    "grpo_clip_off_policy": "--loss grpo_clip --epochs-per-rollout-batch 2 --shared-prefix",
    "dapo_token": "--loss grpo_clip --length-norm token --cliprange-high 0.28 --no-shared-prefix",
    "tis": "--loss reinforce_with_baseline --rollout-is tis --shared-prefix",
    "kl_beta": "--loss grpo_clip --length-norm masked_normalize --kl-beta 0.05 --no-shared-prefix",
}
TIS_SHIFT = 0.8  # TIS only: engine log-probs move by -0.8, 0, +0.8 in turn (shift_engine_log_probs)
KEPT_KEYS = [  # what batch.json keeps of collect's batch
    "prompts",
    "responses",
    "ground_truths",
    "rewards",
    "prompt_ids",
    "response_ids",
    "engine_logprobs",
    "truncated",
    "ban_token_ids",
]


# ----------------------------------------------------------------------------- the frozen batch
def parse(name, out):
    """The run's args and runtime record as grpo.main makes them: parse_args (which resolves
    sizes), setup_runtime."""
    flags = " ".join(BATCH_FLAGS + TRAIN_FLAGS + [CONFIGS.get(name, "")])
    args = grpo.parse_args(flags.split() + ["--out", out])
    return args, grpo.setup_runtime(args)


def sample_batch(out):
    """A new frozen batch: grpo.collect's first step with the vLLM engine, reduced to KEPT_KEYS."""
    args, runtime = parse(None, out)
    train_rows, _ = grpo.load_data(args)
    engine = grpo.make_engine(args.model, args, runtime)
    batch, _ = grpo.collect(engine, train_rows, args, 0)
    return {key: batch[key] for key in KEPT_KEYS}


def shift_engine_log_probs(rows):
    """Engine log-probs moved off the trainer's by a fixed pattern, so that pi_old / mu is about
    e^0.8 = 2.2 (TIS caps it at 2), 1 or e^-0.8 = 0.45 per token: weights far from 1."""
    shifted = []
    for i, row in enumerate(rows):
        shifted.append([lp - TIS_SHIFT * ((i + j) % 3 - 1) for j, lp in enumerate(row)])
    return shifted


def load_batch(args):
    """batch.json as grpo.collect returns it (train_step's advantages phase reads its rewards)."""
    with open(BATCH_PATH) as f:
        batch = json.load(f)
    batch["raw"] = torch.tensor([d["reward"] for d in batch["rewards"]], dtype=torch.float32)
    if args.rollout_is != "none":
        batch["engine_logprobs"] = shift_engine_log_probs(batch["engine_logprobs"])
    return batch


def write_batch(batch):
    """batch.json with one response (one list element) per line, so a diff reads row by row."""
    parts = []
    for key, rows in batch.items():
        body = ",\n".join("  " + json.dumps(row) for row in rows)
        parts.append(f" {json.dumps(key)}: [\n{body}\n ]")
    with open(BATCH_PATH, "w") as f:
        f.write("{\n" + ",\n".join(parts) + "\n}\n")


# ----------------------------------------------------------------------------- the fingerprint
def params_sha256(model):
    """sha256 over every parameter's name and raw bytes, in named_parameters() order."""
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def fingerprint(name, out):
    """Two train_steps of configuration `name` on the frozen batch, on one CPU thread.
    -> {"flags", "shared_prefix" (as load_policy left it), "steps": [{"history", "metrics",
    "params_sha256"}, ...]}, passed through JSON as expected.json is."""
    args, runtime = parse(name, out)
    batch = load_batch(args)
    threads = torch.get_num_threads()
    # a matmul's summation order follows the thread count. torch._C's own setter: once a vLLM engine
    # has run in this process (other tests), its CPU worker has made torch.set_num_threads a no-op
    torch._C.set_num_threads(1)
    assert torch.get_num_threads() == 1
    try:
        torch.manual_seed(args.seed)
        learner = grpo.build_learner(args, runtime)
        steps = []
        for step in range(N_STEPS):
            history, metrics = grpo.train_step(learner, batch, args, runtime, step)
            kept = {k: v for k, v in metrics.items() if not k.startswith("time/")}  # clocks vary
            digest = params_sha256(learner["policy"])
            steps.append({"history": history, "metrics": kept, "params_sha256": digest})
    finally:
        torch._C.set_num_threads(threads)
    result = {"flags": CONFIGS[name], "shared_prefix": runtime["shared_prefix"], "steps": steps}
    return json.loads(json.dumps(result))


def software():
    """What exact numbers depend on besides the code (the thread count is pinned to 1)."""
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def differences(got, want, path=""):
    """Paths where two JSON values differ: leaves compared by repr (1 != 1.0, NaN == NaN)."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(got)} != recorded {sorted(want)}"]
        found = []
        for k in want:
            found += differences(got[k], want[k], f"{path}/{k}")
        return found
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: length {len(got)} != recorded {len(want)}"]
        found = []
        for i in range(len(want)):
            found += differences(got[i], want[i], f"{path}[{i}]")
        return found
    if repr(got) != repr(want):
        return [f"{path}: {got!r} != recorded {want!r}"]
    return []


def measure(out):
    """{"software", "configs": {name: fingerprint}}: every configuration, in this process."""
    measured = {"software": software(), "configs": {}}
    for name in CONFIGS:
        measured["configs"][name] = fingerprint(name, out)
    return measured


def cpu_has(capability):
    """Whether this CPU can run torch's `capability` kernels ("AVX2", "AVX512"), from the CPU's
    own flags (Linux x86: /proc/cpuinfo); False where they cannot be read."""
    needs = {
        "DEFAULT": set(),
        "AVX2": {"avx2", "fma"},
        "AVX512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
    }
    if capability not in needs:
        return False
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return capability == "DEFAULT"
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    return needs[capability] <= flags


def record(out):
    """expected.json: each configuration's fingerprint on batch.json, and the software it ran on."""
    expected = {"software": software(), "configs": {}}
    for name in CONFIGS:
        expected["configs"][name] = fingerprint(name, out)
        print(f"recorded {name}")
    with open(EXPECTED_PATH, "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print(f"wrote {EXPECTED_PATH}")


# ----------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def expected():
    if not os.path.exists(EXPECTED_PATH):
        pytest.fail(f"{EXPECTED_PATH} is missing: record it (module docstring)")
    with open(EXPECTED_PATH) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def measured(expected, tmp_path_factory):
    """Every configuration's fingerprint, computed in one subprocess whose torch runs the recorded
    vector unit's kernels (ATEN_CPU_CAPABILITY), on one thread."""
    folder = tmp_path_factory.mktemp("fingerprint")
    path = folder / "measured.json"
    env = dict(os.environ)
    env["ATEN_CPU_CAPABILITY"] = expected["software"]["cpu_capability"].lower()
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = ROOT
    command = [sys.executable, os.path.abspath(__file__), "--measure", str(path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=str(folder))
    assert done.returncode == 0, done.stderr[-3000:]
    with open(path) as f:
        return json.load(f)


def test_stored_rewards_are_the_graders(tmp_path):
    """batch.json's rewards are what the task's reward function gives its responses today."""
    args, _ = parse(None, str(tmp_path))
    with open(BATCH_PATH) as f:
        batch = json.load(f)
    reward_fn = grader.REWARD_FNS[args.reward]
    for i, response in enumerate(batch["responses"]):
        assert reward_fn(response, batch["ground_truths"][i]) == batch["rewards"][i], response
    raw = torch.tensor([d["reward"] for d in batch["rewards"]]).view(-1, args.group_size)
    varied = int((raw.amax(1) > raw.amin(1)).sum())
    assert varied >= 2, "the batch needs groups with reward variance, or there is no gradient"


def test_the_comparison_runs_where_the_cpu_can(expected, measured):
    """The safety net is on wherever it can be: on a CPU with the recorded vector unit, the
    subprocess ran that unit's kernels on the recorded torch and transformers, so no comparison
    below is skipped."""
    recorded = expected["software"]
    if not cpu_has(recorded["cpu_capability"]):
        pytest.skip(f"this CPU lacks {recorded['cpu_capability']}: the comparison cannot run here")
    assert measured["software"] == recorded, (
        f"the fingerprint ran on {measured['software']}, recorded on {recorded}: install the "
        f"pinned torch / transformers (requirements-cpu.txt), or re-record (module docstring)"
    )


@pytest.mark.parametrize("name", list(CONFIGS))
def test_two_train_steps_reproduce_the_recorded_bits(name, expected, measured):
    # other kernels round differently: the recorded bits say nothing about another stack
    if measured["software"] != expected["software"]:
        recorded = expected["software"]
        pytest.skip(f"recorded on {recorded}, this is {measured['software']}: re-record to use it")
    want = expected["configs"][name]
    got = measured["configs"][name]
    found = differences(got, want)
    stack = f"recorded on {expected['software']}, running on {measured['software']}"
    assert not found, f"{name}: {len(found)} differences ({stack}):\n" + "\n".join(found[:20])


# ----------------------------------------------------------------------------- re-recording
def main():
    p = argparse.ArgumentParser(description="Re-record the fingerprint (see the module docstring).")
    p.add_argument("--record", action="store_true", help="rewrite expected.json from batch.json")
    p.add_argument("--new-batch", action="store_true", help="sample batch.json (vLLM), then record")
    p.add_argument("--measure", metavar="JSON", help="write every configuration's fingerprint")
    flags = p.parse_args()
    if flags.measure:
        with tempfile.TemporaryDirectory() as out:
            measured = measure(out)
        with open(flags.measure, "w") as f:
            json.dump(measured, f)
        return
    if not flags.record and not flags.new_batch:
        p.error("pass --record, --new-batch or --measure JSON")
    os.makedirs(FOLDER, exist_ok=True)
    with tempfile.TemporaryDirectory() as out:
        if not flags.new_batch:
            record(out)
            return
        write_batch(sample_batch(out))
        print(f"wrote {BATCH_PATH}")
    # record in a fresh process, as the tests run: not after vLLM has set up this one
    subprocess.run([sys.executable, os.path.abspath(__file__), "--record"], check=True)


if __name__ == "__main__":
    sys.exit(main())
