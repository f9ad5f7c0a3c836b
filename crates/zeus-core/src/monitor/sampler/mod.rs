//! The shared energy sampler: one background thread per process that keeps the GPUs' energy
//! counters off the caller's thread, calibrates itself to each board, checks itself, and
//! survives driver faults.
//!
//! Real drivers publish the energy counter and the power readings once per update period (100 ms
//! on an H100), and a counter read costs 3.5-6 ms of CPU while a power read costs about 1 µs. So
//! reading the counter at every window edge costs the caller milliseconds and returns a value up
//! to a period stale. Instead, the sampler thread
//!
//! 1. polls each GPU's power (instant power where the GPU has it) around the moment its driver is
//!    due to publish, and notes when the value changes: an update ("tick"), timed to a
//!    millisecond (exactly, where the driver's field timestamps move with the updates), which
//!    also gives the update period and its phase;
//! 2. reads the energy counter about once per update, within a CPU budget ([`ANCHOR_CPU_SHARE`]
//!    of a core for all GPUs; a process whose users need less, such as the Prometheus exporter,
//!    lowers it with [`set_anchor_cpu_share`]): at varied delays until the counter's own
//!    schedule is calibrated, then just after it publishes ([`fit`]);
//! 3. answers "energy at time t" and "energy of a window, and how wrong it may be" from the
//!    cache ([`Track`]), checking its model against every counter value before it uses it.
//!
//! A failed read never stops sampling: the call is retried with a short backoff (power reads
//! every 10-50 ms, counter reads every 20-200 ms) and the stretch without readings becomes a
//! gap in the model, bounded by what the board can draw; [`Watched::error`] says what is failing
//! while it does.
//!
//! The same thread also samples GPU temperature for `TemperatureMonitor`s (a cheap read once
//! per requested period), so that no monitor of this process needs a thread of its own: a GPU
//! is polled for power and anchored only while an energy user holds it, and its temperature is
//! read only while a temperature user does.
//!
//! [`Track`] is the per-GPU state machine and does no I/O, so tests drive it on a virtual clock;
//! [`Sampler`] owns the thread and the devices. Lifetime: the thread starts with the first lease
//! ([`Sampler::lease`]) and stops when the last lease is dropped; after `fork` a child's leases
//! report themselves stale ([`Lease::is_current`]) and a new lease in the child starts a new
//! thread there.
//!
//! RAPL zones (CPU package and DRAM energy) ride on the same thread ([`Sampler::lease_zones`]):
//! each leased zone is read at its [`RaplZone::poll_interval`] (at most every second, and
//! often enough at the observed power that its counter cannot wrap twice between reads), which
//! keeps the zone's shared unwrapped total right for windows of any length.

pub mod fit;
#[cfg(test)]
pub(crate) mod tests;
pub mod track;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::stop::StopSignal;

pub use track::{Anchor, Edge, Mode, Schedule, Tick, Track, WindowEstimate, Z95};

use crate::device::cpu::RaplZone;
use crate::device::{Clock, Gpu, GpuError, SystemClock};

/// Share of one core that counter reads may take, all GPUs together (the default).
pub const ANCHOR_CPU_SHARE: f64 = 0.04;
/// Bits of the process's share ([`set_anchor_cpu_share`]); 0 means the default.
static ANCHOR_CPU_SHARE_BITS: AtomicU64 = AtomicU64::new(0);

/// Let counter reads take at most `share` of one core in this process (from the next read on).
/// Fewer anchors cost nothing in accuracy at a tick (the power readings carry the energy between
/// anchors) but let extrapolation drift a little longer before the next anchor corrects it: fine
/// for a process scraped every few seconds, not for one timing short windows. Values outside
/// `(0, 1]` restore the default.
pub fn set_anchor_cpu_share(share: f64) {
    let bits = if share > 0.0 && share <= 1.0 {
        share.to_bits()
    } else {
        0
    };
    ANCHOR_CPU_SHARE_BITS.store(bits, Ordering::Relaxed);
}

