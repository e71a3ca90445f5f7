//! Memory registration: host or GPU memory handed to every drive for DMA
//! once, named afterwards by a [`MemoryHandle`].
//!
//! Makes [`Region`]s (`region.rs`: one DMA mapping per drive, unmapped when the last
//! reference goes). An operation holds its regions while it lives, and a
//! drive holds the regions its abandoned commands may still write until its
//! controller is reset ([`crate::drive::Drive::pin_until_reset`]), so a
//! registration cannot be undone while a device may touch it.
//!
//! Locks: the memory table's write lock only (after a reap that takes queue
//! locks and the operations table, one at a time).

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use gpu_io::{GpuBuffer, GpuRegion};
use nvm_queue::{DmaMapping, NvmeDevice, HOST_PAGE_SIZE};

use super::Runtime;
use crate::error::Error;
use crate::handle::{HandleKind, MemoryHandle, SLOT_MAX};
use crate::region::Region;

/// Mappings made so far for a region being registered: dropping it (an
/// error part way) unmaps them, through [`Region`]'s `Drop`.
struct Mapped {
    region: Region,
}

impl Mapped {
    fn new(lead: usize, len: usize, drives: usize) -> Self {
        let region = Region {
            lead,
            len,
            mappings: Vec::with_capacity(drives),
            devices: Vec::with_capacity(drives),
            gpu_regions: Vec::new(),
        };
        Self { region }
    }

    fn push(&mut self, device: &Arc<dyn NvmeDevice>, m: DmaMapping) {
        self.region.mappings.push(m);
        self.region.devices.push(device.clone());
    }
}

fn memory_error(reason: impl Into<String>) -> Error {
    Error::Memory { reason: reason.into(), source: None }
}

