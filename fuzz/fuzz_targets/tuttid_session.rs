//! Fuzz target `tuttid_session`: a hostile client of an in-process
//! daemon; see tests/fuzz_session.rs.
#![no_main]

#[path = "../../tests/fuzz_session.rs"]
mod session;

libfuzzer_sys::fuzz_target!(|data: &[u8]| session::tuttid_session(data));
