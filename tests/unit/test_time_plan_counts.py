"""The time plan counts what the programs move: a decode step's attention at the rollout's mean
fill of the KV cache (planner/decode_reads.py), checked against hand counts and against the
analytic cost the traced decode records at its static key lengths."""
import dataclasses

import pytest

from paravt_jax.configs import paragrpo
from paravt_jax.models.qwen3_vl import preset
from paravt_jax.planner import decode_reads as D
from paravt_jax.planner import time_plan as T
from paravt_jax.planner import workload as W
from paravt_jax.run_config import build_run


def test_blocks_read_covers_whole_blocks_up_to_the_fill():
    assert [D.blocks_read(n, 16, 144) for n in (0, 1, 16, 17, 140)] == [0, 16, 16, 32, 144]
    assert D.blocks_read(5, 512, 48) == 48  # a block longer than the keys: the whole of them
    assert D.blocks_read(130, 16, 136) == 136  # never past the static length


def test_suffix_reads_follow_the_write_pointer_by_hand():
    """Three turns of 24 tokens, 32 slots written by each tool round, 16-slot blocks."""
    steps, total = D.suffix_reads([(0, 24), (32, 24), (32, 24)], 16, 144)
    # turn 1: 23 forward steps write slots 0..22 (the first token is the prefill's): 16 steps
    # read one block, 7 read two -> 16 * 16 + 7 * 32
    first = 16 * 16 + 7 * 32
    # turn 2 starts at 23 + 32 = 55: fills 56..78 -> 9 steps read 64 slots, 14 read 80
    second = 9 * 64 + 14 * 80
    # turn 3 starts at 78 + 32 = 110: fills 111..133 -> 2 x 112, 16 x 128, 5 x 144
    third = 2 * 112 + 16 * 128 + 5 * 144
    assert (steps, total) == (69, first + second + third)


def test_decode_read_by_hand_on_the_tiny_model():
    """tiny: 2 layers, 4 query / 2 KV heads of 16, float32. The row's own suffix is read blockwise
    (bounded); the prompt part runs dense under auto (XLA counts it), blockwise when asked."""
    config = preset("tiny")
    turns = [(0, 24), (32, 24), (32, 24)]
    mean = (16 * 16 + 7 * 32 + 9 * 64 + 14 * 80 + 2 * 112 + 16 * 128 + 5 * 144) / 69
    read = D.decode_read("decode", config, "used", 16, 4, 2, turns, 144, 40, 64)
    assert read.steps == 69 and read.suffix_read == pytest.approx(mean) and read.prefix_read == 48
    # suffix: 4 rows x 4 heads x 16 dims x 1 query x `mean` keys, 2 FLOPs per multiply-add, two
    # products; bytes: q and out (4 heads) and k and v (2 heads) of 4-byte elements
    assert read.flops == pytest.approx(2 * 4 * 4 * 4 * 16 * mean)
    assert read.bytes == pytest.approx(2 * 4 * 16 * 4 * (2 * 4 + 2 * 2 * mean))
    assert read.full_bytes == pytest.approx(2 * 4 * 16 * 4 * (2 * 4 + 2 * 2 * 144))
    blockwise = D.decode_read("decode", config.replace(attention="blockwise"), "used", 16, 4, 2, turns, 144, 40, 64)
    # + the prompt: 2 prompts, their 2 rows folded into 2 queries, 48 of its 64 slots read
    prefix_flops, prefix_bytes = 4 * 2 * 4 * 16 * 2 * 48, 4 * 16 * 2 * (2 * 4 * 2 + 2 * 2 * 48)
    assert blockwise.flops == pytest.approx(read.flops + 2 * prefix_flops)
    assert blockwise.bytes == pytest.approx(read.bytes + 2 * prefix_bytes)
    assert "75 of 144 suffix slots + 48 of 64 prompt slots (16-slot blocks" in read.describe()


