"""SLO alerting artefacts generated from the workloads: pure functions, no I/O.

From a list of `Workload`s (and optionally the `Plan` that serves them) this
module builds, as plain dicts / text:

* Prometheus recording rules: the SLI error ratio per workload and window,
  metadata (objective, error budget, burn rates, budget remaining), and the
  per-workload series the dashboard reads (`panel_rules`);
* Prometheus alert rules: multi-window multi-burn-rate (Google SRE workbook,
  the scheme Sloth and Pyrra generate), labelled `severity` and `workload`;
* `promtool test rules` unit tests for those rules (fast burn pages, slow burn
  files a ticket, a healthy series stays silent);
* one templated Grafana dashboard (JSON, a row repeated per `$workload`) and
  Grafana alert provisioning (YAML).

SLI (error ratio of a latency SLO). A request is *bad* when it is slower than
the workload's SLO. The latency histogram must have a bucket bound at each
workload's `slo_ms`; then, over a window `w`,

    error_ratio(w) = 1 - sum(rate(H_bucket{SEL, le="SLO"}[w])) / sum(rate(H_count{SEL}[w]))

`H` defaults to `stoke_request_latency_ms`, exported from the serving path
(`agents.latency_metrics`: the load generator, with a bucket at every SLO),
because Triton 2.51 has no per-model histogram (its `model_metrics` arrives in
2.52). On Triton >= 2.52, `nv_inference_first_response_histogram_ms` with
`model_metrics` buckets works too (`SloOptions.histogram`). `SEL` is
`SloOptions.selector` formatted with the workload (default `workload="{name}"`). The `le` bound is matched with a regex
accepting both the shortest form (`15`, what Triton 2.51's prometheus-cpp
prints, verified) and the float form (`15.0`, what Python's client prints and
what Prometheus 3 normalises `le` to), so the rules survive either.

Objective: 99.9 % of requests within the SLO over 30 days (configurable). The
burn-rate table (per the SRE workbook, for a 30-day period):

    severity  long  short  burn   (budget spent when it fires)
    page      1h    5m     14.4   2 %
    page      6h    30m    6      5 %
    ticket    1d    2h     3      10 %
    ticket    3d    6h     1      10 %

For another period the rates scale with period / 30 days, so each pair still
fires at the same share of the budget spent (`burn_windows`). A pair fires
when the long AND the short window both burn faster than the rate; the pairs
of one severity are ORed. No traffic (0/0 = NaN) never fires.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

# The options and file names live in a light module of their own: the CLI's parser reads them.
from deploy.slo_options import (
    _LABEL_VALUE,
    DASHBOARD_FILE,
    DEFAULT_DATASOURCE_UID,
    GRAFANA_ALERTS_FILE,
    RULES_FILE,
    RULES_TEST_FILE,
    AlertConfigError,
    SloOptions,
)
from planner.solver.problem import Plan, Workload

# grafana-foundation-sdk loads inside the dashboard builders: the CLI imports this module to build its parser.
if TYPE_CHECKING:
    from grafana_foundation_sdk.builders import dashboard as gd

#: (severity, long window, short window, burn rate), the SRE workbook's table for 30 days.
BURN_WINDOWS: tuple[tuple[str, str, str, float], ...] = (
    ("page", "1h", "5m", 14.4),
    ("page", "6h", "30m", 6.0),
    ("ticket", "1d", "2h", 3.0),
    ("ticket", "3d", "6h", 1.0),
)
SEVERITIES = ("page", "ticket")


def burn_windows(options: SloOptions) -> tuple[tuple[str, str, str, float], ...]:
    """`BURN_WINDOWS` for the options' period: each pair fires at the same share of the budget spent.

    A burn rate b over a long window L spends b * L / period of the budget, so keeping the
    spent share fixed scales every rate with period / 30 days.
    """
    scale = options.period_days / 30.0
    return tuple((sev, long_w, short_w, burn * scale) for sev, long_w, short_w, burn in BURN_WINDOWS)


#: Every window an SLI is recorded over (short to long).
SLI_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
ALERT_NAMES = {"page": "StokeLatencySLOBurnPage", "ticket": "StokeLatencySLOBurnTicket"}

# --------------------------------------------------------------------------- helpers


def format_number(value: float) -> str:
    """Short text of a number for expressions: 15 -> '15', 0.0010000000000000009 -> '0.001'."""
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.12g}"


def le_text(slo_ms: float) -> str:
    """The `le` bound as Triton 2.51 prints it (shortest round-trip form): 15 -> '15', 2.5 -> '2.5'."""
    value = float(slo_ms)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def le_matcher(slo_ms: float) -> str:
    """Regex matching the `le` label of the bucket at `slo_ms` in every printed form.

    Used inside a PromQL raw (backtick) string, so the backslashes stay as they are.
    Triton 2.51 (prometheus-cpp) prints `15`; Python clients and Prometheus 3
    (which normalises `le` on ingestion) print `15.0`. 2.5 is `2.5` in both.
    """
    text = le_text(slo_ms)
    escaped = re.escape(text)
    return f"{escaped}(\\.0)?" if "." not in text and "e" not in text else escaped


def _check_label_value(value: str, what: str) -> str:
    if not _LABEL_VALUE.match(value):
        raise AlertConfigError(f"{what} {value!r} cannot be a label value (no quotes, backslashes or newlines)")
    return value


def workload_selector(workload: Workload, options: SloOptions) -> str:
    """Label matchers (without braces) of one workload's Triton series."""
    _check_label_value(workload.model, f"workload {workload.name!r}: model")
    return options.selector.format(model=workload.model, name=workload.name)


