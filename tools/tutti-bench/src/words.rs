//! Host buffers of `u64` words (8-byte aligned, as the runtime's
//! registrations want them) viewed as bytes.

/// `words` as its bytes, borrowed mutably for the slice's lifetime.
pub fn as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    let n = words.len() * 8;
    let p = words.as_mut_ptr().cast::<u8>();
    // SAFETY: a u64 buffer viewed as bytes (u8 has no alignment or
    // validity requirement) for the lifetime of the exclusive borrow;
    // callers use it only while no I/O on the buffer is in flight.
    #[allow(unsafe_code)]
    unsafe {
        std::slice::from_raw_parts_mut(p, n)
    }
}
