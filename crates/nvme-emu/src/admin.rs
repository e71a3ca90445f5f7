//! Admin command set (NVMe Base 2.0, 5): Identify, queue creation and
//! deletion, Get Log Page, Set/Get Features, Abort, Asynchronous Event
//! Request.

use std::sync::atomic::Ordering;

use nvme_regs::features::feature_id;
use nvme_regs::log::log_id;
use nvme_regs::opcode::admin_opcode;
use nvme_regs::status::{command_specific, generic};
use nvme_regs::{NumberOfQueues, SmartLog, Sqe, Status};
use zerocopy::IntoBytes;

use crate::controller::{Controller, Outcome};
use crate::dma::DmaView;
use crate::identify::{identify_namespace, AERL};
use crate::media::Media;
use crate::queues::{CompQueue, Completion, CqeQuirk, SubQueue};
use crate::shared::Shared;

/// Get Features capabilities (SEL 11b) of Volatile Write Cache: bit 2,
/// changeable (not saveable, not namespace specific).
const CAPABILITY_CHANGEABLE: u32 = 1 << 2;
/// Size of the Error Information log (ELPE = 0: one 64-byte entry).
const ERROR_LOG_SIZE: usize = 64;
/// Largest Get Log Page transfer when MDTS is 0 (no limit).
const MAX_LOG_TRANSFER: u64 = 1 << 20;

fn invalid_field() -> Outcome {
    Outcome::status(Status::generic(generic::INVALID_FIELD).with_dnr(true))
}

fn cs(sc: u8) -> Outcome {
    Outcome::status(Status::command_specific(sc).with_dnr(true))
}

fn invalid_ns() -> Outcome {
    Outcome::status(Status::generic(generic::INVALID_NAMESPACE_OR_FORMAT).with_dnr(true))
}

impl Controller {
    /// Executes one admin command.
    pub(crate) fn admin(&mut self, sh: &Shared, dma: &DmaView<'_>, media: &mut Media, sqe: &Sqe) -> Outcome {
        if sqe.fuse() != 0 || sqe.psdt() != 0 {
            return invalid_field();
        }
        match sqe.opcode() {
            admin_opcode::DELETE_IO_SQ => self.delete_sq(sh, dma, sqe),
            admin_opcode::CREATE_IO_SQ => self.create_sq(sh, sqe),
            admin_opcode::GET_LOG_PAGE => self.get_log_page(sh, dma, sqe),
            admin_opcode::DELETE_IO_CQ => self.delete_cq(sqe),
            admin_opcode::CREATE_IO_CQ => self.create_cq(sh, sqe),
            admin_opcode::IDENTIFY => self.identify(sh, dma, sqe),
            // Commands complete as soon as they are fetched, so there is
            // never anything to abort: DW0 bit 0 = 1, "not aborted".
            admin_opcode::ABORT => Outcome::ok(1),
            admin_opcode::SET_FEATURES => self.set_features(media, sqe),
            admin_opcode::GET_FEATURES => self.get_features(media, sqe),
            admin_opcode::ASYNC_EVENT_REQUEST => {
                if self.aer_outstanding > u32::from(AERL) {
                    cs(command_specific::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED)
                } else {
                    // Accepted and never completed: no events are generated.
                    self.aer_outstanding += 1;
                    Outcome::Deferred
                }
            }
            _ => Outcome::status(Status::generic(generic::INVALID_OPCODE).with_dnr(true)),
        }
    }

    fn identify(&mut self, sh: &Shared, dma: &DmaView<'_>, sqe: &Sqe) -> Outcome {
        let cns = sqe.cdw10 as u8;
        let data: Vec<u8>;
        let bytes: &[u8] = match cns {
            0x00 => {
                let Some((_, ns)) = self.namespace(sqe.nsid) else {
                    return invalid_ns();
                };
                data = identify_namespace(&ns).as_bytes().to_vec();
                &data
            }
            0x01 => {
                data = std::mem::take(&mut self.identify_ctrl);
                &data
            }
            0x02 => {
                if sqe.nsid >= 0xFFFF_FFFE {
                    return invalid_ns();
                }
                let n = self.config.namespaces.len() as u32;
                data = (sqe.nsid.saturating_add(1)..=n).take(1024).flat_map(u32::to_le_bytes).collect();
                &data
            }
            _ => return invalid_field(),
        };
        let r = self.write_data(sh, dma, sqe, bytes, 4096);
        if cns == 0x01 {
            self.identify_ctrl = data;
        }
        match r {
            Ok(()) => Outcome::ok(0),
            Err(st) => Outcome::status(st),
        }
    }

