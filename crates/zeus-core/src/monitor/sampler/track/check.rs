//! The self-check: residuals of the model against each anchor, the shapes they score,
//! and the mode they choose.

use super::*;

impl Track {
    /// A conservative sigma of the model's energy over `[a, b]` without a counter (J).
    pub(super) fn model_sigma(&self, a: f64, b: f64) -> f64 {
        let (e, _) = self.model(a, b, None);
        let s = self.residual_scale(false).max(0.05);
        (e * s).max(self.power_ceiling() * (b - a) * 0.02)
    }

    pub(super) fn record_residual(&mut self, a: f64, b: f64, moved: f64, pred: f64) -> Residual {
        let rel = |pred: f64| {
            let scale = pred.abs().max(moved.abs()).max(self.resolution_j * 4.0);
            (moved - pred) / scale
        };
        // Steady for the self-check: eight readings alike, over half a second at least (a load
        // that moves between readings rarely leaves that many alike).
        let span_before = (0.5 - (b - a)).max(2.0 * self.period);
        let (_, calm) = self.power_stats(a - span_before, b + self.period, 8);
        let hinted = self.last_hint_in(a, b).is_some();
        let res = Residual {
            rel: rel(pred),
            calm: calm && !hinted,
        };
        self.score_shapes();
        if hinted && self.averaged.is_some() {
            // Lagging averages cannot predict the level after an edge; the check for these
            // intervals is made once the next one is known (`check_split`).
        } else if hinted {
            // Both shapes are scored on every interval with window edges, so that the better
            // one is used; once a power reading past the interval is in (before it, both
            // would extrapolate the level after the edge and say nothing of their shapes).
            push_bounded(&mut self.pending_shapes, (a, b, moved), 16);
        } else {
            self.plain.push(res);
        }
        if res.calm && moved > 0.0 && b - a >= self.period * 0.5 {
            // Steady power: the readings' spread around the counter's mean is their noise.
            let mean = moved / (b - a).max(1e-6);
            let i = self.ticks.partition_recent(|k| k.t < a);
            let j = self.ticks.partition_recent(|k| k.t <= b);
            for k in i..j {
                let d = ((self.ticks[k].watts - mean) / mean.max(1.0))
                    .abs()
                    .min(0.5);
                push_bounded(&mut self.deviations, d, 64);
            }
            if self.deviations.len() >= 8 {
                // The median: robust to stretches that only looked steady (a load that moved
                // between readings). Uniform noise of amplitude n has a median deviation n/2.
                let mut v: Vec<f64> = self.deviations.iter().copied().collect();
                v.sort_by(f64::total_cmp);
                self.noise = (2.0 * v[v.len() / 2]).clamp(0.002, 0.1);
            }
        }
        res
    }

    /// Score the step and bridge shapes on the hinted intervals that a power reading has
    /// since passed.
    pub(super) fn score_shapes(&mut self) {
        let Some(seen) = self.ticks.iter().rev().find(|k| k.seen).map(|k| k.t) else {
            return;
        };
        while let Some(&(a, b, moved)) = self.pending_shapes.front() {
            if b >= seen {
                break;
            }
            self.pending_shapes.pop_front();
            let (step, free) = self.model_with(a, b, None, true);
            if free > FREE_UNSCORED {
                // A stretch between two edges in one interval (a short gap between windows) has
                // a level no reading saw: the step shape can only guess it, and a bad guess
                // there (the readings' mean, where the gap was idle between busy windows) says
                // nothing about whether the load steps at edges. A stretch too short to matter
                // (one window ending as the next begins, microseconds) leaves it fair.
                continue;
            }
            let bridge = self.model_with(a, b, None, false).0;
            let floor = self.resolution_j * 4.0;
            for (q, pred) in [(&mut self.hinted, step), (&mut self.hinted_bridge, bridge)] {
                let scale = pred.abs().max(moved.abs()).max(floor);
                q.push(Residual {
                    rel: (moved - pred) / scale,
                    calm: false,
                });
            }
        }
    }

