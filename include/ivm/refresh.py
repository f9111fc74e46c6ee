"""A refresh run (DESIGN.md §6), as a short list of stages.

    plan      fix the snapshot (the newest commit version of every base table's log); pick the tables
              with changes past their watermark and the views whose inputs changed
    trim      per table, the net delta between its watermark and the snapshot, checked (002 §3)
    maintain  per view, stratum by stratum: the counting algorithm over the old states and the deltas
              (ivm.maintain.counting), DRed for recursive components (ivm.maintain.dred), or a full
              recompute from the new snapshot (ivm.maintain.recompute) where the view is new, its
              definition changed in a way DRed cannot follow, or the mode says so
    publish   one catalog transaction: new layers, watermarks, the run's outcome (the commit point)
    compact   relations whose layers passed the threshold, as their own atomic step

A refresh with nothing to do launches no Spark job. A failure anywhere before publish leaves every
relation as it was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ivm.catalog.store import PublishChange, StageRecord, aware
from ivm.changes.ingest import read_log
from ivm.changes.trim import trim
from ivm.errors import ConfigError, NotFoundError, one_line
from ivm.lang import compile_project
from ivm.maintain.counting import Counting, RunStates, materialize, view_predicates
from ivm.maintain.dred import RuleChange, rule_change
from ivm.maintain.recompute import Evaluator
from ivm.storage import Scratch, WrittenLayer, new_id
from ivm.zset import consolidate

if TYPE_CHECKING:
    from ivm.project import Project

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
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


@dataclass
class Plan:
    run_id: str
    snapshot: dict[str, int]
    tables: list[TableDelta] = field(default_factory=list)
    views: list[ViewWork] = field(default_factory=list)


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


def plan(project: Project, views: list[str] | None = None, mode: str = "auto") -> Plan:
    """Stage 1: the snapshot, the tables with changes past their watermark, the views to refresh."""
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    catalog = project.catalog
    snapshot = {name: catalog.last_commit_version(name) for name in project.config.tables}
    watermarks = catalog.watermarks()
    p = Plan(new_id("refresh-"), snapshot)
    for name, newest in snapshot.items():
        wm = watermarks.get((name, name), 0)
        if newest > wm:
            rows = sum(s.rows for s in catalog.segments(name, wm, newest))
            p.tables.append(TableDelta(name, wm, newest, rows))
    p.views = _plan_views(project, p, views, mode)
    return p


def _plan_views(project: Project, p: Plan, wanted: list[str] | None, mode: str) -> list[ViewWork]:
    """Which views this run refreshes, and how (DESIGN.md §5's algorithm choice, per run):

    * full recompute for ``--mode full`` or a view configured ``mode: full``, a first
      materialization, a changed definition, a stored relation not materialized yet, or a view that
      reads a view recomputed in full in this run (its delta would be the whole difference);
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
    defined = project.catalog.view_defs()
    work: list[ViewWork] = []
    full: set[str] = set()
    followed: set[str] = set()  # views whose rule change DRed follows, and the views above them
    for view in sorted(names, key=lambda v: (strata.stratum_of[v], v)):
        upstream = sorted(u for u in strata.upstream(view) if program.predicates[u].kind == "base")
        state = project.catalog.state(view)
        d = defined.get(view)
        configured = project.config.views[view].mode
        inputs = sorted(changed & set(upstream))
        recomputed = sorted(full & strata.upstream(view))
        missing = [r for r in project.stored_relations(view) if project.catalog.state(r).version_id is None]
        reason = None
        if mode == "full" or configured == "full":
            reason = "--mode full" if mode == "full" else "the view is configured with mode: full"
        elif state.version_id is None:
            reason = "first materialization"
        elif d is not None and state.created_at is not None and aware(d.updated_at) > state.created_at:
            reason = "the definition changed"
        elif missing:
            reason = f"{missing[0]} is not materialized yet"
        elif recomputed:
            reason = f"reads {', '.join(recomputed)}, recomputed in this run"
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
            work.append(ViewWork(view, strata.stratum_of[view], "incremental",
                                 f"{algorithm(program, strata, view)}: {'; '.join(why)}", upstream, inputs))
    return work


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


def trim_table(project: Project, run_id: str, item: TableDelta) -> TableDelta:
    """Stage 2 for one table: read its log range, check it against the snapshot, write the net delta."""
    started = time.perf_counter()
    name, table = item.table, project.config.tables[item.table]
    # read under the lease: a late commit that landed since the plan is part of this range too
    segments = project.catalog.segments(name, item.from_version, item.to_version)
    item.log_rows = sum(s.rows for s in segments)
    changes = read_log(project.spark, table, segments, item.from_version, item.to_version)
    state = project.catalog.state(name)
    current = project.warehouse.read_layers(project.spark, [x.path for x in state.layers], project.schema(name))
    net = trim(name, table, changes, current)
    try:
        layer = project.warehouse.write_layer(net.delta, name, "delta", run_id=run_id)
    finally:
        net.release()
    if layer.rows == 0:  # every change cancelled out: advance the watermark, keep no empty layer
        project.warehouse.delete(layer.path)
        layer = None
    item.layer, item.delta_rows = layer, layer.rows if layer else 0
    item.seconds = time.perf_counter() - started
    return item


def maintain_views(project: Project, run_id: str, p: Plan, progress: Progress) -> None:
    """Stage 3: the views, stratum by stratum. Incremental views run the counting algorithm over the
    old states and this run's deltas; full views are recomputed from the new snapshot (the old layers
    plus this run's delta layers, not yet published)."""
    if not p.views:
        return
    program, strata = project.program
    written: dict[str, WrittenLayer] = {}

    def write_delta(name: str, df) -> tuple[str, int] | None:
        layer = project.warehouse.write_layer(df, name, "delta", run_id=run_id)
        if layer.rows == 0:  # nothing changed: no empty layer
            project.warehouse.delete(layer.path)
            return None
        written[name] = layer
        return layer.path, layer.bytes or 0

    scratch = Scratch(project.warehouse, project.spark, run_id)
    states = RunStates(read=lambda name, paths: project.warehouse.read_layers(project.spark, paths,
                                                                              project.schema(name)),
                       write_delta=write_delta, scratch=scratch)
    relations = set(project.config.tables) | {r for w in p.views for r in project.stored_relations(w.view)} | {
        u for w in p.views for u in strata.upstream(w.view) if program.predicates[u].kind == "view"}
    for name in relations:
        states.old_paths[name] = [x.path for x in project.catalog.state(name).layers]
    counting = Counting(program, strata, states, project.groupby_states, project.schema, project.max_iterations)
    for t in p.tables:
        if t.layer:
            states.delta_paths[t.table], states.delta_bytes[t.table] = t.layer.path, t.layer.bytes or 0
            counting.note_delta(t.table, states.delta(t.table))
    full = Evaluator(program, strata, {}, scratch=scratch, limits=project.max_iterations)
    for work in p.views:
        started = time.perf_counter()
        work.delta_in = sum(t.delta_rows for t in p.tables if t.table in work.changed_inputs)
        if work.rule_change is not None:
            counting.rule_changes |= dict.fromkeys(view_predicates(program, strata, work.view), work.rule_change)
        elif work.mode == "incremental" and not any(counting.changed(u) for u in strata.upstream(work.view)):
            work.mode, work.reason = "noop", "the net deltas of its inputs are empty or cancel out"
            progress(f"maintain: {work.view}: nothing to do, {work.reason}")
            continue
        if work.mode == "incremental":
            for pred in view_predicates(program, strata, work.view):
                counting.maintain(pred)
            own = written.get(work.view)
            work.rows_changed = work.rows = own.rows if own else 0
            how = f"{work.reason.split(':')[0]}, {work.rows_changed} tuples changed"
            preds = set(view_predicates(program, strata, work.view))
            for component, stats in counting.dred_stats.items():
                if preds & set(component.predicates):
                    work.detail = {k: work.detail.get(k, 0) + n for k, n in stats.items()}
            if work.detail:
                how += " (DRed: " + ", ".join(f"{k} {n}" for k, n in work.detail.items()) + ")"
        else:
            own = set(view_predicates(program, strata, work.view))  # a recursive view is upstream of itself
            for name in strata.upstream(work.view) - set(full.relations) - own:
                if program.predicates[name].kind != "aux":
                    full.relations[name] = consolidate(states.new(name))
            for name, df in materialize(full, project.groupby_states, work.view):
                layer = project.warehouse.write_layer(df, name, "base", cluster_by=project.cluster_columns(name),
                                                      run_id=run_id)
                written[name] = layer
                states.replaced[name] = layer.path
                if name in program.predicates:  # the predicates above read what was written, not its lineage
                    full.relations[name] = states.new(name)
            work.rows = written[work.view].rows
            how = f"full recompute ({work.reason}), {work.rows} rows"
        work.layers = {r: written[r] for r in project.stored_relations(work.view) if r in written}
        work.seconds = time.perf_counter() - started
        progress(f"maintain: {work.view} (stratum {work.stratum}): {how} ({work.seconds:.2f} s)")


def refresh(project: Project, progress: Progress = lambda _: None, views: list[str] | None = None,
            mode: str = "auto") -> RefreshResult:
    """Run plan → trim → maintain → publish → compact. Raises on bad change data; nothing is applied then."""
    started = time.perf_counter()
    p = plan(project, views, mode)
    catalog = project.catalog
    if not p.tables and not p.views:
        progress("plan: no table has changes past its watermark and every view is current; nothing to refresh")
        return RefreshResult(None, "noop", p.snapshot, [], time.perf_counter() - started)
    names = [t.table for t in p.tables] + [v.view for v in p.views]
    progress(f"plan: run {p.run_id}, snapshot " + ", ".join(f"{t}@{v}" for t, v in p.snapshot.items())
             + f"; {len(p.tables)} tables and {len(p.views)} views to refresh")
    if "spark" not in vars(project):  # start Spark outside the stage timings
        t0 = time.perf_counter()
        _ = project.spark
        progress(f"spark: started ({time.perf_counter() - t0:.2f} s)")
    catalog.start_run(p.run_id, "refresh", p.snapshot, names, mode=mode)
    catalog.acquire_leases(p.run_id, names, project.lease_timeout)
    try:
        stored = [r for v in p.views for r in project.stored_relations(v.view)]
        versions = {n: catalog.state(n).version_id for n in [*names, *stored]}
        for item in p.tables:
            trim_table(project, p.run_id, item)
            progress(f"trim: {item.table}: commit versions {item.from_version + 1}..{item.to_version}, "
                     f"{item.log_rows} changes -> net delta of {item.delta_rows} rows ({item.seconds:.2f} s)")
        maintain_views(project, p.run_id, p, progress)
        changes = [PublishChange(t.table, versions[t.table], [t.layer]) for t in p.tables if t.layer]
        for v in p.views:
            changes += [PublishChange(r, versions[r], [layer], replace=v.mode == "full", create=True)
                        for r, layer in v.layers.items()]
            if v.rule_change is not None and v.view not in v.layers:  # the new definition holds, unchanged
                changes.append(PublishChange(v.view, versions[v.view], []))
        watermarks = {(t.table, t.table): t.to_version for t in p.tables}
        watermarks |= {(v.view, t): p.snapshot[t] for v in p.views for t in v.upstream}
        stages = [StageRecord("trim", t.table, mode="incremental", rows_in=t.log_rows, delta_rows=t.delta_rows,
                              seconds=round(t.seconds, 3),
                              detail={"from_version": t.from_version, "to_version": t.to_version})
                  for t in p.tables]
        stages += [StageRecord("maintain", v.view, mode=v.mode, rows_in=v.delta_in, rows_out=v.rows,
                               delta_rows=v.rows_changed, seconds=round(v.seconds, 3),
                               detail={"stratum": v.stratum, "reason": v.reason, "relations": sorted(v.layers),
                                       **v.detail})
                   for v in p.views]
        t0 = time.perf_counter()
        catalog.publish(p.run_id, changes, watermarks, stages)
        progress(f"publish: {len(changes)} new versions and {len(watermarks)} watermarks at one snapshot "
                 f"({time.perf_counter() - t0:.2f} s)")
    except BaseException as e:
        catalog.finish_run(p.run_id, "failed", one_line(e))
        raise
    project.warehouse.delete(project.warehouse.path("staging", p.run_id))  # the run's scratch space: set changes, fixpoint rounds
    result = RefreshResult(p.run_id, "succeeded", p.snapshot, p.tables, time.perf_counter() - started, p.views)
    grown = [t.table for t in p.tables] + [r for v in p.views if v.mode == "incremental" for r in v.layers]
    result.compacted = [c.relation for c in project.compact(grown, progress=progress)]
    result.seconds = time.perf_counter() - started
    return result
