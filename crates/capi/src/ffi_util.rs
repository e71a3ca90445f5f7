//! The boundary machinery every entry point goes through: the panic guard
//! ([`ffi_call`]), the thread-local last error, and checked conversions of
//! the caller's pointers (null checks, C strings, arrays, out-pointers).
//!
//! Nothing else in the crate dereferences a caller's pointer: each
//! `unsafe` block below relies on the contract every entry point documents
//! (a non-null pointer is valid, aligned and, for arrays, holds the stated
//! number of elements for the duration of the call).

use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::status::tutti_status;

/// Why a call failed: the status it returns and the message
/// [`crate::tutti_last_error_message`] gives afterwards.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) status: tutti_status,
    pub(crate) message: String,
}

impl Fail {
    /// A failure with `status` and `message`.
    pub(crate) fn new(status: tutti_status, message: impl Into<String>) -> Fail {
        Fail { status, message: message.into() }
    }

    /// [`tutti_status::NullArgument`] naming the parameter.
    pub(crate) fn null(what: &str) -> Fail {
        Fail::new(tutti_status::NullArgument, format!("{what} is NULL"))
    }

    /// [`tutti_status::InvalidArgument`] with `message`.
    pub(crate) fn invalid(message: impl Into<String>) -> Fail {
        Fail::new(tutti_status::InvalidArgument, message)
    }
}

impl From<tutti::Error> for Fail {
    fn from(e: tutti::Error) -> Fail {
        Fail { status: tutti_status::from_error(&e), message: tutti::error_chain(&e) }
    }
}

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Replaces this thread's last error message.
pub(crate) fn set_last_error(message: String) {
    LAST_ERROR.with(|m| *m.borrow_mut() = message);
}

/// Runs `f` with this thread's last error message.
pub(crate) fn with_last_error<R>(f: impl FnOnce(&str) -> R) -> R {
    LAST_ERROR.with(|m| f(&m.borrow()))
}

/// Copies the message of the last failed `tutti_` call on this thread (the
/// full error chain, e.g. `configuration: drives.d0...: unknown field`)
/// into `buf` as a NUL-terminated UTF-8 string, and stores its length in
/// bytes (without the NUL) in `*out_len`. The message is empty after a
/// call that succeeded; this call does not change it, so it can be asked
/// for twice (first with `buf` NULL and `len` 0 to learn the length).
///
/// `buf`: `len` writable bytes, or NULL when `len` is 0. Returns
/// `TUTTI_STATUS_BUFFER_TOO_SMALL` when the message and its NUL do not fit
/// (the buffer then holds as much of it as fits in `len - 1` bytes, cut at
/// a UTF-8 character boundary, and a NUL),
/// `TUTTI_STATUS_NULL_ARGUMENT` when `out_len` is NULL.
#[no_mangle]
pub extern "C" fn tutti_last_error_message(
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> tutti_status {
    // Not through `ffi_call`: that would clear the message being read.
    let r = std::panic::catch_unwind(|| with_last_error(|m| copy_out_str(m, buf, len, out_len)));
    match r {
        Ok(Ok(())) => tutti_status::Ok,
        Ok(Err(Fail { status, .. })) => status,
        Err(_) => tutti_status::Panic,
    }
}

/// The panic guard of every entry point: clears the last error, runs
/// `body`, records a failure's message, and turns a panic into
/// [`tutti_status::Panic`] (the panic message becomes the last error), so
/// no unwind crosses into C.
pub(crate) fn ffi_call(body: impl FnOnce() -> Result<(), Fail>) -> tutti_status {
    set_last_error(String::new());
    // The runtime recovers poisoned locks and every value `body` captures is
    // a caller's pointer or a plain value: nothing is left half-updated that
    // a later call could observe, so asserting unwind safety is sound.
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".to_owned());
        Err(Fail::new(tutti_status::Panic, format!("panic inside tutti (a bug): {what}")))
    });
    match outcome {
        Ok(()) => tutti_status::Ok,
        Err(f) => {
            set_last_error(f.message);
            f.status
        }
    }
}

