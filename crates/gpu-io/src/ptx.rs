//! The committed PTX of `kernels/`: `tutti_io` (GPU-initiated NVMe I/O),
//! `tutti_crc32c` (checksums of GPU-resident ranges) and `tutti_null` (GPU
//! null controllers, a benchmark's device).

use std::borrow::Cow;
use std::ffi::{CStr, CString};

use crate::error::GpuError;

/// A committed PTX file of `kernels/` (`$name`, e.g. `"tutti_io"`) with a
/// terminating NUL, as `cuModuleLoadData` takes it: a NUL inside the PTX
/// fails the build rather than a load at run time.
macro_rules! nul_terminated_ptx {
    ($name:literal) => {
        match CStr::from_bytes_with_nul(
            concat!(include_str!(concat!("../../../kernels/", $name, ".ptx")), "\0").as_bytes(),
        ) {
            Ok(c) => c,
            Err(_) => panic!(concat!(
                "kernels/",
                $name,
                ".ptx contains a NUL byte: rebuild it with kernels/build.sh"
            )),
        }
    };
}

/// PTX of `kernels/tutti_io.cu` (built by `kernels/build.sh`; its first line
/// records the SHA-256 of the source it was built from).
pub const TUTTI_IO_PTX: &str = include_str!("../../../kernels/tutti_io.ptx");

/// The kernel entry point in [`TUTTI_IO_PTX`].
pub const TUTTI_IO_ENTRY: &str = "tutti_io";

/// [`TUTTI_IO_PTX`] with a terminating NUL, as `cuModuleLoadData` takes it.
/// A NUL inside the PTX fails the build here rather than [`Gpu::open`] at
/// run time.
///
/// [`Gpu::open`]: crate::Gpu::open
pub(crate) const TUTTI_IO_PTX_C: &CStr = nul_terminated_ptx!("tutti_io");

/// The I/O kernel's PTX: [`TUTTI_IO_PTX`], or, for kernel development, the
/// file named by the environment variable `TUTTI_IO_PTX` (a PTX built from
/// a modified `kernels/tutti_io.cu` with the same ABI, so that one set of
/// binaries can compare two kernels in one run). The override is logged.
///
/// # Errors
/// [`GpuError::KernelOverride`] when the file cannot be read, contains a
/// NUL byte, or lacks the `tutti_io` entry point.
pub(crate) fn io_ptx() -> Result<Cow<'static, CStr>, GpuError> {
    io_ptx_from(std::env::var_os("TUTTI_IO_PTX"))
}

/// [`io_ptx`] for a given value of the variable (`None`: unset).
fn io_ptx_from(path: Option<std::ffi::OsString>) -> Result<Cow<'static, CStr>, GpuError> {
    let Some(path) = path else {
        return Ok(Cow::Borrowed(TUTTI_IO_PTX_C));
    };
    let shown = path.to_string_lossy().into_owned();
    let refuse = |reason: String| GpuError::KernelOverride { path: shown.clone(), reason };
    let text = std::fs::read_to_string(&path).map_err(|e| refuse(e.to_string()))?;
    if !text.contains(&format!(".entry {TUTTI_IO_ENTRY}(")) {
        return Err(refuse(format!("no `.entry {TUTTI_IO_ENTRY}(` in the file")));
    }
    let c = CString::new(text).map_err(|_| refuse("the file contains a NUL byte".into()))?;
    tracing::warn!(path = %shown, source_sha256 = ?recorded_source_sha256(c.to_str().unwrap_or("")),
        "I/O kernel loaded from TUTTI_IO_PTX instead of the built-in PTX");
    Ok(Cow::Owned(c))
}

/// The bare ring probe's entry point in [`TUTTI_IO_PTX`] (see
/// [`Gpu::run_ring_probe`](crate::Gpu::run_ring_probe)).
pub const TUTTI_RING_PROBE_ENTRY: &str = "tutti_ring_probe";

/// [`TUTTI_RING_PROBE_ENTRY`] as a C string.
pub(crate) const TUTTI_RING_PROBE_ENTRY_C: &CStr = c"tutti_ring_probe";

/// [`TUTTI_IO_ENTRY`] as a C string, for `cuModuleGetFunction`.
pub(crate) const TUTTI_IO_ENTRY_C: &CStr = c"tutti_io";

/// PTX of `kernels/tutti_crc32c.cu` (built by `kernels/build.sh`; its first
/// line records the SHA-256 of the source it was built from).
pub const TUTTI_CRC32C_PTX: &str = include_str!("../../../kernels/tutti_crc32c.ptx");

/// The kernel entry point in [`TUTTI_CRC32C_PTX`].
pub const TUTTI_CRC32C_ENTRY: &str = "tutti_crc32c";

/// [`TUTTI_CRC32C_PTX`] with a terminating NUL (see [`TUTTI_IO_PTX_C`]).
pub(crate) const TUTTI_CRC32C_PTX_C: &CStr = nul_terminated_ptx!("tutti_crc32c");

/// [`TUTTI_CRC32C_ENTRY`] as a C string, for `cuModuleGetFunction`.
pub(crate) const TUTTI_CRC32C_ENTRY_C: &CStr = c"tutti_crc32c";

/// PTX of `kernels/tutti_null.cu`: null-backed NVMe controllers played by
/// GPU warps, a benchmark's device (see [`Gpu::start_null_controllers`]).
///
/// [`Gpu::start_null_controllers`]: crate::Gpu::start_null_controllers
pub const TUTTI_NULL_PTX: &str = include_str!("../../../kernels/tutti_null.ptx");

/// The kernel entry point in [`TUTTI_NULL_PTX`].
pub const TUTTI_NULL_ENTRY: &str = "tutti_null_ctrl";

