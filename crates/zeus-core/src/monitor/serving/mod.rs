//! The serving energy ledger: energy per request and per token under continuous batching.
//!
//! A serving engine (or an adapter around one) reports each engine step: its measured energy
//! (a cut of a monitor window, so that consecutive steps add up to the whole) and the requests
//! in it with their work (prefill tokens, decode tokens, tokens held in the KV cache). The
//! ledger splits the energy among the requests by a declared [`Method`]:
//!
//! - [`Method::Time`]: equal shares of each step's measured energy;
//! - [`Method::Tokens`]: shares of the tokens each request processed in the step;
//! - [`Method::Work`]: a cost model fitted online ([`fit`]): the energy of a span of steps is
//!   spread over its steps by the model's prediction for each, and a step's energy over its
//!   requests by each one's modelled dynamic cost (prefill, decode, KV cache). Static power in
//!   a step goes to its requests in the same proportion.
//!
//! Energy of stretches with no request (idle, scheduling between steps) goes to an explicit
//! residual, never into the requests. Conservation is exact: the requests' energies plus the
//! residual plus what still waits for attribution equal the measured energy ([`Totals`]).
//!
//! Each request's bound adds, step by step, its share of the measurement's bound (from the
//! sampler, `docs/measurement-uncertainty.md`) and, with `work`, what the fitted weights'
//! standard errors and the model's misfit allow its share to move.

mod anchored;
mod background;
pub mod fit;
#[cfg(test)]
mod tests;
mod window;

use rustc_hash::FxHashMap;

pub use background::{Background, MeasuredInBackground, BACKGROUND_PERIOD};
pub use fit::{Features, Weights, WorkFit};
pub use window::{
    FromMonitor, Tail, WindowLedger, MARK_BATCH, MARK_CAP, MARK_MAX_AGE_S, MARK_OVERDUE_S,
};

use super::{MonitorError, MonitorResult};
use anchored::AnchoredFits;

/// What the measurement knows once it has settled, for the `work` fit (see [`Ledger::settle`]).
pub trait Settled {
    /// The energy (J) of `[t0, t1]` summed over the ledger's GPUs, once final (the sampler's
    /// estimate once the counter has updated past `t1`), with its bound (J); `None` if not
    /// yet.
    fn energy(&mut self, t0: f64, t1: f64) -> Option<(f64, f64)>;
    /// GPU `k`'s (in the ledger's order) counter updates after `after`, oldest first: the
    /// moment each value describes, the value (J, on one scale across counter resets), and how
    /// far off the moment may be (s). `None` where the GPU is not read through the sampler.
    fn anchors(&mut self, k: usize, after: f64) -> Option<Vec<(f64, f64, f64)>>;
    /// The energy of `[t0, t1]` as known now, settled or not (an edge past the last counter
    /// update extrapolated, with a bound that says so), with its bound (J); `None` without an
    /// estimate of the source's own. For a span that cannot wait to settle (a flush): its
    /// start is then the edge the settled span before it ended with, where its cuts' sum
    /// starts from that edge as extrapolated when the cut was taken, before the counter
    /// showed what the readings missed.
    fn estimate(&mut self, t0: f64, t1: f64) -> Option<(f64, f64)>;
}

/// Nothing settles: the fit takes the cuts' sums (exact cuts, or no sampler).
pub struct NothingSettled;

impl Settled for NothingSettled {
    fn energy(&mut self, _: f64, _: f64) -> Option<(f64, f64)> {
        None
    }
    fn anchors(&mut self, _: usize, _: f64) -> Option<Vec<(f64, f64, f64)>> {
        None
    }
    fn estimate(&mut self, _: f64, _: f64) -> Option<(f64, f64)> {
        None
    }
}

/// How a step's energy is split among its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Time,
    Tokens,
    Work,
}

impl Method {
    /// Parse a method name: `time`, `tokens` or `work`.
    pub fn parse(s: &str) -> MonitorResult<Method> {
        match s {
            "time" => Ok(Method::Time),
            "tokens" => Ok(Method::Tokens),
            "work" => Ok(Method::Work),
            _ => Err(MonitorError::InvalidArg(format!(
                "unknown attribution method '{s}': use 'time', 'tokens' or 'work'"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Method::Time => "time",
            Method::Tokens => "tokens",
            Method::Work => "work",
        }
    }
}

/// One request's work in one step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    /// Prompt tokens processed in the step (a whole prefill, or a chunk of one).
    pub prefill: f64,
    /// Tokens decoded in the step (1 per step in plain decoding; more with speculation).
    pub decode: f64,
    /// Tokens in the request's KV cache during the step (its context).
    pub kv: f64,
}

impl Work {
    fn check(&self, id: &str) -> MonitorResult<()> {
        for (name, v) in [
            ("prefill", self.prefill),
            ("decode", self.decode),
            ("kv", self.kv),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(MonitorError::InvalidArg(format!(
                    "request '{id}': {name} tokens must be a finite number >= 0, got {v}"
                )));
            }
        }
        Ok(())
    }
}

/// A measured stretch: its duration and each GPU's energy and bound (J), in the ledger's GPU
/// order.
#[derive(Debug, Clone, Copy)]
pub struct Cut<'a> {
    pub seconds: f64,
    pub energy: &'a [f64],
    pub bound: &'a [f64],
}

