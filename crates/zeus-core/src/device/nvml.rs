//! The NVML backend, through `nvml-wrapper`.
//!
//! The library is loaded at run time (`nvml-wrapper` uses `libloading`), so this compiles and
//! runs everywhere; without `libnvidia-ml.so.1` [`open_all`] returns
//! [`GpuError::LibraryNotFound`] with a message that says how to use the simulated GPU instead.
//! `ZEUS_NVML_LIB` names a library file to load instead of the system one (for example the
//! simulated `libnvidia-ml.so.1` that `python -m zeus.sim nvml-path` prints).

use std::ffi::OsStr;
use std::sync::{Arc, Mutex, OnceLock};

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::{DeviceArchitecture, GpuLockedClocksSetting};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT};
use nvml_wrapper::{Device, Nvml};

use super::{Architecture, Gpu, GpuError, GpuResult, MemoryInfo, PowerSample, Utilization};

/// The process-wide NVML handle. NVML's init is reference counted and cheap to keep; keeping
/// one lets every `NvmlGpu` hold a `Device<'static>` and skip the handle lookup on hot paths.
static NVML: OnceLock<Nvml> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

const NO_NVML_HINT: &str =
    "NVML (libnvidia-ml.so.1) could not be loaded, so no NVIDIA GPU can be used. \
On a machine without NVIDIA GPUs, opt in to the simulated GPU with ZEUS_GPU_BACKEND=sim \
(ZEUS_SIM_GPUS=A40,V100 picks the models), or set ZEUS_NVML_LIB to the path of a libnvidia-ml.so.1 \
(`python -m zeus.sim nvml-path` prints the simulated one)";

/// Convert an `nvml-wrapper` error to ours, naming the call that failed.
pub fn map_nvml_error(e: NvmlError, context: &str) -> GpuError {
    use nvml_code as c;
    use NvmlError::*;
    let code = match &e {
        Uninitialized => c::UNINITIALIZED,
        InvalidArg => c::INVALID_ARGUMENT,
        NotSupported => c::NOT_SUPPORTED,
        NoPermission => c::NO_PERMISSION,
        #[allow(deprecated)]
        AlreadyInitialized => c::ALREADY_INITIALIZED,
        NotFound => c::NOT_FOUND,
        InsufficientSize(_) => c::INSUFFICIENT_SIZE,
        InsufficientPower => c::INSUFFICIENT_POWER,
        DriverNotLoaded => c::DRIVER_NOT_LOADED,
        Timeout => c::TIMEOUT,
        IrqIssue => c::IRQ_ISSUE,
        LibraryNotFound => c::LIBRARY_NOT_FOUND,
        FunctionNotFound => c::FUNCTION_NOT_FOUND,
        CorruptedInfoROM => c::CORRUPTED_INFOROM,
        GpuLost => c::GPU_IS_LOST,
        ResetRequired => c::RESET_REQUIRED,
        OperatingSystem => c::OPERATING_SYSTEM,
        LibRmVersionMismatch => c::LIB_RM_VERSION_MISMATCH,
        InsufficientMemory => c::MEMORY,
        InUse => c::IN_USE,
        NoData => c::NO_DATA,
        Unknown => c::UNKNOWN,
        LibloadingError(err) => {
            return GpuError::LibraryNotFound(format!("{NO_NVML_HINT} ({err})"));
        }
        FailedToLoadSymbol(sym) => {
            return GpuError::FunctionNotFound(format!(
                "{context}: the loaded NVML library has no symbol {sym}"
            ));
        }
        other => {
            return GpuError::Unknown(format!("{context}: {other}"));
        }
    };
    GpuError::from_nvml_code(code, context)
}

use super::error::nvml_code;

fn nvml() -> GpuResult<&'static Nvml> {
    if let Some(n) = NVML.get() {
        return Ok(n);
    }
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = NVML.get() {
        return Ok(n);
    }
    let lib = std::env::var_os("ZEUS_NVML_LIB");
    let result = match &lib {
        Some(path) => Nvml::builder().lib_path(OsStr::new(path)).init(),
        None => Nvml::init(),
    };
    let n = result.map_err(|e| match e {
        NvmlError::LibloadingError(err) => GpuError::LibraryNotFound(match &lib {
            Some(p) => format!("ZEUS_NVML_LIB={p:?} could not be loaded ({err}). {NO_NVML_HINT}"),
            None => format!("{NO_NVML_HINT} ({err})"),
        }),
        other => map_nvml_error(other, "nvmlInit"),
    })?;
    Ok(NVML.get_or_init(|| n))
}

/// One NVML device. Reads go through a cached `Device<'static>`; setters (which need `&mut`
/// in `nvml-wrapper`) take a fresh handle, since they are rare and must not block reads.
pub struct NvmlGpu {
    nvml: &'static Nvml,
    index: u32,
    device: Device<'static>,
    supports_energy: OnceLock<bool>,
}

