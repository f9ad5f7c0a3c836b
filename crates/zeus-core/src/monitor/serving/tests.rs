//! The ledger against a model engine whose power is a known function of each step's work.

use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::collections::HashMap;

/// The power model of the acceptance test: `idle + a·prefill/s + b·decode/s + c·KV tokens`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PowerModel {
    pub idle_w: f64,
    pub a: f64,
    pub b: f64,
    pub c: f64,
}

impl PowerModel {
    pub fn h100() -> PowerModel {
        PowerModel {
            idle_w: 90.0,
            a: 0.10,
            b: 0.60,
            c: 0.0012,
        }
    }

    pub fn watts(&self, step: &EngineStep) -> f64 {
        let (p, d, k) = step.sums();
        self.idle_w + (self.a * p + self.b * d) / step.seconds + self.c * k
    }

    /// Each request's cost in a step of `n` requests (J) under the true weights: its equal
    /// part of the static power, and its work.
    pub fn cost(&self, w: &Work, seconds: f64, n: usize) -> f64 {
        self.idle_w * seconds / n as f64
            + self.a * w.prefill
            + self.b * w.decode
            + self.c * w.kv * seconds
    }
}

/// One step of the model engine: its length and its requests' work (empty: an idle gap).
#[derive(Debug, Clone)]
pub(crate) struct EngineStep {
    pub seconds: f64,
    pub work: Vec<(String, Work)>,
    /// Requests that finished with this step, with their generated tokens.
    pub finished: Vec<(String, f64)>,
    /// Requests that arrived before this step.
    pub arrived: Vec<String>,
}

impl EngineStep {
    pub fn sums(&self) -> (f64, f64, f64) {
        self.work.iter().fold((0.0, 0.0, 0.0), |(p, d, k), (_, w)| {
            (p + w.prefill, d + w.decode, k + w.kv)
        })
    }
}

/// A continuous-batching engine: Poisson arrivals, prompts of `prompt` tokens and outputs of
/// `output` tokens (uniform), at most `batch` running requests, a token budget of 512 per
/// step with chunked prefill; a step takes 12 ms plus 30 µs per token processed plus 20 ns per
/// KV token read. Idle stretches come as gaps of at most 50 ms.
pub(crate) fn engine(
    seed: u64,
    seconds: f64,
    rate: f64,
    prompt: (u32, u32),
    output: (u32, u32),
    batch: usize,
) -> Vec<EngineStep> {
    struct Req {
        id: String,
        prompt_left: f64,
        context: f64,
        out_left: f64,
        out: f64,
    }
    let mut rng = Pcg64::seed_from_u64(seed);
    let mut t = 0.0;
    let mut next_arrival = -rate.recip() * rng.random_range(1e-9..1.0f64).ln();
    let (mut waiting, mut running): (Vec<Req>, Vec<Req>) = (Vec::new(), Vec::new());
    let mut steps = Vec::new();
    let mut n = 0;
    while t < seconds || !running.is_empty() || !waiting.is_empty() {
        let mut arrived = Vec::new();
        while next_arrival <= t && next_arrival < seconds {
            let id = format!("r{n}");
            n += 1;
            arrived.push(id.clone());
            waiting.push(Req {
                id,
                prompt_left: f64::from(rng.random_range(prompt.0..=prompt.1)),
                context: 0.0,
                out_left: f64::from(rng.random_range(output.0..=output.1)),
                out: 0.0,
            });
            next_arrival -= rate.recip() * rng.random_range(1e-9..1.0f64).ln();
        }
        while running.len() < batch && !waiting.is_empty() {
            running.push(waiting.remove(0));
        }
        if running.is_empty() {
            let gap = (next_arrival - t).clamp(1e-3, 0.05);
            steps.push(EngineStep {
                seconds: gap,
                work: Vec::new(),
                finished: Vec::new(),
                arrived,
            });
            t += gap;
            continue;
        }
        let mut budget = 512.0;
        let mut work = Vec::new();
        let mut finished = Vec::new();
        for r in running.iter_mut() {
            let w = if r.prompt_left > 0.0 {
                let chunk = r.prompt_left.min(budget);
                if chunk <= 0.0 {
                    continue;
                }
                budget -= chunk;
                Work {
                    prefill: chunk,
                    decode: 0.0,
                    kv: r.context + chunk,
                }
            } else {
                budget -= 1.0;
                Work {
                    prefill: 0.0,
                    decode: 1.0,
                    kv: r.context + 1.0,
                }
            };
            r.context += w.prefill + w.decode;
            if r.prompt_left > 0.0 {
                r.prompt_left -= w.prefill;
                if r.prompt_left <= 0.0 {
                    r.out += 1.0; // the last prefill chunk produces the first token
                    r.out_left -= 1.0;
                }
            } else {
                r.out += 1.0;
                r.out_left -= 1.0;
            }
            if r.prompt_left <= 0.0 && r.out_left <= 0.0 {
                finished.push((r.id.clone(), r.out));
            }
            work.push((r.id.clone(), w));
        }
        running.retain(|r| !(r.prompt_left <= 0.0 && r.out_left <= 0.0));
        let tokens: f64 = work.iter().map(|(_, w)| w.prefill + w.decode).sum();
        let kv: f64 = work.iter().map(|(_, w)| w.kv).sum();
        let seconds = 0.012 + 30e-6 * tokens + 20e-9 * kv;
        t += seconds;
        steps.push(EngineStep {
            seconds,
            work,
            finished,
            arrived,
        });
    }
    steps
}

/// Add each request's true energy in step `s` of `step_j` J: its share by its true cost.
fn add_truth(truth: &mut HashMap<String, f64>, s: &EngineStep, model: &PowerModel, step_j: f64) {
    let n = s.work.len();
    let sum: f64 = s
        .work
        .iter()
        .map(|(_, w)| model.cost(w, s.seconds, n))
        .sum();
    for (id, w) in &s.work {
        *truth.entry(id.clone()).or_default() += step_j * model.cost(w, s.seconds, n) / sum;
    }
}

