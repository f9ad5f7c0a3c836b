//! Gaussian Thompson sampling over batch sizes, with a conjugate Gaussian prior.

use super::PolicyError;
use crate::util::numpy_rng::NumpyRng;

/// The draws Thompson sampling makes. [`crate::util::numpy_rng::NumpyRng`] makes them exactly
/// as the reference's numpy generator does.
pub trait BanditRng {
    /// A random order of `0..n`: numpy's `rng.choice(arange(n), n, replace=False)`.
    fn permutation(&mut self, n: usize) -> Vec<usize>;
    /// One sample of a normal distribution.
    fn normal(&mut self, loc: f64, scale: f64) -> f64;
}

impl BanditRng for NumpyRng {
    fn permutation(&mut self, n: usize) -> Vec<usize> {
        self.choice_all(n)
    }

    fn normal(&mut self, loc: f64, scale: f64) -> f64 {
        NumpyRng::normal(self, loc, scale)
    }
}

/// One arm (batch size) and the belief about its mean reward (minus cost).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arm {
    pub batch_size: u32,
    /// Posterior mean of the arm's expected reward.
    pub mean: f64,
    /// Posterior precision (1 / variance) of that mean; infinite once it is known exactly.
    pub precision: f64,
    /// Precision of one reward observation.
    pub reward_precision: f64,
    /// Observations fitted.
    pub observations: usize,
}

impl Arm {
    /// An arm at the prior, no observations yet.
    pub fn prior(
        batch_size: u32,
        prior_mean: f64,
        prior_precision: f64,
        reward_precision: f64,
    ) -> Arm {
        Arm {
            batch_size,
            mean: prior_mean,
            precision: prior_precision,
            reward_precision,
            observations: 0,
        }
    }
}

/// 1 / the population variance of `rewards` (numpy's `var`), infinite when they are all equal
/// (a rounding residue of the variance of equal numbers counts as zero), and 0 (nothing is
/// known) when there are none.
pub fn reward_precision(rewards: &[f64]) -> f64 {
    if rewards.is_empty() {
        return 0.0;
    }
    if rewards.iter().all(|&r| r == rewards[0]) {
        return f64::INFINITY;
    }
    let n = rewards.len() as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    let var = rewards.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / n;
    1.0 / var
}

/// Conjugate update of `arm` with `rewards` (from the prior `(prior_mean, prior_precision)`
/// when `reset`). Noise-free rewards (infinite reward precision) pin the mean to their average.
pub fn fit_arm(
    arm: Arm,
    rewards: &[f64],
    reset: bool,
    prior_mean: f64,
    prior_precision: f64,
) -> Arm {
    let mut a = arm;
    if reset {
        a.mean = prior_mean;
        a.precision = prior_precision;
        a.observations = 0;
    }
    if rewards.is_empty() {
        return a;
    }
    let n = rewards.len() as f64;
    let sum: f64 = rewards.iter().sum();
    if a.reward_precision == f64::INFINITY {
        a.precision = f64::INFINITY;
        a.mean = sum / n;
    } else {
        let precision = a.precision + n * a.reward_precision;
        a.mean = (a.precision * a.mean + a.reward_precision * sum) / precision;
        a.precision = precision;
    }
    a.observations += rewards.len();
    a
}

/// The arm to pull next.
///
/// The arms are visited in a random order and the first with fewer than `num_explorations`
/// observations (or none) is explored. Otherwise each arm's mean reward is sampled from its posterior,
/// in `arms` order, and the first maximum wins. As in the reference the order is drawn on every
/// call, so a seeded generator is consumed exactly as the reference consumes it.
///
/// # Errors
/// [`PolicyError::InvalidArgument`] for no arms.
pub fn thompson_predict<R: BanditRng + ?Sized>(
    arms: &[Arm],
    num_explorations: usize,
    rng: &mut R,
) -> Result<u32, PolicyError> {
    if arms.is_empty() {
        return Err(PolicyError::InvalidArgument(
            "the bandit has no arms".into(),
        ));
    }
    // An arm never observed is explored even when `num_explorations` is 0: its posterior is
    // the prior, whose zero precision would make its sample infinite.
    let explore_below = num_explorations.max(1);
    for i in rng.permutation(arms.len()) {
        if arms[i].observations < explore_below {
            return Ok(arms[i].batch_size);
        }
    }
    let mut best = (f64::NEG_INFINITY, arms[0].batch_size);
    for (k, a) in arms.iter().enumerate() {
        let scale = (1.0 / a.precision).sqrt();
        let sample = rng.normal(a.mean, scale);
        if k == 0 || sample > best.0 {
            best = (sample, a.batch_size);
        }
    }
    Ok(best.1)
}
