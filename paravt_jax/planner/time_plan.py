"""A lower bound on the time of one PARA-GRPO step, from the compiled programs' cost analyses.

Each program of planner/programs.py carries XLA's `cost_analysis()` per device (FLOPs, HBM
bytes accessed), the bytes its collectives move (planner/memory.py `collective_bytes`) and the
forward FLOPs / bytes of the attention calls XLA cannot see (fused splash / cuDNN kernels, the
loop of blockwise attention: attention.AttentionCall). One call of a program takes at least

    max(FLOPs / peak bf16 FLOP/s, bytes / HBM bandwidth, collective bytes / interconnect bandwidth)

(perfect overlap of compute, memory and communication: a bound, not a prediction). A step runs
each program the number of times the recipe does (`step_calls`): the prompt prefill per row
group, the tool-response prefill per text piece and row group, the sub-agent prefill and decode
per call of `rl.shapes.subagent_rows` rows, each vision tower with its prefill's row groups, a
decode step per generated token of every turn (XLA counts a loop body once, so a decode
program's cost is one step), the log-prob passes (the reference's when kl_ctl > 0, the proximal
policy's under rl.step.prox_logprobs="recompute") and the gradients per micro-batch, one
optimizer update and one weight refresh. Host work
(video decoding of crops, tokenization, the reward) is not counted.

Bytes are the optimised HLO's by the physical rule where the program carries that count
(ProgramMemory.physical_bytes, planner/hlo_counts.py: each instruction reads its operands once
and writes its output once, slices and in-place updates at their sizes, loops of known trip
count every run), else the cost analysis' (whose figure the table prints beside it).
A decode step's attention, and a tool-response prefill piece's, is counted at the rollout's mean
fill of the KV cache, not its reserved capacity (planner/decode_reads.py).

Attention kernels' FLOPs are added analytically (forward: 4 x rows x heads x head_dim x queries
x keys, halved for causal self-attention; a gradient pass: forward + 2.5 x forward for the
backward (dq, dk, dv and the recomputed scores) + one more forward with remat), divided over the
devices the way the program splits rows (the micro-batch over data x fsdp, a decode's and a
prefill's cache rows over their row blocks, heads over tensor).
"""
from __future__ import annotations

import dataclasses
import math

from paravt_jax.planner.decode_reads import decode_reads

# Peak dense bf16 FLOP/s, HBM bandwidth and per-chip interconnect bandwidth (one direction) of
# each accelerator, from the vendors' published specifications:
#   TPU v4:  275 TFLOP/s, 1,228 GB/s HBM, ICI 2,400 Gbit/s   cloud.google.com/tpu/docs/v4
#   TPU v5e: 197 TFLOP/s,   819 GB/s HBM, ICI 1,600 Gbit/s   cloud.google.com/tpu/docs/v5e
#   TPU v5p: 459 TFLOP/s, 2,765 GB/s HBM, ICI 4,800 Gbit/s   cloud.google.com/tpu/docs/v5p
#   TPU v6e: 918 TFLOP/s, 1,640 GB/s HBM, ICI 3,584 Gbit/s   cloud.google.com/tpu/docs/v6e
#   H100 SXM: 989 TFLOP/s dense, 3.35 TB/s HBM3, NVLink 900 GB/s (450 GB/s each way)
#             nvidia.com/en-us/data-center/h100 (datasheet)
#   H200 SXM: 989 TFLOP/s dense, 4.8 TB/s HBM3e, NVLink 900 GB/s  nvidia.com/en-us/data-center/h200
#   A100 80GB SXM: 312 TFLOP/s, 2,039 GB/s HBM2e, NVLink 600 GB/s  nvidia.com/en-us/data-center/a100
# GPU hosts past one NVLink domain (gpu16*) cross InfiniBand for the data axis; the bound uses
# the NVLink figure for every collective (the data-axis all-reduce over DCN is not separated).


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    flops: float  # peak dense bf16 FLOP/s
    hbm_bytes_per_s: float
    interconnect_bytes_per_s: float  # per chip, one direction


