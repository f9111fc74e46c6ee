"""Orchestration (docs/design.md §9): the stage commands the Airflow tasks run (``stages``) and the factory
that builds the DAGs from the project file (``dags``). Both go through the stage functions of
ivm.refresh, which `ivm refresh` runs in one process."""
