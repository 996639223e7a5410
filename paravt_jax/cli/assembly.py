"""Run assembly: what a command runs on, built from its config (configs/*.py): the mesh and the
model, the built-in assets, the data, and the config sections as the trainers' dataclasses.

The application layer's: the commands (paravt_jax/cli) build through these functions, and every
one returns plain data or a dataclass; the library takes what they build as arguments.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os

from paravt_jax.cli.config_checks import check_data_sources
from paravt_jax.config import ConfigValueError, build
from paravt_jax.data.builtin import BUILTIN_MODELS, BuiltinAssets, ensure_builtin
from paravt_jax.data.paravt_parquet import RLRow, load_rl_rows, load_sft_rows
from paravt_jax.eval import registry
from paravt_jax.infra import distributed, meshes, storage
from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl import init_model, load_pretrained, preset, save_pretrained
from paravt_jax.rl.trainer import RLConfig
from paravt_jax.sft.trainer import SFTConfig
from paravt_jax.text.hf_processor import save_processor
from paravt_jax.text.inputs import check_against_model
from paravt_jax.text.tokenizer import Tokenizer


def mesh_axes(config) -> dict[str, int]:
    """The (data, fsdp, tensor) sizes of config.mesh (its other fields configure the rollout mesh)."""
    return {axis: config.mesh[axis] for axis in sh.MESH_AXES if axis in config.mesh}


def rollout_devices(config) -> int:
    """config.mesh.rollout_devices: devices kept apart for rollouts (0 = colocated)."""
    return int(config.mesh.get("rollout_devices", 0))


def build_mesh(config):
    """The training mesh: config.mesh_preset (a named TPU slice / GPU host layout,
    paravt_jax/infra/meshes.py), else the axis sizes of config.mesh; with mesh.rollout_devices = R,
    the sizes of config.mesh over every device but the last R (build_rollout_mesh)."""
    held = rollout_devices(config)
    if held:
        devices = _split_devices(config, held)[0]
        try:
            return sh.make_mesh(mesh_axes(config), devices)
        except ValueError as e:
            raise ConfigValueError(f"mesh (the training mesh of {len(devices)} devices beside "
                                   f"mesh.rollout_devices={held}): {e}") from None
    if config.get("mesh_preset", ""):
        entry = meshes.get_mesh(config.mesh_preset)
        return sh.make_hybrid_mesh(entry["ici"], entry["dcn"])
    return sh.make_mesh(mesh_axes(config))


def build_rollout_mesh(config):
    """The rollout mesh of a split run (mesh.rollout_devices = R > 0): this process's share of
    the R devices (R / processes, its last local devices), laid out as mesh.rollout_axes
    (default tensor=-1: the sampler's weights split over heads and MLP for decode, where the
    trainer shards them FSDP-style); None when colocated. Each process samples its share of a
    step's prompts on its own rollout devices."""
    held = rollout_devices(config)
    if not held:
        return None
    devices = _split_devices(config, held)[1]
    text = config.mesh.get("rollout_axes", "tensor=-1")
    try:
        return sh.make_mesh(sh.parse_mesh(text), devices)
    except ValueError as e:
        raise ConfigValueError(f"mesh.rollout_axes={text!r} over this process's {len(devices)} of "
                               f"mesh.rollout_devices={held}: {e}") from None


def _split_devices(config, held: int) -> tuple[list, list]:
    """(training devices, this process's rollout devices): each process keeps its last
    held / processes local devices for rollouts; every other device trains."""
    import jax

    devices, processes = jax.devices(), distributed.process_count()
    if held < 0 or held >= len(devices):
        raise ConfigValueError(f"mesh.rollout_devices={held}: must be 0 (colocated) or fewer than the "
                               f"{len(devices)} devices, leaving some to train")
    if held % processes:
        raise ConfigValueError(f"mesh.rollout_devices={held}: must be a multiple of the {processes} processes "
                               "(each samples on its own share)")
    if config.get("mesh_preset", ""):
        raise ConfigValueError(f"mesh.rollout_devices={held} with mesh_preset={config.mesh_preset!r}: give the "
                               "training mesh as config.mesh sizes (a preset describes every device)")
    per_process = held // processes
    rollout = {p: [d for d in devices if d.process_index == p][-per_process:] for p in range(processes)}
    apart = {d.id for part in rollout.values() for d in part}
    return [d for d in devices if d.id not in apart], rollout[distributed.process_index()]


def build_model(config, default_dir: str | None = None):
    """The configured checkpoint, else `default_dir` (the built-in checkpoint) for the built-in
    presets; randomly initialised only when model.init=random says so."""
    m = config.model
    mesh = build_mesh(config)
    directory = m.checkpoint or (default_dir if m.preset in BUILTIN_MODELS else None)
    if m.get("init", "checkpoint") == "random":
        directory = None
    elif not directory:
        raise ConfigValueError(f"model.checkpoint is empty and the {m.preset!r} model has no built-in checkpoint; "
                               "give --config.model.checkpoint=DIR, or --config.model.init=random")
    if directory:
        return load_pretrained(directory, dtype=m.param_dtype, compute_dtype=m.dtype, mesh=mesh,
                               remat=m.remat, scan_layers=m.scan_layers, attention=m.attention,
                               attention_block=m.attention_block)
    knobs = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat, scan_layers=m.scan_layers,
                 attention=m.attention, attention_block=m.attention_block)
    return init_model(preset(m.preset, **knobs), seed=config.seed, mesh=mesh)


