//! Shared pieces of the daemon tests: starting `tuttid` with emulated
//! drives, and the client process (this test binary re-run with
//! `TUTTID_TEST_ROLE=client`) that does verified striped I/O.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tutti::{Config, Request, Runtime, SharedMemory};

/// Bytes per slot of the clients' store.
pub const SLOT: usize = 128 << 10;
/// Slots each client region covers.
pub const SLOTS_PER_REGION: u64 = 4;

/// A running daemon.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub config: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon config: four emulated drives that uid 0 and this uid may
/// use, plus `extra` drive entries.
pub fn config_yaml(socket: &Path, lease_ms: u32, extra: &str) -> String {
    config_yaml_timed(socket, lease_ms, extra, "")
}

/// As [`config_yaml`], with `emulated` keys such as a timing model added
/// to each of the four drives (`timing: { latency_us: 1000 }, `).
pub fn config_yaml_timed(socket: &Path, lease_ms: u32, extra: &str, emu_extra: &str) -> String {
    let uid = rustix::process::getuid().as_raw();
    let mut s =
        format!("socket: {}\nsocket_mode: \"0660\"\nlease_ms: {lease_ms}\ndrives:\n", socket.display());
    for d in 0..4 {
        s.push_str(&format!(
            "  d{d}:\n    device: {{ emulated: {{ {emu_extra}namespaces: [ {{ capacity: 8MiB, block_size: 4096 }} ], io_queues: 64 }} }}\n    allow: {{ uids: [0, {uid}] }}\n    queues_per_client: 16\n"
        ));
    }
    s.push_str(extra);
    s
}

impl Daemon {
    /// Starts `tuttid serve` on `config` text in `dir` and waits for its
    /// "listening" line.
    pub fn start(dir: &Path, yaml: &str) -> Daemon {
        let config = dir.join("tuttid.yaml");
        std::fs::write(&config, yaml).unwrap();
        let socket = dir.join("tutti.sock");
        let mut child = Command::new(env!("CARGO_BIN_EXE_tuttid"))
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tuttid");
        let out = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        assert!(line.contains("listening"), "tuttid did not start: {line:?}");
        Daemon { child, socket, config }
    }
}

/// The runtime YAML of a client: the four daemon drives striped.
pub fn client_yaml(socket: &Path) -> String {
    let mut s = String::from("drives:\n");
    for d in 0..4 {
        s.push_str(&format!("  d{d}: {{ daemon: {{ socket: {}, drive: d{d} }} }}\n", socket.display()));
    }
    s.push_str(&format!(
        "resolvers:\n  kv: {{ slab: {{ slot_size: {SLOT} }} }}\ndatapaths:\n  stripe:\n    striped_local_nvme: {{ drives: [d0, d1, d2, d3], nsid: 1, stripe_unit: 16KiB, queues_per_drive: 1, queue_depth: 64 }}\nstores:\n  kv: {{ resolver: kv, datapath: stripe }}\n"
    ));
    s
}

/// Spawns a client process for `region` doing `iterations` verified
/// write/read rounds (0: until `dir/stop` exists).
pub fn spawn_client(socket: &Path, dir: &Path, region: u64, iterations: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "client_role", "--nocapture", "--test-threads=1"])
        .env("TUTTID_TEST_ROLE", "client")
        .env("TUTTID_TEST_SOCKET", socket)
        .env("TUTTID_TEST_DIR", dir)
        .env("TUTTID_TEST_REGION", region.to_string())
        .env("TUTTID_TEST_ITERATIONS", iterations.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads a child's stdout until a line containing `prefix` (libtest may
/// print "test client_role ... " before it on the same line); returns the
/// line from `prefix` on, or "" at end of file.
pub fn wait_line(child: &mut Child, prefix: &str) -> String {
    let out = child.stdout.as_mut().unwrap();
    let mut r = BufReader::new(out);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            return String::new();
        }
        if let Some(i) = line.find(prefix) {
            return line[i..].to_owned();
        }
    }
}

/// The pattern of byte `i` of slot `slot` at round `iter`.
fn pattern(slot: u64, iter: u64, i: usize) -> u8 {
    (slot.wrapping_mul(131).wrapping_add(iter.wrapping_mul(29)).wrapping_add(i as u64 * 7 + (i as u64 >> 9)))
        as u8
}

/// Exit codes of the client role.
pub const EXIT_OK: i32 = 0;
pub const EXIT_WRONG_DATA: i32 = 1;
pub const EXIT_ERROR: i32 = 3;

/// The client process body.
pub fn client_main() -> i32 {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let socket = PathBuf::from(var("TUTTID_TEST_SOCKET"));
    let dir = PathBuf::from(var("TUTTID_TEST_DIR"));
    let region: u64 = var("TUTTID_TEST_REGION").parse().unwrap_or(0);
    let iterations: u64 = var("TUTTID_TEST_ITERATIONS").parse().unwrap_or(1);
    match run_client(&socket, &dir, region, iterations) {
        Ok(n) => {
            println!("verified {n}");
            EXIT_OK
        }
        Err((code, msg)) => {
            println!("failed {code}: {msg}");
            eprintln!("client {region}: {msg}");
            code
        }
    }
}

