"""`leasebox.Store` from Python (docs/kv.md): opened by URL and key file; put/get round trips, copying and zero
copy from a registered buffer; LRU eviction order when the leases are full; one result per item in mixed
batches; asynchronous batches with the completion fd; and a lease revoked mid-batch: its keys fail or land, a
`keys_lost` event names exactly them, every later get of one is a miss, and the other lease's keys are intact."""

from __future__ import annotations

import select
import time

import pytest

import leasebox
from leasebox import kv
from test_kv_helpers import KIB, MIB, Revoker, doomed_last, open_store, pattern, store_url, wait_keys_lost


@pytest.fixture
def store(appliance, key_file):
    s = open_store(appliance, key_file)
    yield s
    s.close()


def test_codes_are_distinct_negative_ints():
    errors = [kv.NOT_FOUND, kv.REVOKED, kv.TOO_LARGE, kv.NO_SPACE, kv.TIMEOUT, kv.FAILED]
    assert kv.OK == 0 and all(isinstance(c, int) and c < 0 for c in errors) and len(set(errors)) == len(errors)
    assert leasebox.Store is kv.Store


def test_open_refuses_a_key_in_the_url_and_a_missing_key_file(appliance, key_file, tmp_path):
    with pytest.raises(Exception, match="key"):
        kv.Store.open(url=f"leasebox://demo:{appliance.tenant_key}@{appliance.addr}", key_file=key_file.path)
    with pytest.raises(Exception, match="no-such-file"):
        kv.Store.open(url=store_url(appliance), key_file=str(tmp_path / "no-such-file"))


def test_put_get_round_trip_copying_and_zero_copy(store):
    assert store.put(b"alpha", b"one") == kv.OK
    assert store.get(b"alpha") == b"one"
    assert store.put(b"alpha", b"two!") == kv.OK  # overwrite
    assert store.get(b"alpha") == b"two!"
    assert store.get(b"never") is None
    assert store.is_exist(b"alpha") == 1 and store.is_exist(b"never") == 0

    # Zero copy: values go from and into a registered arena.
    arena = bytearray(256 * KIB)
    region = store.register_buffer(arena)
    arena[:64 * KIB] = pattern(1, 64 * KIB)
    arena[64 * KIB : 64 * KIB + 100] = pattern(2, 100)
    assert store.put_from(b"big", region, 0, 64 * KIB) == kv.OK
    assert store.put_from(b"small", region, 64 * KIB, 100) == kv.OK
    assert store.get_into(b"big", region, 128 * KIB, 64 * KIB) == 64 * KIB
    assert store.get_into(b"small", region, 200 * KIB, 4096) == 100
    assert arena[128 * KIB : 192 * KIB] == pattern(1, 64 * KIB)
    assert arena[200 * KIB : 200 * KIB + 100] == pattern(2, 100)
    assert store.get(b"big") == pattern(1, 64 * KIB)
    assert store.get_into(b"never", region, 0, 16) == kv.NOT_FOUND
    # Too large for the store, or for the buffer given.
    assert store.put(b"huge", bytes(64 * KIB + 1)) == kv.TOO_LARGE
    assert store.get_into(b"big", region, 0, 1000) == kv.TOO_LARGE
    assert store.remove(b"small") == kv.OK and store.get(b"small") is None
    assert store.remove(b"small") == kv.NOT_FOUND

    st = store.stats()
    assert st["hits"] >= 5 and st["misses"] >= 2, st
    assert "leasebox" in store.stats_prometheus()
    region.close()


def test_lru_eviction_order(appliance, key_file):
    """One small lease: values fill it, then each new one evicts the least recently used."""
    with open_store(appliance, key_file, leases=1, lease_size=1 * MIB, max_value_size=64 * KIB) as s:
        value = lambda i: pattern(i, 60 * KIB)
        keys = []
        i = 0
        while s.stats()["evictions"] == 0:
            keys.append(f"k{i}".encode())
            assert s.put(keys[-1], value(i)) == kv.OK
            i += 1
            assert i < 200, "nothing was evicted after 200 values in a 1 MiB lease"
        # The first value was the least recently used: it went first.
        assert s.get(keys[0]) is None and s.get(keys[1]) == value(1)
        # keys[1] is now the most recently used; the next put evicts keys[2], then keys[3].
        s.put(b"next1", value(500))
        assert s.get(keys[2]) is None and s.get(keys[1]) == value(1)
        s.put(b"next2", value(501))
        assert s.get(keys[3]) is None and s.get(keys[1]) == value(1) and s.get(b"next1") == value(500)
        assert s.stats()["evictions"] == 3


