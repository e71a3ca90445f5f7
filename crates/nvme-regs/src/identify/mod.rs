//! Identify data structures, 4096 bytes each: Identify Controller (NVMe Base
//! 2.0, 5.17.2.1; Base 1.4, 5.15), Identify Namespace for
//! the NVM command set (NVM Command Set 1.0, 4.1.5.1; Base 1.4,
//! 5.15.2.1) and the Active Namespace ID list (Base 2.0, 5.17.2.2).
//!
//! The structures have alignment 1 (multi-byte fields are
//! [`zerocopy::little_endian`] integers or byte arrays), so
//! [`IdentifyController::parse`] and [`IdentifyNamespace::parse`] accept any
//! 4096-byte slice. Fields not broken out are kept as reserved byte arrays at
//! their spec offsets; the accessors are the supported interface.

use crate::error::DecodeError;

/// Size of every Identify data structure in bytes.
pub const IDENTIFY_SIZE: usize = 4096;

/// Decodes an ASCII string field: trailing spaces and NULs are trimmed;
/// any non-ASCII byte is an error.
fn ascii_field<'a>(bytes: &'a [u8], field: &'static str) -> Result<&'a str, DecodeError> {
    let mut end = bytes.len();
    while end > 0 && matches!(bytes[end - 1], b' ' | 0) {
        end -= 1;
    }
    let bytes = &bytes[..end];
    if !bytes.is_ascii() {
        return Err(DecodeError::NotAscii { field });
    }
    core::str::from_utf8(bytes).map_err(|_| DecodeError::NotAscii { field })
}

/// Encodes an ASCII string field: space padded, truncated to the field
/// width, non-ASCII bytes replaced by `?` so the field always decodes.
fn set_ascii_field(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    for (d, &b) in dst.iter_mut().zip(s.as_bytes()) {
        *d = if b.is_ascii() { b } else { b'?' };
    }
}

fn check_len(what: &'static str, expected: usize, bytes: &[u8]) -> Result<(), DecodeError> {
    if bytes.len() == expected {
        Ok(())
    } else {
        Err(DecodeError::WrongLength { what, expected, actual: bytes.len() })
    }
}
mod controller;
mod namespace;

pub use controller::{oncs_bits, IdentifyController};
pub use namespace::{metadata_bits, IdentifyNamespace, LbaFormat};

/// Parses an Active Namespace ID list (CNS 02h; NVMe Base 2.0, 5.17.2.2):
/// 1024 little-endian NSIDs in ascending order, ending at the first 0.
/// [`DecodeError::WrongLength`] unless `bytes.len() == 4096`.
pub fn parse_active_namespace_list(bytes: &[u8]) -> Result<impl Iterator<Item = u32> + '_, DecodeError> {
    check_len("Active Namespace ID list", IDENTIFY_SIZE, bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&nsid| nsid != 0))
}

#[cfg(test)]
mod tests;
