//! End to end through the model: PD, MKEY (MTT) and an RC QP made by real commands, driven to RTS, then RoCEv2
//! requests over UDP loopback from an encoder written here (ICRC included), answered by
//! `dataplane::poll_udp` over the model's own tables. Covers both revoke orders of docs/architecture.md.

mod common;
mod support_qp;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::Drv;
use mlx5_model::dataplane;
use mlx5_model::mem::Memory;
use mlx5_model::roce::responder::{self, Disposition};
use mlx5_model::roce::udp::UdpResponder;
use support_qp::*;

mod rocev2;
use rocev2::*;

const ACK_OK: u8 = 0x1f;
const NAK_REM_ACCESS: u8 = 0x62;
const REMOTE_QPN: u32 = 0x77;
const VA: u64 = 0x7000_0000;
/// The MKEY's two MTT pages (not contiguous).
const PAGES: [u64; 2] = [0x30_0000, 0x35_0000];

struct Rig {
    d: Drv,
    udp: UdpResponder,
    client: UdpSocket,
    r: Res,
}

impl Rig {
    fn new() -> Rig {
        let mut d = Drv::new();
        d.bring_up();
        let r = setup(&mut d);
        let udp = UdpResponder::bind("127.0.0.1:0", Duration::from_millis(1)).unwrap();
        udp.set_nonblocking(true).unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.connect(udp.local_addr().unwrap()).unwrap();
        client.set_nonblocking(true).unwrap();
        Rig { d, udp, client, r }
    }

    /// An RC QP at RTS expecting PSN 0x100 from REMOTE_QPN.
    fn rts_qp(&mut self) -> u32 {
        let (d, r) = (&mut self.d, self.r);
        let q = create_qp(d, r);
        d.ok(&rst2init_in(q, r), 16);
        d.ok(&init2rtr_in(q, r, REMOTE_QPN, 0x100), 16);
        d.ok(&rtr2rts_in(q, r, 0x500), 16);
        q
    }

    /// Sends one request, polls the model (commands and UDP) until it has taken the request in, then collects
    /// replies for up to `wait`. The model answers from within that poll, so an empty result is silence, not
    /// a model that did not get to run.
    fn send(&mut self, r: &Req, wait: Duration) -> Vec<Reply> {
        self.client.send(&encode(r)).unwrap();
        let taken_by = Instant::now() + WAIT;
        loop {
            self.d.model.poll();
            if dataplane::poll_udp(&mut self.d.model, &mut self.udp).unwrap() > 0 {
                break;
            }
            // Wall clock stays: a hang guard only (the datagram crosses a real UDP socket).
            assert!(Instant::now() < taken_by, "the model did not take the request within {WAIT:?}");
            std::thread::sleep(Duration::from_micros(200));
        }
        let end = Instant::now() + wait;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 9216];
        loop {
            while let Ok(n) = self.client.recv(&mut buf) {
                got.push(decode(&buf[..n]));
            }
            if !got.is_empty() {
                // Give a multi-packet answer a moment to finish, then stop.
                std::thread::sleep(Duration::from_millis(5));
                while let Ok(n) = self.client.recv(&mut buf) {
                    got.push(decode(&buf[..n]));
                }
                break;
            }
            if Instant::now() >= end {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
            self.d.model.poll();
            dataplane::poll_udp(&mut self.d.model, &mut self.udp).unwrap();
        }
        got
    }
}

fn write_only(qpn: u32, psn: u32, rkey: u32, va: u64, data: &[u8]) -> Req {
    Req {
        opcode: OP_WRITE_ONLY,
        qpn,
        psn,
        ack_req: true,
        reth: Some((va, rkey, data.len() as u32)),
        payload: data.to_vec(),
    }
}

fn read_req(qpn: u32, psn: u32, rkey: u32, va: u64, len: u32) -> Req {
    Req { opcode: OP_READ_REQ, qpn, psn, ack_req: true, reth: Some((va, rkey, len)), payload: Vec::new() }
}

const WAIT: Duration = Duration::from_secs(2);

