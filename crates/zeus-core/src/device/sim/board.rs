//! How a simulated board's driver times and shapes its readings, and the faults it can be told
//! to have: the knobs that make one model stand for the boards the sampler must cope with.
//!
//! Every preset has its measured or published timing ([`super::preset`]); the `ZEUS_SIM_*`
//! variables below override it for every simulated GPU of the process (both faces: in process
//! and the simulated `libnvidia-ml.so.1`), so a test can turn the calibrated H100 into a V100
//! that updates every 20 ms, a board whose counter lags 70 ms, one without instant power, or
//! one whose driver fails for a while:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `ZEUS_SIM_POWER_PERIOD_MS` | update period of both power readings | the preset's |
//! | `ZEUS_SIM_COUNTER_PERIOD_MS` | update period of the energy counter | the power period |
//! | `ZEUS_SIM_COUNTER_LAG_MS` | how long after its update the counter shows it | the preset's |
//! | `ZEUS_SIM_POWER_NOISE` | relative amplitude of the power readings' noise (0-0.2) | 0.01 |
//! | `ZEUS_SIM_COUNTER_RESOLUTION_MJ` | the counter moves in steps of this many mJ | 1 |
//! | `ZEUS_SIM_INSTANT_POWER` | `1`/`0`: whether the instant power field exists | the preset's |
//! | `ZEUS_SIM_AVERAGE_WINDOW_MS` | window of `nvmlDeviceGetPowerUsage` (0: not averaged) | the preset's |
//! | `ZEUS_SIM_FIELD_TIMESTAMP` | `update`: field values carry the time of their update; `call`: the time of the call | `update` |
//! | `ZEUS_SIM_AVERAGE_POWER` | `1`/`0`: whether the averaged power reading exists | the preset's |
//! | `ZEUS_SIM_COUNTER_SCALE` | the counter counts this many times the energy (a wrong resolution: MI210's counted 1/15 of it) | 1 |
//! | `ZEUS_SIM_COUNTER_BACKWARDS` | `1`: every fifth counter read returns the value of 0.25 s before (amdsmi#115) | `0` |
//! | `ZEUS_SIM_COUNTER_FROZEN` | `1`: the counter stops where it stands when the device is made (MI100, amdsmi#38) | `0` |
//! | `ZEUS_SIM_COUNTER_RESETS` | seconds after start at which every counter resets to 0 | none |
//! | `ZEUS_SIM_FAULTS` | a fault schedule, see [`parse_faults`] | none |
//!
//! With a counter period equal to the power period the counter updates at the power readings'
//! updates (as the measured H100 does); with another period it runs on a grid of its own, at a
//! per-device phase.

use super::super::error::nvml_code;
use super::super::{GpuError, GpuResult};
use super::preset::Preset;

/// What a field value's `timestamp` says (`nvmlFieldValue_t`: "CPU Timestamp of this value").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldTimestamps {
    /// The moment the driver updated the value (what the sampler can time updates with).
    #[default]
    Update,
    /// The moment of the call (a driver whose timestamps say nothing about updates).
    Call,
}

/// The timing and quirks of one simulated board at real fidelity.
#[derive(Debug, Clone, PartialEq)]
pub struct Board {
    /// Update period of the instant and average power readings, s.
    pub power_period_s: f64,
    /// Update period of the energy counter, s.
    pub counter_period_s: f64,
    /// How long after its update the counter shows it, s.
    pub counter_lag_s: f64,
    /// Relative amplitude of the uniform noise on power readings.
    pub power_noise: f64,
    /// The counter moves in steps of this many mJ.
    pub counter_resolution_mj: u64,
    /// Whether `NVML_FI_DEV_POWER_INSTANT` exists.
    pub instant_power: bool,
    /// Whether the averaged power reading exists.
    pub average_power: bool,
    /// Trailing window of the average power, s (0: the instantaneous sample at the update).
    pub average_window_s: f64,
    pub field_timestamps: FieldTimestamps,
    /// The counter counts this many times the energy drawn (1: right).
    pub counter_scale: f64,
    /// Every fifth counter read returns the value of [`BACKWARDS_BY_S`] before.
    pub counter_backwards: bool,
}