CHIPS = {
    "v4": Chip("v4", 275e12, 1228e9, 2400e9 / 8),
    "v5e": Chip("v5e", 197e12, 819e9, 1600e9 / 8),
    "v5p": Chip("v5p", 459e12, 2765e9, 4800e9 / 8),
    "v6e": Chip("v6e", 918e12, 1640e9, 3584e9 / 8),
    "h100": Chip("h100", 989e12, 3.35e12, 450e9),
    "h200": Chip("h200", 989e12, 4.8e12, 450e9),
    "a100": Chip("a100", 312e12, 2.039e12, 300e9),
}
# The reference's reported cost: about 250 s per PARA-GRPO step on 8 x 80 GB GPUs (7 training
# ranks and 1 serving the rollouts).
REFERENCE_STEP_SECONDS = 250.0
REFERENCE_SETUP = "8 x 80 GB GPUs (7 training, 1 serving rollouts)"
BACKWARD_FACTOR = 2.5  # backward attention FLOPs per forward (dq, dk, dv, recomputed scores)
# the sampler's prefills and the SamplerLayout field of their rows
PREFILLS = {"first prompt prefill": "prompt_rows", "tool-response prefill": "rows",
            "sub-agent prefill": "subagent_rows"}


@dataclasses.dataclass(frozen=True)
class PhaseTime:
    """One program's share of an RL step: `calls` runs of `flops` / `bytes` / `collective_bytes`
    per device each (kernel attention included)."""
    name: str
    stage: str  # rollout | log-probs | gradients | update | refresh
    calls: float
    flops: float
    bytes: float
    collective_bytes: float
    kernel_flops: float  # the analytic attention part of `flops`
    compute_seconds: float
    memory_seconds: float
    network_seconds: float
    kv_read: str = ""  # a decode's or the tool-response prefill's: what its attention counts (DecodeRead.describe)
    cost_analysis_bytes: float = 0.0  # the compiler's cost analysis' bytes per call (before the physical rule)

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds, self.network_seconds)

    @property
    def bound(self) -> str:
        return max((("compute", self.compute_seconds), ("memory", self.memory_seconds),
                    ("network", self.network_seconds)), key=lambda x: x[1])[0]


@dataclasses.dataclass(frozen=True)
class TimePlan:
    chip: str
    compiler: str
    phases: tuple[PhaseTime, ...]
    notes: tuple[str, ...] = ()
    split: SplitPlan | None = None  # the same step on split meshes (split_plan)
    # where the programs' FLOPs and bytes come from: "<compiler>'s cost_analysis", or XLA:CPU's
    # cost analysis of the compiler's optimised modules (XLA:GPU without a device has none)
    costs: str = ""

    @property
    def step_seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    def stage_seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.phases:
            out[p.stage] = out.get(p.stage, 0.0) + p.seconds
        return out

    @property
    def bounding(self) -> PhaseTime:
        return max(self.phases, key=lambda p: p.seconds)

    def to_json(self) -> dict:
        return dict(chip=self.chip, compiler=self.compiler, costs=self.costs, step_seconds=self.step_seconds,
                    stages=self.stage_seconds(), bounding_phase=self.bounding.name,
                    reference_step_seconds=REFERENCE_STEP_SECONDS, reference_setup=REFERENCE_SETUP,
                    phases=[dict(dataclasses.asdict(p), seconds=p.seconds, bound=p.bound) for p in self.phases],
                    notes=list(self.notes), split=self.split.to_json() if self.split else None)


