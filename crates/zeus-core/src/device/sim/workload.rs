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
//!
//! Measured workloads ([`WorkloadCurve::builtin`]) also carry a clock curve: time and power per
//! unit with the SM clock locked, measured at the board's default power limit. With a clock lock
//! they follow it instead of the model above (see [`WorkloadCurve::steady_state`]).

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

/// One measured point of a workload with the SM clock locked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockPoint {
    /// Locked SM clock as a fraction of the board's maximum graphics clock.
    pub clock_fraction: f64,
    pub time_per_unit_s: f64,
    pub average_power_w: f64,
}

/// A clock sweep, measured at one power limit.
#[derive(Debug, Clone, PartialEq)]
pub struct ClockCurve {
    /// The power limit the sweep ran at, W.
    pub power_limit_w: f64,
    points: Vec<ClockPoint>, // sorted by clock, ascending
}

impl ClockCurve {
    /// `(time per unit s, power W)` at a clock `fraction` of the maximum, interpolated linearly
    /// and clamped to the measured range.
    fn at(&self, fraction: f64) -> (f64, f64) {
        let pts = &self.points;
        let first = pts[0];
        let last = pts[pts.len() - 1];
        if fraction <= first.clock_fraction {
            return (first.time_per_unit_s, first.average_power_w);
        }
        if fraction >= last.clock_fraction {
            return (last.time_per_unit_s, last.average_power_w);
        }
        let k = pts.partition_point(|q| q.clock_fraction <= fraction);
        let (a, b) = (pts[k - 1], pts[k]);
        let w = (fraction - a.clock_fraction) / (b.clock_fraction - a.clock_fraction);
        (
            a.time_per_unit_s + w * (b.time_per_unit_s - a.time_per_unit_s),
            a.average_power_w + w * (b.average_power_w - a.average_power_w),
        )
    }

    pub fn points(&self) -> &[ClockPoint] {
        &self.points
    }

    /// The lowest clock fraction at which the sweep draws `power_w` (interpolated; the lowest
    /// measured clock if even that draws more, 1.0 if no clock draws that much).
    fn fraction_drawing(&self, power_w: f64) -> f64 {
        let pts = &self.points;
        if pts[0].average_power_w >= power_w {
            return pts[0].clock_fraction;
        }
        for w in pts.windows(2) {
            let (a, b) = (w[0], w[1]);
            if a.average_power_w < power_w && b.average_power_w >= power_w {
                let x = (power_w - a.average_power_w) / (b.average_power_w - a.average_power_w);
                return a.clock_fraction + x * (b.clock_fraction - a.clock_fraction);
            }
        }
        1.0
    }
}

/// A workload's behaviour across power limits (and, for measured workloads, locked clocks).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadCurve {
    points: Vec<CurvePoint>, // sorted by power limit, ascending
    clock: Option<ClockCurve>,
    /// Whether power is capped at the limit. Synthetic curves are; measured ones keep what the
    /// board drew, which can exceed the limit.
    capped: bool,
}

/// The board the built-in workloads were measured on: an H100 80GB HBM3, whose maximum power
/// limit is 700 W and maximum SM clock 1980 MHz.
const MEASURED_MAX_POWER_W: f64 = 700.0;
const MEASURED_MAX_CLOCK_MHZ: f64 = 1980.0;

/// A workload measured on that board: `(power limit W, s per unit, average W)` for the
/// power-limit sweep (700 to 200 W) and `(SM clock MHz, s per unit, average W)` for the clock
/// sweep at 700 W.
struct MeasuredWorkload {
    name: &'static str,
    description: &'static str,
    power_limits: &'static [(f64, f64, f64)],
    clocks: &'static [(f64, f64, f64)],
}

