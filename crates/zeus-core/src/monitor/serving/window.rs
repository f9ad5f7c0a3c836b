//! A [`Ledger`] fed by one window of an [`EnergyMonitor`], cut at every engine step.
//!
//! Where the window can be cut after the fact ([`EnergyMonitor::can_cut_in_past`]: every GPU
//! read from the sampler's cache), the engine's calls only mark the moments (a step's start,
//! its end with its requests, a request's finish), and the marks are measured together once
//! [`MARK_BATCH`] steps or [`MARK_MAX_AGE_S`] have gone by, or when anything reads the ledger.
//! The engine's thread wakes from waiting on the GPU with its caches cold, where entering the
//! monitor costs ten times what it does warm: it now does so once every few steps, not twice
//! a step. Each piece is cut at the moment it was marked, so the energies are those of the
//! same instants (evaluated with what the sampler learned since, which only helps); records
//! are ready up to a batch later.
//!
//! Elsewhere (direct counter reads, CPUs in the monitor) every call cuts at once.

use super::{Cut, Ledger, Settled, Work};
use crate::monitor::{EnergyMonitor, Measurement, MonitorError, MonitorResult};

/// Steps marked before they are measured together.
pub const MARK_BATCH: usize = 8;
/// The longest a mark waits to be measured (s): records and the `work` fit stay that fresh.
pub const MARK_MAX_AGE_S: f64 = 0.25;
/// The most marks of any kind that wait.
pub const MARK_CAP: usize = 256;
/// The oldest a mark gets, with a background thread to measure it, before the engine's
/// thread measures it itself ([`WindowLedger::overdue`]).
pub const MARK_OVERDUE_S: f64 = 4.0 * MARK_MAX_AGE_S;

/// What the sampler knows once it has settled, from the monitor.
pub struct FromMonitor<'a>(pub &'a EnergyMonitor);

impl Settled for FromMonitor<'_> {
    fn energy(&mut self, t0: f64, t1: f64) -> Option<(f64, f64)> {
        self.0.energy_from_cache(t0, t1, true)
    }
    fn estimate(&mut self, t0: f64, t1: f64) -> Option<(f64, f64)> {
        self.0.energy_from_cache(t0, t1, false)
    }
    fn anchors(&mut self, k: usize, after: f64) -> Option<Vec<(f64, f64, f64)>> {
        self.0.anchors_after(k, after)
    }
}

/// A call of the engine's, marked to be measured later.
#[derive(Debug, Clone)]
enum Mark {
    /// A piece of the window ends at `at`: a gap (the residual's), or a step whose requests
    /// are `marked_work[from..to]`.
    Piece {
        at: f64,
        work: Option<(usize, usize)>,
    },
    /// A request finished.
    Finish {
        id: String,
        at: f64,
        output_tokens: Option<f64>,
    },
}

/// What the cut taken now, after the marks, is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// No cut now: only the marks are measured.
    Nothing,
    /// A gap: the residual's.
    Gap,
    /// A step of the requests given.
    Step,
}

/// A ledger on a monitor window. See the module docs.
#[derive(Debug)]
pub struct WindowLedger {
    ledger: Ledger,
    key: String,
    /// When the window was last cut (the monitor's clock): each cut's end is the last one's
    /// plus the slice's time, exactly the instant the monitor evaluated.
    edge: f64,
    /// Whether calls may mark (else every call cuts at once).
    may_defer: bool,
    /// Whether calls mark: they may, and the window can be cut in the past as of the last cut.
    defer: bool,
    marks: Vec<Mark>,
    marked_work: Vec<(u32, Work)>,
    marked_steps: usize,
    /// Slots of requests whose finish is marked and not yet measured.
    finishing: Vec<u32>,
    energy: Vec<f64>,
    bound: Vec<f64>,
}

impl WindowLedger {
    /// Open window `key` on `m` for `ledger`; with `may_defer`, calls mark where they can
    /// (see the module docs), else every call cuts at once.
    ///
    /// # Errors
    /// The window cannot be opened (a window of that name is open, a device error).
    pub fn open(
        m: &mut EnergyMonitor,
        key: String,
        ledger: Ledger,
        may_defer: bool,
    ) -> MonitorResult<Self> {
        m.begin_window(&key)?;
        let edge = m
            .open_windows()
            .into_iter()
            .find(|w| w.key == key)
            .map_or(f64::NAN, |w| w.time);
        Ok(WindowLedger {
            ledger,
            may_defer,
            defer: may_defer && m.can_cut_in_past(&key),
            key,
            edge,
            marks: Vec::new(),
            marked_work: Vec::new(),
            marked_steps: 0,
            finishing: Vec::new(),
            energy: Vec::new(),
            bound: Vec::new(),
        })
    }

