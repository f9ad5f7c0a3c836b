use super::policy::BatchSizePolicy;
use super::table::JobSpec;
use super::trace::{parse_power, parse_train};
use super::*;
use crate::optimizer::recurring::JitPowerLimit;

/// Batch sizes 8, 16, 32 at power limits 100 and 200 W. 16 is the cheapest and always reaches
/// the target at epoch 2; 8 needs 4 or 6 epochs; 32 never reaches it within 10 epochs.
fn table() -> JobTable {
    let mut train = String::from(
        "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n",
    );
    for (bs, te) in [(8, "4"), (8, "6"), (16, "2"), (16, "2"), (32, ""), (32, "")] {
        train.push_str(&format!("d,n,{bs},adam,0.1,1,0.5,{te}\n"));
        // A row at another target metric must be ignored.
        train.push_str(&format!("d,n,{bs},adam,0.1,1,0.9,\n"));
    }
    let mut power = String::from(
        "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n",
    );
    for bs in [8, 16, 32] {
        power.push_str(&format!(
            "d,n,{bs},adam,100,{},80\n",
            20.0 / bs as f64 * 8.0
        ));
        power.push_str(&format!(
            "d,n,{bs},adam,200,{},150\n",
            15.0 / bs as f64 * 8.0
        ));
    }
    let job = JobSpec {
        dataset: "d".into(),
        network: "n".into(),
        optimizer: "adam".into(),
        target_metric: 0.5,
        max_epochs: 10,
        default_bs: 8,
    };
    JobTable::build(
        &job,
        &parse_train("t.csv", &train).unwrap(),
        &parse_power("p.csv", &power).unwrap(),
    )
    .unwrap()
}

fn knobs(seed: u64) -> Knobs {
    Knobs {
        eta: 0.5,
        beta: 2.0,
        recurrences: 30,
        seed,
    }
}

#[test]
fn table_joins_and_indexes() {
    let t = table();
    assert_eq!(t.batch_size_list(), vec![8, 16, 32]);
    assert_eq!(t.max_power, 200.0);
    assert_eq!(t.batch_sizes[0].paths, vec![Some(4.0), Some(6.0)]);
    let e = t.batch_sizes[1].at(200).unwrap();
    assert_eq!(e.energy, 7.5 * 150.0);
    // Profiling epoch: mean over power limits.
    assert_eq!(t.batch_sizes[1].profile_time, (10.0 + 7.5) / 2.0);
}

#[test]
fn run_path_caps_epochs_by_cost() {
    let t = table();
    // bs 8 at 200 W: 15 s, 2250 J per epoch; cost per epoch 0.5*2250 + 0.5*200*15 = 2625.
    let (e, time, ok) = t
        .run_path(0, 200, 1, f64::INFINITY, 0.5, false)
        .unwrap()
        .unwrap();
    assert_eq!((e, time, ok), (6.0 * 2250.0, 6.0 * 15.0, true));
    // A cap of 5 epochs stops path 1 (6 epochs) after 5.
    let (e, _, ok) = t
        .run_path(0, 200, 1, 5.5 * 2625.0, 0.5, false)
        .unwrap()
        .unwrap();
    assert_eq!((e, ok), (5.0 * 2250.0, false));
    // Less than one epoch: the run never starts.
    assert_eq!(t.run_path(0, 200, 1, 2000.0, 0.5, false).unwrap(), None);
    // Profiling: first epoch is the mean over power limits.
    let (e, _, _) = t
        .run_path(0, 200, 0, f64::INFINITY, 0.5, true)
        .unwrap()
        .unwrap();
    let first = (20.0 * 80.0 + 15.0 * 150.0) / 2.0;
    assert!((e - (first + 3.0 * 2250.0)).abs() < 1e-9);
    assert!(t.run_path(0, 150, 0, f64::INFINITY, 0.5, false).is_err());
}

#[test]
fn zeus_converges_to_cheapest_and_beats_default() {
    let t = table();
    for seed in 0..5 {
        let h = t.simulate_zeus(knobs(seed)).unwrap();
        let last = h.last().unwrap();
        assert_eq!(last.batch_size, 16, "seed {seed}");
        // bs 16: at 100 W cost/epoch = (0.5*80 + 0.5*200)*10 = 1400; at 200 W 0.5*150*7.5+... .
        let costs = t.profile_power_limits(1, 0.5);
        let best = costs.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap().0;
        assert_eq!(last.power_limit, best);
        let recs: std::collections::HashSet<u32> = h.iter().map(|e| e.rec).collect();
        assert_eq!(recs.len(), 30);
        let d = t.simulate_default(knobs(seed)).unwrap();
        assert!(totals(&t, &h, 0.5).0 < totals(&t, &d, 0.5).0);
    }
}

#[test]
fn same_seed_same_history() {
    let t = table();
    assert_eq!(
        t.simulate_zeus(knobs(3)).unwrap(),
        t.simulate_zeus(knobs(3)).unwrap()
    );
}

#[test]
fn default_baseline_is_expected_path() {
    let t = table();
    let d = t.simulate_default(knobs(1)).unwrap();
    assert_eq!(d.len(), 30);
    // bs 8, 200 W, mean of 4 and 6 epochs.
    assert_eq!(d[0].energy, 5.0 * 2250.0);
    assert_eq!(d, t.simulate_default(knobs(99)).unwrap());
}

#[test]
fn default_that_never_converges_is_an_error() {
    let mut t = table();
    t.job.default_bs = 32;
    let err = t.simulate_zeus(knobs(0)).unwrap_err().to_string();
    assert!(err.contains("default batch size 32"), "{err}");
    assert!(t.simulate_default(knobs(0)).is_err());
}

#[test]
fn bad_knobs_are_named() {
    let t = table();
    let mut k = knobs(0);
    k.eta = 1.5;
    assert!(t.simulate_zeus(k).unwrap_err().to_string().contains("1.5"));
}

/// A policy that always picks one batch size, to check the generic loop.
struct Fixed(u32);
impl BatchSizePolicy for Fixed {
    fn predict(&mut self) -> SimResult<u32> {
        Ok(self.0)
    }
    fn observe(&mut self, _: u32, _: f64, _: bool) -> SimResult<()> {
        Ok(())
    }
}

#[test]
fn generic_loop_accepts_other_policies() {
    let t = table();
    let h = t
        .simulate(&mut Fixed(16), &mut JitPowerLimit::default(), knobs(0))
        .unwrap();
    assert!(h.iter().all(|e| e.batch_size == 16 && e.reached));
    assert!(t
        .simulate(&mut Fixed(12), &mut JitPowerLimit::default(), knobs(0))
        .is_err());
}

#[test]
fn unknown_workload_is_named() {
    let err = builtin_job("mnist").unwrap_err().to_string();
    assert!(err.contains("mnist") && err.contains("cifar100"), "{err}");
}

#[test]
fn real_traces_if_present() {
    let dir = std::path::Path::new("/work/shared/data/zeus-traces");
    if !dir.exists() {
        return;
    }
    let t = load_builtin(dir, "v100", "librispeech").unwrap();
    assert_eq!(t.job.default_bs, 192);
    assert_eq!(t.max_power, 250.0);
    let err = load_builtin(dir, "h100", "librispeech")
        .unwrap_err()
        .to_string();
    assert!(err.contains("h100") && err.contains("v100"), "{err}");
}
