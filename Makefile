# The two commands of the README: `make demo` and `make test`. Both create the virtual environment first.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
LOCAL_FS_JAR := include/ivm/jvm/ivm-hadoop.jar
JARS := include/ivm/jvm/jars/.resolved

.PHONY: venv demo test test-in-process test-connect lint docs bench clean

venv: $(VENV)/.installed $(LOCAL_FS_JAR) $(JARS)

# uv installs the pinned stack (~0.5 minutes on a fresh machine, pip ~2); pip stays in the venv. It
# compiles the packages' bytecode as it installs (~1 minute, once): where PYTHONDONTWRITEBYTECODE is set,
# as on these machines, Python never caches it itself and compiled every module from source in every
# process — 2.3 s of `ivm runs`' 3.7 s, and again in each spark-submit and Airflow task process
UV := $(BIN)/uv pip install --quiet --python $(BIN)/python
$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	@echo "== .venv: the pinned Python packages (requirements-dev.txt: pyspark, Airflow, ...; about 1.9 GB installed, 1-2 minutes once)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv==0.13.9
	$(UV) --compile-bytecode -r requirements-dev.txt
	$(UV) --no-deps -e .
	touch $@

# Delta Lake's jars (include/ivm/jvm/pom.xml) with the machine's Maven client, from the registry it is set
# up for; ivm's Spark sessions and spark-submits load them (ivm.spark.delta_jars). A user on a machine
# without Maven sets `spark.jars.packages` instead (docs/guide.md, "Delta Lake").
$(JARS): include/ivm/jvm/pom.xml
	@command -v mvn >/dev/null || { echo "mvn not found: install Maven to fetch Delta Lake's jars" >&2; exit 1; }
	@echo "== Delta Lake's jars with Maven (include/ivm/jvm/pom.xml; about 90 MB once)"
	rm -rf $(dir $@) && mvn -q -B -Dstyle.color=never -f $< dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=$(abspath $(dir $@)) && touch $@ && echo "resolved $$(ls $(dir $@) | wc -l) jars into $(dir $@)"

# Hadoop's local file system without a chmod process per file and directory Spark writes (ivm.spark:
# include/ivm/jvm/NioLocalFileSystem.java), compiled against the venv's pyspark. Without javac (a JRE
# only) it is skipped and local Spark uses Hadoop's own.
$(LOCAL_FS_JAR): include/ivm/jvm/NioLocalFileSystem.java $(VENV)/.installed
	@if command -v javac >/dev/null; then \
	  out=$$(mktemp -d) && jars=$$($(BIN)/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))') \
	  && javac -nowarn --release 17 -cp "$$jars/*" -d $$out $< && jar cf $@ -C $$out . && rm -rf $$out \
	  && echo "built $@"; \
	else echo "no javac: $@ not built (local Spark keeps Hadoop's local file system)"; fi

demo: venv
	@echo "== the demo (include/views/demo/demo.py): about 3½ minutes on 2 quiet cores; each step prints its seconds"
	$(BIN)/python include/views/demo/demo.py

# The README's test command runs the suite in two passes (tests/conftest.py's `--spark-pass` says which
# test runs where), each with two pytest workers (pytest-xdist; a file's tests stay on one worker, so
# module fixtures start once; TEST_WORKERS=0 runs a pass in this process). Files go out in collection
# order (--no-loadscope-reorder; xdist's default sends the files with the most tests first), so the long
# ones (the DAG end-to-end test, the counting stream) start first instead of last.
#  1. test-in-process, each worker with a local Spark of its own: what needs a JVM of its own (the tests
#     outside tests/spark — the DAG tests' spark-submits among them —, tests/spark's `classic` ones and
#     those that start servers of their own) and the TPC-H change streams (tests/spark/test_tpch.py);
#  2. test-connect, on one warm Spark Connect server (`ivm server start` with tests/connect/ivm.yaml's
#     settings, the suite's own), each worker a client session of it: every test of tests/spark, the
#     differential change streams among them (TPC-H's again), so a call only a classic session offers
#     cannot come back unseen (tests/conftest.py's DIFFERENTIAL says why the others run once). (On a
#     2-core machine the suite is CPU-bound either way: the server runs it no faster than local Sparks.)
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
CONNECT_PORT ?= 15002
CONNECT_PROJECT := tests/connect/ivm.yaml
test: test-in-process test-connect

test-in-process: venv
	$(PYTEST) --spark-pass in-process

test-connect: venv
	rm -rf tests/connect/warehouse
	$(BIN)/ivm --project $(CONNECT_PROJECT) server start --port $(CONNECT_PORT)
	SPARK_REMOTE=sc://127.0.0.1:$(CONNECT_PORT) $(PYTEST) --spark-pass connect; \
	  status=$$?; $(BIN)/ivm --project $(CONNECT_PROJECT) server stop; exit $$status

# the documentation site (mkdocs-material, mkdocs.yml): the pages generated from the code first
# (docs/gen_reference.py: the project-file and CLI references, the front page from README.md), then the
# site in site/, warnings as errors
docs: venv
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# benchmarks (tests/bench/run.py --help): TPC-H from tpchgen-cli at SF $(SF), a generated closure
SF ?= 0.1
bench: venv
	$(BIN)/pip install --quiet tpchgen-cli==4.0.0
	$(BIN)/python tests/bench/run.py --sf $(SF)

lint: venv
	$(BIN)/ruff check include tests dags jobs plugins docs

clean:
	rm -rf $(VENV) include/views/demo/warehouse tests/connect/warehouse site
