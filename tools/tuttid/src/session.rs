//! One client connection: its peer credentials, what it owns (queue pairs,
//! memory registrations), the requests it may make, and the reclaim of
//! everything when it ends (SQs deleted, then CQs, then memory unmapped).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nvm_queue::DmaMapping;
use tuttid_proto::message::{Request, Response};
use tuttid_proto::shm::MappedFd;
use tuttid_proto::PROTOCOL_VERSION;

use crate::accounts::Accounts;
use crate::drive::{Drive, Rings};
use crate::error::DaemonError;
use crate::forward::LeaseEnd;
use crate::mediate::Regions;

/// How long an unregistration on a mediated drive waits for the commands
/// that may name the memory; past it the registration stays mapped and
/// charged, and is finished by a later request of the connection or at
/// reclaim (well under the client's 10 s reply timeout).
const UNREGISTER_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Peer credentials from SO_PEERCRED at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Process id.
    pub pid: u32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// Client memory mapped for one drive.
#[derive(Debug)]
struct Registration {
    drive: usize,
    memory: Arc<MappedFd>,
    mapping: DmaMapping,
}

/// What one connection owns.
#[derive(Debug)]
pub struct Session {
    /// The peer.
    pub peer: Peer,
    drives: Arc<Vec<Drive>>,
    /// Granted rings, by (drive index, qid).
    queues: Vec<(usize, Rings)>,
    memory: HashMap<u64, Registration>,
    /// Unregistrations still waiting for commands forwarded before them
    /// (epoch of `Regions::begin_remove`): mapped, counted and charged
    /// until those complete.
    deferred: Vec<(Registration, u64)>,
    /// This connection's registrations per drive, as the forwarders of
    /// mediated drives check PRPs against them.
    regions: HashMap<usize, Arc<Regions>>,
    /// Drives on which a queue of this connection could not be deleted
    /// (quarantined): the controller may still DMA for its commands, so
    /// the connection's memory there is never unmapped.
    quarantined: Vec<usize>,
    next_id: u64,
    /// The per-uid ledger the quotas are taken from.
    accounts: Arc<Accounts>,
    /// Ends this connection's lease (a forwarder that sees this client
    /// break a doorbell rule calls it).
    lease_end: LeaseEnd,
    lease_ms: u32,
    /// The connection's DMA domain: its rings and memory are mapped in it
    /// and its SQs belong to it, so its commands reach no one else's
    /// memory (nonzero; see `server::domain_of`).
    domain: u32,
    /// `Hello` accepted.
    pub greeted: bool,
}

/// A reply and the descriptors that go with it.
pub type Reply = (Response, Vec<OwnedFd>);

fn refuse(e: DaemonError) -> Reply {
    (Response::Refused { rule: e.rule(), detail: tutti::error_chain(&e) }, Vec::new())
}

impl Session {
    /// A new session for `peer`, whose DMA domain is `domain` (nonzero);
    /// its queues and memory count against `peer.uid` in `accounts`;
    /// `lease_end` ends the connection.
    pub fn new(
        peer: Peer,
        drives: Arc<Vec<Drive>>,
        (accounts, lease_end): (Arc<Accounts>, LeaseEnd),
        lease_ms: u32,
        domain: u32,
    ) -> Self {
        Self {
            domain,
            peer,
            drives,
            queues: Vec::new(),
            memory: HashMap::new(),
            regions: HashMap::new(),
            deferred: Vec::new(),
            quarantined: Vec::new(),
            next_id: 1,
            accounts,
            lease_end,
            lease_ms,
            greeted: false,
        }
    }

    /// Queue pairs owned, as (drive name, qid).
    pub fn queue_list(&self) -> Vec<(String, u16)> {
        self.queues.iter().map(|(d, r)| (self.drives[*d].name.clone(), r.qid)).collect()
    }

