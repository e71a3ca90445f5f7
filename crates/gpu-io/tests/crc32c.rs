//! `Gpu::crc32c` against the `crc32c` crate on the same bytes. These tests
//! need a CUDA driver and a GPU; elsewhere each prints why it skipped and
//! passes. Tests named `large_*` move tens of MiB: skip them under
//! compute-sanitizer (`--skip large`). The throughput test is `#[ignore]`d:
//! `--ignored --nocapture crc32c_throughput` (see docs/gpu.md).
//!
//! Unsafe code: calls of `Gpu::crc32c_raw`, each with its SAFETY reason.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use gpu_io::{Gpu, GpuBuffer, GpuError, GpuRange, MAX_CRC32C_LEN};

fn gpu() -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(g) => Some(g),
        Err(e @ (GpuError::NoDriver | GpuError::Driver { .. })) => {
            eprintln!("skipped: no usable GPU ({e})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// xorshift64 state: reproducible pseudo-random numbers without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// A GPU buffer holding `host`'s bytes.
fn upload(gpu: &Gpu, host: &[u8]) -> GpuBuffer {
    let buf = GpuBuffer::zeroed(gpu, host.len()).unwrap();
    buf.copy_in(0, host).unwrap();
    buf
}

/// Checks every (offset, len) of `host`, in one batch, against the crate.
fn check(gpu: &Gpu, buf: &GpuBuffer, host: &[u8], ranges: &[(usize, usize)]) {
    let items: Vec<GpuRange<'_>> = ranges.iter().map(|&(o, l)| GpuRange::new(buf, o, l)).collect();
    let got = gpu.crc32c(&items).unwrap();
    assert_eq!(got.len(), ranges.len());
    for (i, (&(o, l), &crc)) in ranges.iter().zip(&got).enumerate() {
        assert_eq!(crc, crc32c::crc32c(&host[o..o + l]), "item {i}: offset {o}, {l} bytes");
    }
}

#[test]
fn every_length_and_alignment_matches_the_crate() {
    let Some(gpu) = gpu() else { return };
    let host = Rng(1).bytes(4 << 20);
    let buf = upload(&gpu, &host);
    let (k, m) = (8192, 1 << 20);
    let lens = [
        0,
        1,
        2,
        3,
        4,
        5,
        7,
        8,
        9,
        15,
        16,
        17,
        31,
        255,
        256,
        257,
        263,
        264,
        511,
        4095,
        k - 1,
        k,
        k + 1,
        k + 7,
        2 * k + 256 * 3 + 5,
        33 * k,
        m - 7,
        m,
        m + 5,
        3 * m - 1,
    ];
    // Offsets 0..9 from an aligned base: every pointer alignment mod 8.
    let ranges: Vec<(usize, usize)> = lens.iter().flat_map(|&l| (0..9).map(move |o| (4096 + o, l))).collect();
    check(&gpu, &buf, &host, &ranges);
}

#[test]
fn a_batch_of_a_thousand_items_with_empty_ones() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(2);
    let host = rng.bytes(8 << 20);
    let buf = upload(&gpu, &host);
    let ranges: Vec<(usize, usize)> = (0..1000)
        .map(|i| {
            let len = match i % 10 {
                0 => 0,
                1 => rng.below(16),
                2 => (1 << 20) + rng.below(64),
                _ => rng.below(40_000),
            };
            (rng.below(host.len() - len + 1), len)
        })
        .collect();
    check(&gpu, &buf, &host, &ranges);
}

#[test]
fn zero_length_items_and_empty_batches_give_zero() {
    let Some(gpu) = gpu() else { return };
    let buf = upload(&gpu, &[0xA5; 64]);
    assert_eq!(gpu.crc32c(&[]).unwrap(), Vec::<u32>::new());
    let ranges = [GpuRange::new(&buf, 0, 0), GpuRange::new(&buf, 64, 0), GpuRange::new(&buf, 7, 0)];
    assert_eq!(gpu.crc32c(&ranges).unwrap(), vec![0, 0, 0]);
    // SAFETY: zero-length ranges are never read, whatever their pointer.
    let raw = unsafe { gpu.crc32c_raw(&[(0, 0), (u64::MAX, 0), (buf.device_ptr() + 3, 0)]) }.unwrap();
    assert_eq!(raw, vec![0, 0, 0]);
}

#[test]
fn the_raw_variant_agrees_with_the_safe_one() {
    let Some(gpu) = gpu() else { return };
    let host = Rng(3).bytes(300_001);
    let buf = upload(&gpu, &host);
    let base = buf.device_ptr();
    let raw_items = [(base, host.len()), (base + 1, 12_345), (base + 299_990, 11)];
    // SAFETY: each range lies inside `buf`, alive for the call.
    let raw = unsafe { gpu.crc32c_raw(&raw_items) }.unwrap();
    let safe = gpu
        .crc32c(&[GpuRange::all(&buf), GpuRange::new(&buf, 1, 12_345), GpuRange::new(&buf, 299_990, 11)])
        .unwrap();
    assert_eq!(raw, safe);
    assert_eq!(raw[0], crc32c::crc32c(&host));
    assert_eq!(raw[2], crc32c::crc32c(&host[299_990..]));
}

#[test]
fn bad_ranges_are_typed_errors() {
    let Some(gpu) = gpu() else { return };
    let buf = upload(&gpu, &[1; 100]);
    let ok = GpuRange::new(&buf, 0, 10);
    match gpu.crc32c(&[ok, GpuRange::new(&buf, 90, 11)]) {
        Err(GpuError::Crc32cOutOfBounds { item: 1, offset: 90, len: 11, size: 100 }) => {}
        other => panic!("{other:?}"),
    }
    match gpu.crc32c(&[GpuRange::new(&buf, usize::MAX, 2)]) {
        Err(GpuError::Crc32cOutOfBounds { item: 0, .. }) => {}
        other => panic!("{other:?}"),
    }
    // SAFETY: refused before anything is launched.
    match unsafe { gpu.crc32c_raw(&[(buf.device_ptr(), 1), (u64::MAX - 3, 8)]) } {
        Err(GpuError::Crc32cBadRange { item: 1, .. }) => {}
        other => panic!("{other:?}"),
    }
    let too_long = usize::try_from(MAX_CRC32C_LEN + 1).unwrap();
    // SAFETY: as above.
    match unsafe { gpu.crc32c_raw(&[(4096, too_long)]) } {
        Err(GpuError::Crc32cBadRange { item: 0, .. }) => {}
        other => panic!("{other:?}"),
    }
    // A buffer of another Gpu (another CUDA context) is refused.
    let other_gpu = Gpu::open(0).unwrap();
    let foreign = upload(&other_gpu, &[2; 16]);
    match gpu.crc32c(&[ok, GpuRange::all(&foreign)]) {
        Err(GpuError::Crc32cForeignBuffer { item: 1 }) => {}
        other => panic!("{other:?}"),
    }
    // The Gpu still works after the refusals.
    assert_eq!(gpu.crc32c(&[ok]).unwrap(), vec![crc32c::crc32c(&[1; 10])]);
}

#[test]
fn large_sixty_four_mib_buffer() {
    let Some(gpu) = gpu() else { return };
    let host = Rng(4).bytes((64 << 20) + 16);
    let buf = upload(&gpu, &host);
    check(&gpu, &buf, &host, &[(0, 64 << 20), (3, (64 << 20) + 5), (1, (64 << 20) - 1)]);
}

/// Best and median kernel time, and the median whole call, of `reps` calls.
fn measure(gpu: &Gpu, ranges: &[GpuRange<'_>], reps: usize) -> (Duration, Duration, Duration) {
    for _ in 0..3 {
        gpu.crc32c(ranges).unwrap();
    }
    let mut kernel = Vec::new();
    let mut call = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let (_, k) = gpu.crc32c_timed(ranges).unwrap();
        call.push(t.elapsed());
        kernel.push(k);
    }
    kernel.sort();
    call.sort();
    (kernel[0], kernel[reps / 2], call[reps / 2])
}

#[test]
#[ignore = "throughput measurement for docs/gpu.md; needs a GPU"]
fn crc32c_throughput() {
    let Some(gpu) = gpu() else { return };
    let host = Rng(5).bytes(256 << 20);
    let buf = upload(&gpu, &host);
    let mib = 1usize << 20;
    let cases: [(&str, Vec<(usize, usize)>); 2] =
        [("64 x 1 MiB", (0..64).map(|i| (i * mib, mib)).collect()), ("1 x 256 MiB", vec![(0, 256 * mib)])];
    for (name, spans) in &cases {
        let ranges: Vec<GpuRange<'_>> = spans.iter().map(|&(o, l)| GpuRange::new(&buf, o, l)).collect();
        let want: Vec<u32> = spans.iter().map(|&(o, l)| crc32c::crc32c(&host[o..o + l])).collect();
        assert_eq!(gpu.crc32c(&ranges).unwrap(), want, "{name}");
        let bytes = spans.iter().map(|&(_, l)| l).sum::<usize>() as f64;
        let (best, median, call) = measure(&gpu, &ranges, 50);
        let gbps = |d: Duration| bytes / d.as_secs_f64() / 1e9;
        println!(
            "{name}: kernel best {:.1} us = {:.0} GB/s, median {:.1} us = {:.0} GB/s; \
             whole call median {:.1} us = {:.0} GB/s",
            best.as_secs_f64() * 1e6,
            gbps(best),
            median.as_secs_f64() * 1e6,
            gbps(median),
            call.as_secs_f64() * 1e6,
            gbps(call),
        );
    }
    // The host crate on this machine's CPU, for comparison (one thread).
    let t = Instant::now();
    let crc = crc32c::crc32c(&host);
    let cpu = t.elapsed();
    println!(
        "host crc32c crate, one thread, 256 MiB: {:.0} GB/s ({crc:08x})",
        host.len() as f64 / cpu.as_secs_f64() / 1e9
    );
}
