"""The SGLang adapter (leasebox.adapters.sglang_hicache) driven as SGLang's HiCache drives a `dynamic` storage
backend: the factory's `backend_class(storage_config, kwargs)` with the JSON extra config, then
`register_mem_pool_host`; page hashes with host-pool token indices (`page_size` per key) through the zero-copy
`batch_set_v1` / `batch_get_v1` (one bool per key), `batch_exists` counting the present prefix, the host pool's
`get_page_buffer_meta` giving each page's K and V pieces (one piece for MLA), and a prefetch that loses a lease
mid-load: SGLang keeps the leading run of loaded pages and stops at the first lost one."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import List, Optional

import pytest

from test_kv_helpers import KIB, Revoker, doomed_last, pattern, retrying, store_params, wait_keys_lost

PAGE = 4  # tokens per page
TOKEN = 512  # bytes of K (and of V) per token, all layers
SLOTS = 1024  # tokens in the host pool (256 pages)
BASE = 0x7F00_0000_0000  # the pool's address as the pool reports it


@dataclass
class HiCacheStorageConfig:
    """SGLang's `HiCacheStorageConfig` (python/sglang/srt/mem_cache/hicache_storage.py), the fields it has."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    is_mla_model: bool = False
    enable_storage_metrics: bool = False
    is_page_first_layout: bool = True
    model_name: Optional[str] = "Qwen/Qwen3-8B"
    extra_config: Optional[dict] = None


class Indices:
    """Host indices as SGLang passes them (a torch tensor of token slots): len, indexing, `tolist()`."""

    def __init__(self, slots: List[int]) -> None:
        self.slots = list(slots)

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, i: int) -> int:
        return self.slots[i]

    def tolist(self) -> List[int]:
        return list(self.slots)

    def numel(self) -> int:
        return len(self.slots)


class Buffer:
    """A CPU tensor as far as the backend looks: `data_ptr()`, `numpy()` (its bytes), `element_size()`."""

    def __init__(self, n: int, base: int) -> None:
        self.mem = bytearray(n)
        self.base = base

    def data_ptr(self) -> int:
        return self.base

    def numpy(self):
        return self.mem

    def element_size(self) -> int:
        return 1


class HostPool:
    """A page_first host KV pool (`MHATokenToKVPoolHost` / `MLATokenToKVPoolHost` as the backend sees them): K of
    every token, then V of every token, in one buffer; `get_page_buffer_meta` gives (K, V) per page, or K only
    for MLA."""

    layout = "page_first"
    page_size = PAGE

    def __init__(self, mla: bool = False) -> None:
        self.mla = mla
        self.kv_buffer = Buffer((1 if mla else 2) * SLOTS * TOKEN, BASE)

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        assert len(idx) % self.page_size == 0
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            k = self.kv_buffer.base + idx[i] * TOKEN
            ptrs += [k] if self.mla else [k, k + SLOTS * TOKEN]
        return ptrs, [self.page_size * TOKEN] * len(ptrs)

    def fill_page(self, slot: int, seed: int) -> None:
        n = self.page_size * TOKEN
        self.kv_buffer.mem[slot * TOKEN : slot * TOKEN + n] = pattern(seed, n)
        if not self.mla:
            v = SLOTS * TOKEN + slot * TOKEN
            self.kv_buffer.mem[v : v + n] = pattern(seed + 1000, n)

    def page(self, slot: int) -> bytes:
        n = self.page_size * TOKEN
        k = bytes(self.kv_buffer.mem[slot * TOKEN : slot * TOKEN + n])
        if self.mla:
            return k
        v = SLOTS * TOKEN + slot * TOKEN
        return k + bytes(self.kv_buffer.mem[v : v + n])

    def expected(self, seed: int) -> bytes:
        n = self.page_size * TOKEN
        return pattern(seed, n) + (b"" if self.mla else pattern(seed + 1000, n))


def load_backend(params: dict, pool: HostPool, **config):
    """`StorageBackendFactory.create_backend("dynamic", ...)`: the extra config names module and class; the
    backend is built with (storage_config, kwargs), then the cache controller registers the host pool."""
    extra = json.loads(json.dumps({
        "backend_name": "leasebox",
        "module_path": "leasebox.adapters.sglang_hicache",
        "class_name": "LeaseboxHiCacheStorage",
        "interface_v1": 1,
        **params,
    }))
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    backend = retrying(lambda: cls(HiCacheStorageConfig(extra_config=extra, **config), {}))
    backend.register_mem_pool_host(pool)
    return backend


def page_slots(pages: List[int]) -> Indices:
    """The token slots of host pages `pages` (page p is slots p*PAGE .. p*PAGE+PAGE-1)."""
    return Indices([p * PAGE + t for p in pages for t in range(PAGE)])


