"""Pure checks of the generated SLO rules, dashboard and Grafana provisioning (no promtool)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from deploy.alerts import (
    BURN_WINDOWS,
    DASHBOARD_FILE,
    GRAFANA_ALERTS_FILE,
    RULES_FILE,
    RULES_TEST_FILE,
    SLI_WINDOWS,
    AlertConfigError,
    SloOptions,
    alert_expr,
    expected_firing,
    format_number,
    grafana_alerting,
    grafana_dashboard,
    le_matcher,
    le_text,
    prometheus_rules,
    render_all,
    rule_tests,
    shared_selectors,
)
from planner.solver.problem import GpuPlan, Placement, Plan, ProblemError, Workload

WORKLOADS = (
    Workload("photo-tagging", "alexnet", 15, 500),
    Workload("thumbnail-filter", "alexnet", 10, 1200),
    Workload("product-search", "resnet50", 40, 400),
    Workload("fine-grained", "resnet50", 12.5, 50),
)


def _plan() -> Plan:
    def place(name: str, model: str, slo: float, share: float, batch: int, replica: int = 0, replicas: int = 1):
        return Placement(
            name=name,
            model=model,
            slo_ms=slo,
            rate_rps=100,
            share_pct=share,
            batch=batch,
            queue_delay_ms=1.0,
            predicted_latency_ms=5.0,
            predicted_throughput_rps=200,
            replica=replica,
            replicas=replicas,
        )

    return Plan(
        strategy="stoke",
        gpus=(
            GpuPlan(
                "V100",
                3.06,
                (place("photo-tagging", "alexnet", 15, 37.5, 4), place("product-search", "resnet50", 40, 50, 8, 0, 2)),
            ),
            GpuPlan("V100", 3.06, (place("product-search", "resnet50", 40, 45, 8, 1, 2),)),
        ),
    )


def test_le_forms_match_triton_and_prometheus3_printing():
    assert le_text(15) == "15" and le_text(15.0) == "15" and le_text(12.5) == "12.5"
    rx = re.compile(le_matcher(15))
    assert rx.fullmatch("15") and rx.fullmatch("15.0")  # Triton 2.51 / Prometheus 3 + Python client
    assert not rx.fullmatch("150") and not rx.fullmatch("15.5") and not rx.fullmatch("1.5")
    rx = re.compile(le_matcher(2.5))
    assert rx.fullmatch("2.5") and not rx.fullmatch("2x5") and not rx.fullmatch("25")
    assert format_number(1 - 0.999) == "0.001" and format_number(14.4) == "14.4" and format_number(6.0) == "6"


def test_recording_rules_cover_every_window_per_workload():
    groups = prometheus_rules(WORKLOADS)["groups"]
    assert len(groups) == 4 * len(WORKLOADS) + 1  # and the controller's own group
    by_name = {g["name"]: g for g in groups}
    for w in WORKLOADS:
        sli = by_name[f"stoke-slo-sli-{w.name}"]["rules"]
        records = [r["record"] for r in sli]
        assert records == [f"slo:sli_error:ratio_rate{x}" for x in SLI_WINDOWS] + ["slo:sli_error:ratio_rate30d"]
        for r in sli[:-1]:
            assert r["labels"] == {"workload": w.name, "model": w.model}
            assert f'workload="{w.name}"' in r["expr"]
            assert f"le=~`{le_matcher(w.slo_ms)}`" in r["expr"]
            assert "stoke_request_latency_ms_count" in r["expr"]
        meta = {r["record"]: r["expr"] for r in by_name[f"stoke-slo-meta-{w.name}"]["rules"]}
        assert meta["slo:objective:ratio"] == "vector(0.999)"
        assert meta["slo:error_budget:ratio"] == "vector(0.001)"
        assert meta["slo:latency_target:ms"] == f"vector({format_number(w.slo_ms)})"
        assert "slo:period_error_budget_remaining:ratio" in meta


def test_alerts_are_multiwindow_multi_burn_rate_pairs():
    w = WORKLOADS[0]
    groups = {g["name"]: g for g in prometheus_rules([w])["groups"]}
    alerts = groups[f"stoke-slo-alerts-{w.name}"]["rules"]
    assert [a["labels"]["severity"] for a in alerts] == ["page", "ticket"]
    assert all(a["labels"]["workload"] == w.name for a in alerts)
    for alert in alerts:
        sev = alert["labels"]["severity"]
        pairs = alert["expr"].split("\nor\n")
        wanted = [(lw, sw, b) for s, lw, sw, b in BURN_WINDOWS if s == sev]
        assert len(pairs) == len(wanted) == 2
        for text, (lw, sw, burn) in zip(pairs, wanted):
            threshold = f"({format_number(burn)} * 0.001)"
            assert f'slo:sli_error:ratio_rate{lw}{{workload="{w.name}"}} > {threshold}' in text
            assert f'and slo:sli_error:ratio_rate{sw}{{workload="{w.name}"}} > {threshold}' in text
    assert "(14.4 * 0.001)" in alerts[0]["expr"] and "(6 * 0.001)" in alerts[0]["expr"]
    assert "(3 * 0.001)" in alerts[1]["expr"] and "(1 * 0.001)" in alerts[1]["expr"]


def test_objective_is_configurable():
    expr = alert_expr(WORKLOADS[0], "page", SloOptions(objective=0.99))
    assert "(14.4 * 0.01)" in expr
    with pytest.raises(AlertConfigError, match="objective"):
        SloOptions(objective=99.9)
    with pytest.raises(AlertConfigError, match="selector"):
        SloOptions(selector='model="{nope}"')
    with pytest.raises(AlertConfigError, match="metric name"):
        SloOptions(histogram="bad-name")


@pytest.mark.parametrize(
    "selector",
    [
        "foo",
        'a="}"',
        "",
        'a="b",',
        'a="b",,c="d"',
        '{a="b"}',
        '{name}="x"',
        'a="\\d"',
        "a='b",  # an unclosed single-quoted value (a closed one is PromQL's too, and accepted)
        'a="x\x00"',
        'a="{model"',
    ],
)
def test_a_selector_that_would_not_be_promql_is_refused(selector):
    """Each was formatted into `metric_bucket{SELECTOR,le=~...}`: invalid PromQL, or Python's format error."""
    for field in ("selector", "triton_selector"):
        with pytest.raises(AlertConfigError, match=f"^{field} .*(label matchers|placeholders)") as caught:
            SloOptions(**{field: selector})
        assert caught.value.field == field and "\x00" not in str(caught.value)


