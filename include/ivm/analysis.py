"""Key-based analysis of a view (003 §§5–8): bound columns, duplicate analysis, and the safety of every
table reference, so that each operation on each base table is either maintained incrementally by the
derived rules of 003 §5.4 or forces a rematerialization — with the reason in words.

The analysis runs on the rule IR. A select expression of 003 is one rule: its positive atoms over
tables are the top-level table references; a positive literal over a set-semantics auxiliary
predicate is an EXISTS or IN subquery (003 §6) whose rule holds the nested references; a negated one
is a NOT EXISTS subquery (003 §7). Equal columns share a variable (the SQL front end unifies
``a = b``), so "an equality comparison between two columns" is a shared variable, and "an equality
with a constant" is a constant argument or a ``X = constant`` condition. Views with several select
expressions (UNION, INTERSECT; 003 §8) are analysed per expression.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sqlglot import exp

from ivm.ir import Condition, Const, GroupBy, Literal, Program, Rule, SetOf, Unnest, Var
from ivm.vocabulary import Kind

OPERATIONS = ("insert", "delete", "update")
SUBQUERY = ("exists", "in")


class Decision(StrEnum):
    """What key-based maintenance does with one operation on one table reference (003 §5.4)."""

    INCREMENTAL = "incremental"
    REMATERIALIZE = "rematerialize"


@dataclass
class Reference:
    """One table reference and, per operation, whether key-based maintenance keeps it incremental."""

    table: str
    context: str  # top-level | exists | in | not exists
    decisions: dict[str, tuple[Decision, str]] = field(default_factory=dict)  # op -> (incremental|rematerialize, why)


@dataclass
class KeyAnalysis:
    view: str
    applicable: bool
    reason: str = ""
    distinct: bool = False
    may_have_duplicates: bool = False
    bound: list[str] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)

    def table(self) -> list[tuple[str, str, Decision, str]]:
        """(table, operation, decision, reason), one row per base table and operation: an operation
        is incremental only if it is for every reference to the table."""
        rows = []
        for table in dict.fromkeys(r.table for r in self.references):
            refs = [r for r in self.references if r.table == table]
            for op in OPERATIONS:
                bad = [(r, r.decisions[op][1]) for r in refs if r.decisions[op][0] is Decision.REMATERIALIZE]
                if bad:
                    rows.append((table, op, Decision.REMATERIALIZE, "; ".join(dict.fromkeys(why for _, why in bad))))
                else:
                    why = "; ".join(dict.fromkeys(r.decisions[op][1] for r in refs))
                    rows.append((table, op, Decision.INCREMENTAL, why))
        return rows


def _keys_bound(program: Program, atom_pred: str, args, bound_vars: set[str], bound_pos: set[int]) -> list[str] | None:
    """The first key of the atom's table whose columns are all bound, or None."""
    pred = program.predicates[atom_pred]
    for key in pred.keys:
        if all(_column_bound(pred.columns.index(c), args, bound_vars, bound_pos) for c in key):
            return key
    return None


def _column_bound(pos: int, args, bound_vars: set[str], bound_pos: set[int]) -> bool:
    a = args[pos]
    return isinstance(a, Const) or (isinstance(a, Var) and a.name in bound_vars) or pos in bound_pos


def _constant_vars(rule: Rule) -> set[str]:
    """Variables a condition equates to a constant (003 Definition 5.1 step 2)."""
    out = set()
    for item in rule.body:
        if isinstance(item, Condition) and isinstance(item.tree, exp.EQ):
            sides = (item.tree.this, item.tree.expression)
            for a, b in (sides, sides[::-1]):
                if isinstance(a, exp.Column) and isinstance(b, exp.Literal):
                    out.add(a.name)
    return out


def _closure(program: Program, atoms: list, bound: set[str]) -> tuple[set[str], dict[int, set[int]]]:
    """Definition 5.1 step 3 / 6.1 step 3: add columns of any table whose key is bound, to a fixpoint.
    Returns bound variables and, per atom, the positions bound through a key (wildcards included)."""
    whole: dict[int, set[int]] = {i: set() for i in range(len(atoms))}
    changed = True
    while changed:
        changed = False
        for i, atom in enumerate(atoms):
            if whole[i] or not program.predicates[atom.pred].keys:
                continue
            if _keys_bound(program, atom.pred, atom.args, bound, whole[i]) is not None:
                whole[i] = set(range(len(atom.args)))
                bound |= atom.variables()
                changed = True
    return bound, whole


