"""The project file: what is accepted, and that every error names the field."""

from pathlib import Path

import pytest

from ivm.config import find_project_file, load_project, parse_project
from ivm.errors import ConfigError


def parse(doc: dict, root: Path | str = "."):
    return parse_project(doc, root=root)


def test_full_contract(tmp_path):
    (tmp_path / "views").mkdir()
    (tmp_path / "views" / "reach.dl").write_text("reach(X,Y) :- link(X,Y).\n")
    cfg = parse({
        "warehouse": "./wh",
        "catalog": "sqlite:///./wh/catalog.db",
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "tables": {
            "flight": {"columns": {"flight_id": "int", "legs": "array<struct<from: string, to: string>>"},
                       "key": ["flight_id"]},
            "res": {"columns": {"res_id": "int", "psgr_id": "int", "flight_id": "int", "seat": "string"},
                    "key": ["res_id"], "unique": [["psgr_id", "flight_id"], ["flight_id", "seat"]],
                    "references": {"flight_id": "flight.flight_id"}},
        },
        "views": {
            "hop": {"sql": "SELECT 1 AS x", "validate": {"sample": 10, "policy": "warn"}, "mode": "full"},
            "reach": {"datalog": "views/reach.dl", "strategy": "counting"},
        },
    }, root=tmp_path)
    assert cfg.warehouse_uri == str(tmp_path / "wh")
    assert cfg.catalog_url == f"sqlite:///{tmp_path / 'wh' / 'catalog.db'}"
    assert cfg.tables["flight"].columns["legs"] == "ARRAY<STRUCT<from: STRING, to: STRING>>"
    assert cfg.tables["res"].unique == [["psgr_id", "flight_id"], ["flight_id", "seat"]]
    assert cfg.views["reach"].definition == "reach(X,Y) :- link(X,Y).\n"
    assert cfg.views["reach"].source == str(tmp_path / "views" / "reach.dl")
    assert cfg.views["hop"].validate_.policy == "warn" and cfg.views["hop"].mode == "full"


def test_default_catalog_lives_in_the_warehouse(tmp_path):
    cfg = parse({"warehouse": "w", "tables": {}}, root=tmp_path)
    assert cfg.catalog_url == f"sqlite:///{tmp_path / 'w' / 'catalog.db'}"
    remote = parse({"warehouse": "s3a://bucket/wh", "tables": {}})
    with pytest.raises(ConfigError, match="catalog: required"):
        _ = remote.catalog_url


