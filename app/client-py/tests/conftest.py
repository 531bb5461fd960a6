"""Fixtures: a hosted Leasebox appliance with the device model and its RDMA data path (`leasebox-hosted --hca
--udp`), started once per test module, and a TCP proxy in front of its control port that a test can cut.

The binary is `$LEASEBOX_HOSTED_BIN`, else `target/debug/leasebox-hosted` of this repository, built with
`cargo build -p leasebox-hosted` when missing (`cargo xtask test` builds it before running pytest).

Another appliance (a QEMU appliance reached from a Soft-RoCE guest) is chosen by environment variables; then no
hosted appliance is started, and tests marked `hosted` (they need what only a hosted appliance started here
gives: option words such as revoke_notices=off, stopping its process, etcd) are skipped:

    LEASEBOX_TEST_APPLIANCE=HOST:PORT      the control port
    LEASEBOX_TEST_TENANT=demo              the tenant's name (default demo)
    LEASEBOX_TEST_KEY=HEX                  the tenant's key
    LEASEBOX_TEST_ADMIN_KEY=HEX            the admin's key (revoke tests)
    LEASEBOX_TEST_RDMA_PEER=HOST:PORT      the software requester's peer (when the requester is soft)
    LEASEBOX_TEST_REQUESTER=verbs:rxe0:1:1 the requester of every client (soft, soft:HOST:PORT, verbs:DEV:PORT:GID;
                                           also with a hosted appliance)
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[3]
READY_WITHIN = 60.0


EXTERNAL = os.environ.get("LEASEBOX_TEST_APPLIANCE")
REQUESTER = os.environ.get("LEASEBOX_TEST_REQUESTER")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "hosted: needs the hosted appliance these fixtures start (skipped with LEASEBOX_TEST_APPLIANCE)"
    )


def pytest_collection_modifyitems(config, items) -> None:
    if not EXTERNAL:
        return
    skip = pytest.mark.skip(reason=f"needs a hosted appliance started here (LEASEBOX_TEST_APPLIANCE={EXTERNAL})")
    for item in items:
        if "hosted" in item.keywords:
            item.add_marker(skip)


@dataclass
class Appliance:
    addr: str
    udp: Optional[str]
    tenant_key: str
    admin_key: Optional[str]
    proc: Optional[subprocess.Popen]
    tenant_name: str = "demo"

    def tenant(self, **kw):
        import leasebox

        if self.udp:
            kw.setdefault("rdma_peer", self.udp)
        if REQUESTER:
            kw.setdefault("requester", REQUESTER)
        return leasebox.Client(kw.pop("addr", self.addr), self.tenant_name, self.tenant_key, **kw)

    def admin(self, **kw):
        import leasebox

        if not self.admin_key:
            pytest.skip("no admin key (LEASEBOX_TEST_ADMIN_KEY)")
        if self.udp:
            kw.setdefault("rdma_peer", self.udp)
        if REQUESTER:
            kw.setdefault("requester", REQUESTER)
        return leasebox.Client(self.addr, "admin", self.admin_key, **kw)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def external_appliance() -> Appliance:
    """The appliance the environment names (see the module documentation)."""
    key = os.environ.get("LEASEBOX_TEST_KEY")
    if not key:
        raise RuntimeError("LEASEBOX_TEST_APPLIANCE is set but LEASEBOX_TEST_KEY is not")
    return Appliance(
        EXTERNAL,
        os.environ.get("LEASEBOX_TEST_RDMA_PEER"),
        key,
        os.environ.get("LEASEBOX_TEST_ADMIN_KEY"),
        None,
        os.environ.get("LEASEBOX_TEST_TENANT", "demo"),
    )


def hosted_binary() -> Path:
    env = os.environ.get("LEASEBOX_HOSTED_BIN")
    if env:
        return Path(env)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    binary = target / "debug" / "leasebox-hosted"
    if not binary.exists():
        subprocess.run(["cargo", "build", "-q", "-p", "leasebox-hosted"], cwd=REPO, check=True, timeout=900)
    return binary


def start_appliance(extra: Optional[List[str]] = None) -> Appliance:
    tenant, admin = secrets.token_hex(32), secrets.token_hex(32)
    args = [str(hosted_binary()), "--listen", "127.0.0.1:0", "--hca", "--udp", "127.0.0.1:0"]
    args += [f"tenant=demo:{tenant}", f"admin={admin}"] + (extra or [])
    # stderr (the appliance's log) goes to a file, so a full pipe never stalls it.
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    # The ready line: `leasebox: ready hosted=1 addr=IP ctl_port=PORT hca=true udp=IP:PORT`.
    found: dict = {}
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # read to the end: the pipe never fills
            if line.startswith("leasebox: ready") and not ready.is_set():
                found.update(w.split("=", 1) for w in line.split() if "=" in w)
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(READY_WITHIN):
        proc.kill()
        log.seek(0)
        raise RuntimeError(f"leasebox-hosted printed no ready line within {READY_WITHIN} s: {log.read()[-2000:]}")
    return Appliance(f"{found['addr']}:{found['ctl_port']}", found["udp"], tenant, admin, proc)


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    if EXTERNAL:
        yield external_appliance()
        return
    a = start_appliance()
    yield a
    a.stop()


class Proxy:
    """Forwards TCP connections to `upstream`; `kill()` cuts every connection so far."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.accepted = 0
        self.conns: List[socket.socket] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                down, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            up = socket.create_connection(self.upstream, timeout=5)
            up.settimeout(None)
            down.settimeout(None)
            with self.lock:
                self.accepted += 1
                self.conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def kill(self) -> None:
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.stopped.set()
        self.kill()
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def proxy(appliance: Appliance) -> Iterator[Proxy]:
    p = Proxy(appliance.addr)
    yield p
    p.close()


