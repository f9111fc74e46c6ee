"""OpenLineage from `ivm refresh` (ivm.lineage): with a transport in the project file, each run sends a START
event once planned and a COMPLETE (or FAIL) event when it ends, read back here from the client's own file
transport — inputs the tables whose changes it read (a Delta source at the Delta version read, a table of
ivm's at its log's commit version, with the change rows read), outputs the views' Delta tables at the
versions the sink wrote (those `ivm snapshot` lists), the ivm run id a tag of both. Without a transport
nothing is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ivm import sinks
from ivm.errors import ChangeDataError
from ivm.lineage import dataset_id
from tests.helpers import write_jsonl

TABLES = {"t": {"columns": {"k": "int", "v": "int"}, "key": ["k"]}}
VIEWS = {"per_v": {"sql": "SELECT v, count(*) AS n FROM t GROUP BY v", "key": ["v"]},
         "joined": {"sql": "SELECT t.k, t.v, e.kind FROM t JOIN events e ON t.k = e.k"}}


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def by_name(datasets: list[dict]) -> dict[str, dict]:
    return {d["name"]: d for d in datasets}


@pytest.fixture
def lake(spark, tmp_path) -> str:
    where = str(tmp_path / "lake" / "events")
    spark.createDataFrame([(1, "a"), (2, "b")], "k INT, kind STRING").write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(where)
    return where


def test_each_refresh_sends_its_inputs_and_outputs_with_their_versions(make_project, spark, lake, tmp_path):
    file = tmp_path / "lineage.jsonl"
    tables = {**TABLES, "events": {"columns": {"k": "int", "kind": "string"}, "source": {"delta": lake}}}
    p = make_project(tables, views=VIEWS, storage={"delta_views": True}, name="lineage",
                     lineage={"namespace": "analytics", "transport": {"type": "file", "log_file_path": str(file),
                                                                      "append": True}})
    p.load("t", write_jsonl(tmp_path / "t0.jsonl", ["k", "v"], [(1, 10), (2, 10), (3, 20)]))
    first = p.refresh()
    p.append("t", write_jsonl(tmp_path / "t1.jsonl", ["k", "v"], [(3, 20), (4, 20)], ["delete", "insert"]))
    spark.sql(f"INSERT INTO delta.`{lake}` VALUES (4, 'c')")
    second = p.refresh()

    sent = events(file)
    assert [(e["eventType"], e["run"]["facets"]["tags"]["tags"][0]["value"]) for e in sent] == [
        ("START", first.run_id), ("COMPLETE", first.run_id), ("START", second.run_id), ("COMPLETE", second.run_id)]
    assert len({e["run"]["runId"] for e in sent[:2]}) == 1 and sent[0]["run"]["runId"] != sent[2]["run"]["runId"]
    assert {e["job"]["namespace"] for e in sent} == {"analytics"}
    assert {e["job"]["name"] for e in sent} == {f"{p.config.project_name}.refresh"}

    done = sent[3]
    inputs = by_name(done["inputs"])
    log_ns, log_name = dataset_id(p.ctx.warehouse.path("log", "t"))
    lake_ns, lake_name = dataset_id(lake)
    assert set(inputs) == {log_name, lake_name} and {i["namespace"] for i in inputs.values()} == {log_ns, lake_ns}
    # t: its log's commit version of the run's snapshot, two change rows; events: Delta version 1 (the insert)
    assert inputs[log_name]["facets"]["version"]["datasetVersion"] == str(second.snapshot["t"])
    assert inputs[log_name]["inputFacets"]["inputStatistics"]["rowCount"] == 2
    assert inputs[lake_name]["facets"]["version"]["datasetVersion"] == "1"
    assert [f["name"] for f in inputs[lake_name]["facets"]["schema"]["fields"]] == ["k", "kind"]

    outputs = by_name(done["outputs"])
    current = {s.view: s for s in sinks.snapshot(p.ctx)}
    assert set(outputs) == {dataset_id(current[v].location)[1] for v in VIEWS}
    for view in VIEWS:
        out = outputs[dataset_id(current[view].location)[1]]
        assert out["facets"]["version"]["datasetVersion"] == str(current[view].delta_version)
        assert out["facets"]["symlinks"]["identifiers"][0]["name"] == f"{p.config.database}.{view}"
    assert sent[2]["outputs"] == []  # (START: nothing written yet)


def test_a_failed_refresh_sends_fail_with_its_one_line_error(make_project, tmp_path):
    file = tmp_path / "lineage.jsonl"
    p = make_project(TABLES, views={"per_v": VIEWS["per_v"]},
                     lineage={"transport": {"type": "file", "log_file_path": str(file), "append": True}})
    p.load("t", write_jsonl(tmp_path / "t0.jsonl", ["k", "v"], [(1, 10)]))
    p.refresh()
    p.append("t", write_jsonl(tmp_path / "bad.jsonl", ["k", "v"], [(9, 90)], ["delete"]))
    with pytest.raises(ChangeDataError) as bad:
        p.refresh()
    failed = events(file)[-1]
    assert failed["eventType"] == "FAIL" and failed["outputs"] == []
    assert failed["run"]["facets"]["errorMessage"]["message"] == str(bad.value)
    assert "commit version" in str(bad.value) and "k=9" in str(bad.value)


def test_no_transport_sends_nothing(make_project, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # (no openlineage.yml here)
    for var in ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    p = make_project(TABLES, views={"per_v": VIEWS["per_v"]})
    assert not p.config.lineage.may_emit()
    p.load("t", write_jsonl(tmp_path / "t0.jsonl", ["k", "v"], [(1, 10)]))
    p.refresh()
    assert "eventType" not in capsys.readouterr().out  # (not the client's fallback to the console)
