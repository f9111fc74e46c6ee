# The images of docker-compose.yaml.
#
# `ivm` (the default target): Airflow 3 (api-server, scheduler, dag-processor, triggerer, and the tasks),
# the Spark standalone master and worker and the Spark Connect server, so the driver (a spark-submit
# started by a task, or the Connect server) and the executors run the same Python, pyspark and ivm.
# `hive-metastore`: Apache Hive's metastore service on the stack's PostgreSQL, where every JVM of the
# stack keeps the views' names (spark.metastore), with PostgreSQL's JDBC driver.
FROM apache/airflow:3.3.2-python3.11 AS ivm

USER root
# Spark needs a JVM: Java 17, as on the CI machines; Maven resolves Delta Lake's jars (include/ivm/jvm/pom.xml).
# JAVA_HOME is the same path on every architecture (Debian names the JDK's folder after it: -amd64, -arm64)
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps maven \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17-openjdk
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk

USER airflow
COPY --chown=airflow:root requirements.txt pyproject.toml README.md /opt/ivm/
COPY --chown=airflow:root include /opt/ivm/include
# the same pins as `make venv` (pyspark and the Spark provider's pyspark-client at one release), and the
# same Delta jars, into include/ivm/jvm/jars/ where ivm.spark finds them; PostgreSQL's JDBC driver for the
# metastore image below
RUN pip install --no-cache-dir -r /opt/ivm/requirements.txt \
 && pip install --no-cache-dir --no-deps -e /opt/ivm \
 && mvn -q -B -Dstyle.color=never -f /opt/ivm/include/ivm/jvm/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory=/opt/ivm/include/ivm/jvm/jars \
 && mvn -q -B -Dstyle.color=never dependency:copy -Dartifact=org.postgresql:postgresql:42.7.14 \
        -DoutputDirectory=/opt/ivm/jdbc

FROM apache/hive:3.1.3 AS hive-metastore
COPY --from=ivm /opt/ivm/jdbc/postgresql-42.7.14.jar /opt/hive/lib/postgresql.jar

# (the default target: the last stage)
FROM ivm
