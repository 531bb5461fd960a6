"""The LMCache adapter (leasebox.adapters.lmcache_l2) driven as LMCache drives a `native_plugin` connector: the
loader's JSON config, import by module path and class name, the required-method check; then, as its
`NativeConnectorL2Adapter` does, submissions of keys (`model@rank@group@hash` strings) with memoryviews over slices
of one L1 arena, a demux thread polling `event_fd()` and calling `drain_completions()`, per-key results, and a
lease revoked while a load runs: only that lease's keys fail, and they are reported absent afterwards."""

from __future__ import annotations

import importlib
import json
import select
import threading
import time
from typing import Dict, List, Optional, Tuple

import pytest

from test_kv_helpers import KIB, Revoker, doomed_last, pattern, retrying, store_params

CHUNK = 16 * KIB
REQUIRED = ["event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists", "drain_completions", "close"]


def load_connector(params: dict):
    """What LMCache's `_create_native_plugin_l2_adapter` does with `--l2-adapter '{"type": "native_plugin",
    ...}'`: parse, import `module_path`, take `class_name`, build it with `adapter_params`, check its methods."""
    config = json.loads(
        json.dumps(
            {
                "type": "native_plugin",
                "module_path": "leasebox.adapters.lmcache_l2",
                "class_name": "LeaseboxL2Connector",
                "adapter_params": params,
            }
        )
    )
    module = importlib.import_module(config["module_path"])
    connector = retrying(lambda: getattr(module, config["class_name"])(**config["adapter_params"]))
    for name in REQUIRED + ["submit_batch_delete"]:
        assert callable(getattr(connector, name, None)), name
    return connector


class Demux:
    """LMCache's demux loop: poll the connector's fd (500 ms), drain, file each completion by future id."""

    def __init__(self, connector) -> None:
        self.connector = connector
        self.done: Dict[int, Tuple[bool, str, Optional[List[bool]]]] = {}
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.connector.event_fd(), select.POLLIN)
        while not self.stop.is_set():
            if not poller.poll(500):
                continue
            for fid, ok, error, bools in self.connector.drain_completions():
                assert isinstance(fid, int) and isinstance(ok, bool) and isinstance(error, str)
                with self.cond:
                    assert fid not in self.done, f"future {fid} completed twice"
                    self.done[fid] = (ok, error, bools)
                    self.cond.notify_all()

    def wait(self, fid: int, within: float = 30.0) -> Tuple[bool, str, Optional[List[bool]]]:
        with self.cond:
            assert self.cond.wait_for(lambda: fid in self.done, within), f"future {fid} not done in {within} s"
            return self.done.pop(fid)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def lmcache(appliance, key_file):
    connector = load_connector(store_params(appliance, key_file, max_value_size=CHUNK))
    demux = Demux(connector)
    yield connector, demux
    demux.close()
    connector.close()


def object_key(i: int, model: str = "llama-3-8b", salt: str = "") -> str:
    """LMCache's native-connector key: `model@kv_rank(8 hex)@group(hex)@chunk_hash(hex)[@salt]`."""
    return f"{model}@{0:08x}@{0:x}@{(i * 0x9E3779B1 & 0xFFFFFFFF):08x}{i:04x}" + (f"@{salt}" if salt else "")


def arena_views(arena: bytearray, first: int, n: int, size: int = CHUNK) -> List[memoryview]:
    """Memoryviews over chunk slots `first..first+n` of the L1 arena, as `MemoryObj.byte_array` gives them."""
    mv = memoryview(arena)
    return [mv[(first + i) * size : (first + i + 1) * size] for i in range(n)]


def test_loader_builds_the_connector_and_refuses_bad_params(appliance, key_file):
    adapters = importlib.import_module("leasebox.adapters")
    assert adapters.LeaseboxL2Connector.__module__ == "leasebox.adapters.lmcache_l2"
    from leasebox.adapters._common import AdapterConfigError

    with pytest.raises(AdapterConfigError, match="unknown parameter 'host'"):
        load_connector({"host": "10.0.0.1"})
    with pytest.raises(AdapterConfigError, match="lease_size: expected int"):
        load_connector(store_params(appliance, key_file, lease_size="2M"))
    c = load_connector(store_params(appliance, key_file))
    assert isinstance(c.event_fd(), int) and c.event_fd() >= 0
    assert c.drain_completions() == []
    c.close()
    c.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        c.submit_batch_exists(["k"])


def test_store_lookup_load_through_the_arena(lmcache):
    connector, demux = lmcache
    arena = bytearray(64 * CHUNK)
    keys = [object_key(i) for i in range(8)]
    for i, mv in enumerate(arena_views(arena, 0, 8)):
        mv[:] = pattern(i, CHUNK)
    fid = connector.submit_batch_set(keys, arena_views(arena, 0, 8))
    assert demux.wait(fid) == (True, "", [True] * 8)

    # Lookup: the stored keys and two never stored, one per-key bool each, in order.
    probe = keys[:3] + [object_key(100), keys[7], object_key(101)]
    ok, error, bools = demux.wait(connector.submit_batch_exists(probe))
    assert ok and error == "" and bools == [True, True, True, False, True, False]

    # Load into other slots of the arena: the bytes land where the memoryviews point, nothing else moves.
    before = bytes(arena[: 8 * CHUNK])
    ok, error, bools = demux.wait(connector.submit_batch_get(keys, arena_views(arena, 16, 8)))
    assert (ok, error, bools) == (True, "", [True] * 8)
    for i in range(8):
        assert arena[(16 + i) * CHUNK : (17 + i) * CHUNK] == pattern(i, CHUNK), i
    assert bytes(arena[: 8 * CHUNK]) == before and arena[24 * CHUNK :] == bytes(40 * CHUNK)


