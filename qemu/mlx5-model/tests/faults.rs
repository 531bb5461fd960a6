//! Fault injection (`mlx5_model::fault`) through the command queue, with the test-side driver.

mod common;

use std::time::Duration;

use common::{CMDQ, Drv, cmd};
use mlx5_model::ModelConfig;
use mlx5_model::fault::Fault;
use mlx5_model::mem::Memory;

const ENABLE_HCA: u16 = 0x104;
const QUERY_PAGES: u16 = 0x107;
const BAD_PARAM: u8 = 0x03;
const BAD_SYS_STATE: u8 = 0x04;

/// Whether the entry in `slot` is still owned by the device.
fn hw_owned(d: &Drv, slot: u32) -> bool {
    let mut b = [0u8; 1];
    d.ram.read(CMDQ + 64 * u64::from(slot) + 0x3f, &mut b).unwrap();
    b[0] & 1 == 1
}

#[test]
fn fail_next_n_commands_of_an_opcode() {
    let mut d = Drv::new();
    d.model.inject(Fault::Fail { opcode: ENABLE_HCA, count: 2, status: BAD_PARAM, syndrome: 0xdead_beef });
    for _ in 0..2 {
        let r = d.exec(&cmd(ENABLE_HCA, 0, 16), 16);
        assert_eq!((r.delivery, r.status(), r.syndrome()), (0, BAD_PARAM, 0xdead_beef));
    }
    // Not executed: the function is still disabled, and other opcodes were untouched.
    assert_eq!(d.model.state(), mlx5_model::FnState::Disabled);
    d.ok(&cmd(ENABLE_HCA, 0, 16), 16);
    assert_eq!(d.model.fault_counters().failed, 2);
}

#[test]
fn delay_completes_later_without_blocking_other_slots() {
    // Long enough that the checks below run within it even on a busy machine.
    let delay = Duration::from_millis(500);
    let mut d = Drv::new();
    d.model.inject(Fault::Delay { opcode: ENABLE_HCA, delay });
    d.post(0, &cmd(ENABLE_HCA, 0, 16), 16);
    d.ring(1);
    assert!(hw_owned(&d, 0));
    // Another slot runs meanwhile (QUERY_PAGES before ENABLE_HCA completes: bad system state).
    d.post(1, &cmd(QUERY_PAGES, 1, 16), 16);
    d.ring(2);
    assert_eq!(d.read_result(1, 16).status(), BAD_SYS_STATE);
    assert!(hw_owned(&d, 0));
    // Ringing the delayed slot again is ignored (the device owns it).
    d.ring(1);
    assert_eq!(d.model.fault_counters().rings_on_busy_slot, 1);
    std::thread::sleep(delay + Duration::from_millis(10));
    assert!(d.model.poll());
    let r = d.read_result(0, 16);
    assert_eq!((r.delivery, r.status()), (0, 0));
    assert_eq!(d.model.state(), mlx5_model::FnState::Enabled);
    assert_eq!(d.model.counters().commands, 2, "executed once");
}

#[test]
fn hang_never_completes_and_quarantines_the_slot() {
    let mut d = Drv::new();
    d.model.inject(Fault::Hang { opcode: ENABLE_HCA });
    d.post(0, &cmd(ENABLE_HCA, 0, 16), 16);
    d.ring(1);
    for _ in 0..10 {
        d.model.poll();
    }
    assert!(hw_owned(&d, 0));
    // Clearing the rule does not bring the lost command back; the slot stays the device's.
    d.model.inject(Fault::Clear);
    d.ring(1);
    assert!(hw_owned(&d, 0));
    // The driver moves on to another slot.
    d.post(1, &cmd(ENABLE_HCA, 0, 16), 16);
    d.ring(2);
    assert_eq!(d.read_result(1, 16).status(), 0);
    let c = d.model.fault_counters();
    assert_eq!((c.hung, c.rings_on_busy_slot), (1, 1));
}

#[test]
fn health_counter_stops_and_runs_again() {
    let cfg = ModelConfig { health_period: Duration::from_millis(5), ..ModelConfig::instant() };
    let mut d = Drv::with(cfg, 1 << 20);
    d.model.inject(Fault::HealthCounter { stopped: true });
    d.model.poll();
    let a = d.bar.read_be32(0x1010).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    d.model.poll();
    assert_eq!(d.bar.read_be32(0x1010).unwrap(), a);
    d.model.inject(Fault::HealthCounter { stopped: false });
    std::thread::sleep(Duration::from_millis(20));
    d.model.poll();
    assert!(d.bar.read_be32(0x1010).unwrap() > a);
}

