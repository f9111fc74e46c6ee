"""The catalog's unit of work: definitions, relation versions, log segments, watermarks, runs, leases.

Publishing is one SQL transaction (docs/design.md §3): it records the new layers of every refreshed
relation, moves their current-version pointers and advances watermarks. It checks that every relation
is still at the version the run read, so a run that lost its lease can never overwrite newer work.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, delete, event, func, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ivm.catalog.models import (
    AppliedProject,
    Layer,
    Lease,
    LogSegment,
    QuarantinedCommit,
    Relation,
    RelationVersion,
    Run,
    RunStage,
    TableDef,
    Validation,
    VersionLayer,
    ViewDef,
    Watermark,
    utcnow,
)
from ivm.errors import CatalogError, ChangeDataError, LeaseError, NotFoundError, one_line
from ivm.vocabulary import Form, LayerKind, RelationKind, RunStatus, StageName

log = logging.getLogger(__name__)

#: the newest migration in `MIGRATIONS` (tests/unit/test_catalog.py checks it against Alembic's head)
HEAD_REVISION = "0008"
MIGRATIONS = Path(__file__).with_name("migrations")


def aware(dt: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every time the catalog writes is UTC."""
    if dt is not None and dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt


def mask_url(url: str) -> str:
    """A catalog URL fit for logs and messages: the password replaced by ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown without anything after '@'
        return url.split("@")[-1]


@dataclass(frozen=True)
class LayerRef:
    id: str
    kind: str
    path: str
    rows: int | None
    bytes: int | None


@dataclass(frozen=True)
class RelationState:
    """A relation's current version as a run reads it: the layers to scan, in order."""

    name: str
    version_id: int | None
    version: int
    layers: tuple[LayerRef, ...] = ()
    created_at: datetime | None = None
    #: how the tuples are stored (RelationVersion.form)
    form: Form = Form.COUNTS

    @property
    def base(self) -> LayerRef | None:
        return self.layers[0] if self.layers and self.layers[0].kind == LayerKind.BASE else None

    @property
    def deltas(self) -> tuple[LayerRef, ...]:
        return tuple(layer for layer in self.layers if layer.kind == LayerKind.DELTA)


@dataclass(frozen=True)
class SegmentRef:
    id: int
    table: str
    path: str
    min_commit_version: int
    max_commit_version: int
    rows: int
    appended_at: datetime
    #: where its keys fall (`ivm.changes.trim.segment_bounds`), or None when not known
    key_bounds: dict | None = None
    #: its truncates' positions, (commit version, row), in order; empty: none
    truncates: tuple[tuple[int, int], ...] = ()

    def truncates_in(self, after: int, upto: int, skip: Collection[int] = ()) -> list[tuple[int, int]]:
        """Its truncates with commit versions in (after, upto] but ``skip`` (quarantined)."""
        return [t for t in self.truncates if after < t[0] <= upto and t[0] not in skip]


@dataclass(frozen=True)
class WrittenLayer:
    """A layer's files, written (ivm.storage) but not yet committed to the catalog."""

    id: str
    relation: str
    kind: str  # base | delta
    path: str
    rows: int | None
    bytes: int | None


def new_id(prefix: str = "") -> str:
    """A sortable unique name: UTC time, then random bits."""
    return f"{prefix}{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class QuarantineRef:
    """A commit set aside (ivm.catalog.models.QuarantinedCommit)."""

    table: str
    commit_version: int
    reason: str
    by: str
    run_id: str | None = None
    quarantined_at: datetime | None = None
    restored_as: int | None = None


@dataclass
class PublishChange:
    """New layers for one relation. ``replace``: the version is these layers alone (load, compaction,
    full recompute); otherwise they are appended to the layers of ``expected_version_id``."""

    relation: str
    expected_version_id: int | None
    layers: Sequence[WrittenLayer]
    replace: bool = False
    #: an auxiliary relation (an auxiliary predicate or GROUPBY state of a view) is created on first publish
    create: bool = False
    #: the layers (ids) of an earlier version to put before ``layers`` instead of the current version's:
    #: a replay publishes the restored state plus its delta
    base: Sequence[str] | None = None
    #: how the new version stores the view (a `Form`); None: as the previous version
    form: str | None = None


