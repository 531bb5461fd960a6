"""The vLLM adapter (leasebox.adapters.vllm_tier) driven as vLLM's tiering manager drives a secondary tier: the
factory's out-of-tree load (`type` = class name, `module_path`, the other fields as keyword arguments), a
two-dimensional memoryview of the CPU primary tier (block b at b * strides[0]), jobs of block hashes and
primary-tier block ids, `lookup` per key, non-blocking `submit_store` / `submit_load`, `get_finished_jobs`
polled each scheduler step, and a load that loses a lease mid-transfer (or, when the whole load wins the race
with the REVOKE, the load after it): `success=False` with the keys that did land, and a MISS for the rest from
then on."""

from __future__ import annotations

import array
import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, List

import pytest

from test_kv_helpers import KIB, Revoker, doomed_last, pattern, retrying, store_params

BLOCK = 8 * KIB
BLOCKS = 128


@dataclass
class ReqContext:
    req_id: str = "req-0"
    kv_transfer_params: Dict[str, Any] = field(default_factory=dict)


@dataclass
class JobMetadata:
    """vLLM's `JobMetadata` (vllm/v1/kv_offload/tiering/base.py): the same fields."""

    job_id: int
    keys: Collection[bytes]
    block_ids: Any
    is_promotion: bool = False
    req_context: ReqContext = field(default_factory=ReqContext)


def block_hash(i: int) -> bytes:
    """An `OffloadKey`: a block's content hash (32 bytes) with its KV group index, as bytes."""
    return pattern(1 << 20 | i, 32) + (0).to_bytes(4, "little")


def load_tier(primary_kv_view: memoryview, **fields):
    """`SecondaryTierFactory.create_secondary_tier` for an out-of-tree tier: import `module_path`, take the class
    named by `type`, build it with the spec, the view, the type and the remaining fields."""
    config = {"type": "LeaseboxSecondaryTier", "module_path": "leasebox.adapters.vllm_tier", **fields}
    tier_cls = getattr(importlib.import_module(config["module_path"]), config["type"])
    rest = dict(config)
    tier_type = rest.pop("type")
    rest.pop("module_path")
    return retrying(
        lambda: tier_cls(offloading_spec=object(), primary_kv_view=primary_kv_view, tier_type=tier_type, **rest)
    )


def is_hit(result) -> bool:
    return result is True or getattr(result, "name", None) == "HIT"


def is_miss(result) -> bool:
    return result is False or getattr(result, "name", None) == "MISS"


def finish(tier, job_ids, within: float = 30.0) -> Dict[int, Any]:
    """Polls `get_finished_jobs` as the scheduler does each step until every job in `job_ids` is reported (once)."""
    want = set(job_ids)
    got: Dict[int, Any] = {}
    deadline = time.monotonic() + within
    while want - set(got):
        assert time.monotonic() < deadline, f"jobs {sorted(want - set(got))} not finished in {within} s"
        for r in tier.get_finished_jobs():
            assert r.job_id not in got, f"job {r.job_id} reported twice"
            got[r.job_id] = r
        time.sleep(0.002)
    return got


@pytest.fixture
def primary():
    """The CPU primary tier as vLLM hands it over: BLOCKS blocks of BLOCK bytes, one row each."""
    return memoryview(bytearray(BLOCKS * BLOCK)).cast("B", (BLOCKS, BLOCK))


@pytest.fixture
def tier(appliance, key_file, primary):
    t = load_tier(primary, **store_params(appliance, key_file, max_value_size=BLOCK))
    yield t
    t.shutdown()


def fill(primary: memoryview, block: int, seed: int) -> None:
    primary.obj[block * BLOCK : (block + 1) * BLOCK] = pattern(seed, BLOCK)


def blocks(primary: memoryview, first: int, end: int) -> bytes:
    """Blocks `first..end` of the primary tier (a two-dimensional memoryview cannot be indexed by row)."""
    return bytes(primary.obj[first * BLOCK : end * BLOCK])


def test_factory_load_and_config_errors(appliance, key_file, primary):
    t = load_tier(primary, **store_params(appliance, key_file))
    assert t.tier_type == "LeaseboxSecondaryTier" and t._block_size == BLOCK
    t.shutdown()
    t.shutdown()  # idempotent
    with pytest.raises(ValueError, match="block_size"):
        load_tier(memoryview(bytearray(4096)), **store_params(appliance, key_file))
    with pytest.raises(ValueError, match="unknown parameter 'root_dir'"):
        load_tier(primary, root_dir="/tmp", **store_params(appliance, key_file))


