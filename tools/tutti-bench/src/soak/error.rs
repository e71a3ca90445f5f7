//! Why a cell could not run to its verdict (as opposed to a verdict of
//! wrong bytes or unexpected statuses, which [`super::verify::Tally`]
//! collects).

/// A cell that stopped before its verdict.
#[derive(Debug, thiserror::Error)]
pub enum CellError {
    /// The generated configuration was refused.
    #[error("configuration refused")]
    Config(#[from] tutti::config::ConfigError),
    /// The runtime refused or failed (starting the drives, a handle).
    #[error("runtime")]
    Runtime(#[from] tutti::Error),
    /// The store refused a call as a whole.
    #[error("tutti-kv")]
    Kv(#[from] tutti_kv::KvError),
    /// A GPU allocation or copy failed.
    #[error("GPU memory")]
    Gpu(#[from] gpu_io::GpuError),
    /// The host could not allocate a buffer.
    #[error("cannot allocate {bytes} bytes of host memory")]
    Alloc {
        /// Bytes asked for.
        bytes: usize,
    },
    /// The object a fault is aimed at is not where the layout puts it.
    #[error("key {key}'s object is not on the media where the store's layout puts it (slot {slot})")]
    NotFound {
        /// The key's number.
        key: u64,
        /// The slot it was expected in.
        slot: u64,
    },
    /// Reading a drive's media directly failed.
    #[error("reading drive {drive:?}'s media directly failed: {reason}")]
    Media {
        /// The drive.
        drive: String,
        /// The emulator's error.
        reason: String,
    },
    /// A key of a length the store does not take (never, with the
    /// 32-byte keys made here).
    #[error("key")]
    Key(#[from] tutti_kv::KeyLengthError),
    /// The cell's worker thread could not be started.
    #[error("cannot start the cell's worker thread")]
    Spawn(#[source] std::io::Error),
    /// A cell's worker thread panicked (a bug in the soak or below).
    #[error("the cell's worker panicked: {0}")]
    Panicked(String),
}
