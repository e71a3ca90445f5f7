//! Discovery and binding against a fake sysfs/procfs tree.

use std::time::Duration;

use nvme_pci::fake::{FakeFunction, FakeTree};
use nvme_pci::{bind_vfio, enumerate, unbind_to_kernel, vfio_status, DeviceUse, PciAddr, PciError, Sysfs};

fn a(s: &str) -> PciAddr {
    s.parse().unwrap()
}

/// Three drives: 00:04.0 on nvme with nvme0n1 (two partitions), 00:05.0 on
/// vfio-pci, 00:06.0 on nvme with an unused nvme2n1; plus a non-NVMe
/// function that must not be listed.
fn tree() -> (tempfile::TempDir, FakeTree) {
    let dir = tempfile::tempdir().unwrap();
    let t = FakeTree::new(dir.path()).unwrap();
    let d4 = a("0000:00:04.0");
    t.add_function(&d4, &FakeFunction { numa_node: 1, iommu_group: Some(12), ..Default::default() }).unwrap();
    t.add_controller(&d4, "nvme0", "QEMU NVMe Ctrl", "deadbeef", "7.2.22").unwrap();
    t.add_namespace(&d4, "nvme0", "nvme0n1", 1, 1 << 30, 512, "259:0").unwrap();
    t.add_partition("nvme0n1", "nvme0n1p1", 256 << 20, "259:1").unwrap();
    t.add_partition("nvme0n1", "nvme0n1p2", 512 << 20, "259:2").unwrap();
    let d5 = a("0000:00:05.0");
    t.add_function(
        &d5,
        &FakeFunction {
            driver: Some("vfio-pci".into()),
            iommu_group: Some(13),
            vendor: 0x144d,
            device: 0xa808,
            ..Default::default()
        },
    )
    .unwrap();
    let d6 = a("0000:00:06.0");
    t.add_function(&d6, &FakeFunction { iommu_group: Some(14), ..Default::default() }).unwrap();
    t.add_controller(&d6, "nvme2", "Spare", "S2", "1.0").unwrap();
    t.add_namespace(&d6, "nvme2", "nvme2n1", 1, 4 << 30, 4096, "259:5").unwrap();
    t.add_function(
        &a("0000:00:02.0"),
        &FakeFunction { class: 0x030000, driver: Some("bochs-drm".into()), ..Default::default() },
    )
    .unwrap();
    (dir, t)
}

fn sysfs(t: &FakeTree) -> Sysfs {
    Sysfs::with_root(t.root()).with_settle_time(Duration::ZERO)
}

#[test]
fn enumeration_fields() {
    let (_d, t) = tree();
    let fs = enumerate(&sysfs(&t)).unwrap();
    assert_eq!(
        fs.iter().map(|f| f.addr.to_string()).collect::<Vec<_>>(),
        ["0000:00:04.0", "0000:00:05.0", "0000:00:06.0"]
    );
    let f = &fs[0];
    assert_eq!((f.vendor, f.device), (0x1b36, 0x0010));
    assert_eq!(f.driver.as_deref(), Some("nvme"));
    assert_eq!(f.numa_node, Some(1));
    assert_eq!(f.iommu_group, Some(12));
    assert_eq!(f.bar0_bytes, Some(0x4000));
    let c = &f.controllers[0];
    assert_eq!(
        (c.name.as_str(), c.model.as_str(), c.serial.as_str(), c.firmware.as_str()),
        ("nvme0", "QEMU NVMe Ctrl", "deadbeef", "7.2.22")
    );
    let ns = &c.namespaces[0];
    assert_eq!(
        (ns.name.as_str(), ns.nsid, ns.bytes, ns.logical_block_bytes),
        ("nvme0n1", Some(1), 1 << 30, Some(512))
    );
    assert_eq!(ns.partitions.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["nvme0n1p1", "nvme0n1p2"]);
    assert_eq!(ns.partitions[1].bytes, 512 << 20);
    assert!(f.uses().is_empty());
    let v = &fs[1];
    assert_eq!(
        (v.vendor, v.device, v.driver.as_deref(), v.numa_node),
        (0x144d, 0xa808, Some("vfio-pci"), None)
    );
    assert!(v.controllers.is_empty());
}

