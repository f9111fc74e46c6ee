"""The Python API: ``Project.open(path)`` and the operations the CLI, the jobs and the DAGs call."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from ivm import compaction, evolution, explain, gc, sinks
from ivm.aggregates import used_by
from ivm.catalog import Catalog
from ivm.catalog.models import Run, utcnow
from ivm.catalog.store import new_id
from ivm.changes import delta, ingest, quarantine
from ivm.config import COUNT_COLUMN, ProjectConfig, TableConfig, ViewConfig, load_project
from ivm.context import RunContext
from ivm.errors import ConfigError
from ivm.ir import Program
from ivm.maintain import strategy
from ivm.maintain.relations import StoredRelations
from ivm.modes import Mode
from ivm.refresh import RefreshResult, refresh
from ivm.refresh.plan import choose_strategy
from ivm.spark import project_conf
from ivm.storage import Warehouse
from ivm.stratify import Strata
from ivm.validate import ViewCheck, ViewState, check_views
from ivm.vocabulary import Outcome, RunStatus

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


class Project:
    """A project file, its catalog and its warehouse: the public face over a `RunContext`, which the
    stages, validation, compaction and garbage collection take. Spark starts on first use."""

    def __init__(self, config: ProjectConfig, catalog: Catalog | None = None,
                 start_spark: Callable[[], SparkSession] | None = None):
        self.ctx = RunContext(config, StoredRelations, catalog, start_spark)

    @classmethod
    def open(cls, path: str | None = None, start_spark: Callable[[], SparkSession] | None = None,
             spark: SparkSession | None = None) -> Project:
        """Open the project at ``path`` (else $IVM_PROJECT, else ./ivm.yaml). Its Spark is ``spark`` if
        given (the user's own session, classic or Spark Connect), else started when first needed: by
        ``start_spark`` if given (a spark-submit job: its master and conf), else as `ivm.spark.session`
        finds it (a Spark Connect server, or local Spark from the project's ``spark:`` settings)."""
        if spark is not None:
            start_spark = lambda: spark  # noqa: E731 - the user's session, as it is
        return cls(load_project(path), start_spark=start_spark)

    # -- what the run context holds (ivm.context) ---------------------------------------------------

    @property
    def config(self) -> ProjectConfig:
        return self.ctx.config

    @property
    def catalog(self) -> Catalog:
        return self.ctx.catalog

    @property
    def warehouse(self) -> Warehouse:
        return self.ctx.warehouse

    @property
    def spark(self) -> SparkSession:
        return self.ctx.spark

    @property
    def program(self) -> tuple[Program, Strata]:
        return self.ctx.program

    def schema(self, relation: str) -> StructType:
        return self.ctx.schema(relation)

    def stored_relations(self, view: str) -> list[str]:
        return self.ctx.stored_relations(view)

    def base_tables(self, view: str) -> list[str]:
        return self.ctx.base_tables(view)

    def close(self) -> None:
        self.ctx.close()

    # -- definitions -----------------------------------------------------------------------------

    def table(self, name: str) -> TableConfig:
        """A table of the project file that `ivm apply` has recorded unchanged."""
        self.config.check_table(name)
        applied = self.catalog.table_defs().get(name)
        if applied is None:
            raise ConfigError(f"table {name} is not in the catalog yet; run `ivm apply`")
        if _table_spec(self.config.tables[name]) != _applied_spec(applied):
            raise ConfigError(f"table {name} differs in the project file from the catalog; run `ivm apply`")
        return self.config.tables[name]

    def _check_types(self) -> None:
        """Let Spark analyse every view's plan over empty tables: a type mismatch (comparing a string
        with an array, summing a struct) is refused at apply, naming the view; no Spark job runs."""
        if not self.config.views:
            return
        from pyspark.errors import AnalysisException

        for view in self.config.views:
            try:
                self.schema(view)
            except AnalysisException as e:
                raise ConfigError(_inductive_type_error(self.config, view, e)
                                  or f"views.{view}: Spark cannot evaluate it: {e.getMessage().splitlines()[0]}") from e

    def _check_validation(self) -> None:
        """A view's declared key and expectations name its columns, and GE knows the expectations."""
        for name, view in self.config.views.items():
            columns = self.program[0].predicates[name].columns
            unknown = [c for c in view.key or [] if c not in columns]
            if unknown:
                raise ConfigError(f"views.{name}.key: unknown column {unknown[0]!r} "
                                  f"(the view has {', '.join(columns)})")
            if view.validate_.expectations:
                from ivm.expectations import user_expectation

                for spec in view.validate_.expectations:
                    user_expectation(spec.model_dump(), name, columns)

    def apply(self, recheck: bool = False) -> list[str]:
        """`ivm apply`: record the project's tables and views in the catalog.

        Every view is compiled and stratified first: a bad definition is refused with the view and
        construct named, and nothing is stored. A table that already holds data or changes keeps its
        key and columns, which may be added to and widened (ivm.evolution); any other change would
        reinterpret stored files, and is refused too.

        The project file's digest is recorded with the definitions: the same file applied again (a
        script's or a deployment's routine `ivm apply`) answers from the catalog without starting Spark,
        after checking with delta-rs that the Delta sources' change data feeds are still on (#49 item
        4). ``recheck`` applies it in full anyway (Spark analyses every view again, the Spark catalog
        names are registered again), e.g. after the metastore or a Python aggregate's module changed.
        """
        digest = self.config.digest()
        unchanged = None if recheck else self._applied_unchanged(digest)
        if unchanged is not None:
            return [unchanged]
        _ = self.program
        self._check_types()
        for view, cfg in self.config.views.items():
            if cfg.strategy is not None:  # a forced strategy must apply to the view
                program, strata = self.program
                why = strategy.lookup(cfg.strategy).applies(program, strata, view)
                if not why.applicable:
                    raise ConfigError(f"views.{view}: strategy {cfg.strategy} does not apply: {why.why}")
        self._check_validation()
        for name, table in self.config.tables.items():  # Delta sources: change data feed on, columns there
            if table.source is not None:
                delta.check_source(self.spark, name, table, self.ctx.source_location(name))
        applied = self.catalog.table_defs()
        evolved, added = [], {}
        for name, table in self.config.tables.items():
            old = applied.get(name)
            if old is None or not (self.catalog.state(name).layers or self.catalog.last_commit_version(name) > 0):
                continue  # (a table without data may be redefined at will)
            before, after = _applied_spec(old), _table_spec(table)
            ev = evolution.evolve(name, before["columns"], before["key"], after["columns"], after["key"])
            evolved += [ev] if ev else []
            added[name] = [c for c in table.columns if c in (old.added_columns or []) or c in ev.added] or None
        view_notes, stale = self._evolved_views(evolved)
        notes = [line for ev in evolved for line in ev.describe()] + view_notes
        tables = {n: {**_table_spec(t), "added_columns": added.get(n)} for n, t in self.config.tables.items()}
        views = {n: _view_spec(self.config, v) for n, v in self.config.views.items()}
        now = utcnow()
        for view in stale:  # recomputed by the next refresh, as after a change of its definition
            views[view]["updated_at"] = now
        # (the views' names in the Spark catalog first: a name another table holds is refused before the
        # catalog's definitions change; registering again is a no-op)
        registered = (sinks.register(self.ctx) if self.config.storage.delta_views
                      and self.config.storage.register_views else [])
        changes = self.catalog.save_definitions(tables, views, digest)
        dropped = sorted(set(applied) - set(self.config.tables))
        changes += [f"table {n} is no longer in the project file (its data is kept)" for n in dropped]
        return changes + notes + [f"view {name} registered in the Spark catalog" for name in registered]

    def _applied_unchanged(self, digest: str) -> str | None:
        """What `apply` says when the catalog holds this very project file applied (its digest), and the
        Delta sources' feeds are on still; None when it must apply in full (a change, a first apply, a
        source named through the Spark catalog: only Spark finds it)."""
        applied = self.catalog.applied_digest()
        if applied is None or applied[0] != digest or any(
                t.source is not None and t.source.table is not None for t in self.config.tables.values()):
            return None
        for name, table in self.config.tables.items():
            if table.source is not None:
                delta.check_feed(name, self.ctx.source_location(name))
        log.info("the project file is as applied at %s: nothing to apply", applied[1])
        return (f"nothing changed: the project file is as applied at {applied[1]:%Y-%m-%d %H:%M:%S} UTC "
                "(`ivm apply --recheck` analyses it with Spark again)")

    def _evolved_views(self, evolved: list[evolution.Evolution]) -> tuple[list[str], list[str]]:
        """What the evolution of tables does to the stored views over them, from their stored files'
        schemas against their new ones: the columns a view gains (it selects ``*``) or widens; and the
        views to recompute, because a relation they store holds a column their new compiled form does
        not name (its state could not be read as it was written). Returns (notes, those views)."""
        tables, notes, stale = {ev.table for ev in evolved}, [], []
        for view in self.config.views if evolved else []:
            if not self.catalog.state(view).layers or not tables & set(self.base_tables(view)):
                continue
            for relation in self.stored_relations(view):
                layers = self.catalog.state(relation).layers
                if not layers:
                    continue
                stored = {f.name: f.dataType for f in self.spark.read.parquet(layers[0].path).schema.fields
                          if f.name != COUNT_COLUMN}
                new = {f.name: f.dataType for f in self.ctx.schema(relation).fields}
                unread = [c for c in stored if c not in new]
                if unread:
                    stale.append(view)
                    notes.append(f"view {view} is recomputed by the next refresh: {relation} stores column "
                                 f"{unread[0]}, which its new compiled form does not name")
                    break
                if relation != view:
                    continue
                notes += [f"view {view} gains column {c} (NULL in the rows it holds, as in its tables')"
                          for c in new if c not in stored]
                notes += [f"view {view}: column {c} widens from {stored[c].simpleString()} to {t.simpleString()}"
                          for c, t in new.items() if c in stored and stored[c] != t]
        return notes, stale

    # -- data in ----------------------------------------------------------------------------------

    def _loaded_here(self, table: str) -> TableConfig:
        """A table whose rows and changes come through ivm (not a Delta source's: those change there)."""
        cfg = self.table(table)
        if cfg.source is not None:
            raise ConfigError(f"table {table} reads Delta table {self.ctx.source_location(table)}: change it there "
                              "(UPDATE, DELETE, MERGE INTO); ivm reads its change data feed on refresh")
        return cfg

    def load(self, table: str, path: str) -> tuple[int, int]:
        """`ivm load`: the table's initial snapshot. Returns (rows, version)."""
        cfg = self._loaded_here(table)
        run_id = new_id("load-")
        with self.catalog.run(run_id, "load", {table: 0}, [table], leases=[table],
                              lease_timeout=self.ctx.lease_timeout):
            return ingest.load_snapshot(lambda: self.spark, self.catalog, self.warehouse, table, cfg, path, run_id,
                                        self.config.storage.target_file_mb, self._time_zone())

    def append(self, table: str, path: str, fmt: str = "cdf") -> ingest.AppendResult:
        """`ivm log append`: validate and store a change file as the table's next log segment."""
        cfg = self._loaded_here(table)
        added = self.catalog.table_defs()[table].added_columns or []
        return ingest.append_log(lambda: self.spark, self.catalog, self.warehouse, table, cfg, path, fmt, added,
                                 self._time_zone())

    def _time_zone(self) -> str:
        """The time zone of the project's Spark session (a file read without Spark reads times in it)."""
        return project_conf(self.config).get("spark.sql.session.timeZone", "UTC")

    def quarantine(self, table: str, version: int, reason: str | None = None) -> str:
        """`ivm log quarantine`: set a commit (a Delta source's Delta version) aside (ivm.changes.quarantine)."""
        self.table(table)
        return quarantine.set_aside(self.catalog, self.config, table, version, reason)

    def restore(self, table: str, version: int) -> str:
        """`ivm log restore`: put a quarantined commit back (ivm.changes.quarantine)."""
        self.table(table)
        return quarantine.restore(self.spark, self.catalog, self.warehouse, self.config, table, version)

    def log_listing(self, table: str) -> quarantine.LogListing:
        """`ivm log list`: the table's log segments and quarantined commits."""
        self.table(table)
        return quarantine.listing(self.catalog, self.config, table)

    # -- runs ------------------------------------------------------------------------------------

    def refresh(self, views: list[str] | None = None, mode: str = Mode.AUTO,
                progress: Progress = lambda _: None) -> RefreshResult:
        """`ivm refresh`: bring the tables and views (or the named views and what they read) to the
        newest snapshot of the logs. ``mode``: auto, incremental or full."""
        self._check_applied()
        return refresh(self.ctx, progress, views, mode)

    def _check_applied(self) -> None:
        for name in self.config.tables:
            self.table(name)
        applied = self.catalog.view_defs()
        stale = [v for v in self.config.views if v not in applied]
        if stale:
            raise ConfigError(f"view {stale[0]} is not in the catalog yet; run `ivm apply`")

    def backfill(self, views: list[str], full: bool = False, from_version: int | None = None,
                 sample: int | None = None, progress: Progress = lambda _: None) -> RefreshResult:
        """`ivm backfill`: refresh the named views (and the views they read) now; with ``full``,
        recompute them from the current snapshot; with ``from_version``, replay the tables' changes
        since commit version N onto the state they had before it (ivm.refresh.plan.plan_replay); ``sample``
        overrides the views' validation sample size. The stages of the ivm_backfill DAG, in this process."""
        if not views:
            raise ConfigError("backfill: name at least one view")
        self.config.check_views(views)
        self._check_applied()
        return refresh(self.ctx, progress, views, Mode.FULL if full else Mode.AUTO, kind="backfill",
                       from_version=from_version, sample=sample)

    def validate(self, views: list[str] | None = None, sample: int | None = None,
                 progress: Progress = lambda _: None) -> list[ViewCheck]:
        """`ivm validate`: the sampled recomputation check (ivm.validate) of published views (default:
        all), recorded as a run of kind ``validate``. A view whose watermarks lag its tables' (a refresh
        has not caught it up) is not checked: it holds an older snapshot than the tables."""
        self._check_applied()
        names = views or list(self.config.views)
        self.config.check_views(names)
        watermarks = self.catalog.watermarks()
        states, read = [], set()
        for view in names:
            tables = self.base_tables(view)
            state = self.catalog.state(view)
            behind = [t for t in tables if watermarks.get((view, t), 0) != watermarks.get((t, t), 0)]
            if state.version_id is None or behind:
                progress(f"validate: {view}: not checked, " + ("not materialized yet" if state.version_id is None
                         else f"it has not absorbed the published state of {behind[0]} (run `ivm refresh`)"))
                continue
            states.append(ViewState(view, [x.path for x in state.layers], sum(x.rows or 0 for x in state.layers),
                                    form=state.form))
            read |= set(tables)
        if not states:
            return []
        run_id = new_id("validate-")
        snapshot = {t: watermarks.get((t, t), 0) for t in sorted(read)}
        try:
            with self.catalog.run(run_id, "validate", snapshot, [s.view for s in states]):
                checks = check_views(self.ctx, run_id, states, {t: [x.path for x in self.catalog.state(t).layers]
                                                                for t in sorted(read)}, sample, progress)
        finally:
            self.warehouse.delete(self.warehouse.path("staging", run_id))
        failed = [c for c in checks if c.status == Outcome.FAILED]
        self.catalog.finish_run(run_id, RunStatus.FAILED if failed else RunStatus.SUCCEEDED,
                                f"{failed[0].view}: {failed[0].problem}" if failed else None)
        return checks

    def explain(self, view: str) -> explain.Explanation:
        """`ivm explain`: the view's stratum, dependencies, rules and maintenance plan."""
        self.config.check_views([view])
        program, strata = self.program
        state = self.catalog.state(view)
        choice = choose_strategy(self.ctx, view, current=state.form if state.version_id is not None else None)
        return explain.explain(program, strata, self.config, view, choice)

    def compact(self, relations: Iterable[str] | None = None, force: bool = False,
                progress: Progress = lambda _: None) -> list[compaction.Compaction]:
        """`ivm compact`: the relations' layers past the threshold (all with more than one: ``force``);
        then the views' Delta tables are OPTIMIZEd (ivm.sinks), those named or all."""
        names = list(relations) if relations is not None else self.ctx.all_relations()
        done = compaction.compact(self.ctx, names, force=force, progress=progress)
        if self.config.storage.delta_views:
            sinks.optimize(self.ctx, [v for v in names if v in self.config.views] if relations is not None else None,
                           progress)
        return done

    def gc(self, progress: Progress = lambda _: None) -> gc.GcResult:
        """`ivm gc`: versions, layers and log segments past ``storage.retention_hours``; the views'
        Delta tables VACUUMed with the same retention (ivm.sinks)."""
        result = gc.collect(self.ctx)
        if self.config.storage.delta_views:
            sinks.vacuum(self.ctx, progress)
        return result

    def runs(self, limit: int = 20) -> list[Run]:
        return self.catalog.runs(limit)

    # -- data out ----------------------------------------------------------------------------------

    def read_zset(self, name: str) -> DataFrame:
        """The relation's current version consolidated: its columns plus ``__count`` (for a view, the
        number of derivations)."""
        self._readable(name)
        return self.ctx.read_zset(name)

    def _readable(self, name: str) -> None:
        """NotFoundError for an unknown name or a view not materialized yet (told before Spark starts:
        ivm.catalog.Catalog.check_readable)."""
        self.catalog.check_readable(name, self.config.tables, self.config.views, lambda: self.program[0].predicates)
        self.schema(name)

    def last_delta(self, name: str) -> DataFrame | None:
        """What the newest version of a relation changed, as a Z-set (+n inserted, -n deleted tuples):
        its last delta layer; None when the newest version is a base layer (a load, a full recompute,
        a compaction)."""
        state = self.catalog.state(name)
        if not state.layers or state.layers[-1].kind != "delta":
            return None
        return self.warehouse.read_layers(self.spark, [state.layers[-1].path], self.schema(name))

    def read(self, name: str) -> DataFrame:
        """The relation as SQL returns it: bag rows repeated, set rows once, no ``__count``."""
        self._readable(name)
        return self.ctx.read_state(name)

    def register_temp_views(self) -> list[str]:
        """A Spark temporary view per table and materialized view, so `SELECT * FROM hop` works."""
        names = []
        for name in [*self.config.tables, *self.config.views]:
            if name in self.config.views and self.catalog.state(name).version_id is None:
                continue
            self.read(name).createOrReplaceTempView(name)
            names.append(name)
        return names


def _table_spec(t: TableConfig) -> dict:
    return {"columns": dict(t.columns), "key": list(t.key) if t.key else None,
            "unique_keys": [list(u) for u in t.unique], "references": dict(t.references)}


def _applied_spec(row) -> dict:
    return {"columns": dict(row.columns), "key": list(row.key) if row.key else None,
            "unique_keys": [list(u) for u in row.unique_keys or []], "references": dict(row.references or {})}


def _view_spec(config: ProjectConfig, v: ViewConfig) -> dict:
    """A view's definition as the catalog records it. The definitions of the registered aggregates it
    calls are among its options: changing one recomputes the views that call it, as changing their own
    text does (a stored state of an inductive aggregate has the old definition's shape)."""
    options = v.model_dump(mode="json", by_alias=True, exclude={"sql", "datalog"}, exclude_none=True)
    uses = used_by(config.aggregates, v.definition)
    if uses:
        options["aggregates"] = {a: config.aggregates[a].model_dump(mode="json", exclude_none=True) for a in uses}
    return {"language": v.language, "definition": v.definition, "options": options}


def _inductive_type_error(config: ProjectConfig, view: str, e) -> str | None:
    """A fold whose state changes type (``initial`` an INT, ``iterate`` a DOUBLE), said in the words of
    the project file rather than Spark's rendering of the lambdas."""
    params = e.getMessageParameters() or {}
    if e.getCondition() != "DATATYPE_MISMATCH.UNEXPECTED_INPUT_TYPE" or not params.get("sqlExpr", "").startswith(
            '"aggregate('):
        return None
    names = [n for n in used_by(config.aggregates, config.views[view].definition) if config.aggregates[n].inductive]
    if not names:
        return None
    which = (f"the inductive aggregate {names[0]}" if len(names) == 1
             else f"one of the inductive aggregates {', '.join(names)}")
    return (f"views.{view}: {which}: `initial` gives its state the type {params.get('requiredType', '?')}, `iterate` "
            f"{params.get('inputType', '?')}; write both in one type (CAST)").replace('"', "")

