"""Orchestration without compiling a model program: the scripted sampler's interface against
the real one, the evaluation driver's records over scripted answers, and the RL step's
collect -> score -> batch -> advantages phases over scripted episodes whose rewards are
worked out by hand below."""
import dataclasses
import inspect
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from paravt_jax.agent.rollout import RolloutConfig
from paravt_jax.data.paravt_parquet import RLRow
from paravt_jax.data.synthetic import Event, write_video
from paravt_jax.episodes.episode_stats import summarize
from paravt_jax.eval import driver, prompts
from paravt_jax.eval import records as store
from paravt_jax.eval.datasets import EvalSample, LoadedBenchmark
from paravt_jax.eval.evaluator import evaluate
from paravt_jax.eval.held_out import HeldOutConfig
from paravt_jax.models.qwen3_vl import preset
from paravt_jax.models.qwen3_vl.hf_io import abstract_model
from paravt_jax.rl.advantages import AdvantageConfig
from paravt_jax.rl.trainer import RLConfig, RLStep, periodic_evaluators
from paravt_jax.sampling import Sampler, SamplingParams
from paravt_jax.text.inputs import encode_ids
from paravt_jax.text.tokenizer import train_tokenizer
from paravt_jax.train.step import TrainState
from support.scripted import ScriptedSampler

CALL = ('<tool_call>\n{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 8, '
        '"end_time": 16}}\n</tool_call>')
BROKEN_CALL = '<tool_call>\n{"name": "crop_video", "arguments": }\n</tool_call>'
LOOK = "I need a closer look at the circle.</think>\n" + CALL
# The colour question's four samples (each turn follows the forced "<think>\n" of think_prefix).
COLOUR = [
    [LOOK, "The crop shows it clearly.</think>\n<answer>blue</answer>"],  # right, with a tool round
    [LOOK, "The crop shows it clearly.</think>\n<answer>red</answer>"],  # wrong, with a tool round
    ["I will crop the video now.</think>\n" + BROKEN_CALL, "Still unsure about it.</think>"],  # malformed
    ["The circle is clearly visible.</think>\n<answer>blue</answer>"],  # right, the tools skipped
]
SHAPE = ["The shape is a circle.</think>\n<answer>circle</answer>"]  # every sample of the shape question


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("orchestration") / "circle.mp4")
    return write_video(path, 40.0, [Event(10.0, 14.0, "blue", "circle")], fps=4.0, height=96, width=128, seed=1)


@pytest.fixture(scope="module")
def tokenizer():
    texts = [t for script in COLOUR + [SHAPE] for t in script] + ["What colour is the circle? What shape is it?"]
    return train_tokenizer(texts * 10)


