"""The `ivm` command (docs/design.md §8). Every command takes ``--project PATH`` (else $IVM_PROJECT, else
./ivm.yaml); bad input ends with a one-line ``ivm: error: ...`` and a non-zero exit code."""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from tabulate import tabulate

from ivm import __version__
from ivm.config import QUIET_JVM_ENV
from ivm.errors import IvmError, one_line, out_of_memory
from ivm.modes import Mode
from ivm.spark import spark_errors
from ivm.vocabulary import Outcome, StageName

log = logging.getLogger("ivm")


def _out(line: str = "") -> None:
    print(line, flush=True)


def _err(line: str = "") -> None:
    print(line, file=sys.stderr, flush=True)


def _json(doc) -> None:
    """A command's ``--format json`` answer: one JSON document on stdout (progress went to stderr)."""
    print(json.dumps(doc, indent=2, default=str), flush=True)


def _open(args, *, views: Sequence[str] = (), table: str | None = None, readable: str | None = None):
    """The project, once the names the command was given are known: an unknown view or table, or a name
    ``readable`` that is neither (nor a stored relation), is refused from the project file and the
    catalog alone, before Spark's modules are imported (they cost a command a second or more: #66)."""
    from ivm.catalog import Catalog
    from ivm.config import load_project

    config = load_project(args.project)
    config.check_views(views)
    if table is not None:
        config.check_table(table)
    catalog = None
    if readable is not None:
        from ivm.lang import compile_project

        catalog = Catalog.open(config.catalog_url)
        catalog.check_readable(readable, config.tables, config.views, lambda: compile_project(config).predicates)
    from ivm.project import Project

    return Project(config, catalog)


def _catalog(args):
    """The project's catalog alone, for a command that reads only what it records (`ivm runs`): the
    project file is read and checked, but nothing of Spark or the warehouse is imported (#49 item 4)."""
    from ivm.catalog import Catalog
    from ivm.config import load_project

    return Catalog.open(load_project(args.project).catalog_url)


def cmd_apply(args) -> int:
    project = _open(args)
    changes = project.apply(recheck=args.recheck)
    for line in changes or ["nothing changed"]:
        _out(line)
    _out(f"catalog: {project.catalog.masked_url}")
    return 0


def cmd_load(args) -> int:
    project = _open(args, table=args.table)
    rows, version = project.load(args.table, args.file)
    _out(f"{args.table}: loaded {rows} rows as version {version}")
    return 0


def cmd_log_append(args) -> int:
    project = _open(args, table=args.table)
    result = project.append(args.table, args.file, args.format)
    _out(result.describe())
    return 0


def cmd_log_quarantine(args) -> int:
    _out(_open(args, table=args.table).quarantine(args.table, args.version, args.reason))
    return 0


def cmd_log_restore(args) -> int:
    _out(_open(args, table=args.table).restore(args.table, args.version))
    return 0


def cmd_log_list(args) -> int:
    project = _open(args, table=args.table)
    from ivm.changes.delta import named_version

    listing = project.log_listing(args.table)
    table = project.config.tables[args.table]
    if listing.delta_source:
        _out(f"{args.table} reads a Delta table: its log is the table's change data feed "
             f"(absorbed up to Delta version {named_version(table, listing.absorbed)})")
    else:
        rows = [[s.id, f"{s.min_commit_version}..{s.max_commit_version}", s.rows, f"{s.appended_at:%Y-%m-%d %H:%M:%S}",
                 "absorbed" if s.max_commit_version <= listing.absorbed else "pending"] for s in listing.segments]
        _out(tabulate(rows, headers=["segment", "commit versions", "changes", "appended (UTC)", "state"],
                      tablefmt="simple") if rows else f"{args.table}: no log segments")
    if listing.quarantined:
        _out("quarantined (skipped by every refresh):")
        _out(tabulate([[named_version(table, q.commit_version), q.by, q.run_id or "",
                        "" if q.restored_as is None else f"as commit version {q.restored_as}", q.reason]
                       for q in listing.quarantined],
                      headers=["version", "by", "run", "restored", "reason"], tablefmt="simple"))
    return 0


def _result(args, command: str, result) -> int:
    """What refresh and backfill print of their `RefreshResult`."""
    if args.format == "json":
        _json(result.to_json())
        return 0
    if result.tables or result.views:
        _out(tabulate(result.summary_rows(), headers=result.SUMMARY_HEADERS, tablefmt="simple"))
    _out(f"{command} {result.status} in {result.seconds:.2f} s")
    return 0


