"""The outputs of a program computed by its exported ONNX model in onnxruntime alone: the export
reference the peer-option tests share (imported by path, as tests/ops/empty_sweep.py is)."""
from __future__ import annotations

import pytest

import retrograd as rg


def exported(build, feed):
    """``build(*data Vars)`` -> outputs, exported and run by onnxruntime on ``feed``."""
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    pytest.importorskip("onnx", reason="ONNX export needs onnx")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xs = [rg.data(name, list(value.shape), value.dtype.name) for name, value in feed.items()]
        outs = build(*xs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    sess = ort.InferenceSession(rg.onnx.export(main, None, outs).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run([o.name for o in outs], {n: v for n, v in feed.items() if n in names})
