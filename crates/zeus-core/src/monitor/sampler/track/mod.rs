//! [`Track`]: what the sampler knows about one GPU, the energy it infers from that, and how
//! wrong that energy may be.
//!
//! It does no I/O: the sampler thread feeds it power readings ([`Track::on_power`]), counter
//! reads ([`Track::on_counter`]) and faults, and window edges mark where the load may step
//! ([`Track::add_hint`]); tests drive it on a virtual clock.
//!
//! # The model
//!
//! - **Ticks**: the power readings change once per update; polling around the expected update
//!   times each change to a millisecond (or exactly, where the driver's field timestamps move
//!   with the updates), which gives the update period and phase.
//! - **Anchors**: a counter value is the energy at one moment, published a lag after it on the
//!   counter's own grid. The grid and the lag are calibrated from the reads themselves
//!   ([`super::fit`]); each read is then attributed to the moment it describes, by the schedule,
//!   or by its value where the schedule leaves two candidates (a read that straddles a publish).
//!   A counter that goes backwards or jumps more than the board can draw starts a new epoch,
//!   joined to the old one by the power model (a reset never counts negative energy).
//! - **Between anchors** the counter's step is spread over time in proportion to the power model:
//!   a ramp between ticks, or a step at window edges ([`Track::add_hint`]) where the load is
//!   taken to change; past the last anchor the model is integrated forward. Boards without
//!   instant power whose average lags use the counter's own interval means as their power.
//!
//! # The self-check and the bound
//!
//! Before each anchor the model predicts the counter; the residuals, normalised by the step,
//! are kept per kind of interval (with window edges, without), and so is how far each
//! extrapolated window end turned out from the settled value once the counter caught up. The
//! bound of an edge is the residual scale of its kind of interval, shaped by where in the
//! interval the edge lies, plus the calibration's timing uncertainty and the counter's
//! resolution; a window's bound combines its two edges at about 95%. Where residuals in steady
//! stretches exceed what noise and resolution allow, or the lag fit runs off its range, the
//! model does not fit this board: [`Mode::Direct`] (read the counter at window edges) until it
//! fits again; a counter whose rate disagrees with the power readings by more than 2x, or
//! that froze, gives [`Mode::Power`] (integrate power instead).
//!
//! # The files
//!
//! This file holds the state and what others read of it; each concern's methods live beside:
//! [`ticks`] (power readings, the update period, gaps), [`reads`] (counter reads, the
//! calibration, anchors), [`check`] (residuals, shapes, modes), [`model`] (the power model and
//! its integral) and [`bound`] (the energy at an edge, its bound, and windows).

use std::cell::Cell;
use std::collections::VecDeque;

use super::fit::{self, Grid, LagRead, ReadPair};
use scale::{Magnitude, ScaleLog};

mod bound;
mod check;
mod model;
mod reads;
mod scale;
mod ticks;

/// Seconds of ticks, reads and anchors kept.
const HISTORY_S: f64 = 600.0;
/// At most this many power readings are kept: [`HISTORY_S`] of a board updating every 100 ms,
/// a minute of one updating every millisecond (AMD's), whose counter anchors, milliseconds
/// apart, carry the energy of older stretches (30 MB per GPU otherwise).
const MAX_TICKS: usize = 60_000;
/// Counter reads kept (beyond the history, the oldest go).
const MAX_READS: usize = 4096;
/// Tick intervals kept for the period estimate.
const PERIOD_SAMPLES: usize = 16;
/// Poll step around an expected tick, and before the phase is known.
const POLL_STEP: f64 = 0.001;
const SEARCH_STEP: f64 = 0.002;
/// Polling starts this long before an expected tick ...
const LOOK_EARLY: f64 = 0.003;
/// ... and gives up this long after it, assuming an update that left the value unchanged.
const LOOK_LATE: f64 = 0.010;
/// How far before a tick a window edge may lie and still count for the interval after it.
const HINT_TOLERANCE: f64 = 2.0 * POLL_STEP;
/// The longest counter lag the calibration searches.
pub const LAG_MAX: f64 = 0.100;
/// The shortest: a little negative, since the lag is measured against the grid as fitted from
/// the reads' midpoints, and a driver that takes the value late in its 3.5-6 ms read puts that
/// grid early by up to half a read (see [`fit::fit_lag`]).
pub const LAG_MIN: f64 = -0.005;

