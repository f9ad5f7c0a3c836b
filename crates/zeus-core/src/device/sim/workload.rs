//! How a busy simulated GPU behaves: power draw and speed as functions of the power limit and of
//! locked clocks.
//!
//! A [`WorkloadCurve`] holds measured points `(power_limit W, time_per_epoch s, average_power W)`
//! and interpolates between them. The default curve is the median over the 53 (workload, batch
//! size) series of the A40 power trace published with the Zeus paper
//! (`summary_power_a40.csv`), each normalised by its value at the maximum power limit, lightly
//! smoothed to be monotone; it is scaled to a preset's maximum power limit and to one second per
//! unit of work at that limit.
//!
//! Locked clocks: a power limit `p` makes the board settle at a "natural" graphics clock `f_p`.
//! A fraction `COMPUTE_BOUND` of the step time scales with `1/f`, the rest with the memory clock.
//! Inverting the curve's time ratio gives `f_p`; locking the clock at `f < f_p` gives
//! `time = T_max * (α f_max / f + (1 - α) m_max / m)` and dynamic power `∝ (f / f_p)^3`
//! (frequency times voltage squared, voltage roughly proportional to frequency).

use std::path::Path;

/// Share of a training step that is bound by the graphics clock.
pub const COMPUTE_BOUND: f64 = 0.8;

/// `(power limit as a fraction of the maximum, time relative to the maximum limit, average power
/// as a fraction of the maximum limit)`, from the A40 trace (see the module docs).
pub const DEFAULT_NORMALISED_CURVE: &[(f64, f64, f64)] = &[
    (1.0 / 3.0, 2.82, 0.340),
    (5.0 / 12.0, 1.96, 0.392),
    (0.5, 1.33, 0.450),
    (7.0 / 12.0, 1.08, 0.490),
    (2.0 / 3.0, 1.045, 0.550),
    (0.75, 1.015, 0.580),
    (5.0 / 6.0, 1.010, 0.620),
    (11.0 / 12.0, 1.005, 0.650),
    (1.0, 1.0, 0.675),
];

/// One measured point of a workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CurvePoint {
    pub power_limit_w: f64,
    pub time_per_epoch_s: f64,
    pub average_power_w: f64,
}

/// Errors from building a curve.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CurveError {
    #[error("a workload curve needs at least one point")]
    Empty,
    #[error("curve point {index} has a bad {field}: {value} (must be a positive finite number)")]
    BadValue {
        index: usize,
        field: &'static str,
        value: f64,
    },
    #[error("power limit {0} W appears twice in the workload curve")]
    DuplicatePowerLimit(f64),
    #[error("{path}: {message}")]
    Csv { path: String, message: String },
}

/// A workload's behaviour across power limits.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadCurve {
    points: Vec<CurvePoint>, // sorted by power limit, ascending
}

impl WorkloadCurve {
    /// Build from points in any order. Every value must be positive and finite, and power limits
    /// must be distinct.
    pub fn new(mut points: Vec<CurvePoint>) -> Result<WorkloadCurve, CurveError> {
        if points.is_empty() {
            return Err(CurveError::Empty);
        }
        for (index, p) in points.iter().enumerate() {
            for (field, value) in [
                ("power_limit", p.power_limit_w),
                ("time_per_epoch", p.time_per_epoch_s),
                ("average_power", p.average_power_w),
            ] {
                if !(value.is_finite() && value > 0.0) {
                    return Err(CurveError::BadValue {
                        index,
                        field,
                        value,
                    });
                }
            }
        }
        points.sort_by(|a, b| a.power_limit_w.total_cmp(&b.power_limit_w));
        if let Some(w) = points
            .windows(2)
            .find(|w| w[0].power_limit_w == w[1].power_limit_w)
        {
            return Err(CurveError::DuplicatePowerLimit(w[0].power_limit_w));
        }
        Ok(WorkloadCurve { points })
    }

