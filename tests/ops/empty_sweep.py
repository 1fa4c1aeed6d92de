"""The size-0 sweep's table and its child process (``tests/ops/test_empty_axes.py`` drives it).

Each ``Entry`` names an op, its inputs as letter shapes (``"ab,bc"``: the letters are axes,
shared letters share a size) and a reference written in PyTorch (float64, autograd for the
gradient). A case sets one letter to 0 (or 1); the program (the op, and the gradient of the sum
of its float outputs with respect to its float inputs) runs on NumPy, torch, the onnxruntime
engine and ``rg.onnx.export`` + onnxruntime, and each result must equal the reference: the
empty (or zero) result PyTorch gives. Where PyTorch raises, every runner must raise a
RetrogradError (no wrong answer, no crash).

A vendor kernel that mishandles size 0 can kill the process (SIGFPE), so the cases run here, in
a child: ``python tests/ops/empty_sweep.py`` reads op names on stdin, one a line, and answers
each with one JSON line ``{"op": name, "failures": [...]}``; before each case it writes
``{"case": ...}`` so that the parent names the case a crash happened in.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

CRASH = "(crash)"           # the op name that makes the child die, for the sweep's own test
SIZES = {"a": 2, "b": 3, "c": 4, "d": 5, "e": 2, "f": 3, "h": 2, "k": 3, "l": 4, "n": 3, "s": 5}


@dataclass
class Entry:
    name: str
    shapes: str                      # "ab,bc": one letter group per input ("" for a 0-d input)
    build: Callable                  # (*Vars) -> Var | list[Var]
    ref: Callable                    # (torch, *tensors) -> tensor | list[tensor]
    ints: dict = field(default_factory=dict)   # input index -> (low, high): an int64 input
    sizes: dict = field(default_factory=dict)  # letter sizes other than SIZES'
    fixed: str = ""                  # letters not swept (a kernel size, a static channel count)
    static: str = ""                 # letters declared with their size (others are -1)
    grad: bool = True


def _rg():
    import retrograd as rg
    return rg


def _sdpa(t, q, k, v):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return t.softmax(s, -1) @ v


def _bn_eval(t, x, m, v):
    shape = [1, -1] + [1] * (x.ndim - 2)
    return (x - m.detach().reshape(shape)) / t.sqrt(v.detach().abs().reshape(shape) + 1e-5)


def _conv(nd: int, **kw):
    """torch's conv with a zero input channel and a zero filter added (same result): torch
    refuses 0 filters and gives a wrong shape for 0 input channels, where the sum is empty."""
    def ref(t, x, w):
        pad = (0, 0) * nd
        x = t.nn.functional.pad(x, pad + (0, 1))
        w = t.nn.functional.pad(w, pad + (0, 1, 0, 1))
        return getattr(t.nn.functional, f"conv{nd}d")(x, w, **kw)[:, :-1]
    return ref


def _pool(kind: str):
    """torch's pooling of x with one channel added, then dropped (torch refuses 0 channels)."""
    def ref(t, x):
        padded = t.nn.functional.pad(x, (0, 0, 0, 0, 0, 1))
        return getattr(t.nn.functional, f"{kind}_pool2d")(padded, 2)[:, :-1]
    return ref


