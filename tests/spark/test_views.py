"""Views through `ivm refresh`: materialized at one snapshot with the base tables, recomputed when
their inputs or definitions change, equal to DuckDB on the same base state, explained by `ivm explain`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from ivm import Project
from ivm.changes import cancel
from ivm.cli import main
from ivm.errors import ChangeDataError, ConfigError
from tests.conftest import write_project

TABLES = {
    "link": {"columns": {"src": "string", "dst": "string"}, "key": ["src", "dst"]},
    "visit": {"columns": {"page": "string", "n": "int"}},
}
VIEWS = {
    "hop": {"datalog": "hop(X, Y) :- link(X, Z), link(Z, Y)."},
    "fan": {"sql": "SELECT src, count(*) AS n FROM link GROUP BY src"},
    "shop": {"sql": "SELECT l1.src, l2.dst FROM link l1 JOIN link l2 ON l1.dst = l2.src"},
    "dead_end": {"sql": "SELECT l.src, l.dst FROM link l WHERE NOT EXISTS (SELECT 1 FROM link m WHERE m.src = l.dst)"},
    "pages": {"sql": "SELECT page, sum(n) AS total FROM visit GROUP BY page"},
}
DUCKDB = {
    "hop": "SELECT DISTINCT l1.src, l2.dst FROM link l1 JOIN link l2 ON l1.dst = l2.src",
    **{v: q["sql"] for v, q in VIEWS.items() if "sql" in q},
}


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def rows_of(project: Project, name: str) -> Counter:
    return Counter(tuple(r) for r in project.read(name).collect())


def duckdb_of(project: Project) -> dict[str, Counter]:
    con = duckdb.connect()
    for t in TABLES:
        con.register(f"{t}_df", project.read(t).toPandas())
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM {t}_df")
    return {v: Counter(tuple(r) for r in con.execute(q).fetchall()) for v, q in DUCKDB.items()}


def assert_views_match(project: Project) -> None:
    expected = duckdb_of(project)
    for v in VIEWS:
        assert rows_of(project, v) == expected[v], v


@pytest.fixture
def project(make_project, tmp_path):
    p = make_project(TABLES, views=VIEWS)
    p.load("link", write(tmp_path / "link.jsonl", [{"src": s, "dst": d} for s, d in
                                                   ["ab", "bc", "cd", "bd", "da"]]))
    p.load("visit", write(tmp_path / "visit.jsonl", [{"page": "/", "n": 1}, {"page": "/", "n": 1}]))
    return p


def test_views_follow_the_base_tables(project, tmp_path, monkeypatch):
    first = project.refresh()
    assert {v.view: (v.mode, v.reason) for v in first.views} == {v: ("full", "first materialization") for v in VIEWS}
    assert_views_match(project)
    project.append("link", write(tmp_path / "c1.jsonl", [
        {"src": "d", "dst": "a", "_change_type": "delete"}, {"src": "c", "dst": "e", "_change_type": "insert"}]))
    second = project.refresh()
    # only the views that read link are maintained, by counting; pages keeps its version
    assert sorted(v.view for v in second.views) == ["dead_end", "fan", "hop", "shop"]
    assert {v.reason for v in second.views} == {"counting (000 §4-6): inputs changed: link"}
    assert_views_match(project)
    watermarks = project.catalog.watermarks()
    assert watermarks[("hop", "link")] == 1 and watermarks[("pages", "visit")] == 0
    run = project.catalog.get_run(second.run_id)
    assert {(s.stage, s.relation, s.mode) for s in run.stages if s.stage == "maintain"} == {
        ("maintain", v, "incremental") for v in ["dead_end", "fan", "hop", "shop"]}
    assert project.refresh().status == "noop"
    # changes that cancel out are nothing to do: no run (ivm.changes.cancel), the range left pending
    versions = {v: project.catalog.state(v).version for v in VIEWS}
    project.append("link", write(tmp_path / "c2.jsonl", [{"src": "x", "dst": "y", "_change_type": "insert"},
                                                        {"src": "x", "dst": "y", "_change_type": "delete"}]))
    third = project.refresh()
    assert third.status == "noop" and third.views == []
    assert {v: project.catalog.state(v).version for v in VIEWS} == versions
    assert project.catalog.watermarks()[("hop", "link")] == 1
    # a range the driver leaves to Spark (here: any, past CANCEL_MAX_ROWS) is trimmed into an empty net
    # delta: the watermarks move and the views' versions stay
    monkeypatch.setattr(cancel, "CANCEL_MAX_ROWS", 0)
    fourth = project.refresh()
    assert {v.mode for v in fourth.views} == {"noop"}
    assert {v: project.catalog.state(v).version for v in VIEWS} == versions
    assert project.catalog.watermarks()[("hop", "link")] == 2
    assert_views_match(project)
    # a full recompute reads link's base layer and its delta layer consolidated (Warehouse.read_consolidated)
    # and groups fan's rows without consolidating them first (Evaluator.grouped_only)
    assert len(project.catalog.state("link").layers) == 2
    assert {v.mode for v in project.refresh(mode="full").views} == {"full"}
    assert_views_match(project)


def test_bad_changes_leave_views_untouched(project, tmp_path):
    project.refresh()
    before = {v: project.catalog.state(v) for v in VIEWS}
    project.append("link", write(tmp_path / "bad.jsonl", [{"src": "z", "dst": "z", "_change_type": "delete"}]))
    with pytest.raises(ChangeDataError):
        project.refresh()
    assert {v: project.catalog.state(v) for v in VIEWS} == before


def test_modes_and_named_views(project, tmp_path):
    with pytest.raises(ConfigError, match=r"views.hop: cannot be maintained incrementally in this run "
                                          r"\(first materialization\)"):
        project.refresh(mode="incremental")
    assert project.catalog.state("hop").version == 0
    result = project.refresh(["fan"])
    assert [v.view for v in result.views] == ["fan"]
    assert project.catalog.state("hop").version == 0
    full = project.refresh(mode="full")
    assert sorted(v.view for v in full.views) == sorted(VIEWS)
    assert project.catalog.state("fan").version == 2


def test_a_changed_definition_is_rebuilt(project, tmp_path, make_project):
    project.refresh()
    root = Path(project.config.root)
    changed = dict(VIEWS, fan={"sql": "SELECT src, count(*) AS n FROM link WHERE dst <> 'd' GROUP BY src"})
    again = make_project(TABLES, views=changed, root=root)
    result = again.refresh()
    assert [(v.view, v.reason) for v in result.views] == [("fan", "the definition changed")]
    assert rows_of(again, "fan") == Counter({("a", 1): 1, ("b", 1): 1, ("d", 1): 1})


def test_explain_and_show_from_the_command_line(project, capsys):
    project.refresh()
    path = str(Path(project.config.root) / "ivm.yaml")
    assert main(["explain", "hop", "--project", path]) == 0
    text = capsys.readouterr().out
    assert "view hop (datalog, set semantics): x, y" in text
    assert "hop(X, Y) :- link(X, Z), link(Z, Y)." in text and "maintenance: counting" in text
    assert "only changes of the set propagate upward (000 Algorithm 4.1 statement (2)" in text
    assert main(["explain", "fan", "--format", "json", "--project", path]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stratum"] == 2 and doc["tables"] == ["link"] and doc["algorithm"] == "counting"
    assert any("000 Algorithm 6.1 with the stored state fan__agg0_0" in r for r in doc["reasons"])
    assert main(["show", "shop", "--format", "csv", "--project", path]) == 0
    assert capsys.readouterr().out == "src,dst\na,c\na,d\nb,a\nb,d\nc,a\nd,b\n"
    assert project.register_temp_views() == ["link", "visit", *VIEWS]
    assert project.spark.sql("SELECT count(*) FROM hop").first()[0] == 6


def test_unmaterialized_view_cannot_be_read(project):
    from ivm.errors import NotFoundError

    with pytest.raises(NotFoundError, match="view hop has not been materialized yet; run `ivm refresh`"):
        project.read("hop")


@pytest.mark.parametrize("view, message", [
    ({"sql": "SELECT x FROM link"}, "views.bad: Column 'x' could not be resolved"),
    ({"sql": "SELECT src FROM link WHERE dst = array(1, 2)"},
     "views.bad: Spark cannot evaluate it: .*DATATYPE_MISMATCH"),
])
def test_apply_refuses_bad_views_and_stores_nothing(tmp_path, spark, view, message):
    path = write_project(tmp_path / "p", TABLES, views={"bad": view})
    project = Project.open(str(path))
    with pytest.raises(ConfigError, match=message):
        project.apply()
    assert project.catalog.table_defs() == {} and project.catalog.view_defs() == {}


def test_a_group_by_input_no_aggregate_reads_is_not_stored(make_project, tmp_path):
    """COUNT and SUM over a join are maintained from the delta of the join's rows and the stored state of
    the groups (000 §6.2): those rows are written by neither the full refresh nor a refresh (ephemeral);
    MAX keeps them, since deleting a group's maximum sends it back to them."""
    join = "FROM link l JOIN visit v ON l.dst = v.page GROUP BY l.src"
    views = {"traffic": {"sql": f"SELECT l.src, count(*) AS n, sum(v.n) AS total, avg(v.n) AS mean {join}"},
             "peak": {"sql": f"SELECT l.src, max(v.n) AS top {join}"}}
    p = make_project(TABLES, views=views)
    p.load("link", write(tmp_path / "link.jsonl", [{"src": s, "dst": d} for s, d in ["ab", "bc", "cd", "bd", "da"]]))
    p.load("visit", write(tmp_path / "visit.jsonl", [{"page": pg, "n": n} for pg, n in
                                                     [("b", 1), ("b", 1), ("c", 5), ("d", 2), ("a", None)]]))
    p.refresh()
    program, _ = p.program
    [traffic_rows] = [x for x, d in program.predicates.items() if d.kind == "aux" and d.owner == "traffic"]
    [peak_rows] = [x for x, d in program.predicates.items() if d.kind == "aux" and d.owner == "peak"]
    assert p.stored_relations("traffic") == ["traffic", "traffic__agg0_0"]
    assert p.catalog.state(traffic_rows).version_id is None and p.catalog.state(peak_rows).version_id is not None
    assert any(f"{traffic_rows}: not stored (ephemeral)" in r for r in p.explain("traffic").reasons)

    def duckdb_rows() -> dict[str, Counter]:
        con = duckdb.connect()
        for t in TABLES:
            con.register(f"{t}_df", p.read(t).toPandas())
            con.execute(f"CREATE TABLE {t} AS SELECT * FROM {t}_df")
        return {v: Counter(tuple(r) for r in con.execute(q["sql"]).fetchall()) for v, q in views.items()}

    for v in views:
        assert rows_of(p, v) == duckdb_rows()[v], v
    # b's maximum goes (visit c, 5), a gains a new one twice, d's only link goes (its group empties)
    p.append("visit", write(tmp_path / "v1.jsonl", [{"page": "c", "n": 5, "_change_type": "delete"},
                                                    {"page": "b", "n": 7, "_change_type": "insert"},
                                                    {"page": "b", "n": 7, "_change_type": "insert"},
                                                    {"page": "a", "n": 3, "_change_type": "insert"}]))
    p.append("link", write(tmp_path / "l1.jsonl", [{"src": "d", "dst": "a", "_change_type": "delete"}]))
    second = p.refresh(mode="incremental")
    assert {v.mode for v in second.views} == {"incremental"}
    assert p.catalog.state(traffic_rows).version_id is None
    for v in views:
        assert rows_of(p, v) == duckdb_rows()[v], v


