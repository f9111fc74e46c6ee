"""The benchmark's data and changes: TPC-H from ``tpchgen-cli`` with refresh sets in the style of RF1/RF2,
and a generated graph for a transitive closure. Changes are written as ivm change files (Parquet, the
native format) with pyarrow, outside Spark: they are the benchmark's input, not ivm's work."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: the columns the views use, per table, with their ivm (Spark SQL) types and keys
TPCH_TABLES = {
    "lineitem": {"columns": {"l_orderkey": "bigint", "l_linenumber": "int", "l_suppkey": "bigint",
                             "l_quantity": "decimal(15,2)", "l_extendedprice": "decimal(15,2)",
                             "l_discount": "decimal(15,2)", "l_tax": "decimal(15,2)", "l_returnflag": "string",
                             "l_linestatus": "string", "l_shipdate": "date"},
                 "key": ["l_orderkey", "l_linenumber"], "references": {"l_orderkey": "orders.o_orderkey"}},
    "orders": {"columns": {"o_orderkey": "bigint", "o_custkey": "bigint", "o_orderdate": "date",
                           "o_shippriority": "int"}, "key": ["o_orderkey"],
               "references": {"o_custkey": "customer.c_custkey"}},
    "customer": {"columns": {"c_custkey": "bigint", "c_mktsegment": "string", "c_nationkey": "bigint"},
                 "key": ["c_custkey"]},
    "supplier": {"columns": {"s_suppkey": "bigint", "s_nationkey": "bigint"}, "key": ["s_suppkey"]},
    "nation": {"columns": {"n_nationkey": "bigint", "n_name": "string", "n_regionkey": "bigint"},
               "key": ["n_nationkey"]},
    "region": {"columns": {"r_regionkey": "bigint", "r_name": "string"}, "key": ["r_regionkey"]},
}

#: views shaped like TPC-H Q1 (an aggregate over lineitem), Q3 and Q5 (multi-join aggregates)
TPCH_VIEWS = {
    "q1": """SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base_price,
       sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
       sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
       avg(l_quantity) AS avg_qty, avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc,
       count(*) AS count_order
FROM lineitem WHERE l_shipdate <= DATE '1998-09-02' GROUP BY l_returnflag, l_linestatus""",
    "q3": """SELECT l.l_orderkey, o.o_orderdate, o.o_shippriority,
       sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue
FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey JOIN lineitem l ON l.l_orderkey = o.o_orderkey
WHERE c.c_mktsegment = 'BUILDING' AND o.o_orderdate < DATE '1995-03-15' AND l.l_shipdate > DATE '1995-03-15'
GROUP BY l.l_orderkey, o.o_orderdate, o.o_shippriority""",
    "q5": """SELECT n.n_name, sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue
FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey JOIN lineitem l ON l.l_orderkey = o.o_orderkey
JOIN supplier s ON l.l_suppkey = s.s_suppkey AND c.c_nationkey = s.s_nationkey
JOIN nation n ON s.s_nationkey = n.n_nationkey JOIN region r ON n.n_regionkey = r.r_regionkey
WHERE r.r_name = 'ASIA' AND o.o_orderdate >= DATE '1994-01-01' AND o.o_orderdate < DATE '1995-01-01'
GROUP BY n.n_name""",
}

#: set-semantics projections for counting vs REDUCE (004): ``nations`` — which customer nations buy from
#: which supplier nations — derives each of its ≤ 625 tuples along thousands of join paths (and orders
#: give it no column, so 004's existing relation for an order is every other order); ``order_nations``
#: — the supplier nations of each order's lineitems — holds orders' key (Theorem 3)
PROJECTION_VIEWS = {
    "nations": """SELECT DISTINCT c.c_nationkey, s.s_nationkey
FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey JOIN lineitem l ON l.l_orderkey = o.o_orderkey
JOIN supplier s ON l.l_suppkey = s.s_suppkey""",
    "order_nations": """SELECT DISTINCT o.o_orderkey, s.s_nationkey
