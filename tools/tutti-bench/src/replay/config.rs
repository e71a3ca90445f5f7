//! The runtime configuration of a replay: `--config`, or the built-in
//! emulated drives (RAM, or with `--persist DIR` sparse files
//! `DIR/d0.img`, `DIR/d1.img`, ...); with `--gpu`, GPU execution.

use std::path::{Path, PathBuf};

use tutti::config::{Backing, DataPathConfig, DriveConfig, Execution};
use tutti::Config;

use super::err;
use crate::ReplayArgs;

/// Most drive image files looked for in a `--persist` directory (the
/// built-in configuration has at most 4 drives; a few more are checked so
/// that images of another layout are noticed).
const MAX_IMAGES: usize = 8;

/// The runtime configuration of `a`; its store `--store` must exist.
pub fn runtime_config(a: &ReplayArgs, block_bytes: u64) -> Result<Config, String> {
    let mut config = match &a.config {
        Some(p) => Config::from_path(p).map_err(err)?,
        None => {
            if !(1..=4).contains(&a.drives) {
                return Err("--drives must be 1 to 4".into());
            }
            let per_drive = a
                .drive_mib
                .checked_mul(1 << 20)
                .ok_or_else(|| format!("--drive-mib {} is too large", a.drive_mib))?;
            let mut c = Config::builtin_striped_ram(a.drives, per_drive, block_bytes);
            if let Some(dir) = &a.persist {
                use_files(&mut c, dir, a.drives, per_drive)?;
            }
            c
        }
    };
    if a.gpu {
        for dp in config.datapaths.values_mut() {
            match dp {
                DataPathConfig::LocalNvme(l) => l.execution = Execution::Gpu,
                DataPathConfig::StripedLocalNvme(s) => s.execution = Execution::Gpu,
                _ => {}
            }
        }
    }
    if !config.stores.contains_key(&a.store) {
        let names: Vec<&String> = config.stores.keys().collect();
        return Err(if names.is_empty() {
            "the configuration defines no stores; replay needs one (see docs/config.md)".to_owned()
        } else {
            format!("no store named {:?}: the configuration has {names:?}; pick one with --store", a.store)
        });
    }
    Ok(config)
}

/// The image file of drive `name` in `dir`.
pub fn image_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.img"))
}

/// Backs every emulated drive of `config` (named `d0`..`d{drives-1}`,
/// `drive_bytes` bytes each) by its image file in `dir`, creating `dir`
/// if missing. Image files left there by an earlier run must match this
/// run's drives in number and size: the emulator sizes an image to its
/// drive when it opens it (cutting a larger one short), so a mismatch is
/// refused here, before anything opens them. Everything else about the
/// store's geometry is checked by tutti-kv against its superblock.
fn use_files(config: &mut Config, dir: &Path, drives: usize, drive_bytes: u64) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create the --persist directory {}: {e}", dir.display()))?;
    let present: Vec<usize> =
        (0..MAX_IMAGES).filter(|i| image_path(dir, &format!("d{i}")).exists()).collect();
    if !present.is_empty() && present != (0..drives).collect::<Vec<_>>() {
        let names: Vec<String> = present.iter().map(|i| format!("d{i}.img")).collect();
        return Err(format!(
            "{} holds the drive images {} of another run, but this run has {drives} drive(s): \
             use that run's --drives, or another --persist directory",
            dir.display(),
            names.join(", ")
        ));
    }
    for (name, drive) in config.drives.iter_mut() {
        let DriveConfig::Emulated(e) = drive else { continue };
        let path = image_path(dir, name);
        if let Ok(m) = std::fs::metadata(&path) {
            if m.len() != drive_bytes {
                return Err(format!(
                    "{} holds {} bytes, but this run's drives have {drive_bytes} (--drive-mib {}): \
                     use that run's --drive-mib, or another --persist directory",
                    path.display(),
                    m.len(),
                    drive_bytes >> 20
                ));
            }
        }
        e.backing = Backing::File(path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drives_become_files_and_other_layouts_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("new");
        let mut c = Config::builtin_striped_ram(2, 1 << 20, 4096);
        use_files(&mut c, &sub, 2, 1 << 20).unwrap();
        assert!(sub.is_dir(), "created");
        let DriveConfig::Emulated(e) = &c.drives["d1"] else { panic!("emulated") };
        assert_eq!(e.backing, Backing::File(sub.join("d1.img")));
        for i in 0..2 {
            std::fs::write(sub.join(format!("d{i}.img")), vec![0u8; 1 << 20]).unwrap();
        }
        use_files(&mut Config::builtin_striped_ram(2, 1 << 20, 4096), &sub, 2, 1 << 20).unwrap();
        let e = use_files(&mut Config::builtin_striped_ram(2, 2 << 20, 4096), &sub, 2, 2 << 20).unwrap_err();
        assert!(e.contains("--drive-mib 2"), "{e}");
        let e = use_files(&mut Config::builtin_striped_ram(3, 1 << 20, 4096), &sub, 3, 1 << 20).unwrap_err();
        assert!(e.contains("d0.img, d1.img") && e.contains("3 drive(s)"), "{e}");
        assert_eq!(std::fs::metadata(sub.join("d0.img")).unwrap().len(), 1 << 20, "left alone");
    }
}