/// How stale a backwards counter read is, s.
pub const BACKWARDS_BY_S: f64 = 0.25;

impl Board {
    /// The preset's own timing.
    pub fn of(preset: &Preset) -> Board {
        Board {
            power_period_s: preset.power_update_period_s,
            counter_period_s: preset.power_update_period_s,
            counter_lag_s: preset.counter_delay_s,
            power_noise: DEFAULT_POWER_NOISE,
            counter_resolution_mj: 1,
            instant_power: preset.instant_power,
            average_power: preset.average_power,
            average_window_s: preset.average_window_s,
            field_timestamps: FieldTimestamps::Update,
            counter_scale: 1.0,
            counter_backwards: false,
        }
    }

    /// Whether the counter updates at the power readings' updates.
    pub fn counter_on_power_grid(&self) -> bool {
        (self.counter_period_s - self.power_period_s).abs() < 1e-9
    }

    /// How much past a device must remember to answer readings about it.
    pub fn history_span(&self) -> f64 {
        let backwards = if self.counter_backwards {
            BACKWARDS_BY_S
        } else {
            0.0
        };
        self.average_window_s
            + backwards
            + 2.0 * self.power_period_s.max(self.counter_period_s)
            + self.counter_lag_s
            + 0.5
    }
}

/// Relative amplitude of the power readings' noise unless `ZEUS_SIM_POWER_NOISE` says otherwise.
pub const DEFAULT_POWER_NOISE: f64 = 0.01;

/// Overrides of every board's timing (unset fields keep the preset's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BoardKnobs {
    pub power_period_s: Option<f64>,
    pub counter_period_s: Option<f64>,
    pub counter_lag_s: Option<f64>,
    pub power_noise: Option<f64>,
    pub counter_resolution_mj: Option<u64>,
    pub instant_power: Option<bool>,
    pub average_window_s: Option<f64>,
    pub field_timestamps: Option<FieldTimestamps>,
    pub average_power: Option<bool>,
    pub counter_scale: Option<f64>,
    pub counter_backwards: bool,
    /// The counter stops where it stands when the devices are made.
    pub counter_frozen: bool,
    /// Seconds after the devices are made at which every counter resets to 0.
    pub counter_resets_s: Vec<f64>,
    /// Faults, in seconds after the devices are made.
    pub faults: Vec<Fault>,
}

impl BoardKnobs {
    /// `preset`'s board with these overrides.
    pub fn board_for(&self, preset: &Preset) -> Board {
        let mut b = Board::of(preset);
        if let Some(p) = self.power_period_s {
            b.power_period_s = p;
            b.counter_period_s = p;
        }
        if let Some(p) = self.counter_period_s {
            b.counter_period_s = p;
        }
        if let Some(l) = self.counter_lag_s {
            b.counter_lag_s = l;
        }
        if let Some(n) = self.power_noise {
            b.power_noise = n;
        }
        if let Some(r) = self.counter_resolution_mj {
            b.counter_resolution_mj = r;
        }
        if let Some(i) = self.instant_power {
            b.instant_power = i;
        }
        if let Some(w) = self.average_window_s {
            b.average_window_s = w;
        }
        if let Some(f) = self.field_timestamps {
            b.field_timestamps = f;
        }
        if let Some(a) = self.average_power {
            b.average_power = a;
        }
        if let Some(k) = self.counter_scale {
            b.counter_scale = k;
        }
        b.counter_backwards = self.counter_backwards;
        b
    }

