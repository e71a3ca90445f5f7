//! The typed messages of the protocol and their payload encoding. A
//! payload is one tag byte and the message's fields in order
//! ([`crate::codec`]). File descriptors travel beside the payload in the
//! same frame (SCM_RIGHTS); [`Request::fds`] and [`Response::fds`] say how
//! many each message carries.

use crate::codec::{Reader, Writer, MAX_LIST};
use crate::error::{DecodeError, Rule};

/// A client's request to the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// First message of every connection: the client's protocol version.
    Hello {
        /// [`crate::PROTOCOL_VERSION`] of the client.
        version: u32,
    },
    /// Facts about a drive the client is allowed to use.
    OpenDrive {
        /// Drive name from the daemon's config.
        drive: String,
    },
    /// A new I/O queue pair on `drive` with (up to) `entries` entries per
    /// ring. The reply carries 3 fds: SQ ring, CQ ring, doorbell page.
    GrantQueue {
        /// Drive name.
        drive: String,
        /// Entries per ring (clamped to CAP.MQES + 1 by the daemon).
        entries: u32,
    },
    /// Gives queue pair `qid` of `drive` back (SQ deleted, then CQ).
    ReleaseQueue {
        /// Drive name.
        drive: String,
        /// Queue identifier.
        qid: u16,
    },
    /// Maps `len` bytes at byte `offset` of the memfd sent with the message
    /// (1 fd) for `drive`'s DMA. Both page aligned.
    RegisterMemory {
        /// Drive name.
        drive: String,
        /// Offset in the memfd, bytes.
        offset: u64,
        /// Length, bytes.
        len: u64,
    },
    /// Unmaps memory registered under `id`.
    UnregisterMemory {
        /// The id the daemon returned.
        id: u64,
    },
    /// Keeps the lease alive.
    Heartbeat,
    /// The operator view: drives, clients, queues, lease ages.
    Status,
}

/// A daemon reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Handshake accepted.
    HelloOk {
        /// The daemon's protocol version (equal to the client's).
        version: u32,
        /// Lease: a connection silent this long is reclaimed, ms.
        lease_ms: u32,
    },
    /// Facts of an opened drive.
    DriveFacts(DriveFacts),
    /// A granted queue pair; 3 fds ride along: SQ ring memfd, CQ ring
    /// memfd, doorbell page memfd (mapped at offset 0 for 4096 bytes).
    QueueGranted(QueueGrant),
    /// The request succeeded and returns nothing.
    Done,
    /// Memory mapped for DMA at consecutive device addresses.
    MemoryRegistered {
        /// Id for [`Request::UnregisterMemory`].
        id: u64,
        /// Device address (IOVA) of the first byte.
        iova: u64,
        /// Mapped length, bytes.
        len: u64,
    },
    /// Operator view.
    Status(StatusReport),
    /// The request was refused by `rule`.
    Refused {
        /// The rule.
        rule: Rule,
        /// Explanation.
        detail: String,
    },
}

/// What a client needs to know about a drive to drive its granted queues.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DriveFacts {
    /// Drive name.
    pub drive: String,
    /// Namespace the daemon serves (NSID).
    pub nsid: u32,
    /// Logical block size, bytes.
    pub block_size: u32,
    /// Namespace size, logical blocks (NSZE).
    pub blocks: u64,
    /// Largest transfer of one command, bytes (from MDTS).
    pub max_transfer: u64,
    /// Memory page size, bytes (2^(12 + CC.MPS)).
    pub page_size: u32,
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// CAP.MQES (zero-based).
    pub mqes: u16,
    /// Bytes of the register window the doorbell offsets refer to.
    pub bar_len: u64,
    /// Queue pairs this client may still be granted on the drive.
    pub quota_left: u16,
    /// The drive reports a volatile write cache.
    pub volatile_write_cache: bool,
}

/// One granted I/O queue pair.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueGrant {
    /// Queue identifier (SQID = CQID).
    pub qid: u16,
    /// Entries per ring.
    pub entries: u32,
    /// Device address of the SQ ring.
    pub sq_iova: u64,
    /// Device address of the CQ ring.
    pub cq_iova: u64,
    /// Byte length of the SQ ring memfd (whole pages).
    pub sq_len: u64,
    /// Byte length of the CQ ring memfd (whole pages).
    pub cq_len: u64,
    /// Offset in the register window of the 4096-byte page holding this
    /// pair's SQ tail and CQ head doorbells.
    pub doorbell_page: u64,
}

