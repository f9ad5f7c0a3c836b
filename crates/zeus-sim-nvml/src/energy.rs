//! Power and energy: power usage, the total-energy counter, field values.

use super::*;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: Handle, power: *mut c_uint) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(power, d.average_power_usage().map_err(code)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: Handle,
    energy: *mut c_ulonglong,
) -> Ret {
    guard(|| {
        let (_, d) = self::device(device)?;
        write(energy, d.total_energy_consumption().map_err(code)?)
    })
}

/// `nvmlFieldValue_t` from `nvml.h`.
#[repr(C)]
pub struct FieldValue {
    pub field_id: c_uint,
    pub scope_id: c_uint,
    pub timestamp: c_longlong,
    pub latency_usec: c_longlong,
    pub value_type: c_uint,
    pub nvml_return: c_uint,
    pub value: u64,
}

const NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: c_uint = 83;
const NVML_FI_DEV_POWER_AVERAGE: c_uint = 185;
const NVML_FI_DEV_POWER_INSTANT: c_uint = 186;
const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
const NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;

/// Field values: the energy counter and both power readings. `timestamp` is "CPU Timestamp of
/// this value in microseconds since 1970": the moment the driver updated the value (the
/// update a power reading comes from, the moment the counter published its value), or the
/// moment of the call with `ZEUS_SIM_FIELD_TIMESTAMP=call`. `latencyUsec` is what the read
/// cost.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: Handle,
    count: c_int,
    values: *mut FieldValue,
) -> Ret {
    guard(|| {
        let (c, d) = self::device(device)?;
        if count < 0 || (count > 0 && values.is_null()) {
            return Err(INVALID_ARGUMENT);
        }
        let call_timestamps = d.board().field_timestamps == FieldTimestamps::Call;
        for i in 0..count as usize {
            let fv = &mut *values.add(i);
            let started = Instant::now();
            let r = match fv.field_id {
                NVML_FI_DEV_POWER_INSTANT => d
                    .power_reading(true)
                    .map(|(mw, t)| (u64::from(mw), t, NVML_VALUE_TYPE_UNSIGNED_INT)),
                NVML_FI_DEV_POWER_AVERAGE => d
                    .power_reading(false)
                    .map(|(mw, t)| (u64::from(mw), t, NVML_VALUE_TYPE_UNSIGNED_INT)),
                NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => d
                    .energy_reading()
                    .map(|(mj, t)| (mj, t, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)),
                _ => Err(GpuError::NotSupported(String::new())),
            };
            let now = c.clock().now();
            fv.latency_usec = started.elapsed().as_micros() as c_longlong;
            match r {
                Ok((v, t, kind)) => {
                    fv.nvml_return = SUCCESS;
                    fv.value_type = kind;
                    fv.value = v;
                    let t = if call_timestamps { now } else { t };
                    fv.timestamp = (t * 1e6) as c_longlong;
                }
                Err(e) => {
                    fv.nvml_return = e.nvml_code();
                    fv.value_type = NVML_VALUE_TYPE_UNSIGNED_INT;
                    fv.value = 0;
                    fv.timestamp = (now * 1e6) as c_longlong;
                }
            }
        }
        Ok(())
    })
}
