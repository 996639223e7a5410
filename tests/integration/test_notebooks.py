"""Executes notebooks/*.ipynb end to end with nbclient on a real `python3` ipykernel, and
checks that the outputs stored in them are the ones a fresh run prints.

The notebooks are stored WITH their outputs, so their figures and tables render on the web.
Every notebook must run without a cell error within its time budget (they hold their own
`assert` cells), and a fresh run must reproduce the stored outputs (`compare_outputs`): per
code cell, the same stdout with every number masked, every number within NUMBER_TOLERANCE of
the stored one, and the same number of figures. Notebooks print what depends on the machine
(timings) to stderr, which is not compared, and no absolute path to stdout. After changing a
notebook, store its fresh outputs with

    PYTHONPATH=. python tests/integration/test_notebooks.py 02_rollouts.ipynb   # no argument: all of them

The tests also check what the notebooks print against what they were given (03 with a
workdir of known metrics).

The kernel is this interpreter's (jupyter_client runs the `python3` kernelspec with
`sys.executable`), started in the repository root. Matplotlib uses the inline backend, which
is headless and puts each figure into the cell outputs as a PNG (with MPLBACKEND=Agg the
figures would never reach the outputs and the plotting cells would go unchecked).
"""
import copy
import json
import os
import re
import shutil
import sys
import time

import ml_collections
import nbformat
import numpy as np
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from paravt_jax.data.builtin import ensure_builtin
from paravt_jax.infra.metrics_writer import MetricsWriter
from paravt_jax.run_config import build_run, builtin_assets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = os.path.join(REPO, "notebooks")
NAMES = ("01_rewards.ipynb", "02_rollouts.ipynb", "03_training_curves.ipynb", "04_paradox.ipynb")
# The trained toy model 02 loads, with the run config whose built-in data it needs.
TOY_MODEL = os.path.join(NOTEBOOKS, "assets", "toy_paragrpo")
CELL_TIMEOUT_S = 120
# Wall-clock budget per notebook (kernel start included). Measured on the shared 2-core CPU:
# 14-26 s (01), 40-50 s (02, two greedy episodes of the toy model), 3-6 s (03), 5-8 s (04),
# so these only catch a notebook that became several times slower.
NOTEBOOK_BUDGET_S = {"01_rewards.ipynb": 90, "02_rollouts.ipynb": 120, "03_training_curves.ipynb": 60,
                     "04_paradox.ipynb": 60}
# A fresh number matches a stored one when |fresh - stored| <= ABSOLUTE + RELATIVE * |stored|:
# one unit in the last printed digit of a 3-decimal number, so a rounding flip passes and any
# real change of an accuracy, reward or window does not.
NUMBER_TOLERANCE = {"absolute": 2e-3, "relative": 1e-3}
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@pytest.fixture(scope="module")
def notebook_assets(tmp_path_factory):
    """A private copy of the built-in assets: reuses the repository's cache when present
    (ensure_builtin then finds its READY stamp), else generates them: the tiny set (about
    11 s) and the toy events set of 02's model (about 15 s of CPU)."""
    root = tmp_path_factory.mktemp("notebook_builtin") / "builtin"
    cached = os.path.join(REPO, "artifacts", "builtin")
    if os.path.isdir(cached):
        shutil.copytree(cached, root)
    return prepare_builtin(str(root))


def prepare_builtin(root: str) -> str:
    """The built-in sets the notebooks read under `root`: the tiny one and the toy model's."""
    ensure_builtin(root)
    with open(os.path.join(TOY_MODEL, "run_config.json")) as f:
        config = ml_collections.ConfigDict(json.load(f)["config"])
    config.data.builtin_root = root
    builtin_assets(build_run(config))
    return root


def kernel_env(builtin_root: str, workdir: str | None = None) -> dict:
    """The kernel's environment; workdir None: the notebooks' own default (PARAVT_WORKDIR unset)."""
    env = dict(os.environ)
    # conftest forces 8 fake CPU devices for the sharding tests; a notebook runs like a user's
    # session, on the default single CPU device.
    flags = env.get("XLA_FLAGS", "").split()
    env["XLA_FLAGS"] = " ".join(f for f in flags if "xla_force_host_platform_device_count" not in f)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JAX_PLATFORMS="cpu",
               MPLBACKEND="module://matplotlib_inline.backend_inline", TOKENIZERS_PARALLELISM="false",
               PARAVT_BUILTIN_ROOT=builtin_root)
    env.pop("PARAVT_WORKDIR", None)
    if workdir is not None:
        env["PARAVT_WORKDIR"] = workdir
    return env


def stored(name: str):
    return nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)


