//! `zeusd serve`: open the devices, check the configuration, listen, serve until
//! SIGTERM/SIGINT, then put back every GPU setting the daemon holds for its clients. A watcher
//! thread releases the settings of clients that exit or whose lease lapses ([`owners`]).
//!
//! [`owners`]: crate::owners

use std::future::IntoFuture;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use zeus_core::device::settings::{restore_stale, Journal};
use zeus_core::device::{BackendKind, Gpus, SystemClock};
use zeus_http::{Bounded, Limits};

use crate::api::Group;
use crate::cli::{Mode, ServeArgs};
use crate::owners::{Clients, WATCH_PERIOD};
use crate::peer::Peer;
use crate::router::router;
use crate::state::CpuState;
use crate::state::{App, EnergyCache};
use crate::token::Signer;

/// How long requests in flight may take after the stop signal.
const GRACE: Duration = Duration::from_secs(3);

fn period(hz: f64) -> Duration {
    Duration::from_secs_f64(1.0 / hz)
}

/// Everything before listening; `Err` is the message to exit with.
fn build(args: &ServeArgs, stopping: watch::Receiver<bool>) -> Result<App, String> {
    let explicit = args.enable.as_ref().map(|g| g.0.clone());
    let enabled = explicit.clone().unwrap_or_else(|| Group::ALL.to_vec());
    let signer = args
        .signing_key_path
        .as_deref()
        .map(Signer::from_file)
        .transpose()?;
    let wants_gpus = enabled.contains(&Group::GpuControl) || enabled.contains(&Group::GpuRead);
    let gpus = if wants_gpus {
        Gpus::from_env().map_err(|e| format!("cannot open the GPUs: {e}"))?
    } else {
        Gpus::with_indices(
            BackendKind::Nvml,
            Vec::new(),
            Vec::new(),
            Arc::new(SystemClock),
        )
    };
    for note in gpus.notes() {
        eprintln!("zeusd: warning: {note}");
    }
    if gpus.backend() == BackendKind::Sim
        && std::env::var_os("ZEUS_SIM_SHARED").is_none_or(|v| v.is_empty())
    {
        eprintln!(
            "zeusd: warning: serving simulated GPUs that only this daemon sees: a job reads its \
             own simulated GPUs, not these, so it would not see the daemon's writes. Start both \
             with ZEUS_SIM_SHARED=<file> to share them"
        );
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if enabled.contains(&Group::GpuControl) && gpus.backend() != BackendKind::Sim && !root {
        return Err(
            "API group gpu-control needs root (NVML and AMD SMI refuse power-limit and clock \
             changes otherwise): run as root, or serve only reads with --enable gpu-read,cpu-read"
                .into(),
        );
    }
    let cpus = if enabled.contains(&Group::CpuRead) {
        match CpuState::open() {
            Ok(c) => c,
            Err(e) if explicit.is_none() => {
                eprintln!(
                    "zeusd: serving no CPUs (RAPL is missing; /cpu/* answer 400 saying so): {e}"
                );
                CpuState::Missing(e)
            }
            Err(e) => return Err(format!("--enable cpu-read, but {e}")),
        }
    } else {
        CpuState::Off
    };
    let journal = match &args.state_dir {
        Some(d) => Journal::at(d),
        None => Journal::default_location(),
    };
    let clients = Clients::new(
        gpus.clone(),
        journal.clone(),
        Duration::from_secs_f64(args.tcp_lease_seconds),
    );
    if enabled.contains(&Group::GpuControl) {
        // Entries whose holders all died (clients of a daemon that was SIGKILLed, or the
        // daemon itself) are restored; those of clients still running are adopted.
        let report = restore_stale(&journal, &gpus, false);
        for r in &report.restored {
            eprintln!("zeusd: startup restore: {r}");
        }
        for f in &report.failed {
            eprintln!("zeusd: startup restore failed: {f}");
        }
        for line in clients.adopt() {
            eprintln!("zeusd: startup: {line}");
        }
    }
    // Cumulative energy is answered from the process's sampler cache (no 3-6 ms counter read
    // per request): the GPUs with a counter are leased for the daemon's life. The sampler
    // keeps its default budget for counter reads (4% of a core for all GPUs): with the
    // exporter's 0.5%, anchors come ~0.7 s apart and 1.5 s differences were off by up to 3%;
    // with 4% they are within 0.15% (tests/zeusd: test_cached_cumulative_energy_...).
    let energy = if enabled.contains(&Group::GpuRead) {
        let mut with_counter = Vec::new();
        for i in 0..gpus.len() {
            let d = gpus.device(i).map_err(|e| format!("GPU {i}: {e}"))?;
            if d.supports_total_energy_consumption().unwrap_or(false) {
                with_counter.push((i, d.clone()));
            }
        }
        if with_counter.is_empty() {
            None
        } else {
            let devices: Vec<_> = with_counter.iter().map(|(_, d)| d.clone()).collect();
            let lease = zeus_core::monitor::sampler::Sampler::lease(&devices)
                .map_err(|e| format!("starting the energy sampler: {e}"))?;
            Some(EnergyCache::new(
                lease,
                with_counter.iter().map(|(i, _)| *i).collect(),
            ))
        }
    } else {
        None
    };
    Ok(App {
        energy,
        clients,
        gpus,
        cpus,
        enabled,
        signer,
        gpu_stream_period: period(args.gpu_stream_hz),
        cpu_stream_period: period(args.cpu_stream_hz),
        stopping,
    })
}

fn prepare_socket(args: &ServeArgs) -> Result<UnixListener, String> {
    let path: &Path = &args.socket_path;
    let ctx = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    // Only an old socket is replaced: a --socket-path naming any other file is a mistake
    // (root would delete whatever it names).
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| ctx("cannot remove the old socket", e))?
        }
        Ok(_) => {
            return Err(format!(
                "--socket-path {} exists and is not a socket; refusing to replace it",
                path.display()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ctx("cannot inspect", e)),
    }
    let l = UnixListener::bind(path).map_err(|e| {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        match parent {
            Some(dir) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => format!(
                "cannot listen on {}: the directory {} does not exist: create it (sudo mkdir -p \
                 {}) or run zeusd from the unit `zeusd unit` writes, which creates it",
                path.display(),
                dir.display(),
                dir.display()
            ),
            _ => ctx("cannot listen on", e),
        }
    })?;
    if args.socket_uid.is_some() || args.socket_gid.is_some() {
        std::os::unix::fs::chown(path, args.socket_uid, args.socket_gid)
            .map_err(|e| ctx("cannot chown (--socket-uid/--socket-gid)", e))?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        path,
        std::fs::Permissions::from_mode(args.socket_permissions),
    )
    .map_err(|e| ctx("cannot chmod (--socket-permissions)", e))?;
    Ok(l)
}

