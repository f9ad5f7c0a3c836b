//! Bearer tokens: `zeusd token issue` round trip, 401/403, whoami, and that no refused request
//! changes the GPU.

mod common;

use std::process::Command;

use common::{daemon, Daemon};

fn limit_unchanged_after(d: &Daemon, token: Option<&str>, want: u16) {
    let admin = d.token("admin", "gpu-read", "1h");
    let before = d.power_limit(0, Some(&admin));
    for path in [
        "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=150000",
        "/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=900&max_clock_mhz=1000",
        "/gpu/reset_locked_clocks?gpu_ids=0",
    ] {
        let (st, body) = d.req("POST", path, token);
        assert_eq!(st, want, "{path}: {body}");
        assert!(body.contains("error"), "{body}");
    }
    assert_eq!(d.power_limit(0, Some(&admin)), before);
}

#[test]
fn token_round_trip_and_whoami() {
    let d = daemon().auth().start();
    let t = d.token("alice", "gpu-read,cpu-read", "7d");
    assert_eq!(t.split('.').count(), 3);
    let (st, body) = d.req("GET", "/auth/whoami", Some(&t));
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["sub"], "alice");
    assert_eq!(v["scopes"], serde_json::json!(["gpu-read", "cpu-read"]));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let exp = v["exp"].as_u64().unwrap();
    assert!(
        exp > now + 6 * 86_400 && exp <= now + 7 * 86_400 + 5,
        "{exp}"
    );
    let never = d.token("bob", "gpu-read", "never");
    let (_, body) = d.req("GET", "/auth/whoami", Some(&never));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v.get("exp").is_none(), "{v}");
    // Reads work with the right scope; discover and time need no token.
    assert_eq!(d.req("GET", "/gpu/get_power", Some(&t)).0, 200);
    assert_eq!(
        d.req(
            "GET",
            "/cpu/get_cumulative_energy?cpu=true&dram=false",
            Some(&t)
        )
        .0,
        200
    );
    let (st, body) = d.req("GET", "/discover", None);
    assert_eq!(st, 200);
    assert!(body.contains(r#""auth_required":true"#), "{body}");
    assert_eq!(d.req("GET", "/time", None).0, 200);
    assert_eq!(d.req("GET", "/auth/whoami", None).0, 401);
}

#[test]
fn missing_malformed_and_forged_tokens_get_401() {
    let d = daemon().auth().start();
    limit_unchanged_after(&d, None, 401);
    limit_unchanged_after(&d, Some("not-a-token"), 401);
    // Signed with another key.
    let other = d.dir.path().join("other-key");
    std::fs::write(&other, "some other key, also long enough").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_zeusd"))
        .args(["token", "issue", "--signing-key-path"])
        .arg(&other)
        .args(["--user", "mallory", "--scope", "gpu-control"])
        .output()
        .unwrap();
    let forged = String::from_utf8(out.stdout).unwrap().trim().to_string();
    limit_unchanged_after(&d, Some(&forged), 401);
    // A good token with its signature's last character changed.
    let good = d.token("alice", "gpu-control", "1h");
    let mut bad = good.clone();
    let last = bad.pop().unwrap();
    bad.push(if last == 'A' { 'B' } else { 'A' });
    limit_unchanged_after(&d, Some(&bad), 401);
    let (st, _) = d.req("GET", "/gpu/get_power", Some(&bad));
    assert_eq!(st, 401);
}

#[test]
fn expired_token_gets_401() {
    let d = daemon().auth().start();
    let t = d.token("alice", "gpu-control,gpu-read", "1s");
    std::thread::sleep(std::time::Duration::from_millis(2100));
    limit_unchanged_after(&d, Some(&t), 401);
    let (st, body) = d.req("GET", "/auth/whoami", Some(&t));
    assert_eq!(st, 401);
    assert!(body.contains("expired"), "{body}");
}

#[test]
fn wrong_scope_gets_403() {
    let d = daemon().auth().start();
    let reader = d.token("carol", "gpu-read", "1h");
    limit_unchanged_after(&d, Some(&reader), 403);
    let (st, body) = d.req("GET", "/cpu/get_power", Some(&reader));
    assert_eq!(st, 403);
    assert!(body.contains("cpu-read"), "{body}");
    // The refusals are in the write log with the subject.
    let log = d.stderr();
    assert!(
        log.lines()
            .any(|l| l.contains("sub=carol") && l.contains("-> 403 ")),
        "{log}"
    );
}

#[test]
fn token_issue_rejects_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, common::KEY).unwrap();
    for args in [
        vec!["--user", "u", "--scope", "gpu-write"],
        vec!["--user", "u", "--scope", "gpu-read", "--expires", "1y"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_zeusd"))
            .args(["token", "issue", "--signing-key-path"])
            .arg(&key)
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty());
    }
    std::fs::write(&key, "short").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_zeusd"))
        .args(["token", "issue", "--signing-key-path"])
        .arg(&key)
        .args(["--user", "u", "--scope", "gpu-read"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16"));
}
