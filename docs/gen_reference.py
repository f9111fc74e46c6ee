"""Generate the pages of docs/ that come from the code, so they cannot drift from it:

* ``reference/project-file.md`` — every key of ``ivm.yaml`` from the pydantic models of ivm.config (type,
  default, constraints, and the ``#:`` comment above the field, as Sphinx's autodoc reads it);
* ``reference/cli.md`` — every command and option from the argument parser of ivm.cli, and the exit codes
  from ivm.errors;
* ``index.md`` — the README, its links made relative to docs/.

    python docs/gen_reference.py          # write them (make docs runs it first)
    python docs/gen_reference.py --check  # exit 1 naming the stale page (tests/unit/test_docs.py)
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent


def _type(annotation) -> str:
    """A field's type as a user writes it in YAML."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"map of {_type(args[0])} to {_type(args[1])}"
    if origin is typing.Annotated:
        return _type(args[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{_key_name(annotation)}](#{_anchor(annotation)})"
    if isinstance(annotation, type) and issubclass(annotation, str) and annotation is not str:  # (a StrEnum)
        members = annotation.asked() if hasattr(annotation, "asked") else list(annotation)  # (Mode: what users ask)
        return " \\| ".join(f"`{m.value}`" for m in members)
    return {str: "string", int: "integer", float: "number", bool: "boolean", typing.Any: "any"}.get(
        annotation, getattr(annotation, "__name__", str(annotation)))


def _key_name(model: type[BaseModel]) -> str:
    return model.__name__


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The ``#:`` comment lines right above each field of the class body."""
    found, pending = {}, []
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        m = re.match(r"(\w+)\s*:", stripped)
        if m and pending:
            found[m.group(1)] = " ".join(pending)
        if not stripped.startswith("#"):
            pending = []
    return found


def _default(field) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        return "—" if isinstance(value, BaseModel) else f"`{value!r}`" if value not in ({}, []) else "empty"
    if field.default is None:
        return "—"
    return f"`{field.default.value if hasattr(field.default, 'value') else field.default!r}`"


def _constraints(field) -> str:
    out = []
    for m in field.metadata:
        for name, word in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(m, name, None) is not None:
                out.append(f"{word} {getattr(m, name)}")
        if getattr(m, "pattern", None):
            out.append(f"matches `{m.pattern}`")
    return ", ".join(out)


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """``root`` and every model its fields hold, in the order they appear."""
    seen: list[type[BaseModel]] = []

    def walk(t):
        if isinstance(t, type) and issubclass(t, BaseModel):
            if t not in seen:
                seen.append(t)
                for f in t.model_fields.values():
                    walk(f.annotation)
            return
        for a in typing.get_args(t):
            walk(a)

    walk(root)
    return seen


def project_file() -> str:
    from ivm.config import ProjectConfig

    lines = ["# The project file (`ivm.yaml`)", "",
             "Generated from the pydantic models of `ivm.config` by `docs/gen_reference.py`: every key, its type, "
             "its default and what it does. Relative paths are resolved against the project file's folder; "
             "`${NAME}` and `${NAME:-default}` are replaced by environment variables. An unknown key, or a value "
             "of the wrong type, is refused in one line naming the key (`tables.orders.key`).", "",
             "A minimal file (everything else has its default):", "", "```yaml",
             "tables:", "  orders: {columns: {id: int, customer: string, amount: double}, key: [id]}",
             "views:", '  per_customer: {sql: "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer"}',
             "```", ""]
    for model in _models(ProjectConfig):
        doc = inspect.cleandoc(model.__doc__ or "")
        where = {"ProjectConfig": "the file's top level"}.get(model.__name__, "")
        lines += [f"## {model.__name__}" + (f" ({where})" if where else ""), "", doc.replace("\n", " "), "",
                  "| key | type | default | |", "|---|---|---|---|"]
        notes = _comments(model)
        for name, field in model.model_fields.items():
            if name == "root" and model is ProjectConfig:
                continue  # (set by the loader: the project file's folder)
            key = field.alias or name
            what = notes.get(name, "")
            limits = _constraints(field)
            cell = " ".join(x for x in (what, f"({limits})" if limits else "") if x).replace("|", "\\|")
            lines.append(f"| `{key}` | {_type(field.annotation)} | {_default(field)} | {cell} |")
        lines.append("")
    return "\n".join(lines)


def cli() -> str:
    from ivm import errors
    from ivm.cli import build_parser

    os.environ["COLUMNS"] = "100"  # (argparse wraps help to the terminal's width: the same page everywhere)
    parser = build_parser()
    lines = ["# The `ivm` command", "",
             "Generated from the argument parser of `ivm.cli` by `docs/gen_reference.py`. Every command takes "
             "`--project PATH` (default: `$IVM_PROJECT`, else `./ivm.yaml`) and `-v` (progress details and "
             "tracebacks), before or after the command.", "", "## Exit codes", "",
             "Bad input ends with one line on stderr, `ivm: error: ...`, and the exit code of its kind; nothing "
             "is applied.", "", "| code | kind | when |", "|---:|---|---|"]
    kinds = sorted((c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.IvmError)
                    and "exit_code" in vars(c)), key=lambda c: (c.exit_code, c.__name__))
    for c in kinds:
        lines.append(f"| {c.exit_code} | `{c.__name__}` | {inspect.cleandoc(c.__doc__ or '').replace(chr(10), ' ')} |")
    lines += ["", "A failure inside Spark itself (a view the data does not fit, such as ANSI SQL's CAST of a malformed "
              "value; memory run out) ends the same way, with exit code 1: `ivm: error: COMMAND: Spark failed: "
              "CAUSE`, the cause Spark names (with what to raise when memory ran out); `-v` prints Spark's trace.",
              "", "## Commands", ""]

    def walk(p: argparse.ArgumentParser, prefix: str):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001 - argparse's only API
        if not subs:
            lines.extend([f"### `{prefix}`", "", "```text", p.format_help().replace("\r", "").rstrip(), "```", ""])
            return
        for name, child in subs[0].choices.items():
            walk(child, f"{prefix} {name}")

    walk(parser, "ivm")
    return "\n".join(lines)


def index() -> str:
    """The README as the site's front page: links into docs/ made relative to it."""
    text = (REPO / "README.md").read_text()
    text = re.sub(r"\]\(docs/", "](", text)
    return ("<!-- generated from README.md by docs/gen_reference.py: edit README.md -->\n\n" + text)


PAGES = {"reference/project-file.md": project_file, "reference/cli.md": cli, "index.md": index}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page differs from what the code gives")
    a = ap.parse_args(argv)
    stale = []
    for page, make in PAGES.items():
        path = DOCS / page
        text = make().rstrip() + "\n"
        if a.check:
            if not path.exists() or path.read_text() != text:
                stale.append(page)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if stale:
        print(f"docs/{', docs/'.join(stale)}: stale; run `make docs` (python docs/gen_reference.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
