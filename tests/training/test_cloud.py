"""EC2 edge against a real moto server and a local IMDSv2 metadata server (loopback only)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from processes import stop_process

from stoke.cli import main
from training import readers
from training.cloud import MetadataClient, PriceSource, RevocationWatcher, SpotLauncher, make_clients, parse_on_demand
from training.spec import spec_from_dict
from training.spot import provision_spot

pytestmark = pytest.mark.e2e

MOTO = Path(sys.executable).parent / "moto_server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto_url():
    mp = pytest.MonkeyPatch()
    for key, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        mp.setenv(key, value)
    port = _free_port()
    proc = subprocess.Popen(
        [str(MOTO), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("moto_server exited at start")
                time.sleep(0.05)
        else:
            pytest.fail("moto_server did not start")
        yield url
    finally:
        stop_process(proc)
        mp.undo()


class MetadataServer(ThreadingHTTPServer):
    """Plays the instance metadata service for many instances: /<instance_id>/latest/..."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.notices: dict[str, dict] = {}
        self.tokens: set[str] = set()
        self.token_requests = 0
        self.unauthorised = 0
        self.fail_with = 0  # an HTTP status every request gets instead (0: serve normally)

    def rotate_tokens(self) -> None:
        self.tokens.clear()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: MetadataServer

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, code: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        if self.server.fail_with:
            return self._send(self.server.fail_with, "<html>Internal Server Error</html>")
        if not self.path.endswith("/latest/api/token") or "X-aws-ec2-metadata-token-ttl-seconds" not in self.headers:
            return self._send(400)
        self.server.token_requests += 1
        token = f"tok-{self.server.token_requests}"
        self.server.tokens.add(token)
        self._send(200, token)

    def do_GET(self) -> None:
        if self.server.fail_with:
            return self._send(self.server.fail_with, "<html>Internal Server Error</html>")
        if self.headers.get("X-aws-ec2-metadata-token") not in self.server.tokens:
            self.server.unauthorised += 1
            return self._send(401)
        parts = self.path.strip("/").split("/")
        instance = parts[0] if parts[0] != "latest" else "self"
        if self.path.endswith("/latest/meta-data/spot/instance-action") and instance in self.server.notices:
            return self._send(200, json.dumps(self.server.notices[instance]))
        self._send(404)


@pytest.fixture()
def metadata():
    server = MetadataServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def spec():
    data, source = readers.read_spec(None)
    return spec_from_dict(data, readers.offline_catalog(), source)


def test_metadata_client_imdsv2_flow(metadata):
    client = MetadataClient(f"{metadata.url}/self")
    assert client.instance_action() is None  # 404: no notice
    assert metadata.token_requests == 1
    metadata.notices["self"] = {"action": "terminate", "time": "2026-01-01T00:02:00Z"}
    assert client.instance_action() == {"action": "terminate", "time": "2026-01-01T00:02:00Z"}
    assert metadata.token_requests == 1  # token reused
    metadata.rotate_tokens()  # token expired on the server: 401, refresh
    assert client.instance_action()["action"] == "terminate"
    assert metadata.token_requests == 2 and metadata.unauthorised == 1


def test_live_prices_from_moto_are_cached_with_timestamp(moto_url, tmp_path):
    ec2, _ = make_clients("us-east-1", moto_url)
    now = [1_700_000_000.0]
    cache = tmp_path / "prices.json"
    source = PriceSource(ec2=ec2, pricing=None, cache_path=cache, clock=lambda: now[0], max_age_s=600)
    catalog = source.live(["m5.xlarge", "p3.2xlarge"])
    assert catalog.source == "live" and catalog.prices_as_of == "2023-11-14T22:13:20Z"
    assert catalog.types["m5.xlarge"].spot_per_hour == pytest.approx(0.00001)  # moto's price
    assert catalog.types["p3.2xlarge"].spot_per_hour == 1.25  # moto has none: offline kept
    assert any("p3.2xlarge" in n for n in source.notes)
    assert json.loads(cache.read_text())["fetched_at"] == now[0]
    offline_source = PriceSource(ec2=None, cache_path=cache, clock=lambda: now[0] + 60, max_age_s=600)
    assert offline_source.live(["m5.xlarge", "p3.2xlarge"]).types["m5.xlarge"].spot_per_hour == pytest.approx(0.00001)
    stale = PriceSource(ec2=None, cache_path=cache, clock=lambda: now[0] + 601, max_age_s=600)
    with pytest.raises(Exception, match="offline"):
        stale.live(["m5.xlarge", "p3.2xlarge"])  # too old: must refetch


