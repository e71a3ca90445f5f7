//! `tuttid verify`: a client for checking a running daemon (the QEMU guest
//! test runs two of these against a daemon that owns vfio-bound drives).
//! It opens a runtime whose drives are `daemon` drives of the daemon at
//! `--socket`, stripes them, and writes then reads back `--slots` slots of
//! its own `--region` for `--rounds` rounds, verifying every byte. With
//! `--hold FILE` it then keeps its queues (its connection) until FILE
//! exists, so that the operator view can be checked while it is connected.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use tutti::{error_chain, Config, Request, Runtime, SharedMemory};

/// Options of `verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The daemon's socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// The daemon's drives to stripe over, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub drives: Vec<String>,
    /// This client's region: slots `region * slots ..` of the stripe.
    #[arg(long, default_value_t = 0)]
    pub region: u64,
    /// Slots of this client (1..=64).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub slots: u64,
    /// Slot size, KiB (a multiple of 4, 4..=4096).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(4..=4096))]
    pub slot_kib: u64,
    /// Stripe unit, KiB.
    #[arg(long, default_value_t = 128)]
    pub stripe_kib: u64,
    /// Write/read/verify rounds (1..=100000).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rounds: u64,
    /// After verifying, stay connected until this file exists.
    #[arg(long)]
    pub hold: Option<PathBuf>,
    /// Longest wait for `--hold`, seconds.
    #[arg(long, default_value_t = 120)]
    pub hold_secs: u64,
}

/// A failure: the message and whether it was wrong data (exit 1) rather
/// than an error (exit 3).
pub type Failure = (bool, String);

fn fail(e: impl std::fmt::Display) -> Failure {
    (false, e.to_string())
}

/// The pattern of byte `i` of slot `slot` at round `round`.
fn pattern(slot: u64, round: u64, i: usize) -> u8 {
    (slot.wrapping_mul(131).wrapping_add(round.wrapping_mul(29)).wrapping_add(i as u64 * 7 + (i as u64 >> 9)))
        as u8
}

/// The runtime config: one `daemon` drive per name, striped, a slab
/// resolver of `slot` bytes.
fn runtime_yaml(a: &VerifyArgs) -> String {
    let mut s = String::from("drives:\n");
    for d in &a.drives {
        s.push_str(&format!("  {d}: {{ daemon: {{ socket: \"{}\", drive: {d} }} }}\n", a.socket.display()));
    }
    s.push_str(&format!(
        "resolvers:\n  slots: {{ slab: {{ slot_size: {}KiB }} }}\ndatapaths:\n  stripe:\n    striped_local_nvme: {{ drives: [{}], nsid: 1, stripe_unit: {}KiB, queues_per_drive: 1, queue_depth: 64 }}\nstores:\n  kv: {{ resolver: slots, datapath: stripe }}\n",
        a.slot_kib,
        a.drives.join(", "),
        a.stripe_kib
    ));
    s
}

/// Runs the check; returns the bytes verified.
///
/// # Errors
///
/// A [`Failure`] naming what went wrong.
#[allow(unsafe_code)] // register_memory's contract, stated at the calls
pub fn run(a: &VerifyArgs) -> Result<u64, Failure> {
    let cfg = Config::from_yaml_str(&runtime_yaml(a)).map_err(|e| fail(error_chain(&e)))?;
    let rt = Runtime::from_config(cfg).map_err(|e| fail(error_chain(&e)))?;
    let (n, slot) = (a.slots as usize, (a.slot_kib * 1024) as usize);
    let src = SharedMemory::new(n * slot).map_err(fail)?;
    let dst = SharedMemory::new(n * slot).map_err(fail)?;
    // SAFETY: both live until the end of this function, after the runtime
    // is shut down; they are not touched while I/O on them is in flight.
    let ms = unsafe { rt.register_memory(src.as_ptr(), src.len()) }.map_err(|e| fail(error_chain(&e)))?;
    // SAFETY: as above.
    let md = unsafe { rt.register_memory(dst.as_ptr(), dst.len()) }.map_err(|e| fail(error_chain(&e)))?;
    let slots: Vec<u64> = (0..a.slots).map(|k| a.region * a.slots + k).collect();
    let targets: Vec<_> =
        slots.iter().map(|s| rt.open(&format!("tutti://kv/{s}"))).collect::<Result<_, _>>().map_err(fail)?;
    let mut verified = 0u64;
    let t0 = Instant::now();
    let mut buf = vec![0u8; slot];
    for round in 0..a.rounds {
        for (k, &s) in slots.iter().enumerate() {
            let data: Vec<u8> = (0..slot).map(|i| pattern(s, round, i)).collect();
            src.write(k * slot, &data).map_err(fail)?;
            dst.write(k * slot, &vec![0xEE; slot]).map_err(fail)?;
        }
        let at = |k: usize| (k * slot) as u64;
        let len = slot as u64;
        let w: Vec<Request> =
            targets.iter().enumerate().map(|(k, &t)| Request::write(t, 0, len, ms, at(k))).collect();
        io(&rt, &w)?;
        let r: Vec<Request> =
            targets.iter().enumerate().map(|(k, &t)| Request::read(t, 0, len, md, at(k))).collect();
        io(&rt, &r)?;
        for (k, &s) in slots.iter().enumerate() {
            dst.read(k * slot, &mut buf).map_err(fail)?;
            if let Some(i) = (0..slot).find(|&i| buf[i] != pattern(s, round, i)) {
                return Err((true, format!("slot {s} round {round}: byte {i} is {:#x}", buf[i])));
            }
            verified += len;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "verified {verified} bytes in {} rounds over {} ({secs:.2} s, {:.1} MB/s written and read)",
        a.rounds,
        a.drives.join(","),
        2.0 * verified as f64 / secs / 1e6
    );
    hold(a)?;
    let report = rt.shutdown(Duration::from_secs(5));
    if report.commands_in_flight != 0 {
        return Err(fail(format!("{} commands in flight at shutdown", report.commands_in_flight)));
    }
    Ok(verified)
}

/// Waits for `--hold`'s file (connected, queues held).
fn hold(a: &VerifyArgs) -> Result<(), Failure> {
    let Some(path) = &a.hold else { return Ok(()) };
    println!("holding until {} exists", path.display());
    let end = Instant::now() + Duration::from_secs(a.hold_secs);
    while !Path::new(path).exists() {
        if Instant::now() > end {
            return Err(fail(format!("{} did not appear within {} s", path.display(), a.hold_secs)));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn io(rt: &Runtime, reqs: &[Request]) -> Result<(), Failure> {
    let sub = rt.submit(reqs);
    let Some(op) = sub.op().filter(|_| sub.accepted() == reqs.len()) else {
        return Err(fail(format!("not accepted: {:?}", sub.states())));
    };
    let st = rt.wait(op, Duration::from_secs(30)).map_err(|e| fail(error_chain(&e)))?;
    if let Some(bad) = st.iter().find(|s| !s.is_success()) {
        return Err(fail(format!("request failed: {bad:?}")));
    }
    Ok(())
}
