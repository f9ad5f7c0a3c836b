//! Who holds which GPU setting: every power limit and clock lock is held on behalf of the
//! client that asked, and given back when that client goes away.
//!
//! - A Unix-socket client is a process ([`Owner`]: pid from `SO_PEERCRED`, start time, boot).
//!   Its writes go through a [`SettingsGuard`] acting on its behalf, so the journal lists the
//!   client itself as the holder. The watcher ([`Clients::reap`]) notices a client that has
//!   exited, woken by the client's pidfd ([`crate::exits`]) or at the latest after a
//!   [`WATCH_PERIOD`] (a reused pid has another start time and does not count; an exited
//!   process its parent has not waited for counts as gone), and releases its holds: the
//!   original comes back unless another live holder remains.
//! - A client without a pid (TCP) holds through a lease keyed by [`lease_key`]: the journal
//!   lists the daemon as holder, and the lease's lapse counts as the client's exit. Any request
//!   of the client renews it, and so does `POST /client/renew_lease`. A client may also keep
//!   a `GET /client/hold` connection open: when the last one closes (a SIGKILLed client's
//!   kernel closes it) the lease ends [`HOLD_GRACE`] later unless the client renews or
//!   reconnects, so a killed TCP job gets its original back in about a second, not at the end
//!   of its lease. An open connection does not renew: a client cut off without a close (a
//!   network gone) still lapses with its lease.
//! - A write to a setting (GPU + kind) that another live client holds at a different value is
//!   refused with 409 naming the holders; an equal value joins them. A reset releases only the
//!   caller's hold.
//! - At start, journal entries that name a live client are adopted: the client is watched and
//!   its settings restored when it exits, as if this daemon had made them.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{json, Value};
use zeus_core::device::settings::{Journal, Kind, Owner, Released, SettingsError, SettingsGuard};
use zeus_core::device::{GpuError, Gpus};

use crate::api::{gpu_status, Write};
use crate::exits::{Bell, Woken};
use crate::peer::{Caller, Peer};

/// How often the watcher looks for clients that are gone.
pub const WATCH_PERIOD: Duration = Duration::from_millis(200);

/// How long a lease outlives its client's last `/client/hold` connection: time to reconnect
/// after a dropped connection (the client retries at once), short next to a lease.
pub const HOLD_GRACE: Duration = Duration::from_millis(1000);

/// A client of the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClientKey {
    /// A Unix-socket client process.
    Process(Owner),
    /// A client without a pid, held by lease (see [`lease_key`]).
    Lease(String),
}

/// What a conflict answer tells about a holder.
#[derive(Clone, Debug, Default)]
pub struct Who {
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub subject: Option<String>,
    pub lease: Option<String>,
}

impl Who {
    fn to_json(&self) -> Value {
        json!({"pid": self.pid, "uid": self.uid, "subject": self.subject, "client": self.lease})
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = self.pid {
            parts.push(format!("pid {p}"));
        }
        if let Some(u) = self.uid {
            parts.push(format!("uid {u}"));
        }
        if let Some(s) = &self.subject {
            parts.push(format!("subject {s:?}"));
        }
        if self.pid.is_none() {
            if let Some(l) = &self.lease {
                parts.push(format!("client {l:?}"));
            }
        }
        if parts.is_empty() {
            "an unknown client".into()
        } else {
            parts.join(", ")
        }
    }
}

/// The value a client set; compared to tell a conflict from a join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    Power(u32),
    /// Locked ranges, MHz; `None`: the client did not lock that kind.
    Clocks {
        gpu: Option<(u32, u32)>,
        mem: Option<(u32, u32)>,
    },
    /// Adopted from the journal: the value is not known, so it differs from every other.
    Unknown,
}

impl Held {
    fn describe(self) -> String {
        let range = |r: Option<(u32, u32)>| match r {
            Some((lo, hi)) => format!("{lo}-{hi} MHz"),
            None => "unlocked".into(),
        };
        match self {
            Held::Power(mw) => format!("{mw} mW"),
            Held::Clocks { gpu, mem } => format!("gpu {}, memory {}", range(gpu), range(mem)),
            Held::Unknown => "a value set before the daemon restarted".into(),
        }
    }
}

/// Which clock kinds a lock or reset touches.
#[derive(Clone, Copy)]
struct Parts {
    gpu: bool,
    mem: bool,
}

struct Client {
    who: Who,
    guard: SettingsGuard,
    holds: HashMap<(usize, Kind), Held>,
    /// Lease clients only: when the lease lapses.
    expires: Option<Instant>,
    /// Lease clients only: open `/client/hold` connections.
    connections: usize,
    /// Lease clients only: the last hold connection closed (the log says so at the lapse).
    disconnected: bool,
    /// Process clients: a pidfd that wakes the watcher when the process exits.
    exit: Option<Arc<OwnedFd>>,
}