def _entries() -> list[Entry]:
    rg = _rg()
    E = Entry
    return [
        E("exp", "ab", rg.exp, lambda t, x: t.exp(x)),
        E("tanh", "abc", rg.tanh, lambda t, x: t.tanh(x)),
        E("gelu", "ab", rg.gelu, lambda t, x: t.nn.functional.gelu(x)),
        E("add_broadcast", "ab,b", rg.add, lambda t, x, y: x + y),
        E("mul_broadcast", "abc,c", rg.mul, lambda t, x, y: x * y),
        E("matmul", "ab,bc", rg.matmul, lambda t, x, y: x @ y),
        E("matmul_batched", "abc,acd", rg.matmul, lambda t, x, y: x @ y),
        E("einsum_contract", "ab,cb", lambda x, y: rg.einsum("ab,cb->ac", x, y),
          lambda t, x, y: t.einsum("ab,cb->ac", x, y)),
        E("einsum_batched", "bcd,bde",
          lambda x, y: rg.einsum("bij,bjk->bik", x, y), lambda t, x, y: t.einsum("bij,bjk->bik", x, y)),
        E("einsum_sum", "abc", lambda x: rg.einsum("abc->b", x), lambda t, x: t.einsum("abc->b", x)),
        E("sum", "abc", lambda x: rg.sum(x, axis=1), lambda t, x: x.sum(1)),
        E("sum_all", "ab", rg.sum, lambda t, x: x.sum()),
        E("mean", "abc", lambda x: rg.mean(x, axis=1), lambda t, x: x.mean(1)),
        E("max", "ab", lambda x: rg.max(x, axis=1), lambda t, x: x.amax(1)),
        E("prod", "ab", lambda x: rg.prod(x, axis=0), lambda t, x: x.prod(0)),
        E("logsumexp", "ab", lambda x: rg.logsumexp(x, axis=1), lambda t, x: t.logsumexp(x, 1)),
        E("softmax", "ab", rg.softmax, lambda t, x: t.softmax(x, -1)),
        E("log_softmax", "abc", rg.log_softmax, lambda t, x: t.log_softmax(x, -1)),
        E("argmax", "ab", lambda x: rg.argmax(x, axis=0), lambda t, x: t.argmax(x, 0), grad=False),
        E("cumsum_0", "ab", lambda x: rg.cumsum(x, 0), lambda t, x: t.cumsum(x, 0)),
        E("cumsum_1", "ab", lambda x: rg.cumsum(x, 1), lambda t, x: t.cumsum(x, 1)),
        E("cumprod_0", "ab", lambda x: rg.cumprod(x, 0), lambda t, x: t.cumprod(x, 0)),
        E("cumprod_1", "ab", lambda x: rg.cumprod(x, 1), lambda t, x: t.cumprod(x, 1)),
        E("topk", "ab", lambda x: rg.topk(x, 1)[0], lambda t, x: t.topk(x, 1, -1)[0]),
        E("topk_smallest", "ab", lambda x: rg.topk(x, 1, largest=False)[0],
          lambda t, x: t.topk(x, 1, -1, largest=False)[0]),
        E("cumsum_exclusive", "ab", lambda x: rg.cumsum(x, 1, exclusive=True), lambda t, x: t.cumsum(x, 1) - x),
        E("relu", "ab", rg.relu, lambda t, x: t.relu(x)),
        E("gather_elements", "ab,cb", lambda x, i: rg.gather_elements(x, i, 0), lambda t, x, i: t.gather(x, 0, i),
          ints={1: (0, 2)}, fixed="a"),
        E("concat", "ab,cb", lambda x, y: rg.concat([x, y], 0), lambda t, x, y: t.cat([x, y], 0)),
        E("stack", "ab,ab", lambda x, y: rg.stack([x, y], 1), lambda t, x, y: t.stack([x, y], 1)),
        E("transpose", "abc", lambda x: rg.transpose(x, [2, 0, 1]), lambda t, x: x.permute(2, 0, 1)),
        E("reshape", "abc", lambda x: rg.reshape(x, [-1]),
          lambda t, x: x.reshape(-1)),
        E("slice", "ab", lambda x: x[:-1, 1:], lambda t, x: x[:-1, 1:]),
        E("gather", "ab,c", rg.gather, lambda t, x, i: x[i], ints={1: (0, 2)}, fixed="a"),
        E("where", "ab,ab", lambda x, y: rg.where(x > y, x, y), lambda t, x, y: t.where(x > y, x, y)),
        E("clip", "ab", lambda x: rg.clip(x, -0.5, 0.5), lambda t, x: t.clamp(x, -0.5, 0.5)),
        E("pad", "ab", lambda x: rg.pad(x, [(1, 0), (0, 2)]), lambda t, x: t.nn.functional.pad(x, (0, 2, 1, 0))),
        E("tile", "ab", lambda x: rg.tile(x, [2, 1]), lambda t, x: x.repeat(2, 1)),
        E("layer_norm", "ab", rg.layer_norm, lambda t, x: t.nn.functional.layer_norm(x, x.shape[-1:])),
        E("rms_norm", "ab", rg.rms_norm,
          lambda t, x: x / t.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)),
        E("batch_norm_eval", "abc,b,b", lambda x, m, v: rg.batch_norm(x, m, rg.abs(v), training=False), _bn_eval,
          static="b"),
        E("conv1d", "abl,cbk", lambda x, w: rg.conv1d(x, w),
          _conv(1), fixed="k", static="bck"),
        E("conv2d", "abhl,cbkk", lambda x, w: rg.conv2d(x, w, padding=1),
          _conv(2, padding=1), fixed="k", static="bck",
          sizes={"h": 3}),
        E("max_pool2d", "abhl", lambda x: rg.max_pool2d(x, 2),
          _pool("max"), sizes={"h": 4}, static="b"),     # 0 channels: folded into the batch in ONNX
        E("avg_pool2d", "abhl", lambda x: rg.avg_pool2d(x, 2),
          _pool("avg"), sizes={"h": 4}, static="b"),
        E("max_pool2d_run_time_channels", "abhl", lambda x: rg.max_pool2d(x, 2), _pool("max"), sizes={"h": 4}),
        E("avg_pool2d_run_time_channels", "abhl", lambda x: rg.avg_pool2d(x, 2), _pool("avg"), sizes={"h": 4}),
        E("attention", "abc,adc,adc", rg.scaled_dot_product_attention, _sdpa),
        E("attention_heads", "eabc,eadc,eadc", rg.scaled_dot_product_attention, _sdpa),
        E("softmax_cross_entropy", "ab,a", rg.softmax_cross_entropy,
          lambda t, x, y: t.nn.functional.cross_entropy(x, y, reduction="none"), ints={1: (0, 3)},
          fixed="b"),
        E("nll_loss", "ab,a", rg.nll_loss,
          lambda t, x, y: t.nn.functional.nll_loss(x, y, reduction="none"), ints={1: (0, 3)}, fixed="b"),
        E("bce_with_logits", "ab,ab", rg.binary_cross_entropy_with_logits,
          lambda t, x, y: t.nn.functional.binary_cross_entropy_with_logits(x, y, reduction="none")),
        E("linear_cross_entropy", "ab,bc,c,a", lambda h, w, b, y: rg.linear_cross_entropy(h, w, b, y),
          lambda t, h, w, b, y: t.nn.functional.cross_entropy(h @ w + b, y, reduction="none"),
          ints={3: (0, 4)}, fixed="c", static="bc"),
    ]


