"""Training performance models for parameter-server (PS) training. Pure.

Two models (reference: training-model.md), both vectorised over candidate
clusters so a provisioner can build its whole candidate table in one call.

Homogeneous PS model (Cynthia shape), n workers and m PS of one type:

    s        = samples to reach the target loss from the fitted curve
               loss(s) = 1/(beta0*s + beta1) + beta2, scaled by the large-batch
               penalty (1 + kappa*max(0, n*b/b_ref - 1))
    k        = ceil(s / (n*b))                iterations (rounds of n updates)
    t_comp   = b / R_worker
    BSP:  t_comm = 2*S / min(B_worker, m*B_ps/n);  t_iter = max(t_comp + t_comm, t_cpu)
    ASP:  t_comm = 2*S / B_worker; t_psnet = 2*n*S/(m*B_ps)   (the PS links carry
          every push and pull of a round); t_iter = max(t_comp + t_comm, t_psnet, t_cpu)
    t_cpu    = n*S*c_upd / (m*cpus_ps)        (PS CPU: update work of a round
               spread over the PS cores; when it exceeds the rest the
               iteration stretches to it, i.e. by the overload ratio)
    T = k*t_iter,  cost = (n*price_w + m*price_ps) * T / 3600

Heterogeneous asynchronous model (spotDNN shape), workers of several types:

    T_i     = t_comp_i + 2*S/B_wk + 2*g_i*S/B_pcie
    B_wk    = P(n)*B_ps/n + (1-P(n))*B_req  if B_req > B_ps/n else B_req
    P(n)    = min(a1*sqrt(n) + b1, 1)
    T_exp   = 1 / sum_i 1/T_i
    b_w     = sum_i (b_i/T_i) / sum_i (1/T_i)
    R       = sqrt((w_1-1)^2 + w_2^2 + ...),  w_i = v_i / sum v, w_1 the largest
    loss    = (g2*b_w + g3) * sqrt((r_weight*R + g4)*n) / (j + g1) + g5
    j       = ceil(loss^-1(target)),  T = j*T_exp (+ recovery overhead),
    cost    = T * sum_i spot_price_i / 3600

t_comp_i comes from the profiled speed v_i (samples/s of one worker alone,
whose traffic crosses the network at B_req): t_comp_i = b_i/v_i - 2*S/B_req;
the PCIe staging term is added on top, as the published predictor does (this
convention reproduces the published ResNet-110 figures: 1884 s, $1.68).
Units: sizes in MB, bandwidths in MB/s, times in seconds, prices in $/hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from foundation import validate as check
from foundation.errors import InputError

Array = npt.NDArray[np.float64]  # vectorised results (int codes are cast when read)
ArrayLike = npt.ArrayLike  # a scalar or anything numpy broadcasts

#: Bottleneck labels, in the order of the integer codes the vectorised paths return.
BOTTLENECKS = ("worker_compute", "worker_network", "ps_network", "ps_cpu")
WORKER_COMPUTE, WORKER_NETWORK, PS_NETWORK, PS_CPU = range(4)

BOTTLENECK_TEXT = {
    "worker_compute": "worker computation dominates each iteration",
    "worker_network": "each worker's own network link (push/pull) dominates",
    "ps_network": "the parameter servers' network is shared by too many workers",
    "ps_cpu": "the parameter servers' CPUs cannot apply updates fast enough",
}


class TrainingError(InputError):
    """A training spec, plan, profile, curve or model input cannot be used; names the field and the fix."""


def _positive(name: str, value: float) -> float:
    return check.positive(value, name, error=TrainingError)


# --------------------------------------------------------------------------- loss curves


@dataclass(frozen=True)
class LossCurve:
    """Fitted convergence curve loss(s) = 1/(beta0*s + beta1) + beta2, s = samples processed."""

    beta0: float
    beta1: float
    beta2: float

    def __post_init__(self) -> None:
        _positive("beta0", self.beta0)
        if not math.isfinite(self.beta1) or not math.isfinite(self.beta2):
            raise TrainingError("beta1 and beta2 must be finite numbers")

    def loss(self, samples: ArrayLike) -> Array:
        return np.asarray(1.0 / (self.beta0 * np.asarray(samples, dtype=float) + self.beta1) + self.beta2)

    def samples_for(self, target_loss: float) -> float:
        """Samples to reach `target_loss`; inf when the curve never gets there."""
        if target_loss <= self.beta2:
            return math.inf
        return max(0.0, (1.0 / (target_loss - self.beta2) - self.beta1) / self.beta0)


@dataclass(frozen=True)
class SpotLoss:
    """Heterogeneous loss model loss = (g2*b_w + g3)*sqrt((r_weight*R + g4)*n)/(j + g1) + g5.

    `r_weight` = 1 is the published form; the ResNet-110 fixture was fitted
    with the R term set to 1, i.e. r_weight = 0 and g4 = 1.
    """

    g1: float
    g2: float
    g3: float
    g4: float
    g5: float
    r_weight: float = 1.0

    def loss(self, b_w: ArrayLike, r: ArrayLike, n: ArrayLike, j: ArrayLike) -> Array:
        bw_, r_, n_, j_ = (np.asarray(v, dtype=float) for v in (b_w, r, n, j))
        return np.asarray(
            (self.g2 * bw_ + self.g3) * np.sqrt((self.r_weight * r_ + self.g4) * n_) / (j_ + self.g1) + self.g5
        )

    def iterations(self, b_w: ArrayLike, r: ArrayLike, n: ArrayLike, target_loss: float) -> Array:
        """Normalised iterations j to reach `target_loss` (real-valued; may be <= 0 or nan)."""
        bw_, r_, n_ = (np.asarray(v, dtype=float) for v in (b_w, r, n))
        if target_loss <= self.g5:
            return np.full(np.broadcast(bw_, r_, n_).shape, np.inf)
        with np.errstate(invalid="ignore"):
            return np.asarray(
                (self.g2 * bw_ + self.g3) * np.sqrt((self.r_weight * r_ + self.g4) * n_) / (target_loss - self.g5)
                - self.g1
            )


# --------------------------------------------------------------------------- homogeneous PS model


@dataclass(frozen=True)
class PsJob:
    """What the homogeneous model needs to know about the training job."""

    model_mb: float  # S: gradient (= parameter) bytes exchanged per push/pull
    batch_per_worker: int  # b
    curve: LossCurve
    target_loss: float
    sync: str = "bsp"  # "bsp" or "asp"
    update_cpu_s_per_mb: float = 0.0  # c_upd: PS CPU-seconds to apply one MB of gradient
    batch_penalty: float = 0.0  # kappa: extra samples needed per unit of global batch above b_ref
    reference_batch: int = 0  # b_ref: global batch of the profiling run (0 = b)

    def __post_init__(self) -> None:
        _positive("model_mb", self.model_mb)
        _positive("batch_per_worker", self.batch_per_worker)
        if self.sync not in ("bsp", "asp"):
            raise TrainingError(f"sync must be 'bsp' or 'asp', got {self.sync!r}")
        if self.update_cpu_s_per_mb < 0 or self.batch_penalty < 0:
            raise TrainingError("update_cpu_s_per_mb and batch_penalty must be >= 0")


@dataclass(frozen=True)
class PsPrediction:
    """One homogeneous prediction, with its bottleneck explained."""

    workers: int
    ps: int
    iterations: int
    t_comp_s: float
    t_comm_s: float
    t_ps_cpu_s: float
    t_iter_s: float
    time_s: float
    cost: float
    bottleneck: str

    @property
    def explanation(self) -> str:
        return BOTTLENECK_TEXT[self.bottleneck]


def predict_ps(
    job: PsJob,
    worker_speed: ArrayLike,
    worker_bw_mb_s: ArrayLike,
    ps_bw_mb_s: ArrayLike,
    ps_cpus: ArrayLike,
    worker_price: ArrayLike,
    ps_price: ArrayLike,
    n: ArrayLike,
    m: ArrayLike,
) -> dict[str, Array]:
    """Vectorised homogeneous prediction; every argument broadcasts.

    `worker_speed` is R_worker (samples/s of one worker's computation).
    Returns arrays: iterations, t_comp, t_comm, t_cpu, t_iter, time, cost,
    bottleneck (codes into BOTTLENECKS). Unreachable targets give time = inf.
    """
    speed, bw_w, bw_ps, cpus, p_w, p_ps, n_, m_ = np.broadcast_arrays(
        *(
            np.asarray(v, dtype=float)
            for v in (worker_speed, worker_bw_mb_s, ps_bw_mb_s, ps_cpus, worker_price, ps_price, n, m)
        )
    )
    b = float(job.batch_per_worker)
    s_model = job.model_mb
    global_batch = n_ * b
    b_ref = float(job.reference_batch or job.batch_per_worker)
    samples = job.curve.samples_for(job.target_loss) * (
        1.0 + job.batch_penalty * np.maximum(0.0, global_batch / b_ref - 1.0)
    )
    with np.errstate(invalid="ignore"):
        iterations = np.ceil(samples / global_batch)
    t_comp = b / speed
    t_cpu = n_ * s_model * job.update_cpu_s_per_mb / (m_ * cpus)
    ps_share = m_ * bw_ps / n_
    if job.sync == "bsp":
        b_eff = np.minimum(bw_w, ps_share)
        t_comm = 2.0 * s_model / b_eff
        base = t_comp + t_comm
        t_iter = np.maximum(base, t_cpu)
        code = np.where(t_comp >= t_comm, WORKER_COMPUTE, np.where(ps_share < bw_w, PS_NETWORK, WORKER_NETWORK))
        code = np.where(t_cpu > base, PS_CPU, code)
    else:
        t_comm = 2.0 * s_model / bw_w
        t_psnet = 2.0 * n_ * s_model / (m_ * bw_ps)
        base = t_comp + t_comm
        t_iter = np.maximum(np.maximum(base, t_psnet), t_cpu)
        code = np.where(t_comp >= t_comm, WORKER_COMPUTE, WORKER_NETWORK)
        code = np.where(t_psnet > base, PS_NETWORK, code)
        code = np.where((t_cpu > base) & (t_cpu > t_psnet), PS_CPU, code)
        t_comm = np.maximum(t_comm, t_psnet - t_comp)  # the wait a worker sees for its push/pull
    time = iterations * t_iter
    cost = (n_ * p_w + m_ * p_ps) * time / 3600.0
    return {
        "iterations": iterations,
        "t_comp": t_comp,
        "t_comm": t_comm,
        "t_cpu": t_cpu,
        "t_iter": t_iter,
        "time": time,
        "cost": cost,
        "bottleneck": code.astype(int),
    }


def predict_ps_one(
    job: PsJob,
    worker_speed: float,
    worker_bw_mb_s: float,
    ps_bw_mb_s: float,
    ps_cpus: float,
    worker_price: float,
    ps_price: float,
    n: int,
    m: int,
) -> PsPrediction:
    """Scalar form of `predict_ps`."""
    out = predict_ps(job, worker_speed, worker_bw_mb_s, ps_bw_mb_s, ps_cpus, worker_price, ps_price, n, m)
    return PsPrediction(
        workers=int(n),
        ps=int(m),
        iterations=int(out["iterations"]) if np.isfinite(out["iterations"]) else -1,
        t_comp_s=float(out["t_comp"]),
        t_comm_s=float(out["t_comm"]),
        t_ps_cpu_s=float(out["t_cpu"]),
        t_iter_s=float(out["t_iter"]),
        time_s=float(out["time"]),
        cost=float(out["cost"]),
        bottleneck=BOTTLENECKS[int(out["bottleneck"])],
    )


# --------------------------------------------------------------------------- heterogeneous ASP model


@dataclass(frozen=True)
class SpotJob:
    """The job as the heterogeneous model sees it (all bandwidths MB/s, sizes MB)."""

    model_mb: float  # S
    ps_bw_mb_s: float  # B_ps
    required_bw_mb_s: float  # B_req: what one worker uses alone
    pcie_bw_mb_s: float  # B_pcie
    a1: float  # P(n) = min(a1*sqrt(n) + b1, 1)
    b1: float
    loss: SpotLoss
    target_loss: float

    def __post_init__(self) -> None:
        for name in ("model_mb", "ps_bw_mb_s", "required_bw_mb_s", "pcie_bw_mb_s", "a1"):
            _positive(name, getattr(self, name))
        if self.a1 + self.b1 >= 1.0:
            raise TrainingError(
                f"contention fit P(n) = min(a1*sqrt(n) + b1, 1) is already 1 at n = 1 "
                f"(a1 + b1 = {self.a1 + self.b1:g}); refit it so that a1 + b1 < 1"
            )

    def contention(self, n: ArrayLike) -> Array:
        """P(n), the share of the PS bandwidth contention that bites (clipped to [0, 1])."""
        return np.asarray(np.clip(self.a1 * np.sqrt(np.asarray(n, dtype=float)) + self.b1, 0.0, 1.0))

    def max_workers(self) -> int:
        """n_upper = floor(((1 - b1)/a1)^2): the largest cluster the contention fit covers (P < 1)."""
        return max(1, int(math.floor(((1.0 - self.b1) / self.a1) ** 2 - 1e-9)))

    def worker_bandwidth(self, n: ArrayLike) -> Array:
        """B_wk(n) of eq (8)."""
        workers = np.asarray(n, dtype=float)
        fair = self.ps_bw_mb_s / workers
        p = self.contention(workers)
        return np.where(
            self.required_bw_mb_s > fair, p * fair + (1.0 - p) * self.required_bw_mb_s, self.required_bw_mb_s
        )

    def compute_time(self, batch: ArrayLike, speed: ArrayLike) -> Array:
        """t_comp from the profiled speed (see module doc for the convention)."""
        t: Array = (
            np.asarray(batch, dtype=float) / np.asarray(speed, dtype=float)
            - 2.0 * self.model_mb / self.required_bw_mb_s
        )
        if np.any(t <= 0):
            raise TrainingError(
                "profiled speed too high for the model size and B_req: batch/speed must exceed 2*S/B_req"
            )
        return t

    def iteration_times(self, compute_s: ArrayLike, gpus: ArrayLike, n: ArrayLike) -> Array:
        """T_i for each worker type when the cluster has n workers: shape broadcast(n[:, None], types)."""
        b_wk = self.worker_bandwidth(n)[..., None]
        return np.asarray(
            np.asarray(compute_s, float)
            + 2.0 * self.model_mb / b_wk
            + 2.0 * np.asarray(gpus, float) * self.model_mb / self.pcie_bw_mb_s
        )


def per_gpu_batch(memory_gb: ArrayLike, a2: float, b2: float) -> npt.NDArray[np.int_]:
    """Eq (10): per-GPU batch 2^floor(log2(a2*mem + b2))."""
    value = a2 * np.asarray(memory_gb, dtype=float) + b2
    if np.any(value < 1):
        raise TrainingError("a2*memory + b2 must be >= 1 for every GPU")
    batch: npt.NDArray[np.int_] = np.power(2, np.floor(np.log2(value))).astype(int)
    return batch


def evaluate_spot(
    job: SpotJob,
    batch: ArrayLike,
    compute_s: ArrayLike,
    gpus: ArrayLike,
    price: ArrayLike,
    counts: ArrayLike,
    *,
    overhead_s: float = 0.0,
    remaining: float = 1.0,
    by_type: bool = False,
) -> dict[str, Array]:
    """Evaluate many heterogeneous clusters at once.

    `batch`, `compute_s`, `gpus`, `price` are per worker type (length T);
    `counts` is an int array (K, T) of workers per type in each candidate
    (or (T, K) with `by_type=True`, the layout the search builds).
    `remaining` (0..1] scales the iterations still to run (after a
    revocation part of the work is done); `overhead_s` is added to the time.
    Returns arrays of length K: n, b_w, R, j, t_exp, time, cost, bottleneck.
    """
    # Candidates are grouped by size n (T_i depends on n only), so each
    # group's sums are BLAS matrix-vector products over the transposed
    # (types x candidates) table: 10^5 candidates in a few milliseconds.
    table = np.asarray(counts, dtype=float)
    counts_t = table if by_type else np.atleast_2d(table).T  # (T, K)
    batch_, compute_, gpus_, price_ = (np.asarray(v, dtype=float) for v in (batch, compute_s, gpus, price))
    n_raw = counts_t.sum(axis=0)
    order = np.argsort(n_raw, kind="stable")
    grouped = np.ascontiguousarray(counts_t[:, order])
    n_sorted = n_raw[order]
    cuts = np.flatnonzero(np.diff(n_sorted)) + 1
    starts = np.concatenate([[0], cuts]).astype(int)
    ends = np.concatenate([cuts, [len(n_sorted)]]).astype(int)
    t_tab = (
        job.iteration_times(compute_, gpus_, np.maximum(n_sorted[starts], 1.0))
        if len(starts) and len(n_sorted)
        else np.zeros((0, len(batch_)))
    )
    size = len(n_sorted)
    rate_s, speed_s, sq_s, vmax_s = (np.zeros(size) for _ in range(4))
    for g, (lo, hi) in enumerate(zip(starts, ends)):
        if hi <= lo:
            continue
        block = grouped[:, lo:hi]
        inv = 1.0 / t_tab[g]
        v = batch_ * inv
        rate_s[lo:hi] = inv @ block
        speed_s[lo:hi] = v @ block
        sq_s[lo:hi] = (v * v) @ block
        top = vmax_s[lo:hi]
        for t in np.argsort(-v, kind="stable"):
            np.copyto(top, v[t], where=(top == 0.0) & (block[t] > 0))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    rate, total_speed, sq, v_max = (a[inverse] for a in (rate_s, speed_s, sq_s, vmax_s))
    n = n_raw
    safe_n = np.maximum(n, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        b_w = total_speed / rate
        r_sq = sq / (total_speed * total_speed) - 2.0 * v_max / total_speed + 1.0
    r = np.sqrt(np.maximum(r_sq, 0.0))
    j_real = job.loss.iterations(b_w, r, safe_n, job.target_loss)
    j = np.ceil(np.maximum(j_real, 0.0) * remaining - 1e-9)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_exp = 1.0 / rate
        time = j * t_exp + overhead_s
    time = np.where((n > 0) & np.isfinite(j_real) & (j_real > 0), time, np.inf)
    cost = time * (price_ @ counts_t) / 3600.0
    comm = 2.0 * job.model_mb / job.worker_bandwidth(safe_n)
    comp_mean = (compute_ @ counts_t) / safe_n
    contended = job.required_bw_mb_s > job.ps_bw_mb_s / safe_n
    code = np.where(comp_mean >= comm, WORKER_COMPUTE, np.where(contended, PS_NETWORK, WORKER_NETWORK))
    return {
        "n": n,
        "b_w": b_w,
        "R": r,
        "j": j,
        "t_exp": t_exp,
        "time": time,
        "cost": cost,
        "bottleneck": code.astype(int),
    }
