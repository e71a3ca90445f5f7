//! The checks on one submission queue entry that need no memory: the
//! opcode allow-list, FUSE/PSDT/MPTR, the tenant's NSID, the bits of each
//! command dword (an allow-list too), SLBA + NLB inside
//! its partition, and the transfer length (NVM Command Set 2.0: Read 3.2.4,
//! Write 3.2.6, Write Zeroes 3.2.8; Flush, Base 2.0 7.1).

use nvme_regs::opcode::nvm_opcode;
use nvme_regs::Sqe;

use super::{Partition, Refusal};

/// What one tenant's commands may reach on a mediated drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    /// The drive's served namespace.
    pub nsid: u32,
    /// The LBAs the tenant may name.
    pub partition: Partition,
    /// Logical block size in bytes.
    pub block_size: u64,
    /// Most bytes one command may move (the mediated MDTS).
    pub max_transfer: u64,
}

/// The opcodes a client's I/O SQ may carry: what the runtime and tutti-kv
/// issue. Everything else (Compare, Write Uncorrectable, Dataset
/// Management, vendor opcodes) is refused: DSM's range list would be one
/// more buffer to copy and check, and nothing here uses it.
pub const ALLOWED: [u8; 4] =
    [nvm_opcode::FLUSH, nvm_opcode::WRITE, nvm_opcode::READ, nvm_opcode::WRITE_ZEROES];

/// CDW12 bits a Read or Write may carry: NLB (15:0), FUA (30), LR (31).
/// Not PRINFO (the namespace has no protection information), STC, DTYPE,
/// CETYPE (Key Per I/O), nor anything reserved today.
pub const RW_CDW12: u32 = 0xffff | 1 << 30 | 1 << 31;
/// CDW12 bits a Write Zeroes may carry: as [`RW_CDW12`] plus DEAC (25).
/// Not bit 23, Namespace Zeroes in NVM Command Set 1.1 (the whole
/// namespace, SLBA and NLB ignored).
pub const WZ_CDW12: u32 = RW_CDW12 | 1 << 25;

/// What a checked entry needs: the bytes its data pointer must cover (0:
/// no data, PRPs unused) and its SLBA on the namespace (the tenant's SLBA
/// moved by the partition's first LBA; `None` for Flush).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Bytes moved.
    pub bytes: u64,
    /// SLBA for the controller's copy.
    pub slba: Option<u64>,
}

/// Checks `sqe` for `tenant`.
///
/// # Errors
///
/// [`Refusal::Opcode`], [`Refusal::Shape`], [`Refusal::Nsid`],
/// [`Refusal::Reserved`], [`Refusal::Lba`], [`Refusal::TooLong`].
pub fn check(sqe: &Sqe, tenant: &Tenant) -> Result<Checked, Refusal> {
    let opcode = sqe.opcode();
    if !ALLOWED.contains(&opcode) {
        return Err(Refusal::Opcode { opcode });
    }
    if sqe.fuse() != 0 || sqe.psdt() != 0 || sqe.mptr != 0 {
        return Err(Refusal::Shape { fuse: sqe.fuse(), psdt: sqe.psdt(), mptr: sqe.mptr });
    }
    if sqe.nsid != tenant.nsid {
        return Err(Refusal::Nsid { nsid: sqe.nsid, expected: tenant.nsid });
    }
    allowed_bits(sqe)?;
    if opcode == nvm_opcode::FLUSH {
        return Ok(Checked { bytes: 0, slba: None });
    }
    let slba = u64::from(sqe.cdw10) | (u64::from(sqe.cdw11) << 32);
    let blocks = u64::from(sqe.cdw12 & 0xffff) + 1;
    let p = tenant.partition;
    let moved = p.translate(slba, blocks).ok_or(Refusal::Lba { slba, blocks, len: p.blocks })?;
    if opcode == nvm_opcode::WRITE_ZEROES {
        return Ok(Checked { bytes: 0, slba: Some(moved) });
    }
    let bytes = blocks * tenant.block_size;
    if bytes > tenant.max_transfer {
        return Err(Refusal::TooLong { bytes, max: tenant.max_transfer });
    }
    Ok(Checked { bytes, slba: Some(moved) })
}

