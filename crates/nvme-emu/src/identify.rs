//! Identify data of the emulated controller and its namespaces (NVMe Base
//! 2.0, 5.17.2.1 Identify Controller, NVM Command Set 4.1.5.1 Identify
//! Namespace), built from the configuration alone.

use nvme_regs::identify::{metadata_bits, oncs_bits};
use nvme_regs::{IdentifyController, IdentifyNamespace, LbaFormat, Vs};
use zerocopy::IntoBytes;

use crate::config::{EmulatorConfig, NamespaceSpec};

/// Identify Controller VID and SSVID: FFFFh, a value the PCI-SIG never
/// assigns, so nothing mistakes the emulator for a real vendor's device
/// (or for QEMU, 1B36h).
pub const VENDOR_ID: u16 = 0xFFFF;
/// Identify Controller CNTLID.
pub const CONTROLLER_ID: u16 = 1;
/// Identify Controller ACL and AERL (zero-based): 4 each.
pub const AERL: u8 = 3;
/// Identify Controller VWC with a write cache (NVMe Base 2.0, 5.17.2.1):
/// bit 0 = a volatile write cache is present; bits 2:1 = 11b, Flush
/// accepts NSID FFFFFFFFh (all namespaces).
pub(crate) const VWC_PRESENT: u8 = 0b111;
/// The Identify Controller data structure (CNS 01h) of a controller.
pub(crate) fn identify_controller(config: &EmulatorConfig) -> Vec<u8> {
    let mut id = IdentifyController::new_zeroed();
    id.set_vid(VENDOR_ID);
    id.set_ssvid(VENDOR_ID);
    id.set_sn(&config.serial);
    id.set_mn(&config.model);
    id.set_fr(env!("CARGO_PKG_VERSION"));
    id.set_mdts(config.mdts);
    id.set_cntlid(CONTROLLER_ID);
    id.set_ver(Vs::V1_4.0);
    id.set_oacs(0);
    id.acl = AERL;
    id.aerl = AERL;
    // LPA bit 2: extended data for Get Log Page (NUMDU, LPOL/LPOU).
    id.lpa = 1 << 2;
    id.elpe = 0;
    id.set_sqes(0x66);
    id.set_cqes(0x44);
    id.set_maxcmd(config.mqes.saturating_add(1));
    id.set_nn(config.namespaces.len() as u32);
    id.set_oncs(oncs_bits::DATASET_MANAGEMENT | oncs_bits::WRITE_ZEROES);
    id.set_vwc(if config.write_cache.is_some() { VWC_PRESENT } else { 0 });
    id.set_sgls(0);
    id.as_bytes().to_vec()
}

/// The Identify Namespace data structure (CNS 00h) of namespace `ns`: one
/// LBA format without metadata, or (with `ns.metadata_size` > 0) LBAF0
/// without and LBAF1 with metadata, formatted with LBAF1.
pub(crate) fn identify_namespace(ns: &NamespaceSpec) -> IdentifyNamespace {
    let mut id = IdentifyNamespace::new_zeroed();
    id.set_nsze(ns.blocks);
    id.set_ncap(ns.blocks);
    id.set_nuse(ns.blocks);
    let lbads = ns.lbads().unwrap_or(12);
    // Cannot fail for indices 0 and 1.
    let _ = id.set_lbaf(0, LbaFormat::new(0, lbads, 0));
    if ns.metadata_size == 0 {
        id.set_nlbaf(0);
        id.set_flbas(0);
    } else {
        let _ = id.set_lbaf(1, LbaFormat::new(ns.metadata_size, lbads, 0));
        id.set_nlbaf(1);
        let (flbas, mc) = if ns.extended_lba {
            (1 | metadata_bits::FLBAS_EXTENDED, metadata_bits::MC_EXTENDED)
        } else {
            (1, metadata_bits::MC_SEPARATE)
        };
        id.set_flbas(flbas);
        id.set_mc(mc);
    }
    // DLFEAT: deallocated blocks read as zeroes (bits 2:0 = 001b), Write
    // Zeroes supports DEAC (bit 3).
    id.dlfeat = 0b1001;
    id
}
