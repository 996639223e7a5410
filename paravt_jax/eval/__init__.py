"""Evaluations of a policy behind one interface (evaluator.py): the greedy held-out evaluation on
the run's own data (held_out.py) and the benchmark driver mirroring the reference `paravt/eval`
(driver.py, with its datasets, prompts, scoring and records), chosen by type from the config's
evaluations sections (registry.py)."""
