//! The AMD backend: amdsmi (`libamd_smi.so`), loaded at run time through our own FFI
//! ([`ffi`]).
//!
//! No published Rust binding fits: the crates.io name `amdsmi` belongs to a third party, AMD's
//! own crate is unpublished and links at build time, and the rest are young single-owner
//! crates. So, like zeusd upstream, zeus carries the few calls it makes and loads the library
//! with `libloading`; without it [`open_all`] returns [`GpuError::LibraryNotFound`] saying how to
//! use the simulated GPU.
//!
//! Where the library is looked for: `ZEUS_AMDSMI_LIB` (a file), else `libamd_smi.so` on the
//! loader's path, `$ROCM_PATH/lib`, `$AMDSMI_LIB_DIR`, `/opt/rocm/lib`, then the newest
//! `/opt/rocm-*/lib`.
//!
//! What the backend copes with (see `docs/amd.md`):
//! - AMD SMI before ROCm 7.2 (library 24.x, 25.x, 26.0 and 26.1) is not thread-safe: every call
//!   is made under one process-wide lock there.
//! - Devices are ordered as HIP numbers them (`amdsmi_get_gpu_enumeration_info`'s `hip_id`, or
//!   the KFD node id where the library predates that call), not by PCI address: on MI350X in
//!   SPX/NPS1 the two differ, and users pass HIP indices.
//! - Power: `current_socket_power` (MI300 and later) or `average_socket_power` (MI200 and
//!   earlier), whichever the board fills; unfilled fields hold `UINT32_MAX` or `0xFFFF`.
//! - Energy: the accumulator times its resolution (µJ). Whether the counter can be trusted is
//!   decided when the devices are opened (`device/counter_check.rs`).
//! - Clocks: a range per domain (`amdsmi_set_gpu_clk_range`); a single domain cannot be reset,
//!   so a reset puts the performance level back to `AUTO`, which resets both, and then sets
//!   the other domain's range again if it was locked: resetting one domain leaves the other as
//!   it was, as on NVIDIA (zeusd's clients each hold their own domain).
//! - Persistence mode does not exist on AMD: its calls are `NotSupported`.

pub mod ffi;

use std::ffi::{c_char, OsString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use ffi::{Api, Handle, Status};

use super::{Architecture, Gpu, GpuError, GpuResult, MemoryInfo, PowerSample, Utilization, Vendor};

const NO_AMDSMI_HINT: &str =
    "amdsmi (libamd_smi.so) could not be loaded, so no AMD GPU can be used. Install ROCm's \
amd-smi-lib, or set ZEUS_AMDSMI_LIB to the path of a libamd_smi.so (`python -m zeus.device.sim \
amdsmi-path` prints the simulated one); on a machine without GPUs, opt in to the simulated GPU \
with ZEUS_GPU_BACKEND=sim (ZEUS_SIM_GPUS=MI300X picks the model)";

/// The loaded library and what it said about itself.
struct Library {
    api: Api,
    /// `major.minor.release` of the library.
    version: (u32, u32, u32),
    /// Every call is made under this lock where the library is not thread-safe.
    serialize: bool,
}

static LIBRARY: OnceLock<Library> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());
/// The process-wide lock of a library that is not thread-safe.
static CALL_LOCK: Mutex<()> = Mutex::new(());

/// Whether a library of this version must be called from one thread at a time: AMD SMI became
/// thread-safe in ROCm 7.2 (library 26.2).
pub fn needs_serializing(version: (u32, u32, u32)) -> bool {
    let (major, minor, _) = version;
    major < 26 || (major == 26 && minor < 2)
}

