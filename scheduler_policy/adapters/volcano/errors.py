"""What the Volcano client raises: the vocabulary's temporary and permanent failures, typed.

The core never sees an ``ApiException``: the client wraps each into one of these, ``from`` it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from scheduler_policy.vocabulary.errors import PermanentError, TemporaryError

__all__ = ["JobNotFound", "NotElastic", "PatchFailed", "PatchForbidden", "PatchRefused"]


def _show_patch(patch: Sequence[object]) -> str:
    return json.dumps(list(patch), separators=(",", ":"), default=str)


class PatchRefused(PermanentError):
    """The API server refused a write to a Job and will refuse it again (HTTP 400, 403, 404,
    422: an admission rule, RBAC, a Job that is gone).

    Attributes:
        job: the Job's key, ``namespace/name``.
        status: the HTTP status.
        api_message: what the API server said.
        patch: the JSON patch it refused.
    """

    def __init__(self, *, job: str, status: int, api_message: str, patch: Sequence[object]) -> None:
        self.job = job
        self.status = status
        self.api_message = api_message
        self.patch = list(patch)
        super().__init__(
            f"Job {job}: the API server refused the patch (HTTP {status}): {api_message}; "
            f"patch {_show_patch(self.patch)}"
        )


class PatchForbidden(PatchRefused):
    """HTTP 403: the engine's service account may not patch the Job (see the package's RBAC)."""


class JobNotFound(PatchRefused):
    """HTTP 404, or not in the client's view: the Job does not exist (any more)."""


class NotElastic(PermanentError):
    """A change for a Job without the ``tide.io/elastic: "true"`` annotation: never written."""


class PatchFailed(TemporaryError):
    """A write that may succeed later (HTTP 5xx or 429, a timeout, a connection refused).

    Attributes:
        job: the Job's key.
        status: the HTTP status; None when no answer came.
        api_message: what the API server (or the connection) said.
        patch: the JSON patch that was sent.
    """

    def __init__(
        self, *, job: str, status: int | None, api_message: str, patch: Sequence[object]
    ) -> None:
        self.job = job
        self.status = status
        self.api_message = api_message
        self.patch = list(patch)
        answer = "no answer" if status is None else f"HTTP {status}"
        super().__init__(
            f"Job {job}: the patch failed ({answer}), may succeed later: {api_message}; "
            f"patch {_show_patch(self.patch)}"
        )
