"""Views over nested data (002): the extraction rewrite, element-level deltas, owner indexes.

002 maintains a view over nested relations with the counting algorithm once every nested relation a
rule reaches through a variable is replaced by the *extraction function* e_S(X, A1..Ak) = u_S(X) ⋈
X(A1..Ak) (§2.2, expression (1)); its delta Δe_S holds only the elements that changed, so "the
incremental work ... is proportional to the changes in the contents of the nested relations, and not
proportional to the size of the nested relations themselves" (§2.2, after Example 2.2). Two
representations:

* **By value** (an ``array<...>`` column, ``LATERAL VIEW explode/inline``): a rule's parent literal
  and its unnest are replaced by one literal over an extraction predicate (kind ``extraction``), defined
  by ``e(kept parent columns, elements) :- parent(...), explode(array) AS (elements)``. Like 002's
  e_S it is not stored, "only the log of the view, not the view's extension" (§2.2): its old and new
  states are the parent's, extracted; Δe is the parent's net delta, extracted, projected onto e's
  columns and consolidated, which is the multiset difference of each updated row's before- and
  after-array: an element that stayed cancels before anything joins it. Parent columns the rule uses
  only inside the array expression are dropped, so an update elsewhere in the row cancels too. Arrays
  of arrays nest the rewrite (e over e, §2.2: "we can recursively express Δe_S in terms of S and e_T").
* **By reference** (``tables.T.nested: {col: {collection: S, id: c}}``): S is the one table of all
  collections of that type, its rows tagged with their collection's id; S's change log is the nested
  descriptor's log (§4.1), one per collection type, and S itself (u_S ⋈ X) is e_S. In Datalog a
  variable in predicate position, HiLog style as in Example 2.1 (``emp(X, Y), Y(Z, A)``), stands for
  the collection Y refers to; in SQL the join ``S.c = T.col`` is the same thing. A rule that joins a
  nesting table T to its collection S reads T through the view's **owner index** (§4.2): a copy of
  T's rows stored clustered by the collection id, a relation of the view that every refresh maintains
  from T's net delta (inserted owners add entries, deleted ones remove them, an update is both), and
  that the first materialization builds from all of T (footnote 5: every nesting tuple, whether or not
  it contributes). A delta rule whose Δ subgoal is a collection's change probes the index with the
  changed collection ids (§4.3 step 2-1) and, level by level, probes the next index with the owners it
  found, so a change deep inside a collection reaches the owning rows without scanning the nesting
  tables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ivm.ir import (
    BodyItem,
    Literal,
    Var,
)
from ivm.lang.nested import INDEX, nested_column
from ivm.maintain.delta_rules import DELTA, DeltaRule
from ivm.zset import consolidate, one_partition, quote

if TYPE_CHECKING:
    from ivm.maintain.states import DeltaContext

log = logging.getLogger(__name__)
#: at most this many collection ids probe an owner index as a filter (002 §4.3)
PROBE_LIMIT = 10_000


# -- maintenance: Δe (002 §2.2) and the owner-index probe (§4.3), for the counting algorithm ----------------


@dataclass(frozen=True)
class Extracted:
    """Δe_S of one run (`extraction_delta`): its rows as the rules above read them (None: no element
    changed), how many elements changed and their bytes."""

    rows: DataFrame | None
    elements: int
    bytes: int


def extraction_delta(c: DeltaContext, pred: str) -> Extracted | None:
    """002 §2.2's Δe_S: the parent's net delta, extracted and consolidated on e's columns, so each
    updated row contributes the multiset difference of its before- and after-arrays (an element that
    stayed cancels here, before any join). Kept in the run's scratch space, like e itself never
    stored (only "the log of the view" is). None: the parent did not change."""
    [rule] = c.program.rules_for(pred)
    parent = rule.body[0].atom.pred
    if not c.changed(parent):
        return None
    rows = c.ev.rule(rule, lambda j, item: c.ev.atom(item.atom, c.used(parent, DELTA)))
    delta = consolidate(rows, c.program.predicates[pred].columns)
    path, n, size = c.states.scratch.put(f"{pred}__delta", delta)
    log.info("%s: Δ from %s's delta: %d changed elements", pred, parent, n)
    if not n:
        return Extracted(None, 0, size)
    rows = c.states.scratch.read([path], delta.schema)
    return Extracted(one_partition(rows) if c.states.small else rows, n, size)


def probe_indexes(c: DeltaContext, d: DeltaRule, i: int,
                  subgoal: Callable[[int, BodyItem, str], DataFrame | None]) -> tuple[dict[int, DataFrame], int]:
    """002 §4.3 step 2-1: the owner indexes a delta rule reaches from its Δ
    subgoal, each restricted to the collection ids bound so far: first the ids of the changed
    collections, then, a level up, the ids of the owners found. An index's base layer is sorted by
    the id, so the Parquet reader skips the row groups no probed id falls in. The ids of one level
    are collected on the driver (one small job; at most PROBE_LIMIT of them, beyond that the index
    is joined whole). Returns the probed indexes by body position and the ids that probed them."""
    body = d.rule.body
    todo = {j: x for j, x in enumerate(body) if j != i and isinstance(x, Literal) and not x.negated
            and c.program.predicates[x.atom.pred].role == INDEX}
    if not todo or not isinstance(body[i], Literal) or body[i].negated:
        return {}, 0
    start = subgoal(i, body[i], DELTA)
    bound = {v: start for v in body[i].atom.variables()}
    probed: dict[int, DataFrame] = {}
    ids_probed = 0
    while todo:
        ready = {}
        for j, lit in todo.items():
            column = nested_column(c.program, lit.atom.pred)
            arg = lit.atom.args[c.program.predicates[lit.atom.pred].columns.index(column)]
            if isinstance(arg, Var) and arg.name in bound:
                ready[j] = (lit, arg.name)
        if not ready:
            break
        for j, (lit, var) in ready.items():
            del todo[j]
            ids = [row[0] for row in bound[var].select(F.col(quote(var))).where(F.col(quote(var)).isNotNull())
                   .distinct().limit(PROBE_LIMIT + 1).collect()]
            rows = c.ev.atom(lit.atom, c.joined(lit.atom.pred, d.states[j]))
            if len(ids) <= PROBE_LIMIT:
                rows = rows.where(F.col(quote(var)).isin(ids))
            ids_probed += len(ids)
            log.info("%s: probed %s with %d collection ids", d.rule.head.pred, lit.atom.pred, len(ids))
            probed[j] = rows
            bound |= {v: rows for v in lit.atom.variables() if v not in bound}
    return probed, ids_probed
