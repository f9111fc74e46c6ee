"""Stage 4, validate: every incrementally maintained view's staged new state checked before it is
published (ivm.validate)."""

from __future__ import annotations

from collections.abc import Callable

from ivm.catalog.store import StageRecord
from ivm.context import RunContext
from ivm.errors import ValidationError
from ivm.expectations import import_ahead
from ivm.maintain.strategy import stored_form
from ivm.modes import Mode
from ivm.refresh.plan import load_plan, old_layers
from ivm.refresh.record import ViewWork
from ivm.validate import ViewState, check_views
from ivm.vocabulary import Outcome, RunStatus, StageName

Progress = Callable[[str], None]


def checked(ctx: RunContext, work: ViewWork) -> bool:
    """Whether the validate stage checks the view: maintained incrementally, or recomputed in full (a first
    materialization) with expectations of its own (a noop changed nothing)."""
    if work.mode is Mode.FULL:
        return work.view in work.layers and bool(ctx.config.views[work.view].validate_.expectations)
    return work.mode is Mode.INCREMENTAL


def runs_suites(ctx: RunContext, work: ViewWork, sample: int | None = None) -> bool:
    """Whether validating the view runs a Great Expectations suite: over its sampled comparison (maintained
    incrementally, its sample, or ``sample`` that overrides it, above 0) or its own expectations."""
    if not checked(ctx, work):
        return False
    cfg = ctx.config.views[work.view].validate_
    return bool(cfg.expectations) or (work.mode is Mode.INCREMENTAL and (cfg.sample if sample is None else sample) > 0)


def validate_stage(ctx: RunContext, run_id: str, progress: Progress = lambda _: None,
                   sample: int | None = None) -> dict[str, str]:
    """Stage 4: check every incrementally maintained view's staged new state before it is published
    (ivm.validate): no tuple the run changed may end with a negative count, and a sample of its keys
    (the ones the run touched first) recomputed from the new snapshot must equal it, row by row with
    counts, under its Great Expectations suite; and the view's own expectations hold over its whole new
    state — a recomputed view's too (a first materialization). Results go to the catalog. A failing view
    stops the publish (nothing is applied) unless its policy is ``warn``. ``sample`` overrides the views'
    ``validate.sample``. Returns the views with problems and what they are."""
    p, _ = load_plan(ctx, run_id)
    if any(runs_suites(ctx, w, sample) for w in p.views):
        import_ahead()  # (while the samples are recomputed; `ivm refresh` started it after its plan)
    states = []
    for work in p.views:
        if not checked(ctx, work):
            continue
        if work.mode is Mode.FULL:  # its own recomputation: its expectations only
            layer = work.layers[work.view]
            states.append(ViewState(work.view, [layer.path], layer.rows or 0, form=stored_form(work.strategy),
                                    recompute=True))
            continue
        delta = work.layers.get(work.view)
        old = old_layers(ctx, p, work.view)
        states.append(ViewState(work.view, [path for path, _ in old] + ([delta.path] if delta else []),
                                sum(rows for _, rows in old) + (delta.rows or 0 if delta else 0),
                                delta.path if delta else None, stored_form(work.strategy),
                                delta.rows or 0 if delta else 0))
    if not states:
        return {}
    deltas = {t.table: t.layer.path for t in p.tables if t.layer}
    read = {t for w in p.views if w.mode is Mode.INCREMENTAL for t in w.upstream}  # (what the samples recompute)
    tables = {t: [path for path, _ in old_layers(ctx, p, t)] + ([deltas[t]] if t in deltas else [])
              for t in sorted(read)}
    checks = check_views(ctx, run_id, states, tables, sample, progress, changed=deltas)
    for c in checks:
        ctx.catalog.save_stage(run_id, StageRecord(StageName.VALIDATE, c.view, mode=Mode.INCREMENTAL,
                                                   status=RunStatus.STAGED,
                                                   rows_in=c.rows,
                                                   seconds=round(c.seconds, 3),
                                                   detail={"outcome": c.status, "problem": c.problem,
                                                           "report": c.report_uri}))
    failed = [c for c in checks if c.status == Outcome.FAILED]
    if failed:
        raise ValidationError(f"view {failed[0].view}: {failed[0].problem} after run {run_id}; nothing was published")
    return {c.view: c.problem for c in checks if c.problem}