/// Feed `steps` with exact energies from `model` to a ledger; returns the ledger, every
/// record, and each request's true energy (its share of each step's energy by its true
/// cost: its equal part of the static power and its work).
fn run_exact(
    steps: &[EngineStep],
    model: &PowerModel,
    opts: LedgerOptions,
    gpus: usize,
) -> (Ledger, Vec<RequestRecord>, HashMap<String, f64>) {
    let mut ledger = Ledger::new(gpus, 0.0, opts).unwrap();
    let mut truth: HashMap<String, f64> = HashMap::new();
    let mut records = Vec::new();
    let mut t = 0.0;
    for s in steps {
        for id in &s.arrived {
            ledger.arrive(id, 0, t).unwrap();
        }
        let e = model.watts(s) * s.seconds;
        // The GPUs of a tensor-parallel engine share the step unevenly.
        let energy: Vec<f64> = (0..gpus)
            .map(|g| e * (1.0 + g as f64) / (gpus * (gpus + 1) / 2) as f64)
            .collect();
        let bound: Vec<f64> = energy.iter().map(|x| x * 0.001).collect();
        t += s.seconds;
        let work: Vec<(&str, Work)> = s.work.iter().map(|(id, w)| (id.as_str(), *w)).collect();
        let cut = Cut {
            seconds: s.seconds,
            energy: &energy,
            bound: &bound,
        };
        ledger.step(cut, t, &work).unwrap();
        // Exact cuts: nothing better comes later.
        ledger.settle(&mut NothingSettled);
        add_truth(&mut truth, s, model, e);
        for (id, out) in &s.finished {
            ledger.finish(id, t, Some(*out)).unwrap();
        }
        records.extend(ledger.take_records());
    }
    ledger.flush(true, &mut NothingSettled);
    records.extend(ledger.take_records());
    (ledger, records, truth)
}

fn assert_conserved(ledger: &Ledger, records: &[RequestRecord]) {
    let t = ledger.totals();
    let attributed: f64 = records.iter().map(|r| r.energy_j).sum();
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-300);
    assert!(t.pending_j == 0.0, "flushed: nothing pending, {t:?}");
    assert!(
        rel(attributed + t.residual_j, t.measured_j) < 1e-9,
        "records {attributed} + residual {} vs measured {}",
        t.residual_j,
        t.measured_j
    );
    assert!(rel(t.requests_j, attributed) < 1e-9);
    for r in records {
        let per_gpu: f64 = r.gpu_energy_j.iter().sum();
        assert!(rel(per_gpu, r.energy_j) < 1e-9, "{r:?}");
        assert!(
            r.prefill_energy_j >= -1e-9 && r.decode_energy_j >= -1e-9,
            "{r:?}"
        );
    }
}

#[test]
fn work_recovers_the_power_model_and_each_requests_energy_from_exact_steps() {
    let model = PowerModel::h100();
    let steps = engine(1, 60.0, 4.0, (32, 1024), (16, 256), 64);
    let (ledger, records, truth) = run_exact(&steps, &model, LedgerOptions::default(), 1);
    assert_conserved(&ledger, &records);
    let w = ledger.weights().expect("fitted");
    let close = |got: f64, want: f64| (got - want).abs() <= 0.01 * want;
    assert!(close(w.idle_w, model.idle_w), "{w:?}");
    assert!(close(w.prefill_j, model.a), "{w:?}");
    assert!(close(w.decode_j, model.b), "{w:?}");
    assert!(close(w.kv_w, model.c), "{w:?}");
    assert_eq!(records.len(), truth.len());
    for r in &records {
        assert!(r.finished && r.fitted, "{r:?}");
        let want = truth[&r.id];
        assert!(
            (r.energy_j - want).abs() <= 0.01 * want,
            "{}: {} vs {want}",
            r.id,
            r.energy_j
        );
        assert!((r.energy_j - want).abs() <= r.bound_j, "{r:?} vs {want}");
    }
}

#[test]
fn time_and_tokens_follow_their_definitions() {
    let model = PowerModel::h100();
    let steps = engine(2, 10.0, 6.0, (16, 256), (4, 64), 16);
    for method in [Method::Time, Method::Tokens] {
        let opts = LedgerOptions {
            method,
            ..LedgerOptions::default()
        };
        let (ledger, records, _) = run_exact(&steps, &model, opts, 2);
        assert_conserved(&ledger, &records);
        let mut want: HashMap<String, f64> = HashMap::new();
        for s in &steps {
            let e = model.watts(s) * s.seconds;
            let n = s.work.len() as f64;
            let tokens: f64 = s.work.iter().map(|(_, w)| w.prefill + w.decode).sum();
            for (id, w) in &s.work {
                let share = match method {
                    Method::Time => 1.0 / n,
                    _ => (w.prefill + w.decode) / tokens,
                };
                *want.entry(id.clone()).or_default() += e * share;
            }
        }
        for r in &records {
            let x = want[&r.id];
            assert!(
                (r.energy_j - x).abs() <= 1e-9 * x,
                "{method:?} {r:?} vs {x}"
            );
        }
    }
}

#[test]
fn a_step_with_bad_input_changes_nothing() {
    let mut l = Ledger::new(1, 0.0, LedgerOptions::default()).unwrap();
    let cut = Cut {
        seconds: 0.02,
        energy: &[4.0],
        bound: &[0.1],
    };
    let w = Work {
        prefill: 0.0,
        decode: 1.0,
        kv: 10.0,
    };
    l.step(cut, 0.02, &[("a", w), ("b", w)]).unwrap();
    let before = l.totals();
    let err = l.step(cut, 0.04, &[("a", w), ("a", w)]).unwrap_err();
    assert!(err.to_string().contains("'a' appears twice"), "{err}");
    let bad = Work { decode: -1.0, ..w };
    let err = l.step(cut, 0.04, &[("b", w), ("a", bad)]).unwrap_err();
    assert!(err.to_string().contains("-1"), "{err}");
    let err = l
        .step(
            Cut {
                energy: &[f64::NAN],
                ..cut
            },
            0.04,
            &[("a", w)],
        )
        .unwrap_err();
    assert!(err.to_string().contains("NaN"), "{err}");
    assert_eq!(l.totals(), before);
    // Nothing was stamped by the failed steps: the next good step takes both requests.
    l.step(cut, 0.04, &[("a", w), ("b", w)]).unwrap();
    l.finish("a", 0.04, None).unwrap();
    assert!(l.finish("a", 0.06, None).is_err(), "finishing twice");
    assert!(l.arrive("b", 0, 0.06).is_err(), "arriving twice");
    // An id the engine reuses after a finish names a new request.
    l.step(cut, 0.06, &[("a", w)]).unwrap();
    l.finish("a", 0.06, None).unwrap();
    l.flush(true, &mut NothingSettled);
    let recs = l.take_records();
    let firsts: Vec<_> = recs.iter().filter(|r| r.id == "a").collect();
    assert_eq!(firsts.len(), 2, "{recs:?}");
    assert!(Method::parse("joules")
        .unwrap_err()
        .to_string()
        .contains("joules"));
}

