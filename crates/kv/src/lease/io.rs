//! Reading and writing the lease block through a one-block buffer of its
//! own (the renewal thread runs beside commit rounds, which own the
//! store's staging buffer).

use std::sync::Arc;
use std::time::Duration;

use tutti::{Direction, Runtime};

use crate::error::ItemStatus;
use crate::format::Layout;
use crate::io::{run_within, Targets};
use crate::staging::Staging;

/// The lease block of one store.
#[derive(Debug)]
pub(crate) struct LeaseIo {
    targets: Targets,
    staging: Option<Staging>,
    offset: u64,
    block: usize,
    /// A command timed out: the buffer may still be written by the drive,
    /// so it is never used again, and leaked at close.
    poisoned: bool,
}

impl LeaseIo {
    /// The lease block of runtime store `store` (`slots` slots of
    /// `layout.object_size` bytes).
    pub fn new(rt: &Arc<Runtime>, store: &str, layout: &Layout, slots: u64) -> Result<Self, tutti::Error> {
        let block = layout.block_size as usize;
        let staging = Staging::new(rt, block)?;
        Ok(Self {
            targets: Targets::new(rt.clone(), store, layout.object_size, slots),
            staging: Some(staging),
            offset: layout.lease_offset(),
            block,
            poisoned: false,
        })
    }

    /// The block's bytes.
    pub fn read(&mut self, timeout: Duration) -> Result<Vec<u8>, ItemStatus> {
        self.io(Direction::Read, timeout)?;
        Ok(self.buf()?.bytes()[..self.block].to_vec())
    }

    /// Writes `block` (one logical block).
    pub fn write(&mut self, block: &[u8], timeout: Duration) -> Result<(), ItemStatus> {
        let n = self.block;
        self.buf_mut()?.bytes_mut()[..n].copy_from_slice(&block[..n]);
        self.io(Direction::Write, timeout)
    }

    /// Logical block size, bytes.
    pub fn block_size(&self) -> usize {
        self.block
    }

    fn io(&mut self, direction: Direction, timeout: Duration) -> Result<(), ItemStatus> {
        let handle = self.buf()?.handle;
        let mut reqs = Vec::new();
        self.targets
            .span(direction, self.offset, self.block as u64, handle, 0, &mut reqs)
            .map_err(ItemStatus::from_runtime)?;
        let r = run_within(&self.targets.rt, &reqs, timeout);
        if r == Err(ItemStatus::Timeout) {
            self.poisoned = true;
        }
        r
    }

    fn buf(&self) -> Result<&Staging, ItemStatus> {
        self.staging.as_ref().filter(|_| !self.poisoned).ok_or_else(poisoned)
    }

    fn buf_mut(&mut self) -> Result<&mut Staging, ItemStatus> {
        let ok = !self.poisoned;
        self.staging.as_mut().filter(|_| ok).ok_or_else(poisoned)
    }
}

fn poisoned() -> ItemStatus {
    ItemStatus::Device {
        status: None,
        drive: None,
        message: "an earlier lease-block command timed out; its buffer is retired".into(),
    }
}

impl Drop for LeaseIo {
    fn drop(&mut self) {
        if let Some(st) = self.staging.take() {
            if self.poisoned {
                // A late DMA may still land in it: never free it.
                std::mem::forget(st);
            } else {
                st.release(&self.targets.rt);
            }
        }
        self.targets.close_all();
    }
}
