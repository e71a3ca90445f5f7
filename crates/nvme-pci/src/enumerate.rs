//! Finding NVMe functions (PCI class 010802h: mass storage, NVM, NVMe I/O
//! controller; PCI Code and ID Assignment 1.x, base class 01h, sub-class
//! 08h, programming interface 02h) and what the kernel does with them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use crate::addr::PciAddr;
use crate::error::PciError;
use crate::sysfs::{Mount, Sysfs};

/// Class code of an NVMe I/O controller (`class` file: `0x010802`).
pub const NVME_CLASS: u32 = 0x01_08_02;

/// One NVMe PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeFunction {
    /// Its address.
    pub addr: PciAddr,
    /// PCI vendor ID (`vendor`).
    pub vendor: u16,
    /// PCI device ID (`device`).
    pub device: u16,
    /// Current driver (basename of the `driver` link), `None` when unbound.
    pub driver: Option<String>,
    /// NUMA node (`numa_node`; -1, i.e. none, gives `None`).
    pub numa_node: Option<u32>,
    /// IOMMU group (basename of the `iommu_group` link); `None` without an IOMMU.
    pub iommu_group: Option<u32>,
    /// Size of BAR0 in bytes (first line of `resource`), `None` when unassigned.
    pub bar0_bytes: Option<u64>,
    /// The kernel's controllers on it (`nvme/nvmeN`), when bound to `nvme`.
    pub controllers: Vec<KernelController>,
}

/// A controller as the kernel nvme driver shows it (`/sys/class/nvme/nvmeN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelController {
    /// `nvmeN`.
    pub name: String,
    /// Model number (`model`, trimmed).
    pub model: String,
    /// Serial number (`serial`, trimmed).
    pub serial: String,
    /// Firmware revision (`firmware_rev`, trimmed).
    pub firmware: String,
    /// Its namespaces' block devices (`nvmeXnY`).
    pub namespaces: Vec<BlockDevice>,
}

/// A block device (a namespace or one of its partitions) and its users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name, e.g. `nvme0n1` or `nvme0n1p2`.
    pub name: String,
    /// NSID (`nsid` attribute, else parsed from the name); `None` for partitions.
    pub nsid: Option<u32>,
    /// Size in bytes (`size` is in 512-byte sectors).
    pub bytes: u64,
    /// Logical block size in bytes (`queue/logical_block_size`); `None` for partitions.
    pub logical_block_bytes: Option<u32>,
    /// Where it is mounted.
    pub mount_points: Vec<String>,
    /// `true` when it is an active swap device.
    pub swap: bool,
    /// Devices stacked on it (`holders/`): md, dm (LVM, crypt, multipath).
    pub holders: Vec<Holder>,
    /// Processes with it open: (pid, comm).
    pub open_by: Vec<(u32, String)>,
    /// `true` when it, or a device stacked on it, is mounted at `/`.
    pub root_fs: bool,
    /// Its partitions (`nvme0n1p1`...).
    pub partitions: Vec<BlockDevice>,
}

/// A device stacked on a block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Kernel name (`md0`, `dm-3`).
    pub name: String,
    /// The device-mapper name (`dm/name`, e.g. `vg0-data`), if any.
    pub dm_name: Option<String>,
    /// Where the holder is mounted.
    pub mount_points: Vec<String>,
}

/// One reason a drive must not be taken from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceUse {
    /// A block device is mounted.
    Mounted {
        /// Block device.
        dev: String,
        /// Mount point.
        at: String,
    },
    /// A block device is active swap.
    Swap {
        /// Block device.
        dev: String,
    },
    /// Another block device is stacked on it.
    Held {
        /// Block device.
        dev: String,
        /// The holder (md/dm name).
        holder: String,
    },
    /// A process has it open.
    Open {
        /// Block device.
        dev: String,
        /// Process ID.
        pid: u32,
        /// Process name (`comm`).
        comm: String,
    },
    /// It holds the root filesystem (never taken).
    RootFs,
}

