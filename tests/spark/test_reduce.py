"""004's running example (Figure 1): deleting (a2, b2) from R1 under V = π_ACE(R1 * R2 * R3), step by
step with NAIVE, RIE, RIC, REDUCE and REDUCE+ (Examples 1–6, Figures 3 and 5–9), and insertion (§5)."""

from __future__ import annotations

import pytest

from ivm.config import parse_project
from ivm.lang import compile_project
from ivm.maintain import reduce
from ivm.maintain.recompute import Evaluator
from ivm.storage import Scratch, Warehouse
from ivm.stratify import stratify
from ivm.vocabulary import ReduceAlgorithm

R1 = [("a1", "b1"), ("a2", "b2"), ("a2", "b3"), ("a2", "b4")]
R2 = [("b1", "c1", "d1"), ("b2", "c2", "d1"), ("b2", "c2", "d2"), ("b3", "c2", "d2"), ("b4", "c2", "d2"),
      ("b4", "c3", "d3")]
R3 = [("d1", "e1"), ("d1", "e4"), ("d2", "e2"), ("d2", "e4"), ("d3", "e3")]
V = {("a1", "c1", "e1"), ("a1", "c1", "e4"), ("a2", "c2", "e1"), ("a2", "c2", "e2"), ("a2", "c2", "e4"),
     ("a2", "c3", "e3")}
TABLES = {"r1": {"columns": {"a": "string", "b": "string"}},
          "r2": {"columns": {"b": "string", "c": "string", "d": "string"}},
          "r3": {"columns": {"d": "string", "e": "string"}}}
SQL = "SELECT DISTINCT r1.a, r2.c, r3.e FROM r1 JOIN r2 ON r1.b = r2.b JOIN r3 ON r2.d = r3.d"


def view_of(r1, r2) -> set:
    """V = π_ACE(R1 * R2 * R3) over the given R1 and R2."""
    return {(a, c, e) for a, b in r1 for b2, c, d in r2 if b2 == b for d2, e in R3 if d2 == d}


_RUNS: dict = {}


def run(spark, tmp_path, algorithm: str, deleted=(), inserted=(), multiple: str = "MU1", tables=TABLES,
        key=None, r1=None, r2=None, head=("a", "c", "e")):
    """Maintain V over Figure 1 for a change of R1 with one algorithm; the Reducer (its traces) and the
    view's change. ``head``: the view's columns among A, C, E (π_ACE: Figure 1's V). Runs are shared
    between the tests that look at the same one."""
    case = (algorithm, tuple(deleted), tuple(inserted), multiple, tuple(tables["r1"].get("key", [])),
            tuple(key or []), tuple(r1 or R1), tuple(r2 or R2), head)
    if case not in _RUNS:
        _RUNS[case] = _run(spark, tmp_path, algorithm, deleted, inserted, multiple, tables, key, r1 or R1, r2 or R2,
                           head)
    return _RUNS[case]


def _run(spark, tmp_path, algorithm, deleted, inserted, multiple, tables, key, r1, r2, head):
    sql = SQL.replace("r1.a, r2.c, r3.e", ", ".join(f"{dict(a='r1', c='r2', e='r3')[c]}.{c}" for c in head))
    program = compile_project(parse_project({"tables": tables, "views": {"v": {"sql": sql}}}))
    strata = stratify(program)
    cols = {n: list(t["columns"]) for n, t in tables.items()}

    def frame(name, rows, count=1):
        schema = ", ".join([*(f"{c} string" for c in cols[name]), "__count long"])
        return spark.createDataFrame([(*r, count) for r in rows], schema)

    old = {"r1": frame("r1", r1), "r2": frame("r2", r2), "r3": frame("r3", R3)}
    change = frame("r1", deleted, -1).unionByName(frame("r1", inserted, 1))
    at = ["a", "c", "e"]
    view_old = spark.createDataFrame([(*t, 1) for t in sorted({tuple(v[at.index(c)] for c in head)
                                                               for v in view_of(r1, r2)})],
                                     ", ".join([*(f"{c} string" for c in head), "__count long"]))
    scratch = Scratch(Warehouse(str(tmp_path / f"{algorithm}-{len(_RUNS)}")), spark, "run")
    s = reduce.shape(program, "v")
    r = reduce.Reducer(program, s, algorithm, multiple, key, lambda p, state: old[p],
                       lambda p: change if p == "r1" else None, view_old, scratch,
                       Evaluator(program, strata, {}))
    delta = r.run()
    return r, delta


def rows(df, *cols):
    return set() if df is None else {tuple(x[c] for c in cols) for x in df.collect()}


def sizes(step) -> tuple:
    return step.rows("candidate"), step.rows("existing")


def target_rows(r, kind: str) -> int:
    """|V_T| of the kind's update (a Spark job)."""
    target = next(t for t in r.traces if t.kind == kind).target
    return 0 if target is None else target.count()


