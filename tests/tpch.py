"""The 22 TPC-H queries as ivm views (#45): the specification's text (TPC-H 3.0, clause 2.4) with its
validation parameters, ORDER BY and LIMIT dropped (a view is a set of rows, not a report), in the SQL that
Spark and DuckDB both read. Q15's view ``revenue0`` is written as a CTE. The schema has every column of the
eight tables with the specification's types (DECIMAL(15,2) measures, DATE keys) and keys, and the
references RF1/RF2 keep (a line item's order, an order's customer). `Tables` holds them in DuckDB and
`round_of_changes` changes them as TPC-H's refresh functions and a user's pipelines do, writing the change
files `ivm log append` takes (tests/spark/test_tpch.py, tests/bench/many.py)."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb

_D = "decimal(15,2)"

TABLES = {
    "part": {"columns": {"p_partkey": "bigint", "p_name": "string", "p_mfgr": "string", "p_brand": "string",
                         "p_type": "string", "p_size": "int", "p_container": "string", "p_retailprice": _D,
                         "p_comment": "string"}, "key": ["p_partkey"]},
    "supplier": {"columns": {"s_suppkey": "bigint", "s_name": "string", "s_address": "string",
                             "s_nationkey": "bigint", "s_phone": "string", "s_acctbal": _D, "s_comment": "string"},
                 "key": ["s_suppkey"]},
    "partsupp": {"columns": {"ps_partkey": "bigint", "ps_suppkey": "bigint", "ps_availqty": "int",
                             "ps_supplycost": _D, "ps_comment": "string"}, "key": ["ps_partkey", "ps_suppkey"]},
    "customer": {"columns": {"c_custkey": "bigint", "c_name": "string", "c_address": "string",
                             "c_nationkey": "bigint", "c_phone": "string", "c_acctbal": _D,
                             "c_mktsegment": "string", "c_comment": "string"}, "key": ["c_custkey"]},
    "orders": {"columns": {"o_orderkey": "bigint", "o_custkey": "bigint", "o_orderstatus": "string",
                           "o_totalprice": _D, "o_orderdate": "date", "o_orderpriority": "string",
                           "o_clerk": "string", "o_shippriority": "int", "o_comment": "string"},
               "key": ["o_orderkey"], "references": {"o_custkey": "customer.c_custkey"}},
    "lineitem": {"columns": {"l_orderkey": "bigint", "l_partkey": "bigint", "l_suppkey": "bigint",
                             "l_linenumber": "int", "l_quantity": _D, "l_extendedprice": _D, "l_discount": _D,
                             "l_tax": _D, "l_returnflag": "string", "l_linestatus": "string",
                             "l_shipdate": "date", "l_commitdate": "date", "l_receiptdate": "date",
                             "l_shipinstruct": "string", "l_shipmode": "string", "l_comment": "string"},
                 "key": ["l_orderkey", "l_linenumber"], "references": {"l_orderkey": "orders.o_orderkey"}},
    "nation": {"columns": {"n_nationkey": "bigint", "n_name": "string", "n_regionkey": "bigint",
                           "n_comment": "string"}, "key": ["n_nationkey"]},
    "region": {"columns": {"r_regionkey": "bigint", "r_name": "string", "r_comment": "string"},
               "key": ["r_regionkey"]},
}

QUERIES = {
    "q1": """SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base_price,
  sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
  sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge, avg(l_quantity) AS avg_qty,
  avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc, count(*) AS count_order
FROM lineitem
WHERE l_shipdate <= date '1998-12-01' - interval '90' day
GROUP BY l_returnflag, l_linestatus""",
    "q2": """SELECT s_acctbal, s_name, n_name, p_partkey, p_mfgr, s_address, s_phone, s_comment
FROM part, supplier, partsupp, nation, region
WHERE p_partkey = ps_partkey AND s_suppkey = ps_suppkey AND p_size = 15 AND p_type LIKE '%BRASS'
  AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'EUROPE'
  AND ps_supplycost = (
    SELECT min(ps_supplycost) FROM partsupp, supplier, nation, region
    WHERE p_partkey = ps_partkey AND s_suppkey = ps_suppkey AND s_nationkey = n_nationkey
      AND n_regionkey = r_regionkey AND r_name = 'EUROPE')""",
    "q3": """SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority
FROM customer, orders, lineitem
WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey
  AND o_orderdate < date '1995-03-15' AND l_shipdate > date '1995-03-15'
GROUP BY l_orderkey, o_orderdate, o_shippriority""",
    "q4": """SELECT o_orderpriority, count(*) AS order_count
FROM orders
WHERE o_orderdate >= date '1993-07-01' AND o_orderdate < date '1993-07-01' + interval '3' month
  AND EXISTS (SELECT * FROM lineitem WHERE l_orderkey = o_orderkey AND l_commitdate < l_receiptdate)
GROUP BY o_orderpriority""",
    "q5": """SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue
FROM customer, orders, lineitem, supplier, nation, region
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey
  AND c_nationkey = s_nationkey AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey
  AND r_name = 'ASIA' AND o_orderdate >= date '1994-01-01' AND o_orderdate < date '1994-01-01' + interval '1' year
GROUP BY n_name""",
    "q6": """SELECT sum(l_extendedprice * l_discount) AS revenue
FROM lineitem
WHERE l_shipdate >= date '1994-01-01' AND l_shipdate < date '1994-01-01' + interval '1' year
  AND l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01 AND l_quantity < 24""",
    "q7": """SELECT supp_nation, cust_nation, l_year, sum(volume) AS revenue
FROM (
  SELECT n1.n_name AS supp_nation, n2.n_name AS cust_nation, extract(year FROM l_shipdate) AS l_year,
    l_extendedprice * (1 - l_discount) AS volume
  FROM supplier, lineitem, orders, customer, nation n1, nation n2
  WHERE s_suppkey = l_suppkey AND o_orderkey = l_orderkey AND c_custkey = o_custkey
    AND s_nationkey = n1.n_nationkey AND c_nationkey = n2.n_nationkey
    AND ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE'))
    AND l_shipdate BETWEEN date '1995-01-01' AND date '1996-12-31') AS shipping
GROUP BY supp_nation, cust_nation, l_year""",
    "q8": """SELECT o_year, sum(CASE WHEN nation = 'BRAZIL' THEN volume ELSE 0 END) / sum(volume) AS mkt_share
FROM (
  SELECT extract(year FROM o_orderdate) AS o_year, l_extendedprice * (1 - l_discount) AS volume,
    n2.n_name AS nation
  FROM part, supplier, lineitem, orders, customer, nation n1, nation n2, region
  WHERE p_partkey = l_partkey AND s_suppkey = l_suppkey AND l_orderkey = o_orderkey AND o_custkey = c_custkey
    AND c_nationkey = n1.n_nationkey AND n1.n_regionkey = r_regionkey AND r_name = 'AMERICA'
    AND s_nationkey = n2.n_nationkey AND o_orderdate BETWEEN date '1995-01-01' AND date '1996-12-31'
    AND p_type = 'ECONOMY ANODIZED STEEL') AS all_nations
GROUP BY o_year""",
    "q9": """SELECT nation, o_year, sum(amount) AS sum_profit
FROM (
  SELECT n_name AS nation, extract(year FROM o_orderdate) AS o_year,
    l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity AS amount
  FROM part, supplier, lineitem, partsupp, orders, nation
  WHERE s_suppkey = l_suppkey AND ps_suppkey = l_suppkey AND ps_partkey = l_partkey AND p_partkey = l_partkey
    AND o_orderkey = l_orderkey AND s_nationkey = n_nationkey AND p_name LIKE '%green%') AS profit
GROUP BY nation, o_year""",
    "q10": """SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name,
  c_address, c_phone, c_comment
FROM customer, orders, lineitem, nation
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND o_orderdate >= date '1993-10-01'
  AND o_orderdate < date '1993-10-01' + interval '3' month AND l_returnflag = 'R' AND c_nationkey = n_nationkey
GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment""",
    "q11": """SELECT ps_partkey, sum(ps_supplycost * ps_availqty) AS value
