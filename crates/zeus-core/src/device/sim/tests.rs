use super::super::error;
use super::*;
use proptest::prelude::*;

fn cluster(keys: &[&str]) -> SimCluster {
    SimCluster::new(SimConfig {
        presets: keys.iter().map(|k| preset::find(k).unwrap()).collect(),
        virtual_clock: true,
        fidelity: Fidelity::Ideal,
        ..SimConfig::default()
    })
}

#[test]
fn names_say_simulated_and_uuids_differ() {
    let c = cluster(&["A40", "A40"]);
    assert!(c.devices()[0].name().unwrap().contains("Simulated"));
    assert_ne!(
        c.devices()[0].uuid().unwrap(),
        c.devices()[1].uuid().unwrap()
    );
    assert!(c.devices()[0].uuid().unwrap().starts_with("GPU-"));
}

#[test]
fn energy_grows_faster_under_load_and_at_higher_limit() {
    let c = cluster(&["A40", "A40"]);
    let (a, b) = (&c.devices()[0], &c.devices()[1]);
    b.set_power_management_limit(150_000).unwrap();
    let e0 = (
        a.total_energy_consumption().unwrap(),
        b.total_energy_consumption().unwrap(),
    );
    c.clock().advance(10.0);
    let idle = a.total_energy_consumption().unwrap() - e0.0;
    assert_eq!(idle, 300_000); // 30 W idle for 10 s
    a.set_load(Load::Busy);
    b.set_load(Load::Busy);
    let e1 = (
        a.total_energy_consumption().unwrap(),
        b.total_energy_consumption().unwrap(),
    );
    c.clock().advance(10.0);
    let da = a.total_energy_consumption().unwrap() - e1.0;
    let db = b.total_energy_consumption().unwrap() - e1.1;
    assert!(da > idle && db > idle && da > db, "{da} {db}");
}

#[test]
fn run_is_busy_then_idle_and_slower_at_low_limit() {
    let c = cluster(&["V100"]);
    let g = &c.devices()[0];
    let t_fast = c.run(&[0], 2.0).unwrap();
    assert!((t_fast - 2.0).abs() < 1e-9);
    g.set_power_management_limit(100_000).unwrap();
    let t_slow = c.run(&[0], 2.0).unwrap();
    assert!(t_slow > t_fast);
    assert_eq!(g.load(), Load::Idle);
    let e = g.true_energy_j();
    c.clock().advance(1.0);
    assert!((g.true_energy_j() - e - 25.0).abs() < 1e-6);
}

#[test]
fn current_clocks_follow_load_power_limit_and_locks() {
    let c = cluster(&["A40"]);
    let g = &c.devices()[0];
    let p = g.preset();
    let (min, max) = (p.min_graphics_clock_mhz, p.max_graphics_clock_mhz);
    assert_eq!(g.current_clocks_mhz().unwrap(), (min, 7251), "idle");
    g.set_load(Load::Busy);
    assert_eq!(g.current_clocks_mhz().unwrap(), (max, 7251));
    // Lower limits slow the clock, never speed it up, and every clock is a supported one.
    let supported = p.graphics_clocks_mhz();
    let mut last = max;
    for w in (100..=300).rev().step_by(20) {
        g.set_power_management_limit(w * 1000).unwrap();
        let (f, _) = g.current_clocks_mhz().unwrap();
        assert!(f <= last && supported.contains(&f), "{w} W: {f} MHz");
        last = f;
    }
    assert!(last < max, "the lowest limit slows the clock: {last}");
    g.reset_power_management_limit().unwrap();
    g.set_gpu_locked_clocks(900, 1200).unwrap();
    g.set_memory_locked_clocks(405, 810).unwrap();
    assert_eq!(g.current_clocks_mhz().unwrap(), (1200, 810));
    g.set_load(Load::Idle);
    assert_eq!(
        g.current_clocks_mhz().unwrap(),
        (900, 810),
        "idle at the lock's floor"
    );
    assert_eq!(g.pci_bus_id().unwrap(), "00000000:01:00.0");
}

