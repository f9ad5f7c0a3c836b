//! Energy-counter arithmetic and number formatting shared by the monitors.

/// Energy consumed between two readings of a counter that is `width_bits` wide (1..=64) and
/// wraps around to zero when it overflows. One wrap between the readings is assumed: the NVML
/// counter is 64 bits of millijoules, which at 1 kW takes half a billion years to wrap, so in
/// practice the result is simply `end - start`; narrower counters (some drivers and the test
/// fakes) do wrap, and the modular difference is then still the energy.
#[inline]
pub fn counter_delta(start: u64, end: u64, width_bits: u32) -> u64 {
    debug_assert!((1..=64).contains(&width_bits));
    let d = end.wrapping_sub(start);
    if width_bits >= 64 {
        d
    } else {
        d & ((1u64 << width_bits) - 1)
    }
}

/// Joules between two readings of a 64-bit millijoule counter (NVML's, AMD SMI's through the
/// backend), or `None` where the counter went back: the second reading below the first by more
/// than a wrap could explain. A wrap from near `u64::MAX` is counted (a fake or narrow counter
/// may do it); anything else below the first reading is a reset (a driver reload) or a stale
/// read (AMD's, read from several threads at once), whose difference is no energy at all,
/// never a negative one or the 18 million terajoules of a wrapping subtraction.
#[inline]
pub fn counter_delta_joules(start_mj: u64, end_mj: u64) -> Option<f64> {
    // 2^50 mJ is 35 years at 1 kW: no window spans more; a value that went back by less than
    // the rest of the range differs by nearly 2^64.
    const MOST: u64 = 1 << 50;
    let d = counter_delta(start_mj, end_mj, 64);
    (d < MOST).then(|| d as f64 / 1000.0)
}

/// Format a float the way Python's `repr(float)` does (`1.0`, `0.1`, `1e-05`, `1e+16`), so log
/// files read the same as the reference's f-string output.
pub fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // The decimal exponent of the shortest round-trip digits decides the form, as in CPython.
    let sci = format!("{x:e}"); // e.g. "1e16", "-1.5e-5"
    let (mant, e) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = e.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let mut s = format!("{x}"); // Display never uses an exponent
        if !s.contains('.') {
            s.push_str(".0");
        }
        s
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn py_float_matches_python_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (123456789.125, "123456789.125"),
            (1700000000.123456, "1700000000.123456"),
            (-2.5, "-2.5"),
            (0.0, "0.0"),
            (1e15, "1000000000000000.0"),
            (3.0e20, "3e+20"),
        ] {
            assert_eq!(py_float(x), want, "{x}");
        }
    }

    #[test]
    fn a_64_bit_counter_going_back_is_no_energy() {
        assert_eq!(counter_delta_joules(1_000, 3_500), Some(2.5));
        assert_eq!(counter_delta_joules(3_500, 3_500), Some(0.0));
        assert_eq!(counter_delta_joules(3_500, 1_000), None);
        assert_eq!(counter_delta_joules(u64::MAX - 999, 1_500), Some(2.5));
    }

    #[test]
    fn counter_wraps() {
        assert_eq!(counter_delta(u64::MAX - 4, 5, 64), 10);
        assert_eq!(counter_delta(250, 4, 8), 10);
        assert_eq!(counter_delta(3, 3, 32), 0);
    }

    proptest! {
        #[test]
        fn delta_recovers_energy_across_wrap(width in 1u32..=64, start in any::<u64>(), delta in any::<u64>()) {
            let mask = if width == 64 { u64::MAX } else { (1u64 << width) - 1 };
            let (start, delta) = (start & mask, delta & mask);
            let end = start.wrapping_add(delta) & mask;
            prop_assert_eq!(counter_delta(start, end, width), delta);
        }

        #[test]
        fn py_float_round_trips(x in any::<f64>().prop_filter("finite", |v| v.is_finite())) {
            let s = py_float(x);
            prop_assert_eq!(s.parse::<f64>().unwrap(), x);
            prop_assert!(s.contains('.') || s.contains('e'), "{} has no point or exponent", s);
        }
    }
}