#[test]
fn write_and_read_back_then_mkey_first_revoke_naks() {
    let mut r = Rig::new();
    let key = create_mkey_mtt(&mut r.d, r.r.pd, VA, 0x2000, &PAGES);
    let q = r.rts_qp();
    // 64 bytes straddling the MTT page boundary: 32 land at the end of page 0, 32 at the start of page 1.
    let data: Vec<u8> = (0..64u8).collect();
    let got = r.send(&write_only(q, 0x100, key, VA + 0x1000 - 32, &data), WAIT);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].opcode, got[0].syndrome, got[0].psn, got[0].dest_qp), (OP_ACK, Some(ACK_OK), 0x100, REMOTE_QPN));
    let mut a = [0u8; 32];
    r.d.ram.read(PAGES[0] + 0x1000 - 32, &mut a).unwrap();
    assert_eq!(&a[..], &data[..32]);
    r.d.ram.read(PAGES[1], &mut a).unwrap();
    assert_eq!(&a[..], &data[32..]);

    let got = r.send(&read_req(q, 0x101, key, VA + 0x1000 - 32, 64), WAIT);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].opcode, got[0].syndrome), (OP_READ_RESP_ONLY, Some(ACK_OK)));
    assert_eq!(got[0].payload, data);
    // The responder's PSN reached the QP context.
    assert_eq!(getf(&query_qp(&mut r.d, q), bit::NEXT_RCV_PSN, 24), 0x102);

    // MKEY first, QP left in RTS: the next request is NAKed (remote access error) within one round trip,
    // then the QP is in ERR and its WQ_ACCESS_ERROR event went to the EQ side (no EQ here to receive it).
    destroy_mkey(&mut r.d, key);
    let got = r.send(&write_only(q, 0x102, key, VA, &data), WAIT);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].opcode, got[0].syndrome, got[0].psn), (OP_ACK, Some(NAK_REM_ACCESS), 0x102));
    assert_eq!(qp_state(&mut r.d, q), 6);
    assert!(r.d.model.hca_mut().qps.take_events().is_empty(), "forwarded by poll_udp");
    // From then on: silence.
    assert!(r.send(&write_only(q, 0x103, key, VA, &data), Duration::from_millis(200)).is_empty());
}

#[test]
fn qp_first_revoke_is_silent_and_2rst_resets_the_responder() {
    let mut r = Rig::new();
    let key = create_mkey_mtt(&mut r.d, r.r.pd, VA, 0x2000, &PAGES);
    let q = r.rts_qp();
    let data = vec![0xabu8; 16];
    assert_eq!(r.send(&write_only(q, 0x100, key, VA, &data), WAIT).len(), 1);
    r.d.ok(&short_in(QP_2ERR, q), 16);
    assert!(r.send(&write_only(q, 0x101, key, VA + 16, &data), Duration::from_millis(200)).is_empty());
    let mut a = [0u8; 16];
    r.d.ram.read(PAGES[0] + 16, &mut a).unwrap();
    assert_eq!(a, [0u8; 16], "nothing written while in ERR");
    // A driver-requested 2ERR raises no async event.
    assert!(r.d.model.hca_mut().qps.take_events().is_empty());
    // 2RST and back to RTS: the responder starts over from the new next_rcv_psn.
    r.d.ok(&short_in(QP_2RST, q), 16);
    r.d.ok(&rst2init_in(q, r.r), 16);
    r.d.ok(&init2rtr_in(q, r.r, REMOTE_QPN, 0x10), 16);
    r.d.ok(&rtr2rts_in(q, r.r, 0), 16);
    let got = r.send(&write_only(q, 0x10, key, VA + 16, &data), WAIT);
    assert_eq!((got[0].syndrome, got[0].psn), (Some(ACK_OK), 0x10));
    // Destroyed QP: silence.
    r.d.ok(&short_in(DESTROY_QP, q), 16);
    assert!(r.send(&write_only(q, 0x11, key, VA, &data), Duration::from_millis(200)).is_empty());
}

/// Hands one frame to the responder over the model's own tables (as `poll_udp` and the Ethernet wire do) and
/// returns what became of it and how many frames went back.
fn deliver(d: &mut Drv, frame: &[u8]) -> (Disposition, usize) {
    let mut t = dataplane::HcaTables::new(&mut d.model);
    let mut sent = 0;
    let how = responder::handle_into(&mut t, frame, &mut |_| sent += 1);
    (how, sent)
}

#[test]
fn the_port_takes_roce_only_with_roce_en_to_its_mac_and_a_rocev2_gid() {
    let mut r = Rig::new();
    let key = create_mkey_mtt(&mut r.d, r.r.pd, VA, 0x2000, &PAGES);
    let q = r.rts_qp();
    let req = |psn| write_only(q, psn, key, VA, b"abcd");
    let written = |d: &Drv| {
        let mut a = [0u8; 4];
        d.ram.read(PAGES[0], &mut a).unwrap();
        a
    };
    // Another MAC (even the broadcast one), another IPv4: dropped, nothing written, no answer.
    for (mac, ip) in [([0x02, 0x4c, 0x42, 0, 0, 2], MODEL_IP), ([0xff; 6], MODEL_IP), (MODEL_MAC, [192, 168, 7, 3])] {
        assert_eq!(
            deliver(&mut r.d, &encode_to(&req(0x100), mac, ip)),
            (Disposition::NotForPort, 0),
            "{mac:02x?} {ip:?}"
        );
    }
    // RoCE disabled on the vport: dropped.
    r.d.ok(&roce_en_in(false), 16);
    assert_eq!(deliver(&mut r.d, &encode(&req(0x100))), (Disposition::NotForPort, 0));
    r.d.ok(&roce_en_in(true), 16);
    // GID 0 rewritten as RoCE v1 for the same address: not a valid RoCEv2 GID, dropped.
    let mut v1 = set_roce_ipv4_in(0, LOCAL_IP, PORT_MAC);
    setf(&mut v1, 0x80 + 0xd8, 8, 1);
    r.d.ok(&v1, 16);
    assert_eq!(deliver(&mut r.d, &encode(&req(0x100))), (Disposition::NotForPort, 0));
    // GID 0 deleted (an all-zero entry): dropped.
    r.d.ok(&common::cmd(0x761, 0, 0x30), 16);
    assert_eq!(deliver(&mut r.d, &encode(&req(0x100))), (Disposition::NotForPort, 0));
    assert_eq!(written(&r.d), [0; 4]);
    // Written again: taken, as the requests of the other tests are.
    r.d.ok(&set_roce_ipv4_in(0, LOCAL_IP, PORT_MAC), 16);
    assert_eq!(deliver(&mut r.d, &encode(&req(0x100))), (Disposition::Acked, 1));
    assert_eq!(&written(&r.d), b"abcd");
}

