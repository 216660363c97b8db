"""`stoke report`: one self-contained HTML file that shows what a plan is worth.

Everything is inside the file: matplotlib figures as base64 PNG, the style and a small inline script (it
only counts the figures the browser decoded, for the headless check). No CDN, no network: it opens
offline. Sections:

1. the plan: GPUs, cost, one row per replica;
2. GPUs and cost against the alternatives (`planner.solver.alternatives`: one model per GPU, an equal
   MPS split as Kubernetes' device plugin gives, each model's best configuration alone packed by share,
   iGniter's rule packed by share), all planned with the same model;
3. per-GPU share packing;
4. predicted p99 against the SLO per workload (with the plan's upper bound where it has one);
5. with a running controller: observed against predicted p99 over time (its stored observation windows).

matplotlib is imported inside the functions that draw (the CLI imports this module lazily too).
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.solver import Plan
from planner.solver.alternatives import Alternative
from stoke.plan_table import p99_cell

#: Most GPUs the packing figure and most workloads the p99 and observed figures draw: a figure grows with
#: them (the p99 figure of 2,000 workloads was 700 inches tall, past the 2^16 pixels matplotlib draws). Past
#: them a figure shows the first GPUs / the tightest workloads and its title says so; the tables list all.
MAX_FIGURE_GPUS = 64
MAX_FIGURE_WORKLOADS = 60
MAX_OBSERVED_WORKLOADS = 10


@dataclass(frozen=True)
class ObservedPoint:
    """One stored observation window of a replica: when, its observed p99 and the plan's prediction."""

    unix: float
    workload: str
    observed_p99_ms: float
    predicted_p99_ms: float