/// Where to look for the library, in order.
fn candidates() -> Vec<OsString> {
    if let Some(p) = std::env::var_os("ZEUS_AMDSMI_LIB").filter(|p| !p.is_empty()) {
        return vec![p];
    }
    let mut out: Vec<OsString> = vec!["libamd_smi.so".into()];
    for var in ["ROCM_PATH", "AMDSMI_LIB_DIR"] {
        if let Some(dir) = std::env::var_os(var).filter(|d| !d.is_empty()) {
            let dir = PathBuf::from(dir);
            let dir = if var == "ROCM_PATH" {
                dir.join("lib")
            } else {
                dir
            };
            out.push(dir.join("libamd_smi.so").into());
        }
    }
    out.push("/opt/rocm/lib/libamd_smi.so".into());
    // The newest versioned install (`/opt/rocm-7.1.0`), by name.
    if let Ok(entries) = std::fs::read_dir("/opt") {
        let mut versioned: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("rocm-"))
            })
            .collect();
        versioned.sort();
        if let Some(newest) = versioned.pop() {
            out.push(newest.join("lib/libamd_smi.so").into());
        }
    }
    out
}

fn library() -> GpuResult<&'static Library> {
    if let Some(l) = LIBRARY.get() {
        return Ok(l);
    }
    let _g = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = LIBRARY.get() {
        return Ok(l);
    }
    let mut tried = Vec::new();
    let mut loaded = None;
    for c in candidates() {
        // SAFETY: loading runs the library's initialisers; an amdsmi library is what every
        // candidate names.
        match unsafe { libloading::Library::new(&c) } {
            Ok(lib) => {
                loaded = Some(lib);
                break;
            }
            Err(e) => tried.push(format!("{}: {e}", c.to_string_lossy())),
        }
    }
    let lib = loaded.ok_or_else(|| {
        GpuError::LibraryNotFound(format!("{NO_AMDSMI_HINT} (tried {})", tried.join("; ")))
    })?;
    // SAFETY: the symbols are amdsmi's, with the signatures of `ffi::Api`.
    let api = unsafe { Api::load(lib)? };
    // SAFETY: plain init call; the flag asks for AMD GPUs only.
    check(unsafe { (api.init)(ffi::INIT_AMD_GPUS) }, "amdsmi_init")?;
    let mut v = ffi::Version {
        major: 0,
        minor: 0,
        release: 0,
        _pad: 0,
        build: std::ptr::null(),
    };
    // SAFETY: `v` is a valid `amdsmi_version_t` to fill.
    check(
        unsafe { (api.get_lib_version)(&mut v) },
        "amdsmi_get_lib_version",
    )?;
    let version = (v.major, v.minor, v.release);
    let l = Library {
        api,
        version,
        serialize: needs_serializing(version),
    };
    Ok(LIBRARY.get_or_init(|| l))
}

fn check(code: Status, call: &str) -> GpuResult<()> {
    if code == ffi::status::SUCCESS {
        Ok(())
    } else {
        Err(ffi::error_of(code, call))
    }
}

/// The loaded library's version, `(major, minor, release)`, loading it if needed.
pub fn library_version() -> GpuResult<(u32, u32, u32)> {
    library().map(|l| l.version)
}

/// A processor handle. amdsmi's handles are process-wide and stay valid until
/// `amdsmi_shut_down`, which zeus never calls (the library stays loaded for the process, as the
/// NVML backend keeps NVML), so they may be used from any thread; where the library is not
/// thread-safe, calls are serialized by [`CALL_LOCK`].
#[derive(Clone, Copy)]
struct ProcessorHandle(Handle);
// SAFETY: see the type's doc: the handle is an opaque process-wide token.
unsafe impl Send for ProcessorHandle {}
// SAFETY: as above.
unsafe impl Sync for ProcessorHandle {}

/// One AMD GPU (a die of a two-die board counts as one, as amdsmi lists it).
pub struct AmdGpu {
    lib: &'static Library,
    handle: ProcessorHandle,
    name: String,
    uuid: String,
    bus_id: String,
}

