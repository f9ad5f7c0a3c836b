//! Energy and power measurement: window bookkeeping, counter arithmetic, the power sampler.
//!
//! - [`energy`]: [`EnergyMonitor`], the measurement windows of `zeus.monitor.ZeusMonitor`.
//!   Energy per GPU comes from the driver's total-energy counter where the GPU has one (Volta and
//!   newer), else from integrating a [`PowerMonitor`] timeline (pre-Volta).
//! - [`power`]: [`PowerMonitor`], a background thread that samples power into a bounded
//!   [`Timeline`](timeline::Timeline), and counter update-period detection.
//! - [`counter`]: modular arithmetic on energy counters and the CSV float format.
//! - [`temperature`]: [`TemperatureMonitor`], GPU temperature from the shared sampler.
//! - [`power_log`]: the one power-log schema (CSV and JSON lines) of both power loggers.
//!
//! Every timestamp comes from the backend clock ([`Gpus::now`](crate::device::Gpus::now)), so
//! the simulator's virtual clock drives measurements deterministically.

pub mod counter;
pub mod energy;
pub mod error;
pub mod power;
pub mod power_log;
pub mod provenance;
pub mod sampler;
pub mod serving;
pub mod stop;
pub mod temperature;
pub mod timeline;

pub use energy::{EnergyMonitor, InstantPower, Measurement, ReadMode, WindowEnd};
pub use error::{MonitorError, MonitorResult};
pub use power::{infer_counter_update_period, PowerDomain, PowerMonitor, PowerMonitorOptions};
pub use provenance::{Method, Provenance};
pub use temperature::TemperatureMonitor;
pub use timeline::Timeline;