@pytest.mark.parametrize("doc, message", [
    ({"tables": {"t": {"columns": {"a": "int"}, "key": ["b"]}}}, "tables.t: key: unknown column 'b'"),
    ({"tables": {"t": {"columns": {"a": "intt"}}}}, "tables.t.columns: 'intt' is not a Spark SQL type"),
    ({"tables": {"t": {"columns": {"a": "map<string,int>"}}}}, "map types are not supported"),
    ({"tables": {"t": {"columns": {"__count": "int"}}}}, "column name '__count' is reserved"),
    ({"tables": {"t": {"columns": {}}}}, "tables.t.columns: a table needs at least one column"),
    ({"tables": {"t": {"columns": {"a": "int"}, "unique": [["a", "z"]]}}}, "unique: unknown column 'z'"),
    ({"tables": {"t": {"columns": {"a": "int"}, "colums": {}}}}, "tables.t.colums: unknown setting"),
    ({"tables": {"t": {"columns": {"a": "int"}, "references": {"a": "u.id"}}}},
     "tables.t.references.a: unknown table 'u'"),
    ({"tables": {"t": {"columns": {"a": "int"}, "references": {"a": "t"}}}}, "not of the form table.column"),
    ({"tables": {"t": {"columns": {"a": "int"}, "references": {"a": "u.b"}}, "u": {"columns": {"b": "int", "c": "int"},
                                                                              "key": ["b", "c"]}}},
     "tables.t.references.a: u.b is not a key of u"),
    ({"tables": {"t": {"columns": {"a": "string"}, "references": {"a": "u.b"}}, "u": {"columns": {"b": "int"},
                                                                                 "key": ["b"]}}},
     "tables.t.references.a: the column is STRING but u.b is INT"),
    ({"tables": {"t": {"columns": {"a": "int"}}}, "views": {"v": {"sql": "x", "datalog": "y"}}},
     "views.v: a view needs exactly one of `sql` or `datalog`"),
    ({"tables": {"t": {"columns": {"a": "int"}}}, "views": {"t": {"sql": "x"}}}, "views.t: a table has the same name"),
    ({"tables": {}, "views": {"v": {"sql": "x", "mode": "sometimes"}}}, "views.v.mode"),
    ({"tables": {"bad-name": {"columns": {"a": "int"}}}}, "relation name 'bad-name' is not an identifier"),
    ({"storage": {"compact_max_layers": 0}}, "storage.compact_max_layers"),
    ({"tables": {"t": {"columns": {"a": "int"}, "nested": {"b": {"collection": "t", "id": "a"}}}}},
     "tables.t: nested: unknown column 'b'"),
    ({"tables": {"t": {"columns": {"a": "int"}, "nested": {"a": {"collection": "s", "id": "id"}}}}},
     "tables.t.nested.a: unknown collection table 's'"),
    ({"tables": {"t": {"columns": {"a": "int"}, "nested": {"a": {"collection": "s", "id": "x"}}},
                 "s": {"columns": {"id": "int"}}}}, "tables.t.nested.a: table 's' has no column 'x'"),
    ({"tables": {"t": {"columns": {"a": "int"}, "nested": {"a": {"collection": "s", "id": "id"}}},
                 "s": {"columns": {"id": "string"}}}}, "tables.t.nested.a: the column is INT but s.id is STRING"),
    ({"tables": {"t": {"columns": {"a": "int"}, "nested": {"a": {"collection": "s", "id": "id"}}},
                 "s": {"columns": {"id": "int", "b": "int"}, "nested": {"b": {"collection": "t", "id": "a"}}}}},
     "collections nest each other in a cycle: t -> s -> t"),
    ({"tables": {}, "views": {"v": {"sql": "x", "schedule": "0 25 * * *"}}},
     "views.v.schedule: '0 25 * * *' is not a cron string"),
    ({"tables": {}, "views": {"v": {"sql": "x", "schedule": "daily"}}}, "views.v.schedule: 'daily' is not a cron"),
    ({"tables": {}, "views": {"v": {"sql": "x", "schedule": "@nightly"}}},
     "views.v.schedule: unknown schedule preset '@nightly' (presets: @hourly, @daily"),
    # inductive aggregates (001 §2): every step, each reading only its own names
    ({"aggregates": {"g": {"initial": "0", "iterate": "state + x", "final": "state"}}},
     "aggregates.g: an inductive aggregate needs merge too"),
    ({"aggregates": {"g": {"initial": "0", "iterate": "state + y", "merge": "state + other", "final": "state"}}},
     "iterate: reads y; it may read `state` and `x`"),
    ({"aggregates": {"g": {"initial": "0", "iterate": "state + x", "merge": "state + x", "final": "state"}}},
     "merge: reads x; it may read `other` and `state`"),
    ({"aggregates": {"g": {"initial": "x", "iterate": "state + x", "merge": "state + other", "final": "state"}}},
     "initial: reads x; it may read no column"),
    ({"aggregates": {"g": {"initial": "0", "iterate": "state +", "merge": "state + other", "final": "state"}}},
     "iterate: not a Spark SQL expression"),
    ({"aggregates": {"g": {"sql": "array_max(vals)", "initial": "0"}}},
     "an aggregate needs exactly one of `sql`, `python` or `initial`/`iterate`/`merge`/`final`"),
    ({"aggregates": {"g": {"initial": "0", "iterate": "state + x", "merge": "state + other", "final": "state",
                           "returns": "int"}}}, "returns: only a Python aggregate declares its type"),
])
def test_errors_name_the_field(doc, message):
    with pytest.raises(ConfigError) as e:
        parse(doc)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_inductive_aggregates_may_use_lambdas_and_struct_fields():
    cfg = parse({"aggregates": {"g": {
        "initial": "named_struct('n', 0L, 'xs', array())",
        "iterate": "named_struct('n', state.n + 1, 'xs', filter(array_union(state.xs, array(x)), y -> y > 0))",
        "merge": "named_struct('n', state.n + other.n, 'xs', array_union(state.xs, other.xs))",
        "final": "size(state.xs)"}}})
    assert cfg.aggregates["g"].inductive and cfg.aggregates["g"].retract is None


