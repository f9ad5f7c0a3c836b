//! [`SettingsGuard`]: the one way zeus changes a GPU setting that outlives the process.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::journal::{now_secs, ClockLocks, CorruptEntry, Entry, Journal, Kind, Original, Read};
use super::owner::{pid_list, Owner};
use super::{apply, SettingsError};
use crate::device::Gpus;

/// Something a guard's caller should tell the user; nothing failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The journal cannot be written: the change is undone on exit and catchable signals, but
    /// not after SIGKILL.
    NotJournaled {
        index: usize,
        kind: Kind,
        dir: PathBuf,
        error: String,
    },
    /// Other running processes hold this setting changed too; the last one out restores it.
    SharedWith {
        index: usize,
        kind: Kind,
        holders: Vec<Owner>,
    },
    /// An unreadable journal entry was moved aside; what this guard now journals as the
    /// original is the setting found on the GPU.
    MovedAside { index: usize, corrupt: CorruptEntry },
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::NotJournaled {
                index,
                kind,
                dir,
                error,
            } => write!(
                f,
                "cannot journal GPU {index}'s original {} in {} ({error}): it is restored at \
                 exit and on SIGINT/SIGTERM, but not if this process is killed with SIGKILL",
                kind.describe(),
                dir.display()
            ),
            Notice::SharedWith {
                index,
                kind,
                holders,
            } => {
                write!(
                    f,
                    "running process(es) {} also change GPU {index}'s {}; the original is kept \
                     in the journal and put back when the last of them ends",
                    pid_list(holders),
                    kind.describe()
                )
            }
            Notice::MovedAside { index, corrupt } => {
                write!(f, "GPU {index}: {corrupt}")
            }
        }
    }
}

/// What releasing one held setting did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// The original was put back.
    Restored { index: usize, original: Original },
    /// Other live processes still hold the setting; it stays as they set it.
    LeftTo {
        index: usize,
        kind: Kind,
        holders: Vec<Owner>,
    },
}

/// One line for people, e.g. `GPU 0: restored power limit 300000 mW`.
impl fmt::Display for Released {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Released::Restored {
                index,
                original: Original::PowerLimit(mw),
            } => write!(f, "GPU {index}: restored power limit {mw} mW"),
            Released::Restored {
                index,
                original: Original::Unlock(l),
            } => write!(f, "GPU {index}: unlocked {} clocks", l.describe()),
            Released::LeftTo {
                index,
                kind,
                holders,
            } => {
                write!(
                    f,
                    "GPU {index}: {} left as running process(es) {} set it",
                    kind.describe(),
                    pid_list(holders)
                )
            }
        }
    }
}

#[derive(Debug)]
struct Held {
    index: usize,
    uuid: String,
    original: Original,
    journaled: bool,
}

struct GuardInner {
    gpus: Gpus,
    journal: Journal,
    owner: Owner,
    /// The process that created the guard: a forked child inherits the object but not the
    /// settings, and must not restore them when it exits.
    process: u32,
    held: Mutex<Vec<Held>>,
}

/// Changes GPU settings and guarantees the originals come back.
///
/// Cheap to clone (clones share state). The settings are restored by [`SettingsGuard::restore`],
/// when the last clone is dropped, and by [`restore_all`].
#[derive(Clone)]
pub struct SettingsGuard {
    inner: Arc<GuardInner>,
}

fn live_guards() -> MutexGuard<'static, Vec<Weak<GuardInner>>> {
    static LIVE: Mutex<Vec<Weak<GuardInner>>> = Mutex::new(Vec::new());
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Restore every guard of this process that holds something. For exit and signal hooks:
/// returns the errors (every guard and setting is tried).
pub fn restore_all() -> Vec<SettingsError> {
    let guards: Vec<Arc<GuardInner>> = live_guards().iter().filter_map(Weak::upgrade).collect();
    let mut errors = Vec::new();
    // Newest first, like a stack of changes being unwound.
    for g in guards.iter().rev() {
        if let Err(e) = g.restore() {
            errors.push(e);
        }
    }
    errors
}