def step_calls(rl, work, layout, layers: int = 1) -> dict[str, tuple[str, float]]:
    """program name -> (stage, runs per RL step) for the recipe's workload, before the prefills'
    row groups (`time_plan` multiplies a prefill and its vision tower by its row groups); `layers`:
    the decoder's (the weight refresh runs once per layer)."""
    from paravt_jax.infra.buckets import bucket

    r = rl.rollout
    rounds = r.max_turns if work.calls_per_turn else 0
    turns = rounds + 1
    # log-prob passes per micro-batch: the reference's (the KL term), and the proximal policy's
    # when it is not read from the gradient pass (rl.step.prox_logprobs)
    passes = (1 if rl.advantage.kl_ctl > 0 else 0) + (1 if rl.step.prox_logprobs == "recompute" else 0)
    steps = bucket(r.max_new_tokens, 16)
    pieces = layout.extend_pieces if layout else 1
    sub_calls = layout.subagent_calls if layout else 1
    calls = {
        "first prompt prefill": ("rollout", 1.0),
        "tool-response prefill": ("rollout", float(rounds * pieces)),
        "sub-agent prefill": ("rollout", float(rounds * sub_calls)),
        "decode": ("rollout", float(turns * steps)),
        "sub-agent decode": ("rollout", float(rounds * sub_calls * bucket(r.subagent_max_tokens, 16))),
        "vision tower (first prompt prefill)": ("rollout", 1.0),
        "vision tower (tool-response prefill)": ("rollout", float(rounds)),
        "vision tower (sub-agent prefill)": ("rollout", float(rounds * sub_calls)),
        "log-probs": ("log-probs", float(passes * work.micro_batches)),
        "gradients": ("gradients", float(work.micro_batches)),
        "optimizer update": ("update", 1.0),
        "weight refresh": ("refresh", float(layers)),  # one layer a call
    }
    return calls


