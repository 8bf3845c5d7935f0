"""Decode a request body and keep the exact JSON text of each evictee, to echo victims back.

The victims of an answer are TaskInfo objects Volcano sent (whole Pods included, ~5 KB each).
Encoding them again with ``json.dumps`` took longer than everything else the answer does (about
0.2 s for 500 of them on a loaded 2-core machine); their text is already in the body. So the
top-level object and its ``evictees`` list are walked here, every value decoded by the standard
decoder (``JSONDecoder.raw_decode``), and the text span of each element of ``evictees`` kept.

The result equals ``json.loads`` on every valid document (a property test says so); the errors
are ``json.JSONDecodeError``/``RecursionError`` as there, or ``ValueError`` for a body that ends
early.

``gc_paused`` is for the whole read (``parse_eviction``): a 5 MB body makes about a million
objects, and the collections they trigger each walk all of them, the full ones the whole heap
(the engine's too). The read keeps none of them (only each evictee's fields and text) and
makes no cycles, so with the collector paused they are freed by their reference counts before
it resumes, and it never walks them. Measured in benchmarks/extender_latency.py.
"""

from __future__ import annotations

import gc
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["decode_body", "gc_paused"]

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_GC_LOCK = threading.Lock()
_gc_pausers = 0


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector while inside; nested and threaded uses resume it once, last."""
    global _gc_pausers
    with _GC_LOCK:
        _gc_pausers += 1
        resume = _gc_pausers == 1 and gc.isenabled()
        if resume:
            gc.disable()
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_pausers -= 1
            if resume:
                gc.enable()


def decode_body(text: str) -> tuple[Any, list[str] | None]:
    """Decode ``text``; when it is an object with an ``evictees`` list, also each element's text.

    Args:
        text: the body, decoded from UTF-8.

    Returns:
        The document (as ``json.loads`` would return it) and the JSON text of each element of
        its ``evictees`` list, in order; None when there is no such list.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError`` names the position).
        RecursionError: nested too deeply for the decoder.
    """
    start = _skip(text, 0)
    if not text.startswith("{", start):
        return json.loads(text), None
    return _object(text, start + 1)


def _object(text: str, pos: int) -> tuple[dict[str, Any], list[str] | None]:
    document: dict[str, Any] = {}
    spans: list[str] | None = None
    pos = _skip(text, pos)
    if text.startswith("}", pos):
        return document, _end(text, pos + 1, spans)
    while True:
        if not text.startswith('"', pos):
            raise json.JSONDecodeError(
                "Expecting property name enclosed in double quotes", text, pos
            )
        key, pos = _DECODER.raw_decode(text, pos)
        pos = _skip(text, pos)
        if not text.startswith(":", pos):
            raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
        pos = _skip(text, pos + 1)
        if key == "evictees" and text.startswith("[", pos):
            document[key], spans, pos = _list(text, pos + 1)
        else:
            document[key], pos = _value(text, pos)
            if key == "evictees":
                spans = None
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
        elif text.startswith("}", pos):
            return document, _end(text, pos + 1, spans)
        else:
            raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)


def _list(text: str, pos: int) -> tuple[list[Any], list[str], int]:
    values: list[Any] = []
    spans: list[str] = []
    pos = _skip(text, pos)
    if text.startswith("]", pos):
        return values, spans, pos + 1
    while True:
        value, end = _value(text, pos)
        values.append(value)
        spans.append(text[pos:end])
        pos = _skip(text, end)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
        elif text.startswith("]", pos):
            return values, spans, pos + 1
        else:
            raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)


def _value(text: str, pos: int) -> tuple[Any, int]:
    if pos >= len(text):
        raise json.JSONDecodeError("Expecting value", text, pos)
    value, end = _DECODER.raw_decode(text, pos)
    return value, end


def _end(text: str, pos: int, spans: list[str] | None) -> list[str] | None:
    if _skip(text, pos) != len(text):
        raise json.JSONDecodeError("Extra data", text, pos)
    return spans


def _skip(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    return match.end() if match else pos
