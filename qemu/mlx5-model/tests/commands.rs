//! Per-command tests through the command queue: good input and each error class.

mod common;

use common::{Drv, be32, cmd, put32};
use mlx5_model::mem::Memory;

const BAD_OP: u8 = 0x02;
const BAD_PARAM: u8 = 0x03;
const BAD_SYS_STATE: u8 = 0x04;
const BAD_RES_STATE: u8 = 0x09;
const BAD_INP_LEN: u8 = 0x50;
const BAD_OUTP_LEN: u8 = 0x51;

#[test]
fn init_segment_layout() {
    let d = Drv::new();
    let dw0 = d.bar.read_be32(0).unwrap();
    assert_eq!((dw0 & 0xffff, dw0 >> 16), (16, 35));
    assert_eq!(d.bar.read_be32(4).unwrap() >> 16, 5, "cmd_interface_rev");
    assert_eq!(d.bar.read_be32(0xff8).unwrap(), 60_000, "cmd_exec_to 60 s in ms units");
}

#[test]
fn initializing_holds_commands_until_cleared() {
    use mlx5_model::ModelConfig;
    use std::sync::Arc;
    use std::time::Duration;
    let bar = Arc::new(mlx5_model::mem::VecMemory::new(common::BAR_SIZE));
    let ram = Arc::new(mlx5_model::mem::VecMemory::new(1 << 20));
    // Long enough that the first poll comes within it even on a busy machine.
    let init_delay = Duration::from_millis(500);
    let cfg = ModelConfig { init_delay, ..ModelConfig::instant() };
    let mut m = mlx5_model::Model::new(bar.clone(), ram, cfg);
    assert_eq!(bar.read_be32(0x1fc).unwrap() >> 31, 1);
    bar.write_be32(0x18, 1).unwrap();
    m.poll();
    assert_eq!(m.counters().doorbells_while_initializing, 1);
    std::thread::sleep(init_delay + Duration::from_millis(10));
    assert!(m.poll());
    assert_eq!(bar.read_be32(0x1fc).unwrap() >> 31, 0);
}

#[test]
fn health_counter_ticks_and_can_stop() {
    use mlx5_model::ModelConfig;
    use std::time::Duration;
    let cfg = ModelConfig { health_period: Duration::from_millis(5), ..ModelConfig::instant() };
    let mut d = Drv::with(cfg, 1 << 20);
    let a = d.bar.read_be32(0x1010).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    d.model.poll();
    let b = d.bar.read_be32(0x1010).unwrap();
    assert!(b > a, "{a} -> {b}");
    d.model.set_health_stopped(true);
    std::thread::sleep(Duration::from_millis(20));
    d.model.poll();
    assert_eq!(d.bar.read_be32(0x1010).unwrap(), b);
    // The internal timer runs.
    assert!(d.bar.read_be64(0x1000).unwrap() > 0);
}

#[test]
fn enable_disable_and_state_errors() {
    let mut d = Drv::new();
    // Before ENABLE_HCA nothing but ENABLE works.
    assert_eq!(d.exec(&cmd(0x10a, 0, 16), 0x70).status(), BAD_SYS_STATE);
    d.ok(&cmd(0x104, 0, 16), 16);
    assert_eq!(d.exec(&cmd(0x104, 0, 16), 16).status(), BAD_SYS_STATE);
    // Wrong function, op_mod, short input, reserved bits.
    let mut e = cmd(0x105, 0, 16);
    put32(&mut e, 8, 1);
    assert_eq!(d.exec(&e, 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&cmd(0x105, 1, 16), 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&cmd(0x105, 0, 8), 16).status(), BAD_INP_LEN);
    let mut r = cmd(0x105, 0, 16);
    put32(&mut r, 12, 1);
    let res = d.exec(&r, 16);
    assert_eq!(res.status(), BAD_PARAM);
    assert_eq!(res.syndrome() >> 16, 0x105, "syndrome names the opcode");
    d.ok(&cmd(0x105, 0, 16), 16);
}

