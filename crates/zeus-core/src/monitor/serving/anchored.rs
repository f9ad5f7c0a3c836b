//! The `work` model fitted on spans that begin and end where a GPU's energy counter updated.
//!
//! A cut's edge falls anywhere between two counter updates, and there the energy is
//! interpolated from power readings that also change only every update period: while the power
//! changes every engine step, each edge is off by a joule or more, settled or not, and the fit
//! reads that as noise in every weight. At a counter update the energy is known to the
//! counter's resolution. So each GPU's spans run from one update (an anchor of the sampler's
//! cache: a counter value placed at the moment it describes) to a later one at least a span
//! apart, and what the engine did in between is the steps it ran there, those that straddle an
//! anchor prorated by time (a step's work is taken as spread evenly over it). Each GPU is
//! fitted on its own counter; the engine's model is the sum of theirs.
//!
//! Where an anchor sits in time rests on the sampler's estimate of the counter's lag, good to
//! a few milliseconds (`lag_err`, 5 ms on the simulated H100): a span placed 2.5 ms late
//! misses 1.2 J of a 500 W step at one edge and gains an idle step's 0.2 J at the other,
//! which biased the KV-cache weight by 5%. The engine's own step edges pin that down: each GPU
//! keeps one fit per time offset on a grid of ±[`OFFSET_RANGE_S`], and the offset whose fit
//! leaves the least misfit is the one used.

use std::collections::VecDeque;

use super::fit::{Features, Weights, WorkFit};

/// How long the ledger keeps what each step did (s): enough for anchors that arrive a few
/// hundred milliseconds late, and for a GPU whose anchors stall for a while.
const HISTORY_S: f64 = 30.0;
/// Anchors whose moment is less certain than this (s) are stepped over: prorating the steps
/// around a moment off by more would misplace the work by more than the counter's update.
const MAX_ANCHOR_T_ERR: f64 = 0.005;
/// The shortest anchored span (s). Its edges are exact, so spans can be short: more of them,
/// and each closer to one batch composition, tell decode and KV-cache work apart better.
const SPAN_S: f64 = 0.2;
/// Anchored spans are short, so a fit waits for this many times the ledger's `min_spans` of
/// them (about 5 s by default): the first fits, on 8 spans, were off by more than their
/// standard errors said, and early requests missed their bounds by a few percent.
const MIN_SPANS_FACTOR: usize = 3;

/// The offsets tried between where the sampler places an anchor and where the work is (s).
pub(super) const OFFSET_RANGE_S: f64 = 0.010;
const OFFSET_STEP_S: f64 = 0.0005;
const OFFSETS: usize = 41; // 2 · OFFSET_RANGE_S / OFFSET_STEP_S + 1

fn offset(i: usize) -> f64 {
    (i as f64 - ((OFFSETS - 1) / 2) as f64) * OFFSET_STEP_S
}

/// One GPU's fits, one per offset.
#[derive(Debug)]
struct GpuFit {
    fits: Vec<WorkFit>,
    /// The anchor the next span starts at: time and joules.
    last: Option<(f64, f64)>,
    /// The latest anchor looked at: later calls ask only for those after it (an anchor passed
    /// over is never looked at again, or spans would be fitted twice).
    seen: f64,
}

impl Default for GpuFit {
    fn default() -> GpuFit {
        GpuFit {
            fits: vec![WorkFit::default(); OFFSETS],
            last: None,
            seen: f64::NEG_INFINITY,
        }
    }
}

/// Per-GPU fits on anchored spans, and the steps they need.
#[derive(Debug)]
pub(super) struct AnchoredFits {
    gpus: Vec<GpuFit>,
    /// Every interval (step or gap) of the last [`HISTORY_S`]: start, end, what it did.
    history: VecDeque<(f64, f64, Features)>,
}

impl AnchoredFits {
    pub(super) fn new(n_gpus: usize) -> AnchoredFits {
        AnchoredFits {
            gpus: (0..n_gpus).map(|_| GpuFit::default()).collect(),
            history: VecDeque::new(),
        }
    }

