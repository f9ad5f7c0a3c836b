//! Power readings: ticks, the update period and phase, and gaps where readings failed.

use super::*;

impl Track {
    /// A power reading (mW) taken at `t`, with the driver's timestamp of it if it gave one.
    pub fn on_power(&mut self, t: f64, milliwatts: u32, stamp: Option<f64>) {
        self.version += 1;
        let watts = f64::from(milliwatts) / 1000.0;
        if let Some(since) = self.power_down_since.take() {
            self.end_gap(since, t, watts);
        }
        self.vote_stamps(milliwatts, stamp);
        if self.stamps == Stamps::Update {
            if let Some(ts) = stamp {
                if self.last_stamp.is_some_and(|l| ts > l + 1e-6) {
                    let tick = Tick {
                        t: ts,
                        watts,
                        seen: true,
                        t_err: 0.0002,
                        span: (ts, ts),
                        index: 0,
                    };
                    self.learn_period(ts);
                    self.push_tick(tick);
                }
            }
        } else {
            self.tick_from_polls(t, milliwatts, watts);
        }
        self.last_value = Some(milliwatts);
        self.last_stamp = stamp;
        self.last_poll = t;
        self.next_poll = match self.expected_tick() {
            // Timestamps time the updates: one poll just after each is enough.
            Some(e) if self.stamps == Stamps::Update => {
                if t < e + 0.002 {
                    e + 0.002
                } else {
                    t + POLL_STEP.max(self.period / 20.0)
                }
            }
            Some(e) if t < e - LOOK_EARLY => e - LOOK_EARLY,
            Some(_) => t + POLL_STEP,
            None => t + SEARCH_STEP,
        };
    }

    pub(super) fn vote_stamps(&mut self, milliwatts: u32, stamp: Option<f64>) {
        let Stamps::Unknown { update, call } = &mut self.stamps else {
            return;
        };
        let (Some(ts), Some(last_ts), Some(last_v)) = (stamp, self.last_stamp, self.last_value)
        else {
            if stamp.is_none() && self.last_value.is_some() {
                self.stamps = Stamps::Call;
            }
            return;
        };
        if milliwatts == last_v {
            if (ts - last_ts).abs() < 1e-6 {
                *update += 1;
            } else {
                *call += 1;
            }
        } else if (ts - last_ts).abs() < 1e-6 {
            // The value moved under a standing timestamp: timestamps say nothing.
            *call += 3;
        }
        if *call >= 3 {
            self.stamps = Stamps::Call;
        } else if *update >= 12 {
            self.stamps = Stamps::Update;
        }
    }

    pub(super) fn tick_from_polls(&mut self, t: f64, milliwatts: u32, watts: f64) {
        match self.last_value {
            // The first reading is not a tick: the update it shows happened at an unknown time
            // before it.
            None => {}
            Some(v) if v != milliwatts => {
                // The change happened between the previous poll and this one. When this thread
                // was held up (a loaded machine) that span is long; once the phase is known,
                // the expected update time inside it is the better estimate.
                let gap = t - self.last_poll;
                let held = gap > 2.0 * POLL_STEP;
                let expected = self
                    .expected_tick()
                    .filter(|&e| held && e > self.last_poll && e <= t);
                let (at, t_err, span) = match expected {
                    // Placed on the first update of the gap, where a noisy load changes the
                    // value at once; but a fast grid's (AMD's 1 ms) gap holds several updates,
                    // and a load step at a later one is placed early by up to the rest, which
                    // the span keeps for the bounds (seen beside a busy CI: a 0.2 s window's
                    // edge 0.37 J off against a 0.16 J bound).
                    Some(e) => {
                        let last = e + ((t - e) / self.period).floor().max(0.0) * self.period;
                        (e, 2.0 * POLL_STEP, (e, last))
                    }
                    None => {
                        let lo = self.last_poll.max(t - gap);
                        let at = (lo + t) / 2.0;
                        let span = if held { (lo, t) } else { (at, at) };
                        (at, ((t - lo) / 2.0).max(POLL_STEP / 2.0), span)
                    }
                };
                self.learn_period(at);
                self.push_tick(Tick {
                    t: at,
                    watts,
                    seen: true,
                    t_err,
                    span,
                    index: 0,
                });
            }
            Some(_) => {
                if let Some(expected) = self.expected_tick() {
                    if t > expected + LOOK_LATE {
                        // Due and not seen: an update that kept the value.
                        self.push_tick(Tick {
                            t: expected,
                            watts,
                            seen: false,
                            t_err: 2.0 * POLL_STEP,
                            span: (expected, expected),
                            index: 0,
                        });
                    }
                }
            }
        }
    }

    pub(super) fn expected_tick(&self) -> Option<f64> {
        if !self.locked {
            return None;
        }
        self.ticks.back().map(|k| k.t + self.period)
    }

