"""The functional, sharded PARA-GRPO / SFT train step.

`TrainStep(model, config, mesh)` builds the jitted pieces once:
  logprobs(params, batch)  — token log-probs under softmax(logits / temperature) (the
                             sampler's convention), computed from hidden states in sequence
                             chunks so the [B, T, vocab] logits never exist at once;
  grads(params, batch)     — loss sums/counts and gradients of one micro-batch;
  apply(state, grads, n)   — optax update, donated state, explicit shardings.
`step(state, micro_batches)` recomputes the proximal log-probs before the update, accumulates
the micro-batch gradients exactly (sums / total token count) and skips the update when the
loss or the gradients are not finite.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from paravt_jax import sharding as sh
from paravt_jax.rl import loss as L
from paravt_jax.rl.batch import TrainBatch


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"  # adamw | adam
    learning_rate: float = 2e-6
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine
    total_steps: int = 1000


@dataclasses.dataclass(frozen=True)
class StepConfig:
    objective: str = "ppo"  # ppo | sft
    temperature: float = 0.7  # log-prob temperature; must equal the sampler's
    # Temperature of the frozen reference policy's log-probs (the KL term); None = `temperature`.
    # The reference recipe computes them at 1.0 (AReaL's default) while sampling at 0.7.
    reference_temperature: float | None = None
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    behaviour_cap: float | None = 5.0
    logprob_chunk: int = 512  # sequence chunk for the lm head + log-softmax


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    if cfg.schedule == "constant":
        schedule = optax.constant_schedule(cfg.learning_rate)
    elif cfg.schedule == "cosine":
        schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1),
                                                      max(cfg.total_steps, cfg.warmup_steps + 1))
    else:
        raise ValueError(f"optimizer schedule {cfg.schedule!r}: expected constant or cosine")
    if cfg.warmup_steps and cfg.schedule == "constant":
        schedule = optax.join_schedules([optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps),
                                         schedule], [cfg.warmup_steps])
    if cfg.name == "adamw":
        opt = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    elif cfg.name == "adam":
        opt = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    else:
        raise ValueError(f"optimizer {cfg.name!r}: expected adamw or adam")
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), opt)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    step: jax.Array
    params: Any  # nnx.State of nnx.Param
    opt_state: Any
    skipped: jax.Array  # updates skipped for non-finite loss / gradients


def _token_logprobs(graphdef, params, rest, batch: dict, temperature: float, chunk: int,
                    with_entropy: bool = False):
    """[B, T] log p(ids[:, t] | ids[:, <t]) under softmax(logits / T); 0 at t = 0. With
    with_entropy, also the entropy of that predictive distribution at each token [B, T]."""
    model = nnx.merge(graphdef, params, rest)
    embeds = deepstack = None
    if batch["pixel_values"] is not None:
        embeds, deepstack = model.encode_vision(batch["pixel_values"], *batch["vision_meta"])
    hidden = model.language(batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                            batch["visual_index"], embeds, deepstack, return_hidden=True)
    ids = batch["input_ids"]
    b, t, d = hidden.shape
    targets = jnp.concatenate([ids[:, 1:], jnp.zeros((b, 1), ids.dtype)], axis=1)
    size = min(chunk, t)
    pad = -t % size
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, size, d).transpose(1, 0, 2, 3)
    tg = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, -1, size).transpose(1, 0, 2)

    def one(_, xs):
        hc, tc = xs
        logits = model.language.logits(hc).astype(jnp.float32) / temperature
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, tc[..., None].astype(jnp.int32), axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1) if with_entropy else jnp.zeros_like(picked)
        return None, (picked, entropy)

    _, (lp, ent) = jax.lax.scan(one, None, (h, tg))
    # shift: the log-prob of token t comes from position t - 1
    shift = lambda x: jnp.concatenate([jnp.zeros((b, 1), x.dtype), x.transpose(1, 0, 2).reshape(b, -1)[:, :t][:, :-1]], axis=1)
    return (shift(lp), shift(ent)) if with_entropy else shift(lp)


def _loss(params, graphdef, rest, batch, cfg: StepConfig):
    if cfg.objective == "sft":
        logp = _token_logprobs(graphdef, params, rest, batch, 1.0, cfg.logprob_chunk)
        m = batch["loss_mask"] > 0
        total = -jnp.sum(jnp.where(m, logp, 0.0))
        count = jnp.sum(m).astype(jnp.int32)
        return total, (count, {"nll": L.WeightedMean(total, count.astype(jnp.float32))})
    logp, entropy = _token_logprobs(graphdef, params, rest, batch, cfg.temperature, cfg.logprob_chunk,
                                    with_entropy=True)
    total, count, metrics = L.ppo_loss(logp, batch["prox_logp"], batch["behaviour_logp"],
                                       batch["advantages"], batch["loss_mask"], eps_clip=cfg.eps_clip,
                                       eps_clip_high=cfg.eps_clip_high, behaviour_cap=cfg.behaviour_cap)
    m = batch["loss_mask"] > 0
    metrics = dict(metrics, entropy=L.WeightedMean(jnp.sum(jnp.where(m, jax.lax.stop_gradient(entropy), 0.0)),
                                                   jnp.sum(m).astype(jnp.int32)))
    return total, (count, metrics)


class TrainStep:
    def __init__(self, model: nnx.Module, optimizer: OptimizerConfig = OptimizerConfig(),
                 config: StepConfig = StepConfig(), mesh=None, rules=sh.DEFAULT_RULES,
                 keep_reference: bool = False):
        """keep_reference: hold a frozen copy of the initial parameters for the reference-policy
        log-prob pass of the KL penalty (leave it off when kl_ctl = 0: it costs a model copy)."""
        self.config = config
        self.mesh = mesh
        self.graphdef, self.params, self.rest = nnx.split(model, nnx.Param, ...)
        self.reference_params = jax.tree.map(jnp.copy, self.params) if keep_reference else None
        self.tx = make_optimizer(optimizer)
        self.param_shardings = None
        if mesh is not None:
            self.param_shardings = jax.tree.map(
                lambda v: sh.named_sharding(mesh, sh.param_axes(v), v.get_value().shape, rules),
                self.params, is_leaf=lambda x: isinstance(x, nnx.Variable))
        cfg, graphdef, rest = config, self.graphdef, self.rest

        def logprobs(params, batch, temperature):
            return _token_logprobs(graphdef, params, rest, batch, temperature, cfg.logprob_chunk)

        def grads(params, batch):
            (total, (count, metrics)), g = jax.value_and_grad(_loss, has_aux=True)(
                params, graphdef, rest, batch, cfg)
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

        self._logprobs = jax.jit(logprobs, static_argnums=(2,))
        self._grads = jax.jit(grads)
        self._apply = jax.jit(apply, donate_argnums=(0,))
        self._add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), donate_argnums=(0,))

    def init_state(self) -> TrainState:
        # Built under jit so that counters and optimizer moments get the same (mesh) shardings
        # the update produces: the donated state then keeps one layout and nothing recompiles.
        def init(params):
            zero = jnp.zeros((), jnp.int32)
            return TrainState(zero, params, self._like_params(self.tx.init(params)), zero)
        return jax.jit(init)(self.params)

    def _like_params(self, tree):
        """Optimizer-state leaves shaped like a parameter take that parameter's sharding (the
        moments are as large as the model: left alone they come out replicated); the rest
        (step counts) are replicated over the mesh."""
        if self.mesh is None:
            return tree
        by_path = {jax.tree_util.keystr(path): (leaf.shape, leaf.sharding)
                   for path, leaf in jax.tree_util.tree_flatten_with_path(self.params)[0]}
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

        def one(path, leaf):
            key = jax.tree_util.keystr(path)
            shape, sharding = by_path.get(key[key.find("['"):], (None, None))
            return jax.lax.with_sharding_constraint(leaf, sharding if shape == leaf.shape else replicated)
        return jax.tree_util.tree_map_with_path(one, tree)

    def model(self, state: TrainState) -> nnx.Module:
        return nnx.merge(self.graphdef, state.params, self.rest)

    def _place(self, batch: TrainBatch) -> dict:
        """Token arrays split along the batch over (data, fsdp) when a mesh is set; vision
        inputs replicated. Without a mesh, the host arrays go as they are."""
        tree = batch.device_tree()
        if self.mesh is None:
            return tree
        rows = batch.input_ids.shape[0]
        for key in ("input_ids", "attention_mask", "loss_mask", "advantages", "behaviour_logp",
                    "prox_logp", "visual_index", "position_ids"):
            if tree.get(key) is not None:
                axis = 1 if key == "position_ids" else 0
                tree[key] = jax.device_put(tree[key], sh.batch_sharding(self.mesh, tree[key].ndim, axis,
                                                                        batch_size=rows))
        return tree

    def logprobs(self, params, batch: TrainBatch, temperature: float | None = None) -> np.ndarray:
        """[B, T] token log-probs under softmax(logits / temperature) (default: the step's)."""
        t = self.config.temperature if temperature is None else float(temperature)
        return np.asarray(self._logprobs(params, self._place(batch), t))

    def reference_logprobs(self, batch: TrainBatch) -> np.ndarray:
        """Token log-probs under the frozen reference policy, at `reference_temperature`."""
        if self.reference_params is None:
            raise ValueError("TrainStep was built with keep_reference=False (kl_ctl = 0)")
        return self.logprobs(self.reference_params, batch, self.config.reference_temperature)

    def step(self, state: TrainState, batches: Sequence[TrainBatch]) -> tuple[TrainState, dict]:
        """One optimizer step over the micro-batches (their gradients summed exactly). Sums stay
        on device across micro-batches; the host reads the results once, at the end."""
        if self.config.objective == "ppo":
            batches = [dataclasses.replace(b, prox_logp=self._logprobs(state.params, self._place(b),
                                                                        self.config.temperature))
                       if b.prox_logp is None else b for b in batches]
        acc, stats = None, {}
        for b in batches:
            g, total, n, metrics = self._grads(state.params, self._place(b))
            acc = (g, total, n) if acc is None else self._add(acc, (g, total, n))
            stats = metrics if not stats else L.merge_stats(stats, metrics)
        total_g, loss_sum, count = acc
        state, grad_norm, finite = self._apply(state, total_g, count.astype(jnp.float32))
        out = {k: float(v) for k, v in L.finalize_stats(stats).items()}
        count = int(count)
        loss = float(loss_sum) / max(count, 1)
        out.update(loss=loss, grad_norm=float(grad_norm), loss_tokens=count,
                   skipped=not bool(finite) or not np.isfinite(loss))
        return state, out
