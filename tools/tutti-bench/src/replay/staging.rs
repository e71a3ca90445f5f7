//! The replay's staging buffer: where a batch's blocks sit between the
//! store and the verifier. Host memory owned by the replay, or GPU memory
//! with a host mirror for filling and checking (copied across each way).
//! Both register with the tutti-kv store, so the load, save and
//! verification logic above it is the same for both.

use std::sync::Arc;

use tutti_bench::{fill_block, verify_block, Mismatch};
use tutti_kv::{KvMemory, KvStore};

use super::err;

/// Byte written over the staging area before each load.
pub const POISON: u8 = 0xA5;

/// Host memory, or GPU memory and its host mirror.
pub enum Staging {
    /// Host memory (u64 words, so the buffer is 8-byte aligned).
    Host(Vec<u64>),
    /// Memory on the runtime's GPU and a host copy of it.
    Gpu {
        /// The device allocation the drives read and write.
        buf: gpu_io::GpuBuffer,
        /// Host mirror: patterns are built and checked here.
        mirror: Vec<u8>,
        /// The runtime's GPU (the store checksums `buf` with its kernel),
        /// kept alive as long as `buf`.
        _gpu: Arc<gpu_io::Gpu>,
    },
}

impl Staging {
    /// `len` bytes of host memory, or with `gpu` (the runtime's GPU, `None`
    /// when it has none) of GPU memory and `len` bytes of host mirror. A
    /// size the host cannot allocate is an error, not an abort.
    pub fn new(gpu: Option<Option<&Arc<gpu_io::Gpu>>>, len: usize) -> Result<Self, String> {
        let too_big = |_| format!("cannot allocate a {len}-byte staging buffer (smaller --block-tokens?)");
        Ok(if let Some(gpu) = gpu {
            let gpu =
                gpu.ok_or("--gpu needs a datapath with execution: gpu (the store's datapath has none)")?;
            let mut mirror: Vec<u8> = Vec::new();
            mirror.try_reserve_exact(len).map_err(too_big)?;
            mirror.resize(len, 0);
            let buf = gpu_io::GpuBuffer::zeroed(gpu, len).map_err(err)?;
            Staging::Gpu { buf, mirror, _gpu: gpu.clone() }
        } else {
            let mut words: Vec<u64> = Vec::new();
            words.try_reserve_exact(len.div_ceil(8)).map_err(too_big)?;
            words.resize(len.div_ceil(8), 0);
            Staging::Host(words)
        })
    }

    /// Bytes of the buffer.
    pub fn len(&self) -> usize {
        match self {
            Staging::Host(w) => w.len() * 8,
            Staging::Gpu { buf, .. } => buf.len(),
        }
    }

    /// Registers the whole buffer with `kv` (host or GPU memory).
    ///
    /// The caller keeps `self` alive, unmoved and unresized until the
    /// registration is undone (or the runtime is gone), and touches its
    /// bytes only between a batch's wait and the next submission.
    pub fn register(&mut self, kv: &KvStore) -> Result<KvMemory, String> {
        let len = self.len();
        match self {
            // SAFETY: the Vec is never resized or moved out while
            // registered (the caller's contract above), so the pointer stays
            // valid for `len` bytes of reads and writes.
            #[allow(unsafe_code)]
            Staging::Host(w) => unsafe { kv.register_host(w.as_mut_ptr().cast(), len) },
            // SAFETY: as above, for the device allocation, which lives as
            // long as `self`.
            #[allow(unsafe_code)]
            Staging::Gpu { buf, .. } => unsafe { kv.register_gpu(buf.device_ptr(), len) },
        }
        .map_err(|e| tutti::error_chain(&e))
    }

    /// Overwrites the first `len` bytes with [`POISON`].
    pub fn poison(&mut self, len: usize) -> Result<(), String> {
        match self {
            Staging::Host(w) => crate::words::as_bytes_mut(w)[..len].fill(POISON),
            Staging::Gpu { buf, mirror, .. } => {
                mirror[..len].fill(POISON);
                buf.copy_in(0, &mirror[..len]).map_err(err)?;
            }
        }
        Ok(())
    }

    /// Writes the pattern of block `hash` at `version` into bytes
    /// `at..at + len`.
    pub fn fill(&mut self, at: usize, len: usize, hash: u64, version: u64) -> Result<(), String> {
        match self {
            Staging::Host(w) => fill_block(&mut crate::words::as_bytes_mut(w)[at..at + len], hash, version),
            Staging::Gpu { buf, mirror, .. } => {
                fill_block(&mut mirror[at..at + len], hash, version);
                buf.copy_in(at, &mirror[at..at + len]).map_err(err)?;
            }
        }
        Ok(())
    }

    /// Checks every byte of `at..at + len` against block `hash`'s pattern
    /// at `version`.
    pub fn verify(&mut self, at: usize, len: usize, hash: u64, version: u64) -> Result<(), Mismatch> {
        match self {
            Staging::Host(w) => verify_block(&crate::words::as_bytes_mut(w)[at..at + len], hash, version),
            Staging::Gpu { buf, mirror, .. } => {
                // A failed copy leaves the mirror poisoned: a mismatch.
                mirror[at..at + len].fill(POISON);
                let _ = buf.copy_out(at, &mut mirror[at..at + len]);
                verify_block(&mirror[at..at + len], hash, version)
            }
        }
    }
}
