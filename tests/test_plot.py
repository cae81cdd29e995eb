"""plot.py: the dashboard of synthetic metrics.jsonl files shaped like grpo.py's and sft.py's rows
(no model)."""

import json
import math
import os
import subprocess
import sys

import pytest

import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_PANELS = [t for t, _, _ in plot.PANELS] + ["time split (total seconds)"]


def grpo_rows(n_steps=4, opt_per_step=2, kl=True):
    """grpo.py's layout: opt_per_step train rows per rollout step (rollout values repeated), eval
    every 2 steps."""
    rows = []
    opt = 0  # optimizer steps so far
    for s in range(n_steps):
        common = {
            "train/reward": 0.1 * s,
            "train/format_reward": 0.5,
            "train/answer_reward": 0.1 * s,
            "train/response_len_mean": 20.0 + s,
            "train/truncation_rate": 0.0,
            "train/lr": 1e-5,
            "time/generation": 1.0,
            "time/grading": 0.5,
            "time/old_log_probs": 0.25,
            "time/training": 2.0,
            "time/weight_sync": 0.1,
            "time/step": 3.85,
        }
        if kl:
            common |= {"train/kl_ref": 0.01 * s, "train/kl_prev": 0.001, "train/mismatch_kl": 1e-6}
            common |= {"tool/calls_mean": 2.0, "tool/turns_mean": 3.0, "tool/error_rate": 0.1}
        for e in range(opt_per_step):
            opt += 1
            rows.append(
                {"step": s, "opt_step": opt, "time/wall": 4.0 * opt}
                | common
                | {
                    "train/loss": s + e,
                    "train/grad_norm": 1.0,
                    "train/entropy": 2.0,
                    "train/clip_fraction": 0.0,
                }
            )
        if s % 2 == 0:
            rows.append(
                {
                    "step": s,
                    "opt_step": opt,
                    "time/wall": 4.0 * opt + 1,
                    "time/eval": 3.0,
                    "eval/accuracy": 0.2 + 0.1 * s,
                    "eval/accuracy_se": 0.01 * (s + 1),
                    "eval/n_questions": 100,
                    "eval/format_reward": 0.9,
                    "eval/response_len": 30.0,
                    "eval/truncation_rate": 0.5,
                    "eval/avg@k": 0.1 + 0.1 * s,
                    "eval/avg@k_se": 0.02,
                    "eval/pass@k": 0.3 + 0.1 * s,
                    "eval/pass@k_se": 0.03,
                    "eval/maj@k": 0.2 + 0.1 * s,
                    "eval/maj@k_se": 0.025,
                }
            )
    return rows


def sft_rows(n_steps=4):
    """sft.py's layout: step = optimizer steps done; eval rows at steps 2 and 4."""
    rows = []
    for s in range(1, n_steps + 1):
        rows.append(
            {
                "step": s,
                "train/loss": 1.0 / s,
                "train/nll_per_token": 0.5 / s,
                "train/grad_norm": 1.0,
                "train/entropy": 1.5,
                "train/lr": 1e-4,
                "time/step": 0.5,
                "time/wall": 3.0 * s,
            }
        )
        if s % 2 == 0:
            rows.append(
                {
                    "step": s,
                    "eval_step": s // 2,
                    "eval/accuracy": 0.1 * s,
                    "eval/format_reward": 0.2 * s,
                    "eval/response_len": 40.0,
                    "eval/truncation_rate": 0.0,
                    "time/weight_sync": 0.25,
                    "time/eval": 2.0,
                    "time/wall": 3.0 * s + 1,
                }
            )
    return rows


def write_run(path, rows, tail=""):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.write(tail)
    return str(path)


def panels(fig):
    """{title: axes}; a right-hand y axis has no title."""
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_series_averages_rows_sharing_x_and_skips_nan_none():
    rows = [
        {"step": 0, "k": 1.0},
        {"step": 0, "k": 3.0},
        {"step": 1, "k": float("nan")},
        {"step": 1, "k": None},
        {"step": 2, "k": 5},
        {"step": 3},
        {"k": 7.0},
        {"step": None, "k": 7.0},
    ]
    assert plot.series(rows, "k", "step") == ([0, 2], [2.0, 5.0])


