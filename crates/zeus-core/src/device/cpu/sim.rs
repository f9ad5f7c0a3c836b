//! Simulated CPUs: a powercap-shaped tree on disk whose counters a writer thread advances
//! about every millisecond from a power model, so that the real RAPL reader
//! ([`super::rapl`]) runs end to end against it.
//!
//! Opt in with `ZEUS_SIM_CPUS=N` (never substituted for missing RAPL). Each simulated package
//! has a DRAM sub-zone. The tree lives in `ZEUS_SIM_RAPL_DIR` if set, else in a temporary
//! directory removed at process exit; `ZEUS_SIM_RAPL_MAX_UJ` sets the packages' wrap range
//! (default 262143328850 µJ, a common Intel value) and DRAM zones wrap at an eighth of it (DRAM
//! has its own, smaller range on many Intel servers; it also lets a test see both kinds of zone
//! wrap at a similar pace, since DRAM draws about a tenth of the package's power). The model's exact cumulative energy
//! ([`SimRapl::true_energy_j`]) is the truth tests compare against.
//!
//! The model runs on wall-clock time ([`model_time`]), not on time since the simulator started,
//! so any process can compute the truth for a stretch of time another process simulated
//! ([`model_energy_j`]): a test that has Prometheus scrape an exporter's simulated CPUs compares
//! the rates Prometheus computes with the model over the same UNIX timestamps.

use std::f64::consts::TAU;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::error::{CpuError, CpuResult};

/// Default wrap range of the packages, µJ.
pub const DEFAULT_MAX_UJ: u64 = 262_143_328_850;

/// The DRAM zones' wrap range for a package range, µJ: an eighth of it.
pub fn dram_range(package_range_uj: u64) -> u64 {
    (package_range_uj / 8).max(1)
}
/// How often the writer thread updates the counters.
pub const WRITE_PERIOD: Duration = Duration::from_millis(1);

/// Model time origin, UNIX seconds (2026-01-01): keeps model times small, so energies keep
/// sub-microjoule precision in an `f64`.
const MODEL_EPOCH_UNIX_S: f64 = 1_767_225_600.0;

/// Model time of a UNIX timestamp, seconds.
pub fn model_time(unix_s: f64) -> f64 {
    unix_s - MODEL_EPOCH_UNIX_S
}

/// Model time now.
fn model_now() -> f64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    model_time(unix)
}

/// Energy of simulated package `k` and of its DRAM from the model's origin up to UNIX time
/// `unix_s`, J: the true energy between two timestamps is the difference (whichever process
/// ran the simulator).
pub fn model_energy_j(k: usize, unix_s: f64) -> (f64, f64) {
    let (pkg, dram) = models(k);
    let t = model_time(unix_s);
    (pkg.energy_j(t), dram.energy_j(t))
}

/// Power varying smoothly: `base + amp * sin(2π t / period + phase)` W, `t` the model time
/// ([`model_time`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerModel {
    pub base_w: f64,
    pub amp_w: f64,
    pub period_s: f64,
    pub phase: f64,
}

impl PowerModel {
    pub fn power_w(&self, t: f64) -> f64 {
        self.base_w + self.amp_w * (TAU * t / self.period_s + self.phase).sin()
    }

    /// Exact integral of the power from 0 to `t`, J.
    pub fn energy_j(&self, t: f64) -> f64 {
        let w = TAU / self.period_s;
        self.base_w * t - self.amp_w / w * ((w * t + self.phase).cos() - self.phase.cos())
    }
}

/// Simulated package `k`'s package and DRAM models: package 60-120 W, DRAM 8-14 W, each
/// package with its own period and phase.
pub fn models(k: usize) -> (PowerModel, PowerModel) {
    let k = k as f64;
    (
        PowerModel {
            base_w: 90.0 - 3.0 * k.min(5.0),
            amp_w: 30.0 - 3.0 * k.min(5.0),
            period_s: 6.0 + 1.7 * k,
            phase: 0.9 * k,
        },
        PowerModel {
            base_w: 11.0,
            amp_w: 3.0,
            period_s: 4.0 + 1.3 * k,
            phase: 1.0 + 0.7 * k,
        },
    )
}

struct Zone {
    model: PowerModel,
    /// Wrap range, µJ.
    range_uj: u64,
    /// Energy already counted when the simulator started, J (so counters do not start at 0).
    offset_j: f64,
    dir: PathBuf,
}