    /// Where the model's levels come from the counter (lagging averages): the interval before
    /// `prev` held one window edge; now that the interval after it is known, check how well
    /// the edge splits its step into the level before (the interval before's mean) and after
    /// (the new interval's).
    pub(super) fn check_split(&mut self, prev: Anchor, x: f64, moved: f64) {
        let n = self.anchors.len();
        if self.averaged.is_none() || n < 3 {
            return;
        }
        let (a, b) = (self.anchors[n - 2], prev);
        let inside: Vec<f64> = self
            .hints
            .iter()
            .copied()
            .filter(|&h| h > a.t && h < b.t)
            .collect();
        let (Some(before), [h]) = (self.interval_mean(n - 2), inside.as_slice()) else {
            return;
        };
        let after = moved / (x - prev.t).max(1e-6);
        let step = b.joules - a.joules;
        let split = before * (h - a.t) + after * (b.t - h);
        let scale = step.abs().max(self.resolution_j * 4.0);
        self.hinted.push(Residual {
            rel: (step - split) / scale,
            calm: false,
        });
    }

    /// Score the model's prediction of a counter step and update the mode.
    pub(super) fn self_check(&mut self, prev: Anchor, x: f64, moved: f64, pred: f64) {
        self.record_residual(prev.t, x, moved, pred);
        self.check_split(prev, x, moved);
        // The counter's rate against the power readings themselves, over several seconds (long
        // enough for lagging averages to agree with it).
        let raw = self.raw_integral(prev.t, x);
        if raw > self.resolution_j * 4.0 {
            self.rate.0 = 0.98 * self.rate.0 + moved;
            self.rate.1 = 0.98 * self.rate.1 + raw;
            self.rate_span = 0.98 * self.rate_span + (x - prev.t);
            if moved <= self.resolution_j * 0.5 {
                self.frozen_steps += 1;
            } else {
                self.frozen_steps = 0;
            }
        }
        self.update_mode();
    }

    /// The energy of `[a, b]` from the raw power readings (a ramp between them).
    pub(super) fn raw_integral(&self, a: f64, b: f64) -> f64 {
        let i = self.ticks.partition_recent(|k| k.t <= a).saturating_sub(1);
        let j = self
            .ticks
            .partition_recent(|k| k.t < b)
            .min(self.ticks.len());
        let mut total = 0.0;
        for k in i..j {
            let t0 = self.ticks[k];
            let (t1, w1) = match self.ticks.get(k + 1) {
                Some(n) => (n.t, n.watts),
                None => (b, t0.watts),
            };
            let (x, y) = (a.max(t0.t), b.min(t1));
            if y > x {
                let at = |t: f64| t0.watts + (w1 - t0.watts) * (t - t0.t) / (t1 - t0.t).max(1e-9);
                total += (at(x) + at(y)) / 2.0 * (y - x);
            }
        }
        total
    }

    pub(super) fn update_mode(&mut self) {
        let ratio = if self.rate.1 > 0.0 {
            self.rate.0 / self.rate.1
        } else {
            1.0
        };
        // Enough for the ratio to say something: seconds of counter steps, more for averages.
        let rate_known = self.rate_span > 3.0 + 2.0 * self.averaged.unwrap_or(0.0);
        let calm: Vec<f64> = self
            .plain
            .iter()
            .filter(|r| r.calm)
            .map(|r| r.rel.abs())
            .collect();
        // What noise, resolution and timing allow in a steady stretch.
        let allowed = (6.0 * self.noise).max(0.08);
        let misfits = calm.iter().filter(|&&e| e > allowed).count();
        // Each reason to leave the cache, and when it no longer holds (stricter than entering,
        // so that the mode does not flap).
        let frozen = self.frozen_steps >= 3;
        let latest = self.anchors.back().map_or(0.0, |a| a.t);
        let went_back = self
            .backwards
            .iter()
            .filter(|&&t| t > latest - BACKWARDS_WINDOW_S)
            .count();
        let wrong_rate = rate_known && !(0.5..=2.0).contains(&ratio);
        let rate_back = !rate_known || (0.67..=1.5).contains(&ratio);
        let misfit = calm.len() >= 6 && misfits * 3 > calm.len();
        let fits_again = calm.len() >= 6 && misfits == 0;
        let (mode, reason) = if frozen {
            (
                Mode::Power,
                format!(
                    "its energy counter stood still for {} updates while the power readings \
                     said it drew power",
                    self.frozen_steps
                ),
            )
        } else if went_back >= BACKWARDS_LIMIT {
            (
                Mode::Power,
                format!(
                    "its energy counter went backwards {went_back} times in the last {:.0} s \
                     (a counter read from several threads at once does this on AMD GPUs)",
                    BACKWARDS_WINDOW_S
                ),
            )
        } else if wrong_rate || (self.mode == Mode::Power && !rate_back) {
            (
                Mode::Power,
                format!(
                    "its energy counter counts {ratio:.2}x the energy its power readings show \
                     (outside 0.5-2x)"
                ),
            )
        } else if self.schedule.lag_beyond_range {
            (
                Mode::Direct,
                format!(
                    "its energy counter lags its updates by more than the sampler calibrates \
                     ({:.0} ms from the power readings, {:.0} ms from window edges)",
                    LAG_MAX * 1000.0,
                    STEP_LAG_MAX * 1000.0
                ),
            )
        } else if !misfit && self.mode == Mode::Direct && !fits_again {
            // Staying until the steps fit again: the reason is still the one it left for (the
            // recent steps may be too few to say anything, as after a schedule change, and a
            // warning that "0 of its last 0 counter steps" missed would explain nothing).
            (Mode::Direct, std::mem::take(&mut self.mode_reason))
        } else if misfit {
            (
                Mode::Direct,
                format!(
                    "{misfits} of its last {} counter steps in steady stretches missed the \
                     model's prediction by more than {:.0}% (noise {:.1}%)",
                    calm.len(),
                    allowed * 100.0,
                    self.noise * 100.0
                ),
            )
        } else {
            (Mode::Cached, String::new())
        };
        self.mode = mode;
        self.mode_reason = reason;
    }