    /// An interval `[t0, t1]` ran, doing `f`.
    pub(super) fn record(&mut self, t0: f64, t1: f64, f: Features) {
        self.history.push_back((t0, t1, f));
        while self
            .history
            .front()
            .is_some_and(|&(_, end, _)| end < t1 - HISTORY_S)
        {
            self.history.pop_front();
        }
    }

    /// Where GPU `k`'s next span starts (the time to ask for anchors after).
    pub(super) fn after(&self, k: usize) -> f64 {
        let start = self.history.front().map_or(f64::INFINITY, |h| h.0);
        self.gpus[k].seen.max(start)
    }

    /// GPU `k`'s anchors `(t, joules, t_err)` after [`AnchoredFits::after`], oldest first:
    /// fit the spans they close. Returns whether a span was added.
    pub(super) fn add_anchors(&mut self, k: usize, anchors: &[(f64, f64, f64)]) -> bool {
        let Some(&(start, _, _)) = self.history.front() else {
            return false;
        };
        let covered = self.history.back().map_or(start, |h| h.1);
        let mut added = false;
        for &(t, joules, t_err) in anchors {
            // Only moments the history covers, with room for every offset: before the first
            // step nothing is known of the work, and after the last one it is not reported.
            if t < start + OFFSET_RANGE_S {
                continue;
            }
            if t + OFFSET_RANGE_S > covered {
                break; // the work around it is not all reported yet: ask again later
            }
            let g = &mut self.gpus[k];
            if t <= g.seen {
                continue;
            }
            g.seen = t;
            let Some((t0, j0)) = g.last else {
                if t_err <= MAX_ANCHOR_T_ERR {
                    g.last = Some((t, joules));
                }
                continue;
            };
            if t <= t0 {
                continue;
            }
            if t_err > MAX_ANCHOR_T_ERR {
                // A moment too uncertain to prorate at: the span cannot end here, and the
                // next one starts at the next good anchor.
                g.last = None;
                continue;
            }
            if t - t0 < SPAN_S {
                continue;
            }
            let energy = joules - j0;
            if t0 - OFFSET_RANGE_S >= start && energy >= 0.0 {
                for i in 0..OFFSETS {
                    let d = offset(i);
                    let f = Self::features(&self.history, t0 + d, t + d);
                    self.gpus[k].fits[i].add(&f, energy);
                }
                added = true;
            }
            self.gpus[k].last = Some((t, joules));
        }
        added
    }

    /// What the intervals did over `[t0, t1]`, prorating those that straddle its ends.
    fn features(history: &VecDeque<(f64, f64, Features)>, t0: f64, t1: f64) -> Features {
        let mut out = Features::default();
        // The intervals are in time order: start at the first that ends after `t0` (the
        // history holds 30 s of 20 ms steps; a span covers a dozen).
        let first = history.partition_point(|&(_, b, _)| b <= t0);
        for &(a, b, f) in history.range(first..) {
            if a >= t1 {
                break;
            }
            let len = b - a;
            let part = if len > 0.0 {
                (b.min(t1) - a.max(t0)) / len
            } else {
                1.0
            };
            out.seconds += f.seconds * part;
            out.prefill_tokens += f.prefill_tokens * part;
            out.decode_tokens += f.decode_tokens * part;
            out.kv_token_seconds += f.kv_token_seconds * part;
        }
        out
    }

    /// The engine's model: the sum of every GPU's (each at the offset that fits it best),
    /// once each has `min_spans` spans. The offset is chosen by the unconstrained fits'
    /// misfit (41 small solves), and only its fit is solved with the constraints.
    pub(super) fn weights(&self, min_spans: usize) -> Option<Weights> {
        let min_spans = min_spans * MIN_SPANS_FACTOR;
        let parts: Option<Vec<Weights>> = self
            .gpus
            .iter()
            .map(|g| {
                if g.fits[0].spans() < min_spans {
                    return None;
                }
                let best = g
                    .fits
                    .iter()
                    .filter_map(|f| f.misfit().map(|m| (m, f)))
                    .min_by(|a, b| a.0.total_cmp(&b.0))?;
                best.1.solve(min_spans)
            })
            .collect();
        Weights::sum(&parts?)
    }
}