impl fmt::Display for DeviceUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceUse::Mounted { dev, at } => write!(f, "{dev} mounted at {at}"),
            DeviceUse::Swap { dev } => write!(f, "{dev} is active swap"),
            DeviceUse::Held { dev, holder } => write!(f, "{dev} is a member of {holder}"),
            DeviceUse::Open { dev, pid, comm } => write!(f, "{dev} open by pid {pid} ({comm})"),
            DeviceUse::RootFs => f.write_str("holds the root filesystem"),
        }
    }
}

impl BlockDevice {
    fn uses_into(&self, out: &mut Vec<DeviceUse>) {
        for at in &self.mount_points {
            out.push(DeviceUse::Mounted { dev: self.name.clone(), at: at.clone() });
        }
        if self.swap {
            out.push(DeviceUse::Swap { dev: self.name.clone() });
        }
        for h in &self.holders {
            let holder = match &h.dm_name {
                Some(n) => format!("{} ({n})", h.name),
                None => h.name.clone(),
            };
            out.push(DeviceUse::Held { dev: self.name.clone(), holder: holder.clone() });
            for at in &h.mount_points {
                out.push(DeviceUse::Mounted { dev: holder.clone(), at: at.clone() });
            }
        }
        for (pid, comm) in &self.open_by {
            out.push(DeviceUse::Open { dev: self.name.clone(), pid: *pid, comm: comm.clone() });
        }
        for p in &self.partitions {
            p.uses_into(out);
        }
    }

    fn any_root(&self) -> bool {
        self.root_fs || self.partitions.iter().any(BlockDevice::any_root)
    }
}

impl NvmeFunction {
    /// Everything that uses the drive's block devices; [`DeviceUse::RootFs`]
    /// first when it holds the root filesystem. Empty for a function not on
    /// the kernel nvme driver.
    pub fn uses(&self) -> Vec<DeviceUse> {
        let mut out = Vec::new();
        if self.holds_root_fs() {
            out.push(DeviceUse::RootFs);
        }
        for c in &self.controllers {
            for ns in &c.namespaces {
                ns.uses_into(&mut out);
            }
        }
        out
    }

    /// `true` when one of its block devices (or a device stacked on one) is
    /// mounted at `/`.
    pub fn holds_root_fs(&self) -> bool {
        self.controllers.iter().flat_map(|c| &c.namespaces).any(BlockDevice::any_root)
    }
}

/// Context shared by the per-device reads of one enumeration.
struct Usage {
    mounts: Vec<Mount>,
    swaps: Vec<String>,
    open: BTreeMap<String, Vec<(u32, String)>>,
}

impl Usage {
    fn collect(sys: &Sysfs) -> Self {
        Self { mounts: sys.mounts(), swaps: sys.swaps(), open: sys.open_devices() }
    }

    /// Mount points of the block device `name` whose `dev` file holds `majmin`.
    fn mount_points(&self, name: &str, majmin: Option<&str>) -> Vec<String> {
        let source = format!("/dev/{name}");
        let mut v: Vec<String> = self
            .mounts
            .iter()
            .filter(|m| m.source == source || (majmin.is_some() && Some(m.dev.as_str()) == majmin))
            .map(|m| m.mount_point.clone())
            .collect();
        v.dedup();
        v
    }
}

/// Every NVMe function (class 010802h) under `<root>/sys/bus/pci/devices`,
/// in address order, with the kernel's view of it.
///
/// Errors only when the PCI device directory cannot be read at all; a
/// function with unreadable optional attributes is listed with `None`s.
pub fn enumerate(sys: &Sysfs) -> Result<Vec<NvmeFunction>, PciError> {
    let dir = sys.path("sys/bus/pci/devices");
    let rd = std::fs::read_dir(&dir).map_err(|source| PciError::Read { path: dir.clone(), source })?;
    let mut addrs: Vec<PciAddr> =
        rd.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect();
    addrs.sort();
    let usage = Usage::collect(sys);
    let mut out = Vec::new();
    for addr in addrs {
        let d = sys.pci_device_dir(&addr);
        match sys.read_hex(&d.join("class")) {
            Ok(c) if c as u32 == NVME_CLASS => {}
            _ => continue,
        }
        out.push(read_function(sys, &addr, &usage)?);
    }
    Ok(out)
}

