"""The SFT recipe's options in a real run: video items trained, over-long examples dropped (the
recipe field by field: tests/unit/test_sft_recipe.py)."""
from paravt_jax.data import synthetic as syn
from paravt_jax.data.paravt_parquet import load_sft_rows
from paravt_jax.data.sft_examples import sft_inputs
from paravt_jax.sft.trainer import SFTConfig, example_frames
from paravt_jax.text.tokenizer import train_tokenizer


def test_video_item_sft_steps_and_drops_overlong_examples(tmp_path):
    """The recipe's options on the tiny model: fps-sampled video items, two-stage sizing, packed
    rows of a fixed width; examples longer than it are skipped and counted."""
    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.sft.trainer import train_sft
    from paravt_jax.train.step import OptimizerConfig

    root = str(tmp_path / "data")
    ds = syn.write_dataset(root, num_train=4, num_eval=1, durations=(30.0,), seed=2, height=96, width=160)
    tok = train_tokenizer(syn.corpus(list(ds.questions) + list(ds.eval_questions)))
    rows, _ = load_sft_rows(ds.sft, root)
    config = SFTConfig(steps=2, batch_size=4, frame_sampling="fps", max_frames=16, max_pixels=96 * 160,
                       sizing="two_stage", visual="video", optimizer=OptimizerConfig(learning_rate=1e-3))
    lengths = sorted(sft_inputs(r, tok, root, example_frames(i, config)).length for i, r in enumerate(rows))
    assert any(len(sft_inputs(r, tok, root, example_frames(0, config)).video_grid_thw) for r in rows)
    width = 256 * -(-lengths[len(lengths) // 2] // 256)
    assert lengths[0] <= width < lengths[-1]
    config = SFTConfig(**{**config.__dict__, "train_width": width, "max_tokens_per_micro_batch": 2 * width,
                          "filter_overlong": True})
    _, result = train_sft(init_model(preset("tiny"), seed=1), tok, rows, root, str(tmp_path / "run"), config)
    assert len(result.history) == 2 and all(h["loss"] > 0 for h in result.history)
    assert sum(h["skipped_examples"] for h in result.history) > 0
