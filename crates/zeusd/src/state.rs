//! What every handler shares: the GPUs, the sampler's energy cache, the clients' holds, the
//! CPUs, the enabled groups and the token key.

use std::sync::Arc;

use axum::http::StatusCode;
use tokio::sync::watch;
use zeus_core::device::cpu::Cpus;
use zeus_core::device::Gpus;
use zeus_core::monitor::sampler::{Sampler, ZoneLease};

use crate::api::{ApiError, Group};
use crate::owners::Clients;
use crate::token::Signer;

/// What every handler shares.
pub struct App {
    pub gpus: Gpus,
    /// The sampler's cache of the GPUs with an energy counter (gpu-read enabled).
    pub energy: Option<EnergyCache>,
    /// Who holds which setting; every power-limit and clock write goes through it.
    pub clients: Clients,
    pub cpus: CpuState,
    pub enabled: Vec<Group>,
    /// `Some` when auth is on.
    pub signer: Option<Signer>,
    pub gpu_stream_period: std::time::Duration,
    pub cpu_stream_period: std::time::Duration,
    /// Becomes true at shutdown; streams end on it so graceful shutdown is not held up.
    pub stopping: watch::Receiver<bool>,
}

pub type Shared = Arc<App>;

/// GPUs leased from the process's energy sampler, and what each has served.
pub struct EnergyCache {
    lease: zeus_core::monitor::sampler::Lease,
    /// Daemon GPU index of each leased GPU, in lease order.
    indices: Vec<usize>,
    served: Vec<zeus_core::monitor::sampler::ServedEnergy>,
}

impl EnergyCache {
    pub fn new(lease: zeus_core::monitor::sampler::Lease, indices: Vec<usize>) -> EnergyCache {
        let served = indices
            .iter()
            .map(|_| zeus_core::monitor::sampler::ServedEnergy::new())
            .collect();
        EnergyCache {
            lease,
            indices,
            served,
        }
    }

    /// GPU `index`'s cumulative energy now (mJ) and how far it may be from the energy at this
    /// moment (mJ, a 95% bound), from the cache, if it has one yet and its model fits the board
    /// (else the caller reads the counter).
    pub fn energy_mj(&self, index: usize, now: f64) -> Option<(u64, u64)> {
        use zeus_core::monitor::sampler::Mode;
        let k = self.indices.iter().position(|&i| i == index)?;
        if !self.lease.is_current() || !self.lease.sampler_running() {
            return None;
        }
        let edge = self.lease.watched(k).with_track(|t| {
            (t.mode() == Mode::Cached && t.power_down_since().is_none())
                .then(|| t.edge(now))
                .flatten()
        })?;
        let (j, bound) = self.served[k].serve_bounded(&edge);
        Some(((j * 1000.0).round() as u64, (bound * 1000.0).ceil() as u64))
    }
}

/// The CPUs the daemon serves.
pub enum CpuState {
    /// RAPL is present; every zone is leased.
    Ready { cpus: Cpus, _lease: ZoneLease },
    /// cpu-read is on by default but RAPL is not usable here: why.
    Missing(String),
    /// cpu-read is not enabled.
    Off,
}

impl CpuState {
    /// Open RAPL (or the simulated CPUs) and lease every zone.
    pub fn open() -> Result<CpuState, String> {
        let cpus = Cpus::from_env().map_err(|e| e.to_string())?;
        let zones = cpus.zones(&cpus.all_indices()).map_err(|e| e.to_string())?;
        let lease = Sampler::lease_zones(&zones)
            .map_err(|e| format!("cannot start the RAPL sampler thread: {e}"))?;
        Ok(CpuState::Ready {
            cpus,
            _lease: lease,
        })
    }

    /// The packages, or the error every /cpu path answers with.
    pub fn cpus(&self) -> Result<&Cpus, ApiError> {
        match self {
            CpuState::Ready { cpus, .. } => Ok(cpus),
            CpuState::Missing(why) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("RAPL is missing on this machine, no CPU energy to serve: {why}"),
            )),
            CpuState::Off => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "API group cpu-read is disabled on this daemon",
            )),
        }
    }
}
