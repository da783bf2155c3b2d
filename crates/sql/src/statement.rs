//! One SQL statement over a running cluster, at the instant its caller
//! asks for (`AtSnapshot`): the rows as they are, a given snapshot, a fresh
//! one, or a fresh one when the statement is a query over tables of several
//! tablets (`Listing::snapshot_by_default`). The CLI (`insitu sql`, its
//! shell) and the Python client run their statements here, so that they
//! choose and retry the same way.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use insitu_client::{AtSnapshot, Client, ClientError, MAX_SNAPSHOT_RETRIES, Status};

use crate::SqlError;
use crate::cluster::{FirstError, Listing};

/// A statement's result and the instant it read.
#[derive(Debug)]
pub struct Answer {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// The snapshot timestamp it read (0: the rows as they were).
    pub snapshot_ts: u64,
}

/// Why a statement failed, and at which instant, so a caller can explain
/// (a refused snapshot, a default it may turn off).
#[derive(Debug)]
pub struct StatementError {
    pub failure: Failure,
    /// The snapshot timestamp of the last try (0: none).
    pub snapshot_ts: u64,
    /// The snapshot was the default's choice, not the caller's (a caller
    /// may say how to read without it).
    pub by_default: bool,
}

/// What failed.
#[derive(Debug)]
pub enum Failure {
    /// A client call of the statement's own: listing the tables or taking a
    /// timestamp (a down cluster is a connection error, not a SQL error).
    Client(ClientError),
    /// The statement itself; `scan` is the first client error its scans met
    /// (DataFusion carries it only as text in `error`).
    Sql {
        error: SqlError,
        scan: Option<ClientError>,
    },
}

impl StatementError {
    /// The status a server answered, if a client call or scan failed on one.
    pub fn status(&self) -> Option<Status> {
        match &self.failure {
            Failure::Client(e) | Failure::Sql { scan: Some(e), .. } => e.status(),
            Failure::Sql { scan: None, .. } => None,
        }
    }
}

/// Run `sql` at the instant `at` says. A fresh snapshot (`On`, or `Auto`'s
/// choice) refused as too old by a shard (it had kept no versions and
/// begins keeping them) is replaced by a newer one, up to
/// `MAX_SNAPSHOT_RETRIES` times; a given one (`At`) is not.
pub async fn run(client: &Client, sql: &str, at: AtSnapshot) -> Result<Answer, StatementError> {
    let fail = |failure, snapshot_ts, by_default| StatementError {
        failure,
        snapshot_ts,
        by_default,
    };
    // One listing serves the choice below and every try's session.
    let listing = Listing::fetch(client)
        .await
        .map_err(|e| fail(Failure::Client(e), 0, false))?;
    let by_default = matches!(at, AtSnapshot::Auto) && listing.snapshot_by_default(sql);
    let fresh = by_default || matches!(at, AtSnapshot::On);
    let mut ts = match at {
        AtSnapshot::At(ts) => ts,
        _ if fresh => client
            .timestamp()
            .await
            .map_err(|e| fail(Failure::Client(e), 0, by_default))?,
        _ => 0,
    };
    let mut retries = 0;
    loop {
        let failure = match try_at(client, &listing, sql, ts).await {
            Ok((schema, batches)) => {
                return Ok(Answer {
                    schema,
                    batches,
                    snapshot_ts: ts,
                });
            }
            Err(failure) => failure,
        };
        let too_old = matches!(&failure, Failure::Sql { scan: Some(e), .. }
            if e.status() == Some(Status::SnapshotTooOld));
        if !(fresh && too_old && retries < MAX_SNAPSHOT_RETRIES) {
            return Err(fail(failure, ts, by_default));
        }
        // A fresh timestamp is above the servers' floor: run again.
        retries += 1;
        ts = client
            .timestamp()
            .await
            .map_err(|e| fail(Failure::Client(e), ts, by_default))?;
    }
}

/// One try of `sql` over the typed tables `listing` holds, as of
/// `snapshot_ts` (0: as the rows are).
async fn try_at(
    client: &Client,
    listing: &Listing,
    sql: &str,
    snapshot_ts: u64,
) -> Result<(SchemaRef, Vec<RecordBatch>), Failure> {
    let errors = FirstError::default();
    let tables = listing.tables_at(client, snapshot_ts, &errors);
    let ctx = crate::context(tables)
        .await
        .map_err(|error| Failure::Sql { error, scan: None })?;
    crate::query(&ctx, sql).await.map_err(|error| Failure::Sql {
        error,
        scan: errors.take(),
    })
}
