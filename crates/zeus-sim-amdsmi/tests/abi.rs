//! The simulated `libamd_smi.so` through its C ABI, loaded as a caller would load it, with an
//! MI300X and an MI250X (two dies) under load.
//!
//! The tests share one library (its devices are per process) and take turns through a lock, so
//! that one test's settings and calls do not disturb another's, and so that the overlap test
//! sees only its own threads' calls.

mod common;

use std::ffi::{c_char, c_void, CStr};
use std::sync::{Mutex, MutexGuard, Once, OnceLock};
use std::time::{Duration, Instant};

use libloading::{Library, Symbol};
use zeus_core::device::amd::ffi::{self, status, Handle, Status};

static SETUP: Once = Once::new();
static LIB: OnceLock<Library> = OnceLock::new();
static TURN: Mutex<()> = Mutex::new(());

/// The library, initialised once with an MI300X and an MI250X, busy and lingering in every
/// call; and this test's turn.
fn setup() -> (&'static Library, MutexGuard<'static, ()>) {
    let turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    SETUP.call_once(|| {
        common::sim_env(&[
            ("ZEUS_SIM_GPUS", "MI300X,MI250X"),
            ("ZEUS_SIM_LOAD", "busy"),
            ("ZEUS_SIM_AMDSMI_THREAD_UNSAFE", "1"),
        ]);
        // SAFETY: the simulated library's initialisers only set up Rust statics.
        let lib = unsafe { Library::new(common::fake_lib()) }.expect("load libamd_smi.so");
        assert!(LIB.set(lib).is_ok());
        let init: Symbol<unsafe extern "C" fn(u64) -> Status> = sym("amdsmi_init");
        assert_eq!(unsafe { init(ffi::INIT_AMD_GPUS) }, status::SUCCESS);
    });
    (LIB.get().expect("library loaded"), turn)
}

fn sym<T>(name: &str) -> Symbol<'static, T> {
    let lib = LIB.get().expect("library loaded");
    // SAFETY: each caller names the function's C signature as amdsmi.h declares it.
    unsafe { lib.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"))
}

type HandleList = unsafe extern "C" fn(*mut u32, *mut Handle) -> Status;
type ProcessorList = unsafe extern "C" fn(Handle, *mut u32, *mut Handle) -> Status;
type Query<T> = unsafe extern "C" fn(Handle, *mut T) -> Status;
type TypedQuery<T> = unsafe extern "C" fn(Handle, u32, *mut T) -> Status;
type EnergyCount = unsafe extern "C" fn(Handle, *mut u64, *mut f32, *mut u64) -> Status;

fn sockets() -> Vec<Handle> {
    let f: Symbol<HandleList> = sym("amdsmi_get_socket_handles");
    let mut n = 0u32;
    assert_eq!(unsafe { f(&mut n, std::ptr::null_mut()) }, status::SUCCESS);
    let mut v = vec![std::ptr::null_mut(); n as usize];
    assert_eq!(unsafe { f(&mut n, v.as_mut_ptr()) }, status::SUCCESS);
    v.truncate(n as usize);
    v
}

fn processors(socket: Handle) -> Vec<Handle> {
    let f: Symbol<ProcessorList> = sym("amdsmi_get_processor_handles");
    let mut n = 0u32;
    assert_eq!(
        unsafe { f(socket, &mut n, std::ptr::null_mut()) },
        status::SUCCESS
    );
    let mut v = vec![std::ptr::null_mut(); n as usize];
    assert_eq!(
        unsafe { f(socket, &mut n, v.as_mut_ptr()) },
        status::SUCCESS
    );
    v.truncate(n as usize);
    v
}

/// Every processor, socket by socket: the MI300X, then the MI250X's even and odd dies.
fn all_processors() -> Vec<Handle> {
    sockets().into_iter().flat_map(processors).collect()
}

fn query<T: 'static>(name: &str, h: Handle, out: &mut T) -> Status {
    let f: Symbol<Query<T>> = sym(name);
    unsafe { f(h, out) }
}

fn power_info(h: Handle) -> ffi::PowerInfo {
    let mut p = ffi::PowerInfo::default();
    assert_eq!(query("amdsmi_get_power_info", h, &mut p), status::SUCCESS);
    p
}

