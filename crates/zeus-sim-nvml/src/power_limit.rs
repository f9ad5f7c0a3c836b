//! Power limits and persistence mode.

use super::*;

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