/// How the ledger runs.
#[derive(Debug, Clone, Copy)]
pub struct LedgerOptions {
    pub method: Method,
    /// `work`: the length of the spans the model is fitted on, s.
    pub span_s: f64,
    /// `work`: spans needed before the model's weights are used.
    pub min_spans: usize,
    /// `work`: how long (s) steps may wait for a first fit; past it they are split by tokens
    /// and their requests' records say `fitted: false`.
    pub max_wait_s: f64,
}

impl Default for LedgerOptions {
    fn default() -> LedgerOptions {
        LedgerOptions {
            method: Method::Work,
            span_s: 1.0,
            min_spans: 8,
            max_wait_s: 30.0,
        }
    }
}

/// A request's energy, once every step it ran in is attributed.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub id: String,
    /// The aggregate group (model and labels) the request was registered under.
    pub group: u32,
    pub arrival: f64,
    /// Start of the first step the request ran in (NaN if it never ran).
    pub first_step: f64,
    /// When it finished (the ledger's close for a request that never finished).
    pub finish: f64,
    pub finished: bool,
    pub energy_j: f64,
    pub bound_j: f64,
    pub prefill_energy_j: f64,
    pub decode_energy_j: f64,
    /// Per GPU of the ledger, J.
    pub gpu_energy_j: Vec<f64>,
    pub prefill_tokens: f64,
    pub decode_tokens: f64,
    /// Tokens generated: as the engine reported at finish, else decode tokens plus the one a
    /// completed prefill produces.
    pub output_tokens: f64,
    pub steps: u64,
    /// Mean number of requests in the steps this one ran in.
    pub mean_batch: f64,
    /// `work`: whether every step was split by fitted weights (false: some by tokens, while
    /// the model had too few spans).
    pub fitted: bool,
}

/// Energy totals of the ledger, J: `measured == requests + residual + pending` exactly (to
/// rounding).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub seconds: f64,
    pub measured_j: f64,
    /// Attributed to requests, finished or not.
    pub requests_j: f64,
    pub residual_j: f64,
    pub residual_bound_j: f64,
    /// Measured but not yet attributed (`work`: steps waiting for their span or the fit).
    pub pending_j: f64,
    pub steps: u64,
}

/// Per aggregate group: the finished requests' totals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GroupTotals {
    pub requests: u64,
    pub energy_j: f64,
    pub bound_j: f64,
    pub prefill_energy_j: f64,
    pub decode_energy_j: f64,
    pub prefill_tokens: f64,
    pub output_tokens: f64,
}

#[derive(Debug)]
struct Slot {
    id: String,
    group: u32,
    arrival: f64,
    first_step: f64,
    finish: Option<(f64, Option<f64>)>,
    live: bool,
    /// Which opening of a slot this is (`Ledger::opens` when it opened): a slot is reused.
    opened: u64,
    /// Steps of this request measured but not yet attributed.
    pending: u32,
    /// The last step (sequence number) that named it: a step names a request once.
    last_step: u64,
    energy: f64,
    bound: f64,
    prefill_energy: f64,
    gpu: Vec<f64>,
    prefill_tokens: f64,
    decode_tokens: f64,
    steps: u64,
    batch_sum: f64,
    fitted: bool,
    /// `work`: the sum over its modelled steps of the step's energy times its share's
    /// sensitivity to each weight (J per unit of weight).
    sensitivity: [f64; fit::TERMS],
    /// `work`: its energy from modelled steps, and those steps' whole energy (J).
    modelled_energy: f64,
    steps_energy: f64,
}

impl Slot {
    /// Add to the bound what the weights `m` the request's modelled steps were split by
    /// allow (see `Ledger::attribute`): their uncertainty and the model's misfit, never more
    /// than the whole energy of those steps; and start afresh for the next weights.
    fn close_model_bound(&mut self, m: &Weights) {
        if self.modelled_energy > 0.0 {
            let moved = (m.reach() * m.spread(&self.sensitivity)).min(self.steps_energy);
            self.bound += moved + 2.0 * m.rms_rel * self.modelled_energy;
        }
        self.sensitivity = [0.0; fit::TERMS];
        self.modelled_energy = 0.0;
        self.steps_energy = 0.0;
    }
}

/// A measured interval waiting for attribution (`work`).
#[derive(Debug, Clone)]
struct Pending {
    features: Features,
    /// Range of its requests in `Ledger::pending_work`.
    work: (usize, usize),
    /// Its energy, J: the total of its GPUs (each GPU's in `pending_gpu`).
    energy: f64,
}

/// A closed span waiting to be fitted: when it ran, what it did, the energy its cuts measured.
#[derive(Debug, Clone, Copy)]
struct Unfitted {
    t0: f64,
    t1: f64,
    features: Features,
    measured: f64,
}

/// How long after a span ends its energy is asked for again, settled (s): a GPU's counter
/// updates every ~100 ms and publishes ~15-80 ms late, so by then the sampler has read the
/// value after the span's end, and interpolates the edge instead of extrapolating it.
pub const SETTLE_AFTER_S: f64 = 0.3;
/// How often the `work` model is solved again once it has weights (s).
pub const REFIT_S: f64 = 1.0;
/// How long a span waits for a settled value before the fit takes its cuts' sum (s).
pub const SETTLE_GIVE_UP_S: f64 = 2.0;

