//! Every error kind, its message and its key path; the GPU section.

use super::*;

/// One error of every kind with its full expected message; an exhaustive
/// match makes a new kind fail to compile until it is listed here.
fn every_kind() -> Vec<(ConfigErrorKind, &'static str)> {
    use ConfigErrorKind as K;
    let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
    vec![
        (K::FaultRange { start: 8, end: 8 }, "empty LBA range [8, 8)"),
        (
            K::PciAddr { addr: "00:20.0".into() },
            "\"00:20.0\" is not a PCI address (want dddd:bb:dd.f, e.g. 0000:01:00.0)",
        ),
        (
            K::SharedPciFunction { addr: "0000:00:10.0".into(), other: "q0".into() },
            "PCI function 0000:00:10.0 is already drive \"q0\"",
        ),
        (
            K::SharedBackingFile { file: "/tmp/x.img".into(), other: "a".into() },
            "backing file /tmp/x.img is already used by drive \"a\"",
        ),
        (K::Io { file: "/etc/tutti.yaml".into(), source: io }, "cannot read config file"),
        (
            K::Parse { line: Some(3), column: Some(7), message: "unknown field `colour`".into() },
            "unknown field `colour` (line 3, column 7)",
        ),
        (K::EmptyName, "empty name"),
        (K::UnknownReference { kind: RefKind::Drive, name: "d9".into() }, "unknown drive \"d9\""),
        (K::OutOfRange { value: 0, min: 1, max: 65535 }, "invalid value 0: must be in 1..=65535"),
        (K::NoNamespaces, "a drive needs at least one namespace"),
        (K::BlockSize { block_size: 1024 }, "invalid block size 1024: must be 512 or 4096"),
        (
            K::Capacity { capacity: ByteSize(1000), block_size: 512 },
            "invalid capacity 1000B: must be a non-zero multiple of the block size 512",
        ),
        (
            K::SlotSize { slot_size: ByteSize::kib(6) },
            "invalid slot size 6KiB: must be a non-zero multiple of 4096 bytes",
        ),
        (
            K::UnknownNamespace { drive: "d0".into(), nsid: 2, namespaces: 1 },
            "drive \"d0\" has no namespace 2 (it has NSIDs 1..=1)",
        ),
        (
            K::NamespaceMissing { drive: "q0".into(), nsid: 3, active: vec![1, 2] },
            "drive \"q0\" has no active namespace 3 (active: [1, 2]); set nsid to one of them",
        ),
        (K::StripeWidth { count: 5, min: 2, max: 4 }, "a striped datapath needs 2 to 4 drives, got 5"),
        (K::DuplicateStripeDrive { drive: "d0".into() }, "drive \"d0\" is listed twice in the stripe"),
        (
            K::DriveAlreadyOwned { drive: "d0".into(), owner: "dp".into() },
            "drive \"d0\" is already used by datapath \"dp\" (one datapath per drive)",
        ),
        (
            K::AlreadyInStore { kind: RefKind::DataPath, name: "dp".into(), owner: "kv".into() },
            "datapath \"dp\" is already used by store \"kv\" (one store per datapath)",
        ),
        (
            K::StripeUnit { stripe_unit: ByteSize::kib(96) },
            "invalid stripe unit 96KiB: must be a power of two and at least 4096 bytes",
        ),
        (
            K::StripeUnitBlockSize {
                stripe_unit: ByteSize(2048),
                drive: "d1".into(),
                nsid: 1,
                block_size: 4096,
            },
            "stripe unit 2KiB is not a multiple of the block size 4096 of drive \"d1\" namespace 1",
        ),
        (
            K::StripeUnitVsLbaSize { unit: 4096, drive: "q1".into(), lba_size: 8192 },
            "stripe unit 4096 bytes is not a multiple of drive \"q1\"'s 8192-byte LBA size; \
             use a multiple of it",
        ),
        (
            K::QueueDepthExceedsMqes { queue_depth: 65, drive: "d0".into(), max: 64 },
            "queue depth 65 exceeds drive \"d0\"'s maximum queue size 64 (CAP.MQES + 1)",
        ),
        (
            K::QueuesExceedIoQueues { queues: 3, drive: "d0".into(), io_queues: 2 },
            "3 queues exceed drive \"d0\"'s 2 I/O queues",
        ),
        (
            K::NamespaceUnsupported {
                drive: "q0".into(),
                reason: nvm_queue::NamespaceError::NotActive { nsid: 9, active: vec![1] },
            },
            "drive \"q0\": namespace 9 is not active (active: [1])",
        ),
        (
            K::SharedRamDisk { name: "crash".into(), other: "a".into() },
            "RAM disk \"crash\" is already used by drive \"a\"",
        ),
        (K::EmptyRamDiskName, "a RAM disk needs a non-empty name"),
        (K::FaultFlushLba, "op: flush with an lba range would never match: a Flush carries no LBA range"),
    ]
}