    /// The window's name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The ledger (measured up to the last [`WindowLedger::measure`]).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The ledger, to register requests and look their slots up.
    pub fn ledger_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// Whether calls mark instead of cutting (as of the last cut).
    pub fn deferred(&self) -> bool {
        self.defer
    }

    /// Whether marks wait to be measured.
    pub fn has_marks(&self) -> bool {
        !self.marks.is_empty()
    }

    /// How many marks wait to be measured.
    pub fn marks_waiting(&self) -> usize {
        self.marks.len()
    }

    /// Whether the marks are due to be measured at `now`: [`MARK_BATCH`] steps, the oldest
    /// piece [`MARK_MAX_AGE_S`] old, or [`MARK_CAP`] marks of any kind (a finish's moment is
    /// the caller's to give, so it says nothing of how long the mark has waited).
    pub fn due(&self, now: f64) -> bool {
        self.marked_steps >= MARK_BATCH || self.waited(now, MARK_MAX_AGE_S)
    }

    /// Whether the marks are overdue at `now`, where a [`Background`](super::Background)
    /// thread measures them when [`WindowLedger::due`]: [`MARK_CAP`] marks, or the oldest
    /// piece [`MARK_OVERDUE_S`] old (the thread starved or gone). The engine's thread then
    /// measures them itself.
    pub fn overdue(&self, now: f64) -> bool {
        self.waited(now, MARK_OVERDUE_S)
    }

    /// [`MARK_CAP`] marks, or the oldest piece `max_age_s` old at `now`.
    fn waited(&self, now: f64, max_age_s: f64) -> bool {
        self.marks.len() >= MARK_CAP
            || self.marks.iter().find_map(|m| match m {
                Mark::Piece { at, .. } => Some(now - at >= max_age_s),
                Mark::Finish { .. } => None,
            }) == Some(true)
    }

    /// Whether request slot `k` has a finish marked and not yet measured: a step naming it,
    /// or the same id arriving again, waits until the marks are measured.
    pub fn finishing(&self, k: u32) -> bool {
        self.finishing.contains(&k)
    }

    /// Whether any of `work`'s slots is [`WindowLedger::finishing`].
    pub fn names_finishing(&self, work: &[(u32, Work)]) -> bool {
        !self.finishing.is_empty() && work.iter().any(|(k, _)| self.finishing(*k))
    }

    /// A step begins at `at` (deferred): the window is cut there when the marks are measured.
    pub fn mark_begin(&mut self, at: f64) {
        self.marks.push(Mark::Piece { at, work: None });
    }

    /// A step of `work` ended at `at` (deferred). Checked now, measured later.
    ///
    /// # Errors
    /// As [`Ledger::check_step`], and a request whose finish is marked
    /// ([`WindowLedger::names_finishing`]: measure first); the step is then marked as a gap,
    /// its energy the residual's.
    pub fn mark_step(&mut self, at: f64, work: &[(u32, Work)]) -> MonitorResult<()> {
        let checked = match work.iter().find(|(k, _)| self.finishing(*k)) {
            Some((k, _)) => Err(MonitorError::InvalidArg(format!(
                "request slot {k} has finished: it cannot run in a later step"
            ))),
            None => self.ledger.check_step(work),
        };
        let range = checked.is_ok().then(|| {
            let from = self.marked_work.len();
            self.marked_work.extend_from_slice(work);
            (from, self.marked_work.len())
        });
        self.marks.push(Mark::Piece { at, work: range });
        self.marked_steps += 1;
        checked
    }

    /// Request `id` finished at `at` (deferred). Checked now, applied when measured.
    ///
    /// # Errors
    /// As [`Ledger::finish`]; a finish already marked.
    pub fn mark_finish(
        &mut self,
        id: &str,
        at: f64,
        output_tokens: Option<f64>,
    ) -> MonitorResult<()> {
        let k = self.ledger.check_finish(id, output_tokens)?;
        if self.finishing(k) {
            return Err(MonitorError::InvalidArg(format!(
                "request '{id}' is not open (never arrived, or already finished)"
            )));
        }
        self.finishing.push(k);
        self.marks.push(Mark::Finish {
            id: id.to_owned(),
            at,
            output_tokens,
        });
        Ok(())
    }

