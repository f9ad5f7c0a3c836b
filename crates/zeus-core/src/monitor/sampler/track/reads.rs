//! Counter reads: when to read, the calibration of the publish grid and the lag, and
//! which moment each read describes (its anchor).

use super::*;

impl Track {
    /// A counter read (mJ) that started at `before` and ended at `after`, costing `cost` s of
    /// this thread's CPU.
    pub fn on_counter(&mut self, before: f64, after: f64, millijoules: u64, cost: f64) {
        self.version += 1;
        self.read_cost = if self.read_cost == 0.0 {
            cost
        } else {
            0.8 * self.read_cost + 0.2 * cost
        };
        if let Some(prev) = self.reads.back().copied() {
            if millijoules + self.resolution_mj.max(1) < prev.mj {
                push_bounded(&mut self.backwards, after, BACKWARDS_LIMIT * 4);
                self.update_mode();
                if millijoules >= prev.mj / 2 {
                    // A dip, not a reset to near zero: a stale value (AMD's counter read from
                    // several threads at once returns one), which the next read goes past
                    // again. Nothing to learn from it.
                    return;
                }
            }
        }
        // A coarse counter moves in whole steps: every value is a multiple of its resolution.
        self.resolution_mj = gcd(self.resolution_mj, millijoules);
        if self.reads.len() >= 4 {
            self.resolution_j = (self.resolution_mj.max(1) as f64 / 1000.0).min(1e6);
        }
        push_bounded(
            &mut self.reads,
            Read {
                before,
                after,
                mj: millijoules,
                dithered: self.read_dithered,
            },
            MAX_READS,
        );
        self.reads_since_fit += 1;
        let r = *self.reads.back().expect("just pushed");
        let refit = !self.schedule.fitted || self.reads_since_fit >= REFIT_EVERY;
        let was_schedule = self.schedule;
        let replaced = refit && {
            self.reads_since_fit = 0;
            self.refit();
            self.follow_schedule(&was_schedule)
        };
        if !replaced {
            self.attribute_next(r, true);
        }
        self.settle_pending_ends();
        self.plan_read(after);
    }

    /// After a refit from `was`: where the schedule moved, or its rule of placement changed,
    /// place the recent reads again (the newest among them). Returns whether it did.
    pub(super) fn follow_schedule(&mut self, was: &Schedule) -> bool {
        let moved = schedule_moved(was, &self.schedule);
        // Anchors placed on ticks and anchors placed by the lag differ by the lag's error: a
        // change of rule places the recent reads again, as a move does, and marks the seam
        // with the older ones (a 9 ms lag error that snapping took out put one-second windows
        // between a snapped and an unsnapped anchor 1 J off, against bounds of 0.6 J). The
        // model the self-check measured is the same.
        if !moved && was.snaps() == self.schedule.snaps() {
            return false;
        }
        if moved && schedule_changed_model(was, &self.schedule) {
            // The residuals measured the model as it was: a new schedule starts afresh.
            self.plain.clear();
            self.hinted.clear();
            self.hinted_bridge.clear();
            self.pending_shapes.clear();
            self.end_errors.clear();
            self.pending_ends.clear();
        }
        self.rebuild_anchors();
        true
    }

    /// A counter read failed at `t`: try again after `retry` s.
    pub fn on_counter_fault(&mut self, t: f64, retry: f64) {
        self.read_due = Some(t + retry);
    }

    /// The next read: right after the counter's next publish once the schedule is known (every
    /// fourth read dithered, so the schedule stays checked), at a dithered delay before.
    pub(super) fn plan_read(&mut self, after: f64) {
        let earliest = after + self.read_spacing.max(0.002);
        let g = self.schedule.grid;
        self.dither = self.dither.wrapping_add(1);
        let golden = (f64::from(self.dither) * 0.618_033_988_7).fract();
        // Fitted: every fourth read dithered. Before: every other one, the rest just after the
        // guessed publish, so that the first windows rest on well-placed values.
        let dithered = if self.schedule.fitted {
            self.dither % 4 == 0
        } else {
            self.dither % 2 == 0 || !self.locked
        };
        self.read_dithered = dithered;
        let due = if dithered {
            earliest + golden * g.period.max(self.period)
        } else {
            let margin = 0.0015 + g.phase_err;
            let next = g.at_or_before(earliest - margin) + g.period;
            next + margin
        };
        self.read_due = Some(due);
    }

