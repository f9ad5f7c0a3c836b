//! The on-disk journal: one JSON file per GPU and kind of setting, naming the value to return to
//! and the processes that hold the GPU changed.
//!
//! Files (in [`default_dir`]):
//! - `power-limit-<uuid>.json`: `{"uuid", "power_limit_mw", "holders", "pid", "created"}`, the
//!   limit before zeus first changed it.
//! - `clocks-<uuid>.json`: `{"uuid", "gpu_clocks", "memory_clocks", "holders", "pid",
//!   "created"}`: which clocks zeus locked. The state to return to is always "unlocked", so only
//!   the kinds are recorded.
//!
//! `holders` lists every process that changed the setting and has not released it
//! ([`Owner`]: pid, start time, boot id). `pid` repeats the first holder for readers of the
//! older format, and files of older builds (a `pid` and no `holders`) still read, as a holder
//! known by its pid alone.
//!
//! Rules:
//! - Every read-modify-write of an entry happens under an exclusive `flock` of `<dir>/.lock`,
//!   so processes joining and leaving one GPU never lose each other's membership.
//! - Writes are atomic: a fsynced temporary file renamed over the entry, then the directory is
//!   fsynced. A reader sees the old entry or the new one, never half of one.
//! - A file that cannot be read as an entry (truncated, empty, not JSON) is moved aside to
//!   `<name>.corrupt-<unix seconds>` by whoever meets it under the lock; the GPU is then put back
//!   to the driver's default, since the original is unknown.
//!
//! Directory: `$ZEUS_STATE_DIR`, else `$XDG_STATE_HOME/zeus`, else `~/.local/state/zeus`, else
//! `/var/lib/zeus` for root and `/var/tmp/zeus-<uid>` for other users (both survive reboots,
//! unlike `/tmp`). The directory is created 0700 and used only when no other user can change
//! it or any directory above it (`util::private_dir`): the journal's files are created 0600
//! and never through a symlink, and a lock file that others could open (and so hold) is
//! replaced, so no other local user can redirect or stall a root process through it.

use std::fs;
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::owner::Owner;
use crate::util::private_dir;

/// The kinds of setting the journal records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The power management limit.
    PowerLimit,
    /// Locked GPU (graphics) and/or memory clocks.
    Clocks,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::PowerLimit, Kind::Clocks];

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

    /// Words for messages ("power limit", "clock locks").
    pub fn describe(self) -> &'static str {
        match self {
            Kind::PowerLimit => "power limit",
            Kind::Clocks => "clock locks",
        }
    }
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
    pub const GPU: ClockLocks = ClockLocks {
        gpu: true,
        memory: false,
    };
    pub const MEMORY: ClockLocks = ClockLocks {
        gpu: false,
        memory: true,
    };
    pub const BOTH: ClockLocks = ClockLocks {
        gpu: true,
        memory: true,
    };

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

    /// "GPU", "memory" or "GPU and memory".
    pub fn describe(self) -> &'static str {
        match (self.gpu, self.memory) {
            (true, true) => "GPU and memory",
            (true, false) => "GPU",
            (false, true) => "memory",
            (false, false) => "no",
        }
    }
}

/// The state a GPU setting returns to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Original {
    /// The power limit before zeus changed it, mW.
    PowerLimit(u32),
    /// Unlock these clocks.
    Unlock(ClockLocks),
}

impl Original {
    pub fn kind(self) -> Kind {
        match self {
            Original::PowerLimit(_) => Kind::PowerLimit,
            Original::Unlock(_) => Kind::Clocks,
        }
    }
}

/// One journaled setting of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub uuid: String,
    pub original: Original,
    /// Processes that changed the setting and have not released it, oldest first.
    pub holders: Vec<Owner>,
    /// When the entry was first written, whole seconds since the epoch (for people reading it).
    pub created: u64,
}

impl Entry {
    pub fn kind(&self) -> Kind {
        self.original.kind()
    }

    /// Holders that still run.
    pub fn live_holders(&self) -> Vec<Owner> {
        self.holders
            .iter()
            .filter(|h| h.is_alive())
            .cloned()
            .collect()
    }
}

/// The file layout of both kinds; which fields must be present depends on the kind.
#[derive(Serialize, Deserialize)]
struct EntryFile {
    uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    power_limit_mw: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu_clocks: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    memory_clocks: Option<bool>,
    #[serde(default)]
    holders: Vec<Owner>,
    /// The first holder's pid; the only owner field of entries written by older builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
    #[serde(default)]
    created: u64,
}

impl EntryFile {
    fn from_entry(e: &Entry) -> EntryFile {
        let (power_limit_mw, gpu_clocks, memory_clocks) = match e.original {
            Original::PowerLimit(mw) => (Some(mw), None, None),
            Original::Unlock(l) => (None, Some(l.gpu), Some(l.memory)),
        };
        EntryFile {
            uuid: e.uuid.clone(),
            power_limit_mw,
            gpu_clocks,
            memory_clocks,
            holders: e.holders.clone(),
            pid: e.holders.first().map(|h| h.pid),
            created: e.created,
        }
    }

    fn into_entry(self, kind: Kind) -> Result<Entry, String> {
        let original = match kind {
            Kind::PowerLimit => Original::PowerLimit(
                self.power_limit_mw
                    .ok_or("no power_limit_mw in a power-limit entry")?,
            ),
            Kind::Clocks => Original::Unlock(ClockLocks {
                gpu: self.gpu_clocks.unwrap_or(false),
                memory: self.memory_clocks.unwrap_or(false),
            }),
        };
        let mut holders = self.holders;
        if holders.is_empty() {
            if let Some(pid) = self.pid {
                holders.push(Owner::pid_only(pid));
            }
        }
        Ok(Entry {
            uuid: self.uuid,
            original,
            holders,
            created: self.created,
        })
    }
}

