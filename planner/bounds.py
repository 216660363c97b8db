"""The bounds of one workload, checked wherever a workload enters (workload files, the solver's Workload, the
controller's apply). Pure constants; `controller.limits` names them beside every other bound. The largest batch
a plan may name and the most device memory (MiB) one replica may are the bounds profiles have too
(`interference.bounds`).
"""

from interference.bounds import MAX_BATCH as MAX_BATCH
from interference.bounds import MAX_MEMORY_MIB as MAX_MEMORY_MIB

#: Highest request rate of one workload (req/s). Larger services are several workloads; the bound keeps
#: every figure derived from the rate (replicas, queue delays) finite and small.
MAX_RATE_RPS = 1_000_000.0
#: Longest latency SLO (ms): one hour.
MAX_SLO_MS = 3_600_000.0
#: Most replicas one workload may need on a GPU type; a workload needing more is refused on that type.
MAX_REPLICAS = 256
#: Highest price of one GPU per hour: far above any cloud's, low enough that a plan's cost stays a finite,
#: printable number (a price of 1e308 made the cost of two GPUs infinite, and `--json` wrote `Infinity`).
MAX_PRICE_PER_HOUR = 100_000.0
#: Most GPUs of one type a file may allow (`max_count`): a bound, not a plan (fleet scale is about 10,000).
MAX_GPU_COUNT = 1_000_000