_FORMATTED_MATCHER = re.compile(
    r"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*(=~|!~|!=|=)[ \t]*"
    r'("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`)[ \t]*,?'
)


def _double_quoted(value: str) -> str:
    """A PromQL string value ("...", '...' or `...`) as a double-quoted one, the form a test series' label takes."""
    if value.startswith('"'):
        return value
    if value.startswith("'"):  # its escapes are PromQL's too, but for \' (a quote) and " (which needs one)
        inner = value[1:-1].replace("\\'", "'").replace('"', '\\"')
    else:  # a raw string: every backslash and quote is literal
        inner = value[1:-1].replace("\\", "\\\\").replace('"', '\\"')
    return f'"{inner}"'


def series_labels(selector: str) -> str:
    """The labels (without braces) of a series the promtool tests feed for a formatted `selector`.

    A test series carries labels, not matchers: `=` and `=~` matchers become labels with their values (an `=~`
    value that is a regex other than itself matches no such series, and `stoke alerts check` says so), and
    `!=` and `!~` ones are left out (a missing label is "", which they match unless their value matches "").
    """
    return ",".join(
        f"{label}={_double_quoted(value)}"
        for label, op, value in _FORMATTED_MATCHER.findall(selector)
        if op in ("=", "=~")
    )


def _ident(workload: Workload) -> dict[str, str]:
    return {"workload": _check_label_value(workload.name, "workload name"), "model": workload.model}


def _wl(workload: Workload) -> str:
    return f'workload="{workload.name}"'


def _uid(*parts: str) -> str:
    """Stable Grafana uid (<= 40 chars, [a-zA-Z0-9_-])."""
    slug = re.sub(r"[^a-zA-Z0-9_-]+", "-", "-".join(parts)).strip("-")[:27]
    digest = hashlib.sha1("\0".join(parts).encode()).hexdigest()[:12]
    return f"{slug}-{digest}"


def _validate(workloads: Sequence[Workload]) -> tuple[Workload, ...]:
    workloads = tuple(workloads)
    if not workloads:
        raise AlertConfigError("no workloads: give at least one workload to alert on")
    names = [w.name for w in workloads]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise AlertConfigError(f"workload names must be unique; repeated: {', '.join(repeated)}")
    for w in workloads:
        _check_label_value(w.name, "workload name")
        _check_label_value(w.model, f"workload {w.name!r}: model")
    return workloads


def shared_selectors(workloads: Sequence[Workload], options: SloOptions = SloOptions()) -> dict[str, list[str]]:
    """Selectors used by more than one workload (their SLIs then measure the same traffic)."""
    by_selector: dict[str, list[str]] = {}
    for w in workloads:
        by_selector.setdefault(workload_selector(w, options), []).append(w.name)
    return {sel: names for sel, names in by_selector.items() if len(names) > 1}


# --------------------------------------------------------------------------- Prometheus rules


def sli_expr(workload: Workload, window: str, options: SloOptions) -> str:
    sel = workload_selector(workload, options)
    h = options.histogram
    good = f"sum(rate({h}_bucket{{{sel},le=~`{le_matcher(workload.slo_ms)}`}}[{window}]))"
    total = f"sum(rate({h}_count{{{sel}}}[{window}]))"
    return f"1 - ({good} / {total})"


def recording_rules(workload: Workload, options: SloOptions = SloOptions()) -> list[dict[str, Any]]:
    """SLI error ratio of `workload` over every window, then its period average."""
    labels = _ident(workload)
    rules = [
        {"record": f"slo:sli_error:ratio_rate{w}", "expr": sli_expr(workload, w, options), "labels": dict(labels)}
        for w in SLI_WINDOWS
    ]
    five = f"slo:sli_error:ratio_rate5m{{{_wl(workload)}}}"
    rules.append(
        {
            "record": f"slo:sli_error:ratio_rate{options.period}",
            "expr": f"sum_over_time({five}[{options.period}]) / count_over_time({five}[{options.period}])",
            "labels": dict(labels),
        }
    )
    return rules


def metadata_rules(workload: Workload, options: SloOptions = SloOptions()) -> list[dict[str, Any]]:
    """Objective, budget, SLO target, planned rate, burn rates and budget remaining of `workload`."""
    labels = _ident(workload)
    wl = _wl(workload)
    budget = f"slo:error_budget:ratio{{{wl}}}"

    def rule(record: str, expr: str) -> dict[str, Any]:
        return {"record": record, "expr": expr, "labels": dict(labels)}

    return [
        rule("slo:objective:ratio", f"vector({format_number(options.objective)})"),
        rule("slo:error_budget:ratio", f"vector({format_number(options.error_budget)})"),
        rule("slo:time_period:days", f"vector({options.period_days})"),
        rule("slo:latency_target:ms", f"vector({format_number(workload.slo_ms)})"),
        rule("slo:target_rate:rps", f"vector({format_number(workload.rate_rps)})"),
        rule("slo:current_burn_rate:ratio", f"slo:sli_error:ratio_rate5m{{{wl}}} / on(workload, model) {budget}"),
        rule(
            "slo:period_burn_rate:ratio",
            f"slo:sli_error:ratio_rate{options.period}{{{wl}}} / on(workload, model) {budget}",
        ),
        rule("slo:period_error_budget_remaining:ratio", f"1 - slo:period_burn_rate:ratio{{{wl}}}"),
    ]


