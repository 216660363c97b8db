"""The store tells the truth about its disk (issue 21, item 5), on a small tmpfs this test mounts itself.

- A full disk: the controller's health goes NOT_SERVING, `last_error` and the metric name the cause, the
  generated rules alert on it; once space is freed, health and applies come back by themselves.
- Observation windows give way before desired state: below the reserve no window is stored.
- A damaged file: its own message, and `stoke controller recover` restores the newest backup with the
  node-token key (or salvages what is readable).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from control_helpers import cpu_profile_json, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.api.client import ControllerClient
from controller.config import ControllerConfig, ObservationsConfig, ServiceConfig
from controller.observations import ObservationRecord
from controller.server import ControllerServer
from controller.store import BackupSchedule, DatabaseError, Store, recover
from deploy.alerts import controller_rules
from planner.solver import Workload

pytestmark = pytest.mark.chaos
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "disk-test-token"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs mounted for this test only (unmounted at the end)."""
    mount = tmp_path / "vol"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m,mode=0700", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path, leave_bytes: int = 0) -> Path:
    """A file that takes the filesystem's free space, all of it or all but `leave_bytes`."""
    filler = path / "filler"
    st = os.statvfs(path)
    want = max(0, st.f_bavail * st.f_frsize - leave_bytes)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while want > 0:
            want -= os.write(fd, b"\0" * min(want, 2**20))
        while leave_bytes == 0:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass  # ENOSPC: full, as asked
    finally:
        os.close(fd)
    return filler


def window(i: int) -> ObservationRecord:
    return ObservationRecord(
        unix=1000.0 + i,
        node_id="n1",
        device=0,
        gpu_type="CPU",
        workload="web",
        replica=0,
        model="mlp_small",
        share_pct=50.0,
        batch=4,
        queue_delay_ms=1.0,
        slo_ms=100.0,
        neighbours=(),
        window_s=2.0,
        seq=i,
        rate_rps=10.0,
        requests=20,
        failures=0,
        pending=0,
        mean_batch=2.0,
        batch_stats=(),
        queue_ms=1.0,
        compute_ms=2.0,
        instances=1,
    )


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def test_a_full_disk_degrades_health_and_alerts_and_applies_recover_once_space_is_freed(small_disk, tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    config = ControllerConfig(
        listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        db=str(small_disk / "c.db"),
        token_file=str(tmp_path / "token"),
        reconcile_interval_s=0.1,
        backup_interval_s=0,
        service=ServiceConfig(observations=ObservationsConfig(reserve_mib=1)),
    )
    server = ControllerServer(config).start()
    try:
        with ControllerClient(server.address, token=TOKEN) as client:
            client.upload_profile(cpu_profile_json())
            client.apply_workloads([Workload("web", "mlp_small", 100, 20)])
            filler = fill(small_disk)
            with pytest.raises(Exception, match="disk is full"):
                for i in range(200):  # until a write needs a new page
                    client.apply_workloads([Workload(f"w{i}", "mlp_small", 100, 20)])
                    client.mint_agent_token(f"node-{i}")
            wait_for("health NOT_SERVING", lambda: health(server.address) == health_pb2.HealthCheckResponse.NOT_SERVING)
            for _ in range(20):  # over ~10 reconcile ticks: one cause, not the store's and the loop's in turn
                error = client.status().last_error
                assert "disk_full" in error and "Free space" in error, error
                time.sleep(0.05)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read()
            assert b'stoke_store_degraded{reason="disk_full"} 1.0' in metrics
            assert b"stoke_store_healthy 0.0" in metrics
            alert = controller_rules()["rules"][0]
            assert alert["alert"] == "StokeStoreDegraded" and "stoke_store_degraded" in alert["expr"]

            filler.unlink()  # space freed: no restart, no operator step
            wait_for("health SERVING again", lambda: health(server.address) == health_pb2.HealthCheckResponse.SERVING)
            client.apply_workloads([Workload("after", "mlp_small", 100, 20)])
            assert "after" in {w.name for w in client.list_workloads()}
            assert client.status().last_error == ""
    finally:
        server.stop()


def test_observation_windows_give_way_before_desired_state(small_disk):
    store = Store(small_disk / "c.db", reserve_bytes=2 * 2**20)
    try:
        assert len(store.add_observations([window(i) for i in range(50)], 1e9, 10**6, 2000.0)) == 50
        fill(small_disk, leave_bytes=1 * 2**20)  # under the reserve
        assert store.add_observations([window(i) for i in range(50)], 1e9, 10**6, 2000.0) == []
        state = store.health()
        assert state.ok and state.reason == "observations_paused" and "not stored" in state.error
        assert store.observation_count() < 50  # the oldest are given back
        created, _, _ = store.upsert_workloads([Workload("web", "mlp_small", 100, 20)], 2000.0)
        assert created == ["web"]  # desired state still writes
    finally:
        store.close()


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for offset in range(4096, len(data), 4096):  # every page after the first: garbage headers
        data[offset : offset + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))


