//! Moving a function between the kernel nvme driver and vfio-pci, the way
//! SPDK's `scripts/setup.sh` and `driverctl` do: `driver_override`, then
//! `unbind` from the current driver, then `drivers_probe`
//! (`Documentation/ABI/testing/sysfs-bus-pci`).

use std::time::{Duration, Instant};

use crate::addr::PciAddr;
use crate::enumerate::{function, DeviceUse};
use crate::error::PciError;
use crate::sysfs::Sysfs;

/// Name of the VFIO PCI driver.
pub const VFIO_PCI: &str = "vfio-pci";
/// Name of the kernel NVMe driver.
pub const NVME: &str = "nvme";

/// What a bind or unbind did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindOutcome {
    /// The driver before (basename of the `driver` link).
    pub previous: Option<String>,
    /// `true` when the function was already on the wanted driver (nothing written).
    pub unchanged: bool,
    /// Uses that `force` overrode (empty without force).
    pub forced_over: Vec<String>,
}

/// Binds `addr` to vfio-pci: writes `vfio-pci` to its `driver_override`,
/// its address to the current driver's `unbind`, its address to
/// `sys/bus/pci/drivers_probe`, and checks that the `driver` link then
/// names vfio-pci.
///
/// Refuses, before writing anything:
/// - a function that is not NVMe ([`PciError::NotFound`], [`PciError::NotNvme`]);
/// - when vfio-pci is not loaded ([`PciError::VfioPciNotLoaded`]);
/// - without an IOMMU group ([`PciError::NoIommuGroup`]), unless the
///   function is already on vfio-pci;
/// - a drive holding the root filesystem, always ([`PciError::HoldsRootFs`]);
/// - a drive with mounted, swapped, stacked (md/dm) or open block devices,
///   unless `force` ([`PciError::InUse`], listing every use).
///
/// A function already on vfio-pci is left alone (`unchanged`). If the
/// kernel does not move the function ([`PciError::BindFailed`] or a failed
/// write), `driver_override` is cleared and the function probed again, so
/// it is not left pinned to vfio-pci.
pub fn bind_vfio(sys: &Sysfs, addr: &PciAddr, force: bool) -> Result<BindOutcome, PciError> {
    let f = function(sys, addr)?;
    if f.driver.as_deref() == Some(VFIO_PCI) {
        return Ok(BindOutcome { previous: f.driver, unchanged: true, forced_over: Vec::new() });
    }
    if !sys.pci_driver_dir(VFIO_PCI).exists() {
        return Err(PciError::VfioPciNotLoaded);
    }
    let uses = f.uses();
    if uses.contains(&DeviceUse::RootFs) {
        if force {
            return Err(PciError::HoldsRootFs { addr: *addr });
        }
        return Err(PciError::InUse { addr: *addr, uses: uses.iter().map(ToString::to_string).collect() });
    }
    if !uses.is_empty() && !force {
        return Err(PciError::InUse { addr: *addr, uses: uses.iter().map(ToString::to_string).collect() });
    }
    if f.iommu_group.is_none() {
        return Err(PciError::NoIommuGroup { addr: *addr });
    }
    let forced_over: Vec<String> = uses.iter().map(ToString::to_string).collect();
    if !forced_over.is_empty() {
        tracing::warn!(%addr, uses = ?forced_over, "taking a drive in use (--force)");
    }
    move_to(sys, addr, VFIO_PCI, f.driver.as_deref())?;
    Ok(BindOutcome { previous: f.driver, unchanged: false, forced_over })
}

