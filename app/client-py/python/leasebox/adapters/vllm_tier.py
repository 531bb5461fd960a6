"""vLLM secondary tier on Leasebox: a `SecondaryTierManager` for the tiering spec of vLLM's offloading connector
(`OffloadingConnector` with `spec_name: TieringOffloadingSpec`), pure Python.

Followed upstream (vllm-project/vllm): `vllm/v1/kv_offload/tiering/base.py` (`SecondaryTierManager`,
`JobMetadata`, `JobResult`), `vllm/v1/kv_offload/tiering/factory.py` (`SecondaryTierFactory`, out-of-tree tiers
by `module_path`) and `vllm/v1/kv_offload/tiering/fs/manager.py` (commit 0255eeaabf66, the file-system tier: block
size from the view's stride, partial loads, `LookupResult`). The interface is marked experimental upstream and
has changed between commits; docs/reference/kv-frameworks.md says which shape this follows.

Configured in vLLM's `--kv-transfer-config` (the factory imports `module_path` and takes the class named by
`type`; the other fields are constructor keyword arguments):

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8589934592,
        "secondary_tiers": [{"type": "LeaseboxSecondaryTier", "module_path": "leasebox.adapters.vllm_tier",
                             "url": "leasebox://tenant@10.0.0.5:7470", "key_file": "/etc/leasebox/key",
                             "lease_size": 1073741824, "leases": 8}]}}

What vLLM's scheduler does with it (every call on the scheduler thread, none may block):

- `cls(offloading_spec=..., primary_kv_view=..., tier_type=..., **fields)`: `primary_kv_view` is a memoryview of
  the CPU primary tier, block `b` at byte `b * strides[0]`. The tier registers it with the store once: every
  transfer then goes between that memory and the appliance with no copy.
- `lookup(key, req_context)` -> HIT / MISS (`LookupResult` when vLLM is installed, else True / False): the store's
  own index, no network round trip.
- `submit_store(job)` / `submit_load(job)`: `job.keys` (block hashes, bytes) and `job.block_ids` (primary-tier
  block indices, a numpy array or any sequence of ints); each starts one asynchronous batch and returns.
- `get_finished_jobs()` -> `JobResult(job_id, success, ...)` for each job finished since the last call. A load
  that lost some keys (a revoked lease mid-transfer) is `success=False` with `successful_keys`, the keys that did
  land, so vLLM keeps those blocks and recomputes only the rest; a later `lookup` of a lost key is a MISS.
- `drain_jobs()` waits for the jobs in flight; `shutdown()` drains and closes.

One store per tier: the tier polls the store's completions.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ._common import byte_view, codes, key_bytes, open_store, optional, split_params

log = logging.getLogger(__name__)

_UPSTREAM_BASE = optional("vllm.v1.kv_offload.tiering.base", "SecondaryTierManager")
_UPSTREAM_RESULT = optional("vllm.v1.kv_offload.tiering.base", "JobResult")
_LOOKUP_RESULT = optional("vllm.v1.kv_offload.base", "LookupResult")


@dataclasses.dataclass
class JobResult:
    """vLLM's `JobResult` when vLLM is not installed (same field names)."""

    job_id: int
    success: bool
    successful_keys: Optional[Tuple[bytes, ...]] = None
    transfer_size: Optional[int] = None
    transfer_time: Optional[float] = None


def _result_type() -> Any:
    return _UPSTREAM_RESULT if _UPSTREAM_RESULT is not None else JobResult


def _make_result(**fields: Any) -> Any:
    """A `JobResult` of whichever class is in use, given only the fields that class has (older vLLM commits
    have just `job_id` and `success`)."""
    cls = _result_type()
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in fields.items() if k in names}
    return cls(**fields)


class _Job:
    __slots__ = ("job_id", "load", "keys", "ticket", "submitted", "size")

    def __init__(self, job_id: int, load: bool, keys: List[bytes], ticket: Optional[int], size: int) -> None:
        self.job_id = job_id
        self.load = load
        self.keys = keys
        self.ticket = ticket
        self.submitted = time.monotonic()
        self.size = size


