"""Desired state of the controller in SQLite (WAL mode): the one module that imports sqlite3.

Tables
- ``workloads``: name -> model, slo_ms, rate_rps, gpu_type (the user's intent);
- ``gpu_profiles`` and ``model_profiles``: the fitted profile of each GPU type,
  kept per (GPU type, model) so uploads merge model by model;
- ``plans``: every applied plan with its revision (autoincrement), the plan
  JSON (`planner.solver.plan_to_dict`) and the binding of each plan GPU to a
  (node, device, gpu_type) slot;
- ``agent_tokens``: the current token generation of each node (`controller.identity`),
  and in ``meta`` the secret key agent tokens are signed with (created on first
  use). The database file is therefore a secret: it is created 0600;
- ``observations``: what the agents observed, one row per replica window
  (`controller.observations.ObservationRecord` as JSON, keyed by time,
  workload, model and GPU type), kept for a bounded time and row count;
- ``profile_versions`` and ``profile_state``: recalibrated versions of each
  (GPU type, model) beside the fitted one (version 0), which version is
  active and whether a rollback pinned it;
- ``measured_points``: the solo active time verify before serving measured
  at a (GPU type, model, batch, share) point, by which node and when
  (`controller.verification`); the newest per point stands, a new fit of the
  model drops them, and a later recalibrated version supersedes them;
- ``loop_events``: what the closed loop did (recalibrations, demand
  decisions, SLO guard moves, verification notes), the newest `KEEP_EVENTS`.

Actual state (nodes, what runs) is not stored: it is rebuilt from the agents'
reports after a restart. Every multi-row change runs in one transaction, so a
bad request stores nothing.

Nothing is lost silently: every call first checks that the file at `path` is
still the one that was opened (same device and inode). A database deleted or
replaced under a running controller would otherwise take every later write
into an unlinked file, gone at the next start; instead every call from then
on raises `DatabaseError` saying so. SQLite errors (a read-only file, a full
disk) come back as `DatabaseError` naming the database file. A stored
workload row that no longer passes the checks (written by an older version)
is returned apart by `workload_rows`, so it cannot stop the planning of the
others.

The store tells the truth about its disk (`health`): a failed write is
classified (``disk_full``, ``read_only``, ``corrupt``, ``io``) and kept as
`StoreHealth` until a write succeeds again (`probe_write` retries one), so the
server can say NOT_SERVING with the reason, `last_error`, a metric and an
alert. Observation windows give way first: while the database's filesystem
has less than `reserve_bytes` free, new windows are not stored and the oldest
are deleted (``observations_paused``), so the reserve stays for desired state
(workloads, plans, tokens). A damaged file ("malformed") gets its own message
pointing to `stoke controller recover`; `backup` writes an online copy with
SQLite's backup API (the controller does it every ``backup_interval_s``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controller.observations import ObservationRecord
from controller.reconcile.slots import Binding
from foundation.errors import InputError, StokeError
from foundation.names import shown
from planner.solver import Workload

log = logging.getLogger("stoke.store")

SCHEMA_VERSION = 1
#: Applied plans kept in the database (older revisions are pruned; revisions keep counting up).
KEEP_PLANS = 200
#: Recalibrated versions kept per (GPU type, model); closed-loop events kept.
KEEP_VERSIONS = 50
KEEP_EVENTS = 1000

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
CREATE TABLE IF NOT EXISTS agent_tokens (
    node_id TEXT PRIMARY KEY, generation INTEGER NOT NULL, minted_unix REAL NOT NULL);
CREATE TABLE IF NOT EXISTS plans (
    revision INTEGER PRIMARY KEY AUTOINCREMENT, plan_json TEXT NOT NULL, bindings_json TEXT NOT NULL,
    pending_json TEXT NOT NULL, created_unix REAL NOT NULL);
CREATE TABLE IF NOT EXISTS observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, unix REAL NOT NULL, workload TEXT NOT NULL, model TEXT NOT NULL,
    gpu_type TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS observations_workload ON observations (workload, id);
CREATE INDEX IF NOT EXISTS observations_model ON observations (model, gpu_type, id);
CREATE INDEX IF NOT EXISTS observations_unix ON observations (unix);
CREATE TABLE IF NOT EXISTS profile_versions (
    gpu_type TEXT NOT NULL, model TEXT NOT NULL, version INTEGER NOT NULL, model_json TEXT NOT NULL,
    meta_json TEXT NOT NULL, created_unix REAL NOT NULL, PRIMARY KEY (gpu_type, model, version));
CREATE TABLE IF NOT EXISTS profile_state (
    gpu_type TEXT NOT NULL, model TEXT NOT NULL, active INTEGER NOT NULL, pinned INTEGER NOT NULL,
    PRIMARY KEY (gpu_type, model));
CREATE TABLE IF NOT EXISTS measured_points (
    gpu_type TEXT NOT NULL, model TEXT NOT NULL, batch INTEGER NOT NULL, share_pct REAL NOT NULL,
    active_ms REAL NOT NULL, node_id TEXT NOT NULL, measured_unix REAL NOT NULL,
    PRIMARY KEY (gpu_type, model, batch, share_pct));
CREATE TABLE IF NOT EXISTS loop_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, unix REAL NOT NULL, kind TEXT NOT NULL, workload TEXT NOT NULL,
    text TEXT NOT NULL);
"""
#: Columns added to ``workloads`` after schema version 1 was first written (added when missing).
_WORKLOAD_COLUMNS = {
    "rate_auto": "INTEGER NOT NULL DEFAULT 0",
    "min_rps": "REAL",
    "max_rps": "REAL",
    # a row stored before the controller kept it was planned as Poisson
    "arrivals": "TEXT NOT NULL DEFAULT 'poisson'",
}


