"""The paper's ablation grid of PARA-GRPO, run with `paravt-jax sweep`.

    paravt-jax sweep --config=configs/ablations.py:tiny --workdir=runs/ablations --shared_sft
    paravt-jax sweep --config=configs/ablations.py:qwen3vl_8b --workdir=DIR --dry_run \
        --config.model.checkpoint=/data/Qwen3-VL-8B
    paravt-jax report runs/ablations

get_config(arg) is the PARA-GRPO preset of configs/paragrpo.py (`tiny` cut down, see below).
sweep(arg) is the grid, five arms x seeds:
  vanilla            vanilla GRPO, the settings of configs/vanilla_grpo.py: no anchor, no
                     nFrames gating, no think prefix, no answer-suffix format scoring;
  anchor_only        the format anchor (token-masked anchor reward, think prefix, answer
                     suffix), no gating: the overview at 1 fps, at most 64 frames (rl.default_nframes 0);
  gating_only        nFrames gating, no anchor (anchor 0, no think prefix / answer suffix);
  paragrpo           both: PARA-GRPO as in configs/paragrpo.py;
  paragrpo_seqanchor PARA-GRPO with the anchor reward added to the sequence reward, as the
                     released code does (rl.advantage.anchor_mode=sequence), against our token mask.
"Anchor" here is everything vanilla_grpo.py switches off besides gating, so the first four
arms are a 2 x 2 factorial of the two PARA-GRPO parts.

Presets: tiny (the CPU grid: one seed, fewer steps; meant for --shared_sft), tiny_full (the
paragrpo tiny main job, three seeds), qwen3vl_2b and qwen3vl_8b (the paragrpo recipes, three
seeds), toy_paradox and toy_paradox_varied (the Tool Prior Paradox study on the learnable toy
task, below).

toy_paradox (docs/toy_paradox.md; about 75 minutes on a 2-core CPU with --shared_sft):
    paravt-jax sweep --config=configs/ablations.py:toy_paradox --workdir=runs/paradox --shared_sft
the toy main job's cold start (`prior=strong`: 600 SFT steps) and a short one (`prior=weak`: 200
steps), each shared by its arms; the four arms of the 2 x 2 factorial (vanilla, anchor_only,
gating_only, paragrpo) from the strong cold start and vanilla vs paragrpo from the weak one,
3 seeds each, 12 RL steps of 4 prompts x 4 samples, a held-out check of 16 questions with and
without tools every 4 steps, and the final evaluation of the 48 held-out questions at K = 4
and 64. A seed changes the data order, gating draws, rollout sampling and (without a
checkpoint) the model initialisation; the built-in synthetic data has its own `data.seed`.

toy_long (docs/long_rl.md): the long-RL study, 96 RL steps per arm: vanilla and paragrpo
from the strong and the varied cold starts, then anchor_only and gating_only from the strong
one, 3 seeds each (the core 12 arms first, so an interrupted sweep has them), a held-out
check of 16 questions with and without tools at K = 4, 16 and 64 every 16 steps, the final
evaluation of the 48 held-out questions at the same K. Resumable: a rerun skips finished arms
and an interrupted arm resumes from its last checkpoint (every 16 steps):
    paravt-jax sweep --config=configs/ablations.py:toy_long --workdir=runs/long --shared_sft
toy_long_pilot: the learning rate chosen once on seed 0 (paragrpo, strong cold start, 48
steps at 3e-5, 1e-4 and 3e-4); toy_long uses its choice, LONG_RATE.

toy_paradox_varied (about 50 minutes): the same study's third cold start, whose SFT rows'
overviews have 4, 8 or 16 frames (`prior=varied`, a tool prior at dense overviews too), and
vanilla vs paragrpo from it; report both together:
    paravt-jax sweep --config=configs/ablations.py:toy_paradox_varied --workdir=runs/paradox_varied --shared_sft
    paravt-jax report runs/paradox runs/paradox_varied
"""

from paravt_jax.configs import paragrpo, vanilla_grpo
from paravt_jax.data import gating

SEEDS = (0, 1, 2)
# The toy studies' base as they ran (docs/toy_paradox.md, docs/long_rl.md): the toy preset of
# before 2026-12-04's main-job recipe (docs/toy_task.md), so that their cold starts, step counts
# and rates stay those of their tables: 600 SFT steps at K = 4, 12 RL steps at 1e-4 with K from
# every budget of the gating, the cold start's table at K = 4, the check every 6 steps at K = 4.
TOY_STUDY_BASE = {"sft.steps": 600, "sft.nframes_choices": (), "rl.steps": 12,
                  "rl.nframes_choices": gating.NFRAMES_CHOICES, "rl.optimizer.learning_rate": 1e-4,
                  "rl.eval_every": 6, "rl.evals.eval.limit": 8, "rl.evals.eval.nframes": (4,),
                  "evals.held_out.after_sft": (4,),
                  # and the fields the main job's later recipe (WS, 2026-12-06) set: direct answers
                  # at K = 64, the phase cap, the wsd rate, the wider packed rows, tool-free prompts
                  "sft.direct_from_nframes": 0, "sft.direct_share": 1.0, "sft.first_max_nframes": 0,
                  "sft.optimizer.schedule": "constant", "sft.optimizer.total_steps": 1000,
                  "sft.optimizer.decay_steps": 0, "sft.max_tokens_per_micro_batch": 1024,
                  "sft.train_width": 512, "sft.train_frames": 32, "rl.tool_free_share": 0.0}
