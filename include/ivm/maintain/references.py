"""Keyed tables and declared foreign keys in the delta rules: subgoals taken from the run's deltas
instead of read from storage (the benchmark issue's "declared foreign keys let the delta rules drop or
shrink terms that referential integrity makes empty or computable from the deltas alone").

A delta rule of 000 Definition 4.1 joins its Δ subgoal with the other subgoals at their old or new
states, but only at the values the Δ subgoal binds. Where a subgoal's state at those values is known
from the run's net deltas, it is taken from them, and storage is read only for the values left over:

* **Lookup of a keyed table** (Y joined on its whole primary key, the key's values bound by the Δ
  subgoal ΔS, Y changed in this run): Y holds one tuple per key and its net delta replaces it, so for
  a key k in ΔY, Y|k is ΔY's −1 tuple (none for an inserted key) and Yᵛ|k its +1 tuple (none for a
  deleted key). Y is read only at the keys ΔS binds outside ΔY (collected on the driver: one small
  job, none in a small run, whose delta layers the driver reads itself; nothing is read when every
  changed S row belongs to a changed Y row, as with an order inserted or deleted with its lineitems).
* **Foreign key** (``tables.S.references: {fk: R.key}``, R keyed by that column, S's fk bound to the
  key by ΔR): ΔR's keys are *deleted* (their counts sum to −1: in R, not in Rᵛ), *inserted* (+1) or
  *updated* (0: in both). Referential integrity holds at both states, so for a deleted key k no Sᵛ row
  references k: S|k = S|k − Sᵛ|k = −ΔS|k; for an inserted key k no S row did: S|k = ∅ and
  Sᵛ|k = ΔS|k. Only the S rows of updated keys are read (restricted to those keys; the base layers are
  sorted by key). "Deleting an order deletes its lineitems in the same commit, so lineitem_old ⋈
  Δorders needs no scan of lineitem."

``references:`` is a promise, as declared foreign keys are in a warehouse (not enforced): a refresh
reading a snapshot where it does not hold (an order deleted, its lineitems not yet) maintains the
views as if it held; validation's sampled recomputation (ivm.validate) reports the difference.
Rules with null-safe joins (set operators) are left alone (a NULL key would match there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ivm.config import COUNT_COLUMN
from ivm.ir import Literal, Program, Var
from ivm.maintain.delta_rules import DELTA, OLD, DeltaRule
from ivm.vocabulary import Kind, ShortcutKind
from ivm.zset import VALUES_ON_DRIVER, at_values, negate, quote, restrict, skipping_filter, union_all

if TYPE_CHECKING:
    from ivm.maintain.states import DeltaContext

log = logging.getLogger(__name__)
C = COUNT_COLUMN


def primary_key(program: Program, table: str) -> list[str]:
    """A base table's primary key (its layers hold one tuple per key); [] for a bag."""
    p = program.predicates[table]
    return list(p.keys[0]) if p.kind == Kind.BASE and p.semantics == "set" and p.keys else []


@dataclass(frozen=True)
class Shortcut:
    """One subgoal of a delta rule taken from the deltas (for the log and ``ivm explain``)."""

    kind: ShortcutKind
    table: str  # the subgoal's table (Y or S)
    via: str    # the Δ subgoal's table (ΔS or ΔR)
    #: (the subgoal's column, the Δ subgoal's column bound to the same variable)
    pairs: tuple[tuple[str, str], ...]

    @property
    def columns(self) -> list[str]:
        return [a for a, _ in self.pairs]

    def __str__(self) -> str:
        cols = ", ".join(self.columns)
        if self.kind is ShortcutKind.LOOKUP:
            return (f"{self.table} at the keys Δ{self.via} binds ({cols}): from Δ{self.table} where it holds "
                    f"the key, read for the others only")
        return (f"{self.table} at the keys of Δ{self.via} ({self.table}.{cols} references {self.via}): "
                f"from Δ{self.table} for deleted and inserted keys, read for updated ones only")


def shortcuts(program: Program, d: DeltaRule, i: int) -> dict[int, Shortcut]:
    """The subgoals of delta rule ``d`` (Δ subgoal ``i``) taken from the deltas, by body position."""
    body = d.rule.body
    delta = body[i]
    if not isinstance(delta, Literal) or delta.negated or program.predicates[delta.atom.pred].kind != Kind.BASE \
            or any(isinstance(x, Literal) and x.null_safe for x in body):
        return {}
    r = delta.atom.pred
    bound = {a.name: col for col, a in zip(program.predicates[r].columns, delta.atom.args, strict=True)
             if isinstance(a, Var)}
    rkey = primary_key(program, r)
    out = {}
    for j, item in enumerate(body):
        if j == i or not isinstance(item, Literal) or item.negated or d.states[j] == DELTA:
            continue
        s = item.atom.pred
        sp = program.predicates[s]
        if sp.kind != Kind.BASE or s == r:
            continue
        at = {col: a.name for col, a in zip(sp.columns, item.atom.args, strict=True) if isinstance(a, Var)}
        key = primary_key(program, s)
        if key and all(at.get(col) in bound for col in key):
            out[j] = Shortcut(ShortcutKind.LOOKUP, s, r, tuple((col, bound[at[col]]) for col in key))
            continue
        for fk, (target, tcol) in sp.references.items():
            if target == r and rkey == [tcol] and fk in at and bound.get(at[fk]) == tcol:
                out[j] = Shortcut(ShortcutKind.REFERENCE, s, r, ((fk, tcol),))
                break
    return out


