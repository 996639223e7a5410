"""Experiment configs (ml_collections): `get_config(arg)` per file, for `--config=configs/FILE.py:ARG`.

Installed as the package `paravt_jax.configs` (setup.py), never as a top-level `configs`: files
import one another as `from paravt_jax.configs import base`, whether loaded by path or imported."""
