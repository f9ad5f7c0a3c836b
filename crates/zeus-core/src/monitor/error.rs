//! Errors of the measurement layer.

use crate::device::cpu::CpuError;
use crate::device::GpuError;

/// What can go wrong while measuring.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// A bad argument from the caller (unknown window, duplicate key, bad index or period).
    /// Python sees `ValueError`.
    #[error("{0}")]
    InvalidArg(String),
    /// The device failed; Python sees the `zeus.device.exception` class of the same name.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// A RAPL zone failed; Python sees the `zeus.device.cpu` class of the same name.
    #[error(transparent)]
    Cpu(#[from] CpuError),
    /// A background sampling stopped on an error; Python sees `RuntimeError`.
    #[error("{0}")]
    Stopped(String),
    /// Writing the log file failed; Python sees `OSError`.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type MonitorResult<T> = Result<T, MonitorError>;
