"""The config files as the package `paravt_jax.configs` (`from paravt_jax.configs import base`).

The files live in the repository's top-level configs/ folder, where `--config=configs/FILE.py:ARG`
names them. A built wheel holds that folder as this package (setup.py maps it here, so this file
is not in it): the CLI finds its default configs from any directory, and installing the project
puts no top-level `configs` module on anyone's path. In a source checkout (an editable install,
or the repository on PYTHONPATH) this file stands in for that package: its modules are read from
the checkout's configs/ folder, the one beside this package.
"""
import os

_CHECKOUT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
if not os.path.isfile(os.path.join(_CHECKOUT, "base.py")):
    raise ImportError(f"paravt_jax.configs: no config files in {_CHECKOUT} (the checkout's configs/ folder); "
                      "install the project with pip, or run from a full checkout")
__path__ = [_CHECKOUT]
