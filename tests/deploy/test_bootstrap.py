"""The agent side of the node-token bootstrap fails clearly (the exchange itself: tests/deploy/test_operator.py)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from triton_helpers import free_port

from deploy.bootstrap import BootstrapError, fetch_node_token
from stoke.cli import main


def test_an_unreadable_projected_token_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(BootstrapError, match="cannot read the projected ServiceAccount token.*projected volume"):
        fetch_node_token("http://127.0.0.1:1", tmp_path / "missing", tmp_path / "out", timeout_s=1)
    assert not (tmp_path / "out").exists()


def test_an_unreachable_operator_is_retried_then_reported_and_nothing_is_written(tmp_path, capsys):
    (tmp_path / "sa").write_text("token\n")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    argv = ["k8s", "bootstrap", "--operator", url, "--service-account-token", str(tmp_path / "sa")]
    assert main([*argv, "--token-file", str(tmp_path / "out"), "--timeout", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stoke: error: no node token from {url} within 0.5s; last:") and "refused" in err
    assert not (tmp_path / "out").exists()


class _RepeatingOperator(BaseHTTPRequestHandler):
    """An operator (or whoever holds its address) answering with the token key given twice."""

    def do_POST(self) -> None:
        body = b'{"node_id": "n1", "token": "first", "token": "second"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_an_answer_with_a_repeated_key_is_refused_and_nothing_is_written(tmp_path):
    (tmp_path / "sa").write_text("token\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RepeatingOperator)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(BootstrapError, match=r"last: key 'token' repeated \(at the top level\); keep one"):
            fetch_node_token(url, tmp_path / "sa", tmp_path / "out", timeout_s=0.3, retry_s=0.1)
    finally:
        server.shutdown()
        server.server_close()
    assert not (tmp_path / "out").exists()  # the last token won silently, and was written
