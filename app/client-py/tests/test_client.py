"""The Python binding against a hosted appliance with the device model (conftest.py starts it): connect, alloc,
write/read bytes, bytearray and memoryview, batches, range checks, a revoke by the admin (the next call raises
LeaseRevoked), a cut control connection (the client reconnects and the lease goes on), bad credentials. The data
path (registered memory, zero copy, batches, asyncio) is test_data_path.py."""

from __future__ import annotations

import json
import os
import threading

import pytest

import leasebox
from conftest import b64, wait_event

MIB = 1 << 20


def pattern(seed: int, n: int) -> bytes:
    return bytes((i * 31 + seed * 7 + (i >> 8)) & 0xFF for i in range(n))


def test_connect_alloc_write_read_bytes(appliance):
    with appliance.tenant() as c:
        assert c.appliances == [appliance.addr]
        free = c.free_bytes()
        lease = c.alloc(2 * MIB)
        assert lease.size >= 2 * MIB and len(lease) == lease.size
        slot_gen, boot = lease.id.split("@")
        assert len(boot) == 32 and boot != "0" * 32 and slot_gen.count(".") == 1
        assert lease.appliance == appliance.addr
        assert c.free_bytes() <= free - 2 * MIB
        data = pattern(1, 10_000)
        lease.write(12_345, data)
        assert lease.read(12_345, len(data)) == data
        # A large write crosses many packets and work requests.
        big = os.urandom(MIB)
        lease.write(MIB, big)
        assert lease.read(MIB, MIB) == big
        assert lease.revoked is None
        assert lease.free() == "TornDown"
        with pytest.raises(leasebox.Closed):
            lease.read(0, 1)


def test_memoryview_and_bytearray_in_and_out(appliance):
    with appliance.tenant() as c, c.alloc(MIB) as lease:
        src = bytearray(pattern(2, 8192))
        lease.write(0, src)
        view = memoryview(src)[4096:]
        lease.write(65536, view)
        out = bytearray(8192)
        lease.read_into(0, out)
        assert out == src
        target = bytearray(b"\xee" * 8192)
        lease.read_into(65536, memoryview(target)[:4096])
        assert bytes(target[:4096]) == bytes(view) and target[4096:] == b"\xee" * 4096
        with pytest.raises(TypeError):
            lease.read_into(0, b"read-only bytes")


def test_batches_and_range_checks(appliance):
    with appliance.tenant() as c, c.alloc(MIB) as lease:
        blocks = [(i * 4096, pattern(i, 4096)) for i in range(40)]
        lease.write_many(blocks)
        back = lease.read_many([(off, 4096) for off, _ in blocks])
        assert back == [d for _, d in blocks]
        with pytest.raises(leasebox.OutOfRange):
            lease.write(lease.size - 1, b"ab")
        with pytest.raises(leasebox.OutOfRange):
            lease.read(lease.size, 1)
        # Nothing was sent: the lease still works.
        assert lease.read(0, 4096) == blocks[0][1]


def test_admin_revoke_makes_the_next_call_raise_lease_revoked(appliance):
    seen = []
    with appliance.tenant(on_event=seen.append) as c, appliance.admin() as admin:
        lease = c.alloc(MIB)
        lease.write(0, b"x" * 64)
        with pytest.raises(ValueError):
            admin.revoke("1.2")  # no boot id: not a lease id
        assert admin.revoke(lease.id) == "TornDown"
        with pytest.raises(leasebox.LeaseRevoked) as e:
            lease.write(0, b"y" * 64)
        assert "revoked" in str(e.value).lower()
        assert lease.revoked in ("TornDown", "NotFound")
        # From then on every call raises the same, without the network.
        with pytest.raises(leasebox.LeaseRevoked):
            lease.read(0, 8)
        ev = wait_event(c, "revoked", 5)
        assert ev is not None and ev.lease == lease.id and ev.appliance == appliance.addr
        assert any(x.kind == "revoked" and x.lease == lease.id for x in seen)
        with pytest.raises(leasebox.LeaseRevoked):
            lease.free()
        # The client goes on: a new lease works.
        with c.alloc(MIB) as again:
            again.write(0, b"after")
            assert again.read(0, 5) == b"after"


