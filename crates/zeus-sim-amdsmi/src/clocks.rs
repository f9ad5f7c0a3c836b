//! Clocks: supported levels, the current clock, clock ranges and the performance level.
//!
//! Two domains are modelled, graphics (`AMDSMI_CLK_TYPE_GFX`) and memory
//! (`AMDSMI_CLK_TYPE_MEM`); the other clock types read as `AMDSMI_STATUS_NOT_SUPPORTED`. A
//! clock range set with `amdsmi_set_gpu_clk_range` locks the board's clocks as NVML's locked
//! clocks do and puts the device in the MANUAL performance level. amdsmi has no call that
//! resets one domain: setting the performance level back to AUTO resets both, which is how a
//! caller undoes a range.

use super::*;

/// `AMDSMI_DEV_PERF_LEVEL_LAST` (= `AMDSMI_DEV_PERF_LEVEL_DETERMINISM`, amdsmi.h): the highest
/// level a caller may set.
const DEV_PERF_LEVEL_LAST: u32 = 8;
/// `AMDSMI_CLK_TYPE__MAX` (= `AMDSMI_CLK_TYPE_DCLK1`, amdsmi.h): the highest clock type.
const CLK_TYPE_MAX: u32 = 9;

#[derive(Debug, Clone, Copy)]
enum Domain {
    Gfx,
    Mem,
}

/// The domain a clock type reads: `AMDSMI_STATUS_NOT_SUPPORTED` for a clock type the model
/// lacks, `AMDSMI_STATUS_INVAL` for one amdsmi does not define.
fn domain(clk_type: u32) -> Result<Domain, Status> {
    match clk_type {
        ffi::CLK_TYPE_GFX => Ok(Domain::Gfx),
        ffi::CLK_TYPE_MEM => Ok(Domain::Mem),
        t if t <= CLK_TYPE_MAX => Err(status::NOT_SUPPORTED),
        _ => Err(status::INVAL),
    }
}

/// The board's clock range in a domain, MHz.
fn board_range(d: &SimGpu, dom: Domain) -> (u32, u32) {
    let p = d.preset();
    match dom {
        Domain::Gfx => (p.min_graphics_clock_mhz, p.max_graphics_clock_mhz),
        Domain::Mem => {
            let m = p.memory_clocks_mhz;
            (
                m.iter().copied().min().unwrap_or(0),
                m.iter().copied().max().unwrap_or(0),
            )
        }
    }
}

/// The supported levels of a domain, MHz, lowest first (amdsmi's DPM order), at most `max`:
/// a longer table is thinned evenly, keeping both ends.
fn levels(d: &SimGpu, dom: Domain, max: usize) -> Vec<u32> {
    let p = d.preset();
    let mut v = match dom {
        Domain::Gfx => p.graphics_clocks_mhz(),
        Domain::Mem => p.memory_clocks_mhz.to_vec(),
    };
    v.sort_unstable();
    v.dedup();
    if v.len() <= max || max < 2 {
        v.truncate(max);
        return v;
    }
    let n = v.len();
    (0..max).map(|k| v[k * (n - 1) / (max - 1)]).collect()
}

/// The clock a domain runs at now, MHz.
fn current(d: &SimGpu, dom: Domain) -> Result<u32, Status> {
    let (gfx, mem) = d.current_clocks_mhz().map_err(code)?;
    Ok(match dom {
        Domain::Gfx => gfx,
        Domain::Mem => mem,
    })
}

