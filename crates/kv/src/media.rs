//! Where a store's bytes live: the runtime slots it spans (`io.rs`), its
//! geometry and superblock, and the staging buffer its own metadata
//! (superblock, record table, record blocks) moves through. The one owner
//! of block addressing: an object slot's target, a record block's offset,
//! the Flush of a commit round.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use tutti::{Direction, Request, Runtime, TargetHandle};

use crate::error::{ItemStatus, KvError};
use crate::format::{Layout, Record, RecordDecode, Superblock, SuperblockError, RECORD_BYTES};
use crate::index::Index;
use crate::io::{run, Targets};
use crate::key::KeySize;
use crate::staging::Staging;

/// Bytes of the staging buffer: record-table reads at open go through it
/// in pieces of this size.
const STAGING_BYTES: usize = 4 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The media of one store.
#[derive(Debug)]
pub(crate) struct Media {
    targets: Targets,
    layout: Layout,
    sb: Superblock,
    /// Runtime slots before object slot 0.
    meta_slots: u64,
    /// Some drive of the store has a volatile write cache: commit rounds
    /// flush.
    volatile_write_cache: bool,
    staging: Mutex<Option<Staging>>,
}

impl Media {
    /// The `slots` slots of `slot_size` bytes of runtime store `store`,
    /// laid out as `layout`, with a staging buffer registered with `rt`.
    /// Its superblock is a placeholder until [`Media::adopt`] or
    /// [`Media::format`].
    pub fn new(
        rt: Arc<Runtime>,
        store: &str,
        layout: Layout,
        (slot_size, slots): (u64, u64),
        volatile_write_cache: bool,
    ) -> Result<Self, KvError> {
        let staging = Staging::new(&rt, STAGING_BYTES.max(layout.block_size as usize))?;
        Ok(Self {
            targets: Targets::new(rt, store, slot_size, slots),
            layout,
            sb: Superblock { key_size: KeySize::B32, uuid: [0; 16], layout },
            meta_slots: layout.data_offset / slot_size,
            volatile_write_cache,
            staging: Mutex::new(Some(staging)),
        })
    }

    /// The runtime the store runs on.
    pub fn rt(&self) -> &Arc<Runtime> {
        &self.targets.rt
    }

    /// The runtime store's name.
    pub fn name(&self) -> String {
        self.targets.store_name().to_owned()
    }

    /// Its geometry.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Its key size (the superblock's).
    pub fn key_size(&self) -> KeySize {
        self.sb.key_size
    }

    /// Its UUID (the superblock's).
    pub fn uuid(&self) -> [u8; 16] {
        self.sb.uuid
    }

    /// Whether commit rounds must flush: some drive of the store has a
    /// volatile write cache.
    pub fn volatile_write_cache(&self) -> bool {
        self.volatile_write_cache
    }

    /// The target of object slot `slot`.
    pub fn object_target(&self, slot: u32) -> Result<TargetHandle, tutti::Error> {
        self.targets.slot(self.meta_slots + u64::from(slot))
    }

    /// A Flush of the store's drives.
    pub fn flush(&self) -> Result<Request, tutti::Error> {
        Ok(Request::flush(self.targets.slot(0)?))
    }

    /// The record block (index in the record table) holding slot `slot`'s
    /// record.
    pub fn record_block_of(&self, slot: u32) -> u64 {
        u64::from(slot) / self.layout.records_per_block()
    }

