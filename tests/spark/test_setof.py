"""001's running example through `ivm refresh`: Table 2's tournament and the views victories and
dominates (Example 3), the Vader-defeats-Palpatine insert and the invalidated match delete (§1)."""

from __future__ import annotations

import json
from collections import Counter

TABLES = {"tournament": {"columns": {"victor": "string", "defeated": "string", "location": "string"}}}
VIEWS = {
    "victories": {"datalog": "victories(V, W) :- setof(D, tournament(V, D, L), S), count(S, W)."},
    "dominates": {"datalog": "dominates(V, W) :- setof(D, tournament(V, D, L), W)."},
}
TABLE_2 = [("yoda", "vader", "dagobah"), ("yoda", "palpatine", "dagobah"), ("vader", "yoda", "tatooine"),
           ("yoda", "palpatine", "tatooine")]


def lines(path, rows, change=None):
    cols = ["victor", "defeated", "location"]
    path.write_text("".join(json.dumps({**dict(zip(cols, r, strict=True)),
                                        **({"_change_type": change} if change else {})}) + "\n" for r in rows))
    return str(path)


def view(project, name):
    return Counter((r[0], tuple(r[1]) if isinstance(r[1], list) else r[1]) for r in project.read(name).collect())


def test_001_running_example(make_project, tmp_path):
    project = make_project(TABLES, views=VIEWS)
    project.load("tournament", lines(tmp_path / "t.jsonl", TABLE_2))
    project.refresh()
    # Table 2: Yoda has two victories in Dagobah and one in Tatooine, Vader one
    assert view(project, "victories") == Counter({("yoda", 2): 1, ("vader", 1): 1, ("yoda", 1): 1})
    # Example 3: dominates(V, W) groups by V and the unseen L
    assert view(project, "dominates") == Counter({("yoda", ("palpatine", "vader")): 1, ("vader", ("yoda",)): 1,
                                                  ("yoda", ("palpatine",)): 1})
    # Darth Vader defeats Emperor Palpatine at Tatooine: (vader, 1) becomes (vader, 2)
    project.append("tournament", lines(tmp_path / "ins.jsonl", [("vader", "palpatine", "tatooine")], "insert"))
    project.refresh()
    assert view(project, "victories") == Counter({("yoda", 2): 1, ("vader", 2): 1, ("yoda", 1): 1})
    # the match between Yoda and Palpatine at Tatooine is invalidated: (yoda, 1) leaves the view
    project.append("tournament", lines(tmp_path / "del.jsonl", [("yoda", "palpatine", "tatooine")], "delete"))
    project.refresh()
    assert view(project, "victories") == Counter({("yoda", 2): 1, ("vader", 2): 1})
    assert view(project, "dominates") == Counter({("yoda", ("palpatine", "vader")): 1,
                                                  ("vader", ("palpatine", "yoda")): 1})
    # a set view stores derivation counts: each (victor, set) here comes from one location
    assert {r["__count"] for r in project.read_zset("dominates").collect()} == {1}
