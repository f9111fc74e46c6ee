"""CReaM (001) end to end: the running example (Table 2, the views victories and dominates, Example 3
with and without the auxiliary view, the Vader-defeats-Palpatine insert and the invalidated match
delete), the differential rules Δ1–Δ6 on their own, and self-maintainability: a refresh of aggregate
views over a single table reads no file of that table, only its delta and the views' own relations."""

from __future__ import annotations

import json
from collections import Counter

from ivm.ir import Atom, SetOf, Var
from ivm.maintain.cream import set_delta
from ivm.maintain.recompute import Evaluator
from ivm.zset import restrict
from tests.helpers import lines

TABLES = {"tournament": {"columns": {"victor": "string", "defeated": "string", "location": "string"}}}
VIEWS = {
    "victories": {"datalog": "victories(V, W) :- setof(D, tournament(V, D, L), S), count(S, W)."},
    "dominates": {"datalog": "dominates(V, W) :- setof(D, tournament(V, D, L), W)."},
    # the same view maintained without CReaM's auxiliary view (Example 3's first half)
    "dominates_plain": {"datalog": "dominates_plain(V, W) :- setof(D, tournament(V, D, L), W).",
                        "auxiliary_views": False},
}
TABLE_2 = [("yoda", "vader", "dagobah"), ("yoda", "palpatine", "dagobah"), ("vader", "yoda", "tatooine"),
           ("yoda", "palpatine", "tatooine")]




def _value(x):
    return tuple(x) if isinstance(x, list) else x


def zset(rows) -> Counter:
    """Rows of a stored relation or delta (count last) as {tuple: count}; arrays as tuples."""
    out: Counter = Counter()
    for r in rows:
        out[tuple(_value(x) for x in r[:-1])] += r[-1]
    return +out if all(v > 0 for v in out.values()) else out


def test_001_running_example(make_project, tmp_path):
    project = make_project(TABLES, views=VIEWS)
    project.load("tournament", lines(tmp_path / "t.jsonl", TABLE_2))
    project.refresh()
    # Table 2: Yoda has two victories in Dagobah and one in Tatooine, Vader one
    assert zset(project.read_zset("victories").collect()) == {("yoda", 2): 1, ("vader", 1): 1, ("yoda", 1): 1}
    # Darth Vader defeats Emperor Palpatine at Tatooine: (vader, 1) becomes (vader, 2)
    project.append("tournament", lines(tmp_path / "ins.jsonl", [("vader", "palpatine", "tatooine")], "insert"))
    assert {v.mode for v in project.refresh().views} == {"incremental"}
    assert zset(project.last_delta("victories").collect()) == {("vader", 1): -1, ("vader", 2): 1}
    # the match between Yoda and Palpatine at Tatooine is invalidated: (yoda, 1) leaves the view
    project.append("tournament", lines(tmp_path / "del.jsonl", [("yoda", "palpatine", "tatooine")], "delete"))
    project.refresh()
    assert zset(project.last_delta("victories").collect()) == {("yoda", 1): -1}
    assert zset(project.read_zset("victories").collect()) == {("yoda", 2): 1, ("vader", 2): 1}
    expected = {("yoda", ("palpatine", "vader")): 1, ("vader", ("palpatine", "yoda")): 1}
    assert zset(project.read_zset("dominates").collect()) == expected
    assert zset(project.read_zset("dominates_plain").collect()) == expected


