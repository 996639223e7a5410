"""The released cold-start SFT recipe (the reference's paravt/sft/configs/qwen3vl_8b.yaml) in the
recipe presets, field by field, and the SFT options it needs: fps frame sampling, video items,
two-stage sizing, over-long examples dropped."""
import pytest

from paravt_jax.config import ConfigValueError
from paravt_jax.configs import paragrpo
from paravt_jax.data import synthetic as syn
from paravt_jax.data.sft_examples import FrameSpec, sft_inputs
from paravt_jax.run_config import build_run
from paravt_jax.sft.frames import example_frames, example_nframes
from paravt_jax.sft.trainer import SFTConfig
from paravt_jax.text.tokenizer import train_tokenizer

RECIPE_PRESETS = ("qwen3vl_8b", "qwen3vl_2b", "qwen3vl_32b", *paragrpo.ASYNC_PRESETS)

# The yaml's fields as our SFTConfig holds them (written out here, not read from the config module).
RELEASED = dict(
    steps=1500,  # max_steps
    batch_size=64,  # 32 packs of ~2 examples (1,500 steps = one pass over the 96.5k-example manifest)
    train_width=8192,  # packing_length
    max_tokens_per_micro_batch=4 * 8 * 8192,  # per_device_train_batch_size 4 on 8 GPUs, accumulation 1
    micro_batches=1,
    filter_overlong=True,
    frame_sampling="fps", fps=1.0, max_frames=64,  # video_sampling_strategy, fps, video_max_frames
    min_pixels=784, max_pixels=50176,  # video_min_pixels, video_max_pixels
    sizing="two_stage", visual="video",  # qwen-vl-utils, then the Qwen3-VL video processor
    nframes_choices=(), first_steps=0,
    checkpoint_every=100,  # save_steps
)
RELEASED_OPTIMIZER = dict(name="adamw", learning_rate=2e-5, weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-8,
                          grad_clip=1.0, schedule="cosine", total_steps=1500, warmup_steps=75, frozen=())


@pytest.mark.parametrize("preset", RECIPE_PRESETS)
def test_recipe_presets_hold_the_released_sft_recipe_in_every_field(preset):
    config = paragrpo.get_config(preset)
    sft = build_run(config).sft
    assert {k: getattr(sft, k) for k in RELEASED} == RELEASED
    assert {k: getattr(sft.optimizer, k) for k in RELEASED_OPTIMIZER} == RELEASED_OPTIMIZER
    # bf16: true, gradient_checkpointing: true
    assert (config.model.dtype, config.model.param_dtype, config.model.remat) == ("bfloat16", "bfloat16", True)
    # warmup_ratio 0.05 of max_steps
    assert sft.optimizer.warmup_steps == round(0.05 * sft.steps) and sft.optimizer.total_steps == sft.steps


@pytest.mark.parametrize("preset", ("tiny", "toy"))
def test_small_presets_keep_counted_image_overviews(preset):
    sft = build_run(paragrpo.get_config(preset)).sft
    assert (sft.frame_sampling, sft.visual, sft.sizing, sft.filter_overlong) == ("count", "images", "single", False)
    # the toy's rows draw K from sft.nframes_choices (the varied cold start); tiny's keep sft.nframes
    nframes = {"tiny": sft.nframes, "toy": example_nframes(0, sft)}[preset]
    assert nframes in (sft.nframes_choices or (sft.nframes,))
    assert example_frames(0, sft) == FrameSpec(nframes, 1.0, 64, 784, sft.max_pixels, "single", "images")


@pytest.mark.parametrize("field,value,message", [
    ("frame_sampling", "every", "frame_sampling='every': must be one of"),
    ("visual", "clip", "visual='clip': must be one of"),
    ("sizing", "double", "sizing='double': must be one of"),
    ("fps", 0.0, "fps=0.0: must be a finite number > 0"),
    ("min_pixels", 60000, "min_pixels=60000: must be <= max_pixels (50176)"),
    ("filter_overlong", True, "filter_overlong=True: needs train_width"),
])
def test_bad_sft_frame_settings_name_their_field(field, value, message):
    with pytest.raises(ConfigValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SFTConfig(**{field: value})


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    return str(root), {seconds: syn.write_video(str(root / f"v{seconds}.mp4"), seconds, [], fps=2.0, height=480,
                                                width=854) for seconds in (9, 40, 100)}


def _row(path):
    return [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": path}},
                                         {"type": "text", "text": "What happens?"}]},
            {"role": "assistant", "content": "<think> a </think>"}]


def test_fps_sampling_sends_the_references_video_item(videos):
    """1 fps up to 64 frames (qwen-vl-utils' count: floored to an even number), each 854x480 frame
    resized to 280x140 (factor 28, <= 50,176 pixels) then 288x128 by the video processor: one
    video item of T/2 groups of 8x18 patches (36 tokens a group)."""
    root, paths = videos
    tok = train_tokenizer(["What happens <think> a </think> seconds"] * 5)
    spec = example_frames(0, build_run(paragrpo.get_config("qwen3vl_8b")).sft)
    grids = {s: sft_inputs(_row(p), tok, root, spec).video_grid_thw.tolist() for s, p in paths.items()}
    assert grids == {9: [[4, 8, 18]], 40: [[20, 8, 18]], 100: [[32, 8, 18]]}
    as_images = sft_inputs(_row(paths[40]), tok, root, FrameSpec(nframes=0, sizing="two_stage"))
    # the same frames as image items: the image processor's second resize (>= 65,536 pixels)
    assert len(as_images.video_grid_thw) == 0 and as_images.image_grid_thw.tolist() == [[1, 12, 24]] * 40
    counted = sft_inputs(_row(paths[100]), tok, root, FrameSpec(nframes=6, max_pixels=96 * 160))
    assert counted.image_grid_thw.tolist() == [[1, 4, 10]] * 6  # the small presets' count sampling: 64x160
