//! Put: reserve a slot per item, checksum the payload, write it; `wait`
//! then joins the group commit (`commit.rs`) that writes the records.

use std::time::Duration;

use std::sync::Arc;

use tutti::{MemoryHandle, OpHandle, Request, RequestStatus};

use crate::checksum::crc32c_all;
use crate::committer::PendingPut;
use crate::error::{ItemStatus, KvError};
use crate::format::Record;
use crate::inflight::{Held, Inflight};
use crate::key::Key;
use crate::memory::{KvMemory, MemoryKind, Value};
use crate::store::KvStore;

/// One item of [`KvStore::put`]: store `value` under `key`.
#[derive(Debug, Clone, Copy)]
pub struct Put<'a> {
    /// The key (of the store's key size).
    pub key: Key,
    /// The payload.
    pub value: Value<'a>,
}

/// Puts in flight: pass to [`KvStore::wait_put`].
#[derive(Debug)]
#[must_use = "a put is durable only once waited on"]
pub struct PendingPuts {
    op: Option<OpHandle>,
    store_id: u64,
    /// Per item: its final status already, or (slot, record, request
    /// index in the submission).
    items: Vec<Result<(u32, Record, usize), ItemStatus>>,
    /// Why the payload checksums could not be computed (the GPU kernel
    /// failed): every submitted item then fails once its write is done.
    crc_error: Option<String>,
    /// Memory the batch's payloads are in (one entry per accepted item).
    mems: Vec<MemoryHandle>,
    inflight: Arc<Inflight>,
    /// Waited on: nothing left to release when dropped.
    settled: bool,
}

impl Drop for PendingPuts {
    /// A batch dropped without a wait: its slots are freed (never
    /// published) and its memory let go once the runtime reports its
    /// writes final (`inflight.rs`).
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let held =
            self.items.iter().filter_map(|r| r.as_ref().ok().map(|(s, ..)| Held::Reserved(*s))).collect();
        self.inflight.orphan(self.op.take(), held, std::mem::take(&mut self.mems));
    }
}