def apply(c: DeltaContext, d: DeltaRule, i: int, among: set[int] | None = None) -> dict[int, DataFrame]:
    """The relations (the atoms' variables + ``__count``) of the subgoals `shortcuts` finds (those at
    the body positions ``among`` only, if given)."""
    out = {}
    for j, sc in shortcuts(c.program, d, i).items():
        if among is not None and j not in among:
            continue
        state = d.states[j]
        raw = _lookup(c, sc, state) if sc.kind is ShortcutKind.LOOKUP else _reference(c, sc, state)
        out[j] = c.ev.atom(d.rule.body[j].atom, raw)
        log.info("%s: %s", d.rule.head.pred, sc)
    return out


def _at(delta: DataFrame, state: str) -> DataFrame:
    """A keyed table at ``state``, at the keys of its net delta: the −1 tuples (as +1) for the old
    state, the +1 tuples for the new one."""
    if state == OLD:
        return negate(delta.where(F.col(C) < 0))
    return delta.where(F.col(C) > 0)


@dataclass(frozen=True)
class KeysRead:
    """The keys a shortcut reads from storage in one run, found once whichever rules need them: few
    (``values``, an IN list) or, when ``values`` is None, too many for one: the ``ranges`` they fall in."""

    values: list | None
    ranges: Column | None = None


def _read(c: DeltaContext, sc: Shortcut, state: str, keys: DataFrame,
          held: list | None = None) -> DataFrame | None:
    """The table at ``state`` restricted to ``keys`` (a small plan over deltas, named like the
    shortcut's columns): an IN filter on one column when there are few (the Parquet reader skips row
    groups by their statistics; base layers are sorted by key), else a semi-join behind the keys'
    ranges (`zset.skipping_filter`); None when there are none. The keys are found once per run (one
    small job, none when the driver ``held`` them already: their sorted values), whichever views'
    rules need them."""
    columns = sc.columns
    if sc not in c.shortcut_keys and held is not None:
        c.shortcut_keys[sc] = KeysRead(held)
        log.info("%s: %d keys to read (found on the driver)", sc, len(held))
    if sc not in c.shortcut_keys:
        if len(columns) == 1:
            # (a NULL key joins nothing: the rules here join with =)
            known = keys.where(F.col(quote(columns[0])).isNotNull()).limit(VALUES_ON_DRIVER + 1)
            values = [r[0] for r in known.collect()]
            read = KeysRead(values) if len(values) <= VALUES_ON_DRIVER else None
        else:
            read = KeysRead([]) if not keys.limit(1).collect() else None
        # many keys: the ranges they fall in, for the Parquet reader
        c.shortcut_keys[sc] = read if read is not None else KeysRead(None, skipping_filter(keys, columns[0]))
        log.info("%s: %s keys to read", sc, f"over {VALUES_ON_DRIVER}" if read is None else len(read.values))
    read = c.shortcut_keys[sc]
    rows = c.joined(sc.table, state)
    if read.values is None:  # many keys: a semi-join behind their ranges
        return restrict(rows.where(read.ranges), keys, columns)
    if not read.values:
        return None
    found = at_values(rows, columns[0], sorted(read.values))
    # (a small run's frames are in one partition: the few rows found gathered there, `local_join`)
    return found.repartition(1) if c.states.small else found


def _lookup(c: DeltaContext, sc: Shortcut, state: str) -> DataFrame:
    """Y at ``state`` at the keys ΔS binds: from ΔY for the keys it holds, read for the others."""
    dy = c.states.delta(sc.table)
    if dy is None:
        return c.joined(sc.table, state)
    key = sc.columns
    bound = c.used_delta[sc.via].select(*[F.col(quote(b)).alias(a) for a, b in sc.pairs]).dropna().distinct()
    outside = bound.join(dy.select(*[F.col(quote(a)) for a in key]), key, "left_anti")
    parts = [_at(dy, state), _read(c, sc, state, outside, _held_outside(c, sc))]
    return union_all([p for p in parts if p is not None])


def _held_outside(c: DeltaContext, sc: Shortcut) -> list | None:
    """A lookup's keys outside ΔY as the driver finds them from the two delta layers (ΔS's values of
    the bound column, less ΔY's keys: `RunStates.delta_values`, no Spark job); None for a key of several
    columns, or when the layers are not read on the driver (the keys are collected then)."""
    if len(sc.pairs) != 1 or sc in c.shortcut_keys:
        return None
    [(a, b)] = sc.pairs
    bound, held = c.states.delta_values(sc.via, b), c.states.delta_values(sc.table, a)
    return None if bound is None or held is None else sorted(set(bound) - set(held))


def _reference(c: DeltaContext, sc: Shortcut, state: str) -> DataFrame:
    """S at ``state`` at the keys of ΔR (S.fk references R's key): −ΔS for deleted keys at the old
    state, ΔS for inserted keys at the new one, read for updated keys."""
    [(fk, rkey)] = sc.pairs
    sums = c.used_delta[sc.via].groupBy(F.col(quote(rkey)).alias(fk)).agg(F.sum(C).alias("__sum"))
    ds = c.states.delta(sc.table)
    parts = []
    if ds is not None:  # deleted keys' rows at the old state, inserted keys' rows at the new one
        ending = sums.where(F.col("__sum") == (-1 if state == OLD else 1)).select(fk)
        parts.append(_at(restrict(ds, ending, [fk], c.states.small, local=c.states.small), state))
    if c.updated_keys.get(sc.via) == 0:  # the trim counted no updated key of ΔR: nothing to read or find
        log.info("%s: no updated keys (the trim of %s counted none), nothing to read", sc, sc.via)
    else:
        parts.append(_read(c, sc, state, sums.where(F.col("__sum") == 0).select(fk)))
    parts = [p for p in parts if p is not None]
    return union_all(parts) if parts else c.joined(sc.table, state).where(F.lit(False))
