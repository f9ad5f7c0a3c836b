//! The Zeus cost metric (NSDI'23, Eq. 2).

/// `η · energy + (1 − η) · max_power · time`: energy in J, time in s, max power in W.
///
/// With η = 1 it is energy; with η = 0 it is time scaled to joules by the maximum power, so the
/// two terms share a unit. The caller checks η (the reference does not check it here either).
#[inline]
pub fn zeus_cost(energy: f64, time: f64, eta_knob: f64, max_power: f64) -> f64 {
    eta_knob * energy + (1.0 - eta_knob) * max_power * time
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extremes_are_energy_and_scaled_time() {
        assert_eq!(zeus_cost(100.0, 2.0, 1.0, 300.0), 100.0);
        assert_eq!(zeus_cost(100.0, 2.0, 0.0, 300.0), 600.0);
        assert_eq!(zeus_cost(100.0, 2.0, 0.5, 300.0), 350.0);
    }
}
