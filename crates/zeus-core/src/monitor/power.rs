//! [`PowerMonitor`]: a std thread that samples the power of chosen GPUs at a fixed period into a
//! bounded [`Timeline`] per power domain, and [`infer_counter_update_period`], which finds how
//! often the driver refreshes its power reading.
//!
//! Domains ([`PowerDomain`], Zeus 0.16's names): `device_instant` (NVML's instant power field)
//! and `device_average` (`nvmlDeviceGetPowerUsage`, a trailing one-second average on Ampere and
//! newer except the GA100). The default is `device_instant` where every GPU has it: on an H100,
//! energy integrated from the average over a window aligned with a 4 s load step came out 10.9%
//! low (the average lags the step by its window), against 0.6% with idle margins; the instant
//! reading does not lag. `memory_average` (Hopper's memory power) is not read by this build.
//!
//! The thread sleeps on a condition variable until its next tick (no busy polling), and
//! [`PowerMonitor::stop`] wakes it at once. On a virtual clock a thread sleeping in real time
//! would never see time move, so there the monitor is manual by default: whoever moves the clock
//! calls [`PowerMonitor::sample_now`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::{MonitorError, MonitorResult};
use super::stop::StopSignal;
use super::timeline::Timeline;
use crate::device::{GpuError, GpuResult, Gpus};

/// The longest sampling period chosen automatically, seconds.
pub const MAX_AUTO_PERIOD: f64 = 0.1;
/// Shortest period accepted, seconds (a tighter loop is busy polling in all but name).
pub const MIN_PERIOD: f64 = 1e-4;
/// How long period detection may sample one GPU model.
const DETECT_BUDGET: Duration = Duration::from_millis(600);
/// Value changes to observe before trusting the detected period.
const DETECT_CHANGES: usize = 8;
/// Default timeline length in time: one hour of samples, at most [`MAX_DEFAULT_SAMPLES`].
const DEFAULT_SPAN_S: f64 = 3600.0;
const MAX_DEFAULT_SAMPLES: usize = 1 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Readers and the sampler only push/read plain numbers; a panic elsewhere cannot leave the
    // data half-written in a harmful way.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Detect how often the power reading of GPU `index` changes, by reading it back to back and
/// taking the median interval between changes. Uses the backend's own figure when it has one
/// (the simulator; a virtual clock cannot be sampled in real time anyway).
///
/// `Ok(None)` when the reading did not change often enough within the time budget (an idle
/// board can hold a value for long), so the caller can fall back to a default.
pub fn detect_update_period(gpus: &Gpus, index: usize) -> GpuResult<Option<f64>> {
    let dev = gpus.device(index)?;
    if let Some(p) = dev.power_update_period() {
        return Ok(Some(p));
    }
    if gpus.clock().is_virtual() {
        return Ok(None);
    }
    // Instant power where the board has it (it changes at every update, as the average does
    // not always), else the average.
    let read = |d: &dyn crate::device::Gpu| {
        crate::device::power_mw(d, crate::device::PowerPreference::Instant)
    };
    let begin = Instant::now();
    let mut last = read(dev.as_ref())?;
    let mut changes: Vec<Instant> = Vec::with_capacity(DETECT_CHANGES);
    while changes.len() < DETECT_CHANGES && begin.elapsed() < DETECT_BUDGET {
        let v = read(dev.as_ref())?;
        if v != last {
            changes.push(Instant::now());
            last = v;
        }
    }
    // The first change happens at an unknown phase; only intervals between changes count. The
    // median, not the minimum: a poll delayed by the scheduler makes one interval long and the
    // next one short, and the minimum would pick the short one.
    let mut gaps: Vec<f64> = changes
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    if gaps.is_empty() {
        return Ok(None);
    }
    gaps.sort_by(f64::total_cmp);
    Ok(Some(gaps[gaps.len() / 2]))
}

