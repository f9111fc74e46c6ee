"""Validation by sampled recomputation (docs/design.md §7, ivm.validate and ivm.expectations): a wrong row,
a missing row and a wrong count injected into a staged view are each caught and named, the publish is
blocked under ``fail`` and flagged under ``warn``; `ivm validate` checks published views; the key
restriction reaches below the aggregate of the recomputation; Great Expectations' results and Data
Docs are recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import functions as F

from ivm import Project
from ivm.cli import main
from ivm.errors import ValidationError
from ivm.maintain.recompute import Evaluator
from ivm.refresh import publish_stage, validate_stage
from ivm.validate import ValueSample, key_columns, key_sample
from tests.helpers import KV_TABLES as TABLES
from tests.helpers import corrupt, lines, load_and_change, optimized_plan, stage_up_to_validate, staged_delta, views


def setup(make_project, tmp_path, policy: str) -> Project:
    p = make_project(TABLES, views=views(policy))
    load_and_change(p, tmp_path)
    return p








def test_injected_errors_are_caught_named_and_block_the_publish(make_project, tmp_path):
    p = setup(make_project, tmp_path, "fail")
    before = {v: p.catalog.state(v).version_id for v in ["t", "per_k", "joined"]}
    run_id = "inject-fail"
    stage_up_to_validate(p, run_id)
    with pytest.raises(ValidationError) as e:
        validate_stage(p.ctx, run_id)
    message = str(e.value)
    assert message.startswith("view per_k: 3 of ") and message.endswith(f"after run {run_id}; nothing was published")
    assert "(k='c', n=1, s=4) has count 0, recomputed 1" in message  # the missing row
    assert "(k='b', n=1, s=3) has count 2, recomputed 1" in message  # the wrong count
    assert "(k='zz', n=1, s=" in message and "has count 1, recomputed 0" in message  # the wrong row
    # the view's own SQL text, run by Spark SQL, finds the same three (a GROUP BY row is there once)
    assert "; against its SQL text (Spark SQL): 3 of " in message
    (check,) = p.catalog.validations(view="per_k", run_id=run_id)
    assert (check.status, check.mismatches, check.summary["sql"]["mismatches"]) == ("failed", 3, 3)
    assert {m["row"]["k"] for m in check.summary["mismatches"]} == {"zz", "c", "b"}
    assert check.summary["keys"] == ["k"] and check.summary["touched"] == 5  # a, d (the run) and zz, b, c
    outcomes = {r["expectation"]: r["success"] for r in check.summary["expectations"]}
    assert outcomes == {"expect_column_pair_values_to_be_equal": False, "expect_column_values_to_be_between": True,
                        "expect_column_values_to_not_be_null": True, "expect_column_values_to_be_unique": True}
    assert Path(check.report_uri.removeprefix("file://")).is_file()  # its Data Docs page
    (joined,) = p.catalog.validations(view="joined", run_id=run_id)
    assert (joined.status, joined.mismatches) == ("passed", 0) and joined.sample_size > 0
    # (one comparison where it passes — the view's SQL text; per_k's difference asked the compiled rules too)
    assert (joined.summary["against"], check.summary["against"]) == (["sql"], ["rules", "sql"])
    with pytest.raises(ValidationError, match=f"run {run_id}: validation failed for per_k; nothing was published"):
        publish_stage(p.ctx, run_id)
    assert {v: p.catalog.state(v).version_id for v in before} == before


def test_under_warn_the_run_publishes_and_is_flagged(make_project, tmp_path):
    p = setup(make_project, tmp_path, "warn")
    run_id = "inject-warn"
    stage_up_to_validate(p, run_id)
    problems = validate_stage(p.ctx, run_id)
    assert list(problems) == ["per_k"] and problems["per_k"].startswith("3 of ")
    assert publish_stage(p.ctx, run_id).status == "succeeded"
    (check,) = p.catalog.validations(view="per_k", run_id=run_id)
    assert check.status == "warned" and check.mismatches == 3
    assert p.read_zset("per_k").where("k = 'zz'").count() == 1  # published as it was staged


def test_ivm_validate_checks_published_views(make_project, tmp_path, capsys):
    p = setup(make_project, tmp_path, "fail")
    path = str(tmp_path / "project" / "ivm.yaml")
    p.refresh()  # validated on the way: passes
    assert {v.status for v in p.catalog.validations()} == {"passed"}
    assert main(["validate", "--project", path]) == 0
    assert "per_k   passed" in capsys.readouterr().out
    corrupt(p, "joined", lambda df: df.withColumn("w", F.lit(99)))
    assert main(["validate", "joined", "--sample", "5", "--project", path]) == 7
    err = capsys.readouterr().err
    assert err.startswith("ivm: error: view joined: 1 of ") and "w=99) has count 1, recomputed 0" in err
    run = p.runs(1)[0]
    assert (run.kind, run.status) == ("validate", "failed") and run.error.startswith("joined: 1 of ")
    p.append("t", lines(tmp_path / "c2.jsonl", [("c", 1)], "insert", cols=("k", "v")))
    p.refresh(["per_k"])  # joined has not absorbed t's new state: not checked
    assert main(["validate", "joined", "--project", path]) == 0
    assert "joined: not checked, it has not absorbed the published state of" in capsys.readouterr().out


def test_the_key_restriction_reaches_below_the_aggregate(make_project, tmp_path):
    """The sample's filter (the hash range and the touched keys' hashes) is pushed by Catalyst below the
    GROUP BY to the scan of t, so the restricted recomputation aggregates only the sampled groups."""
    p = setup(make_project, tmp_path, "fail")
    program, strata = p.program
    assert key_columns(program, "per_k", None) == ["k"]  # the GROUP BY column
    assert key_columns(program, "joined", None) == ["k", "v", "w"]
    full = Evaluator(program, strata, {t: p.read_zset(t) for t in TABLES})
    ks = key_sample(["k"], 1, 100, p.spark.createDataFrame([("a",)], "k string"), 7)
    plan = ks.restrict(full.relation("per_k"))
    tree = optimized_plan(plan)
    aggregates = [i for i, line in enumerate(tree) if "Aggregate" in line]
    hashed = [i for i, line in enumerate(tree) if "xxhash64" in line and "Filter" in line]
    assert aggregates and hashed and min(hashed) > max(aggregates) and "Relation" in tree[min(hashed) + 1], tree
    assert "a" in {r["k"] for r in plan.collect()}  # the touched key


#: two tables sorted by their first column k (no key: base layers are sorted by all columns)
SORTED = {"t": {"columns": {"k": "bigint", "v": "int"}}, "u": {"columns": {"k": "bigint", "w": "int"}}}
#: the key as each test of the value sample writes it: a number (the state's block drawn from the layers'
#: Parquet statistics) or a string (no range to draw from: `_block` draws by a seeded hash)
KEY_TYPES = {"bigint": lambda k: k, "string": lambda k: f"k{k:02d}"}


@pytest.mark.parametrize("key_type", list(KEY_TYPES))
def test_a_refresh_samples_a_large_view_on_the_values_its_change_holds(make_project, tmp_path, key_type):
    """A view larger than its sample whose key has a column its tables are sorted by (joined's k, t's and u's)
    is sampled by a refresh on that column's values (`value_sample`): those the run's change holds — in the
    view's delta and in the tables' deltas — and a draw from the state (a block of numbers, a hashed draw of
    strings). So a row the delta missed is found though no delta of the view holds its key (t's change
    does), and the sample's IN filter reaches the scans of both tables (Parquet skips the row groups between
    the values); `ivm validate` keeps the hash sample."""
    key = KEY_TYPES[key_type]
    tables = {t: {"columns": {**spec["columns"], "k": key_type}} for t, spec in SORTED.items()}
    p = make_project(tables, views={"joined": {"sql": "SELECT t.k, t.v, u.w FROM t JOIN u ON t.k = u.k",
                                               "validate": {"sample": 2}}})
    p.load("t", lines(tmp_path / "t.jsonl", [(key(k), k % 7) for k in range(40)], cols=("k", "v")))
    p.load("u", lines(tmp_path / "u.jsonl", [(key(k), 10 * k) for k in range(50)], cols=("k", "w")))
    p.refresh()
    p.append("t", lines(tmp_path / "c1.jsonl", [(key(45), 1)], "insert", cols=("k", "v")))
    run_id = "missed"
    delta = staged_delta(p, run_id, "joined")
    schema = p.spark.read.parquet(delta.path).schema
    p.spark.createDataFrame([], schema).write.mode("overwrite").parquet(delta.path)  # the delta missed (45, 1, 450)
    with pytest.raises(ValidationError, match=rf"^view joined: 1 of \d+ sampled rows differ from the recomputation: "
                                              rf"\(k={key(45)!r}, v=1, w=450\) has count 0, recomputed 1"):
        validate_stage(p.ctx, run_id)
    (check,) = p.catalog.validations(view="joined", run_id=run_id)
    assert check.summary["keys"] == ["k"] and check.summary["touched"] == 1  # 45, from t's delta alone
    # the state's part (each key one row of the view): one or two keys drawn (sample 2) besides the touched one
    assert 1 <= check.summary["rows"] - 1 <= 2, check.summary

    program, strata = p.program
    full = Evaluator(program, strata, {t: p.read_zset(t) for t in SORTED})
    tree = optimized_plan(ValueSample(["k"], [key(3), key(45)], False).restrict(full.relation("joined")))
    scans = [i for i, line in enumerate(tree) if "Relation" in line]
    assert len(scans) == 2 and all("Filter" in tree[i - 1] and f" IN ({key(3)},{key(45)})" in tree[i - 1]
                                   for i in scans), tree

    assert main(["validate", "joined", "--sample", "2", "--project", str(tmp_path / "project" / "ivm.yaml")]) == 0
    assert p.catalog.validations(view="joined", run_id=p.runs(1)[0].id)[0].summary["keys"] == ["k", "v", "w"]


@pytest.mark.parametrize("limit", [None, 3], ids=["view-read-whole", "view-at-the-delta"])
def test_a_delta_deleting_what_is_not_there_fails_the_negative_count_check(make_project, tmp_path, limit):
    """With no sampled recomputation (sample 0) the negative-count check alone: a staged delta that
    takes away two copies of a tuple the view holds once leaves it at -1; the check names the tuple and
    blocks the publish. Whether the small run reads the view whole into its one partition (the
    default) or only at the delta's tuples (a view past ``spark.single_partition_rows``: 3 here), and
    though the maintain stage read the delta layer before the bad file was added to it."""
    per_k = {"sql": "SELECT k, count(*) AS n, sum(v) AS s FROM t GROUP BY k", "validate": {"sample": 0}}
    p = make_project({"t": TABLES["t"]}, views={"per_k": per_k},
                     **({"spark": {"single_partition_rows": limit}} if limit else {}))
    p.load("t", lines(tmp_path / "t.jsonl", [(k, 1) for k in "abcde"], cols=("k", "v")))
    p.refresh()
    before = p.catalog.state("per_k").version_id
    p.append("t", lines(tmp_path / "c1.jsonl", [("a", 9)], "insert", cols=("k", "v")))
    run_id = "negative"
    delta = staged_delta(p, run_id, "per_k")
    bad = p.read_zset("per_k").where(F.col("k") == "b").withColumn("__count", F.lit(-2).cast("long"))
    bad.write.mode("append").parquet(delta.path)
    with pytest.raises(ValidationError, match=r'tuple \{"k":"b","n":1,"s":1\} would have count -1'):
        validate_stage(p.ctx, run_id)
    (check,) = p.catalog.validations(view="per_k", run_id=run_id)
    assert check.status == "failed"
    with pytest.raises(ValidationError, match="nothing was published"):
        publish_stage(p.ctx, run_id)
    assert p.catalog.state("per_k").version_id == before


@pytest.mark.parametrize("policy", ["fail", "warn"])
def test_an_error_inside_validation_is_a_failed_check_in_one_line(make_project, tmp_path, monkeypatch, policy):
    """Whatever goes wrong while checking a view (here Great Expectations raising) ends as the view's
    failed validation (warned under ``warn``, which publishes) with the error's first line: no traceback."""
    import ivm.expectations

    def broken(*_args, **_kwargs):
        raise RuntimeError("the suite broke\nat some depth")

    p = setup(make_project, tmp_path, policy)
    monkeypatch.setattr(ivm.expectations, "run_suite", broken)
    if policy == "fail":
        with pytest.raises(ValidationError, match=r"^view (joined|per_k): the sampled recomputation could not run: "
                                                   r"the suite broke after run .*; nothing was published$"):
            p.refresh()
    else:
        assert p.refresh().status == "succeeded"
    checks = {c.view: (c.status, c.summary["problem"]) for c in p.catalog.validations()
              if c.run_id == p.runs(1)[0].id}
    status = "failed" if policy == "fail" else "warned"
    problem = "the sampled recomputation could not run: the suite broke"
    assert checks == {v: (status, problem) for v in ["per_k", "joined"]}


