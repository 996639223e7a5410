"""The cold-start SFT step in the planner: the recipe's packed micro-batch (planner/workload.py
`sft_workload`), its gradient program compiled on fake CPU devices, `paravt-jax plan --stage`."""
import io
import json
import os
from contextlib import redirect_stdout

import pytest

from paravt_jax.cli.flags import UsageError
from paravt_jax.configs import paragrpo
from paravt_jax.models.qwen3_vl import preset
from paravt_jax.planner import arrays as A
from paravt_jax.planner import sft_plan as S
from paravt_jax.planner import workload as W
from paravt_jax.run_config import build_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MESH8 = dict(data=1, fsdp=8, tensor=1)


def test_the_recipes_micro_batch_is_4_packed_rows_of_8192_a_device(tokenizer):
    """qwen3vl_8b on 8 devices: one micro-batch of 32 rows x 8,192 tokens a step (4 a device, as
    per_device_train_batch_size 4 on 8 GPUs); each row as full of whole 1-fps overviews (64
    frames of a 1280x720 video: 288x160 after both resizes, 32 temporal groups of 45 tokens) as
    8,192 tokens hold."""
    config = paragrpo.get_config("qwen3vl_8b")
    work = W.sft_workload(build_run(config).sft, preset("8b").vision, tokenizer, batch_devices=8)
    assert (work.micro_batches, work.micro_batch_rows, work.train_length, work.packed) == (1, 32, 8192, True)
    assert (work.frames_per_example, work.visual, work.frame_size, work.frame_tokens) == (64, "video", (160, 288), 45)
    assert 32 * 45 + 128 < work.example_tokens < 8192 // 3  # the groups' tokens, the question, timestamps
    assert work.examples_per_row == 8192 // work.example_tokens
    assert work.row_frames == 32 * work.examples_per_row
    assert work.patches_per_row == work.row_frames * (160 // 16) * (288 // 16)
    spec = A.train_batch_spec(preset("8b"), work, A.abstract_mesh(MESH8), extras=())
    assert "advantages" not in spec and spec["input_ids"].shape == (32, 8192) and "segment_ids" in spec
    assert spec["pixel_values"].shape[:2] == (8, 4 * work.patches_per_row)  # a device's 4 rows' frames
    result = S.plan_sft(build_run(config), MESH8, 95, "estimate", tokenizer=tokenizer)
    assert result.rows_per_device == 4 and result.phase.name == "sft"
    names = [c.name for c in result.phase.components]
    assert names[:3] == ["parameters", "gradients", "optimizer state (adamw: mu, nu, counts)"]
    assert not any("reference" in n for n in names)  # SFT keeps no frozen reference


def _cli(*args):
    from paravt_jax.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        status = main(["paravt-jax", "plan", *args])
    assert status == 0, out.getvalue()[-2000:]
    return out.getvalue()


def test_cli_stages(tmp_path, builtin_root):
    common = (f"--config={ROOT}/configs/paragrpo.py:tiny", f"--config.data.builtin_root={builtin_root}",
              "--mesh=data=1,fsdp=4,tensor=1", "--device_memory_gb=16", "--activations=estimate")
    path = tmp_path / "plan.json"
    both = _cli(*common, f"--json={path}")
    assert "TRAINER: one optimizer step" in both and "SFT: one cold-start SFT optimizer step [estimate]" in both
    saved = json.loads(path.read_text())
    assert saved["workload"]["rollout_rows"] and saved["sft"]["workload"]["micro_batch_rows"] == 8
    only = _cli(*common, "--stage=sft", f"--json={path}")
    assert "TRAINER" not in only and only.startswith("SFT: ")
    assert set(json.loads(path.read_text())) == {"sft"}
    assert "SFT:" not in _cli(*common, "--config.sft.steps=0")  # --stage=all: no SFT to plan
    with pytest.raises(UsageError, match=r"plans no SFT \(no `sft` section, or sft.steps = 0\)"):
        from paravt_jax.cli.plan import main

        main(["plan", *common, "--stage=sft", "--config.sft.steps=0"])
