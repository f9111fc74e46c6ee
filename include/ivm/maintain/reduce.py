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
change is then checked against V). Each V_C^i / V_E^i is written to the run's scratch space, so its
size is known: when V_C^i is empty the update stops before reading R_{i+1} (§3, "quit the materialized
view update"). Theorem 3 (the view holds a key of R_i: V_E^i = ∅, later existing relations are not
built; for a deletion at i = 1 the targets are read off V itself) and Theorem 4 (Y_i holds the view's
declared key: stop at step i) shorten the work.

Changes to several tables (or to a table joined with itself) are applied one reference at a time, as
in 000's delta rules: references before the updated one at their new state, after it at their old.
Tuple comparisons on Y_i and Z_i are null-safe (a view tuple with a NULL is one tuple); joins are SQL
joins (NULL never matches).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ivm.config import COUNT_COLUMN
from ivm.ir import Atom, Condition, Const, Literal, Program, Rule, Var
from ivm.maintain import recompute
from ivm.maintain.counting import presence_change
from ivm.maintain.fixpoint import as_set
from ivm.maintain.recompute import Evaluator, natural_join
from ivm.storage import Scratch
from ivm.zset import anti_join, change_sizes, consolidate, negate, quote, restrict, union_all

log = logging.getLogger(__name__)
C = COUNT_COLUMN
ALGORITHMS = ("NAIVE", "RIE", "RIC", "REDUCE", "REDUCE+")
MULTIPLE = ("MU1", "MU2")


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
        if isinstance(item, Literal) and not item.negated and program.predicates[item.atom.pred].kind == "base":
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


def key_in_view(program: Program, atom: Atom, head_vars: set[str]) -> list[str] | None:
    """Theorem 3's premise: a key of the atom's table whose columns are all in X_V (or constants)."""
    pred = program.predicates[atom.pred]
    for key in pred.keys:
        args = [atom.args[pred.columns.index(c)] for c in key]
        if all(isinstance(a, Const) or (isinstance(a, Var) and a.name in head_vars) for a in args):
            return key
    return None


def join_order(s: Shape, first: int) -> list[int]:
    """R_1 = the updated reference, then each next reference sharing a variable with those joined (in
    body order among them), so every step is a join, not a product, where the view allows."""
    return recompute.join_order(tuple(Literal(a) for a in s.atoms), first)


@dataclass
class Step:
    """Sizes of one join step's relations (for the run record, explain and the paper's examples)."""

    i: int
    table: str
    candidate: int | None = None
    existing: int | None = None
    note: str = ""
    #: V_C^i and V_E^i as written to the run's scratch space (read back)
    frames: dict[str, DataFrame] = field(default_factory=dict, repr=False)


@dataclass
class UpdateTrace:
    """What one reference's update did: per kind (insertion / deletion), the steps and the target size."""

    table: str
    kind: str
    steps: list[Step] = field(default_factory=list)
    target: int = 0
    shortcut: str = ""


