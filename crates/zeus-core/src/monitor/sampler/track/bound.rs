//! The energy at a window edge and how wrong it may be, and windows from two edges.

use super::*;

impl Track {
    /// Energy (J, on the track's scale) at time `t`, from the cache. `None` before the first
    /// anchor.
    pub fn energy_at(&self, t: f64) -> Option<f64> {
        self.edge(t).map(|e| e.joules)
    }

    /// Whether an anchor after `t` exists (the energy at `t` is then interpolated, not
    /// extrapolated).
    pub fn is_settled(&self, t: f64) -> bool {
        self.anchors.back().is_some_and(|a| a.t > t)
    }

    /// The energy at `t` with its uncertainty.
    pub fn edge(&self, t: f64) -> Option<Edge> {
        let mut e = self.edge_model(t)?;
        // Until the lag is measured, every anchor's moment is a guess: the energy at `t` is
        // off by the power there times that guess's error (windows cancel part of it, where
        // the power at both edges is alike; the bound does not count on that).
        if !self.schedule.lag_known {
            let guess = self.power_near(t) * self.schedule.lag_err / 3f64.sqrt();
            e.sigma = (e.sigma.powi(2) + guess.powi(2)).sqrt();
        }
        Some(e)
    }

    pub(super) fn edge_model(&self, t: f64) -> Option<Edge> {
        let first = *self.anchors.front()?;
        let j = self.anchors.partition_recent(|a| a.t <= t);
        let res_sigma = self.resolution_j / 3f64.sqrt();
        if j == 0 {
            let (e, _) = self.model(t, first.t, None);
            let u = first.t - t;
            let gap = self.gap_overlap(t, first.t);
            return Some(Edge {
                joules: first.joules - e,
                sigma: (self.extrapolation_sigma(u, t) + res_sigma).max(0.0),
                hard: self.free_half_width(gap),
                offset_sigma: first.offset_sigma,
                seam_sigma: first.seam_sigma,
                settled: true,
                degraded: gap > 0.0,
            });
        }
        let a = self.anchors[j - 1];
        let timing = self.timing_sigma(a);
        let Some(&b) = self.anchors.get(j) else {
            let e = self.model_past_anchor(a.t, t);
            let u = t - a.t;
            // Lagging averages after a window edge: the new level is only roughly known.
            let (level_sigma, level_hard) = match self.open_level() {
                Some((h, _, sg)) if t > h && sg.is_finite() => (sg * (t - h), 0.0),
                Some((h, _, _)) if t > h => (0.0, self.free_half_width(t - h)),
                _ => (0.0, 0.0),
            };
            // How far the extrapolation goes wrong is learned against the settled value, which
            // is itself off by what interpolation inside a counter interval is: both count.
            let hinted = self
                .last_hint_in(a.t - HINT_TOLERANCE, f64::INFINITY)
                .is_some();
            let interval = self.power_near(t) * self.schedule.grid.period.max(self.period);
            // (Where in its counter interval the end will fall is not known yet: the shape's
            // factor 2 sqrt(x (1 - x)) averages pi / 4 over it.) Where window edges step the
            // load, the settled value is as good as the step is placed, which the learned
            // extrapolation errors already hold; a load that moves within a couple of
            // intervals is another matter.
            let shape =
                if self.steps() && !self.moves_within_intervals() && !self.moves_on_its_own() {
                    0.0
                } else {
                    // A load that moves within the interval is unknown past the last reading as a
                    // random walk of its variance over its correlation time.
                    let walk = (2.0 * self.load_var * self.tau.min(u) * u).sqrt();
                    (self.residual_scale(hinted) * interval * std::f64::consts::FRAC_PI_4).max(walk)
                };
            let ex = self.extrapolation_sigma(u, t);
            let spread = self.spread_sigma(a.t, t);
            return Some(Edge {
                joules: a.joules + e,
                sigma: (ex.powi(2)
                    + shape.powi(2)
                    + timing.powi(2)
                    + spread.powi(2)
                    + res_sigma.powi(2)
                    + level_sigma.powi(2))
                .sqrt(),
                hard: self.free_half_width(self.gap_overlap(a.t, t)) + level_hard,
                offset_sigma: a.offset_sigma,
                seam_sigma: a.seam_sigma,
                settled: false,
                degraded: self.gap_overlap(a.t, t) > 0.0,
            });
        };
        let delta = b.joules - a.joules;
        // Window edges inside: solve the level between the edges from the counter.
        let (fixed, free) = self.model(a.t, b.t, Some(0.0));
        let level =
            (free > 1e-9).then(|| ((delta - fixed) / free).clamp(0.0, 1.5 * self.power_ceiling()));
        let whole = self.model(a.t, b.t, level).0;
        let part = self.model(a.t, t, level).0;
        let frac = if whole > 0.0 {
            (part / whole).clamp(0.0, 1.0)
        } else {
            ((t - a.t) / (b.t - a.t)).clamp(0.0, 1.0)
        };
        let joined = b.offset_sigma > a.offset_sigma;
        let in_gap = self.in_gap(t);
        let (joules, sigma, hard) = if in_gap {
            // No readings around `t`: anything the board can draw, within the counter's step.
            let (lo, hi) = self.feasible(t - a.t, b.t - t, delta);
            ((lo + hi) / 2.0 + a.joules, res_sigma, (hi - lo) / 2.0)
        } else {
            let hinted = self.last_hint_in(a.t - HINT_TOLERANCE, b.t).is_some();
            let shape =
                self.residual_scale(hinted) * delta.abs() * 2.0 * (frac * (1.0 - frac)).sqrt();
            // A load that moves within the interval: where the counter's step fell inside it is
            // as uncertain as a bridge of that load (variance 2 var tau over the span, pinned
            // at both anchors), whatever the readings at its ends say.
            let shape = if self.moves_within_intervals() {
                let span = b.t - a.t;
                let x = ((t - a.t) / span).clamp(0.0, 1.0);
                shape.max((2.0 * self.load_var * self.tau * span * x * (1.0 - x)).sqrt())
            } else {
                shape
            };
            // Window edges inside the interval: the model steps the load at each to levels
            // the readings around say, and what the counter's step holds beyond (or short of)
            // that is drawn somewhere in the interval, before `t` or after it: as uncertain as
            // a bridge pinned at both anchors. (Readings that alias a load stepping every few
            // tens of ms put the model's total 34-106% off the counter's step; the edges of
            // such intervals were 3-5 J off against bounds of 2 J.)
            let hints = self.hints_between(a.t, b.t);
            let shape = if hints >= 1 {
                let unexplained = delta - self.model(a.t, b.t, None).0;
                let x = ((t - a.t) / (b.t - a.t)).clamp(0.0, 1.0);
                let shape = shape.max(unexplained.abs() * (x * (1.0 - x)).sqrt());
                // Nor need the energy the readings miss (a prefill between them) lie on either
                // side of `t` at all: the energy at `t` may be anywhere from the readings' own
                // to theirs plus all of it. Where the estimate sits at one end of that, the
                // bound reaches the other (seen: an edge 11 ms into an interval whose 27 ms
                // prefill began after it, estimated with 6 J of the prefill before it, against
                // a bound of 3.6 J; with the model's level solved from the counter, the
                // estimate need not sit where a bridge from the anchors would).
                let readings = self.model(a.t, t, None).0;
                let at = delta * frac;
                // Nor is the readings' own energy on either side of `t` more than a guess:
                // where between two readings the load moved (ramped across the interval), or
                // at which level it held between window edges (the edges' stretch guessed at
                // the readings' mean). At the lowest level seen around (less its noise), the
                // rest may lie on the other side (seen: readings of 99.8 W and 104.4 W ramped
                // across an edge just before a prefill put 0.2 J of the rise and 0.7 J of
                // the prefill before it, 0.95 J off against a bound of 0.74 J; a stretch
                // guessed at 122.7 W that held at 120.9 W hid 0.14 J more of a prefill).
                let (mut low, mut high) = (
                    readings.min(readings + unexplained),
                    readings.max(readings + unexplained),
                );
                if let Some((seen_lo, _)) = self.readings_around(a.t, b.t) {
                    let floor = seen_lo.max(0.0) * (1.0 - 2.0 * self.noise).max(0.0);
                    let (before, after) = if self.steps() {
                        (
                            self.model(a.t, t, Some(floor)).0,
                            self.model(t, b.t, Some(floor)).0,
                        )
                    } else {
                        (floor * (t - a.t), floor * (b.t - t))
                    };
                    low = low.min(before);
                    high = high.max(delta - after);
                }
                let reach = (at - low).abs().max((at - high).abs());
                let shape = shape.max(reach / Z95);
                if hints >= 2 {
                    // Two edges or more (engine steps shorter than the counter's update): the
                    // load steps at each to levels no reading resolves (a 30 ms prefill between
                    // two readings 100 ms apart is not in either), and the one level solved
                    // from the counter puts the energy the readings miss where no reading was
                    // (between the edges); spread over the interval it would sit elsewhere.
                    // Where the two placements differ at `t` (a level past what the board
                    // draws, squeezed into a few milliseconds beside `t`), the energy at `t`
                    // lies anywhere between them. Nor, where the readings around differ, is it
                    // known at which of their levels the load was on either side of `t`.
                    let swing = self.reading_swing(a.t - self.period, b.t + self.period);
                    let near = (t - a.t).min(b.t - t).max(0.0);
                    let spread = readings + unexplained * x;
                    let placed = (delta * frac - spread).abs();
                    shape
                        .max(swing * near / 3f64.sqrt())
                        .max(placed / 3f64.sqrt())
                } else {
                    shape
                }
            } else {
                shape
            };
            // Where the load steps at this edge, anchors off by their timing error misplace
            // the step's energy.
            let step = if hinted {
                self.step_at(t) * a.t_err.max(b.t_err) / 3f64.sqrt()
            } else {
                0.0
            };
            let timing = timing.max(self.timing_sigma(b)).max(step);
            let spread = self.spread_sigma(a.t, b.t);
            (
                a.joules + delta * frac,
                (shape.powi(2) + timing.powi(2) + spread.powi(2) + res_sigma.powi(2)).sqrt(),
                0.0,
            )
        };
        Some(Edge {
            joules,
            sigma,
            hard,
            offset_sigma: if joined && frac > 0.0 {
                b.offset_sigma
            } else {
                a.offset_sigma
            },
            // A seam between the two anchors: where in between the energy moved is not known.
            seam_sigma: ((1.0 - frac) * a.seam_sigma.powi(2) + frac * b.seam_sigma.powi(2)).sqrt(),
            settled: true,
            degraded: in_gap || joined,
        })
    }