def cmd_refresh(args) -> int:
    project = _open(args, views=args.views)
    result = project.refresh(args.views or None, mode=args.mode, progress=_err if args.format == "json" else _out)
    return _result(args, "refresh", result)


def cmd_snapshot(args) -> int:
    from ivm import sinks

    project = _open(args)
    db = project.config.database if project.config.storage.register_views else None
    rows = [[s.view, f"{db}.{s.view}" if db else "", s.location, "" if s.delta_version is None else s.delta_version,
             s.sql() if s.delta_version is not None else s.note,
             s.changes_sql(f"{db}.{s.view}" if db else None) if s.delta_version is not None else ""]
            for s in sinks.snapshot(project.ctx)]
    _out(tabulate(rows, headers=["view", "Spark catalog name", "Delta table", "version", "read with",
                                 "its changes since (change data feed)"], tablefmt="simple"))
    return 0


def cmd_backfill(args) -> int:
    project = _open(args, views=args.views)
    result = project.backfill(args.views, full=args.full, from_version=args.from_version, sample=args.sample,
                              progress=_err if args.format == "json" else _out)
    return _result(args, "backfill", result)


def cmd_show(args) -> int:
    project = _open(args, readable=args.name)
    from ivm import sinks

    limit = args.limit if args.limit is not None else (20 if args.format == "table" else None)
    # a view published as a small Delta table is read by delta-rs, else a small table's or view's layers
    # by pyarrow: no JVM to start (ivm.sinks)
    table = None
    if args.name in project.config.views and project.config.storage.delta_views:
        table = sinks.read_without_jvm(project.ctx, args.name)
    if table is None and args.name in project.config.tables:
        project.table(args.name)  # (applied, unchanged since)
        table = sinks.layers_without_jvm(project.ctx, args.name)
    elif table is None and args.name in project.config.views:
        materialized = project.catalog.state(args.name).version_id is not None
        table = sinks.layers_without_jvm(project.ctx, args.name) if materialized else None
    if table is not None:
        columns = table.column_names
        rows = [tuple(r.values()) for r in (table if limit is None else table.slice(0, limit)).to_pylist()]
    else:
        df = project.read(args.name)
        columns = df.columns
        df = df.orderBy(*columns)
        if limit is not None:
            rows = [tuple(r) for r in df.limit(limit).collect()]
        else:  # stream, never the whole relation on the driver at once
            rows = (tuple(r) for r in df.toLocalIterator())
    if args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    elif args.format == "json":
        for r in rows:
            sys.stdout.write(json.dumps(dict(zip(columns, r, strict=True)), default=str) + "\n")
    else:
        _out(tabulate(list(rows), headers=columns, tablefmt="psql", missingval="NULL"))
    return 0


def cmd_explain(args) -> int:
    project = _open(args, views=[args.view])
    explanation = project.explain(args.view)
    _out(explanation.to_json() if args.format == "json" else explanation.to_text())
    return 0


def cmd_validate(args) -> int:
    from ivm.errors import ValidationError

    project = _open(args, views=args.views)
    checks = project.validate(args.views or None, sample=args.sample, progress=_out)
    if checks:
        _out(tabulate([[c.view, c.status, c.rows, c.mismatches,
                        f"{sum(r['success'] for r in c.expectations)}/{len(c.expectations)}", c.report_uri or "",
                        f"{c.seconds:.2f}"] for c in checks],
                      headers=["view", "status", "rows sampled", "mismatches", "expectations met", "report",
                               "seconds"], tablefmt="simple"))
    failed = [c for c in checks if c.status == Outcome.FAILED]
    if failed:
        raise ValidationError(f"view {failed[0].view}: {failed[0].problem}")
    return 0


def _crossover(detail: dict) -> str:
    """`--mode auto`'s estimates for a maintain stage, when it made them (ivm.maintain.crossover)."""
    est = (detail.get("choice") or {}).get("crossover")
    if not est or est.get("incremental_s") is None or est.get("full_s") is None:
        return ""
    return f" (auto: est. {est['incremental_s']:.1f}s inc / {est['full_s']:.1f}s full)"


