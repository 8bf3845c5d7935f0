"""One kind of object kept current by list-then-watch: the client's cache of the API server.

An ``Informer`` lists its kind once (in pages), then follows a watch from the list's
``resourceVersion`` in a daemon thread, keeping each object (as its reader turns it) by uid.
It re-lists when the server says the version is too old (410 Gone), reconnects after any
other failure with a bounded, doubling backoff, and stops within a bounded time: ``stop``
shuts the watch's socket, so the thread never waits for the server's timeout.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from kubernetes.client.exceptions import ApiException
from kubernetes.watch import Watch

from scheduler_policy.adapters.volcano.counts import RequestCounter

__all__ = ["Informer", "newer"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

HTTP_GONE = 410
PAGE_SIZE = 500
"""Objects per page of a list: a large cluster lists in several requests, none huge."""


def newer(version: str | None, than: str | None) -> bool:
    """Whether resourceVersion ``version`` is at least ``than``.

    Kubernetes calls versions opaque, but every API server backed by etcd writes them as the
    etcd revision, an integer; when either is not one, the later arrival wins.
    """
    if version is None or than is None:
        return True
    if version.isdigit() and than.isdigit():
        return int(version) >= int(than)
    return True


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _uid(obj: Mapping[str, Any]) -> str:
    metadata = _metadata(obj)
    uid = metadata.get("uid")
    if isinstance(uid, str) and uid:
        return uid
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


class Informer(Generic[T]):
    """A cache of one kind, filled by a list and kept current by a watch.

    Args:
        kind: the kind, for logs (``Job``, ``Pod``).
        call: the API's list function (it also watches, with ``watch=True``).
        args: its positional arguments (group, version, plural, namespace).
        read: turns one object into what is kept; None to keep nothing for it (it was
            malformed, and the reader logged why, or it is not wanted).
        counter: where the requests made are counted.
        on_event: called from the watch thread with (before, after) for each object that
            changed (None for absent); exceptions it raises are logged.
        key: what an item is found by with ``get`` (e.g. a Job's ``namespace/name``).
        list_kwargs: further arguments of every list and watch (selectors).
        watch_timeout_s: how long the server keeps one watch open.
        backoff_max_s: the longest wait before reconnecting after a failure.
    """

    def __init__(
        self,
        *,
        kind: str,
        call: Callable[..., Any],
        args: tuple[str, ...],
        read: Callable[[Mapping[str, Any]], T | None],
        counter: RequestCounter,
        on_event: Callable[[T | None, T | None], None] | None = None,
        key: Callable[[T], str] | None = None,
        list_kwargs: Mapping[str, str] | None = None,
        watch_timeout_s: float = 300.0,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.kind = kind
        self._call = call
        self._args = args
        self._read = read
        self._counter = counter
        self._on_event = on_event
        self._key = key
        self._by_key: dict[str, str] = {}
        self._list_kwargs = dict(list_kwargs or {})
        self._watch_timeout_s = watch_timeout_s
        self._backoff_max_s = backoff_max_s
        self._lock = threading.Lock()
        self._items: dict[str, tuple[str | None, T]] = {}
        self._version: str | None = None
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Watch | None = None

    # -- the cache ---------------------------------------------------------------------------

    def items(self) -> list[T]:
        """What is kept now, one per object."""
        with self._lock:
            return [item for _, item in self._items.values()]

    def get(self, key: str) -> T | None:
        """The item whose ``key`` is ``key``; None when none is kept."""
        with self._lock:
            uid = self._by_key.get(key)
            held = None if uid is None else self._items.get(uid)
            return None if held is None else held[1]

    @property
    def synced(self) -> bool:
        """Whether the first list has completed."""
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait until the first list has completed; whether it has, after at most ``timeout_s``."""
        return self._synced.wait(timeout_s)

    def put(self, obj: Mapping[str, Any]) -> None:
        """Keep ``obj`` as the API returned it from a write, unless a newer one is kept."""
        self._apply("MODIFIED", obj)

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = _uid(obj)
        version = _metadata(obj).get("resourceVersion")
        version = version if isinstance(version, str) else None
        after = None if kind == "DELETED" else self._safe_read(obj)
        with self._lock:
            held = self._items.get(uid)
            if held is not None and not newer(version, held[0]):
                return  # an event older than what a write already returned
            if after is None:
                self._items.pop(uid, None)
                if held is not None and self._key is not None:
                    self._by_key.pop(self._key(held[1]), None)
            else:
                self._items[uid] = (version, after)
                if self._key is not None:
                    self._by_key[self._key(after)] = uid
        self._notify(None if held is None else held[1], after)

    def _safe_read(self, obj: Mapping[str, Any]) -> T | None:
        """The reader's view of ``obj``; None, logged, if the reader fails on it (a bug: the
        readers turn bad objects into problems), so that one object never stops the watch."""
        try:
            return self._read(obj)
        except Exception:
            metadata = _metadata(obj)
            logger.exception("%s %s/%s: skipped: reading it failed", self.kind,
                             metadata.get("namespace"), metadata.get("name"))  # fmt: skip
            return None

    def _notify(self, before: T | None, after: T | None) -> None:
        if self._on_event is None or (before is None and after is None):
            return
        try:
            self._on_event(before, after)
        except Exception:
            logger.exception("%s informer: the change callback failed", self.kind)

    # -- listing -----------------------------------------------------------------------------

    def relist(self) -> None:
        """List every object now and replace the cache with them (in the caller's thread).

        Raises:
            ApiException: the API server refused the list.
            urllib3.exceptions.HTTPError: no answer came.
        """
        objects: dict[str, tuple[str | None, T]] = {}
        token: str | None = None
        version: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": PAGE_SIZE, **self._list_kwargs}
            if token:
                kwargs["_continue"] = token
            self._counter.add("lists")
            response = self._call(*self._args, _preload_content=False, **kwargs)
            page = json.loads(response.data)
            for obj in page.get("items") or ():
                if not isinstance(obj, Mapping):
                    continue
                read = self._safe_read(obj)
                if read is not None:
                    rv = _metadata(obj).get("resourceVersion")
                    objects[_uid(obj)] = (rv if isinstance(rv, str) else None, read)
            meta = page.get("metadata") or {}
            version = meta.get("resourceVersion") or version
            token = meta.get("continue") or None
            if not token:
                break
        with self._lock:
            before = self._items
            self._items = objects
            self._version = version
            if self._key is not None:
                key = self._key
                self._by_key = {key(item): uid for uid, (_, item) in objects.items()}
        self._synced.set()
        if self._on_event is not None:
            for uid, (_, item) in objects.items():
                held = before.get(uid)
                if held is None or held[1] != item:
                    self._notify(None if held is None else held[1], item)
            for uid, (_, item) in before.items():
                if uid not in objects:
                    self._notify(item, None)

    # -- watching ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the list-then-watch thread (a daemon); once only."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"tide-watch-{self.kind}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float) -> bool:
        """Stop the thread and wait for it, at most ``timeout_s``; whether it ended."""
        self._stopping.set()
        thread = self._thread
        if thread is None:
            return True
        deadline = time.monotonic() + timeout_s
        while thread.is_alive() and time.monotonic() < deadline:
            # Again at each turn: a watch that began after the first call has a socket now.
            watch = self._watch
            if watch is not None:
                watch.stop()  # type: ignore[no-untyped-call]
            thread.join(0.1)
        return not thread.is_alive()

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        backoff_s = 0.0
        must_list = True
        while not self._stopping.is_set():
            try:
                if must_list:
                    self.relist()
                    must_list = False
                self._watch_once()
                backoff_s = 0.0
            except ApiException as e:
                if self._stopping.is_set():
                    break
                if e.status == HTTP_GONE:
                    logger.info("%s watch: version expired, listing again", self.kind)
                    must_list = True
                    continue
                backoff_s = self._wait(backoff_s, f"HTTP {e.status} {e.reason}")
            except Exception as e:  # a dropped connection, a timeout, a bad line
                if self._stopping.is_set():
                    break
                backoff_s = self._wait(backoff_s, f"{type(e).__name__}: {e}")

    def _wait(self, backoff_s: float, why: str) -> float:
        backoff_s = min(self._backoff_max_s, max(0.2, backoff_s * 2))
        logger.warning("%s watch failed (%s); again in %.1f s", self.kind, why, backoff_s)
        self._stopping.wait(backoff_s)
        return backoff_s

    def _watch_once(self) -> None:
        watch = Watch(return_type="object")  # type: ignore[no-untyped-call]
        self._watch = watch
        if self._stopping.is_set():
            return
        self._counter.add("watches")
        timeout = max(1, int(self._watch_timeout_s))
        for event in watch.stream(  # type: ignore[no-untyped-call]
            self._call,
            *self._args,
            resource_version=self._version,
            timeout_seconds=timeout,
            allow_watch_bookmarks=True,
            # The socket read outlasts the server's timeout a little: a silent server is
            # noticed, and a healthy one always closes first.
            _request_timeout=(10, timeout + 30),
            **self._list_kwargs,
        ):
            if self._stopping.is_set():
                watch.stop()  # type: ignore[no-untyped-call]
                break
            kind = event.get("type")
            obj = event.get("raw_object")
            if not isinstance(obj, Mapping):
                continue
            version = _metadata(obj).get("resourceVersion")
            if kind == "BOOKMARK":
                if isinstance(version, str):
                    self._version = version
                continue
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(str(kind), obj)
                if isinstance(version, str):
                    self._version = version
