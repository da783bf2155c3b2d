//! TPC-H for insitu: the 8 tables as typed-table schemas, their rows from a
//! dbgen-identical generator, the 22 queries with the specification's
//! validation parameters, and a checker that compares a query's result to a
//! stored answer; and a loader into a running cluster (`load`).
//!
//! Stored answers (`answers/sf0.01/qNN.csv`) were computed by an independent
//! engine over the same generated data (see `scripts/tpch_answers.py`).

pub mod check;
pub mod generate;
pub mod load;
pub mod queries;
pub mod schema;

pub use check::{compare, compare_sf0_01};
pub use generate::{GenerateError, row_count, rows};
pub use queries::{QUERY_COUNT, answer_sf0_01, query};
pub use schema::{TABLES, schema};
