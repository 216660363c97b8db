"""The messages agents, client and service exchange: replica keys, names, structured errors."""

from __future__ import annotations

import math

import pytest

from controller import limits
from controller.api import convert
from controller.messages import (
    AssignmentError,
    HeartbeatAnswer,
    HeartbeatReport,
    InvalidArgument,
    MeasuredPoint,
    MeasureRequest,
    ModelAssignment,
    Replica,
    check_name,
)


def test_replica_key_round_trips_and_orders():
    r = Replica("web-a", 2)
    assert str(r) == "web-a#2" and Replica.parse("web-a#2") == r
    assert sorted([Replica("b", 0), Replica("a", 10), Replica("a", 2)]) == [
        Replica("a", 2),
        Replica("a", 10),
        Replica("b", 0),
    ]
    assert ModelAssignment("web-a", "m", 0, 50.0, 1, 0.0, 10.0, 1.0, replica=2).key == "web-a#2"
    with pytest.raises(ValueError, match="not a replica key"):
        Replica.parse("web-a")


@pytest.mark.parametrize("value", ["", "  ", "a#b", "a:b", "a b", "x" * 129, 7, None])
def test_names_that_would_break_a_key_are_refused_naming_the_field(value):
    with pytest.raises(InvalidArgument) as err:
        check_name(value, "workloads[3].name")
    assert err.value.field == "workloads[3].name" and str(err.value).startswith("workloads[3].name: ")


def test_assignment_errors_travel_structured():
    report = HeartbeatReport("n1", errors=(AssignmentError("a#0", "start failed: port in use: 8001"),))
    back = convert.report_from_pb(convert.report_to_pb(report))
    assert back == report and back.errors[0].message == "start failed: port in use: 8001"
    assert str(back.errors[0]) == "a#0: start failed: port in use: 8001"


def test_measure_requests_outside_the_bounds_are_refused_naming_the_field():
    """The agent's check of what a controller asks it to measure (verify before serving)."""
    good = MeasureRequest("mlp_small", 0, 50.0, (1, 2), 20)
    assert limits.measure_request_problems([good]) == []
    for bad, field in (
        (MeasureRequest("../x", 0, 50.0, (1,), 20), "measure[0].model"),
        (MeasureRequest("mlp_small", 99, 50.0, (1,), 20), "measure[0].device"),
        (MeasureRequest("mlp_small", 0, math.inf, (1,), 20), "measure[0].share_pct"),
        (MeasureRequest("mlp_small", 0, 50.0, (), 20), "measure[0].batches"),
        (MeasureRequest("mlp_small", 0, 50.0, (0,), 20), "measure[0].batches"),
        (MeasureRequest("mlp_small", 0, 50.0, (2, 2), 20), "measure[0].batches"),
        (MeasureRequest("mlp_small", 0, 50.0, (1,), 10**9), "measure[0].requests"),
    ):
        problems = limits.measure_request_problems([bad])
        assert len(problems) == 1 and field in problems[0], problems
    assert "appears twice" in limits.measure_request_problems([good, good])[0]
    assert "more than" in limits.measure_request_problems([good] * (limits.MAX_MEASURE_REQUESTS + 1))[0]


def test_measured_points_outside_the_bounds_are_refused_naming_the_field():
    """The controller's check of what a node reports it measured."""
    limits.check_report(HeartbeatReport("n", measured=(MeasuredPoint("m", 0, 50.0, 2, 1.5),)))
    limits.check_report(HeartbeatReport("n", measured=(MeasuredPoint("m", 0, 50.0, 2, 0.0, "device lost"),)))
    for point, field in (
        (MeasuredPoint("m", 0, 50.0, 1, math.nan), "measured[0].active_ms"),
        (MeasuredPoint("m", 0, 50.0, 1, 0.0), "measured[0].active_ms"),
        (MeasuredPoint("m", 0, 50.0, 1, 2e6), "measured[0].active_ms"),
        (MeasuredPoint("m", 0, 50.0, 1, 1.0, "failed"), "measured[0].active_ms"),
        (MeasuredPoint("a/b", 0, 50.0, 1, 1.0), "measured[0].model"),
        (MeasuredPoint("m", -1, 50.0, 1, 1.0), "measured[0].device"),
        (MeasuredPoint("m", 0, 0.0, 1, 1.0), "measured[0].share_pct"),
        (MeasuredPoint("m", 0, 50.0, 5000, 1.0), "measured[0].batch"),
        (MeasuredPoint("m", 0, 50.0, 1, 0.0, "x" * 5000), "measured[0].error"),
    ):
        with pytest.raises(InvalidArgument) as err:
            limits.check_report(HeartbeatReport("n", measured=(point,)))
        assert err.value.field == field, (point, err.value)


def test_measure_requests_and_results_travel_through_the_wire_types():
    answer = HeartbeatAnswer(True, 3, (), 1.0, measure=(MeasureRequest("m", 1, 12.5, (1, 2, 3), 30),))
    assert convert.answer_from_pb(convert.answer_to_pb(answer)) == answer
    report = HeartbeatReport(
        "n", measured=(MeasuredPoint("m", 1, 12.5, 2, 3.25), MeasuredPoint("m", 1, 12.5, 3, 0.0, "x"))
    )
    assert convert.report_from_pb(convert.report_to_pb(report)) == report
