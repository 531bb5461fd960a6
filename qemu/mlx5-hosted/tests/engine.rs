//! The driver against the in-process model: bring-up and teardown, the command engine under load and under
//! faults (timeouts with quarantine, fatal health, hangs, page requests during commands, each error class),
//! and MKEY variant rotation.

mod common;

use std::time::Duration;

use leasebox_mlx5::command::{ErrorKind, status_name};
use leasebox_mlx5::driver::{Config, PortState};
use leasebox_mlx5::engine::Event;
use leasebox_mlx5::health::Fatal;
use leasebox_mlx5::ifc;
use leasebox_mlx5::ifc::mkey::MkeyAccess;
use leasebox_mlx5::platform::Platform;
use mlx5_model::ModelConfig;
use mlx5_model::events::PageRequest as ModelPageRequest;
use mlx5_model::fault::Fault;

// ACCESS_REG (a PAOS read) is the cheap command the engine tests use.
use leasebox_mlx5::ifc::opcode::{MLX5_CMD_OP_ACCESS_REG as ACCESS_REG, MLX5_CMD_OP_CREATE_MKEY as CREATE_MKEY};

#[test]
fn bring_up_reports_the_hca_and_teardown_returns_every_page() {
    let d = common::up();
    let i = &d.info;
    assert_eq!(i.part, "ConnectX-5");
    assert_eq!((i.fw.major, i.fw.minor, i.fw.subminor), (16, 35, 4030));
    assert_eq!(i.issi, 1);
    assert_eq!((i.boot_pages, i.init_pages), (6, 0x3244));
    assert_eq!(i.port, PortState::Active);
    assert_eq!(i.mac, [0x02, 0x4c, 0x42, 0x00, 0x00, 0x01]);
    assert!(i.roce, "RoCE enabled on the vport");
    assert!(i.mtu >= 1024, "port MTU {}", i.mtu);
    assert!(i.uar.0 >= 0x10, "the model hands out UARs from 0x10");
    let p = d.platform().clone();
    let given = d.cmd.pages().given();
    assert_eq!(given, 6 + 0x3244);
    assert_eq!(p.model().unwrap().hca().pages.owned(), given);
    let free_before = p.dma_free_bytes();
    let report = d.teardown().unwrap_or_else(|(r, e)| panic!("teardown failed: {e} ({r:?})"));
    assert!(report.teardown_hca && report.disable_hca, "{report:?}");
    assert_eq!((report.pages_before, report.pages_left), (given, 0));
    assert_eq!(p.model().unwrap().hca().pages.owned(), 0, "the model holds no page after teardown");
    assert_eq!(p.model().unwrap().state(), mlx5_model::FnState::Disabled);
    // Every page and the queue memory went back to the platform.
    assert!(p.dma_free_bytes() >= free_before + given as u64 * 4096);
}

#[test]
fn a_command_that_never_completes_times_out_and_its_slot_stays_quarantined() {
    let mut d =
        common::up_with(common::model_config(), Config { cmd_timeout_ms: Some(300), ..common::driver_config() });
    d.platform().model().unwrap().inject(Fault::Hang { opcode: ACCESS_REG });
    let e = d.exec(ifc::vport::paos_query(1)).unwrap_err();
    // Causal, not a stopwatch: the queue's deadline is the configured one, and the driver's own clock had
    // passed it when the command was given up.
    assert_eq!(d.cmd.queue().timeout_ms(), 300);
    assert!(matches!(e.kind, ErrorKind::Timeout { waited_ms, .. } if waited_ms >= 300), "{e}");
    assert_eq!(e.opcode, ACCESS_REG);
    assert_eq!(d.cmd.queue().quarantined(), 1);
    // The engine keeps serving the others on the remaining slots.
    for _ in 0..100 {
        d.alloc_pd().expect("other commands still run");
    }
    // A second hung command quarantines a second slot; neither is reused.
    assert!(matches!(d.exec(ifc::vport::paos_query(1)).unwrap_err().kind, ErrorKind::Timeout { .. }));
    assert_eq!(d.cmd.queue().quarantined(), 2);
    let log: Vec<_> = d.cmd.queue().log().records().filter(|r| r.opcode == ACCESS_REG).copied().collect();
    assert!(log.iter().filter(|r| r.outcome == leasebox_mlx5::log::Outcome::Timeout).count() >= 2);
    assert_eq!(d.cmd.queue().log().counters.timeouts, 2);
}

