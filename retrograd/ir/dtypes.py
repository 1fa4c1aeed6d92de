"""The dtypes a Var may hold, and the rules for mixing them.

``bfloat16`` and ``float16`` are the low-precision floats of mixed precision
(``rg.amp``). NumPy has no bfloat16 of its own: ``numpy_dtype("bfloat16")`` is
``ml_dtypes.bfloat16``, imported only when asked for.
"""
from __future__ import annotations

import numpy as np

from ..errors import BackendError, ProgramError

DTYPES = ("float32", "float64", "int64", "int32", "bool", "bfloat16", "float16")
FLOAT_DTYPES = ("float32", "float64", "bfloat16", "float16")
LOW_FLOAT_DTYPES = ("bfloat16", "float16")
_WIDTH = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}   # float16 and bfloat16 mix to float32


def canonical(dtype) -> str:
    """Return the dtype's name as retrograd spells it ("float32", ...)."""
    if isinstance(dtype, str) and dtype in DTYPES:
        if dtype == "bfloat16":
            _register_bfloat16()
        return dtype
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError, KeyError) as exc:
        name = getattr(dtype, "name", None) if not isinstance(dtype, str) else None
        if name not in DTYPES:      # a torch or another library's dtype object: its last word
            name = str(dtype).rsplit(".", 1)[-1]
        if name not in DTYPES:
            raise ProgramError(f"unknown dtype {dtype!r:.40}; use one of {', '.join(DTYPES)}") from exc
    if name not in DTYPES:
        raise ProgramError(f"unsupported dtype {name!r}; use one of {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_low_float(dtype: str) -> bool:
    return dtype in LOW_FLOAT_DTYPES


def promote(a: str, b: str) -> str:
    """Result dtype of a binary arithmetic op (NumPy's rule restricted to our dtypes).

    A low-precision float keeps its dtype against an integer or bool (as a
    weak Python scalar would), and float16 with bfloat16 gives float32 (as torch).
    """
    if a == b:
        return a
    if is_float(a) and is_float(b):
        wider = max(a, b, key=_WIDTH.__getitem__)
        return "float32" if _WIDTH[wider] == 1 else wider
    if is_low_float(a) or is_low_float(b):
        return a if is_low_float(a) else b
    return canonical(np.promote_types(a, b))


def _register_bfloat16() -> None:
    """Import ml_dtypes where installed, so that NumPy reads the name "bfloat16" (``np.dtype``,
    ``astype``); a backend that needs it and lacks it says so (``numpy_dtype``)."""
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        pass


def numpy_dtype(name: str) -> np.dtype:
    """NumPy's dtype for a retrograd dtype name; bfloat16 is ``ml_dtypes.bfloat16``."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise BackendError("bfloat16 on NumPy needs the ml_dtypes package "
                               "(pip install 'retrograd[amp]' or pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
