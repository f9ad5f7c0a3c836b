//! What `/metrics` of `zeus-monitor serve` exposes, and how a scrape reads it.
//!
//! An [`Exporter`] is a list of [`Collector`]s; a scrape asks each for its metric families and
//! encodes them in the Prometheus text format 0.0.4 with the `prometheus` crate's encoder. A
//! collector answers from memory: nothing on the scrape path may wait on a slow driver call.
//!
//! [`GpuCollector`] is the one collector today. Per GPU (labels `gpu` = visible index, `uuid`,
//! `model`, `vendor` (`nvidia` or `amd`), `hostname`):
//!
//! | metric | type | from |
//! |---|---|---|
//! | `zeus_gpu_energy_joules_total` | counter | the sampler's cache: `Track::energy_at(now)` |
//! | `zeus_gpu_power_watts{domain}` | gauge | `device_instant` / `device_average`: the sampler's latest tick for the domain it polls, a ~1 µs read for the other |
//! | `zeus_gpu_power_limit_watts` | gauge | refreshed every second in the background |
//! | `zeus_gpu_clock_mhz{clock="graphics"\|"memory"}` | gauge | `nvmlDeviceGetClockInfo`, refreshed every second in the background |
//! | `zeus_gpu_clock_locked{clock="graphics"\|"memory"}` | gauge (1) | the settings journal, refreshed every second |
//! | `zeus_gpu_energy_sampler_mode{mode="cached"\|"direct"\|"power"}` | gauge (1 for the current mode, 0 for the others) | the sampler's self-check: `cached` while its model fits the board |
//! | `zeus_gpu_energy_selfcheck_residual_ratio` | gauge | the self-check's recent residual scale: (counter step - prediction) / step |
//!
//! Through a driver fault the sampler keeps trying: the power gauges drop out while power
//! reads fail (a stale value would read as live), the energy counter is served at the low end
//! of what the GPU may have drawn meanwhile (so it never has to go back), `/healthz` answers
//! 503 naming the failing reads, and all of it is back within an update period of the
//! driver answering again.
//!
//! The energy counter is the driver's (energy since the driver loaded), read by the process's
//! shared sampler thread (`zeus_core::monitor::sampler`): it reads each GPU's 3-6 ms energy
//! counter shortly after a power update and interpolates/extrapolates between those anchors
//! with the power readings. The exporter lowers the sampler's budget for those reads to
//! [`ANCHOR_CPU_SHARE`] of a core, since scrapes come seconds apart. A scrape only looks the value up (a mutex and some arithmetic). A
//! GPU's series appears once the sampler has its first anchor (well under a second after
//! start). Extrapolation past the last anchor can overshoot the next anchor slightly, so the
//! value served never goes below one already served (a counter must not go back).
//!
//! `memory_average` is not read by this build of zeus-core (`monitor::power`), so it is never
//! exposed. Locked clocks: NVML has no getter for the bounds of locked clocks and the journal
//! records only *which* clocks zeus locked (to unlock them later), so the exporter exposes
//! `zeus_gpu_clock_locked` = 1 for clocks a zeus process locked and has not restored, and
//! nothing otherwise (clocks locked by other tools are not knowable).
//!
//! [`CpuCollector`] adds, per RAPL package (labels `cpu` = package index, `domain` =
//! `package`|`dram`, `hostname`), `zeus_cpu_energy_joules_total`: the zone's unwrapped total.
//! The process's sampler reads every zone often enough that no counter wrap is missed; a scrape
//! reads the zone's `energy_uj` once more (a sysfs file read of tens of microseconds, not a
//! driver call of milliseconds) through the same shared total, so the value is as of the
//! scrape. Were it the sampler's last value instead, it could be up to a second old, and a
//! `rate()` over 20 s would be off by up to 5%.
//!
//! ## Adding a source
//!
//! Another source is one more [`Collector`]: `collect` pushes its families (build them with
//! [`counter`], [`gauge`], [`sample`] and label them with [`hostname`]), answers from memory or
//! from reads as cheap as the ones above, reports failures through `health`, and goes into the
//! `collectors` list in `serve::main`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::TextEncoder;
use zeus_core::device::cpu::{Cpus, RaplZone};
use zeus_core::device::settings::{ClockLocks, Journal, Kind, Original, Read};
use zeus_core::device::{Clock, Gpu, Gpus, SystemClock};
use zeus_core::monitor::sampler::{self, Lease, Mode, Sampler, ServedEnergy, ZoneLease};
use zeus_core::monitor::stop::StopSignal;

