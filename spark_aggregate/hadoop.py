"""The few Hadoop FileSystem calls the load needs (through Spark's JVM), so the warehouse
can live on any filesystem Spark can write: local, HDFS, S3A, ..."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FileEntry:
    path: str
    relative: str
    """Path below the listed directory, e.g. "source_dc=east/event_date=2026-11-21/part-0.parquet"."""
    size_bytes: int


class HadoopFs:
    def __init__(self, spark: Any, root_uri: str) -> None:
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._path_class = self._jvm.org.apache.hadoop.fs.Path
        self.fs = self._path_class(root_uri).getFileSystem(self._conf)

    def _p(self, path: str) -> Any:
        return self._path_class(path)

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(self._p(path)))

    def mkdirs(self, path: str) -> None:
        self.fs.mkdirs(self._p(path))

    def delete(self, path: str) -> None:
        self.fs.delete(self._p(path), True)

    def rename(self, src: str, dst: str) -> bool:
        return bool(self.fs.rename(self._p(src), self._p(dst)))

    def write_text(self, path: str, text: str) -> None:
        """Write a small file atomically: a hidden temporary file renamed into place."""
        target = self._p(path)
        tmp = self._p(f"{target.getParent().toString()}/.{target.getName()}.tmp")
        stream = self.fs.create(tmp, True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()
        self.fs.delete(target, False)
        if not self.fs.rename(tmp, target):
            raise OSError(f"could not rename {tmp.toString()} to {path}")

    def read_text(self, path: str) -> str | None:
        p = self._p(path)
        if not self.fs.exists(p):
            return None
        stream = self.fs.open(p)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def list_files(self, path: str) -> list[FileEntry]:
        """Data files below `path`, recursively (names starting with "_" or "." skipped, as
        Spark skips them when reading)."""
        p = self._p(path)
        if not self.fs.exists(p):
            return []
        base = self.fs.makeQualified(p).toString().rstrip("/") + "/"
        out = []
        it = self.fs.listFiles(p, True)
        while it.hasNext():
            status = it.next()
            full = status.getPath().toString()
            relative = full[len(base):] if full.startswith(base) else status.getPath().getName()
            if any(part.startswith(("_", ".")) for part in relative.split("/")):
                continue
            out.append(FileEntry(full, relative, int(status.getLen())))
        return out

    def list_dirs(self, path: str) -> list[str]:
        """Names of the directories directly in `path`."""
        p = self._p(path)
        if not self.fs.exists(p):
            return []
        return sorted(str(s.getPath().getName()) for s in self.fs.listStatus(p) if s.isDirectory())

    def qualified(self, path: str) -> str:
        return str(self.fs.makeQualified(self._p(path)).toString())
