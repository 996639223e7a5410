"""Run assembly: what a command runs on, built from its typed config (run_config.RunConfig,
which the command line builds once from configs/*.py): the mesh and the model, the data and
its identity, the exported checkpoint.

The application layer's: the commands (paravt_jax/cli) build through these functions, and every
one returns plain data or a dataclass; the library takes what they build as arguments.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os

from paravt_jax.config import ConfigValueError
from paravt_jax.data.builtin import BUILTIN_MODELS, BuiltinAssets
from paravt_jax.data.paravt_parquet import RLRow, load_rl_rows, load_sft_rows
from paravt_jax.infra import distributed, meshes, storage
from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl import init_model, load_pretrained, preset, save_pretrained
from paravt_jax.run_config import RunConfig, builtin_assets
from paravt_jax.text.hf_processor import save_processor
from paravt_jax.text.inputs import check_against_model
from paravt_jax.text.tokenizer import Tokenizer


def build_mesh(run: RunConfig):
    """The training mesh: run.mesh_preset (a named TPU slice / GPU host layout,
    paravt_jax/infra/meshes.py), else the axis sizes of run.mesh; with mesh.rollout_devices = R,
    the sizes of run.mesh over every device but the last R (build_rollout_mesh)."""
    held = run.mesh.rollout_devices
    if held:
        devices = _split_devices(run, held)[0]
        try:
            return sh.make_mesh(run.mesh.axes(), devices)
        except ValueError as e:
            raise ConfigValueError(f"mesh (the training mesh of {len(devices)} devices beside "
                                   f"mesh.rollout_devices={held}): {e}") from None
    if run.mesh_preset:
        entry = meshes.get_mesh(run.mesh_preset)
        return sh.make_hybrid_mesh(entry["ici"], entry["dcn"])
    return sh.make_mesh(run.mesh.axes())


def build_rollout_mesh(run: RunConfig):
    """The rollout mesh of a split run (mesh.rollout_devices = R > 0): this process's share of
    the R devices (R / processes, its last local devices), laid out as mesh.rollout_axes
    (default tensor=-1: the sampler's weights split over heads and MLP for decode, where the
    trainer shards them FSDP-style); None when colocated. Each process samples its share of a
    step's prompts on its own rollout devices."""
    held = run.mesh.rollout_devices
    if not held:
        return None
    devices = _split_devices(run, held)[1]
    text = run.mesh.rollout_axes
    try:
        return sh.make_mesh(sh.parse_mesh(text), devices)
    except ValueError as e:
        raise ConfigValueError(f"mesh.rollout_axes={text!r} over this process's {len(devices)} of "
                               f"mesh.rollout_devices={held}: {e}") from None


def check_rollout_sampler(run: RunConfig, model, rollout_mesh) -> None:
    """Refuses, before any training, a rollout sampler its devices cannot run: the packed prompt
    prefill and the paged decode run unsharded only (the rollouts' devices: `rollout_mesh`, else
    the model's)."""
    mesh = rollout_mesh if rollout_mesh is not None else distributed.model_mesh(model)
    run.rl.sampler.check_devices(1 if mesh is None else mesh.size, prefix="rl.sampler.")


def _split_devices(run: RunConfig, held: int) -> tuple[list, list]:
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
    if run.mesh_preset:
        raise ConfigValueError(f"mesh.rollout_devices={held} with mesh_preset={run.mesh_preset!r}: give the "
                               "training mesh as config.mesh sizes (a preset describes every device)")
    per_process = held // processes
    rollout = {p: [d for d in devices if d.process_index == p][-per_process:] for p in range(processes)}
    apart = {d.id for part in rollout.values() for d in part}
    return [d for d in devices if d.id not in apart], rollout[distributed.process_index()]


def build_model(run: RunConfig, default_dir: str | None = None):
    """The configured checkpoint, else `default_dir` (the built-in checkpoint) for the built-in
    presets; randomly initialised only when model.init=random says so."""
    m = run.model
    mesh = build_mesh(run)
    directory = m.checkpoint or (default_dir if m.preset in BUILTIN_MODELS else None)
    if m.init == "random":
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
    return init_model(preset(m.preset, **knobs), seed=run.seed, mesh=mesh)


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


def _rl_rows(run: RunConfig, paths: dict, root: str) -> tuple[list[RLRow], list[RLRow]]:
    """(training, held-out) RL rows: from the parquet files, or through the TFDS ArrayRecord
    builder and grain when data.tfds_dir is set."""
    tfds_dir = run.data.tfds_dir
    if not tfds_dir:
        return load_rl_rows(paths["rl_train"], root)[0], load_rl_rows(paths["rl_eval"], root)[0]
    from paravt_jax.data import tfds_builder  # tensorflow_datasets: slow to import, only for this source

    sources = tfds_builder.build("rl", {"train": paths["rl_train"], "eval": paths["rl_eval"]}, tfds_dir, root)
    return tuple([tfds_builder.rl_row(x) for x in tfds_builder.grain_loader(sources[split], seed=run.seed,
                                                                           num_epochs=1, shuffle=False)]
                 for split in ("train", "eval"))


def setup(run: RunConfig) -> RunInputs:
    """The model, tokenizer and data of a run (the training commands checked its data sources at
    the command line: config_checks.check_data_sources). Collective: process 0 creates the
    built-in assets (if missing) before the others read them."""
    assets = builtin_assets(run) if distributed.is_primary() else None
    distributed.barrier("paravt:builtin-assets")
    assets = assets or builtin_assets(run)
    model = build_model(run, default_dir=assets.model_dir)
    tokenizer = Tokenizer.from_directory(run.model.checkpoint or assets.model_dir)
    check_against_model(tokenizer, model.config)
    data = run.data
    root = data.video_root or assets.data_dir
    paths = {name: getattr(data, name) or os.path.join(assets.data_dir, f"{name}.parquet")
             for name in ("sft", "rl_train", "rl_eval")}
    sft_messages, sft_report = load_sft_rows(paths["sft"], root)
    rl_rows, eval_rows = _rl_rows(run, paths, root)
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
