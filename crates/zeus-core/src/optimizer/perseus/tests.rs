//! The frontier against brute force on small DAGs.

use super::*;
use proptest::prelude::*;

/// Makespan evaluator with the topological order precomputed (brute force calls it millions of
/// times).
struct Longest {
    order: Vec<usize>,
    pred: Vec<Vec<usize>>,
}

impl Longest {
    fn new(dag: &Dag) -> Longest {
        let mut pred = vec![Vec::new(); dag.num_nodes];
        for &(a, b) in &dag.edges {
            pred[b].push(a);
        }
        Longest {
            order: dag.topological_order().unwrap(),
            pred,
        }
    }

    fn eval(&self, d: &[u64], finish: &mut [u64]) -> u64 {
        let mut best = 0;
        for &v in &self.order {
            let start = self.pred[v].iter().map(|&p| finish[p]).max().unwrap_or(0);
            finish[v] = start + d[v];
            best = best.max(finish[v]);
        }
        best
    }
}

/// Calls `f(choice)` for every vector with `choice[i] < sizes[i]`.
fn for_each_combination(sizes: &[usize], mut f: impl FnMut(&[usize])) {
    let mut c = vec![0usize; sizes.len()];
    loop {
        f(&c);
        let mut i = 0;
        loop {
            if i == sizes.len() {
                return;
            }
            c[i] += 1;
            if c[i] < sizes[i] {
                break;
            }
            c[i] = 0;
            i += 1;
        }
    }
}

/// Exhaustive discrete frontier: `F[T]` = least total cost over all option choices whose
/// makespan is at most `T` (integer times, unit 1).
fn brute_discrete(dag: &Dag, options: &[Vec<(f64, f64)>]) -> Vec<f64> {
    let lp = Longest::new(dag);
    let max_t: u64 = options
        .iter()
        .map(|o| o.iter().map(|x| x.0 as u64).max().unwrap())
        .sum();
    let mut best = vec![f64::INFINITY; max_t as usize + 1];
    let sizes: Vec<usize> = options.iter().map(|o| o.len()).collect();
    let mut d = vec![0u64; options.len()];
    let mut fin = vec![0u64; options.len()];
    for_each_combination(&sizes, |c| {
        let mut cost = 0.0;
        for i in 0..c.len() {
            d[i] = options[i][c[i]].0 as u64;
            cost += options[i][c[i]].1;
        }
        let t = lp.eval(&d, &mut fin) as usize;
        if cost < best[t] {
            best[t] = cost;
        }
    });
    prefix_min(best)
}

fn prefix_min(mut v: Vec<f64>) -> Vec<f64> {
    for t in 1..v.len() {
        v[t] = v[t].min(v[t - 1]);
    }
    v
}

/// Independent definition of an activity's envelope: the cheapest option's time bounds the
/// range from above, and `h(d)` is the least value at `d` of any option or of any segment
/// between two options straddling `d` (the lower convex envelope, evaluated pointwise).
fn envelope(options: &[(f64, f64)]) -> (u64, Vec<f64>) {
    let cheapest = options
        .iter()
        .cloned()
        .fold((f64::INFINITY, f64::INFINITY), |b, o| {
            if o.1 < b.1 || (o.1 == b.1 && o.0 < b.0) {
                o
            } else {
                b
            }
        });
    let dmax = cheapest.0 as u64;
    let pts: Vec<(u64, f64)> = options
        .iter()
        .filter(|o| o.0 as u64 <= dmax)
        .map(|o| (o.0 as u64, o.1))
        .collect();
    let dmin = pts.iter().map(|p| p.0).min().unwrap();
    let mut h = Vec::new();
    for d in dmin..=dmax {
        let mut v = f64::INFINITY;
        for &(a, ca) in &pts {
            if a == d {
                v = v.min(ca);
            }
            for &(b, cb) in &pts {
                if a < d && d < b {
                    v = v.min(ca + (cb - ca) * (d - a) as f64 / (b - a) as f64);
                }
            }
        }
        h.push(v);
    }
    (dmin, h)
}

