//! Deterministic block contents and their verification.
//!
//! A block written for `(hash, version)` is a sequence of 64-byte lines of
//! eight little-endian 8-byte words. Word `i` (line `l = i / 8`, lane
//! `j = i % 8`) holds
//!
//! ```text
//! key     = mix64(hash ^ mix64(version ^ KEY_SALT))
//! line(l) = mix64(key + (l + 1) * GOLDEN_GAMMA)      (wrapping arithmetic)
//! word(i) = line(l) ^ LANES[j]
//! ```
//!
//! where `mix64` is the SplitMix64 output function (Steele, Lea and Flood,
//! "Fast splittable pseudorandom number generators", OOPSLA 2014) and
//! `LANES` are eight distinct constants. A trailing partial word (length
//! not a multiple of 8) holds the first bytes of `word(len / 8)`. Any two
//! distinct `(hash, version)` pairs give unrelated line values, and within
//! a block every line and every word differs from its neighbours, so a
//! load that returns another block, bytes from another offset, or torn
//! data is detected; every byte is compared.
//!
//! One mix per line, one XOR per word: both directions run near memory
//! speed (about 3x the one-mix-per-word pattern this replaced).

/// Names this pattern; a block key's namespace includes it
/// ([`crate::blockkey`]), so blocks persisted under another pattern are
/// never verified against this one.
pub const PATTERN: &str = "splitmix64 lines v2";

/// SplitMix64 increment (2^64 / golden ratio, odd).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// Separates the version from the hash before mixing.
const KEY_SALT: u64 = 0xD1B5_4A32_D192_ED03;
/// Words per line.
const LANE_WORDS: usize = 8;
/// Bytes per line.
const LINE_BYTES: usize = LANE_WORDS * 8;
/// Per-lane constants: `mix64(1)` .. `mix64(8)`, distinct.
const LANES: [u64; LANE_WORDS] =
    [mix64(1), mix64(2), mix64(3), mix64(4), mix64(5), mix64(6), mix64(7), mix64(8)];

/// The SplitMix64 output mixer: a bijection on `u64` with good avalanche.
#[inline(always)]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[inline(always)]
const fn key(hash: u64, version: u64) -> u64 {
    mix64(hash ^ mix64(version ^ KEY_SALT))
}

#[inline(always)]
const fn line(key: u64, index: u64) -> u64 {
    mix64(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)))
}

/// Word `i` of the block with key `key`.
#[inline(always)]
const fn word(key: u64, i: u64) -> u64 {
    line(key, i / LANE_WORDS as u64) ^ LANES[(i % LANE_WORDS as u64) as usize]
}

/// The first byte of a block that differs from its expected pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("block content mismatch at byte {offset}: expected {expected:#04x}, found {actual:#04x}")]
pub struct Mismatch {
    /// Byte offset from the start of the block.
    pub offset: usize,
    /// The byte the pattern has there.
    pub expected: u8,
    /// The byte the buffer has there.
    pub actual: u8,
}

/// Fills `buf` with the pattern of block `hash` at `version` (any length).
pub fn fill_block(buf: &mut [u8], hash: u64, version: u64) {
    let k = key(hash, version);
    let mut lines = buf.chunks_exact_mut(LINE_BYTES);
    let mut l = 0u64;
    for c in &mut lines {
        let base = line(k, l);
        for (w, lane) in c.chunks_exact_mut(8).zip(LANES) {
            w.copy_from_slice(&(base ^ lane).to_le_bytes());
        }
        l += 1;
    }
    let tail = lines.into_remainder();
    let first = l * LANE_WORDS as u64;
    for (j, w) in tail.chunks_mut(8).enumerate() {
        let n = w.len();
        w.copy_from_slice(&word(k, first + j as u64).to_le_bytes()[..n]);
    }
}

/// Checks that `buf` holds the pattern of block `hash` at `version`;
/// reports the first differing byte otherwise.
pub fn verify_block(buf: &[u8], hash: u64, version: u64) -> Result<(), Mismatch> {
    let k = key(hash, version);
    let mut groups = buf.chunks_exact(GROUP_BYTES);
    let mut first = 0u64;
    for g in &mut groups {
        if !group_matches(g, k, first / LANE_WORDS as u64) {
            return first_mismatch(g, k, first);
        }
        first += (GROUP_BYTES / 8) as u64;
    }
    first_mismatch(groups.remainder(), k, first)
}

/// Bytes compared before a mismatch is looked for (whole lines).
const GROUP_BYTES: usize = 16 * LINE_BYTES;