    /// The scale of the self-check residuals for intervals with window edges (`hinted`) or
    /// without, with a prior while there are few.
    pub(super) fn residual_scale(&self, hinted: bool) -> f64 {
        let q = match (hinted, self.steps()) {
            (false, _) => &self.plain,
            (true, true) => &self.hinted,
            (true, false) => &self.hinted_bridge,
        };
        let floor = (self.noise * 0.5).max(0.003);
        match q.scale() {
            Some(r) => r.max(floor),
            // Before intervals with window edges have been checked: twice what the others do.
            None => match self.plain.scale() {
                Some(r) => (2.0 * r).max(floor).max(0.01),
                None => 0.05,
            },
        }
    }

    /// Extrapolated window ends whose moment the counter has now passed: how far off they were.
    pub(super) fn settle_pending_ends(&mut self) {
        while let Some(&(t, est, u, p)) = self.pending_ends.front() {
            if !self.is_settled(t + 0.001) {
                break;
            }
            self.pending_ends.pop_front();
            if let Some(e) = self.edge(t) {
                if !e.degraded && u > 0.0 && p > 0.0 {
                    self.end_errors.push((est - e.joules) / (u * p));
                }
            }
        }
    }

    /// Averaging window of average-only readings: the one under which the readings match the
    /// counter's own trailing means best.
    pub(super) fn fit_averaging(&mut self) {
        if self.anchors.len() < 8 {
            return;
        }
        let t0 = self.anchors.front().expect("anchors").t;
        let t1 = self.anchors.back().expect("anchors").t;
        let lin = |t: f64| -> Option<f64> {
            let j = self.anchors.partition_recent(|a| a.t <= t);
            if j == 0 || j >= self.anchors.len() {
                return None;
            }
            let (a, b) = (self.anchors[j - 1], self.anchors[j]);
            Some(a.joules + (b.joules - a.joules) * (t - a.t) / (b.t - a.t))
        };
        let mut best: Option<(f64, Option<f64>)> = None;
        for w in [0.0f64, 0.25, 0.5, 1.0, 2.0] {
            let win = w.max(self.period);
            let mut err = 0.0;
            let mut n = 0.0;
            for k in self.ticks.iter().filter(|k| k.t - win > t0 && k.t < t1) {
                if let (Some(e1), Some(e0)) = (lin(k.t), lin(k.t - win)) {
                    let mean = (e1 - e0) / win;
                    err += (k.watts - mean).powi(2);
                    n += 1.0;
                }
            }
            if n < 5.0 {
                continue;
            }
            let score = err / n;
            if best.is_none_or(|(s, _)| score < s * 0.9) {
                best = Some((score, (w > 0.0).then_some(w)));
            }
        }
        if let Some((_, w)) = best {
            if self.averaged != w {
                // Readings compared with the counter so far were taken for another kind.
                self.noise = 0.01;
                self.deviations.clear();
            }
            self.averaged = w;
        }
    }

    // ---- the power model -------------------------------------------------------------------
}