def _kernel_share(program, work, mesh: dict, rows_per_device: int, config) -> tuple[float, float]:
    """(FLOPs, bytes) per device of one call's attention kernels that XLA did not count."""
    from paravt_jax.train.batch import vision_shard_count  # here: this module imports no jax at load

    tensor = mesh.get("tensor", 1)
    heads = config.text.num_attention_heads
    head_split = tensor if heads % tensor == 0 else 1
    batch = mesh.get("data", 1) * mesh.get("fsdp", 1)
    # a sampler's vision tower: each shard of rows on its own devices (Sampler.vision_inputs),
    # or every frame of the row group on every device (1)
    vision_split = program.vision_shards
    if program.name in ("gradients", "log-probs"):
        row_split = max(work.micro_batch_rows // max(rows_per_device, 1), 1)
        # a micro-batch's frames in one shard per batch device (train/batch.py shard_vision)
        vision_split = vision_shard_count(batch, work.micro_batch_rows)
    elif "decode" in program.name:  # the cache rows are split over the batch axes (kv_cache.cache_sharding)
        row_split = batch if program.group_rows % batch == 0 else 1
    else:  # a prefill: the matmuls as XLA counts them (each device its own rows where the prefill
        # splits them, sampling/prefill.row_split, else all of the group's tokens against its share
        # of the weights), the attention on each device's block of the group's cache rows and their
        # prompts (ProgramMemory.row_shards: the compiled loop's rows are the block's)
        row_split = program.row_shards
    factor = 1.0
    if program.name == "gradients":
        factor = 1.0 + BACKWARD_FACTOR + (1.0 if config.remat else 0.0)
    text = (program.kernel_text_flops, program.kernel_text_bytes)
    vision = (program.kernel_vision_flops, program.kernel_vision_bytes)
    return tuple(factor * (t / (row_split * head_split) + v / vision_split) for t, v in zip(text, vision))


def time_plan(programs, rl, work, layout, config, chip: str, mesh: dict | None = None,
              rows_per_device: int | None = None) -> TimePlan:
    """The lower-bound time of one RL step on `chip` (a CHIPS key) from `programs` (ProgramSet)."""
    if chip not in CHIPS:
        raise ValueError(f"no peak numbers for chip {chip!r}; known: {', '.join(CHIPS)}")
    peak = CHIPS[chip]
    mesh = mesh or {}
    rows_per_device = rows_per_device or work.micro_batch_rows
    calls = step_calls(rl, work, layout, config.text.num_hidden_layers)
    reads = decode_reads(rl, work, layout, config, programs.sampler) if layout is not None else {}
    phases = []
    for program in programs.trainer + programs.sampler:
        stage, count = calls.get(program.name, ("rollout", 1.0))
        if count == 0:
            continue
        prefill = program.name.removeprefix("vision tower (").removesuffix(")")
        if prefill in PREFILLS and layout is not None:  # a prefill (and its vision tower) per row group
            rows = getattr(layout, PREFILLS[prefill])
            group = programs.find(prefill)
            count *= math.ceil(rows / max(group.group_rows if group else rows, 1))
        read = reads.get(program.name)
        if read is not None:  # the keys a call reads at the rollout's mean fill, not the static length
            program = dataclasses.replace(program, kernel_text_flops=read.flops, kernel_text_bytes=read.bytes)
        kernel_flops, kernel_bytes = _kernel_share(program, work, mesh, rows_per_device, config)
        # bytes by the physical rule where the program was counted so (ProgramMemory.physical_bytes)
        flops = program.flops + kernel_flops
        size = (program.physical_bytes or program.bytes_accessed) + kernel_bytes
        phases.append(PhaseTime(
            program.name, stage, count, flops, size, program.collective_bytes, kernel_flops,
            count * flops / peak.flops, count * size / peak.hbm_bytes_per_s,
            count * program.collective_bytes / peak.interconnect_bytes_per_s,
            kv_read=read.describe() if read is not None else "", cost_analysis_bytes=program.bytes_accessed))
    notes = (f"{peak.name}: {peak.flops / 1e12:.0f} TFLOP/s bf16, {peak.hbm_bytes_per_s / 1e9:,.0f} GB/s HBM, "
             f"{peak.interconnect_bytes_per_s / 1e9:,.0f} GB/s interconnect per chip",
             "each phase: max(compute, memory, network) per call x calls per step; host work (crops' video "
             "decoding, tokenization, rewards) not counted",
             "GB/call: the optimised HLO by the physical rule (slices and in-place updates at their sizes, loops "
             "every run; planner/hlo_counts.py) + attention analytically; XLA GB: the cost analysis' own bytes")
    return TimePlan(peak.name, programs.compiler, tuple(phases), notes, costs=cost_sources(programs))


def cost_sources(programs) -> str:
    """Where a ProgramSet's FLOPs and bytes come from, in words (ProgramMemory.cost_source)."""
    from paravt_jax.planner.memory import MODULE_COSTS

    sources = sorted({p.cost_source or programs.compiler for p in programs.trainer + programs.sampler})
    return "; ".join(f"XLA:CPU's cost analysis of {programs.compiler}'s optimised modules" if s == MODULE_COSTS
                     else f"{s}'s cost_analysis" for s in sources)


def format_time_plan(plan: TimePlan) -> list[str]:
    costs = plan.costs or f"{plan.compiler}'s cost_analysis"
    lines = ["", f"TIME PLAN: one RL step, lower bound on {plan.chip} (costs from {costs} + attention kernels "
                 "analytically)",
             f"  {'program':<38}{'stage':<11}{'calls':>7}{'TFLOP/call':>12}{'GB/call':>9}{'XLA GB':>9}"
             f"{'coll GB':>9}{'seconds':>10}  bound"]
    for p in plan.phases:
        lines.append(f"  {p.name:<38}{p.stage:<11}{p.calls:>7g}{p.flops / 1e12:>12.3f}{p.bytes / 1e9:>9.2f}"
                     f"{p.cost_analysis_bytes / 1e9:>9.2f}{p.collective_bytes / 1e9:>9.2f}{p.seconds:>10.3f}  "
                     f"{p.bound}")
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in plan.stage_seconds().items())
    lines += [f"  {p.kv_read}" for p in plan.phases if p.kv_read]
    lines += [f"  step >= {plan.step_seconds:.2f} s ({stages})",
              f"  bounded by: {plan.bounding.name} ({plan.bounding.seconds:.2f} s, {plan.bounding.bound})",
              f"  reference: about {REFERENCE_STEP_SECONDS:.0f} s per step on {REFERENCE_SETUP} (reported, measured)"]
    lines += [f"  note: {n}" for n in plan.notes]
    if plan.split is not None:
        lines += format_split_plan(plan.split)
    return lines


