//! Every other function the `amdsmi` 7.0.2 Python bindings resolve when they are imported
//! (`amdsmi_wrapper.py` binds each symbol at module level, so `import amdsmi` fails with an
//! `AttributeError` if the library lacks one): exported here so that the bindings load, each
//! returning `AMDSMI_STATUS_NOT_SUPPORTED` without touching its arguments, what a real library
//! answers for a feature the board or driver lacks. A caller that needs one of them learns that
//! the simulated GPU does not have it, not that the library is broken.
//!
//! Each is defined with no parameters whatever its C signature. Calling such a function with
//! arguments is safe on the two ABIs the simulator runs on, SysV x86-64 and AArch64 (AAPCS64):
//! arguments go in registers (`rdi`.., `xmm0`..; `x0`.., `v0`..) and then on the stack, where
//! the caller puts them and the caller removes them after the call returns (caller-cleaned), so
//! a callee that reads none leaves registers and stack as the caller expects, and the status
//! comes back in `eax`/`w0` as for any function returning `amdsmi_status_t` (a 32-bit enum).
//! No function in the list returns a structure by value (which would pass a hidden result
//! pointer), and none is variadic.

use super::*;

/// Export each name as `extern "C" fn NAME() -> amdsmi_status_t` answering NOT_SUPPORTED.
macro_rules! not_supported {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> Status {
                status::NOT_SUPPORTED
            }
        )*
    };
}

