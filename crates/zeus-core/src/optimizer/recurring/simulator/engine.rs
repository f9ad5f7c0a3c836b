//! The recurrence loop of the trace-driven simulator (the reference's `simulate_one_job`).

use super::policy::{BatchSizePolicy, PowerLimitPolicy};
use super::table::JobTable;
use super::trace::{SimError, SimResult};
use crate::optimizer::recurring::{JitPowerLimit, PruningGts, PruningGtsPolicy};
use crate::util::metric::zeus_cost;
use crate::util::numpy_rng::NumpyRng;

/// Picks the training path (one run of the train trace) of each simulated run.
pub trait PathSampler {
    /// An index in `0..n`.
    fn sample(&mut self, n: usize) -> SimResult<usize>;
}

/// The reference's sampler: `DataFrame.sample(n=1, random_state=rng)` over the `n` paths, with
/// `rng = numpy.random.default_rng(seed)`, which draws `rng.choice(n, 1, replace=False)`.
impl PathSampler for NumpyRng {
    fn sample(&mut self, n: usize) -> SimResult<usize> {
        if n == 0 {
            return Err(SimError::InvalidArgument(
                "no training path to sample".into(),
            ));
        }
        // One pick of Floyd's algorithm is one bounded draw (`NumpyRng::choice(n, 1)`).
        Ok(self.bounded(n as u64 - 1) as usize)
    }
}

/// Retries per recurrence before the target is declared unreachable (as the reference).
pub const MAX_TRIES: u32 = 20;

/// One run of the job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HistoryEntry {
    /// Recurrence, 1-based.
    pub rec: u32,
    /// Try within the recurrence, 1-based.
    pub attempt: u32,
    /// Batch size.
    pub batch_size: u32,
    /// Power limit, W.
    pub power_limit: u32,
    /// Joules.
    pub energy: f64,
    /// Seconds.
    pub time: f64,
    /// Whether the run reached the target metric.
    pub reached: bool,
}

/// Knobs of one simulation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Knobs {
    /// Energy/time weight η in [0, 1].
    pub eta: f64,
    /// Early-stop factor β (`inf` disables early stopping).
    pub beta: f64,
    /// Number of recurrences.
    pub recurrences: u32,
    /// Seed of the path sampler (and of the built-in bandit).
    pub seed: u64,
}

impl Knobs {
    /// Reject knobs that make no sense, naming the value.
    pub fn validate(&self) -> SimResult<()> {
        if !(0.0..=1.0).contains(&self.eta) {
            return Err(SimError::InvalidArgument(format!(
                "eta must be in [0, 1], got {}",
                self.eta
            )));
        }
        if self.beta.is_nan() || self.beta <= 0.0 {
            return Err(SimError::InvalidArgument(format!(
                "beta must be positive, got {}",
                self.beta
            )));
        }
        if self.recurrences == 0 {
            return Err(SimError::InvalidArgument(
                "recurrences must be at least 1, got 0".into(),
            ));
        }
        Ok(())
    }
}

/// Result of one simulated run: energy, time and whether the target was reached. A run that
/// cannot afford even one epoch under the cost cap returns `None`.
pub type RunOutcome = Option<(f64, f64, bool)>;

impl JobTable {
    /// The cost of one epoch at each power limit of batch size index `bi`, high to low (paper
    /// Eq. 7: `(η·P + (1−η)·MaxPL_bs)·t`).
    pub fn profile_power_limits(&self, bi: usize, eta: f64) -> Vec<(u32, f64)> {
        let b = &self.batch_sizes[bi];
        let max_pl = b.max_pl() as f64;
        b.epochs
            .iter()
            .rev()
            .map(|e| {
                // The cost rate of the epoch (power in place of energy, per second) times its
                // length: the reference's association, which keeps its rounding and ties.
                (e.power_limit, zeus_cost(e.power, 1.0, eta, max_pl) * e.time)
            })
            .collect()
    }