/// `ModelConfig::left_initialized`: the function starts enabled and initialised, as a previous owner left it;
/// ENABLE_HCA and DISABLE_HCA are refused until TEARDOWN_HCA, then it behaves as a fresh function.
#[test]
fn a_function_left_initialized_needs_teardown_and_disable() {
    let cfg = mlx5_model::ModelConfig { left_initialized: true, ..mlx5_model::ModelConfig::instant() };
    let mut d = Drv::with(cfg, 64 << 20);
    assert_eq!(d.model.state(), mlx5_model::FnState::Initialized);
    assert_eq!(d.exec(&cmd(0x104, 0, 16), 16).status(), BAD_SYS_STATE);
    assert_eq!(d.exec(&cmd(0x105, 0, 16), 16).status(), BAD_SYS_STATE);
    d.ok(&cmd(0x103, 0, 16), 16);
    d.ok(&cmd(0x105, 0, 16), 16);
    d.ok(&cmd(0x104, 0, 16), 16);
    assert_eq!(d.model.state(), mlx5_model::FnState::Enabled);
}

#[test]
fn unknown_opcode_is_bad_op() {
    let mut d = Drv::new();
    assert_eq!(d.exec(&cmd(0x7ff, 0, 16), 16).status(), BAD_OP);
}

#[test]
fn issi() {
    let mut d = Drv::new();
    d.ok(&cmd(0x104, 0, 16), 16);
    let o = d.ok(&cmd(0x10a, 0, 16), 0x70);
    assert_eq!(be32(&o, 0x6c), 2, "supported_issi_dw0: ISSI 1");
    assert_eq!(be32(&o, 8) & 0xffff, 0, "current_issi starts at 0");
    assert_eq!(d.exec(&cmd(0x10a, 0, 16), 0x20).status(), BAD_OUTP_LEN);
    let mut s = cmd(0x10b, 0, 16);
    put32(&mut s, 8, 2);
    assert_eq!(d.exec(&s, 16).status(), BAD_PARAM);
    put32(&mut s, 8, 1);
    d.ok(&s, 16);
    assert_eq!(be32(&d.ok(&cmd(0x10a, 0, 16), 0x70), 8) & 0xffff, 1);
}

#[test]
fn init_hca_needs_boot_and_init_pages() {
    let mut d = Drv::new();
    d.ok(&cmd(0x104, 0, 16), 16);
    assert_eq!(d.query_pages(1), 6);
    assert_eq!(d.exec(&cmd(0x102, 0, 0x20), 16).status(), BAD_SYS_STATE);
    assert_eq!(d.give_pages(6).status(), 0);
    assert_eq!(d.query_pages(1), 0);
    assert_eq!(d.query_pages(2), 0x3244);
    assert_eq!(d.exec(&cmd(0x102, 0, 0x20), 16).status(), BAD_SYS_STATE);
    assert_eq!(d.give_pages(0x3243).status(), 0);
    assert_eq!(d.exec(&cmd(0x102, 0, 0x20), 16).status(), BAD_SYS_STATE);
    assert_eq!(d.give_pages(1).status(), 0);
    d.ok(&cmd(0x102, 0, 0x20), 16);
    assert_eq!(d.exec(&cmd(0x102, 0, 0x20), 16).status(), BAD_SYS_STATE);
    assert_eq!(d.exec(&cmd(0x107, 4, 16), 16).status(), BAD_PARAM);
}

#[test]
fn manage_pages_validation_and_take() {
    let mut d = Drv::new();
    d.ok(&cmd(0x104, 0, 16), 16);
    // Misaligned, outside RAM, duplicate.
    for pa in [0x100_0800u64, 1 << 40] {
        let mut g = cmd(0x108, 1, 24);
        put32(&mut g, 12, 1);
        g[16..24].copy_from_slice(&pa.to_be_bytes());
        assert_eq!(d.exec(&g, 16).status(), BAD_PARAM);
    }
    assert_eq!(d.give_pages(2).status(), 0);
    d.next_page -= 4096;
    assert_eq!(d.give_pages(1).status(), BAD_PARAM, "page already owned");
    // input_num_entries larger than the input.
    let mut g = cmd(0x108, 1, 16);
    put32(&mut g, 12, 4);
    assert_eq!(d.exec(&g, 16).status(), BAD_INP_LEN);
    // TAKE returns both pages, then nothing.
    let mut t = cmd(0x108, 2, 16);
    put32(&mut t, 12, 8);
    let o = d.ok(&t, 16 + 64);
    assert_eq!(be32(&o, 8), 2);
    let pas: Vec<u64> = (0..2).map(|i| u64::from_be_bytes(o[16 + 8 * i..24 + 8 * i].try_into().unwrap())).collect();
    assert!(pas.contains(&common::PAGES) && pas.contains(&(common::PAGES + 4096)));
    assert_eq!(be32(&d.ok(&t, 16 + 64), 8), 0);
}