#[test]
fn measured_matmul_runs_power_capped_below_the_maximum_clock() {
    // On the H100 the matmul workload draws 700 W near 1490 MHz: at its default limit it
    // runs there, not at 1980 MHz, and a lock above that changes nothing.
    let c = SimCluster::new(SimConfig {
        presets: vec![preset::find("H100").unwrap()],
        virtual_clock: true,
        fidelity: Fidelity::Ideal,
        workload: Some(Workload::Builtin("matmul_bf16")),
        load: Load::Busy,
        ..SimConfig::default()
    });
    let g = &c.devices()[0];
    assert_eq!(g.current_clocks_mhz().unwrap().0, 1485);
    assert_eq!(g.clock_event_reasons(), CLOCK_EVENT_SW_POWER_CAP);
    g.set_gpu_locked_clocks(1500, 1980).unwrap();
    assert_eq!(g.current_clocks_mhz().unwrap().0, 1485);
    assert_eq!(g.clock_event_reasons(), CLOCK_EVENT_SW_POWER_CAP);
    // A lock below where the limit holds it: the lock, not the power cap, sets the clock.
    g.set_gpu_locked_clocks(1005, 1005).unwrap();
    assert_eq!(g.current_clocks_mhz().unwrap().0, 1005);
    assert_eq!(g.clock_event_reasons(), 0);
    g.set_load(Load::Idle);
    assert_eq!(g.clock_event_reasons(), CLOCK_EVENT_GPU_IDLE);
}

#[test]
fn p100_has_no_energy_counter() {
    let c = cluster(&["P100"]);
    assert!(matches!(
        c.devices()[0].total_energy_consumption(),
        Err(GpuError::NotSupported(_))
    ));
    assert!(!c.devices()[0].supports_total_energy_consumption().unwrap());
    assert!(c.devices()[0].set_gpu_locked_clocks(600, 900).is_err());
}

#[test]
fn unprivileged_setters_are_refused() {
    let c = SimCluster::new(SimConfig {
        presets: vec![preset::find("A100").unwrap()],
        virtual_clock: true,
        privileged: false,
        fidelity: Fidelity::Ideal,
        ..SimConfig::default()
    });
    let e = c.devices()[0]
        .set_power_management_limit(200_000)
        .unwrap_err();
    assert!(matches!(e, GpuError::NoPermission(_)));
    assert_eq!(c.devices()[0].power_management_limit().unwrap(), 400_000);
}

#[test]
fn average_power_is_constant_within_an_update_period_and_noisy_across() {
    let c = cluster(&["A40"]);
    let g = &c.devices()[0];
    g.set_load(Load::Busy);
    // Align to the start of a period.
    let now = c.clock().now();
    c.clock().advance((now / 0.1).ceil() * 0.1 - now + 0.001);
    let a = g.average_power_usage().unwrap();
    c.clock().advance(0.05);
    assert_eq!(a, g.average_power_usage().unwrap());
    let readings: std::collections::BTreeSet<u32> = (0..20)
        .map(|_| {
            c.clock().advance(0.1);
            g.average_power_usage().unwrap()
        })
        .collect();
    assert!(readings.len() > 5);
    let truth = g.true_power_w() * 1000.0;
    assert!(readings
        .iter()
        .all(|&r| (r as f64 - truth).abs() <= truth * 0.0101));
}

