"""paravt_jax.infra.platforms: no libtpu start-up (and its stderr warnings) on a machine without TPU
chips or a GPU; the planner's TPU target still compiles for a TPU topology."""
import importlib.util
import os

import pytest

from paravt_jax.infra import platforms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_machine_env() -> dict:
    """The environment of a CPU run with nothing chosen: no JAX_PLATFORMS (tests/conftest.py sets
    it), and libtpu allowed to start beside another process holding its lock file (a test beside
    a running planner would otherwise see libtpu stop at the lock before its warnings)."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed: nothing would start it")
    if platforms.accelerator_present(os.environ):
        pytest.skip("this machine may hold a TPU or a GPU: JAX chooses its backends itself")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(PYTHONPATH=ROOT, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    return env


def test_only_a_machine_with_nothing_chosen_and_no_accelerator_is_set_to_cpu(monkeypatch):
    for chosen in ({"JAX_PLATFORMS": ""}, {"JAX_PLATFORMS": "cuda"}, {"TPU_WORKER_HOSTNAMES": "h0,h1"},
                   {"JAX_FORCE_TPU_INIT": "1"}):
        environ = dict(chosen)
        assert not platforms.skip_absent_tpu(environ) and environ == chosen
    if importlib.util.find_spec("libtpu") is None or platforms.accelerator_present({}):
        pytest.skip("the machine itself leaves JAX's choice alone")
    environ = {"TPU_SKIP_MDS_QUERY": "1"}  # what JAX itself sets on a machine without TPU chips
    assert platforms.skip_absent_tpu(environ) and environ["JAX_PLATFORMS"] == "cpu"


def test_tpu_chips_are_counted_on_the_pci_bus(tmp_path):
    """Google's vendor id with a TPU device id is a chip; its network card (gVNIC) is not."""
    for name, vendor, device in (("0000:00:04.0", "0x1ae0", "0x0062"), ("0000:00:05.0", "0x1ae0", "0x0062"),
                                 ("0000:00:06.0", "0x1ae0", "0x0042"), ("0000:00:07.0", "0x10de", "0x2330")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor + "\n")
        (tmp_path / name / "device").write_text(device + "\n")
    assert platforms.tpu_chips_on_pci(str(tmp_path)) == 2
    assert platforms.tpu_chips_on_pci(str(tmp_path / "absent")) == 0