def test_selector_matchers_become_the_test_series_labels():
    """The promtool tests feed series, which carry labels: = and =~ keep their value, != and !~ are left out."""
    options = SloOptions(selector='job = "stoke" ,model=~"{model}",old!="{name}",b!~"x{{2}}\\\\.y",q="a\\"b"')
    [test] = [t for t in rule_tests(WORKLOADS[:1], options)["tests"] if t["name"].startswith("fast")]
    series = {s["series"] for s in test["input_series"]}
    assert 'stoke_request_latency_ms_count{job="stoke",model="alexnet",q="a\\"b"}' in series
    exprs = " ".join(r["expr"] for g in prometheus_rules(WORKLOADS[:1], options)["groups"] for r in g["rules"])
    assert 'old!="photo-tagging",b!~"x{2}\\\\.y"' in exprs


def test_single_quoted_and_raw_selector_values_are_accepted_and_fed_double_quoted():
    """PromQL takes '...' and `...` values too (a selector of them rendered and passed `alerts check` before the
    matcher check refused them); a test series' labels carry them double-quoted."""
    options = SloOptions(selector="job='stoke',model=~`{model}`,q='a\\'b\"c',r=`x\\y`")
    [test] = [t for t in rule_tests(WORKLOADS[:1], options)["tests"] if t["name"].startswith("fast")]
    series = {s["series"] for s in test["input_series"]}
    assert 'stoke_request_latency_ms_count{job="stoke",model="alexnet",q="a\'b\\"c",r="x\\\\y"}' in series, series


