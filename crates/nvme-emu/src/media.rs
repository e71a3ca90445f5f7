//! The media: the backing store, the write cache in front of it, and
//! whether the power has failed. The controller thread and the
//! [`crate::Emulator`] handle share it behind one lock (`Shared::media`);
//! the thread holds it for a whole poll iteration, so the data path takes
//! one uncontended lock per iteration, not per command.
//!
//! Offsets and lengths are bytes unless named blocks (`slba`, `nlb`:
//! logical blocks). `ns` is a namespace index (NSID - 1).

use nvme_regs::status::generic;
use nvme_regs::Status;

use crate::backing::{Backing, MediaError};
use crate::cache::WriteCache;
use crate::config::{EmulatorConfig, NamespaceSpec};
use crate::dma::DmaView;
use crate::external::{HostPin, PageLocker};
use crate::prp::Segment;
use crate::EmuError;

/// What a power failure ([`crate::Emulator::power_fail`],
/// [`crate::FaultAction::PowerFail`]) did with the write cache's
/// non-durable logical blocks. All zero without a write cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PowerFailReport {
    /// Non-durable logical blocks whose new contents survived.
    pub kept_blocks: u64,
    /// Non-durable logical blocks that went back to their last durable
    /// contents.
    pub lost_blocks: u64,
    /// Lost blocks whose last durable contents could not be written back
    /// to the file store (an I/O error, logged); they hold the new
    /// contents. Always 0 for RAM stores.
    pub restore_errors: u64,
}

/// Why [`crate::Emulator::read_media`] or
/// [`crate::Emulator::write_media`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MediaAccessError {
    /// The controller has no such namespace.
    #[error("no namespace {nsid} (the controller has NSIDs 1..={namespaces})")]
    NoNamespace {
        /// The NSID asked for.
        nsid: u32,
        /// How many namespaces the controller has.
        namespaces: usize,
    },
    /// The byte range is not inside the namespace.
    #[error("bytes {offset}..+{len} are outside namespace {nsid} ({size} bytes)")]
    OutOfRange {
        /// The NSID.
        nsid: u32,
        /// First byte asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The namespace's size in bytes.
        size: u64,
    },
    /// The power failed: the backing store has been released.
    #[error("the emulator has lost power and released its backing store")]
    PoweredOff,
    /// The null store holds no data.
    #[error("the null backing store holds no data")]
    NullBacking,
    /// The file store's read or write failed (the I/O error is logged).
    #[error("backing store access failed: {status}")]
    Store {
        /// The status a command would have completed with.
        status: Status,
    },
}

impl From<MediaError> for MediaAccessError {
    fn from(e: MediaError) -> Self {
        match e {
            MediaError::Status(status) => MediaAccessError::Store { status },
            // No host memory is involved in direct access.
            MediaError::Dma => MediaAccessError::Store { status: Status::generic(generic::INTERNAL_ERROR) },
        }
    }
}

/// The backing store and the write cache in front of it.
#[derive(Debug)]
pub(crate) struct Media {
    /// Page-locks of the RAM images, one slot per image (`None`: not
    /// locked). Declared before `backing` so that they are released
    /// before the images.
    pins: Vec<Option<Box<dyn HostPin>>>,
    backing: Backing,
    cache: Option<WriteCache>,
    namespaces: Vec<NamespaceSpec>,
    /// `Some` once the power has failed: the backing was released.
    report: Option<PowerFailReport>,
}

impl Media {
    /// Opens (or creates) the backing store for `config`.
    pub(crate) fn new(config: &EmulatorConfig) -> Result<Self, EmuError> {
        Ok(Self {
            pins: Vec::new(),
            backing: Backing::new(config)?,
            cache: config.write_cache.map(|spec| WriteCache::new(spec, &config.namespaces)),
            namespaces: config.namespaces.clone(),
            report: None,
        })
    }