    /// Read the board variables of the module docs; a bad value is an error naming it.
    pub fn from_env() -> GpuResult<BoardKnobs> {
        let ms = |name: &str, lo: f64, hi: f64| -> GpuResult<Option<f64>> {
            env_number(name, lo, hi, "milliseconds").map(|v| v.map(|ms| ms / 1000.0))
        };
        let power_period_s = ms("ZEUS_SIM_POWER_PERIOD_MS", 1.0, 2000.0)?;
        let counter_period_s = ms("ZEUS_SIM_COUNTER_PERIOD_MS", 1.0, 2000.0)?;
        let counter_lag_s = ms("ZEUS_SIM_COUNTER_LAG_MS", 0.0, 2000.0)?;
        let average_window_s = ms("ZEUS_SIM_AVERAGE_WINDOW_MS", 0.0, 10_000.0)?;
        let power_noise = env_number("ZEUS_SIM_POWER_NOISE", 0.0, 0.2, "a fraction")?;
        let counter_resolution_mj =
            env_number("ZEUS_SIM_COUNTER_RESOLUTION_MJ", 1.0, 1e9, "millijoules")?
                .map(|r| r.round() as u64);
        let instant_power = env_bool("ZEUS_SIM_INSTANT_POWER")?;
        let average_power = env_bool("ZEUS_SIM_AVERAGE_POWER")?;
        let counter_scale = env_number("ZEUS_SIM_COUNTER_SCALE", 1e-3, 1e3, "a factor")?;
        let counter_backwards = env_bool("ZEUS_SIM_COUNTER_BACKWARDS")?.unwrap_or(false);
        let counter_frozen = env_bool("ZEUS_SIM_COUNTER_FROZEN")?.unwrap_or(false);
        let field_timestamps = match env_value("ZEUS_SIM_FIELD_TIMESTAMP") {
            None => None,
            Some(v) => Some(match v.to_ascii_lowercase().as_str() {
                "update" => FieldTimestamps::Update,
                "call" => FieldTimestamps::Call,
                _ => {
                    return Err(GpuError::Init(format!(
                        "ZEUS_SIM_FIELD_TIMESTAMP={v:?} is not valid: use 'update' or 'call'"
                    )))
                }
            }),
        };
        let counter_resets_s = match env_value("ZEUS_SIM_COUNTER_RESETS") {
            None => Vec::new(),
            Some(v) => v
                .split(',')
                .map(|s| match s.trim().parse::<f64>() {
                    Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
                    _ => Err(GpuError::Init(format!(
                        "ZEUS_SIM_COUNTER_RESETS={v:?}: {s:?} is not a number of seconds >= 0 \
                         (give seconds after start, comma-separated)"
                    ))),
                })
                .collect::<GpuResult<Vec<f64>>>()?,
        };
        let faults = match env_value("ZEUS_SIM_FAULTS") {
            None => Vec::new(),
            Some(v) => parse_faults(&v)
                .map_err(|e| GpuError::Init(format!("ZEUS_SIM_FAULTS={v:?}: {e}")))?,
        };
        Ok(BoardKnobs {
            power_period_s,
            counter_period_s,
            counter_lag_s,
            power_noise,
            counter_resolution_mj,
            instant_power,
            average_window_s,
            field_timestamps,
            average_power,
            counter_scale,
            counter_backwards,
            counter_frozen,
            counter_resets_s,
            faults,
        })
    }
}

fn env_bool(name: &str) -> GpuResult<Option<bool>> {
    match env_value(name) {
        None => Ok(None),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" => Ok(Some(true)),
            "0" | "false" | "no" => Ok(Some(false)),
            _ => Err(GpuError::Init(format!(
                "{name}={v:?} is not valid: use 1 or 0"
            ))),
        },
    }
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn env_number(name: &str, lo: f64, hi: f64, unit: &str) -> GpuResult<Option<f64>> {
    let Some(v) = env_value(name) else {
        return Ok(None);
    };
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(Some(x)),
        _ => Err(GpuError::Init(format!(
            "{name}={v:?} is not valid: {unit} from {lo} to {hi}"
        ))),
    }
}

