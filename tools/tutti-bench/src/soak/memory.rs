//! A cell's value memory: one region of `rooms` equal rooms, in host memory
//! (CPU-executed stores) or GPU memory with a host mirror (GPU-executed
//! stores), registered once with the store. Room `i` holds one object:
//! sources are filled with the pattern of (key, version) over the object's
//! length and zero after it; destinations are zeroed before each round
//! and compared with the sources after it, every byte of every room.

use std::sync::Arc;

use tutti_bench::fill_block;
use tutti_kv::{KvMemory, KvStore};

use super::error::CellError;

/// Host memory, or GPU memory and its host mirror.
enum Bytes {
    /// Host memory (u64 words, so it is 8-byte aligned).
    Host(Vec<u64>),
    /// GPU memory of the runtime's GPU and a host copy of it.
    Gpu {
        /// The device allocation the drives read and write.
        buf: gpu_io::GpuBuffer,
        /// Patterns are built and compared here.
        mirror: Vec<u8>,
    },
}

/// One registered region of equal rooms. Dropped while still registered
/// (a cell that failed half way), it unregisters from the runtime, and
/// where a drive may still access it, leaks its memory rather than free it.
pub struct Values {
    bytes: Bytes,
    /// Bytes per room.
    room: usize,
    mem: KvMemory,
    /// Whether `mem` is still registered.
    registered: bool,
    rt: Arc<tutti::Runtime>,
}

/// A zeroed host allocation of `len` bytes, or why not.
fn host_vec<T: Clone + Default>(len: usize) -> Result<Vec<T>, CellError> {
    let mut v: Vec<T> = Vec::new();
    v.try_reserve_exact(len).map_err(|_| CellError::Alloc { bytes: len * std::mem::size_of::<T>() })?;
    v.resize(len, T::default());
    Ok(v)
}

impl Values {
    /// `rooms` rooms of `room` bytes (a multiple of 8), registered with
    /// `kv`: GPU memory of `gpu` when given, else host memory.
    pub fn new(
        kv: &KvStore,
        gpu: Option<&Arc<gpu_io::Gpu>>,
        rooms: usize,
        room: usize,
    ) -> Result<Self, CellError> {
        let len = rooms.checked_mul(room).ok_or(CellError::Alloc { bytes: usize::MAX })?;
        let bytes = match gpu {
            Some(g) => Bytes::Gpu { buf: gpu_io::GpuBuffer::zeroed(g, len)?, mirror: host_vec(len)? },
            None => Bytes::Host(host_vec(len.div_ceil(8))?),
        };
        Self::register(bytes, kv, len, room)
    }

    /// Registers the whole of `bytes` (`len` bytes) with `kv`.
    fn register(mut bytes: Bytes, kv: &KvStore, len: usize, room: usize) -> Result<Self, CellError> {
        let mem = match &mut bytes {
            // SAFETY: the Vec's buffer is never resized or freed while
            // registered (it moves into the returned `Values`, which
            // unregisters in `release` or its `Drop`, and leaks the buffer
            // where the runtime still holds it), and its bytes are touched
            // only between a round's waits and the next submission.
            #[allow(unsafe_code)]
            Bytes::Host(w) => unsafe { kv.register_host(w.as_mut_ptr().cast(), len) },
            // SAFETY: as above, for the device allocation, which lives as
            // long as `self`.
            #[allow(unsafe_code)]
            Bytes::Gpu { buf, .. } => unsafe { kv.register_gpu(buf.device_ptr(), len) },
        }?;
        // Moving `bytes` into `Self` moves the Vec's handle, not its heap
        // buffer (nor the device allocation), so the registration holds.
        Ok(Self { bytes, room, mem, registered: true, rt: kv.runtime().clone() })
    }

    /// The registration, for the store's `Value`s (unregistered after
    /// [`Values::release`]: the store then refuses it).
    pub fn mem(&self) -> &KvMemory {
        &self.mem
    }

    /// Bytes per room.
    pub fn room(&self) -> usize {
        self.room
    }

    /// The host bytes (for GPU memory: the mirror, as last copied).
    fn host(&mut self) -> &mut [u8] {
        match &mut self.bytes {
            Bytes::Host(w) => crate::words::as_bytes_mut(w),
            Bytes::Gpu { mirror, .. } => mirror,
        }
    }

    /// Room `i` of the host bytes (the mirror for GPU memory, as last
    /// downloaded).
    pub fn room_bytes(&self, i: usize) -> &[u8] {
        let r = self.room;
        let all: &[u8] = match &self.bytes {
            Bytes::Host(w) => host_view(w),
            Bytes::Gpu { mirror, .. } => mirror,
        };
        &all[i * r..(i + 1) * r]
    }

    /// Writes the pattern of (`key`, `version`) over the first `len` bytes
    /// of room `i` and zeroes the rest of the room (host side only: call
    /// [`Values::upload`] before the I/O).
    pub fn fill(&mut self, i: usize, len: usize, key: u64, version: u64) {
        let r = self.room;
        let room = &mut self.host()[i * r..(i + 1) * r];
        fill_block(&mut room[..len], key, version);
        room[len..].fill(0);
    }

    /// Copies the mirror to GPU memory (nothing for host memory).
    pub fn upload(&mut self) -> Result<(), CellError> {
        if let Bytes::Gpu { buf, mirror } = &self.bytes {
            buf.copy_in(0, mirror)?;
        }
        Ok(())
    }

    /// Zeroes every room (both sides for GPU memory).
    pub fn zero(&mut self) -> Result<(), CellError> {
        self.host().fill(0);
        self.upload()
    }

    /// Copies GPU memory to the mirror (nothing for host memory).
    pub fn download(&mut self) -> Result<(), CellError> {
        if let Bytes::Gpu { buf, mirror } = &mut self.bytes {
            buf.copy_out(0, mirror)?;
        }
        Ok(())
    }

    /// Unregisters the region from `kv` (kept registered on an error: a
    /// put or get still uses it).
    pub fn release(&mut self, kv: &KvStore) -> Result<(), CellError> {
        if self.registered {
            kv.unregister(self.mem)?;
            self.registered = false;
        }
        Ok(())
    }
}

impl Drop for Values {
    fn drop(&mut self) {
        if !self.registered {
            return;
        }
        if self.rt.unregister_memory(self.mem.handle()).is_err() {
            // A drive may still write it: never free it.
            std::mem::forget(std::mem::replace(&mut self.bytes, Bytes::Host(Vec::new())));
        }
    }
}

/// A u64 buffer viewed as bytes, read-only.
fn host_view(words: &[u64]) -> &[u8] {
    // SAFETY: a u64 buffer viewed as bytes (u8 has no alignment or
    // validity requirement), borrowed for the slice's lifetime; read only
    // while no I/O on it is in flight.
    #[allow(unsafe_code)]
    unsafe {
        std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8)
    }
}

/// Bytes of `got` that differ from `want` (equal lengths), counted only
/// when the slices differ (the common case is one `memcmp`).
pub fn wrong_bytes(got: &[u8], want: &[u8]) -> u64 {
    if got == want {
        return 0;
    }
    got.iter().zip(want).filter(|(a, b)| a != b).count() as u64
}
