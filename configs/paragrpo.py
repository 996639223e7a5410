"""PARA-GRPO: cold-start SFT then RL with the token-masked anchor and nFrames gating.

    paravt-jax run   --config=configs/paragrpo.py:tiny --workdir=runs/tiny
    paravt-jax train --config=configs/paragrpo.py:qwen3vl_8b --config.model.checkpoint=/data/Qwen3-VL-8B

Presets: tiny (the built-in default; minutes on a laptop CPU), qwen3vl_2b, qwen3vl_8b (the
reference hyper-parameters of paragrpo_8b.yaml).
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import base  # noqa: E402


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    preset = arg or "tiny"
    c = base.get_config({"tiny": "tiny", "qwen3vl_2b": "2b", "qwen3vl_8b": "8b"}[preset])
    c.preset = preset
    c.workdir = ""  # where checkpoints and metrics go (--workdir overrides)

    c.sft = ml_collections.ConfigDict()
    c.sft.steps = 160  # optimizer steps of cold-start SFT (0 = skip)
    c.sft.batch_size = 8  # sequences per step
    c.sft.micro_batches = 1  # gradient accumulation
    c.sft.learning_rate = 3e-3
    c.sft.nframes = 8  # overview frames per SFT example
    c.sft.max_pixels = 96 * 160  # per frame

    c.rl = ml_collections.ConfigDict()
    c.rl.steps = 4  # PARA-GRPO steps
    c.rl.prompts_per_step = 2  # B prompts per step
    c.rl.samples_per_prompt = 4  # G rollouts per prompt
    c.rl.micro_batches = 1
    c.rl.learning_rate = 1e-4
    c.rl.weight_decay = 0.01
    c.rl.grad_clip = 1.0
    c.rl.temperature = 0.7  # rollout temperature == log-prob temperature
    # reference-policy log-prob temperature for the KL term (0: same as temperature)
    c.rl.reference_temperature = 0.0
    c.rl.max_turns = 2  # tool rounds per episode
    c.rl.max_new_tokens = 256  # per assistant turn
    c.rl.max_parallel = 5  # crop calls executed per turn
    c.rl.mode = "subagent"  # subagent | frames | sequential
    c.rl.subagent_max_tokens = 64
    c.rl.think_prefix = True
    c.rl.nframes_gating = True  # K ~ U{4,8,16,32,64} per prompt
    c.rl.default_nframes = 0  # K when gating is off; 0: overview_fps, at most overview_max_frames (reference)
    c.rl.overview_fps = 1.0
    c.rl.overview_max_frames = 64
    c.rl.overview_max_pixels = 96 * 160  # per overview frame
    c.rl.anchor_mode = "token"  # token (masked anchor) | sequence (as released)
    c.rl.anchor_weight = 0.5
    c.rl.format_weight = 1.0
    c.rl.answer_suffix = True
    c.rl.reward_mode = "f1"  # f1 | exact | llm
    # turns: format/anchor rewards read each assistant turn with its forced <think> prefix;
    # released: generated tokens only, as the released code (format/anchor inert under the prefix)
    c.rl.reward_text = "turns"  # turns | released | completion
    c.rl.kl_ctl = 0.01
    c.rl.eps_clip = 0.2
    c.rl.behaviour_cap = 5.0
    c.rl.checkpoint_every = 0
    c.rl.eval_every = 2  # held-out greedy evaluation (with and without tools) every N RL steps

    c.generate = ml_collections.ConfigDict()
    c.generate.question = ""  # empty: the first held-out question
    c.generate.video = ""  # a local video path; empty: the first held-out video
    c.generate.nframes = 16

    c.eval = ml_collections.ConfigDict()
    c.eval.nframes = (4, 64)  # K values evaluated
    c.eval.max_new_tokens = 256
    c.eval.max_turns = 2
    c.eval.limit = 4  # held-out rows (0 = all)

    if preset == "qwen3vl_8b":  # reference recipe (paragrpo_8b.yaml)
        c.sft.steps, c.sft.learning_rate = 500, 1e-5
        c.rl.steps, c.rl.prompts_per_step, c.rl.samples_per_prompt = 54, 7, 8
        c.rl.learning_rate, c.rl.max_turns, c.rl.max_new_tokens = 2e-6, 3, 2048
        c.rl.subagent_max_tokens, c.rl.overview_max_pixels = 512, 50176
        c.rl.reference_temperature = 1.0  # the reference recipe's (AReaL default), see docs/deviations.md
        c.model.param_dtype = c.model.dtype = "bfloat16"
        c.model.remat = True
        c.eval.max_new_tokens, c.eval.max_turns, c.eval.limit = 2048, 3, 0
    elif preset == "qwen3vl_2b":
        c.sft.steps, c.sft.learning_rate = 500, 2e-5
        c.rl.steps, c.rl.prompts_per_step, c.rl.samples_per_prompt = 100, 8, 8
        c.rl.learning_rate, c.rl.max_turns, c.rl.max_new_tokens = 4e-6, 3, 2048
        c.rl.subagent_max_tokens, c.rl.overview_max_pixels = 512, 50176
        c.model.param_dtype = c.model.dtype = "bfloat16"
        c.model.remat = True
        c.eval.max_new_tokens, c.eval.max_turns, c.eval.limit = 2048, 3, 0
    return c
