//! Device discovery: counts, handles by index and UUID, names, UUIDs, architecture.

use super::*;

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
