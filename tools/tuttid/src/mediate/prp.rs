//! PRP checks and list copies (NVMe Base 2.0, 4.1.1 "Physical Region Page
//! Entry and List"). Memory page size `page` (CC.MPS); a transfer of
//! `bytes` from PRP1:
//!
//! - PRP1 is dword aligned and may start inside a page; it covers up to
//!   the end of that page.
//! - Fits in PRP1's page: PRP2 is not used (the copy gets 0).
//! - One more page: PRP2 is that page (offset 0).
//! - More: PRP2 points to a PRP list (qword aligned, may have an offset);
//!   every entry is a page (offset 0); when more entries are needed than
//!   a list page holds, its last entry points to the next list page.
//!
//! Every data page must lie inside the client's own registrations, and so
//! must every list page it names (the daemon reads the list from there).
//! The entries are copied into daemon-owned list pages as they are
//! checked, and the copied SQE's PRP2 points at that copy: the controller
//! never reads a list the client can still change.

use nvm_queue::Mmio;

use super::regions::View;
use super::Refusal;

/// Daemon-owned PRP list pages of one command: `pages` pages from byte
/// `offset` of `mmio`, at device address `iova`.
#[derive(Debug)]
pub struct ListOut<'a> {
    /// The list memory (daemon's, mapped for the device).
    pub mmio: &'a Mmio,
    /// Byte offset of the command's first list page in `mmio`.
    pub offset: usize,
    /// Device address of that page.
    pub iova: u64,
    /// List pages the command may use.
    pub pages: usize,
}

/// List pages needed for `n` entries of `per_page` per page (the last
/// entry of a full page becomes the pointer to the next).
pub fn list_pages(n: u64, per_page: u64) -> u64 {
    if n <= per_page {
        return u64::from(n > 0);
    }
    1 + (n - per_page).div_ceil(per_page - 1)
}

/// Writes entries into [`ListOut`] with the daemon's own chaining.
struct Writer<'a, 'b> {
    out: &'b ListOut<'a>,
    per_page: usize,
    page: usize,
    slot: usize,
    left: u64,
}

impl Writer<'_, '_> {
    fn push(&mut self, entry: u64, page_size: u64) -> Result<(), Refusal> {
        let too_long = Refusal::TooLong { bytes: self.left, max: 0 };
        if self.slot == self.per_page - 1 && self.left > 1 {
            // Last slot of this page and more than one entry to go: chain.
            let next = self.page + 1;
            if next >= self.out.pages {
                return Err(too_long);
            }
            self.put(self.out.iova + next as u64 * page_size)?;
            self.page = next;
            self.slot = 0;
        }
        self.put(entry)?;
        self.left -= 1;
        Ok(())
    }

    fn put(&mut self, v: u64) -> Result<(), Refusal> {
        let at = self.out.offset + (self.page * self.per_page + self.slot) * 8;
        self.out.mmio.write64(at, v).map_err(|_| Refusal::TooLong { bytes: self.left, max: 0 })?;
        self.slot += 1;
        Ok(())
    }
}

/// Checks the data pointers of a transfer of `bytes` (> 0) and returns the
/// PRP1 and PRP2 for the controller's copy (PRP2 = 0 when unused, or the
/// daemon's list copy in `out`).
///
/// # Errors
///
/// [`Refusal::PrpOffset`], [`Refusal::NotOwned`], [`Refusal::TooLong`]
/// (more list pages than `out` has).
pub fn check(
    prp1: u64,
    prp2: u64,
    bytes: u64,
    page: u64,
    mem: &View<'_>,
    out: &ListOut<'_>,
) -> Result<(u64, u64), Refusal> {
    if !prp1.is_multiple_of(4) {
        return Err(Refusal::PrpOffset { which: "PRP1", addr: prp1 });
    }
    let first = bytes.min(page - prp1 % page);
    if !mem.owns(prp1, first) {
        return Err(Refusal::NotOwned { which: "PRP1", addr: prp1, len: first });
    }
    let rest = bytes - first;
    if rest == 0 {
        return Ok((prp1, 0));
    }
    if rest <= page {
        if !prp2.is_multiple_of(page) {
            return Err(Refusal::PrpOffset { which: "PRP2", addr: prp2 });
        }
        if !mem.owns(prp2, rest) {
            return Err(Refusal::NotOwned { which: "PRP2", addr: prp2, len: rest });
        }
        return Ok((prp1, prp2));
    }
    copy_list(prp2, rest, page, mem, out)?;
    Ok((prp1, out.iova))
}

