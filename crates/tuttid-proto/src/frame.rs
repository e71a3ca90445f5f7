//! Frames on the Unix stream socket: an 8-byte header (magic `TUTD`,
//! payload length, both little-endian u32) and the payload, with up to
//! [`MAX_FDS`] file descriptors attached to the frame's first byte
//! (SCM_RIGHTS). A frame longer than [`MAX_FRAME`], a wrong magic or more
//! descriptors than a frame may carry is a [`FrameError`], and the
//! connection is closed by whoever reads it.

use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::error::DecodeError;

/// Magic number at the start of every frame ("TUTD" in ASCII, read as a
/// little-endian u32).
pub const MAGIC: u32 = u32::from_le_bytes(*b"TUTD");

/// Largest payload of one frame, bytes.
pub const MAX_FRAME: u32 = 1 << 20;

/// Most file descriptors one frame carries.
pub const MAX_FDS: usize = 4;

/// Header bytes before each payload.
pub const HEADER_LEN: usize = 8;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The socket failed, timed out or was closed (`UnexpectedEof`).
    #[error("socket I/O")]
    Io(#[from] std::io::Error),
    /// The header or its descriptors break a framing rule.
    #[error("bad frame")]
    Decode(#[from] DecodeError),
}

impl FrameError {
    /// `true` when the socket's read timeout passed with no byte read.
    pub fn is_timeout(&self) -> bool {
        matches!(self, FrameError::Io(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
    }
}

/// A received frame: payload and the descriptors that came with it.
#[derive(Debug)]
pub struct Frame {
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// Descriptors (close-on-exec), in the order sent.
    pub fds: Vec<OwnedFd>,
}

/// Sends one frame: header, `payload` and `fds` in one `sendmsg` (the
/// descriptors are attached to its first byte), then the rest if the
/// kernel took only part.
///
/// # Errors
///
/// [`DecodeError::FrameLength`] for an empty payload or one over
/// [`MAX_FRAME`], [`DecodeError::FdCount`] for more than [`MAX_FDS`]
/// descriptors (nothing sent); socket errors.
pub fn send_frame(sock: &UnixStream, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), FrameError> {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    if len == 0 || len > MAX_FRAME {
        return Err(DecodeError::FrameLength { len, max: MAX_FRAME }.into());
    }
    if fds.len() > MAX_FDS {
        return Err(DecodeError::FdCount { expected: MAX_FDS, got: fds.len() }.into());
    }
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&MAGIC.to_le_bytes());
    header[4..].copy_from_slice(&len.to_le_bytes());
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(DecodeError::FdCount { expected: MAX_FDS, got: fds.len() }.into());
    }
    let mut all = Vec::with_capacity(HEADER_LEN + payload.len());
    all.extend_from_slice(&header);
    all.extend_from_slice(payload);
    let sent = loop {
        match sendmsg(sock, &[IoSlice::new(&all)], &mut control, SendFlags::NOSIGNAL) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    };
    let mut rest = &all[sent..];
    while !rest.is_empty() {
        match rustix::net::send(sock, rest, SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
            Ok(n) => rest = &rest[n..],
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
    Ok(())
}

/// Reads the first bytes of a frame together with any descriptors.
fn recv_head(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize, FrameError> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        match recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(m) => break m,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    };
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(DecodeError::FdCount { expected: MAX_FDS, got: MAX_FDS + 1 }.into());
    }
    if msg.bytes == 0 {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    Ok(msg.bytes)
}

/// Receives one frame, blocking up to the socket's read timeout for its
/// first byte.
///
/// # Errors
///
/// Socket errors (`UnexpectedEof` when the peer closed); a bad magic, a
/// length of 0 or over [`MAX_FRAME`], or more than [`MAX_FDS`]
/// descriptors ([`FrameError::Decode`]; descriptors received are closed).
pub fn recv_frame(sock: &UnixStream) -> Result<Frame, FrameError> {
    let mut fds = Vec::new();
    let mut header = [0u8; HEADER_LEN];
    let mut got = recv_head(sock, &mut header, &mut fds)?;
    let mut r = sock;
    while got < HEADER_LEN {
        let n = r.read(&mut header[got..])?;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        got += n;
    }
    let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if magic != MAGIC {
        return Err(DecodeError::BadMagic { magic }.into());
    }
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len == 0 || len > MAX_FRAME {
        return Err(DecodeError::FrameLength { len, max: MAX_FRAME }.into());
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(Frame { payload, fds })
}

/// Borrows each descriptor of `fds`.
pub fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(|f| f.as_fd()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_fds_round_trip() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        send_frame(&a, b"hello", &[f.as_fd()]).unwrap();
        send_frame(&a, b"x", &[]).unwrap();
        let got = recv_frame(&b).unwrap();
        assert_eq!(got.payload, b"hello");
        assert_eq!(got.fds.len(), 1);
        let got = recv_frame(&b).unwrap();
        assert_eq!((got.payload.as_slice(), got.fds.len()), (&b"x"[..], 0));
        assert!(send_frame(&a, &[], &[]).is_err());
        // A hostile header: wrong magic, then an oversized length.
        use std::io::Write;
        (&a).write_all(&[0xAB; 8]).unwrap();
        assert!(matches!(recv_frame(&b), Err(FrameError::Decode(DecodeError::BadMagic { .. }))));
        let mut h = MAGIC.to_le_bytes().to_vec();
        h.extend_from_slice(&(MAX_FRAME + 1).to_le_bytes());
        (&a).write_all(&h).unwrap();
        assert!(matches!(recv_frame(&b), Err(FrameError::Decode(DecodeError::FrameLength { .. }))));
        drop(a);
        assert!(
            matches!(recv_frame(&b), Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof)
        );
    }
}
