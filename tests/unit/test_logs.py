"""Log lines (paravt_jax/infra/logs.py): one format on stderr, the package's INFO from process 0 only,
every library's warnings, other libraries' INFO never, and absl's own handler when an absl app
installed it. That a two-process run logs its progress once: tests/integration/test_multihost.py."""
import logging as std_logging
import re

import pytest
from absl import logging

from paravt_jax.infra import logs
from paravt_jax.infra.metrics_writer import MetricsWriter

STAMP = r"\d{4} \d\d:\d\d:\d\d"


def metrics_line(tmp_path) -> None:
    """Logs the per-step metrics line from package code (paravt_jax/infra/metrics_writer.py)."""
    writer = MetricsWriter(str(tmp_path), total_steps=3)
    writer.write(0, {"loss": 1.5, "reward": 0.25}, prefix="rl/")
    writer.close()


def test_a_package_line_is_one_formatted_line_on_stderr(tmp_path, capsys):
    metrics_line(tmp_path)
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout is left to the commands' output
    assert re.fullmatch(rf"I{STAMP} \[rl/ 0/3\] loss 1\.5  reward 0\.25\n", captured.err), captured.err


def test_every_module_of_the_package_shows_its_info_lines():
    """Any module of paravt_jax, not only those beside logs.py in infra/; other files' INFO never."""
    import os

    import paravt_jax

    package = os.path.dirname(os.path.abspath(paravt_jax.__file__))
    for path in (os.path.join(package, "rl", "trainer.py"), os.path.join(package, "config.py")):
        assert logs.shown(std_logging.LogRecord("absl", std_logging.INFO, path, 1, "step", None, None)), path
    assert not logs.shown(std_logging.LogRecord("absl", std_logging.INFO, std_logging.__file__, 1, "x", None, None))


def test_other_processes_log_only_warnings_marked_with_their_index(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(logs, "_INDEX", 1)
    metrics_line(tmp_path)
    logging.warning("[sft] example 3 skipped: no video")
    err = capsys.readouterr().err
    assert "[rl/ 0/3]" not in err  # progress: process 0's alone
    assert re.fullmatch(rf"W{STAMP} \[process 1\] \[sft\] example 3 skipped: no video\n", err), err


def test_other_libraries_show_warnings_not_info(capsys):
    logging.info("an absl INFO line from outside the package")  # orbax's checkpoint chatter, say
    std_logging.getLogger("some.library").warning("a library warning")
    err = capsys.readouterr().err
    assert "outside the package" not in err
    assert re.fullmatch(rf"W{STAMP} a library warning\n", err), err


def test_one_handler_however_often_absl_logs(capsys):
    """absl adds a bare root handler (logging.basicConfig) on its first call when the root
    logger has none: ours is there, so every line is written once."""
    logs.install()  # idempotent
    for _ in range(2):
        logging.warning("[rl] twice?")
    err = capsys.readouterr().err
    assert err.count("[rl] twice?") == 2 and len(err.splitlines()) == 2, err
    assert sum(isinstance(h, logs.Handler) for h in std_logging.root.handlers) == 1
    assert not [h for h in std_logging.root.handlers if type(h) is std_logging.StreamHandler]


@pytest.fixture
def absl_app_handler():
    """What absl.app.run does before main: absl's handler on the root logger."""
    handler = logging.get_absl_handler()
    std_logging.root.addHandler(handler)
    yield handler
    std_logging.root.removeHandler(handler)


def test_under_an_absl_app_absl_handler_writes_and_ours_stands_aside(absl_app_handler, capsys):
    logging.warning("[rl] from an absl app")
    err = capsys.readouterr().err
    assert err.count("[rl] from an absl app") == 1, err
    assert not re.search(rf"^W{STAMP} \[rl\]", err, re.M), err  # absl's own format, not ours
