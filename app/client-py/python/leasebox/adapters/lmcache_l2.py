"""LMCache L2 tier on Leasebox: a connector for LMCache's `native_plugin` L2 adapter type (its multi-process
server's L2 pipeline), pure Python.

Followed upstream (LMCache/LMCache): `lmcache/v1/distributed/l2_adapters/native_plugin_l2_adapter.py` (commit
68c638a6a8e8, the loader) and `lmcache/v1/distributed/l2_adapters/native_connector_l2_adapter.py` (commit
0b43a45563fe, `NativeConnectorL2Adapter`, which drives the connector). Facts in docs/reference/kv-frameworks.md.

Configured on the LMCache server's command line (adapter_params are the keyword arguments of the class):

    --l2-adapter '{"type": "native_plugin", "module_path": "leasebox.adapters.lmcache_l2",
                   "class_name": "LeaseboxL2Connector",
                   "adapter_params": {"url": "leasebox://tenant@10.0.0.5:7470", "key_file": "/etc/leasebox/key",
                                      "lease_size": 1073741824, "leases": 4, "max_value_size": 4194304}}'

What LMCache does with it, and what this class answers:

- `connector_cls(**adapter_params)`, then `event_fd()` once; a demux thread polls that fd (POLLIN) and calls
  `drain_completions()` whenever it is readable.
- `submit_batch_set(keys, memoryviews)` (stores), `submit_batch_get(keys, memoryviews)` (loads into LMCache's L1
  arena), `submit_batch_exists(keys)` (lookups), optional `submit_batch_delete(keys)` (eviction): each returns
  at once with an int future id. Keys are `str` (`model@rank@group@hash[@salt]`); the memoryviews are byte views
  over slices of LMCache's L1 arena, one per key.
- `drain_completions()` -> `[(future_id, ok, error, result_bools)]`, one tuple per finished future: `ok` is
  False when any key failed, `error` names the failed keys and their codes, and `result_bools` has one bool per
  key (stored, loaded, present, deleted). LMCache uses the bools for loads and lookups, `ok` for stores.
- `close()`.

A load whose lease is revoked mid-transfer reports False for that key and True for the others; the key is gone
from the store's index at once, so a later `submit_batch_exists` reports it absent and LMCache does not ask for
it again (`lost_keys()` lists what the store reported lost, for logs and tests).

Each buffer is registered with the store for its transfer and unregistered when the transfer ends: the data
goes between LMCache's arena and the appliance with no copy. One store per connector: the connector polls the
store's completions, so a store shared with other code would have its completions taken.
"""

from __future__ import annotations

import itertools
import logging
import select
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._common import EventCounter, byte_view, codes, key_bytes, open_store, split_params, summarize

log = logging.getLogger(__name__)

Completion = Tuple[int, bool, str, Optional[List[bool]]]


class _Future:
    """One submitted batch: its keys, the result of each (None while in flight), the regions it holds."""

    __slots__ = ("fid", "kind", "keys", "results", "lengths", "regions", "left")

    def __init__(self, fid: int, kind: str, keys: List[str], lengths: Optional[List[int]] = None) -> None:
        self.fid = fid
        self.kind = kind
        self.keys = keys
        self.results: List[Optional[int]] = [None] * len(keys)
        self.lengths = lengths
        self.regions: List[Any] = []
        self.left = len(keys)


