//! [`EnergyMonitor`]: the measurement windows behind `zeus.monitor.ZeusMonitor`.
//!
//! Windows are keyed by name and independent of each other, so any number can be open at once,
//! nested or overlapping. Opening one records the clock and every counter GPU's energy; closing
//! it takes them again. GPUs without a counter (pre-Volta) are integrated from a
//! [`PowerMonitor`] timeline.
//!
//! Counter GPUs are read one of two ways ([`ReadMode`]): from the shared sampler's cache
//! ([`super::sampler`]; no driver call on the caller's thread, energies interpolated to the exact
//! call times), or directly (one `nvmlDeviceGetTotalEnergyConsumption` per GPU per edge: exact on
//! an ideal device, but on real drivers a few milliseconds of CPU and up to an update period
//! stale).
//!
//! CPU packages (RAPL, [`crate::device::cpu`]) are optional: each window edge reads the
//! monitored package and DRAM zones directly (a sysfs file, ~20 µs) through their shared
//! unwrapped totals, while a sampler lease on the zones keeps those totals right across counter
//! wraps however long the window.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

use super::counter::{counter_delta_joules, py_float};
use super::error::{MonitorError, MonitorResult};
use super::power::{check_indices, PowerMonitor, PowerMonitorOptions};
use super::provenance::{Method, Provenance};
use super::sampler::track::Edge;
use super::sampler::{Lease, Mode, Sampler, Watched, ZoneLease};
use crate::device::cpu::{Cpus, RaplZone};
use crate::device::{Gpu, GpuResult, Gpus};

/// FNV-1a: window names are short strings chosen by the program itself, so a keyed hash
/// (SipHash, the default) buys nothing here and costs a noticeable share of a window pair.
#[derive(Default)]
struct Fnv1a(u64);

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// Closed-window buffers kept for reuse.
const SPARE_BUFFERS: usize = 64;

/// Counter refresh period assumed when the backend does not say (NVML never does): boards from
/// Volta on refresh power and energy within 100 ms.
pub const DEFAULT_COUNTER_UPDATE_PERIOD: f64 = 0.1;
/// Counter and timeline energies further apart than this fraction get reported ...
pub const DISAGREEMENT_REL: f64 = 0.10;
/// ... if they also differ by at least this many joules ...
pub const DISAGREEMENT_ABS_J: f64 = 1.0;
/// ... and the window spans at least this many sampling periods (shorter windows are noise).
pub const DISAGREEMENT_MIN_PERIODS: f64 = 10.0;

/// How a monitor reads the energy counters of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// The sampler's cache where it helps: on the real clock, for devices whose counter moves
    /// in steps (every real driver); direct reads for counters that are exact at every call
    /// (the ideal simulated GPU) and on a virtual clock.
    Auto,
    /// Always the sampler's cache (not available on a virtual clock).
    Cached,
    /// Always a counter read on the caller's thread, at every window edge.
    Direct,
}

impl ReadMode {
    pub fn parse(s: &str) -> MonitorResult<ReadMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(ReadMode::Auto),
            "cached" => Ok(ReadMode::Cached),
            "direct" => Ok(ReadMode::Direct),
            _ => Err(MonitorError::InvalidArg(format!(
                "reads must be 'auto', 'cached' or 'direct', got {s:?}"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ReadMode::Auto => "auto",
            ReadMode::Cached => "cached",
            ReadMode::Direct => "direct",
        }
    }
}

/// A GPU whose reads have all failed for this long (s) is gone: closing a window on it is an
/// error (the window stays open, to be closed again once the GPU answers, or cancelled).
pub const GONE_AFTER_S: f64 = 5.0;
/// How stale a counter read directly may be beyond its update period (s): the longest lag the
/// sampler calibrates.
const DIRECT_LAG_ALLOWANCE_S: f64 = super::sampler::track::LAG_MAX;

/// How long [`EnergyMonitor::end_window`] with `exact` waits for the counter to cover the end
/// of the window, in update periods (plus a fixed margin).
const EXACT_WAIT_PERIODS: f64 = 4.0;

/// Whether a counter changes between two reads a few milliseconds apart, twice in a row: then
/// it is exact at every call (an ideal device), and reading it directly is both cheap and right.
/// A real driver's counter moves once per update period, so at most one pair can straddle one.
fn counter_is_continuous(dev: &dyn Gpu) -> GpuResult<bool> {
    let mut last = dev.total_energy_consumption()?;
    for _ in 0..2 {
        std::thread::sleep(std::time::Duration::from_millis(3));
        let now = dev.total_energy_consumption()?;
        if now == last {
            return Ok(false);
        }
        last = now;
    }
    Ok(true)
}

/// An open window as reported by [`EnergyMonitor::open_windows`]: key, start time, and the
/// start energy (J) of each counter GPU.
/// Where an open window started: the reference's `measurement_states` entry (Zeus 0.16 reads
/// its `time`, `gpu_energy`, `cpu_energy` and `dram_energy`).
#[derive(Debug, Clone, PartialEq)]
pub struct WindowStart {
    pub key: String,
    /// The start timestamp (s, the GPUs' clock).
    pub time: f64,
    /// Each GPU with an energy counter: its total energy at the start (J), the sampler's
    /// estimate where the GPU is read through it.
    pub gpu_energy: Vec<(usize, f64)>,
    /// Each monitored CPU package's energy at the start (J), `None` when no CPU is monitored.
    pub cpu_energy: Option<Vec<(usize, f64)>>,
    /// The same for DRAM, packages with a DRAM zone only.
    pub dram_energy: Option<Vec<(usize, f64)>>,
}

/// Time (s) and energy (J) of one window, energy in the monitor's `gpu_indices` order.
/// `cpu_energy` and `dram_energy` (package index, J) are `None` when no CPU is monitored;
/// `dram_energy` has entries only for packages with a DRAM zone.
///
/// Every energy has a bound: the true energy lies within ± the bound in about 95% of windows
/// (see `docs/measurement-uncertainty.md`), and every GPU a [`Provenance`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Measurement {
    pub time: f64,
    pub energy: Vec<(usize, f64)>,
    pub cpu_energy: Option<Vec<(usize, f64)>>,
    pub dram_energy: Option<Vec<(usize, f64)>>,
    /// Per GPU, the bound of `energy` (J).
    pub energy_bound: Vec<(usize, f64)>,
    /// Per GPU, how its energy was made.
    pub provenance: Vec<(usize, Provenance)>,
    pub cpu_bound: Option<Vec<(usize, f64)>>,
    pub dram_bound: Option<Vec<(usize, f64)>>,
}

impl Measurement {
    /// GPU, CPU package and DRAM energy together, J.
    pub fn total_energy(&self) -> f64 {
        let sum = |v: &[(usize, f64)]| v.iter().map(|(_, e)| e).sum::<f64>();
        sum(&self.energy)
            + self.cpu_energy.as_deref().map_or(0.0, sum)
            + self.dram_energy.as_deref().map_or(0.0, sum)
    }
}