def test_view_file_must_exist(tmp_path):
    with pytest.raises(ConfigError, match=r"views.v.sql: file 'nope.sql' not found"):
        parse({"views": {"v": {"sql": "nope.sql"}}}, root=tmp_path)


def test_project_file_lookup(tmp_path, monkeypatch):
    (tmp_path / "ivm.yaml").write_text("tables: {t: {columns: {a: int}}}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("IVM_PROJECT", raising=False)
    assert find_project_file() == tmp_path / "ivm.yaml"
    other = tmp_path / "other"
    other.mkdir()
    (other / "ivm.yaml").write_text("tables: {}\n")
    monkeypatch.setenv("IVM_PROJECT", str(other / "ivm.yaml"))
    assert find_project_file() == other / "ivm.yaml"
    assert find_project_file(tmp_path) == tmp_path / "ivm.yaml"
    with pytest.raises(ConfigError, match="project file 'missing.yaml' not found"):
        find_project_file("missing.yaml")


def test_yaml_errors_are_one_line(tmp_path):
    (tmp_path / "ivm.yaml").write_text("tables: {t: [\n")
    with pytest.raises(ConfigError, match=r"not valid YAML") as e:
        load_project(tmp_path / "ivm.yaml")
    assert "\n" not in str(e.value)


def test_environment_variables_in_the_project_file(tmp_path, monkeypatch):
    """${NAME} and ${NAME:-default} read the environment; a missing variable without a default is an
    error naming the file and the line."""
    path = tmp_path / "ivm.yaml"
    path.write_text("warehouse: ${WH:-./wh}\ncatalog: ${CAT}\ntables: {}\n")
    monkeypatch.setenv("CAT", "postgresql+psycopg2://ivm:secret@db/ivm")
    config = load_project(path)
    assert config.warehouse_uri == str(tmp_path / "wh") and config.catalog == "postgresql+psycopg2://ivm:secret@db/ivm"
    monkeypatch.setenv("WH", str(tmp_path / "elsewhere"))
    assert load_project(path).warehouse_uri == str(tmp_path / "elsewhere")
    monkeypatch.delenv("CAT")
    with pytest.raises(ConfigError, match=r"ivm.yaml: line 2: environment variable CAT is not set"):
        load_project(path)


def test_schedules_are_checked_normalized_and_never_share_a_dag():
    """Two schedules never map to one refresh DAG (#47: "0 6 * * *" and "0 */6 * * *" both became
    ivm_refresh_0_6, and one group silently never ran); a cron string's spacing does not make a group."""
    from ivm.orchestration.dags import dag_id_for, schedule_groups

    config = parse({"tables": {}, "views": {"a": {"sql": "x", "schedule": "0 6 * * *"},
                                            "b": {"sql": "x", "schedule": "0 */6 * * *"},
                                            "c": {"sql": "x", "schedule": " 0  6 * *  * "},
                                            "d": {"sql": "x", "schedule": "@daily"}, "e": {"sql": "x"}}})
    groups = schedule_groups(config)
    assert groups == {"0 6 * * *": ["a", "c"], "0 */6 * * *": ["b"], "@daily": ["d"], None: ["e"]}
    ids = [dag_id_for(s) for s in groups]
    assert len(set(ids)) == len(ids) and ids[2:] == ["ivm_refresh_daily", "ivm_refresh"]
