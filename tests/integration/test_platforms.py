"""paravt_jax.infra.platforms in processes: a CPU run starts no TPU runtime, and the planner's TPU
target still compiles after it (tests/unit/test_platforms.py: the environment it sets)."""
import subprocess
import sys

from unit.test_platforms import cpu_machine_env


def test_a_cpu_run_starts_no_tpu_runtime(tmp_path):
    """A CPU process importing paravt_jax and using JAX prints no libtpu warning and runs on
    the CPU (before, libtpu's start-up printed `could not determine TPU accelerator type` and
    an E0000 error line on every run)."""
    code = "import paravt_jax, jax, os; print(jax.default_backend(), os.environ['JAX_PLATFORMS'])"
    result = subprocess.run([sys.executable, "-c", code], env=cpu_machine_env(), cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["cpu", "cpu"]
    assert "TPU" not in result.stderr and "libtpu" not in result.stderr, result.stderr[-3000:]


def test_the_tpu_target_still_compiles_after_it(tmp_path):
    """After paravt_jax chose the CPU, the planner still makes TPU devices from libtpu (the
    topology of `plan --target=tpu`) and lowers a program for them; the default backend stays
    the CPU."""
    code = """
import jax, jax.numpy as jnp
from paravt_jax.planner import programs as G
from paravt_jax.planner import targets as T
devices = T.tpu_devices("v5p:2x2x1")
mesh = jax.sharding.Mesh(devices, ("x",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
compiled = jax.jit(lambda a: a * 2, in_shardings=sharding).trace(
    jax.ShapeDtypeStruct((8,), jnp.float32)).lower().compile()
print(len(devices), devices[0].platform, jax.default_backend(), compiled is not None)
"""
    result = subprocess.run([sys.executable, "-c", code], env=cpu_machine_env(), cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["4", "tpu", "cpu", "True"], result.stdout
