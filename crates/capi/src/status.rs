//! `tutti_status`: the one result type of every fallible call, its names,
//! its mapping from the runtime's [`tutti::Error`], and the thread-local
//! last error message.

use std::ffi::{c_char, CStr};

/// Generates [`tutti_status::ALL`] and the C names (`TUTTI_STATUS_` and
/// the suffix) from one list of `Variant => "SUFFIX"`, in value order.
macro_rules! status_names {
    ($($variant:ident => $suffix:literal,)*) => {
        impl tutti_status {
            /// Every status, in value order (for tests and tables).
            pub(crate) const ALL: &'static [tutti_status] = &[$(tutti_status::$variant),*];

            /// The C name of the status, NUL-terminated.
            fn name(self) -> &'static CStr {
                match self {
                    $(tutti_status::$variant => {
                        const NAME: &CStr = c_name(concat!("TUTTI_STATUS_", $suffix, "\0"));
                        NAME
                    })*
                }
            }
        }
    };
}

/// `name` (which ends in its one NUL) as a C string, at compile time.
const fn c_name(name: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(name.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a status name must end in its only NUL"),
    }
}

/// Result of every fallible `tutti_` call. `TUTTI_STATUS_OK` is 0; every
/// other value is an error whose text `tutti_last_error_message` gives
/// on the same thread until the next `tutti_` call.
///
/// Values 1..=99 are the binding's own; values from 100 map the runtime's
/// errors one to one. The values are stable: new ones may be added, none is
/// renumbered.
#[allow(non_camel_case_types, reason = "C naming: cbindgen copies the name into tutti.h")]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum tutti_status {
    /// Success.
    Ok = 0,
    /// A pointer argument was NULL (the message names it).
    NullArgument = 1,
    /// An argument is out of its domain: a string that is not UTF-8, a
    /// zero length or count, an unknown direction, a drive count out of
    /// range... Nothing was done.
    InvalidArgument = 2,
    /// A caller's buffer or array is too small. Nothing was consumed: for
    /// `tutti_wait` / `tutti_try_wait` the operation stays waitable; for
    /// text, the length needed is stored in the call's length out-pointer.
    BufferTooSmall = 3,
    /// `tutti_try_wait`: the operation is not final yet; its handle stays
    /// valid.
    NotReady = 4,
    /// A panic inside the library (a bug) was caught at the boundary. The
    /// message says where; the runtime is still usable.
    Panic = 5,
    /// `tutti_store_info`: no store of that name.
    UnknownStore = 6,
    /// The configuration was refused (the message names the key path).
    Config = 100,
    /// A handle (target, memory, operation) is stale, foreign or forged.
    Handle = 101,
    /// A URI does not parse, names an unknown store, or its key is refused.
    Uri = 102,
    /// No drive of that name.
    UnknownDrive = 103,
    /// A store's resolver and datapath do not speak the same payload.
    BindingMismatch = 104,
    /// Starting an emulated drive failed.
    Emulator = 105,
    /// Opening a PCI drive (vfio-pci) failed.
    Pci = 106,
    /// Bringing up or talking to a controller failed (also: a drive's
    /// shutdown failed, `tutti_shutdown`).
    Controller = 107,
    /// The GPU path failed (no CUDA driver or GPU, or a CUDA call).
    Gpu = 108,
    /// Registering memory failed (NULL address, zero length, a mapping a
    /// device refused, GPU memory without a GPU datapath).
    Memory = 109,
    /// The memory region still has operations in flight (or timed-out
    /// commands a drive may still write).
    MemoryBusy = 110,
    /// A drive cannot be reset now (GPU kernels using it still run, or
    /// another reset is under way).
    DriveBusy = 111,
    /// The runtime is shutting down and accepts no new work.
    ShuttingDown = 112,
    /// A handle table is full: close or unregister some objects first.
    TooManyHandles = 113,
    /// This process has created the most runtimes it may (65535).
    TooManyRuntimes = 114,
    /// An error of the runtime this version of the binding does not know
    /// by kind; the message says what it is.
    Other = 199,
}

