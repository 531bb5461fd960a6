"""Adapters that plug a `leasebox.Store` into inference frameworks' KV-cache tiers, in pure Python. Loading one
imports no framework (LMCache, vLLM, SGLang need torch and CUDA); each uses the framework's base class when the
framework is installed, so the framework's loader accepts it (docs/kv.md, "Adapters"):

- `leasebox.adapters.lmcache_l2.LeaseboxL2Connector`: an LMCache `native_plugin` L2 connector;
- `leasebox.adapters.vllm_tier.LeaseboxSecondaryTier`: a vLLM `SecondaryTierManager` of the offloading
  connector's tiering spec;
- `leasebox.adapters.sglang_hicache.LeaseboxHiCacheStorage`: an SGLang HiCache storage backend loaded as
  `dynamic`.

Install with the package's extras of the same names (`pip install 'leasebox[lmcache]'`, `[vllm]`, `[sglang]`),
which bring the framework along; the adapters themselves are in every install.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LeaseboxL2Connector", "LeaseboxSecondaryTier", "LeaseboxHiCacheStorage"]

_WHERE = {
    "LeaseboxL2Connector": "lmcache_l2",
    "LeaseboxSecondaryTier": "vllm_tier",
    "LeaseboxHiCacheStorage": "sglang_hicache",
}


def __getattr__(name: str) -> Any:
    # Each adapter's module is imported when its class is first asked for: it looks for its framework then.
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
