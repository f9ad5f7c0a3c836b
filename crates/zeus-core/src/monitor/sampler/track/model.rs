//! The power model between anchors: ticks as ramps, steps at window edges, levels the
//! counter leaves free, and its integral.

use super::*;

impl Track {
    /// The power to use for tick `k`: its reading, or for lagging averages the counter's own
    /// mean power around it (see [`Track::counter_level`]).
    pub(super) fn tick_power(&self, k: usize) -> f64 {
        let tick = self.ticks[k];
        if self.averaged.is_none() || self.anchors.len() < 2 {
            return tick.watts;
        }
        self.counter_level(tick.t)
    }

    /// Lagging averages past the last anchor, where a window edge stepped the load: the edge,
    /// the new level and its standard error (W; infinite where no reading since says anything).
    /// A trailing average of window `W` moves by the step times the time since it over `W`,
    /// so the step is that move scaled back up (noisy: the readings' noise is scaled with it).
    pub(super) fn open_level(&self) -> Option<(f64, f64, f64)> {
        let w = self.averaged?;
        let last = self.anchors.back()?;
        let h = self.last_hint_in(last.t, f64::INFINITY)?;
        let old = self.interval_mean(self.anchors.len() - 1)?;
        let before = self.ticks.iter().rev().find(|k| k.t <= h)?;
        let after = self.ticks.back()?;
        let since = after.t - h;
        if since < self.period * 0.5 {
            return Some((h, old, f64::INFINITY));
        }
        let scale = w / since.min(w);
        let level = (old + (after.watts - before.watts) * scale)
            .clamp(self.power_floor().max(0.0), self.power_ceiling());
        let sigma = self.noise.max(0.01) * after.watts.max(old) * scale * 2f64.sqrt();
        Some((h, level, sigma))
    }

    /// Where the last counter interval holds a window edge: the level after it, which splits
    /// the interval's step with the level before (the previous interval's mean). `None` where
    /// the edge is too close to the interval's end for the split to say much.
    pub(super) fn level_after_last_edge(&self) -> Option<f64> {
        let n = self.anchors.len();
        if n < 3 {
            return None;
        }
        let (a, b) = (self.anchors[n - 2], self.anchors[n - 1]);
        let h = self.last_hint_in(a.t, b.t)?;
        if b.t - h < 0.25 * (b.t - a.t) {
            return None;
        }
        let before = self.interval_mean(n - 2)?;
        let after = (b.joules - a.joules - before * (h - a.t)) / (b.t - h);
        Some(after.clamp(self.power_floor().max(0.0), self.power_ceiling()))
    }

    /// Mean power (W) of the counter's interval `j` (between anchors `j - 1` and `j`).
    pub(super) fn interval_mean(&self, j: usize) -> Option<f64> {
        if j == 0 || j >= self.anchors.len() {
            return None;
        }
        let (a, b) = (self.anchors[j - 1], self.anchors[j]);
        Some(((b.joules - a.joules) / (b.t - a.t).max(1e-6)).max(0.0))
    }

    /// The counter's mean power (W) over the anchors that lie within `[a, b]`, where at least
    /// two do.
    pub(super) fn mean_within(&self, a: f64, b: f64) -> Option<f64> {
        let i = self.anchors.partition_recent(|x| x.t < a);
        let j = self.anchors.partition_recent(|x| x.t <= b);
        self.mean_of_anchors(i, j)
    }

    /// The counter's mean power (W) from anchor `i` to anchor `j - 1`, where they are two and
    /// in one epoch.
    fn mean_of_anchors(&self, i: usize, j: usize) -> Option<f64> {
        if j < i + 2 {
            return None;
        }
        let (x, y) = (self.anchors[i], self.anchors[j - 1]);
        if x.offset_sigma != y.offset_sigma {
            return None;
        }
        Some(((y.joules - x.joules) / (y.t - x.t).max(1e-6)).max(0.0))
    }