/// Every client (a socket peer's uid, a TCP address) may hold 64 connections and all together
/// 768, well under the units' `LimitNOFILE`, so no local user can take the descriptors that
/// other clients and the restores of killed clients' settings need; a connection silent both
/// ways for 60 s is closed (event streams send keep-alives every 15 s).
fn connection_limits() -> Limits {
    Limits::default()
}

/// Resolves at SIGTERM or SIGINT with the signal's name.
async fn stop_signal() -> &'static str {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

pub async fn run(args: ServeArgs) -> Result<(), String> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let app = Arc::new(build(&args, stop_rx)?);
    let groups: Vec<&str> = app.enabled.iter().map(|g| g.name()).collect();
    let routes = router(app.clone());
    let watcher_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let app = app.clone();
        let stop = watcher_stop.clone();
        std::thread::Builder::new()
            .name("zeusd-watcher".into())
            .spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Wakes at once when a client process exits or a new one arrives (whose
                    // pidfd the next wait adds), else after a round (leases; kernels without
                    // pidfds).
                    if app.clients.wait(WATCH_PERIOD) == crate::exits::Woken::Exit {
                        // The exited client is removed below; should one stay listed, this
                        // keeps the loop from spinning on its readable pidfd.
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    for line in app.clients.reap() {
                        eprintln!("zeusd: {line}");
                    }
                }
            })
            .map_err(|e| format!("cannot start the client watcher: {e}"))?
    };
    // Installed before serving so an early signal is not lost.
    let stop = stop_signal();
    let stopped = Arc::new(tokio::sync::Notify::new());
    let shutdown = {
        let stopped = stopped.clone();
        async move {
            let sig = stop.await;
            eprintln!("zeusd: {sig}: stopping");
            let _ = stop_tx.send(true);
            stopped.notify_one();
        }
    };
    let auth = if app.signer.is_some() { "on" } else { "off" };
    let served = match args.mode {
        Mode::Tcp => {
            let l = TcpListener::bind(&args.tcp_bind_address)
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", args.tcp_bind_address))?;
            // The address bound, not the one asked for: port 0 picks a free port.
            let bound = l
                .local_addr()
                .map_or_else(|_| args.tcp_bind_address.clone(), |a| a.to_string());
            eprintln!("zeusd: listening on {bound} (groups {groups:?}, auth {auth})");
            let l = Bounded::new(l, connection_limits(), "zeusd");
            let server = axum::serve(l, routes.into_make_service_with_connect_info::<Peer>())
                .with_graceful_shutdown(shutdown);
            serve_with_grace(server.into_future(), stopped).await
        }
        Mode::Uds => {
            let l = Bounded::new(prepare_socket(&args)?, connection_limits(), "zeusd");
            eprintln!(
                "zeusd: listening on {} (groups {groups:?}, auth {auth})",
                args.socket_path.display()
            );
            let server = axum::serve(l, routes.into_make_service_with_connect_info::<Peer>())
                .with_graceful_shutdown(shutdown);
            serve_with_grace(server.into_future(), stopped).await
        }
    };
    watcher_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = watcher.join();
    for line in app.clients.release_all() {
        eprintln!("zeusd: {line}");
    }
    if args.mode == Mode::Uds {
        let _ = std::fs::remove_file(&args.socket_path);
    }
    served.map_err(|e| format!("serving: {e}"))
}

/// Run the server; after the stop signal, give requests in flight [`GRACE`] to finish.
async fn serve_with_grace(
    server: impl std::future::Future<Output = std::io::Result<()>>,
    stopped: Arc<tokio::sync::Notify>,
) -> std::io::Result<()> {
    tokio::select! {
        r = server => r,
        _ = async { stopped.notified().await; tokio::time::sleep(GRACE).await } => {
            eprintln!("zeusd: requests still open after {GRACE:?}; exiting anyway");
            Ok(())
        }
    }
}
