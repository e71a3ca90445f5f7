//! tutti-probe (work in progress).
fn main() {}