    /// Seconds of `[a, b]` without power readings (faults, finished or ongoing).
    pub(super) fn gap_overlap(&self, a: f64, b: f64) -> f64 {
        let mut total: f64 = self
            .gaps
            .iter()
            .map(|g| (g.1.min(b) - g.0.max(a)).max(0.0))
            .sum();
        if let Some(since) = self.power_down_since {
            total += (b - since.max(a)).max(0.0);
        }
        total
    }

    pub(super) fn in_gap(&self, t: f64) -> bool {
        self.gaps.iter().any(|g| g.0 <= t && t <= g.1)
            || self.power_down_since.is_some_and(|s| t >= s)
    }

    /// Range of the energy from `a` to `t` (J) given `before` s from `a` to `t`, `after` s from
    /// `t` to `b`, and the counter step `delta` over both, for any power the board can draw.
    pub(super) fn feasible(&self, before: f64, after: f64, delta: f64) -> (f64, f64) {
        let (lo_w, hi_w) = (self.power_floor().max(0.0), self.power_ceiling());
        let lo = (lo_w * before).max(delta - hi_w * after);
        let hi = (hi_w * before).min(delta - lo_w * after);
        if hi < lo {
            let m = (lo + hi) / 2.0;
            (m, m)
        } else {
            (lo, hi)
        }
    }

