//! The sampler on the simulated GPU's virtual clock.

use super::*;
use crate::device::sim::{preset, Load, SimCluster, SimConfig, SimGpu};
use proptest::prelude::*;

fn h100(n: usize) -> SimCluster {
    SimCluster::new(SimConfig {
        presets: vec![preset::find("H100").unwrap(); n],
        virtual_clock: true,
        ..SimConfig::default()
    })
}

/// Run the sampler's schedule on the virtual clock up to `until`.
fn drive(c: &SimCluster, watched: &[Watched], until: f64) {
    let clock = c.clock();
    loop {
        let next = watched
            .iter()
            .map(|w| w.next_due())
            .fold(f64::INFINITY, f64::min);
        let now = clock.now();
        if next > until {
            clock.advance(until - now);
            return;
        }
        clock.advance(next - now);
        for w in watched {
            if w.next_due() <= clock.now() {
                w.run_due(&*clock, watched.len());
            }
        }
    }
}

fn watch(c: &SimCluster) -> Vec<Watched> {
    let now = c.clock().now();
    c.devices()
        .iter()
        .map(|d| {
            // The NVML backend does not know the period: let the track measure it.
            let w = Watched::new(d.clone() as Arc<dyn Gpu>, now);
            w.with_track(|t| t.forget_period());
            w.hold(Interest::Energy, now);
            w
        })
        .collect()
}

#[test]
fn learns_the_period_and_anchors_at_ticks() {
    let c = h100(1);
    let w = watch(&c);
    c.devices()[0].set_load(Load::Busy);
    let t0 = c.clock().now();
    drive(&c, &w, t0 + 2.0);
    w[0].with_track(|t| {
        assert!(t.is_locked());
        assert!((t.period() - 0.1).abs() < 1e-3, "{}", t.period());
        let n = t.anchors().len();
        assert!((17..=21).contains(&n), "{n} anchors in 2 s");
        // Each anchor is the counter's value at its tick: compare with the truth there.
        let dev: &SimGpu = &c.devices()[0];
        let a = t.anchors()[n - 1];
        let now = c.clock().now();
        let truth_then = dev.true_energy_j() - dev.busy_steady_state().1 * (now - a.t);
        assert!(
            (a.joules - truth_then).abs() < 0.8,
            "{} vs {truth_then}",
            a.joules
        );
    });
}

#[test]
fn a_tight_loop_of_windows_keeps_two_edges_per_tick_interval() {
    let mut t = Track::new(0.0, Some(0.1));
    t.on_power(0.0, 100_000, None); // the first reading: no tick yet
    assert!(t.ticks().is_empty());
    t.on_power(0.05, 150_000, None); // a change: a tick
    for k in 0..10_000 {
        t.add_hint(0.06 + k as f64 * 1e-6);
    }
    assert_eq!(t.hints().len(), 2);
    assert_eq!(t.hints()[1], 0.06 + 9_999.0 * 1e-6);
    t.on_power(0.15, 200_000, None);
    t.add_hint(0.16);
    assert_eq!(t.hints().len(), 3);
}

#[test]
fn temperature_only_users_get_samples_on_their_grid_and_no_power_polling() {
    let c = h100(1);
    let now = c.clock().now();
    let w = Watched::new(c.devices()[0].clone() as Arc<dyn Gpu>, now);
    w.hold(
        Interest::Temperature {
            period: 0.25,
            capacity: 6,
        },
        now,
    );
    c.devices()[0].set_load(Load::Busy);
    let watched = [w];
    drive(&c, &watched, now + 2.0);
    let w = &watched[0];
    let all = w.temperatures(f64::NEG_INFINITY, f64::INFINITY);
    assert_eq!(all.len(), 6, "kept to the capacity: {all:?}");
    assert!(all
        .windows(2)
        .all(|p| (p[1].0 - p[0].0 - 0.25).abs() < 1e-6));
    assert!(all.iter().all(|&(_, c)| c > 60.0), "busy H100: {all:?}");
    assert!(w.with_track(|t| t.ticks().is_empty()), "no power polling");
    assert_eq!(
        w.temperature_at(Some(now + 0.3)),
        None,
        "dropped by capacity"
    );
    assert_eq!(w.temperature_at(None), all.last().copied());
    assert!(!w.release(Interest::Temperature {
        period: 0.5,
        capacity: 6
    }));
    assert!(w.release(Interest::Temperature {
        period: 0.25,
        capacity: 6
    }));
}

/// One window: (idle gap before it s, length s, power limit W).
type Window = (f64, f64, u32);

/// Run windows with the load stepping at their edges; return, per window, the true energy,
/// the estimate made at its end (begin edge re-evaluated then, end edge extrapolated) and
/// the settled estimate (both edges interpolated between anchors).
fn run_windows(windows: &[Window]) -> Vec<(f64, f64, f64, f64)> {
    let c = h100(1);
    let dev = c.devices()[0].clone();
    let w = watch(&c);
    let start = c.clock().now();
    drive(&c, &w, start + 1.0);
    let mut spans = Vec::new();
    for &(gap, len, pl) in windows {
        let t = c.clock().now();
        drive(&c, &w, t + gap);
        dev.set_power_management_limit(pl * 1000).unwrap();
        let b = c.clock().now();
        if std::env::var("DEBUG_EDGES").is_ok() {
            w[0].with_track(|t| {
                eprintln!(
                    "sched {:?} period {} locked {} anchors {}",
                    t.schedule(),
                    t.period(),
                    t.is_locked(),
                    t.anchors().len()
                )
            });
        }
        let e_b = dev.true_energy_j();
        w[0].with_track(|t| t.add_hint(b));
        dev.set_load(Load::Busy);
        drive(&c, &w, b + len);
        let e = c.clock().now();
        let e_e = dev.true_energy_j();
        w[0].with_track(|t| t.add_hint(e));
        dev.set_load(Load::Idle);
        let at_end = w[0].with_track(|t| t.energy_at(e).unwrap() - t.energy_at(b).unwrap());
        spans.push((b, e, e_e - e_b, at_end));
    }
    let t = c.clock().now();
    drive(&c, &w, t + 0.5);
    // Diagnostics: `DEBUG_DUMP=1` prints the windows, edges, ticks and anchors.
    if std::env::var("DEBUG_DUMP").is_ok() {
        let t0 = spans.first().map_or(0.0, |s| s.0);
        w[0].with_track(|t| {
            eprintln!("sched {:?}", t.schedule());
            for &(b, e, tr, _) in &spans {
                eprintln!(
                    "win {:.4}..{:.4} truth {tr:.2} est {:.2}",
                    b - t0,
                    e - t0,
                    t.energy_at(e).unwrap() - t.energy_at(b).unwrap()
                );
            }
            for h in t.hints() {
                if *h >= t0 {
                    eprintln!("hint {:.4}", h - t0);
                }
            }
            for k in t.ticks() {
                if k.t >= t0 - 0.2 {
                    eprintln!(
                        "tick {:.4} {:.1}W seen={} err={:.4}",
                        k.t - t0,
                        k.watts,
                        k.seen,
                        k.t_err
                    );
                }
            }
            let mut prev: Option<crate::monitor::sampler::Anchor> = None;
            for a in t.anchors() {
                if a.t >= t0 - 0.2 {
                    eprintln!(
                        "anchor {:.4} {:.2} err={:.4} mean_since_prev={:.1}",
                        a.t - t0,
                        a.joules,
                        a.t_err,
                        prev.map_or(0.0, |p| (a.joules - p.joules) / (a.t - p.t))
                    );
                }
                prev = Some(*a);
            }
        });
    }
    spans
        .into_iter()
        .map(|(b, e, truth, at_end)| {
            let settled = w[0].with_track(|t| {
                assert!(t.is_settled(e));
                t.energy_at(e).unwrap() - t.energy_at(b).unwrap()
            });
            (e - b, truth, at_end, settled)
        })
        .collect()
}

#[test]
fn a_short_busy_window_between_idle_stretches() {
    for (len, gap) in [(0.2, 0.3), (0.25, 0.05), (0.33, 0.0), (1.0, 0.42)] {
        let r = run_windows(&[(gap, len, 700), (0.01, len, 700)]);
        for (span, truth, at_end, settled) in r {
            let err = |x: f64| (x - truth).abs() / truth;
            assert!(err(at_end) < 0.03, "{span} s: {at_end} vs {truth}");
            assert!(err(settled) < 0.03, "{span} s: {settled} vs {truth}");
        }
    }
}

