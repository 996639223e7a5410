"""The functional, sharded train step, shared by every objective (SFT, PARA-GRPO).

`TrainStep(model, optimizer, loss_fn, head)` builds the jitted pieces once:
  logprobs(params, batch)  — the token head: [B, T] log-probs under softmax(logits / T),
                             computed from hidden states in sequence chunks so that the
                             [B, T, vocab] logits never exist at once, in the forward or
                             the backward pass (`token_scores`);
  grads(params, batch)     — the loss sums/counts and gradients of one micro-batch;
  apply(state, grads, n)   — optax update, donated state, explicit shardings.
The objective is the function passed in: `loss_fn(scores, batch) -> (loss_sum, token_count,
metrics)`, where `scores` holds the head's per-token log-probs (and entropies, when the head
computes them) and `batch` the micro-batch's arrays with its per-token extras by name. The
loss returns SUMS and COUNTS (see paravt_jax.rl.loss): `step(state, micro_batches)` adds the
micro-batch gradients exactly (sums / total token count) and skips the update when the loss
or the gradients are not finite.

`concurrent` > 1 runs that many micro-batches' passes at once on host threads (`passes`). On a
CPU the programs of a small model leave cores idle between their operations (the toy's
gradient passes use ~1.6 of 2 cores), and several at once fill them; each program computes
what it would alone, and the sums are taken in the micro-batches' order, so the results are
the same bits (tests/integration/test_train_step.py, bench/rl_step.py). An accelerator runs
one program at a time: leave it at 1 there.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from paravt_jax import config as C
from paravt_jax.config import checked, integer, non_negative, one_of, positive, strings, validate
from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.fused_attention import kernel_mesh
from paravt_jax.train import stats as S
from paravt_jax.train.batch import TrainBatch

OPTIMIZERS = ("adamw", "adam")
SCHEDULES = ("constant", "cosine", "wsd")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = checked("adamw", one_of(OPTIMIZERS))
    learning_rate: float = checked(2e-6, positive())
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = checked(0.01, non_negative())
    grad_clip: float = checked(1.0, non_negative())
    warmup_steps: int = checked(0, integer(0))
    schedule: str = checked("constant", one_of(SCHEDULES))
    total_steps: int = checked(1000, integer(1))  # the cosine and wsd schedules' length
    # wsd (warm-up, stable, decay): the rate falls linearly to 0 over the last `decay_steps`
    # of `total_steps`, constant before them
    decay_steps: int = checked(0, integer(0))
    # parameters that never change: dotted path prefixes of the model's parameters, e.g.
    # ("visual",) for the whole vision tower, ("language.embed_tokens",) for one array
    frozen: tuple[str, ...] = checked((), strings())

    def __post_init__(self):
        validate(self)
        if self.schedule == "wsd" and not 0 < self.decay_steps <= self.total_steps - self.warmup_steps:
            raise C.ConfigValueError(problems=[C.Problem(
                "decay_steps", f"={self.decay_steps}: the wsd schedule decays over 1 to total_steps - warmup_steps "
                f"= {self.total_steps - self.warmup_steps} steps")])


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """The token head: log-probs (and optionally entropies) of softmax(logits / temperature)."""
    temperature: float = 1.0  # RL: the sampler's temperature
    chunk: int = 512  # sequence chunk for the lm head + log-softmax
    entropy: bool = False  # also the per-token entropy (a metric; costs one more vocab pass)


class TokenScores(NamedTuple):
    """What the head gives a loss: [B, T] log p(token t | tokens < t) (0 at t = 0), and the
    entropy of that predictive distribution [B, T] (zeros when the head skips it)."""
    logp: jax.Array
    entropy: jax.Array


# loss_fn(scores, batch) -> (loss_sum, token_count, {name: WeightedMean | RunningMax})
LossFn = Callable[[TokenScores, Mapping[str, Any]], tuple[jax.Array, jax.Array, dict]]


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    if cfg.schedule == "cosine":  # the names are checked by OptimizerConfig
        schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1),
                                                      max(cfg.total_steps, cfg.warmup_steps + 1))
    elif cfg.schedule == "wsd":  # decay_steps is checked against total_steps by OptimizerConfig
        decay = optax.linear_schedule(cfg.learning_rate, 0.0, cfg.decay_steps)
        schedule = optax.join_schedules([optax.constant_schedule(cfg.learning_rate), decay],
                                        [cfg.total_steps - cfg.decay_steps - cfg.warmup_steps])
    else:
        schedule = optax.constant_schedule(cfg.learning_rate)
    if cfg.warmup_steps and cfg.schedule in ("constant", "wsd"):
        schedule = optax.join_schedules([optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps),
                                         schedule], [cfg.warmup_steps])
    if cfg.name == "adamw":
        opt = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    else:
        opt = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), opt)
    if not cfg.frozen:
        return tx
    labels = lambda params: jax.tree.map(lambda f: "frozen" if f else "trained", frozen_mask(params, cfg.frozen))
    # the trained parameters' gradients are clipped by their own global norm
    return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)


def frozen_mask(params, frozen: Sequence[str]):
    """A tree of bools like `params`: True where the parameter's dotted path is one of the
    `frozen` prefixes or lies under one. A prefix that names no parameter is refused."""
    paths = [parameter_path(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)]
    under = lambda path, prefix: path == prefix or path.startswith(prefix + ".")
    unmatched = [f for f in frozen if not any(under(p, f) for p in paths)]
    if unmatched:
        raise ValueError(f"optimizer.frozen {unmatched}: no parameter path starts so (paths look like {paths[0]!r})")
    return jax.tree_util.tree_map_with_path(lambda path, _: any(under(parameter_path(path), f) for f in frozen),
                                            params)


def tower_frozen(params, frozen: Sequence[str]) -> bool:
    """Whether every parameter of the vision tower (`visual...`) is among the `frozen` ones."""
    if not frozen:
        return False
    mask = frozen_mask(params, frozen)
    flags = [f for path, f in jax.tree_util.tree_leaves_with_path(mask)
             if parameter_path(path).split(".")[0] == "visual"]
    return bool(flags) and all(flags)


def parameter_path(path) -> str:
    """A pytree key path of the parameters -> 'visual.blocks.attn.qkv' (nnx value leaves dropped)."""
    parts = []
    for key in path:
        name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", None)))
        if name is not None and name != "value":
            parts.append(str(name))
    return ".".join(parts)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    step: jax.Array
    params: Any  # nnx.State of nnx.Param
    opt_state: Any
    skipped: jax.Array  # updates skipped for non-finite loss / gradients


def token_scores(model: nnx.Module, batch: Mapping[str, Any], head: HeadConfig, mesh=None) -> TokenScores:
    """The token head of `model` on `batch` (the device tree of a TrainBatch): [B, T] log-probs
    and entropies under softmax(logits / head.temperature), shifted so that position t scores
    token t given the tokens before it. With a `mesh`, the decoder's activations and the head's
    chunks stay split by rows over the batch axes (`sharding.row_constraint`). A batch with
    `visual_embeds` (a frozen tower's features, computed before) skips the vision tower."""
    embeds, deepstack = batch.get("visual_embeds"), batch.get("visual_deepstack")
    if embeds is None and batch["pixel_values"] is not None:
        embeds, deepstack = model.encode_vision(batch["pixel_values"], *batch["vision_meta"])
    if embeds is not None:
        if embeds.ndim == 3:  # vision shards (train/batch.py shard_vision): each on its rows' devices
            embeds, deepstack = sh.row_constraint(mesh)(embeds), sh.row_constraint(mesh, batch_axis=1)(deepstack)
    # packed rows (several sequences each) attend within their segment ids (and a shared prompt's)
    packed = batch.get("segment_ids") is not None
    hidden = model.language(batch["input_ids"], batch["segment_ids"] if packed else batch["attention_mask"],
                            batch["position_ids"], batch["visual_index"], embeds, deepstack,
                            return_hidden=True, packed=packed, constrain_rows=sh.row_constraint(mesh),
                            parents=batch.get("parent_ids"))
    ids = batch["input_ids"]
    b, t, d = hidden.shape
    targets = jnp.concatenate([ids[:, 1:], jnp.zeros((b, 1), ids.dtype)], axis=1)
    size = min(head.chunk, t)
    pad = -t % size
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, size, d).transpose(1, 0, 2, 3)
    tg = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, -1, size).transpose(1, 0, 2)
    h = sh.row_constraint(mesh, batch_axis=1)(h)

    # Each chunk's logits are recomputed in the backward pass: the scan then saves only the
    # [B, chunk, D] hidden inputs, not a [B, chunk, vocab] float32 log-softmax per chunk
    # (for an 8B model at 20k tokens that is 12 GiB per row), at one more head matmul per chunk.
    @jax.checkpoint
    def one(_, xs):
        hc, tc = xs
        logits = model.language.logits(hc).astype(jnp.float32) / head.temperature
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, tc[..., None].astype(jnp.int32), axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1) if head.entropy else jnp.zeros_like(picked)
        return None, (picked, entropy)

    _, (lp, ent) = jax.lax.scan(one, None, (h, tg))

    def shift(x):  # the score of token t comes from position t - 1
        flat = x.transpose(1, 0, 2).reshape(b, -1)[:, :t]
        return jnp.concatenate([jnp.zeros((b, 1), x.dtype), flat[:, :-1]], axis=1)
    return TokenScores(shift(lp), shift(ent))


