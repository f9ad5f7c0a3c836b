//! Cost of the power-limit optimum selectors on realistic profiles (9 limits, as an A40 scanned
//! from 300 W to 100 W in 25 W steps) and on long ones (every watt of a 700 W H100 range).
//!
//! Run: `cargo bench -p zeus-core --bench selectors`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use zeus_core::optimizer::power_limit::{Measurement, Selector};

/// A profile shaped like the measured ones: time grows and energy dips as the limit drops.
fn profile(n: usize) -> Vec<Measurement> {
    (0..n)
        .map(|i| {
            let pl = 300 + n as u32 - i as u32;
            let x = i as f64 / n as f64;
            let time = 9.0 * (1.0 + 1.5 * x * x);
            let energy = 2000.0 * (1.0 - 0.3 * x + 0.6 * x * x * x);
            Measurement::new(pl, energy, time)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let selectors = [
        ("energy", Selector::Energy),
        ("time", Selector::Time),
        ("zeus_cost", Selector::zeus_cost(0.5, 4).unwrap()),
        ("max_slowdown", Selector::max_slowdown(1.1).unwrap()),
    ];
    let mut group = c.benchmark_group("select");
    for n in [9usize, 600] {
        let p = profile(n);
        for (name, sel) in &selectors {
            group.bench_with_input(BenchmarkId::new(*name, n), &p, |b, p| {
                b.iter(|| black_box(sel.select(black_box(p)).unwrap()))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