/// The longest lag the counter's steps at window edges may show (s); one there or beyond is
/// outside what the sampler calibrates.
const STEP_LAG_MAX: f64 = 2.0 * LAG_MAX;
/// How far (s) beyond its own error a measured lag of a counter on the power grid may be from
/// the grid's family and still be read as the family's: the power updates' own timing and a
/// fit's aliasing under a load that moves between them.
const FAMILY_SLACK: f64 = 0.003;
/// Until the calibration has a schedule, the counter is taken to describe the power updates
/// and show each this long after it (as measured on an H100 with driver 580: 10-25 ms), give or
/// take as much: the first windows are then as good as on that board, and the calibration
/// replaces the guess within about a second wherever it is wrong.
const PRIOR_LAG: f64 = 0.015;
/// Reads the calibration looks at.
const FIT_READS: usize = 64;

/// Refit the schedule every this many reads once fitted (every read before).
const REFIT_EVERY: u32 = 16;
/// Half-width multiplier of a window's bound: about 95% of a normal error.
pub const Z95: f64 = 1.96;
/// Edge intervals whose stretch between edges is longer than this (s) are left out of the
/// shapes' scoring ([`Track::score_shapes`]).
const FREE_UNSCORED: f64 = 0.001;
/// Residuals kept per kind for the bound and the self-check.
const RESIDUALS: usize = 24;
/// Readings the power floor looks back over.
const FLOOR_TICKS: usize = 600;
/// A counter that went backwards this many times within [`BACKWARDS_WINDOW_S`] is not used:
/// once is a reset (a driver reload); again and again is a counter that cannot be read
/// reliably (AMD's, read from several threads at once: amdsmi#115).
const BACKWARDS_LIMIT: usize = 3;
const BACKWARDS_WINDOW_S: f64 = 60.0;
/// How far off a lag the backend states may be, s: the updates' own timing.
const KNOWN_LAG_ERR: f64 = 0.0005;

/// A power reading that changed (or an update that was due and showed the same value).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    pub t: f64,
    pub watts: f64,
    /// Seen change, not assumed.
    pub seen: bool,
    /// How far off `t` may be (s).
    pub t_err: f64,
    /// When the update may have been, earliest and latest: `t` for both, except where a poll
    /// held up across several updates saw the change without telling at which of them.
    pub span: (f64, f64),
    /// Which update this is, counted from the first tick seen.
    pub index: i64,
}

/// The counter's energy at a moment, on the track's scale (epochs joined).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Anchor {
    pub t: f64,
    pub joules: f64,
    /// How far off `t` may be (s).
    pub t_err: f64,
    /// Standard error (J) of the offsets that join this anchor's epoch to the first one.
    pub offset_sigma: f64,
    /// Standard error (J) of this anchor's placement against the newest anchors': a lag refit
    /// re-places the recent reads' anchors, and older ones keep where the old schedule put
    /// them (`rebuild_anchors`), the power there times the move apart. Grows with each refit
    /// for the anchors it leaves; a window across such a seam counts the difference.
    pub seam_sigma: f64,
    /// The counter's own value (J), before joining epochs.
    pub raw: f64,
    /// When the read that gave it ended (which read it came from).
    pub read_at: f64,
}

/// One counter read as it happened.
#[derive(Debug, Clone, Copy)]
struct Read {
    before: f64,
    after: f64,
    mj: u64,
    /// Made at a dithered moment (which may fall on a publish), not just after one.
    dithered: bool,
}

/// How the sampler reads a GPU now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Window edges from the cache (the model fits).
    Cached,
    /// The model does not fit this board's counter timing: read the counter at window edges.
    Direct,
    /// The counter cannot be trusted (frozen, or its rate disagrees with the power readings):
    /// integrate power.
    Power,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Cached => "cached",
            Mode::Direct => "direct",
            Mode::Power => "power",
        }
    }
}

/// What a driver's field timestamps say.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stamps {
    /// Votes so far: timestamps that stood still while the value did (updates) and that moved
    /// with every call (calls).
    Unknown { update: u32, call: u32 },
    /// The timestamp is the moment of the update: ticks are timed by it.
    Update,
    /// The timestamp is the moment of the call: ticks are timed by polling.
    Call,
}

/// The calibrated counter schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub grid: Grid,
    pub lag: f64,
    pub lag_err: f64,
    /// Whether the grid was fitted (else it is the power grid, a guess).
    pub fitted: bool,
    /// Whether the lag was measured (else it is a guess, `lag_err` wide).
    pub lag_known: bool,
    /// Whether the data put the lag beyond [`LAG_MAX`].
    pub lag_beyond_range: bool,
    /// Whether the counter describes the power updates themselves (its grid is theirs and the
    /// data accept the lag that says so): anchors then sit on ticks, timed as well as they are.
    pub on_ticks: bool,
}

impl Schedule {
    /// Whether anchors are placed on the power readings' ticks (see [`Schedule::on_ticks`])
    /// rather than at publish minus lag.
    pub fn snaps(&self) -> bool {
        self.on_ticks && self.lag_known
    }
}

