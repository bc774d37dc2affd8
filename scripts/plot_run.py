#!/usr/bin/python3
"""Turns an l2l run log (JSONL, one object per optimizer step, written by l2l-eps as
<state_dir>/run.jsonl) into one PNG:
loss curve, tokens/s, and the per-step time breakdown.

Usage: scripts/plot_run.py RUN.jsonl OUT.png

Fields read per line (missing ones are skipped in the plot):
  step (int), loss (float), tokens_per_s (float),
  forward_s, recompute_s, backward_s, wait_layer_s, wait_push_s, update_s (seconds),
  val_loss (float; the job's in-job validation, on the steps it ran: drawn as points
  over the training loss).
"""
import json
import sys

BREAKDOWN = ["forward_s", "recompute_s", "backward_s", "wait_layer_s", "wait_push_s", "update_s"]


def load(path):
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_run: {path}:{lineno}: not JSON ({e})")
            if "step" not in obj:
                sys.exit(f"plot_run: {path}:{lineno}: no 'step' field")
            rows.append(obj)
    if not rows:
        sys.exit(f"plot_run: {path}: no steps logged")
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    rows = load(src)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    ax.plot(steps, [r.get("loss", float("nan")) for r in rows], lw=1.2, label="training")
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", lw=1.2, ms=4, color="tab:red", label="validation")
        ax.legend(fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("training and validation loss" if val else "training loss")
    ax.grid(alpha=0.3)

    ax = axes[1]
    ax.plot(steps, [r.get("tokens_per_s", float("nan")) for r in rows], lw=1.2, color="tab:green")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s")
    ax.set_title("throughput")
    ax.grid(alpha=0.3)

    ax = axes[2]
    present = [k for k in BREAKDOWN if any(k in r for r in rows)]
    bottom = [0.0] * len(rows)
    for k in present:
        vals = [float(r.get(k, 0.0)) for r in rows]
        ax.bar(steps, vals, bottom=bottom, width=1.0, label=k[:-2].replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("per-step time breakdown")
    if present:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")

    fig.tight_layout()
    fig.savefig(dst, dpi=100)
    extra = f", val_loss {val[0][1]:.4f} at step {val[0][0]} -> {val[-1][1]:.4f} at step {val[-1][0]}" if val else ""
    print(f"plot_run: wrote {dst} ({len(rows)} steps{extra})")


if __name__ == "__main__":
    main()