impl Client {
    fn alive(&self, key: &ClientKey, now: Instant) -> bool {
        match key {
            ClientKey::Process(o) => o.is_alive(),
            ClientKey::Lease(_) => self.expires.is_some_and(|e| e > now),
        }
    }
}

/// The client of one request.
pub struct Requester {
    pub key: ClientKey,
    pub who: Who,
}

/// A write refused or failed on one GPU.
pub enum WriteError {
    /// Status, message and the Python exception class it raises in process (the client
    /// raises the same one).
    Device(StatusCode, String, &'static str),
    /// 409: message and the holders, for the answer body.
    Conflict(String, Value),
}

impl From<SettingsError> for WriteError {
    fn from(e: SettingsError) -> WriteError {
        let (status, class) = match &e {
            SettingsError::Gpu(g) => (gpu_status(g), g.class_name()),
            SettingsError::Io(_) => (StatusCode::INTERNAL_SERVER_ERROR, "ZeusdError"),
        };
        WriteError::Device(status, e.to_string(), class)
    }
}

impl From<GpuError> for WriteError {
    fn from(e: GpuError) -> WriteError {
        WriteError::Device(gpu_status(&e), e.to_string(), e.class_name())
    }
}

/// The lease of a client without a pid: its token subject and `X-Zeusd-Client` header when
/// given, else its IP address (TCP) or uid (a Unix peer whose pid is unknown).
pub fn lease_key(peer: &Peer, subject: Option<&str>, client: Option<&str>) -> String {
    let mut parts = Vec::new();
    if let Some(s) = subject {
        parts.push(format!("subject={s}"));
    }
    if let Some(c) = client {
        parts.push(format!("client={c}"));
    }
    if parts.is_empty() {
        parts.push(match peer {
            Peer::Tcp(a) => format!("address={}", a.ip()),
            Peer::Unix { uid, .. } => format!("uid={uid}"),
            Peer::Unknown => "unknown".into(),
        });
    }
    parts.join(" ")
}

/// Every client holding settings, and the watcher's work.
pub struct Clients {
    gpus: Gpus,
    journal: Journal,
    lease: Duration,
    state: Mutex<HashMap<ClientKey, Client>>,
    /// Rung when a process client is added, so the watcher waits on its pidfd too.
    bell: Bell,
}

impl Clients {
    pub fn new(gpus: Gpus, journal: Journal, lease: Duration) -> Clients {
        Clients {
            gpus,
            journal,
            lease,
            state: Mutex::new(HashMap::new()),
            bell: Bell::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ClientKey, Client>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The client behind a request: its process when the pid is known and still runs, else
    /// its lease.
    pub fn identify(&self, caller: &Caller) -> Requester {
        let uid = match caller.peer {
            Peer::Unix { uid, .. } => Some(uid),
            _ => None,
        };
        let mut who = Who {
            pid: None,
            uid,
            subject: caller.subject.clone(),
            lease: None,
        };
        if let Some(owner) = caller.peer.pid().and_then(Owner::of_pid) {
            who.pid = Some(owner.pid);
            return Requester {
                key: ClientKey::Process(owner),
                who,
            };
        }
        let key = lease_key(
            &caller.peer,
            caller.subject.as_deref(),
            caller.client.as_deref(),
        );
        who.lease = Some(key.clone());
        Requester {
            key: ClientKey::Lease(key),
            who,
        }
    }

    /// Renew the lease `key` if it has a client; its new expiry.
    ///
    /// Called from the auth gate on the async workers: it never waits for the state (a write
    /// in progress holds it across driver calls and the journal's lock). When busy, this
    /// renewal is skipped; the client's next request, or its renewal thread, renews.
    pub fn renew(&self, key: &str) -> Option<Instant> {
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let c = st.get_mut(&ClientKey::Lease(key.to_string()))?;
        let e = Instant::now() + self.lease;
        c.expires = Some(e);
        c.disconnected = false;
        Some(e)
    }

    /// A `/client/hold` connection of lease client `r` opened (which renews its lease). How
    /// many settings the client holds.
    pub fn hold_opened(&self, r: &Requester) -> usize {
        let mut st = self.lock();
        let c = self.client(&mut st, r);
        c.connections += 1;
        c.disconnected = false;
        c.expires = Some(Instant::now() + self.lease);
        c.holds.len()
    }

    /// A `/client/hold` connection of lease `key` closed: after the last one the lease ends
    /// [`HOLD_GRACE`] from now (sooner if it was ending anyway), unless the client comes back.
    pub fn hold_closed(&self, key: &str) {
        let mut st = self.lock();
        let Some(c) = st.get_mut(&ClientKey::Lease(key.to_string())) else {
            return;
        };
        c.connections = c.connections.saturating_sub(1);
        if c.connections == 0 {
            let end = Instant::now() + HOLD_GRACE;
            c.expires = Some(c.expires.map_or(end, |e| e.min(end)));
            c.disconnected = true;
        }
    }

    /// How many settings lease `key` holds, if the state is free this instant (a hold
    /// connection's heartbeat never waits on a write in progress).
    pub fn holds_now(&self, key: &str) -> Option<usize> {
        let st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(
            st.get(&ClientKey::Lease(key.to_string()))
                .map_or(0, |c| c.holds.len()),
        )
    }

    /// Renew (or open) `r`'s lease; its expiry and how many settings it holds.
    pub fn open_lease(&self, r: &Requester) -> (Instant, usize) {
        let mut st = self.lock();
        let c = self.client(&mut st, r);
        let e = Instant::now() + self.lease;
        c.expires = Some(e);
        c.disconnected = false;
        (e, c.holds.len())
    }

    fn client<'a>(&self, st: &'a mut HashMap<ClientKey, Client>, r: &Requester) -> &'a mut Client {
        let lease = self.lease;
        let bell = &self.bell;
        st.entry(r.key.clone()).or_insert_with(|| {
            let owner = match &r.key {
                ClientKey::Process(o) => o.clone(),
                // The daemon holds a lease client's settings; the lease stands for the client.
                ClientKey::Lease(_) => Owner::current(),
            };
            Client {
                who: r.who.clone(),
                guard: SettingsGuard::on_behalf_of(self.gpus.clone(), self.journal.clone(), owner),
                holds: HashMap::new(),
                expires: match r.key {
                    ClientKey::Lease(_) => Some(Instant::now() + lease),
                    ClientKey::Process(_) => None,
                },
                connections: 0,
                disconnected: false,
                exit: match &r.key {
                    ClientKey::Process(o) => {
                        let fd = crate::exits::pidfd(o);
                        bell.ring();
                        fd
                    }
                    ClientKey::Lease(_) => None,
                },
            }
        })
    }