/// Exhaustive relaxed frontier: least `sum h_i(d_i)` over integer durations, per makespan.
fn brute_relaxed(dag: &Dag, options: &[Vec<(f64, f64)>]) -> Vec<f64> {
    let env: Vec<(u64, Vec<f64>)> = options.iter().map(|o| envelope(o)).collect();
    let lp = Longest::new(dag);
    let max_t: u64 = env.iter().map(|(m, h)| m + h.len() as u64).sum();
    let mut best = vec![f64::INFINITY; max_t as usize + 1];
    let sizes: Vec<usize> = env.iter().map(|e| e.1.len()).collect();
    let mut d = vec![0u64; options.len()];
    let mut fin = vec![0u64; options.len()];
    for_each_combination(&sizes, |c| {
        let mut cost = 0.0;
        for i in 0..c.len() {
            d[i] = env[i].0 + c[i] as u64;
            cost += env[i].1[c[i]];
        }
        let t = lp.eval(&d, &mut fin) as usize;
        if cost < best[t] {
            best[t] = cost;
        }
    });
    prefix_min(best)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-7 * (1.0 + a.abs().max(b.abs()))
}

/// Invariants every frontier has, plus agreement with the relaxed brute force at every point,
/// and with the fastest / cheapest ends.
fn check_against_relaxed(dag: &Dag, options: &[Vec<(f64, f64)>]) -> Frontier {
    let f = compute_frontier(dag, options, 1.0).unwrap();
    let relaxed = brute_relaxed(dag, options);
    let lp = Longest::new(dag);
    let mut fin = vec![0u64; options.len()];
    // Slowest point: the makespan with every activity at its cheapest option.
    let (_, t_fast_relaxed) = (
        0,
        relaxed.iter().position(|c| c.is_finite()).unwrap() as u64,
    );
    assert_eq!(*f.times().last().unwrap(), t_fast_relaxed, "fastest point");
    for k in 0..f.len() {
        let t = f.times()[k];
        if k > 0 {
            assert_eq!(t + 1, f.times()[k - 1], "one unit per step");
            assert!(
                f.costs()[k] >= f.costs()[k - 1] - 1e-9,
                "cost rises as time falls"
            );
        }
        assert!(
            close(f.costs()[k], relaxed[t as usize]),
            "T={t}: P-D {} vs brute force {}",
            f.costs()[k],
            relaxed[t as usize]
        );
        // The planned durations achieve T at cost C(T).
        assert_eq!(lp.eval(f.durations(k), &mut fin), t);
        // The realised plan is never slower and never cheaper than the relaxation.
        let choice = f.choices(k);
        let d: Vec<u64> = choice
            .iter()
            .enumerate()
            .map(|(i, &c)| options[i][c].0 as u64)
            .collect();
        assert!(lp.eval(&d, &mut fin) <= t);
        let cost: f64 = choice
            .iter()
            .enumerate()
            .map(|(i, &c)| options[i][c].1)
            .sum();
        assert!(cost >= f.costs()[k] - 1e-7);
    }
    // No cheaper point beyond the slowest one: the relaxed optimum is flat from there on.
    let t0 = f.times()[0] as usize;
    assert!(close(relaxed[t0], *relaxed.last().unwrap()));
    f
}

fn pipeline_options(
    num_stages: usize,
    num_mb: usize,
) -> impl Strategy<Value = (Dag, Vec<Vec<(f64, f64)>>)> {
    let (_, dag) = pipeline_1f1b(num_stages, num_mb).unwrap();
    let n = dag.num_nodes;
    prop::collection::vec(prop::collection::vec((1u32..6, 0u32..40), 1..4), n..=n).prop_map(
        move |opts| {
            let options = opts
                .into_iter()
                .map(|o| o.into_iter().map(|(t, c)| (t as f64, c as f64)).collect())
                .collect();
            (dag.clone(), options)
        },
    )
}

/// Options at consecutive integer durations with convex, decreasing costs: every integer
/// duration is a real option on the envelope, so the relaxation is the discrete problem.
fn convex_options(n: usize) -> impl Strategy<Value = Vec<Vec<(f64, f64)>>> {
    prop::collection::vec(
        (1u32..4, prop::collection::vec(1u32..10, 0..3), 0u32..5),
        n..=n,
    )
    .prop_map(|acts| {
        acts.into_iter()
            .map(|(dmin, mut decrements, base)| {
                // Decrements sorted decreasing make the cost convex.
                decrements.sort_unstable_by(|a, b| b.cmp(a));
                let total: u32 = decrements.iter().sum();
                let mut cost = (base + total) as f64;
                let mut out = vec![(dmin as f64, cost)];
                for (j, dec) in decrements.iter().enumerate() {
                    cost -= *dec as f64;
                    out.push(((dmin as usize + j + 1) as f64, cost));
                }
                out
            })
            .collect()
    })
}

