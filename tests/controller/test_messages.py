"""The messages agents, client and service exchange: replica keys, names, structured errors."""

from __future__ import annotations

import pytest

from controller.api import convert
from controller.messages import AssignmentError, HeartbeatReport, InvalidArgument, ModelAssignment, Replica, check_name


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
