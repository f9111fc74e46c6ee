"""The command line's arguments, without a project: `ivm --version`, and `--version N` of
`ivm log quarantine`/`restore` (a subcommand's own option, not the program's)."""

from __future__ import annotations

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
