"""The rollout's prompt format and tool protocol: the two presets, the configs built from them
(the RL rollout's and the evaluation driver's), their checks and the driver's record key."""
import dataclasses

import ml_collections
import pytest

from paravt_jax.agent.protocol import PromptFormat, ToolProtocol
from paravt_jax.agent.rollout import RolloutConfig
from paravt_jax.config import ConfigValueError, build, section
from paravt_jax.configs import eval as eval_config
from paravt_jax.configs import paragrpo
from paravt_jax.eval import driver, prompts, provenance
from paravt_jax.eval.settings import DriverConfig
from paravt_jax.rl.trainer import RLConfig
from paravt_jax.run_config import build_run
from paravt_jax.text.inputs import VIDEO_ITEM_LAYOUT

# The protocol fields of the RolloutConfig the driver built from the flat DriverConfig (before
# the prompt and protocol subsections): agentic_general, a multiple-choice question; since
# 2026-12-04 with the reference's two-stage frame sizing (it was one resize).
FLAT_DRIVER_PROMPT = dict(tools=True, think_prefix=False, overview_min_pixels=100352, overview_max_pixels=602112,
                          overview_sizing="two_stage", overview_fps=1.0, overview_max_frames=64,
                          overview_timestamps=False, video_path_line="space_if_absent", overview_visual="images",
                          overview_video_frames=32, overview_video_min_pixels=4096,
                          overview_video_max_pixels=25165824)
FLAT_DRIVER_PROTOCOL = dict(frames_response="images_first", malformed="ignore", extra_calls="ignore",
                            final_answer=True, final_answer_tokens=64, final_answer_prefix="")
# DriverConfig()'s record settings as the flat DriverConfig's fields gave them, with the frames
# sized in two stages (overview_sizing, crop_sizing: keyed since 2026-12-04) at the reference's
# crop budget.
FLAT_SETTINGS = dict(prompt_mode="agentic_general", nframes=64, max_turns=3, max_parallel=5, max_new_tokens=2048,
                     mcq_answer_tokens=64, grounding_answer_tokens=128, dispatch="parallel",
                     overview_min_pixels=100352, overview_max_pixels=602112, crop_min_pixels=784,
                     crop_max_pixels=50176, crop_sizing="two_stage", overview_sizing="two_stage", think_prefix=False,
                     overview_visual="images", video_frames=32,
                     video_min_pixels=4096, video_max_pixels=25165824, overview_timestamps=False,
                     video_path_line="space_if_absent", frames_response="images_first", malformed="ignore",
                     extra_calls="ignore", crop_arguments="lenient", prompt_file="")


def test_training_presets_are_the_rollout_defaults():
    assert RolloutConfig().prompt == PromptFormat.training() == PromptFormat()
    assert RolloutConfig().protocol == ToolProtocol.training() == ToolProtocol()
    assert RLConfig().rollout == RolloutConfig()
    trained = PromptFormat.training()
    assert trained.think_prefix and trained.overview_timestamps and trained.video_path_line == "newline"
    assert not ToolProtocol.training().final_answer and ToolProtocol.training().malformed == "respond"


def test_reference_eval_presets_are_the_drivers_protocol():
    assert DriverConfig().prompt == PromptFormat.reference_eval()
    assert DriverConfig().protocol == ToolProtocol.reference_eval()
    rollout = driver.rollout_config(DriverConfig(), "mcq")
    system = prompts.prompt_mode("agentic_general").system
    assert rollout == RolloutConfig(
        mode="frames", max_turns=3, max_new_tokens=2048, temperature=0.0,
        prompt=dataclasses.replace(PromptFormat.reference_eval(), system_prompt=system),
        protocol=dataclasses.replace(ToolProtocol.reference_eval(), final_answer_instruction=prompts.FINAL_MCQ))
    # the same values the flat DriverConfig gave the rollout (the tool layout is new and has
    # no effect: the prompt mode's system text holds the tool schema)
    assert {k: getattr(rollout.prompt, k) for k in FLAT_DRIVER_PROMPT} == FLAT_DRIVER_PROMPT
    assert {k: getattr(rollout.protocol, k) for k in FLAT_DRIVER_PROTOCOL} == FLAT_DRIVER_PROTOCOL
    assert rollout.prompt.system_prompt == system and rollout.prompt.tool_layout == "object"
    direct = driver.rollout_config(dataclasses.replace(DriverConfig(), prompt_mode="direct"), "tvg")
    assert not direct.prompt.tools and direct.max_turns == 0 and not direct.protocol.final_answer
    assert direct.protocol.final_answer_tokens == 128
    assert direct.protocol.final_answer_instruction == prompts.FINAL_GROUNDING


def test_an_evaluation_protocol_is_the_preset_plus_overrides():
    c = eval_config.get_config("paravt_8b")
    c.driver.prompt.overview_timestamps = True
    c.driver.protocol.malformed = "respond"
    built = driver.driver_config(build_run(c), "videomme")
    assert built.prompt == dataclasses.replace(PromptFormat.reference_eval(), overview_timestamps=True)
    assert built.protocol == dataclasses.replace(ToolProtocol.reference_eval(), malformed="respond")
    charades = driver.driver_config(build_run(c), "charades")
    assert charades.prompt.overview_visual == "video" and charades.prompt.overview_timestamps


