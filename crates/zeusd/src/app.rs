//! Shared state, API groups, errors, query parameters and the router.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, MethodRouter};
use axum::{Extension, Json, Router};
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use zeus_core::device::Gpus;

use crate::auth::{self, Identity, Signer};
use crate::cpu::CpuState;
use crate::owners::Clients;

/// An API group: a set of paths switched on or off together, and a token scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    GpuControl,
    GpuRead,
    CpuRead,
}

impl Group {
    pub const ALL: [Group; 3] = [Group::GpuControl, Group::GpuRead, Group::CpuRead];

    pub fn name(self) -> &'static str {
        match self {
            Group::GpuControl => "gpu-control",
            Group::GpuRead => "gpu-read",
            Group::CpuRead => "cpu-read",
        }
    }

    pub fn from_name(s: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == s)
    }
}

/// What every handler shares.
pub struct App {
    pub gpus: Gpus,
    /// The sampler's cache of the GPUs with an energy counter (gpu-read enabled).
    pub energy: Option<EnergyCache>,
    /// Who holds which setting; every power-limit and clock write goes through it.
    pub clients: Clients,
    pub cpus: CpuState,
    pub enabled: Vec<Group>,
    /// `Some` when auth is on.
    pub signer: Option<Signer>,
    pub gpu_stream_period: std::time::Duration,
    pub cpu_stream_period: std::time::Duration,
    /// Becomes true at shutdown; streams end on it so graceful shutdown is not held up.
    pub stopping: watch::Receiver<bool>,
}

pub type Shared = Arc<App>;

/// GPUs leased from the process's energy sampler, and what each has served.
pub struct EnergyCache {
    lease: zeus_core::monitor::sampler::Lease,
    /// Daemon GPU index of each leased GPU, in lease order.
    indices: Vec<usize>,
    served: Vec<zeus_core::monitor::sampler::ServedEnergy>,
}

impl EnergyCache {
    pub fn new(lease: zeus_core::monitor::sampler::Lease, indices: Vec<usize>) -> EnergyCache {
        let served = indices
            .iter()
            .map(|_| zeus_core::monitor::sampler::ServedEnergy::new())
            .collect();
        EnergyCache {
            lease,
            indices,
            served,
        }
    }

    /// GPU `index`'s cumulative energy now (mJ) and how far it may be from the energy at this
    /// moment (mJ, a 95% bound), from the cache, if it has one yet and its model fits the board
    /// (else the caller reads the counter).
    pub fn energy_mj(&self, index: usize, now: f64) -> Option<(u64, u64)> {
        use zeus_core::monitor::sampler::Mode;
        let k = self.indices.iter().position(|&i| i == index)?;
        if !self.lease.is_current() || !self.lease.sampler_running() {
            return None;
        }
        let edge = self.lease.watched(k).with_track(|t| {
            (t.mode() == Mode::Cached && t.power_down_since().is_none())
                .then(|| t.edge(now))
                .flatten()
        })?;
        let (j, bound) = self.served[k].serve_bounded(&edge);
        Some(((j * 1000.0).round() as u64, (bound * 1000.0).ceil() as u64))
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// An error answer: `{"error": message}` with a status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// A malformed or missing query parameter: 400 naming it.
    pub fn param(name: &str, why: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, format!("{name}: {why}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.message}))).into_response()
    }
}

/// Per-device failures: `{"errors": {"<id>": message}, "classes": {"<id>": class}}` with the
/// worst status among them. `classes` names the exception the same failure raises in process
/// (`GpuError::class_name`, the one table), so a client behind the daemon raises it too.
#[derive(Debug, Default)]
pub struct DeviceErrors {
    pub status: Option<StatusCode>,
    pub errors: Map<String, Value>,
    pub classes: Map<String, Value>,
    /// Settings held by other clients (409), answered as `"conflicts"`.
    pub conflicts: Vec<Value>,
}

impl DeviceErrors {
    pub fn add(&mut self, id: usize, status: StatusCode, message: String, class: &str) {
        if self.status.is_none_or(|s| status.as_u16() > s.as_u16()) {
            self.status = Some(status);
        }
        self.errors.insert(id.to_string(), Value::String(message));
        self.classes
            .insert(id.to_string(), Value::String(class.to_string()));
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub fn into_response(self) -> Response {
        let status = self.status.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut body = json!({"errors": self.errors, "classes": self.classes});
        if !self.conflicts.is_empty() {
            body["conflicts"] = Value::Array(self.conflicts);
        }
        (status, Json(body)).into_response()
    }
}

/// The query string as name/value pairs; a name given twice is an error when it is read.
pub struct Params(pub Vec<(String, String)>);

impl Params {
    pub fn get(&self, name: &str) -> Result<Option<&str>, ApiError> {
        let mut found = self.0.iter().filter(|(k, _)| k == name);
        let first = found.next();
        if found.next().is_some() {
            return Err(ApiError::param(name, "given more than once"));
        }
        Ok(first.map(|(_, v)| v.as_str()))
    }

    pub fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.get(name)?
            .ok_or_else(|| ApiError::param(name, "missing"))
    }

    pub fn u32(&self, name: &str) -> Result<u32, ApiError> {
        let v = self.required(name)?;
        v.parse()
            .map_err(|_| ApiError::param(name, format!("expected a whole number, got {v:?}")))
    }

    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool, ApiError> {
        match self.get(name)? {
            None => Ok(default),
            Some(v) => parse_bool(v)
                .ok_or_else(|| ApiError::param(name, format!("expected true or false, got {v:?}"))),
        }
    }

    pub fn bool(&self, name: &str) -> Result<bool, ApiError> {
        let v = self.required(name)?;
        parse_bool(v)
            .ok_or_else(|| ApiError::param(name, format!("expected true or false, got {v:?}")))
    }

    /// Comma-separated device indices below `count`, distinct and at least one; all of
    /// `0..count` when absent and not `required`.
    pub fn ids(&self, name: &str, count: usize, required: bool) -> Result<Vec<usize>, ApiError> {
        let Some(s) = self.get(name)? else {
            if required {
                return Err(ApiError::param(name, "missing"));
            }
            return Ok((0..count).collect());
        };
        let mut out = Vec::new();
        for part in s.split(',') {
            let i: usize = part
                .trim()
                .parse()
                .map_err(|_| ApiError::param(name, format!("{part:?} is not a device index")))?;
            if i >= count {
                return Err(ApiError::param(
                    name,
                    format!("no device {i}: {count} are served"),
                ));
            }
            if out.contains(&i) {
                return Err(ApiError::param(name, format!("{i} appears twice")));
            }
            out.push(i);
        }
        Ok(out)
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    }
}

/// The query string as [`Params`]; a query that does not decode is a 400.
impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Params, ApiError> {
        match Query::<Vec<(String, String)>>::try_from_uri(&parts.uri) {
            Ok(Query(v)) => Ok(Params(v)),
            Err(e) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("query string: {}", e.body_text()),
            )),
        }
    }
}

/// The paths of one group.
fn group_routes(group: Group) -> Vec<(&'static str, MethodRouter<Shared>)> {
    match group {
        Group::GpuControl => crate::gpu::control_routes(),
        Group::GpuRead => crate::gpu::read_routes(),
        Group::CpuRead => crate::cpu::routes(),
    }
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
