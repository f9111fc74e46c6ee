"""What the views store and the types of every relation they derive, worked out once per run context from
the compiled program: each view's stored relations (as its strategy stores it), the GROUP BY states of
000 Algorithm 6.1, and the Spark schema of every view, auxiliary predicate and stored state, from the
views' plans over empty tables (Spark analyses them; no job runs). `ivm.context.RunContext` is given this
service (`ivm.project.Project` builds both), so the context every stage shares imports no maintenance
module."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

from ivm.config import COUNT_COLUMN
from ivm.maintain import counting, strategy
from ivm.maintain.groupby import GroupByState
from ivm.maintain.recompute import Evaluator

if TYPE_CHECKING:
    from ivm.context import RunContext


class StoredRelations:
    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    @cached_property
    def plans_over_empty_tables(self) -> Evaluator:
        """Every view's plan over empty tables, built once: Spark analyses it for types and schemas."""
        ctx = self.ctx
        program, strata = ctx.program
        empty = {t: ctx.spark.createDataFrame([], ctx.schema(t).add(COUNT_COLUMN, "long")) for t in ctx.config.tables}
        return Evaluator(program, strata, empty, plans_only=True)

    @cached_property
    def groupby_states(self) -> dict[str, GroupByState]:
        """The state relation of every GROUPBY subgoal (000 Algorithm 6.1), by name."""
        program, _ = self.ctx.program
        return counting.groupby_states(program, self.plans_over_empty_tables)

    @cached_property
    def _stored_schemas(self) -> dict[str, StructType]:
        """Columns and types of the auxiliary relations views store: GROUPBY states and distinct-value
        counts (from the plans over empty tables; no Spark job runs)."""
        empty = self.plans_over_empty_tables
        out: dict[str, StructType] = {}
        for name, st in self.groupby_states.items():
            rows = empty.atom(st.subgoal.atom)
            out[name] = st.schema(rows)
            for var in st.distinct_args():
                out[st.distinct_name(var)] = StructType([f for f in st.distinct_rows(rows, var).schema.fields
                                                         if f.name != COUNT_COLUMN])
        return out

    def stored_relations(self, view: str) -> list[str]:
        """Everything maintaining ``view`` stores: the view, its auxiliary predicates, GROUPBY states."""
        program, strata = self.ctx.program
        cfg = self.ctx.config.views.get(view)
        if cfg is not None and cfg.strategy is not None and strategy.lookup(cfg.strategy).count_free:
            return [view]  # key-based and reducing maintenance store the view alone, without counts
        return counting.stored_relations(program, strata, view)

    def schema(self, relation: str) -> StructType | None:
        """A view's or auxiliary predicate's columns and types (its plan over empty tables), or a stored
        state's; None: no such relation."""
        if relation in self.ctx.config.views or relation in self.ctx.program[0].predicates:
            plan = self.plans_over_empty_tables.relation(relation)
            return StructType([f for f in plan.schema.fields if f.name != COUNT_COLUMN])
        return self._stored_schemas.get(relation)