    /// The counter values of reads on the track's scale, as pairs for the grid fit.
    pub(in crate::monitor::sampler) fn read_pairs(&self) -> Vec<ReadPair> {
        let n = self.reads.len();
        let start = n.saturating_sub(FIT_READS);
        let mut out = Vec::new();
        for k in start + 1..n {
            let (a, b) = (self.reads[k - 1], self.reads[k]);
            if b.mj < a.mj {
                continue;
            }
            let (lo, hi) = (a.before - LAG_MAX - self.period, b.after);
            let (mean, calm) = self.power_stats(lo, hi, 2);
            if mean <= 0.0 {
                continue;
            }
            out.push(ReadPair {
                prev: (a.before, a.after),
                next: (b.before, b.after),
                delta_j: (b.mj - a.mj) as f64 / 1000.0,
                mean_w: mean,
                weight: if calm { 1.0 } else { 0.05 },
            });
        }
        out
    }

    /// Mean power of the ticks in `[a, b]` and whether they were steady (within noise).
    pub(super) fn power_stats(&self, a: f64, b: f64, min_ticks: usize) -> (f64, bool) {
        // Steadiness is judged on the readings themselves; lagging averages are steady only
        // once they have been for a whole window.
        let a = a - self.averaged.unwrap_or(0.0);
        let i = self.ticks.partition_recent(|k| k.t < a);
        let j = self.ticks.partition_recent(|k| k.t <= b);
        if j <= i + 1 {
            return (0.0, false);
        }
        let enough = j - i >= min_ticks;
        let w: Vec<f64> = (i..j).map(|k| self.ticks[k].watts).collect();
        let mean = w.iter().sum::<f64>() / w.len() as f64;
        let (lo, hi) = w
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        let tol = 0.02 + 3.0 * self.noise;
        let in_gap = self.gaps.iter().any(|g| g.1 > a && g.0 < b);
        (mean, enough && !in_gap && hi <= lo * (1.0 + tol) + 1.0)
    }

    /// How far the power readings in `[a, b]` spread (W): what a load that moves faster than
    /// they update can be anywhere within.
    pub(super) fn reading_swing(&self, a: f64, b: f64) -> f64 {
        let i = self.ticks.partition_recent(|k| k.t < a);
        let j = self.ticks.partition_recent(|k| k.t <= b).max(i);
        let (lo, hi) = self.reading_extremes(i, j);
        (hi - lo).max(0.0)
    }

    /// The lowest and highest power readings (W) from the last at or before `a` to the first
    /// at or after `b`: the levels the load between them was seen at; `None` without one.
    pub(super) fn readings_around(&self, a: f64, b: f64) -> Option<(f64, f64)> {
        let i = self.ticks.partition_recent(|k| k.t <= a).saturating_sub(1);
        let j = (self.ticks.partition_recent(|k| k.t < b) + 1).min(self.ticks.len());
        (j > i).then(|| self.reading_extremes(i, j))
    }

