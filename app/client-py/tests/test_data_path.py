"""The data path from Python (docs/client.md, "The Python data path"): registered memory (bytearray, memoryview, mmap, an array
of another item type, numpy when it is installed, foreign memory by address), zero copy both ways with nothing
copied, scatter/gather, a 64-deep asynchronous batch across two leases with the completion fd, asyncio, a region
in use that cannot be closed under the NIC, a lease revoked mid-batch failing only its own operations (both
teardown orders, learned by the notice and, with notices withheld, by a failed completion), and the requester
chosen at run time, and threads sharing regions while batches run."""

from __future__ import annotations

import array
import asyncio
import gc
import mmap
import os
import select
import signal
import subprocess
import sys
import time
import weakref

import pytest

import leasebox
from conftest import start_appliance, wait_event
from leasebox import Op

MIB = 1 << 20


def pattern(seed: int, n: int) -> bytes:
    return bytes((i * 31 + seed * 7 + (i >> 8)) & 0xFF for i in range(n))


@pytest.fixture(scope="module")
def quiet_appliance():
    """A hosted appliance that withholds Revoked notices (`revoke_notices=off`): clients learn of a revoke from a
    failed completion and QUERY."""
    a = start_appliance(["revoke_notices=off"])
    yield a
    a.stop()


def test_register_writable_buffers_and_keep_them_alive(appliance):
    with appliance.tenant() as c, c.alloc(MIB) as lease:
        data = pattern(1, 8192)
        # bytearray, a memoryview slice of one, an anonymous mmap, an array of 4-byte items.
        targets = [bytearray(8192), memoryview(bytearray(16384))[4096:12288], mmap.mmap(-1, 8192),
                   array.array("i", bytes(8192))]
        for k, t in enumerate(targets):
            src = bytearray(pattern(k, 8192))
            with c.register(src) as rs, c.register(t) as rt:
                assert len(rt) == rt.length == 8192 and rt.address != 0 and not rt.closed
                lease.write_from(rs, 0, k * 8192, 8192)
                lease.read_into(rt, 0, k * 8192, 8192)
            assert rt.closed and rt.obj is None
            assert bytes(memoryview(t).cast("B")) == bytes(src), type(t)
        # While registered the memory cannot move or go: a bytearray cannot be resized, an mmap cannot be closed.
        grow, m = bytearray(4096), mmap.mmap(-1, 4096)
        rg, rm = c.register(grow), c.register(m)
        with pytest.raises(BufferError):
            grow.extend(b"more")
        with pytest.raises(BufferError):
            m.close()
        rg.close()
        rm.close()
        rm.close()  # idempotent
        grow.extend(b"more")
        m.close()
        # The region holds the object: dropped by the caller, it lives until the region is closed.
        a = array.array("B", data)
        w = weakref.ref(a)
        r = c.register(a)
        del a
        gc.collect()
        assert w() is not None and r.obj is w()
        lease.write_from(r, 0, 0, 8192)
        assert lease.read(0, 8192) == data
        r.close()
        gc.collect()
        assert w() is None
        # Bad buffers: read-only, not contiguous, empty.
        with pytest.raises(TypeError):
            c.register(b"read-only bytes")
        with pytest.raises(TypeError):
            c.register(memoryview(bytearray(64))[::2])
        with pytest.raises(leasebox.ConfigError):
            c.register(bytearray())
        # A closed region is refused.
        with pytest.raises(leasebox.Closed):
            lease.write_from(r, 0, 0, 8)


def test_register_a_numpy_array_if_numpy_is_installed(appliance):
    np = pytest.importorskip("numpy")
    with appliance.tenant() as c, c.alloc(MIB) as lease:
        src = np.arange(4096, dtype=np.float32)
        dst = np.zeros((64, 64), dtype=np.float32)
        with c.register(src) as rs, c.register(dst) as rd:
            lease.write_from(rs, 0, 0, src.nbytes)
            lease.read_into(rd, 0, 0, dst.nbytes)
        assert (dst.reshape(-1) == src).all()
        with pytest.raises(TypeError):
            c.register(np.zeros((8, 8), dtype=np.uint8)[:, ::2])