/// One self-check: how far the model's prediction of a counter step was off.
#[derive(Debug, Clone, Copy)]
struct Residual {
    /// (measured - predicted) / scale.
    rel: f64,
    /// Steady power around the step: the residual must be within noise there.
    calm: bool,
}

/// An energy estimate at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edge {
    pub joules: f64,
    /// Standard error (J).
    pub sigma: f64,
    /// Half-width (J) of a hard interval on top of `sigma` (a stretch with no readings).
    pub hard: f64,
    /// Standard error of the epoch offsets behind the value (J), see [`Anchor::offset_sigma`].
    pub offset_sigma: f64,
    /// Standard error of the placement behind the value (J), see [`Anchor::seam_sigma`].
    pub seam_sigma: f64,
    /// An anchor after the moment exists (interpolated, not extrapolated).
    pub settled: bool,
    /// The moment lies in a stretch without readings (a fault).
    pub degraded: bool,
}

/// A window's energy from the cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowEstimate {
    pub joules: f64,
    /// Half-width of the ~95% interval (J).
    pub bound: f64,
    pub degraded: bool,
}

/// What the sampler knows about one GPU. Times are the clock's seconds, energy joules.
#[derive(Debug, Clone)]
pub struct Track {
    ticks: VecDeque<Tick>,
    anchors: VecDeque<Anchor>,
    hints: VecDeque<f64>,
    /// Stretches without power readings (faults), oldest first.
    gaps: VecDeque<(f64, f64)>,
    reads: VecDeque<Read>,
    last_value: Option<u32>,
    last_stamp: Option<f64>,
    stamps: Stamps,
    last_poll: f64,
    period: f64,
    intervals: VecDeque<f64>,
    locked: bool,
    next_poll: f64,
    /// When power polling failed (a fault is ongoing) and since when.
    power_down_since: Option<f64>,
    read_due: Option<f64>,
    reads_since_fit: u32,
    /// Dither sequence position for read timing.
    dither: u32,
    /// Whether the read now due is a dithered one.
    read_dithered: bool,
    /// Seconds one counter read costs (moving average).
    read_cost: f64,
    /// Minimum seconds between counter reads (the CPU budget).
    read_spacing: f64,
    schedule: Schedule,
    /// Averaging window of the power readings when they are averages that lag (s); `None`
    /// for instantaneous readings.
    averaged: Option<f64>,
    /// Whether the readings are the driver's average (no instant power on this board).
    average_only: bool,
    plain: ScaleLog<Residual>,
    /// Residuals of intervals with window edges, the edges stepping the load ...
    hinted: ScaleLog<Residual>,
    /// ... and the same intervals with the edges ignored (the bridge).
    hinted_bridge: ScaleLog<Residual>,
    /// Hinted intervals `(a, b, moved)` whose shapes are scored once a reading passes them.
    pending_shapes: VecDeque<(f64, f64, f64)>,
    /// Lag fits in a row where no lag in the range explained the counter across edges.
    lag_misfits: u32,
    /// The lag measured beyond the range (s; 0 until one is), for the staleness of direct
    /// reads.
    lag_beyond: f64,
    /// Correlation time of the load (s; infinite for a load that holds longer than we look).
    pub(super) tau: f64,
    /// The load's recent mean power (W): the guess for unknown levels.
    pub(super) level_guess: f64,
    /// The load's recent variance beyond the readings' noise (W²).
    load_var: f64,
    /// Whether the readings' recent moves are mostly across window edges (the load steps
    /// there), learned with the load's other figures every few readings.
    edges_explain: bool,
    /// Extrapolated window ends waiting for the counter: (time, estimate J, seconds past the
    /// last anchor, power scale W).
    pending_ends: VecDeque<(f64, f64, f64, f64)>,
    /// How far extrapolated ends were off once settled, over `seconds * power`.
    end_errors: ScaleLog<f64>,
    /// Relative noise of the power readings against the counter in steady stretches.
    noise: f64,
    /// Recent relative deviations of readings from the counter's mean in steady stretches.
    deviations: VecDeque<f64>,
    /// Counter steps and the power readings' energy over them, decayed (rate check), and the
    /// seconds they span.
    rate: (f64, f64),
    rate_span: f64,
    frozen_steps: u32,
    /// When the counter went backwards (a new epoch that was not a jump up), latest last.
    backwards: VecDeque<f64>,
    mode: Mode,
    /// Why the mode is what it is (for the warning), with the figures.
    mode_reason: String,
    /// The board's highest power (W): its maximum power limit, for hard bounds.
    max_power_w: f64,
    /// The counter's lag as the backend states it ([`Track::set_known_lag`]).
    known_lag: Option<f64>,
    /// The highest reading seen (W), and the lowest of the last [`FLOOR_TICKS`]: kept as ticks
    /// come, since the bounds ask for them per tick of the model.
    seen_max_w: f64,
    recent_min_w: f64,
    /// The counter's resolution (J): the greatest common divisor of its values in mJ.
    resolution_j: f64,
    resolution_mj: u64,
    /// Bumped by whatever may change the power model up to the last reading: readings,
    /// anchors, faults, settings, a window edge placed before the last reading.
    version: u64,
    /// The model from the last anchor to the last reading, as of `version`
    /// ([`Track::model_past_anchor`]).
    head_model: Cell<Option<HeadModel>>,
}