#: Per-workload series the dashboard reads (record name, what it is). Recording them here keeps the
#: dashboard one template over `{workload="$workload"}`, whatever each workload's selectors are.
PANEL_RECORDS = (
    ("slo:request_latency_ms:p99_5m", "p99 request latency from the SLI histogram"),
    ("slo:request_latency_ms:p50_5m", "median request latency from the SLI histogram"),
    ("workload:nv_inference_request_success:rate5m", "requests served by this workload's Triton processes"),
    ("workload:nv_inference_request_failure:rate5m", "requests failed"),
    ("workload:nv_inference_batch_size:mean5m", "mean executed batch"),
    ("workload:nv_inference_queue_ms:mean5m", "mean time a request waits in Triton's queue"),
    ("workload:nv_inference_compute_ms:mean5m", "mean inference time per request"),
)


def triton_selector(workload: Workload, options: SloOptions) -> str:
    """Label matchers (without braces) of one workload's Triton series (`SloOptions.triton_selector`)."""
    return options.triton_selector.format(model=workload.model, name=workload.name)


def panel_rules(workload: Workload, options: SloOptions = SloOptions()) -> list[dict[str, Any]]:
    """The per-workload series of the dashboard (`PANEL_RECORDS`), labelled workload and model.

    Triton labels its series by model only, so two workloads serving one model
    would mix. stoke runs one Triton process per workload replica; the scrape
    gives each process's target a ``workload`` label, and the Triton selector
    (default ``model="{model}",workload="{name}"``) keeps each workload to its own.
    """
    labels = _ident(workload)
    sel, tsel, h = workload_selector(workload, options), triton_selector(workload, options), options.histogram

    def rate(metric: str) -> str:
        return f"sum(rate({metric}{{{tsel}}}[5m]))"

    exprs = [
        f"histogram_quantile(0.99, sum by (le) (rate({h}_bucket{{{sel}}}[5m])))",
        f"histogram_quantile(0.5, sum by (le) (rate({h}_bucket{{{sel}}}[5m])))",
        rate("nv_inference_request_success"),
        rate("nv_inference_request_failure"),
        f"{rate('nv_inference_count')} / {rate('nv_inference_exec_count')}",
        f"{rate('nv_inference_queue_duration_us')} / {rate('nv_inference_request_success')} / 1000",
        f"{rate('nv_inference_compute_infer_duration_us')} / {rate('nv_inference_request_success')} / 1000",
    ]
    return [{"record": record, "expr": expr, "labels": dict(labels)} for (record, _), expr in zip(PANEL_RECORDS, exprs)]


def alert_expr(workload: Workload, severity: str, options: SloOptions = SloOptions()) -> str:
    """Pairs of (long AND short window above burn x budget), ORed, for one severity."""
    wl = _wl(workload)
    parts = []
    for sev, long_w, short_w, burn in burn_windows(options):
        if sev != severity:
            continue
        threshold = f"({format_number(burn)} * {format_number(options.error_budget)})"
        parts.append(
            f"(slo:sli_error:ratio_rate{long_w}{{{wl}}} > {threshold}\n"
            f" and slo:sli_error:ratio_rate{short_w}{{{wl}}} > {threshold})"
        )
    if not parts:
        raise AlertConfigError(f"unknown severity {severity!r}; use one of {', '.join(SEVERITIES)}")
    return "\nor\n".join(parts)


def alert_annotations(workload: Workload, severity: str, options: SloOptions = SloOptions()) -> dict[str, str]:
    pairs = [f"{lw}/{sw} at {format_number(b)}x" for s, lw, sw, b in burn_windows(options) if s == severity]
    objective = format_number(options.objective * 100)
    return {
        "summary": f"{workload.name}: latency SLO error budget burning too fast ({severity})",
        "description": (
            f"Workload {workload.name} (model {workload.model}): more than the allowed share of "
            f"requests is slower than {format_number(workload.slo_ms)} ms; objective {objective}% "
            f"over {options.period}; windows {', '.join(pairs)}."
        ),
    }


def alert_rule(workload: Workload, severity: str, options: SloOptions = SloOptions()) -> dict[str, Any]:
    return {
        "alert": ALERT_NAMES[severity],
        "expr": alert_expr(workload, severity, options),
        "labels": {"severity": severity, **_ident(workload)},
        "annotations": alert_annotations(workload, severity, options),
    }