#[test]
fn a_slot_leaves_quarantine_when_the_late_completion_arrives() {
    let mut d =
        common::up_with(common::model_config(), Config { cmd_timeout_ms: Some(200), ..common::driver_config() });
    d.platform().model().unwrap().inject(Fault::Delay { opcode: ACCESS_REG, delay: Duration::from_millis(600) });
    let e = d.exec(ifc::vport::paos_query(1)).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Timeout { .. }), "{e}");
    assert_eq!(d.cmd.queue().quarantined(), 1);
    let p = d.platform().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while d.cmd.queue().quarantined() > 0 && std::time::Instant::now() < deadline {
        d.pump();
        p.relax();
    }
    assert_eq!(d.cmd.queue().quarantined(), 0, "the slot is free again after the firmware completed it");
    assert_eq!(d.cmd.queue().log().counters.late, 1);
}

#[test]
fn thirty_one_commands_in_flight_at_once() {
    let mut d = common::up();
    let p = d.platform().clone();
    // Hold every command long enough to see them all posted: 30 regular ones and a page command on the
    // reserved slot, driven by a PAGE_REQUEST the model raises. Slot 30 stays for the fatal path's command.
    {
        let mut m = p.model().unwrap();
        m.inject(Fault::Delay { opcode: ACCESS_REG, delay: Duration::from_millis(300) });
        m.inject(Fault::Delay { opcode: ifc::opcode::MLX5_CMD_OP_MANAGE_PAGES, delay: Duration::from_millis(300) });
    }
    let slots = d.cmd.queue().slots();
    assert_eq!(slots, 32);
    let mut tags = Vec::new();
    for _ in 0..slots - 2 {
        tags.push(d.client.submit(ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap());
    }
    assert_eq!(p.model().unwrap().request_pages(16), 1, "the model wrote one PAGE_REQUEST EQE");
    let mut max_in_flight = 0;
    let mut done = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while done.len() < tags.len() && std::time::Instant::now() < deadline {
        d.pump();
        max_in_flight = max_in_flight.max(d.cmd.queue().in_flight());
        while let Some(c) = d.client.poll() {
            done.push(c);
        }
        p.relax();
    }
    assert_eq!(max_in_flight, 31, "every slot but the fatal path's held a command at the same time");
    assert_eq!(done.len(), 30);
    for c in &done {
        let out = c.result.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ifc::vport::paos_out(out).oper_status, 1);
    }
    let mut got: Vec<u64> = done.iter().map(|c| c.tag).collect();
    got.sort();
    assert_eq!(got, tags);
    while !d.cmd.pages().idle() && std::time::Instant::now() < deadline {
        d.pump();
        p.relax();
    }
    assert_eq!(d.cmd.pages().given(), 6 + 0x3244 + 16, "the page request was served");
}

#[test]
fn a_page_request_during_a_command_is_served_on_the_page_slot() {
    let model = ModelConfig {
        page_request: Some(ModelPageRequest { opcode: CREATE_MKEY, num_pages: 32, times: 1 }),
        ..common::model_config()
    };
    let mut d = common::up_with(model, common::driver_config());
    let pd = d.alloc_pd().unwrap();
    let before = d.cmd.pages().given();
    let page = d.platform().dma_alloc(4096, 4096).unwrap().addr();
    // The model holds this CREATE_MKEY until it owns 32 more pages; exec keeps both engines running, so the
    // PAGE_REQUEST EQE is seen and MANAGE_PAGES goes out on the reserved slot.
    let mkey = d.create_mkey(pd, page, 4096, MkeyAccess::REMOTE_WRITE | MkeyAccess::LOCAL_READ, 12, &[page]).unwrap();
    assert_eq!(d.cmd.pages().given(), before + 32);
    assert!(d.client.shared().page_requests.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    assert_eq!(d.query_mkey(mkey).unwrap().pd, pd);
}

#[test]
fn fatal_health_fails_in_flight_and_later_commands_at_once() {
    let cfg = Config { health_interval_ms: 50, cmd_timeout_ms: Some(60_000), ..common::driver_config() };
    let mut d = common::up_with(common::model_config(), cfg);
    let p = d.platform().clone();
    p.model().unwrap().inject(Fault::Delay { opcode: ACCESS_REG, delay: Duration::from_secs(30) });
    let tag = d.client.submit(ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
    for _ in 0..10 {
        d.pump();
        p.relax();
    }
    assert_eq!(d.cmd.queue().in_flight(), 1);
    p.model().unwrap().inject(Fault::HealthFatal { synd: 0x8, rfr: false });
    let t0 = std::time::Instant::now();
    let c = loop {
        d.pump();
        p.relax();
        if let Some(c) = d.client.poll() {
            break c;
        }
        // Wall clock stays: a hang guard only (the model's health buffer changes on its own real-time timer).
        assert!(t0.elapsed() < Duration::from_secs(2), "the in-flight command was not failed");
    };
    assert_eq!(c.tag, tag);
    let e = c.result.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Fatal { health_syndrome: 0x8 }, "{e}");
    assert!(format!("{e}").contains("internal error"), "{e}");
    // Later commands fail at once, without waiting for any timeout: refused before they are posted.
    let submitted = d.cmd.queue().log().counters.submitted;
    let e = d.alloc_pd().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Fatal { health_syndrome: 0x8 });
    assert_eq!(d.cmd.queue().log().counters.submitted, submitted, "never posted, so never waited for");
    assert_eq!(d.client.fatal(), Some(0x8));
    let events: Vec<Event> = std::iter::from_fn(|| d.next_event()).collect();
    assert!(
        events.iter().any(|e| matches!(e, Event::Fatal(Fatal::Syndrome { synd: 0x8, rfr: false, .. }))),
        "the user is told, although stock firmware's rfr is 0: {events:?}"
    );
}

