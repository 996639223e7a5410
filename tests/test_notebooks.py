"""Executes notebooks/*.ipynb end to end with nbclient on a real `python3` ipykernel.

Each notebook must run without a cell error within its time budget (they hold their own
`assert` cells, e.g. the anchor only changes advantages at anchor positions); the tests also
check what the notebooks print and that their figures were rendered. The stored notebooks must
be clean (no outputs), so diffs stay small.

The kernel is this interpreter's (jupyter_client runs the `python3` kernelspec with
`sys.executable`), started in the repository root. Matplotlib uses the inline backend, which
is headless and puts each figure into the cell outputs as a PNG (with MPLBACKEND=Agg the
figures would never reach the outputs and the plotting cells would go unchecked).
"""
import json
import os
import shutil
import time

import nbformat
import numpy as np
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from paravt_jax.data.builtin import ensure_builtin
from paravt_jax.metrics_writer import MetricsWriter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(REPO, "notebooks")
NAMES = ("01_rewards.ipynb", "02_rollouts.ipynb", "03_training_curves.ipynb")
CELL_TIMEOUT_S = 120
# Wall-clock budget per notebook (kernel start included). Measured on the shared 2-core CPU:
# 14-26 s (01), 25-37 s (02), 3-6 s (03) depending on load, so these only catch a notebook
# that became several times slower.
NOTEBOOK_BUDGET_S = {"01_rewards.ipynb": 90, "02_rollouts.ipynb": 120, "03_training_curves.ipynb": 60}


@pytest.fixture(scope="module")
def builtin_root(tmp_path_factory):
    """A private copy of the built-in assets: reuses the repository's cache when present
    (ensure_builtin then finds its READY stamp), else generates them (about 11 s)."""
    root = tmp_path_factory.mktemp("notebook_builtin") / "builtin"
    cached = os.path.join(REPO, "artifacts", "builtin")
    if os.path.isdir(cached):
        shutil.copytree(cached, root)
    ensure_builtin(str(root))
    return str(root)


def kernel_env(builtin_root: str, workdir: str) -> dict:
    env = dict(os.environ)
    # conftest forces 8 fake CPU devices for the sharding tests; a notebook runs like a user's
    # session, on the default single CPU device.
    flags = env.get("XLA_FLAGS", "").split()
    env["XLA_FLAGS"] = " ".join(f for f in flags if "xla_force_host_platform_device_count" not in f)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JAX_PLATFORMS="cpu",
               MPLBACKEND="module://matplotlib_inline.backend_inline", TOKENIZERS_PARALLELISM="false",
               PARAVT_BUILTIN_ROOT=builtin_root, PARAVT_WORKDIR=workdir)
    return env


def execute(name: str, env: dict):
    """Runs one notebook in a fresh kernel (cwd = repository root); returns (notebook, seconds)."""
    assert "python3" in KernelSpecManager().find_kernel_specs(), "ipykernel's python3 kernelspec is not installed"
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": REPO}})
    start = time.perf_counter()
    client.execute(env=env)
    seconds = time.perf_counter() - start
    print(f"{name}: {seconds:.1f} s")
    assert seconds < NOTEBOOK_BUDGET_S[name], f"{name} took {seconds:.1f} s (budget {NOTEBOOK_BUDGET_S[name]} s)"
    return nb, seconds


def printed(nb) -> str:
    return "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for out in cell.outputs if out.output_type == "stream" and out.name == "stdout")


def figures(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.outputs)


