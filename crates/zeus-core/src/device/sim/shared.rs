//! `ZEUS_SIM_SHARED=PATH`: simulated GPUs whose mutable state lives in a file that every process
//! opening the simulator with the same PATH maps, so that they see one device, as processes see
//! one real GPU: a setting made by one is seen by all and outlives it, and the energy counter
//! counts the same energy in all.
//!
//! Layout (native endianness, fixed sizes): a [`Header`] of [`HEADER_SIZE`] bytes (magic, layout
//! version, record size, the GPU list, the clock offset), then one [`Record`] per device. A
//! record holds what [`State`] holds (settings, load, the energy integrated up to `t_last`, the
//! busy steady state, the recent history real fidelity reads from, the workload curve) and a
//! `version` bumped by every write.
//!
//! Locking: every write is a read-modify-write under an exclusive `flock` of the file, each
//! device through its own open file description (a `flock` is per description, so threads of one
//! process using different devices still exclude each other). A read compares the record's
//! `version` with the one this process last copied (one atomic load of mapped memory, no system
//! call) and copies the record again, under a shared `flock`, only when it changed.
//!
//! Time: `CLOCK_MONOTONIC` plus an offset stored in the header (see [`SimClock::shared`]), the
//! same in every process. Integration stays lazy: a writer integrates up to now under the lock,
//! readers compute from the last integration.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::workload::{ClockPoint, CurvePoint};
use super::{clock, Load, Preset, Segment, SimClock, SimGpu, State, WorkloadCurve};
use crate::device::{Clock, GpuError, GpuResult, SystemClock};

const MAGIC: [u8; 8] = *b"ZEUSSIMG";
/// Bump whenever [`Header`] or [`Record`] change.
const LAYOUT_VERSION: u32 = 1;
const HEADER_SIZE: usize = 4096;
const GPUS_LEN: usize = 1024;
/// Stretches of history a record keeps (the oldest are dropped beyond this).
pub(super) const MAX_HISTORY: usize = 512;
/// Points a shared workload curve (and its clock sweep) may have.
pub const MAX_CURVE_POINTS: usize = 256;

#[repr(C)]
struct Header {
    magic: [u8; 8],
    layout_version: u32,
    n_devices: u32,
    record_size: u64,
    /// Wall time minus `CLOCK_MONOTONIC` when the file was made.
    clock_offset: f64,
    gpus_len: u32,
    _pad: u32,
    /// The preset keys, comma-separated (`ZEUS_SIM_GPUS` as resolved).
    gpus: [u8; GPUS_LEN],
}

const LOAD_IDLE: u32 = 0;
const LOAD_BUSY: u32 = 1;
const LOAD_BUSY_UNTIL: u32 = 2;
const LOAD_DRAWING: u32 = 3;

#[repr(C)]
#[derive(Clone, Copy)]
struct RawSegment {
    t0: f64,
    e0: f64,
    busy_w: f64,
    /// The load's number: `BusyUntil`'s time, `Drawing`'s watts.
    load_value: f64,
    load: u32,
    _pad: u32,
}

#[repr(C)]
struct RawCurve {
    n_points: u32,
    n_clock: u32,
    capped: u32,
    has_clock: u32,
    clock_power_limit_w: f64,
    points: [[f64; 3]; MAX_CURVE_POINTS],
    clock_points: [[f64; 3]; MAX_CURVE_POINTS],
}

#[repr(C)]
struct Record {
    /// Bumped (under the exclusive lock) after every write.
    version: AtomicU64,
    /// Bumped when the curve changes, so readers rebuild it only then.
    curve_gen: u64,
    power_limit_mw: u32,
    persistence: u32,
    /// `[locked?, min, max]`.
    gpu_locked: [u32; 3],
    mem_locked: [u32; 3],
    load: u32,
    _pad: u32,
    /// The load's number: `BusyUntil`'s time, `Drawing`'s watts (as asked for: the power limit
    /// clamps them when read).
    load_value: f64,
    energy_j: f64,
    t_last: f64,
    busy: [f64; 2],
    past_len: u64,
    /// Oldest first.
    past: [RawSegment; MAX_HISTORY],
    curve: RawCurve,
}