def leading(results: List[bool]) -> int:
    """What `_page_get_zero_copy` makes of the bools: the pages up to the first failure."""
    return results.index(False) if False in results else len(results)


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_backup_exists_prefetch(appliance, key_file, mla):
    pool = HostPool(mla)
    backend = load_backend(store_params(appliance, key_file, max_value_size=8 * KIB), pool, is_mla_model=mla)
    try:
        keys = [f"h{i:040x}" for i in range(8)]
        for p in range(8):
            pool.fill_page(p * PAGE, p)
        assert backend.batch_exists(keys) == 0
        assert backend.batch_set_v1(keys, page_slots(range(8))) == [True] * 8
        assert backend.batch_exists(keys) == 8
        assert backend.batch_exists(keys[:3] + ["h-absent"] + keys[4:]) == 3
        assert backend.exists(keys[5]) and not backend.exists("h-absent")

        # Prefetch into other host pages (32..39): every page lands whole, nothing else is written.
        before = pool.page(0)
        assert backend.batch_get_v1(keys, page_slots(range(32, 40))) == [True] * 8
        for i in range(8):
            assert pool.page((32 + i) * PAGE) == pool.expected(i), i
        assert pool.page(0) == before and pool.page(40 * PAGE) == bytes(len(before))

        # A prefetch whose third page was never stored: one bool per key, SGLang keeps the first two.
        got = backend.batch_get_v1(keys[:2] + ["h-absent"] + keys[3:5], page_slots(range(48, 53)))
        assert got == [True, True, False, True, True] and leading(got) == 2
        assert backend.batch_get_v1([], page_slots([])) == []
    finally:
        backend.close()
        backend.close()


def test_ranks_sharing_a_store_keep_their_pages_apart(appliance, key_file):
    """Two TP ranks (each with its half of every head) store the same page hash in one store without
    overwriting each other; an MLA model's page (the same on every rank) has one key."""
    from test_kv_helpers import open_store

    store = open_store(appliance, key_file)
    cls = importlib.import_module("leasebox.adapters.sglang_hicache").LeaseboxHiCacheStorage
    pools = [HostPool(), HostPool()]
    backends = [cls(HiCacheStorageConfig(tp_rank=r, tp_size=2), {}, store=store) for r in range(2)]
    try:
        for r, b in enumerate(backends):
            b.register_mem_pool_host(pools[r])
            pools[r].fill_page(0, 70 + r)
            assert b.batch_set_v1(["hsame"], page_slots([0])) == [True]
        for r, b in enumerate(backends):
            assert b.batch_get_v1(["hsame"], page_slots([9])) == [True]
            assert pools[r].page(9 * PAGE) == pools[r].expected(70 + r), r
        with pytest.raises(Exception, match="store parameters"):
            cls(HiCacheStorageConfig(extra_config={"leases": 1}), {}, store=store)
    finally:
        for b in backends:
            b.close()
        store.close()


def test_bad_input_is_refused_clearly(appliance, key_file):
    pool = HostPool()
    backend = load_backend(store_params(appliance, key_file), pool)
    try:
        with pytest.raises(ValueError, match=r"2 keys but 12 host indices \(page_size 4\)"):
            backend.batch_set_v1(["a", "b"], page_slots([0, 1, 2]))
        with pytest.raises(RuntimeError, match="register_mem_pool_host"):
            cls = type(backend)
            cls(HiCacheStorageConfig(), {}, store=backend._store).batch_get_v1(["a"], page_slots([0]))
        # A pool that points outside the registered buffer fails that page only.
        outside = HostPool()
        outside.kv_buffer.base = BASE + (1 << 30)
        backend.mem_pool_host = outside
        assert backend.batch_set_v1(["c"], page_slots([0])) == [False]
    finally:
        backend.close()
    from leasebox.adapters._common import AdapterConfigError

    with pytest.raises(AdapterConfigError, match="leases: expected int"):
        load_backend(store_params(appliance, key_file, leases="2"), HostPool())


def test_revoke_mid_prefetch_keeps_the_prefix(appliance, key_file):
    import threading

    pool = HostPool(mla=True)
    backend = load_backend(store_params(appliance, key_file, max_value_size=2 * KIB * PAGE), pool, is_mla_model=True)
    try:
        n = 48
        keys = [f"p{i:040x}" for i in range(n)]
        for p in range(n):
            pool.fill_page(p * PAGE, 900 + p)
        assert backend.batch_set_v1(keys, page_slots(range(n))) == [True] * n
        store = backend._store
        doomed, _ = doomed_last(store, [backend._piece_key(k, 0) for k in keys])

        # The prefetch thread loads while the admin revokes one lease (sent from another thread at once).
        outcome: List[str] = []
        with Revoker(appliance) as admin:
            t = threading.Thread(target=lambda: outcome.append(admin.revoke(doomed)))
            t.start()
            got = backend.batch_get_v1(keys, page_slots(range(n, 2 * n)))
            t.join(30)
        assert outcome == ["TornDown"]
        for i, ok in enumerate(got):
            if ok:  # a page reported loaded has its own bytes, whether it landed before the revoke or not
                assert pool.page((n + i) * PAGE) == pool.expected(900 + i), i

        # From the store's keys_lost on, the doomed lease's pages are absent and fail to load; the rest load.
        lost = wait_keys_lost(store, doomed["id"])
        assert lost["count"] == doomed["keys"] == len(lost["keys"]), lost
        lost_pages = {k.decode().rsplit("_", 2)[0] for k in lost["keys"]}
        assert lost_pages <= set(keys) and len(lost_pages) == doomed["keys"]
        assert [ok for k, ok in zip(keys, got) if k not in lost_pages] == [True] * (n - len(lost_pages))
        again = backend.batch_get_v1(keys, page_slots(range(2 * n, 3 * n)))
        assert again == [k not in lost_pages for k in keys]
        first_lost = again.index(False)
        assert backend.batch_exists(keys) == first_lost and leading(again) == first_lost
    finally:
        backend.close()
