//! `tutti-probe list [--json]`.

use serde::Serialize;

use nvme_pci::{enumerate, NvmeFunction, VFIO_PCI};

use crate::util::{bring_up, human_bytes};
use crate::{Ctx, Outcome};

/// Arguments of `list`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// One row of `list --json`. Field names are stable.
#[derive(Debug, Serialize)]
pub struct Entry {
    /// PCI address, `0000:00:04.0`.
    pub addr: String,
    /// PCI vendor ID.
    pub vendor: u16,
    /// PCI device ID.
    pub device: u16,
    /// Current driver, `null` when unbound.
    pub driver: Option<String>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// IOMMU group.
    pub iommu_group: Option<u32>,
    /// BAR0 size in bytes.
    pub bar0_bytes: Option<u64>,
    /// Model number (from sysfs on `nvme`, from our Identify on vfio-pci).
    pub model: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// Firmware revision.
    pub firmware: Option<String>,
    /// Namespaces.
    pub namespaces: Vec<Namespace>,
    /// What uses the drive (mounts, holders, open fds, root fs).
    pub uses: Vec<String>,
}

/// A namespace in `list --json`.
#[derive(Debug, Serialize)]
pub struct Namespace {
    /// NSID.
    pub nsid: u32,
    /// Logical block size in bytes.
    pub lba_bytes: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    /// Size in bytes.
    pub bytes: u64,
}

fn entry(ctx: &Ctx, f: &NvmeFunction) -> Entry {
    let mut e = Entry {
        addr: f.addr.to_string(),
        vendor: f.vendor,
        device: f.device,
        driver: f.driver.clone(),
        numa_node: f.numa_node,
        iommu_group: f.iommu_group,
        bar0_bytes: f.bar0_bytes,
        model: None,
        serial: None,
        firmware: None,
        namespaces: Vec::new(),
        uses: f.uses().iter().map(ToString::to_string).collect(),
    };
    if let Some(c) = f.controllers.first() {
        e.model = Some(c.model.clone());
        e.serial = Some(c.serial.clone());
        e.firmware = Some(c.firmware.clone());
        for ns in f.controllers.iter().flat_map(|c| &c.namespaces) {
            let lba = ns.logical_block_bytes.unwrap_or(512).max(1);
            e.namespaces.push(Namespace {
                nsid: ns.nsid.unwrap_or(0),
                lba_bytes: lba,
                blocks: ns.bytes / u64::from(lba),
                bytes: ns.bytes,
            });
        }
    } else if f.driver.as_deref() == Some(VFIO_PCI) {
        // Ours to drive: ask the controller itself. Failure (no access, busy
        // group, another process driving it) leaves "-".
        match bring_up(ctx, &f.addr, 1) {
            Ok(mut ctrl) => {
                let info = ctrl.info().clone();
                e.model = Some(info.model);
                e.serial = Some(info.serial);
                e.firmware = Some(info.firmware);
                for ns in ctrl.namespaces() {
                    e.namespaces.push(Namespace {
                        nsid: ns.nsid,
                        lba_bytes: ns.block_size,
                        blocks: ns.blocks,
                        bytes: ns.capacity_bytes(),
                    });
                }
                if let Err(err) = ctrl.shutdown() {
                    eprintln!("tutti-probe: {}: shutdown after identify: {err}", f.addr);
                }
            }
            Err(err) => {
                if let crate::Failure::Error(err) = err {
                    eprintln!("tutti-probe: {}: cannot identify through vfio: {err}", f.addr);
                }
            }
        }
    }
    e
}

/// Runs `list`.
pub fn run(ctx: &Ctx, args: Args) -> Outcome {
    let fns = enumerate(&ctx.sysfs)?;
    let rows: Vec<Entry> = fns.iter().map(|f| entry(ctx, f)).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no NVMe functions (PCI class 0x010802) found");
        return Ok(());
    }
    let dash = |o: &Option<String>| o.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into());
    let num = |o: Option<u32>| o.map_or_else(|| "-".into(), |n| n.to_string());
    let table: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            let ns = if r.namespaces.is_empty() {
                "-".to_owned()
            } else {
                r.namespaces
                    .iter()
                    .map(|n| format!("n{}:{}/{}B", n.nsid, human_bytes(n.bytes), n.lba_bytes))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            [
                r.addr.clone(),
                format!("{:04x}:{:04x}", r.vendor, r.device),
                dash(&r.model),
                dash(&r.serial),
                dash(&r.firmware),
                ns,
                dash(&r.driver),
                num(r.numa_node),
                num(r.iommu_group),
                if r.uses.is_empty() { "-".to_owned() } else { r.uses.join("; ") },
            ]
        })
        .collect();
    let head = ["ADDR", "VID:DID", "MODEL", "SERIAL", "FW", "NAMESPACES", "DRIVER", "NUMA", "GROUP", "USES"];
    let mut w = head.map(str::len);
    for row in &table {
        for (i, c) in row.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<width$}  ", width = w[i]));
            }
        }
        s
    };
    println!("{}", line(&head.map(str::to_owned)));
    for row in &table {
        println!("{}", line(row));
    }
    Ok(())
}