def test_the_analytic_decode_cost_at_capacity_is_what_the_trace_records():
    """The tiny decode compiled on one CPU device records its attention calls at the static key
    lengths; decode_attention at those lengths gives the same FLOPs and bytes."""
    import jax

    from paravt_jax.infra import sharding as sh
    from paravt_jax.planner.memory import SamplerPrograms
    from paravt_jax.sampling.backend import SamplerBackend
    from paravt_jax.sampling.sampler import SamplerConfig

    config = preset("tiny")
    programs = SamplerPrograms(config, SamplerConfig(), sh.make_mesh({"data": 1}, jax.devices()[:1]), "gpu")
    traced = programs.decode(4, 144, 2, 64, 24)
    read = D.decode_read("decode", config, "used", SamplerBackend.decode_block, 4, 2, [(0, 24)], 144, 40, 64)
    assert traced.kernel_text_flops > 0
    assert (read.full_flops, read.full_bytes) == (pytest.approx(traced.kernel_text_flops),
                                                   pytest.approx(traced.kernel_text_bytes))


def _small_recipe():
    from paravt_jax.text.tokenizer import train_tokenizer

    c = paragrpo.get_config("tiny")
    c.rl.nframes_gating, c.rl.default_nframes = False, 4
    # turns of 400 tokens: the suffix spans several of the decode's 512-slot blocks
    c.rl.rollout.max_new_tokens, c.rl.rollout.subagent_max_tokens, c.rl.rollout.max_turns = 400, 16, 2
    c.rl.dispatch.max_parallel, c.rl.dispatch.max_frames = 1, 2
    rl = W.rl_settings(build_run(c))[0]
    tok = train_tokenizer(["crop_video start_time end_time seconds frames"] * 10)
    work = W.workload(rl, preset("tiny").vision, tok)
    return rl, work, W.sampler_layout(rl, work)


def test_main_decode_turns_come_from_the_workload():
    rl, work, layout = _small_recipe()
    advance = layout.extend_width * layout.extend_pieces
    assert D.main_decode_turns(rl, work, layout) == [(0, 400), (advance, 400), (advance, 400)]
    # the walk never passes the reserved suffix: the episode's last write is inside it
    assert 3 * 399 + 2 * advance <= layout.suffix_slots
    final = dataclasses.replace(rl, rollout=dataclasses.replace(
        rl.rollout, protocol=dataclasses.replace(rl.rollout.protocol, final_answer=True, final_answer_tokens=8)))
    assert D.main_decode_turns(final, work, layout)[-1] == (advance, 8)


def test_time_plan_charges_the_mean_fill_and_says_so():
    """A decode program traced at capacity: the time plan replaces its attention by the mean
    fill's, per device as the rows split, and prints which."""
    from paravt_jax.planner.memory import ProgramMemory
    from paravt_jax.planner.programs import ProgramSet

    rl, work, layout = _small_recipe()
    config = preset("tiny")
    reads = D.decode_reads(rl, work, layout, config)
    main = reads["decode"]
    decode = ProgramMemory("decode", 0, 0, layout.rows, 1.0, bytes_accessed=1e6, kernel_text_flops=main.full_flops,
                           kernel_text_bytes=main.full_bytes)
    programs = ProgramSet((), (decode,), "tpu", "test", 1.0)
    plan = T.time_plan(programs, rl, work, layout, config, "v5p", {"data": 1, "fsdp": 2, "tensor": 1})
    (phase,) = plan.phases
    split = 2 if layout.rows % 2 == 0 else 1
    assert phase.bytes == pytest.approx(1e6 + main.bytes / split)
    assert main.bytes < main.full_bytes  # the episode's mean fill is below its reserved suffix
    assert phase.kv_read.startswith("decode: KV read per step = mean fill")
    assert any(line.strip() == phase.kv_read for line in T.format_time_plan(plan))


def test_extend_fills_follow_the_write_pointer_by_hand():
    """Turns of 24 tokens, each tool round's extend in two pieces of 16 slots: turn 1 writes 23
    slots; the pieces before turn 2 fill 39 and 55; turn 2 then writes up to 78; the pieces
    before turn 3 fill 94 and 110."""
    assert D.extend_fills([(0, 24), (32, 24), (32, 24)], 16, 2) == [39, 55, 94, 110]
    assert D.extend_fills([(0, 24)], 16, 2) == []  # no tool round, no extend