/// Open every AMD GPU amdsmi lists, in HIP order.
pub fn open_all() -> GpuResult<Vec<Arc<dyn Gpu>>> {
    let lib = library()?;
    let api = &lib.api;
    let _serial = lib.serialize.then(lock_calls);
    let sockets = list(
        |n, out| unsafe { (api.get_socket_handles)(n, out) },
        "amdsmi_get_socket_handles",
    )?;
    let mut handles = Vec::new();
    for s in sockets {
        let procs = list(
            |n, out| unsafe { (api.get_processor_handles)(s, n, out) },
            "amdsmi_get_processor_handles",
        )?;
        for p in procs {
            let mut kind = 0u32;
            // SAFETY: `p` came from the library; `kind` is a valid out pointer.
            check(
                unsafe { (api.get_processor_type)(p, &mut kind) },
                "amdsmi_get_processor_type",
            )?;
            if kind == ffi::PROCESSOR_TYPE_AMD_GPU {
                handles.push(p);
            }
        }
    }
    // HIP's order: the enumeration info's `hip_id` where the library has it, else the KFD
    // node id (what Zeus does on ROCm 6.3).
    let mut keyed = Vec::with_capacity(handles.len());
    for h in handles {
        let key = match api.get_gpu_enumeration_info {
            Some(f) => {
                // SAFETY: zeroed plain-data struct to be filled.
                let mut info: ffi::EnumerationInfo = unsafe { std::mem::zeroed() };
                check(
                    unsafe { f(h, &mut info) },
                    "amdsmi_get_gpu_enumeration_info",
                )?;
                u64::from(info.hip_id)
            }
            None => {
                // SAFETY: as above.
                let mut info: ffi::KfdInfo = unsafe { std::mem::zeroed() };
                check(
                    unsafe { (api.get_gpu_kfd_info)(h, &mut info) },
                    "amdsmi_get_gpu_kfd_info",
                )?;
                u64::from(info.node_id)
            }
        };
        keyed.push((key, h));
    }
    keyed.sort_by_key(|&(k, _)| k);
    drop(_serial);
    keyed
        .into_iter()
        .map(|(_, h)| AmdGpu::open(lib, ProcessorHandle(h)).map(|g| Arc::new(g) as Arc<dyn Gpu>))
        .collect()
}

/// A handle list through amdsmi's two-call idiom (count with a null array, then fill).
fn list(f: impl Fn(*mut u32, *mut Handle) -> Status, call: &str) -> GpuResult<Vec<Handle>> {
    let mut n = 0u32;
    check(f(&mut n, std::ptr::null_mut()), call)?;
    let mut out: Vec<Handle> = vec![std::ptr::null_mut(); n as usize];
    check(f(&mut n, out.as_mut_ptr()), call)?;
    out.truncate(n as usize);
    Ok(out)
}

fn lock_calls() -> MutexGuard<'static, ()> {
    CALL_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

impl AmdGpu {
    fn open(lib: &'static Library, handle: ProcessorHandle) -> GpuResult<AmdGpu> {
        let mut g = AmdGpu {
            lib,
            handle,
            name: String::new(),
            uuid: String::new(),
            bus_id: String::new(),
        };
        // SAFETY: zeroed plain-data structs to be filled.
        let mut asic: ffi::AsicInfo = unsafe { std::mem::zeroed() };
        g.call("amdsmi_get_gpu_asic_info", |api, h| unsafe {
            (api.get_gpu_asic_info)(h, &mut asic)
        })?;
        g.name = ffi::c_str(&asic.market_name);
        if g.name.is_empty() {
            let mut board: ffi::BoardInfo = unsafe { std::mem::zeroed() };
            g.call("amdsmi_get_gpu_board_info", |api, h| unsafe {
                (api.get_gpu_board_info)(h, &mut board)
            })?;
            g.name = ffi::c_str(&board.product_name);
        }
        let mut buf = [0 as c_char; 64];
        let mut len = buf.len() as u32;
        g.call("amdsmi_get_gpu_device_uuid", |api, h| unsafe {
            (api.get_gpu_device_uuid)(h, &mut len, buf.as_mut_ptr())
        })?;
        let raw = ffi::c_str(&buf);
        // CUDA's form, which the visible-devices variables accept on both vendors.
        g.uuid = if raw.to_ascii_uppercase().starts_with("GPU-") {
            raw
        } else {
            format!("GPU-{raw}")
        };
        let mut bdf = ffi::Bdf::default();
        g.call("amdsmi_get_gpu_device_bdf", |api, h| unsafe {
            (api.get_gpu_device_bdf)(h, &mut bdf)
        })?;
        g.bus_id = bdf.to_bus_id();
        Ok(g)
    }

