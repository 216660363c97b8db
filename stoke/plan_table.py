"""The one plan table: `stoke plan` (a local solve) and `stoke plan --remote` (the controller's plan).

A row per placement. The columns that the wire's placement carries come first; a local plan adds its
predicted p99, the share's binding constraint and the SLO verdict. Each keeps its own words for the device
and the two timing columns, as scripts read them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stoke.table import render_table


@dataclass(frozen=True)
class PlanColumns:
    """The header words that differ between the two plans, and whether the predictions are shown."""

    where: str  # where a placement runs: the plan's GPU index, or the node/device it is bound to
    delay: str  # Triton's max queue delay
    infer: str  # one batch's predicted inference
    predictions: bool  # serving_ms, beyond_sli_ms, p99_ms, p99_upper, p99/slo, binding, slo (a local plan only)


LOCAL = PlanColumns(where="gpu", delay="delay_ms", infer="infer_ms", predictions=True)
#: the remote plan's inference column said "pred_ms" beside no p99: it is one batch's inference time (issue 19)
REMOTE = PlanColumns(where="node/device", delay="queue_ms", infer="infer_ms", predictions=False)


def p99_cell(value: float) -> float | str:
    """A predicted p99 (or p99/SLO) as a cell: unbounded queues read "unstable", unknown ones "?"."""
    return value if math.isfinite(value) else ("unstable" if value > 0 else "?")


def plan_table(rows: Iterable[tuple[Any, str, str, Any]], columns: PlanColumns, *, wide: bool = False) -> str:
    """The table of `rows`: (where, GPU type, workload name, placement) each; a placement is a
    `planner.solver.Placement` or the wire's `Placement` (the predictions need the first). `wide` (-o wide)
    adds each replica's predicted throughput and utilisation (rate / throughput), and a local plan's arrivals."""
    headers = [columns.where, "type", "workload", "replica", "model", "slo_ms", "rate_rps", "share_%", "batch"]
    headers += [columns.delay, columns.infer]
    if columns.predictions:
        headers += ["serving_ms", "beyond_sli_ms", "p99_ms", "p99_upper", "p99/slo", "binding", "slo"]
    if wide:
        headers += ["thru_rps", "util"] + (["arrivals"] if columns.predictions else [])
    cells = []
    for where, gpu_type, workload, p in rows:
        row = [where, gpu_type, workload, f"{p.replica + 1}/{p.replicas}" if p.replicas > 1 else "", p.model]
        row += [p.slo_ms, p.rate_rps, p.share_pct, p.batch, p.queue_delay_ms, p.predicted_latency_ms]
        if columns.predictions:
            row += [
                p.serving_p99_ms,
                p.beyond_sli_p99_ms,
                p99_cell(p.predicted_p99_ms),
                p99_cell(p.p99_upper_ms),
                p99_cell(p.p99_slo_ratio),
            ]
            row += [p.binding, "ok" if p.meets_slo else "MISS"]
        if wide:
            throughput = p.predicted_throughput_rps
            row += [throughput, p.rate_rps / throughput if throughput > 0 else None]
            row += [p.arrivals] if columns.predictions else []
        cells.append(row)
    return render_table(headers, cells)
