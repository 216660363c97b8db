"""Desired state of the controller in SQLite (WAL mode): the one module that imports sqlite3.

Tables
- ``workloads``: name -> model, slo_ms, rate_rps, gpu_type (the user's intent);
- ``gpu_profiles`` and ``model_profiles``: the fitted profile of each GPU type,
  kept per (GPU type, model) so uploads merge model by model;
- ``plans``: every applied plan with its revision (autoincrement), the plan
  JSON (`controller.solver.plan_to_dict`) and the binding of each plan GPU to a
  (node, device, gpu_type) slot.

Actual state (nodes, what runs) is not stored: it is rebuilt from the agents'
reports after a restart. Every multi-row change runs in one transaction, so a
bad request stores nothing.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.reconcile.slots import Binding
from controller.solver import Workload
from stoke.errors import StokeError

SCHEMA_VERSION = 1
#: Applied plans kept in the database (older revisions are pruned; revisions keep counting up).
KEEP_PLANS = 200

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workloads (
    name TEXT PRIMARY KEY, model TEXT NOT NULL, slo_ms REAL NOT NULL, rate_rps REAL NOT NULL,
    gpu_type TEXT, updated_unix REAL NOT NULL);
CREATE TABLE IF NOT EXISTS gpu_profiles (
    gpu_type TEXT PRIMARY KEY, gpu_json TEXT NOT NULL, uploaded_unix REAL NOT NULL);
CREATE TABLE IF NOT EXISTS model_profiles (
    gpu_type TEXT NOT NULL, model TEXT NOT NULL, model_json TEXT NOT NULL, uploaded_unix REAL NOT NULL,
    PRIMARY KEY (gpu_type, model));
CREATE TABLE IF NOT EXISTS plans (
    revision INTEGER PRIMARY KEY AUTOINCREMENT, plan_json TEXT NOT NULL, bindings_json TEXT NOT NULL,
    pending_json TEXT NOT NULL, created_unix REAL NOT NULL);
"""


class DatabaseError(StokeError, RuntimeError):
    """The database cannot be opened or has an unknown schema."""


@dataclass(frozen=True)
class StoredPlan:
    revision: int
    plan: dict[str, Any]  # plan_to_dict shape
    bindings: tuple[Binding | None, ...]  # one per plan GPU (None: no free slot was found)
    pending: tuple[tuple[str, str], ...]  # (workload, reason) not placed
    created_unix: float


@dataclass(frozen=True)
class ProfileRow:
    gpu_type: str
    model: str
    uploaded_unix: float