/// Calibrated from sweeps measured on an H100 (`shared/data/h100/`: one unit of work repeated
/// for 3 s per setting after 1 s of warm-up, energy from the NVML counter).
const MEASURED: &[MeasuredWorkload] = &[
    MeasuredWorkload {
        name: "matmul_bf16",
        description: "20 bf16 8192^3 matmuls (compute-bound; power-capped at the top limit)",
        power_limits: &[
            (700.0, 0.032479, 689.2),
            (650.0, 0.033769, 650.0),
            (600.0, 0.034993, 596.7),
            (550.0, 0.036589, 554.8),
            (500.0, 0.038560, 497.5),
            (450.0, 0.041370, 450.5),
            (400.0, 0.044967, 402.6),
            (350.0, 0.066988, 353.1),
            (300.0, 0.078764, 297.2),
            (250.0, 0.093126, 249.6),
            (200.0, 0.124516, 198.6),
        ],
        clocks: &[
            (1980.0, 0.032642, 705.9),
            (1740.0, 0.032721, 704.4),
            (1500.0, 0.032672, 704.5),
            (1245.0, 0.035351, 608.6),
            (1005.0, 0.043187, 414.1),
            (750.0, 0.061992, 381.0),
        ],
    },
    MeasuredWorkload {
        name: "stream_add_fp32",
        description: "10 out-of-place fp32 adds over 1 GiB tensors (memory-bound)",
        power_limits: &[
            (700.0, 0.007126, 517.7),
            (650.0, 0.007126, 534.7),
            (600.0, 0.007126, 535.7),
            (550.0, 0.007126, 523.0),
            (500.0, 0.007126, 494.8),
            (450.0, 0.007129, 444.8),
            (400.0, 0.007137, 395.4),
            (350.0, 0.007415, 343.8),
            (300.0, 0.008743, 300.2),
            (250.0, 0.010544, 258.2),
            (200.0, 0.010544, 264.4),
        ],
        clocks: &[
            (1980.0, 0.007126, 542.4),
            (1740.0, 0.007126, 499.1),
            (1500.0, 0.007128, 451.0),
            (1245.0, 0.007157, 368.6),
            (1005.0, 0.008606, 308.9),
            (750.0, 0.012485, 242.9),
        ],
    },
    MeasuredWorkload {
        name: "bert_train_step",
        description: "one bf16-autocast AdamW step of an 8-layer, 1024-wide BERT, batch 32 x 512",
        power_limits: &[
            (700.0, 0.039834, 658.1),
            (650.0, 0.040152, 643.4),
            (600.0, 0.041267, 594.0),
            (550.0, 0.042447, 535.1),
            (500.0, 0.044241, 486.9),
            (450.0, 0.045827, 452.3),
            (400.0, 0.047628, 405.6),
            (350.0, 0.052158, 351.3),
            (300.0, 0.058970, 300.9),
            (250.0, 0.075010, 250.9),
            (200.0, 0.108956, 201.4),
        ],
        clocks: &[
            (1980.0, 0.042437, 636.8),
            (1740.0, 0.041916, 582.2),
            (1500.0, 0.045311, 482.9),
            (1245.0, 0.049327, 365.6),
            (1005.0, 0.058452, 292.2),
            (750.0, 0.082732, 239.7),
        ],
    },
];

/// Names of the built-in measured workloads, for `ZEUS_SIM_WORKLOAD` and error messages.
pub fn builtin_names() -> Vec<&'static str> {
    MEASURED.iter().map(|w| w.name).collect()
}

