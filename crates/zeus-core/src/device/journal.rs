//! Crash-safe restore of GPU settings: a journal of original values written before the first change.
//!
//! An optimizer that changes a GPU's power limit restores it when the process ends normally or by
//! a catchable signal. SIGKILL (or a power cut, or an OOM kill) cannot be caught, so before the
//! first change the original limit is written here, one JSON file per GPU UUID. Whoever opens
//! the GPU next (a new optimizer, or `python -m zeus.device restore`) finds the entry of the dead
//! process and puts the original back.
//!
//! Rules:
//! - An entry is written at most once per GPU: if one already exists, the value in it is the
//!   true original (the current limit may be what a killed process left behind), so it is kept.
//! - Writes are atomic: a temporary file in the same directory, fsynced, then linked into place.
//!   Linking fails when the target exists, which makes "create unless present" race-free.
//! - An entry records the owning process. Entries of live processes belong to them and are left
//!   alone by [`Journal::restore_stale`].
//!
//! Directory: `$ZEUS_STATE_DIR`, else `$XDG_STATE_HOME/zeus`, else `~/.local/state/zeus`, else
//! `/var/tmp/zeus` (which survives reboots on most systems, unlike `/tmp`).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{GpuError, Gpus};

/// One journaled GPU: its power limit before zeus first changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub uuid: String,
    /// The original power limit, mW.
    pub power_limit_mw: u32,
    /// The process that changed the GPU.
    pub pid: u32,
    /// When the entry was written, whole seconds since the epoch (for people reading it).
    pub created: u64,
}

/// What [`Journal::restore_stale`] did for one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Visible GPU index.
    pub index: usize,
    pub uuid: String,
    pub power_limit_mw: u32,
    /// PID of the process that left the entry.
    pub pid: u32,
}

/// The default journal directory (see the module docs). Not created here.
pub fn default_dir() -> PathBuf {
    let from_env = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = from_env("ZEUS_STATE_DIR") {
        return d;
    }
    if let Some(d) = from_env("XDG_STATE_HOME") {
        return d.join("zeus");
    }
    if let Some(h) = from_env("HOME") {
        return h.join(".local").join("state").join("zeus");
    }
    PathBuf::from("/var/tmp/zeus")
}

/// Whether process `pid` exists. Permission errors mean it exists but belongs to someone else.
pub fn process_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for the process; it sends nothing.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A journal directory.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
}

impl Journal {
    /// The journal at [`default_dir`].
    pub fn default_location() -> Journal {
        Journal::at(default_dir())
    }

    pub fn at(dir: impl Into<PathBuf>) -> Journal {
        Journal { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of GPU `uuid`. UUIDs are `GPU-<hex and dashes>`; anything else is replaced so a
    /// name can never leave the directory.
    pub fn path_for(&self, uuid: &str) -> PathBuf {
        let safe: String = uuid
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join(format!("power-limit-{safe}.json"))
    }

    /// Journal `uuid`'s original power limit unless an entry exists already.
    ///
    /// Returns the entry now on disk: the new one, or the older one that was kept.
    pub fn record(&self, uuid: &str, power_limit_mw: u32) -> io::Result<JournalEntry> {
        if let Some(existing) = self.get(uuid)? {
            return Ok(existing);
        }
        fs::create_dir_all(&self.dir)?;
        let entry = JournalEntry {
            uuid: uuid.to_string(),
            power_limit_mw,
            pid: std::process::id(),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        let target = self.path_for(uuid);
        let tmp = self.temp_path(&target);
        let body = serde_json::to_vec_pretty(&entry).map_err(io::Error::other)?;
        {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
        }
        // A hard link refuses to replace an existing file: if another process journaled the
        // same GPU in the meantime, its (equally original) value stands.
        let linked = fs::hard_link(&tmp, &target);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                sync_dir(&self.dir);
                Ok(entry)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self
                .get(uuid)?
                .ok_or_else(|| io::Error::other("journal entry vanished")),
            Err(e) => Err(e),
        }
    }

    fn temp_path(&self, target: &Path) -> PathBuf {
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("entry");
        self.dir.join(format!(".{name}.{}.tmp", std::process::id()))
    }

    /// The entry of `uuid`, if any. A file that does not parse is an error naming the file.
    pub fn get(&self, uuid: &str) -> io::Result<Option<JournalEntry>> {
        read_entry(&self.path_for(uuid))
    }

    /// Every entry, sorted by UUID.
    pub fn entries(&self) -> io::Result<Vec<JournalEntry>> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for item in rd {
            let path = item?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("power-limit-") && name.ends_with(".json") {
                if let Some(e) = read_entry(&path)? {
                    out.push(e);
                }
            }
        }
        out.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        Ok(out)
    }

    /// Remove `uuid`'s entry. Returns whether there was one.
    pub fn clear(&self, uuid: &str) -> io::Result<bool> {
        match fs::remove_file(self.path_for(uuid)) {
            Ok(()) => {
                sync_dir(&self.dir);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Put back the journaled power limit of every visible GPU whose entry was left by a process
    /// that no longer runs (or, with `include_live`, by any process), then clear those entries.
    ///
    /// An entry is cleared only after its limit was set, so a failure leaves it for the next try.
    pub fn restore_stale(
        &self,
        gpus: &Gpus,
        include_live: bool,
    ) -> Result<Vec<Restored>, JournalError> {
        let mut done = Vec::new();
        for index in 0..gpus.len() {
            let uuid = gpus.device(index)?.uuid()?;
            let Some(entry) = self.get(&uuid)? else {
                continue;
            };
            let own = entry.pid == std::process::id();
            if !include_live && (own || process_alive(entry.pid)) {
                continue;
            }
            gpus.set_power_management_limit(index, entry.power_limit_mw)?;
            self.clear(&uuid)?;
            done.push(Restored {
                index,
                uuid,
                power_limit_mw: entry.power_limit_mw,
                pid: entry.pid,
            });
        }
        Ok(done)
    }
}

/// Errors of [`Journal::restore_stale`]: file system or device.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

fn read_entry(path: &Path) -> io::Result<Option<JournalEntry>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("corrupt journal entry {}: {e}", path.display()),
        )
    })
}

