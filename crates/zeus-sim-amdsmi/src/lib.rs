//! The simulated AMD GPU as a drop-in `libamd_smi.so`.
//!
//! Exports the amdsmi C functions (AMD SMI 26, ROCm 7.0) that zeus's AMD backend and AMD's own
//! Python bindings (`amdsmi` 7.0.2) call for discovery, power caps, clocks, energy and power, and
//! what monitoring tools read (temperature, memory, activity), backed by the simulated GPU model
//! of `zeus-core` and configured by the same `ZEUS_SIM_*` variables. The structures it fills are
//! the ones in `zeus_core::device::amd::ffi`, the same table the backend reads them with, so the
//! two sides cannot disagree on a layout. `docs/simulated-amdsmi.md` lists what is implemented.
//!
//! Every other function the Python bindings look up at import is exported too and returns
//! `AMDSMI_STATUS_NOT_SUPPORTED` ([`unsupported`]): the bindings resolve all of their symbols
//! when the module is imported, so a missing one would make `import amdsmi` fail.
//!
//! Only AMD presets are GPUs of this library: NVIDIA models named in `ZEUS_SIM_GPUS` belong to
//! the simulated `libnvidia-ml.so.1` and are skipped here; with `ZEUS_SIM_GPUS` unset the
//! library has one MI300X (the simulator's own default, an A40, is not an AMD board).
//!
//! AMD SMI before ROCm 7.2 is not thread-safe, and a caller that does not serialize its calls
//! corrupts the library's state on a real machine. The simulated library records overlapping
//! calls instead ([`control::zeusSimAmdOverlaps`]), so a test can prove that its caller
//! serializes.
//!
//! Safety: every exported function checks its pointers for null and its handles against the
//! devices and sockets it handed out before touching them, and catches panics (a panic must not
//! unwind into C).

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use zeus_core::device::amd::ffi::{self, status, Bdf, Handle, Status};
use zeus_core::device::sim::{Die, SimCluster, SimConfig, SimGpu};
use zeus_core::device::{Gpu, GpuError, Vendor};

/// One GPU package: what amdsmi calls a socket. An MI250X's two dies share one; every other
/// board is a socket of its own. Socket handles are pointers to these records.
#[derive(Debug)]
pub struct Socket {
    /// The library's indices of the package's devices, in order.
    devices: Vec<usize>,
    /// What `amdsmi_get_socket_info` writes: the first device's PCI address.
    id: String,
}

/// What amdsmi knows about a device that the simulated board does not model: the performance
/// level, and which clock ranges a caller set (the board clamps them; `amdsmi_get_clock_info`
/// reports them).
#[derive(Debug)]
struct DeviceState {
    perf_level: u32,
    gfx_range: Option<(u32, u32)>,
    mem_range: Option<(u32, u32)>,
}

/// The library's devices and what it keeps about them.
struct Library {
    cluster: SimCluster,
    sockets: Vec<Socket>,
    /// Per device: its id in the HIP runtime's order (see [`config::hip_ids`]).
    hip_ids: Vec<u32>,
    /// `ZEUS_SIM_PRIVILEGED`: the performance level is a privileged setting too.
    privileged: bool,
    states: Vec<Mutex<DeviceState>>,
}

/// Built by the first successful `amdsmi_init` and kept for the life of the process, like a real
/// driver's devices: their state (power caps, clocks, energy) survives shutdown and re-init.
static LIBRARY: OnceLock<Library> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());
static INIT_COUNT: AtomicUsize = AtomicUsize::new(0);

/// `ZEUS_SIM_AMDSMI_THREAD_UNSAFE=1`: every call lingers so that unserialized callers overlap.
static THREAD_UNSAFE: AtomicBool = AtomicBool::new(false);
/// amdsmi calls running now, and how many started while another was running.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static OVERLAPS: AtomicU64 = AtomicU64::new(0);
/// How long each call lingers in thread-unsafe mode: long enough that two unserialized callers
/// overlap within a few calls, short enough that a serialized caller barely notices.
const LINGER: Duration = Duration::from_micros(200);

/// One amdsmi call in flight. Entering counts it, and counts an overlap if another call was
/// already running: a caller that serializes its calls (as it must with AMD SMI before ROCm 7.2)
/// never makes one. Dropping it ends the call, on every path out (panics included).
struct Call;

