//! The trace-driven simulator: parsing the traces, building a job's table, and a whole
//! simulation of the Zeus policy (2·|B|·|P| recurrences, one call) and of the baseline.
//!
//! Uses the measured traces in `ZEUS_TRACE_DIR` (default `/work/shared/data/zeus-traces`) when
//! present, else a synthetic trace of the same shape (15 batch sizes × 7 power limits, 5 runs).
//!
//! Run: `cargo bench -p zeus-core --bench simulate`

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use zeus_core::optimizer::recurring::simulator::trace::{
    parse_power, parse_train, PowerRow, TrainRow,
};
use zeus_core::optimizer::recurring::simulator::{
    builtin_job, default_recurrences, JobTable, Knobs,
};

fn synthetic() -> (String, String) {
    let mut train = String::from(
        "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n",
    );
    let mut power = String::from(
        "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n",
    );
    for i in 0..15u32 {
        let bs = 2 + 14 * i;
        for run in 0..5 {
            // Small and large batch sizes converge late or never.
            let x = (i as f64 - 6.0).abs();
            let te = if x > 6.0 && run % 2 == 0 {
                String::new()
            } else {
                format!("{}", 9 + (x as u32) + run % 2)
            };
            train.push_str(&format!(
                "librispeech,deepspeech2,{bs},adamw,0.001,{run},40.0,{te}\n"
            ));
        }
        for pl in (100..=250).step_by(25) {
            let t = 6000.0 / (1.0 + i as f64) * (1.0 + (250 - pl) as f64 / 300.0);
            let p = 0.8 * pl as f64;
            power.push_str(&format!(
                "librispeech,deepspeech2,{bs},adamw,{pl},{t},{p}\n"
            ));
        }
    }
    (train, power)
}

fn traces() -> (String, String, &'static str) {
    let dir = PathBuf::from(
        std::env::var("ZEUS_TRACE_DIR").unwrap_or_else(|_| "/work/shared/data/zeus-traces".into()),
    );
    match (
        std::fs::read_to_string(dir.join("summary_train.csv")),
        std::fs::read_to_string(dir.join("summary_power_v100.csv")),
    ) {
        (Ok(t), Ok(p)) => (t, p, "v100-trace"),
        _ => {
            let (t, p) = synthetic();
            (t, p, "synthetic")
        }
    }
}

fn bench(c: &mut Criterion) {
    let (train_text, power_text, source) = traces();
    let mut g = c.benchmark_group(format!("simulate/{source}"));
    g.bench_function("parse_traces", |b| {
        b.iter(|| {
            let t = parse_train("summary_train.csv", black_box(&train_text)).unwrap();
            let p = parse_power("summary_power.csv", black_box(&power_text)).unwrap();
            (t.len(), p.len())
        })
    });
    let train: Vec<TrainRow> = parse_train("t", &train_text).unwrap();
    let power: Vec<PowerRow> = parse_power("p", &power_text).unwrap();
    let mut job = builtin_job("librispeech").unwrap();
    job.default_bs = 192;
    g.bench_function("build_table", |b| {
        b.iter(|| JobTable::build(black_box(&job), &train, &power).unwrap())
    });
    let table = JobTable::build(&job, &train, &power).unwrap();
    let recurrences = default_recurrences(&table);
    for policy in ["zeus", "default"] {
        g.bench_with_input(
            BenchmarkId::new(policy, format!("{recurrences}rec")),
            &policy,
            |b, &policy| {
                let mut seed = 0u64;
                b.iter(|| {
                    seed += 1;
                    let knobs = Knobs {
                        eta: 0.5,
                        beta: 2.0,
                        recurrences,
                        seed,
                    };
                    let h = if policy == "zeus" {
                        table.simulate_zeus(knobs)
                    } else {
                        table.simulate_default(knobs)
                    };
                    h.unwrap().len()
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
