//! DataPaths: byte requests in a linear space -> per-drive pieces, which the
//! runtime turns into NVMe commands on the drives' queue pairs.
//!
//! | datapath | layout |
//! | --- | --- |
//! | `local_nvme` ([`LocalNvme`]) | one namespace of one drive, identity |
//! | `striped_local_nvme` ([`StripedLocalNvme`]) | 2 to 4 drives, RAID-0 ([`stripe`]) |

pub mod stripe;

use std::fmt;
use std::sync::Arc;

use crate::binding::{Binding, Extent, EXTENT_V1};
use crate::drive::Drive;
pub use stripe::{Piece, StripeMap};

/// Requests in a linear byte space mapped onto drives.
pub(crate) trait DataPath: Send + Sync + fmt::Debug {
    /// Configured name.
    fn name(&self) -> &str;
    /// The payload it consumes.
    fn binding(&self) -> Binding;
    /// Size of the linear space, bytes.
    fn capacity(&self) -> u64;
    /// Alignment of offsets and lengths, bytes (the logical block size).
    fn block_size(&self) -> u32;
    /// The drives, in layout order.
    fn drives(&self) -> &[Arc<Drive>];
    /// Calls `f` for each per-drive piece of `len` bytes at `offset`.
    fn for_each_piece(&self, offset: u64, len: u64, f: &mut dyn FnMut(Piece));
    /// The drive when the layout is the identity on one drive (every
    /// request is one piece at the same offset): lets planning skip
    /// [`DataPath::for_each_piece`].
    fn single_drive(&self) -> Option<&Arc<Drive>> {
        None
    }
}

/// `local_nvme`: one namespace of one drive.
#[derive(Debug)]
pub(crate) struct LocalNvme {
    name: String,
    drive: [Arc<Drive>; 1],
}

impl LocalNvme {
    pub fn new(name: &str, drive: Arc<Drive>) -> Self {
        Self { name: name.to_owned(), drive: [drive] }
    }
}

impl DataPath for LocalNvme {
    fn name(&self) -> &str {
        &self.name
    }
    fn binding(&self) -> Binding {
        Binding::of::<Extent>(EXTENT_V1)
    }
    fn capacity(&self) -> u64 {
        self.drive[0].ns.capacity_bytes()
    }
    fn block_size(&self) -> u32 {
        self.drive[0].ns.block_size
    }
    fn drives(&self) -> &[Arc<Drive>] {
        &self.drive
    }
    fn for_each_piece(&self, offset: u64, len: u64, f: &mut dyn FnMut(Piece)) {
        f(Piece { drive: 0, drive_offset: offset, len, request_offset: 0 })
    }
    fn single_drive(&self) -> Option<&Arc<Drive>> {
        Some(&self.drive[0])
    }
}

/// `striped_local_nvme`: the same namespace of 2 to 4 drives, RAID-0.
#[derive(Debug)]
pub(crate) struct StripedLocalNvme {
    name: String,
    drives: Vec<Arc<Drive>>,
    map: StripeMap,
    capacity: u64,
    block_size: u32,
}

impl StripedLocalNvme {
    /// Returns `None` if `unit` is zero or `drives` is empty.
    pub fn new(name: &str, drives: Vec<Arc<Drive>>, unit: u64) -> Option<Self> {
        let map = StripeMap::new(unit, drives.len())?;
        let per_drive = drives.iter().map(|d| d.ns.capacity_bytes()).min()?;
        let block_size = drives.iter().map(|d| d.ns.block_size).max()?;
        Some(Self { name: name.to_owned(), capacity: map.capacity(per_drive), drives, map, block_size })
    }
}

impl DataPath for StripedLocalNvme {
    fn name(&self) -> &str {
        &self.name
    }
    fn binding(&self) -> Binding {
        Binding::of::<Extent>(EXTENT_V1)
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn drives(&self) -> &[Arc<Drive>] {
        &self.drives
    }
    fn for_each_piece(&self, offset: u64, len: u64, f: &mut dyn FnMut(Piece)) {
        self.map.for_each_piece(offset, len, f)
    }
}
