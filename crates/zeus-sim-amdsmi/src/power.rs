//! Energy, power readings and the power cap.
//!
//! Which power reading a board has is the preset's (MI300X `current_socket_power`, MI2xx
//! `average_socket_power`; `ZEUS_SIM_INSTANT_POWER` / `ZEUS_SIM_AVERAGE_POWER` override it),
//! and what a missing one reads is what the library writes in practice, `0xFFFF`. The odd die
//! of an MI250X reads 0 W and a counter of 0: its package's power and energy are in the even
//! die's readings.

use super::*;

/// What `amdsmi_get_power_info` writes in a field the board does not have: `0xFFFF`, as the
/// library does in practice (its docs say `UINT32_MAX`; the Python bindings test for `0xFFFF`).
const NA: u32 = ffi::NA_U32[1];

/// The only power sensor amdsmi's cap calls take on a GPU (`sensor_ind` 0).
const SENSOR: u32 = 0;

/// The energy accumulator, in ticks of `resolution` µJ (15.3 on the AMD presets), and when its
/// value was published (ns since the Unix epoch, on the simulator's clock).
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_energy_count(
    handle: Handle,
    accumulator: *mut u64,
    resolution: *mut f32,
    timestamp_ns: *mut u64,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(accumulator)?;
        nonnull(resolution)?;
        nonnull(timestamp_ns)?;
        let (ticks, t) = d.energy_counter_ticks().map_err(code)?;
        write(accumulator, ticks)?;
        write(resolution, d.preset().counter_unit_uj as f32)?;
        write(timestamp_ns, (t * 1e9) as u64)
    })
}

/// A power reading in whole watts, or `None` where the board lacks it.
fn watts(reading: Result<(u32, f64), GpuError>) -> Result<Option<u32>, Status> {
    match reading {
        Ok((mw, _)) => Ok(Some(mw.saturating_add(500) / 1000)),
        Err(GpuError::NotSupported(_)) => Ok(None),
        Err(e) => Err(code(e)),
    }
}

/// Socket power in W: `current_socket_power` and `average_socket_power` where the board has
/// them (else `0xFFFF`), `socket_power` the current one if there is one, else the average;
/// `power_limit` the cap in W; no voltages (`0xFFFF`).
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_power_info(
    handle: Handle,
    info: *mut ffi::PowerInfo,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(info)?;
        let current = watts(d.power_reading(true))?;
        let average = watts(d.power_reading(false))?;
        let limit_mw = d.power_management_limit().map_err(code)?;
        write(
            info,
            ffi::PowerInfo {
                socket_power: u64::from(current.or(average).unwrap_or(NA)),
                current_socket_power: current.unwrap_or(NA),
                average_socket_power: average.unwrap_or(NA),
                gfx_voltage: u64::from(NA),
                soc_voltage: u64::from(NA),
                mem_voltage: u64::from(NA),
                power_limit: limit_mw / 1000,
                _pad: 0,
                reserved: [0; 18],
            },
        )
    })
}

/// The power cap and its range, µW; `dpm_cap` the top graphics clock, MHz.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_power_cap_info(
    handle: Handle,
    sensor: u32,
    info: *mut ffi::PowerCapInfo,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(info)?;
        if sensor != SENSOR {
            return Err(status::INVAL);
        }
        let uw = |mw: u32| u64::from(mw) * 1000;
        let cap = d.power_management_limit().map_err(code)?;
        let default = d.power_management_limit_default().map_err(code)?;
        let (min, max) = d.power_management_limit_constraints().map_err(code)?;
        write(
            info,
            ffi::PowerCapInfo {
                power_cap: uw(cap),
                default_power_cap: uw(default),
                dpm_cap: u64::from(d.preset().max_graphics_clock_mhz),
                min_power_cap: uw(min),
                max_power_cap: uw(max),
                reserved: [0; 3],
            },
        )
    })
}

/// Set the power cap, µW (kept to the mW the model holds). `AMDSMI_STATUS_INVAL` out of the
/// board's range, `AMDSMI_STATUS_NO_PERM` with `ZEUS_SIM_PRIVILEGED=0`.
#[no_mangle]
pub extern "C" fn amdsmi_set_power_cap(handle: Handle, sensor: u32, cap_uw: u64) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        if sensor != SENSOR {
            return Err(status::INVAL);
        }
        let mw = u32::try_from(cap_uw / 1000).map_err(|_| status::INVAL)?;
        d.set_power_management_limit(mw).map_err(code)
    })
}
