//! This process as a lease names it, and whether the process a lease names
//! is still running: read from Linux's `/proc`, each part left unknown
//! (zero) where `/proc` does not say.

use std::os::unix::fs::MetadataExt;

use crate::format::LeaseRecord;

/// The identity fields of a [`LeaseRecord`] for this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    pub boot_id: [u8; 16],
    pub pid_ns: u64,
    pub pid: u32,
    pub start_time: u64,
}

/// Whether a lease's holder is running, as far as this process can see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// On this boot, in this PID namespace: running.
    Running,
    /// On this boot, in this PID namespace: exited (its PID is free or
    /// names a process started at another time), or another boot of this
    /// host (the machine restarted since).
    Gone,
    /// Another PID namespace or host, or `/proc` says nothing: only the
    /// lease's renewals tell.
    Unknown,
}

impl Identity {
    /// This process's identity.
    pub fn current() -> Self {
        let pid = std::process::id();
        Self { boot_id: boot_id(), pid_ns: pid_ns(), pid, start_time: start_time(pid).unwrap_or(0) }
    }

    /// Whether `holder` is running, seen from `self` (this process).
    pub fn liveness(&self, holder: &LeaseRecord) -> Liveness {
        if self.boot_id == [0; 16] || holder.boot_id == [0; 16] {
            return Liveness::Unknown;
        }
        if holder.boot_id != self.boot_id {
            // Same media, another boot id: the host restarted (local NVMe)
            // or the media moved, and that process is gone; or two hosts
            // share the drive, which only its renewals can tell.
            return if holder.renew_ms == 0 { Liveness::Gone } else { Liveness::Unknown };
        }
        if self.pid_ns == 0 || holder.pid_ns != self.pid_ns || holder.start_time == 0 {
            return Liveness::Unknown;
        }
        match start_time(holder.pid) {
            Some(t) if t == holder.start_time => Liveness::Running,
            Some(_) => Liveness::Gone,
            None if std::path::Path::new("/proc/self/stat").exists() => Liveness::Gone,
            None => Liveness::Unknown,
        }
    }
}

/// `/proc/sys/kernel/random/boot_id` as 16 bytes (zero when unreadable).
fn boot_id() -> [u8; 16] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    let mut out = [0u8; 16];
    if hex.len() != 32 {
        return out;
    }
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        let s = std::str::from_utf8(pair).unwrap_or("00");
        out[i] = u8::from_str_radix(s, 16).unwrap_or(0);
    }
    out
}

/// Inode of this process's PID namespace (0 when unreadable).
fn pid_ns() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map(|m| m.ino()).unwrap_or(0)
}

/// Start time of process `pid`, clock ticks after boot (`/proc/PID/stat`
/// field 22); `None` when there is no such process (or no `/proc`).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (comm) is in parentheses and may hold spaces: count fields
    // after the last ')'. Field 3 is the first after it; 22 is the 20th.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_of(id: &Identity) -> LeaseRecord {
        LeaseRecord {
            owner: [1; 16],
            generation: 1,
            boot_id: id.boot_id,
            pid_ns: id.pid_ns,
            pid: id.pid,
            start_time: id.start_time,
            renew_ms: 1000,
        }
    }

    #[test]
    fn this_process_runs_and_a_reused_pid_or_another_boot_does_not() {
        let me = Identity::current();
        if me.boot_id == [0; 16] || me.start_time == 0 {
            eprintln!("skipped: no /proc here");
            return;
        }
        assert_eq!(me.liveness(&record_of(&me)), Liveness::Running);
        let mut reused = record_of(&me);
        reused.start_time += 1;
        assert_eq!(me.liveness(&reused), Liveness::Gone, "same PID, another start time");
        let mut exited = record_of(&me);
        exited.pid = u32::MAX - 1;
        assert_eq!(me.liveness(&exited), Liveness::Gone, "no such PID");
        let mut other_ns = record_of(&me);
        other_ns.pid_ns ^= 1;
        assert_eq!(me.liveness(&other_ns), Liveness::Unknown, "another PID namespace");
        let mut rebooted = record_of(&me);
        rebooted.boot_id[0] ^= 1;
        assert_eq!(me.liveness(&rebooted), Liveness::Unknown, "another boot, renewing: maybe another host");
        rebooted.renew_ms = 0;
        assert_eq!(me.liveness(&rebooted), Liveness::Gone, "another boot, not renewing");
    }
}