    fn queue_size(&self, cdw10: u32) -> Option<u32> {
        let qsize_z = (cdw10 >> 16) as u16;
        (qsize_z >= 1 && qsize_z <= self.config.mqes).then_some(u32::from(qsize_z) + 1)
    }

    fn create_cq(&mut self, sh: &Shared, sqe: &Sqe) -> Outcome {
        let qid = sqe.cdw10 as u16;
        if qid == 0 || qid > self.granted_cqs || self.cqs.get(usize::from(qid)).is_none_or(Option::is_some) {
            return cs(command_specific::INVALID_QUEUE_IDENTIFIER);
        }
        let Some(size) = self.queue_size(sqe.cdw10) else {
            return cs(command_specific::INVALID_QUEUE_SIZE);
        };
        // PC (bit 0) must be 1: only physically contiguous queues (CAP.CQR).
        // IEN/IV are ignored: there are no interrupts.
        if sqe.cdw11 & 1 == 0 || sqe.prp1 & (self.page - 1) != 0 {
            return invalid_field();
        }
        sh.regs.clear_doorbell(qid, true);
        self.cqs[usize::from(qid)] = Some(CompQueue::new(sqe.prp1, size));
        self.active_cqs.push(qid);
        self.io_queue_created = true;
        Outcome::ok(0)
    }