/// The CPU side of a monitor: the packages, their zones and the sampler's hold on them.
struct CpuPart {
    indices: Vec<usize>,
    /// Every monitored zone, package zone then DRAM zone (where present) per package.
    zones: Vec<Arc<RaplZone>>,
    /// Per monitored package: its package zone's and its DRAM zone's position in `zones`.
    slots: Vec<(usize, Option<usize>)>,
    _lease: ZoneLease,
}

impl CpuPart {
    fn new(cpus: &Cpus, indices: Vec<usize>) -> MonitorResult<CpuPart> {
        for (k, i) in indices.iter().enumerate() {
            if indices[..k].contains(i) {
                return Err(MonitorError::InvalidArg(format!(
                    "CPU index {i} appears twice in cpu_indices {indices:?}"
                )));
            }
        }
        cpus.check_indices(&indices)?;
        let mut zones = Vec::new();
        let mut slots = Vec::new();
        for &i in &indices {
            let p = cpus.package(i)?;
            let package_pos = zones.len();
            zones.push(p.package.clone());
            let dram_pos = p.dram.as_ref().map(|d| {
                zones.push(d.clone());
                zones.len() - 1
            });
            slots.push((package_pos, dram_pos));
        }
        let lease = Sampler::lease_zones(&zones)?;
        Ok(CpuPart {
            indices,
            zones,
            slots,
            _lease: lease,
        })
    }

    /// Each zone's unwrapped energy (J) and, per zone, how far off its total may be (J) and
    /// how stale this read may be (J: the counter's ~1 ms update at the power lately seen).
    fn read(&self, out: &mut Vec<f64>, uncertain: &mut Vec<(f64, f64)>) -> MonitorResult<()> {
        out.clear();
        uncertain.clear();
        for z in &self.zones {
            let (e, u, p) = z.energy_with_uncertainty()?;
            out.push(e);
            uncertain.push((u, p * RAPL_UPDATE_S + 1e-6));
        }
        Ok(())
    }
}

/// How often RAPL counters update (s): about every millisecond.
const RAPL_UPDATE_S: f64 = 0.001;

/// Instantaneous power read before the closing CUDA sync (`approx_instant_energy`): W per
/// monitored GPU and how long the reads took (s).
#[derive(Debug, Clone)]
pub struct InstantPower {
    pub watts: Vec<f64>,
    pub read_time: f64,
}

impl InstantPower {
    /// Read the power of GPUs `indices` now (the driver's `average_power_usage`, which is what
    /// the reference reads, or the instant power on boards without it), timing the reads on the
    /// backend clock.
    ///
    /// # Errors
    /// The first GPU error.
    pub fn read(gpus: &Gpus, indices: &[usize]) -> GpuResult<InstantPower> {
        let t0 = gpus.now();
        let mut watts = Vec::with_capacity(indices.len());
        for &i in indices {
            let mw = crate::device::power_mw(
                gpus.device(i)?.as_ref(),
                crate::device::PowerPreference::Average,
            )?;
            watts.push(f64::from(mw) / 1000.0);
        }
        Ok(InstantPower {
            watts,
            read_time: gpus.now() - t0,
        })
    }
}

/// The result of closing a window: the measurement and any quality warnings about it.
#[derive(Debug, Clone)]
pub struct WindowEnd {
    pub measurement: Measurement,
    pub warnings: Vec<String>,
}

#[derive(Debug)]
struct OpenWindow {
    start: f64,
    /// Counter readings (mJ), one per monitored GPU; 0 for GPUs without a counter, and for GPUs
    /// read through the sampler whose cache had a value.
    counters_mj: Vec<u64>,
    /// Per monitored GPU: the sampler's estimate (J) at `start`, NaN where none was used. It is
    /// re-evaluated at the end (the cache knows more by then) and only kept as a fallback.
    cached_j: Vec<f64>,
    /// Unwrapped energy (J) of each monitored RAPL zone at `start`.
    zones_j: Vec<f64>,
    /// Per monitored zone: how far off its total may be, and how stale the read, at `start` (J).
    zones_uncertain_j: Vec<(f64, f64)>,
    /// Per monitored GPU read through the sampler: a counter read at `start` (mJ), taken when
    /// the sampler had switched that GPU to direct reads (its model did not fit the board).
    safe_mj: Vec<Option<u64>>,
    /// How long after `start` the last of those reads returned (s): the counter was read then,
    /// not at `start` (a thread preempted in between, on a busy machine, reads it late).
    safe_late: f64,
    /// Per monitored GPU read directly: its instant power at `start` (W), for the bound.
    start_w: Vec<f64>,
    /// Per monitored GPU read through the sampler, in a window reopened by a cut: the cache's
    /// estimate at `start` as the slice before ended with it (empty otherwise).
    start_edges: Vec<Option<Edge>>,
}

/// Measurement windows over a fixed set of GPUs.
pub struct EnergyMonitor {
    gpus: Gpus,
    indices: Vec<usize>,
    has_counter: Vec<bool>,
    /// Per monitored GPU: the counter refresh period (s), for the short-window warning.
    counter_period: Vec<f64>,
    /// Per monitored GPU: whether its counter is exact at every read (then a direct read's
    /// bound is its resolution, not a period of staleness).
    exact: Vec<bool>,
    windows: HashMap<String, OpenWindow, BuildHasherDefault<Fnv1a>>,
    /// The sampler's hold on the GPUs read through it, and per monitored GPU its position in
    /// the lease (`None`: read directly).
    lease: Option<Lease>,
    cached: Vec<Option<usize>>,
    reads: ReadMode,
    /// Timeline for the GPUs without a counter, owned by this monitor.
    own_power: Option<Arc<PowerMonitor>>,
    /// A caller's timeline to cross-check counter energies against.
    check_power: Option<Arc<PowerMonitor>>,
    /// Per monitored GPU: its column in `own_power` / `check_power`.
    own_col: Vec<Option<usize>>,
    check_col: Vec<Option<usize>>,
    warned_short: HashSet<String>,
    /// Whether windows shorter than the counter's update period warn (off for windows cut by
    /// a program at boundaries of its own, not the caller's).
    warn_short: bool,
    log: Option<BufWriter<File>>,
    cpu: Option<CpuPart>,
    /// Reusable buffers: keys and counter vectors of closed windows, and end readings.
    spare_keys: Vec<String>,
    spare_counters: Vec<Vec<u64>>,
    spare_cached: Vec<Vec<f64>>,
    scratch: Vec<u64>,
    /// Row buffer reused for log lines.
    line: String,
}

impl std::fmt::Debug for EnergyMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnergyMonitor")
            .field("gpu_indices", &self.indices)
            .field("has_counter", &self.has_counter)
            .field("open_windows", &self.windows.len())
            .finish()
    }
}

fn columns(indices: &[usize], pm: Option<&Arc<PowerMonitor>>) -> Vec<Option<usize>> {
    indices
        .iter()
        .map(|i| pm.and_then(|pm| pm.gpu_indices().iter().position(|j| j == i)))
        .collect()
}