    /// Half-width (J) for `free` seconds of unknown power: the whole range the board can draw,
    /// since the estimate there is the last reading, not the middle of the range.
    pub(super) fn free_half_width(&self, free: f64) -> f64 {
        if free <= 0.0 {
            return 0.0;
        }
        (self.power_ceiling() - self.power_floor().max(0.0)) * free
    }

    /// How much the power model changes across `t` (W): the step a window edge there makes.
    pub(super) fn step_at(&self, t: f64) -> f64 {
        let d = self.period.max(0.005);
        let (before, _) = self.model(t - d, t, None);
        let (after, _) = self.model(t, t + d, None);
        (after - before).abs() / d
    }

    /// Energy sigma from the uncertainty of when anchor `a` was (J): only where the power
    /// changes around it.
    pub(super) fn timing_sigma(&self, a: Anchor) -> f64 {
        let i = self.ticks.partition_recent(|k| k.t <= a.t);
        if i == 0 || i >= self.ticks.len() {
            return 0.0;
        }
        let dp = (self.tick_power(i) - self.tick_power(i - 1)).abs();
        dp * a.t_err / 3f64.sqrt()
    }

    /// Sigma (J) of the power steps in `[lo, hi]` that a held-up poll saw without telling at
    /// which of several updates they fell (a tick's span): each may lie anywhere in it, which
    /// moves up to the step times the span's part in `[lo, hi]` across an edge there (or,
    /// with the counter's step between two anchors fixed, the interval's share of it).
    pub(super) fn spread_sigma(&self, lo: f64, hi: f64) -> f64 {
        let j = self.ticks.partition_recent(|k| k.t <= hi);
        let mut var = 0.0;
        // A span ends before the next tick (the poll that saw it came first): the first tick
        // whose span ends before `lo` ends the search.
        for i in (1..j).rev() {
            let (first, last) = self.ticks[i].span;
            if last < lo {
                break;
            }
            let within = last.min(hi) - first.max(lo);
            if within > 0.0 {
                let dp = (self.tick_power(i) - self.tick_power(i - 1)).abs();
                var += (dp * within).powi(2) / 3.0;
            }
        }
        var.sqrt()
    }

    /// The power an extrapolation's error scales with (W): the latest reading, or the load's
    /// recent level where that is higher (a load that idles now may be busy the next moment).
    pub(super) fn power_scale(&self, t: f64) -> f64 {
        self.power_near(t).max(self.level_guess)
    }

    /// Sigma (J) of the model's energy `u` s past the last anchor, up to `t`.
    pub(super) fn extrapolation_sigma(&self, u: f64, t: f64) -> f64 {
        let p = self.power_scale(t);
        let k = match self
            .end_errors
            .scale()
            .filter(|_| self.end_errors.len() >= 4)
        {
            // Readings' noise alone puts an extrapolation off by the last reading's noise
            // over the stretch past it: uniform of amplitude `noise`, a sigma of noise / sqrt 3.
            Some(r) => r.max(self.noise / 3f64.sqrt()),
            // Before the board has shown how well it extrapolates: where window edges step the
            // load, twice the model's error over a counter interval; else the spread of the
            // recent power, or 10%.
            None if self.steps() && !self.moves_within_intervals() && !self.moves_on_its_own() => {
                (2.0 * self.residual_scale(false)).max(0.02)
            }
            None => self.power_spread().max(0.1),
        };
        k * u * p
    }

    /// Whether the load moves within a counter interval (its correlation time is
    /// shorter): then no reading says much about the power between two of them.
    pub(super) fn moves_within_intervals(&self) -> bool {
        self.tau < self.schedule.grid.period.max(self.period)
    }

    /// The power of the tick at or before `t` (W).
    pub(super) fn power_near(&self, t: f64) -> f64 {
        let i = self.ticks.partition_recent(|k| k.t <= t);
        if self.ticks.is_empty() {
            return 0.0;
        }
        self.tick_power(i.saturating_sub(1).min(self.ticks.len() - 1))
    }

    /// RMS change between consecutive ticks over their mean, recently.
    pub(super) fn power_spread(&self) -> f64 {
        let n = self.ticks.len();
        if n < 3 {
            return 0.0;
        }
        let k0 = n.saturating_sub(50);
        let mut s = 0.0;
        let mut m = 0.0;
        for k in k0 + 1..n {
            let (a, b) = (self.tick_power(k - 1), self.tick_power(k));
            s += (b - a).powi(2);
            m += (a + b) / 2.0;
        }
        let c = (n - k0 - 1) as f64;
        (s / c).sqrt() / (m / c).max(1.0)
    }

    /// The energy of window `[t0, t1]` and its ~95% bound; marks `t1` as an edge first when
    /// `mark_end`, and remembers an extrapolated end so the bound learns how far such ends go
    /// wrong.
    pub fn window(&mut self, t0: f64, t1: f64, mark_end: bool) -> Option<WindowEstimate> {
        self.window_from(t0, None, t1, mark_end).map(|(w, _)| w)
    }

