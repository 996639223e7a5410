"""The toy config's SFT step end to end (it compiles a train step: minutes on a loaded 2-core
machine; the events themselves: tests/unit/test_events.py)."""
import json

import numpy as np


def test_toy_config_runs_one_sft_step(tmp_path):
    from paravt_jax.cli import jobs
    from paravt_jax.configs import paragrpo
    from paravt_jax.run_config import build_run

    c = paragrpo.get_config("toy")
    c.data.builtin_root = str(tmp_path / "builtin")
    c.data.num_train, c.data.num_eval, c.data.durations = 2, 1, (24.0,)
    c.sft.steps, c.sft.batch_size = 1, 1
    _, result = jobs.sft_command(build_run(c), str(tmp_path / "sft"))
    lines = [json.loads(line) for line in open(tmp_path / "sft" / "metrics.jsonl")]
    assert len(lines) == 1 and np.isfinite(lines[0]["sft/loss"])