/// Content type of the text exposition format.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Share of one core the sampler's energy-counter reads may take in the exporter (the library's
/// default is 4%, for windows of a fraction of a second). Prometheus scrapes every few seconds,
/// and between anchors the energy follows the power readings, so a counter read every few
/// seconds per GPU is plenty: with 8 H100s (3.5 ms a read) that is one read per GPU every 5 s.
pub const ANCHOR_CPU_SHARE: f64 = 0.005;

/// How often slow-changing values (power limit, clock locks) are refreshed.
pub const REFRESH_PERIOD: Duration = Duration::from_secs(1);

/// A source of metrics. `collect` runs on every scrape, on the server's thread, concurrently
/// with other scrapes: it must answer from memory and never block on a device.
pub trait Collector: Send + Sync {
    /// Append this source's families (families without samples are dropped by the exporter).
    fn collect(&self, out: &mut Vec<MetricFamily>);
    /// `Err(why)` when the source can no longer answer correctly (`/healthz` then says 503).
    fn health(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The collectors behind `/metrics` and `/healthz`.
pub struct Exporter {
    collectors: Vec<Box<dyn Collector>>,
}

impl Exporter {
    pub fn new(collectors: Vec<Box<dyn Collector>>) -> Exporter {
        Exporter { collectors }
    }

    /// The exposition text of one scrape.
    pub fn render(&self) -> String {
        let mut families = Vec::with_capacity(8);
        for c in &self.collectors {
            c.collect(&mut families);
        }
        // The encoder refuses a family without samples.
        families.retain(|f| !f.get_metric().is_empty());
        let mut out = String::with_capacity(4096);
        if let Err(e) = TextEncoder::new().encode_utf8(&families, &mut out) {
            // Only a family without name or samples fails, and both are ruled out above.
            out.clear();
            out.push_str(&format!("# encoding failed: {e}\n"));
        }
        out
    }

    /// `Ok` when every collector is healthy, else every reason, one per line.
    pub fn health(&self) -> Result<(), String> {
        let why: Vec<String> = self
            .collectors
            .iter()
            .filter_map(|c| c.health().err())
            .collect();
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("\n"))
        }
    }
}

/// An empty family.
pub fn family(name: &str, help: &str, kind: MetricType) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f
}

/// An empty counter family.
pub fn counter(name: &str, help: &str) -> MetricFamily {
    family(name, help, MetricType::COUNTER)
}

/// An empty gauge family.
pub fn gauge(name: &str, help: &str) -> MetricFamily {
    family(name, help, MetricType::GAUGE)
}

/// Add one sample with `labels` (in order) to `f`, as its family's type says.
pub fn sample(f: &mut MetricFamily, labels: &[(&str, &str)], value: f64) {
    let pairs = labels
        .iter()
        .map(|(k, v)| {
            let mut p = LabelPair::default();
            p.set_name(k.to_string());
            p.set_value(v.to_string());
            p
        })
        .collect();
    let mut m = Metric::from_label(pairs);
    if f.get_field_type() == MetricType::COUNTER {
        let mut c = Counter::default();
        c.set_value(value);
        m.set_counter(c);
    } else {
        let mut g = Gauge::default();
        g.set_value(value);
        m.set_gauge(g);
    }
    f.mut_metric().push(m);
}

