"""The run's relations as the strategies that store a view without counts (each tuple once) read them:
key-based (003) and the reducing algorithms (004), whose code is their `ivm.maintain.strategy` entries'.
They read the same run states counting uses (ivm.maintain.counting).

The tables' net deltas become set changes (+1 a tuple that appeared, -1 one that disappeared; a keyed
table's net delta is one already); the view's change is written as its delta layer, ±1 per tuple,
and is what the views above it see."""

from __future__ import annotations

from pyspark.sql import DataFrame

from ivm.ir import Program
from ivm.maintain.counting import Counting, presence_change
from ivm.maintain.recompute import Evaluator
from ivm.stratify import Strata
from ivm.vocabulary import Kind


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

    def write(self, view: str, delta: DataFrame | None) -> None:
        """The view's change as its delta layer; a set change already, so the views above use it as it is."""
        written = self.states.put_delta(view, delta) if delta is not None else None
        self.counting.note_delta(view, written, set_change=True)
