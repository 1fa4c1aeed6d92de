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
