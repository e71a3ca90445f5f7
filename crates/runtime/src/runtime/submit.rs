//! Submission: a batch planned once (`plan.rs`), registered as one
//! operation (`ops.rs`), then executed: CPU-executed commands are written
//! here, GPU-executed ones launched as one kernel (`gpu.rs`).
//!
//! CPU execution groups the batch's commands per drive and takes one queue
//! pair per drive: every SQE of the group is written, then the SQ tail
//! doorbell is written once ([`QueuePair::ring`]; Linux's
//! `nvme_write_sq_db` and io_uring's explicit tail publication are the
//! model). Completions are not reaped here, except from a queue that is
//! full (to make room), and those are routed after the queue's lock is let
//! go.
//!
//! Locks, in this order and one step at a time (only the two tables'
//! read locks are held together, while planning): the targets and memory
//! tables (read), the operations table (registering), one queue pair at a
//! time (writing SQEs), the operations table again (routing completions
//! reaped from a full queue and failing commands that were not sent).

use std::sync::atomic::Ordering;
use std::time::Instant;

use nvm_queue::{Completion, DataRef, IoOp, QueuePair, SubmitError};
use nvme_regs::opcode::Flush;

use super::ops::{make_tag, OpState, TAG_SLOT_MAX};
use super::plan::BatchPlan;
use super::{lock, Runtime, MAX_BATCH, SUBMIT_RETRY_BOUND};
use crate::drive::Drive;
use crate::error::{RequestError, RequestStatus, SubmitFailure};
use crate::handle::{OpHandle, RawHandle};
use crate::request::{Direction, Request, Submission};

/// Commands of a batch that did not reach a drive: (request, count, why).
type Unsent = Vec<(usize, u32, SubmitFailure)>;

/// Completions reaped from a full queue while submitting, with the index
/// of the drive they came from; routed once the queue is let go.
type Reaped = Vec<(usize, Completion)>;

impl Runtime {
    /// Submits a batch. Each request is checked (handles, range inside the
    /// target, block alignment, memory range and alignment) and planned
    /// once, then queued; the result carries one state per request, in
    /// order, and an operation handle to [`Runtime::wait`] on when at least
    /// one was accepted. The SQ tail doorbell of each queue the batch uses
    /// is written once per call (more often only when a queue fills up).
    ///
    /// A batch holds at most [`MAX_BATCH`] requests
    /// ([`RequestError::BatchTooLarge`] for each otherwise).
    pub fn submit(&self, requests: &[Request]) -> Submission {
        self.submit_counted(requests, None)
    }

    /// As [`Runtime::submit`], with the batch's GPU-executed requests
    /// launched on the caller's CUDA stream `stream` (a `CUstream` of the
    /// runtime's GPU, device 0's primary context, as a number: PyTorch's
    /// `torch.cuda.Stream.cuda_stream`, CuPy's `Stream.ptr`) instead of the
    /// runtime's own: the kernel runs after the work queued before it on
    /// that stream (a save sees the KV the engine just computed), and work
    /// queued after it runs after the I/O (a layer's attention after its
    /// load), with no host synchronisation. [`Runtime::wait`] and
    /// [`Runtime::try_wait`] work as for any operation;
    /// [`Runtime::gpu_event`] gives the launch's end event. CPU-executed
    /// requests of the batch ignore the stream. Stream 0 (the legacy
    /// default stream) is refused per request with
    /// [`RequestStatus::SubmitFailed`].
    ///
    /// # Safety
    ///
    /// `stream` must be a live stream of the runtime's GPU context and stay
    /// alive until the operation has been waited on.
    pub unsafe fn submit_on_stream(&self, requests: &[Request], stream: u64) -> Submission {
        self.submit_counted(requests, Some(stream))
    }

    fn submit_counted(&self, requests: &[Request], stream: Option<u64>) -> Submission {
        // Counted before the shutdown check, so `shutdown` can wait for every
        // submit that got past it before deleting queues.
        self.submitters.fetch_add(1, Ordering::AcqRel);
        let sub = self.submit_inner(requests, stream);
        self.submitters.fetch_sub(1, Ordering::AcqRel);
        sub
    }