    /// The lowest and highest readings of ticks `i..j` (W).
    fn reading_extremes(&self, i: usize, j: usize) -> (f64, f64) {
        self.ticks
            .range(i..j)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), k| {
                (l.min(k.watts), h.max(k.watts))
            })
    }

    pub(super) fn refit(&mut self) {
        let pairs = self.read_pairs();
        let fitted_grid = fit::fit_grid(&pairs, self.period, self.noise);
        // A fitted grid stays while it explains the recent steady pairs within about one
        // miscount of the best: with few steady pairs (a load that keeps stepping) the best
        // phase wobbles by milliseconds from fit to fit, and reads placed just after a publish
        // would then fall on the wrong side of it. Its period is the same as far as a fit can
        // tell (compared exactly, the power period's estimate moving by parts per million from
        // fit to fit replaced the grid at every refit: under prefill bursts on a serving
        // schedule its phase wandered across the period, and anchors fell a period off).
        let current = fit::grid_score(&pairs, &self.schedule.grid, self.noise);
        let keep = |g: &fit::GridFit| {
            self.schedule.fitted
                && g.grid.same_period(&self.schedule.grid)
                && current.is_some_and(|c| c <= g.score + 2.0 / g.evidence)
        };
        if let Some(g) = fitted_grid.filter(|g| keep(g)) {
            // Kept: its period refined (the power period's estimate moves by parts per million
            // as data come in), its phase where it was near the data.
            let near = pairs
                .last()
                .map_or(g.grid.phase, |p| self.schedule.grid.at_or_before(p.next.0));
            self.schedule.grid.period = g.grid.period;
            self.schedule.grid.phase = near;
        } else if let Some(g) = fitted_grid {
            // Accept a grid once the phases that fit are a small part of the period.
            if g.grid.phase_err < g.grid.period / 4.0 && g.score < 2.0 {
                let was = self.schedule.grid;
                self.schedule.grid = g.grid;
                if !self.schedule.fitted || !was.same_period(&g.grid) {
                    // A new grid: the lag guess is the power grid's (the counter describes the
                    // power updates, as on the measured H100) until the data say otherwise.
                    if !self.schedule.lag_known {
                        self.schedule.lag = self.on_grid_lag();
                    }
                } else if self.schedule.lag_known {
                    // The same grid, its phase moved by a millisecond or two: the moment each
                    // value describes (publish minus lag) is what the lag was measured as, so
                    // the lag moves with the phase until the data say otherwise.
                    let p = g.grid.period;
                    let d = (g.grid.phase - was.phase + p / 2.0).rem_euclid(p) - p / 2.0;
                    self.schedule.lag = (self.schedule.lag + d).clamp(LAG_MIN, LAG_MAX);
                }
                self.schedule.fitted = true;
            }
        }
        if let Some(shift) = self.shift_beyond_range() {
            // The counter follows the readings later than any lag the sampler calibrates:
            // measured, but outside what the cache's model handles.
            self.lag_beyond = self.schedule.lag + shift;
            self.schedule.lag_beyond_range = true;
            return;
        }
        if !self.schedule.fitted {
            return;
        }
        if let Some(lag) = self.known_lag {
            self.schedule.lag = lag;
            self.schedule.lag_err = KNOWN_LAG_ERR;
            self.schedule.lag_known = true;
            self.schedule.on_ticks = self.counter_on_power_grid();
            if self.average_only || self.averaged.is_some() {
                self.fit_averaging();
            }
            return;
        }
        if self.averaged.is_some() {
            // Lagging averages carry no timing the counter's own means lack: the lag can only
            // be told from window edges where the load stepped (see `lag_from_steps`).
            self.fit_averaging();
            // Edges that agree to within 10 ms: where the load does not step at them (it moves
            // on its own), the counter's steps fall anywhere and the lag stays unknown.
            if let Some((lag, err)) = self
                .lag_from_steps()
                .filter(|&(_, e)| e < 0.01)
                .and_then(|(lag, e)| self.on_family(lag, e))
            {
                self.schedule.lag = lag;
                self.schedule.lag_err = err;
                self.schedule.lag_known = true;
            }
            return;
        }
        // The lag, from the reads and the power model (informative only where power changed).
        let n = self.reads.len();
        let reads: Vec<LagRead> = self
            .reads
            .iter()
            .skip(n.saturating_sub(FIT_READS))
            .map(|r| LagRead {
                before: r.before,
                after: r.after,
                joules: r.mj as f64 / 1000.0,
            })
            .collect();
        // Reads across a reset would mislead the fit: keep the stretch after the last one.
        let from = reads
            .windows(2)
            .rposition(|w| w[1].joules < w[0].joules)
            .map_or(0, |k| k + 1);
        let grid = self.schedule.grid;
        // Stretches the model only guesses at would pull the lag to wherever it hides the
        // guess's miss: pairs of reads across them say nothing about the lag.
        let unknown = self.unknown_stretches();
        let fitted = fit::fit_lag(
            &reads[from..],
            &grid,
            (LAG_MIN, LAG_MAX),
            self.noise,
            &|a, b| {
                if unknown.iter().any(|&(x, y)| x < b && y > a) {
                    f64::NAN
                } else {
                    self.model(a, b, None).0
                }
            },
        );
        let edges_seen = reads
            .get(from)
            .is_some_and(|r0| self.last_hint_in(r0.before, f64::INFINITY).is_some());
        // A lag more than half a period from the one in use says the counter describes another
        // update altogether: a fit says so only on enough pairs (`LagFit::founded`). Nearer,
        // a fit on one to three pairs still refines the lag (sparse loads leave the model few
        // known stretches; refusing those fits too left 41 of 672 serving schedules with a
        // weight more than 5% off, against 11).
        let (lag_in_use, half_period) = (self.schedule.lag, self.period / 2.0);
        let leaps = |lag: f64| (lag - lag_in_use).abs() > half_period;
        if let Some(l) = fitted {
            let informative = l.informative && (l.founded() || !leaps(l.lag));
            // No lag in the range explains the counter where the load stepped, again and
            // again: the board's lag is outside what the sampler calibrates.
            let best = l.scores.iter().copied().fold(f64::INFINITY, f64::min);
            if informative {
                self.lag_misfits = 0;
            } else if edges_seen && best > 0.1 {
                self.lag_misfits += 1;
            }
            // A counter on the power grid describes the power updates, as on the measured H100
            // (and on every simulated board): its lag is of the grid's family.
            let on_grid = self.counter_on_power_grid();
            let grid_lag = self.on_grid_lag();
            let family = self.lag_family(l.lag);
            let off_family = (l.lag - family).abs() > l.lag_err + FAMILY_SLACK;
            // A pooled fit that puts an on-grid counter between the power updates is read as
            // what it is there: a load that moves between the readings aliases the fit (its
            // best lag wanders by milliseconds, 3-10 ms off under a serving engine's bursts),
            // and a caller held up between its window edge and the load step (a busy machine:
            // tens of ms) pulls it by as much. The window edges one by one are no check on it:
            // at an engine's every step (12-30 ms apart) they match the counter's steps to the
            // wrong edge and agreed on 40 ms for the H100's 15.
            let unconfirmed = on_grid && informative && off_family && !l.accepts(grid_lag);
            // Near the family (within the fit's error and 3 ms): the counter describes a power
            // update, and the fit's few milliseconds off it are the same aliasing.
            let near_family = on_grid && informative && !off_family;
            self.schedule.on_ticks =
                on_grid && (unconfirmed || !informative || l.accepts(grid_lag) || near_family);
            let keep = self.schedule.lag_known && l.accepts(self.schedule.lag);
            if unconfirmed {
                // The grid's lag stands, measured if it was; the fit is no word on the board.
                if !(self.schedule.lag_known && (self.schedule.lag - grid_lag).abs() < 0.002) {
                    self.schedule.lag = grid_lag;
                    self.schedule.lag_known = false;
                    self.schedule.lag_err = self.schedule.grid.phase_err.max(0.005);
                }
            } else if on_grid && informative && l.accepts(grid_lag) {
                self.schedule.lag = grid_lag;
                self.schedule.lag_err = l.lag_err.clamp(0.001, 0.005);
                self.schedule.lag_known = true;
                self.schedule.lag_beyond_range = false;
            } else if near_family {
                self.schedule.lag = family;
                self.schedule.lag_err = ((l.lag - family).abs() + l.lag_err).clamp(0.001, 0.005);
                self.schedule.lag_known = true;
                self.schedule.lag_beyond_range = false;
            } else if keep {
                // A measured lag stays while the data still accept it: a load that moves
                // between readings makes the fit's best lag wander, the board's lag does not.
            } else if informative {
                self.schedule.lag = l.lag;
                self.schedule.lag_err = l.lag_err.max(0.001);
                self.schedule.lag_known = true;
                self.schedule.lag_beyond_range = l.beyond_range;
            } else if let Some((lag, err)) = self
                .lag_from_steps()
                .filter(|&(lag, e)| e < 0.01 && lag < STEP_LAG_MAX && !l.rejects(lag))
                .and_then(|(lag, e)| self.on_family(lag, e))
            {
                // The model cannot tell the lag (sparse power samples, a load that moves between
                // them), but the counter's steps across the window edges can. Unless the model,
                // however blurred, still speaks clearly against it: window edges where the load
                // did not step (it moves on its own) put the counter's steps anywhere.
                self.schedule.lag = lag;
                self.schedule.lag_err = err;
                self.schedule.lag_known = true;
                self.schedule.lag_beyond_range = false;
                self.lag_misfits = 0;
            } else if l.rejects(self.schedule.lag)
                && (l.founded() || !leaps(if on_grid { family } else { l.lag }))
                && l.lag_err < 0.012
                && best < 0.2
                && (!on_grid || !off_family || l.accepts(family))
            {
                // A load that moves between readings blurs every lag's fit, but this one still
                // speaks clearly against the lag in use and for a narrow range of its own (on
                // the power grid, one of the grid's family): the lag in use is wrong, the fit's
                // is the best word there is.
                self.schedule.lag = if on_grid { family } else { l.lag };
                self.schedule.lag_err = l.lag_err.max(0.003);
                self.schedule.lag_known = true;
                self.schedule.lag_beyond_range = false;
            } else if self.lag_misfits >= 3 {
                self.schedule.lag_beyond_range = true;
            } else if !self.schedule.lag_known {
                self.schedule.lag = grid_lag;
                // On the power grid the guess is the grid's own phase, known as well as the
                // grid is; off it, any lag in the range.
                self.schedule.lag_err = if on_grid {
                    self.schedule.grid.phase_err.max(0.005)
                } else {
                    LAG_MAX / 2.0
                };
            }
        }
        if self.average_only {
            self.fit_averaging();
        }
    }

    /// Whether the counter updates with the power readings (the same period).
    pub(super) fn counter_on_power_grid(&self) -> bool {
        (self.schedule.grid.period - self.period).abs() < 1e-6
    }

    /// The lag of the grid's family nearest `lag` within the range the sampler calibrates: the
    /// counter describing a power update, whole periods back or not. (A fit pinned at the top
    /// of the range, 100 ms, is not a lag of 101 ms: taking that put 24 anchors a whole period
    /// early, 9.5-14.6 J off.)
    pub(super) fn lag_family(&self, lag: f64) -> f64 {
        let p = self.period.max(1e-3);
        let grid_lag = self.on_grid_lag();
        let k = ((lag - grid_lag) / p).round();
        let lowest = ((LAG_MIN - grid_lag) / p).ceil();
        let highest = ((LAG_MAX - grid_lag) / p).floor();
        let k = if lowest <= highest {
            k.clamp(lowest, highest)
        } else {
            k
        };
        grid_lag + k * p
    }

    /// A lag measured as `lag` ± `err`, as the schedule may take it: on the power grid, the
    /// nearest lag of the grid's family where it is within reach, else none; off it, as is.
    pub(super) fn on_family(&self, lag: f64, err: f64) -> Option<(f64, f64)> {
        if !self.counter_on_power_grid() {
            return Some((lag, err));
        }
        let family = self.lag_family(lag);
        ((lag - family).abs() <= err + FAMILY_SLACK).then_some((family, err))
    }

    /// The lag from counter steps across window edges, where the load is taken to step: the
    /// counter shows each step somewhere within the lag's range of the edge, on the anchors'
    /// time axis (which the lag in use puts in place). Between the level well before and the
    /// level well after, the first counter interval that moved off the level before holds the
    /// step, and how far into it the step fell says where it was; its distance from the edge is
    /// what the lag in use is off by. The median over the edges, and its spread as the error;
    /// `None` with fewer than three.
    pub(super) fn lag_from_steps(&self) -> Option<(f64, f64)> {
        let n = self.anchors.len();
        if n < 4 {
            return None;
        }
        let mean_over = |lo: f64, hi: f64| -> Option<f64> {
            let i = self.anchors.partition_recent(|a| a.t < lo);
            let j = self.anchors.partition_recent(|a| a.t <= hi);
            if j < i + 2 {
                return None;
            }
            let (a, b) = (self.anchors[i], self.anchors[j - 1]);
            Some((b.joules - a.joules) / (b.t - a.t).max(1e-6))
        };
        let reach = LAG_MAX + 0.01;
        // Levels are means over a few counter intervals.
        let span = (2.5 * self.schedule.grid.period).max(0.1);
        let mut offsets = Vec::new();
        for (k, &h) in self.hints.iter().enumerate() {
            // Only edges alone within the reach and the levels' spans: each step by itself.
            let near = |x: f64| (x - h).abs() < reach + span;
            let prev_near = k > 0 && near(self.hints[k - 1]);
            let next_near = self.hints.get(k + 1).is_some_and(|&x| near(x));
            if prev_near || next_near {
                continue;
            }
            let (Some(before), Some(after)) = (
                mean_over(h - reach - span, h - reach),
                mean_over(h + reach, h + reach + span),
            ) else {
                continue;
            };
            if (before - after).abs() < 0.2 * before.max(after) {
                continue;
            }
            // The first interval past the level before, within the reach of the edge.
            let i = self.anchors.partition_recent(|a| a.t < h - reach);
            let j = self
                .anchors
                .partition_recent(|a| a.t <= h + reach)
                .min(n - 1);
            let threshold = 0.2 * (after - before).abs();
            for m in i.max(1)..=j {
                let (a, b) = (self.anchors[m - 1], self.anchors[m]);
                let span = b.t - a.t;
                let step = b.joules - a.joules;
                if span <= 0.0 || (step / span - before).abs() < threshold {
                    continue;
                }
                // step = before * into + after * (span - into)
                let into = ((step - after * span) / (before - after)).clamp(0.0, span);
                offsets.push(a.t + into - h);
                break;
            }
        }
        if offsets.len() < 3 {
            return None;
        }
        offsets.sort_by(f64::total_cmp);
        let median = offsets[offsets.len() / 2];
        let mut dev: Vec<f64> = offsets.iter().map(|e| (e - median).abs()).collect();
        dev.sort_by(f64::total_cmp);
        let spread = 1.5 * dev[dev.len() / 2] + 0.002;
        // The step shows `median` late on the anchors' axis: the lag is that much longer.
        let lag = self.schedule.lag + median;
        Some((lag.clamp(LAG_MIN, STEP_LAG_MAX), spread))
    }

    /// How much later than the lag in use the counter follows the power readings, where that
    /// is beyond the calibrated range: the delay (s, up to a second) that best lines the
    /// counter's interval means (between the last anchors) up with the readings' integral,
    /// when it explains them far better than any delay within the range. `None` while the load
    /// held too steady to tell, for lagging averages (whose readings trail the load
    /// themselves), and when a delay in the range does about as well.
    pub(in crate::monitor::sampler) fn shift_beyond_range(&self) -> Option<f64> {
        // A lag the backend states is not searched for.
        if self.averaged.is_some() || self.known_lag.is_some() {
            return None;
        }
        let oldest = self.ticks.front()?.t;
        let span = 1.0;
        let n = self.anchors.len();
        let pairs: Vec<(f64, f64, f64)> = (n.saturating_sub(FIT_READS).max(1)..n)
            .map(|j| (self.anchors[j - 1], self.anchors[j]))
            .filter(|(a, b)| a.offset_sigma == b.offset_sigma && b.t > a.t && a.t - span > oldest)
            .map(|(a, b)| (a.t, b.t, (b.joules - a.joules) / (b.t - a.t)))
            .collect();
        if pairs.len() < 12 {
            return None;
        }
        let mean = pairs.iter().map(|p| p.2).sum::<f64>() / pairs.len() as f64;
        let spread: f64 = pairs.iter().map(|p| (p.2 - mean).powi(2)).sum();
        if spread < 1e-6 || spread / (pairs.len() as f64) < (0.1 * mean).powi(2) {
            return None;
        }
        let score = |shift: f64| -> f64 {
            pairs
                .iter()
                .map(|&(a, b, r)| (r - self.raw_integral(a - shift, b - shift) / (b - a)).powi(2))
                .sum::<f64>()
                / spread
        };
        let steps = (span / 0.01).round() as usize;
        let scores: Vec<f64> = (0..=steps).map(|k| score(k as f64 * 0.01)).collect();
        let in_range = (LAG_MAX / 0.01).round() as usize + 2;
        let (k_best, best) = scores
            .iter()
            .copied()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        let best_in_range = scores[..=in_range.min(steps)]
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        (k_best > in_range && best < 0.25 * best_in_range && best < 0.3)
            .then_some(k_best as f64 * 0.01)
    }

    /// The lag that makes the counter describe the power updates (its grid's publishes minus
    /// the power update before them).
    pub(super) fn on_grid_lag(&self) -> f64 {
        let g = self.schedule.grid;
        let Some(last) = self.ticks.iter().rev().find(|k| k.seen).copied() else {
            return 0.015;
        };
        let publish = g.at_or_before(last.t + g.period);
        // Within [LAG_MIN, period + LAG_MIN): a grid fitted a little before the updates
        // describes them at a small negative lag, not at most of a period.
        (publish - last.t - LAG_MIN).rem_euclid(self.period.max(1e-3)) + LAG_MIN
    }

    /// Which moment read `r` describes, by the schedule: one candidate, or two where the read
    /// straddles a publish.
    pub(super) fn candidates(&self, r: &Read) -> (f64, Option<f64>) {
        let g = self.schedule.grid;
        // A dithered read may fall anywhere, on a publish too: within a few times the fit's own
        // phase error, or 5 ms, of one it is unsure, and settled by its value.
        let pe = if r.dithered {
            (3.0 * g.phase_err).max(0.005).min(g.period / 3.0)
        } else {
            g.phase_err
        };
        let lo = g.at_or_before(r.before - pe);
        let hi = g.at_or_before(r.after + pe);
        let lag = self.schedule.lag;
        // A value unchanged since the read before is that read's publish, none later than it
        // could have seen (a read 90 ms on, its value unchanged, was placed a whole update
        // late by a prediction that the readings' missed prefills left 14 J short). Only where
        // the grid's phase is known to a tenth of its period: the one candidate left is placed
        // where the grid says, and a phase known to 24 ms put such a read 15 ms off, 4.9 J at
        // a prefill, where its value alone would have placed nothing.
        if hi > lo + 1e-9 && pe < g.period / 10.0 {
            let i = self.reads.partition_recent(|x| x.after < r.after);
            let unchanged_since = i
                .checked_sub(1)
                .and_then(|k| self.reads.get(k))
                .filter(|p| p.mj == r.mj);
            if unchanged_since.is_some_and(|p| g.at_or_before(p.after + pe) < hi - 1e-9) {
                return (lo - lag, None);
            }
        }
        if hi > lo + 1e-9 {
            (hi - lag, Some(lo - lag))
        } else {
            (hi - lag, None)
        }
    }

    /// Attribute again the reads the fit looked at, under the new schedule. Older anchors
    /// stay: they were placed, and checked, when their values arrived, and a schedule refitted
    /// on recent reads (whose phase may wobble by a few milliseconds) has no better word on
    /// them. The self-check's residuals stay too, for the same reason.
    pub(super) fn rebuild_anchors(&mut self) {
        let n = self.reads.len();
        let from = n.saturating_sub(FIT_READS);
        let Some(first) = self.reads.get(from).copied() else {
            return;
        };
        // Where the old schedule placed the first read it re-attributes.
        let placed = self
            .anchors
            .iter()
            .rev()
            .take_while(|a| a.read_at >= first.after)
            .find(|a| a.read_at == first.after)
            .map(|a| a.t);
        while self
            .anchors
            .back()
            .is_some_and(|a| a.read_at >= first.after)
        {
            self.anchors.pop_back();
        }
        // The older anchors were placed by the old schedule: one that the new schedule puts
        // about as late as the first read it re-attributes (a lag moved by most of a period)
        // would make that read look like a jump the board cannot draw. Drop those too; their
        // reads are older than what the new schedule describes.
        let (x_first, _) = self.candidates(&first);
        let half = self.schedule.grid.period / 2.0;
        while self.anchors.len() > 1 && self.anchors.back().is_some_and(|a| a.t > x_first - half) {
            self.anchors.pop_back();
        }
        let kept = self.anchors.len();
        let reads: Vec<Read> = self.reads.iter().skip(from).copied().collect();
        for r in reads {
            self.attribute_next(r, false);
        }
        // The anchors kept are where the old schedule put them, the new ones where the new
        // one does: the same read moved by the difference, and so, against the new anchors,
        // did the energy the kept ones stand for, by the power there times the move (a 12 ms
        // move at 116 W put one-second windows across the seam 1.4 J off, against bounds of
        // 0.15 J).
        let replaced = self
            .anchors
            .iter()
            .skip(kept)
            .find(|a| a.read_at == first.after)
            .copied();
        let newest = self.anchors.back().copied();
        if let (Some(old), Some(new), Some(b)) = (placed, replaced, newest) {
            // The power there: the counter's over the re-placed anchors (all placed alike).
            let level = if b.t > new.t {
                (b.joules - new.joules) / (b.t - new.t)
            } else {
                self.power_near(new.t)
            };
            let seam = level.max(0.0) * (new.t - old).abs() / 3f64.sqrt();
            if seam > 0.0 {
                for a in self.anchors.iter_mut().take(kept) {
                    a.seam_sigma = a.seam_sigma.hypot(seam);
                }
            }
        }
    }

    /// Turn read `r` (the newest) into an anchor; with `check`, score the model's prediction of
    /// it first (the self-check).
    pub(super) fn attribute_next(&mut self, r: Read, check: bool) {
        let value = r.mj as f64 / 1000.0;
        let (x_new, x_old) = self.candidates(&r);
        // The lag is fitted on the grid as it stands, so it absorbs the grid's phase error:
        // once measured, the described moment is as good as the lag fit.
        let t_err_sched = if self.schedule.lag_known {
            self.schedule.lag_err
        } else {
            self.schedule.lag_err.max(self.schedule.grid.phase_err)
        };
        let prev = self.anchors.back().copied();
        let Some(prev) = prev else {
            self.anchors.push_back(Anchor {
                t: x_new,
                joules: value,
                t_err: t_err_sched + x_old.map_or(0.0, |o| x_new - o),
                offset_sigma: 0.0,
                seam_sigma: 0.0,
                raw: value,
                read_at: r.after,
            });
            return;
        };
        // A read that spans more than one publish past the first (its thread descheduled for
        // several periods of a fast grid, a millisecond on AMD's) describes one of several
        // moments, not one of the two candidates: its value would be placed up to the span
        // off, past what the anchor's timing error says.
        if x_old.is_some_and(|old| x_new - old > 1.5 * self.schedule.grid.period) {
            return;
        }
        let offset = prev.joules - prev.raw;
        let predict = |x: f64| prev.joules + self.model(prev.t, x, None).0;
        // The value on the track's scale if the counter did not reset.
        let scaled = value + offset;
        let (x, t_err) = match x_old {
            None => (x_new, t_err_sched),
            Some(old) => {
                // Past a window edge that no power reading has seen yet, the load may have
                // stepped anywhere (the guess that it held would take a value after a step
                // down for the earlier publish): there, by what the model allows at each.
                // Each candidate's prediction once: the model integrates over the interval.
                let (p_new, p_old) = (predict(x_new), predict(old));
                let fits = |x: f64, predicted: f64| {
                    let (lo, hi) = self.allowed_range(prev, x);
                    let tol = 3.0
                        * (self.residual_scale(false) * (predicted - prev.joules).abs())
                            .max(self.resolution_j);
                    scaled >= lo - tol && scaled <= hi + tol
                };
                let (e_new, e_old) = ((scaled - p_new).abs(), (scaled - p_old).abs());
                let sep = (p_new - p_old).abs();
                let unseen = self.unseen_edge(x_new).is_some();
                // Where the load moves between readings, how many updates the prediction
                // spans from the last anchor: its miss grows with them (each can hide bursts
                // the readings missed), the candidates stay one update apart.
                let spans = if self.moves_within_intervals() {
                    ((x_new - prev.t) / self.schedule.grid.period.max(self.period)).max(1.0)
                } else {
                    1.0
                };
                let swing = self.reading_swing(prev.t - self.period, x_new + self.period);
                match (unseen, fits(x_new, p_new), fits(old, p_old)) {
                    (true, true, false) => (x_new, t_err_sched),
                    (true, false, true) => (old, t_err_sched),
                    // Either would do: cannot tell which publish it was, no anchor from it.
                    (true, true, true) => return,
                    // Else the nearer prediction, where clearly nearer, and where the other
                    // is further off than the prediction can be: under a load that moves
                    // between power updates the readings alias it, and the energy to either
                    // moment is known only to within what they span (seen on 12-40 ms serving
                    // steps: predictions 16 J off over 200-300 ms against publishes 15-24 J
                    // apart, anchors a whole period off with a millisecond's t_err). Nearer
                    // by a margin that shrinks with the updates the prediction spans: four
                    // updates past the last anchor (reads around them ambiguous), readings
                    // that missed the bursts predicted 8 J short, and a value of the earlier
                    // publish was 1.8 J from the later one's prediction, 8 J from its own.
                    _ if e_new.min(e_old) < 0.35 * sep / spans
                        && e_new.max(e_old) > 0.5 * swing * (x_new - prev.t) =>
                    {
                        (if e_new <= e_old { x_new } else { old }, t_err_sched)
                    }
                    _ => return,
                }
            }
        };
        // On the power grid with the lag that says so, the moment is a tick: snap to it.
        let (x, t_err) = match self.snap_to_tick(x) {
            Some(tick) if self.schedule.snaps() => (tick.t, tick.t_err + 0.0002),
            _ => (x, t_err),
        };
        if x <= prev.t + 1e-6 {
            return;
        }
        let dt = x - prev.t;
        let (pred, _) = self.model(prev.t, x, None);
        let ceiling = self.power_ceiling() * dt * 1.5 + 5.0 + 2.0 * self.resolution_j;
        let moved = scaled - prev.joules;
        let (joules, offset_sigma) = if moved < -self.resolution_j || moved > ceiling {
            // A reset, a counter going backwards, or a jump the board cannot draw: a new epoch,
            // joined to the last by the power model over the interval.
            let sigma = self.model_sigma(prev.t, x);
            (
                prev.joules + pred,
                (prev.offset_sigma.powi(2) + sigma.powi(2)).sqrt(),
            )
        } else {
            (scaled.max(prev.joules), prev.offset_sigma)
        };
        if check && offset_sigma == prev.offset_sigma {
            self.self_check(prev, x, joules - prev.joules, pred);
        }
        self.anchors.push_back(Anchor {
            t: x,
            joules,
            t_err,
            offset_sigma,
            seam_sigma: 0.0,
            raw: value,
            read_at: r.after,
        });
    }

    /// The counter's range at `x` (J, on the track's scale) that the model allows after anchor
    /// `prev`: its energy up to a window edge later than the last reading, and anything the
    /// board can draw past that edge (no reading has seen the load there).
    pub(super) fn allowed_range(&self, prev: Anchor, x: f64) -> (f64, f64) {
        let until = self.unseen_edge(x).map_or(x, |h| h.max(prev.t));
        let base = prev.joules + self.model(prev.t, until, None).0;
        let unseen = x - until;
        let (lo_w, hi_w) = (self.power_floor().max(0.0), self.power_ceiling());
        (base + unseen * lo_w, base + unseen * hi_w)
    }

    /// The first window edge after the last power reading and before `t`: the load may have
    /// stepped there to a level no reading has seen.
    pub(super) fn unseen_edge(&self, t: f64) -> Option<f64> {
        let seen = self.ticks.back()?.t;
        let i = self.hints.partition_recent(|&h| h <= seen);
        self.hints.get(i).copied().filter(|&h| h < t)
    }

    /// The tick within a quarter period of `x`, if any.
    pub(super) fn snap_to_tick(&self, x: f64) -> Option<Tick> {
        let i = self.ticks.partition_recent(|k| k.t < x);
        [i.checked_sub(1), Some(i)]
            .into_iter()
            .flatten()
            .filter_map(|k| self.ticks.get(k).copied())
            .filter(|k| (k.t - x).abs() < self.period / 4.0)
            .min_by(|a, b| (a.t - x).abs().total_cmp(&(b.t - x).abs()))
    }
}

/// Whether the schedule moved enough that reads must be attributed again.
pub(super) fn schedule_moved(a: &Schedule, b: &Schedule) -> bool {
    let d = (a.grid.phase - b.grid.phase).rem_euclid(b.grid.period);
    let phase = d.min(b.grid.period - d);
    a.fitted != b.fitted
        || (a.grid.period - b.grid.period).abs() > 1e-9
        || phase > 0.0005
        || (a.lag - b.lag).abs() > 0.0005
}

/// Whether the schedule changed enough that the self-check's residuals describe another model:
/// the first fit, a new grid period, the lag measured at last or moved beyond its error.
pub(super) fn schedule_changed_model(a: &Schedule, b: &Schedule) -> bool {
    a.fitted != b.fitted
        || (a.grid.period - b.grid.period).abs() > 1e-9
        || a.lag_known != b.lag_known
        || (a.lag - b.lag).abs() > b.lag_err.max(0.005)
}
