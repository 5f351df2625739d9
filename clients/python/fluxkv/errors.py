"""Exceptions of the fluxkv client and the mapping from wire error codes to them.

Every response of the owner carries a ``common.ErrorCode`` and a message (docs/architecture.md §3).
:func:`raise_for` turns a non-OK pair into the matching exception; codes without a
class of their own (BUSY, INTERNAL, STALE_GENERATION after the one retry) raise the base
:class:`Error`. Every exception keeps the wire code in ``code`` and the server's message.
"""

from __future__ import annotations

from fluxkv._gen.common.ttypes import ErrorCode

__all__ = [
    "Error",
    "KeyNotFound",
    "AlreadyExists",
    "NoSpace",
    "InvalidArgument",
    "Unavailable",
    "PermissionDenied",
    "code_name",
    "error_for",
    "raise_for",
]


class Error(Exception):
    """Base class of every fluxkv error. ``code`` is the wire ErrorCode (an int) or None
    for errors found by the client itself; ``message`` is the human-readable text."""

    def __init__(self, message: str = "", code: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        if self.code is None or self.code == ErrorCode.OK:
            return self.message
        name = code_name(self.code)
        return f"{name}: {self.message}" if self.message else name


class KeyNotFound(Error):
    """The key has no readable replica (KEY_NOT_FOUND)."""


class AlreadyExists(Error):
    """``put(..., reject_if_exists=True)`` found the key already present (ALREADY_EXISTS)."""


class NoSpace(Error):
    """The cache could not make room for the value in time (NO_SPACE)."""


class InvalidArgument(Error):
    """The request was refused as malformed: empty or over-long key, zero or over-segment
    length, unknown holder... (INVALID_ARGUMENT), or the client found it unusable itself."""


class Unavailable(Error):
    """The owner cannot be reached or cannot serve now (UNAVAILABLE, or the daemon is gone)."""


class PermissionDenied(Error):
    """The owner does not admit this process (PERMISSION_DENIED), or the socket's
    permissions refused the connection (EACCES): the caller's uid or groups are not
    among those the socket admits. ``usermod -aG GROUP USER`` takes effect at the user's
    next login."""


_BY_CODE: dict[int, type[Error]] = {
    ErrorCode.KEY_NOT_FOUND: KeyNotFound,
    ErrorCode.ALREADY_EXISTS: AlreadyExists,
    ErrorCode.NO_SPACE: NoSpace,
    ErrorCode.INVALID_ARGUMENT: InvalidArgument,
    ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.PERMISSION_DENIED: PermissionDenied,
}


def code_name(code: int) -> str:
    """The IDL name of a wire code, or ``CODE_<n>`` for a code this client does not know."""
    return ErrorCode._VALUES_TO_NAMES.get(code, f"CODE_{code}")


def error_for(code: int, message: str) -> Error:
    """The exception instance for a non-OK wire code."""
    return _BY_CODE.get(code, Error)(message, code)


def raise_for(code: int | None, message: str | None) -> None:
    """Raise the exception for ``code`` unless it is OK. A missing code is a protocol error."""
    if code == ErrorCode.OK:
        return
    if code is None:
        raise Error("response carries no error code: " + (message or ""), ErrorCode.INTERNAL)
    raise error_for(code, message or "")