/// The share counter reads may take in this process.
pub fn anchor_cpu_share() -> f64 {
    match ANCHOR_CPU_SHARE_BITS.load(Ordering::Relaxed) {
        0 => ANCHOR_CPU_SHARE,
        bits => f64::from_bits(bits),
    }
}
/// One GPU watched by the sampler.
pub struct Watched {
    gpu: Arc<dyn Gpu>,
    instant: AtomicBool,
    track: Mutex<Track>,
    /// Leases of each kind holding this GPU.
    energy_users: AtomicUsize,
    temperature: Mutex<Temperatures>,
    faults: Mutex<Faults>,
    /// Whether a monitor already warned that this GPU left the cached mode.
    warned: AtomicBool,
}

/// An ongoing failure of one kind of read.
#[derive(Debug, Clone)]
struct Failing {
    since: f64,
    error: GpuError,
    failures: u32,
    retry_at: f64,
}

impl Failing {
    fn next(prev: Option<Failing>, now: f64, error: GpuError, base: f64, max: f64) -> Failing {
        let failures = prev.as_ref().map_or(1, |p| p.failures.saturating_add(1));
        let backoff = (base * 2f64.powi(failures.min(16) as i32 - 1)).min(max);
        Failing {
            since: prev.map_or(now, |p| p.since),
            error,
            failures,
            retry_at: now + backoff,
        }
    }
}

/// The reads that are failing now.
#[derive(Debug, Default)]
struct Faults {
    power: Option<Failing>,
    energy: Option<Failing>,
}

/// Retry a failed power read after 10 ms, doubling up to 50 ms: sampling resumes within half
/// an update period of the driver answering again.
const POWER_RETRY: (f64, f64) = (0.010, 0.050);
/// Retry a failed counter read after 20 ms, doubling up to 200 ms (each read may cost ms).
const ENERGY_RETRY: (f64, f64) = (0.020, 0.200);

/// Temperature samples of one GPU, shared by every temperature user: the shortest period and
/// the largest capacity any of them asked for.
#[derive(Debug, Default)]
struct Temperatures {
    users: Vec<(f64, usize)>,
    next: f64,
    samples: VecDeque<(f64, f64)>,
    /// The read error that stopped temperature sampling (energy tracking goes on).
    error: Option<String>,
}

impl Temperatures {
    fn period(&self) -> Option<f64> {
        self.users.iter().map(|u| u.0).reduce(f64::min)
    }

    fn capacity(&self) -> usize {
        self.users.iter().map(|u| u.1).max().unwrap_or(0)
    }
}

