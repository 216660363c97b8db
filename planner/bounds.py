"""The bounds of one workload, checked wherever a workload enters (workload files, the solver's Workload, the
controller's apply). Pure constants; `controller.limits` names them beside every other bound.
"""

#: Highest request rate of one workload (req/s). Larger services are several workloads; the bound keeps
#: every figure derived from the rate (replicas, queue delays) finite and small.
MAX_RATE_RPS = 1_000_000.0
#: Longest latency SLO (ms): one hour.
MAX_SLO_MS = 3_600_000.0
#: Most replicas one workload may need on a GPU type; a workload needing more is refused on that type.
MAX_REPLICAS = 256
