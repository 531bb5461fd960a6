//! A test-side driver: writes command entries and mailbox chains into a `VecMemory` RAM the way Linux
//! `core/cmd.c` does (independently of the model's code), rings the doorbell, polls the model and reads the
//! result back.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use mlx5_model::mem::{Memory, VecMemory};
use mlx5_model::{Model, ModelConfig};

pub const BAR_SIZE: usize = 0x40000;
pub const CMDQ: u64 = 0x1000;
pub const MBOX_IN: u64 = 0x10000;
pub const MBOX_OUT: u64 = 0x80000;
/// First page handed to the device by `give_pages`.
pub const PAGES: u64 = 0x100000;

pub struct Drv {
    pub bar: Arc<dyn Memory>,
    pub ram: Arc<VecMemory>,
    pub model: Model,
    pub token: u8,
    pub next_page: u64,
    pub sign: bool,
}

pub struct Done {
    pub delivery: u8,
    pub out: Vec<u8>,
}

impl Done {
    pub fn status(&self) -> u8 {
        self.out[0]
    }
    pub fn syndrome(&self) -> u32 {
        be32(&self.out, 4)
    }
}

pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// A 16-byte (or longer) input with opcode and op_mod set.
pub fn cmd(opcode: u16, op_mod: u16, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    put32(&mut b, 0, u32::from(opcode) << 16);
    put32(&mut b, 4, u32::from(op_mod));
    b
}

fn xor(b: &[u8]) -> u8 {
    b.iter().fold(0, |a, x| a ^ x)
}

impl Drv {
    pub fn new() -> Drv {
        Self::with(ModelConfig::instant(), 64 << 20)
    }

    pub fn with(cfg: ModelConfig, ram_size: usize) -> Drv {
        Self::with_bar(cfg, Arc::new(VecMemory::new(BAR_SIZE)), ram_size)
    }

    /// As [`Drv::with`] over a BAR of the caller's (`VecMemory::with_doorbell` for a write-1-to-set doorbell).
    pub fn with_bar(cfg: ModelConfig, bar: Arc<dyn Memory>, ram_size: usize) -> Drv {
        let ram = Arc::new(VecMemory::new(ram_size));
        let mut model = Model::new(bar.clone(), ram.clone(), cfg);
        model.poll();
        let d = Drv { bar, ram, model, token: 0, next_page: PAGES, sign: false };
        assert_eq!(d.bar.read_be32(0x1fc).unwrap() >> 31, 0, "initializing must clear");
        let lo = d.bar.read_be32(0x14).unwrap();
        assert_eq!(lo & 0xff, 0x56, "log_cmdq_size 5, log_cmdq_stride 6");
        d.bar.write_be32(0x10, (CMDQ >> 32) as u32).unwrap();
        d.bar.write_be32(0x14, CMDQ as u32).unwrap();
        d
    }

    /// Writes `data` as a mailbox chain at `base` (1 KiB apart), signed when the driver signs; returns the
    /// chain's address (0 for no data).
    pub fn chain(&self, base: u64, data: &[u8], token: u8) -> u64 {
        let n = data.len().div_ceil(512);
        for i in 0..n {
            let mut blk = vec![0u8; 576];
            let chunk = &data[i * 512..((i + 1) * 512).min(data.len())];
            blk[..chunk.len()].copy_from_slice(chunk);
            let next = if i + 1 < n { base + 1024 * (i as u64 + 1) } else { 0 };
            blk[0x230..0x238].copy_from_slice(&next.to_be_bytes());
            put32(&mut blk, 0x238, i as u32);
            blk[0x23d] = token;
            if self.sign {
                blk[0x23e] = !xor(&blk[0x200..0x23e]);
                blk[0x23f] = !xor(&blk[..0x23f]);
            }
            self.ram.write(base + 1024 * i as u64, &blk).unwrap();
        }
        if n == 0 { 0 } else { base }
    }

