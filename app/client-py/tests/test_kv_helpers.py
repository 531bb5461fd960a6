"""What the key-value tests share (no tests of its own): a store opened on the test appliance the way a program
opens one (a `leasebox://` URL and a key file), the store's leases, a revoke by the admin, and waiting for the
store's `keys_lost` event.

The store reaches the appliance the module's clients reach (app/client-py/tests/conftest.py): the hosted
appliance with the software requester toward its UDP port, or, with `LEASEBOX_TEST_APPLIANCE`, an external one
(the QEMU appliance from the Soft-RoCE guest, `LEASEBOX_TEST_REQUESTER=verbs:rxe0:1:1`).
"""

from __future__ import annotations

import functools
import os
import random
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

from conftest import REQUESTER

KIB = 1 << 10
MIB = 1 << 20


@functools.lru_cache(maxsize=512)
def pattern(seed: int, n: int) -> bytes:
    """`n` pseudo-random bytes fixed by `seed` (a misplaced, torn or swapped copy shows). Made in C
    (`random.randbytes`): the Soft-RoCE guest runs Python under TCG, where a byte-by-byte loop is slow."""
    return random.Random(seed).randbytes(n)


def store_url(appliance) -> str:
    """`leasebox://TENANT@ADDR` with the software requester's peer (`rdma=`) or the chosen requester."""
    query = []
    if appliance.udp and not REQUESTER:
        query.append(f"rdma={appliance.udp}")
    if REQUESTER:
        query.append(f"requester={REQUESTER}")
    return f"leasebox://{appliance.tenant_name}@{appliance.addr}" + ("?" + "&".join(query) if query else "")


class KeyFile:
    """The tenant's key as a program keeps it: hex in a file only its owner reads."""

    def __init__(self, key_hex: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix="leasebox-key-")
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key_hex + "\n")

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


def store_params(appliance, key_file: KeyFile, **kw: Any) -> Dict[str, Any]:
    """`Store.open` keyword arguments for the test appliance (small leases: an appliance's pool is small, and
    memory of revoked leases comes back only after it is cleared)."""
    p: Dict[str, Any] = {
        "url": store_url(appliance),
        "key_file": key_file.path,
        "lease_size": 2 * MIB,
        "leases": 2,
        "max_value_size": 64 * KIB,
    }
    p.update(kw)
    return p


def retrying(make: Callable[[], Any], within: float = 30.0) -> Any:
    """`make()`, tried again while the appliance has no memory to lend: memory of leases freed or revoked by
    earlier tests comes back only after its grace and its clearing (one appliance serves every module when
    `LEASEBOX_TEST_APPLIANCE` names it)."""
    import leasebox

    deadline = time.monotonic() + within
    while True:
        try:
            return make()
        except leasebox.LeaseboxError as e:
            if time.monotonic() > deadline or "memory" not in str(e).lower():
                raise
            time.sleep(0.2)


def open_store(appliance, key_file: KeyFile, **kw: Any):
    """A `leasebox.Store` on the test appliance (see `retrying`)."""
    import leasebox

    return retrying(lambda: leasebox.Store.open(**store_params(appliance, key_file, **kw)))


def leases(store, keys) -> List[Dict[str, Any]]:
    """The store's live leases (`Store.leases()`: appliance and lease id each) as dicts with `id`, `appliance`
    (its index among the store's appliances: 0 with one) and `keys`, how many of `keys` it holds
    (`Store.where_is`)."""
    held = {str(lid): {"id": str(lid), "appliance": 0, "addr": addr, "keys": 0} for addr, lid in store.leases()}
    for k in keys:
        where = store.where_is(k.encode() if isinstance(k, str) else k)
        if where is not None:
            held[str(where[1])]["keys"] += 1
    return list(held.values())


class Revoker:
    """The admin's client, connected before the transfer it is to interrupt starts (connecting takes longer
    than a small batch does); `revoke(lease)` returns the outcome (`TornDown` for a clean teardown)."""

    def __init__(self, appliance) -> None:
        self.client = appliance.admin()

    def revoke(self, lease: Dict[str, Any]) -> str:
        return self.client.revoke(lease["id"], appliance=lease.get("appliance", 0))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Revoker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def doomed_last(store, keys: List[Any]) -> Tuple[Dict[str, Any], List[Any]]:
    """The lease holding most of `keys`, and `keys` reordered with that lease's keys last: a revoke sent once
    the batch is submitted then lands while that lease's transfers are still to run."""
    held = leases(store, keys)
    assert len(held) >= 2 and all(l["keys"] > 0 for l in held), held
    doomed = max(held, key=lambda l: l["keys"])

    def on_doomed(k: Any) -> bool:
        where = store.where_is(k.encode() if isinstance(k, str) else k)
        return where is not None and str(where[1]) == doomed["id"]

    return doomed, [k for k in keys if not on_doomed(k)] + [k for k in keys if on_doomed(k)]


def wait_keys_lost(store, lease_id: str, within: float = 15.0) -> Dict[str, Any]:
    """The store's `keys_lost` event for `lease_id` (other events are kept in the returned dict's `others`)."""
    deadline = time.monotonic() + within
    others: List[Dict[str, Any]] = []
    while time.monotonic() < deadline:
        for e in store.events():
            if e.get("kind") == "keys_lost" and e.get("lease") == lease_id:
                e = dict(e)
                e["others"] = others
                return e
            others.append(e)
        time.sleep(0.05)
    raise AssertionError(f"no keys_lost event for lease {lease_id} within {within} s (saw {others})")