#[test]
fn before_a_fit_work_waits_then_splits_by_tokens_and_says_so() {
    let model = PowerModel::h100();
    let steps = engine(3, 2.0, 5.0, (16, 128), (4, 32), 8);
    let opts = LedgerOptions {
        min_spans: 1000,
        max_wait_s: 1.0,
        ..LedgerOptions::default()
    };
    let (ledger, records, _) = run_exact(&steps, &model, opts, 1);
    assert_conserved(&ledger, &records);
    assert!(ledger.weights().is_none());
    for r in &records {
        assert!(!r.fitted, "{r:?}");
        assert!(r.bound_j >= r.energy_j * 0.999, "unfitted shares: {r:?}");
    }
}

/// A source that never settles, but knows each stretch's true energy now (a counter read
/// after the last cut): the steps' constant powers, integrated.
struct KnownNow {
    /// The end of each step and the true energy up to it.
    ends: Vec<(f64, f64)>,
    /// Power of each step (W), in order.
    watts: Vec<f64>,
}

impl KnownNow {
    fn at(&self, t: f64) -> f64 {
        let i = self.ends.partition_point(|e| e.0 < t);
        let (t1, e1) = self.ends[i.min(self.ends.len() - 1)];
        e1 - self.watts[i.min(self.watts.len() - 1)] * (t1 - t)
    }
}

impl Settled for KnownNow {
    fn energy(&mut self, _: f64, _: f64) -> Option<(f64, f64)> {
        None
    }
    fn anchors(&mut self, _: usize, _: f64) -> Option<Vec<(f64, f64, f64)>> {
        None
    }
    fn estimate(&mut self, t0: f64, t1: f64) -> Option<(f64, f64)> {
        Some((self.at(t1) - self.at(t0), 0.01))
    }
}

/// Spans that cannot wait to settle (the ledger's close, or a counter that stopped) take the
/// source's estimate as it stands, not the sum of their cuts: a cut's edge was extrapolated
/// when it was taken, and the span before, settled, ended at that edge as the counter later
/// showed it (a run's last request, alone, was 11.6 J over against a bound of 5.1 J: its span
/// began at an edge extrapolated past a prefill the power readings missed).
#[test]
fn spans_that_cannot_settle_take_what_the_source_knows_now() {
    let model = PowerModel::h100();
    let steps = engine(5, 6.0, 4.0, (16, 256), (4, 64), 16);
    let opts = LedgerOptions {
        min_spans: 3,
        ..LedgerOptions::default()
    };
    let mut ledger = Ledger::new(1, 0.0, opts).unwrap();
    let mut src = KnownNow {
        ends: vec![(0.0, 0.0)],
        watts: vec![model.idle_w],
    };
    let mut records = Vec::new();
    let (mut t, mut true_j) = (0.0, 0.0);
    for s in &steps {
        for id in &s.arrived {
            ledger.arrive(id, 0, t).unwrap();
        }
        let w = model.watts(s);
        t += s.seconds;
        true_j += w * s.seconds;
        src.ends.push((t, true_j));
        src.watts.push(w);
        // Every cut 10% over: what the source knows later is the truth.
        let energy = [w * s.seconds * 1.1];
        let cut = Cut {
            seconds: s.seconds,
            energy: &energy,
            bound: &[0.01],
        };
        let work: Vec<(&str, Work)> = s.work.iter().map(|(id, w)| (id.as_str(), *w)).collect();
        ledger.step(cut, t, &work).unwrap();
        ledger.settle(&mut src);
        for (id, out) in &s.finished {
            ledger.finish(id, t, Some(*out)).unwrap();
        }
        records.extend(ledger.take_records());
    }
    ledger.flush(true, &mut src);
    records.extend(ledger.take_records());
    assert_conserved(&ledger, &records);
    let measured = ledger.totals().measured_j;
    assert!(
        (measured - true_j).abs() < 1e-9 * true_j,
        "measured {measured} J, true {true_j} J (cuts {} J)",
        true_j * 1.1
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Any schedule, any method, any number of GPUs: the records plus the residual add up to
    /// the measured energy, and after a flush nothing is pending.
    #[test]
    fn conservation_is_exact(
        seed in 0u64..1000,
        seconds in 0.5f64..8.0,
        rate in 0.5f64..20.0,
        batch in 1usize..48,
        method in prop_oneof![Just(Method::Time), Just(Method::Tokens), Just(Method::Work)],
        gpus in 1usize..5,
        span in 0.05f64..2.0,
    ) {
        let steps = engine(seed, seconds, rate, (1, 700), (1, 80), batch);
        let opts = LedgerOptions { method, span_s: span, min_spans: 3, max_wait_s: 2.0 };
        let (ledger, records, truth) = run_exact(&steps, &PowerModel::h100(), opts, gpus);
        assert_conserved(&ledger, &records);
        prop_assert_eq!(records.len(), truth.len());
    }
}

// ---- on the simulated H100, measured through the sampler on the virtual clock ---------------

use crate::device::sim::Load;
use crate::monitor::sampler::tests::{BoardSpec, Harness};

/// A power model an H100 can follow (at most ~560 W for the engine's busiest step).
fn serving_model() -> PowerModel {
    PowerModel {
        idle_w: 90.0,
        a: 0.012,
        b: 0.05,
        c: 0.002,
    }
}

/// `s` run for `seconds` instead of `s.seconds` at the same rate of work: its tokens scale
/// with its length (the KV cache it holds does not).
fn stretched(s: &EngineStep, seconds: f64) -> EngineStep {
    let k = seconds / s.seconds;
    let work = s.work.iter().map(|(id, w)| {
        let w = Work {
            prefill: w.prefill * k,
            decode: w.decode * k,
            kv: w.kv,
        };
        (id.clone(), w)
    });
    EngineStep {
        seconds,
        work: work.collect(),
        finished: s.finished.clone(),
        arrived: s.arrived.clone(),
    }
}

/// The sampler's settled knowledge of the harness's GPU, as `EnergyMonitor` gives it.
struct FromTrack<'a>(&'a crate::monitor::sampler::Watched);