def test_register_raw_foreign_memory(appliance):
    # Imported here: a minimal Python (the Soft-RoCE guest's) may lack libffi, and with it ctypes.
    ctypes = pytest.importorskip("ctypes")
    with appliance.tenant() as c, c.alloc(MIB) as lease:
        buf = ctypes.create_string_buffer(pattern(4, 4096), 4096)
        r = c.register_raw(ctypes.addressof(buf), 4096, owner=buf)
        assert r.obj is buf and r.address == ctypes.addressof(buf)
        lease.write_from(r, 0, 4096, 4096)
        assert lease.read(4096, 4096) == pattern(4, 4096)
        lease.write(0, b"\x5a" * 4096)
        lease.read_into(r, 0, 0, 4096)
        assert buf.raw == b"\x5a" * 4096
        r.close()
        with pytest.raises(leasebox.ConfigError):
            c.register_raw(0, 4096)
        with pytest.raises(leasebox.ConfigError):
            c.register_raw(ctypes.addressof(buf), 0)


def test_zero_copy_both_ways_copies_nothing(appliance):
    with appliance.tenant() as c, c.alloc(4 * MIB) as lease:
        src, dst = bytearray(pattern(3, MIB)), bytearray(MIB)
        with c.register(src) as rs, c.register(dst) as rd:
            lease.write_from(rs, 0, 0, MIB)
            lease.write_from(rs, 4096, 2 * MIB, 8192)
            lease.read_into(rd, 0, 0, MIB)
            assert dst == src
            lease.read_into(rd, 100, 2 * MIB, 8192)
            assert dst[100:8292] == src[4096:12288]
            # Scatter/gather, up to max_sge pieces.
            n = lease.max_sge
            assert n >= 2
            gather = [(rs, i * 1000, 500) for i in range(n)]
            lease.write_from_sg(gather, 3 * MIB)
            want = b"".join(bytes(src[i * 1000:i * 1000 + 500]) for i in range(n))
            scatter = [(rd, MIB - (i + 1) * 600, 500) for i in range(n)]
            lease.read_into_sg(scatter, 3 * MIB)
            assert b"".join(bytes(dst[o:o + k]) for _, o, k in scatter) == want
            assert c.bytes_copied == 0
            with pytest.raises(leasebox.LeaseboxError):
                lease.write_from_sg(gather + [(rs, 0, 1)], 3 * MIB)
            with pytest.raises(leasebox.OutOfRange):
                lease.read_into(rd, 0, lease.size - 1, 2)
            with pytest.raises(leasebox.LeaseboxError):
                lease.write_from(rs, MIB - 10, 0, 20)  # past the region's end
            with pytest.raises(TypeError):
                lease.read_into(rd, 0, 0)
            with pytest.raises(TypeError):
                lease.write_from_sg([(src, 0, 1)], 0)
            assert c.bytes_copied == 0
            # The copying calls count what they copy.
            assert lease.read(3 * MIB, len(want)) == want
            assert c.bytes_copied >= len(want)


def test_queue_depth_is_configurable(appliance):
    with appliance.tenant() as c, c.alloc(MIB) as lease:
        assert lease.queue_depth == 64
        lease.queue_depth = 3
        assert lease.queue_depth == 3
        with pytest.raises(ValueError):
            lease.queue_depth = 0
    with appliance.tenant(queue_depth=8) as c, c.alloc(MIB) as lease:
        assert lease.queue_depth == 8
    with pytest.raises(leasebox.ConfigError):
        appliance.tenant(queue_depth=0)


