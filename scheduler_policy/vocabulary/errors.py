"""The policy engine's exceptions: one base, temporary versus permanent failures."""

from __future__ import annotations


class TideError(Exception):
    """Base of every error the policy engine raises."""


class PolicyError(TideError):
    """A policy file, or a job's annotations, are invalid.

    Attributes:
        source: the file or object the errors are in.
        problems: every problem found, each naming its path and value.
    """

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        listing = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n{listing}")

    def __reduce__(self) -> tuple[type[PolicyError], tuple[str, list[str]]]:
        # Rebuilt from its fields, so that it survives the trip back from a worker process.
        return type(self), (self.source, self.problems)


class ObservationError(TideError):
    """An observation file is invalid; the message names the file, path and value."""


class TemporaryError(TideError):
    """A write or read that may succeed if retried later."""


class ConflictError(TemporaryError):
    """The object changed since it was read (HTTP 409 or a failed JSON-patch test)."""


class PermanentError(TideError):
    """A write that will not succeed as asked (HTTP 403, 422)."""


class ModelFitError(TideError):
    """A model could not be fitted to the data it was given."""