@dataclass
class StageRecord:
    stage: str
    relation: str | None = None
    mode: str | None = None
    rows_in: int | None = None
    rows_out: int | None = None
    delta_rows: int | None = None
    seconds: float | None = None
    status: str = RunStatus.SUCCEEDED
    detail: dict[str, Any] = field(default_factory=dict)


class Catalog:
    """The catalog database behind one SQLAlchemy URL (SQLite by default, PostgreSQL in production)."""

    def __init__(self, url: str):
        self.url = url
        self.masked_url = mask_url(url)
        try:
            self.engine = create_engine(url, pool_pre_ping=True)
        except (SQLAlchemyError, ImportError) as e:
            raise CatalogError(f"catalog {self.masked_url}: {e}") from e
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str) -> Catalog:
        """Connect and bring the schema up to date with the Alembic migrations."""
        catalog = cls(url)
        catalog.upgrade()
        return catalog

    def upgrade(self) -> None:
        """Apply the Alembic migrations the catalog lacks. A catalog at `HEAD_REVISION` already (every
        open but the first after an upgrade of ivm) is told by one query, without importing Alembic
        (0.4 s of every command's and every Airflow task's start)."""
        if self.url.startswith("sqlite:///"):
            Path(self.url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.engine.begin() as conn:
                if self._revision(conn) == HEAD_REVISION:
                    return
                from alembic import command
                from alembic.config import Config

                cfg = Config()
                cfg.set_main_option("script_location", str(MIGRATIONS))
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except OperationalError as e:
            first = str(e.orig).strip().splitlines()[0]
            raise CatalogError(f"catalog {self.masked_url} is unreachable: {first}") from e

    @staticmethod
    def _revision(conn) -> str | None:
        """The catalog's Alembic revision (its ``alembic_version`` table), None before the first migration."""
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One unit of work: committed when the block ends, rolled back if it raises."""
        s = self._sessions()
        try:
            yield s
            s.commit()
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    # -- definitions ------------------------------------------------------------------------------

    def table_defs(self) -> dict[str, TableDef]:
        with self.session() as s:
            return {t.name: t for t in s.scalars(select(TableDef))}

    def view_defs(self) -> dict[str, ViewDef]:
        with self.session() as s:
            return {v.name: v for v in s.scalars(select(ViewDef))}

    def save_definitions(self, tables: dict[str, dict[str, Any]], views: dict[str, dict[str, Any]],
                         digest: str | None = None) -> list[str]:
        """Create or update table and view definitions in one transaction; returns what changed. ``digest``:
        the project file's (`ProjectConfig.digest`), recorded with them (`applied_digest`)."""
        changes: list[str] = []
        now = utcnow()
        with self.session() as s:
            if digest is not None:
                s.merge(AppliedProject(id=1, digest=digest, applied_at=now))
            for model, kind, specs in ((TableDef, "table", tables), (ViewDef, "view", views)):
                for name, spec in specs.items():
                    row = s.get(model, name)
                    if row is None:
                        s.add(model(name=name, created_at=now, updated_at=now, **spec))
                        s.add(Relation(name=name, kind=kind))
                        changes.append(f"created {kind} {name}")
                    elif any(getattr(row, k) != v for k, v in spec.items()):
                        if kind == RelationKind.VIEW and (row.language, row.definition) != (spec["language"],
                                                                            spec["definition"]):
                            _keep_materialized(row, self.state(name, s))
                        for k, v in spec.items():
                            setattr(row, k, v)
                        row.updated_at = now
                        changes.append(f"updated {kind} {name}")
        return changes

    def applied_digest(self) -> tuple[str, datetime] | None:
        """The digest of the project file the last `ivm apply` recorded, and when; None before one did."""
        with self.session() as s:
            row = s.get(AppliedProject, 1)
            return (row.digest, aware(row.applied_at)) if row is not None else None

    # -- relations and versions --------------------------------------------------------------------

    def check_readable(self, name: str, tables: Iterable[str], views: Iterable[str],
                       predicates: Callable[[], Iterable[str]]) -> None:
        """NotFoundError for a name that is no table, view or Datalog predicate of the project (the
        project file's ``tables`` and ``views``, its compiled program's ``predicates``, asked last) and
        has no stored state (a GROUP BY's, say), or for a view not materialized yet. Nothing of Spark is
        needed: `ivm show nosuch` is refused before PySpark is imported."""
        tables, views = set(tables), set(views)
        materialized = self.state(name).version_id is not None
        if name in views and not materialized:
            raise NotFoundError(f"view {name} has not been materialized yet; run `ivm refresh`")
        if not (name in tables or name in views or materialized or name in set(predicates())):
            raise NotFoundError(f"unknown table or view {name!r}")

    def state(self, name: str, session: Session | None = None) -> RelationState:
        """The current version of a relation (version 0 with no layers if it has none yet)."""
        if session is None:
            with self.session() as s:
                return self.state(name, s)
        rel = session.get(Relation, name)
        if rel is None or rel.current_version_id is None:
            return RelationState(name, None, 0)
        state = self.version_state(name, rel.current_version_id, session)
        assert state is not None, f"relation {name} points at a missing version"
        return state

    def version_state(self, name: str, version_id: int, session: Session | None = None) -> RelationState | None:
        """A version of a relation, current or not; None once garbage collection dropped it."""
        if session is None:
            with self.session() as s:
                return self.version_state(name, version_id, s)
        version = session.get(RelationVersion, version_id)
        if version is None or version.relation != name:
            return None
        return RelationState(name, version.id, version.version, tuple(
            LayerRef(layer.id, layer.kind, layer.path, layer.rows, layer.bytes) for layer in version.layers),
            aware(version.created_at), Form(version.form or Form.COUNTS))

    # -- change logs ---------------------------------------------------------------------------------

    def last_commit_version(self, table: str) -> int:
        """The newest commit version in the table's log, else its snapshot watermark, else 0."""
        with self.session() as s:
            newest = s.scalar(select(func.max(LogSegment.max_commit_version))
                              .where(LogSegment.table_name == table))
            if newest is not None:
                return int(newest)
            wm = s.get(Watermark, (table, table))
            return int(wm.commit_version) if wm else 0

    def appended_segment(self, table: str, source: str, content_hash: str) -> SegmentRef | None:
        """The segment an earlier append of this very file (path and content) created, if any."""
        with self.session() as s:
            seg = s.scalar(select(LogSegment).where(LogSegment.table_name == table, LogSegment.source == source,
                                                    LogSegment.content_hash == content_hash))
            return _segment_ref(seg) if seg else None

    def add_segment(self, table: str, path: str, source: str, source_format: str, content_hash: str,
                    min_version: int, max_version: int, rows: int, key_bounds: dict | None = None,
                    restores: int | None = None, truncates: Sequence[tuple[int, int]] = ()) -> SegmentRef:
        """Record an appended segment: the commit point of `ivm log append`.

        Commit versions normally come after the log's last one. A late commit (out-of-order delivery,
        or the missing change a refused refresh asked for) may fill a gap below it, provided no
        relation has absorbed that far, no segment holds versions in its range, and no run is
        refreshing the table. The (table, source, content hash) constraint makes appending the same
        file twice a no-op even when two appends race. ``truncates``: the positions of the segment's truncate
        events (`SegmentRef.truncates`). ``restores``: the segment holds the changes of that
        quarantined commit, appended again (`ivm log restore`), which the same transaction records.
        """
        with self.session() as s:
            newest = s.scalar(select(func.max(LogSegment.max_commit_version))
                              .where(LogSegment.table_name == table))
            if newest is not None and min_version <= newest:
                absorbed = _absorbed(s, table)
                if min_version <= absorbed:
                    raise ChangeDataError(f"table {table}: commit version {min_version} is not after the last "
                                          f"absorbed commit version {absorbed}; nothing was stored")
                overlap = s.scalar(select(LogSegment).where(LogSegment.table_name == table,
                                                            LogSegment.min_commit_version <= max_version,
                                                            LogSegment.max_commit_version >= min_version))
                if overlap is not None:
                    raise ChangeDataError(
                        f"table {table}: commit versions {min_version}..{max_version} overlap segment {overlap.id} "
                        f"({overlap.min_commit_version}..{overlap.max_commit_version}); nothing was stored")
                lease = s.get(Lease, table)
                if lease is not None:
                    raise LeaseError(f"table {table} is being refreshed by run {lease.run_id}; "
                                     "append a late commit after it ends")
            seg = LogSegment(table_name=table, path=path, source=source, source_format=source_format,
                             content_hash=content_hash, min_commit_version=min_version,
                             max_commit_version=max_version, rows=rows, key_bounds=key_bounds,
                             truncates=[list(t) for t in truncates] or None)
            s.add(seg)
            if restores is not None:
                record = s.get(QuarantinedCommit, (table, restores), with_for_update=True)
                if record is None or record.restored_as is not None:
                    raise ChangeDataError(f"table {table}: commit version {restores} is not quarantined (restored "
                                          "meanwhile?); nothing was stored")
                record.restored_as, record.restored_at = min_version, utcnow()
            s.flush()
            return _segment_ref(seg)

    def segments(self, table: str, after: int, upto: int) -> list[SegmentRef]:
        """The segments holding commit versions in (after, upto], in commit order."""
        with self.session() as s:
            rows = s.scalars(select(LogSegment)
                             .where(LogSegment.table_name == table,
                                    LogSegment.max_commit_version > after,
                                    LogSegment.min_commit_version <= upto)
                             .order_by(LogSegment.min_commit_version))
            return [_segment_ref(r) for r in rows]

    def absorbed(self, table: str) -> int:
        """The newest commit version of the table that any relation has absorbed (0: none)."""
        with self.session() as s:
            return _absorbed(s, table)

    # -- quarantined commits -----------------------------------------------------------------------

    def quarantined_versions(self, table: str) -> set[int]:
        """The commit versions of ``table`` set aside (`quarantined`): what every trim of its log skips."""
        return {q.commit_version for q in self.quarantined(table)}

    def quarantined(self, table: str | None = None) -> list[QuarantineRef]:
        """The commits set aside (of one table, or all), in commit order: every refresh's trim skips
        them, the restored ones too (their changes were appended again under a new version)."""
        with self.session() as s:
            q = select(QuarantinedCommit).order_by(QuarantinedCommit.table_name, QuarantinedCommit.commit_version)
            if table is not None:
                q = q.where(QuarantinedCommit.table_name == table)
            return [QuarantineRef(r.table_name, int(r.commit_version), r.reason, r.by, r.run_id,
                                  aware(r.quarantined_at), None if r.restored_as is None else int(r.restored_as))
                    for r in s.scalars(q)]

    def quarantine(self, table: str, version: int, reason: str, by: str = "command") -> None:
        """Set a commit aside (`ivm log quarantine`), recorded as a run of kind ``quarantine`` with its
        reason. Refused for a commit some relation has absorbed already, one set aside already, and
        while a run is refreshing the table (its trim read the log under its lease)."""
        self._log_action(table, version, "quarantine", reason, by=by)

    def unquarantine(self, table: str, version: int, reason: str) -> None:
        """Put a quarantined commit back where it was (`ivm log restore` before any relation has
        absorbed it), recorded as a run of kind ``restore``."""
        self._log_action(table, version, "restore", reason)

    def _log_action(self, table: str, version: int, action: str, reason: str, by: str = "command") -> None:
        now = utcnow()
        with self.session() as s:
            lease = s.get(Lease, table)
            if lease is not None:
                raise LeaseError(f"table {table} is being refreshed by run {lease.run_id}; try again after it ends")
            absorbed = _absorbed(s, table)
            record = s.get(QuarantinedCommit, (table, version))
            if action == "quarantine":
                if record is not None:
                    raise ChangeDataError(f"table {table}: commit version {version} is quarantined already")
                if version <= absorbed:
                    raise ChangeDataError(f"table {table}: commit version {version} was absorbed already (the "
                                          f"tables and views hold up to {absorbed}); nothing to set aside")
                s.add(QuarantinedCommit(table_name=table, commit_version=version, reason=reason, by=by,
                                        quarantined_at=now))
            else:
                if record is None or record.restored_as is not None:
                    raise NotFoundError(f"table {table}: commit version {version} is not quarantined")
                if version <= absorbed:
                    raise ChangeDataError(f"table {table}: commit version {version} lies below what was absorbed "
                                          f"since ({absorbed}); restore appends it again as a new commit")
                s.delete(record)
            run_id = new_id(f"{action}-")
            s.add(Run(id=run_id, kind=action, status=RunStatus.SUCCEEDED, snapshot={table: version}, relations=[table],
                      started_at=now, finished_at=now))
            s.add(RunStage(run_id=run_id, stage=action, relation=table, detail={"version": version, "reason": reason},
                           started_at=now))

    def all_segments(self) -> list[SegmentRef]:
        with self.session() as s:
            return [_segment_ref(r) for r in s.scalars(select(LogSegment).order_by(LogSegment.id))]

    def watermarks(self) -> dict[tuple[str, str], int]:
        with self.session() as s:
            return {(w.relation, w.source_table): int(w.commit_version) for w in s.scalars(select(Watermark))}

    # -- runs ------------------------------------------------------------------------------------

    @contextmanager
    def run(self, run_id: str, kind: str | None = None, snapshot: dict[str, int] | None = None,
            relations: Iterable[str] = (), mode: str | None = None, leases: Iterable[str] = (),
            lease_timeout: timedelta | None = None, keep_leases: bool = False,
            failure: str = "", catch: type[BaseException] = BaseException) -> Iterator[str]:
        """A run's start and fail bookkeeping, in one place: start the run (``kind`` None: an earlier
        stage of it started it, as an Airflow task's stage), take the leases on ``leases`` (all or none),
        and if the body raises, record the run failed with the error's first line (after ``failure``, e.g.
        the stage's name) and raise it again. ``keep_leases``: a failed stage of a run that may be
        retried keeps its leases until they expire or a retry publishes. ``catch``: what counts as the run
        failing (an Airflow task killed midway, KeyboardInterrupt, leaves its run running for the retry).
        Success is the body's to record (a publish, or `finish_run`)."""
        if kind is not None:
            self.start_run(run_id, kind, snapshot, relations, mode)
        try:
            leases = list(leases)
            if leases:
                self.acquire_leases(run_id, leases, lease_timeout or timedelta(minutes=60))
            yield run_id
        except catch as e:
            self.finish_run(run_id, RunStatus.FAILED, failure + one_line(e), keep_leases=keep_leases)
            raise

    def start_run(self, run_id: str, kind: str, snapshot: dict[str, int] | None = None,
                  relations: Iterable[str] = (), mode: str | None = None) -> None:
        with self.session() as s:
            s.add(Run(id=run_id, kind=kind, status=RunStatus.RUNNING, mode=mode, snapshot=snapshot or {},
                      relations=list(relations)))

    def finish_run(self, run_id: str, status: str, error: str | None = None, keep_leases: bool = False) -> None:
        """Record a run's outcome. ``keep_leases``: a failed stage of a run that may be retried (an Airflow
        task) keeps the run's leases until they expire or the run publishes."""
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is not None:
                run.status, run.error, run.finished_at = status, error, utcnow()
            if not keep_leases:
                s.execute(delete(Lease).where(Lease.run_id == run_id))

    def reset_run(self, run_id: str, snapshot: dict[str, int], relations: Iterable[str], mode: str | None) -> None:
        """Start a run that did not publish over, with a new plan: its staged records go, it is running again."""
        with self.session() as s:
            run = s.get(Run, run_id)
            s.execute(delete(RunStage).where(RunStage.run_id == run_id))
            run.status, run.error, run.finished_at, run.started_at = RunStatus.RUNNING, None, None, utcnow()
            run.snapshot, run.relations, run.mode = snapshot, list(relations), mode

    def save_stage(self, run_id: str, record: StageRecord) -> None:
        """Record what a stage did for one relation (or for the run), replacing what an earlier attempt
        of the same stage recorded for it: a retried stage leaves one record."""
        with self.session() as s:
            s.execute(delete(RunStage).where(RunStage.run_id == run_id, RunStage.stage == record.stage,
                                             RunStage.relation.is_(None) if record.relation is None
                                             else RunStage.relation == record.relation))
            s.add(RunStage(run_id=run_id, **record.__dict__))

    def stage_records(self, run_id: str) -> list[RunStage]:
        with self.session() as s:
            return list(s.scalars(select(RunStage).where(RunStage.run_id == run_id).order_by(RunStage.id)))

    def latest_stage(self, stage: str, relation: str) -> RunStage | None:
        """The newest record of ``stage`` for ``relation`` in any run."""
        with self.session() as s:
            return s.scalars(select(RunStage).where(RunStage.stage == stage, RunStage.relation == relation)
                             .order_by(RunStage.id.desc()).limit(1)).first()

    def runs(self, limit: int = 20, kind: str | None = None) -> list[Run]:
        with self.session() as s:
            q = select(Run).order_by(Run.started_at.desc(), Run.id.desc()).limit(limit)
            if kind:
                q = q.where(Run.kind == kind)
            return list(s.scalars(q))

    def maintain_history(self, relation: str, mode: str, limit: int) -> list[tuple[int, float]]:
        """(rows in, seconds) of the relation's newest ``limit`` maintain stages in ``mode`` (incremental
        or full) in succeeded runs, newest first: the measured costs `--mode auto` estimates from
        (ivm.maintain.crossover)."""
        with self.session() as s:
            q = (select(RunStage.rows_in, RunStage.seconds).join(Run, Run.id == RunStage.run_id)
                 .where(RunStage.stage == StageName.MAINTAIN, RunStage.relation == relation,
                        Run.status == RunStatus.SUCCEEDED,
                        RunStage.mode == mode, RunStage.seconds.is_not(None))
                 .order_by(Run.started_at.desc(), RunStage.id.desc()).limit(limit))
            return [(int(r or 0), float(sec)) for r, sec in s.execute(q)]

    def get_run(self, run_id: str) -> Run | None:
        with self.session() as s:
            return s.get(Run, run_id)

    def restore_points(self) -> list[tuple[Run, dict[str, int]]]:
        """Every published run with the relation versions its publish recorded as consistent with its
        snapshot (relation -> version id), newest first: the states a replay can start from."""
        with self.session() as s:
            rows = s.execute(select(Run, RunStage.detail).join(RunStage, RunStage.run_id == Run.id)
                             .where(RunStage.stage == StageName.PUBLISH, Run.status == RunStatus.SUCCEEDED)
                             .order_by(Run.finished_at.desc(), Run.id.desc()))
            return [(run, {k: int(v) for k, v in (detail or {}).get("versions", {}).items()}) for run, detail in rows]

    def same_states(self) -> dict[int, int]:
        """Relation version id -> the version id it compacted (`ivm.compaction`): the two hold the same
        state, so a restore point that recorded the older still names the newer's state."""
        with self.session() as s:
            rows = s.execute(select(RelationVersion.id, RunStage.detail)
                             .join(RunStage, (RunStage.run_id == RelationVersion.run_id)
                                   & (RunStage.relation == RelationVersion.relation))
                             .where(RunStage.stage == StageName.COMPACT))
            return {int(vid): int(detail["compacted"]) for vid, detail in rows
                    if detail and detail.get("compacted") is not None}

    # -- validations -----------------------------------------------------------------------------

    def save_validation(self, run_id: str, view: str, sample_size: int, mismatches: int, status: str,
                        report_uri: str | None, summary: dict[str, Any]) -> None:
        """Record a view's validation in a run, replacing what an earlier attempt of it recorded."""
        with self.session() as s:
            s.execute(delete(Validation).where(Validation.run_id == run_id, Validation.view == view))
            s.add(Validation(run_id=run_id, view=view, sample_size=sample_size, mismatches=mismatches,
                             status=status, report_uri=report_uri, summary=summary))

    def validations(self, view: str | None = None, run_id: str | None = None, limit: int = 100) -> list[Validation]:
        """Validations, newest first."""
        with self.session() as s:
            q = select(Validation).order_by(Validation.created_at.desc(), Validation.id.desc()).limit(limit)
            if view is not None:
                q = q.where(Validation.view == view)
            if run_id is not None:
                q = q.where(Validation.run_id == run_id)
            return list(s.scalars(q))

    # -- leases ----------------------------------------------------------------------------------

    def acquire_leases(self, run_id: str, relations: Iterable[str], timeout: timedelta) -> None:
        """Take the refresh lease on every relation, all or none. A lease past its expiry belongs to a
        crashed run and is taken over."""
        now = utcnow()
        try:
            with self.session() as s:
                for name in sorted(set(relations)):
                    lease = s.get(Lease, name, with_for_update=True)
                    if lease is not None and lease.run_id != run_id:
                        if aware(lease.expires_at) > now:
                            raise LeaseError(f"{name} is being refreshed by run {lease.run_id} "
                                             f"(since {aware(lease.acquired_at):%Y-%m-%d %H:%M:%S} UTC)")
                        log.warning("taking over the expired lease of run %s on %s", lease.run_id, name)
                        s.delete(lease)
                        s.flush()
                        lease = None
                    if lease is None:
                        s.add(Lease(relation=name, run_id=run_id, acquired_at=now, expires_at=now + timeout))
        except IntegrityError as e:
            raise LeaseError(f"another run took a lease on {', '.join(sorted(relations))} at the same time") from e

    def release_leases(self, run_id: str) -> None:
        with self.session() as s:
            s.execute(delete(Lease).where(Lease.run_id == run_id))

    # -- publish ---------------------------------------------------------------------------------

    def publish(self, run_id: str, changes: Sequence[PublishChange],
                watermarks: dict[tuple[str, str], int], stages: Sequence[StageRecord] = (),
                status: str = RunStatus.SUCCEEDED, consistent: dict[str, dict[tuple[str, str], int]] | None = None,
                quarantined: Sequence[QuarantineRef] = (), source_ids: dict[str, str] | None = None) -> dict[str, int]:
        """The commit point: new versions of every changed relation, watermarks, and the run's outcome,
        in one transaction. Returns the new version number of each relation.

        ``consistent``: relation -> the watermarks that make its state the run's snapshot; the versions
        of the relations whose watermarks match, once this run's are in, are recorded with the run (its
        ``publish`` stage), so a replay can later start from them (ivm.refresh). ``quarantined``: the
        commits the run's trims set aside under ``on_bad_change: quarantine``, recorded with it (a
        run that fails sets none aside). ``source_ids``: the table ids of the Delta sources whose state
        the run published (`TableDef.source_id`)."""
        now = utcnow()
        published: dict[str, int] = {}
        with self.session() as s:
            for change in changes:
                rel = s.get(Relation, change.relation, with_for_update=True)
                if rel is None and change.create:
                    rel = Relation(name=change.relation, kind=RelationKind.AUX)
                    s.add(rel)
                if rel is None:
                    raise CatalogError(f"relation {change.relation} is not in the catalog (run `ivm apply`)")
                if rel.current_version_id != change.expected_version_id:
                    raise CatalogError(f"{change.relation} changed since run {run_id} read it; "
                                       "nothing was published")
                previous = s.get(RelationVersion, rel.current_version_id) if rel.current_version_id else None
                if change.base is not None:
                    kept = list(change.base)
                else:
                    kept = [] if change.replace or previous is None else [e.layer_id for e in previous.entries]
                for w in change.layers:
                    s.add(Layer(id=w.id, relation=w.relation, kind=w.kind, path=w.path, rows=w.rows,
                                bytes=w.bytes, run_id=run_id, created_at=now))
                number = (previous.version if previous else 0) + 1
                form = change.form or (previous.form if previous is not None else None)
                version = RelationVersion(relation=change.relation, version=number, run_id=run_id, created_at=now,
                                          form=form)
                for pos, layer_id in enumerate([*kept, *(w.id for w in change.layers)]):
                    version.entries.append(VersionLayer(position=pos, layer_id=layer_id))
                s.add(version)
                s.flush()
                if previous is not None:
                    previous.superseded_at = now
                rel.current_version_id = version.id
                published[change.relation] = number
            for (relation, source), commit_version in watermarks.items():
                wm = s.get(Watermark, (relation, source))
                if wm is None:
                    s.add(Watermark(relation=relation, source_table=source, commit_version=commit_version,
                                    updated_at=now))
                else:
                    wm.commit_version, wm.updated_at = commit_version, now
            for table, source_id in (source_ids or {}).items():
                s.get(TableDef, table).source_id = source_id
            for stage in stages:
                s.add(RunStage(run_id=run_id, **stage.__dict__))
            for q in quarantined:
                s.merge(QuarantinedCommit(table_name=q.table, commit_version=q.commit_version, reason=q.reason,
                                          by=q.by, run_id=run_id, quarantined_at=now))
            if consistent is not None:
                s.flush()
                marks = {(w.relation, w.source_table): int(w.commit_version) for w in s.scalars(select(Watermark))}
                versions = {}
                for name, needed in consistent.items():
                    rel = s.get(Relation, name)
                    if rel is not None and rel.current_version_id is not None and all(
                            marks.get(k) == v for k, v in needed.items()):
                        versions[name] = rel.current_version_id
                s.add(RunStage(run_id=run_id, stage=StageName.PUBLISH, detail={"versions": versions}))
            for staged in s.scalars(select(RunStage).where(RunStage.run_id == run_id,
                                                           RunStage.status == RunStatus.STAGED)):
                staged.status = RunStatus.SUCCEEDED  # what the run's stages staged is published now
            run = s.get(Run, run_id)
            if run is not None:  # (an error a retried stage of the run recorded is history now)
                run.status, run.finished_at, run.error = status, now, None
            s.execute(delete(Lease).where(Lease.run_id == run_id))
        return published

    # -- garbage collection ----------------------------------------------------------------------

    def expired_versions(self, before: datetime) -> list[int]:
        """Versions replaced before ``before``: readers no longer need them."""
        with self.session() as s:
            return list(s.scalars(select(RelationVersion.id).where(RelationVersion.superseded_at.is_not(None),
                                                                   RelationVersion.superseded_at < before)))

    def drop_versions(self, version_ids: Sequence[int]) -> list[LayerRef]:
        """Forget versions; returns the layers no remaining version references (their files may go)."""
        with self.session() as s:
            if version_ids:
                s.execute(delete(VersionLayer).where(VersionLayer.version_id.in_(version_ids)))
                s.execute(delete(RelationVersion).where(RelationVersion.id.in_(version_ids)))
            used = select(VersionLayer.layer_id)
            orphans = list(s.scalars(select(Layer).where(Layer.id.not_in(used))))
            for layer in orphans:
                s.delete(layer)
            return [LayerRef(x.id, x.kind, x.path, x.rows, x.bytes) for x in orphans]

    def known_layer_paths(self) -> set[str]:
        with self.session() as s:
            return set(s.scalars(select(Layer.path)))

    def drop_segments(self, segment_ids: Sequence[int]) -> None:
        with self.session() as s:
            s.execute(delete(LogSegment).where(LogSegment.id.in_(segment_ids)))


def _absorbed(s: Session, table: str) -> int:
    """The newest commit version of ``table`` that any relation has absorbed (0: none)."""
    return int(s.scalar(select(func.max(Watermark.commit_version)).where(Watermark.source_table == table)) or 0)


def _segment_ref(seg: LogSegment) -> SegmentRef:
    return SegmentRef(seg.id, seg.table_name, seg.path, int(seg.min_commit_version),
                      int(seg.max_commit_version), int(seg.rows), aware(seg.appended_at), seg.key_bounds,
                      tuple((int(v), int(i)) for v, i in seg.truncates or ()))


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets readers (Airflow tasks, `ivm show`) proceed while a run publishes
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _keep_materialized(row: ViewDef, state: RelationState) -> None:
    """Before a view's definition changes: remember the one its stored state was computed from — the
    current one if a refresh materialized it since it was applied, else the one remembered before."""
    if state.created_at is not None and state.created_at >= aware(row.updated_at):
        row.materialized = {"language": row.language, "definition": row.definition}
    elif state.created_at is None:
        row.materialized = None