def builtin_assets(config) -> BuiltinAssets:
    """The built-in synthetic data and initial model of config.data (created if missing). They
    have their own seed, so runs that differ only by `config.seed` (sweep seeds) share them."""
    d = config.data
    model = config.model.preset if config.model.preset in BUILTIN_MODELS else "tiny"
    return ensure_builtin(d.builtin_root, seed=d.get("seed", 0), num_train=d.num_train,
                          num_eval=d.num_eval, durations=tuple(d.durations), task=d.get("task", "shapes"),
                          model_preset=model, sft_modes=tuple(d.get("sft_modes", ("frames",))))


def sft_config(config) -> SFTConfig:
    """The `sft` section -> SFTConfig (the run's seed from the top of the config)."""
    return build(SFTConfig, config.sft, "sft", seed=config.seed)


def rl_config(config) -> RLConfig:
    """The `rl` section -> RLConfig (the run's seed from the top of the config)."""
    return build(RLConfig, config.rl, "rl", seed=config.seed)


def evals_config(config) -> dict:
    """The `evals` section -> its entries, name -> settings (the main job's evaluations, by
    type: eval/registry.py)."""
    return registry.build(config.evals, "evals")


@dataclasses.dataclass(frozen=True)
class SFTData:
    rows: list  # chat message lists
    kinds: tuple[str, ...]  # each row's `kind` column ("" without one): the SFT curriculum's key


@dataclasses.dataclass
class RunInputs:
    """What a command runs on, built from the config by `setup`."""
    model: object
    tokenizer: Tokenizer
    sft: SFTData
    rl_rows: list[RLRow]
    eval_rows: list[RLRow]  # held out
    video_root: str
    data: dict = dataclasses.field(default_factory=dict)  # the data's identity (data_identity)
    data_dir: str = ""  # the built-in data (the synthetic benchmark's default)


def file_digest(path: str) -> str:
    """sha256 (16 hex digits) of a data file's bytes (local or gs://)."""
    return hashlib.sha256(storage.read_bytes(path)).hexdigest()[:16]


def data_identity(assets: BuiltinAssets, paths: dict, video_root: str) -> dict:
    """What a run's manifest records of its data: each table's content hash, and the built-in
    set's content hash when the run reads it (its videos and model included). Videos given by
    `data.video_root` are not hashed (the tables name them; hashing terabytes would take hours)."""
    identity = {name: file_digest(path) for name, path in sorted(paths.items())}
    if video_root == assets.data_dir or any(path.startswith(assets.data_dir + os.sep) for path in paths.values()):
        identity.update(assets.identity())
    else:
        identity["video_root"] = video_root
    return identity


def _rl_rows(config, paths: dict, root: str) -> tuple[list[RLRow], list[RLRow]]:
    """(training, held-out) RL rows: from the parquet files, or through the TFDS ArrayRecord
    builder and grain when data.tfds_dir is set."""
    tfds_dir = config.data.get("tfds_dir", "")
    if not tfds_dir:
        return load_rl_rows(paths["rl_train"], root)[0], load_rl_rows(paths["rl_eval"], root)[0]
    from paravt_jax.data import tfds_builder  # tensorflow_datasets: slow to import, only for this source

    sources = tfds_builder.build("rl", {"train": paths["rl_train"], "eval": paths["rl_eval"]}, tfds_dir, root)
    return tuple([tfds_builder.rl_row(x) for x in tfds_builder.grain_loader(sources[split], seed=config.seed,
                                                                           num_epochs=1, shuffle=False)]
                 for split in ("train", "eval"))


def setup(config, training: bool = False) -> RunInputs:
    """The model, tokenizer and data of a config. `training`: outside the toy presets every data
    file must be given (config_checks.check_data_sources). Collective: process 0 creates the
    built-in assets (if missing) before the others read them."""
    if training:
        check_data_sources(config)
    assets = builtin_assets(config) if distributed.is_primary() else None
    distributed.barrier("paravt:builtin-assets")
    assets = assets or builtin_assets(config)
    model = build_model(config, default_dir=assets.model_dir)
    tokenizer = Tokenizer.from_directory(config.model.checkpoint or assets.model_dir)
    check_against_model(tokenizer, model.config)
    data = config.data
    root = data.get("video_root", "") or assets.data_dir
    paths = {name: data.get(name, "") or os.path.join(assets.data_dir, f"{name}.parquet")
             for name in ("sft", "rl_train", "rl_eval")}
    sft_messages, sft_report = load_sft_rows(paths["sft"], root)
    rl_rows, eval_rows = _rl_rows(config, paths, root)
    return RunInputs(model, tokenizer, SFTData(sft_messages, sft_report.kinds), rl_rows, eval_rows, root,
                     data_identity(assets, paths, root), assets.data_dir)


def save_export(model, tokenizer, directory: str) -> None:
    """An HF checkpoint that transformers and serving engines load: config.json, safetensors,
    the tokenizer, the chat template and the processor configurations. `directory` may be
    gs:// (written locally, then uploaded file by file with config.json last)."""
    with storage.staged_directory(directory, last=("config.json",)) as local:
        save_pretrained(model, local)
        tokenizer.save(local)
        save_processor(local)
