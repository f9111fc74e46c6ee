"""The catalog's tables (SQLAlchemy 2 declarative models).

The catalog is the commit point of the warehouse (docs/design.md §3): a relation's visible state is the
version its ``current_version_id`` points to, and a run publishes by moving those pointers and the
watermarks in one transaction. Schema changes go through Alembic migrations in ``migrations/``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from ivm.vocabulary import RunStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class TableDef(Base):
    """A base table as declared in the project file and applied with `ivm apply`."""

    __tablename__ = "ivm_tables"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    columns: Mapped[dict[str, Any]] = mapped_column(JSON)
    key: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    unique_keys: Mapped[list[Any]] = mapped_column(JSON, default=list)
    references: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    #: columns added after the table held data (ivm.evolution): change files may lack them (NULL)
    added_columns: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    #: a Delta source's table id (its metaData id) as of the state ivm last published of it: a table at
    #: the location with another id was created anew there (ivm.refresh.plan recomputes its readers)
    source_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


class ViewDef(Base):
    """A view's definition and options as applied with `ivm apply`."""

    __tablename__ = "ivm_views"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    language: Mapped[str] = mapped_column(String(16))
    definition: Mapped[str] = mapped_column(Text)
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    #: after a change of a materialized view: the language and definition its stored state was computed
    #: from (``{"language": ..., "definition": ...}``), until a refresh materializes the new one
    materialized: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class AppliedProject(Base):
    """What the last successful `ivm apply` applied to this catalog: the digest of the project file as
    read (`ProjectConfig.digest`). `ivm apply` of the same file again answers from it, without Spark."""

    __tablename__ = "ivm_applied"

    #: always 1: a catalog holds one project's definitions
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    applied_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Relation(Base):
    """Anything stored in the warehouse as a stack of Z-set layers: a base table, a view, an auxiliary relation."""

    __tablename__ = "ivm_relations"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # table | view | aux
    # no foreign key: the pointer and the versions it points at would form a cycle; publish keeps it sound
    current_version_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RelationVersion(Base):
    """One version of a relation: an ordered list of layers (a base layer, then delta layers)."""

    __tablename__ = "ivm_relation_versions"
    __table_args__ = (UniqueConstraint("relation", "version", name="uq_relation_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    relation: Mapped[str] = mapped_column(ForeignKey("ivm_relations.name"))
    version: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    #: set when a newer version replaced this one; garbage collection counts retention from here
    superseded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    #: how a view's tuples are stored (`ivm.vocabulary.Form`): counts (derivation counts, 000) or presence
    #: (each tuple once: key-based and reducing maintenance, 003/004); NULL: counts
    form: Mapped[str | None] = mapped_column(String(16), nullable=True)

    entries: Mapped[list[VersionLayer]] = relationship(
        order_by="VersionLayer.position", cascade="all, delete-orphan", lazy="selectin")

    @property
    def layers(self) -> list[Layer]:
        return [e.layer for e in self.entries]


class Layer(Base):
    """A Parquet directory holding a Z-set (the relation's columns plus ``__count``)."""

    __tablename__ = "ivm_layers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    relation: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(8))  # base | delta
    path: Mapped[str] = mapped_column(Text)
    rows: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class VersionLayer(Base):
    __tablename__ = "ivm_version_layers"

    version_id: Mapped[int] = mapped_column(ForeignKey("ivm_relation_versions.id"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    layer_id: Mapped[str] = mapped_column(ForeignKey("ivm_layers.id"), index=True)

    layer: Mapped[Layer] = relationship(lazy="joined")


class LogSegment(Base):
    """One append to a table's change log: a Parquet file of normalized changes."""

    __tablename__ = "ivm_log_segments"
    #: the same file (path and content) is one segment however often it is appended
    __table_args__ = (UniqueConstraint("table_name", "source", "content_hash", name="uq_segment_content"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    table_name: Mapped[str] = mapped_column(String(200), index=True)
    path: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)
    source_format: Mapped[str] = mapped_column(String(16))
    content_hash: Mapped[str] = mapped_column(String(64))
    min_commit_version: Mapped[int] = mapped_column(BigInteger)
    max_commit_version: Mapped[int] = mapped_column(BigInteger)
    rows: Mapped[int] = mapped_column(BigInteger)
    appended_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    #: where the segment's keys fall (`ivm.changes.trim.segment_bounds`), found when it was appended; NULL: not
    #: known (a small table's segment, keys cut in equal runs, a segment appended before revision 0004)
    key_bounds: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    #: the positions [commit version, row] of the segment's truncate events (a Debezium ``op: t``), found when
    #: it was appended; NULL: none
    truncates: Mapped[list[list[int]] | None] = mapped_column(JSON, nullable=True)


class QuarantinedCommit(Base):
    """A commit of a table's log set aside (`ivm log quarantine`, or the table's ``on_bad_change:
    quarantine`` policy): kept in its segment, skipped by every refresh's trim, listed with its reason."""

    __tablename__ = "ivm_quarantine"

    table_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    #: the commit version in ivm's numbering (a Delta source's Delta version + 1)
    commit_version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    #: "command" (`ivm log quarantine`) or "policy" (``on_bad_change: quarantine``)
    by: Mapped[str] = mapped_column(String(16))
    #: the run that refused it (policy), else None
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    quarantined_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    #: after `ivm log restore` past the refreshes that skipped it: the commit version its changes were
    #: appended again as (the original stays skipped)
    restored_as: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    restored_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Watermark(Base):
    """The last commit version of ``source_table``'s log that ``relation`` has absorbed."""

    __tablename__ = "ivm_watermarks"

    relation: Mapped[str] = mapped_column(String(200), primary_key=True)
    source_table: Mapped[str] = mapped_column(String(200), primary_key=True)
    commit_version: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Run(Base):
    """A refresh, load, compaction, backfill or garbage collection, with its snapshot and outcome."""

    __tablename__ = "ivm_runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))  # running | succeeded | failed | noop
    mode: Mapped[str | None] = mapped_column(String(16), nullable=True)
    snapshot: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    relations: Mapped[list[Any]] = mapped_column(JSON, default=list)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)

    stages: Mapped[list[RunStage]] = relationship(order_by="RunStage.id", lazy="selectin",
                                                  cascade="all, delete-orphan")


class RunStage(Base):
    """One stage of a run (ivm.refresh.stages.STAGES: plan, trim, maintain, validate, publish, sink,
    compact) for one relation."""

    __tablename__ = "ivm_run_stages"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("ivm_runs.id"), index=True)
    stage: Mapped[str] = mapped_column(String(32))
    relation: Mapped[str | None] = mapped_column(String(200), nullable=True)
    mode: Mapped[str | None] = mapped_column(String(16), nullable=True)
    rows_in: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    rows_out: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    delta_rows: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.SUCCEEDED)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Validation(Base):
    """The result of a sampled recomputation check of one view in one run (docs/design.md §7)."""

    __tablename__ = "ivm_validations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64), index=True)
    view: Mapped[str] = mapped_column(String(200), index=True)
    sample_size: Mapped[int] = mapped_column(BigInteger)
    mismatches: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))  # passed | failed | warned
    report_uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Lease(Base):
    """Held by a run on every relation it will publish, so two runs never refresh one view at once."""

    __tablename__ = "ivm_leases"

    relation: Mapped[str] = mapped_column(String(200), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    acquired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