impl SettingsGuard {
    /// A guard acting for this process.
    pub fn new(gpus: Gpus, journal: Journal) -> SettingsGuard {
        SettingsGuard::on_behalf_of(gpus, journal, Owner::current())
    }

    /// A guard whose changes are held by `owner` (a daemon acting for a client process): the
    /// journal counts them as `owner`'s, so they are restored once `owner` is gone.
    pub fn on_behalf_of(gpus: Gpus, journal: Journal, owner: Owner) -> SettingsGuard {
        let inner = Arc::new(GuardInner {
            gpus,
            journal,
            owner,
            process: std::process::id(),
            held: Mutex::new(Vec::new()),
        });
        let mut live = live_guards();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&inner));
        SettingsGuard { inner }
    }

    pub fn owner(&self) -> &Owner {
        &self.inner.owner
    }

    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// Whether some setting is changed and not yet restored.
    pub fn is_active(&self) -> bool {
        !self.inner.lock_held().is_empty()
    }

    /// The original power limit of GPU `index` if this guard changed it, mW.
    pub fn original_power_limit(&self, index: usize) -> Option<u32> {
        self.inner
            .lock_held()
            .iter()
            .find_map(|h| match h.original {
                Original::PowerLimit(mw) if h.index == index => Some(mw),
                _ => None,
            })
    }

    /// Set GPU `index`'s power limit, journaling the original first.
    pub fn set_power_limit(
        &self,
        index: usize,
        milliwatts: u32,
    ) -> Result<Vec<Notice>, SettingsError> {
        let inner = &self.inner;
        let mut held = inner.lock_held();
        let mut notices = Vec::new();
        if !held
            .iter()
            .any(|h| h.index == index && h.original.kind() == Kind::PowerLimit)
        {
            let read = || -> Result<Original, SettingsError> {
                Ok(Original::PowerLimit(
                    inner.gpus.device(index)?.power_management_limit()?,
                ))
            };
            held.push(inner.hold(index, Kind::PowerLimit, &read, &mut notices)?);
        }
        inner.gpus.set_power_management_limit(index, milliwatts)?;
        Ok(notices)
    }

    /// Lock GPU `index`'s graphics clocks to `[min_mhz, max_mhz]`, journaling first.
    pub fn lock_gpu_clocks(
        &self,
        index: usize,
        min_mhz: u32,
        max_mhz: u32,
    ) -> Result<Vec<Notice>, SettingsError> {
        let notices = self.hold_clocks(index, ClockLocks::GPU)?;
        self.inner
            .gpus
            .set_gpu_locked_clocks(index, min_mhz, max_mhz)?;
        Ok(notices)
    }

    /// Lock GPU `index`'s memory clocks to `[min_mhz, max_mhz]`, journaling first.
    pub fn lock_memory_clocks(
        &self,
        index: usize,
        min_mhz: u32,
        max_mhz: u32,
    ) -> Result<Vec<Notice>, SettingsError> {
        let notices = self.hold_clocks(index, ClockLocks::MEMORY)?;
        self.inner
            .gpus
            .set_memory_locked_clocks(index, min_mhz, max_mhz)?;
        Ok(notices)
    }

    fn hold_clocks(&self, index: usize, locks: ClockLocks) -> Result<Vec<Notice>, SettingsError> {
        let inner = &self.inner;
        let mut held = inner.lock_held();
        let mut notices = Vec::new();
        let pos = held
            .iter()
            .position(|h| h.index == index && h.original.kind() == Kind::Clocks);
        let covered = match pos {
            Some(p) => matches!(held[p].original, Original::Unlock(l) if l.union(locks) == l),
            None => false,
        };
        if !covered {
            let wider = match pos {
                Some(p) => match held[p].original {
                    Original::Unlock(l) => l.union(locks),
                    Original::PowerLimit(_) => locks,
                },
                None => locks,
            };
            let h = inner.hold(
                index,
                Kind::Clocks,
                &|| Ok(Original::Unlock(wider)),
                &mut notices,
            )?;
            match pos {
                Some(p) => held[p] = h,
                None => held.push(h),
            }
        }
        Ok(notices)
    }

    /// Release everything this guard holds: each setting goes back to its original unless
    /// another live process still holds it. Every setting is tried; the first error is
    /// returned (its journal entry stays for a later restore). Idempotent.
    pub fn restore(&self) -> Result<Vec<Released>, SettingsError> {
        self.inner.restore()
    }

    /// Take over a setting the journal already lists this guard's owner as holding (a daemon
    /// restarted while its client lived on): from then on it is released and restored as if
    /// this guard had made the change. False when no readable entry names the owner.
    pub fn adopt(&self, index: usize, kind: Kind) -> Result<bool, SettingsError> {
        let inner = &self.inner;
        let uuid = inner.gpus.device(index)?.uuid()?;
        let original = {
            let _lock = inner.journal.lock()?;
            match inner.journal.read(kind, &uuid)? {
                Read::Entry(e) if e.holders.iter().any(|h| h.same_process(&inner.owner)) => {
                    e.original
                }
                _ => return Ok(false),
            }
        };
        let mut held = inner.lock_held();
        held.retain(|h| !(h.index == index && h.original.kind() == kind));
        held.push(Held {
            index,
            uuid,
            original,
            journaled: true,
        });
        Ok(true)
    }

    /// Release one held setting (GPU `index`, `kind`) and keep the others: it goes back to
    /// its original unless another live process still holds it. `None` when this guard does
    /// not hold it. On error the hold is dropped all the same; its journal entry stays for a
    /// later restore, as with [`SettingsGuard::restore`].
    pub fn release(&self, index: usize, kind: Kind) -> Result<Option<Released>, SettingsError> {
        if std::process::id() != self.inner.process {
            return Ok(None);
        }
        let h = {
            let mut held = self.inner.lock_held();
            match held
                .iter()
                .position(|h| h.index == index && h.original.kind() == kind)
            {
                Some(p) => held.remove(p),
                None => return Ok(None),
            }
        };
        self.inner.release(&h).map(Some)
    }
}