    /// Measure the marks, then cut now as `tail` says (a step of `work`), and fit what has
    /// settled: one entry into the monitor for all of it. Returns the cuts' warnings and the
    /// tail step's outcome: a step the ledger refuses still has its slice taken, as a gap.
    ///
    /// A mark that can no longer be cut at its moment (the sampler left its cached mode)
    /// gets its share by time of one cut now, with a bound that allows the whole cut.
    ///
    /// # Errors
    /// A device error cutting the window: the marks not yet measured stay, and so does the
    /// window.
    pub fn measure(
        &mut self,
        m: &mut EnergyMonitor,
        tail: Tail,
        work: &[(u32, Work)],
    ) -> MonitorResult<(Vec<String>, MonitorResult<()>)> {
        let mut warnings = Vec::new();
        let marks = std::mem::take(&mut self.marks);
        let mut marked_work = std::mem::take(&mut self.marked_work);
        let mut done = 0;
        // Once a mark cannot be cut at its moment: one cut now, shared by time among it, the
        // marks after it and the tail.
        let mut split: Option<Split> = None;
        for mark in &marks {
            match mark {
                Mark::Finish {
                    id,
                    at,
                    output_tokens,
                } => {
                    // Checked when marked; nothing since can have finished it.
                    let _ = self.ledger.finish(id, *at, *output_tokens);
                }
                Mark::Piece { at, work: range } => {
                    let work = range.map_or(&[][..], |(a, b)| &marked_work[a..b]);
                    if split.is_none() {
                        let cut = match m.cut_window_at(&self.key, *at) {
                            Err(MonitorError::InvalidArg(_)) => m.cut_window(&self.key).map(Err),
                            cut => cut.map(Ok),
                        };
                        match cut {
                            // Checked when marked: a refusal now can only be the cut's, and
                            // the slice then goes to the residual.
                            Ok(Ok(out)) => {
                                warnings.extend(out.warnings);
                                let seconds = self.take(&out.measurement);
                                self.edge += seconds;
                                let _ = self.feed(seconds, work);
                                done += 1;
                                continue;
                            }
                            Ok(Err(now)) => {
                                warnings.extend(now.warnings);
                                split = Some(Split::of(&now.measurement, self.edge));
                            }
                            Err(e) => {
                                self.keep_unmeasured(&marks[done..], marked_work);
                                return Err(e);
                            }
                        }
                    }
                    if let Some(sp) = split.as_mut() {
                        let _ = self.split_piece(sp, *at, work, false);
                    }
                }
            }
            done += 1;
        }
        let tail_work = if tail == Tail::Step { work } else { &[] };
        let step = match (split, tail) {
            (Some(mut sp), _) => {
                let end = sp.end;
                self.split_piece(&mut sp, end, tail_work, true)
            }
            (None, Tail::Nothing) => Ok(()),
            (None, _) => match m.cut_window(&self.key) {
                Ok(out) => {
                    warnings.extend(out.warnings);
                    let seconds = self.take(&out.measurement);
                    self.edge += seconds;
                    self.feed(seconds, tail_work)
                }
                Err(e) => {
                    self.keep_unmeasured(&marks[done..], marked_work);
                    return Err(e);
                }
            },
        };
        marked_work.clear();
        self.marked_work = marked_work;
        // Kept for their allocation.
        let mut marks = marks;
        marks.clear();
        self.marks = marks;
        self.marked_steps = 0;
        self.finishing.clear();
        self.ledger.settle(&mut FromMonitor(m));
        self.defer = self.may_defer && m.can_cut_in_past(&self.key);
        Ok((warnings, step))
    }

    /// Measure the marks, then attribute everything that waits ([`Ledger::flush`]).
    ///
    /// # Errors
    /// As [`WindowLedger::measure`].
    pub fn flush(
        &mut self,
        m: &mut EnergyMonitor,
        include_open: bool,
    ) -> MonitorResult<Vec<String>> {
        let (warnings, _) = self.measure(m, Tail::Nothing, &[])?;
        self.ledger.flush(include_open, &mut FromMonitor(m));
        Ok(warnings)
    }