ENTRIES = {e.name: e for e in _entries()} if __name__ == "__main__" else None


def entry_names() -> list[str]:
    """The table's op names, read without importing retrograd (for the parent's parametrize)."""
    import ast
    names = []
    for node in ast.walk(ast.parse(open(__file__).read())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "E":
            names.append(node.args[0].value)
    return names


def entry_spec(name: str) -> dict:
    """An entry's letter sizes and swept letters, read without importing retrograd."""
    import ast
    for node in ast.walk(ast.parse(open(__file__).read())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "E" and node.args[0].value == name:
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg in ("sizes", "fixed")}
            letters = set(node.args[1].value.replace(",", "")) - set(kw.get("fixed", ""))
            return {"sizes": kw.get("sizes", {}), "swept": sorted(letters)}
    raise KeyError(name)


# --- running one case ------------------------------------------------------------------------

def cases(entry: Entry) -> list[dict]:
    """The base sizes, then each swept letter at 0 and at 1."""
    base = {**SIZES, **entry.sizes}
    letters = sorted(set(entry.shapes.replace(",", "")) - set(entry.fixed))
    out = [dict(base)]
    for size in (0, 1):
        for letter in letters:
            out.append({**base, letter: size})
    return out


@dataclass(frozen=True)
class Variant:
    """How a case is run: the float dtype, and the op wrapped in control flow (the fuzzer's
    programs): ``"cond"`` (both branches compute it), ``"scan"`` (``steps`` copies stacked by a
    scan whose body reads the inputs from outside), ``"while"`` (added ``steps`` more times)."""
    dtype: str = "float32"
    wrap: str = "none"
    steps: int = 0
    pred: bool = True


def _arrays(entry: Entry, sizes: dict, rng, dtype: str = "float32") -> list[np.ndarray]:
    arrays = []
    for i, group in enumerate(entry.shapes.split(",")):
        shape = tuple(sizes[c] for c in group)
        if i in entry.ints:
            low, high = entry.ints[i]
            arrays.append(rng.integers(low, high, size=shape).astype("int64"))
        else:
            arrays.append(rng.uniform(0.5, 1.5, size=shape).astype(dtype)
                          * rng.choice([-1.0, 1.0], size=shape).astype(dtype))
    return arrays


def _reference(entry: Entry, arrays, variant: Variant = Variant()):
    """(outputs, gradients) from PyTorch float64 autograd (it raises where torch refuses)."""
    import torch
    tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True) if a.dtype != np.int64
               else torch.tensor(a) for a in arrays]
    outs = entry.ref(torch, *tensors)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    if variant.wrap == "scan":
        outs = [torch.stack([outs[0]] * variant.steps) if variant.steps
                else outs[0].new_zeros((0,) + tuple(outs[0].shape))]
    elif variant.wrap == "while":
        outs = [outs[0] * (variant.steps + 1)]
    floats = [t for t in tensors if t.is_floating_point()]
    grads = []
    if entry.grad:
        total = sum(o.sum() for o in outs if o.is_floating_point())
        grads = torch.autograd.grad(total, floats, allow_unused=True)
        grads = [torch.zeros_like(x) if g is None else g for x, g in zip(floats, grads)]
    return [o.detach().numpy() for o in outs], [g.numpy() for g in grads]