def parameters(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("method", ["generate", "extend", "start_turns", "decode_turns", "extend_turns", "admit_turns"])
def test_the_scripted_sampler_takes_the_real_samplers_parameters(method):
    """Same names, kinds and defaults: a change to the real sampler's calls breaks the fake here."""
    assert parameters(getattr(ScriptedSampler, method)) == parameters(getattr(Sampler, method))


def test_the_scripted_sampler_tracks_positions_and_budgets_as_the_real_one(tokenizer):
    """As tests/integration/test_sampler.py checks of the real sampler: a row's next chunk starts after its
    generated tokens, a row without a chunk generates nothing and keeps its place, a chunk
    elsewhere is refused; a turn cut at its budget has no stop token and is not finished."""
    stop = tokenizer.special.im_end
    sampling = SamplingParams(max_new_tokens=64, stop_ids=(stop,))
    prompts = [encode_ids([5, 6, 7], 0), encode_ids([8, 9], 0)]
    sampler = ScriptedSampler(tokenizer, [["The shape is a circle.", "blue"], ["red", "circle"]])
    first, state = sampler.generate(prompts, sampling=sampling, seed=4)
    assert first.tokens == [tokenizer.encode("The shape is a circle.") + [stop], tokenizer.encode("red") + [stop]]
    assert state.chunk_start.tolist() == [3 + len(first.tokens[0]), 2 + len(first.tokens[1])]
    second, state2 = sampler.extend(state, [encode_ids([1, 2], int(state.chunk_start[0])), None], sampling=sampling)
    assert second.tokens[1] == [] and second.lengths[1] == 0 and state2.chunk_start[1] == state.chunk_start[1]
    assert state2.chunk_start[0] == state.chunk_start[0] + 2 + len(second.tokens[0])
    with pytest.raises(ValueError, match=f"extend: row 1 chunk starts at position 0, expected {state2.chunk_start[1]}"):
        sampler.extend(state2, [None, encode_ids([1], 0)], sampling=sampling)
    with pytest.raises(ValueError, match="extend: 1 chunks for 2 rows"):
        sampler.extend(state2, [None], sampling=sampling)
    third, _ = sampler.extend(state2, [None, encode_ids([1], int(state2.chunk_start[1]))],
                              sampling=sampling.with_budget(1))
    assert third.tokens[1] == tokenizer.encode("circle")[:1] and not third.finished[1]
    assert [(c.kind, c.rows, c.max_new_tokens) for c in sampler.calls] == [("policy", 2, 64), ("extend", 1, 64),
                                                                           ("extend", 1, 1)]


def rl_script(prompt_text: str, sample: int):
    return COLOUR[sample] if "What colour" in prompt_text else SHAPE


# Rewards by hand (RewardConfig defaults: answer_suffix, format weight 1, token F1; the token
# anchor apart). acc and tool read the generated tokens, format and anchor the turns with their
# forced "<think>\n":
#   right + tools: acc 1; tool .1 (a parseable call) + .5 (acc > 0); format .2 (think) + .3 + .2
#                  (answer tags) + .3 (think before a parseable call) + .1 (balanced) -> 1 (clip)
#                  = 2.6; anchor .4 (closed substantive think) + .3 (answer) = .7
#   wrong + tools: acc 0 (F1 of red / blue); tool .1; format 1 = 1.1; anchor .7
#   malformed:     acc 0 (the text after </think>); tool 0 (the call is not JSON); format .2 + .1
#                  = .3; anchor .4 (no answer)
#   no tools:      acc 1; tool 0; format .2 + .3 + .2 + .1 = .8 -> 1.8; anchor .7
EXPECTED = {("colour", 0): (2.6, 0.7), ("colour", 1): (1.1, 0.7), ("colour", 2): (0.3, 0.4),
            ("colour", 3): (1.8, 0.7), **{("shape", g): (1.8, 0.7) for g in range(4)}}


def group_normalized(values):
    """Each group of four: (x - mean) / (unbiased std + 1e-5)."""
    groups = np.asarray(values, np.float64).reshape(-1, 4)
    mean, std = groups.mean(1, keepdims=True), groups.std(1, ddof=1, keepdims=True)
    return ((groups - mean) / (std + 1e-5)).reshape(-1)


def test_rl_step_collects_scores_and_batches_scripted_episodes(video, tokenizer, tmp_path):
    rows = [RLRow(0, "What colour is the circle?", video, "blue", "oe", {}),
            RLRow(1, "What shape is it?", video, "circle", "oe", {})]
    config = RLConfig(prompts_per_step=2, samples_per_prompt=4, nframes_gating=False, default_nframes=2, seed=3,
                      advantage=AdvantageConfig(kl_ctl=0.0, batch_norm=False))
    built = []

    def scripted(model, sampler_config):
        built.append(sampler_config)
        return ScriptedSampler(tokenizer, rl_script)

    # the model is abstract (shapes only): the phases below never run it
    phases = RLStep.build(abstract_model(preset("tiny")), tokenizer, rows, str(tmp_path), config,
                          make_sampler=scripted)
    state = TrainState(jnp.zeros((), jnp.int32), phases.step.params, None, jnp.zeros((), jnp.int32))
    rollouts, skipped = phases.collect(state, 5)
    assert skipped == [] and built == [phases.sampler_config] and len(rollouts) == 8
    questions = ["colour" if "colour" in r.episode.question else "shape" for r in rollouts]
    assert questions in (["colour"] * 4 + ["shape"] * 4, ["shape"] * 4 + ["colour"] * 4)  # prompt-major
    assert [r.sample for r in rollouts] == [0, 1, 2, 3] * 2
    calls = {r.sample: r.calls_per_turn for r, q in zip(rollouts, questions) if q == "colour"}
    assert calls == {0: (1,), 1: (1,), 2: (0,), 3: ()}

    scored = phases.score(rollouts, skipped)
    expected = np.array([EXPECTED[q, r.sample] for q, r in zip(questions, rollouts)])
    np.testing.assert_allclose(scored.seq_rewards, expected[:, 0], rtol=1e-6)
    np.testing.assert_allclose(scored.anchor_rewards, expected[:, 1], rtol=1e-6)
    metrics = summarize(scored.rollouts, scored.rewards)
    assert metrics["kappa"] == 2 / 8 and metrics["format_compliance"] == 7 / 8  # the malformed one fails
    assert metrics["calls_per_tool_turn"] == 1.0 and metrics["turns"] == 11 / 8
    assert metrics["reward"] == pytest.approx(13 / 8) and metrics["tool_reward"] == pytest.approx(0.7 / 8)
    assert metrics["nframes_2"] == 1.0 and metrics["kappa_at_2"] == 2 / 8

    data = phases.batch(scored)
    (batch,) = data.batches  # one micro-batch of the eight episodes
    generated = np.array([int(r.inputs.loss_mask.sum()) for r in rollouts])
    np.testing.assert_array_equal(batch.loss_mask.sum(1), generated)
    np.testing.assert_array_equal(batch.extras["behaviour_logp"][batch.loss_mask == 1], -0.5)
    assert batch.pixel_values is not None and batch.input_ids.shape[0] == 8

    advantages, adv_metrics = phases.advantages(scored, data, phases.reference_logprobs(data))
    # shaped: clip((r - 0.2) * 10, +-20) -> the right answer with tools clips (24 -> 20)
    sequence = group_normalized(np.clip((expected[:, 0] - 0.2) * 10, -20, 20))
    anchor = 0.5 * group_normalized(expected[:, 1])  # anchor_weight x the group-normalised anchor
    assert adv_metrics["reward/clipped_frac"] == pytest.approx(1 / 8)
    structural = data.packed.extras["structural_mask"] == 1
    loss = data.packed.loss_mask == 1
    for b in range(8):  # the shape group's rewards are all equal: its advantages are 0
        np.testing.assert_allclose(advantages[b][loss[b] & ~structural[b]], sequence[b], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(advantages[b][loss[b] & structural[b]], sequence[b] + anchor[b], rtol=1e-5,
                                   atol=1e-6)
        assert not advantages[b][~loss[b]].any()
    (part,) = data.plan.split(advantages)  # what the update hands the train step with the batch
    np.testing.assert_array_equal(batch.with_extras(advantages=part).extras["advantages"][batch.loss_mask == 1],
                                  advantages[loss])


def test_rl_collect_seeds_each_step_and_row(video, tokenizer, tmp_path):
    """collect's sampler calls: the step's seed (run seed * 100003 + step), every row its stream."""
    rows = [RLRow(0, "What colour is the circle?", video, "blue", "oe", {})]
    config = RLConfig(prompts_per_step=1, samples_per_prompt=4, nframes_gating=False, default_nframes=2, seed=3,
                      rollout=RolloutConfig(mode="frames"),
                      advantage=AdvantageConfig(kl_ctl=0.0))  # no reference copy of the abstract model
    sampler = ScriptedSampler(tokenizer, rl_script)
    phases = RLStep.build(abstract_model(preset("tiny")), tokenizer, rows, str(tmp_path), config,
                          make_sampler=lambda model, sampler_config: sampler)
    state = TrainState(jnp.zeros((), jnp.int32), phases.step.params, None, jnp.zeros((), jnp.int32))
    phases.collect(state, 7)
    seed = 3 * 100_003 + 7
    assert [(c.kind, c.seed, c.row_ids) for c in sampler.calls] == [("policy", seed, (0, 1, 2, 3)),
                                                                   ("extend", seed + 1, (0, 1, 2, 3))]
    assert [c.rows for c in sampler.calls] == [4, 3]  # the skipped-tools row sits the round out


def test_rl_step_owns_the_prompt_order(video, tokenizer, tmp_path):
    """RLStep says which rows a step takes (each epoch a seeded permutation of the 5 rows, 2 a
    step, so step 2 straddles two epochs), what a checkpoint records of that order, and
    collects exactly those rows' episodes."""
    rows = [RLRow(i, f"What colour is the circle? ({i})", video, "blue", "oe", {}) for i in range(5)]
    config = RLConfig(prompts_per_step=2, samples_per_prompt=1, nframes_gating=False, default_nframes=2, seed=3,
                      rollout=RolloutConfig(mode="frames"), advantage=AdvantageConfig(kl_ctl=0.0))
    phases = RLStep.build(abstract_model(preset("tiny")), tokenizer, rows, str(tmp_path), config,
                          make_sampler=lambda model, sampler_config: ScriptedSampler(tokenizer, rl_script))
    taken = [r.index for step in range(5) for r in phases.prompt_rows(step)]
    assert sorted(taken[:5]) == sorted(taken[5:]) == [0, 1, 2, 3, 4] and taken[:5] != [0, 1, 2, 3, 4]
    assert [phases.position(step) for step in (0, 3)] == [{"cursor": 0, "seed": 3}, {"cursor": 6, "seed": 3}]
    other = RLStep.build(abstract_model(preset("tiny")), tokenizer, rows, str(tmp_path / "other"),
                         dataclasses.replace(config, seed=4))
    assert [r.index for step in range(5) for r in other.prompt_rows(step)] != taken
    assert [e.episode_id for e in phases.episodes(2)] == [f"row{i}" for i in taken[4:6]]
    state = TrainState(jnp.zeros((), jnp.int32), phases.step.params, None, jnp.zeros((), jnp.int32))
    rollouts, _ = phases.collect(state, 2)
    assert [r.episode.episode_id for r in rollouts] == [f"row{i}" for i in taken[4:6]]


# ----------------------------------------------------------------------------- the eval driver
TWO_CALLS = "<think>two windows</think>" + "".join(
    "<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": start,
                                                                     "end_time": end}}) + "\n</tool_call>"
    for start, end in ((8, 12), (11, 15)))
