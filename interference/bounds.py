"""The bounds a profile and a plan share: pure constants, importing nothing.

The plan types (`planner.bounds`), the CLI's parser and the profile reader all name them; none of those may
load numpy to do so, so they live here rather than beside the performance models (`interference.profile`).
"""

#: Largest batch size a profile's domain, a fit and a plan may hold: the solvers' range
#: (`planner.solver.candidates`). A fitted model must hold over batches 1..this (`interference.fit`), and a plan
#: file cannot ask `profile verify` to measure, or Triton to allocate, a batch of a billion.
MAX_BATCH = 32
#: Most device memory one figure may name (MiB): 1 TiB, above any GPU's. Profiles (weights, activations, the
#: per-process context), GPU types and plans (memory per replica) are bounded alike.
MAX_MEMORY_MIB = 1024.0 * 1024.0
#: Most MPS clients a profile may record (48 on Volta and later; 0 = not recorded).
MAX_CLIENTS = 4096
#: Most kernels one inference may launch (ssd launches 93).
MAX_KERNELS = 1_000_000
