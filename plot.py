"""One dashboard figure per run, drawn from its metrics.jsonl; several runs overlay in the same
layout (sweeps).

grpo.py, grpo_ray.py, sft.py and expert_iteration.py call plot_runs([run], os.path.join(run,
"dashboard.png")) at the end of a run (and on Ctrl-C). To compare runs (one colour per run, named
in the header):

  python plot.py runs/lr1e-5 runs/lr3e-5 runs/lr1e-4 --out plots/lr_sweep.png
  python plot.py runs/on runs/off --x time/wall --out plots/off_policy.png  # against wall seconds
  python plot.py runs/sft --out plots/sft.png  # sft runs: the same keys, fewer panels

--compare tabulates and plots final accuracy against zero-shot, per generation budget (seed 002
§1.6.2): each grpo.py / grpo_ray.py run's last validation, and each --max-tokens row of an
eval_zero_shot.py output (its summary.json). The table is printed and written beside the figure:

  python plot.py --compare runs/eval_countdown runs/cd_256 runs/cd_512 --out runs/cd_final.png

Layout: a grid of line panels (colour = run, line style = key, markers on validation keys, ± 1
standard error bars on those logged with an `_se`, e.g. eval/accuracy_se) and one time panel. A
panel no run has data for is dropped, so an sft run gets a compact grid (no reward or KL panels); a
key one run lacks is skipped for that run only. Rows that share an x are averaged: with --x step
(the rollout step) those are the several optimizer steps of one rollout batch. NaN and None are
skipped. The time panel is a stacked bar per run, total seconds per phase: where the run's time
went.

The API: build_figure(run_dirs, x) -> a matplotlib Figure (tests read its axes); plot_runs(...)
writes it atomically; plot_timeline(...) draws grpo_ray.py's Gantt chart.
"""

import json
import math
import os

from common import Parser, check
from runs import read_metrics

# (title, keys, keys on a right-hand y axis): a line style per key; eval/ keys get markers
PANELS = [
    ("validation (greedy)", ["eval/accuracy", "eval/format_reward"], []),
    ("validation (sampled, --eval-samples k)", ["eval/avg@k", "eval/pass@k", "eval/maj@k"], []),
    (
        "train reward",
        ["train/reward", "train/format_reward", "train/answer_reward", "train/kept_frac"],
        [],
    ),
    ("loss", ["train/loss", "train/nll_per_token"], []),
    ("grad norm (before clipping)", ["train/grad_norm"], []),
    # expert_iteration.py: over all sampled responses (train/entropy, as grpo.py's) and the kept
    ("token entropy", ["train/entropy", "train/entropy_kept"], []),
    ("KL to reference / previous policy", ["train/kl_ref", "train/kl_prev"], []),
    # engine-vs-trainer KLs are orders of magnitude below kl_ref: their own panel, or they read as 0
    (
        "KL engine vs trainer (mismatch)",
        ["train/mismatch_kl", "train/mismatch_kernel_kl", "train/mismatch_staleness_kl"],
        [],
    ),
    (
        "response length (tokens) / truncation",
        ["train/response_len_mean", "eval/response_len"],
        ["train/truncation_rate", "eval/truncation_rate"],
    ),
    # --tools runs: calls and turns per response; the fraction of calls that fail on the right
    (
        "tool calls / turns / errors (--tools)",
        ["tool/calls_mean", "eval/tool_calls_mean", "tool/turns_mean"],
        ["tool/error_rate"],
    ),
]
STYLES = ["-", "--", ":", "-."]
# time key -> colour (grpo_ray.py's timeline colours); sft.py's training phase is its time/step
PHASES = {
    "time/generation": "tab:blue",
    "time/grading": "tab:cyan",
    "time/tool": "tab:purple",
    "time/old_log_probs": "tab:olive",
    "time/entropy": "tab:olive",  # expert_iteration.py's no-grad pass
    "time/training": "tab:red",
    "time/step": "tab:red",
    "time/weight_sync": "tab:green",
    "time/eval": "lightgray",
}
X_CHOICES = ["step", "opt_step", "time/wall"]


