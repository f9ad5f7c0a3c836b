//! Calibration: when a board's energy counter publishes, and which moment its value describes.
//!
//! A real counter is read in 3.5-6 ms of CPU, so it cannot be polled to watch it change; instead
//! the sampler reads it about once per update at varied delays (dithered), and this module finds
//! the schedule that explains the values:
//!
//! 1. **Publish grid** (period and phase): between two reads the counter advances by one step per
//!    publish it made in between, each worth about the power times its period. Where the power
//!    was steady (calm), the count of publishes is plain from the value, so each hypothesised grid
//!    is scored by how many read pairs it counts wrong ([`fit_grid`]). Dithered reads make wrong
//!    phases count wrong; the phases that fit form the phase's uncertainty.
//! 2. **Lag** (how long after the moment it describes a value is published): with the grid
//!    known, the lag shifts every described moment alike, which only matters, and so can only be
//!    seen, where the power changes. Each lag is scored by how well the power model predicts the
//!    counter steps ([`fit_lag`]); a flat score means the data do not say, and the previous
//!    estimate is kept.
//!
//! Both are pure functions of the reads and a power model, so tests drive them directly.

/// One pair of consecutive counter reads: the read windows (s) and how far the counter moved
/// between them (J), with the mean power the power readings saw around them and how much to
/// trust that power as steady (`weight` 1 for calm stretches, small where the load moved).
#[derive(Debug, Clone, Copy)]
pub struct ReadPair {
    pub prev: (f64, f64),
    pub next: (f64, f64),
    pub delta_j: f64,
    pub mean_w: f64,
    pub weight: f64,
}

/// A hypothesised publish grid: publishes at `phase + k * period`, where `phase` is the time
/// of one publish near the data (not a remainder since 1970: a period estimate off by a
/// nanosecond would move a grid anchored decades ago by seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    pub period: f64,
    pub phase: f64,
    /// Half-width of the phases that fit as well (s).
    pub phase_err: f64,
}

impl Grid {
    /// The latest publish at or before `t`.
    pub fn at_or_before(&self, t: f64) -> f64 {
        self.phase + ((t - self.phase) / self.period).floor() * self.period
    }

    /// Whether `other` has this grid's period, as far as a fit can tell: the power period's
    /// estimate, which the candidates are ratios of, moves by parts per million as readings
    /// come in, while candidates differ by a fifth or more.
    pub fn same_period(&self, other: &Grid) -> bool {
        (self.period - other.period).abs() < 1e-3 * self.period
    }

    /// Publishes in `(a, b]`.
    pub fn count(&self, a: f64, b: f64) -> f64 {
        if b <= a {
            return 0.0;
        }
        ((b - self.phase) / self.period).floor() - ((a - self.phase) / self.period).floor()
    }
}

/// Periods the grid search considers: the power update period times `a/b` for small `a` and
/// `b`, within 2 ms to 2 s, the power period first.
pub fn candidate_periods(power_period: f64) -> Vec<f64> {
    let mut out = vec![power_period];
    for a in 1..=5u32 {
        for b in 1..=5u32 {
            let p = power_period * f64::from(a) / f64::from(b);
            if (0.002..=2.0).contains(&p) && !out.iter().any(|q| (q - p).abs() < 1e-9) {
                out.push(p);
            }
        }
    }
    out
}

/// A pair's mismatch under `grid`, in time: the counter moved by `delta_j`, which at the pair's
/// power is that many seconds of described time; the grid says how far the described moment
/// moved between the two reads (a whole number of periods). The difference over its standard
/// error (`sigma` s), squared and capped at 9, so that one glitch cannot dominate.
pub(super) fn mismatch(pair: &ReadPair, grid: &Grid, sigma: f64) -> f64 {
    if pair.mean_w <= 0.0 {
        return 0.0;
    }
    let mid = |r: (f64, f64)| (r.0 + r.1) / 2.0;
    let described = grid.count(mid(pair.prev), mid(pair.next)) * grid.period;
    let e = (pair.delta_j / pair.mean_w - described) / sigma;
    (e * e).min(9.0)
}