def cmd_runs(args) -> int:
    catalog = _catalog(args)
    table = []
    runs = catalog.runs(args.limit)
    checks: dict[str, list] = {}
    for v in catalog.validations(limit=50 * max(1, args.limit)):
        checks.setdefault(v.run_id, []).append(v)
    if args.format == "json":
        _json([_run_json(run, checks.get(run.id, [])) for run in runs])
        return 0
    for run in runs:
        seconds = _seconds(run)
        deltas = ", ".join(f"{s.relation}:{s.delta_rows}" for s in run.stages
                           if s.stage == StageName.TRIM and s.delta_rows is not None)
        views = "\n".join(f"{s.relation} {s.mode} Δ{'' if s.delta_rows is None else s.delta_rows} "
                          f"{s.seconds or 0:.2f}s{_crossover(s.detail)}"
                          for s in run.stages if s.stage == StageName.MAINTAIN)
        validation = "\n".join(f"{v.view} {v.status}" + (f" ({v.mismatches} mismatches)" if v.mismatches else "")
                               for v in checks.get(run.id, []))
        table.append([run.id, run.kind, run.status, run.mode or "",
                      ", ".join(f"{k}@{v}" for k, v in sorted(run.snapshot.items()) if k in run.relations),
                      deltas, views, validation, f"{seconds:.2f}" if seconds is not None else "",
                      (run.error or _notes(run))[:120]])
    _out(tabulate(table, headers=["run", "kind", "status", "mode", "snapshot", "table deltas",
                                  "views (mode, changed tuples, time)", "validation", "seconds", "error or note"],
                  tablefmt="simple") if table else "no runs yet")
    return 0


def _seconds(run) -> float | None:
    return (run.finished_at - run.started_at).total_seconds() if run.finished_at else None


def _run_json(run, checks: list) -> dict:
    """A run as `ivm runs --format json` gives it: what the table shows, unabridged."""
    return {"run": run.id, "kind": run.kind, "status": run.status, "mode": run.mode, "snapshot": run.snapshot,
            "relations": run.relations, "started_at": run.started_at.isoformat(),
            "finished_at": run.finished_at.isoformat() if run.finished_at else None, "seconds": _seconds(run),
            "error": run.error, "notes": _notes(run) or None,
            "stages": [{"stage": s.stage, "relation": s.relation, "mode": s.mode, "rows_in": s.rows_in,
                        "rows_out": s.rows_out, "delta_rows": s.delta_rows, "seconds": s.seconds, "status": s.status}
                       for s in run.stages],
            "validations": [{"view": v.view, "status": v.status, "sample": v.sample_size, "mismatches": v.mismatches,
                             "report": v.report_uri} for v in checks]}


def _notes(run) -> str:
    """What a run set aside or put back (ivm.changes.quarantine), with the reason, for `ivm runs`."""
    notes = [f"{s.stage} {s.relation} version {s.detail['version']}: {s.detail['reason']}"
             for s in run.stages if s.stage in ("quarantine", "restore")]
    notes += [f"set aside {s.relation} commit {q['version']}: {q['reason']}"
              for s in run.stages if s.stage == StageName.TRIM for q in s.detail.get("quarantined", [])]
    return "; ".join(notes)


def cmd_compact(args) -> int:
    project = _open(args)
    done = project.compact(args.relations or None, force=args.force, progress=_out)
    if not done:
        _out("nothing to compact")
    return 0


def cmd_gc(args) -> int:
    project = _open(args)
    _out(project.gc(progress=_out).describe())
    return 0


def cmd_server(args) -> int:
    """`ivm server start|status|stop`: the project's Spark Connect server (ivm.server)."""
    from ivm import server
    from ivm.config import load_project
    from ivm.spark import CONNECT_PORT

    config = load_project(args.project)
    port = getattr(args, "port", None) or CONNECT_PORT  # (start's --port)
    if args.server_command == "start" and args.foreground:
        _err(f"Spark Connect server for {config.project_name} at sc://{args.host}:{port} (in the foreground)")
        server.run_in_foreground(config, args.host, port, args.master)
    if args.server_command == "start":
        state = server.start(config, args.host, port, progress=_err, master=args.master)
        _out(state.address)
        _err(f"ready: {state.describe()}")
        _err(f"ivm commands of this project use it; other programs: export SPARK_REMOTE={state.address}")
        return 0
    if args.server_command == "stop":
        state = server.stop(config)
        _out(f"stopped the {state.describe()}" if state else "no Spark Connect server of this project is running")
        return 0
    state = server.status(config)
    _out(state.describe() if state else "no Spark Connect server of this project is running")
    return 0 if state else 1


