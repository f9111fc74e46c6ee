"""The stages of a run, listed once: `STAGES`. `ivm refresh` runs them in one process (`refresh`), an
Airflow task runs one (`run_stage`, under ``jobs/ivm_stage.py``), and the DAG factory
(ivm.orchestration.dags) makes a task of each, all by iterating this tuple.

Every stage reads what the stages before it recorded in the catalog and records what it staged, so each
can run in its own process, on any machine, and be retried: it stages its output under names fixed by
the run (a retry overwrites its own files and replaces its own record) and never touches published data;
publish is the only stage that changes what readers see.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

from tabulate import tabulate

from ivm.context import RunContext
from ivm.errors import ConfigError
from ivm.expectations import import_ahead
from ivm.modes import Mode
from ivm.refresh import publish
from ivm.refresh.maintenance import maintain_stage
from ivm.refresh.plan import begin, load_plan, plan
from ivm.refresh.record import RefreshResult
from ivm.refresh.trim import trim_stage
from ivm.refresh.validation import checked, runs_suites, validate_stage
from ivm.spark import run_tag, tagged
from ivm.vocabulary import RunStatus, StageName

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class StageArgs:
    """What a stage is told besides the run: ``views``, ``mode``, ``kind`` and ``from_version`` (a
    replay) matter to plan (which views the run refreshes, and how), ``views`` to maintain too (which of
    the planned views this task maintains: one stratum's, or one view), ``sample`` to validate."""

    run_id: str
    views: tuple[str, ...] = ()
    mode: Mode = Mode.AUTO
    kind: str = "refresh"
    from_version: int | None = None
    sample: int | None = None


@dataclass(frozen=True)
class Stage:
    #: a `StageName`'s value: a plain string, as the DAG's task ids and the stage command's argument are
    name: str
    run: Callable[[RunContext, StageArgs, Progress], object]
    #: Spark does the stage's work: the process starts Spark before it. The other stages read and write
    #: the catalog and start Spark only if they come to need it (compact with something to compact)
    spark: bool
    #: one task per view of a stratum (the DAG maps it over the views the run planned there)
    per_view: bool = False
    #: the commit point: what readers see changes here, so the stages after it cannot fail the run
    commit: bool = False
    #: `ivm refresh` runs it (the report is what the CLI prints itself)
    in_process: bool = True
    #: after it, readers outside ivm see the run's views (their Delta tables): the DAG sends the changed
    #: views' asset events here
    readable: bool = False
    #: it reads the tables' changes the run planned: the DAG's task of it reports them as the run's
    #: OpenLineage inputs (as the `readable` stage's reports the views it wrote as outputs; ivm.lineage)
    consumes: bool = False
    #: reads and writes the catalog alone, never Spark: the DAG runs it as a Python task on the Airflow
    #: worker (no spark-submit, no JVM)
    catalog_only: bool = False
    #: why run ``run_id`` gives the stage nothing to do (None: it has work), from the catalog alone: the
    #: DAG skips the stage's spark-submit then (a run with nothing to do starts no JVM)
    idle: Callable[[RunContext, str], str | None] = lambda ctx, run_id: None
    #: whether the stage's work in run ``run_id`` needs no JVM (the sink of small views, by delta-rs): the
    #: DAG's Spark task then runs it on the Airflow worker, with no spark-submit
    without_jvm: Callable[[RunContext, str], bool] = lambda ctx, run_id: False


def _plan(ctx: RunContext, a: StageArgs, say: Progress) -> None:
    p = plan(ctx, list(a.views) or None, a.mode, a.run_id, a.from_version)
    begin(ctx, p, a.kind)
    say(f"plan: snapshot {p.snapshot}; {len(p.tables)} tables, {len(p.views)} views: "
        + ("; ".join(f"{w.view} (stratum {w.stratum}): {w.mode}, {w.reason}" for w in p.views) or "nothing to do"))


def _trim_idle(ctx: RunContext, run_id: str) -> str | None:
    return None if load_plan(ctx, run_id)[0].tables else "no table has changes past its watermark"


def _validate_idle(ctx: RunContext, run_id: str) -> str | None:
    if any(checked(ctx, v) for v in load_plan(ctx, run_id)[0].views):
        return None
    return "no view was maintained incrementally or recomputed with expectations"


def _report(ctx: RunContext, a: StageArgs, say: Progress) -> RefreshResult:
    result = publish.report(ctx, a.run_id)
    if result.status == RunStatus.NOOP:
        say(f"run {a.run_id} noop: no table has changes past its watermark and every view is current; nothing "
            "was refreshed")
    else:
        say(f"run {a.run_id} {result.status}\n"
            + tabulate(result.summary_rows(), headers=result.SUMMARY_HEADERS, tablefmt="simple"))
    return result


#: a run's stages, in order (docs/design.md §6)
STAGES: tuple[Stage, ...] = (
    Stage(StageName.PLAN.value, _plan, spark=False, catalog_only=True),
    Stage(StageName.TRIM.value, lambda ctx, a, say: trim_stage(ctx, a.run_id, say), spark=True,
          idle=_trim_idle, consumes=True),
    Stage(StageName.MAINTAIN.value, lambda ctx, a, say: maintain_stage(ctx, a.run_id, list(a.views) or None, say),
          spark=True, per_view=True),
    Stage(StageName.VALIDATE.value, lambda ctx, a, say: validate_stage(ctx, a.run_id, say, a.sample), spark=True,
          idle=_validate_idle),
    Stage(StageName.PUBLISH.value, lambda ctx, a, say: publish.publish_stage(ctx, a.run_id, say), spark=False,
          commit=True, catalog_only=True),
    # (Spark starts only when a view is written: `storage.delta_views` off, the stage does nothing)
    Stage(StageName.SINK.value, lambda ctx, a, say: publish.sink_stage(ctx, a.run_id, say), spark=False,
          readable=True, idle=publish.sink_idle, without_jvm=publish.sink_without_jvm),
    Stage(StageName.COMPACT.value, lambda ctx, a, say: publish.compact_stage(ctx, a.run_id, say), spark=False,
          idle=publish.compact_idle),
    Stage(StageName.REPORT.value, _report, spark=False, in_process=False, catalog_only=True),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


def stage(name: str) -> Stage:
    found = next((s for s in STAGES if s.name == name), None)
    if found is None:
        raise ConfigError(f"unknown stage {name!r}; use one of {', '.join(STAGE_NAMES)}")
    return found


def run_stage(ctx: RunContext, name: str, args: StageArgs) -> object:
    """Run stage ``name`` of run ``args.run_id``; progress and timings go to the log (the task log in
    Airflow). A failure before the commit point records the run failed with the stage's name and one
    line, and keeps the run's leases: the run stays retryable until they expire or a retry publishes. A
    failure after it (sink, compact, report) leaves the run as published — its views are what readers
    see — and fails the task alone, which a retry or the next refresh completes (a lagging Delta table
    is written by the next sink stage, `publish.sink_stage`)."""
    s = stage(name)
    started = time.perf_counter()
    log.info("ivm %s: run %s%s", name, args.run_id, f", views {', '.join(args.views)}" if args.views else "")
    committed = STAGES.index(s) > next(i for i, x in enumerate(STAGES) if x.commit)
    try:
        # (a task killed midway, KeyboardInterrupt or SIGTERM, leaves the run running for its retry)
        with nullcontext() if committed else ctx.catalog.run(args.run_id, keep_leases=True, failure=f"{name}: ",
                                                               catch=Exception):
            if s.spark:
                _ = ctx.spark
            with tagged(ctx.spark, run_tag(args.run_id)) if ctx.spark_started else nullcontext():
                return s.run(ctx, args, log.info)
    finally:
        log.info("ivm %s: done in %.2f s", name, time.perf_counter() - started)


def refresh(ctx: RunContext, progress: Progress = lambda _: None, views: list[str] | None = None,
            mode: str = Mode.AUTO, run_id: str | None = None, kind: str = "refresh",
            from_version: int | None = None, sample: int | None = None) -> RefreshResult:
    """`ivm refresh`: every stage of `STAGES` in this process, through the same stage functions the
    Airflow tasks run. Raises on bad change data or a failed validation; nothing is applied then. A
    refresh with nothing to do records no run and starts no Spark."""
    started = time.perf_counter()
    emitter = None
    if ctx.config.lineage.may_emit():  # OpenLineage run events, when a transport is configured (ivm.lineage)
        from ivm.lineage import Emitter

        emitter = Emitter.for_project(ctx.config)
    p = plan(ctx, views, mode, run_id, from_version)
    if p.cancelled:
        progress(f"plan: the changes of {', '.join(p.cancelled)} cancel out; left for a later trim")
    if not p.tables and not p.views:
        progress("plan: " + ("" if p.cancelled else "no table has changes past its watermark and ")
                 + "every view is current; nothing to refresh")
        publish.catch_up_sinks(ctx, p.snapshot, progress)
        return RefreshResult(None, RunStatus.NOOP, p.snapshot, [], time.perf_counter() - started)
    progress(f"plan: run {p.run_id}, snapshot " + ", ".join(f"{t}@{v}" for t, v in p.snapshot.items())
             + f"; {len(p.tables)} tables and {len(p.views)} views to refresh"
             + (f"; replay from commit version {p.replay.from_version}: the state after run {p.replay.run_id} "
                "(" + ", ".join(f"{t}@{v}" for t, v in p.replay.snapshot.items()) + ")" if p.replay else ""))
    if any(runs_suites(ctx, w, sample) for w in p.views):
        import_ahead()  # Great Expectations, for the validate stage, while the run trims and maintains
    if not ctx.spark_started:  # start Spark outside the stage timings
        t0 = time.perf_counter()
        _ = ctx.spark
        progress(f"spark: started ({time.perf_counter() - t0:.2f} s)")
    args = StageArgs(p.run_id, mode=p.mode, kind=kind, from_version=from_version, sample=sample)
    done: dict[str, object] = {}
    committed = False
    with emitter.reporting(ctx, p, kind) if emitter is not None else nullcontext():
        with tagged(ctx.spark, run_tag(p.run_id)):  # (the run's Spark operations carry its job tag)
            with ctx.catalog.run(p.run_id):  # (a failure before the commit: the run failed, with one line)
                begin(ctx, p, kind)  # the plan stage's record, of the plan made above
                for s in STAGES[1:]:
                    if s.in_process and not committed:
                        done[s.name] = s.run(ctx, args, progress)
                        committed = s.commit
            for s in STAGES[1:]:  # after the commit point, outside it: each its own atomic step (compaction)
                if s.in_process and s.name not in done:
                    done[s.name] = s.run(ctx, args, progress)
    result = done[next(s.name for s in STAGES if s.commit)]  # (publish's RefreshResult)
    result.compacted = done.get("compact") or []
    result.seconds = time.perf_counter() - started
    return result
