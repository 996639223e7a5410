"""Test environment: 8 fake CPU devices, no network, torch parity enforced under CI."""
import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
# The tests' programs are tiny and each compiles once or twice: compiling dominates the suite,
# and XLA:CPU compiles about 25% faster without LLVM's optimisation passes (fast-math stays
# off; results can differ from optimised code in the last bits, which no test depends on). The
# bench scripts inherit it in the suite, where only their running is checked.
FAST_COMPILE = "--xla_backend_optimization_level=0"
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + FAST_COMPILE
os.environ["JAX_PLATFORMS"] = os.environ.get("JAX_PLATFORMS", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import shutil  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

CACHE_ENV = "PARAVT_JAX_CACHE_DIR"  # paravt_jax.infra.compile_cache.ENV_VAR (not imported: jax stays unloaded here)
CACHE_MIN_ENV = "PARAVT_JAX_CACHE_MIN_SECONDS"  # paravt_jax.infra.compile_cache.MIN_SECONDS_ENV
BUILTIN_ENV = "PARAVT_TEST_BUILTIN_ROOT"  # the session's built-in assets, shared by the xdist workers
SHARED_ENV = "PARAVT_TEST_SHARED_DIR"  # the session's costly fixtures' outputs, shared by the xdist workers


def pytest_configure(config):
    """One persistent compilation cache for the whole session (this process, every xdist
    worker and every command a test starts use $PARAVT_JAX_CACHE_DIR): the many commands that compile the
    same tiny programs load them after the first compile. Loads are counted as compiles
    (train/compiles.py), so compile counts do not depend on test order. Set the variable
    yourself to keep a cache across sessions."""
    if not hasattr(config, "workerinput") and not os.environ.get(CACHE_ENV):
        config.paravt_cache_dir = tempfile.mkdtemp(prefix="paravt-test-jax-cache-")
        os.environ[CACHE_ENV] = config.paravt_cache_dir
    if not hasattr(config, "workerinput") and not os.environ.get(BUILTIN_ENV):
        config.paravt_builtin_dir = tempfile.mkdtemp(prefix="paravt-test-builtin-")
        os.environ[BUILTIN_ENV] = config.paravt_builtin_dir
    if not hasattr(config, "workerinput") and not os.environ.get(SHARED_ENV):
        config.paravt_shared_dir = tempfile.mkdtemp(prefix="paravt-test-shared-")
        os.environ[SHARED_ENV] = config.paravt_shared_dir
    # every program cached, however short its compile: the suite's processes (xdist workers and
    # the commands its tests start) compile the same small programs again and again
    os.environ.setdefault(CACHE_MIN_ENV, "0")
    from paravt_jax.infra import compile_cache

    compile_cache.enable()  # the tests' own compiles too


def pytest_unconfigure(config):
    for name in ("paravt_cache_dir", "paravt_builtin_dir", "paravt_shared_dir"):
        directory = getattr(config, name, None)
        if directory:
            shutil.rmtree(directory, ignore_errors=True)


TIERS = ("unit", "integration", "slow")
# Run first, in this order: the modules whose tests share a result made once per session
# (once_per_session), then the longest ones. pytest-xdist's worksteal scheduler hands each worker
# a contiguous share of the list and steals from the ends of the shares, so a module at the head
# stays on one worker (its second test does not sit idle waiting for the first one's result on
# another) and the longest tests start early instead of ending the run alone.
FIRST = ("integration/test_multihost.py", "integration/test_plan_tpu.py", "integration/test_plan.py",
         "integration/test_sweep.py", "integration/test_hf_export.py", "integration/test_bench.py",
         "integration/test_reproducibility.py", "integration/test_storage.py", "integration/test_cli.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Each test gets the marker of its tier, the directory it is in, so `-m unit`,
    `-m integration` or `-m slow` selects a tier: tests/unit/ (fast, no real programs or
    processes), tests/integration/ (compiles real programs or starts processes), tests/slow/
    (end to end and slower, excluded by default). tests/support/ holds their helpers. The
    modules of FIRST go first (a stable sort: the rest keep their order)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        tier = os.path.relpath(str(item.path), tests).split(os.sep)[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.path}: a test belongs in tests/unit/, tests/integration/ or tests/slow/")
        item.add_marker(getattr(pytest.mark, tier))
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(os.path.relpath(str(item.path), tests).replace(os.sep, "/"), len(FIRST)))


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


def require_torch(*modules: str):
    """Imports torch + transformers (and `modules`, e.g. "torchvision") for parity tests: skip
    locally if absent, fail in CI."""
    import importlib

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        for module in modules:
            importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        if in_ci():
            pytest.fail(f"torch parity tests must run under CI, but a module they need is missing: {e}")
        pytest.skip(f"torch/transformers{''.join('/' + m for m in modules)} not installed: {e}")
    torch.set_num_threads(2)
    return torch


@pytest.fixture(scope="session")
def builtin_root():
    """One directory for the built-in assets of a test session, shared by every pytest-xdist
    worker ($PARAVT_TEST_BUILTIN_ROOT, made by pytest_configure): the commands under test
    generate each set in it on first use, the later tests, in any worker, find it READY
    (ensure_builtin's lock keeps concurrent generation safe)."""
    return os.environ[BUILTIN_ENV]


def once_per_session(name: str, make) -> str:
    """The directory `name` in the session's shared directory, filled by `make(directory)` in
    whichever pytest-xdist worker asks first; the others wait on its lock and reuse it (a module
    fixture would otherwise run once in every worker that takes one of the module's tests). A
    failed `make` leaves nothing: the next asker runs it again."""
    import fcntl

    directory = os.path.join(os.environ[SHARED_ENV], name)
    with open(directory + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(directory + ".done"):
            shutil.rmtree(directory, ignore_errors=True)
            os.makedirs(directory)
            make(directory)
            open(directory + ".done", "w").close()
    return directory


def computed_once_per_session(name: str, compute):
    """compute()'s value, computed in whichever pytest-xdist worker asks first and pickled in the
    session's shared directory (once_per_session); the other workers unpickle it. For a costly
    module fixture whose tests the workers share (a plan compiled in 90 s, not twice)."""
    import pickle

    def make(directory):
        with open(os.path.join(directory, "value.pkl"), "wb") as f:
            pickle.dump(compute(), f)

    with open(os.path.join(once_per_session(name, make), "value.pkl"), "rb") as f:
        return pickle.load(f)


@pytest.fixture(scope="session")
def tokenizer():
    """A small BPE tokenizer whose corpus holds the tool's words (a module whose tests need
    other words defines its own `tokenizer`)."""
    from paravt_jax.text.tokenizer import train_tokenizer

    return train_tokenizer(["crop_video start_time end_time seconds frames", "What happens in the video?"] * 10)


@pytest.fixture(scope="session")
def torch_module():
    return require_torch()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """A Cloud Storage API emulator (the gcp-storage-emulator package, through
    tests/support/gcs_emulator.py) on 127.0.0.1 with a bucket `paravt-test`, in memory;
    STORAGE_EMULATOR_HOST points every client at it (gcsfs, and orbax's through
    paravt_jax.infra.storage). Yields the bucket's URL, gs://paravt-test."""
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path_factory.mktemp("gcs") / "emulator.log", "w")
    launcher = os.path.join(os.path.dirname(__file__), "support", "gcs_emulator.py")
    process = subprocess.Popen([sys.executable, launcher, "127.0.0.1", str(port), "paravt-test"], stdout=log,
                               stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.time() > deadline:
                process.kill()
                pytest.fail(f"gcp-storage-emulator did not start (is it installed? log: {log.name})")
            time.sleep(0.2)
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST",)}
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    try:
        yield "gs://paravt-test"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        process.terminate()
        process.wait(timeout=30)
        log.close()