/// The power model's integral over `[from, to]` (J) at a track version.
#[derive(Debug, Clone, Copy)]
struct HeadModel {
    version: u64,
    from: f64,
    to: f64,
    steps: bool,
    joules: f64,
}

/// `partition_point` for the track's histories, which looks at the end first: window edges
/// are at about now, past nearly all of a history that holds a minute of millisecond
/// readings, where a binary search takes a cache miss at nearly every step (on four GPUs, most
/// of an edge's cost).
trait PartitionRecent<T> {
    fn partition_recent(&self, pred: impl Fn(&T) -> bool) -> usize;
}

/// How many of the last elements [`PartitionRecent`] tries before searching.
const RECENT_SCAN: usize = 8;

impl<T> PartitionRecent<T> for VecDeque<T> {
    fn partition_recent(&self, pred: impl Fn(&T) -> bool) -> usize {
        let n = self.len();
        let mut k = n;
        while k > 0 && n - k < RECENT_SCAN {
            if pred(&self[k - 1]) {
                return k;
            }
            k -= 1;
        }
        // The answer is below `k`: a binary search there.
        let mut lo = 0;
        while lo < k {
            let mid = lo + (k - lo) / 2;
            if pred(&self[mid]) {
                lo = mid + 1;
            } else {
                k = mid;
            }
        }
        lo
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, x: T, n: usize) {
    q.push_back(x);
    while q.len() > n {
        q.pop_front();
    }
}

impl Magnitude for Residual {
    fn magnitude(&self) -> f64 {
        self.rel.abs()
    }
}

impl Track {
    /// Start tracking at `now`; `period` is the update period if known (else 0.1 s is assumed
    /// until ticks are seen).
    pub fn new(now: f64, period: Option<f64>) -> Track {
        let period = period.filter(|p| *p > 0.0).unwrap_or(0.1);
        Track {
            ticks: VecDeque::new(),
            anchors: VecDeque::new(),
            hints: VecDeque::new(),
            gaps: VecDeque::new(),
            reads: VecDeque::new(),
            last_value: None,
            last_stamp: None,
            stamps: Stamps::Unknown { update: 0, call: 0 },
            last_poll: now,
            period,
            intervals: VecDeque::new(),
            locked: false,
            next_poll: now,
            power_down_since: None,
            read_due: Some(now),
            reads_since_fit: 0,
            dither: 0,
            read_dithered: true,
            read_cost: 0.0,
            read_spacing: 0.0,
            schedule: Schedule {
                grid: Grid {
                    period,
                    phase: 0.0,
                    phase_err: period / 2.0,
                },
                lag: PRIOR_LAG,
                lag_err: LAG_MAX / 2.0,
                fitted: false,
                lag_known: false,
                lag_beyond_range: false,
                on_ticks: false,
            },
            averaged: None,
            average_only: false,
            plain: ScaleLog::new(RESIDUALS),
            hinted: ScaleLog::new(RESIDUALS),
            hinted_bridge: ScaleLog::new(RESIDUALS),
            pending_shapes: VecDeque::new(),
            lag_misfits: 0,
            lag_beyond: 0.0,
            tau: f64::INFINITY,
            level_guess: 0.0,
            load_var: 0.0,
            edges_explain: true,
            pending_ends: VecDeque::new(),
            end_errors: ScaleLog::new(RESIDUALS),
            noise: 0.01,
            deviations: VecDeque::new(),
            rate: (0.0, 0.0),
            rate_span: 0.0,
            frozen_steps: 0,
            backwards: VecDeque::new(),
            mode: Mode::Cached,
            mode_reason: String::new(),
            max_power_w: 0.0,
            known_lag: None,
            seen_max_w: 0.0,
            recent_min_w: f64::INFINITY,
            resolution_j: 0.001,
            resolution_mj: 0,
            version: 0,
            head_model: Cell::new(None),
        }
    }

    /// The backend knows the counter's lag behind the power updates: use it, and do not fit
    /// one (a fit needs updates far enough apart to tell a lag from the next update; a board
    /// updating every millisecond has none).
    pub fn set_known_lag(&mut self, lag: f64) {
        self.version += 1;
        self.known_lag = Some(lag);
        self.schedule.lag = lag;
        self.schedule.lag_err = KNOWN_LAG_ERR;
        self.schedule.lag_known = true;
    }

