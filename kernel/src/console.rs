//! Where the console goes: the `console=` option and the ACPI Serial Port Console Redirection table (SPCR).
//!
//! A server's operator watches the port its BMC redirects (Serial-over-LAN), which is often COM2, not COM1. The
//! choice, in order: `console=` on the command line; else the SPCR's UART when it is a 16550-compatible one on
//! an I/O port; else COM1. An MMIO UART in the SPCR is reported as unsupported and COM1 kept
//! (docs/reference/acpi-tables.md, "SPCR"). The UART itself is driven by `arch::serial`; this module only decides.
//!
//! `console=` syntax (docs/operations.md): `ttyS0`..`ttyS3` (Linux's names) or `com1`..`com4` for the four
//! standard ports 0x3F8, 0x2F8, 0x3E8, 0x2E8; an I/O port address `0x2f8`; each optionally followed by
//! `,BAUD` (a divisor of 115200: 115200, 57600, 38400, 19200, 9600, ...); or `none` (no console output at all).

use core::fmt;

/// The legacy COM port addresses, COM1..COM4.
pub const COM_PORTS: [u16; 4] = [0x3F8, 0x2F8, 0x3E8, 0x2E8];
/// The 16550's divisor clock: 1.8432 MHz / 16.
pub const UART_CLOCK_BAUD: u32 = 115_200;
/// A 16550 decodes eight consecutive ports.
const UART_PORTS: u16 = 8;

/// A 16550-compatible UART on an I/O port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uart {
    pub port: u16,
    pub baud: u32,
}

impl Uart {
    pub const COM1: Uart = Uart { port: COM_PORTS[0], baud: UART_CLOCK_BAUD };

    /// The divisor latch value for `baud` (at least 1).
    pub fn divisor(&self) -> u16 {
        (UART_CLOCK_BAUD / self.baud.max(1)).clamp(1, u32::from(u16::MAX)) as u16
    }
}

impl fmt::Display for Uart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match COM_PORTS.iter().position(|&p| p == self.port) {
            Some(i) => write!(f, "COM{} ({:#x}) {} baud", i + 1, self.port, self.baud),
            None => write!(f, "{:#x} {} baud", self.port, self.baud),
        }
    }
}

/// What `console=` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsoleChoice {
    Uart(Uart),
    /// No console output (the ready line and fault dumps are then only in the control channel's answers).
    None,
}

impl ConsoleChoice {
    /// Parses a `console=` value (see the module comment).
    pub fn parse(value: &str) -> Result<ConsoleChoice, &'static str> {
        if value == "none" {
            return Ok(ConsoleChoice::None);
        }
        let (name, baud) = match value.split_once(',') {
            Some((n, b)) => (n, parse_baud(b)?),
            None => (value, UART_CLOCK_BAUD),
        };
        let lower = |prefix: &str| {
            name.get(..prefix.len()).filter(|p| p.eq_ignore_ascii_case(prefix)).map(|_| &name[prefix.len()..])
        };
        let port = if let Some(n) = lower("ttyS") {
            match n {
                "0" | "1" | "2" | "3" => COM_PORTS[usize::from(n.as_bytes()[0] - b'0')],
                _ => return Err("ttyS0 to ttyS3 name the four COM ports"),
            }
        } else if let Some(n) = lower("com") {
            match n {
                "1" | "2" | "3" | "4" => COM_PORTS[usize::from(n.as_bytes()[0] - b'1')],
                _ => return Err("com1 to com4 name the four COM ports"),
            }
        } else if let Some(hex) = lower("0x") {
            let port = u16::from_str_radix(hex, 16).map_err(|_| "expected an I/O port address such as 0x2f8")?;
            check_port(port)?;
            port
        } else {
            return Err("expected ttyS0..ttyS3, com1..com4, an I/O port (0x2f8) with an optional ,BAUD, or none");
        };
        Ok(ConsoleChoice::Uart(Uart { port, baud }))
    }
}

fn parse_baud(b: &str) -> Result<u32, &'static str> {
    let baud: u32 = b.parse().map_err(|_| "expected a baud rate after the comma (e.g. ,115200)")?;
    if baud == 0 || baud > UART_CLOCK_BAUD || !UART_CLOCK_BAUD.is_multiple_of(baud) {
        return Err("the baud rate must divide 115200 (115200, 57600, 38400, 19200, 9600, ...)");
    }
    Ok(baud)
}

/// A UART's eight registers must fit the 16-bit I/O space, and port 0 is nobody's UART.
fn check_port(port: u16) -> Result<(), &'static str> {
    if port == 0 || port.checked_add(UART_PORTS - 1).is_none() {
        return Err("the UART's eight ports must lie within 0x1..0xffff");
    }
    Ok(())
}

/// The SPCR's serial port, as far as the kernel can use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpcrConsole {
    /// A 16550-compatible UART on an I/O port: the console goes there.
    Uart(Uart),
    /// A UART the kernel cannot drive (MMIO, or another interface type): reported, COM1 kept.
    Unsupported { interface_type: u8, address_space: u8, address: u64 },
    /// The table says console redirection is off (base address zero).
    Disabled,
}

impl fmt::Display for SpcrConsole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SpcrConsole::Uart(u) => write!(f, "{u}"),
            SpcrConsole::Unsupported { interface_type, address_space, address } => {
                let space = match address_space {
                    SPACE_MEMORY => "MMIO",
                    SPACE_IO => "I/O",
                    _ => "address space",
                };
                write!(f, "interface type {interface_type:#x} at {space} {address:#x} (not supported)")
            }
            SpcrConsole::Disabled => f.write_str("redirection disabled"),
        }
    }
}

