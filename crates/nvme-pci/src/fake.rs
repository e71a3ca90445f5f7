//! A fake sysfs/procfs tree in a directory, laid out as Linux lays out the
//! files this crate reads, for tests of this crate and of the tools built
//! on it (`Sysfs::with_root`, `tutti-probe --sysfs-root`).
//!
//! Kernel attribute files that trigger actions (`unbind`, `drivers_probe`,
//! `driver_override`) are plain files here: a test reads back what was
//! written. Nothing rebinds a driver by itself; [`FakeTree::set_driver`]
//! plays the kernel's part.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::addr::PciAddr;

/// A fake tree rooted at a directory.
#[derive(Debug, Clone)]
pub struct FakeTree {
    root: PathBuf,
}

/// The PCI facts of a fake function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeFunction {
    /// PCI vendor ID.
    pub vendor: u16,
    /// PCI device ID.
    pub device: u16,
    /// 24-bit class code (NVMe: 0x010802).
    pub class: u32,
    /// Bound driver.
    pub driver: Option<String>,
    /// NUMA node as the `numa_node` file holds it (-1 = none).
    pub numa_node: i32,
    /// IOMMU group, if any.
    pub iommu_group: Option<u32>,
    /// BAR0 size in bytes (0 = unassigned).
    pub bar0_bytes: u64,
}

impl Default for FakeFunction {
    /// QEMU's NVMe controller (1b36:0010) on `nvme`, node -1, group 0, 16 KiB BAR0.
    fn default() -> Self {
        Self {
            vendor: 0x1b36,
            device: 0x0010,
            class: 0x010802,
            driver: Some("nvme".into()),
            numa_node: -1,
            iommu_group: Some(0),
            bar0_bytes: 0x4000,
        }
    }
}

fn w(path: &Path, text: &str) -> io::Result<()> {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p)?;
    }
    fs::write(path, text)
}

impl FakeTree {
    /// Creates the skeleton under `root`: the PCI bus with `nvme` and
    /// `vfio-pci` drivers registered, `drivers_probe`, empty `sys/block`,
    /// `proc/self/mountinfo`, `proc/swaps`, `sys/kernel/iommu_groups`,
    /// `sys/module/vfio*` and `dev/vfio/vfio`.
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Self> {
        let t = Self { root: root.into() };
        for d in ["sys/bus/pci/devices", "sys/block", "sys/kernel/iommu_groups", "dev/vfio"] {
            fs::create_dir_all(t.p(d))?;
        }
        for drv in ["nvme", "vfio-pci"] {
            t.add_driver(drv)?;
        }
        for m in ["vfio", "vfio_iommu_type1", "vfio_pci"] {
            fs::create_dir_all(t.p(&format!("sys/module/{m}")))?;
        }
        w(&t.p("sys/bus/pci/drivers_probe"), "")?;
        w(&t.p("proc/self/mountinfo"), "")?;
        w(&t.p("proc/swaps"), "Filename\tType\tSize\tUsed\tPriority\n")?;
        w(&t.p("dev/vfio/vfio"), "")?;
        Ok(t)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Registers a PCI driver (`sys/bus/pci/drivers/<name>/{bind,unbind}`).
    pub fn add_driver(&self, name: &str) -> io::Result<()> {
        w(&self.p(&format!("sys/bus/pci/drivers/{name}/bind")), "")?;
        w(&self.p(&format!("sys/bus/pci/drivers/{name}/unbind")), "")
    }

    /// Unregisters a PCI driver (module unloaded).
    pub fn remove_driver(&self, name: &str) -> io::Result<()> {
        fs::remove_dir_all(self.p(&format!("sys/bus/pci/drivers/{name}")))
    }

    /// Adds a PCI function.
    pub fn add_function(&self, addr: &PciAddr, f: &FakeFunction) -> io::Result<()> {
        let d = self.p(&format!("sys/bus/pci/devices/{addr}"));
        fs::create_dir_all(&d)?;
        w(&d.join("vendor"), &format!("0x{:04x}\n", f.vendor))?;
        w(&d.join("device"), &format!("0x{:04x}\n", f.device))?;
        w(&d.join("class"), &format!("0x{:06x}\n", f.class))?;
        w(&d.join("numa_node"), &format!("{}\n", f.numa_node))?;
        w(&d.join("driver_override"), "(null)\n")?;
        let (start, end) =
            if f.bar0_bytes == 0 { (0, 0) } else { (0xfe80_0000u64, 0xfe80_0000 + f.bar0_bytes - 1) };
        w(
            &d.join("resource"),
            &format!("0x{start:016x} 0x{end:016x} 0x0000000000140204\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n"),
        )?;
        if let Some(g) = f.iommu_group {
            let gd = self.p(&format!("sys/kernel/iommu_groups/{g}/devices"));
            fs::create_dir_all(&gd)?;
            let _ = symlink(format!("../../../../bus/pci/devices/{addr}"), gd.join(addr.to_string()));
            symlink(format!("../../../../kernel/iommu_groups/{g}"), d.join("iommu_group"))?;
            w(&self.p(&format!("dev/vfio/{g}")), "")?;
        }
        self.set_driver(addr, f.driver.as_deref())
    }

    /// Points the function's `driver` link at `driver` (or removes it), as
    /// the kernel does after a successful probe.
    pub fn set_driver(&self, addr: &PciAddr, driver: Option<&str>) -> io::Result<()> {
        let link = self.p(&format!("sys/bus/pci/devices/{addr}/driver"));
        let _ = fs::remove_file(&link);
        if let Some(drv) = driver {
            symlink(format!("../../../../bus/pci/drivers/{drv}"), &link)?;
        }
        Ok(())
    }

    /// Adds kernel controller `nvmeN` under the function (`nvme/nvmeN`).
    pub fn add_controller(
        &self,
        addr: &PciAddr,
        name: &str,
        model: &str,
        serial: &str,
        fw: &str,
    ) -> io::Result<()> {
        let d = self.p(&format!("sys/bus/pci/devices/{addr}/nvme/{name}"));
        // The kernel pads these with spaces.
        w(&d.join("model"), &format!("{model:<40}\n"))?;
        w(&d.join("serial"), &format!("{serial:<20}\n"))?;
        w(&d.join("firmware_rev"), &format!("{fw:<8}\n"))
    }

    /// Adds namespace block device `disk` (e.g. `nvme0n1`) of controller
    /// `ctrl`, `bytes` long with `lba_bytes` blocks, device number `majmin`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_namespace(
        &self,
        addr: &PciAddr,
        ctrl: &str,
        disk: &str,
        nsid: u32,
        bytes: u64,
        lba_bytes: u32,
        majmin: &str,
    ) -> io::Result<()> {
        fs::create_dir_all(self.p(&format!("sys/bus/pci/devices/{addr}/nvme/{ctrl}/{disk}")))?;
        let b = self.p(&format!("sys/block/{disk}"));
        w(&b.join("size"), &format!("{}\n", bytes / 512))?;
        w(&b.join("dev"), &format!("{majmin}\n"))?;
        w(&b.join("nsid"), &format!("{nsid}\n"))?;
        w(&b.join("queue/logical_block_size"), &format!("{lba_bytes}\n"))?;
        fs::create_dir_all(b.join("holders"))
    }