def steps(r, kind="deletion"):
    return next(t for t in r.traces if t.kind == kind).steps


def test_example_1_target_relation(spark, tmp_path):
    assert view_of(R1, R2) == V  # Figure 1
    r, delta = run(spark, tmp_path, "NAIVE", deleted=[("a2", "b2")])
    # Figure 3: V_T = {(a2, c2, e1)}; (a2, c2, e2), (a2, c2, e4) are derived by (a2, b3) and (a2, b4) too
    assert rows(delta, "a", "c", "e", "__count") == {("a2", "c2", "e1", -1)}


def test_example_2_naive(spark, tmp_path):
    r, _ = run(spark, tmp_path, "NAIVE", deleted=[("a2", "b2")])
    st = steps(r)
    assert rows(st[0].frames["candidate"], "r1_a_1", "r1_b_1") == {("a2", "b2")}
    assert rows(st[0].frames["existing"], "r1_a_1", "r1_b_1") == {("a2", "b3"), ("a2", "b4")}  # Figure 5
    assert rows(st[1].frames["candidate"], "r1_a_1", "r1_b_1", "r2_c_1", "r2_d_1") == {
        ("a2", "b2", "c2", "d1"), ("a2", "b2", "c2", "d2")}
    assert rows(st[1].frames["existing"], "r1_a_1", "r1_b_1", "r2_c_1", "r2_d_1") == {
        ("a2", "b3", "c2", "d2"), ("a2", "b4", "c2", "d2"), ("a2", "b4", "c3", "d3")}
    assert [sizes(x) for x in st] == [(1, 2), (2, 3), (4, 5)]


def test_example_3_rie(spark, tmp_path):
    r, delta = run(spark, tmp_path, "RIE", deleted=[("a2", "b2")])
    st = steps(r)
    # (a2, b4, c3, d3) agrees with no candidate on AC: it is not kept (Figure 6)
    assert rows(st[1].frames["existing"], "r1_a_1", "r1_b_1", "r2_c_1", "r2_d_1") == {
        ("a2", "b3", "c2", "d2"), ("a2", "b4", "c2", "d2")}
    assert [sizes(x) for x in st] == [(1, 2), (2, 2), (4, 4)]
    assert rows(delta, "a", "c", "e", "__count") == {("a2", "c2", "e1", -1)}


def test_example_4_ric(spark, tmp_path):
    r, delta = run(spark, tmp_path, "RIC", deleted=[("a2", "b2")])
    st = steps(r)
    # (a2, b2, c2, d2) agrees with (a2, b3, c2, d2) of V_E^2 on Z_2 = ACD: dropped (Figure 7)
    assert rows(st[1].frames["candidate"], "r1_a_1", "r1_b_1", "r2_c_1", "r2_d_1") == {("a2", "b2", "c2", "d1")}
    assert rows(st[2].frames["candidate"], "r1_a_1", "r2_c_1", "r3_e_1") == {("a2", "c2", "e1")}
    assert [sizes(x) for x in st] == [(1, 2), (1, 3), (1, 5)]
    assert rows(delta, "a", "c", "e", "__count") == {("a2", "c2", "e1", -1)}


def test_example_5_reduce(spark, tmp_path):
    r, delta = run(spark, tmp_path, "REDUCE", deleted=[("a2", "b2")])
    st = steps(r)
    assert rows(st[1].frames["existing"], "r1_a_1", "r1_b_1", "r2_c_1", "r2_d_1") == {
        ("a2", "b3", "c2", "d2"), ("a2", "b4", "c2", "d2")}  # Figure 8
    # V_E^3 as Figure 8 shows it, joined and not reduced: RIE cannot pay at the last step (V_T = π V_C^3; §7)
    assert rows(st[2].frames["existing"], "r1_b_1", "r3_e_1") == {("b3", "e2"), ("b4", "e2"), ("b3", "e4"),
                                                                  ("b4", "e4")}
    assert "RIE skipped at step 3" in st[2].note
    assert [sizes(x) for x in st] == [(1, 2), (1, 2), (1, 4)]
    assert rows(delta, "a", "c", "e", "__count") == {("a2", "c2", "e1", -1)}


def test_example_6_reduce_plus_projects_early(spark, tmp_path):
    r, delta = run(spark, tmp_path, "REDUCE+", deleted=[("a2", "b2")])
    st = steps(r)
    assert set(st[1].frames["candidate"].columns) == {"r1_a_1", "r2_c_1", "r2_d_1", "__count"}  # Z_2 = ACD
    assert rows(st[1].frames["candidate"], "r1_a_1", "r2_c_1", "r2_d_1") == {("a2", "c2", "d1")}
    assert rows(st[1].frames["existing"], "r1_a_1", "r2_c_1", "r2_d_1") == {("a2", "c2", "d2")}  # Figure 9
    assert rows(st[2].frames["existing"], "r1_a_1", "r2_c_1", "r3_e_1") == {("a2", "c2", "e2"), ("a2", "c2", "e4")}
    assert [sizes(x) for x in st] == [(1, 2), (1, 1), (1, 2)]
    assert rows(delta, "a", "c", "e", "__count") == {("a2", "c2", "e1", -1)}


