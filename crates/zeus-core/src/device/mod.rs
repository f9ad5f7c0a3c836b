//! The GPU device layer.
//!
//! Every backend implements [`Gpu`], one object per physical device. [`Gpus`] is what the rest of
//! the crate (and Python, through `zeus.device.get_gpus()`) talks to: the devices visible to this
//! process in framework order (after `CUDA_VISIBLE_DEVICES`), addressed by index, plus the clock
//! that timestamps readings from them.
//!
//! Backends:
//! - [`nvml`]: the NVIDIA Management Library, loaded at run time through `nvml-wrapper`.
//! - [`amd`]: AMD SMI (`libamd_smi.so`), loaded at run time through our own FFI.
//! - [`sim`]: the simulated GPU, used only when the user opts in with `ZEUS_GPU_BACKEND=sim`.
//!
//! AMD counters are checked against power when the devices are opened ([`counter_check`]).

pub mod adjusted;
pub mod amd;
pub mod counter_check;
pub mod cpu;
pub mod derived_power;
pub mod error;
pub mod nvml;
pub mod settings;
pub mod sim;
pub mod visible;

use std::sync::Arc;

pub use error::{GpuError, GpuResult};

/// GPU micro-architecture, as NVML reports it (`nvmlDeviceArchitecture_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Architecture {
    Kepler,
    Maxwell,
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
    /// AMD Instinct MI200 (`gfx90a`).
    Cdna2,
    /// AMD Instinct MI300 (`gfx942`).
    Cdna3,
    Unknown,
}

impl Architecture {
    /// The NVML constant (`NVML_DEVICE_ARCH_*`).
    pub fn nvml_value(self) -> u32 {
        match self {
            Architecture::Kepler => 2,
            Architecture::Maxwell => 3,
            Architecture::Pascal => 4,
            Architecture::Volta => 5,
            Architecture::Turing => 6,
            Architecture::Ampere => 7,
            Architecture::Ada => 8,
            Architecture::Hopper => 9,
            Architecture::Blackwell => 10,
            Architecture::Cdna2 | Architecture::Cdna3 | Architecture::Unknown => 0xffff_ffff,
        }
    }

    /// Lower-case name, e.g. `"volta"`.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Kepler => "kepler",
            Architecture::Maxwell => "maxwell",
            Architecture::Pascal => "pascal",
            Architecture::Volta => "volta",
            Architecture::Turing => "turing",
            Architecture::Ampere => "ampere",
            Architecture::Ada => "ada",
            Architecture::Hopper => "hopper",
            Architecture::Blackwell => "blackwell",
            Architecture::Cdna2 => "cdna2",
            Architecture::Cdna3 => "cdna3",
            Architecture::Unknown => "unknown",
        }
    }
}

/// Who made a GPU, and so which driver library speaks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    Nvidia,
    Amd,
}

impl Vendor {
    /// Lower-case name, the `vendor` label of the exporter's metrics.
    pub fn name(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
        }
    }
}

