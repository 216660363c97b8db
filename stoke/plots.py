"""Plots for people who would rather look than read (matplotlib, no display needed).

`plot_plan` scales with the plan: up to `DETAIL_GPUS` GPUs it draws one page with every
GPU's shares and every replica's predicted p99 against its SLO; a larger plan gets a
summary page (GPU fill, the spread of p99/SLO, the tightest replicas) in the file asked
for, plus detail pages of `DETAIL_GPUS` GPUs each beside it (`NAME-gpus-1.png`, ...).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from planner.solver import Placement, Plan

#: GPUs drawn on one detail page.
DETAIL_GPUS = 16


def plot_plan(plan: Plan, path: str) -> list[str]:
    """Draw `plan` to `path` (and detail pages beside it for large plans); returns the files written."""
    if plan.gpu_count <= DETAIL_GPUS:
        _detail_page(plan, range(plan.gpu_count), path, f"{plan.strategy}: {_headline(plan)}")
        return [path]
    written = [path]
    _summary_page(plan, path)
    target = Path(path)
    pages = math.ceil(plan.gpu_count / DETAIL_GPUS)
    for page in range(pages):
        gpus = range(page * DETAIL_GPUS, min(plan.gpu_count, (page + 1) * DETAIL_GPUS))
        name = str(target.with_name(f"{target.stem}-gpus-{page + 1}{target.suffix or '.png'}"))
        _detail_page(
            plan, gpus, name, f"GPUs {gpus.start}-{gpus.stop - 1} of {plan.gpu_count} (page {page + 1}/{pages})"
        )
        written.append(name)
    return written


def _headline(plan: Plan) -> str:
    return f"{plan.gpu_count} GPU(s), ${plan.cost_per_hour:,.2f}/h, {len(plan.slo_misses)} predicted miss(es)"


def _label(p: Placement) -> str:
    return f"{p.name}#{p.replica}" if p.replicas > 1 else p.name


def _p99_parts(p: Placement) -> tuple[float, float, float]:
    """(inference, batch fill, the rest of the p99: queueing behind earlier batches), ms.

    An unstable replica (no bound on its p99) gets a queueing bar past 1.5x its SLO, so the figure never
    draws it under the SLO line; `_detail_page` labels it."""
    inference = p.predicted_latency_ms
    if not math.isfinite(p.predicted_p99_ms):
        return inference, p.queue_delay_ms, max(0.0, 1.5 * p.slo_ms - inference - p.queue_delay_ms)
    fill = min(p.queue_delay_ms, max(0.0, p.predicted_p99_ms - inference))
    return inference, fill, max(0.0, p.predicted_p99_ms - inference - fill)


def draw_shares(axis: Any, plan: Plan, gpus: range, *, ylabel: str) -> None:
    """Stacked MPS shares of `gpus` on `axis`: a bar per GPU, a colour per workload (also `stoke report`'s)."""
    colours = plt.get_cmap("tab20")
    names = sorted({p.name for i in gpus for p in plan.gpus[i].placements})
    colour = {n: colours(i % 20) for i, n in enumerate(names)}
    for x, index in enumerate(gpus):
        bottom = 0.0
        for p in plan.gpus[index].placements:
            axis.bar(x, p.share_pct, bottom=bottom, color=colour[p.name], edgecolor="white")
            if p.share_pct >= 8:
                axis.text(x, bottom + p.share_pct / 2, f"{p.name}\nb={p.batch}", ha="center", va="center", fontsize=6)
            bottom += p.share_pct
    axis.axhline(100, color="black", linewidth=0.8)
    axis.set_xticks(range(len(gpus)), [f"{i}\n{plan.gpus[i].gpu_type}" for i in gpus], fontsize=7)
    axis.set_ylabel(ylabel)
    axis.set_ylim(0, 105)


def _detail_page(plan: Plan, gpus: range, path: str, title: str) -> None:
    """Left: stacked shares per GPU. Right: each replica's predicted p99 (inference, fill, queueing) vs SLO."""
    rows = [(_label(p), p) for i in gpus for p in plan.gpus[i].placements]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.3 * len(rows) + 2)))
    draw_shares(left, plan, gpus, ylabel="share of GPU (%)")
    left.set_title(title, fontsize=9)

    rows.sort(key=lambda r: r[0])
    y = list(range(len(rows)))
    parts = [_p99_parts(p) for _, p in rows]
    inference = [a for a, _, _ in parts]
    fill = [b for _, b, _ in parts]
    queueing = [c for _, _, c in parts]
    right.barh(
        y, inference, color=["#3182bd" if p.meets_slo else "#de2d26" for _, p in rows], label="co-located inference"
    )
    right.barh(y, fill, left=inference, color="#9ecae1", label="batch fill")
    right.barh(y, queueing, left=[a + b for a, b in zip(inference, fill)], color="#c6dbef", label="queueing (to p99)")
    right.scatter([p.slo_ms for _, p in rows], y, marker="|", s=200, color="black", label="SLO", zorder=3)
    unstable = [
        (row, sum(part)) for row, ((_, p), part) in enumerate(zip(rows, parts)) if not math.isfinite(p.predicted_p99_ms)
    ]
    for row, end in unstable:
        right.text(end, row, " unstable: no bound", va="center", fontsize=6, color="#de2d26")
    if unstable:  # room for the labels
        right.set_xlim(right=1.2 * max(max(map(sum, parts)), max(p.slo_ms for _, p in rows)))
    right.set_yticks(y, [r[0] for r in rows], fontsize=7)
    right.set_xlabel("ms")
    right.set_title("predicted p99 latency vs SLO", fontsize=9)
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _summary_page(plan: Plan, path: str) -> None:
    """A plan too big for one page: how full the GPUs are, how tight the SLOs, which replicas are tightest."""
    placements = [p for _, p in plan.placements()]
    ratios = sorted(p.p99_slo_ratio for p in placements if math.isfinite(p.p99_slo_ratio))
    fig, (fill_ax, slack_ax, tight_ax) = plt.subplots(1, 3, figsize=(16, 5.5))
    fill_ax.hist([g.share_pct for g in plan.gpus], bins=[i * 5 for i in range(21)], color="#3182bd")
    fill_ax.set_xlabel("share of GPU in use (%)")
    fill_ax.set_ylabel("GPUs")
    fill_ax.set_title(f"{plan.strategy}: {_headline(plan)}", fontsize=9)

    if ratios:
        slack_ax.plot(ratios, [(k + 1) / len(ratios) for k in range(len(ratios))], color="#3182bd")
    slack_ax.axvline(1.0, color="#de2d26", linewidth=1, label="SLO")
    slack_ax.set_xlabel("predicted p99 / SLO")
    slack_ax.set_ylabel("share of replicas at or below")
    slack_ax.set_title("slack: near 1 is tight, far below is padded", fontsize=9)
    slack_ax.legend(fontsize=7)

    tightest = sorted(placements, key=lambda p: -p.p99_slo_ratio if math.isfinite(p.p99_slo_ratio) else -math.inf)
    top = tightest[:25][::-1]
    tight_ax.barh(
        range(len(top)),
        [min(p.p99_slo_ratio, 2.0) for p in top],
        color=["#3182bd" if p.meets_slo else "#de2d26" for p in top],
    )
    tight_ax.axvline(1.0, color="black", linewidth=0.8)
    tight_ax.set_yticks(range(len(top)), [_label(p) for p in top], fontsize=7)
    tight_ax.set_xlabel("predicted p99 / SLO")
    tight_ax.set_title(f"the {len(top)} tightest replicas (detail pages follow)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
