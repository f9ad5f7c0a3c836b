//! `zeus-monitor serve`: the Prometheus exporter.
//!
//! One HTTP/1.1 server (axum on a single-threaded tokio runtime: scrapes take tens of
//! microseconds, so one thread serves many scrapers at once and the process stays near idle)
//! with three paths:
//!
//! - `GET /metrics`: the text exposition built by [`crate::metrics::Exporter`]; a scrape
//!   formats values that are already in memory (the sampler's cache, the background refresh);
//! - `GET /healthz`: `200 ok`, or `503` with the reasons when the sampler thread stopped or a
//!   GPU's sampling failed;
//! - `GET /`: a line pointing at the two.
//!
//! CPU packages (RAPL) are exported too: `--cpus auto` (default) exports every package when
//! RAPL is present and readable and otherwise says on stderr why it exports none (no RAPL, or
//! `energy_uj` readable only by root: the message names the file and the fixes) and serves the
//! GPUs; `--cpus all` or `--cpus 0,1` make a missing or unreadable RAPL an error; `--cpus none`
//! exports none.
//!
//! The GPUs' energy counters are read by the process's shared sampler thread
//! (`zeus_core::monitor::sampler`), power limits and clock locks by a refresh thread once a
//! second; neither runs on the server's thread. `--listen` defaults to loopback; port 0 picks a
//! free port, and the address actually bound is printed on stderr
//! (`... Serving GPUs [0] at http://127.0.0.1:PORT/metrics`). SIGINT and SIGTERM stop the
//! server: requests in flight are answered (for up to [`GRACE`]) and the process exits 0.

use std::ffi::OsString;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;
use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;
use zeus_core::device::cpu::{CpuError, Cpus};

use crate::metrics::{Collector, CpuCollector, Exporter, GpuCollector, CONTENT_TYPE};
use crate::{log_prefix, open_gpus};

/// How long requests in flight may take to finish after SIGINT/SIGTERM.
pub const GRACE: Duration = Duration::from_secs(2);

/// Serve GPU energy and power metrics to Prometheus.
#[derive(Parser, Debug)]
#[command(
    name = "zeus-monitor serve",
    version,
    about = "Serve GPU and CPU energy and power metrics to Prometheus (GET /metrics, GET /healthz)",
    after_help = "Metrics (labels gpu, uuid, model, hostname): zeus_gpu_energy_joules_total, \
zeus_gpu_power_watts{domain}, zeus_gpu_power_limit_watts, zeus_gpu_clock_locked{clock}; \
(labels cpu, domain=package|dram, hostname): zeus_cpu_energy_joules_total.\n\n\
Examples:\n  zeus-monitor serve                          # all GPUs on 127.0.0.1:9400\n  \
zeus-monitor serve --listen 0.0.0.0:9400    # reachable from other hosts\n  \
zeus-monitor serve --listen 127.0.0.1:0 --gpus 0,1   # a free port, printed on stderr"
)]
struct ServeArgs {
    /// Address to listen on, IP:PORT (`[::1]:9400` for IPv6; port 0 picks a free port).
    /// Loopback by default: pass 0.0.0.0:9400 to be scraped from other hosts.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:9400")]
    listen: String,
    /// GPUs to export, comma-separated visible indices (default: all).
    #[arg(long, value_delimiter = ',', value_name = "INDICES")]
    gpus: Option<Vec<usize>>,
    /// CPU packages to export (RAPL): `auto` (all if RAPL is readable, else none, saying why),
    /// `all`, `none`, or comma-separated package indices.
    #[arg(long, value_name = "auto|all|none|INDICES", default_value = "auto")]
    cpus: String,
}

/// What `--cpus` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CpuChoice {
    Auto,
    All,
    None,
    Some(Vec<usize>),
}

/// Parse `--cpus`; `Err` is the one-line message naming the value.
fn parse_cpus(s: &str) -> Result<CpuChoice, String> {
    match s.trim() {
        "auto" => Ok(CpuChoice::Auto),
        "all" => Ok(CpuChoice::All),
        "none" => Ok(CpuChoice::None),
        list => {
            let bad =
                || format!("--cpus must be auto, all, none or package indices like 0,1, got {s:?}");
            let v = list
                .split(',')
                .map(|p| p.trim().parse::<usize>().map_err(|_| bad()))
                .collect::<Result<Vec<_>, _>>()?;
            for (k, i) in v.iter().enumerate() {
                if v[..k].contains(i) {
                    return Err(format!("CPU index {i} appears twice in --cpus {s:?}"));
                }
            }
            Ok(CpuChoice::Some(v))
        }
    }
}