def test_expected_firing_follows_the_burn_table():
    assert expected_firing(0.02) == ("page", "ticket")  # 20 x budget
    assert expected_firing(0.002) == ("ticket",)  # 2 x budget
    assert expected_firing(0.0005) == ()
    assert expected_firing(0.5, SloOptions(objective=0.9)) == ("ticket",)  # 14.4 x 10 % > 100 %: no page


def test_bad_workloads_are_refused():
    with pytest.raises(AlertConfigError, match="no workloads"):
        prometheus_rules([])
    with pytest.raises(AlertConfigError, match="unique"):
        prometheus_rules([WORKLOADS[0], WORKLOADS[0]])
    # a name that could not be a label value cannot even be a workload (foundation.names' rule)
    with pytest.raises(ProblemError, match="must be a name"):
        prometheus_rules([Workload('we"ird', "alexnet", 10, 1)])


TRITON_HISTOGRAM = SloOptions(histogram="nv_inference_first_response_histogram_ms", selector='model="{model}"')


def test_shared_selectors_are_reported_and_per_workload_selector_separates_them():
    assert shared_selectors(WORKLOADS) == {}  # default: the serving path labels each workload
    assert shared_selectors(WORKLOADS, TRITON_HISTOGRAM) == {
        'model="alexnet"': ["photo-tagging", "thumbnail-filter"],
        'model="resnet50"': ["product-search", "fine-grained"],
    }
    text = render_all(WORKLOADS, TRITON_HISTOGRAM)[RULES_FILE]
    assert "# NOTE: workloads photo-tagging, thumbnail-filter share the series" in text


def test_rule_tests_expectations_and_shared_series():
    tests = rule_tests(WORKLOADS, TRITON_HISTOGRAM, le_style="float")
    assert tests["rule_files"] == [RULES_FILE]
    names = [t["name"] for t in tests["tests"]]
    assert names == [
        "fast burn: page, ticket fires",
        "slow burn: ticket fires",
        "healthy: nothing fires",
        "controller: a workload pending past 5m pages, a held plan, lost nodes and a refused floor alert",
    ]
    fast = tests["tests"][0]
    series = [s["series"] for s in fast["input_series"]]
    assert len(series) == len(set(series))  # shared model series written once
    assert 'nv_inference_first_response_histogram_ms_bucket{model="alexnet",le="10.0"}' in series
    assert 'nv_inference_first_response_histogram_ms_bucket{model="resnet50",le="12.5"}' in series
    page = next(c for c in fast["alert_rule_test"] if c["alertname"] == "StokeLatencySLOBurnPage")
    assert {a["exp_labels"]["workload"] for a in page["exp_alerts"]} == {w.name for w in WORKLOADS}
    healthy = tests["tests"][2]
    assert all(c["exp_alerts"] == [] for c in healthy["alert_rule_test"])


def _repeated_row(dash: dict) -> list[dict]:
    """The panels of the row repeated per workload (those after it, up to the next row)."""
    panels = dash["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p.get("repeat") == "workload")
    end = next((i for i in range(start + 1, len(panels)) if panels[i]["type"] == "row"), len(panels))
    return panels[start + 1 : end]


def test_dashboard_is_one_template_whatever_the_workloads():
    dash = grafana_dashboard(WORKLOADS)
    assert dash == grafana_dashboard(WORKLOADS[:1])  # the workload set does not change it
    assert dash["uid"] == "stoke-slo" and dash["schemaVersion"] >= 36 and dash["title"]
    assert grafana_dashboard(WORKLOADS, SloOptions(dashboard_uid="team-a_slo"))["uid"] == "team-a_slo"
    with pytest.raises(AlertConfigError, match="dashboard uid 'bad uid!' must be 1-40 characters"):
        SloOptions(dashboard_uid="bad uid!")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    workload = variables["workload"]
    assert workload["type"] == "query" and workload["multi"] and workload["includeAll"]
    assert workload["query"] == "label_values(slo:latency_target:ms, workload)"
    rows = [p for p in dash["panels"] if p["type"] == "row"]
    assert [r.get("repeat") for r in rows] == [None, "workload", None] and rows[1]["title"] == "$workload"
    assert rows[0]["title"] == "Control plane"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)) and all(t["expr"] for t in p.get("targets", []))
    row = _repeated_row(dash)
    assert [p["title"] for p in row] == [
        "latency vs SLO",
        "requests",
        "batch: observed vs planned",
        "error budget left (30d)",
        "burn rate (5m)",
        "planned share (all replicas)",
        "Triton time per request",
        "p99: predicted (plan) vs observed (SLI)",
        "prediction error ratio",
    ]
    exprs = [t["expr"] for p in row for t in p["targets"]]
    assert all(e.endswith('{workload="$workload"}') for e in exprs), exprs
    # Triton's raw series carry only model labels: the dashboard reads the per-workload recorded ones
    assert not re.search(r"(?<!workload:)nv_inference_", json.dumps(dash))


