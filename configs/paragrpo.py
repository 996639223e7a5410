"""PARA-GRPO: cold-start SFT then RL with the token-masked anchor and nFrames gating.

    paravt-jax run   --config=configs/paragrpo.py:tiny --workdir=runs/tiny
    paravt-jax train --config=configs/paragrpo.py:qwen3vl_8b --config.model.checkpoint=/data/Qwen3-VL-8B

Presets: toy (the main job's built-in default, `bash launch/local.sh`: the learnable `events`
task of paravt_jax/data/events.py with the `toy` model, docs/toy_task.md; 9.5-11.5 minutes on a
2-core CPU), tiny (the `shapes` set and the 2-layer `tiny` model; every stage in a few minutes,
nothing learned), qwen3vl_2b, qwen3vl_8b
(the reference hyper-parameters of paragrpo_8b.yaml), qwen3vl_32b (the same recipe on the
Qwen3-VL-32B shapes: planned for v5p-64 and gpu16_tp2-h200, docs/scale-out.md), and the 8B recipe
with asynchronous rollouts on devices of their own: qwen3vl_8b_async_gpu8_h200 (one host of 8
H200s) and qwen3vl_8b_async_v5p16 (ASYNC_PRESETS; docs/scale-out.md).
"""

import ml_collections

from paravt_jax.config import section
from paravt_jax.configs import base
from paravt_jax.eval import registry
from paravt_jax.infra import meshes
from paravt_jax.rl.trainer import RLConfig
from paravt_jax.sft.trainer import SFTConfig