/// `ptr` as a shared reference, or [`tutti_status::NullArgument`] naming
/// `what`.
pub(crate) fn arg<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: the entry points' contract: a non-null pointer points to a
    // valid, aligned `T` that lives for the call.
    unsafe { ptr.as_ref() }.ok_or_else(|| Fail::null(what))
}

/// Checks an out-pointer before any work is done.
pub(crate) fn out<T>(ptr: *mut T, what: &str) -> Result<Out<T>, Fail> {
    if ptr.is_null() {
        return Err(Fail::null(what));
    }
    Ok(Out(ptr))
}

/// A checked, non-null out-pointer.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// Stores `value` (the old contents are not read or dropped: they may
    /// be uninitialized).
    pub(crate) fn write(&self, value: T) {
        // SAFETY: non-null (checked by `out`); the entry points' contract:
        // it points to writable, aligned storage for one `T`.
        unsafe { self.0.write(value) }
    }
}

/// A NUL-terminated UTF-8 string argument.
pub(crate) fn c_str<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if ptr.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-null; the entry points' contract: a NUL-terminated string
    // that lives for the call and is not written during it.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map_err(|e| Fail::invalid(format!("{what} is not UTF-8: {e}")))
}

/// `n` elements at `ptr` (the caller's input array). `n` must be non-zero.
pub(crate) fn slice_in<'a, T>(ptr: *const T, n: usize, what: &str) -> Result<&'a [T], Fail> {
    if ptr.is_null() {
        return Err(Fail::null(what));
    }
    if n == 0 {
        return Err(Fail::invalid(format!("{what}: zero elements")));
    }
    // SAFETY: non-null; the entry points' contract: `n` initialized,
    // aligned elements that live for the call and are not written during it.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

/// A caller's output array of `n` elements at `ptr`, written element by
/// element (its contents are never read).
pub(crate) struct OutArray<T> {
    ptr: *mut T,
    len: usize,
}

/// Checks an output array before any work is done.
pub(crate) fn out_array<T>(ptr: *mut T, n: usize, what: &str) -> Result<OutArray<T>, Fail> {
    if ptr.is_null() {
        return Err(Fail::null(what));
    }
    Ok(OutArray { ptr, len: n })
}

impl<T> OutArray<T> {
    /// Elements the array holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Stores `value` at `index`; an index past the end is a bug here, not
    /// the caller's, and panics (caught by [`ffi_call`]) instead of writing.
    pub(crate) fn write(&self, index: usize, value: T) {
        assert!(index < self.len, "output index {index} past {} elements", self.len);
        // SAFETY: in bounds (asserted); the entry points' contract: `len`
        // writable, aligned elements at `ptr` for the call.
        unsafe { self.ptr.add(index).write(value) }
    }
}

/// Copies `text` into the caller's buffer `buf` of `len` bytes as a
/// NUL-terminated string (cut at a UTF-8 character boundary to at most
/// `len - 1` bytes when it does not fit, so the cut text is still UTF-8)
/// and stores the full length of `text` in bytes (without the NUL) in
/// `written`. [`tutti_status::BufferTooSmall`] when it did not fit. `buf`
/// may be NULL when `len` is 0 (a query of the length).
pub(crate) fn copy_out_str(
    text: &str,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> Result<(), Fail> {
    let written = out(written, "out_len")?;
    // A zero-length array is never written: any pointer (NULL too) will do.
    let buf = if len == 0 {
        OutArray { ptr: buf.cast::<u8>(), len: 0 }
    } else {
        out_array(buf.cast::<u8>(), len, "buf")?
    };
    written.write(text.len());
    let fits = text.len() < len;
    let mut n = if fits { text.len() } else { len.saturating_sub(1) };
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    for (i, b) in text.as_bytes()[..n].iter().enumerate() {
        buf.write(i, *b);
    }
    if len > 0 {
        buf.write(n, 0);
    }
    if fits {
        Ok(())
    } else {
        Err(Fail::new(
            tutti_status::BufferTooSmall,
            format!("the text needs {} bytes with its NUL, the buffer has {len}", text.len() + 1),
        ))
    }
}

/// `text` in a fixed NUL-terminated buffer of `N` bytes, cut at a UTF-8
/// character boundary to at most `N - 1` bytes.
pub(crate) fn fixed_str<const N: usize>(text: &str) -> [c_char; N] {
    let mut end = text.len().min(N.saturating_sub(1));
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(&text.as_bytes()[..end]) {
        *o = *b as c_char;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_panic_status_with_its_message() {
        let st = ffi_call(|| panic!("boom {}", 7));
        assert_eq!(st, tutti_status::Panic);
        with_last_error(|m| assert!(m.contains("boom 7"), "{m}"));
        let st = ffi_call(|| std::panic::panic_any(5u8));
        assert_eq!(st, tutti_status::Panic);
        with_last_error(|m| assert!(m.contains("non-string"), "{m}"));
        // The next call clears it.
        assert_eq!(ffi_call(|| Ok(())), tutti_status::Ok);
        with_last_error(|m| assert_eq!(m, ""));
    }

    #[test]
    fn copy_out_str_truncates_and_reports_the_needed_length() {
        let mut buf = [1 as c_char; 4];
        let mut n = 0usize;
        let r = copy_out_str("hello", buf.as_mut_ptr(), buf.len(), &mut n);
        assert_eq!(r.unwrap_err().status, tutti_status::BufferTooSmall);
        assert_eq!(n, 5);
        assert_eq!(buf.map(|c| c as u8), *b"hel\0");
        let mut buf = [1 as c_char; 6];
        copy_out_str("hello", buf.as_mut_ptr(), buf.len(), &mut n).unwrap();
        assert_eq!(buf.map(|c| c as u8), *b"hello\0");
        assert_eq!(n, 5);
        // A zero-length buffer is never written.
        let r = copy_out_str("xy", std::ptr::null_mut(), 0, &mut n);
        assert_eq!(r.unwrap_err().status, tutti_status::BufferTooSmall);
        assert_eq!(n, 2);
        // But a NULL buffer with a length is refused.
        let r = copy_out_str("xy", std::ptr::null_mut(), 8, &mut n);
        assert_eq!(r.unwrap_err().status, tutti_status::NullArgument);
    }

    #[test]
    fn copy_out_str_cuts_at_a_char_boundary() {
        // "aé€" is 1 + 2 + 3 bytes; a cut inside "é" or "€" would leave
        // invalid UTF-8 (the header promises UTF-8).
        let mut n = 0usize;
        let mut buf = [1 as c_char; 3];
        let r = copy_out_str("aé€", buf.as_mut_ptr(), buf.len(), &mut n);
        assert_eq!(r.unwrap_err().status, tutti_status::BufferTooSmall);
        assert_eq!((n, buf.map(|c| c as u8)), (6, [b'a', 0, 1]));
        let mut buf = [1 as c_char; 6];
        let r = copy_out_str("aé€", buf.as_mut_ptr(), buf.len(), &mut n);
        assert_eq!(r.unwrap_err().status, tutti_status::BufferTooSmall);
        assert_eq!(buf.map(|c| c as u8), [b'a', 0xC3, 0xA9, 0, 1, 1]);
    }

    #[test]
    fn fixed_str_cuts_at_a_char_boundary() {
        let s: [c_char; 4] = fixed_str("aé€");
        // "a" (1) + "é" (2) fit in 3 bytes; "€" (3) does not.
        assert_eq!(s.map(|c| c as u8), [b'a', 0xC3, 0xA9, 0]);
        let s: [c_char; 3] = fixed_str("");
        assert_eq!(s, [0; 3]);
    }
}
