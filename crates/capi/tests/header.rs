//! `include/tutti.h` is what cbindgen makes of this crate today.

use std::path::Path;

/// The header cbindgen generates from the crate with `cbindgen.toml`.
fn generate() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

#[test]
fn header_is_up_to_date() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/tutti.h");
    let fresh = generate();
    if std::env::var_os("TUTTI_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &fresh).expect("writing include/tutti.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "crates/capi/include/tutti.h is stale (the C API changed): run `TUTTI_BLESS=1 cargo test -p tutti-capi` \
         to update it, then commit it"
    );
}

#[test]
fn header_names_are_c_style_and_complete() {
    let h = generate();
    for needle in [
        "typedef struct tutti_runtime tutti_runtime;",
        "TUTTI_STATUS_OK = 0,",
        "TUTTI_STATUS_NULL_ARGUMENT = 1,",
        "TUTTI_STATUS_HANDLE = 101,",
        "TUTTI_STATUS_OTHER = 199,",
        "typedef uint32_t tutti_status;",
        "TUTTI_OUTCOME_NVME = 2,",
        "#define TUTTI_DIRECTION_FLUSH 2",
        "#define TUTTI_MESSAGE_LEN 256",
        "char message[TUTTI_MESSAGE_LEN];",
        "typedef struct tutti_request {",
        "tutti_status tutti_wait(const struct tutti_runtime *runtime,",
        "#define TUTTI_EMULATED_DEFAULT_BYTES_PER_DRIVE (256 << 20)",
    ] {
        assert!(h.contains(needle), "the header lacks {needle:?}:\n{h}");
    }
    // Every entry point is declared.
    for f in [
        "tutti_runtime_new_yaml",
        "tutti_runtime_new_file",
        "tutti_runtime_new_emulated",
        "tutti_runtime_destroy",
        "tutti_shutdown",
        "tutti_stats_get",
        "tutti_store_info_get",
        "tutti_drive_count",
        "tutti_drive_name",
        "tutti_reset_drive",
        "tutti_open",
        "tutti_open_batch",
        "tutti_target_len",
        "tutti_close",
        "tutti_register_memory",
        "tutti_register_gpu_memory",
        "tutti_unregister_memory",
        "tutti_submit",
        "tutti_wait",
        "tutti_try_wait",
        "tutti_status_name",
        "tutti_last_error_message",
    ] {
        assert!(h.contains(&format!(" {f}(")) || h.contains(&format!("*{f}(")), "the header lacks {f}");
    }
    assert!(!h.contains("Fail") && !h.contains("OutArray"), "internal types leaked into the header");
}