    /// Adds partition `part` of `disk`.
    pub fn add_partition(&self, disk: &str, part: &str, bytes: u64, majmin: &str) -> io::Result<()> {
        let b = self.p(&format!("sys/block/{disk}/{part}"));
        w(&b.join("size"), &format!("{}\n", bytes / 512))?;
        w(&b.join("dev"), &format!("{majmin}\n"))?;
        w(&b.join("partition"), "1\n")?;
        fs::create_dir_all(b.join("holders"))
    }

    /// Mounts block device `/dev/<dev>` (number `majmin`) at `at`.
    pub fn mount(&self, dev: &str, majmin: &str, at: &str) -> io::Result<()> {
        let p = self.p("proc/self/mountinfo");
        let mut s = fs::read_to_string(&p).unwrap_or_default();
        let id = s.lines().count() + 20;
        s.push_str(&format!(
            "{id} 1 {majmin} / {} rw,relatime shared:1 - ext4 /dev/{dev} rw\n",
            at.replace(' ', "\\040")
        ));
        fs::write(p, s)
    }

    /// Stacks `holder` (e.g. `md0`, `dm-0`) on `dev`, a disk or a partition
    /// (`disk/part` path under `sys/block`); `dm_name` gives the holder a
    /// device-mapper name.
    pub fn add_holder(&self, dev_path: &str, holder: &str, dm_name: Option<&str>) -> io::Result<()> {
        let h = self.p(&format!("sys/block/{dev_path}/holders"));
        fs::create_dir_all(&h)?;
        let hd = self.p(&format!("sys/block/{holder}"));
        fs::create_dir_all(&hd)?;
        if let Some(n) = dm_name {
            w(&hd.join("dm/name"), &format!("{n}\n"))?;
        }
        let _ = symlink(format!("../../../{holder}"), h.join(holder));
        Ok(())
    }

    /// Gives `holder` a device number (so that it can be mounted).
    pub fn set_dev(&self, block: &str, majmin: &str) -> io::Result<()> {
        w(&self.p(&format!("sys/block/{block}/dev")), &format!("{majmin}\n"))
    }

    /// Process `pid` named `comm` holds `/dev/<dev>` open as fd 3.
    pub fn open_fd(&self, pid: u32, comm: &str, dev: &str) -> io::Result<()> {
        let d = self.p(&format!("proc/{pid}"));
        w(&d.join("comm"), &format!("{comm}\n"))?;
        fs::create_dir_all(d.join("fd"))?;
        let n = fs::read_dir(d.join("fd"))?.count() + 3;
        symlink(format!("/dev/{dev}"), d.join("fd").join(n.to_string()))
    }

    /// Reads a file of the tree, relative to the root.
    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.p(rel)).unwrap_or_default()
    }
}
