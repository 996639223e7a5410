"""Benchmark evaluation helpers (scoring and summaries) mirroring the reference `paravt/eval` driver."""