def test_a_64_deep_batch_across_two_leases_with_the_completion_fd(appliance):
    block = 16384
    with appliance.tenant() as c:
        a, b = c.alloc(2 * MIB), c.alloc(2 * MIB)
        src, dst = bytearray(pattern(9, 64 * block)), bytearray(64 * block)
        rs, rd = c.register(src), c.register(dst)
        fd = c.fileno()
        assert select.select([fd], [], [], 0)[0] == []
        writes = [Op.write_from((a, b)[i % 2], rs, i * block, (i // 2) * block, block) for i in range(64)]
        assert len(writes[0]) == block
        tickets = c.submit(writes)
        assert len(set(tickets)) == 64 and tickets == sorted(tickets, key=int)
        got = {}
        while len(got) < 64:
            assert select.select([fd], [], [], 20)[0] == [fd], f"{len(got)} of 64 results after 20 s"
            for done in c.poll():
                assert done.ticket not in got
                got[done.ticket] = done
        assert select.select([fd], [], [], 0)[0] == [], "the fd stays readable with no result waiting"
        assert all(got[t].ok and got[t].status == "ok" and got[t].result() == block for t in tickets)
        reads = [Op.read_into((a, b)[i % 2], rd, i * block, (i // 2) * block, block) for i in range(64)]
        t2 = c.submit(reads)
        first = c.wait(t2[0], timeout=20)
        assert [x.ticket for x in first] == [t2[0]] and first[0].length == block
        rest = c.wait(timeout=30)
        assert sorted(int(x.ticket) for x in rest) == sorted(int(t) for t in t2[1:])
        assert all(x.ok for x in rest)
        assert dst == src
        assert c.bytes_copied == 0
        with pytest.raises(leasebox.ConfigError):
            c.wait(t2[0], timeout=1)  # taken already
        assert c.wait(timeout=0) == [] and c.poll() == []
        # An op whose range is refused fails alone.
        t3 = c.submit([Op.write_from(a, rs, 0, a.size, 8), Op.write_from(b, rs, 0, 0, 8)])
        r = {x.ticket: x for x in c.wait(timeout=10)}
        assert r[t3[0]].status == "out_of_range" and isinstance(r[t3[0]].error, leasebox.OutOfRange)
        with pytest.raises(leasebox.OutOfRange):
            r[t3[0]].result()
        assert r[t3[1]].ok
        # A freed lease or a closed region is refused before anything starts.
        rd.close()
        with pytest.raises(leasebox.Closed):
            c.submit([Op.write_from(a, rs, 0, 0, 8), Op.read_into(b, rd, 0, 0, 8)])
        a.free()
        with pytest.raises(leasebox.Closed):
            c.submit([Op.write_from(a, rs, 0, 0, 8)])
        assert c.poll() == []


def test_asyncio_awaits_completions_through_the_fd(appliance):
    async def main(c, leases, rs, rd):
        # Nothing submitted: the awaitable waits (the loop runs on) until cancelled.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.completions(), 0.2)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        tick = asyncio.ensure_future(ticker())
        results = {}
        for rnd, (region, op) in enumerate([(rs, Op.write_from), (rd, Op.read_into)]):
            tickets = c.submit([op(leases[i % 2], region, i * 4096, (i // 2) * 4096, 4096) for i in range(64)])
            got = {}
            while len(got) < 64:
                for d in await c.completions():
                    got[d.ticket] = d
            assert set(got) == set(tickets)
            results[rnd] = got
        tick.cancel()
        return results, ticks

    with appliance.tenant() as c:
        leases = [c.alloc(MIB), c.alloc(MIB)]
        src, dst = bytearray(pattern(5, 64 * 4096)), bytearray(64 * 4096)
        with c.register(src) as rs, c.register(dst) as rd:
            results, ticks = asyncio.run(main(c, leases, rs, rd))
        assert all(d.ok and d.length == 4096 for got in results.values() for d in got.values())
        assert dst == src
        assert ticks > 0


@pytest.mark.hosted
def test_closing_a_region_in_use_waits_for_its_transfer(appliance):
    """The appliance's process is stopped, so a READ into the region cannot finish: close(timeout) refuses and
    the region stays registered (its object's export held); once the appliance runs again close() waits for the
    READ, and when it returns the result is in and the memory is the program's."""
    with appliance.tenant() as c, c.alloc(4 * MIB) as lease:
        data = pattern(61, 2 * MIB)
        lease.write(0, data)
        buf = bytearray(2 * MIB)
        region = c.register(buf)
        os.kill(appliance.proc.pid, signal.SIGSTOP)
        try:
            [t] = c.submit([Op.read_into(lease, region, 0, 0, len(buf))])
            assert region.in_use
            with pytest.raises(leasebox.LeaseboxTimeout):
                region.close(timeout=0.05)
            assert not region.closed and region.obj is buf
            with pytest.raises(BufferError):
                buf.append(0)
        finally:
            os.kill(appliance.proc.pid, signal.SIGCONT)
        region.close()
        assert region.closed and not region.in_use
        [done] = c.poll()
        assert done.ticket == t and done.ok and done.length == len(buf)
        assert bytes(buf) == data
        buf.append(0)


def alloc_when_free(client, size: int, within: float = 20.0):
    """A lease of `size` bytes, waiting for the memory of leases revoked by earlier tests to come back (an
    appliance's pool is small and a revoked lease's memory is cleared before it is lent again)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return client.alloc(size)
        except leasebox.NoMemory:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def revoke_mid_batch(client, admin, qp_first: bool) -> None:
    """A batch over two leases; the first is revoked by the admin (teardown order `qp_first`) while its writes
    are in flight: they fail with a revoke error carrying the outcome, each on its own; the other lease's all
    complete and its data is there."""
    doomed, kept = alloc_when_free(client, 8 * MIB), alloc_when_free(client, MIB)
    # One write at a time on the doomed lease, and many of them (its 32 slots written over and over: 64 MiB),
    # so that much of its batch is still to come when the revoke lands however fast the writes go (with 32
    # writes, all but one had landed before the revoke on a quiet host).
    doomed.queue_depth = 1
    piece = MIB // 4
    rounds = 256
    src = bytearray(pattern(51, piece))
    rs = client.register(src)
    ops = []
    for i in range(rounds):
        ops.append(Op.write_from(doomed, rs, 0, (i % 32) * piece, piece))
        if i < 32:
            ops.append(Op.write_from(kept, rs, i * 4096, i * 4096, 4096))
    tickets = client.submit(ops)
    doomed_t = [t for i, t in enumerate(tickets) if i >= 64 or i % 2 == 0]
    kept_t = [t for i, t in enumerate(tickets) if i < 64 and i % 2 == 1]
    first = client.wait(doomed_t[0], timeout=20)
    assert first[0].ok and first[0].length == piece
    assert admin.revoke(doomed.id, qp_first=qp_first) == "TornDown"
    done = {d.ticket: d for d in client.wait(timeout=60)}
    assert len(done) == len(tickets) - 1
    for t in kept_t:
        assert done[t].ok and done[t].length == 4096, done[t]
    revoked = 0
    for i, t in enumerate(doomed_t[1:], 1):
        d = done[t]
        if not d.ok:
            assert d.status == "revoked", (i, d, d.error)
            assert isinstance(d.error, leasebox.LeaseRevoked)
            assert d.outcome in ("TornDown", "NotFound") and d.error.outcome == d.outcome
            assert d.error.lease == doomed.id
            with pytest.raises(leasebox.LeaseRevoked):
                d.result()
            revoked += 1
        else:
            # Landed before the revoke: every write after a revoked one is revoked too (one lease's work goes
            # in order).
            assert revoked == 0, (i, d)
            assert d.length == piece
    later = len(doomed_t) - 1
    print(f"{revoked} of the doomed lease's {later} later writes failed revoked, the rest had landed")
    assert revoked >= 8, f"only {revoked} of the doomed lease's {later} later writes were revoked"
    assert doomed.revoked in ("TornDown", "NotFound")
    assert kept.read(0, 32 * 4096) == bytes(src[:32 * 4096])
    # After the batch: the doomed lease refuses at once, the kept one works on.
    t = client.submit([Op.write_from(doomed, rs, 0, 0, 8), Op.write_from(kept, rs, 0, 0, 8)])
    r = {d.ticket: d for d in client.wait(timeout=10)}
    assert r[t[0]].status == "revoked" and r[t[1]].ok
    rs.close()
    kept.free()


ORDERS = [pytest.param(False, id="mkey_first"), pytest.param(True, id="qp_first")]


@pytest.mark.parametrize("qp_first", ORDERS)
def test_a_revoke_mid_batch_fails_only_its_lease_learned_by_the_notice(appliance, qp_first):
    seen = []
    with appliance.tenant(on_event=seen.append) as c, appliance.admin() as admin:
        revoke_mid_batch(c, admin, qp_first)
        time.sleep(0.1)
        assert [e.kind for e in seen].count("revoked") == 1, seen


@pytest.mark.hosted
@pytest.mark.parametrize("qp_first", ORDERS)
def test_a_revoke_mid_batch_fails_only_its_lease_with_notices_withheld(quiet_appliance, qp_first):
    seen = []
    with quiet_appliance.tenant(on_event=seen.append) as c, quiet_appliance.admin() as admin:
        revoke_mid_batch(c, admin, qp_first)
        time.sleep(0.1)
        assert [e.kind for e in seen].count("revoked") == 1, seen


@pytest.mark.parametrize("qp_first", ORDERS)
def test_an_idle_lease_learns_of_its_revoke_by_the_notice(appliance, qp_first):
    """With notices the client knows before it tries anything: the event comes and the lease refuses at once."""
    with appliance.tenant() as c, appliance.admin() as admin:
        lease = c.alloc(MIB)
        src = bytearray(64)
        rs = c.register(src)
        assert admin.revoke(lease.id, qp_first=qp_first) == "TornDown"
        ev = wait_event(c, "revoked", 10)
        assert ev is not None and ev.lease == lease.id and ev.outcome == "TornDown"
        assert lease.revoked == "TornDown"
        [t] = c.submit([Op.write_from(lease, rs, 0, 0, 64)])
        [d] = c.wait(t, timeout=1)
        assert d.status == "revoked" and d.outcome == "TornDown"


@pytest.mark.hosted
@pytest.mark.parametrize("qp_first", ORDERS)
def test_an_idle_lease_learns_of_its_revoke_from_a_failed_completion_with_notices_withheld(
    quiet_appliance, qp_first
):
    """Without the notice the client does not know until an operation fails (the MKEY gone: a NAK; the QP in
    error: retries run out); then QUERY says the lease is gone, the operation fails revoked and the event comes."""
    with quiet_appliance.tenant() as c, quiet_appliance.admin() as admin:
        lease = c.alloc(MIB)
        rs = c.register(bytearray(64))
        assert admin.revoke(lease.id, qp_first=qp_first) == "TornDown"
        assert wait_event(c, "revoked", 1) is None
        assert lease.revoked is None
        [t] = c.submit([Op.write_from(lease, rs, 0, 0, 64)])
        [d] = c.wait(t, timeout=30)
        assert d.status == "revoked" and d.outcome in ("TornDown", "NotFound"), (d, d.error)
        assert lease.revoked == d.outcome
        ev = wait_event(c, "revoked", 5)
        assert ev is not None and ev.lease == lease.id


def test_the_requester_is_chosen_at_run_time(appliance):
    cfg = leasebox.config
    assert str(cfg.verbs("rxe0", 1, 1)) == "verbs:rxe0:1:1" and str(cfg.soft()) == "soft"
    assert cfg.requester("verbs:rxe0:1:3") == cfg.Verbs("rxe0", 1, 3)
    assert cfg.requester("soft:10.0.0.2:4791") == cfg.soft("10.0.0.2:4791")
    for bad in ["verbs:rxe0", "verbs:rxe0:x:1", "tcp:1.2.3.4"]:
        with pytest.raises(ValueError):
            cfg.requester(bad)
    key = appliance.tenant_key
    for bad in ["verbs:rxe0:0:1", "verbs::1:1", "soft:nowhere", "rdma"]:
        with pytest.raises(leasebox.ConfigError, match="requester"):
            leasebox.Client(appliance.addr, "demo", key, requester=bad)
    with pytest.raises(leasebox.ConfigError, match="3 requesters for 1"):
        leasebox.Client(appliance.addr, "demo", key, requester=[cfg.soft()] * 3)
    # Verbs on a device that does not exist: the client connects, the lease's requester fails, naming the device
    # (or, on a host with no RDMA device at all, saying so).
    with leasebox.Client(appliance.addr, appliance.tenant_name, key, requester=cfg.verbs("nosuchdev0", 1, 0)) as c:
        with pytest.raises(leasebox.RdmaError, match="nosuchdev0|no RDMA devices"):
            c.alloc(MIB)


@pytest.mark.hosted
def test_the_software_requester_by_name(appliance):
    with appliance.tenant(requester=leasebox.config.soft(appliance.udp)) as c, c.alloc(MIB) as lease:
        lease.write(0, b"soft by name")
        assert lease.read(0, 12) == b"soft by name"


def test_the_module_imports_and_names_the_package_without_libibverbs(appliance):
    """Without libibverbs (LEASEBOX_IBVERBS pointing nowhere) the module still imports and a verbs client fails
    with an error naming the package."""
    code = (
        "import leasebox, sys\n"
        f"c = leasebox.Client({appliance.addr!r}, {appliance.tenant_name!r}, {appliance.tenant_key!r}, "
        "requester='verbs:rxe0:1:1')\n"
        "try:\n    c.alloc(1 << 20)\nexcept leasebox.LeaseboxError as e:\n    print(type(e).__name__, e)\n"
    )
    env = dict(os.environ, LEASEBOX_IBVERBS="/nonexistent/libibverbs.so.1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "libibverbs" in r.stdout and "/nonexistent" in r.stdout, r.stdout


def test_threads_share_regions_while_batches_run(appliance):
    """Zero-copy calls from several threads on the same regions, beside batches submitted from another, all
    finish (each call read-locks the regions it names; only close takes them whole)."""
    import threading

    with appliance.tenant() as c:
        leases = [c.alloc(MIB), c.alloc(MIB)]
        src, dst = bytearray(pattern(8, 64 * 1024)), bytearray(64 * 1024)
        rs, rd = c.register(src), c.register(dst)
        errors = []

        def worker(k: int) -> None:
            try:
                for j in range(10):
                    off = (k * 10 + j) * 1024
                    leases[k % 2].write_from(rs, off, off, 1024)
                    leases[k % 2].read_into(rd, off, off, 1024)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for _ in range(5):
            tickets = c.submit([Op.write_from(leases[i % 2], rs, 0, 512 * 1024 + i * 1024, 1024) for i in range(16)])
            done = c.wait(timeout=30)
            assert {d.ticket for d in done} == set(tickets) and all(d.ok for d in done)
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads) and errors == []
        assert dst[:40 * 1024] == src[:40 * 1024]
        rs.close(timeout=5)
        rd.close(timeout=5)
