"""A refresh run (DESIGN.md §6), as stages that each read what the stages before them recorded in the
catalog, so one process can run them all (`ivm refresh`) or an Airflow task can run each (ivm.orchestration):

    plan      fix the snapshot (the newest commit version of every base table's log); pick the tables
              with changes past their watermark and the views to refresh; record the run, its plan and
              the versions it read, and take the leases (``plan`` + ``begin``)
    trim      per table, the net delta between its watermark and the snapshot, checked (002 §3)
    maintain  per view, stratum by stratum: the counting algorithm over the old states and the deltas
              (ivm.maintain.counting), DRed for recursive components (ivm.maintain.dred), or a full
              recompute from the new snapshot (ivm.maintain.recompute) where the view is new, its
              definition changed in a way DRed cannot follow, or the mode says so
    validate  check the staged new states before anything is visible
    publish   one catalog transaction: new layers, watermarks, the run's outcome (the commit point)
    compact   relations whose layers passed the threshold, as their own atomic step

Every stage is idempotent: it stages its output under names fixed by the run (a retry overwrites its
own files and replaces its own record) and never touches published data; publish is the only stage that
changes what readers see. A refresh with nothing to do launches no Spark job. A failure anywhere before
publish leaves every relation as it was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from ivm.catalog.store import LayerRef, PublishChange, StageRecord, aware
from ivm.changes.ingest import has_update_images, read_log
from ivm.changes.trim import log_bounds, trim
from ivm.config import COUNT_COLUMN
from ivm.errors import ChangeDataError, ConfigError, NotFoundError, RunError, ValidationError, one_line
from ivm.lang import compile_project
from ivm.maintain import nested
from ivm.maintain.count_free import CountFree
from ivm.maintain.counting import Counting, RunStates, ephemeral, materialize, view_predicates
from ivm.maintain.crossover import estimate as crossover_estimate
from ivm.maintain.dred import RuleChange, rule_change
from ivm.maintain.recompute import Evaluator, as_used
from ivm.maintain.strategy import stored_form
from ivm.spark import adaptive
from ivm.storage import Scratch, WrittenLayer, new_id
from ivm.zset import consolidate, small_change

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ivm.project import Project

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
#: tables trimmed at once (each a few small Spark jobs; beyond a handful they only queue)
TRIM_THREADS = 4
MODES = ("auto", "incremental", "full")


@dataclass
class TableDelta:
    """What a refresh did to one base table."""

    table: str
    from_version: int
    to_version: int
    log_rows: int
    delta_rows: int = 0
    seconds: float = 0.0
    layer: WrittenLayer | None = None
    #: the trim stage has staged this table's delta
    trimmed: bool = False
    #: keys of a keyed table whose net delta updates them (both images), as the trim observed; None:
    #: not known (a bag table, a replay of published deltas)
    updated_keys: int | None = None


@dataclass
class ViewWork:
    """What a refresh does to one view: its mode, why, and the layers it wrote."""

    view: str
    stratum: int
    mode: str  # incremental | full | noop
    reason: str
    upstream: list[str]
    #: the upstream tables whose logs changed in this run
    changed_inputs: list[str] = field(default_factory=list)
    #: rows of the input deltas the view's delta rules read (incremental), or of its inputs' deltas
    delta_in: int = 0
    #: rows of the view's own delta layer (incremental): tuples whose count changed
    rows_changed: int | None = None
    #: rows written: the delta layer (incremental) or the new base layer (full)
    rows: int | None = None
    seconds: float = 0.0
    #: rules removed from and added to the view since its stored state was computed (DRed follows them)
    rule_change: RuleChange | None = None
    #: what the algorithm did beyond the delta (DRed: tuples over-deleted, rederived, inserted)
    detail: dict[str, int] = field(default_factory=dict)
    #: every relation the view stores (itself, auxiliary predicates, GROUPBY states) -> its new layer
    layers: dict[str, WrittenLayer] = field(default_factory=dict)
    #: a maintain stage has staged this view's layers
    maintained: bool = False
    #: (mode, reason) as planned, before a maintain stage found it a noop (a retry starts from these)
    planned: tuple[str, str] | None = None
    #: counting, keyed (003) or reduce (004), and the cost model's candidates (ivm.maintain.strategy)
    strategy: str = "counting"
    choice: dict | None = None


@dataclass
class Plan:
    run_id: str
    snapshot: dict[str, int]
    tables: list[TableDelta] = field(default_factory=list)
    views: list[ViewWork] = field(default_factory=list)
    mode: str = "auto"
    #: a replay (``ivm backfill --from-version N``): where it starts; see `plan_replay`
    replay: Replay | None = None


@dataclass
class Replay:
    """The state a replay starts from: every relation the views need as a published run left it."""

    from_version: int
    #: the run whose published state is restored, and its snapshot
    run_id: str
    snapshot: dict[str, int]
    #: relation -> its layers in that state (json, as `_layer_json`)
    layers: dict[str, list[dict]]

    def paths(self, name: str) -> list[str]:
        return [x["path"] for x in self.layers[name]]


@dataclass
class RefreshResult:
    run_id: str | None
    status: str  # succeeded | noop
    snapshot: dict[str, int]
    tables: list[TableDelta]
    seconds: float
    views: list[ViewWork] = field(default_factory=list)
    compacted: list[str] = field(default_factory=list)

    SUMMARY_HEADERS = ["relation", "mode", "commit versions", "rows in the delta", "rows changed", "rows written",
                       "seconds"]

    def summary_rows(self) -> list[list[object]]:
        """Tables: log rows in, net delta rows out. Views: input delta rows in, changed tuples out."""
        rows: list[list[object]] = [
            [t.table, "trim", f"{t.from_version + 1}..{t.to_version}", t.log_rows, t.delta_rows, t.delta_rows,
             f"{t.seconds:.2f}"] for t in self.tables]
        rows += [[v.view, v.mode, "", v.delta_in, "" if v.rows_changed is None else v.rows_changed,
                  "" if v.rows is None else v.rows, f"{v.seconds:.2f}"] for v in self.views]
        return rows


def plan(project: Project, views: list[str] | None = None, mode: str = "auto", run_id: str | None = None,
         from_version: int | None = None) -> Plan:
    """Stage 1: the snapshot, the tables with changes past their watermark, the views to refresh
    (with ``from_version``: a replay, `plan_replay`)."""
    if from_version is not None:
        if mode == "full":
            raise ConfigError("a replay from a commit version maintains the views; it cannot be --full as well")
        return plan_replay(project, views or [], from_version, run_id)
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    catalog = project.catalog
    snapshot = {name: catalog.last_commit_version(name) for name in project.config.tables}
    watermarks = catalog.watermarks()
    p = Plan(run_id or new_id("refresh-"), snapshot, mode=mode)
    # a refresh of some views trims only the tables they read: the other tables' readers keep their
    # deltas for their own next refresh
    read = {t for v in views for t in project.base_tables(v)} if views else set(snapshot)
    for name, newest in snapshot.items():
        wm = watermarks.get((name, name), 0)
        if newest > wm and name in read:
            rows = sum(s.rows for s in catalog.segments(name, wm, newest))
            p.tables.append(TableDelta(name, wm, newest, rows))
    p.views = _plan_views(project, p, views, mode, watermarks)
    return p


def _plan_views(project: Project, p: Plan, wanted: list[str] | None, mode: str,
                watermarks: dict[tuple[str, str], int]) -> list[ViewWork]:
    """Which views this run refreshes, and how (DESIGN.md §5's algorithm choice, per run):

    * full recompute for ``--mode full`` or a view configured ``mode: full``, a first
      materialization, a changed definition, a stored relation not materialized yet, or a view that
      reads a view recomputed in full in this run (its delta would be the whole difference), or, under
      ``--mode auto``, a change past the view's crossover by its measured costs
      (ivm.maintain.crossover; the estimates are recorded either way);
    * incremental across a changed definition when the view is recursive and only rules of its
      recursive predicates were added or removed: DRed follows rule changes (000 §7), and the views
      above it are maintained from its delta;
    * otherwise incremental (the counting algorithm, 000 §4-6, with DRed for recursive components)
      when an input table changed. Counting
      stores derivation counts and GROUPBY states, so every reference is maintainable under inserts,
      deletes and updates alike: 003's safety conditions concern maintenance *without* counts
      (``strategy: keyed``), not this one.
    """
    program, strata = project.program
    names = list(project.config.views)
    if wanted:
        unknown = [v for v in wanted if v not in project.config.views]
        if unknown:
            raise NotFoundError(f"unknown view {unknown[0]!r}")
        names = sorted({u for v in wanted for u in strata.upstream(v) if u in project.config.views} | set(wanted))
    changed = {t.table for t in p.tables}
    change_rows = {t.table: float(t.log_rows) for t in p.tables}
    defined = project.catalog.view_defs()
    work: list[ViewWork] = []
    full: set[str] = set()
    followed: set[str] = set()  # views whose rule change DRed follows, and the views above them
    for view in sorted(names, key=lambda v: (strata.stratum_of[v], v)):
        upstream = project.base_tables(view)
        state = project.catalog.state(view)
        d = defined.get(view)
        configured = project.config.views[view].mode
        inputs = sorted(changed & set(upstream))
        recomputed = sorted(full & strata.upstream(view))
        missing = [r for r in project.stored_relations(view) if project.catalog.state(r).version_id is None]
        # a table whose changes an earlier run applied without refreshing this view (a refresh of other
        # views, another schedule group): those deltas are gone, so the view is recomputed
        missed = [t for t in upstream if watermarks.get((view, t), 0) < watermarks.get((t, t), 0)]
        reason = None
        if mode == "full" or configured == "full":
            reason = "--mode full" if mode == "full" else "the view is configured with mode: full"
        elif state.version_id is None:
            reason = "first materialization"
        elif d is not None and state.created_at is not None and aware(d.updated_at) > state.created_at:
            reason = "the definition changed"
        elif missing:
            reason = f"{missing[0]} is not materialized yet"
        elif missed:
            t = missed[0]
            reason = (f"commit versions {watermarks.get((view, t), 0) + 1}..{watermarks[(t, t)]} of {t} were applied "
                      "by a run that did not refresh this view")
        elif recomputed:
            reason = f"reads {', '.join(recomputed)}, recomputed in this run"
        choice = project.choose_strategy(view, change_rows, state.form if state.version_id is not None else None)
        if reason is None and stored_form(choice.strategy) != state.form:
            reason = (f"{choice.strategy} stores the view as {stored_form(choice.strategy)}, its state holds "
                      f"{state.form} ({choice.reason})")
        crossover = project.config.views[view].crossover
        estimate = None
        if reason is None and inputs and mode == "auto" and configured == "auto" and crossover.enabled:
            # the crossover (ivm.maintain.crossover): a full recompute when the measured costs say so
            fulls = project.catalog.maintain_history(view, "full", 1)
            estimate = crossover_estimate(project.catalog.maintain_history(view, "incremental", crossover.history),
                                          fulls[0][1] if fulls else None, int(sum(change_rows[t] for t in inputs)),
                                          crossover)
            if estimate.full:
                reason = f"auto: {estimate.why}"
        recursive = algorithm(program, strata, view).startswith("DRed")
        change = _rule_change(project, view, d) if reason == "the definition changed" and recursive else None
        if isinstance(change, RuleChange):
            followed.add(view)
            work.append(ViewWork(view, strata.stratum_of[view], "incremental",
                                 f"DRed (000 §7) across the changed definition: {change.describe()}"
                                 + (f"; inputs changed: {', '.join(inputs)}" if inputs else ""),
                                 upstream, inputs, rule_change=change))
        elif reason is not None:
            if change:
                reason += f" ({change})"
            if mode == "incremental" or configured == "incremental":
                raise ConfigError(f"views.{view}: cannot be maintained incrementally in this run ({reason}); "
                                  "use --mode auto or full")
            full.add(view)
            work.append(ViewWork(view, strata.stratum_of[view], "full", reason, upstream, inputs))
        elif inputs or followed & strata.upstream(view):
            why = [f"inputs changed: {', '.join(inputs)}"] if inputs else []
            why += [f"reads {v}, maintained across its changed definition" for v in sorted(followed & strata.upstream(view))]
            if followed & strata.upstream(view):
                followed.add(view)
            how = algorithm(program, strata, view) if choice.strategy == "counting" else \
                describe_strategy(project, view, choice.strategy)
            work.append(ViewWork(view, strata.stratum_of[view], "incremental", f"{how}: {'; '.join(why)}",
                                 upstream, inputs))
        else:
            continue
        work[-1].strategy, work[-1].choice = choice.strategy, choice.as_dict()
        if estimate is not None:
            work[-1].choice["crossover"] = estimate.as_dict()
    return work


def describe_strategy(project: Project, view: str, strategy: str) -> str:
    """The count-free algorithm maintaining a view, as the run's reason names it."""
    if strategy == "reduce":
        cfg = project.config.views[view].reduce
        return f"{cfg.algorithm} (004) with {cfg.multiple_updates}"
    return "key-based (003 §5.4)"


def plan_replay(project: Project, wanted: list[str], from_version: int, run_id: str | None = None) -> Plan:
    """`ivm backfill VIEW... --from-version N`: the views (and the views they read) go back to the state
    a published run left them in before commit version N of every table they read, and the tables'
    changes since then are applied to them again by the same maintenance a refresh runs, up to the
    tables' published states (the tables themselves do not change). What the views hold now is not
    read: a replay repairs views whose maintained state went wrong after N (a bug, a hand edit, a lost
    layer) at the cost of the changes since N, where ``--full`` costs a recompute.

    The restored state is the newest run whose publish recorded every needed relation consistent with
    its snapshot (`Catalog.restore_points`), with that snapshot before N for every table; the changes
    are each table's published state minus its restored one (its delta layers since then, as trimmed
    from the log then). A replay is refused when no such run is on record or garbage collection dropped
    a restored version (``storage.retention_hours``)."""
    catalog = project.catalog
    program, strata = project.program
    if not wanted:
        raise ConfigError("a replay names the views to replay")
    unknown = [v for v in wanted if v not in project.config.views]
    if unknown:
        raise NotFoundError(f"unknown view {unknown[0]!r}")
    if from_version < 1:
        raise ConfigError(f"--from-version {from_version}: commit versions start at 1")
    views = sorted({u for v in wanted for u in strata.upstream(v) if u in project.config.views} | set(wanted),
                   key=lambda v: (strata.stratum_of[v], v))
    tables = sorted({t for v in views for t in project.base_tables(v)})
    needed = [*tables, *(r for v in views for r in project.stored_relations(v))]
    before = [(run, versions) for run, versions in catalog.restore_points()
              if all(run.snapshot.get(t, 0) < from_version for t in tables)]
    found = next(((run, versions) for run, versions in before if all(r in versions for r in needed)), None)
    if found is None:
        missing = next((r for r in needed if not any(r in versions for _, versions in before)), None)
        raise NotFoundError(
            f"cannot replay {', '.join(wanted)} from commit version {from_version}: no published run before it "
            f"(of {', '.join(tables)}) left {missing or 'every relation they need'} at its snapshot; use --full")
    run, versions = found
    layers = {}
    for r in needed:
        state = catalog.version_state(r, versions[r])
        if state is None:
            raise NotFoundError(f"cannot replay from commit version {from_version}: the state of {r} after run "
                                f"{run.id} was garbage-collected (storage.retention_hours); use --full")
        layers[r] = [_layer_json(x, r) for x in state.layers]
    watermarks = catalog.watermarks()
    restored = {t: int(run.snapshot.get(t, 0)) for t in tables}
    p = Plan(run_id or new_id("backfill-"), {t: watermarks.get((t, t), 0) for t in tables}, mode="replay",
             replay=Replay(from_version, run.id, restored, layers))
    p.tables = [TableDelta(t, restored[t], p.snapshot[t], 0) for t in tables if p.snapshot[t] > restored[t]]
    changed = {t.table for t in p.tables}
    defined = catalog.view_defs()
    since = "; ".join(f"{t.table} {t.from_version + 1}..{t.to_version}" for t in p.tables) or "no changes since"
    full: set[str] = set()
    for view in views:
        upstream = project.base_tables(view)
        d = defined.get(view)
        restored = catalog.version_state(view, versions[view])
        recomputed = sorted(full & strata.upstream(view))
        choice = project.choose_strategy(view, {t.table: float(t.to_version - t.from_version) for t in p.tables},
                                         restored.form)
        reason = None
        if project.config.views[view].mode == "full":
            reason = "the view is configured with mode: full"
        elif d is not None and restored.created_at is not None and aware(d.updated_at) > restored.created_at:
            reason = f"the definition changed after run {run.id}"
        elif recomputed:
            reason = f"reads {', '.join(recomputed)}, recomputed in this run"
        elif stored_form(choice.strategy) != restored.form:
            reason = f"{choice.strategy} stores the view as {stored_form(choice.strategy)}, the restored state holds " \
                     f"{restored.form}"
        if reason is not None:
            full.add(view)
            work = ViewWork(view, strata.stratum_of[view], "full", reason, upstream, sorted(changed & set(upstream)))
        else:
            how = algorithm(program, strata, view) if choice.strategy == "counting" else \
                describe_strategy(project, view, choice.strategy)
            work = ViewWork(view, strata.stratum_of[view], "incremental",
                            f"{how}: replay from the state after run {run.id} "
                            f"(commit versions {since})", upstream, sorted(changed & set(upstream)))
        work.strategy, work.choice = choice.strategy, choice.as_dict()
        p.views.append(work)
    return p


def _rule_change(project: Project, view: str, applied) -> RuleChange | str | None:
    """For a view whose definition changed since its stored state was computed: the rules DRed must
    follow (000 §7), or why it cannot; None when the earlier definition is not known."""
    if applied is None or not applied.materialized:
        return None
    before = project.config.views[view].model_copy(update={
        "sql": None, "datalog": None, applied.materialized["language"]: applied.materialized["definition"]})
    try:
        old = compile_project(project.config.model_copy(update={"views": {**project.config.views, view: before}}))
    except ConfigError as e:
        return f"the earlier definition no longer compiles: {e}"
    return rule_change(old, project.program[0], view)


def algorithm(program, strata, view: str) -> str:
    """How a view is maintained incrementally: counting, with DRed for its recursive components."""
    recursive = [p for c in strata.components if c.recursive for p in c.predicates
                 if p in view_predicates(program, strata, view)]
    if recursive:
        return f"DRed (000 §7) for {', '.join(recursive)}, counting (000 §4-6) around it"
    return "counting (000 §4-6)"


def replay_delta(project: Project, p: Plan, item: TableDelta) -> TableDelta:
    """Stage 2 of a replay, for one table: its changes since the restored state, as the published state
    minus the restored one. While no compaction intervened the published state is the restored layers
    followed by the delta layers of the runs since (each the net delta trimmed from the log then), and
    the change is those layers; otherwise the difference of the two states. Staged in the run's scratch
    space: a replay publishes no table."""
    started = time.perf_counter()
    name, schema = item.table, project.schema(item.table)
    restored = p.replay.layers[name]
    current = project.catalog.state(name).layers
    read = lambda paths: project.warehouse.read_layers(project.spark, paths, schema)  # noqa: E731
    if [x.id for x in current[:len(restored)]] == [x["id"] for x in restored]:
        added = current[len(restored):]
        item.log_rows = sum(x.rows or 0 for x in added)
        delta = consolidate(read([x.path for x in added]))
    else:
        item.log_rows = sum(x.rows or 0 for x in current)
        old = read(p.replay.paths(name)).withColumn(COUNT_COLUMN, -F.col(COUNT_COLUMN))
        delta = consolidate(read([x.path for x in current]).unionByName(old))
    path, rows, size = Scratch(project.warehouse, project.spark, p.run_id).put(f"replay/{name}", delta)
    item.delta_rows = rows
    item.layer = WrittenLayer(f"replay-{name}", name, "delta", path, rows, size) if rows else None
    item.seconds = time.perf_counter() - started
    return item


def trim_table(project: Project, run_id: str, item: TableDelta) -> Callable[[], TableDelta]:
    """Stage 2 for one table: read its log range, check it against the snapshot, write the net delta.
    The catalog is read here (log segments, the table's layers); the Spark work is the returned
    function, which the stage runs beside the other tables'."""
    started = time.perf_counter()
    name, table = item.table, project.config.tables[item.table]
    # read under the lease: a late commit that landed since the plan is part of this range too
    segments = project.catalog.segments(name, item.from_version, item.to_version)
    item.log_rows = sum(s.rows for s in segments)
    layers = project.catalog.state(name).layers
    schema, spark = project.schema(name), project.spark
    # where the range's keys fall, as its segments recorded when they were appended (all of them, or
    # the trim finds them from the log with a query)
    bounds = log_bounds(table, [s.key_bounds for s in segments])

    def run() -> TableDelta:
        changes = read_log(spark, table, segments, item.from_version, item.to_version)
        current = project.warehouse.read_layers(spark, [x.path for x in layers], schema)
        net = trim(name, table, changes, current, sum(x.rows or 0 for x in layers),
                   update_images=has_update_images(project.warehouse, segments),
                   small=item.log_rows > 0 and small_change(item.log_rows, project.config.spark.single_partition_rows),
                   bounds=bounds)
        layer = project.warehouse.write_layer(net.delta, name, "delta", run_id=run_id)
        try:
            net.check()  # observed while the delta was written
        except ChangeDataError:
            project.warehouse.delete(layer.path)
            raise
        if layer.rows == 0:  # every change cancelled out: advance the watermark, keep no empty layer
            project.warehouse.delete(layer.path)
            layer = None
        item.layer, item.delta_rows, item.updated_keys = layer, layer.rows if layer else 0, net.updated_keys()
        item.seconds = time.perf_counter() - started
        return item

    return run


# -- the run's record: what each stage staged, so the next stage (another process) can go on ------------


def _layer_json(layer: WrittenLayer | LayerRef, relation: str | None = None) -> dict:
    """A layer as a run's record keeps it (a catalog LayerRef names no relation: ``relation`` does)."""
    return {"id": layer.id, "relation": relation or layer.relation, "kind": layer.kind, "path": layer.path,
            "rows": layer.rows, "bytes": layer.bytes}


def _layer(d: dict) -> WrittenLayer:
    return WrittenLayer(d["id"], d["relation"], d["kind"], d["path"], d["rows"], d["bytes"])


def begin(project: Project, p: Plan, kind: str = "refresh") -> None:
    """Stage 1's record: the run, its plan and the versions it read (publish checks nothing moved), and
    the leases on everything it will publish. Beginning a run id again (a retried plan task, a re-run of
    a failed DAG run) drops what its earlier attempt staged and plans afresh; a published run is final."""
    catalog = project.catalog
    names = [t.table for t in p.tables] + [v.view for v in p.views]
    # every table a planned view reads is leased too, trimmed or not: another run (another schedule
    # group) publishing it between this run's stages would otherwise hand the views a newer state than
    # the watermarks this run records
    read = sorted({t for v in p.views for t in v.upstream} - set(names))
    stored = [r for v in p.views for r in project.stored_relations(v.view)]
    earlier = catalog.run(p.run_id)
    if earlier is not None:
        if earlier.status in ("succeeded", "noop"):
            raise RunError(f"run {p.run_id} was published already; start a new run")
        catalog.reset_run(p.run_id, p.snapshot, names, p.mode)
    else:
        catalog.start_run(p.run_id, kind, p.snapshot, names, mode=p.mode)
    catalog.acquire_leases(p.run_id, names + read, project.lease_timeout)
    versions = {n: catalog.state(n).version_id for n in [*names, *stored]}
    catalog.save_stage(p.run_id, StageRecord("plan", detail={
        "snapshot": p.snapshot, "mode": p.mode, "versions": versions,
        "replay": p.replay and {"from_version": p.replay.from_version, "run_id": p.replay.run_id,
                                "snapshot": p.replay.snapshot, "layers": p.replay.layers},
        "tables": [{"table": t.table, "from_version": t.from_version, "to_version": t.to_version,
                    "log_rows": t.log_rows} for t in p.tables],
        "views": [{"view": v.view, "stratum": v.stratum, "mode": v.mode, "reason": v.reason, "upstream": v.upstream,
                   "changed_inputs": v.changed_inputs, "rule_change": v.rule_change is not None,
                   "strategy": v.strategy, "choice": v.choice} for v in p.views]}))


def load_plan(project: Project, run_id: str) -> tuple[Plan, dict[str, int | None]]:
    """The plan ``begin`` recorded, with the tables and views as their stages have staged them so far."""
    records = project.catalog.stage_records(run_id)
    plans = [r for r in records if r.stage == "plan"]
    if not plans:
        raise NotFoundError(f"run {run_id} has no plan (run the plan stage first)")
    d = plans[-1].detail
    p = Plan(run_id, d["snapshot"], mode=d["mode"], replay=Replay(**d["replay"]) if d.get("replay") else None)
    trimmed = {r.relation: r for r in records if r.stage == "trim"}
    maintained = {r.relation: r for r in records if r.stage == "maintain"}
    for t in d["tables"]:
        item = TableDelta(t["table"], t["from_version"], t["to_version"], t["log_rows"])
        if t["table"] in trimmed:
            r = trimmed[t["table"]]
            item.delta_rows, item.seconds, item.trimmed = r.delta_rows or 0, r.seconds or 0.0, True
            item.layer = _layer(r.detail["layer"]) if r.detail.get("layer") else None
            item.updated_keys = r.detail.get("updated_keys")
        p.tables.append(item)
    defined = project.catalog.view_defs()
    for v in d["views"]:
        work = ViewWork(v["view"], v["stratum"], v["mode"], v["reason"], v["upstream"], v["changed_inputs"],
                        planned=(v["mode"], v["reason"]), strategy=v.get("strategy", "counting"),
                        choice=v.get("choice"))
        if v["rule_change"]:
            change = _rule_change(project, v["view"], defined.get(v["view"]))
            if not isinstance(change, RuleChange):
                raise RunError(f"run {run_id}: the definition of {v['view']} changed since the run was planned")
            work.rule_change = change
        if v["view"] in maintained:
            r = maintained[v["view"]]
            work.mode, work.reason, work.delta_in = r.mode or work.mode, r.detail.get("reason", work.reason), r.rows_in or 0
            work.rows, work.rows_changed, work.seconds = r.rows_out, r.delta_rows, r.seconds or 0.0
            work.detail = {k: n for k, n in r.detail.get("algorithm", {}).items()}
            work.layers = {name: _layer(x) for name, x in r.detail.get("layers", {}).items()}
            work.maintained = True
        p.views.append(work)
    return p, d["versions"]


def old_layer_refs(project: Project, p: Plan, name: str) -> list[LayerRef]:
    """The layers of the state a run maintains ``name`` from: the published one, or a replay's restored
    one."""
    if p.replay and name in p.replay.layers:
        return [LayerRef(x["id"], x["kind"], x["path"], x["rows"], x["bytes"]) for x in p.replay.layers[name]]
    return list(project.catalog.state(name).layers)


def old_layers(project: Project, p: Plan, name: str) -> list[tuple[str, int]]:
    """(path, rows) of each of `old_layer_refs`."""
    return [(x.path, x.rows or 0) for x in old_layer_refs(project, p, name)]


def old_paths(project: Project, p: Plan, name: str) -> list[str]:
    return [path for path, _ in old_layers(project, p, name)]


# -- stage 2: trim ---------------------------------------------------------------------------------------


def trim_stage(project: Project, run_id: str, progress: Progress = lambda _: None) -> list[TableDelta]:
    """Stage 2: every planned table's net delta, staged as its delta layer (written under a name fixed by
    the run and table, so a retried stage overwrites its own output).

    The tables are trimmed side by side (TRIM_THREADS threads submitting Spark jobs at once): a trim is
    a handful of small jobs and driver-side planning, which alone leave the executors idle. The first
    failure in plan order is raised once every trim has ended; nothing is recorded then."""
    p, _ = load_plan(project, run_id)
    if p.replay:
        done = [replay_delta(project, p, item) for item in p.tables]
    else:
        limit = project.config.spark.single_partition_rows
        # without adaptive execution when every log range is a small change's (ivm.spark.adaptive; one
        # setting of the session for the trims running side by side)
        with adaptive(project.spark, not all(small_change(t.log_rows, limit) for t in p.tables)):
            if len(p.tables) == 1:  # nothing to overlap with
                done = [trim_table(project, run_id, p.tables[0])()]
            else:
                runs = [inheritable_thread_target(project.spark)(trim_table(project, run_id, item))
                        for item in p.tables]
                with ThreadPoolExecutor(max_workers=TRIM_THREADS, thread_name_prefix="ivm-trim") as pool:
                    futures = [pool.submit(run) for run in runs]
                done = [f.result() for f in futures]  # (leaving the pool waited for every trim)
    for item in done:
        project.catalog.save_stage(run_id, StageRecord(
            "trim", item.table, mode="incremental", rows_in=item.log_rows, delta_rows=item.delta_rows,
            seconds=round(item.seconds, 3), status="staged",
            detail={"from_version": item.from_version, "to_version": item.to_version,
                    "layer": _layer_json(item.layer) if item.layer else None, "updated_keys": item.updated_keys}))
        progress(f"trim: {item.table}: commit versions {item.from_version + 1}..{item.to_version}, "
                 f"{item.log_rows} {'rows of published deltas' if p.replay else 'changes'} -> net delta of "
                 f"{item.delta_rows} rows ({item.seconds:.2f} s)")
    return p.tables


# -- stage 3: maintain -------------------------------------------------------------------------------------


class _Maintenance:
    """What maintaining views in this process shares: the run's states (published layers, this run's
    staged layers), one Counting over them, one full evaluator. Built from the run's record, so a stage
    that maintains one stratum (an Airflow task) sees what the stages before it staged."""

    def __init__(self, project: Project, p: Plan, scratch: Scratch):
        self.project, self.plan = project, p
        program, strata = project.program
        self.written: dict[str, WrittenLayer] = {}
        self.states = RunStates(read=lambda name, paths: project.warehouse.read_layers(project.spark, paths,
                                                                                       project.schema(name)),
                                write_delta=self._write_delta, scratch=scratch,
                                single_partition_rows=project.config.spark.single_partition_rows)
        relations = set(project.config.tables) | {r for w in p.views for r in project.stored_relations(w.view)} | {
            u for w in p.views for u in strata.upstream(w.view) if program.predicates[u].kind == "view"}
        self.old: dict[str, list[LayerRef]] = {}
        for name in relations:
            self.old[name] = old_layer_refs(project, p, name)
            self.states.old_paths[name] = [x.path for x in self.old[name]]
            rows = [x.rows for x in self.old[name]]
            self.states.old_rows[name] = None if None in rows else sum(rows)
        self.counting = Counting(program, strata, self.states, project.groupby_states, project.schema,
                                 project.max_iterations)
        for t in p.tables:  # (all noted before any is read: together they decide `small`)
            if t.layer:
                self.states.note(t.table, t.layer.path, t.layer.bytes or 0, t.layer.rows or 0)
        for t in p.tables:
            if t.layer:
                self.counting.note_delta(t.table, self.states.delta(t.table))
            if t.updated_keys is not None:
                self.counting.updated_keys[t.table] = t.updated_keys
        self.full = Evaluator(program, strata, {}, scratch=scratch, limits=project.max_iterations,
                              grouped_only=frozenset(ephemeral(program, strata)))  # (given: consolidated states)
        self.count_free = CountFree(program, strata, self.counting)
        for work in p.views:  # what earlier stages staged: the views of lower strata
            if work.maintained:
                self.absorb(work)

    def _write_delta(self, name: str, df) -> tuple[str, int] | None:
        layer = self.project.warehouse.write_layer(df, name, "delta", run_id=self.plan.run_id)
        if layer.rows == 0:  # nothing changed: no empty layer
            self.project.warehouse.delete(layer.path)
            return None
        self.written[name] = layer
        return layer.path, layer.bytes or 0, layer.rows or 0

    def new_state(self, name: str) -> DataFrame:
        """``name`` after this run, consolidated: the base layer a full recompute wrote, or its old layers
        and this run's delta (`Warehouse.read_consolidated`)."""
        states, project = self.states, self.project
        if name in states.replaced:  # a base layer: consolidated as written
            return states.new(name)
        layers = self.old.get(name, []) + ([LayerRef("", "delta", states.delta_paths[name], None,
                                                     states.delta_bytes[name])] if name in states.delta_paths else [])
        return project.warehouse.read_consolidated(project.spark, layers, project.schema(name),
                                                   project.cluster_columns(name))

    def absorb(self, work: ViewWork) -> None:
        """Make a view maintained by an earlier stage visible to the views above it: its new state, and
        (incremental) its delta as they use it."""
        for name, layer in work.layers.items():
            if work.mode == "full":
                self.states.replaced[name] = layer.path
            else:
                self.states.note(name, layer.path, layer.bytes or 0, layer.rows or 0)
        if work.mode == "incremental" and work.view in work.layers:
            self.counting.note_delta(work.view, self.states.delta(work.view))

    def maintain(self, work: ViewWork, progress: Progress) -> None:
        """One view: the counting algorithm (DRed inside it for recursive components) or a full recompute."""
        project, states, counting, full = self.project, self.states, self.counting, self.full
        program, strata = project.program
        started = time.perf_counter()
        self.written.clear()
        work.delta_in = sum(t.delta_rows for t in self.plan.tables if t.table in work.changed_inputs)
        if work.rule_change is not None:
            counting.rule_changes |= dict.fromkeys(view_predicates(program, strata, work.view), work.rule_change)
        elif work.mode == "incremental" and not any(counting.changed(u) for u in strata.upstream(work.view)):
            work.mode, work.reason = "noop", "the net deltas of its inputs are empty or cancel out"
            progress(f"maintain: {work.view}: nothing to do, {work.reason}")
            return
        if work.mode == "incremental" and work.strategy != "counting":
            outcome = self.count_free.maintain(work.view, work.strategy, project.config.views[work.view],
                                               work.upstream)
            delta = states.put_delta(work.view, outcome.delta) if outcome.delta is not None else None
            if delta is not None:  # a set change already: the views above use it as it is
                counting.used_delta[work.view] = delta
            own = self.written.get(work.view)
            work.rows_changed = work.rows = own.rows if own else 0
            work.detail = dict(outcome.detail)
            how = f"{work.reason.split(':')[0]}, {work.rows_changed} tuples changed" + (
                f" ({', '.join(f'{k} {n}' for k, n in outcome.detail.items())})" if outcome.detail else "")
            how += "".join(f"; {n}" for n in outcome.notes)
        elif work.mode == "incremental":
            probed, shortcuts = dict(counting.probes), sum(counting.shortcuts.values())
            for pred in view_predicates(program, strata, work.view):
                counting.maintain(pred)
            own = self.written.get(work.view)
            work.rows_changed = work.rows = own.rows if own else 0
            how = f"{work.reason.split(':')[0]}, {work.rows_changed} tuples changed"
            preds = set(view_predicates(program, strata, work.view))
            for component, stats in counting.dred_stats.items():
                if preds & set(component.predicates):
                    work.detail = {k: work.detail.get(k, 0) + n for k, n in stats.items()}
            if work.detail:
                how += " (DRed: " + ", ".join(f"{k} {n}" for k, n in work.detail.items()) + ")"
            for e in nested.extractions(program, strata.upstream(work.view)):
                if e in counting.extraction_rows:  # 002 §2.2: only the elements that changed
                    work.detail[f"Δ{e} elements"] = counting.extraction_rows[e]
                    how += f"; Δ{e}: {counting.extraction_rows[e]} changed elements"
            taken = sum(counting.shortcuts.values()) - shortcuts
            if taken:  # keyed lookups and foreign keys (ivm.maintain.references)
                work.detail["subgoals from deltas"] = taken
                how += f"; {taken} delta-rule subgoals taken from the deltas (keyed lookups, foreign keys)"
            once = sorted({t for pred in preds for t in counting.factorings.get(pred, [])})
            if once:  # unchanged subgoals joined once for all delta rules (Counting.factored)
                work.detail["joined once"] = len(once)
                how += f"; {', '.join(once)} joined once for all delta rules (unchanged)"
            ids = sum(counting.probes.values()) - sum(probed.values())
            if ids:  # 002 §4.3: collection changes reached their owners through the owner indexes
                work.detail["probed collection ids"] = ids
                how += f"; owner indexes probed with {ids} collection ids"
        else:
            own = set(view_predicates(program, strata, work.view))  # a recursive view is upstream of itself
            for name in strata.upstream(work.view) - set(full.relations) - own:
                if program.predicates[name].kind in ("base", "view"):  # (extractions: from their tables)
                    full.relations[name] = self.new_state(name)
            for name, df in materialize(full, project.groupby_states, work.view):
                if work.strategy != "counting":
                    if name != work.view:
                        continue  # key-based and reducing maintenance store the view alone, each tuple once
                    df = as_used(program.predicates[name], df)
                layer = project.warehouse.write_layer(df, name, "base", cluster_by=project.cluster_columns(name),
                                                      run_id=self.plan.run_id)
                self.written[name] = layer
                states.replaced[name] = layer.path
                if name in program.predicates:  # the predicates above read what was written, not its lineage
                    full.relations[name] = states.new(name)
                elif name in project.groupby_states:  # T of its GROUPBY subgoal, as the state holds it
                    st = project.groupby_states[name]
                    full.groupby_tables[st.subgoal] = st.finalize(states.new(name))
            work.rows = self.written[work.view].rows
            how = f"full recompute ({work.reason}), {work.rows} rows"
        work.layers = {r: self.written[r] for r in project.stored_relations(work.view) if r in self.written}
        work.seconds = time.perf_counter() - started
        progress(f"maintain: {work.view} (stratum {work.stratum}): {how} ({work.seconds:.2f} s)")


def maintain_stage(project: Project, run_id: str, views: list[str] | None = None,
                   progress: Progress = lambda _: None) -> list[ViewWork]:
    """Stage 3: the planned views (or the named ones, e.g. one stratum's), in stratum order. Each view's
    new layers are staged in the run's record; the views of lower strata must have been maintained by an
    earlier call (or in this one)."""
    p, _ = load_plan(project, run_id)
    todo = [w for w in p.views if views is None or w.view in views]
    unknown = sorted(set(views or []) - {w.view for w in p.views})
    if unknown:
        raise NotFoundError(f"run {run_id} does not refresh {unknown[0]}")
    for w in todo:
        below = [u.view for u in p.views if u.view in project.program[1].upstream(w.view)
                 and not u.maintained and u not in todo]
        if below:
            raise RunError(f"run {run_id}: {w.view} reads {below[0]}, which is not maintained yet")
    if not todo:
        return []
    for w in todo:  # a retried stage starts from what the stages before it staged, not from its own attempt
        w.maintained, w.layers, w.detail = False, {}, {}
        w.mode, w.reason = w.planned or (w.mode, w.reason)
    scratch = Scratch(project.warehouse, project.spark, f"{run_id}/{'+'.join(w.view for w in todo)[:100]}")
    m = _Maintenance(project, p, scratch)
    for work in todo:
        # a small run's incremental maintenance without adaptive execution (ivm.spark.adaptive); a full
        # recompute keeps it. Decided as the view starts: should its derived deltas outgrow the limit (a
        # fan-out), the rest of the view runs the distributed plan without it, as planned statically
        with adaptive(project.spark, not (work.mode == "incremental" and m.states.small)):
            m.maintain(work, progress)  # (what it wrote is visible to the views above it through m already)
        work.maintained = True
        project.catalog.save_stage(run_id, StageRecord(
            "maintain", work.view, mode=work.mode, rows_in=work.delta_in, rows_out=work.rows,
            delta_rows=work.rows_changed, seconds=round(work.seconds, 3), status="staged",
            detail={"stratum": work.stratum, "reason": work.reason, "relations": sorted(work.layers),
                    "strategy": work.strategy, "choice": work.choice,
                    "layers": {n: _layer_json(x) for n, x in work.layers.items()}, "algorithm": work.detail,
                    **work.detail}))
    return todo


# -- stage 4: validate -------------------------------------------------------------------------------------


def validate_stage(project: Project, run_id: str, progress: Progress = lambda _: None,
                   sample: int | None = None) -> dict[str, str]:
    """Stage 4: check every incrementally maintained view's staged new state before it is published
    (ivm.validate): no tuple the run changed may end with a negative count, and a sample of its keys
    (the ones the run touched first) recomputed from the new snapshot must equal it, row by row with
    counts, under its Great Expectations suite. Results go to the catalog. A failing view stops the
    publish (nothing is applied) unless its policy is ``warn``. ``sample`` overrides the views'
    ``validate.sample``. Returns the views with problems and what they are."""
    from ivm.validate import ViewState, check_views

    p, _ = load_plan(project, run_id)
    states = []
    for work in p.views:
        if work.mode != "incremental":  # a full recompute is its own recomputation; a noop changed nothing
            continue
        delta = work.layers.get(work.view)
        old = old_layers(project, p, work.view)
        states.append(ViewState(work.view, [path for path, _ in old] + ([delta.path] if delta else []),
                                sum(rows for _, rows in old) + (delta.rows or 0 if delta else 0),
                                delta.path if delta else None, stored_form(work.strategy),
                                delta.rows or 0 if delta else 0))
    if not states:
        return {}
    deltas = {t.table: t.layer.path for t in p.tables if t.layer}
    read = {t for w in p.views if w.mode == "incremental" for t in w.upstream}
    tables = {t: old_paths(project, p, t) + ([deltas[t]] if t in deltas else []) for t in sorted(read)}
    checks = check_views(project, run_id, states, tables, sample, progress)
    for c in checks:
        project.catalog.save_stage(run_id, StageRecord("validate", c.view, mode="incremental", status="staged",
                                                       rows_in=len(c.comparison.rows) if c.comparison else 0,
                                                       seconds=round(c.seconds, 3),
                                                       detail={"outcome": c.status, "problem": c.problem,
                                                               "report": c.report_uri}))
    failed = [c for c in checks if c.status == "failed"]
    if failed:
        raise ValidationError(f"view {failed[0].view}: {failed[0].problem} after run {run_id}; nothing was published")
    return {c.view: c.problem for c in checks if c.problem}


# -- stage 5: publish; stage 6: compact ---------------------------------------------------------------------


def publish_stage(project: Project, run_id: str, progress: Progress = lambda _: None) -> RefreshResult:
    """Stage 5, the commit point: every staged layer, the watermarks and the run's outcome in one catalog
    transaction (if any relation moved since the plan, nothing is published); then the run's staging
    folder goes. The only stage that changes what readers see."""
    started = time.perf_counter()
    p, versions = load_plan(project, run_id)
    missing = [t.table for t in p.tables if not t.trimmed] + [v.view for v in p.views if not v.maintained]
    if missing:
        raise RunError(f"run {run_id}: {missing[0]} has not been staged yet; nothing was published")
    failed = [r.relation for r in project.catalog.stage_records(run_id)
              if r.stage == "validate" and r.detail.get("outcome") == "failed"]
    if failed:
        raise ValidationError(f"run {run_id}: validation failed for {failed[0]}; nothing was published")
    if p.replay:  # the tables are as published; every view's restored state, plus its delta, replaces it
        changes = [PublishChange(r, versions.get(r), [v.layers[r]] if r in v.layers else [], create=True,
                                 replace=v.mode == "full", base=None if v.mode == "full" else
                                 [x["id"] for x in p.replay.layers[r]], form=stored_form(v.strategy) if r == v.view
                                 else None)
                   for v in p.views for r in project.stored_relations(v.view) if v.mode != "full" or r in v.layers]
        watermarks = {}
    else:
        changes = [PublishChange(t.table, versions[t.table], [t.layer]) for t in p.tables if t.layer]
        for v in p.views:
            changes += [PublishChange(r, versions.get(r), [layer], replace=v.mode == "full", create=True,
                                      form=stored_form(v.strategy) if v.mode == "full" and r == v.view else None)
                        for r, layer in v.layers.items()]
            if v.rule_change is not None and v.view not in v.layers:  # the new definition holds, unchanged
                changes.append(PublishChange(v.view, versions[v.view], []))
        watermarks = {(t.table, t.table): t.to_version for t in p.tables}
    watermarks |= {(v.view, t): p.snapshot[t] for v in p.views for t in v.upstream}
    # the states later replays may start from: each relation whose watermarks are this run's snapshot
    consistent = {t: {(t, t): n} for t, n in p.snapshot.items()}
    for view in project.config.views:
        tables = project.base_tables(view)
        if all(t in p.snapshot for t in tables):
            consistent |= dict.fromkeys(project.stored_relations(view), {(view, t): p.snapshot[t] for t in tables})
    status = "succeeded" if p.tables or p.views else "noop"
    project.catalog.publish(run_id, changes, watermarks, status=status, consistent=consistent)
    seconds = time.perf_counter() - started
    progress(f"publish: {len(changes)} new versions and {len(watermarks)} watermarks at one snapshot ({seconds:.2f} s)")
    project.warehouse.delete(project.warehouse.path("staging", run_id))  # set changes, fixpoint rounds
    return RefreshResult(run_id, status, p.snapshot, p.tables, seconds, p.views)


def compact_stage(project: Project, run_id: str, progress: Progress = lambda _: None) -> list[str]:
    """Stage 6: compact the relations this run grew past their thresholds, each in its own transaction."""
    p, _ = load_plan(project, run_id)
    grown = [t.table for t in p.tables if t.layer] + [r for v in p.views if v.mode == "incremental" for r in v.layers]
    return [c.relation for c in project.compact(grown, progress=progress)]


def report(project: Project, run_id: str) -> RefreshResult:
    """A run as its record tells it (what the report task logs)."""
    p, _ = load_plan(project, run_id)
    run = project.catalog.run(run_id)
    seconds = (aware(run.finished_at) - aware(run.started_at)).total_seconds() if run and run.finished_at else 0.0
    return RefreshResult(run_id, run.status if run else "unknown", p.snapshot, p.tables, seconds, p.views)


# -- all stages in one process -----------------------------------------------------------------------------


def refresh(project: Project, progress: Progress = lambda _: None, views: list[str] | None = None,
            mode: str = "auto", run_id: str | None = None, kind: str = "refresh",
            from_version: int | None = None, sample: int | None = None) -> RefreshResult:
    """`ivm refresh`: plan → trim → maintain → validate → publish → compact in this process, through the
    same stage functions the Airflow tasks run. Raises on bad change data or a failed validation;
    nothing is applied then."""
    started = time.perf_counter()
    p = plan(project, views, mode, run_id, from_version)
    if not p.tables and not p.views:
        progress("plan: no table has changes past its watermark and every view is current; nothing to refresh")
        return RefreshResult(None, "noop", p.snapshot, [], time.perf_counter() - started)
    progress(f"plan: run {p.run_id}, snapshot " + ", ".join(f"{t}@{v}" for t, v in p.snapshot.items())
             + f"; {len(p.tables)} tables and {len(p.views)} views to refresh"
             + (f"; replay from commit version {p.replay.from_version}: the state after run {p.replay.run_id} "
                "(" + ", ".join(f"{t}@{v}" for t, v in p.replay.snapshot.items()) + ")" if p.replay else ""))
    if "spark" not in vars(project):  # start Spark outside the stage timings
        t0 = time.perf_counter()
        _ = project.spark
        progress(f"spark: started ({time.perf_counter() - t0:.2f} s)")
    try:
        begin(project, p, kind)
        trim_stage(project, p.run_id, progress)
        maintain_stage(project, p.run_id, None, progress)
        validate_stage(project, p.run_id, progress, sample)
        result = publish_stage(project, p.run_id, progress)
    except BaseException as e:
        project.catalog.finish_run(p.run_id, "failed", one_line(e))
        raise
    result.compacted = compact_stage(project, p.run_id, progress)
    result.seconds = time.perf_counter() - started
    return result
