"""Benchmarks: ``make bench``. They print figures and never fail on time."""
