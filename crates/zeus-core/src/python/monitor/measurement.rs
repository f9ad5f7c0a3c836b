//! `Measurement` and `Provenance`: what a window measured and how each figure was made.

use super::*;

/// How one device's energy in one window was made.
///
/// Attributes:
///     method: `"cached_counter"` (the sampler's cache: counter values at calibrated moments
///         and the power readings between), `"direct_counter"` (the counter read at the
///         window's edges), `"power_integration"` (power readings integrated) or `"degraded"`
///         (part of the window had no readings, or the counter reset within it: the figure
///         rests on what the device can draw there, which its bound says).
///     update_period: Seconds between the readings' updates used, where known.
///     counter_lag: Seconds between the moment a counter value describes and when the driver
///         shows it, as the sampler measured it, or `None`.
///     note: Why the figure was not made the usual way, or `None`.
#[pyclass(
    name = "Provenance",
    module = "zeus.monitor",
    frozen,
    eq,
    skip_from_py_object
)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyProvenance {
    #[pyo3(get)]
    method: &'static str,
    #[pyo3(get)]
    update_period: Option<f64>,
    #[pyo3(get)]
    counter_lag: Option<f64>,
    #[pyo3(get)]
    note: Option<String>,
}

#[pymethods]
impl PyProvenance {
    #[new]
    #[pyo3(signature = (method, update_period = None, counter_lag = None, note = None))]
    fn new(
        method: &str,
        update_period: Option<f64>,
        counter_lag: Option<f64>,
        note: Option<String>,
    ) -> PyResult<Self> {
        let method = [
            Method::CachedCounter,
            Method::DirectCounter,
            Method::PowerIntegration,
            Method::Degraded,
        ]
        .into_iter()
        .map(Method::name)
        .find(|m| *m == method)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "method must be 'cached_counter', 'direct_counter', 'power_integration' or \
                 'degraded', got {method:?}"
            ))
        })?;
        Ok(PyProvenance {
            method,
            update_period,
            counter_lag,
            note,
        })
    }

    fn __repr__(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("None".to_string(), crate::monitor::counter::py_float);
        let mut s = format!(
            "Provenance(method={:?}, update_period={}, counter_lag={}",
            self.method,
            opt(self.update_period),
            opt(self.counter_lag)
        );
        if let Some(n) = &self.note {
            s.push_str(&format!(", note={n:?}"));
        }
        s.push(')');
        s.replace('"', "'")
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let p = slf.get();
        let args = (p.method, p.update_period, p.counter_lag, p.note.clone()).into_pyobject(py)?;
        Ok((slf.get_type().into_any(), args))
    }
}

impl From<&Provenance> for PyProvenance {
    fn from(p: &Provenance) -> PyProvenance {
        PyProvenance {
            method: p.method.name(),
            update_period: p.update_period,
            counter_lag: p.counter_lag,
            note: p.note.clone(),
        }
    }
}

/// Time and energy of one measurement window, and how far each energy may be off.
///
/// Attributes:
///     time: Elapsed time in seconds.
///     energy: GPU index (framework index, after `CUDA_VISIBLE_DEVICES`) to joules.
///     gpu_energy: The same dict as `energy` (Zeus 0.16's name).
///     cpu_energy: CPU package index to joules, or `None` when no CPU was monitored.
///     dram_energy: CPU package index to the joules of its DRAM (packages with a DRAM zone
///         only), or `None` when no CPU was monitored.
///     total_energy: GPU, CPU package and DRAM energy together, joules.
///     gpu_energy_uncertainty: GPU index to the bound of its energy, joules: the true energy
///         lies within `energy ± bound` in about 95% of windows (see
///         `docs/measurement-uncertainty.md` for how it is computed and when it is wide).
///     cpu_energy_uncertainty, dram_energy_uncertainty: The same for CPU packages and their
///         DRAM, or `None` when no CPU was monitored.
///     total_energy_uncertainty: The bounds added up (joules): a bound of `total_energy`.
///     gpu_energy_provenance: GPU index to its `Provenance` (how the energy was made).
///
/// Equality compares the time and the energies, as Zeus's dataclass does; the bounds and
/// provenance describe those figures.
#[pyclass(name = "Measurement", module = "zeus.monitor")]
pub(crate) struct PyMeasurement {
    #[pyo3(get, set)]
    time: f64,
    /// Values as measured; the dict is built from them on first access.
    values: Vec<(usize, f64)>,
    dict: Option<Py<PyDict>>,
    #[pyo3(get, set)]
    cpu_energy: Option<Py<PyDict>>,
    #[pyo3(get, set)]
    dram_energy: Option<Py<PyDict>>,
    /// Bounds and provenance as measured, turned into dicts on first access.
    bounds: Vec<(usize, f64)>,
    bounds_dict: Option<Py<PyDict>>,
    provenance: Vec<(usize, PyProvenance)>,
    provenance_dict: Option<Py<PyDict>>,
    #[pyo3(get, set)]
    cpu_energy_uncertainty: Option<Py<PyDict>>,
    #[pyo3(get, set)]
    dram_energy_uncertainty: Option<Py<PyDict>>,
}

