//! Server-sent streams: `/gpu/stream_power` (one event per GPU sample),
//! `/cpu/stream_power` (one event per package sample) and `/client/hold` (a TCP client's
//! heartbeat, which keeps its lease for as long as the connection is open).
//!
//! Each connection has its own timer, polled only while the response body is being read:
//! when the client goes away hyper drops the body and with it the timer, so nothing samples
//! for nobody. Streams end at daemon shutdown so graceful shutdown is not held up.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use axum::routing::{get, MethodRouter};

use crate::api::{now_ms, ApiError, Group, Params};
use crate::gpu::power_mw;
use crate::owners::ClientKey;
use crate::peer::Caller;
use crate::state::Shared;

/// How often `/client/hold` writes: a connection whose client is gone fails the second write
/// after the peer's kernel closed it, so this bounds how late the daemon notices.
const HOLD_BEAT: Duration = Duration::from_millis(250);

/// The streaming paths of `group`.
pub fn routes(group: Group) -> Vec<(&'static str, MethodRouter<Shared>)> {
    match group {
        Group::GpuRead => vec![("/gpu/stream_power", get(gpu_stream_power))],
        Group::GpuControl => vec![("/client/hold", get(client_hold))],
        Group::CpuRead => vec![("/cpu/stream_power", get(cpu_stream_power))],
    }
}

/// Every `period`, `sample()`'s events, one by one; ends when `stop` turns true.
fn poll_stream<F>(
    stop: watch::Receiver<bool>,
    period: Duration,
    sample: F,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static
where
    F: FnMut() -> Vec<Event> + Send + 'static,
{
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let state = (interval, stop, sample, VecDeque::new());
    stream::unfold(
        state,
        |(mut interval, mut stop, mut sample, mut pending)| async move {
            loop {
                if let Some(e) = pending.pop_front() {
                    return Some((Ok(e), (interval, stop, sample, pending)));
                }
                if *stop.borrow() {
                    return None;
                }
                tokio::select! {
                    _ = interval.tick() => pending.extend(sample()),
                    r = stop.changed() => if r.is_err() || *stop.borrow() { return None },
                }
            }
        },
    )
}

fn sse(s: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}

/// `GET /gpu/stream_power[?gpu_ids=..]`: `data: {"timestamp_ms", "gpu_id", "power_mw"}`.
pub async fn gpu_stream_power(State(app): State<Shared>, params: Params) -> Response {
    let ids = match params.ids("gpu_ids", app.gpus.len(), false) {
        Ok(ids) => ids,
        Err(e) => return e.into_response(),
    };
    let stop = app.stopping.clone();
    let period = app.gpu_stream_period;
    sse(poll_stream(stop, period, move || {
        let t = now_ms();
        ids.iter()
            .map(
                |&i| match app.gpus.device(i).and_then(|d| power_mw(d.as_ref())) {
                    Ok(mw) => Event::default()
                        .data(json!({"timestamp_ms": t, "gpu_id": i, "power_mw": mw}).to_string()),
                    Err(e) => Event::default().event("error").data(
                        json!({"timestamp_ms": t, "gpu_id": i, "error": e.to_string()}).to_string(),
                    ),
                },
            )
            .collect()
    }))
}

/// One read of a CPU package's counters: when (monotonic, and the wall clock in ms) and the
/// energies (J).
#[derive(Clone, Copy)]
struct PackageRead {
    at: Instant,
    at_ms: u64,
    package_j: f64,
    dram_j: Option<f64>,
}

/// `GET /cpu/stream_power[?cpu_ids=..]`: `data: {"timestamp_ms", "since_ms", "cpu_id",
/// "cpu_mw", "dram_mw"}`, the mean power between the previous sample's reads (`since_ms`)
/// and this one's (`timestamp_ms`). On a busy machine ticks are skipped and the span grows,
/// so a consumer comparing the figure with anything needs both ends. The first sample uses
/// the zone's observed power (`since_ms` null), or waits for the second.
pub async fn cpu_stream_power(State(app): State<Shared>, params: Params) -> Response {
    let ids = match crate::cpu::chosen(&app, &params) {
        Ok(ids) => ids,
        Err(e) => return e.into_response(),
    };
    let stop = app.stopping.clone();
    let period = app.cpu_stream_period;
    let mut prev: Vec<Option<PackageRead>> = vec![None; ids.len()];
    sse(poll_stream(stop, period, move || {
        let Ok(cpus) = app.cpus.cpus() else {
            return Vec::new();
        };
        let t = now_ms();
        let mut out = Vec::new();
        for (k, &i) in ids.iter().enumerate() {
            let read = cpus.package(i).and_then(|p| {
                let pkg = p.package.energy_j()?;
                let dram = p.dram.as_ref().map(|z| z.energy_j()).transpose()?;
                Ok((p, pkg, dram))
            });
            let (p, pkg, dram) = match read {
                Ok(r) => r,
                Err(e) => {
                    out.push(Event::default().event("error").data(
                        json!({"timestamp_ms": t, "cpu_id": i, "error": e.to_string()}).to_string(),
                    ));
                    continue;
                }
            };
            let (now, read_ms) = (Instant::now(), now_ms());
            let since_ms = prev[k].map(|r| r.at_ms);
            let power = match prev[k] {
                Some(PackageRead {
                    at: t0,
                    package_j: pkg0,
                    dram_j: dram0,
                    ..
                }) => {
                    let dt = now.duration_since(t0).as_secs_f64().max(1e-6);
                    let d = match (dram, dram0) {
                        (Some(a), Some(b)) => Some((a - b).max(0.0) / dt),
                        _ => None,
                    };
                    Some(((pkg - pkg0).max(0.0) / dt, d))
                }
                None => p
                    .package
                    .observed_power_w()
                    .map(|w| (w, p.dram.as_ref().and_then(|z| z.observed_power_w()))),
            };
            prev[k] = Some(PackageRead {
                at: now,
                at_ms: read_ms,
                package_j: pkg,
                dram_j: dram,
            });
            if let Some((cpu_w, dram_w)) = power {
                out.push(
                    Event::default().data(
                        json!({
                            "timestamp_ms": read_ms,
                            "since_ms": since_ms,
                            "cpu_id": i,
                            "cpu_mw": (cpu_w * 1000.0).round() as u64,
                            "dram_mw": dram_w.map(|w| (w * 1000.0).round() as u64),
                        })
                        .to_string(),
                    ),
                );
            }
        }
        out
    }))
}

/// A hold connection's place in its client's lease; closing the connection (hyper drops the
/// body) drops it.
struct HoldOpen {
    app: Shared,
    key: String,
}

impl Drop for HoldOpen {
    fn drop(&mut self) {
        let (app, key) = (self.app.clone(), std::mem::take(&mut self.key));
        // The client table's lock may be held across a driver call by a write: not on an
        // async worker.
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(move || app.clients.hold_closed(&key));
            }
            Err(_) => app.clients.hold_closed(&key),
        }
    }
}