def _describe(program: Program, atom, i: int, bound: set[str], whole: dict[int, set[int]]) -> list[str]:
    pred = program.predicates[atom.pred]
    return [f"{atom.pred}.{c}" for pos, c in enumerate(pred.columns)
            if _column_bound(pos, atom.args, bound, whole.get(i, set()))]


def _missing_key(program: Program, table: str) -> str:
    keys = program.predicates[table].keys
    if not keys:
        return f"{table} has no declared key (declare `key:` or `unique:` for it)"
    return (f"the bound columns include no key of {table} (add {' or '.join('(' + ', '.join(k) + ')' for k in keys)} "
            "to the view's columns, or equate them to view columns)")


def _analyse_rule(program: Program, rule: Rule, result: KeyAnalysis) -> None:
    # EXISTS/IN/NOT EXISTS subqueries, and Datalog's negated atoms over tables (a NOT EXISTS of one table)
    subquery = [i for i in rule.body if isinstance(i, Literal) and (
        program.predicates[i.atom.pred].role in SUBQUERY
        or (i.negated and program.predicates[i.atom.pred].kind == Kind.BASE))]
    top = [i.atom for i in rule.body if isinstance(i, Literal) and not i.negated and i not in subquery]
    # 003 Definition 5.1: projected columns, columns equal to constants, then keys to a fixpoint
    bound = {a.name for a in rule.head.args if isinstance(a, Var)} | _constant_vars(rule)
    bound, whole = _closure(program, top, bound)
    for i, atom in enumerate(top):
        result.bound += [c for c in _describe(program, atom, i, bound, whole) if c not in result.bound]
    for i, atom in enumerate(top):
        ref = Reference(atom.pred, "top-level")
        key = _keys_bound(program, atom.pred, atom.args, bound, whole[i])
        if program.predicates[atom.pred].kind != Kind.BASE:
            why = f"{_label(program, atom.pred)} has no declared key (key-based maintenance needs base tables)"
            ref.decisions = {"insert": (Decision.INCREMENTAL, "inserts are checked against the view (\"not in V\")"),
                             "delete": (Decision.REMATERIALIZE, why), "update": (Decision.REMATERIALIZE, why)}
        elif key is not None:  # 003 Definition 5.4 and Theorems 5.5-5.7
            ok = f"safe: the bound columns include the key ({', '.join(key)}) (003 Def. 5.4)"
            ref.decisions = {op: (Decision.INCREMENTAL, ok) for op in OPERATIONS}
        else:
            why = "unsafe: " + _missing_key(program, atom.pred)
            ref.decisions = {"insert": (Decision.INCREMENTAL,
                                        "inserts are checked against the view (\"not in V\", 003 §5.4)"),
                             "delete": (Decision.REMATERIALIZE, why), "update": (Decision.REMATERIALIZE, why)}
        result.references.append(ref)
    if not all(_keys_bound(program, a.pred, a.args, bound, whole[i]) for i, a in enumerate(top)):
        result.may_have_duplicates = True  # 003 Theorem 5.3 does not apply
    for lit in subquery:
        _analyse_nested(program, lit, bound, result)


def _label(program: Program, pred: str) -> str:
    p = program.predicates[pred]
    return f"view {pred}" if p.kind == Kind.VIEW else f"the subquery {pred} of view {p.owner}"


