//! Generated malformed writes: every one answers 400 naming a parameter and none changes the
//! GPU.

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// A value that is not a whole number that fits u32.
fn bad_number() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z.+-]{0,6}",
        "-[0-9]{1,6}",
        "[0-9]{1,4}\\.[0-9]{1,3}",
        (4_294_967_296u64..u64::MAX).prop_map(|n| n.to_string()),
    ]
}

/// A `gpu_ids` that names no valid, distinct GPU list (two GPUs are served).
fn bad_ids() -> impl Strategy<Value = String> {
    prop_oneof![
        (2u32..1000).prop_map(|n| n.to_string()),
        Just("0,0".to_string()),
        Just("0,".to_string()),
        Just(String::new()),
        "[a-z]{1,3}",
        (0u32..2, 2u32..50).prop_map(|(a, b)| format!("{a},{b}")),
    ]
}

fn not_bool(v: &str) -> bool {
    !["true", "false"].contains(&v)
}

/// (path, query, the parameter the 400 must name).
fn bad_write() -> impl Strategy<Value = (String, String, &'static str)> {
    let pl = "/gpu/set_power_limit";
    let gc = "/gpu/set_gpu_locked_clocks";
    prop_oneof![
        bad_number().prop_map(move |v| (
            pl.to_string(),
            format!("gpu_ids=0&power_limit_mw={v}"),
            "power_limit_mw"
        )),
        bad_ids().prop_map(move |v| (
            pl.to_string(),
            format!("gpu_ids={v}&power_limit_mw=150000"),
            "gpu_ids"
        )),
        Just((
            pl.to_string(),
            "power_limit_mw=150000".to_string(),
            "gpu_ids"
        )),
        Just((pl.to_string(), "gpu_ids=0".to_string(), "power_limit_mw")),
        Just((
            pl.to_string(),
            "gpu_ids=0&power_limit_mw=150000&power_limit_mw=160000".to_string(),
            "power_limit_mw"
        )),
        "[a-z]{1,5}"
            .prop_filter("not a bool", |v| not_bool(v))
            .prop_map(move |v| (
                pl.to_string(),
                format!("gpu_ids=0&power_limit_mw=150000&block={v}"),
                "block"
            )),
        bad_number().prop_map(move |v| (
            gc.to_string(),
            format!("gpu_ids=0&min_clock_mhz={v}&max_clock_mhz=1000"),
            "min_clock_mhz"
        )),
        (1001u32..5000).prop_map(move |lo| (
            gc.to_string(),
            format!("gpu_ids=0,1&min_clock_mhz={lo}&max_clock_mhz=1000"),
            "min_clock_mhz"
        )),
        bad_ids().prop_map(|v| (
            "/gpu/set_persistence_mode".to_string(),
            format!("gpu_ids={v}&enabled=true"),
            "gpu_ids"
        )),
        "[a-z2-9]{0,4}"
            .prop_filter("not a bool", |v| not_bool(v))
            .prop_map(|v| (
                "/gpu/set_persistence_mode".to_string(),
                format!("gpu_ids=0&enabled={v}"),
                "enabled"
            )),
    ]
}

#[test]
fn malformed_writes_never_change_the_gpu() {
    let d = common::daemon().start();
    let before = (d.power_limit(0, None), d.power_limit(1, None));
    let mut runner = TestRunner::new(Config::with_cases(96));
    runner
        .run(&bad_write(), |(path, query, param)| {
            let (st, v) = d.post(&format!("{path}?{query}"));
            prop_assert_eq!(st, 400, "{}?{}: {}", path, query, v);
            let msg = v["error"].as_str().unwrap_or_default();
            prop_assert!(msg.starts_with(param), "{}?{}: {}", path, query, v);
            prop_assert_eq!(
                (d.power_limit(0, None), d.power_limit(1, None)),
                before,
                "{}?{}",
                path,
                query
            );
            Ok(())
        })
        .unwrap();
    let (_, v) = d.get("/gpu/get_persistence_mode");
    assert_eq!(v["0"]["enabled"], false);
    assert_eq!(v["1"]["enabled"], false);
}

/// A write whose chunked body turns out invalid is refused before it acts (it used to set the
/// limit, then fail on the body).
#[test]
fn a_write_with_an_invalid_chunked_body_is_refused_and_changes_nothing() {
    use std::io::{Read, Write};
    let d = common::daemon().start();
    let before = d.power_limit(0, None);
    let mut s = d.connect().unwrap();
    write!(
        s,
        "POST /gpu/set_power_limit?gpu_ids=0&power_limit_mw=150000 HTTP/1.1\r\nHost: zeusd\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nnot a chunk\r\n0\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert_ne!(before, 150_000);
    assert_eq!(d.power_limit(0, None), before, "{raw}");
    // A valid chunked body (empty) still writes.
    let mut s = d.connect().unwrap();
    write!(
        s,
        "POST /gpu/set_power_limit?gpu_ids=0&power_limit_mw=150000 HTTP/1.1\r\nHost: zeusd\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert_eq!(d.power_limit(0, None), 150_000);
}