    /// Bytes of memory registered.
    pub fn memory_bytes(&self) -> u64 {
        self.memory.values().map(|r| r.memory.len() as u64).sum()
    }

    /// Handles the handshake: `Hello` with this daemon's version.
    pub fn hello(&mut self, req: &Request) -> Result<Reply, Reply> {
        match req {
            Request::Hello { version } if *version == PROTOCOL_VERSION => {
                self.greeted = true;
                Ok((Response::HelloOk { version: PROTOCOL_VERSION, lease_ms: self.lease_ms }, Vec::new()))
            }
            Request::Hello { version } => Err((
                Response::Refused {
                    rule: tuttid_proto::Rule::Version,
                    detail: format!("client speaks protocol {version}, tuttid speaks {PROTOCOL_VERSION}"),
                },
                Vec::new(),
            )),
            other => Err((
                Response::Refused {
                    rule: tuttid_proto::Rule::HandshakeFirst,
                    detail: format!("{} before Hello", other.name()),
                },
                Vec::new(),
            )),
        }
    }

    /// Serves one request after the handshake (`fds`: the descriptors that
    /// came with it, already checked to match its type).
    pub fn handle(&mut self, req: Request, fds: Vec<OwnedFd>) -> Reply {
        if !self.deferred.is_empty() {
            self.finish_deferred(std::time::Duration::ZERO);
        }
        let r = match req {
            Request::Hello { .. } => {
                Err(DaemonError::BadRequest("Hello after the handshake (rule handshake-first)".into()))
            }
            Request::OpenDrive { drive } => self.open_drive(&drive),
            Request::GrantQueue { drive, entries } => self.grant(&drive, entries),
            Request::ReleaseQueue { drive, qid } => self.release(&drive, qid),
            Request::RegisterMemory { drive, offset, len } => self.register(&drive, offset, len, fds),
            Request::UnregisterMemory { id } => self.unregister(id),
            Request::Heartbeat => Ok((Response::Done, Vec::new())),
            Request::Status => Err(DaemonError::BadRequest("status is served by the server".into())),
        };
        r.unwrap_or_else(refuse)
    }

    /// The drive named `name`, if this peer may use it.
    fn drive(&self, name: &str) -> Result<usize, DaemonError> {
        let i = self
            .drives
            .iter()
            .position(|d| d.name == name)
            .ok_or_else(|| DaemonError::UnknownDrive { drive: name.to_owned() })?;
        let Peer { uid, gid, .. } = self.peer;
        if !self.drives[i].allow.permits(uid, gid) {
            return Err(DaemonError::NotAllowed { drive: name.to_owned(), uid, gid });
        }
        Ok(i)
    }

    fn open_drive(&mut self, name: &str) -> Result<Reply, DaemonError> {
        let d = self.drive(name)?;
        let left = self.drives[d].quota.saturating_sub(self.accounts.queues(self.peer.uid, d));
        let tenant = self.drives[d].tenant(self.peer.uid, self.peer.gid)?;
        Ok((Response::DriveFacts(self.drives[d].facts(left, tenant.as_ref())), Vec::new()))
    }

    fn grant(&mut self, name: &str, entries: u32) -> Result<Reply, DaemonError> {
        let d = self.drive(name)?;
        let tenant = self.drives[d].tenant(self.peer.uid, self.peer.gid)?;
        let mediated = tenant.map(|t| (t, self.regions_of(d)));
        let drive = &self.drives[d];
        self.accounts.take_queue(self.peer.uid, d, name, drive.quota)?;
        let (rings, grant, fds) =
            drive.grant(entries, self.domain, &self.lease_end, mediated).inspect_err(|_| {
                self.accounts.give_queue(self.peer.uid, d);
            })?;
        self.queues.push((d, rings));
        Ok((Response::QueueGranted(grant), fds.into()))
    }

    /// This connection's registrations on drive `d`.
    fn regions_of(&mut self, d: usize) -> Arc<Regions> {
        self.regions.entry(d).or_default().clone()
    }

