//! The field codec of the protocol: little-endian integers, bounded
//! strings and lists. Decoding is total: every input is either a value or
//! a [`DecodeError`] naming the field, never a panic. The encoding is
//! canonical (one byte string per value), so a decoded message re-encodes
//! to exactly the bytes it came from.

use crate::error::DecodeError;

/// Longest string field in bytes (drive names, refusal details).
pub const MAX_STRING: usize = 256;

/// Most elements of one list field (status report rows).
pub const MAX_LIST: usize = 1024;

/// Appends fields to a payload.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty payload.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    /// A bool as 0 or 1.
    pub fn bool(&mut self, v: bool) {
        self.buf.push(u8::from(v));
    }

    /// Little-endian u16.
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Little-endian u32.
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Little-endian u64.
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A string: u16 length, then UTF-8 bytes; cut at [`MAX_STRING`] bytes
    /// (on a character boundary) so it always decodes.
    pub fn str(&mut self, s: &str) {
        let mut end = s.len().min(MAX_STRING);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.buf.extend_from_slice(&s.as_bytes()[..end]);
    }

    /// A list length (u16); the caller writes at most [`MAX_LIST`] items.
    pub fn len(&mut self, n: usize) {
        self.u16(n.min(MAX_LIST) as u16);
    }
}

/// Reads fields from a payload, front to back.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(DecodeError::Truncated { field, offset: self.pos });
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let s = self.take(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// One byte.
    pub fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    /// A bool: exactly 0 or 1.
    pub fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::BadValue { field, value: u64::from(v) }),
        }
    }

    /// Little-endian u16.
    pub fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    /// Little-endian u32.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    /// Little-endian u64.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A string of at most [`MAX_STRING`] bytes of valid UTF-8.
    pub fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let n = usize::from(self.u16(field)?);
        if n > MAX_STRING {
            return Err(DecodeError::TooLong { field, len: n, max: MAX_STRING });
        }
        let bytes = self.take(n, field)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| DecodeError::NotUtf8 { field })
    }

    /// A list length of at most [`MAX_LIST`].
    pub fn len(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let n = usize::from(self.u16(field)?);
        if n > MAX_LIST {
            return Err(DecodeError::TooLong { field, len: n, max: MAX_LIST });
        }
        Ok(n)
    }

    /// Fails unless every byte was read (a canonical payload has no tail).
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes { extra: self.buf.len() - self.pos })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let mut w = Writer::new();
        w.u8(7);
        w.bool(true);
        w.u16(0xBEEF);
        w.u32(0xDEAD_BEEF);
        w.u64(u64::MAX - 1);
        w.str("d0");
        let b = w.into_bytes();
        let mut r = Reader::new(&b);
        assert_eq!(r.u8("a").unwrap(), 7);
        assert!(r.bool("b").unwrap());
        assert_eq!(r.u16("c").unwrap(), 0xBEEF);
        assert_eq!(r.u32("d").unwrap(), 0xDEAD_BEEF);
        assert_eq!(r.u64("e").unwrap(), u64::MAX - 1);
        assert_eq!(r.string("f").unwrap(), "d0");
        r.finish().unwrap();
        assert_eq!(r.u8("g"), Err(DecodeError::Truncated { field: "g", offset: b.len() }));
        assert_eq!(Reader::new(&[2]).bool("x"), Err(DecodeError::BadValue { field: "x", value: 2 }));
        assert_eq!(Reader::new(&[1, 0, 0xFF]).string("s"), Err(DecodeError::NotUtf8 { field: "s" }));
        let long = "é".repeat(200);
        let mut w = Writer::new();
        w.str(&long);
        let b = w.into_bytes();
        assert!(Reader::new(&b).string("s").unwrap().len() <= MAX_STRING);
    }
}
