"""What maintaining one view did beyond its delta, as a value the maintenance returns (Feldera's habit:
per-run statistics are values returned by the code that counted them): the run record's ``algorithm``
detail and the words of the maintain stage's progress line.

>>> s = MaintainStats(dred={"over-deleted": 2, "rederived": 1, "inserted": 0}, from_deltas=1)
>>> s.detail()
{'over-deleted': 2, 'rederived': 1, 'inserted': 0, 'subgoals from deltas': 1}
>>> (s + MaintainStats(dred={"over-deleted": 1}, probed_ids=4)).detail()
{'over-deleted': 3, 'rederived': 1, 'inserted': 0, 'subgoals from deltas': 1, 'probed collection ids': 4}
>>> s.describe()
' (DRed: over-deleted 2, rederived 1, inserted 0); 1 delta-rule subgoals taken from the deltas (keyed lookups, \
foreign keys)'
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MaintainStats:
    #: DRed's tuples over-deleted, rederived and inserted, over the view's recursive components (000 §7)
    dred: dict[str, int] = field(default_factory=dict)
    #: per extraction function the view reads: the elements its delta changed (002 §2.2)
    changed_elements: dict[str, int] = field(default_factory=dict)
    #: delta-rule subgoals taken from the deltas (keyed lookups, foreign keys: ivm.maintain.references)
    from_deltas: int = 0
    #: unchanged subgoals joined once for all delta rules of a rule (`Counting.factored`), by predicate
    joined_once: dict[str, list[str]] = field(default_factory=dict)
    #: collection ids the owner indexes were probed with (002 §4.3)
    probed_ids: int = 0

    def __add__(self, other: MaintainStats) -> MaintainStats:
        """Two counts of one view's maintenance (its predicates', its delta rules') added up."""
        return MaintainStats({k: self.dred.get(k, 0) + other.dred.get(k, 0) for k in self.dred | other.dred},
                             self.changed_elements | other.changed_elements, self.from_deltas + other.from_deltas,
                             self.joined_once | other.joined_once, self.probed_ids + other.probed_ids)

    def detail(self) -> dict[str, int]:
        """As the run's record keeps it."""
        out = dict(self.dred)
        out |= {f"Δ{e} elements": n for e, n in self.changed_elements.items()}
        once = sorted({t for ts in self.joined_once.values() for t in ts})
        for key, n in (("subgoals from deltas", self.from_deltas), ("joined once", len(once)),
                       ("probed collection ids", self.probed_ids)):
            if n:
                out[key] = n
        return out

    def describe(self) -> str:
        """As the maintain stage's progress line says it, after the tuples changed."""
        how = " (DRed: " + ", ".join(f"{k} {n}" for k, n in self.dred.items()) + ")" if self.dred else ""
        how += "".join(f"; Δ{e}: {n} changed elements" for e, n in self.changed_elements.items())
        if self.from_deltas:
            how += f"; {self.from_deltas} delta-rule subgoals taken from the deltas (keyed lookups, foreign keys)"
        once = sorted({t for ts in self.joined_once.values() for t in ts})
        if once:
            how += f"; {', '.join(once)} joined once for all delta rules (unchanged)"
        if self.probed_ids:
            how += f"; owner indexes probed with {self.probed_ids} collection ids"
        return how
