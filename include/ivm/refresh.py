"""A refresh run (DESIGN.md §6), as a short list of stages.

    plan      fix the snapshot (the newest commit version of every base table's log); pick the tables
              with changes past their watermark and the views whose inputs changed
    trim      per table, the net delta between its watermark and the snapshot, checked (002 §3)
    maintain  per view, stratum by stratum: for now a full recompute from the new base snapshot
              (ivm.maintain.recompute); the incremental algorithms replace it view by view
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
from ivm.maintain.recompute import Evaluator
from ivm.storage import WrittenLayer, new_id
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
    """What a refresh does to one view: its mode, why, and the layer it wrote."""

    view: str
    stratum: int
    mode: str
    reason: str
    upstream: list[str]
    #: the upstream tables whose logs changed in this run (empty when another reason applies)
    changed_inputs: list[str] = field(default_factory=list)
    rows: int | None = None
    seconds: float = 0.0
    layer: WrittenLayer | None = None


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

    SUMMARY_HEADERS = ["relation", "mode", "commit versions", "rows in the delta", "rows written", "seconds"]

    def summary_rows(self) -> list[list[object]]:
        rows: list[list[object]] = [
            [t.table, "incremental", f"{t.from_version + 1}..{t.to_version}", t.log_rows, t.delta_rows,
             f"{t.seconds:.2f}"] for t in self.tables]
        rows += [[v.view, v.mode, "", "", v.rows, f"{v.seconds:.2f}"] for v in self.views]
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
    program, strata = project.program
    names = list(project.config.views)
    if wanted:
        unknown = [v for v in wanted if v not in project.config.views]
        if unknown:
            raise NotFoundError(f"unknown view {unknown[0]!r}")
        names = sorted({u for v in wanted for u in strata.upstream(v) if u in project.config.views} | set(wanted))
    changed = {t.table for t in p.tables}
    defined = project.catalog.view_defs()
    work = []
    for view in names:
        upstream = sorted(u for u in strata.upstream(view) if program.predicates[u].kind == "base")
        state = project.catalog.state(view)
        d = defined.get(view)
        inputs = sorted(changed & set(upstream))
        changed_inputs: list[str] = []
        if mode == "full":
            reason = "--mode full"
        elif state.version_id is None:
            reason = "first materialization"
        elif d is not None and state.created_at is not None and aware(d.updated_at) > state.created_at:
            reason = "the definition changed"
        elif inputs:
            reason, changed_inputs = f"inputs changed: {', '.join(inputs)}", inputs
        else:
            continue
        if mode == "incremental":
            raise ConfigError(f"views.{view}: incremental maintenance is not available yet "
                              "(it arrives with the counting algorithm); use --mode full or auto")
        work.append(ViewWork(view, strata.stratum_of[view], "full", reason, upstream, changed_inputs))
    return sorted(work, key=lambda w: (w.stratum, w.view))


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
    """Stage 3: the views, stratum by stratum, from the new base snapshot (the old layers plus this
    run's delta layers, not yet published)."""
    if not p.views:
        return
    program, strata = project.program
    new_layers = {t.table: t.layer for t in p.tables if t.layer}
    for work in p.views:  # changes that cancelled out leave the view as it is: only its watermarks move
        if work.changed_inputs and not set(work.changed_inputs) & set(new_layers):
            work.mode, work.reason = "noop", "the net deltas of its inputs are empty"
            progress(f"maintain: {work.view}: nothing to do, {work.reason}")
    bases = {}
    for name in project.config.tables:
        paths = [x.path for x in project.catalog.state(name).layers]
        if name in new_layers:
            paths.append(new_layers[name].path)
        bases[name] = consolidate(project.warehouse.read_layers(project.spark, paths, project.schema(name)))
    evaluator = Evaluator(program, strata, bases)
    for work in p.views:
        if work.mode == "noop":
            continue
        started = time.perf_counter()
        zset = evaluator.relation(work.view)
        work.layer = project.warehouse.write_layer(zset, work.view, "base",
                                                   cluster_by=program.predicates[work.view].columns, run_id=run_id)
        work.rows = work.layer.rows
        work.seconds = time.perf_counter() - started
        progress(f"maintain: {work.view} (stratum {work.stratum}): full recompute, {work.reason} -> "
                 f"{work.rows} rows ({work.seconds:.2f} s)")


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
        versions = {n: catalog.state(n).version_id for n in names}
        for item in p.tables:
            trim_table(project, p.run_id, item)
            progress(f"trim: {item.table}: commit versions {item.from_version + 1}..{item.to_version}, "
                     f"{item.log_rows} changes -> net delta of {item.delta_rows} rows ({item.seconds:.2f} s)")
        maintain_views(project, p.run_id, p, progress)
        changes = [PublishChange(t.table, versions[t.table], [t.layer]) for t in p.tables if t.layer]
        changes += [PublishChange(v.view, versions[v.view], [v.layer], replace=True) for v in p.views if v.layer]
        watermarks = {(t.table, t.table): t.to_version for t in p.tables}
        watermarks |= {(v.view, t): p.snapshot[t] for v in p.views for t in v.upstream}
        stages = [StageRecord("trim", t.table, mode="incremental", rows_in=t.log_rows, delta_rows=t.delta_rows,
                              seconds=round(t.seconds, 3),
                              detail={"from_version": t.from_version, "to_version": t.to_version})
                  for t in p.tables]
        stages += [StageRecord("maintain", v.view, mode=v.mode, rows_out=v.rows, seconds=round(v.seconds, 3),
                               detail={"stratum": v.stratum, "reason": v.reason}) for v in p.views]
        t0 = time.perf_counter()
        catalog.publish(p.run_id, changes, watermarks, stages)
        progress(f"publish: {len(changes)} new versions and {len(watermarks)} watermarks at one snapshot "
                 f"({time.perf_counter() - t0:.2f} s)")
    except BaseException as e:
        catalog.finish_run(p.run_id, "failed", one_line(e))
        raise
    result = RefreshResult(p.run_id, "succeeded", p.snapshot, p.tables, time.perf_counter() - started, p.views)
    result.compacted = [c.relation for c in project.compact([t.table for t in p.tables], progress=progress)]
    result.seconds = time.perf_counter() - started
    return result
