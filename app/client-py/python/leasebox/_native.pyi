"""Typed stubs of the Rust extension `leasebox._native` (app/client-py/src/lib.rs)."""

from typing import Callable, Literal, Optional, Sequence, Tuple, Union

from typing_extensions import Buffer

__version__: str

EventKind = Literal["revoked", "expiring", "fenced", "draining", "reconnected", "disconnected"]
Outcome = Literal["TornDown", "Fenced", "NotFound"]

class LeaseboxError(Exception):
    """Any failure of a Leasebox call."""

class ConfigError(LeaseboxError):
    """A configuration or argument that cannot work."""

class ConnectionLost(LeaseboxError):
    """An appliance could not be reached or the connection broke (the client reconnects on its own)."""

class AuthError(LeaseboxError):
    """The appliance refused the credentials."""

class ServerError(LeaseboxError):
    """The appliance refused the request (the message names its error code)."""

class NoMemory(LeaseboxError):
    """No appliance had memory for the lease."""

class LeaseRevoked(LeaseboxError):
    """The lease was revoked or vanished: stop using it, allocate anew."""

class OutOfRange(LeaseboxError):
    """An offset and length outside the lease; nothing was sent."""

class RdmaError(LeaseboxError):
    """An RDMA operation failed while the lease exists: free it and allocate anew."""

class LeaseboxTimeout(LeaseboxError):
    """No answer or RDMA completion within the deadline."""

class Closed(LeaseboxError):
    """The lease was freed or its client closed."""

class Event:
    """Something that happened to a connection or a lease."""

    @property
    def kind(self) -> EventKind: ...
    @property
    def appliance(self) -> str: ...
    @property
    def lease(self) -> Optional[str]: ...
    @property
    def session_id(self) -> Optional[int]: ...
    @property
    def in_ms(self) -> Optional[int]: ...
    @property
    def outcome(self) -> Optional[Outcome]: ...
    @property
    def reason(self) -> Optional[str]: ...

class Lease:
    """`size` bytes of appliance memory, read and written by offset over RDMA. Freed by `free()`, by leaving a
    `with` block, or (best effort) when collected."""

    @property
    def id(self) -> str:
        """`SLOT.GENERATION@BOOT` (the appliance's boot id in 32 hex digits)."""
        ...
    @property
    def size(self) -> int: ...
    @property
    def appliance(self) -> str: ...
    @property
    def revoked(self) -> Optional[Outcome]: ...
    def __len__(self) -> int: ...
    def write(self, offset: int, data: Buffer) -> None: ...
    def read(self, offset: int, length: int) -> bytes: ...
    def read_into(self, offset: int, buf: Buffer) -> None: ...
    def write_many(self, items: Sequence[Tuple[int, Buffer]]) -> None: ...
    def read_many(self, items: Sequence[Tuple[int, int]]) -> list[bytes]: ...
    def free(self) -> Outcome: ...
    def __enter__(self) -> "Lease": ...
    def __exit__(self, t: object, v: object, tb: object) -> bool: ...

class Client:
    """A client of one or more appliances: a connection thread per appliance (heartbeats, renewals,
    reconnect); leases placed by free bytes."""

    def __init__(
        self,
        appliances: Union[str, Sequence[str]],
        tenant: str,
        key: str,
        *,
        rdma_peer: Union[str, Sequence[str], None] = None,
        timeout: Optional[float] = None,
        on_event: Optional[Callable[[Event], None]] = None,
    ) -> None: ...
    @staticmethod
    def from_etcd(
        etcd: Union[str, Sequence[str]],
        tenant: str,
        key: str,
        *,
        timeout: Optional[float] = None,
        on_event: Optional[Callable[[Event], None]] = None,
        etcd_cacert: Optional[str] = None,
        etcd_cert: Optional[str] = None,
        etcd_key: Optional[str] = None,
        etcd_user: Optional[str] = None,
        etcd_password: Optional[str] = None,
    ) -> Client: ...
    @property
    def appliances(self) -> list[str]: ...
    def alloc(self, size: int, *, ttl_ms: int = 0, prefer: Optional[int] = None) -> Lease: ...
    def free_bytes(self, appliance: int = 0) -> int: ...
    def revoke(self, lease_id: str, *, appliance: int = 0) -> Outcome: ...
    def next_event(self, timeout: float = 0.0) -> Optional[Event]: ...
    def events(self) -> list[Event]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Client": ...
    def __exit__(self, t: object, v: object, tb: object) -> bool: ...
