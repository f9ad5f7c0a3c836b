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

use std::collections::VecDeque;

use super::fit::{self, Grid, LagFit, LagRead, ReadPair};

/// Seconds of ticks, reads and anchors kept.
const HISTORY_S: f64 = 600.0;
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

/// A power reading that changed (or an update that was due and showed the same value).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    pub t: f64,
    pub watts: f64,
    /// Seen change, not assumed.
    pub seen: bool,
    /// How far off `t` may be (s).
    pub t_err: f64,
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
    plain: VecDeque<Residual>,
    /// Residuals of intervals with window edges, the edges stepping the load ...
    hinted: VecDeque<Residual>,
    /// ... and the same intervals with the edges ignored (the bridge).
    hinted_bridge: VecDeque<Residual>,
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
    /// Extrapolated window ends waiting for the counter: (time, estimate J, seconds past the
    /// last anchor, power scale W).
    pending_ends: VecDeque<(f64, f64, f64, f64)>,
    /// How far extrapolated ends were off once settled, over `seconds * power`.
    end_errors: VecDeque<f64>,
    /// Relative noise of the power readings against the counter in steady stretches.
    noise: f64,
    /// Recent relative deviations of readings from the counter's mean in steady stretches.
    deviations: VecDeque<f64>,
    /// Counter steps and the power readings' energy over them, decayed (rate check), and the
    /// seconds they span.
    rate: (f64, f64),
    rate_span: f64,
    frozen_steps: u32,
    mode: Mode,
    /// Why the mode is what it is (for the warning), with the figures.
    mode_reason: String,
    /// The board's highest power (W): its maximum power limit, for hard bounds.
    max_power_w: f64,
    /// The highest reading seen (W), and the lowest of the last [`FLOOR_TICKS`]: kept as ticks
    /// come, since the bounds ask for them per tick of the model.
    seen_max_w: f64,
    recent_min_w: f64,
    /// The counter's resolution (J): the greatest common divisor of its values in mJ.
    resolution_j: f64,
    resolution_mj: u64,
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

/// The scale (a standard deviation) of residuals: their 95th percentile over 1.96, so that a
/// bound of [`Z95`] scales covers 95% of them whatever the shape of their tail (a load that
/// moves between readings gives heavy ones), while a single stray value among two dozen (a
/// start-up glitch) does not widen every bound.
fn rms(q: &VecDeque<Residual>, calm_only: bool) -> Option<f64> {
    let v: Vec<f64> = q
        .iter()
        .filter(|r| !calm_only || r.calm)
        .map(|r| r.rel)
        .collect();
    robust_scale(&v)
}