/// A journal file that could not be read as an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptEntry {
    pub path: PathBuf,
    pub kind: Kind,
    /// The GPU, from the file name (the content is what is unreadable).
    pub uuid_in_name: String,
    pub reason: String,
    /// Where it was moved, once moved aside.
    pub moved_to: Option<PathBuf>,
}

impl std::fmt::Display for CorruptEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unreadable journal entry {} ({})",
            self.path.display(),
            self.reason
        )?;
        if let Some(to) = &self.moved_to {
            write!(f, ", moved aside to {}", to.display())?;
        }
        Ok(())
    }
}

/// What reading one entry gives.
#[derive(Debug)]
pub enum Read {
    Absent,
    Entry(Entry),
    Corrupt(CorruptEntry),
}

/// Everything in the journal directory.
#[derive(Debug, Default)]
pub struct Scan {
    pub entries: Vec<Entry>,
    pub corrupt: Vec<CorruptEntry>,
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
    match crate::util::private_dir::euid() {
        0 => PathBuf::from("/var/lib/zeus"),
        uid => PathBuf::from(format!("/var/tmp/zeus-{uid}")),
    }
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// An exclusive lock of the journal directory; released on drop (closing the file).
pub(crate) struct DirLock {
    _file: fs::File,
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

    /// Take the directory's lock, creating the directory if needed. Blocks while another
    /// process holds it (for the few milliseconds of one entry update).
    pub(crate) fn lock(&self) -> io::Result<DirLock> {
        private_dir::ensure_private_dir(&self.dir)?;
        let path = self.dir.join(".lock");
        let file = private_dir::open_private_file(&path)?;
        loop {
            // SAFETY: flock on a descriptor we own; it is released when the file closes.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(DirLock { _file: file });
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(with_path(err, &path));
            }
        }
    }

    /// Read `uuid`'s entry of `kind`.
    pub fn read(&self, kind: Kind, uuid: &str) -> io::Result<Read> {
        read_path(&self.path_of(kind, uuid), kind, uuid)
    }

    /// Every entry and every unreadable file, entries sorted by UUID, power limits first.
    pub fn scan(&self) -> io::Result<Scan> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if missing(&e) => return Ok(Scan::default()),
            Err(e) => return Err(with_path(e, &self.dir)),
        };
        let mut scan = Scan::default();
        for item in rd {
            let path = item?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            for kind in Kind::ALL {
                if let Some(uuid) = stem.strip_prefix(kind.prefix()) {
                    match read_path(&path, kind, uuid)? {
                        Read::Absent => {}
                        Read::Entry(e) => scan.entries.push(e),
                        Read::Corrupt(c) => scan.corrupt.push(c),
                    }
                }
            }
        }
        scan.entries.sort_by(|a, b| {
            (&a.uuid, a.kind() != Kind::PowerLimit).cmp(&(&b.uuid, b.kind() != Kind::PowerLimit))
        });
        scan.corrupt.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(scan)
    }

    /// Atomically write `entry` (creating or replacing its file). Call under [`Journal::lock`].
    pub(crate) fn write(&self, entry: &Entry) -> io::Result<()> {
        let target = self.path_of(entry.kind(), &entry.uuid);
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("entry")
            .to_string();
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let body =
            serde_json::to_vec_pretty(&EntryFile::from_entry(entry)).map_err(io::Error::other)?;
        let written = (|| {
            let mut f = private_dir::create_private_file(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            fs::rename(&tmp, &target)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(with_path(e, &target));
        }
        sync_dir(&self.dir);
        Ok(())
    }

    /// Remove `uuid`'s entry of `kind`. Returns whether there was one. Call under the lock.
    pub(crate) fn remove(&self, kind: Kind, uuid: &str) -> io::Result<bool> {
        let path = self.path_of(kind, uuid);
        match fs::remove_file(&path) {
            Ok(()) => {
                sync_dir(&self.dir);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(with_path(e, &path)),
        }
    }

    /// Move an unreadable file aside (its name no longer ends in `.json`, so it is never read
    /// as an entry again, and stays for a person to look at). Call under the lock.
    pub(crate) fn move_aside(&self, corrupt: &mut CorruptEntry) -> io::Result<()> {
        let name = corrupt
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("entry")
            .to_string();
        let to = self.dir.join(format!("{name}.corrupt-{}", now_secs()));
        fs::rename(&corrupt.path, &to).map_err(|e| with_path(e, &corrupt.path))?;
        sync_dir(&self.dir);
        corrupt.moved_to = Some(to);
        Ok(())
    }
}

fn read_path(path: &Path, kind: Kind, uuid: &str) -> io::Result<Read> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if missing(&e) => return Ok(Read::Absent),
        Err(e) => return Err(with_path(e, path)),
    };
    let corrupt = |reason: String| {
        Read::Corrupt(CorruptEntry {
            path: path.to_path_buf(),
            kind,
            uuid_in_name: uuid.to_string(),
            reason,
            moved_to: None,
        })
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(corrupt("empty file".into()));
    }
    match serde_json::from_slice::<EntryFile>(&bytes) {
        Ok(file) => Ok(match file.into_entry(kind) {
            Ok(e) => Read::Entry(e),
            Err(reason) => corrupt(reason),
        }),
        Err(e) => Ok(corrupt(e.to_string())),
    }
}

/// Whether `e` says the file is not there: absent, or a path component is not a directory (a
/// journal directory that cannot exist holds nothing).
fn missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

/// An I/O error whose message names the file.
fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Make a rename or unlink durable. Best effort: some file systems refuse to open directories.
fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