    /// Page-locks the RAM images not yet locked, through `locker`, and
    /// returns how many images are locked. An image the locker refuses
    /// stays pageable (copies still work, more slowly). Nothing to do for
    /// the file and null stores.
    pub(crate) fn lock_pages(&mut self, locker: &dyn PageLocker) -> usize {
        let ranges = self.backing.ram_ranges();
        self.pins.resize_with(ranges.len(), || None);
        for ((ptr, len), slot) in ranges.into_iter().zip(self.pins.iter_mut()) {
            if slot.is_none() {
                // SAFETY: the image stays allocated while `self.backing`
                // holds it, and `pins` is cleared before `backing` is
                // released (power loss) or dropped (field order).
                *slot = unsafe { locker.lock(ptr, len) };
            }
        }
        self.pins.iter().filter(|p| p.is_some()).count()
    }

    /// True for the null store: no data moves, PRPs are not walked.
    pub(crate) fn is_null(&self) -> bool {
        self.backing.is_null()
    }

    fn block(&self, ns: usize) -> u64 {
        self.namespaces.get(ns).map_or(512, |n| u64::from(n.block_size))
    }

    /// Read: media -> host segments, blocks `slba..` of namespace `ns`.
    pub(crate) fn read(
        &mut self,
        dma: &DmaView<'_>,
        ns: usize,
        slba: u64,
        segs: &[Segment],
    ) -> Result<(), MediaError> {
        let offset = slba * self.block(ns);
        self.backing.read(dma, ns, offset, segs)
    }

    /// Write: host segments -> blocks `slba..slba + nlb` of namespace
    /// `ns`, through the write cache when there is one (`fua`: durable at
    /// completion).
    pub(crate) fn write(
        &mut self,
        dma: &DmaView<'_>,
        ns: usize,
        (slba, nlb): (u64, u64),
        segs: &[Segment],
        fua: bool,
    ) -> Result<(), MediaError> {
        let offset = slba * self.block(ns);
        if let Some(c) = &mut self.cache {
            c.before_write(&mut self.backing, ns, slba, nlb)?;
        }
        // Without a write cache nothing reads the new contents before the
        // command completes, so copies out of GPU memory may run on.
        self.backing.write(dma, ns, offset, segs, self.cache.is_none())?;
        match &mut self.cache {
            Some(c) => c.after_write(&mut self.backing, ns, slba, nlb, fua),
            None => Ok(()),
        }
    }

    /// Write Zeroes or deallocation of blocks `slba..slba + nlb`: zeroed
    /// and durable at completion.
    pub(crate) fn zero(&mut self, ns: usize, slba: u64, nlb: u64) -> Result<(), MediaError> {
        let bs = self.block(ns);
        self.backing.zero(ns, slba * bs, nlb * bs)?;
        if let Some(c) = &mut self.cache {
            c.make_durable(ns, slba, nlb);
        }
        Ok(())
    }

    /// Flush of namespace `ns` or all (`None`). Without a write cache a
    /// no-op (every completed write is durable already).
    pub(crate) fn flush(&mut self, ns: Option<usize>) -> Result<(), MediaError> {
        match &mut self.cache {
            Some(c) => c.flush(&mut self.backing, ns),
            None => Ok(()),
        }
    }

    /// WCE, or `None` without a write cache.
    pub(crate) fn wce(&self) -> Option<bool> {
        self.cache.as_ref().map(WriteCache::enabled)
    }

    /// Sets WCE (disabling flushes first); `Ok(false)` without a write
    /// cache (nothing to set).
    pub(crate) fn set_wce(&mut self, on: bool) -> Result<bool, MediaError> {
        match &mut self.cache {
            Some(c) => c.set_enabled(&mut self.backing, on).map(|()| true),
            None => Ok(false),
        }
    }

