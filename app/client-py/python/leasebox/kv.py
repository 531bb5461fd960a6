"""The key-value tier (docs/kv.md): `Store`, a key-value store over a few large leases, with Mooncake Store's call
names and integer results (>= 0 success, bytes for reads; negative: one of the codes below).

    from leasebox import Store
    with Store.open("leasebox://demo@127.0.0.1:7470", key_file="/etc/leasebox/demo.key") as s:
        s.put(b"k", b"value")
        assert s.get(b"k") == b"value"
        buf = bytearray(1 << 20)
        r = s.register_buffer(buf)                       # zero copy from here on
        s.batch_put_from([b"a", b"b"], r, [0, 4096], [4096, 4096])
        s.batch_get_into([b"a", b"b"], r, [8192, 12288], [4096, 4096])   # -> [4096, 4096]

A key whose lease was revoked is a miss (`get` → None, `get_into` → NOT_FOUND); `events()` says which keys went
(`{"kind": "keys_lost", ...}`). Rust log records reach the `logging` logger `leasebox.*` (passed on at each
call into the store).

Surface notes for adapter authors (beyond the agreed list): `Store.leases()` → `[(appliance, lease_id)]` and
`Store.where_is(key)` → `(appliance, lease_id)` or None; `wait()` raises `LeaseboxTimeout` when the batch is not
done (it stays pending) and `ConfigError` for an unknown ticket; `get()` raises `LeaseboxError` for failures
other than a miss or a revoke (TIMEOUT, FAILED); keys may be `str` (UTF-8) as well as bytes-like.
"""

from __future__ import annotations

from ._native import KV_FAILED as FAILED
from ._native import KV_NO_SPACE as NO_SPACE
from ._native import KV_NOT_FOUND as NOT_FOUND
from ._native import KV_OK as OK
from ._native import KV_REVOKED as REVOKED
from ._native import KV_TIMEOUT as TIMEOUT
from ._native import KV_TOO_LARGE as TOO_LARGE
from ._native import Store

CODES = {
    OK: "OK",
    NOT_FOUND: "NOT_FOUND",
    REVOKED: "REVOKED",
    TOO_LARGE: "TOO_LARGE",
    NO_SPACE: "NO_SPACE",
    TIMEOUT: "TIMEOUT",
    FAILED: "FAILED",
}


def code_name(code: int) -> str:
    """A result's name: "OK" for any success (>= 0), else the code's name ("FAILED" for an unknown one)."""
    if code >= 0:
        return "OK"
    return CODES.get(code, "FAILED")


__all__ = ["Store", "OK", "NOT_FOUND", "REVOKED", "TOO_LARGE", "NO_SPACE", "TIMEOUT", "FAILED", "CODES", "code_name"]