def _wrapped(entry: Entry, xs, variant: Variant):
    """The entry's outputs, built inside the variant's control flow."""
    rg = _rg()
    if variant.wrap == "cond":
        return [rg.cond(rg.data("pred", [], "bool"), lambda: entry.build(*xs), lambda: entry.build(*xs))]
    if variant.wrap == "scan":
        steps = rg.data("steps", [-1, 1], variant.dtype)
        _, ys = rg.scan(lambda c, _: (c, entry.build(*xs)), rg.fill([1], 0.0, variant.dtype), steps)
        return [ys]
    if variant.wrap == "while":
        first = entry.build(*xs)
        _, total = rg.while_loop(lambda i, acc: i < rg.data("count", [], "int64"),
                                 lambda i, acc: (i + 1, acc + entry.build(*xs)),
                                 [rg.constant(np.array(0)), first])
        return [total]
    outs = entry.build(*xs)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def variant_feed(variant: Variant) -> dict:
    """The values a wrapped program reads besides the op's inputs."""
    return {"cond": {"pred": np.array(variant.pred)},
            "scan": {"steps": np.zeros((variant.steps, 1), variant.dtype)},
            "while": {"count": np.array(variant.steps)}}.get(variant.wrap, {})


def _program(entry: Entry, sizes: dict, variant: Variant = Variant()):
    rg = _rg()
    program = rg.Program()
    with rg.program_guard(program, rg.Program()):
        xs = []
        for i, group in enumerate(entry.shapes.split(",")):
            shape = [sizes[c] if c in entry.static else -1 for c in group]
            dtype = "int64" if i in entry.ints else variant.dtype
            xs.append(rg.data(f"x{i}", shape, dtype, stop_gradient=dtype == "int64"))
        outs = _wrapped(entry, xs, variant)
        floats = [x for x in xs if x.dtype == variant.dtype]
        grads = []
        if entry.grad:
            total = rg.add_n([rg.sum(o) for o in outs if o.dtype == variant.dtype])
            grads = [g if g is not None else rg.zeros_like(x)
                     for x, g in zip(floats, rg.gradients(total, floats))]
    return program, [v.name for v in outs + grads], len(outs)


