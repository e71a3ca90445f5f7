//! Where the superblock, the record table and the object slots lie in a
//! store's byte space, computed from the store's geometry alone.

use super::RECORD_BYTES;

/// The geometry of a store and the byte ranges derived from it. All
/// offsets and sizes are bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Logical block size of the store (the atomic write unit), bytes.
    pub block_size: u32,
    /// Size of one runtime slot, which is the largest object, bytes.
    pub object_size: u64,
    /// Bytes in the store (the runtime datapath's capacity).
    pub store_bytes: u64,
    /// Object slots (the store's capacity in objects).
    pub capacity: u64,
    /// First byte of the record table (after the superblock's and the
    /// lease's blocks).
    pub record_offset: u64,
    /// First byte of object slot 0 (a multiple of `object_size`).
    pub data_offset: u64,
}

impl Layout {
    /// The layout of a store of `store_bytes` bytes cut into runtime slots
    /// of `object_size` bytes with `block_size`-byte logical blocks; `None`
    /// when not even one object fits, or the sizes are not multiples of
    /// the block size.
    pub fn new(block_size: u32, object_size: u64, store_bytes: u64) -> Option<Self> {
        let bs = u64::from(block_size);
        if bs < RECORD_BYTES as u64
            || !bs.is_power_of_two()
            || object_size == 0
            || !object_size.is_multiple_of(bs)
        {
            return None;
        }
        let slots = store_bytes / object_size;
        // The smallest number of leading slots that holds the superblock,
        // the lease block and the records of every slot after them.
        let table_bytes = |objects: u64| (objects * RECORD_BYTES as u64).div_ceil(bs) * bs;
        let meta_slots = (1..slots).find(|&m| m * object_size >= 2 * bs + table_bytes(slots - m))?;
        Some(Self {
            block_size,
            object_size,
            store_bytes,
            capacity: slots - meta_slots,
            record_offset: 2 * bs,
            data_offset: meta_slots * object_size,
        })
    }

    /// Byte offset of the lease block (`format/lease.rs`): logical block 1.
    pub fn lease_offset(&self) -> u64 {
        u64::from(self.block_size)
    }

    /// Records per logical block.
    pub fn records_per_block(&self) -> u64 {
        u64::from(self.block_size) / RECORD_BYTES as u64
    }

    /// Bytes of the record table (whole blocks).
    pub fn record_table_bytes(&self) -> u64 {
        self.capacity.div_ceil(self.records_per_block()) * u64::from(self.block_size)
    }

    /// Byte offset of the logical block that holds slot `slot`'s record.
    pub fn record_block_offset(&self, slot: u64) -> u64 {
        self.record_offset + slot / self.records_per_block() * u64::from(self.block_size)
    }

    /// Byte offset of object slot `slot`.
    pub fn object_offset(&self, slot: u64) -> u64 {
        self.data_offset + slot * self.object_size
    }

    /// Bytes actually moved for an object of `len` bytes: rounded up to
    /// whole logical blocks.
    pub fn padded(&self, len: u64) -> u64 {
        len.div_ceil(u64::from(self.block_size)) * u64::from(self.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_fits_before_the_first_object_and_objects_fill_the_rest() {
        for (bs, obj, bytes) in
            [(4096u32, 1u64 << 20, 1u64 << 30), (512, 4096, 1 << 20), (4096, 4096, 64 << 20)]
        {
            let l = Layout::new(bs, obj, bytes).unwrap();
            assert!(l.lease_offset() + u64::from(bs) <= l.record_offset, "{l:?}");
            assert!(l.record_offset + l.record_table_bytes() <= l.data_offset, "{l:?}");
            assert!(l.object_offset(l.capacity) <= bytes, "{l:?}");
            assert_eq!(l.data_offset % obj, 0);
            // One fewer metadata slot would not hold the table.
            let fewer = l.data_offset - obj;
            let more_objects = l.capacity + 1;
            let need = 2 * u64::from(bs) + (more_objects * 64).div_ceil(u64::from(bs)) * u64::from(bs);
            assert!(fewer < need, "{l:?}");
        }
    }

    #[test]
    fn record_blocks_and_padding() {
        let l = Layout::new(4096, 1 << 20, 1 << 30).unwrap();
        assert_eq!(l.records_per_block(), 64);
        assert_eq!(l.lease_offset(), 4096);
        assert_eq!(l.record_block_offset(0), 8192);
        assert_eq!(l.record_block_offset(63), 8192);
        assert_eq!(l.record_block_offset(64), 12288);
        assert_eq!(l.padded(1), 4096);
        assert_eq!(l.padded(4096), 4096);
        assert_eq!(l.padded(0), 0);
    }

    #[test]
    fn bad_geometry_is_refused() {
        assert!(Layout::new(4096, 1000, 1 << 20).is_none());
        assert!(Layout::new(4096, 4096, 4096).is_none(), "no room for an object");
        assert!(Layout::new(32, 4096, 1 << 20).is_none(), "a block smaller than a record");
        assert!(Layout::new(4096, 0, 1 << 20).is_none());
    }
}
