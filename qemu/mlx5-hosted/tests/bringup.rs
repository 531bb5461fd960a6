//! Bring-up and teardown as a real card needs them (docs/mlx5-driver.md, "Bring-up"): the pre-init wait
//! reports while it waits, the EQ is sized as Linux sizes its async EQ (within `log_max_eq_sz`), and teardown's
//! page reclaim retries rounds that bring nothing back.

mod common;

use std::time::Duration;

use leasebox_mlx5::driver::{ASYNC_EQ_LOG_SIZE, Config, Driver};
use leasebox_mlx5::engine::PAGES_PER_COMMAND;
use leasebox_mlx5::ifc::eq;
use mlx5_model::ModelConfig;
use mlx5_model::caps::cap_type::GENERAL;
use mlx5_model::fault::Fault;
use mlx5_model::ifc::Field;

const MANAGE_PAGES: u16 = leasebox_mlx5::ifc::opcode::MLX5_CMD_OP_MANAGE_PAGES;
/// `cmd_hca_cap.log_max_eq_sz` (`mlx5_ifc.h`, bit 0xe0, 8 bits).
const LOG_MAX_EQ_SZ: Field = Field::new(0xe0, 8);

#[test]
fn the_pre_init_wait_reports_while_it_waits() {
    let model = ModelConfig { init_delay: Duration::from_millis(350), ..common::model_config() };
    let cfg = Config { pre_init_timeout_ms: 5_000, pre_init_report_ms: 100, ..common::driver_config() };
    let d = common::up_with(model, cfg);
    assert!(d.info.pre_init_waited_ms >= 300, "waited {} ms", d.info.pre_init_waited_ms);
    assert!(d.info.pre_init_reports >= 2, "{} reports in {} ms", d.info.pre_init_reports, d.info.pre_init_waited_ms);
    // A firmware that is still initializing at the deadline: bring-up says how long it waited.
    let model = ModelConfig { init_delay: Duration::from_secs(30), ..common::model_config() };
    let cfg = Config { pre_init_timeout_ms: 200, pre_init_report_ms: 50, ..common::driver_config() };
    match Driver::bring_up(common::platform(model), cfg) {
        Err(e) => assert_eq!(e.to_string(), "firmware still initializing after 200 ms"),
        Ok(_) => panic!("bring-up went on while the firmware was initializing"),
    }
    // The default is Linux's: 120 s, reported every 20 s.
    let dflt = Config::default();
    assert_eq!((dflt.pre_init_timeout_ms, dflt.pre_init_report_ms), (120_000, 20_000));
}

#[test]
fn the_eq_is_sized_as_linux_sizes_its_async_eq() {
    assert_eq!(ASYNC_EQ_LOG_SIZE, 13, "order_base_2(0x1000 + 0x80)");
    let mut d = common::up();
    assert_eq!(d.info.log_eq_size, ASYNC_EQ_LOG_SIZE);
    let info = eq::parse_query_eq(&d.exec(eq::query_eq(d.info.eqn)).unwrap());
    assert_eq!(info.log_eq_size, 13);
    d.teardown().unwrap_or_else(|(r, e)| panic!("teardown: {e} ({r:?})"));

    // A device that allows fewer entries gets its maximum.
    let p = common::platform(common::model_config());
    for current in [false, true] {
        p.model().unwrap().hca_mut().caps.set_field(GENERAL, current, LOG_MAX_EQ_SZ, 10);
    }
    let mut d = Driver::bring_up(p, common::driver_config()).unwrap_or_else(|e| panic!("bring-up: {e}"));
    assert_eq!(d.info.log_eq_size, 10);
    let info = eq::parse_query_eq(&d.exec(eq::query_eq(d.info.eqn)).unwrap());
    assert_eq!(info.log_eq_size, 10);
}

#[test]
fn page_reclaim_retries_a_round_that_brings_nothing_back() {
    let d = common::up();
    let p = d.platform().clone();
    let given = d.cmd.pages().given();
    // Every MANAGE_PAGES take of the first round fails (the firmware keeps its pages for now).
    let batches = given.div_ceil(PAGES_PER_COMMAND) as u32;
    p.model().unwrap().inject(Fault::Fail { opcode: MANAGE_PAGES, count: batches, status: 0x4, syndrome: 0x1234 });
    let report = d.teardown().unwrap_or_else(|(r, e)| panic!("teardown: {e} ({r:?})"));
    assert_eq!((report.pages_before, report.pages_left), (given, 0), "{report:?}");
    assert!(report.reclaim_rounds >= 2, "{report:?}");
    assert!(report.disable_hca, "{report:?}");
    assert_eq!(p.model().unwrap().hca().pages.owned(), 0);
}

#[test]
fn a_function_left_initialised_is_brought_down_and_up_again() {
    // A VM rebooted with the card live: the function is still enabled and initialised by the previous owner.
    let model = ModelConfig { left_initialized: true, ..common::model_config() };
    let p = common::platform(model);
    assert_eq!(p.model().unwrap().state(), mlx5_model::FnState::Initialized);
    let mut d = Driver::bring_up(p.clone(), common::driver_config()).unwrap_or_else(|e| panic!("bring-up: {e}"));
    assert!(d.info.previous_owner);
    // Brought up from scratch afterwards: ISSI, boot and init pages, INIT_HCA, the EQ.
    assert_eq!((d.info.issi, d.info.boot_pages, d.info.init_pages), (1, 6, 0x3244));
    assert_eq!(p.model().unwrap().state(), mlx5_model::FnState::Initialized);
    let pd = d.alloc_pd().unwrap();
    d.dealloc_pd(pd).unwrap();
    let report = d.teardown().unwrap_or_else(|(r, e)| panic!("teardown: {e} ({r:?})"));
    assert!(report.disable_hca && report.pages_left == 0, "{report:?}");
    assert_eq!(p.model().unwrap().state(), mlx5_model::FnState::Disabled);
    // A fresh function takes no detour.
    assert!(!common::up().info.previous_owner);
}