def test_store_lookup_load_round_trip(tier, primary):
    keys = [block_hash(i) for i in range(16)]
    for i in range(16):
        fill(primary, i, i)
    assert all(is_miss(tier.lookup(k, ReqContext())) for k in keys)

    # Store blocks 0..15 (ids as a numpy-like array of int64), then load them into blocks 64..79.
    tier.submit_store(JobMetadata(1, keys, array.array("q", range(16))))
    r = finish(tier, [1])[1]
    assert r.success and getattr(r, "successful_keys", None) is None
    assert all(is_hit(tier.lookup(k, ReqContext())) for k in keys)
    assert is_miss(tier.lookup(block_hash(999), ReqContext()))

    tier.submit_load(JobMetadata(2, keys, list(range(64, 80)), is_promotion=True))
    r = finish(tier, [2])[2]
    assert r.success
    for i in range(16):
        assert blocks(primary, 64 + i, 65 + i) == pattern(i, BLOCK), i
    assert blocks(primary, 80, BLOCKS) == bytes((BLOCKS - 80) * BLOCK)
    assert list(tier.get_finished_jobs()) == []


def test_jobs_run_concurrently_and_finish_once(tier, primary):
    for b in range(32):
        fill(primary, b, 100 + b)
    for j in range(8):
        tier.submit_store(JobMetadata(10 + j, [block_hash(100 + 4 * j + i) for i in range(4)],
                                      list(range(4 * j, 4 * j + 4))))
    assert all(r.success for r in finish(tier, range(10, 18)).values())
    for j in range(8):
        tier.submit_load(JobMetadata(20 + j, [block_hash(100 + 4 * j + i) for i in range(4)],
                                     list(range(32 + 4 * j, 36 + 4 * j))))
    tier.drain_jobs()  # waits for the loads; their results come with the next poll
    done = finish(tier, range(20, 28), within=1.0)
    assert all(r.success for r in done.values())
    assert blocks(primary, 32, 64) == blocks(primary, 0, 32)


def test_failures_are_per_job_and_per_key(tier, primary):
    fill(primary, 0, 7)
    tier.submit_store(JobMetadata(1, [block_hash(7)], [0]))
    assert finish(tier, [1])[1].success
    # A load naming a block the primary tier does not have fails at once, without touching anything.
    tier.submit_load(JobMetadata(2, [block_hash(7)], [BLOCKS]))
    assert not finish(tier, [2])[2].success
    # A load of a stored key and a never-stored one: the job fails, the stored key landed and is named.
    tier.submit_load(JobMetadata(3, [block_hash(7), block_hash(8)], [10, 11]))
    r = finish(tier, [3])[3]
    assert not r.success
    if hasattr(r, "successful_keys"):
        assert r.successful_keys == (block_hash(7),)
    assert blocks(primary, 10, 11) == pattern(7, BLOCK)
    with pytest.raises(ValueError, match="2 keys but 1 block ids"):
        tier.submit_store(JobMetadata(4, [block_hash(1), block_hash(2)], [0]))


def test_revoke_mid_load_reports_the_keys_that_landed(appliance, tier, primary):
    n = 64  # half the primary tier: blocks 0..63 stored, loaded into 64..127
    for b in range(n):
        fill(primary, b, 500 + b)
    keys = [block_hash(500 + b) for b in range(n)]
    seed = {k: 500 + b for b, k in enumerate(keys)}
    tier.submit_store(JobMetadata(1, keys, list(range(n))))
    assert finish(tier, [1])[1].success
    doomed, order = doomed_last(tier._store, keys)

    with Revoker(appliance) as admin:
        tier.submit_load(JobMetadata(2, order, list(range(n, 2 * n)), is_promotion=True))
        assert admin.revoke(doomed) == "TornDown"
    r = finish(tier, [2])[2]
    lost = set()
    deadline = time.monotonic() + 15
    while len(lost) < doomed["keys"] and time.monotonic() < deadline:
        lost |= set(tier.lost_keys())
        time.sleep(0.05)
    assert len(lost) == doomed["keys"] and lost <= set(keys), (len(lost), doomed)
    if r.success:
        # The whole load landed before the revoke did (64 small reads race one REVOKE's round trip; a loaded
        # machine decides which wins): the same load now fails exactly the lost keys.
        assert all(blocks(primary, n + i, n + i + 1) == pattern(seed[k], BLOCK) for i, k in enumerate(order))
        tier.submit_load(JobMetadata(3, order, list(range(n, 2 * n)), is_promotion=True))
        r = finish(tier, [3])[3]
        assert not r.success, "a load of revoked keys succeeded"
    landed = set(getattr(r, "successful_keys", None) or ())
    assert landed and len(landed) < n
    for i, k in enumerate(order):
        if k not in lost:
            assert k in landed, i
        if k in landed:
            assert blocks(primary, n + i, n + i + 1) == pattern(seed[k], BLOCK), i
        # What the scheduler sees next: every lost key is a MISS, the rest HIT.
        assert is_miss(tier.lookup(k, ReqContext())) if k in lost else is_hit(tier.lookup(k, ReqContext())), i
