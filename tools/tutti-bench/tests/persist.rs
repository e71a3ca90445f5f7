//! `tutti-bench replay --persist DIR`: a second run finds the first run's
//! blocks in the tutti-kv store on the file-backed drives and verifies
//! them; a store of another geometry is refused and left as it was, unless
//! `--format` asks for it to be replaced.

use std::path::Path;
use std::process::{Command, Output};

/// A run over `dir` of 40 synthetic requests with small blocks
/// (qwen2.5-0.5b: 12 KiB per token x `block_tokens`) on two drives of
/// `drive_mib` MiB: at 16 tokens and 32 MiB, about 340 slots of 192 KiB,
/// more than the trace's 192 distinct blocks.
fn replay(dir: &Path, block_tokens: u32, drive_mib: u64) -> Output {
    replay_with(dir, block_tokens, drive_mib, &[])
}

/// [`replay`] with more arguments.
fn replay_with(dir: &Path, block_tokens: u32, drive_mib: u64, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tutti-bench"))
        .args(["replay", "--json", "--persist", dir.to_str().unwrap()])
        .args(["--model", "qwen2.5-0.5b", "--drives", "2", "--requests", "40"])
        .args(["--block-tokens", &block_tokens.to_string(), "--drive-mib", &drive_mib.to_string()])
        .args(extra)
        .output()
        .expect("runs")
}

fn summary(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn images(dir: &Path) -> Vec<Vec<u8>> {
    (0..2).map(|i| std::fs::read(dir.join(format!("d{i}.img"))).unwrap()).collect()
}

#[test]
fn a_second_run_loads_and_verifies_what_the_first_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv"); // created by the run
    let first = summary(&replay(&dir, 16, 32));
    assert_eq!(first["restart_hits"], 0);
    assert_eq!(first["restart_hit_ratio"], 0.0);
    assert_eq!(first["store_objects_at_open"], 0);
    assert!(first["blocks_saved"].as_u64().unwrap() > 0);
    assert_eq!(first["persist_dir"], dir.display().to_string());

    let second = summary(&replay(&dir, 16, 32));
    assert!(second["store_objects_at_open"].as_u64().unwrap() > 0, "{second}");
    assert!(second["restart_hits"].as_u64().unwrap() > 0, "{second}");
    // Everything the first run saved is still there: most first lookups hit.
    assert!(second["restart_hit_ratio"].as_f64().unwrap() > 0.5, "{second}");
    assert_eq!(second["restart_lookups"], first["restart_lookups"], "same trace, same distinct blocks");
    assert!(second["blocks_loaded"].as_u64().unwrap() > first["blocks_loaded"].as_u64().unwrap());
    assert_eq!(second["blocks_verified"], second["blocks_loaded"]);
}

#[test]
fn a_store_of_another_geometry_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    summary(&replay(dir, 16, 32));
    let before = images(dir);
    // 32 tokens per block: 384 KiB objects instead of 192 KiB.
    let o = replay(dir, 32, 32);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "another geometry must be refused");
    assert!(e.contains("cannot open the tutti-kv store") && e.contains("object_size"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    // Smaller drives: refused before the emulator would cut the images.
    let o = replay(dir, 16, 8);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("--drive-mib"), "{e}");
    assert!(images(dir) == before, "the refused runs wrote nothing");
    let again = summary(&replay(dir, 16, 32));
    assert!(again["restart_hits"].as_u64().unwrap() > 0, "{again}");
    // --format: the other geometry takes over the directory, on request.
    let formatted = summary(&replay_with(dir, 32, 32, &["--format"]));
    assert_eq!(formatted["store_objects_at_open"], 0, "{formatted}");
    let o = replay(dir, 16, 32);
    assert!(!o.status.success(), "now the first geometry is the other one");
}