    fn submit_inner(&self, requests: &[Request], stream: Option<u64>) -> Submission {
        let refuse_all = |e: RequestError| Submission { op: None, states: vec![Err(e); requests.len()] };
        if self.shutting_down.load(Ordering::Acquire) {
            return refuse_all(RequestError::ShuttingDown);
        }
        if requests.len() > MAX_BATCH {
            return refuse_all(RequestError::BatchTooLarge {
                requests: requests.len() as u64,
                max: MAX_BATCH as u64,
            });
        }
        let plan = self.plan_batch(requests);
        let states = plan.states();
        if plan.accepted().next().is_none() {
            return Submission { op: None, states };
        }
        let Some(op) = self.register_op(&plan) else {
            return refuse_all(RequestError::TooManyOperations { limit: u64::from(TAG_SLOT_MAX) + 1 });
        };
        self.issue_cpu(op, &plan);
        self.launch_gpu(op, &plan, stream);
        Submission { op: Some(OpHandle(op)), states }
    }

    /// Registers the batch as an operation; `None` when the operations
    /// table is full (its slots, like a command tag's, are 24 bits).
    fn register_op(&self, plan: &BatchPlan) -> Option<RawHandle> {
        let mut datapaths: Vec<usize> = Vec::with_capacity(1);
        for (_, r) in plan.accepted() {
            if !datapaths.contains(&r.datapath) {
                datapaths.push(r.datapath);
            }
        }
        // Regions of refused requests (the GPU one-region rule) are kept
        // too: harmless, and they are released with the operation.
        let regions = plan.regions.clone();
        let counts = plan.requests.iter().map(|r| r.as_ref().map(|r| r.commands).map_err(Clone::clone));
        let mut ops = lock(&self.ops);
        // The table's SLOT_MAX is the tag's TAG_SLOT_MAX: every slot fits.
        ops.insert(OpState::new(counts, datapaths.into(), regions))
    }

    /// Writes every CPU-executed command of the batch, grouped per drive,
    /// one doorbell write per queue.
    fn issue_cpu(&self, op: RawHandle, plan: &BatchPlan) {
        let mut order: Vec<usize> = Vec::with_capacity(plan.pieces.len());
        order.extend(plan.accepted().filter(|(_, r)| !r.gpu).flat_map(|(_, r)| r.pieces.clone()));
        if order.is_empty() {
            return;
        }
        // Stable: within a drive, pieces keep request order (and a batch on
        // one drive is sorted already).
        if !order.is_sorted_by_key(|&i| plan.pieces[i].drive) {
            order.sort_by_key(|&i| plan.pieces[i].drive);
        }
        let mut unsent = Unsent::new();
        let mut reaped = Reaped::new();
        for group in order.chunk_by(|&a, &b| plan.pieces[a].drive == plan.pieces[b].drive) {
            let d = &self.drives[plan.pieces[group[0]].drive];
            self.issue_to_drive(op, plan, d, group, &mut unsent, &mut reaped);
        }
        if unsent.is_empty() && reaped.is_empty() {
            return;
        }
        let mut ops = lock(&self.ops);
        for (drive, c) in reaped {
            self.route(&mut ops, &self.drives[drive], c);
        }
        if let Ok(st) = ops.get_mut(op) {
            for (i, n, reason) in unsent {
                let _ = st.unsent(i, n, RequestStatus::SubmitFailed { reason });
            }
        }
    }

