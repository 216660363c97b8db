"""`stoke load`: load on a Triton model, one step or a sweep, with Triton's own latency split beside the client's.

Modes (perf_analyzer's): `--rate R` sends open loop at R requests/s (Poisson or paced; latency counts
from each request's scheduled time); `--concurrency N` keeps N requests in flight (closed loop). Over
gRPC (default) or HTTP. `--sweep-rate LIST` / `--sweep-concurrency LIST` run one step per level and stop
at the first step whose p99 is over `--stop-p99-ms` (default: `--slo-ms`). Every step reads Triton's
statistics extension before and after, so each row has the server's split per request (queue, compute
input / infer / output) beside the client's latency; the difference is the client and network overhead.
`--csv FILE` writes the table; `-o json|yaml` prints it as data.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import re
import sys
from typing import Any

from foundation import validate as check
from foundation.errors import UserError
from foundation.files import atomic_write_text
from foundation.names import check_name, shown
from planner.bounds import MAX_SLO_MS
from stoke.output import add_output_option, emit, output_path
from stoke.table import print_table

#: Columns of a step, in the table, the CSV and the JSON (client figures, then Triton's split).
COLUMNS = (
    "mode",
    "level",
    "throughput_rps",
    "sent",
    "failed",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "mean_ms",
    "server_requests",
    "server_queue_ms",
    "server_compute_input_ms",
    "server_compute_infer_ms",
    "server_compute_output_ms",
    "server_ms",
    "client_overhead_ms",
    "over_slo_pct",
)
#: The table's shorter header of a column where it differs (the level's header is the mode).
TABLE_HEADERS = {
    "throughput_rps": "thru_rps",
    "server_requests": "counted",
    "server_queue_ms": "queue_ms",
    "server_compute_input_ms": "c_input_ms",
    "server_compute_infer_ms": "c_infer_ms",
    "server_compute_output_ms": "c_output_ms",
    "client_overhead_ms": "client_ovh_ms",
    "over_slo_pct": "over_slo",
}
MAX_STEPS = 64
MAX_CONCURRENCY = 1024
#: Bounds of one step. A step keeps every request's latency in memory (a float each), so its length, its
#: rate and the requests they make together are bounded: 10 million floats are a few hundred MB at most.
MAX_SECONDS = 600.0
MAX_RATE_RPS = 100_000.0
MAX_STEP_REQUESTS = 10_000_000
#: Samples per request (Triton's max_batch_size is far below it for any real model).
MAX_BATCH = 4096


def _levels(text: str, flag: str, whole: bool) -> list[float]:
    """`1,2,4` or `LOW:HIGH:STEP` -> the levels, checked (positive, at most MAX_STEPS)."""
    try:
        if ":" in text:
            low, high, step = (float(x) for x in text.split(":"))
            if not (low > 0 and high >= low and step > 0):
                raise ValueError
            count = int(math.floor(min((high - low) / step, MAX_STEPS) + 1e-9)) + 1
            values = [low + i * step for i in range(count)]
        else:
            values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(
            f"{flag} {text!r}: give levels as 1,2,4 or LOW:HIGH:STEP (e.g. 10:100:10), all positive"
        ) from None
    if not values or len(values) > MAX_STEPS or not all(v > 0 and math.isfinite(v) for v in values):
        raise UserError(f"{flag} {text!r}: give 1 to {MAX_STEPS} positive levels")
    if whole and not all(v == int(v) for v in values):
        raise UserError(f"{flag} {text!r}: concurrency levels are whole numbers")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "load",
        help="load a Triton model (rate or concurrency, gRPC or HTTP, one step or a sweep); client latency "
        "beside Triton's queue/compute split",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", required=True, help="HOST:PORT of Triton's gRPC (or, with --protocol http, HTTP) endpoint")
    p.add_argument("--model", required=True)
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="default grpc")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rate", type=float, help="open loop: requests per second")
    mode.add_argument("--concurrency", type=int, help="closed loop: requests kept in flight")
    mode.add_argument("--sweep-rate", metavar="LEVELS", help="one open-loop step per rate: 10,20,40 or 10:100:10")
    mode.add_argument(
        "--sweep-concurrency", metavar="LEVELS", help="one closed-loop step per concurrency: 1,2,4 or 1:8:1"
    )
    p.add_argument("--seconds", type=float, required=True, help="length of each step")
    p.add_argument("--slo-ms", type=float, help="report the share of requests slower than this")
    p.add_argument(
        "--stop-p99-ms",
        type=float,
        metavar="MS",
        help="a sweep stops after the first step whose p99 is over this (default: --slo-ms; none: run every level)",
    )
    p.add_argument("--arrival", choices=("constant", "poisson"), default="poisson", help="open-loop arrivals")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=1, help="samples per request")
    # checked before the sweep: a path that cannot be written lost a whole run's results at the end
    p.add_argument("--csv", metavar="FILE", type=output_path(), help="also write the steps as CSV")
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="export the SLO histogram stoke_request_latency_ms on this port while running (0 = any; gRPC rate only)",
    )
    p.add_argument("--workload", help="workload label of the exported histogram (default: the model)")
    add_output_option(p)
    p.set_defaults(run=cmd_load)


def _step_row(mode: str, level: float, report: Any, split: Any) -> dict[str, Any]:
    server = split.server_ms if split is not None and split.requests else math.nan
    return {
        "mode": mode,
        "level": int(level) if mode == "concurrency" else level,
        "throughput_rps": report.throughput_rps,
        "sent": report.sent,
        "failed": report.failed,
        "p50_ms": report.p50_ms,
        "p95_ms": report.p95_ms,
        "p99_ms": report.p99_ms,
        "mean_ms": report.mean_ms,
        "server_requests": split.requests if split else 0,  # what Triton counted of the step
        "server_queue_ms": split.queue_ms if split else math.nan,
        "server_compute_input_ms": split.compute_input_ms if split else math.nan,
        "server_compute_infer_ms": split.compute_infer_ms if split else math.nan,
        "server_compute_output_ms": split.compute_output_ms if split else math.nan,
        "server_ms": server,
        "client_overhead_ms": report.mean_ms - server if math.isfinite(server) else math.nan,
        "over_slo_pct": None if report.over_slo_share is None else 100.0 * report.over_slo_share,
        "errors": list(report.errors),
    }


def _table_cell(column: str, value: Any) -> Any:
    if column == "level":
        return f"{value:g}"
    if column == "over_slo_pct":  # None: a step that sent nothing
        return None if value is None else f"{value:.2f}%"
    return value


def _json_safe(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _csv_text(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(
            [
                ""
                if row[c] is None or (isinstance(row[c], float) and not math.isfinite(row[c]))
                else (f"{row[c]:.4f}" if isinstance(row[c], float) else row[c])
                for c in COLUMNS
            ]
        )
    return buffer.getvalue()


def cmd_load(args: argparse.Namespace) -> int:
    from agents.loadgen import LoadError, LoadGenerator, TritonClients, run_concurrency, run_rate_blocking, server_split
    from stoke.progress import Progress

    # Triton's endpoint: HOST:PORT (an http:// or https:// in front is dropped, as the HTTP endpoints print it);
    # checked before any connection: gRPC went to port 443 without a port, and 99999 wrapped to another port
    endpoint = re.sub(r"^https?://", "", args.url)
    if "://" in endpoint or "/" in endpoint:
        raise UserError(
            f"--url {shown(args.url)}: give Triton's endpoint as HOST:PORT, without a path or another scheme "
            "(e.g. --url 127.0.0.1:8001)"
        )
    check.address(endpoint, "--url", error=UserError, fix="e.g. --url 127.0.0.1:8001 (Triton's gRPC port)")
    check_name(args.model, "--model", error=UserError)
    if args.workload is not None:
        check_name(args.workload, "--workload", error=UserError)
    check.positive(args.seconds, "--seconds", error=UserError, unit="seconds of load per step", maximum=MAX_SECONDS)
    check.whole(args.seed, "--seed", error=UserError)  # numpy's generator takes no negative seed
    if not 1 <= args.batch <= MAX_BATCH:
        raise UserError(f"--batch must be 1..{MAX_BATCH} samples per request, got {args.batch}")
    for flag, value in (("--slo-ms", args.slo_ms), ("--stop-p99-ms", args.stop_p99_ms)):
        if value is not None:
            check.positive(value, flag, error=UserError, unit="milliseconds", maximum=MAX_SLO_MS)
    if args.rate is not None:
        mode, levels = "rate", [args.rate]
    elif args.concurrency is not None:
        mode, levels = "concurrency", [float(args.concurrency)]
    elif args.sweep_rate is not None:
        mode, levels = "rate", _levels(args.sweep_rate, "--sweep-rate", whole=False)
    else:
        mode, levels = "concurrency", _levels(args.sweep_concurrency, "--sweep-concurrency", whole=True)
    for level in levels:
        if mode == "rate":
            check.positive(level, "--rate", error=UserError, unit="requests per second", maximum=MAX_RATE_RPS)
            if level * args.seconds > MAX_STEP_REQUESTS:
                raise UserError(
                    f"--rate {level:g} for --seconds {args.seconds:g} is {level * args.seconds:,.0f} requests in "
                    f"one step, over {MAX_STEP_REQUESTS:,}; shorten the step (a sweep runs several)"
                )
        elif not 1 <= level <= MAX_CONCURRENCY:
            raise UserError(f"--concurrency must be 1..{MAX_CONCURRENCY}, got {level:g}")
    limit = args.stop_p99_ms if args.stop_p99_ms is not None else args.slo_ms
    if args.metrics_port is not None and (mode != "rate" or args.protocol != "grpc"):
        raise UserError("--metrics-port exports the open-loop gRPC load's histogram; use it with --rate over gRPC")
    exporter = on_latency = None
    if args.metrics_port is not None:
        from agents.latency_metrics import RequestLatencyExporter

        exporter = RequestLatencyExporter([args.slo_ms] if args.slo_ms else [])
        try:
            url = exporter.serve(args.metrics_port)
        except OSError as err:
            raise UserError(
                f"--metrics-port {args.metrics_port}: cannot serve metrics ({err}); pick a free port or 0"
            ) from None
        print(f"request latency histogram (stoke_request_latency_ms) on {url} while the load runs", file=sys.stderr)
        on_latency = exporter.recorder(args.workload or args.model, args.model)
    clients = TritonClients(args.url, args.model, protocol=args.protocol, batch=args.batch)
    rows: list[dict[str, Any]] = []
    stopped = ""
    try:
        clients.prepare()
        with Progress(f"load {args.model} ({mode})", len(levels) * args.seconds, unit=" s", min_interval_s=0.0) as bar:
            for i, level in enumerate(levels):
                before = clients.statistics()
                if mode == "concurrency":
                    report = run_concurrency(clients, int(level), args.seconds, slo_ms=args.slo_ms)
                elif args.protocol == "grpc":
                    with LoadGenerator(args.url, args.model, batch=args.batch, on_latency=on_latency) as gen:
                        report = gen.run(level, args.seconds, arrival=args.arrival, seed=args.seed, slo_ms=args.slo_ms)
                else:
                    report = run_rate_blocking(
                        clients, level, args.seconds, arrival=args.arrival, seed=args.seed, slo_ms=args.slo_ms
                    )
                after = clients.statistics_after(before, report.ok)
                rows.append(_step_row(mode, level, report, server_split(before, after)))
                bar.update(
                    (i + 1) * args.seconds,
                    f"{mode} {level:g}: {report.throughput_rps:,.1f} rps, p99 {report.p99_ms:,.2f} ms",
                )
                if limit is not None and len(levels) > 1 and not report.p99_ms <= limit:
                    stopped = f"stopped at {mode} {level:g}: p99 {report.p99_ms:,.2f} ms is over {limit:g} ms"
                    break
    except LoadError as err:
        port = "HTTP port" if args.protocol == "http" else "gRPC port (its HTTP port needs --protocol http)"
        raise UserError(
            f"--url {args.url} --model {args.model} ({args.protocol}): {err}; check that --url is Triton's {port} "
            f"and that it serves the model (`curl HOST:HTTP_PORT/v2/models/{args.model}/ready`)"
        ) from None
    finally:
        clients.close()
        if exporter is not None:
            exporter.close()
    if args.csv:
        try:
            atomic_write_text(args.csv, _csv_text(rows))
        except OSError as err:
            raise UserError(f"--csv {args.csv}: cannot write ({err.strerror}); pick a writable path") from None
    failed_all = all(r["sent"] and r["failed"] == r["sent"] for r in rows)
    if args.json:
        emit(
            args,
            {
                "protocol": args.protocol,
                "model": args.model,
                "stopped": stopped,
                "steps": [_json_safe(r) for r in rows],
            },
        )
        return 1 if failed_all else 0
    columns = [c for c in COLUMNS[1:] if c != "over_slo_pct" or args.slo_ms]
    print_table(
        [mode if c == "level" else TABLE_HEADERS.get(c, c) for c in columns],
        [[_table_cell(c, r[c]) for c in columns] for r in rows],
    )
    print(
        "client: latency from each request's scheduled (rate) or send (concurrency) time; server: Triton's "
        "statistics per request over the step (queue + compute input/infer/output), over the requests they counted; "
        "client_ovh: mean - server"
    )
    if stopped:
        print(stopped)
    if args.csv:
        print(f"steps written to {args.csv}")
    for r in rows:
        for error in r["errors"]:
            print(f"error ({mode} {r['level']:g}): {error}", file=sys.stderr)
    return 1 if failed_all else 0