    /// Apply a power-limit or clock write for `r` on GPU `index`, refusing it if another live
    /// client holds the setting at a different value. Persistence mode is not for this.
    pub fn write(&self, r: &Requester, index: usize, w: Write) -> Result<(), WriteError> {
        let mut st = self.lock();
        let now = Instant::now();
        if let Write::Release(kind) = w {
            let Some(c) = st.get_mut(&r.key) else {
                return Ok(());
            };
            if c.holds.remove(&(index, kind)).is_some() {
                c.guard.release(index, kind)?;
            }
            return Ok(());
        }
        let kind = match w {
            Write::PowerLimit(_) => Kind::PowerLimit,
            _ => Kind::Clocks,
        };
        let others: Vec<(Who, Held)> = st
            .iter()
            .filter(|(k, c)| **k != r.key && c.alive(k, now))
            .filter_map(|(_, c)| c.holds.get(&(index, kind)).map(|h| (c.who.clone(), *h)))
            .collect();
        if let ClientKey::Lease(_) = r.key {
            if let Some(c) = st.get_mut(&r.key) {
                c.expires = Some(now + self.lease);
                c.disconnected = false;
            }
        }
        let clash = |parts: Parts, want: Held, o: &Held| match (want, *o) {
            (_, Held::Unknown) => true,
            (Held::Power(a), Held::Power(b)) => a != b,
            (Held::Clocks { gpu, mem }, Held::Clocks { gpu: og, mem: om }) => {
                (parts.gpu && og.is_some() && og != gpu) || (parts.mem && om.is_some() && om != mem)
            }
            _ => true,
        };
        let (parts, want) = match w {
            Write::PowerLimit(mw) => (
                Parts {
                    gpu: false,
                    mem: false,
                },
                Held::Power(mw),
            ),
            Write::LockGpu(lo, hi) => (
                Parts {
                    gpu: true,
                    mem: false,
                },
                Held::Clocks {
                    gpu: Some((lo, hi)),
                    mem: None,
                },
            ),
            Write::LockMem(lo, hi) => (
                Parts {
                    gpu: false,
                    mem: true,
                },
                Held::Clocks {
                    gpu: None,
                    mem: Some((lo, hi)),
                },
            ),
            Write::ResetGpu => (
                Parts {
                    gpu: true,
                    mem: false,
                },
                Held::Clocks {
                    gpu: None,
                    mem: None,
                },
            ),
            Write::ResetMem => (
                Parts {
                    gpu: false,
                    mem: true,
                },
                Held::Clocks {
                    gpu: None,
                    mem: None,
                },
            ),
            Write::ResetBoth => (
                Parts {
                    gpu: true,
                    mem: true,
                },
                Held::Clocks {
                    gpu: None,
                    mem: None,
                },
            ),
            Write::Persistence(_) | Write::Release(_) => unreachable!("handled above"),
        };
        let is_reset = matches!(w, Write::ResetGpu | Write::ResetMem | Write::ResetBoth);
        let mine = st
            .get(&r.key)
            .and_then(|c| c.holds.get(&(index, kind)).copied());
        // Joining another user's hold (writing the value it holds) would let any local user
        // freeze a job's schedule: the job could no longer change its own setting. Only the
        // same user, or root, may share a hold.
        let foreign = |who: &Who| matches!((r.who.uid, who.uid), (Some(mine), Some(theirs)) if mine != 0 && mine != theirs);
        let blocking: Vec<&(Who, Held)> = others
            .iter()
            .filter(|(who, h)| {
                if is_reset {
                    // Resetting a kind another client locked would undo its setting; when the
                    // caller holds the setting too, the reset only releases its own claim.
                    mine.is_none()
                        && match h {
                            Held::Clocks { gpu, mem } => {
                                (parts.gpu && gpu.is_some()) || (parts.mem && mem.is_some())
                            }
                            _ => true,
                        }
                } else {
                    clash(parts, want, h) || foreign(who)
                }
            })
            .collect();
        if !blocking.is_empty() {
            let holders: Vec<String> = blocking
                .iter()
                .map(|(who, h)| format!("{} (at {})", who.describe(), h.describe()))
                .collect();
            let what = if is_reset { "reset" } else { "change" };
            let msg = format!(
                "GPU {index}'s {} is held by another running client: {}; it cannot {what} it \
                 until they release it or exit",
                kind.describe(),
                holders.join("; ")
            );
            let detail = json!({
                "gpu": index,
                "setting": kind.name(),
                "holders": blocking
                    .iter()
                    .map(|(who, h)| {
                        let mut v = who.to_json();
                        v["value"] = Value::String(h.describe());
                        v
                    })
                    .collect::<Vec<_>>(),
            });
            return Err(WriteError::Conflict(msg, detail));
        }
        if is_reset {
            return self.reset(&mut st, r, index, parts, &others);
        }
        let c = self.client(&mut st, r);
        match w {
            Write::PowerLimit(mw) => {
                c.guard.set_power_limit(index, mw)?;
            }
            Write::LockGpu(lo, hi) => {
                c.guard.lock_gpu_clocks(index, lo, hi)?;
            }
            Write::LockMem(lo, hi) => {
                c.guard.lock_memory_clocks(index, lo, hi)?;
            }
            _ => unreachable!(),
        }
        let merged = match (c.holds.get(&(index, kind)), want) {
            (Some(Held::Clocks { gpu, mem }), Held::Clocks { gpu: g, mem: m }) => Held::Clocks {
                gpu: g.or(*gpu),
                mem: m.or(*mem),
            },
            _ => want,
        };
        c.holds.insert((index, kind), merged);
        Ok(())
    }

