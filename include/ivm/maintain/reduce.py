"""The reducing algorithms of 004 (Furukawa, Elmagarmid) for set-semantics projection views
``V = σ_C π_{X_V} (R_1 * ... * R_n)``, maintained without derivation counts.

For an update of R_1 (the changed table reference; the others follow in a connected join order) the
algorithms build, join by join, a *candidate* relation V_C^i (what the changed tuples derive) and an
*existing* relation V_E^i (what the unchanged tuples of R_1 that agree with them on the view's
columns derive), and the *target* relation V_T = V_C − V_E is what leaves (deletion) or enters
(insertion, §5) the view (Definitions 1–4, Propositions 1–3):

  NAIVE   (Algorithm 1)  V_E^1 restricted to the changed tuples' Y_1 values, V_T = π V_C^n − π V_E^n
  RIE     (Algorithm 2)  + V_E^i keeps only tuples agreeing with V_C^i on Y_i
  RIC     (Algorithm 3)  + V_C^i drops tuples agreeing with V_E^i on Z_i (they derive only V_F), V_T = π V_C^n
  REDUCE  (Algorithm 4)  both reductions at every join
  REDUCE+ (Algorithm 5)  REDUCE with selections applied, and projections onto Z_i taken, as early as possible

Several changed tuples at once are the multiple updates of §6: MU1 (Algorithm 6) computes the targets
of the insertions and of the deletions separately, V_R = (V − V_TD) ∪ V_TI; MU2 (Algorithm 7) also
counts the insertion candidates as existing tuples for the deletions (their targets shrink; the view
change is then checked against V). Theorem 3 (the view holds a key of R_i: V_E^i = ∅, later existing
relations are not built; for a deletion at i = 1 the targets are read off V itself) and Theorem 4 (Y_i
holds the view's declared key: stop at step i) shorten the work; under REDUCE and REDUCE+ an insertion
builds no existing relation at all: its existing relation's view tuples are V's (§5, see
``Reducer.update``).

On Spark the steps of a changed table's update are one set-based plan, not an action per step: the
insertions' and deletions' V_C^i and V_E^i are one relation with a count per side (``_Update``), each
step a join, an aggregate and the windows RIC and RIE need over the step before, and the run's view
change is computed by the one job that writes it (plus one write per further changed table, whose
update reads V as the earlier ones left it). §3's "quit the materialized view update" when V_C^i is
empty is Spark's: once no candidate is left, RIE (or, where RIE does not apply, a test of the step's
relation: ``_Update._quit``) drops the existing side too, and adaptive execution turns the joins above
an empty relation into empty relations. §7's "skip the reduction by RIE or RIC" where it cannot pay:
RIC with no existing relation left, RIE at the last step (V_T reads no V_E^n). A chain longer than
``CHECKPOINT_STEPS`` joins is written every that many, which bounds the plan Spark optimizes at once.
A step's sizes are counted on demand (``Step.rows``: the paper's examples and their tests), never by a
refresh.

Changes to several tables (or to a table joined with itself) are applied one reference at a time, as
in 000's delta rules: references before the updated one at their new state, after it at their old.
Tuple comparisons on Y_i and Z_i are null-safe (a view tuple with a NULL is one tuple); joins are SQL
joins (NULL never matches).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from ivm.config import COUNT_COLUMN
from ivm.ir import Atom, Condition, Const, Literal, Program, Rule, Var
from ivm.maintain import recompute, subgoals
from ivm.maintain.counting import presence_change
from ivm.maintain.fixpoint import as_set
from ivm.maintain.recompute import Evaluator, natural_join
from ivm.storage import Scratch
from ivm.vocabulary import Kind, MultipleUpdates, ReduceAlgorithm
from ivm.zset import BROADCAST_BYTES, anti_join, consolidate, negate, quote, restrict, union_all

log = logging.getLogger(__name__)
C = COUNT_COLUMN
#: an update's relation is written after this many joins when more follow (each step adds a join, an
#: aggregate and windows to the plan Spark optimizes at once)
CHECKPOINT_STEPS = 4


@dataclass(frozen=True)
class Shape:
    """A view as 004 §2 sees it: one rule, positive atoms over tables joined on shared variables,
    conditions (the selection C), a head of variables and constants (the projection on X_V)."""

    view: str
    rule: Rule
    atoms: tuple[Atom, ...]
    conditions: tuple[Condition, ...]

    @property
    def head_vars(self) -> list[str]:
        return [a.name for a in self.rule.head.args if isinstance(a, Var)]


def shape(program: Program, view: str) -> Shape | str:
    """The view's 004 shape, or why the reducing algorithms do not apply to it."""
    pred = program.predicates[view]
    if pred.semantics != "set":
        return "the view is not a set (SELECT DISTINCT): 004 maintains set-semantics projection views"
    rules = program.rules_for(view)
    if len(rules) != 1:
        return "the view has several select expressions (UNION); 004 covers one projection-selection-join"
    rule = rules[0]
    atoms, conditions = [], []
    for item in rule.body:
        entry = subgoals.rule_for(program, item)  # (the subgoal kinds' table: a plain join)
        if entry is not None and entry.joins and program.predicates[item.atom.pred].kind == Kind.BASE:
            atoms.append(item.atom)
        elif isinstance(item, Condition):
            conditions.append(item)
        else:
            return (f"`{item}` is not a join of tables or a selection (004 covers σ π (R_1 * ... * R_n); "
                    "subqueries, negation, aggregation and computed columns are maintained by counting)")
    if not all(isinstance(a, Var | Const) for a in rule.head.args):
        return "the view computes a column; 004 projects on columns of the joined tables"
    if not atoms:
        return "the view reads no table"
    return Shape(view, rule, tuple(atoms), tuple(conditions))


