//! `EnergyLedger` (the Rust half of `zeus.monitor.serving.EnergyLedger`): a window of the
//! monitor cut at every engine step, and the ledger that splits each cut among the step's
//! requests, with no Python in between.

use super::energy::PyZeusMonitor;
use super::*;
use crate::monitor::serving::{
    Background, Ledger, LedgerOptions, MeasuredInBackground, Method as LedgerMethod, Tail,
    WindowLedger, Work, BACKGROUND_PERIOD,
};
use crate::monitor::{EnergyMonitor, MonitorResult};
use pyo3::exceptions::PyTypeError;
use pyo3::types::{PySequence, PyString};

static NEXT_KEY: AtomicUsize = AtomicUsize::new(0);

/// How many of the last step's ids past the last one found `end_step` compares by address
/// (requests that left since) before it looks the id up by its string.
const KNOWN_LOOKAHEAD: usize = 8;

struct State {
    window: WindowLedger,
    monitor: Py<PyZeusMonitor>,
    open: bool,
    work: Vec<(u32, Work)>,
    /// The last step's request ids in order, each with its slot and the slot's serial
    /// (`Ledger::open_slot_serial`). An engine passes the same `str` objects step after step,
    /// in the same order but for requests that left or joined, so an id is looked for by
    /// address a few places on from the last one found: its slot without hashing the string
    /// (with caches cold after the engine waited on the GPU, the lookups cost more than the
    /// rest of a step of 256 requests). Holding the objects keeps their addresses from being
    /// reused by other strings.
    known: Vec<(Py<PyAny>, u32, u64)>,
    /// The next step's, being built (kept for its allocation).
    known_next: Vec<(Py<PyAny>, u32, u64)>,
    /// Whether a [`Background`] thread measures the marks when they are due (else the
    /// engine's calls do).
    background: bool,
    /// Warnings of the background thread's cuts, for the next call to give.
    warnings: Vec<String>,
}

/// Rust half of `zeus.monitor.serving.EnergyLedger`.
#[pyclass(name = "EnergyLedger", module = "zeus._core.monitor", frozen)]
pub(crate) struct PyEnergyLedger {
    state: Arc<Mutex<State>>,
    /// The thread that measures the marks (deferred cuts only).
    measurer: Mutex<Option<Background>>,
    gpu_indices: Vec<usize>,
    method: &'static str,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MeasuredInBackground for State {
    fn measure_due(&mut self) -> bool {
        if !(self.open && self.background) {
            return false;
        }
        if !(self.window.deferred() && self.window.has_marks()) {
            return true;
        }
        let Ok(now) = self.monitor.get().now() else {
            return false;
        };
        if !self.window.due(now) {
            return true;
        }
        let State {
            window, monitor, ..
        } = self;
        match monitor
            .get()
            .with_core(|m: &mut EnergyMonitor| window.measure(m, Tail::Nothing, &[]))
        {
            Ok(Ok((warnings, _))) => {
                self.warnings.extend(warnings);
                true
            }
            _ => {
                // The marks stay; the engine's next call measures them and meets the error.
                self.background = false;
                false
            }
        }
    }
}

impl State {
    /// Run `f` on the window and its monitor (one entry into the monitor), then warn with
    /// the cuts' warnings.
    fn with_window<R>(
        &mut self,
        py: Python<'_>,
        f: impl FnOnce(&mut WindowLedger, &mut EnergyMonitor) -> MonitorResult<(Vec<String>, R)>,
    ) -> PyResult<R> {
        if !self.open {
            return Err(PyRuntimeError::new_err("the serving ledger is closed"));
        }
        let State {
            window, monitor, ..
        } = self;
        let out = monitor
            .get()
            .with_core(|m: &mut EnergyMonitor| f(window, m))?;
        let (warnings, r) = out.py_err(py)?;
        if !warnings.is_empty() {
            warn(py, &warnings)?;
        }
        Ok(r)
    }

