//! The router: every enabled group's paths behind the token check, disabled ones answering
//! 404, the whole-body guard, and the paths of no group (`/discover`, `/time`,
//! `/auth/whoami`).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, MethodRouter};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use crate::api::{now_ms, ApiError, Group};
use crate::auth;
use crate::state::{CpuState, Shared};
use crate::token::Identity;

/// The paths of one group.
fn group_routes(group: Group) -> Vec<(&'static str, MethodRouter<Shared>)> {
    let mut routes = match group {
        Group::GpuControl => crate::gpu::control_routes(),
        Group::GpuRead => crate::gpu::read_routes(),
        Group::CpuRead => crate::cpu::routes(),
    };
    routes.extend(crate::stream::routes(group));
    routes
}

/// The whole API: enabled groups behind the token check, disabled ones answering 404.
pub fn router(app: Shared) -> Router {
    let mut r: Router<Shared> = Router::new()
        .route("/discover", get(discover))
        .route("/time", get(time));
    for group in Group::ALL {
        let mut sub: Router<Shared> = Router::new();
        if app.enabled.contains(&group) {
            for (path, method) in group_routes(group) {
                sub = sub.route(path, method);
            }
            sub = sub.route_layer(from_fn_with_state((app.clone(), Some(group)), auth::gate));
        } else {
            let msg = format!("API group {} is disabled on this daemon", group.name());
            for (path, _) in group_routes(group) {
                let msg = msg.clone();
                sub = sub.route(
                    path,
                    any(move || async move { ApiError::new(StatusCode::NOT_FOUND, msg) }),
                );
            }
        }
        r = r.merge(sub);
    }
    if app.signer.is_some() {
        r = r.merge(
            Router::new()
                .route("/auth/whoami", get(whoami))
                .route_layer(from_fn_with_state((app.clone(), None), auth::gate)),
        );
    }
    r.fallback(not_found)
        .layer(from_fn(whole_body))
        .with_state(app)
}

/// The most a request body may hold: the API takes its parameters in the query string.
const MAX_BODY: usize = 64 * 1024;

/// Read the whole body before anything acts on the request: a body that turns out malformed
/// (an invalid chunk, a connection cut short) or too large is answered 400 or 413, and the
/// request does nothing (a write whose body is never read would otherwise be made first).
async fn whole_body(req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over {MAX_BODY} bytes (the API takes no body)"),
        )
        .into_response();
    }
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => {
            ApiError::new(StatusCode::BAD_REQUEST, format!("request body: {e}")).into_response()
        }
    }
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    let why = if uri.path().starts_with("/auth/") {
        "auth is off on this daemon (no --signing-key-path)".to_string()
    } else {
        format!("no such path: {}", uri.path())
    };
    ApiError::new(StatusCode::NOT_FOUND, why)
}

async fn discover(State(app): State<Shared>) -> Json<Value> {
    let gpus: Vec<Value> = (0..app.gpus.len())
        .map(|i| {
            let dev = app.gpus.device(i).ok();
            json!({
                "id": i,
                "name": dev.and_then(|d| d.name().ok()).unwrap_or_default(),
                "pci_address": dev.and_then(|d| d.pci_bus_id().ok()),
                "cumulative_energy_available":
                    dev.and_then(|d| d.supports_total_energy_consumption().ok()).unwrap_or(false),
            })
        })
        .collect();
    let cpus: Vec<Value> = match &app.cpus {
        CpuState::Ready { cpus, .. } if app.enabled.contains(&Group::CpuRead) => cpus
            .packages()
            .iter()
            .enumerate()
            .map(|(i, p)| json!({"id": i, "dram_available": p.dram.is_some()}))
            .collect(),
        _ => Vec::new(),
    };
    let groups: Vec<&str> = app.enabled.iter().map(|g| g.name()).collect();
    Json(json!({
        "gpus": gpus,
        "cpus": cpus,
        "enabled_api_groups": groups,
        "auth_required": app.signer.is_some(),
    }))
}

async fn time() -> Json<Value> {
    Json(json!({"timestamp_ms": now_ms()}))
}

async fn whoami(Extension(id): Extension<Identity>) -> Response {
    match id.0 {
        Some(c) => Json(c.to_json()).into_response(),
        None => ApiError::new(StatusCode::UNAUTHORIZED, "no token").into_response(),
    }
}