class LeaseboxL2Connector:
    """LMCache `native_plugin` connector over a `leasebox.Store` (see the module documentation).

    Parameters are `Store.open`'s (`url`, `key_file`, `max_value_size`, `lease_size`, `leases`,
    `migrate_on_drain`, `requester`, `timeout_ms`); `store` instead hands over a store built by the caller (not
    JSON: for programs that build the connector themselves), which the connector then does not close."""

    def __init__(self, store: Any = None, **params: Any) -> None:
        store_params, _ = split_params(params)
        self._store, self._owns_store = open_store(store_params, store)
        self._kv = codes()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._futures: Dict[int, _Future] = {}
        # store ticket -> (future, index of its key)
        self._tickets: Dict[int, Tuple[_Future, int]] = {}
        self._done: List[Completion] = []
        self._lost: List[bytes] = []
        self._events = EventCounter()
        self._closed = False
        self._stop_r, self._stop_w = _pipe()
        self._thread = threading.Thread(target=self._forward, name="leasebox-lmcache", daemon=True)
        self._thread.start()

    # --- the native connector interface -------------------------------------------------------------------

    def event_fd(self) -> int:
        """Readable while `drain_completions()` has something to return."""
        return self._events.fileno()

    def submit_batch_set(self, keys: Sequence[str], memoryviews: Sequence[Any]) -> int:
        """Stores each `memoryviews[i]` under `keys[i]`, from the caller's memory; returns a future id."""
        return self._submit_transfer("set", keys, memoryviews)

    def submit_batch_get(self, keys: Sequence[str], memoryviews: Sequence[Any]) -> int:
        """Loads each key's value into `memoryviews[i]`, which it must fill exactly; returns a future id."""
        return self._submit_transfer("get", keys, memoryviews)

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        """Whether each key is stored (the store's own index: no network round trip); returns a future id."""
        keys = list(keys)
        f = self._new_future("exists", keys)
        try:
            results = list(self._store.batch_is_exist([key_bytes(k) for k in keys]))
        except Exception as e:  # a closed store, a bad key: the future fails, the framework keeps running
            results = [self._kv.FAILED] * len(keys)
            log.warning("leasebox: batch_is_exist failed: %s", e)
        self._finish_now(f, [1 if r == 1 else (r if r < 0 else self._kv.NOT_FOUND) for r in results])
        return f.fid

    def submit_batch_delete(self, keys: Sequence[str]) -> int:
        """Removes each key; a key that was not stored counts as not deleted. Returns a future id."""
        keys = list(keys)
        f = self._new_future("delete", keys)
        results = []
        for k in keys:
            try:
                results.append(int(self._store.remove(key_bytes(k))))
            except Exception as e:
                log.warning("leasebox: remove failed: %s", e)
                results.append(self._kv.FAILED)
        self._finish_now(f, results)
        return f.fid

    def drain_completions(self) -> List[Completion]:
        """Every future finished since the last call: `(future_id, ok, error, result_bools)`."""
        with self._lock:
            self._events.clear()
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Stops the completion thread, waits for (and drops) transfers in flight, closes the store if the
        connector opened it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _wake(self._stop_w)
        self._thread.join(10)
        for ticket in list(self._tickets):
            try:
                self._store.wait(ticket, 5000)
            except Exception:
                pass
        for f in self._futures.values():
            _close_regions(f)
        self._futures.clear()
        self._tickets.clear()
        if self._owns_store:
            self._store.close()
        self._events.close()
        _close_pipe(self._stop_r, self._stop_w)

    # --- for operators and tests -----------------------------------------------------------------------------

    def lost_keys(self) -> List[bytes]:
        """Keys the store reported lost (a revoked lease, a drain without migration, a reboot) since the
        connector started, oldest first."""
        self._collect_events()
        with self._lock:
            return list(self._lost)

    def pending(self) -> int:
        """Futures submitted and not finished yet."""
        with self._lock:
            return len(self._futures)

    # --- inside ---------------------------------------------------------------------------------------------

    def _new_future(self, kind: str, keys: List[str], lengths: Optional[List[int]] = None) -> _Future:
        with self._lock:
            if self._closed:
                raise RuntimeError("the Leasebox connector is closed")
            f = _Future(next(self._ids), kind, keys, lengths)
            self._futures[f.fid] = f
        return f

    def _submit_transfer(self, kind: str, keys: Sequence[str], memoryviews: Sequence[Any]) -> int:
        keys = list(keys)
        views = list(memoryviews)
        if len(keys) != len(views):
            raise ValueError(f"{len(keys)} keys but {len(views)} buffers")
        f = self._new_future(kind, keys, [0] * len(keys))
        fail = self._kv.FAILED
        # The lock is held from each submission until its ticket is recorded, so the completion thread never
        # sees a ticket it does not know.
        with self._lock:
            for i, (k, mv) in enumerate(zip(keys, views)):
                try:
                    view = byte_view(mv, writable=(kind == "get"))
                    f.lengths[i] = len(view)
                    if kind == "set" and view.readonly:
                        view = memoryview(bytearray(view))  # read-only source: one copy, still one transfer
                    region = self._store.register_buffer(view)
                    f.regions.append(region)
                    if kind == "set":
                        ticket = self._store.submit_batch_put_from([key_bytes(k)], region, [0], [len(view)])
                    else:
                        ticket = self._store.submit_batch_get_into([key_bytes(k)], region, [0], [len(view)])
                except Exception as e:
                    log.warning("leasebox: %s of %r not submitted: %s", kind, k, e)
                    self._settle(f, i, fail)
                    continue
                self._tickets[int(ticket)] = (f, i)
            self._maybe_done(f)
        return f.fid

    def _finish_now(self, f: _Future, results: List[int]) -> None:
        with self._lock:
            for i, r in enumerate(results):
                self._settle(f, i, r)
            self._maybe_done(f)

    def _settle(self, f: _Future, i: int, result: int) -> None:
        """Records key `i`'s result (lock held)."""
        if f.results[i] is None:
            f.results[i] = int(result)
            f.left -= 1

    def _maybe_done(self, f: _Future) -> None:
        """Turns a future whose every key has a result into a completion (lock held)."""
        if f.left or f.fid not in self._futures:
            return
        del self._futures[f.fid]
        _close_regions(f)
        kv = self._kv
        ok_each: List[bool] = []
        shown: List[Tuple[str, int]] = []
        for i, r in enumerate(f.results):
            assert r is not None
            if f.kind == "get":
                # A value of another length than the buffer is not a load of this object.
                good = r >= 0 and r == f.lengths[i]
                code = r if r < 0 else (0 if good else (kv.TOO_LARGE if r > f.lengths[i] else kv.FAILED))
            elif f.kind == "exists":
                good = r == 1
                code = r if r < 0 and r != kv.NOT_FOUND else 0  # absent is an answer, not an error
            else:
                good = r >= 0
                code = r
            ok_each.append(good)
            shown.append((f.keys[i], code))
        ok = all(ok_each) if f.kind in ("set", "get") else all(c >= 0 for _, c in shown)
        error = summarize(shown)
        self._done.append((f.fid, ok, error, ok_each))
        self._events.signal()

    def _forward(self) -> None:
        """The completion thread: waits on the store's completion fd and turns finished tickets into
        completions (one per future, when its last key is done)."""
        store_fd = self._store.fileno()
        while True:
            try:
                readable, _, _ = select.select([store_fd, self._stop_r], [], [], 0.5)
            except (OSError, ValueError):
                return
            if self._stop_r in readable:
                return
            if store_fd in readable:
                self._collect()
            self._collect_events()

    def _collect(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                finished = self._store.poll(256)
            except Exception as e:
                log.warning("leasebox: poll failed: %s", e)
                return
            touched = {}
            for ticket, results in finished:
                entry = self._tickets.pop(int(ticket), None)
                if entry is None:
                    continue
                f, i = entry
                self._settle(f, i, results[0] if results else self._kv.FAILED)
                touched[f.fid] = f
            for f in touched.values():
                self._maybe_done(f)

    def _collect_events(self) -> None:
        try:
            events = self._store.events()
        except Exception:
            return
        lost = []
        for e in events:
            if e.get("kind") == "keys_lost":
                keys = list(e.get("keys") or ())
                lost += keys
                log.warning(
                    "leasebox: %d keys lost (lease %s, %s)", e.get("count", len(keys)), e.get("lease"),
                    e.get("outcome"),
                )
        if lost:
            with self._lock:
                self._lost += lost


def _close_regions(f: _Future) -> None:
    for r in f.regions:
        try:
            r.close()
        except Exception:
            pass
    f.regions = []


def _pipe() -> Tuple[int, int]:
    import os

    r, w = os.pipe()
    os.set_blocking(r, False)
    return r, w


def _wake(w: int) -> None:
    import os

    try:
        os.write(w, b"\x01")
    except OSError:
        pass


def _close_pipe(r: int, w: int) -> None:
    import os

    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass
