//! RAPL zones of the Linux powercap sysfs: discovery, counter reads and wrap-around.
//!
//! A zone's `energy_uj` counts microjoules and wraps to zero at `max_energy_range_uj` (about
//! 262 kJ on many Intel parts: 44 minutes at 100 W). Each [`RaplZone`] keeps a cumulative,
//! unwrapped energy that every read, from any thread, advances by the modular difference to the
//! previous read. That is right as long as no two consecutive reads are a whole range apart,
//! which the shared sampler thread ([`crate::monitor::sampler`]) guarantees for every zone a
//! lease holds by reading it at [`RaplZone::poll_interval`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::error::{CpuError, CpuResult};

/// Longest time between two sampler reads of a zone.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Sampler reads of a zone come at least this many times per counter range at the observed
/// power.
pub const READS_PER_RANGE: f64 = 4.0;
/// Reads closer together than this do not update the power estimate (too noisy).
const MIN_POWER_SPAN: Duration = Duration::from_millis(10);
/// How fast a lower power figure replaces a higher one, seconds.
const POWER_HALF_LIFE: f64 = 10.0;
/// Time constant of the smoothed power ([`Unwrapper::power_w`]), seconds: figures over 10-20 ms
/// spans swing when a counter advances in bursts, and the whole ranges a late read adds come
/// from this figure times the gap, which must be right to half a range.
const POWER_SMOOTHING: f64 = 0.1;
/// Poll interval until the power of a zone is known.
const FIRST_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How much reading time, in spans that gave power figures, a zone is polled at
/// [`FIRST_POLL_INTERVAL`] before its interval follows the power: the interval then starts
/// from the highest figure of that stretch. One figure would do if counters always moved, but
/// a counter that stalls for the first span or two (seen on a loaded machine, where the
/// writer of a simulated counter ran tens of milliseconds late) reads as ~0 W, which would
/// stretch the interval to its limit at once and lose every wrap after it.
const WARM_UP: Duration = Duration::from_millis(500);

/// What a zone measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneKind {
    /// The whole CPU package (`package-N`).
    Package,
    /// The DRAM attached to a package (`dram`).
    Dram,
}

/// The unwrapping state of one counter: raw readings in, cumulative microjoules out.
#[derive(Debug, Clone)]
pub struct Unwrapper {
    range_uj: u64,
    last_raw: Option<u64>,
    total_uj: u128,
    /// The last read that updated the power estimate.
    power_mark: Option<(Instant, u128)>,
    /// The power seen over recent short gaps, smoothed (time constant [`POWER_SMOOTHING`]), W.
    power_w: Option<f64>,
    /// The power the poll interval is set for: the seen power, or more while a higher figure
    /// decays (half-life [`POWER_HALF_LIFE`]), W.
    bound_w: Option<f64>,
    /// Seconds of spans that gave power figures, up to [`WARM_UP`].
    warm_s: f64,
    last_at: Option<Instant>,
    /// How far off the total may be from whole ranges that late reads inferred, µJ (summed:
    /// each inference may be off by what the power's uncertainty over its gap allows).
    uncertain_uj: f64,
}

impl Unwrapper {
    /// A counter that wraps to zero at `range_uj` (its values lie in `0..range_uj`).
    pub fn new(range_uj: u64) -> Unwrapper {
        Unwrapper {
            range_uj,
            last_raw: None,
            total_uj: 0,
            power_mark: None,
            power_w: None,
            bound_w: None,
            warm_s: 0.0,
            last_at: None,
            uncertain_uj: 0.0,
        }
    }

    /// Take a raw reading made at `at`; returns the cumulative energy, µJ. The first reading
    /// starts the total at its own value, so the total is on the counter's scale.
    pub fn observe(&mut self, raw: u64, at: Instant) -> u128 {
        match self.last_raw {
            None => self.total_uj = u128::from(raw),
            Some(last) => {
                self.uncertain_uj += self.late_read_uncertainty(at);
                self.total_uj += u128::from(self.delta(last, raw));
                self.total_uj += u128::from(self.range_uj) * self.hidden_wraps(last, raw, at);
            }
        }
        self.last_raw = Some(raw);
        self.last_at = Some(at);
        // Power only from reads close enough that no wrap can hide between them (at most
        // twice the interval asked for): a longer gap may have lost whole ranges, and a power
        // figure that low would stretch the interval and lose more.
        match self.power_mark {
            Some((t, _)) if at.saturating_duration_since(t) < MIN_POWER_SPAN => {}
            Some((t, e)) => {
                let gap = at.saturating_duration_since(t);
                if gap <= 2 * self.poll_interval() {
                    let dt = gap.as_secs_f64();
                    let seen = (self.total_uj - e) as f64 / 1e6 / dt;
                    // A drop is believed slowly (half-life POWER_HALF_LIFE): a counter that
                    // stalls for a moment must not stretch the interval past a wrap. While
                    // warming up, nothing decays: the bound is the highest figure seen.
                    let warming = self.warming_up();
                    let floor = self.bound_w.map_or(0.0, |p| {
                        if warming {
                            p
                        } else {
                            p * 0.5f64.powf(dt / POWER_HALF_LIFE)
                        }
                    });
                    let a = dt / (dt + POWER_SMOOTHING);
                    self.power_w = Some(self.power_w.map_or(seen, |p| p + a * (seen - p)));
                    self.bound_w = Some(seen.max(floor));
                    self.warm_s += dt;
                }
                self.power_mark = Some((at, self.total_uj));
            }
            None => self.power_mark = Some((at, self.total_uj)),
        }
        self.total_uj
    }

