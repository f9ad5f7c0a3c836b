//! Simulator control (not amdsmi): the `zeusSimAmd*` functions a test drives the model with.
//! Indices are the library's device order (the order `amdsmi_get_processor_handles` lists the
//! devices in, socket by socket). These are not amdsmi calls, so they are not counted as calls
//! in flight: a test may drive the model while its code under test calls amdsmi.

use super::*;

/// The device at `index` in the library's order.
fn at(index: u32) -> Result<&'static SimGpu, Status> {
    let lib = library()?;
    lib.cluster
        .devices()
        .get(index as usize)
        .map(|d| &**d)
        .ok_or(status::INVAL)
}

/// Mark simulated GPU `index` busy (`busy != 0`) or idle.
#[no_mangle]
pub extern "C" fn zeusSimAmdSetBusy(index: u32, busy: i32) -> Status {
    caught(|| {
        let load = if busy != 0 {
            zeus_core::device::sim::Load::Busy
        } else {
            zeus_core::device::sim::Load::Idle
        };
        at(index)?.set_load(load);
        Ok(())
    })
}

/// Make simulated GPU `index` draw `watts` from now on, whatever its workload (clamped to its
/// power cap), until its load changes. `AMDSMI_STATUS_INVAL` for a negative or non-finite
/// `watts`.
#[no_mangle]
pub extern "C" fn zeusSimAmdSetPower(index: u32, watts: f64) -> Status {
    caught(|| at(index)?.set_power_draw(watts).map_err(code))
}

/// Advance the virtual clock by `seconds` (`AMDSMI_STATUS_NOT_SUPPORTED` on the real clock).
#[no_mangle]
pub extern "C" fn zeusSimAmdAdvance(seconds: f64) -> Status {
    caught(|| {
        let lib = library()?;
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(status::INVAL);
        }
        if lib.cluster.clock().advance(seconds) {
            Ok(())
        } else {
            Err(status::NOT_SUPPORTED)
        }
    })
}

/// The model's exact energy of simulated GPU `index` so far (J, no counter lag or rounding):
/// the ground truth a test measures against. It is the die's own energy: the even die of an
/// MI250X counts its partner's too, so compare its counter with the sum of both dies'.
#[no_mangle]
pub unsafe extern "C" fn zeusSimAmdTrueEnergy(index: u32, joules: *mut f64) -> Status {
    caught(|| {
        nonnull(joules)?;
        let e = at(index)?.true_energy_j();
        write(joules, e)
    })
}

/// Stop simulated GPU `index`'s energy counter where it stands (a board whose counter froze,
/// as MI100's did).
#[no_mangle]
pub extern "C" fn zeusSimAmdFreezeCounter(index: u32) -> Status {
    caught(|| {
        at(index)?.freeze_counter();
        Ok(())
    })
}

/// How many amdsmi calls started while another was running, since the library was loaded or
/// last reset: 0 for a caller that serializes its calls.
#[no_mangle]
pub extern "C" fn zeusSimAmdOverlaps() -> u64 {
    OVERLAPS.load(Ordering::SeqCst)
}

/// Start counting overlaps from 0.
#[no_mangle]
pub extern "C" fn zeusSimAmdResetOverlaps() {
    OVERLAPS.store(0, Ordering::SeqCst);
}
