"""DraftDeck's errors: one base, narrow subclasses, messages that say what, where and how to fix."""

from __future__ import annotations


class DraftDeckError(Exception):
    """Base of every error DraftDeck raises on purpose."""


class UsageError(DraftDeckError, ValueError):
    """The caller asked for something that cannot work (exit code 2 in the CLI, 400 in the API).

    `fields`: what is wrong with each named parameter, for a form to mark the fields."""

    def __init__(self, message: str, fields: dict[str, str] | None = None):
        super().__init__(message)
        self.fields = fields or {}


class PathNotAllowedError(UsageError):
    """A path resolves outside the configured data roots."""


class InputError(DraftDeckError):
    """An input file cannot be read at all (missing, a directory, unreadable)."""


class PolicyError(UsageError):
    """A policy file or option is not valid."""


class AccountingError(DraftDeckError, AssertionError):
    """Rows in != rows out + rows rejected: a bug, never a data problem."""


class JobFailed(DraftDeckError):
    """The job ran to the end but its result fails the policy (exit code 1 in the CLI)."""

    def __init__(self, message: str, report: object | None = None):
        super().__init__(message)
        self.report = report


class Cancelled(DraftDeckError):
    """The job was cancelled while it ran."""


def crash_message(exc: BaseException) -> str:
    """A failure's reason: a DraftDeckError's own words (the data or the parameters), otherwise an
    internal error naming the exception."""
    return str(exc) if isinstance(exc, DraftDeckError) else f"internal error: {type(exc).__name__}: {exc}"