def test_every_algorithm_catches_up_from_its_pointer(make_project, tmp_path):
    """#48, per-view pointers, for each maintenance algorithm: a run of `fan` alone applies link's
    changes (a cycle closed, an edge of it deleted, a dead end made); the recursive closure (DRed), the
    key-based (003) and the reducing (004) views and a NOT EXISTS catch up incrementally on the next
    refresh and equal their recomputation and DuckDB."""
    from tests.helpers import assert_views_recomputed

    views = {**VIEWS,
             "reach": {"sql": "WITH RECURSIVE r(src, dst) AS (SELECT src, dst FROM link UNION "
                              "SELECT r.src, l.dst FROM r JOIN link l ON r.dst = l.src) SELECT src, dst FROM r"},
             "sources": {"sql": "SELECT DISTINCT l.src FROM link l WHERE EXISTS "
                                "(SELECT 1 FROM link m WHERE m.src = l.dst)", "strategy": "keyed"},
             "pairs": {"sql": "SELECT DISTINCT l1.src, l2.dst FROM link l1 JOIN link l2 ON l1.dst = l2.src",
                       "strategy": "reduce"}}
    p = make_project(TABLES, views=views)
    p.load("link", write(tmp_path / "l0.jsonl", [{"src": a, "dst": b} for a, b in
                                                 [("a", "b"), ("b", "c"), ("c", "d"), ("x", "y")]]))
    p.load("visit", write(tmp_path / "v0.jsonl", [{"page": "p", "n": 1}]))
    p.refresh()
    runs = [[("d", "a", "insert"), ("x", "y", "delete")], [("b", "c", "delete"), ("c", "e", "insert")]]
    for n, changes in enumerate(runs):
        p.append("link", write(tmp_path / f"l{n + 1}.jsonl", [{"src": a, "dst": b, "_change_type": k}
                                                              for a, b, k in changes]))
        p.refresh(["fan"])
    works = {w.view: (w.mode, w.reason) for w in p.refresh().views}
    assert {v for v, (mode, reason) in works.items() if "catches up from its own pointer" in reason} == {
        "hop", "shop", "dead_end", "reach", "sources", "pairs"}, works
    assert {mode for mode, _ in works.values()} == {"incremental"}, works
    assert_views_recomputed(p)
    assert_views_match(p)
