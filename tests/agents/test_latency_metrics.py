"""The serving path's SLO histogram, scraped over real HTTP on loopback."""

import re
import urllib.request

import pytest

from agents.latency_metrics import RequestLatencyExporter
from deploy.alerts import le_matcher


def test_exporter_has_a_bucket_at_every_slo():
    exporter = RequestLatencyExporter([15, 37.5])
    record = exporter.recorder("photo-tagging", "alexnet")
    for latency in (3.0, 14.0, 20.0, 10_000.0):  # the last: a failure, recorded as the client timeout
        record(latency)
    url = exporter.serve(0)
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        exporter.close()
    labels = 'model="alexnet",workload="photo-tagging"'
    assert f'stoke_request_latency_ms_bucket{{le="15.0",{labels}}} 2.0' in text
    assert f'stoke_request_latency_ms_bucket{{le="37.5",{labels}}} 3.0' in text
    assert f'stoke_request_latency_ms_bucket{{le="5000.0",{labels}}} 3.0' in text
    assert f'stoke_request_latency_ms_bucket{{le="+Inf",{labels}}} 4.0' in text
    assert f"stoke_request_latency_ms_count{{{labels}}} 4.0" in text
    assert re.fullmatch(le_matcher(15), "15.0") and re.fullmatch(le_matcher(37.5), "37.5")


def test_window_percentiles_and_share_over_the_slo_from_two_scrapes():
    from prometheus_client import generate_latest

    from agents.latency_metrics import latency_window, parse_sli

    exporter = RequestLatencyExporter([80.0])
    record = exporter.recorder("w", "m")
    for _ in range(50):
        record(3.0)
    before = parse_sli(generate_latest(exporter.registry).decode())["w"]
    for ms in [15.0] * 90 + [60.0] * 8 + [90.0, 4000.0]:
        record(ms)
    after = parse_sli(generate_latest(exporter.registry).decode())["w"]
    w = latency_window(before, after, slo_ms=80.0)
    assert w.count == 100 and w.over_slo_ratio == 0.02
    assert 10.0 <= w.p50_ms <= 20.0 and 50.0 <= w.p95_ms <= 80.0 and 80.0 <= w.p99_ms <= 100.0
    assert latency_window(after, after, 80.0).count == 0  # nothing new
    assert latency_window(None, before, 80.0).count == 50  # the first window counts from zero
    restarted = {bound: 0.0 for bound in after}
    assert latency_window(after, restarted).count == 0  # an exporter that restarted counts from zero
    assert latency_window(before, after, slo_ms=33.0).over_slo_ratio is None  # no bucket at that SLO


def test_a_window_p99_reads_close_to_its_slowest_requests():
    """The closed loop learns the serving path from windows' p99s, interpolated inside a bucket: the buckets are
    fine enough that a window of 48 requests whose slowest took 10.5 ms does not read 15 ms (1-2-5 buckets did)."""
    from prometheus_client import generate_latest

    from agents.latency_metrics import latency_window, parse_sli

    exporter = RequestLatencyExporter([10.0])
    record = exporter.recorder("w", "m")
    for ms in [3.0] * 47 + [10.5]:
        record(ms)
    w = latency_window(None, parse_sli(generate_latest(exporter.registry).decode())["w"], slo_ms=10.0)
    assert w.count == 48 and w.over_slo_ratio == 1 / 48
    assert 10.0 <= w.p99_ms <= 12.0


def test_profile_run_reads_the_windows_p99s_as_the_agent_does_and_a_stall_shows_beyond_them():
    """`profile run` splits the serving path into what the loop's SLI windows show (the median of their p99s)
    and what clients see beyond (their p99 over all requests): it must read each window as the agent does."""
    import random

    from prometheus_client import generate_latest

    from agents.latency_metrics import latency_window, parse_sli, window_p99s_ms
    from agents.loadgen import ServingSample

    rng = random.Random(7)
    windows = [[rng.uniform(2.0, 6.0) for _ in range(40)] for _ in range(10)]
    windows[3][:8] = [30.0] * 8  # a stall of the machine: 8 requests of one window wait 30 ms
    exporter = RequestLatencyExporter()
    record, agent, before = exporter.recorder("w", "m"), [], None
    for values in windows:
        for ms in values:
            record(ms)
        after = parse_sli(generate_latest(exporter.registry).decode())["w"]
        agent.append(latency_window(before, after).p99_ms)
        before = after
    latency = [ms for values in windows for ms in values]
    done = [2.0 * w + 1.9 * i / len(values) for w, values in enumerate(windows) for i, _ in enumerate(values)]
    assert window_p99s_ms(latency, done, 2.0) == pytest.approx(agent, rel=1e-9)
    sample = ServingSample(tuple(latency), tuple(done), inside_ms=1.0)
    assert sample.p99_ms() == pytest.approx(29.0, rel=1e-9)  # clients: the stall (4 of 400 requests) less Triton's
    assert 4.0 <= sample.sli_p99_ms(2.0) <= 6.0  # the loop's windows: the median is not in the stall
    assert window_p99s_ms([], [], 2.0) == [] and ServingSample((), (), 0.0).sli_p99_ms() == 0.0
    with pytest.raises(ValueError):
        window_p99s_ms([1.0], [], 2.0)