impl Settled for FromTrack<'_> {
    fn energy(&mut self, t0: f64, t1: f64) -> Option<(f64, f64)> {
        self.0.with_track(|tr| {
            tr.is_settled(t1)
                .then(|| tr.window_estimate(t0, t1).map(|e| (e.joules, e.bound)))
                .flatten()
        })
    }
    fn estimate(&mut self, t0: f64, t1: f64) -> Option<(f64, f64)> {
        self.0
            .with_track(|tr| tr.window_estimate(t0, t1).map(|e| (e.joules, e.bound)))
    }
    fn anchors(&mut self, _: usize, after: f64) -> Option<Vec<(f64, f64, f64)>> {
        Some(self.0.with_track(|tr| {
            tr.anchors()
                .iter()
                .filter(|a| a.t > after)
                .map(|a| (a.t, a.joules, a.t_err))
                .collect()
        }))
    }
}

/// What a run on the simulated GPU gave.
struct SimRun {
    ledger: Ledger,
    records: Vec<RequestRecord>,
    truth: HashMap<String, f64>,
    /// True energy and decode tokens of the whole run.
    true_j: f64,
    /// Each anchor the sampler kept at the end: its moment and how far its energy is from the
    /// truth there (J; the counter's origin taken out as the median).
    anchors_off: Vec<(f64, f64)>,
}

/// `anchors` (moment, joules) against the true energy, known at the moments of `truth`
/// (moment, joules; the power is constant between them): each anchor's moment and error, less
/// the median error (the counter's own origin).
fn anchors_off(anchors: &[(f64, f64)], truth: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let true_at = |t: f64| {
        let j = truth.partition_point(|x| x.0 <= t);
        let (a, b) = (truth.get(j.checked_sub(1)?)?, truth.get(j)?);
        Some(a.1 + (b.1 - a.1) * (t - a.0) / (b.0 - a.0))
    };
    let off: Vec<(f64, f64)> = anchors
        .iter()
        .filter_map(|&(t, j)| Some((t, j - true_at(t)?)))
        .collect();
    let mut sorted: Vec<f64> = off.iter().map(|x| x.1).collect();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    off.into_iter().map(|(t, e)| (t, e - median)).collect()
}

/// Run `steps` on a simulated H100 whose power follows `model` step by step, cutting each
/// step the way `EnergyMonitor::cut_window` does: the sampler's estimate at each edge,
/// evaluated when the edge happens, ends one step and starts the next.
fn run_on_sim(steps: &[EngineStep], model: &PowerModel, opts: LedgerOptions, seed: u64) -> SimRun {
    let mut h = Harness::new(BoardSpec::h100(), seed, false);
    h.dev.set_load(Load::Drawing(model.idle_w));
    h.run_until(h.now() + 1.5);
    let mut ledger = Ledger::new(1, h.now(), opts).unwrap();
    let debug = std::env::var("SERVING_DEBUG").is_ok();
    let mut n_step = 0usize;
    let mut truth: HashMap<String, f64> = HashMap::new();
    let mut records = Vec::new();
    let mut t_prev = h.now();
    h.w[0].with_track(|tr| tr.add_hint(t_prev));
    let mut pinned = None;
    let true0 = h.dev.true_energy_j();
    let mut e_true_prev = true0;
    let mut true_energy = vec![(t_prev, true0)];
    for s in steps {
        for id in &s.arrived {
            ledger.arrive(id, 0, t_prev).unwrap();
        }
        let watts = if s.work.is_empty() {
            model.idle_w
        } else {
            model.watts(s)
        };
        h.dev.set_load(Load::Drawing(watts));
        h.run_until(t_prev + s.seconds);
        let t = h.now();
        // The harness's clock runs on through a counter read that began before the step's
        // end (a read takes milliseconds here, where on a real machine the sampler reads on
        // its own thread while the engine runs on): the engine ran on too, at the step's
        // rate, so the step did that much more work in that much more time and its power
        // still follows the model. (Charging the longer step's energy to the shorter step's
        // work made a quarter of the steps draw more than the model says, which the fit read
        // as static power: idle 40% high and decode near zero on steady batches.)
        let s = &stretched(s, t - t_prev);
        // As `EnergyMonitor::cut_window` does: the slice from the edge the last one ended
        // with, the end marked and estimated now.
        let (est, carry) = h.w[0]
            .with_track(|tr| tr.window_from(t_prev, pinned, t, true))
            .unwrap();
        pinned = Some(carry);
        let e_true = h.dev.true_energy_j();
        true_energy.push((t, e_true));
        let energy = [est.joules];
        let bound = est.bound;
        let cut = Cut {
            seconds: t - t_prev,
            energy: &energy,
            bound: &[bound],
        };
        let work: Vec<(&str, Work)> = s.work.iter().map(|(id, w)| (id.as_str(), *w)).collect();
        ledger.step(cut, t, &work).unwrap();
        ledger.settle(&mut FromTrack(&h.w[0]));
        n_step += 1;
        if debug && n_step % 5000 == 0 {
            let w = ledger
                .weights()
                .map(|w| (w.idle_w, w.prefill_j, w.decode_j, w.kv_w, w.spans));
            let lag = h.w[0].with_track(|tr| tr.schedule().lag);
            eprintln!(
                "step {n_step} t {:.0} lag {lag:.4} {w:?} watts {watts:.0}",
                t - 1.8e9
            );
        }
        let step_true = e_true - e_true_prev;
        add_truth(&mut truth, s, model, step_true);
        for (id, out) in &s.finished {
            ledger.finish(id, t, Some(*out)).unwrap();
        }
        records.extend(ledger.take_records());
        (t_prev, e_true_prev) = (t, e_true);
    }
    ledger.flush(true, &mut FromTrack(&h.w[0]));
    records.extend(ledger.take_records());
    let anchors: Vec<(f64, f64)> =
        h.w[0].with_track(|tr| tr.anchors().iter().map(|a| (a.t, a.joules)).collect());
    SimRun {
        ledger,
        records,
        truth,
        true_j: e_true_prev - true0,
        anchors_off: anchors_off(&anchors, &true_energy),
    }
}