/// What a lease holds its GPUs for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Interest {
    /// Power ticks and counter anchors, for energy windows.
    Energy,
    /// Temperature every `period` seconds, keeping the last `capacity` samples.
    Temperature { period: f64, capacity: usize },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watched {
    /// Watch `gpu` from `now`.
    pub fn new(gpu: Arc<dyn Gpu>, now: f64) -> Watched {
        // Only "not supported" means no instant power; any other failure is a fault to retry.
        let instant = !matches!(gpu.instant_power_usage(), Err(GpuError::NotSupported(_)));
        let period = gpu.power_update_period();
        let mut track = Track::new(now, period);
        // An averaged reading lags load steps by an unknown window, which the track learns; but
        // where the backend states the counter's lag (AMD: counter and power are one metrics
        // table, refreshed together every millisecond or so) the reading is of the same moment
        // as the counter, and is taken as such.
        let lag = gpu.counter_lag();
        track.set_average_only(!instant && lag.is_none());
        if let Some(lag) = lag {
            track.set_known_lag(lag);
        }
        if let Ok((_, max_mw)) = gpu.power_management_limit_constraints() {
            track.set_max_power(f64::from(max_mw) / 1000.0);
        }
        Watched {
            gpu,
            instant: AtomicBool::new(instant),
            track: Mutex::new(track),
            energy_users: AtomicUsize::new(0),
            temperature: Mutex::new(Temperatures::default()),
            faults: Mutex::new(Faults::default()),
            warned: AtomicBool::new(false),
        }
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<dyn Gpu> {
        &self.gpu
    }

    fn hold(&self, interest: Interest, now: f64) {
        match interest {
            Interest::Energy => {
                self.energy_users.fetch_add(1, Ordering::SeqCst);
            }
            Interest::Temperature { period, capacity } => {
                let mut t = lock(&self.temperature);
                if t.users.is_empty() {
                    t.next = now;
                }
                t.users.push((period, capacity));
            }
        }
    }

    /// Drop one hold; `true` when nothing holds the GPU any more.
    fn release(&self, interest: Interest) -> bool {
        let mut t = lock(&self.temperature);
        match interest {
            Interest::Energy => {
                self.energy_users.fetch_sub(1, Ordering::SeqCst);
            }
            Interest::Temperature { period, capacity } => {
                if let Some(k) = t.users.iter().position(|u| *u == (period, capacity)) {
                    t.users.swap_remove(k);
                }
            }
        }
        t.users.is_empty() && self.energy_users.load(Ordering::SeqCst) == 0
    }

    fn tracks_energy(&self) -> bool {
        self.energy_users.load(Ordering::SeqCst) > 0
    }

    /// Temperature samples `(time, °C)` within `[start, end]`, oldest first.
    pub fn temperatures(&self, start: f64, end: f64) -> Vec<(f64, f64)> {
        lock(&self.temperature)
            .samples
            .iter()
            .filter(|(t, _)| (start..=end).contains(t))
            .copied()
            .collect()
    }

    /// Why temperature sampling stopped, if it did.
    pub fn temperature_error(&self) -> Option<String> {
        lock(&self.temperature).error.clone()
    }

    /// The latest temperature sample at or before `time` (the latest of all for `None`).
    pub fn temperature_at(&self, time: Option<f64>) -> Option<(f64, f64)> {
        let t = lock(&self.temperature);
        match time {
            None => t.samples.back().copied(),
            Some(time) => t.samples.iter().rev().find(|(ts, _)| *ts <= time).copied(),
        }
    }

    /// Do whatever is due at the clock's now: the device is read without holding the track's
    /// lock, so readers of the cache never wait on a driver call. `n_devices` GPUs share the
    /// counter-read budget.
    pub fn run_due(&self, clock: &dyn Clock, n_devices: usize) {
        let now = clock.now();
        let temperature_period = {
            let t = lock(&self.temperature);
            t.period().filter(|_| t.next <= now)
        };
        if let Some(period) = temperature_period {
            let read = self.gpu.temperature_c();
            let at = clock.now();
            let mut t = lock(&self.temperature);
            match read {
                Ok(c) => {
                    t.error = None;
                    t.samples.push_back((at, f64::from(c)));
                    while t.samples.len() > t.capacity().max(1) {
                        t.samples.pop_front();
                    }
                }
                // Kept for `TemperatureMonitor` to report; retried on the grid.
                Err(e) => t.error = Some(e.to_string()),
            }
            // On a fixed grid; missed ticks are skipped, not made up.
            t.next += period * ((at - t.next) / period).floor().max(0.0) + period;
        }
        self.run_energy(clock, n_devices);
    }

    fn run_energy(&self, clock: &dyn Clock, n_devices: usize) {
        if !self.tracks_energy() {
            return;
        }
        let now = clock.now();
        let (anchor, poll) = {
            let t = lock(&self.track);
            (t.anchor_is_due(now), t.poll_due(now))
        };
        let retry_power = lock(&self.faults)
            .power
            .as_ref()
            .is_some_and(|f| f.retry_at <= now);
        if anchor {
            let before = clock.now();
            let cpu0 = thread_cpu_seconds();
            let read = self.gpu.total_energy_consumption();
            let cost = thread_cpu_seconds() - cpu0;
            let after = clock.now();
            match read {
                Ok(mj) => {
                    lock(&self.faults).energy = None;
                    let mut t = lock(&self.track);
                    t.on_counter(before, after, mj, cost);
                    t.set_load(n_devices, anchor_cpu_share());
                }
                Err(e) => {
                    let mut f = lock(&self.faults);
                    let next =
                        Failing::next(f.energy.take(), after, e, ENERGY_RETRY.0, ENERGY_RETRY.1);
                    let retry = next.retry_at - after;
                    f.energy = Some(next);
                    drop(f);
                    lock(&self.track).on_counter_fault(after, retry);
                }
            }
        }
        if poll || retry_power {
            let instant = self.instant.load(Ordering::Relaxed);
            let read = self.gpu.power_sample(instant);
            let at = clock.now();
            match read {
                Ok(s) => {
                    lock(&self.faults).power = None;
                    lock(&self.track).on_power(at, s.milliwatts, s.timestamp);
                }
                Err(GpuError::NotSupported(_)) if instant => {
                    // The board has no instant power after all: its average from now on.
                    self.instant.store(false, Ordering::Relaxed);
                    lock(&self.track).set_average_only(true);
                }
                Err(e) => {
                    let mut f = lock(&self.faults);
                    f.power = Some(Failing::next(
                        f.power.take(),
                        at,
                        e,
                        POWER_RETRY.0,
                        POWER_RETRY.1,
                    ));
                    drop(f);
                    lock(&self.track).on_power_fault(at);
                }
            }
        }
    }

    pub fn next_due(&self) -> f64 {
        let temperature = {
            let t = lock(&self.temperature);
            t.period().map_or(f64::INFINITY, |_| t.next)
        };
        if self.tracks_energy() {
            let retry = lock(&self.faults)
                .power
                .as_ref()
                .map_or(f64::INFINITY, |f| f.retry_at);
            lock(&self.track).next_due().min(temperature).min(retry)
        } else {
            temperature
        }
    }

    /// Run `f` on the track.
    pub fn with_track<R>(&self, f: impl FnOnce(&mut Track) -> R) -> R {
        f(&mut lock(&self.track))
    }

    /// What is failing now, if anything: the failing reads, since when, and the driver's error.
    pub fn error(&self) -> Option<String> {
        let f = lock(&self.faults);
        let describe = |what: &str, x: &Failing| {
            format!(
                "{what} reads failing since {} ({} attempts): {}",
                crate::monitor::counter::py_float(x.since),
                x.failures,
                x.error
            )
        };
        match (&f.power, &f.energy) {
            (None, None) => None,
            (Some(p), None) => Some(describe("power", p)),
            (None, Some(e)) => Some(describe("energy counter", e)),
            (Some(p), Some(e)) => Some(format!(
                "{}; {}",
                describe("power", p),
                describe("energy counter", e)
            )),
        }
    }

    /// Since when reads of this GPU have all been failing (power, and the counter too), with
    /// the driver's error: the device is gone while this lasts.
    pub fn down_since(&self) -> Option<(f64, GpuError)> {
        let f = lock(&self.faults);
        match (&f.power, &f.energy) {
            (Some(p), Some(e)) => Some((p.since.max(e.since), e.error.clone())),
            (Some(p), None) if !self.tracks_energy() => Some((p.since, p.error.clone())),
            _ => None,
        }
    }

    /// True the first time it is called after the GPU left the cached mode (for a warning
    /// once per GPU and process).
    pub fn take_mode_warning(&self) -> bool {
        !self.warned.swap(true, Ordering::SeqCst)
    }
}

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec on the stack.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Bumped in a child process after `fork`: threads do not survive a fork.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
static AT_FORK: Once = Once::new();

extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
}

