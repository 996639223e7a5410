"""The keys and values a decode step reads, for the time plan (planner/time_plan.py).

XLA's cost analysis counts one block of the blockwise attention loop, so the time plan adds each
attention call's analytic cost (attention.attention_cost). Traced at the static key length, a
decode step's call counts the whole reserved cache: every suffix slot an episode may reach and
every slot of the prompt's bucket. What a step reads is less. A blockwise partial
(attention.attend_partial, blockwise.blockwise_partial) stops after the last key block a row
with a seeing query holds a key in (`blockwise._key_blocks`): for a decode step, the block of
the slot it writes (every still-sampling row writes the same slot). So a step at write slot `w`
reads `ceil((w + 1) / block) * block` suffix slots (at most the capacity) and
`ceil(prompt / block) * block` prompt slots (the prompt fills its prefix from the first step).
A dense partial reads every slot, and XLA counts it itself.

The fill follows the sampler's write pointer over a full-budget episode (every turn at its
budget, every tool response at the workload's length; sampling/kv_cache.episode_capacity's
walk): the first turn's decode starts at suffix slot 0 (the prompt is in the prefix cache), a
decode of n tokens runs n - 1 forward steps (the first token comes from the prefill's logits)
and writes one slot each, and each tool round's extend writes the pending token and the
round's responses (`SamplerLayout.extend_width` x `extend_pieces` slots). The time plan charges
each decode call the mean over those steps. The block is `SamplerBackend.decode_block` under
`decode_window="used"` and `model.attention_block` under "capacity" (where finished rows keep
attending, which a full-budget episode has none of).

The tool-response prefill is traced at the whole reserved suffix too (under the fixed shapes its
window is the capacity, `SamplerConfig.prefill_window`), and its blockwise read stops in the same
way: a piece of `extend_width` tokens written at slot `w` reads the blocks up to `w + width`
(its own keys are filled before it attends) and the prompt's filled blocks. `extend_read` charges
each piece the mean over the pieces of a full-budget episode's extends (`extend_fills`), with the
prefill's own key block and row group (ProgramMemory.attention_block, group_rows).
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class DecodeRead:
    """What one decode program's steps read, on average over a full-budget rollout. Slots are
    per row (suffix) and per prompt (prefix); flops / bytes: the analytic attention of one step,
    whole program (all rows, every layer), for the calls XLA does not count (the blockwise ones)."""
    name: str
    window: str  # SamplerConfig.decode_window (a prefill's: prefill_window)
    block: int  # key slots per block of the blockwise read
    steps: int  # forward steps (a prefill's: pieces) the mean is over
    suffix_read: float  # mean suffix slots read per row per step
    suffix_slots: int  # the reserved suffix (the static key length the trace counts)
    prefix_read: float  # prompt slots read per prompt per step
    prefix_slots: int
    flops: float
    bytes: float
    full_flops: float  # the same calls at the static key lengths (what the trace recorded)
    full_bytes: float
    unit: str = "step"  # what one call of the program is: a decode step, a prefill's piece

    def describe(self) -> str:
        knob = "decode_window" if self.unit == "step" else "prefill_window"
        return (f"{self.name}: KV read per {self.unit} = mean fill, {self.suffix_read:,.0f} of {self.suffix_slots:,} "
                f"suffix slots + {self.prefix_read:,.0f} of {self.prefix_slots:,} prompt slots ({self.block}-slot "
                f"blocks, {knob}={self.window!r}, mean over {self.steps:,} {self.unit}s of a full-budget rollout): "
                f"{self.bytes / 1e9:,.2f} GB of attention a {self.unit}, {self.full_bytes / 1e9:,.2f} GB at capacity")


def blocks_read(filled: int, block: int, slots: int) -> int:
    """Key slots a blockwise read covers when `filled` slots hold keys: whole blocks of
    min(block, slots) up to the last filled one, at most `slots`; none when nothing is filled."""
    if filled <= 0:
        return 0
    size = min(block, slots)
    return min(math.ceil(filled / size) * size, slots)


def suffix_reads(turns, block: int, slots: int) -> tuple[int, int]:
    """(forward steps, suffix slots read summed over them) of one row's decodes.

    turns: [(slots an extend writes before the turn, the turn's token budget)], the first turn's
    extend 0. A decode of n tokens runs n - 1 forward steps, step k writing slot w + k (w: the
    write pointer at the turn's start) and reading the blocks up to it."""
    write, steps, total = 0, 0, 0
    for advance, budget in turns:
        write += advance
        for k in range(max(budget - 1, 0)):
            total += blocks_read(write + k + 1, block, slots)
        steps += max(budget - 1, 0)
        write += max(budget - 1, 0)
    return steps, total


def decode_attention(config, rows: int, prompts: int, suffix_keys: float, suffix_slots: int, prefix_keys: float,
                     prefix_slots: int, bounded: bool, queries: int = 1) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step's (queries = 1) or prefill piece's (queries = its
    width) blockwise attention calls over every layer, with `suffix_keys` / `prefix_keys` slots
    read (the static slots decide dense or blockwise, as attend_partial decides): a row's own
    suffix (q [rows, queries, H, hd]) and the prompt prefix (the rows of a prompt folded into
    its queries: q [prompts, rows / prompts x queries, H, hd]). Dense calls are left out (XLA
    counts them)."""
    from paravt_jax.models.qwen3_vl.attention import attention_cost_of, partial_runs_dense

    t = config.text
    size = _itemsize(config.dtype)
    heads, kv_heads, impl = t.num_attention_heads, t.num_key_value_heads, config.attention
    flops = total = 0.0
    calls = [(rows, queries, suffix_keys, suffix_slots, bounded)]
    if prompts:
        calls.append((prompts, rows // prompts * queries, prefix_keys, prefix_slots, False))
    for batch, q_len, keys, slots, bound in calls:
        if partial_runs_dense(impl, batch, q_len, heads, slots, bound):
            continue
        f, b = attention_cost_of(batch, q_len, heads, kv_heads, t.head_dim, keys, size)
        flops, total = flops + f, total + b
    return t.num_hidden_layers * flops, t.num_hidden_layers * total


def _itemsize(dtype) -> int:
    import numpy as np

    return 2 if str(dtype) == "bfloat16" else np.dtype(dtype).itemsize


def main_decode_turns(rl, work, layout) -> list[tuple[int, int]]:
    """[(slots written before the turn, token budget)] of the main decode's turns in a
    full-budget episode: the first turn, then one per tool round after its extend."""
    r = rl.rollout
    rounds = r.max_turns if work.calls_per_turn else 0
    budgets = [r.max_new_tokens] * rounds
    if budgets and r.protocol.final_answer:
        budgets[-1] = r.protocol.final_answer_tokens
    advance = layout.extend_width * layout.extend_pieces
    return [(0, r.max_new_tokens)] + [(advance, b) for b in budgets]


def _read(name: str, config, window: str, block: int, rows: int, prompts: int, calls: int, suffix: float,
          suffix_slots: int, prompt_tokens: int, prefix_slots: int, queries: int = 1,
          unit: str = "step") -> DecodeRead:
    """A DecodeRead of `calls` calls reading `suffix` suffix slots a row on average and the
    prompt's filled blocks, at that fill and at the static lengths."""
    prefix = float(blocks_read(min(prompt_tokens, prefix_slots), block, prefix_slots)) if prompts else 0.0
    bounded = window == "used"
    flops, size = decode_attention(config, rows, prompts, suffix, suffix_slots, prefix, prefix_slots, bounded, queries)
    full = decode_attention(config, rows, prompts, suffix_slots, suffix_slots, prefix_slots, prefix_slots, bounded,
                            queries)
    return DecodeRead(name, window, block, calls, suffix, suffix_slots, prefix, prefix_slots if prompts else 0,
                      flops, size, *full, unit=unit)


def decode_read(name: str, config, window: str, block: int, rows: int, prompts: int, turns, suffix_slots: int,
                prompt_tokens: int, prefix_slots: int) -> DecodeRead:
    """The DecodeRead of one decode program (see the module docstring)."""
    steps, total = suffix_reads(turns, block, suffix_slots)
    return _read(name, config, window, block, rows, prompts, steps, total / steps if steps else 0.0, suffix_slots,
                 prompt_tokens, prefix_slots)


def extend_fills(turns, width: int, pieces: int) -> list[int]:
    """Suffix slots filled once each tool-response piece is written, in a full-budget episode:
    the extend before turn t >= 1 (`turns` as `suffix_reads`' ) writes `pieces` pieces of `width`
    slots from the write pointer the turns before it left."""
    write, fills = 0, []
    for t, (advance, budget) in enumerate(turns):
        if t:
            fills += [write + (p + 1) * width for p in range(pieces)]
        write += advance + max(budget - 1, 0)
    return fills


def extend_read(name: str, config, block: int, rows: int, prompts: int, width: int, fills, suffix_slots: int,
                prompt_tokens: int, prefix_slots: int) -> DecodeRead:
    """The DecodeRead of a tool-response prefill of `rows` rows (`prompts` prompts) writing
    pieces of `width` tokens: each piece reads its blocks up to `fills[i]` (see the module
    docstring), the mean over the pieces."""
    total = sum(blocks_read(f, block, suffix_slots) for f in fills)
    return _read(name, config, "capacity", block, rows, prompts, len(fills), total / len(fills) if fills else 0.0,
                 suffix_slots, prompt_tokens, prefix_slots, queries=width, unit="piece")


def tool_response_read(rl, work, layout, config, program) -> DecodeRead | None:
    """The tool-response prefill's DecodeRead from its compiled program (its row group and
    key block), None where the program does not say its block or the episode has no extend."""
    if not program.attention_block or not layout.extend_width or not layout.prompt_rows:
        return None
    per_prompt = max(layout.rows // layout.prompt_rows, 1)
    fills = extend_fills(main_decode_turns(rl, work, layout), layout.extend_width, layout.extend_pieces)
    if not fills:
        return None
    return extend_read(program.name, config, program.attention_block, program.group_rows,
                       max(program.group_rows // per_prompt, 1), layout.extend_width, fills, layout.suffix_slots,
                       work.prompt_tokens, layout.prefix_slots)


def decode_reads(rl, work, layout, config, programs=()) -> dict[str, DecodeRead]:
    """program name -> DecodeRead of the rollout's decodes (the main one and the sub-agents'),
    and of the tool-response prefill among `programs` (its key block and row group are its
    compiled program's)."""
    from paravt_jax.sampling.backend import SamplerBackend

    window = rl.sampler.decode_window
    block = (rl.sampler.decode_block or SamplerBackend.decode_block) if window == "used" else config.attention_block
    out = {"decode": decode_read("decode", config, window, block, layout.rows, layout.prompt_rows,
                                 main_decode_turns(rl, work, layout), layout.suffix_slots, work.prompt_tokens,
                                 layout.prefix_slots)}
    if layout.subagent_rows:
        out["sub-agent decode"] = decode_read(
            "sub-agent decode", config, window, block, layout.subagent_rows, layout.subagent_rows,
            [(0, rl.rollout.subagent_max_tokens)], layout.subagent_suffix_slots, work.subagent_prompt_tokens,
            layout.subagent_prefix_slots)
    for program in programs:
        if program.name == "tool-response prefill":
            read = tool_response_read(rl, work, layout, config, program)
            if read is not None:
                out[program.name] = read
    return out