/// Which driver calls a fault fails.
pub mod calls {
    /// `nvmlDeviceGetTotalEnergyConsumption` (and its field value).
    pub const ENERGY: u32 = 1;
    /// Power readings: `nvmlDeviceGetPowerUsage` and the power field values.
    pub const POWER: u32 = 2;
    /// Every other device call (names, limits, clocks, temperature, ...), writes included.
    pub const OTHER: u32 = 4;
    /// Writes alone (power limits, clock locks and their resets, persistence): a driver that
    /// reads but refuses every change.
    pub const WRITE_ONLY: u32 = 8;
    /// What a write checks: a fault of either kind fails it.
    pub const WRITE: u32 = OTHER | WRITE_ONLY;
    pub const ALL: u32 = ENERGY | POWER | OTHER | WRITE_ONLY;
}

/// A stretch of time in which some driver calls fail with one NVML error.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// A set of [`calls`] bits.
    pub calls: u32,
    /// Start, s: after the devices were made (schedules) or on the device's clock (injected).
    pub from: f64,
    /// End (exclusive), s; infinite for a GPU that is gone for good.
    pub until: f64,
    /// The NVML return code the calls fail with.
    pub code: u32,
    /// Which GPU of a schedule it hits (`None`: every one); injected faults name their device.
    pub gpu: Option<usize>,
}

impl Fault {
    /// The error a failing call returns, named as the driver names it.
    pub fn error(&self, call: &str) -> GpuError {
        GpuError::from_nvml_code(self.code, &format!("{call} (simulated fault)"))
    }
}

/// NVML error names a schedule may use, and their codes.
const ERROR_NAMES: &[(&str, u32)] = &[
    ("GPU_IS_LOST", nvml_code::GPU_IS_LOST),
    ("UNKNOWN", nvml_code::UNKNOWN),
    ("TIMEOUT", nvml_code::TIMEOUT),
    ("NOT_FOUND", nvml_code::NOT_FOUND),
    ("GPU_NOT_FOUND", nvml_code::GPU_NOT_FOUND),
    ("DRIVER_NOT_LOADED", nvml_code::DRIVER_NOT_LOADED),
    ("NO_DATA", nvml_code::NO_DATA),
    ("NOT_READY", nvml_code::NOT_READY),
    ("RESET_REQUIRED", nvml_code::RESET_REQUIRED),
    ("IRQ_ISSUE", nvml_code::IRQ_ISSUE),
];

/// The NVML code of an error name (`GPU_IS_LOST`, `NVML_ERROR_TIMEOUT`, case-insensitive).
pub fn error_code(name: &str) -> Option<u32> {
    let n = name.trim().to_ascii_uppercase();
    let n = n.strip_prefix("NVML_ERROR_").unwrap_or(&n);
    ERROR_NAMES.iter().find(|(k, _)| *k == n).map(|(_, c)| *c)
}

/// The call bits of a name list like `energy+power` (`all` for every call).
pub fn call_bits(spec: &str) -> Result<u32, String> {
    let mut bits = 0;
    for part in spec.split('+') {
        bits |= match part.trim().to_ascii_lowercase().as_str() {
            "energy" => calls::ENERGY,
            "power" => calls::POWER,
            "other" => calls::OTHER,
            "write" => calls::WRITE_ONLY,
            "all" => calls::ALL,
            other => {
                return Err(format!(
                    "unknown calls {other:?}: use energy, power, other, write or all, joined by '+'"
                ))
            }
        };
    }
    Ok(bits)
}

