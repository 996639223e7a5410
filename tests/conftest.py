"""Test environment: 8 fake CPU devices, no network, torch parity enforced under CI."""
import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = os.environ.get("JAX_PLATFORMS", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import socket  # noqa: E402

import pytest  # noqa: E402

_LOOPBACK = ("127.0.0.1", "::1", "localhost")
_real_connect = socket.socket.connect


def _guarded_connect(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and host not in _LOOPBACK and not str(host).startswith("/"):
        raise RuntimeError(f"tests must not use the network (tried to connect to {address})")
    return _real_connect(self, address)


socket.socket.connect = _guarded_connect


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_torch():
    """Imports torch + transformers for parity tests: skip locally if absent, fail in CI."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        if in_ci():
            pytest.fail(f"torch parity tests must run under CI, but torch is missing: {e}")
        pytest.skip(f"torch/transformers not installed: {e}")
    torch.set_num_threads(2)
    return torch


@pytest.fixture(scope="session")
def torch_module():
    return require_torch()
