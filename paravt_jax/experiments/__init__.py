"""Experiment tooling: the memory planner, ablation sweeps, reports and plots."""