fn energy(h: Handle) -> (u64, f32, u64) {
    let f: Symbol<EnergyCount> = sym("amdsmi_get_energy_count");
    let (mut acc, mut res, mut ts) = (0u64, 0f32, 0u64);
    assert_eq!(
        unsafe { f(h, &mut acc, &mut res, &mut ts) },
        status::SUCCESS
    );
    (acc, res, ts)
}

fn true_energy(index: u32) -> f64 {
    let f: Symbol<unsafe extern "C" fn(u32, *mut f64) -> Status> = sym("zeusSimAmdTrueEnergy");
    let mut j = 0.0;
    assert_eq!(unsafe { f(index, &mut j) }, status::SUCCESS);
    j
}

fn clock_info(h: Handle, clk_type: u32) -> ffi::ClkInfo {
    let f: Symbol<TypedQuery<ffi::ClkInfo>> = sym("amdsmi_get_clock_info");
    let mut c = ffi::ClkInfo::default();
    assert_eq!(unsafe { f(h, clk_type, &mut c) }, status::SUCCESS);
    c
}

fn perf_level(h: Handle) -> u32 {
    let mut l = u32::MAX;
    assert_eq!(
        query("amdsmi_get_gpu_perf_level", h, &mut l),
        status::SUCCESS
    );
    l
}

#[test]
fn three_processors_on_two_sockets_with_simulated_names() {
    let _t = setup();
    let socks = sockets();
    assert_eq!(socks.len(), 2);
    assert_eq!(processors(socks[0]).len(), 1, "the MI300X is a socket");
    assert_eq!(processors(socks[1]).len(), 2, "the MI250X's dies share one");
    let procs = all_processors();
    assert_eq!(procs.len(), 3);

    let mut bdfs = Vec::new();
    for (i, &h) in procs.iter().enumerate() {
        let mut kind = 0u32;
        assert_eq!(
            query("amdsmi_get_processor_type", h, &mut kind),
            status::SUCCESS
        );
        assert_eq!(kind, ffi::PROCESSOR_TYPE_AMD_GPU);

        let mut asic: ffi::AsicInfo = unsafe { std::mem::zeroed() };
        assert_eq!(
            query("amdsmi_get_gpu_asic_info", h, &mut asic),
            status::SUCCESS
        );
        let name = ffi::c_str(&asic.market_name);
        assert!(name.contains("(Simulated)"), "{name}");
        assert!(
            name.contains(if i == 0 { "MI300X" } else { "MI250X" }),
            "{name}"
        );
        assert_eq!(asic.vendor_id, 0x1002);
        assert_eq!(asic.device_id, if i == 0 { 0x74A1 } else { 0x740C });

        let mut board: ffi::BoardInfo = unsafe { std::mem::zeroed() };
        assert_eq!(
            query("amdsmi_get_gpu_board_info", h, &mut board),
            status::SUCCESS
        );
        assert_eq!(ffi::c_str(&board.product_name), name);

        let mut id = 0u16;
        assert_eq!(query("amdsmi_get_gpu_id", h, &mut id), status::SUCCESS);
        assert_eq!(u64::from(id), asic.device_id);

        let mut bdf = ffi::Bdf::default();
        assert_eq!(
            query("amdsmi_get_gpu_device_bdf", h, &mut bdf),
            status::SUCCESS
        );
        bdfs.push(bdf.as_uint);

        let mut e: ffi::EnumerationInfo = unsafe { std::mem::zeroed() };
        assert_eq!(
            query("amdsmi_get_gpu_enumeration_info", h, &mut e),
            status::SUCCESS
        );
        assert_eq!(
            (e.hip_id, e.drm_render, e.hsa_id),
            (i as u32, 128 + i as u32, i as u32 + 1)
        );
    }
    bdfs.sort_unstable();
    bdfs.dedup();
    assert_eq!(bdfs.len(), 3, "one PCI address per device");

    let info: Symbol<unsafe extern "C" fn(Handle, usize, *mut c_char) -> Status> =
        sym("amdsmi_get_socket_info");
    let mut buf = [0 as c_char; 128];
    assert_eq!(
        unsafe { info(socks[1], buf.len(), buf.as_mut_ptr()) },
        status::SUCCESS
    );
    assert_eq!(ffi::c_str(&buf), "0000:02:00.0");
}

