//! Boot configuration: `key=value` words from the kernel command line, optionally preceded by a
//! configuration module (a multiboot module whose command line is `leasebox.conf`, same syntax, `#` starts a
//! comment). Later words override earlier ones. Options are documented in `docs/operations.md`.
//!
//! Unknown keys are kept as warnings (printed at boot) rather than errors, so an image stays bootable when a
//! loader adds its own words; a known key with a bad value is an error that stops the boot with a message.
//! Checks that involve several options (`gw=` needs `ip=`) run once everything is applied ([`Config::check`]).
//!
//! The network and control-service options are parsed in [`crate::net_config`]. `tenant=` and `admin=` carry
//! secret keys: errors never show their values, and [`Redacted`] is how a command line reaches the log.
//!
//! Options of the layers above the kernel (the lease service's) are not the kernel's business: whoever boots
//! the kernel registers an [`OptionParser`] for them ([`Config::with_parsers`]), and every key the kernel does
//! not know goes to the registered parsers in order. A key none of them claims is unknown, as above.

use crate::console::ConsoleChoice;
use crate::net_config::{ControlConfig, NetConfig};
use core::fmt;
use spin::Mutex;

/// Parses the options of a layer above the kernel. Called once per word, in command-line order, at boot.
pub trait OptionParser: Sync + fmt::Debug {
    /// Applies one `key=value`: `Ok(false)` when `key` is not this parser's, `Err(reason)` for a bad value.
    fn apply(&self, key: &str, value: &str) -> Result<bool, &'static str>;
}

/// An [`OptionParser`] over a value of the layer's own type: the value behind a lock, and the function that
/// applies one key to it. A `static` in the image, a local in the hosted appliance; no allocation.
pub struct Options<T> {
    value: Mutex<T>,
    apply: fn(&mut T, &str, &str) -> Result<bool, &'static str>,
}

impl<T: Copy> Options<T> {
    /// The defaults and the layer's own parser (e.g. `LeaseOptions::apply`).
    pub const fn new(defaults: T, apply: fn(&mut T, &str, &str) -> Result<bool, &'static str>) -> Self {
        Options { value: Mutex::new(defaults), apply }
    }

    /// The options as parsed so far (the final value once the configuration is applied).
    pub fn get(&self) -> T {
        *self.value.lock()
    }
}

impl<T: Copy + Send + fmt::Debug> OptionParser for Options<T> {
    fn apply(&self, key: &str, value: &str) -> Result<bool, &'static str> {
        (self.apply)(&mut self.value.lock(), key, value)
    }
}

impl<T: Copy + fmt::Debug> fmt::Debug for Options<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Options").field(&self.get()).finish()
    }
}

/// Budget: the most cores a layout may name (matches the kernel's per-CPU table).
pub const MAX_CORES: usize = 64;
const MAX_WARNINGS: usize = 8;

/// What a core does. `Net` = network stack + lease service; `Cmd` = mlx5 command engine; `Event` = mlx5
/// event engine (EQ, CQs, health); `Idle` = nothing (a spare core that still reports in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Net,
    Cmd,
    Event,
    Idle,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Net, Role::Cmd, Role::Event, Role::Idle];
    pub fn name(self) -> &'static str {
        match self {
            Role::Net => "net",
            Role::Cmd => "cmd",
            Role::Event => "event",
            Role::Idle => "idle",
        }
    }
    fn bit(self) -> u8 {
        1 << self as u8
    }
    fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == s)
    }
}

/// The roles one core runs, round-robin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RoleSet(u8);

impl RoleSet {
    pub fn contains(self, r: Role) -> bool {
        self.0 & r.bit() != 0
    }
    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL.into_iter().filter(move |r| self.contains(*r))
    }
    fn with(self, r: Role) -> RoleSet {
        RoleSet(self.0 | r.bit())
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for RoleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            f.write_str(r.name())?;
        }
        Ok(())
    }
}

/// Which roles run on which core: entry i is core i (core 0 = the bootstrap processor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoreLayout {
    sets: [RoleSet; MAX_CORES],
    len: usize,
}

