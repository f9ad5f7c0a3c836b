//! What the integration tests share: where the library under test is.

use std::path::PathBuf;

/// The `libamd_smi.so` built with this test binary. `cargo test` builds the crate's cdylib into
/// `target/<profile>/deps/` but copies it up to `target/<profile>/` only on `cargo build`, so
/// the copy up there may be stale or missing: take the one beside the test binary first.
pub fn fake_lib() -> PathBuf {
    // target/<profile>/deps/<test binary>
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let candidates = [
        deps.join("libamd_smi.so"),
        deps.parent().unwrap().join("libamd_smi.so"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| panic!("libamd_smi.so was not built: none of {candidates:?}"))
}

/// The simulator's configuration for this test process: exactly the `ZEUS_SIM_*` variables
/// given (name, value), every other one the library reads unset, so that the caller's
/// environment cannot change what a test sees.
// Each test binary compiles this module; the one that only checks exports does not need it.
#[allow(dead_code)]
pub fn sim_env(set: &[(&str, &str)]) {
    for v in [
        "ZEUS_SIM_GPUS",
        "ZEUS_SIM_LOAD",
        "ZEUS_SIM_CLOCK",
        "ZEUS_SIM_PRIVILEGED",
        "ZEUS_SIM_SHARED",
        "ZEUS_SIM_AMDSMI_VERSION",
        "ZEUS_SIM_AMD_HIP_ORDER",
        "ZEUS_SIM_AMDSMI_THREAD_UNSAFE",
    ] {
        std::env::remove_var(v);
    }
    for (k, v) in set {
        std::env::set_var(k, v);
    }
}
