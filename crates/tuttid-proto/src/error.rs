//! Errors of the protocol layer: decoding ([`DecodeError`]), the rules the
//! daemon refuses a request by ([`Rule`]), and what a client call can
//! fail with ([`ClientError`]).

use std::fmt;

/// Why bytes are not a message. Every decoding failure is one of these,
/// never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The payload ended inside field `field`.
    #[error("message truncated in field {field} at byte {offset}")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Byte offset where it started.
        offset: usize,
    },
    /// A field holds a value the protocol does not define.
    #[error("field {field} has invalid value {value}")]
    BadValue {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// A string or list is longer than the protocol allows.
    #[error("field {field} is {len} long, more than the maximum {max}")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length (bytes or elements).
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A string field is not UTF-8.
    #[error("field {field} is not UTF-8")]
    NotUtf8 {
        /// The field.
        field: &'static str,
    },
    /// Bytes follow the last field.
    #[error("{extra} bytes after the end of the message")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// The message tag names no message of this direction.
    #[error("unknown message tag {tag:#04x}")]
    UnknownTag {
        /// The tag byte.
        tag: u8,
    },
    /// A frame header announced more than [`crate::MAX_FRAME`] bytes (or
    /// zero).
    #[error("frame length {len} is outside 1..={max}")]
    FrameLength {
        /// The announced length in bytes.
        len: u32,
        /// The limit in bytes.
        max: u32,
    },
    /// A frame header does not start with the protocol's magic number.
    #[error("bad frame magic {magic:#010x}")]
    BadMagic {
        /// What was there.
        magic: u32,
    },
    /// The message carries a different number of file descriptors than it
    /// needs.
    #[error("message needs {expected} file descriptors, {got} came with it")]
    FdCount {
        /// What the message type needs.
        expected: usize,
        /// What arrived.
        got: usize,
    },
}

/// The rule by which the daemon refused a request (carried on the wire as
/// one byte, with a human-readable detail).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Rule {
    /// The client's protocol version is not the daemon's.
    Version = 1,
    /// The first message of a connection must be `Hello`, and only once.
    HandshakeFirst = 2,
    /// The peer's uid and gid (SO_PEERCRED) are in none of the drive's
    /// allow lists.
    NotAllowed = 3,
    /// The client holds its quota of queue pairs on that drive already.
    Quota = 4,
    /// No drive of that name.
    UnknownDrive = 5,
    /// The queue or memory id names nothing this connection owns.
    NotOwned = 6,
    /// The request could not be decoded.
    Malformed = 7,
    /// Every I/O queue pair of the drive is granted already.
    PoolEmpty = 8,
    /// The memory offered cannot be mapped (not a sealed-size memfd range,
    /// misaligned, empty or too large).
    BadMemory = 9,
    /// A request field is out of range (queue entries, lengths).
    BadRequest = 10,
    /// The drive failed the operation (admin command, DMA mapping).
    Device = 11,
    /// The client holds its quota of registered memory already.
    MemoryQuota = 12,
}

impl Rule {
    /// The rule for wire byte `b`.
    pub fn from_u8(b: u8) -> Option<Self> {
        use Rule::*;
        Some(match b {
            1 => Version,
            2 => HandshakeFirst,
            3 => NotAllowed,
            4 => Quota,
            5 => UnknownDrive,
            6 => NotOwned,
            7 => Malformed,
            8 => PoolEmpty,
            9 => BadMemory,
            10 => BadRequest,
            11 => Device,
            12 => MemoryQuota,
            _ => return None,
        })
    }

    /// A short name of the rule, as in docs/tuttid.md.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Version => "protocol-version",
            Rule::HandshakeFirst => "handshake-first",
            Rule::NotAllowed => "allow-list",
            Rule::Quota => "queue-quota",
            Rule::UnknownDrive => "unknown-drive",
            Rule::NotOwned => "ownership",
            Rule::Malformed => "malformed-message",
            Rule::PoolEmpty => "queue-pool-empty",
            Rule::BadMemory => "memory-shape",
            Rule::BadRequest => "request-range",
            Rule::Device => "device",
            Rule::MemoryQuota => "memory-quota",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a client call failed with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon refused the request by `rule`.
    #[error("tuttid refused the request (rule {rule}): {detail}")]
    Refused {
        /// The rule that refused it.
        rule: Rule,
        /// The daemon's explanation.
        detail: String,
    },
    /// The socket failed or closed: the daemon is gone (or closed this
    /// connection). Every grant of the connection is void.
    #[error("connection to tuttid at {socket} lost during {during}")]
    Disconnected {
        /// The socket path.
        socket: String,
        /// The call that found it.
        during: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The daemon answered something that is not a message.
    #[error("tuttid sent an undecodable reply")]
    Decode(#[from] DecodeError),
    /// The daemon answered with a message of the wrong kind.
    #[error("tuttid answered {got} to {asked}")]
    UnexpectedReply {
        /// The request.
        asked: &'static str,
        /// The reply's kind.
        got: &'static str,
    },
    /// The process serving the socket runs as a user the client does not
    /// trust with its memory (not the configured daemon uid; by default
    /// neither root nor the client's own uid): nothing was sent to it.
    #[error(
        "the process serving {socket} runs as uid {uid}, not {expected}: refusing to send it anything (an impostor at the daemon's path?)"
    )]
    Impostor {
        /// The socket path.
        socket: String,
        /// The peer's uid (SO_PEERCRED).
        uid: u32,
        /// Who was expected, in words.
        expected: String,
    },
    /// Local setup failed (memfd, mmap).
    #[error("{op} failed")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}
