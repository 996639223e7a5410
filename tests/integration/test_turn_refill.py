"""Sampler.start_turns / decode_turns / extend_turns: episodes' turns refilled row by row (each
row's next turn started as soon as its turn ends and its chunk is written at its own slot) give
the tokens of generate + extend round by round, greedy and sampled, whatever the rows' turns
and budgets; one compiled decode for every turn; rows not in a turn (an ended episode's, spare
ones) take other prompts (admit_turns), each decoded as a call of its own; bad arguments
refused."""
import dataclasses

import numpy as np
import pytest

from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
from paravt_jax.text.inputs import encode_ids

NEW = 20
LENGTHS = (30, 75, 12)  # three prompts, two samples each: six rows
# each row's episode: the chunk length of each of its later turns (rows 2 and 5 answer at once,
# row 4 runs three turns, the last one the short final-answer turn of FINAL tokens)
TURNS = ((9, 17), (4,), (), (21,), (6, 3, 11), ())
FINAL = 5


@pytest.fixture(scope="module", params=["tiny", "toy"])
def model(request):
    return init_model(preset(request.param, attention_block=16), seed=5)


def sampler_of(model, **config):
    sampler = Sampler(model, SamplerConfig(**config))
    sampler.backend = dataclasses.replace(sampler.backend, decode_block=16)
    return sampler


def prompts():
    rng = np.random.default_rng(3)
    return [encode_ids(rng.integers(0, 900, n).tolist(), 0) for n in LENGTHS]


def chunk(row, turn, start):
    """Row `row`'s chunk before its turn `turn` + 1 (its tool responses), from position `start`."""
    rng = np.random.default_rng(100 * row + turn)
    return encode_ids(rng.integers(0, 900, TURNS[row][turn]).tolist(), start, trainable=False)


def budget_of(row, turn):
    return FINAL if turn == len(TURNS[row]) - 1 and row == 4 else NEW


def reserve():
    return [(32, NEW)] * 3


def by_rounds(sampler, sampling, seed):
    """generate, then one extend per round for the rows with a turn left (each round's rows
    share the budget: row 4's final turn runs alone in round 3). Returns {row: [turns]}."""
    out, state = sampler.generate(prompts(), 2, sampling=sampling, seed=seed, reserve=reserve())
    turns = {b: [(out.tokens[b], out.logprobs[b], bool(out.finished[b]))] for b in range(6)}
    for turn in range(3):
        rows = [b for b in range(6) if len(TURNS[b]) > turn]
        budgets = {budget_of(b, turn) for b in rows}
        for budget in sorted(budgets):
            part = [b for b in rows if budget_of(b, turn) == budget]
            chunks = [chunk(b, turn, int(state.chunk_start[b])) if b in part else None for b in range(6)]
            out, state = sampler.extend(state, chunks, sampling=sampling.with_budget(budget),
                                        seed=seed + turn + 1)
            for b in part:
                turns[b].append((out.tokens[b], out.logprobs[b], bool(out.finished[b])))
    return turns


def by_rows(sampler, sampling, seed, refill_at=1):
    state = sampler.start_turns(prompts(), 2, sampling=sampling, seed=seed, reserve=reserve(), refill_at=refill_at)
    turns = {b: [] for b in range(6)}
    order = []
    while ends := sampler.decode_turns(state):
        chunks, budgets, seeds = {}, {}, {}
        for end in ends:
            b, turn = end.row, len(turns[end.row])
            turns[b].append((end.tokens, end.logprobs, end.finished))
            order.append(b)
            if turn < len(TURNS[b]):
                chunks[b] = chunk(b, turn, int(state.chunk_start()[b]))
                budgets[b], seeds[b] = budget_of(b, turn), seed + turn + 1
        sampler.extend_turns(state, chunks, budget=budgets, seed=seeds)
    return turns, order, state


def stops_of(sampler, sampling):
    out, _ = sampler.generate(prompts(), 2, sampling=sampling, seed=1)
    return tuple({out.tokens[0][2], out.tokens[3][11], out.tokens[5][5]})


ROUNDS = {}  # (model, temperature) -> (sampling, the round-by-round turns): shared by the cases