# Asynchronous variants of the 8B recipe (docs/scale-out.md): up to 2 policy versions stale (the
# reference's max_head_offpolicyness), the rollouts where the planner's estimate puts them
# (`paravt-jax plan --config=configs/paragrpo.py:<preset> --mesh=<its mesh preset>`): on the
# training devices (0) on both meshes, where an even split (4 + 4) is 0.54x as fast, the
# recipe's decode bounding the step. On 80 GB H100s neither fits with 10% headroom (the shared
# devices hold a trainer's step and a sampler's caches at once): they stay synchronous.
# A non-zero count splits: each host samples on its share (tensor parallel), the others train
# (FSDP, a micro-batch of one row per training device).
# preset -> (the mesh preset it is planned for, mesh.rollout_devices)
ASYNC_PRESETS = {"qwen3vl_8b_async_gpu8_h200": ("gpu8-h200", 0), "qwen3vl_8b_async_v5p16": ("v5p-16", 0)}
# The released cold-start SFT recipe (the reference's paravt/sft/configs/qwen3vl_8b.yaml, run
# by lmms-engine on 8 GPUs), field by field; docs/deviations.md "Cold-start SFT" lists what
# differs. The reference ships no other SFT recipe: the 2B and 32B presets take this one as is.
RELEASED_SFT = {
    "steps": 1500,  # trainer_args.max_steps
    # 32 packs a step (per_device_train_batch_size 4 x 8 GPUs) of examples packed in order into
    # 8,192 tokens; 1,500 steps are one pass over the 96.5k-example mix of the data manifest,
    # about 2 examples a pack: 64 examples a step (our steps draw examples, not packs)
    "batch_size": 64,
    "train_width": 8192,  # dataset_config.packing_length: the packed rows' width
    # 4 packed rows a device per forward/backward on 8 devices (gradient_accumulation_steps 1)
    "max_tokens_per_micro_batch": 32 * 8192,
    "filter_overlong": True,  # dataset_config.filter_overlong: examples over 8,192 tokens dropped
    "frame_sampling": "fps", "fps": 1.0, "max_frames": 64,  # video_sampling_strategy fps, fps 1, video_max_frames 64
    # video_min_pixels / video_max_pixels through qwen-vl-utils (factor 28), then the Qwen3-VL
    # video processor; every video a video item (Qwen3VLIterableDataset)
    "min_pixels": 784, "max_pixels": 50176, "sizing": "two_stage", "visual": "video",
    "checkpoint_every": 100,  # save_steps
}
RELEASED_SFT_OPTIMIZER = {  # adamw_torch_fused with the HF Trainer's defaults for the rest
    "name": "adamw", "learning_rate": 2e-5, "weight_decay": 0.01, "b1": 0.9, "b2": 0.999, "eps": 1e-8,
    "grad_clip": 1.0,  # max_grad_norm
    "schedule": "cosine", "total_steps": 1500, "warmup_steps": 75,  # lr_scheduler_type cosine, warmup_ratio 0.05
    "frozen": (),  # every parameter trained
}
MODEL_PRESETS = {"tiny": "tiny", "toy": "toy", "qwen3vl_2b": "2b", "qwen3vl_8b": "8b",
                 "qwen3vl_32b": "32b", **{name: "8b" for name in ASYNC_PRESETS}}  # preset -> model preset


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    preset = arg or "tiny"
    if preset not in MODEL_PRESETS:
        raise ValueError(f"configs/paragrpo.py: unknown preset {preset!r}; choose from {sorted(MODEL_PRESETS)}")
    c = base.get_config(MODEL_PRESETS[preset])
    c.preset = preset
    c.workdir = ""  # where checkpoints and metrics go (--workdir overrides)

    # Sections have the shape of the dataclasses they build (paravt_jax.config.section): every
    # field is a key, set here where the recipe differs from the dataclass default.
    c.sft = section(SFTConfig())  # cold-start SFT
    c.sft.steps = 160  # optimizer steps (0 = skip)
    c.sft.batch_size = 8  # sequences per step
    c.sft.micro_batches = 1  # gradient accumulation
    c.sft.nframes = 8  # overview frames per SFT example
    c.sft.max_pixels = 96 * 160  # per frame
    c.sft.optimizer.learning_rate = 3e-3
    c.sft.optimizer.weight_decay = 0.0

    c.rl = section(RLConfig())  # PARA-GRPO: B prompts x G rollouts per step
    c.rl.steps = 4
    c.rl.prompts_per_step = 2  # B
    c.rl.samples_per_prompt = 4  # G
    c.rl.nframes_gating = True  # K ~ U{nframes_choices} per prompt; default_nframes when off
    # every N RL steps, the evaluations of rl.evals (by name, each with its type: eval/registry.py);
    # the default: the greedy held-out check `eval` with and without tools (eval_tools/..., eval_notools/...)
    c.rl.eval_every = 2
    c.rl.log_episodes = 4  # sampled episodes kept per step: rl/episodes/step_XXXXXX.jsonl (`paravt-jax view`)
    c.rl.optimizer.learning_rate = 1e-4
    c.rl.step.temperature = 0.7  # the log-prob temperature; rollouts sample at it too
    c.rl.rollout.mode = "subagent"  # subagent | frames | sequential
    c.rl.rollout.max_turns = 2  # tool rounds per episode
    c.rl.rollout.max_new_tokens = 256  # per assistant turn
    c.rl.rollout.subagent_max_tokens = 64
    c.rl.rollout.prompt.overview_max_pixels = 96 * 160  # per overview frame
    c.rl.dispatch.max_pixels = 96 * 160  # per crop frame
    # one resize per frame (single) for the toy presets' small frames: the reference's two-stage
    # sizing (qwen-vl-utils, then the processor's >= 65,536 pixels) would make each frame 256x256
    c.rl.rollout.prompt.overview_sizing = c.rl.dispatch.sizing = "single"
    c.rl.dispatch.max_parallel = 5  # crop calls executed per turn
    c.rl.advantage.anchor_mode = "token"  # token (masked anchor) | sequence (as released)
    c.rl.advantage.anchor_weight = 0.5
    c.rl.reward.mode = "f1"  # f1 | exact | llm (judge from PARAVT_JUDGE_* environment variables)

    c.generate = ml_collections.ConfigDict()
    c.generate.question = ""  # empty: the first held-out question
    c.generate.video = ""  # a local video path; empty: the first held-out video
    c.generate.nframes = 16

    # the main job's evaluations by name, each with its type (eval/registry.py): the held-out table
    # with and without tools at each K of nframes after the last phase (and of after_sft on the cold start)
    c.evals = registry.section(registry.MAIN_JOB)

    if preset == "tiny":  # the shapes task's 64x160 frames are 10 tokens: a K = 64 prompt is 1,626
        c.rl.shapes.prompt_width, c.rl.shapes.subagent_width, c.rl.shapes.train_width = 2048, 512, 2048
    if preset == "toy":  # the events toy task: answers only in short events the crops catch
        c.data.task = "events"
        c.data.num_train, c.data.num_eval, c.data.durations = 384, 48, (48.0,)
        # SFT trajectories' tool responses: subagent (summaries, plus a sub-agent example of one
        # crop per question: the rollouts' and the evaluation's mode here) and/or frames
        c.data.sft_modes = ("subagent",)
        # 450 SFT steps on overviews of K drawn per row from (4, 8, 16, 64), where a K = 64 row
        # answers directly (the shortcut) 85% of the time, then 80 RL steps at 6e-5 with K drawn
        # from (4, 32, 64): the recipe chosen by docs/toy_task.md's rule (its sixteenth round, WS)
        c.sft.steps, c.sft.batch_size, c.sft.nframes = 450, 16, 4
        c.sft.nframes_choices = (4, 8, 16, 4, 8, 16, 64)  # K = 64 one row in seven
        c.sft.direct_from_nframes, c.sft.direct_share = 64, 0.85
        c.sft.first_max_nframes = 16  # the first phase's rows at K <= 16
        c.sft.max_tokens_per_micro_batch = 2048  # packed rows
        # one compiled step for the whole SFT: every micro-batch 2 rows of 1,024 tokens (a K = 64
        # example is about 960), its vision pass padded to 128 frames (more uses its own bucket,
        # a compile the loop reports)
        c.sft.train_width, c.sft.train_frames = 1024, 128
        # a step's 3-4 micro-batch passes at once on host threads: one of the toy's small programs
        # leaves a core idle much of its time; the same bits, SFT steps 1.07-1.26x faster
        # (docs/benchmarks.md#micro-batch-passes-at-once). The RL step's larger passes fill both
        # cores already: rl.concurrent_micro_batches stays 1 (4 gave 1.01x for 7% more CPU)
        c.sft.concurrent_micro_batches = 4
        # 2e-3 after 20 warm-up steps, constant to step 300, then linear to 0 at step 450: the
        # mixed phase's rows learned at the full rate, its last third annealed
        c.sft.optimizer.learning_rate = 2e-3
        c.sft.optimizer.warmup_steps = 20
        c.sft.optimizer.schedule, c.sft.optimizer.total_steps, c.sft.optimizer.decay_steps = "wsd", 450, 150
        # main trajectories alone first: beside the sub-agent and tool-free rows from the start,
        # the final turn's look-up of the asked shape in the summaries is not learned
        c.sft.first_steps, c.sft.first_kinds = 150, ("main_subagent",)
        # the random vision tower's features keep the colours; trained along, it collapses to
        # one vector for every image token before the text tower learns to read them
        c.sft.optimizer.frozen = c.rl.optimizer.frozen = ("visual",)
        # so each SFT example's frames are encoded once and the steps feed the kept features
        # (sft/vision_cache.py): the same bits here (bench/sft_vision_cache.py), a few percent
        # faster, 30 MiB of features kept instead of 473 MiB of pixels (docs/toy_task.md)
        c.sft.cache_vision_features = True
        c.rl.rollout.mode = c.evals.held_out.mode = "subagent"
        c.rl.rollout.subagent_max_tokens = 32  # a toy summary is about 9 tokens
        # 80 RL steps (64, the eighteenth round of docs/toy_task.md, left seed 2's K = 4 0.042
        # below its cold start)
        c.rl.steps, c.rl.prompts_per_step = 80, 4  # 4 prompts x 4 samples a step
        # a third of the prompts at the dense overview where the cold start skips the tool, a third
        # at K = 32 (where the samples call first), a third at K = 4
        c.rl.nframes_choices, c.rl.optimizer.learning_rate = (4, 32, 64), 6e-5
        c.rl.tool_free_share = 0.25  # a quarter of the prompts posed as the tool-free evaluation's
        # no held-out checks during RL (the tables after it are the comparison; the five checks
        # cost ~2 minutes of the 15): --config.rl.eval_every=16 puts them back, 16 questions at K = 64
        c.rl.eval_every, c.rl.evals.eval.limit, c.rl.evals.eval.nframes = 0, 16, (64,)
        c.evals.held_out.limit, c.evals.held_out.max_new_tokens = 0, 160  # every held-out question
        c.evals.held_out.after_sft = (4, 64)  # the cold start's table too: what RL starts from
        # two settings at a time: their compiles and small decodes fill both cores (the same
        # tables; a process evaluating a cold start, its programs compiled: 53 s instead of 64)
        c.evals.held_out.concurrent = 2
        # the toy's 64x96 frames are 6 tokens: a K = 64 prompt is 930 tokens, an episode at
        # most ~1.7k, a 16-frame crop's sub-agent prompt 273 (rl/shapes.py's bounds assume
        # full-size frames): sub-agent calls of 288 tokens a row, the tool responses in pieces of
        # 128, and a call's prompts packed several to a row (the first turn's 4 and every
        # sub-agent call: only their own tokens computed), and the decode's bounded read in blocks
        # of 256 (a turn fills a few dozen slots of a 512 block): the rollout 1.90 -> 1.02 s a step
        # (docs/toy_task.md, the twentieth and twenty-first rounds)
        c.rl.shapes.prompt_width, c.rl.shapes.subagent_width, c.rl.shapes.train_width = 1024, 288, 2048
        c.rl.shapes.extend_width = 128
        c.rl.sampler.prompt_packing, c.rl.sampler.decode_block = True, 256
        # episodes packed into rows of 2,048 tokens, 2 rows a micro-batch (the 16 episodes of a
        # step fill 4-8 rows, not 16: a step of 5 rows computes 6 row slots, not 8 as at 4 rows a
        # micro-batch); a micro-batch's frames padded to 256. bench/rl_step.py: 5.32 -> 4.72 s a
        # step (docs/benchmarks.md#the-rl-step)
        c.rl.max_tokens_per_micro_batch, c.rl.shapes.train_frames = 2 * 2048, 256
        # the 4 samples of a prompt share it in the packed rows (a K = 64 prompt is ~930 of an
        # episode's ~1,100 tokens): the same loss over ~7,000 fewer tokens a step, the RL step
        # 5.28 -> 3.17 s (docs/toy_task.md, the nineteenth round)
        c.rl.share_prompts = True
        # a packed row holds ~2-4 episodes: 128-token attention blocks skip more of the other
        # episodes' keys than 512 (one toy training micro-batch's gradients ~3x faster)
        c.model.attention_block = 128
    elif preset in ("qwen3vl_8b", "qwen3vl_32b", *ASYNC_PRESETS):  # the reference recipe (paragrpo_8b.yaml)
        released_sft(c.sft)
        c.rl.steps, c.rl.prompts_per_step, c.rl.samples_per_prompt = 54, 7, 8
        c.rl.optimizer.learning_rate, c.rl.rollout.max_turns, c.rl.rollout.max_new_tokens = 2e-6, 3, 2048
        c.rl.rollout.subagent_max_tokens, c.rl.rollout.prompt.overview_max_pixels = 512, 50176
        c.rl.dispatch.max_pixels = 50176
        # the reference's frames: qwen-vl-utils to [784, 50,176] pixels, then the processor's resize
        c.rl.rollout.prompt.overview_sizing = c.rl.dispatch.sizing = "two_stage"
        c.rl.step.reference_temperature = 1.0  # the reference recipe's (AReaL default), see docs/deviations.md
        # the reference workflow's parser: one malformed call block drops the turn's calls, ending the episode
        c.rl.rollout.protocol.malformed = "reference"
        # 8 full-budget episodes (8 x 22,528 tokens with the reference's frame sizes) per
        # micro-batch: one row per device on the 8-device meshes (gpu8, v5p-16); docs/scale-out.md
        # says why 8 (batch sharding). A mesh with more batch devices rounds it up to one row
        # each (32 on v5p-64 for the 32B).
        c.rl.max_tokens_per_micro_batch = 8 * 22528
        c.rl.shapes.train_width = 22528  # the episode budget the planner packs (docs/scale-out.md)
        # a sub-agent prompt of 16 two-stage crop frames of a 1280x720 video is 1,422 tokens (the
        # planner's count; rl/shapes.py's derived bound counts one resize's 49 tokens a frame):
        # prefilled 1,536 wide, a quarter less padded compute than its bucket (2,048); a longer
        # prompt (another aspect ratio) takes its own bucket, a compile the loop reports
        c.rl.shapes.subagent_width = 1536
        # a tool round's sub-agent prompts (up to 64 rows x 5 calls) in one sampler call: each
        # summary token reads the weights once, not once per call (docs/scale-out.md)
        c.rl.shapes.subagent_batch = "round"
        c.model.param_dtype = c.model.dtype = "bfloat16"
        c.model.remat = True
        c.evals.held_out.max_new_tokens, c.evals.held_out.max_turns, c.evals.held_out.limit = 2048, 3, 0
        if preset in ASYNC_PRESETS:  # the training mesh: fsdp over the devices the rollouts leave
            mesh_name, c.mesh.rollout_devices = ASYNC_PRESETS[preset]
            c.mesh.rollout_axes = "tensor=-1"
            train_devices = meshes.get_mesh(mesh_name)["devices"] - c.mesh.rollout_devices
            c.rl.max_tokens_per_micro_batch = train_devices * 22528  # one row per training device
            c.rl.max_staleness = 2
    elif preset == "qwen3vl_2b":
        released_sft(c.sft)  # no 2B SFT recipe is released: the 8B's
        c.rl.steps, c.rl.prompts_per_step, c.rl.samples_per_prompt = 100, 8, 8
        c.rl.optimizer.learning_rate, c.rl.rollout.max_turns, c.rl.rollout.max_new_tokens = 4e-6, 3, 2048
        c.rl.rollout.subagent_max_tokens, c.rl.rollout.prompt.overview_max_pixels = 512, 50176
        c.rl.dispatch.max_pixels = 50176
        c.rl.rollout.prompt.overview_sizing = c.rl.dispatch.sizing = "two_stage"
        c.rl.shapes.subagent_width = 1536  # as qwen3vl_8b: 16 two-stage crop frames
        c.rl.shapes.subagent_batch = "round"  # as qwen3vl_8b
        c.rl.rollout.protocol.malformed = "reference"  # as qwen3vl_8b
        c.model.param_dtype = c.model.dtype = "bfloat16"
        c.model.remat = True
        c.evals.held_out.max_new_tokens, c.evals.held_out.max_turns, c.evals.held_out.limit = 2048, 3, 0
    return c


def released_sft(sft: ml_collections.ConfigDict) -> None:
    """Sets the `sft` section to the released cold-start recipe (RELEASED_SFT)."""
    sft.update(RELEASED_SFT)
    sft.optimizer.update(RELEASED_SFT_OPTIMIZER)
