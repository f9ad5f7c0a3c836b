//! Discovery and identity: sockets and their processors, processor type, ids, names, PCI
//! address, UUID, and the orders other runtimes number the GPUs in (HIP, KFD).

use super::*;

/// PCI vendor id of AMD/ATI.
const AMD_VENDOR_ID: u32 = 0x1002;
/// The vendor name amdsmi reads from the PCI ids database.
const AMD_VENDOR_NAME: &str = "Advanced Micro Devices, Inc. [AMD/ATI]";

/// Every socket (GPU package): count query with a null array, as the Python bindings do.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_socket_handles(
    count: *mut u32,
    sockets: *mut Handle,
) -> Status {
    guard(|| {
        let lib = library()?;
        let handles: Vec<Handle> = lib.sockets.iter().map(socket_handle).collect();
        write_handles(count, sockets, &handles)
    })
}

/// A socket's identifier: the PCI address of its first device (`0000:01:00.0`), cut to `len`.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_socket_info(
    socket_handle: Handle,
    len: usize,
    name: *mut c_char,
) -> Status {
    guard(|| {
        let (_, s) = socket(socket_handle)?;
        write_str_cut(name, len, &s.id)
    })
}

/// The GPUs of a socket: one, or an MI250X's two dies.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_processor_handles(
    socket_handle: Handle,
    count: *mut u32,
    processors: *mut Handle,
) -> Status {
    guard(|| {
        let (lib, s) = socket(socket_handle)?;
        let devices = lib.cluster.devices();
        let handles: Vec<Handle> = s
            .devices
            .iter()
            .map(|&i| processor_handle(&devices[i]))
            .collect();
        write_handles(count, processors, &handles)
    })
}

/// The processors of a socket of one type: its GPUs for `AMDSMI_PROCESSOR_TYPE_AMD_GPU`, none
/// for any other type. Note the argument order: the array comes before the count here.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_processor_handles_by_type(
    socket_handle: Handle,
    processor_type: u32,
    processors: *mut Handle,
    count: *mut u32,
) -> Status {
    guard(|| {
        let (lib, s) = socket(socket_handle)?;
        let devices = lib.cluster.devices();
        let handles: Vec<Handle> = if processor_type == ffi::PROCESSOR_TYPE_AMD_GPU {
            s.devices
                .iter()
                .map(|&i| processor_handle(&devices[i]))
                .collect()
        } else {
            Vec::new()
        };
        write_handles(count, processors, &handles)
    })
}

#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_processor_type(handle: Handle, kind: *mut u32) -> Status {
    guard(|| {
        device(handle)?;
        write(kind, ffi::PROCESSOR_TYPE_AMD_GPU)
    })
}

/// The PCI device id (0x74A1 on an MI300X).
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_id(handle: Handle, id: *mut u16) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        write(id, (d.preset().pci_device_id >> 16) as u16)
    })
}

#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_vendor_name(
    handle: Handle,
    name: *mut c_char,
    len: usize,
) -> Status {
    guard(|| {
        device(handle)?;
        write_str_cut(name, len, AMD_VENDOR_NAME)
    })
}

/// The graphics IP version as amdsmi packs it: the hex digits of the `gfx` target (0x942 for
/// `gfx942`), which the Python bindings print as `"gfx" + hex(value)`. `u64::MAX` (not
/// available) for an architecture the simulator has no AMD target for.
fn target_graphics_version(arch: zeus_core::device::Architecture) -> u64 {
    use zeus_core::device::Architecture::*;
    match arch {
        Cdna2 => 0x90a,
        Cdna3 => 0x942,
        _ => u64::MAX,
    }
}

/// Compute units per device (per die on an MI250X), as AMD publishes them.
fn compute_units(key: &str) -> u32 {
    match key {
        "MI300X" => 304,
        "MI250X" => 110,
        "MI210" => 104,
        _ => u32::MAX,
    }
}

