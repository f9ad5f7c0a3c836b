//! GPU settings that outlive the process (power limits, locked clocks): changing them through a
//! guard that always puts them back, and undoing what processes that are gone left behind.
//!
//! This is the one place that owns the restore protocol; the power-limit optimizer, Perseus'
//! frequency controller, `python -m zeus.device restore` and `zeus-monitor --restore` all go
//! through it.
//!
//! - [`SettingsGuard`] changes settings. Before its first change of a setting on a GPU it joins
//!   that GPU's journal entry ([`journal`]), which records the value to return to and every
//!   process holding the setting changed. When it is restored (explicitly, on drop, or through
//!   [`restore_all`] from an exit or signal hook) it leaves the entry, and the last live holder
//!   out puts the original back.
//! - SIGKILL, an OOM kill or a power cut end a process without any hook. Its entry stays, and
//!   [`restore_stale`] (run by the next guard user on the machine, or by hand) puts back every
//!   setting none of whose holders still runs. Holders are processes identified by pid, start
//!   time and boot ([`Owner`]), so a reused pid does not pass for the dead owner.
//!
//! Signal hooks: in a Python process they are Python signal handlers installed by
//! `zeus.device.settings` (a native handler would be replaced by the next `signal.signal` of
//! any library, and NVML may not be called from a signal handler); they call [`restore_all`].

mod guard;
pub mod journal;
pub mod owner;

use std::fmt;
use std::io;

pub use guard::{restore_all, Notice, Released, SettingsGuard};
pub use journal::{ClockLocks, CorruptEntry, Entry, Journal, Kind, Original, Read, Scan};
pub use owner::Owner;

use super::{GpuError, Gpus};

/// Errors of the settings guard and of restores: file system or device.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("journal: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Put `original` back on visible GPU `index`; returns what was applied. A power limit outside
/// the GPU's range (a driver that reported a bogus value when it was journaled, an entry from
/// another board) can never be set: the driver's default goes on instead, or the entry would
/// be retried forever and the GPU left as the last holder set it.
pub(crate) fn apply(gpus: &Gpus, index: usize, original: Original) -> Result<Original, GpuError> {
    match original {
        Original::PowerLimit(mw) => {
            let dev = gpus.device(index)?;
            let in_range = dev
                .power_management_limit_constraints()
                .map_or(true, |(lo, hi)| (lo..=hi).contains(&mw));
            let applied = if in_range {
                mw
            } else {
                dev.power_management_limit_default()?
            };
            gpus.set_power_management_limit(index, applied)?;
            Ok(Original::PowerLimit(applied))
        }
        Original::Unlock(locks) => {
            let dev = gpus.device(index)?;
            // Both resets are tried before reporting, so one failing kind does not keep the other
            // locked. A GPU that cannot lock a kind reports NotSupported on reset too: nothing
            // was locked, so that counts as done (entries name what zeus was about to lock,
            // written before it knew whether the GPU supports it).
            let unsupported_ok = |r: Result<(), GpuError>| match r {
                Err(GpuError::NotSupported(_)) => Ok(()),
                other => other,
            };
            let gpu = if locks.gpu {
                unsupported_ok(dev.reset_gpu_locked_clocks())
            } else {
                Ok(())
            };
            let memory = if locks.memory {
                unsupported_ok(dev.reset_memory_locked_clocks())
            } else {
                Ok(())
            };
            gpu.and(memory).map(|()| original)
        }
    }
}

/// The driver's default for a setting whose journaled original is unreadable.
fn driver_default(gpus: &Gpus, index: usize, kind: Kind) -> Result<Original, GpuError> {
    Ok(match kind {
        Kind::PowerLimit => {
            Original::PowerLimit(gpus.device(index)?.power_management_limit_default()?)
        }
        Kind::Clocks => Original::Unlock(ClockLocks::BOTH),
    })
}

/// A setting put back by [`restore_stale`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Visible GPU index.
    pub index: usize,
    pub uuid: String,
    /// What was applied.
    pub applied: Original,
    /// False when the driver's default was applied: the journal entry was unreadable, or its
    /// original is outside the GPU's range (`journaled` then says what it was).
    pub original_known: bool,
    /// The journaled original, where the driver's default was applied instead.
    pub journaled: Option<Original>,
    /// The processes that held the setting (empty when the entry was unreadable).
    pub holders: Vec<Owner>,
    /// The unreadable entry, moved aside, when `original_known` is false.
    pub corrupt: Option<CorruptEntry>,
}

