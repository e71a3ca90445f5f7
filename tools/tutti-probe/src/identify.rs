//! `tutti-probe identify <addr>`: controller and namespace facts read
//! through tutti's own admin queue (NVMe Base 2.0 5.17 Identify, 3.1.4
//! controller registers), not through the kernel.

use serde::Serialize;

use nvme_regs::opcode::{Cns, Identify};
use nvme_regs::registers::offset;
use nvme_regs::{IdentifyController, Vs};

use nvme_pci::PciAddr;

use crate::util::{bring_up, context};
use crate::{Ctx, Outcome};

/// I/O queue pairs asked for with Set Features (Number of Queues), to learn
/// how many the controller grants.
pub const IO_QUEUES_ASKED: u16 = 64;

/// Arguments of `identify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// PCI address of a function bound to vfio-pci.
    addr: PciAddr,
    /// Print JSON instead of `key: value` lines.
    #[arg(long)]
    json: bool,
}

/// What `identify` reports.
#[derive(Debug, Serialize)]
pub struct Report {
    /// PCI address.
    pub addr: String,
    /// PCI Vendor ID (Identify VID).
    pub vid: u16,
    /// PCI Subsystem Vendor ID (Identify SSVID).
    pub ssvid: u16,
    /// Serial number (SN).
    pub serial: String,
    /// Model number (MN).
    pub model: String,
    /// Firmware revision (FR).
    pub firmware: String,
    /// NVMe version from the VS register, `major.minor.tertiary`.
    pub version: String,
    /// Controller ID (CNTLID).
    pub cntlid: u16,
    /// MDTS in bytes (`2^MDTS * CAP.MPSMIN`), `None` for no limit.
    pub mdts_bytes: Option<u64>,
    /// Largest transfer the driver will issue per command, bytes.
    pub max_transfer_bytes: usize,
    /// Maximum queue entries (CAP.MQES + 1).
    pub max_queue_entries: u32,
    /// CAP.DSTRD (doorbell stride = 4 << DSTRD bytes).
    pub dstrd: u8,
    /// CAP.TO in milliseconds (CAP.TO * 500).
    pub cap_to_ms: u64,
    /// Number of namespaces (NN).
    pub nn: u32,
    /// I/O queue pairs asked for.
    pub io_queues_asked: u16,
    /// I/O queue pairs granted (Set Features, Number of Queues).
    pub io_queues_granted: u16,
    /// Active namespaces (without metadata).
    pub namespaces: Vec<crate::list::Namespace>,
}

/// Runs `identify`.
pub fn run(ctx: &Ctx, args: Args) -> Outcome {
    let mut ctrl = bring_up(ctx, &args.addr, IO_QUEUES_ASKED)?;
    let mut page = [0u8; 4096];
    let idc = ctrl
        .admin_with_data(Identify::new(Cns::Controller).build(), "Identify Controller", &mut page)
        .map_err(|e| context("Identify Controller failed", e))
        .and_then(|_| {
            IdentifyController::parse(&page).map(|c| c.ssvid()).map_err(|e| context("Identify Controller", e))
        });
    let vs = ctrl.device().bar0().read32(offset::VS).map(Vs);
    let cap = ctrl.cap();
    let info = ctrl.info().clone();
    let report = Report {
        addr: args.addr.to_string(),
        vid: info.vid,
        ssvid: *idc.as_ref().unwrap_or(&0),
        serial: info.serial.clone(),
        model: info.model.clone(),
        firmware: info.firmware.clone(),
        version: match vs {
            Ok(v) => format!("{}.{}.{}", v.mjr(), v.mnr(), v.ter()),
            Err(_) => "-".into(),
        },
        cntlid: info.cntlid,
        mdts_bytes: (info.mdts != 0).then(|| (1u64 << info.mdts) * cap.min_page_size() as u64),
        max_transfer_bytes: ctrl.max_transfer(),
        max_queue_entries: cap.max_queue_entries(),
        dstrd: cap.dstrd(),
        cap_to_ms: cap.timeout_ms(),
        nn: info.nn,
        io_queues_asked: IO_QUEUES_ASKED,
        io_queues_granted: ctrl.io_queues_granted(),
        namespaces: ctrl
            .namespaces()
            .iter()
            .map(|n| crate::list::Namespace {
                nsid: n.nsid,
                lba_bytes: n.block_size,
                blocks: n.blocks,
                bytes: n.capacity_bytes(),
            })
            .collect(),
    };
    let shut = ctrl.shutdown();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    idc?;
    shut.map_err(|e| context("controller shutdown (CC.SHN) failed", e))
}

fn print_report(r: &Report) {
    println!("addr: {}", r.addr);
    println!("vid: {:#06x}", r.vid);
    println!("ssvid: {:#06x}", r.ssvid);
    println!("serial: {}", r.serial);
    println!("model: {}", r.model);
    println!("firmware: {}", r.firmware);
    println!("version: {}", r.version);
    println!("cntlid: {}", r.cntlid);
    match r.mdts_bytes {
        Some(b) => println!("mdts: {b} bytes"),
        None => println!("mdts: no limit"),
    }
    println!("max transfer: {} bytes", r.max_transfer_bytes);
    println!("max queue entries (CAP.MQES+1): {}", r.max_queue_entries);
    println!("doorbell stride (CAP.DSTRD): {} ({} bytes)", r.dstrd, 4u32 << r.dstrd);
    println!("ready timeout (CAP.TO): {} ms", r.cap_to_ms);
    println!("namespaces (NN): {}", r.nn);
    println!("io queues granted: {} (asked {})", r.io_queues_granted, r.io_queues_asked);
    for n in &r.namespaces {
        println!(
            "namespace {}: lba {} bytes, {} blocks, capacity {} bytes",
            n.nsid, n.lba_bytes, n.blocks, n.bytes
        );
    }
}
