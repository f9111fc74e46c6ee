"""The documentation lives in the repository and follows the code: the pages generated from it (the
project-file and CLI references, the front page from the README) are what `docs/gen_reference.py` makes
of the code now, and no file of the project points outside the repository."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_the_generated_pages_are_current():
    done = subprocess.run([sys.executable, str(REPO / "docs" / "gen_reference.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_every_config_key_and_command_is_in_the_references():
    from ivm.cli import build_parser
    from ivm.config import ProjectConfig, ViewConfig

    page = (REPO / "docs" / "reference" / "project-file.md").read_text()
    for model in (ProjectConfig, ViewConfig):
        for name, field in model.model_fields.items():
            if name != "root":
                assert f"| `{field.alias or name}` |" in page, name
    cli = (REPO / "docs" / "reference" / "cli.md").read_text()
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices  # noqa: SLF001
    for command in commands:
        assert f"### `ivm {command}" in cli, command


def test_no_file_points_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=REPO, check=True).stdout.split()
    beside = "../" + "shared"  # (the folder beside a clone where the team keeps its notes: not the project's)
    outside = [f for f in tracked if (REPO / f).is_file() and not f.endswith((".png", ".jar", ".parquet"))
               and beside in (REPO / f).read_text(errors="ignore")]
    assert outside == []