/// One GPU. Units: power in milliwatts, energy in millijoules, clocks in MHz.
///
/// Methods take `&self`: backends keep whatever mutable state they need behind their own
/// synchronisation, so a `Gpu` can be shared between the training thread and a sampler thread.
pub trait Gpu: Send + Sync {
    fn name(&self) -> GpuResult<String>;
    /// Who made it (NVIDIA unless the backend says otherwise).
    fn vendor(&self) -> Vendor {
        Vendor::Nvidia
    }
    fn uuid(&self) -> GpuResult<String>;
    fn architecture(&self) -> GpuResult<Architecture>;
    /// `(min, max)` settable power limit, mW.
    fn power_management_limit_constraints(&self) -> GpuResult<(u32, u32)>;
    fn power_management_limit_default(&self) -> GpuResult<u32>;
    fn power_management_limit(&self) -> GpuResult<u32>;
    fn set_power_management_limit(&self, milliwatts: u32) -> GpuResult<()>;
    fn reset_power_management_limit(&self) -> GpuResult<()> {
        let default = self.power_management_limit_default()?;
        self.set_power_management_limit(default)
    }
    fn persistence_mode(&self) -> GpuResult<bool>;
    fn set_persistence_mode(&self, enabled: bool) -> GpuResult<()>;
    fn supported_memory_clocks(&self) -> GpuResult<Vec<u32>>;
    fn supported_graphics_clocks(&self, memory_clock_mhz: u32) -> GpuResult<Vec<u32>>;
    fn set_gpu_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()>;
    fn reset_gpu_locked_clocks(&self) -> GpuResult<()>;
    fn set_memory_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()>;
    fn reset_memory_locked_clocks(&self) -> GpuResult<()>;
    /// Power averaged by the driver over its update period, mW.
    fn average_power_usage(&self) -> GpuResult<u32>;
    /// Instantaneous power, mW, where the device has it (`NotSupported` otherwise).
    fn instant_power_usage(&self) -> GpuResult<u32>;
    /// Whether [`Gpu::total_energy_consumption`] works (Volta and newer).
    fn supports_total_energy_consumption(&self) -> GpuResult<bool>;
    /// Energy since the driver was loaded, mJ. Monotonic.
    fn total_energy_consumption(&self) -> GpuResult<u64>;
    /// A power reading (instant where `instant`, else the driver's average) with the moment
    /// the driver says it describes, where it says one (NVML's field values carry a timestamp;
    /// whether it moves with the value's updates or with the calls depends on the driver, and
    /// the sampler finds out). The default reads the plain value, without a time.
    fn power_sample(&self, instant: bool) -> GpuResult<PowerSample> {
        untimed_sample(self, instant)
    }
    /// Whether the energy counter is exact at every read (it counts continuously, as the ideal
    /// simulated GPU's does), if the backend knows; `None` means "find out by reading it".
    fn counter_is_exact(&self) -> Option<bool> {
        None
    }
    /// Whether its power readings are derived from its own energy counter (a board that reports
    /// no power: `derived_power.rs`). A model of such readings adds nothing the counter lacks,
    /// so monitors read the counter directly at window edges.
    fn power_from_counter(&self) -> bool {
        false
    }
    /// How long after the power readings' update the energy counter shows the same update,
    /// s, where the backend knows it (AMD: both are fields of one metrics table the firmware
    /// fills at once, so 0). `None`: the sampler measures it, as it must on NVML.
    fn counter_lag(&self) -> Option<f64> {
        None
    }
    /// How often the driver refreshes its power reading, in seconds, if the backend knows it.
    /// NVML does not say; the simulated GPU does. `None` means "detect it by sampling".
    fn power_update_period(&self) -> Option<f64> {
        None
    }
    /// PCI bus id in NVML's form, `domain:bus:device.function` (`00000000:01:00.0`).
    fn pci_bus_id(&self) -> GpuResult<String> {
        Err(GpuError::NotSupported(
            "PCI bus id: not supported by this backend".into(),
        ))
    }
    /// Current graphics (SM) and memory clocks, MHz: what the GPU runs at now, under its power
    /// limit and any locked range.
    fn current_clocks_mhz(&self) -> GpuResult<(u32, u32)> {
        Err(GpuError::NotSupported(
            "current clocks: not supported by this backend".into(),
        ))
    }
    /// GPU core temperature, °C.
    fn temperature_c(&self) -> GpuResult<u32> {
        Err(GpuError::NotSupported(
            "temperature: not supported by this backend".into(),
        ))
    }
    /// Device memory, bytes.
    fn memory_info(&self) -> GpuResult<MemoryInfo> {
        Err(GpuError::NotSupported(
            "memory info: not supported by this backend".into(),
        ))
    }
    /// Share of the last sample period the GPU (and its memory) was busy, percent.
    fn utilization_rates(&self) -> GpuResult<Utilization> {
        Err(GpuError::NotSupported(
            "utilization: not supported by this backend".into(),
        ))
    }
}