def _ok(v):
    """A plottable number: drops None, NaN, inf and strings."""
    return isinstance(v, (int, float)) and math.isfinite(v)


def series(rows, key, x):
    """(xs, ys) of key against x, rows that share an x averaged; rows lacking either are skipped."""
    acc = {}
    for r in rows:
        if _ok(r.get(key)) and _ok(r.get(x)):
            acc.setdefault(r[x], []).append(float(r[key]))
    xs = sorted(acc)
    return xs, [sum(acc[k]) / len(acc[k]) for k in xs]


def error_bars(rows, key, x, xs):
    """The standard error (`<key>_se`, logged beside eval metrics) at each of xs, 0 where a row
    has none; None when the run logs no SE for key: no error bars."""
    se_xs, se = series(rows, key + "_se", x)
    if not se_xs:
        return None
    at = dict(zip(se_xs, se))
    return [at.get(v, 0.0) for v in xs]


def time_split(rows):
    """{time key: total seconds} of a run. A rollout step's times repeat on each of its
    optimizer-step rows, so they are averaged per "step" first (whatever the plot's x).
    grpo.py's time/step is the sum of its phases, so it is left out; sft.py's is all training (it
    logs no time/training)."""
    if any("time/training" in r for r in rows):
        left_out = "time/step"
    else:
        left_out = "time/training"
    split = {}
    for key in PHASES:
        if key == left_out:
            continue
        ys = series(rows, key, "step")[1]
        if ys:
            split[key] = sum(ys)
    return split


def load_runs(run_dirs):
    """[(name, rows)]: the directory's base name, or its whole path when two runs share a base
    name."""
    names = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    if len(set(names)) < len(names):
        names = [os.path.normpath(d) for d in run_dirs]
    return [(n, read_metrics(os.path.join(d, "metrics.jsonl"))) for n, d in zip(names, run_dirs)]


def header(name, rows):
    """One line per run: its name, the last step, validation accuracy first -> last (best), wall
    time."""
    parts = [name]
    steps = [r["step"] for r in rows if _ok(r.get("step"))]
    if steps:
        parts.append(f"step {max(steps):g}")
    acc = series(rows, "eval/accuracy", "step")[1]
    if acc:
        parts.append(f"val acc {acc[0]:.3f} -> {acc[-1]:.3f} (best {max(acc):.3f})")
    wall = [r["time/wall"] for r in rows if _ok(r.get("time/wall"))]
    if wall:
        parts.append(f"{max(wall) / 60:.1f} min")
    return " | ".join(parts)


def _marker(key):
    """Validation keys get a point per eval, not a trend line."""
    if key.startswith("eval/"):
        return "o"
    return None


def _line_panel(ax, runs, title, keys, right, x):
    """Colour = run, line style = key; `right` keys on a second y axis (another scale, e.g. a
    rate)."""
    from matplotlib.lines import Line2D

    names = keys + right
    curves = []  # (run index, key index, label, xs, ys, standard errors or None)
    for i, (name, rows) in enumerate(runs):
        for j, key in enumerate(names):
            xs, ys = series(rows, key, x)
            if xs:  # a key this run lacks: skipped for this run only
                curves.append((i, j, f"{name} {key}", xs, ys, error_bars(rows, key, x, xs)))
    twin = None
    if any(j >= len(keys) for _, j, _, _, _, _ in curves):
        twin = ax.twinx()
    for i, j, label, xs, ys, se in curves:
        on = ax
        if j >= len(keys):
            on = twin
        style = dict(color=f"C{i}", linestyle=STYLES[j], marker=_marker(names[j]), markersize=3)
        if se is None:
            on.plot(xs, ys, label=label, **style)
        else:
            on.errorbar(xs, ys, yerr=se, capsize=2, label=label, **style)  # ± 1 SE
    shown = sorted({j for _, j, _, _, _, _ in curves})
    if len(names) > 1:
        # which line style is which key (colours are runs: the header says which); on the top
        # axes, over the lines
        handles = []
        labels = []
        for j in shown:
            style = Line2D(
                [], [], color="0.3", linestyle=STYLES[j], marker=_marker(names[j]), markersize=3
            )
            handles.append(style)
            label = names[j]
            if j >= len(keys):
                label += " (right)"
            labels.append(label)
        legend_ax = ax
        if twin is not None:
            legend_ax = twin
        legend_ax.legend(handles, labels, fontsize=7)
    ylabel = None  # several keys: the legend names them
    if len(names) == 1:
        ylabel = keys[0]
    ax.set(title=title, xlabel=x, ylabel=ylabel)
    if twin is not None:
        twin.set_ylabel(right[0].split("/")[1].replace("_", " "))
    ax.grid(alpha=0.3)


