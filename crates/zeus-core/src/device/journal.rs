//! Crash-safe restore of GPU settings: a journal of what zeus changed, written before the change.
//!
//! An optimizer that changes a GPU's power limit, or locks its clocks, undoes that when the
//! process ends normally or by a catchable signal. SIGKILL (or a power cut, or an OOM kill) cannot
//! be caught, so before the first change the setting to return to is written here. Whoever opens
//! the GPU next (a new optimizer or frequency controller, `python -m zeus.device restore`, or
//! `zeus-monitor --restore`) finds the entry of the dead process and puts the original back.
//!
//! Two kinds of entry, one JSON file per GPU UUID and kind:
//! - `power-limit-<uuid>.json`: `{"uuid", "power_limit_mw", "pid", "created"}`, the limit before
//!   zeus first changed it ([`JournalEntry`]). This format predates clock entries and is
//!   unchanged, so journals written by older builds still restore.
//! - `clocks-<uuid>.json`: `{"uuid", "gpu_clocks", "memory_clocks", "pid", "created"}`
//!   ([`ClockEntry`]): which clocks zeus locked. The state to return to is always "unlocked"
//!   (`reset_gpu_locked_clocks` / `reset_memory_locked_clocks`), so only the kinds are recorded.
//!
//! A separate file per kind (rather than new optional fields in the power-limit file) keeps both
//! kinds independent: the power-limit guard and the frequency controller have different
//! lifetimes, each creates and clears its own file without a read-modify-write of the other's,
//! and "create unless present" stays a single atomic link for either.
//!
//! Rules:
//! - A power-limit entry is written at most once per GPU: if one already exists, the value in it
//!   is the true original (the current limit may be what a killed process left behind), so it is
//!   kept. A clock entry that exists already is kept too; if it lacks a kind now being locked, it
//!   is atomically replaced by one naming both (keeping its owner), so a restore undoes all locks.
//! - Writes are atomic: a temporary file in the same directory, fsynced, then linked into place
//!   (or renamed over the old entry when widening a clock entry). Linking fails when the target
//!   exists, which makes "create unless present" race-free.
//! - An entry records the owning process. Entries of live processes belong to them and are left
//!   alone by [`Journal::restore_stale`].
//! - An entry is cleared only after its setting was put back, so a failure leaves it for the next
//!   try. [`Journal::restore_stale`] tries every kind on every GPU even when some fail.
//!
//! Directory: `$ZEUS_STATE_DIR`, else `$XDG_STATE_HOME/zeus`, else `~/.local/state/zeus`, else
//! `/var/tmp/zeus` (which survives reboots on most systems, unlike `/tmp`).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{GpuError, Gpus};

/// The kinds of setting the journal records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The power management limit.
    PowerLimit,
    /// Locked GPU (graphics) and/or memory clocks.
    Clocks,
}

impl Kind {
    /// File name prefix of this kind's entries.
    fn prefix(self) -> &'static str {
        match self {
            Kind::PowerLimit => "power-limit-",
            Kind::Clocks => "clocks-",
        }
    }

    /// Short name (`power_limit`, `clocks`), as the Python bindings report it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::PowerLimit => "power_limit",
            Kind::Clocks => "clocks",
        }
    }
}

/// One journaled GPU power limit: its value before zeus first changed it.
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

/// Which clocks of a GPU are locked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockLocks {
    /// Graphics clocks (`set_gpu_locked_clocks`).
    #[serde(rename = "gpu_clocks", default)]
    pub gpu: bool,
    /// Memory clocks (`set_memory_locked_clocks`).
    #[serde(rename = "memory_clocks", default)]
    pub memory: bool,
}

impl ClockLocks {
    /// Whether neither kind is locked.
    pub fn is_empty(self) -> bool {
        !self.gpu && !self.memory
    }

    /// Every kind locked in `self` or `other`.
    pub fn union(self, other: ClockLocks) -> ClockLocks {
        ClockLocks {
            gpu: self.gpu || other.gpu,
            memory: self.memory || other.memory,
        }
    }

    /// Whether every kind locked in `other` is also in `self`.
    pub fn covers(self, other: ClockLocks) -> bool {
        self.union(other) == self
    }
}

/// One journaled GPU whose clocks zeus locked; restoring means unlocking them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockEntry {
    pub uuid: String,
    #[serde(flatten)]
    pub locks: ClockLocks,
    /// The process that locked the clocks.
    pub pid: u32,
    /// When the entry was written, whole seconds since the epoch.
    pub created: u64,
}

