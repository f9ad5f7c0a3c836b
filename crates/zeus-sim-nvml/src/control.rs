//! Simulator control (not NVML): the `zeusSim*` functions a test drives the model with.

use super::*;

/// Mark simulated GPU `index` busy (`busy != 0`) or idle.
#[no_mangle]
pub extern "C" fn zeusSimSetBusy(index: c_uint, busy: c_int) -> Ret {
    guard(|| {
        let c = cluster()?;
        let d = c.device(index as usize).map_err(code)?;
        d.set_load(if busy != 0 { Load::Busy } else { Load::Idle });
        Ok(())
    })
}

/// Make simulated GPU `index` draw `watts` from now on, whatever its workload (clamped to its
/// power limit), until its load changes: for tests whose board power must follow a known
/// function of the work they give it. `NVML_ERROR_INVALID_ARGUMENT` for a negative or
/// non-finite `watts`.
#[no_mangle]
pub extern "C" fn zeusSimSetPower(index: c_uint, watts: f64) -> Ret {
    guard(|| {
        let c = cluster()?;
        let d = c.device(index as usize).map_err(code)?;
        d.set_power_draw(watts).map_err(code)
    })
}

/// Advance the virtual clock by `seconds` (`NVML_ERROR_NOT_SUPPORTED` on the real clock).
#[no_mangle]
pub extern "C" fn zeusSimAdvance(seconds: f64) -> Ret {
    guard(|| {
        let c = cluster()?;
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(INVALID_ARGUMENT);
        }
        if c.clock().advance(seconds) {
            Ok(())
        } else {
            Err(NOT_SUPPORTED)
        }
    })
}

/// Run `work` units on every simulated GPU; writes the duration in seconds.
#[no_mangle]
pub unsafe extern "C" fn zeusSimRun(work: f64, seconds: *mut f64) -> Ret {
    guard(|| {
        let c = cluster()?;
        let all: Vec<usize> = (0..c.devices().len()).collect();
        let d = c.run(&all, work).map_err(code)?;
        if !seconds.is_null() {
            seconds.write(d);
        }
        Ok(())
    })
}

/// Make calls of simulated GPU `index` fail with NVML error `nvml_return` for `seconds` (`inf`:
/// for good), starting `after` seconds from now. `calls` is a bit set: 1 the energy counter, 2
/// the power readings, 4 every other device call (writes included), 8 writes alone.
#[no_mangle]
pub extern "C" fn zeusSimInjectFault(
    index: c_uint,
    calls: c_uint,
    after: f64,
    seconds: f64,
    nvml_return: c_uint,
) -> Ret {
    guard(|| {
        let c = cluster()?;
        let d = c.device(index as usize).map_err(code)?;
        let valid = after.is_finite() && after >= 0.0 && seconds >= 0.0 && !seconds.is_nan();
        if !valid
            || calls == 0
            || calls & !zeus_core::device::sim::board::calls::ALL != 0
            || nvml_return == SUCCESS
        {
            return Err(INVALID_ARGUMENT);
        }
        let now = c.clock().now();
        d.inject_fault(Fault {
            calls,
            from: now + after,
            until: now + after + seconds,
            code: nvml_return,
            gpu: None,
        });
        Ok(())
    })
}

/// Reset simulated GPU `index`'s energy counter to 0 now (as a driver reload does).
#[no_mangle]
pub extern "C" fn zeusSimResetCounter(index: c_uint) -> Ret {
    guard(|| {
        let c = cluster()?;
        c.device(index as usize).map_err(code)?.reset_counter();
        Ok(())
    })
}

/// Stop simulated GPU `index`'s energy counter where it stands (a board whose counter froze).
#[no_mangle]
pub extern "C" fn zeusSimFreezeCounter(index: c_uint) -> Ret {
    guard(|| {
        let c = cluster()?;
        c.device(index as usize).map_err(code)?.freeze_counter();
        Ok(())
    })
}

/// The model's exact energy of simulated GPU `index` so far (J, no counter lag or rounding):
/// the ground truth a test measures against.
#[no_mangle]
pub unsafe extern "C" fn zeusSimTrueEnergy(index: c_uint, joules: *mut f64) -> Ret {
    guard(|| {
        if joules.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let c = cluster()?;
        let e = c.device(index as usize).map_err(code)?.true_energy_j();
        joules.write(e);
        Ok(())
    })
}

/// The model's exact energy of simulated GPU `index` at `t` (J; `t` in seconds since the Unix
/// epoch, on the simulator's clock, within the last second or so the device remembers): the
/// ground truth of a window between two instants a monitor recorded, which a test cannot
/// bracket by reading [`zeusSimTrueEnergy`] around the monitor's calls when the machine is busy
/// (a 30 ms preemption between the two at 70 W is 2 J).
#[no_mangle]
pub unsafe extern "C" fn zeusSimTrueEnergyAt(index: c_uint, t: f64, joules: *mut f64) -> Ret {
    guard(|| {
        if joules.is_null() || !t.is_finite() {
            return Err(INVALID_ARGUMENT);
        }
        let c = cluster()?;
        let e = c.device(index as usize).map_err(code)?.true_energy_at(t);
        joules.write(e);
        Ok(())
    })
}

/// The NVML return code of an error name (`GPU_IS_LOST`, `NVML_ERROR_TIMEOUT`, ...), or 0 for
/// a name the simulator does not know; for tests that schedule faults by name.
#[no_mangle]
pub unsafe extern "C" fn zeusSimErrorCode(name: *const c_char) -> Ret {
    if name.is_null() {
        return 0;
    }
    CStr::from_ptr(name)
        .to_str()
        .ok()
        .and_then(error_code)
        .unwrap_or(0)
}