def _time_panel(ax, runs):
    """A stacked bar per run: total seconds per phase, the run's total at its end."""
    seen = set()
    for i, (_, rows) in enumerate(runs):
        left = 0.0
        for k, s in time_split(rows).items():
            if k in seen:
                label = None  # one legend entry per phase
            elif k == "time/step":
                label = "training"  # sft.py's time/step
            else:
                label = k.removeprefix("time/")
            ax.barh(i, s, left=left, color=PHASES[k], label=label)
            seen.add(k)
            left += s
        ax.text(left, i, f" {left:.0f} s", va="center", fontsize=7)
    ax.set_yticks(range(len(runs)), [name for name, _ in runs], fontsize=7)
    for i, tick in enumerate(ax.get_yticklabels()):
        tick.set_color(f"C{i}")
    ax.invert_yaxis()  # first run on top, as in the header
    ax.margins(x=0.15)  # room for the totals
    ax.set(title="time split (total seconds)", xlabel="seconds")
    # beside the bars, not over them
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))


def build_figure(run_dirs, x="step"):
    """The dashboard as a matplotlib Figure (not drawn, no pyplot state): axes titled as in PANELS
    (a right-hand y axis is an extra, untitled Axes), then the time panel."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    runs = load_runs(run_dirs)
    panels = []  # a panel no run has data for is dropped
    for title, keys, right in PANELS:
        if any(series(rows, k, x)[0] for _, rows in runs for k in keys + right):
            panels.append((title, keys, right))
    has_time = any(time_split(rows) for _, rows in runs)
    n = len(panels)
    if has_time:
        n += 1
    ncols = min(3, max(n, 1))
    nrows = math.ceil(max(n, 1) / ncols)
    fig = Figure(figsize=(5 * ncols, 3.2 * nrows + 0.25 * len(runs) + 0.3), layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[max(n, 1) :]:
        fig.delaxes(ax)
    for ax, (title, keys, right) in zip(axes, panels):
        _line_panel(ax, runs, title, keys, right, x)
    if has_time:
        _time_panel(axes[len(panels)], runs)
    if n == 0:  # an empty or not-yet-written metrics.jsonl (a run stopped before its first row)
        axes[0].set_title("no data")
        axes[0].set_axis_off()
    fig.legend(
        [Line2D([], [], color=f"C{i}", lw=2) for i in range(len(runs))],
        [header(name, rows) for name, rows in runs],
        loc="outside upper center",
        fontsize=8,
        frameon=False,
    )
    return fig


def plot_runs(run_dirs, out_path, x="step"):
    """Write the dashboard of run_dirs to out_path (a directory gets out_path/dashboard.png);
    returns the path."""
    if os.path.isdir(out_path):
        out_path = os.path.join(out_path, "dashboard.png")
    fig = build_figure(run_dirs, x)
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    root, ext = os.path.splitext(out_path)
    tmp = f"{root}.tmp{ext or '.png'}"  # same extension: savefig picks the format from it
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, out_path)  # atomic: a viewer never sees half a figure
    except BaseException:  # a stop request or a full disk: no half-drawn tmp file stays behind
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return out_path


# ----------------------------------------------------------------------------- --compare
def method_of(args):
    """A training run's method as seed 002 names it, from its saved flags: GRPO (std-normalised
    advantages, per-sequence mean), Dr. GRPO (neither), else both settings spelled out. A run
    from before --adv-std has only std_norm (True: group, False: none)."""
    adv_std = args.get("adv_std")
    if adv_std is None:
        adv_std = "none"
        if args["std_norm"]:
            adv_std = "group"
    estimator = args.get("advantage", "grpo")
    if estimator == "grpo" and adv_std == "group" and args["length_norm"] == "masked_mean":
        return "GRPO"
    if estimator == "grpo" and adv_std == "none" and args["length_norm"] == "masked_normalize":
        return "Dr. GRPO"
    return f"{estimator} (adv_std {adv_std}, {args['length_norm']})"


def final_accuracy(run_dir):
    """The rows a run adds to the --compare table: an eval_zero_shot.py output (summary.json) one
    per --max-tokens, a grpo.py / grpo_ray.py run (args.json, metrics.jsonl) its last validation.
    Each row: {"run", "method", "max_tokens", "accuracy", "step"}. Anything else is a one-line
    error."""
    name = os.path.basename(os.path.normpath(run_dir))
    args_path = os.path.join(run_dir, "args.json")
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(args_path) and os.path.isfile(metrics_path):
        with open(args_path) as f:
            args = json.load(f)
        check("std_norm" in args, f"{run_dir}: not a grpo.py or grpo_ray.py run")
        evals = [r for r in read_metrics(metrics_path) if _ok(r.get("eval/accuracy"))]
        check(evals, f"{run_dir}: no validation row in metrics.jsonl yet")
        last = max(evals, key=lambda r: r["step"])  # the final eval follows the last step
        row = {
            "run": name,
            "method": method_of(args),
            "max_tokens": args["max_tokens"],
            "accuracy": last["eval/accuracy"],
            "step": last["step"],
        }
        return [row]
    summary_path = os.path.join(run_dir, "summary.json")
    check(
        os.path.isfile(summary_path),
        f"{run_dir}: neither a training run (args.json, metrics.jsonl) nor an eval_zero_shot.py "
        "output (summary.json)",
    )
    with open(summary_path) as f:
        summary = json.load(f)
    check("rows" in summary, f"{summary_path}: not an eval_zero_shot.py summary")
    rows = []
    for r in summary["rows"]:
        rows.append(
            {
                "run": name,
                "method": "zero-shot",
                "max_tokens": r["max_tokens"],
                "accuracy": r["accuracy"],
                "step": 0,
            }
        )
    return rows


def compare_table(rows):
    """The --compare rows as a markdown table, by max tokens, zero-shot first."""
    lines = [
        "| run | method | max tokens | final accuracy | after step |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['method']} | {r['max_tokens']} | {r['accuracy']:.4f} | "
            f"{r['step']} |"
        )
    return "\n".join(lines)


def compare_figure(rows):
    """Bars of final accuracy grouped by max tokens, one colour per method, each bar labelled
    with its value; a dashed line at the zero-shot accuracy of the largest budget (seed 002's
    target: trained at 256 / 512 tokens, beat zero-shot at 1024)."""
    from matplotlib.figure import Figure

    budgets = sorted({r["max_tokens"] for r in rows})
    methods = []  # in order of first appearance: a colour each
    for r in rows:
        if r["method"] not in methods:
            methods.append(r["method"])
    fig = Figure(figsize=(2 + 0.9 * len(rows) + 0.5 * len(budgets), 4), layout="constrained")
    ax = fig.subplots()
    x = 0.0  # the next bar's position
    centres = []  # (centre, budget) of each group
    seen = set()  # methods already in the legend
    for budget in budgets:
        group = [r for r in rows if r["max_tokens"] == budget]
        start = x
        for r in group:
            label = None
            if r["method"] not in seen:
                label = r["method"]
                seen.add(r["method"])
            colour = f"C{methods.index(r['method'])}"
            ax.bar(x, r["accuracy"], width=0.8, color=colour, label=label)
            ax.text(x, r["accuracy"], f"{r['accuracy']:.3f}", ha="center", va="bottom", fontsize=7)
            x += 1
        centres.append(((start + x - 1) / 2, budget))
        x += 0.6  # a gap between groups
    zero_shot = [r for r in rows if r["method"] == "zero-shot"]
    if zero_shot:
        target = max(zero_shot, key=lambda r: r["max_tokens"])
        ax.axhline(
            target["accuracy"],
            color="0.3",
            linestyle="--",
            label=f"zero-shot at {target['max_tokens']} tokens",
        )
    ax.set_xticks([c for c, _ in centres], [f"{b} tokens" for _, b in centres])
    ax.set(ylabel="final accuracy", title="final accuracy by generation budget")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    return fig


def compare(run_dirs, out_path):
    """--compare: the table (printed, and written beside the figure as .md) and the figure of the
    runs' final accuracies. -> (table text, figure path)."""
    rows = []
    for d in run_dirs:
        rows += final_accuracy(d)
    rows.sort(key=lambda r: (r["max_tokens"], r["method"] != "zero-shot"))  # stable: as given
    table = compare_table(rows)
    if os.path.isdir(out_path):
        out_path = os.path.join(out_path, "final_accuracy.png")
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    root, ext = os.path.splitext(out_path)
    with open(root + ".md", "w") as f:
        f.write(table + "\n")
    tmp = f"{root}.tmp{ext or '.png'}"
    compare_figure(rows).savefig(tmp, dpi=100)
    os.replace(tmp, out_path)
    return table, out_path


