"""User-defined aggregates (docs/design.md §5, 001 §2), registered in the project file:

    aggregates:
      spread:   {sql: "array_max(vals) - array_min(vals)"}              # Spark SQL over the array
      pymean:   {python: "mystats:mean", returns: double}                   # Python over a list
      geo_mean:                                                             # inductive (001 §2)
        initial: "named_struct('n', 0L, 'logs', 0D)"
        iterate: "named_struct('n', state.n + 1, 'logs', state.logs + ln(x))"
        merge:   "named_struct('n', state.n + other.n, 'logs', state.logs + other.logs)"
        final:   "CASE WHEN state.n > 0 THEN exp(state.logs / state.n) END"
        retract: "named_struct('n', state.n - 1, 'logs', state.logs - ln(x))"

A SQL aggregate is an expression over the array ``vals``: in a GROUP BY it receives the group's values
(``collect_list``, or ``collect_set`` with DISTINCT), over a Datalog set the set itself; it runs in the
JVM. A Python aggregate is a function of a list, applied the same way through a scalar UDF registered as
``<name>__py`` (a pandas grouped-aggregate UDF cannot share a GROUP BY with other aggregates in Spark).
NULLs are not collected. An inductive aggregate is the fold of its steps over the values (ivm.ir.Inductive),
and GROUP BY maintenance keeps its state per group (ivm.maintain.groupby), where the other kinds are
recomputed for the groups a change touches.
"""

from __future__ import annotations

import importlib
import re

import sqlglot
from sqlglot import exp

from ivm.config import AggregateConfig
from ivm.errors import ConfigError
from ivm.ir import VALUES_PLACEHOLDER, Aggregate, Expr, Inductive, Var


def used_by(aggregates: dict[str, AggregateConfig], definition: str) -> list[str]:
    """The registered aggregates a view's definition calls (by name, as SQL and Datalog call them)."""
    return [n for n in aggregates if re.search(rf"\b{re.escape(n)}\s*\(", definition, re.IGNORECASE)]


def inductive(agg: AggregateConfig) -> Inductive:
    return Inductive(agg.initial, agg.iterate, agg.merge, agg.final, agg.retract)  # type: ignore[arg-type]


def aggregate(name: str, agg: AggregateConfig, out: Var, arg: Expr, distinct: bool) -> Aggregate:
    """A call of a registered aggregate in a GROUP BY (SQL) or a groupby subgoal (Datalog): the
    aggregate of the group's collected values, or an inductive one's fold over them."""
    if agg.inductive:
        return Aggregate(out, name, arg, distinct, inductive=inductive(agg))
    return Aggregate(out, name, arg, distinct, template=over_array(name, agg, VALUES_PLACEHOLDER))


def over_set(name: str, agg: AggregateConfig, set_var: str) -> str:
    """A registered aggregate applied to a set held in an array variable (001 §2)."""
    return over_array(name, agg, f"`{set_var}`")


def over_array(name: str, agg: AggregateConfig, array_sql: str) -> str:
    if agg.inductive:
        return inductive(agg).fold(array_sql)
    if agg.sql is not None:
        return sql_template(agg, array_sql)
    return f"{name}__py({array_sql})"


def sql_template(agg: AggregateConfig, array_sql: str) -> str:
    """The aggregate's expression with ``vals`` replaced by ``array_sql``."""
    tree = sqlglot.parse_one(agg.sql, read="spark")
    array = sqlglot.parse_one(array_sql, read="spark")
    return tree.transform(lambda n: array.copy() if isinstance(n, exp.Column) and n.name == "vals"
                          else n).sql(dialect="spark")


def load_function(name: str, agg: AggregateConfig):
    module, _, attr = (agg.python or "").partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"aggregates.{name}.python: cannot load {agg.python!r}: {e}") from e


def _over_list(fn):
    def apply(values):
        return None if values is None else fn([v for v in values if v is not None])
    return apply


def register(spark, aggregates: dict[str, AggregateConfig]) -> None:
    """Register each Python aggregate as a scalar UDF ``<name>__py`` over the array of collected
    values (SQL aggregates need nothing: they are Spark SQL already). Where Spark's Python workers may
    run elsewhere (a Spark Connect server, a cluster: `ivm.spark.runs_elsewhere`), the ivm package and the
    module that defines the function are shipped to them as Python artifacts (the UDF refers to the
    module by name)."""
    from pyspark.sql.functions import udf

    from ivm.spark import runs_elsewhere, ship_package, ship_python

    python = {name: agg for name, agg in aggregates.items() if agg.python is not None}
    elsewhere = bool(python) and runs_elsewhere(spark)
    if elsewhere:
        ship_package(spark)
    for name, agg in python.items():
        fn = load_function(name, agg)
        source = _source(fn.__module__) if elsewhere else None
        if source is not None:
            ship_python(spark, source)
        spark.udf.register(f"{name}__py", udf(_over_list(fn), agg.returns))


def _source(module: str):
    """The file of ``module``'s top-level module, or its package's folder; None for a module of the
    standard library or of an installed distribution, which Spark's Python workers have."""
    import sys
    import sysconfig
    from pathlib import Path

    where = getattr(sys.modules[module.split(".")[0]], "__file__", None)
    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "purelib", "platlib")}
    if where is None or any(p in Path(where).resolve().parents for p in installed):
        return None
    path = Path(where)
    return path.parent if path.name == "__init__.py" else path
