//! The driver under the model's default firmware timing (docs/hca-model.md, "Command
//! timing and doorbells"): per-opcode latencies from the real trace, so bring-up takes INIT_HCA's ~185 ms and
//! commands in different slots complete out of order; per-slot doorbells (the hosted BARs' doorbell is
//! write-1-to-set). Takes about half a second of real time per test.

mod common;

use std::time::{Duration, Instant};

use leasebox_mlx5::driver::PortState;
use leasebox_mlx5::ifc;
use leasebox_mlx5::ifc::mkey::MkeyAccess;
use leasebox_mlx5::platform::Platform;
use mlx5_model::{Doorbells, ModelConfig, Timing};

#[test]
fn the_driver_handles_out_of_order_completions_under_firmware_timing() {
    // Firmware command timing (the default), without link training: this test is about commands.
    let model = ModelConfig { link_up_delay: Duration::ZERO, ..ModelConfig::default() };
    assert_eq!(model.timing, Timing::firmware(), "firmware timing is the default");
    let t0 = Instant::now();
    let mut d = common::up_with(model, common::driver_config());
    // Wall clock stays: what is checked is that the model's firmware timing holds commands for real time.
    assert!(
        t0.elapsed() >= mlx5_model::timing::INIT_HCA - mlx5_model::timing::MAX_JITTER,
        "bring-up waited for INIT_HCA's firmware time"
    );
    assert_eq!(d.info.port, PortState::Active);
    let p = d.platform().clone();
    {
        let m = p.model().unwrap();
        assert_eq!((m.timing(), m.doorbells()), (Timing::firmware(), Doorbells::PerSlot));
    }

    // A CREATE_MKEY (a context command, ~110 µs) first, then PAOS reads (~30 µs) in other slots: the later
    // ones finish first, and every result still reaches the command it belongs to.
    let pd = d.alloc_pd().unwrap();
    let page = p.dma_alloc(4096, 4096).unwrap().addr();
    let access = MkeyAccess::REMOTE_WRITE | MkeyAccess::LOCAL_READ;
    let mkey_tag = d.client.submit(ifc::mkey::create_mkey_pa(pd, 0x5a, page, Some(4096), access)).unwrap();
    let paos: Vec<u64> = (0..4).map(|_| d.client.submit(ifc::vport::paos_query(1)).unwrap()).collect();
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while done.len() < 5 && Instant::now() < deadline {
        d.pump();
        while let Some(c) = d.client.poll() {
            done.push(c);
        }
        p.relax();
    }
    assert_eq!(done.len(), 5, "every command completed");
    let order: Vec<u64> = done.iter().map(|c| c.tag).collect();
    assert_ne!(order[0], mkey_tag, "a later command completed before the CREATE_MKEY rung first: {order:?}");
    let slots: std::collections::BTreeSet<u8> = done.iter().map(|c| c.slot).collect();
    assert_eq!(slots.len(), 5, "each command had a slot of its own");
    for c in &done {
        let out = c.result.as_ref().unwrap_or_else(|e| panic!("tag {}: {e}", c.tag));
        if c.tag == mkey_tag {
            let key = ifc::mkey::create_mkey_out_key(out, 0x5a);
            let info = d.query_mkey(key).unwrap();
            assert_eq!((info.pd, info.start, info.len), (pd, page, 4096), "the CREATE_MKEY output went to its caller");
            d.destroy_mkey(key).unwrap();
        } else {
            assert!(paos.contains(&c.tag));
            assert_eq!(ifc::vport::paos_out(out).oper_status, 1, "a PAOS output went to a PAOS caller");
        }
    }
    d.dealloc_pd(pd).unwrap();
    assert_eq!(p.model().unwrap().counters().coalesced_doorbells, 0, "per-slot: nothing ran without its doorbell");
    let report = d.teardown().unwrap_or_else(|(r, e)| panic!("teardown: {e} ({r:?})"));
    assert_eq!(report.pages_left, 0);
}

/// With the model on its own thread (shared mappings, as the hosted appliance and the benchmarks run it) the
/// doorbell is write-1-to-set too: both threads reach it through one atomic word, so per-slot mode loses no
/// ring although the driver and the model really run at the same time.
#[test]
fn a_model_thread_runs_per_slot_under_firmware_timing() {
    use leasebox_mlx5::driver::Driver;
    use mlx5_hosted::{HostedPlatform, ModelMode};
    let p =
        std::sync::Arc::new(HostedPlatform::with_model(ModelConfig::default(), common::RAM_BYTES, ModelMode::Thread));
    assert_eq!(p.model().unwrap().doorbells(), Doorbells::PerSlot);
    let mut d = Driver::bring_up(p.clone(), common::driver_config()).unwrap_or_else(|e| panic!("bring-up: {e}"));
    let tags: Vec<u64> = (0..16).map(|_| d.client.submit(ifc::vport::paos_query(1)).unwrap()).collect();
    let mut done = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while done < tags.len() && Instant::now() < deadline {
        d.pump();
        while let Some(c) = d.client.poll() {
            assert!(c.result.is_ok(), "{:?}", c.result);
            done += 1;
        }
    }
    assert_eq!(done, tags.len(), "every command completed: no ring was lost");
    assert_eq!(p.model().unwrap().counters().coalesced_doorbells, 0);
    let report = d.teardown().unwrap_or_else(|(r, e)| panic!("teardown: {e} ({r:?})"));
    assert_eq!(report.pages_left, 0);
}
