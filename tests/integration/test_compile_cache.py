import os
import subprocess
import sys

import pytest

from paravt_jax.infra import compile_cache

PROGRAM = """
import sys, jax, jax.numpy as jnp
from paravt_jax.infra import compile_cache
print(compile_cache.enable(sys.argv[1], min_compile_seconds=0))
jax.jit(lambda x: jnp.sin(x) * float(sys.argv[2]))(jnp.ones(3)).block_until_ready()
"""


def run(directory: str, constant: float, env_dir: str | None = None, minimum: str | None = None) -> str:
    """The program in a fresh process; `minimum` sets $PARAVT_JAX_CACHE_MIN_SECONDS (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k not in (compile_cache.ENV_VAR, compile_cache.MIN_SECONDS_ENV)}
    if env_dir is not None:
        env[compile_cache.ENV_VAR] = env_dir
    if minimum is not None:
        env[compile_cache.MIN_SECONDS_ENV] = minimum
    done = subprocess.run([sys.executable, "-c", PROGRAM, directory, str(constant)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_programs_are_written_to_the_configured_or_env_directory(tmp_path):
    configured, from_env = tmp_path / "configured", tmp_path / "env"
    assert run(str(configured), 2.0) == str(configured)
    first = set(os.listdir(configured))
    assert first  # the jitted program was stored
    assert run(str(configured), 2.0) == str(configured)
    assert set(os.listdir(configured)) == first  # the same program: reused, nothing new
    assert run("", 3.0, env_dir=str(from_env)) == str(from_env)  # $PARAVT_JAX_CACHE_DIR
    assert os.listdir(from_env)
    assert run("", 3.0) == "None"  # neither: off


def test_the_environment_sets_the_minimum_compile_time(tmp_path, monkeypatch):
    """$PARAVT_JAX_CACHE_MIN_SECONDS replaces the caller's minimum: at 1000 s the program (asked
    for with 0) is not stored; a value that is not a number is refused naming the variable."""
    slow, fast = tmp_path / "slow", tmp_path / "fast"
    assert run(str(slow), 2.0, minimum="1000") == str(slow)
    assert os.path.isdir(slow) and not os.listdir(slow)
    assert run(str(fast), 2.0, minimum="0") == str(fast) and os.listdir(fast)
    monkeypatch.setenv(compile_cache.MIN_SECONDS_ENV, "soon")
    with pytest.raises(ValueError, match="PARAVT_JAX_CACHE_MIN_SECONDS='soon'"):
        compile_cache.enable(str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()  # refused before anything was set up


def test_uncreatable_directory_is_named(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(OSError, match="a_file/cache"):
        compile_cache.enable(str(blocker / "cache"))
