package ivm.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system ({@code file:}, with its checksum files), setting permissions through
 * java.nio instead of a {@code chmod} process.
 *
 * <p>Without Hadoop's native library (pip's pyspark ships none) {@link RawLocalFileSystem#setPermission}
 * starts a {@code chmod} process for every directory and file it creates: about 12 for one Parquet
 * write (the committer's temporary directories, each part file and its checksum, the success marker),
 * ~4 ms each from a large JVM. {@code ivm.spark} configures this class as {@code fs.file.impl} for a
 * local master when its jar is built ({@code make venv}).
 */
public class NioLocalFileSystem extends LocalFileSystem {

    public NioLocalFileSystem() {
        super(new Raw());
    }

    /** The raw local file system with {@code setPermission} in-process. */
    public static class Raw extends RawLocalFileSystem {

        private static final PosixFilePermission[] BITS = {  // from 0400 down to 0001
            PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE,
            PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE,
            PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE,
        };

        @Override
        public void setPermission(Path p, FsPermission permission) throws IOException {
            int mode = permission.toShort();
            if ((mode & ~0777) != 0) {  // the sticky bit: no java.nio form, Hadoop's own way
                super.setPermission(p, permission);
                return;
            }
            Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
            for (int i = 0; i < BITS.length; i++) {
                if ((mode & (0400 >> i)) != 0) {
                    set.add(BITS[i]);
                }
            }
            try {
                Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
            } catch (UnsupportedOperationException e) {  // not a POSIX file system
                super.setPermission(p, permission);
            }
        }
    }
}
