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

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ivm.analysis import Decision, analyse, select_expressions
from ivm.config import COUNT_COLUMN
from ivm.ir import Atom, Condition, Const, Literal, Program, Rule, Var
from ivm.maintain.counting import presence_change
from ivm.maintain.delta_rules import rule_sql
from ivm.maintain.fixpoint import as_set
from ivm.vocabulary import Kind
from ivm.zset import anti_join, consolidate, negate, restrict, union_all

C = COUNT_COLUMN


@dataclass(frozen=True)
class MaintenanceRule:
    name: str
    when: str
    sql: str


def derived_rules(program: Program, view: str) -> list[MaintenanceRule]:
    analysis = analyse(program, view)
    rules = select_expressions(program, view)
    if isinstance(rules, str) or not analysis.applicable:
        return []
    unsafe: dict[str, list[str]] = {}
    decisions = {(t, op): d for t, op, d, _ in analysis.table()}
    columns = ", ".join(program.predicates[view].columns)
    out: list[MaintenanceRule] = []
    for rule in rules:
        for k, item in enumerate(rule.body):
            if not (isinstance(item, Literal) and not item.negated
                    and program.predicates[item.atom.pred].kind == Kind.BASE):
                continue
            table = item.atom.pred
            ins_states = tuple("inserted" if i == k else None for i in range(len(rule.body)))
            safe_insert = decisions.get((table, "delete")) is Decision.INCREMENTAL
            check = f"inserted_{view}" if safe_insert else view
            select = rule_sql(program, rule, ins_states, counts=False)
            joiner = "  AND" if "\nWHERE " in select else "WHERE"
            out.append(MaintenanceRule(
                f"ins-{table}-{view}", f"inserted into {table}",
                f"INSERT INTO {view}\n{select}\n{joiner} ({columns}) NOT IN (SELECT {columns} FROM {check})"))
            if decisions.get((table, "delete")) is Decision.INCREMENTAL:
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


# -- executing the rules ---------------------------------------------------------------------------------


def set_structure(program: Program, view: str) -> tuple[str, list[Rule]] | str:
    """How the view combines its select expressions (003 §8): ("union", rules) for one or several
    select expressions (a Datalog view's rules, or SQL UNION sides), ("intersect", rules) for SQL
    INTERSECT; each rule produces view tuples (a side's rule is composed with the view's rule over the
    side). Or why key-based execution does not apply."""
    rules = program.rules_for(view)

    def sides(rule: Rule) -> list[Literal]:
        return [i for i in rule.body if isinstance(i, Literal) and program.predicates[i.atom.pred].role == "setop"]

    if all(not sides(r) for r in rules):
        return "union", list(rules)
    if len(rules) == 1 and len(sides(rules[0])) > 1:
        parts = sides(rules[0])
        if any(i.negated for i in parts):
            return "EXCEPT is outside 003's view language"
        if any(len(program.rules_for(p.atom.pred)) != 1 or sides(program.rules_for(p.atom.pred)[0]) for p in parts):
            return "an INTERSECT side combines select expressions itself"
        if len(rules[0].body) != len(parts):
            return "the INTERSECT view has further conditions"
        return "intersect", [_compose(rules[0], p, program.rules_for(p.atom.pred)[0]) for p in parts]
    out = []
    for r in rules:
        s = sides(r)
        if len(s) != 1 or len(r.body) != 1:
            return "the view mixes set operators"
        for side_rule in program.rules_for(s[0].atom.pred):
            if sides(side_rule):
                return "a UNION side combines select expressions itself"
            out.append(_compose(r, s[0], side_rule))
    return "union", out


def _compose(view_rule: Rule, side: Literal, side_rule: Rule) -> Rule:
    """The view's rule over a set-operator side, with the side's rule substituted: a select expression
    that produces view tuples. The side's variables are renamed apart, then unified with the view's."""
    rename = {v: Var(f"{side.atom.pred}__{v}") for v in _rule_vars(side_rule)}
    mapping: dict[str, object] = {}
    for head_arg, used in zip(side_rule.head.args, side.atom.args, strict=True):
        if isinstance(head_arg, Var):
            mapping[head_arg.name] = used
    def term(t):
        if isinstance(t, Var):
            return mapping.get(t.name, rename[t.name])
        return t
    body = []
    for item in side_rule.body:
        if isinstance(item, Literal):
            body.append(Literal(Atom(item.atom.pred, tuple(term(a) for a in item.atom.args)), item.negated,
                                item.null_safe))
        elif isinstance(item, Condition):
            body.append(Condition(_rename_tree(item.tree, mapping, rename)))
        else:
            raise TypeError(item)
    return Rule(view_rule.head, tuple(body))


