//! The amdsmi C ABI, as much of it as zeus speaks: status codes, handles, the structures the
//! calls fill, and the function table loaded from `libamd_smi.so` at run time.
//!
//! Layouts follow `amdsmi.h` of AMD SMI 26 (ROCm 7.0), as its Python bindings (`amdsmi`
//! 7.0.2 on PyPI, `amdsmi_wrapper.py`) declare them; padding is spelled out where the header
//! leaves it implicit, and the sizes are checked below. Both sides use these definitions: the
//! backend ([`super::AmdGpu`]) calls through [`Api`], and the simulated `libamd_smi.so`
//! (`crates/zeus-sim-amdsmi`) fills the same structures, so one table is the ABI.

use std::ffi::{c_char, c_void};

use super::super::GpuError;

/// `amdsmi_status_t`.
pub type Status = u32;
/// `amdsmi_processor_handle` / `amdsmi_socket_handle`: opaque pointers.
pub type Handle = *mut c_void;

/// `amdsmi_status_t` values.
pub mod status {
    use super::Status;
    pub const SUCCESS: Status = 0;
    pub const INVAL: Status = 1;
    pub const NOT_SUPPORTED: Status = 2;
    pub const NOT_YET_IMPLEMENTED: Status = 3;
    pub const FAIL_LOAD_MODULE: Status = 4;
    pub const FAIL_LOAD_SYMBOL: Status = 5;
    pub const DRM_ERROR: Status = 6;
    pub const API_FAILED: Status = 7;
    pub const TIMEOUT: Status = 8;
    pub const RETRY: Status = 9;
    pub const NO_PERM: Status = 10;
    pub const INTERRUPT: Status = 11;
    pub const IO: Status = 12;
    pub const INIT_ERROR: Status = 18;
    pub const BUSY: Status = 30;
    pub const NOT_FOUND: Status = 31;
    pub const NOT_INIT: Status = 32;
    pub const DRIVER_NOT_LOADED: Status = 34;
    pub const NO_DATA: Status = 40;
    pub const INSUFFICIENT_SIZE: Status = 41;
    pub const ARG_PTR_NULL: Status = 53;
    pub const UNKNOWN_ERROR: Status = 0xFFFF_FFFF;
}

/// The name of a status code, as `amdsmi.h` spells it.
pub fn status_name(code: Status) -> &'static str {
    use status::*;
    match code {
        SUCCESS => "AMDSMI_STATUS_SUCCESS",
        INVAL => "AMDSMI_STATUS_INVAL",
        NOT_SUPPORTED => "AMDSMI_STATUS_NOT_SUPPORTED",
        NOT_YET_IMPLEMENTED => "AMDSMI_STATUS_NOT_YET_IMPLEMENTED",
        FAIL_LOAD_MODULE => "AMDSMI_STATUS_FAIL_LOAD_MODULE",
        FAIL_LOAD_SYMBOL => "AMDSMI_STATUS_FAIL_LOAD_SYMBOL",
        DRM_ERROR => "AMDSMI_STATUS_DRM_ERROR",
        API_FAILED => "AMDSMI_STATUS_API_FAILED",
        TIMEOUT => "AMDSMI_STATUS_TIMEOUT",
        RETRY => "AMDSMI_STATUS_RETRY",
        NO_PERM => "AMDSMI_STATUS_NO_PERM",
        INTERRUPT => "AMDSMI_STATUS_INTERRUPT",
        IO => "AMDSMI_STATUS_IO",
        INIT_ERROR => "AMDSMI_STATUS_INIT_ERROR",
        BUSY => "AMDSMI_STATUS_BUSY",
        NOT_FOUND => "AMDSMI_STATUS_NOT_FOUND",
        NOT_INIT => "AMDSMI_STATUS_NOT_INIT",
        DRIVER_NOT_LOADED => "AMDSMI_STATUS_DRIVER_NOT_LOADED",
        NO_DATA => "AMDSMI_STATUS_NO_DATA",
        INSUFFICIENT_SIZE => "AMDSMI_STATUS_INSUFFICIENT_SIZE",
        ARG_PTR_NULL => "AMDSMI_STATUS_ARG_PTR_NULL",
        _ => "AMDSMI_STATUS_UNKNOWN_ERROR",
    }
}

