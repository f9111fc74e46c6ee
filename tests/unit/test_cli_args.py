"""The command line's arguments, without a project: `ivm --version`, and `--version N` of
`ivm log quarantine`/`restore` (a subcommand's own option, not the program's); and what `ivm runs`, and
a command given an unknown name, import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ivm import __version__
from ivm.cli import parse_args


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"ivm {__version__}\n"


def test_a_commit_version_is_the_subcommands():
    args = parse_args(["log", "quarantine", "acct", "--version", "3", "--reason", "late insert"])
    assert (args.table, args.version, args.reason) == ("acct", 3, "late insert")
    assert parse_args(["log", "restore", "acct", "--version", "3"]).version == 3


RUNS = """
import sys
from ivm.cli import main
code = main(["--project", sys.argv[1], *sys.argv[2:]])
heavy = sorted(m for m in ("pyspark", "pyarrow", "ivm.project", "ivm.storage") if m in sys.modules)
print("heavy:", heavy)
sys.exit(code)
"""


def test_runs_reads_the_catalog_without_importing_spark(tmp_path):
    """`ivm runs` answers from the catalog alone (#49 item 4): in a fresh interpreter it imports neither
    Spark nor pyarrow nor the modules that maintain views."""
    (tmp_path / "ivm.yaml").write_text("warehouse: ./warehouse\ntables:\n  t:\n    columns: {k: string}\n")
    done = subprocess.run([sys.executable, "-c", RUNS, str(tmp_path / "ivm.yaml"), "runs"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no runs yet" in done.stdout and "heavy: []" in done.stdout, done.stdout


@pytest.mark.parametrize("argv", [["show", "nosuch"], ["explain", "nosuch"], ["refresh", "v", "nosuch"],
                                  ["log", "list", "nosuch"]])
def test_an_unknown_name_is_refused_before_spark_is_imported(tmp_path, argv):
    """#66 item 4: a name the project does not have is refused from the project file and the catalog alone,
    in one line, before PySpark, pyarrow or the maintenance modules are imported."""
    (tmp_path / "ivm.yaml").write_text("warehouse: ./warehouse\ntables:\n  t:\n    columns: {k: string}\n"
                                       "views:\n  v: {sql: SELECT k FROM t}\n")
    done = subprocess.run([sys.executable, "-c", RUNS, str(tmp_path / "ivm.yaml"), *argv], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "heavy: []" in done.stdout, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("ivm: error: unknown") and "nosuch" in line, line