    fn release(&mut self, name: &str, qid: u16) -> Result<Reply, DaemonError> {
        let d = self.drive(name)?;
        let pos = self
            .queues
            .iter()
            .position(|(i, r)| *i == d && r.qid == qid)
            .ok_or(DaemonError::NotOwned { what: "queue", id: u64::from(qid) })?;
        let (d, rings) = self.queues.swap_remove(pos);
        self.accounts.give_queue(self.peer.uid, d);
        let drive = &self.drives[d];
        if drive.delete_sq(qid) && drive.delete_cq(qid) {
            drive.reclaim_rings(rings);
            Ok((Response::Done, Vec::new()))
        } else {
            drive.quarantine(rings);
            self.quarantined.push(d);
            Err(DaemonError::Drive {
                drive: name.to_owned(),
                what: format!("deleting queue {qid} failed; quarantined"),
                source: None,
            })
        }
    }

    fn register(
        &mut self,
        name: &str,
        offset: u64,
        len: u64,
        fds: Vec<OwnedFd>,
    ) -> Result<Reply, DaemonError> {
        let d = self.drive(name)?;
        let fd = fds.into_iter().next().ok_or_else(|| DaemonError::BadMemory("no descriptor".into()))?;
        if len > (1 << 40) {
            return Err(DaemonError::BadMemory(format!("{len} bytes is more than 1 TiB")));
        }
        let uid = self.peer.uid;
        self.accounts.take_memory(uid, len)?;
        let give_back = |e| {
            self.accounts.give_memory(uid, len);
            e
        };
        let memory = MappedFd::map_client(fd, offset, len)
            .map_err(|e| give_back(DaemonError::BadMemory(e.to_string())))?;
        let drive = &self.drives[d];
        let mapping = drive.map(&memory, self.domain).map_err(give_back)?;
        drive.registrations.fetch_add(1, Ordering::Relaxed);
        let (id, iova) = (self.next_id, mapping.pages()[0]);
        self.next_id += 1;
        let memory = Arc::new(memory);
        if drive.mediated() {
            self.regions_of(d).insert(iova, memory.clone());
        }
        self.memory.insert(id, Registration { drive: d, memory, mapping });
        Ok((Response::MemoryRegistered { id, iova, len }, Vec::new()))
    }

    fn unregister(&mut self, id: u64) -> Result<Reply, DaemonError> {
        let r = self.memory.remove(&id).ok_or(DaemonError::NotOwned { what: "memory", id })?;
        self.unmap(r);
        Ok((Response::Done, Vec::new()))
    }

    /// Unmaps a registration; on failure keeps its memory mapped forever
    /// (the device might still reach it). On a mediated drive it is first
    /// taken out of the ranges PRPs may name, and the commands forwarded
    /// before are waited for (they may name it) up to [`UNREGISTER_DRAIN`];
    /// past that it is deferred, still mapped and charged
    /// ([`Session::finish_deferred`]). On a drive where a queue of this
    /// connection is quarantined it stays mapped (and counted in the
    /// drive's registrations): that queue's commands were released from
    /// the wait when its forwarding stopped, yet may still be live.
    fn unmap(&mut self, r: Registration) {
        let drive = &self.drives[r.drive];
        let iova = r.mapping.pages()[0];
        if self.quarantined.contains(&r.drive) {
            if let Some(regions) = self.regions.get(&r.drive) {
                regions.begin_remove(iova);
            }
            tracing::warn!(drive = %drive.name, iova, "a queue of this client is quarantined; keeping its memory mapped");
            self.accounts.give_memory(self.peer.uid, r.memory.len() as u64);
            std::mem::forget(r);
            return;
        }
        if let Some(regions) = self.regions.get(&r.drive) {
            let epoch = regions.begin_remove(iova);
            if !regions.wait_drained(epoch, UNREGISTER_DRAIN) {
                tracing::info!(drive = %drive.name, iova, "commands naming the memory still run; unmapping it once they complete");
                self.deferred.push((r, epoch));
                return;
            }
        }
        self.unmap_now(r);
    }

