//! When building the Python extension (feature `python`), also build the two native artifacts
//! the wheel ships next to it, and copy them into `python/zeus/_bin/`:
//! - `libnvidia-ml.so.1`: the simulated GPU speaking the NVML C ABI (crate `zeus-sim-nvml`);
//! - `libamd_smi.so`: the simulated GPU speaking the amdsmi C ABI (crate `zeus-sim-amdsmi`);
//! - `zeus-monitor`: the standalone power-logging binary and Prometheus exporter (crate
//!   `zeus-monitor`);
//! - `zeusd`: the GPU settings daemon (crate `zeusd`).
//!
//! maturin builds one crate, so a nested `cargo build` of those crates (in their own target
//! directory, so the outer build's lock is not contended) is the way to get them into the same
//! `pip install .`. Set `ZEUS_SKIP_BUNDLE=1` to skip it.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ZEUS_SKIP_BUNDLE");
    if std::env::var_os("CARGO_FEATURE_PYTHON").is_none()
        || std::env::var_os("ZEUS_SKIP_BUNDLE").is_some()
    {
        return;
    }
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.join("../..").canonicalize().unwrap();
    for dir in [
        "crates/zeus-core/src",
        "crates/zeus-sim-nvml/src",
        "crates/zeus-sim-amdsmi/src",
        "crates/zeus-monitor/src",
        "crates/zeusd/src",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let release = std::env::var("PROFILE")
        .map(|p| p == "release")
        .unwrap_or(false);
    let target_dir = root.join("target").join("bundle");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "-p",
            "zeus-sim-nvml",
            "-p",
            "zeus-sim-amdsmi",
            "-p",
            "zeus-monitor",
            "-p",
            "zeusd",
            "--target-dir",
        ])
        .arg(&target_dir);
    if release {
        cmd.arg("--release");
    }
    // The nested build must not see this build script's environment: inherited
    // CARGO_FEATURE_PYTHON would make the nested zeus-core build script recurse (and deadlock on
    // the target-dir lock), and maturin's flags are meant for the extension module only.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let keep = key == "CARGO_HOME" || key == "CARGO" || key == "CARGO_NET_OFFLINE";
        if !keep
            && (key.starts_with("CARGO_")
                || key.starts_with("RUSTC")
                || key.starts_with("PYO3_")
                || key.starts_with("DEP_")
                || matches!(
                    key.as_str(),
                    "RUSTFLAGS"
                        | "MAKEFLAGS"
                        | "MFLAGS"
                        | "TARGET"
                        | "HOST"
                        | "OUT_DIR"
                        | "PROFILE"
                        | "OPT_LEVEL"
                        | "DEBUG"
                        | "NUM_JOBS"
                ))
        {
            cmd.env_remove(&key);
        }
    }
    // Belt and braces: the nested zeus-core build script must never bundle again.
    cmd.env("ZEUS_SKIP_BUNDLE", "1");
    let status = cmd
        .status()
        .expect("could not run cargo to build the simulated libraries, zeus-monitor and zeusd");
    assert!(
        status.success(),
        "building the simulated libraries, zeus-monitor and zeusd failed"
    );
    let built = target_dir.join(if release { "release" } else { "debug" });
    let bin_dir = root.join("python").join("zeus").join("_bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    for (from, to) in [
        ("libnvidia_ml.so", "libnvidia-ml.so.1"),
        ("libamd_smi.so", "libamd_smi.so"),
        ("zeus-monitor", "zeus-monitor"),
        ("zeusd", "zeusd"),
    ] {
        let dest = bin_dir.join(to);
        // Replace atomically so a running process that has the old file mapped is unaffected.
        let tmp = bin_dir.join(format!(".{to}.tmp"));
        std::fs::copy(built.join(from), &tmp)
            .unwrap_or_else(|e| panic!("copying {from} into {}: {e}", bin_dir.display()));
        std::fs::rename(&tmp, &dest).unwrap();
    }
}