def _run_export(program, feed, fetch):
    rg = _rg()
    import onnxruntime as ort
    model = rg.onnx.export(program, None, fetch)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = {i.name for i in sess.get_inputs()}
    return sess.run(fetch, {k: v for k, v in feed.items() if k in inputs})


def _runners():
    rg = _rg()

    def executor(backend):
        def run(program, feed, fetch):
            return rg.Executor(backend=backend).run(program, feed=feed, fetch_list=fetch)
        return run
    return {"numpy": executor("numpy"), "torch": executor("torch"),
            "engine": executor("onnxruntime"), "export": _run_export}


def _compare(got, want, what: str) -> str | None:
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, torch {want.shape}"
    if not np.allclose(got.astype("float64"), want, rtol=1e-4, atol=1e-4, equal_nan=True):
        return f"{what}: values {got.ravel()[:6]}, torch {want.ravel()[:6]}"
    return None


def run_case(entry: Entry, sizes: dict, runners, variant: Variant = Variant(), seed: int = 0) -> list[str]:
    rg = _rg()
    rng = np.random.default_rng(seed)
    arrays = _arrays(entry, sizes, rng, variant.dtype)
    label = f"{entry.name} {entry.shapes} sizes {''.join(f'{c}={sizes[c]}' for c in sorted(set(entry.shapes) - {','}))}"
    if variant != Variant():
        label += f" {variant}"
    try:
        outs, grads = _reference(entry, arrays, variant)
        wants = outs + grads
    except (RuntimeError, IndexError, ValueError) as exc:
        wants = exc
    program, fetch, n_out = _program(entry, sizes, variant)
    feed = {f"x{i}": a for i, a in enumerate(arrays)}
    feed.update(variant_feed(variant))
    failures, agreed = [], None
    for name, run in runners.items():
        try:
            got = run(program, feed, fetch)
        except rg.RetrogradError as exc:
            if not isinstance(wants, Exception):
                failures.append(f"{label} on {name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        except Exception as exc:     # noqa: BLE001 - a foreign exception is what this sweep reports
            if name == "export" and isinstance(wants, Exception):
                continue                 # an exported model cannot raise a RetrogradError
            failures.append(f"{label} on {name}: foreign {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if isinstance(wants, Exception):     # torch refuses: the runners that ran must agree
            if agreed is None:
                agreed = [np.asarray(a, dtype="float64") for a in got]
                continue
            wants_here = agreed
        else:
            wants_here = wants
        for i, (g, w) in enumerate(zip(got, wants_here)):
            what = f"output {i}" if i < n_out else f"gradient {i - n_out}"
            problem = _compare(g, w, what)
            if problem:
                failures.append(f"{label} on {name}: {problem}")
    return failures


def main() -> None:
    warnings.simplefilter("ignore")
    import onnxruntime as ort
    ort.set_default_logger_severity(4)
    runners = _runners()
    for line in sys.stdin:
        name = line.strip()
        if name.startswith("{"):         # one fuzz case (benchmarks/fuzz_differential.py --ops)
            case = json.loads(name)
            print(json.dumps({"case": case}), flush=True)
            failures = run_case(ENTRIES[case["op"]], case["sizes"], runners, Variant(**case["variant"]),
                                case["seed"])
            print(json.dumps({"op": case["op"], "failures": failures}), flush=True)
            continue
        if name == CRASH:
            print(json.dumps({"case": {"a": 0}}), flush=True)
            os.kill(os.getpid(), signal.SIGFPE)
        entry = ENTRIES[name]
        failures = []
        for sizes in cases(entry):
            print(json.dumps({"case": sizes}), flush=True)
            try:
                failures += run_case(entry, sizes, runners)
            except Exception:        # noqa: BLE001 - building the case failed: report it
                failures.append(f"{name} sizes {sizes}: {traceback.format_exc()[-800:]}")
        print(json.dumps({"op": name, "failures": failures}), flush=True)


if __name__ == "__main__":
    main()