    /// Where the model's power is a guess with nothing behind it: faults, and stretches
    /// between two window edges in one interval of the power readings that the counter did
    /// not resolve either.
    pub(super) fn unknown_stretches(&self) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = self.gaps.iter().copied().collect();
        for pair in self.hints.iter().zip(self.hints.iter().skip(1)) {
            let (&h0, &h1) = pair;
            let ticks_between = self.ticks.partition_recent(|k| k.t < h1)
                - self.ticks.partition_recent(|k| k.t <= h0);
            if ticks_between == 0 && self.mean_within(h0, h1).is_none() {
                out.push((h0, h1));
            }
        }
        out
    }

    /// The power at `t` from the counter alone: the mean of its interval around `t`; where a
    /// window edge lies in that interval (the load stepped there), the mean of the interval
    /// before for moments before the edge and of the one after for moments after it.
    pub(super) fn counter_level(&self, t: f64) -> f64 {
        let n = self.anchors.len();
        let j = self.anchors.partition_recent(|a| a.t <= t);
        let latest = || self.interval_mean(n - 1).unwrap_or(0.0);
        if j == 0 {
            return self.interval_mean(1).unwrap_or(0.0);
        }
        if j >= n {
            return match self.open_level() {
                Some((h, level, _)) if t >= h => level,
                _ => self.level_after_last_edge().unwrap_or_else(latest),
            };
        }
        let (a, b) = (self.anchors[j - 1].t, self.anchors[j].t);
        let first = self.hints.partition_recent(|&h| h <= a);
        let last = self.hints.partition_recent(|&h| h < b);
        if first == last {
            return self.interval_mean(j).unwrap_or_else(latest);
        }
        if t < self.hints[first] {
            self.interval_mean(j - 1)
        } else if t >= self.hints[last - 1] {
            self.interval_mean(j + 1)
        } else {
            None
        }
        .or_else(|| self.interval_mean(j))
        .unwrap_or_else(latest)
    }

    /// The highest power the board may draw (W): its maximum limit, or what was seen.
    pub(super) fn power_ceiling(&self) -> f64 {
        self.max_power_w.max(self.seen_max_w * 1.2).max(1.0)
    }

    /// The lowest power seen lately (W).
    pub(super) fn power_floor(&self) -> f64 {
        self.recent_min_w.min(self.power_ceiling()) * 0.8
    }

    /// The model's pieces between ticks `i` and `i + 1`; window edges step the load when
    /// `steps`. `walk` is where the previous interval's searches ended (intervals are taken
    /// in order).
    pub(super) fn pieces(
        &self,
        i: usize,
        steps: bool,
        walk: &mut Walk,
        mut emit: impl FnMut(Piece),
    ) {
        let (a, b) = (self.ticks[i], self.ticks[i + 1]);
        let (wa, wb) = (self.tick_power(i), self.tick_power(i + 1));
        // A stretch without readings (a fault): its level is unknown.
        if self.gaps.iter().any(|g| g.0 < b.t && g.1 > a.t) {
            emit(Piece {
                t0: a.t,
                t1: b.t,
                shape: Shape::Free {
                    guess: (wa + wb) / 2.0,
                },
            });
            return;
        }
        // A tick is timed to within a poll step, so an edge just before it may really fall
        // after it: such an edge counts for this interval too (at its start).
        let (start, end) = walk.hints_in(&self.hints, a.t - HINT_TOLERANCE, b.t);
        if start == end || !steps {
            emit(Piece {
                t0: a.t,
                t1: b.t,
                shape: self.between(a.t, b.t, wa, wb),
            });
            return;
        }
        // A step at the first edge; between the first and the last edge (if they differ) one
        // level, unknown until the counter says.
        let (first, last) = (self.hints[start].max(a.t), self.hints[end - 1].max(a.t));
        emit(Piece {
            t0: a.t,
            t1: first,
            shape: Shape::Ramp { w0: wa, w1: wa },
        });
        if last > first {
            // The stretch between edges had no power reading; the counter may have measured
            // it whole (a short gap between windows on a fast counter).
            let (i, j) = walk.anchors_in(&self.anchors, first, last);
            let guess = self.mean_of_anchors(i, j).unwrap_or((wa + wb) / 2.0);
            emit(Piece {
                t0: first,
                t1: last,
                shape: Shape::Free { guess },
            });
        }
        emit(Piece {
            t0: last,
            t1: b.t,
            shape: Shape::Ramp { w0: wb, w1: wb },
        });
    }

    /// The power between two readings: a ramp where the load holds longer than the interval,
    /// else the readings' pull fading into the level between them (the bridge of a load whose
    /// correlation decays over `tau`).
    pub(super) fn between(&self, ta: f64, tb: f64, pa: f64, pb: f64) -> Shape {
        let tau = self.tau;
        if !tau.is_finite() || tb - ta < 0.2 * tau {
            Shape::Ramp { w0: pa, w1: pb }
        } else {
            // Without the counter, the level between two readings is guessed as their mean:
            // a load that holds stays predicted where it is (the load's long-run mean would
            // pull every steady interval toward it).
            Shape::Bridge {
                ta,
                tb,
                pa,
                pb,
                tau,
                guess: (pa + pb) / 2.0,
            }
        }
    }

    /// Whether window edges step the load in the model: as long as they predict the counter
    /// at least as well as the bridge does.
    pub(in crate::monitor::sampler) fn steps(&self) -> bool {
        match (self.hinted.scale(), self.hinted_bridge.scale()) {
            (Some(step), Some(bridge)) => step <= bridge * 1.1,
            _ => true,
        }
    }

    /// Whether the load keeps moving, and not where window edges are (as of the last
    /// [`Self::learn_load`]): then the stretch past the last reading is as unknown as a
    /// random walk of the load. A load that stepped once, or holds, is not such a load.
    pub(super) fn moves_on_its_own(&self) -> bool {
        !self.edges_explain && self.tau.is_finite()
    }

    /// Of how far the recent readings moved from one to the next (beyond their noise), whether
    /// at least half is across window edges. A load that moves on its own (inference serving,
    /// a data loader that stalls) moves anywhere, and the edges' share of its moves is their
    /// share of the time.
    fn moves_at_edges(&self) -> bool {
        let n = self.ticks.len();
        if n < 3 {
            return true;
        }
        let k0 = n.saturating_sub(64);
        let (mut all, mut at_edges) = (0.0, 0.0);
        let mut h = self.hints.partition_recent(|&h| h <= self.ticks[k0].t);
        for k in k0 + 1..n {
            let (t0, t1) = (self.ticks[k - 1].t, self.ticks[k].t);
            let noise = self.noise * self.tick_power(k);
            let moved =
                ((self.tick_power(k) - self.tick_power(k - 1)).powi(2) - noise.powi(2)).max(0.0);
            all += moved;
            let mut across = false;
            while self.hints.get(h).is_some_and(|&x| x <= t1) {
                across |= self.hints[h] > t0;
                h += 1;
            }
            if across {
                at_edges += moved;
            }
        }
        all <= 1e-9 || at_edges >= 0.5 * all
    }

    /// Integral of the power model over `[a, b]` (J), free parts at `level` if given (else
    /// at their guesses), and the weight of the free parts in `[a, b]` (s).
    pub(super) fn model(&self, a: f64, b: f64, level: Option<f64>) -> (f64, f64) {
        self.model_with(a, b, level, self.steps())
    }

    /// [`Track::model`] from the last anchor at `a` to `t` at or past the last reading (a
    /// window edge at about now), free parts at their guesses: the stretch up to the last
    /// reading comes from the cache while nothing before it changes, so that a tight loop of
    /// windows integrates only what lies past it (a board updating every millisecond has
    /// several readings since its last anchor; each edge integrated them all again).
    ///
    /// Not for lagging averages: their readings' power comes from the counter and from the
    /// latest window edge ([`Track::tick_power`]), which every edge moves.
    pub(super) fn model_past_anchor(&self, a: f64, t: f64) -> f64 {
        let last = self.ticks.back().map(|k| k.t);
        let Some(last) = last.filter(|&l| l >= a && t >= l && self.averaged.is_none()) else {
            return self.model(a, t, None).0;
        };
        let steps = self.steps();
        let cached = self.head_model.get().filter(|c| {
            c.version == self.version && c.from == a && c.to == last && c.steps == steps
        });
        let head = match cached {
            Some(c) => c.joules,
            None => {
                let joules = self.model_with(a, last, None, steps).0;
                self.head_model.set(Some(HeadModel {
                    version: self.version,
                    from: a,
                    to: last,
                    steps,
                    joules,
                }));
                joules
            }
        };
        head + self.model_with(last, t, None, steps).0
    }

    pub(super) fn model_with(&self, a: f64, b: f64, level: Option<f64>, steps: bool) -> (f64, f64) {
        if b <= a || self.ticks.is_empty() {
            return (0.0, 0.0);
        }
        let n = self.ticks.len();
        let first = self.ticks[0];
        let last = self.ticks[n - 1];
        let mut total = 0.0;
        let mut free = 0.0;
        let mut add = |p: &Piece, x: f64, y: f64| {
            let (fixed, w, guessed) = p.parts(x, y);
            total += fixed + level.map_or(guessed, |l| l * w);
            free += w;
        };
        if a < first.t {
            let p = Piece {
                t0: f64::NEG_INFINITY,
                t1: first.t,
                shape: Shape::Ramp {
                    w0: self.tick_power(0),
                    w1: self.tick_power(0),
                },
            };
            add(&p, a, b);
        }
        if b > last.t {
            let pw = self.tick_power(n - 1);
            let from = a.max(last.t);
            // Past the last tick: the reading held (window edges step the load), or its pull
            // fading into the level; during an ongoing fault, unknown.
            let down = self.power_down_since.map_or(b, |s| s.max(from).min(b));
            // Where window edges step the load, one past the last reading ends the hold: the
            // level after it is unknown (the counter solves it, where one follows).
            let edge = steps.then(|| self.unseen_edge(down)).flatten();
            let until = edge.map_or(down, |h| h.max(from));
            let hold = if steps || !self.tau.is_finite() {
                Shape::Ramp { w0: pw, w1: pw }
            } else {
                Shape::Relax {
                    ta: last.t,
                    pa: pw,
                    tau: self.tau,
                    guess: self.level_guess,
                }
            };
            add(
                &Piece {
                    t0: last.t,
                    t1: f64::INFINITY,
                    shape: hold,
                },
                from,
                until,
            );
            if until < b {
                add(
                    &Piece {
                        t0: until,
                        t1: f64::INFINITY,
                        shape: Shape::Free { guess: pw },
                    },
                    until,
                    b,
                );
            }
        }
        let lo = self.ticks.partition_recent(|k| k.t <= a).saturating_sub(1);
        let hi = self.ticks.partition_recent(|k| k.t < b).min(n - 1);
        let mut walk = Walk::default();
        for i in lo..hi {
            self.pieces(i, steps, &mut walk, |p| add(&p, a, b));
        }
        (total, free)
    }

    /// Update the load's correlation time and level from the recent readings.
    pub(super) fn learn_load(&mut self) {
        // Here, every few readings on the sampler thread, rather than at every window edge that
        // asks: on boards with lagging averages each reading's power is a search among anchors.
        self.edges_explain = self.moves_at_edges();
        let n = self.ticks.len();
        if n < 12 {
            return;
        }
        let k0 = n.saturating_sub(64);
        let w: Vec<f64> = (k0..n).map(|k| self.tick_power(k)).collect();
        let mean = w.iter().sum::<f64>() / w.len() as f64;
        let var = w.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / w.len() as f64;
        let recent = &w[w.len().saturating_sub(20)..];
        self.level_guess = recent.iter().sum::<f64>() / recent.len() as f64;
        // Readings' own noise is not load: below twice its variance the load is steady.
        let noise_var = (self.noise * mean).powi(2);
        self.load_var = (var - noise_var).max(0.0);
        if var <= 2.0 * noise_var + 1e-9 {
            self.tau = f64::INFINITY;
            return;
        }
        // The variogram at one update: how much the load moves from one reading to the next,
        // against how much it moves overall. It needs a few real moves to say anything: a
        // single step in a quiet record would read as a load without memory.
        let step_tol = 3.0 * self.noise * mean + 5.0;
        let moves = w
            .windows(2)
            .filter(|p| (p[1] - p[0]).abs() > step_tol)
            .count();
        if moves < 4 {
            self.tau = f64::INFINITY;
            return;
        }
        let gamma =
            w.windows(2).map(|p| (p[1] - p[0]).powi(2)).sum::<f64>() / (2.0 * (w.len() - 1) as f64);
        let rho =
            (1.0 - (gamma - noise_var).max(0.0) / (var - noise_var).max(1e-9)).clamp(0.0, 1.0);
        self.tau = if rho >= 0.98 {
            f64::INFINITY
        } else {
            -self.period / rho.max(1e-3).ln()
        };
    }

    // ---- answers ---------------------------------------------------------------------------
}

