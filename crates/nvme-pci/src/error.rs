//! The crate's error type. Every message says what to do about it.

use std::io;
use std::path::PathBuf;

use crate::addr::PciAddr;

/// What to run to turn the IOMMU on (the no-IOMMU-group message).
pub const ENABLE_IOMMU_HINT: &str = "enable the IOMMU: intel_iommu=on (Intel) or amd_iommu=on (AMD) plus \
iommu=pt on the kernel command line, and VT-d / AMD-Vi in the firmware setup; or use the no-IOMMU fallback \
(--allow-no-iommu, see docs/real-drives.md)";

/// Errors of discovery, binding and device access.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// No such PCI function under `sys/bus/pci/devices`.
    #[error("no PCI function {addr} (looked in {path}); `tutti-probe list` shows the NVMe functions")]
    NotFound {
        /// The address asked for.
        addr: PciAddr,
        /// The sysfs directory that does not exist.
        path: PathBuf,
    },
    /// The function is not an NVMe controller (class 010802h).
    #[error("{addr} has PCI class {class:#08x}, not an NVMe controller (0x010802)")]
    NotNvme {
        /// The function.
        addr: PciAddr,
        /// Its 24-bit class code.
        class: u32,
    },
    /// Reading a sysfs/procfs file failed.
    #[error("reading {path} failed")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A sysfs file held something that does not parse.
    #[error("{path} holds {value:?}, which does not parse")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Its (trimmed) contents.
        value: String,
    },
    /// Writing a sysfs attribute failed.
    #[error("writing {value:?} to {path} failed{hint}")]
    Write {
        /// The attribute.
        path: PathBuf,
        /// What was written (trimmed).
        value: String,
        /// How to fix it (empty, or "; ..." text).
        hint: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The vfio-pci driver is not registered.
    #[error(
        "the vfio-pci driver is not loaded: run `modprobe vfio-pci` (it loads vfio and vfio_iommu_type1)"
    )]
    VfioPciNotLoaded,
    /// The kernel's nvme driver is not registered (needed to give a drive back).
    #[error("the kernel nvme driver is not loaded: run `modprobe nvme`")]
    NvmeDriverNotLoaded,
    /// The function is in no IOMMU group, so VFIO cannot take it.
    #[error("{addr} is in no IOMMU group (no {addr}/iommu_group link): {hint}", hint = ENABLE_IOMMU_HINT)]
    NoIommuGroup {
        /// The function.
        addr: PciAddr,
    },
    /// The drive is in use; binding would pull it from under its users.
    #[error("{addr} is in use: {}; stop these uses first (umount, mdadm --stop, vgchange -an, close the programs) or pass --force", uses.join("; "))]
    InUse {
        /// The function.
        addr: PciAddr,
        /// Each use in words, e.g. `nvme0n1p2 mounted at /data`,
        /// `nvme0n1 is a member of md0`, `nvme0n1 open by pid 1234
        /// (postgres)`, `holds the root filesystem`.
        uses: Vec<String>,
    },
    /// The drive holds the root filesystem: never taken, even with force.
    #[error("{addr} holds the root filesystem; it is never taken from the kernel, not even with --force")]
    HoldsRootFs {
        /// The function.
        addr: PciAddr,
    },
    /// After the bind/unbind writes the function is not on the expected driver.
    #[error("{addr} is on {} after the writes, not {wanted}; `dmesg | tail` shows why the driver refused it", driver.as_deref().unwrap_or("no driver"))]
    BindFailed {
        /// The function.
        addr: PciAddr,
        /// The driver that should own it.
        wanted: &'static str,
        /// The driver it is on (basename of the `driver` link).
        driver: Option<String>,
    },
    /// Opening a function that is not on vfio-pci (or an allowed fallback driver).
    #[error("{addr} is bound to {}, not vfio-pci: run `tutti-probe bind {addr}` first", driver.as_deref().unwrap_or("no driver"))]
    NotBoundToVfio {
        /// The function.
        addr: PciAddr,
        /// Its current driver.
        driver: Option<String>,
    },
    /// The function can only be driven without an IOMMU and that was not allowed.
    #[error("{addr} is on {mode}, where device DMA is not confined by an IOMMU; pass --allow-no-iommu (OpenOptions::allow_no_iommu) to accept that, or {hint}", hint = ENABLE_IOMMU_HINT)]
    NoIommuNotAllowed {
        /// The function.
        addr: PciAddr,
        /// `uio_pci_generic` or `VFIO no-IOMMU mode`.
        mode: &'static str,
    },
    /// The IOMMU group has devices not bound to vfio-pci.
    #[error("IOMMU group {group} is not viable: every function in it must be bound to vfio-pci or to no driver (see {root}sys/kernel/iommu_groups/{group}/devices; with ACS missing, several devices share a group)")]
    GroupNotViable {
        /// The group number.
        group: u32,
        /// Filesystem root, for the path in the message.
        root: String,
    },
    /// The kernel's VFIO lacks something this driver needs.
    #[error("the kernel's VFIO does not support {what}")]
    VfioUnsupported {
        /// What is missing.
        what: String,
    },
    /// A system call of VFIO, mmap or procfs failed.
    #[error("{op} failed{hint}")]
    Os {
        /// What was being done.
        op: String,
        /// How to fix it (empty, or "; ..." text).
        hint: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// BAR0 cannot be mapped as one register window.
    #[error("BAR0 of {addr} cannot be mapped: {why}")]
    Bar0 {
        /// The function.
        addr: PciAddr,
        /// What is wrong.
        why: String,
    },
}

/// A hint for an errno seen while touching `what` (a path or a step),
/// starting with "; ", or empty.
pub(crate) fn errno_hint(err: &io::Error, what: &str) -> String {
    match err.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            format!("; permission denied: run as root, or grant this user access to {what}")
        }
        Some(libc::EBUSY) => {
            format!("; {what} is busy: another process (a VM, SPDK, another tutti) holds it")
        }
        Some(libc::ENOMEM) => {
            "; out of memory, or (when pinning DMA memory) over RLIMIT_MEMLOCK: raise it (`ulimit -l \
             unlimited`, or memlock in /etc/security/limits.conf) or run as root"
                .to_owned()
        }
        Some(libc::ENOENT) => format!("; {what} does not exist"),
        _ => String::new(),
    }
}
