"""The serving path's SLO histogram, scraped over real HTTP on loopback."""

import re
import urllib.request

from agents.latency_metrics import RequestLatencyExporter
from controller.alerts import le_matcher


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