/// Where a walk over consecutive tick intervals stands in the window edges and the anchors:
/// each interval's search starts where the previous one's ended. (A window edge on a board
/// updating every millisecond spans several intervals; a binary search each over a minute of
/// edges and anchors was most of an edge's cost.)
#[derive(Debug, Default)]
pub(super) struct Walk {
    hints: Option<(usize, usize)>,
    anchors: Option<(usize, usize)>,
}

impl Walk {
    /// The edges in `(lo, hi)` as an index range; `lo` and `hi` may only grow from call to
    /// call.
    fn hints_in(&mut self, hints: &VecDeque<f64>, lo: f64, hi: f64) -> (usize, usize) {
        let r = advance(self.hints, hints, |&h| h <= lo, |&h| h < hi);
        *self.hints.insert(r)
    }

    /// The anchors within `[lo, hi]` as an index range; `lo` and `hi` may only grow from
    /// call to call.
    fn anchors_in(&mut self, anchors: &VecDeque<Anchor>, lo: f64, hi: f64) -> (usize, usize) {
        let r = advance(self.anchors, anchors, |x| x.t < lo, |x| x.t <= hi);
        *self.anchors.insert(r)
    }
}

/// The range `[i, j)` of sorted `v` past `before` and up to `within`: searched the first
/// time, then moved on from `from`.
fn advance<T>(
    from: Option<(usize, usize)>,
    v: &VecDeque<T>,
    before: impl Fn(&T) -> bool,
    within: impl Fn(&T) -> bool,
) -> (usize, usize) {
    let Some((mut i, j)) = from else {
        return (v.partition_recent(&before), v.partition_recent(&within));
    };
    while v.get(i).is_some_and(&before) {
        i += 1;
    }
    let mut j = j.max(i);
    while v.get(j).is_some_and(&within) {
        j += 1;
    }
    (i, j)
}