impl CoreLayout {
    /// docs/architecture.md's defaults: one CPU runs everything; two split net from the HCA engines; three or
    /// more give net, cmd and event a core each and leave the rest idle (the image asks for at most three, so
    /// that CPUs without a role are never started).
    pub fn default_for(cpus: usize) -> CoreLayout {
        let cpus = cpus.clamp(1, MAX_CORES);
        let mut l = CoreLayout { sets: [RoleSet::default(); MAX_CORES], len: cpus };
        let all = RoleSet::default().with(Role::Net).with(Role::Cmd).with(Role::Event);
        match cpus {
            1 => l.sets[0] = all,
            2 => {
                l.sets[0] = RoleSet::default().with(Role::Net);
                l.sets[1] = RoleSet::default().with(Role::Cmd).with(Role::Event);
            }
            _ => {
                l.sets[0] = RoleSet::default().with(Role::Net);
                l.sets[1] = RoleSet::default().with(Role::Cmd);
                l.sets[2] = RoleSet::default().with(Role::Event);
                for s in &mut l.sets[3..cpus] {
                    *s = RoleSet::default().with(Role::Idle);
                }
            }
        }
        l
    }

    /// Parses `net,cmd+event` style layouts: one comma-separated entry per core, each a `+`-joined set of
    /// roles. `net`, `cmd` and `event` must each appear exactly once.
    pub fn parse(s: &str) -> Result<CoreLayout, &'static str> {
        let mut l = CoreLayout { sets: [RoleSet::default(); MAX_CORES], len: 0 };
        for entry in s.split(',') {
            if l.len == MAX_CORES {
                return Err("more cores than the kernel supports (64)");
            }
            let mut set = RoleSet::default();
            for name in entry.split('+') {
                let r = Role::parse(name).ok_or("unknown role (expected net, cmd, event or idle)")?;
                if set.contains(r) {
                    return Err("a role is repeated within one core");
                }
                set = set.with(r);
            }
            l.sets[l.len] = set;
            l.len += 1;
        }
        for r in [Role::Net, Role::Cmd, Role::Event] {
            match l.cores().iter().filter(|s| s.contains(r)).count() {
                0 => return Err("net, cmd and event must each run on some core"),
                1 => {}
                _ => return Err("net, cmd and event must each run on exactly one core"),
            }
        }
        if l.cores().iter().any(|s| s.contains(Role::Idle) && s.0 != Role::Idle.bit()) {
            return Err("idle cannot be combined with other roles");
        }
        Ok(l)
    }

    pub fn cores(&self) -> &[RoleSet] {
        &self.sets[..self.len]
    }

    /// This layout with `idle` cores appended up to `cpus` cores (every CPU runs something).
    pub fn padded_to(mut self, cpus: usize) -> CoreLayout {
        while self.len < cpus.min(MAX_CORES) {
            self.sets[self.len] = RoleSet::default().with(Role::Idle);
            self.len += 1;
        }
        self
    }
}

/// The role watchdog's default patience (`watchdog_ms=`).
pub const DEFAULT_WATCHDOG_MS: u32 = 5_000;

/// Deliberate faults for the boot tests (`test=`): `pagefault` and `panic` run after the ready line;
/// `panic-after-lease` panics on the first lease request that follows a READY, so a lease is live and in use
/// when the fatal path runs (the `crash-fail-closed` scenario; docs/revoke-semantics.md, "Fail closed on crash");
/// `stall` stops core 0's role loop after the ready line, for another core's watchdog to notice (`fault-watchdog`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestHook {
    PageFault,
    Panic,
    PanicAfterLease,
    Stall,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ConfigError<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub reason: &'static str,
}

impl fmt::Display for ConfigError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if is_secret(self.key) { REDACTED } else { self.value };
        write!(f, "bad option {}={}: {}", self.key, value, self.reason)
    }
}

impl fmt::Debug for ConfigError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if is_secret(self.key) { REDACTED } else { self.value };
        f.debug_struct("ConfigError")
            .field("key", &self.key)
            .field("value", &value)
            .field("reason", &self.reason)
            .finish()
    }
}

/// Options whose values hold keys.
const SECRET_KEYS: [&str; 2] = ["tenant", "admin"];
const REDACTED: &str = "***";

fn is_secret(key: &str) -> bool {
    SECRET_KEYS.contains(&key)
}