def test_mixed_batches_give_one_result_per_item(store):
    arena = bytearray(512 * KIB)
    region = store.register_buffer(arena)
    for j in range(4):
        arena[j * 64 * KIB : j * 64 * KIB + 32 * KIB] = pattern(10 + j, 32 * KIB)
    keys = [b"m0", b"m1", b"m2", b"m3"]
    # Item 2 is larger than the store's max_value_size; the others are stored.
    put = store.batch_put_from(keys, region, [0, 64 * KIB, 128 * KIB, 192 * KIB], [32 * KIB, 32 * KIB, 64 * KIB + 1,
                                                                                    32 * KIB])
    assert put == [kv.OK, kv.OK, kv.TOO_LARGE, kv.OK]
    assert store.batch_is_exist([b"m0", b"m2", b"m3", b"zz"]) == [1, 0, 1, 0]
    # A hit, a miss, a buffer too small, a hit.
    got = store.batch_get_into([b"m0", b"zz", b"m1", b"m3"], region, [256 * KIB, 320 * KIB, 384 * KIB, 448 * KIB],
                               [64 * KIB, 64 * KIB, 1024, 64 * KIB])
    assert got == [32 * KIB, kv.NOT_FOUND, kv.TOO_LARGE, 32 * KIB]
    assert arena[256 * KIB : 288 * KIB] == pattern(10, 32 * KIB)
    assert arena[448 * KIB : 480 * KIB] == pattern(13, 32 * KIB)
    with pytest.raises(Exception):
        store.batch_get_into([b"m0"], region, [0, 1], [1])  # lengths of the lists differ
    region.close()


def test_asynchronous_batches_and_the_completion_fd(store):
    arena = bytearray(64 * 4 * KIB * 2)
    region = store.register_buffer(arena)
    n = 64
    for i in range(n):
        arena[i * 4 * KIB : (i + 1) * 4 * KIB] = pattern(i, 4 * KIB)
    keys = [f"a{i}".encode() for i in range(n)]
    t = store.submit_batch_put_from(keys, region, [i * 4 * KIB for i in range(n)], [4 * KIB] * n)
    assert store.wait(t, 10000) == [kv.OK] * n
    t = store.submit_batch_get_into(keys, region, [(n + i) * 4 * KIB for i in range(n)], [4 * KIB] * n)
    readable, _, _ = select.select([store.fileno()], [], [], 10)
    assert readable, "the completion fd did not become readable"
    done = []
    deadline = time.monotonic() + 10
    while not done and time.monotonic() < deadline:
        done = store.poll(64)
    assert done == [(t, [4 * KIB] * n)]
    assert arena[n * 4 * KIB :] == arena[: n * 4 * KIB]
    assert store.poll(64) == []
    region.close()


def test_revoke_mid_batch_loses_exactly_that_leases_keys(appliance, key_file):
    with open_store(appliance, key_file, leases=2, lease_size=2 * MIB, max_value_size=16 * KIB) as s, \
            Revoker(appliance) as admin:
        n, size = 320, 8 * KIB
        arena = bytearray(2 * n * size)
        region = s.register_buffer(arena)
        value = {}
        keys = [f"r{i}".encode() for i in range(n)]
        for i, k in enumerate(keys):
            value[k] = pattern(1000 + i, size)
            arena[i * size : (i + 1) * size] = value[k]
        assert s.batch_put_from(keys, region, [i * size for i in range(n)], [size] * n) == [kv.OK] * n
        assert s.stats()["keys"] == n
        doomed, order = doomed_last(s, keys)

        # One batch reads every key, the doomed lease's last; the admin revokes that lease as soon as it is sent.
        t = s.submit_batch_get_into(order, region, [(n + i) * size for i in range(n)], [size] * n)
        assert admin.revoke(doomed) == "TornDown"
        results = s.wait(t, 30000)
        lost = wait_keys_lost(s, doomed["id"])
        assert lost["outcome"] == "torn_down" and lost["appliance"], lost
        assert lost["count"] == doomed["keys"] == len(lost["keys"]), lost
        lost_keys = set(lost["keys"])
        assert lost_keys <= set(keys)
        revoked = 0
        for i, (k, r) in enumerate(zip(order, results)):
            if r >= 0:
                # Landed (the other lease's, or the doomed lease's before the revoke): its own bytes.
                assert r == size and arena[(n + i) * size : (n + i + 1) * size] == value[k], (i, r)
            else:
                assert r == kv.REVOKED and k in lost_keys, (i, r)
                revoked += 1
            if k not in lost_keys:
                assert r == size, (i, r)
        assert revoked > 0, "the revoke landed after the whole batch: nothing was revoked mid-batch"
        # A lost key is a miss from now on (not an error); the others are intact.
        for k in keys:
            if k in lost_keys:
                assert s.get(k) is None and s.is_exist(k) == 0
            else:
                assert s.get(k) == value[k]
        st = s.stats()
        assert st["lost_by_revoke"] == len(lost_keys) and st["keys"] == n - len(lost_keys), st
        # The store goes on: the lease is replaced and new puts land.
        assert s.put(b"after", b"revoke") == kv.OK and s.get(b"after") == b"revoke"
        assert len(s.leases()) == 2
        region.close()