def test_the_tool_response_read_by_hand_and_at_capacity_as_traced():
    """tiny, blockwise, 4 rows of 2 prompts, pieces of 16 tokens: 16-slot blocks up to 39, 55,
    94, 110 filled slots read 48, 64, 96, 112 (mean 80) of the 144 reserved; the prompt's 40
    tokens 48 of its 64 slots. At the static lengths the count is what the traced prefill
    records."""
    import jax

    from paravt_jax.infra import sharding as sh
    from paravt_jax.planner.memory import PrefillCall, SamplerPrograms
    from paravt_jax.sampling.sampler import SamplerConfig

    config = preset("tiny").replace(attention="blockwise")
    read = D.extend_read("tool-response prefill", config, 16, 4, 2, 16, [39, 55, 94, 110], 144, 40, 64)
    assert (read.steps, read.suffix_read, read.prefix_read) == (4, 80.0, 48.0)
    # own: 4 rows x 4 heads x 16 dims x 16 queries x 80 keys, two products of 2 FLOPs; prompt: 2
    # prompts, their 2 rows' 16 queries folded into 32, 48 keys; 2 layers
    assert read.flops == pytest.approx(2 * (4 * 4 * 4 * 16 * 16 * 80 + 4 * 2 * 4 * 16 * 32 * 48))
    assert read.flops < read.full_flops and read.bytes < read.full_bytes
    assert read.describe().startswith("tool-response prefill: KV read per piece = mean fill, 80 of 144 suffix")
    programs = SamplerPrograms(config, SamplerConfig(), sh.make_mesh({"data": 1}, jax.devices()[:1]), "gpu")
    traced = programs.prefill(PrefillCall("tool-response prefill", 4, 144, 16, prompts=2, prefix_slots=64))
    assert traced.group_rows == 4 and traced.attention_block > 0 and traced.kernel_text_flops > 0
    at_block = D.extend_read("tool-response prefill", config, traced.attention_block, 4, 2, 16, [39], 144, 40, 64)
    assert (at_block.full_flops, at_block.full_bytes) == (pytest.approx(traced.kernel_text_flops),
                                                           pytest.approx(traced.kernel_text_bytes))


def test_time_plan_charges_the_tool_response_prefill_its_mean_fill():
    from paravt_jax.planner.memory import ProgramMemory
    from paravt_jax.planner.programs import ProgramSet

    rl, work, layout = _small_recipe()
    config = preset("tiny").replace(attention="blockwise")
    fills = D.extend_fills(D.main_decode_turns(rl, work, layout), layout.extend_width, layout.extend_pieces)
    assert len(fills) == 2 * layout.extend_pieces and fills == sorted(fills) and fills[-1] <= layout.suffix_slots
    read = D.tool_response_read(rl, work, layout, config, ProgramMemory(
        "tool-response prefill", 0, 0, layout.rows, 1.0, attention_block=16))
    prefill = ProgramMemory("tool-response prefill", 0, 0, layout.rows, 1.0, flops=1e6,
                            kernel_text_flops=read.full_flops, kernel_text_bytes=read.full_bytes, attention_block=16)
    plan = T.time_plan(ProgramSet((), (prefill,), "tpu", "test", 1.0), rl, work, layout, config, "v5p", {"data": 1})
    (phase,) = plan.phases
    assert read.flops < read.full_flops
    assert phase.kernel_flops == pytest.approx(read.flops)
    assert phase.kv_read == read.describe()