/// This machine's host name (the `hostname` label), `unknown` if it cannot be read.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: a valid buffer and its length; the result is NUL-terminated on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the background refresh knows about one GPU.
#[derive(Debug, Clone, Copy, Default)]
struct Slow {
    power_limit_w: Option<f64>,
    /// Current graphics and memory clocks, MHz.
    clocks_mhz: Option<(u32, u32)>,
    locks: ClockLocks,
}

/// One exported GPU.
struct Exported {
    index: String,
    uuid: String,
    model: String,
    vendor: &'static str,
    gpu: Arc<dyn Gpu>,
    /// Whether the sampler polls instant power (else average power) for this GPU.
    polls_instant: bool,
    has_average: bool,
    slow: Mutex<Slow>,
    served: ServedEnergy,
}

impl Exported {
    fn refresh(&self, journal: &Journal) {
        let power_limit_w = self
            .gpu
            .power_management_limit()
            .ok()
            .map(|mw| f64::from(mw) / 1000.0);
        let locks = match journal.read(Kind::Clocks, &self.uuid) {
            Ok(Read::Entry(e)) => match e.original {
                Original::Unlock(l) => l,
                Original::PowerLimit(_) => ClockLocks::default(),
            },
            _ => ClockLocks::default(),
        };
        *lock(&self.slow) = Slow {
            power_limit_w,
            clocks_mhz: self.gpu.current_clocks_mhz().ok(),
            locks,
        };
    }
}

/// Per-GPU energy, power, power limit and clock locks, read through the shared sampler.
pub struct GpuCollector {
    lease: Lease,
    gpus: Arc<Vec<Exported>>,
    hostname: String,
    stop: Arc<StopSignal>,
    refresher: Option<JoinHandle<()>>,
}

impl GpuCollector {
    /// Export the visible GPUs `indices` of `gpus`: leases them from the process's sampler and
    /// starts the background refresh of slow-changing values.
    pub fn new(gpus: &Gpus, indices: &[usize]) -> Result<GpuCollector, String> {
        let mut exported = Vec::with_capacity(indices.len());
        let mut devices = Vec::with_capacity(indices.len());
        for &i in indices {
            let gpu = gpus.device(i).map_err(|e| format!("GPU {i}: {e}"))?.clone();
            let model = gpu.name().map_err(|e| format!("GPU {i}: name: {e}"))?;
            let uuid = gpu.uuid().map_err(|e| format!("GPU {i}: UUID: {e}"))?;
            let polls_instant = gpu.instant_power_usage().is_ok();
            let has_average = gpu.average_power_usage().is_ok();
            devices.push(gpu.clone());
            exported.push(Exported {
                index: i.to_string(),
                uuid,
                model,
                vendor: gpu.vendor().name(),
                gpu,
                polls_instant,
                has_average,
                slow: Mutex::new(Slow::default()),
                served: ServedEnergy::new(),
            });
        }
        let journal = Journal::default_location();
        for g in &exported {
            g.refresh(&journal);
        }
        sampler::set_anchor_cpu_share(ANCHOR_CPU_SHARE);
        let lease = Sampler::lease(&devices).map_err(|e| format!("starting the sampler: {e}"))?;
        let gpus = Arc::new(exported);
        let stop = Arc::new(StopSignal::new());
        let refresher = {
            let (gpus, stop) = (gpus.clone(), stop.clone());
            std::thread::Builder::new()
                .name("zeus-refresh".into())
                .spawn(move || {
                    while !stop.sleep_until(Instant::now() + REFRESH_PERIOD) {
                        for g in gpus.iter() {
                            g.refresh(&journal);
                        }
                    }
                })
                .map_err(|e| format!("starting the refresh thread: {e}"))?
        };
        Ok(GpuCollector {
            lease,
            gpus,
            hostname: hostname(),
            stop,
            refresher: Some(refresher),
        })
    }
}

