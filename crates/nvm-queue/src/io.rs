//! I/O planning: byte ranges (the runtime's unit) to logical blocks (SLBA,
//! NLB) and to commands no larger than MDTS.
//!
//! Bytes are used above this module and logical blocks below it. A request
//! must be block aligned and inside the namespace; it is refused with a
//! typed error before any command is built. NLB is zero-based on the wire
//! (NVM Command Set 1.0, 3.2.4 Read, CDW12); [`Nlb`] does that conversion.

use nvme_regs::opcode::{Read, Write, WriteZeroes};
use nvme_regs::{Nlb, Sqe};

/// A namespace as the driver uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Namespace identifier.
    pub nsid: u32,
    /// Logical block size in bytes (2^LBADS of the formatted LBA format).
    pub block_size: u32,
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
}

impl NamespaceInfo {
    /// Size in bytes (`blocks * block_size`, saturating).
    pub fn capacity_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// Why a byte range cannot be turned into commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    /// Zero-length request.
    #[error("zero-length request")]
    ZeroLength,
    /// Offset or length not a multiple of the logical block size.
    #[error("request {offset:#x}+{len:#x} is not aligned to the {block_size}-byte logical block")]
    Unaligned {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Logical block size in bytes.
        block_size: u32,
    },
    /// The range ends past the namespace.
    #[error("request {offset:#x}+{len:#x} is outside the namespace of {capacity:#x} bytes")]
    OutOfRange {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Namespace size in bytes.
        capacity: u64,
    },
    /// The per-command limit is smaller than one block.
    #[error("max transfer {max_transfer} is below the {block_size}-byte logical block")]
    TransferLimit {
        /// Limit in bytes.
        max_transfer: usize,
        /// Block size in bytes.
        block_size: u32,
    },
}

/// One command of a plan: `nlb` blocks from `slba`, carrying bytes
/// `offset..offset + len` of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoChunk {
    /// Starting LBA.
    pub slba: u64,
    /// Number of logical blocks (zero-based on the wire).
    pub nlb: Nlb,
    /// Offset of this chunk within the request, bytes.
    pub offset: usize,
    /// Length of this chunk, bytes.
    pub len: usize,
}

/// The commands for one byte range, each at most the transfer limit.
/// An iterator; computing it allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoPlan {
    next_lba: u64,
    remaining_blocks: u64,
    done_bytes: usize,
    block_size: u32,
    max_blocks: u64,
    /// Commands left to yield (computed once, not divided for again).
    commands: u32,
}

impl IoPlan {
    /// A plan that yields no command (for a command that moves no data,
    /// such as Flush, planned beside data commands).
    pub fn empty() -> Self {
        Self { next_lba: 0, remaining_blocks: 0, done_bytes: 0, block_size: 0, max_blocks: 0, commands: 0 }
    }

    /// Number of commands the plan (still) yields.
    pub fn commands(&self) -> usize {
        self.commands as usize
    }
}

impl Iterator for IoPlan {
    type Item = IoChunk;

    fn next(&mut self) -> Option<IoChunk> {
        if self.remaining_blocks == 0 {
            return None;
        }
        let blocks = self.remaining_blocks.min(self.max_blocks);
        let nlb = Nlb::from_blocks(blocks as u32)?;
        let len = (blocks * u64::from(self.block_size)) as usize;
        let chunk = IoChunk { slba: self.next_lba, nlb, offset: self.done_bytes, len };
        self.next_lba += blocks;
        self.remaining_blocks -= blocks;
        self.done_bytes += len;
        self.commands -= 1;
        Some(chunk)
    }
}

/// `a / b` and `a % b`, with a shift and a mask when `b` is a power of two
/// (every LBA size is, 2^LBADS; most transfer limits are, 2^MDTS pages):
/// this runs for every request, and a 64-bit division costs tens of cycles.
#[inline]
fn div_rem(a: u64, b: u64) -> (u64, u64) {
    if b.is_power_of_two() {
        (a >> b.trailing_zeros(), a & (b - 1))
    } else {
        (a / b, a % b)
    }
}

/// Plans `len` bytes at byte `offset` of namespace `ns` as commands of at
/// most `max_transfer` bytes (MDTS) and 65,536 blocks (NLB's range).
pub fn plan_io(ns: &NamespaceInfo, offset: u64, len: u64, max_transfer: usize) -> Result<IoPlan, IoError> {
    if len == 0 {
        return Err(IoError::ZeroLength);
    }
    let bs = u64::from(ns.block_size);
    if bs == 0 {
        return Err(IoError::Unaligned { offset, len, block_size: ns.block_size });
    }
    let ((first_lba, offset_rem), (blocks, len_rem)) = (div_rem(offset, bs), div_rem(len, bs));
    if offset_rem != 0 || len_rem != 0 {
        return Err(IoError::Unaligned { offset, len, block_size: ns.block_size });
    }
    let capacity = ns.capacity_bytes();
    match offset.checked_add(len) {
        Some(end) if end <= capacity && len <= usize::MAX as u64 => {}
        _ => return Err(IoError::OutOfRange { offset, len, capacity }),
    }
    let max_blocks = div_rem(max_transfer as u64, bs).0.min(65536);
    if max_blocks == 0 {
        return Err(IoError::TransferLimit { max_transfer, block_size: ns.block_size });
    }
    let (whole, rest) = div_rem(blocks, max_blocks);
    // At most `len / 512` commands; a request that needs more than 2^32 is
    // refused as out of range rather than miscounted.
    let commands = u32::try_from(whole + u64::from(rest != 0)).map_err(|_| IoError::OutOfRange {
        offset,
        len,
        capacity,
    })?;
    Ok(IoPlan {
        next_lba: first_lba,
        remaining_blocks: blocks,
        done_bytes: 0,
        block_size: ns.block_size,
        max_blocks,
        commands,
    })
}