/// The error a failed call becomes, naming the call and the status.
pub fn error_of(code: Status, call: &str) -> GpuError {
    use status::*;
    let msg = format!("{call}: {} ({code})", status_name(code));
    match code {
        INVAL | ARG_PTR_NULL => GpuError::InvalidArg(msg),
        NOT_SUPPORTED | NOT_YET_IMPLEMENTED => GpuError::NotSupported(msg),
        NO_PERM => GpuError::NoPermission(msg),
        TIMEOUT => GpuError::Timeout(msg),
        NOT_FOUND => GpuError::NotFound(msg),
        INSUFFICIENT_SIZE => GpuError::InsufficientSize(msg),
        DRIVER_NOT_LOADED => GpuError::DriverNotLoaded(msg),
        FAIL_LOAD_MODULE => GpuError::LibraryNotFound(msg),
        FAIL_LOAD_SYMBOL => GpuError::FunctionNotFound(msg),
        NO_DATA => GpuError::NotSupported(msg),
        NOT_INIT | INIT_ERROR => GpuError::Init(msg),
        _ => GpuError::Unknown(msg),
    }
}

/// The status a simulated call returns for one of our errors (the inverse of [`error_of`]).
pub fn status_of(e: &GpuError) -> Status {
    use status::*;
    match e {
        GpuError::InvalidArg(_) => INVAL,
        GpuError::NotSupported(_) => NOT_SUPPORTED,
        GpuError::NoPermission(_) => NO_PERM,
        GpuError::Timeout(_) => TIMEOUT,
        GpuError::NotFound(_) => NOT_FOUND,
        GpuError::InsufficientSize(_) => INSUFFICIENT_SIZE,
        GpuError::DriverNotLoaded(_) => DRIVER_NOT_LOADED,
        GpuError::Init(_) => NOT_INIT,
        GpuError::GpuLost(_) => DRM_ERROR,
        _ => UNKNOWN_ERROR,
    }
}

/// `amdsmi_init_flags_t`: AMD GPUs only.
pub const INIT_AMD_GPUS: u64 = 2;
/// `processor_type_t`: an AMD GPU.
pub const PROCESSOR_TYPE_AMD_GPU: u32 = 1;
/// `amdsmi_clk_type_t`.
pub const CLK_TYPE_GFX: u32 = 0;
pub const CLK_TYPE_MEM: u32 = 4;
/// `amdsmi_temperature_type_t`: the hotspot (junction) sensor, what Zeus reads.
pub const TEMPERATURE_TYPE_HOTSPOT: u32 = 1;
/// `amdsmi_temperature_metric_t`: the current value.
pub const TEMP_CURRENT: u32 = 0;
/// `amdsmi_memory_type_t`: VRAM.
pub const MEM_TYPE_VRAM: u32 = 0;
/// `amdsmi_dev_perf_level_t`: the driver picks clocks (every clock domain back to default).
pub const DEV_PERF_LEVEL_AUTO: u32 = 0;
/// `amdsmi_dev_perf_level_t`: user-set clock ranges in effect.
pub const DEV_PERF_LEVEL_MANUAL: u32 = 3;
/// What an unsupported 32-bit field of `amdsmi_power_info_t` holds: `UINT32_MAX` per the
/// docs, `0xFFFF` as the library writes it in practice.
pub const NA_U32: [u32; 2] = [u32::MAX, 0xFFFF];
/// `AMDSMI_GPU_UUID_SIZE`.
pub const GPU_UUID_SIZE: usize = 38;

/// `amdsmi_version_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub release: u32,
    pub _pad: u32,
    pub build: *const c_char,
}