def test_every_series_the_dashboard_reads_is_recorded_or_exported():
    rules = prometheus_rules(WORKLOADS)
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    read = {t["expr"].split("{")[0] for p in _repeated_row(grafana_dashboard(WORKLOADS)) for t in p["targets"]}
    controller_metrics = {
        "stoke_workload_planned_batch",
        "stoke_workload_planned_share_pct",
        "stoke_workload_predicted_p99_ms",
        "stoke_workload_observed_p99_ms",
        "stoke_workload_slo_ms",
        "stoke_prediction_error_ratio",
    }
    assert read - recorded == controller_metrics


def test_dashboard_validates_against_the_grafana_foundation_sdk_models():
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    for dash in (grafana_dashboard(WORKLOADS), grafana_dashboard(WORKLOADS, plan=_plan(), nodes={0: "node-a"})):
        typed = Dashboard.from_json(dash)
        assert json.loads(JSONEncoder(sort_keys=True).encode(typed)) == dash  # nothing unknown, nothing lost


def test_plan_panel_lists_every_placement():
    dash = grafana_dashboard(WORKLOADS, plan=_plan(), nodes={0: "node-a"})
    [plan_panel] = [p for p in dash["panels"] if p["type"] == "text"]
    content = plan_panel["options"]["content"]
    assert "| product-search | 0/2 | node-a | 0 | V100 | 50 | 8 |" in content
    assert "| product-search | 1/2 | gpu-1 | 1 | V100 | 45 | 8 |" in content
    assert "| photo-tagging | 0/1 | node-a | 0 | V100 | 37.5 | 4 |" in content
    assert "fine-grained" not in content  # not placed by this plan
    assert [p for p in grafana_dashboard(WORKLOADS)["panels"] if p["type"] == "text"] == []


def test_grafana_alert_provisioning_structure():
    doc = yaml.safe_load(render_all(WORKLOADS)[GRAFANA_ALERTS_FILE])
    assert doc["apiVersion"] == 1
    [group] = doc["groups"]
    assert set(group) == {"orgId", "name", "folder", "interval", "rules"}
    assert group["orgId"] == 1 and group["folder"] == "stoke" and group["interval"] == "1m"
    rules = group["rules"]
    assert len(rules) == 2 * len(WORKLOADS)
    uids = [r["uid"] for r in rules]
    assert len(set(uids)) == len(uids) and all(re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", u) for u in uids)
    for r in rules:
        assert {"uid", "title", "condition", "data", "noDataState", "execErrState", "for", "labels"} <= set(r)
        refs = [d["refId"] for d in r["data"]]
        assert r["condition"] in refs
        query = r["data"][0]
        assert query["datasourceUid"] == "prometheus" and "slo:sli_error:ratio_rate" in query["model"]["expr"]
        assert query["relativeTimeRange"]["from"] >= 3600
        assert r["data"][1]["model"]["type"] == "threshold" and r["data"][1]["model"]["expression"] == "A"
        assert r["labels"]["severity"] in ("page", "ticket") and r["labels"]["workload"]
    assert grafana_alerting(WORKLOADS, SloOptions(folder="slo", org_id=3))["groups"][0]["orgId"] == 3


def test_render_all_is_deterministic_and_complete():
    a, b = render_all(WORKLOADS, plan=_plan()), render_all(WORKLOADS, plan=_plan())
    assert a == b
    assert set(a) == {RULES_FILE, RULES_TEST_FILE, DASHBOARD_FILE, GRAFANA_ALERTS_FILE}
    assert yaml.safe_load(a[RULES_FILE])["groups"] and yaml.safe_load(a[RULES_TEST_FILE])["tests"]
    json.loads(a[DASHBOARD_FILE])


def test_burn_rates_scale_with_the_period_so_pairs_fire_at_the_same_budget_spent():
    from deploy.alerts import burn_windows

    week = burn_windows(SloOptions(period_days=7))
    assert [round(b, 4) for *_, b in week] == [round(r * 7 / 30, 4) for r in (14.4, 6.0, 3.0, 1.0)]
    assert [b for *_, b in burn_windows(SloOptions())] == [14.4, 6.0, 3.0, 1.0]
    rules = prometheus_rules(WORKLOADS[:1], SloOptions(period_days=7))
    page = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "StokeLatencySLOBurnPage")
    assert "(3.36 * 0.001)" in page["expr"]


