"""Base config: model, mesh and the built-in default (tiny model, synthetic video).

Use: `paravt-jax forward --config=configs/base.py:tiny --config.model.dtype=bfloat16`.
The argument after ':' picks a model preset (tiny, toy, small125m, 2b, 4b, 8b, 32b); all but
tiny and toy load `model.checkpoint`, or are randomly initialised with `model.init=random`.
"""
import ml_collections


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # JAX's persistent compilation cache (paravt_jax/infra/compile_cache.py): a directory where
    # compiled programs are kept for later runs; empty = $PARAVT_JAX_CACHE_DIR, else off.
    c.compilation_cache_dir = ""
    c.model = ml_collections.ConfigDict()
    c.model.preset = arg or "tiny"
    c.model.checkpoint = ""  # a local HF checkpoint directory; empty = the built-in one (tiny, toy only)
    # checkpoint: load model.checkpoint (the built-in checkpoint for tiny and toy) | random: a
    # random initialisation (seed), asked for by name; the larger presets also need it to run on
    # the built-in toy data
    c.model.init = "checkpoint"
    c.model.param_dtype = "float32"
    c.model.dtype = "float32"
    c.model.remat = False
    c.model.scan_layers = True
    # The attention op of every attention (training forward, sampler prefill/decode, vision
    # tower); docs/scale-out.md compares them.
    #   auto:      cudnn on GPU (bf16/fp16, unpacked rows) / splash on TPU (lengths a multiple
    #              of 128, no KV cache) where they take the call; else dense for a small score
    #              array (a decode step) and blockwise for the rest.
    #   dense:     the whole [rows, heads, T, T] score array (fastest at short lengths on CPU).
    #   blockwise: pure-JAX flash attention: online softmax over attention_block-sized query
    #              and key blocks, recomputed in the backward pass; memory linear in T.
    #   cudnn:     jax.nn.dot_product_attention(implementation="cudnn"); blockwise where
    #              cuDNN does not take the call (packed rows, KV caches, fp32, not a GPU).
    #   splash:    the Pallas TPU splash attention kernel with segment ids; blockwise where
    #              it does not take the call.
    c.model.attention = "auto"
    c.model.attention_block = 512
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
    # Asynchronous RL (docs/scale-out.md): the last N devices sample rollouts while the others
    # train (config.mesh above is then the training mesh over the rest); 0 = colocated: every
    # device samples, then every device trains. rollout_axes lays the N out (AXIS=SIZE pairs).
    c.mesh.rollout_devices = 0
    c.mesh.rollout_axes = "tensor=-1"
    # A named layout from paravt_jax/infra/meshes.py (e.g. v5p-32, 2xv5p-128, gpu8, gpu16_tp2): ICI
    # axes within a slice/host, DCN axes across them. Empty = the `mesh` sizes above.
    c.mesh_preset = ""
    # The built-in default data: synthetic videos + tokenizer + tiny model, generated locally.
    c.data = ml_collections.ConfigDict()
    c.data.builtin_root = "artifacts/builtin"
    # shapes: data/synthetic.py; events: the learnable toy task of data/events.py
    c.data.task = "shapes"
    c.data.seed = 0  # the built-in synthetic data and initial tiny model (independent of c.seed)
    c.data.num_train = 12
    c.data.num_eval = 4
    c.data.durations = (30.0, 60.0, 120.0)
    # Real data: local parquet files in the reference schemas and the video root; empty =
    # the built-in synthetic set. tfds_dir: read RL rows via the ArrayRecord builder + grain.
    c.data.sft = ""
    c.data.rl_train = ""
    c.data.rl_eval = ""
    c.data.video_root = ""
    c.data.tfds_dir = ""
    # The forward demo: K overview frames of the first held-out question.
    c.demo = ml_collections.ConfigDict(dict(frames=8, min_pixels=784, max_pixels=50176, repeats=5))
    return c