/// One RAPL zone kept unwrapped by the sampler.
pub struct WatchedZone {
    zone: Arc<RaplZone>,
    users: AtomicUsize,
    next: Mutex<Instant>,
    error: Mutex<Option<String>>,
}

impl WatchedZone {
    pub fn zone(&self) -> &Arc<RaplZone> {
        &self.zone
    }

    /// The error of the sampler's last read of this zone, if it failed.
    pub fn error(&self) -> Option<String> {
        lock(&self.error).clone()
    }

    /// Read the zone if due; returns when it is next due. A failed read is recorded and
    /// retried at the next interval (cleared once a read succeeds).
    fn run_due(&self, now: Instant) -> Instant {
        let mut next = lock(&self.next);
        if *next <= now {
            *lock(&self.error) = self.zone.energy_j().err().map(|e| e.to_string());
            *next = Instant::now() + self.zone.poll_interval();
        }
        *next
    }
}

struct Shared {
    devices: Mutex<Vec<Arc<Watched>>>,
    zones: Mutex<Vec<Arc<WatchedZone>>>,
    stop: StopSignal,
}

impl Shared {
    fn run(&self) {
        let clock = SystemClock;
        loop {
            let devices = lock(&self.devices).clone();
            let n = devices.iter().filter(|d| d.tracks_energy()).count();
            let mut next = f64::INFINITY;
            for d in &devices {
                if d.next_due() <= clock.now() {
                    d.run_due(&clock, n);
                }
                next = next.min(d.next_due());
            }
            // Clock seconds to the next due time, slept on the monotonic clock; at most a
            // second, and a lease nudges the thread when it adds devices.
            let mut wait = if next.is_finite() {
                (next - clock.now()).clamp(0.0, 1.0)
            } else {
                1.0
            };
            let zones = lock(&self.zones).clone();
            let now = Instant::now();
            for z in &zones {
                let due = z.run_due(now);
                wait = wait.min(due.saturating_duration_since(Instant::now()).as_secs_f64());
            }
            if self
                .stop
                .sleep_until(Instant::now() + Duration::from_secs_f64(wait))
            {
                return;
            }
        }
    }
}

