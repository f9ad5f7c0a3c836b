//! UTC calendar formatting without a date library: `YYYY-MM-DD HH:MM:SS.nnnnnnnnn`, the format
//! of the reference `zeus_monitor` (`date.h` on `system_clock::now()`).

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