/// How much of the acceptance a run is held to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Check {
    /// Everything: the weights within 5%, every request within its bound, those longer than
    /// a second within 5% of the truth.
    Full,
    /// Every request within its bound; the weights within 5% or three standard errors.
    Bounds,
    /// Most requests within their bounds (random schedules, see below); the weights as
    /// `Bounds`.
    Coverage,
}

/// How far a fitted weight may be from the truth `want` on a random schedule: 5%, or three of
/// its reported standard errors `se` where the schedule does not tell it that well.
fn weight_allowance(want: f64, se: f64) -> f64 {
    (0.05 * want).max(3.0 * se)
}

/// The acceptance on the simulated GPU: per-request energy within 5% of the truth
/// for requests longer than 1 s and within its bound for all, the weights within 5%,
/// conservation exact; conservation always, the rest as `check` says.
///
/// Random schedules are held to conservation, the bounds' coverage, and each weight within
/// [`weight_allowance`]: on some schedules decode and KV-cache work move together, and
/// 40 s do not tell the KV weight within 5% (seen over 64 schedules, `PROPTEST_RNG_SEED=7`:
/// all weights within 5% on 62, KV or decode off by more on 2, each within 1.5 of the
/// standard errors the fit reports; over 448, seeds 1-7, all four within 5% on 441 and none
/// beyond the allowance).
fn check_work_on_sim(
    seed: u64,
    rate: f64,
    batch: usize,
    prompt: (u32, u32),
    output: (u32, u32),
    check: Check,
) {
    let model = serving_model();
    let steps = engine(seed, 40.0, rate, prompt, output, batch);
    let run = run_on_sim(&steps, &model, LedgerOptions::default(), seed);
    assert_conserved(&run.ledger, &run.records);
    let measured = run.ledger.totals().measured_j;
    assert!(
        (measured - run.true_j).abs() < 0.01 * run.true_j,
        "the cuts add up to the run's energy: {measured} vs {}",
        run.true_j
    );
    let w = run.ledger.weights().expect("fitted");
    if std::env::var("SERVING_COVERAGE").is_ok() {
        eprintln!("seed {seed} rate {rate} batch {batch} {prompt:?} {output:?}: {w:?}");
    }
    // Within 5%; where the schedule does not tell a weight that well, within three of the
    // standard errors the fit reports for it (the records' bounds are built on those).
    let truth = [model.idle_w, model.a, model.b, model.c];
    for (k, name) in ["idle", "prefill", "decode", "kv"].into_iter().enumerate() {
        let (got, want, se) = (w.as_array()[k], truth[k], w.std_err[k]);
        let allowed = match check {
            Check::Full => 0.05 * want,
            Check::Bounds | Check::Coverage => weight_allowance(want, se),
        };
        assert!(
            (got - want).abs() <= allowed,
            "seed {seed}: {name} weight {got} vs {want} (standard error {se}): {w:?}"
        );
    }
    assert_eq!(run.records.len(), run.truth.len());
    let mut covered = 0;
    for r in &run.records {
        let want = run.truth[&r.id];
        let err = (r.energy_j - want).abs();
        covered += usize::from(err <= r.bound_j);
        if err > r.bound_j && std::env::var("SERVING_MISSES").is_ok() {
            eprintln!(
                "miss seed {seed} rate {rate} batch {batch} {prompt:?} {output:?} {}: {:.3} ± {:.3} \
                 vs truth {want:.3} ({:.1} s, {} steps, batch {:.1})",
                r.id,
                r.energy_j,
                r.bound_j,
                r.finish - r.first_step,
                r.steps,
                r.mean_batch
            );
        }
        if check != Check::Coverage {
            assert!(
                err <= r.bound_j,
                "seed {seed}: {r:?}: truth {want}, off by {err}"
            );
        }
        if check == Check::Full && r.finish - r.first_step > 1.0 {
            assert!(err <= 0.05 * want, "seed {seed}: {r:?}: truth {want}");
        }
    }
    // Random schedules: nearly all cover every request. Seeds 1-14 of the property test, 64
    // schedules each: none of 153,268 requests outside its bound (6 before the edges'
    // readings were bounded as guesses and a read of an unchanged value was held to the
    // update the read before it saw; 10 on seeds 1-7 before that); `survey_anchor_placement`
    // seeds 1-3, 224 each: none of 112,796 (2). Fresh seeds 15-28 still find some: a request
    // or two on 3 of 896 schedules, 7-20% past their bounds. The schedules that once missed
    // are held to every request in
    // `schedules_that_once_missed_keep_every_request_within_its_bound`.
    let coverage = covered as f64 / run.records.len() as f64;
    if std::env::var("SERVING_COVERAGE").is_ok() {
        eprintln!(
            "seed {seed}: bounds cover {coverage:.3} of {}",
            run.records.len()
        );
    }
    let misses = run.records.len() - covered;
    assert!(
        coverage >= 0.8 || misses <= 5,
        "seed {seed}: bounds cover only {coverage:.3}"
    );
}

#[test]
fn work_on_the_simulated_gpu_meets_the_acceptance() {
    check_work_on_sim(11, 3.0, 32, (32, 1024), (32, 400), Check::Full);
}