#[test]
fn mounted_partition_is_refused_and_force_overrides() {
    let (_d, t) = tree();
    t.mount("nvme0n1p2", "259:2", "/data").unwrap();
    let s = sysfs(&t);
    match bind_vfio(&s, &a("00:04.0"), false) {
        Err(PciError::InUse { uses, .. }) => assert_eq!(uses, ["nvme0n1p2 mounted at /data"]),
        other => panic!("{other:?}"),
    }
    assert!(s.writes().is_empty(), "nothing written when refused");
    // With force the writes happen (the fake kernel does not rebind, so
    // the final check reports the driver it still sees).
    match bind_vfio(&s, &a("00:04.0"), true) {
        Err(PciError::BindFailed { wanted: "vfio-pci", driver, .. }) => {
            assert_eq!(driver.as_deref(), Some("nvme"))
        }
        other => panic!("{other:?}"),
    }
    // The failed bind was rolled back: the override is cleared again.
    assert_eq!(t.read("sys/bus/pci/devices/0000:00:04.0/driver_override"), "\n");
    assert!(s.writes().iter().any(|(p, v)| p.ends_with("driver_override") && v == "vfio-pci"));
}

#[test]
fn md_holder_and_open_fd_are_uses() {
    let (_d, t) = tree();
    t.add_holder("nvme0n1/nvme0n1p1", "md0", None).unwrap();
    t.add_holder("nvme0n1", "dm-0", Some("vg0-data")).unwrap();
    t.set_dev("dm-0", "253:0").unwrap();
    t.mount("mapper/vg0-data", "253:0", "/srv").unwrap();
    t.open_fd(1234, "postgres", "nvme0n1p2").unwrap();
    t.open_fd(77, "fio", "nvme2n1").unwrap();
    let s = sysfs(&t);
    let err = bind_vfio(&s, &a("0000:00:04.0"), false).unwrap_err();
    let PciError::InUse { uses, .. } = &err else { panic!("{err:?}") };
    assert_eq!(
        uses,
        &[
            "nvme0n1 is a member of dm-0 (vg0-data)",
            "dm-0 (vg0-data) mounted at /srv",
            "nvme0n1p1 is a member of md0",
            "nvme0n1p2 open by pid 1234 (postgres)",
        ]
    );
    let msg = err.to_string();
    assert!(msg.contains("--force") && msg.contains("nvme0n1p1 is a member of md0"), "{msg}");
    let f = nvme_pci::function(&s, &a("00:06.0")).unwrap();
    assert_eq!(f.uses(), vec![DeviceUse::Open { dev: "nvme2n1".into(), pid: 77, comm: "fio".into() }]);
}