class FakePricing:
    """Hand-written stand-in for the pricing API (moto has none)."""

    def __init__(self, prices: dict[str, str]):
        self.prices = prices
        self.calls = 0

    def get_products(self, ServiceCode, Filters, MaxResults):
        self.calls += 1
        itype = next(f["Value"] for f in Filters if f["Field"] == "instanceType")
        if itype not in self.prices:
            return {"PriceList": []}
        product = {
            "terms": {
                "OnDemand": {
                    "T1": {"priceDimensions": {"D1": {"unit": "Hrs", "pricePerUnit": {"USD": self.prices[itype]}}}}
                }
            }
        }
        return {"PriceList": [json.dumps(product)]}


def test_on_demand_prices_from_pricing_api(moto_url):
    ec2, _ = make_clients("us-east-1", moto_url)
    pricing = FakePricing({"m5.xlarge": "0.2000000000"})
    catalog = PriceSource(ec2=ec2, pricing=pricing).live(["m5.xlarge", "g3.8xlarge"])
    assert catalog.types["m5.xlarge"].on_demand_per_hour == pytest.approx(0.2)
    assert catalog.types["g3.8xlarge"].on_demand_per_hour == 2.28
    assert pricing.calls == 2
    assert parse_on_demand([]) is None


def test_launcher_is_idempotent_and_terminates(moto_url, spec):
    ec2, _ = make_clients("us-east-1", moto_url)
    plan = provision_spot(spec)
    launcher = SpotLauncher(ec2, "idem")
    first = launcher.apply(plan)
    assert len(first.created) == 5 and not first.reused  # 2 p3 + 2 g3.8 workers + 1 PS
    second = launcher.apply(plan)
    assert not second.created and len(second.reused) == 5
    running = launcher.instances()
    assert sorted((i.type, i.role) for i in running) == sorted(
        [("p3.2xlarge", "worker")] * 2 + [("g3.8xlarge", "worker")] * 2 + [("m5.xlarge", "ps")]
    )
    reservations = ec2.describe_instances(InstanceIds=[running[0].id])["Reservations"]
    tags = {t["Key"]: t["Value"] for t in reservations[0]["Instances"][0]["Tags"]}
    assert tags["stoke-cluster"] == "idem" and tags["stoke-job"] == plan.job
    assert len(launcher.terminate().terminated) == 5
    assert launcher.terminate().terminated == ()
    assert launcher.instances() == []


