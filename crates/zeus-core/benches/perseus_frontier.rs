//! Time to compute the Perseus iteration time–energy frontier of a 4-stage × 8-microbatch
//! synchronous 1F1B pipeline (64 instructions) with 10 frequencies per instruction, at three
//! time quanta (the Python default is 1/500 of the all-max-frequency iteration time).
//! `benchmarks/perseus_frontier.py` times `lowtime` on the same input.
//!
//! Run: `cargo bench -p zeus-core --bench perseus_frontier`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use zeus_core::optimizer::perseus::{compute_frontier, pipeline_1f1b, InstructionKind};

/// Work units of a forward per stage (backward is twice that); stage 2 is the bottleneck.
const FORWARD_WORK: [f64; 4] = [0.9, 1.0, 1.2, 0.8];
/// Share of an instruction's time that scales with the graphics clock.
const COMPUTE_BOUND: f64 = 0.7;
/// Dynamic power (W) at the highest clock.
const DYNAMIC_W: f64 = 172.5;

/// Per instruction, `(time s, energy above idle J)` at 10 clocks from 100 % down to 12 % of
/// the maximum: time grows as `1/f` for the compute-bound share, dynamic power falls as `f^3`
/// (the simulated GPU's model). Returns the options and the all-max iteration time.
fn problem() -> (
    zeus_core::optimizer::perseus::Dag,
    Vec<Vec<(f64, f64)>>,
    f64,
) {
    let (instr, dag) = pipeline_1f1b(4, 8).unwrap();
    let clocks: Vec<f64> = (0..10).map(|k| 1.0 - 0.88 * k as f64 / 9.0).collect();
    let options: Vec<Vec<(f64, f64)>> = instr
        .iter()
        .map(|i| {
            let work = FORWARD_WORK[i.stage]
                * match i.kind {
                    InstructionKind::Forward => 1.0,
                    InstructionKind::Backward => 2.0,
                };
            clocks
                .iter()
                .map(|&f| {
                    let t = work * (COMPUTE_BOUND / f + 1.0 - COMPUTE_BOUND);
                    (t, t * DYNAMIC_W * f.powi(3))
                })
                .collect()
        })
        .collect();
    let fastest: Vec<f64> = options.iter().map(|o| o[0].0).collect();
    let t_max = dag.makespan(&fastest).unwrap();
    (dag, options, t_max)
}

fn bench(c: &mut Criterion) {
    let (dag, options, t_allmax) = problem();
    let mut g = c.benchmark_group("perseus_frontier_4x8_10freqs");
    g.sample_size(10);
    for divisor in [100u32, 500, 2000] {
        let unit = t_allmax / divisor as f64;
        let points = compute_frontier(&dag, &options, unit).unwrap().len();
        g.bench_with_input(
            BenchmarkId::new(format!("unit=T_allmax/{divisor}"), points),
            &unit,
            |b, &unit| b.iter(|| compute_frontier(black_box(&dag), black_box(&options), unit)),
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
