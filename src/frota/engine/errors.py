"""Errors the engine raises to its callers."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine refuses before doing any work (the server maps it to HTTP 400,
    with `code` as the OpenAI error code when set)."""

    code: str | None = None

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ContextLengthError(InvalidRequestError):
    """A request that does not fit the context window (`frota.engine.context`)."""

    code = "context_length_exceeded"


class ModelNotFoundError(FileNotFoundError):
    """The model argument names no alias, file, directory or synthetic spec."""


class UnsupportedModelError(ValueError):
    """The model exists but its architecture or format is not one Frota implements."""
