"""The planner's token counts against real rollouts: `run_rollouts` on the tiny model, with a
policy that makes every turn, call and summary use its whole budget, produces episodes whose
prompt, tool-response and total lengths the planner's workload predicts within 10%."""
import dataclasses
import json
import os

import numpy as np
import pytest

from paravt_jax.agent.dispatch import CropDispatcher
from paravt_jax.agent.rollout import Episode, run_rollouts
from paravt_jax.configs import paragrpo
from paravt_jax.data.synthetic import Event, write_video
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.planner import workload as W
from paravt_jax.run_config import build_run
from paravt_jax.sampling import Sampler, SamplerConfig
from paravt_jax.sampling.calls import SampleOutput
from paravt_jax.text.tokenizer import train_tokenizer

CORPUS = ["<think>I will look at two windows.</think> the answer is blue", "crop_video start_time end_time",
          '{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 1, "end_time": 5}}',
          "When does the blue circle appear in the video?"] * 20
QUESTION = "When does the blue circle appear in the video?"
SECONDS, FPS, HEIGHT, WIDTH = 40.0, 4.0, 96, 128
WINDOWS = ((1, 9), (10, 18), (20, 28))  # each >= max_frames seconds: every crop gets max_frames frames


class FullBudgetPolicy:
    """Test double for the policy around the real tiny-model Sampler: the sampler runs every
    prefill and decode (no stop ids, so each turn fills its budget and the cache positions are
    the real ones), then each main turn's tokens are replaced by a scripted turn of exactly
    that budget making valid parallel crop_video calls, and each summary by filler tokens
    (cut at its budget, as a long summary is)."""

    def __init__(self, sampler, tokenizer):
        self.sampler, self.tok = sampler, tokenizer
        self.filler = tokenizer.encode(" blue")
        assert len(self.filler) == 1
        calls = "\n".join("<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": {
            "start_time": s, "end_time": e}}) + "\n</tool_call>" for s, e in WINDOWS)
        self.head, self.tail = tokenizer.encode("<think>"), tokenizer.encode("</think>\n" + calls)
        self.main_calls = 0

    def _turn(self, budget):
        fill = budget - len(self.head) - len(self.tail)
        assert fill >= 0, f"a budget of {budget} tokens cannot hold the scripted calls"
        return self.head + self.filler * fill + self.tail

    def _replace(self, out, tokens_for):
        tokens = [tokens_for(len(t)) if len(t) else [] for t in out.tokens]
        return SampleOutput(tokens, out.logprobs, np.zeros(len(tokens), bool), np.array([len(t) for t in tokens]))

    def generate(self, prompts, num_samples=1, **kwargs):
        kwargs["sampling"] = dataclasses.replace(kwargs["sampling"], stop_ids=())
        out, state = self.sampler.generate(prompts, num_samples, **kwargs)
        if self.main_calls == 0:  # the episode's first turn; later generate calls are sub-agents
            self.main_calls += 1
            return self._replace(out, self._turn), state
        return self._replace(out, lambda n: self.filler * n), state

    def extend(self, state, chunks, **kwargs):
        kwargs["sampling"] = dataclasses.replace(kwargs["sampling"], stop_ids=())
        out, state = self.sampler.extend(state, chunks, **kwargs)
        return self._replace(out, self._turn), state

    def sample_queued(self, prompts, slots, **kwargs):  # sub-agents through refilled rows
        kwargs["sampling"] = dataclasses.replace(kwargs["sampling"], stop_ids=())
        return self._replace(self.sampler.sample_queued(prompts, slots, **kwargs), lambda n: self.filler * n)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("plan_rollouts") / "episode.mp4")
    video = write_video(path, SECONDS, [Event(10.0, 14.0, "blue", "circle")], fps=FPS, height=HEIGHT,
                        width=WIDTH, seed=1)
    return video, train_tokenizer(CORPUS), init_model(preset("tiny"), seed=0)


def rl_for(mode):
    c = paragrpo.get_config("tiny")
    c.rl.nframes_gating, c.rl.default_nframes = False, 4
    c.rl.rollout.mode, c.rl.rollout.max_turns = mode, 2
    c.rl.rollout.max_new_tokens, c.rl.rollout.subagent_max_tokens = 128, 24
    c.rl.dispatch.max_parallel, c.rl.dispatch.max_frames = len(WINDOWS), 4
    return build_run(c).rl