/// A closed span of pending intervals `first..last` (indices into `Ledger::pending`).
#[derive(Debug, Clone)]
struct Span {
    first: usize,
    last: usize,
    /// When it began and ended.
    t0: f64,
    t1: f64,
    features: Features,
    energy_gpu: Vec<f64>,
    bound: f64,
}

/// The ledger. See the module docs.
#[derive(Debug)]
pub struct Ledger {
    opts: LedgerOptions,
    n_gpus: usize,
    slots: Vec<Slot>,
    free: Vec<u32>,
    ids: FxHashMap<String, u32>,
    groups: Vec<(String, GroupTotals)>,
    step_seq: u64,
    now: f64,
    totals: Totals,
    ready: Vec<RequestRecord>,
    // `work`: what waits for its span to close or for the first fit.
    pending: Vec<Pending>,
    pending_gpu: Vec<f64>,
    pending_bound: Vec<f64>,
    pending_work: Vec<(u32, Work)>,
    spans: Vec<Span>,
    /// Index in `pending` where the open span starts, and its length so far (s).
    span_start: usize,
    span_seconds: f64,
    /// When the open span began.
    span_t0: f64,
    unfitted: std::collections::VecDeque<Unfitted>,
    fit: WorkFit,
    anchored: AnchoredFits,
    /// When the model was last solved.
    refit_at: f64,
    weights: Option<Weights>,
    /// Slots opened so far.
    opens: u64,
}

impl Ledger {
    /// A ledger over `n_gpus` GPUs whose clock reads `now` (s).
    pub fn new(n_gpus: usize, now: f64, opts: LedgerOptions) -> MonitorResult<Ledger> {
        if n_gpus == 0 {
            return Err(MonitorError::InvalidArg(
                "a serving ledger needs at least one GPU".into(),
            ));
        }
        if !(opts.span_s.is_finite() && opts.span_s > 0.0) {
            return Err(MonitorError::InvalidArg(format!(
                "span_s must be a positive number of seconds, got {}",
                opts.span_s
            )));
        }
        if !(opts.max_wait_s.is_finite() && opts.max_wait_s >= 0.0) {
            return Err(MonitorError::InvalidArg(format!(
                "max_wait_s must be a number of seconds >= 0, got {}",
                opts.max_wait_s
            )));
        }
        Ok(Ledger {
            opts,
            n_gpus,
            slots: Vec::new(),
            free: Vec::new(),
            ids: FxHashMap::default(),
            groups: vec![(String::new(), GroupTotals::default())],
            step_seq: 0,
            now,
            totals: Totals::default(),
            ready: Vec::new(),
            pending: Vec::new(),
            pending_gpu: Vec::new(),
            pending_bound: Vec::new(),
            pending_work: Vec::new(),
            spans: Vec::new(),
            span_start: 0,
            span_seconds: 0.0,
            span_t0: now,
            unfitted: std::collections::VecDeque::new(),
            fit: WorkFit::default(),
            anchored: AnchoredFits::new(n_gpus),
            refit_at: f64::NEG_INFINITY,
            weights: None,
            opens: 0,
        })
    }

    pub fn method(&self) -> Method {
        self.opts.method
    }

    pub fn n_gpus(&self) -> usize {
        self.n_gpus
    }

    /// The aggregate group named `name` (created on first use; group 0 is `""`).
    pub fn group(&mut self, name: &str) -> u32 {
        if let Some(k) = self.groups.iter().position(|(n, _)| n == name) {
            return k as u32;
        }
        self.groups.push((name.to_owned(), GroupTotals::default()));
        (self.groups.len() - 1) as u32
    }

    /// Every group's name and totals.
    pub fn groups(&self) -> &[(String, GroupTotals)] {
        &self.groups
    }

    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The `work` model's current weights (`None` before the first fit, and for other
    /// methods).
    pub fn weights(&self) -> Option<Weights> {
        self.weights
    }

    /// Requests arrived and not yet reported.
    /// The end of the last step or gap (s).
    pub fn now(&self) -> f64 {
        self.now
    }

    pub fn open_requests(&self) -> usize {
        self.ids.len()
    }

    /// Register request `id` arriving at `at`, in `group`.
    ///
    /// # Errors
    /// `id` already open, or an unknown group.
    pub fn arrive(&mut self, id: &str, group: u32, at: f64) -> MonitorResult<()> {
        if self.ids.contains_key(id) {
            return Err(MonitorError::InvalidArg(format!(
                "request '{id}' has already arrived"
            )));
        }
        if group as usize >= self.groups.len() {
            return Err(MonitorError::InvalidArg(format!("unknown group {group}")));
        }
        self.open_slot(id, group, at);
        Ok(())
    }