# question -> (answer, question type, span, the model's turns); the last turn is the one scored
BENCHMARK = {
    "Q1 What colour is the circle? A. red B. blue": ("B", "mcq", None, [TWO_CALLS, "B"]),  # right, tools
    "Q2 What colour is the circle? A. red B. blue C. green": ("B", "mcq", None, ["<answer>C</answer>"]),  # wrong
    "Q3 Which shape is it? A. square B. circle": ("B", "mcq", None, ["no idea, sorry."]),  # no letter
    "Q4 When is the circle seen?": ("10.0-14.0", "tvg", (10.0, 14.0),
                                   [TWO_CALLS, "The event happens in the 9.0 - 14.0 seconds."]),
    "Q5 What colour is the circle?": ("blue", "oe", None, ["<answer>light blue</answer>"]),
}


def benchmark_of(video):
    samples = tuple(EvalSample("synthetic", f"s{i}", video, question, answer, kind == "mcq", kind, span=span)
                    for i, (question, (answer, kind, span, _)) in enumerate(BENCHMARK.items()))
    return LoadedBenchmark("synthetic", samples, (), ())


def eval_script(prompt_text: str, sample: int):
    (turns,) = [turns for question, (*_, turns) in BENCHMARK.items() if question in prompt_text]
    return turns


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_eval_driver_records_scripted_answers(video, tokenizer, tmp_path, dispatch):
    """Right, wrong and letterless MCQ answers, a grounding span and an open answer, scored as the
    reference scores them; a tool round runs both calls (parallel) or the first (sequential),
    then the forced final answer at its question type's budget; a second run resumes to nothing."""
    config = driver.DriverConfig(nframes=2, max_turns=1, max_parallel=2, batch_size=4, dispatch=dispatch)
    sampler = ScriptedSampler(tokenizer, eval_script)
    summary = driver.run_dataset(sampler, tokenizer, benchmark_of(video), config, str(tmp_path), log=lambda _: None)
    records = store.read_records([store.shard_path(str(tmp_path), "synthetic", 0, 1)])
    calls = 2 if dispatch == "parallel" else 1
    got = {i: (r["correct"], round(r["score"], 4), r["pred"], r["calls_per_turn"], r["turns"])
           for i, r in records.items()}
    assert got == {0: (True, 1.0, "B", [calls], 2), 1: (False, 0.0, "C", [], 1), 2: (False, 0.0, "n", [], 1),
                   3: (None, 0.8, "9.0-14.0", [calls], 2),  # IoU of 9-14 with 10-14
                   4: (None, round(2 / 3, 4), "light blue", [], 1)}  # token F1
    for i, kind in ((0, "mcq"), (3, "tvg")):  # a response per executed call, then the final-answer instruction
        response = records[i]["response"]
        assert response.count("<tool_response>") == calls and records[i]["tool_calls"] == calls
        assert response.index(prompts.final_instruction(kind)) > response.rindex("</tool_response>")
    # one batch per question type (mcq: 3 rows; tvg; oe); final answers after the tool rounds only
    policy = [c.rows for c in sampler.calls if c.kind == "policy"]
    finals = [c.max_new_tokens for c in sampler.calls if c.kind == "extend"]
    assert policy == [3, 1, 1] and finals == [config.mcq_answer_tokens, config.grounding_answer_tokens]
    assert summary["complete"] and summary["accuracy"] == pytest.approx(1 / 3)
    assert summary["avg_tool_calls"] == pytest.approx(2 * calls / 5)
    assert summary["by_question_type"]["tvg"] == {"miou": pytest.approx(0.8), "r@0.3": 1.0, "r@0.5": 1.0,
                                                      "r@0.7": 1.0, "count": 1}
    assert summary["mean_score"] == pytest.approx((1 + 0.8 + 2 / 3) / 5)
    assert os.path.isfile(tmp_path / "synthetic.json")
    again = ScriptedSampler(tokenizer, eval_script)
    resumed = driver.run_dataset(again, tokenizer, benchmark_of(video), config, str(tmp_path), log=lambda _: None)
    assert again.calls == [] and resumed["accuracy"] == summary["accuracy"]


