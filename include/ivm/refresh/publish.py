"""Stages 5 to 7: publish (the commit point: one catalog transaction), sink (the views' Delta tables,
ivm.sinks) and compact; and the report of a run as its record tells it."""

from __future__ import annotations

import time
from collections.abc import Callable

from ivm import compaction, sinks
from ivm.catalog.store import PublishChange, WrittenLayer, aware, new_id
from ivm.changes import delta
from ivm.context import RunContext
from ivm.errors import RunError, ValidationError
from ivm.maintain.strategy import stored_form
from ivm.modes import Mode
from ivm.refresh.plan import load_plan
from ivm.refresh.record import RefreshResult
from ivm.sinks import SinkWrite
from ivm.vocabulary import Outcome, RunStatus, StageName

Progress = Callable[[str], None]


def publish_stage(ctx: RunContext, run_id: str, progress: Progress = lambda _: None) -> RefreshResult:
    """Stage 5, the commit point: every staged layer, the watermarks and the run's outcome in one catalog
    transaction (if any relation moved since the plan, nothing is published); then the run's staging
    folder goes. The only stage that changes what readers see."""
    started = time.perf_counter()
    p, versions = load_plan(ctx, run_id)
    missing = [t.table for t in p.tables if not t.trimmed] + [v.view for v in p.views if not v.maintained]
    if missing:
        raise RunError(f"run {run_id}: {missing[0]} has not been staged yet; nothing was published")
    failed = [r.relation for r in ctx.catalog.stage_records(run_id)
              if r.stage == StageName.VALIDATE and r.detail.get("outcome") == Outcome.FAILED]
    if failed:
        raise ValidationError(f"run {run_id}: validation failed for {failed[0]}; nothing was published")
    source_ids: dict[str, str] = {}
    if p.replay:  # the tables are as published; every view's restored state, plus its delta, replaces it
        changes = [PublishChange(r, versions.get(r), [v.layers[r]] if r in v.layers else [], create=True,
                                 replace=v.mode is Mode.FULL, base=None if v.mode is Mode.FULL else
                                 [x["id"] for x in p.replay.layers[r]], form=stored_form(v.strategy) if r == v.view
                                 else None)
                   for v in p.views for r in ctx.stored_relations(v.view) if v.mode is not Mode.FULL or r in v.layers]
        watermarks = {}
    else:
        changes = [PublishChange(t.table, versions[t.table], [t.layer]) for t in p.tables
                   if t.layer and ctx.source_location(t.table) is None]
        for t in p.tables:  # a Delta source's state: the table as of the planned version, read where it is
            if (where := ctx.source_location(t.table)) is not None:
                version = delta.delta_version(t.to_version)
                rows, source_ids[t.table] = delta.state_at(where, t.table, version)  # (and which table it is of)
                # (named by the table id too: a table created anew at the location numbers its versions again)
                layer = WrittenLayer(f"source-{t.table}-v{version}-{source_ids[t.table][:8]}", t.table, delta.SOURCE,
                                     delta.layer_path(where, version), rows, None)
                changes.append(PublishChange(t.table, versions[t.table], [layer], replace=True))
        for v in p.views:
            changes += [PublishChange(r, versions.get(r), [layer], replace=v.mode is Mode.FULL, create=True,
                                      form=stored_form(v.strategy) if v.mode is Mode.FULL and r == v.view else None)
                        for r, layer in v.layers.items()]
            if v.rule_change is not None and v.view not in v.layers:  # the new definition holds, unchanged
                changes.append(PublishChange(v.view, versions[v.view], []))
        watermarks = {(t.table, t.table): t.to_version for t in p.tables}
    watermarks |= {(v.view, t): p.snapshot[t] for v in p.views for t in v.upstream}
    # the states later replays may start from: each relation whose watermarks are this run's snapshot
    consistent = {t: {(t, t): n} for t, n in p.snapshot.items()}
    for view in ctx.config.views:
        tables = ctx.base_tables(view)
        if all(t in p.snapshot for t in tables):
            consistent |= dict.fromkeys(ctx.stored_relations(view), {(view, t): p.snapshot[t] for t in tables})
    status = RunStatus.SUCCEEDED if p.tables or p.views else RunStatus.NOOP
    ctx.catalog.publish(run_id, changes, watermarks, status=status, consistent=consistent,
                        quarantined=[q for t in p.tables for q in t.quarantined], source_ids=source_ids)
    seconds = time.perf_counter() - started
    progress(f"publish: {len(changes)} new versions and {len(watermarks)} watermarks at one snapshot ({seconds:.2f} s)")
    ctx.warehouse.delete(ctx.warehouse.path("staging", run_id))  # set changes, fixpoint rounds
    for t in p.tables:  # a Delta source's net delta served this run only: the source holds its state
        if t.layer and ctx.source_location(t.table) is not None:
            ctx.warehouse.delete(t.layer.path)
    return RefreshResult(run_id, status, p.snapshot, p.tables, seconds, p.views)


