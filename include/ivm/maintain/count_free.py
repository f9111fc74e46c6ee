"""A run's maintenance of a view stored without counts (each tuple once): key-based (003) or one of
the reducing algorithms (004), over the same run states counting uses (ivm.maintain.counting).

The tables' net deltas become set changes (+1 a tuple that appeared, -1 one that disappeared; a keyed
table's net delta is one already); the view's change is written as its delta layer, ±1 per tuple,
and is what the views above it see."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ivm.config import COUNT_COLUMN, ViewConfig
from ivm.ir import Program
from ivm.maintain import reduce
from ivm.maintain.counting import Counting, presence_change
from ivm.maintain.fixpoint import as_set
from ivm.maintain.keyed import KeyBased
from ivm.maintain.recompute import Evaluator
from ivm.maintain.strategy import KEYED, REDUCE, Strategy
from ivm.stratify import Strata
from ivm.vocabulary import Kind
from ivm.zset import change_sizes, consolidate

log = logging.getLogger(__name__)
C = COUNT_COLUMN


@dataclass
class Outcome:
    delta: DataFrame | None
    detail: dict[str, int] = field(default_factory=dict)
    #: what the algorithm did, in words (rematerialization and its reason, shortcuts taken)
    notes: list[str] = field(default_factory=list)
    traces: list[reduce.UpdateTrace] = field(default_factory=list)


class CountFree:
    def __init__(self, program: Program, strata: Strata, counting: Counting):
        self.program, self.strata, self.counting = program, strata, counting
        self.states = counting.states
        self._set_changes: dict[str, DataFrame | None] = {}

    def set_change(self, table: str) -> DataFrame | None:
        """The table's change as a set (a bag table's count changes that keep a tuple present drop out)."""
        if table not in self._set_changes:
            delta = self.counting.used_delta.get(table)
            p = self.program.predicates[table]
            if delta is not None and p.semantics != "set":
                path, rows, _ = self.states.scratch.put(
                    f"{table}__set_change", presence_change(self.states.old(table), delta, list(p.columns)))
                delta = self.states.read(table, [path]) if rows else None
            self._set_changes[table] = delta
        return self._set_changes[table]

    def relation(self, pred: str, state: str) -> DataFrame:
        """A table at its old or new state as the rules use it (a keyed table consolidated)."""
        return self.counting.used(pred, state)

    def evaluator(self, state: str) -> Evaluator:
        tables = [p for p, d in self.program.predicates.items() if d.kind == Kind.BASE]
        return Evaluator(self.program, self.strata, {t: self.relation(t, state) for t in tables},
                         scratch=self.states.scratch)

    def maintain(self, view: str, strategy: Strategy, config: ViewConfig, tables: list[str]) -> Outcome:
        """The view's change, by ``strategy`` (key-based or reducing), from its tables' set changes."""
        changed = [t for t in tables if self.set_change(t) is not None]
        if not changed:
            return Outcome(None, notes=["the tables' changes leave their sets unchanged"])
        run = {KEYED: self._keyed, REDUCE: self._reduce}[strategy]
        return run(view, config, changed, self.states.old(view))

    def _reduce(self, view: str, config: ViewConfig, changed: list[str], old_view: DataFrame) -> Outcome:
        """004's reducing algorithms (ivm.maintain.reduce), over the tables' layers as they are: each step
        settles what it joined, so no table is consolidated first (a shuffle of all of it)."""
        s = reduce.shape(self.program, view)
        assert not isinstance(s, str), s
        r = reduce.Reducer(self.program, s, config.reduce.algorithm, config.reduce.multiple_updates, config.key,
                           self.counting.joined, lambda t: self.set_change(t) if t in changed else None,
                           old_view, self.states.scratch, self.evaluator("old"),
                           self.states.broadcastable)
        delta = r.run()
        # (the relations' sizes are not counted: a job each; the run's rows written are its delta's)
        detail = {"join steps": sum(len(t.steps) for t in r.traces), "relations written": r.writes}
        notes = [f"{t.table} {t.kind}: {t.shortcut}" for t in r.traces if t.shortcut]
        return Outcome(delta, detail, notes, r.traces)

    def _keyed(self, view: str, config: ViewConfig, changed: list[str], old_view: DataFrame) -> Outcome:
        """003's derived rules (ivm.maintain.keyed), or its rematerialization rule (§5.4)."""
        kb = KeyBased(self.program, view, lambda t: self.set_change(t) if t in changed else None, old_view,
                      self.evaluator("old"), self.evaluator("new"))
        present = {t: self._operations(t) for t in changed}
        unsafe = kb.unsafe(present)
        if unsafe:
            # 003 §5.4's rematerialization rule: the view recomputed; its change against V is the delta
            log.info("%s: rematerializing (003 §5.4): %s", view, "; ".join(unsafe))
            columns = list(self.program.predicates[view].columns)
            new = as_set(self.evaluator("new").relation(view), columns)
            old = as_set(old_view, columns).withColumn(C, F.lit(-1).cast("long"))
            return Outcome(consolidate(new.unionByName(old)), {"rematerialized": 1},
                           [f"rematerialized: {'; '.join(unsafe)}"])
        return Outcome(kb.run(changed), {"rematerialized": 0})

    def _operations(self, table: str) -> set[str]:
        """Which operations a table's set change holds (one small job)."""
        inserted, deleted = change_sizes(self.set_change(table))
        return {op for op, n in (("insert", inserted), ("delete", deleted)) if n}