/// Windows whose gaps are shorter than an update period (two edges in one interval of the
/// power readings, the gap's level seen by no reading) must not turn the edge steps off: found
/// by the proptest below, whose settled 0.2 s windows came out 4-9% low once the shapes'
/// scoring had counted the step shape's guess of such a gap (the readings' mean, for an idle
/// gap between busy windows) as the step shape's miss.
#[test]
fn gaps_shorter_than_an_update_keep_the_edge_steps() {
    let windows = [
        (0.541, 0.2, 700),
        (0.314, 2.110, 250),
        (0.033, 1.959, 450),
        (0.046, 0.2, 700),
        (0.0, 0.2, 700),
    ];
    for (span, truth, at_end, settled) in run_windows(&windows) {
        let rule = if span >= 1.0 { 0.01 } else { 0.03 };
        let err = |x: f64| (x - truth).abs() / truth;
        assert!(
            err(at_end) < rule,
            "{span} s at its end: {at_end} vs {truth}"
        );
        assert!(
            err(settled) < rule,
            "{span} s settled: {settled} vs {truth}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// Windows of 0.2-3 s with the load stepping at their edges, random idle gaps and power
    /// limits: within 3% below 1 s and 1% from 1 s, at the window's end and settled.
    #[test]
    fn window_energy_from_the_cache_is_accurate(
        windows in proptest::collection::vec(
            (0.0f64..0.6, 0.2f64..3.0, prop_oneof![Just(700u32), Just(450), Just(250)]),
            1..6,
        )
    ) {
        for (span, truth, at_end, settled) in run_windows(&windows) {
            let bound = if span >= 1.0 { 0.01 } else { 0.03 };
            let err = |x: f64| (x - truth).abs() / truth;
            prop_assert!(err(at_end) < bound, "{} s: at end {} vs {}", span, at_end, truth);
            prop_assert!(err(settled) < bound, "{} s: settled {} vs {}", span, settled, truth);
        }
    }
}

// ---- boards other than the measured H100 ----------------------------------------------------

use crate::device::sim::BoardKnobs;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

/// A simulated board's timing, as the harness draws it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BoardSpec {
    pub power_ms: f64,
    pub counter_ms: f64,
    pub lag_ms: f64,
    pub noise: f64,
    pub instant: bool,
    /// Window of the average power readings (0: the instantaneous sample).
    pub average_ms: f64,
    pub resolution_mj: u64,
}

impl BoardSpec {
    pub fn h100() -> BoardSpec {
        BoardSpec {
            power_ms: 100.0,
            counter_ms: 100.0,
            lag_ms: 15.0,
            noise: 0.01,
            instant: true,
            average_ms: 1000.0,
            resolution_mj: 1,
        }
    }

    /// A random board: update periods 10-200 ms, the counter on the power grid or on one of
    /// its own, lags 0-80 ms, noise 0-5%, with or without instant power.
    pub fn random(rng: &mut Pcg64) -> BoardSpec {
        let power_ms = rng.random_range(10.0..200.0f64).round();
        let counter_ms = if rng.random_bool(0.5) {
            power_ms
        } else {
            let ratios = [0.5, 2.0, 0.2, 1.5, 0.25];
            (power_ms * ratios[rng.random_range(0..ratios.len())]).clamp(5.0, 400.0)
        };
        // Boards without instant power: most return the instantaneous sample as their
        // "average" (NVML: GA100 and older); some only a 1 s trailing average.
        let kind = rng.random_range(0.0..1.0f64);
        BoardSpec {
            power_ms,
            counter_ms,
            lag_ms: rng.random_range(0.0..80.0f64).round(),
            noise: rng.random_range(0.0..0.05),
            instant: kind < 0.6,
            average_ms: if (0.6..0.85).contains(&kind) {
                0.0
            } else {
                1000.0
            },
            resolution_mj: 1,
        }
    }
}

/// One GPU of `spec` on the virtual clock, watched as the sampler watches it, with driver
/// calls that take the time they take and (with `starve`) a sampler thread that runs late.
pub(crate) struct Harness {
    pub c: SimCluster,
    pub dev: Arc<SimGpu>,
    pub w: Vec<Watched>,
    rng: Pcg64,
    starve: bool,
}

impl Harness {
    pub fn new(spec: BoardSpec, seed: u64, starve: bool) -> Harness {
        let board = BoardKnobs {
            power_period_s: Some(spec.power_ms / 1000.0),
            counter_period_s: Some(spec.counter_ms / 1000.0),
            counter_lag_s: Some(spec.lag_ms / 1000.0),
            power_noise: Some(spec.noise),
            instant_power: Some(spec.instant),
            average_window_s: Some(spec.average_ms / 1000.0),
            counter_resolution_mj: Some(spec.resolution_mj),
            ..BoardKnobs::default()
        };
        Harness::of("H100", board, seed, starve)
    }

    /// One simulated AMD board (`key`: MI300X, MI210, ...) with `board`'s quirks, on the
    /// virtual clock.
    pub fn amd(key: &str, board: BoardKnobs, seed: u64) -> Harness {
        Harness::of(key, board, seed, false)
    }

    fn of(key: &str, board: BoardKnobs, seed: u64, starve: bool) -> Harness {
        let c = SimCluster::new(SimConfig {
            presets: vec![preset::find(key).unwrap()],
            virtual_clock: true,
            board,
            // Reproducible: the same phases, the same run, for the same seed.
            virtual_origin: Some(1_800_000_000.0 + seed as f64 * 0.0137),
            ..SimConfig::default()
        });
        let dev = c.devices()[0].clone();
        dev.set_virtual_call_time(true);
        let w = watch(&c);
        Harness {
            c,
            dev,
            w,
            rng: Pcg64::seed_from_u64(seed),
            starve,
        }
    }

    pub fn now(&self) -> f64 {
        self.c.clock().now()
    }

    /// Run the sampler up to `until`; a starved sampler wakes late (a few ms usually, now and
    /// then 50-150 ms, as a thread does beside busy loops on every core).
    pub fn run_until(&mut self, until: f64) {
        let clock = self.c.clock();
        loop {
            let next = self
                .w
                .iter()
                .map(|w| w.next_due())
                .fold(f64::INFINITY, f64::min);
            let late = if self.starve {
                if self.rng.random_bool(0.04) {
                    self.rng.random_range(0.05..0.15)
                } else {
                    self.rng.random_range(0.0..0.008)
                }
            } else {
                0.0
            };
            let now = clock.now();
            if next + late > until {
                if until > now {
                    clock.advance(until - now);
                }
                return;
            }
            if next + late > now {
                clock.advance(next + late - now);
            }
            for w in &self.w {
                if w.next_due() <= clock.now() {
                    w.run_due(&*clock, self.w.len());
                }
            }
        }
    }

    /// The counter read directly at this moment, J (no time passes).
    pub fn direct(&self) -> f64 {
        self.dev.set_virtual_call_time(false);
        let e = self.dev.total_energy_consumption().unwrap() as f64 / 1000.0;
        self.dev.set_virtual_call_time(true);
        e
    }
}

/// One measured window.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outcome {
    pub len: f64,
    pub truth: f64,
    /// What a monitor reports at the window's end: the cache's estimate, or in the safe modes
    /// the direct reads or the power integral.
    pub user: WindowEstimate,
    pub at_end: WindowEstimate,
    pub settled: WindowEstimate,
    pub direct: f64,
}

/// How the load moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum LoadPattern {
    /// Busy inside windows, idle between them (the load steps at the edges).
    EdgeSteps,
    /// Busy and idle in turns at exponential gaps (mean `0`, s), whatever the windows do.
    Random(f64),
}

