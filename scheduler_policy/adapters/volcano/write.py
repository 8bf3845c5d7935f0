"""Writing a replica change to a Volcano Job: one JSON patch, retried over conflicts.

The only write the engine makes. The patch (``volcano_job.replica_patch``) tests the task's
name, its replicas and the Job's resourceVersion, replaces the replicas (and the task's
``minAvailable`` where Volcano's admission rules need it) and stores the engine's memory in
the same request, sent as ``application/json-patch+json``. A Job that changed under the patch
is read again and the patch rebuilt while it still has the replicas the change was decided
from; a refusal becomes a typed error naming the Job, the HTTP status, the API's message and
the patch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from scheduler_policy.adapters.volcano.counts import RequestCounter
from scheduler_policy.adapters.volcano.errors import (
    JobNotFound,
    NotElastic,
    PatchFailed,
    PatchForbidden,
    PatchRefused,
)
from scheduler_policy.adapters.volcano.events import EventRecorder, JobEvent
from scheduler_policy.adapters.volcano.informer import Informer
from scheduler_policy.adapters.volcano_job import UnreadJob, VolcanoJob, read_job, replica_patch
from scheduler_policy.policy.annotations import ELASTIC
from scheduler_policy.vocabulary.errors import ConflictError, PermanentError
from scheduler_policy.vocabulary.protocols import ReplicaChange
from scheduler_policy.vocabulary.state import JobKey

__all__ = ["BATCH", "JSON_PATCH", "JobWriter", "api_message", "split_key"]

logger = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
"""The content type of every write: without it the Python client sends a merge patch."""

BATCH = ("batch.volcano.sh", "v1alpha1")


def split_key(key: str) -> tuple[str, str]:
    """``namespace/name`` as ``(namespace, name)``."""
    namespace, _, name = key.partition("/")
    return namespace, name


def api_message(e: ApiException) -> str:
    """What the API server said: the Status object's message, else the HTTP reason."""
    body = e.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str) and body:
        try:
            status = json.loads(body)
        except ValueError:
            return body[:500]
        if isinstance(status, Mapping) and isinstance(status.get("message"), str):
            return str(status["message"])
        return body[:500]
    return str(e.reason or "no message")


def _reason(change: ReplicaChange) -> str:
    reason = change.reason
    return str(reason.value) if hasattr(reason, "value") else str(reason)