    /// Simulate one run at batch size index `bi` and power limit `pl` along path `path`.
    ///
    /// The run stops before the first epoch that would push its cost above `cost_ub`; with
    /// `profile_power` its first epoch is the mean over all power limits (the epoch was sliced
    /// across them while profiling).
    pub fn run_path(
        &self,
        bi: usize,
        pl: u32,
        path: usize,
        cost_ub: f64,
        eta: f64,
        profile_power: bool,
    ) -> SimResult<RunOutcome> {
        let b = &self.batch_sizes[bi];
        let e = b.at(pl).ok_or_else(|| {
            SimError::InvalidArgument(format!(
                "power limit {pl} W is not in the trace for batch size {} (have {:?})",
                b.batch_size,
                b.epochs.iter().map(|e| e.power_limit).collect::<Vec<_>>()
            ))
        })?;
        let max_epochs = self.job.max_epochs as f64;
        let max_epochs = if cost_ub == f64::INFINITY {
            max_epochs
        } else {
            let per_epoch = zeus_cost(e.energy, e.time, eta, b.max_pl() as f64);
            (cost_ub / per_epoch).floor().min(max_epochs)
        };
        if max_epochs <= 0.0 {
            return Ok(None);
        }
        let (epochs, reached) = match b.paths[path] {
            Some(t) if t <= max_epochs => (t, true),
            _ => (max_epochs, false),
        };
        let (energy, time) = if profile_power {
            (
                b.profile_energy + e.energy * (epochs - 1.0),
                b.profile_time + e.time * (epochs - 1.0),
            )
        } else {
            (e.energy * epochs, e.time * epochs)
        };
        Ok(Some((energy, time, reached)))
    }

    /// Run the recurrence loop with any pair of policies.
    ///
    /// This is the reference's `simulate_one_job`: per recurrence, up to 20 tries; each try asks
    /// the batch-size policy, then the power-limit policy (profiling when it has no answer),
    /// samples a training path, and caps the run at `β × min_cost`, where `min_cost` is the
    /// cheapest accumulated cost (including failed tries) of a successful recurrence so far.
    pub fn simulate<B: BatchSizePolicy + ?Sized, P: PowerLimitPolicy + ?Sized>(
        &self,
        bso: &mut B,
        plo: &mut P,
        knobs: Knobs,
    ) -> SimResult<Vec<HistoryEntry>> {
        let mut rng = NumpyRng::from_seed(knobs.seed);
        self.simulate_sampled(bso, plo, &mut rng, knobs)
    }

    /// `simulate` with a caller-chosen training-path sampler (for example numpy's generator
    /// through the Python bindings, which reproduces the reference's draws).
    pub fn simulate_sampled<
        B: BatchSizePolicy + ?Sized,
        P: PowerLimitPolicy + ?Sized,
        S: PathSampler + ?Sized,
    >(
        &self,
        bso: &mut B,
        plo: &mut P,
        rng: &mut S,
        knobs: Knobs,
    ) -> SimResult<Vec<HistoryEntry>> {
        knobs.validate()?;
        let mut min_cost = f64::INFINITY;
        let mut history = Vec::new();
        for rec in 1..=knobs.recurrences {
            let mut cost_acc = 0.0;
            let mut done = false;
            for attempt in 1..=MAX_TRIES {
                let bs = bso.predict()?;
                let bi = self.index_of(bs)?;
                let mut profiled = false;
                let pl = match plo.predict(bs)? {
                    Some(pl) => pl,
                    None => {
                        profiled = true;
                        for (pl, c) in self.profile_power_limits(bi, knobs.eta) {
                            plo.observe(bs, pl, c)?;
                        }
                        plo.predict(bs)?.ok_or_else(|| {
                            SimError::InvalidArgument(format!(
                                "the power-limit policy has no power limit for batch size {bs} \
                                 even after profiling"
                            ))
                        })?
                    }
                };
                let n_paths = self.batch_sizes[bi].paths.len();
                let path = rng.sample(n_paths)?;
                if path >= n_paths {
                    return Err(SimError::InvalidArgument(format!(
                        "path sampler returned {path} for {n_paths} training paths"
                    )));
                }
                let cost_ub = knobs.beta * min_cost;
                let Some((energy, time, reached)) =
                    self.run_path(bi, pl, path, cost_ub, knobs.eta, profiled)?
                else {
                    // Not even one epoch fits under the cap: tell the BSO this batch size is
                    // very bad, record nothing and retry.
                    bso.observe(bs, 100.0 * cost_ub, false)?;
                    continue;
                };
                let cost = zeus_cost(energy, time, knobs.eta, self.max_power);
                cost_acc += cost;
                bso.observe(bs, cost, reached)?;
                history.push(HistoryEntry {
                    rec,
                    attempt,
                    batch_size: bs,
                    power_limit: pl,
                    energy,
                    time,
                    reached,
                });
                if reached {
                    min_cost = min_cost.min(cost_acc);
                    done = true;
                    break;
                }
                if rec == 1 {
                    return Err(SimError::NotConverged(format!(
                        "the default batch size {} did not reach the target metric {} of {}",
                        self.job.default_bs, self.job.target_metric, self.job.dataset
                    )));
                }
            }
            if !done {
                return Err(SimError::NotConverged(format!(
                    "recurrence {rec} of {} did not reach the target metric in {MAX_TRIES} tries",
                    self.job.dataset
                )));
            }
        }
        Ok(history)
    }