FROM orders o JOIN lineitem l ON l.l_orderkey = o.o_orderkey JOIN supplier s ON l.l_suppkey = s.s_suppkey""",
}

#: views CReaM (001) maintains: ``cust_dates`` — each customer's set of order dates, a Datalog ``setof``
#: over their projection (a setof's free variables group it, as in Prolog: over ``orders(O, C, D, P)``
#: each order would be a group of its own), maintained with 001 §3's Δ1-Δ6 (Case 1: the view holds
#: every outer variable, so its stored sets are its own auxiliary view); ``supp_median`` — a
#: non-distributive aggregate over one table (001 §5: self-maintainable, the touched groups recomputed
#: from the stored multiset of their arguments, the table never read). Definitions as the project file
#: takes them.
#: (``plain``: the SQL a user without ivm runs for T_plain, where Spark SQL does not know the view's own
#: aggregate; not part of the project file)
SUPP_GEO_PLAIN = ("SELECT l_suppkey, exp(avg(ln(l_extendedprice))) AS geo_price, count(*) AS items FROM lineitem "
                  "GROUP BY l_suppkey")
CREAM_VIEWS = {
    "cust_dates": {"datalog": "cust_date(C, D) :- orders(O, C, D, P).\n"
                              "cust_dates(C, S) :- setof(D, cust_date(C, D), S)."},
    "supp_median": {"sql": "SELECT l_suppkey, median(l_extendedprice) AS med_price, count(*) AS items "
                           "FROM lineitem GROUP BY l_suppkey"},
    # a user-defined aggregate per supplier, two ways (#48, item 5): declared inductively with retract (001
    # §2: kept from its state per group, the GROUP BY's input never stored or read), and the same function
    # as a Spark SQL expression over the group's values (recomputed for the touched groups from their
    # stored multisets, as supp_median)
    "supp_geo": {"sql": "SELECT l_suppkey, geo_mean(l_extendedprice) AS geo_price, count(*) AS items "
                        "FROM lineitem GROUP BY l_suppkey", "plain": SUPP_GEO_PLAIN},
    "supp_geo_array": {"sql": "SELECT l_suppkey, geo_mean_array(l_extendedprice) AS geo_price, count(*) AS items "
                              "FROM lineitem GROUP BY l_suppkey", "plain": SUPP_GEO_PLAIN},
}

#: the user-defined aggregates the views above call (the project file's ``aggregates``)
AGGREGATES = {
    "geo_mean": {"initial": "named_struct('n', 0L, 'logs', 0D)",
                 "iterate": "named_struct('n', state.n + 1, 'logs', state.logs + ln(x))",
                 "merge": "named_struct('n', state.n + other.n, 'logs', state.logs + other.logs)",
                 "final": "CASE WHEN state.n > 0 THEN exp(state.logs / state.n) END",
                 "retract": "named_struct('n', state.n - 1, 'logs', state.logs - ln(x))"},
    "geo_mean_array": {"sql": "CASE WHEN size(vals) > 0 "
                              "THEN exp(aggregate(vals, 0D, (s, v) -> s + ln(v)) / size(vals)) END"},
}

CLOSURE_TABLES = {"edge": {"columns": {"src": "bigint", "dst": "bigint"}, "key": ["src", "dst"]}}
CLOSURE_VIEWS = {"reach": """WITH RECURSIVE r(src, dst) AS (
  SELECT src, dst FROM edge UNION SELECT r.src, e.dst FROM r JOIN edge e ON r.dst = e.src)