class JobWriter:
    """Writes ``ReplicaChange``s to Volcano Jobs.

    Args:
        custom: the custom-objects API.
        jobs: the client's cache of Jobs: what a write starts from when it is synced, and
            where the written Job goes (so that the next list reads the write).
        watching: whether ``jobs`` is kept by a watch (else every write reads the Job first).
        namespace: the one namespace it may write to; None for any.
        max_retries: times a patch is rebuilt and sent again after a conflict.
        counter: where requests are counted.
        recorder: where the Events go; None for none.
    """

    def __init__(
        self,
        custom: k8s.CustomObjectsApi,
        *,
        jobs: Informer[VolcanoJob],
        watching: bool,
        namespace: str | None,
        max_retries: int,
        counter: RequestCounter,
        recorder: EventRecorder | None,
    ) -> None:
        self._custom = custom
        self._jobs = jobs
        self._watching = watching
        self._namespace = namespace
        self._max_retries = max_retries
        self._counter = counter
        self._recorder = recorder

    def _get_job(self, key: JobKey) -> VolcanoJob:
        """Read one Job from the API server (not the cache).

        Raises:
            JobNotFound: it does not exist.
            PatchForbidden: the client may not read it.
            PatchFailed: no answer, or a 5xx.
        """
        namespace, name = split_key(key)
        self._counter.add("gets")
        try:
            obj = self._custom.get_namespaced_custom_object(*BATCH, namespace, "jobs", name)
        except ApiException as e:
            raise self._refusal(key, e, []) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise PatchFailed(job=key, status=None, api_message=str(e), patch=[]) from e
        read = read_job(obj, source=key)
        if isinstance(read, UnreadJob):
            raise PermanentError(f"Job {key}: cannot be read: {read.problem}")
        if self._watching and isinstance(obj, Mapping):
            self._jobs.put(obj)
        return read

    def _job_for_write(self, key: JobKey) -> VolcanoJob:
        namespace, name = split_key(key)
        if not namespace or not name:
            raise PermanentError(f"Job {key!r}: not a namespace/name key")
        if self._namespace is not None and namespace != self._namespace:
            raise PermanentError(
                f"Job {key}: outside the namespace {self._namespace} this client manages"
            )
        if self._watching and self._jobs.synced:
            cached = self._jobs.get(key)
            if cached is not None:
                return cached
        return self._get_job(key)

    @staticmethod
    def _refusal(key: str, e: ApiException, patch: list[dict[str, object]]) -> Exception:
        """The typed error for an API refusal."""
        status = int(e.status or 0)
        message = api_message(e)
        if status == 404:
            return JobNotFound(job=key, status=status, api_message=message, patch=patch)
        if status == 403:
            return PatchForbidden(job=key, status=status, api_message=message, patch=patch)
        if status == 429 or status >= 500 or status == 0:
            return PatchFailed(job=key, status=status or None, api_message=message, patch=patch)
        return PatchRefused(job=key, status=status, api_message=message, patch=patch)

    def apply(self, change: ReplicaChange) -> None:
        """Write one change (``ClusterClient.apply``).

        One JSON patch (``volcano_job.replica_patch``): the replicas, the task's
        ``minAvailable`` where the admission rules need it, and the memory annotation. When
        the Job changed since it was read (HTTP 409, or a failed ``test``), it is read again
        and the patch rebuilt while it still has ``from_replicas``, at most
        ``max_conflict_retries`` times. A change of replicas is followed by an Event on the
        Job (its failure is logged, never raised).

        Raises:
            ConflictError: the Job no longer has ``from_replicas``, or kept changing.
            NotElastic: the Job lacks the ``tide.io/elastic: "true"`` annotation.
            JobNotFound: the Job does not exist.
            PatchForbidden: RBAC refuses the patch (HTTP 403).
            PatchRefused: the API server or an admission rule refused it (HTTP 400, 422).
            PatchFailed: HTTP 5xx or 429, or no answer: it may succeed later.
            PermanentError: the change cannot be written at all (its memory cannot be
                encoded, the Job has no such task).
        """
        key = change.job
        job = self._job_for_write(key)
        attempt = 0
        while True:
            state = job.state
            if not state.elastic:
                raise NotElastic(
                    f'Job {key}: not marked {ELASTIC}: "true"; tide never writes to it'
                )
            if state.task != change.task or state.current_replicas != change.from_replicas:
                raise ConflictError(
                    f"Job {key}: task {state.task!r} has {state.current_replicas} replicas now; "
                    f"the change to {change.to_replicas} was decided from "
                    f"{change.from_replicas} of task {change.task!r}"
                )
            try:
                patch = replica_patch(job, change)
            except ValueError as e:
                raise PermanentError(str(e)) from e
            namespace, name = split_key(key)
            self._counter.add("patches")
            try:
                written = self._custom.patch_namespaced_custom_object(
                    *BATCH, namespace, "jobs", name, patch, _content_type=JSON_PATCH
                )
            except ApiException as e:
                if e.status not in (409, 422):
                    raise self._refusal(key, e, patch) from e
                # A failed ``test`` and an admission rule both answer 422 ("Invalid"); the
                # former says no more than "the server rejected our request". The Job read
                # again tells them apart: unchanged, the patch itself was refused.
                current = self._get_job(key)
                unchanged = (
                    current.resource_version is not None
                    and current.resource_version == job.resource_version
                )
                if e.status == 422 and unchanged:
                    raise self._refusal(key, e, patch) from e
                if attempt >= self._max_retries:
                    raise ConflictError(
                        f"Job {key}: still changing after {attempt + 1} patches "
                        f"(HTTP {e.status}: {api_message(e)})"
                    ) from e
                attempt += 1
                self._counter.add("retries")
                logger.info("Job %s: changed under the patch (HTTP %s); patching it again",
                            key, e.status)  # fmt: skip
                job = current
                continue
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise PatchFailed(job=key, status=None, api_message=str(e), patch=patch) from e
            if self._watching and isinstance(written, Mapping):
                self._jobs.put(written)
            level = logging.INFO if change.to_replicas != change.from_replicas else logging.DEBUG
            logger.log(
                level, "Job %s: task %s %d -> %d replicas (%s), memory stored",
                key, change.task, change.from_replicas, change.to_replicas, _reason(change),
            )  # fmt: skip
            self._event(job, change)
            return

    def _event(self, job: VolcanoJob, change: ReplicaChange) -> None:
        """An Event on the Job for a change of replicas (not for a memory-only write)."""
        if self._recorder is None or change.to_replicas == change.from_replicas:
            return
        namespace, name = split_key(change.job)
        try:
            message = change.message
        except Exception as e:  # the write has succeeded: a bad explanation must not fail it
            message = str(change.why)
            logger.warning("Job %s: the change's explanation failed to render: %s", change.job, e)
        self._recorder.record(
            JobEvent(namespace=namespace, name=name, uid=job.uid, reason=_reason(change),
                     message=message, time_s=time.time())
        )  # fmt: skip
