"""Leasebox client: leases of remote DRAM on a Leasebox appliance, read and written by offset over RDMA.

    import leasebox
    with leasebox.Client("127.0.0.1:7470", "demo", KEY_HEX) as client:
        lease = client.alloc(64 << 20)          # one large lease; place your blocks inside it
        lease.write(4096, b"hello")
        assert lease.read(4096, 5) == b"hello"
        lease.free()

Zero copy and batches (docs/client.md, "The Python data path"): `client.register(buffer)` → `Region`; `lease.write_from(region,
offset, lease_offset, length)` / `lease.read_into(region, ...)`; `client.submit([Op.write_from(...), ...])` →
tickets, `client.poll()` / `client.wait()` / `await client.completions()` → one `Completion` per operation.
The requester is chosen per appliance at run time: `Client(..., requester=config.verbs("mlx5_0", 1, 3))`.

`connect_from_config()` connects with the settings `cargo xtask run` writes for leasectl (see `leasebox.config`).
The key-value tier: `leasebox.Store` (module `leasebox.kv`, docs/kv.md).
The classes come from the Rust extension `leasebox._native` (app/client-py/src/lib.rs); a call that fails raises a
subclass of `LeaseboxError`; a revoked lease raises `LeaseRevoked` from then on.
"""

from __future__ import annotations

from typing import Callable, Optional

from . import config, kv
from ._native import (
    AuthError,
    Client,
    Closed,
    Completion,
    ConfigError,
    ConnectionLost,
    Event,
    Lease,
    LeaseboxError,
    LeaseboxTimeout,
    LeaseRevoked,
    NoMemory,
    Op,
    OutOfRange,
    RdmaError,
    Region,
    ServerError,
    Ticket,
    __version__,
)
from .kv import Store

__all__ = [
    "AuthError",
    "Client",
    "Closed",
    "Completion",
    "ConfigError",
    "ConnectionLost",
    "Event",
    "Lease",
    "LeaseboxError",
    "LeaseboxTimeout",
    "LeaseRevoked",
    "NoMemory",
    "Op",
    "OutOfRange",
    "RdmaError",
    "Region",
    "ServerError",
    "Store",
    "Ticket",
    "__version__",
    "config",
    "connect_from_config",
    "kv",
]


def connect_from_config(
    path: Optional[str] = None,
    *,
    admin: bool = False,
    timeout: Optional[float] = None,
    on_event: Optional[Callable[[Event], None]] = None,
    requester: Optional[config.Requester] = None,
    queue_depth: int = 64,
) -> Client:
    """A `Client` with the settings of leasectl's configuration file (by default where `cargo xtask run` wrote
    it): its `addr`, the tenant and `key` (or, with `admin=True`, `admin` and `admin_key`), and `rdma_peer`;
    `requester` (`config.verbs(...)`, `config.soft(...)`) picks the RDMA path (default: software, to rdma_peer)."""
    s = config.load(path)
    name, key = ("admin", s.admin_key) if admin else (s.tenant, s.key)
    if not key:
        which = "admin_key" if admin else "key"
        raise ConfigError(f"{s.path}: no {which}")
    return Client(
        s.addr,
        name,
        key,
        rdma_peer=s.rdma_peer,
        requester=requester,
        queue_depth=queue_depth,
        timeout=timeout,
        on_event=on_event,
    )