def test_grpo_run_writes_one_dashboard_with_every_panel(tmp_path):
    run = write_run(tmp_path / "grpo_a", grpo_rows())
    out = plot.plot_runs([run], os.path.join(run, "dashboard.png"))
    assert out == os.path.join(run, "dashboard.png")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(out) > 10_000
    # no tmp file left, no other PNGs
    assert sorted(os.listdir(run)) == ["dashboard.png", "metrics.jsonl"]
    fig = plot.build_figure([run])
    assert list(panels(fig)) == ALL_PANELS
    assert len(fig.axes) == len(ALL_PANELS) + 2  # + the truncation and tool error axes
    length = panels(fig)["response length (tokens) / truncation"]
    twin = next(ax for ax in fig.axes if not ax.get_title())
    assert len(length.lines) == 2
    right_labels = {line.get_label() for line in twin.lines}
    assert right_labels == {"grpo_a train/truncation_rate", "grpo_a eval/truncation_rate"}
    loss = panels(fig)["loss"].lines
    assert len(loss) == 1
    assert list(loss[0].get_ydata()) == [0.5, 1.5, 2.5, 3.5]  # 2 optimizer steps averaged
    val = panels(fig)["validation (greedy)"].lines
    val = [line for line in val if not line.get_label().startswith("_")]  # not error-bar caps
    assert all(line.get_marker() == "o" for line in val)
    assert list(val[0].get_xdata()) == [0, 2]
    assert "grpo_a | step 3 | val acc 0.200 -> 0.400" in fig.legends[0].get_texts()[0].get_text()


def test_x_opt_step_keeps_every_optimizer_step(tmp_path):
    fig = plot.build_figure([write_run(tmp_path / "a", grpo_rows())], x="opt_step")
    assert list(panels(fig)["loss"].lines[0].get_xdata()) == list(range(1, 9))


def test_time_split_counts_a_rollout_step_once():
    split = plot.time_split(grpo_rows(n_steps=4, opt_per_step=2))
    assert split["time/generation"] == 4.0  # not x2 for the 2 rows per step
    assert split["time/training"] == 8.0
    assert split["time/eval"] == 6.0
    assert "time/step" not in split  # time/step is the sum: not a phase
    assert plot.time_split(sft_rows()) == {
        "time/step": 2.0,
        "time/weight_sync": 0.5,
        "time/eval": 4.0,
    }


def test_sft_run_drops_empty_panels(tmp_path):
    fig = plot.build_figure([write_run(tmp_path / "sft", sft_rows())])
    assert list(panels(fig)) == [
        "validation (greedy)",
        "loss",
        "grad norm (before clipping)",
        "token entropy",
        "response length (tokens) / truncation",
        "time split (total seconds)",
    ]
    assert {line.get_label() for line in panels(fig)["loss"].lines} == {
        "sft train/loss",
        "sft train/nll_per_token",
    }


def test_overlay_two_runs_skips_a_missing_key_for_that_run_only(tmp_path):
    a = write_run(tmp_path / "a", grpo_rows(kl=True))
    b = write_run(tmp_path / "b", grpo_rows(kl=False, n_steps=3))
    fig = plot.build_figure([a, b])
    p = panels(fig)
    assert list(p) == ALL_PANELS
    kl = p["KL to reference / previous policy"].lines
    assert {line.get_label() for line in kl} == {"a train/kl_ref", "a train/kl_prev"}  # b has no KL
    mismatch = p["KL engine vs trainer (mismatch)"].lines
    assert [line.get_label() for line in mismatch] == ["a train/mismatch_kl"]
    reward = p["train reward"].lines
    assert len(reward) == 6
    assert {line.get_color() for line in reward} == {"C0", "C1"}  # colour = run
    assert [t.get_text().split(" |")[0] for t in fig.legends[0].get_texts()] == ["a", "b"]
    ticks = p["time split (total seconds)"].get_yticklabels()
    assert [t.get_text() for t in ticks] == ["a", "b"]
    assert os.path.getsize(plot.plot_runs([a, b], str(tmp_path / "plots" / "ab.png"))) > 10_000


def test_same_base_names_are_told_apart_by_path(tmp_path):
    a = write_run(tmp_path / "x" / "run", sft_rows())
    b = write_run(tmp_path / "y" / "run", sft_rows())
    assert [n for n, _ in plot.load_runs([a, b])] == [os.path.normpath(a), os.path.normpath(b)]


def test_truncated_last_line_is_dropped(tmp_path, capsys):
    run = write_run(
        tmp_path / "crashed", grpo_rows(n_steps=2), tail='{"step": 9, "opt_step": 9, "train/lo'
    )
    fig = plot.build_figure([run])
    assert max(panels(fig)["loss"].lines[0].get_xdata()) == 1
    assert os.path.exists(plot.plot_runs([run], run))  # a directory as out_path
    assert os.path.exists(os.path.join(run, "dashboard.png"))