    fn io_error(&self, what: &'static str) -> impl Fn(ItemStatus) -> KvError + '_ {
        move |status| KvError::Io { store: self.name(), what, status }
    }

    /// Reads block 0 and decodes it as this geometry's superblock.
    pub fn read_superblock(&mut self) -> Result<Result<Superblock, SuperblockError>, KvError> {
        let bs = u64::from(self.layout.block_size);
        let st = self.staging.get_mut().unwrap_or_else(|p| p.into_inner()).as_mut().expect("open");
        let mut reqs = Vec::new();
        self.targets.span(Direction::Read, 0, bs, st.handle, 0, &mut reqs)?;
        run(&self.targets.rt, &reqs).map_err(|status| KvError::Io {
            store: self.targets.store_name().to_owned(),
            what: "reading the superblock",
            status,
        })?;
        Ok(Superblock::decode(&st.bytes()[..bs as usize], &self.layout))
    }

    /// Takes `sb` (read from block 0) as the store's superblock.
    pub fn adopt(&mut self, sb: Superblock) {
        self.sb = sb;
    }

    /// Writes an empty record table, then the superblock, each made
    /// durable before the next step: a crash while formatting leaves no
    /// superblock.
    pub fn format(&mut self, key_size: KeySize) -> Result<(), KvError> {
        let mut uuid = [0u8; 16];
        getrandom::fill(&mut uuid).map_err(|source| KvError::Uuid { store: self.name(), source })?;
        self.sb = Superblock { key_size, uuid, layout: self.layout };
        let flush = [self.flush()?];
        let rt = self.targets.rt.clone();
        let st = self.staging.get_mut().unwrap_or_else(|p| p.into_inner()).as_mut().expect("open");
        st.bytes_mut().fill(0);
        let (handle, chunk) = (st.handle, st.len() as u64);
        let table = self.layout.record_table_bytes();
        let mut at = 0;
        while at < table {
            let n = chunk.min(table - at);
            let mut reqs = Vec::new();
            self.targets.span(Direction::Write, self.layout.record_offset + at, n, handle, 0, &mut reqs)?;
            run(&rt, &reqs).map_err(self.io_error("clearing the record table"))?;
            at += n;
        }
        run(&rt, &flush).map_err(self.io_error("flushing the record table"))?;
        let block = self.sb.encode();
        let st = self.staging.get_mut().unwrap_or_else(|p| p.into_inner()).as_mut().expect("open");
        st.bytes_mut()[..block.len()].copy_from_slice(&block);
        let mut reqs = Vec::new();
        self.targets.span(Direction::Write, 0, block.len() as u64, handle, 0, &mut reqs)?;
        run(&rt, &reqs).map_err(self.io_error("writing the superblock"))?;
        run(&rt, &flush).map_err(self.io_error("flushing the superblock"))?;
        tracing::info!(store = %self.name(), capacity = self.layout.capacity, "tutti-kv: formatted");
        Ok(())
    }

    /// Reads the whole record table, in pieces of the staging buffer's
    /// size, and gives `visit` each object slot's record as decoded
    /// against the superblock.
    pub fn read_record_table(&mut self, mut visit: impl FnMut(u32, RecordDecode)) -> Result<(), KvError> {
        let l = self.layout;
        let (uuid, key_len) = (self.sb.uuid, self.sb.key_size.bytes());
        let rt = self.targets.rt.clone();
        let name = self.name();
        let st = self.staging.get_mut().unwrap_or_else(|p| p.into_inner()).as_mut().expect("open");
        let (handle, chunk) = (st.handle, st.len() as u64);
        let table = l.record_table_bytes();
        let mut at = 0;
        while at < table {
            let n = chunk.min(table - at);
            let mut reqs = Vec::new();
            self.targets.span(Direction::Read, l.record_offset + at, n, handle, 0, &mut reqs)?;
            run(&rt, &reqs).map_err(|s| KvError::Io {
                store: name.clone(),
                what: "reading the record table",
                status: s,
            })?;
            let bytes = &st.bytes()[..n as usize];
            let first = at / RECORD_BYTES as u64;
            for (j, r) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
                let slot = first + j as u64;
                if slot >= l.capacity {
                    break;
                }
                let r: &[u8; RECORD_BYTES] = r.try_into().unwrap_or(&[0; RECORD_BYTES]);
                visit(slot as u32, Record::decode(r, &uuid, slot as u32, key_len, l.object_size));
            }
            at += n;
        }
        Ok(())
    }

    /// Writes record blocks `blocks` (indices in the record table) as the
    /// index (`index` locks it, once per staging-buffer's worth of blocks)
    /// says they are now, through the staging buffer.
    ///
    /// A write that times out leaves the buffer to the drive (it may still
    /// write these blocks later, with these records): the buffer is
    /// leaked, never to hold other records, and every later call fails.
    pub fn write_record_blocks<'i>(
        &self,
        blocks: &BTreeSet<u64>,
        index: impl Fn() -> MutexGuard<'i, Index>,
    ) -> Result<(), ItemStatus> {
        let bs = u64::from(self.layout.block_size);
        let mut staging = lock(&self.staging);
        let Some(st) = staging.as_mut() else {
            return Err(ItemStatus::Device { status: None, drive: None, message: "store closed".into() });
        };
        let per_chunk = (st.len() as u64 / bs).max(1) as usize;
        let blocks: Vec<u64> = blocks.iter().copied().collect();
        for chunk in blocks.chunks(per_chunk) {
            let mut reqs = Vec::with_capacity(chunk.len());
            {
                let ix = index();
                let buf = st.bytes_mut();
                for (j, &b) in chunk.iter().enumerate() {
                    self.encode_record_block(b, &ix, &mut buf[j * bs as usize..(j + 1) * bs as usize]);
                }
            }
            for (j, &b) in chunk.iter().enumerate() {
                let off = self.layout.record_offset + b * bs;
                self.targets
                    .span(Direction::Write, off, bs, st.handle, j as u64 * bs, &mut reqs)
                    .map_err(ItemStatus::from_runtime)?;
            }
            if let Err(e) = run(&self.targets.rt, &reqs) {
                if e == ItemStatus::Timeout {
                    // The drive may still write these blocks later, with
                    // the records of this round: the buffer must never hold
                    // other records (`commit.rs` also stops every later
                    // round, or that late write could undo it: bring back a
                    // cleared record).
                    std::mem::forget(staging.take());
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Record block `b` as `ix` says it is now, into `out`.
    fn encode_record_block(&self, b: u64, ix: &Index, out: &mut [u8]) {
        let per = self.layout.records_per_block();
        out.fill(0);
        for k in 0..per {
            let slot = b * per + k;
            if slot >= self.layout.capacity {
                break;
            }
            if let Some(rec) = ix.record_to_write(slot as u32) {
                let at = (k as usize) * RECORD_BYTES;
                out[at..at + RECORD_BYTES].copy_from_slice(&rec.encode(&self.sb.uuid, slot as u32));
            }
        }
    }

    /// Releases the staging buffer (`staging.rs`) and closes every target
    /// opened.
    pub fn close(&mut self) {
        if let Some(st) = self.staging.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            st.release(&self.targets.rt);
        }
        self.targets.close_all();
    }
}
