//! A `tuttid` child process for benchmarks that compare the runtime owning
//! its drives with the runtime as a client of the daemon (`stripe
//! --daemon`): the daemon is started on a config whose drives are the
//! benchmark's own emulated drives (same namespaces, backing, MDTS and
//! timing model), and the client runtime's config is the benchmark's with
//! each drive replaced by its `daemon` drive.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use tutti::config::{DaemonDriveConfig, DriveConfig};
use tutti::Config;

/// A running `tuttid serve`, killed (and its directory removed) on drop.
#[derive(Debug)]
pub struct DaemonChild {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Drop for DaemonChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `tuttid` binary: `explicit`, else `tuttid` next to this executable
/// (both are built into the same target directory).
pub fn tuttid_binary(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    let me = std::env::current_exe().map_err(|e| format!("locating tutti-bench: {e}"))?;
    let p = me.with_file_name("tuttid");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found: build it (cargo build --release -p tuttid) or pass --tuttid PATH",
            p.display()
        ))
    }
}

/// The daemon's YAML: every drive of `drives` (name, runtime drive config),
/// usable by `uid`, up to `queues_per_client` queue pairs per client, with
/// mediated submission when `mediated` (docs/tuttid.md).
pub fn daemon_yaml(
    socket: &Path,
    drives: &[(String, DriveConfig)],
    uid: u32,
    (queues_per_client, mediated): (u16, bool),
) -> Result<String, String> {
    let mut s = format!("socket: {}\nsocket_mode: \"0600\"\ndrives:\n", socket.display());
    for (name, d) in drives {
        // JSON is YAML's flow style: the runtime's own serialisation of
        // the drive, read back by the daemon's parser of the same type.
        let device = serde_json::to_string(d).map_err(|e| format!("drive {name}: {e}"))?;
        s.push_str(&format!(
            "  {name}:\n    device: {device}\n    allow: {{ uids: [{uid}] }}\n    queues_per_client: {queues_per_client}\n"
        ));
        if mediated {
            s.push_str("    mediated: true\n");
        }
    }
    Ok(s)
}

/// `cfg` with every drive replaced by the drive of the same name on the
/// daemon listening on `socket`.
pub fn as_client(mut cfg: Config, socket: &Path) -> Config {
    for (name, d) in cfg.drives.iter_mut() {
        *d = DriveConfig::Daemon(DaemonDriveConfig {
            socket: socket.to_owned(),
            drive: name.clone(),
            daemon_uid: None,
        });
    }
    cfg
}

impl DaemonChild {
    /// Starts `tuttid` (`binary`) serving `drives` in a fresh directory
    /// under the system's temporary directory and waits for its
    /// "listening" line.
    pub fn start(
        binary: &Path,
        drives: &[(String, DriveConfig)],
        queues_per_client: u16,
        mediated: bool,
    ) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("tutti-bench-tuttid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let socket = dir.join("tuttid.sock");
        let uid = std::fs::metadata("/proc/self").map_err(|e| format!("/proc/self: {e}"))?.uid();
        let config = dir.join("tuttid.yaml");
        let yaml = daemon_yaml(&socket, drives, uid, (queues_per_client, mediated))?;
        std::fs::write(&config, yaml).map_err(|e| format!("{}: {e}", config.display()))?;
        let mut child = Command::new(binary)
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let out = child.stdout.take();
        let d = DaemonChild { child, dir, socket };
        let mut line = String::new();
        if let Some(out) = out {
            BufReader::new(out).read_line(&mut line).map_err(|e| format!("tuttid output: {e}"))?;
        }
        if !line.contains("listening") {
            return Err(format!("tuttid did not start (said {:?})", line.trim()));
        }
        Ok(d)
    }

    /// The daemon's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_config_names_the_daemons_drives_and_the_daemon_gets_the_same_drives() {
        let cfg = Config::builtin_striped_ram(2, 8 << 20, 1 << 20);
        let drives: Vec<(String, DriveConfig)> = cfg.drives.clone().into_iter().collect();
        let sock = Path::new("/tmp/x/tuttid.sock");
        let client = as_client(cfg.clone(), sock);
        client.validate().unwrap();
        for (name, d) in &client.drives {
            assert_eq!(
                d,
                &DriveConfig::Daemon(DaemonDriveConfig {
                    socket: sock.to_owned(),
                    drive: name.clone(),
                    daemon_uid: None
                })
            );
        }
        assert_eq!(client.datapaths, cfg.datapaths, "only the drives change");
        assert!(daemon_yaml(sock, &drives, 1000, (2, true)).unwrap().contains("    mediated: true\n"));
        let yaml = daemon_yaml(sock, &drives, 1000, (2, false)).unwrap();
        assert!(!yaml.contains("mediated"), "{yaml}");
        assert!(yaml.starts_with("socket: /tmp/x/tuttid.sock\n"), "{yaml}");
        assert!(yaml.contains("  d1:\n    device: {\"emulated\":"), "{yaml}");
        assert_eq!(yaml.matches("allow: { uids: [1000] }").count(), 2, "{yaml}");
        // The device text is the drive's own serialisation: it reads back
        // as the same drive.
        let json = serde_json::to_string(&drives[0].1).unwrap();
        let back: DriveConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, drives[0].1);
    }
}
