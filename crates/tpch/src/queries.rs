//! The 22 TPC-H queries with the specification's validation (qualification)
//! parameters, in SQL that both DuckDB and Apache DataFusion accept, and their
//! answers at SF 0.01 (CSV with a header row) computed by DuckDB over the data
//! of `generate` (see `scripts/tpch_answers.py`).
//!
//! Deviations from the specification's text: Q15 uses a WITH clause instead of
//! a view; queries with a row limit (Q2, Q3, Q10, Q18, Q21) end in `limit N`.
//! Q11's FRACTION is the validation value 0.0001 at every scale factor (the
//! specification scales it as 0.0001 / SF for benchmark runs).
//!
//! The answers are also those of Apache DataFusion 55 over the same data, and
//! at SF 1 the same queries over this generator's data give the
//! specification's published SF 1 answers (Q17 within 0.04: the published
//! 348406.02 against the exact 348406.054).

/// Number of TPC-H queries.
pub const QUERY_COUNT: u32 = 22;

const QUERIES: [&str; 22] = [
    include_str!("../queries/q01.sql"),
    include_str!("../queries/q02.sql"),
    include_str!("../queries/q03.sql"),
    include_str!("../queries/q04.sql"),
    include_str!("../queries/q05.sql"),
    include_str!("../queries/q06.sql"),
    include_str!("../queries/q07.sql"),
    include_str!("../queries/q08.sql"),
    include_str!("../queries/q09.sql"),
    include_str!("../queries/q10.sql"),
    include_str!("../queries/q11.sql"),
    include_str!("../queries/q12.sql"),
    include_str!("../queries/q13.sql"),
    include_str!("../queries/q14.sql"),
    include_str!("../queries/q15.sql"),
    include_str!("../queries/q16.sql"),
    include_str!("../queries/q17.sql"),
    include_str!("../queries/q18.sql"),
    include_str!("../queries/q19.sql"),
    include_str!("../queries/q20.sql"),
    include_str!("../queries/q21.sql"),
    include_str!("../queries/q22.sql"),
];

const ANSWERS_SF0_01: [&str; 22] = [
    include_str!("../answers/sf0.01/q01.csv"),
    include_str!("../answers/sf0.01/q02.csv"),
    include_str!("../answers/sf0.01/q03.csv"),
    include_str!("../answers/sf0.01/q04.csv"),
    include_str!("../answers/sf0.01/q05.csv"),
    include_str!("../answers/sf0.01/q06.csv"),
    include_str!("../answers/sf0.01/q07.csv"),
    include_str!("../answers/sf0.01/q08.csv"),
    include_str!("../answers/sf0.01/q09.csv"),
    include_str!("../answers/sf0.01/q10.csv"),
    include_str!("../answers/sf0.01/q11.csv"),
    include_str!("../answers/sf0.01/q12.csv"),
    include_str!("../answers/sf0.01/q13.csv"),
    include_str!("../answers/sf0.01/q14.csv"),
    include_str!("../answers/sf0.01/q15.csv"),
    include_str!("../answers/sf0.01/q16.csv"),
    include_str!("../answers/sf0.01/q17.csv"),
    include_str!("../answers/sf0.01/q18.csv"),
    include_str!("../answers/sf0.01/q19.csv"),
    include_str!("../answers/sf0.01/q20.csv"),
    include_str!("../answers/sf0.01/q21.csv"),
    include_str!("../answers/sf0.01/q22.csv"),
];

/// The SQL text of query `n` (1..=22).
pub fn query(n: u32) -> Option<&'static str> {
    QUERIES
        .get(usize::try_from(n.checked_sub(1)?).ok()?)
        .copied()
}

/// The answer of query `n` (1..=22) at scale factor 0.01: CSV, header row first.
pub fn answer_sf0_01(n: u32) -> Option<&'static str> {
    ANSWERS_SF0_01
        .get(usize::try_from(n.checked_sub(1)?).ok()?)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_and_answer_is_present() {
        for n in 1..=QUERY_COUNT {
            let q = query(n).unwrap();
            assert!(q.to_lowercase().contains("select"), "q{n}");
            assert!(!q.contains(':'), "q{n} has an unsubstituted parameter");
            let a = answer_sf0_01(n).unwrap();
            assert!(a.lines().count() >= 2, "q{n}: header and at least one row");
        }
        assert!(query(0).is_none() && query(23).is_none());
        // Rows per answer at SF 0.01; a regenerated answer set must agree.
        let rows = [
            4, 4, 10, 5, 5, 1, 4, 2, 173, 20, 359, 2, 33, 1, 1, 296, 1, 2, 1, 1, 1, 7,
        ];
        for (n, want) in (1..=QUERY_COUNT).zip(rows) {
            let lines = answer_sf0_01(n).unwrap().lines().count();
            assert_eq!(lines - 1, want, "q{n}");
        }
        assert!(answer_sf0_01(0).is_none() && answer_sf0_01(23).is_none());
    }
}
