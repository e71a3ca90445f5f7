//! NVM command set I/O commands (NVM Command Set 1.0, 3): Read, Write,
//! Flush, Write Zeroes, Dataset Management.
//!
//! Checks, in this order: FUSE/PSDT (Invalid Field), opcode (Invalid
//! Command Opcode), NSID (Invalid Namespace or Format; FFFFFFFFh only for
//! Flush), SLBA + NLB within NSZE (LBA Out of Range), transfer length
//! within MDTS (Invalid Field), then the PRPs (PRP Offset Invalid, Data
//! Transfer Error).
//!
//! With a volatile write cache ([`crate::WriteCacheSpec`]) a Write is
//! complete once its data is in the cache (durable with FUA, CDW12 bit 30);
//! Flush makes the namespace's cached blocks durable (all namespaces for
//! NSID FFFFFFFFh) and syncs a file store, a failed sync completing it
//! with Write Fault (SCT 2h, SC 80h); Write Zeroes and deallocation are
//! durable at completion. Without one, Flush does nothing.
//!
//! A namespace formatted with metadata ([`NamespaceSpec::metadata_size`])
//! only has its format served: Read and Write on it fail with Invalid
//! Namespace or Format after the NSID check (no metadata is stored or
//! transferred); Flush, Write Zeroes and Dataset Management, which move no
//! block data, work as on any namespace.

use nvme_regs::opcode::nvm_opcode;
use nvme_regs::status::generic;
use nvme_regs::{Sqe, Status};

use crate::backing::MediaError;
use crate::config::NamespaceSpec;
use crate::controller::{Controller, Outcome};
use crate::dma::DmaView;
use crate::media::Media;
use crate::shared::Shared;

fn fail(sc: u8) -> Outcome {
    Outcome::status(Status::generic(sc).with_dnr(true))
}

fn success(media_bytes: u64) -> Outcome {
    Outcome::Complete { status: Status::SUCCESS, dw0: 0, media_bytes: Some(media_bytes) }
}

/// CDW12 bit 30 of Read and Write: FUA, Force Unit Access.
const FUA: u32 = 1 << 30;
/// CDW12 bit 25 of Write Zeroes: DEAC, deallocate.
const DEAC: u32 = 1 << 25;
/// CDW11 bit 2 of Dataset Management: AD, deallocate.
const AD: u32 = 1 << 2;

impl Controller {
    /// Executes one I/O command.
    pub(crate) fn io(&mut self, sh: &Shared, dma: &DmaView<'_>, media: &mut Media, sqe: &Sqe) -> Outcome {
        if sqe.fuse() != 0 || sqe.psdt() != 0 {
            return fail(generic::INVALID_FIELD);
        }
        let op = sqe.opcode();
        if !matches!(
            op,
            nvm_opcode::FLUSH
                | nvm_opcode::WRITE
                | nvm_opcode::READ
                | nvm_opcode::WRITE_ZEROES
                | nvm_opcode::DATASET_MANAGEMENT
        ) {
            return fail(generic::INVALID_OPCODE);
        }
        if op == nvm_opcode::FLUSH && sqe.nsid == 0xFFFF_FFFF {
            return flush(media, None);
        }
        let Some((ns_index, ns)) = self.namespace(sqe.nsid) else {
            return fail(generic::INVALID_NAMESPACE_OR_FORMAT);
        };
        if ns.metadata_size != 0 && matches!(op, nvm_opcode::READ | nvm_opcode::WRITE) {
            return fail(generic::INVALID_NAMESPACE_OR_FORMAT);
        }
        match op {
            nvm_opcode::FLUSH => flush(media, Some(ns_index)),
            nvm_opcode::READ | nvm_opcode::WRITE => self.read_write(sh, dma, media, sqe, (ns_index, ns)),
            nvm_opcode::WRITE_ZEROES => self.write_zeroes(media, sqe, ns_index, ns),
            _ => self.dataset_management(sh, dma, media, sqe, ns_index, ns),
        }
    }

    /// (SLBA, NLB) in logical blocks, NLB one-based, from CDW10..12, or LBA
    /// Out of Range.
    fn lba_range(sqe: &Sqe, ns: NamespaceSpec) -> Result<(u64, u64), Outcome> {
        let slba = u64::from(sqe.cdw10) | u64::from(sqe.cdw11) << 32;
        let nlb = u64::from(sqe.cdw12 & 0xFFFF) + 1;
        match slba.checked_add(nlb) {
            Some(end) if end <= ns.blocks => Ok((slba, nlb)),
            _ => Err(fail(generic::LBA_OUT_OF_RANGE)),
        }
    }

