"""doctor.py: each diagnosis on a run directory the test writes in grpo.py's layout (args.json from
grpo.py's own parse_args, metrics rows with every grpo.STEP_KEYS key, rollouts/step_NNNN.jsonl),
a clean run, --json, several runs, grpo_ray.py / expert_iteration.py / sft.py runs, bad input.
No engine runs: doctor.main is called in-process."""

import json
import math
import os
import statistics

import pytest

import doctor
import expert_iteration
import grpo

# the eval row validation.greedy_eval logs (with step, opt_step, time/wall, time/eval)
EVAL_KEYS = [
    "eval/reward",
    "eval/format_reward",
    "eval/answer_reward",
    "eval/accuracy",
    "eval/response_len",
    "eval/truncation_rate",
]
# a healthy step: every value away from every threshold
HEALTHY = {
    "train/loss": 0.1,
    "train/entropy": 0.5,
    "train/clip_fraction": 0.0,
    "train/ratio_mean": 1.0,
    "train/ratio_min": 1.0,
    "train/ratio_max": 1.0,
    "train/grad_norm": 0.3,
    "train/epoch": 0,
    "train/lr": 1e-4,
    "train/reward": 0.5,
    "train/format_reward": 1.0,
    "train/answer_reward": 0.45,
    "train/zero_var_frac": 0.2,
    "train/response_len_mean": 60.0,
    "train/response_len_max": 120,
    "train/truncation_rate": 0.01,
}


@pytest.fixture(scope="module")
def grpo_args(tmp_path_factory):
    """grpo.py's resolved flags for the demo, as its args.json holds them."""
    import runs

    out = tmp_path_factory.mktemp("never_written")
    return runs.jsonable(vars(grpo.parse_args(["--out", str(out / "run")])))


def step_row(step, **overrides):
    """One grpo.py step row: every grpo.STEP_KEYS key, healthy values unless overridden."""
    row = {}
    for key in grpo.STEP_KEYS:
        row[key] = HEALTHY.get(key, 1.0)
    row["step"] = step
    row["opt_step"] = step + 1
    row.update(overrides)
    return row


def eval_row(step, accuracy, **extra):
    row = {"step": step, "opt_step": step, "time/wall": 1.0, "time/eval": 1.0}
    for key in EVAL_KEYS:
        row[key] = 0.5
    row["eval/accuracy"] = accuracy
    row.update(extra)
    return row


def write_run(
    path, args, n_steps=20, step=None, evals=None, eval_extra=None, samples=None, lines=None
):
    """A run directory in grpo.py's layout. step(i) -> the overrides of step i's row; evals:
    {step: accuracy} (default: 0.3 rising to 0.5 every 5 steps); samples: the train samples of
    rollouts/step_NNNN.jsonl, after one eval sample, as grpo.py writes them (a response, or a
    dict of fields; rewards 0 unless given); lines: raw lines appended to metrics.jsonl. The run
    asked for --n-grpo-steps n_steps unless args says "stopped_early"."""
    args = {**args, "n_grpo_steps": n_steps}
    if args.pop("stopped_early", False):
        args["n_grpo_steps"] = 30
    os.makedirs(os.path.join(path, "rollouts"), exist_ok=True)
    with open(os.path.join(path, "args.json"), "w") as f:
        json.dump(args, f)
    if evals is None:
        evals = {}
        for i in range(0, n_steps + 1, 5):
            evals[i] = 0.3 + 0.2 * i / n_steps
    rows = []
    for i in range(n_steps):
        if i in evals:
            rows.append(eval_row(i, evals[i], **(eval_extra or {})))
        overrides = {}
        if step is not None:
            overrides = step(i)
        rows.append(step_row(i, **overrides))
    if n_steps in evals:
        rows.append(eval_row(n_steps, evals[n_steps], **(eval_extra or {})))
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        for line in lines or []:
            f.write(line + "\n")
    eval_sample = {
        "split": "eval",
        "prompt": "Q",
        "response": "<think> 1 </think> <answer> 1 </answer>",
        "ground_truth": "1",
        "reward": 1.0,
        "format_reward": 1.0,
        "answer_reward": 1.0,
    }
    train = []
    for sample in samples or []:
        if isinstance(sample, str):
            sample = {"response": sample}
        train.append(
            {
                "split": "train",
                "prompt": "Q",
                "response": "",
                "ground_truth": "1",
                "reward": 0.0,
                "format_reward": 0.0,
                "answer_reward": 0.0,
                **sample,
            }
        )
    with open(os.path.join(path, "rollouts", f"step_{n_steps:04d}.jsonl"), "w") as f:
        for sample in [eval_sample] + train:
            f.write(json.dumps(sample) + "\n")
    return str(path)


