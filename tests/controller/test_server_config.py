"""Controller config loading, and TLS on loopback with a self-signed certificate (real openssl, real gRPC)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from controller.api.client import ControllerClient
from controller.config import SCHEMA_FILE, ConfigError, ControllerConfig, ServiceConfig, config_schema, load_config
from controller.messages import Unavailable
from controller.server import ControllerServer
from foundation.validate import keys
from planner.solver import STRATEGIES


def test_config_defaults_and_relative_paths(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "db: state/c.db\nheartbeat_timeout_s: 4\nheartbeat_interval_s: 1\n"
        "gpu_types:\n  - {name: V100, price_per_hour: 3.06, match: V100}\n"
    )
    config = load_config(cfg, listen="127.0.0.1:0")
    assert config.db == str(tmp_path / "state" / "c.db") and config.listen == "127.0.0.1:0"
    assert config.service.gpu_types[0].match == ("V100",) and config.service.heartbeat_timeout_s == 4.0
    assert load_config(None) == ControllerConfig()
    assert load_config(cfg.parent / "c.yaml", db="x.db").db == str(Path("x.db").absolute())  # flags: cwd-relative


def test_default_paths_are_relative_to_the_config_file(tmp_path):
    (tmp_path / "c.yaml").write_text("listen: 127.0.0.1:0\n")
    assert load_config(tmp_path / "c.yaml").db == str(tmp_path / "stoke-controller.db")


def test_the_committed_json_schema_is_generated_from_the_config_classes():
    assert json.loads(SCHEMA_FILE.read_text()) == config_schema(), "stale schema: run `make schema`"
    props = config_schema()["properties"]
    # the service's keys sit at the top level of the file, with the defaults of ServiceConfig
    assert props["heartbeat_timeout_s"]["default"] == ServiceConfig().heartbeat_timeout_s
    assert props["strategy"]["enum"] == list(STRATEGIES)
    assert set(props) == set(keys(ControllerConfig))


@pytest.mark.parametrize(
    "text, valid",
    [
        (
            "listen: 0.0.0.0:50051\nmetrics_listen: ''\ntls: {cert: c.pem, key: k.pem}\nheartbeat_timeout_s: 30\n"
            "gpu_types:\n  - {name: H200, price_per_hour: 4.5, match: [h200]}\nprofiles:\n  - p.json\n"
            "  - {path: q.json, gpu_type: CPU}\n",
            True,
        ),
        ("heartbeat_timeout_s: -1\n", False),
        ("listne: x\n", False),
        ("strategy: magic\n", False),
        ("tls: {cert: a.pem}\n", False),
        ("listen: 127.0.0.1:99999\n", False),
        ('gpu_types: [{name: "a/b"}]\n', False),
        ('cpu_gpu_type: "a b"\n', False),
        ("metrics_listen: 127.0.0.1:0\n", True),
    ],
)
def test_the_schema_accepts_and_refuses_what_the_loader_does(tmp_path, text, valid):
    import jsonschema
    import yaml

    data = yaml.safe_load(text)
    schema_ok = jsonschema.Draft202012Validator(config_schema()).is_valid(data)
    (tmp_path / "c.yaml").write_text(text)
    try:
        load_config(tmp_path / "c.yaml")
        loader_ok = True
    except ConfigError:
        loader_ok = False
    assert schema_ok == loader_ok == valid


@pytest.mark.parametrize(
    "text, field",
    [
        ("listne: x\n", "listne"),
        ("heartbeat_timeout_s: -1\n", "heartbeat_timeout_s"),
        ("heartbeat_timeout_s: 1\nheartbeat_interval_s: 2\n", "heartbeat_timeout_s"),
        ("tls: {cert: a.pem}\n", "tls lacks field 'key'"),
        ("gpu_types:\n  - {name: V100, price_per_hour: -2}\n", "gpu_types[0].price_per_hour"),
        ("listen: nowhere\n", "listen"),
        # the probe: an out-of-range port started the controller on a random one (gRPC wraps it)
        ("listen: 127.0.0.1:99999\n", "listen must be HOST:PORT with a port from 0 to 65535"),
        ("metrics_listen: 127.0.0.1:65536\n", "metrics_listen must be HOST:PORT"),
        ("strategy: magic\n", "strategy"),
        # GPU type names follow the one name rule; one entry per type; a match string claims for one type only
        ('cpu_gpu_type: "a b"\n', "cpu_gpu_type must be a name of 1-128 characters"),
        ('gpu_types: [{name: "a/b"}]\n', "gpu_types[0].name must be a name of"),
        (
            "gpu_types: [{name: V100, price_per_hour: 3}, {name: V100, price_per_hour: 1}]\n",
            "gpu_types[1].name 'V100' repeats gpu_types[0].name; give each GPU type one entry",
        ),
        (
            "gpu_types: [{name: A, match: [tesla]}, {name: B, match: [p4, Tesla]}]\n",
            "gpu_types[1].match 'tesla' is also in gpu_types[0].match: devices it matches would be A, never B",
        ),
        (
            "listen: 127.0.0.1:0\nlisten: 0.0.0.0:0\n",
            "line 2: key 'listen' repeated (at the top level, first at line 1)",
        ),
    ],
)
def test_config_errors_name_file_and_field(tmp_path, text, field):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert str(cfg) in str(err.value) and field in str(err.value)


@pytest.mark.parametrize("flag", ["--listen", "--metrics-listen"])
def test_an_out_of_range_port_on_the_command_line_is_refused_naming_the_flag(tmp_path, capsys, monkeypatch, flag):
    # the probe: --metrics-listen 127.0.0.1:99999 ended in OverflowError's traceback after gRPC had started
    import threading

    from stoke.cli import main

    stopped = threading.Event()
    stopped.set()  # a controller that starts anyway stops at once instead of serving until Ctrl-C
    monkeypatch.setattr("stoke.commands.daemons.until_signal", lambda: stopped)

    assert main(["controller", flag, "127.0.0.1:99999", "--db", str(tmp_path / "c.db")]) == 2
    err = capsys.readouterr().err
    assert "command line (--db, " + flag in err and "port 99999 is out of range" in err
    assert "Traceback" not in err and not (tmp_path / "c.db").exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_tls_serves_and_refuses_plaintext(tmp_path):
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(tmp_path / "key.pem"),
            "-out",
            str(tmp_path / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    (tmp_path / "c.yaml").write_text(
        "listen: 127.0.0.1:0\nmetrics_listen: ''\ndb: c.db\ntls: {cert: cert.pem, key: key.pem}\n"
    )
    server = ControllerServer(load_config(tmp_path / "c.yaml")).start()
    try:
        with ControllerClient(server.address, tls_ca=str(tmp_path / "cert.pem")) as secure:
            assert secure.list_workloads() == []
        with ControllerClient(server.address, timeout_s=2) as plain:
            with pytest.raises(Unavailable) as err:
                plain.list_workloads()
        # issue 10: a plaintext client was told the controller is unreachable; it is there and serves TLS
        assert "it may serve TLS: pass --tls-ca FILE" in str(err.value) and "unreachable" not in str(err.value)
    finally:
        server.stop()
    (tmp_path / "p.yaml").write_text("listen: 127.0.0.1:0\nmetrics_listen: ''\ndb: p.db\n")
    plain_server = ControllerServer(load_config(tmp_path / "p.yaml")).start()
    try:
        with ControllerClient(plain_server.address, tls_ca=str(tmp_path / "cert.pem"), timeout_s=2) as secure:
            with pytest.raises(Unavailable) as err:
                secure.list_workloads()
        assert "did not complete a TLS handshake" in str(err.value) and "may serve plaintext" in str(err.value)
    finally:
        plain_server.stop()


@pytest.mark.slow
def test_a_token_served_without_tls_off_loopback_is_warned_about(tmp_path, caplog):
    (tmp_path / "token").write_text("t\n")
    (tmp_path / "token").chmod(0o600)
    (tmp_path / "c.yaml").write_text("listen: 0.0.0.0:0\nmetrics_listen: ''\ndb: c.db\ntoken_file: token\n")
    with caplog.at_level(logging.WARNING, logger="stoke.controller"):
        server = ControllerServer(load_config(tmp_path / "c.yaml"))
    server.stop()
    assert "tokens travel in clear text" in caplog.text


def test_gpu_type_match_is_a_substring_of_the_name_or_the_device_kind():
    # the probe: `match: [cpu]` did not claim a CPU device named "AMD EPYC 7B13", which fell back to cpu_gpu_type
    from controller.config import GpuTypeConfig, ServiceConfig
    from controller.messages import NodeDevice

    config = ServiceConfig(
        gpu_types=(GpuTypeConfig("V100", 3.06, ("v100",)), GpuTypeConfig("cpu-2core", 0.1, ("cpu",))),
        cpu_gpu_type="CPU",
    )
    assert config.gpu_type_for(NodeDevice(0, "AMD EPYC 7B13", "cpu")) == "cpu-2core"
    assert config.gpu_type_for(NodeDevice(0, "Tesla V100-SXM2-16GB", "gpu")) == "V100"
    assert config.gpu_type_for(NodeDevice(0, "NVIDIA H200", "gpu")) == "NVIDIA-H200"  # "cpu" claims no GPU


@pytest.mark.slow
def test_a_second_controller_on_a_port_in_use_is_refused_and_the_first_keeps_serving(tmp_path, capsys):
    # the probe: gRPC's default SO_REUSEPORT let a second controller bind the first one's port and "listen" too
    from stoke.cli import main

    (tmp_path / "a.yaml").write_text("listen: 127.0.0.1:0\nmetrics_listen: ''\ndb: a.db\n")
    first = ControllerServer(load_config(tmp_path / "a.yaml")).start()
    try:
        (tmp_path / "b.yaml").write_text(f"listen: {first.address}\nmetrics_listen: ''\ndb: b.db\n")
        with pytest.raises(ConfigError) as err:
            ControllerServer(load_config(tmp_path / "b.yaml"))
        assert err.value.field == "listen"
        assert f"cannot listen on {first.address} (the port is in use" in str(err.value)
        assert "change listen in the config (or --listen)" in str(err.value)
        code = main(["controller", "--listen", first.address, "--metrics-listen", "", "--db", str(tmp_path / "c.db")])
        assert code == 2 and f"cannot listen on {first.address}" in capsys.readouterr().err
        with ControllerClient(first.address, timeout_s=5) as client:  # the first is untouched
            for _ in range(20):  # every new connection reaches it, none a second server
                assert client.list_workloads() == []
    finally:
        first.stop()


@pytest.mark.slow
def test_a_second_controller_on_the_same_database_is_refused_until_the_first_stops(tmp_path, capsys):
    import os

    from stoke.cli import main

    (tmp_path / "a.yaml").write_text("listen: 127.0.0.1:0\nmetrics_listen: ''\ndb: c.db\n")
    first = ControllerServer(load_config(tmp_path / "a.yaml")).start()
    try:
        with pytest.raises(ConfigError) as err:
            ControllerServer(load_config(tmp_path / "a.yaml"))  # its own free port, the same database
        db = tmp_path / "c.db"
        assert err.value.field == "db"
        assert f"{db}: another controller uses this database (pid {os.getpid()} holds {db}.lock)" in str(err.value)
        assert "stop it first, or give this one another db (--db)" in str(err.value)
        # a recovery while the controller runs would rename the database under it
        assert main(["controller", "recover", "--db", str(db)]) == 2
        assert "another controller uses this database" in capsys.readouterr().err
        with ControllerClient(first.address, timeout_s=5) as client:
            assert client.list_workloads() == []
    finally:
        first.stop()
    ControllerServer(load_config(tmp_path / "a.yaml")).stop()  # the lock went with the first controller


@pytest.mark.slow
def test_the_startup_lines_say_where_metrics_are_served_or_that_they_are_off(tmp_path, capsys, caplog, monkeypatch):
    # the probe: with metrics off, the lines read "(metrics on port off)" and "metrics on off"
    import threading

    from stoke.cli import main

    stopped = threading.Event()
    stopped.set()  # the controller stops as soon as it has started
    monkeypatch.setattr("stoke.commands.daemons.until_signal", lambda: stopped)
    base = ["controller", "--listen", "127.0.0.1:0", "--db", str(tmp_path / "c.db")]
    with caplog.at_level(logging.INFO, logger="stoke.controller"):
        assert main([*base, "--metrics-listen", ""]) == 0
    assert "(metrics off)" in capsys.readouterr().out and "), metrics off" in caplog.text
    assert "on off" not in caplog.text
    assert main([*base, "--metrics-listen", "127.0.0.1:0"]) == 0
    out = capsys.readouterr().out
    assert "(metrics on http://127.0.0.1:" in out and "/metrics)" in out and ":0/metrics" not in out
    # a port in use for metrics: the field and the fix, and nothing left listening or locked
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([*base, "--metrics-listen", f"127.0.0.1:{port}"]) == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main([*base, "--metrics-listen", ""]) == 0  # the database is free again