    fn read_write(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        media: &mut Media,
        sqe: &Sqe,
        (ns_index, ns): (usize, NamespaceSpec),
    ) -> Outcome {
        let (slba, nlb) = match Self::lba_range(sqe, ns) {
            Ok(r) => r,
            Err(o) => return o,
        };
        let len = nlb * u64::from(ns.block_size);
        if self.max_transfer.is_some_and(|m| len > m) {
            return fail(generic::INVALID_FIELD);
        }
        let is_read = sqe.opcode() == nvm_opcode::READ;
        if !media.is_null() {
            if let Err(st) = self.walk(sh, dma, sqe, len) {
                return Outcome::status(st);
            }
            let r = if is_read {
                media.read(dma, ns_index, slba, &self.segs)
            } else {
                media.write(dma, ns_index, (slba, nlb), &self.segs, sqe.cdw12 & FUA != 0)
            };
            match r {
                Ok(()) => {}
                Err(MediaError::Dma) => {
                    self.data_fault(sh, dma);
                    return fail(generic::DATA_TRANSFER_ERROR);
                }
                Err(MediaError::Status(st)) => return Outcome::status(st),
            }
        }
        if is_read {
            self.local.media_bytes_read += len;
            self.local.host_reads += 1;
        } else {
            self.local.media_bytes_written += len;
            self.local.host_writes += 1;
        }
        success(len)
    }

    /// Write Zeroes: the range reads back as zeroes afterwards, with or
    /// without DEAC (deallocated blocks read as zeroes, DLFEAT = 001b).
    /// Not limited by MDTS (no data is transferred).
    fn write_zeroes(&mut self, media: &mut Media, sqe: &Sqe, ns_index: usize, ns: NamespaceSpec) -> Outcome {
        let (slba, nlb) = match Self::lba_range(sqe, ns) {
            Ok(r) => r,
            Err(o) => return o,
        };
        let _deallocate = sqe.cdw12 & DEAC != 0;
        match media.zero(ns_index, slba, nlb) {
            Ok(()) => success(0),
            Err(MediaError::Status(st)) => Outcome::status(st),
            Err(MediaError::Dma) => fail(generic::INTERNAL_ERROR),
        }
    }

    /// Dataset Management: with AD set, every range is deallocated (zeroed
    /// in the store, so later reads return zeroes); other attributes are
    /// hints and ignored. All ranges are checked before any is changed. In
    /// the null store the range list is not read.
    fn dataset_management(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        media: &mut Media,
        sqe: &Sqe,
        ns_index: usize,
        ns: NamespaceSpec,
    ) -> Outcome {
        let nr = (sqe.cdw10 & 0xFF) as usize + 1;
        if sqe.cdw11 & AD == 0 || media.is_null() {
            return success(0);
        }
        if let Err(st) = self.read_data(sh, dma, sqe, nr * 16) {
            return Outcome::status(st);
        }
        let range = |i: usize, s: &[u8]| -> Option<(u64, u64)> {
            let r = s.get(i * 16..i * 16 + 16)?;
            let nlb = u64::from(u32::from_le_bytes(r.get(4..8)?.try_into().ok()?));
            let slba = u64::from_le_bytes(r.get(8..16)?.try_into().ok()?);
            Some((slba, nlb))
        };
        for i in 0..nr {
            match range(i, &self.scratch) {
                Some((slba, nlb)) if slba.checked_add(nlb).is_some_and(|e| e <= ns.blocks) => {}
                _ => return fail(generic::LBA_OUT_OF_RANGE),
            }
        }
        for i in 0..nr {
            let Some((slba, nlb)) = range(i, &self.scratch) else {
                break;
            };
            if nlb == 0 {
                continue;
            }
            if let Err(MediaError::Status(st)) = media.zero(ns_index, slba, nlb) {
                return Outcome::status(st);
            }
        }
        success(0)
    }
}

/// Flush of namespace `ns` (all for `None`): a failed sync of the file
/// store is a Write Fault.
fn flush(media: &mut Media, ns: Option<usize>) -> Outcome {
    match media.flush(ns) {
        Ok(()) => success(0),
        Err(MediaError::Status(st)) => Outcome::status(st),
        Err(MediaError::Dma) => fail(generic::INTERNAL_ERROR),
    }
}
