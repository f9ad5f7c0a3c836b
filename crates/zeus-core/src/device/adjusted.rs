//! A device that the checks made when the GPUs are opened changed: its energy counter
//! disabled (`counter_check.rs`), or its power derived from that counter (`derived_power.rs`).
//! Everything else passes through to the backend's device; this is the one place that
//! forwards the `Gpu` trait.

use std::sync::Arc;

use super::derived_power::DerivedPower;
use super::{Architecture, Gpu, GpuError, GpuResult, MemoryInfo, PowerSample, Utilization, Vendor};

/// What the checks changed.
pub enum Change {
    /// The counter failed the start check, for this reason: no counter, power integration.
    CounterOff(String),
    /// The board reports no power: "average power" is derived from the counter.
    PowerFromCounter(DerivedPower),
}

/// A device with one [`Change`].
pub struct Adjusted {
    inner: Arc<dyn Gpu>,
    change: Change,
}

impl Adjusted {
    pub fn new(inner: Arc<dyn Gpu>, change: Change) -> Adjusted {
        Adjusted { inner, change }
    }

    fn derived(&self) -> Option<&DerivedPower> {
        match &self.change {
            Change::PowerFromCounter(d) => Some(d),
            Change::CounterOff(_) => None,
        }
    }
}

impl Gpu for Adjusted {
    fn name(&self) -> GpuResult<String> {
        self.inner.name()
    }
    fn vendor(&self) -> Vendor {
        self.inner.vendor()
    }
    fn uuid(&self) -> GpuResult<String> {
        self.inner.uuid()
    }
    fn architecture(&self) -> GpuResult<Architecture> {
        self.inner.architecture()
    }
    fn power_management_limit_constraints(&self) -> GpuResult<(u32, u32)> {
        self.inner.power_management_limit_constraints()
    }
    fn power_management_limit_default(&self) -> GpuResult<u32> {
        self.inner.power_management_limit_default()
    }
    fn power_management_limit(&self) -> GpuResult<u32> {
        self.inner.power_management_limit()
    }
    fn set_power_management_limit(&self, milliwatts: u32) -> GpuResult<()> {
        self.inner.set_power_management_limit(milliwatts)
    }
    fn reset_power_management_limit(&self) -> GpuResult<()> {
        self.inner.reset_power_management_limit()
    }
    fn persistence_mode(&self) -> GpuResult<bool> {
        self.inner.persistence_mode()
    }
    fn set_persistence_mode(&self, enabled: bool) -> GpuResult<()> {
        self.inner.set_persistence_mode(enabled)
    }
    fn supported_memory_clocks(&self) -> GpuResult<Vec<u32>> {
        self.inner.supported_memory_clocks()
    }
    fn supported_graphics_clocks(&self, memory_clock_mhz: u32) -> GpuResult<Vec<u32>> {
        self.inner.supported_graphics_clocks(memory_clock_mhz)
    }
    fn set_gpu_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        self.inner.set_gpu_locked_clocks(min_mhz, max_mhz)
    }
    fn reset_gpu_locked_clocks(&self) -> GpuResult<()> {
        self.inner.reset_gpu_locked_clocks()
    }
    fn set_memory_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        self.inner.set_memory_locked_clocks(min_mhz, max_mhz)
    }
    fn reset_memory_locked_clocks(&self) -> GpuResult<()> {
        self.inner.reset_memory_locked_clocks()
    }
    fn average_power_usage(&self) -> GpuResult<u32> {
        match self.derived() {
            Some(d) => d.milliwatts(self.inner.as_ref()),
            None => self.inner.average_power_usage(),
        }
    }
    fn instant_power_usage(&self) -> GpuResult<u32> {
        match self.derived() {
            Some(_) => Err(GpuError::NotSupported(
                "instant power: this board reports none (its power is derived from the counter)"
                    .into(),
            )),
            None => self.inner.instant_power_usage(),
        }
    }
    fn power_sample(&self, instant: bool) -> GpuResult<PowerSample> {
        match self.derived() {
            None => self.inner.power_sample(instant),
            Some(_) => super::untimed_sample(self, instant),
        }
    }
    fn supports_total_energy_consumption(&self) -> GpuResult<bool> {
        match &self.change {
            Change::CounterOff(_) => Ok(false),
            Change::PowerFromCounter(_) => self.inner.supports_total_energy_consumption(),
        }
    }
    fn total_energy_consumption(&self) -> GpuResult<u64> {
        match &self.change {
            Change::CounterOff(why) => Err(GpuError::NotSupported(format!(
                "energy counter disabled at start: {why}"
            ))),
            Change::PowerFromCounter(_) => self.inner.total_energy_consumption(),
        }
    }
    fn counter_is_exact(&self) -> Option<bool> {
        self.inner.counter_is_exact()
    }
    fn counter_lag(&self) -> Option<f64> {
        self.inner.counter_lag()
    }
    fn power_from_counter(&self) -> bool {
        self.derived().is_some()
    }
    fn power_update_period(&self) -> Option<f64> {
        match self.derived() {
            Some(_) => Some(super::derived_power::MIN_SPAN_S),
            None => self.inner.power_update_period(),
        }
    }
    fn pci_bus_id(&self) -> GpuResult<String> {
        self.inner.pci_bus_id()
    }
    fn current_clocks_mhz(&self) -> GpuResult<(u32, u32)> {
        self.inner.current_clocks_mhz()
    }
    fn temperature_c(&self) -> GpuResult<u32> {
        self.inner.temperature_c()
    }
    fn memory_info(&self) -> GpuResult<MemoryInfo> {
        self.inner.memory_info()
    }
    fn utilization_rates(&self) -> GpuResult<Utilization> {
        self.inner.utilization_rates()
    }
}
