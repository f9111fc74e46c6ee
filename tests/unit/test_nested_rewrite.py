"""002 §2.2's extraction rewrite and §4.2's owner indexes, on the rule IR (no Spark)."""

from __future__ import annotations

import pytest

from ivm.config import parse_project
from ivm.errors import ConfigError
from ivm.lang import compile_project

TABLES = {
    "fam": {"columns": {"id": "int", "name": "string", "kids": "array<struct<name: string, toys: array<string>>>",
                        "tags": "array<string>"}, "key": ["id"]},
    "fam_ref": {"columns": {"id": "int", "kids_set": "int"}, "key": ["id"],
                "nested": {"kids_set": {"collection": "kid", "id": "set_id"}}},
    "kid": {"columns": {"set_id": "int", "name": "string", "toys_set": "int"},
            "nested": {"toys_set": {"collection": "toy", "id": "set_id"}}},
    "toy": {"columns": {"set_id": "int", "toy": "string"}},
}


def program(views: dict):
    return compile_project(parse_project({"tables": TABLES, "views": views}))


def rules(p, pred: str) -> list[str]:
    return [str(r) for r in p.rules_for(pred)]


def test_parent_columns_read_only_by_the_unnest_are_dropped():
    p = program({"v": {"sql": "SELECT f.id, t FROM fam f LATERAL VIEW explode(f.tags) x AS t"},
                 "w": {"sql": "SELECT f.id, f.tags, t FROM fam f LATERAL VIEW explode(f.tags) x AS t"}})
    assert p.predicates["e_fam_tags"].columns == ["id", "elem"]
    # w reads the array itself too: its extraction keeps the column, a different function
    [w] = rules(p, "w")
    extraction = w.split(":- ")[1].split("(")[0]
    assert extraction != "e_fam_tags" and p.predicates[extraction].columns == ["id", "tags", "elem"]


def test_an_array_of_arrays_nests_the_rewrite():
    p = program({"v": {"sql": "SELECT f.id, t FROM fam f LATERAL VIEW explode(f.kids) x AS k "
                              "LATERAL VIEW explode(x.k.toys) y AS t"}})
    [v] = rules(p, "v")
    inner = v.split(":- ")[1].split("(")[0]
    [rule] = rules(p, inner)
    outer = rule.split(":- ")[1].split("(")[0]
    assert p.predicates[inner].kind == p.predicates[outer].kind == "extraction"
    assert rules(p, outer) == ["e_fam_kids(C0, E1) :- fam(C0, C1, C2, C3), explode(`C2`) AS (E1)."]
    assert p.predicates[inner].columns == ["id", "elem"]  # the kid struct is read only for its toys


def test_views_share_an_extraction_function():
    p = program({"v": {"sql": "SELECT f.id, t FROM fam f LATERAL VIEW explode(f.tags) x AS t"},
                 "w": {"sql": "SELECT f.id, t FROM fam f LATERAL VIEW explode(f.tags) x AS t WHERE t = 'x'"},
                 # the same array projected otherwise (no parent column) is a function of its own
                 "n": {"sql": "SELECT t, count(*) AS n FROM fam f LATERAL VIEW explode(f.tags) x AS t GROUP BY t"}})
    assert [n for n, d in p.predicates.items() if d.kind == "extraction"] == ["e_fam_tags", "e_fam_tags_2"]
    assert p.predicates["e_fam_tags_2"].columns == ["elem"]


def test_recursive_rules_keep_their_unnests():
    p = program({"r": {"datalog": "r(X, Y) :- fam_ref(X, Y). r(X, Y) :- r(X, Z), fam_ref(Z, Y)."},
                 "v": {"sql": "WITH RECURSIVE c(a, b) AS "
                              "(SELECT f.id, t FROM fam f LATERAL VIEW explode(f.tags) x AS t "
                              "UNION SELECT c.a, c.b FROM c JOIN fam f ON f.id = c.a) SELECT a, b FROM c"}})
    assert not [n for n, d in p.predicates.items() if d.kind == "extraction"]


def test_hilog_collections_to_any_depth_and_owner_indexes():
    p = program({"v": {"datalog": "v(I, K, T) :- fam_ref(I, S), S(K, Ts), Ts(T)."}})
    assert rules(p, "v") == ["v(I, K, T) :- v__fam_ref_by_kids_set(I, S), v__kid_by_toys_set(S, K, Ts), toy(Ts, T)."]
    assert rules(p, "v__kid_by_toys_set") == ["v__kid_by_toys_set(C0, C1, C2) :- kid(C0, C1, C2)."]
    assert p.predicates["v__kid_by_toys_set"].cluster == ["toys_set", "set_id", "name"]
    assert p.predicates["v__kid_by_toys_set"].owner == "v"


def test_owner_index_keeps_the_collection_id_and_the_columns_read():
    """002 §4.2: an owner index maps a collection id to its owners; of the owner's columns it keeps those
    the view's rules read (one index per view, table and column, for all its rules)."""
    p = program({"v": {"datalog": "v(K) :- fam_ref(_, S), S(K, _).\nv(K) :- fam_ref(I, S), S(K, _), I > 2."}})
    assert p.predicates["v__fam_ref_by_kids_set"].columns == ["id", "kids_set"]
    assert rules(p, "v__fam_ref_by_kids_set") == ["v__fam_ref_by_kids_set(C0, C1) :- fam_ref(C0, C1)."]
    q = program({"v": {"datalog": "v(K) :- fam_ref(_, S), S(K, _)."}})
    assert q.predicates["v__fam_ref_by_kids_set"].columns == ["kids_set"]
    assert rules(q, "v") == ["v(K) :- v__fam_ref_by_kids_set(S), kid(S, K, _)."]


def test_sql_join_on_the_nested_column_uses_the_owner_index():
    p = program({"v": {"sql": "SELECT f.id, k.name FROM fam_ref f JOIN kid k ON k.set_id = f.kids_set"},
                 "w": {"sql": "SELECT f.id, k.name FROM fam_ref f JOIN kid k ON k.set_id = f.id"}})
    assert rules(p, "v")[0].split(":- ")[1].startswith("v__fam_ref_by_kids_set(")
    assert rules(p, "w")[0].split(":- ")[1].startswith("fam_ref(")  # not the nested column: a plain join


def test_hilog_arity_is_checked():
    with pytest.raises(ConfigError, match="the collection kid has 2 .name, toys_set. besides its id set_id"):
        program({"v": {"datalog": "v(I, K) :- fam_ref(I, S), S(K)."}})
