//! [`SimGpu`]: one simulated board, its state integrated lazily, and its [`Gpu`] face.

use super::*;

/// What a simulated GPU is doing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    Idle,
    Busy,
    /// Busy until this timestamp, then idle.
    BusyUntil(f64),
    /// Drawing this many watts from now on, until the load changes, whatever the workload curve
    /// says: for tests whose board power must follow a known function of the work they give it.
    /// A board cannot draw above its power limit, nor below nothing, so the power is clamped to
    /// `[0, power limit]` (the limit at each moment: lowering the limit lowers the draw, raising
    /// it again restores what was asked). It counts as busy (utilisation, clocks, performance
    /// state) while the drawn power exceeds the preset's idle power.
    Drawing(f64),
}

/// How closely readings follow a real driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fidelity {
    /// As measured on an H100 with driver 580: the energy counter and both power readings change
    /// only once per update period (the preset's `power_update_period_s`, at a per-device phase);
    /// the counter publishes the energy at the last update `counter_delay_s` late; average power
    /// is a trailing average over `average_window_s` (so it lags a load step) and instant power is
    /// not; and on the real clock an energy-counter read costs `energy_read_cost_s` of busy CPU,
    /// a power read `power_read_cost_s`.
    #[default]
    Real,
    /// Readings are exact at the moment of the call and cost nothing: the counter is the exact
    /// integral, instant power the exact power. For fast, exact unit tests.
    Ideal,
}

impl Fidelity {
    pub fn name(self) -> &'static str {
        match self {
            Fidelity::Real => "real",
            Fidelity::Ideal => "ideal",
        }
    }
}

/// The workload a simulated GPU runs when busy.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// A built-in measured workload, scaled to each preset (see [`WorkloadCurve::builtin`]).
    Builtin(&'static str),
    /// A curve used as is on every GPU.
    Curve(WorkloadCurve),
}

impl Workload {
    /// Parse `ZEUS_SIM_WORKLOAD`: a built-in name, else a CSV path.
    pub fn parse(spec: &str) -> GpuResult<Workload> {
        let spec = spec.trim();
        if let Some(name) = workload::builtin_names()
            .into_iter()
            .find(|n| n.eq_ignore_ascii_case(spec))
        {
            return Ok(Workload::Builtin(name));
        }
        WorkloadCurve::from_csv(std::path::Path::new(spec))
            .map(Workload::Curve)
            .map_err(|e| {
                GpuError::Init(format!(
                    "ZEUS_SIM_WORKLOAD: {e} (use a CSV path or a built-in workload: {})",
                    workload::builtin_names().join(", ")
                ))
            })
    }

    fn curve_for(&self, preset: &Preset) -> WorkloadCurve {
        match self {
            Workload::Curve(c) => c.clone(),
            Workload::Builtin(name) => {
                WorkloadCurve::builtin(name, preset.max_power_limit_mw as f64 / 1000.0)
                    .expect("built-in names are checked when parsed")
            }
        }
    }
}

/// The power draw over a stretch of time in which nothing was changed: from `t0`, energy `e0`,
/// under `load`, drawing `busy_w` when busy. A [`Load::Drawing`] here holds the watts actually
/// drawn (already clamped to the power limit of the stretch), so that a later change of the
/// limit does not rewrite the past.
#[derive(Debug, Clone, Copy)]
pub(super) struct Segment {
    pub(super) t0: f64,
    pub(super) e0: f64,
    pub(super) load: Load,
    pub(super) busy_w: f64,
}

impl Segment {
    /// Whether the board is busy at `t` (a board drawing a set power is busy above idle power).
    pub(super) fn is_busy_at(&self, idle_w: f64, t: f64) -> bool {
        match self.load {
            Load::Idle => false,
            Load::Busy => true,
            Load::BusyUntil(until) => t < until,
            Load::Drawing(w) => w > idle_w,
        }
    }

    pub(super) fn power_at(&self, idle_w: f64, t: f64) -> f64 {
        match self.load {
            Load::Drawing(w) => w,
            _ if self.is_busy_at(idle_w, t) => self.busy_w,
            _ => idle_w,
        }
    }

    /// Energy at `t`; before `t0` it extrapolates back with the power at `t0`.
    pub(super) fn energy_at(&self, idle_w: f64, t: f64) -> f64 {
        let dt = t - self.t0;
        if dt <= 0.0 {
            return self.e0 + self.power_at(idle_w, self.t0) * dt;
        }
        match self.load {
            Load::Idle => self.e0 + idle_w * dt,
            Load::Busy => self.e0 + self.busy_w * dt,
            Load::Drawing(w) => self.e0 + w * dt,
            Load::BusyUntil(until) => {
                let busy_dt = (until - self.t0).clamp(0.0, dt);
                self.e0 + self.busy_w * busy_dt + idle_w * (dt - busy_dt)
            }
        }
    }
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) power_limit_mw: u32,
    pub(super) persistence: bool,
    pub(super) gpu_locked: Option<(u32, u32)>,
    pub(super) mem_locked: Option<(u32, u32)>,
    pub(super) load: Load,
    pub(super) curve: Arc<WorkloadCurve>,
    /// Energy integrated up to `t_last`, joules.
    pub(super) energy_j: f64,
    /// `(seconds per unit of work, watts)` when busy at the current settings (see `refresh`).
    pub(super) busy: (f64, f64),
    pub(super) t_last: f64,
    /// Real fidelity only: the stretches before `t_last`, oldest first, for readings that refer
    /// to a moment in the past (the last update, a trailing average).
    pub(super) past: VecDeque<Segment>,
    /// Shared devices: the record version this copy was made from (see [`shared`]).
    pub(super) version: u64,
    /// Shared devices: the generation of `curve`.
    pub(super) curve_gen: u64,
}

