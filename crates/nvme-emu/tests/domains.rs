//! DMA domains: a command from an SQ of domain A whose data buffer or PRP
//! list page lies in domain B's memory fails with Data Transfer Error,
//! B's memory is not touched (neither written by a Read nor read by a
//! Write), the media is unchanged, and `dma_domain_faults` counts it;
//! an SQ without a domain keeps reaching every mapping.
#![allow(unsafe_code, missing_docs)]

mod common;

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use common::*;
use nvm_queue::{DmaMapping, NvmeDevice};
use nvme_emu::{EmuError, Emulator};
use nvme_regs::status::generic as gsc;
use nvme_regs::Status;

const A: u32 = 1;
const B: u32 = 2;
const READ: u8 = 0x02;
const WRITE: u8 = 0x01;

/// Page-aligned host memory mapped in one DMA domain; accessed only through
/// raw copies (the controller may write it).
struct DomainMem {
    emu: std::sync::Arc<Emulator>,
    ptr: NonNull<u8>,
    layout: Layout,
    mapping: DmaMapping,
}

impl DomainMem {
    fn new(emu: &std::sync::Arc<Emulator>, pages: usize, domain: u32, fill: u8) -> Self {
        let layout = Layout::from_size_align(pages * PAGE, PAGE).unwrap();
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        // SAFETY: allocated above, freed in Drop after the unmap.
        let mapping = unsafe { emu.dma_map_in_domain(ptr, pages * PAGE, domain) }.unwrap();
        let m = DomainMem { emu: emu.clone(), ptr, layout, mapping };
        m.write(0, &vec![fill; pages * PAGE]);
        m
    }

    fn iova(&self, page: usize) -> u64 {
        self.mapping.pages()[0] + (page * PAGE) as u64
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.layout.size());
        // SAFETY: in bounds (checked); no command runs on it concurrently.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len()) };
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.layout.size()];
        // SAFETY: the whole allocation; no command runs on it concurrently.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), v.as_mut_ptr(), v.len()) };
        v
    }

    /// A PRP list page's contents: `entries` as little-endian u64s.
    fn set_list(&self, entries: &[u64]) {
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        self.write(0, &bytes);
    }
}

impl Drop for DomainMem {
    fn drop(&mut self) {
        self.emu.dma_unmap(&self.mapping).unwrap();
        // SAFETY: allocated with this layout; no longer mapped.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

fn media(h: &Harness, blocks: usize) -> Vec<u8> {
    let mut v = vec![0u8; blocks * PAGE];
    h.emu.read_media(1, 0, &mut v).unwrap();
    v
}

#[test]
fn a_command_cannot_reach_another_domains_memory() {
    let mut h = Harness::start(config("domains"));
    h.emu.set_sq_domain(1, A).unwrap();
    let mut q = h.create_io(1, 16);
    let a = DomainMem::new(&h.emu, 3, A, 0xAA);
    let a_list = DomainMem::new(&h.emu, 1, A, 0);
    let b = DomainMem::new(&h.emu, 3, B, 0xBB);
    let b_list = DomainMem::new(&h.emu, 1, B, 0);
    let on_media = pattern(3 * PAGE, 7);
    h.emu.write_media(1, 0, &on_media).unwrap();
    let (b_before, a_before) = (b.bytes(), a.bytes());
    let dte = generic(gsc::DATA_TRANSFER_ERROR);
    let mut faults = 0;
    let mut refused = |h: &Harness, q: &mut Queue, opcode, nlb, prp1, prp2, what: &str| {
        let c = h.submit_on(q, rw(opcode, 1, 0, nlb, prp1, prp2));
        assert_eq!(c.status(), dte, "{what}");
        faults += 1;
        assert_eq!(h.emu.stats().dma_domain_faults, faults, "{what}: counted");
        assert_eq!(b.bytes(), b_before, "{what}: domain B memory untouched");
        assert_eq!(a.bytes(), a_before, "{what}: nothing moved before the refusal");
        assert_eq!(media(h, 3), on_media, "{what}: media unchanged");
    };
    // PRP1 into B: a Read would write B, a Write would read B.
    refused(&h, &mut q, READ, 1, b.iova(0), 0, "read, PRP1 in B");
    refused(&h, &mut q, WRITE, 1, b.iova(0), 0, "write, PRP1 in B");
    // PRP2 as a data pointer into B.
    refused(&h, &mut q, READ, 2, a.iova(0), b.iova(1), "read, PRP2 in B");
    // A PRP list entry (in A's list page) pointing into B.
    a_list.set_list(&[a.iova(1), b.iova(2)]);
    refused(&h, &mut q, READ, 3, a.iova(0), a_list.iova(0), "read, list entry in B");
    refused(&h, &mut q, WRITE, 3, a.iova(0), a_list.iova(0), "write, list entry in B");
    // The list page itself in B (its entries point into A).
    b_list.set_list(&[a.iova(1), a.iova(2)]);
    let b_before = b_list.bytes();
    refused(&h, &mut q, READ, 3, a.iova(0), b_list.iova(0), "read, list page in B");
    assert_eq!(b_list.bytes(), b_before);
    assert_eq!(h.emu.stats().dma_faults, 0, "domain faults are not unmapped accesses");

    // A's own memory works, through a list too.
    a_list.set_list(&[a.iova(1), a.iova(2)]);
    assert_eq!(h.submit_on(&mut q, rw(READ, 1, 0, 3, a.iova(0), a_list.iova(0))).status(), Status::SUCCESS);
    assert_eq!(a.bytes(), on_media);
    // An SQ whose domain was never set reaches every mapping (the default).
    let mut shared = h.create_io(2, 16);
    assert_eq!(h.submit_on(&mut shared, rw(READ, 1, 0, 1, b.iova(0), 0)).status(), Status::SUCCESS);
    assert_eq!(&b.bytes()[..PAGE], &on_media[..PAGE]);
    assert_eq!(h.emu.stats().dma_domain_faults, faults);
    assert_eq!(h.emu.stats().dma_faults, 0);
    assert!(!csts(&*h.dev).cfs());
}

#[test]
fn the_domain_is_taken_at_create_io_sq() {
    let mut h = Harness::start(config("domains-create"));
    let b = DomainMem::new(&h.emu, 1, B, 0xBB);
    h.emu.set_sq_domain(1, A).unwrap();
    let mut q = h.create_io(1, 8);
    // Changing the table afterwards does not move the existing SQ.
    h.emu.set_sq_domain(1, B).unwrap();
    let c = h.submit_on(&mut q, rw(READ, 1, 0, 1, b.iova(0), 0));
    assert_eq!(c.status(), generic(gsc::DATA_TRANSFER_ERROR));
    assert_eq!(b.bytes(), vec![0xBB; PAGE]);
    assert_eq!(h.emu.stats().dma_domain_faults, 1);
    // The admin queue and queue ids outside the configured I/O queues
    // have no domain to set.
    let n = h.emu.config().io_queues;
    for qid in [0, n + 1, u16::MAX] {
        assert!(matches!(h.emu.set_sq_domain(qid, A), Err(EmuError::NoSuchQueue { .. })), "qid {qid}");
    }
    h.emu.set_sq_domain(n, A).unwrap();
}
