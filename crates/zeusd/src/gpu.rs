//! `/gpu/*`: reads (group gpu-read) and writes (group gpu-control).
//!
//! Every parameter is checked before any GPU is touched, so a refused request changes
//! nothing. Power limits, clock locks and clock resets are held per client ([`owners`]:
//! journaled, put back when the client exits or its lease lapses, 409 when another live client
//! holds the setting at another value); persistence mode goes to the device directly (the
//! guard does not journal it).
//!
//! [`owners`]: crate::owners

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Json;
use serde_json::{json, Map, Value};
use zeus_core::device::settings::Kind;
use zeus_core::device::{Gpu, GpuError};

use crate::api::{gpu_status, now_ms, ApiError, DeviceErrors, Params, Write};
use crate::owners::{ClientKey, Requester, WriteError};
use crate::peer::Caller;
use crate::state::{App, Shared};

pub fn read_routes() -> Vec<(&'static str, MethodRouter<Shared>)> {
    vec![
        ("/gpu/get_power_limit", get(get_power_limit)),
        (
            "/gpu/get_power_limit_constraints",
            get(get_power_limit_constraints),
        ),
        ("/gpu/get_cumulative_energy", get(get_cumulative_energy)),
        ("/gpu/get_power", get(get_power)),
        ("/gpu/get_persistence_mode", get(get_persistence_mode)),
    ]
}

pub fn control_routes() -> Vec<(&'static str, MethodRouter<Shared>)> {
    vec![
        (
            "/gpu/set_power_limit",
            write_route(|p| Ok(Write::PowerLimit(p.u32("power_limit_mw")?))),
        ),
        (
            "/gpu/set_persistence_mode",
            write_route(|p| Ok(Write::Persistence(p.bool("enabled")?))),
        ),
        (
            "/gpu/set_gpu_locked_clocks",
            write_route(|p| clock_range(p).map(|(lo, hi)| Write::LockGpu(lo, hi))),
        ),
        (
            "/gpu/reset_gpu_locked_clocks",
            write_route(|_| Ok(Write::ResetGpu)),
        ),
        (
            "/gpu/set_mem_locked_clocks",
            write_route(|p| clock_range(p).map(|(lo, hi)| Write::LockMem(lo, hi))),
        ),
        (
            "/gpu/reset_mem_locked_clocks",
            write_route(|_| Ok(Write::ResetMem)),
        ),
        (
            "/gpu/reset_locked_clocks",
            write_route(|_| Ok(Write::ResetBoth)),
        ),
        ("/gpu/release", write_route(release)),
        ("/client/renew_lease", post(renew_lease)),
    ]
}

/// `{"<id>": read(gpu)}` for `gpu_ids` (all GPUs when absent); per-GPU errors aggregated.
fn per_gpu_read(
    app: &App,
    params: &Params,
    read: impl Fn(usize, &dyn Gpu) -> Result<Value, GpuError>,
) -> Result<Map<String, Value>, ReadError> {
    let ids = params
        .ids("gpu_ids", app.gpus.len(), false)
        .map_err(ReadError::Param)?;
    let mut out = Map::new();
    let mut errors = DeviceErrors::default();
    for i in ids {
        match app.gpus.device(i).and_then(|d| read(i, d.as_ref())) {
            Ok(v) => {
                out.insert(i.to_string(), v);
            }
            Err(e) => errors.add(i, gpu_status(&e), e.to_string(), e.class_name()),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ReadError::Devices(errors))
    }
}

/// A read refused for its parameters, or failed on some GPUs.
enum ReadError {
    Param(ApiError),
    Devices(DeviceErrors),
}

impl IntoResponse for ReadError {
    fn into_response(self) -> Response {
        match self {
            ReadError::Param(e) => e.into_response(),
            ReadError::Devices(e) => e.into_response(),
        }
    }
}