def _png(fig: Any) -> str:
    """The figure as a data URI (PNG, base64), then closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _pyplot() -> Any:
    from stoke.plots import plt  # matplotlib on the Agg backend, as `stoke plan --plot` draws

    return plt


def alternatives_figure(options: Sequence[Alternative]) -> str:
    plt = _pyplot()
    names = [a.name for a in options]
    gpus = [a.gpus or 0 for a in options]
    costs = [a.cost_per_hour or 0.0 for a in options]
    # the plan (first) in green unless it misses; an alternative that misses in red
    colours = ["#c44" if a.misses else ("#2a7" if k == 0 else "#888") for k, a in enumerate(options)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.6 * len(options) + 1.6))
    for axis, values, label, fmt in ((left, gpus, "GPUs", "{:g}"), (right, costs, "$ per hour", "${:,.2f}")):
        bars = axis.barh(names, values, color=colours)
        axis.invert_yaxis()
        axis.set_xlabel(label)
        for bar, value, option in zip(bars, values, options):
            text = fmt.format(value) if option.plan is not None else "cannot serve"
            if option.misses:
                text += f"  ({len(option.misses)} predicted to miss)"
            axis.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + text, va="center", fontsize=8)
        axis.set_xlim(0, max(values + [1]) * 1.6)
    right.set_yticks([])
    fig.suptitle("GPUs and cost of the same workloads, planned with the same model", fontsize=10)
    return _png(fig)


def packing_figure(plan: Plan) -> str:
    from stoke.plots import draw_shares

    plt = _pyplot()
    gpus = range(min(plan.gpu_count, MAX_FIGURE_GPUS))
    fig, axis = plt.subplots(figsize=(max(5.0, 0.7 * len(gpus) + 2), 4))
    draw_shares(axis, plan, gpus, ylabel="MPS share of the GPU (%)")
    shown = f", GPUs 0-{gpus.stop - 1} of {plan.gpu_count}" if len(gpus) < plan.gpu_count else ""
    axis.set_title(f"per-GPU share packing ({plan.strategy}){shown}", fontsize=10)
    return _png(fig)


def p99_figure(plan: Plan) -> str:
    plt = _pyplot()
    worst: dict[str, Any] = {}
    for _, p in plan.placements():
        if p.name not in worst or p.predicted_p99_ms > worst[p.name].predicted_p99_ms:
            worst[p.name] = p
    rows = sorted(worst.values(), key=lambda p: p.name)
    shown = ""
    if len(rows) > MAX_FIGURE_WORKLOADS:
        tightest = sorted(rows, key=lambda p: -p.p99_slo_ratio if not math.isnan(p.p99_slo_ratio) else math.inf)
        rows = sorted(tightest[:MAX_FIGURE_WORKLOADS], key=lambda p: p.name)
        shown = f"; the {MAX_FIGURE_WORKLOADS} tightest of {len(worst)}"
    fig, axis = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    y = range(len(rows))
    axis.barh(list(y), [p.predicted_p99_ms for p in rows], color="#4a8", label="predicted p99")
    upper = [p.p99_upper_ms for p in rows]  # NaN where the profile has no error bound
    if any(math.isfinite(u) for u in upper):
        axis.scatter(
            [u for u in upper if math.isfinite(u)],
            [i for i, u in zip(y, upper) if math.isfinite(u)],
            marker="|",
            s=200,
            color="#246",
            label="p99 upper bound",
        )
    axis.scatter([p.slo_ms for p in rows], list(y), marker="D", color="#c33", label="SLO", zorder=3)
    axis.set_yticks(list(y), [p.name for p in rows], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("ms")
    axis.legend(fontsize=7, loc="lower right")
    axis.set_title(f"predicted p99 against the SLO per workload (its slowest replica{shown})", fontsize=10)
    return _png(fig)


def _over_prediction(p: ObservedPoint) -> float:
    return p.observed_p99_ms / p.predicted_p99_ms if p.predicted_p99_ms > 0 else math.inf


def observed_figure(points: Sequence[ObservedPoint]) -> str:
    plt = _pyplot()
    fig, axis = plt.subplots(figsize=(10, 4))
    start = min(p.unix for p in points)
    colours = plt.get_cmap("tab10")
    by_workload: dict[str, list[ObservedPoint]] = {}
    for p in sorted(points, key=lambda p: p.unix):
        by_workload.setdefault(p.workload, []).append(p)
    names = sorted(by_workload)
    shown = ""
    if len(names) > MAX_OBSERVED_WORKLOADS:  # the ones observed furthest above their prediction
        names = sorted(
            sorted(names, key=lambda n: -max(_over_prediction(p) for p in by_workload[n]))[:MAX_OBSERVED_WORKLOADS]
        )
        shown = f"; the {MAX_OBSERVED_WORKLOADS} furthest above their prediction of {len(by_workload)} workloads"
    for i, name in enumerate(names):
        mine = by_workload[name]
        t = [(p.unix - start) / 60 for p in mine]
        axis.plot(t, [p.observed_p99_ms for p in mine], "-o", ms=2, color=colours(i % 10), label=f"{name} observed")
        axis.plot(t, [p.predicted_p99_ms for p in mine], "--", color=colours(i % 10), label=f"{name} predicted")
    axis.set_xlabel("minutes since the first window")
    axis.set_ylabel("p99 (ms)")
    axis.legend(fontsize=7, ncol=2)
    axis.set_title(
        f"observed against predicted p99 over time (the controller's observation windows{shown})", fontsize=10
    )
    return _png(fig)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.2em 0.6em; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
img { max-width: 100%; display: block; margin: 0.5em 0 1.5em; }
.miss { color: #b22; font-weight: bold; } .note { color: #555; font-size: 0.85em; }
"""