/// Rule: an overrun of the async EQ puts the firmware in internal error (health syndrome 0xc, stock `rfr` 0);
/// the driver's health poll declares the HCA fatal from the syndrome alone and commands fail at once.
#[test]
fn an_async_eq_overrun_is_fatal() {
    let cfg = Config { health_interval_ms: 50, log_eq_size: 2, ..common::driver_config() };
    let mut d = common::up_with(common::model_config(), cfg);
    let p = d.platform().clone();
    {
        // PORT_CHANGE events, more than the 4-entry EQ holds, while the event engine does not run.
        let mut m = p.model().unwrap();
        let ram = m.ram().clone();
        for i in 0..5 {
            let s = if i % 2 == 0 { mlx5_model::port::PORT_DOWN } else { mlx5_model::port::PORT_UP };
            mlx5_model::port::set_oper(m.hca_mut(), ram.as_ref(), s);
        }
        assert!(m.hca().eqs.overrun(), "the EQ overran");
    }
    let t0 = std::time::Instant::now();
    while d.client.fatal().is_none() {
        d.pump();
        p.relax();
        // Wall clock stays: a hang guard only (the model's health buffer changes on its own real-time timer).
        assert!(t0.elapsed() < Duration::from_secs(10), "the overrun was not found fatal");
    }
    assert_eq!(d.client.fatal(), Some(0xc));
    let e = d.alloc_pd().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Fatal { health_syndrome: 0xc });
    let events: Vec<Event> = std::iter::from_fn(|| d.next_event()).collect();
    assert!(
        events.iter().any(|e| matches!(e, Event::Fatal(Fatal::Syndrome { synd: 0xc, rfr: false, .. }))),
        "{events:?}"
    );
}

#[test]
fn a_stopped_health_counter_is_a_hang_after_three_polls() {
    let cfg = Config { health_interval_ms: 30, ..common::driver_config() };
    let model = ModelConfig { health_period: Duration::from_millis(5), ..common::model_config() };
    let mut d = common::up_with(model, cfg);
    let p = d.platform().clone();
    // Healthy for a while: the counter moves.
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(200) {
        d.pump();
        p.relax();
    }
    assert_eq!(d.client.fatal(), None);
    p.model().unwrap().inject(Fault::HealthCounter { stopped: true });
    let polls = d.events.health().polls;
    // Wall clock stays in the loop as a hang guard only: the driver's health polls follow real time here.
    let t1 = std::time::Instant::now();
    while d.client.fatal().is_none() && t1.elapsed() < Duration::from_secs(2) {
        d.pump();
        p.relax();
    }
    assert!(d.events.health().verdict().is_some_and(|f| matches!(f, Fatal::Hang { .. })));
    // Counted, not timed: the verdict took MAX_MISSES polls that saw the counter stopped.
    let after = d.events.health().polls - polls;
    assert!(after >= u64::from(leasebox_mlx5::health::MAX_MISSES), "a hang after {after} polls");
    assert!(matches!(d.alloc_pd().unwrap_err().kind, ErrorKind::Fatal { .. }));
}

