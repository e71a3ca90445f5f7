//! Backing stores for namespace data: RAM, a named RAM disk, a sparse
//! file, or nothing.
//!
//! Offsets here are byte offsets inside one namespace; the caller has
//! already checked SLBA + NLB against NSZE, and every access is checked
//! again here (a failed check is an Internal Error, never a panic).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;

use nvme_regs::status::{generic, media};
use nvme_regs::Status;

use crate::config::{BackingSpec, EmulatorConfig};
use crate::dma::DmaView;
use crate::prp::Segment;
use crate::ram_disk::RamDiskLease;
use crate::zeroed::zeroed_vec;
use crate::EmuError;

/// Bounce buffer size for file I/O and zeroing, in bytes.
const CHUNK: usize = 64 << 10;

/// Why a media operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MediaError {
    /// A host data segment could not be accessed (DMA fault).
    Dma,
    /// A status to complete the command with.
    Status(Status),
}

fn internal() -> MediaError {
    MediaError::Status(Status::generic(generic::INTERNAL_ERROR).with_dnr(true))
}

fn read_error() -> MediaError {
    MediaError::Status(Status::media(media::UNRECOVERED_READ_ERROR).with_dnr(true))
}

pub(crate) fn write_fault() -> MediaError {
    MediaError::Status(Status::media(media::WRITE_FAULT).with_dnr(true))
}

/// The store behind all namespaces of a controller.
#[derive(Debug)]
pub(crate) enum Backing {
    Ram(Vec<Vec<u8>>),
    /// A named RAM disk's images, given back to the registry on drop.
    RamDisk(RamDiskLease),
    Null,
    File {
        file: File,
        /// Byte offset of each namespace in the file.
        base: Vec<u64>,
        /// Size of each namespace in bytes.
        size: Vec<u64>,
        bounce: Vec<u8>,
    },
}