def test_a_cut_connection_is_reconnected_and_the_lease_goes_on(appliance, proxy):
    with appliance.tenant(addr=proxy.addr) as c:
        lease = c.alloc(MIB)
        lease.write(0, b"before the break")
        proxy.kill()
        assert wait_event(c, "disconnected", 15) is not None
        ev = wait_event(c, "reconnected", 15)
        assert ev is not None and ev.session_id and ev.appliance == proxy.addr
        # The reconnect went through the proxy. Not exactly one more connection: while a connection is not
        # answered the client opens a fresh one beside it every 50 ms (docs/client.md, "Concepts"), so an
        # appliance slow to answer (the QEMU one under TCG, or any on a loaded host) sees several.
        assert proxy.accepted >= 2
        assert lease.read(0, 16) == b"before the break"
        with c.alloc(MIB) as l2:
            l2.write(0, b"new session")
            assert l2.read(0, 11) == b"new session"
        assert lease.free() == "TornDown"


def test_threads_share_a_client(appliance):
    with appliance.tenant() as c, c.alloc(4 * MIB) as lease:
        errors = []

        def worker(k: int) -> None:
            try:
                for j in range(10):
                    off = (k * 10 + j) * 8192
                    d = pattern(k * 100 + j, 8192)
                    lease.write(off, d)
                    assert lease.read(off, 8192) == d
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert errors == []


def test_bad_credentials_and_arguments(appliance):
    with pytest.raises(leasebox.AuthError):
        wrong = "5f0e1d2c3b4a69788796a5b4c3d2e1f0"
        leasebox.Client(appliance.addr, "demo", wrong, rdma_peer=appliance.udp, timeout=5)
    # A key the appliance would refuse to load: refused here, in the appliance's words.
    with pytest.raises(leasebox.ConfigError, match="one byte repeated.*keys must be random"):
        leasebox.Client(appliance.addr, "demo", "00" * 32, rdma_peer=appliance.udp, timeout=5)
    with pytest.raises(leasebox.ConfigError, match="key is 4 bytes"):
        leasebox.Client.from_etcd("127.0.0.1:1", "demo", "00112233")
    with pytest.raises(leasebox.ConfigError):
        leasebox.Client(appliance.addr, "demo", "not hex")
    with pytest.raises(leasebox.ConfigError):
        leasebox.Client([], "demo", "00")
    with pytest.raises(leasebox.ConfigError):
        leasebox.Client(appliance.addr, "demo", appliance.tenant_key, rdma_peer="nowhere")
    with appliance.tenant() as c:
        with pytest.raises(leasebox.ConfigError):
            c.alloc(0)
    with pytest.raises(leasebox.Closed):
        c.alloc(4096)


@pytest.mark.hosted
def test_config_file_is_read_as_xtask_writes_it(tmp_path, appliance):
    f = tmp_path / "leasectl.conf"
    f.write_text(
        "# written by `cargo xtask run`\n"
        f"addr = {appliance.addr}\ntenant = demo\nkey = {appliance.tenant_key}\n"
        f"admin_key = {appliance.admin_key}\nrdma_peer = {appliance.udp}\n"
    )
    s = leasebox.config.load(str(f))
    assert (s.addr, s.tenant, s.rdma_peer) == (appliance.addr, "demo", appliance.udp)
    with leasebox.connect_from_config(str(f)) as c, c.alloc(4096) as lease:
        lease.write(0, b"cfg")
        assert lease.read(0, 3) == b"cfg"
    with leasebox.connect_from_config(str(f), admin=True) as a:
        assert a.free_bytes() > 0


EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "example_kv_spill.py")


def run_example(args, env=None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, EXAMPLE] + args, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.hosted
def test_example_spills_and_reloads_blocks_with_flags(appliance):
    r = run_example(["--addr", appliance.addr, "--key", appliance.tenant_key, "--rdma-peer", appliance.udp])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "into 2 leases" in r.stdout and " 0 different" in r.stdout, r.stdout