/// A power reading without a time: what [`Gpu::power_sample`] gives where the driver does not
/// say when its reading was made.
pub fn untimed_sample(gpu: &(impl Gpu + ?Sized), instant: bool) -> GpuResult<PowerSample> {
    let milliwatts = if instant {
        gpu.instant_power_usage()?
    } else {
        gpu.average_power_usage()?
    };
    Ok(PowerSample {
        milliwatts,
        timestamp: None,
    })
}

/// Which power reading a caller wants where a board has both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerPreference {
    Instant,
    Average,
}

/// `gpu`'s power now, mW: the preferred reading, or the other where the board lacks it (an
/// MI300X has no average, an MI250X and boards before Ampere no instant power). The one rule
/// every reader of "the power" uses.
pub fn power_mw(gpu: &dyn Gpu, prefer: PowerPreference) -> GpuResult<u32> {
    let read = |instant: bool| {
        if instant {
            gpu.instant_power_usage()
        } else {
            gpu.average_power_usage()
        }
    };
    let instant_first = prefer == PowerPreference::Instant;
    match read(instant_first) {
        Err(GpuError::NotSupported(_)) => read(!instant_first),
        other => other,
    }
}

/// A power reading and the driver's timestamp of it (seconds since the Unix epoch, the
/// backend clock's scale), where the driver gives one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerSample {
    pub milliwatts: u32,
    pub timestamp: Option<f64>,
}

/// Device memory, bytes (`nvmlMemory_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    pub total: u64,
    pub used: u64,
}

/// GPU and memory utilisation, percent (`nvmlUtilization_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

/// Where readings come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Nvml,
    Amd,
    Sim,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Nvml => "nvml",
            BackendKind::Amd => "amd",
            BackendKind::Sim => "sim",
        }
    }
}

/// A timestamp source, seconds since the Unix epoch. The simulated GPU may run on a virtual
/// clock; measurement code must take time from here and not from the system clock.
pub trait Clock: Send + Sync {
    fn now(&self) -> f64;
    /// Whether time moves only when someone advances it.
    fn is_virtual(&self) -> bool {
        false
    }
}

/// The system wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> f64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }
}

/// The GPUs visible to this process, in framework index order.
#[derive(Clone)]
pub struct Gpus {
    backend: BackendKind,
    devices: Vec<Arc<dyn Gpu>>,
    /// Backend index of each visible device (`CUDA_VISIBLE_DEVICES` applied).
    physical_indices: Vec<usize>,
    /// Cached `(min, max)` power limit per device, for argument checks with a useful message.
    constraints: Vec<Option<(u32, u32)>>,
    clock: Arc<dyn Clock>,
    /// Warnings from opening the devices (counters disabled at the check), for the caller to
    /// show once.
    notes: Vec<String>,
}

impl std::fmt::Debug for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpus")
            .field("backend", &self.backend)
            .field("physical_indices", &self.physical_indices)
            .finish()
    }
}

/// Which backend `ZEUS_GPU_BACKEND` asks for; `None` for `auto` (the default): NVML where it
/// has GPUs, else AMD SMI where it has.
pub fn requested_backend() -> GpuResult<Option<BackendKind>> {
    match std::env::var("ZEUS_GPU_BACKEND") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            "nvml" => Ok(Some(BackendKind::Nvml)),
            "amd" => Ok(Some(BackendKind::Amd)),
            "sim" => Ok(Some(BackendKind::Sim)),
            _ => Err(GpuError::Init(format!(
                "ZEUS_GPU_BACKEND={v:?} is not a backend: use 'auto' (NVML, else AMD SMI), \
                 'nvml', 'amd' or 'sim'"
            ))),
        },
    }
}