def rounds_of(model, sampler, temperature):
    key = (id(model), temperature)
    if key not in ROUNDS:
        sampling = SamplingParams(max_new_tokens=NEW, temperature=temperature)
        sampling = dataclasses.replace(sampling, stop_ids=stops_of(sampler, sampling))
        ROUNDS[key] = sampling, by_rounds(sampler, sampling, seed=7)
    return ROUNDS[key]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_refilled_turn_by_turn_equal_round_by_round(model, temperature):
    sampler = sampler_of(model)
    sampling, want = rounds_of(model, sampler, temperature)
    decodes = sampler.compile_counts()["decode"]
    got, order, state = by_rows(sampler, sampling, seed=7)
    assert [len(t) for t in got.values()] == [len(TURNS[b]) + 1 for b in range(6)]
    for b in range(6):
        for (tokens, logps, finished), (want_tokens, want_logps, want_finished) in zip(got[b], want[b]):
            assert tokens == want_tokens and finished == want_finished, (b, tokens, want_tokens)
            np.testing.assert_allclose(logps, want_logps, atol=2e-5, rtol=0)
    assert len({len(t[0]) for b in range(6) for t in got[b]}) > 2  # the stops end turns at varied steps
    assert order != sorted(order)  # rows ended out of order: a row's next turn ran beside the others' turns
    assert state.row_steps > 0 and not state.running.any()
    refilled = sampler.compile_counts()["decode"]
    assert refilled <= decodes + 1  # one refilled decode program for every turn (compiled by an earlier case, or here)
    again, _, _ = by_rows(sampler, sampling, seed=7, refill_at=3)
    assert [[t[0] for t in again[b]] for b in range(6)] == [[t[0] for t in got[b]] for b in range(6)]
    assert sampler.compile_counts()["decode"] == refilled
    # a prefill token budget below every row x the chunk's width: the chunks in pieces of 16 slots
    sampler.backend = dataclasses.replace(sampler.backend, prefill_tokens=6 * 16)
    pieces, _, _ = by_rows(sampler, sampling, seed=7)
    assert [[t[0] for t in pieces[b]] for b in range(6)] == [[t[0] for t in got[b]] for b in range(6)]


GUESTS = (23, 8, 41, 16, 5, 30, 12, 19, 27)  # other prompts' lengths (sub-agent prompts, episodes)
GUEST_NEW = 12
GUEST_TURNS = {0: (7,), 3: (5, 9)}  # guests 0 and 3 are episodes: their later turns' chunk lengths


def guest(i):
    rng = np.random.default_rng(500 + i)
    return encode_ids(rng.integers(0, 900, GUESTS[i]).tolist(), 0)


def guest_chunk(i, turn, start):
    rng = np.random.default_rng(700 + 10 * i + turn)
    return encode_ids(rng.integers(0, 900, GUEST_TURNS[i][turn]).tolist(), start, trainable=False)


def guest_alone(sampler, sampling, i):
    """Guest i's turns in calls of its own: generate, then an extend per later turn."""
    out, state = sampler.generate([guest(i)], sampling=sampling, seed=1000 + i, row_ids=[50 + i])
    turns = [(out.tokens[0], out.logprobs[0], bool(out.finished[0]))]
    for turn in range(len(GUEST_TURNS.get(i, ()))):
        out, state = sampler.extend(state, [guest_chunk(i, turn, int(state.chunk_start[0]))], sampling=sampling,
                                    seed=2000 + 10 * i + turn, row_ids=[50 + i])
        turns.append((out.tokens[0], out.logprobs[0], bool(out.finished[0])))
    return turns


