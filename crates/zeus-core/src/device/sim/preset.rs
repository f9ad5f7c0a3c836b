//! GPU models the simulator knows. Figures are the boards' published ranges: power-limit range
//! and default (what `nvidia-smi -q -d POWER` shows on them), idle draw, memory clock and the
//! graphics clock table (min to max in the driver's step).
//!
//! Driver timing (used with real fidelity): measured on an H100 80GB HBM3 with driver 580, the
//! energy counter and both power readings change every 100 ms, the counter 10-25 ms after the
//! power readings, an energy read costs 3.5-6 ms of CPU and a power read about 1 µs. The H100
//! preset uses those figures (the lower read cost). Not measured here, and so assumptions: the
//! same read costs and counter delay on every board; a 100 ms update on the A40 and A100 (as
//! published for the A100), 20 ms on the V100 and P100, whose power reading is instantaneous
//! (NVML: "On Ampere (except GA100) or newer GPUs, the API returns power averaged over 1 sec
//! interval. On GA100 and older architectures, instantaneous power is returned").

use super::super::{Architecture, Vendor};

/// A simulated GPU model.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// Short name used in `ZEUS_SIM_GPUS` (e.g. `"A40"`).
    pub key: &'static str,
    /// Marketing name; the device's name is this plus `" (Simulated)"`.
    pub name: &'static str,
    /// Whose board it is: which driver library speaks for it (NVML or amdsmi).
    pub vendor: Vendor,
    /// Dies that enumerate as separate GPUs (2 on the MI250X, whose odd die reports no power:
    /// its power and energy are in the even die's readings). `ZEUS_SIM_GPUS=MI250X` makes both.
    pub dies: usize,
    pub architecture: Architecture,
    pub min_power_limit_mw: u32,
    pub max_power_limit_mw: u32,
    pub default_power_limit_mw: u32,
    pub idle_power_mw: u32,
    /// Supported memory clocks, MHz, highest first (NVML's order).
    pub memory_clocks_mhz: &'static [u32],
    pub min_graphics_clock_mhz: u32,
    pub max_graphics_clock_mhz: u32,
    pub graphics_clock_step_mhz: u32,
    /// Whether `nvmlDeviceGetTotalEnergyConsumption` works (Volta and newer).
    pub energy_counter: bool,
    /// Whether the instantaneous power field exists (Ampere and newer here; amdsmi's
    /// `current_socket_power`, MI300 and later).
    pub instant_power: bool,
    /// Whether the driver's averaged power exists (every NVIDIA board; amdsmi's
    /// `average_socket_power`, MI200 and earlier).
    pub average_power: bool,
    /// The energy counter's unit, µJ: 1000 for NVML's mJ, 15.3 for amdsmi's accumulator
    /// (`counter_resolution`, as observed on MI100 and MI2xx).
    pub counter_unit_uj: f64,
    /// How often the driver refreshes the energy counter and both power readings, seconds.
    pub power_update_period_s: f64,
    /// How long after an update the energy counter shows it, seconds.
    pub counter_delay_s: f64,
    /// The trailing window `nvmlDeviceGetPowerUsage` averages over, seconds (0: it returns the
    /// instantaneous sample, as on boards before Ampere and the GA100).
    pub average_window_s: f64,
    /// Busy CPU time one `nvmlDeviceGetTotalEnergyConsumption` call costs, seconds.
    pub energy_read_cost_s: f64,
    /// Busy CPU time one power read costs, seconds.
    pub power_read_cost_s: f64,
    /// Device memory, MiB.
    pub memory_mib: u64,
    /// PCI device id (`nvmlPciInfo_t.pciDeviceId`: device << 16 | vendor 0x10DE).
    pub pci_device_id: u32,
    /// PCIe generation and lanes of the board's link.
    pub pcie: (u32, u32),
    /// The built-in workload the board runs unless `ZEUS_SIM_WORKLOAD` says otherwise (`None`:
    /// the A40 trace's median curve scaled to the board).
    pub default_workload: Option<&'static str>,
}

impl Preset {
    /// Supported graphics clocks, highest first.
    pub fn graphics_clocks_mhz(&self) -> Vec<u32> {
        let mut v: Vec<u32> = (0..)
            .map(|k| self.max_graphics_clock_mhz - k * self.graphics_clock_step_mhz)
            .take_while(|&f| f >= self.min_graphics_clock_mhz)
            .collect();
        if v.last() != Some(&self.min_graphics_clock_mhz) {
            v.push(self.min_graphics_clock_mhz);
        }
        v
    }
}