/// The operator view of the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusReport {
    /// One row per drive.
    pub drives: Vec<DriveStatus>,
    /// One row per connected client.
    pub clients: Vec<ClientStatus>,
    /// Clients reclaimed since start (connection closed or lease expired).
    pub reclaimed: u64,
}

/// One drive in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DriveStatus {
    /// Name.
    pub name: String,
    /// I/O queue pairs the daemon can grant on it.
    pub queues_total: u16,
    /// Of those, not granted now.
    pub queues_free: u16,
    /// Memory registrations live on it.
    pub registrations: u32,
    /// Emulated drives: device accesses outside every mapping (nvme-emu's
    /// `dma_faults`); 0 for PCI drives.
    pub dma_faults: u64,
    /// Emulated drives: commands aborted by SQ deletion.
    pub sq_deletion_aborts: u64,
    /// Queue pairs whose deletion failed: their memory is kept (leaked)
    /// rather than given back while the drive might still DMA into it.
    pub quarantined: u32,
    /// Forwarded or mediated drives: counters of the forwarding thread
    /// (all 0 on doorbell pages).
    pub forwarding: ForwardingCounters,
}

/// What a drive's forwarding thread did since the daemon started
/// (docs/tuttid.md, "Forwarded doorbells", "Mediated submission").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ForwardingCounters {
    /// Doorbell values written to the controller.
    pub doorbells_forwarded: u64,
    /// Shadow doorbell values refused (each ended a client's lease).
    pub doorbells_invalid: u64,
    /// Mediated: SQEs checked and copied into a real SQ.
    pub sqes_mediated: u64,
    /// Mediated: SQEs refused, completed by the daemon with their status.
    pub sqes_refused: u64,
    /// Mediated: controller completions naming no outstanding command
    /// (dropped).
    pub stray_completions: u64,
}

/// One client in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientStatus {
    /// Peer pid (SO_PEERCRED).
    pub pid: u32,
    /// Peer uid.
    pub uid: u32,
    /// Peer gid.
    pub gid: u32,
    /// Milliseconds since the connection was accepted.
    pub connected_ms: u64,
    /// Milliseconds since its last message (the lease expires at the
    /// configured timeout).
    pub idle_ms: u64,
    /// Its queue pairs: (drive, qid).
    pub queues: Vec<(String, u16)>,
    /// Bytes of memory it has registered (all drives).
    pub memory_bytes: u64,
}

mod tag {
    pub const HELLO: u8 = 0x01;
    pub const OPEN_DRIVE: u8 = 0x02;
    pub const GRANT_QUEUE: u8 = 0x03;
    pub const RELEASE_QUEUE: u8 = 0x04;
    pub const REGISTER_MEMORY: u8 = 0x05;
    pub const UNREGISTER_MEMORY: u8 = 0x06;
    pub const HEARTBEAT: u8 = 0x07;
    pub const STATUS: u8 = 0x08;
    pub const HELLO_OK: u8 = 0x81;
    pub const DRIVE_FACTS: u8 = 0x82;
    pub const QUEUE_GRANTED: u8 = 0x83;
    pub const DONE: u8 = 0x84;
    pub const MEMORY_REGISTERED: u8 = 0x85;
    pub const STATUS_REPORT: u8 = 0x86;
    pub const REFUSED: u8 = 0x87;
}

impl Request {
    /// File descriptors this request carries.
    pub fn fds(&self) -> usize {
        usize::from(matches!(self, Request::RegisterMemory { .. }))
    }