impl NvmlGpu {
    fn handle(&self, ctx: &str) -> GpuResult<Device<'static>> {
        self.nvml
            .device_by_index(self.index)
            .map_err(|e| map_nvml_error(e, ctx))
    }
}

/// Open every device NVML reports, in NVML index order.
pub fn open_all() -> GpuResult<Vec<Arc<dyn Gpu>>> {
    let nvml = nvml()?;
    let count = nvml
        .device_count()
        .map_err(|e| map_nvml_error(e, "nvmlDeviceGetCount"))?;
    (0..count)
        .map(|index| {
            let device = nvml
                .device_by_index(index)
                .map_err(|e| map_nvml_error(e, "nvmlDeviceGetHandleByIndex"))?;
            Ok(Arc::new(NvmlGpu {
                nvml,
                index,
                device,
                supports_energy: OnceLock::new(),
            }) as Arc<dyn Gpu>)
        })
        .collect()
}

macro_rules! call {
    ($e:expr, $ctx:literal) => {
        $e.map_err(|e| map_nvml_error(e, $ctx))
    };
}

impl NvmlGpu {
    /// One power field value (mW) with its timestamp (`nvmlFieldValue_t.timestamp`, µs since
    /// the epoch, as seconds).
    fn power_field(&self, field: u32, name: &str) -> GpuResult<PowerSample> {
        let ctx = format!("nvmlDeviceGetFieldValues({name})");
        let mut samples = self
            .device
            .field_values_for(&[FieldId(field)])
            .map_err(|e| map_nvml_error(e, &ctx))?;
        let sample = samples
            .pop()
            .ok_or_else(|| GpuError::Unknown(format!("{ctx} returned nothing")))?
            .map_err(|e| map_nvml_error(e, &ctx))?;
        let value = sample.value.map_err(|e| map_nvml_error(e, &ctx))?;
        use nvml_wrapper::enums::device::SampleValue;
        let milliwatts = match value {
            SampleValue::U32(v) => v,
            SampleValue::U64(v) => v.min(u64::from(u32::MAX)) as u32,
            SampleValue::I64(v) => v.clamp(0, i64::from(u32::MAX)) as u32,
            SampleValue::F64(v) => v.max(0.0) as u32,
        };
        Ok(PowerSample {
            milliwatts,
            timestamp: (sample.timestamp > 0).then_some(sample.timestamp as f64 * 1e-6),
        })
    }
}

