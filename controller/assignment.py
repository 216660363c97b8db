"""What a node is asked to run: the plan, cut per node. Plain data.

The controller turns a `Plan` into `ModelAssignment`s per node; the agent on
that node hands them to its Triton fleet (`agents.triton`), which makes the
node serve exactly them (idempotently).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelAssignment:
    """One model to serve on one device of a node, with its share and batching."""

    workload: str          # workload name; with `replica` the unique key of the assignment
    model: str             # model name in the model repository
    device: int            # GPU index on a GPU node; 0 on a CPU node
    share_pct: float       # MPS active-thread % on a GPU node; % of the CPU cores on a CPU node
    batch: int             # max_batch_size / preferred batch
    queue_delay_ms: float  # dynamic batching max queue delay
    slo_ms: float
    rate_rps: float
    replica: int = 0

    @property
    def key(self) -> str:
        return f"{self.workload}#{self.replica}"