/// How well `grid` explains the steady pairs among `pairs` (the mean capped mismatch, as
/// [`fit_grid`] scores), or `None` with too few steady pairs.
pub fn grid_score(pairs: &[ReadPair], grid: &Grid, noise: f64) -> Option<f64> {
    let calm: Vec<&ReadPair> = pairs.iter().filter(|p| p.weight >= 0.5).collect();
    if calm.len() < 6 {
        return None;
    }
    let total: f64 = calm
        .iter()
        .map(|p| {
            let span = (p.next.1 - p.prev.0).abs();
            let sigma = (2.0 * noise * span)
                .max(p.next.1 - p.next.0)
                .max(p.prev.1 - p.prev.0)
                .max(0.001);
            p.weight * mismatch(p, grid, sigma)
        })
        .sum();
    Some(total / calm.iter().map(|p| p.weight).sum::<f64>())
}

/// The result of [`fit_grid`]: the best grid and how strongly the data prefer it.
#[derive(Debug, Clone, Copy)]
pub struct GridFit {
    pub grid: Grid,
    /// Mean capped miscount of the best grid (0: every pair counted right).
    pub score: f64,
    /// Total weight of the pairs it rests on.
    pub evidence: f64,
}

/// Find the publish grid that best explains `pairs`, given the power readings' relative
/// noise. `None` with too little calm evidence.
pub fn fit_grid(pairs: &[ReadPair], power_period: f64, noise: f64) -> Option<GridFit> {
    // Only steady stretches count publishes reliably (elsewhere the power between readings is
    // not known well enough): at least six of them.
    let pairs: Vec<ReadPair> = pairs.iter().filter(|p| p.weight >= 0.5).copied().collect();
    if pairs.len() < 6 {
        return None;
    }
    let evidence: f64 = pairs.iter().map(|p| p.weight).sum();
    // How well a pair's described time is known: the power's noise over its span, a read's
    // duration, a millisecond.
    let sigmas: Vec<f64> = pairs
        .iter()
        .map(|p| {
            let span = (p.next.1 - p.prev.0).abs();
            (2.0 * noise * span)
                .max(p.next.1 - p.next.0)
                .max(p.prev.1 - p.prev.0)
                .max(0.001)
        })
        .collect();
    // Phases are tried from the newest data back: the grid is anchored where it is used.
    let origin = pairs.last().map_or(0.0, |p| p.next.0);
    let mut best: Option<GridFit> = None;
    for period in candidate_periods(power_period) {
        let step = (period / 200.0).clamp(0.0002, 0.001);
        let n = (period / step).round().max(1.0) as usize;
        let scores: Vec<f64> = (0..n)
            .map(|k| {
                let grid = Grid {
                    period,
                    phase: origin - k as f64 * step,
                    phase_err: 0.0,
                };
                pairs
                    .iter()
                    .zip(&sigmas)
                    .map(|(p, &sg)| p.weight * mismatch(p, &grid, sg))
                    .sum::<f64>()
                    / evidence
            })
            .collect();
        let (kbest, &sbest) = scores
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .expect("at least one phase");
        // The phases that fit about as well (less than one miscounted pair worse), walking out
        // from the best (the grid is circular).
        let tol = sbest + 2.0 / evidence;
        let mut lo = 0;
        while lo < n && scores[(kbest + n - lo - 1) % n] <= tol {
            lo += 1;
        }
        let mut hi = 0;
        while hi < n && scores[(kbest + hi + 1) % n] <= tol {
            hi += 1;
        }
        // Walking "forward" from k means going back in time (k counts steps back).
        let centre = kbest as f64 + (hi as f64 - lo as f64) / 2.0;
        let grid = Grid {
            period,
            phase: origin - (centre * step).rem_euclid(period),
            phase_err: ((lo + hi + 1) as f64 * step / 2.0).min(period / 2.0),
        };
        // Simpler grids win ties: the power period first (another period must fit clearly
        // better), then the order of the candidates.
        let better = |b: &GridFit| {
            if b.grid.period == power_period {
                sbest < 0.5 * b.score - 0.05
            } else {
                sbest < b.score - 0.05
            }
        };
        if best.as_ref().is_none_or(better) {
            best = Some(GridFit {
                grid,
                score: sbest,
                evidence,
            });
        }
    }
    best
}

