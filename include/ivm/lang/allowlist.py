"""Accept by allowlist: a view's SQL may use only what the front end (ivm.lang.sql) knows how to turn
into rules that ivm maintains and recomputes alike. Everything else is refused at `ivm apply` with one
line naming the view and the construct — never dropped, never approximated.

`check` walks the parsed view before it is compiled. A node passes when its class is in `QUERY` (the
shape of a query the compiler reads), `SCALARS` (row-by-row expressions), `FUNCTIONS` (deterministic
scalar functions Spark provides, by sqlglot's class, and more by name in `NAMED_FUNCTIONS`),
`GENERATORS` (LATERAL VIEW's explode and inline, 002's extraction of a nested collection) or the
aggregates the compiler maps (`ivm.lang.sql.AGGREGATES`), or when it calls one of the project's own
aggregates, and window functions (`ivm.lang.window_functions.WINDOW_FUNCTIONS`, or such an
aggregate) in a SELECT list or QUALIFY. The families the front end cannot maintain yet get a message
of their own: other window functions, TABLESAMPLE, the FILTER of an aggregate that does not skip NULL, a query where a
value stands other than a parenthesized scalar subquery (ivm.lang.aggregate_filters rewrites the other
FILTERs, count_if and counts over several columns first; ivm.lang.scalar_subqueries decorrelates scalar
subqueries into joins after qualification, and refuses what it cannot),
nondeterministic functions (no view can be maintained over them: its rows must follow from its tables).
What an EXISTS / IN / ANY subquery's compilation would drop (its GROUP BY, HAVING, aggregates, ORDER BY,
LIMIT) is refused where it is compiled (`ivm.lang.sql.SqlCompiler._correlated`), once the groupings of
EXISTS and IN it can read have been read through a subquery in FROM (ivm.lang.grouped_in).

>>> import sqlglot
>>> refusal(sqlglot.parse_one("SELECT k, count(*) FROM t GROUP BY k", read="spark"), {exp.Count: "count"}, set())
>>> refusal(sqlglot.parse_one("SELECT k, rand() FROM t", read="spark"), {}, set())
"nondeterministic function RAND() is refused: a view's rows must follow from its tables"
>>> refusal(sqlglot.parse_one("SELECT row_number() OVER (ORDER BY k) FROM t", read="spark"), {}, set())
>>> refusal(sqlglot.parse_one("SELECT collect_list(k) OVER (ORDER BY k) FROM t", read="spark"), {}, set())
'window function COLLECT_LIST(k) OVER (...) is not supported yet'
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlglot import exp

from ivm.errors import ConfigError
from ivm.lang.window_functions import WINDOW_FUNCTIONS, function


class Refused(ConfigError):
    """A construct outside the allowlist (exit 2, like every bad definition)."""


def _classes(names: str) -> tuple[type[exp.Expression], ...]:
    return tuple(getattr(exp, n) for n in names.split())


#: the shape of a query: blocks, sources, joins, set operators, subqueries in FROM, IN, EXISTS and ANY
QUERY = _classes("Select From Join Where Group Having Qualify Union Intersect Except Subquery With CTE Table "
                 "TableAlias Lateral Alias Column Identifier Star Distinct In Exists Any Tuple Var Hint")
#: expressions Spark evaluates row by row, the same every time
SCALARS = _classes("Literal Null Boolean Paren Neg Add Sub Mul Div IntDiv Mod EQ NEQ GT GTE LT LTE NullSafeEQ "
                   "NullSafeNEQ And Or Not Is Between Like ILike RegexpLike Case If DataType DataTypeParam Cast "
                   "TryCast Interval Bracket Dot Array Struct PropertyEQ BitwiseAnd BitwiseOr BitwiseXor BitwiseNot "
                   "BitwiseLeftShift BitwiseRightShift DPipe Lambda Transform ArrayFilter")
#: Spark's deterministic scalar functions that sqlglot models, by its class
FUNCTIONS = _classes("Coalesce Nullif Greatest Least Concat ConcatWs Upper Lower Length Substring Trim Initcap "
                     "Left Right Pad Reverse Repeat StrPosition RegexpExtract RegexpReplace RegexpSplit Abs Round "
                     "Floor Ceil Sqrt Pow Exp Ln Log Sign Year Month Day Quarter DayOfWeek DayOfMonth DayOfYear "
                     "WeekOfYear Hour Minute Second Extract DateAdd DateSub TsOrDsAdd DateDiff AddMonths "
                     "MonthsBetween LastDay DateTrunc TimestampTrunc TsOrDsToDate StrToDate TimeToStr ArraySize "
                     "ArrayContains ArraySort StructExtract MD5 SHA SHA2 ToBase64 FromBase64 Format TimestampFromParts "
                     "TimeStrToTime StrToTime UnixToStr UnixToTime StrToUnix NextDay Chr Ascii BitLength Translate "
                     "Replace Overlay ArrayToString ArraySlice GenerateSeries IsNan Pi Rint Factorial WidthBucket "
                     "JSONFormat FromJson JSONExtractScalar SafeDivide SafeAdd EqualNull Levenshtein Soundex Space "
                     "Typeof")
#: more of Spark's deterministic scalar functions, by name: a call sqlglot does not model (Anonymous), or
#: one it models under this name (`exp.Func.sql_names`)
NAMED_FUNCTIONS = frozenset(
    "pmod nvl ifnull nvl2 nanvl isnull isnotnull cardinality size element_at named_struct hash xxhash64 crc32 "
    "array_sort sort_array array_distinct array_max array_min array_position array_remove array_union "
    "array_intersect array_except arrays_overlap flatten lcase ucase char_length character_length btrim ltrim "
    "rtrim split_part startswith endswith contains format_number format_string printf to_timestamp date_part "
    "datepart make_date make_timestamp unix_date date_from_unix_date bin hex unhex base64 unbase64 conv degrees "
    "radians sin cos tan asin acos atan atan2 log10 log2 log1p cbrt signum positive negative bround weekday "
    "octet_length array_repeat zip_with forall exists hypot e sentences decimal int bigint smallint tinyint "
    "double float string boolean date timestamp binary".split())
#: LATERAL VIEW explode / inline (and SELECT explode(...)): 002's extraction of a nested collection
GENERATORS = _classes("Explode Posexplode Inline Unnest")  # (their OUTER forms are subclasses)
#: functions whose value is not a function of the row: a view over them has no state to maintain
NONDETERMINISTIC = _classes("Rand Randn Uuid CurrentTimestamp CurrentDate CurrentTime Localtimestamp Shuffle")
NONDETERMINISTIC_NAMES = frozenset(
    "now rand random randn uuid shuffle monotonically_increasing_id spark_partition_id input_file_name "
    "input_file_block_start input_file_block_length current_timezone current_user user session_user "
    "current_catalog current_database current_schema".split())

#: where a query may stand: a source, a CTE, a set operator's side, parentheses, the query of EXISTS /
#: ANY, and IN's ``query``; anywhere else it is a value (a scalar subquery)
_QUERY_PLACES = (exp.From, exp.Join, exp.With, exp.CTE, exp.Union, exp.Intersect, exp.Except, exp.Lateral,
                 exp.Exists, exp.Any, exp.Subquery)


def scalar_subquery(node: exp.Expression) -> bool:
    """A query where a value stands (not a source, a set operator's side, the query of IN / EXISTS / ANY)."""
    if not isinstance(node, (exp.Select, exp.Subquery)) or node.parent is None:
        return False
    if isinstance(node.parent, exp.In):
        return node.arg_key != "query"
    return not isinstance(node.parent, _QUERY_PLACES)


def _in_window(node: exp.Expression) -> bool:
    """Whether ``node`` is part of a window: its function, OVER (...), IGNORE / RESPECT NULLS."""
    parent = node.parent
    while isinstance(parent, exp.Order | exp.Ordered | exp.IgnoreNulls | exp.RespectNulls):
        parent = parent.parent
    return isinstance(parent, exp.Window)


def _window_refusal(node: exp.Window, aggregates: dict) -> str | None:
    """A window function is allowed in a SELECT list or QUALIFY, over a function of `WINDOW_FUNCTIONS`
    or an aggregate the compiler maps (not a project's own aggregate)."""
    fn = function(node)
    if not isinstance(fn, WINDOW_FUNCTIONS) and type(fn) not in aggregates:
        return f"window function {fn.sql(dialect='spark')} OVER (...) is not supported yet"
    if node.args.get("alias") is not None or not node.args.get("over"):
        return (f"a named window ({node.sql(dialect='spark')}) is not supported yet: spell its PARTITION BY and "
                "ORDER BY in OVER (...)")
    if fn.find(exp.Distinct):
        return (f"DISTINCT in the window function {node.sql(dialect='spark')} is refused (Spark has no DISTINCT "
                "window aggregate)")
    if isinstance(fn, WINDOW_FUNCTIONS) and node.args.get("order") is None:
        return f"the window function {fn.sql(dialect='spark')} needs ORDER BY in its OVER (...)"
    child, parent = node, node.parent
    while parent is not None and not isinstance(parent, exp.Select | exp.Qualify):
        if isinstance(parent, exp.Window | exp.AggFunc):
            return f"the window function {node.sql(dialect='spark')[:80]} inside {parent.sql_name()}() is refused"
        child, parent = parent, parent.parent
    if isinstance(parent, exp.Select) and child.arg_key != "expressions":
        return f"the window function {node.sql(dialect='spark')[:80]} in {child.arg_key.upper()} is refused"
    return None


def _name(node: exp.Expression) -> str:
    return node.name.upper() if isinstance(node, exp.Anonymous) else node.sql_name()


def _refusal(node: exp.Expression, aggregates: dict, udas: set[str]) -> str | None:
    """What is wrong with ``node`` alone (its children are checked on their own), or None."""
    if isinstance(node, exp.Window):
        return _window_refusal(node, aggregates)
    if isinstance(node, (exp.Order, exp.Ordered, exp.WindowSpec, exp.IgnoreNulls, exp.RespectNulls,
                         *WINDOW_FUNCTIONS)) and _in_window(node):
        return None
    if isinstance(node, exp.TableSample):
        return "TABLESAMPLE is refused: a sample of a table is not a function of the table"
    if isinstance(node, exp.Filter):
        return f"the aggregate filter {node.sql(dialect='spark')} (FILTER (WHERE ...)) is not supported yet"
    if isinstance(node, (exp.Order, exp.Ordered, exp.Limit, exp.Offset)):
        return "ORDER BY / LIMIT in a view is not supported yet"
    if isinstance(node, NONDETERMINISTIC) or (isinstance(node, exp.Anonymous)
                                              and node.name.lower() in NONDETERMINISTIC_NAMES):
        return f"nondeterministic function {_name(node)}() is refused: a view's rows must follow from its tables"
    if scalar_subquery(node) and not isinstance(node, exp.Subquery):
        return f"a query where a value stands ({node.sql(dialect='spark')[:80]}) is not supported yet"
    if isinstance(node, exp.Count) and (node.expressions or (isinstance(node.this, exp.Distinct)
                                                             and len(node.this.expressions) > 1)):
        return f"count over several columns ({node.sql(dialect='spark')}) is not supported yet"
    if isinstance(node, exp.Anonymous):
        if node.name.lower() in NAMED_FUNCTIONS or node.name.lower() in udas:
            return None
        return f"function {_name(node)}() is not supported yet"
    if type(node) in aggregates or isinstance(node, QUERY + SCALARS + FUNCTIONS + GENERATORS):
        return None
    if isinstance(node, exp.Func) and not isinstance(node, exp.AggFunc) and any(
            n.lower() in NAMED_FUNCTIONS for n in type(node).sql_names()):
        return None
    if isinstance(node, exp.AggFunc):
        return f"the aggregate {_name(node)}() is not supported yet"
    if isinstance(node, exp.Func):
        return f"function {_name(node)}() is not supported yet"
    return f"the construct {node.key.upper()} ({node.sql(dialect='spark')[:60]}) is not supported yet"


def _walk(node: exp.Expression) -> Iterable[exp.Expression]:
    """Every node of the tree, parents before children; a hint's arguments are not expressions."""
    yield node
    if isinstance(node, exp.Hint):
        return
    for child in node.iter_expressions():
        yield from _walk(child)


def refusal(tree: exp.Expression, aggregates: dict, udas: set[str]) -> str | None:
    """Why the first node of ``tree`` outside the allowlist is refused (None: every node passes).
    ``aggregates``: the aggregate classes the compiler maps; ``udas``: the project's own aggregates, by
    lower-case name."""
    return next((why for node in _walk(tree) if (why := _refusal(node, aggregates, udas)) is not None), None)


def check(tree: exp.Expression, view: str, aggregates: dict, udas: set[str]) -> None:
    """`Refused`, one line naming ``view`` and the construct, when `refusal` finds one."""
    why = refusal(tree, aggregates, udas)
    if why is not None:
        raise Refused(f"views.{view}: {why}")