def key_in_view(program: Program, atom: Atom, bound: set[str]) -> list[str] | None:
    """A key of the atom's table whose columns are all variables in ``bound`` (or constants): over X_V,
    Theorem 3's premise; over the variables joined so far, a join that keeps a relation's size (the cost
    model, `ivm.maintain.strategy.Estimate`)."""
    pred = program.predicates[atom.pred]
    for key in pred.keys:
        args = [atom.args[pred.columns.index(c)] for c in key]
        if all(isinstance(a, Const) or (isinstance(a, Var) and a.name in bound) for a in args):
            return key
    return None


def join_order(program: Program, s: Shape, first: int) -> list[int]:
    """R_1 = the updated reference, then step by step a reference sharing a variable with those joined (a
    join, not a product, where the view allows), chosen as 004 says its properties should choose (§4 after
    Theorem 3: "this theorem will help to decide an optimal join order"; §7: "the properties of the
    reducing algorithms shown in Section 4 will be a great help to decide the order of the joins"):

    1. a reference whose key the view holds (Theorem 3: V_E^i = ∅ from that step on, so the existing
       relation costs nothing past it — under REDUCE the sooner the better);
    2. else the one that brings the most view columns into Y_i (RIE and RIC compare on them, and Theorem 4
       stops once Y_i holds the view's key);
    3. else body order (as the view is written).

    >>> from ivm.ir import Atom, Predicate, Program, Rule, Var
    >>> p = Program({n: Predicate(n, c, Kind.BASE, keys=k) for n, c, k in (
    ...     ("r1", ["a", "b"], [["a"]]), ("r2", ["b", "c", "d"], []), ("r3", ["d", "e"], []))})
    >>> A, B, C, D, E = map(Var, "ABCDE")
    >>> atoms = (Atom("r3", (D, E)), Atom("r1", (A, B)), Atom("r2", (B, C, D)))
    >>> join_order(p, Shape("v", Rule(Atom("v", (A, C, E)), tuple(Literal(x) for x in atoms)), atoms, ()), 2)
    [2, 1, 0]
    """
    head = set(s.head_vars)
    return recompute.join_order(tuple(Literal(a) for a in s.atoms), first, prefer=lambda i, seen: (
        key_in_view(program, s.atoms[i], head) is None, -len((s.atoms[i].variables() & head) - seen), i))


