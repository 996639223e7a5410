"""Packaging: the config files install inside the package, never as a top-level `configs`.

A wheel and an editable wheel are built offline (setuptools' build backend, as pip runs it) from a
copy of the sources and installed into fresh virtual environments that see this environment's
packages as plain paths (so no .pth of the installs under test leaks in); each is then used from
another directory, the command line parsing its config and printing it (`--help`, no model)."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = ("setup.py", "README.md", "paravt_jax", "configs")
# The checkout's stand-in for the package (paravt_jax/configs/__init__.py): a wheel holds configs/
# there instead.
STAND_IN = os.path.join("paravt_jax", "configs", "__init__.py")

# Run by an installed interpreter with -I (no PYTHONPATH, no current directory on sys.path), so
# that only the installation under test provides paravt_jax. Prints what the test checks.
CHECK = textwrap.dedent("""
    import contextlib, importlib.util, io, json, os, sys

    import paravt_jax
    import paravt_jax.configs
    from paravt_jax.cli import main
    from paravt_jax.config import config_path

    def cli(*args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            status = main(["paravt-jax", *args])
        return status, out.getvalue()

    result = {"configs": importlib.util.find_spec("configs") is not None, "package": paravt_jax.__file__,
              "configs_dir": paravt_jax.configs.__path__[0], "default": config_path("paragrpo"),
              "run": cli("run", "--help")}
    os.chdir(sys.argv[1])  # a checkout: --config=configs/... relative to it
    result["checkout"] = cli("run", "--config=configs/sft.py:tiny", "--help")
    print(json.dumps(result))
""")


def copy_sources(destination) -> str:
    for name in SOURCES:
        source = os.path.join(ROOT, name)
        if os.path.isdir(source):
            shutil.copytree(source, destination / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy(source, destination / name)
    return str(destination)


def build(source: str, hook: str, out_dir: str) -> str:
    """What setuptools' backend `hook` (build_wheel / build_editable / build_sdist) builds from `source`."""
    code = ("import sys\nfrom setuptools import build_meta\n"
            "print(getattr(build_meta.__legacy__, sys.argv[1])(sys.argv[2]))")  # the backend of a setup.py-only project
    result = subprocess.run([sys.executable, "-c", code, hook, out_dir], cwd=source, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return os.path.join(out_dir, result.stdout.strip().splitlines()[-1])


def install(wheel: str, directory) -> str:
    """A fresh virtual environment with `wheel` unpacked into its site-packages (a pure wheel, as
    pip installs it) and this environment's site-packages as plain paths; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=120)
    python = os.path.join(directory, "bin", "python")
    site_packages = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site_packages)
    # A path line adds the directory but runs none of its .pth files (this environment's own
    # editable install of the project stays out).
    with open(os.path.join(site_packages, "zz_test_environment.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])) + "\n")
    return python


def check(python: str, cwd, checkout: str) -> dict:
    script = cwd / "check.py"
    script.write_text(CHECK)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([python, "-I", str(script), checkout], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_the_cli_loads_its_configs(result: dict, configs_dir: str):
    from paravt_jax.configs import paragrpo, sft

    assert not result["configs"], "a top-level `configs` module is importable"
    assert os.path.realpath(result["configs_dir"]) == os.path.realpath(configs_dir)
    assert result["default"] == os.path.join(os.path.realpath(configs_dir), "paragrpo.py")
    status, text = result["run"]  # the default config, loaded from outside any checkout
    assert status == 0 and f"rl.steps = {paragrpo.get_config('tiny').rl.steps}" in text, text[-2000:]
    status, text = result["checkout"]  # a checkout's config file by path; it imports its siblings
    assert status == 0 and f"rl.steps = {sft.get_config('tiny').rl.steps}" in text, text[-2000:]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    source = copy_sources(tmp_path_factory.mktemp("source"))
    out = str(tmp_path_factory.mktemp("wheels"))
    return source, build(source, "build_wheel", out), build(source, "build_editable", out)


def test_a_wheel_built_through_the_sdist_is_the_same(wheels, tmp_path):
    """`python -m build` makes the wheel from the sdist, which holds no paravt_jax/configs folder."""
    source, wheel, _ = wheels
    sdist = build(source, "build_sdist", str(tmp_path))
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path)
    unpacked = str(tmp_path / os.path.basename(sdist)[:-len(".tar.gz")])
    assert not os.path.exists(os.path.join(unpacked, STAND_IN))
    via_sdist = build(unpacked, "build_wheel", str(tmp_path / "dist"))
    with zipfile.ZipFile(wheel) as direct, zipfile.ZipFile(via_sdist) as rebuilt:
        assert sorted(rebuilt.namelist()) == sorted(direct.namelist())


def test_the_wheel_holds_the_configs_inside_the_package(wheels):
    _, wheel, _ = wheels
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        top_level = archive.read(next(n for n in names if n.endswith(".dist-info/top_level.txt"))).decode().split()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        shipped = {name: archive.read(name) for name in names}
    assert top_level == ["paravt_jax"]
    assert {name.split("/")[0] for name in names} == {"paravt_jax", "paravt_jax-0.1.0.dist-info"}
    assert "paravt-jax = paravt_jax.cli:main" in entry_points
    configs = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))
    assert {"base.py", "paragrpo.py", "eval.py", "__init__.py"} <= set(configs)
    for filename in configs:  # where config_path() finds them
        with open(os.path.join(ROOT, "configs", filename), "rb") as f:
            assert shipped.get(f"paravt_jax/configs/{filename}") == f.read(), filename
    # Every module of the package ships (a folder without __init__.py would not).
    for directory, _, files in os.walk(os.path.join(ROOT, "paravt_jax")):
        for filename in files:
            path = os.path.relpath(os.path.join(directory, filename), ROOT)
            if filename.endswith(".py") and path != STAND_IN:
                assert path.replace(os.sep, "/") in names, f"{path} is not in the wheel"


def test_an_installed_wheel_finds_its_configs_from_any_directory(wheels, tmp_path):
    _, wheel, _ = wheels
    python = install(wheel, tmp_path / "venv")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = check(python, elsewhere, ROOT)
    assert result["package"].startswith(str(tmp_path / "venv"))
    assert_the_cli_loads_its_configs(result, os.path.join(os.path.dirname(result["package"]), "configs"))


def test_an_editable_install_reads_the_checkouts_configs(wheels, tmp_path):
    source, _, editable = wheels
    python = install(editable, tmp_path / "venv")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = check(python, elsewhere, source)
    assert result["package"] == os.path.join(source, "paravt_jax", "__init__.py")
    assert_the_cli_loads_its_configs(result, os.path.join(source, "configs"))


def test_a_config_file_loads_the_same_whichever_way(tmp_path):
    """Imported, loaded by path through ml_collections (the command line), or copied elsewhere and
    loaded from there: a config file's sibling imports resolve to the shipped config files."""
    from absl import flags
    from ml_collections import config_flags

    from paravt_jax.config import config_file, config_path, configs_dir
    from paravt_jax.configs import sft

    assert configs_dir() == os.path.realpath(os.path.join(ROOT, "configs"))  # this checkout's
    assert config_path("sft") == os.path.join(configs_dir(), "sft.py")
    assert config_file(os.path.join(ROOT, "configs", "sft.py")) is sft
    copy = tmp_path / "my_sft.py"
    shutil.copy(os.path.join(ROOT, "configs", "sft.py"), copy)
    assert config_file(str(copy)) is not sft
    expected = sft.get_config("tiny").to_dict()
    for path in (os.path.join(ROOT, "configs", "sft.py"), str(copy)):
        values = flags.FlagValues()
        argv = ["prog", f"--config={path}:tiny"]
        config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
        values(argv)
        assert values.config.to_dict() == expected, path
        assert config_file(path).get_config("tiny").to_dict() == expected, path
