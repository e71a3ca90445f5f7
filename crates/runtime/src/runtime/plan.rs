//! Planning: every request of a batch checked and turned into per-drive
//! pieces with their NVMe commands, once. Both executions (CPU queue pairs
//! in `submit.rs`, the GPU kernel in `gpu.rs`) consume this plan; neither
//! checks or plans again.
//!
//! Each rule is checked here and only here, in this order: handles, zero
//! length, range inside the target, block alignment of offset and length
//! (the datapath's logical block size), memory range inside the region,
//! dword alignment of the memory address (PRP1, NVMe Base 2.0 4.1.1), then
//! [`plan_io`] per piece (SLBA, NLB and the MDTS split; after the checks
//! above it only fails if a drive's namespace disagrees with the datapath,
//! reported as [`RequestError::DrivePlan`]), and the command count.
//!
//! Locks: the targets and memory tables' read locks, together, for the
//! whole batch.

use std::ops::Range;
use std::sync::Arc;

use nvm_queue::{plan_io, IoPlan};

use super::{Runtime, Target};
use crate::datapath::Piece;
use crate::drive::Drive;
use crate::error::{Alignment, RequestError};
use crate::handle::HandleTable;
use crate::region::Region;
use crate::request::{Direction, Request};

/// One per-drive piece of a request and its commands.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlannedPiece {
    /// Runtime drive index.
    pub drive: usize,
    /// Index of the request in the batch.
    pub request: usize,
    /// Byte offset in the region's DMA mapping (its page-aligned start) of
    /// the piece's first byte.
    pub mem_offset: usize,
    /// The piece's commands: SLBA, NLB (MDTS split) and each command's byte
    /// offset within the piece. Iterating allocates nothing. Empty for a
    /// flush piece.
    pub io: IoPlan,
    /// A Flush of the drive's namespace (one command, no data).
    pub flush: bool,
}

impl PlannedPiece {
    /// NVMe commands of the piece.
    pub fn commands(&self) -> u32 {
        if self.flush {
            1
        } else {
            self.io.commands() as u32
        }
    }
}

/// An accepted request.
#[derive(Debug)]
pub(crate) struct PlannedRequest {
    pub datapath: usize,
    pub direction: Direction,
    /// Its memory: an index into [`BatchPlan::regions`]; `None` for a
    /// flush, which moves no data.
    pub region: Option<usize>,
    /// Executed by GPU threads (`execution: gpu`).
    pub gpu: bool,
    /// Its pieces in [`BatchPlan::pieces`].
    pub pieces: Range<usize>,
    /// NVMe commands over all pieces.
    pub commands: u32,
}

/// A batch, planned.
#[derive(Debug, Default)]
pub(crate) struct BatchPlan {
    /// One entry per request, in order.
    pub requests: Vec<Result<PlannedRequest, RequestError>>,
    pub pieces: Vec<PlannedPiece>,
    /// The memory regions the batch uses, each once (one reference per
    /// region, not per request).
    pub regions: Vec<Arc<Region>>,
}

impl BatchPlan {
    /// The accepted requests with their index.
    pub fn accepted(&self) -> impl Iterator<Item = (usize, &PlannedRequest)> + '_ {
        self.requests.iter().enumerate().filter_map(|(i, r)| r.as_ref().ok().map(|r| (i, r)))
    }

    /// Per request: accepted, or why not.
    pub fn states(&self) -> Vec<Result<(), RequestError>> {
        self.requests.iter().map(|r| r.as_ref().map(|_| ()).map_err(Clone::clone)).collect()
    }
}

impl Runtime {
    /// Checks and plans every request of `requests`.
    pub(super) fn plan_batch(&self, requests: &[Request]) -> BatchPlan {
        // One piece per request is the common case (a request inside one stripe
        // unit, or a local_nvme datapath).
        let mut plan = BatchPlan {
            requests: Vec::with_capacity(requests.len()),
            pieces: Vec::with_capacity(requests.len()),
            regions: Vec::new(),
        };
        {
            let targets = self.targets.read().unwrap_or_else(|p| p.into_inner());
            let memory = self.memory.read().unwrap_or_else(|p| p.into_inner());
            for (i, r) in requests.iter().enumerate() {
                let p = self.plan_request(&targets, &memory, i, r, &mut plan);
                plan.requests.push(p);
            }
        }
        one_gpu_region(&mut plan);
        plan
    }

    /// Checks request `index` and appends its pieces to `pieces` (nothing
    /// when it is refused).
    fn plan_request(
        &self,
        targets: &HandleTable<Target>,
        memory: &HandleTable<Arc<Region>>,
        index: usize,
        r: &Request,
        plan: &mut BatchPlan,
    ) -> Result<PlannedRequest, RequestError> {
        let t = *targets.get(r.target.0).map_err(RequestError::Target)?;
        if r.direction == Direction::Flush {
            return Ok(self.plan_flush(t.store, index, &mut plan.pieces));
        }
        let region = memory.get(r.memory.0).map_err(RequestError::Memory)?;
        let store = &self.stores[t.store];
        let facts = store.facts;
        check_request(r, t.extent.len, facts.block_size, region)?;
        let start = plan.pieces.len();
        let offset = t.extent.offset + r.offset;
        let planned = match facts.single_drive {
            Some(d) => self.plan_one_piece(d, offset, index, r, region, &mut plan.pieces),
            None => self.plan_pieces(store.datapath, offset, index, r, region, &mut plan.pieces),
        };
        match planned {
            Ok(commands) => Ok(PlannedRequest {
                datapath: store.datapath,
                direction: r.direction,
                region: Some(region_index(&mut plan.regions, region)),
                gpu: facts.gpu,
                pieces: start..plan.pieces.len(),
                commands,
            }),
            Err(e) => {
                plan.pieces.truncate(start);
                Err(e)
            }
        }
    }

