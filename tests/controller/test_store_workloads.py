"""The store's workload rows: read at every re-plan, built and checked only when a row changed (issue 16)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

from controller.store import Store
from planner.solver.random_mix import fleet_workloads


def test_unchanged_rows_come_back_as_the_same_workloads_and_changes_are_read(tmp_path):
    store = Store(tmp_path / "s.db")
    workloads = list(fleet_workloads(5, seed=4))
    store.upsert_workloads(workloads, 0.0)
    first, _ = store.workload_rows()
    assert sorted(first, key=lambda w: w.name) == sorted(workloads, key=lambda w: w.name)
    changed = replace(workloads[2], rate_rps=workloads[2].rate_rps * 2)
    store.upsert_workloads([changed], 1.0)
    store.delete_workload(workloads[0].name)
    second, _ = store.workload_rows()
    by_name = {w.name: w for w in second}
    assert by_name[changed.name] == changed
    assert workloads[0].name not in by_name
    unchanged = [w for w in first if w.name not in (changed.name, workloads[0].name)]
    assert all(by_name[w.name] is w for w in unchanged)  # not built or checked again
    store.close()


def test_a_row_changed_behind_the_stores_back_is_read_and_checked_again(tmp_path):
    store = Store(tmp_path / "s.db")
    store.upsert_workloads(list(fleet_workloads(2, seed=4)), 0.0)
    (name, *_), _ = store.workload_rows()
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute("UPDATE workloads SET rate_rps = 1e308 WHERE name = ?", (name.name,))
    good, bad = store.workload_rows()
    assert name.name not in {w.name for w in good}
    assert bad and bad[0][0] == name.name and "rate_rps" in bad[0][1]
    store.close()


def test_rows_written_through_the_store_are_read_again_and_the_rest_kept(tmp_path):
    """After the first read, a write through this store re-reads only the rows it wrote; every kind of write
    is seen: an update, a new name (a full read), a deletion, the demand tracker's rate, a dry run."""
    store = Store(tmp_path / "s.db")
    workloads = list(fleet_workloads(6, seed=5))
    auto = replace(workloads[1], rate_auto=True, min_rps=1.0, max_rps=1000.0)
    store.upsert_workloads([*workloads[:1], auto, *workloads[2:5]], 0.0)
    store.workload_rows()
    store.upsert_workloads([replace(workloads[0], slo_ms=workloads[0].slo_ms + 1)], 1.0)
    store.upsert_workloads([workloads[5]], 2.0)  # a new name
    store.delete_workload(workloads[2].name)
    assert store.set_planned_rate(auto.name, 77.0, 3.0)
    store.upsert_workloads([replace(workloads[3], rate_rps=1.5)], 4.0, dry_run=True)  # rolled back
    got = {w.name: w for w in store.workload_rows()[0]}
    assert got[workloads[0].name].slo_ms == workloads[0].slo_ms + 1
    assert workloads[5].name in got and workloads[2].name not in got
    assert got[auto.name].rate_rps == 77.0
    assert got[workloads[3].name].rate_rps == workloads[3].rate_rps
    assert [w.name for w in store.workload_rows()[0]] == sorted(got)  # in name order, as SQLite gives them
    fresh = Store(tmp_path / "s.db")  # what another reader finds: the same
    assert fresh.workload_rows() == store.workload_rows()
    store.close()
    fresh.close()


def test_a_paced_workload_s_arrivals_are_stored_and_a_change_of_them_is_an_update(tmp_path):
    """The controller planned every workload as Poisson: `arrivals` was not stored (nor sent over gRPC)."""
    store = Store(tmp_path / "s.db")
    (w,) = fleet_workloads(1, seed=4)
    paced = replace(w, arrivals="constant")
    assert store.upsert_workloads([paced], 0.0) == ([w.name], [], [])
    assert store.workloads() == (paced,)
    assert store.upsert_workloads([w], 1.0) == ([], [w.name], [])  # back to Poisson: an update, not "unchanged"
    assert store.workloads() == (w,)
    store.close()


def test_a_database_from_before_arrivals_reads_its_workloads_as_poisson(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the workloads table as the first schema wrote it
        db.execute(
            "CREATE TABLE workloads (name TEXT PRIMARY KEY, model TEXT NOT NULL, slo_ms REAL NOT NULL, "
            "rate_rps REAL NOT NULL, gpu_type TEXT, updated_unix REAL NOT NULL)"
        )
        db.execute("INSERT INTO workloads VALUES ('web', 'alexnet', 50, 10, NULL, 0)")
    store = Store(path)
    (w,) = store.workloads()
    assert (w.name, w.arrivals, w.rate_auto) == ("web", "poisson", False)
    store.close()