/// ASIC identity: the market name is the device's name (`AMD Instinct MI300X (Simulated)`);
/// fields the model has nothing for hold the "not available" maximum of their type.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_asic_info(
    handle: Handle,
    info: *mut ffi::AsicInfo,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(info)?;
        let p = d.preset();
        let uuid = d.uuid().map_err(code)?;
        let serial = uuid.trim_start_matches("GPU-").replace('-', "");
        let mut a = ffi::AsicInfo {
            market_name: [0; 256],
            vendor_id: AMD_VENDOR_ID,
            vendor_name: [0; 256],
            subvendor_id: AMD_VENDOR_ID,
            device_id: u64::from(p.pci_device_id >> 16),
            rev_id: 0,
            asic_serial: [0; 256],
            oam_id: u32::MAX,
            num_of_compute_units: compute_units(p.key),
            _pad: 0,
            target_graphics_version: target_graphics_version(p.architecture),
            subsystem_id: u32::MAX,
            reserved: [0; 21],
        };
        ffi::set_c_str(&mut a.market_name, &d.name().map_err(code)?);
        ffi::set_c_str(&mut a.vendor_name, AMD_VENDOR_NAME);
        ffi::set_c_str(
            &mut a.asic_serial,
            &format!("0x{}", &serial[serial.len() - 16..]),
        );
        write(info, a)
    })
}

/// Board identity: the product name is the device's name.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_board_info(
    handle: Handle,
    info: *mut ffi::BoardInfo,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(info)?;
        let mut b = ffi::BoardInfo {
            model_number: [0; 256],
            product_serial: [0; 256],
            fru_id: [0; 256],
            product_name: [0; 256],
            manufacturer_name: [0; 256],
            reserved: [0; 64],
        };
        ffi::set_c_str(&mut b.model_number, d.preset().key);
        ffi::set_c_str(&mut b.product_name, &d.name().map_err(code)?);
        ffi::set_c_str(&mut b.manufacturer_name, "Advanced Micro Devices, Inc.");
        write(info, b)
    })
}

/// The PCI address: one GPU per bus from bus 0x01 on, in the library's order (the model's).
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_device_bdf(handle: Handle, out: *mut Bdf) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        write(out, bdf(d)?)
    })
}

/// The UUID, without the `GPU-` prefix NVML and HIP put on theirs. `*len` is the buffer's size
/// on entry; on return, the size the UUID needs with its NUL, whether or not it fit
/// (`AMDSMI_STATUS_INSUFFICIENT_SIZE` when it did not).
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_device_uuid(
    handle: Handle,
    len: *mut u32,
    uuid: *mut c_char,
) -> Status {
    guard(|| {
        let (_, _, d) = device(handle)?;
        nonnull(len)?;
        nonnull(uuid)?;
        let full = d.uuid().map_err(code)?;
        let s = full.strip_prefix("GPU-").unwrap_or(&full);
        let need = s.len() + 1;
        let room = *len as usize;
        *len = need as u32;
        if room < need {
            return Err(status::INSUFFICIENT_SIZE);
        }
        ffi::set_c_str(std::slice::from_raw_parts_mut(uuid, need), s);
        Ok(())
    })
}

/// How other runtimes number this GPU: DRM render node 128 + index, card index, HSA agent
/// index + 1 (agent 0 is the CPU), the HIP id (see `ZEUS_SIM_AMD_HIP_ORDER`) and HIP's UUID
/// (`GPU-` and the UUID).
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_enumeration_info(
    handle: Handle,
    info: *mut ffi::EnumerationInfo,
) -> Status {
    guard(|| {
        let (lib, i, d) = device(handle)?;
        nonnull(info)?;
        let uuid = d.uuid().map_err(code)?;
        let mut e = ffi::EnumerationInfo {
            drm_render: 128 + i as u32,
            drm_card: i as u32,
            hsa_id: i as u32 + 1,
            hip_id: lib.hip_ids[i],
            hip_uuid: [0; 256],
        };
        let bare = uuid.strip_prefix("GPU-").unwrap_or(&uuid);
        ffi::set_c_str(&mut e.hip_uuid, &format!("GPU-{bare}"));
        write(info, e)
    })
}

/// The KFD's view: node ids follow the HIP order (node 0 is the CPU, so GPUs start at 1), the
/// KFD id is a stable number per device.
#[no_mangle]
pub unsafe extern "C" fn amdsmi_get_gpu_kfd_info(
    handle: Handle,
    info: *mut ffi::KfdInfo,
) -> Status {
    guard(|| {
        let (lib, i, d) = device(handle)?;
        write(
            info,
            ffi::KfdInfo {
                kfd_id: u64::from(d.preset().pci_device_id >> 16) << 16 | i as u64,
                node_id: lib.hip_ids[i] + 1,
                current_partition_id: 0,
                reserved: [0; 12],
            },
        )
    })
}