# ----------------------------------------------------------------------------- split meshes
ROLLOUT_STAGES = ("rollout", "refresh")  # the sampler's side of a split run; the rest trains
SPLIT_HEADROOM = 0.10  # a division fits when each side leaves this share of the device's memory


@dataclasses.dataclass(frozen=True)
class Division:
    """One way to place the rollouts of an asynchronous run (mesh.rollout_devices =
    rollout_devices; 0: on the training devices, shared) and its estimate."""
    rollout_devices: int
    train_devices: int
    rollout_seconds: float  # the rollout stages spread over rollout_devices (shared: all of them)
    train_seconds: float  # the training stages spread over train_devices
    transfer_seconds: float  # publishing the weights across the meshes, on the trainer's side
    trainer_bytes: int  # per training device (shared: both sides at once)
    rollout_bytes: int  # per rollout device, with the next weights arriving (shared: as trainer_bytes)
    device_memory_bytes: int

    @property
    def shared(self) -> bool:
        return self.rollout_devices == 0

    @property
    def step_seconds(self) -> float:
        """A pipelined step (max_staleness >= 1): the slower side; on shared devices the two
        add up (the bound counts device time, which they split)."""
        if self.shared:
            return self.rollout_seconds + self.train_seconds
        return max(self.rollout_seconds, self.train_seconds + self.transfer_seconds)

    @property
    def fits(self) -> bool:
        """Both sides within SPLIT_HEADROOM of the device's memory."""
        return max(self.trainer_bytes, self.rollout_bytes) <= (1 - SPLIT_HEADROOM) * self.device_memory_bytes

    @property
    def bound(self) -> str:
        if self.shared:
            return "shared"
        return "rollout" if self.rollout_seconds >= self.train_seconds + self.transfer_seconds else "training"


@dataclasses.dataclass(frozen=True)
class SideBytes:
    """A side's per-device bytes on the colocated mesh: `spread` grows as N / its devices
    (parameters, gradients, optimizer state, the reference, the sampler's weight copies and KV
    caches), `fixed` does not (a micro-batch's inputs and activations when the micro-batch keeps
    its rows per device, a prefill group's working set, generated code)."""
    spread: int
    fixed: int

    def on(self, devices: int, own: int) -> int:
        return int(self.spread * devices / own) + self.fixed


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """Where an asynchronous run's rollouts go: on the training devices (shared, the first
    division) or on devices of their own, scaled from the colocated programs: a side's seconds
    grow as N / its devices (its share of the work spread over fewer devices), its per-device
    bytes as SideBytes says; shared, every device holds the trainer's step and a sampler at
    once. In this bound the device seconds are conserved, so no placement beats the
    synchronous step, and a split at best matches it (at the division that balances the sides);
    what asynchrony buys lies outside the bound (host work and the decode's long tail
    overlapped with training). A first-order estimate, not a compile of the split meshes."""
    devices: int
    colocated_seconds: float  # the synchronous colocated step
    divisions: tuple[Division, ...]
    given: int  # the config's mesh.rollout_devices

    @property
    def best(self) -> Division | None:
        """The fastest placement that fits (shared first among equals)."""
        fitting = [d for d in self.divisions if d.fits]
        return min(fitting, key=lambda d: (d.step_seconds, d.rollout_devices)) if fitting else None

    def to_json(self) -> dict:
        best = self.best
        return dict(devices=self.devices, colocated_step_seconds=self.colocated_seconds, given=self.given,
                    suggested=best.rollout_devices if best else None,
                    divisions=[dict(dataclasses.asdict(d), step_seconds=d.step_seconds, fits=d.fits, bound=d.bound,
                                    speedup=self.colocated_seconds / d.step_seconds if d.step_seconds else None)
                               for d in self.divisions])


