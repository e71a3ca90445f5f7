//! Fuzz target `tuttid_protocol`: see tests/fuzz_bodies.rs.
#![no_main]

#[path = "../../tests/fuzz_bodies.rs"]
#[allow(dead_code)]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::tuttid_protocol(data));
