//! Boot configuration: `key=value` words from the kernel command line, optionally preceded by a
//! configuration module (a multiboot module whose command line is `leasebox.conf`, same syntax, `#` starts a
//! comment). Later words override earlier ones. Options are documented in `docs/operations.md`.
//!
//! Unknown keys are kept as warnings (printed at boot) rather than errors, so an image stays bootable when a
//! loader adds its own words; a known key with a bad value is an error that stops the boot with a message.

use core::fmt;

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
    /// ARCHITECTURE.md's defaults: one CPU runs everything; two split net from the HCA engines; three or
    /// more give net, cmd and event a core each and leave the rest idle.
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

/// Deliberate faults for the boot tests (`test=`), run after the ready line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestHook {
    PageFault,
    Panic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigError<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub reason: &'static str,
}

impl fmt::Display for ConfigError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad option {}={}: {}", self.key, self.value, self.reason)
    }
}

/// The parsed configuration.
#[derive(Clone, Copy, Debug)]
pub struct Config<'a> {
    pub log: log::LevelFilter,
    /// `None`: the default layout for the number of CPUs.
    pub cores: Option<CoreLayout>,
    pub test: Option<TestHook>,
    unknown: [&'a str; MAX_WARNINGS],
    unknown_len: usize,
    unknown_dropped: usize,
}

impl Default for Config<'_> {
    fn default() -> Self {
        Config {
            log: log::LevelFilter::Info,
            cores: None,
            test: None,
            unknown: [""; MAX_WARNINGS],
            unknown_len: 0,
            unknown_dropped: 0,
        }
    }
}

impl<'a> Config<'a> {
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
            "test" => {
                self.test = match value {
                    "pagefault" => Some(TestHook::PageFault),
                    "panic" => Some(TestHook::Panic),
                    "none" => None,
                    _ => return Err(err("expected pagefault, panic or none")),
                }
            }
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

    #[test]
    fn warnings_are_bounded() {
        let mut c = Config::default();
        let many = "a=1 b=2 c=3 d=4 e=5 f=6 g=7 h=8 i=9 j=10";
        c.apply_cmdline(many).unwrap();
        assert_eq!(c.unknown().0.len(), MAX_WARNINGS);
        assert_eq!(c.unknown().1, 2);
    }
}
