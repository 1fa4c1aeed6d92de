"""The exceptions retrograd raises for user mistakes.

Every error a user can cause is a subclass of :class:`RetrogradError`, and its
message names the op, the block and the variable involved.
"""


class RetrogradError(Exception):
    """Base class of every error retrograd raises on bad input."""


class ProgramError(RetrogradError):
    """The program is ill-formed: unknown op, bad shapes, missing variable."""


class FeedError(RetrogradError):
    """A feed is missing or has the wrong shape or dtype."""


class ExecutionError(RetrogradError):
    """A kernel failed at run time; the message names the op and its inputs."""


class BackendError(RetrogradError):
    """A backend cannot do what was asked: unknown backend or device, missing library
    (the message names the pip extra to install), an op the backend cannot run, or an
    array that lives on another device than the executor's."""


class FeedDeviceError(FeedError, BackendError):
    """A feed (or scope value) is an array of another library or device than the executor's."""


class ShapeError(ProgramError):
    """Raised by shape rules; the builder adds which op and variables it concerns."""


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