def test_001_example_3_with_and_without_the_auxiliary_view(make_project, tmp_path):
    project = make_project(TABLES, views=VIEWS)
    project.load("tournament", lines(tmp_path / "t.jsonl", TABLE_2))
    project.refresh()
    table_2 = {("yoda", ("palpatine", "vader")): 1, ("vader", ("yoda",)): 1, ("yoda", ("palpatine",)): 1}
    both = ("dominates", "dominates_plain")
    for v in both:  # Example 3's extension of dominates, with the number of derivations
        assert zset(project.read_zset(v).collect()) == table_2
    # v_a(V, L, W) :- setof(D, tournament(V, D, L), W), stored one element per row
    va = project.read_zset("dominates__va1").collect()
    assert {(r[0], r[1]): () for r in va} and Counter((r[0], r[1], r[2]) for r in va) == Counter(
        {("yoda", "dagobah", "vader"): 1, ("yoda", "dagobah", "palpatine"): 1, ("vader", "tatooine", "yoda"): 1,
         ("yoda", "tatooine", "palpatine"): 1})

    def change(rows, kind, n):
        project.append("tournament", lines(tmp_path / f"c{n}.jsonl", rows, kind))
        assert {v.mode for v in project.refresh().views} == {"incremental"}
        return {v: zset(project.last_delta(v).collect()) for v in both}

    # Yoda defeats Vader at Tatooine: Γ2 and Γ5 give dominates⁻(yoda, {palpatine}) and
    # dominates⁺(yoda, {palpatine, vader}); with counts, (yoda, {palpatine, vader}) has two derivations
    deltas = change([("yoda", "vader", "tatooine")], "insert", 1)
    assert deltas["dominates"] == deltas["dominates_plain"] == {("yoda", ("palpatine",)): -1,
                                                                ("yoda", ("palpatine", "vader")): 1}
    change([("yoda", "vader", "tatooine")], "delete", 2)  # back to Table 2
    # deleting (yoda, vader, dagobah): the count of (yoda, {palpatine, vader}) drops from 1 to 0 and that
    # of (yoda, {palpatine}) rises from 1 to 2
    change([("yoda", "vader", "dagobah")], "delete", 3)
    for v in both:
        assert zset(project.read_zset(v).collect()) == {("vader", ("yoda",)): 1, ("yoda", ("palpatine",)): 2}
    change([("yoda", "vader", "dagobah")], "insert", 4)  # back to Table 2
    # deleting (yoda, palpatine, dagobah) instead: CReaM computes v_a⁻(yoda, dagobah, {palpatine, vader})
    # and v_a⁺(yoda, dagobah, {vader}) from v_a alone (test_delta_rules_1_to_6 checks those two tuples);
    # v_a's stored delta is the one element that left
    deltas = change([("yoda", "palpatine", "dagobah")], "delete", 5)
    assert zset(project.last_delta("dominates__va1").collect()) == {("yoda", "dagobah", "palpatine"): -1}
    # dominates by counting from v_a⁺/v_a⁻. (001 prints the table of the previous scenario here; the
    # deletion of (yoda, palpatine, dagobah) leaves {vader} at Dagobah and {palpatine} at Tatooine.)
    assert deltas["dominates"] == deltas["dominates_plain"] == {("yoda", ("palpatine", "vader")): -1,
                                                                ("yoda", ("vader",)): 1}
    for v in both:
        assert zset(project.read_zset(v).collect()) == {("vader", ("yoda",)): 1, ("yoda", ("palpatine",)): 1,
                                                        ("yoda", ("vader",)): 1}


def test_delta_rules_1_to_6(spark):
    """Δ1–Δ6 over v_a(V, L, W) of Example 3 and φ⁺/φ⁻ given directly."""
    s = SetOf((Var("D"),), Atom("va", (Var("V"), Var("D"), Var("L"))), Var("W"))
    va = spark.createDataFrame([("yoda", "dagobah", ["palpatine", "vader"]), ("vader", "tatooine", ["yoda"]),
                                ("yoda", "tatooine", ["palpatine"])], "V string, L string, W array<string>")

    def delta(changes):
        phi = spark.createDataFrame(changes, "V string, D string, L string, __count long")
        return zset(set_delta(s, phi, lambda groups: restrict(va, groups, ["V", "L"])).collect())

    # the deletion of (yoda, palpatine, dagobah): Δ3 and Δ6
    assert delta([("yoda", "palpatine", "dagobah", -1)]) == {("yoda", "dagobah", ("palpatine", "vader")): -1,
                                                             ("yoda", "dagobah", ("vader",)): 1}
    # Δ1 a new group, Δ2 and Δ5 an insert into a set, Δ4 a set's last element deleted
    assert delta([("vader", "palpatine", "dagobah", 1), ("yoda", "vader", "tatooine", 1),
                  ("vader", "yoda", "tatooine", -1)]) == {
        ("vader", "dagobah", ("palpatine",)): 1,
        ("yoda", "tatooine", ("palpatine",)): -1, ("yoda", "tatooine", ("palpatine", "vader")): 1,
        ("vader", "tatooine", ("yoda",)): -1}
    # one batch inserting into and deleting from the same set: (W' ∪ W⁺) ∖ W⁻
    assert delta([("yoda", "luke", "dagobah", 1), ("yoda", "vader", "dagobah", -1)]) == {
        ("yoda", "dagobah", ("palpatine", "vader")): -1, ("yoda", "dagobah", ("luke", "palpatine")): 1}


SINGLE = {"t": {"columns": {"k": "string", "v": "int"}},
          "tk": {"columns": {"k": "string", "v": "int"}, "key": ["k", "v"]}}
SINGLE_VIEWS = {
    "stats": {"sql": "SELECT k, median(v) AS med, percentile(v, 0.9) AS p90, mode(v) AS mo, count(DISTINCT v) AS nd, "
                     "spread(v) AS sp, pylen(v) AS n, min(v) AS lo, max(v) AS hi FROM t GROUP BY k"},
    "sets": {"datalog": "sets(K, N, M, W) :- setof(V, t(K, V), S), count(S, N), median(S, M), spread(S, W)."},
    "lows": {"datalog": "lows(K, M, P) :- groupby(t(K, V), [K], M = min(V), P = median(V))."},
    # 001 §3 Case 1 over a keyed table: the view is its own v_a, no auxiliary view
    "keyed_sets": {"datalog": "keyed_sets(K, S) :- setof(V, tk(K, V), S)."},
}
UDAS = {"spread": {"sql": "array_max(vals) - array_min(vals)"},
        "pylen": {"python": "builtins:len", "returns": "bigint"}}