/// Any journal entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    PowerLimit(JournalEntry),
    Clocks(ClockEntry),
}

impl Entry {
    pub fn kind(&self) -> Kind {
        match self {
            Entry::PowerLimit(_) => Kind::PowerLimit,
            Entry::Clocks(_) => Kind::Clocks,
        }
    }

    pub fn uuid(&self) -> &str {
        match self {
            Entry::PowerLimit(e) => &e.uuid,
            Entry::Clocks(e) => &e.uuid,
        }
    }

    pub fn pid(&self) -> u32 {
        match self {
            Entry::PowerLimit(e) => e.pid,
            Entry::Clocks(e) => e.pid,
        }
    }
}

/// What was put back on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoredSetting {
    /// The power limit was set to this value, mW.
    PowerLimit { power_limit_mw: u32 },
    /// These clock locks were reset.
    Clocks(ClockLocks),
}

impl RestoredSetting {
    pub fn kind(&self) -> Kind {
        match self {
            RestoredSetting::PowerLimit { .. } => Kind::PowerLimit,
            RestoredSetting::Clocks(_) => Kind::Clocks,
        }
    }
}

/// What [`Journal::restore_stale`] did for one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Visible GPU index.
    pub index: usize,
    pub uuid: String,
    pub setting: RestoredSetting,
    /// PID of the process that left the entry.
    pub pid: u32,
}

/// An entry (or GPU) [`Journal::restore_stale`] could not restore; its entry stays journaled.
#[derive(Debug)]
pub struct RestoreFailure {
    /// Visible GPU index.
    pub index: usize,
    /// The GPU's UUID, unless reading it was what failed.
    pub uuid: Option<String>,
    /// The kind of entry, unless the failure came before any entry was read.
    pub kind: Option<Kind>,
    pub error: JournalError,
}

/// The outcome of [`Journal::restore_stale`]: every GPU and kind is tried, whatever fails.
#[derive(Debug, Default)]
pub struct RestoreReport {
    pub restored: Vec<Restored>,
    pub failed: Vec<RestoreFailure>,
}

impl RestoreReport {
    /// The restored entries, or the first failure if any.
    pub fn into_result(self) -> Result<Vec<Restored>, JournalError> {
        match self.failed.into_iter().next() {
            Some(f) => Err(f.error),
            None => Ok(self.restored),
        }
    }
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

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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

    /// The file of GPU `uuid`'s entry of `kind`. UUIDs are `GPU-<hex and dashes>`; anything
    /// else is replaced so a name can never leave the directory.
    pub fn path_of(&self, kind: Kind, uuid: &str) -> PathBuf {
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
        self.dir.join(format!("{}{safe}.json", kind.prefix()))
    }

    /// The power-limit file of GPU `uuid`.
    pub fn path_for(&self, uuid: &str) -> PathBuf {
        self.path_of(Kind::PowerLimit, uuid)
    }

    /// Journal `uuid`'s original power limit unless an entry exists already.
    ///
    /// Returns the entry now on disk: the new one, or the older one that was kept.
    pub fn record(&self, uuid: &str, power_limit_mw: u32) -> io::Result<JournalEntry> {
        if let Some(existing) = self.get(uuid)? {
            return Ok(existing);
        }
        let entry = JournalEntry {
            uuid: uuid.to_string(),
            power_limit_mw,
            pid: std::process::id(),
            created: now_secs(),
        };
        let target = self.path_for(uuid);
        if self.write_new(&target, &entry)? {
            return Ok(entry);
        }
        // Another process journaled the same GPU in the meantime: its (equally original)
        // value stands.
        self.get(uuid)?
            .ok_or_else(|| io::Error::other("journal entry vanished"))
    }

