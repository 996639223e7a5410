"""The training loops' slow variants (tests/integration/test_training.py runs the others by
default): the SIGINT resume, the RL steps without token-budget micro-batches, and rl.share_prompts
end to end."""
import signal

import pytest

from integration import test_training as integration_tests
from integration.test_training import shared_prompts_train_on_the_same_episodes
from integration.test_training import test_resume_is_bit_exact_and_a_signal_checkpoints_then_stops as resume_test
from integration.test_training import test_two_rl_steps as two_rl_steps

dataset = integration_tests.dataset  # the fixture


@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_resume_is_bit_exact_and_a_signal_checkpoints_then_stops(tmp_path, signum):
    resume_test(tmp_path, signum)


@pytest.mark.parametrize("anchor_mode,gating,max_tokens", [("token", True, 0), ("sequence", True, 0),
                                                           ("token", False, 0)])
def test_two_rl_steps(dataset, tmp_path, anchor_mode, gating, max_tokens):
    two_rl_steps(dataset, tmp_path, anchor_mode, gating, max_tokens)


def test_rl_steps_with_shared_prompts_train_on_the_same_episodes(dataset, tmp_path):
    shared_prompts_train_on_the_same_episodes(dataset, tmp_path)
