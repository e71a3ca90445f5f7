//! Byte ranges of the store as runtime requests: slot targets (opened once,
//! on first use) and ranges split at slot boundaries.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tutti::{Direction, MemoryHandle, Request, RequestStatus, Runtime, TargetHandle};

use crate::error::ItemStatus;

/// How long the store waits for its own I/O (superblock, records, flushes)
/// before it reports a timeout.
pub const META_TIMEOUT: Duration = Duration::from_secs(30);

/// The runtime slots of one store, opened on first use.
#[derive(Debug)]
pub(crate) struct Targets {
    pub rt: Arc<Runtime>,
    store: String,
    slot_size: u64,
    cells: Vec<OnceLock<TargetHandle>>,
}

impl Targets {
    /// The `slots` slots of `slot_size` bytes of runtime store `store`.
    pub fn new(rt: Arc<Runtime>, store: &str, slot_size: u64, slots: u64) -> Self {
        Self { rt, store: store.to_owned(), slot_size, cells: (0..slots).map(|_| OnceLock::new()).collect() }
    }

    /// The target of runtime slot `i`.
    pub fn slot(&self, i: u64) -> Result<TargetHandle, tutti::Error> {
        let cell = &self.cells[i as usize];
        if let Some(t) = cell.get() {
            return Ok(*t);
        }
        let t = self.rt.open(&format!("tutti://{}/{i}", self.store))?;
        if cell.set(t).is_err() {
            // Another thread opened it first; keep theirs.
            let _ = self.rt.close(t);
        }
        Ok(*cell.get().unwrap_or(&t))
    }

    /// Requests for bytes `offset..offset + len` of the store (a multiple
    /// of the block size), split at slot boundaries, to or from `mem` at
    /// `mem_offset`.
    pub fn span(
        &self,
        direction: Direction,
        offset: u64,
        len: u64,
        mem: MemoryHandle,
        mem_offset: u64,
        out: &mut Vec<Request>,
    ) -> Result<(), tutti::Error> {
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let slot = at / self.slot_size;
            let in_slot = at % self.slot_size;
            let n = (self.slot_size - in_slot).min(end - at);
            let t = self.slot(slot)?;
            let mo = mem_offset + (at - offset);
            out.push(match direction {
                Direction::Read => Request::read(t, in_slot, n, mem, mo),
                _ => Request::write(t, in_slot, n, mem, mo),
            });
            at += n;
        }
        Ok(())
    }

    /// The runtime store's name.
    pub fn store_name(&self) -> &str {
        &self.store
    }

    /// Closes every target opened.
    pub fn close_all(&mut self) {
        for c in &mut self.cells {
            if let Some(t) = c.take() {
                let _ = self.rt.close(t);
            }
        }
    }
}

/// Submits `reqs` and waits for all of them; the first failure, if any.
pub(crate) fn run(rt: &Runtime, reqs: &[Request]) -> Result<(), ItemStatus> {
    run_within(rt, reqs, META_TIMEOUT)
}

/// [`run`], waiting at most `timeout` for each submission.
pub(crate) fn run_within(rt: &Runtime, reqs: &[Request], timeout: Duration) -> Result<(), ItemStatus> {
    for chunk in reqs.chunks(tutti::MAX_BATCH.min(1 << 16)) {
        let sub = rt.submit(chunk);
        if let Some(Err(e)) = sub.states().iter().find(|s| s.is_err()) {
            let e = e.clone();
            if let Some(op) = sub.op() {
                let _ = rt.wait(op, timeout);
            }
            return Err(ItemStatus::Device { status: None, drive: None, message: e.to_string() });
        }
        let Some(op) = sub.op() else { continue };
        let st = rt.wait(op, timeout).map_err(|e| ItemStatus::Device {
            status: None,
            drive: None,
            message: e.to_string(),
        })?;
        if let Some(bad) = st.iter().find(|s| !matches!(s, RequestStatus::Success)) {
            return Err(ItemStatus::from_request(bad));
        }
    }
    Ok(())
}
