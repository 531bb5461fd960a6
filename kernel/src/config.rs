//! Boot configuration: `key=value` words from the kernel command line, optionally preceded by a
//! configuration module (a multiboot module whose command line is `leasebox.conf`, same syntax, `#` starts a
//! comment). Later words override earlier ones. Options are documented in `docs/operations.md`.
//!
//! Unknown keys are kept as warnings (printed at boot) rather than errors, so an image stays bootable when a
//! loader adds its own words; a known key with a bad value is an error that stops the boot with a message.
//! Checks that involve several options (`gw=` needs `ip=`) run once everything is applied ([`Config::check`]).
//!
//! The kernel knows its own keys (`log=`, `cores=`, `console=`, `test=`, `watchdog_ms=`) and the control
//! channel's interface ([`crate::net_config`]). Options of the layers above it (the session core's principals,
//! keys and budgets; the lease service's) are not the kernel's business: the image registers an
//! [`OptionParser`] for each ([`Config::with_parsers`]), and every key the kernel does not know goes to them in
//! order (the option machinery is `leasebox_options`, which the hosted appliance uses without a kernel). A key
//! none of them claims is unknown, as above. Secret values (`tenant=`, `admin=`) never show in an error or in
//! [`Redacted`].

use crate::console::ConsoleChoice;
use crate::net_config::NetConfig;
use core::fmt;
pub use leasebox_options::{ConfigError, OptionParser, Options, Redacted};
use leasebox_options::{Registry, split, words};

/// Budget: the most cores a layout may name (matches the kernel's per-CPU table).
pub const MAX_CORES: usize = 64;

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
    /// `gw=`'s text, for the error [`Config::check`] may report.
    gw_text: &'a str,
    /// The parsers for the keys the kernel does not know (the session core's, the lease service's), and the
    /// words nobody claimed.
    others: Registry<'a, 'a>,
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
            gw_text: "",
            others: Registry::new(&[]),
        }
    }
}

impl<'a> Config<'a> {
    /// The defaults, with `parsers` for the keys of the layers above the kernel.
    pub fn with_parsers(parsers: &'a [&'a dyn OptionParser<'a>]) -> Self {
        Config { others: Registry::new(parsers), ..Config::default() }
    }

    /// Applies the words of `text` in order (`#` to end of line is a comment).
    pub fn apply(&mut self, text: &'a str) -> Result<(), ConfigError<'a>> {
        words(text).try_for_each(|w| self.apply_word(w))
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
        let (key, value) = split(word);
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
            _ => self.others.apply_word(word)?,
        }
        Ok(())
    }

    /// Checks between options, once every word is applied: `gw=` needs `ip=` on the same subnet; then each
    /// registered parser's own (the session budgets fit in `sessions=`).
    pub fn check(&self) -> Result<(), ConfigError<'a>> {
        self.net.check().map_err(|reason| ConfigError { key: "gw", value: self.gw_text, reason })?;
        self.others.check()
    }

    /// Words that were not understood (to be printed as warnings), and how many more were dropped.
    pub fn unknown(&self) -> (&[&'a str], usize) {
        self.others.unknown()
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
    fn network_options() {
        let mut c = Config::default();
        assert!(c.net.dhcp());
        assert_eq!(c.net.port, 7470);
        c.apply_cmdline("leasebox.elf ip=10.0.2.15/24 gw=10.0.2.2 port=9000").unwrap();
        c.check().unwrap();
        assert_eq!(std::format!("{}", c.net.ip.unwrap()), "10.0.2.15/24");
        assert_eq!(c.net.gw, Some(core::net::Ipv4Addr::new(10, 0, 2, 2)));
        assert_eq!(c.net.port, 9000);
        assert_eq!(c.unknown(), (&[][..], 0));
        // The session core's keys are not the kernel's: without the image's parsers they are unknown.
        let line = std::format!("tenant=alice:{KEY} sessions=4");
        let mut c = Config::default();
        c.apply_cmdline(&line).unwrap();
        assert_eq!(c.unknown().0.len(), 2);
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

    /// A stand-in for a layer with a secret key (the session core's `admin=`).
    fn secret(v: &mut u32, key: &str, value: &str) -> Result<bool, &'static str> {
        if key != "admin" {
            return Ok(false);
        }
        *v = value.len() as u32;
        if value.len() < 32 { Err("too short") } else { Ok(true) }
    }

    #[test]
    fn errors_never_show_keys() {
        let opts = Options::new(0u32, secret);
        let parsers: [&dyn OptionParser; 1] = [&opts];
        let bad = std::format!("admin={}", &KEY[..30]);
        let e = Config::with_parsers(&parsers).apply_cmdline(&bad).unwrap_err();
        assert_eq!(std::format!("{e}"), "bad option admin=***: too short");
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
        for (word, key) in
            [("ip=10.0.2.15", "ip"), ("ctl_nic=eth0", "ctl_nic"), ("gw=10.0.2", "gw"), ("port=0", "port")]
        {
            let mut c = Config::default();
            assert_eq!(c.apply_cmdline(word).unwrap_err().key, key, "{word}");
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

    fn pool_check<'a>(p: &Pool) -> Result<(), ConfigError<'a>> {
        if p.0 > 1024 { Err(ConfigError { key: "pool_mib", value: "", reason: "at most 1024" }) } else { Ok(()) }
    }

    #[test]
    fn registered_parsers_check_after_the_kernel() {
        let opts = Options::checked(Pool(64), pool, pool_check);
        let parsers: [&dyn OptionParser; 1] = [&opts];
        let mut c = Config::with_parsers(&parsers);
        c.apply_cmdline("pool_mib=2048 gw=10.0.2.2").unwrap();
        assert_eq!(c.check().unwrap_err().key, "gw", "the kernel's own checks first");
        c.apply_cmdline("ip=10.0.2.15/24").unwrap();
        assert_eq!(c.check().unwrap_err().reason, "at most 1024");
        c.apply_cmdline("pool_mib=512").unwrap();
        assert_eq!(c.check(), Ok(()));
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
        assert_eq!(c.unknown().0.len(), leasebox_options::MAX_WARNINGS);
        assert_eq!(c.unknown().1, 2);
    }
}