class Reducer:
    """Computes the view change of one run with one of the reducing algorithms.

    ``relation(table, state)`` gives a table as the rules use it at "old" or "new" (its layers; each
    step settles what it joined into a set);
    ``changes(pred)`` its set change (+1 inserted, -1 deleted tuples) or None; ``view_old`` the view's
    stored tuples before the run."""

    def __init__(self, program: Program, s: Shape, algorithm: str, multiple: str, view_key: list[str] | None,
                 relation: Callable[[str, str], DataFrame], changes: Callable[[str], DataFrame | None],
                 view_old: DataFrame, scratch: Scratch, ev: Evaluator):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown reducing algorithm {algorithm!r}")
        self.program, self.s, self.algorithm, self.multiple = program, s, algorithm, multiple
        self.relation, self.changes, self.view_old = relation, changes, view_old
        self.scratch, self.ev = scratch, ev
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

    def _put(self, name: str, frames: dict[str, DataFrame]) -> dict[str, tuple[DataFrame, int]]:
        """Write relations of the same columns in one Spark job (a side column, partitioned by it) to the
        run's scratch space; each read back with its row count (from the Parquet footers)."""
        if not frames:
            return {}
        self._n += 1
        sides = list(frames)
        schema = frames[sides[0]].schema
        tagged = [df.select(*[F.col(quote(c)) for c in schema.names]).withColumn("__side", F.lit(side))
                  for side, df in frames.items()]
        union = union_all(tagged)
        # (under the view's name: two REDUCE views of one run name their steps alike, emp-insert-1; under
        # dynamic partition overwrite the second's write kept the first's ``existing`` side, which the
        # second then read as its own: found by a change stream)
        path = self.scratch.warehouse.path("staging", self.scratch.run_id, f"reduce/{self.s.view}/{self._n:03d}-{name}")
        union.write.mode("overwrite").partitionBy("__side").parquet(path)
        out = {}
        for side in sides:
            part = f"{path}/__side={side}"  # an empty side writes no folder
            rows = self.scratch.warehouse.parquet_stats(part)[0] if self.scratch.warehouse.exists(part) else 0
            read = self.scratch.spark.read.schema(schema).parquet(part) if rows else \
                self.scratch.spark.createDataFrame([], schema)
            out[side] = (read, rows or 0)
        return out

    def _vars(self, df: DataFrame) -> list[str]:
        return [c for c in df.columns if c != C]

    def _plus(self) -> bool:
        return self.algorithm == "REDUCE+"

    def _select(self, df: DataFrame, conditions: list[Condition]) -> DataFrame:
        for c in conditions:
            df = df.where(F.expr(str(c)))
        return df

    def _settle(self, df: DataFrame) -> DataFrame:
        return as_set(df, self._vars(df))

    def _project(self, df: DataFrame, keep: set[str]) -> DataFrame:
        cols = [c for c in self._vars(df) if c in keep]
        return df.select(*[F.col(quote(c)) for c in cols], F.lit(1).cast("long").alias(C)).distinct()

    def _as_view(self, df: DataFrame) -> DataFrame:
        """π_{X_V}: the head's columns (constants included), one tuple each, count 1."""
        view = self.program.predicates[self.s.view]
        cols = [F.col(quote(a.name)).alias(c) if isinstance(a, Var) else F.lit(a.value).alias(c)
                for a, c in zip(self.s.rule.head.args, view.columns, strict=True)]
        return df.select(*cols).distinct().withColumn(C, F.lit(1).cast("long"))

    def current_view(self, keys: DataFrame, columns: list[str]) -> DataFrame:
        """V as the references applied so far left it, restricted to the tuples whose ``columns`` occur
        in ``keys`` (the stored layers and this run's earlier changes, consolidated for those keys)."""
        return self._settle(restrict(union_all([self.view_old, *self._deltas]), keys, columns))

    # -- one run -----------------------------------------------------------------------------------------

    def run(self) -> DataFrame | None:
        """The view's change (+1 entering, -1 leaving tuples) over all changed references; None if none."""
        changed = [k for k, a in enumerate(self.s.atoms) if self.changes(a.pred) is not None]
        for k in changed:
            delta = self.update(k)
            if delta is not None:
                self._deltas.append(delta)
        return consolidate(union_all(self._deltas)) if self._deltas else None

    def update(self, k: int) -> DataFrame | None:
        """§6: the insertions S_I and deletions S_D of reference k as one multiple update."""
        atom = self.s.atoms[k]
        change = self.changes(atom.pred)
        state = lambda j: "new" if j < k else "old"  # noqa: E731  the references before k see its new state
        rel = {j: self.ev.atom(a, self.relation(a.pred, state(j))) for j, a in enumerate(self.s.atoms) if j != k}
        own_old = self.ev.atom(atom, self.relation(atom.pred, "old"))
        changed = self.ev.atom(atom, change)
        n_inserted, n_deleted = change_sizes(changed)  # |S_I|, |S_D|
        s_i = changed.where(F.col(C) > 0)
        s_d = negate(changed.where(F.col(C) < 0))
        # R_1 − S_D, the existing side of both (Definition 5), restricted per chain before it is settled
        unchanged = (own_old, s_d)
        order = join_order(self.s, k)
        ins = _Chain(self, atom.pred, "insertion", order, rel, s_i, unchanged, n_inserted)
        dele = _Chain(self, atom.pred, "deletion", order, rel, s_d, unchanged, n_deleted)
        for i in range(len(order)):
            ins.step(i)
            # MU2 (Algorithm 7): the insertion candidates are existing tuples for the deletions
            mu2 = self.multiple == "MU2" and i > 0 and len(ins.trace.steps) == i + 1
            dele.step(i, extra_existing=ins.candidate if mu2 else None)
        t_i, t_d = ins.target(), dele.target()
        self.traces += [ins.trace, dele.trace]
        if t_i is None and t_d is None:
            return None
        delta = union_all([x for x in (t_i, negate(t_d) if t_d is not None else None)
                           if x is not None])
        if self.multiple == "MU2":  # Theorem 8: (V − V_TD') ∪ V_TI, so V_TI may hold tuples still in V
            cols = list(self.program.predicates[self.s.view].columns)
            keys = delta.select(*[F.col(quote(c)) for c in cols]).distinct()
            delta = presence_change(self.current_view(keys, cols), consolidate(delta), cols)
        return consolidate(delta)  # a plan over the written targets; the run writes the total once