    /// Writes pieces `group` (all on drive `d`) into one of its queue pairs
    /// and rings its SQ tail doorbell once.
    fn issue_to_drive(
        &self,
        op: RawHandle,
        plan: &BatchPlan,
        d: &Drive,
        group: &[usize],
        unsent: &mut Unsent,
        reaped: &mut Reaped,
    ) {
        let not_ready = || {
            if d.queues.is_empty() {
                SubmitFailure::NoQueue { drive: d.name.clone(), kind: "CPU" }
            } else {
                SubmitFailure::DriveNotReady { drive: d.name.clone(), state: format!("{:?}", d.state()) }
            }
        };
        let mut qp = match d.pick_queue() {
            // Checked again under the queue lock: a drive failed meanwhile
            // has emptied (or will empty) this queue, so nothing may join it.
            Some(qp) if d.is_ready() => qp,
            _ => {
                let why = not_ready();
                unsent.extend(group.iter().map(|&i| unsent_piece(plan, i, &why)));
                return;
            }
        };
        // Why the queue took nothing more (full past the bound, SQ deleted).
        let mut queue_dead: Option<SubmitFailure> = None;
        // The request whose command the queue refused (bad PRP): its later
        // commands are not sent either.
        let mut failed_request = None;
        for &i in group {
            let p = &plan.pieces[i];
            if let Some(why) = &queue_dead {
                unsent.push(unsent_piece(plan, i, why));
                continue;
            }
            if failed_request == Some(p.request) {
                unsent.push(unsent_piece(plan, i, &SubmitFailure::EarlierCommandRefused));
                continue;
            }
            if let Err((left, e)) = self.push_piece(&mut qp, op, plan, d, i, reaped) {
                let drive = d.name.clone();
                let why = match e {
                    SubmitError::QueueFull { qid } => SubmitFailure::QueueFull { drive, qid },
                    SubmitError::SqDeleted { qid } => SubmitFailure::SqDeleted { drive, qid },
                    other => SubmitFailure::CommandRefused { drive, detail: crate::error_chain(&other) },
                };
                if matches!(why, SubmitFailure::QueueFull { .. } | SubmitFailure::SqDeleted { .. }) {
                    queue_dead = Some(why.clone());
                }
                failed_request = Some(p.request);
                unsent.push((p.request, left, why));
            }
        }
        qp.ring();
    }

    /// Queues every command of piece `i` (on drive `d`); on failure, how
    /// many of its commands were not queued, and why.
    fn push_piece(
        &self,
        qp: &mut QueuePair,
        op: RawHandle,
        plan: &BatchPlan,
        d: &Drive,
        i: usize,
        reaped: &mut Reaped,
    ) -> Result<(), (u32, SubmitError)> {
        let p = &plan.pieces[i];
        let tag = make_tag(op, p.request);
        let Ok(r) = &plan.requests[p.request] else { return Ok(()) };
        let (io, Some(region)) = (
            match r.direction {
                Direction::Read => IoOp::Read,
                Direction::Write => IoOp::Write,
                Direction::Flush => {
                    let sqe = Flush::new(d.ns.nsid).build();
                    return self.push_command(qp, d, sqe, None, tag, reaped).map_err(|e| (1, e));
                }
            },
            r.region,
        ) else {
            return Ok(());
        };
        let mapping = &plan.regions[region].mappings[d.index];
        let mut left = p.io.commands() as u32;
        for chunk in p.io {
            let data = DataRef { mapping, offset: p.mem_offset + chunk.offset, len: chunk.len };
            self.push_command(qp, d, io.sqe(d.ns.nsid, &chunk), Some(data), tag, reaped)
                .map_err(|e| (left, e))?;
            left -= 1;
        }
        Ok(())
    }

    /// Queues one command; while the queue is full, publishes what is
    /// queued, reaps completions into `reaped` and retries, up to
    /// [`SUBMIT_RETRY_BOUND`].
    fn push_command(
        &self,
        qp: &mut QueuePair,
        d: &Drive,
        sqe: nvme_regs::Sqe,
        data: Option<DataRef<'_>>,
        tag: u64,
        reaped: &mut Reaped,
    ) -> Result<(), SubmitError> {
        let mut deadline = None;
        loop {
            match qp.submit(sqe, data, tag) {
                Ok(_) => return Ok(()),
                Err(SubmitError::QueueFull { qid }) => {
                    qp.ring();
                    qp.poll(|c| reaped.push((d.index, c)));
                    let dl = *deadline.get_or_insert_with(|| Instant::now() + SUBMIT_RETRY_BOUND);
                    if Instant::now() >= dl {
                        return Err(SubmitError::QueueFull { qid });
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Piece `i`'s commands as not sent, because of `why`.
fn unsent_piece(plan: &BatchPlan, i: usize, why: &SubmitFailure) -> (usize, u32, SubmitFailure) {
    let p = &plan.pieces[i];
    (p.request, p.commands(), why.clone())
}