/// The CPU collector `choice` asks for: `Ok(None)` when none is exported (with `auto`, a note
/// on stderr says why), `Err` (the message) when an explicit choice cannot be served.
fn cpu_collector(choice: &CpuChoice) -> Result<Option<CpuCollector>, String> {
    let indices = match choice {
        CpuChoice::None => return Ok(None),
        CpuChoice::Some(v) => Some(v.clone()),
        CpuChoice::Auto | CpuChoice::All => None,
    };
    let cpus = match Cpus::from_env() {
        Ok(c) => c,
        Err(e) if *choice == CpuChoice::Auto => {
            let what = match e {
                CpuError::NotSupported { .. } => "no RAPL",
                _ => "RAPL unreadable",
            };
            eprintln!(
                "{}Not exporting CPU energy ({what}; --cpus none silences this): {e}",
                log_prefix()
            );
            return Ok(None);
        }
        Err(e) => return Err(e.to_string()),
    };
    let indices = indices.unwrap_or_else(|| cpus.all_indices());
    cpus.check_indices(&indices).map_err(|e| e.to_string())?;
    CpuCollector::new(&cpus, &indices).map(Some)
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("error: {msg} (see zeus-monitor serve --help)");
    ExitCode::from(2)
}

/// Parse `--listen`; `Err` is the one-line message naming the value.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.trim().parse().map_err(|_| {
        format!(
            "--listen must be IP:PORT, e.g. 127.0.0.1:9400 or [::1]:9400 (a host name is not \
             accepted), got {s:?}"
        )
    })
}

/// The indices to export; `Err` is the one-line message.
fn choose_gpus(asked: Option<&[usize]>, visible: usize) -> Result<Vec<usize>, String> {
    let indices: Vec<usize> = match asked {
        Some([]) => return Err("--gpus needs at least one index".into()),
        Some(v) => v.to_vec(),
        None if visible == 0 => return Err("no GPU is visible".into()),
        None => (0..visible).collect(),
    };
    for (k, i) in indices.iter().enumerate() {
        if *i >= visible {
            return Err(format!(
                "GPU index {i} is out of range: {visible} GPU(s) are visible"
            ));
        }
        if indices[..k].contains(i) {
            return Err(format!("GPU index {i} appears twice in --gpus {indices:?}"));
        }
    }
    Ok(indices)
}

/// `zeus-monitor serve ...`; `args` starts with `serve`.
pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let args = match ServeArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    let addr = match parse_listen(&args.listen) {
        Ok(a) => a,
        Err(msg) => return usage_error(&msg),
    };
    let gpus = match open_gpus() {
        Ok(g) => g,
        Err(code) => return code,
    };
    let indices = match choose_gpus(args.gpus.as_deref(), gpus.len()) {
        Ok(v) => v,
        Err(msg) => return usage_error(&msg),
    };
    let cpu_choice = match parse_cpus(&args.cpus) {
        Ok(c) => c,
        Err(msg) => return usage_error(&msg),
    };
    // Bind before starting anything else, so a bad address fails fast and alone.
    let listener = match std::net::TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "error: cannot listen on {addr} (--listen {}): {e}",
                args.listen
            );
            return ExitCode::from(1);
        }
    };
    let bound = listener.local_addr().unwrap_or(addr);
    let gpu_collector = match GpuCollector::new(&gpus, &indices) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}ERROR: {e}", log_prefix());
            return ExitCode::from(1);
        }
    };
    let mut collectors: Vec<Box<dyn Collector>> = vec![Box::new(gpu_collector)];
    let mut cpu_note = String::new();
    match cpu_collector(&cpu_choice) {
        Ok(Some(c)) => {
            cpu_note = format!(" and {} RAPL zone(s)", c.zone_count());
            collectors.push(Box::new(c));
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("{}ERROR: {e}", log_prefix());
            return ExitCode::from(1);
        }
    }
    let exporter = Arc::new(Exporter::new(collectors));

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{}ERROR: starting the runtime: {e}", log_prefix());
            return ExitCode::from(1);
        }
    };
    eprintln!(
        "{}Serving GPUs {indices:?}{cpu_note} at http://{bound}/metrics (Ctrl-C to stop)",
        log_prefix()
    );
    let result = runtime.block_on(run(listener, exporter));
    match result {
        Ok(sig) => {
            eprintln!("{}Stopped by {sig}", log_prefix());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}ERROR: serving on {bound}: {e}", log_prefix());
            ExitCode::from(1)
        }
    }
}

