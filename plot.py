"""Plot GRPO runs from their metrics.jsonl: one PNG per metric, several runs overlaid (for sweeps).

grpo.py calls plot_runs([run], run) at the end of every run (and on Ctrl-C). For a sweep:
  python plot.py runs/lr1e-5 runs/lr3e-5 runs/lr1e-4 --out plots/lr_sweep
  python plot.py runs/on runs/off --x time/wall --out plots/off_policy   # against wall-clock seconds
Validation metrics are plotted against their own x (the steps where eval ran); train metrics are
averaged over the optimizer steps of each GRPO step when --x is "step".
"""
import argparse
import json
import os

METRICS = {  # key -> title; a run lacking a key is skipped for that figure
    "eval/accuracy": "validation accuracy (greedy)", "eval/reward": "validation reward",
    "train/reward": "train reward", "train/answer_reward": "train answer reward",
    "train/format_reward": "train format reward", "train/entropy": "token entropy",
    "train/grad_norm": "grad norm (before clipping)", "train/loss": "loss",
    "train/response_len_mean": "response length (tokens)", "train/truncation_rate": "truncation rate",
    "train/kl_ref": "KL(pi || pi_init), k3", "train/kl_prev": "KL(pi_t || pi_t+1), k3",
    "train/clip_fraction": "clip fraction", "train/zero_var_frac": "groups with zero reward variance",
}
TIME_KEYS = ["time/generation", "time/grading", "time/old_log_probs", "time/training", "time/weight_sync"]


def read_rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def series(rows, key, x):
    """(xs, ys) for key, averaging rows that share the same x (several optimizer steps per GRPO step)."""
    acc = {}
    for r in rows:
        v = r.get(key)
        if v is not None and x in r and v == v:  # v == v drops NaN
            acc.setdefault(r[x], []).append(float(v))
    xs = sorted(acc)
    return xs, [sum(acc[k]) / len(acc[k]) for k in xs]


def plot_runs(run_dirs, out_dir, x="step"):
    """Write <out_dir>/<metric>.png for every metric any run has, plus time_split.png. Returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(out_dir, exist_ok=True)
    runs = [(os.path.basename(os.path.normpath(d)) or d, read_rows(d)) for d in run_dirs]
    paths = []
    for key, title in METRICS.items():
        curves = [(name, *series(rows, key, x)) for name, rows in runs]
        curves = [c for c in curves if c[1]]
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, xs, ys in curves:
            ax.plot(xs, ys, marker="o" if key.startswith("eval/") else None, markersize=3, label=name)
        ax.set(title=title, xlabel=x, ylabel=key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(_save(fig, out_dir, key.replace("/", "_")))
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, rows) in enumerate(runs):
        for j, key in enumerate(TIME_KEYS):
            xs, ys = series(rows, key, x)
            if xs:
                ax.plot(xs, ys, color=f"C{j}", linestyle=["-", "--", ":", "-."][i % 4],
                        label=f"{key[5:]}" + (f" ({name})" if len(runs) > 1 else ""))
    ax.set(title="time split per GRPO step", xlabel=x, ylabel="seconds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(_save(fig, out_dir, "time_split"))
    plt.close(fig)
    return paths


def _save(fig, out_dir, name):
    path = os.path.join(out_dir, f"{name}.png")
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=100)
    os.replace(path + ".tmp.png", path)  # atomic: a viewer never sees half a PNG
    return path


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="Overlay GRPO runs, one figure per metric.")
    p.add_argument("runs", nargs="+", help="run directories holding metrics.jsonl")
    p.add_argument("--out", default="plots", help="directory for the PNGs")
    p.add_argument("--x", default="step", choices=["step", "opt_step", "time/wall"], help="x axis")
    a = p.parse_args()
    for path in plot_runs(a.runs, a.out, a.x):
        print(path)