impl Drop for GpuCollector {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(h) = self.refresher.take() {
            let _ = h.join();
        }
    }
}

impl Collector for GpuCollector {
    fn collect(&self, out: &mut Vec<MetricFamily>) {
        let mut energy = counter(
            "zeus_gpu_energy_joules_total",
            "Energy the GPU used since its driver loaded, joules (zeus sampler's cache).",
        );
        let mut power = gauge(
            "zeus_gpu_power_watts",
            "GPU power, watts: device_instant is the latest instant reading, device_average \
             the driver's trailing average.",
        );
        let mut limit = gauge(
            "zeus_gpu_power_limit_watts",
            "GPU power management limit, watts.",
        );
        let mut clocks = gauge(
            "zeus_gpu_clock_mhz",
            "Current GPU clock, MHz: graphics (SM) or memory.",
        );
        let mut locked = gauge(
            "zeus_gpu_clock_locked",
            "1 where a zeus process locked this GPU clock and has not restored it.",
        );
        let mut modes = gauge(
            "zeus_gpu_energy_sampler_mode",
            "1 for how the energy sampler reads this GPU now: cached (its model fits the board), \
             direct (counter read at window edges) or power (power readings integrated).",
        );
        let mut residuals = gauge(
            "zeus_gpu_energy_selfcheck_residual_ratio",
            "The energy sampler's self-check: recent scale of (counter step - prediction) / step.",
        );
        let now = SystemClock.now();
        let current = self.lease.is_current();
        for (k, g) in self.gpus.iter().enumerate() {
            let base = [
                ("gpu", g.index.as_str()),
                ("uuid", g.uuid.as_str()),
                ("model", g.model.as_str()),
                ("vendor", g.vendor),
                ("hostname", self.hostname.as_str()),
            ];
            let watched = self.lease.watched(k);
            let (edge, latest_w, mode, residual, power_down) = if current {
                watched.with_track(|t| {
                    (
                        t.edge(now),
                        t.ticks().back().map(|k| k.watts),
                        Some(t.mode()),
                        t.residual_ratio(),
                        t.power_down_since().is_some(),
                    )
                })
            } else {
                (None, None, None, 0.0, false)
            };
            if let Some(e) = edge {
                sample(&mut energy, &base, g.served.serve(&e));
            }
            let with_mode = |m: &'static str| {
                let mut l = base.to_vec();
                l.push(("mode", m));
                l
            };
            if let Some(mode) = mode {
                for m in [Mode::Cached, Mode::Direct, Mode::Power] {
                    let on = if m == mode { 1.0 } else { 0.0 };
                    sample(&mut modes, &with_mode(m.name()), on);
                }
                sample(&mut residuals, &base, residual);
            }
            let with = |extra: (&'static str, &'static str)| {
                let mut l = base.to_vec();
                l.push(extra);
                l
            };
            // The domain the sampler polls comes from its latest tick (a direct read until
            // the first one); the other costs one cheap power read.
            let read = |instant: bool| {
                let r = if instant {
                    g.gpu.instant_power_usage()
                } else {
                    g.gpu.average_power_usage()
                };
                r.ok().map(|mw| f64::from(mw) / 1000.0)
            };
            if power_down {
                // Power reads are failing: no power series rather than a stale one.
            } else if g.polls_instant {
                if let Some(w) = latest_w.or_else(|| read(true)) {
                    sample(&mut power, &with(("domain", "device_instant")), w);
                }
                if g.has_average {
                    if let Some(w) = read(false) {
                        sample(&mut power, &with(("domain", "device_average")), w);
                    }
                }
            } else if g.has_average {
                if let Some(w) = latest_w.or_else(|| read(false)) {
                    sample(&mut power, &with(("domain", "device_average")), w);
                }
            }
            let slow = *lock(&g.slow);
            if let Some(w) = slow.power_limit_w {
                sample(&mut limit, &base, w);
            }
            if let Some((graphics, memory)) = slow.clocks_mhz {
                for (mhz, clock) in [(graphics, "graphics"), (memory, "memory")] {
                    sample(&mut clocks, &with(("clock", clock)), f64::from(mhz));
                }
            }
            for (on, clock) in [(slow.locks.gpu, "graphics"), (slow.locks.memory, "memory")] {
                if on {
                    sample(&mut locked, &with(("clock", clock)), 1.0);
                }
            }
        }
        out.extend([energy, power, limit, clocks, locked, modes, residuals]);
    }

    fn health(&self) -> Result<(), String> {
        if !self.lease.is_current() || !self.lease.sampler_running() {
            return Err("the energy sampler thread is not running".into());
        }
        let why: Vec<String> = (0..self.lease.len())
            .filter_map(|k| {
                self.lease
                    .watched(k)
                    .error()
                    .map(|e| format!("GPU {}: {e}", self.gpus[k].index))
            })
            .collect();
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("\n"))
        }
    }
}

