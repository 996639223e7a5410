"""What a tool round reads back to the model: each crop's answer as the rollout's tool response
carries it. Sub-agent mode: the sub-agent's prompt (the crop's frames and the segment
instruction) and its summary's text; frames mode: the crop's frames themselves, in the
timestamped layout (the RL workflow) or the images_first one (the evaluation driver)."""
from __future__ import annotations

from collections.abc import Sequence

from paravt_jax.agent.dispatch import CropResult
from paravt_jax.agent.tools import lenient_window
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode
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