/// A command line (or configuration text) for the log: its words, single-spaced, with the values of
/// `tenant=` and `admin=` replaced by `***`.
#[derive(Clone, Copy, Debug)]
pub struct Redacted<'a>(pub &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, word) in self.0.split_ascii_whitespace().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            match word.split_once('=') {
                Some((key, _)) if is_secret(key) => write!(f, "{key}={REDACTED}")?,
                _ => f.write_str(word)?,
            }
        }
        Ok(())
    }
}

/// The parsed configuration.
#[derive(Clone, Copy, Debug)]
pub struct Config<'a> {
    pub log: log::LevelFilter,
    /// `None`: the default layout for the number of CPUs.
    pub cores: Option<CoreLayout>,
    /// `console=`; `None`: the ACPI SPCR's port when it names a usable one, else COM1 (`crate::console`).
    pub console: Option<ConsoleChoice>,
    pub test: Option<TestHook>,
    /// How long a core's role loop may stand still before another core declares it stuck and fails closed
    /// (`watchdog_ms=`; 0 disables; `crate::watchdog`).
    pub watchdog_ms: u32,
    /// The control channel's interface (`ip=`, `gw=`, `port=`).
    pub net: NetConfig,
    control: ControlConfig<'a>,
    /// Parsers for the keys the kernel does not know (the lease service's `lease_pool_mib=`, ...).
    parsers: &'a [&'a dyn OptionParser],
    /// `gw=`'s text, for the error [`Config::check`] may report.
    gw_text: &'a str,
    /// The session budgets' texts (`key`, value), for the error [`Config::check`] may report.
    budget_text: [(&'a str, &'a str); 3],
    unknown: [&'a str; MAX_WARNINGS],
    unknown_len: usize,
    unknown_dropped: usize,
}

impl Default for Config<'_> {
    fn default() -> Self {
        Config {
            log: log::LevelFilter::Info,
            cores: None,
            console: None,
            test: None,
            watchdog_ms: DEFAULT_WATCHDOG_MS,
            net: NetConfig::default(),
            control: ControlConfig::default(),
            parsers: &[],
            gw_text: "",
            budget_text: [("", ""); 3],
            unknown: [""; MAX_WARNINGS],
            unknown_len: 0,
            unknown_dropped: 0,
        }
    }
}

