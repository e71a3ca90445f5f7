//! Named RAM disks ([`crate::BackingSpec::RamDisk`]): a process-wide
//! registry of RAM images that outlive the emulators using them.
//!
//! A disk is one zero-initialised allocation per namespace (pages are
//! committed by the OS on first write), created by the first emulator that
//! names it. An emulator *attaches* it at start: the images move out of the
//! registry into the emulator's backing ([`RamDiskLease`]), so the data
//! path touches them without any lock; dropping the lease (the emulator is
//! dropped, or loses power) moves them back. Attaching and detaching move
//! a few pointers and never copy an image, so a crash-test harness can
//! power-fail and restart an emulator thousands of times cheaply.
//!
//! While attached, the registry keeps the disk's entry with its layout and
//! no image: a second emulator naming it is refused
//! ([`EmuError::RamDiskInUse`]), and so is [`remove_ram_disk`].

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::config::NamespaceSpec;
use crate::zeroed::zeroed_vec;
use crate::EmuError;

/// One disk in the registry.
#[derive(Debug)]
struct Disk {
    /// (size in logical blocks, logical block size in bytes) per namespace,
    /// NSID order.
    layout: Vec<(u64, u32)>,
    /// The images, one per namespace; `None` while an emulator holds them.
    image: Option<Vec<Vec<u8>>>,
}

/// Every RAM disk of the process, by name.
static REGISTRY: Mutex<BTreeMap<String, Disk>> = Mutex::new(BTreeMap::new());

fn registry() -> MutexGuard<'static, BTreeMap<String, Disk>> {
    // A panic while holding the lock leaves a valid map: keep using it.
    REGISTRY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The images of one attached RAM disk, owned by an emulator's backing
/// until dropped, which gives them back to the registry.
#[derive(Debug)]
pub(crate) struct RamDiskLease {
    name: String,
    image: Vec<Vec<u8>>,
}

impl RamDiskLease {
    /// Attaches RAM disk `name` for namespaces `namespaces`, creating it
    /// (zeroed) if the registry has no disk of that name.
    ///
    /// # Errors
    ///
    /// [`EmuError::RamDiskInUse`] while another emulator holds it,
    /// [`EmuError::RamDiskLayout`] when its namespaces differ from
    /// `namespaces` (count, sizes or block sizes), [`EmuError::OutOfMemory`]
    /// when a new disk cannot be allocated.
    pub(crate) fn attach(name: &str, namespaces: &[NamespaceSpec]) -> Result<Self, EmuError> {
        let layout: Vec<(u64, u32)> = namespaces.iter().map(|n| (n.blocks, n.block_size)).collect();
        {
            let mut reg = registry();
            if let Some(disk) = reg.get_mut(name) {
                if disk.layout != layout {
                    return Err(EmuError::RamDiskLayout {
                        name: name.to_owned(),
                        existing: disk.layout.clone(),
                        requested: layout,
                    });
                }
                let image =
                    disk.image.take().ok_or_else(|| EmuError::RamDiskInUse { name: name.to_owned() })?;
                return Ok(Self { name: name.to_owned(), image });
            }
            // Reserve the name (attached, no image yet) and allocate
            // without holding the registry's lock.
            reg.insert(name.to_owned(), Disk { layout: layout.clone(), image: None });
        }
        match allocate(namespaces) {
            Ok(image) => Ok(Self { name: name.to_owned(), image }),
            Err(e) => {
                registry().remove(name);
                Err(e)
            }
        }
    }

    /// The namespaces' images, NSID order; each is the namespace's size in
    /// bytes.
    pub(crate) fn images(&mut self) -> &mut [Vec<u8>] {
        &mut self.image
    }
}

impl Drop for RamDiskLease {
    fn drop(&mut self) {
        let image = std::mem::take(&mut self.image);
        if let Some(disk) = registry().get_mut(&self.name) {
            disk.image = Some(image);
        }
    }
}

/// One zeroed image per namespace.
fn allocate(namespaces: &[NamespaceSpec]) -> Result<Vec<Vec<u8>>, EmuError> {
    let mut v = Vec::with_capacity(namespaces.len());
    for ns in namespaces {
        let bytes = ns.bytes().ok_or(EmuError::OutOfMemory { bytes: u64::MAX })?;
        let n = usize::try_from(bytes).map_err(|_| EmuError::OutOfMemory { bytes })?;
        v.push(zeroed_vec(n)?);
    }
    Ok(v)
}

/// Removes RAM disk `name` from the process's registry and frees its
/// memory. Returns `Ok(true)` when it existed, `Ok(false)` when there was
/// no disk of that name.
///
/// # Errors
///
/// [`EmuError::RamDiskInUse`] while an emulator holds it (drop the
/// emulator, or [`crate::Emulator::power_fail`] it, first).
pub fn remove_ram_disk(name: &str) -> Result<bool, EmuError> {
    let removed = {
        let mut reg = registry();
        match reg.get(name) {
            None => return Ok(false),
            Some(d) if d.image.is_none() => return Err(EmuError::RamDiskInUse { name: name.to_owned() }),
            Some(_) => reg.remove(name),
        }
    };
    // Freed outside the lock (large images take a while to unmap).
    drop(removed);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_detach_reattach_keeps_the_image_and_refuses_a_second_holder() {
        let ns = [NamespaceSpec::new(8, 512), NamespaceSpec::new(2, 4096)];
        let mut a = RamDiskLease::attach("unit-ram-disk", &ns).unwrap();
        assert_eq!(a.images()[0].len(), 4096);
        assert_eq!(a.images()[1].len(), 8192);
        a.images()[1][100] = 7;
        let ptr = a.images()[1].as_ptr();
        assert!(matches!(RamDiskLease::attach("unit-ram-disk", &ns), Err(EmuError::RamDiskInUse { .. })));
        assert!(matches!(remove_ram_disk("unit-ram-disk"), Err(EmuError::RamDiskInUse { .. })));
        drop(a);
        let wrong = [NamespaceSpec::new(8, 512)];
        assert!(matches!(
            RamDiskLease::attach("unit-ram-disk", &wrong),
            Err(EmuError::RamDiskLayout { existing, .. }) if existing == [(8, 512), (2, 4096)]
        ));
        let mut b = RamDiskLease::attach("unit-ram-disk", &ns).unwrap();
        assert_eq!(b.images()[1][100], 7);
        assert_eq!(b.images()[1].as_ptr(), ptr, "moved back, not copied");
        drop(b);
        assert!(remove_ram_disk("unit-ram-disk").unwrap());
        assert!(!remove_ram_disk("unit-ram-disk").unwrap());
        let mut c = RamDiskLease::attach("unit-ram-disk", &wrong).unwrap();
        assert!(c.images()[0].iter().all(|&b| b == 0), "a new disk after removal");
        drop(c);
        remove_ram_disk("unit-ram-disk").unwrap();
    }
}