fn dict_sum(py: Python<'_>, d: &Option<Py<PyDict>>) -> PyResult<f64> {
    let mut total = 0.0;
    if let Some(d) = d {
        for v in d.bind(py).values() {
            total += v.extract::<f64>()?;
        }
    }
    Ok(total)
}

fn to_dict(py: Python<'_>, v: Option<Vec<(usize, f64)>>) -> PyResult<Option<Py<PyDict>>> {
    v.map(|v| {
        let d = PyDict::new(py);
        for (i, e) in v {
            d.set_item(i, e)?;
        }
        Ok(d.unbind())
    })
    .transpose()
}

fn as_dict(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Py<PyDict>>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => match o.cast::<PyDict>() {
            Ok(d) => Ok(Some(d.clone().unbind())),
            Err(_) => Ok(Some(
                PyDict::from_sequence(&o.call_method0("items")?)?.unbind(),
            )),
        },
    }
}

/// A dict built once from `values`, kept in `cache`.
fn cached_dict<'py, T: Clone + for<'a> IntoPyObject<'a>>(
    py: Python<'py>,
    cache: &mut Option<Py<PyDict>>,
    values: &[(usize, T)],
) -> PyResult<Bound<'py, PyDict>> {
    if let Some(d) = cache {
        return Ok(d.bind(py).clone());
    }
    let d = PyDict::new(py);
    for (i, v) in values {
        d.set_item(i, v.clone())?;
    }
    *cache = Some(d.clone().unbind());
    Ok(d)
}

impl PyMeasurement {
    fn energy_dict<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cached_dict(py, &mut self.dict, &self.values)
    }
}