/// Windows `(gap before, length)` on `h`, the load moving by `pattern`.
pub(super) fn measure(
    h: &mut Harness,
    windows: &[(f64, f64)],
    pattern: LoadPattern,
) -> Vec<Outcome> {
    let warmup: f64 = std::env::var("WARMUP").map_or(1.5, |v| v.parse().unwrap());
    h.run_until(h.now() + warmup);
    // Load toggles for the random pattern, far enough ahead.
    let total: f64 = windows.iter().map(|(g, l)| g + l).sum::<f64>() + 4.0;
    let mut toggles = VecDeque::new();
    if let LoadPattern::Random(mean) = pattern {
        let mut t = h.now();
        while t < h.now() + total + 1.0 {
            let u: f64 = h.rng.random_range(1e-9..1.0);
            t += -mean * u.ln();
            toggles.push_back(t);
        }
    }
    let mut busy = false;
    let mut advance_to = |h: &mut Harness, target: f64, toggles: &mut VecDeque<f64>| {
        while let Some(&t) = toggles.front() {
            if t > target {
                break;
            }
            toggles.pop_front();
            h.run_until(t);
            busy = !busy;
            h.dev.set_load(if busy { Load::Busy } else { Load::Idle });
        }
        h.run_until(target);
    };
    // A random load runs a while before the first window: it is the board's load, not the
    // windows' (the calibration has seen it, as it would have in a running job).
    if let LoadPattern::Random(_) = pattern {
        let t = h.now() + 3.0;
        advance_to(h, t, &mut toggles);
    }
    let mut open = Vec::new();
    let mut edge_truth = Vec::new();
    for &(gap, len) in windows {
        let t = h.now() + gap;
        advance_to(h, t, &mut toggles);
        let b = h.now();
        let (e_b, d_b) = (h.dev.true_energy_j(), h.direct());
        h.w[0].with_track(|t| t.add_hint(b));
        if pattern == LoadPattern::EdgeSteps {
            h.dev.set_load(Load::Busy);
        }
        advance_to(h, b + len, &mut toggles);
        let e = h.now();
        let (e_e, d_e) = (h.dev.true_energy_j(), h.direct());
        let at_end = h.w[0]
            .with_track(|t| t.window(b, e, true))
            .expect("an estimate");
        if std::env::var("DEBUG_EDGES").is_ok() {
            h.w[0].with_track(|t| {
                let last = t.anchors().back().copied();
                eprintln!(
                    "  b {b:.3} e {e:.3} edge0 {:?} edge1 {:?} last anchor {last:?} last tick {:?} tau {} steps {} guess {}",
                    t.edge(b),
                    t.edge(e),
                    t.ticks().back(),
                    t.tau,
                    t.steps(),
                    t.level_guess
                );
            });
        }
        let user = h.w[0].with_track(|t| match t.mode() {
            Mode::Cached => at_end,
            Mode::Direct => WindowEstimate {
                joules: d_e - d_b,
                bound: t.direct_bound((b, 0.0), (e, 0.0)),
                degraded: false,
            },
            Mode::Power => t.power_window(b, e).expect("power readings"),
        });
        if pattern == LoadPattern::EdgeSteps {
            h.dev.set_load(Load::Idle);
        }
        if std::env::var("DEBUG_MISS").is_ok() && ((e_e - e_b) - at_end.joules).abs() > at_end.bound
        {
            h.w[0].with_track(|t| {
                let (eb, ee) = (t.edge(b).unwrap(), t.edge(e).unwrap());
                eprintln!(
                    "MISS len {:.2}: begin err {:+.2} (sigma {:.2}, settled {}) end err {:+.2} (sigma {:.2}) bound {:.2} tau {:.3} steps {} lag_known {} mode {:?}",
                    e - b,
                    eb.joules - e_b, eb.sigma, eb.settled,
                    ee.joules - e_e, ee.sigma,
                    at_end.bound, t.tau, t.steps(), t.schedule().lag_known, t.mode()
                );
                if std::env::var("DEBUG_BEGIN").is_ok() {
                    let s = t.schedule();
                    eprintln!("   lag {:?} lag_err {:.4} grid {:?}", s.lag, s.lag_err, s.grid);
                    for a in t.anchors().iter().filter(|a| (a.t - b).abs() < 0.06) {
                        eprintln!(
                            "    anchor {:+.4} err {:+.2} t_err {:.4} read_at {:+.4}",
                            a.t - b,
                            a.joules - h.dev.true_energy_at(a.t),
                            a.t_err,
                            a.read_at - b
                        );
                    }
                    for k in t.ticks().iter().filter(|k| (k.t - b).abs() < 0.06) {
                        eprintln!("    tick {:+.4} {:?} true power {:.0}", k.t - b, k, (h.dev.true_energy_at(k.t) - h.dev.true_energy_at(k.t - 0.001)) / 0.001);
                    }
                }
            });
        }
        if std::env::var("DEBUG_LAG").is_ok() {
            h.w[0].with_track(|t| {
                let s = t.schedule();
                eprintln!(
                    "  lag {:.4} lagknown {} fitted {} lag_err {:.3} bound {:.4} avg {:?} {:?}",
                    s.lag,
                    s.lag_known,
                    s.fitted,
                    s.lag_err,
                    at_end.bound / (e_e - e_b),
                    t.averaging_window(),
                    h.dev.board()
                );
            });
        }
        if std::env::var("DEBUG_TRUTH").is_ok() {
            h.w[0].with_track(|t| {
                for a in t.anchors().iter().rev().take(4).rev() {
                    eprintln!(
                        "    anchor {:.4} J {:.2} truth {:.2} (e - {:.1} ms)",
                        a.t,
                        a.joules,
                        h.dev.true_energy_at(a.t),
                        (e - a.t) * 1000.0
                    );
                }
                eprintln!(
                    "  truth b {:.2} e {:.2} | est b {:.2} e {:.2}",
                    e_b,
                    e_e,
                    t.edge(b).unwrap().joules,
                    t.edge(e).unwrap().joules
                )
            });
        }
        edge_truth.push((b, e_b, e, e_e));
        open.push((b, e, e_e - e_b, at_end, d_e - d_b, user));
    }
    let end = h.now() + 1.0;
    advance_to(h, end, &mut toggles);
    if std::env::var("DEBUG_SETTLED").is_ok() {
        let offset = h.direct() - h.dev.true_energy_j();
        for &(b, e_b, e, e_e) in &edge_truth {
            h.w[0].with_track(|t| {
                for a in t.anchors().iter().filter(|a| (a.t - e).abs() < 0.3) {
                    eprintln!(
                        "    final anchor {:.4} J {:.2} read_at {:.4} vs truth there {:+.2}",
                        a.t,
                        a.joules - offset,
                        a.read_at,
                        a.joules - h.dev.true_energy_at(a.t)
                    );
                }
                eprintln!(
                    "  settled b {:.4} {:+.2} e {:.4} {:+.2} (truth {:.2})",
                    b,
                    t.edge(b).unwrap().joules - offset - e_b,
                    e,
                    t.edge(e).unwrap().joules - offset - e_e,
                    e_e
                )
            });
        }
    }
    open.into_iter()
        .map(|(b, e, truth, at_end, direct, user)| Outcome {
            len: e - b,
            truth,
            user,
            at_end,
            settled: h.w[0]
                .with_track(|t| t.window_estimate(b, e))
                .expect("settled"),
            direct,
        })
        .collect()
}

/// Summary of many outcomes: mean and median absolute relative errors, coverage of the
/// bound, and the median bound over the window energy.
#[derive(Debug, Default)]
#[allow(dead_code)] // n and max_err are read through Debug, in diagnostics
pub(super) struct Stats {
    pub n: usize,
    pub mae: f64,
    pub median_err: f64,
    pub covered: f64,
    pub median_bound: f64,
    pub max_err: f64,
}

pub(super) fn stats(v: &[(f64, f64, f64)]) -> Stats {
    // (truth, estimate, bound)
    if v.is_empty() {
        return Stats::default();
    }
    let mut errs: Vec<f64> = v.iter().map(|(t, e, _)| (e - t).abs() / t).collect();
    let mut bounds: Vec<f64> = v.iter().map(|(t, _, b)| b / t).collect();
    let covered = v.iter().filter(|(t, e, b)| (e - t).abs() <= *b).count() as f64 / v.len() as f64;
    let mae = errs.iter().sum::<f64>() / errs.len() as f64;
    errs.sort_by(f64::total_cmp);
    bounds.sort_by(f64::total_cmp);
    Stats {
        n: v.len(),
        mae,
        median_err: errs[errs.len() / 2],
        covered,
        median_bound: bounds[bounds.len() / 2],
        max_err: *errs.last().unwrap(),
    }
}

fn random_windows(rng: &mut Pcg64, n: usize, lo: f64, hi: f64) -> Vec<(f64, f64)> {
    (0..n)
        .map(|_| (rng.random_range(0.0..0.6), rng.random_range(lo..hi)))
        .collect()
}

/// Diagnostics: `cargo test -p zeus-core --lib survey -- --ignored --nocapture`.
#[test]
#[ignore]
fn survey() {
    let mut rng = Pcg64::seed_from_u64(7);
    let patterns = match std::env::var("PATTERN").as_deref() {
        Ok("edge") => vec![LoadPattern::EdgeSteps],
        Ok("random") => vec![LoadPattern::Random(0.08)],
        _ => vec![LoadPattern::EdgeSteps, LoadPattern::Random(0.08)],
    };
    let starves = match std::env::var("STARVE").as_deref() {
        Ok("1") => vec![true],
        Ok("0") => vec![false],
        _ => vec![false, true],
    };
    for pattern in patterns {
        for starve in starves.clone() {
            let mut at_end = Vec::new();
            let mut settled = Vec::new();
            let mut direct = Vec::new();
            let mut user = Vec::new();
            let mut lagging = Vec::new();
            for case in 0..40 {
                let spec = BoardSpec::random(&mut rng);
                let mut h = Harness::new(spec, case, starve);
                let windows = random_windows(&mut rng, 10, 0.2, 2.0);
                for o in measure(&mut h, &windows, pattern) {
                    at_end.push((o.truth, o.at_end.joules, o.at_end.bound));
                    settled.push((o.truth, o.settled.joules, o.settled.bound));
                    direct.push((o.truth, o.direct, 0.0));
                    if spec.instant || spec.average_ms == 0.0 {
                        user.push((o.truth, o.user.joules, o.user.bound));
                    } else {
                        lagging.push((o.truth, o.user.joules, o.user.bound));
                    }
                    let err = (o.user.joules - o.truth).abs();
                    let big = std::env::var("BIG").is_ok() && err > 0.05 * o.truth;
                    if (err > o.user.bound && std::env::var("MISSES").is_ok()) || big {
                        eprintln!(
                            "  miss {spec:?} len {:.2} truth {:.1} user {:.1} ±{:.1} at_end {:.1} ±{:.1} settled {:.1} ±{:.1} mode {:?} {}",
                            o.len, o.truth, o.user.joules, o.user.bound, o.at_end.joules, o.at_end.bound, o.settled.joules,
                            o.settled.bound, h.w[0].with_track(|t| t.mode()), h.w[0].with_track(|t| t.mode_reason().to_string())
                        );
                    }
                }
            }
            eprintln!("{pattern:?} starve={starve}");
            eprintln!("  user    {:?}", stats(&user));
            eprintln!("  lagging {:?}", stats(&lagging));
            eprintln!("  at_end  {:?}", stats(&at_end));
            eprintln!("  settled {:?}", stats(&settled));
            eprintln!("  direct  {:?}", stats(&direct));
        }
    }
}