pub const PRESETS: &[Preset] = &[
    Preset {
        key: "P100",
        name: "Tesla P100-PCIE-16GB",
        vendor: Vendor::Nvidia,
        dies: 1,
        architecture: Architecture::Pascal,
        min_power_limit_mw: 125_000,
        max_power_limit_mw: 250_000,
        default_power_limit_mw: 250_000,
        idle_power_mw: 30_000,
        memory_clocks_mhz: &[715],
        min_graphics_clock_mhz: 544,
        max_graphics_clock_mhz: 1328,
        graphics_clock_step_mhz: 13,
        energy_counter: false,
        instant_power: false,
        power_update_period_s: 0.020,
        counter_delay_s: 0.015,
        average_power: true,
        counter_unit_uj: 1000.0,
        average_window_s: 0.0,
        energy_read_cost_s: 3.5e-3,
        power_read_cost_s: 1e-6,
        memory_mib: 16384,
        pci_device_id: 0x15F810DE,
        pcie: (3, 16),
        default_workload: None,
    },
    Preset {
        key: "V100",
        name: "Tesla V100-PCIE-32GB",
        vendor: Vendor::Nvidia,
        dies: 1,
        architecture: Architecture::Volta,
        min_power_limit_mw: 100_000,
        max_power_limit_mw: 250_000,
        default_power_limit_mw: 250_000,
        idle_power_mw: 25_000,
        memory_clocks_mhz: &[877],
        min_graphics_clock_mhz: 135,
        max_graphics_clock_mhz: 1380,
        graphics_clock_step_mhz: 15,
        energy_counter: true,
        instant_power: false,
        power_update_period_s: 0.020,
        counter_delay_s: 0.015,
        average_power: true,
        counter_unit_uj: 1000.0,
        average_window_s: 0.0,
        energy_read_cost_s: 3.5e-3,
        power_read_cost_s: 1e-6,
        memory_mib: 32768,
        pci_device_id: 0x1DB610DE,
        pcie: (3, 16),
        default_workload: None,
    },
    Preset {
        key: "A40",
        name: "NVIDIA A40",
        vendor: Vendor::Nvidia,
        dies: 1,
        architecture: Architecture::Ampere,
        min_power_limit_mw: 100_000,
        max_power_limit_mw: 300_000,
        default_power_limit_mw: 300_000,
        idle_power_mw: 30_000,
        memory_clocks_mhz: &[7251, 5001, 810, 405],
        min_graphics_clock_mhz: 210,
        max_graphics_clock_mhz: 1740,
        graphics_clock_step_mhz: 15,
        energy_counter: true,
        instant_power: true,
        power_update_period_s: 0.100,
        counter_delay_s: 0.015,
        average_power: true,
        counter_unit_uj: 1000.0,
        average_window_s: 1.0,
        energy_read_cost_s: 3.5e-3,
        power_read_cost_s: 1e-6,
        memory_mib: 46068,
        pci_device_id: 0x223510DE,
        pcie: (4, 16),
        default_workload: None,
    },
    Preset {
        key: "A100",
        name: "NVIDIA A100-SXM4-40GB",
        vendor: Vendor::Nvidia,
        dies: 1,
        architecture: Architecture::Ampere,
        min_power_limit_mw: 100_000,
        max_power_limit_mw: 400_000,
        default_power_limit_mw: 400_000,
        idle_power_mw: 55_000,
        memory_clocks_mhz: &[1215],
        min_graphics_clock_mhz: 210,
        max_graphics_clock_mhz: 1410,
        graphics_clock_step_mhz: 15,
        energy_counter: true,
        instant_power: true,
        power_update_period_s: 0.100,
        counter_delay_s: 0.015,
        average_power: true,
        counter_unit_uj: 1000.0,
        average_window_s: 0.0,
        energy_read_cost_s: 3.5e-3,
        power_read_cost_s: 1e-6,
        memory_mib: 40960,
        pci_device_id: 0x20B010DE,
        pcie: (4, 16),
        default_workload: None,
    },
    Preset {
        key: "H100",
        name: "NVIDIA H100 80GB HBM3",
        vendor: Vendor::Nvidia,
        dies: 1,
        architecture: Architecture::Hopper,
        min_power_limit_mw: 200_000,
        max_power_limit_mw: 700_000,
        default_power_limit_mw: 700_000,
        idle_power_mw: 70_000,
        memory_clocks_mhz: &[2619],
        min_graphics_clock_mhz: 345,
        max_graphics_clock_mhz: 1980,
        graphics_clock_step_mhz: 15,
        energy_counter: true,
        instant_power: true,
        power_update_period_s: 0.100,
        counter_delay_s: 0.015,
        average_power: true,
        counter_unit_uj: 1000.0,
        average_window_s: 1.0,
        energy_read_cost_s: 3.5e-3,
        power_read_cost_s: 1e-6,
        memory_mib: 81559,
        pci_device_id: 0x233010DE,
        pcie: (5, 16),
        default_workload: Some("bert_train_step"),
    },
    // AMD Instinct boards, read through amdsmi. Published: power caps (MI300X 750 W OAM, MI250X
    // 560 W OAM for its two dies, MI210 300 W PCIe), memory, clocks, PCI ids (vendor 0x1002).
    // Which power reading each has (MI300X `current_socket_power`, MI2xx
    // `average_socket_power`) and the counter's 15.3 µJ unit are from AMD's docs and issue
    // trackers. Not measured, and so assumptions: both readings and the counter refresh every
    // millisecond (the driver caches reads for 1 ms), with no lag between them, and a read of
    // either costs 50 µs of CPU (one pass over the GPU metrics table). The MI250X preset is one
    // die, with half the package's power range.
    Preset {
        key: "MI300X",
        name: "AMD Instinct MI300X",
        vendor: Vendor::Amd,
        dies: 1,
        architecture: Architecture::Cdna3,
        min_power_limit_mw: 200_000,
        max_power_limit_mw: 750_000,
        default_power_limit_mw: 750_000,
        idle_power_mw: 140_000,
        memory_clocks_mhz: &[1300],
        min_graphics_clock_mhz: 500,
        max_graphics_clock_mhz: 2100,
        graphics_clock_step_mhz: 100,
        energy_counter: true,
        instant_power: true,
        power_update_period_s: 0.001,
        counter_delay_s: 0.0,
        average_power: false,
        counter_unit_uj: 15.3,
        average_window_s: 0.0,
        energy_read_cost_s: 50e-6,
        power_read_cost_s: 50e-6,
        memory_mib: 196_608,
        pci_device_id: 0x74A1_1002,
        pcie: (5, 16),
        default_workload: None,
    },
    Preset {
        key: "MI250X",
        name: "AMD Instinct MI250X",
        vendor: Vendor::Amd,
        dies: 2,
        architecture: Architecture::Cdna2,
        min_power_limit_mw: 100_000,
        max_power_limit_mw: 280_000,
        default_power_limit_mw: 280_000,
        idle_power_mw: 45_000,
        memory_clocks_mhz: &[1600],
        min_graphics_clock_mhz: 500,
        max_graphics_clock_mhz: 1700,
        graphics_clock_step_mhz: 100,
        energy_counter: true,
        instant_power: false,
        power_update_period_s: 0.001,
        counter_delay_s: 0.0,
        average_power: true,
        counter_unit_uj: 15.3,
        average_window_s: 0.0,
        energy_read_cost_s: 50e-6,
        power_read_cost_s: 50e-6,
        memory_mib: 65_536,
        pci_device_id: 0x740C_1002,
        pcie: (4, 16),
        default_workload: None,
    },
    Preset {
        key: "MI210",
        name: "AMD Instinct MI210",
        vendor: Vendor::Amd,
        dies: 1,
        architecture: Architecture::Cdna2,
        min_power_limit_mw: 100_000,
        max_power_limit_mw: 300_000,
        default_power_limit_mw: 300_000,
        idle_power_mw: 40_000,
        memory_clocks_mhz: &[1600],
        min_graphics_clock_mhz: 500,
        max_graphics_clock_mhz: 1700,
        graphics_clock_step_mhz: 100,
        energy_counter: true,
        instant_power: false,
        power_update_period_s: 0.001,
        counter_delay_s: 0.0,
        average_power: true,
        counter_unit_uj: 15.3,
        average_window_s: 0.0,
        energy_read_cost_s: 50e-6,
        power_read_cost_s: 50e-6,
        memory_mib: 65_536,
        pci_device_id: 0x740F_1002,
        pcie: (4, 16),
        default_workload: None,
    },
];

