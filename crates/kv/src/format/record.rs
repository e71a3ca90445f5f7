//! The per-object record: 64 bytes in the record table, one per object
//! slot. An all-zero record is an empty slot.
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..4 | magic `TKVR` |
//! | 4..8 | CRC32C of the payload's `length` bytes |
//! | 8..16 | generation (>= 1; larger is newer) |
//! | 16..24 | payload length, bytes |
//! | 24..56 | key (a 16-byte key is followed by 16 zero bytes) |
//! | 56..60 | the slot this record describes (guards misplaced writes) |
//! | 60..64 | CRC32C of the store UUID followed by bytes 0..60 |

use crate::key::Key;

/// Bytes per record.
pub const RECORD_BYTES: usize = 64;
const RECORD_MAGIC: [u8; 4] = *b"TKVR";

/// One object's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The object's key.
    pub key: Key,
    /// Payload length, bytes.
    pub len: u64,
    /// Write generation: the store's counter when the object was put.
    pub generation: u64,
    /// CRC32C of the payload.
    pub payload_crc: u32,
}

/// What 64 bytes of the record table hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordDecode {
    /// All zero: no object.
    Empty,
    /// A record whose checksum, slot and fields are right.
    Valid(Record),
    /// Anything else (a flipped bit, a record of another format of this
    /// media, a record written for another slot): treated as no object.
    Invalid,
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn record_crc(uuid: &[u8; 16], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(uuid), body)
}

impl Record {
    /// The 64 bytes of this record for slot `slot` of the store `uuid`.
    pub fn encode(&self, uuid: &[u8; 16], slot: u32) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[0..4].copy_from_slice(&RECORD_MAGIC);
        b[4..8].copy_from_slice(&self.payload_crc.to_le_bytes());
        b[8..16].copy_from_slice(&self.generation.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..24 + self.key.len()].copy_from_slice(self.key.as_bytes());
        b[56..60].copy_from_slice(&slot.to_le_bytes());
        let crc = record_crc(uuid, &b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes the record of slot `slot` of the store `uuid` whose keys are
    /// `key_len` bytes and whose objects are at most `object_size` bytes.
    pub fn decode(
        b: &[u8; RECORD_BYTES],
        uuid: &[u8; 16],
        slot: u32,
        key_len: usize,
        object_size: u64,
    ) -> RecordDecode {
        if b.iter().all(|&x| x == 0) {
            return RecordDecode::Empty;
        }
        let valid = b[0..4] == RECORD_MAGIC
            && le_u32(&b[60..64]) == record_crc(uuid, &b[..60])
            && le_u32(&b[56..60]) == slot
            && b[24 + key_len..56].iter().all(|&x| x == 0);
        let (generation, len) = (le_u64(&b[8..16]), le_u64(&b[16..24]));
        let key = Key::new(&b[24..24 + key_len]);
        match key {
            Ok(key) if valid && generation != 0 && len <= object_size => {
                RecordDecode::Valid(Record { key, len, generation, payload_crc: le_u32(&b[4..8]) })
            }
            _ => RecordDecode::Invalid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = *b"0123456789abcdef";

    fn rec(k: u8) -> Record {
        Record { key: Key::new(&[k; 16]).unwrap(), len: 4096, generation: 7, payload_crc: 0xDEAD_BEEF }
    }

    #[test]
    fn round_trip() {
        let b = rec(1).encode(&UUID, 5);
        assert_eq!(Record::decode(&b, &UUID, 5, 16, 1 << 20), RecordDecode::Valid(rec(1)));
        assert_eq!(Record::decode(&[0; 64], &UUID, 5, 16, 1 << 20), RecordDecode::Empty);
    }

    #[test]
    fn every_flipped_bit_is_invalid() {
        let b = rec(2).encode(&UUID, 9);
        for bit in 0..RECORD_BYTES * 8 {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(Record::decode(&c, &UUID, 9, 16, 1 << 20), RecordDecode::Invalid, "bit {bit}");
        }
    }

    #[test]
    fn another_store_slot_or_size_is_invalid() {
        let b = rec(3).encode(&UUID, 9);
        assert_eq!(Record::decode(&b, b"fedcba9876543210", 9, 16, 1 << 20), RecordDecode::Invalid);
        assert_eq!(Record::decode(&b, &UUID, 10, 16, 1 << 20), RecordDecode::Invalid);
        assert_eq!(Record::decode(&b, &UUID, 9, 16, 1024), RecordDecode::Invalid, "longer than an object");
        let k32 = Record { key: Key::new(&[4; 32]).unwrap(), ..rec(4) };
        let b = k32.encode(&UUID, 1);
        assert_eq!(Record::decode(&b, &UUID, 1, 16, 1 << 20), RecordDecode::Invalid, "key size differs");
        assert_eq!(Record::decode(&b, &UUID, 1, 32, 1 << 20), RecordDecode::Valid(k32));
    }
}