def run_doctor(capsys, *argv):
    """doctor's exit code and printed output, in-process."""
    code = doctor.main(doctor.parse_args(list(argv)))
    return code, capsys.readouterr().out


def findings(capsys, run_dir):
    """{code: finding} of one run, through --json."""
    code, out = run_doctor(capsys, run_dir, "--json")
    report = json.loads(out)
    found = {}
    for f in report["runs"][0]["findings"]:
        found[f["code"]] = f
    return code, found


def big_eval(args):
    """args with an evaluation large enough to resolve every change in the default curve."""
    return {**args, "eval_n": 5000}


# ----------------------------------------------------------------------------- clean runs
def test_clean_run_exits_0_and_says_so(tmp_path, grpo_args, capsys):
    run = write_run(tmp_path / "run", big_eval(grpo_args))
    code, out = run_doctor(capsys, run)
    assert code == 0
    assert "grpo.py, 20 rollout steps (20 optimizer steps), 5 evaluations" in out
    assert "-> clean: no problems or warnings, 0 notices" in out


def test_json_shape(tmp_path, grpo_args, capsys):
    run = write_run(tmp_path / "run", grpo_args, step=lambda i: {"train/format_reward": 0.0})
    code, out = run_doctor(capsys, run, "--json")
    report = json.loads(out)
    assert code == 1
    assert set(report) == {"runs", "comparisons", "exit"}
    assert report["exit"] == 1
    (one,) = report["runs"]
    assert one["run"] == run
    assert one["script"] == "grpo.py"
    assert one["is_grpo"] is True
    assert (one["steps"], one["opt_steps"], one["evals"]) == (20, 20, 5)
    for f in one["findings"]:
        assert set(f) == {"severity", "code", "title", "evidence", "fixes", "values"}
        assert f["severity"] in doctor.SEVERITIES
        assert f["fixes"]
    # most severe first
    ranks = [doctor.SEVERITIES.index(f["severity"]) for f in one["findings"]]
    assert ranks == sorted(ranks)
    assert one["findings"][0]["code"] == "format_reward_zero"


# ----------------------------------------------------------------------------- each diagnosis
def test_format_reward_stuck_at_0_quotes_a_rollout(tmp_path, grpo_args, capsys):
    def step(i):
        return {"train/format_reward": 0.0, "train/answer_reward": 0.0, "train/reward": 0.0}

    samples = ["I think the answer is 7 but I will not use tags"]
    run = write_run(tmp_path / "run", grpo_args, step=step, samples=samples)
    code, found = findings(capsys, run)
    assert code == 1
    f = found["format_reward_zero"]
    assert f["severity"] == "problem"
    assert "steps 15-19" in f["evidence"]
    assert "I will not use tags" in f["evidence"]  # the train sample of rollouts/step_0020.jsonl
    assert "reward_zero" not in found  # the format explains it


def test_reward_stuck_at_0_with_the_format_right(tmp_path, grpo_args, capsys):
    run = write_run(
        tmp_path / "run", grpo_args, step=lambda i: {"train/answer_reward": 0.0}, samples=["x"]
    )
    code, found = findings(capsys, run)
    assert code == 1
    assert found["reward_zero"]["severity"] == "problem"
    assert "format reward is 1" in found["reward_zero"]["evidence"]
    assert "format_reward_zero" not in found


@pytest.mark.parametrize("frac, severity", [(0.6, "warning"), (0.95, "problem"), (0.4, None)])
def test_most_groups_with_zero_reward_variance(tmp_path, grpo_args, capsys, frac, severity):
    run = write_run(tmp_path / "run", grpo_args, step=lambda i: {"train/zero_var_frac": frac})
    code, found = findings(capsys, run)
    if severity is None:
        assert "zero_variance" not in found
        return
    f = found["zero_variance"]
    assert f["severity"] == severity
    assert f"G = {grpo_args['group_size']}" in f["evidence"]
    assert "too hard" in f["evidence"]  # answer reward 0.45: mostly all-wrong groups
    assert any("--group-size" in fix for fix in f["fixes"])
    assert any("--temperature" in fix for fix in f["fixes"])