def held_out_script(prompt_text: str, sample: int):
    """The held-out policy: with the tool offered, a crop then the answer; without, the answer."""
    if "crop_video" in prompt_text:
        return [LOOK, "The crop shows it clearly.</think>\n<answer>blue</answer>"]
    return ["The circle is clearly visible.</think>\n<answer>blue</answer>"]


def test_the_periodic_evaluation_runs_a_list_of_evaluators_on_one_sampler(video, tokenizer, tmp_path):
    """RL's periodic evaluation takes any evaluators (eval/evaluator.py): the held-out check and a
    benchmark under the reference protocol, both decoded by one sampler built for the
    evaluation; each outcome's metrics under its name, the held-out episodes in the eval log,
    the benchmark's records in a directory of the step with the step in their producer."""
    rows = [RLRow(0, "What colour is the circle?", video, "blue", "oe", {})]
    config = RLConfig(prompts_per_step=1, samples_per_prompt=2, nframes_gating=False, default_nframes=2,
                      eval_every=1, evals={"eval": HeldOutConfig(nframes=(2,), limit=1)}, log_episodes=2,
                      advantage=AdvantageConfig(kl_ctl=0.0, batch_norm=False))
    built = []

    def scripted(model, sampler_config):
        built.append(sampler_config)
        return ScriptedSampler(tokenizer, lambda text, g: (eval_script(text, g) if any(q in text for q in BENCHMARK)
                                                           else held_out_script(text, g)))

    phases = RLStep.build(abstract_model(preset("tiny")), tokenizer, rows, str(tmp_path), config,
                          make_sampler=scripted)
    state = TrainState(jnp.zeros((), jnp.int32), phases.step.params, None, jnp.zeros((), jnp.int32))
    benchmark = driver.BenchmarkEval(benchmark_of(video), driver.DriverConfig(nframes=2, max_turns=1, batch_size=4),
                                     str(tmp_path / "bench"), identity={"model": {"name": "scripted"}})
    evaluators = periodic_evaluators(config, rows) + [benchmark]
    metrics = phases.evaluate(state, evaluators, 3)

    assert built == [phases.sampler_config]  # one sampler for both evaluators: the rollouts' settings
    assert {k: v for k, v in metrics.items() if k.endswith(("/accuracy", "/calls_per_turn", "/samples"))} == {
        "eval_notools/accuracy": 1.0, "eval_notools/calls_per_turn": 0.0, "eval_notools/samples": 1,
        "eval_tools/accuracy": 1.0, "eval_tools/calls_per_turn": 1.0, "eval_tools/samples": 1}
    summary = json.loads((tmp_path / "bench" / "step_000003" / "synthetic.json").read_text())["summary"]
    assert metrics["synthetic/score"] == pytest.approx(summary["mean_score"]) == pytest.approx((1 + 0.8 + 2 / 3) / 5)
    assert metrics["synthetic/complete"] == 1.0 and metrics["synthetic/avg_tool_calls"] == summary["avg_tool_calls"]
    assert summary["producer"]["model"] == {"name": "scripted"} and summary["producer"]["policy"] == {"step": 3}
    logged = [json.loads(line) for line in open(tmp_path / "eval_episodes" / "step_000003.jsonl")]
    assert [(r["step"], r["stage"], r["tools"], r["nframes"], r["episode_id"]) for r in logged] == [
        (3, "periodic", False, 2, "eval0"), (3, "periodic", True, 2, "eval0")]
    assert not list(evaluate([], None, tokenizer, make_sampler=scripted)) and len(built) == 1  # nothing to run