FROM partsupp, supplier, nation
WHERE ps_suppkey = s_suppkey AND s_nationkey = n_nationkey AND n_name = 'GERMANY'
GROUP BY ps_partkey
HAVING sum(ps_supplycost * ps_availqty) > (
  SELECT sum(ps_supplycost * ps_availqty) * 0.0001
  FROM partsupp, supplier, nation
  WHERE ps_suppkey = s_suppkey AND s_nationkey = n_nationkey AND n_name = 'GERMANY')""",
    "q12": """SELECT l_shipmode,
  sum(CASE WHEN o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH' THEN 1 ELSE 0 END) AS high_line_count,
  sum(CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH' THEN 1 ELSE 0 END)
    AS low_line_count
FROM orders, lineitem
WHERE o_orderkey = l_orderkey AND l_shipmode IN ('MAIL', 'SHIP') AND l_commitdate < l_receiptdate
  AND l_shipdate < l_commitdate AND l_receiptdate >= date '1994-01-01'
  AND l_receiptdate < date '1994-01-01' + interval '1' year
GROUP BY l_shipmode""",
    "q13": """SELECT c_count, count(*) AS custdist
FROM (
  SELECT c_custkey, count(o_orderkey) AS c_count
  FROM customer LEFT OUTER JOIN orders ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%'
  GROUP BY c_custkey) AS c_orders
GROUP BY c_count""",
    "q14": """SELECT 100.00 * sum(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
  / sum(l_extendedprice * (1 - l_discount)) AS promo_revenue
FROM lineitem, part
WHERE l_partkey = p_partkey AND l_shipdate >= date '1995-09-01'
  AND l_shipdate < date '1995-09-01' + interval '1' month""",
    "q15": """WITH revenue0 AS (
  SELECT l_suppkey AS supplier_no, sum(l_extendedprice * (1 - l_discount)) AS total_revenue
  FROM lineitem
  WHERE l_shipdate >= date '1996-01-01' AND l_shipdate < date '1996-01-01' + interval '3' month
  GROUP BY l_suppkey)
SELECT s_suppkey, s_name, s_address, s_phone, total_revenue
FROM supplier, revenue0
WHERE s_suppkey = supplier_no AND total_revenue = (SELECT max(total_revenue) FROM revenue0)""",
    "q16": """SELECT p_brand, p_type, p_size, count(DISTINCT ps_suppkey) AS supplier_cnt
FROM partsupp, part
WHERE p_partkey = ps_partkey AND p_brand <> 'Brand#45' AND p_type NOT LIKE 'MEDIUM POLISHED%'
  AND p_size IN (49, 14, 23, 45, 19, 3, 36, 9)
  AND ps_suppkey NOT IN (SELECT s_suppkey FROM supplier WHERE s_comment LIKE '%Customer%Complaints%')
GROUP BY p_brand, p_type, p_size""",
    "q17": """SELECT sum(l_extendedprice) / 7.0 AS avg_yearly
FROM lineitem, part
WHERE p_partkey = l_partkey AND p_brand = 'Brand#23' AND p_container = 'MED BOX'
  AND l_quantity < (SELECT 0.2 * avg(l_quantity) FROM lineitem WHERE l_partkey = p_partkey)""",
    "q18": """SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) AS sum_qty
FROM customer, orders, lineitem
WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300)
  AND c_custkey = o_custkey AND o_orderkey = l_orderkey
GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice""",
    "q19": """SELECT sum(l_extendedprice * (1 - l_discount)) AS revenue
FROM lineitem, part
WHERE (p_partkey = l_partkey AND p_brand = 'Brand#12' AND p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
    AND l_quantity >= 1 AND l_quantity <= 1 + 10 AND p_size BETWEEN 1 AND 5
    AND l_shipmode IN ('AIR', 'AIR REG') AND l_shipinstruct = 'DELIVER IN PERSON')
  OR (p_partkey = l_partkey AND p_brand = 'Brand#23'
    AND p_container IN ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK') AND l_quantity >= 10
    AND l_quantity <= 10 + 10 AND p_size BETWEEN 1 AND 10 AND l_shipmode IN ('AIR', 'AIR REG')
    AND l_shipinstruct = 'DELIVER IN PERSON')
  OR (p_partkey = l_partkey AND p_brand = 'Brand#34'
    AND p_container IN ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG') AND l_quantity >= 20
    AND l_quantity <= 20 + 10 AND p_size BETWEEN 1 AND 15 AND l_shipmode IN ('AIR', 'AIR REG')
    AND l_shipinstruct = 'DELIVER IN PERSON')""",
    "q20": """SELECT s_name, s_address
FROM supplier, nation
WHERE s_suppkey IN (
    SELECT ps_suppkey FROM partsupp
    WHERE ps_partkey IN (SELECT p_partkey FROM part WHERE p_name LIKE 'forest%')
      AND ps_availqty > (
        SELECT 0.5 * sum(l_quantity) FROM lineitem
        WHERE l_partkey = ps_partkey AND l_suppkey = ps_suppkey AND l_shipdate >= date '1994-01-01'
          AND l_shipdate < date '1994-01-01' + interval '1' year))
  AND s_nationkey = n_nationkey AND n_name = 'CANADA'""",
    "q21": """SELECT s_name, count(*) AS numwait
FROM supplier, lineitem l1, orders, nation
WHERE s_suppkey = l1.l_suppkey AND o_orderkey = l1.l_orderkey AND o_orderstatus = 'F'
  AND l1.l_receiptdate > l1.l_commitdate
  AND EXISTS (SELECT * FROM lineitem l2 WHERE l2.l_orderkey = l1.l_orderkey AND l2.l_suppkey <> l1.l_suppkey)
  AND NOT EXISTS (SELECT * FROM lineitem l3 WHERE l3.l_orderkey = l1.l_orderkey
                  AND l3.l_suppkey <> l1.l_suppkey AND l3.l_receiptdate > l3.l_commitdate)
  AND s_nationkey = n_nationkey AND n_name = 'SAUDI ARABIA'
GROUP BY s_name""",
    "q22": """SELECT cntrycode, count(*) AS numcust, sum(c_acctbal) AS totacctbal
FROM (
  SELECT substring(c_phone, 1, 2) AS cntrycode, c_acctbal
  FROM customer
  WHERE substring(c_phone, 1, 2) IN ('13', '31', '23', '29', '30', '18', '17')
    AND c_acctbal > (
      SELECT avg(c_acctbal) FROM customer
      WHERE c_acctbal > 0.00 AND substring(c_phone, 1, 2) IN ('13', '31', '23', '29', '30', '18', '17'))
    AND NOT EXISTS (SELECT * FROM orders WHERE o_custkey = c_custkey)) AS custsale
GROUP BY cntrycode""",
}

KEYS = {name: spec["key"] for name, spec in TABLES.items()}


def _lines(query: str, column: str = "l_orderkey") -> str:
    """The orders of the line items a one-level query reads: its FROM and WHERE, selecting ``column``."""
    return f"SELECT {column} " + query[query.index("\nFROM"):query.index("\nGROUP BY") if "GROUP BY" in query else None]


#: Q8's line items (its FROM and WHERE, but for the supplier's nation) and Q20's (a forest part's line in
#: 1994 from a Canadian supplier)
Q8_LINES = ("FROM part, lineitem, orders, customer, nation, region WHERE p_partkey = l_partkey AND l_orderkey = "
            "o_orderkey AND o_custkey = c_custkey AND c_nationkey = n_nationkey AND n_regionkey = r_regionkey AND "
            "r_name = 'AMERICA' AND p_type = 'ECONOMY ANODIZED STEEL' "
            "AND o_orderdate BETWEEN date '1995-01-01' AND date '1996-12-31'")
Q20_LINES = ("FROM lineitem, part, supplier, nation WHERE l_partkey = p_partkey AND p_name LIKE 'forest%' "
             "AND l_suppkey = s_suppkey AND s_nationkey = n_nationkey AND n_name = 'CANADA' "
             "AND l_shipdate >= date '1994-01-01' AND l_shipdate < date '1995-01-01'")
#: the orders of line items that reach views few random orders reach (each query's own FROM and WHERE):
#: one of them is deleted or copied each round (not both: a copy of a deleted order cancels it in a sum)
REACHED = {
    "q8": f"SELECT l_orderkey {Q8_LINES}",
    "q12": _lines(QUERIES["q12"]),
    # (parts become Brand#23 in a MED BOX by the updates below; copies of their line items get quantity 1,
    # below Q17's fifth of the average, in RF1)
    "q17": "SELECT l_orderkey FROM lineitem, part WHERE p_partkey = l_partkey AND p_brand = 'Brand#23' "
           "AND p_container = 'MED BOX'",
    "q19": _lines(QUERIES["q19"]),
    "q20": f"SELECT l_orderkey {Q20_LINES}",
    "q21": _lines(QUERIES["q21"], "l1.l_orderkey"),
}


class Tables:
    """The tables in DuckDB, changed as ivm's are: each change is a Parquet change file for ivm and the
    same DELETE / INSERT here."""

    def __init__(self, data: Path, folder: Path):
        self.con, self.folder, self.files = duckdb.connect(), folder, 0
        for name in TABLES:
            self.con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet('{data / name}.parquet')")

    def snapshot(self, name: str) -> str:
        path = self.folder / f"{name}-snapshot.parquet"
        self.con.execute(f"COPY {name} TO '{path}' (FORMAT parquet)")
        return str(path)

    def change(self, name: str, deleted: str | None = None, inserted: str | None = None,
               updated: tuple[str, str] | None = None) -> str:
        """A change file deleting the rows ``deleted`` selects (a WHERE), inserting ``inserted``'s rows (a
        SELECT), or updating (WHERE, SET) in place; applied here too."""
        self.files += 1
        path = self.folder / f"{name}-{self.files}.parquet"
        parts = []
        if deleted:
            parts.append(f"SELECT *, 'delete' AS _change_type FROM {name} WHERE {deleted}")
        if inserted:
            parts.append(f"SELECT *, 'insert' AS _change_type FROM ({inserted})")
        if updated:
            where, assignments = updated
            parts.append(f"SELECT *, 'update_preimage' AS _change_type FROM {name} WHERE {where}")
            parts.append(f"SELECT * REPLACE ({assignments}), 'update_postimage' AS _change_type "
                         f"FROM {name} WHERE {where}")
        self.con.execute(f"COPY ({' UNION ALL '.join(parts)}) TO '{path}' (FORMAT parquet)")
        staged = f"read_parquet('{path}')"
        key = ", ".join(KEYS[name])
        self.con.execute(f"DELETE FROM {name} WHERE ({key}) IN (SELECT ({key}) FROM {staged} "
                         f"WHERE _change_type IN ('delete', 'update_preimage'))")
        self.con.execute(f"INSERT INTO {name} SELECT * EXCLUDE (_change_type) FROM {staged} "
                         f"WHERE _change_type IN ('insert', 'update_postimage')")
        return str(path)

    def query(self, sql: str) -> list[tuple]:
        return self.con.execute(sql).fetchall()

    def keys(self, sql: str) -> str:
        return ", ".join(str(r[0]) for r in self.query(sql)) or "NULL"


def round_of_changes(t: Tables, rng: random.Random, orders_per_side: int = 12,
                     moved_suppliers: int | None = None) -> dict[str, list[str]]:
    """One round's change files per table (RF1, RF2 and the updates; tests/spark/test_tpch.py's text says
    which rows and why): ``orders_per_side`` random orders deleted and as many copied as new ones, with
    their line items, beside the orders the queries single out. The suppliers moved between nations 2 and 3
    are a third of nation 2's (one or two at SF 0.01, ~130 at SF 1: every line item of theirs changes
    nation in Q5, Q7, Q8, Q9), or the lowest ``moved_suppliers`` of that third."""
    files: dict[str, list[str]] = {}
    q18 = [r[2] for r in t.query(QUERIES["q18"])]
    top = t.query(f"SELECT s_suppkey FROM ({QUERIES['q15']})")
    orders = [r[0] for r in t.query("SELECT o_orderkey FROM orders ORDER BY o_orderkey")]
    top_order = t.query(f"SELECT min(l_orderkey) FROM lineitem WHERE l_suppkey = {top[0][0]} AND l_shipdate "
                        f"BETWEEN date '1996-01-01' AND date '1996-03-31'") if top else [(None,)]
    gone = {*rng.sample(orders, orders_per_side), *q18[:1], *(k for (k,) in top_order if k is not None)}
    copied = [*rng.sample(orders, orders_per_side), *q18[1:2]]
    for sql in REACHED.values():
        reached = sorted({k for (k,) in t.query(sql)})
        if reached:
            (gone.add if rng.random() < 0.5 else copied.append)(rng.choice(reached))
    copied = sorted(set(copied))
    first = max(orders) + 1
    new_key = "CASE o_orderkey " + " ".join(f"WHEN {k} THEN {first + i}" for i, k in enumerate(copied)) + " END"
    copied_keys = ", ".join(map(str, copied))
    gone_keys = ", ".join(map(str, sorted(gone)))
    files["lineitem"] = [t.change("lineitem", deleted=f"l_orderkey IN ({gone_keys})", inserted=(
        f"SELECT * REPLACE ({new_key.replace('o_orderkey', 'l_orderkey')} AS l_orderkey, CASE WHEN l_partkey "
        "IN (SELECT p_partkey FROM part WHERE p_brand = 'Brand#23') THEN 1 ELSE l_quantity END AS l_quantity) "
        f"FROM lineitem WHERE l_orderkey IN ({copied_keys})"))]
    files["orders"] = [t.change("orders", deleted=f"o_orderkey IN ({gone_keys})", inserted=(
        f"SELECT * REPLACE ({new_key} AS o_orderkey) FROM orders WHERE o_orderkey IN ({copied_keys})"))]
    customers = t.keys("SELECT c_custkey FROM customer ORDER BY hash(c_custkey + "
                       f"{rng.randrange(1000)}) LIMIT 8")
    files["customer"] = [t.change("customer", updated=(
        f"c_custkey IN ({customers})", "c_acctbal * -1 + 1000 AS c_acctbal, "
        "CASE WHEN c_mktsegment = 'BUILDING' THEN 'MACHINERY' ELSE 'BUILDING' END AS c_mktsegment"))]
    parts = t.keys(f"SELECT p_partkey FROM part ORDER BY hash(p_partkey + {rng.randrange(1000)}) LIMIT 10")
    files["part"] = [t.change("part", updated=(
        f"p_partkey IN ({parts})", "CASE WHEN p_size = 15 THEN 14 ELSE 15 END AS p_size, "
        "CASE WHEN p_type LIKE '%BRASS' THEN 'STANDARD BURNISHED TIN' ELSE 'LARGE BRUSHED BRASS' END AS p_type, "
        "CASE WHEN p_partkey % 2 = 0 THEN 'Brand#23' ELSE p_brand END AS p_brand, "
        "CASE WHEN p_partkey % 2 = 0 THEN 'MED BOX' ELSE p_container END AS p_container"))]
    # a supplier of Q8's line items moves to BRAZIL (Q8's market share), another away from it
    supplier = t.keys(f"SELECT DISTINCT l_suppkey {Q8_LINES} ORDER BY hash(l_suppkey + {rng.randrange(1000)}) "
                      "LIMIT 1")
    limit = "" if moved_suppliers is None else f" LIMIT {moved_suppliers}"
    files["supplier"] = [t.change("supplier", updated=(
        f"s_suppkey IN ({supplier}) OR s_suppkey IN (SELECT s_suppkey FROM supplier WHERE s_nationkey = 2 AND "
        f"s_suppkey % 3 = {rng.randrange(3)} ORDER BY s_suppkey{limit})",
        "CASE WHEN s_nationkey = 2 THEN 3 ELSE 2 END AS s_nationkey"))]
    # Q2's current minimum rows get dearer (a delete of the current MIN), some other rows cheaper
    q2 = t.keys(f"SELECT p_partkey FROM ({QUERIES['q2']})")
    cheaper = t.keys(f"SELECT ps_partkey FROM partsupp ORDER BY hash(ps_partkey + {rng.randrange(1000)}) LIMIT 10")
    files["partsupp"] = [t.change("partsupp", updated=(
        f"ps_partkey IN ({q2}) AND ps_supplycost = (SELECT min(ps_supplycost) FROM partsupp p2 "
        "WHERE p2.ps_partkey = partsupp.ps_partkey)", "ps_supplycost + 100 AS ps_supplycost")),
        t.change("partsupp", updated=(f"ps_partkey IN ({cheaper}) AND ps_suppkey % 2 = 0",
                                      "ps_supplycost / 2 AS ps_supplycost, ps_availqty + 500 AS ps_availqty"))]
    # a supplier of Q20's line items runs out of its forest parts, or refills them (in or out of Q20)
    suppliers = sorted({supp for (supp,) in t.query(f"SELECT l_suppkey {Q20_LINES}")})
    if suppliers:
        supp = rng.choice(suppliers)
        listed = t.query(f"SELECT count(*) FROM ({QUERIES['q20']}) JOIN supplier USING (s_name) "
                         f"WHERE s_suppkey = {supp}")[0][0]
        files["partsupp"].append(t.change("partsupp", updated=(
            f"ps_suppkey = {supp} AND ps_partkey IN (SELECT p_partkey FROM part WHERE p_name LIKE 'forest%')",
            f"{0 if listed else 9999} AS ps_availqty")))
    return files
