//! The gate in front of every group: checks the bearer token ([`crate::token`]) and the
//! group's scope before the handler runs, renews a TCP client's lease, and logs a refused
//! write like an answered one.

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::{now_ms, ApiError, Group};
use crate::peer::{log_write, Peer};
use crate::state::Shared;
use crate::token::{Identity, TokenError};

fn now_s() -> u64 {
    now_ms() / 1000
}

fn bearer(req: &Request) -> Result<&str, TokenError> {
    let v = req
        .headers()
        .get(header::AUTHORIZATION)
        .ok_or(TokenError::Missing)?;
    let v = v
        .to_str()
        .map_err(|_| TokenError::Malformed("Authorization is not ASCII"))?;
    let (scheme, token) = v.split_once(' ').ok_or(TokenError::Malformed(
        "expected Authorization: Bearer <token>",
    ))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(TokenError::Malformed(
            "expected Authorization: Bearer <token>",
        ));
    }
    Ok(token.trim())
}

/// Route layer of every group (and of `/auth/*` with `group == None`): checks the token and
/// the group's scope before the handler runs, and leaves an [`Identity`] for it. A refused
/// write is logged like an answered one.
pub async fn gate(
    State((app, group)): State<(Shared, Option<Group>)>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(signer) = &app.signer else {
        renew_lease(&app, &req, None);
        req.extensions_mut().insert(Identity(None));
        return next.run(req).await;
    };
    let verdict = bearer(&req)
        .and_then(|t| signer.verify(t, now_s()))
        .map_err(|e| (StatusCode::UNAUTHORIZED, e.to_string(), None))
        .and_then(|c| match group {
            Some(g) if !c.scopes.iter().any(|s| s == g.name()) => Err((
                StatusCode::FORBIDDEN,
                format!("token of {:?} lacks scope {}", c.sub, g.name()),
                Some(c.sub),
            )),
            _ => Ok(c),
        });
    match verdict {
        Ok(claims) => {
            renew_lease(&app, &req, Some(&claims.sub));
            req.extensions_mut().insert(Identity(Some(claims)));
            next.run(req).await
        }
        Err((status, msg, sub)) => {
            if group == Some(Group::GpuControl) {
                let peer = req
                    .extensions()
                    .get::<ConnectInfo<Peer>>()
                    .map(|c| c.0.clone())
                    .unwrap_or(Peer::Unknown);
                let target = req.uri().to_string();
                log_write(
                    &peer,
                    sub.as_deref(),
                    &target,
                    &format!("{} {msg}", status.as_u16()),
                );
            }
            let mut resp = ApiError::new(status, msg).into_response();
            if status == StatusCode::UNAUTHORIZED {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            resp
        }
    }
}

/// Any authorized request of a client without a pid renews its lease (see `owners`).
fn renew_lease(app: &Shared, req: &Request, subject: Option<&str>) {
    let peer = req
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|c| c.0.clone())
        .unwrap_or(Peer::Unknown);
    if peer.pid().is_none() {
        let client = crate::peer::client_header(req.headers());
        app.clients
            .renew(&crate::owners::lease_key(&peer, subject, client.as_deref()));
    }
}
