"""Episodes' turns round by round (generate, then one extend per round: every row of a round
waits for its longest turn) against rows refilled turn by turn (Sampler.start_turns: a row's
next turn starts as soon as its turn ends and its chunk is written), in the same run, on the same
episodes, every turn's tokens checked equal.

`--prompts` prompts of `--prompt`/2 to `--prompt` tokens, `--samples` rows each; each row runs 1
to `--turns` turns, its later turns each after a chunk of `--chunk`/4 to `--chunk` tokens (its
tool responses). Sampled at temperature 1 with a budget of `--new` tokens and stop ids drawn
from the model's own most frequent tokens so that turns end after about `--mean` tokens. Per
arm: seconds (best of `--repeats` after a warm-up that compiles), generated tokens per second
and the decode row-steps (rows x steps of each decode, a row idle or not).

    python bench/turns.py [--model CHECKPOINT|PRESET] [--prompts 4 --samples 4 --prompt 300
        --turns 3 --chunk 48 --new 128 --mean 32]

The model: the toy main job's trained checkpoint (notebooks/assets/toy_paragrpo); a preset name
runs it randomly initialised.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402
from queued import best_of, load, random_prompts, sampling_parser, speed_rows, stop_ids_for  # noqa: E402


def main():
    parser = sampling_parser(prompts=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=48)
    args = parser.parse_args()

    from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
    from paravt_jax.text.inputs import encode_ids

    print(f"machine: {machine()}")
    model = load(args.model)
    rng = np.random.default_rng(0)
    vocab = min(model.config.text.vocab_size, 900)
    prompts = random_prompts(rng, args.prompts, args.prompt, vocab)
    rows = args.prompts * args.samples
    # each row's later turns: the length of the chunk before each
    chunks = [rng.integers(max(args.chunk // 4, 1), args.chunk + 1, int(rng.integers(0, args.turns))).tolist()
              for _ in range(rows)]
    chunk_ids = [[rng.integers(0, vocab, n).tolist() for n in row] for row in chunks]
    reserve = [(args.chunk + 16, args.new)] * max(args.turns - 1, 0)
    sampler = Sampler(model, SamplerConfig())
    sampling = SamplingParams(max_new_tokens=args.new, temperature=1.0)
    stops = stop_ids_for(sampler, prompts, sampling, args.mean)
    sampling = SamplingParams(max_new_tokens=args.new, temperature=1.0, stop_ids=stops)

    def chunk(b, turn, start):
        return encode_ids(chunk_ids[b][turn], start, trainable=False)

    def by_rounds():
        out, state = sampler.generate(prompts, args.samples, sampling=sampling, seed=1, reserve=reserve)
        turns = [[out.tokens[b]] for b in range(rows)]
        row_steps = out.row_steps
        for turn in range(args.turns - 1):
            part = [b for b in range(rows) if len(chunks[b]) > turn]
            if not part:
                break
            out, state = sampler.extend(state, [chunk(b, turn, int(state.chunk_start[b])) if b in part else None
                                                for b in range(rows)], sampling=sampling, seed=2 + turn)
            row_steps += out.row_steps
            for b in part:
                turns[b].append(out.tokens[b])
        return turns, row_steps

    def by_rows(refill_at):
        def run():
            state = sampler.start_turns(prompts, args.samples, sampling=sampling, seed=1, reserve=reserve,
                                        refill_at=refill_at)
            turns = [[] for _ in range(rows)]
            while ends := sampler.decode_turns(state):
                more, budgets, seeds = {}, {}, {}
                for end in ends:
                    b, turn = end.row, len(turns[end.row])
                    turns[b].append(end.tokens)
                    if turn < len(chunks[b]):
                        more[b] = chunk(b, turn, int(state.chunk_start()[b]))
                        budgets[b], seeds[b] = args.new, 2 + turn
                sampler.extend_turns(state, more, budget=budgets, seed=seeds)
            return turns, state.row_steps
        return run

    arms = {"round by round (generate + extend)": by_rounds,
            "rows refilled turn by turn, one row at a time": by_rows(1),
            f"rows refilled, {max(rows // 4, 1)} rows at a time (the default)": by_rows(0)}
    results = best_of(arms, args.repeats)
    first = next(iter(arms))
    reference = results[first][1]
    generated = sum(len(t) for row in reference for t in row)
    lengths = np.array([len(t) for row in reference for t in row])
    table = speed_rows(results, generated, "round by round")
    print(f"{args.prompts} prompts x {args.samples} samples ({rows} rows) of {args.prompt // 2}-{args.prompt} "
          f"tokens, {sum(len(c) + 1 for c in chunks)} turns ({args.turns} at most a row), chunks of "
          f"{max(args.chunk // 4, 1)}-{args.chunk} tokens, budget {args.new}, stop ids {list(stops)}: turns of "
          f"{lengths.min()}-{lengths.max()} tokens (mean {lengths.mean():.1f}, {generated:,} in all); the same "
          f"tokens in every arm")
    print_table("episodes' turns: rows refilled turn by turn vs round by round",
                ["arm", "seconds", "tokens/s", "decode row-steps", "speed-up"], table)


if __name__ == "__main__":
    main()
