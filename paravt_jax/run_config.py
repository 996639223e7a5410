"""The typed run config: every top-level key of a config file (configs/*.py) as a field of
`RunConfig`, built once at the command line by `build_run` from the ml_collections config.

The sections are dataclasses with checked fields (paravt_jax/config.py's idiom): the trainers'
`sft` and `rl`, the benchmark driver's `driver`, the evaluations `evals` (named entries by
type, eval/registry.py), and here the model's source and numerics (`model`), the mesh (`mesh`),
the data (`data`), the forward demo (`demo`) and `generate`'s episode. `build_run` names every
bad value of the config under its dotted path (`data.num_train=0: must be an integer >= 1`),
every key that is no field, and every key that moved (config.MOVED_KEYS) with its new place.
A config file has the sections it needs: a section it leaves out is None here (configs/eval.py
has no `rl`; configs/paragrpo.py no `driver`).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import ml_collections

from paravt_jax.config import (
    SET_BY,
    ConfigValueError,
    Problem,
    build,
    build_entries,
    checked,
    integer,
    moved_to,
    one_of,
    rule_problems,
    share,
)
from paravt_jax.data.builtin import BUILTIN_MODELS, BuiltinAssets, ensure_builtin
from paravt_jax.eval import registry
from paravt_jax.eval.prompts import MODES as PROMPT_MODES
from paravt_jax.eval.settings import RECORD_NAMES, DriverConfig
from paravt_jax.models.qwen3_vl.config import ATTENTION, ATTENTION_BLOCK, DTYPE
from paravt_jax.rl.trainer import RLConfig
from paravt_jax.sft.trainer import SFTConfig
from paravt_jax.text.chat import VISUALS

MODEL_INITS = ("checkpoint", "random")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model: a preset's shapes (models/qwen3_vl presets), loaded from `checkpoint` (a local
    HF Qwen3-VL checkpoint; empty: the built-in one of the toy presets) or randomly initialised
    when `init` says so, and its numerics (dtypes, remat, scanned layers, the attention op)."""
    preset: str = "tiny"
    checkpoint: str = ""
    init: str = checked("checkpoint", one_of(MODEL_INITS))
    param_dtype: str = checked("float32", DTYPE)
    dtype: str = checked("float32", DTYPE)
    remat: bool = False
    scan_layers: bool = True
    attention: str = checked("auto", ATTENTION)
    attention_block: int = checked(512, ATTENTION_BLOCK)

    def knobs(self) -> dict[str, Any]:
        """The model's numerics, as models/qwen3_vl presets and checkpoint loads take them."""
        return dict(param_dtype=self.param_dtype, dtype=self.dtype, remat=bool(self.remat),
                    scan_layers=bool(self.scan_layers), attention=self.attention,
                    attention_block=int(self.attention_block))


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The training mesh's axis sizes (-1: the devices left), and the devices kept apart for
    rollouts (`rollout_devices`, 0 = colocated) laid out as `rollout_axes`."""
    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    rollout_devices: int = 0
    rollout_axes: str = "tensor=-1"

    def axes(self) -> dict[str, int]:
        return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The built-in synthetic data (generated under `builtin_root`) or the data files of a real
    run (parquet tables in the reference schemas, their video root, the TFDS directory)."""
    builtin_root: str = "artifacts/builtin"
    task: str = "shapes"
    seed: int = 0  # the built-in data and initial tiny model (independent of the run's seed)
    num_train: int = checked(12, integer(1))
    num_eval: int = checked(4, integer(1))
    durations: tuple[float, ...] = (30.0, 60.0, 120.0)
    sft_modes: tuple[str, ...] = ("frames",)
    sft: str = ""
    rl_train: str = ""
    rl_eval: str = ""
    video_root: str = ""
    tfds_dir: str = ""


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """`paravt-jax forward`: K overview frames of the first held-out question, timed over repeats."""
    frames: int = checked(8, integer(1))
    min_pixels: int = 784
    max_pixels: int = 50176
    repeats: int = checked(5, integer(1))


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
    """`paravt-jax generate`: a question and a video (empty: the first held-out row's) and K."""
    question: str = ""
    video: str = ""
    nframes: int = checked(16, integer(1))


# config section -> the dataclass it builds; SEEDED ones take the run's seed
SECTIONS = {"model": ModelConfig, "mesh": MeshConfig, "data": DataConfig, "demo": DemoConfig,
            "generate": GenerateConfig, "driver": DriverConfig, "sft": SFTConfig, "rl": RLConfig}