const RECORD_SIZE: usize = std::mem::size_of::<Record>();

fn load_to_raw(load: Load) -> (u32, f64) {
    match load {
        Load::Idle => (LOAD_IDLE, 0.0),
        Load::Busy => (LOAD_BUSY, 0.0),
        Load::BusyUntil(t) => (LOAD_BUSY_UNTIL, t),
        Load::Drawing(w) => (LOAD_DRAWING, w),
    }
}

fn load_from_raw(kind: u32, value: f64) -> Load {
    match kind {
        LOAD_BUSY => Load::Busy,
        LOAD_BUSY_UNTIL => Load::BusyUntil(value),
        LOAD_DRAWING => Load::Drawing(value),
        _ => Load::Idle,
    }
}

fn lock_to_raw(l: Option<(u32, u32)>) -> [u32; 3] {
    l.map_or([0, 0, 0], |(a, b)| [1, a, b])
}

fn lock_from_raw(r: [u32; 3]) -> Option<(u32, u32)> {
    (r[0] != 0).then_some((r[1], r[2]))
}

/// A `MAP_SHARED` mapping of the whole file.
#[derive(Debug)]
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access to a record goes through the record's
// lock (or is the atomic `version`), so handing the pointer to other threads is sound.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize, path: &Path) -> GpuResult<Mapping> {
        // SAFETY: a fresh mapping of `len` bytes of an open file; checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(err(
                path,
                &format!("cannot map it: {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    fn record(&self, index: usize) -> *mut Record {
        let off = HEADER_SIZE + index * RECORD_SIZE;
        assert!(off + RECORD_SIZE <= self.len, "record {index} is mapped");
        // SAFETY: in bounds (checked above); the header size and the record size keep records
        // 8-byte aligned in a page-aligned mapping.
        unsafe { self.ptr.add(off).cast() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// An `flock` held until dropped. The caller keeps the descriptor open longer than the lock.
struct FileLock(RawFd);

impl FileLock {
    fn new(fd: RawFd, exclusive: bool) -> FileLock {
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        loop {
            // SAFETY: flock on an open descriptor.
            if unsafe { libc::flock(fd, op) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            // Only EINTR can happen on a valid descriptor of a regular file; anything else would
            // mean the file vanished from under us, which no caller could recover from.
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "flock: {e}");
        }
        FileLock(fd)
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // SAFETY: flock on an open descriptor.
        unsafe { libc::flock(self.0, libc::LOCK_UN) };
    }
}

fn err(path: &Path, what: &str) -> GpuError {
    GpuError::Init(format!("ZEUS_SIM_SHARED={}: {what}", path.display()))
}

fn open_file(path: &Path) -> GpuResult<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(path)
        .map_err(|e| err(path, &format!("cannot open it: {e}")))
}

/// One device's record in a shared file, with this device's own descriptor to lock it by.
#[derive(Debug)]
pub(super) struct SharedDevice {
    path: PathBuf,
    /// This device's own descriptor of the file, and the process that opened it: a child forked
    /// with the devices would share its parent's open file description, and with it the
    /// parent's `flock`s, so it opens its own on first use.
    file: Mutex<(u32, File)>,
    map: Arc<Mapping>,
    index: usize,
}

impl SharedDevice {
    fn file(&self) -> MutexGuard<'_, (u32, File)> {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if f.0 != pid {
            // If the file cannot be opened again, the inherited descriptor still works, only
            // without excluding the parent.
            if let Ok(file) = open_file(&self.path) {
                *f = (pid, file);
            }
        }
        f
    }

    fn record(&self) -> *mut Record {
        self.map.record(self.index)
    }

    fn version(&self) -> u64 {
        // SAFETY: the record is mapped for our lifetime; `version` is only touched atomically.
        unsafe { (*self.record()).version.load(Ordering::Acquire) }
    }

    /// Bring `s` up to date with the file if another write happened since it was copied.
    pub(super) fn sync(&self, s: &mut State) {
        if self.version() == s.version {
            return;
        }
        let file = self.file();
        let _lock = FileLock::new(file.1.as_raw_fd(), false);
        // SAFETY: writers hold the exclusive lock, so the record is stable while we read it.
        unsafe { load(&*self.record(), s) };
    }

    /// Run a read-modify-write of the record under the exclusive lock: `s` is brought up to date,
    /// `f` changes it, and it is written back.
    pub(super) fn write<R>(&self, s: &mut State, f: impl FnOnce(&mut State) -> R) -> R {
        let file = self.file();
        let _lock = FileLock::new(file.1.as_raw_fd(), true);
        let rec = self.record();
        // SAFETY: we hold the exclusive lock: no one else reads or writes the record.
        unsafe {
            if (*rec).version.load(Ordering::Acquire) != s.version {
                load(&*rec, s);
            }
        }
        let r = f(s);
        // SAFETY: as above.
        unsafe { store(rec, s) };
        r
    }
}

/// Copy a record into `s` (the caller holds the file's lock).
unsafe fn load(rec: &Record, s: &mut State) {
    s.power_limit_mw = rec.power_limit_mw;
    s.persistence = rec.persistence != 0;
    s.gpu_locked = lock_from_raw(rec.gpu_locked);
    s.mem_locked = lock_from_raw(rec.mem_locked);
    s.load = load_from_raw(rec.load, rec.load_value);
    s.energy_j = rec.energy_j;
    s.t_last = rec.t_last;
    s.busy = (rec.busy[0], rec.busy[1]);
    let n = (rec.past_len as usize).min(MAX_HISTORY);
    s.past.clear();
    s.past.extend(rec.past[..n].iter().map(|r| Segment {
        t0: r.t0,
        e0: r.e0,
        load: load_from_raw(r.load, r.load_value),
        busy_w: r.busy_w,
    }));
    if rec.curve_gen != s.curve_gen {
        s.curve = Arc::new(curve_from_raw(&rec.curve));
        s.curve_gen = rec.curve_gen;
    }
    s.version = rec.version.load(Ordering::Acquire);
}

/// Write `s` into a record and bump its version (the caller holds the exclusive lock). The curve
/// is written only when `s` holds a newer one than the record (`s.curve_gen` ahead).
unsafe fn store(rec: *mut Record, s: &mut State) {
    let rec = &mut *rec;
    rec.power_limit_mw = s.power_limit_mw;
    rec.persistence = u32::from(s.persistence);
    rec.gpu_locked = lock_to_raw(s.gpu_locked);
    rec.mem_locked = lock_to_raw(s.mem_locked);
    (rec.load, rec.load_value) = load_to_raw(s.load);
    rec.energy_j = s.energy_j;
    rec.t_last = s.t_last;
    rec.busy = [s.busy.0, s.busy.1];
    while s.past.len() > MAX_HISTORY {
        s.past.pop_front();
    }
    for (raw, seg) in rec.past.iter_mut().zip(s.past.iter()) {
        let (load, load_value) = load_to_raw(seg.load);
        *raw = RawSegment {
            t0: seg.t0,
            e0: seg.e0,
            busy_w: seg.busy_w,
            load_value,
            load,
            _pad: 0,
        };
    }
    rec.past_len = s.past.len() as u64;
    if s.curve_gen != rec.curve_gen {
        curve_to_raw(&s.curve, &mut rec.curve);
        rec.curve_gen = s.curve_gen;
    }
    s.version = rec.version.fetch_add(1, Ordering::AcqRel) + 1;
}

fn curve_to_raw(c: &WorkloadCurve, raw: &mut RawCurve) {
    let pts = c.points();
    raw.n_points = pts.len() as u32;
    for (r, p) in raw.points.iter_mut().zip(pts) {
        *r = [p.power_limit_w, p.time_per_epoch_s, p.average_power_w];
    }
    raw.capped = u32::from(c.is_capped());
    match c.clock_curve() {
        Some(cc) => {
            raw.has_clock = 1;
            raw.clock_power_limit_w = cc.power_limit_w;
            raw.n_clock = cc.points().len() as u32;
            for (r, p) in raw.clock_points.iter_mut().zip(cc.points()) {
                *r = [p.clock_fraction, p.time_per_unit_s, p.average_power_w];
            }
        }
        None => {
            raw.has_clock = 0;
            raw.n_clock = 0;
        }
    }
}

fn curve_from_raw(raw: &RawCurve) -> WorkloadCurve {
    let points = raw.points[..(raw.n_points as usize).min(MAX_CURVE_POINTS)]
        .iter()
        .map(|r| CurvePoint {
            power_limit_w: r[0],
            time_per_epoch_s: r[1],
            average_power_w: r[2],
        })
        .collect();
    let clock = (raw.has_clock != 0).then(|| {
        (
            raw.clock_power_limit_w,
            raw.clock_points[..(raw.n_clock as usize).min(MAX_CURVE_POINTS)]
                .iter()
                .map(|r| ClockPoint {
                    clock_fraction: r[0],
                    time_per_unit_s: r[1],
                    average_power_w: r[2],
                })
                .collect(),
        )
    });
    WorkloadCurve::from_parts(points, clock, raw.capped != 0)
}

/// Whether a curve fits a shared record.
pub(super) fn check_curve(c: &WorkloadCurve) -> GpuResult<()> {
    let n = c
        .points()
        .len()
        .max(c.clock_curve().map_or(0, |cc| cc.points().len()));
    if n > MAX_CURVE_POINTS {
        return Err(GpuError::InvalidArg(format!(
            "a workload curve of {n} points does not fit a shared simulated GPU \
             (ZEUS_SIM_SHARED keeps at most {MAX_CURVE_POINTS})"
        )));
    }
    Ok(())
}

