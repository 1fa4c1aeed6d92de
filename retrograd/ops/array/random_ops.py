"""Random tensors and sampling: ``rand``, ``randn``, ``randint``, ``categorical``, ``rand_like``,
``randn_like``.

They draw from the keyed generator that ``dropout`` uses
(``retrograd/backends/keyed_random.py``; ``retrograd/onnx/keyed_random.py`` in
exported models): the numbers are a function of (the op's seed, the run's id,
the loop iterations the op runs in), so one program draws the same numbers on
every backend and in exported ONNX, new numbers on every run, and the same
numbers again when an op is recomputed in the backward (``ops/streams.py``).
``rand``/``randn`` are the initialisers' ``UniformRandom``/``GaussianRandom``
ops with ``per_run`` set; the ``_like`` forms take the shape of a Var at run
time. ``seed=None`` takes one from the program (rebuilding it gives the same
seeds).
"""
from __future__ import annotations

from typing import Sequence

from ...errors import ProgramError, ShapeError
from ...ir.builder import current_block
from ...ir.dtypes import canonical, is_float
from ...ir.program import Var, as_int, as_ints
from .creation import normal_onnx, uniform_onnx
from ..core.lowering import lowers
from ..core.registry import append_op, defop
from ..core.shapes import require_float
from ..core.streams import random_key

MAX_INT_RANGE = 1 << 31


def _seed(seed) -> int:
    return current_block().program.next_seed() if seed is None else as_int(seed, "seed")


def _shape(shape, what: str) -> list[int]:
    shape = as_ints([shape] if isinstance(shape, int) else shape, f"{what}: shape")
    if any(d < 0 for d in shape):
        raise ShapeError(f"{what} needs a fully known shape, got {shape}; for a shape known only "
                         f"at run time use {what}_like")
    return shape


def _float_dtype(dtype, what: str) -> str:
    dtype = canonical(dtype)
    if not is_float(dtype):
        raise ProgramError(f"{what}: dtype must be float32 or float64, got {dtype}")
    return dtype


# --- rand / randn (shapes known when built) -------------------------------------------------------

def rand(shape: Sequence[int], seed: int | None = None, dtype: str = "float32") -> Var:
    """Uniform values in [0, 1) of a fixed ``shape``, new ones on every run.

    Example::

        noise = rg.rand([4, 8])                     # float32 [4, 8]
    """
    attrs = {"shape": _shape(shape, "rand"), "dtype": _float_dtype(dtype, "rand"), "low": 0.0,
             "high": 1.0, "seed": _seed(seed), "per_run": True}
    return append_op("UniformRandom", [], attrs, name="rand")[0]


def randn(shape: Sequence[int], seed: int | None = None, dtype: str = "float32") -> Var:
    """Standard normal values of a fixed ``shape``, new ones on every run.

    Example::

        z = rg.randn([16, 32], seed=7)
    """
    attrs = {"shape": _shape(shape, "randn"), "dtype": _float_dtype(dtype, "randn"), "mean": 0.0,
             "std": 1.0, "seed": _seed(seed), "per_run": True}
    return append_op("GaussianRandom", [], attrs, name="randn")[0]


# --- rand_like / randn_like (shapes known at run time) -------------------------------------------------

def _like_rule(ins, attrs):
    return [(ins[0].shape, attrs["dtype"])]


@defop("UniformRandomLike", inputs=("like",), infer=_like_rule, random=True, shape_only=(0,), nondiff=(0,))
def _uniform_like(k, like):
    """Uniform(low, high) values shaped like ``like`` at run time (the key of ``rand``)."""
    a = k.attrs
    return k.backend.random_uniform(random_key(k, a["seed"]), like.shape, a["low"], a["high"], a["dtype"])


@lowers("UniformRandomLike")
def _uniform_like_onnx(g):
    return [uniform_onnx(g, g.shape(g.ins[0]), per_run=True)]


@defop("GaussianRandomLike", inputs=("like",), infer=_like_rule, random=True, shape_only=(0,), nondiff=(0,))
def _gaussian_like(k, like):
    """Normal(mean, std) values shaped like ``like`` at run time (the key of ``randn``)."""
    a = k.attrs
    return k.backend.random_normal(random_key(k, a["seed"]), like.shape, a["mean"], a["std"], a["dtype"])


@lowers("GaussianRandomLike")
def _gaussian_like_onnx(g):
    return [normal_onnx(g, g.shape(g.ins[0]), per_run=True)]


def _like_dtype(x: Var, dtype) -> str:
    if dtype is not None:
        return _float_dtype(dtype, "dtype")
    return x.dtype if is_float(x.dtype) else "float32"


def rand_like(x: Var, seed: int | None = None, dtype: str | None = None) -> Var:
    """Uniform values in [0, 1) with ``x``'s run-time shape (and dtype, when a float), new ones
    on every run. ``x``'s values are not read and get no gradient.

    Example::

        keep = rg.rand_like(h) < 0.9
    """
    attrs = {"dtype": _like_dtype(x, dtype), "low": 0.0, "high": 1.0, "seed": _seed(seed)}
    return append_op("UniformRandomLike", [x], attrs, name="rand_like")[0]


def randn_like(x: Var, seed: int | None = None, dtype: str | None = None) -> Var:
    """Standard normal values with ``x``'s run-time shape (and float dtype), new on every run.

    Example::

        noisy = x + 0.1 * rg.randn_like(x)
    """
    attrs = {"dtype": _like_dtype(x, dtype), "mean": 0.0, "std": 1.0, "seed": _seed(seed)}
    return append_op("GaussianRandomLike", [x], attrs, name="randn_like")[0]