def _analyse_nested(program: Program, lit: Literal, outer_bound: set[str], result: KeyAnalysis) -> None:
    """003 §6 (EXISTS, IN) and §7 (NOT EXISTS): correlated bound columns C(V) and safety."""
    nested_rules = program.rules_for(lit.atom.pred) or [Rule(lit.atom, (Literal(lit.atom),))]
    for rule in nested_rules:
        atoms = [i.atom for i in rule.body if isinstance(i, Literal) and not i.negated]
        # Definition 6.1 step 1 (and §6.3 for IN): nested columns equal to a bound outer column
        correlated = {h.name for h, o in zip(rule.head.args, lit.atom.args, strict=True)
                      if isinstance(h, Var) and isinstance(o, Var) and o.name in outer_bound}
        correlated |= _constant_vars(rule)  # step 2
        correlated, whole = _closure(program, atoms, correlated)  # step 3
        # Definition 7.1: the nested predicate refers only to nested columns, bound outer columns, constants
        i_safe = all(isinstance(o, Const) or (isinstance(o, Var) and o.name in outer_bound) for o in lit.atom.args)
        context = "not exists" if lit.negated else "exists"
        for i, atom in enumerate(atoms):
            if program.predicates[atom.pred].kind != Kind.BASE:
                continue  # the probe of outer bindings a theta-correlated subquery joins with
            ref = Reference(atom.pred, context)
            key = _keys_bound(program, atom.pred, atom.args, correlated, whole[i])
            keyed = f"the correlated bound columns include the key ({', '.join(key)})" if key else ""
            if not lit.negated:  # 003 Definition 6.3, Theorems 6.4-6.6
                if key:
                    ref.decisions = {op: (Decision.INCREMENTAL, f"safe in EXISTS/IN: {keyed} (003 Def. 6.3)")
                                     for op in OPERATIONS}
                else:
                    why = _missing_key(program, atom.pred).replace("bound columns", "correlated bound columns")
                    ref.decisions = {"insert": (Decision.INCREMENTAL,
                                                f"unsafe in EXISTS/IN; inserts are checked against "
                                                               f"the view (003 §6.2); {why}"),
                                     "delete": (Decision.REMATERIALIZE, why), "update": (Decision.REMATERIALIZE, why)}
            else:  # 003 Definitions 7.1 and 7.3, Theorems 7.2-7.5
                not_i = ("not I-safe: the NOT EXISTS predicate refers to outer columns that are not bound "
                         "(003 Def. 7.1)")
                ins = (Decision.INCREMENTAL, "I-safe (003 Def. 7.1)") if i_safe else (Decision.REMATERIALIZE, not_i)
                if i_safe and key:
                    du = (Decision.INCREMENTAL, f"DU-safe: I-safe and {keyed} (003 Def. 7.3)")
                elif i_safe:
                    du = (Decision.REMATERIALIZE, "not DU-safe: " + _missing_key(program, atom.pred)
                          .replace("bound columns", "correlated bound columns"))
                else:
                    du = (Decision.REMATERIALIZE, not_i)
                ref.decisions = {"insert": ins, "delete": du, "update": du}
            result.references.append(ref)


def select_expressions(program: Program, pred: str) -> list[Rule] | str:
    """The select expressions of a view (003 §8): its rules, looking through the UNION and INTERSECT
    rules the SQL front end writes over the sides' predicates; or why 003 does not apply."""
    out: list[Rule] = []
    for rule in program.rules_for(pred):
        if any(isinstance(i, GroupBy | SetOf) for i in rule.body):
            return "the view aggregates; 003's rules cover select-project-join views (counting maintains aggregates)"
        if any(isinstance(i, Unnest)
               or (isinstance(i, Literal) and program.predicates[i.atom.pred].kind == "extraction")
               for i in rule.body):
            return "the view unnests a nested collection; 003 covers flat tables (002's extraction maintains it)"
        sides = [i for i in rule.body if isinstance(i, Literal) and program.predicates[i.atom.pred].role == "setop"]
        if not sides:
            out.append(rule)
            continue
        if any(i.negated for i in sides):
            return "EXCEPT is outside 003's view language (counting maintains it, 000 Definition 6.1)"
        for side in sides:
            inner = select_expressions(program, side.atom.pred)
            if isinstance(inner, str):
                return inner
            out += inner
    return out


def analyse(program: Program, view: str) -> KeyAnalysis:
    """003's key-based analysis of ``view``."""
    pred = program.predicates[view]
    result = KeyAnalysis(view, True, distinct=pred.semantics == "set")
    rules = select_expressions(program, view)
    if isinstance(rules, str):
        return KeyAnalysis(view, False, rules)
    for rule in rules:
        _analyse_rule(program, rule, result)
    if result.may_have_duplicates and not result.distinct:
        result.applicable = False
        result.reason = ("the view may contain duplicates (the bound columns do not include a key of every "
                         "top-level table, 003 Theorem 5.3): key-based maintenance needs DISTINCT; counting keeps "
                         "derivation counts instead")
    return result
