//! [`VfioNvme`]: a real controller as an [`NvmeDevice`], opened through
//! VFIO type1 (Linux `Documentation/driver-api/vfio.rst`): container, group,
//! device fd, BAR0 mapped with `mmap`, bus mastering switched on in config
//! space, DMA mapped through the IOMMU at addresses from an
//! [`IovaAllocator`]. With an explicit opt-in it also drives a function on
//! `uio_pci_generic` or in VFIO no-IOMMU mode, using physical addresses.

use std::collections::HashMap;
use std::fs::{File, OpenOptions as FsOpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use nvm_queue::{DeviceError, DmaMapping, Mmio, NvmeDevice, HOST_PAGE_SIZE};

use crate::addr::PciAddr;
use crate::bind::VFIO_PCI;
use crate::enumerate::function;
use crate::error::{errno_hint, PciError};
use crate::iova::{fallback_ranges, IovaAllocator};
use crate::phys::physical_pages;
use crate::sys::{self, MappedBar};
use crate::sysfs::Sysfs;

/// PCI configuration space Command register offset (PCI Local Bus 3.0, 6.2.2).
pub const PCI_COMMAND: u64 = 0x04;
/// Command register bit 1: Memory Space Enable (BAR0 decodes).
pub const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// Command register bit 2: Bus Master Enable (the function may issue DMA).
pub const PCI_COMMAND_MASTER: u16 = 1 << 2;

/// Driver name of the generic UIO PCI driver (no-IOMMU fallback).
pub const UIO_PCI_GENERIC: &str = "uio_pci_generic";

/// The warning given when device DMA is not confined by an IOMMU.
pub const NO_IOMMU_WARNING: &str = "NO IOMMU: device DMA is unconfined. The controller can read and write \
any physical memory of this host; a wrong PRP or a stale physical address corrupts the kernel or other \
processes. Use only on a dedicated machine (docs/real-drives.md).";

/// Options for [`open`] / [`VfioNvme::open`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Accept a function on `uio_pci_generic` or in VFIO no-IOMMU mode,
    /// where DMA uses physical addresses and nothing confines it.
    pub allow_no_iommu: bool,
    /// Filesystem root for `sys/`, `proc/` and `dev/vfio` (tests); `None`
    /// means `/`.
    pub root: Option<PathBuf>,
}

/// How a [`VfioNvme`] reaches its controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// VFIO with the type1 IOMMU: DMA confined to mapped IOVAs.
    Iommu,
    /// VFIO no-IOMMU mode (`vfio.enable_unsafe_noiommu_mode=1`): physical addresses.
    VfioNoIommu,
    /// `uio_pci_generic`, BAR0 through sysfs `resource0`: physical addresses.
    Uio,
}

#[derive(Debug)]
enum Dma {
    /// IOMMU mode: the container and the IOVA allocator.
    Iommu { container: Arc<File>, iova: Mutex<IovaAllocator> },
    /// Physical mode: first physical page -> (host address, length), and
    /// the pagemap file.
    Physical { pagemap: File, maps: Mutex<HashMap<u64, (usize, usize)>> },
}

/// An NVMe controller on vfio-pci (or an opted-in no-IOMMU fallback) as an
/// [`NvmeDevice`].
///
/// Dropping it clears Bus Master Enable (so a controller left running can
/// no longer DMA), unmaps BAR0, and closes the device, group and container
/// fds (which removes every IOMMU mapping).
#[derive(Debug)]
pub struct VfioNvme {
    name: String,
    addr: PciAddr,
    mode: AccessMode,
    bar: MappedBar,
    /// Config space: (file, offset of config space in it).
    config: (File, u64),
    dma: Dma,
    warning: Option<&'static str>,
    // Closed in this order after the fields above: device, group, container.
    _device: Option<File>,
    _group: Option<File>,
    _container: Option<Arc<File>>,
}

/// Opens `addr` (bound to vfio-pci) as a device for `nvm_queue::Controller::init`.
///
/// See [`VfioNvme::open`] for the steps and errors.
pub fn open(addr: &PciAddr, opts: &OpenOptions) -> Result<Arc<dyn NvmeDevice>, PciError> {
    Ok(Arc::new(VfioNvme::open(addr, opts)?))
}

fn os(op: impl Into<String>, hint: String, source: std::io::Error) -> PciError {
    PciError::Os { op: op.into(), hint, source }
}

fn open_rw(path: &Path) -> std::io::Result<File> {
    FsOpenOptions::new().read(true).write(true).open(path)
}