/// Walks the client's PRP list at `list` for `rest` bytes (more than one
/// page), checking every entry and writing it into `out`.
fn copy_list(list: u64, rest: u64, page: u64, mem: &View<'_>, out: &ListOut<'_>) -> Result<(), Refusal> {
    if !list.is_multiple_of(8) {
        return Err(Refusal::PrpOffset { which: "PRP2", addr: list });
    }
    let n = rest.div_ceil(page);
    let per_page = (page / 8) as usize;
    let mut w = Writer { out, per_page, page: 0, slot: 0, left: n };
    let mut buf = [0u64; 512];
    let (mut src, mut done) = (list, 0u64);
    while done < n {
        // Entries left in this client list page, and whether its last one
        // is a pointer to the next page (more entries needed than fit).
        let room = (page - src % page) / 8;
        let chained = n - done > room;
        let take = (if chained { room } else { n - done }).min(buf.len() as u64) as usize;
        let ends_page = chained && take as u64 == room;
        let chunk = &mut buf[..take];
        if !mem.read_u64s(src, chunk) {
            return Err(Refusal::NotOwned { which: "PRP list page", addr: src, len: take as u64 * 8 });
        }
        let data = if ends_page { take - 1 } else { take };
        for &e in &chunk[..data] {
            let len = page.min(rest - done * page);
            if !e.is_multiple_of(page) {
                return Err(Refusal::PrpOffset { which: "PRP list entry", addr: e });
            }
            if !mem.owns(e, len) {
                return Err(Refusal::NotOwned { which: "PRP list entry", addr: e, len });
            }
            w.push(e, page)?;
            done += 1;
        }
        src = if ends_page { chunk[take - 1] } else { src + take as u64 * 8 };
        if ends_page && !src.is_multiple_of(page) {
            return Err(Refusal::PrpOffset { which: "PRP list pointer", addr: src });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::mediate::Regions;
    use tuttid_proto::shm::{sealed_memfd, MappedFd, PAGE};

    const P: u64 = PAGE as u64;
    const BASE: u64 = 0x100000;

    fn mapped(pages: usize) -> Arc<MappedFd> {
        Arc::new(MappedFd::map(sealed_memfd("p", pages * PAGE).unwrap(), 0, (pages * PAGE) as u64).unwrap())
    }

    /// A client registration of 8 pages at BASE whose page 7 is a list
    /// holding `entries` (from its start).
    fn client(entries: &[u64]) -> (Regions, Arc<MappedFd>) {
        let m = mapped(8);
        for (i, e) in entries.iter().enumerate() {
            // SAFETY: test memory, in bounds, no other user.
            #[allow(unsafe_code)]
            unsafe {
                m.as_ptr().add(7 * PAGE + i * 8).cast::<u64>().write(e.to_le());
            }
        }
        let r = Regions::default();
        r.insert(BASE, m.clone());
        (r, m)
    }

    #[allow(unsafe_code)]
    fn out_mmio(m: &MappedFd) -> Mmio {
        // SAFETY: `m` outlives the Mmio in each test and is only accessed
        // through it.
        unsafe { Mmio::new(m.as_ptr(), m.len()) }.unwrap()
    }

    #[test]
    fn single_two_page_and_list_transfers_pass_and_lists_are_copied() {
        let pg = |i: u64| BASE + i * P;
        let (r, _m) = client(&[pg(1), pg(2), pg(3)]);
        let lm = mapped(2);
        let mmio = out_mmio(&lm);
        let out = ListOut { mmio: &mmio, offset: 0, iova: 0x900000, pages: 2 };
        let v = r.view();
        assert_eq!(check(pg(0) + 512, 99, 512, P, &v, &out), Ok((pg(0) + 512, 0)));
        assert_eq!(check(pg(0) + 512, pg(1), P, P, &v, &out), Ok((pg(0) + 512, pg(1))));
        assert_eq!(check(pg(0), pg(7), 4 * P, P, &v, &out), Ok((pg(0), 0x900000)));
        assert_eq!(
            [mmio.read64(0).unwrap(), mmio.read64(8).unwrap(), mmio.read64(16).unwrap()],
            [pg(1), pg(2), pg(3)]
        );
        // The client rewriting its list now changes nothing the controller reads.
        assert_eq!(list_pages(511, 512), 1);
        assert_eq!(list_pages(512, 512), 1);
        assert_eq!(list_pages(513, 512), 2);
        assert_eq!(list_pages(0, 512), 0);
    }

    #[test]
    fn foreign_or_misaligned_pointers_are_refused() {
        let pg = |i: u64| BASE + i * P;
        let foreign = BASE + 64 * P;
        let (r, _m) = client(&[pg(1), foreign, pg(3)]);
        let lm = mapped(1);
        let mmio = out_mmio(&lm);
        let out = ListOut { mmio: &mmio, offset: 0, iova: 0x900000, pages: 1 };
        let v = r.view();
        let owned = |e: &Result<(u64, u64), Refusal>, w: &str| matches!(e, Err(Refusal::NotOwned { which, .. }) if *which == w);
        assert!(owned(&check(foreign, 0, 512, P, &v, &out), "PRP1"));
        assert!(owned(&check(pg(8), 0, 512, P, &v, &out), "PRP1"), "just past the end");
        assert!(owned(&check(pg(7) + 2048, pg(8), 4096, P, &v, &out), "PRP2"), "second page past the end");
        assert!(owned(&check(pg(0), foreign, 2 * P, P, &v, &out), "PRP2"));
        assert!(owned(&check(pg(0), pg(7), 4 * P, P, &v, &out), "PRP list entry"));
        assert!(owned(&check(pg(0), foreign, 3 * P, P, &v, &out), "PRP list page"));
        let offset = |e: Result<(u64, u64), Refusal>| matches!(e, Err(Refusal::PrpOffset { .. }));
        assert!(offset(check(pg(0) + 2, 0, 8, P, &v, &out)));
        assert!(offset(check(pg(0), pg(1) + 8, 2 * P, P, &v, &out)));
        assert!(offset(check(pg(0), pg(7) + 4, 3 * P, P, &v, &out)));
    }

    #[test]
    fn chained_lists_are_followed_and_rebuilt() {
        // 8 KiB "pages" would need a bigger registration; use a list whose
        // first page starts 16 bytes before its end: two entries, the
        // second a pointer to the next list page (page 6).
        let pg = |i: u64| BASE + i * P;
        let m = mapped(8);
        let put = |at: usize, v: u64| {
            // SAFETY: test memory, in bounds, no other user.
            #[allow(unsafe_code)]
            unsafe {
                m.as_ptr().add(at).cast::<u64>().write(v.to_le());
            }
        };
        put(7 * PAGE - 16, pg(1));
        put(7 * PAGE - 8, pg(6));
        put(6 * PAGE, pg(2));
        put(6 * PAGE + 8, pg(3));
        let r = Regions::default();
        r.insert(BASE, m.clone());
        let lm = mapped(1);
        let mmio = out_mmio(&lm);
        let out = ListOut { mmio: &mmio, offset: 0, iova: 0x900000, pages: 1 };
        let v = r.view();
        assert_eq!(check(pg(0), pg(6) + P - 16, 4 * P, P, &v, &out), Ok((pg(0), 0x900000)));
        let copied: Vec<u64> = (0..3).map(|i| mmio.read64(i * 8).unwrap()).collect();
        assert_eq!(copied, [pg(1), pg(2), pg(3)]);
        put(7 * PAGE - 8, pg(6) + 8);
        assert!(matches!(
            check(pg(0), pg(6) + P - 16, 4 * P, P, &v, &out),
            Err(Refusal::PrpOffset { which: "PRP list pointer", .. })
        ));
    }
}
