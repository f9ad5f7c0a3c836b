//! The CPU device layer: package and DRAM energy from RAPL (Linux powercap sysfs).
//!
//! [`Cpus`] holds the packages found under the powercap root: `ZEUS_RAPL_ROOT` if set, else
//! `/sys/class/powercap`; with `ZEUS_SIM_CPUS=N`, the tree of the simulated CPUs ([`sim`]).
//! Each zone ([`RaplZone`]) keeps a cumulative, unwrapped energy shared by every reader in the
//! process; the shared sampler thread reads every leased zone often enough that no counter
//! wrap is missed ([`crate::monitor::sampler::Sampler::lease_zones`]).
//!
//! Reading cumulative joules per package (what an exporter needs):
//!
//! ```ignore
//! let cpus = Cpus::from_env()?;                       // the process-wide packages
//! let _lease = Sampler::lease_zones(&cpus.zones(&cpus.all_indices())?)?; // keep unwrapping
//! for p in cpus.packages() {
//!     let package_j = p.package.energy_j()?;          // read now, unwrapped, J
//!     let dram_j = p.dram.as_ref().map(|d| d.energy_j()).transpose()?;
//! }
//! ```

pub mod error;
pub mod rapl;
pub mod sim;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use error::{CpuError, CpuResult};
pub use rapl::{CpuPackage, RaplZone, Unwrapper, ZoneKind};

/// Default powercap root.
pub const DEFAULT_RAPL_ROOT: &str = "/sys/class/powercap";

/// The CPU packages of this machine (or of the simulator), addressed by index.
#[derive(Debug, Clone)]
pub struct Cpus {
    root: PathBuf,
    packages: Vec<CpuPackage>,
    simulated: Option<Arc<sim::SimRapl>>,
}

static GLOBAL: Mutex<Option<Cpus>> = Mutex::new(None);

impl Cpus {
    /// The process-wide packages: opened on first success and shared after, so every user of
    /// the process unwraps the same counters. `ZEUS_SIM_CPUS=N` opts in to the simulated
    /// CPUs (never a silent substitute); otherwise the root is `ZEUS_RAPL_ROOT` or
    /// `/sys/class/powercap`.
    pub fn from_env() -> CpuResult<Cpus> {
        let mut g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = g.as_ref() {
            return Ok(c.clone());
        }
        let cpus = match sim::global()? {
            Some(s) => {
                let mut c = Cpus::open(s.dir())?;
                c.simulated = Some(s);
                c
            }
            None => {
                let root = std::env::var_os("ZEUS_RAPL_ROOT")
                    .filter(|v| !v.is_empty())
                    .map_or_else(|| PathBuf::from(DEFAULT_RAPL_ROOT), PathBuf::from);
                Cpus::open(&root)?
            }
        };
        *g = Some(cpus.clone());
        Ok(cpus)
    }

    /// Discover the packages under `root` (fresh zones, not shared with [`Cpus::from_env`]).
    pub fn open(root: &Path) -> CpuResult<Cpus> {
        Ok(Cpus {
            root: root.to_path_buf(),
            packages: rapl::discover(root)?,
            simulated: None,
        })
    }

    /// The powercap root searched.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The simulator behind these CPUs, if they are simulated.
    pub fn simulator(&self) -> Option<&Arc<sim::SimRapl>> {
        self.simulated.as_ref()
    }

    /// `"Simulated RAPL"` or `"RAPL"`.
    pub fn backend_name(&self) -> &'static str {
        if self.simulated.is_some() {
            "Simulated RAPL"
        } else {
            "RAPL"
        }
    }

    pub fn len(&self) -> usize {
        self.packages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packages.is_empty()
    }

    pub fn packages(&self) -> &[CpuPackage] {
        &self.packages
    }

    /// `0..len()`.
    pub fn all_indices(&self) -> Vec<usize> {
        (0..self.packages.len()).collect()
    }

    /// Package `index`.
    pub fn package(&self, index: usize) -> CpuResult<&CpuPackage> {
        self.packages.get(index).ok_or_else(|| {
            CpuError::InvalidArg(format!(
                "CPU index {index} is out of range: {} CPU package(s) found under {}",
                self.packages.len(),
                self.root.display()
            ))
        })
    }

    /// Every zone of the given packages, package zone then DRAM zone (where present).
    pub fn zones(&self, indices: &[usize]) -> CpuResult<Vec<Arc<RaplZone>>> {
        let mut out = Vec::new();
        for &i in indices {
            let p = self.package(i)?;
            out.push(p.package.clone());
            out.extend(p.dram.clone());
        }
        Ok(out)
    }

    /// Check `indices` name distinct packages.
    pub fn check_indices(&self, indices: &[usize]) -> CpuResult<()> {
        for (k, &i) in indices.iter().enumerate() {
            self.package(i)?;
            if indices[..k].contains(&i) {
                return Err(CpuError::InvalidArg(format!(
                    "CPU index {i} appears twice in cpu_indices {indices:?}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
