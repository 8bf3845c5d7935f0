"""Kubernetes Events on the Jobs tide changes, sent from a thread of their own.

An Event is a courtesy to people (``kubectl describe``): the write it reports has already
succeeded, so a failed Event is logged and never fails the write, and sending it never holds
up the next write. A bounded queue takes them; when it is full, an Event is dropped with a
warning.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from kubernetes import client as k8s

from scheduler_policy.adapters.volcano.counts import RequestCounter
from scheduler_policy.adapters.volcano_job import API_VERSION

__all__ = ["EVENT_MESSAGE_MAX", "EventRecorder", "JobEvent"]

logger = logging.getLogger(__name__)

EVENT_MESSAGE_MAX = 1024
"""Characters of an Event's message kept (the limit events.k8s.io sets)."""
QUEUE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class JobEvent:
    """What one Event says about one Volcano Job.

    Attributes:
        namespace: the Job's namespace.
        name: the Job's name.
        uid: the Job's ``metadata.uid``; None when unknown.
        reason: the CamelCase reason.
        message: the sentence for people.
        time_s: when the change was written, seconds since the epoch.
    """

    namespace: str
    name: str
    uid: str | None
    reason: str
    message: str
    time_s: float


class EventRecorder:
    """Sends ``JobEvent``s as core v1 Events (``create``: the one verb on events it uses).

    Args:
        core: the core v1 API.
        component: the Events' source and reporting component.
        counter: where the Events sent are counted.
        background: send from a daemon thread (the engine's loop); False sends in the
            caller's thread (a single reconcile, whose process may end right after).
    """

    def __init__(
        self, core: k8s.CoreV1Api, *, component: str, counter: RequestCounter, background: bool
    ) -> None:
        self._core = core
        self._component = component
        self._instance = socket.gethostname()
        self._counter = counter
        self._background = background
        self._queue: queue.Queue[JobEvent | None] = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def record(self, event: JobEvent) -> None:
        """Send ``event``, now or from the thread; never raises."""
        if not self._background:
            self._send(event)
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tide-events", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            logger.warning("Job %s/%s: Event %s dropped: %d Events wait to be sent",
                           event.namespace, event.name, event.reason, QUEUE_SIZE)  # fmt: skip

    def flush(self, timeout_s: float) -> bool:
        """Wait until every recorded Event has been sent (or failed); whether they have."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def stop(self, timeout_s: float) -> bool:
        """Send what is queued (within ``timeout_s``), then end the thread; whether it ended."""
        thread = self._thread
        if thread is None:
            return True
        self.flush(timeout_s)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            return False
        thread.join(max(0.1, timeout_s))
        return not thread.is_alive()

    @property
    def running(self) -> bool:
        """Whether the sending thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            try:
                if event is None:
                    return
                self._send(event)
            finally:
                self._queue.task_done()

    def _send(self, event: JobEvent) -> None:
        when = datetime.fromtimestamp(event.time_s, tz=timezone.utc)
        body = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name=f"{event.name}.", namespace=event.namespace),
            involved_object=k8s.V1ObjectReference(
                api_version=API_VERSION, kind="Job", name=event.name,
                namespace=event.namespace, uid=event.uid,
            ),
            reason=event.reason,
            message=event.message[:EVENT_MESSAGE_MAX],
            type="Normal",
            source=k8s.V1EventSource(component=self._component),
            reporting_component=self._component,
            reporting_instance=self._instance,
            first_timestamp=when,
            last_timestamp=when,
            count=1,
        )  # fmt: skip
        self._counter.add("events")
        try:
            self._core.create_namespaced_event(event.namespace, body)
        except Exception as e:  # a courtesy: never fails the write it reports
            logger.warning("Job %s/%s: the Event %s was not created: %s",
                           event.namespace, event.name, event.reason, e)  # fmt: skip