    /// The last step of an unregistration, once no command may name the
    /// memory: out of the drive's count and the uid's charge, unmapped.
    fn unmap_now(&self, r: Registration) {
        let drive = &self.drives[r.drive];
        drive.registrations.fetch_sub(1, Ordering::Relaxed);
        self.accounts.give_memory(self.peer.uid, r.memory.len() as u64);
        if let Err(e) = drive.device().dma_unmap(&r.mapping) {
            tracing::error!(drive = %drive.name, error = %e, "unmapping client memory failed; keeping it");
            std::mem::forget(r);
        }
    }

    /// Finishes the deferred unregistrations whose commands have completed
    /// (waiting up to `wait` for each); the others stay deferred.
    fn finish_deferred(&mut self, wait: std::time::Duration) {
        for (r, epoch) in std::mem::take(&mut self.deferred) {
            let drained = self.regions.get(&r.drive).is_none_or(|g| g.wait_drained(epoch, wait));
            if drained {
                self.unmap_now(r);
            } else {
                self.deferred.push((r, epoch));
            }
        }
    }

    /// Reclaims everything now (the same as dropping the session, which
    /// does it on every path out of a connection thread, a panic
    /// included).
    pub fn reclaim(self) {
        drop(self);
    }

    /// Every SQ deleted (the controller aborts what it had fetched), then
    /// every CQ, then the rings and the client's memory unmapped, and the
    /// qids returned to the pool. A queue whose deletion failed is
    /// quarantined, and with it all the client's memory on that drive stays
    /// mapped (the drive might still DMA into it). Idempotent: what it
    /// reclaimed is gone from the session.
    fn reclaim_all(&mut self) {
        let queues = std::mem::take(&mut self.queues);
        let sq_ok: Vec<bool> = queues.iter().map(|(d, r)| self.drives[*d].delete_sq(r.qid)).collect();
        for ((d, rings), ok) in queues.into_iter().zip(sq_ok) {
            self.accounts.give_queue(self.peer.uid, d);
            let drive = &self.drives[d];
            if ok && drive.delete_cq(rings.qid) {
                drive.reclaim_rings(rings);
            } else {
                self.quarantined.push(d);
                drive.quarantine(rings);
            }
        }
        // On a drive in `quarantined`, `unmap` keeps the memory mapped.
        for (_, r) in std::mem::take(&mut self.memory) {
            self.unmap(r);
        }
        // Every SQ is gone (its commands completed or aborted), so what was
        // deferred drains now; what does not (a broken controller) stays
        // mapped for good, given back to the uid's charge.
        self.finish_deferred(UNREGISTER_DRAIN);
        for (r, _) in std::mem::take(&mut self.deferred) {
            tracing::error!(drive = %self.drives[r.drive].name, "commands naming client memory never completed; keeping it mapped");
            self.accounts.give_memory(self.peer.uid, r.memory.len() as u64);
            std::mem::forget(r);
        }
    }
}

impl Drop for Session {
    /// Reclaims in the order that keeps the drive out of freed memory (SQ
    /// delete, CQ delete, unmap, free), also when the connection thread
    /// unwinds from a panic: before, reclaim was an explicit call at the
    /// thread's end, and a panic dropped the rings and registrations while
    /// the controller still had their SQs.
    fn drop(&mut self) {
        self.reclaim_all();
    }
}

#[cfg(test)]
mod tests {
    use std::panic::AssertUnwindSafe;

    use tuttid_proto::SharedMemory;

    use super::*;
    use crate::accounts::Limits;
    use crate::config::DaemonConfig;