/// Make a rename or unlink durable. Best effort: some file systems refuse to open directories.
fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{preset, Load, SimCluster, SimConfig};
    use crate::device::{BackendKind, Clock, Gpu};
    use std::sync::Arc;

    fn sim_gpus() -> Gpus {
        let cluster = SimCluster::new(SimConfig {
            presets: vec![preset::find("A40").unwrap(), preset::find("V100").unwrap()],
            virtual_clock: true,
            privileged: true,
            curve: None,
            load: Load::Idle,
        });
        let clock: Arc<dyn Clock> = cluster.clock();
        let all: Vec<Arc<dyn Gpu>> = cluster
            .devices()
            .iter()
            .map(|d| d.clone() as Arc<dyn Gpu>)
            .collect();
        Gpus::with_indices(BackendKind::Sim, all, vec![0, 1], clock)
    }

    #[test]
    fn record_keeps_the_first_original() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path().join("nested"));
        let first = j.record("GPU-abc", 250_000).unwrap();
        assert_eq!(first.power_limit_mw, 250_000);
        assert_eq!(first.pid, std::process::id());
        let second = j.record("GPU-abc", 100_000).unwrap();
        assert_eq!(second.power_limit_mw, 250_000);
        assert_eq!(j.entries().unwrap(), vec![first]);
        // No temporary files are left behind.
        let names: Vec<_> = fs::read_dir(j.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(j.clear("GPU-abc").unwrap());
        assert!(!j.clear("GPU-abc").unwrap());
        assert!(j.entries().unwrap().is_empty());
    }

    #[test]
    fn uuids_cannot_escape_the_directory() {
        let j = Journal::at("/state");
        assert_eq!(
            j.path_for("../../etc/passwd"),
            PathBuf::from("/state/power-limit-______etc_passwd.json")
        );
    }

    #[test]
    fn corrupt_entries_are_reported_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path());
        fs::write(j.path_for("GPU-x"), b"{not json").unwrap();
        let e = j.get("GPU-x").unwrap_err();
        assert!(e.to_string().contains("power-limit-GPU-x.json"), "{e}");
    }

    #[test]
    fn restore_stale_skips_live_owners_and_restores_dead_ones() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path());
        let gpus = sim_gpus();
        let uuid0 = gpus.device(0).unwrap().uuid().unwrap();
        let uuid1 = gpus.device(1).unwrap().uuid().unwrap();
        // GPU 0: journaled by this (live) process.
        j.record(&uuid0, 200_000).unwrap();
        // GPU 1: journaled by a process that is gone.
        let dead = JournalEntry {
            uuid: uuid1.clone(),
            power_limit_mw: 150_000,
            pid: i32::MAX as u32,
            created: 0,
        };
        fs::write(j.path_for(&uuid1), serde_json::to_vec(&dead).unwrap()).unwrap();
        gpus.set_power_management_limit(1, 250_000).unwrap();

        let done = j.restore_stale(&gpus, false).unwrap();
        assert_eq!(
            done,
            vec![Restored {
                index: 1,
                uuid: uuid1.clone(),
                power_limit_mw: 150_000,
                pid: i32::MAX as u32
            }]
        );
        assert_eq!(
            gpus.device(1).unwrap().power_management_limit().unwrap(),
            150_000
        );
        assert!(j.get(&uuid1).unwrap().is_none());
        assert!(j.get(&uuid0).unwrap().is_some());

        let done = j.restore_stale(&gpus, true).unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(
            gpus.device(0).unwrap().power_management_limit().unwrap(),
            200_000
        );
        assert!(j.entries().unwrap().is_empty());
    }

    #[test]
    fn a_failed_restore_keeps_the_entry() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path());
        let gpus = sim_gpus();
        let uuid = gpus.device(0).unwrap().uuid().unwrap();
        // Out of the A40's range: the set fails and the entry must survive for a later attempt.
        let bad = JournalEntry {
            uuid: uuid.clone(),
            power_limit_mw: 5_000,
            pid: i32::MAX as u32,
            created: 0,
        };
        fs::write(j.path_for(&uuid), serde_json::to_vec(&bad).unwrap()).unwrap();
        assert!(j.restore_stale(&gpus, false).is_err());
        assert!(j.get(&uuid).unwrap().is_some());
    }

    #[test]
    fn process_alive_sees_self_not_nonsense() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(0));
        assert!(!process_alive(u32::MAX));
    }
}