/// Diagnostics for one board from the environment: `SPEC=power,counter,lag,noise,instant`.
#[test]
#[ignore]
fn diagnose() {
    let spec = std::env::var("SPEC").unwrap_or("100,100,15,0.01,1".into());
    let v: Vec<f64> = spec.split(',').map(|x| x.parse().unwrap()).collect();
    let spec = BoardSpec {
        power_ms: v[0],
        counter_ms: v[1],
        lag_ms: v[2],
        noise: v[3],
        instant: v[4] > 0.0,
        average_ms: v.get(5).copied().unwrap_or(1000.0),
        resolution_mj: 1,
    };
    let pattern = if std::env::var("RANDOM").is_ok() {
        LoadPattern::Random(0.08)
    } else {
        LoadPattern::EdgeSteps
    };
    let mut rng = Pcg64::seed_from_u64(3);
    let seed = std::env::var("SEED").map_or(1, |v| v.parse().unwrap());
    let mut h = Harness::new(spec, seed, std::env::var("STARVE").is_ok());
    let windows = match std::env::var("WINDOWS") {
        Ok(v) => v
            .split(';')
            .map(|w| {
                let (g, l) = w.split_once(',').unwrap();
                (g.parse().unwrap(), l.parse().unwrap())
            })
            .collect(),
        Err(_) => random_windows(
            &mut rng,
            std::env::var("N").map_or(12, |v| v.parse().unwrap()),
            0.2,
            2.0,
        ),
    };
    let out = measure(&mut h, &windows, pattern);
    h.w[0].with_track(|t| {
        eprintln!(
            "shift {:?} schedule {:?}\nresiduals {:?}\nperiod {} noise {:.4} averaged {:?} mode {:?} {}",
            t.shift_beyond_range(),
            t.schedule(),
            t.residual_scales(),
            t.period(),
            t.noise(),
            t.averaging_window(),
            t.mode(),
            t.mode_reason()
        );
    });
    let dev = &h.dev;
    eprintln!(
        "true: counter period {:?} lag {} phases {:?}",
        dev.board().counter_period_s,
        dev.board().counter_lag_s,
        dev.phases()
    );
    if std::env::var("DEBUG_GRID").is_ok() {
        h.w[0].with_track(|t| {
            let pairs = t.read_pairs();
            let calm: Vec<_> = pairs.iter().filter(|p| p.weight >= 0.5).collect();
            eprintln!("pairs {} calm {}", pairs.len(), calm.len());
            let p = dev.board().counter_period_s;
            let truth = (dev.phases().1 + dev.board().counter_lag_s).rem_euclid(p);
            for phase in [truth, t.schedule().grid.phase] {
                let g = fit::Grid {
                    period: p,
                    phase,
                    phase_err: 0.0,
                };
                let score: f64 = calm.iter().map(|q| fit::mismatch(q, &g, 0.004)).sum();
                eprintln!("phase {phase:.4} score {score:.2}");
            }
            for q in calm.iter().take(12) {
                eprintln!("  {q:?}");
            }
        });
    }
    if std::env::var("DEBUG_ANCHORS").is_ok() {
        h.w[0].with_track(|t| {
            for a in t.anchors().iter().take(40) {
                let frac = |x: f64| (x - dev.phases().0).rem_euclid(dev.board().power_period_s);
                eprintln!(
                    "  anchor t {:.4} (tick offset {:.4}) J {:.2} err {:.3}",
                    a.t,
                    frac(a.t),
                    a.joules,
                    a.t_err
                );
            }
        });
    }
    for o in out {
        eprintln!(
            "len {:.2} truth {:7.1} at_end {:7.1} ±{:5.1} ({:+.2}%) settled {:7.1} ±{:5.1} ({:+.2}%) direct {:+.2}%",
            o.len,
            o.truth,
            o.at_end.joules,
            o.at_end.bound,
            100.0 * (o.at_end.joules - o.truth) / o.truth,
            o.settled.joules,
            o.settled.bound,
            100.0 * (o.settled.joules - o.truth) / o.truth,
            100.0 * (o.direct - o.truth) / o.truth
        );
    }
}

/// Diagnostics on the H100 under a random load, by window length:
/// `cargo test -p zeus-core --lib survey_lengths -- --ignored --nocapture`.
#[test]
#[ignore]
fn survey_lengths() {
    let mut rng = Pcg64::seed_from_u64(11);
    for starve in [false, true] {
        for len in [0.2, 0.5, 1.0, 2.0] {
            let (mut ours, mut settled, mut direct) = (Vec::new(), Vec::new(), Vec::new());
            for case in 0..12 {
                let spec = if std::env::var("RANDOM_BOARDS").is_ok() {
                    BoardSpec::random(&mut rng)
                } else {
                    BoardSpec::h100()
                };
                let mut h = Harness::new(spec, 100 + case, starve);
                let windows: Vec<(f64, f64)> =
                    (0..10).map(|_| (rng.random_range(0.0..0.5), len)).collect();
                for o in measure(&mut h, &windows, LoadPattern::Random(0.08)) {
                    ours.push((o.truth, o.at_end.joules, o.at_end.bound));
                    settled.push((o.truth, o.settled.joules, o.settled.bound));
                    direct.push((o.truth, o.direct, 0.0));
                }
            }
            let (a, s, d) = (stats(&ours), stats(&settled), stats(&direct));
            eprintln!(
                "starve={starve} len {len}: at_end mae {:.4} cov {:.3} bound {:.3} | settled mae {:.4} cov {:.3} | direct mae {:.4}",
                a.mae, a.covered, a.median_bound, s.mae, s.covered, d.mae
            );
        }
    }
}

/// Diagnostics: which random boards do worse than direct reads under a random load.
#[test]
#[ignore]
fn survey_boards() {
    let mut rng = Pcg64::seed_from_u64(11);
    let len: f64 = std::env::var("LEN")
        .map(|v| v.parse().unwrap())
        .unwrap_or(2.0);
    for case in 0..30 {
        let spec = BoardSpec::random(&mut rng);
        let mut h = Harness::new(spec, 100 + case, false);
        let windows: Vec<(f64, f64)> = (0..12).map(|_| (rng.random_range(0.0..0.5), len)).collect();
        let pattern = if std::env::var("PATTERN").as_deref() == Ok("edge") {
            LoadPattern::EdgeSteps
        } else {
            LoadPattern::Random(0.08)
        };
        let out = measure(&mut h, &windows, pattern);
        let o: Vec<_> = out
            .iter()
            .map(|o| (o.truth, o.at_end.joules, o.at_end.bound))
            .collect();
        let st: Vec<_> = out
            .iter()
            .map(|o| (o.truth, o.settled.joules, o.settled.bound))
            .collect();
        let d: Vec<_> = out.iter().map(|o| (o.truth, o.direct, 0.0)).collect();
        let (a, s, d) = (stats(&o), stats(&st), stats(&d));
        let (sched, tau, steps, res) =
            h.w[0].with_track(|t| (*t.schedule(), t.tau, t.steps(), t.residual_scales()));
        eprintln!(
            "{:5.3} {:5.3} {:5.3} {} bound {:.4} med {:.4} cov {:.2} {spec:?} lag {:.3}±{:.3} P {:.3} tau {tau:.3} steps {steps} residuals {res:.3?}",
            a.mae, s.mae, d.mae,
            if a.mae > d.mae { "WORSE" } else { "     " },
            a.median_bound, a.median_err, a.covered,
            sched.lag, sched.lag_err, sched.grid.period
        );
    }
}

/// The acceptance figures on `boards` random boards (seeded) with the load stepping at window
/// edges: windows that fail the accuracy rule (settled: 1% from 1 s, 3% below), and the
/// coverage and usefulness of the bounds at the window's end and settled.
struct BoardRun {
    failures: Vec<String>,
    at_end: Vec<(f64, f64, f64, f64)>,
    settled: Vec<(f64, f64, f64, f64)>,
}

fn run_boards(seed: u64, boards: usize, starve: bool, lagging: bool) -> BoardRun {
    run_boards_with(seed, boards, 10, starve, lagging)
}

fn run_boards_with(
    seed: u64,
    boards: usize,
    per_board: usize,
    starve: bool,
    lagging: bool,
) -> BoardRun {
    let mut rng = Pcg64::seed_from_u64(seed);
    let mut run = BoardRun {
        failures: Vec::new(),
        at_end: Vec::new(),
        settled: Vec::new(),
    };
    let mut done = 0;
    while done < boards {
        let spec = BoardSpec::random(&mut rng);
        let is_lagging = !spec.instant && spec.average_ms > 0.0;
        if is_lagging != lagging {
            continue;
        }
        done += 1;
        let mut h = Harness::new(spec, seed * 1000 + done as u64, starve);
        let windows = random_windows(&mut rng, per_board, 0.2, 3.0);
        // Diagnostics: `ONLY_BOARD=k` measures the k-th board alone, and prints its windows.
        let only = std::env::var("ONLY_BOARD")
            .ok()
            .and_then(|v| v.parse::<usize>().ok());
        if only.is_some_and(|k| k != done) {
            continue;
        }
        if only.is_some() {
            eprintln!(
                "board {spec:?} seed {} windows {windows:?}",
                seed * 1000 + done as u64
            );
        }
        for o in measure(&mut h, &windows, LoadPattern::EdgeSteps) {
            if only.is_some() {
                eprintln!(
                    "len {:.2} truth {:7.1} user {:7.1} ±{:5.1} ({:+.2}%) settled {:7.1} ±{:5.1} ({:+.2}%)",
                    o.len, o.truth, o.user.joules, o.user.bound,
                    100.0 * (o.user.joules - o.truth) / o.truth,
                    o.settled.joules, o.settled.bound,
                    100.0 * (o.settled.joules - o.truth) / o.truth
                );
            }
            if std::env::var("MISSES").is_ok() && (o.user.joules - o.truth).abs() > o.user.bound {
                eprintln!(
                    "miss board {done} {spec:?} len {:.2} truth {:.1} user {:.1} ±{:.1} settled {:.1} ±{:.1}",
                    o.len, o.truth, o.user.joules, o.user.bound, o.settled.joules, o.settled.bound
                );
            }
            let rule = if o.len >= 1.0 { 0.01 } else { 0.03 };
            let err = (o.settled.joules - o.truth).abs() / o.truth;
            if err > rule {
                run.failures.push(format!(
                    "{spec:?} seed {} windows {windows:?}: {:.2} s window, settled {:.1} J vs {:.1} J ({:+.2}%)",
                    seed * 1000 + done as u64,
                    o.len,
                    o.settled.joules,
                    o.truth,
                    100.0 * (o.settled.joules - o.truth) / o.truth
                ));
            }
            run.at_end
                .push((o.len, o.truth, o.user.joules, o.user.bound));
            run.settled
                .push((o.len, o.truth, o.settled.joules, o.settled.bound));
        }
    }
    run
}