/// `amdsmi_bdf_t`, as its 64-bit form: function bits 0-2, device 3-7, bus 8-15, domain 16-63.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Bdf {
    pub as_uint: u64,
}

impl Bdf {
    pub fn new(domain: u64, bus: u64, device: u64, function: u64) -> Bdf {
        Bdf {
            as_uint: (function & 0x7) | (device & 0x1f) << 3 | (bus & 0xff) << 8 | domain << 16,
        }
    }
    /// NVML's form, `domain:bus:device.function` with an 8-digit domain, which the rest of
    /// zeus (zeusd, the settings journal) uses for every vendor.
    pub fn to_bus_id(self) -> String {
        let v = self.as_uint;
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            v >> 16,
            (v >> 8) & 0xff,
            (v >> 3) & 0x1f,
            v & 0x7
        )
    }
}

/// `amdsmi_enumeration_info_t` (AMD SMI 26.1 and later; older libraries lack the call).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnumerationInfo {
    pub drm_render: u32,
    pub drm_card: u32,
    pub hsa_id: u32,
    pub hip_id: u32,
    pub hip_uuid: [c_char; 256],
}

/// `amdsmi_kfd_info_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KfdInfo {
    pub kfd_id: u64,
    pub node_id: u32,
    pub current_partition_id: u32,
    pub reserved: [u32; 12],
}

/// `amdsmi_asic_info_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AsicInfo {
    pub market_name: [c_char; 256],
    pub vendor_id: u32,
    pub vendor_name: [c_char; 256],
    pub subvendor_id: u32,
    pub device_id: u64,
    pub rev_id: u32,
    pub asic_serial: [c_char; 256],
    pub oam_id: u32,
    pub num_of_compute_units: u32,
    pub _pad: u32,
    pub target_graphics_version: u64,
    pub subsystem_id: u32,
    pub reserved: [u32; 21],
}

/// `amdsmi_board_info_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BoardInfo {
    pub model_number: [c_char; 256],
    pub product_serial: [c_char; 256],
    pub fru_id: [c_char; 256],
    pub product_name: [c_char; 256],
    pub manufacturer_name: [c_char; 256],
    pub reserved: [u64; 64],
}

/// `amdsmi_power_cap_info_t`: caps in µW, `dpm_cap` in MHz.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PowerCapInfo {
    pub power_cap: u64,
    pub default_power_cap: u64,
    pub dpm_cap: u64,
    pub min_power_cap: u64,
    pub max_power_cap: u64,
    pub reserved: [u64; 3],
}

/// `amdsmi_power_info_t`: powers in W, voltages in mV; unsupported fields hold [`NA_U32`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PowerInfo {
    pub socket_power: u64,
    pub current_socket_power: u32,
    pub average_socket_power: u32,
    pub gfx_voltage: u64,
    pub soc_voltage: u64,
    pub mem_voltage: u64,
    pub power_limit: u32,
    pub _pad: u32,
    pub reserved: [u64; 18],
}

/// `amdsmi_clk_info_t`, MHz.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ClkInfo {
    pub clk: u32,
    pub min_clk: u32,
    pub max_clk: u32,
    pub clk_locked: u8,
    pub clk_deep_sleep: u8,
    pub _pad: [u8; 2],
    pub reserved: [u32; 4],
}

/// `amdsmi_frequencies_t`: supported levels in Hz.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Frequencies {
    pub has_deep_sleep: bool,
    pub _pad0: [u8; 3],
    pub num_supported: u32,
    pub current: u32,
    pub _pad1: u32,
    pub frequency: [u64; 33],
}

/// `amdsmi_engine_usage_t`, percent.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineUsage {
    pub gfx_activity: u32,
    pub umc_activity: u32,
    pub mm_activity: u32,
    pub reserved: [u32; 13],
}

