//! zeus-core's AMD backend (`device::amd`, our own FFI loaded with libloading) against the
//! simulated `libamd_smi.so`, so the real AMD code path runs without a GPU: discovery in HIP
//! order, names, PCI ids, power caps, clocks, power and energy, and the serialization of calls
//! into a library that is not thread-safe (AMD SMI 26.0, the simulator's default version).

mod common;

use std::sync::{Arc, Once, OnceLock};

use libloading::Library;
use zeus_core::device::{amd, Architecture, Gpu, GpuError, Vendor};

static SETUP: Once = Once::new();
static CONTROL: OnceLock<Library> = OnceLock::new();
/// Taken by the tests that change the first GPU's clocks (they would undo each other's locks)
/// and by the one that counts overlapping calls (the clock tests call the library directly,
/// outside the backend's lock).
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The backend's devices: an MI300X and an MI250X (two dies), busy, in a library that records
/// overlapping calls and makes them likely (each call lingers).
fn setup() -> Vec<Arc<dyn Gpu>> {
    SETUP.call_once(|| {
        std::env::set_var("ZEUS_AMDSMI_LIB", common::fake_lib());
        common::sim_env(&[
            ("ZEUS_SIM_GPUS", "MI300X,MI250X"),
            ("ZEUS_SIM_LOAD", "busy"),
            ("ZEUS_SIM_AMDSMI_THREAD_UNSAFE", "1"),
        ]);
        // The same file the backend loads: the loader hands back the same library.
        // SAFETY: the simulated library's initialisers only set up Rust statics.
        let lib = unsafe { Library::new(common::fake_lib()) }.expect("load libamd_smi.so");
        assert!(CONTROL.set(lib).is_ok());
    });
    amd::open_all().expect("open the simulated amdsmi")
}

fn true_energy(index: u32) -> f64 {
    let lib = CONTROL.get().unwrap();
    // SAFETY: `zeusSimAmdTrueEnergy(u32, *mut f64) -> u32`, as the crate exports it.
    unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn(u32, *mut f64) -> u32> =
            lib.get(b"zeusSimAmdTrueEnergy").unwrap();
        let mut j = 0.0;
        assert_eq!(f(index, &mut j), 0);
        j
    }
}

fn overlaps() -> u64 {
    let lib = CONTROL.get().unwrap();
    // SAFETY: `zeusSimAmdOverlaps() -> u64`.
    unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn() -> u64> =
            lib.get(b"zeusSimAmdOverlaps").unwrap();
        f()
    }
}

#[test]
fn discovers_the_simulated_boards() {
    let gpus = setup();
    assert_eq!(gpus.len(), 3);
    assert_eq!(gpus[0].name().unwrap(), "AMD Instinct MI300X (Simulated)");
    assert!(gpus[1].name().unwrap().contains("MI250X"));
    assert_eq!(gpus[0].architecture().unwrap(), Architecture::Cdna3);
    assert_eq!(gpus[2].architecture().unwrap(), Architecture::Cdna2);
    for g in &gpus {
        assert_eq!(g.vendor(), Vendor::Amd);
        assert!(g.uuid().unwrap().starts_with("GPU-"));
        assert!(matches!(
            g.persistence_mode(),
            Err(GpuError::NotSupported(_))
        ));
    }
    let ids: Vec<String> = gpus.iter().map(|g| g.pci_bus_id().unwrap()).collect();
    assert_eq!(ids[0].len(), "00000000:01:00.0".len(), "{ids:?}");
    assert!(ids[0] != ids[1] && ids[1] != ids[2], "{ids:?}");
}

#[test]
fn power_caps_round_trip_in_milliwatts() {
    let gpus = setup();
    let mi300 = &gpus[0];
    assert_eq!(
        mi300.power_management_limit_constraints().unwrap(),
        (200_000, 750_000)
    );
    assert_eq!(mi300.power_management_limit_default().unwrap(), 750_000);
    mi300.set_power_management_limit(500_000).unwrap();
    assert_eq!(mi300.power_management_limit().unwrap(), 500_000);
    let e = mi300.set_power_management_limit(900_000).unwrap_err();
    assert!(matches!(e, GpuError::InvalidArg(_)), "{e:?}");
    assert!(e.to_string().contains("amdsmi_set_power_cap"), "{e}");
    mi300.reset_power_management_limit().unwrap();
    assert_eq!(mi300.power_management_limit().unwrap(), 750_000);
}

#[test]
fn each_board_reports_the_power_it_has() {
    let gpus = setup();
    // MI300X: current socket power only; MI250X: average only, on the even die.
    assert!(gpus[0].instant_power_usage().unwrap() > 140_000);
    assert!(matches!(
        gpus[0].average_power_usage(),
        Err(GpuError::NotSupported(m)) if m.contains("average_socket_power")
    ));
    assert!(gpus[1].average_power_usage().unwrap() > 2 * 45_000);
    assert!(matches!(
        gpus[1].instant_power_usage(),
        Err(GpuError::NotSupported(_))
    ));
    assert_eq!(gpus[2].average_power_usage().unwrap(), 0);
}

