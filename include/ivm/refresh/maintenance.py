"""Stage 3, maintain: per view, stratum by stratum, the counting algorithm over the old states and the
deltas (ivm.maintain.counting), DRed for recursive components (ivm.maintain.dred), a count-free strategy
(ivm.maintain.count_free: 003, 004), or a full recompute from the new snapshot (ivm.maintain.recompute),
as the plan decided (ivm.refresh.plan). Each view's new layers are staged in the run's record."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable

from pyspark.sql import DataFrame

from ivm.catalog.store import LayerRef, WrittenLayer
from ivm.changes import delta
from ivm.changes.trim import NetDelta, trim
from ivm.context import RunContext
from ivm.errors import NotFoundError, RunError
from ivm.maintain.count_free import CountFree
from ivm.maintain.counting import Counting, ephemeral, materialize, view_predicates, weighted
from ivm.maintain.recompute import Evaluator
from ivm.maintain.states import RunStates
from ivm.maintain.strategy import lookup
from ivm.modes import Mode
from ivm.refresh.plan import load_plan, old_layer_refs, view_crossover
from ivm.refresh.record import CatchUp, Plan, ViewWork
from ivm.refresh.trim import log_net_delta
from ivm.spark import adaptive
from ivm.storage import Scratch
from ivm.vocabulary import Kind
from ivm.zset import as_used, consolidate, difference

Progress = Callable[[str], None]
log = logging.getLogger(__name__)


class Maintenance:
    """What maintaining views in this process shares: the run's states (published layers, this run's
    staged layers), one Counting over them, one full evaluator. Built from the run's record, so a stage
    that maintains one stratum (an Airflow task) sees what the stages before it staged."""

    def __init__(self, ctx: RunContext, p: Plan, scratch: Scratch):
        self.ctx, self.plan = ctx, p
        program, strata = ctx.program
        self.written: dict[str, WrittenLayer] = {}
        self.states = RunStates(read=lambda name, paths: ctx.warehouse.read_layers(ctx.spark, paths, ctx.schema(name)),
                                write_delta=self._write_delta, scratch=scratch,
                                single_partition_rows=ctx.config.spark.single_partition_rows)
        relations = set(ctx.config.tables) | {r for w in p.views for r in ctx.stored_relations(w.view)} | {
            u for w in p.views for u in strata.upstream(w.view) if program.predicates[u].kind == Kind.VIEW}
        self.old: dict[str, list[LayerRef]] = {}
        for name in relations:
            self.old[name] = old_layer_refs(ctx, p, name)
            self.states.old_paths[name] = [x.path for x in self.old[name]]
            rows = [x.rows for x in self.old[name]]
            self.states.old_rows[name] = None if None in rows else sum(rows)
        self.counting = Counting(program, strata, self.states, ctx.relations.groupby_states, ctx.schema,
                                 ctx.max_iterations, {t.table: t.updated_keys for t in p.tables
                                                      if t.updated_keys is not None})
        for t in p.tables:  # a Delta source's new state: the table as of the planned version (time travel)
            where = ctx.source_location(t.table)
            if where is not None:
                self.states.replaced[t.table] = delta.layer_path(where, delta.delta_version(t.to_version))
        for t in p.tables:  # (all noted before any is read: together they decide `small`)
            if t.layer:
                self.states.note(t.table, t.layer.path, t.layer.bytes or 0, t.layer.rows or 0)
        for t in p.tables:
            if t.layer:
                self.counting.note_delta(t.table, self.states.delta(t.table))
        self.full = Evaluator(program, strata, {}, scratch=scratch, limits=ctx.max_iterations,
                              grouped_only=frozenset(ephemeral(program, strata)),  # (given: consolidated states)
                              weighted=frozenset(weighted(program, strata)))
        self.count_free = CountFree(program, strata, self.counting)
        for work in p.views:  # what earlier stages staged: the views of lower strata
            if work.maintained:
                self.absorb(work)

    def _write_delta(self, name: str, df: DataFrame) -> tuple[str, int, int] | None:
        layer = self.ctx.warehouse.write_layer(df, name, "delta", run_id=self.plan.run_id)
        if layer.rows == 0:  # nothing changed: no empty layer
            self.ctx.warehouse.delete(layer.path)
            return None
        self.written[name] = layer
        return layer.path, layer.bytes or 0, layer.rows or 0

    def new_layers(self, name: str) -> list[LayerRef]:
        """The layers ``name`` has after this run: its published ones and this run's delta layer."""
        st = self.states
        return self.old.get(name, []) + ([LayerRef("", "delta", st.delta_paths[name], None, st.delta_bytes[name])]
                                         if name in st.delta_paths else [])

    def new_state(self, name: str) -> DataFrame:
        """``name`` after this run, consolidated: the base layer a full recompute wrote, or its old layers
        and this run's delta (`Warehouse.read_consolidated`)."""
        states, ctx = self.states, self.ctx
        if name in states.replaced:  # a base layer: consolidated as written
            return states.new(name)
        return ctx.warehouse.read_consolidated(ctx.spark, self.new_layers(name), ctx.schema(name),
                                               ctx.cluster_columns(name))

    def new_rows(self, name: str) -> DataFrame:
        """``name`` after this run as its layers' union, unconsolidated (one scan: Evaluator.layers)."""
        states, ctx = self.states, self.ctx
        if name in states.replaced:
            return states.new(name)
        return ctx.warehouse.read_layers(ctx.spark, [x.path for x in self.new_layers(name)], ctx.schema(name))

    def absorb(self, work: ViewWork) -> None:
        """Make a view maintained by an earlier stage visible to the views above it: its new state, and
        (incremental) its delta as they use it."""
        for name, layer in work.layers.items():
            if work.mode is Mode.FULL:
                self.states.replaced[name] = layer.path
            else:
                self.states.note(name, layer.path, layer.bytes or 0, layer.rows or 0)
        if work.mode is Mode.INCREMENTAL and work.view in work.layers:
            self.counting.note_delta(work.view, self.states.delta(work.view))
        elif work.mode is Mode.FULL:
            self.difference(work.view)

    def difference(self, view: str) -> None:
        """A recomputed view's Δ for the views above it that this run maintains (#48, no cascade): its
        new state minus its old one, consolidated (000 §3: Pᵛ = P ⊎ Δ(P), so Δ(P) = Pᵛ ⊎ −P), written
        once; the views above are maintained from it as from any view's Δ (000 Algorithm 4.1), not
        recomputed in turn."""
        _, strata = self.ctx.program
        if not any(w.mode is Mode.INCREMENTAL and not w.maintained and view in strata.upstream(w.view)
                   for w in self.plan.views):
            return
        change = difference(self.states.new(view), self.states.old(view))
        path, rows, size = self.states.scratch.put(f"{view}__difference", change)
        if rows:
            self.states.note(view, path, size, rows)
            self.counting.note_delta(view, self.states.delta(view))

    def behind(self, view: str, catch_up: CatchUp) -> tuple[RunStates, Counting, CountFree]:
        """For a view that catches up from its own pointer (#48, item 1; `ivm.refresh.plan.catch_up`):
        the run's states, but each relation the view reads that moved since at its state there (the
        layers the catch-up names) with its changes since as its delta — its layers published after those
        and this run's delta, consolidated into one layer; a table compacted since, its log since the
        view's pointer, trimmed (002 §3(b)); a view compacted or recomputed since, its new state minus
        that one). The counting algorithm over them maintains the view as it
        maintains one that never fell behind: 000 Algorithm 4.1 needs the states the view was computed
        from and their changes, whichever run applied them."""
        ctx, main = self.ctx, self.states
        program, strata = ctx.program
        at: dict[str, tuple[list[str], int | None]] = {}
        since: dict[str, tuple[str, int, int]] = {}
        # the run whose state the view holds: its snapshot is the view's pointer into each log (read once, if)
        pointer = functools.cache(lambda: ctx.catalog.get_run(catch_up.run_id))
        for r, refs in catch_up.layers.items():
            ids, paths = {x["id"] for x in refs}, [x["path"] for x in refs]
            rows = None if any(x.get("rows") is None for x in refs) else sum(x["rows"] for x in refs)
            published = self.old.get(r, [])
            source = delta.parse_layer_path(paths[0]) if len(paths) == 1 else None
            net = None
            if source is not None:  # a Delta source: its feed since the view's pointer, 002 §3's trim of a log
                net = self._feed_since(r, source, main)
                change = net.delta
            elif r not in main.replaced and ids <= {x.id for x in published}:
                later = [x.path for x in published if x.id not in ids]
                change = consolidate(main.read(r, later + ([main.delta_paths[r]] if r in main.delta_paths else [])))
            elif (after := self._pointer(r, pointer())) is not None:
                # a table compacted since: its log since the view's pointer (002 §3(b))
                net = self._log_since(r, after, paths, rows or 0)
                change = net.delta
            else:  # a view (or a table replaced) since: its new state less the one the view holds
                change = difference(main.new(r), main.read(r, paths))
            path, n, size = main.scratch.put(f"{r}__since_{view}", change)
            if net is not None:
                net.check()  # (a bad change refuses the run: nothing is published)
            at[r] = paths, rows
            if n:
                since[r] = path, size, n
        states = main.behind(at, since)
        counting = Counting(program, strata, states, ctx.relations.groupby_states, ctx.schema, ctx.max_iterations,
                            {t: n for t, n in self.counting.updated_keys.items() if t not in catch_up.layers})
        for name in sorted(set(states.delta_paths) & strata.upstream(view)):
            counting.note_delta(name, states.delta(name))
        return states, counting, CountFree(program, strata, counting)

    def _pointer(self, name: str, run) -> int | None:
        """The commit version of table ``name`` the view that fell behind holds (its restore point's
        snapshot), when its log since then is the way to its change: an ivm table this run did not
        replace, the restore point's version and this run's known. None: read the states instead."""
        if name not in self.ctx.config.tables or self.ctx.source_location(name) is not None \
                or name in self.states.replaced or run is None:
            return None
        after, upto = (run.snapshot or {}).get(name), self.plan.snapshot.get(name)
        return after if after is not None and upto is not None and after < upto else None

    def _log_since(self, name: str, after: int, paths: list[str], rows: int) -> NetDelta:
        """A table's net change from the commit version a view that fell behind holds (``after``; its
        state there: the layers ``paths``, ``rows`` rows) to the run's snapshot, from its log segments
        (`ivm gc` keeps them until every reader's watermark has passed them): 002 §3(b)'s catch-up in time
        proportional to the log, where the difference of two states reads the whole table twice (it
        was compacted since: the layers it held are not a prefix of its layers now)."""
        ctx = self.ctx
        upto = self.plan.snapshot[name]
        skip = ctx.catalog.quarantined_versions(name)
        segments = ctx.catalog.segments(name, after, upto)
        log.info("%s: catching up from commit version %d to %d from %d log segments", name, after, upto,
                 len(segments))
        return log_net_delta(ctx, name, segments, after, upto, paths, rows, skip)

    def _feed_since(self, name: str, pointer: tuple[str, int], states: RunStates) -> NetDelta:
        """A Delta source's net change from the version a view that fell behind holds (``pointer``: the
        table and that Delta version) to the run's: its change data feed over those versions trimmed as
        the trim stage trims one (002 §3; checked against the table as of the pointer under
        ``verify_changes``), but the commits set aside (`ivm log quarantine`)."""
        ctx = self.ctx
        table, (where, after) = ctx.config.tables[name], pointer
        _, upto = delta.parse_layer_path(states.replaced.get(name) or states.old_paths[name][0])
        skip = ctx.catalog.quarantined_versions(name)
        feed = delta.changes(ctx.spark, name, table, where, after, upto, skip)
        return trim(name, table, feed, states.read(name, [delta.layer_path(where, after)]) if table.verified else None)

    def reweigh(self, work: ViewWork) -> ViewWork:
        """A view the crossover planned to recompute (``--mode auto``: its measured costs against the
        change the plan saw, the log's rows) weighed again on its inputs' net deltas, which the trim has
        given since: maintained incrementally when they say so — an empty net delta (a change and its
        undoing, a late commit that cancels) is then nothing to do, never a recompute."""
        net = sum(t.delta_rows for t in self.plan.tables if t.table in work.changed_inputs)
        estimate = view_crossover(self.ctx, work.view, net)
        if net and estimate.full:
            return work
        return dataclasses.replace(work, mode=Mode.INCREMENTAL, reason=(
            f"auto: the net deltas of its inputs hold {net} rows: {estimate.why}" if net else
            "auto: the net deltas of its inputs are empty (the plan's estimate was for the log's rows)"),
            choice={**work.choice, "crossover": estimate.as_dict()})

    def maintain(self, work: ViewWork, progress: Progress) -> ViewWork:
        """One view: its strategy's maintenance (ivm.maintain.strategy) or a full recompute. Returns the
        view's work as done (its mode, rows and layers), maintained: a new value, ``work`` as it was."""
        ctx, full = self.ctx, self.full
        states, counting, count_free = ((self.states, self.counting, self.count_free) if work.catch_up is None
                                        else self.behind(work.view, work.catch_up))
        program, strata = ctx.program
        started = time.perf_counter()
        self.written.clear()
        work = dataclasses.replace(work, delta_in=sum(t.delta_rows for t in self.plan.tables
                                                      if t.table in work.changed_inputs))
        if work.rule_change is not None:
            counting.rule_changes |= dict.fromkeys(view_predicates(program, strata, work.view), work.rule_change)
        elif work.mode is Mode.FULL and (work.choice or {}).get("crossover"):
            work = self.reweigh(work)  # (the crossover planned on the log's rows; the trim has given the net deltas)
        if (work.rule_change is None and work.mode is Mode.INCREMENTAL
                and not any(counting.changed(u) for u in strata.upstream(work.view))):
            work = dataclasses.replace(work, mode=Mode.NOOP, maintained=True,
                                       reason="the net deltas of its inputs are empty or cancel out")
            progress(f"maintain: {work.view}: nothing to do, {work.reason}")
            return work
        strategy = lookup(work.strategy)
        if work.mode is Mode.INCREMENTAL:
            cfg = ctx.config.views[work.view]
            outcome = strategy.maintain(counting, count_free, work.view, cfg, work.upstream)
            own = self.written.get(work.view)
            changed = own.rows if own else 0
            work = dataclasses.replace(work, rows_changed=changed, rows=changed, detail=dict(outcome.detail))
            how = (f"{strategy.describe(program, strata, work.view, cfg)}, {work.rows_changed} tuples changed"
                   f"{outcome.said}")
        else:
            own = set(view_predicates(program, strata, work.view))  # a recursive view is upstream of itself
            for name in strata.upstream(work.view) - set(full.relations) - own:
                if program.predicates[name].kind in (Kind.BASE, Kind.VIEW):  # (extractions: from their tables)
                    full.relations[name] = self.new_state(name)
                if full.weighted and program.predicates[name].kind == Kind.BASE:  # (a keyed table's count 1 each)
                    full.layers[name] = self.new_rows(name)
            for name, df in materialize(full, ctx.relations.groupby_states, work.view):
                if strategy.count_free:
                    if name != work.view:
                        continue  # key-based and reducing maintenance store the view alone, each tuple once
                    df = as_used(program.predicates[name], df)
                layer = ctx.warehouse.write_layer(df, name, "base", cluster_by=ctx.cluster_columns(name),
                                                  run_id=self.plan.run_id)
                self.written[name] = layer
                states.replaced[name] = layer.path
                if name in program.predicates:  # the predicates above read what was written, not its lineage
                    full.relations[name] = states.new(name)
                elif name in ctx.relations.groupby_states:  # T of its GROUPBY subgoal, as the state holds it
                    st = ctx.relations.groupby_states[name]
                    full.groupby_tables[st.subgoal] = st.finalize(states.new(name))
            work = dataclasses.replace(work, rows=self.written[work.view].rows)
            how = f"full recompute ({work.reason}), {work.rows} rows"
            self.difference(work.view)
        work = dataclasses.replace(work, layers={r: self.written[r] for r in ctx.stored_relations(work.view)
                                                 if r in self.written}, maintained=True)
        if work.catch_up is not None:  # the views above read its delta from the run's own states
            self.absorb(work)
        work = dataclasses.replace(work, seconds=time.perf_counter() - started)
        progress(f"maintain: {work.view} (stratum {work.stratum}): {how} ({work.seconds:.2f} s)")
        return work