/// A stretch of the power model.
#[derive(Debug, Clone, Copy)]
pub(super) struct Piece {
    t0: f64,
    t1: f64,
    shape: Shape,
}

/// How the power runs over a piece. Shapes with an unknown level contribute a "free" weight
/// (seconds at that level): the counter solves the level, or its guess stands in.
#[derive(Debug, Clone, Copy)]
pub(super) enum Shape {
    /// Linear from `w0` at the piece's start to `w1` at its end.
    Ramp { w0: f64, w1: f64 },
    /// An unknown level.
    Free { guess: f64 },
    /// Between readings `pa` at `ta` and `pb` at `tb` of a load whose correlation decays over
    /// `tau`: each reading's pull fades with distance into the unknown level.
    Bridge {
        ta: f64,
        tb: f64,
        pa: f64,
        pb: f64,
        tau: f64,
        guess: f64,
    },
    /// After the last reading `pa` at `ta`: its pull fading into the level.
    Relax {
        ta: f64,
        pa: f64,
        tau: f64,
        guess: f64,
    },
}

impl Piece {
    /// Over `[a, b]` clipped to the piece: the energy known from readings (J), the free
    /// weight (s) and the free part at its guess (J).
    fn parts(&self, a: f64, b: f64) -> (f64, f64, f64) {
        let (a, b) = (a.max(self.t0), b.min(self.t1));
        if b <= a {
            return (0.0, 0.0, 0.0);
        }
        // The integral of exp(-(s - from) / tau) over [a, b].
        let decay =
            |from: f64, tau: f64| tau * ((-(a - from) / tau).exp() - (-(b - from) / tau).exp());
        match self.shape {
            Shape::Ramp { w0, w1 } => {
                let span = self.t1 - self.t0;
                let at = |t: f64| {
                    if span.is_finite() && span > 0.0 {
                        w0 + (w1 - w0) * (t - self.t0) / span
                    } else {
                        w0
                    }
                };
                ((at(a) + at(b)) / 2.0 * (b - a), 0.0, 0.0)
            }
            Shape::Free { guess } => (0.0, b - a, guess * (b - a)),
            Shape::Bridge {
                ta,
                tb,
                pa,
                pb,
                tau,
                guess,
            } => {
                let rd = (-(tb - ta) / tau).exp();
                let from_a = decay(ta, tau);
                // exp(-(tb - s) / tau) integrates to tau * (exp(-(tb - b)/tau) - exp(-(tb - a)/tau)).
                let from_b = tau * ((-(tb - b) / tau).exp() - (-(tb - a) / tau).exp());
                let det = 1.0 - rd * rd;
                let (wa, wb) = ((from_a - rd * from_b) / det, (from_b - rd * from_a) / det);
                let w = (b - a - wa - wb).max(0.0);
                (pa * wa + pb * wb, w, guess * w)
            }
            Shape::Relax { ta, pa, tau, guess } => {
                let wa = decay(ta, tau);
                let w = (b - a - wa).max(0.0);
                (pa * wa, w, guess * w)
            }
        }
    }
}
