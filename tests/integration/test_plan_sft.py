"""The cold-start SFT step's gradient program compiled on fake CPU devices (the workload and the
command: tests/unit/test_plan_sft.py)."""
from paravt_jax.configs import paragrpo
from paravt_jax.planner import sft_plan as S
from paravt_jax.planner.targets import Target
from paravt_jax.run_config import build_run


def test_tiny_sft_gradient_program_compiles_on_fake_devices(tokenizer):
    """--activations=xla: the SFT step's own gradient function (sft_loss, HEAD), compiled for 4
    fake CPU devices in a child process; the estimate within a factor of two of it."""
    config = paragrpo.get_config("tiny")
    config.sft.batch_size, config.sft.nframes = 4, 4
    mesh = dict(data=1, fsdp=4, tensor=1)
    result = S.plan_sft(build_run(config), mesh, 16, "xla", tokenizer=tokenizer, target=Target("cpu-fake", "gpu"))
    (grads,) = result.programs.trainer
    assert grads.name == "SFT gradients" and grads.temp_bytes > 0 and result.programs.sampler == ()
    assert result.activations == "xla" and result.target == "cpu-fake" and result.phase.compiler == "xla:cpu"
    activations = next(c for c in result.phase.components if c.name.startswith("activations (xla:cpu"))
    assert activations.per_device_bytes == grads.temp_bytes
    estimate = S.plan_sft(build_run(config), mesh, 16, "estimate", tokenizer=tokenizer)
    guessed = next(c for c in estimate.phase.components if c.name.startswith("activations (ESTIMATE"))
    assert 0.5 < guessed.per_device_bytes / grads.temp_bytes < 2.0
    assert "SFT gradients" in S.format_sft_plan(result) and result.to_json()["phase"]["fits"] is True
