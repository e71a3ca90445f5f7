//! A CPU model of `kernels/tutti_crc32c.cu`, step for step (tables, lanes,
//! rotation, shuffle trees, chunk combination, head and tail), so that the
//! kernel's math is checked against the `crc32c` crate without a GPU.

use crate::crc32c::tasks::{item_tasks, CRC32C_CHUNK_BYTES, WORD_BYTES};

const POLY: u32 = 0x82F6_3B78;
const LANES: usize = 32;
const CHUNK_WORDS: usize = (CRC32C_CHUNK_BYTES / WORD_BYTES) as usize;
const LOG2_CHUNK_BITS: u32 = 16;
/// The kernel's kTableJ and the group indices into it.
const TABLE_J: [u64; 36] = [
    0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15, 28, 29, 30, 31, 60, 61, 62, 63, 124, 125, 126, 127, 248, 249,
    250, 251, 252, 253, 254, 255, 8188, 8189, 8190, 8191,
];
const PLAIN: usize = 0;
const PADDED: usize = 24;
const SCHUNK: usize = 32;
const TREE: [usize; 5] = [4, 8, 12, 16, 20];

pub(crate) fn multmodp(a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    for i in (0..32).rev() {
        if a & (1 << i) != 0 {
            p ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// x^(2^k) mod P for k = 0..31 (the kernel's kX2n, plus k = 31).
pub(crate) fn x2n() -> [u32; 32] {
    let mut t = [0u32; 32];
    t[0] = 1 << 30;
    for k in 1..32 {
        t[k] = multmodp(t[k - 1], t[k - 1]);
    }
    t
}

fn x8nmodp(mut n: u64) -> u32 {
    let t = x2n();
    let (mut p, mut k) = (1u32 << 31, 3usize);
    while n != 0 {
        if n & 1 != 0 {
            p = multmodp(t[k], p);
        }
        n >>= 1;
        k = if k == 30 { 0 } else { k + 1 };
    }
    p
}

pub(crate) struct Tables(Vec<[u32; 256]>);

pub(crate) fn tables() -> Tables {
    let mut tab = vec![[0u32; 256]; TABLE_J.len()];
    for (table, &j) in tab.iter_mut().zip(TABLE_J.iter()) {
        let op = x8nmodp(j);
        let basis: Vec<u32> = (0..8)
            .map(|i| {
                let mut c = 1u32 << i;
                for _ in 0..8 {
                    c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
                }
                multmodp(op, c)
            })
            .collect();
        for (b, entry) in table.iter_mut().enumerate() {
            *entry = (0..8).filter(|i| b & (1 << i) != 0).fold(0, |v, i| v ^ basis[i]);
        }
    }
    Tables(tab)
}

impl Tables {
    fn shift4(&self, g: usize, c: u32) -> u32 {
        let t = &self.0;
        t[g + 3][(c & 0xff) as usize]
            ^ t[g + 2][((c >> 8) & 0xff) as usize]
            ^ t[g + 1][((c >> 16) & 0xff) as usize]
            ^ t[g][(c >> 24) as usize]
    }

    fn fold(&self, base: usize, c: u32, w: u64) -> u32 {
        let lo = (w as u32) ^ c;
        let hi = (w >> 32) as u32;
        self.shift4(base + 4, lo) ^ self.shift4(base, hi)
    }
}

/// `chunk_crc`: the 32 lanes, the rotation and the shuffle tree.
fn chunk_crc(tab: &Tables, words: &[u64]) -> u32 {
    let nw = words.len();
    let mut c: Vec<u32> = (0..LANES)
        .map(|lane| {
            let mine = nw / LANES + usize::from(lane < nw % LANES);
            let mut s = 0;
            for r in 0..mine {
                let base = if r + 1 < mine { PADDED } else { PLAIN };
                s = tab.fold(base, s, words[r * LANES + lane]);
            }
            s
        })
        .collect();
    c = (0..LANES).map(|u| c[(u + nw % LANES) % LANES]).collect();
    for (k, &g) in TREE.iter().enumerate() {
        // __shfl_down_sync: a lane whose source is past 31 keeps its own.
        let right: Vec<u32> =
            (0..LANES).map(|u| c[if u + (1 << k) < LANES { u + (1 << k) } else { u }]).collect();
        c = (0..LANES).map(|u| tab.shift4(g, c[u]) ^ right[u]).collect();
    }
    c[0]
}

/// `combine_chunks`.
fn combine_chunks(tab: &Tables, crcs: &[u32]) -> u32 {
    let m = crcs.len() as u64;
    if m == 0 {
        return 0;
    }
    let mut lg = 2u32;
    while ((LANES as u64) << lg) < m {
        lg += 1;
    }
    let (g, t) = (1u64 << lg, x2n());
    let (q, lead) = (g / 4, LANES as u64 * g - m);
    let mut c: Vec<u32> = (0..LANES as u64)
        .map(|lane| {
            let mut acc = [0u32; 4];
            for j in 0..q {
                for (s, a) in acc.iter_mut().enumerate() {
                    let v = lane * g + s as u64 * q + j;
                    let x = if v >= lead { crcs[(v - lead) as usize] } else { 0 };
                    *a = tab.shift4(SCHUNK, *a) ^ x;
                }
            }
            let op = t[((LOG2_CHUNK_BITS + lg - 2) % 31) as usize];
            acc[1..].iter().fold(acc[0], |c, &a| multmodp(op, c) ^ a)
        })
        .collect();
    for k in 0..5u32 {
        let op = t[((LOG2_CHUNK_BITS + lg + k) % 31) as usize];
        let right: Vec<u32> =
            (0..LANES).map(|u| c[if u + (1 << k) < LANES { u + (1 << k) } else { u }]).collect();
        c = (0..LANES).map(|u| multmodp(op, c[u]) ^ right[u]).collect();
    }
    c[0]
}

/// The whole kernel for one item whose first byte sits at an address
/// `addr` (only its alignment matters).
pub(crate) fn crc32c(tab: &Tables, addr: u64, bytes: &[u8]) -> u32 {
    let len = bytes.len() as u64;
    let head = ((WORD_BYTES - addr % WORD_BYTES) % WORD_BYTES).min(len) as usize;
    let words: Vec<u64> =
        bytes[head..].chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default())).collect();
    let n = item_tasks(addr, len) as usize;
    let chunk_crcs: Vec<u32> = (0..n)
        .map(|j| {
            chunk_crc(
                tab,
                &words[(j * CHUNK_WORDS).min(words.len())..((j + 1) * CHUNK_WORDS).min(words.len())],
            )
        })
        .collect();
    let front = combine_chunks(tab, &chunk_crcs[..n - 1]);
    let last_words = (words.len() - (n - 1) * CHUNK_WORDS) as u64;
    let body = multmodp(x8nmodp(last_words * WORD_BYTES), front) ^ chunk_crcs[n - 1];
    let fold_byte = |r: u32, b: u8| tab.0[PLAIN][((r ^ u32::from(b)) & 0xff) as usize] ^ (r >> 8);
    let mut r = bytes[..head].iter().fold(0xFFFF_FFFFu32, |r, &b| fold_byte(r, b));
    r = multmodp(x8nmodp(words.len() as u64 * WORD_BYTES), r) ^ body;
    let tail = &bytes[head + words.len() * 8..];
    !tail.iter().fold(r, |r, &b| fold_byte(r, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crc32c::engine::THREADS;

    /// xorshift64: reproducible test bytes without a dependency.
    fn bytes(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn the_model_of_the_kernel_matches_the_crc32c_crate() {
        let tab = super::tables();
        let data = bytes(3 << 20, 7);
        let c = CRC32C_CHUNK_BYTES as usize;
        let lens = [
            0,
            1,
            2,
            3,
            4,
            7,
            8,
            9,
            15,
            16,
            17,
            255,
            256,
            257,
            263,
            511,
            512,
            2047,
            c - 1,
            c,
            c + 1,
            c + 5,
            2 * c,
            2 * c + 9,
            3 * c + 256 * 5 + 8 * 3 + 5,
            129 * c + 3,
            (1 << 20) + 5,
            300 * c - 1,
            (2 << 20) + 77,
        ];
        for len in lens {
            for addr in 0..9u64 {
                let b = &data[addr as usize..addr as usize + len];
                assert_eq!(
                    super::crc32c(&tab, 0x7000_0000 + addr, b),
                    crc32c::crc32c(b),
                    "len {len} addr {addr}"
                );
            }
        }
    }

    #[test]
    fn the_kernels_constants_match_the_host() {
        let src = include_str!("../../../../kernels/tutti_crc32c.cu");
        let table = src.split("kX2n[31] = {").nth(1).and_then(|s| s.split("};").next()).unwrap_or("");
        let parsed: Vec<u32> = table
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0))
            .collect();
        let x2n = super::x2n();
        assert_eq!(parsed, x2n[..31].to_vec());
        assert_eq!(x2n[31], x2n[0], "x^(2^k) has period 31 for CRC32C");
        assert!(src.contains(&format!("#define CHUNK_BYTES {CRC32C_CHUNK_BYTES}u ")));
        assert!(src.contains(&format!("#define WORD_BYTES {WORD_BYTES} ")));
        assert_eq!(1u64 << 16, 8 * CRC32C_CHUNK_BYTES, "LOG2_CHUNK_BITS");
        assert!(src.contains(&format!("__launch_bounds__({THREADS})")));
    }
}
