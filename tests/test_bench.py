"""Every bench script runs here with its smallest arguments, so a bench cannot crash unnoticed."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_bench(script: str, *args: str, timeout: int = 900) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args], env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


@pytest.mark.slow
def test_train_step_bench_smallest():
    """Memory table (two lengths, blockwise and dense) and the side-by-side throughput table."""
    out = run_bench("train_step.py", "--presets", "tiny", "--lengths", "128,256", "--speed-lengths", "128",
                    "--repeats", "1", "--remat")
    assert "Gradient step peak" in out and "| tiny   | blockwise | 256" in out
    assert "blockwise tokens/s" in out and "dense tokens/s" in out