class DatabaseError(StokeError, RuntimeError):
    """The database cannot be opened or has an unknown schema."""

    def __init__(self, message: str, reason: str = "io") -> None:
        super().__init__(message)
        self.reason = reason  # disk_full | read_only | corrupt | io | gone


#: Reasons a write can fail, from SQLite's message: (reason, substrings).
_FAILURE_KINDS = (
    ("disk_full", ("database or disk is full", "no space left")),
    ("read_only", ("readonly database", "read-only", "attempt to write a readonly")),
    ("corrupt", ("malformed", "file is not a database", "database disk image", "file is encrypted")),
)


def failure_kind(err: BaseException) -> str:
    text = str(err).lower()
    for kind, marks in _FAILURE_KINDS:
        if any(m in text for m in marks):
            return kind
    return "io"


def advice(path: str, kind: str, action: str, err: object) -> str:
    """The message for a failed database call: what happened and what to do, per kind."""
    if kind == "disk_full" and action == "open":
        return (
            f"{path}: cannot open the controller database: the disk is full ({err}). Free space on that "
            f"filesystem, then start the controller again (nothing is lost: the database is as it was)"
        )
    if kind == "disk_full":
        return (
            f"{path}: cannot {action} the controller database: the disk is full ({err}). Free space on that "
            f"filesystem (observation windows are dropped first; writes resume by themselves once there is room)"
        )
    if kind == "read_only":
        return (
            f"{path}: cannot {action} the controller database: it is read-only ({err}); make the file and its "
            f"directory writable by the controller"
        )
    if kind == "corrupt":
        return (
            f"{path}: the controller database is damaged ({err}). Stop the controller and run `stoke controller "
            f"recover --db {path}`: it keeps the damaged file aside, restores the newest good backup (the "
            f"node-token key with it) or salvages what is readable; see the README, 'Store recovery'"
        )
    return (
        f"{path}: cannot {action} the controller database ({err}); check that the file and its directory are "
        f"writable by the controller and the disk has room"
    )


@dataclass(frozen=True)
class StoreHealth:
    """Whether the store can write; `reason` names the cause when it cannot (or when windows are paused)."""

    ok: bool = True
    reason: str = ""  # disk_full | read_only | corrupt | io | gone | observations_paused
    error: str = ""
    since_unix: float = 0.0
    failures: int = 0  # failed calls since the store opened
    free_bytes: int | None = None


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
    active_version: int = 0  # 0: the fitted profile
    pinned: bool = False  # a rollback pinned it: recalibration leaves this (GPU type, model) alone
    versions: int = 0  # recalibrated versions kept
    correction: float = 1.0  # k_act factor of the active version (1: none)


@dataclass(frozen=True)
class ProfileVersionRow:
    """A recalibrated version (>= 1) of one model's coefficients on one GPU type."""

    gpu_type: str
    model: str
    version: int
    model_json: dict[str, Any]
    meta: dict[str, Any]  # mode, factors, evidence, reason
    created_unix: float


@dataclass(frozen=True)
class LoopEvent:
    unix: float
    kind: str  # recalibration | demand | guard | rollback
    workload: str  # "" for events of a (model, GPU type)
    text: str