/// Open (creating and initialising it if it is new or empty) the shared file at `path` for the
/// GPUs `presets`. `build` makes the devices on the clock the file dictates; a new file takes their
/// initial state, an existing one gives them its state. Returns the clock and the devices,
/// attached.
pub(super) fn open(
    path: &Path,
    presets: &[&'static Preset],
    build: impl FnOnce(Arc<SimClock>) -> Vec<SimGpu>,
) -> GpuResult<(Arc<SimClock>, Vec<SimGpu>)> {
    let gpus = presets.iter().map(|p| p.key).collect::<Vec<_>>().join(",");
    if gpus.len() > GPUS_LEN {
        return Err(err(path, &format!("too many GPUs to share ({gpus})")));
    }
    let file = open_file(path)?;
    let _lock = FileLock::new(file.as_raw_fd(), true);
    let len = HEADER_SIZE + presets.len() * RECORD_SIZE;
    let size = file
        .metadata()
        .map_err(|e| err(path, &format!("cannot stat it: {e}")))?
        .len();
    let fresh = size == 0;
    let (offset, existing) = if fresh {
        (SystemClock.now() - clock::monotonic_now(), None)
    } else {
        if size < HEADER_SIZE as u64 {
            return Err(err(
                path,
                "is not a simulated-GPU state file (too short); remove it or choose another path",
            ));
        }
        let map = Mapping::new(&file, len, path)?;
        // SAFETY: the header is mapped and within the file (checked just above); we hold the
        // exclusive lock.
        let header = unsafe { &*(map.ptr.cast::<Header>()) };
        check_header(path, header, &gpus, size, len)?;
        (header.clock_offset, Some(map))
    };
    let clock = Arc::new(SimClock::shared(offset));
    let mut devices = build(clock.clone());
    let map = match existing {
        Some(map) => Arc::new(map),
        None => {
            for g in &mut devices {
                let s = g.state.get_mut().unwrap_or_else(|p| p.into_inner());
                check_curve(&s.curve).map_err(|e| err(path, &e.to_string()))?;
            }
            let map = create(&file, path, len, &gpus, presets.len(), offset);
            if map.is_err() {
                // Leave an empty file, which the next process initialises, not a broken one.
                let _ = file.set_len(0);
            }
            Arc::new(map?)
        }
    };
    for (i, g) in devices.iter_mut().enumerate() {
        let dev = SharedDevice {
            path: path.to_path_buf(),
            file: Mutex::new((std::process::id(), open_file(path)?)),
            map: map.clone(),
            index: i,
        };
        let rec = dev.record();
        let s = g.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if fresh {
            s.curve_gen = 1;
            // SAFETY: exclusive lock held; the record is mapped.
            unsafe { store(rec, s) };
        } else {
            // SAFETY: as above.
            unsafe { load(&*rec, s) };
        }
        g.shared = Some(dev);
    }
    if fresh {
        // Written last: a file whose creator died half-way has no magic and is refused.
        // SAFETY: the header is mapped; exclusive lock held.
        unsafe { (*map.ptr.cast::<Header>()).magic = MAGIC };
    }
    Ok((clock, devices))
}

/// Size a new file, map it and write its header (all but the magic).
fn create(
    file: &File,
    path: &Path,
    len: usize,
    gpus: &str,
    n_devices: usize,
    offset: f64,
) -> GpuResult<Mapping> {
    file.set_len(len as u64)
        .map_err(|e| err(path, &format!("cannot size it: {e}")))?;
    // Every user's process shares the simulated devices, as with a real GPU (a root daemon and
    // an unprivileged job): let all of them write the state.
    let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
    let map = Mapping::new(file, len, path)?;
    // SAFETY: the header is mapped and the file is long enough; exclusive lock held.
    let header = unsafe { &mut *(map.ptr.cast::<Header>()) };
    header.layout_version = LAYOUT_VERSION;
    header.n_devices = n_devices as u32;
    header.record_size = RECORD_SIZE as u64;
    header.clock_offset = offset;
    header.gpus_len = gpus.len() as u32;
    header.gpus[..gpus.len()].copy_from_slice(gpus.as_bytes());
    Ok(map)
}

fn check_header(path: &Path, h: &Header, gpus: &str, size: u64, len: usize) -> GpuResult<()> {
    if h.magic != MAGIC {
        return Err(err(
            path,
            "is not a simulated-GPU state file (no zeus header); remove it or choose another path",
        ));
    }
    if h.layout_version != LAYOUT_VERSION || h.record_size != RECORD_SIZE as u64 {
        return Err(err(
            path,
            &format!(
                "was made by another version of zeus (state layout {}, {}-byte records; this \
                 one uses layout {LAYOUT_VERSION}, {RECORD_SIZE}-byte records); remove it or \
                 choose another path",
                h.layout_version, h.record_size
            ),
        ));
    }
    let theirs = String::from_utf8_lossy(&h.gpus[..(h.gpus_len as usize).min(GPUS_LEN)]);
    if theirs != gpus || h.n_devices as usize * RECORD_SIZE + HEADER_SIZE != len {
        return Err(err(
            path,
            &format!(
                "holds the simulated GPUs {theirs:?} but this process has ZEUS_SIM_GPUS={gpus:?}; \
                 every process sharing the file must simulate the same GPUs"
            ),
        ));
    }
    if size < len as u64 {
        return Err(err(path, "is truncated; remove it or choose another path"));
    }
    Ok(())
}

/// The path `ZEUS_SIM_SHARED` names, if set and not empty.
pub(super) fn path_from_env() -> Option<PathBuf> {
    match std::env::var_os("ZEUS_SIM_SHARED") {
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{preset, Fidelity, SimCluster, SimConfig};
    use super::*;
    use crate::device::Gpu;

    fn config(path: &Path, keys: &[&str], privileged: bool, fidelity: Fidelity) -> SimConfig {
        SimConfig {
            presets: keys.iter().map(|k| preset::find(k).unwrap()).collect(),
            privileged,
            fidelity,
            energy_read_cost_s: Some(0.0),
            shared: Some(path.to_path_buf()),
            ..SimConfig::default()
        }
    }

    #[test]
    fn two_sets_on_one_path_are_one_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus");
        let keys = ["A40", "H100"];
        let root = SimCluster::open(config(&path, &keys, true, Fidelity::Ideal)).unwrap();
        let user = SimCluster::open(config(&path, &keys, false, Fidelity::Ideal)).unwrap();
        let (r, u) = (&root.devices()[1], &user.devices()[1]);
        assert!(r.is_shared() && u.is_shared());
        assert_eq!(r.uuid().unwrap(), u.uuid().unwrap());

        // The unprivileged process cannot set; the privileged one can, and both see it.
        assert!(matches!(
            u.set_power_management_limit(300_000),
            Err(GpuError::NoPermission(_))
        ));
        r.set_power_management_limit(300_000).unwrap();
        r.set_gpu_locked_clocks(900, 1200).unwrap();
        r.set_memory_locked_clocks(1593, 1593).unwrap();
        r.set_persistence_mode(true).unwrap();
        assert_eq!(u.power_management_limit().unwrap(), 300_000);
        assert!(u.persistence_mode().unwrap());
        assert_eq!(u.busy_steady_state(), r.busy_steady_state());
        assert_eq!(user.devices()[0].power_management_limit().unwrap(), 300_000);

        // Load and energy are one device's: what one starts, the other sees and counts.
        u.set_load(Load::Busy);
        assert_eq!(r.load(), Load::Busy);
        let busy_w = r.true_power_w();
        assert_eq!(u.true_power_w(), busy_w);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (er, eu) = (r.true_energy_j(), u.true_energy_j());
        // Read a few microseconds apart: at most a millisecond of busy power between them.
        assert!((eu - er).abs() < busy_w * 1e-3, "{er} vs {eu}");
        let t = r.start_work(1.0);
        assert!(matches!(u.load(), Load::BusyUntil(_)));
        assert!(t > 0.0);

        // A new curve reaches the other process.
        let curve = WorkloadCurve::default_for(500.0);
        r.set_curve(curve.clone()).unwrap();
        assert_eq!(*u.curve(), curve);
        assert_eq!(u.busy_steady_state(), r.busy_steady_state());

        // A third process attaching later sees the settings as they are.
        let late = SimCluster::open(config(&path, &keys, false, Fidelity::Ideal)).unwrap();
        assert_eq!(late.devices()[1].power_management_limit().unwrap(), 300_000);
        assert_eq!(*late.devices()[1].curve(), curve);
    }

    #[test]
    fn a_set_power_draw_is_seen_and_counted_by_every_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus");
        let root = SimCluster::open(config(&path, &["H100"], true, Fidelity::Real)).unwrap();
        let user = SimCluster::open(config(&path, &["H100"], false, Fidelity::Real)).unwrap();
        let (r, u) = (&root.devices()[0], &user.devices()[0]);
        r.set_power_draw(123.0).unwrap();
        assert_eq!(u.load(), Load::Drawing(123.0));
        assert_eq!(u.true_power_w(), 123.0);
        assert!(u.is_busy(), "123 W is above the H100's 70 W idle");
        let t1 = root.clock().now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let t2 = root.clock().now();
        // The 123 W stretch is history once the load changes; the other process reads it from
        // the file's history, as its real-fidelity readings do.
        r.set_power_draw(650.0).unwrap();
        let e = u.true_energy_at(t2) - u.true_energy_at(t1);
        assert!((e - 123.0 * (t2 - t1)).abs() < 1e-9, "{e}");
        assert_eq!(u.true_power_w(), 650.0);
        // A lower limit clamps the draw in every process; raising it gives back what was asked.
        r.set_power_management_limit(400_000).unwrap();
        assert_eq!(u.true_power_w(), 400.0);
        assert_eq!(u.load(), Load::Drawing(650.0));
        r.set_power_management_limit(700_000).unwrap();
        assert_eq!(u.true_power_w(), 650.0);
        // Drawing no more than idle power is not busy.
        u.set_power_draw(50.0).unwrap();
        assert!(!r.is_busy() && r.true_power_w() == 50.0);
    }

    #[test]
    fn real_fidelity_readings_agree_between_processes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus");
        let a = SimCluster::open(config(&path, &["H100"], true, Fidelity::Real)).unwrap();
        let b = SimCluster::open(config(&path, &["H100"], true, Fidelity::Real)).unwrap();
        let (a, b) = (&a.devices()[0], &b.devices()[0]);
        a.set_load(Load::Busy);
        std::thread::sleep(std::time::Duration::from_millis(300));
        b.set_power_management_limit(400_000).unwrap();
        let mut agreed = 0;
        for _ in 0..20 {
            // Readings change once per update period: compare when `a` saw no change around `b`.
            let a1 = a.total_energy_consumption().unwrap();
            let p1 = a.average_power_usage().unwrap();
            let (eb, pb) = (
                b.total_energy_consumption().unwrap(),
                b.average_power_usage().unwrap(),
            );
            let a2 = a.total_energy_consumption().unwrap();
            let p2 = a.average_power_usage().unwrap();
            if (a1, p1) == (a2, p2) {
                assert_eq!((eb, pb), (a1, p1));
                agreed += 1;
            }
            std::thread::sleep(std::time::Duration::from_millis(7));
        }
        assert!(agreed >= 10, "{agreed}");
    }

    #[test]
    fn a_mismatch_names_the_file_and_the_difference() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus");
        SimCluster::open(config(&path, &["A40", "A40"], true, Fidelity::Ideal)).unwrap();
        let e = SimCluster::open(config(&path, &["H100"], true, Fidelity::Ideal))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("A40,A40") && e.contains("H100"),
            "{e}"
        );

        // A file from another layout.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8] = 99;
        let other = dir.path().join("old");
        std::fs::write(&other, &bytes).unwrap();
        let e = SimCluster::open(config(&other, &["A40", "A40"], true, Fidelity::Ideal))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("another version") && e.contains("layout 99"),
            "{e}"
        );

        // Not ours at all.
        let junk = dir.path().join("junk");
        std::fs::write(&junk, vec![7u8; 8192]).unwrap();
        let e = SimCluster::open(config(&junk, &["A40"], true, Fidelity::Ideal))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a simulated-GPU state file"), "{e}");
        assert_eq!(std::fs::read(&junk).unwrap(), vec![7u8; 8192], "left alone");
    }

    #[test]
    fn a_virtual_clock_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus");
        let mut c = config(&path, &["A40"], true, Fidelity::Ideal);
        c.virtual_clock = true;
        let e = SimCluster::open(c).unwrap_err().to_string();
        assert!(
            e.contains("ZEUS_SIM_CLOCK=virtual") && e.contains(&path.display().to_string()),
            "{e}"
        );
        assert!(!path.exists());
    }

    const CHILD_ENV: &str = "ZEUS_SIM_SHARED_TEST_CHILD";

    /// The other process of `settings_and_energy_cross_processes`: does nothing unless that test
    /// runs this test binary with `CHILD_ENV` naming the shared file.
    #[test]
    fn child_process_role() {
        let Some(path) = std::env::var_os(CHILD_ENV) else {
            return;
        };
        let c =
            SimCluster::open(config(Path::new(&path), &["A100"], true, Fidelity::Ideal)).unwrap();
        let g = &c.devices()[0];
        g.set_power_management_limit(250_000).unwrap();
        g.set_gpu_locked_clocks(1000, 1000).unwrap();
        g.set_load(Load::Busy);
    }

    #[test]
    fn settings_and_energy_cross_processes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus");
        let c = SimCluster::open(config(&path, &["A100"], false, Fidelity::Ideal)).unwrap();
        let g = &c.devices()[0];
        let (e0, t0) = (g.true_energy_j(), c.clock().now());
        let idle_w = g.true_power_w();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "device::sim::shared::tests::child_process_role",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
        // The child is gone; what it set stays, and this (unprivileged) process sees it.
        assert_eq!(g.power_management_limit().unwrap(), 250_000);
        assert_eq!(g.load(), Load::Busy);
        let busy_w = g.true_power_w();
        assert!(busy_w > idle_w);
        // Energy kept counting through the child's changes: idle up to its change, then busy.
        let (e1, t1) = (g.true_energy_j(), c.clock().now());
        let slack = busy_w * 1e-3;
        assert!(e1 - e0 >= idle_w * (t1 - t0) - slack, "{e0} {e1}");
        assert!(e1 - e0 <= busy_w * (t1 - t0) + slack, "{e0} {e1}");
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (e2, t2) = (g.true_energy_j(), c.clock().now());
        // (Each pair is read a few microseconds apart.)
        let want = busy_w * (t2 - t1);
        assert!(
            ((e2 - e1) - want).abs() < busy_w * 1e-3,
            "{} vs {want}",
            e2 - e1
        );
        // A fresh process reads the same integral.
        let again = SimCluster::open(config(&path, &["A100"], false, Fidelity::Ideal)).unwrap();
        let (e3, e4) = (again.devices()[0].true_energy_j(), g.true_energy_j());
        assert!(e3 >= e2 && e4 >= e3 && e4 - e3 < busy_w * 1e-3);
    }
}
