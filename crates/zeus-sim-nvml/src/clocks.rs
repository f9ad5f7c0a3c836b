//! Supported, current and maximum clocks, and locking them.

use super::*;

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