#[test]
fn uuid_has_no_gpu_prefix_and_reports_its_size() {
    let _t = setup();
    let h = all_processors()[0];
    let f: Symbol<unsafe extern "C" fn(Handle, *mut u32, *mut c_char) -> Status> =
        sym("amdsmi_get_gpu_device_uuid");
    let mut buf = [0 as c_char; ffi::GPU_UUID_SIZE];
    let mut len = 8u32;
    assert_eq!(
        unsafe { f(h, &mut len, buf.as_mut_ptr()) },
        status::INSUFFICIENT_SIZE
    );
    assert_eq!(len, 37);
    len = buf.len() as u32;
    assert_eq!(unsafe { f(h, &mut len, buf.as_mut_ptr()) }, status::SUCCESS);
    let uuid = ffi::c_str(&buf);
    assert_eq!(uuid.len(), 36, "{uuid}");
    assert!(!uuid.starts_with("GPU-"), "{uuid}");

    let mut e: ffi::EnumerationInfo = unsafe { std::mem::zeroed() };
    assert_eq!(
        query("amdsmi_get_gpu_enumeration_info", h, &mut e),
        status::SUCCESS
    );
    assert_eq!(ffi::c_str(&e.hip_uuid), format!("GPU-{uuid}"));
}

#[test]
fn energy_counter_counts_the_true_energy_in_15_3_uj_ticks() {
    let _t = setup();
    let mi300x = all_processors()[0];
    let (a0, res, ts0) = energy(mi300x);
    assert_eq!(res, 15.3);
    // By design a stretch of real time: the counter must move over it.
    std::thread::sleep(Duration::from_millis(50));
    let (a1, _, ts1) = energy(mi300x);
    assert!(a1 > a0, "{a0} -> {a1}");
    assert!(ts1 > ts0, "{ts0} -> {ts1}");

    // Over ~0.3 s the counter's energy is the model's within 5%. Each counter read is
    // bracketed by two true readings, so that a thread preempted between the reads cannot make
    // the two windows differ: the counter's window lies between the inner and the outer one.
    let bracket = || {
        let before = true_energy(0);
        let (acc, _, _) = energy(mi300x);
        (before, acc, true_energy(0))
    };
    let (b0, a0, e0) = bracket();
    std::thread::sleep(Duration::from_millis(300));
    let (b1, a1, e1) = bracket();
    let counted_j = (a1 - a0) as f64 * f64::from(res) * 1e-6;
    let (inner, outer) = (b1 - e0, e1 - b0);
    assert!(inner > 0.0);
    assert!(
        counted_j >= 0.95 * inner && counted_j <= 1.05 * outer,
        "counter {counted_j} J vs true {inner}..{outer} J"
    );
}

#[test]
fn power_fields_follow_each_board() {
    let _t = setup();
    let procs = all_processors();
    let na = ffi::NA_U32[1];

    let mi300x = power_info(procs[0]);
    assert!(
        mi300x.current_socket_power > 0 && mi300x.current_socket_power != na,
        "{mi300x:?}"
    );
    assert_eq!(mi300x.average_socket_power, na, "MI300X has no average");
    assert_eq!(mi300x.socket_power, u64::from(mi300x.current_socket_power));
    assert_eq!(mi300x.power_limit, 750);
    assert_eq!(mi300x.gfx_voltage, u64::from(na));

    let even = power_info(procs[1]);
    assert!(
        even.average_socket_power > 0 && even.average_socket_power != na,
        "{even:?}"
    );
    assert_eq!(even.current_socket_power, na, "MI250X has no current power");
    assert_eq!(even.socket_power, u64::from(even.average_socket_power));

    let odd = power_info(procs[2]);
    assert_eq!(odd.average_socket_power, 0, "{odd:?}");
    assert_eq!(odd.socket_power, 0);
    assert_eq!(odd.current_socket_power, na);
}