# --- randint -----------------------------------------------------------------------------------------

@defop("RandomIntegers", inputs=(), infer=lambda ins, attrs: [(tuple(attrs["shape"]), "int64")], random=True)
def _random_integers(k):
    """int64 values uniform in [low, high)."""
    a = k.attrs
    return k.backend.random_integers(random_key(k, a["seed"]), a["shape"], a["low"], a["high"])


@lowers("RandomIntegers")
def _random_integers_onnx(g):
    """``low + (h * n) >> 32`` on the keyed hashes, as ``keyed_random.integers``."""
    a = g.attrs
    h = g.random_bits(a["seed"], g.const(list(a["shape"]), "int64"))
    scaled = g.node("Div", [g.node("Mul", [h, g.const(a["high"] - a["low"], "int64")]), g.const(1 << 32, "int64")])
    return [g.node("Add", [scaled, g.const(a["low"], "int64")])]


def randint(low: int, high: int, shape: Sequence[int], seed: int | None = None) -> Var:
    """int64 values uniform in [low, high) of a fixed ``shape`` (``high - low`` at most 2**31),
    new ones on every run.

    Example::

        ids = rg.randint(0, 100, [8])
    """
    low, high = as_int(low, "randint: low"), as_int(high, "randint: high")
    if not 0 < high - low <= MAX_INT_RANGE:
        raise ProgramError(f"randint: needs low < high and high - low <= 2**31, got [{low}, {high})")
    attrs = {"shape": _shape(shape, "randint"), "low": low, "high": high, "seed": _seed(seed)}
    return append_op("RandomIntegers", [], attrs, name="randint")[0]


# --- categorical -------------------------------------------------------------------------------------

def _categorical_rule(ins, attrs):
    logits = ins[0]
    require_float(logits, "logits")
    if logits.ndim != 2:
        raise ShapeError(f"categorical needs logits [N, C], got '{logits.name}': {logits.type_str()}")
    if logits.shape[1] == 0:
        raise ShapeError(f"categorical needs at least one category, '{logits.name}' has 0")
    return [((logits.shape[0],), "int64")]


def check_categories(count: int) -> None:
    """Raise ValueError for logits with no category to draw."""
    if count == 0:
        raise ValueError("categorical needs at least one category (logits [N, 0])")


SEED_MASK = (1 << 63) - 1      # a run-time seed enters the key as seed & SEED_MASK (>= 0)


@defop("Categorical", inputs=("logits", "seed?"), infer=_categorical_rule, random=True, nondiff=(1,))
def _categorical(k, logits, seed=None):
    """One category per row, with probabilities softmax(logits) (the inverse of the row's
    cumulative weights at one keyed uniform draw per row). A ``seed`` input (int64 0-d) takes
    the run id's place in the key: the same seed draws the same categories in every run."""
    check_categories(logits.shape[1])
    key = random_key(k, k.attrs["seed"])
    if seed is not None:
        key[1] = int(k.backend.to_numpy(seed)) & SEED_MASK
    return k.backend.random_categorical(key, logits)


@lowers("Categorical")
def _categorical_onnx(g):
    """``keyed_random.categorical`` node for node: one hash per row, the inverse of the row's
    cumulative weights."""
    logits = g.ins[0]
    run = g.node("BitwiseAnd", [g.ins[1], g.const(SEED_MASK, "int64")]) if len(g.ins) > 1 else None
    h = g.random_bits(g.attrs["seed"], g.node("Shape", [logits], start=0, end=1), run=run)
    u = g.node("Mul", [g.cast(h, "float64"), g.const(2.0 ** -32, "float64")])
    weights = g.cast(logits, "float64")
    top = g.node("ReduceMax", [weights, g.const([1], "int64")], keepdims=1)
    weights = g.node("Exp", [g.node("Sub", [weights, top])])
    cdf = g.node("CumSum", [weights, g.const(1, "int64")])
    total = g.node("Slice", [cdf, g.const([-1], "int64"), g.const([2 ** 62], "int64"), g.const([1], "int64")])
    below = g.node("LessOrEqual", [cdf, g.node("Mul", [g.node("Unsqueeze", [u, g.const([1], "int64")]), total])])
    count = g.node("ReduceSum", [g.cast(below, "int64"), g.const([1], "int64")], keepdims=0)
    return [g.node("Min", [count, g.node("Sub", [g.scalar_dim(logits, 1), g.const(1, "int64")])])]


def categorical(logits: Var, seed: int | Var | None = None) -> Var:
    """int64 [N]: one sample per row of ``logits`` [N, C] from softmax(logits), new on every run
    (-inf logits are never drawn).

    ``seed`` may also be an int64 0-d Var, a seed chosen at run time (as TensorFlow's
    stateless ``tf.random.stateless_categorical``): it takes the run's number's place in the
    keyed generator's key, so the same seed value draws the same samples in every run, on
    every backend and in exported ONNX (whose model then has no ``retrograd.run_id`` input for
    this op). Negative seeds count modulo 2**63.

    Example::

        next_char = rg.categorical(logits / temperature)
        seed = rg.data("seed", [], dtype="int64")
        same_every_run = rg.categorical(logits, seed=seed)
    """
    if isinstance(seed, Var):
        if seed.dtype != "int64" or seed.ndim != 0:
            raise ShapeError(f"categorical: a seed Var must be int64 0-d, got '{seed.name}': {seed.type_str()}")
        return append_op("Categorical", [logits, seed], {"seed": _seed(None)}, name="categorical")[0]
    return append_op("Categorical", [logits], {"seed": _seed(seed)}, name="categorical")[0]
