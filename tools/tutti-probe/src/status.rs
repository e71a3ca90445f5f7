//! `tutti-probe status`: is this host ready for tutti on vfio-pci?

use nvme_pci::error::ENABLE_IOMMU_HINT;
use nvme_pci::{can_read_write, enumerate, vfio_status, VFIO_PCI};

use crate::{Ctx, Outcome};

/// Arguments of `status` (none yet).
#[derive(Debug, clap::Args)]
pub struct Args {}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// Runs `status`.
pub fn run(ctx: &Ctx, _args: Args) -> Outcome {
    let st = vfio_status(&ctx.sysfs);
    let groups = ctx.sysfs.list_dir(&ctx.sysfs.path("sys/kernel/iommu_groups")).len();
    println!("iommu enabled: {} ({groups} groups in /sys/kernel/iommu_groups)", yes(st.iommu_enabled));
    if !st.iommu_enabled {
        println!("  fix: {ENABLE_IOMMU_HINT}");
    }
    println!("vfio module: {}", yes(st.vfio_loaded));
    println!("vfio_iommu_type1 module: {}", yes(st.type1_loaded));
    println!("vfio-pci driver: {}", yes(st.vfio_pci_loaded));
    if !st.vfio_pci_loaded || !st.type1_loaded {
        println!("  fix: modprobe vfio-pci vfio_iommu_type1");
    }
    println!("vfio no-IOMMU mode: {}", if st.noiommu_mode { "ON (unsafe)" } else { "off" });
    println!("uio_pci_generic driver: {}", yes(st.uio_pci_generic_loaded));
    for f in enumerate(&ctx.sysfs)? {
        let driver = f.driver.as_deref().unwrap_or("none");
        let group = match f.iommu_group {
            None => "none".to_owned(),
            Some(g) => {
                let p = ctx.sysfs.path(&format!("dev/vfio/{g}"));
                let np = ctx.sysfs.path(&format!("dev/vfio/noiommu-{g}"));
                let (file, p) = if p.exists() {
                    (format!("/dev/vfio/{g}"), p)
                } else if np.exists() {
                    (format!("/dev/vfio/noiommu-{g}"), np)
                } else {
                    (format!("/dev/vfio/{g}"), p)
                };
                let state = if !p.exists() {
                    if driver == VFIO_PCI {
                        "missing"
                    } else {
                        "absent (not on vfio-pci)"
                    }
                } else if can_read_write(&p) {
                    "present, accessible"
                } else {
                    "present, NOT accessible (run as root, or chown/udev-rule it to this user)"
                };
                format!("{g} ({file}: {state})")
            }
        };
        let uses = f.uses();
        let uses = if uses.is_empty() {
            String::new()
        } else {
            format!(", in use: {}", uses.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
        };
        println!("{}: driver {driver}, iommu group {group}{uses}", f.addr);
    }
    Ok(())
}
