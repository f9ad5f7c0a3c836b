//! The serving ledger's own work per engine step (no measurement: the step's energy is given),
//! at 1, 64 and 256 requests per step, for each method. With `work`, the cost of attributing
//! each span's steps and of fitting between counter updates is spread over the steps that
//! pay it, as a serving loop sees it: every iteration is one step, its `settle`, and every
//! 100 ms of steps a counter update offered to the anchored fit.
//!
//! Run: `cargo bench -p zeus-core --bench serving`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use zeus_core::monitor::serving::{Cut, Ledger, LedgerOptions, Method, Settled, Work};

/// A GPU whose counter updates every 100 ms at 400 W: what the sampler would offer.
struct Counter {
    now: f64,
}

impl Settled for Counter {
    fn energy(&mut self, _: f64, _: f64) -> Option<(f64, f64)> {
        None
    }
    fn anchors(&mut self, _: usize, after: f64) -> Option<Vec<(f64, f64, f64)>> {
        let mut t = (after * 10.0).floor() / 10.0 + 0.1;
        let mut out = Vec::new();
        while t <= self.now - 0.05 {
            out.push((t, 400.0 * t, 0.0005));
            t += 0.1;
        }
        Some(out)
    }
    fn estimate(&mut self, _: f64, _: f64) -> Option<(f64, f64)> {
        None
    }
}

fn step(c: &mut Criterion) {
    let mut group = c.benchmark_group("ledger_step");
    for method in [Method::Time, Method::Tokens, Method::Work] {
        for n in [1usize, 64, 256] {
            let opts = LedgerOptions {
                method,
                min_spans: 4,
                ..LedgerOptions::default()
            };
            let mut ledger = Ledger::new(1, 0.0, opts).unwrap();
            let slots: Vec<u32> = (0..n).map(|i| ledger.slot(&format!("r{i}"))).collect();
            let mut work: Vec<(u32, Work)> = slots
                .iter()
                .map(|&k| {
                    (
                        k,
                        Work {
                            prefill: 0.0,
                            decode: 1.0,
                            kv: 500.0,
                        },
                    )
                })
                .collect();
            let seconds = 0.02;
            let mut t = 0.0;
            let mut counter = Counter { now: 0.0 };
            let mut k = 0u64;
            group.bench_with_input(BenchmarkId::new(method.name(), n), &n, |b, _| {
                b.iter(|| {
                    k += 1;
                    // Contexts grow; each step one request prefills a chunk (a division
                    // per request here would cost as much as the ledger).
                    let p = k as usize % n;
                    work[(p + n - 1) % n].1.prefill = 0.0;
                    work[p].1.prefill = 256.0;
                    for (_, w) in work.iter_mut() {
                        w.kv += 1.0;
                    }
                    t += seconds;
                    counter.now = t;
                    let e = [8.0 + 0.01 * n as f64];
                    let cut = Cut {
                        seconds,
                        energy: &e,
                        bound: &[0.05],
                    };
                    ledger.step_slots(cut, t, black_box(&work)).unwrap();
                    ledger.settle(&mut counter);
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