// The sizes `amdsmi_wrapper.py` implies; a mismatch would corrupt memory on either side.
const _: () = {
    assert!(std::mem::size_of::<Version>() == 24);
    assert!(std::mem::size_of::<Bdf>() == 8);
    assert!(std::mem::size_of::<EnumerationInfo>() == 272);
    assert!(std::mem::size_of::<KfdInfo>() == 64);
    assert!(std::mem::size_of::<AsicInfo>() == 896);
    assert!(std::mem::size_of::<BoardInfo>() == 1792);
    assert!(std::mem::size_of::<PowerCapInfo>() == 64);
    assert!(std::mem::size_of::<PowerInfo>() == 192);
    assert!(std::mem::size_of::<ClkInfo>() == 32);
    assert!(std::mem::size_of::<Frequencies>() == 280);
    assert!(std::mem::size_of::<EngineUsage>() == 64);
};

/// The functions zeus calls, resolved from one loaded library. The library stays loaded for
/// the life of the process (the table holds it), so the pointers stay valid.
pub struct Api {
    pub init: unsafe extern "C" fn(u64) -> Status,
    pub get_lib_version: unsafe extern "C" fn(*mut Version) -> Status,
    pub get_socket_handles: unsafe extern "C" fn(*mut u32, *mut Handle) -> Status,
    pub get_processor_handles: unsafe extern "C" fn(Handle, *mut u32, *mut Handle) -> Status,
    pub get_processor_type: unsafe extern "C" fn(Handle, *mut u32) -> Status,
    pub get_gpu_asic_info: unsafe extern "C" fn(Handle, *mut AsicInfo) -> Status,
    pub get_gpu_board_info: unsafe extern "C" fn(Handle, *mut BoardInfo) -> Status,
    pub get_gpu_device_bdf: unsafe extern "C" fn(Handle, *mut Bdf) -> Status,
    pub get_gpu_device_uuid: unsafe extern "C" fn(Handle, *mut u32, *mut c_char) -> Status,
    /// Absent before AMD SMI 26.1; the KFD node id orders GPUs there.
    pub get_gpu_enumeration_info:
        Option<unsafe extern "C" fn(Handle, *mut EnumerationInfo) -> Status>,
    pub get_gpu_kfd_info: unsafe extern "C" fn(Handle, *mut KfdInfo) -> Status,
    pub get_energy_count: unsafe extern "C" fn(Handle, *mut u64, *mut f32, *mut u64) -> Status,
    pub get_power_info: unsafe extern "C" fn(Handle, *mut PowerInfo) -> Status,
    pub get_power_cap_info: unsafe extern "C" fn(Handle, u32, *mut PowerCapInfo) -> Status,
    pub set_power_cap: unsafe extern "C" fn(Handle, u32, u64) -> Status,
    pub set_gpu_clk_range: unsafe extern "C" fn(Handle, u64, u64, u32) -> Status,
    pub set_gpu_perf_level: unsafe extern "C" fn(Handle, u32) -> Status,
    pub get_clk_freq: unsafe extern "C" fn(Handle, u32, *mut Frequencies) -> Status,
    pub get_clock_info: unsafe extern "C" fn(Handle, u32, *mut ClkInfo) -> Status,
    pub get_temp_metric: unsafe extern "C" fn(Handle, u32, u32, *mut i64) -> Status,
    pub get_gpu_activity: unsafe extern "C" fn(Handle, *mut EngineUsage) -> Status,
    pub get_gpu_memory_total: unsafe extern "C" fn(Handle, u32, *mut u64) -> Status,
    pub get_gpu_memory_usage: unsafe extern "C" fn(Handle, u32, *mut u64) -> Status,
    _lib: libloading::Library,
}