/// Parse a fault schedule: `;`-separated faults, each `[GPU:]CALLS@START+SECONDS[=ERROR]`,
/// where GPU is the index of the one GPU it hits (default: every one), CALLS is `energy`,
/// `power`, `other`, `write` or `all` (joined by `+`, e.g. `energy+power`), START and SECONDS
/// are seconds (from the devices' creation; SECONDS may be `inf`: a GPU gone for good) and ERROR
/// an NVML error name (default `GPU_IS_LOST`). Example: `energy@2+0.3;1:all@10+2=UNKNOWN`.
pub fn parse_faults(spec: &str) -> Result<Vec<Fault>, String> {
    let mut out = Vec::new();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (gpu, item) = match item.split_once(':') {
            Some((g, rest)) => match g.trim().parse::<usize>() {
                Ok(i) => (Some(i), rest.trim()),
                Err(_) => return Err(format!("{item:?}: the GPU before ':' is not an index")),
            },
            None => (None, item),
        };
        let (what, error) = match item.split_once('=') {
            Some((w, e)) => (w, Some(e)),
            None => (item, None),
        };
        let Some((calls, when)) = what.split_once('@') else {
            return Err(format!(
                "{item:?} is not CALLS@START+SECONDS[=ERROR] (example: energy@2+0.3)"
            ));
        };
        let Some((start, seconds)) = when.split_once('+') else {
            return Err(format!("{item:?}: give START+SECONDS after '@'"));
        };
        let num = |s: &str, what: &str| -> Result<f64, String> {
            match s.trim().parse::<f64>() {
                Ok(x) if x >= 0.0 && !x.is_nan() => Ok(x),
                _ => Err(format!(
                    "{item:?}: {what} {s:?} is not a number of seconds >= 0"
                )),
            }
        };
        let from = num(start, "START")?;
        if !from.is_finite() {
            return Err(format!("{item:?}: START must be finite"));
        }
        let seconds = num(seconds, "SECONDS")?;
        let code = match error {
            None => nvml_code::GPU_IS_LOST,
            Some(e) => error_code(e).ok_or_else(|| {
                format!(
                    "{item:?}: unknown error {e:?}; use one of {}",
                    ERROR_NAMES
                        .iter()
                        .map(|(k, _)| *k)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?,
        };
        out.push(Fault {
            calls: call_bits(calls).map_err(|e| format!("{item:?}: {e}"))?,
            from,
            until: from + seconds,
            code,
            gpu,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_parses_and_bad_ones_name_the_fault() {
        let f =
            parse_faults("energy@2+0.3; all@10+inf=unknown;power+energy@0.5+2=NVML_ERROR_TIMEOUT")
                .unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!(
            f[0],
            Fault {
                calls: calls::ENERGY,
                from: 2.0,
                until: 2.3,
                code: nvml_code::GPU_IS_LOST,
                gpu: None,
            }
        );
        assert_eq!(f[1].calls, calls::ALL);
        assert!(f[1].until.is_infinite());
        assert_eq!(f[1].code, nvml_code::UNKNOWN);
        assert_eq!(f[2].calls, calls::ENERGY | calls::POWER);
        assert_eq!(f[2].code, nvml_code::TIMEOUT);
        let [w] = &parse_faults(" 1: write@0+inf=UNKNOWN").unwrap()[..] else {
            panic!("one fault")
        };
        assert_eq!(
            (w.gpu, w.calls, w.code),
            (Some(1), calls::WRITE_ONLY, nvml_code::UNKNOWN)
        );
        assert!(f.iter().all(|x| x.gpu.is_none()));
        for (bad, says) in [
            ("x:energy@1+1", "not an index"),
            ("energy", "CALLS@START+SECONDS"),
            ("disk@1+1", "unknown calls \"disk\""),
            ("energy@1", "START+SECONDS"),
            ("energy@-1+1", "START \"-1\""),
            ("energy@1+1=OOPS", "unknown error \"OOPS\""),
        ] {
            let e = parse_faults(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn knobs_override_the_preset_and_a_power_period_moves_the_counter_with_it() {
        let h100 = super::super::preset::find("H100").unwrap();
        let b = BoardKnobs::default().board_for(h100);
        assert_eq!(b, Board::of(h100));
        assert!(b.counter_on_power_grid());
        let k = BoardKnobs {
            power_period_s: Some(0.02),
            counter_lag_s: Some(0.07),
            instant_power: Some(false),
            ..BoardKnobs::default()
        };
        let b = k.board_for(h100);
        assert_eq!((b.power_period_s, b.counter_period_s), (0.02, 0.02));
        assert_eq!(b.counter_lag_s, 0.07);
        assert!(!b.instant_power);
        let k = BoardKnobs {
            counter_period_s: Some(0.05),
            ..BoardKnobs::default()
        };
        assert!(!k.board_for(h100).counter_on_power_grid());
    }
}
