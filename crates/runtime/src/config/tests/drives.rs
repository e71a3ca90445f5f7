//! YAML round trips, config files, backing files, fault and write-cache
//! rules, PCI drives.

use super::*;

#[test]
fn yaml_round_trip() {
    for c in [
        Config::from_yaml_str(FULL).unwrap(),
        Config::builtin_striped_ram(4, (1 << 30) + 4096, 1 << 20),
        Config::default(),
    ] {
        let yaml = c.to_yaml_string().unwrap();
        let back = Config::from_yaml_str(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        assert_eq!(back, c, "{yaml}");
    }
}

#[test]
fn from_path_reads_and_reports_io_errors() {
    let dir = std::env::temp_dir().join(format!("tutti-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.yaml");
    std::fs::write(&file, FULL).unwrap();
    assert_eq!(Config::from_path(&file).unwrap(), Config::from_yaml_str(FULL).unwrap());
    std::fs::remove_file(&file).unwrap();
    let e = Config::from_path(&file).unwrap_err();
    assert!(matches!(e.kind(), ConfigErrorKind::Io { file: f, .. } if *f == file), "{e}");
    assert!(e.to_string().contains("c.yaml"), "{e}");
    assert_eq!(e.path(), file.display().to_string());
    assert_eq!(e.to_string(), format!("{}: cannot read config file", file.display()));
    let source = std::error::Error::source(&e).expect("the I/O error is the source");
    let io = source.downcast_ref::<std::io::Error>().expect("an io::Error");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    let ConfigErrorKind::Io { source, .. } = e.into_kind() else { unreachable!() };
    assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
    std::fs::remove_dir(&dir).ok();
}

#[test]
fn two_drives_on_one_backing_file_are_refused() {
    let yaml = "
drives:
  a: { emulated: { namespaces: [{ capacity: 1MiB, block_size: 4096 }], backing: { file: /tmp/tutti-shared.img } } }
  b: { emulated: { namespaces: [{ capacity: 1MiB, block_size: 4096 }], backing: { file: /tmp/tutti-shared.img } } }
";
    let e = Config::from_yaml_str(yaml).unwrap_err();
    assert!(matches!(e.kind(), ConfigErrorKind::SharedBackingFile { .. }), "{e}");
    assert_eq!(e.path(), "drives.b.emulated.backing");
    assert!(e.to_string().contains("\"a\""), "{e}");
}

#[test]
fn fault_rules_parse_and_are_checked() {
    let ok = "drives:\n  d0:\n    emulated:\n      namespaces: [{capacity: 1MiB, block_size: 4096}]\n      faults:\n        - { lba: [4, 8], op: read, action: never_complete }\n        - { action: { fail: { sct: 2, sc: 0x81, dnr: true } }, times: 1 }\n        - { op: write, action: { delay_us: 500 } }\n";
    let c = Config::from_yaml_str(ok).unwrap();
    let DriveConfig::Emulated(d) = &c.drives["d0"] else { panic!("not an emulated drive") };
    assert_eq!(d.faults.len(), 3);
    assert_eq!(d.faults[1].action, FaultActionConfig::Fail { sct: 2, sc: 0x81, dnr: true });
    let empty = ok.replace("[4, 8]", "[8, 8]");
    let e = Config::from_yaml_str(&empty).unwrap_err();
    assert_eq!(e.path(), "drives.d0.emulated.faults[0].lba");
    let bad_sct = ok.replace("sct: 2", "sct: 9");
    assert!(Config::from_yaml_str(&bad_sct).unwrap_err().to_string().contains("sct"));
    let unknown = ok.replace("never_complete", "explode");
    assert!(Config::from_yaml_str(&unknown).is_err());
    let flush = ok.replace("op: write", "op: flush");
    let c = Config::from_yaml_str(&flush).unwrap();
    let DriveConfig::Emulated(d) = &c.drives["d0"] else { panic!("not an emulated drive") };
    assert_eq!(d.faults[2].op, Some(FaultOp::Flush));
    let flush_lba = ok.replace("op: read", "op: flush");
    let e = Config::from_yaml_str(&flush_lba).unwrap_err();
    assert!(matches!(e.kind(), ConfigErrorKind::FaultFlushLba), "{e}");
    assert_eq!(e.path(), "drives.d0.emulated.faults[0].lba");
}

#[test]
fn write_cache_ram_disk_and_power_fail_rules_parse_and_are_checked() {
    let ok = "drives:\n  d0:\n    emulated:\n      namespaces: [{capacity: 1MiB, block_size: 4096}]\n      backing: { ram_disk: crash-1 }\n      write_cache: { capacity: 8MiB, seed: 42 }\n      faults:\n        - { op: write, action: power_fail, skip: 9, times: 1 }\n  d1:\n    emulated:\n      namespaces: [{capacity: 1MiB, block_size: 4096}]\n      write_cache: {}\n";
    let c = Config::from_yaml_str(ok).unwrap();
    let DriveConfig::Emulated(d0) = &c.drives["d0"] else { panic!("not an emulated drive") };
    assert_eq!(d0.backing, Backing::RamDisk("crash-1".into()));
    assert_eq!(d0.write_cache, Some(WriteCacheConfig { capacity: ByteSize::mib(8), seed: 42 }));
    assert_eq!(d0.faults[0].action, FaultActionConfig::PowerFail);
    assert_eq!((d0.faults[0].skip, d0.faults[0].times), (9, Some(1)));
    let DriveConfig::Emulated(d1) = &c.drives["d1"] else { panic!("not an emulated drive") };
    assert_eq!(d1.write_cache, Some(WriteCacheConfig { capacity: ByteSize::mib(64), seed: 1 }), "defaults");
    assert_eq!(d1.backing, Backing::Ram);
    assert_eq!(Config::from_yaml_str(&c.to_yaml_string().unwrap()).unwrap(), c, "round trip");

    let small = ok.replace("capacity: 8MiB", "capacity: 1KiB");
    let e = err(&small);
    assert_eq!(e.path(), "drives.d0.emulated.write_cache.capacity");
    assert!(matches!(e.kind(), ConfigErrorKind::OutOfRange { value: 1024, min: 4096, .. }), "{e}");
    let e = err(&ok.replace("crash-1", "\"\""));
    assert_eq!(e.path(), "drives.d0.emulated.backing");
    assert!(matches!(e.kind(), ConfigErrorKind::EmptyRamDiskName), "{e}");
    let shared = ok.replace("write_cache: {}", "backing: { ram_disk: crash-1 }");
    let e = err(&shared);
    assert_eq!(e.path(), "drives.d1.emulated.backing");
    assert!(
        matches!(e.kind(), ConfigErrorKind::SharedRamDisk { name, other } if name == "crash-1" && other == "d0"),
        "{e}"
    );
    parse_err_at(&ok.replace("seed: 42", "seed: 42, size: 1"), "drives.d0.emulated.write_cache.size");
}

#[test]
fn pci_drives_parse_validate_and_mix_with_emulated_ones() {
    let c = Config::from_yaml_str(PCI_STRIPE).unwrap();
    let DriveConfig::Pci(q1) = &c.drives["q1"] else { panic!("q1 is not pci: {c:?}") };
    assert_eq!(q1.addr, "00:11.0");
    assert!(!q1.allow_no_iommu);
    let DriveConfig::Pci(q2) = &c.drives["q2"] else { panic!() };
    assert!(q2.allow_no_iommu);
    // Queue counts and depths of PCI drives are checked against the
    // controller at start, not here: 4 queues per drive is accepted.
    let back = Config::from_yaml_str(&c.to_yaml_string().unwrap()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn pci_addresses_are_checked_and_may_name_one_function_once() {
    let bad = PCI_STRIPE.replace("00:11.0", "00:20.0");
    let e = err(&bad);
    assert!(matches!(e.kind(), ConfigErrorKind::PciAddr { .. }), "{e}");
    assert_eq!(e.path(), "drives.q1.pci.addr");
    assert!(e.to_string().contains("not a PCI address"), "{e}");
    // The same function written two ways is still one function.
    let dup = PCI_STRIPE.replace("\"00:11.0\"", "\"0000:00:10.0\"");
    let e = err(&dup);
    assert!(
        matches!(e.kind(), ConfigErrorKind::SharedPciFunction { addr, other } if addr == "0000:00:10.0" && other == "q0"),
        "{e}"
    );
    assert_eq!(e.path(), "drives.q1.pci.addr");
    parse_err_at("drives:\n  q0: { pci: { addr: \"0000:00:10.0\", bus: 3 } }\n", "drives.q0.pci.bus");
}

#[test]
fn pci_address_normalisation() {
    assert_eq!(normalize_pci_addr("0000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
    assert_eq!(normalize_pci_addr("3b:00.1").as_deref(), Some("0000:3b:00.1"));
    assert_eq!(normalize_pci_addr(" 10000:00:00.0"), None);
    assert_eq!(normalize_pci_addr("00:00.8"), None);
    assert_eq!(normalize_pci_addr("00:20.0"), None);
    assert_eq!(normalize_pci_addr("00:1f"), None);
    assert_eq!(normalize_pci_addr("g0:00.0"), None);
    assert_eq!(normalize_pci_addr("0:0:0:0.0"), None);
}