@dataclass
class Step:
    """One join step of a chain: its relations V_C^i and V_E^i (plans, counted only when asked)."""

    i: int
    table: str
    note: str = ""
    #: "candidate" (V_C^i) and "existing" (V_E^i, absent when none is built)
    frames: dict[str, DataFrame] = field(default_factory=dict, repr=False)

    def rows(self, side: str) -> int | None:
        """|V_C^i| (``side`` "candidate") or |V_E^i| ("existing"), None when not built: a Spark job each
        (the paper's examples and their tests; a refresh does not count them)."""
        return self.frames[side].count() if side in self.frames else None


@dataclass
class UpdateTrace:
    """What one reference's update did: per kind (insertion / deletion), the steps and the target V_T."""

    table: str
    kind: str
    steps: list[Step] = field(default_factory=list)
    target: DataFrame | None = field(default=None, repr=False)
    shortcut: str = ""


class Reducer:
    """Computes the view change of one run with one of the reducing algorithms.

    ``relation(table, state)`` gives a table as the rules use it at "old" or "new" (its layers; each
    step settles what it joined into a set);
    ``changes(pred)`` its set change (+1 inserted, -1 deleted tuples) or None; ``view_old`` the view's
    stored tuples before the run; ``small(pred)``: its change is small enough to broadcast, and so are
    the relations an update derives from it alone."""

    def __init__(self, program: Program, s: Shape, algorithm: ReduceAlgorithm, multiple: MultipleUpdates,
                 view_key: list[str] | None,
                 relation: Callable[[str, str], DataFrame], changes: Callable[[str], DataFrame | None],
                 view_old: DataFrame, scratch: Scratch, ev: Evaluator, small: Callable[[str], bool] = lambda _t: False):
        self.program, self.s = program, s
        self.algorithm, self.multiple = ReduceAlgorithm(algorithm), MultipleUpdates(multiple)
        self.relation, self.changes, self.view_old = relation, changes, view_old
        self.scratch, self.ev, self.small = scratch, ev, small
        head = self.program.predicates[s.view].columns
        self.column_of = {a.name: c for a, c in zip(s.rule.head.args, head, strict=True) if isinstance(a, Var)}
        self.key_vars = None
        if view_key:
            by_col = {c: a for a, c in zip(s.rule.head.args, head, strict=True)}
            if all(isinstance(by_col.get(k), Var) for k in view_key):
                self.key_vars = {by_col[k].name for k in view_key}
        self.traces: list[UpdateTrace] = []
        self._n = 0
        self._deltas: list[DataFrame] = []  # the view changes of the references already applied

    # -- helpers ---------------------------------------------------------------------------------------

    def _put(self, name: str, df: DataFrame) -> tuple[DataFrame, int]:
        """Write a relation to the run's scratch space (one Spark job) and read it back, with its size in
        bytes: a long update's checkpoint, or a changed table's view change that the next table's update
        reads."""
        self._n += 1
        # (under the view's name: two REDUCE views of one run name their steps alike, emp-2; found by a
        # change stream when they shared a folder)
        path, _, size = self.scratch.put(f"reduce/{self.s.view}/{self._n:03d}-{name}", df)
        return self.scratch.read([path], df.schema), size

    @property
    def writes(self) -> int:
        """Relations this run wrote before its view change (checkpoints, changes read by later updates)."""
        return self._n

    def _vars(self, df: DataFrame) -> list[str]:
        return [c for c in df.columns if c != C]

    def _plus(self) -> bool:
        return self.algorithm is ReduceAlgorithm.REDUCE_PLUS

    def _select(self, df: DataFrame, conditions: list[Condition]) -> DataFrame:
        for c in conditions:
            df = df.where(F.expr(str(c)))
        return df

    def _settle(self, df: DataFrame) -> DataFrame:
        return as_set(df, self._vars(df))

    def _as_view(self, df: DataFrame) -> DataFrame:
        """π_{X_V}: the head's columns (constants included), one tuple each, count 1."""
        view = self.program.predicates[self.s.view]
        cols = [F.col(quote(a.name)).alias(c) if isinstance(a, Var) else F.lit(a.value).alias(c)
                for a, c in zip(self.s.rule.head.args, view.columns, strict=True)]
        return df.select(*cols).distinct().withColumn(C, F.lit(1).cast("long"))

    def current_view(self, keys: DataFrame, columns: list[str], small: bool = False) -> DataFrame:
        """V as the references applied so far left it, restricted to the tuples whose ``columns`` occur
        in ``keys`` (the stored layers and this run's earlier changes, consolidated for those keys;
        ``small``: the keys are broadcast)."""
        return self._settle(restrict(union_all([self.view_old, *self._deltas]), F.broadcast(keys) if small else keys,
                                     columns))

    # -- one run -----------------------------------------------------------------------------------------

    def run(self) -> DataFrame | None:
        """The view's change (+1 entering, -1 leaving tuples) over all changed references, as a plan (the
        caller writes it); None if no reference changed."""
        changed = [k for k, a in enumerate(self.s.atoms) if self.changes(a.pred) is not None]
        for n, k in enumerate(changed):
            delta = self.update(k)
            if n + 1 < len(changed):
                # the next reference's update reads V as this one left it (§5's insertions, Theorems 3
                # and 4, MU2): written once, not planned again inside each later update
                delta, _ = self._put(f"{self.s.atoms[k].pred}-change", delta)
            self._deltas.append(delta)
        return consolidate(union_all(self._deltas)) if self._deltas else None

    def update(self, k: int) -> DataFrame:
        """§6: the insertions S_I and deletions S_D of reference k as one multiple update (a plan)."""
        atom = self.s.atoms[k]
        change = self.changes(atom.pred)
        state = lambda j: "new" if j < k else "old"  # noqa: E731  the references before k see its new state
        rel = {j: self.ev.atom(a, self.relation(a.pred, state(j))) for j, a in enumerate(self.s.atoms) if j != k}
        own_old = self.ev.atom(atom, self.relation(atom.pred, "old"))
        changed = self.ev.atom(atom, change)
        s_i = changed.where(F.col(C) > 0)
        s_d = negate(changed.where(F.col(C) < 0))
        u = _Update(self, atom.pred, join_order(self.program, self.s, k), rel, s_i, s_d, own_old, self.small(atom.pred))
        for i in range(len(u.order)):
            u.step(i)
        t_i, t_d = u.target("insertion"), u.target("deletion")
        self.traces += list(u.traces.values())
        cols = list(self.program.predicates[self.s.view].columns)
        if u.view_existing:
            # §5 with V for the insertions' existing relation: R_1 − S_D derives V − V_TD, so V_TI =
            # π V_C^I − (V − V_TD) and V_R = (V − V_TD) ∪ V_TI = (V − V_TD) ∪ π V_C^I (Theorem 7's MU1
            # result): the candidates' tuples not in V enter, the deletion targets no candidate derives leave
            present = self.current_view(t_i.select(*map(quote, cols)).distinct(), cols, u.small)
            delta = union_all([anti_join(t_i, present, null_safe=True),
                               negate(anti_join(t_d, t_i, null_safe=True))])
            return consolidate(delta)
        delta = union_all([t_i, negate(t_d)])
        if self.multiple is MultipleUpdates.MU2:  # Theorem 8: (V − V_TD') ∪ V_TI, so V_TI may hold tuples still in V
            keys = delta.select(*[F.col(quote(c)) for c in cols]).distinct()
            delta = presence_change(self.current_view(keys, cols), consolidate(delta), cols)
        return consolidate(delta)


