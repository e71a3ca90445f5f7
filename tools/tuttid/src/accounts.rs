//! Per-uid accounting. Quotas bound what one peer uid holds across all of
//! its connections (a uid opening more connections gets no more queues,
//! registrations or bytes), and two caps bound connections: per uid and in
//! total (each connection is a thread and a frame buffer).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::error::DaemonError;

/// The limits, from the config.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections one uid may hold at once.
    pub connections_per_uid: u32,
    /// Connections (threads) the daemon serves at once, all uids.
    pub max_connections: u32,
    /// Memory registrations one uid may hold (all drives).
    pub registrations_per_uid: u32,
    /// Bytes of registered memory one uid may hold (all drives).
    pub memory_per_uid: u64,
}

/// What one uid holds.
#[derive(Debug, Default)]
struct Usage {
    connections: u32,
    /// Queue pairs held, by drive index.
    queues: HashMap<usize, u16>,
    registrations: u32,
    bytes: u64,
}

impl Usage {
    fn is_empty(&self) -> bool {
        self.connections == 0 && self.registrations == 0 && self.bytes == 0 && self.queues.is_empty()
    }
}

#[derive(Debug, Default)]
struct State {
    connections: u32,
    uids: HashMap<u32, Usage>,
}

/// The daemon's per-uid ledger.
#[derive(Debug)]
pub struct Accounts {
    limits: Limits,
    state: Mutex<State>,
}

impl Accounts {
    /// An empty ledger enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        Self { limits, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new connection of `uid`, or refuses it when the daemon or
    /// the uid holds its cap of connections.
    ///
    /// # Errors
    ///
    /// [`DaemonError::TooManyConnections`].
    pub fn connect(&self, uid: u32) -> Result<(), DaemonError> {
        let mut s = self.lock();
        if s.connections >= self.limits.max_connections {
            return Err(DaemonError::TooManyConnections { uid: None, limit: self.limits.max_connections });
        }
        let u = s.uids.entry(uid).or_default();
        if u.connections >= self.limits.connections_per_uid {
            let limit = self.limits.connections_per_uid;
            if u.is_empty() {
                s.uids.remove(&uid);
            }
            return Err(DaemonError::TooManyConnections { uid: Some(uid), limit });
        }
        u.connections += 1;
        s.connections += 1;
        Ok(())
    }

    /// A connection of `uid` ended.
    pub fn disconnect(&self, uid: u32) {
        let mut s = self.lock();
        s.connections = s.connections.saturating_sub(1);
        self.update(&mut s, uid, |u| u.connections = u.connections.saturating_sub(1));
    }

    /// Queue pairs `uid` holds on drive `drive`.
    pub fn queues(&self, uid: u32, drive: usize) -> u16 {
        self.lock().uids.get(&uid).and_then(|u| u.queues.get(&drive)).copied().unwrap_or(0)
    }

    /// Takes one queue pair of `drive` (named `name`, quota `quota` per
    /// uid) for `uid`.
    ///
    /// # Errors
    ///
    /// [`DaemonError::Quota`].
    pub fn take_queue(&self, uid: u32, drive: usize, name: &str, quota: u16) -> Result<(), DaemonError> {
        let mut s = self.lock();
        let held = s.uids.entry(uid).or_default().queues.entry(drive).or_insert(0);
        if *held >= quota {
            return Err(DaemonError::Quota { drive: name.to_owned(), quota });
        }
        *held += 1;
        Ok(())
    }

    /// Gives back a queue pair of `drive` that `uid` held.
    pub fn give_queue(&self, uid: u32, drive: usize) {
        let mut s = self.lock();
        self.update(&mut s, uid, |u| {
            if let Some(n) = u.queues.get_mut(&drive) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    u.queues.remove(&drive);
                }
            }
        });
    }

    /// Takes one registration of `bytes` for `uid`.
    ///
    /// # Errors
    ///
    /// [`DaemonError::MemoryQuota`] (count or bytes).
    pub fn take_memory(&self, uid: u32, bytes: u64) -> Result<(), DaemonError> {
        let mut s = self.lock();
        let u = s.uids.entry(uid).or_default();
        if u.registrations >= self.limits.registrations_per_uid {
            return Err(DaemonError::MemoryQuota { quota: self.limits.registrations_per_uid });
        }
        if u.bytes.saturating_add(bytes) > self.limits.memory_per_uid {
            return Err(DaemonError::MemoryBytes {
                held: u.bytes,
                asked: bytes,
                limit: self.limits.memory_per_uid,
            });
        }
        u.registrations += 1;
        u.bytes += bytes;
        Ok(())
    }

    /// Gives back a registration of `bytes` that `uid` held.
    pub fn give_memory(&self, uid: u32, bytes: u64) {
        let mut s = self.lock();
        self.update(&mut s, uid, |u| {
            u.registrations = u.registrations.saturating_sub(1);
            u.bytes = u.bytes.saturating_sub(bytes);
        });
    }

    fn update(&self, s: &mut State, uid: u32, f: impl FnOnce(&mut Usage)) {
        if let Some(u) = s.uids.get_mut(&uid) {
            f(u);
            if u.is_empty() {
                s.uids.remove(&uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accounts() -> Accounts {
        Accounts::new(Limits {
            connections_per_uid: 2,
            max_connections: 3,
            registrations_per_uid: 2,
            memory_per_uid: 8192,
        })
    }

    #[test]
    fn limits_hold_per_uid_across_connections_and_in_total() {
        let a = accounts();
        a.connect(1).unwrap();
        a.connect(1).unwrap();
        assert!(matches!(a.connect(1), Err(DaemonError::TooManyConnections { uid: Some(1), limit: 2 })));
        a.connect(2).unwrap();
        assert!(matches!(a.connect(3), Err(DaemonError::TooManyConnections { uid: None, limit: 3 })));
        a.disconnect(1);
        a.connect(3).unwrap();
        // Queues: one quota for the uid, whatever connection asks.
        a.take_queue(1, 0, "d0", 2).unwrap();
        a.take_queue(1, 0, "d0", 2).unwrap();
        assert!(matches!(a.take_queue(1, 0, "d0", 2), Err(DaemonError::Quota { quota: 2, .. })));
        a.take_queue(1, 1, "d1", 2).unwrap();
        a.take_queue(2, 0, "d0", 2).unwrap();
        a.give_queue(1, 0);
        assert_eq!(a.queues(1, 0), 1);
        a.take_queue(1, 0, "d0", 2).unwrap();
        // Memory: count and bytes.
        a.take_memory(1, 4096).unwrap();
        assert!(matches!(a.take_memory(1, 8192), Err(DaemonError::MemoryBytes { held: 4096, .. })));
        a.take_memory(1, 4096).unwrap();
        assert!(matches!(a.take_memory(1, 1), Err(DaemonError::MemoryQuota { quota: 2 })));
        a.give_memory(1, 4096);
        a.take_memory(1, 4096).unwrap();
        // Everything given back leaves nothing behind.
        for _ in 0..2 {
            a.give_memory(1, 4096);
            a.give_queue(1, 0);
        }
        a.give_queue(1, 1);
        a.disconnect(1);
        assert!(!a.lock().uids.contains_key(&1));
    }
}