def build_parser() -> argparse.ArgumentParser:
    # --project and -v go before the command or after it: each (sub)parser sets them only when given
    # (SUPPRESS), so a subcommand's default cannot overwrite `ivm --project X compact`'s X; `parse_args`
    # fills in the defaults
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--project", metavar="PATH", default=argparse.SUPPRESS,
                        help="project file (default: $IVM_PROJECT, else ./ivm.yaml)")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log progress details and tracebacks")
    parser = argparse.ArgumentParser(prog="ivm", parents=[common],
                                     description="Incremental view maintenance for Apache Spark.")
    parser.add_argument("--version", action="version", version=f"ivm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("apply", parents=[common], help="create or update tables and views in the catalog")
    p.add_argument("--recheck", action="store_true",
                   help="apply the project file in full even if it is as last applied (Spark analyses every view "
                        "again, views are registered in the Spark catalog again)")
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("load", parents=[common], help="load a table's initial snapshot (Parquet, CSV, JSON lines)")
    p.add_argument("table")
    p.add_argument("file")
    p.set_defaults(func=cmd_load)

    p = sub.add_parser("log", parents=[common], help="change logs")
    log_sub = p.add_subparsers(dest="log_command", required=True, metavar="ACTION")
    p = log_sub.add_parser("append", parents=[common], help="append a change file to a table's log")
    p.add_argument("table")
    p.add_argument("file")
    p.add_argument("--format", choices=["cdf", "debezium"], default="cdf",
                   help="cdf: the table's columns + _change_type [+ _commit_version] (default); "
                        "debezium: Debezium change events, JSON lines")
    p.set_defaults(func=cmd_log_append)
    p = log_sub.add_parser("list", parents=[common], help="a table's log segments and quarantined commits")
    p.add_argument("table")
    p.set_defaults(func=cmd_log_list)
    p = log_sub.add_parser("quarantine", parents=[common],
                           help="set a commit that does not apply aside, so refreshes go on without it")
    p.add_argument("table")
    p.add_argument("--version", type=int, required=True,
                   help="the commit version the refused refresh named (a Delta source's Delta version)")
    p.add_argument("--reason", help="why (default: the refused refresh's error)")
    p.set_defaults(func=cmd_log_quarantine)
    p = log_sub.add_parser("restore", parents=[common], help="put a quarantined commit back")
    p.add_argument("table")
    p.add_argument("--version", type=int, required=True, help="the quarantined commit's version")
    p.set_defaults(func=cmd_log_restore)

    p = sub.add_parser("refresh", parents=[common], help="bring tables and views to the newest snapshot")
    p.add_argument("views", nargs="*", metavar="VIEW", help="only these views and what they read (default: all)")
    p.add_argument("--mode", choices=[str(m) for m in Mode.asked()], default=str(Mode.AUTO),
                   help="auto: per view, what the analysis allows (default); full: recompute every view; "
                        "incremental: refuse to recompute")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="json: the result as one JSON document on stdout (progress on stderr)")
    p.set_defaults(func=cmd_refresh)

    p = sub.add_parser("backfill", parents=[common],
                       help="refresh or rebuild chosen views now (what the ivm_backfill DAG does)")
    p.add_argument("views", nargs="+", metavar="VIEW", help="the views (and the views they read)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--full", action="store_true",
                     help="recompute them from the current snapshot instead of maintaining them")
    how.add_argument("--from-version", type=int, metavar="N",
                     help="replay: restore them to their state before commit version N of every table they "
                          "read and apply the changes since then again")
    p.add_argument("--sample", type=int, metavar="N",
                   help="keys per view the validation recomputes (default: each view's validate.sample; 0: none)")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="json: the result as one JSON document on stdout (progress on stderr)")
    p.set_defaults(func=cmd_backfill)

    p = sub.add_parser("explain", parents=[common],
                       help="a view's stratum, dependencies, rules and maintenance algorithm")
    p.add_argument("view")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("show", parents=[common], help="print a table or view as SQL would return it")
    p.add_argument("name")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--limit", type=int, help="at most N rows (default 20 for --format table, all otherwise)")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("snapshot", parents=[common],
                       help="each view's Delta table at the version that holds the catalog's current snapshot")
    p.set_defaults(func=cmd_snapshot)

    p = sub.add_parser("validate", parents=[common],
                       help="check published views against a sampled recomputation (Great Expectations)")
    p.add_argument("views", nargs="*", metavar="VIEW", help="the views (default: all)")
    p.add_argument("--sample", type=int, metavar="N", help="keys per view to recompute (default: validate.sample)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("runs", parents=[common], help="run history")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--format", choices=["text", "json"], default="text", help="json: the runs as a JSON array")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("compact", parents=[common],
                       help="merge layers of relations past the compaction threshold into new base layers")
    p.add_argument("relations", nargs="*", metavar="RELATION")
    p.add_argument("--force", action="store_true", help="compact every named relation with more than one layer")
    p.set_defaults(func=cmd_compact)

    p = sub.add_parser("gc", parents=[common],
                       help="delete versions, layers and log segments past the retention period")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("server", parents=[common],
                       help="the project's Spark Connect server: one warm Spark for every command")
    server_sub = p.add_subparsers(dest="server_command", required=True, metavar="ACTION")
    p = server_sub.add_parser("start", parents=[common],
                              help="start it in the background with the project's Spark settings; prints its "
                                   "sc:// address")
    p.add_argument("--host", default="127.0.0.1", help="the address it listens on (default: loopback only)")
    p.add_argument("--port", type=int, help="its port (default: Spark Connect's, ivm.spark.CONNECT_PORT: 15002)")
    p.add_argument("--master", help="the Spark master it runs on (default: the project's spark.master)")
    p.add_argument("--foreground", action="store_true",
                   help="run it in this process, its log on the output (a container's or a service manager's way)")
    server_sub.add_parser("status", parents=[common], help="its address, pid and log (exit code 1: none running)")
    server_sub.add_parser("stop", parents=[common], help="stop it")
    p.set_defaults(func=cmd_server)
    for action in server_sub.choices.values():
        action.set_defaults(func=cmd_server)
    return parser


