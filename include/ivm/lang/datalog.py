"""The Datalog front end (lark), as in 000 and 001.

Grammar (documented for users in docs/guide.md):

    program   := rule*
    rule      := atom [":-" item ("," item)*] "."
    item      := atom | "not" atom | comparison | groupby | setof | setagg
    setof     := "setof" "(" Y | "(" Y {"," Y} ")" "," atom "," S ")"      (001 Definition 1)
    setagg    := ("count" | "sum" | "min" | "max" | "avg") "(" S "," W ")"  (an aggregate over the set S)
    atom      := name "(" [term ("," term)*] ")"
               | Variable "(" [term ("," term)*] ")"   (HiLog: the nested collection a `nested:` column refers to)
    term      := Variable | _ | constant | arithmetic over terms
    groupby   := "groupby" "(" atom "," "[" Variables "]" "," V "=" agg "(" [V | *] ")" {"," ...} ")"
    comparison:= expr ("=" | "!=" | "<>" | "<" | "<=" | ">" | ">=") expr

Variables start with an upper-case letter (or ``_`` alone for "any value"); lower-case names and quoted
strings are string constants, numbers are numbers. ``X = expr`` with ``X`` not yet bound assigns it
(``C = C1 + C2``; arithmetic is ``+ - * /``); otherwise ``=`` compares. ``%`` (as in Prolog) and ``//``
start a comment. A view's program defines the predicate with the view's
name; other predicates it defines are auxiliary. Base predicates read tables by column position.
"""

from __future__ import annotations

import sqlglot
from lark import Lark, Token, Transformer, v_args
from lark.exceptions import LarkError, UnexpectedInput
from sqlglot import exp

from ivm.aggregates import aggregate as user_aggregate
from ivm.aggregates import over_set
from ivm.errors import ConfigError
from ivm.ir import (
    Aggregate,
    Assign,
    Atom,
    Condition,
    Const,
    Expr,
    GroupBy,
    Literal,
    Rule,
    SetOf,
    Var,
    Wildcard,
)
from ivm.lang.nested import COLLECTION_VARIABLE

GRAMMAR = r"""
    program: rule*
    rule: atom (":-" body)? "."
    body: item ("," item)*
    ?item: negation | groupby | setof | comparison | atom
    negation: "not" atom
    groupby: "groupby" "(" atom "," "[" [VAR ("," VAR)*] "]" "," aggregate ("," aggregate)* ")"
    aggregate: VAR "=" NAME "(" [AGGARG] ")"
    setof: "setof" "(" elements "," atom "," VAR ")"
    elements: VAR | "(" VAR ("," VAR)* ")"
    AGGARG: VAR | "*"
    comparison: sum COMPARATOR sum
    COMPARATOR: "<=" | ">=" | "!=" | "<>" | "=" | "<" | ">"
    atom: NAME "(" [sum ("," sum)*] ")"
        | VAR "(" [sum ("," sum)*] ")" -> collection
    ?sum: product | sum ADDOP product -> binary
    ?product: unary | product MULOP unary -> binary
    ?unary: "-" unary -> neg | primary
    ?primary: VAR -> var
            | "_" -> wildcard
            | NAME -> name_const
            | NUMBER -> number
            | STRING -> string
            | "(" sum ")"
    ADDOP: "+" | "-"
    MULOP: "*" | "/"
    VAR: /[A-Z][A-Za-z0-9_]*/
    NAME: /[a-z][A-Za-z0-9_]*/
    STRING: /'[^']*'/ | /"[^"]*"/
    // a fraction needs digits after the point: in `M <= 2.` the point ends the rule
    NUMBER: /\d+(\.\d+)?([eE][+-]?\d+)?/
    %import common.WS
    COMMENT: /%[^\n]*/ | /\/\/[^\n]*/
    %ignore WS
    %ignore COMMENT
"""

_PARSER = Lark(GRAMMAR, start="program", parser="lalr")

_BINOPS = {"+": exp.Add, "-": exp.Sub, "*": exp.Mul, "/": exp.Div}
#: 001 §2: aggregates are predicates over sets, ``count(S, W)``; each is a Spark SQL expression over
#: the array that holds the set (no Python in the loop)
SET_AGGREGATES = {
    "count": "size({s})",
    "sum": "aggregate({s}, CAST(0 AS BIGINT), (acc, x) -> acc + x)",
    "min": "array_min({s})",
    "max": "array_max({s})",
    "avg": "aggregate({s}, CAST(0 AS DOUBLE), (acc, x) -> acc + x) / size({s})",
    # the middle element of the (sorted) set, or the mean of the two middle ones
    "median": "CASE WHEN size({s}) % 2 = 1 THEN CAST(element_at({s}, CAST(size({s}) DIV 2 + 1 AS INT)) AS DOUBLE) "
              "WHEN size({s}) > 0 THEN (CAST(element_at({s}, CAST(size({s}) DIV 2 AS INT)) AS DOUBLE) "
              "+ CAST(element_at({s}, CAST(size({s}) DIV 2 + 1 AS INT)) AS DOUBLE)) / 2 END",
}

_COMPARE = {"=": exp.EQ, "!=": exp.NEQ, "<>": exp.NEQ, "<": exp.LT, "<=": exp.LTE, ">": exp.GT, ">=": exp.GTE}


def _tree(term) -> exp.Expression:
    """A term as a sqlglot expression (variables as column references)."""
    if isinstance(term, Var):
        return exp.column(term.name, quoted=True)
    if isinstance(term, Const):
        v = term.value
        return exp.Null() if v is None else exp.Literal.string(v) if isinstance(v, str) else exp.Literal.number(v)
    if isinstance(term, Expr):
        return term.tree
    raise ValueError("_ (any value) cannot be used in an expression")