#[allow(unsafe_code)] // register_memory's contract, stated at the call
fn run_client(socket: &Path, dir: &Path, region: u64, iterations: u64) -> Result<u64, (i32, String)> {
    let e = |x: &dyn std::fmt::Display| (EXIT_ERROR, x.to_string());
    let rt = Runtime::from_config(Config::from_yaml_str(&client_yaml(socket)).map_err(|x| e(&x))?)
        .map_err(|x| e(&tutti::error_chain(&x)))?;
    let n = SLOTS_PER_REGION as usize;
    let src = SharedMemory::new(n * SLOT).map_err(|x| e(&x))?;
    let dst = SharedMemory::new(n * SLOT).map_err(|x| e(&x))?;
    // SAFETY: both live until the end of this function, after the runtime
    // is shut down; not touched while I/O on them is in flight.
    let ms =
        unsafe { rt.register_memory(src.as_ptr(), src.len()) }.map_err(|x| e(&tutti::error_chain(&x)))?;
    // SAFETY: as above.
    let md =
        unsafe { rt.register_memory(dst.as_ptr(), dst.len()) }.map_err(|x| e(&tutti::error_chain(&x)))?;
    let slots: Vec<u64> = (0..SLOTS_PER_REGION).map(|k| region * SLOTS_PER_REGION + k).collect();
    let targets: Vec<_> = slots
        .iter()
        .map(|s| rt.open(&format!("tutti://kv/{s}")))
        .collect::<Result<_, _>>()
        .map_err(|x| e(&x))?;
    println!("ready");
    let mut verified = 0u64;
    let mut buf = vec![0u8; SLOT];
    let mut iter = 0u64;
    loop {
        if iterations == 0 && dir.join("stop").exists() || iterations != 0 && iter >= iterations {
            break;
        }
        for (k, &slot) in slots.iter().enumerate() {
            let data: Vec<u8> = (0..SLOT).map(|i| pattern(slot, iter, i)).collect();
            src.write(k * SLOT, &data).map_err(|x| e(&x))?;
            dst.write(k * SLOT, &vec![0xEE; SLOT]).map_err(|x| e(&x))?;
        }
        let writes: Vec<Request> = targets
            .iter()
            .enumerate()
            .map(|(k, &t)| Request::write(t, 0, SLOT as u64, ms, (k * SLOT) as u64))
            .collect();
        io(&rt, &writes)?;
        let reads: Vec<Request> = targets
            .iter()
            .enumerate()
            .map(|(k, &t)| Request::read(t, 0, SLOT as u64, md, (k * SLOT) as u64))
            .collect();
        io(&rt, &reads)?;
        for (k, &slot) in slots.iter().enumerate() {
            dst.read(k * SLOT, &mut buf).map_err(|x| e(&x))?;
            if let Some(i) = (0..SLOT).find(|&i| buf[i] != pattern(slot, iter, i)) {
                return Err((
                    EXIT_WRONG_DATA,
                    format!("slot {slot} round {iter}: byte {i} is {:#x}", buf[i]),
                ));
            }
            verified += SLOT as u64;
        }
        iter += 1;
    }
    let report = rt.shutdown(Duration::from_secs(5));
    if report.commands_in_flight != 0 {
        return Err((EXIT_ERROR, format!("{} commands in flight at shutdown", report.commands_in_flight)));
    }
    Ok(verified)
}

fn io(rt: &Runtime, reqs: &[Request]) -> Result<(), (i32, String)> {
    let sub = rt.submit(reqs);
    let Some(op) = sub.op().filter(|_| sub.accepted() == reqs.len()) else {
        return Err((EXIT_ERROR, format!("not accepted: {:?}", sub.states())));
    };
    let st = rt.wait(op, Duration::from_secs(5)).map_err(|x| (EXIT_ERROR, tutti::error_chain(&x)))?;
    if let Some(bad) = st.iter().find(|s| !s.is_success()) {
        return Err((EXIT_ERROR, format!("request failed: {bad:?}")));
    }
    Ok(())
}

/// Polls `f` until it returns `Some` or `limit` passes.
pub fn eventually<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The daemon's status, over a new connection.
pub fn status(socket: &Path) -> tuttid_proto::StatusReport {
    tuttid_proto::Client::connect(socket).unwrap().status().unwrap()
}

/// Waits (20 s at most) until the daemon's pool is whole and nothing of
/// any client is left (only the status connection connected), then checks
/// that no drive saw DMA to unmapped memory or quarantined a queue;
/// returns the status it saw.
pub fn assert_all_reclaimed(socket: &Path) -> tuttid_proto::StatusReport {
    let s = eventually(Duration::from_secs(20), || {
        let s = status(socket);
        (s.clients.len() == 1
            && s.drives.iter().all(|d| d.queues_free == d.queues_total && d.registrations == 0))
        .then_some(s)
    });
    let s = s.unwrap_or_else(|| panic!("not reclaimed: {:#?}", status(socket)));
    for d in &s.drives {
        assert_eq!(d.dma_faults, 0, "drive {} saw DMA to unmapped memory", d.name);
        assert_eq!(d.quarantined, 0, "drive {} quarantined a queue", d.name);
    }
    s
}

/// Runs `clients` client processes (regions `0..clients`) of the daemon at
/// `socket`, each doing `rounds` rounds of verified striped I/O, and checks
/// that each exits cleanly having verified all its bytes.
pub fn stripe_verified(socket: &Path, dir: &Path, clients: u64, rounds: u64) {
    let mut kids: Vec<_> = (0..clients).map(|r| spawn_client(socket, dir, r, rounds)).collect();
    for (r, k) in kids.iter_mut().enumerate() {
        let line = wait_line(k, "verified");
        let st = k.wait().unwrap();
        assert!(st.success(), "client {r}: {st:?} {line}");
        let bytes: u64 = line.trim().trim_start_matches("verified ").parse().unwrap();
        assert_eq!(bytes, rounds * SLOTS_PER_REGION * SLOT as u64, "client {r}");
    }
}