not_supported! {
    amdsmi_get_cpu_handles, amdsmi_get_processor_info, amdsmi_get_processor_count_from_handles,
    amdsmi_get_cpucore_handles, amdsmi_get_processor_handle_from_bdf,
    amdsmi_get_cpu_affinity_with_scope, amdsmi_get_gpu_virtualization_mode,
    amdsmi_get_gpu_revision, amdsmi_get_gpu_vram_vendor, amdsmi_get_gpu_subsystem_id,
    amdsmi_get_gpu_subsystem_name, amdsmi_get_gpu_pci_bandwidth, amdsmi_get_gpu_bdf_id,
    amdsmi_get_gpu_topo_numa_affinity, amdsmi_get_gpu_pci_throughput,
    amdsmi_get_gpu_pci_replay_counter, amdsmi_set_gpu_pci_bandwidth, amdsmi_set_gpu_power_profile,
    amdsmi_get_cpu_socket_power, amdsmi_get_cpu_socket_power_cap,
    amdsmi_get_cpu_socket_power_cap_max, amdsmi_get_cpu_pwr_svi_telemetry_all_rails,
    amdsmi_set_cpu_socket_power_cap, amdsmi_set_cpu_pwr_efficiency_mode,
    amdsmi_get_gpu_bad_page_info, amdsmi_get_gpu_bad_page_threshold,
    amdsmi_gpu_validate_ras_eeprom, amdsmi_get_gpu_ras_feature_info,
    amdsmi_get_gpu_ras_block_features_enabled, amdsmi_get_gpu_memory_reserved_pages,
    amdsmi_get_gpu_fan_rpms, amdsmi_get_gpu_fan_speed, amdsmi_get_gpu_fan_speed_max,
    amdsmi_get_gpu_cache_info, amdsmi_get_gpu_volt_metric, amdsmi_reset_gpu_fan,
    amdsmi_set_gpu_fan_speed, amdsmi_get_gpu_busy_percent, amdsmi_get_utilization_count,
    amdsmi_set_gpu_perf_determinism_mode, amdsmi_get_gpu_overdrive_level,
    amdsmi_get_gpu_mem_overdrive_level, amdsmi_reset_gpu, amdsmi_get_gpu_od_volt_info,
    amdsmi_get_gpu_metrics_header_info, amdsmi_get_gpu_metrics_info,
    amdsmi_get_gpu_pm_metrics_info, amdsmi_get_gpu_reg_table_info, amdsmi_set_gpu_clk_limit,
    amdsmi_set_gpu_od_clk_info, amdsmi_set_gpu_od_volt_info, amdsmi_get_gpu_od_volt_curve_regions,
    amdsmi_get_gpu_power_profile_presets, amdsmi_set_gpu_overdrive_level, amdsmi_set_clk_freq,
    amdsmi_get_soc_pstate, amdsmi_set_soc_pstate, amdsmi_get_xgmi_plpd, amdsmi_set_xgmi_plpd,
    amdsmi_get_gpu_process_isolation, amdsmi_set_gpu_process_isolation,
    amdsmi_clean_gpu_local_data, amdsmi_get_gpu_ecc_count, amdsmi_get_gpu_ecc_enabled,
    amdsmi_get_gpu_total_ecc_count, amdsmi_get_gpu_cper_entries, amdsmi_get_afids_from_cper,
    amdsmi_get_gpu_ecc_status, amdsmi_gpu_counter_group_supported, amdsmi_gpu_create_counter,
    amdsmi_gpu_destroy_counter, amdsmi_gpu_control_counter, amdsmi_gpu_read_counter,
    amdsmi_get_gpu_available_counters, amdsmi_get_gpu_compute_process_info,
    amdsmi_get_gpu_compute_process_info_by_pid, amdsmi_get_gpu_compute_process_gpus,
    amdsmi_gpu_xgmi_error_status, amdsmi_reset_gpu_xgmi_error, amdsmi_get_xgmi_info,
    amdsmi_get_gpu_xgmi_link_status, amdsmi_get_link_metrics, amdsmi_topo_get_numa_node_number,
    amdsmi_topo_get_link_weight, amdsmi_get_minmax_bandwidth_between_processors,
    amdsmi_topo_get_link_type, amdsmi_get_link_topology_nearest, amdsmi_is_P2P_accessible,
    amdsmi_topo_get_p2p_status, amdsmi_get_gpu_compute_partition, amdsmi_set_gpu_compute_partition,
    amdsmi_get_gpu_memory_partition, amdsmi_set_gpu_memory_partition,
    amdsmi_get_gpu_memory_partition_config, amdsmi_set_gpu_memory_partition_mode,
    amdsmi_get_gpu_accelerator_partition_profile_config,
    amdsmi_get_gpu_accelerator_partition_profile, amdsmi_set_gpu_accelerator_partition_profile,
    amdsmi_init_gpu_event_notification, amdsmi_set_gpu_event_notification_mask,
    amdsmi_get_gpu_event_notification, amdsmi_stop_gpu_event_notification,
    amdsmi_get_gpu_driver_info, amdsmi_get_gpu_vram_info, amdsmi_get_pcie_info,
    amdsmi_get_gpu_xcd_counter, amdsmi_get_fw_info, amdsmi_get_gpu_vbios_info,
    amdsmi_is_gpu_power_management_enabled, amdsmi_get_gpu_vram_usage, amdsmi_get_violation_status,
    amdsmi_get_gpu_process_list, amdsmi_gpu_driver_reload, amdsmi_get_cpu_core_energy,
    amdsmi_get_cpu_socket_energy, amdsmi_get_threads_per_core, amdsmi_get_cpu_hsmp_driver_version,
    amdsmi_get_cpu_smu_fw_version, amdsmi_get_cpu_hsmp_proto_ver, amdsmi_get_cpu_prochot_status,
    amdsmi_get_cpu_fclk_mclk, amdsmi_get_cpu_cclk_limit,
    amdsmi_get_cpu_socket_current_active_freq_limit, amdsmi_get_cpu_socket_freq_range,
    amdsmi_get_cpu_core_current_freq_limit, amdsmi_get_cpu_core_boostlimit,
    amdsmi_get_cpu_socket_c0_residency, amdsmi_set_cpu_core_boostlimit,
    amdsmi_set_cpu_socket_boostlimit, amdsmi_get_cpu_ddr_bw, amdsmi_get_cpu_socket_temperature,
    amdsmi_get_cpu_dimm_temp_range_and_refresh_rate, amdsmi_get_cpu_dimm_power_consumption,
    amdsmi_get_cpu_dimm_thermal_sensor, amdsmi_set_cpu_xgmi_width,
    amdsmi_set_cpu_gmi3_link_width_range, amdsmi_cpu_apb_enable, amdsmi_cpu_apb_disable,
    amdsmi_set_cpu_socket_lclk_dpm_level, amdsmi_get_cpu_socket_lclk_dpm_level,
    amdsmi_set_cpu_pcie_link_rate, amdsmi_set_cpu_df_pstate_range,
    amdsmi_get_cpu_current_io_bandwidth, amdsmi_get_cpu_current_xgmi_bw,
    amdsmi_get_hsmp_metrics_table_version, amdsmi_get_hsmp_metrics_table,
    amdsmi_first_online_core_on_cpu_socket, amdsmi_get_cpu_family, amdsmi_get_cpu_model,
    amdsmi_get_cpu_model_name, amdsmi_get_esmi_err_msg, amdsmi_get_cpu_cores_per_socket,
    amdsmi_get_cpu_socket_count,
}

/// `amdsmi_free_name_value_pairs(void *)` returns nothing (it frees what
/// `amdsmi_get_gpu_pm_metrics_info` and `amdsmi_get_gpu_reg_table_info` allocate); those are
/// not supported here, so no caller holds anything of ours to free and it does nothing.
#[no_mangle]
pub extern "C" fn amdsmi_free_name_value_pairs(_pairs: *mut c_void) {}
