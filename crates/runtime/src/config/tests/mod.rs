//! Config tests: shared samples and helpers here; by concept in
//! `schema.rs` (parsing, defaults, references, ranges, sizes), `drives.rs`
//! (files, faults, write cache, PCI) and `errors.rs` (every error kind).

use super::*;
use proptest::prelude::*;

const FULL: &str = r#"
drives:
  d0:
    emulated:
      namespaces:
        - { capacity: 1GiB, block_size: 4096 }
        - { capacity: 64MiB, block_size: 512 }
      backing: ram
      mqes: 1023
      dstrd: 0
      mdts: 5
      io_queues: 8
      idle_spin_us: 500
      timing:
        latency_us: 80
        bandwidth_mb_s: 2000
        iops: 500000
  d1:
    emulated:
      namespaces: [ { capacity: 1GiB, block_size: 4096 } ]
      backing: null
  d2:
    emulated:
      namespaces: [ { capacity: 1073741824, block_size: 4096 } ]
      backing: { file: /tmp/tutti-d2.img }
      dstrd: 2
  d3:
    emulated:
      namespaces: [ { capacity: "1 GiB", block_size: 4096 } ]
      timing: {}
  d4:
    emulated:
      namespaces: [ { capacity: 16MiB, block_size: 512 } ]
      mqes: 63
      io_queues: 1
resolvers:
  kv:
    slab: { slot_size: 1MiB }
  small:
    slab: { slot_size: 4096 }
datapaths:
  one:
    local_nvme: { drive: d4, nsid: 1, queues: 1, queue_depth: 64 }
  stripe:
    striped_local_nvme: { drives: [d0, d1, d2, d3], nsid: 1, stripe_unit: 128KiB, queues_per_drive: 2, queue_depth: 256 }
stores:
  kv: { resolver: kv, datapath: stripe }
  meta: { resolver: small, datapath: one }
"#;

/// A small valid config with one placeholder to splice text into.
fn minimal(drive_extra: &str, datapath: &str) -> String {
    format!(
        "drives:\n  d0:\n    emulated:\n      namespaces: [{{capacity: 1GiB, block_size: 4096}}]\n{drive_extra}\
         \n  d1:\n    emulated:\n      namespaces: [{{capacity: 1GiB, block_size: 4096}}]\
         \n  d2:\n    emulated:\n      namespaces: [{{capacity: 1GiB, block_size: 4096}}]\
         \n  d3:\n    emulated:\n      namespaces: [{{capacity: 1GiB, block_size: 4096}}]\
         \n  d4:\n    emulated:\n      namespaces: [{{capacity: 1GiB, block_size: 4096}}]\
         \nresolvers:\n  kv:\n    slab: {{ slot_size: 1MiB }}\
         \ndatapaths:\n  dp:\n    {datapath}\
         \nstores:\n  kv: {{ resolver: kv, datapath: dp }}\n"
    )
}

fn err(yaml: &str) -> ConfigError {
    match Config::from_yaml_str(yaml) {
        Ok(c) => panic!("accepted: {c:?}\n{yaml}"),
        Err(e) => e,
    }
}

fn parse_err_at(yaml: &str, path: &str) -> ConfigError {
    let e = err(yaml);
    match e.kind() {
        ConfigErrorKind::Parse { line, column, .. } => {
            assert_eq!(e.path(), path, "{e}");
            assert!(line.is_some() && column.is_some(), "{e}");
        }
        other => panic!("expected a parse error at {path}, got {other:?}"),
    }
    assert!(e.to_string().starts_with(&format!("{path}: ")), "{e}");
    e
}

const PCI_STRIPE: &str = r#"
drives:
  q0: { pci: { addr: "0000:00:10.0" } }
  q1: { pci: { addr: "00:11.0" } }
  q2: { pci: { addr: "0000:00:12.0", allow_no_iommu: true } }
  e0:
    emulated:
      namespaces: [ { capacity: 64MiB, block_size: 512 } ]
resolvers:
  slots: { slab: { slot_size: 256KiB } }
datapaths:
  striped: { striped_local_nvme: { drives: [q0, q1, q2, e0], stripe_unit: 128KiB, queues_per_drive: 4 } }
stores:
  kv: { resolver: slots, datapath: striped }
"#;

mod drives;
mod errors;
mod schema;
