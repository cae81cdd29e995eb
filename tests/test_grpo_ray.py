"""grpo_ray.py on a real local Ray cluster (CPU, the tiny model, a keyword task built here).

Covers:
- colocated x 2 on vLLM (two actors, each an engine and a learner shard): k=1 (with KL monitoring)
  and k=2 (stale batches take pi_old from the engine of version v), then --resume; each engine
  takes its own learner's weights, the M = 2 gradient equals one learner's on the same batch;
- the actor layouts of every placement (colocated: actor i is generator i and learner i);
- disaggregated sync and async (vLLM generator, object store; async with TIS, the mismatch split
  into kernel and staleness parts), and async over Ray Direct Transport (gloo, HF engine);
- engine and learner weights equal after the final sync; both trainers log grpo.py's keys; the
  staleness bound and the overlap read from the recorded lags and timestamps; a killed generator
  ends the run with a clear error naming it;
- scale-out (HF engines): 2 generators x 2 data-parallel learners, async: shards joined in order at
  one version per step, one weight put per version, the M = 2 gradient equal to one learner's on
  the same batch, --resume, a dead learner named; the CLI colocated x 2 with a third generator;
- time/weight_sync holds the transfer: a push slow to deserialise (object store) lengthens the
  span by as much; over RDT the span starts when the learner's copy exists (the engine idle);
- join_shards only concatenates, and grpo.summarize of the joined shards equals that of the whole
  batch for every train/ key, with --tools every tool/ key too (no Ray needed); runtime.json holds
  each actor's runtime record;
- --tools calculator, disaggregated (the tiny model) and colocated with a second generator (the
  embedded model): tool/ metrics on the step rows, tool calls in validation, the learner's loss
  mask without the tool output, a shard the same on either engine, and a reused generator's
  sandbox pool closed at its reset.

Ray starts once per module; each actor set is built once and reused across runs through reset().
"""

import copy
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import one_line_error, requires_vllm

ray = pytest.importorskip("ray")
import grader  # noqa: E402
import grpo  # noqa: E402
import grpo_ray  # noqa: E402
import lora  # noqa: E402
import metric_table  # noqa: E402
import runs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Whole words the tiny random model emits often (digits, symbols, merges of its BPE corpus): groups
# get reward variance, so the advantages are non-zero and the policy really moves.
SYMBOLS = ["<", "=", "+", "-"]
MERGES = ["and", "the", "The", "in", "at", "be", "e", "b", "I", "k", "answer", "User", "equ", "ers"]
WORDS = [str(i) for i in range(10)] + SYMBOLS + MERGES
SMALL = (
    "--task keyword --n-grpo-steps 3 --rollout-batch-size 8 --group-size 4 --train-batch-size 8 "
    "--gradient-accumulation-steps 2 --max-tokens 16 --min-tokens 2 --eval-n 2 --eval-every 0 "
    "--grader-workers 0 --lr 1e-3 --kl-every 0 --num-cpus 8 --timeout-s 300 --eager"
).split()
# grpo_ray.py's Ray bookkeeping on every step row, next to grpo.STEP_KEYS (its _log_step adds them
# to grpo.step_rows' keys; grpo.py has no equivalent, so the code keeps no list of them)
RAY_KEYS = ["ray/lag", "ray/version", "ray/gen_version"]


@pytest.fixture(scope="module")
def make_args(tiny_model_dir, tmp_path_factory):
    """make_args(*flags): grpo_ray's args for SMALL + the tiny model, the keyword file and a fresh
    --out, then the flags."""
    tmp = tmp_path_factory.mktemp("grpo_ray")
    kw = tmp / "keywords.txt"
    kw.write_text("\n".join(WORDS))
    counter = iter(range(1000))

    def make(*flags):
        data = ["--model", tiny_model_dir, "--train-path", str(kw), "--val-path", str(kw)]
        out = ["--out", str(tmp / f"run{next(counter)}")]
        return grpo_ray.parse_args(SMALL + data + out + list(flags))

    return make


@pytest.fixture(scope="module")
def cluster(make_args):
    grpo_ray.init_ray(make_args())
    yield
    ray.shutdown()


def start(actors, args):
    """Reset the actors for a new run with args; returns args. The driver claims the run
    directory first, as grpo_ray.main does, before an actor writes its engine log there."""
    runs.claim_run_dir(args.out, args.resume)
    ray.get([a.reset.remote(args) for a in actors["all"]], timeout=300)
    return args


def read(args, name):
    """A JSON file of the run, or the rows of a JSON-lines one."""
    with open(os.path.join(args.out, name)) as f:
        if name.endswith(".json"):
            return json.load(f)
        return [json.loads(line) for line in f]


def logged_steps(args):
    """The run's step rows (eval rows have no ray/lag)."""
    return [r for r in read(args, "metrics.jsonl") if "ray/lag" in r]


def assert_synced(gen_actor, args):
    """The engine's sampled log-probs equal the saved final policy's on the same tokens (weights
    match), and differ from the initial model's when some group had reward variance (training moved
    them)."""
    gen = ray.get(gen_actor.generate.remote(10_000), timeout=120)
    saved = read(args, os.path.join("checkpoint", "state.json"))
    assert gen["version"] == args.n_grpo_steps == saved["step"]
    runtime = grpo.setup_runtime(args)  # as inside an actor
    tensors = grpo.collate(gen["batch"], args)
    mask = tensors["response_mask"]
    engine = tensors["engine_log_probs"]
    ban = gen["batch"]["ban_token_ids"]
    final_policy = grpo.load_policy(os.path.join(args.out, "checkpoint"), args, runtime)[0]
    final = grpo.batch_log_probs(final_policy, tensors, args, runtime, ban)
    assert (final - engine).abs()[mask].max() < 2e-3
    if any(r["train/zero_var_frac"] < 1 for r in logged_steps(args)):
        init_policy = grpo.load_policy(args.model, args, runtime)[0]
        init = grpo.batch_log_probs(init_policy, tensors, args, runtime, ban)
        assert (init - engine).abs()[mask].max() > 1e-2


# Probes that run inside an actor (Ray's __ray_call__ hands them the actor's instance): shipped by
# value, since the workers cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def received_bytes(worker, pushed):
    """Transfer-only probe: the bytes of a pushed state dict once Ray resolved it in the generator,
    nothing loaded."""
    return sum(v.numel() * v.element_size() for v in pushed["weights"].values())