def test_a_prefills_attention_runs_on_each_devices_block_of_rows(monkeypatch):
    """On an fsdp mesh the prefill's matmuls run on every device for all of the group's tokens,
    but its blockwise attention reads the cache rows where they live: the compiled loop's score
    block holds one device's rows (16 rows over 8 devices: 2), and the time plan divides the
    attention it adds by those row blocks (ProgramMemory.row_shards), not by nothing."""
    import re

    import jax

    from paravt_jax.infra import sharding as sh
    from paravt_jax.planner import memory as M
    from paravt_jax.planner.programs import ProgramSet
    from paravt_jax.sampling.sampler import SamplerConfig

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    compiled = {}
    real = M.compile_for

    def keeping(name, *args, keep=False, **kwargs):  # the real compile; its program kept for reading
        stats, program = real(name, *args, keep=True, **kwargs)
        compiled[name] = program
        return (stats, program) if keep else stats

    monkeypatch.setattr(M, "compile_for", keeping)
    config = preset("tiny").replace(attention="blockwise")
    programs = M.SamplerPrograms(config, SamplerConfig(), sh.make_mesh({"data": 1, "fsdp": 8, "tensor": 1},
                                                                       jax.devices()[:8]), "gpu")
    call = M.PrefillCall("tool-response prefill", 16, 1024, 64, prompts=8, prefix_slots=256)
    stats = programs.prefill(call)
    assert (stats.group_rows, stats.row_shards) == (16, 8) and stats.kernel_text_flops > 0
    scores = [line for line in compiled[call.name].as_text().splitlines()
              if " dot(" in line and "bkgqd,bkds->bkgqs" in line]
    assert scores, "no blockwise score matmul in the compiled prefill"
    assert {re.search(r"= f32\[(\d+),", line).group(1) for line in scores} == {"2"}
    rl, work, layout = _small_recipe()
    plan = T.time_plan(ProgramSet((), (stats,), "gpu", "test", 1.0), rl, work, None, config, "h100",
                       {"data": 1, "fsdp": 8, "tensor": 1})
    (phase,) = plan.phases
    assert phase.kernel_flops == pytest.approx(stats.kernel_text_flops / 8)


