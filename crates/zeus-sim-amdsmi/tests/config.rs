//! The library's configuration, in a process of its own (the environment is read once, at the
//! first `amdsmi_init`): NVIDIA models skipped, the HIP order reversed, the version set, and
//! calls before init refused.

mod common;

use libloading::{Library, Symbol};
use zeus_core::device::amd::ffi::{self, status, Handle, Status};

fn get<'a, T>(lib: &'a Library, name: &str) -> Symbol<'a, T> {
    // SAFETY: every caller names the function's amdsmi.h signature.
    unsafe { lib.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// One test, so that nothing else in this process can call the library first.
#[test]
fn amd_boards_only_in_reversed_hip_order_at_the_version_asked_for() {
    common::sim_env(&[
        ("ZEUS_SIM_GPUS", "A40,MI300X,H100,MI210"),
        ("ZEUS_SIM_AMD_HIP_ORDER", "reversed"),
        ("ZEUS_SIM_AMDSMI_VERSION", "25.5.1"),
    ]);
    // SAFETY: the simulated library's initialisers only set up Rust statics; every symbol below
    // is named with its amdsmi.h signature.
    let lib = unsafe { Library::new(common::fake_lib()) }.expect("load libamd_smi.so");
    unsafe {
        let init: Symbol<unsafe extern "C" fn(u64) -> Status> = get(&lib, "amdsmi_init");
        let sockets: Symbol<unsafe extern "C" fn(*mut u32, *mut Handle) -> Status> =
            get(&lib, "amdsmi_get_socket_handles");
        let processors: Symbol<unsafe extern "C" fn(Handle, *mut u32, *mut Handle) -> Status> =
            get(&lib, "amdsmi_get_processor_handles");
        let asic: Symbol<unsafe extern "C" fn(Handle, *mut ffi::AsicInfo) -> Status> =
            get(&lib, "amdsmi_get_gpu_asic_info");
        let enumeration: Symbol<unsafe extern "C" fn(Handle, *mut ffi::EnumerationInfo) -> Status> =
            get(&lib, "amdsmi_get_gpu_enumeration_info");
        let kfd: Symbol<unsafe extern "C" fn(Handle, *mut ffi::KfdInfo) -> Status> =
            get(&lib, "amdsmi_get_gpu_kfd_info");
        let version: Symbol<unsafe extern "C" fn(*mut ffi::Version) -> Status> =
            get(&lib, "amdsmi_get_lib_version");

        let mut n = 0u32;
        assert_eq!(
            sockets(&mut n, std::ptr::null_mut()),
            status::NOT_INIT,
            "before init"
        );
        assert_eq!(init(ffi::INIT_AMD_GPUS), status::SUCCESS);

        assert_eq!(sockets(&mut n, std::ptr::null_mut()), status::SUCCESS);
        assert_eq!(n, 2, "the A40 and the H100 are not amdsmi's");
        let mut socks = vec![std::ptr::null_mut(); n as usize];
        // Room for one: one is copied, and the count says so.
        let mut room = 1u32;
        assert_eq!(sockets(&mut room, socks.as_mut_ptr()), status::SUCCESS);
        assert_eq!(room, 1);
        assert_eq!(sockets(&mut n, socks.as_mut_ptr()), status::SUCCESS);

        let mut seen = Vec::new();
        for s in socks {
            let mut k = 1u32;
            let mut h: Handle = std::ptr::null_mut();
            assert_eq!(processors(s, &mut k, &mut h), status::SUCCESS);
            assert_eq!(k, 1);
            let mut a: ffi::AsicInfo = std::mem::zeroed();
            assert_eq!(asic(h, &mut a), status::SUCCESS);
            let mut e: ffi::EnumerationInfo = std::mem::zeroed();
            assert_eq!(enumeration(h, &mut e), status::SUCCESS);
            let mut f: ffi::KfdInfo = std::mem::zeroed();
            assert_eq!(kfd(h, &mut f), status::SUCCESS);
            seen.push((ffi::c_str(&a.market_name), e.hip_id, e.hsa_id, f.node_id));
        }
        assert_eq!(
            seen,
            vec![
                ("AMD Instinct MI300X (Simulated)".to_string(), 1, 1, 2),
                ("AMD Instinct MI210 (Simulated)".to_string(), 0, 2, 1),
            ],
            "HIP ids and KFD nodes run backwards; HSA ids follow the PCI order"
        );

        let mut v: ffi::Version = std::mem::zeroed();
        assert_eq!(version(&mut v), status::SUCCESS);
        assert_eq!((v.major, v.minor, v.release), (25, 5, 1));
    }
}