    /// Measure what is marked, then cut the window now as `tail` says (a step of
    /// `self.work`; refused, its slice goes to the residual): `WindowLedger::measure`.
    fn measure(&mut self, py: Python<'_>, tail: Tail) -> PyResult<()> {
        let work = std::mem::take(&mut self.work);
        let step = self.with_window(py, |w, m| w.measure(m, tail, &work));
        self.work = work;
        step?.py_err(py)
    }

    /// Whether the engine's call is to measure the marks itself at `now`: when they are due,
    /// or with a background thread, only when they are overdue.
    fn must_measure(&self, now: f64) -> bool {
        if self.background {
            self.window.overdue(now)
        } else {
            self.window.due(now)
        }
    }

    /// Give the background thread's warnings, if it had any.
    fn warn_pending(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.warnings.is_empty() {
            return Ok(());
        }
        let warnings = std::mem::take(&mut self.warnings);
        warn(py, &warnings)
    }

    /// Measure what is marked, if anything is: before anything reads the ledger.
    fn measure_marks(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.open && self.window.has_marks() {
            self.measure(py, Tail::Nothing)?;
        }
        Ok(())
    }

    /// `at`, or now on the monitor's clock.
    fn at_or_now(&self, at: Option<f64>) -> PyResult<f64> {
        match at {
            Some(t) => Ok(t),
            None => self.monitor.get().now(),
        }
    }

    /// `self.work` from a step's columns: each id's slot (registered if new, arriving at
    /// `arrival`) and its work.
    fn resolve(
        &mut self,
        ids: &Bound<'_, PySequence>,
        prefill: &Bound<'_, PySequence>,
        decode: &Bound<'_, PySequence>,
        kv: &Bound<'_, PySequence>,
        arrival: f64,
    ) -> PyResult<()> {
        self.work.clear();
        let n = ids.len()?;
        let mut known = std::mem::take(&mut self.known);
        let mut next = std::mem::take(&mut self.known_next);
        next.clear();
        let ledger = self.window.ledger_mut();
        let mut cursor = 0;
        let resolved = (|| {
            for i in 0..n {
                let item = ids.get_item(i)?;
                let ptr = item.as_ptr();
                let ahead = known.get(cursor..).unwrap_or_default();
                let seen = ahead
                    .iter()
                    .take(KNOWN_LOOKAHEAD)
                    .position(|(obj, _, _)| obj.as_ptr() == ptr)
                    .and_then(|d| {
                        let (_, k, serial) = ahead[d];
                        cursor += d + 1;
                        (ledger.open_slot_serial(k) == Some(serial)).then_some((k, serial))
                    });
                let (slot, serial) = match seen {
                    Some(s) => s,
                    None => {
                        let id = item.cast::<PyString>().map_err(|_| {
                            PyTypeError::new_err(format!(
                                "end_step: request ids must be str, got {}",
                                type_name(&item)
                            ))
                        })?;
                        let k = ledger.slot_arriving(id.to_str()?, arrival);
                        let serial = ledger
                            .open_slot_serial(k)
                            .expect("a slot just looked up is open");
                        (k, serial)
                    }
                };
                next.push((item.unbind(), slot, serial));
                self.work.push((
                    slot,
                    Work {
                        prefill: prefill.get_item(i)?.extract()?,
                        decode: decode.get_item(i)?.extract()?,
                        kv: kv.get_item(i)?.extract()?,
                    },
                ));
            }
            Ok(())
        })();
        known.clear();
        self.known = next;
        self.known_next = known;
        resolved
    }
}

fn dict_of<'py>(py: Python<'py>, pairs: &[(&str, f64)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in pairs {
        d.set_item(*k, *v)?;
    }
    Ok(d)
}

