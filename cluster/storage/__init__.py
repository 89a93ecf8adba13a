"""The commit log on disk: segments, offset and time indexes, leader epochs, producer state,
recovery, retention, compaction, and the log manager's background tasks."""