/// `(name, description)` of each built-in measured workload.
pub fn builtin_descriptions() -> Vec<(&'static str, &'static str)> {
    MEASURED.iter().map(|w| (w.name, w.description)).collect()
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
        Ok(WorkloadCurve {
            points,
            clock: None,
            capped: true,
        })
    }

    /// A built-in measured workload (see [`builtin_names`]) on a board whose maximum power limit
    /// is `max_power_limit_w`: power limits and power scale with it; time per unit is as measured.
    pub fn builtin(name: &str, max_power_limit_w: f64) -> Option<WorkloadCurve> {
        let w = MEASURED
            .iter()
            .find(|w| w.name.eq_ignore_ascii_case(name.trim()))?;
        let scale = max_power_limit_w / MEASURED_MAX_POWER_W;
        let points = w
            .power_limits
            .iter()
            .map(|&(pl, t, p)| CurvePoint {
                power_limit_w: pl * scale,
                time_per_epoch_s: t,
                average_power_w: p * scale,
            })
            .collect();
        let mut curve = WorkloadCurve::new(points).expect("built-in curves are valid");
        let mut clocks: Vec<ClockPoint> = w
            .clocks
            .iter()
            .map(|&(mhz, t, p)| ClockPoint {
                clock_fraction: mhz / MEASURED_MAX_CLOCK_MHZ,
                time_per_unit_s: t,
                average_power_w: p * scale,
            })
            .collect();
        clocks.sort_by(|a, b| a.clock_fraction.total_cmp(&b.clock_fraction));
        curve.capped = false;
        curve.clock = Some(ClockCurve {
            power_limit_w: max_power_limit_w,
            points: clocks,
        });
        Some(curve)
    }

    /// The clock sweep of a measured workload, if it has one.
    pub fn clock_curve(&self) -> Option<&ClockCurve> {
        self.clock.as_ref()
    }

    /// Whether power is capped at the limit (see the field).
    pub(crate) fn is_capped(&self) -> bool {
        self.capped
    }

    /// Rebuild a curve from what [`WorkloadCurve::points`], [`WorkloadCurve::clock_curve`] and
    /// [`WorkloadCurve::is_capped`] gave (the shared state file stores curves that way). The
    /// parts must come from a valid curve: nothing is checked again.
    pub(crate) fn from_parts(
        points: Vec<CurvePoint>,
        clock: Option<(f64, Vec<ClockPoint>)>,
        capped: bool,
    ) -> WorkloadCurve {
        WorkloadCurve {
            points,
            clock: clock.map(|(power_limit_w, points)| ClockCurve {
                power_limit_w,
                points,
            }),
            capped,
        }
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
    /// and clamped to the measured range. Power never exceeds the limit, except on measured
    /// curves inside their range, where the measurement stands even when the board overshot
    /// its limit (the H100 drew 264 W at a 200 W limit on a memory-bound workload).
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
        if self.capped || pl_w < pts[0].power_limit_w {
            (t, p.min(pl_w))
        } else {
            (t, p)
        }
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
        let lock = (gpu_clock_cap < 1.0).then_some(gpu_clock_cap);
        self.steady_state_locked(pl_w, idle_w, lock, mem_clock_cap)
    }

    /// The graphics clock a busy GPU settles at under power limit `pl_w` with no lock, as a
    /// fraction of the maximum.
    ///
    /// A measured workload runs at the clock where its clock sweep draws `pl_w` (the driver
    /// lowers the clock until the power fits; on the H100 the matmul workload is capped at
    /// 700 W and runs near 1490 MHz), or at the maximum if it never draws that much. The
    /// synthetic model runs at the clock at which the compute-bound share of an epoch takes the
    /// extra time the limit costs.
    pub fn natural_clock(&self, pl_w: f64) -> f64 {
        if let Some(clock) = &self.clock {
            return clock.fraction_drawing(pl_w);
        }
        let (t_p, _) = self.at(pl_w);
        let ratio = (t_p / self.max_point().time_per_epoch_s).max(1.0);
        COMPUTE_BOUND / (ratio - 1.0 + COMPUTE_BOUND)
    }

    /// [`steady_state`](Self::steady_state) with the SM clock lock given as `Some(fraction)` of
    /// the maximum clock (a lock at the maximum is still a lock: measured workloads then follow
    /// their clock sweep, which was measured separately from the power-limit sweep).
    pub fn steady_state_locked(
        &self,
        pl_w: f64,
        idle_w: f64,
        gpu_lock: Option<f64>,
        mem_clock_cap: f64,
    ) -> (f64, f64) {
        let (t_p, p_p) = self.at(pl_w);
        if let Some(clock) = &self.clock {
            // Measured: the clock sweep stands at its own power limit; below it, whichever of
            // the two constraints binds harder. The memory clock keeps the model's share.
            let m = mem_clock_cap.clamp(1e-3, 1.0);
            let mem_factor = COMPUTE_BOUND + (1.0 - COMPUTE_BOUND) / m;
            let (t, p) = match gpu_lock {
                None => (t_p, p_p),
                Some(f) => {
                    let (t_c, p_c) = clock.at(f.clamp(1e-3, 1.0));
                    if pl_w >= clock.power_limit_w {
                        (t_c, p_c)
                    } else {
                        (t_c.max(t_p), p_c.min(p_p))
                    }
                }
            };
            return (t * mem_factor, p);
        }
        let gpu_clock_cap = gpu_lock.unwrap_or(1.0);
        let t_max = self.max_point().time_per_epoch_s;
        let natural = self.natural_clock(pl_w);
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

    #[test]
    fn measured_workloads_follow_both_sweeps() {
        assert_eq!(
            builtin_names(),
            ["matmul_bf16", "stream_add_fp32", "bert_train_step"]
        );
        let c = WorkloadCurve::builtin("BERT_TRAIN_STEP", 700.0).unwrap();
        // The power-limit sweep, unlocked: 700 W and 200 W as measured.
        let (t, p) = c.steady_state_locked(700.0, 70.0, None, 1.0);
        assert!(
            (t - 0.039834).abs() < 1e-9 && (p - 658.1).abs() < 0.01,
            "{t} {p}"
        );
        let (t, p) = c.steady_state_locked(200.0, 70.0, None, 1.0);
        assert!(
            (t - 0.108956).abs() < 1e-9 && (p - 201.4).abs() < 0.01,
            "{t} {p}"
        );
        // The clock sweep at the default limit, locked at the maximum clock too.
        let (t, p) = c.steady_state_locked(700.0, 70.0, Some(1.0), 1.0);
        assert!(
            (t - 0.042437).abs() < 1e-9 && (p - 636.8).abs() < 0.01,
            "{t} {p}"
        );
        let (t, _) = c.steady_state_locked(700.0, 70.0, Some(750.0 / 1980.0), 1.0);
        assert!((t - 0.082732).abs() < 1e-6, "{t}");
        // A low limit and a high clock: the limit binds.
        let (t, p) = c.steady_state_locked(200.0, 70.0, Some(1.0), 1.0);
        assert!((t - 0.108956).abs() < 1e-9 && (p - 201.4).abs() < 0.01);
        // Memory-bound at 200 W drew more than its limit; a measured curve keeps that.
        let s = WorkloadCurve::builtin("stream_add_fp32", 700.0).unwrap();
        assert!(s.at(200.0).1 > 260.0);
        // Scaled to a 300 W board.
        let a = WorkloadCurve::builtin("matmul_bf16", 300.0).unwrap();
        assert!((a.at(300.0).1 - 689.2 * 300.0 / 700.0).abs() < 0.01);
        assert!(WorkloadCurve::builtin("resnet", 700.0).is_none());
    }

    #[test]
    fn measured_natural_clock_is_where_the_clock_sweep_draws_the_limit() {
        let mhz = |c: &WorkloadCurve, w: f64| c.natural_clock(w) * 1980.0;
        let m = WorkloadCurve::builtin("matmul_bf16", 700.0).unwrap();
        // The sweep draws 608.6 W at 1245 MHz and 704.5 W at 1500 MHz.
        let at700 = mhz(&m, 700.0);
        assert!((at700 - (1245.0 + 255.0 * (700.0 - 608.6) / (704.5 - 608.6))).abs() < 1e-6);
        // 381.0 W at 750 MHz, 414.1 W at 1005 MHz.
        assert!((750.0..1005.0).contains(&mhz(&m, 400.0)));
        // Below the lowest measured clock's power: that clock.
        assert!((mhz(&m, 200.0) - 750.0).abs() < 1e-6);
        // Memory-bound work never draws 700 W: full clock.
        let s = WorkloadCurve::builtin("stream_add_fp32", 700.0).unwrap();
        assert_eq!(s.natural_clock(700.0), 1.0);
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