impl Backing {
    pub(crate) fn new(config: &EmulatorConfig) -> Result<Self, EmuError> {
        let sizes: Vec<u64> = config.namespaces.iter().map(|n| n.bytes().unwrap_or(0)).collect();
        match &config.backing {
            BackingSpec::Null => Ok(Backing::Null),
            BackingSpec::Ram => {
                let mut v = Vec::with_capacity(sizes.len());
                for &s in &sizes {
                    let n = usize::try_from(s).map_err(|_| EmuError::OutOfMemory { bytes: s })?;
                    v.push(zeroed_vec(n)?);
                }
                Ok(Backing::Ram(v))
            }
            BackingSpec::RamDisk(name) => {
                Ok(Backing::RamDisk(RamDiskLease::attach(name, &config.namespaces)?))
            }
            BackingSpec::File(path) => {
                let io = |source| EmuError::Backing { path: path.clone(), source };
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)
                    .map_err(io)?;
                let mut base = Vec::with_capacity(sizes.len());
                let mut total = 0u64;
                for &s in &sizes {
                    base.push(total);
                    total += s; // validated: no overflow
                }
                file.set_len(total).map_err(io)?;
                Ok(Backing::File { file, base, size: sizes, bounce: vec![0u8; CHUNK] })
            }
        }
    }

    /// True for the null store: no data moves, PRPs are not walked.
    pub(crate) fn is_null(&self) -> bool {
        matches!(self, Backing::Null)
    }

    /// True for the file store.
    pub(crate) fn is_file(&self) -> bool {
        matches!(self, Backing::File { .. })
    }

    /// The namespaces' RAM images, for the RAM and RAM disk stores.
    fn ram(&mut self) -> Option<&mut [Vec<u8>]> {
        match self {
            Backing::Ram(v) => Some(v),
            Backing::RamDisk(lease) => Some(lease.images()),
            Backing::Null | Backing::File { .. } => None,
        }
    }

    /// Address and length in bytes of each namespace's RAM image (RAM and
    /// RAM disk stores; none for the others), for page-locking.
    pub(crate) fn ram_ranges(&mut self) -> Vec<(NonNull<u8>, usize)> {
        self.ram().map_or_else(Vec::new, |images| {
            images.iter_mut().filter_map(|v| Some((NonNull::new(v.as_mut_ptr())?, v.len()))).collect()
        })
    }

    /// Namespace `ns`'s bytes `offset..offset + dst.len()` into `dst`
    /// (the null store leaves `dst` untouched).
    pub(crate) fn read_at(&mut self, ns: usize, offset: u64, dst: &mut [u8]) -> Result<(), MediaError> {
        if let Some(images) = self.ram() {
            let data = images.get(ns).ok_or_else(internal)?;
            dst.copy_from_slice(ram_range(data, offset, dst.len())?);
            return Ok(());
        }
        let Backing::File { file, base, size, .. } = self else { return Ok(()) };
        file_read(file, dst, file_range(base, size, ns, offset, dst.len())?)
    }

    /// `src` to namespace `ns`'s bytes `offset..offset + src.len()` (the
    /// null store drops it).
    pub(crate) fn write_at(&mut self, ns: usize, offset: u64, src: &[u8]) -> Result<(), MediaError> {
        if let Some(images) = self.ram() {
            let data = images.get_mut(ns).ok_or_else(internal)?;
            ram_range_mut(data, offset, src.len())?.copy_from_slice(src);
            return Ok(());
        }
        let Backing::File { file, base, size, .. } = self else { return Ok(()) };
        file_write(file, src, file_range(base, size, ns, offset, src.len())?)
    }

    /// Makes the file store's data durable on the host (`sync_data`); a
    /// no-op for the other stores. A failure is a Write Fault.
    pub(crate) fn sync(&mut self) -> Result<(), MediaError> {
        let Backing::File { file, .. } = self else { return Ok(()) };
        file.sync_data().map_err(|e| {
            tracing::warn!(error = %e, "nvme-emu: backing file sync_data failed");
            write_fault()
        })
    }

    /// Media -> host: copies namespace `ns` bytes from `offset` into the
    /// host segments (whose lengths add up to the transfer).
    pub(crate) fn read(
        &mut self,
        dma: &DmaView<'_>,
        ns: usize,
        offset: u64,
        segs: &[Segment],
    ) -> Result<(), MediaError> {
        if let Some(images) = self.ram() {
            let data = images.get(ns).ok_or_else(internal)?;
            for (iova, at, len) in pieces(segs, offset, usize::MAX) {
                let src = ram_range(data, at, len)?;
                // SAFETY: `src` is this store's RAM image, which the
                // controller frees or writes only after waiting for the
                // copies in flight (see `DmaView::write_from_media`).
                unsafe { dma.write_from_media(iova, src) }.map_err(|_| MediaError::Dma)?;
            }
            return Ok(());
        }
        let Backing::File { file, base, size, bounce } = self else { return Ok(()) };
        for (iova, at, len) in pieces(segs, offset, CHUNK) {
            let buf = &mut bounce[..len];
            file_read(file, buf, file_range(base, size, ns, at, len)?)?;
            dma.write(iova, buf).map_err(|_| MediaError::Dma)?;
        }
        Ok(())
    }

    /// Host -> media: copies the host segments into namespace `ns` at
    /// `offset`. With `deferred`, copies out of external memory into a RAM
    /// image may only be started (see `DmaView::read_into_media`): the
    /// caller must not read the written range before they end.
    pub(crate) fn write(
        &mut self,
        dma: &DmaView<'_>,
        ns: usize,
        offset: u64,
        segs: &[Segment],
        deferred: bool,
    ) -> Result<(), MediaError> {
        if let Some(images) = self.ram() {
            let data = images.get_mut(ns).ok_or_else(internal)?;
            for (iova, at, len) in pieces(segs, offset, usize::MAX) {
                let dst = ram_range_mut(data, at, len)?;
                let r = if deferred {
                    // SAFETY: as in `read`: the RAM image outlives the
                    // copies in flight, and the caller reads nothing of
                    // this range before they end.
                    unsafe { dma.read_into_media(iova, dst) }
                } else {
                    dma.read(iova, dst)
                };
                r.map_err(|_| MediaError::Dma)?;
            }
            return Ok(());
        }
        let Backing::File { file, base, size, bounce } = self else { return Ok(()) };
        for (iova, at, len) in pieces(segs, offset, CHUNK) {
            let buf = &mut bounce[..len];
            dma.read(iova, buf).map_err(|_| MediaError::Dma)?;
            file_write(file, buf, file_range(base, size, ns, at, len)?)?;
        }
        Ok(())
    }

    /// Sets `len` bytes of namespace `ns` at `offset` to zero (Write Zeroes,
    /// deallocation).
    pub(crate) fn zero(&mut self, ns: usize, offset: u64, len: u64) -> Result<(), MediaError> {
        if let Some(images) = self.ram() {
            let data = images.get_mut(ns).ok_or_else(internal)?;
            let len = usize::try_from(len).map_err(|_| internal())?;
            ram_range_mut(data, offset, len)?.fill(0);
            return Ok(());
        }
        let Backing::File { file, base, size, bounce } = self else { return Ok(()) };
        // The whole range first: nothing is written when it is not inside
        // the namespace.
        file_range(base, size, ns, offset, usize::try_from(len).map_err(|_| internal())?)?;
        bounce.fill(0);
        for (at, n) in spans(offset, len, CHUNK) {
            file_write(file, &bounce[..n], file_range(base, size, ns, at, n)?)?;
        }
        Ok(())
    }
}