    /// The default curve scaled to a board whose maximum power limit is `max_power_limit_w`,
    /// with one unit of work taking one second at that limit.
    pub fn default_for(max_power_limit_w: f64) -> WorkloadCurve {
        let points = DEFAULT_NORMALISED_CURVE
            .iter()
            .map(|&(frac, t, p)| CurvePoint {
                power_limit_w: frac * max_power_limit_w,
                time_per_epoch_s: t,
                average_power_w: p * max_power_limit_w,
            })
            .collect();
        WorkloadCurve::new(points).expect("the default curve is valid")
    }

    /// Read a CSV with the trace's `power_limit,time_per_epoch,average_power` columns (other
    /// columns are ignored; a file holding several series must be filtered first).
    pub fn from_csv(path: &Path) -> Result<WorkloadCurve, CurveError> {
        let err = |message: String| CurveError::Csv {
            path: path.display().to_string(),
            message,
        };
        let mut reader = csv::Reader::from_path(path).map_err(|e| err(e.to_string()))?;
        let headers = reader.headers().map_err(|e| err(e.to_string()))?.clone();
        let col = |name: &str| {
            headers
                .iter()
                .position(|h| h.trim() == name)
                .ok_or_else(|| err(format!("missing column {name:?} (columns: {headers:?})")))
        };
        let (ipl, it, ip) = (
            col("power_limit")?,
            col("time_per_epoch")?,
            col("average_power")?,
        );
        let mut points = Vec::new();
        for (row, record) in reader.records().enumerate() {
            let record = record.map_err(|e| err(e.to_string()))?;
            let get = |i: usize, name: &str| -> Result<f64, CurveError> {
                let raw = record.get(i).unwrap_or("");
                raw.trim().parse::<f64>().map_err(|_| {
                    err(format!(
                        "row {}: column {name:?} is not a number: {raw:?}",
                        row + 2
                    ))
                })
            };
            points.push(CurvePoint {
                power_limit_w: get(ipl, "power_limit")?,
                time_per_epoch_s: get(it, "time_per_epoch")?,
                average_power_w: get(ip, "average_power")?,
            });
        }
        WorkloadCurve::new(points).map_err(|e| match e {
            CurveError::Csv { .. } => e,
            other => err(other.to_string()),
        })
    }

    pub fn points(&self) -> &[CurvePoint] {
        &self.points
    }

    fn max_point(&self) -> &CurvePoint {
        self.points.last().expect("non-empty")
    }

    /// `(time per unit of work s, average power W)` at power limit `pl_w`, interpolated linearly
    /// and clamped to the measured range. Power never exceeds the limit.
    pub fn at(&self, pl_w: f64) -> (f64, f64) {
        let pts = &self.points;
        let (t, p) = if pl_w <= pts[0].power_limit_w {
            (pts[0].time_per_epoch_s, pts[0].average_power_w)
        } else if pl_w >= self.max_point().power_limit_w {
            let m = self.max_point();
            (m.time_per_epoch_s, m.average_power_w)
        } else {
            let k = pts.partition_point(|q| q.power_limit_w <= pl_w);
            let (a, b) = (&pts[k - 1], &pts[k]);
            let w = (pl_w - a.power_limit_w) / (b.power_limit_w - a.power_limit_w);
            (
                a.time_per_epoch_s + w * (b.time_per_epoch_s - a.time_per_epoch_s),
                a.average_power_w + w * (b.average_power_w - a.average_power_w),
            )
        };
        (t, p.min(pl_w))
    }