#: The control plane's own alerts (controller.metrics): (name, expr, for, severity, summary, description).
CONTROLLER_ALERTS: tuple[tuple[str, str, str, str, str, str], ...] = (
    (
        "StokeWorkloadPending",
        "max by (workload, model) (stoke_workload_pending) > 0",
        "{pending_for}",
        "page",
        "{{ $labels.workload }}: pending, not placed on any device",
        "Workload {{ $labels.workload }} (model {{ $labels.model }}) has been pending for more than {pending_for}: "
        "no replica serves it. `stoke status` says why (the plan's reason): add capacity, relax its SLO, or "
        "check the nodes.",
    ),
    (
        "StokePlanHeld",
        "max(stoke_plan_held) > 0",
        "1m",
        "page",
        "stoke holds its plan: most nodes fell silent together",
        "Most nodes stopped heartbeating at once; stoke keeps their workloads where they are instead of "
        "re-planning. Check the network between the controller and the nodes.",
    ),
    (
        "StokeNodesLost",
        'max(stoke_nodes{state="lost"}) > 0',
        "5m",
        "ticket",
        "{{ $value }} node(s) lost",
        "Nodes missed their heartbeats past the timeout; their workloads were re-planned onto the others. "
        "`stoke nodes` lists them.",
    ),
    (
        "StokeGuardFloorRefused",
        "max(stoke_guard_floors_refused) > 0",
        "0s",
        "ticket",
        "the SLO guard asked for a larger share the planner could not give",
        "A replica stayed over its SLO and the share floor it needed would have left another workload "
        "unplaced; `stoke status` names the floor and the reason. Add capacity or relax an SLO.",
    ),
)


def controller_alert_rules(options: SloOptions = SloOptions()) -> list[dict[str, Any]]:
    """The control plane's alert rules: pending workloads, a held plan, lost nodes, refused guard floors."""
    return [
        {
            "alert": name,
            "expr": expr,
            "for": duration.format(pending_for=options.pending_for),
            "labels": {"severity": severity},
            "annotations": {
                "summary": summary,
                "description": description.replace("{pending_for}", options.pending_for),
            },
        }
        for name, expr, duration, severity, summary, description in CONTROLLER_ALERTS
    ]


#: The controller's own alerts (its metrics: `controller.metrics`), one group in every rule file.
CONTROLLER_GROUP = "stoke-controller"


def controller_rules(options: SloOptions = SloOptions()) -> dict[str, Any]:
    """Alerts on the controller itself: its database cannot write (the reason label names the cause), or
    observation windows are paused because the disk is nearly full; and on what it serves
    (`controller_alert_rules`): pending workloads, a held plan, lost nodes, refused guard floors."""
    group: dict[str, Any] = {"name": CONTROLLER_GROUP}
    if options.rule_interval:
        group["interval"] = options.rule_interval
    group["rules"] = [
        {
            "alert": "StokeStoreDegraded",
            "expr": 'max by (instance, reason) (stoke_store_degraded{reason!="observations_paused"}) > 0',
            "for": "1m",
            "labels": {"severity": "page"},
            "annotations": {
                "summary": "stoke controller database cannot write: {{ $labels.reason }}",
                "description": (
                    "The controller on {{ $labels.instance }} cannot write its database ({{ $labels.reason }}): "
                    "applies, token minting and plans fail. disk_full: free space on its filesystem; read_only: "
                    "make it writable; corrupt: stop it and run `stoke controller recover`. `stoke status` "
                    "shows the full error (last_error)."
                ),
            },
        },
        {
            "alert": "StokeStoreObservationsPaused",
            "expr": 'max by (instance) (stoke_store_degraded{reason="observations_paused"}) > 0',
            "for": "10m",
            "labels": {"severity": "ticket"},
            "annotations": {
                "summary": "stoke controller stores no observation windows: its disk is nearly full",
                "description": (
                    "The controller on {{ $labels.instance }} keeps its free space for desired state and drops "
                    "observation windows (the closed loop sees less). Free space on the database's filesystem."
                ),
            },
        },
        *controller_alert_rules(options),
    ]
    return group


def prometheus_rules(workloads: Sequence[Workload], options: SloOptions = SloOptions()) -> dict[str, Any]:
    """The rule file (`groups:`): SLI, metadata, dashboard and alert groups per workload, and the controller's
    own alerts (`controller_rules`)."""
    groups = []
    for w in _validate(workloads):
        for kind, rules in (
            ("sli", recording_rules(w, options)),
            ("meta", metadata_rules(w, options)),
            ("panels", panel_rules(w, options)),
            ("alerts", [alert_rule(w, s, options) for s in SEVERITIES]),
        ):
            group: dict[str, Any] = {"name": f"stoke-slo-{kind}-{w.name}"}
            if options.rule_interval:
                group["interval"] = options.rule_interval
            group["rules"] = rules
            groups.append(group)
    groups.append(controller_rules(options))
    return {"groups": groups}


# --------------------------------------------------------------------------- promtool unit tests

#: (scenario, error ratio as a multiple of the error budget, evaluation time)
TEST_SCENARIOS: tuple[tuple[str, float, str], ...] = (
    ("fast burn", 20.0, "20m"),  # 20 x budget: above every pair's burn rate, pages at once
    ("slow burn", 2.0, "6h10m"),  # 2 x budget: only the 3d/6h pair at 1x (a ticket), once 6h have passed
    ("healthy", 0.5, "6h10m"),  # half the budget: silent
)


def expected_firing(error_ratio: float, options: SloOptions = SloOptions()) -> tuple[str, ...]:
    """Severities that fire for a constant error ratio, once every window has filled."""
    return tuple(
        s
        for s in SEVERITIES
        if any(sev == s and error_ratio > burn * options.error_budget for sev, _, _, burn in burn_windows(options))
    )


def _series_values(per_step: float, steps: int) -> str:
    return f"0+{format_number(per_step)}x{steps}"