SEEDED = ("sft", "rl")
# config section -> the types of its named entries (an evaluations section: eval/registry.py)
ENTRY_SECTIONS = {"evals": registry.TYPES}
# The driver's settings in the flat layout configs/eval.py had before its driver section (and
# the driver section before its prompt and protocol subsections) -> their keys now.
DRIVER_KEYS = {**{f.name: f"driver.{f.name}" for f in dataclasses.fields(DriverConfig)
                  if SET_BY not in f.metadata and f.name not in ("prompt", "protocol")},
               **{flat: f"driver.{key}" for key, flat in RECORD_NAMES.items() if key != "prompt.overview_visual"}}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every top-level key of a config file. `record` is the config as given (JSON types): what
    a workdir's run_config.json stores and a rerun is compared against."""
    seed: int = 0
    preset: str = "tiny"  # the config file's preset (the default workdir is runs/PRESET)
    workdir: str = ""
    compilation_cache_dir: str = ""
    mesh_preset: str = ""
    distributed: dict | None = None  # a multi-host launch's coordinator and processes (infra/distributed.py)
    model: ModelConfig = ModelConfig()
    mesh: MeshConfig = MeshConfig()
    data: DataConfig = DataConfig()
    demo: DemoConfig = DemoConfig()
    generate: GenerateConfig | None = None
    sft: SFTConfig | None = None
    rl: RLConfig | None = None
    evals: dict | None = None  # name -> the settings of an evaluator type (eval/registry.py)
    # the benchmark driver (configs/eval.py)
    driver: DriverConfig | None = None
    output_dir: str = ""
    root: str = ""
    datasets: str = ""
    limit: int = checked(0, integer(0))
    max_missing_videos: float = checked(0.02, share())
    grounding_prompt_mode: str = checked("agentic_minimal", one_of(PROMPT_MODES))
    grounding_visual: str = checked("video", one_of(VISUALS))
    benchmarks: dict = dataclasses.field(default_factory=dict)  # name -> {annotations, video_dir, subtitle_dir}
    record: dict = dataclasses.field(default_factory=dict, compare=False)


# the top-level keys that are values, not sections
SCALARS = tuple(f.name for f in dataclasses.fields(RunConfig)
                if f.name not in SECTIONS and f.name not in ENTRY_SECTIONS and f.name != "record")


def _section(name: str, value, seed) -> Any:
    if name in ENTRY_SECTIONS:
        return build_entries(ENTRY_SECTIONS[name], value, name)
    if not isinstance(value, ml_collections.ConfigDict):
        raise ConfigValueError(problems=[Problem(name, f"={value!r}: must be a section (the fields of "
                                                 f"{SECTIONS[name].__name__})")])
    return build(SECTIONS[name], value, name, **({"seed": seed} if name in SEEDED else {}))


def _unknown(name: str, value) -> Problem:
    """The problem of a top-level key that is no field: where it moved, where a flat driver
    key lives now, else the fields."""
    if moved_to(name):  # a section that moved (a config file written before)
        return Problem(name, f": moved; it is {moved_to(name)}")
    if name in DRIVER_KEYS:  # the flat layout configs/eval.py had before its driver section
        return Problem(name, f": a field of the driver section, not read at the top level; set {DRIVER_KEYS[name]}")
    return Problem(name, f"={value!r}: not a field of the run config (its fields: "
                   f"{', '.join(f.name for f in dataclasses.fields(RunConfig) if f.name != 'record')})")


def build_run(config) -> RunConfig:
    """The RunConfig of an ml_collections config; one ConfigValueError naming every problem
    under its dotted path (a section's keys as config.build names them, the top-level keys by
    their rules, a key that is no field or moved)."""
    problems, values = [], {}
    seed = config.get("seed", 0)
    for name in config.keys():
        value = config[name]
        try:
            if name in SECTIONS or name in ENTRY_SECTIONS:
                values[name] = _section(name, value, seed)
            elif name in SCALARS:
                values[name] = value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value
            else:
                problems.append(_unknown(name, value))
        except ConfigValueError as e:  # named under the section already
            problems += e.problems
    problems += rule_problems(RunConfig, values)
    if problems:
        raise ConfigValueError(problems=problems)
    return RunConfig(**values, record=json.loads(config.to_json()))


def builtin_assets(run: RunConfig) -> BuiltinAssets:
    """The built-in synthetic data and initial model of run.data (created if missing). They
    have their own seed, so runs that differ only by the run's seed (sweep seeds) share them."""
    d = run.data
    model = run.model.preset if run.model.preset in BUILTIN_MODELS else "tiny"
    return ensure_builtin(d.builtin_root, seed=d.seed, num_train=d.num_train, num_eval=d.num_eval,
                          durations=tuple(d.durations), task=d.task, model_preset=model,
                          sft_modes=tuple(d.sft_modes))