class Store:
    """SQLite store; thread-safe (one connection behind a lock)."""

    def __init__(self, path: str | Path, reserve_bytes: int = 64 * 2**20) -> None:
        """`reserve_bytes`: free space kept for desired state; below it observation windows are not stored
        (at most a quarter of the filesystem, so a small volume still stores some)."""
        self.path = str(path)
        self.reserve_bytes = reserve_bytes
        if self.path != ":memory:":
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                # it holds the key agent tokens are signed with: readable by the controller's user only
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            except OSError as err:
                raise DatabaseError(
                    f"{self.path}: cannot open the controller database for writing ({err.strerror}); make the file "
                    f"and its directory writable by the controller, or point db at another path"
                ) from None
        self._db = self._connect()
        self._lock = threading.Lock()
        self._identity = self._file_identity()
        self._broken = ""  # why every call fails from now on ("" = fine)
        self._failure: tuple[str, str, float] | None = None  # (reason, message, since) of the last failed write
        self._failures = 0
        self._paused = ""  # why observation windows are not stored ("" = they are)
        # the last read's workloads by stored row: an unchanged row is the same Workload, not checked again
        # (building and checking 10,000 of them took 150-200 ms of every re-plan)
        self._workloads_by_row: dict[tuple[Any, ...], Workload] = {}
        # the workload rows of the last read by name (in name order), read again in full when another
        # connection committed (SQLite's data_version) and otherwise only for the names written through
        # this store since (`_written`): a re-plan after one apply reads one row, not 10,000
        self._rows_by_name: dict[Any, tuple[Any, ...]] | None = None
        self._rows_read_at: tuple[int, int] | None = None  # (connection, data_version) of that read
        self._written: set[str] = set()

    def _connect(self) -> sqlite3.Connection:
        """Open the database, create or migrate its schema and check it; a failure says why and what to do,
        and closes what it opened (a damaged file or an unknown schema leaves no connection behind)."""
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
            self._prepare(db)
            return db
        except BaseException as err:
            if db is not None:
                db.close()
            if not isinstance(err, sqlite3.Error):
                raise
            kind = self._failure_kind(err)
            raise DatabaseError(
                advice(self.path, kind, "open", err)
                if kind != "io"
                else f"{self.path}: cannot open the controller database ({err})",
                kind,
            ) from None

    def _prepare(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        have = {r[1] for r in db.execute("PRAGMA table_info(workloads)").fetchall()}
        for column, decl in _WORKLOAD_COLUMNS.items():
            if column not in have:
                db.execute(f"ALTER TABLE workloads ADD COLUMN {column} {decl}")
        damage = _quick_check_summary(db)
        if damage != "ok":
            raise DatabaseError(advice(self.path, "corrupt", "open", damage), "corrupt")
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise DatabaseError(
                f"{self.path}: schema version {row[0]} is not {SCHEMA_VERSION}; use a fresh db path or an older stoke"
            )

    def _failure_kind(self, err: sqlite3.Error) -> str:
        """`failure_kind`, and "disk_full" for SQLite's bare "disk I/O error" on a filesystem with no room left
        (at open SQLite cannot even make its WAL index)."""
        kind = failure_kind(err)
        free = self.free_bytes()
        return "disk_full" if kind == "io" and free is not None and free < 2**20 else kind

    def _file_identity(self) -> tuple[int, int] | None:
        if self.path == ":memory:":
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return (-1, -1)
        return (st.st_dev, st.st_ino)

    def check(self) -> None:
        """Raise `DatabaseError` when the file was deleted or replaced since it was opened."""
        with self._lock:
            self._check()

    def _check(self) -> None:
        if self._broken:
            raise DatabaseError(self._broken)
        if self._identity is None:
            return
        now = self._file_identity()
        if now != self._identity:
            what = "deleted" if now == (-1, -1) else "replaced by another file"
            self._broken = (
                f"{self.path}: the controller database was {what} while the controller ran; it refuses every "
                f"read and write from now on, since they would go to the old, unlinked file and be lost at the "
                f"next start. Put the file back (or restore it from a backup) and restart the controller"
            )
            raise DatabaseError(self._broken)

    @contextmanager
    def _use(self, action: str) -> Iterator[sqlite3.Connection]:
        """The connection under the lock, after the file check; SQLite errors become `DatabaseError`."""
        with self._lock:
            try:
                self._check()
            except DatabaseError as err:
                self._failed("gone", str(err))
                raise
            try:
                yield self._db
            except sqlite3.Error as err:
                kind = self._failure_kind(err)
                message = advice(self.path, kind, action, err)
                if action == "write" or kind == "corrupt":
                    self._failed(kind, message)
                raise DatabaseError(message, kind) from None
            if action == "write" and self._failure is not None and self._room_again():
                self._failure = None

    def _room_again(self) -> bool:
        """Whether a failure may be cleared: a full disk needs real room back (a quarter of the reserve), not
        just one small write that fit into a freed page, or health would flap while the disk is still full."""
        if self._failure is None or self._failure[0] != "disk_full":
            return True
        free = self.free_bytes()
        return free is None or free >= self._reserve() // 4

    def _failed(self, kind: str, message: str) -> None:
        self._failures += 1
        if self._failure is None or self._failure[0] != kind:
            self._failure = (kind, message, time.time())

    def free_bytes(self) -> int | None:
        """Free bytes on the database's filesystem (None: in memory or unknown)."""
        if self.path == ":memory:":
            return None
        try:
            st = os.statvfs(Path(self.path).parent)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def _reserve(self) -> int:
        try:
            st = os.statvfs(Path(self.path).parent)
        except OSError:
            return self.reserve_bytes
        return min(self.reserve_bytes, st.f_blocks * st.f_frsize // 4)

    def health(self) -> StoreHealth:
        """Can the store write? The last failure (until a write succeeds), else the observation pause."""
        with self._lock:
            failure, paused, failures = self._failure, self._paused, self._failures
        free = self.free_bytes()
        if failure is not None:
            return StoreHealth(False, failure[0], failure[1], failure[2], failures, free)
        if paused:
            return StoreHealth(True, "observations_paused", paused, 0.0, failures, free)
        return StoreHealth(True, "", "", 0.0, failures, free)

    def probe_write(self) -> bool:
        """One small write (to `meta`): True when writes work; clears a failure once the cause is gone."""
        with self._lock:
            if not self._room_again():
                return False
        try:
            with self._use("write") as db:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('probe_unix', ?)", (repr(time.time()),))
            return True
        except DatabaseError:
            return False

    def integrity(self) -> str:
        """'ok', or what SQLite's quick_check says is wrong (a damaged file)."""
        try:
            with self._use("read") as db:
                return _quick_check_summary(db)
        except DatabaseError as err:
            return str(err)

    def backup(self, dest: str | Path) -> Path:
        """An online, consistent copy of the database at `dest` (SQLite's backup API; writers wait only for
        the pages being copied), written to a temporary name and renamed; 0600 like the database."""
        dest = Path(dest)
        tmp = dest.with_name(dest.name + ".tmp")
        tmp.unlink(missing_ok=True)
        os.close(os.open(tmp, os.O_RDWR | os.O_CREAT, 0o600))
        target = sqlite3.connect(str(tmp))
        try:
            with self._use("read") as db:
                db.backup(target, pages=1024)
            target.close()
            os.replace(tmp, dest)
        except (sqlite3.Error, OSError, DatabaseError) as err:  # DatabaseError: `_use`'s (a deleted file, ...)
            target.close()
            tmp.unlink(missing_ok=True)  # a partial copy must not stay behind (on a full disk it eats the room)
            kind = err.reason if isinstance(err, DatabaseError) else failure_kind(err)
            raise DatabaseError(f"{self.path}: backup to {dest} failed ({err})", kind) from None
        return dest

    def _transaction(self, db: sqlite3.Connection, commit: bool = True) -> Any:
        """BEGIN IMMEDIATE ... COMMIT (ROLLBACK when not `commit`: a dry run), rolled back on any error."""
        return _Transaction(db, commit)

    def journal_mode(self) -> str:
        with self._use("read") as db:
            return str(db.execute("PRAGMA journal_mode").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._broken = self._broken or f"{self.path}: the controller database is closed"

    # ------------------------------------------------------------ workloads

    def upsert_workloads(
        self, workloads: Sequence[Workload], now: float, *, dry_run: bool = False
    ) -> tuple[list[str], list[str], list[str]]:
        """Create or update by name in one transaction; returns (created, updated, unchanged).

        `dry_run`: the same transaction, rolled back (nothing stored)."""
        created, updated, unchanged = [], [], []
        with self._use("write") as db, self._transaction(db, commit=not dry_run):
            self._written.update(w.name for w in workloads)  # before writing: a row read again is never wrong
            for w in workloads:
                row = db.execute(
                    "SELECT model, slo_ms, rate_rps, gpu_type, rate_auto, min_rps, max_rps, arrivals FROM workloads "
                    "WHERE name=?",
                    (w.name,),
                ).fetchone()
                rate = float(w.rate_rps)
                if w.rate_auto and row is not None and row[4]:
                    # an auto workload keeps the rate its demand tracker plans for (within the new bounds)
                    rate = min(max(float(row[2]), w.min_rps or 0.0), w.max_rps or math.inf)
                values = (
                    w.model,
                    float(w.slo_ms),
                    rate,
                    w.gpu_type,
                    int(w.rate_auto),
                    w.min_rps,
                    w.max_rps,
                    w.arrivals,
                )
                if row is None:
                    created.append(w.name)
                elif tuple(row) == values:
                    unchanged.append(w.name)
                    continue
                else:
                    updated.append(w.name)
                db.execute(
                    "INSERT OR REPLACE INTO workloads (name, model, slo_ms, rate_rps, gpu_type, rate_auto, min_rps, "
                    "max_rps, arrivals, updated_unix) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (w.name, *values, now),
                )
        return created, updated, unchanged

    def delete_workload(self, name: str) -> bool:
        with self._use("write") as db:
            self._written.add(name)
            cur = db.execute("DELETE FROM workloads WHERE name=?", (name,))
            return cur.rowcount > 0

    def has_workload(self, name: str) -> bool:
        with self._use("read") as db:
            return db.execute("SELECT 1 FROM workloads WHERE name=?", (name,)).fetchone() is not None

    def workloads(self) -> tuple[Workload, ...]:
        """The stored workloads that pass the checks (see `workload_rows`)."""
        return self.workload_rows()[0]

    def workload_rows(self) -> tuple[tuple[Workload, ...], tuple[tuple[str, str], ...]]:
        """(the stored workloads, [(name as shown, why)] of the rows that fail today's checks)."""
        with self._use("read") as db:
            rows = self._read_workload_rows(db)
        good, bad = [], []
        known, by_row = self._workloads_by_row, {}
        for r in rows:  # tuples: a row is its own key
            workload = known.get(r)
            if workload is not None:
                good.append(workload)
                by_row[r] = workload
                continue
            try:
                workload = Workload(
                    name=r[0],
                    model=r[1],
                    slo_ms=r[2],
                    rate_rps=r[3],
                    gpu_type=r[4],
                    rate_auto=bool(r[5]),
                    min_rps=r[6],
                    max_rps=r[7],
                    arrivals=r[8],
                )
                good.append(workload)
                by_row[r] = workload
            except InputError as err:
                bad.append(
                    (
                        r[0] if isinstance(r[0], str) and r[0].isprintable() and len(r[0]) <= 200 else shown(r[0]),
                        f"the stored row fails the checks ({err}); apply it again with valid fields or "
                        f"delete it (`stoke workload rm`)",
                    )
                )
        self._workloads_by_row = by_row  # only the rows stored now: a deleted workload is forgotten
        return tuple(good), tuple(bad)

    _WORKLOAD_COLUMNS = "name, model, slo_ms, rate_rps, gpu_type, rate_auto, min_rps, max_rps, arrivals"

    def _read_workload_rows(self, db: sqlite3.Connection) -> list[tuple[Any, ...]]:
        """Every workload row in name order: the last read's, with the rows written since read again (see
        `_rows_by_name`); all of them when another connection wrote, or a name was added."""
        read_at = (id(db), db.execute("PRAGMA data_version").fetchone()[0])
        written, self._written = self._written, set()
        rows = self._rows_by_name
        if rows is not None and read_at == self._rows_read_at and len(written) <= 500:
            names = sorted(written)
            fresh = {
                r[0]: r
                for r in db.execute(
                    f"SELECT {self._WORKLOAD_COLUMNS} FROM workloads WHERE name IN ({','.join('?' * len(names))})",
                    names,
                ).fetchall()
            }
            if set(fresh) <= set(rows):  # updated or deleted rows keep the order; a new name needs a full read
                for name in names:
                    if name in fresh:
                        rows[name] = fresh[name]
                    else:
                        rows.pop(name, None)
                return list(rows.values())
        listed = db.execute(f"SELECT {self._WORKLOAD_COLUMNS} FROM workloads ORDER BY name").fetchall()
        self._rows_by_name, self._rows_read_at = {r[0]: r for r in listed}, read_at
        return listed

    def set_planned_rate(self, name: str, rate_rps: float, now: float) -> bool:
        """The demand tracker's new planning rate of an auto workload; False when it is gone or not auto."""
        with self._use("write") as db:
            self._written.add(name)
            cur = db.execute(
                "UPDATE workloads SET rate_rps=?, updated_unix=? WHERE name=? AND rate_auto=1",
                (float(rate_rps), now, name),
            )
            return cur.rowcount > 0

    # ------------------------------------------------------------ profiles

    def put_profile(self, gpu_type: str, gpu: dict[str, Any], models: dict[str, dict[str, Any]], now: float) -> None:
        """Store a GPU type's coefficients and upsert its models (one transaction)."""
        with self._use("write") as db, self._transaction(db):
            db.execute(
                "INSERT OR REPLACE INTO gpu_profiles VALUES (?, ?, ?)",
                (gpu_type, json.dumps(gpu, sort_keys=True), now),
            )
            for model, data in models.items():
                text = json.dumps(data, sort_keys=True)
                before = db.execute(
                    "SELECT model_json FROM model_profiles WHERE gpu_type=? AND model=?", (gpu_type, model)
                ).fetchone()
                db.execute("INSERT OR REPLACE INTO model_profiles VALUES (?, ?, ?, ?)", (gpu_type, model, text, now))
                if before is not None and before[0] != text:
                    # a new fit is the new truth: its coefficients are active, recalibration starts over, and
                    # verification measures its chosen points again
                    db.execute("DELETE FROM profile_state WHERE gpu_type=? AND model=?", (gpu_type, model))
                    db.execute("DELETE FROM measured_points WHERE gpu_type=? AND model=?", (gpu_type, model))

    def profile_dicts(self) -> dict[str, dict[str, Any]]:
        """{gpu_type: {"gpu": {...}, "models": {model: {...}}}}: the stored fitted profiles."""
        with self._use("read") as db:
            gpus = db.execute("SELECT gpu_type, gpu_json FROM gpu_profiles ORDER BY gpu_type").fetchall()
            models = db.execute(
                "SELECT gpu_type, model, model_json FROM model_profiles ORDER BY gpu_type, model"
            ).fetchall()
        out: dict[str, dict[str, Any]] = {g: {"gpu": json.loads(text), "models": {}} for g, text in gpus}
        for gpu_type, model, text in models:
            if gpu_type in out:
                out[gpu_type]["models"][model] = json.loads(text)
        return out

    def profile_rows(self) -> list[ProfileRow]:
        with self._use("read") as db:
            rows = db.execute(
                "SELECT m.gpu_type, m.model, m.uploaded_unix, COALESCE(s.active, 0), COALESCE(s.pinned, 0), "
                "(SELECT COUNT(*) FROM profile_versions v WHERE v.gpu_type=m.gpu_type AND v.model=m.model), "
                "(SELECT meta_json FROM profile_versions v WHERE v.gpu_type=m.gpu_type AND v.model=m.model "
                "AND v.version=s.active) "
                "FROM model_profiles m LEFT JOIN profile_state s ON s.gpu_type=m.gpu_type AND s.model=m.model "
                "ORDER BY m.model, m.gpu_type"
            ).fetchall()
        return [
            ProfileRow(
                r[0], r[1], r[2], int(r[3]), bool(r[4]), int(r[5]), float(json.loads(r[6])["factor"]) if r[6] else 1.0
            )
            for r in rows
        ]

    # ------------------------------------------------------------ recalibrated profile versions

    def add_profile_version(
        self, gpu_type: str, model: str, model_json: dict[str, Any], meta: dict[str, Any], now: float
    ) -> int:
        """Store a recalibrated version and make it active (unless a rollback pinned the pair); returns it.
        Only the newest `KEEP_VERSIONS` are kept (and always the active one)."""
        with self._use("write") as db, self._transaction(db):
            row = db.execute(
                "SELECT MAX(version) FROM profile_versions WHERE gpu_type=? AND model=?", (gpu_type, model)
            ).fetchone()
            version = int(row[0] or 0) + 1
            db.execute(
                "INSERT INTO profile_versions VALUES (?, ?, ?, ?, ?, ?)",
                (gpu_type, model, version, json.dumps(model_json, sort_keys=True), json.dumps(meta), now),
            )
            state = db.execute(
                "SELECT pinned FROM profile_state WHERE gpu_type=? AND model=?", (gpu_type, model)
            ).fetchone()
            if state is None or not state[0]:
                db.execute("INSERT OR REPLACE INTO profile_state VALUES (?, ?, ?, 0)", (gpu_type, model, version))
            db.execute(
                "DELETE FROM profile_versions WHERE gpu_type=? AND model=? AND version<=? AND version NOT IN "
                "(SELECT active FROM profile_state WHERE gpu_type=? AND model=?)",
                (gpu_type, model, version - KEEP_VERSIONS, gpu_type, model),
            )
        return version

    def profile_versions(self, model: str = "") -> list[ProfileVersionRow]:
        with self._use("read") as db:
            rows = db.execute(
                "SELECT gpu_type, model, version, model_json, meta_json, created_unix FROM profile_versions "
                "WHERE ?='' OR model=? ORDER BY model, gpu_type, version",
                (model, model),
            ).fetchall()
        return [ProfileVersionRow(r[0], r[1], int(r[2]), json.loads(r[3]), json.loads(r[4]), float(r[5])) for r in rows]

    def profile_state(self) -> dict[tuple[str, str], tuple[int, bool]]:
        """{(gpu_type, model): (active version, pinned)} for pairs that ever left the fitted profile."""
        with self._use("read") as db:
            rows = db.execute("SELECT gpu_type, model, active, pinned FROM profile_state").fetchall()
        return {(r[0], r[1]): (int(r[2]), bool(r[3])) for r in rows}

    def set_profile_state(self, gpu_type: str, model: str, version: int, pinned: bool) -> None:
        """Make `version` active (0: the fitted profile) and pin it or not; KeyError when the version is unknown."""
        with self._use("write") as db:
            if (
                version
                and not db.execute(
                    "SELECT 1 FROM profile_versions WHERE gpu_type=? AND model=? AND version=?",
                    (gpu_type, model, version),
                ).fetchone()
            ):
                raise KeyError(version)
            db.execute(
                "INSERT OR REPLACE INTO profile_state VALUES (?, ?, ?, ?)", (gpu_type, model, version, int(pinned))
            )

    def active_model_dicts(self) -> dict[tuple[str, str], dict[str, Any]]:
        """{(gpu_type, model): coefficients} of every active recalibrated version."""
        with self._use("read") as db:
            rows = db.execute(
                "SELECT v.gpu_type, v.model, v.model_json FROM profile_versions v JOIN profile_state s "
                "ON s.gpu_type=v.gpu_type AND s.model=v.model AND s.active=v.version"
            ).fetchall()
        return {(r[0], r[1]): json.loads(r[2]) for r in rows}

    # ------------------------------------------------------------ verify before serving

    def add_measured_points(self, points: Sequence[tuple[str, str, int, float, float, str]], now: float) -> None:
        """Store measured points (gpu_type, model, batch, share %, solo active ms, node id) in one transaction;
        the newest measurement of a point stands (one superseded by a recalibration is measured again)."""
        with self._use("write") as db, self._transaction(db):
            db.executemany(
                "INSERT OR REPLACE INTO measured_points VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (gpu_type, model, int(batch), round(float(share), 6), float(active), node, now)
                    for gpu_type, model, batch, share, active, node in points
                ],
            )

    def measured_points(self) -> dict[tuple[str, str], dict[tuple[int, float], float]]:
        """{(gpu_type, model): {(batch, share %): solo active ms}} of the stored measured points that count: a
        point measured before the active recalibrated version of its model was made is superseded by it (the
        closed loop saw the model change since; verification measures the point again when it is wanted)."""
        with self._use("read") as db:
            rows = db.execute(
                "SELECT m.gpu_type, m.model, m.batch, m.share_pct, m.active_ms FROM measured_points m "
                "LEFT JOIN profile_state s ON s.gpu_type=m.gpu_type AND s.model=m.model "
                "LEFT JOIN profile_versions v ON v.gpu_type=s.gpu_type AND v.model=s.model AND v.version=s.active "
                "WHERE v.created_unix IS NULL OR m.measured_unix > v.created_unix"
            ).fetchall()
        out: dict[tuple[str, str], dict[tuple[int, float], float]] = {}
        for gpu_type, model, batch, share, active in rows:
            out.setdefault((gpu_type, model), {})[(int(batch), float(share))] = float(active)
        return out

    # ------------------------------------------------------------ observations

    def add_observations(
        self, records: Sequence[ObservationRecord], retention_s: float, max_rows: int, now: float
    ) -> list[ObservationRecord]:
        """Store windows (one transaction); returns them with their row ids. Windows older than
        `retention_s`, and the oldest beyond `max_rows`, are deleted on the way."""
        if not records:
            return []
        free, reserve = self.free_bytes(), self._reserve()
        if free is not None and free < reserve:
            # the reserve is for desired state: store no window, and give back the oldest tenth of them
            paused = (
                f"observation windows are not stored: {free // 2**20} MiB free on the database's filesystem, "
                f"below the {reserve // 2**20} MiB kept for desired state; the oldest windows are being deleted"
            )
            with self._lock:
                first = not self._paused
                self._paused = paused
            try:
                with self._use("write") as db:
                    count = int(db.execute("SELECT COUNT(*) FROM observations").fetchone()[0])
                    db.execute(
                        "DELETE FROM observations WHERE id IN (SELECT id FROM observations ORDER BY id LIMIT ?)",
                        (max(1, count // 10),),
                    )
            except DatabaseError:
                pass  # recorded by _use; the windows are dropped either way
            if first:
                log.warning("%s", paused)
            return []
        with self._lock:
            self._paused = ""
        out = []
        with self._use("write") as db, self._transaction(db):
            for r in records:
                cur = db.execute(
                    "INSERT INTO observations (unix, workload, model, gpu_type, data) VALUES (?, ?, ?, ?, ?)",
                    (r.unix, r.workload, r.model, r.gpu_type, json.dumps(r.to_dict())),
                )
                out.append(replace(r, id=int(cur.lastrowid or 0)))
            db.execute("DELETE FROM observations WHERE unix < ?", (now - retention_s,))
            db.execute("DELETE FROM observations WHERE id <= ?", (out[-1].id - max_rows,))
        return out

    def observations(
        self, workload: str = "", limit: int = 100, model: str = "", gpu_type: str = "", since_unix: float = 0.0
    ) -> list[ObservationRecord]:
        """Stored windows, newest first: of one workload, or of one (model, GPU type), or all; at most `limit`."""
        where: list[str] = ["unix >= ?"]
        args: list[Any] = [since_unix]
        if workload:
            where.append("workload = ?")
            args.append(workload)
        if model:
            where += ["model = ?", "gpu_type = ?"]
            args += [model, gpu_type]
        with self._use("read") as db:
            rows = db.execute(
                f"SELECT id, data FROM observations WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?",
                (*args, int(limit)),
            ).fetchall()
        return [ObservationRecord.from_dict(json.loads(data), int(row_id)) for row_id, data in rows]

    def observation_count(self) -> int:
        with self._use("read") as db:
            return int(db.execute("SELECT COUNT(*) FROM observations").fetchone()[0])

    # ------------------------------------------------------------ closed-loop events

    def add_event(self, kind: str, workload: str, text: str, now: float) -> None:
        with self._use("write") as db:
            cur = db.execute(
                "INSERT INTO loop_events (unix, kind, workload, text) VALUES (?, ?, ?, ?)", (now, kind, workload, text)
            )
            db.execute("DELETE FROM loop_events WHERE id <= ?", (int(cur.lastrowid or 0) - KEEP_EVENTS,))

    def events(self, limit: int = 20, kind: str = "") -> list[LoopEvent]:
        """The newest `limit` events (of one kind, or all), oldest first."""
        with self._use("read") as db:
            rows = db.execute(
                "SELECT unix, kind, workload, text FROM loop_events WHERE ?='' OR kind=? ORDER BY id DESC LIMIT ?",
                (kind, kind, int(limit)),
            ).fetchall()
        return [LoopEvent(float(r[0]), r[1], r[2], r[3]) for r in reversed(rows)]

    # ------------------------------------------------------------ agent credentials

    def agent_key(self) -> bytes:
        """The secret agent tokens are signed with; created on first use."""
        with self._use("write") as db, self._transaction(db):
            row = db.execute("SELECT value FROM meta WHERE key='agent_key'").fetchone()
            if row is None:
                row = (secrets.token_hex(32),)
                db.execute("INSERT INTO meta VALUES ('agent_key', ?)", row)
        return bytes.fromhex(row[0])

    def token_generations(self) -> dict[str, int]:
        with self._use("read") as db:
            return {str(n): int(g) for n, g in db.execute("SELECT node_id, generation FROM agent_tokens")}

    def next_token_generation(self, node_id: str, now: float) -> int:
        """Start a new token generation for `node_id` (revoking the one before); returns it."""
        with self._use("write") as db, self._transaction(db):
            row = db.execute("SELECT generation FROM agent_tokens WHERE node_id=?", (node_id,)).fetchone()
            generation = (int(row[0]) if row else 0) + 1
            db.execute("INSERT OR REPLACE INTO agent_tokens VALUES (?, ?, ?)", (node_id, generation, now))
        return generation

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
        with self._use("write") as db, self._transaction(db):
            cur = db.execute(
                "INSERT INTO plans (plan_json, bindings_json, pending_json, created_unix) VALUES (?, ?, ?, ?)",
                (json.dumps(plan, sort_keys=True), bindings_json, json.dumps([list(p) for p in pending]), now),
            )
            revision = int(cur.lastrowid or 0)  # AUTOINCREMENT: always set after an INSERT
            db.execute("DELETE FROM plans WHERE revision <= ?", (revision - keep,))
        return revision

    def latest_plan(self) -> StoredPlan | None:
        """The last applied plan; `DatabaseError` naming the revision when its row cannot be read."""
        with self._use("read") as db:
            row = db.execute(
                "SELECT revision, plan_json, bindings_json, pending_json, created_unix "
                "FROM plans ORDER BY revision DESC LIMIT 1"
            ).fetchone()
        if row is None:
            return None
        try:
            plan = json.loads(row[1])
            bindings = tuple(
                None if b is None else Binding(str(b[0]), int(b[1]), str(b[2])) for b in json.loads(row[2])
            )
            pending = tuple((str(p[0]), str(p[1])) for p in json.loads(row[3]))
            if not isinstance(plan, dict):
                raise TypeError(f"the plan is a JSON {type(plan).__name__}, not an object")
            return StoredPlan(
                revision=int(row[0]), plan=plan, bindings=bindings, pending=pending, created_unix=float(row[4])
            )
        except (ValueError, TypeError, IndexError, KeyError, RecursionError) as err:
            raise DatabaseError(
                f"{self.path}: stored plan revision {row[0]} cannot be read ({type(err).__name__}: "
                f"{shown(str(err), 200)})"
            ) from None

    def plan_count(self) -> int:
        with self._use("read") as db:
            return int(db.execute("SELECT COUNT(*) FROM plans").fetchone()[0])


class _Transaction:
    """BEGIN IMMEDIATE on enter; COMMIT on a clean exit, ROLLBACK on any error."""

    def __init__(self, db: sqlite3.Connection, commit: bool = True) -> None:
        self.db = db
        self.commit = commit

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is None:
            self.db.execute("COMMIT" if self.commit else "ROLLBACK")
        else:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass


class BackupSchedule:
    """Online backups every `interval_s` into `directory` (`Store.backup`), the newest `keep` kept.

    Named ``stoke-controller-YYYYmmddTHHMMSSZ.db`` (UTC), 0600 like the database (they hold the node-token key).
    A backup that would eat into the store's reserve is skipped (and said so), not written."""

    PATTERN = "stoke-controller-*.db"

    def __init__(self, store: Store, directory: str | Path, interval_s: float, keep: int) -> None:
        self.store, self.directory, self.interval_s, self.keep = store, Path(directory), interval_s, keep
        self.last_unix = 0.0  # last attempt
        self.last_ok_unix = 0.0
        self.last_error = ""

    def maybe_run(self, now: float) -> Path | None:
        if self.interval_s <= 0 or self.store.path == ":memory:" or now - self.last_unix < self.interval_s:
            return None
        self.last_unix = now
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            size = os.stat(self.store.path).st_size
            free = self.store.free_bytes()
            if free is not None and free - size < self.store._reserve():
                raise DatabaseError(
                    f"skipped: {free // 2**20} MiB free, the copy ({size // 2**20} MiB) would eat into "
                    f"the space kept for desired state",
                    "disk_full",
                )
            damage = self.store.integrity()
            if damage != "ok":  # never rotate good backups out for a copy of a damaged file
                self.store._failed("corrupt", advice(self.store.path, "corrupt", "check", damage))
                raise DatabaseError(f"skipped: the database fails its integrity check ({damage})", "corrupt")
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
            path = self.store.backup(self.directory / f"stoke-controller-{stamp}.db")
        except (DatabaseError, OSError) as err:
            self.last_error = f"backup to {self.directory}: {err}"
            log.warning("%s", self.last_error)
            return None
        for old in sorted(self.directory.glob(self.PATTERN))[: -self.keep]:
            old.unlink(missing_ok=True)
        self.last_ok_unix, self.last_error = now, ""
        return path


def newest_backups(directory: str | Path) -> list[Path]:
    """Backups in `directory`, newest first."""
    return sorted(Path(directory).glob(BackupSchedule.PATTERN), reverse=True)


@dataclass(frozen=True)
class Recovery:
    action: str  # sound | restored | salvaged
    kept_aside: str = ""  # where the damaged file went
    source: str = ""  # the backup restored
    lost: tuple[str, ...] = ()  # what could not be carried over
    notes: tuple[str, ...] = ()


def _quick_check(path: Path) -> str:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            summary = _quick_check_summary(db)
            db.execute("SELECT value FROM meta WHERE key='agent_key'").fetchone()
        finally:
            db.close()
    except sqlite3.Error as err:
        return str(err)
    return summary


def _quick_check_summary(db: sqlite3.Connection) -> str:
    """'ok', or the first five problems SQLite's quick_check finds."""
    return "; ".join(str(r[0]) for r in db.execute("PRAGMA quick_check").fetchall()[:5])


def recover(db_path: str | Path, backup_dir: str | Path | None = None, now: float | None = None) -> Recovery:
    """Bring a damaged controller database back (the controller must be stopped).

    1. A database that passes SQLite's quick_check is left alone (``sound``).
    2. Else the damaged file (and its -wal/-shm) is renamed ``DB.damaged-STAMP`` (kept, never deleted).
    3. The newest backup in `backup_dir` (default ``DB.backups``) that passes quick_check is copied in place
       (``restored``): the node-token key comes with it, so agents' tokens keep working; what changed after
       the backup (applies, tokens minted or revoked) must be done again.
    4. Without a good backup, every table is read row by row from the damaged file into a fresh database
       (``salvaged``); tables that cannot be read are listed in `lost`. When the key cannot be read, a new one
       is made and every agent needs a new token (`stoke token agent NODE`).
    A missing database is restored from the newest good backup; with none, `DatabaseError` (nothing is made)."""
    db = Path(db_path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    if db.exists() and _quick_check(db) == "ok":
        return Recovery("sound")
    directory = Path(backup_dir) if backup_dir else Path(f"{db}.backups")
    good = next((c for c in newest_backups(directory) if _quick_check(c) == "ok"), None)
    if not db.exists() and good is None:  # a mistyped path must not become a fresh database with a new key
        raise DatabaseError(
            f"{db}: no database there and no good backup in {directory}: nothing to recover; check --db (or the "
            f"config's db) and backup_dir",
            "gone",
        )
    aside = db.with_name(f"{db.name}.damaged-{stamp}") if db.exists() else None
    for suffix in ("", "-wal", "-shm") if aside is not None else ():
        part = Path(f"{db}{suffix}")
        if part.exists():
            os.replace(part, Path(f"{aside}{suffix}"))
    if good is not None:
        tmp = db.with_name(db.name + ".restoring")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # 0600 from the start: it holds the key
        with os.fdopen(fd, "wb") as out, open(good, "rb") as source:
            shutil.copyfileobj(source, out)
        os.replace(tmp, db)
        return Recovery(
            "restored",
            str(aside or ""),
            str(good),
            notes=(
                "changes made after this backup are lost: apply your workloads again",
                "node tokens minted or revoked after it: mint or revoke them again (the signing key is the "
                "backup's, so tokens minted before it keep working)",
            ),
        )
    assert aside is not None  # no backup and no file was refused above
    return _salvage(aside, db)


def _salvage(damaged: Path, db: Path) -> Recovery:
    fresh = Store(db)  # the schema, 0600
    lost: list[str] = []
    notes: list[str] = []
    try:
        source = sqlite3.connect(f"file:{damaged}?mode=ro", uri=True)
    except sqlite3.Error as err:
        fresh.close()
        return Recovery("salvaged", str(damaged), lost=(f"everything: the damaged file cannot be opened ({err})",))
    with fresh._lock:
        target = fresh._db
        for (table,) in target.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        ):
            try:
                columns = [r[1] for r in target.execute(f"PRAGMA table_info({table})")]
                names = ", ".join(columns)
                rows = source.execute(f"SELECT {names} FROM {table}").fetchall()
            except sqlite3.Error as err:
                lost.append(f"table {table} ({err})")
                continue
            marks = ", ".join("?" for _ in columns)
            target.executemany(f"INSERT OR REPLACE INTO {table} ({names}) VALUES ({marks})", rows)
        if target.execute("SELECT 1 FROM meta WHERE key='agent_key'").fetchone() is None:
            notes.append(
                "the node-token key was not readable: a new one is made; give every agent a new token "
                "(`stoke token agent NODE`)"
            )
    source.close()
    fresh.close()
    return Recovery("salvaged", str(damaged), lost=tuple(lost), notes=tuple(notes))