/// `auto`: NVML's GPUs if it loads and has any, else AMD SMI's; neither is a
/// `LibraryNotFound` naming both attempts (or NVML's error if it loaded but failed).
fn open_auto() -> GpuResult<(BackendKind, Vec<Arc<dyn Gpu>>)> {
    let nvml_err = match nvml::open_all() {
        Ok(all) if !all.is_empty() => return Ok((BackendKind::Nvml, all)),
        Ok(all) => {
            return match amd::open_all() {
                Ok(amd) if !amd.is_empty() => Ok((BackendKind::Amd, amd)),
                _ => Ok((BackendKind::Nvml, all)),
            }
        }
        Err(e @ GpuError::LibraryNotFound(_)) => e,
        Err(e) => return Err(e),
    };
    match amd::open_all() {
        Ok(all) => Ok((BackendKind::Amd, all)),
        Err(GpuError::LibraryNotFound(amd_msg)) => Err(GpuError::LibraryNotFound(format!(
            "{nvml_err} Nor could AMD SMI be loaded: {amd_msg}"
        ))),
        Err(e) => Err(e),
    }
}

impl Gpus {
    /// Open the backend chosen by `ZEUS_GPU_BACKEND` (never a silent fallback to the
    /// simulator), check AMD counters, and apply the visible-devices variables.
    pub fn from_env() -> GpuResult<Gpus> {
        let (backend, all, clock): (_, _, Arc<dyn Clock>) = match requested_backend()? {
            None => {
                let (b, all) = open_auto()?;
                (b, all, Arc::new(SystemClock))
            }
            Some(BackendKind::Nvml) => {
                (BackendKind::Nvml, nvml::open_all()?, Arc::new(SystemClock))
            }
            Some(BackendKind::Amd) => (BackendKind::Amd, amd::open_all()?, Arc::new(SystemClock)),
            Some(BackendKind::Sim) => {
                let cluster = sim::global_cluster()?;
                (BackendKind::Sim, cluster.gpu_devices(), cluster.clock())
            }
        };
        let mut all = all;
        let physical = Gpus::visible_indices(&all)?;
        // The visible GPUs only (hidden ones are not this process's to wait for), numbered as
        // the process sees them.
        let visible: Vec<Arc<dyn Gpu>> = physical.iter().map(|&i| all[i].clone()).collect();
        let (visible, mut notes) = counter_check::check_counters(visible, clock.as_ref());
        let visible = adjusted::wrap_powerless(visible, clock.clone(), &mut notes);
        for (&i, d) in physical.iter().zip(visible) {
            all[i] = d;
        }
        let mut gpus = Gpus::with_indices(backend, all, physical, clock);
        gpus.notes = notes;
        Ok(gpus)
    }

    /// Build from backend devices, applying the visible-devices variables of their vendor
    /// (`CUDA_VISIBLE_DEVICES`; on AMD `ROCR_VISIBLE_DEVICES`, then `HIP_VISIBLE_DEVICES` or
    /// `CUDA_VISIBLE_DEVICES`).
    pub fn new(
        backend: BackendKind,
        all: Vec<Arc<dyn Gpu>>,
        clock: Arc<dyn Clock>,
    ) -> GpuResult<Gpus> {
        let physical_indices = Gpus::visible_indices(&all)?;
        Ok(Gpus::with_indices(backend, all, physical_indices, clock))
    }

    /// The backend indices of `all` visible to this process, by their vendor's variables.
    fn visible_indices(all: &[Arc<dyn Gpu>]) -> GpuResult<Vec<usize>> {
        let uuids = all
            .iter()
            .map(|d| d.uuid())
            .collect::<GpuResult<Vec<String>>>()?;
        // Simulated clusters may mix vendors; AMD's variables apply where every device is AMD.
        let vendor = if !all.is_empty() && all.iter().all(|d| d.vendor() == Vendor::Amd) {
            Vendor::Amd
        } else {
            Vendor::Nvidia
        };
        visible::from_env(vendor, &uuids)
    }