/// The group's device node, `/dev/vfio/<group>`, or with the opt-in its
/// no-IOMMU twin `/dev/vfio/noiommu-<group>`, and the mode it means.
fn group_node(
    sysfs: &Sysfs,
    addr: &PciAddr,
    group_no: u32,
    opts: &OpenOptions,
) -> Result<(AccessMode, PathBuf), PciError> {
    let group_path = sysfs.path(&format!("dev/vfio/{group_no}"));
    let noiommu_path = sysfs.path(&format!("dev/vfio/noiommu-{group_no}"));
    if !group_path.exists() && noiommu_path.exists() {
        if !opts.allow_no_iommu {
            return Err(PciError::NoIommuNotAllowed { addr: *addr, mode: "VFIO no-IOMMU mode" });
        }
        Ok((AccessMode::VfioNoIommu, noiommu_path))
    } else {
        Ok((AccessMode::Iommu, group_path))
    }
}

/// Opens the VFIO container, `/dev/vfio/vfio`, and checks its API version
/// and that it offers the IOMMU type `mode` needs (type1v2, or no-IOMMU);
/// returns the container and that type.
fn open_container(sysfs: &Sysfs, mode: AccessMode) -> Result<(File, u32), PciError> {
    let cpath = sysfs.path("dev/vfio/vfio");
    let container = open_rw(&cpath).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            "; the vfio module is not loaded: run `modprobe vfio-pci`".to_owned()
        } else {
            errno_hint(&e, &cpath.display().to_string())
        };
        os(format!("opening {}", cpath.display()), hint, e)
    })?;
    let v = sys::get_api_version(&container).map_err(|e| os("VFIO_GET_API_VERSION", String::new(), e))?;
    if v != sys::VFIO_API_VERSION as i32 {
        return Err(PciError::VfioUnsupported {
            what: format!(
                "API version {} (it reports {v}; this driver needs a Linux 5.4+ VFIO)",
                sys::VFIO_API_VERSION
            ),
        });
    }
    let iommu_type = match mode {
        AccessMode::Iommu => sys::VFIO_TYPE1v2_IOMMU,
        _ => sys::VFIO_NOIOMMU_IOMMU,
    };
    if sys::check_extension(&container, iommu_type).unwrap_or(0) != 1 {
        return Err(PciError::VfioUnsupported {
            what: match mode {
                AccessMode::Iommu => {
                    "the type1v2 IOMMU (run `modprobe vfio_iommu_type1`; Linux 5.4 or later)".to_owned()
                }
                _ => "no-IOMMU mode (load vfio with enable_unsafe_noiommu_mode=1)".to_owned(),
            },
        });
    }
    Ok((container, iommu_type))
}

/// Opens the group node, checks that the group is viable (every device in
/// it bound to vfio-pci or to no driver) and attaches it to `container`.
fn attach_group(sysfs: &Sysfs, group_path: &Path, group_no: u32, container: &File) -> Result<File, PciError> {
    let group = open_rw(group_path).map_err(|e| {
        let hint = errno_hint(&e, &group_path.display().to_string());
        os(format!("opening {}", group_path.display()), hint, e)
    })?;
    let flags = sys::group_flags(&group).map_err(|e| os("VFIO_GROUP_GET_STATUS", String::new(), e))?;
    if flags & sys::VFIO_GROUP_FLAGS_VIABLE == 0 {
        return Err(PciError::GroupNotViable {
            group: group_no,
            root: format!("{}/", sysfs.root().display()).replace("//", "/"),
        });
    }
    sys::group_set_container(&group, container)
        .map_err(|e| os("VFIO_GROUP_SET_CONTAINER", String::new(), e))?;
    Ok(group)
}

/// With the group attached: selects the IOMMU type on the container, gets
/// the device fd, maps BAR0 and finds config space (region 7). Returns the
/// device fd, BAR0 and (a dup of the device fd, config space offset).
fn open_device(
    group: &File,
    container: &File,
    iommu_type: u32,
    addr: &PciAddr,
) -> Result<(File, MappedBar, (File, u64)), PciError> {
    sys::set_iommu(container, iommu_type).map_err(|e| {
        let hint = errno_hint(&e, "the VFIO container (CAP_SYS_RAWIO for no-IOMMU mode)");
        os("VFIO_SET_IOMMU", hint, e)
    })?;
    let device = sys::group_get_device_fd(group, &addr.to_string()).map_err(|e| {
        let hint = errno_hint(&e, &format!("{addr} (is it bound to vfio-pci?)"));
        os(format!("VFIO_GROUP_GET_DEVICE_FD {addr}"), hint, e)
    })?;
    let bar = map_bar0(&device, addr)?;
    let cfg = sys::region_info(&device, sys::VFIO_PCI_CONFIG_REGION_INDEX)
        .map_err(|e| os("VFIO_DEVICE_GET_REGION_INFO (config)", String::new(), e))?;
    let config = (device.try_clone().map_err(|e| os("dup of the device fd", String::new(), e))?, cfg.offset);
    Ok((device, bar, config))
}