SELECT src, dst FROM r"""}


def tables_read(view: str) -> list[str]:
    return {"q1": ["lineitem"], "q3": ["customer", "orders", "lineitem"],
            "q5": ["customer", "orders", "lineitem", "supplier", "nation", "region"], "reach": ["edge"],
            "nations": ["customer", "orders", "lineitem", "supplier"],
            "order_nations": ["orders", "lineitem", "supplier"], "cust_dates": ["orders"],
            "supp_median": ["lineitem"], "supp_geo": ["lineitem"], "supp_geo_array": ["lineitem"]}[view.split("@")[0]]


def tpch(sf: float, root: Path) -> Path:
    """TPC-H at scale factor ``sf`` (tpchgen-cli, cached), cut to the columns the views use."""
    out = root / f"tpch-sf{sf:g}"
    if (out / "done").exists():
        return out
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    cli = Path(sys.executable).parent / "tpchgen-cli"
    subprocess.run([str(cli), "parquet", "-s", f"{sf:g}", f"--output-dir={raw}",
                    "--tables=lineitem,orders,customer,supplier,nation,region"], check=True)
    for name, spec in TPCH_TABLES.items():
        t = pq.read_table(raw / f"{name}.parquet", columns=list(spec["columns"]))
        # string_view -> string, as every Parquet reader knows it
        t = t.cast(pa.schema([pa.field(f.name, pa.string() if pa.types.is_string_view(f.type) else f.type)
                              for f in t.schema]))
        pq.write_table(t, out / f"{name}.parquet")
    (out / "done").write_text("ok")
    return out


@dataclass
class RefreshSets:
    """RF1/RF2-style changes: new orders with their lineitems inserted, old ones deleted with theirs."""

    data: Path
    orders: pa.Table = field(init=False)
    lineitem: pa.Table = field(init=False)
    next_key: int = field(init=False)
    deleted: int = 0
    count: int = 0

    def __post_init__(self) -> None:
        self.orders = pq.read_table(self.data / "orders.parquet")
        self.lineitem = pq.read_table(self.data / "lineitem.parquet")
        self.next_key = pc.max(self.orders["o_orderkey"]).as_py() + 1

    def make(self, fraction: float, folder: Path) -> dict[str, Path]:
        """Change files deleting and inserting ``fraction`` of the original orders (half each) with their
        lineitems; returns table -> change file."""
        n = max(1, round(fraction * self.orders.num_rows / 2))
        gone = self.orders.slice(self.deleted, n)
        self.deleted += n
        source = self.orders.slice(self.orders.num_rows - self.deleted - n, n)  # copied as new orders
        keys = pa.array(range(self.next_key, self.next_key + n), pa.int64())
        self.next_key += n
        remap = dict(zip(source["o_orderkey"].to_pylist(), keys.to_pylist(), strict=True))
        new_orders = source.set_column(0, "o_orderkey", keys)
        items = self.lineitem.filter(pc.is_in(self.lineitem["l_orderkey"], source["o_orderkey"]))
        new_items = items.set_column(0, "l_orderkey", pa.array([remap[k] for k in items["l_orderkey"].to_pylist()],
                                                               pa.int64()))
        old_items = self.lineitem.filter(pc.is_in(self.lineitem["l_orderkey"], gone["o_orderkey"]))
        self.count += 1
        folder.mkdir(parents=True, exist_ok=True)
        files = {}
        for name, deletes, inserts in [("orders", gone, new_orders), ("lineitem", old_items, new_items)]:
            both = pa.concat_tables([deletes.append_column("_change_type", pa.array(["delete"] * deletes.num_rows)),
                                     inserts.append_column("_change_type", pa.array(["insert"] * inserts.num_rows))])
            files[name] = folder / f"{name}-{self.count}.parquet"
            pq.write_table(both, files[name])
        return files


def lake_paths(root: Path, tables: list[str]) -> dict[str, str]:
    """Where `lake` writes each table."""
    return {t: str(root / "lake" / t) for t in tables}


def lake(spark, data: Path, root: Path, tables: list[str]) -> dict[str, str]:
    """The view's tables as Delta tables with the change data feed on, at `lake_paths` (written once,
    unmeasured; a table already there is kept)."""
    where = lake_paths(root, tables)
    for t in tables:
        if not (Path(where[t]) / "_delta_log").exists():
            spark.read.parquet(str(data / f"{t}.parquet")).write.format("delta") \
                .option("delta.enableChangeDataFeed", "true").save(where[t])
    return where


def commit(spark, changes: RefreshSets, fraction: float, where: dict[str, str], folder: Path) -> int:
    """One RF1/RF2 round as a pipeline commits it: per table, a MERGE deleting the old orders' rows and an
    INSERT of the new ones (two Delta commits each; Delta's DELETE takes no subquery). Returns the rows
    changed."""
    rows = 0
    for t, path in changes.make(fraction, folder).items():
        if t not in where:
            continue
        on = " AND ".join(f"t.{k} = s.{k}" for k in TPCH_TABLES[t]["key"])
        cols = ", ".join(TPCH_TABLES[t]["columns"])
        spark.sql(f"MERGE INTO delta.`{where[t]}` t USING (SELECT * FROM parquet.`{path}` WHERE _change_type = "
                  f"'delete') s ON {on} WHEN MATCHED THEN DELETE")
        spark.sql(f"INSERT INTO delta.`{where[t]}` SELECT {cols} FROM parquet.`{path}` WHERE _change_type = 'insert'")
        rows += pq.read_metadata(path).num_rows
    return rows


def graph(edges: int, root: Path, chain: int = 10) -> Path:
    """Chains of ``chain`` nodes (``chain - 1`` edges each) until about ``edges`` edges: a closure of
    about chain/2 pairs per edge that stays bounded."""
    out = root / f"graph-{edges}"
    out.mkdir(parents=True, exist_ok=True)
    blocks = max(1, edges // (chain - 1))
    src = [b * chain + i for b in range(blocks) for i in range(chain - 1)]
    pq.write_table(pa.table({"src": pa.array(src, pa.int64()), "dst": pa.array([s + 1 for s in src], pa.int64())}),
                   out / "edge.parquet")
    return out


@dataclass
class EdgeChanges:
    """Inserts join the end of one chain to the start of the next; deletes cut chains in the middle."""

    edges: int
    chain: int = 10
    joined: int = 0
    cut: int = 0
    count: int = 0

    def make(self, fraction: float, kind: str, folder: Path) -> dict[str, Path]:
        n = max(1, round(fraction * self.edges))
        if kind == "insert":  # chain b's last node -> chain b+1's first node (every other chain)
            src = [(2 * (self.joined + i)) * self.chain + self.chain - 1 for i in range(n)]
            dst = [s + 1 for s in src]
            self.joined += n
        else:  # the middle edge of chains counted from the end
            blocks = max(1, self.edges // (self.chain - 1))
            src = [(blocks - 1 - self.cut - i) * self.chain + self.chain // 2 for i in range(n)]
            dst = [s + 1 for s in src]
            self.cut += n
        self.count += 1
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"edge-{self.count}.parquet"
        pq.write_table(pa.table({"src": pa.array(src, pa.int64()), "dst": pa.array(dst, pa.int64()),
                                 "_change_type": pa.array([kind] * n)}), path)
        return {"edge": path}
