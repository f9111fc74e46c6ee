# The image every service of docker-compose.yaml runs: Airflow 3 (api-server, scheduler, dag-processor,
# triggerer, and the tasks) and the Spark standalone master and worker, so the driver (a spark-submit
# started by a task) and the executors run the same Python, pyspark and ivm.
FROM apache/airflow:3.3.2-python3.11

USER root
# Spark needs a JVM: Java 17, as on the CI machines; Maven resolves Delta Lake's jars (include/ivm/jvm/pom.xml)
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps maven \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64

USER airflow
COPY --chown=airflow:root requirements.txt pyproject.toml README.md /opt/ivm/
COPY --chown=airflow:root include /opt/ivm/include
# the same pins as `make venv` (pyspark and the Spark provider's pyspark-client at one release), and the
# same Delta jars, into include/ivm/jvm/jars/ where ivm.spark finds them
RUN pip install --no-cache-dir -r /opt/ivm/requirements.txt \
 && pip install --no-cache-dir --no-deps -e /opt/ivm \
 && mvn -q -B -f /opt/ivm/include/ivm/jvm/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory=/opt/ivm/include/ivm/jvm/jars
