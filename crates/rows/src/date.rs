//! Civil dates <-> days since 1970-01-01 (proleptic Gregorian), by Howard
//! Hinnant's `days_from_civil` / `civil_from_days` algorithms: exact for every
//! date an i32 of days can hold, no tables, no time zones.

/// Days since 1970-01-01 of `y-m-d`, or None if the date does not exist.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> Option<i32> {
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    i32::try_from(era * 146_097 + doe - 719_468).ok()
}

/// `(year, month, day)` of a day number.
pub fn civil_from_days(days: i32) -> (i64, u32, u32) {
    let z = i64::from(days) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// Parse `YYYY-MM-DD`.
pub fn parse_date(text: &str) -> Option<i32> {
    let mut parts = text.trim().splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: u32 = parts.next()?.parse().ok()?;
    let d: u32 = parts.next()?.parse().ok()?;
    days_from_civil(y, m, d)
}

/// `YYYY-MM-DD`.
pub fn format_date(days: i32) -> String {
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(parse_date("1998-12-01"), Some(10561));
        assert_eq!(parse_date("1992-01-01"), Some(8035));
        assert_eq!(parse_date("2000-02-29"), Some(11016));
        assert_eq!(parse_date("1999-02-29"), None);
        assert_eq!(parse_date("1999-13-01"), None);
        assert_eq!(parse_date("nonsense"), None);
        assert_eq!(format_date(-1), "1969-12-31");
    }

    #[test]
    fn round_trip_over_a_wide_span() {
        for days in (-800_000..800_000).step_by(17) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), Some(days), "{y}-{m}-{d}");
        }
    }
}