GATING_FIELDS = ("rl.nframes_gating",)
# toy_paradox: the tool prior, as the shared cold start: its length (strong, weak) and the
# overview budgets it shows (varied: K drawn per row from 4, 8, 16, so the tool is in use at
# every K the RL overview has, 48 and 64 included)
PRIORS = ({"name": "strong"}, {"name": "weak", "sft.steps": 200},
          {"name": "varied", "sft.nframes_choices": (4, 8, 16)})
WEAK_PRIOR_ARMS = ("vanilla", "paragrpo")  # the arms run from the weak and the varied cold starts
STUDIES = ("toy_paradox", "toy_paradox_varied", "toy_long", "toy_long_pilot")
LONG_STEPS, LONG_EVAL_EVERY, LONG_NFRAMES = 96, 16, (4, 16, 64)
PILOT_RATES = (3e-5, 1e-4, 3e-4)
LONG_RATE = 3e-5  # the pilot's choice by docs/long_rl.md's rule (2026-12-02)


def _base_preset(arg):
    preset = arg or "tiny"
    return {"tiny": "tiny", "tiny_full": "tiny", **{study: "toy" for study in STUDIES}}.get(preset, preset)


def get_config(arg: str = "tiny"):
    from paravt_jax.experiments.sweep import apply_overrides

    c = paragrpo.get_config(_base_preset(arg))
    c.preset = arg or "tiny"
    if c.preset in STUDIES:
        c = apply_overrides(c, list(TOY_STUDY_BASE.items()), arm=c.preset)
    if c.preset == "tiny":
        # Per arm on the 2-core CPU: 2 RL steps and a 2-question evaluation at K = 4 and 16.
        # The SFT (shared by all arms under --shared_sft) is the main job's, 160 steps, so the
        # policy knows the trajectory format before RL starts.
        c.rl.steps = 2
        c.rl.eval_every = 0
        c.evals.held_out.limit = 2
        c.evals.held_out.nframes = (4, 16)
    elif c.preset in ("toy_long", "toy_long_pilot"):
        c.rl.steps = LONG_STEPS if c.preset == "toy_long" else LONG_STEPS // 2
        if c.preset == "toy_long":
            c.rl.optimizer.learning_rate = LONG_RATE
        c.rl.eval_every, c.rl.evals.eval.limit, c.rl.evals.eval.nframes = LONG_EVAL_EVERY, 16, LONG_NFRAMES
        c.rl.checkpoint_every = LONG_EVAL_EVERY  # an interrupted arm resumes, losing < 16 steps
        c.evals.held_out.nframes = LONG_NFRAMES
    elif c.preset in STUDIES:
        c.rl.eval_every, c.rl.evals.eval.limit = 4, 16  # accuracy with and without tools over training
        c.evals.held_out.nframes = (4, 64)
    return c


def _flat(config, prefix=""):
    out = {}
    for key, value in config.items():
        if hasattr(value, "items"):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _vanilla_differences(arg):
    """{dotted field: vanilla value} for every rl field vanilla_grpo.py changes."""
    ours = _flat(paragrpo.get_config(_base_preset(arg)))
    theirs = _flat(vanilla_grpo.get_config(_base_preset(arg)))
    return {k: v for k, v in theirs.items() if ours.get(k) != v}


def arms(arg="tiny"):
    vanilla = _vanilla_differences(arg)
    anchor_off = {k: v for k, v in vanilla.items() if k not in GATING_FIELDS}
    gating_off = {k: v for k, v in vanilla.items() if k in GATING_FIELDS}
    return [
        {"name": "vanilla", **vanilla},
        {"name": "anchor_only", **gating_off},
        {"name": "gating_only", **anchor_off},
        {"name": "paragrpo"},
        {"name": "paragrpo_seqanchor", "rl.advantage.anchor_mode": "sequence"},
    ]