/// The process's sampler thread and the GPUs it watches.
pub struct Sampler {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    generation: u64,
}

static CURRENT: Mutex<Weak<Sampler>> = Mutex::new(Weak::new());

impl Sampler {
    fn start() -> std::io::Result<Arc<Sampler>> {
        AT_FORK.call_once(|| {
            // SAFETY: registers a handler that only bumps an atomic.
            unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        });
        let shared = Arc::new(Shared {
            devices: Mutex::new(Vec::new()),
            zones: Mutex::new(Vec::new()),
            stop: StopSignal::new(),
        });
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name("zeus-sampler".into()) // Linux keeps 15 bytes of a thread name
            .spawn(move || s.run())?;
        Ok(Arc::new(Sampler {
            shared,
            thread: Mutex::new(Some(handle)),
            generation: FORK_GENERATION.load(Ordering::SeqCst),
        }))
    }

    /// Watch `gpus` (on the real clock) for energy for as long as the returned lease lives.
    /// Starts the thread if none runs in this process.
    pub fn lease(gpus: &[Arc<dyn Gpu>]) -> std::io::Result<Lease> {
        Sampler::lease_for(gpus, Interest::Energy)
    }

    /// Watch `gpus` for `interest` for as long as the returned lease lives.
    pub fn lease_for(gpus: &[Arc<dyn Gpu>], interest: Interest) -> std::io::Result<Lease> {
        let sampler = Sampler::current()?;
        let now = SystemClock.now();
        let mut watched = Vec::with_capacity(gpus.len());
        {
            let mut devices = lock(&sampler.shared.devices);
            for g in gpus {
                let existing = devices.iter().find(|w| Arc::ptr_eq(&w.gpu, g)).cloned();
                let w = existing.unwrap_or_else(|| {
                    let w = Arc::new(Watched::new(g.clone(), now));
                    devices.push(w.clone());
                    w
                });
                w.hold(interest, now);
                watched.push(w);
            }
        }
        sampler.shared.stop.nudge();
        Ok(Lease {
            sampler,
            watched,
            interest,
        })
    }

    /// Keep `zones` unwrapped for as long as the returned lease lives: the sampler reads each
    /// at its poll interval. Starts the thread if none runs in this process.
    pub fn lease_zones(zones: &[Arc<RaplZone>]) -> std::io::Result<ZoneLease> {
        let sampler = Sampler::current()?;
        let mut watched = Vec::with_capacity(zones.len());
        {
            let mut all = lock(&sampler.shared.zones);
            for z in zones {
                let existing = all.iter().find(|w| Arc::ptr_eq(&w.zone, z)).cloned();
                let w = existing.unwrap_or_else(|| {
                    let w = Arc::new(WatchedZone {
                        zone: z.clone(),
                        users: AtomicUsize::new(0),
                        next: Mutex::new(Instant::now()),
                        error: Mutex::new(None),
                    });
                    all.push(w.clone());
                    w
                });
                w.users.fetch_add(1, Ordering::SeqCst);
                watched.push(w);
            }
        }
        sampler.shared.stop.nudge();
        Ok(ZoneLease {
            sampler,
            zones: watched,
        })
    }

    fn current() -> std::io::Result<Arc<Sampler>> {
        let mut current = lock(&CURRENT);
        match current.upgrade() {
            Some(s) if s.generation == FORK_GENERATION.load(Ordering::SeqCst) => Ok(s),
            _ => {
                let s = Sampler::start()?;
                *current = Arc::downgrade(&s);
                Ok(s)
            }
        }
    }