impl Call {
    fn enter() -> Call {
        if IN_FLIGHT.fetch_add(1, Ordering::SeqCst) > 0 {
            let n = OVERLAPS.fetch_add(1, Ordering::SeqCst) + 1;
            // Said where a test of another process (zeusd, the exporter) can see it: the
            // first overlap, and every thousandth after it.
            if THREAD_UNSAFE.load(Ordering::Relaxed) && (n == 1 || n % 1000 == 0) {
                eprintln!(
                    "zeus-sim-amdsmi: overlapping amdsmi calls ({n} so far): the caller does \
                     not serialize calls into a library that is not thread-safe"
                );
            }
        }
        if THREAD_UNSAFE.load(Ordering::Relaxed) {
            std::thread::sleep(LINGER);
        }
        Call
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Run `f`, turning its result into a status and a panic into `AMDSMI_STATUS_UNKNOWN_ERROR`.
fn caught(f: impl FnOnce() -> Result<(), Status>) -> Status {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => status::SUCCESS,
        Ok(Err(s)) => s,
        Err(_) => status::UNKNOWN_ERROR,
    }
}

/// An amdsmi call: counted as in flight (see [`Call`]), then [`caught`].
fn guard(f: impl FnOnce() -> Result<(), Status>) -> Status {
    let _call = Call::enter();
    caught(f)
}

fn library() -> Result<&'static Library, Status> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(status::NOT_INIT);
    }
    LIBRARY.get().ok_or(status::NOT_INIT)
}

/// A processor handle we handed out, as the library, the device's index and the device.
fn device(handle: Handle) -> Result<(&'static Library, usize, &'static SimGpu), Status> {
    let lib = library()?;
    if handle.is_null() {
        return Err(status::INVAL);
    }
    let index = lib
        .cluster
        .devices()
        .iter()
        .position(|d| Arc::as_ptr(d) as Handle == handle)
        .ok_or(status::INVAL)?;
    Ok((lib, index, &lib.cluster.devices()[index]))
}

/// A socket handle we handed out.
fn socket(handle: Handle) -> Result<(&'static Library, &'static Socket), Status> {
    let lib = library()?;
    if handle.is_null() {
        return Err(status::INVAL);
    }
    let s = lib
        .sockets
        .iter()
        .find(|s| socket_handle(s) == handle)
        .ok_or(status::INVAL)?;
    Ok((lib, s))
}

fn processor_handle(d: &Arc<SimGpu>) -> Handle {
    Arc::as_ptr(d) as Handle
}

fn socket_handle(s: &Socket) -> Handle {
    s as *const Socket as Handle
}

impl Library {
    /// The device state amdsmi keeps beside the board (a poisoned lock is still consistent:
    /// every update is a plain assignment).
    fn state(&self, index: usize) -> MutexGuard<'_, DeviceState> {
        self.states[index].lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The status of a model error.
fn code(e: GpuError) -> Status {
    ffi::status_of(&e)
}

/// Fail with `AMDSMI_STATUS_INVAL` if `ptr` is null; for checking every output before a call
/// with side effects (an energy read costs time and moves a backwards counter) reads anything.
fn nonnull<T>(ptr: *const T) -> Result<(), Status> {
    if ptr.is_null() {
        Err(status::INVAL)
    } else {
        Ok(())
    }
}

unsafe fn write<T>(ptr: *mut T, value: T) -> Result<(), Status> {
    nonnull(ptr)?;
    ptr.write(value);
    Ok(())
}

/// Copy `s` into the caller's buffer of `len` bytes, cut to fit with its NUL, as amdsmi's
/// name queries do (`strncpy` into the caller's length).
unsafe fn write_str_cut(buf: *mut c_char, len: usize, s: &str) -> Result<(), Status> {
    nonnull(buf)?;
    if len == 0 {
        return Err(status::INVAL);
    }
    ffi::set_c_str(std::slice::from_raw_parts_mut(buf, len), s);
    Ok(())
}

/// amdsmi's handle lists: with a null array, write how many there are; otherwise copy as many
/// as `*count` has room for and write how many were copied.
unsafe fn write_handles(
    count: *mut u32,
    out: *mut Handle,
    handles: &[Handle],
) -> Result<(), Status> {
    nonnull(count)?;
    if out.is_null() {
        *count = handles.len() as u32;
        return Ok(());
    }
    let n = (*count as usize).min(handles.len());
    std::ptr::copy_nonoverlapping(handles.as_ptr(), out, n);
    *count = n as u32;
    Ok(())
}

/// A device's PCI address from the model's NVML-form bus id (`00000000:BB:DD.F`).
fn bdf(d: &SimGpu) -> Result<Bdf, Status> {
    let id = d.pci_bus_id().map_err(code)?;
    let parse = || -> Option<Bdf> {
        let mut parts = id.split(':');
        let domain = u64::from_str_radix(parts.next()?, 16).ok()?;
        let bus = u64::from_str_radix(parts.next()?, 16).ok()?;
        let (dev, func) = parts.next()?.split_once('.')?;
        let dev = u64::from_str_radix(dev, 16).ok()?;
        let func = u64::from_str_radix(func, 16).ok()?;
        Some(Bdf::new(domain, bus, dev, func))
    };
    parse().ok_or(status::UNKNOWN_ERROR)
}

// The exported functions, by what they are about. Every module is public so that its
// `#[no_mangle]` functions are part of the library's interface.
pub mod clocks;
mod config;
pub mod control;
pub mod discovery;
pub mod monitoring;
pub mod power;
pub mod system;
pub mod unsupported;