    fn open_slot(&mut self, id: &str, group: u32, at: f64) -> u32 {
        let slot = Slot {
            id: id.to_owned(),
            group,
            arrival: at,
            first_step: f64::NAN,
            finish: None,
            live: true,
            opened: self.opens,
            pending: 0,
            last_step: u64::MAX,
            energy: 0.0,
            bound: 0.0,
            prefill_energy: 0.0,
            gpu: if self.n_gpus > 1 {
                vec![0.0; self.n_gpus]
            } else {
                Vec::new()
            },
            prefill_tokens: 0.0,
            decode_tokens: 0.0,
            steps: 0,
            batch_sum: 0.0,
            fitted: true,
            sensitivity: [0.0; fit::TERMS],
            modelled_energy: 0.0,
            steps_energy: 0.0,
        };
        let k = match self.free.pop() {
            Some(k) => {
                self.slots[k as usize] = slot;
                k
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.ids.insert(id.to_owned(), k);
        self.opens += 1;
        k
    }

    /// Which opening of slot `k` holds an open request (`None`: none does). While it returns
    /// the same value, the slot holds the same request: a caller that remembers a request's
    /// slot with this value can skip looking its id up (`slot`).
    pub fn open_slot_serial(&self, k: u32) -> Option<u64> {
        self.slots
            .get(k as usize)
            .filter(|s| s.live && s.finish.is_none())
            .map(|s| s.opened)
    }

    /// The slot of open request `id`, registering it (arrival now, group 0) if unknown.
    pub fn slot(&mut self, id: &str) -> u32 {
        self.slot_arriving(id, self.now)
    }

    /// [`Ledger::slot`], registering an unknown request as arriving at `at` (at the latest:
    /// a request arrived before the first step that names it began).
    pub fn slot_arriving(&mut self, id: &str, at: f64) -> u32 {
        match self.ids.get(id) {
            Some(&k) => k,
            None => self.open_slot(id, 0, at),
        }
    }

    /// The slot of request `id` if it is open: arrived or named by a step, and not finished.
    pub fn slot_of(&self, id: &str) -> Option<u32> {
        self.ids.get(id).copied()
    }

    /// Request `id` finished at `at`, having generated `output_tokens` (None: counted from its
    /// steps). Its record is ready once its steps are attributed.
    ///
    /// # Errors
    /// An unknown or already finished request.
    pub fn finish(&mut self, id: &str, at: f64, output_tokens: Option<f64>) -> MonitorResult<()> {
        let k = self.check_finish(id, output_tokens)?;
        let s = &mut self.slots[k as usize];
        s.finish = Some((at, output_tokens));
        self.ids.remove(id);
        if self.slots[k as usize].pending == 0 {
            self.emit(k);
        }
        Ok(())
    }

    /// Check [`Ledger::finish`]'s arguments, changing nothing; the request's slot.
    ///
    /// # Errors
    /// As [`Ledger::finish`].
    pub fn check_finish(&self, id: &str, output_tokens: Option<f64>) -> MonitorResult<u32> {
        let Some(&k) = self.ids.get(id) else {
            return Err(MonitorError::InvalidArg(format!(
                "request '{id}' is not open (never arrived, or already finished)"
            )));
        };
        if let Some(n) = output_tokens {
            if !(n.is_finite() && n >= 0.0) {
                return Err(MonitorError::InvalidArg(format!(
                    "request '{id}': output_tokens must be >= 0, got {n}"
                )));
            }
        }
        Ok(k)
    }

    /// A stretch with no request in it (idle, or the engine scheduling between steps), ending
    /// at `end`: its energy goes to the residual.
    ///
    /// # Errors
    /// A cut with the wrong number of GPUs or a bad value.
    pub fn gap(&mut self, cut: Cut<'_>, end: f64) -> MonitorResult<()> {
        self.step_slots(cut, end, &[])
    }

    /// An engine step ending at `end`, measured by `cut`, with its requests by id.
    ///
    /// # Errors
    /// As [`Ledger::step_slots`]; a finished request named in the step.
    pub fn step(&mut self, cut: Cut<'_>, end: f64, work: &[(&str, Work)]) -> MonitorResult<()> {
        let mut slots = Vec::with_capacity(work.len());
        for (id, w) in work {
            w.check(id)?;
            slots.push((self.slot(id), *w));
        }
        self.step_slots(cut, end, &slots)
    }

    /// An engine step ending at `end`, measured by `cut`, with its requests by slot
    /// ([`Ledger::slot`]). Nothing changes on an error.
    ///
    /// # Errors
    /// A cut with the wrong number of GPUs or a non-finite or negative value, a request named
    /// twice, a slot that is not open, bad work.
    pub fn step_slots(
        &mut self,
        cut: Cut<'_>,
        end: f64,
        work: &[(u32, Work)],
    ) -> MonitorResult<()> {
        self.check_cut(&cut)?;
        let seq = self.step_seq;
        if let Err(e) = self.stamp(work, seq) {
            self.unstamp(work, seq);
            return Err(e);
        }
        self.step_seq += 1;
        let start = end - cut.seconds;
        let total: f64 = cut.energy.iter().sum();
        let bound: f64 = cut.bound.iter().sum();
        self.totals.seconds += cut.seconds;
        self.totals.measured_j += total;
        self.totals.steps += u64::from(!work.is_empty());
        self.now = end;
        for (k, _) in work {
            let s = &mut self.slots[*k as usize];
            if s.first_step.is_nan() {
                s.first_step = start;
                // A request first named by this step arrived when it began, at the latest.
                s.arrival = s.arrival.min(start);
            }
        }
        match self.opts.method {
            Method::Time | Method::Tokens => {
                if work.is_empty() {
                    self.totals.residual_j += total;
                    self.totals.residual_bound_j += bound;
                } else {
                    self.attribute(work, cut.seconds, total, cut.energy, bound, None);
                }
            }
            Method::Work => self.pend(cut, work),
        }
        Ok(())
    }

    /// Check a step's requests as [`Ledger::step_slots`] does, changing nothing: for a step
    /// measured later (its cut taken after the fact), refused when it is reported.
    ///
    /// # Errors
    /// As [`Ledger::step_slots`], but for the cut.
    pub fn check_step(&mut self, work: &[(u32, Work)]) -> MonitorResult<()> {
        let seq = self.step_seq;
        let checked = self.stamp(work, seq);
        self.unstamp(work, seq);
        checked
    }

    /// Mark each of a step's requests as named by step `seq`, checking that each is open,
    /// unfinished, named once and has valid work; stops at the first that is not.
    fn stamp(&mut self, work: &[(u32, Work)], seq: u64) -> MonitorResult<()> {
        for (k, w) in work {
            let Some(s) = self.slots.get_mut(*k as usize).filter(|s| s.live) else {
                return Err(MonitorError::InvalidArg(format!(
                    "request slot {k} is not open"
                )));
            };
            if s.finish.is_some() {
                return Err(MonitorError::InvalidArg(format!(
                    "request '{}' has finished: it cannot run in a later step",
                    s.id
                )));
            }
            w.check(&s.id)?;
            if s.last_step == seq {
                return Err(MonitorError::InvalidArg(format!(
                    "request '{}' appears twice in one step",
                    s.id
                )));
            }
            s.last_step = seq;
        }
        Ok(())
    }

    /// Undo [`Ledger::stamp`]'s marks for step `seq`.
    fn unstamp(&mut self, work: &[(u32, Work)], seq: u64) {
        for (k, _) in work {
            if let Some(s) = self.slots.get_mut(*k as usize) {
                if s.last_step == seq {
                    s.last_step = u64::MAX - 1;
                }
            }
        }
    }

    fn check_cut(&self, cut: &Cut<'_>) -> MonitorResult<()> {
        if cut.energy.len() != self.n_gpus || cut.bound.len() != self.n_gpus {
            return Err(MonitorError::InvalidArg(format!(
                "a cut of {} GPUs for a ledger over {}",
                cut.energy.len(),
                self.n_gpus
            )));
        }
        let bad = |v: f64| !(v.is_finite() && v >= 0.0);
        if bad(cut.seconds) {
            return Err(MonitorError::InvalidArg(format!(
                "a step's duration must be >= 0 s, got {}",
                cut.seconds
            )));
        }
        if let Some(v) = cut.energy.iter().find(|&&v| bad(v)) {
            return Err(MonitorError::InvalidArg(format!(
                "a step's energy must be finite and >= 0, got {v}"
            )));
        }
        // An infinite bound is a measurement that knows nothing (a GPU whose readings failed
        // through the step): the requests' bounds say so.
        if let Some(v) = cut.bound.iter().find(|&&v| v.is_nan() || v < 0.0) {
            return Err(MonitorError::InvalidArg(format!(
                "a step's bound must be >= 0, got {v}"
            )));
        }
        Ok(())
    }

    /// Split `total` J (`gpu`: per GPU) of a step among `work`'s requests; `weights` for
    /// `work` (None: by the method's own rule, or by tokens for `work` before a fit).
    fn attribute(
        &mut self,
        work: &[(u32, Work)],
        seconds: f64,
        total: f64,
        gpu: &[f64],
        bound: f64,
        weights: Option<&Weights>,
    ) {
        let n = work.len() as f64;
        let method = self.opts.method;
        let fitted = method != Method::Work || weights.is_some();
        // Each request's terms in the step: its equal part of the step's time (static power
        // holds for everyone in the step alike), its prefill and decode tokens, its KV-cache
        // token-seconds. The rule charges each term: `time` the time alone (equal shares),
        // `tokens` the tokens, `work` the model's weights.
        let rule: [f64; fit::TERMS] = match (method, weights) {
            (Method::Time, _) => [1.0, 0.0, 0.0, 0.0],
            (_, Some(m)) => m.as_array(),
            _ => [0.0, 1.0, 1.0, 0.0],
        };
        let per_request_s = seconds / n;
        let terms = |w: &Work| [per_request_s, w.prefill, w.decode, w.kv * seconds];
        let mut sums = [0.0f64; fit::TERMS];
        for (_, w) in work {
            let x = terms(w);
            for j in 0..fit::TERMS {
                sums[j] += x[j];
            }
        }
        let sum: f64 = (0..fit::TERMS).map(|j| rule[j] * sums[j]).sum();
        // A step whose requests cost nothing by the rule (no tokens): equal shares.
        let equal = sum <= 0.0;
        let inv_sum = if equal { 0.0 } else { 1.0 / sum };
        let modelled = weights.is_some() && !equal;
        let unfitted = !fitted;
        let n_gpus = gpu.len();
        let mut attributed = 0.0;
        let last = work.len().saturating_sub(1);
        for (i, (k, w)) in work.iter().enumerate() {
            let x = terms(w);
            let share = if equal {
                1.0 / n
            } else {
                (rule[0] * x[0] + rule[1] * x[1] + rule[2] * x[2] + rule[3] * x[3]) * inv_sum
            };
            // Prefill's part of the request's energy, by its work (the static part follows it);
            // by its tokens where the rule charges no work.
            let dynamic = rule[1] * x[1] + rule[2] * x[2] + rule[3] * x[3];
            let prefill_part = if dynamic > 0.0 {
                rule[1] * x[1] / dynamic
            } else if w.prefill + w.decode > 0.0 {
                w.prefill / (w.prefill + w.decode)
            } else {
                0.0
            };
            // The last request takes what rounding left, so that the step adds up exactly.
            let e = if i == last {
                total - attributed
            } else {
                total * share
            };
            attributed += e;
            // (0 × an infinite bound is no uncertainty, not NaN.)
            let mut b = if share > 0.0 { bound * share } else { 0.0 };
            if unfitted {
                b += e; // split by tokens, not by a model: anything goes
            }
            let s = &mut self.slots[*k as usize];
            if modelled {
                // The share's sensitivity to the weights (d share / d weight_k =
                // (x_k - share · X_k) / sum), times the step's energy, summed over the
                // request's steps: one weight error moves every step's share at once, so the
                // request's error is that sum against the weights' covariance, taken when its
                // record is made (`emit`).
                let scale = total * inv_sum;
                for j in 0..fit::TERMS {
                    s.sensitivity[j] += scale * (x[j] - share * sums[j]);
                }
                s.modelled_energy += e;
                s.steps_energy += total;
            } else if weights.is_some() {
                s.modelled_energy += e;
                s.steps_energy += total;
            }
            s.energy += e;
            s.bound += b;
            s.prefill_energy += e * prefill_part;
            // One GPU's split is the energy itself (filled in by `emit`): no second
            // allocation to touch per request and step.
            if n_gpus > 1 {
                for (acc, g) in s.gpu.iter_mut().zip(gpu) {
                    *acc += g * share;
                }
            }
            s.prefill_tokens += w.prefill;
            s.decode_tokens += w.decode;
            s.steps += 1;
            s.batch_sum += n;
            s.fitted &= fitted;
        }
        self.totals.requests_j += total;
    }

    /// `work`: keep the step until its span closes and the model is fitted.
    fn pend(&mut self, cut: Cut<'_>, work: &[(u32, Work)]) {
        let mut f = Features {
            seconds: cut.seconds,
            ..Features::default()
        };
        let from = self.pending_work.len();
        for (k, w) in work {
            f.prefill_tokens += w.prefill;
            f.decode_tokens += w.decode;
            f.kv_token_seconds += w.kv * cut.seconds;
            self.slots[*k as usize].pending += 1;
        }
        self.pending_work.extend_from_slice(work);
        self.anchored.record(self.now - cut.seconds, self.now, f);
        let energy: f64 = cut.energy.iter().sum();
        self.pending.push(Pending {
            features: f,
            work: (from, self.pending_work.len()),
            energy,
        });
        self.pending_gpu.extend_from_slice(cut.energy);
        self.pending_bound.push(cut.bound.iter().sum());
        self.totals.pending_j += energy;
        self.span_seconds += cut.seconds;
        if self.span_seconds >= self.opts.span_s {
            // Attributed by `settle`, once its energy has settled.
            self.close_span();
        }
    }

    /// `work`: fit what has settled; cheap when nothing has (call it after every step).
    ///
    /// Each GPU's model is fitted on spans between its counter's updates
    /// ([`Settled::anchors`], see `anchored.rs`), where the energy is known to the counter's
    /// resolution; the engine's model is their sum once every GPU has `min_spans` spans. Until
    /// then (and for good where a GPU is not read through the sampler) the model is fitted on
    /// the ledger's own spans, with their energy once settled ([`Settled::energy`]: asked
    /// [`SETTLE_AFTER_S`] after a span ends, its cuts' sum after [`SETTLE_GIVE_UP_S`]).
    /// Attribution does not change: steps keep the energy their cuts measured, so conservation
    /// is untouched.
    pub fn settle(&mut self, src: &mut dyn Settled) {
        if self.opts.method != Method::Work {
            return;
        }
        let mut refit = false;
        while let Some(u) = self.unfitted.front().copied() {
            if self.now < u.t1 + SETTLE_AFTER_S {
                break;
            }
            let energy = match src.energy(u.t0, u.t1) {
                Some((e, _)) if e.is_finite() && e >= 0.0 => e,
                _ if self.now >= u.t1 + SETTLE_GIVE_UP_S => u.measured,
                _ => break,
            };
            self.fit.add(&u.features, energy);
            self.unfitted.pop_front();
            refit = true;
        }
        for k in 0..self.n_gpus {
            let after = self.anchored.after(k);
            if let Some(anchors) = src.anchors(k, after) {
                refit |= self.anchored.add_anchors(k, &anchors);
            }
        }
        // Weights move slowly once fitted: solve again at most every REFIT_S (a solve is tens
        // of microseconds; steps come every 20-40 ms).
        if refit && (self.weights.is_none() || self.now - self.refit_at >= REFIT_S) {
            self.refit();
        }
        if !self.spans.is_empty()
            && (self.weights.is_some() || self.waited() > self.opts.max_wait_s)
        {
            self.attribute_spans(src, false);
        }
    }

    /// The model from the anchored fits where every GPU has enough spans, else from the
    /// ledger's own spans.
    fn refit(&mut self) {
        let min = self.opts.min_spans;
        // What live requests were split by so far is as uncertain as the weights that split
        // it, not as the next ones: a first fit (8 spans, decode 40% low) split the first
        // seconds of a run, and the requests' bounds, taken with the weights of a fit on 36
        // spans a second later, covered a tenth of the error.
        if let Some(old) = self.weights {
            for s in self.slots.iter_mut().filter(|s| s.live) {
                s.close_model_bound(&old);
            }
        }
        self.weights = self.anchored.weights(min).or_else(|| self.fit.solve(min));
        self.refit_at = self.now;
    }

    /// Seconds of steps waiting in closed spans.
    fn waited(&self) -> f64 {
        self.spans.iter().map(|s| s.features.seconds).sum()
    }

    /// Close the open span (if it has any interval) and fit it.
    fn close_span(&mut self) {
        if self.span_start == self.pending.len() {
            return;
        }
        let (first, last) = (self.span_start, self.pending.len() - 1);
        let mut features = Features::default();
        let mut energy_gpu = vec![0.0; self.n_gpus];
        for (i, p) in self.pending[first..=last].iter().enumerate() {
            features.add(&p.features);
            let g = &self.pending_gpu[(first + i) * self.n_gpus..(first + i + 1) * self.n_gpus];
            for (a, b) in energy_gpu.iter_mut().zip(g) {
                *a += b;
            }
        }
        // Inner edges of consecutive cuts cancel in the sum: only the outer two remain, and
        // each cut's bound covers both of its edges.
        let bound = if first == last {
            self.pending_bound[first]
        } else {
            self.pending_bound[first] + self.pending_bound[last]
        };
        let t1 = self.now;
        self.unfitted.push_back(Unfitted {
            t0: self.span_t0,
            t1,
            features,
            measured: energy_gpu.iter().sum(),
        });
        let t0 = self.span_t0;
        self.span_t0 = t1;
        self.spans.push(Span {
            first,
            last,
            t0,
            t1,
            features,
            energy_gpu,
            bound,
        });
        self.span_start = self.pending.len();
        self.span_seconds = 0.0;
    }

    /// Attribute the closed spans whose energy has settled (all of them with `force`), with
    /// the fitted weights where there are some (spread over each span's steps by the model),
    /// else each step's measured energy by tokens.
    ///
    /// A span's energy is the sampler's settled estimate of it where `src` has one: at a cut's
    /// end the energy is extrapolated, and an edge off by two joules moves that much between
    /// the spans on either side of it, and between their requests, however well the model
    /// splits each span. The settled estimate replaces the cuts' sum in the totals too, so
    /// conservation still holds exactly; a span `src` cannot settle keeps its cuts' sum
    /// after [`SETTLE_GIVE_UP_S`].
    fn attribute_spans(&mut self, src: &mut dyn Settled, force: bool) {
        let mut spans = std::mem::take(&mut self.spans);
        let weights = self.weights;
        let mut gpu = vec![0.0; self.n_gpus];
        // Taken out while the steps are attributed (which needs `self` mutably), put back after.
        let all_work = std::mem::take(&mut self.pending_work);
        let mut done = 0;
        for span in &spans {
            let measured: f64 = span.energy_gpu.iter().sum();
            let due = force || self.now >= span.t1 + SETTLE_AFTER_S;
            let settled = if due {
                src.energy(span.t0, span.t1)
            } else {
                None
            };
            let usable = |v: Option<(f64, f64)>| {
                v.filter(|&(e, b)| e.is_finite() && e >= 0.0 && b.is_finite())
            };
            let (span_total, span_bound) = match usable(settled) {
                Some(v) => v,
                None if force || self.now >= span.t1 + SETTLE_GIVE_UP_S => {
                    usable(src.estimate(span.t0, span.t1)).unwrap_or((measured, span.bound))
                }
                None => break,
            };
            // Each GPU's part scales with it (its settled share is not known apart).
            let ratio = if measured > 0.0 {
                span_total / measured
            } else {
                0.0
            };
            let span_gpu: Vec<f64> = if measured > 0.0 {
                span.energy_gpu.iter().map(|e| e * ratio).collect()
            } else {
                vec![span_total / self.n_gpus as f64; self.n_gpus]
            };
            self.totals.measured_j += span_total - measured;
            let predicted: f64 = weights.map_or(0.0, |m| {
                self.pending[span.first..=span.last]
                    .iter()
                    .map(|p| m.predict(&p.features).max(0.0))
                    .sum()
            });
            let mut left = span_total;
            for i in span.first..=span.last {
                let p = self.pending[i].features;
                let (w0, w1, p_energy) = (
                    self.pending[i].work.0,
                    self.pending[i].work.1,
                    self.pending[i].energy,
                );
                let (e, b) = match weights {
                    Some(m) if predicted > 0.0 => {
                        let f = m.predict(&p).max(0.0) / predicted;
                        for (g, s) in gpu.iter_mut().zip(&span_gpu) {
                            *g = s * f;
                        }
                        let e = if i == span.last { left } else { span_total * f };
                        // How far the step's part of the span may move with the weights.
                        let (x, xs) = (p.as_array(), span.features.as_array());
                        let g: [f64; fit::TERMS] = std::array::from_fn(|k| x[k] - f * xs[k]);
                        let spread = span_total * (m.reach() * m.spread(&g) / predicted).min(1.0);
                        (e, if f > 0.0 { span_bound * f } else { 0.0 } + spread)
                    }
                    _ => {
                        for (g, c) in gpu
                            .iter_mut()
                            .zip(&self.pending_gpu[i * self.n_gpus..(i + 1) * self.n_gpus])
                        {
                            *g = c * ratio;
                        }
                        let e = if i == span.last {
                            left
                        } else {
                            p_energy * ratio
                        };
                        (e, self.pending_bound[i])
                    }
                };
                left -= e;
                let work = &all_work[w0..w1];
                if work.is_empty() {
                    self.totals.residual_j += e;
                    self.totals.residual_bound_j += b;
                } else {
                    let w = if predicted > 0.0 { weights } else { None };
                    self.attribute(work, p.seconds, e, &gpu, b, w.as_ref());
                    for (k, _) in work {
                        let s = &mut self.slots[*k as usize];
                        s.pending -= 1;
                        if s.pending == 0 && s.finish.is_some() {
                            self.emit(*k);
                        }
                    }
                }
                self.totals.pending_j -= p_energy;
            }
            done += 1;
        }
        self.pending_work = all_work;
        // Drop what is attributed: the intervals before the first span left.
        let rest = spans.split_off(done);
        let keep = rest.first().map_or(self.span_start, |s| s.first);
        let first_work = self
            .pending
            .get(keep)
            .map_or(self.pending_work.len(), |p| p.work.0);
        self.pending.drain(..keep);
        for p in &mut self.pending {
            p.work.0 -= first_work;
            p.work.1 -= first_work;
        }
        self.pending_work.drain(..first_work);
        self.pending_gpu.drain(..keep * self.n_gpus);
        self.pending_bound.drain(..keep);
        self.span_start -= keep;
        self.spans = rest
            .into_iter()
            .map(|mut s| {
                s.first -= keep;
                s.last -= keep;
                s
            })
            .collect();
        if self.pending.is_empty() {
            // Rounding across many spans: what is not pending is exactly nothing.
            self.totals.pending_j = 0.0;
        }
    }

    fn emit(&mut self, k: u32) {
        let weights = self.weights;
        let s = &mut self.slots[k as usize];
        s.live = false;
        if let Some(m) = weights {
            s.close_model_bound(&m);
        }
        let (finish, output) = s.finish.unwrap_or((self.now, None));
        let produced = s.decode_tokens + if s.prefill_tokens > 0.0 { 1.0 } else { 0.0 };
        let rec = RequestRecord {
            id: std::mem::take(&mut s.id),
            group: s.group,
            arrival: s.arrival,
            first_step: s.first_step,
            finish,
            finished: s.finish.is_some(),
            energy_j: s.energy,
            bound_j: s.bound,
            prefill_energy_j: s.prefill_energy,
            decode_energy_j: s.energy - s.prefill_energy,
            gpu_energy_j: if s.gpu.is_empty() {
                vec![s.energy]
            } else {
                std::mem::take(&mut s.gpu)
            },
            prefill_tokens: s.prefill_tokens,
            decode_tokens: s.decode_tokens,
            output_tokens: output.unwrap_or(produced),
            steps: s.steps,
            mean_batch: if s.steps > 0 {
                s.batch_sum / s.steps as f64
            } else {
                0.0
            },
            fitted: s.fitted,
        };
        if rec.finished {
            let g = &mut self.groups[rec.group as usize].1;
            g.requests += 1;
            g.energy_j += rec.energy_j;
            g.bound_j += rec.bound_j;
            g.prefill_energy_j += rec.prefill_energy_j;
            g.decode_energy_j += rec.decode_energy_j;
            g.prefill_tokens += rec.prefill_tokens;
            g.output_tokens += rec.output_tokens;
        }
        self.ready.push(rec);
        self.free.push(k);
    }

    /// How many records are ready ([`Ledger::take_records`]).
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Records ready since the last call, in the order they became ready.
    pub fn take_records(&mut self) -> Vec<RequestRecord> {
        std::mem::take(&mut self.ready)
    }

    /// Attribute everything still pending (with the weights fitted so far, or by tokens), and
    /// report every request still open as unfinished. The ledger stays usable.
    ///
    /// `src` as for [`Ledger::settle`]: the ledger's spans it cannot answer for yet are
    /// fitted with their cuts' sums.
    pub fn flush(&mut self, include_open: bool, src: &mut dyn Settled) {
        if self.opts.method == Method::Work {
            self.close_span();
            while let Some(u) = self.unfitted.pop_front() {
                let energy = src
                    .energy(u.t0, u.t1)
                    .map(|(e, _)| e)
                    .filter(|e| e.is_finite() && *e >= 0.0)
                    .unwrap_or(u.measured);
                self.fit.add(&u.features, energy);
            }
            for k in 0..self.n_gpus {
                let after = self.anchored.after(k);
                if let Some(anchors) = src.anchors(k, after) {
                    self.anchored.add_anchors(k, &anchors);
                }
            }
            self.refit();
            self.attribute_spans(src, true);
        }
        if include_open {
            let open: Vec<u32> = self.ids.drain().map(|(_, k)| k).collect();
            for k in open {
                self.emit(k);
            }
        }
    }
}