/// A locked clock range, `(min, max)` MHz.
pub type ClockRange = (u32, u32);

/// Which die of a board a device is. The MI250X enumerates its two dies as two GPUs, and
/// the odd one reports 0 W: the package's power and energy are in the even die's readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Die {
    Whole,
    Even,
    Odd,
}

/// One simulated GPU.
#[derive(Debug)]
pub struct SimGpu {
    pub(super) index: usize,
    pub(super) preset: &'static Preset,
    pub(super) uuid: String,
    pub(super) privileged: bool,
    pub(super) clock: Arc<SimClock>,
    pub(super) fidelity: Fidelity,
    /// Real fidelity: busy CPU one energy-counter read costs, s (the preset's, unless
    /// `ZEUS_SIM_ENERGY_READ_MS` says otherwise).
    pub(super) energy_read_cost_s: f64,
    /// The board's timing and quirks (the preset's, unless `ZEUS_SIM_*` says otherwise).
    pub(super) board: Board,
    /// Real fidelity: where in its update period this device's driver publishes (s), so that
    /// several GPUs do not tick in lockstep.
    pub(super) tick_phase: f64,
    /// Real fidelity, a counter off the power grid: where in its period the counter updates.
    pub(super) counter_phase: f64,
    /// Injected faults, on this device's clock.
    pub(super) faults: Mutex<Vec<Fault>>,
    /// Counter resets: when, and the energy (J) at that moment once known.
    pub(super) resets: Mutex<Vec<(f64, Option<f64>)>>,
    /// The counter reading (J, and the update it shows) every later read returns once the
    /// counter froze (a board whose counter stops counting while the board draws power, as
    /// MI100's did).
    pub(super) frozen: Mutex<Option<(f64, f64)>>,
    /// Which die of a two-die board (MI250X) this is; `Whole` for every other board.
    pub(super) die: Die,
    /// The even die's partner, whose power and energy its readings include.
    pub(super) partner: std::sync::OnceLock<std::sync::Weak<SimGpu>>,
    /// Counter reads so far (a backwards counter misreads every fifth).
    pub(super) counter_reads: std::sync::atomic::AtomicU64,
    /// On a virtual clock, whether a driver call moves the clock by what it costs (so that a
    /// test sees reads take time, as they do on the real clock).
    pub(super) virtual_call_time: std::sync::atomic::AtomicBool,
    /// Locally, the state; for a shared device, this process's copy of it.
    pub(super) state: Mutex<State>,
    /// `ZEUS_SIM_SHARED`: where the state really lives.
    pub(super) shared: Option<shared::SharedDevice>,
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in `[-1, 1)` fixed by `seed`.
fn unit_noise(seed: u64) -> f64 {
    let u = (splitmix64(seed) >> 11) as f64 / (1u64 << 53) as f64;
    2.0 * u - 1.0
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keep this thread busy for `seconds`, as a driver call that costs CPU time does.
fn spin(seconds: f64) {
    if seconds <= 0.0 {
        return;
    }
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

impl State {
    /// Recompute the busy steady state after a setting changed. Reads use the cached value, so
    /// the hot path (an energy or power read) does no curve interpolation.
    pub(super) fn refresh(&mut self, preset: &Preset) {
        let idle = preset.idle_power_mw as f64 / 1000.0;
        let gpu_lock = self
            .gpu_locked
            .map(|(_, max)| max as f64 / preset.max_graphics_clock_mhz as f64);
        let mem_cap = self.mem_locked.map_or(1.0, |(_, max)| {
            max as f64 / preset.memory_clocks_mhz[0] as f64
        });
        self.busy = self.curve.steady_state_locked(
            self.power_limit_mw as f64 / 1000.0,
            idle,
            gpu_lock,
            mem_cap,
        );
    }

    /// The fraction of the maximum graphics clock a busy, unlocked GPU runs at under the
    /// current power limit.
    pub(super) fn natural_clock(&self) -> f64 {
        self.curve
            .natural_clock(f64::from(self.power_limit_mw) / 1000.0)
    }

    pub(super) fn segment(&self) -> Segment {
        let load = match self.load {
            // Clamped here, at the limit of this stretch (every limit change starts a new one).
            // `max` first: it also turns a NaN into 0 W.
            Load::Drawing(w) => {
                Load::Drawing(w.max(0.0).min(f64::from(self.power_limit_mw) / 1000.0))
            }
            other => other,
        };
        Segment {
            t0: self.t_last,
            e0: self.energy_j,
            load,
            busy_w: self.busy.1,
        }
    }

    /// The stretch of time that holds `t` (the current one for `t >= t_last`).
    pub(super) fn segment_at(&self, t: f64) -> Segment {
        if t >= self.t_last {
            return self.segment();
        }
        self.past
            .iter()
            .rev()
            .find(|s| s.t0 <= t)
            .or_else(|| self.past.front())
            .copied()
            .unwrap_or_else(|| self.segment())
    }

    /// Energy (J) at any time up to now that the history still covers.
    pub(super) fn energy_at_past(&self, preset: &Preset, t: f64) -> f64 {
        let idle = preset.idle_power_mw as f64 / 1000.0;
        self.segment_at(t).energy_at(idle, t)
    }

    /// Power (W) at any time up to now that the history still covers.
    pub(super) fn power_at_past(&self, preset: &Preset, t: f64) -> f64 {
        let idle = preset.idle_power_mw as f64 / 1000.0;
        self.segment_at(t).power_at(idle, t)
    }

    pub(super) fn power_w(&self, preset: &Preset, busy: bool) -> f64 {
        if busy {
            self.busy.1
        } else {
            preset.idle_power_mw as f64 / 1000.0
        }
    }

    pub(super) fn seconds_per_unit(&self) -> f64 {
        self.busy.0
    }

    /// Energy at time `t >= t_last` without changing the state.
    pub(super) fn energy_at(&self, preset: &Preset, t: f64) -> f64 {
        let idle = preset.idle_power_mw as f64 / 1000.0;
        self.segment().energy_at(idle, t.max(self.t_last))
    }

    pub(super) fn is_busy_at(&self, preset: &Preset, t: f64) -> bool {
        let idle = preset.idle_power_mw as f64 / 1000.0;
        self.segment().is_busy_at(idle, t)
    }

    /// Power (W) at time `t >= t_last`.
    pub(super) fn power_at(&self, preset: &Preset, t: f64) -> f64 {
        let idle = preset.idle_power_mw as f64 / 1000.0;
        self.segment().power_at(idle, t.max(self.t_last))
    }

    /// Integrate up to `t`; call before any change that alters power. With `history` (seconds),
    /// the stretch that ends here is remembered for that long.
    pub(super) fn settle(&mut self, preset: &Preset, t: f64, history: Option<f64>) {
        if t <= self.t_last {
            return;
        }
        if let Some(span) = history {
            self.past.push_back(self.segment());
            let horizon = t - span;
            while self.past.len() >= 2 && self.past[1].t0 <= horizon {
                self.past.pop_front();
            }
        }
        self.energy_j = self.energy_at(preset, t);
        self.t_last = t;
        if let Load::BusyUntil(until) = self.load {
            if t >= until {
                self.load = Load::Idle;
            }
        }
    }
}

impl SimGpu {
    pub fn new(
        index: usize,
        preset: &'static Preset,
        clock: Arc<SimClock>,
        privileged: bool,
        workload: Option<&Workload>,
        load: Load,
        fidelity: Fidelity,
    ) -> SimGpu {
        let curve = match (workload, preset.default_workload) {
            (Some(w), _) => w.curve_for(preset),
            (None, Some(name)) => Workload::Builtin(name).curve_for(preset),
            (None, None) => WorkloadCurve::default_for(preset.max_power_limit_mw as f64 / 1000.0),
        };
        let t = clock.now();
        let h = splitmix64(index as u64 ^ 0x5a5a);
        let mut state = State {
            power_limit_mw: preset.default_power_limit_mw,
            persistence: false,
            gpu_locked: None,
            mem_locked: None,
            load,
            curve: Arc::new(curve),
            energy_j: 0.0,
            busy: (0.0, 0.0),
            t_last: t,
            past: VecDeque::new(),
            version: 0,
            curve_gen: 0,
        };
        state.refresh(preset);
        SimGpu {
            index,
            preset,
            uuid: format!(
                "GPU-5e1a7ed0-{:04x}-{:04x}-{:04x}-{:012x}",
                index,
                (h >> 48) & 0xffff,
                (h >> 32) & 0xffff,
                h & 0xffff_ffff_ffff
            ),
            privileged,
            clock,
            fidelity,
            energy_read_cost_s: preset.energy_read_cost_s,
            board: Board::of(preset),
            tick_phase: 0.0,
            counter_phase: 0.0,
            faults: Mutex::new(Vec::new()),
            resets: Mutex::new(Vec::new()),
            frozen: Mutex::new(None),
            die: Die::Whole,
            partner: std::sync::OnceLock::new(),
            counter_reads: std::sync::atomic::AtomicU64::new(0),
            virtual_call_time: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(state),
            shared: None,
        }
        .with_board(Board::of(preset))
    }

    /// This device with `board`'s timing (phases drawn per device from its index).
    pub fn with_board(mut self, board: Board) -> SimGpu {
        let draw = |salt: u64| (unit_noise(self.index as u64 ^ salt) + 1.0) / 2.0;
        self.tick_phase = draw(0x7e1c_0000) * board.power_period_s;
        self.counter_phase = if board.counter_on_power_grid() {
            self.tick_phase
        } else {
            draw(0xc0_0e7e_0000) * board.counter_period_s
        };
        self.board = board;
        self
    }

    /// Apply `knobs` to this device: its board, and the counter resets and faults they schedule
    /// (in seconds from now).
    pub(super) fn with_knobs(self, knobs: &BoardKnobs) -> SimGpu {
        let board = knobs.board_for(self.preset);
        let g = self.with_board(board);
        let now = g.clock.now();
        for f in knobs
            .faults
            .iter()
            .filter(|f| f.gpu.is_none_or(|i| i == g.index))
        {
            g.inject_fault(Fault {
                from: now + f.from,
                until: now + f.until,
                ..f.clone()
            });
        }
        for t in &knobs.counter_resets_s {
            lock(&g.resets).push((now + t, None));
        }
        g
    }

    /// The board's timing and quirks.
    pub fn board(&self) -> &Board {
        &self.board
    }

    /// Where in its period the power readings update, and the counter (s), for tests that
    /// check the sampler's calibration against the truth.
    pub fn phases(&self) -> (f64, f64) {
        (self.tick_phase, self.counter_phase)
    }

    /// Make the calls `fault.calls` fail with `fault.code` from `fault.from` to `fault.until` (on
    /// this device's clock).
    pub fn inject_fault(&self, fault: Fault) {
        let mut f = lock(&self.faults);
        let now = self.clock.now();
        f.retain(|x| x.until > now);
        f.push(fault);
    }

    /// Fail with the scheduled error if a fault covers `call` now.
    pub(super) fn check_fault(&self, bits: u32, call: &str) -> GpuResult<()> {
        let f = lock(&self.faults);
        if f.is_empty() {
            return Ok(());
        }
        let now = self.clock.now();
        match f
            .iter()
            .find(|x| x.calls & bits != 0 && x.from <= now && now < x.until)
        {
            Some(x) => Err(x.error(call)),
            None => Ok(()),
        }
    }

    /// Reset the energy counter to 0 now (as a driver reload does).
    pub fn reset_counter(&self) {
        let now = self.clock.now();
        let e = self.true_energy_j();
        lock(&self.resets).push((now, Some(e)));
    }

    /// Stop the energy counter where it stands: every later read returns the value of now.
    pub fn freeze_counter(&self) {
        let reading = self.counter_joules(self.clock.now(), false);
        *lock(&self.frozen) = Some(reading);
    }

    /// AMD GPUs have no persistence mode (what the AMD backend says of real ones).
    fn no_persistence_on_amd(&self) -> GpuResult<()> {
        if self.preset.vendor == Vendor::Amd {
            return Err(GpuError::NotSupported(
                "persistence mode: AMD GPUs have none".into(),
            ));
        }
        Ok(())
    }

    /// The locked graphics and memory clock ranges (MHz, as the board clamped them), if any:
    /// the board's own, shared with every process of a shared device.
    pub fn locked_clocks(&self) -> (Option<ClockRange>, Option<ClockRange>) {
        let s = self.state();
        (s.gpu_locked, s.mem_locked)
    }

    /// Which die of its board this device is.
    pub fn die(&self) -> Die {
        self.die
    }

    /// The energy (J) the board's counter covers by `t`: this device's, plus its partner's on
    /// the even die of a two-die board, nothing on the odd die.
    fn package_energy_at_past(&self, s: &State, t: f64) -> f64 {
        match self.die {
            Die::Odd => 0.0,
            Die::Whole => s.energy_at_past(self.preset, t),
            Die::Even => {
                s.energy_at_past(self.preset, t)
                    + self.partner_state(|p, ps| ps.energy_at_past(p.preset, t))
            }
        }
    }

    /// The power (W) the board's readings cover at `t`, as [`Self::package_energy_at_past`].
    fn package_power_at_past(&self, s: &State, t: f64) -> f64 {
        match self.die {
            Die::Odd => 0.0,
            Die::Whole => s.power_at_past(self.preset, t),
            Die::Even => {
                s.power_at_past(self.preset, t)
                    + self.partner_state(|p, ps| ps.power_at_past(p.preset, t))
            }
        }
    }

    fn partner_state(&self, f: impl FnOnce(&SimGpu, &State) -> f64) -> f64 {
        match self.partner.get().and_then(std::sync::Weak::upgrade) {
            Some(p) => {
                let s = p.state();
                f(&p, &s)
            }
            None => 0.0,
        }
    }

    /// The energy (J) the counter had counted before its latest reset at or before `t` (0
    /// without one). Resets scheduled ahead learn their energy once their time has come.
    pub(super) fn reset_offset(&self, s: &State, t: f64) -> f64 {
        let mut r = lock(&self.resets);
        let mut latest: Option<(f64, f64)> = None;
        for (at, e) in r.iter_mut() {
            if *at > t {
                continue;
            }
            let e = *e.get_or_insert_with(|| s.energy_at_past(self.preset, *at));
            if latest.is_none_or(|(l, _)| *at >= l) {
                latest = Some((*at, e));
            }
        }
        latest.map_or(0.0, |(_, e)| e)
    }

    /// Whether this device's state is shared with other processes (`ZEUS_SIM_SHARED`).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    pub fn fidelity(&self) -> Fidelity {
        self.fidelity
    }

    pub(super) fn real(&self) -> bool {
        self.fidelity == Fidelity::Real
    }

    /// Real fidelity on the real clock: make the calling thread pay what the driver call costs.
    /// (On a virtual clock no time passes during a call, so spinning would only slow tests.)
    pub(super) fn pay(&self, seconds: f64) {
        if !self.real() {
            return;
        }
        if !self.clock.is_virtual() {
            spin(seconds);
        } else if self
            .virtual_call_time
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.clock.advance(seconds);
        }
    }

    /// On a virtual clock, make each driver call move the clock by what it costs at real
    /// fidelity (a counter read 3.5 ms on the H100), as time passes during a real call.
    pub fn set_virtual_call_time(&self, on: bool) {
        self.virtual_call_time
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The latest update of the power readings at or before `t`, and its number.
    pub(super) fn last_tick(&self, t: f64) -> (f64, i64) {
        let p = self.board.power_period_s;
        let k = ((t - self.tick_phase) / p).floor();
        (self.tick_phase + k * p, k as i64)
    }

    /// The latest update of the energy counter at or before `t`.
    pub(super) fn last_counter_update(&self, t: f64) -> f64 {
        let p = self.board.counter_period_s;
        self.counter_phase + ((t - self.counter_phase) / p).floor() * p
    }

    /// What the counter counts at `now` (J, unrounded): the energy at its last update that
    /// has been published, counted since the last reset, times the board's counter scale; and
    /// the time of that update. A `read` of a backwards counter may return an older value.
    pub(super) fn counter_joules(&self, now: f64, read: bool) -> (f64, f64) {
        if let Some(frozen) = *lock(&self.frozen) {
            return frozen;
        }
        let now = if read
            && self.board.counter_backwards
            && self
                .counter_reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                % 5
                == 4
        {
            now - board::BACKWARDS_BY_S
        } else {
            now
        };
        let (t, e) = if self.real() {
            let t = self.last_counter_update(now - self.board.counter_lag_s);
            let s = self.state();
            let e = self.package_energy_at_past(&s, t) - self.reset_offset(&s, t);
            (t, e)
        } else {
            let s = self.state();
            let e = if self.die == Die::Whole {
                s.energy_at(self.preset, now)
            } else {
                self.package_energy_at_past(&s, now.max(s.t_last))
            } - self.reset_offset(&s, now);
            (now, e)
        };
        (e.max(0.0) * self.board.counter_scale, t)
    }

    /// What the counter shows at `now`, in mJ in steps of its resolution, and the time of the
    /// update it shows.
    pub(super) fn counter_reading(&self, now: f64, read: bool) -> (u64, f64) {
        let (e, t) = self.counter_joules(now, read);
        let res = self.board.counter_resolution_mj.max(1);
        let mj = (e * 1000.0) as u64;
        (mj - mj % res, t)
    }

    /// A power reading and the moment it describes (the update it comes from at real fidelity,
    /// now at ideal): instant power, or the driver's average.
    pub fn power_reading(&self, instant: bool) -> GpuResult<(u32, f64)> {
        if instant && !self.board.instant_power {
            return Err(GpuError::NotSupported(
                "nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT): Not Supported".into(),
            ));
        }
        if !instant && !self.board.average_power {
            return Err(GpuError::NotSupported(
                "average power: Not Supported on this board".into(),
            ));
        }
        self.check_fault(board::calls::POWER, "nvmlDeviceGetPowerUsage")?;
        self.pay(self.preset.power_read_cost_s);
        let now = self.clock.now();
        let noise = self.board.power_noise;
        if self.real() {
            let (t, k) = self.last_tick(now);
            let s = self.state();
            let w = self.board.average_window_s;
            let p = if instant {
                // The power at the last update, with a little noise per update.
                self.package_power_at_past(&s, t) * (1.0 + noise * self.noise(k, 2))
            } else if w > 0.0 {
                // The trailing average published at the last update.
                (self.package_energy_at_past(&s, t) - self.package_energy_at_past(&s, t - w)) / w
                    * (1.0 + noise * self.noise(k, 1))
            } else {
                // Boards whose "average" is the instantaneous sample at the update.
                self.package_power_at_past(&s, t) * (1.0 + noise * self.noise(k, 1))
            };
            return Ok(((p.max(0.0) * 1000.0).round() as u32, t));
        }
        let true_w = match self.die {
            Die::Whole => self.true_power_w(),
            _ => {
                let s = self.state();
                self.package_power_at_past(&s, now.max(s.t_last))
            }
        };
        if instant {
            return Ok(((true_w * 1000.0).round() as u32, now));
        }
        // Piecewise constant over the driver's update period, with a little deterministic noise
        // per period, as real boards behave (and as update-period detection relies on).
        let period = self.board.power_period_s;
        let slot = (now / period).floor() as u64;
        let u = (splitmix64(slot ^ ((self.index as u64) << 56)) >> 11) as f64 / (1u64 << 53) as f64;
        let p = true_w * (1.0 + noise * (2.0 * u - 1.0));
        Ok(((p * 1000.0).round() as u32, now))
    }

    /// The energy counter (mJ) and the moment its value was published (the update plus the
    /// counter's lag at real fidelity; now at ideal).
    pub fn energy_reading(&self) -> GpuResult<(u64, f64)> {
        if !self.preset.energy_counter {
            return Err(GpuError::NotSupported(
                "nvmlDeviceGetTotalEnergyConsumption: Not Supported (pre-Volta GPU)".into(),
            ));
        }
        self.check_fault(board::calls::ENERGY, "nvmlDeviceGetTotalEnergyConsumption")?;
        self.pay(self.energy_read_cost_s);
        let now = self.clock.now();
        let (mj, t) = self.counter_reading(now, true);
        let published = if self.real() {
            t + self.board.counter_lag_s
        } else {
            now
        };
        Ok((mj, published))
    }

    /// The energy counter in the board's own unit (`Preset::counter_unit_uj`: amdsmi's
    /// accumulator counts 15.3 µJ steps) and the moment its value was published.
    pub fn energy_counter_ticks(&self) -> GpuResult<(u64, f64)> {
        if !self.preset.energy_counter {
            return Err(GpuError::NotSupported(
                "energy counter: Not Supported on this board".into(),
            ));
        }
        self.check_fault(board::calls::ENERGY, "amdsmi_get_energy_count")?;
        self.pay(self.energy_read_cost_s);
        let now = self.clock.now();
        let (e, t) = self.counter_joules(now, true);
        let published = if self.real() {
            t + self.board.counter_lag_s
        } else {
            now
        };
        Ok(((e * 1e6 / self.preset.counter_unit_uj) as u64, published))
    }

    /// Reading noise of update `k` of this device, `[-1, 1)`, different per reading `kind`.
    pub(super) fn noise(&self, k: i64, kind: u64) -> f64 {
        unit_noise((k as u64) ^ ((self.index as u64) << 48) ^ (kind << 40))
    }

    pub fn preset(&self) -> &'static Preset {
        self.preset
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// The state, up to date (a shared device copies the file's state when another write
    /// happened since this process last looked).
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated in a way that
        // matters (every update is a handful of plain assignments), so keep going.
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sh) = &self.shared {
            sh.sync(&mut s);
        }
        s
    }