/// `GET /client/hold` (our extension, group gpu-control): a TCP client keeps this open while
/// it holds settings (and renews its lease as before: the connection does not). When the
/// connection closes (the client exited, or its kernel closed the socket of a SIGKILLed
/// client) the lease ends a second later unless the client reconnects. Events every 250 ms:
/// `data: {"client", "holds", "lease_seconds"}` (`holds` null when the count was busy to
/// read). A Unix-socket client is held by its process: 400.
pub async fn client_hold(State(app): State<Shared>, caller: Caller) -> Response {
    let r = app.clients.identify(&caller);
    let ClientKey::Lease(key) = r.key.clone() else {
        return ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "a Unix-socket client's settings are held for as long as its process runs; \
             /client/hold is for TCP clients",
        )
        .into_response();
    };
    let holds = {
        let app = app.clone();
        match tokio::task::spawn_blocking(move || app.clients.hold_opened(&r)).await {
            Ok(n) => n,
            Err(e) => {
                return ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    format!("opening the hold: {e}"),
                )
                .into_response()
            }
        }
    };
    let open = HoldOpen {
        app: app.clone(),
        key: key.clone(),
    };
    let lease = app.clients.lease().as_secs_f64();
    let mut first = Some(holds);
    let stop = app.stopping.clone();
    sse(poll_stream(stop, HOLD_BEAT, move || {
        let holds = first
            .take()
            .or_else(|| open.app.clients.holds_now(&open.key));
        vec![Event::default()
            .data(json!({"client": open.key, "holds": holds, "lease_seconds": lease}).to_string())]
    }))
}
