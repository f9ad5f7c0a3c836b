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
//! idle, run work, advance the virtual clock, inject faults, reset or freeze the energy counter,
//! and read the model's true energy.
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

// ---- init and system ----------------------------------------------------------------------

fn init() -> Ret {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if CLUSTER.get().is_none() {
        match SimConfig::from_env().and_then(SimCluster::open) {
            Ok(c) => {
                let _ = CLUSTER.set(c);
            }
            Err(e) => {
                eprintln!("simulated libnvidia-ml: {e}");
                return code(e);
            }
        }
    }
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    init()
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    init()
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    init()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    let r = INIT_COUNT.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    if r.is_ok() {
        SUCCESS
    } else {
        UNINITIALIZED
    }
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    // NVML's strings are static; keep ours static too (one leaked C string per code).
    static STRINGS: Mutex<Vec<(Ret, &'static CStr)>> = Mutex::new(Vec::new());
    let mut s = STRINGS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = s.iter().find(|(r, _)| *r == result) {
        return c.as_ptr();
    }
    let c: &'static CStr = Box::leak(
        std::ffi::CString::new(nvml_error_string(result))
            .unwrap()
            .into_boxed_c_str(),
    );
    s.push((result, c));
    c.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        cluster()?;
        write_str(version, length, "999.99-zeus-sim")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        cluster()?;
        write_str(version, length, "12.999.99-zeus-sim")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Ret {
    guard(|| {
        cluster()?;
        write(version, 12040)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    nvmlSystemGetCudaDriverVersion(version)
}

// ---- device discovery ---------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    guard(|| write(count, cluster()?.devices().len() as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    nvmlDeviceGetCount_v2(count)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut Handle) -> Ret {
    guard(|| {
        let c = cluster()?;
        let d = c.devices().get(index as usize).ok_or(INVALID_ARGUMENT)?;
        write(device, Arc::as_ptr(d))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut Handle) -> Ret {
    nvmlDeviceGetHandleByIndex_v2(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut Handle,
) -> Ret {
    guard(|| {
        let c = cluster()?;
        if uuid.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let wanted = CStr::from_ptr(uuid)
            .to_str()
            .map_err(|_| INVALID_ARGUMENT)?;
        let d = c
            .devices()
            .iter()
            .find(|d| d.uuid().map(|u| u == wanted).unwrap_or(false))
            .ok_or(NOT_FOUND)?;
        write(device, Arc::as_ptr(d))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: Handle, index: *mut c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(index, d.index() as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: Handle,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write_str(name, length, &d.name().map_err(code)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: Handle,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write_str(uuid, length, &d.uuid().map_err(code)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(device: Handle, arch: *mut c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(arch, d.architecture().map_err(code)?.nvml_value())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: Handle,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    use zeus_core::device::Architecture::*;
    guard(|| {
        let (_, d) = self::device(device)?;
        let (ma, mi) = match d.architecture().map_err(code)? {
            Pascal => (6, 0),
            Volta => (7, 0),
            Turing => (7, 5),
            Ampere if d.preset().key == "A100" => (8, 0),
            Ampere => (8, 6),
            Ada => (8, 9),
            Hopper => (9, 0),
            Blackwell => (10, 0),
            _ => (0, 0),
        };
        write(major, ma)?;
        write(minor, mi)
    })
}

// ---- power limits and persistence ---------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: Handle,
    min_limit: *mut c_uint,
    max_limit: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let (lo, hi) = d.power_management_limit_constraints().map_err(code)?;
        write(min_limit, lo)?;
        write(max_limit, hi)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: Handle,
    limit: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(limit, d.power_management_limit_default().map_err(code)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: Handle,
    limit: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(limit, d.power_management_limit().map_err(code)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: Handle,
    limit: *mut c_uint,
) -> Ret {
    nvmlDeviceGetPowerManagementLimit(device, limit)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetPowerManagementLimit(device: Handle, limit: c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        d.set_power_management_limit(limit).map_err(code)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(device: Handle, mode: *mut c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(mode, d.persistence_mode().map_err(code)? as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(device: Handle, mode: c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        if mode > 1 {
            return Err(INVALID_ARGUMENT);
        }
        d.set_persistence_mode(mode == 1).map_err(code)
    })
}

// ---- clocks ---------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedMemoryClocks(
    device: Handle,
    count: *mut c_uint,
    clocks: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write_list(count, clocks, &d.supported_memory_clocks().map_err(code)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedGraphicsClocks(
    device: Handle,
    memory_clock_mhz: c_uint,
    count: *mut c_uint,
    clocks: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let list = d
            .supported_graphics_clocks(memory_clock_mhz)
            .map_err(code)?;
        write_list(count, clocks, &list)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetGpuLockedClocks(
    device: Handle,
    min: c_uint,
    max: c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        d.set_gpu_locked_clocks(min, max).map_err(code)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceResetGpuLockedClocks(device: Handle) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        d.reset_gpu_locked_clocks().map_err(code)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLockedClocks(
    device: Handle,
    min: c_uint,
    max: c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        d.set_memory_locked_clocks(min, max).map_err(code)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceResetMemoryLockedClocks(device: Handle) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        d.reset_memory_locked_clocks().map_err(code)
    })
}

/// `nvmlClockType_t`: 0 graphics, 1 SM, 2 memory, 3 video.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: Handle,
    kind: c_uint,
    clock: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let p = d.preset();
        let v = match kind {
            0 | 1 | 3 => p.max_graphics_clock_mhz,
            2 => p.memory_clocks_mhz[0],
            _ => return Err(INVALID_ARGUMENT),
        };
        write(clock, v)
    })
}

/// The clock the simulated GPU runs at now (its power limit, locks and load).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: Handle,
    kind: c_uint,
    clock: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let (graphics, memory) = d.current_clocks_mhz().map_err(code)?;
        let v = match kind {
            0 | 1 | 3 => graphics,
            2 => memory,
            _ => return Err(INVALID_ARGUMENT),
        };
        write(clock, v)
    })
}

// ---- power and energy ---------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: Handle, power: *mut c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(power, d.average_power_usage().map_err(code)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: Handle,
    energy: *mut c_ulonglong,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(energy, d.total_energy_consumption().map_err(code)?)
    })
}

/// `nvmlFieldValue_t` from `nvml.h`.
#[repr(C)]
pub struct FieldValue {
    pub field_id: c_uint,
    pub scope_id: c_uint,
    pub timestamp: c_longlong,
    pub latency_usec: c_longlong,
    pub value_type: c_uint,
    pub nvml_return: c_uint,
    pub value: u64,
}

const NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: c_uint = 83;
const NVML_FI_DEV_POWER_AVERAGE: c_uint = 185;
const NVML_FI_DEV_POWER_INSTANT: c_uint = 186;
const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
const NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;

/// Field values: the energy counter and both power readings. `timestamp` is "CPU Timestamp of
/// this value in microseconds since 1970": the moment the driver updated the value (the
/// update a power reading comes from, the moment the counter published its value), or the
/// moment of the call with `ZEUS_SIM_FIELD_TIMESTAMP=call`. `latencyUsec` is what the read
/// cost.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: Handle,
    count: c_int,
    values: *mut FieldValue,
) -> Ret {
    guard(|| {
        let (c, d) = self::device(device)?;
        if count < 0 || (count > 0 && values.is_null()) {
            return Err(INVALID_ARGUMENT);
        }
        let call_timestamps = d.board().field_timestamps == FieldTimestamps::Call;
        for i in 0..count as usize {
            let fv = &mut *values.add(i);
            let started = Instant::now();
            let r = match fv.field_id {
                NVML_FI_DEV_POWER_INSTANT => d
                    .power_reading(true)
                    .map(|(mw, t)| (u64::from(mw), t, NVML_VALUE_TYPE_UNSIGNED_INT)),
                NVML_FI_DEV_POWER_AVERAGE => d
                    .power_reading(false)
                    .map(|(mw, t)| (u64::from(mw), t, NVML_VALUE_TYPE_UNSIGNED_INT)),
                NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => d
                    .energy_reading()
                    .map(|(mj, t)| (mj, t, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)),
                _ => Err(GpuError::NotSupported(String::new())),
            };
            let now = c.clock().now();
            fv.latency_usec = started.elapsed().as_micros() as c_longlong;
            match r {
                Ok((v, t, kind)) => {
                    fv.nvml_return = SUCCESS;
                    fv.value_type = kind;
                    fv.value = v;
                    let t = if call_timestamps { now } else { t };
                    fv.timestamp = (t * 1e6) as c_longlong;
                }
                Err(e) => {
                    fv.nvml_return = e.nvml_code();
                    fv.value_type = NVML_VALUE_TYPE_UNSIGNED_INT;
                    fv.value = 0;
                    fv.timestamp = (now * 1e6) as c_longlong;
                }
            }
        }
        Ok(())
    })
}

// ---- what monitoring tools ask (nvidia-smi-like readers, nvitop, nvidia-ml-py scripts) -----

/// `nvmlTemperatureSensors_t`: only the GPU sensor (0) exists.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: Handle,
    sensor: c_uint,
    temp: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        if sensor != 0 {
            return Err(INVALID_ARGUMENT);
        }
        write(temp, d.temperature_c().map_err(code)?)
    })
}

/// `nvmlTemperatureThresholds_t`: shutdown, slowdown, memory maximum, GPU maximum.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: Handle,
    kind: c_uint,
    temp: *mut c_uint,
) -> Ret {
    guard(|| {
        self::device(device)?;
        let t = match kind {
            0 => 92,
            1 => 89,
            2 => 95,
            3 => 87,
            _ => return Err(NOT_SUPPORTED),
        };
        write(temp, t)
    })
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2`: the struct size in the low bytes, version 2 in the top byte.
const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Handle, memory: *mut Memory) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let m = d.memory_info().map_err(code)?;
        write(
            memory,
            Memory {
                total: m.total,
                free: m.total - m.used,
                used: m.used,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: Handle, memory: *mut MemoryV2) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        if memory.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        if (*memory).version != NVML_MEMORY_V2 {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let m = d.memory_info().map_err(code)?;
        // The driver reserves a little of the memory for itself.
        let reserved = m.total / 200;
        write(
            memory,
            MemoryV2 {
                version: NVML_MEMORY_V2,
                total: m.total,
                reserved,
                free: m.total - m.used - reserved,
                used: m.used,
            },
        )
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct UtilizationRates {
    pub gpu: c_uint,
    pub memory: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: Handle,
    utilization: *mut UtilizationRates,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let u = d.utilization_rates().map_err(code)?;
        write(
            utilization,
            UtilizationRates {
                gpu: u.gpu,
                memory: u.memory,
            },
        )
    })
}

/// `nvmlPciInfo_t`.
#[repr(C)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

fn c_chars<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: Handle, pci: *mut PciInfo) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let bus_id = d.pci_bus_id().map_err(code)?;
        let bus = c_uint::from_str_radix(bus_id.split(':').nth(1).unwrap_or("0"), 16)
            .map_err(|_| UNKNOWN)?;
        write(
            pci,
            PciInfo {
                // The legacy field has a 4-digit domain.
                bus_id_legacy: c_chars(&bus_id[4..]),
                domain: 0,
                bus,
                device: 0,
                pci_device_id: d.preset().pci_device_id,
                pci_sub_system_id: d.preset().pci_device_id,
                bus_id: c_chars(&bus_id),
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(device: Handle, pci: *mut PciInfo) -> Ret {
    nvmlDeviceGetPciInfo_v3(device, pci)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(device: Handle, pci: *mut PciInfo) -> Ret {
    nvmlDeviceGetPciInfo_v3(device, pci)
}

/// No process runs on a simulated GPU: every process list is empty.
unsafe fn no_processes(device: Handle, count: *mut c_uint) -> Ret {
    guard(|| {
        self::device(device)?;
        write(count, 0)
    })
}

macro_rules! process_lists {
    ($($name:ident),*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            device: Handle,
            count: *mut c_uint,
            _infos: *mut std::ffi::c_void,
        ) -> Ret {
            no_processes(device, count)
        }
    )*};
}

process_lists!(
    nvmlDeviceGetComputeRunningProcesses,
    nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlDeviceGetGraphicsRunningProcesses,
    nvmlDeviceGetGraphicsRunningProcesses_v2,
    nvmlDeviceGetGraphicsRunningProcesses_v3,
    nvmlDeviceGetMPSComputeRunningProcesses,
    nvmlDeviceGetMPSComputeRunningProcesses_v2,
    nvmlDeviceGetMPSComputeRunningProcesses_v3
);

/// No simulated board is a Grace Hopper superchip: no C2C link (Zeus 0.16 asks every GPU).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetC2cModeInfoV(
    device: Handle,
    _info: *mut std::ffi::c_void,
) -> Ret {
    guard(|| {
        self::device(device)?;
        Err(NOT_SUPPORTED)
    })
}

/// Data-centre boards are passively cooled: no fan.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(device: Handle, _speed: *mut c_uint) -> Ret {
    guard(|| {
        self::device(device)?;
        Err(NOT_SUPPORTED)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumFans(device: Handle, count: *mut c_uint) -> Ret {
    guard(|| {
        self::device(device)?;
        write(count, 0)
    })
}

/// P0 while busy, P8 while idle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(device: Handle, state: *mut c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let busy = d.utilization_rates().map_err(code)?.gpu > 0;
        write(state, if busy { 0 } else { 8 })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerState(device: Handle, state: *mut c_uint) -> Ret {
    nvmlDeviceGetPerformanceState(device, state)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: Handle,
    serial: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let digits: String = d
            .uuid()
            .map_err(code)?
            .chars()
            .filter(|c| c.is_ascii_digit())
            .take(12)
            .collect();
        write_str(serial, length, &format!("1{digits:0>12}"))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: Handle, minor: *mut c_uint) -> Ret {
    nvmlDeviceGetIndex(device, minor)
}

/// `nvmlBrandType_t`: Tesla for the Pascal and Volta boards, NVIDIA after.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBrand(device: Handle, brand: *mut c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        let tesla = d.preset().architecture <= zeus_core::device::Architecture::Volta;
        write(brand, if tesla { 2 } else { 14 })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: Handle,
    version: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        self::device(device)?;
        write_str(version, length, "96.00.99.00.01")
    })
}

/// Nothing holds the clocks back on a simulated board.
/// The reasons the model knows: idle, and the power limit holding the clock down.
unsafe fn current_reasons(device: Handle, reasons: *mut c_ulonglong) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(reasons, d.clock_event_reasons())
    })
}

unsafe fn supported_reasons(device: Handle, reasons: *mut c_ulonglong) -> Ret {
    guard(|| {
        self::device(device)?;
        write(reasons, CLOCK_EVENT_GPU_IDLE | CLOCK_EVENT_SW_POWER_CAP)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: Handle,
    reasons: *mut c_ulonglong,
) -> Ret {
    current_reasons(device, reasons)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: Handle,
    reasons: *mut c_ulonglong,
) -> Ret {
    current_reasons(device, reasons)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    device: Handle,
    reasons: *mut c_ulonglong,
) -> Ret {
    supported_reasons(device, reasons)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksEventReasons(
    device: Handle,
    reasons: *mut c_ulonglong,
) -> Ret {
    supported_reasons(device, reasons)
}

/// A property that is a fixed number per device (mode flags, link width, ...).
unsafe fn fixed(device: Handle, out: *mut c_uint, value: impl Fn(&SimGpu) -> c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(out, value(d))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: Handle,
    v: *mut c_uint,
) -> Ret {
    fixed(device, v, |d| d.preset().pcie.0)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(device: Handle, v: *mut c_uint) -> Ret {
    fixed(device, v, |d| d.preset().pcie.0)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(device: Handle, v: *mut c_uint) -> Ret {
    fixed(device, v, |d| d.preset().pcie.1)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(device: Handle, v: *mut c_uint) -> Ret {
    fixed(device, v, |d| d.preset().pcie.1)
}

/// `nvmlPcieUtilCounter_t` (TX, RX): no traffic.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: Handle,
    _counter: c_uint,
    value: *mut c_uint,
) -> Ret {
    fixed(device, value, |_| 0)
}

/// `NVML_COMPUTEMODE_DEFAULT`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(device: Handle, mode: *mut c_uint) -> Ret {
    fixed(device, mode, |_| 0)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDisplayMode(device: Handle, mode: *mut c_uint) -> Ret {
    fixed(device, mode, |_| 0)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDisplayActive(device: Handle, mode: *mut c_uint) -> Ret {
    fixed(device, mode, |_| 0)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementMode(
    device: Handle,
    mode: *mut c_uint,
) -> Ret {
    fixed(device, mode, |_| 1)
}

/// No video engines in use; NVML's sampling period for them is 167 ms.
unsafe fn no_codec(device: Handle, utilization: *mut c_uint, period_us: *mut c_uint) -> Ret {
    guard(|| {
        self::device(device)?;
        write(utilization, 0)?;
        write(period_us, 167_000)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: Handle,
    utilization: *mut c_uint,
    period_us: *mut c_uint,
) -> Ret {
    no_codec(device, utilization, period_us)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: Handle,
    utilization: *mut c_uint,
    period_us: *mut c_uint,
) -> Ret {
    no_codec(device, utilization, period_us)
}

/// MIG is off where the board has it (A100, H100) and absent elsewhere.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: Handle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        if !matches!(d.preset().key, "A100" | "H100") {
            return Err(NOT_SUPPORTED);
        }
        write(current, 0)?;
        write(pending, 0)
    })
}

// ---- simulator control (not NVML) ---------------------------------------------------------

/// Mark simulated GPU `index` busy (`busy != 0`) or idle.
#[no_mangle]
pub extern "C" fn zeusSimSetBusy(index: c_uint, busy: c_int) -> Ret {
    guard(|| {
        let c = cluster()?;
        let d = c.device(index as usize).map_err(code)?;
        d.set_load(if busy != 0 { Load::Busy } else { Load::Idle });
        Ok(())
    })
}

/// Advance the virtual clock by `seconds` (`NVML_ERROR_NOT_SUPPORTED` on the real clock).
#[no_mangle]
pub extern "C" fn zeusSimAdvance(seconds: f64) -> Ret {
    guard(|| {
        let c = cluster()?;
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(INVALID_ARGUMENT);
        }
        if c.clock().advance(seconds) {
            Ok(())
        } else {
            Err(NOT_SUPPORTED)
        }
    })
}

/// Run `work` units on every simulated GPU; writes the duration in seconds.
#[no_mangle]
pub unsafe extern "C" fn zeusSimRun(work: f64, seconds: *mut f64) -> Ret {
    guard(|| {
        let c = cluster()?;
        let all: Vec<usize> = (0..c.devices().len()).collect();
        let d = c.run(&all, work).map_err(code)?;
        if !seconds.is_null() {
            seconds.write(d);
        }
        Ok(())
    })
}

/// Make calls of simulated GPU `index` fail with NVML error `nvml_return` for `seconds` (`inf`:
/// for good), starting `after` seconds from now. `calls` is a bit set: 1 the energy counter, 2
/// the power readings, 4 every other device call (writes included), 8 writes alone.
#[no_mangle]
pub extern "C" fn zeusSimInjectFault(
    index: c_uint,
    calls: c_uint,
    after: f64,
    seconds: f64,
    nvml_return: c_uint,
) -> Ret {
    guard(|| {
        let c = cluster()?;
        let d = c.device(index as usize).map_err(code)?;
        let valid = after.is_finite() && after >= 0.0 && seconds >= 0.0 && !seconds.is_nan();
        if !valid
            || calls == 0
            || calls & !zeus_core::device::sim::board::calls::ALL != 0
            || nvml_return == SUCCESS
        {
            return Err(INVALID_ARGUMENT);
        }
        let now = c.clock().now();
        d.inject_fault(Fault {
            calls,
            from: now + after,
            until: now + after + seconds,
            code: nvml_return,
            gpu: None,
        });
        Ok(())
    })
}

/// Reset simulated GPU `index`'s energy counter to 0 now (as a driver reload does).
#[no_mangle]
pub extern "C" fn zeusSimResetCounter(index: c_uint) -> Ret {
    guard(|| {
        let c = cluster()?;
        c.device(index as usize).map_err(code)?.reset_counter();
        Ok(())
    })
}

/// Stop simulated GPU `index`'s energy counter where it stands (a board whose counter froze).
#[no_mangle]
pub extern "C" fn zeusSimFreezeCounter(index: c_uint) -> Ret {
    guard(|| {
        let c = cluster()?;
        c.device(index as usize).map_err(code)?.freeze_counter();
        Ok(())
    })
}

/// The model's exact energy of simulated GPU `index` so far (J, no counter lag or rounding):
/// the ground truth a test measures against.
#[no_mangle]
pub unsafe extern "C" fn zeusSimTrueEnergy(index: c_uint, joules: *mut f64) -> Ret {
    guard(|| {
        if joules.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let c = cluster()?;
        let e = c.device(index as usize).map_err(code)?.true_energy_j();
        joules.write(e);
        Ok(())
    })
}

/// The NVML return code of an error name (`GPU_IS_LOST`, `NVML_ERROR_TIMEOUT`, ...), or 0 for
/// a name the simulator does not know; for tests that schedule faults by name.
#[no_mangle]
pub unsafe extern "C" fn zeusSimErrorCode(name: *const c_char) -> Ret {
    if name.is_null() {
        return 0;
    }
    CStr::from_ptr(name)
        .to_str()
        .ok()
        .and_then(error_code)
        .unwrap_or(0)
}
