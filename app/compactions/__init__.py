"""Compaction: jobs, the worker that runs them, and the archive of what they replaced."""
