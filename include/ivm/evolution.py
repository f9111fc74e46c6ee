"""Schema evolution of a table that holds data: what `ivm apply` accepts when its columns change, in
the manner of Delta Lake's (``mergeSchema``: columns added; type widening).

* **A column added** (anywhere in the list, not to the key) is applied without a reload: the rows
  stored before it and the log segments appended before it hold no value for it, and Spark reads
  their Parquet files with the new schema as NULL there — which is what the added column is in every
  row that existed before it. Change files may go on without it (NULL): the catalog keeps the
  table's added columns (``ivm_tables.added_columns``) and the append's column check lets them be
  missing. The views and their stored state are read the same way, so a view that does not use the
  column goes on being maintained as it was; one that selects ``*`` gains the column (NULL in the rows
  it holds, as in the table's) and goes on being maintained too; `ivm apply` says so.
* **A type widened** — TINYINT → SMALLINT → INT → BIGINT, FLOAT → DOUBLE — is applied the same way:
  Spark's Parquet reader reads the narrower stored values as the wider type.
* Anything else on a stored table — a column dropped or renamed, a type narrowed or changed otherwise,
  another key — would reinterpret the stored files, and is refused with the column named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ivm.errors import ConfigError

#: type -> the types it may widen to (Spark's Parquet reader reads the stored values as those)
WIDENINGS: dict[str, tuple[str, ...]] = {"TINYINT": ("SMALLINT", "INT", "BIGINT"), "SMALLINT": ("INT", "BIGINT"),
                                         "INT": ("BIGINT",), "FLOAT": ("DOUBLE",)}


@dataclass(frozen=True)
class Evolution:
    """How a stored table's columns change in an `ivm apply`."""

    table: str
    added: list[str] = field(default_factory=list)
    #: column -> (old type, new type)
    widened: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.added or self.widened)

    def describe(self) -> list[str]:
        return ([f"table {self.table}: added column {c} (NULL in the rows it holds)" for c in self.added]
                + [f"table {self.table}: column {c} widened from {a} to {b}" for c, (a, b) in self.widened.items()])


def evolve(table: str, before: dict[str, str], before_key: list[str] | None, after: dict[str, str],
           after_key: list[str] | None) -> Evolution:
    """The evolution of a stored table's columns ``before`` -> ``after`` (name -> Spark type, as
    `ivm.config.spark_type` writes it), or a one-line ConfigError naming the column for a change that
    would reinterpret its stored files.

    >>> evolve("t", {"a": "INT", "b": "FLOAT"}, ["a"], {"a": "INT", "b": "DOUBLE", "c": "STRING"}, ["a"]).describe()
    ['table t: added column c (NULL in the rows it holds)', 'table t: column b widened from FLOAT to DOUBLE']
    >>> evolve("t", {"a": "INT", "b": "BIGINT"}, ["a"], {"a": "INT", "b": "INT"}, ["a"])
    Traceback (most recent call last):
    ivm.errors.ConfigError: tables.t: column b cannot change from BIGINT to INT: the table holds data, and only \
widening is applied (TINYINT -> SMALLINT -> INT -> BIGINT, FLOAT -> DOUBLE)
    """
    if list(before_key or []) != list(after_key or []):
        raise ConfigError(f"tables.{table}: the key cannot change from {before_key} to {after_key}: the table holds "
                          "data (reload it into a new table)")
    gone = [c for c in before if c not in after]
    if gone:
        raise ConfigError(f"tables.{table}: column {gone[0]} cannot be dropped or renamed: the table holds data "
                          "(columns may be added and widened)")
    widened = {}
    for c, old in before.items():
        new = after[c]
        if new == old:
            continue
        if new not in WIDENINGS.get(old, ()):
            raise ConfigError(f"tables.{table}: column {c} cannot change from {old} to {new}: the table holds data, "
                              "and only widening is applied (TINYINT -> SMALLINT -> INT -> BIGINT, FLOAT -> DOUBLE)")
        widened[c] = (old, new)
    return Evolution(table, [c for c in after if c not in before], widened)
