//! tutti-kv: a persistent, crash-consistent KV-cache block store on the
//! tutti runtime.
//!
//! Objects (KV-cache blocks) are named by fixed-size keys (16 or 32-byte
//! digests; [`ChunkKeys`] derives chained keys from token ids) and live one
//! per slot of a runtime store (`slab` resolver; the slot size is the
//! largest object), on one drive or striped over several. The store keeps
//! its own index on the media, so a restarted process finds what an
//! earlier one saved, and it never returns bytes it cannot vouch for:
//!
//! - every object has a record (key, length, generation, CRC32C of the
//!   payload, CRC32C of the record) written only after its payload is
//!   durable, and made durable before the put is acknowledged, with group
//!   commit: concurrent puts share the two Flushes of a round;
//! - every get checks the payload's CRC32C (the CPU's instruction for host
//!   memory, a kernel for GPU memory) before it reports a hit: a torn,
//!   bit-flipped or never-written payload is a [`ItemStatus::ChecksumMismatch`];
//! - a slot is reused only after its old record is cleared on the media;
//! - at open, the index is rebuilt from the record table: for each key,
//!   the valid record with the highest generation wins.
//!
//! When the store is full, least recently used objects not being read are
//! evicted. docs/kv-store.md has the on-media format and what survives
//! which failure.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tutti::{Config, Runtime};
//! use tutti_kv::{ChunkKeys, Get, KeySize, KvStore, OpenOptions, Put, Value};
//!
//! let rt = Arc::new(Runtime::from_config(Config::builtin_striped_ram(4, 256 << 20, 1 << 20))?);
//! let kv = KvStore::open(rt, &OpenOptions::new("kv"))?;
//! let keys = ChunkKeys::new(b"my-model", KeySize::B32).chain(&[1, 2, 3, 4], 2);
//! let mut buf = vec![7u8; 2 << 20];
//! // SAFETY: `buf` outlives the registration and is not touched during I/O.
//! let mem = unsafe { kv.register_host(buf.as_mut_ptr(), buf.len())? };
//! let v = |i: u64| Value { memory: &mem, offset: i << 20, len: 1 << 20 };
//! let t = Duration::from_secs(5);
//! kv.put_sync(&[Put { key: keys[0], value: v(0) }, Put { key: keys[1], value: v(1) }], t)?;
//! assert_eq!(kv.lookup_prefix(&keys), 2);
//! let st = kv.get_sync(&[Get { key: keys[0], into: v(1) }], t)?;
//! assert!(st[0].is_ok());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Unsafe is used in two places: registering memory with the runtime
// (`ops.rs`, `staging.rs`, forwarding the runtime's contract) and reading
// registered host memory to checksum it (`memory.rs`).
#![allow(unsafe_code)]

mod checksum;
mod commit;
mod committer;
mod error;
pub mod format;
mod get;
mod index;
mod inflight;
mod io;
mod key;
mod lease;
mod media;
mod memory;
mod ops;
mod put;
mod staging;
mod stats;
mod store;

pub use error::{HolderPlace, ItemStatus, KvError, LeaseHolder};
pub use get::{Get, PendingGets};
pub use key::{ChunkKeys, Key, KeyLengthError, KeySize};
pub use lease::LeaseOptions;
pub use memory::{KvMemory, MemoryKind, Value};
pub use put::{PendingPuts, Put};
pub use stats::KvStats;
pub use store::{Access, Create, KvStore, OpenOptions};

/// The README's Rust examples, compiled (and the store's run) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;