/// The NVMe function at `addr`: [`PciError::NotFound`] when it does not
/// exist, [`PciError::NotNvme`] when its class is not 010802h.
pub fn function(sys: &Sysfs, addr: &PciAddr) -> Result<NvmeFunction, PciError> {
    let d = sys.pci_device_dir(addr);
    if !d.exists() {
        return Err(PciError::NotFound { addr: *addr, path: d });
    }
    let class = sys.read_hex(&d.join("class"))? as u32;
    if class != NVME_CLASS {
        return Err(PciError::NotNvme { addr: *addr, class });
    }
    read_function(sys, addr, &Usage::collect(sys))
}

fn read_function(sys: &Sysfs, addr: &PciAddr, usage: &Usage) -> Result<NvmeFunction, PciError> {
    let d = sys.pci_device_dir(addr);
    let vendor = sys.read_hex(&d.join("vendor"))? as u16;
    let device = sys.read_hex(&d.join("device"))? as u16;
    let driver = sys.driver_of(addr);
    let numa_node = sys
        .read_opt(&d.join("numa_node"))
        .and_then(|s| s.parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    let iommu_group = sys.link_name(&d.join("iommu_group")).and_then(|s| s.parse().ok());
    let bar0_bytes = sys.read_opt(&d.join("resource")).and_then(|s| parse_bar0_size(&s));
    let controllers = if driver.as_deref() == Some("nvme") {
        sys.list_dir(&d.join("nvme"))
            .into_iter()
            .filter(|n| n.starts_with("nvme"))
            .map(|n| read_controller(sys, &d.join("nvme").join(&n), &n, usage))
            .collect()
    } else {
        Vec::new()
    };
    Ok(NvmeFunction { addr: *addr, vendor, device, driver, numa_node, iommu_group, bar0_bytes, controllers })
}

/// BAR0 size from the first line of a PCI `resource` file (`start end
/// flags`, hex; `drivers/pci/pci-sysfs.c: resource_show`): `end - start +
/// 1`, or `None` for an unassigned BAR (start 0).
pub fn parse_bar0_size(resource: &str) -> Option<u64> {
    let mut f = resource.lines().next()?.split_whitespace();
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok();
    let start = hex(f.next()?)?;
    let end = hex(f.next()?)?;
    if start == 0 || end < start {
        return None;
    }
    Some(end - start + 1)
}

fn read_controller(sys: &Sysfs, dir: &Path, name: &str, usage: &Usage) -> KernelController {
    let attr = |a: &str| sys.read_opt(&dir.join(a)).unwrap_or_default();
    let mut ns_names: Vec<String> =
        sys.list_dir(dir).into_iter().filter_map(|n| namespace_block_name(&n)).collect();
    ns_names.dedup();
    let namespaces = ns_names.iter().map(|n| read_block(sys, n, None, usage)).collect();
    KernelController {
        name: name.to_owned(),
        model: attr("model"),
        serial: attr("serial"),
        firmware: attr("firmware_rev"),
        namespaces,
    }
}

/// The block device of a namespace entry of a controller directory:
/// `nvme0n1` as is; a multipath path `nvme0c1n1` as its head `nvme0n1`;
/// anything else `None`.
pub(crate) fn namespace_block_name(entry: &str) -> Option<String> {
    let rest = entry.strip_prefix("nvme")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    let (subsys, tail) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit())?);
    if !digits(subsys) {
        return None;
    }
    let ns = if let Some(t) = tail.strip_prefix('c') {
        let (ctrl, t2) = t.split_at(t.find(|c: char| !c.is_ascii_digit())?);
        if !digits(ctrl) {
            return None;
        }
        t2.strip_prefix('n')?
    } else {
        tail.strip_prefix('n')?
    };
    digits(ns).then(|| format!("nvme{subsys}n{ns}"))
}

/// Deepest stack of holders followed (crypt on LVM on md is 3).
const MAX_HOLDER_DEPTH: usize = 8;