/// Lock a domain's clock to `[min_mhz, max_mhz]` (clamped to the board's range) and enter the
/// MANUAL performance level. `AMDSMI_STATUS_INVAL` for an empty range or a clock type other
/// than GFX or MEM (the only two amdsmi can range), `AMDSMI_STATUS_NO_PERM` unprivileged.
#[no_mangle]
pub extern "C" fn amdsmi_set_gpu_clk_range(
    handle: Handle,
    min_mhz: u64,
    max_mhz: u64,
    clk_type: u32,
) -> Status {
    guard(|| {
        let (lib, i, d) = device(handle)?;
        let lo = u32::try_from(min_mhz).map_err(|_| status::INVAL)?;
        let hi = u32::try_from(max_mhz).map_err(|_| status::INVAL)?;
        let dom = match clk_type {
            ffi::CLK_TYPE_GFX => Domain::Gfx,
            ffi::CLK_TYPE_MEM => Domain::Mem,
            _ => return Err(status::INVAL),
        };
        // Held across the board's update so that the range recorded is the one in effect.
        let mut st = lib.state(i);
        match dom {
            Domain::Gfx => d.set_gpu_locked_clocks(lo, hi),
            Domain::Mem => d.set_memory_locked_clocks(lo, hi),
        }
        .map_err(code)?;
        let (bmin, bmax) = board_range(d, dom);
        let range = Some((lo.clamp(bmin, bmax), hi.clamp(bmin, bmax)));
        match dom {
            Domain::Gfx => st.gfx_range = range,
            Domain::Mem => st.mem_range = range,
        }
        st.perf_level = ffi::DEV_PERF_LEVEL_MANUAL;
        Ok(())
    })
}

/// Set the performance level. AUTO hands the clocks back to the driver: both domains' ranges
/// are reset. Any other defined level is recorded and changes nothing in the model.
/// `AMDSMI_STATUS_INVAL` for an undefined level, `AMDSMI_STATUS_NO_PERM` unprivileged.
#[no_mangle]
pub extern "C" fn amdsmi_set_gpu_perf_level(handle: Handle, level: u32) -> Status {
    guard(|| {
        let (lib, i, d) = device(handle)?;
        if level > DEV_PERF_LEVEL_LAST {
            return Err(status::INVAL);
        }
        if !lib.privileged {
            return Err(status::NO_PERM);
        }
        let mut st = lib.state(i);
        if level == ffi::DEV_PERF_LEVEL_AUTO {
            d.reset_gpu_locked_clocks().map_err(code)?;
            st.gfx_range = None;
            d.reset_memory_locked_clocks().map_err(code)?;
            st.mem_range = None;
        }
        st.perf_level = level;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_perf_level(handle: Handle, level: *mut u32) -> Status {
    guard(|| {
        let (lib, i, _) = device(handle)?;
        nonnull(level)?;
        let l = lib.state(i).perf_level;
        write(level, l)
    })
}

/// A domain's supported levels, Hz, lowest first, and the index of the one nearest the clock
/// it runs at now. No deep sleep level.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_clk_freq(
    handle: Handle,
    clk_type: u32,
    out: *mut ffi::Frequencies,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(out)?;
        let dom = domain(clk_type)?;
        let mut f = ffi::Frequencies {
            has_deep_sleep: false,
            _pad0: [0; 3],
            num_supported: 0,
            current: 0,
            _pad1: 0,
            frequency: [0; 33],
        };
        let levels = levels(d, dom, f.frequency.len());
        let now = current(d, dom)?;
        f.num_supported = levels.len() as u32;
        f.current = levels
            .iter()
            .enumerate()
            .min_by_key(|(_, &mhz)| mhz.abs_diff(now))
            .map_or(0, |(k, _)| k as u32);
        for (slot, mhz) in f.frequency.iter_mut().zip(&levels) {
            *slot = u64::from(*mhz) * 1_000_000;
        }
        write(out, f)
    })
}

/// A domain's clock now and its range, MHz: the range a caller set (`clk_locked` 1) or the
/// board's.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_clock_info(
    handle: Handle,
    clk_type: u32,
    info: *mut ffi::ClkInfo,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(info)?;
        let dom = domain(clk_type)?;
        let clk = current(d, dom)?;
        // The board's own record, which every process sharing it sees (this library's
        // record of what it was asked is per process).
        let (gfx, mem) = d.locked_clocks();
        let set = match dom {
            Domain::Gfx => gfx,
            Domain::Mem => mem,
        };
        let (min_clk, max_clk) = set.unwrap_or_else(|| board_range(d, dom));
        write(
            info,
            ffi::ClkInfo {
                clk,
                min_clk,
                max_clk,
                clk_locked: u8::from(set.is_some()),
                clk_deep_sleep: 0,
                _pad: [0; 2],
                reserved: [0; 4],
            },
        )
    })
}