def test_revocation_replans_with_survivors_and_replaces(moto_url, metadata, spec):
    ec2, _ = make_clients("us-east-1", moto_url)
    plan = provision_spot(spec)
    launcher = SpotLauncher(ec2, "revoke")
    launcher.apply(plan)
    started = min(i.launch_time for i in launcher.instances())
    now = [started + 600.0]  # 10 minutes into the job
    sleeps: list[float] = []
    watcher = RevocationWatcher(
        launcher, spec, plan, metadata.url + "/{instance_id}", clock=lambda: now[0], sleep=sleeps.append, interval_s=10
    )
    assert watcher.poll() == {}
    g3 = [i.id for i in launcher.instances() if i.type == "g3.8xlarge"]
    p3 = [i.id for i in launcher.instances() if i.type == "p3.2xlarge"]
    for iid in g3:
        metadata.notices[iid] = {"action": "terminate", "time": "2026-01-01T00:02:00Z"}
    events = []
    handled = watcher.run(max_polls=3, on_event=events.append)
    assert handled == 2 and len(events) == 1 and sleeps == [10, 10]
    result = events[0]
    assert sorted(result.revoked) == sorted(g3)
    new_plan = result.plan
    assert new_plan.feasible and dict(new_plan.existing) == {"p3.2xlarge": 2}
    assert new_plan.count("p3.2xlarge") >= 2
    assert new_plan.predicted_time_s <= spec.deadline_s - 600 + 1e-6
    assert new_plan.details["recovery_overhead_s"] == 30
    assert len(result.launch.created) == sum(c for _, c in new_plan.additions) > 0
    live = launcher.instances()
    assert not set(g3) & {i.id for i in live}  # revoked ones are gone
    assert set(p3) <= {i.id for i in live}  # survivors kept
    workers = {}
    for i in live:
        if i.role == "worker":
            workers[i.type] = workers.get(i.type, 0) + 1
    assert workers == {t: c for t, c in new_plan.counts if c}
    # the same notices again: nothing new is launched
    again = watcher.handle({iid: metadata.notices[iid] for iid in g3})
    assert again.launch is not None and again.launch.created == ()
    assert len(launcher.instances()) == len(live)
    assert watcher.run(max_polls=1) == 0  # revoked instances are not polled
    launcher.terminate()


def test_cli_launch_watch_terminate(moto_url, metadata, tmp_path, capsys):
    plan_file = tmp_path / "plan.json"
    assert main(["train", "plan", "-o", str(plan_file)]) == 0
    assert json.loads(plan_file.read_text())["counts"]["p3.2xlarge"] == 2
    capsys.readouterr()
    args = ["--endpoint-url", moto_url, "--cluster", "cli"]
    assert main(["train", "launch", str(plan_file), *args]) == 0
    assert "created 5, reused 0" in capsys.readouterr().out
    assert main(["train", "launch", str(plan_file), *args]) == 0
    assert "created 0, reused 5" in capsys.readouterr().out
    watch = [
        "train",
        "watch",
        str(plan_file),
        *args,
        "--metadata-url",
        metadata.url + "/{instance_id}",
        "--max-polls",
        "1",
    ]
    assert main(watch) == 2  # a plan file needs the spec it came from
    assert "give --spec" in capsys.readouterr().err
    assert main([*watch, "--spec", str(readers.data_path("resnet110.yaml"))]) == 0
    out, err = capsys.readouterr()
    assert "0 revocation(s) handled" in out
    # progress (piped: one line per poll): the job's run time against the plan's prediction, with the ETA of its end
    line = next(line for line in err.splitlines() if line.startswith("training "))
    assert re.search(
        r": [\d.,]+/[\d,]+ s \(\d+%\), .* elapsed, ETA (\d+h \d+m|\d+m \d+s|\d+ s); poll 1/1, \d+ spot", line
    ), line
    assert main(["train", "terminate", *args]) == 0
    assert "terminated 5" in capsys.readouterr().out


def test_cli_plan_with_live_prices(moto_url, tmp_path, capsys):
    cache = tmp_path / "prices.json"
    assert (
        main(["train", "plan", "--prices", "live", "--endpoint-url", moto_url, "--price-cache", str(cache), "--json"])
        == 0
    )
    body = json.loads(capsys.readouterr().out)
    assert body["prices"]["source"] == "live" and body["prices"]["as_of"].endswith("Z")
    assert any("pricing API" in n or "on-demand" in n for n in body["prices"]["notes"])
    assert json.loads(cache.read_text())["catalog"]["types"]["m5.xlarge"]["spot_per_hour"] == pytest.approx(0.00001)
    assert body["counts"]["p3.2xlarge"] == 2  # the spec's own fixture prices still decide the plan