/// Coverage, median bound and median error (relative), and the median bound of windows of a
/// second or more.
fn bound_figures(v: &[(f64, f64, f64, f64)]) -> (f64, f64, f64, f64) {
    let covered = v.iter().filter(|(_, t, e, b)| (e - t).abs() <= *b).count() as f64;
    let median = |mut x: Vec<f64>| {
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let bounds = median(v.iter().map(|(_, t, _, b)| b / t).collect());
    let errs = median(v.iter().map(|(_, t, e, _)| (e - t).abs() / t).collect());
    let long = median(
        v.iter()
            .filter(|(l, ..)| *l >= 1.0)
            .map(|(_, t, _, b)| b / t)
            .collect(),
    );
    (covered / v.len() as f64, bounds, errs, long)
}

#[test]
#[ignore]
fn survey_acceptance() {
    let configs = match std::env::var("CONFIG").as_deref() {
        Ok("first") => vec![(false, false)],
        Ok("starve") => vec![(true, false)],
        Ok("lagging") => vec![(false, true)],
        _ => vec![(false, false), (true, false), (false, true)],
    };
    let seed = std::env::var("SEED").map_or(5, |v| v.parse().unwrap());
    for (starve, lagging) in configs {
        let run = run_boards(seed, 24, starve, lagging);
        eprintln!(
            "starve {starve} lagging {lagging}: {} failures",
            run.failures.len()
        );
        for k in 0..10 {
            let mut b: Vec<f64> = run
                .at_end
                .iter()
                .skip(k)
                .step_by(10)
                .map(|(_, t, _, b)| b / t)
                .collect();
            b.sort_by(f64::total_cmp);
            eprintln!("  window {k}: median at_end bound {:.4}", b[b.len() / 2]);
        }
        let mut j: Vec<f64> = run.at_end.iter().map(|(_, _, _, b)| *b).collect();
        j.sort_by(f64::total_cmp);
        let mut e: Vec<f64> = run
            .at_end
            .iter()
            .map(|(_, t, g, _)| (g - t).abs())
            .collect();
        e.sort_by(f64::total_cmp);
        eprintln!(
            "  at_end bound J p25 {:.2} p50 {:.2} p75 {:.2}; error J p50 {:.3} p90 {:.3} p99 {:.3}",
            j[j.len() / 4],
            j[j.len() / 2],
            j[3 * j.len() / 4],
            e[e.len() / 2],
            e[9 * e.len() / 10],
            e[99 * e.len() / 100]
        );
        for f in run.failures.iter().take(8) {
            eprintln!("  {f}");
        }
        eprintln!(
            "  at_end  (cov, bound, err, long) {:?}",
            bound_figures(&run.at_end)
        );
        eprintln!(
            "  settled (cov, bound, err, long) {:?}",
            bound_figures(&run.settled)
        );
    }
}

// ---- acceptance ------------------------------------------------------------------------------

/// Windows of 0.2-3 s on random boards (update periods 10-200 ms, counters on the power grid
/// or their own, lags 0-80 ms, noise 0-5%, with and without instant power), the load stepping
/// at the window edges: settled windows meet the accuracy rule (1% from 1 s, 3% below) but
/// for a rare one, the bounds cover at least 95% of windows at their end and settled, and stay
/// useful: a median at most the larger of 4x the median error and 0.5% of the energy, and
/// under 5% for windows of a second or more.
fn check_random_boards(seed: u64, starve: bool) {
    // 16 boards, 20 windows each: a job measures many windows, and the first few on a board
    // are made before the calibration is done (their bounds are wide).
    let run = run_boards_with(seed, 16, 20, starve, false);
    let n = run.settled.len();
    assert!(
        run.failures.len() * 100 <= 2 * n,
        "{} of {n} windows miss the accuracy rule:\n{}",
        run.failures.len(),
        run.failures.join("\n")
    );
    for (what, v) in [("at end", &run.at_end), ("settled", &run.settled)] {
        let (covered, bound, err, long) = bound_figures(v);
        assert!(
            covered >= 0.95,
            "{what}: the bound covers {covered:.3} of windows"
        );
        // A starved sampler may widen its bounds instead (they still cover); long windows'
        // bounds stay useful either way.
        assert!(
            starve || bound <= (4.0 * err).max(0.005),
            "{what}: median bound {bound:.4} of the energy, median error {err:.5}"
        );
        assert!(
            long < 0.05,
            "{what}: median bound of long windows {long:.4}"
        );
    }
}

#[test]
fn windows_on_random_boards_are_accurate_and_their_bounds_cover_and_stay_useful() {
    check_random_boards(5, false);
}

#[test]
fn a_starved_sampler_keeps_the_figures_or_widens_its_bounds() {
    check_random_boards(6, true);
}

/// Faults of 0.3, 2 and 10 s on counter reads, power reads or both, at random moments of a
/// run of windows (the load stepping at their edges): sampling resumes, windows after the
/// fault meet the accuracy rule, and a window spanning it is within its bound, marked degraded
/// where readings were missing inside it.
#[test]
fn through_faults_sampling_resumes_and_spanning_windows_stay_within_their_bounds() {
    use crate::device::error::nvml_code;
    use crate::device::sim::board::calls;
    let mut rng = Pcg64::seed_from_u64(17);
    for (k, (seconds, which)) in [0.3, 2.0, 10.0]
        .into_iter()
        .flat_map(|s| {
            [
                (s, calls::ENERGY),
                (s, calls::POWER),
                (s, calls::ENERGY | calls::POWER),
            ]
        })
        .enumerate()
    {
        let mut h = Harness::new(BoardSpec::h100(), 300 + k as u64, false);
        h.run_until(h.now() + 1.5);
        // A window that spans the fault, the fault at a random moment inside it.
        let b = h.now();
        let e_b = h.dev.true_energy_j();
        h.w[0].with_track(|t| t.add_hint(b));
        h.dev.set_load(Load::Busy);
        let start = b + rng.random_range(0.2..0.8);
        h.run_until(start);
        h.dev.inject_fault(crate::device::sim::Fault {
            calls: which,
            from: start,
            until: start + seconds,
            code: nvml_code::GPU_IS_LOST,
            gpu: None,
        });
        h.run_until(start + seconds / 2.0);
        // Meanwhile the GPU is seen to fail (and is not reported gone before it is).
        assert!(
            h.w[0].error().is_some(),
            "{seconds} s, calls {which}: the fault shows"
        );
        // A window ending inside the fault: within its bound, and degraded where neither the
        // counter nor the power readings saw its end.
        let mid = h.now();
        let truth_mid = h.dev.true_energy_j() - e_b;
        let inside = h.w[0].with_track(|t| t.window(b, mid, false)).unwrap();
        assert!(
            (inside.joules - truth_mid).abs() <= inside.bound,
            "{seconds} s, calls {which}: window ending in the fault {inside:?} vs {truth_mid} J"
        );
        if which == calls::ENERGY | calls::POWER {
            assert!(inside.degraded, "{seconds} s, calls {which}: {inside:?}");
        }
        let after = start + seconds + rng.random_range(0.2..0.6);
        h.run_until(after);
        assert!(
            h.w[0].error().is_none(),
            "{seconds} s, calls {which}: recovered"
        );
        let e = h.now();
        let truth = h.dev.true_energy_j() - e_b;
        h.w[0].with_track(|t| t.add_hint(e));
        h.dev.set_load(Load::Idle);
        h.run_until(e + 1.0);
        let span = h.w[0].with_track(|t| t.window_estimate(b, e)).unwrap();
        if std::env::var("DEBUG_FAULT").is_ok() {
            h.w[0].with_track(|t| {
                let off = t.edge(b).unwrap().joules - e_b;
                eprintln!("edge e err {:+.2} (b as reference); e {e:.3} fault {start:.3}..{:.3} steps {} res {:?} tau {}", t.edge(e).unwrap().joules - off - (truth + e_b), start + seconds, t.steps(), t.residual_scales(), t.tau);
                for a in t.anchors().iter().filter(|a| a.t > start - 0.3 && a.t < e + 0.3) {
                    eprintln!("  anchor {:.4} J {:.2} vs truth {:+.2} read_at {:.4} t_err {:.4}", a.t, a.joules - off, a.joules - off - h.dev.true_energy_at(a.t), a.read_at, a.t_err);
                }
            });
        }
        // Spanning it: the counter kept counting, so its difference holds the energy.
        assert!(
            (span.joules - truth).abs() <= span.bound,
            "{seconds} s, calls {which}: spanning window {} ± {} J vs {truth} J",
            span.joules,
            span.bound
        );
        assert!(
            (span.joules - truth).abs() <= 0.01 * truth,
            "{seconds} s, calls {which}: spanning window {span:?} vs {truth} J"
        );
        // Windows after the fault: as if there had been none.
        for (len, gap) in [(0.3, 0.2), (1.2, 0.3)] {
            let o = measure_one(&mut h, gap, len);
            let rule = if len >= 1.0 { 0.01 } else { 0.03 };
            assert!(
                (o.settled.joules - o.truth).abs() <= rule * o.truth,
                "{seconds} s, calls {which}: after the fault {o:?}"
            );
            assert!(!o.settled.degraded);
        }
    }
}

/// One window after a gap, the load stepping at its edges, settled a second later.
fn measure_one(h: &mut Harness, gap: f64, len: f64) -> Outcome {
    let b = h.now() + gap;
    h.run_until(b);
    let e_b = h.dev.true_energy_j();
    h.w[0].with_track(|t| t.add_hint(b));
    h.dev.set_load(Load::Busy);
    h.run_until(b + len);
    let e = h.now();
    let truth = h.dev.true_energy_j() - e_b;
    let at_end = h.w[0].with_track(|t| t.window(b, e, true)).unwrap();
    h.dev.set_load(Load::Idle);
    h.run_until(e + 1.0);
    let settled = h.w[0].with_track(|t| t.window_estimate(b, e)).unwrap();
    Outcome {
        len: e - b,
        truth,
        user: at_end,
        at_end,
        settled,
        direct: 0.0,
    }
}

/// A caller held up between its window edges and the load steps (a busy machine: the load
/// steps 25 ms after the window begins, and the window ends 25 ms after the load stopped) at
/// the first few edges the sampler sees must not move the lag it calibrates: that delay is one
/// edge's, not the board's. Found through `libnvidia-ml.so.1` beside busy loops: the lag fit
/// took it, and every later window was 2% off outside its bound.
#[test]
fn a_caller_held_up_at_its_first_window_edges_does_not_move_the_lag() {
    for seed in 0..6 {
        let mut h = Harness::new(BoardSpec::h100(), 4200 + seed, false);
        h.run_until(h.now() + 1.0);
        // A load step without a window (the job warming up).
        h.dev.set_load(Load::Busy);
        h.run_until(h.now() + 1.5);
        h.dev.set_load(Load::Idle);
        for _ in 0..3 {
            let b = h.now() + 0.3;
            h.run_until(b);
            h.w[0].with_track(|t| t.add_hint(b));
            h.run_until(b + 0.025);
            h.dev.set_load(Load::Busy);
            h.run_until(b + 1.2);
            h.dev.set_load(Load::Idle);
            let e = b + 1.225;
            h.run_until(e);
            h.w[0].with_track(|t| t.window(b, e, true));
        }
        let lag = h.w[0].with_track(|t| t.schedule().lag);
        assert!(
            (lag - 0.015).abs() < 0.008,
            "seed {seed}: the lag moved to {:.1} ms (the board's is 15 ms)",
            lag * 1000.0
        );
        for k in 0..3 {
            let o = measure_one(&mut h, 0.3, 1.2);
            let err = o.settled.joules - o.truth;
            assert!(
                err.abs() <= 0.01 * o.truth && (o.at_end.joules - o.truth).abs() <= o.at_end.bound,
                "seed {seed}, window {k} after: {o:?}"
            );
        }
    }
}

/// The counter resets inside a window (as a driver reload does): no negative energy, and the
/// window is right within its bound (marked degraded: the epochs are joined by the model).
#[test]
fn a_counter_reset_inside_a_window_counts_no_negative_energy() {
    for when in [0.3, 0.75, 1.1] {
        let mut h = Harness::new(BoardSpec::h100(), 40, false);
        h.run_until(h.now() + 1.5);
        let b = h.now();
        let e_b = h.dev.true_energy_j();
        h.w[0].with_track(|t| t.add_hint(b));
        h.dev.set_load(Load::Busy);
        h.run_until(b + when);
        h.dev.reset_counter();
        h.run_until(b + 1.5);
        let e = h.now();
        let truth = h.dev.true_energy_j() - e_b;
        h.w[0].with_track(|t| t.add_hint(e));
        h.dev.set_load(Load::Idle);
        h.run_until(e + 1.0);
        let w = h.w[0].with_track(|t| t.window_estimate(b, e)).unwrap();
        assert!(w.joules > 0.0);
        assert!(
            (w.joules - truth).abs() <= w.bound,
            "reset at {when} s: {} ± {} J vs {truth} J",
            w.joules,
            w.bound
        );
        assert!(w.degraded, "a window across a reset is degraded: {w:?}");
        assert!(
            w.bound < 0.05 * truth,
            "the bound stays useful: {w:?} vs {truth}"
        );
        // Later windows are on the joined scale, exact as before.
        let o = measure_one(&mut h, 0.2, 1.0);
        assert!(
            (o.settled.joules - o.truth).abs() <= 0.01 * o.truth,
            "{o:?}"
        );
    }
}

/// A counter without lag on the power grid (50 ms, sampled powers, no noise), whose value the
/// driver takes at the end of its 3.5 ms read: the grid fitted by the reads' midpoints sits
/// early, and the lag that absorbs that is negative. Before the lag could go below zero, the
/// described moments stayed early, and windows missed their bounds by a few joules at 650 W.
#[test]
fn a_counter_read_late_in_its_call_is_placed_by_a_negative_lag() {
    let spec = BoardSpec {
        power_ms: 50.0,
        counter_ms: 50.0,
        lag_ms: 0.0,
        noise: 0.0,
        instant: false,
        average_ms: 0.0,
        resolution_mj: 1,
    };
    // The windows of the library-level test that found it (tests/monitor/test_faults.py).
    let lens = [0.5, 1.2, 0.3, 1.5, 0.8, 1.0];
    let windows: Vec<(f64, f64)> = lens.iter().chain(&lens).map(|&l| (0.3, l)).collect();
    for seed in 1..=4 {
        let mut h = Harness::new(spec, seed, false);
        let out = measure(&mut h, &windows, LoadPattern::EdgeSteps);
        let s = h.w[0].with_track(|t| *t.schedule());
        assert!(
            s.lag_known && s.lag < 0.0 && s.lag > track::LAG_MIN,
            "seed {seed}: {s:?}"
        );
        // The first window is made while the lag is still a guess.
        for o in &out[1..] {
            for (what, e) in [("at end", o.at_end), ("settled", o.settled)] {
                assert!(
                    (e.joules - o.truth).abs() <= e.bound,
                    "seed {seed}, {what}: {o:?} ({s:?})"
                );
            }
        }
    }
}

/// A board whose counter lags longer than the calibration searches: the sampler says so and
/// leaves the cache for direct reads, whose bound covers their staleness.
#[test]
fn a_lag_beyond_the_search_range_switches_to_direct_reads() {
    let spec = BoardSpec {
        lag_ms: 400.0,
        ..BoardSpec::h100()
    };
    let mut h = Harness::new(spec, 50, false);
    let mut rng = Pcg64::seed_from_u64(50);
    let windows = random_windows(&mut rng, 12, 0.3, 1.5);
    let out = measure(&mut h, &windows, LoadPattern::EdgeSteps);
    let (mode, reason) = h.w[0].with_track(|t| (t.mode(), t.mode_reason().to_string()));
    assert_eq!(mode, Mode::Direct, "{reason}");
    assert!(reason.contains("lags"), "{reason}");
    for o in out.iter().skip(6) {
        assert!(
            (o.user.joules - o.truth).abs() <= o.user.bound,
            "{o:?} ({reason})"
        );
    }
}

/// A counter that stands still while the power readings say the board draws power (MI100's
/// frozen counter): power integration instead, within its bound.
#[test]
fn a_frozen_counter_switches_to_power_integration() {
    let mut h = Harness::new(BoardSpec::h100(), 60, false);
    h.run_until(h.now() + 1.5);
    // Freeze: every later counter read shows the energy of now.
    h.dev.freeze_counter();
    let o = measure_one(&mut h, 0.2, 1.0);
    let o2 = measure_one(&mut h, 0.2, 1.0);
    let (mode, reason) = h.w[0].with_track(|t| (t.mode(), t.mode_reason().to_string()));
    assert_eq!(mode, Mode::Power, "{reason}");
    let p = h.w[0]
        .with_track(|t| {
            let e = h.now() - 1.0;
            t.power_window(e - o2.len, e)
        })
        .unwrap();
    assert!(
        (p.joules - o2.truth).abs() <= p.bound,
        "{p:?} vs {}",
        o2.truth
    );
    let _ = o;
}

/// Load that changes at random moments inside windows (not at their edges), on the H100 and on
/// random boards: for every window length from 0.2 s to 2 s the cache's mean absolute error is
/// no larger than that of direct counter reads at the edges in the same run, and its bound
/// covers the error in most windows (the load's spread inside counter intervals is learned
/// slowly: about 93% at 2 s on random boards, see docs/measurement-uncertainty.md).
#[test]
fn a_load_moving_inside_windows_is_measured_better_than_direct_reads() {
    let mut rng = Pcg64::seed_from_u64(21);
    for random_boards in [false, true] {
        for len in [0.2, 0.5, 1.0, 2.0] {
            let (mut ours, mut direct) = (Vec::new(), Vec::new());
            for case in 0..16 {
                let spec = if random_boards {
                    BoardSpec::random(&mut rng)
                } else {
                    BoardSpec::h100()
                };
                let mut h = Harness::new(spec, 300 + case, false);
                let windows: Vec<(f64, f64)> =
                    (0..10).map(|_| (rng.random_range(0.0..0.5), len)).collect();
                for o in measure(&mut h, &windows, LoadPattern::Random(0.08)) {
                    ours.push((o.truth, o.at_end.joules, o.at_end.bound));
                    direct.push((o.truth, o.direct, 0.0));
                }
            }
            let (a, d) = (stats(&ours), stats(&direct));
            let what = format!("random boards {random_boards}, {len} s windows");
            eprintln!(
                "{what}: MAE {:.4} (direct {:.4}), bounds cover {:.3}, median bound {:.4}",
                a.mae, d.mae, a.covered, a.median_bound
            );
            assert!(a.mae <= d.mae, "{what}: MAE {} vs direct {}", a.mae, d.mae);
            assert!(a.covered >= 0.95, "{what}: bounds cover {}", a.covered);
        }
    }
}

/// Diagnostics: the exporter's view on the real clock: `SHARE` of a CPU for counter reads.
#[test]
#[ignore]
fn diagnose_scrapes_real_clock() {
    let share: f64 = std::env::var("SHARE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.005);
    // `STEP=1`: idle at the start, busy from 50 ms (zeusd's test steps the load so).
    let step = std::env::var("STEP").is_ok();
    let c = SimCluster::new(SimConfig {
        presets: vec![preset::find("H100").unwrap(); 2],
        load: if step { Load::Idle } else { Load::Busy },
        ..SimConfig::default()
    });
    if step {
        let devs = c.devices().to_vec();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            for d in devs {
                d.set_load(Load::Busy);
            }
        });
    }
    set_anchor_cpu_share(share);
    let gpus: Vec<Arc<dyn Gpu>> = c
        .devices()
        .iter()
        .map(|d| d.clone() as Arc<dyn Gpu>)
        .collect();
    let lease = Sampler::lease(&gpus).unwrap();
    let clock = c.clock();
    let t0 = clock.now();
    let mut rows = Vec::new();
    let n: usize = std::env::var("ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    for _ in 0..n {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let now = clock.now();
        let mut row = Vec::new();
        for k in 0..2 {
            let e = lease.watched(k).with_track(|t| t.edge(now));
            let truth = c.devices()[k].true_energy_at(now);
            let (anchors, lag) = lease.watched(k).with_track(|t| {
                (
                    t.anchors().len(),
                    (t.schedule().lag, t.schedule().lag_known),
                )
            });
            row.push((e.map(|e| (e.joules, e.sigma)), truth, anchors, lag));
        }
        rows.push((now - t0, row));
    }
    let base: Vec<(f64, f64)> = (0..2)
        .map(|k| {
            let (_, r) = &rows[5];
            (r[k].0.unwrap().0, r[k].1)
        })
        .collect();
    for (t, row) in &rows {
        let mut line = format!("t {t:6.3}");
        for (k, (e, truth, n, lag)) in row.iter().enumerate() {
            if let Some((j, s)) = e {
                line += &format!(
                    " | gpu{k} err {:+7.2} J sigma {s:5.2} anchors {n} lag {:.4} {}",
                    (j - base[k].0) - (truth - base[k].1),
                    lag.0,
                    lag.1
                );
            }
        }
        eprintln!("{line}");
    }
}