    /// Journal that zeus is about to lock `locks` of GPU `uuid`.
    ///
    /// An existing entry is kept (with its owner); if it does not name every kind in `locks`
    /// it is replaced by one naming both its kinds and `locks`. Returns the entry now on disk.
    pub fn record_clocks(&self, uuid: &str, locks: ClockLocks) -> io::Result<ClockEntry> {
        let target = self.path_of(Kind::Clocks, uuid);
        // Two rounds: a concurrent writer can make the first link fail; the second round then
        // sees (and, if needed, widens) its entry.
        for _ in 0..2 {
            match self.get_clocks(uuid)? {
                Some(existing) if existing.locks.covers(locks) => return Ok(existing),
                Some(existing) => {
                    let wider = ClockEntry {
                        locks: existing.locks.union(locks),
                        ..existing
                    };
                    self.write_replace(&target, &wider)?;
                    return Ok(wider);
                }
                None => {
                    let entry = ClockEntry {
                        uuid: uuid.to_string(),
                        locks,
                        pid: std::process::id(),
                        created: now_secs(),
                    };
                    if self.write_new(&target, &entry)? {
                        return Ok(entry);
                    }
                }
            }
        }
        self.get_clocks(uuid)?
            .ok_or_else(|| io::Error::other("journal entry vanished"))
    }

    /// Write `value` to a fsynced temporary file next to `target`.
    fn write_temp<T: Serialize>(&self, target: &Path, value: &T) -> io::Result<PathBuf> {
        fs::create_dir_all(&self.dir)?;
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("entry");
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let body = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        Ok(tmp)
    }

    /// Create `target` holding `value` unless it exists. Returns whether it was created.
    fn write_new<T: Serialize>(&self, target: &Path, value: &T) -> io::Result<bool> {
        let tmp = self.write_temp(target, value)?;
        // A hard link refuses to replace an existing file, which makes this race-free.
        let linked = fs::hard_link(&tmp, target);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                sync_dir(&self.dir);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Atomically replace (or create) `target` with `value`.
    fn write_replace<T: Serialize>(&self, target: &Path, value: &T) -> io::Result<()> {
        let tmp = self.write_temp(target, value)?;
        if let Err(e) = fs::rename(&tmp, target) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        sync_dir(&self.dir);
        Ok(())
    }

    /// The power-limit entry of `uuid`, if any. A file that does not parse is an error naming
    /// the file.
    pub fn get(&self, uuid: &str) -> io::Result<Option<JournalEntry>> {
        read_json(&self.path_for(uuid))
    }

    /// The clock entry of `uuid`, if any.
    pub fn get_clocks(&self, uuid: &str) -> io::Result<Option<ClockEntry>> {
        read_json(&self.path_of(Kind::Clocks, uuid))
    }

    /// Every entry of every kind, sorted by UUID, power limits before clocks.
    pub fn all_entries(&self) -> io::Result<Vec<Entry>> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for item in rd {
            let path = item?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.ends_with(".json") {
                continue;
            }
            if name.starts_with(Kind::PowerLimit.prefix()) {
                if let Some(e) = read_json(&path)? {
                    out.push(Entry::PowerLimit(e));
                }
            } else if name.starts_with(Kind::Clocks.prefix()) {
                if let Some(e) = read_json(&path)? {
                    out.push(Entry::Clocks(e));
                }
            }
        }
        out.sort_by(|a, b| {
            (a.uuid(), a.kind() != Kind::PowerLimit).cmp(&(b.uuid(), b.kind() != Kind::PowerLimit))
        });
        Ok(out)
    }

    /// Every power-limit entry, sorted by UUID.
    pub fn entries(&self) -> io::Result<Vec<JournalEntry>> {
        Ok(self
            .all_entries()?
            .into_iter()
            .filter_map(|e| match e {
                Entry::PowerLimit(e) => Some(e),
                Entry::Clocks(_) => None,
            })
            .collect())
    }

    /// Every clock entry, sorted by UUID.
    pub fn clock_entries(&self) -> io::Result<Vec<ClockEntry>> {
        Ok(self
            .all_entries()?
            .into_iter()
            .filter_map(|e| match e {
                Entry::Clocks(e) => Some(e),
                Entry::PowerLimit(_) => None,
            })
            .collect())
    }

