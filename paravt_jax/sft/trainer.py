"""Cold-start SFT: masked cross-entropy on assistant tokens (prompts, tool responses and
template tokens masked out), rows length-bucketed by padding to bucketed widths. An example
whose video cannot be read is skipped (a warning names it; `skipped_examples` counts it per
step) and the batch is filled up with its readable examples."""
from __future__ import annotations

import dataclasses
import time

from absl import logging

from paravt_jax.config import checked, integer, integers, one_of, positive, refuse, set_by, share, validate
from paravt_jax.data import gating
from paravt_jax.data.sft_examples import FrameSpec, direct_answer, sft_inputs
from paravt_jax.infra import distributed as dist
from paravt_jax.infra import sharding as sh
from paravt_jax.sft.frames import example_frames, example_nframes
from paravt_jax.sft.objective import HEAD, sft_loss
from paravt_jax.sft.vision_cache import MIB, VisionFeatureCache, without_pixels
from paravt_jax.text.chat import VISUALS
from paravt_jax.train.batch import micro_batch_plan, pack, planned_micro_batches
from paravt_jax.train.loop import LoopConfig, UnreadableDataError, data_indices, run_loop
from paravt_jax.train.step import OptimizerConfig, TrainStep
from paravt_jax.video.frames import SIZINGS
from paravt_jax.video.reader import VideoError

FRAME_SAMPLING = ("count", "fps")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    steps: int = checked(20, integer(0))
    batch_size: int = checked(4, integer(1))
    micro_batches: int = checked(1, integer(1))  # must divide batch_size
    # > 0: micro-batches of at most this many tokens, short examples packed into shared rows
    # (segment ids); micro_batches is then unused
    max_tokens_per_micro_batch: int = checked(0, integer(0))
    # micro-batch passes run at once on host threads (TrainStep's `concurrent`): the same bits,
    # faster on a CPU whose cores one small program leaves idle; 1 on accelerators (one program
    # at a time there) and required with several devices or processes
    concurrent_micro_batches: int = checked(1, integer(1))
    # fixed shapes (one compiled step for the whole run): the packed width of every batch (0 =
    # each batch's own bucket; with token budgets, the budget itself packs one row per
    # micro-batch; set, every token-budget micro-batch gets as many rows as the budget holds) and
    # the frames every micro-batch's vision pass is padded to (0 = powers of two)
    train_width: int = checked(0, integer(0))
    train_frames: int = checked(0, integer(0))
    # examples longer than train_width tokens are dropped (counted in skipped_examples), as the
    # reference's packing drops them (filter_overlong); off: they get a wider bucket of their own
    filter_overlong: bool = False
    seed: int = set_by(0, "seed (the top of the config)")
    # How an example's overview (a whole-video item) is sampled: count = `nframes` frames (or a
    # draw from nframes_choices) spread over the video; fps = `fps` frames a second, at most
    # `max_frames` (the reference's SFT loader: qwen-vl-utils at 1 fps, up to 64; nframes and
    # nframes_choices unused)
    frame_sampling: str = checked("count", one_of(FRAME_SAMPLING))
    nframes: int = checked(8, integer(1))
    # non-empty: each example's overview has K frames, K drawn per row from these choices (the
    # stable hash of nFrames gating, keyed on the row index), so the cold start sees tool use
    # at every overview budget the RL gating draws; empty: `nframes` for every row
    nframes_choices: tuple[int, ...] = checked((), integers(1, empty=True))
    fps: float = checked(1.0, positive())
    max_frames: int = checked(64, integer(1))
    # every frame (overview, crops, images) resized to [min_pixels, max_pixels] pixels: single =
    # one resize at factor 32; two_stage = qwen-vl-utils' (factor 28), then the processor's
    # (video/frames.py). visual: the overview as timestamped image items (as the RL prompts
    # send it) or as one Qwen3-VL video item (as the reference's SFT loader does; two_stage's
    # second resize is then the video processor's, not the image processor's)
    min_pixels: int = checked(784, integer(1))
    max_pixels: int = checked(50176, integer(784))
    sizing: str = checked("single", one_of(SIZINGS))
    visual: str = checked("images", one_of(VISUALS))
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-3, weight_decay=0.0)
    checkpoint_every: int = checked(0, integer(0))
    # a curriculum: the first `first_steps` steps draw their rows from those whose SFT-table
    # `kind` is one of `first_kinds` only, the rest from every row
    first_steps: int = checked(0, integer(0))
    first_kinds: tuple[str, ...] = ()
    # and, when set, only from rows whose overview K (nframes_choices' draw) is at most this: the
    # look-up learned on the sparse overviews before any dense row (e.g. a shortcut-prior one) is
    # mixed in; 0 = rows of any K
    first_max_nframes: int = checked(0, integer(0))
    # a shortcut prior (the cold start skips the tool on dense overviews, as the paper's does):
    # a tool-calling row whose overview has at least `direct_from_nframes` frames (count sampling)
    # answers straight away instead (data/sft_examples.direct_answer) with probability
    # `direct_share`, drawn per row (stable in the seed); 0 = off
    direct_from_nframes: int = checked(0, integer(0))
    direct_share: float = checked(1.0, share())
    # with a frozen vision tower (optimizer.frozen covering "visual"): each example's frames are
    # encoded once, on first use, in calls of train_frames frames (32 when 0), and the steps
    # train on the kept features instead of the pixels (sft/vision_cache.py): the same math
    # without a vision pass per step. Refused with a trained tower.
    cache_vision_features: bool = False
    # host memory the kept features may take, MiB (0: unbounded); an example past it is
    # encoded again at each use
    vision_cache_mib: int = checked(4096, integer(0))

    def __post_init__(self):
        validate(self)
        if self.batch_size % self.micro_batches:
            raise refuse("micro_batches", self.micro_batches,
                         f"must divide the {self.batch_size} rows of a step (batch_size)")
        if self.min_pixels > self.max_pixels:
            raise refuse("min_pixels", self.min_pixels, f"must be <= max_pixels ({self.max_pixels})")
        if self.filter_overlong and not self.train_width:
            raise refuse("filter_overlong", self.filter_overlong, "needs train_width (the longest example kept)")
        if self.first_max_nframes and self.frame_sampling != "count":
            raise refuse("first_max_nframes", self.first_max_nframes,
                         f"needs frame_sampling='count' (a row's K; got {self.frame_sampling!r})")
        if self.cache_vision_features and not any(f.split(".")[0] == "visual" for f in self.optimizer.frozen):
            raise refuse("cache_vision_features", self.cache_vision_features,
                         f"needs the vision tower frozen (optimizer.frozen={self.optimizer.frozen!r} names no "
                         "'visual' parameter): a trained tower's features change every step")


