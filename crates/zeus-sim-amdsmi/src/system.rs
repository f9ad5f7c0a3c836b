//! `amdsmi_init`, `amdsmi_shut_down`, `amdsmi_get_lib_version` and
//! `amdsmi_status_code_to_string`.

use std::ffi::{CStr, CString};

use super::*;

/// What `amdsmi_version_t.build` points at: static, as the real library's string is.
static BUILD: &CStr = c"zeus-sim";

/// Initialise the library. `flags` (which processor kinds to enumerate) is accepted and
/// ignored: the simulated library only has AMD GPUs. Reference counted, like NVML's init: each
/// successful call needs a matching `amdsmi_shut_down`. The devices are built by the first
/// call, from the environment; a bad `ZEUS_SIM_*` value fails it with
/// `AMDSMI_STATUS_INIT_ERROR` and a message on stderr naming the variable.
#[no_mangle]
pub extern "C" fn amdsmi_init(_flags: u64) -> Status {
    guard(|| {
        let _lock = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        if LIBRARY.get().is_none() {
            match config::build() {
                Ok(lib) => {
                    // We hold the init lock, so nobody else can have set it meanwhile.
                    let _ = LIBRARY.set(lib);
                }
                Err(e) => {
                    eprintln!("simulated libamd_smi: {e}");
                    return Err(status::INIT_ERROR);
                }
            }
        }
        INIT_COUNT.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })
}

/// Undo one `amdsmi_init`; `AMDSMI_STATUS_NOT_INIT` when there is none to undo. The devices
/// stay as they are for the next init.
#[no_mangle]
pub extern "C" fn amdsmi_shut_down() -> Status {
    guard(|| {
        INIT_COUNT
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| status::NOT_INIT)
    })
}

/// The library's version: `ZEUS_SIM_AMDSMI_VERSION` (default 26.0.2), build `zeus-sim`.
/// Works before `amdsmi_init`, as the real call does.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_lib_version(version: *mut ffi::Version) -> Status {
    guard(|| {
        nonnull(version)?;
        let (major, minor, release) = config::version().map_err(|e| {
            eprintln!("simulated libamd_smi: {e}");
            status::INVAL
        })?;
        write(
            version,
            ffi::Version {
                major,
                minor,
                release,
                _pad: 0,
                build: BUILD.as_ptr(),
            },
        )
    })
}

/// The name of a status code (`AMDSMI_STATUS_INVAL`, ...), as a static string the caller must
/// not free. Works before `amdsmi_init`.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_status_code_to_string(
    code: Status,
    out: *mut *const c_char,
) -> Status {
    // One NUL-terminated copy of each name, made once and kept for the process.
    static NAMES: OnceLock<Vec<(&'static str, CString)>> = OnceLock::new();
    guard(|| {
        nonnull(out)?;
        let names = NAMES.get_or_init(|| {
            let mut v: Vec<(&'static str, CString)> = Vec::new();
            for c in (0..=64).chain([status::UNKNOWN_ERROR]) {
                let name = ffi::status_name(c);
                if !v.iter().any(|(n, _)| *n == name) {
                    v.push((name, CString::new(name).expect("status names have no NUL")));
                }
            }
            v
        });
        let name = ffi::status_name(code);
        let (_, s) = names
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or(status::UNKNOWN_ERROR)?;
        write(out, s.as_ptr())
    })
}
