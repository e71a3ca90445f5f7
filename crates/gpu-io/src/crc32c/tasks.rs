//! How a checksum batch is cut into tasks: each item's aligned 8-byte words
//! in chunks of [`CRC32C_CHUNK_BYTES`], one warp per chunk (the kernel's
//! `layout_of` and task split, which must agree with this), and the limits
//! of one batch.

use crate::abi::TuttiCrcItem;
use crate::error::GpuError;

/// Bytes of an item one warp checksums (`CHUNK_BYTES` in the kernel).
pub const CRC32C_CHUNK_BYTES: u64 = 8192;

/// Bytes the kernel reads per lane and round (`WORD_BYTES`).
pub(crate) const WORD_BYTES: u64 = 8;

/// Longest range one item may have, in bytes (2^48: far above any GPU's
/// memory; the kernel's arithmetic holds below 2^61).
pub const MAX_CRC32C_LEN: u64 = 1 << 48;

/// Most chunks (tasks) one launch takes: the kernel counts them in `u32`.
pub const MAX_CRC32C_TASKS: u64 = u32::MAX as u64;

/// Tasks (one warp each) of an item at device address `ptr` of `len` bytes:
/// one per started chunk of its aligned words, at least one (the kernel's
/// `layout_of` and task split, which must agree with this).
pub(crate) fn item_tasks(ptr: u64, len: u64) -> u64 {
    let to_aligned = (WORD_BYTES - ptr % WORD_BYTES) % WORD_BYTES;
    let words = (len - to_aligned.min(len)) / WORD_BYTES;
    words.div_ceil(CRC32C_CHUNK_BYTES / WORD_BYTES).max(1)
}

/// `first_task[i]` for every item and the total at the end (`items.len() + 1`
/// entries), or [`GpuError::Crc32cBatchTooLarge`].
pub(crate) fn task_offsets(items: &[TuttiCrcItem]) -> Result<Vec<u32>, GpuError> {
    let mut offsets = Vec::with_capacity(items.len() + 1);
    let mut total = 0u64;
    for it in items {
        offsets.push(total as u32);
        total += item_tasks(it.ptr, it.len);
        if total > MAX_CRC32C_TASKS {
            return Err(GpuError::Crc32cBatchTooLarge { items: items.len(), max_tasks: MAX_CRC32C_TASKS });
        }
    }
    offsets.push(total as u32);
    Ok(offsets)
}

/// `(device pointer, length)` ranges as kernel items, or
/// [`GpuError::Crc32cBadRange`] for one too long or wrapping.
pub(crate) fn raw_items(ranges: &[(u64, usize)]) -> Result<Vec<TuttiCrcItem>, GpuError> {
    let mut items = Vec::with_capacity(ranges.len());
    for (item, &(ptr, len)) in ranges.iter().enumerate() {
        let len64 = len as u64;
        if len64 > MAX_CRC32C_LEN || ptr.checked_add(len64).is_none() {
            return Err(GpuError::Crc32cBadRange { item, ptr, len });
        }
        items.push(TuttiCrcItem { ptr, len: len64 });
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_cover_every_chunk_and_at_least_one() {
        let c = CRC32C_CHUNK_BYTES;
        assert_eq!(item_tasks(0, 0), 1);
        assert_eq!(item_tasks(3, 4), 1);
        assert_eq!(item_tasks(0, c), 1);
        assert_eq!(item_tasks(0, c + 8), 2);
        assert_eq!(item_tasks(1, c + 7), 1, "7 head bytes, then c bytes of words");
        assert_eq!(item_tasks(1, c + 15), 2);
        let items = [TuttiCrcItem { ptr: 0, len: 0 }, TuttiCrcItem { ptr: 8, len: 3 * c }];
        assert_eq!(task_offsets(&items).unwrap_or_default(), vec![0, 1, 4]);
    }
}