def test_loss_near_0_is_a_notice_on_policy_only(tmp_path, grpo_args, capsys):
    def step(i):
        return {"train/loss": 0.001 * (-1) ** i}

    run = write_run(tmp_path / "on", big_eval(grpo_args), step=step)
    code, found = findings(capsys, run)
    assert code == 0  # a notice is not a pathology
    assert found["loss_near_zero"]["severity"] == "notice"
    assert "expected" in found["loss_near_zero"]["title"]
    off = write_run(tmp_path / "off", {**big_eval(grpo_args), "off_policy": True}, step=step)
    assert "loss_near_zero" not in findings(capsys, off)[1]


def test_entropy_collapse(tmp_path, grpo_args, capsys):
    run = write_run(tmp_path / "run", grpo_args, step=lambda i: {"train/entropy": 1.0 / (1 + i)})
    code, found = findings(capsys, run)
    f = found["entropy_collapse"]
    assert f["severity"] == "warning"
    assert code == 1
    assert "steps 0-4" in f["evidence"] and "steps 15-19" in f["evidence"]
    slow = write_run(tmp_path / "slow", grpo_args, step=lambda i: {"train/entropy": 1 - i / 40})
    assert "entropy_collapse" not in findings(capsys, slow)[1]


def test_truncation_rising_and_length_growing(tmp_path, grpo_args, capsys):
    def step(i):
        return {"train/truncation_rate": 0.02 * i, "train/response_len_mean": 50.0 + 10 * i}

    run = write_run(tmp_path / "run", grpo_args, step=step)
    code, found = findings(capsys, run)
    assert code == 1
    assert found["truncation"]["severity"] == "problem"  # 0.34 at the end
    assert "rising from 0.04" in found["truncation"]["evidence"]
    assert f"--max-tokens {grpo_args['max_tokens']}" in found["truncation"]["evidence"]
    assert found["length_growth"]["severity"] == "notice"

    mild = write_run(tmp_path / "mild", grpo_args, step=lambda i: {"train/truncation_rate": 0.15})
    assert findings(capsys, mild)[1]["truncation"]["severity"] == "warning"


@pytest.mark.parametrize(
    "key, value",
    [
        ("train/ratio_max", 25.0),
        ("train/ratio_min", 0.01),
        ("train/is_weight_max", 40.0),
        ("train/is_weight_outside_frac", 0.2),
        ("train/mismatch_kl", 0.05),
    ],
)
def test_ratio_importance_weight_and_mismatch_spikes(tmp_path, grpo_args, capsys, key, value):
    def step(i):
        if i == 7:
            return {key: value}
        return {}

    run = write_run(tmp_path / "run", grpo_args, step=step)
    code, found = findings(capsys, run)
    assert code == 1
    f = found["ratio_spikes"]
    assert f"{key} " in f["evidence"] and "opt step 8" in f["evidence"]
    assert f["values"] == {key.removeprefix("train/"): 1} or f["values"] == {key: 1}


def test_grad_norm_spikes_and_clipping_always_on(tmp_path, grpo_args, capsys):
    def spike(i):
        if i in (4, 12):
            return {"train/grad_norm": 9.0}
        return {}

    run = write_run(tmp_path / "spikes", grpo_args, step=spike)
    code, found = findings(capsys, run)
    assert "opt step 5: 9, opt step 13: 9" in found["grad_spikes"]["evidence"]
    assert "clipping_always" not in found
    clipped = write_run(tmp_path / "clip", grpo_args, step=lambda i: {"train/grad_norm": 3.0 + i})
    found = findings(capsys, clipped)[1]
    assert "20 of 20 optimizer steps" in found["clipping_always"]["evidence"]
    assert "grad_spikes" not in found


