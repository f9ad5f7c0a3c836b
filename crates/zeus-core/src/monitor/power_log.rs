//! The power log schema of zeus: one for `zeus-monitor` and `python -m zeus.monitor power`, so
//! `zeus.analyze` reads one format whichever logger wrote it.
//!
//! - CSV (the reference `zeus_monitor`'s): a header `Time,Power` for one GPU, else
//!   `Time,Power0,Power1,...` by GPU index, then `Energy`/`EnergyN` columns when energy is
//!   logged; each row the UTC time `YYYY-MM-DD HH:MM:SS.nnnnnnnnn`, power in mW and energy in
//!   mJ.
//! - JSON lines: `{"time": UTC as above, "unix_time": seconds, "power_mw": {"0": mW, ...}}`,
//!   plus `"energy_mj"` when energy is logged.

use std::fmt::Write as _;

/// The two encodings of a power log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerLogFormat {
    Csv,
    Jsonl,
}

/// The rows of one power log: its encoding, the GPUs it covers and whether it logs energy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerLog {
    format: PowerLogFormat,
    indices: Vec<usize>,
    energy: bool,
}

impl PowerLog {
    /// A log of the GPUs `indices` (in column order), with energy columns when `energy`.
    pub fn new(format: PowerLogFormat, indices: Vec<usize>, energy: bool) -> Self {
        PowerLog {
            format,
            indices,
            energy,
        }
    }

    /// The header line (without its newline), for CSV.
    pub fn header(&self) -> Option<String> {
        if self.format != PowerLogFormat::Csv {
            return None;
        }
        let single = self.indices.len() == 1;
        let mut h = String::from("Time");
        let kinds: &[&str] = if self.energy {
            &["Power", "Energy"]
        } else {
            &["Power"]
        };
        for kind in kinds {
            for i in &self.indices {
                if single {
                    let _ = write!(h, ",{kind}");
                } else {
                    let _ = write!(h, ",{kind}{i}");
                }
            }
        }
        Some(h)
    }

    /// Replace `line` with the row (without its newline) of a sample at UNIX time `secs` +
    /// `nanos`: power in mW and, when the log has energy columns, energy in mJ, in column order.
    pub fn write_row(
        &self,
        line: &mut String,
        (secs, nanos): (i64, u32),
        power_mw: &[u32],
        energy_mj: &[u64],
    ) {
        line.clear();
        let time = format_utc(secs, nanos);
        let unix_time = secs as f64 + f64::from(nanos) / 1e9;
        match self.format {
            PowerLogFormat::Csv => {
                line.push_str(&time);
                for p in power_mw {
                    let _ = write!(line, ",{p}");
                }
                if self.energy {
                    for e in energy_mj {
                        let _ = write!(line, ",{e}");
                    }
                }
            }
            PowerLogFormat::Jsonl => {
                let by_gpu = |values: Vec<serde_json::Value>| -> serde_json::Value {
                    self.indices
                        .iter()
                        .map(|i| i.to_string())
                        .zip(values)
                        .collect::<serde_json::Map<_, _>>()
                        .into()
                };
                let mut row = serde_json::Map::new();
                row.insert("time".into(), time.into());
                row.insert("unix_time".into(), unix_time.into());
                let power = power_mw.iter().map(|&p| p.into()).collect();
                row.insert("power_mw".into(), by_gpu(power));
                if self.energy {
                    let energy = energy_mj.iter().map(|&e| e.into()).collect();
                    row.insert("energy_mj".into(), by_gpu(energy));
                }
                line.push_str(&serde_json::Value::Object(row).to_string());
            }
        }
    }
}

/// UNIX time `unix_time` (seconds) as whole seconds and nanoseconds, to the nanosecond an
/// `f64` of today's times holds (about a quarter of a microsecond).
pub fn split_seconds(unix_time: f64) -> (i64, u32) {
    let secs = unix_time.floor();
    // The fraction is in [0, 1), so its nanoseconds fit below 1e9.
    let nanos = ((unix_time - secs) * 1e9).round().min(999_999_999.0) as u32;
    (secs as i64, nanos)
}

/// Civil date (year, month 1..=12, day 1..=31) of a day count since 1970-01-01, in the
/// proleptic Gregorian calendar. Works in 400-year eras of 146097 days, shifted so that years
/// start on March 1 (the leap day is then the last day of the year).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era, 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of the March-based year
    let mp = (5 * doy + 2) / 153; // March = 0
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Format Unix time `secs` + `nanos` as `YYYY-MM-DD HH:MM:SS.nnnnnnnnn` (UTC).
pub fn format_utc(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{nanos:09}",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_and_json_lines_rows_are_the_reference_loggers() {
        let one = PowerLog::new(PowerLogFormat::Csv, vec![1], false);
        assert_eq!(one.header().as_deref(), Some("Time,Power"));
        let mut line = String::new();
        one.write_row(&mut line, (1_657_678_056, 708_783_111), &[201_500], &[]);
        assert_eq!(line, "2022-07-13 02:07:36.708783111,201500");
        let two = PowerLog::new(PowerLogFormat::Csv, vec![0, 2], true);
        assert_eq!(
            two.header().as_deref(),
            Some("Time,Power0,Power2,Energy0,Energy2")
        );
        let json = PowerLog::new(PowerLogFormat::Jsonl, vec![0, 2], true);
        assert_eq!(json.header(), None);
        json.write_row(&mut line, split_seconds(0.5), &[1, 2], &[30, 40]);
        let row: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(row["time"], "1970-01-01 00:00:00.500000000");
        assert_eq!(row["unix_time"], 0.5);
        assert_eq!(row["power_mw"], serde_json::json!({"0": 1, "2": 2}));
        assert_eq!(row["energy_mj"], serde_json::json!({"0": 30, "2": 40}));
    }

    #[test]
    fn known_instants() {
        assert_eq!(format_utc(0, 0), "1970-01-01 00:00:00.000000000");
        // The reference's sample row.
        assert_eq!(
            format_utc(1_657_678_056, 708_783_111),
            "2022-07-13 02:07:36.708783111"
        );
        assert_eq!(format_utc(951_782_400, 5), "2000-02-29 00:00:00.000000005");
        assert_eq!(format_utc(-1, 0), "1969-12-31 23:59:59.000000000");
        assert_eq!(
            format_utc(4_102_444_800, 0),
            "2100-01-01 00:00:00.000000000"
        );
    }

    #[test]
    fn every_day_follows_the_previous() {
        // Walk 1900..2200 day by day and check the calendar increments correctly.
        let mut prev = civil_from_days(-25_567); // 1900-01-01
        assert_eq!(prev, (1900, 1, 1));
        for days in -25_566..84_000 {
            let cur = civil_from_days(days);
            let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let month_len = [
                31,
                if leap(prev.0) { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            let want = if prev.2 < month_len[prev.1 as usize - 1] {
                (prev.0, prev.1, prev.2 + 1)
            } else if prev.1 < 12 {
                (prev.0, prev.1 + 1, 1)
            } else {
                (prev.0 + 1, 1, 1)
            };
            assert_eq!(cur, want, "day {days}");
            prev = cur;
        }
    }
}
