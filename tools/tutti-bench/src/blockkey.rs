//! The tutti-kv keys of a replay's blocks, and the pattern each block is
//! saved with.
//!
//! A trace's hash id already names a whole prefix: in the Mooncake traces
//! (and the synthetic one) block `i`'s id is a hash of every token up to
//! the end of block `i`, so equal ids are equal prefixes. A block's key is
//! therefore not chained along the request; it is the 32-byte
//! [`ChunkKeys`] digest of one "chunk" holding the hash id (as two
//! little-endian u32 words, low first), under a namespace that names what
//! makes the same hash id mean other bytes:
//!
//! - the model's KV geometry (preset name, layers, KV heads, head
//!   dimension, bytes per element) and the tokens and bytes per block, so a
//!   persisted store of another geometry is never misread as this one;
//! - the trace (its file name, or the synthetic generator's seed), since
//!   hash ids are only meaningful within one trace.
//!
//! The namespace also names the content pattern ([`crate::pattern::PATTERN`]).
//! A block's contents are a function of its key alone: the
//! [`crate::pattern`] stream of `(hash id, first 8 bytes of the key as a
//! little-endian u64)`. A block saved again has the same bytes, and a
//! later run (which derives the same key) can verify what an earlier run
//! saved.

use tutti_kv::{ChunkKeys, Key, KeySize};

use crate::model::ModelGeometry;
use crate::pattern::PATTERN;

/// Version of the key derivation, hashed into every namespace.
const DERIVATION: &str = "tutti-bench replay block v1";

/// Derives the keys of one replay's blocks.
#[derive(Debug, Clone)]
pub struct BlockKeys {
    chunks: ChunkKeys,
    namespace: String,
}

impl BlockKeys {
    /// Keys for blocks of `block_tokens` tokens of `model`'s KV cache
    /// (`block_bytes` bytes each) from trace `trace` (a short name: the
    /// trace file's name, or `synthetic seed N`).
    pub fn new(model: &ModelGeometry, block_tokens: u32, block_bytes: u64, trace: &str) -> Self {
        let namespace = format!(
            "{DERIVATION}; pattern {PATTERN}; model {} layers {} kv_heads {} head_dim {} dtype_bytes {}; \
             block_tokens {block_tokens} block_bytes {block_bytes}; trace {trace}",
            model.name, model.layers, model.kv_heads, model.head_dim, model.dtype_bytes
        );
        Self { chunks: ChunkKeys::new(namespace.as_bytes(), KeySize::B32), namespace }
    }

    /// The namespace hashed into every key (human-readable).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The 32-byte key of the block with trace hash id `hash`.
    pub fn key(&self, hash: u64) -> Key {
        self.chunks.next(None, &[hash as u32, (hash >> 32) as u32])
    }
}

/// The pattern version of a block (the second argument of
/// [`crate::fill_block`] and [`crate::verify_block`]): the first 8 bytes
/// of its key, little endian. A function of the key alone.
pub fn pattern_version(key: &Key) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&key.as_bytes()[..8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;

    fn keys(model: &str, tokens: u32, trace: &str) -> BlockKeys {
        let m = preset(model).unwrap();
        BlockKeys::new(&m, tokens, m.block_bytes(tokens), trace)
    }

    #[test]
    fn a_key_depends_on_the_hash_the_geometry_and_the_trace() {
        let a = keys("qwen2.5-7b", 16, "synthetic seed 1");
        assert_eq!(a.key(7), keys("qwen2.5-7b", 16, "synthetic seed 1").key(7), "deterministic");
        assert_eq!(a.key(7).len(), 32);
        assert_ne!(a.key(7), a.key(8));
        assert_ne!(a.key(1), a.key(1 << 32), "both halves of the id count");
        for other in [
            keys("qwen2.5-7b", 32, "synthetic seed 1"),
            keys("llama-3.1-8b", 16, "synthetic seed 1"),
            // Same bytes per token as llama-3.1-8b: the name still differs.
            keys("mistral-7b", 16, "synthetic seed 1"),
            keys("qwen2.5-7b", 16, "synthetic seed 2"),
            keys("qwen2.5-7b", 16, "mooncake.jsonl"),
        ] {
            assert_ne!(a.key(7), other.key(7), "{}", other.namespace());
        }
        assert!(a.namespace().contains("block_bytes 917504"), "{}", a.namespace());
    }

    #[test]
    fn the_pattern_version_is_a_function_of_the_key() {
        let a = keys("qwen2.5-7b", 16, "t");
        assert_eq!(pattern_version(&a.key(3)), pattern_version(&a.key(3)));
        assert_ne!(pattern_version(&a.key(3)), pattern_version(&a.key(4)));
    }
}