    /// Remove `uuid`'s entry of `kind`. Returns whether there was one.
    pub fn clear_kind(&self, kind: Kind, uuid: &str) -> io::Result<bool> {
        match fs::remove_file(self.path_of(kind, uuid)) {
            Ok(()) => {
                sync_dir(&self.dir);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Remove `uuid`'s power-limit entry. Returns whether there was one.
    pub fn clear(&self, uuid: &str) -> io::Result<bool> {
        self.clear_kind(Kind::PowerLimit, uuid)
    }

    /// Remove `uuid`'s clock entry. Returns whether there was one.
    pub fn clear_clocks(&self, uuid: &str) -> io::Result<bool> {
        self.clear_kind(Kind::Clocks, uuid)
    }

    /// Undo every journaled change on the visible GPUs whose entry was left by a process that
    /// no longer runs (or, with `include_live`, by any process), then clear those entries:
    /// power limits are set back to their original, locked clocks are reset.
    ///
    /// Every kind on every GPU is tried; failures are collected in the report and their
    /// entries stay for the next try.
    pub fn restore_stale(&self, gpus: &Gpus, include_live: bool) -> RestoreReport {
        let mut report = RestoreReport::default();
        for index in 0..gpus.len() {
            let uuid = match gpus.device(index).and_then(|d| d.uuid()) {
                Ok(u) => u,
                Err(e) => {
                    report.failed.push(RestoreFailure {
                        index,
                        uuid: None,
                        kind: None,
                        error: e.into(),
                    });
                    continue;
                }
            };
            for kind in [Kind::PowerLimit, Kind::Clocks] {
                match self.restore_one(gpus, index, &uuid, kind, include_live) {
                    Ok(Some(r)) => report.restored.push(r),
                    Ok(None) => {}
                    Err(error) => report.failed.push(RestoreFailure {
                        index,
                        uuid: Some(uuid.clone()),
                        kind: Some(kind),
                        error,
                    }),
                }
            }
        }
        report
    }

    fn restore_one(
        &self,
        gpus: &Gpus,
        index: usize,
        uuid: &str,
        kind: Kind,
        include_live: bool,
    ) -> Result<Option<Restored>, JournalError> {
        let stale = |pid: u32| include_live || (pid != std::process::id() && !process_alive(pid));
        let (setting, pid) = match kind {
            Kind::PowerLimit => {
                let Some(entry) = self.get(uuid)? else {
                    return Ok(None);
                };
                if !stale(entry.pid) {
                    return Ok(None);
                }
                gpus.set_power_management_limit(index, entry.power_limit_mw)?;
                let mw = entry.power_limit_mw;
                (
                    RestoredSetting::PowerLimit { power_limit_mw: mw },
                    entry.pid,
                )
            }
            Kind::Clocks => {
                let Some(entry) = self.get_clocks(uuid)? else {
                    return Ok(None);
                };
                if !stale(entry.pid) {
                    return Ok(None);
                }
                let dev = gpus.device(index)?;
                // Both resets are tried before reporting, so one failing kind does not keep the
                // other locked. A GPU that cannot lock a kind reports NotSupported on reset too:
                // nothing was locked, so that counts as restored (the entry names what zeus
                // was about to lock, written before it knew whether the GPU supports it).
                let unsupported_ok = |r: Result<(), GpuError>| match r {
                    Err(GpuError::NotSupported(_)) => Ok(()),
                    other => other,
                };
                let gpu = if entry.locks.gpu {
                    unsupported_ok(dev.reset_gpu_locked_clocks())
                } else {
                    Ok(())
                };
                let memory = if entry.locks.memory {
                    unsupported_ok(dev.reset_memory_locked_clocks())
                } else {
                    Ok(())
                };
                gpu?;
                memory?;
                (RestoredSetting::Clocks(entry.locks), entry.pid)
            }
        };
        self.clear_kind(kind, uuid)?;
        Ok(Some(Restored {
            index,
            uuid: uuid.to_string(),
            setting,
            pid,
        }))
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

fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
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
        sim_cluster_gpus().1
    }

    fn sim_cluster_gpus() -> (SimCluster, Gpus) {
        let cluster = SimCluster::new(SimConfig {
            presets: vec![preset::find("A40").unwrap(), preset::find("V100").unwrap()],
            virtual_clock: true,
            privileged: true,
            workload: None,
            fidelity: crate::device::sim::Fidelity::Ideal,
            load: Load::Idle,
            energy_read_cost_s: None,
        });
        let clock: Arc<dyn Clock> = cluster.clock();
        let all: Vec<Arc<dyn Gpu>> = cluster
            .devices()
            .iter()
            .map(|d| d.clone() as Arc<dyn Gpu>)
            .collect();
        let gpus = Gpus::with_indices(BackendKind::Sim, all, vec![0, 1], clock);
        (cluster, gpus)
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

        let done = j.restore_stale(&gpus, false).into_result().unwrap();
        assert_eq!(
            done,
            vec![Restored {
                index: 1,
                uuid: uuid1.clone(),
                setting: RestoredSetting::PowerLimit {
                    power_limit_mw: 150_000
                },
                pid: i32::MAX as u32
            }]
        );
        assert_eq!(
            gpus.device(1).unwrap().power_management_limit().unwrap(),
            150_000
        );
        assert!(j.get(&uuid1).unwrap().is_none());
        assert!(j.get(&uuid0).unwrap().is_some());

        let done = j.restore_stale(&gpus, true).into_result().unwrap();
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
        let report = j.restore_stale(&gpus, false);
        assert!(report.restored.is_empty());
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.failed[0].kind, Some(Kind::PowerLimit));
        assert!(matches!(
            report.failed[0].error,
            JournalError::Gpu(GpuError::InvalidArg(_))
        ));
        assert!(j.get(&uuid).unwrap().is_some());
    }

    const DEAD: u32 = i32::MAX as u32;

    fn both() -> ClockLocks {
        ClockLocks {
            gpu: true,
            memory: true,
        }
    }

    #[test]
    fn clock_records_are_kept_widened_and_separate_from_power_limits() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path());
        let gpu_only = ClockLocks {
            gpu: true,
            memory: false,
        };
        let first = j.record_clocks("GPU-abc", gpu_only).unwrap();
        assert_eq!((first.locks, first.pid), (gpu_only, std::process::id()));
        // Recording a subset keeps the entry as it is.
        assert_eq!(j.record_clocks("GPU-abc", gpu_only).unwrap(), first);
        // A new kind widens it, keeping owner and creation time.
        let wider = j
            .record_clocks(
                "GPU-abc",
                ClockLocks {
                    gpu: false,
                    memory: true,
                },
            )
            .unwrap();
        assert_eq!(
            wider,
            ClockEntry {
                locks: both(),
                ..first.clone()
            }
        );
        assert_eq!(j.get_clocks("GPU-abc").unwrap(), Some(wider.clone()));
        // The power-limit entry of the same GPU lives in its own file.
        let pl = j.record("GPU-abc", 250_000).unwrap();
        assert_eq!(j.entries().unwrap(), vec![pl.clone()]);
        assert_eq!(j.clock_entries().unwrap(), vec![wider.clone()]);
        assert_eq!(
            j.all_entries().unwrap(),
            vec![Entry::PowerLimit(pl), Entry::Clocks(wider)]
        );
        let mut names: Vec<_> = fs::read_dir(j.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["clocks-GPU-abc.json", "power-limit-GPU-abc.json"]);
        // The on-disk format is the documented one.
        let raw: serde_json::Value =
            serde_json::from_slice(&fs::read(j.path_of(Kind::Clocks, "GPU-abc")).unwrap()).unwrap();
        assert_eq!(raw["gpu_clocks"], true);
        assert_eq!(raw["memory_clocks"], true);
        assert_eq!(raw["pid"], std::process::id());
        assert!(j.clear_clocks("GPU-abc").unwrap());
        assert!(!j.clear_clocks("GPU-abc").unwrap());
        assert_eq!(j.entries().unwrap().len(), 1);
    }