#[test]
fn caps_query_and_set() {
    let mut d = Drv::new();
    d.ok(&cmd(0x104, 0, 16), 16);
    let max = d.ok(&cmd(0x100, 0, 16), 0x1010);
    let cur = d.ok(&cmd(0x100, 1, 16), 0x1010);
    // log_max_qp: cap byte 0x13 [4:0] → output byte 0x23.
    assert_eq!((max[0x23] & 0x1f, cur[0x23] & 0x1f), (0x17, 0x0e));
    // RoCE caps (cap type 4 → op_mod 8/9) exist; ODP (op_mod 4) does not.
    d.ok(&cmd(0x100, 9, 16), 0x1010);
    assert_eq!(d.exec(&cmd(0x100, 4, 16), 0x1010).status(), BAD_PARAM);
    assert_eq!(d.exec(&cmd(0x100, 1, 16), 0x100).status(), BAD_OUTP_LEN);
    // SET: log_max_qp 0x11 accepted, above max refused, short input refused.
    let mut s = cmd(0x109, 0, 0x1010);
    s[0x10..].copy_from_slice(&cur[0x10..]);
    s[0x23] = (s[0x23] & !0x1f) | 0x11;
    d.ok(&s, 16);
    assert_eq!(d.ok(&cmd(0x100, 1, 16), 0x1010)[0x23] & 0x1f, 0x11);
    s[0x23] = (s[0x23] & !0x1f) | 0x18;
    assert_eq!(d.exec(&s, 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&s[..0x100], 16).status(), BAD_INP_LEN);
    assert_eq!(d.exec(&cmd(0x109, 1, 0x1010), 16).status(), BAD_PARAM);
}

#[test]
fn handles_need_init_hca() {
    let mut d = Drv::new();
    d.ok(&cmd(0x104, 0, 16), 16);
    for op in [0x802, 0x800, 0x816] {
        assert_eq!(d.exec(&cmd(op, 0, 16), 16).status(), BAD_SYS_STATE, "{op:#x} before INIT_HCA");
    }
}

fn up() -> Drv {
    let mut d = Drv::new();
    d.bring_up();
    d
}

#[test]
fn handles_after_init() {
    let mut d = up();
    let u = be32(&d.ok(&cmd(0x802, 0, 16), 16), 8);
    assert_eq!(u, 0x10, "first UAR as the trace's ConnectX-4");
    assert_eq!(be32(&d.ok(&cmd(0x802, 0, 16), 16), 8), 0x11);
    let pd = be32(&d.ok(&cmd(0x800, 0, 16), 16), 8);
    assert_eq!(pd, 1);
    let td = be32(&d.ok(&cmd(0x816, 0, 16), 16), 8);
    assert_eq!(td, 1);
    let mut x = cmd(0x803, 0, 16);
    put32(&mut x, 8, u);
    d.ok(&x, 16);
    assert_eq!(d.exec(&x, 16).status(), BAD_PARAM, "double free");
    let mut x = cmd(0x817, 0, 16);
    put32(&mut x, 8, td);
    d.ok(&x, 16);
    let mut x = cmd(0x801, 0, 16);
    put32(&mut x, 8, 77);
    assert_eq!(d.exec(&x, 16).status(), BAD_PARAM);
}

fn create_mkey(d: &mut Drv, pd: u32, mode: u8, start: u64, len: u64, mtt: &[u64]) -> common::Done {
    d.exec(&common::create_mkey_in(pd, mode, start, len, mtt), 16)
}

