//! What monitoring tools read: temperature, engine activity, memory.

use super::*;

/// `AMDSMI_TEMPERATURE_TYPE_EDGE` (amdsmi.h): the edge sensor.
const TEMPERATURE_TYPE_EDGE: u32 = 0;
/// `AMDSMI_MEM_TYPE_LAST` (= `AMDSMI_MEM_TYPE_GTT`, amdsmi.h): the highest memory type.
const MEM_TYPE_LAST: u32 = 2;

/// The current temperature, °C, of the edge or hotspot sensor: both read the model's one
/// temperature (30 °C idle to 80 °C at the maximum cap, following the power drawn). Other
/// sensors and metrics (limits, HBM) are `AMDSMI_STATUS_NOT_SUPPORTED`.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_temp_metric(
    handle: Handle,
    sensor: u32,
    metric: u32,
    value: *mut i64,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(value)?;
        let known_sensor =
            sensor == TEMPERATURE_TYPE_EDGE || sensor == ffi::TEMPERATURE_TYPE_HOTSPOT;
        if !known_sensor || metric != ffi::TEMP_CURRENT {
            return Err(status::NOT_SUPPORTED);
        }
        write(value, i64::from(d.temperature_c().map_err(code)?))
    })
}

/// Engine activity, percent: graphics 100 and memory controller 35 while busy, 0 idle;
/// multimedia 0.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_activity(
    handle: Handle,
    usage: *mut ffi::EngineUsage,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(usage)?;
        let u = d.utilization_rates().map_err(code)?;
        write(
            usage,
            ffi::EngineUsage {
                gfx_activity: u.gpu,
                umc_activity: u.memory,
                mm_activity: 0,
                reserved: [0; 13],
            },
        )
    })
}

/// VRAM in bytes, total or used, from the model's memory; other memory types (visible VRAM,
/// GTT) are `AMDSMI_STATUS_NOT_SUPPORTED`.
unsafe fn memory(
    handle: Handle,
    mem_type: u32,
    out: *mut u64,
    pick: fn(zeus_core::device::MemoryInfo) -> u64,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(out)?;
        match mem_type {
            ffi::MEM_TYPE_VRAM => write(out, pick(d.memory_info().map_err(code)?)),
            t if t <= MEM_TYPE_LAST => Err(status::NOT_SUPPORTED),
            _ => Err(status::INVAL),
        }
    })
}

/// The board's memory: 192 GiB on an MI300X, 64 GiB per die on an MI250X.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_memory_total(
    handle: Handle,
    mem_type: u32,
    total: *mut u64,
) -> Status {
    memory(handle, mem_type, total, |m| m.total)
}

/// Memory in use: 60% while busy, the driver's 512 MiB idle.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_memory_usage(
    handle: Handle,
    mem_type: u32,
    used: *mut u64,
) -> Status {
    memory(handle, mem_type, used, |m| m.used)
}