/// Diagnostics: ZeusMonitor's windows on the real clock (run it with busy loops beside to
/// starve the sampler): `SEED`, `WINDOWS`; a window past 1.5x its bound and the rule dumps
/// the anchors and ticks around its edges.
#[test]
#[ignore]
fn diagnose_windows_real_clock() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let n: usize = std::env::var("WINDOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let c = SimCluster::new(SimConfig {
        presets: vec![preset::find("H100").unwrap()],
        load: Load::Idle,
        ..SimConfig::default()
    });
    let gpus: Vec<Arc<dyn Gpu>> = c
        .devices()
        .iter()
        .map(|d| d.clone() as Arc<dyn Gpu>)
        .collect();
    let lease = Sampler::lease(&gpus).unwrap();
    let clock = c.clock();
    let dev = &c.devices()[0];
    let w = lease.watched(0);
    std::thread::sleep(std::time::Duration::from_millis(350));
    for k in 0..n {
        let gap = rng.random_range(0.0..0.4);
        let len = rng.random_range(0.2..1.5);
        std::thread::sleep(std::time::Duration::from_secs_f64(gap));
        let t0 = clock.now();
        w.with_track(|t| t.add_hint(t0));
        dev.set_load(Load::Busy);
        std::thread::sleep(std::time::Duration::from_secs_f64(len));
        dev.set_load(Load::Idle);
        let t1 = clock.now();
        let est = w.with_track(|t| t.window(t0, t1, true)).unwrap();
        let truth = dev.true_energy_at(t1) - dev.true_energy_at(t0);
        let err = est.joules - truth;
        let rule = if len >= 1.0 { 0.01 } else { 0.03 } * truth + 2.6;
        let fail = err.abs() > 1.5 * est.bound && err.abs() > rule;
        eprintln!(
            "{k:2} len {len:4.2} err {err:+7.2} J bound {:6.2}{}",
            est.bound,
            if fail { " <<< FAIL" } else { "" }
        );
        if fail {
            w.with_track(|t| {
                eprintln!("  t0 {t0:.4} t1 {t1:.4} schedule {:?}", t.schedule());
                let e0 = t.edge(t0).unwrap();
                let e1 = t.edge(t1).unwrap();
                let off = t
                    .anchors()
                    .front()
                    .map_or(0.0, |a| a.joules - dev.true_energy_at(a.t));
                eprintln!(
                    "  edge0 err {:+.2} {:?}\n  edge1 err {:+.2} {:?}",
                    e0.joules - off - dev.true_energy_at(t0),
                    e0,
                    e1.joules - off - dev.true_energy_at(t1),
                    e1
                );
                for a in t
                    .anchors()
                    .iter()
                    .filter(|a| a.t > t0 - 0.5 && a.t < t1 + 0.5)
                {
                    eprintln!(
                        "  anchor {:.4} vs truth {:+.2} t_err {:.4}",
                        a.t,
                        a.joules - off - dev.true_energy_at(a.t),
                        a.t_err
                    );
                }
                for tk in t
                    .ticks()
                    .iter()
                    .filter(|x| x.t > t0 - 0.3 && x.t < t1 + 0.3)
                {
                    eprintln!(
                        "  tick {:.4} {:6.1} W seen {} t_err {:.4}",
                        tk.t, tk.watts, tk.seen, tk.t_err
                    );
                }
            });
        }
    }
}

