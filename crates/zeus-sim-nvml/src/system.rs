//! `nvmlInit*`, `nvmlShutdown`, `nvmlErrorString` and the system queries.

use super::*;

fn init() -> Ret {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if CLUSTER.get().is_none() {
        match SimConfig::from_env_for(zeus_core::device::Vendor::Nvidia).and_then(SimCluster::open)
        {
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
