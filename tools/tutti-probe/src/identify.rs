//! `tutti-probe identify <addr>`: controller and namespace facts read
//! through tutti's own admin queue (NVMe Base 2.0 5.17 Identify, 3.1.4
//! controller registers), not through the kernel.
//!
//! Every active namespace is listed with its LBA format, including one
//! formatted with metadata, which tutti cannot use: it is marked "not
//! supported" with the reason and what to do. Identify only informs, so
//! that is not an error (exit 0).

use std::fmt::Write as _;

use serde::Serialize;

use nvm_queue::{ActiveNamespace, Controller};

use nvme_regs::opcode::{Cns, Identify};
use nvme_regs::registers::offset;
use nvme_regs::{IdentifyController, Vs};

use nvme_pci::PciAddr;

use crate::util::{bring_up, context};
use crate::{Ctx, Failure, Outcome};

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
    /// Every active namespace, supported or not.
    pub namespaces: Vec<Namespace>,
}

/// An active namespace in `identify --json`.
#[derive(Debug, Serialize)]
pub struct Namespace {
    /// NSID.
    pub nsid: u32,
    /// LBA data size in bytes (2^LBADS of the formatted LBA format;
    /// metadata not included).
    pub lba_bytes: u32,
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
    /// Data bytes (`blocks * lba_bytes`).
    pub bytes: u64,
    /// Index of the formatted LBA format (FLBAS).
    pub lbaf: u8,
    /// Metadata bytes per logical block (MS of the formatted format); 0 =
    /// none.
    pub metadata_bytes: u16,
    /// With metadata: `true` when it is at the end of each block's data
    /// (extended LBA, FLBAS bit 4 = 1), `false` when in a separate buffer
    /// (MPTR). `false` without metadata.
    pub extended_lba: bool,
    /// Whether tutti can do I/O on the namespace (only formats without
    /// metadata).
    pub supported: bool,
    /// Why not, and what to do; absent when supported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported_reason: Option<String>,
    /// The LBA formats the namespace supports (LBAF 0..=NLBAF).
    pub lba_formats: Vec<LbaFormat>,
}

/// One supported LBA format of a namespace.
#[derive(Debug, Serialize)]
pub struct LbaFormat {
    /// Index (LBAF n).
    pub index: u8,
    /// LBA data size in bytes (2^LBADS); `None` when LBADS is outside
    /// 9..=16 (format not available).
    pub lba_bytes: Option<u32>,
    /// MS: metadata bytes per logical block.
    pub metadata_bytes: u16,
    /// RP: relative performance, 0 (best) to 3 (degraded).
    pub relative_performance: u8,
}

impl Namespace {
    /// `ns` as `identify` reports it.
    pub fn new(ns: &ActiveNamespace) -> Self {
        let f = ns.format;
        Self {
            nsid: ns.nsid,
            lba_bytes: f.lba_data_size,
            blocks: ns.blocks,
            bytes: ns.capacity_bytes(),
            lbaf: f.lbaf_index,
            metadata_bytes: f.metadata_size,
            extended_lba: f.has_metadata() && f.extended,
            supported: ns.is_usable(),
            unsupported_reason: ns.usable().err().map(|e| e.to_string()),
            lba_formats: ns
                .lba_formats
                .iter()
                .enumerate()
                .map(|(i, l)| LbaFormat {
                    index: i as u8,
                    lba_bytes: l.block_size().ok(),
                    metadata_bytes: l.ms(),
                    relative_performance: l.rp(),
                })
                .collect(),
        }
    }
}

/// Runs `identify`.
pub fn run(ctx: &Ctx, args: Args) -> Outcome {
    let mut ctrl = bring_up(ctx, &args.addr, IO_QUEUES_ASKED)?;
    let (report, idc) = collect(args.addr.to_string(), &mut ctrl);
    let shut = ctrl.shutdown();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    idc?;
    shut.map_err(|e| context("controller shutdown (CC.SHN) failed", e))
}

/// The report of the controller `ctrl` at `addr`, and whether Identify
/// Controller (asked again for SSVID) worked.
pub fn collect(addr: String, ctrl: &mut Controller) -> (Report, Result<(), Failure>) {
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
        addr,
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
        namespaces: ctrl.active_namespaces().iter().map(Namespace::new).collect(),
    };
    (report, idc.map(|_| ()))
}