impl tutti_status {
    /// The status of a runtime error.
    pub(crate) fn from_error(e: &tutti::Error) -> tutti_status {
        use tutti::Error as E;
        match e {
            E::Config(_) => tutti_status::Config,
            E::Handle(_) => tutti_status::Handle,
            E::Uri { .. } => tutti_status::Uri,
            E::UnknownDrive { .. } => tutti_status::UnknownDrive,
            E::BindingMismatch { .. } => tutti_status::BindingMismatch,
            E::Emulator { .. } => tutti_status::Emulator,
            E::Pci { .. } => tutti_status::Pci,
            E::Controller { .. } => tutti_status::Controller,
            E::Gpu { .. } => tutti_status::Gpu,
            E::Memory { .. } => tutti_status::Memory,
            E::MemoryBusy { .. } => tutti_status::MemoryBusy,
            E::DriveBusy { .. } => tutti_status::DriveBusy,
            E::ShuttingDown => tutti_status::ShuttingDown,
            E::TooManyHandles { .. } => tutti_status::TooManyHandles,
            E::TooManyRuntimes { .. } => tutti_status::TooManyRuntimes,
            _ => tutti_status::Other,
        }
    }
}

// The enum above stays written out: cbindgen reads it to make tutti.h. Its
// C names and `ALL` come from this one list; its `match` makes a variant
// left out a compile error, and the test below checks each name against the
// variant's.
status_names! {
    Ok => "OK",
    NullArgument => "NULL_ARGUMENT",
    InvalidArgument => "INVALID_ARGUMENT",
    BufferTooSmall => "BUFFER_TOO_SMALL",
    NotReady => "NOT_READY",
    Panic => "PANIC",
    UnknownStore => "UNKNOWN_STORE",
    Config => "CONFIG",
    Handle => "HANDLE",
    Uri => "URI",
    UnknownDrive => "UNKNOWN_DRIVE",
    BindingMismatch => "BINDING_MISMATCH",
    Emulator => "EMULATOR",
    Pci => "PCI",
    Controller => "CONTROLLER",
    Gpu => "GPU",
    Memory => "MEMORY",
    MemoryBusy => "MEMORY_BUSY",
    DriveBusy => "DRIVE_BUSY",
    ShuttingDown => "SHUTTING_DOWN",
    TooManyHandles => "TOO_MANY_HANDLES",
    TooManyRuntimes => "TOO_MANY_RUNTIMES",
    Other => "OTHER",
}

/// The name of a status value as a static NUL-terminated string, e.g.
/// `"TUTTI_STATUS_HANDLE"`; `"TUTTI_STATUS_UNKNOWN"` for a value that is no
/// status. The string is static: never free it.
#[no_mangle]
pub extern "C" fn tutti_status_name(status: u32) -> *const c_char {
    tutti_status::ALL
        .iter()
        .find(|s| **s as u32 == status)
        .map_or(c"TUTTI_STATUS_UNKNOWN", |s| s.name())
        .as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_values_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for &s in tutti_status::ALL {
            // SAFETY: `tutti_status_name` returns a static NUL-terminated
            // string.
            let name = unsafe { CStr::from_ptr(tutti_status_name(s as u32)) }.to_str().unwrap();
            let mut snake = String::new();
            for c in format!("{s:?}").chars() {
                if c.is_uppercase() && !snake.is_empty() {
                    snake.push('_');
                }
                snake.push(c.to_ascii_uppercase());
            }
            assert_eq!(name, format!("TUTTI_STATUS_{snake}"));
            assert!(seen.insert(name), "duplicate {name}");
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(tutti_status_name(12345)) };
        assert_eq!(unknown, c"TUTTI_STATUS_UNKNOWN");
        assert_eq!(tutti_status::Ok as u32, 0);
        assert!(tutti_status::ALL.windows(2).all(|w| (w[0] as u32) < (w[1] as u32)), "value order");
        assert_eq!(tutti_status::Handle as u32, 101);
    }
}
