//! Payload checksums of host memory: CRC32C with the CPU's instruction
//! (the `crc32c` crate), spread over the cores for large batches.
//!
//! One thread computes CRC32C at about 9 GB/s on the GPU machine, slower
//! than four emulated drives move data, so a batch's payloads are cut into
//! pieces of [`PIECE`] bytes checksummed in parallel (rayon's pool) and
//! each payload's pieces joined with `crc32c_combine`: the result is the
//! CRC32C of the whole payload, the same value as one pass.

use rayon::prelude::*;

/// Bytes per piece checksummed on one core.
pub const PIECE: usize = 256 << 10;

/// Below this many bytes in a batch, one thread does it all.
const PARALLEL_FROM: usize = 2 * PIECE;

/// Parallel checksums only on machines with this many cores or more: on
/// fewer, the emulated drives' threads (and the caller's) have the cores
/// busy already, and spreading the work only adds contention (measured on
/// 2 cores: 2.0 s instead of 1.5 s of checksums in the Mooncake replay).
const PARALLEL_CORES: usize = 8;

fn parallel() -> bool {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get())) >= PARALLEL_CORES
}

/// CRC32C of each range.
pub fn crc32c_all(ranges: &[&[u8]]) -> Vec<u32> {
    let total: usize = ranges.iter().map(|r| r.len()).sum();
    if total < PARALLEL_FROM || !parallel() {
        return ranges.iter().map(|r| crc32c::crc32c(r)).collect();
    }
    crc32c_pieces(ranges)
}

/// CRC32C of each range, in pieces of [`PIECE`] bytes on rayon's pool.
fn crc32c_pieces(ranges: &[&[u8]]) -> Vec<u32> {
    // (range, piece) in order, so that each range's pieces are adjacent.
    let pieces: Vec<(usize, &[u8])> =
        ranges.iter().enumerate().flat_map(|(i, r)| r.chunks(PIECE).map(move |p| (i, p))).collect();
    let crcs: Vec<u32> = pieces.par_iter().map(|(_, p)| crc32c::crc32c(p)).collect();
    let mut out: Vec<Option<u32>> = vec![None; ranges.len()];
    for ((i, p), c) in pieces.iter().zip(crcs) {
        out[*i] = Some(match out[*i] {
            None => c,
            Some(acc) => crc32c::crc32c_combine(acc, c, p.len()),
        });
    }
    // An empty range has no piece: CRC32C of nothing is 0.
    out.into_iter().map(|c| c.unwrap_or(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_pieces_give_the_one_pass_checksum() {
        let data: Vec<u8> = (0..(3 * PIECE + 1234)).map(|i| (i * 31 + i / 7) as u8).collect();
        let ranges: Vec<&[u8]> =
            vec![&data[..], &data[5..PIECE + 5], &data[..0], &data[..17], &data[PIECE - 3..2 * PIECE + 9]];
        let want: Vec<u32> = ranges.iter().map(|r| crc32c::crc32c(r)).collect();
        assert_eq!(crc32c_all(&ranges), want);
        assert_eq!(crc32c_pieces(&ranges), want, "the parallel path, whatever the core count");
        assert_eq!(crc32c_all(&[&data[..10]]), vec![crc32c::crc32c(&data[..10])]);
    }
}