/// The fewest read pairs a best lag's score must rest on to speak for it ([`LagFit::founded`]).
const MIN_LAG_PAIRS: usize = 4;

/// The result of [`fit_lag`].
#[derive(Debug, Clone)]
pub struct LagFit {
    pub lag: f64,
    /// Half-width of the lags that fit about as well.
    pub lag_err: f64,
    /// Whether the data preferred a lag at the top of the searched range by a clear margin
    /// (the true lag is probably longer than the range).
    pub beyond_range: bool,
    /// Whether the score depends on the lag at all (it does only where the power changed).
    pub informative: bool,
    /// The score of every lag tried, a millisecond apart from `lag_min`.
    pub scores: Vec<f64>,
    /// The shortest lag tried (s).
    pub lag_min: f64,
    /// The score differences the readings' noise alone makes between lags.
    pub floor: f64,
    /// How many read pairs the best lag's score rests on.
    pub best_pairs: usize,
}

impl LagFit {
    /// Whether the best lag's score rests on enough read pairs to stand for the board on its
    /// own. Where the model knows only a few stretches, a lag that puts one pair on them is
    /// scored on that pair alone, and one pair may fit any lag by chance: a lag a whole period
    /// long, scored on one pair that fitted exactly, was taken as measured to 1.3 ms and put
    /// 7 s of a serving schedule's anchors a period early (10-24 J off each). Sparse loads
    /// give such fits all the time, and near the lag in use they refine it well (the schedule
    /// still takes them there, see `Track::refit`).
    pub fn founded(&self) -> bool {
        self.best_pairs >= MIN_LAG_PAIRS
    }

    /// Whether `lag` fits about as well as the best lag (a simpler hypothesis that the data do
    /// not reject).
    pub fn accepts(&self, lag: f64) -> bool {
        let best = self.scores.iter().copied().fold(f64::INFINITY, f64::min);
        let k = ((lag - self.lag_min) / 0.001).round().max(0.0) as usize;
        self.scores
            .get(k)
            .is_some_and(|&s| s <= best * 1.3 + self.floor)
    }

    /// Whether the data speak clearly against `lag`: it fits several times worse than the best
    /// lag, by more than a load moving between readings blurs every fit (a lag outside the
    /// searched range is not judged).
    pub fn rejects(&self, lag: f64) -> bool {
        let best = self.scores.iter().copied().fold(f64::INFINITY, f64::min);
        let k = ((lag - self.lag_min) / 0.001).round();
        k >= 0.0
            && self
                .scores
                .get(k as usize)
                .is_some_and(|&s| s > 3.0 * best + 0.01)
    }
}

/// Counter reads for the lag fit: each read window and the counter value there (J).
#[derive(Debug, Clone, Copy)]
pub struct LagRead {
    pub before: f64,
    pub after: f64,
    pub joules: f64,
}

