"""Stage 2, trim: per table, the net delta between its watermark and the snapshot, checked against the
stored rows (002 §3, ivm.changes.trim) and staged as the table's delta layer; for a replay, the
difference between the table's published and restored states."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor

from pyspark.util import inheritable_thread_target

from ivm.catalog.store import QuarantineRef, SegmentRef, WrittenLayer
from ivm.changes import delta
from ivm.changes.ingest import has_update_images, log_keys, read_log
from ivm.changes.trim import NetDelta, log_bounds, trim
from ivm.context import RunContext
from ivm.errors import BadChange, ChangeDataError
from ivm.modes import Mode
from ivm.refresh.plan import load_plan
from ivm.refresh.record import Plan, TableDelta
from ivm.spark import adaptive
from ivm.storage import Scratch
from ivm.zset import consolidate, negate, small_change

Progress = Callable[[str], None]
#: tables trimmed at once (each a few small Spark jobs; beyond a handful they only queue)
TRIM_THREADS = 4
#: commits one trim sets aside under ``on_bad_change: quarantine`` before it refuses the refresh after
#: all: a log whose commits are bad by the dozen is a broken feed to look at, not one to empty quietly
QUARANTINE_MAX = 20


def replay_delta(ctx: RunContext, p: Plan, item: TableDelta) -> TableDelta:
    """Stage 2 of a replay, for one table: its changes since the restored state, as the published state
    minus the restored one. While no compaction intervened the published state is the restored layers
    followed by the delta layers of the runs since (each the net delta trimmed from the log then), and
    the change is those layers; otherwise the difference of the two states. Staged in the run's scratch
    space: a replay publishes no table."""
    started = time.perf_counter()
    name, schema = item.table, ctx.schema(item.table)
    restored = p.replay.layers[name]
    current = ctx.catalog.state(name).layers
    read = lambda paths: ctx.warehouse.read_layers(ctx.spark, paths, schema)  # noqa: E731
    if [x.id for x in current[:len(restored)]] == [x["id"] for x in restored]:
        added = current[len(restored):]
        log_rows = sum(x.rows or 0 for x in added)
        delta = consolidate(read([x.path for x in added]))
    else:
        log_rows = sum(x.rows or 0 for x in current)
        old = negate(read(p.replay.paths(name)))
        delta = consolidate(read([x.path for x in current]).unionByName(old))
    path, rows, size = Scratch(ctx.warehouse, ctx.spark, p.run_id).put(f"replay/{name}", delta)
    return dataclasses.replace(item, log_rows=log_rows, delta_rows=rows, trimmed=True,
                               layer=WrittenLayer(f"replay-{name}", name, "delta", path, rows, size) if rows else None,
                               seconds=time.perf_counter() - started)


def _stage(ctx: RunContext, run_id: str, item: TableDelta, net: NetDelta) -> TableDelta:
    """Write the net delta as the table's delta layer (its check is observed while it is written), drop
    it when the check fails, and keep no empty layer (every change cancelled out: the watermark advances).
    The table as staged (its ``seconds`` the caller's)."""
    layer = ctx.warehouse.write_layer(net.delta, item.table, "delta", run_id=run_id)
    try:
        net.check()
    except ChangeDataError:
        ctx.warehouse.delete(layer.path)
        raise
    if layer.rows == 0:
        ctx.warehouse.delete(layer.path)
        layer = None
    return dataclasses.replace(item, layer=layer, delta_rows=layer.rows if layer else 0,
                               updated_keys=net.updated_keys(), trimmed=True)


def _stage_skipping(ctx: RunContext, run_id: str, item: TableDelta, skip: set[int],
                    net_delta: Callable[[set[int]], NetDelta]) -> TableDelta:
    """`_stage` the net delta of the log range without the commits of ``skip`` (quarantined); under the
    table's ``on_bad_change: quarantine`` a commit whose change does not apply is set aside too (in the
    run's record: the publish records it, a failed run sets nothing aside) and the range trimmed again
    without it, up to QUARANTINE_MAX commits."""
    policy = ctx.config.tables[item.table].on_bad_change
    aside: list[QuarantineRef] = []
    while True:
        try:
            return _stage(ctx, run_id, dataclasses.replace(item, quarantined=tuple(aside)), net_delta(skip))
        except BadChange as e:
            if policy != "quarantine" or len(aside) >= QUARANTINE_MAX:
                raise
            aside.append(QuarantineRef(item.table, e.version, e.reason, "policy"))
            skip.add(e.version)


def log_net_delta(ctx: RunContext, name: str, segments: list[SegmentRef], after: int, upto: int, paths: list[str],
                  rows: int, skipped: Collection[int]) -> NetDelta:
    """002 §3: the net delta of the table's log over commit versions (``after``, ``upto``] (its
    ``segments``, but the commits ``skipped``), checked against its state at ``after`` (the layers
    ``paths``, ``rows`` rows in all): the work of time proportional to the log, not to the table."""
    table, spark = ctx.config.tables[name], ctx.spark
    log_rows = sum(s.rows for s in segments)
    small = log_rows > 0 and small_change(log_rows, ctx.config.spark.single_partition_rows)
    changes = read_log(spark, table, segments, after, upto, skipped)
    current = ctx.warehouse.read_layers(spark, paths, ctx.schema(name))
    # (the range's truncates, as the catalog recorded them: the table is then read whole)
    truncates = sorted(t for s in segments for t in s.truncates_in(after, upto, skipped))
    # a small change's keys read on the driver: the stored rows found at them by an IN list
    keys = log_keys(ctx.warehouse, table, segments, after, upto, skipped) if small and not truncates else None
    # where the range's keys fall, as its segments recorded when they were appended (all of them, or the
    # trim finds them from the log with a query); columns gained since the table held data (an
    # older-schema file's removal leaves them NULL)
    return trim(name, table, changes, current, rows, update_images=has_update_images(ctx.warehouse, segments),
                small=small, bounds=log_bounds(table, [s.key_bounds for s in segments]), keys=keys,
                added=ctx.catalog.table_defs()[name].added_columns or [], truncates=truncates)


def trim_table(ctx: RunContext, run_id: str, item: TableDelta) -> Callable[[], TableDelta]:
    """Stage 2 for one table: read its log range, check it against the snapshot, write the net delta.
    The catalog is read here (log segments, the table's layers); the Spark work is the returned
    function, which the stage runs beside the other tables'."""
    started = time.perf_counter()
    name = item.table
    # read under the lease: a late commit that landed since the plan is part of this range too
    segments = ctx.catalog.segments(name, item.from_version, item.to_version)
    skip = ctx.catalog.quarantined_versions(name)
    item = dataclasses.replace(item, log_rows=sum(s.rows for s in segments))
    layers = ctx.catalog.state(name).layers

    def net_delta(skipped: set[int]) -> NetDelta:
        return log_net_delta(ctx, name, segments, item.from_version, item.to_version,
                             [x.path for x in layers], sum(x.rows or 0 for x in layers), skipped)

    def run() -> TableDelta:
        staged = _stage_skipping(ctx, run_id, item, skip, net_delta)
        return dataclasses.replace(staged, seconds=time.perf_counter() - started)

    return run


def trim_source(ctx: RunContext, run_id: str, p: Plan, item: TableDelta) -> Callable[[], TableDelta]:
    """Stage 2 for a Delta source (ivm.changes.delta): the change data feed of the planned versions,
    trimmed into its net delta (002 §3) as it is, Delta's own record of what changed; checked against
    the table as of the watermark first, as a log appended to ivm is, under ``verify_changes: true``.
    Not read at all when no view of the run maintains the table incrementally: those views are
    recomputed from the table as of the planned version."""
    started = time.perf_counter()
    name, table = item.table, ctx.config.tables[item.table]
    where = ctx.source_location(name)
    incremental = any(w.mode is Mode.INCREMENTAL and name in w.upstream for w in p.views)
    before = ctx.catalog.state(name).layers
    schema, spark = ctx.schema(name), ctx.spark
    after, upto = delta.delta_version(item.from_version), delta.delta_version(item.to_version)
    skip = ctx.catalog.quarantined_versions(name)

    def net_delta(skipped: set[int]) -> NetDelta:
        changes = delta.changes(spark, name, table, where, after, upto, skipped)
        # Delta's feed is trusted to apply (its changes were made to the table), unless the table says
        # `verify_changes: true`: then each is checked against the stored rows as a log's is
        current = ctx.warehouse.read_layers(spark, [x.path for x in before], schema) if table.verified else None
        return trim(name, table, changes, current, sum(x.rows or 0 for x in before),
                    small=small_change(item.log_rows, ctx.config.spark.single_partition_rows))

    def run() -> TableDelta:
        delta.check_columns(spark, name, table, where, upto)  # (a source whose schema changed under ivm)
        staged = dataclasses.replace(item, trimmed=True)
        if incremental:
            try:
                staged = _stage_skipping(ctx, run_id, item, skip, net_delta)
            except Exception as e:  # noqa: BLE001 - the feed's files gone (VACUUM) surface as Spark errors
                if isinstance(e, ChangeDataError) or not any(
                        m in str(e) for m in ("FileNotFound", "FILE_NOT_FOUND", "VersionNotFound")):
                    raise
                raise ChangeDataError(f"table {name}: the change data feed of Delta versions {after + 1}..{upto} "
                                      f"of {where} is gone (VACUUM); use `ivm backfill --full` for the views "
                                      "that read it") from e
        return dataclasses.replace(staged, seconds=time.perf_counter() - started)

    return run


def trim_stage(ctx: RunContext, run_id: str, progress: Progress = lambda _: None) -> list[TableDelta]:
    """Stage 2: every planned table's net delta, staged as its delta layer (written under a name fixed by
    the run and table, so a retried stage overwrites its own output).

    The tables are trimmed side by side (TRIM_THREADS threads submitting Spark jobs at once): a trim is
    a handful of small jobs and driver-side planning, which alone leave the executors idle. The first
    failure in plan order is raised once every trim has ended; nothing is recorded then."""
    p, _ = load_plan(ctx, run_id)
    if p.replay:
        done = [replay_delta(ctx, p, item) for item in p.tables]
    else:
        limit = ctx.config.spark.single_partition_rows
        # without adaptive execution when every log range is a small change's (ivm.spark.adaptive; one
        # setting of the session for the trims running side by side)
        with adaptive(ctx.spark, not all(small_change(t.log_rows, limit) for t in p.tables)):
            trims = [trim_source(ctx, run_id, p, item) if ctx.source_location(item.table) is not None
                     else trim_table(ctx, run_id, item) for item in p.tables]
            if len(trims) == 1:  # nothing to overlap with
                done = [trims[0]()]
            else:
                runs = [inheritable_thread_target(ctx.spark)(t) for t in trims]
                with ThreadPoolExecutor(max_workers=TRIM_THREADS, thread_name_prefix="ivm-trim") as pool:
                    futures = [pool.submit(run) for run in runs]
                done = [f.result() for f in futures]  # (leaving the pool waited for every trim)
    for item in done:
        ctx.catalog.save_stage(run_id, item.trim_record())
        where = ctx.source_location(item.table)
        versions = f"commit versions {item.from_version + 1}..{item.to_version}" if where is None else (
            f"Delta versions {item.from_version}..{delta.delta_version(item.to_version)} of {where}")
        table = ctx.config.tables[item.table]
        aside = "".join(f"; set aside version {delta.named_version(table, q.commit_version)} ({q.reason})"
                        for q in item.quarantined)
        progress(f"trim: {item.table}: {versions}, {item.log_rows} "
                 f"{'rows of published deltas' if p.replay else 'changes'} -> net delta of "
                 f"{item.delta_rows} rows ({item.seconds:.2f} s){aside}")
    return done
