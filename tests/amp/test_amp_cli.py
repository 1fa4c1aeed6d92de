"""`retrograd train --precision`: the header names it, the saved file holds float32 parameters
(and, for fp16, the loss scale), and a resume continues the scale."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import retrograd as rg

pytest.importorskip("ml_dtypes", reason="NumPy's bfloat16 is ml_dtypes' (pip install ml_dtypes)")

SMALL = ["--hidden", "32", "--embed", "16", "--seq-len", "16", "--batch", "8", "--sample-len", "10",
         "--backend", "numpy"]


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrograd", "train", *SMALL, *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_precision_is_named_in_the_header_and_weights_stay_float32(tmp_path, precision):
    path = tmp_path / "m.npz"
    done = _train("--precision", precision, "--steps", "3", "--save", str(path))
    assert done.returncode == 0, done.stderr
    assert f"precision {precision}" in done.stdout.splitlines()[0]
    params = rg.read_params(path)
    floats = {n: v.dtype for n, v in params.items() if v.dtype.kind == "f"}
    assert floats and set(floats.values()) == {np.dtype("float32")}
    assert ("amp.loss_scale" in params) == (precision == "fp16")
    if precision == "fp16":
        again = _train("--precision", "fp16", "--steps", "2", "--resume", str(path), "--save", str(path))
        assert again.returncode == 0, again.stderr
        assert re.search(r"resuming .* at step 3", again.stdout)


def test_precision_defaults_to_fp32_and_rejects_others():
    done = _train("--precision", "fp8", "--steps", "1")
    assert done.returncode != 0 and "invalid choice: 'fp8'" in done.stderr
