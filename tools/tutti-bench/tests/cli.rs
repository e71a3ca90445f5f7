//! The `tutti-bench` binary end to end: verification fails loudly, odd
//! traces are handled, bad input is refused.

use std::path::PathBuf;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tutti-bench")).args(args).output().expect("runs")
}

fn tmp(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tutti-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn default_replay_verifies_every_loaded_block() {
    let o = bench(&["replay", "--requests", "40", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["blocks_loaded"].as_u64().unwrap() > 0);
    assert_eq!(v["blocks_verified"], v["blocks_loaded"]);
    assert_eq!(v["drives"].as_array().unwrap().len(), 4);
}

#[test]
fn a_drive_that_moves_no_data_fails_verification() {
    // Null backing: reads complete with status 0 but transfer nothing. The
    // replay must notice instead of reporting the saved bytes still sitting
    // in its staging buffer.
    let cfg = tmp(
        "null.yaml",
        "drives: { d0: { emulated: { namespaces: [{ capacity: 64MiB, block_size: 4096 }], backing: null } } }
resolvers: { kv: { slab: { slot_size: 1MiB } } }
datapaths: { one: { local_nvme: { drive: d0 } } }
stores: { kv: { resolver: kv, datapath: one } }
",
    );
    let trace = tmp(
        "repeat.jsonl",
        "{\"timestamp\":0,\"input_length\":512,\"output_length\":1,\"hash_ids\":[7]}\n\
         {\"timestamp\":1,\"input_length\":512,\"output_length\":1,\"hash_ids\":[7]}\n",
    );
    let o = bench(&["replay", "--config", cfg.to_str().unwrap(), "--trace", trace.to_str().unwrap()]);
    assert!(!o.status.success(), "null backing must not verify");
    assert!(stderr(&o).contains("loaded wrong data"), "{}", stderr(&o));
}

#[test]
fn repeated_hash_ids_in_one_request_are_one_block() {
    // The second request's blocks are [5, 3]: 5 is the cached prefix
    // (loaded once), 3 is new (saved once).
    let trace = tmp(
        "dups.jsonl",
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[5,5]}\n\
         {\"timestamp\":1,\"input_length\":1536,\"output_length\":1,\"hash_ids\":[5,3,5]}\n",
    );
    let o = bench(&["replay", "--trace", trace.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["blocks_saved"], 2);
    assert_eq!(v["blocks_loaded"], 1);
}

#[test]
fn bad_input_is_refused_with_a_message() {
    let empty = tmp("empty.jsonl", "\n\n");
    let garbage = tmp(
        "garbage.jsonl",
        "{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\nnot json\n",
    );
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["replay", "--trace", empty.to_str().unwrap()], "no requests"),
        (vec!["replay", "--trace", garbage.to_str().unwrap()], ":2"),
        (vec!["replay", "--trace", "/nonexistent/trace.jsonl"], "cannot open trace"),
        (vec!["replay", "--requests", "0"], "at least 1"),
        (vec!["replay", "--model", "gpt-9"], "unknown model"),
        (vec!["replay", "--drives", "5"], "1 to 4"),
        (vec!["replay", "--block-tokens", "0"], "at least 1"),
        (vec!["replay", "--drive-mib", "17592186044672"], "too large"),
        (vec!["stripe", "--seconds", "nan"], "seconds"),
        (vec!["stripe", "--max-drives", "9"], "9"),
        (vec!["rate", "--queue-depth", "0"], "0"),
    ];
    for (args, want) in cases {
        let o = bench(&args);
        let e = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
}
