//! Get: pin each key's slot, read its payload into the caller's memory;
//! `wait` checks every payload's CRC32C before it reports a hit.

use std::time::Duration;

use std::sync::Arc;

use tutti::{MemoryHandle, OpHandle, Request, RequestStatus};

use crate::error::{ItemStatus, KvError};
use crate::format::Record;
use crate::inflight::{Held, Inflight};
use crate::key::Key;
use crate::memory::{KvMemory, Value};
use crate::store::KvStore;

/// One item of [`KvStore::get`]: load `key`'s object into `into` (whose
/// `len` is the room available, bytes).
#[derive(Debug, Clone, Copy)]
pub struct Get<'a> {
    /// The key.
    pub key: Key,
    /// Where to put the payload; `len` is the room, at least the object's
    /// length rounded up to whole logical blocks.
    pub into: Value<'a>,
}

/// Gets in flight: pass to [`KvStore::wait_get`].
#[derive(Debug)]
#[must_use = "a get's slots stay pinned until it is waited on"]
pub struct PendingGets<'a> {
    op: Option<OpHandle>,
    store_id: u64,
    /// Per item: its final status already, or (slot, record, request index,
    /// destination).
    items: Vec<GetItem<'a>>,
    /// Memory the batch loads into (one entry per accepted item).
    mems: Vec<MemoryHandle>,
    inflight: Arc<Inflight>,
    /// Waited on: nothing left to release when dropped.
    settled: bool,
}

impl Drop for PendingGets<'_> {
    /// A batch dropped without a wait: its objects are unpinned and its
    /// memory let go once the runtime reports its reads final
    /// (`inflight.rs`).
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let held =
            self.items.iter().filter_map(|r| r.as_ref().ok().map(|(s, ..)| Held::Pinned(*s))).collect();
        self.inflight.orphan(self.op.take(), held, std::mem::take(&mut self.mems));
    }
}

type GetItem<'a> = Result<(u32, Record, usize, &'a KvMemory, u64), ItemStatus>;