    #[test]
    fn a_drive_failure_keeps_its_cause_for_a_caller_to_match() {
        let uid = rustix::process::getuid().as_raw();
        let yaml = format!(
            "socket: /nonexistent/t.sock\ndrives:\n  d0:\n    device: {{ emulated: {{ namespaces: [ {{ capacity: 8MiB, block_size: 4096 }} ] }} }}\n    nsid: 2\n    allow: {{ uids: [{uid}] }}\n"
        );
        let cfg = DaemonConfig::from_yaml(&yaml).unwrap();
        let e = Drive::start("d0", &cfg.drives["d0"], None).expect_err("namespace 2 does not exist");
        match &e {
            DaemonError::Drive { drive, what, source: Some(cause) } => {
                assert_eq!((drive.as_str(), what.as_str()), ("d0", "namespace"));
                let ns = cause.downcast_ref::<nvm_queue::NamespaceError>();
                assert!(
                    matches!(ns, Some(nvm_queue::NamespaceError::NotActive { nsid: 2, .. })),
                    "{cause:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        // The client's refusal carries the whole chain.
        let (r, _) = refuse(e);
        let Response::Refused { detail, .. } = r else { panic!("{r:?}") };
        assert!(detail.starts_with("drive \"d0\": namespace: ") && detail.len() > 30, "{detail}");
    }

    #[test]
    fn a_panicking_connection_thread_still_reclaims_queues_then_memory() {
        let uid = rustix::process::getuid().as_raw();
        let yaml = format!(
            "socket: /nonexistent/t.sock\ndrives:\n  d0:\n    device: {{ emulated: {{ namespaces: [ {{ capacity: 8MiB, block_size: 4096 }} ], io_queues: 8 }} }}\n    allow: {{ uids: [{uid}] }}\n    queues_per_client: 4\n"
        );
        let cfg = DaemonConfig::from_yaml(&yaml).unwrap();
        let drives = Arc::new(vec![Drive::start("d0", &cfg.drives["d0"], None).unwrap()]);
        let accounts = Arc::new(Accounts::new(Limits {
            connections_per_uid: 4,
            max_connections: 4,
            registrations_per_uid: 4,
            memory_per_uid: 16 << 20,
        }));
        let free_before = drives[0].status().queues_free;
        let peer = Peer { pid: 1, uid, gid: rustix::process::getgid().as_raw() };
        let mut s =
            Session::new(peer, drives.clone(), (accounts.clone(), LeaseEnd(Arc::new(|| {}))), 3000, 7);
        s.hello(&Request::Hello { version: PROTOCOL_VERSION }).unwrap();
        for req in [
            Request::OpenDrive { drive: "d0".into() },
            Request::GrantQueue { drive: "d0".into(), entries: 16 },
        ] {
            let (r, _) = s.handle(req, Vec::new());
            assert!(!matches!(r, Response::Refused { .. }), "{r:?}");
        }
        let shm = SharedMemory::new(1 << 20).unwrap();
        let fd = shm.fd().try_clone_to_owned().unwrap();
        let (r, _) =
            s.handle(Request::RegisterMemory { drive: "d0".into(), offset: 0, len: 1 << 20 }, vec![fd]);
        assert!(matches!(r, Response::MemoryRegistered { .. }), "{r:?}");
        assert_eq!(accounts.queues(uid, 0), 1);
        assert_eq!(drives[0].status().registrations, 1);
        assert_eq!(drives[0].status().queues_free, free_before - 1);
        // A bug in the connection thread: the session goes down with it.
        let r = std::panic::catch_unwind(AssertUnwindSafe(move || {
            let _session = s;
            panic!("a bug in a connection thread");
        }));
        assert!(r.is_err());
        assert_eq!(accounts.queues(uid, 0), 0, "the queue pair was given back");
        let st = drives[0].status();
        assert_eq!((st.queues_free, st.registrations, st.quarantined), (free_before, 0, 0), "{st:?}");
        assert_eq!(st.dma_faults, 0);
        drop(shm);
    }
}
