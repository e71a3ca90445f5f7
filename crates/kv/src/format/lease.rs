//! The lease block: logical block 1 of the store, naming the process that
//! has the store open for writing (docs/kv-store.md, "One writer per
//! store"). Rewritten when a writer takes the store, on every renewal and
//! when it closes the store; never read by recovery.
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | magic `TUTTILSE` |
//! | 8..24 | owner: random per open, all zero when the store is free |
//! | 24..32 | generation: 1 when taken, +1 per renewal |
//! | 32..48 | the owner's host boot id (`/proc/sys/kernel/random/boot_id`) |
//! | 48..56 | inode of the owner's PID namespace (`/proc/self/ns/pid`) |
//! | 56..60 | the owner's PID |
//! | 60..68 | the owner's start time, clock ticks after boot (`/proc/PID/stat` field 22) |
//! | 68..72 | the owner's renewal interval, ms (0: it does not renew) |
//! | 72..76 | CRC32C of bytes 0..72 |
//!
//! The rest of the block is zero. A block without the magic (never written,
//! or data of an earlier format) is a free lease. The lease is taken before
//! the superblock is read, so it also guards formatting: it belongs to the
//! media's block 1, not to one format's UUID.

/// Magic at byte 0.
pub const LEASE_MAGIC: [u8; 8] = *b"TUTTILSE";
/// Bytes of the lease block that carry fields.
const USED: usize = 76;

/// Who holds a store's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// Random identity of one open of the store.
    pub owner: [u8; 16],
    /// Renewal count.
    pub generation: u64,
    /// The holder's host boot id (zero when unknown).
    pub boot_id: [u8; 16],
    /// Inode of the holder's PID namespace (0 when unknown).
    pub pid_ns: u64,
    /// The holder's PID in that namespace.
    pub pid: u32,
    /// The holder's start time, clock ticks after boot (0 when unknown).
    pub start_time: u64,
    /// How often the holder renews, ms (0: never).
    pub renew_ms: u32,
}

/// What a lease block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseDecode {
    /// No writer holds the store.
    Free,
    /// A writer's lease.
    Held(LeaseRecord),
    /// The magic is ours but the checksum or the padding is wrong: held by
    /// nobody known.
    Invalid,
}

impl LeaseRecord {
    /// The lease block (`block_size` bytes, at least 76) of `self`.
    pub fn encode(&self, block_size: usize) -> Vec<u8> {
        let mut b = vec![0u8; block_size.max(USED)];
        b[0..8].copy_from_slice(&LEASE_MAGIC);
        b[8..24].copy_from_slice(&self.owner);
        b[24..32].copy_from_slice(&self.generation.to_le_bytes());
        b[32..48].copy_from_slice(&self.boot_id);
        b[48..56].copy_from_slice(&self.pid_ns.to_le_bytes());
        b[56..60].copy_from_slice(&self.pid.to_le_bytes());
        b[60..68].copy_from_slice(&self.start_time.to_le_bytes());
        b[68..72].copy_from_slice(&self.renew_ms.to_le_bytes());
        let crc = crc32c::crc32c(&b[..72]);
        b[72..76].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The block of a free lease.
    pub fn encode_free(block_size: usize) -> Vec<u8> {
        Self::default().encode(block_size)
    }

    /// Decodes a lease block.
    pub fn decode(b: &[u8]) -> LeaseDecode {
        if b.len() < USED || b[0..8] != LEASE_MAGIC {
            return LeaseDecode::Free;
        }
        let crc = u32::from_le_bytes([b[72], b[73], b[74], b[75]]);
        if crc != crc32c::crc32c(&b[..72]) || b[USED..].iter().any(|&x| x != 0) {
            return LeaseDecode::Invalid;
        }
        let arr16 = |o: usize| -> [u8; 16] { b[o..o + 16].try_into().unwrap_or([0; 16]) };
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let r = Self {
            owner: arr16(8),
            generation: u64_at(24),
            boot_id: arr16(32),
            pid_ns: u64_at(48),
            pid: u32_at(56),
            start_time: u64_at(60),
            renew_ms: u32_at(68),
        };
        if r.owner == [0; 16] {
            LeaseDecode::Free
        } else {
            LeaseDecode::Held(r)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> LeaseRecord {
        LeaseRecord {
            owner: [1; 16],
            generation: 9,
            boot_id: [2; 16],
            pid_ns: 4026531836,
            pid: 4242,
            start_time: 123_456,
            renew_ms: 2000,
        }
    }

    #[test]
    fn a_lease_round_trips_and_a_free_one_is_free() {
        let b = held().encode(4096);
        assert_eq!(b.len(), 4096);
        assert_eq!(LeaseRecord::decode(&b), LeaseDecode::Held(held()));
        assert_eq!(LeaseRecord::decode(&LeaseRecord::encode_free(512)), LeaseDecode::Free);
        assert_eq!(LeaseRecord::decode(&[0u8; 4096]), LeaseDecode::Free, "never written");
        assert_eq!(LeaseRecord::decode(&[0xA5u8; 4096]), LeaseDecode::Free, "data of an earlier format");
    }

    #[test]
    fn damage_is_invalid() {
        let b = held().encode(4096);
        for at in [8, 30, 45, 70, 74, 4000] {
            let mut d = b.clone();
            d[at] ^= 0x10;
            assert_eq!(LeaseRecord::decode(&d), LeaseDecode::Invalid, "bit flipped at byte {at}");
        }
    }
}