/// One exported RAPL zone: its package index, domain label and the zone.
struct ExportedZone {
    cpu: String,
    domain: &'static str,
    zone: Arc<RaplZone>,
}

/// Per-package CPU and DRAM energy from RAPL, kept wrap-free by the shared sampler.
pub struct CpuCollector {
    lease: ZoneLease,
    zones: Vec<ExportedZone>,
    hostname: String,
}

impl CpuCollector {
    /// Export the packages `indices` of `cpus` (with their DRAM zones where they have one):
    /// leases their zones from the process's sampler, which keeps their totals across wraps.
    pub fn new(cpus: &Cpus, indices: &[usize]) -> Result<CpuCollector, String> {
        let mut zones = Vec::with_capacity(2 * indices.len());
        for &i in indices {
            let p = cpus.package(i).map_err(|e| e.to_string())?;
            let cpu = p.index.to_string();
            zones.push(ExportedZone {
                cpu: cpu.clone(),
                domain: "package",
                zone: p.package.clone(),
            });
            if let Some(d) = &p.dram {
                zones.push(ExportedZone {
                    cpu,
                    domain: "dram",
                    zone: d.clone(),
                });
            }
        }
        let leased: Vec<Arc<RaplZone>> = zones.iter().map(|z| z.zone.clone()).collect();
        let lease = Sampler::lease_zones(&leased)
            .map_err(|e| format!("starting the sampler for RAPL: {e}"))?;
        Ok(CpuCollector {
            lease,
            zones,
            hostname: hostname(),
        })
    }

    /// Number of exported zones (packages plus DRAM sub-zones).
    pub fn zone_count(&self) -> usize {
        self.zones.len()
    }
}

impl Collector for CpuCollector {
    fn collect(&self, out: &mut Vec<MetricFamily>) {
        let mut energy = counter(
            "zeus_cpu_energy_joules_total",
            "Energy of the CPU package or its DRAM (RAPL counter), joules, with the counter's \
             wraps added since the exporter started.",
        );
        for z in &self.zones {
            // A failed read leaves the sampler's last total, which is still right, only older.
            let joules = z.zone.energy_j().ok().or_else(|| z.zone.last_energy_j());
            if let Some(j) = joules {
                let labels = [
                    ("cpu", z.cpu.as_str()),
                    ("domain", z.domain),
                    ("hostname", self.hostname.as_str()),
                ];
                sample(&mut energy, &labels, j);
            }
        }
        out.push(energy);
    }

    fn health(&self) -> Result<(), String> {
        if !self.lease.is_current() || !self.lease.sampler_running() {
            return Err("the RAPL sampler thread is not running".into());
        }
        let why: Vec<String> = self
            .lease
            .zones()
            .iter()
            .zip(&self.zones)
            .filter_map(|(w, z)| {
                w.error()
                    .map(|e| format!("CPU {} {}: reading failed: {e}", z.cpu, z.domain))
            })
            .collect();
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("\n"))
        }
    }
}
