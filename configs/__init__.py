"""Experiment configs (ml_collections): `get_config(arg)` per file, for `--config=configs/FILE.py:ARG`.

An importable package: files import one another as `from configs import base`."""