# An optimised module in HLO text: an in-place cache write (a fusion rooted at a
# dynamic-update-slice), a read of one slice of the cache through a nested fusion, an add, a
# loop of known trip count whose body holds a conditional (one branch runs), and an operand in
# on-chip memory (S(1)).
HLO = """HloModule test, is_scheduled=true

%fused_update (param_0: bf16[64,1024], param_1: bf16[64,1], param_2: s32[]) -> bf16[64,1024] {
  %param_0 = bf16[64,1024]{1,0} parameter(0)
  %param_1 = bf16[64,1]{1,0} parameter(1)
  %param_2 = s32[] parameter(2)
  %constant.1 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = bf16[64,1024]{1,0} dynamic-update-slice(bf16[64,1024]{1,0} %param_0, bf16[64,1]{1,0} %param_1, s32[] %constant.1, s32[] %param_2)
}

%fused_slice (param_0.2: bf16[64,1024], param_1.2: s32[]) -> bf16[64,128] {
  %param_0.2 = bf16[64,1024]{1,0} parameter(0)
  %param_1.2 = s32[] parameter(1)
  %constant.2 = s32[] constant(0)
  ROOT %dynamic-slice.1 = bf16[64,128]{1,0} dynamic-slice(bf16[64,1024]{1,0} %param_0.2, s32[] %constant.2, s32[] %param_1.2), dynamic_slice_sizes={64,128}
}

%fused_read (param_0.1: bf16[64,1024], param_1.1: s32[]) -> f32[64,128] {
  %param_0.1 = bf16[64,1024]{1,0} parameter(0)
  %param_1.1 = s32[] parameter(1)
  %block = bf16[64,128]{1,0} fusion(%param_0.1, %param_1.1), kind=kLoop, calls=%fused_slice
  ROOT %convert.1 = f32[64,128]{1,0} convert(bf16[64,128]{1,0} %block)
}

%small (x.1: f32[64,128]) -> f32[64,128] {
  %x.1 = f32[64,128]{1,0} parameter(0)
  ROOT %neg = f32[64,128]{1,0} negate(f32[64,128]{1,0} %x.1)
}

%large (x.2: f32[64,128]) -> f32[64,128] {
  %x.2 = f32[64,128]{1,0} parameter(0)
  %e = f32[64,128]{1,0} exponential(f32[64,128]{1,0} %x.2)
  ROOT %m = f32[64,128]{1,0} multiply(f32[64,128]{1,0} %e, f32[64,128]{1,0} %x.2)
}

%body (state: (s32[], f32[64,128])) -> (s32[], f32[64,128]) {
  %state = (s32[], f32[64,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element((s32[], f32[64,128]{1,0}) %state), index=0
  %x = f32[64,128]{1,0} get-tuple-element((s32[], f32[64,128]{1,0}) %state), index=1
  %twice = f32[64,128]{1,0} add(f32[64,128]{1,0} %x, f32[64,128]{1,0} %x), metadata={op_name="jit(f)/while/body/add"}
  %which = s32[] and(s32[] %i, s32[] %i)
  %branch = f32[64,128]{1,0} conditional(s32[] %which, f32[64,128]{1,0} %twice, f32[64,128]{1,0} %twice), branch_computations={%small, %large}
  ROOT %next = (s32[], f32[64,128]{1,0}) tuple(s32[] %i, f32[64,128]{1,0} %branch)
}

%cond (state.1: (s32[], f32[64,128])) -> pred[] {
  %state.1 = (s32[], f32[64,128]{1,0}) parameter(0)
  %j = s32[] get-tuple-element((s32[], f32[64,128]{1,0}) %state.1), index=0
  %limit = s32[] constant(8)
  ROOT %less = pred[] compare(s32[] %j, s32[] %limit), direction=LT
}

ENTRY %main (cache: bf16[64,1024], update: bf16[64,1], index: s32[], scale: f32[64,128]) -> (bf16[64,1024], f32[64,128]) {
  %cache = bf16[64,1024]{1,0} parameter(0)
  %update = bf16[64,1]{1,0} parameter(1)
  %index = s32[] parameter(2)
  %scale = f32[64,128]{1,0:S(1)} parameter(3)
  %written = bf16[64,1024]{1,0} fusion(bf16[64,1024]{1,0} %cache, bf16[64,1]{1,0} %update, s32[] %index), kind=kLoop, calls=%fused_update, metadata={op_name="jit(f)/dynamic_update_slice"}
  %read = f32[64,128]{1,0} fusion(bf16[64,1024]{1,0} %written, s32[] %index), kind=kLoop, calls=%fused_read, metadata={op_name="jit(f)/dynamic_slice"}
  %sum = f32[64,128]{1,0} add(f32[64,128]{1,0} %read, f32[64,128]{1,0} %read)
  %scaled = f32[64,128]{1,0} multiply(f32[64,128]{1,0} %sum, f32[64,128]{1,0:S(1)} %scale)
  %start = (s32[], f32[64,128]{1,0}) tuple(s32[] %index, f32[64,128]{1,0} %scaled)
  %loop = (s32[], f32[64,128]{1,0}) while((s32[], f32[64,128]{1,0}) %start), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"8"}}
  %result = f32[64,128]{1,0} get-tuple-element((s32[], f32[64,128]{1,0}) %loop), index=1
  ROOT %out = (bf16[64,1024]{1,0}, f32[64,128]{1,0}) tuple(bf16[64,1024]{1,0} %written, f32[64,128]{1,0} %result)
}
"""  # noqa: E501


def test_hlo_counts_by_hand():
    """Counted: operands whole and outputs; physical: the in-place write at its update, the
    slice read (through a nested fusion) at its size, an operand passed twice read once, on-chip
    memory not at all, a loop body at its known trip count, the costlier branch only."""
    from paravt_jax.planner import hlo_counts as H

    rows = {r.name: r for r in H.breakdown(HLO)}
    cache, update, block, tile = 64 * 1024 * 2, 64 * 2, 64 * 128 * 2, 64 * 128 * 4
    assert (rows["written"].counted, rows["written"].physical) == (2 * cache + update + 4, update + 4 + update)
    assert rows["written"].kind == "fusion:dynamic-update-slice"
    assert (rows["read"].counted, rows["read"].physical) == (cache + 4 + tile, block + 4 + tile)
    assert (rows["sum"].counted, rows["sum"].physical) == (3 * tile, 2 * tile)
    assert (rows["scaled"].counted, rows["scaled"].physical) == (3 * tile, 2 * tile)  # the S(1) operand: on chip
    assert (rows["twice"].counted, rows["twice"].physical, rows["twice"].runs) == (3 * tile, 2 * tile, 8)
    assert rows["twice"].computation == "body" and rows["less"].runs == 8
    # the conditional runs one branch: the costlier (exponential + multiply) at the loop's runs
    assert (rows["e"].runs, rows["m"].runs, rows["neg"].runs) == (8, 8, 0)
    assert rows["read"].op_name == "jit(f)/dynamic_slice" and "branch" not in rows  # a conditional moves nothing
    assert set(rows) == {"written", "read", "sum", "scaled", "twice", "which", "neg", "e", "m", "less"}
    physical = sum(r.physical * r.runs for r in rows.values())  # "which" reads its operand once: 4 + 4
    assert H.physical_bytes(HLO) == physical
    assert physical == (2 * update + 4) + (block + 4 + tile) + 4 * tile + 8 * (2 * tile + 2 * 4 + 5 * tile + 9)
    groups = {k: (n, c, p) for k, n, c, p in H.summarize(rows.values(), lambda r: r.kind)}
    assert groups["add"] == (2, 6 * tile, 2 * tile + 8 * 2 * tile)