#[test]
fn every_error_class_is_reported_with_its_name_and_syndrome() {
    let mut d = common::up();
    let p = d.platform().clone();
    for status in [0x01u8, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0f, 0x10, 0x30, 0x40, 0x50, 0x51] {
        let syndrome = 0x5000_0000 | u32::from(status);
        p.model().unwrap().inject(Fault::Fail { opcode: ACCESS_REG, count: 1, status, syndrome });
        let e = d.exec(ifc::vport::paos_query(1)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Status { status, syndrome });
        assert_eq!((e.opcode, e.status(), e.syndrome()), (ACCESS_REG, Some(status), Some(syndrome)));
        let text = format!("{e}");
        assert!(text.contains("ACCESS_REG") && text.contains(status_name(status)), "{text}");
        assert_ne!(status_name(status), "UNKNOWN_STATUS");
        // The next one is fine again.
        d.exec(ifc::vport::paos_query(1)).unwrap();
    }
    assert_eq!(d.cmd.queue().log().counters.failed, 16);
}

#[test]
fn mkey_variants_rotate_on_every_create() {
    let mut d = common::up();
    let pd = d.alloc_pd().unwrap();
    let page = d.platform().dma_alloc(4096, 4096).unwrap().addr();
    let access = MkeyAccess::REMOTE_READ | MkeyAccess::REMOTE_WRITE | MkeyAccess::LOCAL_READ;
    let mut keys = Vec::new();
    for _ in 0..4 {
        let k = d.create_mkey(pd, page, 4096, access, 12, &[page]).unwrap();
        keys.push(k);
        d.destroy_mkey(k).unwrap();
    }
    for w in keys.windows(2) {
        assert_eq!(w[1].variant(), w[0].variant().wrapping_add(1), "{keys:?}");
        assert_ne!(w[0].0, w[1].0, "a re-created index never yields the same key");
    }
    // The destroyed key is refused.
    let e = d.query_mkey(keys[0]).map(|i| i.free);
    assert!(e.is_err() || e == Ok(true), "{e:?}");
}

/// Pumps the engines until `done` holds; panics after 10 s.
fn pump_until(d: &mut common::Hosted, what: &str, mut done: impl FnMut(&mut common::Hosted) -> bool) {
    let p = d.platform().clone();
    let t0 = std::time::Instant::now();
    while !done(d) {
        // Wall clock stays: a hang guard only (the model's timers and the driver's health polls run in real time).
        assert!(t0.elapsed() < Duration::from_secs(10), "gave up waiting for {what}");
        d.pump();
        p.relax();
    }
}