/// Maps BAR0 (region 0) of `device`, which must be mmap-able and at least
/// 8 KiB (registers and the first doorbells).
fn map_bar0(device: &File, addr: &PciAddr) -> Result<MappedBar, PciError> {
    let bar_info = sys::region_info(device, sys::VFIO_PCI_BAR0_REGION_INDEX)
        .map_err(|e| os("VFIO_DEVICE_GET_REGION_INFO (BAR0)", String::new(), e))?;
    if bar_info.flags & sys::VFIO_REGION_INFO_FLAG_MMAP == 0 || bar_info.size < 0x2000 {
        return Err(PciError::Bar0 {
            addr: *addr,
            why: format!(
                "region flags {:#x}, size {:#x}: not mmap-able or too small",
                bar_info.flags, bar_info.size
            ),
        });
    }
    MappedBar::map(device, bar_info.size as usize, bar_info.offset).map_err(|e| PciError::Bar0 {
        addr: *addr,
        why: format!(
            "mmap of {:#x} bytes failed ({e}); if the MSI-X table sits in BAR0 and the IOMMU lacks \
             interrupt remapping, the kernel allows only a sparse mapping, which this driver does not do yet",
            bar_info.size
        ),
    })
}

/// IOMMU-mode DMA state: IOVAs are allocated from the container's usable
/// ranges (`VFIO_IOMMU_GET_INFO`), else from [`fallback_ranges`].
fn iommu_dma(container: &Arc<File>) -> Dma {
    let ranges = match sys::iommu_iova_ranges(container) {
        Ok(Some(r)) if !IovaAllocator::new(&r).ranges().is_empty() => r,
        _ => fallback_ranges(),
    };
    Dma::Iommu { container: container.clone(), iova: Mutex::new(IovaAllocator::new(&ranges)) }
}

impl VfioNvme {
    /// Opens `addr`.
    ///
    /// On vfio-pci with an IOMMU: opens `/dev/vfio/vfio`, checks
    /// `VFIO_API_VERSION` and type1v2 support, opens `/dev/vfio/<group>`,
    /// checks the group is viable, attaches it, selects type1v2, gets the
    /// device fd, maps BAR0 (region 0, must be mmap-able) and sets Memory
    /// Space and Bus Master Enable in config space (region 7). The IOVA
    /// ranges come from `VFIO_IOMMU_GET_INFO` (else
    /// [`fallback_ranges`]).
    ///
    /// Errors: [`PciError::NotBoundToVfio`] (run `tutti-probe bind`),
    /// [`PciError::NoIommuGroup`], [`PciError::NoIommuNotAllowed`],
    /// [`PciError::GroupNotViable`], [`PciError::VfioUnsupported`],
    /// [`PciError::Os`] with the fix (permissions, busy group, memlock),
    /// [`PciError::Bar0`].
    pub fn open(addr: &PciAddr, opts: &OpenOptions) -> Result<Self, PciError> {
        let sysfs = Sysfs::with_root(opts.root.clone().unwrap_or_else(|| PathBuf::from("/")));
        let f = function(&sysfs, addr)?;
        match f.driver.as_deref() {
            Some(VFIO_PCI) => {}
            Some(UIO_PCI_GENERIC) => {
                if !opts.allow_no_iommu {
                    return Err(PciError::NoIommuNotAllowed { addr: *addr, mode: UIO_PCI_GENERIC });
                }
                return Self::open_uio(&sysfs, addr, f.bar0_bytes);
            }
            other => return Err(PciError::NotBoundToVfio { addr: *addr, driver: other.map(str::to_owned) }),
        }
        let group_no = f.iommu_group.ok_or(PciError::NoIommuGroup { addr: *addr })?;
        let (mode, group_path) = group_node(&sysfs, addr, group_no, opts)?;
        let (container, iommu_type) = open_container(&sysfs, mode)?;
        let group = attach_group(&sysfs, &group_path, group_no, &container)?;
        let container = Arc::new(container);
        // From here on, dropping `group` without unsetting would be fine
        // too (closing the group detaches it), but keep the order explicit.
        let (device, bar, config) = match open_device(&group, &container, iommu_type, addr) {
            Ok(x) => x,
            Err(e) => {
                let _ = sys::group_unset_container(&group);
                return Err(e);
            }
        };
        let dma = match mode {
            AccessMode::Iommu => iommu_dma(&container),
            _ => Dma::Physical { pagemap: open_pagemap(&sysfs)?, maps: Mutex::new(HashMap::new()) },
        };
        let dev = Self {
            name: addr.to_string(),
            addr: *addr,
            mode,
            bar,
            config,
            dma,
            warning: (mode != AccessMode::Iommu).then_some(NO_IOMMU_WARNING),
            _device: Some(device),
            _group: Some(group),
            _container: Some(container),
        };
        // Logs the no-IOMMU warning; sets Memory Space and Bus Master Enable.
        dev.after_open()?;
        Ok(dev)
    }