struct Inner {
    dir: PathBuf,
    owned: bool,
    range_uj: u64,
    /// Model time at start.
    start: f64,
    /// Package `k` is zone `2k`, its DRAM `2k + 1`.
    zones: Vec<Zone>,
    /// Model time (`f64` bits) of the newest write that reached every counter file: a read of a
    /// counter after loading this shows energy from this time or later. The writer is a thread
    /// that a loaded machine can hold up for tens of milliseconds, unlike real RAPL hardware;
    /// this lets a test bound what a read saw without guessing that lag.
    published: AtomicU64,
    stop: AtomicBool,
}

impl Inner {
    /// Model time now.
    fn now(&self) -> f64 {
        model_now()
    }

    /// The counter's energy at model time `t`: the offset plus what the model used since start.
    fn energy_at(&self, z: usize, t: f64) -> f64 {
        let zone = &self.zones[z];
        zone.offset_j + zone.model.energy_j(t) - zone.model.energy_j(self.start)
    }

    fn counter_at(&self, z: usize, t: f64) -> u64 {
        let uj = (self.energy_at(z, t) * 1e6).floor() as u128;
        (uj % u128::from(self.zones[z].range_uj.max(1))) as u64
    }

    /// Write every counter (temp file, then rename: a reader never sees a half-written file).
    fn write_all(&self) {
        let t = self.now();
        let mut all = true;
        for (z, zone) in self.zones.iter().enumerate() {
            let tmp = zone.dir.join(".energy_uj.tmp");
            all &= std::fs::write(&tmp, format!("{}\n", self.counter_at(z, t))).is_ok()
                && std::fs::rename(&tmp, zone.dir.join("energy_uj")).is_ok();
        }
        if all {
            self.published.store(t.to_bits(), Ordering::SeqCst);
        }
    }

    fn run(&self) {
        while !self.stop.load(Ordering::Relaxed) {
            self.write_all();
            std::thread::sleep(WRITE_PERIOD);
        }
    }
}

/// A running simulated RAPL tree and its writer thread. Dropping it stops the thread and, if
/// the simulator created the directory, removes it.
pub struct SimRapl {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for SimRapl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimRapl")
            .field("dir", &self.inner.dir)
            .field("packages", &self.packages())
            .finish()
    }
}

fn write_file(path: &Path, text: &str) -> CpuResult<()> {
    std::fs::write(path, text).map_err(|e| {
        CpuError::File(format!(
            "simulated RAPL: cannot write {}: {e}",
            path.display()
        ))
    })
}

