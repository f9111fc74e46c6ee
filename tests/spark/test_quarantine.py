"""Nobody stuck behind one bad commit (#46, item 1; ivm.changes.quarantine): a poison change at the
next commit version refuses every refresh and names `ivm log quarantine`; set aside, the refreshes go
on (the commit kept, listed with its reason by `ivm log list` and `ivm runs`); `ivm log restore` puts
it back in place while nothing absorbed past it, and appends it again as the next commit once
refreshes did; a table's ``on_bad_change: quarantine`` does it during the refresh, recorded with the run.
After every refresh the view equals its recomputation from the tables."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ivm.errors import ChangeDataError, NotFoundError
from tests.helpers import assert_views_recomputed, run

ACCT = {"columns": {"id": "int", "owner": "string", "balance": "bigint"}, "key": ["id"]}
VIEWS = {"rich": {"sql": "SELECT owner, sum(balance) AS total, count(*) AS n FROM acct GROUP BY owner"}}


def commit(path: Path, *rows: tuple[str | None, int, str, int]) -> str:
    """A change file (a snapshot file where the change type is None)."""
    path.write_text("".join(json.dumps({**({"_change_type": kind} if kind else {}), "id": i, "owner": o,
                                        "balance": b}) + "\n" for kind, i, o, b in rows))
    return str(path)


def contents(p, name: str) -> Counter:
    return Counter(tuple(r) for r in p.read(name).collect())


@pytest.fixture
def poisoned(make_project, tmp_path):
    """acct loaded; commit 1 inserts, commit 2 deletes a row that is not there, commit 3 inserts."""
    p = make_project({"acct": ACCT}, views=VIEWS)
    p.load("acct", commit(tmp_path / "acct.jsonl", (None, 1, "ann", 10)))
    p.refresh()
    p.append("acct", commit(tmp_path / "c1.jsonl", ("insert", 2, "bob", 5)))
    p.append("acct", commit(tmp_path / "c2.jsonl", ("delete", 9, "zed", 1)))
    p.append("acct", commit(tmp_path / "c3.jsonl", ("insert", 3, "cy", 7)))
    return p


def test_a_poison_commit_is_set_aside_listed_and_restored_after_the_fact(poisoned, tmp_path, capsys):
    p = poisoned
    path = str(Path(p.config.root) / "ivm.yaml")
    for _ in range(2):  # refused every time, naming the way out
        with pytest.raises(ChangeDataError, match=r"^table acct: commit version 2, row \(id=9, owner='zed', "
                                                  r"balance=1\): delete of a row that is not there; nothing was "
                                                  r"applied \(to go on without it: `ivm log quarantine acct "
                                                  r"--version 2`\)$"):
            p.refresh()
    code, out, err = run(capsys, "log", "quarantine", "acct", "--version", "2", "--project", path)
    assert code == 0 and "acct: commit version 2 is set aside" in out, err
    assert run(capsys, "log", "quarantine", "acct", "--version", "2", "--project", path)[2] == (
        "ivm: error: table acct: commit version 2 is quarantined already\n")
    assert p.refresh().status == "succeeded"
    assert contents(p, "acct") == Counter({(1, "ann", 10): 1, (2, "bob", 5): 1, (3, "cy", 7): 1})
    assert_views_recomputed(p)
    # kept and listed, with the refusal as its reason
    code, out, _ = run(capsys, "log", "list", "acct", "--project", path)
    assert code == 0 and "quarantined (skipped by every refresh):" in out
    assert "delete of a row that is not there" in out and "row (id=9, owner='zed', balance=1)" in out
    (q,) = p.catalog.quarantined("acct")
    assert (q.commit_version, q.by, q.restored_as) == (2, "command", None)
    assert Path(p.catalog.segments("acct", 1, 2)[0].path).exists()  # the commit's changes are kept
    code, out, _ = run(capsys, "runs", "--project", path)
    assert "quarantine acct version 2: table acct: commit version 2, row (id=9" in out
    # the missing insert arrives; the quarantined delete goes back on top of it, as a new commit
    p.append("acct", commit(tmp_path / "c4.jsonl", ("insert", 9, "zed", 1)))
    p.refresh()
    assert contents(p, "acct")[(9, "zed", 1)] == 1
    code, out, _ = run(capsys, "log", "restore", "acct", "--version", "2", "--project", path)
    assert code == 0 and "its 1 changes are appended again as commit version 5" in out
    assert p.refresh().status == "succeeded"
    assert contents(p, "acct") == Counter({(1, "ann", 10): 1, (2, "bob", 5): 1, (3, "cy", 7): 1})
    assert_views_recomputed(p)
    (q,) = p.catalog.quarantined("acct")
    assert q.restored_as == 5  # the original stays skipped
    assert run(capsys, "log", "restore", "acct", "--version", "2", "--project", path)[2] == (
        "ivm: error: table acct: commit version 2 is not quarantined (restored as commit version 5)\n")
    assert run(capsys, "log", "quarantine", "acct", "--version", "7", "--project", path)[2] == (
        "ivm: error: table acct: no commit version 7 in its log (see `ivm log list acct`)\n")


def test_a_restore_before_any_refresh_puts_the_commit_back_in_place(poisoned):
    p = poisoned
    p.quarantine("acct", 2, reason="looking into it")
    assert [q.reason for q in p.catalog.quarantined("acct")] == ["looking into it"]
    assert "back in its place" in p.restore("acct", 2)
    assert p.catalog.quarantined("acct") == []
    with pytest.raises(ChangeDataError, match="commit version 2, row"):
        p.refresh()
    with pytest.raises(NotFoundError, match="commit version 2 is not quarantined"):
        p.restore("acct", 2)
    kinds = [r.kind for r in p.runs(4)]
    assert kinds[:3] == ["refresh", "restore", "quarantine"]


def test_on_bad_change_quarantine_sets_bad_commits_aside_with_the_run(make_project, tmp_path, capsys):
    p = make_project({"acct": {**ACCT, "on_bad_change": "quarantine"}}, views=VIEWS)
    p.load("acct", commit(tmp_path / "acct.jsonl", (None, 1, "ann", 10)))
    p.refresh()
    p.append("acct", commit(tmp_path / "c1.jsonl", ("insert", 1, "ann", 99)))  # a key that exists
    p.append("acct", commit(tmp_path / "c2.jsonl", ("insert", 2, "bob", 5)))
    p.append("acct", commit(tmp_path / "c3.jsonl", ("delete", 9, "zed", 1)))  # a row that is not there
    lines: list[str] = []
    result = p.refresh(progress=lines.append)
    assert result.status == "succeeded"
    assert contents(p, "acct") == Counter({(1, "ann", 10): 1, (2, "bob", 5): 1})
    assert_views_recomputed(p)
    aside = {q.commit_version: (q.by, q.run_id) for q in p.catalog.quarantined("acct")}
    assert aside == {1: ("policy", result.run_id), 3: ("policy", result.run_id)}
    trim = next(line for line in lines if line.startswith("trim: acct"))
    assert "set aside version 1 (row (id=1, owner='ann', balance=99): insert of a key that exists" in trim
    assert "set aside version 3 (row (id=9, owner='zed', balance=1): delete of a row that is not there)" in trim
    code, out, _ = run(capsys, "runs", "--project", str(Path(p.config.root) / "ivm.yaml"))
    assert "set aside acct commit 1: row (id=1, owner='ann', balance=99)" in out


def test_a_range_of_set_aside_commits_alone_is_nothing_to_do(poisoned):
    """#68 item 4: once the commits past the watermark that apply are refreshed, a range holding only
    quarantined commits gives the trim nothing: the refresh plans no table and no view (it records no run
    and would start no Spark), and a later commit's refresh still skips the quarantined one."""
    p = poisoned
    p.quarantine("acct", 2, reason="not ours")
    p.quarantine("acct", 3, reason="not ours either")
    assert p.refresh().status == "succeeded"  # commit 1
    p.append("acct", commit(Path(p.config.root) / "c4.jsonl", ("delete", 8, "yz", 1)))
    p.quarantine("acct", 4, reason="a third")
    quiet = p.refresh()
    assert (quiet.status, quiet.run_id, quiet.tables, quiet.views) == ("noop", None, [], [])
    p.append("acct", commit(Path(p.config.root) / "c5.jsonl", ("insert", 4, "di", 2)))
    assert p.refresh().status == "succeeded"
    assert contents(p, "acct") == Counter({(1, "ann", 10): 1, (2, "bob", 5): 1, (4, "di", 2): 1})
    assert_views_recomputed(p)
