//! A device that the checks made when the GPUs are opened changed: its energy counter
//! disabled (`counter_check.rs`), or its power derived from that counter (`derived_power.rs`).
//! Everything else passes through to the backend's device; this is the one place that
//! forwards the `Gpu` trait.

use std::sync::Arc;

use super::derived_power::{is_powerless, DerivedPower, MIN_SPAN_S};
use super::{
    Architecture, Clock, Gpu, GpuError, GpuResult, MemoryInfo, PowerSample, Utilization, Vendor,
};

/// Give every device that [`is_powerless`] a derived power ([`Change::PowerFromCounter`]);
/// `notes` gets a line for each.
pub fn wrap_powerless(
    devices: Vec<Arc<dyn Gpu>>,
    clock: Arc<dyn Clock>,
    notes: &mut Vec<String>,
) -> Vec<Arc<dyn Gpu>> {
    devices
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            if !is_powerless(d.as_ref()) {
                return d;
            }
            let name = d.name().unwrap_or_else(|_| "?".into());
            notes.push(format!(
                "GPU {i} ({name}) reports no power: its power is derived from its energy counter \
                 (over {:.0} ms stretches), and the counter cannot be checked against power",
                MIN_SPAN_S * 1000.0
            ));
            let change = Change::PowerFromCounter(DerivedPower::new(clock.clone()));
            Arc::new(Adjusted::new(d, change)) as Arc<dyn Gpu>
        })
        .collect()
}

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
            Some(_) => Some(MIN_SPAN_S),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{preset, BoardKnobs, Fidelity, Load, SimCluster, SimConfig};

    #[test]
    fn a_board_without_power_gets_it_from_its_counter() {
        let c = SimCluster::new(SimConfig {
            presets: vec![preset::find("MI300X").unwrap()],
            load: Load::Busy,
            fidelity: Fidelity::Real,
            board: BoardKnobs {
                instant_power: Some(false),
                ..BoardKnobs::default()
            },
            ..SimConfig::default()
        });
        let mut notes = Vec::new();
        let devs = wrap_powerless(c.gpu_devices(), c.clock(), &mut notes);
        assert!(notes[0].contains("reports no power"), "{notes:?}");
        let truth = c.devices()[0].true_power_w();
        let mw = devs[0].average_power_usage().unwrap();
        // The counter's 1 ms updates over a >= 5 ms stretch: within a fifth.
        let w = f64::from(mw) / 1000.0;
        assert!((w - truth).abs() < 0.2 * truth, "{w} W vs {truth} W");
        assert!(devs[0].instant_power_usage().is_err());
        assert_eq!(devs[0].power_update_period(), Some(MIN_SPAN_S));
    }

    #[test]
    fn boards_with_power_are_left_alone() {
        let c = SimCluster::new(SimConfig {
            presets: vec![
                preset::find("MI300X").unwrap(),
                preset::find("A40").unwrap(),
            ],
            ..SimConfig::default()
        });
        let mut notes = Vec::new();
        let devs = wrap_powerless(c.gpu_devices(), c.clock(), &mut notes);
        assert!(notes.is_empty());
        assert!(devs[0].instant_power_usage().is_ok());
    }
}
