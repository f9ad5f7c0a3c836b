//! `/cpu/*` (group cpu-read): package and DRAM energy and power from RAPL through zeus-core.
//!
//! Every zone is leased on zeus-core's sampler for the daemon's life, so the sampler thread
//! reads each counter often enough that no wrap is lost and the energies served are
//! cumulative, unwrapped microjoules.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Json;
use serde_json::{json, Map, Value};
use zeus_core::device::cpu::{CpuError, RaplZone};

use crate::api::{now_ms, ApiError, Params};
use crate::state::{App, Shared};

pub fn routes() -> Vec<(&'static str, MethodRouter<Shared>)> {
    vec![
        ("/cpu/get_cumulative_energy", get(get_cumulative_energy)),
        ("/cpu/get_power", get(get_power)),
    ]
}

fn cpu_status(e: &CpuError) -> StatusCode {
    match e {
        CpuError::InvalidArg(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn cpu_error(e: CpuError) -> ApiError {
    ApiError::new(cpu_status(&e), e.to_string())
}

/// The packages named by `cpu_ids` (all when absent).
pub fn chosen(app: &App, params: &Params) -> Result<Vec<usize>, ApiError> {
    let cpus = app.cpus.cpus()?;
    params.ids("cpu_ids", cpus.len(), false)
}

fn uj(zone: &RaplZone) -> Result<u64, ApiError> {
    zone.energy_j()
        .map(|j| (j * 1e6).round() as u64)
        .map_err(cpu_error)
}

async fn get_cumulative_energy(State(app): State<Shared>, params: Params) -> Response {
    let r = (|| {
        let ids = chosen(&app, &params)?;
        let want_cpu = params.bool("cpu")?;
        let want_dram = params.bool("dram")?;
        let cpus = app.cpus.cpus()?;
        let mut out = Map::new();
        for i in ids {
            let p = cpus.package(i).map_err(cpu_error)?;
            let cpu = want_cpu.then(|| uj(&p.package)).transpose()?;
            let dram = match (&p.dram, want_dram) {
                (Some(z), true) => Some(uj(z)?),
                _ => None,
            };
            out.insert(
                i.to_string(),
                json!({"cpu_energy_uj": cpu, "dram_energy_uj": dram}),
            );
        }
        Ok::<_, ApiError>(Json(Value::Object(out)))
    })();
    r.into_response()
}

/// Watts of one zone now: the power the zone observed between recent reads (the sampler's
/// and ours), else from two reads of our own `gap` apart.
async fn zone_power_w(zone: &Arc<RaplZone>, gap: Duration) -> Result<f64, ApiError> {
    let e0 = zone.energy_j().map_err(cpu_error)?;
    if let Some(w) = zone.observed_power_w() {
        return Ok(w);
    }
    let t0 = Instant::now();
    tokio::time::sleep(gap).await;
    let e1 = zone.energy_j().map_err(cpu_error)?;
    Ok((e1 - e0).max(0.0) / t0.elapsed().as_secs_f64())
}

async fn get_power(State(app): State<Shared>, params: Params) -> Response {
    let r = async {
        let ids = chosen(&app, &params)?;
        let cpus = app.cpus.cpus()?;
        let mut out = Map::new();
        for i in ids {
            let p = cpus.package(i).map_err(cpu_error)?;
            let gap = Duration::from_millis(50);
            let cpu = zone_power_w(&p.package, gap).await?;
            let dram = match &p.dram {
                Some(z) => Some(zone_power_w(z, gap).await?),
                None => None,
            };
            out.insert(
                i.to_string(),
                json!({
                    "cpu_mw": (cpu * 1000.0).round() as u64,
                    "dram_mw": dram.map(|w| (w * 1000.0).round() as u64),
                }),
            );
        }
        Ok::<_, ApiError>(Json(json!({"timestamp_ms": now_ms(), "power_mw": out})))
    }
    .await;
    r.into_response()
}
