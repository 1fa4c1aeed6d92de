"""The size-0 sweep: every op in ``tests/ops/empty_sweep.py``'s table, with each axis of size 0
(and of size 1), forward and gradient, on NumPy, torch, the onnxruntime engine and
``rg.onnx.export``, equals PyTorch's (float64 autograd) empty or zero result, or raises a
RetrogradError everywhere where PyTorch raises.

The cases run in one child process (``python tests/ops/empty_sweep.py``), so a vendor kernel that
dies on size 0 (SIGFPE) fails the op's test, naming the case, instead of ending the run; the
child is started again for the next op.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch", reason="the sweep's reference is PyTorch")
pytest.importorskip("onnxruntime", reason="the sweep runs the engine and exported models")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import empty_sweep  # noqa: E402

ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import fuzz_differential  # noqa: E402


class Child:
    """The sweep's child process, started again after it dies."""

    def __init__(self):
        self.proc = None

    def start(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, str(HERE / "empty_sweep.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def sweep(self, name: str) -> list[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        case = None
        for line in self.proc.stdout:
            answer = json.loads(line)
            if "case" in answer:
                case = answer["case"]
                continue
            return answer["failures"]
        code = self.proc.wait()
        self.proc = None
        return [f"{name}: the process died (exit status {code}) in the case {case}"]

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def child():
    c = Child()
    yield c
    c.close()


@pytest.mark.parametrize("name", empty_sweep.entry_names())
def test_size_zero_sweep(child, name):
    failures = child.sweep(name)
    assert not failures, "\n".join(failures)


def test_sweep_reports_a_crash(child):
    """A case that kills the child (as a SIGFPE in a vendor kernel does) fails its op's test with
    the case named, and the next op runs in a new child."""
    failures = child.sweep(empty_sweep.CRASH)
    assert len(failures) == 1 and "the process died" in failures[0] and "'a': 0" in failures[0]
    assert child.sweep("exp") == []


@st.composite
def op_programs(draw):
    """The differential fuzzer's ``--ops`` programs (``benchmarks/fuzz_differential.py``)."""
    def choose(label, options):
        if isinstance(options, range):
            return draw(st.integers(options.start, options.stop - 1))
        return draw(st.sampled_from(list(options)))
    return fuzz_differential.draw_op_case(choose, empty_sweep)


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=op_programs())
def test_random_op_programs_agree(child, case):
    """A few of the fuzzer's op programs (hypothesis, a fixed budget): random sizes (0, 1 or more
    on each axis), float32/float64, the op alone, in cond / scan / while_loop or through a
    TensorArray (in a loop, carried by a scan, unstack/gather/scatter/concat/split), first or
    second order, ``rg.gradients``, ``memory_budget`` (ample or the least that fits) or
    ``clone(for_test=True)``, finite differences; forward and gradients on every runner against
    PyTorch float64 autograd, in the child process."""
    failures = child.sweep(json.dumps(case))
    assert fuzz_differential._verdict(failures) in ("agree", "refused"), "\n".join(failures)