#[test]
fn mkey_mtt_lifecycle() {
    let mut d = up();
    let pd = be32(&d.ok(&cmd(0x800, 0, 16), 16), 8);
    let r = create_mkey(&mut d, pd, 1, 0x7000_0800, 0x1800, &[0x20_0000, 0x30_0000]);
    assert_eq!((r.delivery, r.status()), (0, 0), "{:#x}", r.syndrome());
    let index = be32(&r.out, 8) & 0xff_ffff;
    let key = (index << 8) | 0x5a;
    let info = d.model.mkey(key).expect("mkey visible to the responder");
    assert_eq!((info.pd, info.start_addr, info.len), (pd, 0x7000_0800, 0x1800));
    assert!(info.access.remote_write && info.access.remote_read);
    assert_eq!(info.translate(0x7000_0f00, 0x200), Some(vec![(0x20_0f00, 0x100), (0x30_0000, 0x100)]));
    assert!(d.model.mkey(key ^ 1).is_none(), "wrong variant fails closed");
    // QUERY_MKEY returns the mkc and the first MTTs.
    let mut q = cmd(0x201, 0, 16);
    put32(&mut q, 8, index);
    let o = d.ok(&q, 0x130);
    assert_eq!(be32(&o, 0x10 + 0xc) & 0xff_ffff, pd);
    assert_eq!(u64::from_be_bytes(o[0x110..0x118].try_into().unwrap()), 0x20_0003);
    // PD in use.
    let mut x = cmd(0x801, 0, 16);
    put32(&mut x, 8, pd);
    assert_eq!(d.exec(&x, 16).status(), BAD_RES_STATE);
    let mut del = cmd(0x202, 0, 16);
    put32(&mut del, 8, index);
    d.ok(&del, 16);
    assert!(d.model.mkey(key).is_none());
    assert_eq!(d.exec(&del, 16).status(), BAD_PARAM);
    d.ok(&x, 16);
}

#[test]
fn mkey_errors() {
    let mut d = up();
    let pd = be32(&d.ok(&cmd(0x800, 0, 16), 16), 8);
    // Bad PD, too few translations, page outside RAM, KLM mode.
    assert_eq!(create_mkey(&mut d, pd + 1, 1, 0, 0x1000, &[0x20_0000]).status(), BAD_PARAM);
    assert_eq!(create_mkey(&mut d, pd, 1, 0x800, 0x2000, &[0x20_0000]).status(), BAD_PARAM);
    assert_eq!(create_mkey(&mut d, pd, 1, 0, 0x1000, &[1 << 40]).status(), BAD_PARAM);
    assert_eq!(create_mkey(&mut d, pd, 2, 0, 0x1000, &[0x20_0000]).status(), BAD_PARAM);
    assert_eq!(d.exec(&cmd(0x200, 0, 0x100), 16).status(), BAD_INP_LEN);
    // FENCE-TEST: DESTROY_MKEY of index 0x00FFFFFF is BAD_PARAM.
    let mut del = cmd(0x202, 0, 16);
    put32(&mut del, 8, 0x00ff_ffff);
    assert_eq!(d.exec(&del, 16).status(), BAD_PARAM);
    // PA mode whole-memory key (length64).
    let mut c = cmd(0x200, 0, 0x110);
    c[0x12] = 0x3c;
    put32(&mut c, 0x14, 0xffff_ff00);
    put32(&mut c, 0x1c, 0x8000_0000 | pd);
    let o = d.ok(&c, 16);
    let info = d.model.mkey((be32(&o, 8) & 0xff_ffff) << 8).unwrap();
    assert!(info.length64);
    assert_eq!(info.translate(0x1234, 8), Some(vec![(0x1234, 8)]));
}

#[test]
fn teardown_then_disable() {
    let mut d = up();
    let pd = be32(&d.ok(&cmd(0x800, 0, 16), 16), 8);
    assert_eq!(d.exec(&cmd(0x105, 0, 16), 16).status(), BAD_SYS_STATE, "disable while initialized");
    let mut t = cmd(0x103, 0, 16);
    put32(&mut t, 8, 2);
    assert_eq!(d.exec(&t, 16).status(), BAD_PARAM, "prepare-fast-teardown not modelled");
    d.ok(&cmd(0x103, 0, 16), 16);
    assert!(!d.model.pd_exists(pd));
    // All pages come back after teardown.
    let mut take = cmd(0x108, 2, 16);
    put32(&mut take, 12, 0x4000);
    let o = d.ok(&take, 16 + 8 * 0x4000);
    assert_eq!(be32(&o, 8), 6 + 0x3244);
    d.ok(&cmd(0x105, 0, 16), 16);
}

