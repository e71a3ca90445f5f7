//! Shared helpers of the tutti-kv tests: runtimes over emulated drives and
//! host buffers registered with a store.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tutti::{Config, Runtime};
use tutti_kv::{Key, KvMemory, KvStore, OpenOptions};

pub const T: Duration = Duration::from_secs(10);

/// Stripe unit of the striped datapath of [`yaml`] (more than one drive).
pub const STRIPE_UNIT: u64 = 16 << 10;

/// YAML for `drives` emulated drives of `mib` MiB each (`backing` is the
/// YAML of each drive's backing, given its index), slots of `slot` bytes.
pub fn yaml(drives: usize, mib: u64, slot: &str, backing: &dyn Fn(usize) -> String) -> String {
    yaml_sized(drives, &format!("{mib}MiB"), slot, backing)
}

/// [`yaml`] with each drive's capacity as a byte size (`"320KiB"`).
pub fn yaml_sized(drives: usize, capacity: &str, slot: &str, backing: &dyn Fn(usize) -> String) -> String {
    let mut y = String::from("drives:\n");
    for d in 0..drives {
        y += &format!(
            "  d{d}:\n    emulated:\n      namespaces: [{{ capacity: {capacity}, block_size: 4096 }}]\n      backing: {}\n",
            backing(d)
        );
    }
    y += &format!("resolvers:\n  kv:\n    slab: {{ slot_size: {slot} }}\n");
    let names: Vec<String> = (0..drives).map(|d| format!("d{d}")).collect();
    if drives == 1 {
        y += "datapaths:\n  dp:\n    local_nvme: { drive: d0 }\n";
    } else {
        y += &format!(
            "datapaths:\n  dp:\n    striped_local_nvme: {{ drives: [{}], stripe_unit: {STRIPE_UNIT} }}\n",
            names.join(", ")
        );
    }
    y + "stores:\n  kv: { resolver: kv, datapath: dp }\n"
}

/// A runtime from `yaml`.
pub fn runtime(yaml: &str) -> Arc<Runtime> {
    Arc::new(Runtime::from_config(Config::from_yaml_str(yaml).unwrap()).unwrap())
}

/// A runtime on file-backed drives in `dir`.
pub fn file_runtime(dir: &Path, drives: usize, mib: u64, slot: &str) -> Arc<Runtime> {
    let d = dir.to_owned();
    runtime(&yaml(drives, mib, slot, &move |i| format!("{{ file: {} }}", drive_file(&d, i).display())))
}

/// The backing file of drive `d` of [`file_runtime`] in `dir`.
pub fn drive_file(dir: &Path, d: usize) -> PathBuf {
    dir.join(format!("d{d}.img"))
}

/// A runtime on file-backed drives in `dir` of `capacity` each
/// (`"320KiB"`).
pub fn file_runtime_sized(dir: &Path, drives: usize, capacity: &str, slot: &str) -> Arc<Runtime> {
    let d = dir.to_owned();
    runtime(&yaml_sized(drives, capacity, slot, &move |i| {
        format!("{{ file: {} }}", drive_file(&d, i).display())
    }))
}

/// A RAM runtime.
pub fn ram_runtime(drives: usize, mib: u64, slot: &str) -> Arc<Runtime> {
    runtime(&yaml(drives, mib, slot, &|_| "ram".to_owned()))
}

/// Opens store `kv`.
pub fn open(rt: &Arc<Runtime>) -> KvStore {
    KvStore::open(rt.clone(), &OpenOptions::new("kv")).unwrap()
}

/// A 16-byte key from a number.
pub fn key16(i: u64) -> Key {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&i.to_le_bytes());
    b[8] = 0xA5;
    Key::new(&b).unwrap()
}

/// A 32-byte key from a number.
pub fn key(i: u64) -> Key {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&i.to_le_bytes());
    b[31] = 0x5A;
    Key::new(&b).unwrap()
}

/// Payload bytes for (key, version): every 8-byte word names both.
pub fn fill(buf: &mut [u8], k: u64, version: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        let x = (k << 40) ^ (version << 20) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        w.copy_from_slice(&x.to_le_bytes());
    }
}

/// A host buffer registered with a store; unregistered on drop.
pub struct Buf<'s> {
    pub bytes: Vec<u8>,
    pub mem: Option<KvMemory>,
    kv: &'s KvStore,
}

impl<'s> Buf<'s> {
    pub fn new(kv: &'s KvStore, len: usize) -> Self {
        let mut bytes = vec![0u8; len];
        // SAFETY: the Vec lives in the Buf, is never resized, and is
        // unregistered in Drop before it is freed.
        #[allow(unsafe_code)]
        let mem = unsafe { kv.register_host(bytes.as_mut_ptr(), len).unwrap() };
        Self { bytes, mem: Some(mem), kv }
    }

    pub fn mem(&self) -> &KvMemory {
        self.mem.as_ref().unwrap()
    }
}

impl Drop for Buf<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.mem.take() {
            let _ = self.kv.unregister(m);
        }
    }
}