    /// The power fails: every non-durable block is kept or lost (see
    /// [`WriteCache::power_loss`]), then the backing store is released (a
    /// RAM disk goes back to its registry, a file is closed). Only the first
    /// call acts; later ones return its report.
    pub(crate) fn power_loss(&mut self) -> PowerFailReport {
        if let Some(r) = self.report {
            return r;
        }
        let r = match &mut self.cache {
            Some(c) => c.power_loss(&mut self.backing),
            None => PowerFailReport::default(),
        };
        self.pins.clear();
        self.backing = Backing::Null;
        self.report = Some(r);
        r
    }

    /// The report of the power failure, if the power has failed.
    pub(crate) fn power_report(&self) -> Option<PowerFailReport> {
        self.report
    }

    /// Namespace index of `nsid`, after checking `offset..offset + len`
    /// lies inside it and that there is a store to access.
    fn direct_range(&self, nsid: u32, offset: u64, len: usize) -> Result<usize, MediaAccessError> {
        if self.report.is_some() {
            return Err(MediaAccessError::PoweredOff);
        }
        let namespaces = self.namespaces.len();
        let ns = (nsid as usize)
            .checked_sub(1)
            .filter(|&i| i < namespaces)
            .ok_or(MediaAccessError::NoNamespace { nsid, namespaces })?;
        let size = self.namespaces[ns].bytes().unwrap_or(0);
        let len = len as u64;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(MediaAccessError::OutOfRange { nsid, offset, len, size });
        }
        if self.backing.is_null() {
            return Err(MediaAccessError::NullBacking);
        }
        Ok(ns)
    }

    /// What the media holds at namespace `nsid`'s bytes `offset..`: for a
    /// block in the write cache, its last durable contents.
    pub(crate) fn read_direct(
        &mut self,
        nsid: u32,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), MediaAccessError> {
        let ns = self.direct_range(nsid, offset, dst.len())?;
        self.backing.read_at(ns, offset, dst)?;
        let bs = self.block(ns);
        let Some(c) = self.cache.as_mut().filter(|c| c.has_dirty(ns)) else { return Ok(()) };
        for_blocks(offset, dst.len(), bs, |lba, in_block, pos, n| {
            if let Some(old) = c.undo_mut(ns, lba) {
                dst[pos..pos + n].copy_from_slice(&old[in_block..in_block + n]);
            }
            Ok(())
        })
    }

    /// Writes `src` to the media at namespace `nsid`'s bytes `offset..`,
    /// durable at once: for a block in the write cache, into its last
    /// durable contents (the cached contents stay, and win if the block is
    /// destaged or kept at a power failure).
    pub(crate) fn write_direct(
        &mut self,
        nsid: u32,
        offset: u64,
        src: &[u8],
    ) -> Result<(), MediaAccessError> {
        let ns = self.direct_range(nsid, offset, src.len())?;
        let bs = self.block(ns);
        let (backing, cache) = (&mut self.backing, &mut self.cache);
        let Some(c) = cache.as_mut().filter(|c| c.has_dirty(ns)) else {
            return Ok(backing.write_at(ns, offset, src)?);
        };
        for_blocks(offset, src.len(), bs, |lba, in_block, pos, n| {
            let piece = &src[pos..pos + n];
            match c.undo_mut(ns, lba) {
                Some(old) => old[in_block..in_block + n].copy_from_slice(piece),
                None => backing.write_at(ns, offset + pos as u64, piece)?,
            }
            Ok(())
        })
    }
}

/// Calls `f(lba, byte offset in the block, byte offset in the buffer,
/// bytes)` for each logical block piece of `offset..offset + len`.
fn for_blocks(
    offset: u64,
    len: usize,
    block: u64,
    mut f: impl FnMut(u64, usize, usize, usize) -> Result<(), MediaError>,
) -> Result<(), MediaAccessError> {
    let mut pos = 0usize;
    while pos < len {
        let at = offset + pos as u64;
        let in_block = (at % block) as usize;
        let n = (block as usize - in_block).min(len - pos);
        f(at / block, in_block, pos, n)?;
        pos += n;
    }
    Ok(())
}