class _Chain:
    """One kind of change (insertion or deletion) of one reference, step by step (Algorithms 1–5)."""

    def __init__(self, r: Reducer, table: str, kind: str, order: list[int], rel: dict[int, DataFrame],
                 changed: DataFrame, unchanged: tuple[DataFrame, DataFrame], size: int):
        self.r, self.kind, self.order, self.rel = r, kind, order, rel
        self.changed, self.unchanged, self.size = changed, unchanged, size
        self.s = r.s
        self.trace = UpdateTrace(table, kind)
        self.candidate: DataFrame | None = None
        self.existing: DataFrame | None = None
        self.joined: set[str] = set()
        self.applied: set[int] = set()  # conditions applied (REDUCE+)
        self.done = False               # the candidates ran out, or a theorem settled the target
        self.result: DataFrame | None = None
        self.no_existing = False        # Theorem 3: V_E^i = ∅ from here on
        self.from_view: DataFrame | None = None  # Theorem 3 (i = 1) / Theorem 4 on a deletion: keys of V_T

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

    # -- one step ----------------------------------------------------------------------------------------

    def step(self, i: int, extra_existing: DataFrame | None = None) -> None:
        if self.done:
            return
        if i == 0 and self.size == 0:  # nothing of this kind changed: no relation is built
            self.trace.steps.append(Step(1, self.s.atoms[self.order[0]].pred, 0, note="no changes of this kind"))
            self.done = True
            return
        alg, r = self.r.algorithm, self.r
        reduce_c = alg in ("RIC", "REDUCE", "REDUCE+")
        reduce_e = alg in ("RIE", "REDUCE", "REDUCE+")
        shortcuts = alg in ("REDUCE", "REDUCE+")  # Theorems 3 and 4 are stated for REDUCE
        atom = self.s.atoms[self.order[i]]
        theorem3 = shortcuts and key_in_view(r.program, atom, set(self.s.head_vars)) is not None
        notes = []
        if i == 0:  # step 1: V_C^1 = S, V_E^1 = σ_{Y_1 ∈ π_{Y_1} S}(R_1 − S_D)
            self.joined = set(r._vars(self.changed))
            y = sorted(self._y())
            cand = self.changed
            own_old, s_d = self.unchanged
            existing = None if theorem3 else anti_join(
                r._settle(restrict(own_old, self.changed.select(*map(quote, y)).distinct(), y)), s_d, null_safe=True)
        else:
            self.joined |= atom.variables()
            rel = self.rel[self.order[i]]
            cand = natural_join(self.candidate, rel, False)
            existing = natural_join(self.existing, rel, False) if self.existing is not None else None
        conds = self._newly_applicable() if r._plus() else []
        # the tables' layers are read as they are (joins distribute over ⊎): each step settles its
        # relation into a set (consolidated, present tuples, count 1)
        cand = r._settle(r._select(cand, conds))
        existing = r._settle(r._select(existing, conds)) if existing is not None else None
        if r._plus():  # §4: projection on Z_i as early as possible
            z = self._z(i)
            cand = r._project(cand, z)
            existing = r._project(existing, z) if existing is not None else None
        if i > 0 and reduce_c and (existing is not None or extra_existing is not None):
            # RIC: drop the candidates agreeing with an existing tuple on Z_i (they derive only V_F)
            z = sorted(self._z(i))
            other = union_all([e.select(*map(quote, z)) for e in (existing, extra_existing) if e is not None])
            cand = anti_join(cand, other, null_safe=True) if z else cand.join(other.limit(1), how="left_anti")
        if theorem3:
            # Theorem 3: X_V holds a key of R_i, so V_E^i = ∅ and no later existing relation is built
            existing = None
            notes.append(f"Theorem 3: the view holds a key of {atom.pred}, V_E^{i + 1} = ∅")
        elif existing is not None and i > 0 and reduce_e:
            # RIE: keep the existing tuples agreeing with a candidate on Y_i
            y = sorted(self._y())
            existing = restrict(existing, cand.select(*map(quote, y)).distinct(), y)
        name = f"{atom.pred}-{self.kind}-{i + 1}"
        if i == 0:  # V_C^1 is the change itself, already written: its size is known
            self.candidate, c_rows = cand, self.size
            written = r._put(name, {"existing": existing} if existing is not None else {})
        else:  # V_C^i and V_E^i in one write (one Spark job), read back apart
            written = r._put(name, {"candidate": cand, **({"existing": existing} if existing is not None else {})})
            self.candidate, c_rows = written["candidate"]
        step = Step(i + 1, atom.pred, c_rows, frames={"candidate": self.candidate})
        self.trace.steps.append(step)
        self.existing = None
        if "existing" in written:
            self.existing, step.existing = written["existing"]
            step.frames["existing"] = self.existing
        if c_rows == 0:  # V_C^i = ∅: V_T = ∅ without reading R_{i+1} ... R_n
            step.note = "no candidates left: stop"
            self.done = True
            return
        if theorem3 and i == 0 and self.kind == "deletion":
            # ... and t is the only tuple deriving view tuples with its X_1 ∩ X_V value: V_T is read off V
            self.from_view = self.candidate.select(*map(quote, sorted(self._y()))).distinct()
            notes.append("the targets are read from V")
        later = self._remaining_conditions() if r._plus() else self.s.conditions
        if self.from_view is None and shortcuts and r.key_vars is not None and r.key_vars <= self._y() \
                and not later and i + 1 < len(self.order):
            # Theorem 4: Y_i holds the view's key and no selection is left: the candidates whose Y_i
            # value no existing tuple has derive targets only, the others failures only
            y = sorted(self._y())
            keys = self.candidate.select(*map(quote, y)).distinct()
            if self.existing is not None:
                keys = anti_join(keys, self.existing.select(*map(quote, y)), null_safe=True)
            if self.kind == "deletion":
                self.from_view = keys
                notes.append(f"Theorem 4: Y_{i + 1} holds the view's key, stop")
            else:  # an insertion's targets are not in V yet (§5): join the rest, no existing relation
                self.candidate = restrict(self.candidate, keys, y)
                self.existing = None
                notes.append(f"Theorem 4: Y_{i + 1} holds the view's key, no further V_E")
        step.note = "; ".join(notes)
        if self.from_view is not None:
            self.done = True
            self.trace.shortcut = step.note

    def target(self) -> DataFrame | None:
        """Step 3: V_T, written; None when empty."""
        r = self.r
        if self.from_view is not None:
            y = sorted(self.from_view.columns)
            keys = self.from_view.select(*[F.col(quote(v)).alias(r.column_of[v]) for v in y])
            t = r.current_view(keys, [r.column_of[v] for v in y])
        elif self.done or self.candidate is None:
            return None
        else:
            cand = self.candidate if r._plus() else r._select(self.candidate, list(self.s.conditions))
            t = r._as_view(cand)
            if r.algorithm in ("NAIVE", "RIE") and self.existing is not None:
                e = r._as_view(r._select(self.existing, list(self.s.conditions)))
                t = anti_join(t, e.drop(C), null_safe=True)
        written, rows = r._put(f"{self.trace.table}-{self.kind}-target", {"target": t})["target"]
        self.trace.target = rows
        return written if rows else None