    /// Warnings from opening the devices (an AMD counter disabled at the check, and why).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Build from backend devices and an explicit visible-index list.
    pub fn with_indices(
        backend: BackendKind,
        all: Vec<Arc<dyn Gpu>>,
        physical_indices: Vec<usize>,
        clock: Arc<dyn Clock>,
    ) -> Gpus {
        let devices: Vec<Arc<dyn Gpu>> = physical_indices.iter().map(|&i| all[i].clone()).collect();
        let constraints = devices
            .iter()
            .map(|d| d.power_management_limit_constraints().ok())
            .collect();
        Gpus {
            backend,
            devices,
            physical_indices,
            constraints,
            clock,
            notes: Vec::new(),
        }
    }

    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Seconds since the epoch on this backend's clock.
    pub fn now(&self) -> f64 {
        self.clock.now()
    }

    /// Backend (NVML) index of visible GPU `index`.
    pub fn physical_index(&self, index: usize) -> GpuResult<usize> {
        self.check_index(index)?;
        Ok(self.physical_indices[index])
    }

    pub fn physical_indices(&self) -> &[usize] {
        &self.physical_indices
    }

    /// The device at visible index `index`.
    pub fn device(&self, index: usize) -> GpuResult<&Arc<dyn Gpu>> {
        self.check_index(index)?;
        Ok(&self.devices[index])
    }

    fn check_index(&self, index: usize) -> GpuResult<()> {
        if index < self.devices.len() {
            Ok(())
        } else {
            Err(GpuError::InvalidArg(format!(
                "GPU index {index} is out of range: {} GPU(s) are visible",
                self.devices.len()
            )))
        }
    }

    /// Raise if the visible GPUs are not all the same model.
    pub fn ensure_homogeneous(&self) -> GpuResult<()> {
        let names = self
            .devices
            .iter()
            .map(|d| d.name())
            .collect::<GpuResult<Vec<_>>>()?;
        if names.windows(2).any(|w| w[0] != w[1]) {
            return Err(GpuError::Init(format!(
                "Heterogeneous GPUs found: {names:?}"
            )));
        }
        Ok(())
    }

    /// Set the power limit after checking it against the device's range, so that a bad value
    /// gets a message naming it and the range (NVML itself only says "Invalid Argument").
    pub fn set_power_management_limit(&self, index: usize, milliwatts: u32) -> GpuResult<()> {
        let dev = self.device(index)?;
        if let Some((min, max)) = self.constraints[index] {
            if milliwatts < min || milliwatts > max {
                return Err(GpuError::InvalidArg(format!(
                    "power limit {milliwatts} mW is outside GPU {index}'s range [{min}, {max}] mW"
                )));
            }
        }
        dev.set_power_management_limit(milliwatts)
    }

    /// Lock GPU clocks after checking the pair is ordered.
    pub fn set_gpu_locked_clocks(&self, index: usize, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        let dev = self.device(index)?;
        if min_mhz > max_mhz {
            return Err(GpuError::InvalidArg(format!(
                "locked GPU clock range is empty: min {min_mhz} MHz > max {max_mhz} MHz"
            )));
        }
        dev.set_gpu_locked_clocks(min_mhz, max_mhz)
    }

    /// Lock memory clocks after checking the pair is ordered.
    pub fn set_memory_locked_clocks(
        &self,
        index: usize,
        min_mhz: u32,
        max_mhz: u32,
    ) -> GpuResult<()> {
        let dev = self.device(index)?;
        if min_mhz > max_mhz {
            return Err(GpuError::InvalidArg(format!(
                "locked memory clock range is empty: min {min_mhz} MHz > max {max_mhz} MHz"
            )));
        }
        dev.set_memory_locked_clocks(min_mhz, max_mhz)
    }
}