impl KvStore {
    /// Starts a batch of gets: each present key's slot is pinned (not
    /// evicted or reused while the load runs) and its payload read into
    /// the item's memory.
    ///
    /// # Errors
    ///
    /// [`KvError::BatchTooLarge`] past 65,536 items. Per-item problems are
    /// statuses: [`ItemStatus::Miss`], [`ItemStatus::BadValue`] (the
    /// object does not fit, memory of another store).
    pub fn get<'a>(&self, items: &[Get<'a>]) -> Result<PendingGets<'a>, KvError> {
        const MAX: usize = 1 << 16;
        if items.len() > MAX {
            return Err(KvError::BatchTooLarge { items: items.len(), max: MAX });
        }
        self.reap_orphans();
        let mut out: Vec<GetItem<'a>> = Vec::with_capacity(items.len());
        {
            let mut ix = self.index();
            for g in items {
                if g.key.size() != self.media.key_size() {
                    let reason = format!(
                        "a {}-byte key for a store of {}-byte keys",
                        g.key.len(),
                        self.media.key_size().bytes()
                    );
                    out.push(Err(ItemStatus::BadValue { reason }));
                    continue;
                }
                out.push(match ix.pin(&g.key) {
                    None => {
                        self.stats.miss();
                        Err(ItemStatus::Miss)
                    }
                    Some((slot, rec)) => {
                        let v = Value { len: rec.len, ..g.into };
                        match self
                            .check_value(&g.key, &v, rec.len)
                            .and_then(|()| fits(&g.into, rec.len, self.media.layout().padded(rec.len)))
                        {
                            Ok(()) => Ok((slot, rec, 0, g.into.memory, g.into.offset)),
                            Err(e) => {
                                ix.unpin(slot);
                                Err(e)
                            }
                        }
                    }
                });
            }
        }
        let mut reqs = Vec::with_capacity(items.len());
        for r in out.iter_mut() {
            let Ok((slot, rec, at, mem, off)) = r else { continue };
            match self.media.object_target(*slot) {
                Ok(t) => {
                    *at = reqs.len();
                    reqs.push(Request::read(t, 0, self.media.layout().padded(rec.len), mem.handle, *off));
                }
                Err(e) => {
                    self.unpin(*slot);
                    *r = Err(ItemStatus::from_open(&e));
                }
            }
        }
        let op = self.submit_gets(&reqs, &mut out);
        let mems: Vec<MemoryHandle> =
            out.iter().filter_map(|r| r.as_ref().ok().map(|x| x.3.handle)).collect();
        self.inflight.take(&mems);
        Ok(PendingGets {
            op,
            store_id: self.id(),
            items: out,
            mems,
            inflight: self.inflight.clone(),
            settled: false,
        })
    }

    /// Waits for a batch of gets and verifies each payload: one status per
    /// item, in order. [`ItemStatus::Hit`] only when the bytes read have
    /// the CRC32C the object was stored with; otherwise
    /// [`ItemStatus::ChecksumMismatch`] and the bytes must not be used. The
    /// timeout is final, as the runtime's (to poll, use
    /// [`KvStore::try_wait_get`]).
    ///
    /// # Errors
    ///
    /// [`KvError::ForeignBatch`] when `pending` belongs to another store;
    /// a runtime error for a consumed operation.
    pub fn wait_get(
        &self,
        mut pending: PendingGets<'_>,
        timeout: Duration,
    ) -> Result<Vec<ItemStatus>, KvError> {
        if pending.store_id != self.id() {
            return Err(KvError::ForeignBatch);
        }
        let statuses = match pending.op.take() {
            Some(op) => self.media.rt().wait(op, timeout).map_err(|e| e.to_string()),
            None => Ok(Vec::new()),
        };
        Ok(self.finish_get(&mut pending, statuses))
    }

    /// Polls a batch of gets: `Ok(Err(pending))` (to poll again) while a
    /// read is in flight, otherwise as [`KvStore::wait_get`].
    ///
    /// # Errors
    ///
    /// As [`KvStore::wait_get`].
    pub fn try_wait_get<'a>(
        &self,
        mut pending: PendingGets<'a>,
    ) -> Result<Result<Vec<ItemStatus>, PendingGets<'a>>, KvError> {
        if pending.store_id != self.id() {
            return Err(KvError::ForeignBatch);
        }
        let Some(statuses) = self.poll_op(pending.op)? else { return Ok(Err(pending)) };
        pending.op = None;
        Ok(Ok(self.finish_get(&mut pending, Ok(statuses))))
    }

    /// Verifies a batch whose reads are final, unpins its objects and lets
    /// its memory go (after the checksums: until then the store reads it).
    fn finish_get(
        &self,
        pending: &mut PendingGets<'_>,
        statuses: Result<Vec<RequestStatus>, String>,
    ) -> Vec<ItemStatus> {
        pending.settled = true;
        let ranges: Vec<Option<(&KvMemory, u64, u64)>> = pending
            .items
            .iter()
            .map(|r| match (r, &statuses) {
                (Ok((_, rec, at, mem, off)), Ok(st))
                    if matches!(st.get(*at), Some(RequestStatus::Success)) =>
                {
                    Some((*mem, *off, rec.len))
                }
                _ => None,
            })
            .collect();
        // Checksummed once the load has ended, never queued on the GPU
        // behind it: a stream waiting for the load's kernel blocks the
        // hardware queue it shares with other streams, and with emulated
        // drives the copies that kernel waits for may be in that queue
        // (docs/gpu.md, "No GPU work waits for an I/O kernel").
        let crcs = self.crc_of(&ranges);
        let mut out = Vec::with_capacity(pending.items.len());
        for (i, r) in pending.items.iter().enumerate() {
            let Ok((slot, rec, at, ..)) = r else {
                out.push(r.as_ref().err().cloned().unwrap_or(ItemStatus::Miss));
                continue;
            };
            self.unpin(*slot);
            out.push(match (&statuses, &crcs) {
                (Ok(st), Ok(c)) => self.verdict(st.get(*at), rec, c[i]),
                (Err(e), _) => ItemStatus::Device { status: None, drive: None, message: e.clone() },
                (_, Err(e)) => ItemStatus::Device { status: None, drive: None, message: e.to_string() },
            });
        }
        self.inflight.give(&std::mem::take(&mut pending.mems));
        out
    }

    /// `get` then `wait_get`.
    ///
    /// # Errors
    ///
    /// As [`KvStore::get`] and [`KvStore::wait_get`].
    pub fn get_sync(&self, items: &[Get<'_>], timeout: Duration) -> Result<Vec<ItemStatus>, KvError> {
        let p = self.get(items)?;
        self.wait_get(p, timeout)
    }

    fn verdict(&self, st: Option<&RequestStatus>, rec: &Record, computed: u32) -> ItemStatus {
        match st {
            Some(RequestStatus::Success) if computed == rec.payload_crc => {
                self.stats.hit();
                ItemStatus::Hit { len: rec.len }
            }
            Some(RequestStatus::Success) => {
                self.stats.checksum_mismatch();
                ItemStatus::ChecksumMismatch { stored: rec.payload_crc, computed }
            }
            other => {
                self.stats.device_error();
                other.map_or(ItemStatus::Timeout, ItemStatus::from_request)
            }
        }
    }

    fn unpin(&self, slot: u32) {
        self.index().unpin(slot);
    }

    fn submit_gets(&self, reqs: &[Request], items: &mut [GetItem<'_>]) -> Option<OpHandle> {
        if reqs.is_empty() {
            return None;
        }
        let sub = self.media.rt().submit(reqs);
        for r in items.iter_mut() {
            let Ok((slot, _, at, ..)) = r else { continue };
            if let Err(e) = &sub.states()[*at] {
                self.unpin(*slot);
                *r = Err(ItemStatus::refused(e));
            }
        }
        sub.op()
    }
}

/// An object of `len` bytes, moved as `padded` bytes (whole logical
/// blocks), fits in `into`.
fn fits(into: &Value<'_>, len: u64, padded: u64) -> Result<(), ItemStatus> {
    if padded > into.len {
        return Err(ItemStatus::BadValue {
            reason: format!("the object has {len} bytes, {padded} in whole blocks; room for {}", into.len),
        });
    }
    Ok(())
}