def test_a_damaged_database_says_so_and_recover_restores_the_backup_with_the_token_key(tmp_path):
    db = tmp_path / "c.db"
    store = Store(db)
    key = store.agent_key()
    store.upsert_workloads([Workload(f"w{i}", "mlp_small", 100, 20) for i in range(200)], 1.0)
    backups = BackupSchedule(store, tmp_path / "backups", interval_s=60, keep=2)
    assert backups.maybe_run(100.0) is not None and backups.maybe_run(120.0) is None  # interval respected
    store.upsert_workloads([Workload("late", "mlp_small", 100, 20)], 2.0)
    store.close()
    corrupt(db)
    with pytest.raises(DatabaseError, match="stoke controller recover") as err:
        Store(db)
    assert err.value.reason == "corrupt"

    out = subprocess.run(
        [sys.executable, "-m", "stoke", "controller", "recover", "--db", str(db), "--config", str(cfg(tmp_path))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "restored from the backup" in out.stdout and "kept aside" in out.stdout
    again = Store(db)
    try:
        assert again.agent_key() == key  # agents' tokens keep working
        names = {w.name for w in again.workloads()}
        assert "w199" in names and "late" not in names  # after the backup: lost, and said so
    finally:
        again.close()
    assert list(tmp_path.glob("c.db.damaged-*"))  # the damaged file is kept


def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"backup_dir: {tmp_path / 'backups'}\n")
    return path


def test_recover_without_a_backup_salvages_what_is_readable(tmp_path):
    db = tmp_path / "c.db"
    store = Store(db)
    key = store.agent_key()
    store.close()
    data = bytearray(db.read_bytes())
    data[100:200] = b"\xff" * 100  # the first page's b-tree header: the schema is unreadable
    db.write_bytes(bytes(data))
    result = recover(db, tmp_path / "none")
    assert result.action == "salvaged" and result.kept_aside
    fresh = Store(db)
    try:
        assert fresh.integrity() == "ok"
        if fresh.agent_key() != key:  # the key was on a damaged page: said so
            assert any("new token" in n for n in result.notes)
    finally:
        fresh.close()


def test_recover_of_a_missing_database_restores_the_backup_or_refuses(tmp_path):
    db = tmp_path / "c.db"
    with pytest.raises(DatabaseError, match="no database there and no good backup"):
        recover(db, tmp_path / "none")
    assert not db.exists()  # a mistyped path made no fresh database (with a new signing key)
    store = Store(db)
    key = store.agent_key()
    (tmp_path / "backups").mkdir()
    store.backup(tmp_path / "backups" / "stoke-controller-20260101T000000Z.db")
    store.close()
    db.unlink()
    result = recover(db, tmp_path / "backups")
    assert result.action == "restored" and result.kept_aside == ""
    assert db.stat().st_mode & 0o777 == 0o600
    again = Store(db)
    try:
        assert again.agent_key() == key
    finally:
        again.close()


def test_opening_on_a_full_disk_says_the_disk_is_full(small_disk):
    Store(small_disk / "c.db").close()
    fill(small_disk)
    with pytest.raises(DatabaseError, match="the disk is full.*start the controller again") as err:
        Store(small_disk / "c.db")
    assert err.value.reason == "disk_full"