/// Diagnostics: `run_windows` on the windows of `CASE` ("gap,len,limit;..."), printed.
#[test]
#[ignore]
fn diagnose_run_windows() {
    let case = std::env::var("CASE").unwrap_or_default();
    let windows: Vec<Window> = case
        .split(';')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let v: Vec<&str> = s.split(',').collect();
            (
                v[0].parse().unwrap(),
                v[1].parse().unwrap(),
                v[2].parse().unwrap(),
            )
        })
        .collect();
    for (span, truth, at_end, settled) in run_windows(&windows) {
        eprintln!(
            "len {span:.3} truth {truth:8.2} at_end {at_end:8.2} ({:+.2}%) settled {settled:8.2} ({:+.2}%)",
            100.0 * (at_end - truth) / truth,
            100.0 * (settled - truth) / truth
        );
    }
}

#[test]
#[ignore]
fn diagnose_random_load() {
    // The sequence of `a_load_moving_inside_windows_is_measured_better_than_direct_reads`
    // (seed 21), boards and windows alike; only windows of `LEN` on random boards are measured.
    let len: f64 = std::env::var("LEN").map_or(1.0, |v| v.parse().unwrap());
    let mut rng = Pcg64::seed_from_u64(std::env::var("SEED").map_or(21, |v| v.parse().unwrap()));
    let (mut all, mut direct) = (Vec::new(), Vec::new());
    for random_boards in [false, true] {
        for l in [0.2, 0.5, 1.0, 2.0] {
            for case in 0..16 {
                let spec = if random_boards {
                    BoardSpec::random(&mut rng)
                } else {
                    BoardSpec::h100()
                };
                let windows: Vec<(f64, f64)> =
                    (0..10).map(|_| (rng.random_range(0.0..0.5), l)).collect();
                if !random_boards
                    || l != len
                    || std::env::var("CASE").is_ok_and(|c| c.parse::<u64>().unwrap() != case)
                {
                    continue;
                }
                let mut h = Harness::new(spec, 300 + case, false);
                let mut v = Vec::new();
                for o in measure(&mut h, &windows, LoadPattern::Random(0.08)) {
                    v.push((o.truth, o.at_end.joules, o.at_end.bound));
                    direct.push((o.truth, o.direct, 0.0));
                }
                let s = stats(&v);
                let misses: Vec<String> = v
                    .iter()
                    .filter(|(t, e, b)| (e - t).abs() > *b)
                    .map(|(t, e, b)| format!("{:+.1}/{:.1}", e - t, b))
                    .collect();
                eprintln!(
                    "case {case}: mae {:.4} cover {:.2} mb {:.3} {:?} misses {misses:?}",
                    s.mae, s.covered, s.median_bound, spec
                );
                all.extend(v);
            }
        }
    }
    let (a, d) = (stats(&all), stats(&direct));
    eprintln!(
        "ALL: mae {:.4} (direct {:.4}) cover {:.3} median bound {:.4}",
        a.mae, d.mae, a.covered, a.median_bound
    );
}

/// A load that stepped once and holds, with no window edges at all (the exporter and zeusd
/// serving the counter at any moment): the energy now is extrapolated past the last anchor by
/// the readings alone, and its bound stays at what that stretch can hold, not a random walk of
/// the load's variance (the one step is all its variance).
#[test]
fn a_load_that_stepped_once_keeps_a_narrow_bound_between_anchors_without_window_edges() {
    let mut h = Harness::new(BoardSpec::h100(), 7, false);
    h.run_until(h.now() + 2.0);
    h.dev.set_load(Load::Busy);
    for k in 0..10 {
        // Moments spread over the counter's period.
        h.run_until(h.now() + 0.5 + 0.0137 * k as f64);
        let now = h.now();
        let edge = h.w[0].with_track(|t| t.edge(now)).expect("an estimate");
        let power = h.dev.true_power_w();
        assert!(
            Z95 * edge.sigma < 0.02 * power,
            "at {now}: bound {} J at {power} W",
            Z95 * edge.sigma
        );
    }
}