def test_triton_series_of_workloads_sharing_a_model_are_kept_apart():
    photo, thumbs = (
        next(
            r
            for g in prometheus_rules([w])["groups"]
            for r in g["rules"]
            if r.get("record") == "workload:nv_inference_request_success:rate5m"
        )
        for w in WORKLOADS[:2]
    )  # both serve alexnet
    assert photo["expr"] == 'sum(rate(nv_inference_request_success{model="alexnet",workload="photo-tagging"}[5m]))'
    assert thumbs["expr"] == 'sum(rate(nv_inference_request_success{model="alexnet",workload="thumbnail-filter"}[5m]))'
    assert photo["labels"] == {"workload": "photo-tagging", "model": "alexnet"}
    custom = prometheus_rules(WORKLOADS[:1], SloOptions(triton_selector='job="triton-{name}"'))
    exprs = " ".join(r["expr"] for g in custom["groups"] for r in g["rules"])
    assert 'nv_inference_count{job="triton-photo-tagging"}' in exprs
    with pytest.raises(AlertConfigError, match="triton_selector"):
        SloOptions(triton_selector='model="{oops}"')


def test_controller_alerts_cover_pending_workloads_held_plans_lost_nodes_and_refused_floors():
    from deploy.alerts import controller_alert_rules, controller_rule_test

    rules = {r["alert"]: r for r in controller_alert_rules(SloOptions(pending_for="90s"))}
    assert set(rules) == {"StokeWorkloadPending", "StokePlanHeld", "StokeNodesLost", "StokeGuardFloorRefused"}
    group = {r["alert"] for r in prometheus_rules(WORKLOADS)["groups"][-1]["rules"]}
    assert set(rules) <= group and "StokeStoreDegraded" in group  # one controller group with the store's alerts
    assert (
        rules["StokeWorkloadPending"]["for"] == "90s"
        and "stoke_workload_pending" in rules["StokeWorkloadPending"]["expr"]
    )
    assert "more than 90s" in rules["StokeWorkloadPending"]["annotations"]["description"]
    assert prometheus_rules(WORKLOADS)["groups"][-1]["name"] == "stoke-controller"
    test = controller_rule_test(SloOptions(pending_for="90s"))
    cases = {(c["alertname"], c["eval_time"]): c["exp_alerts"] for c in test["alert_rule_test"]}
    assert cases[("StokeWorkloadPending", "150s")] == []  # pending for 30 s: not yet
    fired = cases[("StokeWorkloadPending", "330s")]
    assert [a["exp_labels"] for a in fired] == [{"severity": "page", "workload": "starved", "model": "m"}]
    for bad in ("5", "0m", "5 m", "1d"):
        with pytest.raises(AlertConfigError, match="pending_for"):
            SloOptions(pending_for=bad)


def test_the_plan_panel_labels_the_planned_p99_and_the_inference_time():
    text = json.dumps(grafana_dashboard(WORKLOADS, plan=_plan(), nodes={0: "node-a"}))
    assert "planned p99 ms" in text and "inference ms" in text and "predicted worst" not in text