def maintain_stage(ctx: RunContext, run_id: str, views: list[str] | None = None,
                   progress: Progress = lambda _: None) -> list[ViewWork]:
    """Stage 3: the planned views (or the named ones, e.g. one stratum's), in stratum order. Each view's
    new layers are staged in the run's record; the views of lower strata must have been maintained by an
    earlier call (or in this one)."""
    p, _ = load_plan(ctx, run_id)
    todo = [w for w in p.views if views is None or w.view in views]
    unknown = sorted(set(views or []) - {w.view for w in p.views})
    if unknown:
        raise NotFoundError(f"run {run_id} does not refresh {unknown[0]}")
    for w in todo:
        below = [u.view for u in p.views if u.view in ctx.program[1].upstream(w.view)
                 and not u.maintained and u not in todo]
        if below:
            raise RunError(f"run {run_id}: {w.view} reads {below[0]}, which is not maintained yet")
    if not todo:
        return []
    # a retried stage starts from what the stages before it staged, not from its own attempt
    names = {w.view for w in todo}
    p.views = [w.as_planned() if w.view in names else w for w in p.views]
    scratch = Scratch(ctx.warehouse, ctx.spark, f"{run_id}/{'+'.join(w.view for w in todo)[:100]}")
    m = Maintenance(ctx, p, scratch)
    done = []
    for i, work in enumerate(p.views):
        if work.view not in names:
            continue
        # a small run's incremental maintenance without adaptive execution (ivm.spark.adaptive); a full
        # recompute keeps it. Decided as the view starts: should its derived deltas outgrow the limit (a
        # fan-out), the rest of the view runs the distributed plan without it, as planned statically
        with adaptive(ctx.spark, not (work.mode is Mode.INCREMENTAL and m.states.small)):
            # (what it wrote is visible to the views above it through m already; the plan holds it as done,
            # for the views above that ask whether it was maintained: `Maintenance.difference`)
            p.views[i] = work = m.maintain(work, progress)
        ctx.catalog.save_stage(run_id, work.maintain_record())
        done.append(work)
    return done