#[test]
fn delivery_errors() {
    let mut d = Drv::new();
    // Bad type.
    let a = d.post(0, &cmd(0x104, 0, 16), 16);
    d.ram.write(a, &[3]).unwrap();
    d.ring(1);
    assert_eq!(d.read_result(0, 16).delivery, 0x10);
    // Bad token in the input mailbox.
    d.ok(&cmd(0x104, 0, 16), 16);
    d.post(0, &cmd(0x109, 0, 0x1010), 16);
    d.ram.write(common::MBOX_IN + 0x23d, &[0xee]).unwrap();
    d.ring(1);
    assert_eq!(d.read_result(0, 16).delivery, 0x2);
    // Bad block number in the second block.
    d.post(0, &cmd(0x109, 0, 0x1010), 16);
    d.ram.write_be32(common::MBOX_IN + 1024 + 0x238, 5).unwrap();
    d.ring(1);
    assert_eq!(d.read_result(0, 16).delivery, 0x3);
    // Input pointer not aligned.
    let a = d.post(0, &cmd(0x109, 0, 0x1010), 16);
    d.ram.write_be64(a + 8, common::MBOX_IN + 0x40).unwrap();
    d.ring(1);
    assert_eq!(d.read_result(0, 16).delivery, 0x5);
}

#[test]
fn signatures_when_enabled() {
    let mut d = Drv::new();
    d.ok(&cmd(0x104, 0, 16), 16);
    let cur = d.ok(&cmd(0x100, 1, 16), 0x1010);
    let mut s = cmd(0x109, 0, 0x1010);
    s[0x10..].copy_from_slice(&cur[0x10..]);
    s[0x10 + 0x42] |= 0xc0; // cmdif_checksum = 3
    d.ok(&s, 16);
    // Unsigned blocks are refused now; signed ones go through.
    d.post(0, &cmd(0x109, 0, 0x1010), 16);
    d.ring(1);
    assert_eq!(d.read_result(0, 16).delivery, 0x1);
    d.sign = true;
    d.ok(&cmd(0x10a, 0, 16), 0x70);
}

#[test]
fn several_slots_in_one_doorbell() {
    let mut d = Drv::new();
    d.ok(&cmd(0x104, 0, 16), 16);
    for slot in 0..4 {
        d.post(slot, &cmd(0x107, 1, 16), 16);
    }
    d.ring(0b1111);
    for slot in 0..4 {
        let r = d.read_result(slot, 16);
        assert_eq!((r.delivery, r.status(), be32(&r.out, 12)), (0, 0, 6));
    }
    assert_eq!(d.model.counters().commands, 5);
}

#[test]
fn trace_file_lines() {
    let path = std::env::temp_dir().join(format!("mlx5-model-trace-{}.jsonl", std::process::id()));
    let cfg = mlx5_model::ModelConfig { trace: Some(path.clone()), ..mlx5_model::ModelConfig::instant() };
    let mut d = Drv::with(cfg, 1 << 20);
    d.ok(&cmd(0x104, 0, 16), 16);
    assert_eq!(d.exec(&cmd(0x7ff, 3, 16), 16).status(), BAD_OP);
    drop(d);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    let line = |i: usize| -> serde_json::Value {
        serde_json::from_str(lines[i]).unwrap_or_else(|e| panic!("line {i} is not JSON ({e}): {}", lines[i]))
    };
    let (first, second) = (line(0), line(1));
    assert!(first["t_ns"].is_u64(), "{first}");
    let want = serde_json::json!({
        "t_ns": first["t_ns"],
        "slot": 0,
        "opcode": "0x104",
        "op_mod": 0,
        "status": 0,
        "syndrome": "0x0",
        "input": "01040000000000000000000000000000",
        "output": "00000000000000000000000000000000",
    });
    assert_eq!(first, want);
    assert_eq!((&second["opcode"], &second["op_mod"]), (&"0x7ff".into(), &3.into()), "{second}");
    assert_eq!((&second["status"], &second["syndrome"]), (&2.into(), &"0x7ff00ff".into()), "{second}");
    let _ = std::fs::remove_file(path);
}