impl fmt::Display for Restored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GPU {} ({}): ", self.index, self.uuid)?;
        match self.applied {
            Original::PowerLimit(mw) if self.original_known => {
                write!(f, "restored power limit {mw} mW")?
            }
            Original::PowerLimit(mw) => write!(f, "set the default power limit {mw} mW")?,
            Original::Unlock(l) => write!(f, "unlocked {} clocks", l.describe())?,
        }
        if let Some(Original::PowerLimit(mw)) = self.journaled {
            write!(f, " (the journaled {mw} mW is outside the GPU's range)")?;
        }
        match (&self.corrupt, self.holders.as_slice()) {
            (Some(c), _) => write!(f, " (the original is unknown: {c})"),
            (None, []) => Ok(()),
            (None, holders) => {
                let s = if holders.len() == 1 { "" } else { "es" };
                write!(f, " (journaled by process{s} {})", owner::pid_list(holders))
            }
        }
    }
}

/// A setting [`restore_stale`] could not put back; its entry stays journaled.
#[derive(Debug)]
pub struct RestoreFailure {
    /// Visible GPU index.
    pub index: usize,
    /// The GPU's UUID, unless reading it was what failed.
    pub uuid: Option<String>,
    /// The kind of setting, unless the failure came before any entry was read.
    pub kind: Option<Kind>,
    pub error: SettingsError,
}

impl fmt::Display for RestoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GPU {}", self.index)?;
        if let Some(u) = &self.uuid {
            write!(f, " ({u})")?;
        }
        let what = self.kind.map(Kind::describe).unwrap_or("settings");
        write!(f, ": cannot restore {what}: {}", self.error)
    }
}

/// The outcome of [`restore_stale`]: every GPU and kind is tried, whatever fails.
#[derive(Debug, Default)]
pub struct RestoreReport {
    pub restored: Vec<Restored>,
    pub failed: Vec<RestoreFailure>,
}

/// Undo every journaled change on the visible GPUs that no live process holds (with
/// `include_live`, every journaled change), then clear those entries: power limits go back to
/// their original, locked clocks are reset. An unreadable entry is moved aside and its GPU
/// set to the driver's default.
///
/// Every kind on every GPU is tried; failures are collected and their entries stay for the
/// next try. A journal directory that does not exist holds nothing and is not created.
pub fn restore_stale(journal: &Journal, gpus: &Gpus, include_live: bool) -> RestoreReport {
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
        for kind in Kind::ALL {
            match restore_one(journal, gpus, index, &uuid, kind, include_live) {
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
    journal: &Journal,
    gpus: &Gpus,
    index: usize,
    uuid: &str,
    kind: Kind,
    include_live: bool,
) -> Result<Option<Restored>, SettingsError> {
    // Look before locking: most GPUs have nothing journaled, and an absent (or uncreatable)
    // directory must not be created just to find that out.
    if matches!(journal.read(kind, uuid)?, Read::Absent) {
        return Ok(None);
    }
    let _lock = journal.lock()?;
    match journal.read(kind, uuid)? {
        Read::Absent => Ok(None),
        Read::Corrupt(mut corrupt) => {
            let default = driver_default(gpus, index, kind)?;
            let applied = apply(gpus, index, default)?;
            journal.move_aside(&mut corrupt)?;
            Ok(Some(Restored {
                index,
                uuid: uuid.to_string(),
                applied,
                original_known: false,
                journaled: None,
                holders: Vec::new(),
                corrupt: Some(corrupt),
            }))
        }
        Read::Entry(entry) => {
            if !include_live && !entry.live_holders().is_empty() {
                return Ok(None);
            }
            let applied = apply(gpus, index, entry.original)?;
            journal.remove(kind, uuid)?;
            let known = applied == entry.original;
            Ok(Some(Restored {
                index,
                uuid: uuid.to_string(),
                applied,
                original_known: known,
                journaled: (!known).then_some(entry.original),
                holders: entry.holders,
                corrupt: None,
            }))
        }
    }
}

#[cfg(test)]
mod tests;