    /// Writes the entry for `input` in `slot` without ringing.
    pub fn post(&mut self, slot: u32, input: &[u8], out_len: usize) -> u64 {
        self.token = self.token.wrapping_add(1).max(1);
        let t = self.token;
        let inp = self.chain(MBOX_IN, input.get(16..).unwrap_or(&[]), t);
        let outp = self.chain(MBOX_OUT, &vec![0u8; out_len.saturating_sub(16)], t);
        let mut e = [0u8; 64];
        e[0] = 7;
        put32(&mut e, 4, input.len() as u32);
        e[8..16].copy_from_slice(&inp.to_be_bytes());
        let n = input.len().min(16);
        e[16..16 + n].copy_from_slice(&input[..n]);
        e[0x30..0x38].copy_from_slice(&outp.to_be_bytes());
        put32(&mut e, 0x38, out_len as u32);
        e[0x3c] = t;
        e[0x3f] = 1;
        e[0x3d] = !xor(&e);
        let addr = CMDQ + 64 * u64::from(slot);
        self.ram.write(addr, &e).unwrap();
        addr
    }

    pub fn read_result(&self, slot: u32, out_len: usize) -> Done {
        let addr = CMDQ + 64 * u64::from(slot);
        let mut e = [0u8; 64];
        self.ram.read(addr, &mut e).unwrap();
        assert_eq!(e[0x3f] & 1, 0, "ownership must return to software");
        let mut out = e[0x20..0x30].to_vec();
        let mut at = MBOX_OUT;
        while out.len() < out_len {
            let mut blk = vec![0u8; 512];
            self.ram.read(at, &mut blk).unwrap();
            out.extend_from_slice(&blk);
            at += 1024;
        }
        out.truncate(out_len.max(16));
        Done { delivery: e[0x3f] >> 1, out }
    }

    /// Whether the entry in `slot` is still the device's.
    pub fn hw_owned(&self, slot: u32) -> bool {
        let mut b = [0u8; 1];
        self.ram.read(CMDQ + 64 * u64::from(slot) + 0x3f, &mut b).unwrap();
        b[0] & 1 == 1
    }

    /// Polls until the entry in `slot` is software's again (commands held for firmware time); panics after
    /// `limit`, a generous bound against a model that never completes.
    pub fn wait(&mut self, slot: u32, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        while self.hw_owned(slot) {
            // Wall clock stays: a hang guard only (the model holds commands for real firmware time).
            assert!(std::time::Instant::now() < deadline, "slot {slot} did not complete within {limit:?}");
            if !self.model.poll() {
                std::thread::yield_now();
            }
        }
    }

    pub fn ring(&mut self, bits: u32) {
        self.bar.write_be32(0x18, bits).unwrap();
        assert!(self.model.poll());
    }

    /// Executes one command in slot 0.
    pub fn exec(&mut self, input: &[u8], out_len: usize) -> Done {
        self.post(0, input, out_len);
        self.ring(1);
        self.read_result(0, out_len)
    }

    pub fn ok(&mut self, input: &[u8], out_len: usize) -> Vec<u8> {
        let d = self.exec(input, out_len);
        assert_eq!((d.delivery, d.status()), (0, 0), "opcode {:#x} syndrome {:#x}", be32(input, 0) >> 16, d.syndrome());
        d.out
    }

    pub fn give_pages(&mut self, n: u32) -> Done {
        let mut inp = cmd(0x108, 1, 16 + 8 * n as usize);
        put32(&mut inp, 12, n);
        for i in 0..n as usize {
            inp[16 + 8 * i..24 + 8 * i].copy_from_slice(&self.next_page.to_be_bytes());
            self.next_page += 4096;
        }
        self.exec(&inp, 16)
    }

    pub fn query_pages(&mut self, op_mod: u16) -> i32 {
        be32(&self.ok(&cmd(0x107, op_mod, 16), 16), 12) as i32
    }

    /// ENABLE_HCA, SET_ISSI 1, boot pages, init pages, INIT_HCA.
    pub fn bring_up(&mut self) {
        self.ok(&cmd(0x104, 0, 16), 16);
        let mut s = cmd(0x10b, 0, 16);
        put32(&mut s, 8, 1);
        self.ok(&s, 16);
        let n = self.query_pages(1) as u32;
        assert_eq!(self.give_pages(n).status(), 0);
        let n = self.query_pages(2) as u32;
        assert_eq!(self.give_pages(n).status(), 0);
        self.ok(&cmd(0x102, 0, 0x20), 16);
    }
}