impl SimRapl {
    /// Build the tree for `packages` packages in `dir` (a fresh temporary directory if `None`)
    /// and start the writer.
    pub fn start(packages: usize, dir: Option<PathBuf>, range_uj: u64) -> CpuResult<SimRapl> {
        if packages == 0 || range_uj == 0 {
            return Err(CpuError::InvalidArg(
                "simulated RAPL needs at least one package and a range above 0".into(),
            ));
        }
        let (dir, owned) = match dir {
            Some(d) => (d, false),
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or(0);
                let d = std::env::temp_dir()
                    .join(format!("zeus-sim-rapl-{}-{nanos}", std::process::id()));
                (d, true)
            }
        };
        let mut zones = Vec::with_capacity(2 * packages);
        for k in 0..packages {
            let (pkg, dram) = models(k);
            let pdir = dir.join(format!("intel-rapl:{k}"));
            let ddir = pdir.join(format!("intel-rapl:{k}:0"));
            std::fs::create_dir_all(&ddir).map_err(|e| {
                CpuError::File(format!(
                    "simulated RAPL: cannot create {}: {e}",
                    ddir.display()
                ))
            })?;
            let dram_range_uj = dram_range(range_uj);
            for (zdir, name, range) in [
                (&pdir, format!("package-{k}"), range_uj),
                (&ddir, "dram".to_owned(), dram_range_uj),
            ] {
                write_file(&zdir.join("name"), &format!("{name}\n"))?;
                write_file(&zdir.join("max_energy_range_uj"), &format!("{range}\n"))?;
            }
            // Start each counter part-way into its range.
            let frac = 0.25 + 0.1 * k as f64;
            let offset = (range_uj as f64 / 1e6) * frac.fract();
            zones.push(Zone {
                model: pkg,
                range_uj,
                offset_j: offset,
                dir: pdir,
            });
            zones.push(Zone {
                model: dram,
                range_uj: dram_range_uj,
                offset_j: (dram_range_uj as f64 / 1e6) * frac.fract(),
                dir: ddir,
            });
        }
        let inner = Arc::new(Inner {
            dir,
            owned,
            range_uj,
            start: model_now(),
            zones,
            published: AtomicU64::new(f64::NEG_INFINITY.to_bits()),
            stop: AtomicBool::new(false),
        });
        inner.write_all();
        let i2 = inner.clone();
        let handle = std::thread::Builder::new()
            .name("zeus-sim-rapl".into())
            .spawn(move || i2.run())
            .map_err(|e| CpuError::File(format!("simulated RAPL: cannot start writer: {e}")))?;
        Ok(SimRapl {
            inner,
            thread: Mutex::new(Some(handle)),
        })
    }

    /// The powercap root of the tree.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn packages(&self) -> usize {
        self.inner.zones.len() / 2
    }

    pub fn max_energy_range_uj(&self) -> u64 {
        self.inner.range_uj
    }

    /// Exact cumulative energy of package `k` and of its DRAM now, J (unwrapped, on the
    /// counters' scale: the counter is this value in µJ modulo the range).
    pub fn true_energy_j(&self, k: usize) -> CpuResult<(f64, f64)> {
        if k >= self.packages() {
            return Err(CpuError::InvalidArg(format!(
                "simulated CPU {k} does not exist: {} package(s)",
                self.packages()
            )));
        }
        let t = self.inner.now();
        Ok((
            self.inner.energy_at(2 * k, t),
            self.inner.energy_at(2 * k + 1, t),
        ))
    }

    /// Cumulative energy of package `k` and of its DRAM as of the newest write that reached
    /// every counter file, J (on [`SimRapl::true_energy_j`]'s scale).
    ///
    /// A counter read made after this call shows at least this energy, and at most what
    /// [`SimRapl::true_energy_j`] gives after the read: the two bracket what the read saw
    /// however late the writer thread runs.
    pub fn published_energy_j(&self, k: usize) -> CpuResult<(f64, f64)> {
        self.true_energy_j(k)?;
        let t = f64::from_bits(self.inner.published.load(Ordering::SeqCst));
        Ok((
            self.inner.energy_at(2 * k, t),
            self.inner.energy_at(2 * k + 1, t),
        ))
    }

    /// Model power of package `k` and its DRAM now, W.
    pub fn true_power_w(&self, k: usize) -> CpuResult<(f64, f64)> {
        self.true_energy_j(k)?;
        let t = self.inner.now();
        Ok((
            self.inner.zones[2 * k].model.power_w(t),
            self.inner.zones[2 * k + 1].model.power_w(t),
        ))
    }

    /// Stop the writer and remove the tree if the simulator created it. Idempotent.
    pub fn shutdown(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        if self.inner.owned {
            let _ = std::fs::remove_dir_all(&self.inner.dir);
        }
    }
}

impl Drop for SimRapl {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `ZEUS_SIM_CPUS` as a package count, `None` when unset or empty.
pub fn requested_packages() -> CpuResult<Option<usize>> {
    let Ok(v) = std::env::var("ZEUS_SIM_CPUS") else {
        return Ok(None);
    };
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    match v.parse::<usize>() {
        Ok(n) if (1..=64).contains(&n) => Ok(Some(n)),
        _ => Err(CpuError::InvalidArg(format!(
            "ZEUS_SIM_CPUS={v:?} is not a number of simulated CPU packages (1-64)"
        ))),
    }
}

fn requested_range() -> CpuResult<u64> {
    match std::env::var("ZEUS_SIM_RAPL_MAX_UJ") {
        Err(_) => Ok(DEFAULT_MAX_UJ),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(CpuError::InvalidArg(format!(
                "ZEUS_SIM_RAPL_MAX_UJ={v:?} is not a positive number of microjoules"
            ))),
        },
    }
}

static GLOBAL: OnceLock<Result<Arc<SimRapl>, CpuError>> = OnceLock::new();

extern "C" fn shutdown_at_exit() {
    if let Some(Ok(s)) = GLOBAL.get() {
        s.shutdown();
    }
}

/// The process's simulated CPUs when `ZEUS_SIM_CPUS` asks for them (read once per process;
/// the first call starts the writer), else `None`.
pub fn global() -> CpuResult<Option<Arc<SimRapl>>> {
    let Some(n) = requested_packages()? else {
        return Ok(None);
    };
    let r = GLOBAL.get_or_init(|| {
        let dir = std::env::var_os("ZEUS_SIM_RAPL_DIR").map(PathBuf::from);
        let s = SimRapl::start(n, dir, requested_range()?)?;
        // SAFETY: registers a plain function with no arguments.
        unsafe { libc::atexit(shutdown_at_exit) };
        Ok(Arc::new(s))
    });
    r.clone().map(Some)
}
