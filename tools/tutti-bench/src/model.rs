//! KV-cache geometry presets.
//!
//! The KV cache of a decoder-only transformer holds, per token and per
//! layer, one key and one value vector per key/value head:
//!
//! ```text
//! bytes_per_token = layers * 2 (K and V) * kv_heads * head_dim * dtype_bytes
//! block_bytes     = bytes_per_token * block_tokens
//! ```
//!
//! Source of the preset numbers: each model's `config.json` on Hugging Face
//! (`num_hidden_layers`, `num_key_value_heads`, and
//! `head_dim = hidden_size / num_attention_heads`), with bf16 elements
//! (2 bytes):
//!
//! | preset | HF repository | layers | KV heads | head dim | per token |
//! | --- | --- | --- | --- | --- | --- |
//! | `llama-3.1-8b` | meta-llama/Llama-3.1-8B | 32 | 8 | 4096/32 = 128 | 128 KiB |
//! | `llama-3.1-70b` | meta-llama/Llama-3.1-70B | 80 | 8 | 8192/64 = 128 | 320 KiB |
//! | `qwen2.5-7b` | Qwen/Qwen2.5-7B | 28 | 4 | 3584/28 = 128 | 56 KiB |
//! | `qwen2.5-0.5b` | Qwen/Qwen2.5-0.5B | 24 | 2 | 896/14 = 64 | 12 KiB |
//! | `mistral-7b` | mistralai/Mistral-7B-v0.1 | 32 | 8 | 4096/32 = 128 | 128 KiB |

use serde::Serialize;

/// The KV-cache shape of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ModelGeometry {
    /// Preset name (lower case, e.g. `llama-3.1-8b`).
    pub name: &'static str,
    /// Transformer layers (`num_hidden_layers`).
    pub layers: u32,
    /// Key/value heads per layer (`num_key_value_heads`; fewer than the
    /// attention heads under grouped-query attention).
    pub kv_heads: u32,
    /// Elements per head (`hidden_size / num_attention_heads`).
    pub head_dim: u32,
    /// Bytes per element (2 for bf16/fp16, 1 for fp8).
    pub dtype_bytes: u32,
}

impl ModelGeometry {
    /// KV-cache bytes for one token: `layers * 2 * kv_heads * head_dim * dtype_bytes`.
    pub const fn bytes_per_token(&self) -> u64 {
        self.layers as u64 * 2 * self.kv_heads as u64 * self.head_dim as u64 * self.dtype_bytes as u64
    }

    /// KV-cache bytes for one block of `block_tokens` tokens.
    pub const fn block_bytes(&self, block_tokens: u32) -> u64 {
        self.bytes_per_token() * block_tokens as u64
    }
}

/// All presets, in the order they are listed in help text.
pub const PRESETS: &[ModelGeometry] = &[
    ModelGeometry { name: "llama-3.1-8b", layers: 32, kv_heads: 8, head_dim: 128, dtype_bytes: 2 },
    ModelGeometry { name: "llama-3.1-70b", layers: 80, kv_heads: 8, head_dim: 128, dtype_bytes: 2 },
    ModelGeometry { name: "qwen2.5-7b", layers: 28, kv_heads: 4, head_dim: 128, dtype_bytes: 2 },
    ModelGeometry { name: "qwen2.5-0.5b", layers: 24, kv_heads: 2, head_dim: 64, dtype_bytes: 2 },
    ModelGeometry { name: "mistral-7b", layers: 32, kv_heads: 8, head_dim: 128, dtype_bytes: 2 },
];

/// Looks a preset up by name (ASCII case-insensitive), e.g. `"llama-3.1-8b"`.
pub fn preset(name: &str) -> Option<ModelGeometry> {
    PRESETS.iter().find(|p| p.name.eq_ignore_ascii_case(name)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    #[test]
    fn per_token_bytes() {
        let per_token = |n| preset(n).unwrap().bytes_per_token();
        assert_eq!(per_token("llama-3.1-8b"), 128 * KIB);
        assert_eq!(per_token("llama-3.1-70b"), 320 * KIB);
        assert_eq!(per_token("qwen2.5-7b"), 56 * KIB);
        assert_eq!(per_token("qwen2.5-0.5b"), 12 * KIB);
        assert_eq!(per_token("mistral-7b"), 128 * KIB);
    }

    #[test]
    fn block_bytes_512_tokens() {
        assert_eq!(preset("llama-3.1-8b").unwrap().block_bytes(512), 64 * MIB);
        assert_eq!(preset("qwen2.5-7b").unwrap().block_bytes(512), 28 * MIB);
        assert_eq!(preset("llama-3.1-70b").unwrap().block_bytes(512), 160 * MIB);
        assert_eq!(preset("qwen2.5-0.5b").unwrap().block_bytes(512), 6 * MIB);
    }

    #[test]
    fn lookup() {
        assert_eq!(preset("Llama-3.1-8B").unwrap().name, "llama-3.1-8b");
        assert!(preset("gpt-5").is_none());
        for p in PRESETS {
            assert_eq!(preset(p.name), Some(*p));
        }
    }
}