def spy_reads(project, monkeypatch) -> list[str]:
    """The layer paths the maintain stage of a refresh reads (every read_layers call while it runs)."""
    import ivm.refresh.stages

    seen: list[str] = []
    active = [False]
    read, maintain = project.warehouse.read_layers, ivm.refresh.stages.maintain_stage

    def read_layers(spark, paths, schema, **kwargs):
        if active[0]:
            seen.extend(paths)
        return read(spark, paths, schema, **kwargs)

    def maintain_stage(*args, **kwargs):
        active[0] = True
        try:
            return maintain(*args, **kwargs)
        finally:
            active[0] = False

    monkeypatch.setattr(project.warehouse, "read_layers", read_layers)
    monkeypatch.setattr(ivm.refresh.stages, "maintain_stage", maintain_stage)
    return seen


def test_single_table_aggregate_views_read_no_table_file(make_project, tmp_path, monkeypatch):
    project = make_project(SINGLE, views=SINGLE_VIEWS, aggregates=UDAS)
    rows = [("a", 1), ("a", 5), ("a", 5), ("a", 9), ("b", 2), ("b", None), ("c", 7)]
    project.load("t", lines(tmp_path / "t.jsonl", rows, cols=("k", "v")))
    project.load("tk", lines(tmp_path / "tk.jsonl", [("a", 5), ("a", 9), ("b", 2), ("c", 7)], cols=("k", "v")))
    project.refresh()
    for v in SINGLE_VIEWS:
        e = project.explain(v)
        assert e.self_maintainable, (v, e.tables_read)
        assert "self-maintainable (001 §5)" in e.to_text()
    assert project.explain("sets").auxiliary_views[0]["auxiliary_view"] == "sets__va1(K, S) :- setof(V, t(K, V), S)"
    assert project.explain("keyed_sets").auxiliary_views == []
    # the current MIN and MAX of a and one of its two 5s (the mode changes), a group emptied, a new group
    changes = {"t": [("delete", ("a", 1)), ("delete", ("a", 9)), ("delete", ("a", 5)), ("delete", ("c", 7)),
                     ("insert", ("d", 4)), ("insert", ("b", 3))],
               "tk": [("delete", ("a", 9)), ("delete", ("c", 7)), ("insert", ("d", 4)), ("insert", ("a", 1))]}
    for table, items in changes.items():
        path = tmp_path / f"{table}-1.jsonl"
        path.write_text("".join(json.dumps({"k": r[0], "v": r[1], "_change_type": k}) + "\n" for k, r in items))
        project.append(table, str(path))
    files = {t: {x.path for x in project.catalog.state(t).layers} for t in SINGLE}
    seen = spy_reads(project, monkeypatch)
    result = project.refresh()
    assert {v.mode for v in result.views} == {"incremental"}
    for t in SINGLE:
        assert not files[t] & set(seen), f"{t}: a file of the table was read while the views were maintained"
        assert [x.layer.path for x in result.tables if x.table == t][0] in seen  # its delta was
    program, strata = project.program
    full = Evaluator(program, strata, {t: project.read_zset(t) for t in SINGLE})
    for v in SINGLE_VIEWS:
        assert zset(project.read_zset(v).collect()) == zset(full.relation(v).collect()), v


def test_without_auxiliary_views_the_table_is_read(make_project, tmp_path, monkeypatch):
    """The contrast (and the spy's own check): with ``auxiliary_views: false`` the setof's touched groups
    are re-read from the table, and `ivm explain` says which table and why."""
    views = {"plain": {"datalog": "plain(K, S) :- setof(V, t(K, V), S).", "auxiliary_views": False}}
    project = make_project({"t": SINGLE["t"]}, views=views)
    project.load("t", lines(tmp_path / "t.jsonl", [("a", 1), ("a", 2)], cols=("k", "v")))
    project.refresh()
    assert project.explain("plain").tables_read == {
        "t": "setof without an auxiliary view: the touched groups are re-read"}
    project.append("t", lines(tmp_path / "c.jsonl", [("a", 2)], "delete", cols=("k", "v")))
    files = {x.path for x in project.catalog.state("t").layers}
    seen = spy_reads(project, monkeypatch)
    project.refresh()
    assert files & set(seen)
    assert zset(project.read_zset("plain").collect()) == {("a", (1,)): 1}