impl KvStore {
    /// Starts a batch of puts: each item's payload is checksummed and
    /// written to a free slot (evicting least recently used objects when
    /// there is none). Nothing is visible, and nothing is durable, until
    /// [`KvStore::wait_put`] returns `Ok` for the item; a put of a key that
    /// exists replaces it then.
    ///
    /// # Errors
    ///
    /// [`KvError::BatchTooLarge`] past 65,536 items; [`KvError::ReadOnly`]
    /// on a store opened read-only; [`KvError::LeaseLost`] once another
    /// writer took the store's lease. Per-item problems are
    /// item statuses: [`ItemStatus::TooLarge`], [`ItemStatus::BadValue`]
    /// (memory range, zero length, key size), [`ItemStatus::Full`] (no
    /// slot free and nothing to evict); [`ItemStatus::Device`] or
    /// [`ItemStatus::Timeout`] when the commit round that had to free a
    /// slot failed (a drive failed: the store is not full, and no more
    /// objects are evicted for later puts until a round succeeds).
    pub fn put(&self, items: &[Put<'_>]) -> Result<PendingPuts, KvError> {
        const MAX: usize = 1 << 16;
        if items.len() > MAX {
            return Err(KvError::BatchTooLarge { items: items.len(), max: MAX });
        }
        self.writable()?;
        self.reap_orphans();
        let mut out: Vec<Result<(u32, Record, usize), ItemStatus>> = items
            .iter()
            .map(|p| self.check_value(&p.key, &p.value, p.value.len).map(|()| (0, rec0(p), 0)))
            .collect();
        let wanted = out.iter().filter(|r| r.is_ok()).count();
        let (slots, short) = self.reserve(wanted);
        let mut slots = slots.into_iter();
        for r in out.iter_mut().filter(|r| r.is_ok()) {
            match (slots.next(), r.as_mut()) {
                (Some(s), Ok(x)) => x.0 = s,
                _ => {
                    if matches!(short, ItemStatus::Device { .. } | ItemStatus::Timeout) {
                        self.stats.device_error();
                    }
                    *r = Err(short.clone());
                }
            }
        }
        let mut reqs = Vec::with_capacity(items.len());
        for (p, r) in items.iter().zip(out.iter_mut()) {
            let Ok((slot, _, at)) = r else { continue };
            match self.media.object_target(*slot) {
                Ok(target) => {
                    *at = reqs.len();
                    let padded = self.media.layout().padded(p.value.len);
                    reqs.push(Request::write(target, 0, padded, p.value.memory.handle, p.value.offset));
                }
                Err(e) => {
                    self.index().unreserve(*slot, false);
                    *r = Err(ItemStatus::from_runtime(e));
                }
            }
        }
        // Host payloads are checksummed while they move (the drives only
        // read this memory). GPU payloads are checksummed first: the kernel
        // must not wait behind a running I/O kernel whose completions the
        // emulator delivers with copies on the same GPU.
        let on_gpu = items.iter().any(|p| p.value.memory.kind == MemoryKind::Gpu);
        let mut crc_error = if on_gpu { self.fill_checksums(items, &mut out) } else { None };
        let op = self.submit_items(&reqs, &mut out);
        if !on_gpu {
            crc_error = self.fill_checksums(items, &mut out);
        }
        let mems: Vec<MemoryHandle> =
            items.iter().zip(&out).filter(|(_, r)| r.is_ok()).map(|(p, _)| p.value.memory.handle).collect();
        self.inflight.take(&mems);
        Ok(PendingPuts {
            op,
            store_id: self.id(),
            items: out,
            crc_error,
            mems,
            inflight: self.inflight.clone(),
            settled: false,
        })
    }

    /// Puts each accepted item's payload CRC32C in its record; why not,
    /// when the checksums could not be computed.
    fn fill_checksums(
        &self,
        items: &[Put<'_>],
        out: &mut [Result<(u32, Record, usize), ItemStatus>],
    ) -> Option<String> {
        match self.checksums(items, out) {
            Ok(crcs) => {
                for (r, c) in out.iter_mut().zip(crcs) {
                    if let Ok((_, rec, _)) = r {
                        rec.payload_crc = c;
                    }
                }
                None
            }
            Err(e) => Some(e.to_string()),
        }
    }

    /// Waits for a batch of puts: their payload writes, then the group
    /// commit of their records. One status per item, in order:
    /// [`ItemStatus::Ok`] once the object is durable and visible.
    ///
    /// The timeout bounds the wait for the payload writes; it is final: an
    /// item not written by then is [`ItemStatus::Timeout`] and its slot is
    /// set aside until the store is reopened (the drive may still write
    /// it). To poll, use [`KvStore::try_wait_put`]. The commit round that
    /// follows is bounded by the store's own 30 s limit.
    ///
    /// # Errors
    ///
    /// [`KvError::ForeignBatch`] when `pending` belongs to another store (it
    /// is released by its own store as if dropped).
    pub fn wait_put(&self, mut pending: PendingPuts, timeout: Duration) -> Result<Vec<ItemStatus>, KvError> {
        if pending.store_id != self.id() {
            return Err(KvError::ForeignBatch);
        }
        let statuses = match pending.op.take() {
            Some(op) => self.media.rt().wait(op, timeout)?,
            None => Vec::new(),
        };
        Ok(self.finish_put(&mut pending, &statuses))
    }

    /// Polls a batch of puts: `Ok(Err(pending))` (to poll again) while a
    /// payload write is in flight, otherwise as [`KvStore::wait_put`] (the
    /// commit round runs in this call).
    ///
    /// # Errors
    ///
    /// As [`KvStore::wait_put`].
    pub fn try_wait_put(
        &self,
        mut pending: PendingPuts,
    ) -> Result<Result<Vec<ItemStatus>, PendingPuts>, KvError> {
        if pending.store_id != self.id() {
            return Err(KvError::ForeignBatch);
        }
        let Some(statuses) = self.poll_op(pending.op)? else { return Ok(Err(pending)) };
        pending.op = None;
        Ok(Ok(self.finish_put(&mut pending, &statuses)))
    }

    /// The statuses of a batch whose payload writes are final: commits the
    /// written ones, frees the others' slots.
    fn finish_put(&self, pending: &mut PendingPuts, statuses: &[RequestStatus]) -> Vec<ItemStatus> {
        pending.settled = true;
        let mut out = Vec::with_capacity(pending.items.len());
        let mut commit: Vec<PendingPut> = Vec::new();
        {
            let mut ix = self.index();
            for item in std::mem::take(&mut pending.items) {
                out.push(match item {
                    Err(s) => Err(s),
                    Ok((slot, rec, at)) => match (statuses.get(at), &pending.crc_error) {
                        (Some(RequestStatus::Success), None) => {
                            commit.push((slot, rec));
                            Ok(())
                        }
                        (Some(RequestStatus::Success), Some(why)) => {
                            ix.unreserve(slot, false);
                            Err(ItemStatus::Device { status: None, drive: None, message: why.clone() })
                        }
                        (other, _) => {
                            let quarantine = matches!(other, Some(RequestStatus::Timeout));
                            ix.unreserve(slot, quarantine);
                            self.stats.device_error();
                            Err(other.map_or(ItemStatus::Timeout, ItemStatus::from_request))
                        }
                    },
                });
            }
        }
        self.inflight.give(&std::mem::take(&mut pending.mems));
        let committed = if commit.is_empty() { Ok(()) } else { self.commit(commit) };
        out.into_iter()
            .map(|r| match r {
                Ok(()) => committed.clone().map_or_else(|e| e, |()| ItemStatus::Ok),
                Err(s) => s,
            })
            .collect()
    }

    /// `put` then `wait_put`.
    ///
    /// # Errors
    ///
    /// As [`KvStore::put`].
    pub fn put_sync(&self, items: &[Put<'_>], timeout: Duration) -> Result<Vec<ItemStatus>, KvError> {
        let p = self.put(items)?;
        self.wait_put(p, timeout)
    }

    /// Checks a key and a memory range of `room` bytes for a value of the
    /// store.
    pub(crate) fn check_value(&self, key: &Key, v: &Value<'_>, room: u64) -> Result<(), ItemStatus> {
        let bad = |reason: String| Err(ItemStatus::BadValue { reason });
        if key.size() != self.media.key_size() {
            return bad(format!(
                "a {}-byte key for a store of {}-byte keys",
                key.len(),
                self.media.key_size().bytes()
            ));
        }
        if v.memory.store_id != self.id() {
            return bad("memory registered with another store".into());
        }
        if v.len == 0 || room == 0 {
            return bad("zero length".into());
        }
        if v.len > self.media.layout().object_size {
            return Err(ItemStatus::TooLarge { len: v.len, max: self.media.layout().object_size });
        }
        let padded = self.media.layout().padded(room.min(self.media.layout().object_size));
        if v.offset.checked_add(padded).is_none_or(|end| end > v.memory.len as u64) {
            return bad(format!(
                "bytes {}..{} (the length rounded up to {}-byte blocks) are outside the {}-byte region",
                v.offset,
                v.offset.saturating_add(padded),
                self.media.layout().block_size,
                v.memory.len
            ));
        }
        Ok(())
    }

    /// Reserves up to `n` slots, clearing stale slots and evicting (then
    /// clearing, in a commit round) least recently used objects when there
    /// are not enough free ones. Returns the slots and the status of the
    /// items left without one: [`ItemStatus::Full`], or the error of the
    /// commit round that failed to free slots (a drive failed: the store
    /// is not full).
    ///
    /// Slots waiting to be cleared (removed, superseded, or evicted by a
    /// put whose round failed), or being cleared by a round in progress,
    /// are cleared before anything more is evicted: a drive that fails
    /// every round costs the objects one eviction took, not more with each
    /// put.
    ///
    /// A slot freed by this call's round can be taken by another put before
    /// this one gets back to it, so it evicts again as long as that makes
    /// progress: fewer than `n` slots only when there is nothing left to
    /// evict (every live object pinned or being put), no slot is waiting
    /// to be cleared, or a round failed. Each further pass follows one that
    /// cleared the waiting slots, evicted an object or waited for slots to
    /// be cleared, and a slot another put took from this call let that put
    /// go ahead: passes repeat only while other puts progress.
    fn reserve(&self, n: usize) -> (Vec<u32>, ItemStatus) {
        let mut got = Vec::with_capacity(n);
        loop {
            {
                let mut ix = self.index();
                while got.len() < n {
                    match ix.reserve() {
                        Some(s) => got.push(s),
                        None => break,
                    }
                }
                if got.len() == n {
                    break;
                }
                if !ix.clears_pending() {
                    // Evict a little more than needed, so that the next
                    // puts do not each pay for a round.
                    let want = (n - got.len()).max((self.media.layout().capacity / 64) as usize).max(1);
                    let evicted = ix.evict(want);
                    self.stats.evicted(evicted as u64);
                    if evicted == 0 {
                        break;
                    }
                }
            }
            // Makes the stale slots' records empty on the media, so they
            // can be reused (or waits for the round clearing others).
            if let Err(e) = self.commit(Vec::new()) {
                return (got, e);
            }
        }
        (got, ItemStatus::Full)
    }

    /// The payload CRC32C of each accepted item.
    fn checksums(
        &self,
        items: &[Put<'_>],
        out: &[Result<(u32, Record, usize), ItemStatus>],
    ) -> Result<Vec<u32>, KvError> {
        let ranges: Vec<Option<(&KvMemory, u64, u64)>> = items
            .iter()
            .zip(out)
            .map(|(p, r)| r.is_ok().then_some((p.value.memory, p.value.offset, p.value.len)))
            .collect();
        self.crc_of(&ranges)
    }

    /// Submits `reqs` for the accepted `items` (whose third field is the
    /// request index); a request the runtime refuses fails its item.
    fn submit_items(
        &self,
        reqs: &[Request],
        items: &mut [Result<(u32, Record, usize), ItemStatus>],
    ) -> Option<OpHandle> {
        if reqs.is_empty() {
            return None;
        }
        let sub = self.media.rt().submit(reqs);
        let mut ix = self.index();
        for r in items.iter_mut() {
            let Ok((slot, _, at)) = r else { continue };
            if let Err(e) = &sub.states()[*at] {
                ix.unreserve(*slot, false);
                *r = Err(ItemStatus::refused(e));
            }
        }
        sub.op()
    }

    /// CRC32C of each present range (`None` gives 0): host ranges with
    /// the CPU's instruction on every core (`checksum.rs`), GPU ranges with
    /// one kernel launch for all.
    pub(crate) fn crc_of(&self, ranges: &[Option<(&KvMemory, u64, u64)>]) -> Result<Vec<u32>, KvError> {
        let mut out = vec![0u32; ranges.len()];
        let mut gpu: Vec<(usize, u64, usize)> = Vec::new();
        let mut host: Vec<(usize, &[u8])> = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            let Some((m, off, len)) = r else { continue };
            match m.kind {
                // SAFETY: the range was checked against the region, which
                // was registered valid for reads (`register_host`); the
                // caller does not let a device write it now (a put reads
                // it before submitting, a get after the load completed).
                #[allow(unsafe_code)]
                MemoryKind::Host => host.push((i, unsafe { m.host_bytes(*off, *len) })),
                MemoryKind::Gpu => gpu.push((i, m.addr + off, *len as usize)),
            }
        }
        let crcs = crc32c_all(&host.iter().map(|&(_, b)| b).collect::<Vec<_>>());
        for (&(i, _), c) in host.iter().zip(crcs) {
            out[i] = c;
        }
        if !gpu.is_empty() {
            let crcs = self.gpu_crcs(&gpu.iter().map(|&(_, p, n)| (p, n)).collect::<Vec<_>>())?;
            for (&(i, ..), c) in gpu.iter().zip(crcs) {
                out[i] = c;
            }
        }
        Ok(out)
    }
}

fn rec0(p: &Put<'_>) -> Record {
    Record { key: p.key, len: p.value.len, generation: 0, payload_crc: 0 }
}
