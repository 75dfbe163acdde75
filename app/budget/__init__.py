"""Usage reports, calibration, overflow verdicts and errors, and pruning."""
