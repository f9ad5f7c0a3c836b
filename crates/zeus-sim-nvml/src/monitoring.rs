//! What monitoring tools ask (nvidia-smi-like readers, nvitop, nvidia-ml-py scripts).

use super::*;

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
    super::discovery::nvmlDeviceGetIndex(device, minor)
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