#[pymethods]
impl PyEnergyLedger {
    /// Open a window on `monitor` (a `ZeusMonitor`) that every step cuts.
    #[new]
    #[pyo3(signature = (
        monitor, method = "work", span_s = 1.0, min_spans = 8, max_wait_s = 30.0, defer = true
    ))]
    fn new(
        py: Python<'_>,
        monitor: Py<PyZeusMonitor>,
        method: &str,
        span_s: f64,
        min_spans: usize,
        max_wait_s: f64,
        defer: bool,
    ) -> PyResult<Self> {
        let method = LedgerMethod::parse(method).py_err(py)?;
        let (indices, now) = monitor.get().indices_and_now()?;
        if indices.is_empty() {
            return Err(PyValueError::new_err(
                "the serving ledger measures GPUs: the monitor has no GPU (gpu_indices=[])",
            ));
        }
        let opts = LedgerOptions {
            method,
            span_s,
            min_spans,
            max_wait_s,
        };
        let ledger = Ledger::new(indices.len(), now, opts).py_err(py)?;
        let key = format!(
            "__zeus_serving_ledger_{}__",
            NEXT_KEY.fetch_add(1, Ordering::Relaxed)
        );
        let window = monitor
            .get()
            .with_core(|m: &mut EnergyMonitor| WindowLedger::open(m, key, ledger, defer))?
            .py_err(py)?;
        let state = Arc::new(Mutex::new(State {
            window,
            monitor,
            open: true,
            work: Vec::new(),
            known: Vec::new(),
            known_next: Vec::new(),
            background: defer,
            warnings: Vec::new(),
        }));
        // Set before the thread starts, which stops at once without it. Without a thread, the
        // engine's calls measure the marks as before.
        let measurer = defer
            .then(|| Background::spawn(Arc::downgrade(&state), BACKGROUND_PERIOD).ok())
            .flatten();
        if measurer.is_none() {
            lock(&state).background = false;
        }
        Ok(PyEnergyLedger {
            state,
            measurer: Mutex::new(measurer),
            gpu_indices: indices,
            method: method.name(),
        })
    }

    #[getter]
    fn method(&self) -> &'static str {
        self.method
    }

    #[getter]
    fn gpu_indices(&self) -> Vec<usize> {
        self.gpu_indices.clone()
    }

    /// Whether steps and finishes are marked and measured every few steps
    /// (`WindowLedger`: every GPU read from the sampler's cache, no CPU in the monitor), as of
    /// the last cut.
    #[getter]
    fn deferred_cuts(&self) -> bool {
        lock(&self.state).window.deferred()
    }

    /// How many calls are marked and not yet measured (deferred cuts).
    #[getter]
    fn marks_waiting(&self) -> usize {
        lock(&self.state).window.marks_waiting()
    }

    /// The id of aggregate group `name` (created on first use).
    fn group(&self, name: &str) -> u32 {
        lock(&self.state).window.ledger_mut().group(name)
    }

    /// Request `request_id` arrived (at `at`, default now), in group `group`.
    #[pyo3(signature = (request_id, group = 0, at = None))]
    fn arrive(
        &self,
        py: Python<'_>,
        request_id: &str,
        group: u32,
        at: Option<f64>,
    ) -> PyResult<()> {
        let mut st = lock(&self.state);
        let at = st.at_or_now(at)?;
        // The same id again once its finish is measured: a new request.
        let ledger = st.window.ledger();
        if ledger
            .slot_of(request_id)
            .is_some_and(|k| st.window.finishing(k))
        {
            st.measure_marks(py)?;
        }
        st.window
            .ledger_mut()
            .arrive(request_id, group, at)
            .py_err(py)
    }

    /// A step begins: the energy since the last step ended (idle, scheduling) goes to the
    /// residual.
    fn begin_step(&self, py: Python<'_>) -> PyResult<()> {
        let mut st = lock(&self.state);
        if st.window.deferred() && st.open {
            let now = st.monitor.get().now()?;
            st.window.mark_begin(now);
            // Marks wait a bounded time, whichever calls an engine makes.
            if st.must_measure(now) {
                st.measure(py, Tail::Nothing)?;
            }
            return st.warn_pending(py);
        }
        st.measure(py, Tail::Gap)
    }

    /// A step ended: its energy (since the step began, or since the last step ended) goes to
    /// `request_ids`, each with its prefill, decode and KV-cache tokens in the step. Returns
    /// how many records are ready (`take_records`), so that a step with none costs no call.
    fn end_step(
        &self,
        py: Python<'_>,
        request_ids: &Bound<'_, PyAny>,
        prefill_tokens: &Bound<'_, PyAny>,
        decode_tokens: &Bound<'_, PyAny>,
        kv_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        // Items are read where they lie (a list or tuple's own array; strings as their cached
        // UTF-8): at 256 requests, copying them into vectors first cost more than the ledger.
        let ids = request_ids.cast::<PySequence>()?;
        let prefill = prefill_tokens.cast::<PySequence>()?;
        let decode = decode_tokens.cast::<PySequence>()?;
        let kv = kv_tokens.cast::<PySequence>()?;
        let n = ids.len()?;
        if prefill.len()? != n || decode.len()? != n || kv.len()? != n {
            return Err(PyValueError::new_err(format!(
                "end_step: {n} request ids but {} prefill, {} decode and {} kv counts",
                prefill.len()?,
                decode.len()?,
                kv.len()?
            )));
        }
        let mut st = lock(&self.state);
        let st = &mut *st;
        if !(st.window.deferred() && st.open) {
            let arrival = st.window.ledger().now();
            st.resolve(ids, prefill, decode, kv, arrival)?;
            st.measure(py, Tail::Step)?;
            return Ok(st.window.ledger().ready());
        }
        let now = st.monitor.get().now()?;
        st.resolve(ids, prefill, decode, kv, now)?;
        if st.window.names_finishing(&st.work) {
            // A request whose finish waits to be measured: finish it first, and look the ids
            // up again (the same id after its finish is a new request).
            st.measure_marks(py)?;
            st.resolve(ids, prefill, decode, kv, now)?;
        }
        let marked = st.window.mark_step(now, &st.work);
        if st.must_measure(now) {
            st.measure(py, Tail::Nothing)?;
        }
        st.warn_pending(py)?;
        marked.py_err(py)?;
        Ok(st.window.ledger().ready())
    }

    /// Request `request_id` finished (at `at`, default now), having generated
    /// `output_tokens` (default: counted from its steps). Returns how many records are ready.
    #[pyo3(signature = (request_id, output_tokens = None, at = None))]
    fn finish(
        &self,
        py: Python<'_>,
        request_id: &str,
        output_tokens: Option<f64>,
        at: Option<f64>,
    ) -> PyResult<usize> {
        let mut st = lock(&self.state);
        let at = st.at_or_now(at)?;
        if st.window.deferred() && st.open {
            st.window
                .mark_finish(request_id, at, output_tokens)
                .py_err(py)?;
            if st.must_measure(st.monitor.get().now()?) {
                st.measure(py, Tail::Nothing)?;
            }
            st.warn_pending(py)?;
        } else {
            st.measure_marks(py)?;
            st.window
                .ledger_mut()
                .finish(request_id, at, output_tokens)
                .py_err(py)?;
        }
        Ok(st.window.ledger().ready())
    }

    /// The records ready since the last call: one dict per request.
    fn take_records<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let records = {
            let mut st = lock(&self.state);
            st.measure_marks(py)?;
            st.window.ledger_mut().take_records()
        };
        records
            .into_iter()
            .map(|r| {
                let d = dict_of(
                    py,
                    &[
                        ("arrival", r.arrival),
                        ("first_step", r.first_step),
                        ("finish", r.finish),
                        ("energy", r.energy_j),
                        ("energy_bound", r.bound_j),
                        ("prefill_energy", r.prefill_energy_j),
                        ("decode_energy", r.decode_energy_j),
                        ("prefill_tokens", r.prefill_tokens),
                        ("decode_tokens", r.decode_tokens),
                        ("output_tokens", r.output_tokens),
                        ("mean_batch", r.mean_batch),
                    ],
                )?;
                d.set_item("request_id", r.id)?;
                d.set_item("group", r.group)?;
                d.set_item("finished", r.finished)?;
                d.set_item("fitted", r.fitted)?;
                d.set_item("steps", r.steps)?;
                let gpu = PyDict::new(py);
                for (i, e) in self.gpu_indices.iter().zip(&r.gpu_energy_j) {
                    gpu.set_item(i, e)?;
                }
                d.set_item("gpu_energy", gpu)?;
                Ok(d)
            })
            .collect()
    }

    /// Attribute what waits (with the weights fitted so far, else by tokens); with
    /// `include_open`, also report requests that have not finished.
    #[pyo3(signature = (include_open = false))]
    fn flush(&self, py: Python<'_>, include_open: bool) -> PyResult<()> {
        lock(&self.state).with_window(py, |w, m| Ok((w.flush(m, include_open)?, ())))
    }

    /// Energy totals, J: `measured == requests + residual + pending`.
    fn totals<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = {
            let mut st = lock(&self.state);
            st.measure_marks(py)?;
            st.window.ledger().totals()
        };
        let d = dict_of(
            py,
            &[
                ("seconds", t.seconds),
                ("measured", t.measured_j),
                ("requests", t.requests_j),
                ("residual", t.residual_j),
                ("residual_bound", t.residual_bound_j),
                ("pending", t.pending_j),
            ],
        )?;
        d.set_item("steps", t.steps)?;
        Ok(d)
    }

    /// The `work` model's fitted weights, or None.
    fn weights<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let weights = {
            let mut st = lock(&self.state);
            st.measure_marks(py)?;
            st.window.ledger().weights()
        };
        let Some(w) = weights else {
            return Ok(None);
        };
        let d = dict_of(
            py,
            &[
                ("idle_w", w.idle_w),
                ("prefill_j", w.prefill_j),
                ("decode_j", w.decode_j),
                ("kv_w", w.kv_w),
                ("rms_j", w.rms_j),
                ("rms_rel", w.rms_rel),
            ],
        )?;
        d.set_item("std_err", w.std_err.to_vec())?;
        d.set_item("spans", w.spans)?;
        Ok(Some(d))
    }

    /// Every aggregate group: `[(name, totals)]`, finished requests only.
    fn groups<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, Bound<'py, PyDict>)>> {
        let groups = {
            let mut st = lock(&self.state);
            st.measure_marks(py)?;
            st.window.ledger().groups().to_vec()
        };
        groups
            .into_iter()
            .map(|(name, g)| {
                let d = dict_of(
                    py,
                    &[
                        ("energy", g.energy_j),
                        ("energy_bound", g.bound_j),
                        ("prefill_energy", g.prefill_energy_j),
                        ("decode_energy", g.decode_energy_j),
                        ("prefill_tokens", g.prefill_tokens),
                        ("output_tokens", g.output_tokens),
                    ],
                )?;
                d.set_item("requests", g.requests)?;
                Ok((name, d))
            })
            .collect()
    }

    /// Requests arrived and not yet reported.
    fn open_requests(&self, py: Python<'_>) -> PyResult<usize> {
        let mut st = lock(&self.state);
        st.measure_marks(py)?;
        Ok(st.window.ledger().open_requests())
    }

    /// Stop: the energy since the last step goes to the residual, everything is attributed,
    /// open requests are reported as unfinished, and the monitor's window is closed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        // Stopped first, without the state's lock, which it may be waiting for.
        let measurer = self
            .measurer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut m) = measurer {
            m.stop();
        }
        let mut st = lock(&self.state);
        st.background = false;
        if !st.open {
            return Ok(());
        }
        st.warn_pending(py)?;
        st.with_window(py, |w, m| Ok((w.close(m)?, ())))?;
        st.open = false;
        Ok(())
    }
}