#[test]
fn power_cap_round_trips_in_microwatts_and_refuses_out_of_range() {
    let _t = setup();
    let h = all_processors()[0];
    let get: Symbol<TypedQuery<ffi::PowerCapInfo>> = sym("amdsmi_get_power_cap_info");
    let set: Symbol<unsafe extern "C" fn(Handle, u32, u64) -> Status> = sym("amdsmi_set_power_cap");
    let cap = || {
        let mut c = ffi::PowerCapInfo::default();
        assert_eq!(unsafe { get(h, 0, &mut c) }, status::SUCCESS);
        c
    };
    let c = cap();
    assert_eq!(
        (
            c.power_cap,
            c.default_power_cap,
            c.min_power_cap,
            c.max_power_cap
        ),
        (750_000_000, 750_000_000, 200_000_000, 750_000_000)
    );
    assert_eq!(c.dpm_cap, 2100);

    assert_eq!(unsafe { set(h, 0, 500_000_000) }, status::SUCCESS);
    assert_eq!(cap().power_cap, 500_000_000);
    assert_eq!(power_info(h).power_limit, 500);
    assert_eq!(
        unsafe { set(h, 0, 100_000_000) },
        status::INVAL,
        "below the minimum"
    );
    assert_eq!(
        unsafe { set(h, 0, 800_000_000) },
        status::INVAL,
        "above the maximum"
    );
    assert_eq!(
        unsafe { set(h, 1, 500_000_000) },
        status::INVAL,
        "no sensor 1"
    );
    let mut c = ffi::PowerCapInfo::default();
    assert_eq!(unsafe { get(h, 1, &mut c) }, status::INVAL);
    assert_eq!(cap().power_cap, 500_000_000, "failed sets change nothing");
    assert_eq!(unsafe { set(h, 0, 750_000_000) }, status::SUCCESS);
}

#[test]
fn clock_range_locks_until_perf_level_auto() {
    let _t = setup();
    let h = all_processors()[0];
    let range: Symbol<unsafe extern "C" fn(Handle, u64, u64, u32) -> Status> =
        sym("amdsmi_set_gpu_clk_range");
    let level: Symbol<unsafe extern "C" fn(Handle, u32) -> Status> =
        sym("amdsmi_set_gpu_perf_level");

    assert_eq!(
        unsafe { level(h, ffi::DEV_PERF_LEVEL_AUTO) },
        status::SUCCESS
    );
    let gfx = clock_info(h, ffi::CLK_TYPE_GFX);
    assert_eq!((gfx.clk_locked, gfx.min_clk, gfx.max_clk), (0, 500, 2100));
    assert_eq!(gfx.clk, 2100, "busy at the full cap: the top clock");

    assert_eq!(
        unsafe { range(h, 1000, 1500, ffi::CLK_TYPE_GFX) },
        status::SUCCESS
    );
    let gfx = clock_info(h, ffi::CLK_TYPE_GFX);
    assert_eq!((gfx.clk_locked, gfx.min_clk, gfx.max_clk), (1, 1000, 1500));
    assert_eq!(gfx.clk, 1500, "busy: the top of the range");
    assert_eq!(perf_level(h), ffi::DEV_PERF_LEVEL_MANUAL);
    assert_eq!(
        unsafe { range(h, 1500, 1000, ffi::CLK_TYPE_GFX) },
        status::INVAL,
        "empty range"
    );
    assert_eq!(
        unsafe { range(h, 1000, 1500, 3) },
        status::INVAL,
        "SOC cannot be ranged"
    );
    assert_eq!(
        unsafe { range(h, 1300, 1300, ffi::CLK_TYPE_MEM) },
        status::SUCCESS
    );
    assert_eq!(clock_info(h, ffi::CLK_TYPE_MEM).clk_locked, 1);

    assert_eq!(
        unsafe { level(h, ffi::DEV_PERF_LEVEL_AUTO) },
        status::SUCCESS
    );
    assert_eq!(clock_info(h, ffi::CLK_TYPE_GFX).clk_locked, 0);
    assert_eq!(clock_info(h, ffi::CLK_TYPE_MEM).clk_locked, 0);
    assert_eq!(clock_info(h, ffi::CLK_TYPE_GFX).clk, 2100);
    assert_eq!(perf_level(h), ffi::DEV_PERF_LEVEL_AUTO);
    assert_eq!(
        unsafe { level(h, 256) },
        status::INVAL,
        "UNKNOWN is not a level to set"
    );

    let freq: Symbol<TypedQuery<ffi::Frequencies>> = sym("amdsmi_get_clk_freq");
    let mut f: ffi::Frequencies = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { freq(h, ffi::CLK_TYPE_GFX, &mut f) },
        status::SUCCESS
    );
    let levels = &f.frequency[..f.num_supported as usize];
    assert_eq!(levels.len(), 17);
    assert_eq!((levels[0], levels[16]), (500_000_000, 2_100_000_000));
    assert!(levels.windows(2).all(|w| w[0] < w[1]), "lowest first");
    assert_eq!(f.current, 16, "at the top clock");
    assert_eq!(
        unsafe { freq(h, 3, &mut f) },
        status::NOT_SUPPORTED,
        "no SOC clock"
    );
}