    /// Read-modify-write the state at the current time: integrate up to now, then apply `f`
    /// (given the time). A shared device does it under the file's exclusive lock, reading the
    /// clock only once it holds the lock so that writers' times never go backwards.
    pub(super) fn write<R>(&self, f: impl FnOnce(&mut State, f64) -> R) -> R {
        // Shared devices always keep history: another process may read at real fidelity.
        let keep_history =
            (self.real() || self.shared.is_some()).then(|| self.board.history_span());
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let step = |s: &mut State| {
            let now = self.clock.now();
            s.settle(self.preset, now, keep_history);
            f(s, now)
        };
        match &self.shared {
            Some(sh) => sh.write(&mut s, step),
            None => step(&mut s),
        }
    }

    pub(super) fn check_privileged(&self, what: &str) -> GpuResult<()> {
        if self.privileged {
            Ok(())
        } else {
            Err(GpuError::NoPermission(format!(
                "{what}: Insufficient Permissions (simulated GPU {} runs unprivileged: ZEUS_SIM_PRIVILEGED=0)",
                self.index
            )))
        }
    }

    /// Change state at the current time: integrate first, then apply `f`.
    pub(super) fn mutate<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.write(|s, _| {
            let r = f(s);
            s.refresh(self.preset);
            r
        })
    }

    /// Set the load (idle, busy, busy until a time, or a set power draw).
    pub fn set_load(&self, load: Load) {
        self.mutate(|s| s.load = load);
    }

    /// Draw `watts` from now on until the load changes ([`Load::Drawing`]: clamped to the power
    /// limit). A negative or non-finite `watts` is refused with [`GpuError::InvalidArg`].
    pub fn set_power_draw(&self, watts: f64) -> GpuResult<()> {
        if !(watts.is_finite() && watts >= 0.0) {
            return Err(GpuError::InvalidArg(format!(
                "power draw {watts} W is not valid: use a finite number of watts >= 0"
            )));
        }
        self.set_load(Load::Drawing(watts));
        Ok(())
    }

    /// The load now: a busy stretch that ended reads as idle; a set power draw reads as the
    /// watts asked for (even where the limit clamps it, or it is no more than idle power).
    pub fn load(&self) -> Load {
        let now = self.clock.now();
        let s = self.state();
        match s.load {
            Load::Drawing(w) => Load::Drawing(w),
            load if s.is_busy_at(self.preset, now) => load,
            _ => Load::Idle,
        }
    }

    /// Whether the board is busy now (what utilisation and clocks follow at ideal fidelity).
    pub fn is_busy(&self) -> bool {
        let now = self.clock.now();
        self.state().is_busy_at(self.preset, now)
    }

    /// Replace the workload curve. A shared device refuses a curve with more than
    /// [`shared::MAX_CURVE_POINTS`] points.
    pub fn set_curve(&self, curve: WorkloadCurve) -> GpuResult<()> {
        if self.shared.is_some() {
            shared::check_curve(&curve)?;
        }
        self.mutate(|s| {
            s.curve = Arc::new(curve);
            s.curve_gen += 1;
        });
        Ok(())
    }

    pub fn curve(&self) -> Arc<WorkloadCurve> {
        self.state().curve.clone()
    }

    /// Steady state at the current settings when busy: `(seconds per unit of work, watts)`.
    pub fn busy_steady_state(&self) -> (f64, f64) {
        let s = self.state();
        (s.seconds_per_unit(), s.power_w(self.preset, true))
    }

    /// Start `work` units of work now; returns how long they take at the current settings.
    pub fn start_work(&self, work: f64) -> f64 {
        self.write(|s, now| {
            let duration = work.max(0.0) * s.seconds_per_unit();
            s.load = Load::BusyUntil(now + duration);
            duration
        })
    }

    /// The exact energy integral up to `t`, joules, for a `t` the device still remembers (the
    /// last seconds at real fidelity; now otherwise).
    pub fn true_energy_at(&self, t: f64) -> f64 {
        self.state().energy_at_past(self.preset, t)
    }

    /// The exact energy integral so far, joules (the model's ground truth, unrounded).
    pub fn true_energy_j(&self) -> f64 {
        let now = self.clock.now();
        self.state().energy_at(self.preset, now)
    }

    /// The moment readings describe: the last driver update at real fidelity, now at ideal.
    pub(super) fn reading_time(&self) -> f64 {
        let now = self.clock.now();
        if self.real() {
            self.last_tick(now).0
        } else {
            now
        }
    }

    pub(super) fn reading_power_w(&self) -> f64 {
        let t = self.reading_time();
        self.state().power_at_past(self.preset, t)
    }

    pub(super) fn reading_busy(&self) -> bool {
        let t = self.reading_time();
        let idle = self.preset.idle_power_mw as f64 / 1000.0;
        self.state().segment_at(t).is_busy_at(idle, t)
    }

    /// The modelled power right now, watts, without reading noise.
    pub fn true_power_w(&self) -> f64 {
        let now = self.clock.now();
        self.state().power_at(self.preset, now)
    }

    /// Why the graphics clock is where it is (NVML's clock event reasons, the ones the model
    /// knows): idle, or held down by the power limit below both the maximum and a lock's top.
    pub fn clock_event_reasons(&self) -> u64 {
        if !self.reading_busy() {
            return CLOCK_EVENT_GPU_IDLE;
        }
        let s = self.state();
        let natural = s.natural_clock();
        let top = s.gpu_locked.map_or(1.0, |(_, hi)| {
            f64::from(hi) / f64::from(self.preset.max_graphics_clock_mhz)
        });
        if natural < top - 1e-9 {
            CLOCK_EVENT_SW_POWER_CAP
        } else {
            0
        }
    }
}