impl EnergyMonitor {
    /// Monitor `indices` (visible indices; `None` = all). GPUs without an energy counter get a
    /// [`PowerMonitor`] (sampling period inferred). `log_file` gets the reference's CSV header
    /// now and one row per closed window. `check_power`, if given, is a timeline that counter
    /// energies are cross-checked against.
    pub fn new(
        gpus: Gpus,
        indices: Option<Vec<usize>>,
        log_file: Option<&Path>,
        check_power: Option<Arc<PowerMonitor>>,
    ) -> MonitorResult<EnergyMonitor> {
        EnergyMonitor::with_reads(gpus, indices, log_file, check_power, ReadMode::Auto)
    }

    /// [`EnergyMonitor::new`] with a choice of how counters are read.
    pub fn with_reads(
        gpus: Gpus,
        indices: Option<Vec<usize>>,
        log_file: Option<&Path>,
        check_power: Option<Arc<PowerMonitor>>,
        reads: ReadMode,
    ) -> MonitorResult<EnergyMonitor> {
        EnergyMonitor::with_cpus(gpus, indices, None, log_file, check_power, reads)
    }

    /// [`EnergyMonitor::with_reads`] that also measures CPU packages: `cpus` gives the packages
    /// and the indices to monitor. With CPUs, `indices` may be empty (a CPU-only monitor).
    pub fn with_cpus(
        gpus: Gpus,
        indices: Option<Vec<usize>>,
        cpus: Option<(&Cpus, Vec<usize>)>,
        log_file: Option<&Path>,
        check_power: Option<Arc<PowerMonitor>>,
        reads: ReadMode,
    ) -> MonitorResult<EnergyMonitor> {
        let indices = indices.unwrap_or_else(|| (0..gpus.len()).collect());
        if let Some((_, cpu_indices)) = &cpus {
            if cpu_indices.is_empty() {
                return Err(MonitorError::InvalidArg(
                    "cpu_indices must not be empty; pass None to monitor no CPU".into(),
                ));
            }
        }
        if !(indices.is_empty() && cpus.is_some()) {
            check_indices(&gpus, &indices)?;
        }
        let cpu = cpus.map(|(c, i)| CpuPart::new(c, i)).transpose()?;
        let mut has_counter = Vec::with_capacity(indices.len());
        let mut counter_period = Vec::with_capacity(indices.len());
        for &i in &indices {
            let dev = gpus.device(i)?;
            has_counter.push(dev.supports_total_energy_consumption()?);
            counter_period.push(
                dev.power_update_period()
                    .unwrap_or(DEFAULT_COUNTER_UPDATE_PERIOD),
            );
        }
        let old: Vec<usize> = indices
            .iter()
            .zip(&has_counter)
            .filter(|(_, c)| !**c)
            .map(|(i, _)| *i)
            .collect();
        let own_power = if old.is_empty() {
            None
        } else {
            Some(Arc::new(PowerMonitor::new(
                gpus.clone(),
                Some(old),
                PowerMonitorOptions::default(),
            )?))
        };
        if reads == ReadMode::Cached && gpus.clock().is_virtual() {
            return Err(MonitorError::InvalidArg(
                "reads='cached' needs the real clock: the sampler runs in real time; use 'auto' \
                 or 'direct' on the simulator's virtual clock"
                    .into(),
            ));
        }
        let mut cached = vec![None; indices.len()];
        let mut exact = vec![false; indices.len()];
        let mut leased: Vec<Arc<dyn Gpu>> = Vec::new();
        for (k, &i) in indices.iter().enumerate() {
            if !has_counter[k] {
                continue;
            }
            let dev = gpus.device(i)?;
            // Ask the backend; else, on the real clock, find out (6 ms, once).
            exact[k] = match dev.counter_is_exact() {
                Some(x) => x,
                None if !gpus.clock().is_virtual() && reads != ReadMode::Cached => {
                    counter_is_continuous(dev.as_ref())?
                }
                None => false,
            };
            // A board whose power comes from its counter: the counter at the edges is all the
            // sampler would know, and its bound says so.
            let counter_only = reads == ReadMode::Auto && dev.power_from_counter();
            if reads != ReadMode::Direct
                && !gpus.clock().is_virtual()
                && (reads == ReadMode::Cached || !exact[k])
                && !counter_only
            {
                cached[k] = Some(leased.len());
                leased.push(dev.clone());
            }
        }
        let lease = if leased.is_empty() {
            None
        } else {
            Some(Sampler::lease(&leased)?)
        };
        let log = match log_file {
            None => None,
            Some(p) => Some(open_log(p, &indices, cpu.as_ref())?),
        };
        Ok(EnergyMonitor {
            cpu,
            lease,
            cached,
            reads,
            spare_cached: Vec::new(),
            own_col: columns(&indices, own_power.as_ref()),
            check_col: columns(&indices, check_power.as_ref()),
            gpus,
            indices,
            has_counter,
            counter_period,
            exact,
            windows: HashMap::default(),
            own_power,
            check_power,
            warned_short: HashSet::new(),
            warn_short: true,
            spare_keys: Vec::new(),
            spare_counters: Vec::new(),
            scratch: Vec::new(),
            log,
            line: String::new(),
        })
    }

    pub fn gpus(&self) -> &Gpus {
        &self.gpus
    }

    pub fn gpu_indices(&self) -> &[usize] {
        &self.indices
    }

    /// Monitored CPU packages, `None` when no CPU is monitored.
    pub fn cpu_indices(&self) -> Option<&[usize]> {
        self.cpu.as_ref().map(|c| c.indices.as_slice())
    }

    /// Whether each monitored GPU has an energy counter.
    pub fn has_counter(&self) -> &[bool] {
        &self.has_counter
    }

    /// The read mode asked for.
    pub fn reads(&self) -> ReadMode {
        self.reads
    }

    /// Per monitored GPU: whether its counter is read through the sampler's cache.
    pub fn reads_cached(&self) -> Vec<bool> {
        self.cached.iter().map(|c| c.is_some()).collect()
    }

    /// The sampler's cached energy (J) of monitored GPU `k` at `t`, marking `t` as a window edge.
    /// `None` when the GPU is read directly, the cache has no anchor yet, or this process was
    /// forked after the sampler started (its thread did not come along).
    fn cached_at(&self, k: usize, t: f64, edge: bool) -> Option<f64> {
        let lease = self.lease.as_ref()?;
        let pos = self.cached[k]?;
        if !lease.is_current() {
            return None;
        }
        lease.watched(pos).with_track(|track| {
            if edge {
                track.add_hint(t);
            }
            track.energy_at(t)
        })
    }