@pytest.mark.parametrize("mode", ["frames", "subagent"])
def test_planner_token_counts_match_full_budget_rollouts(setup, mode):
    video, tok, model = setup
    rl = rl_for(mode)
    assumptions = W.Assumptions(question_tokens=len(tok.encode(QUESTION)), video_seconds=SECONDS,
                                source_frame=(HEIGHT, WIDTH), source_fps=FPS, video_name=os.path.basename(video))
    work = W.workload(rl, model.config.vision, tok, assumptions)

    policy = FullBudgetPolicy(Sampler(model, SamplerConfig(min_chunk_bucket=64)), tok)
    episodes = [Episode(f"e{i}", QUESTION, "[10.0, 14.0]", "tvg", video, nframes=4) for i in range(2)]
    config = dataclasses.replace(rl.rollout, temperature=rl.step.temperature)
    with CropDispatcher(rl.dispatch) as dispatcher:
        rollouts, skipped = run_rollouts(policy, tok, episodes, 2, config, dispatcher)
    assert not skipped and len(rollouts) == 4
    rounds = rl.rollout.max_turns
    for r in rollouts:
        # every turn made all its calls: the rounds really happened, the last turn's calls unanswered
        assert r.calls_per_turn == (len(WINDOWS),) * (rounds + 1) and not r.errors
        generated = int(r.inputs.loss_mask.sum())
        assert generated == (rounds + 1) * rl.rollout.max_new_tokens
        responses = (r.inputs.length - r.prompt_length - generated) / rounds
        for planned, actual in ((work.prompt_tokens, r.prompt_length), (work.response_tokens, responses),
                                (work.sequence_tokens, r.inputs.length),
                                (work.patches_per_row, r.inputs.pixel_values.shape[0])):
            assert abs(planned / actual - 1) <= 0.10, (mode, planned, actual)
        if mode == "subagent":
            assert len(r.subagents) == rounds * len(WINDOWS)
            for s in r.subagents:
                prompt = s.inputs.length - rl.rollout.subagent_max_tokens
                assert abs(work.subagent_prompt_tokens / prompt - 1) <= 0.10
    assert work.crop_frames == 4 and work.overview_frames == 4 and work.calls_per_turn == len(WINDOWS)


class RecordingPolicy(FullBudgetPolicy):
    """FullBudgetPolicy that records the rows and width of each sub-agent call's prompt cache as
    the sampler allocated it, and the frames per row its shape padded the vision pass to."""

    def __init__(self, sampler, tokenizer):
        super().__init__(sampler, tokenizer)
        self.subagent_calls = []
        self.queued_calls, self.queued_caches = 0, []
        prefill = sampler.prompt_prefill

        def recorded(prompts, rows, width, frames_per_row):  # every prompt cache a queued call fills
            logits, cache = prefill(prompts, rows, width, frames_per_row)
            self.queued_caches.append((*cache.valid.shape, frames_per_row))
            return logits, cache
        self.recorded_prefill = recorded

    def sample_queued(self, prompts, slots, **kwargs):
        self.queued_calls += 1
        self.sampler.prompt_prefill = self.recorded_prefill
        try:
            return super().sample_queued(prompts, slots, **kwargs)
        finally:
            del self.sampler.prompt_prefill

    def generate(self, prompts, num_samples=1, **kwargs):
        sub_agent = self.main_calls > 0
        out, state = super().generate(prompts, num_samples, **kwargs)
        if sub_agent:
            rows, width = state.prefix.valid.shape
            self.subagent_calls.append((rows, width, kwargs["shape"].frames_per_row))
        return out, state


@pytest.mark.parametrize("batch,calls,rows,refill", [("episode_rows", 3, 4, False), ("round", 1, 12, False),
                                                     ("episode_rows", 3, 4, True)])
