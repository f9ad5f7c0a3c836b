//! The simulated GPU as a drop-in `libnvidia-ml.so.1`.
//!
//! Exports the NVML C functions that `nvml-wrapper` (zeus's own NVML backend) and the official
//! Python bindings (`nvidia-ml-py`) call for device discovery, power limits, persistence, clocks,
//! power and energy, and what monitoring tools read (temperature, memory, utilisation, PCI,
//! processes, performance state), backed by the simulated GPU model of `zeus-core` and
//! configured by the same `ZEUS_SIM_*` variables. `docs/simulated-nvml.md` lists them. Return codes are NVML's own, so programs see what a real driver would
//! say: `NVML_ERROR_NO_PERMISSION` with `ZEUS_SIM_PRIVILEGED=0`, `NVML_ERROR_NOT_SUPPORTED` for
//! the energy counter of a P100, `NVML_ERROR_UNINITIALIZED` before `nvmlInit`.
//!
//! Extra functions (`zeusSim*`) let a test drive the model from outside: mark a GPU busy or
//! idle or make it draw a set power, run work, advance the virtual clock, inject faults, reset or
//! freeze the energy counter, and read the model's true energy.
//!
//! Safety: every exported function checks its pointers for null and its device handle against
//! the devices it handed out before touching them.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_longlong, c_uint, c_ulonglong, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use zeus_core::device::error::nvml_code::*;
use zeus_core::device::error::nvml_error_string;
use zeus_core::device::sim::board::{error_code, Fault};
use zeus_core::device::sim::{
    FieldTimestamps, Load, SimCluster, SimConfig, SimGpu, CLOCK_EVENT_GPU_IDLE,
    CLOCK_EVENT_SW_POWER_CAP,
};
use zeus_core::device::{Clock, Gpu, GpuError};

type Ret = c_uint;
/// `nvmlDevice_t`: we hand out pointers to the `SimGpu`s, which live as long as the process.
type Handle = *const SimGpu;

/// Built by the first successful `nvmlInit` and kept for the life of the process, like a real
/// driver's devices: their state (power limits, clocks, energy) survives shutdown and re-init.
static CLUSTER: OnceLock<SimCluster> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());
static INIT_COUNT: AtomicUsize = AtomicUsize::new(0);

fn cluster() -> Result<&'static SimCluster, Ret> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(UNINITIALIZED);
    }
    CLUSTER.get().ok_or(UNINITIALIZED)
}

fn device(handle: Handle) -> Result<(&'static SimCluster, &'static SimGpu), Ret> {
    let c = cluster()?;
    if handle.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if !c.devices().iter().any(|d| Arc::as_ptr(d) == handle) {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: the pointer is one of the cluster's devices, and the cluster lives in a static
    // that is never dropped, so the device outlives every caller.
    let dev: &'static SimGpu = unsafe { &*handle };
    Ok((c, dev))
}

fn code(e: GpuError) -> Ret {
    e.nvml_code()
}

/// Run `f` and turn its result into a return code.
fn guard(f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => UNKNOWN,
    }
}

unsafe fn write<T>(ptr: *mut T, value: T) -> Result<(), Ret> {
    if ptr.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    ptr.write(value);
    Ok(())
}

unsafe fn write_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, buf, bytes.len());
    buf.add(bytes.len()).write(0);
    Ok(())
}

unsafe fn write_list(count: *mut c_uint, out: *mut c_uint, values: &[u32]) -> Result<(), Ret> {
    if count.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let room = *count as usize;
    *count = values.len() as c_uint;
    if room < values.len() {
        return Err(INSUFFICIENT_SIZE);
    }
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    std::ptr::copy_nonoverlapping(values.as_ptr(), out, values.len());
    Ok(())
}

// The exported functions, by what they are about. Every module is public so that its
// `#[no_mangle]` functions are part of the library's interface.
pub mod clocks;
pub mod control;
pub mod discovery;
pub mod energy;
pub mod monitoring;
pub mod power_limit;
pub mod system;
