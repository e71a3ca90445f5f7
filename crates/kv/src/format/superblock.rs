//! The superblock: the first logical block of the store, written once
//! when the store is formatted. Format version 2 added the lease block
//! (logical block 1, `lease.rs`) before the record table; a version-1
//! store is refused (`SuperblockError::Version`), not read.
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | magic `TUTTIKV\0` |
//! | 8..12 | format version ([`FORMAT_VERSION`]) |
//! | 12..16 | key size, bytes (16 or 32) |
//! | 16..32 | UUID of this format of the store |
//! | 32..36 | logical block size, bytes |
//! | 36..40 | record size, bytes (64) |
//! | 40..48 | object size, bytes |
//! | 48..56 | store size, bytes |
//! | 56..64 | capacity, objects |
//! | 64..72 | record table offset, bytes |
//! | 72..80 | first object's offset, bytes |
//! | 80..84 | CRC32C of bytes 0..80 |
//!
//! The rest of the block is zero.

use super::{Layout, RECORD_BYTES};
use crate::key::KeySize;

/// Magic at byte 0.
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"TUTTIKV\0";
/// The on-media format this code writes and reads.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes of the superblock that carry fields.
const USED: usize = 84;

/// A decoded superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Key size of the store.
    pub key_size: KeySize,
    /// Identity of this format of the store.
    pub uuid: [u8; 16],
    /// The geometry it was formatted with.
    pub layout: Layout,
}

/// Why the first block is not a superblock this code can use. Nothing is
/// written when one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SuperblockError {
    /// The block is all zero: the store was never formatted.
    #[error("the store is blank (never formatted)")]
    Blank,
    /// Not a tutti-kv superblock (another format, or data of another user).
    #[error("not a tutti-kv store: no superblock magic at byte 0")]
    NotAStore,
    /// The magic is there but the checksum is wrong.
    #[error("the superblock's checksum is wrong (stored {stored:#010x}, computed {computed:#010x})")]
    Corrupt {
        /// CRC32C in the block.
        stored: u32,
        /// CRC32C of its bytes.
        computed: u32,
    },
    /// Written by another format version.
    #[error("format version {found} is not supported (this build reads version {supported})")]
    Version {
        /// Version in the superblock.
        found: u32,
        /// [`FORMAT_VERSION`].
        supported: u32,
    },
    /// Formatted with another geometry than the store has now.
    #[error("the store was formatted with {field} = {found}, but now has {expected}")]
    Geometry {
        /// Which field differs.
        field: &'static str,
        /// In the superblock.
        found: u64,
        /// What the store has now.
        expected: u64,
    },
}

impl Superblock {
    /// The superblock's block (`layout.block_size` bytes).
    pub fn encode(&self) -> Vec<u8> {
        let l = &self.layout;
        let mut b = vec![0u8; l.block_size as usize];
        b[0..8].copy_from_slice(&SUPERBLOCK_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(self.key_size.bytes() as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..36].copy_from_slice(&l.block_size.to_le_bytes());
        b[36..40].copy_from_slice(&(RECORD_BYTES as u32).to_le_bytes());
        b[40..48].copy_from_slice(&l.object_size.to_le_bytes());
        b[48..56].copy_from_slice(&l.store_bytes.to_le_bytes());
        b[56..64].copy_from_slice(&l.capacity.to_le_bytes());
        b[64..72].copy_from_slice(&l.record_offset.to_le_bytes());
        b[72..80].copy_from_slice(&l.data_offset.to_le_bytes());
        let crc = crc32c::crc32c(&b[..80]);
        b[80..84].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes block 0 and checks it against the store's geometry now
    /// (`expected`).
    pub fn decode(b: &[u8], expected: &Layout) -> Result<Self, SuperblockError> {
        if b.len() < USED || b.iter().all(|&x| x == 0) {
            return Err(SuperblockError::Blank);
        }
        if b[0..8] != SUPERBLOCK_MAGIC {
            return Err(SuperblockError::NotAStore);
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let (stored, computed) = (u32_at(80), crc32c::crc32c(&b[..80]));
        if stored != computed {
            return Err(SuperblockError::Corrupt { stored, computed });
        }
        if b[USED..].iter().any(|&x| x != 0) {
            // The rest of the block is zero in every superblock written; a
            // set bit there is damage the checksum does not cover.
            return Err(SuperblockError::Corrupt { stored, computed });
        }
        let found = u32_at(8);
        if found != FORMAT_VERSION {
            return Err(SuperblockError::Version { found, supported: FORMAT_VERSION });
        }
        let checks: [(&'static str, u64, u64); 7] = [
            ("block_size", u64::from(u32_at(32)), u64::from(expected.block_size)),
            ("record_size", u64::from(u32_at(36)), RECORD_BYTES as u64),
            ("object_size", u64_at(40), expected.object_size),
            ("store_bytes", u64_at(48), expected.store_bytes),
            ("capacity", u64_at(56), expected.capacity),
            ("record_offset", u64_at(64), expected.record_offset),
            ("data_offset", u64_at(72), expected.data_offset),
        ];
        if let Some(&(field, found, expected)) = checks.iter().find(|(_, f, e)| f != e) {
            return Err(SuperblockError::Geometry { field, found, expected });
        }
        let key_size = KeySize::from_bytes(u32_at(12) as usize).ok_or(SuperblockError::Geometry {
            field: "key_size",
            found: u64::from(u32_at(12)),
            expected: 32,
        })?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[16..32]);
        Ok(Self { key_size, uuid, layout: *expected })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            key_size: KeySize::B32,
            uuid: [9; 16],
            layout: Layout::new(4096, 1 << 20, 64 << 20).unwrap(),
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let s = sb();
        let b = s.encode();
        assert_eq!(Superblock::decode(&b, &s.layout), Ok(s));
        assert_eq!(Superblock::decode(&vec![0; 4096], &s.layout), Err(SuperblockError::Blank));
        let mut other = b.clone();
        other[0] ^= 1;
        assert_eq!(Superblock::decode(&other, &s.layout), Err(SuperblockError::NotAStore));
        for at in [50, 100, 4095] {
            let mut flipped = b.clone();
            flipped[at] ^= 4;
            assert!(
                matches!(Superblock::decode(&flipped, &s.layout), Err(SuperblockError::Corrupt { .. })),
                "{at}"
            );
        }
        let bigger = Layout::new(4096, 1 << 20, 128 << 20).unwrap();
        assert!(matches!(
            Superblock::decode(&b, &bigger),
            Err(SuperblockError::Geometry { field: "store_bytes", .. })
        ));
    }

    #[test]
    fn another_version_is_refused() {
        // Version 1 (no lease block) and a later version.
        for v in [1u32, 3] {
            let mut b = sb().encode();
            b[8..12].copy_from_slice(&v.to_le_bytes());
            let crc = crc32c::crc32c(&b[..80]);
            b[80..84].copy_from_slice(&crc.to_le_bytes());
            assert_eq!(
                Superblock::decode(&b, &sb().layout),
                Err(SuperblockError::Version { found: v, supported: FORMAT_VERSION })
            );
        }
    }
}
