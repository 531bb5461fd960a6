//! The `log` backend: `[secs.micros] c<core> LEVEL message` on the serial console, timestamps from the TSC
//! since kernel entry.

use super::{percpu, serial};
use crate::time::Instant;

struct SerialLogger;

impl log::Log for SerialLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let t = Instant::now().since_boot();
        serial::write_locked(format_args!(
            "[{:5}.{:06}] c{} {:<5} {}\n",
            t.as_secs(),
            t.subsec_micros(),
            percpu::core_id(),
            r.level(),
            r.args()
        ));
    }

    fn flush(&self) {}
}

static LOGGER: SerialLogger = SerialLogger;

/// Installs the logger at `level`. Boot only.
pub fn init(level: log::LevelFilter) {
    // A second call (cannot happen on the boot path) would only keep the first logger.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}
