//! The AMD backend with a thread-safe library (AMD SMI 26.2, ROCm 7.2) whose HIP order runs
//! backwards to PCI order (as on MI350X in SPX/NPS1): calls are not serialized, and devices
//! come in HIP order. Its own test binary, since both are read once per process.

mod common;

use libloading::Library;
use zeus_core::device::amd;

#[test]
fn hip_order_and_no_serialization_on_a_thread_safe_library() {
    std::env::set_var("ZEUS_AMDSMI_LIB", common::fake_lib());
    common::sim_env(&[
        ("ZEUS_SIM_GPUS", "MI300X,MI210"),
        ("ZEUS_SIM_AMDSMI_VERSION", "26.2.0"),
        ("ZEUS_SIM_AMD_HIP_ORDER", "reversed"),
        ("ZEUS_SIM_AMDSMI_THREAD_UNSAFE", "1"),
    ]);
    let gpus = amd::open_all().unwrap();
    assert_eq!(amd::library_version().unwrap(), (26, 2, 0));
    assert!(!amd::needs_serializing((26, 2, 0)));
    // HIP numbers the MI210 (second on the bus) first.
    assert!(gpus[0].name().unwrap().contains("MI210"));
    assert!(gpus[1].name().unwrap().contains("MI300X"));
    assert!(gpus[0].pci_bus_id().unwrap() > gpus[1].pci_bus_id().unwrap());
    // Unserialized calls from several threads do overlap in the library (it lingers in each):
    // the lock is taken only where the version needs it.
    // SAFETY: the same library the backend loaded; `zeusSimAmdOverlaps() -> u64`.
    let lib = unsafe { Library::new(common::fake_lib()) }.unwrap();
    let overlaps = || unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn() -> u64> =
            lib.get(b"zeusSimAmdOverlaps").unwrap();
        f()
    };
    let start = std::time::Instant::now();
    while overlaps() == 0 {
        assert!(start.elapsed().as_secs() < 60, "no overlap in a minute");
        std::thread::scope(|s| {
            for g in gpus.iter().cycle().take(4) {
                s.spawn(move || {
                    for _ in 0..20 {
                        let _ = g.total_energy_consumption();
                    }
                });
            }
        });
    }
}