/// `create_eq_in` for a `2^log_eq_size`-entry EQ at `buf` (one 4 KiB page per PAS entry).
/// CREATE_MKEY input: rw/rr/lw/lr access, access mode `mode` (0 PA, 1 MTT), variant 0x5a, 4 KiB pages, unbound
/// to a QP, with `mtt` as the translation list.
pub fn create_mkey_in(pd: u32, mode: u8, start: u64, len: u64, mtt: &[u64]) -> Vec<u8> {
    let oct = mtt.len().div_ceil(2);
    let mut c = cmd(0x200, 0, 0x110 + 16 * oct);
    let m = 0x10;
    c[m + 2] = 0x3c | (mode & 3); // rw rr lw lr, access_mode_1_0
    put32(&mut c, m + 4, 0xffff_ff00 | 0x5a); // qpn unbound, mkey_7_0
    put32(&mut c, m + 0xc, pd);
    c[m + 0x10..m + 0x18].copy_from_slice(&start.to_be_bytes());
    c[m + 0x18..m + 0x20].copy_from_slice(&len.to_be_bytes());
    put32(&mut c, m + 0x34, oct as u32);
    c[m + 0x3b] = 12;
    put32(&mut c, 0x60, oct as u32);
    for (i, pa) in mtt.iter().enumerate() {
        c[0x110 + 8 * i..0x118 + 8 * i].copy_from_slice(&(pa | 3).to_be_bytes());
    }
    c
}

pub fn create_eq_in(log_eq_size: u32, uar: u32, bitmask: u64, buf: u64) -> Vec<u8> {
    let pages = ((64u64 << log_eq_size).div_ceil(4096)) as usize;
    let mut b = cmd(0x301, 0, 0x110 + 8 * pages);
    put32(&mut b, 0x1c, (log_eq_size << 24) | uar);
    b[0x58..0x60].copy_from_slice(&bitmask.to_be_bytes());
    for k in 0..pages {
        b[0x110 + 8 * k..0x118 + 8 * k].copy_from_slice(&(buf + 4096 * k as u64).to_be_bytes());
    }
    b
}

/// `create_cq_in` for a `2^log_cq_size`-entry CQ of 64-byte CQEs at `buf` reporting to `eqn`.
pub fn create_cq_in(log_cq_size: u32, uar: u32, eqn: u32, buf: u64, dbr: u64) -> Vec<u8> {
    let pages = ((64u64 << log_cq_size).div_ceil(4096)) as usize;
    let mut b = cmd(0x400, 0, 0x110 + 8 * pages);
    put32(&mut b, 0x1c, (log_cq_size << 24) | uar);
    put32(&mut b, 0x24, eqn);
    b[0x48..0x50].copy_from_slice(&dbr.to_be_bytes());
    for k in 0..pages {
        b[0x110 + 8 * k..0x118 + 8 * k].copy_from_slice(&(buf + 4096 * k as u64).to_be_bytes());
    }
    b
}

/// EQ buffers and CQ rings live above the pages `bring_up` gives (those end near 52 MiB).
pub const QBUF: u64 = 0x3c0_0000;

/// An EQ (16 entries at `QBUF`, subscribed to nothing) and a 64-entry CQ on it (ring at `QBUF + 0x1000`,
/// doorbell record at `QBUF + 0x10_0000`), both on `uar`, through CREATE_EQ and CREATE_CQ: returns (eqn, cqn).
pub fn create_eq_cq(d: &mut Drv, uar: u32) -> (u32, u32) {
    let eqn = u32::from(d.ok(&create_eq_in(4, uar, 0, QBUF), 16)[0xb]);
    let out = d.ok(&create_cq_in(6, uar, eqn, QBUF + 0x1000, QBUF + 0x10_0000), 16);
    (eqn, be32(&out, 8) & 0xff_ffff)
}
