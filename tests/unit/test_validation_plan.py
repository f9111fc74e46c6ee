"""Which views' validation runs a Great Expectations suite (`refresh.validation.runs_suites`): the runs
that import GE ahead (`expectations.import_ahead`) are those, and only those (no Spark)."""

from __future__ import annotations

from types import SimpleNamespace

from ivm.config import parse_project
from ivm.modes import Mode
from ivm.refresh.record import ViewWork
from ivm.refresh.validation import runs_suites

CONFIG = parse_project({
    "tables": {"t": {"columns": {"k": "string", "v": "int"}}},
    "views": {"sampled": {"sql": "SELECT k, sum(v) AS s FROM t GROUP BY k"},
              "unsampled": {"sql": "SELECT k, count(*) AS n FROM t GROUP BY k", "validate": {"sample": 0}},
              "expected": {"sql": "SELECT DISTINCT k FROM t", "validate": {"sample": 0, "expectations": [
                  {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "k"}}]}}}})
CTX = SimpleNamespace(config=CONFIG)


def work(view: str, mode: Mode, written: bool = True) -> ViewWork:
    return ViewWork(view, 1, mode, "", ["t"], layers={view: object()} if written else {})


def test_a_suite_runs_for_a_sample_or_expectations_only():
    assert runs_suites(CTX, work("sampled", Mode.INCREMENTAL))
    assert not runs_suites(CTX, work("sampled", Mode.INCREMENTAL), sample=0)  # (`--sample 0`)
    assert not runs_suites(CTX, work("unsampled", Mode.INCREMENTAL))
    assert runs_suites(CTX, work("unsampled", Mode.INCREMENTAL), sample=100)
    assert runs_suites(CTX, work("expected", Mode.INCREMENTAL))
    assert runs_suites(CTX, work("expected", Mode.FULL))  # a recompute: its own expectations only
    assert not runs_suites(CTX, work("sampled", Mode.FULL))
    assert not runs_suites(CTX, work("sampled", Mode.NOOP))
