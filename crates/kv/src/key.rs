//! Keys: fixed-size digests chosen by the caller, and the chained chunk
//! keys a serving engine derives from token ids.

use std::fmt;

/// The key size of a store, fixed when it is formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KeySize {
    /// 16-byte keys (128-bit digests).
    B16,
    /// 32-byte keys (256-bit digests).
    #[default]
    B32,
}

impl KeySize {
    /// Bytes per key.
    pub fn bytes(self) -> usize {
        match self {
            KeySize::B16 => 16,
            KeySize::B32 => 32,
        }
    }

    /// The size for `n` bytes, if it is one.
    pub fn from_bytes(n: usize) -> Option<Self> {
        match n {
            16 => Some(KeySize::B16),
            32 => Some(KeySize::B32),
            _ => None,
        }
    }
}

/// A key: 16 or 32 bytes, typically a digest (see [`ChunkKeys`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    bytes: [u8; 32],
    len: u8,
}

/// A key of another length than 16 or 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a key is 16 or 32 bytes, not {0}")]
pub struct KeyLengthError(pub usize);

impl Key {
    /// A key from its bytes (16 or 32 of them).
    pub fn new(bytes: &[u8]) -> Result<Self, KeyLengthError> {
        KeySize::from_bytes(bytes.len()).ok_or(KeyLengthError(bytes.len()))?;
        let mut b = [0u8; 32];
        b[..bytes.len()].copy_from_slice(bytes);
        Ok(Self { bytes: b, len: bytes.len() as u8 })
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Its length, bytes (16 or 32).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Its size.
    pub fn size(&self) -> KeySize {
        if self.len == 16 {
            KeySize::B16
        } else {
            KeySize::B32
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Chained chunk keys: a token sequence cut into chunks, chunk `i`'s key
/// being `BLAKE3(key[i-1] || token ids of chunk i)` (token ids as
/// little-endian u32), truncated to the key size, with a namespace (the
/// model, its KV layout, the engine's version: anything that makes the
/// same tokens produce other KV bytes) hashed into the first key. So the
/// key of chunk `i` names the whole prefix up to and including chunk `i`,
/// and two conversations share keys exactly as long as they share tokens.
#[derive(Debug, Clone)]
pub struct ChunkKeys {
    size: KeySize,
    root: [u8; 32],
}

impl ChunkKeys {
    /// Keys of `size` bytes for KV produced under `namespace`.
    pub fn new(namespace: &[u8], size: KeySize) -> Self {
        let mut h = blake3::Hasher::new_derive_key("tutti-kv chunk key v1");
        h.update(namespace);
        Self { size, root: *h.finalize().as_bytes() }
    }

    /// The key after `prev` (the key of the previous chunk, `None` for the
    /// first chunk) of a chunk holding `tokens`.
    pub fn next(&self, prev: Option<&Key>, tokens: &[u32]) -> Key {
        let mut h = blake3::Hasher::new();
        match prev {
            Some(k) => h.update(k.as_bytes()),
            None => h.update(&self.root),
        };
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        let digest = h.finalize();
        let mut b = [0u8; 32];
        b.copy_from_slice(digest.as_bytes());
        Key { bytes: b, len: self.size.bytes() as u8 }.truncated()
    }

    /// The keys of every whole chunk of `chunk_tokens` tokens in `tokens`
    /// (a trailing partial chunk has no key). `chunk_tokens` of 0 gives no
    /// keys.
    pub fn chain(&self, tokens: &[u32], chunk_tokens: usize) -> Vec<Key> {
        if chunk_tokens == 0 {
            return Vec::new();
        }
        let mut keys: Vec<Key> = Vec::with_capacity(tokens.len() / chunk_tokens);
        for chunk in tokens.chunks_exact(chunk_tokens) {
            let k = self.next(keys.last(), chunk);
            keys.push(k);
        }
        keys
    }
}

impl Key {
    fn truncated(mut self) -> Self {
        self.bytes[usize::from(self.len)..].fill(0);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_16_or_32_bytes() {
        assert_eq!(Key::new(&[1; 16]).unwrap().len(), 16);
        assert_eq!(Key::new(&[1; 32]).unwrap().size(), KeySize::B32);
        assert_eq!(Key::new(&[1; 20]), Err(KeyLengthError(20)));
        assert_ne!(Key::new(&[0; 16]).unwrap(), Key::new(&[0; 32]).unwrap());
    }

    #[test]
    fn chained_keys_name_whole_prefixes() {
        let ck = ChunkKeys::new(b"llama-3-8b bf16", KeySize::B16);
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 999; // differs in chunk 2 of 16 tokens
        let (ka, kb) = (ck.chain(&a, 16), ck.chain(&b, 16));
        assert_eq!(ka.len(), 4);
        assert_eq!(ka[..2], kb[..2]);
        assert!(ka[2..].iter().zip(&kb[2..]).all(|(x, y)| x != y), "a changed chunk changes every later key");
        assert_eq!(ck.chain(&a[..40], 16).len(), 2, "a partial chunk has no key");
        let other = ChunkKeys::new(b"qwen", KeySize::B16);
        assert_ne!(other.chain(&a, 16)[0], ka[0], "the namespace changes the keys");
        assert!(ka.iter().all(|k| k.len() == 16));
        // The same chunk after another prefix is another key.
        assert_ne!(ck.next(Some(&ka[0]), &a[..16]), ka[0]);
    }
}