def test_empty_run_says_no_data(tmp_path):
    run = str(tmp_path / "empty")
    os.makedirs(run)  # stopped before its first row: no metrics.jsonl yet
    fig = plot.build_figure([run])
    assert [ax.get_title() for ax in fig.axes] == ["no data"]
    assert os.path.getsize(plot.plot_runs([run], os.path.join(run, "dashboard.png"))) > 0


def cli(*argv):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "plot.py"), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_cli_overlays_runs(tmp_path):
    a = write_run(tmp_path / "a", grpo_rows())
    b = write_run(tmp_path / "b", grpo_rows(n_steps=2))
    out = tmp_path / "plots" / "sweep.png"
    proc = cli(a, b, "--out", str(out), "--x", "time/wall")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    assert out.stat().st_size > 10_000


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{tmp}/missing"], "missing: no metrics.jsonl; pass run directories"),
        (["{sft}", "--x", "opt_step"], "no run logs --x opt_step"),
        (["{sft}", "--x", "epoch"], "invalid choice"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path, argv, message):
    sft = write_run(tmp_path / "sft", sft_rows())
    proc = cli(*[s.format(tmp=tmp_path, sft=sft) for s in argv], "--out", str(tmp_path / "x.png"))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stderr.startswith("error: ")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


def test_nan_rows_do_not_break_a_panel(tmp_path):
    rows = grpo_rows(n_steps=2)
    rows[0]["train/entropy"] = float("nan")  # step 0 has no finite entropy
    rows[1]["train/entropy"] = None
    fig = plot.build_figure([write_run(tmp_path / "a", rows)])
    entropy = panels(fig)["token entropy"].lines[0]
    assert list(entropy.get_xdata()) == [1]
    assert not any(map(math.isnan, entropy.get_ydata()))


# ----------------------------------------------------------------------------- --compare
def write_training_run(path, max_tokens, std_norm, length_norm, final_accuracy):
    """A grpo.py run as --compare reads it: args.json (its flags) and metrics.jsonl (grpo_rows, then
    the final validation after the last step)."""
    rows = grpo_rows()
    rows.append({"step": 4, "opt_step": 8, "eval/accuracy": final_accuracy, "time/wall": 40.0})
    write_run(path, rows)
    args = {"max_tokens": max_tokens, "std_norm": std_norm, "length_norm": length_norm}
    with open(os.path.join(path, "args.json"), "w") as f:
        json.dump(args, f)
    return str(path)


def write_zero_shot(path, accuracies):
    """An eval_zero_shot.py output: summary.json with one row per --max-tokens value."""
    import eval_zero_shot

    rows = []
    for max_tokens, accuracy in accuracies.items():
        right = round(100 * accuracy)  # of 100 examples
        graded = []
        for i in range(100):
            answer = float(i < right)
            graded.append(
                {
                    "category": f"format1_answer{int(answer)}",
                    "reward": answer,
                    "answer_reward": answer,
                    "num_tokens": 10,
                    "finish_reason": "stop",
                }
            )
        one_pass = {"max_tokens": max_tokens, "rows": graded, "generate_s": 1.0}
        rows.append(eval_zero_shot.pass_summary(one_pass))
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"args": {"max_tokens": list(accuracies)}, "rows": rows}, f)
    return str(path)


def seed_002_runs(tmp_path):
    """Seed 002's experiment: zero-shot at three budgets and the 2 x 2 grid."""
    return [
        write_zero_shot(tmp_path / "eval_countdown", {256: 0.01, 512: 0.15, 1024: 0.37}),
        write_training_run(tmp_path / "cd_256", 256, True, "masked_mean", 0.40),
        write_training_run(tmp_path / "cd_512", 512, True, "masked_mean", 0.45),
        write_training_run(tmp_path / "cd_256_drgrpo", 256, False, "masked_normalize", 0.42),
        write_training_run(tmp_path / "cd_512_drgrpo", 512, False, "masked_normalize", 0.47),
    ]