/// Find the lag in `[lag_min, lag_max]` that best explains `reads` on `grid`, given
/// `integral(a, b)`, the power model's energy over `[a, b]` (not finite where the model does not
/// know it).
///
/// `noise` is the power readings' relative noise (amplitude): a pair's prediction is off by
/// about that much at the right lag, so scores closer than its square tell no lag from another.
///
/// The lag is measured against `grid` as fitted, which places publishes by the reads'
/// midpoints; where within its 3.5-6 ms a read takes the value is the driver's business, so the
/// fitted grid may sit a few milliseconds off the board's publishes either way, and the lag
/// that absorbs that offset may be a little negative (`lag_min < 0`).
pub fn fit_lag(
    reads: &[LagRead],
    grid: &Grid,
    (lag_min, lag_max): (f64, f64),
    noise: f64,
    integral: &dyn Fn(f64, f64) -> f64,
) -> Option<LagFit> {
    if reads.len() < 4 {
        return None;
    }
    let step = 0.001;
    let n = ((lag_max - lag_min) / step).round() as usize + 1;
    let described = |r: &LagRead, lag: f64| grid.at_or_before((r.before + r.after) / 2.0) - lag;
    let margin = grid.phase_err + 0.0005;
    let straddles =
        |r: &LagRead| grid.at_or_before(r.before - margin) != grid.at_or_before(r.after + margin);
    // Each lag's score and the number of pairs it rests on.
    let (scores, pairs): (Vec<f64>, Vec<usize>) = (0..n)
        .map(|k| {
            let lag = lag_min + k as f64 * step;
            let mut total = 0.0;
            let mut count = 0;
            for w in reads.windows(2) {
                // A read that straddles a publish may show either value: it says nothing here.
                if w.iter().any(&straddles) {
                    continue;
                }
                let (a, b) = (described(&w[0], lag), described(&w[1], lag));
                if b <= a {
                    continue;
                }
                let predicted = integral(a, b);
                // The model does not know the power there (a stretch between window edges
                // that no reading saw): no word on the lag either.
                if !predicted.is_finite() {
                    continue;
                }
                let moved = w[1].joules - w[0].joules;
                let scale = predicted.abs().max(moved.abs()).max(1e-3);
                let e = (moved - predicted) / scale;
                total += (e * e).min(1.0);
                count += 1;
            }
            let score = if count > 0 {
                total / count as f64
            } else {
                f64::INFINITY
            };
            (score, count)
        })
        .unzip();
    let (kbest, &sbest) = scores
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))?;
    if !sbest.is_finite() {
        return None;
    }
    let worst = scores
        .iter()
        .copied()
        .filter(|s| s.is_finite())
        .fold(0.0, f64::max);
    let tol = sbest * 1.15 + 2e-5;
    let mut lo = kbest;
    while lo > 0 && scores[lo - 1] <= tol {
        lo -= 1;
    }
    let mut hi = kbest;
    while hi + 1 < n && scores[hi + 1] <= tol {
        hi += 1;
    }
    let lag = lag_min + (lo + hi) as f64 / 2.0 * step;
    let lag_err = (hi - lo + 1) as f64 * step / 2.0;
    // Informative when the worst lag fits clearly worse than the best one and the lags that
    // fit are few.
    // And only where the model predicts the counter well at the best lag (a mean squared
    // relative miss under 2%): a load that moves between readings makes every lag fit badly,
    // and the best of bad fits says nothing about the board.
    let floor = noise.powi(2).max(1e-4);
    let best_pairs = pairs[kbest];
    let informative = worst > sbest * 2.0 + floor && lag_err < 0.012 && sbest < 0.005;
    let interior_best = scores[..n.saturating_sub(20)]
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let beyond_range = informative && hi + 1 == n && sbest < 0.6 * interior_best;
    Some(LagFit {
        lag,
        lag_err,
        beyond_range,
        informative,
        scores,
        lag_min,
        floor,
        best_pairs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads of a counter publishing on `grid` the energy `lag` before, at steady power `w`,
    /// once per 0.1 s at dithered delays.
    fn steady_pairs(grid: &Grid, w: f64, n: usize) -> Vec<ReadPair> {
        let reads: Vec<(f64, f64)> = (0..n)
            .map(|k| {
                let t = 10.0 + k as f64 * 0.1 + (k as f64 * 0.618_034).fract() * 0.1;
                (t, t + 0.0035)
            })
            .collect();
        reads
            .windows(2)
            .map(|r| {
                let value = |x: (f64, f64)| grid.at_or_before(x.0 + 0.001) * w;
                ReadPair {
                    prev: r[0],
                    next: r[1],
                    delta_j: value(r[1]) - value(r[0]),
                    mean_w: w,
                    weight: 1.0,
                }
            })
            .collect()
    }

    #[test]
    fn the_grid_is_found_from_steady_power_alone() {
        for (period, phase) in [(0.1, 0.037), (0.05, 0.011), (0.2, 0.15), (0.02, 0.004)] {
            let truth = Grid {
                period,
                phase,
                phase_err: 0.0,
            };
            let fit = fit_grid(&steady_pairs(&truth, 300.0, 40), 0.1, 0.01).unwrap();
            assert!((fit.grid.period - period).abs() < 1e-9, "{period}: {fit:?}");
            let d = (fit.grid.phase - phase).rem_euclid(period);
            let d = d.min(period - d);
            assert!(d <= fit.grid.phase_err + 0.001, "{period}: {fit:?}");
            assert!(fit.grid.phase_err < 0.01, "{period}: {fit:?}");
        }
    }

    #[test]
    fn the_lag_is_found_where_the_power_changes_and_said_unknown_where_it_does_not() {
        let grid = Grid {
            period: 0.1,
            phase: 0.015,
            phase_err: 0.001,
        };
        // Power: 100 W, 400 W between 11.02 and 11.47 s, 100 W again; energy is its integral.
        let power = |t: f64| {
            if (11.02..11.47).contains(&t) {
                400.0
            } else {
                100.0
            }
        };
        let energy = |t: f64| {
            let busy = (t.min(11.47) - 11.02).max(0.0);
            100.0 * t + 300.0 * busy
        };
        let integral = |a: f64, b: f64| energy(b) - energy(a);
        for true_lag in [0.0, 0.015, 0.045, 0.08] {
            let reads: Vec<LagRead> = (0..30)
                .map(|k| {
                    let t = 10.5 + k as f64 * 0.1 + (k as f64 * 0.618).fract() * 0.1;
                    let x = grid.at_or_before(t + 0.001) - true_lag;
                    LagRead {
                        before: t,
                        after: t + 0.0035,
                        joules: energy(x),
                    }
                })
                .collect();
            let fit = fit_lag(&reads, &grid, (-0.005, 0.1), 0.0, &integral).unwrap();
            assert!(fit.informative);
            assert!(
                (fit.lag - true_lag).abs() <= fit.lag_err + 0.001 && fit.lag_err < 0.01,
                "{true_lag}: {fit:?}"
            );
            assert!(!fit.beyond_range);
            let _ = power;
        }
        let flat = |a: f64, b: f64| 100.0 * (b - a);
        let reads: Vec<LagRead> = (0..20)
            .map(|k| {
                let t = 10.0 + k as f64 * 0.1;
                LagRead {
                    before: t,
                    after: t + 0.0035,
                    joules: 100.0 * grid.at_or_before(t),
                }
            })
            .collect();
        let fit = fit_lag(&reads, &grid, (-0.005, 0.1), 0.0, &flat).unwrap();
        assert!(!fit.informative, "{fit:?}");
    }

    #[test]
    fn a_best_lag_scored_on_one_pair_is_no_measurement() {
        let grid = Grid {
            period: 0.1,
            phase: 0.015,
            phase_err: 0.001,
        };
        // The counter describes each publish itself (lag 0) of a steady 100 W, read 3 ms
        // after each publish.
        let publish = |k: usize| 10.015 + k as f64 * 0.1;
        let reads: Vec<LagRead> = (0..14)
            .map(|k| LagRead {
                before: publish(k) + 0.003,
                after: publish(k) + 0.0065,
                joules: 100.0 * publish(k),
            })
            .collect();
        // The model knows two kinds of stretch only: the first five counter intervals, as
        // lags up to 12 ms place them, where it guesses 20% high; and one interval that only
        // a lag of 98 ms puts a pair of reads on, where it happens to be exact.
        let integral = |a: f64, b: f64| {
            let early = (a - publish(0) + 0.0125).rem_euclid(0.1) <= 0.013 && a < publish(5);
            let lucky = a >= publish(0) - 0.0985 && b <= publish(1) - 0.0975;
            if (b - a - 0.1).abs() > 1e-6 {
                f64::NAN
            } else if early {
                120.0 * (b - a)
            } else if lucky {
                100.0 * (b - a)
            } else {
                f64::NAN
            }
        };
        let fit = fit_lag(&reads, &grid, (-0.005, 0.1), 0.0, &integral).unwrap();
        // The lucky pair fits best, alone, and clearly better than the five pairs at every lag
        // they reach (the score alone calls it informative): one pair is no word on the lag.
        assert!((fit.lag - 0.098).abs() < 0.001, "{fit:?}");
        assert!(fit.informative, "{fit:?}");
        assert_eq!(fit.best_pairs, 1, "{fit:?}");
        assert!(!fit.founded(), "{fit:?}");
    }
}