def main(argv=None):
    p = Parser(
        description="Overlay runs (grpo.py, grpo_ray.py, sft.py) in one dashboard figure, or "
        "--compare their final accuracies with zero-shot outputs."
    )
    p.add_argument(
        "runs",
        nargs="+",
        help="run directories holding metrics.jsonl (--compare: also eval_zero_shot.py outputs)",
    )
    p.add_argument(
        "--out", default="dashboard.png", help="figure path (.png, .pdf, .svg) or a directory"
    )
    p.add_argument(
        "--x",
        default="step",
        choices=X_CHOICES,
        help="x axis: rollout step (sft: optimizer step), optimizer step, or wall-clock seconds",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="final accuracy per run and generation budget against zero-shot: a table (printed "
        "and in <out>.md) and a bar chart (seed 002 §1.6.2)",
    )
    args = p.parse_args(argv)
    if args.compare:
        table, path = compare(args.runs, args.out)
        print(table)
        print(path)
        return
    for d in args.runs:
        has_metrics = os.path.isfile(os.path.join(d, "metrics.jsonl"))
        check(has_metrics, f"{d}: no metrics.jsonl; pass run directories")
    runs = load_runs(args.runs)
    logs_x = any(_ok(r.get(args.x)) for _, rows in runs for r in rows)
    check(logs_x, f"no run logs --x {args.x}; use --x step (sft.py logs no opt_step)")
    print(plot_runs(args.runs, args.out, args.x))