# Counts the figures the browser decoded (natural size > 0): what the headless check reads back.
_SCRIPT = """
window.addEventListener('load', function () {
  var images = Array.prototype.slice.call(document.images);
  var rendered = images.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute('data-figures', String(images.length));
  document.body.setAttribute('data-rendered', String(rendered.length));
  document.body.setAttribute('data-sizes', rendered.map(function (i) {
    return i.naturalWidth + 'x' + i.naturalHeight; }).join(' '));
});
"""


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], text_columns: Sequence[int] = ()) -> str:
    def cell(i: int, value: Any) -> str:
        if isinstance(value, float):
            value = "-" if not math.isfinite(value) else f"{value:,.2f}"
        klass = ' class="text"' if i in text_columns else ""
        return f"<td{klass}>{html.escape(str(value))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_report(
    plan: Plan,
    options: Sequence[Alternative],
    *,
    source: str,
    observed: Sequence[ObservedPoint] = (),
    observed_note: str = "",
    clock: Any = time.time,
) -> str:
    """The whole HTML document (deterministic but for the timestamp `clock` gives)."""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(clock()))
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>stoke report: {html.escape(source)}</title><style>{_STYLE}</style>",
        f"<script>{_SCRIPT}</script></head><body>",
        f"<h1>stoke report</h1><p class='note'>{html.escape(source)}; {stamp}</p>",
        f"<h2>The plan</h2><p>strategy {html.escape(plan.strategy)}: <b>{plan.gpu_count} GPU(s)</b>, "
        f"<b>${plan.cost_per_hour:,.2f}/hour</b>"
        + (
            f", <span class='miss'>{len(plan.slo_misses)} predicted to miss</span>"
            if plan.slo_misses
            else ", every workload predicted within its SLO"
        )
        + "</p>",
    ]
    rows = [
        [
            i,
            g.gpu_type,
            p.name + (f" {p.replica + 1}/{p.replicas}" if p.replicas > 1 else ""),
            p.model,
            p.slo_ms,
            p.rate_rps,
            p.share_pct,
            p.batch,
            p.queue_delay_ms,
            p99_cell(p.predicted_p99_ms),  # as `stoke plan` shows it: unstable, ? when unknown
            p99_cell(p.p99_upper_ms),
            "ok" if p.meets_slo else "MISS",
        ]
        for i, g in enumerate(plan.gpus)
        for p in g.placements
    ]
    headers = ["gpu", "type", "workload", "model", "slo_ms", "rate_rps", "share_%", "batch", "delay_ms"]
    headers += ["p99_ms", "p99_upper_ms", "slo"]
    parts.append(_table(headers, rows, text_columns=(1, 2, 3, 11)))
    parts.append("<h2>Against the alternatives</h2>")
    parts.append(f"<img alt='GPUs and cost per alternative' src='{alternatives_figure(options)}'>")
    parts.append(
        _table(
            ["way to plan", "GPUs", "$/hour", "predicted misses", "note"],
            [
                [
                    a.name,
                    "-" if a.gpus is None else a.gpus,
                    math.nan if a.cost_per_hour is None else a.cost_per_hour,
                    ", ".join(a.misses) or "none",
                    a.note,
                ]
                for a in options
            ],
            text_columns=(0, 3, 4),
        )
    )
    parts.append(
        "<p class='note'>Every row is planned by the same solver over the same profiles. One model per GPU: "
        "every replica on a whole GPU. Equal MPS split: every GPU cut into N equal slices, one pod per slice "
        "(Kubernetes' device plugin with MPS sharing), N the best the share step allows. Best configuration "
        "alone: each model at the share and batch it needs on an empty GPU (what a per-model sweep finds), "
        "packed by share with no interference check; iGniter's rule alone: the same with iGniter's rule "
        "(stoke plan --strategy ffd). Their predicted misses are the interference they ignore.</p>"
    )
    parts.append("<h2>Per-GPU share packing</h2>")
    parts.append(f"<img alt='share packing per GPU' src='{packing_figure(plan)}'>")
    parts.append("<h2>Predicted p99 against the SLO</h2>")
    parts.append(f"<img alt='predicted p99 against SLO' src='{p99_figure(plan)}'>")
    if observed:
        parts.append("<h2>Observed against predicted p99</h2>")
        parts.append(f"<img alt='observed against predicted p99 over time' src='{observed_figure(observed)}'>")
    elif observed_note:
        parts.append(f"<h2>Observed against predicted p99</h2><p class='note'>{html.escape(observed_note)}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