#[pymethods]
impl PyMeasurement {
    #[new]
    #[pyo3(signature = (
        time,
        energy = None,
        cpu_energy = None,
        dram_energy = None,
        gpu_energy_uncertainty = None,
        cpu_energy_uncertainty = None,
        dram_energy_uncertainty = None,
        gpu_energy_provenance = None,
        *,
        gpu_energy = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        time: f64,
        energy: Option<&Bound<'_, PyAny>>,
        cpu_energy: Option<&Bound<'_, PyAny>>,
        dram_energy: Option<&Bound<'_, PyAny>>,
        gpu_energy_uncertainty: Option<&Bound<'_, PyAny>>,
        cpu_energy_uncertainty: Option<&Bound<'_, PyAny>>,
        dram_energy_uncertainty: Option<&Bound<'_, PyAny>>,
        gpu_energy_provenance: Option<&Bound<'_, PyAny>>,
        gpu_energy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // `gpu_energy` is Zeus 0.16's name of `energy` (the reference's).
        let energy = match (energy, gpu_energy) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "give the GPU energy once: energy (zeus 0.8.2) or gpu_energy (Zeus 0.16)",
                ))
            }
            (Some(e), None) | (None, Some(e)) => e,
            (None, None) => {
                return Err(PyValueError::new_err(
                    "Measurement needs the GPU energy: energy=... (or gpu_energy=...)",
                ))
            }
        };
        let dict = as_dict(Some(energy))?;
        Ok(PyMeasurement {
            time,
            values: Vec::new(),
            dict,
            cpu_energy: as_dict(cpu_energy)?,
            dram_energy: as_dict(dram_energy)?,
            bounds: Vec::new(),
            // Measurements made by hand (Zeus's constructor) say nothing about their bounds.
            bounds_dict: Some(match as_dict(gpu_energy_uncertainty)? {
                Some(d) => d,
                None => PyDict::new(energy.py()).unbind(),
            }),
            provenance: Vec::new(),
            provenance_dict: Some(match as_dict(gpu_energy_provenance)? {
                Some(d) => d,
                None => PyDict::new(energy.py()).unbind(),
            }),
            cpu_energy_uncertainty: as_dict(cpu_energy_uncertainty)?,
            dram_energy_uncertainty: as_dict(dram_energy_uncertainty)?,
        })
    }

    #[getter]
    fn energy<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.energy_dict(py)
    }

    #[setter]
    fn set_energy(&mut self, energy: Bound<'_, PyDict>) {
        self.dict = Some(energy.unbind());
    }

    /// Zeus 0.16's name for `energy` (the same dict).
    #[getter]
    fn gpu_energy<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.energy_dict(py)
    }

    /// GPU index to the bound of its energy (J): the true energy lies within ± the bound in
    /// about 95% of windows.
    #[getter]
    fn gpu_energy_uncertainty<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cached_dict(py, &mut self.bounds_dict, &self.bounds)
    }

    /// GPU index to how its energy was made (`Provenance`).
    #[getter]
    fn gpu_energy_provenance<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if let Some(d) = &self.provenance_dict {
            return Ok(d.bind(py).clone());
        }
        let d = PyDict::new(py);
        for (i, p) in &self.provenance {
            d.set_item(i, Py::new(py, p.clone())?)?;
        }
        self.provenance_dict = Some(d.clone().unbind());
        Ok(d)
    }

    #[getter]
    fn total_energy(&self, py: Python<'_>) -> PyResult<f64> {
        let gpu = match &self.dict {
            None => self.values.iter().map(|(_, e)| e).sum(),
            Some(_) => dict_sum(py, &self.dict)?,
        };
        Ok(gpu + dict_sum(py, &self.cpu_energy)? + dict_sum(py, &self.dram_energy)?)
    }

    /// The bounds of every energy added up (J): a bound of `total_energy`.
    #[getter]
    fn total_energy_uncertainty(&self, py: Python<'_>) -> PyResult<f64> {
        let gpu = match &self.bounds_dict {
            None => self.bounds.iter().map(|(_, e)| e).sum(),
            Some(_) => dict_sum(py, &self.bounds_dict)?,
        };
        Ok(gpu
            + dict_sum(py, &self.cpu_energy_uncertainty)?
            + dict_sum(py, &self.dram_energy_uncertainty)?)
    }

    fn __repr__(&mut self, py: Python<'_>) -> PyResult<String> {
        let d = self.energy_dict(py)?;
        let mut s = format!(
            "Measurement(time={}, energy={}",
            crate::monitor::counter::py_float(self.time),
            d.repr()?
        );
        if let Some(c) = &self.cpu_energy {
            s.push_str(&format!(", cpu_energy={}", c.bind(py).repr()?));
        }
        if let Some(m) = &self.dram_energy {
            s.push_str(&format!(", dram_energy={}", m.bind(py).repr()?));
        }
        let b = self.gpu_energy_uncertainty(py)?;
        if !b.is_empty() {
            s.push_str(&format!(", gpu_energy_uncertainty={}", b.repr()?));
        }
        s.push(')');
        Ok(s)
    }

    fn __eq__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Ok(other) = other.cast::<PyMeasurement>() else {
            return Ok(false);
        };
        if slf.is(other) {
            return Ok(true);
        }
        let py = slf.py();
        // Borrow one side at a time: both may be the same object behind different references.
        let side = |m: &Bound<'_, PyMeasurement>| -> PyResult<_> {
            let mut m = m.try_borrow_mut()?;
            let opt = |d: &Option<Py<PyDict>>| d.as_ref().map(|d| d.clone_ref(py).into_any());
            Ok((
                m.time,
                m.energy_dict(py)?,
                opt(&m.cpu_energy).into_pyobject(py)?.unbind(),
                opt(&m.dram_energy).into_pyobject(py)?.unbind(),
            ))
        };
        let (t1, d1, c1, m1) = side(slf)?;
        let (t2, d2, c2, m2) = side(other)?;
        Ok(t1 == t2 && d1.eq(d2)? && c1.bind(py).eq(c2)? && m1.bind(py).eq(m2)?)
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let mut m = slf.try_borrow_mut()?;
        let d = m.energy_dict(py)?;
        let b = m.gpu_energy_uncertainty(py)?;
        let p = m.gpu_energy_provenance(py)?;
        let opt = |d: &Option<Py<PyDict>>| -> PyResult<Bound<'py, PyAny>> {
            Ok(d.as_ref()
                .map(|d| d.clone_ref(py).into_bound(py).into_any())
                .into_pyobject(py)?
                .into_any())
        };
        let args = PyTuple::new(
            py,
            [
                m.time.into_pyobject(py)?.into_any(),
                d.into_any(),
                opt(&m.cpu_energy)?,
                opt(&m.dram_energy)?,
                b.into_any(),
                opt(&m.cpu_energy_uncertainty)?,
                opt(&m.dram_energy_uncertainty)?,
                p.into_any(),
            ],
        )?;
        Ok((slf.get_type().into_any(), args))
    }
}

pub(super) fn make_measurement(
    py: Python<'_>,
    m: crate::monitor::Measurement,
) -> PyResult<Py<PyMeasurement>> {
    Py::new(
        py,
        PyMeasurement {
            time: m.time,
            values: m.energy,
            dict: None,
            cpu_energy: to_dict(py, m.cpu_energy)?,
            dram_energy: to_dict(py, m.dram_energy)?,
            bounds: m.energy_bound,
            bounds_dict: None,
            provenance: m
                .provenance
                .iter()
                .map(|(i, p)| (*i, PyProvenance::from(p)))
                .collect(),
            provenance_dict: None,
            cpu_energy_uncertainty: to_dict(py, m.cpu_bound)?,
            dram_energy_uncertainty: to_dict(py, m.dram_bound)?,
        },
    )
}