#: libraries whose INFO lines say nothing to a user (py4j's connections, Alembic's migration context,
#: Great Expectations' ~200 lines of its own registrations per validation)
NOISY_LOGGERS = ("py4j", "alembic", "great_expectations")


def configure_logging(level: int) -> None:
    """ivm's log lines at ``level`` on stderr (the CLI's, a stage job's task log), the noisy libraries'
    at WARNING."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with ``--project`` (None: $IVM_PROJECT, else ./ivm.yaml) and ``verbose`` set."""
    args = build_parser().parse_args(argv)
    args.project, args.verbose = getattr(args, "project", None), getattr(args, "verbose", False)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # a JVM this command starts keeps its console out of the terminal (its warnings, Spark's log: in
    # spark-driver.log beside the warehouse; ivm.server.project_session); -v leaves it on the terminal
    quiet = not args.verbose and QUIET_JVM_ENV not in os.environ
    if quiet:
        os.environ[QUIET_JVM_ENV] = "1"
    try:
        return _run(args)
    finally:
        if quiet:  # (main called in a process that goes on: a test, a script)
            os.environ.pop(QUIET_JVM_ENV, None)


def _run(args) -> int:
    """The command, its failures as one line and an exit code."""
    configure_logging(logging.INFO if args.verbose else logging.WARNING)
    started = time.perf_counter()
    try:
        code = args.func(args)
    except IvmError as e:
        print(f"ivm: error: {e}", file=sys.stderr, flush=True)
        if args.verbose:
            log.exception("details")
        return e.exit_code
    except spark_errors() as e:  # (a failure inside Spark: one line, its cause; the stack with -v)
        hint = ("; Spark ran out of memory: raise spark.driver.memory under spark.conf in the project file (a "
                "local master), the executors' memory on a cluster" if out_of_memory(e) else "")
        print(f"ivm: error: {args.command}: Spark failed: {one_line(e)}{hint} (ivm -v for Spark's trace)",
              file=sys.stderr, flush=True)
        if args.verbose:
            log.exception("details")
        return 1
    except KeyboardInterrupt:
        print("ivm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # (`ivm log list t | head`: the reader left; nothing to say)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    log.info("%s took %.2f s", args.command, time.perf_counter() - started)
    return code


if __name__ == "__main__":
    sys.exit(main())