def test_a_views_expectations_hold_over_its_whole_state_and_the_reports_last(make_project, tmp_path):
    """The project's expectations of a view run over its whole new state (GE's Spark engine), whether
    the run recomputes it (a first materialization: nothing published when one fails) or maintains it
    (caught whichever keys the sample takes); each run's Data Docs stay, listed by the index, across
    processes (a file data context in the warehouse)."""
    import ivm.expectations

    small = {"type": "expect_column_values_to_be_between", "kwargs": {"column": "s", "max_value": 100}}
    p = make_project(TABLES, views={"per_k": {"sql": "SELECT k, count(*) AS n, sum(v) AS s FROM t GROUP BY k",
                                              "key": ["k"], "validate": {"sample": 1, "expectations": [small]}}})
    p.load("t", lines(tmp_path / "t.jsonl", [("a", 1), ("b", 150)], cols=("k", "v")))
    p.load("u", lines(tmp_path / "u.jsonl", [("a", 10)], cols=("k", "w")))
    with pytest.raises(ValidationError, match=r"^view per_k: expectation expect_column_values_to_be_between"
                                              r"\(column=s\) failed for 1 rows after run .*; nothing was published$"):
        p.refresh()
    assert p.catalog.state("per_k").version_id is None  # (the first materialization did not publish)
    p.append("t", lines(tmp_path / "c1.jsonl", [("b", 150)], "delete", cols=("k", "v")))
    first = p.refresh()
    assert [v.mode for v in first.views] == ["full"]
    (check,) = p.catalog.validations(view="per_k", run_id=first.run_id)
    assert check.status == "passed" and [(r["expectation"], r["on"], r["success"]) for r in check.summary[
        "expectations"]] == [("expect_column_values_to_be_between", "view", True)]
    first_page = Path(check.report_uri.removeprefix("file://"))
    assert first_page.is_file()
    ivm.expectations._context.cache_clear()  # (the next validation as in another process)
    # two keys change, the sample takes one: the one over 100 is caught either way
    p.append("t", lines(tmp_path / "c2.jsonl", [("y", 5), ("z", 500)], "insert", cols=("k", "v")))
    with pytest.raises(ValidationError, match=r"expect_column_values_to_be_between\(column=s\) failed for 1 rows"):
        p.refresh()
    run = p.runs(1)[0]
    (check,) = p.catalog.validations(view="per_k", run_id=run.id)
    assert check.status == "failed" and {r["on"] for r in check.summary["expectations"]} == {"sample", "view"}
    assert first_page.is_file()  # the first run's page is still there, and the index lists both runs
    index = (Path(p.config.warehouse_uri.removeprefix("file://")) / "reports" / "data_docs" / "index.html").read_text()
    assert first.run_id in index and run.id in index


