//! Point operations of the `Client`: read, write, remove and increment of
//! one key, each routed through the retry loop in `client`.

use insitu_keyhash::key_hash;
use insitu_protocol::{Number, RejectRules, Request, Response, Status, TabletInfo, blob};

use crate::client::{Client, Found, check_ok, decode};
use crate::error::ClientError;

impl Client {
    /// Read `key` of table `table`: `Ok(None)` if it does not exist, else the
    /// value (sharing the reply buffer, no copy) and its version.
    pub async fn read(&self, table: u64, key: impl AsRef<[u8]>) -> Result<Found, ClientError> {
        Ok(self
            .read_expiring(table, key)
            .await?
            .map(|(value, version, _)| (value, version)))
    }

    /// `read`, with the object's deadline (Unix ms; 0: none) as the third
    /// item. An object past its deadline does not exist.
    pub async fn read_expiring(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<(bytes::Bytes, u64, u64)>, ClientError> {
        let key = key.as_ref();
        self.routed(
            table,
            key_hash(table, key),
            true,
            |_| Request::Read {
                table,
                key: blob(key),
            },
            |reply, _, addr| match reply.status {
                Status::Ok => match decode(&reply, addr)? {
                    Response::Read {
                        version,
                        value,
                        expires_at_ms,
                    } => Ok(Some((reply.body.slice_ref(value), version, expires_at_ms))),
                    other => Err(ClientError::unexpected(addr, format!("{other:?} to Read"))),
                },
                Status::ObjectDoesntExist => Ok(None),
                status => Err(ClientError::Status(status, reply.error_message())),
            },
        )
        .await
    }

    /// Write `value` under `key`; returns the new version.
    ///
    /// Retried after a dropped connection even though the first attempt may
    /// have been applied (see the retry policy on `Client`): a plain write is
    /// last-writer-wins.
    pub async fn write(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<u64, ClientError> {
        self.write_with(table, key, value, RejectRules::default())
            .await
    }

    /// Write refused by `rules` (e.g. `ObjectExists`, `WrongVersion`).
    /// With any rule set, not retried after a dropped connection.
    pub async fn write_with(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        rules: RejectRules,
    ) -> Result<u64, ClientError> {
        self.write_expiring(table, key, value, 0, rules).await
    }

    /// `write_with` of an object that stops existing at `expires_at_ms`
    /// (Unix ms, on the server's clock; 0: never). From then on every read,
    /// scan and query leaves it out, and the server removes it (a tombstone,
    /// then the cleaner reclaims the space). A deadline already passed is
    /// accepted: the object is written and at once absent.
    pub async fn write_expiring(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        expires_at_ms: u64,
        rules: RejectRules,
    ) -> Result<u64, ClientError> {
        let (key, value) = (key.as_ref(), value.as_ref());
        let plain = rules == RejectRules::default();
        let make = |_: &TabletInfo| Request::Write {
            table,
            key: blob(key),
            value: blob(value),
            rules,
            expires_at_ms,
        };
        self.routed(
            table,
            key_hash(table, key),
            plain,
            make,
            |reply, _, addr| {
                check_ok(&reply)?;
                match decode(&reply, addr)? {
                    Response::Written { version } => Ok(version),
                    other => Err(ClientError::unexpected(addr, format!("{other:?} to Write"))),
                }
            },
        )
        .await
    }

    /// Remove `key`: the removed object's version, or `None` if it did not exist.
    pub async fn remove(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<u64>, ClientError> {
        self.remove_with(table, key, RejectRules::default()).await
    }

    /// Remove refused by `rules`. A missing object is `Ok(None)` unless
    /// `rules.doesnt_exist` is set, then it is a `Status(ObjectDoesntExist)` error.
    /// With any rule set, not retried after a dropped connection.
    pub async fn remove_with(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        rules: RejectRules,
    ) -> Result<Option<u64>, ClientError> {
        let key = key.as_ref();
        let plain = rules == RejectRules::default();
        let make = |_: &TabletInfo| Request::Remove {
            table,
            key: blob(key),
            rules,
        };
        self.routed(
            table,
            key_hash(table, key),
            plain,
            make,
            |reply, _, addr| match reply.status {
                Status::Ok => match decode(&reply, addr)? {
                    // Versions start at 1: 0 never names a removed object.
                    Response::Removed { version } => Ok((version != 0).then_some(version)),
                    other => Err(ClientError::unexpected(
                        addr,
                        format!("{other:?} to Remove"),
                    )),
                },
                Status::ObjectDoesntExist if !rules.doesnt_exist => Ok(None),
                status => Err(ClientError::Status(status, reply.error_message())),
            },
        )
        .await
    }

    /// Add `delta` to the little-endian i64 value of `key` (absent = 0);
    /// returns the new value and version. Never retried after a dropped connection.
    pub async fn increment_i64(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        delta: i64,
    ) -> Result<(i64, u64), ClientError> {
        let as_i64 = |n| match n {
            Number::I64(v) => Some(v),
            Number::F64(_) => None,
        };
        self.increment(table, key.as_ref(), Number::I64(delta), as_i64)
            .await
    }

    /// Same for an f64 value.
    pub async fn increment_f64(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        delta: f64,
    ) -> Result<(f64, u64), ClientError> {
        let as_f64 = |n| match n {
            Number::F64(v) => Some(v),
            Number::I64(_) => None,
        };
        self.increment(table, key.as_ref(), Number::F64(delta), as_f64)
            .await
    }

    async fn increment<T>(
        &self,
        table: u64,
        key: &[u8],
        delta: Number,
        extract: impl FnOnce(Number) -> Option<T>,
    ) -> Result<(T, u64), ClientError> {
        let make = |_: &TabletInfo| Request::Increment {
            table,
            key: blob(key),
            delta,
            rules: RejectRules::default(),
        };
        self.routed(
            table,
            key_hash(table, key),
            false,
            make,
            |reply, _, addr| {
                check_ok(&reply)?;
                match decode(&reply, addr)? {
                    Response::Incremented { value, version } => match extract(value) {
                        Some(v) => Ok((v, version)),
                        None => Err(ClientError::unexpected(
                            addr,
                            format!("{value:?} to an increment by {delta:?}"),
                        )),
                    },
                    other => Err(ClientError::unexpected(
                        addr,
                        format!("{other:?} to Increment"),
                    )),
                }
            },
        )
        .await
    }
}