def test_training_reward_rising_while_validation_falls(tmp_path, grpo_args, capsys):
    def step(i):
        return {"train/reward": 0.2 + 0.03 * i}

    evals = {0: 0.3, 5: 0.6, 10: 0.5, 15: 0.45, 20: 0.4}
    hacked = {"response": "<answer> 1 </answer> 1 1 1 1", "reward": 1.0, "answer_reward": 1.0}
    samples = ["no answer", hacked, "no answer either"]
    run = write_run(tmp_path / "run", grpo_args, step=step, evals=evals, samples=samples)
    code, found = findings(capsys, run)
    f = found["reward_up_validation_down"]
    assert f["severity"] == "warning"
    assert "1 1 1 1" in f["evidence"]  # the best-rewarded train sample of the newest rollouts
    assert "from 0.6 (step 5) to 0.4 (step 20)" in f["evidence"]
    assert f["values"]["best_step"] == 5
    # within two standard errors of 200 questions: no claim
    evals = {0: 0.3, 5: 0.5, 10: 0.48, 15: 0.47, 20: 0.45}
    noisy = write_run(tmp_path / "noisy", grpo_args, step=step, evals=evals)
    assert "reward_up_validation_down" not in findings(capsys, noisy)[1]


@pytest.mark.parametrize(
    "estimator, value, drift",
    [("k3", 0.3, True), ("k3", 0.05, False), ("seq", 3.0, False), ("seq", 12.0, True)],
)
def test_kl_drift(tmp_path, grpo_args, capsys, estimator, value, drift):
    args = {**grpo_args, "kl_estimator": estimator, "kl_every": 1}
    run = write_run(tmp_path / "run", args, step=lambda i: {"train/kl_ref": value * i / 19})
    found = findings(capsys, run)[1]
    assert ("kl_drift" in found) == drift  # seq: 12 / 60 tokens = 0.2 per token


def test_evaluation_too_small_to_show_any_change(tmp_path, grpo_args, capsys):
    evals = {0: 0.40, 5: 0.45, 10: 0.42, 15: 0.47, 20: 0.44}
    run = write_run(tmp_path / "run", {**grpo_args, "eval_n": 50}, evals=evals)
    code, found = findings(capsys, run)
    f = found["eval_too_small"]
    assert f["severity"] == "warning"
    assert code == 1
    se = statistics.fmean([math.sqrt(p * (1 - p) / 50) for p in evals.values()])
    assert f["values"]["se"] == pytest.approx(se)
    assert "50 questions" in f["evidence"]
    assert "cannot show whether training changed" in f["evidence"]


def test_evaluation_that_resolves_the_trend_but_not_the_steps(tmp_path, grpo_args, capsys):
    evals = {0: 0.30, 5: 0.46, 10: 0.50, 15: 0.48, 20: 0.49}
    run = write_run(tmp_path / "run", grpo_args, evals=evals)  # 200 questions: SE ~0.035
    code, found = findings(capsys, run)
    assert code == 0
    f = found["eval_resolution"]
    assert f["severity"] == "notice"
    assert "3 of 4 changes between evaluations are not" in f["evidence"]
    assert "5->10 +0.04" in f["evidence"]
    # with 5000 questions every change is resolved
    assert not findings(capsys, write_run(tmp_path / "big", big_eval(grpo_args), evals=evals))[1]


def test_eval_row_question_count_and_logged_standard_errors_win(tmp_path, grpo_args, capsys):
    # eval/n_questions in the row beats args.json's --eval-n; an eval/avg@k with its _se is
    # checked on its own standard error
    extra = {"eval/n_questions": 5000, "eval/avg@4": 0.5, "eval/avg@4_se": 0.04}
    run = write_run(tmp_path / "run", {**grpo_args, "eval_n": 20}, eval_extra=extra)
    found = findings(capsys, run)[1]
    assert found["eval_too_small"]["title"].endswith("eval/avg@4")
    assert found["eval_too_small"]["values"]["se"] == pytest.approx(0.04)
    assert "eval/accuracy" not in json.dumps(found)  # 5000 questions resolve its curve


def test_nan_values_are_a_problem(tmp_path, grpo_args, capsys):
    def step(i):
        if i >= 11:
            return {"train/loss": math.nan, "train/grad_norm": math.inf}
        return {}

    run = write_run(tmp_path / "run", grpo_args, step=step)
    code, found = findings(capsys, run)
    assert code == 1
    f = found["nonfinite"]
    assert f["severity"] == "problem"
    assert f["values"]["first_step"] == 11
    assert f["values"]["keys"] == ["train/grad_norm", "train/loss"]


def test_malformed_rows_and_a_stopped_run_are_notices(tmp_path, grpo_args, capsys):
    lines = ["[1, 2]", '{"step": -1}', '{"step": 20, "train/lo']
    args = {**big_eval(grpo_args), "stopped_early": True}
    run = write_run(tmp_path / "run", args, n_steps=12, lines=lines)
    code, found = findings(capsys, run)
    assert code == 0
    assert found["malformed_rows"]["values"]["lines"] == [
        16,
        17,
        18,
    ]  # after 12 step rows and 3 eval rows
    assert "12 of 30 steps logged" in found["incomplete"]["evidence"]