/// Mount points of block device `h` (by name, device number and
/// device-mapper name) and of everything stacked on it, transitively: root
/// on LVM on dm-crypt on a partition is `nvme0n1p3 -> dm-0 -> dm-1` with
/// only `dm-1` mounted. Bounded by [`MAX_HOLDER_DEPTH`] and by the devices
/// already `seen` (sysfs holder links cannot loop, a fake tree could).
fn stacked_mount_points(
    sys: &Sysfs,
    usage: &Usage,
    h: &str,
    depth: usize,
    seen: &mut Vec<String>,
    out: &mut Vec<String>,
) {
    if depth >= MAX_HOLDER_DEPTH || seen.iter().any(|s| s == h) {
        return;
    }
    seen.push(h.to_owned());
    let hdir = sys.path(&format!("sys/block/{h}"));
    let majmin = sys.read_opt(&hdir.join("dev"));
    let mut mine = usage.mount_points(h, majmin.as_deref());
    if let Some(dm) = sys.read_opt(&hdir.join("dm/name")) {
        mine.extend(usage.mount_points(&format!("mapper/{dm}"), None));
    }
    for m in mine {
        if !out.contains(&m) {
            out.push(m);
        }
    }
    for up in sys.list_dir(&hdir.join("holders")) {
        stacked_mount_points(sys, usage, &up, depth + 1, seen, out);
    }
}

fn read_block(sys: &Sysfs, name: &str, parent: Option<&str>, usage: &Usage) -> BlockDevice {
    let dir = match parent {
        Some(p) => sys.path(&format!("sys/block/{p}/{name}")),
        None => sys.path(&format!("sys/block/{name}")),
    };
    let majmin = sys.read_opt(&dir.join("dev"));
    let bytes =
        sys.read_opt(&dir.join("size")).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0).saturating_mul(512);
    let mount_points = usage.mount_points(name, majmin.as_deref());
    let swap = usage.swaps.iter().any(|s| s == &format!("/dev/{name}"));
    let holders: Vec<Holder> = sys
        .list_dir(&dir.join("holders"))
        .into_iter()
        .map(|h| {
            let dm_name = sys.read_opt(&sys.path(&format!("sys/block/{h}")).join("dm/name"));
            let mut mount_points = Vec::new();
            let mut seen = Vec::new();
            stacked_mount_points(sys, usage, &h, 0, &mut seen, &mut mount_points);
            Holder { name: h, dm_name, mount_points }
        })
        .collect();
    let open_by = usage.open.get(name).cloned().unwrap_or_default();
    let root_fs = mount_points.iter().any(|m| m == "/")
        || holders.iter().any(|h| h.mount_points.iter().any(|m| m == "/"));
    let (nsid, logical_block_bytes, partitions) = if parent.is_none() {
        let nsid = sys
            .read_opt(&dir.join("nsid"))
            .and_then(|s| s.parse().ok())
            .or_else(|| name.rsplit_once('n').and_then(|(_, n)| n.parse().ok()));
        let lbs = sys.read_opt(&dir.join("queue/logical_block_size")).and_then(|s| s.parse().ok());
        let prefix = format!("{name}p");
        let parts = sys
            .list_dir(&dir)
            .into_iter()
            .filter(|p| {
                p.strip_prefix(&prefix)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
            })
            .map(|p| read_block(sys, &p, Some(name), usage))
            .collect();
        (nsid, lbs, parts)
    } else {
        (None, None, Vec::new())
    };
    BlockDevice {
        name: name.to_owned(),
        nsid,
        bytes,
        logical_block_bytes,
        mount_points,
        swap,
        holders,
        open_by,
        root_fs,
        partitions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar0_size_from_resource() {
        let r = "0x00000000fe800000 0x00000000fe803fff 0x0000000000140204\n0x0 0x0 0x0\n";
        assert_eq!(parse_bar0_size(r), Some(0x4000));
        assert_eq!(parse_bar0_size("0x0000000000000000 0x0000000000000000 0x0\n"), None);
        assert_eq!(parse_bar0_size(""), None);
    }

    #[test]
    fn namespace_names() {
        assert_eq!(namespace_block_name("nvme0n1").as_deref(), Some("nvme0n1"));
        assert_eq!(namespace_block_name("nvme2c3n12").as_deref(), Some("nvme2n12"));
        for bad in ["nvme0", "nvme0n", "nvme0n1p1", "ng0n1", "nvmeXn1", "power", "nvme0c1"] {
            assert_eq!(namespace_block_name(bad), None, "{bad}");
        }
    }
}