#[test]
fn energy_follows_the_truth() {
    let gpus = setup();
    let mi300 = &gpus[0];
    // Each counter read between two reads of the truth: other tests' calls may hold the
    // library's lock for milliseconds between any two calls here.
    let bracket = || {
        let before = true_energy(0);
        let mj = mi300.total_energy_consumption().unwrap();
        (before, mj, true_energy(0))
    };
    let (t0a, e0, t0b) = bracket();
    let start = std::time::Instant::now();
    // Wait for about 0.15 s of energy (a condition on the device, not a fixed sleep).
    while mi300.total_energy_consumption().unwrap() - e0 < 100_000 {
        assert!(start.elapsed().as_secs() < 30, "the counter does not move");
        std::thread::yield_now();
    }
    let (t1a, e1, t1b) = bracket();
    let counted = (e1 - e0) as f64 / 1000.0;
    // The counter shows the last 1 ms update: up to ~0.75 J behind at ~750 W, at each end.
    let (lo, hi) = (t1a - t0b - 1.0, t1b - t0a + 1.0);
    assert!(
        counted > lo && counted < hi,
        "{counted} J outside [{lo}, {hi}] J"
    );
    // The odd MI250X die counts nothing: its energy is on the even die.
    let odd = gpus[2].total_energy_consumption().unwrap();
    assert_eq!(odd, 0);
}

/// Whether the library reports domain `clk` (0 graphics, 4 memory) of its first GPU locked.
fn locked(clk: u32) -> bool {
    let lib = CONTROL.get().unwrap();
    // SAFETY: amdsmi's own signatures; the handle is the first processor of the first socket.
    unsafe {
        type List = unsafe extern "C" fn(*mut u32, *mut zeus_core::device::amd::ffi::Handle) -> u32;
        type Procs = unsafe extern "C" fn(
            zeus_core::device::amd::ffi::Handle,
            *mut u32,
            *mut zeus_core::device::amd::ffi::Handle,
        ) -> u32;
        type Info = unsafe extern "C" fn(
            zeus_core::device::amd::ffi::Handle,
            u32,
            *mut zeus_core::device::amd::ffi::ClkInfo,
        ) -> u32;
        let sockets: libloading::Symbol<List> = lib.get(b"amdsmi_get_socket_handles").unwrap();
        let procs: libloading::Symbol<Procs> = lib.get(b"amdsmi_get_processor_handles").unwrap();
        let info: libloading::Symbol<Info> = lib.get(b"amdsmi_get_clock_info").unwrap();
        let (mut n, mut s) = (1u32, std::ptr::null_mut());
        assert_eq!(sockets(&mut n, &mut s), 0);
        let (mut m, mut p) = (1u32, std::ptr::null_mut());
        assert_eq!(procs(s, &mut m, &mut p), 0);
        let mut c = zeus_core::device::amd::ffi::ClkInfo::default();
        assert_eq!(info(p, clk, &mut c), 0);
        c.clk_locked != 0
    }
}

#[test]
fn resetting_one_clock_domain_keeps_the_other_locked() {
    // amdsmi resets both domains at once (perf level AUTO); the backend locks the other again,
    // so one holder's reset does not undo another's lock (zeusd's clients hold domains).
    let gpus = setup();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let g = &gpus[0];
    g.set_memory_locked_clocks(1300, 1300).unwrap();
    g.set_gpu_locked_clocks(500, 1200).unwrap();
    g.reset_gpu_locked_clocks().unwrap();
    assert!(!locked(0) && locked(4), "graphics reset, memory kept");
    g.set_gpu_locked_clocks(500, 1200).unwrap();
    g.reset_memory_locked_clocks().unwrap();
    assert!(locked(0) && !locked(4), "memory reset, graphics kept");
    let (now, _) = g.current_clocks_mhz().unwrap();
    assert!(now <= 1200, "{now}");
    g.reset_gpu_locked_clocks().unwrap();
    assert!(!locked(0) && !locked(4));
}

#[test]
fn clock_ranges_lock_and_reset() {
    let gpus = setup();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let g = &gpus[0];
    let mem = g.supported_memory_clocks().unwrap();
    assert_eq!(mem, vec![1300]);
    let gfx = g.supported_graphics_clocks(1300).unwrap();
    assert_eq!(gfx.first(), Some(&2100));
    assert!(gfx.windows(2).all(|w| w[0] > w[1]));
    g.set_gpu_locked_clocks(500, 1200).unwrap();
    let (now, _) = g.current_clocks_mhz().unwrap();
    assert!(now <= 1200, "{now}");
    g.reset_gpu_locked_clocks().unwrap();
    let (now, _) = g.current_clocks_mhz().unwrap();
    assert!(now > 1200, "{now}");
    assert!(g.temperature_c().unwrap() > 30);
    let m = g.memory_info().unwrap();
    assert!(m.total > m.used && m.used > 0);
    assert!(g.utilization_rates().unwrap().gpu > 0);
}

#[test]
fn calls_into_a_thread_unsafe_library_never_overlap() {
    let gpus = setup();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    assert!(amd::needs_serializing(amd::library_version().unwrap()));
    let before = overlaps();
    std::thread::scope(|s| {
        for k in 0..8 {
            let g = gpus[k % gpus.len()].clone();
            s.spawn(move || {
                for _ in 0..40 {
                    let _ = g.total_energy_consumption();
                    let _ = g.average_power_usage();
                    let _ = g.instant_power_usage();
                    let _ = g.power_management_limit();
                }
            });
        }
    });
    assert_eq!(overlaps(), before, "overlapping calls into AMD SMI 26.0");
}
