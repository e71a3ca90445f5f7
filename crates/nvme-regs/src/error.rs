//! The decoding error of this crate.

/// Why a structure read from a device (or handed to a parser) was rejected.
///
/// Decoding never panics: every malformed length, string or field value is
/// reported through this type, with the offending value carried as a field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A buffer did not have the exact size of the structure it should hold.
    #[error("{what}: expected {expected} bytes, got {actual}")]
    WrongLength {
        /// The structure being parsed (e.g. `"Identify Controller"`).
        what: &'static str,
        /// Required length in bytes.
        expected: usize,
        /// Length of the buffer that was passed, in bytes.
        actual: usize,
    },
    /// A string field (e.g. Identify Controller SN/MN/FR) held non-ASCII bytes.
    #[error("{field}: not an ASCII string")]
    NotAscii {
        /// The field name as in the specification (e.g. `"SN"`).
        field: &'static str,
    },
    /// FLBAS selects an LBA format beyond NLBAF (NVM Command Set 1.0,
    /// 4.1.5.1, FLBAS / NLBAF).
    #[error("FLBAS selects LBA format {index}, but NLBAF (zero-based) is {nlbaf}")]
    LbaFormatIndex {
        /// Format index taken from FLBAS.
        index: u8,
        /// NLBAF as reported (zero-based: `nlbaf + 1` formats exist).
        nlbaf: u8,
    },
    /// LBADS of the selected LBA format is outside the range this crate
    /// accepts, 9..=16 (512 B to 64 KiB logical blocks). LBADS < 9 is not
    /// supported by the specification (NVM Command Set 1.0, 4.1.5.1, LBA Format data structure).
    #[error("LBADS {lbads} is not a supported logical block size (2^9..=2^16 bytes)")]
    LbaDataSize {
        /// The raw LBADS value (log2 of the block size in bytes).
        lbads: u8,
    },
    /// Any other field whose value is out of the range the specification or
    /// this crate allows.
    #[error("{field}: invalid value {value:#x}")]
    InvalidValue {
        /// Field name as in the specification.
        field: &'static str,
        /// The raw value.
        value: u64,
    },
}