/// Schedules whose requests once missed their bounds, each for a reason in the measurement:
/// a counter read straddling two publishes placed a whole period off by a prediction that
/// the aliased power readings put further off than the publishes are apart (8499), and
/// one-second spans whose edges fell among several steps inside one counter interval, where
/// a prefill between two readings is in neither (895), and a span edge 2 ms before a counter
/// update, where the level solved from the counter put 2.4 J of energy the readings missed
/// (at 1050 W, more than the board draws) after the edge instead of anywhere in the interval
/// (3817), and spans whose edge fell in a counter interval whose power readings, aliasing
/// the steps, predicted twice the energy the counter counted (3331); and a run's last
/// request, alone, whose span could not wait to settle at the ledger's close and took its
/// cuts' sum, which began at an edge extrapolated past a prefill the readings missed (736,
/// 11.6 J over against a bound of 5.1 J), and a one-second span from anchors placed by a lag
/// 9 ms off to anchors snapped to the ticks, the seam between them unmarked (2905); and six
/// requests of a run's first seconds, split by a first fit 40% off and bounded by the
/// covariance of the next, better one (3386: 5-10% under against bounds of 4%); and four
/// requests across a span edge 11 ms into a counter interval whose 27 ms prefill began after
/// the edge, estimated with the prefill's 6 J before it against a bound of 3.6 J, once the
/// weights were exact and no longer widened the bounds (33); and six requests 6-9% over
/// across an edge whose anchor was placed a whole update late, its value told apart from the
/// next update's by a prediction over four updates that the readings' missed bursts left 8 J
/// short (9039); eight requests 12-16% under on a schedule the same change mended (2170); and
/// requests across span edges just before a prefill, where the readings' own energy up to
/// the edge was taken as known: ramped from 99.8 W to 104.4 W across an edge whose load held
/// at 99.2 W (1881: 0.95 J off against 0.74 J), or a stretch between window edges guessed at
/// 122.7 W that held at 120.9 W (1690, 5901; 1-6% past their bounds); and a request whose
/// span began between an anchor and one a whole update late, a read whose value had not
/// moved since the read before it placed at the next publish by a prediction 14 J short
/// (8505: 0.52 J over against 0.47 J).
#[test]
fn schedules_that_once_missed_keep_every_request_within_its_bound() {
    check_work_on_sim(
        8499,
        7.124_511_668_974_867_5,
        24,
        (16, 571),
        (8, 318),
        Check::Bounds,
    );
    check_work_on_sim(
        895,
        2.044_052_152_454_621_6,
        31,
        (16, 507),
        (8, 156),
        Check::Bounds,
    );
    check_work_on_sim(
        3817,
        4.275_124_208_599_439,
        31,
        (16, 164),
        (8, 157),
        Check::Bounds,
    );
    check_work_on_sim(
        3331,
        2.678_253_770_620_899_8,
        20,
        (16, 443),
        (8, 49),
        Check::Bounds,
    );
    check_work_on_sim(
        736,
        1.586_933_988_915_939_5,
        15,
        (16, 1216),
        (8, 150),
        Check::Bounds,
    );
    check_work_on_sim(
        2905,
        1.785_285_375_617_034,
        44,
        (16, 357),
        (8, 316),
        Check::Bounds,
    );
    check_work_on_sim(
        3386,
        7.938_476_358_086_135_5,
        43,
        (16, 1067),
        (8, 491),
        Check::Bounds,
    );
    check_work_on_sim(
        33,
        4.605_607_895_736_13,
        62,
        (16, 440),
        (8, 236),
        Check::Bounds,
    );
    check_work_on_sim(
        9039,
        7.626_066_324_189_592,
        16,
        (16, 506),
        (8, 88),
        Check::Bounds,
    );
    check_work_on_sim(
        2170,
        6.426_668_823_295_36,
        7,
        (16, 1452),
        (8, 24),
        Check::Bounds,
    );
    check_work_on_sim(
        1881,
        1.495_755_578_509_839_3,
        58,
        (16, 171),
        (8, 325),
        Check::Bounds,
    );
    check_work_on_sim(
        1690,
        6.793_186_972_201_828,
        28,
        (16, 200),
        (8, 155),
        Check::Bounds,
    );
    check_work_on_sim(
        5901,
        3.887_144_708_820_184_5,
        37,
        (16, 1234),
        (8, 276),
        Check::Bounds,
    );
    check_work_on_sim(
        8505,
        6.513_821_653_071_617,
        17,
        (16, 723),
        (8, 214),
        Check::Bounds,
    );
}

/// Schedules whose weights were once more than 5% off (three or more standard errors): the
/// sampler had placed stretches of anchors by lags fitted a few milliseconds off the power
/// updates (a serving engine's bursts alias the fit, and window edges at every step match the
/// counter's steps to the wrong edge), with a millisecond's timing error, and the anchored fit
/// read the misplaced energy at each burst as KV-cache or decode work (8865: KV -14%, 5383:
/// KV +116%); and, the sampler's rule at first tightened without the family, lags left
/// unknown whose anchors the fit could not use, fitted on the ledger's own spans instead
/// (8196: prefill -12%, 3444: decode -12%) or placed 27 ms early by a lag from the window
/// edges (8615: prefill -30%); and a lag fit pinned at the top of the calibrated range
/// (100 ms) taken as the family's 101 ms, which put 24 anchors a whole period early (2513:
/// decode -51%, KV +195%); and a lag a whole period long, fitted on the one pair of reads
/// it put where the model knew the power, taken as measured to 1.3 ms, which put 7 s of
/// anchors a period early, 10-24 J each (8163: prefill -17%). Held to everything.
#[test]
fn schedules_whose_anchors_were_once_off_the_ticks_fit_every_weight_within_five_percent() {
    for (seed, rate, batch, prompt, output) in [
        (8865, 0.5, 4, 1045, 149),
        (5383, 1.054_949_251_681_508_9, 5, 814, 49),
        (8196, 3.794_247_922_373_043_6, 8, 497, 153),
        (3444, 1.365_338_140_866_239_7, 4, 946, 16),
        (8615, 0.959_559_517_748_399_1, 4, 64, 159),
        (2513, 1.552_595_700_999_274_4, 27, 582, 234),
        (8163, 6.967_541_107_530_058, 10, 605, 112),
    ] {
        check_work_on_sim(seed, rate, batch, (16, prompt), (8, output), Check::Full);
    }
}