class Store:
    """SQLite store; thread-safe (one connection behind a lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise DatabaseError(
                    f"{self.path}: schema version {row[0]} is not {SCHEMA_VERSION}; "
                    f"use a fresh db path or an older stoke"
                )
        except sqlite3.Error as err:
            raise DatabaseError(f"{self.path}: cannot open the controller database ({err})") from None
        self._lock = threading.Lock()

    def journal_mode(self) -> str:
        with self._lock:
            return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------ workloads

    def upsert_workloads(
        self, workloads: Sequence[Workload], now: float, *, dry_run: bool = False
    ) -> tuple[list[str], list[str], list[str]]:
        """Create or update by name in one transaction; returns (created, updated, unchanged).

        `dry_run`: the same transaction, rolled back (nothing stored)."""
        created, updated, unchanged = [], [], []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for w in workloads:
                    row = self._db.execute(
                        "SELECT model, slo_ms, rate_rps, gpu_type FROM workloads WHERE name=?", (w.name,)
                    ).fetchone()
                    values = (w.model, float(w.slo_ms), float(w.rate_rps), w.gpu_type)
                    if row is None:
                        created.append(w.name)
                    elif tuple(row) == values:
                        unchanged.append(w.name)
                        continue
                    else:
                        updated.append(w.name)
                    self._db.execute(
                        "INSERT OR REPLACE INTO workloads VALUES (?, ?, ?, ?, ?, ?)", (w.name, *values, now)
                    )
                self._db.execute("ROLLBACK" if dry_run else "COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return created, updated, unchanged

    def delete_workload(self, name: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM workloads WHERE name=?", (name,))
            return cur.rowcount > 0

    def workloads(self) -> tuple[Workload, ...]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, model, slo_ms, rate_rps, gpu_type FROM workloads ORDER BY name"
            ).fetchall()
        return tuple(Workload(name=r[0], model=r[1], slo_ms=r[2], rate_rps=r[3], gpu_type=r[4]) for r in rows)

    # ------------------------------------------------------------ profiles

    def put_profile(self, gpu_type: str, gpu: dict[str, Any], models: dict[str, dict[str, Any]], now: float) -> None:
        """Store a GPU type's coefficients and upsert its models (one transaction)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO gpu_profiles VALUES (?, ?, ?)",
                    (gpu_type, json.dumps(gpu, sort_keys=True), now),
                )
                for model, data in models.items():
                    self._db.execute(
                        "INSERT OR REPLACE INTO model_profiles VALUES (?, ?, ?, ?)",
                        (gpu_type, model, json.dumps(data, sort_keys=True), now),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def profile_dicts(self) -> dict[str, dict[str, Any]]:
        """{gpu_type: {"gpu": {...}, "models": {model: {...}}}}: the stored fitted profiles."""
        with self._lock:
            gpus = self._db.execute("SELECT gpu_type, gpu_json FROM gpu_profiles ORDER BY gpu_type").fetchall()
            models = self._db.execute(
                "SELECT gpu_type, model, model_json FROM model_profiles ORDER BY gpu_type, model"
            ).fetchall()
        out: dict[str, dict[str, Any]] = {g: {"gpu": json.loads(text), "models": {}} for g, text in gpus}
        for gpu_type, model, text in models:
            if gpu_type in out:
                out[gpu_type]["models"][model] = json.loads(text)
        return out

    def profile_rows(self) -> list[ProfileRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT gpu_type, model, uploaded_unix FROM model_profiles ORDER BY model, gpu_type"
            ).fetchall()
        return [ProfileRow(*r) for r in rows]

    # ------------------------------------------------------------ plans

    def add_plan(
        self,
        plan: dict[str, Any],
        bindings: Iterable[Binding | None],
        pending: Iterable[tuple[str, str]],
        now: float,
        keep: int = KEEP_PLANS,
    ) -> int:
        """Store a new applied plan; returns its revision. Only the last `keep` revisions are kept."""
        bindings_json = json.dumps([None if b is None else [b.node_id, b.device, b.gpu_type] for b in bindings])
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute(
                    "INSERT INTO plans (plan_json, bindings_json, pending_json, created_unix) VALUES (?, ?, ?, ?)",
                    (json.dumps(plan, sort_keys=True), bindings_json, json.dumps([list(p) for p in pending]), now),
                )
                revision = int(cur.lastrowid or 0)  # AUTOINCREMENT: always set after an INSERT
                self._db.execute("DELETE FROM plans WHERE revision <= ?", (revision - keep,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return revision

    def latest_plan(self) -> StoredPlan | None:
        with self._lock:
            row = self._db.execute(
                "SELECT revision, plan_json, bindings_json, pending_json, created_unix "
                "FROM plans ORDER BY revision DESC LIMIT 1"
            ).fetchone()
        if row is None:
            return None
        bindings = tuple(None if b is None else Binding(str(b[0]), int(b[1]), str(b[2])) for b in json.loads(row[2]))
        pending = tuple((str(p[0]), str(p[1])) for p in json.loads(row[3]))
        return StoredPlan(
            revision=int(row[0]),
            plan=json.loads(row[1]),
            bindings=bindings,
            pending=pending,
            created_unix=float(row[4]),
        )

    def plan_count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM plans").fetchone()[0])
