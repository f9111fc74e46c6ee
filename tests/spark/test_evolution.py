"""Schema drift of a table that holds data (#46, item 3; ivm.evolution): a nullable column added and a
type widened in ivm.yaml are applied by `ivm apply` without a reload; change files with the old schema
are still accepted (the added column NULL) beside files with the new one; the view that does not use
the column and the one that selects `*` go on being maintained incrementally (apply says what the
second gains) and equal DuckDB's result of their SQL, their Delta tables take the new schema; a drop,
a narrowing, another type and another key are refused with the column named, nothing changed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import LongType

from ivm import Project, sinks
from ivm.catalog.store import PublishChange
from ivm.errors import ChangeDataError, ConfigError
from tests.conftest import drawn_stream, write_project
from tests.helpers import STREAMS, assert_views_recomputed, rows

BEFORE = {"acct": {"columns": {"id": "int", "owner": "string", "n": "int", "w": "float"}, "key": ["id"]}}
AFTER = {"acct": {"columns": {"id": "int", "owner": "string", "n": "bigint", "w": "double", "note": "string"},
                  "key": ["id"]}}
VIEWS = {"per_owner": {"sql": "SELECT owner, count(*) AS c, sum(n) AS total FROM acct GROUP BY owner",
                       "key": ["owner"]},
         "everything": {"sql": "SELECT * FROM acct", "key": ["id"]}}


def write(path: Path, rows_: list[dict], change: str | None = None) -> str:
    path.write_text("".join(json.dumps({**r, **({"_change_type": change} if change else {})}) + "\n" for r in rows_))
    return str(path)


def reopen(root: Path, tables: dict) -> Project:
    return Project.open(str(write_project(root, tables, views=VIEWS, storage={"delta_views": True})))


def test_a_column_added_and_types_widened_are_applied_without_a_reload(make_project, tmp_path):
    root = tmp_path / "project"
    p = make_project(BEFORE, root=root, views=VIEWS, storage={"delta_views": True})
    p.load("acct", write(tmp_path / "acct.jsonl", [{"id": i, "owner": "ab"[i % 2], "n": i, "w": 0.5}
                                                   for i in range(6)]))
    p.refresh()
    p.close()
    p = reopen(root, AFTER)
    try:
        said = p.apply()
        assert "table acct: added column note (NULL in the rows it holds)" in said
        assert "table acct: column n widened from INT to BIGINT" in said
        assert "view everything gains column note (NULL in the rows it holds, as in its tables')" in said
        assert "view everything: column n widens from int to bigint" in said
        assert not any(line.startswith("view per_owner") for line in said)
        # a change file with the old schema (no note) and one with the new
        p.append("acct", write(tmp_path / "c1.jsonl", [
            {"id": 10, "owner": "a", "n": 2**40, "w": 1.25, "_change_type": "insert"},
            {"id": 1, "owner": "b", "n": 1, "w": 0.5, "_change_type": "delete"}]))
        p.append("acct", write(tmp_path / "c2.jsonl", [
            {"id": 11, "owner": "c", "n": 3, "w": 2.5, "note": "new", "_change_type": "insert"},
            {"id": 2, "owner": "a", "n": 2, "w": 0.5, "note": None, "_change_type": "update_preimage"},
            {"id": 2, "owner": "a", "n": 7, "w": 0.5, "note": "kept", "_change_type": "update_postimage"}]))
        result = p.refresh(mode="incremental")
        assert {v.view: str(v.mode) for v in result.views} == {"per_owner": "incremental", "everything": "incremental"}
        state = {(0, "a", 0, 0.5, None), (2, "a", 7, 0.5, "kept"), (3, "b", 3, 0.5, None), (4, "a", 4, 0.5, None),
                 (5, "b", 5, 0.5, None), (10, "a", 2**40, 1.25, None), (11, "c", 3, 2.5, "new")}
        assert rows(p.read("acct").collect()) == Counter(state)
        con = duckdb.connect()
        con.execute("CREATE TABLE acct (id INTEGER, owner VARCHAR, n BIGINT, w DOUBLE, note VARCHAR)")
        con.executemany("INSERT INTO acct VALUES (?, ?, ?, ?, ?)", sorted(state))
        for view, spec in VIEWS.items():
            assert rows(p.read(view).collect()) == rows(con.execute(spec["sql"]).fetchall()), view
        assert_views_recomputed(p)
        # a producer still writing the older schema (no note) deletes a row that has a note, and updates
        # one: the missing column is not given, so the removals match the stored rows on the others (#69)
        p.append("acct", write(tmp_path / "c3.jsonl", [
            {"id": 11, "owner": "c", "n": 3, "w": 2.5, "_change_type": "delete"},
            {"id": 2, "owner": "a", "n": 7, "w": 0.5, "_change_type": "update_preimage"},
            {"id": 2, "owner": "a", "n": 8, "w": 0.5, "_change_type": "update_postimage"}]))
        p.refresh(mode="incremental")
        state = state - {(11, "c", 3, 2.5, "new"), (2, "a", 7, 0.5, "kept")} | {(2, "a", 8, 0.5, None)}
        assert rows(p.read("acct").collect()) == Counter(state)
        con = duckdb.connect()
        con.execute("CREATE TABLE acct (id INTEGER, owner VARCHAR, n BIGINT, w DOUBLE, note VARCHAR)")
        con.executemany("INSERT INTO acct VALUES (?, ?, ?, ?, ?)", sorted(state, key=lambda r: r[0]))
        for view, spec in VIEWS.items():
            assert rows(p.read(view).collect()) == rows(con.execute(spec["sql"]).fetchall()), view
        assert_views_recomputed(p)
        # a removal that gives a value the stored row does not have still does not match
        p.append("acct", write(tmp_path / "c4.jsonl", [
            {"id": 3, "owner": "b", "n": 3, "w": 0.5, "note": "other", "_change_type": "delete"}]))
        with pytest.raises(ChangeDataError, match=r"row \(id=3, owner='b', n=3, w=0.5, note='other'\): delete "
                                                  r"does not match the stored row"):
            p.refresh()
        p.quarantine("acct", p.catalog.last_commit_version("acct"))
        # the views' Delta tables take the new schema
        everything = p.spark.read.format("delta").load(sinks.location(p.ctx, "everything"))
        assert everything.schema["n"].dataType == LongType() and "note" in everything.columns
        assert rows(everything.collect()) == rows(p.read("everything").collect())
    finally:
        p.close()


OWNERS, NOTES = st.sampled_from(["a", "b", None]), st.sampled_from(["x", "y", None])


def _duck(state: dict[int, tuple]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE acct (id INTEGER, owner VARCHAR, n BIGINT, w DOUBLE, note VARCHAR)")
    if state:
        con.executemany("INSERT INTO acct VALUES (?, ?, ?, ?, ?)", [(k, *v) for k, v in sorted(state.items())])
    return con


@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_older_schema_files_mixed_with_new_ones_in_a_drawn_stream(make_project, tmp_path_factory, data):
    """#69 item 5: after a column is added, each drawn batch comes from a producer writing the older
    schema (no ``note``: inserts and postimages NULL there, removals match on the other columns) or the
    new one (removals carry the stored note), its removals' images whole or the key alone; after every
    refresh each view equals DuckDB's result and its recompute."""
    drawn_stream(data)
    root = tmp_path_factory.mktemp("drift")
    p = make_project(BEFORE, root=root / "project", views=VIEWS, storage={"delta_views": True})
    state = {k: (data.draw(OWNERS), k, 0.5, None) for k in data.draw(st.sets(st.integers(1, 7)), "loaded")}
    p.load("acct", write(root / "acct.jsonl", [{"id": k, "owner": o, "n": n, "w": w}
                                                for k, (o, n, w, _) in state.items()]))
    p.refresh()
    p.close()
    p = reopen(root / "project", AFTER)
    try:
        p.apply()
        for b in range(3):
            older = data.draw(st.booleans(), f"batch {b}: the older schema")
            lines = []

            def image(k, row, kind, older=older):
                r = {"id": k, "owner": row[0], "n": row[1], "w": row[2], **({} if older else {"note": row[3]})}
                return {**r, "_change_type": kind}

            for k in data.draw(st.sets(st.integers(1, 9)), f"batch {b}: keys"):
                new = (data.draw(OWNERS), data.draw(st.integers(0, 9)), 1.25, None if older else data.draw(NOTES))
                if k not in state:
                    lines.append(image(k, new, "insert"))
                    state[k] = new
                    continue
                before = (None, None, None, None) if data.draw(st.booleans(), "the key alone") else state[k]
                if data.draw(st.booleans(), "delete"):
                    lines.append(image(k, before, "delete"))
                    del state[k]
                else:
                    lines += [image(k, before, "update_preimage"), image(k, new, "update_postimage")]
                    state[k] = new
            if not lines:
                continue
            p.append("acct", write(root / f"c{b}.jsonl", lines))
            p.refresh(mode="incremental")
            assert rows(p.read("acct").collect()) == Counter((k, *v) for k, v in state.items())
            con = _duck(state)
            for view, spec in VIEWS.items():
                assert rows(p.read(view).collect()) == rows(con.execute(spec["sql"]).fetchall()), view
            assert_views_recomputed(p)
    finally:
        p.close()