    /// Whole ranges that a late read (over twice the poll interval after the previous one:
    /// the sampler thread was starved) may have skipped: the count that brings the energy
    /// closest to the known power times the gap. Zero for reads on schedule, and whenever the
    /// power is not known yet.
    fn hidden_wraps(&self, last: u64, raw: u64, at: Instant) -> u128 {
        let (Some(p), Some(prev)) = (self.power_w, self.last_at) else {
            return 0;
        };
        let gap = at.saturating_duration_since(prev);
        if gap <= 2 * self.poll_interval() || self.range_uj == 0 {
            return 0;
        }
        let expected = p * gap.as_secs_f64() * 1e6;
        let seen = self.delta(last, raw) as f64;
        ((expected - seen) / self.range_uj as f64).round().max(0.0) as u128
    }

    /// The uncertainty a late read adds: the smoothed power may be off by a third over the
    /// gap, and the count of ranges by that energy (at most a whole range).
    fn late_read_uncertainty(&self, at: Instant) -> f64 {
        let (Some(p), Some(prev)) = (self.power_w, self.last_at) else {
            return 0.0;
        };
        let gap = at.saturating_duration_since(prev);
        if gap <= 2 * self.poll_interval() || self.range_uj == 0 {
            return 0.0;
        }
        (p * gap.as_secs_f64() * 1e6 / 3.0).min(self.range_uj as f64)
    }

    /// How far off the total may be, µJ, from the late reads so far.
    pub fn uncertain_uj(&self) -> f64 {
        self.uncertain_uj
    }

    /// Energy between two raw readings, µJ, assuming less than one range passed between them.
    pub fn delta(&self, from: u64, to: u64) -> u64 {
        if to >= from {
            let d = to - from;
            if self.range_uj > 0 {
                d % self.range_uj
            } else {
                d
            }
        } else if self.range_uj > 0 {
            (self.range_uj - from % self.range_uj) + to % self.range_uj
        } else {
            0
        }
    }

    /// Whether the power figures so far cover less than [`WARM_UP`] of reading time.
    fn warming_up(&self) -> bool {
        self.warm_s < WARM_UP.as_secs_f64()
    }

    /// Cumulative energy so far, µJ (`None` before the first reading).
    pub fn total_uj(&self) -> Option<u128> {
        self.last_raw.map(|_| self.total_uj)
    }

    /// Power over recent stretches between reads at least 10 ms apart, smoothed over about
    /// [`POWER_SMOOTHING`], W.
    pub fn power_w(&self) -> Option<f64> {
        self.power_w
    }

    /// How long the counter may go unread without risking a missed wrap: a quarter of the
    /// time the observed power takes to use up the range, at most [`MAX_POLL_INTERVAL`];
    /// [`FIRST_POLL_INTERVAL`] until the power figures cover [`WARM_UP`].
    pub fn poll_interval(&self) -> Duration {
        let Some(p) = self.bound_w.filter(|_| !self.warming_up()) else {
            return FIRST_POLL_INTERVAL;
        };
        let range_j = self.range_uj as f64 / 1e6;
        let s = range_j / p.max(1e-6) / READS_PER_RANGE;
        Duration::from_secs_f64(s.clamp(0.0005, MAX_POLL_INTERVAL.as_secs_f64()))
    }
}

/// One RAPL zone (a package or its DRAM).
#[derive(Debug)]
pub struct RaplZone {
    kind: ZoneKind,
    package: usize,
    dir: PathBuf,
    energy_path: PathBuf,
    range_uj: u64,
    state: Mutex<Unwrapper>,
}

/// Read a file holding one unsigned integer (what powercap files hold).
pub fn read_u64(path: &Path) -> CpuResult<u64> {
    let text = std::fs::read_to_string(path).map_err(|e| CpuError::from_io(path, &e))?;
    text.trim().parse::<u64>().map_err(|_| {
        CpuError::File(format!(
            "RAPL file {} holds {text:?}, not a whole number of microjoules",
            path.display()
        ))
    })
}

fn read_name(dir: &Path) -> CpuResult<String> {
    let p = dir.join("name");
    std::fs::read_to_string(&p)
        .map(|s| s.trim().to_owned())
        .map_err(|e| CpuError::from_io(&p, &e))
}

impl RaplZone {
    /// Open the zone in `dir`: reads its range and its counter once (so an unreadable counter
    /// fails here, naming the file).
    pub fn open(dir: &Path, kind: ZoneKind, package: usize) -> CpuResult<RaplZone> {
        let range_uj = read_u64(&dir.join("max_energy_range_uj"))?;
        let zone = RaplZone {
            kind,
            package,
            dir: dir.to_path_buf(),
            energy_path: dir.join("energy_uj"),
            range_uj,
            state: Mutex::new(Unwrapper::new(range_uj)),
        };
        zone.energy_j()?;
        Ok(zone)
    }