def curriculum_rows(kinds, config: SFTConfig) -> list[int] | None:
    """The rows the first `config.first_steps` steps draw from (None: no curriculum): those of
    `first_kinds` whose overview K is at most `first_max_nframes` (when set). A kind that names
    no row is refused, naming it and the kinds there are, as is a K bound that leaves none."""
    if not config.first_steps:
        return None
    if not config.first_kinds:
        raise ValueError("sft.first_steps > 0 needs sft.first_kinds (the row kinds to start from)")
    present = sorted(set(kinds))
    unknown = [k for k in config.first_kinds if k not in present]
    if unknown:
        raise ValueError(f"sft.first_kinds {unknown} name no SFT row; the rows' kinds: {present}")
    rows = [i for i, k in enumerate(kinds) if k in config.first_kinds]
    if config.first_max_nframes:
        rows = [i for i in rows if example_nframes(i, config) <= config.first_max_nframes]
        if not rows:
            raise ValueError(f"sft.first_max_nframes={config.first_max_nframes} leaves no row of "
                             f"{list(config.first_kinds)} (K drawn from {config.nframes_choices or (config.nframes,)})")
    return rows


def step_rows(index: int, config: SFTConfig, size: int, first: list[int] | None) -> list[int]:
    """The rows of step `index`: from `first` (curriculum_rows) during the first
    `config.first_steps` steps, else from all `size` rows; seeded epochs either way."""
    pool = first if first is not None and index < config.first_steps else range(size)
    return [pool[i] for i in data_indices(index * config.batch_size, config.batch_size, len(pool), config.seed)]


def answers_directly(index: int, frames: FrameSpec, config: SFTConfig) -> bool:
    """Whether SFT row `index`, read with `frames`, is trained as a direct answer if it is a
    tool-calling trajectory (the shortcut prior: `direct_from_nframes`, `direct_share`)."""
    if not config.direct_from_nframes or frames.nframes < config.direct_from_nframes:
        return False
    return gating.drawn_share("paravt-sft-direct", config.seed, index, config.direct_share)


def fill_batch(readable: list, size: int) -> list:
    """`size` examples: the readable ones, repeated in order where unreadable ones were dropped,
    so the batch keeps its shape (and its micro-batches their size)."""
    return [readable[i % len(readable)] for i in range(size)]


def read_example(index: int, messages, tokenizer, video_root: str,
                 config: SFTConfig) -> tuple[object | None, str | None]:
    """SFT row `index`'s (inputs, None), or (None, the reason) for an example whose video cannot
    be read (or that is longer than train_width under filter_overlong)."""
    frames = example_frames(index, config)
    if answers_directly(index, frames, config):  # rows without a tool call stay as they are
        messages = direct_answer(messages) or messages
    try:
        inputs = sft_inputs(messages, tokenizer, video_root, frames)
    except (VideoError, ValueError, OSError) as e:
        logging.warning(f"[sft] example {index} skipped: {e}")
        return None, f"example {index}: {e}"
    if config.filter_overlong and inputs.length > config.train_width:
        logging.warning(f"[sft] example {index} skipped: {inputs.length} tokens, longer than train_width "
                        f"{config.train_width} (filter_overlong)")
        return None, f"example {index}: {inputs.length} tokens > train_width {config.train_width}"
    return inputs, None