def test_hlo_shapes_and_bad_text():
    from paravt_jax.planner import hlo_counts as H

    assert H.shape_bytes("(bf16[2,3]{1,0}, f32[], s32[4])") == 12 + 4 + 16
    assert H.shape_bytes("bf16[64,8,128,512]{3,2,1,0:T(8,128)(2,1)}") == 64 * 8 * 128 * 512 * 2
    assert H.shape_bytes("(f32[8]{0:T(128)S(1)}, f32[8]{0})", hbm_only=True) == 32
    with pytest.raises(ValueError, match="no ENTRY computation"):
        H.breakdown("HloModule empty\n")


def test_a_gather_repeating_rows_reads_its_table_once():
    from paravt_jax.planner import hlo_counts as H

    text = """HloModule gather
%fused_gather (p0: bf16[4,8], p1: s32[16,1]) -> bf16[16,8] {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %p1 = s32[16,1]{1,0} parameter(1)
  ROOT %g = bf16[16,8]{1,0} gather(%p0, %p1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
}
ENTRY %main (t: bf16[4,8], i: s32[16,1]) -> bf16[16,8] {
  %t = bf16[4,8]{1,0} parameter(0)
  %i = s32[16,1]{1,0} parameter(1)
  ROOT %rows = bf16[16,8]{1,0} fusion(%t, %i), kind=kLoop, calls=%fused_gather
}
"""  # noqa: E501
    (row,) = H.breakdown(text)
    # 16 gathered rows of 16 bytes from a 64-byte table: the table (64), the indices (64), the output (256)
    assert (row.counted, row.physical) == (64 + 64 + 256, 64 + 64 + 256)


def test_a_counted_loop_without_a_known_trip_count_runs_its_condition_s_limit():
    """A TPU module prints no known_trip_count: `counter < constant` in the condition gives it."""
    from paravt_jax.planner import hlo_counts as H

    rows = {r.name: r for r in H.breakdown(HLO.replace(', backend_config={"known_trip_count":{"n":"8"}}', ""))}
    assert rows["twice"].runs == 8
    data_dependent = HLO.replace("compare(s32[] %j, s32[] %limit)", "compare(s32[] %j, s32[] %j)")
    assert {r.name: r for r in H.breakdown(data_dependent.replace('"n":"8"', '"m":"8"'))}["twice"].runs == 1