/// AMD boards (1 ms updates, the counter's lag stated by the backend, current or average
/// power): windows under load steps within 1% from 1 s and 3% from 0.2 s, and within their
/// bounds.
#[test]
fn amd_boards_are_measured_within_their_bounds() {
    let mut rng = Pcg64::seed_from_u64(27);
    for key in ["MI300X", "MI210"] {
        let mut h = Harness::amd(key, BoardKnobs::default(), 7);
        h.run_until(h.now() + 1.0);
        let windows = random_windows(&mut rng, 20, 0.2, 1.2);
        let out = measure(&mut h, &windows, LoadPattern::EdgeSteps);
        for o in &out {
            let err = (o.user.joules - o.truth).abs();
            let rel = if o.len >= 1.0 { 0.01 } else { 0.03 };
            assert!(err <= rel * o.truth, "{key}: {o:?}");
        }
        // 95% bounds: most windows, not every one.
        let covered = out
            .iter()
            .filter(|o| (o.user.joules - o.truth).abs() <= o.user.bound)
            .count() as f64
            / out.len() as f64;
        eprintln!("{key}: bounds cover {covered:.3}");
        assert!(covered >= 0.85, "{key}: bounds cover {covered}");
        let mode = h.w[0].with_track(|t| t.mode());
        assert_eq!(mode, Mode::Cached, "{key}");
    }
}

/// A counter read whose thread was descheduled mid-call spans several publishes of a 1 ms
/// grid: its value may describe any of them, so it gives no anchor (placing it at one of the
/// span's two ends put windows a millisecond of power off, past their bounds).
#[test]
fn a_read_spanning_several_publishes_of_a_fast_grid_gives_no_anchor() {
    let mut h = Harness::amd("MI300X", BoardKnobs::default(), 5);
    h.dev.set_load(Load::Busy);
    h.run_until(h.now() + 2.0);
    assert!(h.w[0].with_track(|t| t.schedule().fitted));
    // The call took the value at `t1` but began `early` s before and returned `late` s after.
    for (early, late) in [
        (0.001, 0.004),
        (0.0005, 0.006),
        (0.0015, 0.003),
        (0.0002, 0.008),
    ] {
        h.run_until(h.now() + 0.05);
        let t1 = h.now();
        let value = h.dev.total_energy_consumption().unwrap();
        // The sampler thread is the one held up: nothing else is read meanwhile.
        h.c.clock().advance(late);
        let (before, after) = h.w[0].with_track(|t| {
            let n = t.anchors().len();
            t.on_counter(t1 - early, t1 + late, value, 0.00005);
            (n, t.anchors().len())
        });
        assert_eq!(
            before, after,
            "an anchor from a read across {early} + {late} s"
        );
    }
}

/// An AMD counter that returns stale values now and then (read from several threads at once,
/// amdsmi#115): set aside for power integration, with the reason, and windows within bounds.
#[test]
fn a_counter_going_backwards_switches_to_power_integration() {
    let knobs = BoardKnobs {
        counter_backwards: true,
        ..BoardKnobs::default()
    };
    let mut h = Harness::amd("MI300X", knobs, 8);
    h.run_until(h.now() + 1.0);
    let mut rng = Pcg64::seed_from_u64(28);
    let windows = random_windows(&mut rng, 6, 0.3, 1.0);
    let out = measure(&mut h, &windows, LoadPattern::EdgeSteps);
    let (mode, reason) = h.w[0].with_track(|t| (t.mode(), t.mode_reason().to_string()));
    assert_eq!(mode, Mode::Power, "{reason}");
    assert!(reason.contains("went backwards"), "{reason}");
    // After the switch (the third stale read), power integration within its bound.
    for o in out.iter().skip(2) {
        assert!((o.user.joules - o.truth).abs() <= o.user.bound, "{o:?}");
    }
}

/// Diagnostic (not a test of behaviour): per board, the wall time the sampler's own work takes
/// (the simulated reads are free on the virtual clock) and a window pair's work on the track,
/// after 30 s of a tight loop of windows. Run with `--ignored --nocapture` in release.
#[test]
#[ignore]
fn diagnose_pair_cost() {
    for key in ["H100", "MI300X"] {
        let mut h = if key == "H100" {
            Harness::new(BoardSpec::h100(), 3, false)
        } else {
            Harness::amd(key, BoardKnobs::default(), 3)
        };
        let edges_for = |h: &mut Harness, secs: f64| {
            let until = h.now() + secs;
            while h.now() < until {
                let t = h.now() + 0.0003;
                h.run_until(t);
                h.w[0].with_track(|tr| tr.add_hint(t));
            }
        };
        edges_for(&mut h, 30.0);
        let wall = std::time::Instant::now();
        edges_for(&mut h, 5.0);
        let sampler_ms = wall.elapsed().as_secs_f64() * 1e3 / 5.0;
        let (ticks, anchors, hints) =
            h.w[0].with_track(|t| (t.ticks().len(), t.anchors().len(), t.hints().len()));
        let t0 = h.now();
        let n = 20_000;
        let wall = std::time::Instant::now();
        for i in 0..n {
            let a = t0 + i as f64 * 1e-9;
            h.w[0].with_track(|tr| {
                let e = tr.edge(a);
                std::hint::black_box(tr.window_from(a, e, a + 5e-10, true));
            });
        }
        let pair_us = wall.elapsed().as_secs_f64() / n as f64 * 1e6;
        eprintln!(
            "{key}: sampler {sampler_ms:.1} ms per s; pair {pair_us:.3} us; history: {ticks} \
             readings, {anchors} anchors, {hints} edges"
        );
    }
}

/// Windows under load steps on a starved sampler (`Harness::run_until`) reading a simulated AMD
/// board (`AMD_BOARD`, MI250X by default) over `AMD_SEEDS` seeds of 40 windows each: how many
/// are past their bound, and past twice it, and the bounds' spread.
/// `AMD_BOARD=MI300X AMD_SEEDS=150 cargo test -p zeus-core --release --lib survey_amd_starved --
/// --ignored --nocapture`.
#[test]
#[ignore = "survey"]
fn survey_amd_starved() {
    let key = std::env::var("AMD_BOARD").unwrap_or("MI250X".into());
    let seeds = std::env::var("AMD_SEEDS").map_or(20u64, |v| v.parse().unwrap());
    let mut all = Vec::new();
    for seed in 1..=seeds {
        for o in starved_amd_windows(&key, seed) {
            all.push((
                (o.user.joules - o.truth).abs() / o.user.bound,
                o.user.bound,
                seed,
            ));
        }
    }
    let n = all.len();
    let mut missed = std::collections::BTreeMap::new();
    for x in all.iter().filter(|x| x.0 > 1.0) {
        *missed.entry(x.2).or_insert(0) += 1;
    }
    let past = |k: f64| all.iter().filter(|x| x.0 > k).count();
    let mut bounds: Vec<f64> = all.iter().map(|x| x.1).collect();
    bounds.sort_by(f64::total_cmp);
    eprintln!(
        "{key}: {n} windows, {} past their bound, {} past twice it; bound J p50 {:.3} p90 {:.3}",
        past(1.0),
        past(2.0),
        bounds[n / 2],
        bounds[9 * n / 10]
    );
    eprintln!("windows past their bound, by seed: {missed:?}");
}

/// 40 windows of 0.2-1.5 s under load steps at their edges, on a starved sampler reading
/// simulated AMD board `key`.
fn starved_amd_windows(key: &str, seed: u64) -> Vec<Outcome> {
    let mut h = Harness::of(key, BoardKnobs::default(), seed, true);
    let mut rng = Pcg64::seed_from_u64(seed + 100);
    h.run_until(h.now() + 1.0);
    let windows = random_windows(&mut rng, 40, 0.2, 1.5);
    measure(&mut h, &windows, LoadPattern::EdgeSteps)
}

/// A starved sampler on AMD's 1 ms grid polls late across several power updates: the change
/// it then sees fell at one of them, which it cannot tell, and the edges whose counter
/// intervals hold such a step say so in their bounds (seen beside a busy CI: a 0.2 s MI250X
/// window 0.37 J low against a 0.16 J bound). These seeds had 3 windows each past their
/// bounds (of 40; a ~95% bound misses about 2) before the step's spread counted.
#[test]
fn a_starved_sampler_on_a_fast_grid_bounds_the_steps_it_polled_late() {
    for (key, seed) in [
        ("MI300X", 11),
        ("MI300X", 48),
        ("MI300X", 134),
        ("MI250X", 24),
        ("MI250X", 41),
        ("MI250X", 80),
        ("MI250X", 141),
    ] {
        let out = starved_amd_windows(key, seed);
        let missed: Vec<_> = out
            .iter()
            .filter(|o| (o.user.joules - o.truth).abs() > o.user.bound)
            .collect();
        assert!(missed.len() <= 1, "{key} seed {seed}: {missed:#?}");
    }
}

/// A window read directly at its edges whose end read came late (its thread preempted between
/// taking the end's time and reading the counter, on a busy machine): the value holds the
/// energy up to the read, and the bound says so (seen beside busy loops: an MI300X window
/// 0.61 J high against a 0.27 J bound, read about 4 ms after its end).
#[test]
fn a_direct_read_made_late_is_within_the_bound_that_counts_its_lateness() {
    let mut h = Harness::amd("MI300X", BoardKnobs::default(), 4);
    h.dev.set_load(Load::Busy);
    h.run_until(h.now() + 2.0);
    let start = h.now();
    let d0 = h.direct();
    h.run_until(start + 0.3);
    let end = h.now();
    let late = 0.004;
    h.c.clock().advance(late);
    let d1 = h.direct();
    let err = (d1 - d0) - (h.dev.true_energy_at(end) - h.dev.true_energy_at(start));
    let (timely, counted) = h.w[0].with_track(|t| {
        (
            t.direct_bound((start, 0.0), (end, 0.0)),
            t.direct_bound((start, 0.0), (end, late)),
        )
    });
    assert!(
        err > timely,
        "the late read is past the bound of a timely one: {err} J, {timely} J"
    );
    assert!(err <= counted, "{err} J against a bound of {counted} J");
}