def sweep(arg="tiny"):
    from paravt_jax.experiments.sweep import product

    if arg == "toy_paradox":
        grid = [a for a in arms(arg) if a["name"] != "paragrpo_seqanchor"]
        weak = [a for a in grid if a["name"] in WEAK_PRIOR_ARMS]
        return (product(prior=[PRIORS[0]], arm=grid, seed=list(SEEDS))
                + product(prior=[PRIORS[1]], arm=weak, seed=list(SEEDS)))
    if arg == "toy_long":  # the core 12 arms first, then the factorial's other two
        core = [a for a in arms(arg) if a["name"] in WEAK_PRIOR_ARMS]
        parts = [a for a in arms(arg) if a["name"] in ("anchor_only", "gating_only")]
        return (product(prior=[PRIORS[0], PRIORS[2]], arm=core, seed=list(SEEDS))
                + product(prior=[PRIORS[0]], arm=parts, seed=list(SEEDS)))
    if arg == "toy_long_pilot":
        paragrpo_arm = [a for a in arms(arg) if a["name"] == "paragrpo"]
        return product(prior=[PRIORS[0]], arm=paragrpo_arm, seed=[SEEDS[0]],
                       **{"rl.optimizer.learning_rate": list(PILOT_RATES)})
    if arg == "toy_paradox_varied":  # the third cold start, a sweep of its own (about 50 min)
        weak = [a for a in arms(arg) if a["name"] in WEAK_PRIOR_ARMS]
        return product(prior=[PRIORS[2]], arm=weak, seed=list(SEEDS))
    seeds = SEEDS[:1] if (arg or "tiny") == "tiny" else SEEDS
    return product(arm=arms(arg), seed=list(seeds))


# The long-RL study's hypotheses (docs/long_rl.md, written before its runs), as the report judges
# them: per seed, the arm's number minus what it is compared with; see
# paravt_jax/experiments/hypotheses.py for the verdict rule.
COLD_STARTS = {"strong": "_sft", "varied": "_sft,nframes_choices=4+8+16"}  # the shared SFT runs


def _long_hypotheses():
    out = []
    for prior, cold in COLD_STARTS.items():
        for k in LONG_NFRAMES:
            metric = f"eval_tools_K{k}_accuracy"
            out.append({"name": f"H1 {prior} K={k}", "claim": "PARA-GRPO's held-out accuracy with tools >= its "
                        "cold start's", "group": f"{prior},paragrpo", "metric": metric, "against_group": cold})
            out.append({"name": f"H1' {prior} K={k}", "claim": "PARA-GRPO's held-out accuracy with tools above "
                        "vanilla GRPO's", "group": f"{prior},paragrpo", "metric": metric,
                        "against_group": f"{prior},vanilla"})
        vanilla = f"{prior},vanilla"
        out += [
            {"name": f"H2 {prior} kappa", "claim": "vanilla's training kappa falls", "group": vanilla,
             "metric": "rl_kappa_late", "against_metric": "rl_kappa_early", "direction": "below"},
            {"name": f"H2 {prior} held-out kappa K=4", "claim": "vanilla's held-out kappa falls below the cold "
             "start's", "group": vanilla, "metric": "eval_tools_K4_kappa", "against_group": cold, "direction": "below"},
            {"name": f"H2 {prior} accuracy K=4", "claim": "vanilla's accuracy with tools falls (towards without "
             "tools)", "group": vanilla, "metric": "eval_tools_K4_accuracy", "against_group": cold,
             "direction": "below"},
            {"name": f"H3 {prior} compliance", "claim": "PARA-GRPO's training compliance stays >= 0.8",
             "group": f"{prior},paragrpo", "metric": "rl_format_compliance_late", "threshold": 0.8},
            {"name": f"H3 {prior} kappa", "claim": "PARA-GRPO's training kappa stays > 0",
             "group": f"{prior},paragrpo", "metric": "rl_kappa_late", "threshold": 0.0},
            {"name": f"H3 {prior} calls K=64", "claim": "PARA-GRPO calls the tool at K = 64 (held out)",
             "group": f"{prior},paragrpo", "metric": "eval_tools_K64_calls_per_turn", "threshold": 0.0},
        ]
    out += [
        {"name": "H4 anchor_only compliance", "claim": "the anchor alone keeps the format",
         "group": "strong,anchor_only", "metric": "rl_format_compliance_late", "threshold": 0.8},
        {"name": "H4 anchor_only kappa", "claim": "the anchor alone loses the tool (kappa below PARA-GRPO's)",
         "group": "strong,anchor_only", "metric": "rl_kappa_late", "against_group": "strong,paragrpo",
         "direction": "below"},
        {"name": "H4 gating_only compliance", "claim": "gating alone loses the format (compliance below "
         "PARA-GRPO's)", "group": "strong,gating_only", "metric": "rl_format_compliance_late",
         "against_group": "strong,paragrpo", "direction": "below"},
        {"name": "H4 gating_only kappa", "claim": "gating alone keeps the tool", "group": "strong,gating_only",
         "metric": "rl_kappa_late", "threshold": 0.0},
    ]
    return out


def hypotheses(arg="tiny"):
    """What `paravt-jax report` judges for a sweep of this file (experiments/hypotheses.py)."""
    return _long_hypotheses() if arg == "toy_long" else []