fn answer(r: Result<Map<String, Value>, ReadError>) -> Response {
    match r {
        Ok(m) => Json(Value::Object(m)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn get_power_limit(State(app): State<Shared>, params: Params) -> Response {
    answer(per_gpu_read(&app, &params, |_, d| {
        Ok(json!({"power_limit_mw": d.power_management_limit()?}))
    }))
}

async fn get_power_limit_constraints(State(app): State<Shared>, params: Params) -> Response {
    answer(per_gpu_read(&app, &params, |_, d| {
        let (lo, hi) = d.power_management_limit_constraints()?;
        Ok(json!({"min_power_limit_mw": lo, "max_power_limit_mw": hi}))
    }))
}

async fn get_cumulative_energy(State(app): State<Shared>, params: Params) -> Response {
    answer(per_gpu_read(&app, &params, |index, d| {
        if !d.supports_total_energy_consumption()? {
            return Err(GpuError::NotSupported(
                "this GPU has no cumulative energy counter (Volta or newer has one)".into(),
            ));
        }
        // From the sampler's cache (microseconds); the counter itself (3-6 ms of driver time
        // on real GPUs) only before the cache has its first value or when its model does not
        // fit the board. `uncertainty_mj` (our extension): how far the value may be from the
        // energy at this moment, a 95% bound.
        let now = app.gpus.now();
        if let Some((mj, bound)) = app.energy.as_ref().and_then(|c| c.energy_mj(index, now)) {
            return Ok(json!({ "energy_mj": mj, "uncertainty_mj": bound }));
        }
        let mj = d.total_energy_consumption()?;
        // The counter as last published: up to an update period of power behind.
        let bound = match (d.power_update_period(), power_mw(d)) {
            (Some(period), Ok(mw)) => Some((period * f64::from(mw)).ceil() as u64),
            _ => None,
        };
        Ok(json!({"energy_mj": mj, "uncertainty_mj": bound}))
    }))
}

async fn get_persistence_mode(State(app): State<Shared>, params: Params) -> Response {
    answer(per_gpu_read(&app, &params, |_, d| {
        Ok(json!({"enabled": d.persistence_mode()?}))
    }))
}

/// Power now, mW: the instant reading, or the driver's average on boards without one (as
/// NVML's GetPowerUsage does).
pub fn power_mw(d: &dyn Gpu) -> Result<u32, GpuError> {
    zeus_core::device::power_mw(d, zeus_core::device::PowerPreference::Instant)
}

async fn get_power(State(app): State<Shared>, params: Params) -> Response {
    match per_gpu_read(&app, &params, |_, d| Ok(json!(power_mw(d)?))) {
        Ok(m) => Json(json!({"timestamp_ms": now_ms(), "power_mw": m})).into_response(),
        Err(e) => e.into_response(),
    }
}

fn clock_range(params: &Params) -> Result<(u32, u32), ApiError> {
    let lo = params.u32("min_clock_mhz")?;
    let hi = params.u32("max_clock_mhz")?;
    if lo > hi {
        return Err(ApiError::param(
            "min_clock_mhz",
            format!("{lo} is greater than max_clock_mhz {hi}"),
        ));
    }
    Ok((lo, hi))
}

fn apply(app: &App, r: &Requester, i: usize, w: Write) -> Result<(), WriteError> {
    match w {
        Write::Persistence(on) => Ok(app.gpus.device(i)?.set_persistence_mode(on)?),
        _ => app.clients.write(r, i, w),
    }
}

fn apply_all(app: &App, r: &Requester, ids: &[usize], w: Write) -> DeviceErrors {
    let mut errors = DeviceErrors::default();
    for &i in ids {
        match apply(app, r, i, w) {
            Ok(()) => {}
            Err(WriteError::Device(status, msg, class)) => errors.add(i, status, msg, class),
            Err(WriteError::Conflict(msg, detail)) => {
                errors.add(i, StatusCode::CONFLICT, msg, "ZeusdSettingHeldError");
                errors.conflicts.push(detail);
            }
        }
    }
    errors
}

/// Check every parameter, then apply: with `block=true` (default) wait and answer with the
/// per-GPU errors; with `block=false` answer 200 at once and log the outcome when it is
/// known. Every write is logged, refused ones too.
async fn write(
    app: Shared,
    caller: Caller,
    params: Result<Params, ApiError>,
    op: impl FnOnce(&Params) -> Result<Write, ApiError>,
) -> Response {
    let parsed = (|| {
        let params = params?;
        let ids = params.ids("gpu_ids", app.gpus.len(), true)?;
        let block = params.bool_or("block", true)?;
        Ok::<_, ApiError>((ids, block, op(&params)?))
    })();
    let (ids, block, w) = match parsed {
        Ok(p) => p,
        Err(e) => {
            caller.log(&format!("{} {}", e.status.as_u16(), e.message));
            return e.into_response();
        }
    };
    let task = {
        let app = app.clone();
        let r = app.clients.identify(&caller);
        tokio::task::spawn_blocking(move || apply_all(&app, &r, &ids, w))
    };
    if !block {
        tokio::spawn(async move {
            match task.await {
                Ok(errors) => caller.log(&outcome(&errors, " (block=false)")),
                Err(e) => caller.log(&format!("500 write task failed: {e} (block=false)")),
            }
        });
        return StatusCode::OK.into_response();
    }
    match task.await {
        Ok(errors) => {
            caller.log(&outcome(&errors, ""));
            if errors.is_empty() {
                StatusCode::OK.into_response()
            } else {
                errors.into_response()
            }
        }
        Err(e) => {
            caller.log(&format!("500 write task failed: {e}"));
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("write failed: {e}"),
            )
            .into_response()
        }
    }
}

fn outcome(errors: &DeviceErrors, note: &str) -> String {
    match errors.status {
        None => format!("200 ok{note}"),
        Some(s) => format!(
            "{} {}{note}",
            s.as_u16(),
            Value::Object(errors.errors.clone())
        ),
    }
}

/// A `POST` route for one kind of write: `parse` reads the write from the query; `write` does
/// the rest (GPU ids, `block`, holds, journal, per-GPU errors) the same for every kind.
fn write_route(parse: fn(&Params) -> Result<Write, ApiError>) -> MethodRouter<Shared> {
    post(
        move |State(app): State<Shared>, caller: Caller, params: Result<Params, ApiError>| {
            write(app, caller, params, parse)
        },
    )
}

/// `POST /gpu/release?gpu_ids=..&setting=power_limit|clocks` (our extension): give back the
/// caller's hold, which restores the setting unless another client holds it. A client that
/// "restored" by writing the original value would hold that value instead, and others would get
/// 409 until it exited.
fn release(p: &Params) -> Result<Write, ApiError> {
    let kind = match p.required("setting")? {
        "power_limit" => Kind::PowerLimit,
        "clocks" => Kind::Clocks,
        other => {
            return Err(ApiError::param(
                "setting",
                format!("expected power_limit or clocks, got {other:?}"),
            ))
        }
    };
    Ok(Write::Release(kind))
}

/// `POST /client/renew_lease` (our extension): renew the caller's lease and say when it ends.
/// A Unix-socket client with a pid holds its settings while it runs and has no lease.
async fn renew_lease(State(app): State<Shared>, caller: Caller) -> Response {
    let r = app.clients.identify(&caller);
    match &r.key {
        ClientKey::Process(o) => Json(json!({
            "client": Value::Null,
            "pid": o.pid,
            "expires_ms": Value::Null,
            "lease_seconds": Value::Null,
        }))
        .into_response(),
        ClientKey::Lease(key) => {
            let (expires, holds) = app.clients.open_lease(&r);
            let left = expires.saturating_duration_since(std::time::Instant::now());
            Json(json!({
                "client": key,
                "pid": Value::Null,
                "expires_ms": now_ms() + left.as_millis() as u64,
                "lease_seconds": app.clients.lease().as_secs_f64(),
                "holds": holds,
            }))
            .into_response()
        }
    }
}