    /// Wait until the sampler has a counter value after `t` for every cached GPU, or give up
    /// after a few update periods.
    fn wait_settled(&self, t: f64) {
        let Some(lease) = self.lease.as_ref().filter(|l| l.is_current()) else {
            return;
        };
        let slowest = (0..lease.len())
            .map(|k| lease.watched(k).with_track(|tr| tr.period()))
            .fold(0.0, f64::max);
        let deadline = std::time::Instant::now()
            + std::time::Duration::from_secs_f64(EXACT_WAIT_PERIODS * slowest + 0.2);
        while std::time::Instant::now() < deadline && lease.sampler_running() {
            let settled =
                (0..lease.len()).all(|k| lease.watched(k).with_track(|tr| tr.is_settled(t)));
            if settled {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Turn the warning for windows shorter than the counter's update period on or off.
    pub fn set_short_window_warnings(&mut self, on: bool) {
        self.warn_short = on;
    }

    /// The power monitor of the GPUs without a counter, if any.
    pub fn power_monitor(&self) -> Option<&Arc<PowerMonitor>> {
        self.own_power.as_ref()
    }

    /// Open windows: where each started.
    pub fn open_windows(&self) -> Vec<WindowStart> {
        self.windows
            .iter()
            .map(|(k, w)| {
                let gpu_energy = self
                    .indices
                    .iter()
                    .enumerate()
                    .filter(|&(g, _)| self.has_counter[g])
                    .map(|(g, &i)| {
                        let cached = w.cached_j[g];
                        let read = w.counters_mj[g] as f64 / 1000.0;
                        (i, if cached.is_nan() { read } else { cached })
                    })
                    .collect();
                let part = |dram: bool| {
                    self.cpu.as_ref().map(|cpu| {
                        cpu.indices
                            .iter()
                            .zip(&cpu.slots)
                            .filter_map(|(&i, &(package, zone))| {
                                let z = if dram { zone? } else { package };
                                Some((i, w.zones_j[z]))
                            })
                            .collect()
                    })
                };
                WindowStart {
                    key: k.clone(),
                    time: w.start,
                    gpu_energy,
                    cpu_energy: part(false),
                    dram_energy: part(true),
                }
            })
            .collect()
    }

    /// Whether window `key` is open.
    pub fn is_open(&self, key: &str) -> bool {
        self.windows.contains_key(key)
    }

    /// Read the counter of every counter GPU whose `cached` value is NaN into `out` (cleared
    /// first; 0 for the others).
    fn read_counters(&self, cached: &[f64], out: &mut Vec<u64>) -> GpuResult<()> {
        out.clear();
        for (k, &i) in self.indices.iter().enumerate() {
            out.push(if self.has_counter[k] && cached[k].is_nan() {
                self.gpus.device(i)?.total_energy_consumption()?
            } else {
                0
            });
        }
        Ok(())
    }

    /// The sampler's estimates at `t` into `out` (NaN where there is none), marking an edge.
    fn read_cached(&self, t: f64, out: &mut Vec<f64>) {
        out.clear();
        for k in 0..self.indices.len() {
            out.push(self.cached_at(k, t, true).unwrap_or(f64::NAN));
        }
    }

    /// A manual (virtual-clock) timeline only grows when sampled, so sample at window edges;
    /// on a running sampler this adds exact edge points, which only helps.
    fn sample_edges(&self) -> GpuResult<()> {
        if let Some(pm) = &self.own_power {
            pm.sample_now()?;
        }
        Ok(())
    }

    /// The watched GPU behind monitored GPU `k`, when it is read through a live sampler.
    fn watched(&self, k: usize) -> Option<&Arc<Watched>> {
        let lease = self.lease.as_ref().filter(|l| l.is_current())?;
        Some(lease.watched(self.cached[k]?))
    }

    /// The energy (J) of `[t0, t1]` summed over the monitored GPUs and its bound (J), from
    /// the sampler's cache: every GPU must be read through the sampler in its cached mode
    /// (`None` for good where one is read otherwise). With `settled_only`, once final: each
    /// GPU's counter has updated past `t1` (the edges are interpolated, not extrapolated),
    /// `None` until then. Without it, as known now: an edge past the last counter update is
    /// extrapolated, with the bound that says so. The serving ledger fits its cost model on
    /// settled values, and takes the others for spans it cannot wait for (a flush).
    pub fn energy_from_cache(&self, t0: f64, t1: f64, settled_only: bool) -> Option<(f64, f64)> {
        let (mut sum, mut bound) = (0.0, 0.0);
        for k in 0..self.indices.len() {
            let w = self.watched(k)?;
            let (e, b) = w.with_track(|t| {
                if t.mode() != Mode::Cached || (settled_only && !t.is_settled(t1)) {
                    return None;
                }
                t.window_estimate(t0, t1).map(|e| (e.joules, e.bound))
            })?;
            sum += e;
            bound += b;
        }
        Some((sum, bound))
    }

    /// Monitored GPU `k`'s counter updates after `after` as the sampler placed them: `(the
    /// moment the value describes, J on one scale across resets, how far off the moment may
    /// be)`, oldest first. `None` unless the GPU is read through the sampler in its cached
    /// mode. The serving ledger fits its cost model between these.
    pub fn anchors_after(&self, k: usize, after: f64) -> Option<Vec<(f64, f64, f64)>> {
        let w = self.watched(k)?;
        w.with_track(|t| {
            (t.mode() == Mode::Cached).then(|| {
                // Anchors are in time order: the ledger asks after every step, and only the
                // newest one or two are after what it has seen.
                let anchors = t.anchors();
                let first = anchors.partition_point(|a| a.t <= after);
                anchors
                    .range(first..)
                    .map(|a| (a.t, a.joules, a.t_err))
                    .collect()
            })
        })
    }

    /// Counter reads at a window edge for the GPUs the sampler has switched to direct reads
    /// (its model does not fit their board); empty when none has.
    fn safe_reads(&self) -> GpuResult<Vec<Option<u64>>> {
        let mut out = Vec::new();
        for (k, &i) in self.indices.iter().enumerate() {
            let direct = self
                .watched(k)
                .is_some_and(|w| w.with_track(|t| t.mode()) == Mode::Direct);
            if direct {
                out.resize(self.indices.len(), None);
                out[k] = Some(self.device_read(i)?);
            }
        }
        Ok(out)
    }

    /// A counter read of visible GPU `i`, its errors naming it.
    fn device_read(&self, i: usize) -> GpuResult<u64> {
        self.gpus
            .device(i)?
            .total_energy_consumption()
            .map_err(|e| e.with_message(format!("GPU {i}: {}", e.message())))
    }

    /// Instant power (W) of the GPUs read directly with a counter that is not exact, for the
    /// bound of their staleness; empty when there are none.
    fn direct_powers(&self) -> Vec<f64> {
        let mut out = Vec::new();
        for (k, &i) in self.indices.iter().enumerate() {
            if self.cached[k].is_none() && self.has_counter[k] && !self.exact[k] {
                out.resize(self.indices.len(), 0.0);
                out[k] = self
                    .gpus
                    .device(i)
                    .and_then(|d| {
                        crate::device::power_mw(d.as_ref(), crate::device::PowerPreference::Instant)
                    })
                    .map_or(0.0, |mw| f64::from(mw) / 1000.0);
            }
        }
        out
    }

    /// Open window `key`. `ValueError`-style error if it is already open.
    pub fn begin_window(&mut self, key: &str) -> MonitorResult<()> {
        if self.windows.contains_key(key) {
            return Err(MonitorError::InvalidArg(format!(
                "Measurement window '{key}' already exists"
            )));
        }
        let start = self.gpus.now();
        // Buffers of closed windows are reused: a begin/end pair then allocates nothing but
        // the measurement it returns.
        let mut counters_mj = self.spare_counters.pop().unwrap_or_default();
        let mut cached_j = self.spare_cached.pop().unwrap_or_default();
        let mut zones_j = Vec::new();
        let mut zones_uncertain_j = Vec::new();
        if let Some(cpu) = &self.cpu {
            cpu.read(&mut zones_j, &mut zones_uncertain_j)?;
        }
        self.read_cached(start, &mut cached_j);
        self.read_counters(&cached_j, &mut counters_mj)?;
        let safe_mj = self.safe_reads()?;
        // (No clock read where nothing was read directly: most windows.)
        let safe_late = if safe_mj.is_empty() {
            0.0
        } else {
            self.gpus.now() - start
        };
        let start_w = self.direct_powers();
        self.sample_edges()?;
        let mut k = self.spare_keys.pop().unwrap_or_default();
        k.clear();
        k.push_str(key);
        self.windows.insert(
            k,
            OpenWindow {
                start,
                counters_mj,
                cached_j,
                zones_j,
                zones_uncertain_j,
                safe_mj,
                safe_late,
                start_w,
                start_edges: Vec::new(),
            },
        );
        Ok(())
    }

    /// Close window `key`. With `cancel` the window is dropped: zeros, no log row, no warnings.
    /// `instant` (the `approx_instant_energy` reads) fills in GPUs whose energy came out as
    /// exactly zero, as the reference does.
    pub fn end_window(
        &mut self,
        key: &str,
        cancel: bool,
        instant: Option<&InstantPower>,
    ) -> MonitorResult<WindowEnd> {
        self.end_window_with(key, cancel, instant, false)
    }

    /// [`EnergyMonitor::end_window`]; with `exact`, GPUs read through the sampler wait (a few
    /// hundred milliseconds at most) for the counter's next update after the window's end, so
    /// both edges are interpolated between counter values instead of the end being extrapolated
    /// with power readings.
    ///
    /// A GPU whose reads have all failed for [`GONE_AFTER_S`] is gone: the error names it, and
    /// the window stays open (close it again once the GPU answers, or cancel it). So does any
    /// other device error at the end: nothing measured is lost.
    pub fn end_window_with(
        &mut self,
        key: &str,
        cancel: bool,
        instant: Option<&InstantPower>,
        exact: bool,
    ) -> MonitorResult<WindowEnd> {
        let Some((k, w)) = self.windows.remove_entry(key) else {
            return Err(MonitorError::InvalidArg(format!(
                "Measurement window '{key}' does not exist"
            )));
        };
        let r = if cancel {
            Ok(self.cancelled())
        } else {
            self.check_gone()
                .and_then(|_| self.close(key, &w, instant, exact, None, None))
        };
        if r.is_err() {
            self.windows.insert(k, w);
            return r;
        }
        if self.spare_keys.len() < SPARE_BUFFERS {
            self.spare_keys.push(k);
            self.spare_counters.push(w.counters_mj);
            self.spare_cached.push(w.cached_j);
        }
        r
    }

    /// Close window `key` and reopen it under the same name at the same instant, from the
    /// same reads: the measurement of the slice so far. Consecutive slices add up to the whole
    /// window (a counter's value or a timestamp ends one slice and starts the next), which an
    /// `end_window` followed by a `begin_window` cannot promise: the energy between their reads
    /// would belong to neither.
    ///
    /// # Errors
    /// As [`EnergyMonitor::end_window`]; on an error the window stays open, unchanged.
    pub fn cut_window(&mut self, key: &str) -> MonitorResult<WindowEnd> {
        self.cut(key, None)
    }

    /// [`EnergyMonitor::cut_window`] at `at`, a moment that has passed since the window
    /// began (on the monitor's clock): the slice `[start, at]`, and the window goes on from
    /// `at`. Only a window whose every part the sampler's model can place after the fact can
    /// be cut in the past ([`EnergyMonitor::can_cut_in_past`]): each GPU read from the cache,
    /// no CPU (RAPL is read at the moment). A serving engine marks where a step begins with a
    /// clock read and cuts there once the step has ended, with its caches warm, instead of
    /// cutting twice with them cold.
    ///
    /// # Errors
    /// `at` before the window began or after now, a window that cannot be cut in the past,
    /// and as [`EnergyMonitor::cut_window`]; on an error the window stays open, unchanged.
    pub fn cut_window_at(&mut self, key: &str, at: f64) -> MonitorResult<WindowEnd> {
        self.cut(key, Some(at))
    }

    /// Whether window `key` is open and can be cut at a moment that has passed
    /// ([`EnergyMonitor::cut_window_at`]).
    pub fn can_cut_in_past(&self, key: &str) -> bool {
        self.windows
            .get(key)
            .is_some_and(|w| self.placeable_after_the_fact(w))
    }

    /// Whether every part of `w` can be evaluated at any moment since it began: each GPU
    /// from the sampler's cache, which it started from, and nothing read at the moment (no
    /// CPU, no direct or power-monitor GPU).
    fn placeable_after_the_fact(&self, w: &OpenWindow) -> bool {
        self.cpu.is_none()
            && self.own_power.is_none()
            && w.safe_mj.is_empty()
            && w.start_w.is_empty()
            && w.cached_j.iter().enumerate().all(|(k, c)| {
                !c.is_nan()
                    && self
                        .watched(k)
                        .is_some_and(|wt| wt.with_track(|t| t.mode()) == Mode::Cached)
            })
    }

    /// `cut_window` now, or at `at` (`cut_window_at`).
    fn cut(&mut self, key: &str, at: Option<f64>) -> MonitorResult<WindowEnd> {
        let Some(w) = self.windows.remove(key) else {
            return Err(MonitorError::InvalidArg(format!(
                "Measurement window '{key}' does not exist"
            )));
        };
        let checked = match at {
            None => Ok(()),
            Some(t) if !(w.start..=self.gpus.now()).contains(&t) => {
                Err(MonitorError::InvalidArg(format!(
                    "Measurement window '{key}' cannot be cut at {t}: it began at {} and it is \
                     {} now",
                    w.start,
                    self.gpus.now()
                )))
            }
            Some(_) if !self.placeable_after_the_fact(&w) => {
                Err(MonitorError::InvalidArg(format!(
                    "Measurement window '{key}' cannot be cut in the past: only GPUs read from \
                     the sampler's cache, and no CPU, can be measured after the fact"
                )))
            }
            Some(_) => Ok(()),
        };
        let mut next = None;
        match checked
            .and_then(|_| self.check_gone())
            .and_then(|_| self.close(key, &w, None, false, Some(&mut next), at))
        {
            Ok(end) => {
                let next = next.expect("close reopens when asked to");
                self.windows.insert(key.to_owned(), next);
                // A failing sample leaves a gap in the timeline that the next slice's bound
                // counts; the slice measured here is not lost for it.
                let _ = self.sample_edges();
                Ok(end)
            }
            Err(e) => {
                self.windows.insert(key.to_owned(), w);
                Err(e)
            }
        }
    }

    /// An error naming the first monitored GPU that has not answered for [`GONE_AFTER_S`].
    fn check_gone(&self) -> MonitorResult<()> {
        let now = self.gpus.now();
        for (k, &i) in self.indices.iter().enumerate() {
            let Some((since, e)) = self.watched(k).and_then(|w| w.down_since()) else {
                continue;
            };
            if now - since >= GONE_AFTER_S {
                return Err(MonitorError::Gpu(e.with_message(format!(
                    "GPU {i} has not answered for {:.1} s ({}); the window stays open: end it \
                     again once the GPU is back, or cancel it",
                    now - since,
                    e.message()
                ))));
            }
        }
        Ok(())
    }

    /// The measurement of a cancelled window: zeros.
    fn cancelled(&self) -> WindowEnd {
        let zeros = |v: &[usize]| v.iter().map(|&i| (i, 0.0)).collect::<Vec<_>>();
        let cpu = self.cpu.as_ref();
        let dram = cpu.map(|c| {
            c.indices
                .iter()
                .zip(&c.slots)
                .filter(|(_, s)| s.1.is_some())
                .map(|(&i, _)| (i, 0.0))
                .collect::<Vec<_>>()
        });
        WindowEnd {
            measurement: Measurement {
                time: 0.0,
                energy: zeros(&self.indices),
                cpu_energy: cpu.map(|c| zeros(&c.indices)),
                dram_energy: dram.clone(),
                energy_bound: zeros(&self.indices),
                provenance: self
                    .indices
                    .iter()
                    .map(|&i| (i, Provenance::default()))
                    .collect(),
                cpu_bound: cpu.map(|c| zeros(&c.indices)),
                dram_bound: dram,
            },
            warnings: Vec::new(),
        }
    }

    /// How the sampler's calibration of monitored GPU `k` stands, for its provenance.
    fn provenance(&self, k: usize, method: Method) -> Provenance {
        let mut p = Provenance::new(method);
        match self.watched(k) {
            Some(w) => w.with_track(|t| {
                let s = t.schedule();
                p.update_period = Some(s.grid.period);
                p.counter_lag = s.lag_known.then_some(s.lag);
                if t.mode() != Mode::Cached {
                    p.note = Some(t.mode_reason().to_string());
                }
            }),
            None => p.update_period = Some(self.counter_period[k]),
        }
        p
    }

    /// Close `w` now, or at `at` (a window `placeable_after_the_fact`). With `next`, also the
    /// state a window opening at that very instant would start from, made of the same end
    /// reads, so that consecutive slices add up to the whole (`cut_window`).
    fn close(
        &mut self,
        key: &str,
        w: &OpenWindow,
        instant: Option<&InstantPower>,
        exact: bool,
        next: Option<&mut Option<OpenWindow>>,
        at: Option<f64>,
    ) -> MonitorResult<WindowEnd> {
        let reopen = next.is_some();
        let start = w.start;
        let end = at.unwrap_or_else(|| self.gpus.now());
        let time = end - start;
        let (mut end_zones_j, mut end_zones_u) = (Vec::new(), Vec::new());
        let (cpu_energy, dram_energy, cpu_bound, dram_bound) = match &self.cpu {
            None => (None, None, None, None),
            Some(cpu) => {
                let (now_j, now_u) = (&mut end_zones_j, &mut end_zones_u);
                cpu.read(now_j, now_u)?;
                let d = |z: usize| (now_j[z] - w.zones_j[z]).max(0.0);
                // The late reads' part since the start, plus each edge's staleness.
                // What late reads added since the start, and both reads' staleness.
                let b = |z: usize| {
                    let ((u0, s0), (u1, s1)) = (w.zones_uncertain_j[z], now_u[z]);
                    (u1 - u0).max(0.0) + s0 + s1
                };
                let (mut c, mut cb) = (Vec::new(), Vec::new());
                let (mut m, mut mb) = (Vec::new(), Vec::new());
                for (&i, &(p, dram)) in cpu.indices.iter().zip(&cpu.slots) {
                    c.push((i, d(p)));
                    cb.push((i, b(p)));
                    if let Some(z) = dram {
                        m.push((i, d(z)));
                        mb.push((i, b(z)));
                    }
                }
                (Some(c), Some(m), Some(cb), Some(mb))
            }
        };
        // Cached GPUs: mark the end edge; then (after waiting, with `exact`) take both edges
        // from the cache, the start again since the cache knows more by now.
        if exact && self.lease.is_some() {
            for k in 0..self.indices.len() {
                if let Some(wt) = self.watched(k) {
                    wt.with_track(|t| t.add_hint(end));
                }
            }
            self.wait_settled(end);
        }
        let mut counters = std::mem::take(&mut self.scratch);
        let read = self.read_counters(&w.cached_j, &mut counters);
        self.scratch = counters;
        read?;
        let (safe_now, safe_late) = if w.safe_mj.is_empty() {
            (Vec::new(), 0.0)
        } else {
            (self.safe_reads_for(&w.safe_mj)?, self.gpus.now() - end)
        };
        let end_w = if w.start_w.is_empty() {
            Vec::new()
        } else {
            self.direct_powers()
        };
        let mut warnings = Vec::new();
        let own = match &self.own_power {
            Some(pm) => {
                // A failing sample leaves a gap the bound counts; the window is not lost.
                let _ = pm.sample_now();
                pm.get_energy(start, end)
                    .map(|e| (e, pm.get_energy_bound(start, end)))
            }
            None => None,
        };
        let n = self.indices.len();
        let mut energy = Vec::with_capacity(n);
        let mut bound = Vec::with_capacity(n);
        let mut provenance = Vec::with_capacity(n);
        let mut end_edges = Vec::new();
        for (k, &i) in self.indices.iter().enumerate() {
            let began_cached = !w.cached_j[k].is_nan();
            let (mut e, b, method) = if let Some(wt) = self.watched(k).cloned() {
                let (e, b, method, end_edge) =
                    self.cached_energy(k, i, &wt, w, (end, safe_late), exact, &safe_now)?;
                if reopen {
                    end_edges.resize(k, None);
                    end_edges.push(end_edge);
                }
                (e, b, method)
            } else if began_cached {
                // The cache is gone (a forked child): the counter is on the same scale.
                let e = self.device_read(i)? as f64 / 1000.0;
                let b = self.staleness_bound(k, (e - w.cached_j[k]).max(0.0), time, w, &end_w);
                ((e - w.cached_j[k]).max(0.0), b, Method::DirectCounter)
            } else if self.has_counter[k] {
                match counter_delta_joules(w.counters_mj[k], self.scratch[k]) {
                    Some(e) => {
                        let b = if self.exact[k] {
                            0.002
                        } else {
                            self.staleness_bound(k, e, time, w, &end_w)
                        };
                        (e, b, Method::DirectCounter)
                    }
                    // The counter went back within the window (a reset, or a stale read): the
                    // energy is anything the GPU can draw over it.
                    None => {
                        let (e, b) = self.drawable(i, time);
                        (e, b, Method::Degraded)
                    }
                }
            } else {
                match (&own, self.own_col[k]) {
                    (Some((v, b)), Some(c)) => (
                        v[c],
                        b.as_ref().map_or(v[c], |b| b[c]),
                        Method::PowerIntegration,
                    ),
                    _ => (0.0, 0.0, Method::PowerIntegration),
                }
            };
            if let Some(ip) = instant {
                if e == 0.0 {
                    e = ip.watts[k] * (time - ip.read_time);
                }
            }
            if method == Method::Degraded {
                warnings.push(format!(
                    "Measurement window '{key}': GPU {i}'s readings failed, or its energy counter \
                     reset, within the window; its energy ({} J) rests on what the GPU can draw \
                     there: ±{} J.",
                    py_float(e),
                    py_float(b)
                ));
            }
            energy.push((i, e));
            bound.push((i, b));
            provenance.push((i, self.provenance(k, method)));
        }
        self.mode_warnings(&mut warnings);
        // A cut's slices are short on purpose (a serving step lasts 20-40 ms): whoever cuts
        // gets each slice's bound instead.
        // The backend's periods first (no lock): most windows are longer than those.
        if self.warn_short
            && !reopen
            && time < self.counter_period.iter().copied().fold(0.0, f64::max)
            && !self.warned_short.contains(key)
            && time < self.slowest_counter_period()
        {
            self.warned_short.insert(key.to_owned());
            warnings.push(format!(
                "Measurement window '{key}' lasted {} s, shorter than the GPU energy counter's \
                 update period ({} s): its energy is unreliable. This warning is shown once per window name.",
                py_float(time),
                py_float(self.slowest_counter_period())
            ));
        }
        self.cross_check(key, start, end, &energy, &mut warnings);
        if let Some(slot) = next {
            *slot = Some(self.reopened(
                w,
                end,
                end_zones_j,
                end_zones_u,
                (safe_now, safe_late),
                end_w,
                end_edges,
            )?);
        }
        let m = Measurement {
            time,
            energy,
            cpu_energy,
            dram_energy,
            energy_bound: bound,
            provenance,
            cpu_bound,
            dram_bound,
        };
        self.write_log(key, start, &m)?;
        Ok(WindowEnd {
            measurement: m,
            warnings,
        })
    }

    /// The start of a window reopened at `end` from the reads that closed `w` there (a cut).
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn reopened(
        &self,
        w: &OpenWindow,
        end: f64,
        zones_j: Vec<f64>,
        zones_uncertain_j: Vec<(f64, f64)>,
        (safe_mj, safe_late): (Vec<Option<u64>>, f64),
        start_w: Vec<f64>,
        start_edges: Vec<Option<Edge>>,
    ) -> MonitorResult<OpenWindow> {
        let mut cached_j = Vec::new();
        self.read_cached(end, &mut cached_j);
        let mut counters_mj = self.scratch.clone();
        for k in 0..self.indices.len() {
            // The cache answered at the start but not now: the next slice needs the counter
            // itself, which this slice did not read.
            if self.has_counter[k] && cached_j[k].is_nan() && !w.cached_j[k].is_nan() {
                counters_mj[k] = self.device_read(self.indices[k])?;
            }
        }
        Ok(OpenWindow {
            start: end,
            counters_mj,
            cached_j,
            zones_j,
            zones_uncertain_j,
            safe_mj,
            safe_late,
            start_w,
            start_edges,
        })
    }

    /// Counter reads now for the GPUs that had one at the start (safe mode).
    fn safe_reads_for(&self, started: &[Option<u64>]) -> GpuResult<Vec<Option<u64>>> {
        let mut out = vec![None; started.len()];
        for (k, s) in started.iter().enumerate() {
            if s.is_some() {
                out[k] = Some(self.device_read(self.indices[k])?);
            }
        }
        Ok(out)
    }

    /// The energy of a GPU read through the sampler: from the cache, or in the safe modes from
    /// direct reads at the edges or the power readings; with its bound and method.
    #[allow(clippy::too_many_arguments)]
    fn cached_energy(
        &self,
        k: usize,
        i: usize,
        watched: &Arc<Watched>,
        w: &OpenWindow,
        (end, end_late): (f64, f64),
        exact: bool,
        safe_now: &[Option<u64>],
    ) -> MonitorResult<(f64, f64, Method, Option<Edge>)> {
        let start = w.start;
        let mode = watched.with_track(|t| t.mode());
        let direct = (
            w.safe_mj.get(k).copied().flatten(),
            safe_now.get(k).copied().flatten(),
        );
        if let (Mode::Direct, (Some(a), Some(b))) = (mode, direct) {
            if let Some(e) = counter_delta_joules(a, b) {
                let bound =
                    watched.with_track(|t| t.direct_bound((start, w.safe_late), (end, end_late)));
                return Ok((e, bound, Method::DirectCounter, None));
            }
            // The counter went back within the window: the power readings' integral.
            if let Some(p) = watched.with_track(|t| t.power_window(start, end)) {
                return Ok((p.joules, p.bound, Method::Degraded, None));
            }
        }
        if mode == Mode::Power {
            if let Some(p) = watched.with_track(|t| t.power_window(start, end)) {
                let method = if p.degraded {
                    Method::Degraded
                } else {
                    Method::PowerIntegration
                };
                return Ok((p.joules, p.bound, method, None));
            }
        }
        let pinned = w.start_edges.get(k).copied().flatten();
        let est = watched.with_track(|t| t.window_from(start, pinned, end, !exact));
        match est {
            Some((est, end_edge)) => {
                let method = if est.degraded {
                    Method::Degraded
                } else {
                    Method::CachedCounter
                };
                Ok((est.joules, est.bound, method, Some(end_edge)))
            }
            None => {
                // No counter value yet (the sampler has not read one, or every read failed):
                // the counter now against the value the window started from, if it had one.
                let e = self.device_read(i)? as f64 / 1000.0;
                let late = self.gpus.now() - end;
                if w.cached_j[k].is_nan() {
                    let est = watched.with_track(|t| t.power_window(start, end));
                    return Ok(
                        est.map_or((0.0, f64::INFINITY, Method::Degraded, None), |p| {
                            (p.joules, p.bound, Method::PowerIntegration, None)
                        }),
                    );
                }
                let bound = watched.with_track(|t| t.direct_bound((start, 0.0), (end, late)));
                Ok((
                    (e - w.cached_j[k]).max(0.0),
                    bound,
                    Method::DirectCounter,
                    None,
                ))
            }
        }
    }

    /// Anything GPU `i` can draw over `seconds`, as a midpoint and half-width (J): up to its
    /// highest power limit (unbounded where the driver does not say it).
    fn drawable(&self, i: usize, seconds: f64) -> (f64, f64) {
        let max_w = self
            .gpus
            .device(i)
            .and_then(|d| d.power_management_limit_constraints())
            .map_or(f64::INFINITY, |(_, max)| f64::from(max) / 1000.0);
        let half = max_w * seconds.max(0.0) / 2.0;
        if half.is_finite() {
            (half, half)
        } else {
            (0.0, f64::INFINITY)
        }
    }

    /// The bound of a counter read directly at both edges: each value is up to an update
    /// period and the counter's lag stale, so the window may miss or gain that much energy at
    /// either edge, at the highest power seen around it.
    fn staleness_bound(&self, k: usize, e: f64, time: f64, w: &OpenWindow, end_w: &[f64]) -> f64 {
        let stale = self.counter_period[k] + DIRECT_LAG_ALLOWANCE_S;
        let mean = if time > 0.0 { e / time } else { 0.0 };
        let p = mean
            .max(w.start_w.get(k).copied().unwrap_or(0.0))
            .max(end_w.get(k).copied().unwrap_or(0.0));
        p * 1.1 * stale + 0.002
    }

    /// Warn once per GPU and process when the sampler left the cached mode for it.
    fn mode_warnings(&self, warnings: &mut Vec<String>) {
        for (k, &i) in self.indices.iter().enumerate() {
            let Some(w) = self.watched(k) else { continue };
            // This runs at every window's end: the reason and its figures are only taken for
            // the one warning.
            if w.with_track(|t| t.mode()) == Mode::Cached || !w.take_mode_warning() {
                continue;
            }
            let (mode, reason, residual, noise) = w.with_track(|t| {
                (
                    t.mode(),
                    t.mode_reason().to_string(),
                    t.residual_ratio(),
                    t.noise(),
                )
            });
            if mode != Mode::Cached {
                let what = match mode {
                    Mode::Direct => "reading its energy counter directly at window edges",
                    _ => "integrating its power readings",
                };
                warnings.push(format!(
                    "GPU {i}: the energy sampler's model does not fit this board: {reason} \
                     (self-check residual {:.1}%, power noise {:.1}%); {what} until it fits \
                     again. This warning is shown once per GPU.",
                    residual * 100.0,
                    noise * 100.0
                ));
            }
        }
    }

    /// Append the window's row to the log: the reference's columns, then each energy's bound.
    fn write_log(&mut self, key: &str, start: f64, m: &Measurement) -> MonitorResult<()> {
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        let line = &mut self.line;
        line.clear();
        line.push_str(&py_float(start));
        line.push(',');
        line.push_str(key);
        line.push(',');
        line.push_str(&py_float(m.time));
        let mut push = |v: f64| {
            line.push(',');
            line.push_str(&py_float(v));
        };
        for (_, e) in &m.energy {
            push(*e);
        }
        let cpu_columns = |values: &Option<Vec<(usize, f64)>>,
                           dram: &Option<Vec<(usize, f64)>>,
                           push: &mut dyn FnMut(f64)| {
            if let (Some(cpu), Some(c), Some(d)) = (&self.cpu, values, dram) {
                let mut dram = d.iter();
                for ((_, e), slot) in c.iter().zip(&cpu.slots) {
                    push(*e);
                    if slot.1.is_some() {
                        push(dram.next().expect("one DRAM entry per DRAM zone").1);
                    }
                }
            }
        };
        cpu_columns(&m.cpu_energy, &m.dram_energy, &mut push);
        for (_, b) in &m.energy_bound {
            push(*b);
        }
        cpu_columns(&m.cpu_bound, &m.dram_bound, &mut push);
        line.push('\n');
        log.write_all(line.as_bytes())?;
        log.flush()?;
        Ok(())
    }

    /// The update period that bounds how short a window can be measured: the slowest counter
    /// among the monitored GPUs.
    /// The slowest counter update period among the monitored GPUs: the sampler's calibrated
    /// one where it has it (the backend may not say: AMD SMI does not, and its boards update
    /// every millisecond or so), else the backend's or the 100 ms default.
    fn slowest_counter_period(&self) -> f64 {
        (0..self.indices.len())
            .map(|k| {
                self.watched(k)
                    .and_then(|w| {
                        // The counter's fitted grid; else, where the backend says the counter
                        // updates with the power readings (AMD), their period once the sampler
                        // has locked on it.
                        let shared = w.gpu().counter_lag().is_some();
                        w.with_track(|t| {
                            let s = t.schedule();
                            if s.fitted {
                                Some(s.grid.period)
                            } else {
                                (shared && t.is_locked()).then(|| t.period())
                            }
                        })
                    })
                    .unwrap_or(self.counter_period[k])
            })
            .fold(0.0, f64::max)
    }

    fn cross_check(
        &self,
        key: &str,
        start: f64,
        end: f64,
        energy: &[(usize, f64)],
        warnings: &mut Vec<String>,
    ) {
        let Some(pm) = &self.check_power else { return };
        if end - start < DISAGREEMENT_MIN_PERIODS * pm.update_period() {
            return;
        }
        let Some(timeline) = pm.get_energy(start, end) else {
            return;
        };
        for (k, (i, counter)) in energy.iter().enumerate() {
            let (true, Some(c)) = (self.has_counter[k], self.check_col[k]) else {
                continue;
            };
            let sampled = timeline[c];
            let diff = (counter - sampled).abs();
            if diff >= DISAGREEMENT_ABS_J
                && diff > DISAGREEMENT_REL * counter.abs().max(sampled.abs())
            {
                warnings.push(format!(
                    "Measurement window '{key}': GPU {i}'s energy counter says {} J but its power \
                     timeline integrates to {} J ({:.0}% apart); one of the two readings is off.",
                    py_float(*counter),
                    py_float(sampled),
                    100.0 * diff / counter.abs().max(sampled.abs())
                ));
            }
        }
    }
}

fn open_log(
    path: &Path,
    indices: &[usize],
    cpu: Option<&CpuPart>,
) -> MonitorResult<BufWriter<File>> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)?;
        }
    }
    let mut w = BufWriter::new(File::create(path)?);
    let mut header = String::from("start_time,window_name,elapsed_time");
    for i in indices {
        header.push_str(&format!(",gpu{i}_energy"));
    }
    // CPU columns only when CPUs are monitored; DRAM only for packages that have it. Then the
    // bound of each (after every column of the reference, so its readers still read the file).
    let cpu_header = |header: &mut String, suffix: &str| {
        if let Some(cpu) = cpu {
            for (i, slot) in cpu.indices.iter().zip(&cpu.slots) {
                header.push_str(&format!(",cpu{i}_energy{suffix}"));
                if slot.1.is_some() {
                    header.push_str(&format!(",dram{i}_energy{suffix}"));
                }
            }
        }
    };
    cpu_header(&mut header, "");
    for i in indices {
        header.push_str(&format!(",gpu{i}_energy_uncertainty"));
    }
    cpu_header(&mut header, "_uncertainty");
    header.push('\n');
    w.write_all(header.as_bytes())?;
    w.flush()?;
    Ok(w)
}

#[cfg(test)]
mod tests;