    /// A clock reset: drop the caller's claim on the reset kinds, release its hold when it
    /// claims nothing more, and reset on the device the kinds no one holds any longer.
    fn reset(
        &self,
        st: &mut HashMap<ClientKey, Client>,
        r: &Requester,
        index: usize,
        parts: Parts,
        others: &[(Who, Held)],
    ) -> Result<(), WriteError> {
        if let Some(c) = st.get_mut(&r.key) {
            if let Some(Held::Clocks { gpu, mem }) = c.holds.get(&(index, Kind::Clocks)).copied() {
                let left = Held::Clocks {
                    gpu: gpu.filter(|_| !parts.gpu),
                    mem: mem.filter(|_| !parts.mem),
                };
                if left
                    == (Held::Clocks {
                        gpu: None,
                        mem: None,
                    })
                {
                    c.holds.remove(&(index, Kind::Clocks));
                    c.guard.release(index, Kind::Clocks)?;
                } else {
                    c.holds.insert((index, Kind::Clocks), left);
                }
            }
        }
        let held_by_others = |gpu_part: bool| {
            others.iter().any(|(_, h)| match h {
                Held::Clocks { gpu, mem } => {
                    if gpu_part {
                        gpu.is_some()
                    } else {
                        mem.is_some()
                    }
                }
                _ => true,
            })
        };
        let dev = self.gpus.device(index)?;
        // With both kinds, a kind the GPU cannot lock (memory before Ampere) has nothing to
        // reset; a single-kind reset reports it.
        let both = parts.gpu && parts.mem;
        let tolerate = |res: Result<(), GpuError>| match res {
            Err(GpuError::NotSupported(_)) if both => Ok(()),
            other => other,
        };
        let g = if parts.gpu && !held_by_others(true) {
            tolerate(dev.reset_gpu_locked_clocks())
        } else {
            Ok(())
        };
        let m = if parts.mem && !held_by_others(false) {
            tolerate(dev.reset_memory_locked_clocks())
        } else {
            Ok(())
        };
        g.and(m)?;
        Ok(())
    }