    pub fn kind(&self) -> ZoneKind {
        self.kind
    }

    /// Index of the package this zone belongs to.
    pub fn package(&self) -> usize {
        self.package
    }

    /// The zone's sysfs directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `energy_uj` file.
    pub fn energy_path(&self) -> &Path {
        &self.energy_path
    }

    /// `max_energy_range_uj`: the counter wraps to zero there.
    pub fn max_energy_range_uj(&self) -> u64 {
        self.range_uj
    }

    fn state(&self) -> MutexGuard<'_, Unwrapper> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The raw counter, µJ (wraps).
    pub fn read_raw_uj(&self) -> CpuResult<u64> {
        read_u64(&self.energy_path)
    }

    /// Read the counter now and return the zone's cumulative, unwrapped energy, J. The read
    /// happens under the zone's lock, so concurrent readers never see time run backwards.
    pub fn energy_j(&self) -> CpuResult<f64> {
        let mut st = self.state();
        let raw = self.read_raw_uj()?;
        Ok(st.observe(raw, Instant::now()) as f64 / 1e6)
    }

    /// [`RaplZone::energy_j`], with how far off the total may be from ranges that late reads
    /// had to infer (J; grows only when the sampler was starved long enough to risk a wrap)
    /// and the power lately seen (W).
    pub fn energy_with_uncertainty(&self) -> CpuResult<(f64, f64, f64)> {
        let mut st = self.state();
        let raw = self.read_raw_uj()?;
        let total = st.observe(raw, Instant::now()) as f64 / 1e6;
        Ok((total, st.uncertain_uj() / 1e6, st.power_w().unwrap_or(0.0)))
    }

    /// The cumulative energy as of the last read by anyone, J, without reading.
    pub fn last_energy_j(&self) -> Option<f64> {
        self.state().total_uj().map(|e| e as f64 / 1e6)
    }

    /// Power between recent reads, W.
    pub fn observed_power_w(&self) -> Option<f64> {
        self.state().power_w()
    }

    /// How often the sampler must read this zone (see [`Unwrapper::poll_interval`]).
    pub fn poll_interval(&self) -> Duration {
        self.state().poll_interval()
    }
}

/// One CPU package: its package zone and, where the platform has one, its DRAM zone.
#[derive(Debug, Clone)]
pub struct CpuPackage {
    pub index: usize,
    pub package: Arc<RaplZone>,
    pub dram: Option<Arc<RaplZone>>,
}

/// A top-level zone name `intel-rapl:N` or `amd-rapl:N`: the prefix and N.
fn top_level(name: &str) -> Option<(&str, u32)> {
    let (prefix, n) = name.split_once(':')?;
    if !matches!(prefix, "intel-rapl" | "amd-rapl") {
        return None;
    }
    n.parse().ok().map(|n| (prefix, n))
}

/// Find the packages under a powercap root, ordered by zone number. Packages are the
/// top-level zones whose `name` is `package-N`; a package's DRAM is its sub-zone
/// `<prefix>:N:M` named `dram` (looked for inside the package's directory, then beside it).
pub fn discover(root: &Path) -> CpuResult<Vec<CpuPackage>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(CpuError::from_io(root, &e))
        }
        Err(_) => {
            return Err(CpuError::NotSupported {
                searched: root.to_path_buf(),
            })
        }
    };
    let mut tops: Vec<(String, u32, PathBuf)> = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some((prefix, n)) = top_level(&name) {
            let dir = e.path();
            if read_name(&dir)?.starts_with("package-") {
                tops.push((prefix.to_owned(), n, dir));
            }
        }
    }
    if tops.is_empty() {
        return Err(CpuError::NotSupported {
            searched: root.to_path_buf(),
        });
    }
    tops.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    let mut out = Vec::with_capacity(tops.len());
    for (index, (prefix, n, dir)) in tops.into_iter().enumerate() {
        let package = Arc::new(RaplZone::open(&dir, ZoneKind::Package, index)?);
        let dram = find_dram(&dir, root, &prefix, n)?
            .map(|d| RaplZone::open(&d, ZoneKind::Dram, index).map(Arc::new))
            .transpose()?;
        out.push(CpuPackage {
            index,
            package,
            dram,
        });
    }
    Ok(out)
}

fn find_dram(pkg_dir: &Path, root: &Path, prefix: &str, n: u32) -> CpuResult<Option<PathBuf>> {
    let sub = format!("{prefix}:{n}:");
    for base in [pkg_dir, root] {
        let Ok(entries) = std::fs::read_dir(base) else {
            continue;
        };
        let mut subs: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&sub))
            .map(|e| e.path())
            .collect();
        subs.sort();
        for d in subs {
            if read_name(&d)? == "dram" {
                return Ok(Some(d));
            }
        }
    }
    Ok(None)
}
