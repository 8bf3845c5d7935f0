"""The policy file, re-read when it changes; an invalid new file is refused and the old stays.

Each poll reads the file through its path and compares the content's hash with that of the
policy in force. Reading a policy file once a round costs nothing worth saving, and it is what
makes every way of changing the file count: an edit in place within one tick of the file
system's coarse timestamps, and a ConfigMap mount, which swaps a ``..data`` symlink to a new
folder while the path the engine was given stays the same (the read follows the new link).
An unchanged file never reloads, so a refused file is logged and counted once, not each round.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scheduler_policy.policy.file import load_policy
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.errors import TideError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PolicyRead:
    """One read of a changed policy file.

    Attributes:
        policy: the new policy, now in force; None when the file was refused.
        error: why it was refused, naming the file; None when it took effect.
    """

    policy: ElasticPolicy | None
    error: str | None

    @property
    def valid(self) -> bool:
        """True when the file took effect."""
        return self.policy is not None


class PolicyWatcher:
    """Holds the policy in force and re-reads its file when the file changes.

    Args:
        path: the policy file.
        load: reads and validates a policy file (``load_policy``).

    Attributes:
        policy: the policy in force; None until a valid file was read.
    """

    def __init__(self, path: Path, *, load: Callable[[Path], ElasticPolicy] = load_policy) -> None:
        self.path = path
        self._load = load
        self.policy: ElasticPolicy | None = None
        self._in_force: str | None = None  # the hash of the content in force
        self._seen: str | None = None  # the hash (or read error) of the last content read

    def poll(self) -> PolicyRead | None:
        """Read the file; act on it if it changed since the last poll.

        Returns:
            None when the content is the one last read; else the new policy in force, or
            the error that refused it (the old policy stays in force).
        """
        try:
            content = self.path.read_bytes()
        except OSError as e:
            error = f"{self.path}: cannot be read: {e.strerror or e}"
            return self._refuse(error, seen=error)
        digest = hashlib.sha256(content).hexdigest()
        if digest == self._seen:
            return None
        if digest == self._in_force:  # back to the policy in force after a refused file
            self._seen = digest
            return PolicyRead(self.policy, None)
        try:
            policy = self._load(self.path)
        except TideError as e:
            return self._refuse(str(e), seen=digest)
        except OSError as e:
            return self._refuse(f"{self.path}: cannot be read: {e.strerror or e}", seen=digest)
        # Should the file change between the two reads, the next poll's hash differs: read again.
        self.policy, self._in_force, self._seen = policy, digest, digest
        return PolicyRead(policy, None)

    def _refuse(self, error: str, *, seen: str) -> PolicyRead | None:
        if seen == self._seen:
            return None  # refused already
        self._seen = seen
        return PolicyRead(None, error)