def divisions(devices: int) -> list[int]:
    """The rollout device counts R for which both sides divide the devices (R | N and N - R | N):
    the model's power-of-two dimensions then shard evenly on both meshes, where a side of, say,
    6 or 7 devices would replicate every dimension it does not divide. For N a power of two
    that is the even split."""
    return [r for r in range(1, devices) if devices % r == 0 and devices % (devices - r) == 0]


def split_plan(plan: TimePlan, devices: int, trainer: SideBytes, rollout: SideBytes, param_bytes: int,
               device_memory_bytes: int, given: int = 0) -> SplitPlan:
    """`plan` (colocated, on `devices`) re-estimated for rollouts on the training devices and on
    every division of the devices; see SplitPlan. trainer / rollout: the colocated plan's
    per-device memory of the trainer and of a rollout on its own (its own weights: the policy
    copy); param_bytes: the whole model's parameters (the copy that crosses to the rollout
    side, one shard a rollout device, over the interconnect, and held there beside the weights
    being sampled while it arrives)."""
    stages = plan.stage_seconds()
    sampling = sum(v for k, v in stages.items() if k in ROLLOUT_STAGES)
    train = sum(v for k, v in stages.items() if k not in ROLLOUT_STAGES)
    link = CHIPS[plan.chip].interconnect_bytes_per_s
    both = trainer.on(devices, devices) + rollout.on(devices, devices) + int(param_bytes / devices)
    out = [Division(0, devices, sampling, train, 0.0, both, both, device_memory_bytes)]
    for r in sorted(set(divisions(devices)) | ({given} if 0 < given < devices else set())):
        t = devices - r
        shard = param_bytes / min(r, t)  # the larger of a sender's and a receiver's share
        out.append(Division(r, t, sampling * devices / r, train * devices / t, shard / link,
                            trainer.on(devices, t), rollout.on(devices, r) + int(param_bytes / r),
                            device_memory_bytes))
    return SplitPlan(devices, plan.step_seconds, tuple(out), given)


def format_split_plan(split: SplitPlan) -> list[str]:
    lines = ["", f"ASYNCHRONOUS ROLLOUTS (rl.max_staleness >= 1): on the training devices (0) or on "
                 f"mesh.rollout_devices of the {split.devices}, scaled from the colocated programs (first order, "
                 "not compiled)",
             f"  {'rollout':>8}{'train':>7}{'rollout s':>11}{'train s':>9}{'copy s':>8}{'step s':>9}{'vs sync':>9}"
             f"{'trainer GiB':>13}{'rollout GiB':>13}  fits"]
    for d in split.divisions:
        mark = "  <- config" if d.rollout_devices == split.given else ""
        speedup = split.colocated_seconds / d.step_seconds
        lines.append(f"  {d.rollout_devices:>8}{d.train_devices:>7}{d.rollout_seconds:>11.2f}{d.train_seconds:>9.2f}"
                     f"{d.transfer_seconds:>8.2f}{d.step_seconds:>9.2f}{speedup:>8.2f}x"
                     f"{d.trainer_bytes / 2**30:>13.2f}{d.rollout_bytes / 2**30:>13.2f}  "
                     f"{'yes' if d.fits else 'NO'} ({d.bound}){mark}")
    best = split.best
    lines.append(f"  synchronous, colocated: {split.colocated_seconds:.2f} s per step; "
                 + (f"suggested: mesh.rollout_devices={best.rollout_devices} ({best.step_seconds:.2f} s)" if best else
                    f"no placement fits with {SPLIT_HEADROOM:.0%} headroom: stay synchronous"))
    lines.append("  note: a side's time scales as N / its devices, and so do its weights, optimizer state and KV "
                 "caches per device (the micro-batch keeps its rows per device: rl.max_tokens_per_micro_batch x "
                 "train / N); a rollout side also holds the next weights while they arrive; shared (0), every "
                 "device holds the trainer's step and a sampler with its own weights at once")
    lines.append("  note: device seconds are conserved in this bound: no placement beats the synchronous step, a "
                 "split at best matches it; asynchrony's gain lies in what the bound leaves out: host work (crops, "
                 "rewards, a judge) and the decode's long tail overlapped with training")
    return lines
