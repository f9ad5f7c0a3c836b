//! `zeus-monitor`: the standalone GPU power logger and Prometheus exporter of zeus.
//!
//! Two forms, told apart by the first argument:
//!
//! - `zeus-monitor serve [--listen 127.0.0.1:9400] [--gpus 0,1]` ([`serve`]): an HTTP server
//!   whose `/metrics` exposes each GPU's cumulative energy, power, power limit and clock locks
//!   in the Prometheus text format, read through the process's shared energy sampler
//!   (`zeus_core::monitor::sampler`), so a scrape never waits on a driver's energy counter.
//!   [`metrics`] builds the exposition from a list of collectors.
//! - Anything else is the logger ([`logger`]). The reference form
//!   `zeus-monitor LOGFILE DURATION SLEEP_MS [GPU_IDX]` writes the reference CSV (`Time,Power`,
//!   power in mW, time like `2022-07-13 02:07:36.708783111`, UTC), which `zeus.analyze` reads.
//!   Extras: several GPUs, a fixed-rate `--interval`, JSON lines, energy counter columns and `-`
//!   for stdout. Every row is flushed as it is written, and SIGINT/SIGTERM stop the loop, so an
//!   interrupted run keeps every sample taken; the run ends with a one-line summary on stderr
//!   and exit status 0.
//!
//!   `zeus-monitor --restore` instead undoes what zeus processes that died without cleaning up
//!   (e.g. killed with SIGKILL) left on the GPUs, from the journal of
//!   `zeus_core::device::settings`: original power limits are set back and locked GPU/memory
//!   clocks reset. It prints one line per setting restored, and exits 0 (1 if some entry could
//!   not be restored; it stays journaled). Entries of processes that still run are left alone.
//!
//! GPUs come from `zeus_core::device::Gpus::from_env()`: real NVML, a fake `libnvidia-ml`
//! (`ZEUS_NVML_LIB`), or the simulator (`ZEUS_GPU_BACKEND=sim`). Indices are visible indices
//! (after `CUDA_VISIBLE_DEVICES`; the same as NVML's when it is unset).
//!
//! - `zeus-monitor unit [SERVE ARGS...]`: print a systemd unit that runs the exporter from this
//!   binary's real path.
//!
//! `serve` (and `unit`) is dispatched on the first argument rather than as a clap subcommand: the logger's
//! first positional is a file name, and a clap subcommand beside optional positionals would
//! change how the reference form's errors read. (A log file literally named `serve` can be
//! given as `./serve`.)

mod logger;
mod metrics;
mod serve;

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

/// "%F %T [ZeusMonitor] ", as the reference prints (seconds, no fraction).
pub(crate) fn log_prefix() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let full = zeus_core::monitor::power_log::format_utc(now.as_secs() as i64, now.subsec_nanos());
    format!("{} [ZeusMonitor] ", &full[..19])
}

/// The visible GPUs, or exit status 1 after printing why they cannot be opened.
pub(crate) fn open_gpus() -> Result<zeus_core::device::Gpus, ExitCode> {
    let gpus = zeus_core::device::Gpus::from_env().map_err(|e| {
        eprintln!("{}ERROR: {e}", log_prefix());
        ExitCode::from(1)
    })?;
    for note in gpus.notes() {
        eprintln!("{}WARNING: {note}", log_prefix());
    }
    Ok(gpus)
}

/// `zeus-monitor unit [SERVE ARGS...]`: a systemd unit running this very binary's exporter
/// (the console script `pip install` puts on PATH is a Python launcher; the unit names the
/// binary in its real place), for /etc/systemd/system/zeus-monitor.service.
fn unit(serve_args: Vec<String>) -> ExitCode {
    let exe = match std::env::current_exe().and_then(|p| p.canonicalize()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("zeus-monitor: cannot find this binary's path: {e}");
            return ExitCode::from(1);
        }
    };
    let args = if serve_args.is_empty() {
        String::new()
    } else {
        format!(" {}", serve_args.join(" "))
    };
    print!(
        "[Unit]
Description=zeus-monitor: Prometheus exporter of GPU (and CPU) energy and power
After=network.target

[Service]
Type=simple
# Written by `zeus-monitor unit`. Reading GPU energy needs no privilege: a throwaway user.
# CPU energy (RAPL) is readable by root only on current kernels: for it, replace
# DynamicUser=yes with User=root.
ExecStart={exe} serve{args}
DynamicUser=yes
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
# The exporter caps each address at 64 connections and all at 768.
LimitNOFILE=4096
Restart=on-failure

[Install]
WantedBy=multi-user.target
",
        exe = exe.display()
    );
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "serve") {
        serve::main(std::env::args_os().skip(1))
    } else if std::env::args_os().nth(1).is_some_and(|a| a == "unit") {
        unit(std::env::args().skip(2).collect())
    } else {
        logger::main()
    }
}