#[test]
fn fatal_syndrome_sets_the_health_buffer_and_commands_are_not_answered() {
    let mut d = Drv::new();
    d.ok(&cmd(ENABLE_HCA, 0, 16), 16);
    d.model.inject(Fault::HealthFatal { synd: 0x7, rfr: true });
    // rfr as asked: Linux's fatal sensor needs rfr with synd.
    assert_dead(&mut d, 0x7, true);
    assert_eq!(d.model.fault_counters().ignored_after_fatal, 1);
    // Fatal is for good.
    d.model.inject(Fault::Clear);
    d.post(1, &cmd(QUERY_PAGES, 1, 16), 16);
    d.ring(2);
    assert!(hw_owned(&d, 1));
}

/// Stock firmware (`rfr` 0, its default): the same syndrome, severity and dead command interface, but no
/// reset request — the driver must not wait for `rfr` to call it fatal.
#[test]
fn fatal_syndrome_with_stock_rfr_leaves_rfr_clear() {
    let mut d = Drv::new();
    d.ok(&cmd(ENABLE_HCA, 0, 16), 16);
    let f = Fault::parse("health fatal 0x1").unwrap().unwrap();
    assert_eq!(f, Fault::HealthFatal { synd: 0x1, rfr: false }, "the control file's default is stock rfr 0");
    d.model.inject(f);
    // rfr stays 0, and the command interface is as dead as with rfr 1.
    assert_dead(&mut d, 0x1, false);
}

/// The health buffer after a firmware assert (`synd`, `rfr`, severity valid at LOGLEVEL_CRIT, the
/// `health_syndrome` byte of 0x1010), and a command posted in slot 0 that is never completed.
fn assert_dead(d: &mut Drv, synd: u8, rfr: bool) {
    let mut hb = [0u8; 0x40];
    d.bar.read(0x200, &mut hb).unwrap();
    assert_eq!(hb[0x3d], synd, "synd");
    assert_eq!(hb[0x38] & 0x80 != 0, rfr, "rfr");
    assert_eq!(hb[0x38] & 0x0f, 0x8 | 2, "severity valid, LOGLEVEL_CRIT");
    assert_eq!(d.bar.read_be32(0x1010).unwrap() >> 24, u32::from(synd), "health_syndrome");
    d.post(0, &cmd(QUERY_PAGES, 1, 16), 16);
    d.ring(1);
    for _ in 0..10 {
        d.model.poll();
    }
    assert!(hw_owned(d, 0), "a firmware in internal error does not complete commands, whatever rfr says");
}

#[test]
fn dropped_doorbell_is_ignored_once() {
    let mut d = Drv::new();
    d.model.inject(Fault::DropDoorbell);
    d.post(0, &cmd(ENABLE_HCA, 0, 16), 16);
    d.ring(1);
    assert!(hw_owned(&d, 0));
    assert_eq!(d.bar.read_be32(0x18).unwrap(), 0, "the ring was consumed");
    d.ring(1);
    assert_eq!(d.read_result(0, 16).status(), 0);
    assert_eq!(d.model.fault_counters().doorbells_dropped, 1);
}

#[test]
fn a_doorbell_overwritten_before_the_model_reads_it_is_not_lost() {
    let mut d = Drv::new();
    d.bring_up();
    // Two commands, one doorbell write each, both before the model polls: the second write replaces the
    // first in shared memory.
    d.post(0, &cmd(0x800, 0, 16), 16);
    d.post(1, &cmd(0x800, 0, 16), 16);
    d.bar.write_be32(0x18, 1).unwrap();
    d.bar.write_be32(0x18, 2).unwrap();
    assert!(d.model.poll());
    assert!(!hw_owned(&d, 0) && !hw_owned(&d, 1), "both ran");
    assert_eq!(d.model.counters().coalesced_doorbells, 1);
    // An entry handed to hardware with no doorbell at all stays put.
    d.post(2, &cmd(0x800, 0, 16), 16);
    for _ in 0..3 {
        d.model.poll();
    }
    assert!(hw_owned(&d, 2));
}

#[test]
fn a_dropped_doorbell_is_not_picked_up_by_a_later_one() {
    let mut d = Drv::new();
    d.bring_up();
    d.model.inject(Fault::DropDoorbell);
    d.post(0, &cmd(0x800, 0, 16), 16);
    d.ring(1);
    d.post(1, &cmd(0x800, 0, 16), 16);
    d.ring(2);
    assert!(hw_owned(&d, 0), "the dropped ring stays lost until slot 0 is rung again");
    assert!(!hw_owned(&d, 1));
    d.ring(1);
    assert!(!hw_owned(&d, 0));
}