/// `nvmlClocksEventReasonGpuIdle`: nothing runs, so clocks are low.
pub const CLOCK_EVENT_GPU_IDLE: u64 = 0x1;
/// `nvmlClocksEventReasonSwPowerCap`: the clock is held down to keep power under the limit.
pub const CLOCK_EVENT_SW_POWER_CAP: u64 = 0x4;

impl Gpu for SimGpu {
    fn name(&self) -> GpuResult<String> {
        Ok(format!("{} (Simulated)", self.preset.name))
    }
    fn vendor(&self) -> Vendor {
        self.preset.vendor
    }
    fn uuid(&self) -> GpuResult<String> {
        Ok(self.uuid.clone())
    }
    fn architecture(&self) -> GpuResult<Architecture> {
        Ok(self.preset.architecture)
    }
    fn power_management_limit_constraints(&self) -> GpuResult<(u32, u32)> {
        self.check_fault(
            board::calls::OTHER,
            "nvmlDeviceGetPowerManagementLimitConstraints",
        )?;
        Ok((
            self.preset.min_power_limit_mw,
            self.preset.max_power_limit_mw,
        ))
    }
    fn power_management_limit_default(&self) -> GpuResult<u32> {
        self.check_fault(
            board::calls::OTHER,
            "nvmlDeviceGetPowerManagementDefaultLimit",
        )?;
        Ok(self.preset.default_power_limit_mw)
    }
    fn power_management_limit(&self) -> GpuResult<u32> {
        self.check_fault(board::calls::OTHER, "nvmlDeviceGetPowerManagementLimit")?;
        Ok(self.state().power_limit_mw)
    }
    fn set_power_management_limit(&self, milliwatts: u32) -> GpuResult<()> {
        self.check_fault(board::calls::WRITE, "nvmlDeviceSetPowerManagementLimit")?;
        self.check_privileged("nvmlDeviceSetPowerManagementLimit")?;
        let (min, max) = (
            self.preset.min_power_limit_mw,
            self.preset.max_power_limit_mw,
        );
        if milliwatts < min || milliwatts > max {
            return Err(GpuError::InvalidArg(format!(
                "power limit {milliwatts} mW is outside [{min}, {max}] mW"
            )));
        }
        self.mutate(|s| s.power_limit_mw = milliwatts);
        Ok(())
    }
    fn persistence_mode(&self) -> GpuResult<bool> {
        self.no_persistence_on_amd()?;
        self.check_fault(board::calls::OTHER, "nvmlDeviceGetPersistenceMode")?;
        Ok(self.state().persistence)
    }
    fn set_persistence_mode(&self, enabled: bool) -> GpuResult<()> {
        self.no_persistence_on_amd()?;
        self.check_fault(board::calls::WRITE, "nvmlDeviceSetPersistenceMode")?;
        self.check_privileged("nvmlDeviceSetPersistenceMode")?;
        self.mutate(|s| s.persistence = enabled);
        Ok(())
    }
    fn supported_memory_clocks(&self) -> GpuResult<Vec<u32>> {
        Ok(self.preset.memory_clocks_mhz.to_vec())
    }
    fn supported_graphics_clocks(&self, memory_clock_mhz: u32) -> GpuResult<Vec<u32>> {
        if !self.preset.memory_clocks_mhz.contains(&memory_clock_mhz) {
            return Err(GpuError::InvalidArg(format!(
                "memory clock {memory_clock_mhz} MHz is not supported (supported: {:?})",
                self.preset.memory_clocks_mhz
            )));
        }
        Ok(self.preset.graphics_clocks_mhz())
    }
    fn set_gpu_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        self.check_fault(board::calls::WRITE, "nvmlDeviceSetGpuLockedClocks")?;
        if self.preset.architecture < Architecture::Volta {
            return Err(GpuError::NotSupported(
                "nvmlDeviceSetGpuLockedClocks: Not Supported (needs Volta or newer)".into(),
            ));
        }
        self.check_privileged("nvmlDeviceSetGpuLockedClocks")?;
        if min_mhz > max_mhz {
            return Err(GpuError::InvalidArg(format!(
                "locked clock range is empty: {min_mhz} > {max_mhz} MHz"
            )));
        }
        let (lo, hi) = (
            self.preset.min_graphics_clock_mhz,
            self.preset.max_graphics_clock_mhz,
        );
        self.mutate(|s| s.gpu_locked = Some((min_mhz.clamp(lo, hi), max_mhz.clamp(lo, hi))));
        Ok(())
    }
    fn reset_gpu_locked_clocks(&self) -> GpuResult<()> {
        self.check_fault(board::calls::WRITE, "nvmlDeviceResetGpuLockedClocks")?;
        if self.preset.architecture < Architecture::Volta {
            return Err(GpuError::NotSupported(
                "nvmlDeviceResetGpuLockedClocks: Not Supported (needs Volta or newer)".into(),
            ));
        }
        self.check_privileged("nvmlDeviceResetGpuLockedClocks")?;
        self.mutate(|s| s.gpu_locked = None);
        Ok(())
    }
    fn set_memory_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        self.check_fault(board::calls::WRITE, "nvmlDeviceSetMemoryLockedClocks")?;
        if self.preset.architecture < Architecture::Ampere {
            return Err(GpuError::NotSupported(
                "nvmlDeviceSetMemoryLockedClocks: Not Supported (needs Ampere or newer)".into(),
            ));
        }
        self.check_privileged("nvmlDeviceSetMemoryLockedClocks")?;
        if min_mhz > max_mhz {
            return Err(GpuError::InvalidArg(format!(
                "locked memory clock range is empty: {min_mhz} > {max_mhz} MHz"
            )));
        }
        let clocks = self.preset.memory_clocks_mhz;
        let (lo, hi) = (*clocks.last().unwrap(), clocks[0]);
        self.mutate(|s| s.mem_locked = Some((min_mhz.clamp(lo, hi), max_mhz.clamp(lo, hi))));
        Ok(())
    }
    fn reset_memory_locked_clocks(&self) -> GpuResult<()> {
        self.check_fault(board::calls::WRITE, "nvmlDeviceResetMemoryLockedClocks")?;
        if self.preset.architecture < Architecture::Ampere {
            return Err(GpuError::NotSupported(
                "nvmlDeviceResetMemoryLockedClocks: Not Supported (needs Ampere or newer)".into(),
            ));
        }
        self.check_privileged("nvmlDeviceResetMemoryLockedClocks")?;
        self.mutate(|s| s.mem_locked = None);
        Ok(())
    }
    fn average_power_usage(&self) -> GpuResult<u32> {
        self.power_reading(false).map(|(mw, _)| mw)
    }
    fn instant_power_usage(&self) -> GpuResult<u32> {
        self.power_reading(true).map(|(mw, _)| mw)
    }
    fn power_sample(&self, instant: bool) -> GpuResult<PowerSample> {
        let (milliwatts, t) = self.power_reading(instant)?;
        Ok(PowerSample {
            milliwatts,
            timestamp: Some(match self.board.field_timestamps {
                FieldTimestamps::Update => t,
                FieldTimestamps::Call => self.clock.now(),
            }),
        })
    }
    fn supports_total_energy_consumption(&self) -> GpuResult<bool> {
        Ok(self.preset.energy_counter)
    }
    fn total_energy_consumption(&self) -> GpuResult<u64> {
        self.energy_reading().map(|(mj, _)| mj)
    }
    fn power_update_period(&self) -> Option<f64> {
        Some(self.board.power_period_s)
    }
    fn counter_lag(&self) -> Option<f64> {
        // What the AMD backend says of real boards; an NVIDIA board's lag is for the sampler to
        // measure, as it must on NVML.
        (self.preset.vendor == Vendor::Amd).then_some(self.board.counter_lag_s)
    }
    fn counter_is_exact(&self) -> Option<bool> {
        Some(self.fidelity == Fidelity::Ideal)
    }
    fn pci_bus_id(&self) -> GpuResult<String> {
        // One GPU per bus, from bus 0x01 on.
        Ok(format!("00000000:{:02X}:00.0", self.index + 1))
    }
    fn current_clocks_mhz(&self) -> GpuResult<(u32, u32)> {
        self.check_fault(board::calls::OTHER, "nvmlDeviceGetClockInfo")?;
        let busy = self.reading_busy();
        let (gpu_locked, mem_locked, natural) = {
            let s = self.state();
            (s.gpu_locked, s.mem_locked, s.natural_clock())
        };
        let p = self.preset;
        let graphics = if busy {
            // The clock the power limit lets it run at, at most a lock's maximum (the power
            // limit wins over a lock's minimum, as in the busy steady state's model); reported
            // as a supported clock, as the driver does.
            let want = natural * f64::from(p.max_graphics_clock_mhz);
            let want = gpu_locked.map_or(want, |(_, hi)| want.min(f64::from(hi)));
            let (max, step) = (
                f64::from(p.max_graphics_clock_mhz),
                f64::from(p.graphics_clock_step_mhz.max(1)),
            );
            // The supported clocks are max - k * step (`Preset::graphics_clocks_mhz`); a hair
            // of slack keeps an exact clock from rounding a step down.
            let steps_down = ((max - want) / step - 1e-9).ceil().max(0.0);
            ((max - steps_down * step).max(f64::from(p.min_graphics_clock_mhz))) as u32
        } else {
            // Idle clocks drop to the bottom of the range (a real H100 reads 345 MHz), or of
            // the locked range.
            gpu_locked.map_or(p.min_graphics_clock_mhz, |(lo, _)| lo)
        };
        let memory = mem_locked.map_or(p.memory_clocks_mhz[0], |(_, hi)| hi);
        Ok((graphics, memory))
    }
    fn temperature_c(&self) -> GpuResult<u32> {
        self.check_fault(board::calls::OTHER, "nvmlDeviceGetTemperature")?;
        // Steady state of the power drawn (no thermal mass): 30 °C idle to 80 °C at the
        // maximum limit.
        let p = self.reading_power_w();
        let idle = f64::from(self.preset.idle_power_mw) / 1000.0;
        let max = f64::from(self.preset.max_power_limit_mw) / 1000.0;
        let t = 30.0 + 50.0 * ((p - idle) / (max - idle)).clamp(0.0, 1.2);
        Ok(t.round() as u32)
    }
    fn memory_info(&self) -> GpuResult<MemoryInfo> {
        self.check_fault(board::calls::OTHER, "nvmlDeviceGetMemoryInfo")?;
        // A job holding 60% of memory while busy, the driver's 512 MiB otherwise.
        let total = self.preset.memory_mib << 20;
        let used = if self.reading_busy() {
            total / 10 * 6
        } else {
            512 << 20
        };
        Ok(MemoryInfo { total, used })
    }
    fn utilization_rates(&self) -> GpuResult<Utilization> {
        self.check_fault(board::calls::OTHER, "nvmlDeviceGetUtilizationRates")?;
        Ok(if self.reading_busy() {
            Utilization {
                gpu: 100,
                memory: 35,
            }
        } else {
            Utilization { gpu: 0, memory: 0 }
        })
    }
}