impl Gpu for NvmlGpu {
    fn name(&self) -> GpuResult<String> {
        call!(self.device.name(), "nvmlDeviceGetName")
    }
    fn uuid(&self) -> GpuResult<String> {
        call!(self.device.uuid(), "nvmlDeviceGetUUID")
    }
    fn architecture(&self) -> GpuResult<Architecture> {
        let a = call!(self.device.architecture(), "nvmlDeviceGetArchitecture")?;
        Ok(match a {
            DeviceArchitecture::Kepler => Architecture::Kepler,
            DeviceArchitecture::Maxwell => Architecture::Maxwell,
            DeviceArchitecture::Pascal => Architecture::Pascal,
            DeviceArchitecture::Volta => Architecture::Volta,
            DeviceArchitecture::Turing => Architecture::Turing,
            DeviceArchitecture::Ampere => Architecture::Ampere,
            DeviceArchitecture::Ada => Architecture::Ada,
            DeviceArchitecture::Hopper => Architecture::Hopper,
            DeviceArchitecture::Blackwell => Architecture::Blackwell,
            _ => Architecture::Unknown,
        })
    }
    fn power_management_limit_constraints(&self) -> GpuResult<(u32, u32)> {
        let c = call!(
            self.device.power_management_limit_constraints(),
            "nvmlDeviceGetPowerManagementLimitConstraints"
        )?;
        Ok((c.min_limit, c.max_limit))
    }
    fn power_management_limit_default(&self) -> GpuResult<u32> {
        call!(
            self.device.power_management_limit_default(),
            "nvmlDeviceGetPowerManagementDefaultLimit"
        )
    }
    fn power_management_limit(&self) -> GpuResult<u32> {
        call!(
            self.device.power_management_limit(),
            "nvmlDeviceGetPowerManagementLimit"
        )
    }
    fn set_power_management_limit(&self, milliwatts: u32) -> GpuResult<()> {
        let mut d = self.handle("nvmlDeviceGetHandleByIndex")?;
        call!(
            d.set_power_management_limit(milliwatts),
            "nvmlDeviceSetPowerManagementLimit"
        )
    }
    fn persistence_mode(&self) -> GpuResult<bool> {
        call!(
            self.device.is_in_persistent_mode(),
            "nvmlDeviceGetPersistenceMode"
        )
    }
    fn set_persistence_mode(&self, enabled: bool) -> GpuResult<()> {
        let mut d = self.handle("nvmlDeviceGetHandleByIndex")?;
        call!(d.set_persistent(enabled), "nvmlDeviceSetPersistenceMode")
    }
    fn supported_memory_clocks(&self) -> GpuResult<Vec<u32>> {
        call!(
            self.device.supported_memory_clocks(),
            "nvmlDeviceGetSupportedMemoryClocks"
        )
    }
    fn supported_graphics_clocks(&self, memory_clock_mhz: u32) -> GpuResult<Vec<u32>> {
        call!(
            self.device.supported_graphics_clocks(memory_clock_mhz),
            "nvmlDeviceGetSupportedGraphicsClocks"
        )
    }
    fn set_gpu_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        let mut d = self.handle("nvmlDeviceGetHandleByIndex")?;
        call!(
            d.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
                min_clock_mhz: min_mhz,
                max_clock_mhz: max_mhz,
            }),
            "nvmlDeviceSetGpuLockedClocks"
        )
    }
    fn reset_gpu_locked_clocks(&self) -> GpuResult<()> {
        let mut d = self.handle("nvmlDeviceGetHandleByIndex")?;
        call!(
            d.reset_gpu_locked_clocks(),
            "nvmlDeviceResetGpuLockedClocks"
        )
    }
    fn set_memory_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        let mut d = self.handle("nvmlDeviceGetHandleByIndex")?;
        call!(
            d.set_mem_locked_clocks(min_mhz, max_mhz),
            "nvmlDeviceSetMemoryLockedClocks"
        )
    }
    fn reset_memory_locked_clocks(&self) -> GpuResult<()> {
        let mut d = self.handle("nvmlDeviceGetHandleByIndex")?;
        call!(
            d.reset_mem_locked_clocks(),
            "nvmlDeviceResetMemoryLockedClocks"
        )
    }
    fn average_power_usage(&self) -> GpuResult<u32> {
        call!(self.device.power_usage(), "nvmlDeviceGetPowerUsage")
    }
    fn instant_power_usage(&self) -> GpuResult<u32> {
        self.power_field(NVML_FI_DEV_POWER_INSTANT, "POWER_INSTANT")
            .map(|s| s.milliwatts)
    }
    fn power_sample(&self, instant: bool) -> GpuResult<PowerSample> {
        if instant {
            self.power_field(NVML_FI_DEV_POWER_INSTANT, "POWER_INSTANT")
        } else {
            match self.power_field(NVML_FI_DEV_POWER_AVERAGE, "POWER_AVERAGE") {
                // Drivers before the average field: the plain call, without a time.
                Err(GpuError::NotSupported(_)) => Ok(PowerSample {
                    milliwatts: self.average_power_usage()?,
                    timestamp: None,
                }),
                other => other,
            }
        }
    }
    fn supports_total_energy_consumption(&self) -> GpuResult<bool> {
        if let Some(&s) = self.supports_energy.get() {
            return Ok(s);
        }
        // Decide by trying the counter, not by architecture: some Volta+ boards (and the
        // simulated P100) say NotSupported, and the call itself is the ground truth.
        let s = match self.device.total_energy_consumption() {
            Ok(_) => true,
            Err(NvmlError::NotSupported) => false,
            Err(e) => return Err(map_nvml_error(e, "nvmlDeviceGetTotalEnergyConsumption")),
        };
        Ok(*self.supports_energy.get_or_init(|| s))
    }
    fn total_energy_consumption(&self) -> GpuResult<u64> {
        call!(
            self.device.total_energy_consumption(),
            "nvmlDeviceGetTotalEnergyConsumption"
        )
    }
    fn pci_bus_id(&self) -> GpuResult<String> {
        Ok(call!(self.device.pci_info(), "nvmlDeviceGetPciInfo_v3")?.bus_id)
    }
    fn current_clocks_mhz(&self) -> GpuResult<(u32, u32)> {
        Ok((
            call!(
                self.device.clock_info(Clock::Graphics),
                "nvmlDeviceGetClockInfo"
            )?,
            call!(
                self.device.clock_info(Clock::Memory),
                "nvmlDeviceGetClockInfo"
            )?,
        ))
    }
    fn temperature_c(&self) -> GpuResult<u32> {
        call!(
            self.device.temperature(TemperatureSensor::Gpu),
            "nvmlDeviceGetTemperature"
        )
    }
    fn memory_info(&self) -> GpuResult<MemoryInfo> {
        let m = call!(self.device.memory_info(), "nvmlDeviceGetMemoryInfo")?;
        Ok(MemoryInfo {
            total: m.total,
            used: m.used,
        })
    }
    fn utilization_rates(&self) -> GpuResult<Utilization> {
        let u = call!(
            self.device.utilization_rates(),
            "nvmlDeviceGetUtilizationRates"
        )?;
        Ok(Utilization {
            gpu: u.gpu,
            memory: u.memory,
        })
    }
}
