"""The catalog on SQLite and on a real PostgreSQL: migrations, definitions, versions and layers, the
publish transaction, log segments, watermarks, leases and garbage-collection queries."""

from datetime import timedelta

import pytest
from sqlalchemy import inspect

from ivm.catalog import Catalog
from ivm.catalog.models import utcnow
from ivm.catalog.store import PublishChange, StageRecord, WrittenLayer, mask_url
from ivm.errors import CatalogError, ChangeDataError, LeaseError

TABLE = {"columns": {"a": "INT"}, "key": ["a"], "unique_keys": [], "references": {}}


@pytest.fixture
def catalog(catalog_url):
    c = Catalog.open(catalog_url)
    c.save_definitions({"t": TABLE, "u": {**TABLE, "key": None}}, {})
    yield c
    c.dispose()


def layer(name: str, kind: str = "delta", relation: str = "t") -> WrittenLayer:
    return WrittenLayer(name, relation, kind, f"/wh/data/{relation}/{name}", 10, 100)


def test_migrations_create_every_table_and_are_idempotent(catalog_url):
    c = Catalog.open(catalog_url)
    Catalog.open(catalog_url).dispose()  # a second upgrade is a no-op
    names = set(inspect(c.engine).get_table_names())
    assert {"ivm_tables", "ivm_views", "ivm_relations", "ivm_relation_versions", "ivm_layers",
            "ivm_version_layers", "ivm_log_segments", "ivm_watermarks", "ivm_runs", "ivm_run_stages",
            "ivm_validations", "ivm_leases", "alembic_version"} <= names
    c.dispose()