def execute(name: str, env: dict):
    """Runs one notebook in a fresh kernel (cwd = repository root); returns (notebook, seconds)."""
    assert "python3" in KernelSpecManager().find_kernel_specs(), "ipykernel's python3 kernelspec is not installed"
    nb = stored(name)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": REPO}})
    start = time.perf_counter()
    client.execute(env=env)
    seconds = time.perf_counter() - start
    print(f"{name}: {seconds:.1f} s")
    assert seconds < NOTEBOOK_BUDGET_S[name], f"{name} took {seconds:.1f} s (budget {NOTEBOOK_BUDGET_S[name]} s)"
    return nb, seconds


def code_cells(nb) -> list:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def cell_stdout(cell) -> str:
    return "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream" and out.name == "stdout")


def printed(nb) -> str:
    return "".join(cell_stdout(cell) for cell in code_cells(nb))


def cell_figures(cell) -> int:
    return sum("image/png" in out.get("data", {}) for out in cell.outputs)


def figures(nb) -> int:
    return sum(cell_figures(cell) for cell in code_cells(nb))


def compare_outputs(name: str, fresh, kept) -> None:
    """Fails unless `fresh` (just executed) prints what `kept` (the stored notebook) shows:
    per code cell the same stdout with numbers masked, each number within NUMBER_TOLERANCE,
    and the same number of figures. The message names the cell and the first difference."""
    fresh_cells, kept_cells = code_cells(fresh), code_cells(kept)
    assert len(fresh_cells) == len(kept_cells), f"{name}: {len(fresh_cells)} code cells, stored {len(kept_cells)}"
    for number, (a, b) in enumerate(zip(fresh_cells, kept_cells)):
        where = f"{name}, code cell {number}"
        new, old = cell_stdout(a), cell_stdout(b)
        new_lines, old_lines = NUMBER.sub("#", new).splitlines(), NUMBER.sub("#", old).splitlines()
        for line, (x, y) in enumerate(zip(new_lines, old_lines)):
            assert x == y, f"{where}, stdout line {line}: printed {x!r}, stored {y!r} (numbers masked)"
        assert len(new_lines) == len(old_lines), f"{where}: {len(new_lines)} stdout lines, stored {len(old_lines)}"
        for x, y in zip(NUMBER.findall(new), NUMBER.findall(old)):
            limit = NUMBER_TOLERANCE["absolute"] + NUMBER_TOLERANCE["relative"] * abs(float(y))
            assert abs(float(x) - float(y)) <= limit, f"{where}: printed {x}, stored {y} (tolerance {limit:.4g})"
        assert cell_figures(a) == cell_figures(b), f"{where}: {cell_figures(a)} figures, stored {cell_figures(b)}"


