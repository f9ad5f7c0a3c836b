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