    /// Take over journal entries that name a live process other than this daemon: that client
    /// is watched and its settings restored when it exits. Returns log lines.
    pub fn adopt(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let me = Owner::current();
        let mut st = self.lock();
        for index in 0..self.gpus.len() {
            for kind in Kind::ALL {
                let Ok(uuid) = self.gpus.device(index).and_then(|d| d.uuid()) else {
                    continue;
                };
                let entry = match self.journal.read(kind, &uuid) {
                    Ok(zeus_core::device::settings::Read::Entry(e)) => e,
                    _ => continue,
                };
                for owner in entry.live_holders() {
                    if owner.same_process(&me) {
                        continue;
                    }
                    let r = Requester {
                        key: ClientKey::Process(owner.clone()),
                        who: Who {
                            pid: Some(owner.pid),
                            ..Who::default()
                        },
                    };
                    let c = self.client(&mut st, &r);
                    match c.guard.adopt(index, kind) {
                        Ok(true) => {
                            let held = match kind {
                                Kind::PowerLimit => self
                                    .gpus
                                    .device(index)
                                    .and_then(|d| d.power_management_limit())
                                    .map(Held::Power)
                                    .unwrap_or(Held::Unknown),
                                Kind::Clocks => Held::Unknown,
                            };
                            c.holds.insert((index, kind), held);
                            lines.push(format!(
                                "adopted GPU {index}'s {} held by live process {}",
                                kind.describe(),
                                owner.pid
                            ));
                        }
                        Ok(false) => {}
                        Err(e) => lines.push(format!(
                            "cannot adopt GPU {index}'s {}: {e}",
                            kind.describe()
                        )),
                    }
                }
            }
        }
        lines
    }

    /// Wait until a process client exits (its pidfd), a new one arrives, or `timeout` passes.
    pub fn wait(&self, timeout: Duration) -> Woken {
        let fds: Vec<Arc<OwnedFd>> = self
            .lock()
            .values()
            .filter_map(|c| c.exit.clone())
            .collect();
        crate::exits::wait_any(&self.bell, &fds, timeout)
    }

    /// Release the holds of every client that is gone (process exited, lease lapsed).
    /// Returns log lines.
    pub fn reap(&self) -> Vec<String> {
        let now = Instant::now();
        let gone: Vec<(ClientKey, Client)> = {
            let mut st = self.lock();
            let keys: Vec<ClientKey> = st
                .iter()
                .filter(|(k, c)| !c.alive(k, now))
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| st.remove(&k).map(|c| (k, c)))
                .collect()
        };
        let mut lines = Vec::new();
        for (key, c) in gone {
            if c.holds.is_empty() {
                continue;
            }
            let why = match key {
                ClientKey::Process(_) => "exited",
                ClientKey::Lease(_) if c.disconnected => "hold connection closed",
                ClientKey::Lease(_) => "lease lapsed",
            };
            lines.push(release_line(&c.who, why, c.guard.restore()));
        }
        lines
    }

    /// Release every client's holds (the daemon is stopping). Returns log lines.
    pub fn release_all(&self) -> Vec<String> {
        let all: Vec<Client> = self.lock().drain().map(|(_, c)| c).collect();
        all.into_iter()
            .filter(|c| !c.holds.is_empty())
            .map(|c| release_line(&c.who, "daemon stopping", c.guard.restore()))
            .collect()
    }
}

fn release_line(who: &Who, why: &str, result: Result<Vec<Released>, SettingsError>) -> String {
    let what = match result {
        Err(e) => format!("restore failed (left journaled): {e}"),
        Ok(rs) => rs
            .iter()
            .map(Released::to_string)
            .collect::<Vec<_>>()
            .join("; "),
    };
    format!("released {} ({why}): {what}", who.describe())
}
