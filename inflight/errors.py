"""Errors of one request, as opposed to the engine's (EngineDeadError)."""
from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request's input breaks a documented limit; the message names the field and
    the limit. The server answers it with a 400; any other exception is a 500."""


class RequestError(RuntimeError):
    """One request failed on the step thread for a reason not its input's, and was
    finished alone; the engine goes on. The server answers a 500 naming ``request_id``."""

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id