def test_a_run_stopped_before_its_first_step(tmp_path, grpo_args, capsys):
    run = write_run(tmp_path / "run", grpo_args)
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write(json.dumps(eval_row(0, 0.3)) + "\n")  # the eval before step 0's update
    code, out = run_doctor(capsys, run)
    assert code == 0
    assert "grpo.py, 0 rollout steps (0 optimizer steps), 1 evaluation" in out
    assert "0 of 20 steps logged" in out


# ----------------------------------------------------------------------------- runs of each kind
def test_several_runs_are_each_diagnosed_and_compared(tmp_path, grpo_args, capsys):
    a = write_run(tmp_path / "a", grpo_args, evals={0: 0.3, 10: 0.45, 20: 0.50})
    b = write_run(tmp_path / "b", grpo_args, evals={0: 0.3, 10: 0.46, 20: 0.53})
    bad = write_run(
        tmp_path / "bad",
        big_eval(grpo_args),
        step=lambda i: {"train/reward": 0.0, "train/answer_reward": 0.0},
    )
    code, out = run_doctor(capsys, a, b, bad)
    assert code == 1  # the third run's problem
    assert out.count("== ") == 4  # three runs and the comparison
    assert f"== {bad}: grpo.py" in out and "problem: reward stuck at 0" in out
    assert "== comparing the runs" in out
    assert f"{a} ends at eval/accuracy 0.5 (step 20), {b} at 0.53 (step 20)" in out
    code, out = run_doctor(capsys, a, b, "--json")
    report = json.loads(out)
    assert code == 0
    assert [r["run"] for r in report["runs"]] == [a, b]
    assert report["comparisons"][0]["runs"] == [a, b]


def test_grpo_ray_run_layout(tmp_path, grpo_args, capsys):
    # grpo_ray.py: grpo.py's flags plus its own (resolve sets staleness and mode), ray/ keys on
    # each step row, rollouts/eval_vNNNN.jsonl
    args = {**grpo_args, "placement": "disaggregated", "staleness": 1, "mode": "async"}
    lag = {"ray/lag": 1, "ray/version": 1, "ray/gen_version": 0, "train/loss": 0.0}
    run = write_run(tmp_path / "run", args, step=lambda i: {**lag, "train/format_reward": 0.0})
    os.rename(
        os.path.join(run, "rollouts", "step_0020.jsonl"),
        os.path.join(run, "rollouts", "eval_v0020.jsonl"),
    )
    code, found = findings(capsys, run)
    assert code == 1
    assert "rollouts/eval_v0020.jsonl" in found["format_reward_zero"]["evidence"]
    assert "loss_near_zero" not in found  # stale batches: not on-policy
    report = json.loads(run_doctor(capsys, run, "--json")[1])["runs"][0]
    assert report["script"] == "grpo_ray.py"


def test_expert_iteration_and_sft_runs_are_not_grpo_runs(tmp_path, capsys):
    keys = expert_iteration.STEP_KEYS + expert_iteration.SFT_KEYS
    ei = tmp_path / "ei"
    os.makedirs(ei)
    with open(ei / "args.json", "w") as f:
        json.dump({"n_ei_steps": 6, "eval_n": 5000, "max_grad_norm": 1.0}, f)
    with open(ei / "metrics.jsonl", "w") as f:
        for i in range(6):
            row = {key: 0.5 for key in keys}
            row.update({"step": i, "opt_step": i + 1, "train/truncation_rate": 0.0})
            row["train/entropy"] = 1.0 / (1 + 3 * i)
            f.write(json.dumps(row) + "\n")
    code, out = run_doctor(capsys, str(ei))
    assert "not a GRPO run (expert_iteration.py)" in out
    assert "warning: entropy collapse" in out
    assert code == 1

    sft = tmp_path / "sft"
    os.makedirs(sft)
    with open(sft / "metrics.jsonl", "w") as f:  # no args.json
        for i in range(1, 7):
            row = {"step": i, "train/loss": 0.001, "train/nll_per_token": 0.1}
            row.update({"train/grad_norm": 0.5, "train/entropy": 0.01})
            f.write(json.dumps(row) + "\n")
    code, out = run_doctor(capsys, str(sft))
    assert code == 0
    assert "sft.py" in out and "not a GRPO run" in out and "no readable args.json" in out
    assert "loss ~ 0" not in out and "entropy" not in out