    /// Make one library call, under the process-wide lock where the library needs it.
    fn call(&self, name: &str, f: impl FnOnce(&Api, Handle) -> Status) -> GpuResult<()> {
        let _serial = self.lib.serialize.then(lock_calls);
        check(f(&self.lib.api, self.handle.0), name)
    }

    fn power_info(&self) -> GpuResult<ffi::PowerInfo> {
        let mut info = ffi::PowerInfo::default();
        self.call("amdsmi_get_power_info", |api, h| unsafe {
            (api.get_power_info)(h, &mut info)
        })?;
        Ok(info)
    }

    fn cap_info(&self) -> GpuResult<ffi::PowerCapInfo> {
        let mut info = ffi::PowerCapInfo::default();
        self.call("amdsmi_get_power_cap_info", |api, h| unsafe {
            (api.get_power_cap_info)(h, 0, &mut info)
        })?;
        Ok(info)
    }

    fn frequencies_mhz(&self, clk: u32) -> GpuResult<Vec<u32>> {
        // SAFETY: zeroed plain-data struct to be filled.
        let mut f: ffi::Frequencies = unsafe { std::mem::zeroed() };
        self.call("amdsmi_get_clk_freq", |api, h| unsafe {
            (api.get_clk_freq)(h, clk, &mut f)
        })?;
        let n = (f.num_supported as usize).min(f.frequency.len());
        let mut v: Vec<u32> = f.frequency[..n]
            .iter()
            .map(|&hz| (hz / 1_000_000) as u32)
            .collect();
        // Highest first, as NVML lists them.
        v.sort_unstable_by(|a, b| b.cmp(a));
        v.dedup();
        Ok(v)
    }

    fn clock_now_mhz(&self, clk: u32) -> GpuResult<u32> {
        let mut info = ffi::ClkInfo::default();
        self.call("amdsmi_get_clock_info", |api, h| unsafe {
            (api.get_clock_info)(h, clk, &mut info)
        })?;
        Ok(info.clk)
    }

    fn set_range(&self, clk: u32, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        self.call("amdsmi_set_gpu_clk_range", |api, h| unsafe {
            (api.set_gpu_clk_range)(h, u64::from(min_mhz), u64::from(max_mhz), clk)
        })
    }

    /// Reset domain `clk`'s range and keep the other's: amdsmi resets only both at once (the
    /// `AUTO` performance level), so a locked other domain is locked again after it.
    fn reset_clocks(&self, clk: u32) -> GpuResult<()> {
        let other = if clk == ffi::CLK_TYPE_GFX {
            ffi::CLK_TYPE_MEM
        } else {
            ffi::CLK_TYPE_GFX
        };
        let mut kept = ffi::ClkInfo::default();
        self.call("amdsmi_get_clock_info", |api, h| unsafe {
            (api.get_clock_info)(h, other, &mut kept)
        })?;
        self.call("amdsmi_set_gpu_perf_level", |api, h| unsafe {
            (api.set_gpu_perf_level)(h, ffi::DEV_PERF_LEVEL_AUTO)
        })?;
        if kept.clk_locked != 0 {
            self.set_range(other, kept.min_clk, kept.max_clk)?;
        }
        Ok(())
    }
}

/// A `power_info` field in W as mW, or `NotSupported` where the board leaves it unfilled.
fn watts_field(value: u32, field: &str) -> GpuResult<u32> {
    if ffi::NA_U32.contains(&value) {
        Err(GpuError::NotSupported(format!(
            "amdsmi_get_power_info: {field} is not available on this GPU"
        )))
    } else {
        Ok(value.saturating_mul(1000))
    }
}