def line_starting(text: str, prefix: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"expected one line starting with {prefix!r}, got {lines}"
    return lines[0]


def test_notebooks_are_stored_clean_with_a_python3_kernel():
    for name in NAMES:
        nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "python3", name
        code = [cell for cell in nb.cells if cell.cell_type == "code"]
        assert code, name
        for cell in code:
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: stored with outputs"
        # The first code cell holds the parameters (papermill's tag), read from the environment.
        assert "parameters" in code[0].metadata.get("tags", []), name
        assert "os.environ.get(" in code[0].source, name


def test_rewards_notebook(builtin_root, tmp_path):
    nb, _ = execute("01_rewards.ipynb", kernel_env(builtin_root, str(tmp_path)))
    text = printed(nb)
    assert "reward checks passed" in text and "anchor placement checks passed" in text
    # Every hand-written completion gets a table row, with parse counts and reward parts.
    header = line_starting(text, "completion ")
    for column in ("acc", "fmt_seq", "fmt_tok", "anchor", "tool", "total_seq", "calls", "errors", "compliant"):
        assert column in header.split()
    n_rows = int(text.split(" completions", 1)[0].split()[-1])
    assert n_rows >= 20
    table = text.split(header, 1)[1].split("reward checks passed", 1)[0].strip().splitlines()[1:]
    assert len(table) == n_rows
    # The listing of the drawn row's structural tokens: token mode moves each of them away
    # from the (constant) sequence-mode advantage of the row.
    listing = text.split("structural tokens of the drawn row", 1)[1].strip().splitlines()[1:]
    assert listing and any("'<think>'" in line for line in listing)
    for line in listing:
        before, after = (float(v) for v in line.rsplit(None, 3)[-3::2])
        assert not np.isclose(before, after), line
    assert figures(nb) == 2  # reward parts, anchor placement


def test_rollouts_notebook(builtin_root, tmp_path):
    nb, _ = execute("02_rollouts.ipynb", kernel_env(builtin_root, str(tmp_path)))
    text = printed(nb)
    assert "rollouts in" in text and "skipped episodes: []" in text
    assert text.count("=== sample ") == 2 and "turn 0:" in text
    # Hand-written parallel turn: three crops answered with frames, two bad calls answered with
    # their errors, the malformed block reported as a parse error.
    assert text.count("<tool_response> call ") == 5
    assert len([l for l in text.splitlines() if l.startswith("<tool_response> call") and " frames from " in l]) == 3
    assert "must be less than end_time" in text and "exceeds video duration" in text and "not valid JSON" in text
    assert "'kappa'" in text and "'format_compliance'" in text  # the trainer's logged metrics
    assert figures(nb) == 4  # overview frames + one strip per successful crop


def write_metrics(workdir: str, rl_steps: int, sft_steps: int, seed: int = 0) -> dict:
    """A few steps of plausible metrics through the real MetricsWriter (the notebook's job is
    reading and plotting; a real RL step takes about a minute on this CPU). Returns the
    values written, by key."""
    rng = np.random.default_rng(seed)
    written: dict = {}
    rl = MetricsWriter(os.path.join(workdir, "rl"), console=False)
    for step in range(rl_steps):
        progress = step / max(rl_steps - 1, 1)
        acc = float(np.clip(0.2 + 0.5 * progress + rng.normal(0, 0.05), 0, 1))
        fmt = float(np.clip(0.4 + 0.5 * progress + rng.normal(0, 0.05), 0, 1))
        tool = float(np.clip(0.1 + 0.4 * progress + rng.normal(0, 0.05), 0, 1))
        metrics = {"reward": acc + fmt + tool, "acc_reward": acc, "format_reward": fmt, "tool_reward": tool,
                   "anchor_reward": float(0.2 + 0.4 * progress), "format_compliance": float(min(1.0, 0.1 + progress)),
                   "kappa": float(np.clip(0.05 + 0.7 * progress + rng.normal(0, 0.03), 0, 1)),
                   "calls_per_tool_turn": float(1 + 2 * progress), "loss": float(rng.normal(0, 0.01)),
                   "grad_norm": float(1 + rng.random()), "skipped": False}
        if step % 3 == 2:  # periodic held-out evaluation, as with rl.eval_every=3
            metrics.update({"eval_tools/accuracy": acc, "eval_notools/accuracy": acc / 2, "eval_tools/kappa": 0.5})
        rl.write(step, metrics, prefix="rl/")
        for key, value in metrics.items():
            written.setdefault(f"rl/{key}", []).append(value)
    rl.close()
    sft = MetricsWriter(os.path.join(workdir, "sft"), console=False)
    for step in range(sft_steps):
        metrics = {"loss": float(7.0 * 0.8 ** step), "grad_norm": float(1 + step / 10), "skipped": False}
        sft.write(step, metrics, prefix="sft/")
        for key, value in metrics.items():
            written.setdefault(f"sft/{key}", []).append(value)
    sft.close()
    return written


def test_training_curves_notebook_reads_and_plots_a_workdir(builtin_root, tmp_path):
    workdir = str(tmp_path / "run")
    written = write_metrics(workdir, rl_steps=6, sft_steps=5)
    with open(os.path.join(workdir, "rl", "metrics.jsonl")) as f:  # the writer's line format
        assert json.loads(f.readline())["step"] == 0
    nb, _ = execute("03_training_curves.ipynb", kernel_env(builtin_root, workdir))
    text = printed(nb)
    assert "rl: 6 steps (0..5)" in text and "sft: 5 steps (0..4)" in text
    for key in ("rl/kappa", "rl/format_compliance", "rl/reward", "rl/tool_reward", "sft/loss"):
        values = written[key]
        first, last, low, high = (float(v) for v in line_starting(text, key + " ").split()[1:])
        assert np.allclose([first, last, low, high], [values[0], values[-1], min(values), max(values)], atol=1e-4), key
    assert "no data for" not in text  # every panel, the periodic evaluation included, had data
    assert figures(nb) == 1


def test_training_curves_notebook_names_a_workdir_without_metrics(builtin_root, tmp_path):
    empty = tmp_path / "empty_run"
    (empty / "rl").mkdir(parents=True)
    (empty / "rl" / "metrics.jsonl").write_text("")  # present but empty counts as no metrics
    with pytest.raises(CellExecutionError) as failure:
        execute("03_training_curves.ipynb", kernel_env(builtin_root, str(empty)))
    message = str(failure.value)
    assert "FileNotFoundError" in message and "no metrics under workdir" in message and str(empty) in message