    fn open_uio(sysfs: &Sysfs, addr: &PciAddr, bar0_bytes: Option<u64>) -> Result<Self, PciError> {
        let dir = sysfs.pci_device_dir(addr);
        let res = dir.join("resource0");
        let file = open_rw(&res).map_err(|e| {
            let hint = errno_hint(&e, &res.display().to_string());
            os(format!("opening {}", res.display()), hint, e)
        })?;
        let len = match bar0_bytes {
            Some(n) => n,
            None => file.metadata().map(|m| m.len()).unwrap_or(0),
        };
        if len < 0x2000 {
            return Err(PciError::Bar0 { addr: *addr, why: format!("BAR0 is {len:#x} bytes (unassigned?)") });
        }
        let bar = MappedBar::map(&file, len as usize, 0).map_err(|e| PciError::Bar0 {
            addr: *addr,
            why: format!("mmap of {} failed: {e}", res.display()),
        })?;
        let cpath = dir.join("config");
        let config = open_rw(&cpath).map_err(|e| {
            let hint = errno_hint(&e, &cpath.display().to_string());
            os(format!("opening {}", cpath.display()), hint, e)
        })?;
        let dev = Self {
            name: addr.to_string(),
            addr: *addr,
            mode: AccessMode::Uio,
            bar,
            config: (config, 0),
            dma: Dma::Physical { pagemap: open_pagemap(sysfs)?, maps: Mutex::new(HashMap::new()) },
            warning: Some(NO_IOMMU_WARNING),
            _device: None,
            _group: None,
            _container: None,
        };
        dev.after_open()?;
        Ok(dev)
    }

    fn after_open(&self) -> Result<(), PciError> {
        if let Some(w) = self.warning {
            tracing::warn!(addr = %self.addr, mode = ?self.mode, "{w}");
        }
        self.set_command_bits(PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER, true)
    }

    /// Sets (or clears) bits of the PCI Command register through config space.
    fn set_command_bits(&self, bits: u16, on: bool) -> Result<(), PciError> {
        let (file, base) = &self.config;
        let mut b = [0u8; 2];
        file.read_exact_at(&mut b, base + PCI_COMMAND)
            .map_err(|e| os("reading the PCI Command register", errno_hint(&e, "PCI config space"), e))?;
        let cmd = u16::from_le_bytes(b);
        let new = if on { cmd | bits } else { cmd & !bits };
        if new != cmd {
            file.write_all_at(&new.to_le_bytes(), base + PCI_COMMAND)
                .map_err(|e| os("writing the PCI Command register", errno_hint(&e, "PCI config space"), e))?;
        }
        Ok(())
    }

    /// The function's address.
    pub fn addr(&self) -> PciAddr {
        self.addr
    }

    /// How the controller is reached.
    pub fn mode(&self) -> AccessMode {
        self.mode
    }

    /// The no-IOMMU warning ([`NO_IOMMU_WARNING`]) when DMA is unconfined,
    /// for tools to print; `None` with an IOMMU.
    pub fn dma_warning(&self) -> Option<&'static str> {
        self.warning
    }
}

fn open_pagemap(sysfs: &Sysfs) -> Result<File, PciError> {
    let p = sysfs.path("proc/self/pagemap");
    File::open(&p).map_err(|e| {
        let hint = errno_hint(&e, &p.display().to_string());
        os(format!("opening {}", p.display()), hint, e)
    })
}

fn check_range(host: NonNull<u8>, len: usize) -> Result<usize, DeviceError> {
    let addr = host.as_ptr() as usize;
    let bad = DeviceError::BadRange { addr, len };
    if len == 0 || !addr.is_multiple_of(HOST_PAGE_SIZE) {
        return Err(bad);
    }
    let rounded = len.checked_next_multiple_of(HOST_PAGE_SIZE).ok_or(bad)?;
    addr.checked_add(rounded).ok_or(DeviceError::BadRange { addr, len })?;
    Ok(rounded)
}