/// ACCESS_REGISTER write of PAOS for port 1 with `ase` and `admin_status` (1 up, 2 down), as
/// `mlx5_ifc_paos_reg_bits` lays it out behind the 0x10-byte `access_register_in` header.
fn paos_write(admin_status: u32) -> Vec<u8> {
    let mut c = common::cmd(0x805, 0, 0x20);
    setf(&mut c, 0x08 * 8 + 16, 16, 0x5006); // register_id PAOS
    setf(&mut c, 0x10 * 8 + 8, 8, 1); // local_port
    setf(&mut c, 0x10 * 8 + 20, 4, admin_status);
    setf(&mut c, 0x14 * 8, 1, 1); // ase
    c
}

/// A port taken down (PAOS `admin_status` down, as the appliance's fatal path does) answers and executes no
/// RoCE request arriving on the `--udp` cable — the Ethernet wire's MAC already drops everything while the link
/// is down — and the QP, the MKEY and the PSN are untouched, so the port coming up again serves the lease
/// as before. docs/hca-model.md, "RoCE port rules".
#[test]
fn a_port_taken_down_answers_and_executes_no_roce_request() {
    let mut r = Rig::new();
    let key = create_mkey_mtt(&mut r.d, r.r.pd, VA, 0x2000, &PAGES);
    let q = r.rts_qp();
    let got = r.send(&write_only(q, 0x100, key, VA, b"live"), WAIT);
    assert_eq!(got.iter().map(|g| g.syndrome).collect::<Vec<_>>(), [Some(ACK_OK)]);
    r.d.ok(&paos_write(2), 0x20);
    assert_eq!(r.d.model.hca().port.oper_status, mlx5_model::port::PORT_DOWN);
    assert!(r.send(&write_only(q, 0x101, key, VA, b"gone"), Duration::from_millis(200)).is_empty());
    assert!(r.send(&read_req(q, 0x101, key, VA, 4), Duration::from_millis(200)).is_empty());
    let mut a = [0u8; 4];
    r.d.ram.read(PAGES[0], &mut a).unwrap();
    assert_eq!(&a, b"live", "nothing written while the port is down");
    assert_eq!(deliver(&mut r.d, &encode(&write_only(q, 0x101, key, VA, b"gone"))), (Disposition::NotForPort, 0));
    // Up again (the rig's model trains no link): the same QP and MKEY answer, from the PSN they had.
    r.d.ok(&paos_write(1), 0x20);
    let got = r.send(&write_only(q, 0x101, key, VA, b"back"), WAIT);
    assert_eq!(got.iter().map(|g| (g.syndrome, g.psn)).collect::<Vec<_>>(), [(Some(ACK_OK), 0x101)]);
}

/// Bus Master Enable cleared (hosted rigs play it: `Model::set_bus_master`): no request is answered or
/// executed, and no command runs.
#[test]
fn bus_mastering_cleared_stops_the_responder_and_the_command_queue() {
    let mut r = Rig::new();
    let key = create_mkey_mtt(&mut r.d, r.r.pd, VA, 0x2000, &PAGES);
    let q = r.rts_qp();
    assert_eq!(r.send(&write_only(q, 0x100, key, VA, b"live"), WAIT).len(), 1);
    r.d.model.set_bus_master(false);
    assert_eq!(deliver(&mut r.d, &encode(&write_only(q, 0x101, key, VA, b"gone"))), (Disposition::NotForPort, 0));
    let mut a = [0u8; 4];
    r.d.ram.read(PAGES[0], &mut a).unwrap();
    assert_eq!(&a, b"live");
    assert!(!r.d.model.poll(), "no command is fetched without bus mastering");
}
