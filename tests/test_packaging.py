"""Packaging: the topology library is package data, the simulator runs without torch and Ray, and the
parts that need an extra say which one.

The wheel itself is built, installed into a clean virtual environment and run by ``.ci/run``; these
tests check the same promises from the source tree.
"""

import fnmatch
import os
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata, resources
from pathlib import Path

import conduit
from conduit.topology import library_names, load_topology
from conduit.topology.library import builtin_dir

ROOT = Path(__file__).resolve().parents[1]

# Run first in a child interpreter: torch, Ray and matplotlib cannot be imported there, as on a base install.
BLOCK_EXTRAS = textwrap.dedent("""
    import sys

    class _BlockExtras:
        blocked = ("torch", "ray", "matplotlib")

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.blocked:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, _BlockExtras())
    for _name in list(sys.modules):
        if _name.split(".")[0] in _BlockExtras.blocked:
            del sys.modules[_name]
""")


def run_without_extras(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("CONDUIT_TOPOLOGY_PATH", None)
    return subprocess.run([sys.executable, "-c", BLOCK_EXTRAS + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, check=False, cwd=ROOT, env=env)


def test_the_library_is_package_data_found_through_importlib_resources(monkeypatch):
    monkeypatch.delenv("CONDUIT_TOPOLOGY_PATH", raising=False)
    folder = resources.files("conduit") / "topologies"
    shipped = sorted(Path(entry.name).stem for entry in folder.iterdir() if entry.name.endswith(".yaml"))
    assert "dgx-h100-x2" in shipped and len(shipped) >= 8
    assert library_names() == shipped
    assert builtin_dir() == Path(str(folder))
    assert builtin_dir().is_relative_to(Path(conduit.__file__).parent)  # inside the package, not the repo root
    assert load_topology("dgx-h100-x2").name  # a cluster file naming its node file by library name
    assert (resources.files("conduit") / "py.typed").is_file()


def test_a_user_folder_goes_in_front_of_the_library(tmp_path, monkeypatch):
    (tmp_path / "my-box.yaml").write_text((builtin_dir() / "reference-2core.yaml").read_text())
    monkeypatch.setenv("CONDUIT_TOPOLOGY_PATH", str(tmp_path))
    names = library_names()
    assert "my-box" in names and "dgx-h100" in names
    assert load_topology("my-box").source == str(tmp_path / "my-box.yaml")


def test_every_library_file_is_declared_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["conduit"]
    package = ROOT / "conduit"
    for path in [*sorted((package / "topologies").iterdir()), package / "py.typed"]:
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} would be left out of the wheel"


def test_torch_ray_and_matplotlib_are_extras_not_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    for name in ("torch", "ray", "matplotlib"):
        assert name not in base
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["runtime"])
    assert any(d.startswith("ray[rllib]") for d in extras["rllib"])
    assert "conduit-rl[runtime]" in extras["rllib"]
    assert any(d.startswith("matplotlib") for d in extras["plot"])
    # TorchRL: pinned to the versions that import with the project's torch (the Makefile installs torch first)
    assert {"torchrl==0.14.1", "tensordict==0.14.3", "conduit-rl[runtime]"} <= set(extras["torchrl"])
    assert "version" in project and "version" not in project.get("dynamic", [])


def test_version_comes_from_the_installed_metadata():
    try:
        expected = metadata.version("conduit-rl")
    except metadata.PackageNotFoundError:
        expected = "0+unknown"
    assert conduit.__version__ == expected


def test_simulator_imports_and_runs_one_iteration_without_torch_or_ray():
    result = run_without_extras("""
        import conduit, conduit.sim, conduit.sim.run, conduit.topology, conduit.policies, conduit.cli
        from conduit.cli import main

        assert main(["topology", "list"]) == 0
        assert main(["sim", "--iterations", "1"]) == 0
        assert main(["policies", "list"]) == 0
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ray", "matplotlib"))
        assert not loaded, loaded
        print("OK")
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dgx-h100-x2" in result.stdout and "conduit sim: ppo" in result.stdout and "OK" in result.stdout
    assert "Traceback" not in result.stderr


def test_parts_that_need_an_extra_name_it():
    result = run_without_extras("""
        import numpy as np
        from conduit._extras import MissingExtraError
        from conduit.errors import ConduitError

        try:
            import conduit.runtime.rllib  # noqa: F401
        except MissingExtraError as exc:
            assert isinstance(exc, ConduitError) and isinstance(exc, ImportError)
            print("rllib:", exc)
        from conduit.runtime.media import CudaMedium, MediumUnavailable, pinned_available, torch_dtype

        try:
            torch_dtype(np.dtype("float32"))
        except MissingExtraError as exc:
            print("runtime:", exc)
        try:
            CudaMedium(1024)
        except MediumUnavailable as exc:
            print("cuda:", exc)
        print("pinned:", pinned_available()[1])
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert "pip install 'conduit-rl[rllib]'" in lines["rllib"]
    for key in ("runtime", "cuda", "pinned"):
        assert "torch" in lines[key] and "pip install 'conduit-rl[runtime]'" in lines[key], lines[key]


def test_quickstart_without_matplotlib_writes_the_csv_and_says_why_there_is_no_figure(tmp_path):
    result = run_without_extras(f"""
        sys.path.insert(0, "studies")
        import quickstart

        code = quickstart.main(["--workloads", "ppo", "--policies", "rllib-stock", "--out", {str(tmp_path)!r}])
        sys.exit(code)
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "quickstart.csv").is_file() and not (tmp_path / "quickstart.png").exists()
    assert "pip install 'conduit-rl[plot]'" in result.stdout
    assert "Traceback" not in result.stderr
