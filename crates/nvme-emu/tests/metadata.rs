//! Namespaces formatted with metadata: the emulator serves the format
//! (Identify Namespace LBAF MS/LBADS, FLBAS index and bit 4, MC) and fails
//! Read/Write on it; the driver (nvm-queue) lists such a namespace with its
//! format and refuses it with a typed reason, while a namespace without
//! metadata beside it works.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use nvm_queue::{
    plan_io, Completion, Controller, ControllerOptions, DataRef, DmaBuffer, IoOp, NamespaceError,
    NamespaceFormat, NvmeDevice, QueuePair,
};
use nvme_emu::{Emulator, EmulatorConfig, NamespaceSpec};
use nvme_regs::identify::metadata_bits;
use nvme_regs::status::generic as gsc;
use nvme_regs::{IdentifyNamespace, LbaFormat, Status};

/// NSID 1: 512-byte blocks + 8 bytes of metadata, extended LBA; NSID 2:
/// 4096-byte blocks, no metadata; NSID 3: 4096-byte blocks + 16 bytes of
/// metadata in a separate buffer.
fn mixed(name: &str) -> EmulatorConfig {
    EmulatorConfig::new(
        name,
        vec![
            NamespaceSpec::new(2048, 512).with_metadata(8, true),
            NamespaceSpec::new(1024, 4096),
            NamespaceSpec::new(256, 4096).with_metadata(16, false),
        ],
    )
}

fn identify_ns(h: &mut Harness, buf: &DmaBuffer, nsid: u32) -> Vec<u8> {
    let c = h.admin(identify(0, nsid, buf.device_addr(0).unwrap()));
    assert_eq!(c.status(), Status::SUCCESS, "Identify Namespace {nsid}");
    let mut bytes = vec![0u8; 4096];
    buf.read_bytes(0, &mut bytes).unwrap();
    bytes
}

#[test]
fn identify_namespace_serves_the_metadata_format() {
    let mut h = Harness::start(mixed("md-id"));
    let buf = DmaBuffer::new(&h.dev, 4096).unwrap();

    let bytes = identify_ns(&mut h, &buf, 1);
    let id = IdentifyNamespace::parse(&bytes).unwrap();
    assert_eq!(id.nsze(), 2048);
    assert_eq!(id.nlbaf(), 1);
    assert_eq!(id.flbas(), 1 | metadata_bits::FLBAS_EXTENDED);
    assert_eq!(id.formatted_lba_index(), 1);
    assert!(id.extended_metadata());
    assert_eq!(id.mc(), metadata_bits::MC_EXTENDED);
    let formats: Vec<LbaFormat> = id.lba_formats().collect();
    assert_eq!(formats, [LbaFormat::new(0, 9, 0), LbaFormat::new(8, 9, 0)]);
    // Bytes 128..136: LBAF0 then LBAF1 (MS 15:0, LBADS 23:16, RP 25:24).
    assert_eq!(&bytes[128..136], &[0, 0, 9, 0, 8, 0, 9, 0]);
    assert_eq!(bytes[26], 0x11);

    let id = IdentifyNamespace::parse(&identify_ns(&mut h, &buf, 3)).unwrap().clone();
    assert_eq!((id.nlbaf(), id.flbas(), id.mc()), (1, 1, metadata_bits::MC_SEPARATE));
    assert!(!id.extended_metadata());
    assert_eq!(id.formatted_lba_format().unwrap(), LbaFormat::new(16, 12, 0));

    // Without metadata: one format, as before.
    let id = IdentifyNamespace::parse(&identify_ns(&mut h, &buf, 2)).unwrap().clone();
    assert_eq!((id.nlbaf(), id.flbas(), id.mc()), (0, 0, 0));
    assert_eq!(id.lba_formats().collect::<Vec<_>>(), [LbaFormat::new(0, 12, 0)]);
}

#[test]
fn read_and_write_on_a_metadata_namespace_fail_with_invalid_format() {
    let mut h = Harness::start(mixed("md-io"));
    let mut q = h.create_io(1, 8);
    let buf = DmaBuffer::new(&h.dev, 4096).unwrap();
    let prp = buf.device_addr(0).unwrap();
    for nsid in [1, 3] {
        for op in [0x01, 0x02] {
            let c = h.submit_on(&mut q, rw(op, nsid, 0, 1, prp, 0));
            assert_eq!(
                c.status(),
                generic(gsc::INVALID_NAMESPACE_OR_FORMAT),
                "opcode {op:#x} on NSID {nsid}"
            );
        }
        // No block data moves: Flush and Write Zeroes work.
        assert_eq!(h.submit_on(&mut q, rw(0x08, nsid, 0, 4, 0, 0)).status(), Status::SUCCESS);
        assert_eq!(h.submit_on(&mut q, rw(0x00, nsid, 0, 1, 0, 0)).status(), Status::SUCCESS);
    }
    // The namespace without metadata beside them is served as ever.
    buf.write_bytes(0, &pattern(4096, 7)).unwrap();
    assert_eq!(h.submit_on(&mut q, rw(0x01, 2, 5, 1, prp, 0)).status(), Status::SUCCESS);
    buf.fill(0);
    assert_eq!(h.submit_on(&mut q, rw(0x02, 2, 5, 1, prp, 0)).status(), Status::SUCCESS);
    let mut got = vec![0u8; 4096];
    buf.read_bytes(0, &mut got).unwrap();
    assert_eq!(got, pattern(4096, 7));
}

