"""leasectl's configuration file, as `cargo xtask run` writes it (app/leasectl/src/config.rs, which owns the
format): `key = value` lines, `#` comments. Default path: `$LEASECTL_CONFIG`, else
`$XDG_CONFIG_HOME/leasebox/leasectl.conf`, else `$HOME/.config/leasebox/leasectl.conf`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

#: Where the appliance's RoCEv2 responder listens when the file names none (the device model's UDP socket).
DEFAULT_RDMA_PEER = "127.0.0.1:4791"
DEFAULT_ADDR = "127.0.0.1:7470"


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