def test_reduce_intermediate_results_no_larger_than_naive(spark, tmp_path):
    counted = {}
    for alg in list(ReduceAlgorithm):
        r, delta = run(spark, tmp_path, alg, deleted=[("a2", "b2")])
        st = steps(r)
        counted[alg] = tuple(sum(n or 0 for n in side) for side in zip(*map(sizes, st), strict=True))
        assert rows(delta, "a", "c", "e", "__count") == {("a2", "c2", "e1", -1)}, alg
    for alg in ("RIE", "RIC", "REDUCE", "REDUCE+"):
        assert counted[alg][0] <= counted["NAIVE"][0] and counted[alg][1] <= counted["NAIVE"][1], (alg, counted)
    assert sum(counted["REDUCE"]) < sum(counted["NAIVE"]) and sum(counted["REDUCE+"]) <= sum(counted["REDUCE"])


@pytest.mark.parametrize("algorithm", list(ReduceAlgorithm))
def test_insertion_section_5(spark, tmp_path, algorithm):
    # (a1, b2) derives (a1, c2, e1), (a1, c2, e2), (a1, c2, e4): all new
    r, delta = run(spark, tmp_path, algorithm, inserted=[("a1", "b2")])
    assert rows(delta, "a", "c", "e", "__count") == {("a1", "c2", "e1", 1), ("a1", "c2", "e2", 1),
                                                    ("a1", "c2", "e4", 1)}


@pytest.mark.parametrize("algorithm", ["NAIVE", "REDUCE+"])
def test_insertion_of_tuples_deriving_present_view_tuples(spark, tmp_path, algorithm):
    # (a2, b2) with (a2, b3), (a2, b4) present: the target is what they do not derive already
    r, delta = run(spark, tmp_path, algorithm, inserted=[("a2", "b2")], r1=[x for x in R1 if x != ("a2", "b2")])
    assert rows(delta, "a", "c", "e", "__count") == {("a2", "c2", "e1", 1)}


def test_an_empty_candidate_relation_empties_the_update(spark, tmp_path):
    # (a2, b5) joins nothing in R2: V_C^2 = ∅ and so is every later step (one plan: Spark's adaptive
    # execution empties the joins above an empty side); an insertion under REDUCE+ builds no V_E (§5, V)
    r, delta = run(spark, tmp_path, "REDUCE+", inserted=[("a2", "b5")])
    assert rows(delta, "a") == set() and [sizes(x) for x in steps(r, "insertion")] == [(1, None), (0, None), (0, None)]


@pytest.mark.parametrize(("algorithm", "head"), [("RIC", ("a", "c", "e")), ("REDUCE", ("e",))])
def test_the_update_quits_once_ric_empties_the_candidates(spark, tmp_path, algorithm, head):
    # deleting (a2, b3): its one candidate at step 2, (a2, b3, c2, d2), agrees on Z_2 (ACD; under π_E, D)
    # with (a2, b2, c2, d2) of V_E^2 and RIC drops it: V_C^2 = ∅, V_T = ∅, and the update quits (§3 after
    # Lemma 2: "without accessing R_k"): the existing side goes too (RIC's V_T reads none; under π_E,
    # Y_2 = ∅ and RIE over no column keeps nothing once no candidate is left), so step 3 joins nothing
    r, delta = run(spark, tmp_path, algorithm, deleted=[("a2", "b3")], head=head)
    assert rows(delta, *head) == set()
    assert [sizes(x) for x in steps(r)] == [(1, 3 if head == ("e",) else 2), (0, 0), (0, 0)]


@pytest.mark.parametrize("multiple", ["MU1", "MU2"])
def test_multiple_updates_delete_and_insert_together(spark, tmp_path, multiple):
    # deleting (a2, b2) and inserting (a2, b1): (a2, c1, e1), (a2, c1, e4) enter; (a2, c2, e1) leaves
    r, delta = run(spark, tmp_path, "REDUCE+", deleted=[("a2", "b2")], inserted=[("a2", "b1")], multiple=multiple)
    assert rows(delta, "a", "c", "e", "__count") == {("a2", "c2", "e1", -1), ("a2", "c1", "e1", 1),
                                                    ("a2", "c1", "e4", 1)}


