"""Plots for people who would rather look than read (matplotlib, no display needed)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from controller.solver import Plan


def plot_plan(plan: Plan, path: str) -> None:
    """Left: stacked shares per GPU. Right: predicted worst latency (fill + inference) vs SLO per workload."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.35 * len(plan.placements()) + 2)))
    colours = plt.get_cmap("tab20")
    names = sorted({p.name for _, p in plan.placements()})
    colour = {n: colours(i % 20) for i, n in enumerate(names)}
    for index, gpu in enumerate(plan.gpus):
        bottom = 0.0
        for p in gpu.placements:
            left.bar(index, p.share_pct, bottom=bottom, color=colour[p.name], edgecolor="white")
            if p.share_pct >= 8:
                left.text(
                    index, bottom + p.share_pct / 2, f"{p.name}\nb={p.batch}", ha="center", va="center", fontsize=7
                )
            bottom += p.share_pct
    left.axhline(100, color="black", linewidth=0.8)
    left.set_xticks(range(plan.gpu_count), [f"{i}\n{g.gpu_type}" for i, g in enumerate(plan.gpus)], fontsize=7)
    left.set_ylabel("share of GPU (%)")
    left.set_ylim(0, 105)
    left.set_title(f"{plan.strategy}: {plan.gpu_count} GPU(s), ${plan.cost_per_hour:,.2f}/h")

    rows = [(f"{p.name}#{p.replica}" if p.replicas > 1 else p.name, p) for _, p in plan.placements()]
    rows.sort(key=lambda r: r[0])
    y = range(len(rows))
    right.barh(y, [p.queue_delay_ms for _, p in rows], color="#c6dbef", label="batch fill (queue delay)")
    right.barh(
        y,
        [p.predicted_latency_ms for _, p in rows],
        left=[p.queue_delay_ms for _, p in rows],
        color=["#3182bd" if p.meets_slo else "#de2d26" for _, p in rows],
        label="co-located inference",
    )
    right.scatter([p.slo_ms for _, p in rows], list(y), marker="|", s=200, color="black", label="SLO", zorder=3)
    right.set_yticks(list(y), [r[0] for r in rows], fontsize=7)
    right.set_xlabel("ms")
    right.set_title("predicted latency vs SLO")
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
