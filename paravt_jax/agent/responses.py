"""What a tool round reads back to the model: each crop's answer as the rollout's tool response
carries it. Sub-agent mode: the sub-agent's prompt (the crop's frames and the segment
instruction) and its summary's text; frames mode: the crop's frames themselves, in the
timestamped layout (the RL workflow) or the images_first one (the evaluation driver). A text
tool's answer is its own response in every mode."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paravt_jax.agent.dispatch import CropResult
from paravt_jax.agent.records import SubTrajectory
from paravt_jax.agent.tools import lenient_window
from paravt_jax.sampling.calls import PromptShape
from paravt_jax.sampling.params import SamplingParams
from paravt_jax.sampling.sampler import Sampler
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode, encode_ids
from paravt_jax.text.tokenizer import Tokenizer
from paravt_jax.video.reader import Clip


def subagent_prompt(clip: Clip, start: float, end: float, tokenizer: Tokenizer) -> ModelInputs:
    """One sub-agent's prompt: the crop's bare frames, then the segment instruction."""
    content = tuple(chat.frames_as_images(clip.frames, None)) + (chat.Text(chat.segment_instruction(start, end)),)
    return encode(chat.render([chat.Message("user", content)], add_generation_prompt=True), tokenizer)


def summary_text(tokens: Sequence[int], finished: bool, tokenizer: Tokenizer) -> str:
    """A sub-agent's answer as its tool response shows it: the decoded summary, and a summary
    that reached its budget without the stop token marked " [truncated]" (the text the
    reference keeps of a longer summary: its first tokens, with the marker)."""
    body = [t for t in tokens if t != tokenizer.special.im_end]
    return tokenizer.decode(body, skip_special_tokens=True).strip() + ("" if finished else " [truncated]")


def subagent_prompts(results: list[CropResult], tokenizer: Tokenizer) -> dict[int, ModelInputs]:
    """The sub-agent prompt of every result answered with frames (read, with a clip), by index."""
    return {i: subagent_prompt(r.clip, r.request.start, r.request.end, tokenizer)
            for i, r in enumerate(results) if r.ok and r.clip is not None}


def subagent_answers(results: list[CropResult], prompts: dict[int, ModelInputs], summaries: dict[int, tuple],
                     tokenizer: Tokenizer) -> tuple[list, list[SubTrajectory | None]]:
    """Each result's response text and, for a call answered with frames, the sub-agent's
    trajectory: `summaries[i]` = (tokens, log-probs, finished) of prompts[i]'s summary; an
    error's text, a text tool's answer, for the others."""
    texts: list = [None] * len(results)
    trajectories: list[SubTrajectory | None] = [None] * len(results)
    for i, r in enumerate(results):
        if i in prompts:
            tokens, logprobs, finished = summaries[i]
            texts[i] = summary_text(tokens, bool(finished), tokenizer)
            seq = prompts[i].extend(encode_ids(tokens, prompts[i].next_position, trainable=True))
            trajectories[i] = SubTrajectory(r.task.row, seq,
                                            np.concatenate([np.zeros(prompts[i].length, np.float32), logprobs]))
        elif not r.ok:
            texts[i] = f"Error: {r.error}"
        else:
            texts[i] = r.text
    return texts, trajectories


def subagent_responses(results: list[CropResult], sampler: Sampler, tokenizer: Tokenizer,
                       sampling: SamplingParams, shape: PromptShape, seed: int,
                       stream_ids: Sequence[int] | None = None,
                       refill: bool = False) -> tuple[list, list[SubTrajectory | None]]:
    """Sub-agent mode: each result's response text and, for a call answered with frames, the
    sub-agent's trajectory (`subagent_answers`). All sub-agent prompts of the round go through
    one batched sampler call (same weights), or, when shape.rows is set, rows of that many: with
    `refill` one call whose rows take the next waiting prompt as their summary ends
    (Sampler.sample_queued), else calls of shape.rows prompts one after another. stream_ids[i]:
    the random stream of results[i]'s summary (default: its place in `results`), so the
    summaries do not depend on how the calls split them."""
    prompts = subagent_prompts(results, tokenizer)
    ok = sorted(prompts)
    streams = list(range(len(results))) if stream_ids is None else list(stream_ids)
    summaries = summarize(sampler, [prompts[i] for i in ok], [streams[i] for i in ok], sampling, shape, seed, refill)
    return subagent_answers(results, prompts, dict(zip(ok, summaries)), tokenizer)


def summarize(sampler: Sampler, prompts: list[ModelInputs], streams: list[int], sampling: SamplingParams,
              shape: PromptShape, seed: int, refill: bool = False) -> list[tuple]:
    """Each sub-agent prompt's summary, (tokens, log-probs, finished), `streams[i]` its random
    stream: one batched sampler call, or rows of shape.rows (see subagent_responses)."""
    size = shape.rows or max(len(prompts), 1)
    queued = refill and len(prompts) > size
    per_call = len(prompts) if queued else size  # one refilled call takes every prompt
    summaries = []
    for start in range(0, len(prompts), per_call):
        part, row_ids = prompts[start:start + per_call], streams[start:start + per_call]
        if queued:
            out = sampler.sample_queued(part, size, sampling=sampling, seed=seed, row_ids=row_ids, shape=shape)
        else:
            out, _ = sampler.generate(part, sampling=sampling, seed=seed, row_ids=row_ids, shape=shape)
        summaries += [(out.tokens[j], out.logprobs[j], out.finished[j]) for j in range(len(part))]
    return summaries


def answer_caption(result: CropResult) -> str:
    """A frames-mode answer as the episode log keeps it: the frame count, the text tool's
    answer, or the error."""
    if not result.ok:
        return f"Error: {result.error}"
    return result.text if result.clip is None else f"{len(result.clip.frames)} frames"


def frames_responses(results: list[CropResult]) -> list:
    """Timestamped layout: each call's response body (text, or text and frames; a text
    tool's answer as it is)."""
    out = []
    for r in results:
        if not r.ok:
            out.append(f"Error: {r.error}")
            continue
        if r.clip is None:  # a text tool's answer
            out.append(r.text)
            continue
        clip = r.clip
        out.append([chat.Text(f"{len(clip.frames)} frames from {r.request.start:.1f} s to "
                              f"{r.request.end:.1f} s.\n"),
                    *chat.frames_as_images(clip.frames, clip.timestamps)])
    return out


def images_first_messages(results: list[CropResult]) -> list[chat.Message]:
    """The evaluation driver's layout: one user turn per call, the crop's bare frames BEFORE
    `<tool_response>\nN frames from S.Ss to E.Es.\n</tool_response>`; a failed crop is
    `<tool_response>\n[Error cropping S.Ss-E.Es]\n</tool_response>`. S and E are the window as
    the driver reads the call (`tools.lenient_window`), before clamping to the video. A text
    tool's answer is its own `<tool_response>` turn."""
    out = []
    for r in results:
        start, end = lenient_window(r.task.call)
        if r.ok and r.clip is None:  # a text tool's answer
            out.append(chat.Message.of("user", f"<tool_response>\n{r.text}\n</tool_response>"))
        elif r.ok:
            text = f"<tool_response>\n{len(r.clip.frames)} frames from {start:.1f}s to {end:.1f}s.\n</tool_response>"
            out.append(chat.Message("user", (*chat.frames_as_images(r.clip.frames, None), chat.Text(text))))
        else:
            out.append(chat.Message.of("user", f"<tool_response>\n[Error cropping {start:.1f}s-{end:.1f}s]\n"
                                               "</tool_response>"))
    return out
