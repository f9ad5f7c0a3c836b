//! Typed CPU (RAPL) errors. Each variant names the Python class it becomes
//! (`zeus.device.cpu`, Zeus 0.16's names where Zeus has one).

use std::path::{Path, PathBuf};

use thiserror::Error;

/// An error from discovering or reading RAPL zones.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CpuError {
    /// No RAPL package zone under the searched directory.
    #[error(
        "RAPL is not available: no package zone (intel-rapl:N or amd-rapl:N whose name is \
         package-N) under {searched}. Virtual machines and containers often do not expose \
         /sys/class/powercap; on bare metal load the intel_rapl_common (or amd_energy) kernel \
         module. A container can mount the host's /sys/class/powercap and point ZEUS_RAPL_ROOT \
         at it."
    )]
    NotSupported { searched: PathBuf },
    /// `energy_uj` exists but this process may not read it (Linux 5.10+ makes it root-only).
    #[error(
        "Permission denied reading the RAPL energy counter {path}. Fixes: run as root; or make \
         the counters readable, e.g. `sudo chmod a+r {path}` now, or for every boot a udev rule \
         such as `SUBSYSTEM==\"powercap\", ACTION==\"add\", RUN+=\"/bin/chmod a+r /sys%p/energy_uj\"` \
         in /etc/udev/rules.d/; or, in a container, mount a readable copy of the host's \
         powercap tree and set ZEUS_RAPL_ROOT to it."
    )]
    Permission { path: PathBuf },
    /// A RAPL file could not be read or did not hold what it should.
    #[error("{0}")]
    File(String),
    /// A bad package index or configuration value.
    #[error("{0}")]
    InvalidArg(String),
}

/// Result alias for CPU calls.
pub type CpuResult<T> = Result<T, CpuError>;

impl CpuError {
    /// The Python class this error becomes (defined in `zeus.device.cpu`).
    pub fn class_name(&self) -> &'static str {
        match self {
            CpuError::NotSupported { .. } => "ZeusRAPLNotSupportedError",
            CpuError::Permission { .. } => "ZeusRAPLPermissionError",
            CpuError::File(_) => "ZeusRAPLFileInitError",
            CpuError::InvalidArg(_) => "ZeusCPUNotFoundError",
        }
    }

    /// Map an I/O error on `path`: permission denied becomes [`CpuError::Permission`] naming
    /// the file, anything else a [`CpuError::File`] naming it.
    pub fn from_io(path: &Path, e: &std::io::Error) -> CpuError {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            CpuError::Permission {
                path: path.to_path_buf(),
            }
        } else {
            CpuError::File(format!("cannot read RAPL file {}: {e}", path.display()))
        }
    }
}