# grpo_ray.py's timeline colours, one per phase
COLORS = {
    "generate": "tab:blue",
    "score": "tab:cyan",
    "old_log_probs": "tab:olive",
    "train": "tab:red",
    "get_weights": "tab:purple",
    "weight_sync": "tab:green",
}


def plot_timeline(runs, path):
    """grpo_ray.py's timeline: a Gantt chart, one panel per run (title, spans), one row per actor;
    bars are phases (eval left out), labelled with their step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = []  # (title, spans without eval)
    for title, spans in runs:
        kept.append((title, [s for s in spans if s["phase"] != "eval"]))
    runs = kept
    names = [sorted({s["actor"] for s in spans}) for _, spans in runs]  # each run's actors
    height = 1.2 + 1.1 * sum(map(len, names))
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, height), squeeze=False)
    for ax, (title, spans), actors in zip(axes[:, 0], runs, names):
        t_min = min(s["t0"] for s in spans)
        for s in spans:
            y = actors.index(s["actor"])
            bar = (s["t0"] - t_min, s["t1"] - s["t0"])  # (start, width)
            ax.broken_barh([bar], (y - 0.4, 0.8), color=COLORS[s["phase"]])
            if s["phase"] in ("generate", "train"):
                ax.text(s["t0"] - t_min, y, str(s["step"]), va="center", fontsize=7)
        ax.set(yticks=range(len(actors)), yticklabels=actors, xlabel="seconds", title=title)
    fig.legend(
        [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()],
        list(COLORS),
        ncol=len(COLORS),
        fontsize=7,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path + ".tmp.png", dpi=110)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


if __name__ == "__main__":
    main()
