//! Cost of one energy-counter read: in-process simulated GPU, and the NVML backend against the
//! simulated libnvidia-ml (compared with calling the C function directly, which is the floor).
//! Also a power read on a private simulated GPU and on one shared through `ZEUS_SIM_SHARED`
//! (the sharing's own cost: the state's version checked in the mapped file).
//!
//! Run: `cargo build --release -p zeus-sim-nvml && cargo bench -p zeus-core --bench device_read`

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use zeus_core::device::sim::{preset, Load, SimCluster, SimConfig};
use zeus_core::device::{nvml, Gpu};

fn fake_lib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ZEUS_NVML_LIB") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.parent()?.join("libnvidia_ml.so");
    lib.is_file().then_some(lib)
}

fn bench(c: &mut Criterion) {
    let cluster = SimCluster::new(SimConfig {
        presets: vec![preset::find("A40").unwrap()],
        virtual_clock: false,
        privileged: true,
        workload: None,
        fidelity: zeus_core::device::sim::Fidelity::Ideal,
        load: Load::Busy,
        ..SimConfig::default()
    });
    let sim: Arc<dyn Gpu> = cluster.devices()[0].clone();
    c.bench_function("energy read: in-process simulated GPU", |b| {
        b.iter(|| black_box(sim.total_energy_consumption().unwrap()))
    });
    c.bench_function("power read: in-process simulated GPU, private", |b| {
        b.iter(|| black_box(sim.average_power_usage().unwrap()))
    });
    let dir = tempfile::tempdir().unwrap();
    let shared_cluster = SimCluster::open(SimConfig {
        presets: vec![preset::find("A40").unwrap()],
        fidelity: zeus_core::device::sim::Fidelity::Ideal,
        load: Load::Busy,
        shared: Some(dir.path().join("gpus")),
        ..SimConfig::default()
    })
    .unwrap();
    let shared: Arc<dyn Gpu> = shared_cluster.devices()[0].clone();
    c.bench_function("power read: in-process simulated GPU, shared file", |b| {
        b.iter(|| black_box(shared.average_power_usage().unwrap()))
    });
    c.bench_function("energy read: in-process simulated GPU, shared file", |b| {
        b.iter(|| black_box(shared.total_energy_consumption().unwrap()))
    });
    // A read right after another process's write (here: another set on the same file) copies
    // the record again under the lock: the worst case of a read.
    let writer = SimCluster::open(SimConfig {
        presets: vec![preset::find("A40").unwrap()],
        fidelity: zeus_core::device::sim::Fidelity::Ideal,
        shared: Some(dir.path().join("gpus")),
        ..SimConfig::default()
    })
    .unwrap();
    let w = writer.devices()[0].clone();
    c.bench_function(
        "set load + power read seen from another set, shared file",
        |b| {
            b.iter(|| {
                w.set_load(Load::Busy);
                black_box(shared.average_power_usage().unwrap())
            })
        },
    );
    c.bench_function("set load alone, shared file", |b| {
        b.iter(|| w.set_load(Load::Busy))
    });

    let Some(lib) = fake_lib() else {
        eprintln!("simulated libnvidia_ml.so not built; skipping the NVML benchmarks");
        return;
    };
    std::env::set_var("ZEUS_NVML_LIB", &lib);
    std::env::set_var("ZEUS_SIM_LOAD", "busy");
    let gpus = nvml::open_all().expect("open the simulated NVML");
    c.bench_function(
        "energy read: NVML backend (nvml-wrapper) on fake lib",
        |b| b.iter(|| black_box(gpus[0].total_energy_consumption().unwrap())),
    );

    // The floor: the same C function called directly, handle looked up once.
    type GetHandle = unsafe extern "C" fn(u32, *mut *const std::ffi::c_void) -> u32;
    type GetEnergy = unsafe extern "C" fn(*const std::ffi::c_void, *mut u64) -> u32;
    let raw = unsafe { libloading::Library::new(&lib) }.unwrap();
    let get_handle: libloading::Symbol<GetHandle> =
        unsafe { raw.get(b"nvmlDeviceGetHandleByIndex_v2\0") }.unwrap();
    let get_energy: libloading::Symbol<GetEnergy> =
        unsafe { raw.get(b"nvmlDeviceGetTotalEnergyConsumption\0") }.unwrap();
    let mut handle = std::ptr::null();
    assert_eq!(unsafe { get_handle(0, &mut handle) }, 0);
    c.bench_function("energy read: C function called directly", |b| {
        b.iter(|| {
            let mut e = 0u64;
            unsafe { get_energy(handle, &mut e) };
            black_box(e)
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