/// Gives `addr` back to the kernel nvme driver: clears `driver_override`
/// (writes `"\n"`), writes the address to the current driver's `unbind`,
/// then to `drivers_probe`, and checks that the `driver` link names `nvme`.
///
/// [`PciError::NvmeDriverNotLoaded`] when the nvme driver is not
/// registered; [`PciError::InUse`] when a process holds the function's
/// `/dev/vfio/<group>` open (vfio-pci would block the unbind until it lets
/// go); a function already on nvme is left alone (`unchanged`).
pub fn unbind_to_kernel(sys: &Sysfs, addr: &PciAddr) -> Result<BindOutcome, PciError> {
    let f = function(sys, addr)?;
    if f.driver.as_deref() == Some(NVME) {
        return Ok(BindOutcome { previous: f.driver, unchanged: true, forced_over: Vec::new() });
    }
    if !sys.pci_driver_dir(NVME).exists() {
        return Err(PciError::NvmeDriverNotLoaded);
    }
    // vfio-pci's remove waits until every user has closed the device: an
    // unbind under a running tutti (or VM, or SPDK) would block, not fail.
    if let (Some(VFIO_PCI), Some(group)) = (f.driver.as_deref(), f.iommu_group) {
        let users = sys.open_devices().remove(&format!("vfio/{group}")).unwrap_or_default();
        if !users.is_empty() {
            let uses = users
                .iter()
                .map(|(pid, comm)| format!("/dev/vfio/{group} open by pid {pid} ({comm})"))
                .collect();
            return Err(PciError::InUse { addr: *addr, uses });
        }
    }
    sys.write_attr(&sys.pci_device_dir(addr).join("driver_override"), "\n")?;
    if let Some(d) = &f.driver {
        sys.write_attr(&sys.pci_driver_dir(d).join("unbind"), &addr.to_string())?;
    }
    sys.write_attr(&sys.path("sys/bus/pci/drivers_probe"), &addr.to_string())?;
    wait_for_driver(sys, addr, NVME)?;
    Ok(BindOutcome { previous: f.driver, unchanged: false, forced_over: Vec::new() })
}

fn move_to(sys: &Sysfs, addr: &PciAddr, driver: &'static str, current: Option<&str>) -> Result<(), PciError> {
    let override_path = sys.pci_device_dir(addr).join("driver_override");
    sys.write_attr(&override_path, driver)?;
    let moved = (|| {
        if let Some(d) = current {
            sys.write_attr(&sys.pci_driver_dir(d).join("unbind"), &addr.to_string())?;
        }
        sys.write_attr(&sys.path("sys/bus/pci/drivers_probe"), &addr.to_string())?;
        wait_for_driver(sys, addr, driver)
    })();
    if moved.is_err() {
        // Best effort: clear the override and probe again, so the function
        // is not left pinned to `driver` (the kernel driver may take it back).
        let _ = sys.write_attr(&override_path, "\n");
        let _ = sys.write_attr(&sys.path("sys/bus/pci/drivers_probe"), &addr.to_string());
    }
    moved
}

fn wait_for_driver(sys: &Sysfs, addr: &PciAddr, wanted: &'static str) -> Result<(), PciError> {
    let deadline = Instant::now() + sys.settle_time();
    loop {
        let now = sys.driver_of(addr);
        if now.as_deref() == Some(wanted) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(PciError::BindFailed { addr: *addr, wanted, driver: now });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Host-wide VFIO facts for `tutti-probe status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioStatus {
    /// `sys/kernel/iommu_groups` has entries: an IOMMU is active.
    pub iommu_enabled: bool,
    /// Module `vfio` is loaded (`sys/module/vfio`).
    pub vfio_loaded: bool,
    /// Module `vfio_iommu_type1` is loaded.
    pub type1_loaded: bool,
    /// The vfio-pci driver is registered (`sys/bus/pci/drivers/vfio-pci`).
    pub vfio_pci_loaded: bool,
    /// `vfio.enable_unsafe_noiommu_mode` is `Y`.
    pub noiommu_mode: bool,
    /// The uio_pci_generic driver is registered.
    pub uio_pci_generic_loaded: bool,
}

/// Reads the host-wide VFIO state.
pub fn vfio_status(sys: &Sysfs) -> VfioStatus {
    VfioStatus {
        iommu_enabled: !sys.list_dir(&sys.path("sys/kernel/iommu_groups")).is_empty(),
        vfio_loaded: sys.path("sys/module/vfio").exists(),
        type1_loaded: sys.path("sys/module/vfio_iommu_type1").exists(),
        vfio_pci_loaded: sys.pci_driver_dir(VFIO_PCI).exists(),
        noiommu_mode: sys
            .read_opt(&sys.path("sys/module/vfio/parameters/enable_unsafe_noiommu_mode"))
            .is_some_and(|v| v.starts_with('Y') || v == "1"),
        uio_pci_generic_loaded: sys.pci_driver_dir("uio_pci_generic").exists(),
    }
}