def wait_dead(actor, timeout=60):
    """Block until Ray reports the killed actor dead. ray.kill is asynchronous: a call sent right
    after it may still run on the live actor (CI saw exactly that), so poll rather than expect the
    first call to fail."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(deadline - time.time(), 1))
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            break
        time.sleep(0.2)
    raise AssertionError(f"actor still alive {timeout} s after ray.kill")


def no_reduce(t, op):
    """A learner group's reduce made the identity: each learner keeps its own share's sums."""
    return t


def gradient(worker, gen, mode="group", **flags):
    """The gradient BEFORE clipping (--max-grad-norm inf; flags override other settings) of every
    optimizer step train_step takes on gen (flattened, concatenated) and its history; nothing moves
    (SGD at lr 0). mode: "group" = this learner in its group (all-reduced), "alone" = one learner on
    the whole batch, "local" = this learner's share only (the group's reduce made the identity)."""
    params = list(worker.learner["policy"].parameters())
    grads = []
    args = copy.copy(worker.args)
    vars(args).update(max_grad_norm=math.inf, **flags)
    probe = torch.optim.SGD(params, lr=0.0)

    def keep_gradient(*_):
        grads.append(torch.cat([p.grad.flatten() for p in params]))

    probe.register_step_pre_hook(keep_gradient)
    if mode == "group":
        dp = worker.dp
    elif mode == "alone":
        dp = None
    elif mode == "local":
        dp = worker.dp
        if dp:
            dp = dict(dp, reduce=no_reduce)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    learner = dict(worker.learner, optimizer=probe)
    history, _ = grpo.train_step(learner, gen["batch"], args, worker.runtime, gen["step"], dp=dp)
    return torch.cat(grads), history


def assert_gradient_is_one_learners(learners, ref):
    """The 2 learners' all-reduced gradient equals one learner's on the same joined batch (`ref`,
    its rewards varied in every group, so its advantages are non-zero), unclipped (a factor M would
    hide behind the clip), with the seed's norm and with DAPO's (the whole step's token count
    across shards); grpo_clip: the sharded no-grad pi_old pass is in it too. And each learner
    really ran only its half: the two local losses are parts of the whole."""
    for flags in ({}, {"length_norm": "token"}):
        in_group = [x.__ray_call__.remote(gradient, ref, **flags) for x in learners]
        (g_a, h_a), (g_b, h_b) = ray.get(in_group, timeout=120)
        alone = learners[0].__ray_call__.remote(gradient, ref, "alone", **flags)
        g_1, h_1 = ray.get(alone, timeout=120)
        assert torch.equal(g_a, g_b)
        assert g_1.norm() > 0
        assert ((g_a - g_1).norm() / g_1.norm()).item() <= 1e-6, (
            f"M = 2 gradient differs from one learner's {flags}"
        )
        for k in ("train/loss", "train/grad_norm"):
            expected = pytest.approx([h[k] for h in h_1], rel=1e-6)
            assert [h[k] for h in h_a] == expected, (k, flags)
        parts = []
        for x in learners:
            local = x.__ray_call__.remote(gradient, ref, "local", **flags)
            _, history = ray.get(local, timeout=120)
            parts.append(history[0]["train/loss"])
        assert sum(parts) == pytest.approx(h_1[0]["train/loss"], rel=1e-5, abs=1e-7)
        assert min(abs(p) for p in parts) > 0


def kl_reward_advantages(worker, gen, mode="group"):
    """The advantages train_step's rewards -> advantages phase computes on gen with --kl-in reward
    (beta 0.5, against a reference moved off the policy by seeded noise, so the penalty is not 0),
    as this learner in its group ("group") or alone on the whole batch ("alone")."""
    args = copy.copy(worker.args)
    kl = dict(kl_beta=0.5, kl_in="reward", kl_in_reward=True, kl_in_loss=False, needs_ref=True)
    vars(args).update(kl, kl_estimator="k1", advantages_read_log_probs=True)
    policy = worker.learner["policy"]
    ref = copy.deepcopy(policy)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=noise))
    seen = []
    real = grpo.advantages

    def spy(*a):
        seen.append(real(*a))
        return seen[-1]

    dp = worker.dp
    if mode == "alone":
        dp = None
    probe = torch.optim.SGD(policy.parameters(), lr=0.0)  # moves nothing
    learner = dict(worker.learner, optimizer=probe, ref_model=ref, prev_model=None)
    grpo.advantages = spy
    try:
        grpo.train_step(learner, gen["batch"], args, worker.runtime, gen["step"], dp=dp)
    finally:
        grpo.advantages = real
    adv = seen[0][0]
    metrics = seen[0][2]
    return adv, metrics["train/kl_penalty"]


def assert_advantages_are_one_learners(learners, ref):
    """--kl-in reward needs pi_t and pi_ref per response: each learner scores its share and the
    passes are summed over the group, so both learners compute the advantages one learner
    computes on the whole batch."""
    in_group = [x.__ray_call__.remote(kl_reward_advantages, ref) for x in learners]
    (a_0, k_0), (a_1, k_1) = ray.get(in_group, timeout=120)
    alone, k_alone = ray.get(
        learners[0].__ray_call__.remote(kl_reward_advantages, ref, "alone"), timeout=120
    )
    assert k_alone != 0
    assert torch.equal(a_0, a_1)
    assert torch.allclose(a_0, alone, rtol=1e-5, atol=1e-6)
    assert k_0 == k_1 == pytest.approx(k_alone, rel=1e-5)


def test_eval_and_save_fall_on_the_first_push_past_each_multiple():
    # k = 4, --eval-every 10
    assert [v for v in range(4, 41, 4) if grpo_ray.due(10, v, 4)] == [12, 20, 32, 40]
    # k = 1, --eval-every 5; --eval-every 0: never
    assert [v for v in range(1, 11) if grpo_ray.due(5, v, 1)] == [5, 10]
    assert not grpo_ray.due(0, 4, 4)


# 2 disaggregated learners sharded with FSDP2
FSDP = "--placement disaggregated --num-learners 2 --learner-sharding fsdp"
# (flags, a substring of the one-line error)
BAD_MODES = [
    ("--async", "disaggregated"),
    ("--steps-per-rollout 2", "multiple"),
    ("--steps-per-rollout 2 --n-grpo-steps 4 --loss reinforce_with_baseline", "grpo_clip"),
    ("--placement disaggregated --async --loss no_baseline", "grpo_clip"),
    ("--placement disaggregated --weight-sync gloo", "engine hf"),
    ("--placement disaggregated --async --max-staleness 0", "integer > 0"),
    (
        "--placement disaggregated --engine hf --weight-sync gloo --num-generators 2",
        "object_store",
    ),
    ("--num-generators 3", "whole group"),  # 8 samples / group 4 = 2 prompts
    ("--placement disaggregated --num-learners 2 --num-cpus 2", "--num-cpus"),
    # --learner-sharding fsdp's refusals (FSDP = the flags that shard 2 disaggregated learners)
    ("--num-learners 2 --learner-sharding fsdp", "--placement disaggregated"),
    (FSDP.replace("disaggregated", "colocated"), "--placement disaggregated"),
    (FSDP.replace("--num-learners 2", ""), "--num-learners 2 or more"),
    (FSDP + " --lora-rank 2", "drop --lora-rank"),
    (FSDP + " --engine hf --weight-sync gloo", "--weight-sync object_store"),
    (FSDP + " --shared-prefix", "drop --shared-prefix"),
    (FSDP + " --save-every 1 --keep-checkpoints 1", "drop --keep-checkpoints"),
]


def test_parse_args_rejects_bad_modes(make_args, capsys):
    for flags, msg in BAD_MODES:
        with pytest.raises(SystemExit):
            make_args(*flags.split())
        err = capsys.readouterr().err
        assert err.startswith("error:") and msg in err, (flags, err)


# (flags, the actors' names in bundle order); the vLLM engine unless --engine hf
LAYOUTS = [
    ("", ["colocated 0"]),
    ("--num-generators 2", ["colocated 0", "generator 1"]),
    ("--num-learners 2", ["colocated 0", "learner 1"]),  # was refused with vLLM (issue 27)
    ("--num-generators 2 --num-learners 2", ["colocated 0", "colocated 1"]),
    ("--placement disaggregated", ["generator 0", "learner 0"]),
    (
        "--placement disaggregated --num-generators 2 --num-learners 2",
        ["generator 0", "generator 1", "learner 0", "learner 1"],
    ),
]


@pytest.mark.parametrize("flags,names", LAYOUTS)
def test_actor_layouts(make_args, flags, names):
    """Colocated, actor i is generator i and learner i for i < min(N, M), the rest one role each;
    --devices counts the actors; any M with the vLLM engine (the learner group is not
    torch.distributed's default group, which the engine owns)."""
    args = make_args(*flags.split())
    specs = grpo_ray.actor_specs(args)
    assert [name for name, _, _ in specs] == names
    assert args.devices == len(names)
    assert sum(generator for _, generator, _ in specs) == args.num_generators
    assert sum(learner for _, _, learner in specs) == args.num_learners
    for name, generator, learner in specs:
        assert (generator and learner) == name.startswith("colocated"), name


# A step's scored groups (G = 4) for the shard tests: (answer rewards, format rewards) of each.
# Group 1's answers are flat but its format varies, so its total reward does too: the
# --dynamic-sampling fallback case, whose advantages summarize zeroes.
GROUPS = [
    ([1, 0, 0, 1], [1, 1, 0, 1]),
    ([0, 0, 0, 0], [1, 0, 1, 1]),
    ([1, 1, 1, 1], [1, 1, 1, 1]),
    ([0, 1, 0, 0], [0, 1, 1, 0]),
    ([0, 0, 0, 0], [0, 0, 0, 0]),
]
SHARD_GROUPS = [2, 1, 2]  # groups per shard: whole groups, unequal shards


def scored_rows(groups, first=0, tools=False):
    """A scored batch as grpo.collect returns it, of the given (answers, formats) groups, numbered
    from `first`: response lengths and truncation vary by row. tools: with grpo.TOOL_KEYS' columns
    (tool_columns)."""
    batch = {
        "prompts": [],
        "ground_truths": [],
        "responses": [],
        "prompt_ids": [],
        "response_ids": [],
        "engine_logprobs": [],
        "truncated": [],
        "rewards": [],
    }
    raw = []
    for g, (answers, formats) in enumerate(groups, start=first):
        for j in range(len(answers)):
            n = 3 + (5 * g + 3 * j) % 7  # response tokens
            batch["prompts"].append(f"p{g}")
            batch["ground_truths"].append(f"t{g}")
            batch["responses"].append(f"r{g}.{j}")
            batch["prompt_ids"].append([1, 2, 3 + g])
            batch["response_ids"].append(list(range(10, 10 + n)))
            batch["engine_logprobs"].append([-0.5] * n)
            batch["truncated"].append(n == 9)
            reward = answers[j] + 0.25 * formats[j]
            batch["rewards"].append(
                {"reward": reward, "format_reward": formats[j], "answer_reward": answers[j]}
            )
            raw.append(reward)
    batch["raw"] = torch.tensor(raw, dtype=torch.float32)  # (N,)
    batch["correct"] = [grader.is_correct(d) for d in batch["rewards"]]
    batch["ban_token_ids"] = [7, 9]
    if tools:
        batch |= tool_columns(batch["response_ids"], first * 4)
    return batch


def tool_columns(response_ids, first):
    """A --tools batch's columns (grpo.TOOL_KEYS) for the rows' responses, numbered from row
    `first`: calls, errors, tool output (policy mask 0) and voids vary by row."""
    columns = {key: [] for key in grpo.TOOL_KEYS}
    for k, ids in enumerate(response_ids, start=first):
        calls = k % 3
        obs = min(2 * calls, len(ids) - 1)  # tool-output tokens, mid-response
        mask = [1] * len(ids)
        mask[1 : 1 + obs] = [0] * obs
        columns["transcripts"].append(f"transcript {k}")
        columns["policy_masks"].append(mask)
        columns["truncated_by_tool"].append(k % 5 == 4)
        columns["calls"].append(calls)
        columns["errors"].append(int(calls == 2))
        columns["timeouts"].append(int(k % 7 == 2))
        columns["turns"].append(calls + 1)
        columns["obs_tokens"].append(obs)
        columns["void"].append(k % 4 == 1)
    return columns


def fixed_shards(version=3, tools=False):
    """The step's groups split over len(SHARD_GROUPS) generators, each shard as Worker.generate
    returns it; each shard's stats differ. tools: a --tools run's shards (tool columns and
    seconds)."""
    shards = []
    first = 0
    for i, n in enumerate(SHARD_GROUPS):
        stats = {
            "generation_s": 5.0 - i,
            "grading_s": 0.5 + i,
            "extra_rounds_s": 1.0 + 2 * i,
            "prompts_sampled": n + 2 * i,
            "groups_flat": i,
            "groups_all_correct": i,
            "groups_all_wrong": 1,
            "tool_s": 0.0,
        }
        if tools:
            stats["tool_s"] = 0.25 + 0.5 * (i == 1)
        shard = {
            "step": 5,
            "version": version,
            "batch": scored_rows(GROUPS[first : first + n], first, tools),
            "stats": stats,
            "spans": [{"actor": f"generator {i}"}],
        }
        shards.append(shard)
        first += n
    return shards


def shard_args(tools=False):
    """grpo's flags for GROUPS with --dynamic-sampling (so the dynamic_* metrics exist); tools:
    with --tools calculator."""
    n_rows = 4 * len(GROUPS)
    flags = ["--dynamic-sampling", "--group-size", "4", "--rollout-batch-size", str(n_rows)]
    flags += ["--train-batch-size", str(n_rows)]
    if tools:
        flags += ["--tools", "calculator"]
    return grpo.parse_args(flags)


@pytest.mark.parametrize("tools", [False, True], ids=["no_tools", "tools"])
def test_join_shards_only_concatenates_in_order(tools):
    """Shards of one step: rows in shard order (with --tools every tool column too, the policy
    masks the learners train with among them), the engine's banned ids once, the shards' stats in
    a list, and no metrics (grpo.summarize computes them on the joined batch); shards from two
    policy versions are refused."""
    shards = fixed_shards(tools=tools)
    g = grpo_ray.join_shards(shards)
    whole = scored_rows(GROUPS, tools=tools)
    assert g["batch"]["prompts"] == whole["prompts"]
    assert g["batch"]["response_ids"] == whole["response_ids"]
    for key in grpo.TOOL_KEYS:
        assert g["batch"].get(key) == whole.get(key), key
    assert ("policy_masks" in whole) == tools
    assert g["batch"]["rewards"] == whole["rewards"]
    assert torch.equal(g["batch"]["raw"], whole["raw"])
    assert g["batch"]["ban_token_ids"] == [7, 9]
    assert set(g["batch"]) == set(whole)  # nothing added: no advantages, no metrics
    assert (g["step"], g["version"]) == (5, 3)
    assert g["stats"] == [s["stats"] for s in shards]
    assert len(g["spans"]) == len(shards)
    assert "metrics" not in g
    mixed = fixed_shards()
    mixed[1]["version"] = 2
    with pytest.raises(SystemExit):  # shards of one step from two policy versions
        grpo_ray.join_shards(mixed)


@pytest.mark.parametrize("tools", [False, True], ids=["no_tools", "tools"])
def test_summarize_of_joined_shards_equals_summarize_of_the_whole_batch(tools):
    """The metrics and advantages of the joined shards are those of the whole batch summarised at
    once, for every train/ key (batch statistics are not per shard); with --tools every tool/ key
    too, and time/tool is the longest shard's."""
    args = shard_args(tools)
    shards = fixed_shards(tools=tools)
    stats = [s["stats"] for s in shards]
    joined = grpo_ray.join_shards(shards)
    got = grpo.summarize(joined["batch"], joined["stats"], args)
    whole = scored_rows(GROUPS, tools=tools)  # the concatenated batch, built by hand
    expected = grpo.summarize(whole, stats, args)
    batch_keys = [k for k in expected if k.startswith(("train/", "tool/"))]
    assert {"train/dynamic_filtered_frac", "train/dynamic_prompts_sampled"} <= set(batch_keys)
    assert set(got) == set(expected)
    for key in batch_keys:
        assert got[key] == expected[key], key
    tool_keys = [k for k in metric_table.some_keys("grpo_ray") if k.startswith("tool/")]
    if tools:
        assert tool_keys and set(tool_keys) <= set(got)
        assert got["time/tool"] == 0.75  # shard 1's
        # the policy's tokens, not the tool output's
        assert got["train/response_len_mean"] < got["train/response_len_total_mean"]
        assert 0 < got["tool/error_rate"] < 1
    else:
        assert not set(tool_keys) & set(got)
    no_kl = {"policy": None, "ref": None}
    joined_adv, _, _ = grpo.advantages(joined["batch"], None, no_kl, args)
    whole_adv, _, _ = grpo.advantages(whole, None, no_kl, args)
    assert torch.equal(joined_adv, whole_adv)
    # the check is not vacuous: groups with and without signal, the fallback group zeroed
    adv = whole_adv.view(len(GROUPS), 4)  # (groups, G)
    assert adv[0].abs().sum() > 0
    assert adv[1].abs().sum() == 0
    assert 0 < expected["train/zero_var_frac"] < 1


@pytest.mark.parametrize("case", ["blank val", "hub Countdown"])
def test_bad_data_fails_in_one_line_before_ray_starts(make_args, tmp_path, case):
    """grpo.load_data runs on the driver before Ray, an actor or a model starts: one line naming the
    flag, no Ray session, no run directory (it was an actor's traceback some 30 s in, with a
    misleading --resume hint)."""
    args = make_args()
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    if case == "blank val":
        data = ["--train-path", args.train_path, "--val-path", str(blank)]
        needle = "check --val-path"
    else:
        data = ["--task", "countdown"]
        needle = "prepare countdown --from"  # no hub here (conftest: HF_HUB_OFFLINE)
    script = os.path.join(ROOT, "grpo_ray.py")
    cmd = [sys.executable, script, *SMALL, "--model", args.model, "--engine", "hf", *data]
    cmd += ["--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    one_line_error(proc, needle)
    assert "ray:" not in proc.stdout
    assert not os.path.exists(tmp_path / "o")


def sleep_a_minute():
    time.sleep(60)


def test_bounded_get_names_the_phase(cluster):
    slow = ray.remote(num_cpus=0)(sleep_a_minute).remote()
    t0 = time.time()
    with pytest.raises(RuntimeError, match="probe did not finish within --timeout-s 0.5s"):
        grpo_ray.get(slow, "probe", SimpleNamespace(timeout_s=0.5, ray_tmp="/tmp"))
    assert time.time() - t0 < 10
    ray.cancel(slow, force=True)


@requires_vllm
def test_colocated_on_policy_then_k_steps(cluster, make_args):
    """Colocated x 2 learners on the vLLM engine (issue 27): two actors, each an engine and a
    learner shard taking turns. Both engines take the same version from the learner beside them
    (no put), each samples its shard, the learners train the joined batch in lockstep with one
    learner's gradient; then k = 2 and --resume on the same actors."""
    # seed 1: batch 0 has a signal
    flags = "--kl-every 1 --num-generators 2 --num-learners 2 --seed 1"
    args = make_args(*flags.split())
    actors = grpo_ray.build_actors(args)
    try:
        summary = grpo_ray.run(args, actors)
        assert summary["mode"] == "colocated-k1-N2M2"
        rows = logged_steps(args)
        assert [r["step"] for r in rows] == [0, 1, 2]
        assert summary["lags"] == [0, 0, 0]
        # grpo.py's step keys, the Ray bookkeeping, and what --kl-every 1 adds: the KL to pi_init
        # and the engine-trainer mismatch (pi_t is scored for the KL)
        keys = set(grpo.STEP_KEYS + RAY_KEYS + ["train/kl_ref", "train/logprob_mismatch"])
        assert all(keys <= set(r) for r in rows), keys - set(rows[0])
        assert rows[0]["time/step"] <= rows[0]["time/wall"] + 1e-3, (
            "step 0's time/step counted the first eval"
        )
        assert all(r["train/kl_ref"] >= 0 for r in rows)
        assert all(r["train/kl_prev"] >= 0 for r in rows[1:])
        assert any(r["train/zero_var_frac"] < 1 for r in rows), (
            "no reward variance: the policy cannot move"
        )
        assert summary["devices"] == 2
        assert summary["samples"] == 24
        assert summary["samples_per_s"] > 0
        assert {"generate", "score", "train", "weight_sync"} <= set(summary["phase_mean_s"])
        timeline = read(args, "timeline.json")
        by = {}  # phase -> sorted (actor, step) of its spans
        for phase in ("generate", "train", "weight_sync", "get_weights"):
            by[phase] = sorted((s["actor"], s["step"]) for s in timeline if s["phase"] == phase)
        both = [(f"colocated {i}", t) for i in range(2) for t in range(3)]
        assert by["generate"] == by["train"] == by["weight_sync"] == both
        assert by["get_weights"] == [], "a colocated engine copies its own learner's weights"
        assert os.path.getsize(os.path.join(args.out, "timeline.png")) > 0
        assert os.path.exists(os.path.join(args.out, "checkpoint", "model.safetensors"))
        # the learners in lockstep, and each engine holds the saved policy (learner 0's)
        w0, w1 = ray.get([a.get_weights.remote() for a in actors["learner"]])
        assert all(torch.equal(w0["weights"][k], w1["weights"][k]) for k in w0["weights"]), (
            "learners out of lockstep"
        )
        for gen in actors["generator"]:
            assert_synced(gen, args)
        # the gradient of the two colocated learners equals one learner's on the joined batch
        generating = [g.generate.remote(7, (i, 2)) for i, g in enumerate(actors["generator"])]
        joined = grpo_ray.join_shards(ray.get(generating, timeout=120))
        joined["batch"]["raw"] = torch.linspace(-1.0, 1.0, len(joined["batch"]["raw"]))
        assert_gradient_is_one_learners(actors["learner"], ray.put(joined))

        # Problem 7 B: k=2 batches from version v, the second one stale (pi_old = the engine's,
        # version v)
        flags = "--steps-per-rollout 2 --loss grpo_clip --n-grpo-steps 4"
        flags += " --num-generators 2 --num-learners 2"
        args = start(actors, make_args(*flags.split()))
        summary = grpo_ray.run(args, actors)
        assert summary["lags"] == [0, 1, 0, 1]
        rows = logged_steps(args)
        assert [r["ray/gen_version"] for r in rows] == [0, 0, 2, 2]
        assert_synced(actors["generator"][1], args)

        # --resume: the run's flags and checkpoint, two more batches, rows of earlier steps kept
        resumed = start(actors, grpo_ray.parse_args(["--resume", args.out, "--n-grpo-steps", "6"]))
        assert resumed.steps_per_rollout == 2
        assert (resumed.num_generators, resumed.num_learners) == (2, 2)
        assert resumed.lr == args.lr
        assert resumed.out == args.out
        summary = grpo_ray.run(resumed, actors)
        rows = logged_steps(resumed)
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
        assert summary["lags"] == [0, 1]
        assert_synced(actors["generator"][0], resumed)
    finally:
        grpo_ray.kill_actors(actors)


@pytest.fixture(scope="module")
def disaggregated(cluster, make_args):
    actors = grpo_ray.build_actors(make_args("--placement", "disaggregated"))
    yield actors
    grpo_ray.kill_actors(actors)


def spans(args, phase, actor=None):
    """{step: span} of one phase in the run's timeline (of one actor, if given)."""
    by_step = {}
    for s in read(args, "timeline.json"):
        if s["phase"] == phase and actor in (None, s["actor"]):
            by_step[s["step"]] = s
    return by_step


def record_curriculum(monkeypatch):
    """[(step, picks)] of every Curriculum.choose and the (prompt, fraction correct) outcomes of
    every update, as the driver calls them (it runs in this process)."""
    chosen = []
    updates = []
    choose = grpo.Curriculum.choose
    update = grpo.Curriculum.update

    def recorded_choose(self, step):
        chosen.append((step, choose(self, step)))
        return chosen[-1][1]

    def recorded_update(self, outcomes):
        updates.append(list(outcomes))
        update(self, outcomes)

    monkeypatch.setattr(grpo.Curriculum, "choose", recorded_choose)
    monkeypatch.setattr(grpo.Curriculum, "update", recorded_update)
    return chosen, updates


def test_the_curriculum_is_in_the_state_before_the_first_step(make_args):
    """The driver's state holds the sampler's rates from the start: a save before this session's
    first step (a stop during the first rollout after --resume) keeps the resumed ones."""
    args = make_args("--curriculum")
    rows = grpo.load_data(args)[0]
    resumed = grpo.Curriculum(rows, args)
    resumed.update([(rows[0]["prompt"], 1.0)])
    state = {}
    assert grpo_ray.start_curriculum(args, {"curriculum": resumed.state()}, state) is not None
    assert state["curriculum"] == resumed.state()
    state = {}
    assert grpo_ray.start_curriculum(make_args(), {}, state) is None and state == {}


@requires_vllm
def test_disaggregated_sync(disaggregated, make_args, monkeypatch):
    """Also the sampled validation and the checkpoint series (issue 32) through the actors, and
    --curriculum: the driver's sampler chooses each step's prompts, the generator samples those,
    the sampler learns from the joined batch once per step, as grpo.py's; the checkpoint saves it
    and a resume continues it."""
    flags = "--placement disaggregated --eval-every 1 --eval-samples 2 --save-every 1"
    flags += " --keep-checkpoints 1 --curriculum"
    args = start(disaggregated, make_args(*flags.split()))
    chosen, updates = record_curriculum(monkeypatch)
    summary = grpo_ray.run(args, disaggregated)
    assert summary["lags"] == [0, 0, 0]
    assert summary["devices"] == 2
    # time/step excludes validation, as in grpo.py: the steps' times add up to the wall clock less
    # the evals
    rows = read(args, "metrics.jsonl")
    steps = [r for r in rows if "ray/lag" in r]
    evals = [r for r in rows if "time/eval" in r]  # evals at 0, 1, 2, 3
    mid_run_evals = sum(r["time/eval"] for r in evals[1:3])
    assert len(evals) == 4
    n_questions = len(grpo.load_data(args)[1])
    for r in evals:  # k = 2 samples per question beside the greedy answer
        assert r["eval/n_questions"] == n_questions
        assert 0 <= r["eval/avg@k"] <= r["eval/pass@k"] <= 1
        assert "eval/pass@k_se" in r
    # --keep-checkpoints 1: the last save's weights only, beside the resumable checkpoint/
    # (written.json: the snapshots this run wrote, the only ones it may rotate away)
    assert sorted(os.listdir(os.path.join(args.out, "checkpoints"))) == [
        "step_0003",
        "written.json",
    ]
    assert sum(r["time/step"] for r in steps) <= steps[-1]["time/wall"] - mid_run_evals + 1e-3
    gen = spans(args, "generate")
    train = spans(args, "train")
    sync = spans(args, "weight_sync", "generator 0")
    assert all(gen[t + 1]["t0"] >= train[t]["t1"] for t in range(2)), "sync: no overlap"
    assert all(gen[t + 1]["t0"] >= sync[t]["t1"] for t in range(2)), (
        "sync: generation t+1 uses train t's weights"
    )
    assert_synced(disaggregated["generator"][0], args)
    # --curriculum: grpo.py's sampler replayed on the shards' group outcomes chooses the same
    # prompts, the outcomes are theirs (one per group, shard by shard, once per step), and it ends
    # with the success rates the checkpoint saved
    monkeypatch.undo()  # the replay's own calls unrecorded
    train_rows = grpo.load_data(args)[0]
    replay = grpo.Curriculum(train_rows, args)
    assert [step for step, _ in chosen] == [0, 1, 2]
    assert len(updates) == 3 * len(disaggregated["generator"])
    n_shards = len(disaggregated["generator"])
    for t, (step, picks) in enumerate(chosen):
        assert replay.choose(step) == picks
        outcomes = []
        for shard_outcomes in updates[t * n_shards : (t + 1) * n_shards]:
            outcomes += shard_outcomes
        assert [prompt for prompt, _ in outcomes] == [train_rows[j]["prompt"] for j in picks]
        replay.update(outcomes)
    assert read(args, "checkpoint/state.json")["curriculum"] == replay.state()
    resumed = start(
        disaggregated, grpo_ray.parse_args(["--resume", args.out, "--n-grpo-steps", "4"])
    )
    chosen, _ = record_curriculum(monkeypatch)
    grpo_ray.run(resumed, disaggregated)
    monkeypatch.undo()
    assert chosen == [(3, replay.choose(3))], "the resumed sampler is the saved one"


@requires_vllm
def test_disaggregated_async_staleness_and_overlap(disaggregated, make_args):
    flags = "--placement disaggregated --async --loss grpo_clip --rollout-is tis --kl-every 1"
    flags += " --seed 4"  # seed 4: batch 0 has a signal
    args = start(disaggregated, make_args(*flags.split()))
    summary = grpo_ray.run(args, disaggregated)
    assert summary["lags"] == [0, 1, 1]
    assert summary["max_lag"] <= args.max_staleness
    rows = logged_steps(args)
    # TIS on every batch; the stale ones split their mismatch into kernel and staleness parts
    for r in rows:
        assert {"train/is_weight_mean", "train/is_weight_max", "train/mismatch_kl"} <= set(r)
    for r in rows[1:]:
        assert r["train/mismatch_kernel_kl"] < 1e-5
        assert r["train/mismatch_staleness_kl"] >= 0
    assert rows[0]["train/zero_var_frac"] < 1, (
        "step 0 did not move the policy: the lag-1 checks below would be vacuous"
    )
    # the policy moved: a stale batch's staleness KL grew
    assert max(r["train/mismatch_staleness_kl"] for r in rows[1:]) > 1e-6
    # with --rollout-is a stale batch's pi_old is the current policy (mu's staleness goes into the
    # IS weights), so the ratio is 1
    for r in rows[1:]:
        assert r["ray/lag"] == 1
        assert r["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert r["train/ratio_min"] == pytest.approx(1.0, abs=1e-4)
        assert r["train/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    gen = spans(args, "generate")
    train = spans(args, "train")
    sync = spans(args, "weight_sync", "generator 0")
    # Batch 1 needs only version 0, so it runs on the generator while the learner trains batch 0.
    assert gen[1]["t0"] < train[0]["t1"], "async: generation 1 should start before train 0 ends"
    # Later steps: batch t+1 never waits for train t's weights (whether it also overlaps train t in
    # wall time depends on how long a weight load takes against a train step, so that is not
    # asserted).
    assert all(gen[t + 1]["t0"] < sync[t]["t0"] for t in range(2)), (
        "async: generation t+1 waited for train t"
    )
    assert_synced(disaggregated["generator"][0], args)


# ----------------------------------------------------------------------------- --tools (helpers)
# test_tools_disaggregated runs on this module's disaggregated actors; the colocated run on the
# embedded model is at the end (actors of its own: another model)
def assert_tool_rows(args):
    """Every step row has the tool/ metrics (grpo.summarize on the joined shards) and time/tool;
    the policy called the tool; every eval row has its validation calls."""
    steps = logged_steps(args)
    tool_keys = [k for k in metric_table.some_keys("grpo_ray") if k.startswith("tool/")]
    assert tool_keys
    for r in steps:
        missing = set(tool_keys + ["time/tool", "train/response_len_total_mean"]) - set(r)
        assert not missing, missing
    assert any(r["tool/calls_mean"] > 0 for r in steps), "no tool call: the checks are vacuous"
    evals = [r for r in read(args, "metrics.jsonl") if "eval/accuracy" in r]
    assert len(evals) == 2  # before the first step and after the last
    assert all("eval/tool_calls_mean" in r for r in evals)


def trained_masks(worker, gen):
    """The masks grpo.train_step builds on this learner from gen's batch (a spy on grpo.collate);
    nothing moves (SGD at lr 0)."""
    seen = []
    real = grpo.collate

    def spy(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]

    probe = torch.optim.SGD(worker.learner["policy"].parameters(), lr=0.0)
    learner = dict(worker.learner, optimizer=probe)
    grpo.collate = spy
    try:
        grpo.train_step(
            learner, gen["batch"], worker.args, worker.runtime, gen["step"], dp=worker.dp
        )
    finally:
        grpo.collate = real
    return {k: seen[0][k] for k in ("response_mask", "policy_mask", "loss_mask")}


def assert_loss_leaves_tool_output_out(learner, gen):
    """The batch a learner trains on carries the generators' policy masks: its loss mask covers
    the tokens the engines sampled and none of the tool output inside the responses."""
    batch = gen["batch"]
    masks = ray.get(learner.__ray_call__.remote(trained_masks, ray.put(gen)), timeout=120)
    tool_output = masks["response_mask"] & ~masks["policy_mask"]  # (N, T)
    assert int(tool_output.sum()) == sum(batch["obs_tokens"]) > 0, "no tool output in the batch"
    assert not (masks["loss_mask"] & tool_output).any()
    assert int(masks["loss_mask"].sum()) == sum(sum(m) for m in batch["policy_masks"])


def reset_and_probe_pool(worker, args):
    """Reset this generator for `args`; -> (the previous run's pool closed, the new tool's name
    and whether it has a pool)."""
    old = worker.tool.pool
    worker.reset(args)
    return old.stop.is_set(), worker.tool.name, worker.tool.pool is not None


@requires_vllm
def test_tools_disaggregated(disaggregated, make_args):
    """--tools calculator disaggregated (the module's tiny model, which writes the trigger "="
    often, with the calculator's prompt): the generator's batch reaches the learner actor with its
    policy masks (the loss leaves the tool output out), the sampled validation uses the tool; a
    reused generator closes the previous run's sandbox pool (python) at its reset."""
    flags = "--placement disaggregated --tools calculator --prompt r1_zero_calculator"
    flags += " --max-tokens 48 --n-grpo-steps 1 --eval-samples 2"
    args = start(disaggregated, make_args(*flags.split()))
    grpo_ray.run(args, disaggregated)
    assert_tool_rows(args)
    evals = [r for r in read(args, "metrics.jsonl") if "eval/accuracy" in r]
    assert all("eval/pass@k" in r for r in evals)
    generator = disaggregated["generator"][0]
    gen = ray.get(generator.generate.remote(7), timeout=120)
    assert_loss_leaves_tool_output_out(disaggregated["learner"][0], gen)
    # python's pool lives in the generator: closed when the actor starts its next run
    flags = ["--placement", "disaggregated", "--tools", "python", "--tool-sandbox", "none"]
    python = make_args(*flags, "--prompt", "r1_zero_python")  # no call runs: no bwrap needed
    ray.get(generator.reset.remote(python), timeout=300)
    probe = generator.__ray_call__.remote(reset_and_probe_pool, args)
    assert ray.get(probe, timeout=120) == (True, "calculator", False)


@requires_vllm
def test_ctrl_c_saves_the_logged_steps_and_resume_continues(disaggregated, make_args, ctrl_c):
    """A real SIGINT to the driver mid-run (after step 1 is logged, wherever the driver then is:
    waiting for a rollout, or inside a train step, which finishes first): exit 130, a checkpoint at
    exactly the steps logged, and --resume continues with no step lost or repeated."""
    # ~15 ms a step
    args = make_args("--placement", "disaggregated", "--n-grpo-steps", "5000")
    args = start(disaggregated, args)
    metrics = os.path.join(args.out, "metrics.jsonl")
    done = threading.Event()

    def step_1_logged():
        return os.path.exists(metrics) and '"step": 1,' in open(metrics).read()

    def interrupt():
        # a stray signal after run() would hit another test: only while it runs
        while not step_1_logged() and not done.wait(0.05):
            pass
        if not done.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(SystemExit) as e:
            grpo_ray.run(args, disaggregated)
    finally:
        done.set()
    assert e.value.code == 130
    saved = read(args, os.path.join("checkpoint", "state.json"))
    rows = logged_steps(args)
    assert [r["step"] for r in rows] == list(range(saved["step"]))
    assert 2 <= saved["step"] < 5000
    assert saved["opt_step"] == rows[-1]["opt_step"]
    argv = ["--resume", args.out, "--n-grpo-steps", str(saved["step"] + 2)]
    resumed = start(disaggregated, grpo_ray.parse_args(argv))
    grpo_ray.run(resumed, disaggregated)
    assert [r["step"] for r in logged_steps(resumed)] == list(range(saved["step"] + 2))
    assert_synced(disaggregated["generator"][0], resumed)


def slow_to_load(seconds):
    """Ballast's unpickler: it sleeps, as a slow transfer would."""
    time.sleep(seconds)
    return seconds


class Ballast:
    """An object that takes `seconds` to deserialise: a transfer this single node cannot make slow
    (one shared-memory object store)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return (slow_to_load, (self.seconds,))


@ray.remote(num_cpus=0)
class SlowLearner:
    """Stands in for learner 0 in grpo_ray._push: its get_weights returns real weights plus ballast
    that takes `seconds` to deserialise."""

    def __init__(self, pushed, seconds):
        self.pushed = pushed
        self.seconds = seconds

    def get_weights(self, clone=False):
        return dict(self.pushed, ballast=Ballast(self.seconds))


@requires_vllm
def test_weight_sync_times_the_transfer(disaggregated, make_args):
    """time/weight_sync (the generator's weight_sync span) holds the fetch and deserialisation of
    an object-store push, not only the load: a push that takes 1 s to deserialise gives a span of
    at least 1 s (Ray resolved the ref before set_weights started: the span was the load alone)."""
    args = make_args("--placement", "disaggregated")
    pushed = ray.get(disaggregated["learner"][0].get_weights.remote(), timeout=60)
    slow = SlowLearner.remote(pushed, 1.0)
    actors = dict(disaggregated, learner=[slow])
    t0 = time.time()
    try:
        (out,) = grpo_ray.get(grpo_ray._push(actors, 0, {}), "probe", args)
    finally:
        ray.kill(slow)
    (sync,) = [s for s in out["spans"] if s["phase"] == "weight_sync"]
    assert sync["t1"] - sync["t0"] >= 1.0, "time/weight_sync left the transfer out"
    assert sync["t0"] >= t0
    assert out["version"] == 0


@requires_vllm
def test_killed_generator_raises_not_hangs(disaggregated, make_args):
    # the last user of `disaggregated`: it kills its generator
    args = make_args("--placement", "disaggregated", "--async", "--n-grpo-steps", "200")
    args = start(disaggregated, args)
    failure = {}

    def drive():
        try:
            grpo_ray.run(args, disaggregated)
        except Exception as e:  # noqa: BLE001 - handed to the test thread
            failure["error"] = e

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    metrics = os.path.join(args.out, "metrics.jsonl")

    def a_step_logged():
        return os.path.exists(metrics) and "ray/lag" in open(metrics).read()

    deadline = time.time() + 120
    while not a_step_logged() and time.time() < deadline:
        time.sleep(0.2)
    assert thread.is_alive() and "ray/lag" in open(metrics).read(), (
        "the run should be mid-way (200 steps)"
    )
    t0 = time.time()
    ray.kill(disaggregated["generator"][0])
    thread.join(60)
    assert not thread.is_alive(), "driver hung after the generator died"
    assert isinstance(failure.get("error"), RuntimeError), failure
    msg = str(failure["error"])  # one line: which actor, Ray's error type, how to go on
    assert "generator 0 died during" in msg
    assert "ActorDiedError" in msg
    assert f"--resume {args.out}" in msg
    assert "\n" not in msg
    assert time.time() - t0 < 60


def test_async_over_ray_direct_transport_gloo(cluster, make_args):
    flags = "--placement disaggregated --engine hf --weight-sync gloo --async --loss grpo_clip"
    args = make_args(*flags.split())
    actors = grpo_ray.build_actors(args)
    try:
        summary = grpo_ray.run(args, actors)
        assert summary["weight_sync"] == "gloo"
        assert summary["lags"] == [0, 1, 1]
        # runtime.json: each actor's runtime record (grpo.setup_runtime's fields), by actor name
        records = read(args, "runtime.json")
        assert set(records) == set(actors["names"].values())
        driver = runs.jsonable(grpo.setup_runtime(args))
        for name, record in records.items():
            assert set(record) == set(driver), name
            if driver["gpus_visible"] == 0:  # CPU only: each actor decides what the driver does
                assert record["policy_device"] == record["vllm_device"] == "cpu", name
                assert record["param_dtype"] == driver["param_dtype"], name
        assert_synced(actors["generator"][0], args)
        # time/weight_sync over RDT: Ray receives before set_weights starts, so the span starts
        # when the engine is free (here: idle) and the learner's copy exists; it holds the receive
        version = args.n_grpo_steps
        (out,) = ray.get(grpo_ray._push(actors, version, {"tensor_transport": "gloo"}), timeout=60)
        copy_span, sync = out["spans"]
        assert (copy_span["phase"], sync["phase"]) == ("get_weights", "weight_sync")
        assert sync["t0"] == copy_span["t1"], "the RDT receive left out of time/weight_sync"
        learner = actors["learner"][0]
        pushed = learner.get_weights.options(tensor_transport="gloo").remote(clone=True)
        probe = actors["generator"][0].__ray_call__.remote(received_bytes, pushed)
        n_bytes = ray.get(probe, timeout=60)
        policy = grpo.load_policy(args.model, args, grpo.setup_runtime(args))[0]
        assert n_bytes == sum(p.numel() * p.element_size() for p in policy.state_dict().values())
    finally:
        grpo_ray.kill_actors(actors)


def cli_command(args, out, *flags):
    """grpo_ray.py as a subprocess joining this module's cluster through --address: SMALL's sizes,
    HF engine, the model and keyword files of `args`, --out `out`, then `flags`."""
    cmd = [sys.executable, os.path.join(ROOT, "grpo_ray.py")]
    cmd += ["--address", ray.get_runtime_context().gcs_address, "--engine", "hf"]
    cmd += ["--model", args.model, "--train-path", args.train_path, "--val-path", args.val_path]
    cmd += SMALL[SMALL.index("--rollout-batch-size") : SMALL.index("--num-cpus")]
    cmd += ["--task", "keyword", "--out", str(out), *flags]
    return cmd


def test_cli_smoke_joins_the_cluster(cluster, make_args, tmp_path):
    """The script end to end as a subprocess, joining this module's cluster through --address:
    colocated x 2 learners with a third generator (HF engine; 3 prompts a step): the two colocated
    engines copy their own learner's weights, generator 2 reads learner 0's put. --threads 2 reaches
    every actor, each a process of its own (Ray's default there is OMP_NUM_THREADS = the actor's
    CPUs, 1)."""
    flags = ["--n-grpo-steps", "2", "--num-generators", "3", "--num-learners", "2"]
    flags += ["--rollout-batch-size", "12", "--train-batch-size", "12"]
    flags += ["--placement-strategy", "spread", "--threads", "2"]
    cmd = cli_command(make_args(), tmp_path / "cli", *flags)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["mode"] == "colocated-k1-N3M2"
    assert summary["steps"] == 2
    assert summary["devices"] == 3
    outputs = ["summary.json", "timeline.png", "metrics.jsonl", "checkpoint", "dashboard.png"]
    for name in outputs + ["args.json", "runtime.json"]:
        assert os.path.exists(tmp_path / "cli" / name), name
    with open(tmp_path / "cli" / "runtime.json") as f:
        records = json.load(f)
    assert len(records) == summary["devices"]  # one record per actor
    for name, record in records.items():
        assert record["threads"] == 2, name  # torch.get_num_threads() in the actor
    # each says so at start (Ray forwards the lines, folding repeats into one)
    assert "threads: 2 (--threads)" in proc.stdout + proc.stderr
    with open(tmp_path / "cli" / "timeline.json") as f:
        timeline = json.load(f)
    by = {}  # phase -> the actors of its spans
    for phase in ("generate", "train", "weight_sync", "get_weights"):
        by[phase] = {s["actor"] for s in timeline if s["phase"] == phase}
    assert by["generate"] == by["weight_sync"] == {"colocated 0", "colocated 1", "generator 2"}
    assert by["train"] == {"colocated 0", "colocated 1"}
    assert by["get_weights"] == {"colocated 0"}, "one put per version, for generator 2"


def wait_for_step(out, step, proc, timeout=300):
    """Block until the run in `out` has logged train step `step` (the subprocess `proc` still
    running)."""
    metrics = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(metrics):
            with open(metrics) as f:
                for line in f:
                    row = json.loads(line)
                    if "ray/lag" in row and row["step"] == step:
                        return
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    raise AssertionError(f"step {step} not logged within {timeout} s")


# A process-group leader like `timeout`'s: runs the command given as its arguments; a SIGTERM to
# the group is for the command (a handler, not SIG_IGN, so that the command does not inherit it)
GROUP_LEADER = (
    "import signal, subprocess, sys\n"
    "signal.signal(signal.SIGTERM, lambda *a: None)\n"
    "sys.exit(subprocess.call(sys.argv[1:]))"
)


def test_sigterm_to_the_group_saves_the_logged_steps(make_args, tmp_path):
    """A SIGTERM to the script's whole process group (what `timeout` sends) mid-run, the script
    starting its own local cluster: exit 143 with a checkpoint at exactly the steps logged. Two
    things make it so: main installs its SIGTERM handler again after ray.init (Ray's exits), and
    the cluster's processes sit in a group of their own (they died with the driver's group, and
    nothing was saved)."""
    args = make_args()
    out = tmp_path / "cli"
    cmd = [sys.executable, os.path.join(ROOT, "grpo_ray.py"), *SMALL, "--engine", "hf"]
    cmd += ["--model", args.model, "--train-path", args.train_path, "--val-path", args.val_path]
    cmd += ["--n-grpo-steps", "5000", "--num-cpus", "2", "--out", str(out)]
    leader = [sys.executable, "-c", GROUP_LEADER]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen(leader + cmd, cwd=ROOT, start_new_session=True, **pipes)
    try:
        wait_for_step(out, 1, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, stderr[-3000:]
    assert "SIGTERM: checkpoint saved after step" in stdout
    assert "Traceback" not in stderr
    with open(out / "checkpoint" / "state.json") as f:
        saved = json.load(f)
    with open(out / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    steps = [r["step"] for r in rows if "ray/lag" in r]
    assert steps == list(range(saved["step"]))
    assert saved["step"] >= 2


def descendants_titled(prefix):
    """pids of this process's descendants (the module's Ray cluster: its raylet and workers) whose
    process title starts with prefix."""

    def parent(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    me = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline") as f:
                if not f.read().startswith(prefix):
                    continue
            pid = int(entry)
            while pid > 1 and pid != me:
                pid = parent(pid)
        except OSError:  # gone meanwhile
            continue
        if pid == me:
            found.add(int(entry))
    return found


def test_cli_killed_learner_is_one_line(cluster, make_args, tmp_path):
    """The script's learner killed (kill -9) mid-run: one `error:` line naming it, where its logs
    are and how to go on, the last line on stderr, no traceback (it was the right message inside
    89 lines). Joined with --address, the logs are in the cluster's session, not under --ray-tmp
    (a local cluster's setting)."""
    out = tmp_path / "cli"
    before = descendants_titled("ray::Worker")  # this module's actors
    flags = ["--n-grpo-steps", "5000", "--ray-tmp", str(tmp_path / "unused")]
    cmd = cli_command(make_args(), out, *flags)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_step(out, 0, proc)
        (learner,) = descendants_titled("ray::Worker") - before  # colocated: one actor
        os.kill(learner, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: grpo_ray: colocated 0 died during "), stderr[-3000:]
    assert f"--resume {out} continues" in last
    context = ray.get_runtime_context()  # this module's cluster, the one the script joined
    logs = os.path.join(context.get_temp_dir(), context.get_session_name(), "logs")
    assert f"logs under {logs} on the actor's node;" in last
    assert os.path.isdir(logs)


def test_address_without_a_cluster_fails_in_one_line_within_the_timeout(make_args, tmp_path):
    """--address to a local port nothing listens on: one line naming the fix within
    --connect-timeout-s, no run directory (ray.init alone retried for over five minutes)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]  # free now, and nothing listens on it
    args = make_args()
    out = tmp_path / "o"
    cmd = [sys.executable, os.path.join(ROOT, "grpo_ray.py"), *SMALL, "--engine", "hf"]
    cmd += ["--model", args.model, "--train-path", args.train_path, "--val-path", args.val_path]
    cmd += ["--address", f"127.0.0.1:{port}", "--connect-timeout-s", "2", "--out", str(out)]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_line_error(proc, "no Ray cluster answers at")
    assert "ray start --head" in proc.stderr
    assert time.time() - t0 < 60  # the interpreter's start-up, then at most 2 s
    assert not os.path.exists(out)


def test_generators_and_learners_scale_out(cluster, make_args):
    """2 generators x 2 data-parallel learners, async (HF engines): shards joined in order at one
    version per step, one weight put per version read by both engines, learners in lockstep, the
    M = 2 gradient equal to one learner's on the same batch, --resume with N = M = 2, and a dead
    learner named in one line."""
    flags = (
        "--placement disaggregated --engine hf --async --loss grpo_clip --num-generators 2 "
        "--num-learners 2 --seed 2 --placement-strategy spread"
    )  # seed 2: batch 0 has a signal
    args = make_args(*flags.split())
    actors = grpo_ray.build_actors(args)
    try:
        assert ray.util.placement_group_table(actors["pg"])["strategy"] == "SPREAD"
        summary = grpo_ray.run(args, actors)
        assert summary["lags"] == [0, 1, 1]
        assert summary["devices"] == 4
        assert summary["mode"].endswith("-N2M2")
        rows = logged_steps(args)
        assert [r["ray/gen_version"] for r in rows] == [0, 0, 1]
        assert any(r["train/zero_var_frac"] < 1 for r in rows), (
            "no reward variance: the lockstep check would be vacuous"
        )
        timeline = read(args, "timeline.json")
        by = {}  # phase -> sorted (actor, step) of its spans
        for phase in ("generate", "weight_sync", "get_weights"):
            by[phase] = sorted((s["actor"], s["step"]) for s in timeline if s["phase"] == phase)
        assert by["generate"] == [(f"generator {i}", t) for i in range(2) for t in range(3)]
        assert by["weight_sync"] == [(f"generator {i}", t) for i in range(2) for t in range(3)]
        assert by["get_weights"] == [("learner 0", t) for t in range(3)], (
            "one put per version, read by both engines"
        )
        w0, w1 = ray.get([a.get_weights.remote() for a in actors["learner"]])
        assert all(torch.equal(w0["weights"][k], w1["weights"][k]) for k in w0["weights"]), (
            "learners out of lockstep"
        )
        for gen in actors["generator"]:
            assert_synced(gen, args)

        # shards of a step joined in order: the step's prompts in collect's sampling order, each G
        # times
        G = args.group_size
        generating = [g.generate.remote(7, (i, 2)) for i, g in enumerate(actors["generator"])]
        joined = grpo_ray.join_shards(ray.get(generating, timeout=120))
        rng = random.Random(grpo.sample_seed(args, 7))
        drawn = rng.sample(grpo.load_data(args)[0], args.n_prompts_per_rollout_batch)
        assert joined["batch"]["prompts"] == [r["prompt"] for r in drawn for _ in range(G)]

        # gradient: the group's all-reduced gradient equals one learner's on the same batch
        joined["batch"]["raw"] = torch.linspace(-1.0, 1.0, len(joined["batch"]["raw"]))
        ref = ray.put(joined)
        assert_gradient_is_one_learners(actors["learner"], ref)
        assert_advantages_are_one_learners(actors["learner"], ref)

        # --resume: the run's flags (N, M included) and checkpoint, on the same actors
        resumed = start(actors, grpo_ray.parse_args(["--resume", args.out, "--n-grpo-steps", "5"]))
        assert (resumed.num_generators, resumed.num_learners) == (2, 2)
        summary = grpo_ray.run(resumed, actors)
        rows = logged_steps(resumed)
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
        assert summary["lags"] == [0, 1]
        assert_synced(actors["generator"][1], resumed)

        # a dead learner: its peer's collective fails too, the death is what gets reported
        ray.kill(actors["learner"][1])
        wait_dead(actors["learner"][1])
        with pytest.raises(
            RuntimeError, match=r"learner 1 died during probe \(ActorDiedError"
        ) as e:
            training = [x.train.remote(ref) for x in actors["learner"]]
            grpo_ray.get(training, "probe", resumed, actors)
        assert "\n" not in str(e.value)
    finally:
        grpo_ray.kill_actors(actors)


def test_lora_learner_holds_the_adapters_and_resume_continues(cluster, make_args):
    """--lora-rank 2 over Ray (disaggregated, HF engine): the checkpoint holds the adapter, not the
    model, and the learner's AdamW state covers the adapter's tensors alone; --resume on the same
    actors continues from it."""
    from safetensors.torch import load_file

    flags = "--placement disaggregated --engine hf --lora-rank 2 --n-grpo-steps 1 --seed 1"
    args = make_args(*flags.split())
    actors = grpo_ray.build_actors(args)
    try:
        grpo_ray.run(args, actors)
        ckpt = os.path.join(args.out, "checkpoint")
        assert lora.is_adapter_dir(ckpt)
        assert not os.path.exists(os.path.join(ckpt, "model.safetensors"))
        adapter = load_file(os.path.join(ckpt, lora.ADAPTER_WEIGHTS))
        opt = torch.load(os.path.join(ckpt, "optimizer.pt"))
        assert sum(len(group["params"]) for group in opt["param_groups"]) == len(adapter)
        resumed = start(actors, grpo_ray.parse_args(["--resume", args.out, "--n-grpo-steps", "2"]))
        assert resumed.lora_rank == 2
        grpo_ray.run(resumed, actors)
        assert [r["step"] for r in logged_steps(resumed)] == [0, 1]
    finally:
        grpo_ray.kill_actors(actors)


# ----------------------------------------------------------------------------- --learner-sharding
def held(worker):
    """Sharding probe: {model: (bytes of the tensors this learner holds, bytes of the whole
    tensors, bytes of one dim-0 row of each)} of the policy, the frozen copies and the AdamW
    state (its moments; the scalar step counts aside), measured from the tensors."""
    from torch.distributed.tensor import DTensor

    def sizes(tensors):
        local = 0
        whole = 0
        rows = 0
        for t in tensors:
            assert isinstance(t, DTensor), "an unsharded tensor"
            size = t.element_size()
            local += t.to_local().numel() * size
            whole += t.numel() * size
            rows += t.numel() // t.shape[0] * size
        return local, whole, rows

    learner = worker.learner
    moments = []
    for state in learner["optimizer"].state.values():
        moments += [state["exp_avg"], state["exp_avg_sq"]]
    out = {"optimizer": sizes(moments)}
    for key in ("policy", "ref_model", "prev_model"):
        out[key] = sizes(learner[key].parameters())
    return out


def engine_weights(worker):
    """Probe: the HF engine's weights."""
    return {k: v.clone() for k, v in worker.engine.model.state_dict().items()}


def final_weights(args):
    """The whole model a run's final checkpoint holds."""
    from safetensors.torch import load_file

    return load_file(os.path.join(args.out, "checkpoint", "model.safetensors"))


def test_fsdp_learners_shard_and_train_as_one(cluster, make_args, capsys):
    """--learner-sharding fsdp, 2 disaggregated learners over gloo (HF engine; KL monitoring, so
    pi_ref and pi_{t-1} are kept): after one step the gathered policy equals one unsharded
    learner's on the same batch; each learner holds half of every parameter, AdamW moment and
    frozen copy; a mid-run checkpoint holds shards, no model; a run stopped after 1 step and
    resumed to 2 equals 2 straight steps bit for bit; the engine's weights equal the gathered
    policy after the final sync; a different learner count or sharding at resume is refused."""
    flags = FSDP + " --engine hf --loss grpo_clip --kl-every 1 --seed 2 --n-grpo-steps 1"
    flags += " --no-shared-prefix"  # as the sharded learners run (and the unsharded one here)
    args = make_args(*flags.split())
    assert args.mode == "disaggregated-sync-N1M2-fsdp"
    actors = grpo_ray.build_actors(args)
    learners = actors["learner"]
    try:
        # one step on one batch, rewards varied in every group (non-zero advantages)
        gen = ray.get(actors["generator"][0].generate.remote(0), timeout=120)
        gen["batch"]["raw"] = torch.linspace(-1.0, 1.0, len(gen["batch"]["raw"]))
        ref = ray.put(gen)
        ray.get([a.train.remote(ref) for a in learners], timeout=120)
        pushed = ray.get([a.get_weights.remote() for a in learners], timeout=120)
        assert pushed[1]["weights"] == {}, "learner 1 keeps no gathered copy"
        gathered = pushed[0]["weights"]
        # one unsharded learner (this process) on the same batch
        alone_args = make_args(*flags.replace(FSDP, "--placement disaggregated").split())
        runtime = grpo.setup_runtime(alone_args)
        alone = grpo.build_learner(alone_args, runtime)
        before = {k: v.clone() for k, v in alone["policy"].state_dict().items()}
        grpo.train_step(alone, gen["batch"], alone_args, runtime, 0)
        after = alone["policy"].state_dict()
        assert set(gathered) == set(after)
        assert max((gathered[k] - after[k]).abs().max().item() for k in after) <= 1e-6
        assert max((after[k] - before[k]).abs().max().item() for k in after) > 1e-4, "moved"
        # half of everything on each learner: the two shards make the whole, each within FSDP2's
        # padding of dim 0 to a multiple of 2 (at most one row per tensor)
        probes = ray.get([a.__ray_call__.remote(held) for a in learners], timeout=60)
        for key in ("policy", "optimizer", "ref_model", "prev_model"):
            locals_ = [p[key][0] for p in probes]
            whole, rows = probes[0][key][1:]
            assert sum(locals_) == whole, key
            assert all(abs(b - whole / 2) <= rows for b in locals_), key

        # a mid-run checkpoint: the shards, no model
        scratch = make_args(*flags.split())
        grpo_ray._save(scratch, actors, {"opt_step": 1}, 1, 0.0)
        ckpt = os.listdir(os.path.join(scratch.out, "checkpoint"))
        assert {"shard_0_of_2.pt", "shard_1_of_2.pt", runs.SHARDS_FILE, "state.json"} <= set(ckpt)
        assert "model.safetensors" not in ckpt and "config.json" not in ckpt

        # 1 step, then resumed to 2, equals 2 straight steps; a resume with another learner count
        # or sharding is one line, before Ray is asked for anything
        first = start(actors, make_args(*flags.split()))
        grpo_ray.run(first, actors)
        more = ["--resume", first.out, "--n-grpo-steps", "2"]
        for bad in (["--num-learners", "3"], ["--learner-sharding", "replicate"]):
            with pytest.raises(SystemExit):
                grpo_ray.parse_args(more + bad)
            err = capsys.readouterr().err.strip().splitlines()[-1]  # after the actors' lines
            assert err.startswith("error:") and "holds the shards of 2 learners" in err, err
        resumed = start(actors, grpo_ray.parse_args(more))
        grpo_ray.run(resumed, actors)
        straight = make_args(*flags.replace("--n-grpo-steps 1", "--n-grpo-steps 2").split())
        grpo_ray.run(start(actors, straight), actors)
        a = final_weights(resumed)
        b = final_weights(straight)
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in b)
        rows = [logged_steps(run) for run in (resumed, straight)]
        assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]] == [0, 1]
        for key in rows[0][1]:  # (a resumed run's first step has no pi_{t-1}: no train/kl_prev)
            if key.startswith("train/"):
                assert rows[0][1][key] == rows[1][1][key], key
        assert any(r["train/zero_var_frac"] < 1 for r in rows[1]), "no signal: vacuous"

        # the engine holds the gathered policy after the final sync
        engine = ray.get(actors["generator"][0].__ray_call__.remote(engine_weights), timeout=60)
        pushed = ray.get([a.get_weights.remote() for a in learners], timeout=60)
        policy = pushed[0]["weights"]
        assert set(engine) == set(policy)
        assert all(torch.equal(engine[k], policy[k]) for k in policy)
    finally:
        grpo_ray.kill_actors(actors)


# ----------------------------------------------------------------------------- --tools
# A --tools calculator run on the embedded model (its countdown task and default prompt,
# r1_zero_calculator, whose trigger "=" the model writes often): one step, two validation questions
TOOLS_SMALL = (
    "--tools calculator --n-grpo-steps 1 --rollout-batch-size 8 --group-size 4 "
    "--train-batch-size 8 --gradient-accumulation-steps 2 --max-tokens 64 --eval-n 2 "
    "--eval-every 0 --grader-workers 0 --num-cpus 8 --timeout-s 300 --eager"
).split()


@pytest.fixture(scope="module")
def make_tool_args(tmp_path_factory):
    """make_tool_args(*flags): grpo_ray's args for TOOLS_SMALL and a fresh --out, then the
    flags."""
    tmp = tmp_path_factory.mktemp("grpo_ray_tools")
    counter = iter(range(1000))

    def make(*flags):
        out = ["--out", str(tmp / f"run{next(counter)}")]
        return grpo_ray.parse_args(TOOLS_SMALL + out + list(flags))

    return make


@requires_vllm
def test_tools_colocated_on_the_embedded_model(cluster, make_tool_args):
    """--tools calculator colocated on the embedded model (vLLM), with a second generator: each
    generator samples its shard multi-turn with a tool of its own; the step rows carry the joined
    batch's tool metrics, the evals use the tool. A shard is the same whichever engine samples it
    (every turn's seed follows from the step and the shard, not the actor); the joined shards reach
    the learner with their policy masks, and its loss leaves the tool output out."""
    args = make_tool_args("--num-generators", "2")
    actors = grpo_ray.build_actors(args)  # the second engine costs little: the two start at once
    try:
        summary = grpo_ray.run(args, actors)
        assert summary["mode"] == "colocated-k1-N2M1"
        assert_tool_rows(args)
        gens = actors["generator"]  # both hold version 1 now
        refs = [g.generate.remote(7, (i, 2)) for i, g in enumerate(gens)]
        refs.append(gens[0].generate.remote(7, (1, 2)))  # generator 1's shard, on engine 0
        first, second, again = ray.get(refs, timeout=120)
        for key in ("response_ids", "policy_masks", "transcripts", "calls"):
            assert again["batch"][key] == second["batch"][key], key
        joined = grpo_ray.join_shards([first, second])
        assert_loss_leaves_tool_output_out(actors["learner"][0], joined)
    finally:
        grpo_ray.kill_actors(actors)


# 2 sharded learners over gloo in their own processes (torch.multiprocessing), no Ray: train_step
# on a batch given as a file; rank 0 writes the gathered policy
FSDP_PROBE = """
import datetime, os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, os.getcwd())

def main(rank, args, batch, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = datetime.timedelta(seconds=60)  # a hang fails the test, not the suite
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timeout)
    from torch.distributed.device_mesh import init_device_mesh
    import grpo, sharding
    runtime = grpo.setup_runtime(args)
    learner = grpo.build_learner(args, runtime, init_device_mesh("cpu", (2,)))
    def reduce(t, op):
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()))
        return t
    dp = {"rank": rank, "world": 2, "reduce": reduce, "sharded": True}
    grpo.train_step(learner, batch, args, runtime, 0, dp=dp)
    weights = sharding.full_state_dict(learner["policy"], keep=rank == 0)
    if rank == 0:
        torch.save(weights, out)

if __name__ == "__main__":
    args, batch, port, out = torch.load(sys.argv[1], weights_only=False)
    mp.spawn(main, args=(args, batch, port, out), nprocs=2)
"""


def test_fsdp_learners_with_uneven_shares_train_as_one(make_args, tmp_path):
    """--learner-sharding fsdp on a step whose rows do not split evenly (3 rows, 1 per
    microbatch: 1 and 2 per learner): the learner with fewer rows runs dummy passes, so every
    FSDP2 collective pairs up (no hang), and the update equals one learner's on the whole batch.
    KL monitoring and --entropy-top-quantile add the pi_ref, pi_{t-1} and entropy passes."""
    flags = "--group-size 3 --rollout-batch-size 3 --train-batch-size 3"
    flags += " --gradient-accumulation-steps 3 --loss grpo_clip --kl-every 1 --no-shared-prefix"
    flags += " --entropy-top-quantile 0.5"
    args = make_args(*flags.split())
    assert args.micro_train_batch_size == 1
    gen = torch.Generator().manual_seed(0)
    batch = {"prompt_ids": [], "response_ids": [], "engine_logprobs": []}
    for n in (5, 3, 4):  # response lengths
        batch["prompt_ids"].append(torch.randint(5, 60, (4,), generator=gen).tolist())
        batch["response_ids"].append(torch.randint(5, 60, (n,), generator=gen).tolist())
        batch["engine_logprobs"].append([-1.0] * n)
    batch["raw"] = torch.tensor([-1.0, 0.5, 1.0])
    batch["truncated"] = [False] * 3
    batch["void"] = [False] * 3
    batch["ban_token_ids"] = [1]
    out = tmp_path / "gathered.pt"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.save((args, batch, port, str(out)), tmp_path / "inputs.pt")
    (tmp_path / "probe.py").write_text(FSDP_PROBE)
    cmd = [sys.executable, str(tmp_path / "probe.py"), str(tmp_path / "inputs.pt")]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    gathered = torch.load(out)
    runtime = grpo.setup_runtime(args)
    alone = grpo.build_learner(args, runtime)
    before = {k: v.clone() for k, v in alone["policy"].state_dict().items()}
    grpo.train_step(alone, batch, args, runtime, 0)
    after = alone["policy"].state_dict()
    assert set(gathered) == set(after)
    assert max((gathered[k] - after[k]).abs().max().item() for k in after) <= 1e-6
    assert max((after[k] - before[k]).abs().max().item() for k in after) > 1e-4, "moved"