#[test]
fn a_set_power_draw_adds_its_watts_times_time() {
    let c = cluster(&["A40"]);
    let g = &c.devices()[0];
    g.set_power_draw(123.0).unwrap();
    assert_eq!(g.load(), Load::Drawing(123.0));
    assert_eq!(g.true_power_w(), 123.0);
    assert_eq!(g.instant_power_usage().unwrap(), 123_000);
    // Above the A40's 30 W idle: busy, as utilisation and clocks say.
    assert!(g.is_busy());
    assert_eq!(g.utilization_rates().unwrap().gpu, 100);
    assert_eq!(
        g.current_clocks_mhz().unwrap().0,
        g.preset().max_graphics_clock_mhz
    );
    let (e0, c0) = (g.true_energy_j(), g.total_energy_consumption().unwrap());
    c.clock().advance(2.0);
    let e = g.true_energy_j() - e0;
    assert!((e - 246.0).abs() < 1e-9, "{e}");
    // The counter truncates to whole mJ: its difference is within 1 mJ of the truth.
    let counted = g.total_energy_consumption().unwrap() - c0;
    assert!(counted.abs_diff(246_000) <= 1, "{counted}");

    // No more than idle power: drawing, but not busy.
    g.set_power_draw(20.0).unwrap();
    assert!(!g.is_busy());
    assert_eq!(g.load(), Load::Drawing(20.0));
    assert_eq!(g.utilization_rates().unwrap().gpu, 0);
    let e0 = g.true_energy_j();
    c.clock().advance(1.0);
    assert!((g.true_energy_j() - e0 - 20.0).abs() < 1e-9);
    // Another load replaces it.
    g.set_load(Load::Idle);
    assert_eq!(g.true_power_w(), 30.0);
}

#[test]
fn a_set_power_draw_is_clamped_to_the_limit_of_the_moment() {
    let c = cluster(&["A40"]);
    let g = &c.devices()[0];
    g.set_power_draw(1000.0).unwrap();
    assert_eq!(g.true_power_w(), 300.0, "the A40's 300 W limit");
    let e0 = g.true_energy_j();
    c.clock().advance(1.0);
    g.set_power_management_limit(150_000).unwrap();
    assert_eq!(g.true_power_w(), 150.0);
    c.clock().advance(1.0);
    // The first second at the limit then, the next at the lower one.
    let e = g.true_energy_j() - e0;
    assert!((e - 450.0).abs() < 1e-9, "{e}");
    // What was asked for stays asked: a higher limit lets the board draw more again.
    assert_eq!(g.load(), Load::Drawing(1000.0));
    g.set_power_management_limit(250_000).unwrap();
    assert_eq!(g.true_power_w(), 250.0);
    g.set_power_draw(0.0).unwrap();
    assert_eq!(g.true_power_w(), 0.0);
    // `set_load` takes any number: a NaN draws nothing rather than poisoning the integral.
    g.set_load(Load::Drawing(f64::NAN));
    let e0 = g.true_energy_j();
    c.clock().advance(1.0);
    assert_eq!(g.true_power_w(), 0.0);
    assert_eq!(g.true_energy_j(), e0);
}

#[test]
fn a_bad_power_draw_is_refused_and_changes_nothing() {
    let c = cluster(&["A40"]);
    let g = &c.devices()[0];
    g.set_load(Load::Busy);
    for bad in [-1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        match g.set_power_draw(bad) {
            Err(GpuError::InvalidArg(m)) => assert!(m.contains(&format!("{bad} W")), "{m}"),
            other => panic!("{bad}: {other:?}"),
        }
        assert_eq!(g.load(), Load::Busy);
    }
}

#[test]
fn real_readings_follow_a_set_power_draw() {
    // A coarse counter, so that "within its resolution" says something.
    let c = h100_board(BoardKnobs {
        counter_resolution_mj: Some(100),
        ..BoardKnobs::default()
    });
    let g = &c.devices()[0];
    assert_eq!(g.fidelity(), Fidelity::Real);
    c.clock().advance(1.0);
    g.set_power_draw(123.0).unwrap();
    // Past an update period, the counter's lag and the average's window.
    c.clock().advance(1.5);
    let e0 = g.true_energy_j();
    let (c0, t0) = g.energy_reading().unwrap();
    c.clock().advance(2.0);
    let e = g.true_energy_j() - e0;
    assert!((e - 246.0).abs() < 1e-9, "{e}");
    let (c1, t1) = g.energy_reading().unwrap();
    // The counter describes its own updates: 2 s apart (to a period), 123 W between them.
    assert!((t1 - t0 - 2.0).abs() < g.board().counter_period_s + 1e-9);
    let want = 123.0 * (t1 - t0) * 1000.0;
    let counted = (c1 - c0) as f64;
    assert!(
        (counted - want).abs() <= 100.0 + 1e-6,
        "{counted} vs {want}"
    );
    let noise = 1.0 + g.board().power_noise + 1e-6;
    for instant in [true, false] {
        let w = g.power_reading(instant).unwrap().0 as f64 / 1000.0;
        assert!(w <= 123.0 * noise && w >= 123.0 / noise, "{instant}: {w}");
    }
    assert!(g.reading_busy());
    // The limit clamps the readings too, from the update after the change.
    g.set_power_management_limit(200_000).unwrap();
    c.clock().advance(0.2);
    let w = g.instant_power_usage().unwrap() as f64 / 1000.0;
    assert!(
        w <= 123.0 * noise && w >= 123.0 / noise,
        "{w}: 123 W is under 200 W"
    );
    g.set_power_draw(500.0).unwrap();
    c.clock().advance(0.2);
    let w = g.instant_power_usage().unwrap() as f64 / 1000.0;
    assert!(w <= 200.0 * noise && w >= 200.0 / noise, "{w}");
}

