"""A refresh run (DESIGN.md §6), as a short list of stages.

    plan      fix the snapshot: the newest commit version of every base table's log
    trim      per table, the net delta between its watermark and the snapshot, checked (002 §3)
    publish   one catalog transaction: new layers, watermarks, the run's outcome (the commit point)
    compact   relations whose layers passed the threshold, as their own atomic step

For now a refresh brings the base-table snapshots to the new snapshot; views are maintained by the
stages the maintenance algorithms add between trim and publish. A refresh with no new changes
launches no Spark job. A failure anywhere before publish leaves every relation as it was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ivm.catalog.store import PublishChange, StageRecord
from ivm.changes.ingest import read_log
from ivm.changes.trim import trim
from ivm.storage import WrittenLayer, new_id

if TYPE_CHECKING:
    from ivm.project import Project

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


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
class Plan:
    run_id: str
    snapshot: dict[str, int]
    tables: list[TableDelta] = field(default_factory=list)


@dataclass
class RefreshResult:
    run_id: str | None
    status: str  # succeeded | noop
    snapshot: dict[str, int]
    tables: list[TableDelta]
    seconds: float
    compacted: list[str] = field(default_factory=list)

    def summary_rows(self) -> list[list[object]]:
        return [[t.table, "incremental", f"{t.from_version + 1}..{t.to_version}", t.log_rows, t.delta_rows,
                 f"{t.seconds:.2f}"] for t in self.tables]

    SUMMARY_HEADERS = ["relation", "mode", "commit versions", "log rows", "net delta rows", "seconds"]


def plan(project: Project) -> Plan:
    """Stage 1: the snapshot and the tables whose logs have changes past their watermark."""
    catalog = project.catalog
    snapshot = {name: catalog.last_commit_version(name) for name in project.config.tables}
    watermarks = catalog.watermarks()
    p = Plan(new_id("refresh-"), snapshot)
    for name, newest in snapshot.items():
        wm = watermarks.get((name, name), 0)
        if newest > wm:
            rows = sum(s.rows for s in catalog.segments(name, wm, newest))
            p.tables.append(TableDelta(name, wm, newest, rows))
    return p


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


def refresh(project: Project, progress: Progress = lambda _: None) -> RefreshResult:
    """Run plan → trim → publish → compact. Raises on bad change data; nothing is applied then."""
    started = time.perf_counter()
    p = plan(project)
    catalog = project.catalog
    if not p.tables:
        progress("plan: no table has changes past its watermark; nothing to refresh")
        return RefreshResult(None, "noop", p.snapshot, [], time.perf_counter() - started)
    names = [t.table for t in p.tables]
    progress(f"plan: run {p.run_id}, snapshot "
             + ", ".join(f"{t.table}@{t.to_version}" for t in p.tables))
    if "spark" not in vars(project):  # start Spark outside the stage timings
        t0 = time.perf_counter()
        _ = project.spark
        progress(f"spark: started ({time.perf_counter() - t0:.2f} s)")
    catalog.start_run(p.run_id, "refresh", p.snapshot, names, mode="incremental")
    catalog.acquire_leases(p.run_id, names, project.lease_timeout)
    try:
        versions = {n: catalog.state(n).version_id for n in names}
        for item in p.tables:
            trim_table(project, p.run_id, item)
            progress(f"trim: {item.table}: commit versions {item.from_version + 1}..{item.to_version}, "
                     f"{item.log_rows} changes -> net delta of {item.delta_rows} rows ({item.seconds:.2f} s)")
        changes = [PublishChange(t.table, versions[t.table], [t.layer]) for t in p.tables if t.layer]
        stages = [StageRecord("trim", t.table, mode="incremental", rows_in=t.log_rows, delta_rows=t.delta_rows,
                              seconds=round(t.seconds, 3),
                              detail={"from_version": t.from_version, "to_version": t.to_version})
                  for t in p.tables]
        t0 = time.perf_counter()
        catalog.publish(p.run_id, changes, {(t.table, t.table): t.to_version for t in p.tables}, stages)
        progress(f"publish: {len(changes)} new table versions, {len(p.tables)} watermarks at one snapshot "
                 f"({time.perf_counter() - t0:.2f} s)")
    except BaseException as e:
        catalog.finish_run(p.run_id, "failed", str(e).splitlines()[0] if str(e) else type(e).__name__)
        raise
    result = RefreshResult(p.run_id, "succeeded", p.snapshot, p.tables, time.perf_counter() - started)
    result.compacted = [c.relation for c in project.compact(names, progress=progress)]
    result.seconds = time.perf_counter() - started
    return result