def test_a_front_end_mistake_is_caught_by_the_views_sql_text(make_project, tmp_path, monkeypatch):
    """ivm's compiled rules lose the view's WHERE (as a front-end bug would): maintenance and the
    recomputation from the same rules agree on the wrong rows, the view's own SQL text run by Spark SQL
    does not — the refresh is refused (#45, item 3). A Datalog view, or an SQL text Spark SQL cannot run
    (UNION in a recursive CTE), is compared with the rules alone, and its check says so. A view compared
    with its text alone is one whose text sees every count its state holds: a set kept with derivation
    counts (counting) is compared with the rules as well, a set stored by presence (004's reduce) is not."""
    import ivm.context
    from ivm.ir import Condition

    real = ivm.context.compile_project

    def loses_the_where(config):
        program = real(config)
        program.rules = [type(r)(r.head, tuple(b for b in r.body if not isinstance(b, Condition)))
                         if r.head.pred == "big" else r for r in program.rules]
        return program

    monkeypatch.setattr(ivm.context, "compile_project", loses_the_where)
    reach = ("WITH RECURSIVE r(src, dst) AS (SELECT k, k FROM t UNION SELECT r.src, t.k FROM r JOIN t "
             "ON r.dst = t.k) SELECT src, dst FROM r")
    p = make_project(TABLES, views={"big": {"sql": "SELECT k, v FROM t WHERE v > 2", "validate": {"sample": 100}},
                                    "loops": {"sql": reach, "validate": {"sample": 100}},
                                    "pairs": {"datalog": "pairs(K, W) :- t(K, _), u(K, W).",
                                              "validate": {"sample": 100}},
                                    **{f"keys_{s}": {"sql": "SELECT DISTINCT k FROM t", "strategy": s,
                                                     "validate": {"sample": 100}} for s in ("counting", "reduce")}})
    p.load("t", lines(tmp_path / "t.jsonl", [("a", 1), ("b", 3)], cols=("k", "v")))
    p.load("u", lines(tmp_path / "u.jsonl", [("a", 10)], cols=("k", "w")))
    p.refresh()  # (a first materialization: the wrong rules hold (a, 1) as well)
    p.append("t", lines(tmp_path / "c1.jsonl", [("c", 2), ("d", 5)], "insert", cols=("k", "v")))
    with pytest.raises(ValidationError, match=r"^view big: against its SQL text \(Spark SQL\): 2 of \d+ sampled rows "
                                              r"differ from the recomputation: .*has count 1, recomputed 0"):
        p.refresh()
    run = p.runs(1)[0]
    checks = {c.view: c for c in p.catalog.validations(run_id=run.id)}
    assert checks["big"].summary["sql"]["mismatches"] == 2  # (a, 1) and (c, 2): the WHERE's rows
    assert {m["row"]["k"] for m in checks["big"].summary["sql"]["examples"]} == {"a", "c"}
    assert checks["big"].summary["mismatches"] == []  # (the compiled rules agree with themselves)
    against = {v: c.summary["against"] for v, c in checks.items()}
    assert against == {"big": ["rules", "sql"], "pairs": ["rules"], "loops": ["rules"],
                       "keys_counting": ["rules", "sql"], "keys_reduce": ["sql"]}
    assert all(checks[v].status == "passed" for v in ("keys_counting", "keys_reduce"))
    assert checks["pairs"].status == "passed" and checks["pairs"].summary["sql"] is None  # (Datalog: its rules)
    assert checks["loops"].status == "passed"
    # (known from the text before Spark SQL's analysis is asked, which would log its error whole)
    assert checks["loops"].summary["sql"]["note"] == (
        "compared with ivm's compiled rules only: Spark SQL cannot run its text: loops's recursive CTE r "
        "combines with UNION, which Spark SQL runs with UNION ALL only")
