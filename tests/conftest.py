"""Fixtures shared across the test tree."""
from __future__ import annotations

import pytest

from retrograd.ops.registry import OPS, OpDef


def _call_block_rule(ins, attrs):
    body = attrs["body"]
    return [(body.var(name).shape, body.var(name).dtype) for name in attrs["results"]]


def _call_block_kernel(k, *arrays):
    results = k.run.run_block(k.attrs["body"], dict(zip(k.attrs["binds"], arrays)), k.attrs["results"])
    return results[0] if len(results) == 1 else tuple(results)


@pytest.fixture
def call_block():
    """Register, for one test, ``CallBlock``: the smallest op that runs a sub-block.

    ``CallBlock(*xs; body=<block>, binds=[inner names], results=[inner names])``
    binds its inputs to the body's declared vars and returns the body's
    ``results``. Tests of the IR and runtime use it to build sub-blocks by hand
    without depending on the control-flow ops. It is removed afterwards, so
    tests that walk the whole registry never meet it.
    """
    assert "CallBlock" not in OPS
    OPS["CallBlock"] = OpDef("CallBlock", _call_block_kernel, _call_block_rule,
                             inputs=("xs*",), outputs=("outs*",))
    yield "CallBlock"
    del OPS["CallBlock"]
