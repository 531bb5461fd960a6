//! The model thread and the engines' thread sleep when idle and wake for work (`mlx5_hosted::idle`): after a
//! quiet spell long enough for both to be deep in their back-off (sleeps of `idle::MAX_SLEEP`), a command
//! still completes in far less than that sleep — the client's submit unparks the engines, the doorbell ends
//! the model's sleep, the completion unparks the engines again.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use leasebox_mlx5::driver::Driver;
use leasebox_mlx5::ifc;
use mlx5_hosted::{HostedPlatform, ModelMode, idle};
use mlx5_model::ModelConfig;

#[test]
fn a_command_after_a_quiet_spell_does_not_wait_for_the_sleepers() {
    let p = Arc::new(HostedPlatform::with_model(ModelConfig::instant(), common::RAM_BYTES, ModelMode::Thread));
    let d = Driver::bring_up(p.clone(), common::driver_config()).unwrap_or_else(|e| panic!("bring-up: {e}"));
    let (cmd, ev, mut client, _) = d.into_engines();
    let stop = Arc::new(AtomicBool::new(false));
    let engines = mlx5_hosted::spawn_engines(cmd, ev, &mut client, stop.clone()).unwrap();
    let mut took = Vec::new();
    for _ in 0..9 {
        // Both threads back off to their longest sleep within a few milliseconds.
        std::thread::sleep(idle::MAX_SLEEP * 5);
        let t0 = Instant::now();
        client.submit(ifc::vport::paos_query(1)).map_err(|_| "ring full").unwrap();
        let c = loop {
            if let Some(c) = client.poll() {
                break c;
            }
            // Wall clock stays: a hang guard only.
            assert!(t0.elapsed() < Duration::from_secs(10), "no completion within 10 s");
            std::thread::yield_now();
        };
        assert!(c.result.is_ok(), "{:?}", c.result);
        took.push(t0.elapsed());
    }
    took.sort();
    let median = took[took.len() / 2];
    eprintln!("command after {:?} idle: median {median:?}, all {took:?}", idle::MAX_SLEEP * 5);
    // Without the wake-ups each command would wait for the end of two sleeps of up to MAX_SLEEP. Wall clock
    // stays: the property is how soon real sleeping threads wake, which only real time shows.
    assert!(
        median < idle::MAX_SLEEP / 2,
        "a command after a quiet spell took {median:?} (median of {took:?}): the sleeping threads were not woken"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    engines.thread().unpark();
    engines.join().unwrap();
}
