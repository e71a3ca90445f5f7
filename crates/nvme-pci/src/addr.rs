//! PCI function addresses (`domain:bus:device.function`), as Linux names
//! them in `/sys/bus/pci/devices/` (`pci_name()` in `drivers/pci/probe.c`).

use std::fmt;
use std::str::FromStr;

/// A PCI function address: 16-bit domain (segment), 8-bit bus, 5-bit
/// device, 3-bit function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddr {
    /// PCI domain (segment group), 0..=0xFFFF.
    pub domain: u16,
    /// Bus number, 0..=0xFF.
    pub bus: u8,
    /// Device number, 0..=0x1F.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a PCI address ({reason}); expected DDDD:BB:DD.F or BB:DD.F, e.g. 0000:00:04.0")]
pub struct PciAddrParseError {
    /// The text that was parsed.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl PciAddr {
    /// A function address; `None` when device > 0x1F or function > 7.
    pub const fn new(domain: u16, bus: u8, device: u8, function: u8) -> Option<Self> {
        if device > 0x1F || function > 7 {
            return None;
        }
        Some(Self { domain, bus, device, function })
    }
}

impl FromStr for PciAddr {
    type Err = PciAddrParseError;

    /// Accepts `DDDD:BB:DD.F` (as in sysfs) and `BB:DD.F` (domain 0, as
    /// `lspci` prints without `-D`). Fields are hexadecimal.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| PciAddrParseError { input: s.to_owned(), reason };
        let (head, function) = s.rsplit_once('.').ok_or_else(|| err("no '.' before the function"))?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return Err(err("wrong number of ':' fields")),
        };
        let hex = |t: &str, max_len: usize, what| {
            if t.is_empty() || t.len() > max_len || !t.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err(what));
            }
            u32::from_str_radix(t, 16).map_err(|_| err(what))
        };
        let domain = hex(domain, 4, "bad domain")? as u16;
        let bus = hex(bus, 2, "bad bus")? as u8;
        let device = hex(device, 2, "bad device")?;
        let function = hex(function, 1, "bad function")?;
        if device > 0x1F {
            return Err(err("device number above 1f"));
        }
        if function > 7 {
            return Err(err("function number above 7"));
        }
        Ok(Self { domain, bus, device: device as u8, function: function as u8 })
    }
}

impl fmt::Display for PciAddr {
    /// `DDDD:BB:DD.F`, lower-case hex, as sysfs names the function.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_long_and_short_forms() {
        let a: PciAddr = "0000:00:04.0".parse().unwrap();
        assert_eq!(a, PciAddr::new(0, 0, 4, 0).unwrap());
        assert_eq!("00:04.0".parse::<PciAddr>().unwrap(), a);
        assert_eq!(a.to_string(), "0000:00:04.0");
        let b: PciAddr = "10DE:Af:1f.7".parse().unwrap();
        assert_eq!(b.to_string(), "10de:af:1f.7");
    }

    #[test]
    fn rejects_garbage() {
        for s in
            ["", "0000:00:04", "0000:00:20.0", "00:04.8", "g0:04.0", "1:2:3:4.0", "00000:00:04.0", "00:04.0 "]
        {
            assert!(s.parse::<PciAddr>().is_err(), "{s:?}");
        }
        let e = "00:04".parse::<PciAddr>().unwrap_err();
        assert!(e.to_string().contains("0000:00:04.0"), "{e}");
    }
}