@v_args(inline=True)
class _ToIR(Transformer):
    def var(self, tok: Token):
        return Var(str(tok))

    def wildcard(self):
        return Wildcard()

    def name_const(self, tok: Token):
        return Const(str(tok))

    def number(self, tok: Token):
        text = str(tok)
        return Const(int(text) if text.lstrip("-").isdigit() else float(text))

    def string(self, tok: Token):
        return Const(str(tok)[1:-1])

    def neg(self, term):
        if isinstance(term, Const) and isinstance(term.value, int | float):
            return Const(-term.value)
        return Expr(exp.Neg(this=_tree(term)))

    def binary(self, left, op: Token, right):
        return Expr(exp.Paren(this=_BINOPS[str(op)](this=_tree(left), expression=_tree(right))))

    def atom(self, name: Token, *args):
        return Atom(str(name), tuple(a for a in args if a is not None))

    def collection(self, var: Token, *args):
        """HiLog's ``Y(Z, A)``: the nested collection Y refers to (002 Example 2.1), resolved against the
        project's ``nested:`` columns by ivm.lang.nested.resolve_collections."""
        return Atom(COLLECTION_VARIABLE + str(var), tuple(a for a in args if a is not None))

    def negation(self, atom: Atom):
        return Literal(atom, negated=True)

    def comparison(self, left, op: Token, right):
        return ("cmp", str(op), left, right)

    def aggregate(self, var: Token, func: Token, arg: Token | None = None):
        target = None if arg is None or str(arg) == "*" else Expr(exp.column(str(arg), quoted=True))
        return Aggregate(Var(str(var)), str(func).lower(), target)

    def groupby(self, atom: Atom, *rest):
        by = tuple(Var(str(t)) for t in rest if isinstance(t, Token))
        aggs = tuple(a for a in rest if isinstance(a, Aggregate))
        return GroupBy(atom, by, aggs)

    def elements(self, *names: Token):
        return tuple(Var(str(n)) for n in names)

    def setof(self, elements, atom: Atom, result: Token):
        return SetOf(elements, atom, Var(str(result)))

    def body(self, *items):
        return list(items)

    def rule(self, head: Atom, body=None):
        return (head, body or [])

    def program(self, *rules):
        return list(rules)


def _set_aggregate(atom: Atom, view: str, udas: dict) -> Assign:
    """``count(S, W)`` over a setof result S: W = the aggregate of the set (001 §2); built-in or
    registered in the project file."""
    if len(atom.args) != 2 or not isinstance(atom.args[1], Var):
        raise ConfigError(f"views.{view}: {atom}: an aggregate over a set takes the set and a result variable")
    s, w = atom.args
    if atom.pred in udas:
        text = over_set(atom.pred, udas[atom.pred], s.name)
    else:
        text = SET_AGGREGATES[atom.pred].format(s=f"`{s.name}`")
    return Assign(w, Expr(sqlglot.parse_one(text, read="spark")))


def _user_groupby(g: GroupBy, view: str, udas: dict) -> GroupBy:
    """A groupby subgoal whose aggregates include registered ones."""
    aggs = tuple(user_aggregate(a.func, udas[a.func], a.var, a.arg, a.distinct)
                 if a.func in udas and a.arg is not None else a for a in g.aggregates)
    return GroupBy(g.atom, g.by, aggs)


def parse_program(text: str, view: str, aggregates: dict | None = None) -> list[Rule]:
    """Parse a view's Datalog program into rules. Errors name the view and the line."""
    try:
        parsed = _ToIR().transform(_PARSER.parse(text))
    except UnexpectedInput as e:
        token = getattr(e, "token", None)
        what = ("unexpected end of program" if token is not None and token.type == "$END"
                else f"unexpected {str(token)!r}" if token is not None else "unexpected character")
        raise ConfigError(f"views.{view}: Datalog syntax error at line {e.line}, column {e.column}: {what}") from e
    except (LarkError, ValueError) as e:
        raise ConfigError(f"views.{view}: {str(e).strip().splitlines()[-1]}") from e
    udas = aggregates or {}
    rules = []
    for head, items in parsed:
        sets = {i.result.name for i in items if isinstance(i, SetOf)}
        items = [_set_aggregate(i, view, udas) if isinstance(i, Atom) and (i.pred in SET_AGGREGATES or i.pred in udas)
                 and i.args and isinstance(i.args[0], Var) and i.args[0].name in sets else i for i in items]
        items = [_user_groupby(i, view, udas) if isinstance(i, GroupBy) else i for i in items]
        bound: set[str] = set()
        for item in items:
            if isinstance(item, Literal) and not item.negated:
                bound |= item.atom.variables()
            elif isinstance(item, Atom):
                bound |= item.variables()
            elif isinstance(item, GroupBy | SetOf):
                bound |= item.variables()
        body = []
        for item in items:
            if isinstance(item, Atom):
                body.append(Literal(item))
            elif isinstance(item, tuple):
                _, op, left, right = item
                # X = expr with X bound nowhere else binds X (000 §6.2's C = C1 + C2)
                if op == "=" and isinstance(left, Var) and left.name not in bound:
                    body.append(Assign(left, right if isinstance(right, Expr) else Expr(_tree(right))))
                    bound.add(left.name)
                else:
                    body.append(Condition(_COMPARE[op](this=_tree(left), expression=_tree(right))))
            else:
                body.append(item)
        rules.append(Rule(head, tuple(body)))
    if not rules:
        raise ConfigError(f"views.{view}: the Datalog program has no rules")
    return rules