def wait_event(client, kind: str, within: float = 10.0):
    """The first event of `kind` within `within` seconds (others are skipped), or None."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        e = client.next_event(min(left, 0.5))
        if e is not None and e.kind == kind:
            return e


class Etcd:
    """A real etcd (Debian's etcd-server) on loopback with a temporary data directory, for the fleet tests.

    With `tls`, it serves HTTPS only and wants a client certificate (`--client-cert-auth`); `ca`, `cert` and
    `key` are then the CA and a client's certificate and key, made with the `openssl` command."""

    def __init__(self, tls: bool = False) -> None:
        binary = os.environ.get("LEASEBOX_ETCD") or shutil.which("etcd")
        if not binary:
            pytest.fail("etcd not found in PATH (Debian package etcd-server): run `cargo xtask prereqs`")
        self.dir = tempfile.TemporaryDirectory(prefix="leasebox-etcd-")
        client, peer = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{client}"
        self.scheme = "https" if tls else "http"
        self.ssl = None
        flags = []
        if tls:
            pki = Path(self.dir.name) / "pki"
            make_certificates(pki)
            self.ca, self.cert, self.key = str(pki / "ca.pem"), str(pki / "client.pem"), str(pki / "client.key")
            flags = [f"--cert-file={pki / 'server.pem'}", f"--key-file={pki / 'server.key'}",
                     f"--trusted-ca-file={self.ca}", "--client-cert-auth"]
            import ssl  # here: a minimal Python (the Soft-RoCE guest's) may lack it, and only TLS needs it

            self.ssl = ssl.create_default_context(cafile=self.ca)
            self.ssl.load_cert_chain(self.cert, self.key)
        self.proc = subprocess.Popen(
            [
                binary,
                "--name=pytest",
                f"--data-dir={self.dir.name}/data",
                f"--listen-client-urls={self.scheme}://{self.endpoint}",
                f"--advertise-client-urls={self.scheme}://{self.endpoint}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=pytest=http://127.0.0.1:{peer}",
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                self.call("kv/range", {"key": b64("/")})
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.proc.kill()
                    raise RuntimeError("etcd did not come up")
                time.sleep(0.05)

    def call(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"{self.scheme}://{self.endpoint}/v3/{path}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=3, context=self.ssl) as r:
            return json.loads(r.read())

    def put(self, key: str, value: str) -> None:
        self.call("kv/put", {"key": b64(key), "value": b64(value)})

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.dir.cleanup()


def make_certificates(pki: Path) -> None:
    """A throwaway P-256 CA, a server certificate for 127.0.0.1 (server and client use: etcd's gateway dials
    its own gRPC port with it) and a client certificate, with the `openssl` command (Debian package openssl)."""
    openssl = shutil.which("openssl")
    if not openssl:
        pytest.fail("openssl not found in PATH (Debian package openssl): run `cargo xtask prereqs`")
    pki.mkdir(parents=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=pki, check=True, capture_output=True)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=pytest CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, eku, san in [("server", "serverAuth,clientAuth", "subjectAltName=IP:127.0.0.1\n"),
                           ("client", "clientAuth", "")]:
        (pki / f"{name}.ext").write_text(
            f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={eku}\n{san}")
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=pytest {name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd() -> Iterator[Etcd]:
    e = Etcd()
    yield e
    e.close()


@pytest.fixture
def etcd_tls() -> Iterator[Etcd]:
    e = Etcd(tls=True)
    yield e
    e.close()


@pytest.fixture
def key_file(appliance):
    """The tenant's key in a file, as the key-value store and its adapters read it (test_kv_helpers.KeyFile)."""
    from test_kv_helpers import KeyFile

    k = KeyFile(appliance.tenant_key)
    yield k
    k.close()
