"""Spill KV-cache blocks to a Leasebox appliance and bring them back.

An LLM server keeps attention KV caches in fixed-size blocks; when GPU/host memory runs short, cold blocks are
spilled to remote DRAM and loaded again when their sequence comes back. Each lease costs the appliance an RDMA
queue pair, so this spiller takes a few large leases and keeps its own block index (block key -> lease, offset)
with a free list of slots, instead of one lease per block.

    python example_kv_spill.py            # against `cargo xtask run` (reads the leasectl configuration it wrote)
    python example_kv_spill.py --addr 127.0.0.1:7470 --key HEX --rdma-peer 127.0.0.1:4791

It spills every block of a few sequences in batches, evicts one sequence and reuses its slots for another, then
loads everything back and checks each block's digest. Exit status 0 when every block came back identical, 1 on a
mismatch, 2 when the appliance could not be used.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from typing import Dict, List, Optional, Tuple

import leasebox

BlockKey = Tuple[int, int, int]  # (sequence, layer, block number)


class KVSpill:
    """Fixed-size block slots in a few large leases, with a block index on the client side."""

    def __init__(self, client: leasebox.Client, block_size: int, lease_size: int, leases: int) -> None:
        self.block_size = block_size
        self.leases: List[Optional[leasebox.Lease]] = [client.alloc(lease_size) for _ in range(leases)]
        self.slots_per_lease = lease_size // block_size
        self.free: List[Tuple[int, int]] = [
            (i, k * block_size) for k in range(self.slots_per_lease) for i in range(leases)
        ]
        self.free.reverse()  # pop() hands out slots striped over the leases
        self.index: Dict[BlockKey, Tuple[int, int]] = {}

    @property
    def capacity(self) -> int:
        return self.slots_per_lease * len(self.leases)

    def spill(self, blocks: Dict[BlockKey, bytes]) -> None:
        """Stores blocks, one batched write per lease."""
        per_lease: Dict[int, List[Tuple[int, bytes]]] = {}
        for key, data in blocks.items():
            if len(data) != self.block_size:
                raise ValueError(f"block {key} has {len(data)} bytes, not {self.block_size}")
            if key in self.index:
                slot = self.index[key]
            else:
                if not self.free:
                    raise MemoryError("no free block slot: evict first or allocate another lease")
                slot = self.free.pop()
                self.index[key] = slot
            per_lease.setdefault(slot[0], []).append((slot[1], data))
        for i, items in per_lease.items():
            self._lease(i).write_many(items)

    def load(self, keys: List[BlockKey]) -> Dict[BlockKey, bytes]:
        """Loads blocks, one batched read per lease."""
        per_lease: Dict[int, List[BlockKey]] = {}
        for key in keys:
            per_lease.setdefault(self.index[key][0], []).append(key)
        out: Dict[BlockKey, bytes] = {}
        for i, ks in per_lease.items():
            datas = self._lease(i).read_many([(self.index[k][1], self.block_size) for k in ks])
            out.update(zip(ks, datas))
        return out

    def evict(self, keys: List[BlockKey]) -> None:
        for key in keys:
            self.free.append(self.index.pop(key))

    def _lease(self, i: int) -> leasebox.Lease:
        lease = self.leases[i]
        if lease is None:
            raise leasebox.LeaseRevoked(f"lease {i} was revoked earlier")
        return lease

    def forget_lease(self, i: int) -> List[BlockKey]:
        """After a revoke: the lease's blocks are gone (a KV cache recomputes them); returns their keys."""
        lost = [k for k, (li, _) in self.index.items() if li == i]
        for k in lost:
            del self.index[k]
        self.free = [s for s in self.free if s[0] != i]
        self.leases[i] = None
        return lost

    def close(self) -> None:
        for lease in self.leases:
            if lease is not None:
                try:
                    lease.free()
                except leasebox.LeaseRevoked:
                    pass


def block(key: BlockKey, size: int) -> bytes:
    """Deterministic stand-in for a KV block's contents."""
    seed = hashlib.sha256(repr(key).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="leasectl configuration file (default: where `cargo xtask run` writes it)")
    p.add_argument("--addr", help="appliance control address HOST:PORT (instead of the configuration file)")
    p.add_argument("--tenant", default="demo")
    p.add_argument("--key", help="the tenant's key in hex (with --addr)")
    p.add_argument("--rdma-peer", help="the appliance's RoCEv2 UDP address (default 127.0.0.1:4791)")
    p.add_argument("--block-size", type=int, default=16 << 10)
    p.add_argument("--lease-size", type=int, default=4 << 20)
    p.add_argument("--leases", type=int, default=2)
    p.add_argument("--sequences", type=int, default=6)
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args(argv)

    try:
        if a.addr:
            if not a.key:
                p.error("--addr needs --key")
            client = leasebox.Client(a.addr, a.tenant, a.key, rdma_peer=a.rdma_peer)
        else:
            client = leasebox.connect_from_config(a.config)
    except (leasebox.LeaseboxError, FileNotFoundError) as e:
        print(f"example_kv_spill: cannot connect: {e}", file=sys.stderr)
        return 2

    with client:
        spill = KVSpill(client, a.block_size, a.lease_size, a.leases)
        # Blocks per (sequence, layer) so that all sequences fill the leases; one sequence more than fits.
        per_seq_layer = max(1, spill.capacity // (a.sequences * a.layers))
        seqs = list(range(a.sequences))
        keys = {s: [(s, l, b) for l in range(a.layers) for b in range(per_seq_layer)] for s in seqs + [a.sequences]}
        t0 = time.monotonic()
        moved = 0
        try:
            for s in seqs:
                spill.spill({k: block(k, a.block_size) for k in keys[s]})
                moved += len(keys[s])
            # Sequence 0 finished: its slots go to a new sequence.
            spill.evict(keys[0])
            spill.spill({k: block(k, a.block_size) for k in keys[a.sequences]})
            moved += len(keys[a.sequences])
            live = [k for s in seqs[1:] + [a.sequences] for k in keys[s]]
            back = spill.load(live)
        except leasebox.LeaseRevoked as e:
            print(f"example_kv_spill: a lease was revoked ({e}); its blocks must be recomputed", file=sys.stderr)
            return 2
        finally:
            spill.close()
        secs = time.monotonic() - t0
        bad = [k for k in live if back[k] != block(k, a.block_size)]
        total = (moved + len(live)) * a.block_size
        print(
            f"spilled {moved} blocks of {a.block_size} bytes into {a.leases} leases of {a.lease_size} bytes "
            f"({spill.capacity} slots, index on the client), evicted {len(keys[0])}, reloaded {len(live)}: "
            f"{len(live) - len(bad)} identical, {len(bad)} different; {total / secs / 1e6:.1f} MB/s"
        )
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
