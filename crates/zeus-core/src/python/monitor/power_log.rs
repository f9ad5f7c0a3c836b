//! `zeus._core.PowerLog`: the one power-log schema (`crate::monitor::power_log`), for
//! `python -m zeus.monitor power`, which logs what `zeus-monitor` logs.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::monitor::power_log::{split_seconds, PowerLog, PowerLogFormat};

/// The lines of one power log: `format` is `"csv"` or `"jsonl"`; columns follow `gpu_indices`.
#[pyclass(name = "PowerLog", module = "zeus._core.monitor", frozen)]
pub(crate) struct PyPowerLog {
    inner: PowerLog,
}

#[pymethods]
impl PyPowerLog {
    #[new]
    #[pyo3(signature = (format, gpu_indices, energy = false))]
    fn new(format: &str, gpu_indices: Vec<usize>, energy: bool) -> PyResult<Self> {
        let format = match format {
            "csv" => PowerLogFormat::Csv,
            "jsonl" => PowerLogFormat::Jsonl,
            other => {
                return Err(PyValueError::new_err(format!(
                    "power log format must be 'csv' or 'jsonl', got {other:?}"
                )))
            }
        };
        Ok(PyPowerLog {
            inner: PowerLog::new(format, gpu_indices, energy),
        })
    }

    /// The CSV header line (no newline); None for JSON lines.
    #[getter]
    fn header(&self) -> Option<String> {
        self.inner.header()
    }

    /// The line (no newline) of a sample at UNIX time `unix_time`: power in mW per GPU and,
    /// when the log has energy columns, energy in mJ.
    #[pyo3(signature = (unix_time, power_mw, energy_mj = Vec::new()))]
    fn row(&self, unix_time: f64, power_mw: Vec<u32>, energy_mj: Vec<u64>) -> PyResult<String> {
        if !unix_time.is_finite() {
            return Err(PyValueError::new_err(format!(
                "unix_time must be a finite number of seconds, got {unix_time}"
            )));
        }
        let mut line = String::new();
        self.inner
            .write_row(&mut line, split_seconds(unix_time), &power_mw, &energy_mj);
        Ok(line)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPowerLog>()
}