impl<'a> Config<'a> {
    /// The defaults, with `parsers` for the keys of the layers above the kernel.
    pub fn with_parsers(parsers: &'a [&'a dyn OptionParser]) -> Self {
        Config { parsers, ..Config::default() }
    }

    /// Applies the words of `text` in order (`#` to end of line is a comment).
    pub fn apply(&mut self, text: &'a str) -> Result<(), ConfigError<'a>> {
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            for word in line.split_ascii_whitespace() {
                self.apply_word(word)?;
            }
        }
        Ok(())
    }

    /// Applies a kernel command line; its first word is the loader's kernel path when it has no `=`.
    pub fn apply_cmdline(&mut self, cmdline: &'a str) -> Result<(), ConfigError<'a>> {
        let mut words = cmdline.split_ascii_whitespace().peekable();
        if words.peek().is_some_and(|w| !w.contains('=')) {
            words.next();
        }
        for w in words {
            self.apply_word(w)?;
        }
        Ok(())
    }

    fn apply_word(&mut self, word: &'a str) -> Result<(), ConfigError<'a>> {
        let (key, value) = word.split_once('=').unwrap_or((word, ""));
        let err = |reason| ConfigError { key, value, reason };
        match key {
            "log" => {
                self.log = match value {
                    "off" => log::LevelFilter::Off,
                    "error" => log::LevelFilter::Error,
                    "warn" => log::LevelFilter::Warn,
                    "info" => log::LevelFilter::Info,
                    "debug" => log::LevelFilter::Debug,
                    "trace" => log::LevelFilter::Trace,
                    _ => return Err(err("expected off, error, warn, info, debug or trace")),
                }
            }
            "cores" => self.cores = Some(CoreLayout::parse(value).map_err(err)?),
            "console" => self.console = Some(ConsoleChoice::parse(value).map_err(err)?),
            "watchdog_ms" => {
                self.watchdog_ms = value.parse().map_err(|_| err("expected milliseconds (0 disables)"))?;
            }
            "test" => {
                self.test = match value {
                    "pagefault" => Some(TestHook::PageFault),
                    "panic" => Some(TestHook::Panic),
                    "panic-after-lease" => Some(TestHook::PanicAfterLease),
                    "stall" => Some(TestHook::Stall),
                    "none" => None,
                    _ => return Err(err("expected pagefault, panic, panic-after-lease, stall or none")),
                }
            }
            "ctl_nic" => self.net.set_nic(value).map_err(err)?,
            "ip" => self.net.set_ip(value).map_err(err)?,
            "gw" => {
                self.net.set_gw(value).map_err(err)?;
                self.gw_text = value;
            }
            "port" => self.net.set_port(value).map_err(err)?,
            "tenant" => self.control.add_tenant(value).map_err(err)?,
            "admin" => self.control.set_admin(value).map_err(err)?,
            "sessions" => self.control.set_sessions(value).map_err(err)?,
            "credits" => self.control.set_credits(value).map_err(err)?,
            "heartbeat_ms" => self.control.set_heartbeat_ms(value).map_err(err)?,
            "sessions_per_tenant" => {
                self.control.set_sessions_per_tenant(value).map_err(err)?;
                self.budget_text[0] = (key, value);
            }
            "admin_sessions" => {
                self.control.set_admin_sessions(value).map_err(err)?;
                self.budget_text[1] = (key, value);
            }
            "preauth_sessions" => {
                self.control.set_preauth_sessions(value).map_err(err)?;
                self.budget_text[2] = (key, value);
            }
            "heap_high_water" => self.control.set_heap_high_water(value).map_err(err)?,
            "appliance" => self.control.set_appliance(value).map_err(err)?,
            _ if self.apply_registered(key, value).map_err(err)? => {}
            _ => {
                if self.unknown_len < MAX_WARNINGS {
                    self.unknown[self.unknown_len] = word;
                    self.unknown_len += 1;
                } else {
                    self.unknown_dropped += 1;
                }
            }
        }
        Ok(())
    }

    /// Offers `key=value` to the registered parsers in order: `Ok(true)` when one claimed it.
    fn apply_registered(&self, key: &str, value: &str) -> Result<bool, &'static str> {
        for p in self.parsers {
            if p.apply(key, value)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Checks between options, once every word is applied: `gw=` needs `ip=` on the same subnet; the session
    /// budgets (`admin_sessions=`, `sessions_per_tenant=`, `preauth_sessions=`) fit in `sessions=`.
    pub fn check(&self) -> Result<(), ConfigError<'a>> {
        self.net.check().map_err(|reason| ConfigError { key: "gw", value: self.gw_text, reason })?;
        self.control.check().map_err(|(key, reason)| {
            let value = self.budget_text.iter().find(|(k, _)| *k == key).map_or("", |(_, v)| *v);
            ConfigError { key, value, reason }
        })
    }

    /// The control service's principals and budgets (`tenant=`, `admin=`, `sessions=`, `credits=`,
    /// `heartbeat_ms=`).
    pub fn control(&self) -> &ControlConfig<'a> {
        &self.control
    }

    /// Words that were not understood (to be printed as warnings), and how many more were dropped.
    pub fn unknown(&self) -> (&[&'a str], usize) {
        (&self.unknown[..self.unknown_len], self.unknown_dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_architecture() {
        let one = CoreLayout::default_for(1);
        assert_eq!(one.cores().len(), 1);
        assert_eq!(std::format!("{}", one.cores()[0]), "net+cmd+event");
        let two = CoreLayout::default_for(2);
        assert_eq!(std::format!("{} {}", two.cores()[0], two.cores()[1]), "net cmd+event");
        let four = CoreLayout::default_for(4);
        let names: std::vec::Vec<_> = four.cores().iter().map(|s| std::format!("{s}")).collect();
        assert_eq!(names, ["net", "cmd", "event", "idle"]);
    }

    #[test]
    fn console_option() {
        use crate::console::Uart;
        let mut c = Config::default();
        assert_eq!(c.console, None);
        c.apply_cmdline("/boot/leasebox.elf console=ttyS1 log=info").unwrap();
        assert_eq!(c.console, Some(ConsoleChoice::Uart(Uart { port: 0x2f8, baud: 115_200 })));
        // A later word overrides an earlier one (the configuration module, then the command line).
        c.apply("console=0x3e8,9600").unwrap();
        assert_eq!(c.console, Some(ConsoleChoice::Uart(Uart { port: 0x3e8, baud: 9_600 })));
        c.apply("console=none").unwrap();
        assert_eq!(c.console, Some(ConsoleChoice::None));
        let e = Config::default().apply_cmdline("console=ttyS9").unwrap_err();
        assert_eq!((e.key, e.value), ("console", "ttyS9"));
        assert!(std::format!("{e}").contains("ttyS0 to ttyS3"), "{e}");
        assert_eq!(Config::default().apply_cmdline("console=").unwrap_err().key, "console");
    }

    #[test]
    fn short_layouts_are_padded_with_idle_cores() {
        let l = CoreLayout::parse("net+cmd+event").unwrap().padded_to(3);
        let names: std::vec::Vec<_> = l.cores().iter().map(|s| std::format!("{s}")).collect();
        assert_eq!(names, ["net+cmd+event", "idle", "idle"]);
        assert_eq!(CoreLayout::default_for(4).padded_to(2).cores().len(), 4, "never shrinks");
    }

    #[test]
    fn parses_command_lines() {
        let mut c = Config::default();
        c.apply_cmdline("/boot/leasebox.elf log=debug cores=net,cmd+event test=pagefault foo=1 bare").unwrap();
        assert_eq!(c.log, log::LevelFilter::Debug);
        let l = c.cores.unwrap();
        assert_eq!(l.cores().len(), 2);
        assert!(l.cores()[1].contains(Role::Cmd) && l.cores()[1].contains(Role::Event));
        assert_eq!(c.test, Some(TestHook::PageFault));
        assert_eq!(c.unknown(), (&["foo=1", "bare"][..], 0));
    }

    #[test]
    fn test_hooks() {
        let mut c = Config::default();
        assert!(c.apply_cmdline("test=mlx5-probe").is_err(), "the stand-in probe is gone (native driver)");
        c.apply_cmdline("test=panic").unwrap();
        assert_eq!(c.test, Some(TestHook::Panic));
        assert_eq!(c.watchdog_ms, DEFAULT_WATCHDOG_MS);
        c.apply_cmdline("watchdog_ms=0").unwrap();
        assert_eq!(c.watchdog_ms, 0);
        assert!(c.apply_cmdline("watchdog_ms=soon").is_err());
        c.apply_cmdline("test=panic-after-lease").unwrap();
        assert_eq!(c.test, Some(TestHook::PanicAfterLease));
        c.apply_cmdline("test=stall").unwrap();
        assert_eq!(c.test, Some(TestHook::Stall));
        c.apply_cmdline("test=none").unwrap();
        assert_eq!(c.test, None);
        assert_eq!(
            c.apply_cmdline("test=mlx5").unwrap_err().reason,
            "expected pagefault, panic, panic-after-lease, stall or none"
        );
    }

    #[test]
    fn later_words_override_and_comments_are_skipped() {
        let mut c = Config::default();
        c.apply("# leasebox.conf\nlog=warn   # quiet\ncores=net+cmd+event\n").unwrap();
        c.apply_cmdline("log=trace").unwrap();
        assert_eq!(c.log, log::LevelFilter::Trace);
        assert_eq!(c.cores.unwrap().cores().len(), 1);
    }

    #[test]
    fn bad_values_name_the_key() {
        let mut c = Config::default();
        let e = c.apply_cmdline("log=loud").unwrap_err();
        assert_eq!((e.key, e.value), ("log", "loud"));
        for bad in [
            "cores=net,cmd",
            "cores=net,cmd,event,net",
            "cores=net+net,cmd,event",
            "cores=",
            "cores=net,cmd,event+idle",
            "cores=net,cmd,disk+event",
        ] {
            let mut c = Config::default();
            let e = c.apply_cmdline(bad).unwrap_err();
            assert_eq!(e.key, "cores", "{bad}");
            assert!(!std::format!("{e}").is_empty());
        }
        let mut c = Config::default();
        assert_eq!(c.apply_cmdline("test=explode").unwrap_err().key, "test");
    }

    const KEY: &str = "00112233445566778899aabbccddeeff";

    #[test]
    fn network_and_control_options() {
        let mut c = Config::default();
        assert!(c.net.dhcp());
        assert_eq!(c.net.port, 7470);
        let line = std::format!(
            "leasebox.elf ip=10.0.2.15/24 gw=10.0.2.2 port=9000 tenant=alice:{KEY} tenant=bob:{KEY} admin={KEY} \
             sessions=4 credits=2 heartbeat_ms=2000"
        );
        c.apply_cmdline(&line).unwrap();
        c.check().unwrap();
        assert_eq!(std::format!("{}", c.net.ip.unwrap()), "10.0.2.15/24");
        assert_eq!(c.net.gw, Some(core::net::Ipv4Addr::new(10, 0, 2, 2)));
        assert_eq!(c.net.port, 9000);
        let ctl = c.control();
        assert_eq!(ctl.tenants().collect::<std::vec::Vec<_>>(), [("alice", KEY), ("bob", KEY)]);
        assert_eq!(ctl.admin_key_hex(), Some(KEY));
        assert_eq!((ctl.sessions, ctl.credits, ctl.heartbeat_ms), (Some(4), 2, 2000));
        assert_eq!(c.unknown(), (&[][..], 0));
    }

    #[test]
    fn gateway_needs_an_address_once_everything_is_applied() {
        let mut c = Config::default();
        c.apply("gw=10.0.2.2\n").unwrap();
        let e = c.check().unwrap_err();
        assert_eq!((e.key, e.value), ("gw", "10.0.2.2"));
        c.apply_cmdline("ip=10.0.2.15/24").unwrap();
        assert_eq!(c.check(), Ok(()), "the command line completes the module");
    }

    #[test]
    fn errors_never_show_keys() {
        for bad in [std::format!("tenant=alice:{KEY}00x"), std::format!("admin={KEY}0"), std::format!("tenant={KEY}")] {
            let mut c = Config::default();
            let e = c.apply_cmdline(&bad).unwrap_err();
            let shown = std::format!("{e}");
            assert!(!shown.contains("0011"), "{shown}");
            assert!(shown.contains("=***: "), "{shown}");
        }
        let mut c = Config::default();
        let twice = std::format!("tenant=alice:{KEY} tenant=alice:{KEY}");
        let e = c.apply_cmdline(&twice).unwrap_err();
        assert_eq!(std::format!("{e}"), "bad option tenant=***: a tenant name is configured twice");
        assert!(!std::format!("{e:?}").contains("0011"), "Debug redacts too");
    }

    #[test]
    fn redacts_secrets_for_the_log() {
        let line =
            std::format!("/boot/leasebox.elf  log=debug tenant=alice:{KEY}\tadmin={KEY} admin tenant= x=tenant=1");
        assert_eq!(
            std::format!("{}", Redacted(&line)),
            "/boot/leasebox.elf log=debug tenant=*** admin=*** admin tenant=*** x=tenant=1"
        );
        assert_eq!(std::format!("{}", Redacted("")), "");
        assert_eq!(std::format!("{}", Redacted("  cores=net  ")), "cores=net");
    }

    #[test]
    fn bad_network_values_name_the_key() {
        for (word, key) in [
            ("ip=10.0.2.15", "ip"),
            ("ctl_nic=eth0", "ctl_nic"),
            ("gw=10.0.2", "gw"),
            ("port=0", "port"),
            ("sessions=4097", "sessions"),
            ("credits=0", "credits"),
            ("heartbeat_ms=10", "heartbeat_ms"),
            ("admin=00", "admin"),
            ("tenant=admin:00112233445566778899aabbccddeeff", "tenant"),
        ] {
            let mut c = Config::default();
            assert_eq!(c.apply_cmdline(word).unwrap_err().key, key, "{word}");
        }
    }

    #[test]
    fn the_appliance_name_parses_as_a_tenant_name_does() {
        let mut c = Config::default();
        assert_eq!(c.control().appliance, None);
        c.apply_cmdline("appliance=lb-a.rack3").unwrap();
        assert_eq!(c.control().appliance, Some("lb-a.rack3"));
        for bad in ["appliance=", "appliance=a@b", "appliance=012345678901234567890123456789012"] {
            assert_eq!(Config::default().apply_cmdline(bad).unwrap_err().key, "appliance", "{bad}");
        }
    }

    #[test]
    fn session_budgets_parse_and_must_fit_the_session_budget() {
        let mut c = Config::default();
        c.apply_cmdline("sessions=8 sessions_per_tenant=3 admin_sessions=2 preauth_sessions=4 heap_high_water=80")
            .unwrap();
        assert_eq!(c.check(), Ok(()));
        let ctl = c.control();
        assert_eq!(
            (ctl.sessions_per_tenant, ctl.admin_sessions, ctl.preauth_sessions, ctl.heap_high_water),
            (Some(3), Some(2), Some(4), Some(80))
        );
        for (word, key) in [
            ("sessions_per_tenant=0", "sessions_per_tenant"),
            ("admin_sessions=4096", "admin_sessions"),
            ("preauth_sessions=x", "preauth_sessions"),
            ("heap_high_water=99", "heap_high_water"),
        ] {
            assert_eq!(Config::default().apply_cmdline(word).unwrap_err().key, key, "{word}");
        }
        for (line, key, value) in [
            ("sessions=4 admin_sessions=4", "admin_sessions", "4"),
            ("sessions=4 sessions_per_tenant=5", "sessions_per_tenant", "5"),
            ("sessions=16 preauth_sessions=17", "preauth_sessions", "17"),
        ] {
            let mut c = Config::default();
            c.apply_cmdline(line).unwrap();
            let e = c.check().unwrap_err();
            assert_eq!((e.key, e.value), (key, value), "{line}");
        }
    }

    #[test]
    fn ctl_nic_picks_the_control_nic() {
        use crate::net_config::ControlNic;
        assert_eq!(Config::default().net.nic, ControlNic::Auto);
        for (word, nic) in [
            ("ctl_nic=auto", ControlNic::Auto),
            ("ctl_nic=virtio", ControlNic::Virtio),
            ("ctl_nic=mlx5", ControlNic::Mlx5),
        ] {
            let mut c = Config::default();
            c.apply_cmdline(word).unwrap();
            assert_eq!(c.net.nic, nic, "{word}");
            assert_eq!(std::format!("ctl_nic={nic}"), word);
        }
    }

    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    struct Pool(u32);

    fn pool(p: &mut Pool, key: &str, value: &str) -> Result<bool, &'static str> {
        if key != "pool_mib" {
            return Ok(false);
        }
        p.0 = value.parse().map_err(|_| "expected a number")?;
        Ok(true)
    }

    #[test]
    fn registered_parsers_get_the_keys_the_kernel_does_not_know() {
        let opts = Options::new(Pool(64), pool);
        let parsers: [&dyn OptionParser; 1] = [&opts];
        let mut c = Config::with_parsers(&parsers);
        c.apply("pool_mib=128 log=warn").unwrap();
        c.apply_cmdline("pool_mib=256 colour=blue").unwrap();
        assert_eq!(opts.get(), Pool(256), "later words override");
        assert_eq!(c.log, log::LevelFilter::Warn);
        assert_eq!(c.unknown(), (&["colour=blue"][..], 0), "nobody claimed it");
        let e = c.apply_cmdline("pool_mib=lots").unwrap_err();
        assert_eq!((e.key, e.value, e.reason), ("pool_mib", "lots", "expected a number"));
        let mut plain = Config::default();
        plain.apply_cmdline("pool_mib=256").unwrap();
        assert_eq!(plain.unknown(), (&["pool_mib=256"][..], 0), "without the parser the key is unknown");
    }

    #[test]
    fn warnings_are_bounded() {
        let mut c = Config::default();
        let many = "a=1 b=2 c=3 d=4 e=5 f=6 g=7 h=8 i=9 j=10";
        c.apply_cmdline(many).unwrap();
        assert_eq!(c.unknown().0.len(), MAX_WARNINGS);
        assert_eq!(c.unknown().1, 2);
    }
}