def test_per_key_failures_in_one_batch(lmcache):
    connector, demux = lmcache
    arena = bytearray(32 * CHUNK)
    keys = [object_key(i, salt="s1") for i in range(4)]
    for i, mv in enumerate(arena_views(arena, 0, 4)):
        mv[:] = pattern(10 + i, CHUNK)
    assert demux.wait(connector.submit_batch_set(keys, arena_views(arena, 0, 4)))[0]

    # A load of: a stored key, a key never stored, a stored key into a buffer of another size, a stored key.
    mv = memoryview(arena)
    views = [mv[8 * CHUNK : 9 * CHUNK], mv[9 * CHUNK : 10 * CHUNK], mv[10 * CHUNK : 10 * CHUNK + 4096],
             mv[11 * CHUNK : 12 * CHUNK]]
    ok, error, bools = demux.wait(connector.submit_batch_get([keys[0], object_key(999), keys[2], keys[3]], views))
    assert not ok and bools == [True, False, False, True]
    assert "2 of 4 failed" in error and object_key(999) in error and "NOT_FOUND" in error, error
    assert arena[8 * CHUNK : 9 * CHUNK] == pattern(10, CHUNK)
    assert arena[11 * CHUNK : 12 * CHUNK] == pattern(13, CHUNK)
    # A read-only buffer cannot be loaded into: that key fails, the batch goes on.
    ok, error, bools = demux.wait(connector.submit_batch_get([keys[1], keys[0]], [memoryview(bytes(CHUNK)),
                                                                                  mv[12 * CHUNK : 13 * CHUNK]]))
    assert bools == [False, True] and not ok

    # Stores: one too large for the store's max_value_size fails alone.
    big = bytearray(CHUNK + 1)
    ok, error, bools = demux.wait(connector.submit_batch_set([object_key(50), object_key(51)],
                                                             [memoryview(big), mv[0:CHUNK]]))
    assert not ok and bools == [False, True] and "TOO_LARGE" in error, error

    # Delete: stored keys go, an absent key reports False; a later lookup agrees.
    ok, _, bools = demux.wait(connector.submit_batch_delete([keys[0], object_key(998), keys[1]]))
    assert bools == [True, False, True]
    assert demux.wait(connector.submit_batch_exists(keys))[2] == [False, False, True, True]
    with pytest.raises(ValueError, match="2 keys but 1 buffers"):
        connector.submit_batch_set(keys[:2], [mv[0:CHUNK]])


def test_many_futures_in_flight_complete_once_each(lmcache):
    connector, demux = lmcache
    arena = bytearray(64 * CHUNK)
    for i, mv in enumerate(arena_views(arena, 0, 32)):
        mv[:] = pattern(40 + i, CHUNK)
    fids = [connector.submit_batch_set([object_key(200 + i)], arena_views(arena, i, 1)) for i in range(32)]
    assert len(set(fids)) == 32
    for fid in fids:
        assert demux.wait(fid)[0]
    fids = [connector.submit_batch_get([object_key(200 + i) for i in range(j, j + 4)], arena_views(arena, 32 + j, 4))
            for j in range(0, 32, 4)]
    for fid in fids:
        assert demux.wait(fid) == (True, "", [True] * 4)
    assert arena[32 * CHUNK :] == arena[: 32 * CHUNK]
    assert connector.pending() == 0


def test_revoke_mid_load_fails_only_that_leases_keys(appliance, lmcache):
    connector, demux = lmcache
    store = connector._store
    n = 192
    arena = bytearray(2 * n * CHUNK)
    keys = [object_key(300 + i) for i in range(n)]
    value = {k: pattern(300 + i, CHUNK) for i, k in enumerate(keys)}
    for i, mv in enumerate(arena_views(arena, 0, n)):
        mv[:] = value[keys[i]]
    assert demux.wait(connector.submit_batch_set(keys, arena_views(arena, 0, n)))[0]
    doomed, order = doomed_last(store, keys)

    # The load runs (the doomed lease's keys last) while the admin revokes that lease.
    with Revoker(appliance) as admin:
        fid = connector.submit_batch_get(order, arena_views(arena, n, n))
        assert admin.revoke(doomed) == "TornDown"
    ok, error, bools = demux.wait(fid)
    lost = set()
    deadline = time.monotonic() + 15
    while len(lost) < doomed["keys"] and time.monotonic() < deadline:
        lost |= {k.decode() for k in connector.lost_keys()}
        time.sleep(0.05)
    assert len(lost) == doomed["keys"] and lost <= set(keys), (len(lost), doomed)
    for i, k in enumerate(order):
        if bools[i]:
            # Loaded: the other lease's keys all, the doomed lease's before the revoke; each with its own bytes.
            assert arena[(n + i) * CHUNK : (n + i + 1) * CHUNK] == value[k], i
        else:
            assert k in lost, (i, k, error)
    failed = [k for k, b in zip(order, bools) if not b]
    if failed:
        assert not ok and "REVOKED" in error and failed[0] in error, error
    else:
        # The whole load landed before the revoke did (a slow requester: the Soft-RoCE guest under TCG sees
        # this): every load from now on fails exactly the lost keys, each named.
        ok, error, bools = demux.wait(connector.submit_batch_get(order, arena_views(arena, n, n)))
        assert bools == [k not in lost for k in order] and not ok, error
        assert order[bools.index(False)] in error, error
    # What LMCache asks next: a lookup reports every lost key absent, the others present.
    ok, _, present = demux.wait(connector.submit_batch_exists(keys))
    assert ok and present == [k not in lost for k in keys]