fn router(exporter: Arc<Exporter>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/", get(index))
        .with_state(exporter)
}

async fn metrics(
    State(e): State<Arc<Exporter>>,
) -> ([(header::HeaderName, &'static str); 1], String) {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], e.render())
}

async fn healthz(State(e): State<Arc<Exporter>>) -> (StatusCode, String) {
    match e.health() {
        Ok(()) => (StatusCode::OK, "ok".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn index() -> &'static str {
    "zeus-monitor exporter: GET /metrics (Prometheus text format), GET /healthz\n"
}

/// Serve until SIGINT/SIGTERM; the signal's name.
async fn run(
    listener: std::net::TcpListener,
    exporter: Arc<Exporter>,
) -> std::io::Result<&'static str> {
    listener.set_nonblocking(true)?;
    // Scrapers come seconds apart and close or reuse their connections: 64 per address and
    // 768 in all, each closed after 60 s without traffic, so idle connections cannot make
    // scrapes time out.
    let listener = zeus_http::Bounded::new(
        tokio::net::TcpListener::from_std(listener)?,
        zeus_http::Limits::default(),
        "zeus-monitor",
    );
    // Installed before serving, so a signal that comes right after the banner is not lost.
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let stopped = Arc::new(Notify::new());
    let which = Arc::new(std::sync::OnceLock::new());
    let shutdown = {
        let (stopped, which) = (stopped.clone(), which.clone());
        async move {
            let name = tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
            let _ = which.set(name);
            stopped.notify_one();
        }
    };
    let server = axum::serve(listener, router(exporter)).with_graceful_shutdown(shutdown);
    let grace = async {
        stopped.notified().await;
        tokio::time::sleep(GRACE).await;
    };
    tokio::select! {
        r = server.into_future() => r?,
        _ = grace => {}
    }
    Ok(which.get().copied().unwrap_or("SIGTERM"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert!(parse_listen("127.0.0.1:9400").is_ok());
        assert!(parse_listen("[::1]:0").is_ok());
        let e = parse_listen("localhost:9400").unwrap_err();
        assert!(e.contains("\"localhost:9400\""), "{e}");
        assert!(parse_listen("127.0.0.1").is_err());
        assert!(parse_listen("127.0.0.1:99999").is_err());
    }

    #[test]
    fn cpu_choice() {
        assert_eq!(parse_cpus("auto").unwrap(), CpuChoice::Auto);
        assert_eq!(parse_cpus(" none").unwrap(), CpuChoice::None);
        assert_eq!(parse_cpus("all").unwrap(), CpuChoice::All);
        assert_eq!(parse_cpus("1,0").unwrap(), CpuChoice::Some(vec![1, 0]));
        assert!(parse_cpus("0,0").unwrap_err().contains("twice"));
        let e = parse_cpus("cpu0").unwrap_err();
        assert!(e.contains("\"cpu0\""), "{e}");
        assert!(parse_cpus("").is_err());
    }

    #[test]
    fn gpu_choice() {
        assert_eq!(choose_gpus(None, 3).unwrap(), vec![0, 1, 2]);
        assert_eq!(choose_gpus(Some(&[2, 0]), 3).unwrap(), vec![2, 0]);
        assert!(choose_gpus(Some(&[3]), 3)
            .unwrap_err()
            .contains("out of range"));
        assert!(choose_gpus(Some(&[1, 1]), 3).unwrap_err().contains("twice"));
        assert!(choose_gpus(None, 0).is_err());
    }
}
