"""Compaction: where to cut, what the summary keeps (anchors, files, errors, continuity) and how it is written."""
