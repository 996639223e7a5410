"""The application layer: the `paravt-jax` command line (dispatch.py) and its commands (jobs.py
for the main job's, one module per command with its own flags). Library packages never import it."""
from paravt_jax.cli.dispatch import execute, main

__all__ = ["execute", "main"]