/// Look a preset up by its key, case-insensitively.
pub fn find(key: &str) -> Option<&'static Preset> {
    PRESETS
        .iter()
        .find(|p| p.key.eq_ignore_ascii_case(key.trim()))
}

/// All preset keys, for error messages.
pub fn keys() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.key).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_consistent() {
        for p in PRESETS {
            assert!(p.min_power_limit_mw < p.max_power_limit_mw, "{}", p.key);
            assert!(p.default_power_limit_mw <= p.max_power_limit_mw);
            assert!(p.idle_power_mw < p.min_power_limit_mw);
            let g = p.graphics_clocks_mhz();
            assert_eq!(g[0], p.max_graphics_clock_mhz);
            assert_eq!(*g.last().unwrap(), p.min_graphics_clock_mhz);
            assert!(g.windows(2).all(|w| w[0] > w[1]));
            if p.vendor == Vendor::Nvidia {
                assert_eq!(p.energy_counter, p.architecture >= Architecture::Volta);
                assert!(p.average_power && p.dies == 1 && p.counter_unit_uj == 1000.0);
            } else {
                assert!(p.instant_power || p.average_power, "{}", p.key);
                assert!(p.architecture >= Architecture::Cdna2);
            }
        }
        assert!(find("a40").is_some());
        assert!(find("K80").is_none());
    }
}
