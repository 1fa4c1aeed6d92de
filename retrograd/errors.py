"""The exceptions retrograd raises for user mistakes.

Every error a user can cause is a subclass of :class:`RetrogradError`, and its
message names the op, the block and the variable involved.
"""


class RetrogradError(Exception):
    """Base class of every error retrograd raises on bad input.

    Example:
        ```python
        import retrograd as rg

        try:
            with rg.program_guard(rg.Program()):
                rg.matmul(rg.data("a", [2, 3]), rg.data("b", [4, 5]))
        except rg.RetrogradError as exc:               # ShapeError is one
            print(type(exc).__name__, exc)
        ```
    """


class ProgramError(RetrogradError):
    """The program is ill-formed: unknown op, bad shapes, missing variable.

    Example:
        ```python
        import retrograd as rg

        main = rg.Program()
        try:
            main.global_block().var("missing")
        except rg.ProgramError as exc:
            print(exc)                                 # block 0 has no variable 'missing' ...
        ```
    """


class FeedError(RetrogradError):
    """A feed is missing or has the wrong shape or dtype (or a fetch has no value).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            y = rg.exp(rg.data("x", [-1, 3]))
        try:
            rg.Executor().run(main, feed={"x": np.zeros((2, 4), "float32")}, fetch_list=[y])
        except rg.FeedError as exc:
            print(exc)                                 # names the feed, both shapes and the reading op
        ```
    """


class ExecutionError(RetrogradError):
    """A kernel failed at run time; the message names the op, its inputs and the user's line.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            table = rg.data("table", [3, 2])
            ids = rg.data("ids", [2], dtype="int64")
            rows = rg.gather(table, ids)
        feed = {"table": np.zeros((3, 2), "float32"), "ids": np.array([0, 5])}
        try:
            rg.Executor().run(main, feed=feed, fetch_list=[rows])
        except rg.ExecutionError as exc:           # id 5 is out of range [0, 3)
            print(exc)
        ```
    """


class BackendError(RetrogradError):
    """A backend cannot do what was asked.

    That is an unknown backend or device, a missing library (the message names
    the pip extra to install), an op the backend cannot run, or an array that
    lives on another device than the executor's.

    Example:
        ```python
        import retrograd as rg

        try:
            rg.Executor(backend="numpy", device="cuda")
        except rg.BackendError as exc:
            print(exc)                                 # backend "numpy" runs on device "cpu" only ...
        ```
    """


class FeedDeviceError(FeedError, BackendError):
    """A feed (or scope value) is an array of another library or device than the executor's."""


class ShapeError(ProgramError):
    """Raised by shape rules; the builder adds which op and variables it concerns.

    Example:
        ```python
        import retrograd as rg

        try:
            with rg.program_guard(rg.Program()):
                rg.data("a", [2, 3]) + rg.data("b", [4])
        except rg.ShapeError as exc:
            print(exc)
        ```
    """


def kernel_failure(where: str, exc: Exception, inputs=None) -> ExecutionError:
    """The ExecutionError of an op (``where``: ``op.where()``) whose kernel raised ``exc``; with
    ``inputs`` ((name, array) pairs; stand-ins of the right shape and dtype will do) it lists
    them. The executor and the onnxruntime engine's run-time checks word failures with it."""
    if inputs is None:
        return ExecutionError(f"{where} failed: {type(exc).__name__}: {exc}")
    shapes = ", ".join(f"{name}: {_shape_of(array)}" for name, array in inputs)
    return ExecutionError(f"{where} failed: {type(exc).__name__}: {exc} (inputs: {shapes or 'none'})")


def _shape_of(array) -> str:
    shape = getattr(array, "shape", None)
    dtype = getattr(array, "dtype", None)
    return f"{dtype}{list(shape)}" if shape is not None else type(array).__name__