class CachedVision:
    """The SFT side of `sft.cache_vision_features`: the feature cache, made on the first step
    from that step's tower (the restored one when a run resumes), and the examples read so far,
    whose pixels are dropped once their features are kept."""

    def __init__(self, step: TrainStep, config: SFTConfig, examples: dict):
        if not step.vision_frozen:
            raise ValueError(f"sft.cache_vision_features needs every vision tower parameter frozen; "
                             f"sft.optimizer.frozen={config.optimizer.frozen!r} leaves some trained")
        self.step, self.config, self.examples = step, config, examples
        self.cache: VisionFeatureCache | None = None

    def features(self, picked: list, state) -> tuple[list, dict]:
        """One VisionFeatures (or None) per (index, inputs) of `picked`, and the step's metrics."""
        start = time.perf_counter()

        def tower():  # the whole model merged to reach its tower: only when some example needs encoding
            return self.step.model(state).visual

        if self.cache is None:
            self.cache = VisionFeatureCache(tower(), self.config.train_frames or 32, self.step.mesh,
                                            self.config.vision_cache_mib * MIB)
        found, frames = self.cache.features(picked, tower)
        for index, _ in picked:
            inputs, _ = self.examples.get(index, (None, None))
            if index in self.cache and inputs is not None and len(inputs.pixel_values) + len(
                    inputs.pixel_values_videos):
                self.examples[index] = (without_pixels(inputs), None)
        return [found.get(index) for index, _ in picked], {
            "vision_frames_encoded": frames, "vision_cache_mib": self.cache.bytes / MIB,
            "vision_encode_s": time.perf_counter() - start}

    def check(self, state) -> None:
        """Refuses a run whose tower changed under the cache (it cannot while frozen)."""
        if self.cache is not None:
            self.cache.check(self.step.model(state).visual)


def train_sft(model, tokenizer, rows: list, video_root: str, workdir: str, config: SFTConfig,
              kinds=()):
    """Returns (model with trained weights, LoopResult). Each process reads the videos of its
    contiguous share of every batch (once per row, on first use); the shares are gathered into
    the global batch, in process order (see paravt_jax.infra.distributed). `kinds`: each row's kind,
    for the curriculum (`first_steps`, `first_kinds`). With `cache_vision_features`, every
    process encodes the gathered batch's new examples alike and keeps their features."""
    share = dist.process_slice(config.batch_size, "batch_size")
    if len(kinds) not in (0, len(rows)):
        raise ValueError(f"train_sft: {len(kinds)} kinds for {len(rows)} rows")
    first = curriculum_rows(tuple(kinds) or ("",) * len(rows), config)
    examples: dict[int, tuple] = {}

    def example(i: int) -> tuple[object | None, str | None]:
        if i not in examples:
            examples[i] = read_example(i, rows[i], tokenizer, video_root, config)
        return examples[i]

    step = TrainStep(model, config.optimizer, sft_loss, HEAD, mesh=dist.model_mesh(model),
                     concurrent=config.concurrent_micro_batches)
    vision = CachedVision(step, config, examples) if config.cache_vision_features else None
    unreadable = {"examples": 0}  # examples in a row that could not be read

    def step_fn(state, index):
        chosen = step_rows(index, config, len(rows), first)
        mine = [(i, *example(i)) for i in chosen[share]]
        gathered = dist.concatenate_lists(dist.allgather_objects(mine))
        readable = [(i, inputs) for i, inputs, _ in gathered if inputs is not None]
        skipped = len(gathered) - len(readable)
        if not readable:
            unreadable["examples"] += skipped
            if unreadable["examples"] >= len(rows):
                raise UnreadableDataError(f"[sft] no example could be read for {unreadable['examples']} examples "
                                          f"in a row (the dataset has {len(rows)}); the last: "
                                          + "; ".join(error for _, _, error in gathered))
            logging.warning(f"[sft] step {index} skipped, none of its examples could be read")
            return state, {"unreadable_step": 1.0, "skipped_examples": skipped}
        unreadable["examples"] = 0
        picked = fill_batch(readable, config.batch_size)
        features, vision_metrics = vision.features(picked, state) if vision is not None else (None, {})
        packed = pack([inputs for _, inputs in picked], width=config.train_width)
        # token-budget micro-batches get a multiple of the batch's devices as rows (else replicated)
        plan = micro_batch_plan(packed, config.micro_batches, config.max_tokens_per_micro_batch,
                                sh.batch_devices(step.mesh), full_rows=config.train_width > 0)
        state, metrics = step.step(state, planned_micro_batches(packed, plan, model.config.vision,
                                                                min_frames=config.train_frames,
                                                                vision_shards=sh.batch_devices(step.mesh),
                                                                features=features))
        return state, {**metrics, "skipped_examples": skipped, "padding_fraction": plan.padding_fraction(),
                       **vision_metrics}

    result = run_loop("sft", workdir, step.init_state(), step_fn,
                      LoopConfig(config.steps, config.checkpoint_every),
                      meta_fn=lambda i: {"cursor": i * config.batch_size, "seed": config.seed})
    if vision is not None:
        vision.check(result.state)
    return step.model(result.state), result