/// On sparse, bursty schedules the anchors the `work` fit rests on sit where the counter's
/// updates are: none more than half a millisecond of idle power off (0.045 J; 8865 and 5383
/// had stretches 3 ms off, 1.0-1.5 J at a prefill, before a counter on the power grid was
/// held to describe the power updates; 2513 had 24 a whole period early, 9.5-14.6 J, before
/// its lag was held to the calibrated range).
#[test]
fn anchors_on_sparse_serving_schedules_sit_on_the_counter_updates() {
    let allowed = serving_model().idle_w * 0.0005;
    assert_anchors_within(
        &[
            (8865, 0.5, 1045, 149, 4),
            (5383, 1.054_949_251_681_508_9, 814, 49, 5),
            (8615, 0.959_559_517_748_399_1, 64, 159, 4),
            (2513, 1.552_595_700_999_274_4, 582, 234, 27),
        ],
        allowed,
    );
}

/// Run each schedule `(seed, rate, largest prompt, largest output, batch)` of
/// [`serving_model`] on the simulated H100 and check that every anchor the sampler kept is
/// within `allowed` J of the truth (the counter's origin taken out).
fn assert_anchors_within(schedules: &[(u64, f64, u32, u32, usize)], allowed: f64) {
    let model = serving_model();
    for &(seed, rate, prompt, output, batch) in schedules {
        let steps = engine(seed, 40.0, rate, (16, prompt), (8, output), batch);
        let run = run_on_sim(&steps, &model, LedgerOptions::default(), seed);
        assert!(
            run.anchors_off.len() > 300,
            "{seed}: {}",
            run.anchors_off.len()
        );
        let worst = run
            .anchors_off
            .iter()
            .map(|x| x.1.abs())
            .fold(0.0, f64::max);
        assert!(worst < allowed, "{seed}: an anchor {worst} J off");
    }
}

/// The random schedules' ranges: engine seed, arrival rate (1/s), batch limit, and the
/// largest prompt and output (tokens), for the property test and the survey alike.
const RANDOM_SEED: std::ops::Range<u64> = 0..10_000;
const RANDOM_RATE: std::ops::Range<f64> = 0.5..8.0;
const RANDOM_BATCH: std::ops::Range<usize> = 4..64;
const RANDOM_PROMPT_MAX: std::ops::Range<u32> = 64..1500;
const RANDOM_OUTPUT_MAX: std::ops::Range<u32> = 16..500;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4))]
    /// Random arrival rates, batch limits and request lengths: conservation, the weights
    /// within [`weight_allowance`], and the requests within their bounds (see
    /// [`check_work_on_sim`] for how many).
    #[test]
    fn work_on_the_simulated_gpu_holds_for_random_schedules(
        seed in RANDOM_SEED,
        rate in RANDOM_RATE,
        batch in RANDOM_BATCH,
        prompt_max in RANDOM_PROMPT_MAX,
        output_max in RANDOM_OUTPUT_MAX,
    ) {
        check_work_on_sim(seed, rate, batch, (16, prompt_max), (8, output_max), Check::Coverage);
    }
}

/// Where the weights and the bounds go wrong on random schedules, anchor by anchor: per
/// schedule, the weights' errors, the sampler's anchors against the truth (rms, and how many
/// are off by more than 5 J: on this H100, at least half a counter period's energy, a value
/// placed at the wrong publish), and what the property test asserts (weights beyond
/// max(5%, 3 standard errors), requests outside their bounds). `SERVING_SURVEY_N` schedules
/// (default 32) from `SERVING_SURVEY_SEED` (default 1); `SERVING_SURVEY_ONLY=<seed>` runs the
/// one with that engine seed, `SERVING_SURVEY_CASE=<seed>,<rate>,<batch>,<prompt>,<output>`
/// one the property test reported; `SERVING_SURVEY_SE=1` adds each schedule's standard errors
/// (% of the truth) and misfit, and the median and 90th percentile of bound / energy.
/// Seen over 448 (seeds 1 and 2, 224 each; 443 distinct, 73,685
/// requests), before and after the publish grid stopped being replaced at every refit (its
/// period compared exactly while the power period's estimate moved by parts per million):
/// anchors more than 5 J off 946 on 88 schedules -> 285 on 34; weights more than 5% off 124
/// on 93 -> 98 on 88; beyond the property test's allowance 3 -> 1; requests outside their
/// bounds 31 on 10 -> 8 on 7; |KV error| p90 9.8% -> 8.7%, worst 223% -> 115%. (On the
/// property test's own draws, seeds 1-7 of 64: beyond the allowance 0 -> 2, outside their
/// bounds 8 on 5 -> 20 on 9, all four weights within 5% on 366 -> 362: schedules whose batch
/// stays full or whose decode and KV work move together are fitted as badly either way, by
/// different small errors in the anchors, and which ones go wrong moves.) Since a counter on
/// the power grid is held to describe the power updates (its lag of the grid's family): a
/// weight more than 5% off on 18 of 672 (129 before; 15 with every anchor at its true moment),
/// beyond the allowance 1, requests outside their bounds 3 on 3; since its lag is held to the
/// calibrated range, 12, 0, and 2 on 2.
#[test]
#[ignore]
fn survey_anchor_placement() {
    let n: u64 = std::env::var("SERVING_SURVEY_N").map_or(32, |v| v.parse().unwrap());
    let first: u64 = std::env::var("SERVING_SURVEY_SEED").map_or(1, |v| v.parse().unwrap());
    let model = serving_model();
    let truth = [model.idle_w, model.a, model.b, model.c];
    eprintln!(
        "seed   rate  batch prompt output | idle% prefill% decode% kv%  | anchors rms J  off>5J \
         | w>3se misses records"
    );
    // One schedule the property test reported: `SERVING_SURVEY_CASE=seed,rate,batch,prompt,output`.
    let case: Option<Vec<f64>> = std::env::var("SERVING_SURVEY_CASE")
        .ok()
        .map(|v| v.split(',').map(|x| x.trim().parse().unwrap()).collect());
    let n = if case.is_some() { 1 } else { n };
    for k in 0..n {
        let mut rng = Pcg64::seed_from_u64(first * 1_000_003 + k);
        let (seed, rate, batch, prompt, output) = match &case {
            Some(c) => (c[0] as u64, c[1], c[2] as usize, c[3] as u32, c[4] as u32),
            None => (
                rng.random_range(RANDOM_SEED),
                rng.random_range(RANDOM_RATE),
                rng.random_range(RANDOM_BATCH),
                rng.random_range(RANDOM_PROMPT_MAX),
                rng.random_range(RANDOM_OUTPUT_MAX),
            ),
        };
        if std::env::var("SERVING_SURVEY_ONLY").is_ok_and(|v| v != seed.to_string()) {
            continue;
        }
        let steps = engine(seed, 40.0, rate, (16, prompt), (8, output), batch);
        let run = run_on_sim(&steps, &model, LedgerOptions::default(), seed);
        let w = run.ledger.weights().expect("fitted");
        let pct: Vec<String> = (0..4)
            .map(|i| format!("{:+6.1}", (w.as_array()[i] / truth[i] - 1.0) * 100.0))
            .collect();
        if std::env::var("SERVING_SURVEY_SE").is_ok() {
            let mut rel: Vec<f64> = run
                .records
                .iter()
                .filter(|r| r.energy_j > 0.0)
                .map(|r| r.bound_j / r.energy_j)
                .collect();
            rel.sort_by(f64::total_cmp);
            if !rel.is_empty() {
                eprintln!(
                    "  bound/energy median {:.4} p90 {:.4}",
                    rel[rel.len() / 2],
                    rel[rel.len() * 9 / 10]
                );
            }
            eprintln!(
                "  se% {:?} rms_rel {:.4} spans {}",
                (0..4)
                    .map(|i| format!("{:.2}", w.std_err[i] / truth[i] * 100.0))
                    .collect::<Vec<_>>(),
                w.rms_rel,
                w.spans
            );
        }
        let off = &run.anchors_off;
        let rms = (off.iter().map(|x| x.1 * x.1).sum::<f64>() / off.len().max(1) as f64).sqrt();
        let far = off.iter().filter(|x| x.1.abs() > 5.0).count();
        // What the property test asserts: weights within max(5%, 3 standard errors), and
        // requests within their bounds.
        let beyond = (0..4)
            .filter(|&i| {
                (w.as_array()[i] - truth[i]).abs() > weight_allowance(truth[i], w.std_err[i])
            })
            .count();
        let misses = run
            .records
            .iter()
            .filter(|r| (r.energy_j - run.truth[&r.id]).abs() > r.bound_j)
            .count();
        eprintln!(
            "{seed:5} {rate:5.2} {batch:5} {prompt:6} {output:6} | {} | {:7} {rms:6.2} {far:6} \
             | {beyond} {misses:3} {:5}",
            pct.join(" "),
            off.len(),
            run.records.len()
        );
    }
}