// `dma_map` is an unsafe trait method: implementing it, and forwarding its
// contract to `sys::dma_map`, is the only unsafe code outside `sys`.
#[allow(unsafe_code)]
impl NvmeDevice for VfioNvme {
    fn name(&self) -> &str {
        &self.name
    }

    fn bar0(&self) -> &Mmio {
        self.bar.mmio()
    }

    unsafe fn dma_map(&self, host: NonNull<u8>, len: usize) -> Result<DmaMapping, DeviceError> {
        let len = check_range(host, len)?;
        match &self.dma {
            Dma::Iommu { container, iova } => {
                let mut a = iova.lock().unwrap_or_else(|p| p.into_inner());
                let at = a.alloc(len as u64).map_err(|_| DeviceError::AddressSpaceExhausted { len })?;
                // SAFETY: contract forwarded: the caller of `dma_map` keeps
                // the memory allocated and unreferenced while mapped.
                let mapped = unsafe { sys::dma_map(container, host.as_ptr() as usize, at, len as u64) };
                if let Err(source) = mapped {
                    let _ = a.free(at);
                    let op = if source.raw_os_error() == Some(libc::ENOMEM) {
                        "VFIO_IOMMU_MAP_DMA (pinning hit RLIMIT_MEMLOCK: raise `ulimit -l` or run as root)"
                    } else {
                        "VFIO_IOMMU_MAP_DMA"
                    };
                    return Err(DeviceError::Os { op, source });
                }
                Ok(DmaMapping::contiguous(at, len))
            }
            Dma::Physical { pagemap, maps } => {
                // Page locks do not nest: a page in two mappings would be
                // unlocked by the first unmap. Refuse overlaps instead.
                let mut m = maps.lock().unwrap_or_else(|p| p.into_inner());
                let start = host.as_ptr() as usize;
                if m.values().any(|&(h, l)| start < h.saturating_add(l) && h < start.saturating_add(len)) {
                    return Err(DeviceError::Overlapping { addr: start, len });
                }
                sys::mlock(host, len).map_err(|source| DeviceError::Os {
                    op: "mlock of DMA memory (raise RLIMIT_MEMLOCK with `ulimit -l` or run as root)",
                    source,
                })?;
                let pages = match physical_pages(pagemap, host.as_ptr() as usize, len) {
                    Ok(p) => p,
                    Err(source) => {
                        let _ = sys::munlock(host, len);
                        return Err(DeviceError::Os {
                            op: "reading /proc/self/pagemap (physical addresses need CAP_SYS_ADMIN: run as root)",
                            source,
                        });
                    }
                };
                let Some(&first) = pages.first() else {
                    let _ = sys::munlock(host, len);
                    return Err(DeviceError::BadRange { addr: start, len });
                };
                m.insert(first, (start, len));
                Ok(DmaMapping::from_pages(pages))
            }
        }
    }

    fn dma_unmap(&self, mapping: &DmaMapping) -> Result<(), DeviceError> {
        let Some(&first) = mapping.pages().first() else {
            return Err(DeviceError::NotMapped { iova: 0 });
        };
        match &self.dma {
            Dma::Iommu { container, iova } => {
                let mut a = iova.lock().unwrap_or_else(|p| p.into_inner());
                let len = a.len_of(first).ok_or(DeviceError::NotMapped { iova: first })?;
                sys::dma_unmap(container, first, len)
                    .map_err(|source| DeviceError::Os { op: "VFIO_IOMMU_UNMAP_DMA", source })?;
                let _ = a.free(first);
                Ok(())
            }
            Dma::Physical { maps, .. } => {
                let mut m = maps.lock().unwrap_or_else(|p| p.into_inner());
                let (host, len) = m.remove(&first).ok_or(DeviceError::NotMapped { iova: first })?;
                if let Some(p) = NonNull::new(host as *mut u8) {
                    let _ = sys::munlock(p, len);
                }
                Ok(())
            }
        }
    }
}

impl Drop for VfioNvme {
    fn drop(&mut self) {
        // Stop the function's DMA before its mappings go away: a controller
        // that was not shut down could otherwise write into freed memory
        // (physical modes) or fault in the IOMMU.
        let _ = self.set_command_bits(PCI_COMMAND_MASTER, false);
        // Then the fields drop in declaration order: BAR0 is unmapped, the
        // device fds close, the group closes (leaving the container), and
        // the container closes (removing every IOMMU mapping).
    }
}
