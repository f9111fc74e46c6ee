"""ivm's local file system (include/ivm/jvm/NioLocalFileSystem.java): configured for local masters,
and it leaves files and directories with the permissions Hadoop's own would. The file system is looked at
through the session's JVM (classic only)."""

import os
import stat

import pytest

from ivm.spark import LOCAL_FS_CLASS, LOCAL_FS_JAR, local_file_system


def test_configured_only_for_a_local_master_that_does_not_choose_its_own():
    assert LOCAL_FS_JAR.exists(), f"{LOCAL_FS_JAR} is built by `make venv` (javac)"
    conf = local_file_system("local[2]", {"spark.driver.extraClassPath": "/opt/x.jar"})
    assert conf["spark.hadoop.fs.file.impl"] == LOCAL_FS_CLASS
    assert conf["spark.driver.extraClassPath"] == f"/opt/x.jar{os.pathsep}{LOCAL_FS_JAR}"
    assert local_file_system("local", {})["spark.driver.extraClassPath"] == str(LOCAL_FS_JAR)
    for master in ("spark://host:7077", "local-cluster[2,1,1024]", "yarn"):  # executors in other JVMs
        assert local_file_system(master, {}) == {}
    own = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem"}
    assert local_file_system("local[2]", own) == own


def _fs(spark):
    """The session's ``file:`` file system: ivm's."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert fs.getClass().getName() == LOCAL_FS_CLASS
    return jvm, fs, conf


@pytest.mark.classic
@pytest.mark.parametrize("mode", ["640", "755", "700", "000", "1777"])  # 1777: the sticky bit, by chmod
def test_set_permission(spark, tmp_path, mode):
    jvm, fs, _ = _fs(spark)
    f = tmp_path / "f"
    f.write_text("x")
    fs.setPermission(jvm.org.apache.hadoop.fs.Path(str(f)), jvm.org.apache.hadoop.fs.permission.FsPermission(mode))
    assert stat.S_IMODE(os.stat(f).st_mode) == int(mode, 8)


@pytest.mark.classic
def test_a_parquet_write_gets_hadoops_default_permissions(spark, tmp_path):
    jvm, _, conf = _fs(spark)
    perm = jvm.org.apache.hadoop.fs.permission.FsPermission
    umask = perm.getUMask(conf)
    want_dir = perm.getDirDefault().applyUMask(umask).toShort()
    want_file = perm.getFileDefault().applyUMask(umask).toShort()
    out = tmp_path / "layer"
    spark.range(10).write.parquet(str(out))
    found = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in [out, *out.iterdir()]}
    assert any(n.endswith(".parquet") for n in found)
    assert found == {n: want_dir if n == "layer" else want_file for n in found}