    /// The board's highest power (its maximum power limit), for bounds over stretches without
    /// readings.
    pub fn set_max_power(&mut self, watts: f64) {
        self.version += 1;
        self.max_power_w = watts.max(0.0);
    }

    /// The power readings are the driver's average (the board has no instant power): whether
    /// they lag is found out from the counter.
    pub fn set_average_only(&mut self, yes: bool) {
        self.version += 1;
        self.average_only = yes;
        self.averaged = None;
    }

    /// Forget the update period the backend said, and measure it (as with NVML, which does
    /// not say).
    pub fn forget_period(&mut self) {
        self.version += 1;
        self.period = 0.1;
        self.intervals.clear();
        self.locked = false;
        self.schedule.grid.period = 0.1;
    }

    /// The update period as measured (or assumed before enough ticks were seen).
    pub fn period(&self) -> f64 {
        self.period
    }

    /// Whether ticks have been seen often enough to know the period and its phase.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    pub fn ticks(&self) -> &VecDeque<Tick> {
        &self.ticks
    }

    pub fn anchors(&self) -> &VecDeque<Anchor> {
        &self.anchors
    }

    /// Window edges marked so far (at most two per tick interval).
    pub fn hints(&self) -> &VecDeque<f64> {
        &self.hints
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Why the track is in its mode, with the figures ("" in the cached mode).
    pub fn mode_reason(&self) -> &str {
        &self.mode_reason
    }

    /// The self-check's recent residual scale: RMS of (counter step - prediction) / step.
    pub fn residual_ratio(&self) -> f64 {
        let edged = if self.steps() {
            &self.hinted
        } else {
            &self.hinted_bridge
        };
        let all = self.plain.iter().chain(edged.iter());
        scale::robust_scale(all.map(Magnitude::magnitude)).unwrap_or(0.0)
    }

    /// Self-check residual scales: intervals without window edges, with them (edges stepping
    /// the load), with them (the bridge), for diagnostics.
    pub fn residual_scales(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        (
            self.plain.scale(),
            self.hinted.scale(),
            self.hinted_bridge.scale(),
        )
    }

    /// Relative noise of the power readings, as measured against the counter.
    pub fn noise(&self) -> f64 {
        self.noise
    }

    /// Whether the driver's field timestamps time the updates.
    pub fn stamps_time_updates(&self) -> bool {
        self.stamps == Stamps::Update
    }

    /// The averaging window found for average-only boards (`None`: instantaneous readings).
    pub fn averaging_window(&self) -> Option<f64> {
        self.averaged
    }

    /// Seconds one counter read took, on average.
    pub fn read_cost(&self) -> f64 {
        self.read_cost
    }

    /// When the next poll or counter read is due.
    pub fn next_due(&self) -> f64 {
        let poll = if self.power_down_since.is_some() {
            f64::INFINITY
        } else {
            self.next_poll
        };
        self.read_due.map_or(poll, |a| a.min(poll))
    }

    pub fn poll_due(&self, now: f64) -> bool {
        self.power_down_since.is_none() && self.next_poll <= now
    }

    pub fn anchor_is_due(&self, now: f64) -> bool {
        self.read_due.is_some_and(|a| a <= now)
    }

    /// The latest window edge strictly inside `(lo, hi)`. Hints are in time order, so this is
    /// a binary search: a board updating every millisecond keeps a million of them over the
    /// history, and a scan per window edge would cost milliseconds.
    pub(super) fn last_hint_in(&self, lo: f64, hi: f64) -> Option<f64> {
        let j = self.hints.partition_recent(|&h| h < hi);
        j.checked_sub(1).map(|k| self.hints[k]).filter(|&h| h > lo)
    }

    /// How many window edges lie in `(lo, hi)` (of those kept: at most two a tick interval).
    pub(super) fn hints_between(&self, lo: f64, hi: f64) -> usize {
        let j = self.hints.partition_recent(|&h| h < hi);
        let i = self.hints.partition_recent(|&h| h <= lo);
        j.saturating_sub(i)
    }

    /// Mark a window edge at `t`: the load probably changes there. Only the first and the last
    /// edge of a tick interval shape the model (the level between them is one unknown), so an
    /// interval keeps at most two: a tight loop of windows costs neither time nor memory.
    pub fn add_hint(&mut self, t: f64) {
        if self.hints.back().is_some_and(|&h| h >= t) {
            return;
        }
        let last_tick = self.ticks.back().map_or(f64::NEG_INFINITY, |k| k.t);
        if t < last_tick {
            // An edge taken before the sampler's latest reading came in: it shapes the model
            // before that reading.
            self.version += 1;
        }
        let in_open_interval = self
            .hints
            .iter()
            .rev()
            .take_while(|&&h| h > last_tick)
            .count();
        if in_open_interval >= 2 {
            *self.hints.back_mut().expect("two hints") = t;
        } else {
            self.hints.push_back(t);
        }
    }

    /// How many GPUs share the sampler, to spread counter reads over the CPU budget (`share`
    /// of one core for all of them).
    pub fn set_load(&mut self, n_devices: usize, share: f64) {
        self.read_spacing = n_devices.max(1) as f64 * self.read_cost / share.max(1e-6);
    }

    // ---- power readings --------------------------------------------------------------------
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A window edge that lands before the latest reading (taken just before the reading came
    /// in) reshapes the model there: the cache does not keep the model without it.
    #[test]
    fn an_edge_before_the_latest_reading_is_not_missed_by_the_cache() {
        let mut track = Track::new(100.0, Some(0.001));
        track.set_known_lag(0.0);
        track.set_max_power(750.0);
        let mut joules = 0.0;
        for k in 0..200 {
            let t = 100.0 + k as f64 * 0.001;
            let watts = if k % 2 == 0 { 200.0 } else { 600.0 };
            joules += watts * 0.001;
            track.on_power(t + 0.0001, (watts * 1000.0) as u32, None);
            // The last anchor a few readings back.
            if k % 3 == 0 && k < 190 {
                track.on_counter(t, t + 0.00005, (joules * 1000.0) as u64, 0.00005);
            }
        }
        let a = track.anchors.back().expect("anchors").t;
        let last = track.ticks.back().expect("ticks").t;
        let now = last + 0.0004;
        let before = track.model_past_anchor(a, now);
        assert_eq!(before, track.model(a, now, None).0);
        // An edge inside the last reading's interval.
        let prev = track.ticks[track.ticks.len() - 2].t;
        track.add_hint(prev + 0.25 * (last - prev));
        let want = track.model(a, now, None).0;
        assert_ne!(want, before, "the edge should reshape the model");
        assert_eq!(track.model_past_anchor(a, now), want);
    }

    /// A device that left the cache because steady steps missed the model keeps saying so
    /// while it stays on direct reads, also once the recent steps are too few to say anything
    /// (a new schedule clears them): an MI300X beside busy loops warned that "0 of its last 0
    /// counter steps" missed.
    #[test]
    fn a_device_staying_on_direct_reads_keeps_the_reason_it_left_for() {
        let mut track = Track::new(100.0, Some(0.1));
        // Eight steady steps, each `rel` off the model's prediction.
        let steps = |track: &mut Track, rel: f64| {
            for _ in 0..8 {
                track.plain.push(Residual { rel, calm: true });
            }
            track.update_mode();
        };
        steps(&mut track, 0.5);
        assert_eq!(track.mode(), Mode::Direct);
        let reason = track.mode_reason().to_string();
        assert!(reason.starts_with("8 of its last 8"), "{reason}");
        track.plain.clear();
        track.update_mode();
        assert_eq!(track.mode(), Mode::Direct);
        assert_eq!(track.mode_reason(), reason);
        // Steps that fit again bring it back, with no reason to give.
        steps(&mut track, 0.0);
        assert_eq!(track.mode(), Mode::Cached);
        assert_eq!(track.mode_reason(), "");
    }

    /// A counter lag the backend states (AMD: counter and power are one metrics table) holds
    /// from the first reading: until the calibration has a schedule, each power update moves
    /// the guessed grid, never the lag back to the prior guess (seen: an MI300X's first 0.2 s
    /// window 4.7 J short, its edges timed by a 15 ms lag across a 300 W load step).
    #[test]
    fn a_stated_lag_holds_before_the_calibration_has_a_schedule() {
        for stated in [0.0, 0.004] {
            let mut track = Track::new(100.0, Some(0.001));
            track.set_known_lag(stated);
            track.set_max_power(750.0);
            for k in 0..40 {
                let t = 100.0 + k as f64 * 0.001;
                let watts = if k < 20 { 200.0 } else { 600.0 } + (k % 2) as f64;
                track.on_power(t + 0.0001, (watts * 1000.0) as u32, None);
                let s = track.schedule();
                assert!(!s.fitted, "no counter read yet, so no calibration");
                assert_eq!(s.lag, stated, "the lag after reading {k}");
                assert!(s.lag_known, "the stated lag is known after reading {k}");
                if let Some(last) = track.ticks().back() {
                    assert!(
                        (s.grid.phase - (last.t + stated)).abs() < 1e-9,
                        "publishes {stated} s after the update (reading {k}): {s:?}"
                    );
                }
            }
            assert!(
                track.ticks().len() > 30,
                "every changed reading is an update"
            );
        }
    }

    /// A read of the value the read before it saw describes that read's publish, not the next
    /// one it straddles (8505: such a read, 90 ms on, was placed a whole update late by a
    /// prediction 14 J short); one whose value moved may describe either. Where the grid's
    /// phase is known to no better than a tenth of its period, both stay for the value to
    /// settle.
    #[test]
    fn a_read_of_an_unchanged_value_describes_the_publish_the_read_before_saw() {
        let mut track = Track::new(100.0, Some(0.1));
        track.schedule.grid = Grid {
            period: 0.1,
            phase: 100.0,
            phase_err: 0.001,
        };
        track.schedule.fitted = true;
        track.schedule.lag = 0.01;
        let read = |before: f64, mj: u64| Read {
            before,
            after: before + 0.0004,
            mj,
            dithered: false,
        };
        // Just after the publish at 100.2; then reads straddling the one at 100.3.
        track.reads.push_back(read(100.21, 5_000));
        let same = read(100.2998, 5_000);
        let moved = read(100.2998, 6_000);
        let (x, other) = track.candidates(&same);
        assert!(
            (x - 100.19).abs() < 1e-9 && other.is_none(),
            "{x} {other:?}"
        );
        let (x, other) = track.candidates(&moved);
        assert!(
            (x - 100.29).abs() < 1e-9 && other.is_some_and(|o| (o - 100.19).abs() < 1e-9),
            "{x} {other:?}"
        );
        track.schedule.grid.phase_err = 0.02;
        let (x, other) = track.candidates(&same);
        assert!(
            (x - 100.29).abs() < 1e-9 && other.is_some(),
            "{x} {other:?}"
        );
    }

    /// Anchors placed on the ticks and anchors placed at publish minus a lag 9 ms off are
    /// not mixed unnoticed: when the rule changes, the recent reads are placed again under
    /// the new one, and windows from the older anchors to the new ones count the move.
    #[test]
    fn a_change_of_placement_rule_places_the_recent_reads_again() {
        let mut track = Track::new(100.0, Some(0.1));
        track.set_known_lag(0.0);
        track.set_max_power(750.0);
        let watts = 300.0;
        // Power updates every 100 ms, polled every 10 ms; the counter publishes the energy at
        // each update, and is read once per period at moments spread over it. (A watt up
        // and down: readings that do not change make no ticks.)
        let mut joules = 0.0;
        for i in 1..=3000 {
            let t = 100.0 + i as f64 * 0.01;
            let k = (i - 1) / 10;
            let w = watts + (k % 2) as f64;
            track.on_power(t, (w * 1000.0) as u32, None);
            joules += w * 0.01;
            if i % 10 == (k * 7) % 10 {
                let published = joules - w * 0.01 * ((i - 1) % 10) as f64;
                track.on_counter(t, t + 0.0002, (published * 1000.0) as u64, 0.0002);
            }
        }
        // Every read placed by a lag 9 ms off, not on the ticks.
        let off = 0.009;
        track.schedule.on_ticks = false;
        track.schedule.lag += off;
        track.anchors.clear();
        let reads: Vec<Read> = track.reads.iter().copied().collect();
        for r in reads {
            track.attribute_next(r, false);
        }
        let n = track.anchors.len();
        assert!(n > FIT_READS + 20, "{n} anchors");
        let on_tick = |tr: &Track, a: &Anchor| tr.snap_to_tick(a.t).is_some_and(|k| k.t == a.t);
        assert!(!on_tick(&track, &track.anchors[n - 1]));
        let across = (track.anchors[10].t + 0.05, track.anchors[n - 3].t + 0.05);
        let across_before = track.window(across.0, across.1, false).unwrap();
        let before = *track.anchors.back().unwrap();
        // The same lag, now with the rule that puts anchors on ticks.
        let was = track.schedule;
        track.schedule.on_ticks = true;
        assert!(track.schedule.snaps() && !was.snaps());
        assert!(
            track.follow_schedule(&was),
            "the new rule should place reads again"
        );
        let n = track.anchors.len();
        assert!(
            on_tick(&track, &track.anchors[n - 1]),
            "{:?}",
            track.anchors[n - 1]
        );
        // The newest read moved from publish minus the lag to its tick: the lag's error and
        // the tick's timing apart.
        let after = track.anchors.back().unwrap();
        assert_eq!(after.read_at, before.read_at);
        let moved = (after.t - before.t).abs();
        assert!(moved > off / 2.0, "{before:?} -> {after:?}");
        let seam = watts * moved / 3f64.sqrt();
        let kept = &track.anchors[10];
        assert!(!on_tick(&track, kept));
        assert!((kept.seam_sigma - seam).abs() < 0.05 * seam, "{kept:?}");
        let across_after = track.window(across.0, across.1, false).unwrap();
        assert!(
            across_after.bound >= across_before.bound.hypot(Z95 * seam) * 0.999,
            "{across_before:?} -> {across_after:?}"
        );
        // Nothing to place again when neither the schedule nor its rule changed.
        let same = track.schedule;
        assert!(!track.follow_schedule(&same));
    }

    /// A lag refit re-places the recent reads' anchors and leaves the older ones where they
    /// were: a window from the old ones to the new ones counts the move (the power times it),
    /// and one among the old ones alone does not.
    #[test]
    fn anchors_a_lag_refit_leaves_behind_count_the_move_in_windows_across_it() {
        let mut track = Track::new(100.0, Some(0.1));
        track.set_known_lag(0.03);
        track.set_max_power(750.0);
        let watts = 300.0;
        for k in 1..=400 {
            let t = 100.0 + k as f64 * 0.025;
            if k % 4 == 0 {
                track.on_power(t, (watts * 1000.0) as u32, None);
            }
            if k % 2 == 0 {
                let mj = (watts * (t - 100.0 - 0.03) * 1000.0) as u64;
                track.on_counter(t - 0.0002, t, mj, 0.0002);
            }
        }
        let n = track.anchors.len();
        assert!(n > FIT_READS + 20, "{n} anchors");
        let old = (track.anchors[10].t, track.anchors[20].t);
        let across = (track.anchors[10].t + 0.01, track.anchors[n - 3].t + 0.01);
        let within_before = track.window(old.0, old.1, false).unwrap();
        let across_before = track.window(across.0, across.1, false).unwrap();
        let moved = 0.012;
        track.schedule.lag += moved;
        track.rebuild_anchors();
        let seam = watts * moved / 3f64.sqrt();
        let kept = &track.anchors[10];
        assert!((kept.seam_sigma - seam).abs() < 0.05 * seam, "{kept:?}");
        assert_eq!(track.anchors.back().unwrap().seam_sigma, 0.0);
        let within = track.window(old.0, old.1, false).unwrap();
        assert_eq!(within.bound, within_before.bound);
        let across_after = track.window(across.0, across.1, false).unwrap();
        assert!(
            across_after.bound >= across_before.bound.hypot(Z95 * seam) * 0.999,
            "{across_before:?} -> {across_after:?}"
        );
    }

    proptest! {
        /// Window edges past the last reading get the same energy from the cached model as
        /// from integrating it whole, whatever came in between: readings, anchors, edges
        /// before and after the latest reading, faults.
        #[test]
        fn the_cached_model_since_the_anchor_is_the_model(
            events in prop::collection::vec((0u8..6, 0.0f64..1.0), 50..400),
        ) {
            let mut t = 100.0;
            let mut track = Track::new(t, Some(0.001));
            track.set_known_lag(0.0);
            track.set_max_power(750.0);
            let (mut joules, mut watts) = (1000.0, 300.0);
            for (kind, x) in events {
                let dt = 0.0002 + 0.002 * x;
                joules += watts * dt;
                t += dt;
                match kind {
                    0 => {
                        watts = 100.0 + 600.0 * x;
                        track.on_power(t, (watts * 1000.0) as u32, None);
                    }
                    1 => track.on_power(t, (watts * 1000.0) as u32, None),
                    2 => track.on_counter(t - 0.00005, t, (joules * 1000.0) as u64, 0.00005),
                    3 => track.add_hint(t),
                    // An edge taken a moment ago, perhaps before the latest reading.
                    4 => track.add_hint(t - 0.002 * x),
                    _ => track.on_power_fault(t),
                }
                let Some(a) = track.anchors.back().map(|a| a.t) else { continue };
                for probe in [t, t + 0.0005 * x] {
                    if track.ticks.back().is_some_and(|k| k.t >= a && probe >= k.t) {
                        let want = track.model(a, probe, None).0;
                        // Twice: computed, then from the cache.
                        for _ in 0..2 {
                            let got = track.model_past_anchor(a, probe);
                            prop_assert!(
                                (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                                "at {probe}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }

        /// Looking at the end first finds what a binary search over the whole finds, for a
        /// history wrapped anywhere in its ring buffer and any threshold.
        #[test]
        fn partition_recent_is_partition_point(
            mut xs in prop::collection::vec(-100i32..100, 0..60),
            rotate in 0usize..60,
            threshold in -110i32..110,
        ) {
            xs.sort();
            let mut v: VecDeque<i32> = VecDeque::with_capacity(64);
            // Wrap the buffer: pop from the front, push at the back.
            for _ in 0..rotate {
                v.push_back(0);
                v.pop_front();
            }
            v.extend(xs.iter().copied());
            prop_assert_eq!(
                v.partition_recent(|&x| x < threshold),
                v.partition_point(|&x| x < threshold)
            );
            prop_assert_eq!(
                v.partition_recent(|&x| x <= threshold),
                v.partition_point(|&x| x <= threshold)
            );
        }
    }
}
