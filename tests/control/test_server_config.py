"""Controller config loading, and TLS on loopback with a self-signed certificate (real openssl, real gRPC)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from controller.api.client import ControllerClient, Unavailable
from controller.server import ConfigError, ControllerServer, load_config


def test_config_defaults_and_relative_paths(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("db: state/c.db\nheartbeat_timeout_s: 4\nheartbeat_interval_s: 1\n"
                   "gpu_types:\n  - {name: V100, price_per_hour: 3.06, match: V100}\n")
    config = load_config(cfg, listen="127.0.0.1:0")
    assert config.db == str(tmp_path / "state" / "c.db") and config.listen == "127.0.0.1:0"
    assert config.gpu_types[0].match == ("V100",) and config.heartbeat_timeout_s == 4.0
    assert load_config(None).listen == "127.0.0.1:50051"


@pytest.mark.parametrize("text, field", [
    ("listne: x\n", "listne"),
    ("heartbeat_timeout_s: -1\n", "heartbeat_timeout_s"),
    ("heartbeat_timeout_s: 1\nheartbeat_interval_s: 2\n", "heartbeat_timeout_s"),
    ("tls: {cert: a.pem}\n", "tls"),
    ("gpu_types:\n  - {name: V100, price_per_hour: -2}\n", "gpu_types[0].price_per_hour"),
    ("listen: nowhere\n", "listen"),
    ("strategy: magic\n", "strategy"),
])
def test_config_errors_name_file_and_field(tmp_path, text, field):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert str(cfg) in str(err.value) and field in str(err.value)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_tls_serves_and_refuses_plaintext(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    (tmp_path / "c.yaml").write_text("listen: 127.0.0.1:0\nmetrics_listen: ''\ndb: c.db\n"
                                     "tls: {cert: cert.pem, key: key.pem}\n")
    server = ControllerServer(load_config(tmp_path / "c.yaml")).start()
    try:
        with ControllerClient(server.address, tls_ca=str(tmp_path / "cert.pem")) as secure:
            assert secure.list_workloads() == []
        with ControllerClient(server.address, timeout_s=2) as plain:
            with pytest.raises(Unavailable):
                plain.list_workloads()
    finally:
        server.stop()