#[test]
fn anchors_off_takes_out_the_counter_origin_and_finds_a_misplaced_anchor() {
    // 100 W from t = 0: the truth at 0, 1 and 2 s; the counter starts 500 J up; the anchor at
    // 1.5 s holds the value of 1.6 s.
    let truth = [(0.0, 0.0), (1.0, 100.0), (2.0, 200.0)];
    let anchors = [(0.5, 550.0), (1.0, 600.0), (1.5, 660.0), (1.9, 690.0)];
    let off = anchors_off(&anchors, &truth);
    let got: Vec<(f64, f64)> = off
        .iter()
        .map(|&(t, e)| (t, (e * 1e9).round() / 1e9))
        .collect();
    assert_eq!(got, [(0.5, 0.0), (1.0, 0.0), (1.5, 10.0), (1.9, 0.0)]);
    // Outside what the truth covers: no word.
    assert!(anchors_off(&[(2.5, 750.0)], &truth).is_empty());
}

/// On prefill-heavy schedules, the anchors the ledger's `work` fit rests on are where the
/// truth is: none a period off (at the run's lowest power, idle, a period of the H100's
/// counter is 9 J; an anchor placed a publish early or late is off by that or more). Seen on
/// 9160 (short outputs: prefill bursts between the power readings) while the publish grid was
/// replaced at every refit, its phase wandering across the period: 62 of 377 anchors more
/// than 5 J off (decode weight -69%, KV +186%); none since. On 8499: 1.7 J at most then, 3.3 J
/// since (the lag fit moving late in the run: a stretch of anchors 1.6 J off); 19 J with a
/// grid variant that put reads before the publish they were planned after.
#[test]
fn anchors_on_serving_schedules_are_where_the_truth_is() {
    let half_period_idle = 0.5 * serving_model().idle_w * BoardSpec::h100().counter_ms / 1000.0;
    assert_anchors_within(
        &[
            (8499, 7.124_511_668_974_867_5, 571, 318, 24),
            (9160, 6.335_918_696_057_504, 1142, 86, 13),
        ],
        half_period_idle,
    );
}

#[test]
fn a_steady_decode_batch_gets_its_joules_per_token_within_two_percent() {
    // 32 requests decoding together for 20 s: every step alike.
    let model = serving_model();
    let steps = engine(5, 0.01, 3200.0, (1, 1), (600, 600), 32);
    let run = run_on_sim(&steps, &model, LedgerOptions::default(), 5);
    let tokens: f64 = run.records.iter().map(|r| r.output_tokens).sum();
    let energy: f64 = run.records.iter().map(|r| r.energy_j).sum();
    let true_j: f64 = run.truth.values().sum();
    let (got, want) = (energy / tokens, true_j / tokens);
    assert!((got - want).abs() <= 0.02 * want, "{got} vs {want} J/token");
}

#[test]
#[ignore]
fn diagnose_long_run() {
    let seed: u64 = std::env::var("SEED").map_or(8070, |v| v.parse().unwrap());
    let env = |k: &str, d: f64| std::env::var(k).map_or(d, |v| v.parse().unwrap());
    let (rate, batch) = (env("RATE", 8.0), env("BATCH", 4.0) as usize);
    let (prompt, output) = (env("PROMPT", 1500.0) as u32, env("OUTPUT", 500.0) as u32);
    check_work_on_sim(
        seed,
        rate,
        batch,
        (16, prompt),
        (8, output),
        Check::Coverage,
    );
}