fn random_dag() -> impl Strategy<Value = Dag> {
    (3usize..7).prop_flat_map(|n| {
        prop::collection::vec((0..n, 0..n), 0..10).prop_map(move |pairs| Dag {
            num_nodes: n,
            edges: pairs
                .into_iter()
                .filter(|(a, b)| a < b)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn pipeline_2x2_matches_relaxed_brute_force((dag, options) in pipeline_options(2, 2)) {
        let f = check_against_relaxed(&dag, &options);
        // The relaxation is a lower bound of the discrete frontier.
        let discrete = brute_discrete(&dag, &options);
        for k in 0..f.len() {
            let t = f.times()[k] as usize;
            prop_assert!(f.costs()[k] <= discrete[t] + 1e-7);
        }
    }

    #[test]
    fn convex_pipeline_matches_discrete_pareto_frontier(options in convex_options(8)) {
        let (_, dag) = pipeline_1f1b(2, 2).unwrap();
        let f = check_against_relaxed(&dag, &options);
        let discrete = brute_discrete(&dag, &options);
        // Exhaustive Pareto frontier of the discrete problem: every T where the least cost
        // strictly drops relative to T - 1 (plus the fastest feasible T).
        let first = discrete.iter().position(|c| c.is_finite()).unwrap();
        let pareto: Vec<(usize, f64)> = (first..discrete.len())
            .filter(|&t| t == first || discrete[t] < discrete[t - 1] - 1e-9)
            .map(|t| (t, discrete[t]))
            .collect();
        for &(t, c) in &pareto {
            let k = f.best_within(t as u64).unwrap();
            prop_assert!(close(f.costs()[k], c), "T={} P-D {} exhaustive {}", t, f.costs()[k], c);
        }
        for k in 0..f.len() {
            let t = f.times()[k] as usize;
            prop_assert!(close(f.costs()[k], discrete[t]));
            // Here the realised plan is exactly the frontier point.
            let cost: f64 = f.choices(k).iter().enumerate().map(|(i, &c)| options[i][c].1).sum();
            prop_assert!(close(cost, f.costs()[k]));
        }
    }

    #[test]
    fn random_dags_match_relaxed_brute_force(
        dag in random_dag(),
        seed in prop::collection::vec(prop::collection::vec((0u32..5, 0u32..30), 1..4), 6..=6),
    ) {
        let options: Vec<Vec<(f64, f64)>> = seed[..dag.num_nodes]
            .iter()
            .map(|o| o.iter().map(|&(t, c)| (t as f64, c as f64)).collect())
            .collect();
        check_against_relaxed(&dag, &options);
    }
}

#[test]
fn three_stage_pipeline_matches_brute_force() {
    let (instr, dag) = pipeline_1f1b(3, 2).unwrap();
    // Stage-dependent, forward ~1 and backward ~2 units at full speed; slower options are
    // cheaper with a convex-ish but not exactly convex trade-off.
    let options: Vec<Vec<(f64, f64)>> = instr
        .iter()
        .map(|i| {
            let base = match i.kind {
                InstructionKind::Forward => 2.0,
                InstructionKind::Backward => 4.0,
            } + i.stage as f64;
            vec![
                (base, 10.0 + base),
                (base + 1.0, 6.0 + base),
                (base + 3.0, 4.5 + base),
            ]
        })
        .collect();
    let f = check_against_relaxed(&dag, &options);
    let discrete = brute_discrete(&dag, &options);
    for k in 0..f.len() {
        assert!(f.costs()[k] <= discrete[f.times()[k] as usize] + 1e-9);
    }
    // At the slowest point every instruction runs its cheapest option: a real plan.
    assert!(close(f.costs()[0], discrete[f.times()[0] as usize]));
}

#[test]
fn quantisation_rounds_up_and_names_bad_input() {
    let dag = Dag {
        num_nodes: 1,
        edges: vec![],
    };
    let f = compute_frontier(&dag, &[vec![(0.25, 3.0), (1.01, 1.0)]], 0.5).unwrap();
    assert_eq!(f.times(), &[3, 2, 1]);
    assert_eq!(f.choices(0), vec![1]);
    assert_eq!(f.choices(2), vec![0]);
    assert_eq!(
        compute_frontier(&dag, &[vec![]], 1.0).unwrap_err(),
        PerseusError::NoOptions { activity: 0 }
    );
    assert!(matches!(
        compute_frontier(&dag, &[vec![(f64::NAN, 1.0)]], 1.0),
        Err(PerseusError::BadOption { activity: 0, .. })
    ));
    assert_eq!(
        compute_frontier(&dag, &[vec![(1.0, 1.0)]], 0.0).unwrap_err(),
        PerseusError::BadUnitTime(0.0)
    );
    assert!(compute_frontier(&dag, &[vec![(1.0, 1.0)], vec![(1.0, 1.0)]], 1.0).is_err());
}

/// The textbook situation where a cut crosses a critical activity backwards: after `C` was
/// crashed cheaply, the next cut shortens `A` and `E` and must lengthen `C` back to recover
/// its cost. Without lengthening, the cost at T = 3 would be 15.5 instead of 14.5.
#[test]
fn backward_arcs_are_lengthened() {
    // A -> D, A -> C -> E, B -> E.
    let dag = Dag {
        num_nodes: 5,
        edges: vec![(0, 3), (0, 2), (2, 4), (1, 4)],
    };
    let options = vec![
        vec![(2.0, 0.0), (1.0, 3.0)],  // A
        vec![(2.0, 0.0), (1.0, 10.0)], // B
        vec![(1.0, 0.0), (0.0, 1.0)],  // C
        vec![(3.0, 0.0), (2.0, 1.5)],  // D
        vec![(2.0, 0.0), (1.0, 10.0)], // E
    ];
    let f = check_against_relaxed(&dag, &options);
    assert_eq!(f.times()[..3], [5, 4, 3]);
    assert_eq!(f.costs()[..3], [0.0, 2.5, 14.5]);
    assert_eq!(f.durations(2), &[1, 2, 1, 2, 1]);
}

/// `pipeline_options` with each node's options fastest first, as plans index them.
fn fastest_first(options: Vec<Vec<(f64, f64)>>) -> Vec<Vec<(f64, f64)>> {
    options
        .into_iter()
        .map(|mut o| {
            o.sort_by(|a, b| a.0.total_cmp(&b.0));
            o
        })
        .collect()
}

proptest! {
    #[test]
    fn the_best_plan_meets_its_slowdown_and_never_costs_more_than_all_max(
        (dag, options) in pipeline_options(2, 2),
        slowdown in prop_oneof![Just(0.0), 0.0f64..1.0],
        blocking in 0.0f64..5.0,
    ) {
        let options = fastest_first(options);
        let stage_of = pipeline_1f1b(2, 2).unwrap().0.iter().map(|i| i.stage).collect();
        let p = Pipeline::new(dag, stage_of, options, vec![blocking; 2], Some(0.25)).unwrap();
        let all_max = p.all_max();
        let best = p.cost(&p.best_within(slowdown).unwrap()).unwrap();
        prop_assert!(best.time <= all_max.time * (1.0 + slowdown) * (1.0 + 1e-12));
        prop_assert!(best.energy <= all_max.energy);
    }
}

#[test]
fn a_free_saving_off_the_critical_path_is_taken_and_bad_input_is_named() {
    // Two independent nodes: node 0 takes 4 s whatever; node 1 can run in 1 s for 10 J or in
    // 3 s (still within node 0's 4 s) for 2 J.
    let dag = Dag {
        num_nodes: 2,
        edges: vec![],
    };
    let options = vec![vec![(4.0, 8.0)], vec![(1.0, 10.0), (3.0, 2.0)]];
    let p = Pipeline::new(
        dag.clone(),
        vec![0, 1],
        options.clone(),
        vec![0.0, 0.0],
        None,
    )
    .unwrap();
    assert_eq!(
        p.all_max(),
        PlanCost {
            time: 4.0,
            energy: 18.0
        }
    );
    assert_eq!(p.best_within(0.0).unwrap(), vec![0, 1]);
    assert_eq!(
        p.cost(&[0, 1]).unwrap(),
        PlanCost {
            time: 4.0,
            energy: 10.0
        }
    );
    // Waiting is charged: a stage that idles 3 s at 1 W adds 3 J.
    let blocking = Pipeline::new(
        dag.clone(),
        vec![0, 1],
        options.clone(),
        vec![0.0, 1.0],
        None,
    )
    .unwrap();
    assert_eq!(blocking.cost(&[0, 0]).unwrap().energy, 18.0 + 3.0);
    assert_eq!(p.best_within(-0.1), Err(PerseusError::BadSlowdown(-0.1)));
    assert!(matches!(
        p.cost(&[0, 2]),
        Err(PerseusError::NoOptions { activity: 1 })
    ));
    assert!(matches!(
        Pipeline::new(dag, vec![0], options, vec![0.0], None),
        Err(PerseusError::LengthMismatch {
            what: "stage_of",
            ..
        })
    ));
}
