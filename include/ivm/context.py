"""What a run's stages share: the project file, its catalog and warehouse, Spark, and the compiled
program with its strata (docs/design.md §6). Stages, validation, compaction and garbage collection take a
`RunContext`; `ivm.project.Project` is the public face over one. This module imports no stage, so no
module that a stage imports imports a stage back."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import cached_property
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from ivm.aggregates import register as register_aggregates
from ivm.catalog import Catalog
from ivm.changes import delta
from ivm.changes.reader import table_schema
from ivm.config import ProjectConfig
from ivm.errors import NotFoundError
from ivm.ir import Program
from ivm.lang import compile_project
from ivm.server import project_session
from ivm.spark import quiet_query_context
from ivm.storage import Warehouse
from ivm.stratify import Strata, stratify
from ivm.vocabulary import Kind
from ivm.zset import as_used, expand


class Relations(Protocol):
    """What the views store and the types of every relation they derive (`ivm.maintain.relations`)."""

    #: the state relation of every GROUPBY subgoal (000 Algorithm 6.1), by name
    groupby_states: dict

    def stored_relations(self, view: str) -> list[str]:
        """Everything maintaining ``view`` stores."""

    def schema(self, relation: str) -> StructType | None:
        """A view's, an auxiliary predicate's or a stored state's columns and types; None: no such relation."""


class RunContext:
    """A project file, its catalog and its warehouse, and what is derived from them once: Spark
    (started on first use), the compiled program and strata, every relation's schema (a table's from the
    project file, a derived one's from the `Relations` service the context is given)."""

    def __init__(self, config: ProjectConfig, relations: Callable[[RunContext], Relations],
                 catalog: Catalog | None = None, start_spark: Callable[[], SparkSession] | None = None):
        """``relations``: what the views store and its types, worked out from this context (the maintenance
        layer's `ivm.maintain.relations.StoredRelations`, given here so this module imports none of it)."""
        self.config = config
        self.relations = relations(self)
        self.catalog = catalog or Catalog.open(config.catalog_url)
        self.warehouse = Warehouse(config.warehouse_uri)
        self.warehouse.ensure()
        self._start_spark = start_spark
        self._locations: dict[str, str] = {}
        self._schemas: dict[str, StructType] = {}

    @cached_property
    def spark(self) -> SparkSession:
        if self._start_spark is not None:
            spark = self._start_spark()
        else:  # (a Spark Connect server, or local Spark with the project's settings, its views' names kept
            # in a metastore under the warehouse)
            spark = project_session(self.config)
        register_aggregates(spark, self.config.aggregates)
        quiet_query_context()
        return spark

    @property
    def spark_started(self) -> bool:
        """Whether Spark has started in this process (a stage that needs none starts none)."""
        return "spark" in vars(self)

    @cached_property
    def program(self) -> tuple[Program, Strata]:
        """Every view compiled into one rule program, and its strata. Raises ConfigError naming the
        view and construct for a definition that cannot be compiled."""
        program = compile_project(self.config)
        return program, stratify(program)

    @property
    def max_iterations(self) -> dict[str, int]:
        """Each view's limit on the rounds of a recursive fixpoint."""
        return {name: v.max_iterations for name, v in self.config.views.items()}

    def stored_relations(self, view: str) -> list[str]:
        """Everything maintaining ``view`` stores: the view, its auxiliary predicates, GROUPBY states."""
        return self.relations.stored_relations(view)

    def base_tables(self, view: str) -> list[str]:
        """The tables ``view`` reads, directly or through the views below it, sorted."""
        program, strata = self.program
        return sorted(u for u in strata.upstream(view) if program.predicates[u].kind == Kind.BASE)

    @property
    def lease_timeout(self) -> timedelta:
        return timedelta(minutes=self.config.storage.lease_timeout_minutes)

    def schema(self, relation: str) -> StructType:
        """A relation's columns and Spark types; a view's come from its plan over empty tables
        (Spark analyses the plan, no job runs). A run asks for it each time it reads a relation
        (thousands of times in a run of many views), so each is worked out once per context; a copy is
        returned (a StructType can be added to)."""
        if relation not in self._schemas:
            self._schemas[relation] = self._schema(relation)
        return StructType(list(self._schemas[relation].fields))

    def _schema(self, relation: str) -> StructType:
        if relation in self.config.tables:
            _ = self.spark  # (Spark parses the types: started if a stage had not needed it yet)
            return table_schema(self.config.tables[relation])
        found = self.relations.schema(relation)
        if found is None:
            raise NotFoundError(f"unknown table or view {relation!r}")
        return found

    def cluster_columns(self, relation: str) -> list[str]:
        """Base layers are sorted by the key, or by all columns for a bag."""
        table = self.config.tables.get(relation)
        if table is not None:
            return list(table.key or table.columns)
        pred = self.program[0].predicates.get(relation)
        if pred is not None and pred.cluster:  # an owner index: by the collection id (002 §4.2)
            return list(pred.cluster)
        return [f.name for f in self.schema(relation).fields]

    def source_location(self, table: str) -> str | None:
        """Where table ``table``'s Delta source lives (ivm.changes.delta); None for a table loaded into ivm.
        A source named by catalog table is looked up in the Spark catalog (once)."""
        cfg = self.config.tables[table]
        if cfg.source is None:
            return None
        if table not in self._locations:
            self._locations[table] = delta.location(self.config, table,
                                                    self.spark if cfg.source.table is not None else None)
        return self._locations[table]

    def read_zset(self, name: str) -> DataFrame:
        """The relation's current (published) version consolidated: its columns plus ``__count``."""
        return self.warehouse.read_consolidated(self.spark, self.catalog.state(name).layers, self.schema(name),
                                                self.cluster_columns(name))

    def read_state(self, name: str) -> DataFrame:
        """The relation's current (published) version as SQL returns it: bag rows repeated, set rows once,
        no ``__count``."""
        zset = self.read_zset(name)
        if name in self.config.views:
            zset = as_used(self.program[0].predicates[name], zset)
        return expand(zset)

    def all_relations(self) -> list[str]:
        """Every table and every relation the views store."""
        return [*self.config.tables, *(r for v in self.config.views for r in self.stored_relations(v))]

    def close(self) -> None:
        self.catalog.dispose()