@pytest.mark.parametrize("model", ["toy"], indirect=True)  # the main job's model (tiny: the cases above)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_other_prompts_take_the_free_rows(model, temperature):
    """Guest prompts admitted into the rows whose episodes ended and into two spare rows while
    the episodes' turns go on, two of them episodes whose later turns follow (extend_turns):
    each guest's tokens are those of generate (+ extend) over that prompt alone (its seeds and
    stream), and the episodes' turns are unchanged."""
    sampler = sampler_of(model)
    sampling, want = rounds_of(model, sampler, temperature)
    state = sampler.start_turns(prompts(), 2, sampling=sampling, seed=7, reserve=reserve(), refill_at=1,
                                spare_rows=2)
    rows = state.budgets.shape[0]
    assert rows >= 8 and state.num_rows == 6
    decodes = None
    turns, guests, hosts = {b: [] for b in range(6)}, {}, {}
    queue, host_of = list(range(len(GUESTS))), {}
    free = set(range(6, rows))
    overlapped = False
    while True:
        admitted = {}
        while queue and free:
            b, i = min(free), queue.pop(0)
            free.discard(b)
            admitted[b], host_of[b] = guest(i), i
            hosts.setdefault(i, b)
        if admitted:
            overlapped |= bool(state.running[:6].any())
            sampler.admit_turns(state, admitted, budget={b: GUEST_NEW for b in admitted},
                                seed={b: 1000 + host_of[b] for b in admitted},
                                stream={b: 50 + host_of[b] for b in admitted})
        ends = sampler.decode_turns(state)
        if decodes is None:
            decodes = sampler.compile_counts()["decode"]
        if not ends:
            break
        chunks, budgets, seeds = {}, {}, {}
        for end in ends:
            b = end.row
            if b in host_of:  # a guest's turn ended: its next turn, or its row is free again
                i = host_of[b]
                guests.setdefault(i, []).append((end.tokens, end.logprobs, end.finished))
                turn = len(guests[i]) - 1
                if turn < len(GUEST_TURNS.get(i, ())):
                    chunks[b] = guest_chunk(i, turn, int(state.chunk_start()[b]))
                    budgets[b], seeds[b] = GUEST_NEW, 2000 + 10 * i + turn
                else:
                    del host_of[b]
                    free.add(b)
                continue
            turn = len(turns[b])
            turns[b].append((end.tokens, end.logprobs, end.finished))
            if turn < len(TURNS[b]):
                chunks[b] = chunk(b, turn, int(state.chunk_start()[b]))
                budgets[b], seeds[b] = budget_of(b, turn), 7 + turn + 1
            else:
                free.add(b)  # the episode is over: its row takes other work
        sampler.extend_turns(state, chunks, budget=budgets, seed=seeds)
    assert sampler.compile_counts()["decode"] == decodes  # one decode program for turns and guests
    assert sorted(guests) == list(range(len(GUESTS))) and overlapped
    assert {hosts[i] for i in hosts} & set(range(6)) and {hosts[i] for i in hosts} & set(range(6, rows))
    for b in range(6):
        assert [t[0] for t in turns[b]] == [t[0] for t in want[b]], b
        for got, expected in zip(turns[b], want[b]):
            np.testing.assert_allclose(got[1], expected[1], atol=2e-5, rtol=0)
    guest_sampling = sampling.with_budget(GUEST_NEW)
    for i in range(len(GUESTS)):
        alone = guest_alone(sampler, guest_sampling, i)
        assert [t[0] for t in guests[i]] == [t[0] for t in alone], i
        assert [t[2] for t in guests[i]] == [t[2] for t in alone], i
        for got, expected in zip(guests[i], alone):
            np.testing.assert_allclose(got[1], expected[1], atol=2e-5, rtol=0)


def test_bad_turn_arguments_are_refused():
    sampler = sampler_of(init_model(preset("tiny", attention_block=16), seed=5))
    sampling = SamplingParams(max_new_tokens=NEW)
    state = sampler.start_turns(prompts(), 2, sampling=sampling, seed=1, reserve=reserve())
    with pytest.raises(ValueError, match="row 0 has no ended turn"):
        sampler.extend_turns(state, {0: chunk(0, 0, 0)}, budget={0: NEW}, seed={0: 2})
    for row in (0, state.budgets.shape[0]):  # in its first turn; past the rows
        with pytest.raises(ValueError, match=f"admit_turns: row {row} is not a free row"):
            sampler.admit_turns(state, {row: chunk(0, 0, 0)}, budget={row: 4}, seed={row: 1}, stream={row: 1})
    ends = sampler.decode_turns(state)
    b = ends[0].row
    start = int(state.chunk_start()[b])
    with pytest.raises(ValueError, match=f"row {b} chunk starts at position {start + 1}, expected {start}"):
        sampler.extend_turns(state, {b: chunk(0, 0, start + 1)}, budget={b: NEW}, seed={b: 2})
    with pytest.raises(ValueError, match="needs a budget"):
        sampler.extend_turns(state, {b: chunk(0, 0, start)}, budget={}, seed={b: 2})
    with pytest.raises(ValueError, match="exceeds the decode's 32 token columns"):
        sampler.extend_turns(state, {b: chunk(0, 0, start)}, budget={b: 40}, seed={b: 2})
    with pytest.raises(ValueError, match=f"admit_turns: row {b} needs a budget"):
        sampler.admit_turns(state, {b: chunk(0, 0, 0)}, budget={b: 4}, seed={b: 1}, stream={})
    with pytest.raises(ValueError, match="admit_turns: a budget of 40 tokens exceeds"):
        sampler.admit_turns(state, {b: chunk(0, 0, 0)}, budget={b: 40}, seed={b: 1}, stream={b: 1})
    with pytest.raises(ValueError, match="spare_rows=-1"):
        sampler.start_turns(prompts(), sampling=sampling, spare_rows=-1)
    with pytest.raises(ValueError, match="refill_at=-1"):
        sampler.start_turns(prompts(), sampling=sampling, refill_at=-1)
    with pytest.raises(ValueError, match="decode_cache='paged'"):
        sampler_of(init_model(preset("tiny", attention_block=16), seed=5), decode_cache="paged").start_turns(
            prompts(), sampling=sampling)
