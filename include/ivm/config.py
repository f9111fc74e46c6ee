"""The project file (`ivm.yaml`): tables, keys, views and settings, read with pydantic.

The contract is docs/design.md §8. Every error names the field (``tables.link.key``) and is one line.
Relative paths (warehouse, SQLite catalog, view files) are resolved against the project file's folder,
so a project works from any current directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Literal

import sqlglot
import yaml
from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlglot import exp
from sqlglot.errors import ParseError

from ivm.errors import ConfigError, NotFoundError
from ivm.modes import Mode
from ivm.vocabulary import MultipleUpdates, ReduceAlgorithm, StrategyName

PROJECT_ENV = "IVM_PROJECT"
#: set by the `ivm` command: a JVM the command starts writes its console (the JVM's own warnings, Spark's
#: log) to a file beside the project's warehouse (ivm.server.project_session) instead of the terminal,
#: which keeps ivm's lines alone — an error is one line
QUIET_JVM_ENV = "IVM_QUIET_JVM"
DEFAULT_PROJECT = "ivm.yaml"

#: Columns ivm adds to relations and change logs; user columns may not use these names.
COUNT_COLUMN = "__count"
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
RESERVED_COLUMNS = frozenset({COUNT_COLUMN, CHANGE_TYPE, COMMIT_VERSION, "_seq", "_segment"})

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_name(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"{kind} name {name!r} is not an identifier (letters, digits, _)")
    return name


def spark_type(type_text: str) -> str:
    """Validate a Spark SQL type with sqlglot and return its canonical Spark DDL text.

    Map types are refused: Spark cannot group or compare them, and every relation here is
    consolidated by grouping on all its columns.
    """
    try:
        parsed = exp.DataType.build(type_text, dialect="spark")
    except (ParseError, ValueError) as e:
        raise ValueError(f"{type_text!r} is not a Spark SQL type") from e
    if any(t.this == exp.DataType.Type.MAP for t in parsed.find_all(exp.DataType)):
        raise ValueError(f"{type_text!r}: map types are not supported (Spark cannot group by them); "
                         "use array<struct<key: ..., value: ...>>")
    if parsed.this == exp.DataType.Type.USERDEFINED:
        raise ValueError(f"{type_text!r} is not a Spark SQL type")
    return parsed.sql(dialect="spark")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SparkSettings(_Model):
    """How ivm starts Spark when it runs in-process (`ivm refresh`, the demo, tests), and plans its work."""

    #: the master of local Spark in-process (``local[N]``, ``spark://host:7077``); not used on a server
    master: str = "local[2]"
    #: a Spark Connect server (``sc://host:port``) that every command, the Python API and the DAG's
    #: Spark tasks run on instead of starting Spark in-process; the environment's ``SPARK_REMOTE``
    #: overrides it (Spark's own convention), and `ivm server start` starts one with this project's
    #: settings. Unset: the project's running server if there is one, else local Spark in-process
    remote: str | None = Field(default=None, pattern=r"^sc://")
    #: a Hive metastore service (``thrift://host:9083``) that keeps the views' names in the Spark catalog
    #: (`ivm.sinks.register`), shared by every JVM of the project — the Spark Connect server, the DAG's
    #: spark-submits, in-process sessions, users' notebooks (the compose stack runs one on its
    #: PostgreSQL). Unset: an embedded Derby database in the warehouse, which one JVM opens at a time
    metastore: str | None = Field(default=None, pattern=r"^thrift://")
    #: any Spark setting, over ivm's defaults (ivm.spark.DEFAULT_CONF); on a Spark Connect server the
    #: ``spark.sql.*`` runtime settings are set per session, the others are the server's
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("remote", "metastore", mode="before")
    @classmethod
    def _empty_is_unset(cls, value):
        """``""`` (a ``${VAR:-}`` of the project file whose variable is unset) is no setting."""
        return None if value == "" else value
    #: a refresh whose changes hold at most this many rows (its tables' net deltas, and the deltas it
    #: derives from them) is planned in one partition: no shuffle between its steps (`zset.one_partition`);
    #: the same for a table's log range in the trim. 0: always the distributed plan
    single_partition_rows: int = Field(default=250_000, ge=0)


class StorageSettings(_Model):
    """Layers, compaction and garbage collection (docs/design.md §3)."""

    #: compact a relation when it has more delta layers than this ...
    compact_max_layers: int = Field(default=10, ge=1)
    #: ... or when its delta layers hold more bytes than this fraction of its base layer ...
    compact_delta_ratio: float = Field(default=0.5, gt=0)
    #: ... and at least this many MiB
    compact_min_delta_mb: float = Field(default=4.0, ge=0)
    #: versions, layers and log segments no retained version needs are deleted after this many hours
    retention_hours: float = Field(default=168.0, ge=0)
    #: target size of one base-layer file when compaction rewrites a relation
    target_file_mb: int = Field(default=128, ge=1)
    #: a refresh lease older than this is considered abandoned by a crashed run
    lease_timeout_minutes: float = Field(default=120.0, gt=0)
    #: publish every view as a Delta table (its ``sink``; ivm.sinks) after each refresh that changed it
    delta_views: bool = True
    #: with ``delta_views``: `ivm apply` registers each view's Delta table in the Spark catalog as
    #: ``<database>.<view>`` (docs/guide.md "Delta Lake", "Found by name")
    register_views: bool = True
    #: the Spark catalog database of the views (default: the project's ``name``)
    database: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    #: with ``delta_views``: a view whose published layers hold at most this many MiB (and no nested
    #: column) is written to its Delta table by delta-rs, without a JVM: the rows at the keys its delta
    #: touched, its whole state after a full recompute (0: always through Spark)
    sink_without_jvm_mb: float = Field(default=64.0, ge=0)
    #: a view's Delta table changed by another writer since ivm's last write (a notebook's UPDATE, a
    #: mistaken INSERT): ``rewrite`` brings it back to the view on the next write, row by row, with a
    #: warning naming the outside commit; ``fail`` refuses to write it, in one line with the way out
    on_outside_write: Literal["rewrite", "fail"] = "rewrite"


class LineageSettings(_Model):
    """OpenLineage run events of `ivm refresh` and `ivm backfill` (ivm.lineage; docs/guide.md "Lineage"). The
    DAG's tasks report theirs through Airflow's OpenLineage provider, configured as Airflow configures it."""

    #: the job namespace of the project's runs (their job: ``<project>.refresh`` / ``<project>.backfill``)
    namespace: str = "ivm"
    #: the OpenLineage client's transport, as an ``openlineage.yml`` writes it (``{type: http, url: ...}``,
    #: ``{type: file, log_file_path: ..., append: true}``, ``{type: kafka, ...}``, ``{type: console}``).
    #: Unset: the client's own configuration (``OPENLINEAGE_CONFIG``, ``openlineage.yml``,
    #: ``OPENLINEAGE__TRANSPORT__*``, ``OPENLINEAGE_URL``), and no events when there is none
    transport: dict[str, Any] | None = None

    def may_emit(self) -> bool:
        """Whether a transport may be configured (`transport`, or where the OpenLineage client looks for
        its own), so that `ivm refresh` loads the client (half a second) only then; the client decides."""
        if os.environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
            return False
        return bool(self.transport or os.environ.get("OPENLINEAGE_URL") or os.environ.get("OPENLINEAGE_CONFIG")
                    or any(k.startswith("OPENLINEAGE__TRANSPORT") for k in os.environ)
                    or Path("openlineage.yml").is_file()
                    or (Path.home() / ".openlineage" / "openlineage.yml").is_file())


class ExpectationSpec(_Model):
    """A Great Expectations expectation in GE's own form, checked over the rows of the view's sample."""

    #: the expectation's name (``expect_column_values_to_not_be_null``, ...)
    type: str = Field(pattern=r"^expect_[a-z0-9_]+$")
    #: its arguments, as Great Expectations names them (``column``, ``min_value``, ...)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class ValidateSettings(_Model):
    """Sampled recomputation after each refresh (docs/design.md §7, ivm.validate)."""

    #: keys of the view recomputed and compared per refresh (and as many of the keys the run touched);
    #: 0 turns the sampled recomputation off (the check for negative counts stays)
    sample: int = Field(default=1000, ge=0)
    #: fail: a mismatch blocks the publish and fails the run; warn: publish and flag the run
    policy: Literal["fail", "warn"] = "fail"
    #: DOUBLE and FLOAT columns of the state and the recomputation agree when
    #: |a - b| <= tolerance * max(1, |a|, |b|) (sums kept incrementally add in another order than a
    #: recompute's); DECIMAL, integers and every other type compare exactly
    tolerance: float = Field(default=1e-9, ge=0, lt=1)
    #: more expectations over the sampled rows (GE's `{type, kwargs}`), e.g.
    #: `{type: expect_column_values_to_be_between, kwargs: {column: n, min_value: 0}}`
    expectations: list[ExpectationSpec] = Field(default_factory=list)


class NestedReference(_Model):
    """A column holding the id of a nested collection stored by reference (002 §2.1): the collection
    table holds the elements of every collection of this type, each row tagged with its collection's
    id in column ``id``; a view reaches the elements by joining that column (002 §2.2's e_S)."""

    #: the table holding the elements of every collection of this type
    collection: str
    #: that table's column holding the collection's id
    id: str


class SourceConfig(_Model):
    """Where a table's rows and changes are read when they are not loaded into ivm: a Delta Lake table
    with its change data feed on (ivm.changes.delta), named by path (``delta:``, relative to the project
    file) or by name in the Spark catalog (``table:``)."""

    #: the Delta table's path or URI (relative to the project file)
    delta: str | None = None
    #: the Delta table's name in the Spark catalog (``db.table``)
    table: str | None = None

    @model_validator(mode="after")
    def _one(self) -> SourceConfig:
        if (self.delta is None) == (self.table is None):
            raise ValueError("a source names exactly one of `delta` (a path) or `table` (a catalog table)")
        return self


class TableConfig(_Model):
    """A base table: declared columns, an optional primary key, alternate keys and foreign keys; columns
    that reference nested collections (``nested:``); and where its changes come from (``source:``: a
    Delta table, else ``ivm load`` and ``ivm log append``)."""

    #: column name to Spark SQL type (``int``, ``string``, ``decimal(10,2)``, ``date``, ``timestamp``,
    #: ``array<struct<a: string, b: int>>``), in order: a loaded or appended file's columns by name
    columns: dict[str, str]
    #: the primary key: set semantics by key, a delete or update must match the stored row; unset: a bag,
    #: duplicate rows count
    key: list[str] | None = None
    #: alternate keys (003's key-based analysis uses them)
    unique: list[list[str]] = Field(default_factory=list)
    #: foreign keys, ``column: table.column`` of a key of that table: they prune delta rules (a new
    #: order's lines cannot join an old delta)
    references: dict[str, str] = Field(default_factory=dict)
    #: columns holding the id of a nested collection stored by reference (002 §2.1)
    nested: dict[str, NestedReference] = Field(default_factory=dict)
    #: a Delta table read in place by its change data feed, instead of ``ivm load`` / ``ivm log append``
    source: SourceConfig | None = None
    #: a change that does not apply to the table (a delete of a row that is not there, ...): ``fail``
    #: refuses the refresh, naming it; ``quarantine`` sets its commit aside (listed by `ivm log list`,
    #: put back by `ivm log restore`) and the refresh goes on without it
    on_bad_change: Literal["fail", "quarantine"] = "fail"
    #: a Delta source's change data feed is Delta's own record of what changed (it cannot delete a row the
    #: table did not hold): it is trimmed into net deltas as it is; ``true`` checks each change against
    #: the stored rows as for a hand-appended log (`ivm log append`, which is always checked)
    verify_changes: bool | None = None

    @property
    def verified(self) -> bool:
        """Whether the trim checks each change against the stored rows (ivm.changes.trim)."""
        return self.source is None or bool(self.verify_changes)

    @field_validator("columns")
    @classmethod
    def _columns(cls, columns: dict[str, str]) -> dict[str, str]:
        if not columns:
            raise ValueError("a table needs at least one column")
        out = {}
        for name, type_text in columns.items():
            _check_name("column", name)
            if name in RESERVED_COLUMNS or name.startswith("__"):
                raise ValueError(f"column name {name!r} is reserved by ivm")
            out[name] = spark_type(str(type_text))
        return out

    @model_validator(mode="after")
    def _verify_changes_of_a_source(self) -> TableConfig:
        if self.verify_changes is not None and self.source is None:
            raise ValueError("verify_changes is a Delta source's (`source:`); a log appended with "
                             "`ivm log append` is always checked")
        return self

    @model_validator(mode="after")
    def _keys_name_columns(self) -> TableConfig:
        for label, cols in [("key", self.key or [])] + [("unique", u) for u in self.unique]:
            if label == "key" and self.key is not None and not cols:
                raise ValueError("key: an empty key; omit `key` for a table without one")
            for c in cols:
                if c not in self.columns:
                    raise ValueError(f"{label}: unknown column {c!r}")
            if len(set(cols)) != len(cols):
                raise ValueError(f"{label}: a column is repeated in {cols}")
        for col, target in self.references.items():
            if col not in self.columns:
                raise ValueError(f"references: unknown column {col!r}")
            if target.count(".") != 1:
                raise ValueError(f"references.{col}: {target!r} is not of the form table.column")
        for col in self.nested:
            if col not in self.columns:
                raise ValueError(f"nested: unknown column {col!r}")
        return self

    @property
    def keyed(self) -> bool:
        return bool(self.key)

    def ddl(self) -> str:
        """The table's schema as a Spark DDL string (``a INT, b STRING``)."""
        return ", ".join(f"`{c}` {t}" for c, t in self.columns.items())


class AggregateConfig(_Model):
    """A user-defined aggregate, one of three kinds:

    - ``sql``: a Spark SQL expression over the array ``vals`` (runs in the JVM, no Python);
    - ``python``: a function ``module:function`` taking a list and returning a ``returns`` value;
    - inductive (001 §2): ``initial``, ``iterate``, ``merge`` and ``final`` Spark SQL expressions over a
      state, and optionally ``retract`` (ivm.ir.Inductive says which names each may use). It is
      maintained from its stored state per group: on inserts always, on deletes when ``retract`` is
      given (otherwise the groups a delete touches are recomputed from their stored values).
    """

    #: a Spark SQL expression over the array ``vals``
    sql: str | None = None
    #: a Python function ``module:function`` taking a list
    python: str | None = None
    #: the Spark SQL type a ``python`` aggregate returns
    returns: str | None = None
    #: inductive: the state of an empty group (a Spark SQL expression)
    initial: str | None = None
    #: inductive: the state after adding value ``x`` to ``state``
    iterate: str | None = None
    #: inductive: two groups' states, ``state`` and ``other``, combined
    merge: str | None = None
    #: inductive: the aggregate's value from ``state``
    final: str | None = None
    #: inductive, optional: the state after removing value ``x`` from ``state`` (else a delete re-reads the
    #: group)
    retract: str | None = None

    #: the names each expression of an inductive aggregate may read
    INDUCTIVE_NAMES: ClassVar[dict[str, set[str]]] = {
        "initial": set(), "iterate": {"state", "x"}, "merge": {"state", "other"}, "final": {"state"},
        "retract": {"state", "x"}}

    @property
    def inductive(self) -> bool:
        return self.initial is not None

    @model_validator(mode="after")
    def _one_kind(self) -> AggregateConfig:
        steps = {k: getattr(self, k) for k in self.INDUCTIVE_NAMES}
        given = {k for k, v in steps.items() if v is not None}
        if sum([self.sql is not None, self.python is not None, bool(given)]) != 1:
            raise ValueError("an aggregate needs exactly one of `sql`, `python` or `initial`/`iterate`/`merge`/`final`")
        if given:
            missing = [k for k in ("initial", "iterate", "merge", "final") if k not in given]
            if missing:
                raise ValueError(f"an inductive aggregate needs {', '.join(missing)} too")
            if self.returns is not None:
                raise ValueError("returns: only a Python aggregate declares its type (Spark infers the others')")
            for k in given:
                tree = _parse_sql(k, steps[k])
                names = {c.parts[0].name for c in tree.find_all(exp.Column)} - {
                    p.name for lam in tree.find_all(exp.Lambda) for p in lam.expressions}
                unknown = sorted(names - self.INDUCTIVE_NAMES[k])
                if unknown:
                    allowed = " and ".join(f"`{n}`" for n in sorted(self.INDUCTIVE_NAMES[k])) or "no column"
                    raise ValueError(f"{k}: reads {', '.join(unknown)}; it may read {allowed}")
        elif self.sql is not None:
            tree = _parse_sql("sql", self.sql)
            if "vals" not in {c.name for c in tree.find_all(exp.Column)}:
                raise ValueError("sql: the expression must use the array `vals`")
        else:
            if ":" not in self.python:
                raise ValueError("python: write module:function")
            if self.returns is None:
                raise ValueError("returns: a Python aggregate needs its Spark SQL result type")
            spark_type(self.returns)
        return self


def _parse_sql(field: str, text: str) -> exp.Expression:
    try:
        return sqlglot.parse_one(text, read="spark")
    except ParseError as e:
        raise ValueError(f"{field}: not a Spark SQL expression: {str(e).splitlines()[0]}") from e


class ReduceSettings(_Model):
    """004's reducing algorithms for a view maintained with ``strategy: reduce``."""

    #: NAIVE (Algorithm 1), RIE (2), RIC (3), REDUCE (4) or REDUCE+ (5: selections and projections early)
    algorithm: ReduceAlgorithm = ReduceAlgorithm.REDUCE_PLUS
    #: several changed tuples at once (§6): MU1 (Algorithm 6) or MU2 (Algorithm 7: the inserted
    #: candidates count as existing tuples for the deletions)
    multiple_updates: MultipleUpdates = MultipleUpdates.MU2


class CrossoverSettings(_Model):
    """`mode: auto`'s choice of a full recompute over incremental maintenance from the view's measured
    costs (ivm.maintain.crossover)."""

    #: off: ``auto`` recomputes only when it must
    enabled: bool = True
    #: a full recompute must be estimated to save at least this many seconds ... (1 s: above the spread of
    #: one view's refresh times between runs on a small change; a project's views each save their own,
    #: so 5 s, the earlier default, kept all 22 views of tests/bench/many.py incremental at 1-3 s over
    #: recomputes of 0.4-2.7 s each)
    min_saving_seconds: float = Field(default=1.0, ge=0)
    #: ... and the incremental estimate must exceed the full one this many times
    ratio: float = Field(default=1.2, ge=1)
    #: incremental refreshes the estimate is fitted to (the newest)
    history: int = Field(default=20, ge=1)


#: the schedule presets a view may name: Airflow's (airflow.utils.dates.cron_presets, and its two special
#: strings), and ivm's ``@sources`` (its group runs on its Delta sources' asset events, ivm.orchestration)
SCHEDULE_PRESETS = ("@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly", "@once", "@continuous",
                    "@sources")


class ViewConfig(_Model):
    """A view: SQL or Datalog (inline text or a file path) and its per-view options."""

    #: the view in Spark SQL: inline text or a ``.sql`` file's path (relative to the project file)
    sql: str | None = None
    #: the view in Datalog (000's and 001's notation): inline text or a ``.dl`` file's path
    datalog: str | None = None
    #: a cron string (checked by croniter, as Airflow checks it; spaces normalized) or a preset
    schedule: str | None = None
    #: the sampled recomputation after each refresh that maintained the view (ivm.validate)
    validate_: ValidateSettings = Field(default_factory=ValidateSettings, alias="validate")
    #: columns that identify a row of the view: validation expects them not null and unique, and
    #: samples by them (default: the GROUP BY columns, else all columns)
    key: list[str] | None = None
    #: auto: the planner chooses per run (incremental unless a recompute is needed or cheaper);
    #: incremental: maintained from the deltas, refused where a run cannot; full: recomputed every run
    mode: Mode = Mode.AUTO
    #: when ``auto`` recomputes instead because the view's measured costs say it is cheaper
    crossover: CrossoverSettings = Field(default_factory=CrossoverSettings)
    #: how a set-semantics projection view is maintained: counting (000, derivation counts), keyed (003's
    #: derived rules) or reduce (004); unset: chosen per run by a cost model (ivm.maintain.strategy)
    strategy: StrategyName | None = None
    #: 004's algorithm and multiple-update method, where REDUCE maintains the view
    reduce: ReduceSettings = Field(default_factory=ReduceSettings)
    #: rounds a recursive fixpoint (evaluation or a DRed step) may take before the refresh fails
    max_iterations: int = Field(1000, ge=1)

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = " ".join(value.split())
        if value.startswith("@"):
            if value not in SCHEDULE_PRESETS:
                raise ValueError(f"unknown schedule preset {value!r} (presets: {', '.join(SCHEDULE_PRESETS)})")
        elif not croniter.is_valid(value):
            raise ValueError(f"{value!r} is not a cron string (minute hour day-of-month month day-of-week) "
                             "or a preset")
        return value
    #: CReaM (001 §4): materialize an auxiliary view for each setof subgoal and for each GROUP BY with a
    #: non-distributive aggregate over a table, so the view is refreshed from it and the deltas alone
    auxiliary_views: bool = True
    #: where the view is published as a Delta table (a path or URI, relative to the project file; default
    #: ``<warehouse>/delta/<view>``), when ``storage.delta_views`` is on (ivm.sinks)
    sink: str | None = None
    #: the file the definition came from, if any (set by the loader)
    source: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("mode")
    @classmethod
    def _asked_mode(cls, mode: Mode) -> Mode:
        if mode not in Mode.asked():
            raise ValueError(f"mode must be one of {', '.join(Mode.asked())}")
        return mode

    @model_validator(mode="after")
    def _one_language(self) -> ViewConfig:
        if (self.sql is None) == (self.datalog is None):
            raise ValueError("a view needs exactly one of `sql` or `datalog`")
        return self

    @property
    def language(self) -> str:
        return "sql" if self.sql is not None else "datalog"

    @property
    def definition(self) -> str:
        return self.sql if self.sql is not None else self.datalog  # type: ignore[return-value]

    def definition_sha256(self) -> str:
        """SHA-256 of the view's language and definition text, as its Delta table's properties name it."""
        return hashlib.sha256(f"{self.language}\n{self.definition}".encode()).hexdigest()


class ProjectConfig(_Model):
    """The whole project file. ``root`` is the folder relative paths are resolved against."""

    #: the project's name: its Airflow assets' ``ivm://<name>/<view>`` and the Spark catalog database of
    #: its views; default: the name of the project file's folder
    name: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    #: where ivm keeps change logs, layers and the views' Delta tables: a folder or a URI Spark can write
    #: (``file://``, ``hdfs://``, ``s3a://``)
    warehouse: str = "./warehouse"
    #: the catalog database, any SQLAlchemy URL (``postgresql+psycopg2://...``); default: SQLite in a local
    #: warehouse (``<warehouse>/catalog.db``)
    catalog: str | None = None
    #: how ivm reaches Spark
    spark: SparkSettings = Field(default_factory=SparkSettings)
    #: layers, compaction, garbage collection and the views' Delta tables
    storage: StorageSettings = Field(default_factory=StorageSettings)
    #: OpenLineage events of refreshes
    lineage: LineageSettings = Field(default_factory=LineageSettings)
    #: the base tables, by name
    tables: dict[str, TableConfig] = Field(default_factory=dict)
    #: the views, by name
    views: dict[str, ViewConfig] = Field(default_factory=dict)
    #: user-defined aggregates, by the name views call them with
    aggregates: dict[str, AggregateConfig] = Field(default_factory=dict)
    root: str = "."

    @field_validator("tables", "views", "aggregates")
    @classmethod
    def _names(cls, items: dict) -> dict:
        for name in items:
            _check_name("relation", name)
        return items

    @model_validator(mode="after")
    def _cross_references(self) -> ProjectConfig:
        for name in self.views:
            if name in self.tables:
                raise ValueError(f"views.{name}: a table has the same name")
        for tname, table in self.tables.items():
            for col, target in table.references.items():
                ref_table, ref_col = target.split(".")
                if ref_table not in self.tables:
                    raise ValueError(f"tables.{tname}.references.{col}: unknown table {ref_table!r}")
                referenced = self.tables[ref_table]
                if ref_col not in referenced.columns:
                    raise ValueError(f"tables.{tname}.references.{col}: table {ref_table!r} has no column {ref_col!r}")
                if [ref_col] != list(referenced.key or []) and [ref_col] not in referenced.unique:
                    raise ValueError(f"tables.{tname}.references.{col}: {target} is not a key of {ref_table} "
                                     "(a foreign key references the table's key or a unique column)")
                if referenced.columns[ref_col] != table.columns[col]:
                    raise ValueError(f"tables.{tname}.references.{col}: the column is {table.columns[col]} but "
                                     f"{target} is {referenced.columns[ref_col]}")
            for col, ref in table.nested.items():
                where = f"tables.{tname}.nested.{col}"
                target = self.tables.get(ref.collection)
                if target is None:
                    raise ValueError(f"{where}: unknown collection table {ref.collection!r}")
                if ref.id not in target.columns:
                    raise ValueError(f"{where}: table {ref.collection!r} has no column {ref.id!r}")
                if target.columns[ref.id] != table.columns[col]:
                    raise ValueError(f"{where}: the column is {table.columns[col]} but {ref.collection}.{ref.id} "
                                     f"is {target.columns[ref.id]}")
        self._nesting_is_not_recursive()
        return self

    def _nesting_is_not_recursive(self) -> None:
        """002 §2.1: a nested scheme may nest to any depth but must stay non-recursive."""
        edges = {t: {r.collection for r in c.nested.values()} for t, c in self.tables.items()}

        def visit(t: str, path: list[str]) -> None:
            for s in sorted(edges.get(t, ())):
                if s in path:
                    raise ValueError(f"tables.{t}.nested: collections nest each other in a cycle: "
                                     f"{' -> '.join([*path[path.index(s):], s])}")
                visit(s, [*path, s])

        for t in edges:
            visit(t, [t])

    def digest(self) -> str:
        """SHA-256 of the project as read (every setting, every view's text, environment variables
        substituted, the folder resolved) and of ivm's version: `ivm apply` of a file whose digest the
        catalog recorded at the last apply has nothing to do (ivm.project.Project.apply). Key order is
        kept: a table's columns in another order are another table."""
        from ivm import __version__

        doc = {**self.model_dump(mode="json", by_alias=True), "root": str(Path(self.root).resolve())}
        return hashlib.sha256(json.dumps([__version__, doc], default=str).encode()).hexdigest()

    def check_views(self, names: Iterable[str]) -> None:
        """NotFoundError naming the first of ``names`` that is not a view of the project. Told from the
        project file alone: the CLI asks before it imports Spark's modules (an unknown name costs Python's
        start, not PySpark's)."""
        unknown = [v for v in names if v not in self.views]
        if unknown:
            raise NotFoundError(f"unknown view {unknown[0]!r}")

    def check_table(self, name: str) -> None:
        """NotFoundError when ``name`` is not a table of the project file, naming the tables there are."""
        if name not in self.tables:
            raise NotFoundError(f"unknown table {name!r} (tables: {', '.join(self.tables) or 'none'})")

    # -- resolved names and locations ---------------------------------------------------------------

    @property
    def project_name(self) -> str:
        """``name``, else the project folder's name made an identifier (lower case, ``_`` for the rest)."""
        return self.name or re.sub(r"[^a-z0-9_]", "_", Path(self.root).resolve().name.lower()) or "ivm"

    @property
    def database(self) -> str:
        """The Spark catalog database the views are registered in."""
        return self.storage.database or self.project_name

    @property
    def warehouse_uri(self) -> str:
        """The warehouse as Spark sees it: an absolute local path, or a URI with a scheme."""
        return _resolve_location(self.warehouse, Path(self.root))

    @property
    def warehouse_is_local(self) -> bool:
        return "://" not in self.warehouse_uri

    @property
    def catalog_url(self) -> str:
        """The SQLAlchemy URL of the catalog; SQLite in the warehouse unless the file says otherwise."""
        if self.catalog is None:
            if not self.warehouse_is_local:
                raise ConfigError("catalog: required when the warehouse is not a local folder")
            return f"sqlite:///{Path(self.warehouse_uri) / 'catalog.db'}"
        url = self.catalog
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            rel = url[len("sqlite:///"):]
            if rel and rel != ":memory:":
                return f"sqlite:///{(Path(self.root) / rel).resolve()}"
        return url


def resolve_location(location: str, root: Path | str) -> str:
    """A folder or URI of the project file, absolute: a URI as it is, a path against ``root``."""
    return _resolve_location(location, Path(root))


def _resolve_location(location: str, root: Path) -> str:
    if location.startswith("file://"):
        location = location[len("file://"):]
    if "://" in location:
        return location.rstrip("/")
    return str((root / location).resolve())


def _read_definition(view: dict, root: Path, where: str) -> dict:
    """Replace a view's `sql`/`datalog` file path by the file's text, remembering the path."""
    for lang, suffixes in (("sql", (".sql",)), ("datalog", (".dl", ".datalog"))):
        text = view.get(lang)
        if isinstance(text, str) and "\n" not in text.strip() and text.strip().endswith(suffixes):
            path = (root / text.strip()).resolve()
            if not path.is_file():
                raise ConfigError(f"{where}.{lang}: file {text.strip()!r} not found (looked at {path})")
            view = {**view, lang: path.read_text(), "source": str(path)}
    return view


def find_project_file(path: str | os.PathLike | None = None) -> Path:
    """`--project PATH`, else $IVM_PROJECT, else ./ivm.yaml (docs/design.md §8)."""
    chosen = path or os.environ.get(PROJECT_ENV) or DEFAULT_PROJECT
    p = Path(chosen)
    if p.is_dir():
        p = p / DEFAULT_PROJECT
    if not p.is_file():
        hint = "" if path or os.environ.get(PROJECT_ENV) else f" (pass --project or set {PROJECT_ENV})"
        raise ConfigError(f"project file {str(p)!r} not found{hint}")
    return p.resolve()


_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(text: str, source: str) -> str:
    """``${NAME}`` and ``${NAME:-default}`` in the project file are replaced by environment variables, so
    one file serves several deployments and secrets (a catalog password) stay out of it."""
    def value(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is None:
            line = text.count("\n", 0, m.start()) + 1
            raise ConfigError(f"{source}: line {line}: environment variable {name} is not set "
                              f"(write ${{{name}:-default}} for a default)")
        return default

    return _ENV_REFERENCE.sub(value, text)


def load_project(path: str | os.PathLike | None = None) -> ProjectConfig:
    """Read and validate the project file. Raises `ConfigError` naming the file and the field."""
    file = find_project_file(path)
    try:
        raw = yaml.safe_load(interpolate(file.read_text(), str(file))) or {}
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else "invalid YAML"
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{file}: not valid YAML{where}: {first}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: the project file must be a mapping of settings")
    return parse_project(raw, root=file.parent, source=str(file))


def parse_project(raw: dict, root: Path | str = ".", source: str = "ivm.yaml") -> ProjectConfig:
    """Validate a project given as a mapping (what `load_project` does after reading YAML)."""
    root = Path(root).resolve()
    views = raw.get("views") or {}
    if isinstance(views, dict):
        raw = {**raw, "views": {n: _read_definition(v, root, f"views.{n}") if isinstance(v, dict) else v
                                for n, v in views.items()}}
    try:
        return ProjectConfig.model_validate({**raw, "root": str(root)})
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise ConfigError(f"{source}: {loc or 'project'}: {msg}{more}") from e