def test_the_fast_path_knows_the_newest_migration(catalog_url, monkeypatch):
    """An open of a catalog at HEAD_REVISION skips Alembic; HEAD_REVISION is Alembic's own head, so a new
    migration cannot be skipped; a catalog at another revision goes through Alembic (here: a no-op)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from ivm.catalog import store

    cfg = Config()
    cfg.set_main_option("script_location", str(store.MIGRATIONS))
    assert ScriptDirectory.from_config(cfg).get_current_head() == store.HEAD_REVISION
    c = Catalog.open(catalog_url)
    with c.engine.begin() as conn:
        assert Catalog._revision(conn) == store.HEAD_REVISION
    monkeypatch.setattr(store, "HEAD_REVISION", "9999")  # as if a newer ivm brought a migration: Alembic runs
    Catalog.open(catalog_url).dispose()
    c.dispose()


def test_definitions_report_what_changed(catalog):
    assert catalog.save_definitions({"t": TABLE}, {}) == []
    assert catalog.save_definitions({"t": {**TABLE, "unique_keys": [["a"]]}},
                                    {"v": {"language": "sql", "definition": "SELECT 1", "options": {}}}) \
        == ["updated table t", "created view v"]
    assert catalog.table_defs()["t"].unique_keys == [["a"]]
    assert catalog.view_defs()["v"].definition == "SELECT 1"


def test_publish_stacks_layers_and_replace_starts_over(catalog):
    catalog.start_run("r1", "load")
    assert catalog.publish("r1", [PublishChange("t", None, [layer("b1", "base")], replace=True)],
                           {("t", "t"): 0}) == {"t": 1}
    s1 = catalog.state("t")
    catalog.start_run("r2", "refresh")
    catalog.publish("r2", [PublishChange("t", s1.version_id, [layer("d1")])], {("t", "t"): 3},
                    [StageRecord("trim", "t", delta_rows=5)])
    s2 = catalog.state("t")
    assert s2.version == 2 and [x.id for x in s2.layers] == ["b1", "d1"]
    assert s2.base.id == "b1" and [d.id for d in s2.deltas] == ["d1"]
    assert catalog.watermarks()[("t", "t")] == 3
    catalog.start_run("r3", "compact")
    catalog.publish("r3", [PublishChange("t", s2.version_id, [layer("b2", "base")], replace=True)], {})
    assert [x.id for x in catalog.state("t").layers] == ["b2"]
    run = catalog.get_run("r2")
    assert run.status == "succeeded" and run.stages[0].delta_rows == 5


def test_publish_is_all_or_nothing(catalog):
    catalog.start_run("r1", "load")
    catalog.publish("r1", [PublishChange("t", None, [layer("b1", "base")], replace=True)], {("t", "t"): 0})
    before = catalog.state("t")
    catalog.start_run("r2", "refresh")
    # u is fine, t is stale: nothing of the run may be published, not even u or the watermarks
    with pytest.raises(CatalogError, match="t changed since run r2 read it"):
        catalog.publish("r2", [PublishChange("u", None, [layer("x", relation="u")]),
                               PublishChange("t", None, [layer("d1")])], {("t", "t"): 9})
    assert catalog.state("t") == before
    assert catalog.state("u").version == 0
    assert catalog.watermarks()[("t", "t")] == 0


def test_segments_order_dedupe_and_late_commits(catalog):
    catalog.add_segment("t", "/l/1", "f1", "cdf", "h1", 1, 3, 10)
    catalog.add_segment("t", "/l/2", "f2", "cdf", "h2", 10, 10, 1)
    assert catalog.last_commit_version("t") == 10
    assert catalog.appended_segment("t", "f1", "h1").max_commit_version == 3
    assert catalog.appended_segment("u", "f1", "h1") is None
    assert catalog.appended_segment("t", "other-file", "h1") is None
    # a late commit may fill a gap nobody has absorbed ...
    catalog.add_segment("t", "/l/3", "f3", "cdf", "h3", 5, 6, 2)
    assert [s.path for s in catalog.segments("t", 0, 10)] == ["/l/1", "/l/3", "/l/2"]
    assert [s.path for s in catalog.segments("t", 3, 6)] == ["/l/3"]
    # ... but not overlap a segment, fall below a watermark, or slip in while a run holds the lease
    with pytest.raises(ChangeDataError, match=r"commit versions 2..4 overlap segment \d+ \(1..3\)"):
        catalog.add_segment("t", "/l/4", "f4", "cdf", "h4", 2, 4, 1)
    catalog.start_run("r", "refresh")
    catalog.publish("r", [], {("t", "t"): 6})
    with pytest.raises(ChangeDataError, match="not after the last absorbed commit version 6"):
        catalog.add_segment("t", "/l/5", "f5", "cdf", "h5", 4, 4, 1)
    catalog.acquire_leases("r2", ["t"], timedelta(minutes=5))
    with pytest.raises(LeaseError, match="being refreshed by run r2"):
        catalog.add_segment("t", "/l/6", "f6", "cdf", "h6", 8, 8, 1)


def test_leases_exclude_other_runs_until_released_or_expired(catalog):
    catalog.acquire_leases("a", ["t", "u"], timedelta(minutes=5))
    catalog.acquire_leases("a", ["t"], timedelta(minutes=5))  # re-entrant for the same run
    with pytest.raises(LeaseError, match="t is being refreshed by run a"):
        catalog.acquire_leases("b", ["t"], timedelta(minutes=5))
    catalog.release_leases("a")
    catalog.acquire_leases("b", ["t"], timedelta(seconds=-1))  # already expired: a crashed run
    catalog.acquire_leases("c", ["t"], timedelta(minutes=5))
    with pytest.raises(LeaseError):
        catalog.acquire_leases("b", ["t"], timedelta(minutes=5))
    catalog.start_run("c", "refresh")
    catalog.finish_run("c", "failed", "boom")  # finishing a run frees its leases
    catalog.acquire_leases("d", ["t"], timedelta(minutes=5))
    assert catalog.get_run("c").error == "boom"


def test_expired_versions_free_only_unreferenced_layers(catalog):
    catalog.start_run("r1", "load")
    catalog.publish("r1", [PublishChange("t", None, [layer("b1", "base")], replace=True)], {})
    v1 = catalog.state("t")
    catalog.start_run("r2", "refresh")
    catalog.publish("r2", [PublishChange("t", v1.version_id, [layer("d1")])], {})
    v2 = catalog.state("t")
    catalog.start_run("r3", "compact")
    catalog.publish("r3", [PublishChange("t", v2.version_id, [layer("b2", "base")], replace=True)], {})
    later = utcnow() + timedelta(seconds=1)
    expired = catalog.expired_versions(later)
    assert sorted(expired) == sorted([v1.version_id, v2.version_id])
    assert catalog.expired_versions(utcnow() - timedelta(hours=1)) == []
    freed = catalog.drop_versions(expired)
    assert sorted(x.id for x in freed) == ["b1", "d1"]
    assert [x.id for x in catalog.state("t").layers] == ["b2"]
    assert catalog.known_layer_paths() == {"/wh/data/t/b2"}


def test_runs_are_listed_newest_first(catalog):
    for i in range(3):
        catalog.start_run(f"r{i}", "refresh", {"t": i}, ["t"], mode="incremental")
    assert [r.id for r in catalog.runs(2)] == ["r2", "r1"]


def test_passwords_are_masked():
    assert mask_url("postgresql+psycopg2://ivm:secret@db:5432/ivm") == "postgresql+psycopg2://ivm:***@db:5432/ivm"


def test_unreachable_catalog_is_one_line():
    with pytest.raises(CatalogError, match="unreachable") as e:
        Catalog.open("postgresql+psycopg2://ivm:secret@127.0.0.1:1/none")
    assert "secret" not in str(e.value) and "\n" not in str(e.value)


def test_maintain_history_newest_first_per_mode_from_succeeded_runs(catalog):
    """`--mode auto`'s measurements: the newest recompute however many refreshes came after it, and
    no stage of a failed run."""
    def run(name, mode, rows, seconds, status="succeeded"):
        catalog.start_run(name, "refresh")
        catalog.save_stage(name, StageRecord("maintain", "v", mode=mode, rows_in=rows, seconds=seconds))
        catalog.finish_run(name, status)

    run("r0", "full", 0, 5.0)
    run("r1", "full", 0, 30.0)
    for n in range(60):
        run(f"i{n}", "incremental", n, float(n))
    run("bad", "incremental", 99, 99.0, status="failed")
    assert catalog.maintain_history("v", "full", 1) == [(0, 30.0)]
    assert catalog.maintain_history("v", "incremental", 2) == [(59, 59.0), (58, 58.0)]
    assert catalog.maintain_history("w", "full", 1) == []