def test_a_bad_nested_value_names_its_dotted_path():
    config = paragrpo.get_config("tiny")
    config.rl.rollout.prompt.overview_max_pixels = 10
    config.rl.rollout.protocol.malformed = "skip"
    with pytest.raises(ConfigValueError) as err:
        build(RLConfig, config.rl, "rl", seed=0)
    assert sorted(str(p) for p in err.value.problems) == [
        "rl.rollout.prompt.overview_max_pixels=10: must be an integer >= 784",
        "rl.rollout.protocol.malformed='skip': must be one of ('respond', 'ignore', 'reference')"]
    with pytest.raises(ConfigValueError, match=r"^invalid config value: video_path_line='below': must be one of"):
        PromptFormat(video_path_line="below")
    with pytest.raises(ConfigValueError, match=r"final_answer_tokens=0: must be an integer >= 1"):
        ToolProtocol(final_answer_tokens=0)


def test_a_key_of_the_flat_layout_is_refused_with_its_place_now():
    config = paragrpo.get_config("tiny")
    config.rl.rollout.think_prefix = False  # a config file written before the prompt subsection
    with pytest.raises(ConfigValueError) as err:
        build(RLConfig, config.rl, "rl", seed=0)
    (problem,) = err.value.problems
    assert problem.field == "rl.rollout.think_prefix"
    assert problem.detail.startswith(": not a field of RolloutConfig (its fields: mode, max_turns, max_new_tokens")
    assert problem.detail.endswith("; it is rl.rollout.prompt.think_prefix")


def test_driver_sections_leave_out_what_the_driver_sets():
    keys = section(DriverConfig())
    assert "system_prompt" not in keys.prompt and "overview_visual" not in keys.prompt
    assert "final_answer_tokens" not in keys.protocol and "frames_response" in keys.protocol
    built = build(DriverConfig, keys, "driver")
    assert built == DriverConfig()  # the left-out fields keep the preset's values
    assert built.prompt.tool_layout == "object"
    # a subsection holding only some keys: the others are the preset's, not the class defaults
    keys.prompt = ml_collections.ConfigDict({"think_prefix": True})
    assert build(DriverConfig, keys, "driver").prompt == dataclasses.replace(PromptFormat.reference_eval(),
                                                                             think_prefix=True)


def test_record_settings_keep_the_flat_names_and_key_new_knobs_when_set():
    assert DriverConfig().record_settings() == FLAT_SETTINGS
    identity = {"checkpoint": {"random_init": "tiny", "seed": 0}, "model": {"preset": "tiny"}}
    base = provenance.producer_id(provenance.producer(identity, DriverConfig()))
    single = dataclasses.replace(DriverConfig(), prompt=dataclasses.replace(PromptFormat.reference_eval(),
                                                                             overview_sizing="single"))
    assert single.record_settings() == {**FLAT_SETTINGS, "overview_sizing": "single"}
    assert provenance.producer_id(provenance.producer(identity, single)) != base
    batched = dataclasses.replace(DriverConfig(), batch_size=2)
    assert provenance.producer_id(provenance.producer(identity, batched)) == base
    # a video item keys its layout: records of the layout with the outer vision pair are refused
    video = dataclasses.replace(DriverConfig(), prompt=dataclasses.replace(PromptFormat.reference_eval(),
                                                                            overview_visual="video"))
    assert video.record_settings()["video_item_layout"] == VIDEO_ITEM_LAYOUT
    earlier = {k: v for k, v in provenance.producer(identity, video).items()}
    earlier["settings"] = {k: v for k, v in earlier["settings"].items() if k != "video_item_layout"}
    assert provenance.differences(earlier, provenance.producer(identity, video)) == [
        f"settings.video_item_layout: '<absent>' -> {VIDEO_ITEM_LAYOUT!r}"]


@pytest.mark.parametrize("source,overview,crop", [((480, 854), 390, 72), ((720, 1280), None, 77),
                                                  ((240, 320), None, 70)])
def test_the_evaluation_sizes_frames_in_two_stages_as_the_reference(source, overview, crop):
    """The reference driver's frames: qwen-vl-utils' resize (factor 28) then the server's image
    processor's (>= 65,536 pixels, factor 32). Visual tokens per frame as the reference gets
    them (one resize gave an 854x480 overview 405, 16:9 crop frames 66, a 320x240 crop frame 80)."""
    from paravt_jax.video.frames import FACTOR, frame_sizes

    config = DriverConfig()
    prompt = driver.rollout_config(config, "mcq").prompt
    with driver.crop_dispatcher(config) as dispatcher:
        crops = dispatcher.config
    tokens = lambda size: (size[0] // FACTOR) * (size[1] // FACTOR)  # noqa: E731
    if overview is not None:
        assert tokens(frame_sizes(*source, prompt.overview_min_pixels, prompt.overview_max_pixels,
                                  prompt.overview_sizing)[-1]) == overview
    assert tokens(frame_sizes(*source, crops.min_pixels, crops.max_pixels, crops.sizing)[-1]) == crop
    # one resize stays an option
    single = dataclasses.replace(config, crop_sizing="single", crop_min_pixels=65536, crop_max_pixels=81920)
    with driver.crop_dispatcher(single) as dispatcher:
        assert dispatcher.config.sizing == "single"