fn real_h100(virtual_clock: bool) -> SimCluster {
    SimCluster::new(SimConfig {
        presets: vec![preset::find("H100").unwrap()],
        virtual_clock,
        ..SimConfig::default()
    })
}

/// Advance the virtual clock to just after this device's next update.
fn to_next_tick(c: &SimCluster, g: &SimGpu) {
    let now = c.clock().now();
    let (t, _) = g.last_tick(now);
    c.clock()
        .advance(t + g.preset.power_update_period_s - now + 1e-4);
}

#[test]
fn real_readings_change_once_per_update_period() {
    let c = real_h100(true);
    let g = &c.devices()[0];
    assert_eq!(g.fidelity(), Fidelity::Real);
    assert!(g.name().unwrap().contains("H100"));
    g.set_load(Load::Busy);
    to_next_tick(&c, g);
    // Past the counter's delay, so that all three readings belong to this update.
    c.clock().advance(0.02);
    let read = |g: &SimGpu| {
        (
            g.total_energy_consumption().unwrap(),
            g.instant_power_usage().unwrap(),
            g.average_power_usage().unwrap(),
        )
    };
    let first = read(g);
    for _ in 0..7 {
        c.clock().advance(0.01);
        assert_eq!(read(g), first, "no change within an update period");
    }
    let mut changes = [0; 3];
    let mut last = read(g);
    for _ in 0..100 {
        c.clock().advance(0.01);
        let r = read(g);
        changes[0] += usize::from(r.0 != last.0);
        changes[1] += usize::from(r.1 != last.1);
        changes[2] += usize::from(r.2 != last.2);
        last = r;
    }
    assert_eq!(changes, [10; 3], "ten updates in one second");
}

#[test]
fn real_counter_publishes_the_last_update_late() {
    let c = real_h100(true);
    let g = &c.devices()[0];
    to_next_tick(&c, g);
    let (tick, _) = g.last_tick(c.clock().now());
    g.set_load(Load::Busy); // a step just after the update
    let e_tick = g.state().energy_at_past(g.preset, tick);
    c.clock().advance(0.05);
    let counter = g.total_energy_consumption().unwrap() as f64 / 1000.0;
    assert!((counter - e_tick).abs() < 1e-3, "{counter} vs {e_tick}");
    assert!(
        g.true_energy_j() - counter > 30.0,
        "50 ms of busy power not counted yet"
    );
    // The next update shows up only `counter_delay_s` after it happens.
    let next = tick + g.preset.power_update_period_s;
    c.clock()
        .advance(next + g.preset.counter_delay_s / 2.0 - c.clock().now());
    assert_eq!(
        g.total_energy_consumption().unwrap() as f64 / 1000.0,
        counter
    );
    c.clock().advance(g.preset.counter_delay_s);
    let e_next = g.state().energy_at_past(g.preset, next);
    let counter = g.total_energy_consumption().unwrap() as f64 / 1000.0;
    assert!((counter - e_next).abs() < 1e-3, "{counter} vs {e_next}");
}

