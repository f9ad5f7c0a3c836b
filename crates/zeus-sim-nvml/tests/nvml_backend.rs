//! zeus-core's NVML backend (through nvml-wrapper) against the simulated libnvidia-ml, so the
//! real NVML code path runs without a GPU.

use std::path::PathBuf;
use std::sync::Once;

use zeus_core::device::{nvml, Gpu, GpuError};

fn fake_lib() -> PathBuf {
    // target/<profile>/deps/<test binary> -> target/<profile>/libnvidia_ml.so
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let lib = dir.join("libnvidia_ml.so");
    assert!(lib.is_file(), "{} was not built", lib.display());
    lib
}

static SETUP: Once = Once::new();

/// Point the backend at the fake library, with an A40, a V100 and a P100 under load.
fn setup() -> Vec<std::sync::Arc<dyn Gpu>> {
    SETUP.call_once(|| {
        std::env::set_var("ZEUS_NVML_LIB", fake_lib());
        std::env::set_var("ZEUS_SIM_GPUS", "A40,V100,P100");
        std::env::set_var("ZEUS_SIM_LOAD", "busy");
        std::env::remove_var("ZEUS_SIM_CLOCK");
        std::env::remove_var("ZEUS_SIM_PRIVILEGED");
    });
    nvml::open_all().expect("open the simulated NVML")
}

#[test]
fn discovers_devices_with_simulated_names() {
    let gpus = setup();
    assert_eq!(gpus.len(), 3);
    assert_eq!(gpus[0].name().unwrap(), "NVIDIA A40 (Simulated)");
    assert!(gpus[1].name().unwrap().contains("V100"));
    assert!(gpus[0].uuid().unwrap().starts_with("GPU-"));
    assert_eq!(
        gpus[0].architecture().unwrap(),
        zeus_core::device::Architecture::Ampere
    );
}

#[test]
fn power_limits_round_trip_and_reject_out_of_range() {
    let gpus = setup();
    let a40 = &gpus[0];
    assert_eq!(
        a40.power_management_limit_constraints().unwrap(),
        (100_000, 300_000)
    );
    a40.set_power_management_limit(225_000).unwrap();
    assert_eq!(a40.power_management_limit().unwrap(), 225_000);
    let e = a40.set_power_management_limit(99_000).unwrap_err();
    assert!(matches!(e, GpuError::InvalidArg(_)), "{e:?}");
    a40.reset_power_management_limit().unwrap();
    assert_eq!(a40.power_management_limit().unwrap(), 300_000);
}

#[test]
fn clocks_lists_survive_the_insufficient_size_retry() {
    let gpus = setup();
    let a40 = &gpus[0];
    let mem = a40.supported_memory_clocks().unwrap();
    assert_eq!(mem, vec![7251, 5001, 810, 405]);
    let gfx = a40.supported_graphics_clocks(7251).unwrap();
    assert!(gfx.len() > 16, "more than nvml-wrapper's first guess");
    assert_eq!(gfx[0], 1740);
    a40.set_gpu_locked_clocks(900, 900).unwrap();
    a40.reset_gpu_locked_clocks().unwrap();
    a40.set_memory_locked_clocks(405, 810).unwrap();
    a40.reset_memory_locked_clocks().unwrap();
    a40.set_persistence_mode(true).unwrap();
    assert!(a40.persistence_mode().unwrap());
}

#[test]
fn current_clocks_follow_locks_and_pci_ids_are_one_per_bus() {
    let gpus = setup();
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(
            g.pci_bus_id().unwrap(),
            format!("00000000:{:02X}:00.0", i + 1)
        );
    }
    // The V100 is busy at its default (maximum) power limit: full clocks.
    let v100 = &gpus[1];
    let mem = v100.supported_memory_clocks().unwrap();
    let gfx = v100.supported_graphics_clocks(mem[0]).unwrap();
    assert_eq!(v100.current_clocks_mhz().unwrap(), (gfx[0], mem[0]));
    let locked = gfx[gfx.len() / 2];
    v100.set_gpu_locked_clocks(locked, locked).unwrap();
    assert_eq!(v100.current_clocks_mhz().unwrap(), (locked, mem[0]));
    v100.reset_gpu_locked_clocks().unwrap();
    assert_eq!(v100.current_clocks_mhz().unwrap().0, gfx[0]);
}

#[test]
fn energy_counter_grows_and_p100_has_none() {
    let gpus = setup();
    let e0 = gpus[0].total_energy_consumption().unwrap();
    // Longer than the 100 ms update period of real fidelity (the default).
    std::thread::sleep(std::time::Duration::from_millis(250));
    let e1 = gpus[0].total_energy_consumption().unwrap();
    assert!(e1 > e0, "{e0} -> {e1}");
    assert!(gpus[0].supports_total_energy_consumption().unwrap());
    assert!(!gpus[2].supports_total_energy_consumption().unwrap());
    assert!(matches!(
        gpus[2].total_energy_consumption(),
        Err(GpuError::NotSupported(_))
    ));
    let p = gpus[0].average_power_usage().unwrap();
    assert!(p > 30_000 && p <= 300_000, "{p}");
    // Instant power: the A40 has it, the V100 does not.
    assert!(gpus[0].instant_power_usage().unwrap() > 30_000);
    assert!(matches!(
        gpus[1].instant_power_usage(),
        Err(GpuError::NotSupported(_))
    ));
}

#[test]
fn uninitialized_calls_say_so() {
    // Straight through the C ABI: a call before nvmlInit gets NVML_ERROR_UNINITIALIZED.
    let lib = unsafe { libloading::Library::new(fake_lib()) }.unwrap();
    let count: libloading::Symbol<unsafe extern "C" fn(*mut u32) -> u32> =
        unsafe { lib.get(b"nvmlDeviceGetCount_v2\0") }.unwrap();
    let init: libloading::Symbol<unsafe extern "C" fn() -> u32> =
        unsafe { lib.get(b"nvmlInit_v2\0") }.unwrap();
    let shutdown: libloading::Symbol<unsafe extern "C" fn() -> u32> =
        unsafe { lib.get(b"nvmlShutdown\0") }.unwrap();
    let mut n = 0u32;
    // The backend in this process may hold an init reference already; balance ours.
    unsafe {
        assert_eq!(init(), 0);
        assert_eq!(count(&mut n), 0);
        assert_eq!(n, 3);
        assert_eq!(shutdown(), 0);
    }
}
