"""The commit log on disk: segments, offset and time indexes, recovery, retention."""
