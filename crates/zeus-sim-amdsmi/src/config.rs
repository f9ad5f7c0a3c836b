//! What the library is configured with: the simulator's `ZEUS_SIM_*` variables (narrowed to AMD
//! boards) and this library's own switches, `ZEUS_SIM_AMDSMI_THREAD_UNSAFE`,
//! `ZEUS_SIM_AMDSMI_VERSION` and `ZEUS_SIM_AMD_HIP_ORDER`.

use super::*;

/// The library version reported unless `ZEUS_SIM_AMDSMI_VERSION` says otherwise: AMD SMI
/// 26.0.2, the library of ROCm 7.0.2 (the one the `amdsmi` 7.0.2 bindings ship with), which is
/// not thread-safe.
pub(crate) const DEFAULT_VERSION: (u32, u32, u32) = (26, 0, 2);

/// The value of `name`, or `None` when unset or blank.
fn env_value(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `ZEUS_SIM_AMDSMI_VERSION=MAJOR.MINOR.RELEASE`: the version `amdsmi_get_lib_version`
/// reports, so that a caller's handling of older (24.x, 25.x) or thread-safe (ROCm 7.2 and later)
/// libraries can be tested.
pub(crate) fn version() -> Result<(u32, u32, u32), String> {
    let Some(v) = env_value("ZEUS_SIM_AMDSMI_VERSION") else {
        return Ok(DEFAULT_VERSION);
    };
    let parts: Vec<Option<u32>> = v.split('.').map(|p| p.parse().ok()).collect();
    match parts.as_slice() {
        [Some(major), Some(minor), Some(release)] => Ok((*major, *minor, *release)),
        _ => Err(format!(
            "ZEUS_SIM_AMDSMI_VERSION={v:?} is not valid: use MAJOR.MINOR.RELEASE, e.g. 26.0.2"
        )),
    }
}

/// `ZEUS_SIM_AMDSMI_THREAD_UNSAFE`: `1` makes every call linger (see [`crate::Call`]).
fn thread_unsafe() -> Result<bool, String> {
    match env_value("ZEUS_SIM_AMDSMI_THREAD_UNSAFE").as_deref() {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(format!(
            "ZEUS_SIM_AMDSMI_THREAD_UNSAFE={v:?} is not valid: use 1 or 0"
        )),
    }
}

/// The HIP runtime's id of each of `n` devices. By default HIP numbers GPUs in the library's
/// (PCI) order; `ZEUS_SIM_AMD_HIP_ORDER=reversed` numbers them backwards, as on an MI350X in
/// SPX/NPS1 mode, where HIP's order is not amdsmi's: a caller that maps `HIP_VISIBLE_DEVICES`
/// indices onto amdsmi handles by position picks the wrong GPU there, and this switch shows it.
pub(crate) fn hip_ids(n: usize) -> Result<Vec<u32>, String> {
    let reversed = match env_value("ZEUS_SIM_AMD_HIP_ORDER")
        .map(|v| v.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("pci") => false,
        Some("reversed") => true,
        Some(v) => {
            return Err(format!(
                "ZEUS_SIM_AMD_HIP_ORDER={v:?} is not valid: use 'pci' (the default) or 'reversed'"
            ))
        }
    };
    Ok((0..n)
        .map(|i| if reversed { n - 1 - i } else { i } as u32)
        .collect())
}

/// Read the configuration and build the devices (done once per process, by the first
/// `amdsmi_init`). The error names the variable at fault.
pub(crate) fn build() -> Result<Library, String> {
    let config = SimConfig::from_env_for(Vendor::Amd).map_err(|e| e.to_string())?;
    version()?;
    let thread_unsafe = thread_unsafe()?;
    let privileged = config.privileged;
    let cluster = SimCluster::open(config).map_err(|e| e.to_string())?;
    let devices = cluster.devices();
    let hip_ids = hip_ids(devices.len())?;

    let mut sockets: Vec<Socket> = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        // An odd die belongs to the package of the even die before it.
        match (d.die(), sockets.last_mut()) {
            (Die::Odd, Some(s)) => s.devices.push(i),
            _ => {
                let b = bdf(d).map_err(|s| format!("device {i}: no PCI address ({s})"))?;
                let v = b.as_uint;
                sockets.push(Socket {
                    devices: vec![i],
                    id: format!(
                        "{:04x}:{:02x}:{:02x}.{:x}",
                        v >> 16,
                        (v >> 8) & 0xff,
                        (v >> 3) & 0x1f,
                        v & 0x7
                    ),
                })
            }
        }
    }
    let states = devices
        .iter()
        .map(|_| {
            Mutex::new(DeviceState {
                perf_level: ffi::DEV_PERF_LEVEL_AUTO,
                gfx_range: None,
                mem_range: None,
            })
        })
        .collect();
    THREAD_UNSAFE.store(thread_unsafe, Ordering::Relaxed);
    Ok(Library {
        cluster,
        sockets,
        hip_ids,
        privileged,
        states,
    })
}