    /// [`Track::window`] with the start edge given when `start` is: the end edge of the slice
    /// before, when a window is cut, so that the slices' energies add up to the whole window's
    /// (each edge is evaluated once, not again with what the cache learned since). Also the
    /// end edge, for the slice after.
    pub fn window_from(
        &mut self,
        t0: f64,
        start: Option<Edge>,
        t1: f64,
        mark_end: bool,
    ) -> Option<(WindowEstimate, Edge)> {
        if mark_end {
            self.add_hint(t1);
        }
        let e0 = match start {
            Some(e) => e,
            None => self.edge(t0)?,
        };
        let e1 = self.edge(t1)?;
        if !e1.settled && !e1.degraded {
            let last = self.anchors.back().map_or(t1, |a| a.t);
            let p = self.power_scale(t1);
            if self.pending_ends.back().is_none_or(|x| x.0 < t1) {
                push_bounded(
                    &mut self.pending_ends,
                    (t1, e1.joules, t1 - last, p),
                    RESIDUALS,
                );
            }
        }
        // The edge the next slice of a cut window starts from. An end estimated below the
        // start (the at-end extrapolation ran high at the start, and the readings since pulled
        // it back) makes this slice zero, not negative; the next slice then starts where this
        // one did, so that the slices still add up to the whole window: starting it at `e1`
        // would count the dip again, once per slice (+5% over a minute of 20 ms slices).
        let carry = if e1.joules < e0.joules {
            Edge {
                joules: e0.joules,
                ..e1
            }
        } else {
            e1
        };
        Some((combine(e0, e1), carry))
    }

    /// The window estimate without marking anything.
    pub fn window_estimate(&self, t0: f64, t1: f64) -> Option<WindowEstimate> {
        Some(combine(self.edge(t0)?, self.edge(t1)?))
    }

    /// The bound of a window read directly at its edges, each edge `(t, late)` read `late` s
    /// after `t`: the value there is stale by the lag plus up to a period, as of the read, so
    /// it may miss or hold the energy from that much before `t` to the read.
    pub fn direct_bound(&self, (t0, late0): (f64, f64), (t1, late1): (f64, f64)) -> f64 {
        let s = &self.schedule;
        let stale = if s.lag_beyond_range || !s.lag_known {
            (2.0 * LAG_MAX).max(self.lag_beyond + 0.02)
        } else {
            s.lag + s.lag_err
        } + s.grid.period
            + s.grid.phase_err;
        let edge = |t: f64, late: f64| {
            let late = late.max(0.0);
            let (e, _) = self.model(t - stale, t + late, None);
            e * 1.1
                + self.free_half_width(self.gap_overlap(t - stale, t + late))
                + self.resolution_j
        };
        edge(t0, late0).max(edge(t1, late1)) + 2.0 * self.resolution_j
    }

    /// Energy of `[t0, t1]` integrated from the power readings alone, with its ~95% bound.
    pub fn power_window(&self, t0: f64, t1: f64) -> Option<WindowEstimate> {
        if self.ticks.len() < 2 || t1 < t0 {
            return None;
        }
        let (e, free) = self.model(t0, t1, None);
        // Between ticks the power may have moved anywhere between their readings; readings
        // are noisy; averages lag by half their window.
        let lo = self.ticks.partition_recent(|k| k.t <= t0).saturating_sub(1);
        let hi = self
            .ticks
            .partition_recent(|k| k.t < t1)
            .min(self.ticks.len() - 1);
        let mut var = 0.0;
        for i in lo..hi {
            let (a, b) = (self.ticks[i], self.ticks[i + 1]);
            let span = (b.t.min(t1) - a.t.max(t0)).max(0.0);
            let dp = (self.tick_power(i + 1) - self.tick_power(i)).abs();
            var += (dp * span / 2.0).powi(2) + (self.noise * a.watts * span).powi(2);
        }
        let tail = (t1 - self.ticks.back().expect("ticks").t).max(0.0);
        var += (self.power_spread().max(0.05) * self.power_near(t1) * tail).powi(2);
        let lag = if self.average_only && self.averaged.is_some() {
            let w = self.averaged.unwrap_or(0.0);
            (self.power_near(t1) - self.power_near(t0)).abs() * w / 2.0
        } else {
            0.0
        };
        let gap = self.gap_overlap(t0, t1);
        let _ = free;
        Some(WindowEstimate {
            joules: e.max(0.0),
            bound: Z95 * var.sqrt() + lag + self.free_half_width(gap),
            degraded: gap > 0.0,
        })
    }
}

/// A window from its two edges: the difference, and the two edges' uncertainties at ~95%.
pub(super) fn combine(e0: Edge, e1: Edge) -> WindowEstimate {
    let offsets = (e1.offset_sigma.powi(2) - e0.offset_sigma.powi(2)).abs();
    let seams = (e1.seam_sigma.powi(2) - e0.seam_sigma.powi(2)).abs();
    let sigma = (e0.sigma.powi(2) + e1.sigma.powi(2) + offsets + seams).sqrt();
    WindowEstimate {
        joules: (e1.joules - e0.joules).max(0.0),
        bound: Z95 * sigma + e0.hard + e1.hard,
        degraded: e0.degraded || e1.degraded || offsets > 0.0,
    }
}
