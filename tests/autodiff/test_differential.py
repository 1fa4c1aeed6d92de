"""Differential property test (issue 25): random control-flow programs give the same answer on
NumPy, torch-CPU, the onnxruntime engine and ``rg.onnx.export`` + a default onnxruntime session.

The short CI version of ``benchmarks/fuzz_differential.py``: hypothesis draws programs from
``random_programs.draw_program(..., edges=True)`` (empty and single-row batches, zero-step
sequences, a 0-d leaf, float32, conds on means, value-dependent inner loops, ``max_iters`` below
the fed trip count); every runner must agree with NumPy (float64 NumPy also with the torch twin),
raise NumPy's error, or be refused at export with a BackendError -- never a mismatch, never a
failure inside onnxruntime.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the differential test runs the torch backend and twin")
pytest.importorskip("onnx", reason="the differential test exports to ONNX")
ort = pytest.importorskip("onnxruntime", reason="the differential test runs onnxruntime")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import random_programs as rp  # noqa: E402  (helper modules next to this file, not a package)

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def edge_programs(draw):
    return rp.draw_program(lambda label, options: draw(st.sampled_from(options)), edges=True)


@SETTINGS
@given(edge_programs(), st.integers(0, 2**31 - 1))
def test_random_programs_agree_on_every_backend_and_in_exported_models(desc, seed):
    ort.set_default_logger_severity(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdict = rp.differential_verdict(desc, seed)
    assert verdict.kind in ("agree", "same error", "refused"), \
        f"{verdict.kind}: {verdict.detail}\nprogram: {desc!r}, seed {seed}"