impl GuardInner {
    fn lock_held(&self) -> MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Join the journal entry of GPU `index`'s setting; `found` is the GPU's state now (for
    /// clocks: the kinds about to be locked). Returns what to restore to: the journal's
    /// original when an entry exists (the GPU may still carry a dead process's setting).
    fn hold(
        &self,
        index: usize,
        kind: Kind,
        read_current: &dyn Fn() -> Result<Original, SettingsError>,
        notices: &mut Vec<Notice>,
    ) -> Result<Held, SettingsError> {
        let uuid = self.gpus.device(index)?.uuid()?;
        let not_journaled = |e: std::io::Error| Notice::NotJournaled {
            index,
            kind,
            dir: self.journal.dir().to_path_buf(),
            error: e.to_string(),
        };
        // The current setting is read under the journal's lock: read before it, it may be
        // another process's change that that process is about to restore (and whose entry it
        // is about to remove), and would be journaled as the original.
        let lock = self.journal.lock();
        let found = read_current()?;
        let journaled = (|| -> std::io::Result<Original> {
            let _lock = lock?;
            let existing = match self.journal.read(kind, &uuid)? {
                Read::Absent => None,
                Read::Entry(e) => Some(e),
                Read::Corrupt(mut corrupt) => {
                    self.journal.move_aside(&mut corrupt)?;
                    notices.push(Notice::MovedAside { index, corrupt });
                    None
                }
            };
            let entry = match existing {
                None => Entry {
                    uuid: uuid.clone(),
                    original: found,
                    holders: vec![self.owner.clone()],
                    created: now_secs(),
                },
                Some(e) => {
                    let others: Vec<Owner> = e
                        .live_holders()
                        .into_iter()
                        .filter(|h| !h.same_process(&self.owner))
                        .collect();
                    if !others.is_empty() {
                        notices.push(Notice::SharedWith {
                            index,
                            kind,
                            holders: others.clone(),
                        });
                    }
                    let original = match (e.original, found) {
                        (Original::Unlock(a), Original::Unlock(b)) => Original::Unlock(a.union(b)),
                        (kept, _) => kept,
                    };
                    let mut holders = others;
                    holders.push(self.owner.clone());
                    Entry {
                        original,
                        holders,
                        ..e
                    }
                }
            };
            self.journal.write(&entry)?;
            Ok(entry.original)
        })();
        Ok(match journaled {
            Ok(original) => Held {
                index,
                uuid,
                original,
                journaled: true,
            },
            Err(e) => {
                notices.push(not_journaled(e));
                Held {
                    index,
                    uuid,
                    original: found,
                    journaled: false,
                }
            }
        })
    }

    fn restore(&self) -> Result<Vec<Released>, SettingsError> {
        if std::process::id() != self.process {
            return Ok(Vec::new());
        }
        let held = std::mem::take(&mut *self.lock_held());
        let mut done = Vec::new();
        let mut first_error = None;
        for h in held {
            match self.release(&h) {
                Ok(r) => done.push(r),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    /// Whether another guard of this process, for the same owner, holds `h`'s setting: the
    /// journal counts holders by process, so within one process the guards count each other.
    fn held_elsewhere_in_process(&self, h: &Held) -> bool {
        // Upgrade under the registry lock, look (and drop the upgrades) outside it: dropping a
        // last reference restores, which takes the registry lock again.
        let others: Vec<Arc<GuardInner>> = live_guards().iter().filter_map(Weak::upgrade).collect();
        others.iter().any(|g| {
            !std::ptr::eq(Arc::as_ptr(g), self)
                && g.owner.same_process(&self.owner)
                && g.journal.dir() == self.journal.dir()
                && g.lock_held()
                    .iter()
                    .any(|o| o.uuid == h.uuid && o.original.kind() == h.original.kind())
        })
    }

    fn release(&self, h: &Held) -> Result<Released, SettingsError> {
        let restored = |original| Released::Restored {
            index: h.index,
            original,
        };
        if self.held_elsewhere_in_process(h) {
            return Ok(Released::LeftTo {
                index: h.index,
                kind: h.original.kind(),
                holders: vec![self.owner.clone()],
            });
        }
        if !h.journaled {
            return Ok(restored(apply(&self.gpus, h.index, h.original)?));
        }
        let kind = h.original.kind();
        let _lock = self.journal.lock()?;
        let entry = match self.journal.read(kind, &h.uuid)? {
            Read::Entry(e) => e,
            // Cleared by someone else (`restore --all`) or destroyed: what this guard knows is
            // the original.
            Read::Absent => {
                return Ok(restored(apply(&self.gpus, h.index, h.original)?));
            }
            Read::Corrupt(mut corrupt) => {
                self.journal.move_aside(&mut corrupt)?;
                return Ok(restored(apply(&self.gpus, h.index, h.original)?));
            }
        };
        let others: Vec<Owner> = entry
            .live_holders()
            .into_iter()
            .filter(|o| !o.same_process(&self.owner))
            .collect();
        if !others.is_empty() {
            self.journal.write(&Entry {
                holders: others.clone(),
                ..entry
            })?;
            return Ok(Released::LeftTo {
                index: h.index,
                kind,
                holders: others,
            });
        }
        let applied = match apply(&self.gpus, h.index, entry.original) {
            Ok(applied) => applied,
            Err(e) => {
                // No live holder is left, so the entry now reads as stale: the next restore
                // retries.
                self.journal.write(&Entry {
                    holders: Vec::new(),
                    ..entry
                })?;
                return Err(e.into());
            }
        };
        self.journal.remove(kind, &h.uuid)?;
        Ok(restored(applied))
    }
}

impl Drop for GuardInner {
    fn drop(&mut self) {
        let _ = self.restore();
    }
}