def test_mu2_insertion_candidates_reduce_the_deletions(spark, tmp_path):
    # R2 also holds (b5, c2, d1): deleting (a2, b2) while inserting (a2, b5) leaves V as it is. MU1 finds
    # (a2, c2, e1) both leaving and entering; MU2 drops the deletion's candidate (a2, c2, d1) at step 2,
    # since the insertion's candidates hold it (Algorithm 7)
    r2 = [*R2, ("b5", "c2", "d1")]
    mu1, d1 = run(spark, tmp_path, "REDUCE", deleted=[("a2", "b2")], inserted=[("a2", "b5")], multiple="MU1", r2=r2)
    mu2, d2 = run(spark, tmp_path, "REDUCE", deleted=[("a2", "b2")], inserted=[("a2", "b5")], multiple="MU2", r2=r2)
    assert rows(d1, "a", "c", "e") == set() and rows(d2, "a", "c", "e") == set()
    assert target_rows(mu1, "deletion") == 1
    assert [x.rows("candidate") for x in steps(mu2)] == [1, 0, 0]
    assert target_rows(mu2, "deletion") == 0
    # the insertion's candidates' view tuples, both in V already (§5 with V as the existing relation)
    assert target_rows(mu2, "insertion") == 2


def test_theorem_3_deletion_read_from_the_view(spark, tmp_path):
    # R1 keyed by A and X_V ⊇ A: t is the only tuple deriving view tuples with its A value
    tables = {**TABLES, "r1": {**TABLES["r1"], "key": ["a"]}}
    r, delta = run(spark, tmp_path, "REDUCE+", deleted=[("a2", "b2")], tables=tables, r1=[("a1", "b1"), ("a2", "b2")])
    st = steps(r)
    assert len(st) == 1 and st[0].rows("existing") is None and "Theorem 3" in st[0].note
    # every tuple of V with A = a2 leaves, read off V without touching R2 or R3
    assert rows(delta, "a", "c", "e", "__count") == {(a, c, e, -1) for a, c, e in view_of(
        [("a1", "b1"), ("a2", "b2")], R2) if a == "a2"}


def test_ric_is_skipped_once_theorem_3_leaves_no_existing_relation(spark, tmp_path):
    # R2 keyed by C and X_V ⊇ C: V_E^2 = ∅ (Theorem 3), so at step 3 RIC has nothing to compare with and is
    # skipped (§7: a reduction that cannot pay); the target is V_C^3's view tuples all the same
    tables = {**TABLES, "r2": {**TABLES["r2"], "key": ["c"]}}
    r2 = [("b1", "c1", "d1"), ("b2", "c2", "d1"), ("b3", "c3", "d2"), ("b4", "c4", "d2")]
    r, delta = run(spark, tmp_path, "REDUCE", deleted=[("a2", "b2")], tables=tables, r2=r2)
    st = steps(r)
    assert [x.table for x in st] == ["r1", "r2", "r3"]
    assert "Theorem 3" in st[1].note and "RIC skipped at step 3" in st[2].note and "RIC" not in st[1].note
    assert rows(delta, "a", "c", "e", "__count") == {("a2", "c2", "e1", -1), ("a2", "c2", "e4", -1)}
    assert rows(delta, "a", "c", "e", "__count") == {(*v, -1) for v in view_of(R1, r2) - view_of(
        [x for x in R1 if x != ("a2", "b2")], r2)}


def test_theorem_4_stops_when_y_holds_the_views_key(spark, tmp_path):
    # declared view key (a, c): after step 2, Y_2 = AC holds it; the deletion's targets come from V
    r, delta = run(spark, tmp_path, "REDUCE", deleted=[("a2", "b4")], key=["a", "c"])
    st = steps(r)
    assert len(st) == 2 and "Theorem 4" in st[1].note
    # (a2, b4) alone derives (a2, c3, e3); (a2, c2, *) stays (derived by b2, b3)
    assert rows(delta, "a", "c", "e", "__count") == {("a2", "c3", "e3", -1)}


@pytest.mark.parametrize("algorithm", ["RIE", "REDUCE", "REDUCE+"])
def test_rie_before_any_view_column_is_joined(spark, tmp_path, algorithm):
    # V = π_E: R1 and R2 give it no column, so Y_1 = Y_2 = ∅ and every existing tuple agrees with every
    # candidate at step 2 (RIE over no column keeps them all). (a2, b4) alone
    # derives e3 (through c3, d3); e2 and e4 it derives through d2 stay, derived by (a2, b3)
    r, delta = run(spark, tmp_path, algorithm, deleted=[("a2", "b4")], head=("e",))
    assert rows(delta, "e", "__count") == {("e3", -1)}
    assert steps(r)[1].rows("existing") > 0
    # (a2, b2) derives e1, e2, e4, each derived by another tuple of R1 too: V stays as it is
    r, delta = run(spark, tmp_path, algorithm, deleted=[("a2", "b2")], head=("e",))
    assert rows(delta, "e", "__count") == set()