@pytest.mark.hosted
def test_example_needs_no_flags_with_the_config_file_xtask_run_writes(tmp_path, appliance):
    f = tmp_path / "leasectl.conf"
    f.write_text(f"addr = {appliance.addr}\ntenant = demo\nkey = {appliance.tenant_key}\nrdma_peer = {appliance.udp}\n")
    env = dict(os.environ, LEASECTL_CONFIG=str(f))
    r = run_example(["--sequences", "3", "--block-size", "4096", "--lease-size", str(MIB)], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "evicted" in r.stdout and " 0 different" in r.stdout, r.stdout
    # No configuration at all: a clear message and exit status 2.
    r = run_example([], env=dict(os.environ, LEASECTL_CONFIG=str(tmp_path / "missing.conf")))
    assert r.returncode == 2 and "cannot connect" in r.stderr, r.stderr


def advertise(etcd, appliance, boot: str) -> None:
    """The appliance's advertisement as the registrar writes it (docs/fleet.md, "The key")."""
    ad = {"boot_id": boot, "control": appliance.addr, "rdma": appliance.udp, "free_bytes": 64 * MIB,
          "leased_bytes": 0, "health": "ok", "hca": "ok", "labels": {}, "registrar": "pytest"}
    etcd.put(f"/leasebox/v1/appliances/{boot}", json.dumps(ad))


@pytest.mark.hosted
def test_from_etcd_places_on_the_advertised_appliance(appliance, etcd):
    # No appliance advertised yet: NoMemory once the timeout has passed.
    with pytest.raises(leasebox.NoMemory):
        leasebox.Client.from_etcd(etcd.endpoint, "demo", appliance.tenant_key, timeout=0.5)
    advertise(etcd, appliance, "ab" * 16)
    with leasebox.Client.from_etcd([etcd.endpoint], "demo", appliance.tenant_key, timeout=5) as c:
        assert c.appliances == [appliance.addr]
        lease = c.alloc(MIB)
        assert lease.appliance == appliance.addr
        lease.write(0, b"via etcd")
        assert lease.read(0, 8) == b"via etcd"
        assert lease.free() == "TornDown"
    with pytest.raises(leasebox.ConfigError):
        leasebox.Client.from_etcd("no-port", "demo", appliance.tenant_key)
    # TLS options are checked before anything connects.
    with pytest.raises(leasebox.ConfigError, match="etcd_cacert"):
        leasebox.Client.from_etcd(f"https://{etcd.endpoint}", "demo", appliance.tenant_key)
    with pytest.raises(leasebox.ConfigError, match="etcd_cacert"):
        leasebox.Client.from_etcd(etcd.endpoint, "demo", appliance.tenant_key, etcd_cert="c.pem", etcd_key="k.pem")
    with pytest.raises(leasebox.ConfigError, match="/nonexistent/ca.pem"):
        leasebox.Client.from_etcd(etcd.endpoint, "demo", appliance.tenant_key, etcd_cacert="/nonexistent/ca.pem")


@pytest.mark.hosted
def test_from_etcd_as_an_etcd_user(appliance, etcd):
    advertise(etcd, appliance, "cd" * 16)
    # etcd's authentication on: root, and a user whose role may only read the advertisements.
    etcd.call("auth/user/add", {"name": "root", "password": "root-pw"})
    etcd.call("auth/user/grant", {"user": "root", "role": "root"})
    etcd.call("auth/role/add", {"name": "reader"})
    perm = {"permType": "READ", "key": b64("/leasebox/v1/"), "range_end": b64("/leasebox/v10")}
    etcd.call("auth/role/grant", {"name": "reader", "perm": perm})
    etcd.call("auth/user/add", {"name": "reader", "password": "reader-pw"})
    etcd.call("auth/user/grant", {"user": "reader", "role": "reader"})
    etcd.call("auth/enable", {})
    with leasebox.Client.from_etcd(etcd.endpoint, "demo", appliance.tenant_key, timeout=5,
                                   etcd_user="reader", etcd_password="reader-pw") as c:
        lease = c.alloc(MIB)
        lease.write(0, b"as a user")
        assert lease.read(0, 9) == b"as a user"
        assert lease.free() == "TornDown"
    with pytest.raises(leasebox.LeaseboxError, match="authenticating as etcd user 'reader'"):
        leasebox.Client.from_etcd(etcd.endpoint, "demo", appliance.tenant_key, timeout=2,
                                  etcd_user="reader", etcd_password="wrong")
    with pytest.raises(leasebox.ConfigError, match="go together"):
        leasebox.Client.from_etcd(etcd.endpoint, "demo", appliance.tenant_key, etcd_user="reader")


@pytest.mark.hosted
def test_from_etcd_over_tls_with_a_client_certificate(appliance, etcd_tls):
    advertise(etcd_tls, appliance, "ef" * 16)
    https = f"https://{etcd_tls.endpoint}"
    with leasebox.Client.from_etcd(https, "demo", appliance.tenant_key, timeout=5, etcd_cacert=etcd_tls.ca,
                                   etcd_cert=etcd_tls.cert, etcd_key=etcd_tls.key) as c:
        lease = c.alloc(MIB)
        lease.write(0, b"over TLS")
        assert lease.read(0, 8) == b"over TLS"
        assert lease.free() == "TornDown"
    # The CA alone: etcd wants a client certificate, and the error says so.
    with pytest.raises(leasebox.LeaseboxError, match="wants a client certificate"):
        leasebox.Client.from_etcd(https, "demo", appliance.tenant_key, timeout=2, etcd_cacert=etcd_tls.ca)
