"""A tool round's sub-agent prompts in sampler calls of their own against in the free rows of
the episodes' refilled turns (Sampler.admit_turns, rl.rollout.subagent_in_turns), in the same
run, on the same episodes, every turn's and every summary's tokens checked equal.

The episodes are bench/turns.py's (`--prompts` x `--samples` rows, 1 to `--turns` turns, each
later turn after a chunk of `--chunk`/4 to `--chunk` tokens); before a row's later turn, its
`--subagents` sub-agent prompts of `--subagent-prompt`/2 to `--subagent-prompt` tokens each
sample a summary of at most `--subagent-new` tokens (seed 1000 (round + 1), one stream per
call, as the rollout seeds them), and the row's chunk is written once they all ended. Arms:
  round by round           generate; then per round one call of the round's sub-agent
                           prompts and one extend (RolloutLoop.play);
  turns refilled, own calls  start_turns; the sub-agent prompts of the rows that ended together
                           in one call, then their rows' chunks (turn_refill);
  turns refilled, in rows  the sub-agent prompts take the free rows (the rows of ended
                           episodes; then also `--spare` spare rows) and decode beside the other
                           rows' turns, those that find none in one call at once (turn_refill +
                           subagent_in_turns, subagent_spare_rows).
Per arm: seconds (best of `--repeats` after a warm-up that compiles), generated tokens per
second and the decode row-steps (rows x steps of every decode, a row idle or not).

    python bench/subagent_rows.py [--model CHECKPOINT|PRESET] [--prompts 4 --samples 4
        --prompt 300 --turns 3 --chunk 48 --new 128 --mean 32 --subagents 2
        --subagent-prompt 160 --subagent-new 32 --spare 4]
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402
from queued import best_of, load, random_prompts, sampling_parser, speed_rows, stop_ids_for  # noqa: E402


class Episodes:
    """The bench's episodes and sub-agent prompts, and the three arms over them (each returns
    ((every row's turns' tokens, every summary's tokens), decode row-steps))."""

    def __init__(self, args, sampler, rng, vocab: int):
        from paravt_jax.sampling import SamplingParams
        from paravt_jax.text.inputs import encode_ids

        self.args, self.sampler, self.encode_ids = args, sampler, encode_ids
        self.prompts = random_prompts(rng, args.prompts, args.prompt, vocab)
        self.rows = rows = args.prompts * args.samples
        self.chunks = [rng.integers(max(args.chunk // 4, 1), args.chunk + 1, int(rng.integers(0, args.turns))).tolist()
                       for _ in range(rows)]
        self.chunk_ids = [[rng.integers(0, vocab, n).tolist() for n in row] for row in self.chunks]
        # row b's sub-agent prompts before its turn t + 1 (their streams: b * K + k)
        self.subagents = {(b, t): random_prompts(rng, args.subagents, args.subagent_prompt, vocab)
                          for b in range(rows) for t in range(len(self.chunks[b]))}
        self.reserve = [(args.chunk + 16, args.new)] * max(args.turns - 1, 0)
        sampling = SamplingParams(max_new_tokens=args.new, temperature=1.0)
        self.stops = stop_ids_for(sampler, self.prompts, sampling, args.mean)
        self.sampling = SamplingParams(max_new_tokens=args.new, temperature=1.0, stop_ids=self.stops)
        self.summary = self.sampling.with_budget(args.subagent_new)

    def chunk(self, b, turn, start):
        return self.encode_ids(self.chunk_ids[b][turn], start, trainable=False)

    def streams(self, b):
        return [b * self.args.subagents + k for k in range(self.args.subagents)]

    def summaries_of(self, asking, turn, summaries, only=None) -> int:
        """The sub-agent prompts of rows `asking` before their turn `turn` + 1 (`only`: those
        (row, k) of them), in one call."""
        items = [(b, k) for b in asking for k in range(self.args.subagents) if only is None or (b, k) in only]
        out, _ = self.sampler.generate([self.subagents[(b, turn)][k] for b, k in items], sampling=self.summary,
                                       seed=1000 * (turn + 1), row_ids=[self.streams(b)[k] for b, k in items])
        for j, (b, k) in enumerate(items):
            summaries[b, turn, k] = out.tokens[j]
        return out.row_steps

    def by_rounds(self):
        sampler, rows = self.sampler, self.rows
        out, state = sampler.generate(self.prompts, self.args.samples, sampling=self.sampling, seed=1,
                                      reserve=self.reserve)
        turns, summaries = [[out.tokens[b]] for b in range(rows)], {}
        row_steps = out.row_steps
        for turn in range(self.args.turns - 1):
            part = [b for b in range(rows) if len(self.chunks[b]) > turn]
            if not part:
                break
            row_steps += self.summaries_of(part, turn, summaries)
            out, state = sampler.extend(state, [self.chunk(b, turn, int(state.chunk_start[b])) if b in part else None
                                                for b in range(rows)], sampling=self.sampling, seed=2 + turn)
            row_steps += out.row_steps
            for b in part:
                turns[b].append(out.tokens[b])
        return (turns, summaries), row_steps

    def own_calls(self):
        sampler = self.sampler
        state = sampler.start_turns(self.prompts, self.args.samples, sampling=self.sampling, seed=1,
                                    reserve=self.reserve)
        turns, summaries, row_steps = [[] for _ in range(self.rows)], {}, 0
        while ends := sampler.decode_turns(state):
            asking = {}
            for end in ends:
                turns[end.row].append(end.tokens)
                if len(turns[end.row]) <= len(self.chunks[end.row]):
                    asking.setdefault(len(turns[end.row]) - 1, []).append(end.row)
            more, budgets, seeds = {}, {}, {}
            for turn, part in sorted(asking.items()):
                row_steps += self.summaries_of(part, turn, summaries)
                for b in part:
                    more[b] = self.chunk(b, turn, int(state.chunk_start()[b]))
                    budgets[b], seeds[b] = self.args.new, 2 + turn
            sampler.extend_turns(state, more, budget=budgets, seed=seeds)
        return (turns, summaries), row_steps + state.row_steps

    def in_rows(self, spare: int):
        def run():
            sampler, args = self.sampler, self.args
            state = sampler.start_turns(self.prompts, args.samples, sampling=self.sampling, seed=1,
                                        reserve=self.reserve, spare_rows=spare)
            turns, summaries, row_steps = [[] for _ in range(self.rows)], {}, 0
            free, hosts, waiting = set(range(self.rows, state.rows)), {}, {}
            while ends := sampler.decode_turns(state):
                queue, more, budgets, seeds = [], {}, {}, {}

                def summarized(r, t, k, tokens):  # its asking row goes on once all its summaries did
                    summaries[r, t, k] = tokens
                    waiting[r] -= 1
                    if not waiting[r]:
                        more[r] = self.chunk(r, t, int(state.chunk_start()[r]))
                        budgets[r], seeds[r] = args.new, 2 + t

                for end in ends:
                    if end.row in hosts:  # a summary ended: its row is free again
                        free.add(end.row)
                        summarized(*hosts.pop(end.row), end.tokens)
                        continue
                    b = end.row
                    turns[b].append(end.tokens)
                    if len(turns[b]) <= len(self.chunks[b]):
                        queue += [(b, len(turns[b]) - 1, k) for k in range(args.subagents)]
                        waiting[b] = args.subagents
                    else:
                        free.add(b)  # the episode is over: its row takes sub-agent prompts
                admitted = {}
                for b in sorted(free)[:len(queue)]:
                    admitted[b] = hosts[b] = queue.pop(0)
                    free.discard(b)
                if admitted:
                    sampler.admit_turns(state, {b: self.subagents[(r, t)][k] for b, (r, t, k) in admitted.items()},
                                        budget={b: args.subagent_new for b in admitted},
                                        seed={b: 1000 * (t + 1) for b, (_, t, _) in admitted.items()},
                                        stream={b: self.streams(r)[k] for b, (r, _, k) in admitted.items()})
                for turn in sorted({t for _, t, _ in queue}):  # no free row left: a call of their own
                    part = sorted({r for r, t, _ in queue if t == turn})
                    got = {}
                    row_steps += self.summaries_of(part, turn, got, {(r, k) for r, t, k in queue if t == turn})
                    for (r, t, k), tokens in got.items():
                        summarized(r, t, k, tokens)
                sampler.extend_turns(state, more, budget=budgets, seed=seeds)
            return (turns, summaries), row_steps + state.row_steps
        return run


def main():
    parser = sampling_parser(prompts=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=48)
    parser.add_argument("--subagents", type=int, default=2, help="sub-agent prompts before each later turn")
    parser.add_argument("--subagent-prompt", type=int, default=160)
    parser.add_argument("--subagent-new", type=int, default=32)
    parser.add_argument("--spare", type=int, default=4, help="spare rows of the turns' decode")
    args = parser.parse_args()
    if args.subagent_new > args.new:
        parser.error(f"--subagent-new={args.subagent_new} must not exceed --new={args.new}")

    from paravt_jax.sampling import Sampler, SamplerConfig

    print(f"machine: {machine()}")
    model = load(args.model)
    episodes = Episodes(args, Sampler(model, SamplerConfig()), np.random.default_rng(0),
                        min(model.config.text.vocab_size, 900))
    arms = {"round by round (generate, sub-agent call, extend)": episodes.by_rounds,
            "turns refilled, sub-agents in calls of their own": episodes.own_calls,
            "turns refilled, sub-agents in the turns' free rows": episodes.in_rows(0)}
    if args.spare:
        arms[f"turns refilled, sub-agents in the free rows and {args.spare} spare"] = episodes.in_rows(args.spare)
    results = best_of(arms, args.repeats)
    turns, summaries = results[next(iter(arms))][1]
    generated = sum(len(t) for row in turns for t in row) + sum(len(s) for s in summaries.values())
    table = speed_rows(results, generated, "round by round")
    lengths = np.array([len(s) for s in summaries.values()] or [0])
    print(f"{args.prompts} prompts x {args.samples} samples ({episodes.rows} rows) of {args.prompt // 2}-"
          f"{args.prompt} tokens, {sum(len(c) + 1 for c in episodes.chunks)} turns ({args.turns} at most a row), "
          f"budget {args.new}; {len(summaries)} sub-agent prompts of {args.subagent_prompt // 2}-"
          f"{args.subagent_prompt} tokens ({args.subagents} before each later turn), summaries of "
          f"{lengths.min()}-{lengths.max()} tokens (budget {args.subagent_new}); stop ids {list(episodes.stops)}; "
          f"{generated:,} tokens in all, the same in every arm")
    print_table("sub-agent prompts: in the turns' rows vs in calls of their own",
                ["arm", "seconds", "tokens/s", "decode row-steps", "speed-up"], table)


if __name__ == "__main__":
    main()