#[test]
fn real_average_power_lags_a_step_and_instant_does_not() {
    let c = real_h100(true);
    let g = &c.devices()[0];
    c.clock().advance(3.0);
    g.set_load(Load::Busy);
    let busy = g.true_power_w();
    c.clock().advance(0.25);
    let instant = g.instant_power_usage().unwrap() as f64 / 1000.0;
    let average = g.average_power_usage().unwrap() as f64 / 1000.0;
    assert!((instant - busy).abs() < 0.011 * busy, "{instant} vs {busy}");
    assert!(
        average < 0.5 * busy,
        "a 1 s average 0.25 s after the step: {average}"
    );
    c.clock().advance(1.2);
    let average = g.average_power_usage().unwrap() as f64 / 1000.0;
    assert!((average - busy).abs() < 0.011 * busy, "{average} vs {busy}");
}

#[test]
fn real_energy_read_costs_cpu_on_the_real_clock() {
    let c = real_h100(false);
    let g = &c.devices()[0];
    let t = std::time::Instant::now();
    for _ in 0..3 {
        g.total_energy_consumption().unwrap();
    }
    let spent = t.elapsed().as_secs_f64() / 3.0;
    assert!(spent >= g.preset.energy_read_cost_s, "{spent}");
    let t = std::time::Instant::now();
    for _ in 0..100 {
        g.instant_power_usage().unwrap();
    }
    assert!(t.elapsed().as_secs_f64() / 100.0 < 1e-3);
}

#[test]
fn workload_by_name_and_the_h100_default() {
    let c = real_h100(true);
    let (t, p) = c.devices()[0].busy_steady_state();
    assert!((t - 0.039834).abs() < 1e-9 && (p - 658.1).abs() < 1e-6);
    assert_eq!(
        Workload::parse("Stream_Add_FP32").unwrap(),
        Workload::Builtin("stream_add_fp32")
    );
    let e = Workload::parse("/no/such.csv").unwrap_err().to_string();
    assert!(
        e.contains("bert_train_step") && e.contains("/no/such.csv"),
        "{e}"
    );
}

fn h100_board(knobs: BoardKnobs) -> SimCluster {
    SimCluster::new(SimConfig {
        presets: vec![preset::find("H100").unwrap()],
        virtual_clock: true,
        board: knobs,
        ..SimConfig::default()
    })
}

#[test]
fn a_counter_on_its_own_grid_publishes_late_in_steps_of_its_resolution() {
    let c = h100_board(BoardKnobs {
        counter_period_s: Some(0.05),
        counter_lag_s: Some(0.07),
        counter_resolution_mj: Some(500),
        ..BoardKnobs::default()
    });
    let g = &c.devices()[0];
    g.set_load(Load::Busy);
    c.clock().advance(1.0);
    let mut changes = Vec::new();
    let mut last = g.energy_reading().unwrap();
    for _ in 0..1000 {
        c.clock().advance(0.001);
        let r = g.energy_reading().unwrap();
        assert_eq!(r.0 % 500, 0, "resolution");
        if r.0 != last.0 {
            // Published exactly at an update plus the lag, and it is the energy then.
            assert!((r.1 - c.clock().now()).abs() <= 0.001 + 1e-9, "{r:?}");
            let update = r.1 - 0.07;
            let truth = g.state().energy_at_past(g.preset, update) * 1000.0;
            assert!((r.0 as f64 - truth).abs() <= 500.0, "{} vs {truth}", r.0);
            changes.push(r.1);
        }
        last = r;
    }
    assert!((19..=21).contains(&changes.len()), "{changes:?}");
    assert!(changes
        .windows(2)
        .all(|w| (w[1] - w[0] - 0.05).abs() < 0.0015));
}