def line_starting(text: str, prefix: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"expected one line starting with {prefix!r}, got {lines}"
    return lines[0]


def test_notebooks_are_stored_with_outputs_and_a_python3_kernel():
    for name in NAMES:
        nb = stored(name)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "python3", name
        code = code_cells(nb)
        assert code, name
        for number, cell in enumerate(code):
            assert cell.execution_count is not None, f"{name}: code cell {number} is stored without running"
            assert not [out for out in cell.outputs if out.output_type == "error"], f"{name}: cell {number} failed"
        assert figures(nb) > 0, f"{name}: stored without its figures"
        # The first code cell holds the parameters (papermill's tag), read from the environment.
        assert "parameters" in code[0].metadata.get("tags", []), name
        assert "os.environ.get(" in code[0].source, name


def test_compare_outputs_fails_on_an_edited_number_and_passes_within_tolerance():
    kept = stored("01_rewards.ipynb")
    compare_outputs("01", copy.deepcopy(kept), kept)
    cell = next(c for c in code_cells(kept) if "reward checks" not in cell_stdout(c) and NUMBER.search(cell_stdout(c)))
    stream = next(out for out in cell.outputs if out.output_type == "stream" and out.name == "stdout")
    value = NUMBER.findall(stream["text"])[-1]

    def edited(by: float):
        nb = copy.deepcopy(kept)
        target = next(out for c in code_cells(nb) if c.source == cell.source for out in c.outputs
                      if out.output_type == "stream" and out.name == "stdout")
        head, _, tail = target["text"].rpartition(value)
        target["text"] = head + repr(float(value) + by) + tail
        return nb

    compare_outputs("01", edited(1e-3), kept)  # within tolerance
    with pytest.raises(AssertionError, match="stored"):
        compare_outputs("01", edited(0.05), kept)
    fewer = copy.deepcopy(kept)
    figure_cell = next(c for c in code_cells(fewer) if cell_figures(c))
    figure_cell.outputs = [out for out in figure_cell.outputs if "image/png" not in out.get("data", {})]
    with pytest.raises(AssertionError, match="figures"):
        compare_outputs("01", fewer, kept)


def test_rewards_notebook(notebook_assets):
    nb, _ = execute("01_rewards.ipynb", kernel_env(notebook_assets))
    compare_outputs("01_rewards.ipynb", nb, stored("01_rewards.ipynb"))
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


def test_rollouts_notebook(notebook_assets):
    nb, _ = execute("02_rollouts.ipynb", kernel_env(notebook_assets))
    compare_outputs("02_rollouts.ipynb", nb, stored("02_rollouts.ipynb"))
    text = printed(nb)
    sparse, dense = text.split("=== K = ")[1:]
    # At K = 4 and at K = 64 alike: one turn of several crop calls in parallel, each answered
    # by the sub-agent, then the right answer in the next turn; the same windows at both K.
    for episode in (sparse, dense):
        first_turn = episode.split("--- turn 0: ", 1)[1]
        assert int(first_turn.split(" calls", 1)[0]) >= 2
        assert first_turn.split("--- turn 1", 1)[0].count("sub-agent: ") >= 2
        assert ": correct;" in episode and "acc_reward 1.000" in episode
    assert dense.startswith("64: 2 assistant turns, 3 crop calls")
    assert "the same crop windows at K = 4 and K = 64: True" in dense
    assert figures(nb) == 5  # K = 4 overview, timeline, crop frames, K = 64 overview, both timelines


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


def test_training_curves_notebook_on_the_stored_main_job_metrics(notebook_assets):
    nb, _ = execute("03_training_curves.ipynb", kernel_env(notebook_assets))
    compare_outputs("03_training_curves.ipynb", nb, stored("03_training_curves.ipynb"))
    assert "rl: 64 steps (0..63)" in printed(nb) and "sft: 450 steps (0..449)" in printed(nb)


def test_training_curves_notebook_reads_and_plots_a_workdir(notebook_assets, tmp_path):
    workdir = str(tmp_path / "run")
    written = write_metrics(workdir, rl_steps=6, sft_steps=5)
    with open(os.path.join(workdir, "rl", "metrics.jsonl")) as f:  # the writer's line format
        assert json.loads(f.readline())["step"] == 0
    nb, _ = execute("03_training_curves.ipynb", kernel_env(notebook_assets, workdir))
    text = printed(nb)
    assert "rl: 6 steps (0..5)" in text and "sft: 5 steps (0..4)" in text
    for key in ("rl/kappa", "rl/format_compliance", "rl/reward", "rl/tool_reward", "sft/loss"):
        values = written[key]
        first, last, low, high = (float(v) for v in line_starting(text, key + " ").split()[1:])
        assert np.allclose([first, last, low, high], [values[0], values[-1], min(values), max(values)], atol=1e-4), key
    assert "no data for" not in text  # every panel, the periodic evaluation included, had data
    assert figures(nb) == 1


def test_training_curves_notebook_names_a_workdir_without_metrics(notebook_assets, tmp_path):
    empty = tmp_path / "empty_run"
    (empty / "rl").mkdir(parents=True)
    (empty / "rl" / "metrics.jsonl").write_text("")  # present but empty counts as no metrics
    with pytest.raises(CellExecutionError) as failure:
        execute("03_training_curves.ipynb", kernel_env(notebook_assets, str(empty)))
    message = str(failure.value)
    assert "FileNotFoundError" in message and "no metrics under workdir" in message and str(empty) in message


ARMS = ("vanilla", "anchor_only", "gating_only", "paragrpo")


def test_paradox_notebook(notebook_assets):
    nb, _ = execute("04_paradox.ipynb", kernel_env(notebook_assets))
    compare_outputs("04_paradox.ipynb", nb, stored("04_paradox.ipynb"))
    text = printed(nb)
    assert all(f"strong,{arm}: 3 arms, 3 finished, 12 RL steps" in text for arm in ARMS)
    training = [line for line in text.splitlines() if " -> " in line]  # early -> late, per group and metric
    assert [line.split()[0] for line in training] == [f"strong,{arm}" for arm in ARMS]
    assert all(line.count(" -> ") == 5 for line in training)
    assert figures(nb) == 2  # the curves (compliance, kappa, reward, calls, held-out accuracy), the evaluation


def store(names) -> None:
    """Executes the notebooks and writes them back with their fresh outputs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys.modules[__name__], "NOTEBOOK_BUDGET_S", dict.fromkeys(NAMES, float("inf")))
        root = prepare_builtin(os.path.join(REPO, "artifacts", "builtin"))
        for name in names:
            nb, seconds = execute(name, kernel_env(root))
            nbformat.write(nb, os.path.join(NOTEBOOKS, name))
            print(f"stored {name} ({seconds:.1f} s, {figures(nb)} figures)")


if __name__ == "__main__":
    store(sys.argv[1:] or NAMES)