    #[test]
    fn old_power_limit_files_still_parse() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path());
        // Exactly what builds before clock entries wrote.
        fs::write(
            j.path_for("GPU-old"),
            br#"{"uuid": "GPU-old", "power_limit_mw": 300000, "pid": 12, "created": 1}"#,
        )
        .unwrap();
        assert_eq!(
            j.get("GPU-old").unwrap(),
            Some(JournalEntry {
                uuid: "GPU-old".into(),
                power_limit_mw: 300_000,
                pid: 12,
                created: 1
            })
        );
    }

    #[test]
    fn restore_stale_unlocks_clocks_of_dead_processes() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path());
        let (cluster, gpus) = sim_cluster_gpus();
        let a40 = &cluster.devices()[0];
        let unlocked = a40.busy_steady_state();
        let uuid = gpus.device(0).unwrap().uuid().unwrap();
        gpus.device(0)
            .unwrap()
            .set_memory_locked_clocks(5001, 5001)
            .unwrap();
        gpus.set_gpu_locked_clocks(0, 900, 900).unwrap();
        assert_ne!(a40.busy_steady_state(), unlocked);
        // Journaled by a dead process, together with a power limit.
        let entry = ClockEntry {
            uuid: uuid.clone(),
            locks: both(),
            pid: DEAD,
            created: 0,
        };
        fs::write(
            j.path_of(Kind::Clocks, &uuid),
            serde_json::to_vec(&entry).unwrap(),
        )
        .unwrap();
        let pl = JournalEntry {
            uuid: uuid.clone(),
            power_limit_mw: 200_000,
            pid: DEAD,
            created: 0,
        };
        fs::write(j.path_for(&uuid), serde_json::to_vec(&pl).unwrap()).unwrap();

        let done = j.restore_stale(&gpus, false).into_result().unwrap();
        assert_eq!(
            done.iter().map(|r| r.setting).collect::<Vec<_>>(),
            vec![
                RestoredSetting::PowerLimit {
                    power_limit_mw: 200_000
                },
                RestoredSetting::Clocks(both())
            ]
        );
        assert!(done.iter().all(|r| r.index == 0 && r.pid == DEAD));
        assert!(j.all_entries().unwrap().is_empty());
        // Clocks unlocked; the power limit is lower, so compare at the original limit.
        gpus.set_power_management_limit(0, 300_000).unwrap();
        assert_eq!(a40.busy_steady_state(), unlocked);
    }

    #[test]
    fn clock_entries_of_live_owners_stay_and_unsupported_kinds_count_as_unlocked() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path());
        let gpus = sim_gpus();
        let uuid0 = gpus.device(0).unwrap().uuid().unwrap();
        let uuid1 = gpus.device(1).unwrap().uuid().unwrap();
        // GPU 0 (A40): our own, live entry.
        j.record_clocks(&uuid0, both()).unwrap();
        // GPU 1 (V100): memory clocks cannot be locked on Volta, yet the entry names them.
        let v100 = ClockEntry {
            uuid: uuid1.clone(),
            locks: both(),
            pid: DEAD,
            created: 0,
        };
        fs::write(
            j.path_of(Kind::Clocks, &uuid1),
            serde_json::to_vec(&v100).unwrap(),
        )
        .unwrap();
        let done = j.restore_stale(&gpus, false).into_result().unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].index, 1);
        assert!(j.get_clocks(&uuid1).unwrap().is_none());
        assert!(j.get_clocks(&uuid0).unwrap().is_some());
    }

    #[test]
    fn one_failing_gpu_does_not_stop_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path());
        let gpus = sim_gpus();
        let uuid0 = gpus.device(0).unwrap().uuid().unwrap();
        let uuid1 = gpus.device(1).unwrap().uuid().unwrap();
        // GPU 0: an impossible power limit, and clocks to unlock.
        let bad = JournalEntry {
            uuid: uuid0.clone(),
            power_limit_mw: 5_000,
            pid: DEAD,
            created: 0,
        };
        fs::write(j.path_for(&uuid0), serde_json::to_vec(&bad).unwrap()).unwrap();
        let clocks = ClockEntry {
            uuid: uuid0.clone(),
            locks: both(),
            pid: DEAD,
            created: 0,
        };
        fs::write(
            j.path_of(Kind::Clocks, &uuid0),
            serde_json::to_vec(&clocks).unwrap(),
        )
        .unwrap();
        // GPU 1: a good power limit.
        let good = JournalEntry {
            power_limit_mw: 200_000,
            uuid: uuid1.clone(),
            ..bad.clone()
        };
        fs::write(j.path_for(&uuid1), serde_json::to_vec(&good).unwrap()).unwrap();

        let report = j.restore_stale(&gpus, false);
        let restored: Vec<_> = report
            .restored
            .iter()
            .map(|r| (r.index, r.setting.kind()))
            .collect();
        assert_eq!(restored, vec![(0, Kind::Clocks), (1, Kind::PowerLimit)]);
        assert_eq!(report.failed.len(), 1);
        assert_eq!(
            (report.failed[0].index, report.failed[0].kind),
            (0, Some(Kind::PowerLimit))
        );
        assert_eq!(report.failed[0].uuid.as_deref(), Some(uuid0.as_str()));
        // Only the failed entry is left.
        assert_eq!(j.entries().unwrap(), vec![bad]);
        assert!(j.clock_entries().unwrap().is_empty());
        assert!(report.into_result().is_err());
    }

    #[test]
    fn process_alive_sees_self_not_nonsense() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(0));
        assert!(!process_alive(u32::MAX));
    }
}
