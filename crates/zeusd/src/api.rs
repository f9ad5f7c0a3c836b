//! The API's shared vocabulary: groups, error answers, query parameters, the status of a
//! device error and the GPU writes. A leaf: it names no other module of the daemon.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use zeus_core::device::settings::Kind;
use zeus_core::device::GpuError;

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

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The status a device error answers with.
pub fn gpu_status(e: &GpuError) -> StatusCode {
    match e {
        GpuError::NoPermission(_) => StatusCode::FORBIDDEN,
        GpuError::InvalidArg(_) | GpuError::NotSupported(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// One write, applied to each GPU of `gpu_ids`.
#[derive(Clone, Copy, Debug)]
pub enum Write {
    PowerLimit(u32),
    Persistence(bool),
    LockGpu(u32, u32),
    LockMem(u32, u32),
    ResetGpu,
    ResetMem,
    ResetBoth,
    /// Give back the caller's hold of a setting (our extension): the daemon puts it back to
    /// its original unless another live client holds it too. Not held: nothing to do.
    Release(Kind),
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