def test_the_blockwise_attention_loops_are_left_to_the_analytic_count():
    """The blockwise attention's loops carry their named scope in the compiled program's op_name
    (an accelerator's HLO text keeps op_name, not source_file), and physical_bytes gives their
    bodies no runs (the time plan adds each attention call's keys and values analytically; a
    counted run would add one key block of every call again); the rest of the program counts as
    before, and breakdown without the scopes keeps the loops."""
    import jax
    import jax.numpy as jnp

    from paravt_jax.models.qwen3_vl import blockwise as B
    from paravt_jax.models.qwen3_vl.attention_mask import AttentionMask
    from paravt_jax.planner import hlo_counts as H

    batch, lq, lk, heads, kv_heads, head_dim = 2, 8, 64, 4, 2, 16
    q = jnp.ones((batch, lq, heads, head_dim), jnp.float32)
    k = jnp.ones((batch, kv_heads, head_dim, lk), jnp.float32)  # the cache layout
    v = jnp.ones((batch, kv_heads, lk, head_dim), jnp.float32)
    valid = jnp.ones((batch, lk), bool)

    def step(q, k, v, valid):
        out, _ = B.blockwise_partial(q * 2.0, k, v, AttentionMask.cache(valid, (lk - lq) + jnp.arange(lq)),
                                     cache_layout=True, block=16)
        return out.sum(-1) + 1.0

    text = jax.jit(step).lower(q, k, v, valid).compile().as_text()
    loops = [line for line in text.splitlines() if " while(" in line]
    assert loops and all(B.LOOP_SCOPE in line for line in loops), loops
    plain = H.breakdown(text)
    analytic = H.breakdown(text, H.ATTENTION_SCOPES)
    assert [r.name for r in plain] == [r.name for r in analytic]
    inside = [(p, a) for p, a in zip(plain, analytic) if p.runs != a.runs]
    assert inside and all(p.runs >= 1 and a.runs == 0 for p, a in inside)
    outside = sum(r.physical * r.runs for r in analytic)
    assert H.physical_bytes(text) == outside
    assert 0 < outside < sum(r.physical * r.runs for r in plain)
    assert outside >= q.size * 4  # the query is read outside the loops


def test_an_asynchronous_start_writes_what_it_writes_only():
    """A copy-start's output tuple is (destination, the source aliased, a context): a prefetch into
    on-chip memory (S(1)) reads its source once and writes nothing to HBM; a copy within HBM reads
    and writes it once each; an all-gather-start's (operand, output) writes the output. (Counting the
    tuple whole charged the TPU decode's weight prefetches twice: 3.59 GB of its 4.51 at the 8B
    recipe on v5p-16.)"""
    from paravt_jax.planner import hlo_counts as H

    text = """HloModule copies

ENTRY %main (w: bf16[512,4096], x: f32[64,128]) -> (bf16[512,4096], f32[64,128]) {
  %w = bf16[512,4096]{1,0:T(8,128)(2,1)} parameter(0)
  %x = f32[64,128]{1,0} parameter(1)
  %to_chip = (bf16[512,4096]{1,0:T(8,128)(2,1)S(1)}, bf16[512,4096]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(bf16[512,4096]{1,0:T(8,128)(2,1)} %w)
  %on_chip = bf16[512,4096]{1,0:T(8,128)(2,1)S(1)} copy-done((bf16[512,4096]{1,0:T(8,128)(2,1)S(1)}, bf16[512,4096]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) %to_chip)
  %within = (f32[64,128]{1,0}, f32[64,128]{1,0}, u32[]{:S(2)}) copy-start(f32[64,128]{1,0} %x)
  %copied = f32[64,128]{1,0} copy-done((f32[64,128]{1,0}, f32[64,128]{1,0}, u32[]{:S(2)}) %within)
  %gather = (f32[64,128]{1,0}, f32[512,128]{1,0}) all-gather-start(f32[64,128]{1,0} %copied), dimensions={0}
  %gathered = f32[512,128]{1,0} all-gather-done((f32[64,128]{1,0}, f32[512,128]{1,0}) %gather)
  ROOT %out = (bf16[512,4096]{1,0:T(8,128)(2,1)S(1)}, f32[512,128]{1,0}) tuple(%on_chip, %gathered)
}
"""  # noqa: E501
    rows = {r.name: r for r in H.breakdown(text)}
    weights, tile = 512 * 4096 * 2, 64 * 128 * 4
    assert rows["to_chip"].physical == weights and rows["within"].physical == 2 * tile
    assert rows["gather"].physical == tile + 8 * tile  # its operand read, its output written
    assert all(rows[name].physical == 0 for name in ("on_chip", "copied", "gathered") if name in rows)  # done halves
    assert H.physical_bytes(text) == weights + 2 * tile + 9 * tile