def test_cli_watch_without_instance_metadata_is_a_stoke_error_with_the_fix(
    moto_url, metadata, tmp_path, capsys, monkeypatch
):
    """No metadata service (here: one answering HTTP 500) is one line naming the metadata and the fix; an
    http_proxy in the environment (which answers 500 for 169.254.169.254) is not used for the metadata."""
    plan_file = tmp_path / "plan.json"
    assert main(["train", "plan", "-o", str(plan_file)]) == 0
    args = ["--endpoint-url", moto_url, "--cluster", "nometa"]
    assert main(["train", "launch", str(plan_file), *args]) == 0
    capsys.readouterr()
    watch = ["train", "watch", str(plan_file), "--spec", str(readers.data_path("resnet110.yaml")), *args]
    watch += ["--metadata-url", metadata.url + "/{instance_id}", "--max-polls", "1"]
    try:
        metadata.fail_with = 500
        assert main(watch) == 2
        err = capsys.readouterr().err
        line = next(line for line in err.splitlines() if line.startswith("stoke: error:"))
        assert "instance metadata at " in line and "not available (token request: HTTP 500)" in line
        assert "--metadata-url" in line and "EC2 permissions" not in line and "Internal Server Error" not in line
        metadata.fail_with = 0
        proxy = MetadataServer()  # an HTTP proxy that fails everything, as a corporate proxy does for IMDS
        proxy.fail_with = 500
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            # EC2 (moto, 127.0.0.1) bypasses the proxy; the metadata, named localhost, would go through it
            monkeypatch.setenv("http_proxy", proxy.url)
            monkeypatch.setenv("no_proxy", "127.0.0.1")
            watch[watch.index("--metadata-url") + 1] = metadata.url.replace("127.0.0.1", "localhost") + "/{instance_id}"
            assert main(watch) == 0, capsys.readouterr().err
            assert "0 revocation(s) handled" in capsys.readouterr().out
        finally:
            proxy.shutdown()
            proxy.server_close()
    finally:
        assert main(["train", "terminate", *args]) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--prices", "live", "--endpoint-url", "notaurl"], "--endpoint-url 'notaurl' is not an http(s) URL"),
        (["plan", "--prices", "live", "--region", "bad region"], "--region 'bad region' is not an AWS region name"),
        (["launch", "PLAN", "--region", "bad region"], "--region 'bad region' is not an AWS region name"),
        (["launch", "PLAN", "--endpoint-url", "notaurl"], "--endpoint-url 'notaurl' is not an http(s) URL"),
        (["launch", "PLAN", "--endpoint-url", "http://127.0.0.1:99999"], "is not an http(s) URL"),
        (["terminate", "--cluster", "x", "--region", "US_EAST"], "--region 'US_EAST' is not an AWS region name"),
        (["terminate", "--cluster", "a/b\x1b[31mX"], "--cluster must be printable text of 1-256 characters"),
    ],
)
def test_bad_cloud_options_are_one_line_errors_before_any_request(capsys, tmp_path, monkeypatch, argv, message):
    """botocore refuses these with a traceback (ValueError: Invalid endpoint, InvalidRegionError)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    plan = tmp_path / "plan.json"
    assert main(["train", "plan", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["train", *[str(plan) if a == "PLAN" else a for a in argv]]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err and "\x1b" not in err


def test_make_clients_turns_botocore_option_errors_into_cloud_errors():
    from training.cloud import CloudError

    with pytest.raises(CloudError, match="region 'bad region' is not an AWS region name") as err:
        make_clients("bad region")
    assert err.value.reason == "region"
    with pytest.raises(CloudError, match="endpoint URL 'notaurl' is not a URL") as err:
        make_clients("us-east-1", "notaurl")
    assert err.value.reason == "endpoint"
