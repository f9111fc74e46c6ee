"""The `ivm` command: each command end to end in-process, exit codes, one-line errors."""

from __future__ import annotations

import json

import pytest

from ivm.cli import main, parse_args
from tests.conftest import write_project
from tests.helpers import run

TABLES = {"link": {"columns": {"src": "string", "dst": "string"}, "key": ["src", "dst"]}}


@pytest.fixture
def project_file(tmp_path, spark):
    return str(write_project(tmp_path / "proj", TABLES))




def test_the_commands_end_to_end(capsys, project_file, tmp_path, monkeypatch):
    (tmp_path / "link.csv").write_text("src,dst\na,b\nb,c\n")
    (tmp_path / "c1.csv").write_text("src,dst,_change_type\nc,d,insert\na,b,delete\n")
    assert run(capsys, "apply", "--project", project_file)[:2] == (0, f"created table link\ncatalog: sqlite:///"
                                                                     f"{tmp_path}/proj/warehouse/catalog.db\n")
    monkeypatch.setenv("IVM_PROJECT", project_file)  # the same project, found through the environment
    code, out, _ = run(capsys, "load", "link", str(tmp_path / "link.csv"))
    assert (code, out) == (0, "link: loaded 2 rows as version 1\n")
    code, out, _ = run(capsys, "log", "append", "link", str(tmp_path / "c1.csv"))
    assert (code, out) == (0, "link: appended 2 changes as commit version 1 (segment 1)\n")
    code, out, err = run(capsys, "refresh", "--format", "json")  # one JSON document; progress on stderr
    assert code == 0 and "trim: link: commit versions 1..1, 2 changes -> net delta of 2 rows" in err
    refreshed = json.loads(out)
    assert refreshed["status"] == "succeeded" and refreshed["run"].startswith("refresh-")
    assert [(t["table"], t["log_rows"], t["delta_rows"]) for t in refreshed["tables"]] == [("link", 2, 2)]
    code, out, _ = run(capsys, "show", "link", "--format", "csv")
    assert (code, out) == (0, "src,dst\nb,c\nc,d\n")
    code, out, _ = run(capsys, "show", "link", "--format", "json", "--limit", "1")
    assert [json.loads(x) for x in out.splitlines()] == [{"src": "b", "dst": "c"}]
    code, out, _ = run(capsys, "show", "link")
    assert code == 0 and "| b     | c     |" in out
    code, out, _ = run(capsys, "runs", "--limit", "5")
    assert code == 0 and "refresh" in out and "link:2" in out and "load" in out
    code, out, _ = run(capsys, "runs", "--limit", "5", "--format", "json")
    runs = json.loads(out)
    assert [r["kind"] for r in runs][:1] == ["refresh"] and runs[0]["run"] == refreshed["run"]
    assert {(s["stage"], s["relation"], s["delta_rows"]) for s in runs[0]["stages"]} >= {("trim", "link", 2)}
    assert run(capsys, "refresh")[1].startswith("plan: no table has changes")
    assert run(capsys, "compact", "link", "--force")[1].startswith("compact: link: 2 layers -> 1 base layer")
    assert run(capsys, "gc")[1].startswith("gc: dropped")


def test_the_same_project_file_applied_again_starts_no_spark(capsys, tmp_path, spark, monkeypatch):
    """`ivm apply` records the project file's digest: the same file applied again answers from the catalog
    without Spark (#49 item 4); a changed file, or `--recheck`, is applied in full, and Spark's analysis
    refuses a view it cannot evaluate, recording nothing."""
    from ivm import context

    hop = {"hop": {"sql": "SELECT a.src, b.dst FROM link a JOIN link b ON a.dst = b.src"}}
    path = str(write_project(tmp_path / "proj", TABLES, views=hop))
    assert main(["apply", "--project", path]) == 0
    capsys.readouterr()
    started = []
    monkeypatch.setattr(context, "project_session", lambda *a, **k: started.append(1) or spark)
    code, out, _ = run(capsys, "apply", "--project", path)
    assert code == 0 and out.startswith("nothing changed: the project file is as applied at ") and not started
    assert run(capsys, "apply", "--recheck", "--project", path)[:2] == (0, "nothing changed\ncatalog: sqlite:///"
                                                                            f"{tmp_path}/proj/warehouse/catalog.db\n")
    assert started
    bad = {"hop": {"sql": "SELECT src FROM link WHERE dst = array(1)"}}
    write_project(tmp_path / "proj", TABLES, views=bad)
    for _ in range(2):  # (refused twice: the refusal recorded no digest)
        code, _, err = run(capsys, "apply", "--project", path)
        assert code == 2 and err.startswith("ivm: error: views.hop: Spark cannot evaluate it")
    write_project(tmp_path / "proj", TABLES, views=hop)  # back as applied: nothing to do, no Spark
    started.clear()
    assert run(capsys, "apply", "--project", path)[1].startswith("nothing changed: the project file is as applied")
    assert not started


@pytest.mark.parametrize("argv, code, message", [
    (["show", "nope"], 2, "ivm: error: unknown table or view 'nope'"),
    (["load", "link", "/no/such/file.csv"], 3, "ivm: error: file '/no/such/file.csv' not found"),
    (["refresh", "hop"], 2, "ivm: error: unknown view 'hop'"),
    (["log", "append", "link", "{bad}"], 3, "ivm: error: table link: {bad}: row "),
])
def test_errors_are_one_line_with_an_exit_code(capsys, project_file, tmp_path, argv, code, message):
    bad = tmp_path / "bad.csv"
    bad.write_text("src,dst,_change_type\na,,insert\n")
    assert main(["apply", "--project", project_file]) == 0
    capsys.readouterr()
    argv = [a.replace("{bad}", str(bad)) for a in argv]
    got, out, err = run(capsys, *argv, "--project", project_file)
    assert got == code
    assert err.startswith(message.replace("{bad}", str(bad))) and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--project", "p.yaml", "-v", "compact", "q3"],
                                  ["compact", "q3", "--project", "p.yaml", "-v"],
                                  ["-v", "compact", "--project", "p.yaml", "q3"]])
def test_global_options_go_before_or_after_the_command(argv):
    args = parse_args(argv)
    assert (args.command, args.relations, args.project, args.verbose) == ("compact", ["q3"], "p.yaml", True)
    args = parse_args(["compact"])
    assert (args.project, args.verbose) == (None, False)


def test_a_project_named_before_the_command_is_used(capsys, project_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./ivm.yaml and no IVM_PROJECT: only the named project can be found
    monkeypatch.delenv("IVM_PROJECT", raising=False)
    assert run(capsys, "--project", project_file, "apply")[:2] == (0, f"created table link\ncatalog: sqlite:///"
                                                                     f"{tmp_path}/proj/warehouse/catalog.db\n")


def test_missing_project_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("IVM_PROJECT", raising=False)
    code, _, err = run(capsys, "runs")
    assert code == 2
    assert err == "ivm: error: project file 'ivm.yaml' not found (pass --project or set IVM_PROJECT)\n"