#[test]
fn faults_fail_the_chosen_calls_for_their_time_and_resets_restart_the_counter() {
    let c = h100_board(BoardKnobs {
        faults: board::parse_faults("energy@0.5+0.3;power@1+inf=TIMEOUT").unwrap(),
        ..BoardKnobs::default()
    });
    let g = &c.devices()[0];
    assert!(g.total_energy_consumption().is_ok());
    c.clock().advance(0.6);
    assert!(matches!(
        g.total_energy_consumption(),
        Err(GpuError::GpuLost(_))
    ));
    assert!(g.instant_power_usage().is_ok());
    assert!(g.power_management_limit().is_ok());
    c.clock().advance(0.3);
    let before = g.total_energy_consumption().unwrap();
    assert!(before > 0);
    c.clock().advance(0.2);
    let e = g.instant_power_usage().unwrap_err();
    assert!(
        matches!(e, GpuError::Timeout(_)) && e.to_string().contains("simulated"),
        "{e}"
    );
    c.clock().advance(100.0);
    assert!(g.average_power_usage().is_err(), "gone for good");
    let before = g.total_energy_consumption().unwrap();
    g.reset_counter();
    c.clock().advance(1.0);
    let after = g.total_energy_consumption().unwrap();
    assert!(
        after < before / 10,
        "{after} after a reset, {before} before"
    );
    g.inject_fault(Fault {
        calls: board::calls::OTHER,
        from: c.clock().now(),
        until: c.clock().now() + 1.0,
        code: error::nvml_code::UNKNOWN,
        gpu: None,
    });
    assert!(matches!(g.temperature_c(), Err(GpuError::Unknown(_))));
    assert!(g.total_energy_consumption().is_ok());
}

#[test]
fn field_timestamps_say_when_the_value_was_updated_or_when_it_was_read() {
    let c = h100_board(BoardKnobs::default());
    let g = &c.devices()[0];
    c.clock().advance(0.5);
    let a = g.power_sample(true).unwrap();
    c.clock().advance(0.003);
    let b = g.power_sample(true).unwrap();
    let (tick, _) = g.last_tick(c.clock().now());
    if b.timestamp == a.timestamp {
        assert_eq!(b.timestamp, Some(tick));
    }
    let c2 = h100_board(BoardKnobs {
        field_timestamps: Some(FieldTimestamps::Call),
        instant_power: Some(false),
        ..BoardKnobs::default()
    });
    let g = &c2.devices()[0];
    assert!(
        g.power_sample(true).is_err(),
        "no instant power on this board"
    );
    let s = g.power_sample(false).unwrap();
    assert_eq!(s.timestamp, Some(c2.clock().now()));
}

proptest! {
    #[test]
    fn counter_is_monotonic_under_any_schedule(
        ops in proptest::collection::vec((0u8..6, 0.0f64..5.0, 100u32..300), 1..40)
    ) {
        let c = cluster(&["A40"]);
        let g = &c.devices()[0];
        let mut last = g.total_energy_consumption().unwrap();
        for (op, dt, pl) in ops {
            match op {
                0 => g.set_load(Load::Busy),
                1 => g.set_load(Load::Idle),
                2 => { g.start_work(dt); }
                3 => { g.set_power_management_limit(pl * 1000).unwrap(); }
                // Up to 450 W: the limit clamps what is above it.
                4 => { g.set_power_draw(f64::from(pl) * 1.5).unwrap(); }
                _ => {}
            }
            c.clock().advance(dt);
            let now = g.total_energy_consumption().unwrap();
            prop_assert!(now >= last);
            // Never more than the maximum limit over the time that passed, plus the counter's
            // flooring to whole millijoules at both reads (seen: 425,481 mJ over 1.418 s at
            // exactly 300 W, whose energy floats put a hair above 425,480).
            prop_assert!((now - last) as f64 <= 300.0 * dt * 1000.0 + 2.0);
            last = now;
        }
    }

    #[test]
    fn set_get_round_trip_and_range_rule(pl in 0u32..500_000) {
        let c = cluster(&["A40"]);
        let g = &c.devices()[0];
        let r = g.set_power_management_limit(pl);
        if (100_000..=300_000).contains(&pl) {
            prop_assert!(r.is_ok());
            prop_assert_eq!(g.power_management_limit().unwrap(), pl);
        } else {
            prop_assert!(matches!(r, Err(GpuError::InvalidArg(_))));
            prop_assert_eq!(g.power_management_limit().unwrap(), 300_000);
        }
    }
}