#[test]
fn monitoring_reads_a_busy_board() {
    let _t = setup();
    let h = all_processors()[0];
    let temp: Symbol<unsafe extern "C" fn(Handle, u32, u32, *mut i64) -> Status> =
        sym("amdsmi_get_temp_metric");
    let mut c = 0i64;
    assert_eq!(
        unsafe { temp(h, ffi::TEMPERATURE_TYPE_HOTSPOT, ffi::TEMP_CURRENT, &mut c) },
        status::SUCCESS
    );
    assert!((30..=90).contains(&c), "{c} °C");
    assert_eq!(
        unsafe { temp(h, 2, ffi::TEMP_CURRENT, &mut c) },
        status::NOT_SUPPORTED
    );

    let mut usage = ffi::EngineUsage::default();
    assert_eq!(
        query("amdsmi_get_gpu_activity", h, &mut usage),
        status::SUCCESS
    );
    assert_eq!(usage.gfx_activity, 100);

    let total: Symbol<TypedQuery<u64>> = sym("amdsmi_get_gpu_memory_total");
    let used: Symbol<TypedQuery<u64>> = sym("amdsmi_get_gpu_memory_usage");
    let (mut t, mut u) = (0u64, 0u64);
    assert_eq!(
        unsafe { total(h, ffi::MEM_TYPE_VRAM, &mut t) },
        status::SUCCESS
    );
    assert_eq!(
        unsafe { used(h, ffi::MEM_TYPE_VRAM, &mut u) },
        status::SUCCESS
    );
    assert_eq!(t, 192 << 30);
    assert!(u > 0 && u < t, "{u} of {t}");
    assert_eq!(
        unsafe { total(h, 2, &mut t) },
        status::NOT_SUPPORTED,
        "no GTT"
    );
}

#[test]
fn null_pointers_and_foreign_handles_are_invalid() {
    let _t = setup();
    let h = all_processors()[0];
    let null_out = |name: &str| {
        let f: Symbol<Query<c_void>> = sym(name);
        assert_eq!(
            unsafe { f(h, std::ptr::null_mut()) },
            status::INVAL,
            "{name}"
        );
    };
    for name in [
        "amdsmi_get_processor_type",
        "amdsmi_get_gpu_id",
        "amdsmi_get_gpu_asic_info",
        "amdsmi_get_gpu_board_info",
        "amdsmi_get_gpu_device_bdf",
        "amdsmi_get_gpu_enumeration_info",
        "amdsmi_get_gpu_kfd_info",
        "amdsmi_get_power_info",
        "amdsmi_get_gpu_activity",
        "amdsmi_get_gpu_perf_level",
    ] {
        null_out(name);
    }
    let f: Symbol<EnergyCount> = sym("amdsmi_get_energy_count");
    let (mut acc, mut res) = (0u64, 0f32);
    assert_eq!(
        unsafe { f(h, &mut acc, &mut res, std::ptr::null_mut()) },
        status::INVAL
    );
    let list: Symbol<HandleList> = sym("amdsmi_get_socket_handles");
    assert_eq!(
        unsafe { list(std::ptr::null_mut(), std::ptr::null_mut()) },
        status::INVAL
    );
    let version: Symbol<unsafe extern "C" fn(*mut ffi::Version) -> Status> =
        sym("amdsmi_get_lib_version");
    assert_eq!(unsafe { version(std::ptr::null_mut()) }, status::INVAL);

    // A handle the library did not hand out, null or not, is refused without being read.
    let mut not_a_gpu = [0u64; 8];
    let foreign = not_a_gpu.as_mut_ptr() as Handle;
    let mut p = ffi::PowerInfo::default();
    assert_eq!(
        query("amdsmi_get_power_info", foreign, &mut p),
        status::INVAL
    );
    assert_eq!(
        query("amdsmi_get_power_info", std::ptr::null_mut(), &mut p),
        status::INVAL
    );
    let set: Symbol<unsafe extern "C" fn(Handle, u32, u64) -> Status> = sym("amdsmi_set_power_cap");
    assert_eq!(unsafe { set(foreign, 0, 500_000_000) }, status::INVAL);
    // A processor handle is not a socket handle.
    let procs: Symbol<ProcessorList> = sym("amdsmi_get_processor_handles");
    let mut n = 0u32;
    assert_eq!(
        unsafe { procs(h, &mut n, std::ptr::null_mut()) },
        status::INVAL
    );
    assert_eq!(not_a_gpu, [0; 8]);
}