    pub(super) fn learn_period(&mut self, t: f64) {
        let Some(prev) = self.ticks.iter().rev().find(|k| k.seen) else {
            return;
        };
        let d = t - prev.t;
        if d <= 0.0 || d > 20.0 * self.period.max(0.05) {
            return;
        }
        self.intervals.push_back(d);
        if self.intervals.len() > PERIOD_SAMPLES {
            self.intervals.pop_front();
        }
        // Updates that kept the value are not seen, so intervals are whole multiples of the
        // period: the short ones (a low quantile, robust to a stray short one) give the unit,
        // each interval over its multiple a sample of the period, and their median the period.
        // (Dividing by a guessed period instead would lock onto half a 160 ms period when the
        // guess is 100 ms.)
        let mut raw: Vec<f64> = self.intervals.iter().copied().collect();
        raw.sort_by(f64::total_cmp);
        let base = raw[raw.len() / 5];
        let mut v: Vec<f64> = raw
            .iter()
            .map(|&d| d / (d / base).round().max(1.0))
            .collect();
        v.sort_by(f64::total_cmp);
        let period = v[v.len() / 2];
        if !self.locked || (period - self.period).abs() > 0.02 * self.period {
            self.period = period;
        }
        self.locked = self.intervals.len() >= 3;
        if !self.schedule.fitted {
            self.schedule.grid.period = self.period;
        }
    }

    /// The period as the slope of the seen ticks' times against their update numbers (least
    /// squares over the last 512): a small error per period would otherwise add up to a phase
    /// off by milliseconds within seconds.
    pub(super) fn refine_period(&mut self) {
        let seen: Vec<(f64, f64)> = self
            .ticks
            .iter()
            .rev()
            .filter(|k| k.seen)
            .take(512)
            .map(|k| (k.index as f64, k.t))
            .collect();
        if seen.len() < 16 {
            return;
        }
        let n = seen.len() as f64;
        let (mx, mt) = seen
            .iter()
            .fold((0.0, 0.0), |(a, b), (x, t)| (a + x / n, b + t / n));
        let (sxx, sxt) = seen.iter().fold((0.0, 0.0), |(a, b), (x, t)| {
            (a + (x - mx).powi(2), b + (x - mx) * (t - mt))
        });
        if sxx <= 0.0 {
            return;
        }
        let slope = sxt / sxx;
        if (slope - self.period).abs() < 0.02 * self.period {
            self.period = slope;
            if !self.schedule.fitted {
                self.schedule.grid.period = slope;
            }
        }
    }

    pub(super) fn push_tick(&mut self, mut tick: Tick) {
        if self.ticks.back().is_some_and(|k| k.t >= tick.t) {
            return;
        }
        tick.index = self.ticks.back().map_or(0, |k| {
            k.index + ((tick.t - k.t) / self.period).round().max(1.0) as i64
        });
        self.ticks.push_back(tick);
        self.seen_max_w = self.seen_max_w.max(tick.watts);
        let n = self.ticks.len();
        self.recent_min_w = self
            .ticks
            .iter()
            .skip(n.saturating_sub(FLOOR_TICKS))
            .map(|k| k.watts)
            .fold(f64::INFINITY, f64::min);
        if !self.schedule.fitted && tick.seen {
            // The guess until calibrated: publishes after each power update, as long after it
            // as the backend states (an AMD board's metrics table: at once) or else a prior
            // lag. A stated lag is no guess: the first windows are timed by it, not the prior.
            let lag = self.known_lag.unwrap_or(PRIOR_LAG);
            self.schedule.grid = Grid {
                period: self.period,
                phase: tick.t + lag,
                phase_err: PRIOR_LAG,
            };
            self.schedule.lag = lag;
        }
        if tick.seen && self.locked {
            self.refine_period();
        }
        if self.ticks.len() % 4 == 0 {
            self.learn_load();
        }
        let horizon = tick.t - HISTORY_S;
        while self.ticks.len() > 2 && (self.ticks[1].t < horizon || self.ticks.len() > MAX_TICKS) {
            self.ticks.pop_front();
        }
        while self.anchors.len() > 2 && self.anchors[1].t < horizon {
            self.anchors.pop_front();
        }
        while self.gaps.front().is_some_and(|g| g.1 < horizon) {
            self.gaps.pop_front();
        }
        let oldest = self.ticks[0].t;
        while self.hints.front().is_some_and(|&h| h < oldest) {
            self.hints.pop_front();
        }
    }

    /// Power readings failed at `t`: no ticks until they work again (a gap in the model).
    pub fn on_power_fault(&mut self, t: f64) {
        self.version += 1;
        if self.power_down_since.is_none() {
            let since = self.ticks.back().map_or(t, |k| k.t.max(self.last_poll));
            self.power_down_since = Some(since);
        }
        self.last_value = None;
        self.last_stamp = None;
    }

    /// Whether power readings are failing now, and since when.
    pub fn power_down_since(&self) -> Option<f64> {
        self.power_down_since
    }

    pub(super) fn end_gap(&mut self, since: f64, until: f64, watts: f64) {
        // The phase is still known: the first reading after the gap is the value of the last
        // update, a tick at the grid's time, so the model has power again at once.
        let resumed = match (self.locked, self.ticks.back().copied()) {
            (true, Some(last)) => {
                let k = ((until - last.t) / self.period).floor();
                (k >= 1.0).then_some(last.t + k * self.period)
            }
            _ => None,
        };
        let end = resumed.unwrap_or(until);
        if end > since {
            self.gaps.push_back((since, end));
        }
        if let Some(t) = resumed {
            self.push_tick(Tick {
                t,
                watts,
                seen: false,
                t_err: 2.0 * POLL_STEP,
                span: (t, t),
                index: 0,
            });
        }
    }

    /// Retry power polling at `t` (after a fault).
    pub fn retry_power_at(&mut self, t: f64) {
        self.next_poll = t;
    }

    // ---- counter reads ---------------------------------------------------------------------
}