/// The sampling period the reference intends for `indices`: half the shortest counter update
/// period among the GPU models (each model sampled once), capped at [`MAX_AUTO_PERIOD`].
///
/// This fixes the reference's bug (`docs/reference-differences.md`, bug 1), where the running minimum started at 0 and
/// the result was always 0, i.e. busy polling. When no period can be detected the cap is used.
pub fn infer_counter_update_period(gpus: &Gpus, indices: &[usize]) -> GpuResult<f64> {
    let mut by_model: HashMap<String, Option<f64>> = HashMap::new();
    for &i in indices {
        let name = gpus.device(i)?.name()?;
        if let std::collections::hash_map::Entry::Vacant(slot) = by_model.entry(name) {
            slot.insert(detect_update_period(gpus, i)?);
        }
    }
    let shortest = by_model
        .values()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    if !shortest.is_finite() {
        return Ok(MAX_AUTO_PERIOD);
    }
    Ok((shortest / 2.0).clamp(MIN_PERIOD, MAX_AUTO_PERIOD))
}

/// A power reading of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PowerDomain {
    DeviceInstant,
    DeviceAverage,
    MemoryAverage,
}

impl PowerDomain {
    pub const ALL: [PowerDomain; 3] = [
        PowerDomain::DeviceInstant,
        PowerDomain::DeviceAverage,
        PowerDomain::MemoryAverage,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PowerDomain::DeviceInstant => "device_instant",
            PowerDomain::DeviceAverage => "device_average",
            PowerDomain::MemoryAverage => "memory_average",
        }
    }

    pub fn parse(s: &str) -> MonitorResult<PowerDomain> {
        PowerDomain::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                MonitorError::InvalidArg(format!(
                    "unknown power domain {s:?}: use one of device_instant, device_average, \
                     memory_average"
                ))
            })
    }

    fn read(self, gpus: &Gpus, index: usize) -> GpuResult<u32> {
        let dev = gpus.device(index)?;
        match self {
            PowerDomain::DeviceInstant => dev.instant_power_usage(),
            PowerDomain::DeviceAverage => dev.average_power_usage(),
            PowerDomain::MemoryAverage => Err(GpuError::NotSupported(
                "memory_average: this build does not read Hopper's memory power scope".into(),
            )),
        }
    }
}

