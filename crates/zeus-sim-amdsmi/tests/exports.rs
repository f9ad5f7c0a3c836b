//! The simulated `libamd_smi.so` exports every symbol AMD's Python bindings bind at import, so
//! that `import amdsmi` works against it; the ones it does not implement answer NOT_SUPPORTED
//! without touching their arguments.

mod common;

use std::path::Path;

use libloading::{Library, Symbol};
use zeus_core::device::amd::ffi::{status, Handle, Status};

fn load() -> Library {
    // SAFETY: the simulated library's initialisers only set up Rust statics.
    unsafe { Library::new(common::fake_lib()) }.expect("load libamd_smi.so")
}

/// AMD's bindings, `amdsmi_wrapper.py` of the `amdsmi` package (7.0.2, in the test extras):
/// `ZEUS_AMDSMI_WRAPPER` if set, else where `python3` finds the package (found, not imported:
/// its import needs the library).
fn wrapper() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("ZEUS_AMDSMI_WRAPPER") {
        return Some(p.into());
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import importlib.util as u; s = u.find_spec('amdsmi'); \
             print(s.submodule_search_locations[0] if s else '')",
        ])
        .output()
        .ok()?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let path = Path::new(&dir).join("amdsmi_wrapper.py");
    (!dir.is_empty() && path.is_file()).then_some(path)
}

/// Every `NAME` in `_libraries['libamd_smi.so'].NAME` (names may have capitals:
/// `amdsmi_is_P2P_accessible`).
fn bound_names(source: &str) -> Vec<String> {
    const MARK: &str = "_libraries['libamd_smi.so'].";
    let mut names: Vec<String> = source
        .match_indices(MARK)
        .map(|(at, _)| {
            source[at + MARK.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_symbol_the_python_bindings_bind_is_exported() {
    let Some(path) = wrapper() else {
        println!(
            "skipped: AMD's amdsmi package is not installed for python3 (pip install \
             amdsmi==7.0.2, in the test extras) and ZEUS_AMDSMI_WRAPPER is unset"
        );
        return;
    };
    let names = bound_names(&std::fs::read_to_string(&path).unwrap());
    assert!(
        names.len() >= 184,
        "only {} names found in {}",
        names.len(),
        path.display()
    );
    let lib = load();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| unsafe { lib.get::<*const ()>(n.as_bytes()) }.is_err())
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

#[test]
fn unsupported_functions_answer_not_supported_and_leave_arguments_alone() {
    let lib = load();
    // Called with their real signatures, as a caller would; the library need not be initialised.
    // SAFETY: these are the amdsmi.h signatures; the library's definitions read no arguments.
    let fan: Symbol<unsafe extern "C" fn(Handle, u32, *mut i64) -> Status> =
        unsafe { lib.get(b"amdsmi_get_gpu_fan_rpms") }.unwrap();
    let mut rpm = 1234i64;
    let h = &mut rpm as *mut i64 as Handle;
    assert_eq!(unsafe { fan(h, 0, &mut rpm) }, status::NOT_SUPPORTED);
    assert_eq!(rpm, 1234);
    let p2p: Symbol<unsafe extern "C" fn(Handle, Handle, *mut bool) -> Status> =
        unsafe { lib.get(b"amdsmi_is_P2P_accessible") }.unwrap();
    let mut ok = true;
    assert_eq!(
        unsafe { p2p(std::ptr::null_mut(), std::ptr::null_mut(), &mut ok) },
        status::NOT_SUPPORTED
    );
    assert!(ok);
    let free: Symbol<unsafe extern "C" fn(*mut std::ffi::c_void)> =
        unsafe { lib.get(b"amdsmi_free_name_value_pairs") }.unwrap();
    unsafe { free(std::ptr::null_mut()) };
}
