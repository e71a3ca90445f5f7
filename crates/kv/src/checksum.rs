//! Payload checksums of host memory: CRC32C with the CPU's instruction
//! (the `crc32c` crate), spread over a few threads for large batches.
//!
//! One thread computes CRC32C at about 9 GB/s on the GPU machine, slower
//! than four emulated drives move data, so on machines with cores to spare
//! a batch's payloads are shared out, whole, among a few scoped threads.
//! Payloads are not cut into pieces joined with `crc32c_combine`: that
//! crate's combine costs tens of microseconds per call, and with 256 KiB
//! pieces it halved the store's bandwidth on the GPU machine (so did
//! rayon's pool, for the same reason; docs/benchmarks.md).

/// Below this many bytes in a batch, one thread does it all.
const PARALLEL_FROM: usize = 2 << 20;

/// Threads for a batch's checksums: a quarter of the cores, at most 4;
/// one (the caller) below 8 cores, where the emulated drives' threads and
/// the caller's keep the cores busy already.
fn threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores < 8 {
            1
        } else {
            (cores / 4).min(4)
        }
    })
}

/// CRC32C of each range.
pub fn crc32c_all(ranges: &[&[u8]]) -> Vec<u32> {
    let total: usize = ranges.iter().map(|r| r.len()).sum();
    if total < PARALLEL_FROM || threads() == 1 || ranges.len() < 2 {
        return ranges.iter().map(|r| crc32c::crc32c(r)).collect();
    }
    crc32c_parallel(ranges, threads())
}

/// CRC32C of each range, the ranges shared out in contiguous runs among
/// `threads` scoped threads (the caller's among them).
fn crc32c_parallel(ranges: &[&[u8]], threads: usize) -> Vec<u32> {
    let mut crcs = vec![0u32; ranges.len()];
    let per = ranges.len().div_ceil(threads.max(1));
    std::thread::scope(|s| {
        let mut work = ranges.chunks(per).zip(crcs.chunks_mut(per));
        let mine = work.next();
        for (rs, cs) in work {
            s.spawn(move || checksum_into(rs, cs));
        }
        if let Some((rs, cs)) = mine {
            checksum_into(rs, cs);
        }
    });
    crcs
}

fn checksum_into(ranges: &[&[u8]], out: &mut [u32]) {
    for (r, c) in ranges.iter().zip(out) {
        *c = crc32c::crc32c(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_out_checksums_are_the_one_pass_checksums_in_order() {
        let data: Vec<u8> = (0..(3 << 20) + 1234).map(|i: usize| (i * 31 + i / 7) as u8).collect();
        let ranges: Vec<&[u8]> =
            vec![&data[..], &data[5..70_000], &data[..0], &data[..17], &data[1 << 20..(2 << 20) + 9]];
        let want: Vec<u32> = ranges.iter().map(|r| crc32c::crc32c(r)).collect();
        assert_eq!(crc32c_all(&ranges), want);
        for threads in [1, 2, 3, 8] {
            assert_eq!(crc32c_parallel(&ranges, threads), want, "{threads} threads");
        }
    }
}
