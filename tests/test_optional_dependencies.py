"""The README's test command runs on a fresh machine: it is the line CI runs, and the suite
collects (tests needing an optional library skip with the reason) when those libraries are missing.

Issue 23: `pip install -e ".[test]" && python -m pytest -q tests` stopped at collection
without onnx, while CI installed `.[all,test]` and passed.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("torch", "jax", "jaxlib", "onnx", "onnxruntime", "mpi4py", "array_api_strict", "cupy",
            "matplotlib", "build", "sklearn", "scipy", "mkdocs", "mkdocstrings", "material", "ml_dtypes")

# Run first in the child process: each optional library then imports as when it is not
# installed (None in sys.modules: `import` raises ModuleNotFoundError, find_spec returns None).
BLOCK = f"import sys; sys.modules.update(dict.fromkeys({OPTIONAL!r}))"


def readme_test_command() -> str:
    """The second line of the README's first ```bash block that runs pytest."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    block = next(b for b in blocks if "pytest" in b)
    return block.splitlines()[1]


def test_readme_test_command_is_the_line_ci_runs():
    command = readme_test_command()
    assert command.startswith('pip install -e ".[') and "test" in command and "python -m pytest" in command
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci_lines, f".ci/run does not run the README's test command {command!r}"


def test_suite_collects_without_the_optional_libraries():
    """Issue 23's fresh machine: no collection error with torch, jax, onnx, onnxruntime, mpi4py
    and array_api_strict missing (tests that need them skip with the reason)."""
    run = f"{BLOCK}; import pytest; sys.exit(pytest.main(['--collect-only', '-q', 'tests']))"
    done = subprocess.run([sys.executable, "-c", run], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " error" not in done.stdout.lower().splitlines()[-1], done.stdout[-3000:]


def test_test_extra_leaves_jax_to_the_peers_extra():
    """Issue 30: the test install brought ~6 GB; jax is a reference some tests compare against
    (they importorskip it), so it lives in the `peers` extra, not in `test`."""
    import tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(req.startswith(("jax", "jaxlib")) for req in extras["test"]), extras["test"]
    assert any(req.startswith("jax") for req in extras["peers"]), extras.get("peers")
    users = [path for path in (ROOT / "tests").rglob("*.py")
             if re.search(r"^\s*(import jax|from jax)", path.read_text(encoding="utf-8"), re.M)]
    assert not users, f"tests importing jax unconditionally (use pytest.importorskip): {users}"