    fn create_sq(&mut self, sh: &Shared, sqe: &Sqe) -> Outcome {
        let qid = sqe.cdw10 as u16;
        if qid == 0 || qid > self.granted_sqs || self.sqs.get(usize::from(qid)).is_none_or(Option::is_some) {
            return cs(command_specific::INVALID_QUEUE_IDENTIFIER);
        }
        let Some(size) = self.queue_size(sqe.cdw10) else {
            return cs(command_specific::INVALID_QUEUE_SIZE);
        };
        let cqid = (sqe.cdw11 >> 16) as u16;
        let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut).filter(|_| cqid != 0)
        else {
            return cs(command_specific::COMPLETION_QUEUE_INVALID);
        };
        // PC must be 1; QPRIO is ignored (round robin only).
        if sqe.cdw11 & 1 == 0 || sqe.prp1 & (self.page - 1) != 0 {
            return invalid_field();
        }
        cq.sq_count += 1;
        sh.regs.clear_doorbell(qid, false);
        let mut sq = SubQueue::new(sqe.prp1, size, cqid);
        // Acquire: pairs with `Emulator::set_sq_domain`'s Release store.
        sq.domain = sh.sq_domains.get(usize::from(qid)).map_or(0, |d| d.load(Ordering::Acquire));
        self.sqs[usize::from(qid)] = Some(sq);
        self.active_sqs.push(qid);
        self.io_queue_created = true;
        Outcome::ok(0)
    }

    /// Delete I/O SQ (NVMe Base 2.0 5.7). Every command of the SQ that was
    /// fetched but not completed ends with "Command Aborted due to SQ
    /// Deletion" (SCT 0h, SC 08h) on its CQ, posted before this command's
    /// own completion (or queued behind a full CQ, posted once the host
    /// moves its head): commands held by [`crate::FaultAction::NeverComplete`],
    /// and completions still scheduled by the timing model or a
    /// [`crate::FaultAction::Delay`] (those commands already moved their
    /// data: the specification lets a controller abort or complete them).
    /// Completions already waiting for room in the CQ keep their status.
    /// Entries the host published but the controller has not fetched are
    /// dropped with the queue.
    fn delete_sq(&mut self, sh: &Shared, dma: &DmaView<'_>, sqe: &Sqe) -> Outcome {
        let qid = sqe.cdw10 as u16;
        let Some(cqid) =
            self.sqs.get(usize::from(qid)).and_then(Option::as_ref).map(|s| s.cqid).filter(|_| qid != 0)
        else {
            return cs(command_specific::INVALID_QUEUE_IDENTIFIER);
        };
        // Held commands, then scheduled ones in due order (no order among
        // the aborts is promised).
        let mut aborted: Vec<u16> = self
            .sqs
            .get_mut(usize::from(qid))
            .and_then(Option::as_mut)
            .map_or_else(Vec::new, |s| std::mem::take(&mut s.held));
        // Commands whose copies are still running: they end first.
        aborted.extend(self.take_transfers_of(qid));
        if let Some(t) = &mut self.timing {
            if t.heap.iter().any(|s| s.completion.sqid == qid) {
                let mut all = std::mem::take(&mut t.heap).into_sorted_vec();
                all.reverse(); // earliest due first
                for s in all {
                    if s.completion.sqid == qid {
                        if let Some(cq) = self.cqs.get_mut(usize::from(s.cqid)).and_then(Option::as_mut) {
                            cq.in_flight = cq.in_flight.saturating_sub(1);
                        }
                        aborted.push(s.completion.cid);
                    } else {
                        t.heap.push(s);
                    }
                }
            }
        }
        // One abort per command: a CompleteTwice fault schedules two
        // completions of one CID, and the command ends only once.
        let mut seen = std::collections::HashSet::new();
        aborted.retain(|cid| seen.insert(*cid));
        let status = Status::generic(generic::ABORTED_SQ_DELETION);
        for cid in aborted {
            let c = Completion { dw0: 0, sqid: qid, cid, status, quirk: CqeQuirk::None };
            sh.stats.sq_deletion_aborts.fetch_add(1, Ordering::Relaxed);
            if self.complete_now(sh, dma, cqid, c).is_err() {
                // The CQ's memory is gone: unrecoverable, as for any CQE.
                self.fatal(sh);
                return Outcome::Deferred;
            }
        }
        if let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut) {
            cq.sq_count = cq.sq_count.saturating_sub(1);
        }
        self.sqs[usize::from(qid)] = None;
        self.active_sqs.retain(|&q| q != qid);
        Outcome::ok(0)
    }

    fn delete_cq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = sqe.cdw10 as u16;
        let Some(cq) = self.cqs.get(usize::from(qid)).and_then(Option::as_ref).filter(|_| qid != 0) else {
            return cs(command_specific::INVALID_QUEUE_IDENTIFIER);
        };
        if cq.sq_count > 0 {
            return cs(command_specific::INVALID_QUEUE_DELETION);
        }
        // Completions still waiting for room belong to deleted SQs: dropped.
        self.cqs[usize::from(qid)] = None;
        self.active_cqs.retain(|&q| q != qid);
        Outcome::ok(0)
    }

    fn get_log_page(&mut self, sh: &Shared, dma: &DmaView<'_>, sqe: &Sqe) -> Outcome {
        let lid = sqe.cdw10 as u8;
        let numd = (u64::from(sqe.cdw11 & 0xFFFF) << 16 | u64::from(sqe.cdw10 >> 16)) + 1;
        let len = numd * 4;
        let offset = u64::from(sqe.cdw12) | u64::from(sqe.cdw13) << 32;
        if len > self.max_transfer.unwrap_or(MAX_LOG_TRANSFER) || offset & 3 != 0 {
            return invalid_field();
        }
        let log: Vec<u8> = match lid {
            log_id::ERROR_INFORMATION => vec![0u8; ERROR_LOG_SIZE],
            log_id::SMART_HEALTH => {
                // Controller-wide only (LPA bit 0 = 0).
                if sqe.nsid != 0 && sqe.nsid != 0xFFFF_FFFF {
                    return invalid_field();
                }
                self.flush_stats(sh);
                self.smart_log(sh).as_bytes().to_vec()
            }
            _ => return cs(command_specific::INVALID_LOG_PAGE),
        };
        let Some(tail) = usize::try_from(offset).ok().and_then(|o| log.get(o..)) else {
            return invalid_field();
        };
        match self.write_data(sh, dma, sqe, tail, len as usize) {
            Ok(()) => Outcome::ok(0),
            Err(st) => Outcome::status(st),
        }
    }

    fn smart_log(&self, sh: &Shared) -> SmartLog {
        use std::sync::atomic::Ordering::Relaxed;
        let unit = SmartLog::DATA_UNIT_BYTES;
        let mut s = SmartLog::new_zeroed();
        s.set_composite_temperature(313); // 40 degrees C
        s.set_available_spare(100);
        s.set_available_spare_threshold(10);
        s.set_percentage_used(0);
        s.set_data_units_read(u128::from(sh.stats.media_bytes_read.load(Relaxed).div_ceil(unit)));
        s.set_data_units_written(u128::from(sh.stats.media_bytes_written.load(Relaxed).div_ceil(unit)));
        s.set_host_read_commands(u128::from(self.totals.host_reads));
        s.set_host_write_commands(u128::from(self.totals.host_writes));
        s.set_power_cycles(1);
        s
    }

    /// Set Features (Base 2.0 5.27): Number of Queues; Volatile Write
    /// Cache (WCE, CDW11 bit 0) when there is a write cache, disabling it
    /// flushing it first (a failed file sync is a Write Fault).
    fn set_features(&mut self, media: &mut Media, sqe: &Sqe) -> Outcome {
        if sqe.cdw10 & (1 << 31) != 0 {
            return cs(command_specific::FEATURE_NOT_SAVEABLE);
        }
        match sqe.cdw10 as u8 {
            feature_id::NUMBER_OF_QUEUES => {
                let nsqr = sqe.cdw11 as u16;
                let ncqr = (sqe.cdw11 >> 16) as u16;
                if nsqr == 0xFFFF || ncqr == 0xFFFF {
                    return invalid_field();
                }
                if self.io_queue_created {
                    return Outcome::status(Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr(true));
                }
                self.granted_sqs = (nsqr + 1).min(self.config.io_queues);
                self.granted_cqs = (ncqr + 1).min(self.config.io_queues);
                Outcome::ok(self.nq_dw0(self.granted_sqs, self.granted_cqs))
            }
            feature_id::VOLATILE_WRITE_CACHE => match media.set_wce(sqe.cdw11 & 1 != 0) {
                Ok(true) => Outcome::ok(0),
                // No volatile write cache (VWC = 0): not changeable.
                Ok(false) => invalid_field(),
                Err(crate::backing::MediaError::Status(st)) => Outcome::status(st),
                Err(crate::backing::MediaError::Dma) => {
                    Outcome::status(Status::generic(generic::INTERNAL_ERROR).with_dnr(true))
                }
            },
            _ => invalid_field(),
        }
    }

    /// Get Features (Base 2.0 5.15): Number of Queues; Volatile Write
    /// Cache, DW0 bit 0 = WCE (current; 1 by default with a write cache, 0
    /// without one).
    fn get_features(&mut self, media: &Media, sqe: &Sqe) -> Outcome {
        let sel = (sqe.cdw10 >> 8) & 7;
        if sel > 3 {
            return invalid_field();
        }
        match sqe.cdw10 as u8 {
            feature_id::NUMBER_OF_QUEUES => match sel {
                0 => Outcome::ok(self.nq_dw0(self.granted_sqs, self.granted_cqs)),
                1 | 2 => Outcome::ok(self.nq_dw0(self.config.io_queues, self.config.io_queues)),
                _ => Outcome::ok(0),
            },
            feature_id::VOLATILE_WRITE_CACHE => match (sel, media.wce()) {
                (0, Some(on)) => Outcome::ok(u32::from(on)),
                (1 | 2, Some(_)) => Outcome::ok(1),
                (3, Some(_)) => Outcome::ok(CAPABILITY_CHANGEABLE),
                _ => Outcome::ok(0),
            },
            _ => invalid_field(),
        }
    }

    fn nq_dw0(&self, sqs: u16, cqs: u16) -> u32 {
        NumberOfQueues { sq_count: u32::from(sqs), cq_count: u32::from(cqs) }.to_dw0()
    }
}