impl Runtime {
    /// Registers `len` bytes of host memory at `ptr` for I/O: maps the pages
    /// covering it for DMA on every drive, once. Requests then name it by
    /// the returned handle and an offset (bytes), and allocate nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Memory`] for a null pointer, zero length, a range that wraps
    /// the address space or a device that refuses the mapping (nothing stays
    /// mapped); [`Error::ShuttingDown`].
    ///
    /// # Safety
    ///
    /// Until [`Runtime::unregister_memory`] succeeds for the handle (or the
    /// runtime is dropped), the memory must stay allocated, and while an
    /// operation that reads into it is in flight (submitted and not yet
    /// returned by [`Runtime::wait`] as final) the caller must not read or
    /// write it, nor write memory a write operation is reading. After a
    /// [`crate::RequestStatus::Timeout`], the drive may still write it until
    /// `unregister_memory` succeeds.
    pub unsafe fn register_memory(&self, ptr: *mut u8, len: usize) -> Result<MemoryHandle, Error> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        if ptr.is_null() || len == 0 {
            return Err(memory_error("null pointer or zero length"));
        }
        let addr = ptr as usize;
        let base_addr = addr & !(HOST_PAGE_SIZE - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(HOST_PAGE_SIZE))
            .ok_or_else(|| memory_error("range wraps the address space"))?;
        let base = NonNull::new(base_addr as *mut u8).ok_or_else(|| memory_error("null page"))?;
        let mut mapped = Mapped::new(addr - base_addr, len, self.drives.len());
        for d in &self.drives {
            // SAFETY: forwarded from this function's contract: the caller
            // keeps the memory alive until unregister succeeds, and the
            // runtime keeps the mapping until no command can touch it.
            let m = unsafe { d.device.dma_map(base, end - base_addr) }.map_err(|e| Error::Memory {
                reason: format!("mapping for drive {:?}", d.name),
                source: Some(e),
            })?;
            mapped.push(&d.device, m);
        }
        self.insert_region(mapped, end - base_addr)
    }

    /// Registers `len` bytes of GPU memory at device pointer `dptr` (in the
    /// runtime's CUDA context, GPU 0) for I/O, like
    /// [`Runtime::register_memory`]: KV blocks are then saved from and
    /// loaded into GPU memory directly. Emulated drives move the bytes with
    /// CUDA copies; real drives would need peer DMA, which is not written
    /// yet (refused with [`Error::Memory`]). Needs a datapath with
    /// `execution: gpu` (the runtime's GPU).
    ///
    /// # Errors
    ///
    /// [`Error::Memory`] (no GPU datapath, null pointer, zero length, a
    /// drive that would need peer DMA), [`Error::Gpu`],
    /// [`Error::ShuttingDown`].
    ///
    /// # Safety
    ///
    /// As for [`Runtime::register_memory`]: the allocation stays alive until
    /// unregistered, and is not touched while an operation on it is in
    /// flight.
    pub unsafe fn register_gpu_memory(&self, dptr: u64, len: usize) -> Result<MemoryHandle, Error> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        let Some(gpu) = &self.gpu else {
            return Err(memory_error("no datapath uses GPU execution"));
        };
        if dptr == 0 || len == 0 {
            return Err(memory_error("null device pointer or zero length"));
        }
        let mut mapped = Mapped::new(0, len, self.drives.len());
        for d in &self.drives {
            if d.daemon.is_some() {
                return Err(memory_error(format!(
                    "drive {:?} is owned by tuttid: its emulator runs in the daemon, which cannot reach this process's GPU memory (real drives would need peer DMA)",
                    d.name
                )));
            }
            let Some(emu) = &d.emulator else {
                return Err(memory_error(format!(
                    "drive {:?} would need peer DMA to GPU memory (not yet written)",
                    d.name
                )));
            };
            // SAFETY: forwarded from this function's contract.
            let buf = unsafe { GpuBuffer::from_raw(gpu, dptr, len) }
                .map_err(|source| Error::Gpu { context: "wrapping GPU memory".into(), source })?;
            let m = emu.map_external(Arc::new(buf)).map_err(|e| Error::Memory {
                reason: format!("mapping for drive {:?}", d.name),
                source: Some(e),
            })?;
            mapped.push(&d.device, m);
        }
        self.insert_region(mapped, len)
    }

    /// Uploads the region's page addresses for every drive with GPU queues
    /// and gives it a handle.
    fn insert_region(&self, mut mapped: Mapped, mapped_len: usize) -> Result<MemoryHandle, Error> {
        mapped.region.gpu_regions = self.gpu_regions(&mapped.region.mappings, mapped_len)?;
        let region = Arc::new(mapped.region);
        let mut m = self.memory.write().unwrap_or_else(|p| p.into_inner());
        m.insert(region)
            .map(MemoryHandle)
            .ok_or(Error::TooManyHandles { kind: HandleKind::Memory, limit: u64::from(SLOT_MAX) + 1 })
    }

    /// A region's page addresses for every drive with GPU queues.
    fn gpu_regions(
        &self,
        mappings: &[DmaMapping],
        mapped_len: usize,
    ) -> Result<Vec<Option<GpuRegion>>, Error> {
        self.drives
            .iter()
            .zip(mappings)
            .map(|(d, m)| match (&self.gpu, &d.gpu) {
                (Some(g), Some(_)) => GpuRegion::new(g, m, mapped_len)
                    .map(Some)
                    .map_err(|source| Error::Gpu { context: "uploading PRP page addresses".into(), source }),
                _ => Ok(None),
            })
            .collect()
    }

    /// Unregisters memory; refused with [`Error::MemoryBusy`] while an
    /// operation uses it: one not yet returned by [`Runtime::wait`], one
    /// that timed out and whose commands are still outstanding on a drive
    /// (completions that have arrived are reaped first), or one whose
    /// drive failed and has not been reset ([`Runtime::reset_drive`]).
    ///
    /// # Errors
    ///
    /// [`Error::Handle`] for a stale, foreign or forged handle;
    /// [`Error::MemoryBusy`].
    pub fn unregister_memory(&self, memory: MemoryHandle) -> Result<(), Error> {
        // Late completions of timed-out operations may be waiting in a CQ:
        // reap them first so that memory they no longer pin can go.
        if Arc::strong_count(self.memory.read().unwrap_or_else(|p| p.into_inner()).get(memory.0)?) > 1 {
            self.reap();
        }
        let mut m = self.memory.write().unwrap_or_else(|p| p.into_inner());
        let users = Arc::strong_count(m.get(memory.0)?) - 1;
        if users > 0 {
            return Err(Error::MemoryBusy { ops: users });
        }
        let region = m.remove(memory.0)?;
        drop(m);
        // Freeing its GPU page tables waits for running I/O kernels
        // (gpu-io's gate): not with the memory table locked.
        drop(region);
        Ok(())
    }
}