impl Api {
    /// Resolve every function from `lib`. A missing required symbol is an error naming it.
    ///
    /// # Safety
    /// `lib` must be an amdsmi library whose functions have the signatures above.
    pub unsafe fn load(lib: libloading::Library) -> Result<Api, GpuError> {
        macro_rules! sym {
            ($name:literal) => {
                *lib.get($name.as_bytes()).map_err(|e| {
                    GpuError::FunctionNotFound(format!(
                        "the loaded amdsmi library has no symbol {}: {e}",
                        $name
                    ))
                })?
            };
        }
        Ok(Api {
            init: sym!("amdsmi_init"),
            get_lib_version: sym!("amdsmi_get_lib_version"),
            get_socket_handles: sym!("amdsmi_get_socket_handles"),
            get_processor_handles: sym!("amdsmi_get_processor_handles"),
            get_processor_type: sym!("amdsmi_get_processor_type"),
            get_gpu_asic_info: sym!("amdsmi_get_gpu_asic_info"),
            get_gpu_board_info: sym!("amdsmi_get_gpu_board_info"),
            get_gpu_device_bdf: sym!("amdsmi_get_gpu_device_bdf"),
            get_gpu_device_uuid: sym!("amdsmi_get_gpu_device_uuid"),
            get_gpu_enumeration_info: lib.get(b"amdsmi_get_gpu_enumeration_info").ok().map(|s| *s),
            get_gpu_kfd_info: sym!("amdsmi_get_gpu_kfd_info"),
            get_energy_count: sym!("amdsmi_get_energy_count"),
            get_power_info: sym!("amdsmi_get_power_info"),
            get_power_cap_info: sym!("amdsmi_get_power_cap_info"),
            set_power_cap: sym!("amdsmi_set_power_cap"),
            set_gpu_clk_range: sym!("amdsmi_set_gpu_clk_range"),
            set_gpu_perf_level: sym!("amdsmi_set_gpu_perf_level"),
            get_clk_freq: sym!("amdsmi_get_clk_freq"),
            get_clock_info: sym!("amdsmi_get_clock_info"),
            get_temp_metric: sym!("amdsmi_get_temp_metric"),
            get_gpu_activity: sym!("amdsmi_get_gpu_activity"),
            get_gpu_memory_total: sym!("amdsmi_get_gpu_memory_total"),
            get_gpu_memory_usage: sym!("amdsmi_get_gpu_memory_usage"),
            _lib: lib,
        })
    }
}

/// A fixed-size C string field as a Rust string (up to its first NUL).
pub fn c_str(field: &[c_char]) -> String {
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Copy `s` into a fixed-size C string field, cut to fit with its NUL.
pub fn set_c_str(field: &mut [c_char], s: &str) {
    let n = s.len().min(field.len().saturating_sub(1));
    for (dst, &b) in field.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *dst = b as c_char;
    }
    if let Some(end) = field.get_mut(n) {
        *end = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_packs_as_amdsmi_does() {
        let b = Bdf::new(0, 0xc1, 0, 0);
        assert_eq!(b.as_uint, 0xc1 << 8);
        assert_eq!(b.to_bus_id(), "00000000:C1:00.0");
        let b = Bdf::new(1, 2, 3, 4);
        assert_eq!(b.to_bus_id(), "00000001:02:03.4");
    }

    #[test]
    fn statuses_map_both_ways() {
        for code in [
            status::INVAL,
            status::NOT_SUPPORTED,
            status::NO_PERM,
            status::NOT_INIT,
            status::TIMEOUT,
            status::NOT_FOUND,
            status::INSUFFICIENT_SIZE,
            status::DRIVER_NOT_LOADED,
        ] {
            let e = error_of(code, "amdsmi_x");
            assert_eq!(status_of(&e), code, "{e:?}");
            assert!(e.to_string().contains(status_name(code)));
        }
    }

    #[test]
    fn c_strings_round_trip_and_cut() {
        let mut f = [1 as c_char; 8];
        set_c_str(&mut f, "MI300X");
        assert_eq!(c_str(&f), "MI300X");
        set_c_str(&mut f, "a very long name");
        assert_eq!(c_str(&f), "a very ");
    }
}
