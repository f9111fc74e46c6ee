"""`ivm explain VIEW`: the view's stratum and dependencies, its rules, and how it is maintained.

The rules are printed in the Datalog form of 000 (SQL views show the rules the SQL front end derived,
auxiliary predicates included), so a reader can follow each maintenance step in the papers' terms.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from tabulate import tabulate

from ivm.analysis import analyse
from ivm.config import ProjectConfig
from ivm.ir import Program
from ivm.lang.nested import EXTRACTION, INDEX, extractions, nested_column, source_relation
from ivm.maintain import cream
from ivm.maintain.counting import ephemeral, view_predicates
from ivm.maintain.delta_rules import delta_rules
from ivm.maintain.dred import dred_rules
from ivm.maintain.keyed import derived_rules
from ivm.maintain.references import shortcuts
from ivm.maintain.strategy import COUNTING, Choice, lookup
from ivm.modes import Mode
from ivm.refresh.plan import RULES
from ivm.stratify import Strata
from ivm.vocabulary import Kind


@dataclass
class Explanation:
    view: str
    language: str
    semantics: str
    columns: list[str]
    stratum: int
    recursive: bool
    tables: list[str]
    views: list[str]
    auxiliary: list[str]
    rules: list[str]
    algorithm: str
    reasons: list[str]
    #: 003's key-based analysis: whether it applies, bound columns, duplicates, per table and operation
    key_based: dict
    #: 000 Definition 4.1's delta rules of every rule, in Datalog form and as SQL
    delta_rules: list[dict]
    #: 003 §5.4's insert/delete/rematerialize rules, where key-based maintenance applies
    key_based_rules: list[dict]
    #: the view's recursive components (maintained by DRed, 000 §7) and their Δ⁻/Δʳ/Δ⁺ rules
    recursive_components: list[list[str]]
    dred_rules: list[dict]
    #: CReaM's auxiliary views (001 Figure 1): what each stands for and the view's rule over it
    auxiliary_views: list[dict]
    #: the tables an incremental refresh reads besides their deltas, and why; none: self-maintainable
    tables_read: dict[str, str]
    #: counting, key-based (003) or REDUCE (004): the candidates, their estimated costs, the choice
    #: (ivm.maintain.strategy; costs for a change of 0.1% of every table the view reads)
    strategy: dict | None = None

    @property
    def self_maintainable(self) -> bool:
        return not self.tables_read

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def to_text(self) -> str:
        lines = [
            f"view {self.view} ({self.language}, {self.semantics} semantics): {', '.join(self.columns)}",
            f"stratum {self.stratum}{' (recursive)' if self.recursive else ''}",
            f"reads tables: {', '.join(self.tables) or '-'}",
            f"reads views: {', '.join(self.views) or '-'}",
            f"auxiliary predicates: {', '.join(self.auxiliary) or '-'}",
            "rules:",
            *[f"  {r}" for r in self.rules],
            f"maintenance: {self.algorithm}",
            *[f"  - {r}" for r in self.reasons],
        ]
        if self.strategy:
            st = self.strategy
            lines.append(f"strategy: {st['strategy']} ({st['reason']})")
            table = tabulate([[c["strategy"], "yes" if c["applicable"] else "no",
                               "-" if c["cost"] is None else f"{c['cost']:,.0f}", c["why"]]
                              for c in st["candidates"]],
                             headers=["candidate", "applies", "estimated cost", "why"], tablefmt="simple")
            lines += ["  " + line for line in table.splitlines()]
        for a in self.auxiliary_views:
            lines += [f"CReaM rewrite (001 Figure 1) with the auxiliary view {a['name']}:",
                      f"  {a['auxiliary_view']}", f"  {a['view_rule']}", f"  maintained by {a['maintenance']}"]
        if self.self_maintainable:
            lines.append(f"self-maintainable (001 §5): a refresh reads the deltas of {', '.join(self.tables) or '-'} "
                         "and the view's own stored relations, never the tables themselves")
        else:
            lines.append("tables a refresh reads besides their deltas:")
            lines += [f"  {t}: {why}" for t, why in self.tables_read.items()]
        lines.append("key-based analysis (003):")
        kb = self.key_based
        if kb["applicable"]:
            lines.append("  applies: every operation below marked incremental needs no recomputation")
        else:
            lines.append(f"  does not apply: {kb['reason']}")
        if kb["bound_columns"]:
            lines.append(f"  bound columns: {', '.join(kb['bound_columns'])}")
        if kb["operations"]:
            table = tabulate([[r["table"], r["operation"], r["decision"], r["reason"]] for r in kb["operations"]],
                             headers=["table", "operation", "key-based", "why"], tablefmt="simple")
            lines += ["  " + line for line in table.splitlines()]
        if self.key_based_rules:
            lines.append("key-based rules (003 §5.4):")
            for r in self.key_based_rules:
                lines.append(f"  {r['name']} (when {r['when']}):")
                lines += ["      " + line for line in r["sql"].splitlines()]
        for comp in self.recursive_components:
            lines.append(f"DRed rules for the recursive component {', '.join(comp)} (000 §7; ᵛ is the new state, "
                         "unmarked subgoals the old one):")
            for r in self.dred_rules:
                if r["predicate"] in comp:
                    lines.append(f"  step {r['step']}: {r['rule']}")
        lines.append("delta rules (000 Definition 4.1; ᵛ is the new state, unmarked subgoals the old one):")
        for d in self.delta_rules:
            lines.append(f"  {d['rule']}")
            lines += ["      " + line for line in d["sql"].splitlines()]
            lines += [f"      -- {sc}" for sc in d.get("from_deltas", [])]
        return "\n".join(lines)


def explain(program: Program, strata: Strata, config: ProjectConfig, view: str,
            choice: Choice | None = None) -> Explanation:
    pred = program.predicates[view]
    upstream = strata.upstream(view)
    own = sorted(p for p, d in program.predicates.items() if d.kind == Kind.AUX and d.owner == view)
    rule_preds = [view, *own, *extractions(program, upstream)]  # with 002's extraction rewrite
    component = next(c for c in strata.components if view in c.predicates)
    components = strata.recursive_among(view_predicates(program, strata, view))
    algorithm, reasons = choose(program, strata, config, view, choice)
    reasons += [f"{p}: not stored (ephemeral): its one reader is a GROUP BY whose aggregates are all maintained "
                f"from Δ{p} and the stored state (000 §6.2), so Δ{p} enters the state's delta as a plan and a full "
                f"refresh aggregates {p} without writing it" for p in own if p in ephemeral(program, strata)]
    return Explanation(
        view=view,
        language=config.views[view].language,
        semantics=pred.semantics,
        columns=list(pred.columns),
        stratum=strata.stratum_of[view],
        recursive=component.recursive,
        tables=sorted(p for p in upstream if program.predicates[p].kind == Kind.BASE),
        views=sorted(p for p in upstream if program.predicates[p].kind == Kind.VIEW),
        auxiliary=own,
        rules=[str(r) for p in rule_preds for r in program.rules_for(p)],
        algorithm=algorithm,
        reasons=reasons,
        key_based=_key_based(program, view),
        delta_rules=[{"rule": str(d), "sql": d.sql(program),
                      "from_deltas": [str(sc) for sc in shortcuts(program, d, d.states.index("delta")).values()]}
                     for p in rule_preds if not any(p in c.predicates for c in components)
                     for r in program.rules_for(p) for d in delta_rules(r)],
        key_based_rules=[{"name": r.name, "when": r.when, "sql": r.sql} for r in derived_rules(program, view)],
        recursive_components=[list(c.predicates) for c in components],
        dred_rules=[r for c in components for r in dred_rules(program, c)],
        auxiliary_views=cream.auxiliary_views(program, view),
        tables_read=cream.tables_read(program, view_predicates(program, strata, view),
                                      {p for c in components for p in c.predicates}),
        strategy=choice.as_dict() if choice is not None else None,
    )


def choose(program: Program, strata: Strata, config: ProjectConfig, view: str,
           choice: Choice | None = None) -> tuple[str, list[str]]:
    """The algorithm that maintains ``view`` and why (docs/design.md §5): a full recompute when the view
    asks for one, else what its strategy (``choice``'s; counting without one) says of itself."""
    if config.views[view].mode is Mode.FULL:
        return "full recompute", ["the view is configured with mode: full: every refresh that changes an input "
                                  "recomputes it from the new snapshot"]
    strategy = lookup(choice.strategy) if choice is not None else COUNTING
    algorithm, reasons = strategy.explain(program, strata, config, view)
    reasons += describe_nested(program, config, view, strata.upstream(view))
    # the planner's own rules (ivm.refresh.plan.RULES), so this cannot drift from what it does
    reasons.append("a full recompute happens only when " + "; or ".join(rule.when for rule in RULES))
    return algorithm, reasons


def _key_based(program: Program, view: str) -> dict:
    a = analyse(program, view)
    return {"applicable": a.applicable, "reason": a.reason, "may_have_duplicates": a.may_have_duplicates,
            "bound_columns": a.bound,
            "operations": [{"table": t, "operation": op, "decision": d, "reason": why}
                           for t, op, d, why in a.table()]}


def describe_nested(program: Program, config: ProjectConfig, view: str, upstream: set[str]) -> list[str]:
    """`ivm explain`'s lines on nested data: each extraction function with its definition and the log
    its delta comes from, each owner index, each collection log."""
    lines = []
    for e in extractions(program, upstream):
        [rule] = program.rules_for(e)
        source = source_relation(program, e)
        table = source
        while program.predicates[table].kind == EXTRACTION:
            table = source_relation(program, table)
        lines.append(f"extraction {e}({', '.join(program.predicates[e].columns)}) := "
                     f"{rule.body[0]}, {rule.body[1]}  (002 §2.2 e_S; not stored)")
        lines.append(f"  Δ{e}: the net delta of {source}"
                     f"{'' if source == table else f' (from the log of {table})'}, extracted, projected onto "
                     f"its columns and consolidated: only elements that changed (element-level multiset "
                     f"difference of each updated row's arrays)")
    for t in sorted(u for u in upstream if u in config.tables):
        for col, ref in config.tables[t].nested.items():
            if ref.collection in upstream:
                lines.append(f"collection {t}.{col} -> {ref.collection} (by reference, id {ref.id}): the log of "
                             f"{ref.collection} is the nested descriptor's log of every {ref.collection} "
                             f"collection (002 §4.1)")
    owned = sorted(p for p, d in program.predicates.items() if d.role == INDEX and d.owner == view)
    for idx in owned:
        owner = [c for c in program.predicates[idx].columns if c != nested_column(program, idx)]
        lines.append(f"owner index {idx}: collection id {nested_column(program, idx)} -> the owning "
                     f"{source_relation(program, idx)} rows' {', '.join(owner) or 'count'}, clustered by the "
                     f"id; maintained from {source_relation(program, idx)}'s log in every refresh, probed with "
                     f"the changed collection ids (002 §4.2, §4.3 step 2-1)")
    return lines