/// [`TUTTI_NULL_PTX`] with a terminating NUL (see [`TUTTI_IO_PTX_C`]).
pub(crate) const TUTTI_NULL_PTX_C: &CStr = nul_terminated_ptx!("tutti_null");

/// [`TUTTI_NULL_ENTRY`] as a C string, for `cuModuleGetFunction`.
pub(crate) const TUTTI_NULL_ENTRY_C: &CStr = c"tutti_null_ctrl";

/// Whether two byte strings are equal, at compile time.
const fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// The two spellings of each entry point name agree.
const _: () = assert!(same_bytes(TUTTI_IO_ENTRY.as_bytes(), TUTTI_IO_ENTRY_C.to_bytes()));
const _: () = assert!(same_bytes(TUTTI_RING_PROBE_ENTRY.as_bytes(), TUTTI_RING_PROBE_ENTRY_C.to_bytes()));
const _: () = assert!(same_bytes(TUTTI_CRC32C_ENTRY.as_bytes(), TUTTI_CRC32C_ENTRY_C.to_bytes()));
const _: () = assert!(same_bytes(TUTTI_NULL_ENTRY.as_bytes(), TUTTI_NULL_ENTRY_C.to_bytes()));

/// The source hash recorded on the PTX's first line, if present.
pub fn recorded_source_sha256(ptx: &str) -> Option<&str> {
    ptx.lines().next()?.strip_prefix("// tutti source sha256: ").map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256_hex(src: &[u8]) -> String {
        use sha2::{Digest, Sha256};
        Sha256::digest(src).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The local header `tutti_io.cu` and `tutti_null.cu` include; their
    /// recorded hash covers it (after the source, as `kernels/build.sh`
    /// hashes them).
    const VOLATILE_CUH: &[u8] = include_bytes!("../../../kernels/tutti_volatile.cuh");

    /// The committed PTX was built from the committed source: rebuild with
    /// `kernels/build.sh` (on a machine with nvcc) after editing the `.cu`
    /// or a header it includes.
    #[test]
    fn committed_ptx_is_not_older_than_its_source() {
        let hex = sha256_hex(&[include_bytes!("../../../kernels/tutti_io.cu"), VOLATILE_CUH].concat());
        assert_eq!(
            recorded_source_sha256(TUTTI_IO_PTX),
            Some(hex.as_str()),
            "kernels/tutti_io.ptx is stale: run kernels/build.sh"
        );
        let hex = sha256_hex(include_bytes!("../../../kernels/tutti_crc32c.cu"));
        assert_eq!(
            recorded_source_sha256(TUTTI_CRC32C_PTX),
            Some(hex.as_str()),
            "kernels/tutti_crc32c.ptx is stale: run kernels/build.sh"
        );
        let hex = sha256_hex(&[include_bytes!("../../../kernels/tutti_null.cu"), VOLATILE_CUH].concat());
        assert_eq!(
            recorded_source_sha256(TUTTI_NULL_PTX),
            Some(hex.as_str()),
            "kernels/tutti_null.ptx is stale: run kernels/build.sh"
        );
    }

    /// The sources include the header exactly as `kernels/build.sh`'s hash
    /// expects (one `#include "tutti_volatile.cuh"` line), and the CRC
    /// kernel includes no local header (its hash is of the source alone).
    #[test]
    fn the_hashed_headers_are_the_ones_the_sources_include() {
        let local = |src: &str| -> Vec<String> {
            src.lines()
                .filter_map(|l| l.strip_prefix("#include \"")?.strip_suffix('"').map(String::from))
                .collect()
        };
        assert_eq!(local(include_str!("../../../kernels/tutti_io.cu")), ["tutti_volatile.cuh"]);
        assert_eq!(local(include_str!("../../../kernels/tutti_null.cu")), ["tutti_volatile.cuh"]);
        assert!(local(include_str!("../../../kernels/tutti_crc32c.cu")).is_empty());
    }

    #[test]
    fn the_kernel_override_takes_a_ptx_file_and_refuses_anything_else() {
        use std::ffi::OsString;
        assert!(matches!(io_ptx_from(None), Ok(Cow::Borrowed(_))));
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str, body: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            Some(OsString::from(p))
        };
        let ok = io_ptx_from(at("ok.ptx", TUTTI_IO_PTX.as_bytes())).unwrap();
        assert_eq!(ok.to_bytes(), TUTTI_IO_PTX.as_bytes());
        let refused = |p| match io_ptx_from(p) {
            Err(GpuError::KernelOverride { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        assert!(
            refused(at("other.ptx", b".visible .entry something_else(")).contains("no `.entry tutti_io(`")
        );
        assert!(refused(at("nul.ptx", b".visible .entry tutti_io(\0)")).contains("NUL"));
        assert!(!refused(Some(OsString::from(dir.path().join("missing.ptx")))).is_empty());
    }

    #[test]
    fn ptx_has_the_entry_point_and_a_target() {
        assert!(TUTTI_IO_PTX.contains(&format!(".visible .entry {TUTTI_IO_ENTRY}(")));
        assert!(TUTTI_IO_PTX.contains(&format!(".visible .entry {TUTTI_RING_PROBE_ENTRY}(")));
        assert!(TUTTI_IO_PTX.contains(".target sm_75"));
        assert!(TUTTI_CRC32C_PTX.contains(&format!(".visible .entry {TUTTI_CRC32C_ENTRY}(")));
        assert!(TUTTI_CRC32C_PTX.contains(".target sm_75"));
        assert!(TUTTI_NULL_PTX.contains(&format!(".visible .entry {TUTTI_NULL_ENTRY}(")));
        assert!(TUTTI_NULL_PTX.contains(".target sm_75"));
    }
}