def _rule_vars(rule: Rule) -> set[str]:
    out = set()
    for item in rule.body:
        if isinstance(item, Literal):
            out |= item.atom.variables()
        elif isinstance(item, Condition):
            out |= item.variables()
    return out | rule.head.variables()


def _rename_tree(tree, mapping, rename):
    from sqlglot import exp

    def swap(node):
        if isinstance(node, exp.Column) and not node.table:
            target = mapping.get(node.name, rename.get(node.name))
            if isinstance(target, Var):
                return exp.column(target.name, quoted=True)
            if isinstance(target, Const):
                return exp.Literal.string(target.value) if isinstance(target.value, str) else \
                    exp.null() if target.value is None else exp.Literal.number(target.value)
        return node
    return tree.copy().transform(swap)


class KeyBased:
    """003's derived rules executed over one run (§5.4 top-level references, §6.2 EXISTS/IN, §7.2 NOT
    EXISTS, §8 UNION and INTERSECT), on a view stored without counts.

    The deletions D (tuples that leave V) and insertions I (tuples that enter V) are computed as the
    rules compute them — deletions from the deleted tuples with every other reference at its old
    state, insertions from the inserted tuples with every other reference at its new state; a NOT
    EXISTS subquery turns its table's insertions into deletions and its deletions into insertions —
    and applied deletes first, then inserts that are not in V (the "not in V" / "not in inserted V"
    checks), as one presence change against the stored view. An operation the analysis marks
    unsafe, when the run's delta holds one, triggers the rematerialization rule instead (the view
    recomputed; its change against the stored state is the delta)."""

    def __init__(self, program: Program, view: str, changes, view_old, ev_old, ev_new):
        """``changes(table)``: the table's set change (+1 inserted, -1 deleted tuples) or None;
        ``ev_old``/``ev_new``: evaluators over the tables' old and new states (subqueries evaluate
        from them); ``view_old``: the view's stored tuples."""
        self.program, self.view = program, view
        self.changes, self.view_old = changes, view_old
        self.ev = {"old": ev_old, "new": ev_new}
        self.analysis = analyse(program, view)
        structure = set_structure(program, view)
        assert not isinstance(structure, str), structure
        self.op, self.rules = structure
        self.columns = list(program.predicates[view].columns)

    def unsafe(self, present: dict[str, set[str]]) -> list[str]:
        """The (table, operation) pairs in this run's deltas the analysis marks rematerialize, as words."""
        # an update arrives as a deletion and an insertion of the key (its decision is the deletion's)
        return [f"{op} on {table} ({why})" for table, op, decision, why in self.analysis.table()
                if decision is Decision.REMATERIALIZE and op in present.get(table, set())]

    # -- one select expression with one reference marked ---------------------------------------------

    def _derive(self, pred: str, table: str, part: str, state: str) -> DataFrame | None:
        """The tuples of an auxiliary predicate derived with ``table``'s ``part`` (inserted / deleted
        tuples) in one reference and every other reference at ``state`` (003 §6.2's rule bodies)."""
        frames = []
        for rule in self.program.rules_for(pred):
            for j, item in enumerate(rule.body):
                if isinstance(item, Literal) and not item.negated:
                    marked = self._marked(item, table, part, state)
                    if marked is not None:
                        frames.append(self._rule(rule, state, {j: marked}))
        return _union(frames)

    def _marked(self, item: Literal, table: str, part: str, state: str) -> DataFrame | None:
        """A positive literal with ``table``'s change in it: the change itself, or a subquery's tuples
        derived from it; None when the literal does not read ``table``."""
        p = self.program.predicates[item.atom.pred]
        if item.atom.pred == table:
            change = self.changes(table)
            return change.where(F.col(C) > 0) if part == "inserted" else \
                negate(change.where(F.col(C) < 0))
        if p.kind == Kind.AUX:
            return self._derive(item.atom.pred, table, part, state)
        return None

    def _rule(self, rule: Rule, state: str, replaced: dict[int, DataFrame], extra: DataFrame | None = None,
              extra_atom: Atom | None = None, negations: bool = True) -> DataFrame:
        """The rule at ``state`` with some body items replaced by given relations (joined positively,
        a negated item included); ``extra`` joins one more relation over ``extra_atom``; without
        ``negations`` the other negated items are not applied."""
        ev = self.ev[state]
        body = rule.body + ((Literal(extra_atom),) if extra is not None else ())

        def subgoal(j, item):
            if extra is not None and j == len(rule.body):
                return ev.atom(extra_atom, extra)
            if j in replaced:
                return ev.atom(item.atom, replaced[j])
            return None if item.negated else ev.atom(item.atom)

        def absent(j, item, df):
            if not negations:
                return df
            present = consolidate(ev.atom(item.atom)).where(F.col(C) > 0)
            return anti_join(df, present, item.null_safe)

        first = len(rule.body) if extra is not None else next(iter(replaced), None)
        out = ev.rule(Rule(rule.head, body), subgoal, absent, first=first)
        # layers are joined as they are (joins distribute over ⊎): a tuple is derived if its summed count is positive
        head = self.program.predicates[rule.head.pred].columns
        return as_set(out.select(*[F.col(f"`{c}`") for c in head], F.col(C)), head)

    def changes_of(self, rule: Rule, table: str) -> tuple[list[DataFrame], list[DataFrame]]:
        """(D, I) of one select expression for the changes of one table (003 §5.4, §6.2, §7.2)."""
        deleted, inserted = [], []
        for j, item in enumerate(rule.body):
            if not isinstance(item, Literal):
                continue
            if not item.negated:
                d = self._marked(item, table, "deleted", "old")      # del-T-V: old states
                if d is not None:
                    deleted.append(self._rule(rule, "old", {j: d}))
                i = self._marked(item, table, "inserted", "new")     # ins-T-V: new states
                if i is not None:
                    inserted.append(self._rule(rule, "new", {j: i}))
            else:
                # NOT EXISTS (003 §7.2): an insertion into N deletes the view tuples it now blocks, found
                # among the top-level tuples of the new state (I-safety holds within one state: an old
                # tuple of an updated row may share its key, not its other columns, with a new one). The
                # other NOT EXISTS are not applied: a tuple blocked twice over must still leave, and
                # deleting a tuple V does not hold changes nothing ...
                probe = Literal(item.atom)
                blocked = self._marked(probe, table, "inserted", "new")
                if blocked is not None:
                    deleted.append(self._rule(rule, "new", {j: blocked}, negations=False))
                # ... a deletion from N inserts the view tuples it no longer blocks (the rule at its new state)
                freed = self._marked(probe, table, "deleted", "old")
                if freed is not None:
                    inserted.append(self._rule(rule, "new", {}, extra=freed, extra_atom=item.atom))
        return deleted, inserted

    def run(self, tables: list[str]) -> DataFrame | None:
        """The view's change (+1 entering, -1 leaving) from the changes of ``tables``; None if none."""
        deleted, inserted = [], []
        for table in tables:
            for rule in self.rules:
                d, i = self.changes_of(rule, table)
                deleted += d
                inserted += i
        d, i = _union(deleted), _union(inserted)
        if d is None and i is None:
            return None
        if self.op == "union" and len(self.rules) > 1 and d is not None:
            # 003 §8.1: a tuple leaves V only if no other select expression produces it (new states)
            d = d.distinct()
            still = _union([restrict(self._rule(r, "new", {}), d, self.columns) for r in self.rules])
            d = anti_join(d, still.drop(C), null_safe=True)
        if self.op == "intersect" and i is not None:
            # 003 §8.2: a tuple enters V only if every select expression produces it (new states)
            i = i.distinct()
            for r in self.rules:
                i = restrict(i, self._rule(r, "new", {}), self.columns)
        change = _union([x for x in (i, negate(d) if d is not None else None) if x is not None])
        # deletes before inserts, inserts only of tuples not in V: the presence change against V
        return presence_change(self.view_old, consolidate(change.distinct()), self.columns)


def _union(frames: list[DataFrame]) -> DataFrame | None:
    return union_all(frames) if frames else None