def rule_tests(
    workloads: Sequence[Workload],
    options: SloOptions = SloOptions(),
    rules_file: str = RULES_FILE,
    le_style: str = "short",
) -> dict[str, Any]:
    """A `promtool test rules` file for the generated rules.

    Every workload gets 600 requests/min (a sample every 2 minutes) and a constant
    share of slow requests: the fast burn 20 x the error budget (capped at
    100 %), the slow burn 2 x, the healthy series 0.5 x. Which severities fire
    follows from the burn-rate table (`expected_firing`); with the default
    99.9 % objective: page and ticket, ticket only, nothing. `le_style` writes
    the bucket bound as Triton prints it ('short': `15`) or as Python clients
    and Prometheus 3 do ('float': `15.0`).
    """
    if le_style not in ("short", "float"):
        raise AlertConfigError("le_style must be 'short' or 'float'")
    workloads = _validate(workloads)
    step_minutes = 2
    total = 600.0 * step_minutes  # requests per step: 600/min
    steps = (6 * 60 + 20) // step_minutes
    tests = []
    for name, multiple, eval_time in TEST_SCENARIOS:
        ratio = min(1.0, multiple * options.error_budget)
        firing = expected_firing(ratio, options)
        good = total * (1.0 - ratio)
        # Workloads sharing a selector share the series: one bucket per distinct SLO bound, all with
        # the same good count (no request lands between two SLO bounds), so each sees `ratio`.
        series: dict[str, str] = {}
        for w in workloads:
            sel = series_labels(workload_selector(w, options))
            le = le_text(w.slo_ms)
            if le_style == "float" and "." not in le and "e" not in le:
                le += ".0"
            series[f'{options.histogram}_bucket{{{sel},le="{le}"}}'] = _series_values(good, steps)
            series[f'{options.histogram}_bucket{{{sel},le="+Inf"}}'] = _series_values(total, steps)
            series[f"{options.histogram}_count{{{sel}}}"] = _series_values(total, steps)
        cases = []
        for severity in SEVERITIES:
            exp = []
            if severity in firing:
                exp = [
                    {
                        "exp_labels": {"severity": severity, **_ident(w)},
                        "exp_annotations": alert_annotations(w, severity, options),
                    }
                    for w in workloads
                ]
            cases.append({"eval_time": eval_time, "alertname": ALERT_NAMES[severity], "exp_alerts": exp})
        expr_tests = [
            {  # the recorded SLI equals the injected error ratio (to 1e-9)
                "expr": f"abs(slo:sli_error:ratio_rate5m{{{_wl(w)}}} - {format_number(ratio)}) < bool 1e-9",
                "eval_time": eval_time,
                "exp_samples": [
                    {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in _ident(w).items()) + "}", "value": 1}
                ],
            }
            for w in workloads
        ]
        tests.append(
            {
                "name": f"{name}: {', '.join(firing) or 'nothing'} fires",
                "interval": f"{step_minutes}m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": cases,
                "promql_expr_test": expr_tests,
            }
        )
    tests.append(controller_rule_test(options))
    return {"rule_files": [rules_file], "evaluation_interval": f"{step_minutes}m", "tests": tests}


def controller_rule_test(options: SloOptions = SloOptions()) -> dict[str, Any]:
    """A promtool test of the control plane's alerts: a workload pending from minute 2 fires
    StokeWorkloadPending once `pending_for` has passed, not before; a held plan, a lost node and a
    refused floor fire theirs; a workload that is placed stays silent."""
    pending_s = _seconds(options.pending_for)
    start_m, step_s = 2, 60
    steps = start_m + pending_s // step_s + 6
    before = f"{start_m * 60 + max(0, pending_s - 60)}s"  # still within pending_for
    after = f"{start_m * 60 + pending_s + 120}s"
    rules = {r["alert"]: r for r in controller_alert_rules(options)}

    def expect(name: str, labels: dict[str, str], value: str = "1") -> dict[str, Any]:
        annotations = {
            k: v.replace("{{ $labels.workload }}", labels.get("workload", ""))
            .replace("{{ $labels.model }}", labels.get("model", ""))
            .replace("{{ $value }}", value)
            for k, v in rules[name]["annotations"].items()
        }
        return {"exp_labels": {"severity": rules[name]["labels"]["severity"], **labels}, "exp_annotations": annotations}

    pending = {"workload": "starved", "model": "m"}
    series = {
        'stoke_workload_pending{workload="starved",model="m"}': f"0x{start_m - 1} 1x{steps}",
        'stoke_workload_pending{workload="placed",model="m"}': f"0x{steps + start_m}",
        "stoke_plan_held": f"0x{start_m - 1} 1x{steps}",
        'stoke_nodes{state="lost"}': f"0x{start_m - 1} 1x{steps}",
        'stoke_nodes{state="ready"}': f"2x{steps + start_m}",
        "stoke_guard_floors_refused": f"0x{start_m - 1} 1x{steps}",
    }
    return {
        "name": f"controller: a workload pending past {options.pending_for} pages, a held plan, lost nodes and a "
        f"refused floor alert",
        "interval": f"{step_s}s",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "alert_rule_test": [
            {"eval_time": before, "alertname": "StokeWorkloadPending", "exp_alerts": []},
            {
                "eval_time": after,
                "alertname": "StokeWorkloadPending",
                "exp_alerts": [expect("StokeWorkloadPending", pending)],
            },
            {"eval_time": after, "alertname": "StokePlanHeld", "exp_alerts": [expect("StokePlanHeld", {})]},
            {"eval_time": after, "alertname": "StokeNodesLost", "exp_alerts": [expect("StokeNodesLost", {})]},
            {
                "eval_time": after,
                "alertname": "StokeGuardFloorRefused",
                "exp_alerts": [expect("StokeGuardFloorRefused", {})],
            },
        ],
    }