    /// Steady state of a busy GPU: `(seconds per unit of work, power W)` at power limit `pl_w`
    /// with the graphics clock capped at `gpu_clock_cap` and the memory clock at `mem_clock_cap`,
    /// both given as fractions of the board's maximum (1.0 = not locked).
    pub fn steady_state(
        &self,
        pl_w: f64,
        idle_w: f64,
        gpu_clock_cap: f64,
        mem_clock_cap: f64,
    ) -> (f64, f64) {
        let (t_p, p_p) = self.at(pl_w);
        let t_max = self.max_point().time_per_epoch_s;
        let ratio = (t_p / t_max).max(1.0);
        // Natural clock at this power limit, as a fraction of the maximum.
        let natural = COMPUTE_BOUND / (ratio - 1.0 + COMPUTE_BOUND);
        let f = gpu_clock_cap.clamp(1e-3, 1.0).min(natural);
        let m = mem_clock_cap.clamp(1e-3, 1.0);
        let time = t_max * (COMPUTE_BOUND / f + (1.0 - COMPUTE_BOUND) / m);
        let dynamic = (p_p - idle_w).max(0.0) * (f / natural).powi(3);
        (time, (idle_w + dynamic).min(pl_w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn default_curve_trades_time_for_power() {
        let c = WorkloadCurve::default_for(300.0);
        let (t_hi, p_hi) = c.at(300.0);
        let (t_lo, p_lo) = c.at(100.0);
        assert_eq!(t_hi, 1.0);
        assert!(t_lo > 2.0 && p_lo < p_hi);
        // Below the curve's range it is clamped, and power never exceeds the limit.
        assert_eq!(c.at(50.0), (2.82, 50.0));
    }

    #[test]
    fn locked_clock_at_natural_frequency_changes_nothing() {
        let c = WorkloadCurve::default_for(300.0);
        let (t, p) = c.at(200.0);
        let (t2, p2) = c.steady_state(200.0, 30.0, 1.0, 1.0);
        assert!((t - t2).abs() < 1e-9, "{t} vs {t2}");
        assert!((p - p2).abs() < 1e-9);
        let (t3, p3) = c.steady_state(200.0, 30.0, 0.5, 1.0);
        assert!(t3 > t2 && p3 < p2);
    }

    #[test]
    fn bad_points_are_named() {
        let bad = WorkloadCurve::new(vec![CurvePoint {
            power_limit_w: 100.0,
            time_per_epoch_s: f64::NAN,
            average_power_w: 1.0,
        }]);
        assert!(matches!(
            bad,
            Err(CurveError::BadValue {
                field: "time_per_epoch",
                ..
            })
        ));
        let p = CurvePoint {
            power_limit_w: 100.0,
            time_per_epoch_s: 1.0,
            average_power_w: 1.0,
        };
        assert_eq!(
            WorkloadCurve::new(vec![p, p]),
            Err(CurveError::DuplicatePowerLimit(100.0))
        );
        assert_eq!(WorkloadCurve::new(vec![]), Err(CurveError::Empty));
    }

    #[test]
    fn reads_trace_csv() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.csv");
        std::fs::write(
            &path,
            "dataset,power_limit,time_per_epoch,average_power\nx,150,2.0,140\nx,100,3.0,95\n",
        )
        .unwrap();
        let c = WorkloadCurve::from_csv(&path).unwrap();
        assert_eq!(c.at(125.0), (2.5, 117.5));
        std::fs::write(&path, "power_limit,time_per_epoch\n100,1\n").unwrap();
        let e = WorkloadCurve::from_csv(&path).unwrap_err().to_string();
        assert!(e.contains("average_power"), "{e}");
        std::fs::write(
            &path,
            "power_limit,time_per_epoch,average_power\n100,abc,1\n",
        )
        .unwrap();
        let e = WorkloadCurve::from_csv(&path).unwrap_err().to_string();
        assert!(e.contains("abc") && e.contains("row 2"), "{e}");
    }

    proptest! {
        #[test]
        fn power_never_exceeds_limit_and_slower_clock_is_never_faster(
            pl in 50.0f64..400.0, f1 in 0.05f64..1.0, f2 in 0.05f64..1.0
        ) {
            let c = WorkloadCurve::default_for(300.0);
            let (ta, pa) = c.steady_state(pl, 30.0, f1.min(f2), 1.0);
            let (tb, pb) = c.steady_state(pl, 30.0, f1.max(f2), 1.0);
            prop_assert!(pa <= pl + 1e-9 && pb <= pl + 1e-9);
            prop_assert!(ta >= tb - 1e-12);
            prop_assert!(pa <= pb + 1e-12);
        }
    }
}