/// The text form: `key: value` lines, then per namespace one line, a
/// "not supported" line when it applies, and its LBA formats.
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "addr: {}", r.addr);
    let _ = writeln!(o, "vid: {:#06x}", r.vid);
    let _ = writeln!(o, "ssvid: {:#06x}", r.ssvid);
    let _ = writeln!(o, "serial: {}", r.serial);
    let _ = writeln!(o, "model: {}", r.model);
    let _ = writeln!(o, "firmware: {}", r.firmware);
    let _ = writeln!(o, "version: {}", r.version);
    let _ = writeln!(o, "cntlid: {}", r.cntlid);
    let _ = match r.mdts_bytes {
        Some(b) => writeln!(o, "mdts: {b} bytes"),
        None => writeln!(o, "mdts: no limit"),
    };
    let _ = writeln!(o, "max transfer: {} bytes", r.max_transfer_bytes);
    let _ = writeln!(o, "max queue entries (CAP.MQES+1): {}", r.max_queue_entries);
    let _ = writeln!(o, "doorbell stride (CAP.DSTRD): {} ({} bytes)", r.dstrd, 4u32 << r.dstrd);
    let _ = writeln!(o, "ready timeout (CAP.TO): {} ms", r.cap_to_ms);
    let _ = writeln!(o, "namespaces (NN): {}", r.nn);
    let _ = writeln!(o, "io queues granted: {} (asked {})", r.io_queues_granted, r.io_queues_asked);
    if r.namespaces.is_empty() {
        let _ = writeln!(o, "active namespaces: none");
    }
    for n in &r.namespaces {
        let metadata = match (n.metadata_bytes, n.extended_lba) {
            (0, _) => "no metadata".to_owned(),
            (ms, true) => format!("{ms} bytes of metadata per block (extended LBA)"),
            (ms, false) => format!("{ms} bytes of metadata per block (separate buffer)"),
        };
        let _ = writeln!(
            o,
            "namespace {}: lba {} bytes, {} blocks, capacity {} bytes, LBAF {}, {metadata}",
            n.nsid, n.lba_bytes, n.blocks, n.bytes, n.lbaf
        );
        if let Some(why) = &n.unsupported_reason {
            let _ = writeln!(o, "  not supported: {why}");
        }
        let formats: Vec<String> = n
            .lba_formats
            .iter()
            .map(|f| {
                let size = f.lba_bytes.map_or_else(|| "unavailable".to_owned(), |b| format!("{b} B"));
                let md = if f.metadata_bytes == 0 {
                    String::new()
                } else {
                    format!(" + {} B metadata", f.metadata_bytes)
                };
                let used = if f.index == n.lbaf { " (in use)" } else { "" };
                format!("{}: {size}{md}{used}", f.index)
            })
            .collect();
        let _ = writeln!(o, "  lba formats: {}", formats.join(", "));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_emu::{Emulator, EmulatorConfig, NamespaceSpec};

    fn report(namespaces: Vec<NamespaceSpec>) -> Report {
        let emu = Emulator::start(EmulatorConfig::new("probe", namespaces)).unwrap();
        let mut ctrl = Controller::init(emu, nvm_queue::ControllerOptions::default()).unwrap();
        let (r, idc) = collect("0000:00:10.0".into(), &mut ctrl);
        assert!(idc.is_ok());
        ctrl.shutdown().unwrap();
        r
    }

    #[test]
    fn a_namespace_with_metadata_is_listed_with_its_format_and_marked_not_supported() {
        let r = report(vec![
            NamespaceSpec::new(2048, 512).with_metadata(8, true),
            NamespaceSpec::new(1024, 4096),
            NamespaceSpec::new(256, 4096).with_metadata(16, false),
        ]);
        let text = render(&r);
        let lines: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("namespace 1:")).collect();
        assert_eq!(
            lines,
            [
                "namespace 1: lba 512 bytes, 2048 blocks, capacity 1048576 bytes, LBAF 1, 8 bytes of metadata per \
                 block (extended LBA)",
                "  not supported: namespace 1 is formatted with 8 bytes of metadata per block (extended LBA, LBAF 1); \
                 tutti supports only formats without metadata: reformat with `nvme format /dev/nvmeX -n 1 \
                 --lbaf=0` (512-byte blocks, no metadata; erases the namespace) or pick another namespace",
                "  lba formats: 0: 512 B, 1: 512 B + 8 B metadata (in use)",
                "namespace 2: lba 4096 bytes, 1024 blocks, capacity 4194304 bytes, LBAF 0, no metadata",
                "  lba formats: 0: 4096 B (in use)",
                "namespace 3: lba 4096 bytes, 256 blocks, capacity 1048576 bytes, LBAF 1, 16 bytes of metadata per \
                 block (separate buffer)",
                "  not supported: namespace 3 is formatted with 16 bytes of metadata per block (separate buffer, \
                 LBAF 1); tutti supports only formats without metadata: reformat with `nvme format /dev/nvmeX -n 3 \
                 --lbaf=0` (4096-byte blocks, no metadata; erases the namespace) or pick another namespace",
                "  lba formats: 0: 4096 B, 1: 4096 B + 16 B metadata (in use)",
            ]
        );

        let v = serde_json::to_value(&r).unwrap();
        let ns = v["namespaces"].as_array().unwrap();
        assert_eq!(ns.len(), 3);
        assert_eq!(
            ns[0],
            serde_json::json!({
                "nsid": 1, "lba_bytes": 512, "blocks": 2048, "bytes": 1048576, "lbaf": 1,
                "metadata_bytes": 8, "extended_lba": true, "supported": false,
                "unsupported_reason": r.namespaces[0].unsupported_reason.clone().unwrap(),
                "lba_formats": [
                    {"index": 0, "lba_bytes": 512, "metadata_bytes": 0, "relative_performance": 0},
                    {"index": 1, "lba_bytes": 512, "metadata_bytes": 8, "relative_performance": 0},
                ],
            })
        );
        assert!(r.namespaces[0].unsupported_reason.as_deref().unwrap().contains("--lbaf=0"));
        // Supported: no reason field at all.
        assert_eq!(ns[1]["supported"], true);
        assert!(ns[1].get("unsupported_reason").is_none());
        assert_eq!(
            (ns[2]["extended_lba"].as_bool(), ns[2]["metadata_bytes"].as_u64()),
            (Some(false), Some(16))
        );
    }
}