@pytest.mark.parametrize("missing", ["dir", "metrics"])
def test_missing_run_dir_or_metrics_is_one_line(tmp_path, grpo_args, capsys, missing):
    run = write_run(tmp_path / "run", grpo_args)
    target = str(tmp_path / "nowhere")
    if missing == "metrics":
        os.remove(os.path.join(run, "metrics.jsonl"))
        target = run
    with pytest.raises(SystemExit) as e:
        doctor.parse_args([run, target])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {target}: ")


def test_every_threshold_is_in_the_readme_table_with_its_value():
    from conftest import doc_section

    section = doc_section("Run doctor")  # docs/doctor.md
    thresholds = []
    for name, value in vars(doctor).items():
        if name.isupper() and isinstance(value, (int, float)) and not isinstance(value, bool):
            thresholds.append((name, value))
    assert len(thresholds) >= 20
    for name, value in thresholds:
        rows = []
        for line in section.split("\n"):
            if line.startswith(f"| `{name}`") or f", `{name}`" in line.split(" | ")[0]:
                rows.append(line)
        assert len(rows) == 1, f"{name}: no row of the thresholds table (docs/doctor.md)"
        cells = rows[0].split(" | ")
        names = cells[0].removeprefix("| ").replace("`", "").split(", ")
        values = cells[1].split(", ")
        assert float(values[names.index(name)]) == value, f"{name}: docs/doctor.md says {cells[1]}"


# ----------------------------------------------------------------------------- --tools runs
@pytest.mark.parametrize(
    "step, code, evidence",
    [
        (
            lambda i: {"tool/error_rate": 0.8, "tool/calls_mean": 1.0},
            "tool_errors",
            "tool/error_rate 0.8",
        ),
        (
            lambda i: {"tool/calls_mean": max(0.0, 2.0 - 0.25 * i)},
            "tool_calls_collapse",
            "tool/calls_mean 1.5",
        ),
        (
            lambda i: {"tool/truncated_by_tool_rate": 0.2},
            "truncated_by_tool",
            "--max-obs-tokens 256",
        ),
        (
            lambda i: {
                "train/logprob_mismatch_multi_turn": 0.05,
                "train/logprob_mismatch_single_turn": 0.01,
            },
            "multi_turn_mismatch",
            "x5",
        ),
    ],
)
def test_tool_diagnoses(tmp_path, grpo_args, capsys, step, code, evidence):
    """Each tool diagnosis on a --tools run, beside its near miss: error rate 0.4, calls that
    stay at 0.1, truncated_by_tool 0.08, a multi-turn mismatch 1.5x the single-turn one."""
    args = {**grpo_args, "tools": "calculator", "max_obs_tokens": 256, "max_tool_calls": 8}
    run = write_run(tmp_path / "run", args, step=step)
    exit_code, found = findings(capsys, run)
    assert exit_code == 1
    assert found[code]["severity"] == "warning"
    assert evidence in found[code]["evidence"]
    near = {
        "tool_errors": {"tool/error_rate": 0.4, "tool/calls_mean": 1.0},
        "tool_calls_collapse": {"tool/calls_mean": 0.1},
        "truncated_by_tool": {"tool/truncated_by_tool_rate": 0.08},
        "multi_turn_mismatch": {
            "train/logprob_mismatch_multi_turn": 0.015,
            "train/logprob_mismatch_single_turn": 0.01,
        },
    }
    miss = write_run(tmp_path / "near", args, step=lambda i: near[code])
    assert code not in findings(capsys, miss)[1]


def test_a_failing_last_call_of_a_dying_tool_is_no_error_warning(tmp_path, grpo_args, capsys):
    """Calls fall to ~0 and the few left fail: the collapse is the finding; an error rate over
    steps that barely call the tool is noise."""

    def step(i):
        return {"tool/calls_mean": max(0.0005, 1.0 - 0.1 * i), "tool/error_rate": float(i > 10)}

    args = {**grpo_args, "tools": "calculator"}
    run = write_run(tmp_path / "run", args, step=step)
    found = findings(capsys, run)[1]
    assert "tool_calls_collapse" in found
    assert "tool_errors" not in found
