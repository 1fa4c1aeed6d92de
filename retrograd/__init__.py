"""retrograd: define-then-run deep learning whose backward pass is a program.

Example::

    import retrograd as rg
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        h = rg.layers.fc(x, 16, act="tanh", name="fc1")
        loss = rg.mean(h * h)
        params_grads = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    loss_v, = exe.run(main, feed={"x": xb}, fetch_list=[loss])
"""
from .errors import BackendError, ExecutionError, FeedError, ProgramError, RetrogradError, ShapeError
from .ir import (Block, Op, Program, Var, block_guard, default_main_program,
                 default_startup_program, program_guard)
from .ops import *  # noqa: F401,F403  (the math/tensor/nn builders)
from .ops import OPS
from .runtime import Executor, RunStats, Scope, ScopeError
from . import backends  # noqa: F401  (rg.backends.get_backend; torch/cupy load only when asked for)

__version__ = "0.1.0"
from .autodiff import append_backward, gradients  # noqa: E402
from . import optim  # noqa: E402
from . import distributed  # noqa: E402  (registers AllReduce/Broadcast; starts no MPI)
from .io import ParamFileError, load_params, read_params, save_params  # noqa: E402
from . import layers  # noqa: E402
from . import memory  # noqa: E402
from . import testing  # noqa: E402
from . import onnx  # noqa: E402  (rg.onnx.export; onnx itself is imported only when exporting)
from . import passes  # noqa: E402  (whole-program rewrites: rg.passes.optimize_for_engine)

# --- the public namespace (keep this block last) ---------------------------------------------
# `dir(rg)` and `from retrograd import *` give the API: the classes and functions imported above
# (the op builders are whatever retrograd/ops/__init__.py exports) and the public subpackages.
# The ops package's modules (math, loop_grad, ...), which `from .ops import *` brought along,
# are dropped here; every module stays importable under its own name (retrograd.ops.math.elementwise).
import types as _types  # noqa: E402

_SUBPACKAGES = ("backends", "distributed", "layers", "memory", "onnx", "optim", "passes", "testing")
_UNLISTED = ("autodiff", "backend", "errors", "io", "ir", "ops", "runtime")   # kept, not listed
for _name, _value in list(globals().items()):
    if isinstance(_value, _types.ModuleType) and not _name.startswith("_") \
            and _name not in _SUBPACKAGES + _UNLISTED:
        del globals()[_name]
__all__ = sorted(n for n, v in globals().items() if not n.startswith("_")
                 and not isinstance(v, _types.ModuleType)) + list(_SUBPACKAGES)
del _name, _value


def __dir__() -> list[str]:
    return sorted(__all__ + ["__version__"])