    /// Stop: the marks are measured, the energy since the last one goes to the residual,
    /// everything is attributed, open requests are reported as unfinished, and the window is
    /// closed.
    ///
    /// # Errors
    /// As [`WindowLedger::measure`]; the window then stays open.
    pub fn close(&mut self, m: &mut EnergyMonitor) -> MonitorResult<Vec<String>> {
        let (warnings, _) = self.measure(m, Tail::Gap, &[])?;
        self.ledger.flush(true, &mut FromMonitor(m));
        m.end_window(&self.key, true, None)?;
        Ok(warnings)
    }

    /// After a device error: the marks not yet measured wait again, with their requests.
    fn keep_unmeasured(&mut self, marks: &[Mark], marked_work: Vec<(u32, Work)>) {
        self.marks = marks.to_vec();
        self.marked_work = marked_work;
    }

    /// A slice's energy and bound per GPU into `energy` and `bound`; its time.
    fn take(&mut self, slice: &Measurement) -> f64 {
        take_slice(slice, &mut self.energy, &mut self.bound)
    }

    /// Give the slice in `energy` and `bound` to the ledger: a step of `work`, or a gap when
    /// it is empty. A refused step goes to the residual.
    fn feed(&mut self, seconds: f64, work: &[(u32, Work)]) -> MonitorResult<()> {
        let cut = Cut {
            seconds,
            energy: &self.energy,
            bound: &self.bound,
        };
        if work.is_empty() {
            self.ledger.gap(cut, self.edge)
        } else {
            self.ledger
                .step_slots(cut, self.edge, work)
                .or_else(|e| self.ledger.gap(cut, self.edge).and(Err(e)))
        }
    }

    /// The piece of `split` from the last cut to `at`, by its share of the cut's time, to the
    /// ledger (the `last` takes what is left, so that the pieces add up to the cut). Any piece
    /// may hold anything up to the whole cut's energy: its bound says so.
    fn split_piece(
        &mut self,
        split: &mut Split,
        at: f64,
        work: &[(u32, Work)],
        last: bool,
    ) -> MonitorResult<()> {
        let at = at.clamp(self.edge, split.end);
        let share = if split.seconds > 0.0 {
            (at - self.edge) / split.seconds
        } else {
            0.0
        };
        self.energy.clear();
        self.bound.clear();
        for g in 0..split.energy.len() {
            let e = if last {
                split.energy[g] - split.given[g]
            } else {
                split.energy[g] * share
            };
            split.given[g] += e;
            self.energy.push(e.max(0.0));
            self.bound.push(split.bound[g] * share + split.energy[g]);
        }
        let seconds = at - self.edge;
        self.edge = at;
        self.feed(seconds, work)
    }
}

/// A cut taken now for marks that could not be cut at their moments, being shared out.
struct Split {
    energy: Vec<f64>,
    bound: Vec<f64>,
    seconds: f64,
    /// Where it ends (now).
    end: f64,
    /// Per GPU, what the pieces so far took.
    given: Vec<f64>,
}

impl Split {
    fn of(slice: &Measurement, edge: f64) -> Split {
        let (mut energy, mut bound) = (Vec::new(), Vec::new());
        let seconds = take_slice(slice, &mut energy, &mut bound);
        Split {
            given: vec![0.0; energy.len()],
            energy,
            bound,
            seconds,
            end: edge + seconds,
        }
    }
}

