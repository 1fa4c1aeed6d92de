"""The README's "Backends and GPUs" example runs as printed, and its files load on either backend."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg


def test_readme_backends_example(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="the README's example runs on the torch backend")
    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "executors.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, flags=re.S).group(1)
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), ns)
    assert type(ns["loss_t"]).__module__.startswith("torch")
    saved = {b: rg.read_params(tmp_path / f"fc-{b}.npz") for b in ("numpy", "torch")}
    assert set(saved["numpy"]) == set(saved["torch"])
    for name, value in saved["numpy"].items():
        np.testing.assert_allclose(saved["torch"][name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    exe = rg.Executor(backend="torch")
    rg.load_params(exe.scope, tmp_path / "fc-numpy.npz", ns["main"])
    assert exe.backend.owns(exe.scope.get("fc1.w"))