fn bring_up(cfg: EmulatorConfig) -> (Arc<Emulator>, Arc<dyn NvmeDevice>, Controller) {
    let emu = Emulator::start(cfg).expect("emulator starts");
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    let ctrl = Controller::init(dev.clone(), ControllerOptions::default()).expect("controller comes up");
    (emu, dev, ctrl)
}

/// One command of `len` bytes at LBA 0 of `ns`, waited for.
fn one_io(
    qp: &mut QueuePair,
    op: IoOp,
    ns: &nvm_queue::NamespaceInfo,
    buf: &DmaBuffer,
    max: usize,
) -> Completion {
    let mut plan = plan_io(ns, 0, u64::from(ns.block_size), max).unwrap();
    let chunk = plan.next().unwrap();
    let data = DataRef { mapping: buf.mapping(), offset: 0, len: chunk.len };
    qp.submit(op.sqe(ns.nsid, &chunk), Some(data), 0).unwrap();
    qp.ring();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut done = None;
    while done.is_none() {
        qp.poll(|c| done = Some(c));
        assert!(Instant::now() < deadline, "timed out: {}", qp.dump());
    }
    done.unwrap()
}

#[test]
fn the_driver_lists_metadata_namespaces_and_refuses_them_with_a_reason() {
    let (_emu, dev, mut ctrl) = bring_up(mixed("md-drv"));

    // Every active namespace is listed, with its format.
    let active = ctrl.active_namespaces();
    assert_eq!(active.iter().map(|n| n.nsid).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(
        active[0].format,
        NamespaceFormat { lbaf_index: 1, lba_data_size: 512, metadata_size: 8, extended: true }
    );
    assert_eq!(active[0].blocks, 2048);
    assert_eq!(active[0].lba_formats, [LbaFormat::new(0, 9, 0), LbaFormat::new(8, 9, 0)]);
    assert_eq!(
        active[2].format,
        NamespaceFormat { lbaf_index: 1, lba_data_size: 4096, metadata_size: 16, extended: false }
    );
    assert_eq!(active[1].format.metadata_size, 0);
    assert!(!active[0].is_usable() && active[1].is_usable() && !active[2].is_usable());

    // Only the usable one is a NamespaceInfo (what the runtime gets).
    assert_eq!(ctrl.namespaces().iter().map(|n| n.nsid).collect::<Vec<_>>(), [2]);
    assert!(ctrl.namespace(1).is_none());
    assert!(ctrl.namespace(3).is_none());
    assert_eq!(ctrl.namespace_status(1).map(|n| n.format.extended), Some(true));
    assert!(ctrl.namespace_status(4).is_none());

    // The typed reasons.
    let e = ctrl.usable_namespace(1).unwrap_err();
    assert!(
        matches!(
            &e,
            NamespaceError::Metadata {
                nsid: 1,
                format: NamespaceFormat { metadata_size: 8, extended: true, lbaf_index: 1, .. },
                reformat_to: Some(NamespaceFormat {
                    lbaf_index: 0,
                    lba_data_size: 512,
                    metadata_size: 0,
                    ..
                }),
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "namespace 1 is formatted with 8 bytes of metadata per block (extended LBA, LBAF 1); tutti supports \
         only formats without metadata: reformat with `nvme format /dev/nvmeX -n 1 --lbaf=0` (512-byte blocks, \
         no metadata; erases the namespace) or pick another namespace"
    );
    let e = ctrl.usable_namespace(3).unwrap_err();
    assert!(e.to_string().contains("16 bytes of metadata per block (separate buffer, LBAF 1)"), "{e}");
    assert_eq!(ctrl.usable_namespace(9), Err(NamespaceError::NotActive { nsid: 9, active: vec![1, 2, 3] }));

    // Namespace 2 works.
    let ns = ctrl.usable_namespace(2).unwrap();
    assert_eq!((ns.nsid, ns.block_size, ns.blocks), (2, 4096, 1024));
    assert_eq!(ctrl.namespace(2), Some(&ns));
    let max = ctrl.max_transfer();
    let mut qp = ctrl.create_io_queue_pair(1, 8, 4).unwrap();
    let wbuf = DmaBuffer::new(&dev, 4096).unwrap();
    let rbuf = DmaBuffer::new(&dev, 4096).unwrap();
    wbuf.write_bytes(0, &pattern(4096, 3)).unwrap();
    assert_eq!(one_io(&mut qp, IoOp::Write, &ns, &wbuf, max).status, Status::SUCCESS);
    assert_eq!(one_io(&mut qp, IoOp::Read, &ns, &rbuf, max).status, Status::SUCCESS);
    let mut got = vec![0u8; 4096];
    rbuf.read_bytes(0, &mut got).unwrap();
    assert_eq!(got, pattern(4096, 3));

    // A reset identifies again and keeps the same picture.
    ctrl.delete_io_queue_pair(1).unwrap();
    ctrl.reset().unwrap();
    assert_eq!(ctrl.active_namespaces().len(), 3);
    assert_eq!(ctrl.namespaces().len(), 1);
    ctrl.shutdown().unwrap();
}

#[test]
fn a_controller_with_only_metadata_namespaces_comes_up_with_none_usable() {
    let cfg = EmulatorConfig::new("md-only", vec![NamespaceSpec::new(64, 512).with_metadata(8, false)]);
    let (_emu, _dev, mut ctrl) = bring_up(cfg);
    assert!(ctrl.namespaces().is_empty());
    assert_eq!(ctrl.active_namespaces().len(), 1);
    let msg = ctrl.usable_namespace(1).unwrap_err().to_string();
    assert!(msg.starts_with(
        "namespace 1 is formatted with 8 bytes of metadata per block (separate buffer, LBAF 1)"
    ));
    ctrl.shutdown().unwrap();
}