/// The pieces of at most `max` bytes of a transfer between namespace
/// bytes from `offset` and the host segments `segs`, in order: (device
/// address, namespace byte offset, length). The one walk behind every
/// chunked copy of this store.
fn pieces(segs: &[Segment], offset: u64, max: usize) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
    let mut next = offset;
    segs.iter().flat_map(move |s| {
        let (iova, start, len) = (s.iova, next, u64::from(s.len));
        next = next.saturating_add(len);
        spans(start, len, max).map(move |(at, n)| (iova + (at - start), at, n))
    })
}

/// `offset..offset + len` in pieces of at most `max` bytes: (offset,
/// length).
fn spans(offset: u64, len: u64, max: usize) -> impl Iterator<Item = (u64, usize)> {
    let max64 = u64::try_from(max).unwrap_or(u64::MAX);
    (0..len).step_by(max).map(move |d| (offset.saturating_add(d), (len - d).min(max64) as usize))
}

/// Reads `buf` from the backing file at byte `at`; a failure is an
/// Unrecovered Read Error.
fn file_read(file: &File, buf: &mut [u8], at: u64) -> Result<(), MediaError> {
    file.read_exact_at(buf, at).map_err(|e| {
        tracing::warn!(error = %e, "nvme-emu: backing file read failed");
        read_error()
    })
}

/// Writes `buf` to the backing file at byte `at`; a failure is a Write
/// Fault.
fn file_write(file: &File, buf: &[u8], at: u64) -> Result<(), MediaError> {
    file.write_all_at(buf, at).map_err(|e| {
        tracing::warn!(error = %e, "nvme-emu: backing file write failed");
        write_fault()
    })
}

/// `len` bytes of a RAM image at `offset`, or an Internal Error when out
/// of range.
fn ram_range(data: &[u8], offset: u64, len: usize) -> Result<&[u8], MediaError> {
    let off = usize::try_from(offset).map_err(|_| internal())?;
    off.checked_add(len).and_then(|end| data.get(off..end)).ok_or_else(internal)
}

/// As [`ram_range`], writable.
fn ram_range_mut(data: &mut [u8], offset: u64, len: usize) -> Result<&mut [u8], MediaError> {
    let off = usize::try_from(offset).map_err(|_| internal())?;
    off.checked_add(len).and_then(|end| data.get_mut(off..end)).ok_or_else(internal)
}

/// File offset of namespace `ns`'s bytes `offset..offset + len`, or an
/// Internal Error when they are not inside the namespace.
fn file_range(base: &[u64], size: &[u64], ns: usize, offset: u64, len: usize) -> Result<u64, MediaError> {
    let (b, sz) = (*base.get(ns).ok_or_else(internal)?, *size.get(ns).ok_or_else(internal)?);
    match offset.checked_add(len as u64) {
        Some(end) if end <= sz => Ok(b + offset),
        _ => Err(internal()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_the_segments_and_split_them_at_the_chunk_size() {
        let segs = [
            Segment { iova: 0x1_0000_0000, len: 4096 },
            Segment { iova: 0x2_0000_0000, len: 100_000 },
            Segment { iova: 0x3_0000_0000, len: 10 },
        ];
        let got: Vec<_> = pieces(&segs, 512, CHUNK).collect();
        assert_eq!(
            got,
            [
                (0x1_0000_0000, 512, 4096),
                (0x2_0000_0000, 4608, CHUNK),
                (0x2_0000_0000 + CHUNK as u64, 4608 + CHUNK as u64, 100_000 - CHUNK),
                (0x3_0000_0000, 104_608, 10),
            ]
        );
        // Unbounded: one piece per segment.
        assert_eq!(pieces(&segs, 0, usize::MAX).count(), 3);
        assert_eq!(spans(10, 0, CHUNK).count(), 0);
        assert_eq!(
            spans(0, 2 * CHUNK as u64 + 1, CHUNK).map(|(_, n)| n).collect::<Vec<_>>(),
            [CHUNK, CHUNK, 1]
        );
    }
}