fn robust_scale(v: &[f64]) -> Option<f64> {
    if v.len() < 3 {
        return None;
    }
    let mut a: Vec<f64> = v.iter().map(|x| x.abs()).collect();
    a.sort_by(f64::total_cmp);
    let q95 = a[((a.len() as f64 * 0.95).ceil() as usize).min(a.len()) - 1];
    let second = a[a.len().saturating_sub(2)];
    Some(q95.min(second) / 1.96)
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
            plain: VecDeque::new(),
            hinted: VecDeque::new(),
            hinted_bridge: VecDeque::new(),
            pending_shapes: VecDeque::new(),
            lag_misfits: 0,
            lag_beyond: 0.0,
            tau: f64::INFINITY,
            level_guess: 0.0,
            load_var: 0.0,
            pending_ends: VecDeque::new(),
            end_errors: VecDeque::new(),
            noise: 0.01,
            deviations: VecDeque::new(),
            rate: (0.0, 0.0),
            rate_span: 0.0,
            frozen_steps: 0,
            mode: Mode::Cached,
            mode_reason: String::new(),
            max_power_w: 0.0,
            seen_max_w: 0.0,
            recent_min_w: f64::INFINITY,
            resolution_j: 0.001,
            resolution_mj: 0,
        }
    }

    /// The board's highest power (its maximum power limit), for bounds over stretches without
    /// readings.
    pub fn set_max_power(&mut self, watts: f64) {
        self.max_power_w = watts.max(0.0);
    }

    /// The power readings are the driver's average (the board has no instant power): whether
    /// they lag is found out from the counter.
    pub fn set_average_only(&mut self, yes: bool) {
        self.average_only = yes;
        self.averaged = None;
    }

    /// Forget the update period the backend said, and measure it (as with NVML, which does
    /// not say).
    pub fn forget_period(&mut self) {
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
        let mut all: VecDeque<Residual> = self.plain.clone();
        all.extend(
            if self.steps() {
                &self.hinted
            } else {
                &self.hinted_bridge
            }
            .iter()
            .copied(),
        );
        rms(&all, false).unwrap_or(0.0)
    }

    /// Self-check residual scales: intervals without window edges, with them (edges stepping
    /// the load), with them (the bridge), for diagnostics.
    pub fn residual_scales(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        (
            rms(&self.plain, false),
            rms(&self.hinted, false),
            rms(&self.hinted_bridge, false),
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

    /// Mark a window edge at `t`: the load probably changes there. Only the first and the last
    /// edge of a tick interval shape the model (the level between them is one unknown), so an
    /// interval keeps at most two: a tight loop of windows costs neither time nor memory.
    pub fn add_hint(&mut self, t: f64) {
        if self.hints.back().is_some_and(|&h| h >= t) {
            return;
        }
        let last_tick = self.ticks.back().map_or(f64::NEG_INFINITY, |k| k.t);
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

    /// A power reading (mW) taken at `t`, with the driver's timestamp of it if it gave one.
    pub fn on_power(&mut self, t: f64, milliwatts: u32, stamp: Option<f64>) {
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

    fn vote_stamps(&mut self, milliwatts: u32, stamp: Option<f64>) {
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

    fn tick_from_polls(&mut self, t: f64, milliwatts: u32, watts: f64) {
        match self.last_value {
            // The first reading is not a tick: the update it shows happened at an unknown time
            // before it.
            None => {}
            Some(v) if v != milliwatts => {
                // The change happened between the previous poll and this one. When this thread
                // was held up (a loaded machine) that span is long; once the phase is known,
                // the expected update time inside it is the better estimate.
                let gap = t - self.last_poll;
                let expected = self
                    .expected_tick()
                    .filter(|&e| gap > 2.0 * POLL_STEP && e > self.last_poll && e <= t);
                let (at, t_err) = match expected {
                    Some(e) => (e, 2.0 * POLL_STEP),
                    None => {
                        let lo = self.last_poll.max(t - gap);
                        ((lo + t) / 2.0, ((t - lo) / 2.0).max(POLL_STEP / 2.0))
                    }
                };
                self.learn_period(at);
                self.push_tick(Tick {
                    t: at,
                    watts,
                    seen: true,
                    t_err,
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
                            index: 0,
                        });
                    }
                }
            }
        }
    }

    fn expected_tick(&self) -> Option<f64> {
        if !self.locked {
            return None;
        }
        self.ticks.back().map(|k| k.t + self.period)
    }

    fn learn_period(&mut self, t: f64) {
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
    fn refine_period(&mut self) {
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

    fn push_tick(&mut self, mut tick: Tick) {
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
            // The guess until calibrated: publishes a prior lag after each power update.
            self.schedule.grid = Grid {
                period: self.period,
                phase: tick.t + PRIOR_LAG,
                phase_err: PRIOR_LAG,
            };
            self.schedule.lag = PRIOR_LAG;
        }
        if tick.seen && self.locked {
            self.refine_period();
        }
        if self.ticks.len() % 4 == 0 {
            self.learn_load();
        }
        let horizon = tick.t - HISTORY_S;
        while self.ticks.len() > 2 && self.ticks[1].t < horizon {
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

    fn end_gap(&mut self, since: f64, until: f64, watts: f64) {
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
                index: 0,
            });
        }
    }

    /// Retry power polling at `t` (after a fault).
    pub fn retry_power_at(&mut self, t: f64) {
        self.next_poll = t;
    }

    // ---- counter reads ---------------------------------------------------------------------

    /// A counter read (mJ) that started at `before` and ended at `after`, costing `cost` s of
    /// this thread's CPU.
    pub fn on_counter(&mut self, before: f64, after: f64, millijoules: u64, cost: f64) {
        self.read_cost = if self.read_cost == 0.0 {
            cost
        } else {
            0.8 * self.read_cost + 0.2 * cost
        };
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
        let moved = refit && {
            self.reads_since_fit = 0;
            self.refit();
            schedule_moved(&was_schedule, &self.schedule)
        };
        if moved {
            if schedule_changed_model(&was_schedule, &self.schedule) {
                // The residuals measured the model as it was: a new schedule starts afresh.
                self.plain.clear();
                self.hinted.clear();
                self.hinted_bridge.clear();
                self.pending_shapes.clear();
                self.end_errors.clear();
                self.pending_ends.clear();
            }
            self.rebuild_anchors();
        } else {
            self.attribute_next(r, true);
        }
        self.settle_pending_ends();
        self.plan_read(after);
    }

    /// A counter read failed at `t`: try again after `retry` s.
    pub fn on_counter_fault(&mut self, t: f64, retry: f64) {
        self.read_due = Some(t + retry);
    }

    /// The next read: right after the counter's next publish once the schedule is known (every
    /// fourth read dithered, so the schedule stays checked), at a dithered delay before.
    fn plan_read(&mut self, after: f64) {
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
    pub(super) fn read_pairs(&self) -> Vec<ReadPair> {
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
    fn power_stats(&self, a: f64, b: f64, min_ticks: usize) -> (f64, bool) {
        // Steadiness is judged on the readings themselves; lagging averages are steady only
        // once they have been for a whole window.
        let a = a - self.averaged.unwrap_or(0.0);
        let i = self.ticks.partition_point(|k| k.t < a);
        let j = self.ticks.partition_point(|k| k.t <= b);
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

    fn refit(&mut self) {
        let pairs = self.read_pairs();
        let fitted_grid = fit::fit_grid(&pairs, self.period, self.noise);
        // A fitted grid stays while it explains the recent steady pairs within about one
        // miscount of the best: with few steady pairs (a load that keeps stepping) the best
        // phase wobbles by milliseconds from fit to fit, and reads placed just after a publish
        // would then fall on the wrong side of it.
        let current = fit::grid_score(&pairs, &self.schedule.grid, self.noise);
        let keep = |g: &fit::GridFit| {
            self.schedule.fitted
                && (g.grid.period - self.schedule.grid.period).abs() < 1e-9
                && current.is_some_and(|c| c <= g.score + 2.0 / g.evidence)
        };
        if let Some(g) = fitted_grid.filter(|g| !keep(g)) {
            // Accept a grid once the phases that fit are a small part of the period.
            if g.grid.phase_err < g.grid.period / 4.0 && g.score < 2.0 {
                let was = self.schedule.grid;
                self.schedule.grid = g.grid;
                if !self.schedule.fitted || (was.period - g.grid.period).abs() > 1e-9 {
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
        if self.averaged.is_some() {
            // Lagging averages carry no timing the counter's own means lack: the lag can only
            // be told from window edges where the load stepped (see `lag_from_steps`).
            self.fit_averaging();
            if let Some((lag, err)) = self.lag_from_steps() {
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
        let fitted = fit::fit_lag(&reads[from..], &grid, (LAG_MIN, LAG_MAX), &|a, b| {
            if unknown.iter().any(|&(x, y)| x < b && y > a) {
                f64::NAN
            } else {
                self.model(a, b, None).0
            }
        });
        let edges_seen = reads
            .get(from)
            .is_some_and(|r0| self.hints.iter().any(|&h| h > r0.before));
        if let Some(l) = fitted {
            // No lag in the range explains the counter where the load stepped, again and
            // again: the board's lag is outside what the sampler calibrates.
            let best = l.scores.iter().copied().fold(f64::INFINITY, f64::min);
            if l.informative {
                self.lag_misfits = 0;
            } else if edges_seen && best > 0.1 {
                self.lag_misfits += 1;
            }
            // A counter on the power grid most likely describes the power updates, as on the
            // measured H100: that lag stands unless the data reject it.
            let on_grid = (self.schedule.grid.period - self.period).abs() < 1e-6;
            let grid_lag = self.on_grid_lag();
            // The counter may describe an update whole periods back: a lag of the grid's
            // family.
            let p = self.period.max(1e-3);
            let family = grid_lag + ((l.lag - grid_lag) / p).round() * p;
            let off_family = (l.lag - family).abs() > l.lag_err + 0.003;
            // The pooled fit may put the counter between the power updates while the window
            // edges one by one do not say the same. Its evidence is a few steps, and a caller
            // held up between its window edge and the load step (a busy machine: tens of ms)
            // pulls it by as much; such a pull is one edge's, a board's lag is every edge's.
            let unconfirmed = on_grid
                && l.informative
                && off_family
                && !l.accepts(grid_lag)
                && !self.steps_confirm(&l, grid_lag);
            self.schedule.on_ticks =
                on_grid && (unconfirmed || !l.informative || l.accepts(grid_lag));
            let keep = self.schedule.lag_known && l.accepts(self.schedule.lag);
            if unconfirmed {
                // The grid's lag stands, measured if it was; the fit is no word on the board.
                if !(self.schedule.lag_known && (self.schedule.lag - grid_lag).abs() < 0.002) {
                    self.schedule.lag = grid_lag;
                    self.schedule.lag_known = false;
                    self.schedule.lag_err = self.schedule.grid.phase_err.max(0.005);
                }
            } else if on_grid && l.informative && l.accepts(grid_lag) {
                self.schedule.lag = grid_lag;
                self.schedule.lag_err = l.lag_err.clamp(0.001, 0.005);
                self.schedule.lag_known = true;
                self.schedule.lag_beyond_range = false;
            } else if keep {
                // A measured lag stays while the data still accept it: a load that moves
                // between readings makes the fit's best lag wander, the board's lag does not.
            } else if l.informative {
                self.schedule.lag = l.lag;
                self.schedule.lag_err = l.lag_err.max(0.001);
                self.schedule.lag_known = true;
                self.schedule.lag_beyond_range = l.beyond_range;
            } else if let Some((lag, err)) = self
                .lag_from_steps()
                .filter(|&(lag, e)| e < 0.01 && lag < STEP_LAG_MAX)
            {
                // The model cannot tell the lag (sparse power samples, a load that moves between
                // them), but the counter's steps across the window edges can.
                self.schedule.lag = lag;
                self.schedule.lag_err = err;
                self.schedule.lag_known = true;
                self.schedule.lag_beyond_range = false;
                self.lag_misfits = 0;
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

    /// Whether the counter's steps at window edges, taken one by one ([`Self::lag_from_steps`],
    /// a median over at least three), agree with the lag `fit` found and not with `grid_lag`.
    fn steps_confirm(&self, fit: &LagFit, grid_lag: f64) -> bool {
        self.lag_from_steps().is_some_and(|(lag, err)| {
            (lag - fit.lag).abs() <= err + fit.lag_err + 0.003
                && (lag - grid_lag).abs() > err + 0.003
        })
    }

    /// The lag from counter steps across window edges, where the load is taken to step: the
    /// counter shows each step somewhere within the lag's range of the edge, on the anchors'
    /// time axis (which the lag in use puts in place). Between the level well before and the
    /// level well after, the first counter interval that moved off the level before holds the
    /// step, and how far into it the step fell says where it was; its distance from the edge is
    /// what the lag in use is off by. The median over the edges, and its spread as the error;
    /// `None` with fewer than three.
    fn lag_from_steps(&self) -> Option<(f64, f64)> {
        let n = self.anchors.len();
        if n < 4 {
            return None;
        }
        let mean_over = |lo: f64, hi: f64| -> Option<f64> {
            let i = self.anchors.partition_point(|a| a.t < lo);
            let j = self.anchors.partition_point(|a| a.t <= hi);
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
            let i = self.anchors.partition_point(|a| a.t < h - reach);
            let j = self
                .anchors
                .partition_point(|a| a.t <= h + reach)
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
    pub(super) fn shift_beyond_range(&self) -> Option<f64> {
        if self.averaged.is_some() {
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
    fn on_grid_lag(&self) -> f64 {
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
    fn candidates(&self, r: &Read) -> (f64, Option<f64>) {
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
    fn rebuild_anchors(&mut self) {
        let n = self.reads.len();
        let from = n.saturating_sub(FIT_READS);
        let Some(first) = self.reads.get(from).copied() else {
            return;
        };
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
        let reads: Vec<Read> = self.reads.iter().skip(from).copied().collect();
        for r in reads {
            self.attribute_next(r, false);
        }
    }

    /// Turn read `r` (the newest) into an anchor; with `check`, score the model's prediction of
    /// it first (the self-check).
    fn attribute_next(&mut self, r: Read, check: bool) {
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
                raw: value,
                read_at: r.after,
            });
            return;
        };
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
                let fits = |x: f64| {
                    let (lo, hi) = self.allowed_range(prev, x);
                    let tol = 3.0
                        * (self.residual_scale(false) * (predict(x) - prev.joules).abs())
                            .max(self.resolution_j);
                    scaled >= lo - tol && scaled <= hi + tol
                };
                let (e_new, e_old) = (
                    (scaled - predict(x_new)).abs(),
                    (scaled - predict(old)).abs(),
                );
                let sep = (predict(x_new) - predict(old)).abs();
                let unseen = self.unseen_edge(x_new).is_some();
                match (unseen, fits(x_new), fits(old)) {
                    (true, true, false) => (x_new, t_err_sched),
                    (true, false, true) => (old, t_err_sched),
                    // Either would do: cannot tell which publish it was, no anchor from it.
                    (true, true, true) => return,
                    // Else the nearer prediction, where clearly nearer.
                    _ if e_new.min(e_old) < 0.35 * sep => {
                        (if e_new <= e_old { x_new } else { old }, t_err_sched)
                    }
                    _ => return,
                }
            }
        };
        // On the power grid with the lag that says so, the moment is a tick: snap to it.
        let (x, t_err) = match self.snap_to_tick(x) {
            Some(tick) if self.schedule.on_ticks && self.schedule.lag_known => {
                (tick.t, tick.t_err + 0.0002)
            }
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
            raw: value,
            read_at: r.after,
        });
    }

    /// The counter's range at `x` (J, on the track's scale) that the model allows after anchor
    /// `prev`: its energy up to a window edge later than the last reading, and anything the
    /// board can draw past that edge (no reading has seen the load there).
    fn allowed_range(&self, prev: Anchor, x: f64) -> (f64, f64) {
        let until = self.unseen_edge(x).map_or(x, |h| h.max(prev.t));
        let base = prev.joules + self.model(prev.t, until, None).0;
        let unseen = x - until;
        let (lo_w, hi_w) = (self.power_floor().max(0.0), self.power_ceiling());
        (base + unseen * lo_w, base + unseen * hi_w)
    }

    /// The first window edge after the last power reading and before `t`: the load may have
    /// stepped there to a level no reading has seen.
    fn unseen_edge(&self, t: f64) -> Option<f64> {
        let seen = self.ticks.back()?.t;
        let i = self.hints.partition_point(|&h| h <= seen);
        self.hints.get(i).copied().filter(|&h| h < t)
    }

    /// The tick within a quarter period of `x`, if any.
    fn snap_to_tick(&self, x: f64) -> Option<Tick> {
        let i = self.ticks.partition_point(|k| k.t < x);
        [i.checked_sub(1), Some(i)]
            .into_iter()
            .flatten()
            .filter_map(|k| self.ticks.get(k).copied())
            .filter(|k| (k.t - x).abs() < self.period / 4.0)
            .min_by(|a, b| (a.t - x).abs().total_cmp(&(b.t - x).abs()))
    }

    /// A conservative sigma of the model's energy over `[a, b]` without a counter (J).
    fn model_sigma(&self, a: f64, b: f64) -> f64 {
        let (e, _) = self.model(a, b, None);
        let s = self.residual_scale(false).max(0.05);
        (e * s).max(self.power_ceiling() * (b - a) * 0.02)
    }

    fn record_residual(&mut self, a: f64, b: f64, moved: f64, pred: f64) -> Residual {
        let rel = |pred: f64| {
            let scale = pred.abs().max(moved.abs()).max(self.resolution_j * 4.0);
            (moved - pred) / scale
        };
        // Steady for the self-check: eight readings alike, over half a second at least (a load
        // that moves between readings rarely leaves that many alike).
        let span_before = (0.5 - (b - a)).max(2.0 * self.period);
        let (_, calm) = self.power_stats(a - span_before, b + self.period, 8);
        let hinted = self.hints.iter().any(|&h| h > a && h < b);
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
            push_bounded(&mut self.plain, res, RESIDUALS);
        }
        if res.calm && moved > 0.0 && b - a >= self.period * 0.5 {
            // Steady power: the readings' spread around the counter's mean is their noise.
            let mean = moved / (b - a).max(1e-6);
            let i = self.ticks.partition_point(|k| k.t < a);
            let j = self.ticks.partition_point(|k| k.t <= b);
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
    fn score_shapes(&mut self) {
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
                push_bounded(
                    q,
                    Residual {
                        rel: (moved - pred) / scale,
                        calm: false,
                    },
                    RESIDUALS,
                );
            }
        }
    }

    /// Where the model's levels come from the counter (lagging averages): the interval before
    /// `prev` held one window edge; now that the interval after it is known, check how well
    /// the edge splits its step into the level before (the interval before's mean) and after
    /// (the new interval's).
    fn check_split(&mut self, prev: Anchor, x: f64, moved: f64) {
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
        push_bounded(
            &mut self.hinted,
            Residual {
                rel: (step - split) / scale,
                calm: false,
            },
            RESIDUALS,
        );
    }

    /// Score the model's prediction of a counter step and update the mode.
    fn self_check(&mut self, prev: Anchor, x: f64, moved: f64, pred: f64) {
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
    fn raw_integral(&self, a: f64, b: f64) -> f64 {
        let i = self.ticks.partition_point(|k| k.t <= a).saturating_sub(1);
        let j = self
            .ticks
            .partition_point(|k| k.t < b)
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

    fn update_mode(&mut self) {
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
        } else if misfit || (self.mode == Mode::Direct && !fits_again) {
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
    fn residual_scale(&self, hinted: bool) -> f64 {
        let q = match (hinted, self.steps()) {
            (false, _) => &self.plain,
            (true, true) => &self.hinted,
            (true, false) => &self.hinted_bridge,
        };
        let floor = (self.noise * 0.5).max(0.003);
        match rms(q, false) {
            Some(r) => r.max(floor),
            // Before intervals with window edges have been checked: twice what the others do.
            None => match rms(&self.plain, false) {
                Some(r) => (2.0 * r).max(floor).max(0.01),
                None => 0.05,
            },
        }
    }

    /// Extrapolated window ends whose moment the counter has now passed: how far off they were.
    fn settle_pending_ends(&mut self) {
        while let Some(&(t, est, u, p)) = self.pending_ends.front() {
            if !self.is_settled(t + 0.001) {
                break;
            }
            self.pending_ends.pop_front();
            if let Some(e) = self.edge(t) {
                if !e.degraded && u > 0.0 && p > 0.0 {
                    push_bounded(&mut self.end_errors, (est - e.joules) / (u * p), RESIDUALS);
                }
            }
        }
    }

    /// Averaging window of average-only readings: the one under which the readings match the
    /// counter's own trailing means best.
    fn fit_averaging(&mut self) {
        if self.anchors.len() < 8 {
            return;
        }
        let t0 = self.anchors.front().expect("anchors").t;
        let t1 = self.anchors.back().expect("anchors").t;
        let lin = |t: f64| -> Option<f64> {
            let j = self.anchors.partition_point(|a| a.t <= t);
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

    /// The power to use for tick `k`: its reading, or for lagging averages the counter's own
    /// mean power around it (see [`Track::counter_level`]).
    fn tick_power(&self, k: usize) -> f64 {
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
    fn open_level(&self) -> Option<(f64, f64, f64)> {
        let w = self.averaged?;
        let last = self.anchors.back()?;
        let h = *self.hints.iter().rev().find(|&&h| h > last.t)?;
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
    fn level_after_last_edge(&self) -> Option<f64> {
        let n = self.anchors.len();
        if n < 3 {
            return None;
        }
        let (a, b) = (self.anchors[n - 2], self.anchors[n - 1]);
        let h = *self.hints.iter().rev().find(|&&h| h > a.t && h < b.t)?;
        if b.t - h < 0.25 * (b.t - a.t) {
            return None;
        }
        let before = self.interval_mean(n - 2)?;
        let after = (b.joules - a.joules - before * (h - a.t)) / (b.t - h);
        Some(after.clamp(self.power_floor().max(0.0), self.power_ceiling()))
    }

    /// Mean power (W) of the counter's interval `j` (between anchors `j - 1` and `j`).
    fn interval_mean(&self, j: usize) -> Option<f64> {
        if j == 0 || j >= self.anchors.len() {
            return None;
        }
        let (a, b) = (self.anchors[j - 1], self.anchors[j]);
        Some(((b.joules - a.joules) / (b.t - a.t).max(1e-6)).max(0.0))
    }

    /// The counter's mean power (W) over the anchors that lie within `[a, b]`, where at least
    /// two do.
    fn mean_within(&self, a: f64, b: f64) -> Option<f64> {
        let i = self.anchors.partition_point(|x| x.t < a);
        let j = self.anchors.partition_point(|x| x.t <= b);
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
    fn unknown_stretches(&self) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = self.gaps.iter().copied().collect();
        for pair in self.hints.iter().zip(self.hints.iter().skip(1)) {
            let (&h0, &h1) = pair;
            let ticks_between = self.ticks.partition_point(|k| k.t < h1)
                - self.ticks.partition_point(|k| k.t <= h0);
            if ticks_between == 0 && self.mean_within(h0, h1).is_none() {
                out.push((h0, h1));
            }
        }
        out
    }

    /// The power at `t` from the counter alone: the mean of its interval around `t`; where a
    /// window edge lies in that interval (the load stepped there), the mean of the interval
    /// before for moments before the edge and of the one after for moments after it.
    fn counter_level(&self, t: f64) -> f64 {
        let n = self.anchors.len();
        let j = self.anchors.partition_point(|a| a.t <= t);
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
        let first = self.hints.partition_point(|&h| h <= a);
        let last = self.hints.partition_point(|&h| h < b);
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
    fn power_ceiling(&self) -> f64 {
        self.max_power_w.max(self.seen_max_w * 1.2).max(1.0)
    }

    /// The lowest power seen lately (W).
    fn power_floor(&self) -> f64 {
        self.recent_min_w.min(self.power_ceiling()) * 0.8
    }

    /// The model's pieces between ticks `i` and `i + 1`; window edges step the load when
    /// `steps`.
    fn pieces(&self, i: usize, steps: bool, out: &mut Vec<Piece>) {
        let (a, b) = (self.ticks[i], self.ticks[i + 1]);
        let (wa, wb) = (self.tick_power(i), self.tick_power(i + 1));
        // A stretch without readings (a fault): its level is unknown.
        if self.gaps.iter().any(|g| g.0 < b.t && g.1 > a.t) {
            out.push(Piece {
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
        let start = self.hints.partition_point(|&h| h <= a.t - HINT_TOLERANCE);
        let end = self.hints.partition_point(|&h| h < b.t);
        if start == end || !steps {
            out.push(Piece {
                t0: a.t,
                t1: b.t,
                shape: self.between(a.t, b.t, wa, wb),
            });
            return;
        }
        // A step at the first edge; between the first and the last edge (if they differ) one
        // level, unknown until the counter says.
        let (first, last) = (self.hints[start].max(a.t), self.hints[end - 1].max(a.t));
        out.push(Piece {
            t0: a.t,
            t1: first,
            shape: Shape::Ramp { w0: wa, w1: wa },
        });
        if last > first {
            // The stretch between edges had no power reading; the counter may have measured
            // it whole (a short gap between windows on a fast counter).
            let guess = self.mean_within(first, last).unwrap_or((wa + wb) / 2.0);
            out.push(Piece {
                t0: first,
                t1: last,
                shape: Shape::Free { guess },
            });
        }
        out.push(Piece {
            t0: last,
            t1: b.t,
            shape: Shape::Ramp { w0: wb, w1: wb },
        });
    }

    /// The power between two readings: a ramp where the load holds longer than the interval,
    /// else the readings' pull fading into the level between them (the bridge of a load whose
    /// correlation decays over `tau`).
    fn between(&self, ta: f64, tb: f64, pa: f64, pb: f64) -> Shape {
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
    pub(super) fn steps(&self) -> bool {
        match (rms(&self.hinted, false), rms(&self.hinted_bridge, false)) {
            (Some(step), Some(bridge)) => step <= bridge * 1.1,
            _ => true,
        }
    }

    /// Integral of the power model over `[a, b]` (J), free parts at `level` if given (else
    /// at their guesses), and the weight of the free parts in `[a, b]` (s).
    fn model(&self, a: f64, b: f64, level: Option<f64>) -> (f64, f64) {
        self.model_with(a, b, level, self.steps())
    }

    fn model_with(&self, a: f64, b: f64, level: Option<f64>, steps: bool) -> (f64, f64) {
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
        let lo = self.ticks.partition_point(|k| k.t <= a).saturating_sub(1);
        let hi = self.ticks.partition_point(|k| k.t < b).min(n - 1);
        let mut pieces = Vec::new();
        for i in lo..hi {
            pieces.clear();
            self.pieces(i, steps, &mut pieces);
            for p in &pieces {
                add(p, a, b);
            }
        }
        (total, free)
    }

    /// Update the load's correlation time and level from the recent readings.
    fn learn_load(&mut self) {
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

    fn edge_model(&self, t: f64) -> Option<Edge> {
        let first = *self.anchors.front()?;
        let j = self.anchors.partition_point(|a| a.t <= t);
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
                settled: true,
                degraded: gap > 0.0,
            });
        }
        let a = self.anchors[j - 1];
        let timing = self.timing_sigma(a);
        let Some(&b) = self.anchors.get(j) else {
            let (e, _) = self.model(a.t, t, None);
            let u = t - a.t;
            // Lagging averages after a window edge: the new level is only roughly known.
            let (level_sigma, level_hard) = match self.open_level() {
                Some((h, _, sg)) if t > h && sg.is_finite() => (sg * (t - h), 0.0),
                Some((h, _, _)) if t > h => (0.0, self.free_half_width(t - h)),
                _ => (0.0, 0.0),
            };
            // How far the extrapolation goes wrong is learned against the settled value, which
            // is itself off by what interpolation inside a counter interval is: both count.
            let hinted = self.hints.iter().any(|&h| h > a.t - HINT_TOLERANCE);
            let interval = self.power_near(t) * self.schedule.grid.period.max(self.period);
            // (Where in its counter interval the end will fall is not known yet: the shape's
            // factor 2 sqrt(x (1 - x)) averages pi / 4 over it.) Where window edges step the
            // load, the settled value is as good as the step is placed, which the learned
            // extrapolation errors already hold; a load that moves within a couple of
            // intervals is another matter.
            let shape = if self.steps() && !self.moves_within_intervals() {
                0.0
            } else {
                // A load that moves within the interval is unknown past the last reading as a
                // random walk of its variance over its correlation time.
                let walk = (2.0 * self.load_var * self.tau.min(u) * u).sqrt();
                (self.residual_scale(hinted) * interval * std::f64::consts::FRAC_PI_4).max(walk)
            };
            let ex = self.extrapolation_sigma(u, t);
            return Some(Edge {
                joules: a.joules + e,
                sigma: (ex.powi(2)
                    + shape.powi(2)
                    + timing.powi(2)
                    + res_sigma.powi(2)
                    + level_sigma.powi(2))
                .sqrt(),
                hard: self.free_half_width(self.gap_overlap(a.t, t)) + level_hard,
                offset_sigma: a.offset_sigma,
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
            let hinted = self
                .hints
                .iter()
                .any(|&h| h > a.t - HINT_TOLERANCE && h < b.t);
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
            // Where the load steps at this edge, anchors off by their timing error misplace
            // the step's energy.
            let step = if hinted {
                self.step_at(t) * a.t_err.max(b.t_err) / 3f64.sqrt()
            } else {
                0.0
            };
            let timing = timing.max(self.timing_sigma(b)).max(step);
            (
                a.joules + delta * frac,
                (shape.powi(2) + timing.powi(2) + res_sigma.powi(2)).sqrt(),
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
            settled: true,
            degraded: in_gap || joined,
        })
    }

    /// Seconds of `[a, b]` without power readings (faults, finished or ongoing).
    fn gap_overlap(&self, a: f64, b: f64) -> f64 {
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

    fn in_gap(&self, t: f64) -> bool {
        self.gaps.iter().any(|g| g.0 <= t && t <= g.1)
            || self.power_down_since.is_some_and(|s| t >= s)
    }

    /// Range of the energy from `a` to `t` (J) given `before` s from `a` to `t`, `after` s from
    /// `t` to `b`, and the counter step `delta` over both, for any power the board can draw.
    fn feasible(&self, before: f64, after: f64, delta: f64) -> (f64, f64) {
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
    fn free_half_width(&self, free: f64) -> f64 {
        if free <= 0.0 {
            return 0.0;
        }
        (self.power_ceiling() - self.power_floor().max(0.0)) * free
    }

    /// How much the power model changes across `t` (W): the step a window edge there makes.
    fn step_at(&self, t: f64) -> f64 {
        let d = self.period.max(0.005);
        let (before, _) = self.model(t - d, t, None);
        let (after, _) = self.model(t, t + d, None);
        (after - before).abs() / d
    }

    /// Energy sigma from the uncertainty of when anchor `a` was (J): only where the power
    /// changes around it.
    fn timing_sigma(&self, a: Anchor) -> f64 {
        let i = self.ticks.partition_point(|k| k.t <= a.t);
        if i == 0 || i >= self.ticks.len() {
            return 0.0;
        }
        let dp = (self.tick_power(i) - self.tick_power(i - 1)).abs();
        dp * a.t_err / 3f64.sqrt()
    }

    /// The power an extrapolation's error scales with (W): the latest reading, or the load's
    /// recent level where that is higher (a load that idles now may be busy the next moment).
    fn power_scale(&self, t: f64) -> f64 {
        self.power_near(t).max(self.level_guess)
    }

    /// Sigma (J) of the model's energy `u` s past the last anchor, up to `t`.
    fn extrapolation_sigma(&self, u: f64, t: f64) -> f64 {
        let p = self.power_scale(t);
        let v: Vec<f64> = self.end_errors.iter().copied().collect();
        let k = match robust_scale(&v).filter(|_| v.len() >= 4) {
            // Readings' noise alone puts an extrapolation off by the last reading's noise
            // over the stretch past it: uniform of amplitude `noise`, a sigma of noise / sqrt 3.
            Some(r) => r.max(self.noise / 3f64.sqrt()),
            // Before the board has shown how well it extrapolates: where window edges step the
            // load, twice the model's error over a counter interval; else the spread of the
            // recent power, or 10%.
            None if self.steps() && !self.moves_within_intervals() => {
                (2.0 * self.residual_scale(false)).max(0.02)
            }
            None => self.power_spread().max(0.1),
        };
        k * u * p
    }

    /// Whether the load moves within a counter interval (its correlation time is
    /// shorter): then no reading says much about the power between two of them.
    fn moves_within_intervals(&self) -> bool {
        self.tau < self.schedule.grid.period.max(self.period)
    }

    /// The power of the tick at or before `t` (W).
    fn power_near(&self, t: f64) -> f64 {
        let i = self.ticks.partition_point(|k| k.t <= t);
        if self.ticks.is_empty() {
            return 0.0;
        }
        self.tick_power(i.saturating_sub(1).min(self.ticks.len() - 1))
    }

    /// RMS change between consecutive ticks over their mean, recently.
    fn power_spread(&self) -> f64 {
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
        Some((combine(e0, e1), e1))
    }

    /// The window estimate without marking anything.
    pub fn window_estimate(&self, t0: f64, t1: f64) -> Option<WindowEstimate> {
        Some(combine(self.edge(t0)?, self.edge(t1)?))
    }

    /// The bound of a window read directly at its edges (the counter's values there are stale
    /// by the lag plus up to a period): the energy that may be missing at either edge.
    pub fn direct_bound(&self, t0: f64, t1: f64) -> f64 {
        let s = &self.schedule;
        let stale = if s.lag_beyond_range || !s.lag_known {
            (2.0 * LAG_MAX).max(self.lag_beyond + 0.02)
        } else {
            s.lag + s.lag_err
        } + s.grid.period
            + s.grid.phase_err;
        let edge = |t: f64| {
            let (e, _) = self.model(t - stale, t, None);
            e * 1.1 + self.free_half_width(self.gap_overlap(t - stale, t)) + self.resolution_j
        };
        edge(t0).max(edge(t1)) + 2.0 * self.resolution_j
    }

    /// Energy of `[t0, t1]` integrated from the power readings alone, with its ~95% bound.
    pub fn power_window(&self, t0: f64, t1: f64) -> Option<WindowEstimate> {
        if self.ticks.len() < 2 || t1 < t0 {
            return None;
        }
        let (e, free) = self.model(t0, t1, None);
        // Between ticks the power may have moved anywhere between their readings; readings
        // are noisy; averages lag by half their window.
        let lo = self.ticks.partition_point(|k| k.t <= t0).saturating_sub(1);
        let hi = self
            .ticks
            .partition_point(|k| k.t < t1)
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

/// Whether the schedule moved enough that reads must be attributed again.
fn schedule_moved(a: &Schedule, b: &Schedule) -> bool {
    let d = (a.grid.phase - b.grid.phase).rem_euclid(b.grid.period);
    let phase = d.min(b.grid.period - d);
    a.fitted != b.fitted
        || (a.grid.period - b.grid.period).abs() > 1e-9
        || phase > 0.0005
        || (a.lag - b.lag).abs() > 0.0005
}

/// Whether the schedule changed enough that the self-check's residuals describe another model:
/// the first fit, a new grid period, the lag measured at last or moved beyond its error.
fn schedule_changed_model(a: &Schedule, b: &Schedule) -> bool {
    a.fitted != b.fitted
        || (a.grid.period - b.grid.period).abs() > 1e-9
        || a.lag_known != b.lag_known
        || (a.lag - b.lag).abs() > b.lag_err.max(0.005)
}

/// A window from its two edges: the difference, and the two edges' uncertainties at ~95%.
fn combine(e0: Edge, e1: Edge) -> WindowEstimate {
    let offsets = (e1.offset_sigma.powi(2) - e0.offset_sigma.powi(2)).abs();
    let sigma = (e0.sigma.powi(2) + e1.sigma.powi(2) + offsets).sqrt();
    WindowEstimate {
        joules: (e1.joules - e0.joules).max(0.0),
        bound: Z95 * sigma + e0.hard + e1.hard,
        degraded: e0.degraded || e1.degraded || offsets > 0.0,
    }
}

/// A stretch of the power model.
#[derive(Debug, Clone, Copy)]
struct Piece {
    t0: f64,
    t1: f64,
    shape: Shape,
}

/// How the power runs over a piece. Shapes with an unknown level contribute a "free" weight
/// (seconds at that level): the counter solves the level, or its guess stands in.
#[derive(Debug, Clone, Copy)]
enum Shape {
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