_Base: Any = _UPSTREAM_BASE if _UPSTREAM_BASE is not None else object


class LeaseboxSecondaryTier(_Base):  # type: ignore[misc, valid-type]
    """vLLM secondary tier over a `leasebox.Store` (see the module documentation).

    Keyword fields from the tier's configuration: `Store.open`'s (`url`, `key_file`, `max_value_size`,
    `lease_size`, `leases`, `migrate_on_drain`, `requester`, `timeout_ms`) and `block_size` (bytes per block,
    when the view's stride does not give it); `store` hands over a store built by the caller instead."""

    def __init__(
        self,
        offloading_spec: Any = None,
        primary_kv_view: Any = None,
        tier_type: str = "LeaseboxSecondaryTier",
        *,
        store: Any = None,
        block_size: Optional[int] = None,
        vllm_config: Any = None,
        tier_name: Optional[str] = None,
        **fields: Any,
    ) -> None:
        if _UPSTREAM_BASE is not None:
            super().__init__(offloading_spec, primary_kv_view, tier_type)
        else:
            self._offloading_spec = offloading_spec
            self._primary_kv_view = primary_kv_view
            self.tier_type = tier_type
        self.tier_name = tier_name or tier_type
        if primary_kv_view is None:
            raise ValueError("LeaseboxSecondaryTier needs the primary tier's memoryview (primary_kv_view)")
        if block_size is None:
            strides = getattr(primary_kv_view, "strides", None)
            if not strides or len(strides) < 2:
                raise ValueError(
                    "primary_kv_view is one-dimensional: give block_size (bytes per block) in the tier config"
                )
            block_size = int(strides[0])
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, not {block_size!r}")
        store_params, _ = split_params(fields)
        self._block_size = block_size
        self._view = byte_view(primary_kv_view)
        self._blocks = len(self._view) // block_size
        self._store, self._owns_store = open_store(store_params, store)
        self._kv = codes()
        self._region = self._store.register_buffer(self._view)
        self._jobs: Dict[int, _Job] = {}  # by ticket
        self._finished: List[Any] = []
        self._lost: List[bytes] = []
        self._closed = False

    # --- SecondaryTierManager -----------------------------------------------------------------------------

    def lookup(self, key: Any, req_context: Any = None) -> Any:
        """HIT if the store holds `key`, else MISS (as `LookupResult` when vLLM is installed, else a bool). A key
        whose lease was revoked is a MISS from the moment the store learns of it."""
        r = self._store.is_exist(key_bytes(key))
        if r < 0:
            log.warning("leasebox: is_exist failed (%d): treated as a miss", r)
        hit = r == 1
        if _LOOKUP_RESULT is not None:
            return _LOOKUP_RESULT.HIT if hit else _LOOKUP_RESULT.MISS
        return hit

    def submit_store(self, job_metadata: Any) -> None:
        """Starts copying `job.block_ids` of the primary tier to the store under `job.keys`; returns at once."""
        self._submit(job_metadata, load=False)

    def submit_load(self, job_metadata: Any) -> None:
        """Starts reading `job.keys` into the primary tier's `job.block_ids`; returns at once."""
        self._submit(job_metadata, load=True)

    def get_finished_jobs(self) -> Iterable[Any]:
        """The jobs finished since the last call, as `JobResult`s (never blocks)."""
        self._collect(self._store.poll(256))
        self._collect_events()
        done, self._finished = self._finished, []
        return done

    # Older vLLM commits name the poll `get_finished`.
    get_finished = get_finished_jobs

    def drain_jobs(self) -> None:
        """Waits until every job in flight has finished (their results come from the next
        `get_finished_jobs`)."""
        timeout_ms = 30000
        for ticket in list(self._jobs):
            try:
                results = self._store.wait(ticket, timeout_ms)
            except Exception as e:
                log.warning("leasebox: waiting for job of ticket %d: %s", ticket, e)
                continue
            self._collect([(ticket, results)])

    def touch(self, keys: Any, req_context: Any = None) -> None:
        """Recency is the store's own (LRU by access); nothing to do."""
        return None

    def on_new_request(self, req_context: Any) -> Any:
        cls = optional("vllm.v1.kv_offload.base", "RequestOffloadingContext")
        return cls() if cls is not None else None

    get_request_offloading_context = on_new_request

    def on_request_finished(self, req_context: Any) -> None:
        return None

    request_finished = on_request_finished

    def on_schedule_end(self, context: Any = None) -> None:
        return None

    def take_events(self) -> Iterable[Any]:
        return ()

    def shutdown(self) -> None:
        """Drains the jobs in flight, unregisters the primary tier, closes the store if the tier opened it."""
        if self._closed:
            return
        self.drain_jobs()
        self._closed = True
        self._region.close()
        if self._owns_store:
            self._store.close()

    # --- for operators and tests -----------------------------------------------------------------------------

    def lost_keys(self) -> List[bytes]:
        """Keys the store reported lost (revoke, drain without migration, reboot), oldest first."""
        self._collect_events()
        return list(self._lost)

    def get_num_blocks(self) -> int:
        return int(self._store.stats().get("keys", 0))

    # --- inside ---------------------------------------------------------------------------------------------

    def _submit(self, job: Any, load: bool) -> None:
        if self._closed:
            raise RuntimeError("the Leasebox tier is shut down")
        keys = [key_bytes(k) for k in job.keys]
        block_ids = [int(b) for b in (job.block_ids.tolist() if hasattr(job.block_ids, "tolist") else job.block_ids)]
        if len(keys) != len(block_ids):
            raise ValueError(f"job {job.job_id}: {len(keys)} keys but {len(block_ids)} block ids")
        bad = [b for b in block_ids if not 0 <= b < self._blocks]
        size = len(keys) * self._block_size
        if bad or not keys:
            if bad:
                log.warning("leasebox: job %d names blocks outside the primary tier: %s", job.job_id, bad[:8])
            self._finished.append(
                _make_result(job_id=job.job_id, success=not bad, transfer_size=0 if bad else size, transfer_time=0.0)
            )
            return
        offsets = [b * self._block_size for b in block_ids]
        lengths = [self._block_size] * len(keys)
        if load:
            ticket = self._store.submit_batch_get_into(keys, self._region, offsets, lengths)
        else:
            ticket = self._store.submit_batch_put_from(keys, self._region, offsets, lengths)
        self._jobs[int(ticket)] = _Job(job.job_id, load, keys, int(ticket), size)

    def _collect(self, finished: Sequence[Tuple[int, Sequence[int]]]) -> None:
        now = time.monotonic()
        for ticket, results in finished:
            job = self._jobs.pop(int(ticket), None)
            if job is None:
                continue
            if job.load:
                good = [k for k, r in zip(job.keys, results) if r == self._block_size]
            else:
                good = [k for k, r in zip(job.keys, results) if r >= 0]
            success = len(good) == len(job.keys) and len(results) == len(job.keys)
            if not success:
                failed = [(k, r) for k, r in zip(job.keys, results) if r < 0 or (job.load and r != self._block_size)]
                log.info(
                    "leasebox: %s job %d: %d of %d keys failed (%s)", "load" if job.load else "store", job.job_id,
                    len(failed), len(job.keys), ", ".join(f"{k.hex()[:16]}={r}" for k, r in failed[:4]),
                )
            self._finished.append(
                _make_result(
                    job_id=job.job_id,
                    success=success,
                    successful_keys=tuple(good) if (job.load and not success and good) else None,
                    transfer_size=len(good) * self._block_size,
                    transfer_time=now - job.submitted,
                )
            )

    def _collect_events(self) -> None:
        try:
            events = self._store.events()
        except Exception:
            return
        for e in events:
            if e.get("kind") == "keys_lost":
                keys = list(e.get("keys") or ())
                self._lost += keys
                log.warning("leasebox: %d keys lost (lease %s, %s)", len(keys), e.get("lease"), e.get("outcome"))
