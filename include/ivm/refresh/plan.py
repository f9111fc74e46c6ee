"""Stage 1, plan (docs/design.md §5-6): fix the snapshot (the newest commit version of every base table's
log), pick the tables with changes past their watermark and the views to refresh, and decide for each
view how: incremental (the strategy ivm.maintain.strategy chooses) or a full recompute, for the first of
`RULES` that holds. ``ivm explain`` prints the same rules' ``when``, so its text is what the planner does.
`begin` records the plan (ivm.refresh.record) and takes the leases; `load_plan` reads it back in any
later stage's process.

The rules read a view's `ViewFacts`, gathered from the catalog before any rule runs, so they are pure
functions: planning decisions are testable without Spark or a catalog.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ivm.catalog.store import LayerRef, aware, new_id
from ivm.changes import cancel, delta
from ivm.context import RunContext
from ivm.errors import ChangeDataError, ConfigError, NotFoundError, RunError
from ivm.lang import compile_project
from ivm.maintain.counting import view_predicates
from ivm.maintain.crossover import Estimate
from ivm.maintain.crossover import estimate as crossover_estimate
from ivm.maintain.dred import RuleChange, rule_change
from ivm.maintain.strategy import Choice, choose, lookup, stored_form
from ivm.modes import Mode
from ivm.refresh.record import CatchUp, Plan, Replay, TableDelta, ViewWork, layer_json
from ivm.vocabulary import Kind, RunStatus, StageName


@dataclass
class ViewFacts:
    """What the rules read of one view in one run (from the catalog and the run's other choices)."""

    view: str
    #: the run's mode, and the view's ``mode:``
    asked: Mode = Mode.AUTO
    configured: Mode = Mode.AUTO
    materialized: bool = True
    #: the definition changed since the state was computed ("" when not; else where it is said, e.g.
    #: " after run X" for a replay)
    definition_changed: str | None = None
    #: stored relations of the view not materialized yet
    missing: list[str] = field(default_factory=list)
    #: (table, first, last) commit versions of a table an earlier run applied without this view, when
    #: the view cannot catch up from its own pointer (`catch_up`), and why not
    missed: list[tuple[str, int, int]] = field(default_factory=list)
    lost: str = ""
    #: the chosen strategy's stored form differs from the state's: why, in words
    form_switch: str | None = None
    #: the crossover's estimate (None: not asked: not auto, no changed input, or disabled)
    crossover: Estimate | None = None
    #: a Delta source it reads was created anew at its location: which, and how it shows ("" when none)
    replaced: str = ""


@dataclass(frozen=True)
class RecomputeRule:
    """One reason a run recomputes a view in full rather than maintaining it."""

    name: str
    #: when it holds, as ``ivm explain`` says
    when: str
    reason: Callable[[ViewFacts], str | None]


DEFINITION_CHANGED = RecomputeRule(
    "definition", "its definition changed (a recursive view whose recursive predicates only gained or lost rules "
                  "is maintained across the change by DRed, 000 §7)",
    lambda f: None if f.definition_changed is None else f"the definition changed{f.definition_changed}")

#: the reasons for a full recompute, in the order the planner tries them (docs/design.md §5)
RULES: tuple[RecomputeRule, ...] = (
    RecomputeRule("asked", "the run is asked for --mode full",
                  lambda f: "--mode full" if f.asked is Mode.FULL else None),
    RecomputeRule("configured", "the view is configured with mode: full",
                  lambda f: "the view is configured with mode: full" if f.configured is Mode.FULL else None),
    RecomputeRule("first", "it is materialized for the first time",
                  lambda f: None if f.materialized else "first materialization"),
    RecomputeRule("replaced", "a Delta source it reads was created anew at its location (deleted and written again, "
                              "or replaced): its versions and change data feed start over",
                  lambda f: f.replaced or None),
    DEFINITION_CHANGED,
    RecomputeRule("missing", "a relation it stores is not materialized yet",
                  lambda f: f"{f.missing[0]} is not materialized yet" if f.missing else None),
    RecomputeRule("missed", "a run that did not refresh it applied changes of a table it reads, and its state at "
                            "its own pointer into that log is gone (otherwise it catches up from there)",
                  lambda f: None if not f.missed else f"commit versions {f.missed[0][1]}..{f.missed[0][2]} of "
                  f"{f.missed[0][0]} were applied by a run that did not refresh this view, and {f.lost}"),
    RecomputeRule("form", "the chosen strategy stores the view in another form than its state holds",
                  lambda f: f.form_switch),
    RecomputeRule("crossover", "under --mode auto, the view's measured costs say a recompute is cheaper (crossover)",
                  lambda f: f"auto: {f.crossover.why}" if f.crossover is not None and f.crossover.full else None),
)


def recompute_reason(facts: ViewFacts, rules: tuple[RecomputeRule, ...] = RULES) -> tuple[RecomputeRule, str] | None:
    """The first rule that holds for the view, and its reason in words; None: maintain it.

    >>> recompute_reason(ViewFacts("v", materialized=False))[1]
    'first materialization'
    >>> recompute_reason(ViewFacts("v")) is None
    True
    """
    for rule in rules:
        why = rule.reason(facts)
        if why is not None:
            return rule, why
    return None


def plan(ctx: RunContext, views: list[str] | None = None, mode: str = Mode.AUTO, run_id: str | None = None,
         from_version: int | None = None) -> Plan:
    """Stage 1: the snapshot, the tables with changes past their watermark, the views to refresh
    (with ``from_version``: a replay, `plan_replay`)."""
    if from_version is not None:
        if mode == Mode.FULL:
            raise ConfigError("a replay from a commit version maintains the views; it cannot be --full as well")
        return plan_replay(ctx, views or [], from_version, run_id)
    mode = Mode.parse(mode)
    catalog = ctx.catalog
    # each Delta source's newest version and table id (delta-rs), the other tables' newest commit versions
    sources = {name: delta.current(where, name) for name in ctx.config.tables
               if (where := ctx.source_location(name)) is not None}
    snapshot = {name: delta.ivm_version(sources[name][0]) if name in sources
                else catalog.last_commit_version(name) for name in ctx.config.tables}
    watermarks = catalog.watermarks()
    p = Plan(run_id or new_id("refresh-"), snapshot, mode=mode)
    # a refresh of some views trims only the tables they read: the other tables' readers keep their
    # deltas for their own next refresh
    read = {t for v in views for t in ctx.base_tables(v)} if views else set(snapshot)
    defs = functools.cache(catalog.table_defs)
    for name, newest in snapshot.items():
        wm = watermarks.get((name, name), 0)
        where = ctx.source_location(name)
        if where is not None and wm and name in read:
            replaced = _replaced(where, sources[name][1], defs()[name].source_id, wm, newest)
            if replaced is not None:  # read from its first version, as at a first materialization: its
                p.replaced[name] = replaced  # readers are recomputed from it as it is (no feed read)
                p.tables.append(TableDelta(name, 0, newest, delta.rows_at(where, name, delta.delta_version(newest))))
                continue
        if newest > wm and name in read:
            if where is None:
                aside = catalog.quarantined_versions(name)
                live = _live_segments(catalog, name, wm, newest, aside)
                if not live:  # (every commit past the watermark set aside: nothing to trim, no Spark)
                    continue
                if _cancels(ctx, name, live, wm, newest, aside):
                    p.cancelled.append(f"{name} (commit versions {wm + 1}..{newest})")
                    continue
                rows = sum(s.rows for s in live)
            else:
                rows = (delta.change_rows(where, name, delta.delta_version(wm), delta.delta_version(newest)) if wm
                        else delta.rows_at(where, name, delta.delta_version(newest)))
            p.tables.append(TableDelta(name, wm, newest, rows))
    p.views = _plan_views(ctx, p, views, mode, watermarks)
    planned = {w.view for w in p.views}
    for name, how in p.replaced.items():  # (a reader left out would go on from versions of the old table)
        readers = [v for v in sorted(ctx.config.views) if name in ctx.base_tables(v)]
        left = [v for v in readers if v not in planned]
        if left:
            raise ChangeDataError(f"table {name}: {how}; the views that read it are recomputed from it in one "
                                  f"run, and this one leaves out {', '.join(left)}: refresh them all "
                                  f"(`ivm refresh`, or `ivm refresh {' '.join(readers)}`)")
    return p


def _replaced(where: str, now: str, recorded: str | None, wm: int, newest: int) -> str | None:
    """How the Delta source at ``where`` (its table id ``now``) shows that it was created anew since ivm
    published its state as of commit version ``wm`` (a newest version behind ``wm``, or a table id other
    than the ``recorded`` one); None when it is the same table. Its change data feed then says nothing
    of how the new table differs from the state ivm holds: the views that read it are recomputed."""
    if newest < wm:
        return (f"the Delta table at {where} was created anew (its newest version {delta.delta_version(newest)} is "
                f"behind version {delta.delta_version(wm)}, which its state in ivm holds)")
    if recorded is not None and now != recorded:
        return (f"the Delta table at {where} was created anew (table id {now}, its state in ivm is of table "
                f"{recorded})")
    return None


def view_crossover(ctx: RunContext, view: str, change_rows: int) -> Estimate:
    """The crossover's estimate for ``view`` on a change of ``change_rows`` rows, from the view's measured
    incremental refreshes and its newest recompute (ivm.maintain.crossover)."""
    settings = ctx.config.views[view].crossover
    fulls = ctx.catalog.maintain_history(view, Mode.FULL, 1)
    return crossover_estimate(ctx.catalog.maintain_history(view, Mode.INCREMENTAL, settings.history),
                              fulls[0][1] if fulls else None, change_rows, settings)


def _live_segments(catalog, table: str, after: int, upto: int, aside: set[int]) -> list:
    """The log segments of (after, upto] that hold a commit not set aside (``aside``, `ivm log quarantine`):
    a range whose every commit was quarantined gives the trim nothing, and the table is left out of the
    run (its watermark stays; a later commit's trim skips the quarantined ones as always)."""
    return [s for s in catalog.segments(table, after, upto)
            if not all(v in aside for v in range(max(s.min_commit_version, after + 1),
                                                  min(s.max_commit_version, upto) + 1))]


def choose_strategy(ctx: RunContext, view: str, changed: dict[str, float] | None = None,
                    current: str | None = None) -> Choice:
    """How ``view`` is maintained in a run whose tables changed by about ``changed`` rows each
    (default: 0.1% of every table it reads), its state being stored as ``current`` (ivm.maintain.strategy):
    the planner's choice, which `ivm explain` shows."""
    program, strata = ctx.program
    cfg = ctx.config.views[view]
    sizes = {t: sum(x.rows or 0 for x in ctx.catalog.state(t).layers) for t in ctx.base_tables(view)}
    if changed is None or not any(changed.get(t) for t in sizes):
        # no change to go by (`ivm explain`, a first materialization): 0.1% of every table
        changed = {t: max(1.0, n / 1000) for t, n in sizes.items()}
    try:
        return choose(program, strata, view, cfg.strategy, cfg.key, sizes, changed, current)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _cancels(ctx: RunContext, table: str, segments: list, after: int, upto: int, aside: set[int]) -> bool:
    """Whether the log range (after, upto] but the commits set ``aside`` is small and, read on the driver,
    cancels out: every change applies and the net delta is empty (ivm.changes.cancel). The table is then
    left out of the run like a range set aside — its watermark stays, a later trim reads the range again
    with what follows — so a refresh whose changes all cancel starts no Spark and recomputes nothing."""
    layers = ctx.catalog.state(table).layers
    added = ctx.catalog.table_defs()[table].added_columns or []
    return cancel.cancels(ctx.warehouse, ctx.config.tables[table], segments, [x.path for x in layers], after, upto,
                          aside, added, sum(x.rows or 0 for x in layers))


def _closure(ctx: RunContext, wanted: list[str]) -> list[str]:
    """The wanted views and the views they read, in stratum order; NotFoundError for an unknown one."""
    _, strata = ctx.program
    ctx.config.check_views(wanted)
    return sorted({u for v in wanted for u in strata.upstream(v) if u in ctx.config.views} | set(wanted),
                  key=lambda v: (strata.stratum_of[v], v))


def _plan_views(ctx: RunContext, p: Plan, wanted: list[str] | None, mode: Mode,
                watermarks: dict[tuple[str, str], int]) -> list[ViewWork]:
    """Which views this run refreshes, and how (docs/design.md §5's algorithm choice, per run):

    * full recompute for the first of `RULES` that holds;
    * incremental across a changed definition when the view is recursive and only rules of its
      recursive predicates were added or removed: DRed follows rule changes (000 §7), and the views
      above it are maintained from its delta;
    * incremental above a recomputed view: it passes up its new state minus its old one as its delta
      (ivm.refresh.maintenance), as 000 Algorithm 4.1 passes up any view's Δ, so a recompute does not
      cascade into the views that read it;
    * otherwise incremental (the counting algorithm, 000 §4-6, with DRed for recursive components; or
      the strategy ivm.maintain.strategy chooses) when an input table changed. Counting stores
      derivation counts and GROUPBY states, so every reference is maintainable under inserts, deletes
      and updates alike: 003's safety conditions concern maintenance *without* counts
      (``strategy: keyed``), not this one.
    """
    program, strata = ctx.program
    names = _closure(ctx, wanted) if wanted else sorted(ctx.config.views, key=lambda v: (strata.stratum_of[v], v))
    changed = {t.table for t in p.tables}
    change_rows = {t.table: float(t.log_rows) for t in p.tables}
    defined = ctx.catalog.view_defs()
    points = functools.cache(ctx.catalog.restore_points)  # (catch_up's, read once for every view behind)
    same = functools.cache(ctx.catalog.same_states)
    work: list[ViewWork] = []
    full: set[str] = set()
    followed: set[str] = set()  # views whose rule change DRed follows, and the views above them
    for view in names:
        cfg = ctx.config.views[view]
        upstream = ctx.base_tables(view)
        state = ctx.catalog.state(view)
        d = defined.get(view)
        inputs = sorted(changed & set(upstream))
        choice = choose_strategy(ctx, view, change_rows, state.form if state.version_id is not None else None)
        form = stored_form(choice.strategy)

        estimate = None
        if inputs and mode is Mode.AUTO and cfg.mode is Mode.AUTO and cfg.crossover.enabled:
            # the crossover (ivm.maintain.crossover): a full recompute when the measured costs say so
            estimate = view_crossover(ctx, view, int(sum(change_rows[t] for t in inputs)))
        # a table whose changes an earlier run applied without refreshing this view (a refresh of other
        # views, another schedule group): the view catches up from its own pointer (#48, item 1), or is
        # recomputed when its state there is gone
        missed = [(t, watermarks.get((view, t), 0) + 1, watermarks[(t, t)]) for t in upstream
                  if watermarks.get((view, t), 0) < watermarks.get((t, t), 0)]
        behind = catch_up(ctx, view, points, same) if missed and state.version_id is not None else None
        facts = ViewFacts(
            view, mode, cfg.mode, materialized=state.version_id is not None,
            definition_changed="" if d is not None and state.created_at is not None
            and aware(d.updated_at) > state.created_at else None,
            missing=[r for r in ctx.stored_relations(view) if ctx.catalog.state(r).version_id is None],
            missed=missed if not isinstance(behind, CatchUp) else [], lost=behind if isinstance(behind, str) else "",
            form_switch=None if form == state.form else
            f"{choice.strategy} stores the view as {form}, its state holds {state.form} ({choice.reason})",
            crossover=estimate, replaced="; ".join(f"Delta source {t}: {p.replaced[t]}" for t in upstream
                                                   if t in p.replaced))
        found = recompute_reason(facts)
        recursive = bool(strata.recursive_among(view_predicates(program, strata, view)))
        # (DRed follows a rule change from the view's published state only: one that also fell behind is
        # recomputed, as the definition changed)
        change = (_rule_change(ctx, view, d) if found and found[0] is DEFINITION_CHANGED and recursive and not missed
                  else None)
        if isinstance(change, RuleChange):
            followed.add(view)
            work.append(ViewWork(view, strata.stratum_of[view], Mode.INCREMENTAL,
                                 f"DRed (000 §7) across the changed definition: {change.describe()}"
                                 + (f"; inputs changed: {', '.join(inputs)}" if inputs else ""),
                                 upstream, inputs, rule_change=change))
        elif found is not None:
            reason = found[1] + (f" ({change})" if change else "")
            if Mode.INCREMENTAL in (mode, cfg.mode):
                raise ConfigError(f"views.{view}: cannot be maintained incrementally in this run ({reason}); "
                                  "use --mode auto or full")
            full.add(view)
            work.append(ViewWork(view, strata.stratum_of[view], Mode.FULL, reason, upstream, inputs))
        elif inputs or (followed | full) & strata.upstream(view) or isinstance(behind, CatchUp):
            why = [f"inputs changed: {', '.join(inputs)}"] if inputs else []
            if isinstance(behind, CatchUp):
                why.insert(0, "catches up from its own pointer, the state run " + behind.run_id + " published ("
                           + ", ".join(f"{t} {a}..{b}" for t, a, b in missed) + " applied since without it)")
            why += [f"reads {v}, maintained across its changed definition"
                    for v in sorted(followed & strata.upstream(view))]
            # no cascade (#48): a view recomputed below passes up the difference of its new and old states
            why += [f"reads {v}, recomputed in this run, from the difference of its states"
                    for v in sorted(full & strata.upstream(view))]
            if followed & strata.upstream(view):
                followed.add(view)
            how = lookup(choice.strategy).describe(program, strata, view, cfg)
            work.append(ViewWork(view, strata.stratum_of[view], Mode.INCREMENTAL, f"{how}: {'; '.join(why)}",
                                 upstream, inputs))
        else:
            continue
        work[-1].strategy, work[-1].choice = choice.strategy, choice.as_dict()
        if isinstance(behind, CatchUp) and work[-1].mode is Mode.INCREMENTAL:
            work[-1].catch_up = behind
        if estimate is not None and (found is None or found[0].name == "crossover"):  # (the rules reached it)
            work[-1].choice["crossover"] = estimate.as_dict()
    return work


def catch_up(ctx: RunContext, view: str, points: Callable[[], list] | None = None,
             same: Callable[[], dict[int, int]] | None = None) -> CatchUp | str:
    """Where a view that fell behind catches up from (#48, item 1; 002 keeps a log pointer per view):
    the published run that left the view in its current state — its snapshot is the view's pointer into
    every log it reads — with the layers, in that run's state, of each relation the view reads that moved
    since. The refresh then maintains the view from those states by each relation's changes since (its
    layers published after them, and this run's delta; a Delta source's, its change data feed since the
    Delta version the view holds), as a view that never fell behind is maintained from its last state.
    Or, in words, why it cannot: that state is no longer kept (``ivm gc``'s retention), or a Delta
    source's feed since then is (its log's retention, VACUUM). A relation compacted since (`ivm.compaction`)
    holds the state it held: the view, its GROUP BY states and auxiliary views, or a relation it reads,
    compacted while it lagged, still match the restore point. ``points``, ``same``: the catalog's restore
    points and compactions (`Catalog.same_states`), read once per plan however many views fell behind
    (default: read here)."""
    points = points or ctx.catalog.restore_points
    same = same or ctx.catalog.same_states
    catalog = ctx.catalog
    program, strata = ctx.program
    stored = ctx.stored_relations(view)
    own = set(stored) | {p for p in program.predicates if program.owner(p) == view}
    reads = sorted(u for u in strata.upstream(view) - own if program.predicates[u].kind in (Kind.BASE, Kind.VIEW))
    # each relation's current version and the versions it compacted, back: one state
    states = {r: _same_state(catalog.state(r).version_id, same()) for r in [*reads, *stored]}
    found = next(((run, versions) for run, versions in points()
                  if all(versions.get(r) in states[r] for r in stored) and all(r in versions for r in reads)), None)
    if found is None:
        return "no published run recorded its state with those of the relations it reads"
    run, versions = found
    layers = {}
    for r in reads:
        if versions[r] in states[r]:
            continue  # not moved since: its published state is the view's pointer
        state = catalog.version_state(r, versions[r])
        if state is None:
            return f"the state of {r} at its pointer (run {run.id}) was garbage-collected (storage.retention_hours)"
        at = [delta.parse_layer_path(x.path) for x in state.layers]
        if at and at[0] is not None and delta.history_gone(r, at[0][0], at[0][1] + 1) is not None:
            return (f"the change data feed of the Delta source {r} after Delta version {at[0][1]}, its pointer, "
                    f"is gone (log retention or VACUUM of {at[0][0]})")
        layers[r] = [layer_json(x, r) for x in state.layers]
    return CatchUp(run.id, layers)


def _same_state(version_id: int | None, compacted: dict[int, int]) -> set[int | None]:
    """``version_id`` and the versions it compacted, one after the other: the same state."""
    found = {version_id}
    while version_id in compacted and compacted[version_id] not in found:
        version_id = compacted[version_id]
        found.add(version_id)
    return found


def plan_replay(ctx: RunContext, wanted: list[str], from_version: int, run_id: str | None = None) -> Plan:
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
    catalog = ctx.catalog
    program, strata = ctx.program
    if not wanted:
        raise ConfigError("a replay names the views to replay")
    views = _closure(ctx, wanted)
    if from_version < 1:
        raise ConfigError(f"--from-version {from_version}: commit versions start at 1")
    tables = sorted({t for v in views for t in ctx.base_tables(v)})
    needed = [*tables, *(r for v in views for r in ctx.stored_relations(v))]
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
        layers[r] = [layer_json(x, r) for x in state.layers]
    watermarks = catalog.watermarks()
    restored = {t: int(run.snapshot.get(t, 0)) for t in tables}
    p = Plan(run_id or new_id("backfill-"), {t: watermarks.get((t, t), 0) for t in tables}, mode=Mode.REPLAY,
             replay=Replay(from_version, run.id, restored, layers))
    p.tables = [TableDelta(t, restored[t], p.snapshot[t], 0) for t in tables if p.snapshot[t] > restored[t]]
    changed = {t.table for t in p.tables}
    defined = catalog.view_defs()
    since = "; ".join(f"{t.table} {t.from_version + 1}..{t.to_version}" for t in p.tables) or "no changes since"
    full: set[str] = set()
    for view in views:
        cfg = ctx.config.views[view]
        upstream = ctx.base_tables(view)
        d = defined.get(view)
        state = catalog.version_state(view, versions[view])
        choice = choose_strategy(ctx, view, {t.table: float(t.to_version - t.from_version) for t in p.tables},
                                     state.form)
        form = stored_form(choice.strategy)
        facts = ViewFacts(
            view, Mode.REPLAY, cfg.mode,
            definition_changed=f" after run {run.id}" if d is not None and state.created_at is not None
            and aware(d.updated_at) > state.created_at else None,
            form_switch=None if form == state.form else
            f"{choice.strategy} stores the view as {form}, the restored state holds {state.form}")
        found = recompute_reason(facts)
        if found is not None:
            full.add(view)
            work = ViewWork(view, strata.stratum_of[view], Mode.FULL, found[1], upstream,
                            sorted(changed & set(upstream)))
        else:
            how = lookup(choice.strategy).describe(program, strata, view, cfg)
            work = ViewWork(view, strata.stratum_of[view], Mode.INCREMENTAL,
                            f"{how}: replay from the state after run {run.id} "
                            f"(commit versions {since})", upstream, sorted(changed & set(upstream)))
        work.strategy, work.choice = choice.strategy, choice.as_dict()
        p.views.append(work)
    return p


def _rule_change(ctx: RunContext, view: str, applied) -> RuleChange | str | None:
    """For a view whose definition changed since its stored state was computed: the rules DRed must
    follow (000 §7), or why it cannot; None when the earlier definition is not known."""
    if applied is None or not applied.materialized:
        return None
    before = ctx.config.views[view].model_copy(update={
        "sql": None, "datalog": None, applied.materialized["language"]: applied.materialized["definition"]})
    try:
        old = compile_project(ctx.config.model_copy(update={"views": {**ctx.config.views, view: before}}))
    except ConfigError as e:
        return f"the earlier definition no longer compiles: {e}"
    return rule_change(old, ctx.program[0], view)


# -- the run's record in the catalog ----------------------------------------------------------------------


def begin(ctx: RunContext, p: Plan, kind: str = "refresh") -> None:
    """Stage 1's record: the run, its plan and the versions it read (publish checks nothing moved), and
    the leases on everything it will publish. Beginning a run id again (a retried plan task, a re-run of
    a failed DAG run) drops what its earlier attempt staged and plans afresh; a published run is final."""
    catalog = ctx.catalog
    names = [t.table for t in p.tables] + [v.view for v in p.views]
    # every table a planned view reads is leased too, trimmed or not: another run (another schedule
    # group) publishing it between this run's stages would otherwise hand the views a newer state than
    # the watermarks this run records
    read = sorted({t for v in p.views for t in v.upstream} - set(names))
    stored = [r for v in p.views for r in ctx.stored_relations(v.view)]
    earlier = catalog.get_run(p.run_id)
    if earlier is not None:
        if earlier.status in (RunStatus.SUCCEEDED, RunStatus.NOOP):
            raise RunError(f"run {p.run_id} was published already; start a new run")
        catalog.reset_run(p.run_id, p.snapshot, names, p.mode)
    else:
        catalog.start_run(p.run_id, kind, p.snapshot, names, mode=p.mode)
    catalog.acquire_leases(p.run_id, names + read, ctx.lease_timeout)
    catalog.save_stage(p.run_id, p.record({n: catalog.state(n).version_id for n in [*names, *stored]}))


def load_plan(ctx: RunContext, run_id: str) -> tuple[Plan, dict[str, int | None]]:
    """The plan ``begin`` recorded, with the tables and views as their stages have staged them so far."""
    records = ctx.catalog.stage_records(run_id)
    if not any(r.stage == StageName.PLAN for r in records):
        raise NotFoundError(f"run {run_id} has no plan (run the plan stage first)")
    p, versions, planned = Plan.from_records(run_id, records)
    defined = ctx.catalog.view_defs()
    for work, v in zip(p.views, planned, strict=True):
        if v["rule_change"]:
            change = _rule_change(ctx, work.view, defined.get(work.view))
            if not isinstance(change, RuleChange):
                raise RunError(f"run {run_id}: the definition of {work.view} changed since the run was planned")
            work.rule_change = change
    return p, versions


def old_layer_refs(ctx: RunContext, p: Plan, name: str) -> list[LayerRef]:
    """The layers of the state a run maintains ``name`` from: the published one, or a replay's restored
    one."""
    if p.replay and name in p.replay.layers:
        return [LayerRef(x["id"], x["kind"], x["path"], x["rows"], x["bytes"]) for x in p.replay.layers[name]]
    return list(ctx.catalog.state(name).layers)


def old_layers(ctx: RunContext, p: Plan, name: str) -> list[tuple[str, int]]:
    """(path, rows) of each of `old_layer_refs`."""
    return [(x.path, x.rows or 0) for x in old_layer_refs(ctx, p, name)]