#: the four relations of one reference's update (§6: S_I and S_D as one multiple update): the
#: insertions' and the deletions' candidate (V_C^i) and existing (V_E^i) relations, kept as one relation
#: with a count column per side
SIDES = {"insertion": ("__ic", "__ie"), "deletion": ("__dc", "__de")}
ALL_SIDES = ("__ic", "__ie", "__dc", "__de")


def _some_side():
    """A row some side holds."""
    return functools.reduce(lambda a, b: a | b, [F.col(c) > 0 for c in ALL_SIDES])


class _Update:
    """One reference's update: its insertion and deletion chains (Algorithms 1–5, step by step) as one
    relation of the joined variables with a count per side — V_C^i and V_E^i of both kinds, a tuple of
    several sides one row. Each step joins the next table once for all four and settles them in one
    aggregate; RIC and RIE compare the sides of a row (under REDUCE+, whose rows are Z_i's projections)
    or of the rows agreeing on Z_i / Y_i (a window: NULLs agree, as in a null-safe comparison). So a
    step reads the one before it once, and the plan grows linearly with the steps."""

    def __init__(self, r: Reducer, table: str, order: list[int], rel: dict[int, DataFrame],
                 s_i: DataFrame, s_d: DataFrame, own_old: DataFrame, small: bool):
        self.r, self.order, self.rel = r, order, rel
        self.s_i, self.s_d, self.own_old, self.small = s_i, s_d, own_old, small
        #: the relation is broadcast into the joins: a small change's, while it holds no existing tuples or
        #: only those agreeing with the change on Y_1 (written after step 1, and small too)
        self.broadcast = False
        self.s = r.s
        self.traces = {kind: UpdateTrace(table, kind) for kind in SIDES}
        self.t: DataFrame | None = None
        self.joined: set[str] = set()
        self.applied: set[int] = set()  # conditions applied (REDUCE+)
        #: REDUCE and REDUCE+ build no existing relation for the insertions: V stands for its view
        #: tuples (Reducer.update)
        self.view_existing = r.algorithm.reduces_both
        self.has_existing = {"insertion": not self.view_existing, "deletion": True}
        self.active = {kind: True for kind in SIDES}  # False: a theorem settled the kind's target
        self.from_view: DataFrame | None = None  # Theorem 3 (i = 1) / Theorem 4: the deletion's keys of V_T

    # -- the attribute sets of §3 and §4 -----------------------------------------------------------------

    def _y(self) -> set[str]:
        """Y_i = ∪_{j≤i} X_j ∩ X_V."""
        return self.joined & set(self.s.head_vars)

    def _later(self, i: int) -> set[str]:
        return set().union(*(self.s.atoms[j].variables() for j in self.order[i + 1:])) if i + 1 < len(self.order) \
            else set()

    def _remaining_conditions(self) -> list[tuple[int, Condition]]:
        return [(n, c) for n, c in enumerate(self.s.conditions) if n not in self.applied]

    def _z(self, i: int) -> set[str]:
        """Z_i = Y_i ∪ the join attributes of the later steps ∪ attr(C) (REDUCE+: the conditions not
        applied yet)."""
        conds = [c for _, c in self._remaining_conditions()] if self.r._plus() else list(self.s.conditions)
        attr = set().union(*(c.variables() for c in conds)) if conds else set()
        return (self._y() | (self.joined & self._later(i)) | attr) & self.joined

    def _newly_applicable(self) -> list[Condition]:
        """C_i: the conditions whose variables are all joined now and that were not applied before."""
        out = []
        for n, c in self._remaining_conditions():
            if c.variables() <= self.joined:
                self.applied.add(n)
                out.append(c)
        return out

    # -- the sides ---------------------------------------------------------------------------------------

    def _vars(self) -> list[str]:
        return [c for c in self.t.columns if c != C and c not in ALL_SIDES]

    def side(self, name: str) -> DataFrame:
        """One side's relation as it stands (``__ic``, ``__ie``, ``__dc``, ``__de``): its tuples, count 1."""
        return self.t.where(F.col(name) > 0).select(*map(quote, self._vars()), F.lit(1).cast("long").alias(C))

    @staticmethod
    def _agree(side: str, on: list[str], rows: list[str]):
        """Whether a tuple of ``side`` agrees with the row on ``on``: the row's own count when ``on`` is
        all of its columns, else a window over ``on`` (over no column: the whole relation)."""
        if set(on) == set(rows):
            return F.col(side) > 0
        return F.max(F.col(side)).over(Window.partitionBy(*[F.col(quote(c)) for c in on])) > 0

    def _keep(self, sides: dict) -> None:
        """Set each named side's count to 1 where its condition holds, else 0; drop the rows of no side."""
        t = self.t
        for name, cond in sides.items():
            t = t.withColumn(f"{name}_", F.when(cond & (F.col(name) > 0), 1).otherwise(0).cast("long"))
        for name in sides:
            t = t.withColumn(name, F.col(f"{name}_")).drop(f"{name}_")
        self.t = t.where(_some_side())

    def _ric(self, z: list[str]) -> None:
        """RIC: drop the candidates agreeing with an existing tuple on Z_i (they derive only V_F); under
        MU2 (Algorithm 7) the insertion candidates are existing tuples for the deletions."""
        rows = self._vars()
        covered = self._agree("__de", z, rows)
        if self.r.multiple is MultipleUpdates.MU2:
            covered = covered | self._agree("__ic", z, rows)
        self._keep({"__dc": ~covered, "__ic": ~self._agree("__ie", z, rows)})

    def _rie(self, y: list[str]) -> None:
        """RIE: keep the existing tuples agreeing with a candidate of their kind on Y_i (not empty: over
        Y_i = ∅ see `_quit`)."""
        rows = self._vars()
        self._keep({"__de": self._agree("__dc", y, rows), "__ie": self._agree("__ic", y, rows)})

    def _quit(self) -> None:
        """§3 after Lemma 2: "It often occurs that V_C^i becomes the empty set, that is V_T is empty, which
        allows to quit the materialized view update without accessing R_k (i < k ≤ n)". A row carries
        both sides' counts, so the existing side must go too for the relation to be empty (Spark's
        adaptive execution then skips the joins above it): each kind's existing tuples are kept only
        while a candidate of that kind is left. Under RIC, whose V_T reads no V_E, and RIE over Y_i = ∅
        (no view column joined yet: tests/spark/test_strategies.py's ``bridge``), where this is
        RIE itself (σ_{∅ ∈ π_∅ V_C^i}: all of V_E^i while V_C^i is not empty, none once it is). "Is a
        candidate left" is one aggregate of the step's relation, broadcast to it (a window over no
        column would sort the whole relation in one task)."""
        left = F.broadcast(self.t.agg(*[F.max(F.col(c)).alias(f"{c}_left") for c in ("__ic", "__dc")]))
        self.t = self.t.crossJoin(left)
        self._keep({"__ie": F.coalesce(F.col("__ic_left"), F.lit(0)) > 0,
                    "__de": F.coalesce(F.col("__dc_left"), F.lit(0)) > 0})
        self.t = self.t.drop("__ic_left", "__dc_left")

    def _settle(self, keep: list[str]) -> DataFrame:
        """Each side as a set over ``keep`` (its tuples' counts summed: present when positive, count 1).
        The joined layers' counts are products of the tables' consolidated counts, never negative in sum,
        so a projection's sum is positive exactly when one of its tuples is present."""
        sums = [F.sum(F.col(c)).alias(c) for c in ALL_SIDES]
        t = self.t.groupBy(*[F.col(quote(c)) for c in keep]).agg(*sums)
        t = t.select(*map(quote, keep), *[F.when(F.col(c) > 0, 1).otherwise(0).cast("long").alias(c)
                                          for c in ALL_SIDES])
        return t.where(_some_side()).withColumn(C, F.lit(1).cast("long"))

    # -- one step ----------------------------------------------------------------------------------------

    def step(self, i: int) -> None:
        alg, r = self.r.algorithm, self.r
        if not any(self.active.values()):
            return
        reduce_c, reduce_e = alg.reduces_candidates, alg.reduces_existing
        shortcuts = alg.reduces_both  # Theorems 3 and 4 are stated for REDUCE
        atom = self.s.atoms[self.order[i]]
        theorem3 = shortcuts and key_in_view(r.program, atom, set(self.s.head_vars)) is not None
        notes: dict[str, list[str]] = {kind: [] for kind in SIDES}
        if i == 0:  # step 1: V_C^1 = S, V_E^1 = σ_{Y_1 ∈ π_{Y_1} S}(R_1 − S_D)
            self.joined = set(r._vars(self.s_i))
            y = sorted(self._y())
            parts = {"__ic": self.s_i, "__dc": self.s_d}
            hint = F.broadcast if self.small else (lambda df: df)
            for kind, changed in (("insertion", self.s_i), ("deletion", self.s_d)):
                if self.has_existing[kind] and not theorem3:
                    agreeing = restrict(self.own_old, hint(changed.select(*map(quote, y)).distinct()), y)
                    parts[SIDES[kind][1]] = anti_join(r._settle(agreeing), hint(self.s_d), null_safe=True)
            if self.view_existing:
                notes["insertion"].append("§5: the insertions' existing tuples derive V's tuples, V_T = π V_C^n − V")
            t = union_all([df.select("*", *[(F.col(C) if c == name else F.lit(0)).cast("long").alias(c)
                                             for c in ALL_SIDES]) for name, df in parts.items()])
        else:
            self.joined |= atom.variables()
            t = natural_join(F.broadcast(self.t) if self.broadcast else self.t, self.rel[self.order[i]])
            t = t.select(*[F.col(quote(c)) for c in t.columns if c not in ALL_SIDES],
                         *[(F.col(c) * F.col(C)).alias(c) for c in ALL_SIDES])
        self.t = r._select(t, self._newly_applicable() if r._plus() else [])
        # the tables' layers are read as they are (joins distribute over ⊎): each step settles its
        # relations into sets, under REDUCE+ projected on Z_i (§4: as early as possible)
        self.t = self._settle(sorted(self._z(i)) if r._plus() else sorted(self.joined))
        if i > 0 and reduce_c and any(self.has_existing.values()):
            self._ric(sorted(self._z(i)))
        elif i > 0 and reduce_c:
            # §7: "it may be better to skip the reduction by RIE or RIC" where it cannot pay — here it cannot
            # drop a tuple: no existing relation is left to compare with (Theorem 3 passed, or none built)
            for kind in SIDES:
                notes[kind].append(f"RIC skipped at step {i + 1}: no existing relation")
        last = i + 1 == len(self.order)
        if theorem3:
            # Theorem 3: X_V holds a key of R_i, so V_E^i = ∅ and no later existing relation is built
            self._keep({"__ie": F.lit(False), "__de": F.lit(False)})
            self.has_existing = {kind: False for kind in SIDES}
            for kind in SIDES:
                notes[kind].append(f"Theorem 3: the view holds a key of {atom.pred}, V_E^{i + 1} = ∅")
        elif i > 0 and any(self.has_existing.values()):
            y = sorted(self._y())
            if reduce_e and reduce_c and last:
                # §7: RIE cannot pay at the last step: V_T = σ π V_C^n reads no V_E^n (Figures 8 and 9
                # leave V_E^3 as joined)
                for kind in SIDES:
                    notes[kind].append(f"RIE skipped at step {i + 1}: V_T reads no V_E^{i + 1}")
            elif reduce_e and y:
                self._rie(y)  # (an existing tuple no candidate agrees with on Y_i goes: none, once V_C^i = ∅)
            elif reduce_c and not last:
                self._quit()
        if i == 0 and self.small and i + 1 < len(self.order):
            if not any(self.has_existing.values()):  # the change alone
                self.broadcast = True
            elif self._y():  # V_E^1: the tuples agreeing with the change on Y_1, how many is known once written
                self.t, size = r._put(f"{atom.pred}-1", self.t)
                self.broadcast = size <= BROADCAST_BYTES
        elif (i + 1) % CHECKPOINT_STEPS == 0 and i + 1 < len(self.order):
            self.t, _ = r._put(f"{atom.pred}-{i + 1}", self.t)
        steps = {}
        for kind, (c, e) in SIDES.items():
            if self.active[kind]:
                frames = {"candidate": self.side(c), **({"existing": self.side(e)} if self.has_existing[kind] else {})}
                steps[kind] = Step(i + 1, atom.pred, frames=frames)
                self.traces[kind].steps.append(steps[kind])
        if theorem3 and i == 0:
            # ... and t is the only tuple deriving view tuples with its X_1 ∩ X_V value: V_T is read off V
            self.from_view = self.side("__dc").select(*map(quote, sorted(self._y()))).distinct()
            notes["deletion"].append("the targets are read from V")
        later = self._remaining_conditions() if r._plus() else self.s.conditions
        if self.from_view is None and shortcuts and r.key_vars is not None and r.key_vars <= self._y() \
                and not later and i + 1 < len(self.order):
            # Theorem 4: Y_i holds the view's key and no selection is left: the candidates whose Y_i
            # value no existing tuple has derive targets only, the others failures only
            y, rows = sorted(self._y()), self._vars()
            self.t = self.t.withColumn("__de_y", self._agree("__de", y, rows)) \
                .withColumn("__ie_y", self._agree("__ie", y, rows))
            self.from_view = self.t.where((F.col("__dc") > 0) & ~F.col("__de_y")).select(*map(quote, y)).distinct()
            notes["deletion"].append(f"Theorem 4: Y_{i + 1} holds the view's key, stop")
            # an insertion's targets are not in V yet (§5): join the rest, no existing relation
            self._keep({"__ic": ~F.col("__ie_y"), "__ie": F.lit(False)})
            self.t = self.t.drop("__de_y", "__ie_y")
            self.has_existing["insertion"] = False
            notes["insertion"].append(f"Theorem 4: Y_{i + 1} holds the view's key, no further V_E")
        for kind, step in steps.items():
            step.note = "; ".join(notes[kind])
        if self.from_view is not None and self.active["deletion"]:
            self.active["deletion"] = False
            self.traces["deletion"].shortcut = steps["deletion"].note
            self._keep({"__dc": F.lit(False), "__de": F.lit(False)})

    def target(self, kind: str) -> DataFrame:
        """Step 3: the kind's V_T (a plan)."""
        r = self.r
        c, e = SIDES[kind]
        if kind == "deletion" and self.from_view is not None:
            y = sorted(self.from_view.columns)
            keys = self.from_view.select(*[F.col(quote(v)).alias(r.column_of[v]) for v in y])
            t = r.current_view(keys, [r.column_of[v] for v in y], self.small)
        else:
            cand = self.side(c) if r._plus() else r._select(self.side(c), list(self.s.conditions))
            t = r._as_view(cand)
            if not r.algorithm.reduces_candidates and self.has_existing[kind]:
                existing = r._as_view(r._select(self.side(e), list(self.s.conditions)))
                t = anti_join(t, existing.drop(C), null_safe=True)
        self.traces[kind].target = t
        return t