#[test]
fn overlapping_calls_are_recorded_and_reset() {
    let _t = setup();
    let overlaps: Symbol<unsafe extern "C" fn() -> u64> = sym("zeusSimAmdOverlaps");
    let reset: Symbol<unsafe extern "C" fn()> = sym("zeusSimAmdResetOverlaps");
    unsafe { reset() };
    // One caller at a time (this test holds the turn): no overlap.
    for h in all_processors() {
        power_info(h);
    }
    assert_eq!(unsafe { overlaps() }, 0);

    // Four threads calling without serialization, until an overlap is seen.
    let h = all_processors()[0] as usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while unsafe { overlaps() } == 0 && Instant::now() < deadline {
                    power_info(h as Handle);
                }
            });
        }
    });
    assert!(
        unsafe { overlaps() } > 0,
        "4 unserialized threads never overlapped"
    );
    unsafe { reset() };
    assert_eq!(unsafe { overlaps() }, 0);
}

#[test]
fn init_is_reference_counted_and_the_library_reports_its_version() {
    let _t = setup();
    let init: Symbol<unsafe extern "C" fn(u64) -> Status> = sym("amdsmi_init");
    let shut_down: Symbol<unsafe extern "C" fn() -> Status> = sym("amdsmi_shut_down");
    let h = all_processors()[0];
    assert_eq!(unsafe { init(ffi::INIT_AMD_GPUS) }, status::SUCCESS);
    assert_eq!(unsafe { shut_down() }, status::SUCCESS);
    let mut p = ffi::PowerInfo::default();
    assert_eq!(
        query("amdsmi_get_power_info", h, &mut p),
        status::SUCCESS,
        "one init left"
    );
    assert_eq!(unsafe { shut_down() }, status::SUCCESS);
    assert_eq!(query("amdsmi_get_power_info", h, &mut p), status::NOT_INIT);
    assert_eq!(unsafe { shut_down() }, status::NOT_INIT);

    // The version and status names need no init.
    let version: Symbol<unsafe extern "C" fn(*mut ffi::Version) -> Status> =
        sym("amdsmi_get_lib_version");
    let mut v = ffi::Version {
        major: 0,
        minor: 0,
        release: 0,
        _pad: 0,
        build: std::ptr::null(),
    };
    assert_eq!(unsafe { version(&mut v) }, status::SUCCESS);
    assert_eq!((v.major, v.minor, v.release), (26, 0, 2));
    assert_eq!(
        unsafe { CStr::from_ptr(v.build) }.to_str().unwrap(),
        "zeus-sim"
    );
    let name: Symbol<unsafe extern "C" fn(Status, *mut *const c_char) -> Status> =
        sym("amdsmi_status_code_to_string");
    let mut s: *const c_char = std::ptr::null();
    assert_eq!(unsafe { name(status::NO_PERM, &mut s) }, status::SUCCESS);
    assert_eq!(
        unsafe { CStr::from_ptr(s) }.to_str().unwrap(),
        "AMDSMI_STATUS_NO_PERM"
    );

    // The devices outlive shutdown: the same handle works again after a new init.
    assert_eq!(unsafe { init(ffi::INIT_AMD_GPUS) }, status::SUCCESS);
    assert_eq!(query("amdsmi_get_power_info", h, &mut p), status::SUCCESS);
}