/// The position of `kind` in [`every_kind`]'s list.
fn kind_index(kind: &ConfigErrorKind) -> usize {
    use ConfigErrorKind as K;
    match kind {
        K::FaultRange { .. } => 0,
        K::PciAddr { .. } => 1,
        K::SharedPciFunction { .. } => 2,
        K::SharedBackingFile { .. } => 3,
        K::Io { .. } => 4,
        K::Parse { .. } => 5,
        K::EmptyName => 6,
        K::UnknownReference { .. } => 7,
        K::OutOfRange { .. } => 8,
        K::NoNamespaces => 9,
        K::BlockSize { .. } => 10,
        K::Capacity { .. } => 11,
        K::SlotSize { .. } => 12,
        K::UnknownNamespace { .. } => 13,
        K::NamespaceMissing { .. } => 14,
        K::StripeWidth { .. } => 15,
        K::DuplicateStripeDrive { .. } => 16,
        K::DriveAlreadyOwned { .. } => 17,
        K::AlreadyInStore { .. } => 18,
        K::StripeUnit { .. } => 19,
        K::StripeUnitBlockSize { .. } => 20,
        K::StripeUnitVsLbaSize { .. } => 21,
        K::QueueDepthExceedsMqes { .. } => 22,
        K::QueuesExceedIoQueues { .. } => 23,
        K::NamespaceUnsupported { .. } => 24,
        K::SharedRamDisk { .. } => 25,
        K::EmptyRamDiskName => 26,
        K::FaultFlushLba => 27,
    }
}

#[test]
fn every_kind_displays_its_path_first() {
    let kinds = every_kind();
    let indices: Vec<usize> = kinds.iter().map(|(k, _)| kind_index(k)).collect();
    assert_eq!(indices, (0..28).collect::<Vec<_>>(), "every kind listed once, in order");
    for (kind, message) in kinds {
        assert_eq!(kind.to_string(), message);
        let path = "datapaths.dp.striped_local_nvme.drives[1]";
        let e = ConfigError::new(path, kind);
        assert_eq!(e.path(), path);
        assert_eq!(e.to_string(), format!("{path}: {message}"));
        assert_eq!(kind_index(e.kind()), kind_index(&e.into_kind()));
    }
}

#[test]
fn assembly_kinds_name_the_datapath_key() {
    let c = Config::from_yaml_str(PCI_STRIPE).unwrap();
    let path = c.datapath_key("striped", "stripe_unit");
    assert_eq!(path, "datapaths.striped.striped_local_nvme.stripe_unit");
    let e = ConfigError::new(
        path,
        ConfigErrorKind::StripeUnitVsLbaSize { unit: 128 << 10, drive: "q1".into(), lba_size: 4096 * 3 },
    );
    assert_eq!(
        e.to_string(),
        "datapaths.striped.striped_local_nvme.stripe_unit: stripe unit 131072 bytes is not a multiple of \
         drive \"q1\"'s 12288-byte LBA size; use a multiple of it"
    );
    assert!(matches!(e.kind(), ConfigErrorKind::StripeUnitVsLbaSize { lba_size: 12288, .. }));
    assert!(std::error::Error::source(&e).is_none());

    let yaml = "drives:\n  q0: { pci: { addr: \"00:10.0\" } }\n\
                datapaths:\n  one: { local_nvme: { drive: q0, nsid: 3 } }\n";
    // NSID 3 of a PCI drive is only checked when the drive is opened.
    let one = Config::from_yaml_str(yaml).unwrap();
    let path = one.datapath_key("one", "nsid");
    assert_eq!(path, "datapaths.one.local_nvme.nsid");
    let missing = |active: Vec<u32>| {
        ConfigError::new(&path, ConfigErrorKind::NamespaceMissing { drive: "q0".into(), nsid: 3, active })
    };
    assert_eq!(
        missing(vec![1, 2]).to_string(),
        "datapaths.one.local_nvme.nsid: drive \"q0\" has no active namespace 3 (active: [1, 2]); \
         set nsid to one of them"
    );
    assert_eq!(
        missing(vec![]).to_string(),
        "datapaths.one.local_nvme.nsid: drive \"q0\" has no active namespace 3 (active: []); the drive has none: \
         create and attach a namespace first"
    );
    let e = missing(vec![]);
    assert!(
        matches!(e.kind(), ConfigErrorKind::NamespaceMissing { nsid: 3, active, .. } if active.is_empty())
    );

    // Indexed fields, and names that are no datapath of the config.
    assert_eq!(c.datapath_key("striped", "drives[2]"), "datapaths.striped.striped_local_nvme.drives[2]");
    assert_eq!(c.datapath_key("nope", "nsid"), "datapaths.nope.nsid");
}

#[test]
fn the_gpu_ordinal_is_read_and_defaults_to_zero() {
    assert_eq!(Config::from_yaml_str("{}").unwrap().gpu, GpuConfig { ordinal: 0 });
    let c = Config::from_yaml_str("gpu: { ordinal: 1 }").unwrap();
    assert_eq!(c.gpu.ordinal, 1);
    let e = Config::from_yaml_str("gpu: { ordnal: 1 }").unwrap_err();
    assert!(matches!(e.kind(), ConfigErrorKind::Parse { .. }), "{e:?}");
    assert!(e.to_string().contains("ordnal"), "{e}");
    // The default is left out of YAML output.
    assert!(!serde_saphyr::to_string(&Config::default()).unwrap().contains("gpu"));
}