@pytest.mark.parametrize(("columns", "key", "message"), [
    ({"id": "int", "owner": "string", "n": "int"}, ["id"], r"tables\.acct: column w cannot be dropped or renamed"),
    ({"id": "int", "owner": "string", "n": "smallint", "w": "float"}, ["id"],
     r"tables\.acct: column n cannot change from INT to SMALLINT: .* only widening is applied"),
    ({"id": "int", "owner": "string", "n": "string", "w": "float"}, ["id"],
     r"tables\.acct: column n cannot change from INT to STRING"),
    ({"id": "int", "owner": "string", "n": "int", "w": "float"}, ["id", "owner"],
     r"tables\.acct: the key cannot change from \['id'\] to \['id', 'owner'\]"),
], ids=["drop", "narrow", "retype", "key"])
def test_other_changes_of_a_stored_table_are_refused_with_the_column_named(make_project, tmp_path, columns, key,
                                                                          message):
    root = tmp_path / "project"
    p = make_project(BEFORE, root=root)
    p.load("acct", write(tmp_path / "acct.jsonl", [{"id": 1, "owner": "a", "n": 1, "w": 0.5}]))
    before = p.catalog.table_defs()["acct"].columns
    p.close()
    p = Project.open(str(write_project(root, {"acct": {"columns": columns, "key": key}})))
    try:
        with pytest.raises(ConfigError, match=message):
            p.apply()
        assert p.catalog.table_defs()["acct"].columns == before
    finally:
        p.close()