/// Every command dword past NSID (MPTR and the PRPs aside) holds only the
/// bits the daemon forwards for `sqe`'s opcode (an allowed one): CDW10
/// and CDW11 are the SLBA (Flush: 0), CDW12 within [`RW_CDW12`] or
/// [`WZ_CDW12`] (Flush: 0), CDW2, CDW3 and CDW13..15 zero.
///
/// # Errors
///
/// [`Refusal::Reserved`] naming the first dword with a bit set that may
/// not be.
fn allowed_bits(sqe: &Sqe) -> Result<(), Refusal> {
    let cdw12 = match sqe.opcode() {
        nvm_opcode::FLUSH => 0,
        nvm_opcode::WRITE_ZEROES => WZ_CDW12,
        _ => RW_CDW12,
    };
    let slba = if sqe.opcode() == nvm_opcode::FLUSH { 0 } else { u32::MAX };
    let d = sqe.as_dwords();
    let allowed = [(2, 0), (3, 0), (10, slba), (11, slba), (12, cdw12), (13, 0), (14, 0), (15, 0)];
    for (dword, mask) in allowed {
        let bits = d[usize::from(dword)] & !mask;
        if bits != 0 {
            return Err(Refusal::Reserved { dword, bits });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant() -> Tenant {
        Tenant {
            nsid: 1,
            partition: Partition { first: 16, blocks: 16 },
            block_size: 4096,
            max_transfer: 64 << 10,
        }
    }

    fn rw(opcode: u8, slba: u64, blocks: u32) -> Sqe {
        let mut s = Sqe::new(opcode, 1);
        s.cdw10 = slba as u32;
        s.cdw11 = (slba >> 32) as u32;
        s.cdw12 = blocks - 1;
        s
    }

    #[test]
    fn only_allowed_opcodes_in_the_partition_pass() {
        let t = tenant();
        // The tenant's LBAs 0..16 are the namespace's 16..32.
        let ok = |bytes, slba| Ok(Checked { bytes, slba });
        assert_eq!(check(&rw(nvm_opcode::READ, 0, 2), &t), ok(8192, Some(16)));
        assert_eq!(check(&rw(nvm_opcode::WRITE, 15, 1), &t), ok(4096, Some(31)));
        assert_eq!(check(&rw(nvm_opcode::WRITE_ZEROES, 0, 16), &t), ok(0, Some(16)));
        assert_eq!(check(&Sqe::new(nvm_opcode::FLUSH, 1), &t), ok(0, None));
        for (s, what) in [
            (rw(nvm_opcode::READ, 16, 1), "past the end"),
            (rw(nvm_opcode::WRITE, 15, 2), "across the end"),
            (rw(nvm_opcode::WRITE_ZEROES, 0, 64), "write zeroes"),
            (rw(nvm_opcode::READ, u64::MAX, 2), "wrapping"),
        ] {
            assert!(matches!(check(&s, &t), Err(Refusal::Lba { .. })), "{what}");
        }
        // Admin opcodes in an I/O SQ: Create/Delete I/O SQ, Format NVM, ...
        for opcode in [0x04, 0x05, 0x06, 0x09, 0x0c, 0x10, 0x7f, 0x80, 0x81, 0xff] {
            let s = Sqe::new(opcode, 1);
            if !ALLOWED.contains(&opcode) {
                assert_eq!(check(&s, &t), Err(Refusal::Opcode { opcode }));
            }
        }
        assert!(matches!(check(&Sqe::new(nvm_opcode::FLUSH, 2), &t), Err(Refusal::Nsid { .. })));
        assert!(matches!(check(&Sqe::new(nvm_opcode::FLUSH, u32::MAX), &t), Err(Refusal::Nsid { .. })));
        let mut sgl = rw(nvm_opcode::READ, 16, 1);
        sgl.cdw0 |= 1 << 14;
        assert!(matches!(check(&sgl, &t), Err(Refusal::Shape { psdt: 1, .. })));
        let mut fused = rw(nvm_opcode::READ, 16, 1);
        fused.cdw0 |= 1 << 8;
        assert!(matches!(check(&fused, &t), Err(Refusal::Shape { fuse: 1, .. })));
        let mut meta = rw(nvm_opcode::READ, 16, 1);
        meta.mptr = 0x1000;
        assert!(matches!(check(&meta, &t), Err(Refusal::Shape { .. })));
        let big = Tenant { partition: Partition::whole(1 << 20), ..t };
        assert!(matches!(check(&rw(nvm_opcode::READ, 0, 17), &big), Err(Refusal::TooLong { .. })));
    }

    #[test]
    fn bits_the_daemon_does_not_forward_are_refused() {
        // Only NLB, FUA and LR (and DEAC for Write Zeroes) of CDW12, and
        // nothing in CDW2, CDW3, CDW13..15 (Flush: nothing past NSID). A
        // reserved bit today may mean something tomorrow: Write Zeroes'
        // CDW12 bit 23 is Namespace Zeroes in NVM Command Set 1.1, which
        // zeroes the whole namespace and ignores SLBA and NLB.
        let t = tenant();
        let field = |s: &Sqe| matches!(check(s, &t), Err(Refusal::Reserved { .. }));
        let mut ok = rw(nvm_opcode::WRITE_ZEROES, 0, 1);
        ok.cdw12 |= 1 << 25 | 1 << 30 | 1 << 31;
        assert!(check(&ok, &t).is_ok(), "DEAC, FUA, LR");
        let mut nsz = rw(nvm_opcode::WRITE_ZEROES, 0, 1);
        nsz.cdw12 |= 1 << 23;
        assert!(field(&nsz), "Namespace Zeroes");
        for bit in [16, 19, 20, 23, 24, 25, 26, 29] {
            for opcode in [nvm_opcode::READ, nvm_opcode::WRITE] {
                let mut s = rw(opcode, 0, 1);
                s.cdw12 |= 1 << bit;
                assert!(field(&s), "opcode {opcode:#x} CDW12 bit {bit}");
            }
        }
        for dword in [2usize, 3, 13, 14, 15] {
            for opcode in [nvm_opcode::READ, nvm_opcode::WRITE, nvm_opcode::WRITE_ZEROES, nvm_opcode::FLUSH] {
                let mut d = rw(opcode, 0, 1).as_dwords();
                if opcode == nvm_opcode::FLUSH {
                    d[10..].fill(0);
                }
                d[dword] = 1;
                assert!(field(&Sqe::from_dwords(d)), "opcode {opcode:#x} CDW{dword}");
            }
        }
        let mut flush = Sqe::new(nvm_opcode::FLUSH, 1);
        flush.cdw12 = 1 << 30;
        assert!(field(&flush), "Flush has no CDW12");
    }
}
