//! The on-media format: a superblock, a record table and the object
//! slots, laid over the slots of one runtime store (docs/kv-store.md has
//! the byte offsets).
//!
//! ```text
//! byte 0             superblock (one logical block)
//! byte block_size    lease block: who has the store open for writing
//! byte 2*block_size  record table: one 64-byte record per object slot,
//!                    packed, block_size / 64 records per logical block
//! data_offset        object slots of object_size bytes, slot i at
//!                    data_offset + i * object_size
//! ```
//!
//! Everything is little endian. Every structure carries a CRC32C; a
//! record's CRC also covers the store's UUID, so records left by an
//! earlier format of the same media never count.

mod layout;
mod lease;
mod record;
mod superblock;

pub use layout::Layout;
pub use lease::{LeaseDecode, LeaseRecord, LEASE_MAGIC};
pub use record::{Record, RecordDecode, RECORD_BYTES};
pub use superblock::{Superblock, SuperblockError, FORMAT_VERSION, SUPERBLOCK_MAGIC};