/// Whether `g` (whole lines, from line `l`) holds the pattern of key `k`:
/// the XOR of every word with its expected value, ORed together, is zero.
#[inline(always)]
fn group_matches(g: &[u8], k: u64, l: u64) -> bool {
    let mut diff = 0u64;
    for (n, c) in g.chunks_exact(LINE_BYTES).enumerate() {
        let base = line(k, l + n as u64);
        for (w, lane) in c.chunks_exact(8).zip(LANES) {
            let mut a = [0u8; 8];
            a.copy_from_slice(w);
            diff |= u64::from_le_bytes(a) ^ base ^ lane;
        }
    }
    diff == 0
}

/// The first byte of `bytes` (which start at word `first` of the block
/// with key `key`) that differs from the pattern, if any.
fn first_mismatch(bytes: &[u8], key: u64, first: u64) -> Result<(), Mismatch> {
    for (j, w) in bytes.chunks(8).enumerate() {
        let i = first + j as u64;
        let want = word(key, i).to_le_bytes();
        if let Some(b) = (0..w.len()).find(|&b| w[b] != want[b]) {
            return Err(Mismatch { offset: i as usize * 8 + b, expected: want[b], actual: w[b] });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_various_lengths() {
        for len in [0usize, 1, 7, 8, 9, 15, 16, 4095, 4096, 4097, 65_536 + 3] {
            let mut b = vec![0u8; len];
            fill_block(&mut b, 42, 3);
            assert_eq!(verify_block(&b, 42, 3), Ok(()), "len {len}");
        }
    }

    #[test]
    fn prefix_consistency() {
        // A shorter buffer is a prefix of a longer one (tail handling).
        let mut long = vec![0u8; 100];
        fill_block(&mut long, 9, 1);
        for len in 0..100 {
            let mut short = vec![0u8; len];
            fill_block(&mut short, 9, 1);
            assert_eq!(&short[..], &long[..len]);
        }
    }

    #[test]
    fn every_single_flipped_byte_is_found() {
        let len = 4096 + 5;
        let mut b = vec![0u8; len];
        fill_block(&mut b, 0xABCD, 17);
        for off in 0..len {
            let orig = b[off];
            b[off] ^= 0x20;
            assert_eq!(
                verify_block(&b, 0xABCD, 17),
                Err(Mismatch { offset: off, expected: orig, actual: orig ^ 0x20 })
            );
            b[off] = orig;
        }
        assert_eq!(verify_block(&b, 0xABCD, 17), Ok(()));
    }

    #[test]
    fn other_hash_or_version_detected() {
        let mut b = vec![0u8; 4096];
        fill_block(&mut b, 5, 1);
        assert!(verify_block(&b, 6, 1).is_err());
        assert!(verify_block(&b, 5, 2).is_err());
        assert!(verify_block(&b, 5, 0).is_err());
        // Swapping hash and version gives a different stream too.
        fill_block(&mut b, 1, 5);
        assert!(verify_block(&b, 5, 1).is_err());
        // All-zero buffers (an unwritten block) are rejected.
        assert!(verify_block(&[0u8; 64], 0, 0).is_err());
        assert!(verify_block(&[0u8; 64], 0, 1).is_err());
    }

    #[test]
    fn bytes_from_another_offset_are_detected() {
        let mut b = vec![0u8; 3 * 4096];
        fill_block(&mut b, 77, 2);
        for shift in [1, 8, 64, 512, 4096] {
            assert!(verify_block(&b[shift..shift + 4096], 77, 2).is_err(), "shift {shift}");
        }
        // Every word of a line differs from the others.
        let mut lanes = LANES.to_vec();
        lanes.sort_unstable();
        lanes.dedup();
        assert_eq!(lanes.len(), LANE_WORDS);
        // A mismatch deep in a group is reported at its exact byte.
        let mut b = vec![0u8; GROUP_BYTES * 2 + 100];
        fill_block(&mut b, 1, 1);
        b[GROUP_BYTES + 777] ^= 1;
        assert_eq!(verify_block(&b, 1, 1).unwrap_err().offset, GROUP_BYTES + 777);
    }

    proptest! {
        #[test]
        fn flips_detected(hash: u64, version: u64, len in 1usize..2048, pos: prop::sample::Index, bit in 0u8..8) {
            let mut b = vec![0u8; len];
            fill_block(&mut b, hash, version);
            prop_assert!(verify_block(&b, hash, version).is_ok());
            let off = pos.index(len);
            b[off] ^= 1 << bit;
            let m = verify_block(&b, hash, version).unwrap_err();
            prop_assert_eq!(m.offset, off);
            prop_assert_eq!(m.actual ^ m.expected, 1 << bit);
        }

        #[test]
        fn distinct_keys_detected(h1: u64, v1: u64, h2: u64, v2: u64) {
            prop_assume!((h1, v1) != (h2, v2));
            let mut b = vec![0u8; 256];
            fill_block(&mut b, h1, v1);
            prop_assert!(verify_block(&b, h2, v2).is_err());
        }
    }
}