/// Generic Address Structure address space IDs (ACPI 6.x §5.2.3.2).
pub const SPACE_MEMORY: u8 = 0;
pub const SPACE_IO: u8 = 1;
/// SPCR interface types that are 16550-register compatible (Microsoft's Debug Port Table 2 subtypes): full
/// 16550, the 16450 subset, and "16550-compatible with parameters in the Generic Address Structure".
const SPCR_16550: u8 = 0x00;
const SPCR_16450: u8 = 0x01;
const SPCR_16550_GAS: u8 = 0x12;

/// Decodes the SPCR fields the console needs (offsets in docs/reference/acpi-tables.md, "SPCR"): interface type (byte
/// 36), the base address GAS (bytes 40..52: space id at 40, address at 44), and the configured baud rate
/// (byte 58: 3 = 9600, 4 = 19200, 6 = 57600, 7 = 115200, 0 = as the firmware left it, taken as 115200).
pub fn spcr_console(interface_type: u8, address_space: u8, address: u64, baud_code: u8) -> SpcrConsole {
    if address == 0 {
        return SpcrConsole::Disabled;
    }
    let baud = match baud_code {
        3 => 9_600,
        4 => 19_200,
        6 => 57_600,
        _ => UART_CLOCK_BAUD,
    };
    let compatible = matches!(interface_type, SPCR_16550 | SPCR_16450 | SPCR_16550_GAS);
    match u16::try_from(address) {
        Ok(port) if compatible && address_space == SPACE_IO && check_port(port).is_ok() => {
            SpcrConsole::Uart(Uart { port, baud })
        }
        _ => SpcrConsole::Unsupported { interface_type, address_space, address },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uart(port: u16, baud: u32) -> Result<ConsoleChoice, &'static str> {
        Ok(ConsoleChoice::Uart(Uart { port, baud }))
    }

    #[test]
    fn names_ports_and_none() {
        assert_eq!(ConsoleChoice::parse("ttyS0"), uart(0x3f8, 115_200));
        assert_eq!(ConsoleChoice::parse("ttyS1"), uart(0x2f8, 115_200));
        assert_eq!(ConsoleChoice::parse("ttyS3,9600"), uart(0x2e8, 9_600));
        assert_eq!(ConsoleChoice::parse("com2"), uart(0x2f8, 115_200));
        assert_eq!(ConsoleChoice::parse("COM3"), uart(0x3e8, 115_200));
        assert_eq!(ConsoleChoice::parse("0x2f8"), uart(0x2f8, 115_200));
        assert_eq!(ConsoleChoice::parse("0x3060,57600"), uart(0x3060, 57_600));
        assert_eq!(ConsoleChoice::parse("none"), Ok(ConsoleChoice::None));
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        for bad in [
            "",
            "ttyS4",
            "ttyS",
            "ttyS01",
            "com0",
            "com5",
            "0x",
            "0xzz",
            "0x10000",
            "0x0",
            "0xfffa",
            "2f8",
            "ttyUSB0",
            "ttyS1,",
            "ttyS1,0",
            "ttyS1,100000",
            "ttyS1,230400",
            "ttyS1,fast",
            "None",
        ] {
            assert!(ConsoleChoice::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(ConsoleChoice::parse("ttyS7").unwrap_err().contains("ttyS0 to ttyS3"));
        assert!(ConsoleChoice::parse("ttyS1,230400").unwrap_err().contains("divide 115200"));
        // The highest port whose eight registers still fit.
        assert_eq!(ConsoleChoice::parse("0xfff8"), uart(0xfff8, 115_200));
    }

    #[test]
    fn divisors() {
        assert_eq!(Uart::COM1.divisor(), 1);
        assert_eq!(Uart { port: 0x2f8, baud: 9_600 }.divisor(), 12);
        assert_eq!(Uart { port: 0x2f8, baud: 57_600 }.divisor(), 2);
        assert_eq!(std::format!("{}", Uart { port: 0x2f8, baud: 115_200 }), "COM2 (0x2f8) 115200 baud");
        assert_eq!(std::format!("{}", Uart { port: 0x3060, baud: 9_600 }), "0x3060 9600 baud");
    }

    #[test]
    fn spcr_io_uarts_are_used_and_mmio_ones_reported() {
        assert_eq!(spcr_console(0, SPACE_IO, 0x2f8, 7), SpcrConsole::Uart(Uart { port: 0x2f8, baud: 115_200 }));
        assert_eq!(spcr_console(0x12, SPACE_IO, 0x3f8, 3), SpcrConsole::Uart(Uart { port: 0x3f8, baud: 9_600 }));
        assert_eq!(spcr_console(1, SPACE_IO, 0x3e8, 0), SpcrConsole::Uart(Uart { port: 0x3e8, baud: 115_200 }));
        // An MMIO 16550 (common on newer servers), an ARM PL011 (type 3), an I/O address past 16 bits.
        let mmio = spcr_console(0x12, SPACE_MEMORY, 0xfe03_2000, 7);
        assert_eq!(mmio, SpcrConsole::Unsupported { interface_type: 0x12, address_space: 0, address: 0xfe03_2000 });
        assert!(std::format!("{mmio}").contains("MMIO 0xfe032000 (not supported)"));
        assert!(matches!(spcr_console(3, SPACE_IO, 0x2f8, 7), SpcrConsole::Unsupported { .. }));
        assert!(matches!(spcr_console(0, SPACE_IO, 0x1_0000, 7), SpcrConsole::Unsupported { .. }));
        assert_eq!(spcr_console(0, SPACE_IO, 0, 7), SpcrConsole::Disabled);
    }
}
