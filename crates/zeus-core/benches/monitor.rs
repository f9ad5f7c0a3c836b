//! Cost of the measurement hot paths in Rust: a `begin_window` + `end_window` pair (1 and 4
//! GPUs, simulated, with and without the device reads' share), counter arithmetic, and
//! integrating a power timeline.
//!
//! The pair is timed twice: on ideal simulated A40s (exact, free readings: the bookkeeping
//! alone) and on calibrated H100s (`Fidelity::Real`: an energy read costs 3.5 ms, as on the
//! measured board) read through the sampler, which is what a user gets on real hardware.
//!
//! Run: `cargo bench -p zeus-core --bench monitor`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use zeus_core::device::sim::{preset, Fidelity, Load, SimCluster, SimConfig};
use zeus_core::device::Gpus;
use zeus_core::monitor::counter::counter_delta_joules;
use zeus_core::monitor::{EnergyMonitor, ReadMode, Timeline};

fn sim_gpus(model: &str, n: usize, fidelity: Fidelity) -> Gpus {
    let cluster = SimCluster::new(SimConfig {
        presets: vec![preset::find(model).unwrap(); n],
        virtual_clock: false,
        privileged: true,
        workload: None,
        fidelity,
        load: Load::Busy,
        ..SimConfig::default()
    });
    cluster.gpus()
}

fn window_pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("window pair (begin + end)");
    for (model, n) in [("H100", 1usize), ("H100", 4), ("MI300X", 1), ("MI300X", 4)] {
        let gpus = sim_gpus(model, n, Fidelity::Real);
        let mut m =
            EnergyMonitor::with_reads(gpus.clone(), None, None, None, ReadMode::Cached).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500)); // the sampler's first anchors
        m.begin_window("step").unwrap();
        let _ = m.end_window("step", false, None).unwrap();
        g.bench_with_input(
            BenchmarkId::new(format!("calibrated {model}s, sampler"), n),
            &n,
            |b, _| {
                b.iter(|| {
                    m.begin_window(black_box("step")).unwrap();
                    black_box(m.end_window(black_box("step"), false, None).unwrap());
                })
            },
        );
    }
    for n in [1usize, 4] {
        let gpus = sim_gpus("A40", n, Fidelity::Ideal);
        let mut m = EnergyMonitor::new(gpus.clone(), None, None, None).unwrap();
        // Warm the short-window warning so the loop measures the steady state.
        m.begin_window("step").unwrap();
        let _ = m.end_window("step", false, None).unwrap();
        g.bench_with_input(BenchmarkId::new("simulated GPUs", n), &n, |b, _| {
            b.iter(|| {
                m.begin_window(black_box("step")).unwrap();
                black_box(m.end_window(black_box("step"), false, None).unwrap());
            })
        });
        // The device reads alone (2 clock reads + 2n counter reads), to show the bookkeeping's
        // share of the pair.
        g.bench_with_input(BenchmarkId::new("device reads only", n), &n, |b, &n| {
            b.iter(|| {
                for _ in 0..2 {
                    black_box(gpus.now());
                    for i in 0..n {
                        black_box(gpus.device(i).unwrap().total_energy_consumption().unwrap());
                    }
                }
            })
        });
    }
    g.finish();
}

fn arithmetic(c: &mut Criterion) {
    c.bench_function("counter delta (wrap-safe)", |b| {
        b.iter(|| {
            black_box(counter_delta_joules(
                black_box(u64::MAX - 5),
                black_box(1000),
            ))
        })
    });
    let mut tl = Timeline::new(4, 100_000);
    for k in 0..100_000u32 {
        tl.push(k as f64 * 0.001, &[k, k + 1, k + 2, k + 3]);
    }
    c.bench_function("timeline energy over 1000 samples x 4 GPUs", |b| {
        b.iter(|| black_box(tl.energy(black_box(50.0005), black_box(51.0005))))
    });
}

criterion_group!(benches, window_pair, arithmetic);
criterion_main!(benches);
