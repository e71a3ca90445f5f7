//! Replays every saved corpus entry and crash of the fuzz targets in
//! `fuzz/` through the same bodies (`fuzz_bodies.rs`), so CI checks them on
//! stable Rust without a fuzzer.

#[path = "fuzz_bodies.rs"]
mod bodies;
#[path = "fuzz_session.rs"]
mod session;

use std::path::Path;

fn replay(target: &str, body: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut n = 0;
    for dir in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
        for e in entries.flatten() {
            // A running fuzzer may replace entries while we read.
            let Ok(bytes) = std::fs::read(e.path()) else { continue };
            body(&bytes);
            n += 1;
        }
    }
    println!("{target}: replayed {n} inputs");
    // Seeds that must always be exercised, corpus or not.
    body(&[]);
    body(&[0xFF; 4096]);
    body(&[0x00; 4097]);
}

#[test]
fn decode_device_data_corpus() {
    replay("decode_device_data", bodies::decode_device_data);
}

#[test]
fn prp_builder_corpus() {
    replay("prp_builder", bodies::prp_builder);
}

#[test]
fn config_parser_corpus() {
    replay("config_parser", bodies::config_parser);
}

#[test]
fn hostile_completions_corpus() {
    replay("hostile_completions", bodies::hostile_completions);
}

#[test]
fn emulator_commands_corpus() {
    replay("emulator_commands", bodies::emulator_commands);
}

#[test]
fn tuttid_protocol_corpus() {
    replay("tuttid_protocol", bodies::tuttid_protocol);
}

#[test]
fn controller_bringup_corpus() {
    replay("controller_bringup", |d| {
        bodies::controller_bringup(d);
    });
    // The seed that answers like a healthy controller does come up (so the
    // fact checks run), and the ones that misbehave do not.
    let seed = |name: &str| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/controller_bringup");
        std::fs::read(root.join(name)).unwrap()
    };
    for good in ["good", "enabled_at_start"] {
        assert!(bodies::controller_bringup(&seed(good)), "{good}");
    }
    for bad in ["cfs_on_enable", "all_ones_csts", "identify_fails", "raw_cqe", "no_completion", "dstrd_big"] {
        assert!(!bodies::controller_bringup(&seed(bad)), "{bad}");
    }
}

#[test]
fn tuttid_session_corpus() {
    replay("tuttid_session", session::tuttid_session);
}
