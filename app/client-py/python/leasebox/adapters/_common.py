"""What the three adapters share: opening their `leasebox.Store` from the parameters a framework's loader passes
(JSON, so strings and numbers only), turning keys into bytes, naming result codes, and a byte view of a buffer
the framework hands over (a memoryview, an mmap, a numpy array, or a CPU torch tensor, seen without importing
torch until one shows up).

Nothing here imports a framework: the adapters load on a machine without LMCache, vLLM or SGLang.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

#: The `Store.open` parameters an adapter accepts from its framework's configuration, with their types.
STORE_PARAMS: Dict[str, type] = {
    "url": str,
    "key_file": str,
    "max_value_size": int,
    "lease_size": int,
    "leases": int,
    "migrate_on_drain": bool,
    "requester": str,
    "timeout_ms": int,
}


class AdapterConfigError(ValueError):
    """A parameter the adapter was configured with is missing, unknown or of the wrong type."""


def split_params(params: Mapping[str, Any], own: Iterable[str] = ()) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Splits a framework's parameter dict into `Store.open` keyword arguments and the adapter's own (`own`).
    An unknown name or a value of the wrong type is an `AdapterConfigError` naming it, never a silent default."""
    store: Dict[str, Any] = {}
    mine: Dict[str, Any] = {}
    own = set(own)
    for name, value in params.items():
        if name in STORE_PARAMS:
            want = STORE_PARAMS[name]
            # bool is an int subclass: a JSON `true` must not pass for a size, nor 1 for a flag.
            ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
            if value is not None and not ok:
                raise AdapterConfigError(f"{name}: expected {want.__name__}, got {type(value).__name__} {value!r}")
            if value is not None:
                store[name] = value
        elif name in own:
            mine[name] = value
        else:
            known = sorted(set(STORE_PARAMS) | own)
            raise AdapterConfigError(f"unknown parameter {name!r} (known: {', '.join(known)})")
    return store, mine


def open_store(store_params: Mapping[str, Any], store: Any = None) -> Tuple[Any, bool]:
    """The adapter's store: `store` when the caller built one (the adapter then does not close it), else
    `leasebox.Store.open(**store_params)` (URL and key file, or `LEASEBOX_URL` / `LEASEBOX_KEY_FILE`), owned
    by the adapter. Returns the store and whether the adapter owns it."""
    if store is not None:
        if store_params:
            raise AdapterConfigError(
                f"both a store and store parameters ({', '.join(sorted(store_params))}) were given"
            )
        return store, False
    from .. import kv

    return kv.Store.open(**dict(store_params)), True


def codes() -> Any:
    """The `leasebox.kv` module, for its result codes (`OK`, `NOT_FOUND`, `REVOKED`, ...)."""
    from .. import kv

    return kv


def code_name(code: int) -> str:
    """`REVOKED` for `kv.REVOKED`, and so on; a number no code has is shown as itself."""
    kv = codes()
    for name in ("NOT_FOUND", "REVOKED", "TOO_LARGE", "NO_SPACE", "TIMEOUT", "FAILED"):
        if getattr(kv, name, None) == code:
            return name
    return str(code)


def key_bytes(key: Any) -> bytes:
    """A framework's key as the store's key: `str` as UTF-8, bytes-like as is. Anything else is a TypeError."""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"a key must be str or bytes, not {type(key).__name__}")


def summarize(codes_by_key: List[Tuple[Any, int]]) -> str:
    """An error text for the keys that failed: `2 of 8 failed: k1 REVOKED, k2 NOT_FOUND` (at most 8 named)."""
    failed = [(k, c) for k, c in codes_by_key if c < 0]
    if not failed:
        return ""
    shown = ", ".join(f"{k!s} {code_name(c)}" for k, c in failed[:8])
    more = f", and {len(failed) - 8} more" if len(failed) > 8 else ""
    return f"{len(failed)} of {len(codes_by_key)} failed: {shown}{more}"


def byte_view(buf: Any, writable: bool = True) -> memoryview:
    """A one-dimensional byte memoryview of `buf`'s memory (no copy): anything with the buffer protocol, or a
    contiguous CPU torch tensor (viewed as bytes through numpy, torch imported only then). TypeError otherwise,
    and for read-only memory when `writable`."""
    try:
        mv = memoryview(buf)
    except TypeError:
        mv = None
    if mv is None:
        numpy = getattr(buf, "numpy", None)
        if numpy is None:
            raise TypeError(f"{type(buf).__name__} is not a buffer") from None
        view = getattr(buf, "view", None)
        if view is not None and getattr(buf, "element_size", None) is not None and buf.element_size() != 1:
            import torch  # a tensor is here, so torch is too

            buf = view(torch.uint8)
        mv = memoryview(numpy())
    if not mv.c_contiguous:
        raise TypeError("the buffer is not contiguous")
    if writable and mv.readonly:
        raise TypeError("the buffer is read-only")
    return mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv


class EventCounter:
    """A file descriptor a framework polls for readability: an eventfd on Linux, else a pipe. `signal()` makes
    it readable, `clear()` (non-blocking) makes it quiet again."""

    def __init__(self) -> None:
        import os

        self._os = os
        self._lock = threading.Lock()
        if hasattr(os, "eventfd"):
            self._r = self._w = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - not Linux
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
        self.closed = False

    def fileno(self) -> int:
        return self._r

    def signal(self) -> None:
        with self._lock:
            if self.closed:
                return
            if self._r == self._w:
                self._os.eventfd_write(self._w, 1)
            else:  # pragma: no cover
                self._os.write(self._w, b"\x01")

    def clear(self) -> None:
        with self._lock:
            if self.closed:
                return
            try:
                if self._r == self._w:
                    self._os.eventfd_read(self._r)
                else:  # pragma: no cover
                    while self._os.read(self._r, 4096):
                        pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._os.close(self._r)
            if self._w != self._r:  # pragma: no cover
                self._os.close(self._w)


def optional(module: str, name: str) -> Optional[Any]:
    """`module.name` when the framework is installed, else None (ImportError and a missing name alike)."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