    /// A short name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "Hello",
            Request::OpenDrive { .. } => "OpenDrive",
            Request::GrantQueue { .. } => "GrantQueue",
            Request::ReleaseQueue { .. } => "ReleaseQueue",
            Request::RegisterMemory { .. } => "RegisterMemory",
            Request::UnregisterMemory { .. } => "UnregisterMemory",
            Request::Heartbeat => "Heartbeat",
            Request::Status => "Status",
        }
    }

    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Request::Hello { version } => {
                w.u8(tag::HELLO);
                w.u32(*version);
            }
            Request::OpenDrive { drive } => {
                w.u8(tag::OPEN_DRIVE);
                w.str(drive);
            }
            Request::GrantQueue { drive, entries } => {
                w.u8(tag::GRANT_QUEUE);
                w.str(drive);
                w.u32(*entries);
            }
            Request::ReleaseQueue { drive, qid } => {
                w.u8(tag::RELEASE_QUEUE);
                w.str(drive);
                w.u16(*qid);
            }
            Request::RegisterMemory { drive, offset, len } => {
                w.u8(tag::REGISTER_MEMORY);
                w.str(drive);
                w.u64(*offset);
                w.u64(*len);
            }
            Request::UnregisterMemory { id } => {
                w.u8(tag::UNREGISTER_MEMORY);
                w.u64(*id);
            }
            Request::Heartbeat => w.u8(tag::HEARTBEAT),
            Request::Status => w.u8(tag::STATUS),
        }
        w.into_bytes()
    }

    /// Decodes a payload: a request, or the first rule it breaks.
    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(payload);
        let req = match r.u8("tag")? {
            tag::HELLO => Request::Hello { version: r.u32("version")? },
            tag::OPEN_DRIVE => Request::OpenDrive { drive: r.string("drive")? },
            tag::GRANT_QUEUE => Request::GrantQueue { drive: r.string("drive")?, entries: r.u32("entries")? },
            tag::RELEASE_QUEUE => Request::ReleaseQueue { drive: r.string("drive")?, qid: r.u16("qid")? },
            tag::REGISTER_MEMORY => Request::RegisterMemory {
                drive: r.string("drive")?,
                offset: r.u64("offset")?,
                len: r.u64("len")?,
            },
            tag::UNREGISTER_MEMORY => Request::UnregisterMemory { id: r.u64("id")? },
            tag::HEARTBEAT => Request::Heartbeat,
            tag::STATUS => Request::Status,
            t => return Err(DecodeError::UnknownTag { tag: t }),
        };
        r.finish()?;
        Ok(req)
    }
}

impl Response {
    /// File descriptors this reply carries.
    pub fn fds(&self) -> usize {
        if matches!(self, Response::QueueGranted(_)) {
            3
        } else {
            0
        }
    }

    /// A short name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Response::HelloOk { .. } => "HelloOk",
            Response::DriveFacts(_) => "DriveFacts",
            Response::QueueGranted(_) => "QueueGranted",
            Response::Done => "Done",
            Response::MemoryRegistered { .. } => "MemoryRegistered",
            Response::Status(_) => "Status",
            Response::Refused { .. } => "Refused",
        }
    }

    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Response::HelloOk { version, lease_ms } => {
                w.u8(tag::HELLO_OK);
                w.u32(*version);
                w.u32(*lease_ms);
            }
            Response::DriveFacts(f) => {
                w.u8(tag::DRIVE_FACTS);
                encode_facts(&mut w, f);
            }
            Response::QueueGranted(g) => {
                w.u8(tag::QUEUE_GRANTED);
                encode_grant(&mut w, g);
            }
            Response::Done => w.u8(tag::DONE),
            Response::MemoryRegistered { id, iova, len } => {
                w.u8(tag::MEMORY_REGISTERED);
                w.u64(*id);
                w.u64(*iova);
                w.u64(*len);
            }
            Response::Status(s) => {
                w.u8(tag::STATUS_REPORT);
                encode_status(&mut w, s);
            }
            Response::Refused { rule, detail } => {
                w.u8(tag::REFUSED);
                w.u8(*rule as u8);
                w.str(detail);
            }
        }
        w.into_bytes()
    }

    /// Decodes a payload: a reply, or the first rule it breaks.
    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(payload);
        let resp = match r.u8("tag")? {
            tag::HELLO_OK => Response::HelloOk { version: r.u32("version")?, lease_ms: r.u32("lease_ms")? },
            tag::DRIVE_FACTS => Response::DriveFacts(decode_facts(&mut r)?),
            tag::QUEUE_GRANTED => Response::QueueGranted(decode_grant(&mut r)?),
            tag::DONE => Response::Done,
            tag::MEMORY_REGISTERED => {
                Response::MemoryRegistered { id: r.u64("id")?, iova: r.u64("iova")?, len: r.u64("len")? }
            }
            tag::STATUS_REPORT => Response::Status(decode_status(&mut r)?),
            tag::REFUSED => {
                let b = r.u8("rule")?;
                let rule =
                    Rule::from_u8(b).ok_or(DecodeError::BadValue { field: "rule", value: u64::from(b) })?;
                Response::Refused { rule, detail: r.string("detail")? }
            }
            t => return Err(DecodeError::UnknownTag { tag: t }),
        };
        r.finish()?;
        Ok(resp)
    }
}

fn encode_facts(w: &mut Writer, f: &DriveFacts) {
    w.str(&f.drive);
    w.u32(f.nsid);
    w.u32(f.block_size);
    w.u64(f.blocks);
    w.u64(f.max_transfer);
    w.u32(f.page_size);
    w.u8(f.dstrd);
    w.u16(f.mqes);
    w.u64(f.bar_len);
    w.u16(f.quota_left);
    w.bool(f.volatile_write_cache);
}