def _sink_writes(ctx: RunContext, run_id: str) -> list[tuple[str, int | None, str | None, bool]]:
    """What the sink stage of run ``run_id`` writes: each view the run refreshed (its previous version,
    its delta layer, whether it was recomputed), and the views an earlier sink stage left behind (whole)."""
    p, versions = load_plan(ctx, run_id)
    planned = {v.view for v in p.views}
    return ([(v.view, versions.get(v.view), v.layers[v.view].path if v.view in v.layers else None,
              v.mode is Mode.FULL) for v in p.views]
            + [(v, None, None, True) for v in sinks.behind(ctx) if v not in planned])


def sink_stage(ctx: RunContext, run_id: str, progress: Progress = lambda _: None) -> list[SinkWrite]:
    """After the commit point: every view the run refreshed, written to its Delta table (ivm.sinks) in
    one Delta commit each; nothing when ``storage.delta_views`` is off. Retried, it writes nothing twice."""
    if not ctx.config.storage.delta_views:
        return []
    run = ctx.catalog.get_run(run_id)
    if run is None or run.status not in (RunStatus.SUCCEEDED, RunStatus.NOOP):
        raise RunError(f"run {run_id} has not been published yet; its views' Delta tables wait for its publish")
    return sinks.write_views(ctx, run_id, _sink_writes(ctx, run_id), progress)


def sink_without_jvm(ctx: RunContext, run_id: str) -> bool:
    """Whether delta-rs writes every view the sink stage of run ``run_id`` writes (`sinks.without_jvm`: a
    small view, but a keyless bag recomputed into a table that holds rows): then the stage needs no JVM."""
    return ctx.config.storage.delta_views and all(sinks.without_jvm(ctx, *w) for w in _sink_writes(ctx, run_id))


def catch_up_sinks(ctx: RunContext, snapshot: dict[str, int], progress: Progress = lambda _: None) -> None:
    """For a refresh with nothing else to do: write the views' Delta tables an earlier sink stage left
    behind (it died between two views' Delta commits), whole, as a run of kind ``sink``. Nothing, and no
    JVM, when none is behind."""
    lagging = sinks.behind(ctx)
    if not lagging:
        return
    run_id = new_id("sink-")
    with ctx.catalog.run(run_id, "sink", snapshot, lagging):
        sinks.write_views(ctx, run_id, [(v, None, None, True) for v in lagging], progress)
    ctx.catalog.finish_run(run_id, RunStatus.SUCCEEDED)


def _grown(ctx: RunContext, run_id: str) -> list[str]:
    """The relations run ``run_id`` added a delta layer to."""
    p, _ = load_plan(ctx, run_id)
    return [t.table for t in p.tables if t.layer] + [r for v in p.views if v.mode is Mode.INCREMENTAL for r in v.layers]


def compact_stage(ctx: RunContext, run_id: str, progress: Progress = lambda _: None) -> list[str]:
    """Stage 6: compact the relations this run grew past their thresholds, each in its own transaction."""
    return [c.relation for c in compaction.compact(ctx, _grown(ctx, run_id), progress=progress)]


# -- what a stage has to do in a run, from the catalog alone (the DAG skips a Spark task with nothing) ----


def sink_idle(ctx: RunContext, run_id: str) -> str | None:
    """Why the sink stage has nothing to write for run ``run_id`` (None: it has)."""
    if not ctx.config.storage.delta_views:
        return "storage.delta_views is off"
    p, _ = load_plan(ctx, run_id)
    return None if p.views or sinks.behind(ctx) else "the run refreshed no view"


def compact_idle(ctx: RunContext, run_id: str) -> str | None:
    """Why the compact stage has nothing to compact after run ``run_id`` (None: it has)."""
    settings = ctx.config.storage
    if any(compaction.needs_compaction(ctx.catalog.state(r), settings) for r in _grown(ctx, run_id)):
        return None
    return "no relation the run grew is past the compaction thresholds"


def report(ctx: RunContext, run_id: str) -> RefreshResult:
    """A run as its record tells it (what the report task logs)."""
    p, _ = load_plan(ctx, run_id)
    run = ctx.catalog.get_run(run_id)
    seconds = (aware(run.finished_at) - aware(run.started_at)).total_seconds() if run and run.finished_at else 0.0
    return RefreshResult(run_id, run.status if run else "unknown", p.snapshot, p.tables, seconds, p.views)
