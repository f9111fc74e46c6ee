"""The maintenance rules of 003 §5.4 for key-based (count-free) maintenance of a view, as SQL.

For each top-level table reference T of each select expression of the view:

    ins-T-V   insert into V the view's SELECT over ``inserted T`` (other tables as they are now),
              skipping tuples already inserted (safe T) or already in V (unsafe T)
    del-T-V   delete from V the tuples the view's SELECT derives from ``deleted T`` (other tables as
              they were), when T is safe
    rematerialize-V   when deleted from / updated T for every unsafe T: recompute V

Updates of a safe table are a delete of the old values and an insert of the new ones (003's
old-upd and new-upd rules). The analysis (ivm.analysis) decides safety; this module only writes the
rules down, for `ivm explain` and for the key-based algorithm that executes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ivm.analysis import _select_expressions, analyse
from ivm.ir import Literal, Program
from ivm.maintain.delta_rules import rule_sql


@dataclass(frozen=True)
class MaintenanceRule:
    name: str
    when: str
    sql: str


def derived_rules(program: Program, view: str) -> list[MaintenanceRule]:
    analysis = analyse(program, view)
    rules = _select_expressions(program, view)
    if isinstance(rules, str) or not analysis.applicable:
        return []
    unsafe: dict[str, list[str]] = {}
    decisions = {(t, op): d for t, op, d, _ in analysis.table()}
    columns = ", ".join(program.predicates[view].columns)
    out: list[MaintenanceRule] = []
    for rule in rules:
        for k, item in enumerate(rule.body):
            if not (isinstance(item, Literal) and not item.negated
                    and program.predicates[item.atom.pred].kind == "base"):
                continue
            table = item.atom.pred
            ins_states = tuple("inserted" if i == k else None for i in range(len(rule.body)))
            safe_insert = decisions.get((table, "delete")) == "incremental"
            check = f"inserted_{view}" if safe_insert else view
            select = rule_sql(program, rule, ins_states, counts=False)
            joiner = "  AND" if "\nWHERE " in select else "WHERE"
            out.append(MaintenanceRule(
                f"ins-{table}-{view}", f"inserted into {table}",
                f"INSERT INTO {view}\n{select}\n{joiner} ({columns}) NOT IN (SELECT {columns} FROM {check})"))
            if decisions.get((table, "delete")) == "incremental":
                del_states = tuple("deleted" if i == k else "old" if isinstance(x, Literal) else None
                                   for i, x in enumerate(rule.body))
                out.append(MaintenanceRule(
                    f"del-{table}-{view}", f"deleted from {table}",
                    f"DELETE FROM {view} WHERE ({columns}) IN (\n"
                    f"{rule_sql(program, rule, del_states, counts=False)})"))
            else:
                unsafe.setdefault(table, [])
    if unsafe:
        when = ", ".join(f"deleted from {t}, updated {t}" for t in unsafe)
        out.append(MaintenanceRule(f"rematerialize-{view}", when,
                                   f"DELETE FROM {view};\nINSERT INTO {view} <the view's definition>"))
    return out