/// The domains to sample: the ones asked for, each checked on every GPU, or by default
/// `device_instant` where every GPU has it and `device_average` otherwise.
fn resolve_domains(
    gpus: &Gpus,
    indices: &[usize],
    asked: Option<&[PowerDomain]>,
) -> MonitorResult<Vec<PowerDomain>> {
    let supported = |d: PowerDomain| -> MonitorResult<Option<usize>> {
        for &i in indices {
            match d.read(gpus, i) {
                Ok(_) => {}
                Err(GpuError::NotSupported(_)) => return Ok(Some(i)),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    };
    let Some(asked) = asked else {
        return Ok(match supported(PowerDomain::DeviceInstant)? {
            None => vec![PowerDomain::DeviceInstant],
            Some(_) => vec![PowerDomain::DeviceAverage],
        });
    };
    if asked.is_empty() {
        return Err(MonitorError::InvalidArg(
            "power_domains must not be empty (None picks the default)".into(),
        ));
    }
    let mut out: Vec<PowerDomain> = Vec::new();
    for &d in asked {
        if out.contains(&d) {
            continue;
        }
        if let Some(i) = supported(d)? {
            return Err(MonitorError::InvalidArg(format!(
                "power domain {} is not supported on GPU {i} ({})",
                d.name(),
                gpus.device(i)?.name()?
            )));
        }
        out.push(d);
    }
    Ok(out)
}

/// Construction options of a [`PowerMonitor`].
#[derive(Debug, Clone, Default)]
pub struct PowerMonitorOptions {
    /// Sampling period in seconds; `None` infers it ([`infer_counter_update_period`]).
    pub update_period: Option<f64>,
    /// Timeline length in samples; `None` keeps an hour's worth (at most 2^20 samples).
    pub max_samples: Option<usize>,
    /// Run the sampling thread. `None` means yes on the real clock, no on a virtual clock.
    pub background: Option<bool>,
    /// Power domains to sample; `None` picks the default (see the module docs). The first is
    /// the primary domain, used when a query names none.
    pub domains: Option<Vec<PowerDomain>>,
}

struct Shared {
    gpus: Gpus,
    indices: Vec<usize>,
    period: f64,
    domains: Vec<PowerDomain>,
    /// One timeline per domain, in `domains` order, all sampled at the same instants.
    timelines: Mutex<Vec<Timeline>>,
    stop: StopSignal,
    /// The error of the latest sample while samples fail, and since when (cleared by the next
    /// sample that works): sampling goes on through faults, leaving a gap in the timeline.
    error: Mutex<Option<(GpuError, f64)>>,
    /// Per monitored GPU: the highest power it can draw (its maximum power limit, W), for the
    /// bound over a gap.
    max_w: Vec<f64>,
}

impl Shared {
    /// Read every GPU and append one sample stamped with the backend clock. The timeline lock
    /// is held across the reads so that concurrent samplers append in time order.
    fn sample(&self, buf: &mut Vec<u32>) -> GpuResult<bool> {
        let mut tls = lock(&self.timelines);
        let t = self.gpus.now();
        if tls[0].last_time().is_some_and(|last| t <= last) {
            return Ok(false);
        }
        let mut pushed = false;
        for (d, tl) in self.domains.iter().zip(tls.iter_mut()) {
            buf.clear();
            for &i in &self.indices {
                buf.push(d.read(&self.gpus, i)?);
            }
            pushed = tl.push(t, buf);
        }
        Ok(pushed)
    }

    fn run(self: Arc<Self>) {
        let period = Duration::from_secs_f64(self.period);
        let mut buf = Vec::with_capacity(self.indices.len());
        let mut next = Instant::now();
        loop {
            match self.sample(&mut buf) {
                Ok(_) => *lock(&self.error) = None,
                Err(e) => {
                    let mut err = lock(&self.error);
                    let since = err.as_ref().map_or_else(|| self.gpus.now(), |(_, s)| *s);
                    *err = Some((e, since));
                }
            }
            // Ticks stay on a fixed grid; ticks missed while we were slow are skipped rather
            // than made up in a burst.
            next += period;
            let now = Instant::now();
            if next <= now {
                let behind = (now - next).as_secs_f64() / self.period;
                next += period.mul_f64(behind.floor() + 1.0);
            }
            while Instant::now() < next {
                if self.stop.sleep_until(next) {
                    return;
                }
            }
            if self.stop.is_stopped() {
                return;
            }
        }
    }
}

/// Samples power of some GPUs into a bounded timeline. Dropping it stops the thread.
pub struct PowerMonitor {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for PowerMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerMonitor")
            .field("gpu_indices", &self.shared.indices)
            .field("update_period", &self.shared.period)
            .field("running", &self.is_running())
            .finish()
    }
}

impl PowerMonitor {
    /// Start monitoring `indices` (visible indices; `None` = all GPUs).
    pub fn new(
        gpus: Gpus,
        indices: Option<Vec<usize>>,
        options: PowerMonitorOptions,
    ) -> MonitorResult<PowerMonitor> {
        let indices = match indices {
            None => (0..gpus.len()).collect(),
            Some(v) => v,
        };
        check_indices(&gpus, &indices)?;
        let period = match options.update_period {
            Some(p) if p.is_finite() && p >= MIN_PERIOD => p,
            Some(p) => {
                return Err(MonitorError::InvalidArg(format!(
                    "update_period must be at least {MIN_PERIOD} s, got {p}"
                )))
            }
            None => infer_counter_update_period(&gpus, &indices)?,
        };
        let capacity = match options.max_samples {
            Some(0) => {
                return Err(MonitorError::InvalidArg(
                    "max_samples must be at least 1, got 0".into(),
                ))
            }
            Some(n) => n,
            None => ((DEFAULT_SPAN_S / period).ceil() as usize).clamp(2, MAX_DEFAULT_SAMPLES),
        };
        let background = options
            .background
            .unwrap_or_else(|| !gpus.clock().is_virtual());
        let domains = resolve_domains(&gpus, &indices, options.domains.as_deref())?;
        let max_w = indices
            .iter()
            .map(|&i| {
                gpus.device(i)
                    .and_then(|d| d.power_management_limit_constraints())
                    .map_or(0.0, |(_, max)| f64::from(max) / 1000.0)
            })
            .collect();
        let shared = Arc::new(Shared {
            timelines: Mutex::new(
                domains
                    .iter()
                    .map(|_| Timeline::new(indices.len(), capacity))
                    .collect(),
            ),
            domains,
            gpus,
            indices,
            period,
            stop: StopSignal::new(),
            error: Mutex::new(None),
            max_w,
        });
        let thread = if background {
            let s = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("zeus-power-monitor".into())
                    .spawn(move || s.run())
                    .map_err(MonitorError::Io)?,
            )
        } else {
            None
        };
        Ok(PowerMonitor {
            shared,
            thread: Mutex::new(thread),
        })
    }

    pub fn gpu_indices(&self) -> &[usize] {
        &self.shared.indices
    }

    /// Sampling period, seconds.
    pub fn update_period(&self) -> f64 {
        self.shared.period
    }

    pub fn gpus(&self) -> &Gpus {
        &self.shared.gpus
    }

    /// Whether the sampling thread is alive.
    pub fn is_running(&self) -> bool {
        lock(&self.thread)
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// Take one sample now (on any clock). `Ok(false)` if the clock has not moved since the last
    /// sample, in which case nothing is added.
    pub fn sample_now(&self) -> GpuResult<bool> {
        let mut buf = Vec::with_capacity(self.shared.indices.len());
        self.shared.sample(&mut buf)
    }

    /// Stop the sampling thread (idempotent); samples taken so far stay readable.
    pub fn stop(&self) {
        self.shared.stop.stop();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
    }

    /// The error the latest samples failed with and since when, while they fail (sampling
    /// goes on; the timeline has a gap, which [`PowerMonitor::get_energy_bound`] counts).
    pub fn error(&self) -> Option<(GpuError, f64)> {
        lock(&self.shared.error).clone()
    }

    /// The ~95% bound (J) per monitored GPU of [`PowerMonitor::get_energy`] (see
    /// [`Timeline::energy_bound`]).
    pub fn get_energy_bound(&self, start: f64, end: f64) -> Option<Vec<f64>> {
        self.get_energy_bound_in(None, start, end).ok().flatten()
    }

    /// [`PowerMonitor::get_energy_bound`] in `domain` (`None`: the primary one). The readings
    /// lag by the driver's update period, and a trailing average by half its window (1 s on
    /// Ampere and newer boards other than the GA100, NVML says).
    pub fn get_energy_bound_in(
        &self,
        domain: Option<PowerDomain>,
        start: f64,
        end: f64,
    ) -> MonitorResult<Option<Vec<f64>>> {
        let k = self.domain_slot(domain)?;
        let d = self.shared.domains[k];
        let update = self
            .shared
            .indices
            .iter()
            .filter_map(|&i| self.shared.gpus.device(i).ok()?.power_update_period())
            .fold(0.1f64, f64::max);
        let lag = match d {
            PowerDomain::DeviceAverage => update.max(0.5),
            _ => update,
        };
        let period = self.shared.period.max(update);
        Ok(lock(&self.shared.timelines)[k].energy_bound(
            start,
            end,
            period,
            lag,
            &self.shared.max_w,
        ))
    }

    /// The sampled domains; the first is the primary one.
    pub fn domains(&self) -> &[PowerDomain] {
        &self.shared.domains
    }

    fn domain_slot(&self, domain: Option<PowerDomain>) -> MonitorResult<usize> {
        let Some(d) = domain else { return Ok(0) };
        self.shared
            .domains
            .iter()
            .position(|x| *x == d)
            .ok_or_else(|| {
                MonitorError::InvalidArg(format!(
                    "power domain {} is not monitored (monitored: {})",
                    d.name(),
                    self.shared
                        .domains
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// Energy (J) per monitored GPU over `[start, end]` in the primary domain, in
    /// `gpu_indices` order (see [`Timeline::energy`]).
    pub fn get_energy(&self, start: f64, end: f64) -> Option<Vec<f64>> {
        lock(&self.shared.timelines)[0].energy(start, end)
    }

    /// [`PowerMonitor::get_energy`] in `domain` (`None`: the primary one).
    pub fn get_energy_in(
        &self,
        domain: Option<PowerDomain>,
        start: f64,
        end: f64,
    ) -> MonitorResult<Option<Vec<f64>>> {
        let k = self.domain_slot(domain)?;
        Ok(lock(&self.shared.timelines)[k].energy(start, end))
    }

    /// Power (W) per monitored GPU at `time` in the primary domain (see [`Timeline::power`]).
    pub fn get_power(&self, time: Option<f64>) -> Option<Vec<f64>> {
        lock(&self.shared.timelines)[0].power(time)
    }

    /// [`PowerMonitor::get_power`] in `domain` (`None`: the primary one).
    pub fn get_power_in(
        &self,
        domain: Option<PowerDomain>,
        time: Option<f64>,
    ) -> MonitorResult<Option<Vec<f64>>> {
        let k = self.domain_slot(domain)?;
        Ok(lock(&self.shared.timelines)[k].power(time))
    }

    /// Number of samples held.
    pub fn num_samples(&self) -> usize {
        lock(&self.shared.timelines)[0].len()
    }

    /// Run `f` on the primary domain's timeline (under its lock).
    pub fn with_timeline<R>(&self, f: impl FnOnce(&Timeline) -> R) -> R {
        f(&lock(&self.shared.timelines)[0])
    }

    /// Run `f` on `domain`'s timeline (under its lock).
    pub fn with_timeline_in<R>(
        &self,
        domain: Option<PowerDomain>,
        f: impl FnOnce(&Timeline) -> R,
    ) -> MonitorResult<R> {
        let k = self.domain_slot(domain)?;
        Ok(f(&lock(&self.shared.timelines)[k]))
    }
}

impl Drop for PowerMonitor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Check visible indices: non-empty, in range, no repeats.
pub fn check_indices(gpus: &Gpus, indices: &[usize]) -> MonitorResult<()> {
    if indices.is_empty() {
        return Err(MonitorError::InvalidArg(
            "gpu_indices must not be empty".into(),
        ));
    }
    for (k, &i) in indices.iter().enumerate() {
        if i >= gpus.len() {
            return Err(MonitorError::InvalidArg(format!(
                "GPU index {i} is out of range: {} GPU(s) are visible",
                gpus.len()
            )));
        }
        if indices[..k].contains(&i) {
            return Err(MonitorError::InvalidArg(format!(
                "GPU index {i} appears twice in gpu_indices {indices:?}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::device::sim::{preset, Load, SimCluster, SimConfig};
    use crate::device::Clock;

    pub(crate) fn sim(keys: &[&str], virtual_clock: bool) -> (Arc<SimCluster>, Gpus) {
        sim_with(keys, virtual_clock, crate::device::sim::Fidelity::Ideal)
    }

    /// [`sim`] at `fidelity` (`Real`: the calibrated boards, read through the sampler).
    pub(crate) fn sim_with(
        keys: &[&str],
        virtual_clock: bool,
        fidelity: crate::device::sim::Fidelity,
    ) -> (Arc<SimCluster>, Gpus) {
        let c = Arc::new(SimCluster::new(SimConfig {
            presets: keys.iter().map(|k| preset::find(k).unwrap()).collect(),
            virtual_clock,
            privileged: true,
            workload: None,
            fidelity,
            load: Load::Idle,
            ..SimConfig::default()
        }));
        let gpus = c.gpus();
        (c, gpus)
    }

    #[test]
    fn inferred_period_is_half_the_update_period_capped() {
        let (_c, gpus) = sim(&["P100", "A40"], true);
        let p100 = gpus.device(0).unwrap().power_update_period().unwrap();
        let a40 = gpus.device(1).unwrap().power_update_period().unwrap();
        let want = (p100.min(a40) / 2.0).min(MAX_AUTO_PERIOD);
        assert!(want > 0.0);
        assert_eq!(infer_counter_update_period(&gpus, &[0, 1]).unwrap(), want);
    }

    #[test]
    fn manual_on_virtual_clock_and_integrates_true_energy() {
        let (c, gpus) = sim(&["P100"], true);
        let pm = PowerMonitor::new(gpus, None, PowerMonitorOptions::default()).unwrap();
        assert!(!pm.is_running());
        let dev = &c.devices()[0];
        let t0 = c.clock().now();
        let e0 = dev.true_energy_j();
        assert!(pm.sample_now().unwrap());
        assert!(!pm.sample_now().unwrap(), "clock did not move");
        dev.set_load(Load::Busy);
        for _ in 0..400 {
            c.clock().advance(0.005);
            pm.sample_now().unwrap();
        }
        let t1 = c.clock().now();
        let got = pm.get_energy(t0, t1).unwrap()[0];
        let want = dev.true_energy_j() - e0;
        assert!((got - want).abs() / want < 0.02, "{got} vs {want}");
        assert_eq!(pm.num_samples(), 401);
    }

    #[test]
    fn background_thread_samples_on_real_clock_and_stops_promptly() {
        let (_c, gpus) = sim(&["A40", "V100"], false);
        let pm = PowerMonitor::new(
            gpus,
            Some(vec![1, 0]),
            PowerMonitorOptions {
                update_period: Some(0.002),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(pm.is_running());
        // Timing here is loose on purpose (a loaded CI machine may starve the thread for a
        // while); that a stop wakes a sleep at once is `monitor::stop`'s test.
        let deadline = Instant::now() + Duration::from_secs(10);
        while pm.num_samples() < 5 {
            assert!(
                Instant::now() < deadline,
                "{} samples in 10 s at 2 ms",
                pm.num_samples()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let begin = Instant::now();
        pm.stop();
        assert!(
            begin.elapsed() < Duration::from_secs(5),
            "stop returns once the thread is woken and joined"
        );
        assert!(!pm.is_running());
        let after = pm.num_samples();
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(pm.num_samples(), after);
        let p = pm.get_power(None).unwrap();
        assert_eq!(p.len(), 2);
        assert!(p.iter().all(|w| *w > 10.0), "{p:?}");
    }

    #[test]
    fn bad_arguments_name_the_value() {
        let (_c, gpus) = sim(&["A40"], true);
        let err = |idx: Option<Vec<usize>>, period: Option<f64>| {
            PowerMonitor::new(
                gpus.clone(),
                idx,
                PowerMonitorOptions {
                    update_period: period,
                    ..Default::default()
                },
            )
            .unwrap_err()
            .to_string()
        };
        assert!(err(Some(vec![]), None).contains("empty"));
        assert!(err(Some(vec![3]), None).contains("GPU index 3"));
        assert!(err(Some(vec![0, 0]), None).contains("twice"));
        assert!(err(None, Some(0.0)).contains("got 0"));
        assert!(err(None, Some(f64::NAN)).contains("NaN"));
    }
}
