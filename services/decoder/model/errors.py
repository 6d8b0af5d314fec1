"""Errors raised while locating or loading a model. All are ``ValueError`` subclasses so that
callers (CLI, gRPC adapter) can map them to a clear user-facing message."""


class ModelLoadError(ValueError):
    """The model path is missing, unreadable, truncated or corrupt."""


class UnsupportedArchitectureError(ModelLoadError):
    """The file is a valid model of an architecture this runtime does not implement."""
