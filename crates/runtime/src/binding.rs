//! Resolver and DataPath: the two internal halves of a store, paired
//! through a checked [`Binding`].
//!
//! A Resolver turns the key part of a URI into a payload; a DataPath turns
//! byte requests inside that payload into NVMe commands. A store may join a
//! resolver and a datapath only when the payload one produces is the payload
//! the other consumes, by type and by version; the runtime checks that when
//! it is assembled and refuses the configuration otherwise.

use std::any::TypeId;
use std::fmt;

/// The payload contract between a Resolver and a DataPath.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    payload: TypeId,
    name: &'static str,
    version: u32,
}

impl Binding {
    /// The binding for payload type `T` at `version`.
    pub fn of<T: 'static>(version: u32) -> Self {
        Self { payload: TypeId::of::<T>(), name: std::any::type_name::<T>(), version }
    }
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

/// A byte range of a datapath's linear space: the payload of
/// [`Binding`] version [`EXTENT_V1`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Start, bytes.
    pub offset: u64,
    /// Length, bytes.
    pub len: u64,
}

/// Version of the [`Extent`] payload that `slab`, `local_nvme` and
/// `striped_local_nvme` speak.
pub const EXTENT_V1: u32 = 1;

/// Why a resolver refused a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The key is not a decimal slot number (`slab`).
    #[error("slab key {key:?} is not a slot number (want decimal digits, e.g. tutti://kv/42)")]
    NotASlotNumber {
        /// The key as given.
        key: String,
    },
    /// The slot number does not fit in 64 bits (`slab`).
    #[error("slot number {key:?} is too large")]
    SlotTooLarge {
        /// The key as given.
        key: String,
    },
    /// The slot lies past the end of the store (`slab`).
    #[error("slot {slot} is out of range: the store has {slots} slots (0..{slots})")]
    SlotOutOfRange {
        /// The slot asked for.
        slot: u64,
        /// Slots in the store.
        slots: u64,
    },
}

/// Turns URI keys into extents.
pub trait Resolver: Send + Sync + fmt::Debug {
    /// What it produces.
    fn binding(&self) -> Binding;
    /// The extent of `key` in a datapath space of `capacity` bytes.
    fn resolve(&self, key: &str, capacity: u64) -> Result<Extent, ResolveError>;
}
