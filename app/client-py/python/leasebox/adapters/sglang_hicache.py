"""SGLang HiCache storage (its L3 tier) on Leasebox: a `HiCacheStorage` backend loaded as `dynamic`, pure Python.

Followed upstream (sgl-project/sglang, commit 001067fffe33): `python/sglang/srt/mem_cache/hicache_storage.py`
(`HiCacheStorage`, `HiCacheStorageConfig`, `HiCacheStorageExtraInfo`),
`python/sglang/srt/mem_cache/storage/backend_factory.py` (`StorageBackendFactory._create_dynamic_backend`) and
the cache controller's choice of the zero-copy `batch_get_v1` / `batch_set_v1` path for a `dynamic` backend whose
extra config sets `interface_v1`. Facts in docs/reference/kv-frameworks.md.

Configured on SGLang's command line (the extra config is JSON; its Leasebox fields are `Store.open`'s):

    --enable-hierarchical-cache --hicache-mem-layout page_first --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "leasebox",
        "module_path": "leasebox.adapters.sglang_hicache", "class_name": "LeaseboxHiCacheStorage",
        "interface_v1": 1, "url": "leasebox://tenant@10.0.0.5:7470", "key_file": "/etc/leasebox/key",
        "lease_size": 1073741824, "leases": 8}'

What SGLang does with it:

- `cls(storage_config, kwargs)`: `storage_config.extra_config` is the JSON above; then
  `register_mem_pool_host(host_pool)`. The backend registers the host pool's buffers with the store once, so
  every page goes between them and the appliance with no copy.
- `batch_set_v1(keys, host_indices, extra_info)` (backup, L2 -> L3) and `batch_get_v1(keys, host_indices,
  extra_info)` (prefetch, L3 -> L2) -> one bool per key. `keys` are page hashes (str), `host_indices` the host
  pool's token slots, `page_size` per key; the pool's `get_page_buffer_meta(host_indices)` gives each page's
  pieces (K and V for MHA, one for MLA) as (address, length). SGLang counts the leading run of True: a page
  lost to a revoke mid-load stops the prefetch there, and the pages before it are used.
- `batch_exists(keys, extra_info)` -> the number of keys present from the start (the store's own index, no
  network round trip); `exists`, `get`, `set`, `batch_get`, `batch_set` (the copying interface SGLang is
  retiring) and `clear` are there too.

A page is stored as one store key per piece (`<hash>_<rank>_<piece>`; the rank part names the TP rank for
models whose KV is split by rank, none for MLA); a page counts as present or loaded only when all its pieces are.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._common import STORE_PARAMS, byte_view, codes, key_bytes, open_store, optional, split_params

log = logging.getLogger(__name__)

_UPSTREAM_BASE = optional("sglang.srt.mem_cache.hicache_storage", "HiCacheStorage")

#: extra_config fields SGLang itself reads for a dynamic backend (not ours to check).
_SGLANG_FIELDS = frozenset({"backend_name", "module_path", "class_name", "interface_v1"})

_Base: Any = _UPSTREAM_BASE if _UPSTREAM_BASE is not None else object


class LeaseboxHiCacheStorage(_Base):  # type: ignore[misc, valid-type]
    """SGLang HiCache storage backend over a `leasebox.Store` (see the module documentation)."""

    def __init__(self, storage_config: Any, kwargs: Any = None, *, store: Any = None) -> None:
        extra: Dict[str, Any] = dict(getattr(storage_config, "extra_config", None) or {})
        ours = {k: v for k, v in extra.items() if k in STORE_PARAMS}
        others = sorted(k for k in extra if k not in STORE_PARAMS and k not in _SGLANG_FIELDS)
        if others:
            log.info("leasebox: extra_config fields not for Leasebox, left to SGLang: %s", ", ".join(others))
        store_params, _ = split_params(ours)
        self._store, self._owns_store = open_store(store_params, store)
        self._kv = codes()
        self.storage_config = storage_config
        model = getattr(storage_config, "model_name", None) or ""
        model = model.replace("/", "-")
        if getattr(storage_config, "is_mla_model", False):
            self._suffix = f"{model}"
        else:
            self._suffix = f"{model}_{getattr(storage_config, 'tp_rank', 0)}_{getattr(storage_config, 'tp_size', 1)}"
        # (base address, length, byte view, region) of each registered host buffer, by base address.
        self._buffers: List[Tuple[int, int, memoryview, Any]] = []
        self.mem_pool_host: Any = None
        # Pieces per page as the host pool last reported them (K and V, per layer for layer_first).
        self._pieces: Optional[int] = None
        # The factory passes its kwargs dict; a built-in style call passes the host pool itself.
        if kwargs is not None and not isinstance(kwargs, dict):
            self.register_mem_pool_host(kwargs)

    # --- host pool --------------------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers the host pool's buffers with the store (once: later transfers name them by offset)."""
        self.mem_pool_host = mem_pool_host
        get_buffers = getattr(mem_pool_host, "get_hybrid_pool_buffer", None)
        buffers = get_buffers() if callable(get_buffers) else mem_pool_host.kv_buffer
        if not isinstance(buffers, (list, tuple)):
            buffers = [buffers]
        self._close_regions()
        for buf in buffers:
            view = byte_view(buf)
            base = int(buf.data_ptr())
            self._buffers.append((base, len(view), view, self._store.register_buffer(view)))
        self._buffers.sort(key=lambda b: b[0])

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """The v2 (multi-pool) interface is not implemented: only the KV pool is used."""
        if str(getattr(host_pool_name, "value", host_pool_name)) == "kv":
            self.register_mem_pool_host(host_pool)

    # --- the v1 zero-copy interface ---------------------------------------------------------------------------

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Stores each page `keys[i]` from the host pool; one bool per key."""
        return self._transfer(keys, host_indices, load=False)

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Loads each page `keys[i]` into the host pool; one bool per key (True: every piece landed)."""
        return self._transfer(keys, host_indices, load=True)

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many of `keys`, from the first, are stored (all pieces of each page)."""
        if not keys:
            return 0
        pieces = self._pieces_per_page()
        names = [key_bytes(self._piece_key(k, j)) for k in keys for j in range(pieces)]
        try:
            present = list(self._store.batch_is_exist(names))
        except Exception as e:
            log.warning("leasebox: batch_is_exist failed: %s", e)
            return 0
        for i in range(len(keys)):
            if not all(r == 1 for r in present[i * pieces : (i + 1) * pieces]):
                return i
        return len(keys)

    # --- the copying interface (what SGLang uses without interface_v1) ------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """The page `key` (one piece), into `target_location` when given (returned), else as bytes; None when
        absent."""
        value = self._store.get(key_bytes(self._piece_key(key, 0)))
        if value is None:
            return None
        if target_location is None:
            return value
        view = byte_view(target_location)
        if len(view) != len(value):
            log.warning("leasebox: %s holds %d bytes, the target %d", key, len(value), len(view))
            return None
        view[:] = value
        return target_location

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        targets = target_locations if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        src = value if value is not None else target_location
        if src is None:
            return False
        return self._store.put(key_bytes(self._piece_key(key, 0)), byte_view(src, writable=False)) >= 0

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        vals = values if values is not None else target_locations
        if vals is None:
            return False
        return all([self.set(k, v) for k, v in zip(keys, vals)])

    def clear(self) -> None:
        """Nothing: the store is shared with no other SGLang instance's index; its leases go when it closes."""
        return None

    def get_stats(self) -> Optional[Dict[str, Any]]:
        return dict(self._store.stats())

    def close(self) -> None:
        """Unregisters the host buffers and closes the store if the backend opened it. Idempotent."""
        self._close_regions()
        if self._owns_store:
            self._owns_store = False
            self._store.close()

    # --- inside -----------------------------------------------------------------------------------------------

    def _close_regions(self) -> None:
        for _, _, _, region in self._buffers:
            try:
                region.close()
            except Exception:
                pass
        self._buffers = []

    def _pieces_per_page(self) -> int:
        if self._pieces is not None:
            return self._pieces
        return 1 if getattr(self.storage_config, "is_mla_model", False) else 2

    def _piece_key(self, key: str, piece: int) -> str:
        return f"{key}_{self._suffix}_{piece}"

    def _locate(self, ptr: int, size: int) -> Optional[Tuple[int, int]]:
        """(buffer index, offset) of `size` bytes at address `ptr`, or None when no registered buffer holds
        them whole."""
        for i, (base, length, _, _) in enumerate(self._buffers):
            if base <= ptr and ptr + size <= base + length:
                return i, ptr - base
        return None

    def _transfer(self, keys: List[str], host_indices: Any, load: bool) -> List[bool]:
        if not keys:
            return []
        if self.mem_pool_host is None or not self._buffers:
            raise RuntimeError("register_mem_pool_host was not called: no host pool to move pages from")
        page_size = getattr(self.mem_pool_host, "page_size", None)
        slots = host_indices.numel() if hasattr(host_indices, "numel") else len(host_indices)
        if page_size and slots != len(keys) * page_size:
            raise ValueError(f"{len(keys)} keys but {slots} host indices (page_size {page_size})")
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        ptrs = list(ptrs)
        if isinstance(sizes, int):
            sizes = [sizes] * len(ptrs)
        sizes = list(sizes)
        if len(ptrs) % len(keys) or len(ptrs) != len(sizes):
            raise ValueError(
                f"{len(keys)} keys but the host pool gave {len(ptrs)} pieces and {len(sizes)} sizes for their pages"
            )
        pieces = len(ptrs) // len(keys)
        self._pieces = pieces
        # Group the pieces by the buffer they live in: one batch call per buffer.
        groups: Dict[int, List[Tuple[int, bytes, int, int]]] = {}
        ok = [True] * len(keys)
        for n, (ptr, size) in enumerate(zip(ptrs, sizes)):
            page, piece = divmod(n, pieces)
            where = self._locate(int(ptr), int(size))
            if where is None:
                log.warning("leasebox: page %s piece %d lies outside the registered host pool", keys[page], piece)
                ok[page] = False
                continue
            buf, offset = where
            groups.setdefault(buf, []).append((page, key_bytes(self._piece_key(keys[page], piece)), offset, int(size)))
        for buf, items in groups.items():
            region = self._buffers[buf][3]
            names = [name for _, name, _, _ in items]
            offsets = [off for _, _, off, _ in items]
            lengths = [size for _, _, _, size in items]
            try:
                if load:
                    results = self._store.batch_get_into(names, region, offsets, lengths)
                else:
                    results = self._store.batch_put_from(names, region, offsets, lengths)
            except Exception as e:
                log.warning("leasebox: batch %s failed: %s", "get" if load else "put", e)
                results = [self._kv.FAILED] * len(items)
            for (page, _, _, size), r in zip(items, results):
                if r < 0 or (load and r != size):
                    ok[page] = False
        return ok