/// A slice's energy and bound per GPU into `energy` and `bound` (cleared first); its time.
fn take_slice(slice: &Measurement, energy: &mut Vec<f64>, bound: &mut Vec<f64>) -> f64 {
    energy.clear();
    bound.clear();
    energy.extend(slice.energy.iter().map(|(_, e)| e.max(0.0)));
    bound.extend(slice.energy_bound.iter().map(|(_, b)| b.max(0.0)));
    slice.time.max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{Fidelity, SimCluster, SimGpu};
    use crate::device::Clock;
    use crate::monitor::power::tests::sim_with;
    use crate::monitor::serving::{LedgerOptions, Method};
    use std::sync::Arc;

    /// One simulated H100 on a monitor: at ideal fidelity on a virtual clock (read at the
    /// moment: nothing can be cut in the past), or calibrated on the real clock (the
    /// sampler's cache).
    fn monitor(calibrated: bool) -> (Arc<SimCluster>, Arc<SimGpu>, EnergyMonitor) {
        let fidelity = if calibrated {
            Fidelity::Real
        } else {
            Fidelity::Ideal
        };
        let (c, gpus) = sim_with(&["H100"], !calibrated, fidelity);
        let dev = c.devices()[0].clone();
        let m = EnergyMonitor::new(gpus, None, None, None).unwrap();
        (c, dev, m)
    }

    fn ledger(method: Method, now: f64) -> Ledger {
        let opts = LedgerOptions {
            method,
            ..LedgerOptions::default()
        };
        Ledger::new(1, now, opts).unwrap()
    }

    fn work(decode: f64) -> Work {
        Work {
            prefill: 0.0,
            decode,
            kv: 0.0,
        }
    }

    #[test]
    fn marks_that_cannot_be_cut_in_the_past_share_one_cut_by_time_and_say_so() {
        let (c, dev, mut m) = monitor(false);
        let clock = c.clock();
        let mut wl = WindowLedger::open(
            &mut m,
            "w".into(),
            ledger(Method::Tokens, clock.now()),
            true,
        )
        .unwrap();
        assert!(!wl.deferred(), "direct reads cannot be cut in the past");
        let e0 = dev.true_energy_j();
        let k = wl.ledger_mut().slot("a");
        // A gap of 1 s, a step of 3 s, a finish, then 1 s more: marked, not cut.
        dev.set_power_draw(200.0).unwrap();
        clock.advance(1.0);
        wl.mark_begin(clock.now());
        clock.advance(3.0);
        wl.mark_step(clock.now(), &[(k, work(5.0))]).unwrap();
        wl.mark_finish("a", clock.now(), None).unwrap();
        assert!(wl.finishing(k) && wl.ledger().ready() == 0);
        clock.advance(1.0);
        let (_, step) = wl.measure(&mut m, Tail::Gap, &[]).unwrap();
        step.unwrap();
        let whole = dev.true_energy_j() - e0;
        let totals = wl.ledger().totals();
        assert!(
            (totals.measured_j - whole).abs() < 2e-3,
            "{totals:?} vs {whole}"
        );
        let records = wl.ledger_mut().take_records();
        assert_eq!(records.len(), 1);
        let r = &records[0];
        // Its share by time (3 of 5 s), and a bound that allows the whole cut.
        assert!((r.energy_j - 0.6 * totals.measured_j).abs() < 1e-9, "{r:?}");
        assert!(r.bound_j >= totals.measured_j);
        assert!(
            (totals.requests_j + totals.residual_j - totals.measured_j).abs()
                < 1e-9 * totals.measured_j
        );
        assert!(!wl.has_marks() && !wl.finishing(k));
    }

    #[test]
    fn marks_wait_a_bounded_time_and_number() {
        let (c, _dev, mut m) = monitor(false);
        let t = c.clock().now();
        let mut wl = WindowLedger::open(&mut m, "w".into(), ledger(Method::Time, t), true).unwrap();
        let k = wl.ledger_mut().slot("a");
        wl.mark_finish("a", t - 100.0, None).unwrap(); // a finish given long ago
        assert!(!wl.due(t), "a finish's moment is not how long it waited");
        wl.mark_begin(t);
        assert!(!wl.due(t + 0.9 * MARK_MAX_AGE_S) && wl.due(t + MARK_MAX_AGE_S));
        assert!(!wl.overdue(t + MARK_MAX_AGE_S) && wl.overdue(t + MARK_OVERDUE_S));
        for i in 1..MARK_BATCH {
            wl.mark_step(t, &[]).unwrap();
            assert!(!wl.due(t), "{i} steps");
        }
        wl.mark_step(t, &[]).unwrap();
        assert!(wl.due(t) && !wl.overdue(t), "a batch is due, not overdue");
        wl.measure(&mut m, Tail::Nothing, &[]).unwrap().1.unwrap();
        assert!(!wl.finishing(k));
        for _ in 1..MARK_CAP {
            wl.mark_begin(t);
        }
        assert!(!wl.due(t) && !wl.overdue(t));
        wl.mark_begin(t);
        assert!(wl.due(t) && wl.overdue(t), "as many marks as may wait");
    }

    #[test]
    fn a_finish_is_checked_when_marked_and_applied_in_its_order() {
        let (c, _dev, mut m) = monitor(false);
        let clock = c.clock();
        let mut wl =
            WindowLedger::open(&mut m, "w".into(), ledger(Method::Time, clock.now()), true)
                .unwrap();
        let k = wl.ledger_mut().slot("a");
        clock.advance(0.5);
        wl.mark_step(clock.now(), &[(k, work(1.0))]).unwrap();
        let bad = wl.mark_step(clock.now(), &[(k, work(-1.0))]).unwrap_err();
        assert!(bad.to_string().contains("-1"), "{bad}");
        wl.mark_finish("a", clock.now(), Some(4.0)).unwrap();
        let twice = wl.mark_finish("a", clock.now(), None).unwrap_err();
        assert!(twice.to_string().contains("'a' is not open"), "{twice}");
        let unknown = wl.mark_finish("b", clock.now(), None).unwrap_err();
        assert!(unknown.to_string().contains("'b' is not open"), "{unknown}");
        // A step naming it waits for the finish to be measured, and its slot is gone then.
        assert!(wl.names_finishing(&[(k, work(1.0))]));
        let early = wl.mark_step(clock.now(), &[(k, work(1.0))]).unwrap_err();
        assert!(early.to_string().contains("has finished"), "{early}");
        wl.measure(&mut m, Tail::Nothing, &[]).unwrap().1.unwrap();
        let refused = wl.measure(&mut m, Tail::Step, &[(k, work(1.0))]).unwrap().1;
        let refused = refused.unwrap_err().to_string();
        assert!(refused.contains("slot 0 is not open"), "{refused}");
        let records = wl.ledger_mut().take_records();
        assert_eq!(records.len(), 1);
        assert_eq!((records[0].steps, records[0].output_tokens), (1, 4.0));
        let t = wl.ledger().totals();
        assert!((t.requests_j + t.residual_j - t.measured_j).abs() < 1e-9 * t.measured_j);
    }

    #[test]
    fn marks_measured_together_give_each_piece_the_energy_of_its_moments() {
        let (_c, dev, mut m) = monitor(true);
        let now = m.gpus().now();
        let mut wl =
            WindowLedger::open(&mut m, "w".into(), ledger(Method::Time, now), true).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !wl.deferred() {
            assert!(std::time::Instant::now() < deadline, "never read the cache");
            std::thread::sleep(std::time::Duration::from_millis(20));
            wl.measure(&mut m, Tail::Gap, &[]).unwrap().1.unwrap();
        }
        let before = wl.ledger().totals();
        let k = wl.ledger_mut().slot("a");
        let (mut gaps, mut steps) = (0.0, 0.0);
        // Gaps at 450 W and steps at 120 W, 150 ms each: eight steps are one batch.
        for _ in 0..MARK_BATCH {
            let e0 = dev.true_energy_j();
            dev.set_power_draw(450.0).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(150));
            wl.mark_begin(m.gpus().now());
            let e1 = dev.true_energy_j();
            dev.set_power_draw(120.0).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(150));
            wl.mark_step(m.gpus().now(), &[(k, work(1.0))]).unwrap();
            gaps += e1 - e0;
            steps += dev.true_energy_j() - e1;
        }
        assert_eq!(
            wl.ledger().totals().steps,
            before.steps,
            "nothing measured yet"
        );
        assert!(wl.due(m.gpus().now()));
        wl.measure(&mut m, Tail::Nothing, &[]).unwrap().1.unwrap();
        assert!(wl.deferred() && !wl.has_marks());
        let t = wl.ledger().totals();
        let residual = t.residual_j - before.residual_j;
        let residual_bound = t.residual_bound_j - before.residual_bound_j;
        let requests = t.requests_j - before.requests_j;
        assert_eq!(t.steps - before.steps, MARK_BATCH as u64);
        // Real clock on a shared machine: a starved sampler may miss 10%, and must say so.
        assert!(
            (residual - gaps).abs() < (0.1 * gaps).max(1.5 * residual_bound),
            "gaps {residual} ± {residual_bound} J vs {gaps} J"
        );
        assert!(residual > 2.5 * requests, "{residual} vs {requests}");
        assert!((requests - steps).abs() < (0.1 * steps).max(0.5 * residual_bound));
    }
}