def test_a_view_whose_stored_state_could_not_be_read_is_recomputed(make_project, tmp_path):
    """The safety net: were a relation a view stores to hold a column its new compiled form does not name
    (here its GROUP BY state rewritten under an old name, as an older compiler might have left it), the
    apply that evolves the table says the view is recomputed, and the next refresh recomputes it."""
    root = tmp_path / "project"
    p = make_project(BEFORE, root=root, views=VIEWS)
    p.load("acct", write(tmp_path / "acct.jsonl", [{"id": i, "owner": "ab"[i % 2], "n": i, "w": 0.5}
                                                   for i in range(4)]))
    p.refresh()
    state = "per_owner__agg0_0"
    legacy = p.read_zset(state)
    legacy = legacy.withColumnRenamed(legacy.columns[0], "g_legacy")
    layer = p.warehouse.write_layer(legacy, state, "base")
    p.catalog.publish("legacy", [PublishChange(state, p.catalog.state(state).version_id, [layer], replace=True)], {})
    p.close()
    p = Project.open(str(write_project(root, AFTER, views=VIEWS)))
    try:
        said = p.apply()
        assert f"view per_owner is recomputed by the next refresh: {state} stores column g_legacy, which its new " \
               "compiled form does not name" in said
        p.append("acct", write(tmp_path / "c1.jsonl", [{"id": 9, "owner": "a", "n": 9, "w": 1.0,
                                                        "_change_type": "insert"}]))
        modes = {v.view: (str(v.mode), v.reason) for v in p.refresh().views}
        assert modes["per_owner"] == ("full", "the definition changed")
        assert modes["everything"][0] == "incremental"
        assert_views_recomputed(p)
    finally:
        p.close()