fn decode_facts(r: &mut Reader<'_>) -> Result<DriveFacts, DecodeError> {
    Ok(DriveFacts {
        drive: r.string("drive")?,
        nsid: r.u32("nsid")?,
        block_size: r.u32("block_size")?,
        blocks: r.u64("blocks")?,
        max_transfer: r.u64("max_transfer")?,
        page_size: r.u32("page_size")?,
        dstrd: r.u8("dstrd")?,
        mqes: r.u16("mqes")?,
        bar_len: r.u64("bar_len")?,
        quota_left: r.u16("quota_left")?,
        volatile_write_cache: r.bool("volatile_write_cache")?,
    })
}

fn encode_grant(w: &mut Writer, g: &QueueGrant) {
    w.u16(g.qid);
    w.u32(g.entries);
    w.u64(g.sq_iova);
    w.u64(g.cq_iova);
    w.u64(g.sq_len);
    w.u64(g.cq_len);
    w.u64(g.doorbell_page);
}

fn decode_grant(r: &mut Reader<'_>) -> Result<QueueGrant, DecodeError> {
    Ok(QueueGrant {
        qid: r.u16("qid")?,
        entries: r.u32("entries")?,
        sq_iova: r.u64("sq_iova")?,
        cq_iova: r.u64("cq_iova")?,
        sq_len: r.u64("sq_len")?,
        cq_len: r.u64("cq_len")?,
        doorbell_page: r.u64("doorbell_page")?,
    })
}

fn encode_status(w: &mut Writer, s: &StatusReport) {
    let drives = &s.drives[..s.drives.len().min(MAX_LIST)];
    w.len(drives.len());
    for d in drives {
        w.str(&d.name);
        w.u16(d.queues_total);
        w.u16(d.queues_free);
        w.u32(d.registrations);
        w.u64(d.dma_faults);
        w.u64(d.sq_deletion_aborts);
        w.u32(d.quarantined);
        let f = &d.forwarding;
        for v in
            [f.doorbells_forwarded, f.doorbells_invalid, f.sqes_mediated, f.sqes_refused, f.stray_completions]
        {
            w.u64(v);
        }
    }
    let clients = &s.clients[..s.clients.len().min(MAX_LIST)];
    w.len(clients.len());
    for c in clients {
        w.u32(c.pid);
        w.u32(c.uid);
        w.u32(c.gid);
        w.u64(c.connected_ms);
        w.u64(c.idle_ms);
        let qs = &c.queues[..c.queues.len().min(MAX_LIST)];
        w.len(qs.len());
        for (d, q) in qs {
            w.str(d);
            w.u16(*q);
        }
        w.u64(c.memory_bytes);
    }
    w.u64(s.reclaimed);
}

fn decode_status(r: &mut Reader<'_>) -> Result<StatusReport, DecodeError> {
    let mut s = StatusReport::default();
    for _ in 0..r.len("drives")? {
        s.drives.push(DriveStatus {
            name: r.string("drive.name")?,
            queues_total: r.u16("drive.queues_total")?,
            queues_free: r.u16("drive.queues_free")?,
            registrations: r.u32("drive.registrations")?,
            dma_faults: r.u64("drive.dma_faults")?,
            sq_deletion_aborts: r.u64("drive.sq_deletion_aborts")?,
            quarantined: r.u32("drive.quarantined")?,
            forwarding: ForwardingCounters {
                doorbells_forwarded: r.u64("drive.doorbells_forwarded")?,
                doorbells_invalid: r.u64("drive.doorbells_invalid")?,
                sqes_mediated: r.u64("drive.sqes_mediated")?,
                sqes_refused: r.u64("drive.sqes_refused")?,
                stray_completions: r.u64("drive.stray_completions")?,
            },
        });
    }
    for _ in 0..r.len("clients")? {
        let (pid, uid, gid) = (r.u32("client.pid")?, r.u32("client.uid")?, r.u32("client.gid")?);
        let (connected_ms, idle_ms) = (r.u64("client.connected_ms")?, r.u64("client.idle_ms")?);
        let mut queues = Vec::new();
        for _ in 0..r.len("client.queues")? {
            queues.push((r.string("client.queue.drive")?, r.u16("client.queue.qid")?));
        }
        let memory_bytes = r.u64("client.memory_bytes")?;
        s.clients.push(ClientStatus { pid, uid, gid, connected_ms, idle_ms, queues, memory_bytes });
    }
    s.reclaimed = r.u64("reclaimed")?;
    Ok(s)
}
