"""Configuration: the RDMA requester of each appliance, chosen at run time (`verbs(...)`, `soft(...)`,
`requester(text)`), and leasectl's configuration file as `cargo xtask run` writes it (app/leasectl/src/config.rs,
which owns the format): `key = value` lines, `#` comments. Default path: `$LEASECTL_CONFIG`, else
`$XDG_CONFIG_HOME/leasebox/leasectl.conf`, else `$HOME/.config/leasebox/leasectl.conf`.

    client = leasebox.Client(addr, "demo", key, requester=config.verbs("rxe0", 1, 1))
    client = leasebox.Client([a, b], "demo", key, requester=[config.verbs("mlx5_0"), config.soft("10.0.0.2:4791")])
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Union

#: Where the appliance's RoCEv2 responder listens when the file names none (the device model's UDP socket).
DEFAULT_RDMA_PEER = "127.0.0.1:4791"
DEFAULT_ADDR = "127.0.0.1:7470"


@dataclass(frozen=True)
class Verbs:
    """A real RDMA NIC through libibverbs: `device` as `ibv_devices` names it (mlx5_0, rxe0), its `port`, and
    the index of our RoCEv2 GID (`show_gids`). The module imports without libibverbs; a client that picks verbs
    on a host without it fails with an error naming the package (libibverbs1)."""

    device: str
    port: int = 1
    gid_index: int = 1

    def __str__(self) -> str:
        return f"verbs:{self.device}:{self.port}:{self.gid_index}"


@dataclass(frozen=True)
class Soft:
    """The software RoCEv2 requester over UDP toward `peer` (`HOST:PORT`, the appliance's RoCEv2 socket; None:
    the client's `rdma_peer`)."""

    peer: Optional[str] = None

    def __str__(self) -> str:
        return f"soft:{self.peer}" if self.peer else "soft"


Requester = Union[Verbs, Soft]


def verbs(device: str, port: int = 1, gid_index: int = 1) -> Verbs:
    """The verbs requester on `device`, `port`, GID `gid_index`."""
    if not device or ":" in device:
        raise ValueError(f"verbs: bad device name {device!r}")
    if not 1 <= port <= 255 or not 0 <= gid_index <= 255:
        raise ValueError(f"verbs: port {port} (1-255) or GID index {gid_index} (0-255) out of range")
    return Verbs(device, port, gid_index)


def soft(peer: Optional[str] = None) -> Soft:
    """The software requester toward `peer` (`HOST:PORT`), or toward the client's `rdma_peer`."""
    return Soft(peer)


def requester(text: str) -> Requester:
    """A requester written as text: `soft`, `soft:HOST:PORT` or `verbs:DEVICE:PORT:GID_INDEX` (what
    `str()` of `Verbs` and `Soft` gives; e.g. `$LEASEBOX_TEST_REQUESTER=verbs:rxe0:1:1`)."""
    kind, _, rest = text.strip().partition(":")
    if kind == "soft":
        return soft(rest or None)
    if kind == "verbs":
        parts = rest.split(":")
        if len(parts) != 3 or not all(parts[1:]) or not parts[1].isdigit() or not parts[2].isdigit():
            raise ValueError(f"requester {text!r}: verbs takes DEVICE:PORT:GID_INDEX")
        return verbs(parts[0], int(parts[1]), int(parts[2]))
    raise ValueError(f"requester {text!r}: give soft, soft:HOST:PORT or verbs:DEVICE:PORT:GID_INDEX")


@dataclass(frozen=True)
class Settings:
    path: Path
    addr: str
    tenant: str
    key: Optional[str]
    admin_key: Optional[str]
    rdma_peer: str


def default_path() -> Path:
    env = os.environ
    if env.get("LEASECTL_CONFIG"):
        return Path(env["LEASECTL_CONFIG"])
    if env.get("XDG_CONFIG_HOME"):
        return Path(env["XDG_CONFIG_HOME"]) / "leasebox" / "leasectl.conf"
    if env.get("HOME"):
        return Path(env["HOME"]) / ".config" / "leasebox" / "leasectl.conf"
    raise FileNotFoundError("no LEASECTL_CONFIG, XDG_CONFIG_HOME or HOME to find leasectl.conf by")


def parse(text: str) -> Dict[str, str]:
    """The file's `key = value` pairs; `#` starts a comment."""
    out: Dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "=" not in line:
            raise ValueError(f"line {n}: expected `key = value`, got {raw!r}")
        k, v = (p.strip() for p in line.split("=", 1))
        out[k] = v
    return out


def load(path: Optional[str] = None) -> Settings:
    p = Path(path) if path else default_path()
    try:
        values = parse(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{p}: no leasectl configuration (start the appliance with `cargo xtask run`, or pass an address and keys)"
        ) from None
    return Settings(
        path=p,
        addr=values.get("addr", DEFAULT_ADDR),
        tenant=values.get("tenant", "demo"),
        key=values.get("key"),
        admin_key=values.get("admin_key"),
        rdma_peer=values.get("rdma_peer", DEFAULT_RDMA_PEER),
    )