# --------------------------------------------------------------------------- Grafana dashboard


def plan_rows(plan: Plan | None, nodes: Mapping[int, str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per workload: its replicas' GPU index, GPU type, node, share and batch from the plan."""
    rows: dict[str, list[dict[str, Any]]] = {}
    if plan is None:
        return rows
    for gpu, p in plan.placements():
        rows.setdefault(p.name, []).append(
            {
                "gpu": gpu,
                "gpu_type": plan.gpus[gpu].gpu_type,
                "node": (nodes or {}).get(gpu, f"gpu-{gpu}"),
                "share_pct": p.share_pct,
                "batch": p.batch,
                "replica": p.replica,
                "replicas": p.replicas,
                "rate_rps": p.rate_rps,
                "planned_p99_ms": p.predicted_p99_ms,
                "inference_ms": p.predicted_latency_ms,
            }
        )
    return rows


def _plan_markdown(rows: Mapping[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| workload | replica | node | GPU | type | share % | batch | rate rps | planned p99 ms | inference ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, replicas in rows.items():
        for r in replicas:
            lines.append(
                f"| {name} | {r['replica']}/{r['replicas']} | {r['node']} | {r['gpu']} | {r['gpu_type']} | "
                f"{format_number(round(r['share_pct'], 2))} | {r['batch']} | "
                f"{format_number(round(r['rate_rps'], 2))} | "
                f"{_p99_text(r['planned_p99_ms'])} | {format_number(round(r['inference_ms'], 3))} |"
            )
    return "\n".join(lines)


def _p99_text(value: float) -> str:
    if value != value:  # NaN: a plan from before p99s were predicted
        return "-"
    return "unstable" if value == float("inf") else format_number(round(value, 3))


WORKLOAD_VARIABLE = "workload"


class _PanelKit:
    """What every panel of the dashboard shares: the data source and the next panel id."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self._ids = iter(range(1, 1000))

    def next_id(self) -> int:
        return next(self._ids)

    def series(self, panel: Any, *targets: tuple[str, str]) -> Any:
        from grafana_foundation_sdk.builders import prometheus

        for i, (expr, legend) in enumerate(targets):
            panel = panel.with_target(
                prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).datasource(self.ds)
            )
        return panel.datasource(self.ds).id(self.next_id())

    @staticmethod
    def steps(*pairs: tuple[float | None, str]) -> gd.ThresholdsConfig:
        from grafana_foundation_sdk.builders import dashboard as gd
        from grafana_foundation_sdk.models import dashboard as dm

        return (
            gd.ThresholdsConfig()
            .mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=v, color=c) for v, c in pairs])
        )


def grafana_dashboard(
    workloads: Sequence[Workload],
    options: SloOptions = SloOptions(),
    plan: Plan | None = None,
    nodes: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """One templated dashboard: a `$workload` variable and a row repeated per selected workload.

    The row's panels read only per-workload series (`PANEL_RECORDS`, the SLO
    metadata rules and the controller's ``stoke_workload_*``) selected by
    ``workload="$workload"``, so the dashboard is the same whatever the
    workloads are: adding one needs new rules, not a new dashboard, and its
    uid (`SloOptions.dashboard_uid`) never changes. With a plan, a text panel
    lists every placement. Built with grafana-foundation-sdk's typed builders.
    """
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.builders import text as text_panel
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models.text import TextMode

    _validate(workloads)
    kit = _PanelKit(dm.DataSourceRef(type_val="prometheus", uid="${datasource}"))
    board = _dashboard_shell(options, kit.ds)
    if plan is not None:
        board = board.with_panel(
            text_panel.Panel()
            .title("Plan: placement, share and batch of every replica")
            .mode(TextMode.MARKDOWN)
            .content(_plan_markdown(plan_rows(plan, nodes)))
            .height(min(16, 3 + len(plan.placements())))
            .span(24)
            .id(kit.next_id())
        )
    board = board.with_row(gd.Row("Control plane").id(kit.next_id()))
    for panel in _controller_panels(kit):
        board = board.with_panel(panel)
    panels = _workload_panels(kit, options)  # built before the row: the panel ids keep their order
    board = board.with_row(gd.Row(f"${WORKLOAD_VARIABLE}").repeat(WORKLOAD_VARIABLE).id(kit.next_id()))
    for panel in panels:
        board = board.with_panel(panel)
    board = board.with_row(gd.Row("Devices (stoke agent exporter)").id(kit.next_id()))
    for panel in _device_panels(kit):
        board = board.with_panel(panel)
    return json.loads(JSONEncoder(sort_keys=True).encode(board.build()))


def _dashboard_shell(options: SloOptions, ds: Any) -> Any:
    """The dashboard without panels: title, uid, refresh, and the data source and workload variables."""
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.models import dashboard as dm

    return (
        gd.Dashboard("stoke: inference SLOs")
        .uid(options.dashboard_uid)
        .tags(["stoke", "slo", "triton"])
        .timezone("utc")
        .editable()
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(
            gd.DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
            .current(dm.VariableOption(text=options.datasource_uid, value=options.datasource_uid))
        )
        .with_variable(
            gd.QueryVariable(WORKLOAD_VARIABLE)
            .label("Workload")
            .datasource(ds)
            .query(f"label_values(slo:latency_target:ms, {WORKLOAD_VARIABLE})")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
        )
    )


def _workload_panels(kit: _PanelKit, options: SloOptions) -> list[Any]:
    """The row repeated per selected workload, laid out in two lines of equal height."""
    from grafana_foundation_sdk.builders import stat, timeseries

    wl = f'{WORKLOAD_VARIABLE}="${WORKLOAD_VARIABLE}"'
    series, steps = kit.series, kit.steps
    return [
        series(
            timeseries.Panel().fill_opacity(10).title("latency vs SLO").unit("ms").height(8).span(8),
            (f"slo:request_latency_ms:p99_5m{{{wl}}}", "p99"),
            (f"slo:request_latency_ms:p50_5m{{{wl}}}", "p50"),
            (f"slo:latency_target:ms{{{wl}}}", "SLO"),
        ),
        series(
            timeseries.Panel().fill_opacity(10).title("requests").unit("reqps").height(8).span(8),
            (f"workload:nv_inference_request_success:rate5m{{{wl}}}", "served (Triton)"),
            (f"workload:nv_inference_request_failure:rate5m{{{wl}}}", "failed (Triton)"),
            (f"slo:target_rate:rps{{{wl}}}", "planned"),
        ),
        series(
            timeseries.Panel().fill_opacity(10).title("batch: observed vs planned").height(8).span(8),
            (f"workload:nv_inference_batch_size:mean5m{{{wl}}}", "observed mean batch"),
            (f"stoke_workload_planned_batch{{{wl}}}", "planned batch"),
        ),
        series(
            stat.Panel()
            .title(f"error budget left ({options.period})")
            .unit("percentunit")
            .height(6)
            .span(4)
            .thresholds(steps((None, "red"), (0.25, "orange"), (0.5, "green"))),
            (f"slo:period_error_budget_remaining:ratio{{{wl}}}", "remaining"),
        ),
        series(
            stat.Panel()
            .title("burn rate (5m)")
            .height(6)
            .span(4)
            .thresholds(steps((None, "green"), (1.0, "orange"), (6.0, "red"))),
            (f"slo:current_burn_rate:ratio{{{wl}}}", "burn"),
        ),
        series(
            stat.Panel().title("planned share (all replicas)").unit("percent").height(6).span(4),
            (f"stoke_workload_planned_share_pct{{{wl}}}", "share"),
        ),
        series(
            timeseries.Panel().fill_opacity(10).title("Triton time per request").unit("ms").height(6).span(12),
            (f"workload:nv_inference_queue_ms:mean5m{{{wl}}}", "queue"),
            (f"workload:nv_inference_compute_ms:mean5m{{{wl}}}", "compute"),
        ),
        series(
            timeseries.Panel()
            .fill_opacity(10)
            .title("p99: predicted (plan) vs observed (SLI)")
            .unit("ms")
            .height(6)
            .span(12),
            (f"stoke_workload_predicted_p99_ms{{{wl}}}", "predicted p99 (plan, end to end)"),
            (f"stoke_workload_observed_p99_ms{{{wl}}}", "observed p99 (SLI, worst replica)"),
            (f"stoke_workload_slo_ms{{{wl}}}", "SLO"),
        ),
        series(
            timeseries.Panel().fill_opacity(10).title("prediction error ratio").height(6).span(12),
            (
                f"stoke_workload_observed_p99_ms{{{wl}}} / stoke_workload_predicted_p99_ms{{{wl}}}",
                "p99 observed / predicted",
            ),
            (f"stoke_prediction_error_ratio{{{wl}}}", "inference time observed / predicted"),
        ),
    ]


def _controller_panels(kit: _PanelKit) -> list[Any]:
    """The control plane's row: pending workloads, a held plan, lost nodes, refused guard floors."""
    from grafana_foundation_sdk.builders import stat

    steps = kit.steps
    return [
        kit.series(
            stat.Panel().title(title).height(4).span(6).thresholds(steps((None, "green"), (1.0, "red"))),
            (expr, legend),
        )
        for title, expr, legend in (
            ("pending workloads", "sum(stoke_workload_pending)", "pending"),
            ("plan held (most nodes silent)", "max(stoke_plan_held)", "held"),
            ("lost nodes", 'max(stoke_nodes{state="lost"})', "lost"),
            ("guard floors refused", "max(stoke_guard_floors_refused)", "refused"),
        )
    ]


def _device_panels(kit: _PanelKit) -> list[Any]:
    """The devices row: what the agents' exporter reports per device."""
    from grafana_foundation_sdk.builders import timeseries

    panels = [
        kit.series(
            timeseries.Panel().fill_opacity(10).title(title).unit(unit).height(8).span(6),
            (metric, "{{instance}} {{kind}}{{device}}"),
        )
        for title, metric, unit in (
            ("device utilisation", "stoke_device_utilization_ratio", "percentunit"),
            ("SM clock", "stoke_device_sm_clock_hertz", "hertz"),
            ("power", "stoke_device_power_watts", "watt"),
            ("memory used", "stoke_device_memory_used_bytes", "bytes"),
        )
    ]
    panels.append(
        kit.series(
            timeseries.Panel().fill_opacity(10).title("throttle reasons active").height(6).span(12),
            ("stoke_device_throttle_reason == 1", "{{instance}} gpu{{device}} {{reason}}"),
        )
    )
    panels.append(
        kit.series(
            timeseries.Panel().fill_opacity(10).title("GPU processes (compute + MPS)").height(6).span(12),
            ("stoke_device_processes", "{{instance}} gpu{{device}} {{type}}"),
        )
    )
    return panels


# --------------------------------------------------------------------------- Grafana alert provisioning

_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(window: str) -> int:
    return int(window[:-1]) * _DURATION_SECONDS[window[-1]]


def grafana_alert_rule(workload: Workload, severity: str, options: SloOptions = SloOptions()) -> dict[str, Any]:
    """One Grafana-managed rule evaluating the same burn-rate expression (A) with a threshold (C)."""
    longest = max(_seconds(lw) for s, lw, _, _ in BURN_WINDOWS if s == severity)
    return {
        "uid": _uid("stoke", severity, workload.name),
        "title": f"{workload.name}: latency SLO burn ({severity})",
        "condition": "C",
        "data": [
            {
                "refId": "A",
                "relativeTimeRange": {"from": longest, "to": 0},
                "datasourceUid": options.datasource_uid,
                "model": {
                    "refId": "A",
                    "expr": alert_expr(workload, severity, options),
                    "instant": True,
                    "intervalMs": 1000,
                    "maxDataPoints": 43200,
                },
            },
            {
                "refId": "C",
                "relativeTimeRange": {"from": 0, "to": 0},
                "datasourceUid": "__expr__",
                "model": {
                    "refId": "C",
                    "type": "threshold",
                    "expression": "A",
                    "datasource": {"type": "__expr__", "uid": "__expr__"},
                    "conditions": [{"evaluator": {"type": "gt", "params": [0]}}],
                },
            },
        ],
        "noDataState": "OK",
        "execErrState": "Error",
        "for": "0s",
        "isPaused": False,
        "labels": {"severity": severity, **_ident(workload)},
        "annotations": alert_annotations(workload, severity, options),
    }


def grafana_alerting(workloads: Sequence[Workload], options: SloOptions = SloOptions()) -> dict[str, Any]:
    """Grafana alert provisioning file: apiVersion 1, one group with every workload's rules.

    The rules read the `slo:sli_error:*` series, so the Prometheus recording
    rules must be loaded; Grafana only evaluates the alert expressions.
    """
    workloads = _validate(workloads)
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": options.org_id,
                "name": "stoke-slo",
                "folder": options.folder,
                "interval": "1m",
                "rules": [grafana_alert_rule(w, s, options) for w in workloads for s in SEVERITIES],
            }
        ],
    }


# --------------------------------------------------------------------------- all files


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (PromQL) as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def _yaml(data: Any, header: str) -> str:
    return header + yaml.dump(
        data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True
    )


def render_all(
    workloads: Sequence[Workload],
    options: SloOptions = SloOptions(),
    plan: Plan | None = None,
    nodes: Mapping[int, str] | None = None,
) -> dict[str, str]:
    """Every artefact as file name -> text (deterministic; the caller writes them)."""
    workloads = _validate(workloads)
    shared = shared_selectors(workloads, options)
    note = ""
    if shared:
        note = "".join(
            f"# NOTE: workloads {', '.join(n)} share the series {{{s}}}: their SLIs measure the same "
            f"traffic. Give each workload its own series (selector option).\n"
            for s, n in shared.items()
        )
    header = (
        f"# Generated by `stoke alerts render`; do not edit. Objective {format_number(options.objective * 100)}% "
        f"of requests under each workload's SLO over {options.period};\n# SLI histogram {options.histogram}.\n" + note
    )
    files = {
        RULES_FILE: _yaml(prometheus_rules(workloads, options), header),
        DASHBOARD_FILE: json.dumps(grafana_dashboard(workloads, options, plan, nodes), indent=2) + "\n",
        GRAFANA_ALERTS_FILE: _yaml(
            grafana_alerting(workloads, options),
            header
            + f"# The rules query the Grafana data source with uid {options.datasource_uid!r}"
            + (" (the default)" if options.datasource_uid == DEFAULT_DATASOURCE_UID else "")
            + ": it must be your Prometheus data source's uid\n# (Grafana: Connections > Data sources, the last "
            "part of its URL); render with --datasource-uid UID for another.\n",
        ),
    }
    files[RULES_TEST_FILE] = _yaml(rule_tests(workloads, options), header)
    return files


def summary_rows(workloads: Iterable[Workload], options: SloOptions = SloOptions()) -> list[dict[str, Any]]:
    """One row per workload for a human table: SLO, objective and the page/ticket thresholds."""
    out = []
    for w in workloads:
        out.append(
            {
                "workload": w.name,
                "model": w.model,
                "slo_ms": w.slo_ms,
                "objective_pct": options.objective * 100,
                "page_error_ratio": max(b for s, _, _, b in burn_windows(options) if s == "page")
                * options.error_budget,
                "ticket_error_ratio": min(b for s, _, _, b in burn_windows(options) if s == "ticket")
                * options.error_budget,
                "selector": workload_selector(w, options),
            }
        )
    return out