def test_compare_tabulates_final_accuracy_against_zero_shot(tmp_path):
    runs = seed_002_runs(tmp_path)
    out = tmp_path / "plots" / "final.png"
    proc = cli("--compare", *runs, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    table = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert table[0] == "| run | method | max tokens | final accuracy | after step |"
    # by budget, zero-shot first; a training run's last validation (after its last step)
    assert table[2:] == [
        "| eval_countdown | zero-shot | 256 | 0.0100 | 0 |",
        "| cd_256 | GRPO | 256 | 0.4000 | 4 |",
        "| cd_256_drgrpo | Dr. GRPO | 256 | 0.4200 | 4 |",
        "| eval_countdown | zero-shot | 512 | 0.1500 | 0 |",
        "| cd_512 | GRPO | 512 | 0.4500 | 4 |",
        "| cd_512_drgrpo | Dr. GRPO | 512 | 0.4700 | 4 |",
        "| eval_countdown | zero-shot | 1024 | 0.3700 | 0 |",
    ]
    assert (tmp_path / "plots" / "final.md").read_text().strip() == "\n".join(table)
    assert out.stat().st_size > 5_000


def test_compare_figure_has_a_bar_per_row_and_the_zero_shot_target(tmp_path):
    rows = []
    for run in seed_002_runs(tmp_path):
        rows += plot.final_accuracy(run)
    fig = plot.compare_figure(rows)
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 4) for p in ax.patches)
    assert heights == sorted(r["accuracy"] for r in rows)
    # the target line: zero-shot at the largest budget
    (target,) = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert list(target.get_ydata()) == [0.37, 0.37]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "256 tokens",
        "512 tokens",
        "1024 tokens",
    ]


def test_compare_names_other_settings_and_refuses_other_directories(tmp_path):
    run = write_training_run(tmp_path / "mixed", 256, False, "masked_mean", 0.3)
    assert plot.final_accuracy(run)[0]["method"] == "grpo (adv_std none, masked_mean)"
    # a run since --advantage / --adv-std: std_norm is None, adv_std names the normaliser
    run = write_training_run(tmp_path / "rloo", 256, None, "masked_mean", 0.3)
    with open(os.path.join(run, "args.json")) as f:
        args = json.load(f)
    args.update(advantage="rloo", adv_std="batch")
    with open(os.path.join(run, "args.json"), "w") as f:
        json.dump(args, f)
    assert plot.final_accuracy(run)[0]["method"] == "rloo (adv_std batch, masked_mean)"
    args.update(advantage="grpo", adv_std="group")
    with open(os.path.join(run, "args.json"), "w") as f:
        json.dump(args, f)
    assert plot.final_accuracy(run)[0]["method"] == "GRPO"
    sft = write_run(tmp_path / "sft", sft_rows())  # metrics but no GRPO flags, nor a summary
    proc = cli("--compare", sft, "--out", str(tmp_path / "x.png"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ")
    assert "neither a training run" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


def errorbar_data(ax):
    """[(label, xs, ys, standard errors)] of the error-bar curves drawn on ax."""
    from matplotlib.container import ErrorbarContainer

    drawn = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            line = c.lines[0]  # (data line, cap lines, bar collections)
            bars = c.lines[2][0]
            se = [(top[1] - bottom[1]) / 2 for bottom, top in bars.get_segments()]
            drawn.append((c.get_label(), list(line.get_xdata()), list(line.get_ydata()), se))
    return drawn


def test_eval_metrics_with_a_standard_error_get_error_bars_in_every_overlaid_run(tmp_path):
    """eval/accuracy ± eval/accuracy_se and the sampled keys ± theirs, for each overlaid run; a
    run without SEs (sft's rows here) is drawn as a plain line."""
    a = write_run(tmp_path / "a", grpo_rows())
    b_rows = grpo_rows()
    for r in b_rows:
        if "eval/accuracy" in r:
            r["eval/accuracy"] += 0.05
    b = write_run(tmp_path / "b", b_rows)
    c = write_run(tmp_path / "c", sft_rows())
    p = panels(plot.build_figure([a, b, c]))
    greedy = errorbar_data(p["validation (greedy)"])
    assert ("a eval/accuracy", [0, 2], [0.2, 0.4], [0.01, 0.03]) in [
        (label, xs, ys, pytest.approx(se)) for label, xs, ys, se in greedy
    ]
    labels = [label for label, _, _, _ in greedy]
    assert "b eval/accuracy" in labels
    assert "c eval/accuracy" not in labels  # no SE logged: a plain line
    sampled = errorbar_data(p["validation (sampled, --eval-samples k)"])
    assert sorted(label for label, _, _, _ in sampled) == sorted(
        f"{run} eval/{key}" for run in "ab" for key in ("avg@k", "pass@k", "maj@k")
    )
    for label, _, _, se in sampled:
        if label.endswith("pass@k"):
            assert se == pytest.approx([0.03, 0.03])