#[test]
fn the_side_client_has_its_own_rings_and_gets_its_own_completions_back() {
    let mut d = common::up();
    let p = d.platform().clone();
    let mut side = d.cmd.side_client().expect("the first side client");
    assert!(d.cmd.side_client().is_none(), "one owner only");
    // Hold every command a while, so both sides' commands are in flight together.
    p.model().unwrap().inject(Fault::Delay { opcode: ACCESS_REG, delay: Duration::from_millis(100) });
    // The same tags on both sides: each side gets its own back, unmarked.
    let n = leasebox_mlx5::engine::SIDE_REQUEST_RING as u64;
    for tag in 1..=n {
        d.client.submit_as(tag, ifc::vport::paos_query(1)).map_err(|_| "main ring full").unwrap();
        side.submit_as(tag, ifc::vport::paos_query(1)).map_err(|_| "side ring full").unwrap();
    }
    assert!(side.submit(ifc::vport::paos_query(1)).is_err(), "the side's ring is full: the command comes back");
    assert_eq!(side.room(), 0);
    let (mut main_done, mut side_done) = (Vec::new(), Vec::new());
    let mut both_in_flight = 0;
    pump_until(&mut d, "both sides' completions", |d| {
        both_in_flight = both_in_flight.max(d.cmd.queue().in_flight());
        main_done.extend(std::iter::from_fn(|| d.client.poll()));
        side_done.extend(std::iter::from_fn(|| side.poll()));
        main_done.len() == n as usize && side_done.len() == n as usize
    });
    assert_eq!(both_in_flight, 2 * n as usize, "the engine took requests from both rings");
    for done in [&main_done, &side_done] {
        let mut tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
        tags.sort();
        assert_eq!(tags, (1..=n).collect::<Vec<_>>());
        assert!(done.iter().all(|c| c.result.as_ref().is_ok_and(|o| ifc::vport::paos_out(o).oper_status == 1)));
    }
    // The side's own counter starts at 1 too, and `exec` on the main client is untouched by the side.
    let t = side.submit(ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
    d.exec(ifc::vport::paos_query(1)).unwrap();
    pump_until(&mut d, "the side's completion", |_| side.poll().is_some_and(|c| c.tag == t && c.result.is_ok()));
    assert!(d.take_stashed().is_empty(), "nothing of the side's reached the main client");
}

#[test]
fn a_side_client_that_keeps_its_ring_full_does_not_starve_the_main_client_or_lose_completions() {
    let mut d = common::up();
    let mut side = d.cmd.side_client().unwrap();
    // The side refills its ring on every pass and never reads its completions for a while: they wait in the
    // engine (more than its completion ring holds), and the main client's commands still go through.
    let mut side_sent = 0u64;
    for _ in 0..20 {
        while side.submit(ifc::vport::paos_query(1)).is_ok() {
            side_sent += 1;
        }
        d.exec(ifc::vport::paos_query(1)).expect("the main client is served while the side keeps its ring full");
    }
    assert!(side_sent > 2 * leasebox_mlx5::engine::SIDE_COMPLETION_RING as u64, "{side_sent}");
    let mut got = Vec::new();
    pump_until(&mut d, "every side completion", |_| {
        got.extend(std::iter::from_fn(|| side.poll()));
        got.len() as u64 == side_sent
    });
    got.sort_by_key(|c| c.tag);
    assert_eq!(got.iter().map(|c| c.tag).collect::<Vec<_>>(), (1..=side_sent).collect::<Vec<_>>(), "none dropped");
    assert!(got.iter().all(|c| c.result.is_ok()));
}

#[test]
fn fatal_health_fails_the_side_clients_in_flight_and_later_commands() {
    let cfg = Config { health_interval_ms: 50, cmd_timeout_ms: Some(60_000), ..common::driver_config() };
    let mut d = common::up_with(common::model_config(), cfg);
    let p = d.platform().clone();
    let mut side = d.cmd.side_client().unwrap();
    p.model().unwrap().inject(Fault::Hang { opcode: ACCESS_REG });
    let tag = side.submit(ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
    pump_until(&mut d, "the side's command in flight", |d| d.cmd.queue().in_flight() == 1);
    p.model().unwrap().inject(Fault::HealthFatal { synd: 0x8, rfr: true });
    let mut c = None;
    pump_until(&mut d, "the side's command to fail", |_| {
        c = side.poll();
        c.is_some()
    });
    let c = c.unwrap();
    assert_eq!(c.tag, tag);
    // Failed by the verdict, not by the 60 s command timeout (that would be a Timeout, and counted as one).
    assert_eq!(c.result.unwrap_err().kind, ErrorKind::Fatal { health_syndrome: 0x8 });
    assert_eq!(d.cmd.queue().log().counters.timeouts, 0);
    assert_eq!(side.fatal(), Some(0x8));
    // A later side command fails at once too.
    let t = side.submit(ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
    let mut c = None;
    pump_until(&mut d, "the later side command to fail", |_| {
        c = side.poll();
        c.is_some()
    });
    let c = c.unwrap();
    assert_eq!((c.tag, c.result.unwrap_err().kind), (t, ErrorKind::Fatal { health_syndrome: 0x8 }));
}

/// A tag with a bit outside `CLIENT_TAG_BITS` is refused on either side, in release builds too (this test runs
/// under `--release` as well): nothing reaches the HCA, and the error names the tag. Masking it instead would
/// hand the completion back under another tag, where its caller would never find it.
#[test]
fn a_tag_with_a_reserved_bit_is_refused_not_masked() {
    use leasebox_mlx5::engine::{CLIENT_TAG_BITS, Refused};
    let mut d = common::up();
    let mut side = d.cmd.side_client().expect("the first side client");
    let submitted = d.cmd.queue().log().counters.submitted;
    for bit in [62u32, 63] {
        let tag = (1u64 << bit) | 7;
        for r in [d.client.submit_as(tag, ifc::vport::paos_query(1)), side.submit_as(tag, ifc::vport::paos_query(1))] {
            let Err(Refused::ReservedTag(e)) = r else { panic!("bit {bit}: {r:?}") };
            assert_eq!(e.kind, ErrorKind::ReservedTag { tag });
            assert_eq!(e.opcode, ACCESS_REG);
            let msg = e.to_string();
            assert!(msg.contains(&format!("{tag:#x}")) && msg.contains("reserves"), "{msg}");
        }
    }
    // The highest tag a client may use goes through and comes back as it was.
    d.client.submit_as(CLIENT_TAG_BITS, ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
    side.submit_as(CLIENT_TAG_BITS, ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
    let (mut main_tag, mut side_tag) = (None, None);
    pump_until(&mut d, "both completions", |d| {
        main_tag = main_tag.or_else(|| d.client.poll().map(|c| c.tag));
        side_tag = side_tag.or_else(|| side.poll().map(|c| c.tag));
        main_tag.is_some() && side_tag.is_some()
    });
    assert_eq!((main_tag, side_tag), (Some(CLIENT_TAG_BITS), Some(CLIENT_TAG_BITS)));
    assert_eq!(d.cmd.queue().log().counters.submitted, submitted + 2, "the refused ones never reached the queue");
}

/// A client with a waker (the engines' thread, where it sleeps when idle: `mlx5_hosted::spawn_engines`) wakes
/// it for every command it queues, on either side, and for none it refuses.
#[test]
fn every_queued_command_wakes_the_engine_and_a_refused_one_does_not() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::task::{Wake, Waker};
    #[derive(Default)]
    struct Count(AtomicU32);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let mut d = common::up();
    let mut side = d.cmd.side_client().expect("the first side client");
    let (main_wakes, side_wakes) = (Arc::new(Count::default()), Arc::new(Count::default()));
    d.client.set_waker(Waker::from(main_wakes.clone()));
    side.set_waker(Waker::from(side_wakes.clone()));
    let n = |c: &Arc<Count>| c.0.load(Ordering::SeqCst);
    d.client.submit(ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
    d.client.submit_as(5, ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
    side.submit(ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
    assert_eq!((n(&main_wakes), n(&side_wakes)), (2, 1));
    assert!(d.client.submit_as(1 << 63, ifc::vport::paos_query(1)).is_err());
    assert!(side.submit_as(1 << 62, ifc::vport::paos_query(1)).is_err());
    assert_eq!((n(&main_wakes), n(&side_wakes)), (2, 1), "a refused command wakes nobody");
    let mut done = 0;
    pump_until(&mut d, "the three completions", |d| {
        while d.client.poll().is_some() {
            done += 1;
        }
        while side.poll().is_some() {
            done += 1;
        }
        done == 3
    });
}

/// Rule (docs/mlx5-driver.md, "Health"): a firmware assert with stock `rfr` 0 is reported and counted, not
/// fatal while the firmware runs; the model's assert also stops the command interface, so the next command
/// times out — and a timeout while a reported syndrome shows is fatal.
#[test]
fn an_assert_is_reported_and_a_command_timeout_after_it_is_fatal() {
    let cfg = Config { health_interval_ms: 50, cmd_timeout_ms: Some(300), ..common::driver_config() };
    // The counter ticks faster than the driver polls: no hang verdict, only the assert.
    let model = ModelConfig { health_period: Duration::from_millis(5), ..common::model_config() };
    let mut d = common::up_with(model, cfg);
    let p = d.platform().clone();
    p.model().unwrap().inject(Fault::HealthFatal { synd: 0x1, rfr: false });
    let t0 = std::time::Instant::now();
    while d.events.health().reports == 0 {
        d.pump();
        p.relax();
        // Wall clock stays: a hang guard only (the model's health buffer changes on its own real-time timer).
        assert!(t0.elapsed() < Duration::from_secs(5), "the assert was not reported");
    }
    assert_eq!(d.client.fatal(), None, "reported, not fatal");
    assert_eq!(d.events.health().last_report().map(|r| r.synd), Some(0x1));
    let e = d.alloc_pd().unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Timeout { .. }), "{e}");
    let t1 = std::time::Instant::now();
    while d.client.fatal().is_none() {
        d.pump();
        p.relax();
        // Wall clock stays: a hang guard only.
        assert!(t1.elapsed() < Duration::from_secs(5), "the timeout after the assert was not found fatal");
    }
    assert_eq!(d.client.fatal(), Some(0x1));
    let events: Vec<Event> = std::iter::from_fn(|| d.next_event()).collect();
    assert!(
        events.iter().any(|e| matches!(e, Event::Fatal(Fatal::Syndrome { synd: 0x1, rfr: false, .. }))),
        "{events:?}"
    );
}