/// What an I/O command does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoOp {
    /// Read (02h): device to host memory.
    Read,
    /// Write (01h): host memory to device.
    Write,
    /// Write Zeroes (08h): no data transfer.
    WriteZeroes,
}

impl IoOp {
    /// `true` when the command moves data (and needs PRPs).
    pub fn has_data(self) -> bool {
        !matches!(self, IoOp::WriteZeroes)
    }

    /// The SQE for `chunk` of namespace `nsid` (CID and PRPs are set by the
    /// queue).
    pub fn sqe(self, nsid: u32, chunk: &IoChunk) -> Sqe {
        match self {
            IoOp::Read => Read::new(nsid, chunk.slba, chunk.nlb).build(),
            IoOp::Write => Write::new(nsid, chunk.slba, chunk.nlb).build(),
            IoOp::WriteZeroes => WriteZeroes::new(nsid, chunk.slba, chunk.nlb).build(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NS4K: NamespaceInfo = NamespaceInfo { nsid: 1, block_size: 4096, blocks: 1024 };

    #[test]
    fn block_aligned_request_maps_to_slba_and_zero_based_nlb() {
        let mut p = plan_io(&NS4K, 12288, 4096, 128 << 10).unwrap();
        let c = p.next().unwrap();
        assert_eq!((c.slba, c.nlb.zero_based(), c.offset, c.len), (3, 0, 0, 4096));
        assert!(p.next().is_none());
        let sqe = IoOp::Read.sqe(1, &c);
        assert_eq!((sqe.cdw10, sqe.cdw11, sqe.cdw12 & 0xFFFF), (3, 0, 0));
    }

    #[test]
    fn partial_block_tail_is_refused() {
        assert_eq!(
            plan_io(&NS4K, 12288, 4096 + 2048, 1 << 20),
            Err(IoError::Unaligned { offset: 12288, len: 6144, block_size: 4096 })
        );
        assert!(matches!(plan_io(&NS4K, 2048, 4096, 1 << 20), Err(IoError::Unaligned { .. })));
        assert_eq!(plan_io(&NS4K, 0, 0, 1 << 20), Err(IoError::ZeroLength));
    }

    #[test]
    fn out_of_range_is_refused() {
        let cap = NS4K.capacity_bytes();
        assert!(plan_io(&NS4K, cap - 4096, 4096, 1 << 20).is_ok());
        assert_eq!(
            plan_io(&NS4K, cap, 4096, 1 << 20),
            Err(IoError::OutOfRange { offset: cap, len: 4096, capacity: cap })
        );
        assert!(matches!(
            plan_io(&NS4K, u64::MAX - 4095, 8192, 1 << 20),
            Err(IoError::Unaligned { .. }) | Err(IoError::OutOfRange { .. })
        ));
    }

    #[test]
    fn larger_than_mdts_splits() {
        // 1 MiB + 8 KiB at LBA 2 with a 256 KiB MDTS: 4 full commands + 1.
        let p = plan_io(&NS4K, 8192, (1 << 20) + 8192, 256 << 10).unwrap();
        assert_eq!(p.commands(), 5);
        let v: Vec<_> = p.map(|c| (c.slba, c.nlb.blocks(), c.offset)).collect();
        assert_eq!(
            v,
            vec![
                (2, 64, 0),
                (66, 64, 256 << 10),
                (130, 64, 512 << 10),
                (194, 64, 768 << 10),
                (258, 2, 1 << 20)
            ]
        );
    }

    proptest! {
        #[test]
        fn plan_covers_the_range_exactly(off in 0u64..1000, blocks in 1u64..3000, mdts in 1usize..100, bs in prop_oneof![Just(512u32), Just(4096u32)]) {
            let ns = NamespaceInfo { nsid: 1, block_size: bs, blocks: 4096 };
            let r = plan_io(&ns, off * u64::from(bs), blocks * u64::from(bs), mdts * 4096);
            if off + blocks > 4096 { prop_assert!(r.is_err()); return Ok(()); }
            let p = r.unwrap();
            let n = p.commands();
            let chunks: Vec<_> = p.collect();
            prop_assert_eq!(chunks.len(), n);
            let mut lba = off; let mut bytes = 0usize;
            for c in &chunks {
                prop_assert_eq!(c.slba, lba);
                prop_assert_eq!(c.offset, bytes);
                prop_assert!(c.len <= mdts * 4096);
                prop_assert_eq!(c.len, c.nlb.blocks() as usize * bs as usize);
                lba += u64::from(c.nlb.blocks()); bytes += c.len;
            }
            prop_assert_eq!(lba, off + blocks);
        }
    }
}
