"""The package as users install it: metadata, license, typed marker, sdist contents, lowest versions."""
from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:                                    # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lower_bounds(requirements: list[str]) -> dict[str, str]:
    bounds = {}
    for req in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(,.*)?", req.replace(" ", ""))
        assert match, f"dependency {req!r} has no lower bound"
        bounds[match[1].lower()] = match[2]
    return bounds


def test_license_is_mit_as_an_spdx_expression_with_the_file():
    doc = _project()
    assert doc["project"]["license"] == "MIT"
    assert doc["project"]["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    # setuptools refuses License :: classifiers next to an SPDX expression, and needs 77+ for it
    assert not any(c.startswith("License ::") for c in doc["project"]["classifiers"])
    assert doc["build-system"]["requires"] == ["setuptools>=77"]


def test_metadata_a_user_sees():
    project = _project()["project"]
    assert {"Homepage", "Source", "Issues"} <= set(project["urls"])
    assert "Typing :: Typed" in project["classifiers"]
    assert (ROOT / "retrograd" / "py.typed").exists()
    assert "py.typed" in _project()["tool"]["setuptools"]["package-data"]["retrograd"]
    extras = project["optional-dependencies"]
    assert {"torch", "cupy", "onnx", "mpi", "all", "test"} <= set(extras)
    torch_pins = [r for r in extras["test"] if r.startswith("torch")]
    assert torch_pins == ["torch>=2.4,<3"], "torch is a range, not one version"


def test_ci_installs_exactly_the_lowest_supported_versions():
    """The lowest-versions CI step pins each dependency to pyproject's lower bound."""
    bounds = _lower_bounds(_project()["project"]["dependencies"])
    script = (ROOT / ".ci" / "run").read_text()
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)==([0-9.]+)", script.split('LOWEST="', 1)[1].split('"')[0]))
    assert {name.lower() for name in pins} == set(bounds)
    for name, version in pins.items():
        assert _release(version) == _release(bounds[name.lower()]), name
    assert "pip install --no-deps -e ." in script and "python -m venv" in script


def _release(version: str) -> list[int]:
    """``1.26`` and ``1.26.0`` are the same release."""
    parts = [int(p) for p in version.split(".")]
    return parts + [0] * (3 - len(parts))


def test_numpy_before_2_runs_through_array_api_compat(monkeypatch):
    """NumPy 1.26 lacks isdtype/astype/concat: the NumPy backend then uses array_api_compat.numpy."""
    import array_api_compat.numpy as compat

    from retrograd.backends import numpy_backend
    monkeypatch.setattr(np, "__version__", "1.26.4")
    assert numpy_backend.array_namespace() is compat
    assert compat.isdtype(np.dtype("float32"), "real floating")
    monkeypatch.setattr(np, "__version__", "2.0.0")
    assert numpy_backend.array_namespace() is np


def test_sdist_ships_tests_examples_benchmarks_and_license(tmp_path):
    pytest.importorskip("build")
    done = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(tmp_path),
                           str(ROOT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = [line for line in (done.stdout + done.stderr).lower().splitlines()
                if "warning" in line and "byte-compiling is disabled" not in line]
    assert not warnings, warnings
    sdist, = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    shipped = {p.relative_to(ROOT).as_posix() for d in ("tests", "examples", "benchmarks")
               for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts}
    assert shipped <= names, sorted(shipped - names)[:5]
    assert {"LICENSE", "README.md", "retrograd/py.typed", ".ci/run"} <= names