    /// Stop the process's sampler thread now (at interpreter exit). Leases keep answering from
    /// what was cached.
    pub fn stop_current() {
        let current = lock(&CURRENT).upgrade();
        if let Some(s) = current {
            s.stop();
        }
    }

    fn stop(&self) {
        self.shared.stop.stop();
        let handle = lock(&self.thread).take();
        if let Some(h) = handle {
            if self.generation == FORK_GENERATION.load(Ordering::SeqCst) {
                let _ = h.join();
            }
            // In a forked child the thread does not exist; its handle is dropped unjoined.
        }
    }

    /// Whether the thread is running.
    pub fn is_running(&self) -> bool {
        lock(&self.thread)
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A user's hold on some GPUs of the sampler, in the order given to [`Sampler::lease`].
pub struct Lease {
    sampler: Arc<Sampler>,
    watched: Vec<Arc<Watched>>,
    interest: Interest,
}

impl Lease {
    /// False in a child process forked after the lease was taken: its sampler thread is gone.
    pub fn is_current(&self) -> bool {
        self.sampler.generation == FORK_GENERATION.load(Ordering::SeqCst)
    }

    pub fn watched(&self, k: usize) -> &Arc<Watched> {
        &self.watched[k]
    }

    pub fn len(&self) -> usize {
        self.watched.len()
    }

    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    pub fn sampler_running(&self) -> bool {
        self.sampler.is_running()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut devices = lock(&self.sampler.shared.devices);
        for w in &self.watched {
            if w.release(self.interest) {
                devices.retain(|d| !Arc::ptr_eq(d, w));
            }
        }
    }
}

/// A GPU's cumulative energy as a server hands it out (the exporter's counter, zeusd's
/// `get_cumulative_energy`): from the sampler's cache, with no driver call; through a fault,
/// the low end of what the GPU may have drawn; and never below a value already served, so a
/// counter never goes back when a new anchor corrects an extrapolation.
#[derive(Debug, Default)]
pub struct ServedEnergy {
    /// Bits of the largest energy (J) served so far; energies are non-negative, so the order
    /// of their bit patterns is the order of the values.
    served_j: AtomicU64,
}

impl ServedEnergy {
    pub fn new() -> ServedEnergy {
        ServedEnergy::default()
    }

    /// The energy (J) to serve for `edge` (the track's estimate now).
    pub fn serve(&self, edge: &Edge) -> f64 {
        let j = if edge.degraded {
            edge.joules - edge.hard
        } else {
            edge.joules
        };
        let prev = self
            .served_j
            .fetch_max(j.max(0.0).to_bits(), Ordering::Relaxed);
        f64::from_bits(prev).max(j)
    }

    /// [`ServedEnergy::serve`] with how far (J, a 95% bound) the served value may be from the
    /// energy at the edge's moment: the edge's own bound, plus however far the value served
    /// sits from the estimate (a fault's low end, an earlier value held).
    pub fn serve_bounded(&self, edge: &Edge) -> (f64, f64) {
        let j = self.serve(edge);
        (j, Z95 * edge.sigma + edge.hard + (j - edge.joules).abs())
    }
}

/// A user's hold on some RAPL zones, in the order given to [`Sampler::lease_zones`].
pub struct ZoneLease {
    sampler: Arc<Sampler>,
    zones: Vec<Arc<WatchedZone>>,
}

impl ZoneLease {
    /// False in a child process forked after the lease was taken: its sampler thread is gone.
    pub fn is_current(&self) -> bool {
        self.sampler.generation == FORK_GENERATION.load(Ordering::SeqCst)
    }

    pub fn zones(&self) -> &[Arc<WatchedZone>] {
        &self.zones
    }

    pub fn sampler_running(&self) -> bool {
        self.sampler.is_running()
    }
}

impl Drop for ZoneLease {
    fn drop(&mut self) {
        let mut all = lock(&self.sampler.shared.zones);
        for w in &self.zones {
            if w.users.fetch_sub(1, Ordering::SeqCst) == 1 {
                all.retain(|z| !Arc::ptr_eq(z, w));
            }
        }
    }
}