impl Gpu for AmdGpu {
    fn name(&self) -> GpuResult<String> {
        Ok(self.name.clone())
    }
    fn vendor(&self) -> Vendor {
        Vendor::Amd
    }
    fn uuid(&self) -> GpuResult<String> {
        Ok(self.uuid.clone())
    }
    fn architecture(&self) -> GpuResult<Architecture> {
        // The market name says the generation (amdsmi has no architecture call).
        let n = self.name.to_ascii_uppercase();
        Ok(if n.contains("MI3") {
            Architecture::Cdna3
        } else if n.contains("MI2") {
            Architecture::Cdna2
        } else {
            Architecture::Unknown
        })
    }
    fn power_management_limit_constraints(&self) -> GpuResult<(u32, u32)> {
        let c = self.cap_info()?;
        Ok((
            (c.min_power_cap / 1000) as u32,
            (c.max_power_cap / 1000) as u32,
        ))
    }
    fn power_management_limit_default(&self) -> GpuResult<u32> {
        Ok((self.cap_info()?.default_power_cap / 1000) as u32)
    }
    fn power_management_limit(&self) -> GpuResult<u32> {
        Ok((self.cap_info()?.power_cap / 1000) as u32)
    }
    fn set_power_management_limit(&self, milliwatts: u32) -> GpuResult<()> {
        self.call("amdsmi_set_power_cap", |api, h| unsafe {
            (api.set_power_cap)(h, 0, u64::from(milliwatts) * 1000)
        })
    }
    fn persistence_mode(&self) -> GpuResult<bool> {
        Err(GpuError::NotSupported(
            "persistence mode: AMD GPUs have none".into(),
        ))
    }
    fn set_persistence_mode(&self, _enabled: bool) -> GpuResult<()> {
        Err(GpuError::NotSupported(
            "persistence mode: AMD GPUs have none".into(),
        ))
    }
    fn supported_memory_clocks(&self) -> GpuResult<Vec<u32>> {
        self.frequencies_mhz(ffi::CLK_TYPE_MEM)
    }
    fn supported_graphics_clocks(&self, memory_clock_mhz: u32) -> GpuResult<Vec<u32>> {
        let mem = self.supported_memory_clocks()?;
        if !mem.contains(&memory_clock_mhz) {
            return Err(GpuError::InvalidArg(format!(
                "memory clock {memory_clock_mhz} MHz is not supported (supported: {mem:?})"
            )));
        }
        self.frequencies_mhz(ffi::CLK_TYPE_GFX)
    }
    fn set_gpu_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        self.set_range(ffi::CLK_TYPE_GFX, min_mhz, max_mhz)
    }
    fn reset_gpu_locked_clocks(&self) -> GpuResult<()> {
        self.reset_clocks(ffi::CLK_TYPE_GFX)
    }
    fn set_memory_locked_clocks(&self, min_mhz: u32, max_mhz: u32) -> GpuResult<()> {
        self.set_range(ffi::CLK_TYPE_MEM, min_mhz, max_mhz)
    }
    fn reset_memory_locked_clocks(&self) -> GpuResult<()> {
        self.reset_clocks(ffi::CLK_TYPE_MEM)
    }
    fn average_power_usage(&self) -> GpuResult<u32> {
        watts_field(
            self.power_info()?.average_socket_power,
            "average_socket_power",
        )
    }
    fn instant_power_usage(&self) -> GpuResult<u32> {
        watts_field(
            self.power_info()?.current_socket_power,
            "current_socket_power",
        )
    }
    fn power_sample(&self, instant: bool) -> GpuResult<PowerSample> {
        let info = self.power_info()?;
        let milliwatts = if instant {
            watts_field(info.current_socket_power, "current_socket_power")?
        } else {
            watts_field(info.average_socket_power, "average_socket_power")?
        };
        Ok(PowerSample {
            milliwatts,
            timestamp: None,
        })
    }
    fn supports_total_energy_consumption(&self) -> GpuResult<bool> {
        match self.total_energy_consumption() {
            Ok(_) => Ok(true),
            Err(GpuError::NotSupported(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }
    fn total_energy_consumption(&self) -> GpuResult<u64> {
        let (mut acc, mut res, mut ts) = (0u64, 0f32, 0u64);
        self.call("amdsmi_get_energy_count", |api, h| unsafe {
            (api.get_energy_count)(h, &mut acc, &mut res, &mut ts)
        })?;
        // µJ = accumulator × resolution; in mJ.
        Ok((acc as f64 * f64::from(res) / 1000.0) as u64)
    }
    fn pci_bus_id(&self) -> GpuResult<String> {
        Ok(self.bus_id.clone())
    }
    fn counter_lag(&self) -> Option<f64> {
        // `energy_accumulator` and the socket powers are fields of the same GPU metrics table.
        Some(0.0)
    }
    fn counter_is_exact(&self) -> Option<bool> {
        // It moves in steps (each metrics update, about a millisecond apart): not exact at
        // every read, though two reads a few milliseconds apart always differ, which is all
        // the monitor's probe could check.
        Some(false)
    }
    fn current_clocks_mhz(&self) -> GpuResult<(u32, u32)> {
        Ok((
            self.clock_now_mhz(ffi::CLK_TYPE_GFX)?,
            self.clock_now_mhz(ffi::CLK_TYPE_MEM)?,
        ))
    }
    fn temperature_c(&self) -> GpuResult<u32> {
        let mut t = 0i64;
        self.call("amdsmi_get_temp_metric", |api, h| unsafe {
            (api.get_temp_metric)(h, ffi::TEMPERATURE_TYPE_HOTSPOT, ffi::TEMP_CURRENT, &mut t)
        })?;
        Ok(t.clamp(0, i64::from(u32::MAX)) as u32)
    }
    fn memory_info(&self) -> GpuResult<MemoryInfo> {
        let (mut total, mut used) = (0u64, 0u64);
        self.call("amdsmi_get_gpu_memory_total", |api, h| unsafe {
            (api.get_gpu_memory_total)(h, ffi::MEM_TYPE_VRAM, &mut total)
        })?;
        self.call("amdsmi_get_gpu_memory_usage", |api, h| unsafe {
            (api.get_gpu_memory_usage)(h, ffi::MEM_TYPE_VRAM, &mut used)
        })?;
        Ok(MemoryInfo { total, used })
    }
    fn utilization_rates(&self) -> GpuResult<Utilization> {
        let mut u = ffi::EngineUsage::default();
        self.call("amdsmi_get_gpu_activity", |api, h| unsafe {
            (api.get_gpu_activity)(h, &mut u)
        })?;
        Ok(Utilization {
            gpu: u.gfx_activity,
            memory: u.umc_activity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_safety_follows_the_library_version() {
        assert!(needs_serializing((24, 7, 1)));
        assert!(needs_serializing((25, 5, 0)));
        assert!(needs_serializing((26, 0, 2)));
        assert!(needs_serializing((26, 1, 0)));
        assert!(!needs_serializing((26, 2, 0)));
        assert!(!needs_serializing((27, 0, 0)));
    }

    #[test]
    fn unfilled_power_fields_are_not_supported() {
        assert_eq!(watts_field(412, "x").unwrap(), 412_000);
        for na in ffi::NA_U32 {
            assert!(matches!(
                watts_field(na, "current_socket_power"),
                Err(GpuError::NotSupported(m)) if m.contains("current_socket_power")
            ));
        }
    }

    #[test]
    fn a_missing_library_is_a_clear_error() {
        // No other test of this binary loads amdsmi, so pointing the variable at a file that
        // does not exist is seen by this call alone (a failed load is not cached).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libamd_smi.so");
        std::env::set_var("ZEUS_AMDSMI_LIB", &path);
        let e = open_all().err().expect("no library there");
        std::env::remove_var("ZEUS_AMDSMI_LIB");
        let GpuError::LibraryNotFound(m) = e else {
            panic!("{e:?}");
        };
        assert!(m.contains("ZEUS_GPU_BACKEND=sim"), "{m}");
        assert!(m.contains(&path.display().to_string()), "{m}");
    }
}