#[test]
fn root_filesystem_is_refused_even_with_force() {
    let (_d, t) = tree();
    t.mount("nvme0n1p1", "259:1", "/").unwrap();
    let s = sysfs(&t);
    match bind_vfio(&s, &a("00:04.0"), false) {
        Err(PciError::InUse { uses, .. }) => {
            assert_eq!(uses, ["holds the root filesystem", "nvme0n1p1 mounted at /"])
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(bind_vfio(&s, &a("00:04.0"), true), Err(PciError::HoldsRootFs { .. })));
    assert!(s.writes().is_empty());
    // Root on LVM on the drive counts too.
    let (_d2, t2) = tree();
    t2.add_holder("nvme2n1", "dm-1", Some("vg-root")).unwrap();
    t2.set_dev("dm-1", "253:1").unwrap();
    t2.mount("mapper/vg-root", "253:1", "/").unwrap();
    assert!(matches!(bind_vfio(&sysfs(&t2), &a("00:06.0"), true), Err(PciError::HoldsRootFs { .. })));
    // The default "encrypted LVM" install: partition -> dm-crypt -> LVM
    // logical volume mounted at /, two holders up from the drive.
    let (_d3, t3) = tree();
    t3.add_holder("nvme0n1/nvme0n1p2", "dm-0", Some("nvme0n1p2_crypt")).unwrap();
    t3.add_holder("dm-0", "dm-1", Some("vg-root")).unwrap();
    t3.set_dev("dm-1", "253:1").unwrap();
    t3.mount("mapper/vg-root", "253:1", "/").unwrap();
    let s3 = sysfs(&t3);
    match bind_vfio(&s3, &a("00:04.0"), false) {
        Err(PciError::InUse { uses, .. }) => {
            assert!(uses.iter().any(|u| u == "holds the root filesystem"), "{uses:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(bind_vfio(&s3, &a("00:04.0"), true), Err(PciError::HoldsRootFs { .. })));
    assert!(s3.writes().is_empty());
}

#[test]
fn bind_writes_override_unbind_probe_in_order() {
    let (_d, t) = tree();
    let s = sysfs(&t);
    let _ = bind_vfio(&s, &a("00:06.0"), false);
    let root = t.root();
    let w: Vec<(String, String)> = s
        .writes()
        .into_iter()
        .map(|(p, v)| (p.strip_prefix(root).unwrap().display().to_string(), v))
        .collect();
    // The kernel (a fake tree) never moved the link: the bind failed, and
    // the override was cleared and the function probed again, so it is not
    // left pinned to vfio-pci.
    assert_eq!(
        w,
        [
            ("sys/bus/pci/devices/0000:00:06.0/driver_override".to_owned(), "vfio-pci".to_owned()),
            ("sys/bus/pci/drivers/nvme/unbind".to_owned(), "0000:00:06.0".to_owned()),
            ("sys/bus/pci/drivers_probe".to_owned(), "0000:00:06.0".to_owned()),
            ("sys/bus/pci/devices/0000:00:06.0/driver_override".to_owned(), "\n".to_owned()),
            ("sys/bus/pci/drivers_probe".to_owned(), "0000:00:06.0".to_owned()),
        ]
    );
    assert_eq!(t.read("sys/bus/pci/drivers/nvme/unbind"), "0000:00:06.0");
    assert_eq!(t.read("sys/bus/pci/drivers_probe"), "0000:00:06.0");

    // When the kernel did rebind, bind succeeds; a second bind is a no-op.
    t.set_driver(&a("00:06.0"), Some("vfio-pci")).unwrap();
    let s2 = sysfs(&t);
    let out = bind_vfio(&s2, &a("00:06.0"), false).unwrap();
    assert!(out.unchanged);
    assert!(s2.writes().is_empty());
}

#[test]
fn bind_succeeds_when_the_driver_link_follows() {
    let (_d, t) = tree();
    // Play the kernel: switch the link from another thread shortly after.
    let t2 = t.clone();
    let s = Sysfs::with_root(t.root()).with_settle_time(Duration::from_secs(5));
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        t2.set_driver(&a("00:06.0"), Some("vfio-pci")).unwrap();
    });
    let out = bind_vfio(&s, &a("00:06.0"), false).unwrap();
    h.join().unwrap();
    assert_eq!(out.previous.as_deref(), Some("nvme"));
    assert!(!out.unchanged);
}

#[test]
fn unbind_to_kernel_clears_override_and_probes() {
    let (_d, t) = tree();
    let s = sysfs(&t);
    let r = unbind_to_kernel(&s, &a("00:05.0"));
    assert!(matches!(r, Err(PciError::BindFailed { wanted: "nvme", .. })), "{r:?}");
    let w: Vec<(String, String)> = s
        .writes()
        .into_iter()
        .map(|(p, v)| (p.strip_prefix(t.root()).unwrap().display().to_string(), v))
        .collect();
    assert_eq!(
        w,
        [
            ("sys/bus/pci/devices/0000:00:05.0/driver_override".to_owned(), "\n".to_owned()),
            ("sys/bus/pci/drivers/vfio-pci/unbind".to_owned(), "0000:00:05.0".to_owned()),
            ("sys/bus/pci/drivers_probe".to_owned(), "0000:00:05.0".to_owned()),
        ]
    );
    assert_eq!(t.read("sys/bus/pci/devices/0000:00:05.0/driver_override"), "\n");
    // Already on nvme: nothing to do.
    assert!(unbind_to_kernel(&s, &a("00:04.0")).unwrap().unchanged);
}

#[test]
fn errors_carry_the_fix() {
    let (_d, t) = tree();
    let s = sysfs(&t);
    t.remove_driver("vfio-pci").unwrap();
    let e = bind_vfio(&s, &a("00:06.0"), false).unwrap_err();
    assert!(e.to_string().contains("modprobe vfio-pci"), "{e}");
    t.add_driver("vfio-pci").unwrap();

    let d7 = a("0000:00:07.0");
    t.add_function(&d7, &FakeFunction { iommu_group: None, driver: None, ..Default::default() }).unwrap();
    let e = bind_vfio(&s, &d7, false).unwrap_err();
    assert!(matches!(e, PciError::NoIommuGroup { .. }));
    assert!(e.to_string().contains("intel_iommu=on"), "{e}");

    let e = bind_vfio(&s, &a("0000:00:02.0"), false).unwrap_err();
    assert!(matches!(e, PciError::NotNvme { class: 0x030000, .. }), "{e}");
    let e = bind_vfio(&s, &a("0000:09:00.0"), false).unwrap_err();
    assert!(matches!(e, PciError::NotFound { .. }), "{e}");

    t.remove_driver("nvme").unwrap();
    let e = unbind_to_kernel(&s, &a("00:05.0")).unwrap_err();
    assert!(e.to_string().contains("modprobe nvme"), "{e}");
}

#[test]
fn open_refuses_functions_not_on_vfio() {
    let (_d, t) = tree();
    let opts = nvme_pci::OpenOptions { root: Some(t.root().to_owned()), ..Default::default() };
    let e = nvme_pci::open(&a("00:04.0"), &opts).unwrap_err();
    assert!(e.to_string().contains("tutti-probe bind 0000:00:04.0"), "{e}");
    t.set_driver(&a("00:04.0"), Some("uio_pci_generic")).unwrap();
    let e = nvme_pci::open(&a("00:04.0"), &opts).unwrap_err();
    assert!(matches!(e, PciError::NoIommuNotAllowed { .. }), "{e}");
}

#[test]
fn status_of_the_host() {
    let (_d, t) = tree();
    let st = vfio_status(&sysfs(&t));
    assert!(st.iommu_enabled && st.vfio_loaded && st.type1_loaded && st.vfio_pci_loaded);
    assert!(!st.noiommu_mode && !st.uio_pci_generic_loaded);
}

#[test]
fn unbind_of_a_vfio_group_someone_holds_is_refused_instead_of_blocking() {
    let (_d, t) = tree();
    // 00:05.0 is on vfio-pci (group 7 in the fake tree? read it back).
    let f = nvme_pci::function(&sysfs(&t), &a("00:05.0")).unwrap();
    let group = f.iommu_group.expect("the fake vfio function has a group");
    t.open_fd(4242, "tutti-bench", &format!("vfio/{group}")).unwrap();
    let s = sysfs(&t);
    match unbind_to_kernel(&s, &a("00:05.0")) {
        Err(PciError::InUse { uses, .. }) => {
            assert_eq!(uses, [format!("/dev/vfio/{group} open by pid 4242 (tutti-bench)")])
        }
        other => panic!("{other:?}"),
    }
    assert!(s.writes().is_empty(), "nothing written");
}