    /// A flush of store `store`: one piece (one Flush command) per drive of
    /// its datapath. Always CPU-executed: a drive under GPU execution keeps
    /// one CPU queue pair for it (`drive.rs`).
    fn plan_flush(&self, store: usize, index: usize, pieces: &mut Vec<PlannedPiece>) -> PlannedRequest {
        let dpi = self.stores[store].datapath;
        let start = pieces.len();
        for d in self.datapaths[dpi].drives() {
            pieces.push(PlannedPiece {
                drive: d.index,
                request: index,
                mem_offset: 0,
                io: IoPlan::empty(),
                flush: true,
            });
        }
        PlannedRequest {
            datapath: dpi,
            direction: Direction::Flush,
            region: None,
            gpu: false,
            pieces: start..pieces.len(),
            commands: (pieces.len() - start) as u32,
        }
    }

    /// A checked request at byte `offset` of drive `d`'s namespace (a
    /// `local_nvme` datapath: one piece); returns its command count.
    fn plan_one_piece(
        &self,
        d: usize,
        offset: u64,
        index: usize,
        r: &Request,
        region: &Region,
        pieces: &mut Vec<PlannedPiece>,
    ) -> Result<u32, RequestError> {
        let piece = Piece { drive: 0, drive_offset: offset, len: r.len, request_offset: 0 };
        let p = plan_piece(&self.drives[d], piece, index, r, region)?;
        pieces.push(p);
        Ok(p.io.commands() as u32)
    }

    /// Splits a checked request at byte `offset` of datapath `dpi` into
    /// per-drive pieces and plans each piece's commands; returns the
    /// command count.
    fn plan_pieces(
        &self,
        dpi: usize,
        offset: u64,
        index: usize,
        r: &Request,
        region: &Region,
        pieces: &mut Vec<PlannedPiece>,
    ) -> Result<u32, RequestError> {
        let dp = &self.datapaths[dpi];
        let mut commands = 0u64;
        let mut err = None;
        dp.for_each_piece(offset, r.len, &mut |p| {
            if err.is_some() {
                return;
            }
            match plan_piece(&dp.drives()[p.drive], p, index, r, region) {
                Ok(p) => {
                    commands += p.io.commands() as u64;
                    pieces.push(p);
                }
                Err(e) => err = Some(e),
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        u32::try_from(commands)
            .map_err(|_| RequestError::TooManyCommands { commands, max: u64::from(u32::MAX) })
    }
}

/// Piece `p` (on drive `d`) of request `index`: its commands, and where
/// its bytes start in the region's mapping.
fn plan_piece(
    d: &Drive,
    p: Piece,
    index: usize,
    r: &Request,
    region: &Region,
) -> Result<PlannedPiece, RequestError> {
    let io = plan_io(&d.ns, p.drive_offset, p.len, d.max_transfer)
        .map_err(|source| RequestError::DrivePlan { drive: d.name.clone(), source })?;
    let mem_offset = region.lead + r.memory_offset as usize + p.request_offset as usize;
    Ok(PlannedPiece { drive: d.index, request: index, mem_offset, io, flush: false })
}

/// The index of `region` in `regions`, added if new (a batch usually
/// names one region, so the last entry is checked first).
fn region_index(regions: &mut Vec<Arc<Region>>, region: &Arc<Region>) -> usize {
    if let Some(i) = regions.iter().rposition(|r| Arc::ptr_eq(r, region)) {
        return i;
    }
    regions.push(region.clone());
    regions.len() - 1
}

/// The request-level rules, on a request whose handles resolved.
fn check_request(r: &Request, target_len: u64, block_size: u32, region: &Region) -> Result<(), RequestError> {
    if r.len == 0 {
        return Err(RequestError::ZeroLength);
    }
    if r.offset.checked_add(r.len).is_none_or(|end| end > target_len) {
        return Err(RequestError::OutOfRange { offset: r.offset, len: r.len, target_len });
    }
    // LBA sizes are powers of two (2^LBADS): a mask, not a division.
    let aligned = |x: u64| match u64::from(block_size) {
        bs if bs.is_power_of_two() => x & (bs - 1) == 0,
        bs => bs != 0 && x.is_multiple_of(bs),
    };
    let rule = if !aligned(r.offset) {
        Some(Alignment::Offset)
    } else if !aligned(r.len) {
        Some(Alignment::Length)
    } else {
        None
    };
    if let Some(rule) = rule {
        return Err(RequestError::Unaligned { offset: r.offset, len: r.len, block_size, rule });
    }
    let region_len = region.len as u64;
    if r.memory_offset.checked_add(r.len).is_none_or(|end| end > region_len) {
        return Err(RequestError::MemoryRange { offset: r.memory_offset, len: r.len, region_len });
    }
    if !(region.lead as u64 + r.memory_offset).is_multiple_of(4) {
        return Err(RequestError::MemoryUnaligned { offset: r.memory_offset });
    }
    Ok(())
}

/// A GPU launch binds one memory region per queue: a GPU-executed batch
/// uses the region of its first GPU request; other GPU requests naming
/// another region are refused.
fn one_gpu_region(plan: &mut BatchPlan) {
    let mut first: Option<usize> = None;
    for p in plan.requests.iter_mut() {
        let Ok(r) = p else { continue };
        let (true, Some(region)) = (r.gpu, r.region) else { continue };
        match first {
            None => first = Some(region),
            Some(f) if f == region => {}
            Some(_) => *p = Err(RequestError::GpuBatchMemory),
        }
    }
}