    /// The Zeus policy (pruning + Gaussian TS, JIT power limits), entirely in Rust, with the
    /// reference's settings and the bandit seeded like the path sampler.
    pub fn simulate_zeus(&self, knobs: Knobs) -> SimResult<Vec<HistoryEntry>> {
        self.simulate_zeus_with(knobs, 0.0, 0.0, 0, knobs.seed)
    }

    /// The Zeus policy with the bandit's prior, reward window and seed given.
    pub fn simulate_zeus_with(
        &self,
        knobs: Knobs,
        prior_mean: f64,
        prior_precision: f64,
        window_size: usize,
        bandit_seed: u64,
    ) -> SimResult<Vec<HistoryEntry>> {
        let policy = PruningGtsPolicy::reference(
            &self.batch_size_list(),
            self.job.default_bs,
            prior_mean,
            prior_precision,
            window_size,
        )?;
        let mut bso = PruningGts::new(policy, false, NumpyRng::from_seed(bandit_seed));
        let mut plo = JitPowerLimit::default();
        self.simulate(&mut bso, &mut plo, knobs)
    }

    /// The baseline: the default batch size at its maximum power limit, without early stopping.
    ///
    /// It is deterministic: each recurrence costs the expectation over the trace's training
    /// paths. A path that misses the target runs `max_epochs` and is retried, so with success
    /// probability `p` a recurrence costs `E[success] + E[failure]·(1−p)/p` (geometric retries).
    pub fn simulate_default(&self, knobs: Knobs) -> SimResult<Vec<HistoryEntry>> {
        knobs.validate()?;
        let bi = self.index_of(self.job.default_bs)?;
        let b = &self.batch_sizes[bi];
        let pl = b.max_pl();
        let e = b.at(pl).expect("max_pl is in the table");
        let n = b.paths.len() as f64;
        let max_epochs = self.job.max_epochs as f64;
        let (mut ok_epochs, mut ok_n) = (0.0, 0.0);
        for p in &b.paths {
            match p {
                Some(t) if *t <= max_epochs => {
                    ok_epochs += t;
                    ok_n += 1.0;
                }
                _ => {}
            }
        }
        if ok_n == 0.0 {
            return Err(SimError::InvalidArgument(format!(
                "no training path of {} at the default batch size {} reaches the target metric {}",
                self.job.dataset, b.batch_size, self.job.target_metric
            )));
        }
        let p_ok = ok_n / n;
        // Expected epochs per recurrence: the successful paths' mean plus (1−p)/p failed
        // retries of max_epochs each.
        let epochs = ok_epochs / ok_n + max_epochs * (1.0 - p_ok) / p_ok;
        Ok((1..=knobs.recurrences)
            .map(|rec| HistoryEntry {
                rec,
                attempt: 1,
                batch_size: b.batch_size,
                power_limit: pl,
                energy: e.energy * epochs,
                time: e.time * epochs,
                reached: true,
            })
            .collect())
    }
}

/// Totals of a history: (energy J, time s, cost).
pub fn totals(table: &JobTable, history: &[HistoryEntry], eta: f64) -> (f64, f64, f64) {
    let mut e = 0.0;
    let mut t = 0.0;
    let mut c = 0.0;
    for h in history {
        e += h.energy;
        t += h.time;
        c += zeus_cost(h.energy, h.time, eta, table.max_power);
    }
    (e, t, c)
}