def test_planner_sampler_calls_match_the_rollouts(setup, batch, calls, rows, refill):
    """The planner's sub-agent calls are the rollout's under the trainer's fixed shapes
    (rl/shapes.py step_shapes): a round's sub-agent prompts (4 episode rows x 3 calls) go in
    calls of the step's 4 episode rows, or with rl.shapes.subagent_batch="round" in one call of
    exactly 12 rows (not a power of two) whose cache is exactly a fixed sub-agent width just above
    the prompt (not a power of two either); each call's cache as wide as the planner's; the main
    prompt cache as wide as the fixed prompt width. With rl.rollout.subagent_refill the 3 calls a
    round are one call's waves (Sampler.sample_queued), each wave's prompt cache the planner's."""
    from paravt_jax.rl.shapes import step_shapes

    video, tok, model = setup
    c = paragrpo.get_config("tiny")
    c.rl.nframes_gating, c.rl.default_nframes, c.rl.prompts_per_step, c.rl.samples_per_prompt = False, 4, 2, 2
    c.rl.rollout.mode, c.rl.rollout.max_turns = "subagent", 2
    c.rl.rollout.max_new_tokens, c.rl.rollout.subagent_max_tokens = 128, 24
    c.rl.dispatch.max_parallel, c.rl.dispatch.max_frames = len(WINDOWS), 4
    c.rl.shapes.subagent_batch = batch
    c.rl.rollout.subagent_refill = refill
    rl = build_run(c).rl
    assumptions = W.Assumptions(question_tokens=len(tok.encode(QUESTION)), video_seconds=SECONDS,
                                source_frame=(HEIGHT, WIDTH), source_fps=FPS, video_name=os.path.basename(video))
    work = W.workload(rl, model.config.vision, tok, assumptions)
    if batch == "round":  # a width 16 tokens above the planned prompt, a multiple of 16
        c.rl.shapes.subagent_width = -(-work.subagent_prompt_tokens // 16) * 16 + 16
        rl = build_run(c).rl
        work = W.workload(rl, model.config.vision, tok, assumptions)
    layout = W.sampler_layout(rl, work)
    if batch == "round":
        assert layout.subagent_prefix_slots == c.rl.shapes.subagent_width

    shapes = step_shapes(rl, rl.prompts_per_step)
    config = dataclasses.replace(rl.rollout, temperature=rl.step.temperature, prompt_shape=shapes.prompt,
                                 subagent_shape=shapes.subagent)
    sampler = Sampler(model, dataclasses.replace(rl.sampler, prefill_window=shapes.prefill_window,
                                                 extend_width=shapes.extend_width))
    policy = RecordingPolicy(sampler, tok)
    episodes = [Episode(f"e{i}", QUESTION, "[10.0, 14.0]", "tvg", video, nframes=4) for i in range(2)]
    with CropDispatcher(rl.dispatch) as dispatcher:
        rollouts, skipped = run_rollouts(policy, tok, episodes, 2, config, dispatcher)
    assert not skipped and len(rollouts) == 4
    rounds = rl.rollout.max_turns
    assert work.subagent_rows == 4 * len(WINDOWS)  # one prompt per call of every row, each round
    assert layout.subagent_rows == rows and layout.subagent_calls == calls and layout.subagent_refill == refill
    if refill:  # one refilled call a round, its waves' prompt caches the planner's calls'
        assert policy.queued_calls == rounds and not policy.subagent_calls
        assert len(policy.queued_caches) == rounds * calls  # at full budget a wave ends at once
        assert set(policy.queued_caches) == {(rows, layout.subagent_prefix_slots, layout.subagent_frames)}
    else:
        assert len(policy.subagent_calls) == rounds * layout.subagent_calls == rounds * calls
    for allocated, width, frames in policy.subagent_calls:
        assert (allocated, width, frames) == (rows, layout.subagent_prefix_slots, layout.subagent_frames)
    assert layout.prefix_slots == shapes.prompt.width and layout.extend_width == shapes.extend_width


def test_a_turn_refilled_rollout_is_refused(setup):
    """rl.rollout.turn_refill runs other programs (a refilled decode, extends of one group of every
    row) than the ones the planner compiles: planning it is an error that names the field."""
    video, tok, model = setup
    c = paragrpo.get_config("tiny")
    c.rl.rollout.turn_refill = True
    rl = build_run(c).rl
    work = W.workload(rl, model.config.vision, tok, W.Assumptions(video_name=os.path.basename(video)))
    with pytest.raises(W.PlanError, match="rl.rollout.turn_refill=True"):
        W.sampler_layout(rl, work)