class TrainStep:
    def __init__(self, model: nnx.Module, optimizer: OptimizerConfig, loss_fn: LossFn,
                 head: HeadConfig = HeadConfig(), mesh=None, rules=sh.DEFAULT_RULES,
                 keep_reference: bool = False, concurrent: int = 1):
        """keep_reference: hold a frozen copy of the initial parameters (the reference policy of
        a KL penalty; leave it off when unused: it costs a model copy). concurrent: micro-batch
        passes run at once (host threads; one process whose programs run on one device)."""
        if not isinstance(concurrent, int) or concurrent < 1:
            raise ValueError(f"concurrent={concurrent!r}: expected a positive number of micro-batch passes")
        if concurrent > 1 and (jax.process_count() > 1 or (mesh is not None and mesh.devices.size > 1)):
            raise ValueError(f"concurrent={concurrent} micro-batch passes need the step on one device of one "
                             f"process (mesh {None if mesh is None else dict(mesh.shape)}, "
                             f"{jax.process_count()} processes): every process must launch its sharded programs "
                             "in one order")
        self.concurrent = concurrent
        self._pool = None  # the host threads of concurrent passes, started on first use
        self._sums_compiled = False  # the programs that sum micro-batches have run once (`_gradients`)
        self.head = head
        self.mesh = mesh
        self.graphdef, self.params, self.rest = nnx.split(model, nnx.Param, ...)
        self.reference_params = jax.tree.map(jnp.copy, self.params) if keep_reference else None
        self.tx = make_optimizer(optimizer)
        self.param_shardings = None
        if mesh is not None:
            self.param_shardings = sh.param_shardings(self.params, mesh, rules)
        self.rules = rules
        graphdef, rest = self.graphdef, self.rest

        # fused attention kernels (splash) run per shard of the mesh: Pallas calls are not partitioned
        def scores(params, batch) -> TokenScores:
            with kernel_mesh(mesh):
                return token_scores(nnx.merge(graphdef, params, rest), batch, head, mesh)

        def logprobs(params, batch, temperature):
            with kernel_mesh(mesh):
                return token_scores(nnx.merge(graphdef, params, rest), batch,
                                    dataclasses.replace(head, temperature=temperature, entropy=False), mesh).logp

        # frozen parameters take no gradient, so XLA drops their part of the backward pass
        frozen = frozen_mask(self.params, optimizer.frozen) if optimizer.frozen else None
        # batches may bring the tower's features in place of pixels only while it never changes
        self.vision_frozen = tower_frozen(self.params, optimizer.frozen)

        def loss(params, batch):
            if frozen is not None:
                params = jax.tree.map(lambda x, f: jax.lax.stop_gradient(x) if f else x, params, frozen)
            total, count, metrics = loss_fn(scores(params, batch), batch)
            return total, (count, metrics)

        def grads(params, batch):
            (total, (count, metrics)), g = jax.value_and_grad(loss, has_aux=True)(params, batch)
            if self.param_shardings is not None:  # gradients as the parameters (reduce-scattered)
                g = jax.lax.with_sharding_constraint(g, self.param_shardings)
            return g, total, count, metrics

        def apply(state: TrainState, g, count):
            g = jax.tree.map(lambda x: x / jnp.maximum(count, 1).astype(x.dtype), g)
            finite = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(g)]))
            updates, new_opt = self.tx.update(g, state.opt_state, state.params)
            new_opt = self._like_params(new_opt)
            new_params = optax.apply_updates(state.params, updates)
            if self.param_shardings is not None:  # keep every parameter on its declared sharding
                new_params = jax.lax.with_sharding_constraint(new_params, self.param_shardings)
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
            return TrainState(state.step + 1, keep(new_params, state.params), keep(new_opt, state.opt_state),
                              state.skipped + (~finite).astype(jnp.int32)), optax.global_norm(g), finite

        self._logprobs = jax.jit(logprobs, static_argnames="temperature")
        self._grads = jax.jit(grads)

        def add(total, part):
            return jax.tree.map(jnp.add, total, part)

        self._apply = jax.jit(apply, donate_argnames="state")
        self._add = jax.jit(add, donate_argnames="total")

    def init_state(self) -> TrainState:
        # Built under jit so that counters and optimizer moments get the same (mesh) shardings
        # the update produces: the donated state then keeps one layout and nothing recompiles.
        def init(params):
            zero = jnp.zeros((), jnp.int32)
            return TrainState(zero, params, self._like_params(self.tx.init(params)), zero)
        return jax.jit(init)(self.params)

    def _like_params(self, opt_state):
        if self.mesh is None:
            return opt_state
        return jax.lax.with_sharding_constraint(
            opt_state, sh.optimizer_shardings(opt_state, self.params, self.mesh, self.rules))

    def model(self, state: TrainState) -> nnx.Module:
        return nnx.merge(self.graphdef, state.params, self.rest)

    def _place(self, batch: TrainBatch) -> dict:
        """Token arrays and extras split along the batch over (data, fsdp) when a mesh is set;
        vision inputs in shards (pixel_values [S, N, patch_dim], or a frozen tower's features
        [S, Nv, D]) split the same way, shard s with rows s * B/S ... on the same devices; a flat
        vision pass replicated. Without a mesh, the host arrays go as they are. Features in place
        of pixels are refused unless the tower is frozen."""
        if batch.visual_embeds is not None and not self.vision_frozen:
            raise ValueError("a batch brings vision features in place of pixels, but the vision tower is trained "
                             "(optimizer.frozen does not cover 'visual'): features computed before the step "
                             "would not follow its weights")
        tree = batch.device_tree()
        if self.mesh is None:
            return tree
        rows = batch.input_ids.shape[0]
        if batch.pixel_values is not None and batch.pixel_values.ndim == 3:
            shards = batch.pixel_values.shape[0]
            tree["pixel_values"], tree["vision_meta"] = jax.tree.map(
                lambda x: jax.device_put(x, sh.batch_sharding(self.mesh, x.ndim, 0, batch_size=shards)),
                (tree["pixel_values"], tree["vision_meta"]))
        if batch.visual_embeds is not None and batch.visual_embeds.ndim == 3:  # [S, Nv, D], [n_ds, S, Nv, D]
            shards = batch.visual_embeds.shape[0]
            tree["visual_embeds"] = jax.device_put(batch.visual_embeds, sh.batch_sharding(
                self.mesh, 3, 0, batch_size=shards))
            tree["visual_deepstack"] = jax.device_put(batch.visual_deepstack, sh.batch_sharding(
                self.mesh, 4, 1, batch_size=shards))
        for key in ("input_ids", "attention_mask", "segment_ids", "parent_ids", "loss_mask", "visual_index",
                    "position_ids", *batch.extras):
            if tree.get(key) is not None:
                axis = 1 if key == "position_ids" else 0
                tree[key] = jax.device_put(tree[key], sh.batch_sharding(self.mesh, tree[key].ndim, axis,
                                                                        batch_size=rows))
        return tree

    def passes(self, run: Callable[[dict], Any], placed: Sequence[dict]) -> list:
        """[run(p) for p in placed] (p: a placed micro-batch), in order. With `concurrent` > 1,
        up to that many run at once on host threads, each result ready when returned (a new
        program asked for by several threads at once still compiles once: JAX waits for the
        first compile)."""
        if self.concurrent <= 1 or len(placed) <= 1:
            return [run(p) for p in placed]
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.concurrent, thread_name_prefix="micro-batch")
        return list(self._pool.map(lambda p: jax.block_until_ready(run(p)), placed))

    def logprobs_many(self, params, batches: Sequence[TrainBatch], temperature: float | None = None) -> list:
        """`logprobs` of each micro-batch (concurrent passes as `passes`), in order."""
        t = self.head.temperature if temperature is None else float(temperature)
        return self.passes(lambda p: self._logprobs(params, p, t), [self._place(b) for b in batches])

    def logprobs(self, params, batch: TrainBatch, temperature: float | None = None) -> jax.Array:
        """[B, T] token log-probs of the head under `params` (on device), at `temperature`
        (default: the head's)."""
        t = self.head.temperature if temperature is None else float(temperature)
        return self._logprobs(params, self._place(batch), t)

    def reference_logprobs(self, batch: TrainBatch, temperature: float | None = None) -> jax.Array:
        """Token log-probs under the frozen initial parameters (default: the head's temperature)."""
        if self.reference_params is None:
            raise ValueError("TrainStep was built with keep_reference=False")
        return self.logprobs(self.reference_params, batch, temperature)

    def _gradients(self, params, batches: Sequence[TrainBatch]) -> tuple[tuple, dict]:
        """The summed (gradients, loss sum, token count) of the micro-batches, on device, and
        their merged statistics."""
        acc, stats = None, {}
        parts = self.passes(lambda p: self._grads(params, p), [self._place(b) for b in batches])
        for g, total, n, metrics in parts:  # summed in the micro-batches' order, however they ran
            acc = (g, total, n) if acc is None else self._add(acc, (g, total, n))
            stats = metrics if not stats else S.merge_stats(stats, metrics)
        if len(parts) == 1 and not self._sums_compiled:
            # A step of one micro-batch compiles the programs that sum several too (their results
            # dropped): a later step of two (token-budget micro-batches vary in number) would
            # otherwise compile them then, a stall the loop reports
            self._add(jax.tree.map(jnp.zeros_like, acc), acc)
            S.merge_stats(stats, stats)
        self._sums_compiled = True
        return acc, stats

    def step(self, state: TrainState, batches: Sequence[TrainBatch]) -> tuple[TrainState, dict]:
        """One optimizer step over the micro-batches (their gradients summed exactly). Sums stay
        on device across micro-batches; the host reads the results once, at the end."""
        start = time.perf_counter()
        acc, stats = self._gradients(state.params, batches)
        total_g, loss_sum, count = jax.block_until_ready(acc)  # the timings' boundary, nothing more
        grads_done = time.perf_counter()
        state, grad_norm, finite = jax.block_until_ready(self._apply(state, total_g, count.astype(jnp.float32)))
        out = {k: float(v) for k, v in S.finalize_stats(stats).items()}
        count = int(count)
        loss = float(loss_sum) / max(count, 1)
        out.update(loss=loss, grad_norm=float(grad_norm), loss_tokens=count,
                   skipped=not bool(finite) or not np.isfinite(loss), grads_s=grads_done - start,
                   update_s=time.perf_counter() - grads_done)
        return state, out

    def compile_step(self, state: TrainState, batches: Sequence[TrainBatch]) -> None:
        """Compiles every program `step(state, batches)` runs, leaving `state` as it is: the
        gradient passes run (their results dropped) and the update, which donates the state, is
        compiled ahead of time."""
        (total_g, _, count), stats = self._gradients(state.params, batches)
        S.finalize_stats(stats)
        self._apply.lower(state, total_g, count.astype(jnp.float32)).compile()
