//! Table and cluster administration on `Client` (create/drop/open/list
//! tables, list servers, move a tablet, shard stats): coordinator calls that
//! are not routed by key, kept apart from the point operations in `client`.

use insitu_protocol::{Request, Response, ServerInfo, ShardStats, Status, TableInfo, TabletInfo};

use crate::client::{Client, check_ok, decode};
use crate::error::ClientError;
use crate::routing::call_endpoint;
use crate::rpc::Reply;

impl Client {
    fn expect_table(&self, reply: &Reply) -> Result<TableInfo, ClientError> {
        check_ok(reply)?;
        match decode(reply, &self.inner.coordinator.addr)? {
            Response::Table(info) => {
                self.inner.routes.install(info.clone(), &self.inner.pool);
                Ok(info)
            }
            other => Err(ClientError::unexpected(
                &self.inner.coordinator.addr,
                format!("{other:?} where a table was expected"),
            )),
        }
    }

    fn expect_done(&self, reply: &Reply) -> Result<(), ClientError> {
        check_ok(reply)?;
        match decode(reply, &self.inner.coordinator.addr)? {
            // A move replies with the new map; either way the request succeeded.
            Response::Done | Response::Table(_) => Ok(()),
            other => Err(ClientError::unexpected(
                &self.inner.coordinator.addr,
                format!("{other:?} where Done was expected"),
            )),
        }
    }

    /// Create table `name` split into `tablets` tablets. Not retried after a
    /// dropped connection (a retry could report `TableExists` for our own create).
    pub async fn create_table(&self, name: &str, tablets: u32) -> Result<TableInfo, ClientError> {
        self.create_table_with(name, tablets, None).await
    }

    /// Create table `name` with `schema` (a typed table) or without (None:
    /// untyped, opaque values). Not retried after a dropped connection.
    pub async fn create_table_with(
        &self,
        name: &str,
        tablets: u32,
        schema: Option<insitu_protocol::schema::Schema>,
    ) -> Result<TableInfo, ClientError> {
        self.create_table_request(name, tablets, schema, false)
            .await
    }

    /// Create untyped table `name` placing keys by Redis hash slot (its id
    /// has `insitu_keyhash::SLOT_PLACED`, its tablets hold whole slots:
    /// what the RESP port creates, so its layout can be described to Redis
    /// Cluster clients). Not retried after a dropped connection.
    pub async fn create_table_by_slot(
        &self,
        name: &str,
        tablets: u32,
    ) -> Result<TableInfo, ClientError> {
        self.create_table_request(name, tablets, None, true).await
    }

    async fn create_table_request(
        &self,
        name: &str,
        tablets: u32,
        schema: Option<insitu_protocol::schema::Schema>,
        by_slot: bool,
    ) -> Result<TableInfo, ClientError> {
        let request = Request::CreateTable {
            name: name.to_string(),
            tablets,
            schema,
            by_slot,
        };
        let reply = self.coord_call(&request, false, self.deadline()).await?;
        check_ok(&reply)?;
        match decode(&reply, &self.inner.coordinator.addr)? {
            Response::Done => self.open_table(name).await,
            _ => self.expect_table(&reply),
        }
    }

    pub async fn drop_table(&self, name: &str) -> Result<(), ClientError> {
        let reply = self
            .coord_call(
                &Request::DropTable {
                    name: name.to_string(),
                },
                false,
                self.deadline(),
            )
            .await?;
        self.inner.routes.evict_name(name);
        self.expect_done(&reply)
    }

    /// Declare (`create`) or remove a secondary index on `column` of typed
    /// table `table`. Not retried after a dropped connection.
    pub async fn set_index(
        &self,
        table: &str,
        column: &str,
        create: bool,
    ) -> Result<(), ClientError> {
        let (table, column) = (table.to_string(), column.to_string());
        let request = if create {
            Request::CreateIndex {
                table: table.clone(),
                column,
            }
        } else {
            Request::DropIndex {
                table: table.clone(),
                column,
            }
        };
        let reply = self.coord_call(&request, false, self.deadline()).await?;
        // The cached map carries the old list of indexes.
        self.inner.routes.evict_name(&table);
        self.expect_done(&reply)
    }

    pub async fn list_tables(&self) -> Result<Vec<TableInfo>, ClientError> {
        let reply = self
            .coord_call(&Request::ListTables, true, self.deadline())
            .await?;
        check_ok(&reply)?;
        match decode(&reply, &self.inner.coordinator.addr)? {
            Response::Tables(tables) => Ok(tables),
            other => Err(ClientError::unexpected(
                &self.inner.coordinator.addr,
                format!("{other:?} to ListTables"),
            )),
        }
    }

    /// Look up table `name` at the coordinator and cache its map.
    pub async fn open_table(&self, name: &str) -> Result<TableInfo, ClientError> {
        let reply = self
            .coord_call(
                &Request::OpenTable {
                    name: name.to_string(),
                },
                true,
                self.deadline(),
            )
            .await?;
        if reply.status == Status::UnknownTable {
            self.inner.routes.evict_name(name);
        }
        self.expect_table(&reply)
    }

    /// The id of table `name`: from the cache, else via `open_table`.
    pub async fn table_id(&self, name: &str) -> Result<u64, ClientError> {
        match self.inner.routes.id_of(name) {
            Some(id) => Ok(id),
            None => Ok(self.open_table(name).await?.id),
        }
    }

    pub async fn list_servers(&self) -> Result<Vec<ServerInfo>, ClientError> {
        let reply = self
            .coord_call(&Request::ListServers, true, self.deadline())
            .await?;
        check_ok(&reply)?;
        match decode(&reply, &self.inner.coordinator.addr)? {
            Response::Servers(servers) => Ok(servers),
            other => Err(ClientError::unexpected(
                &self.inner.coordinator.addr,
                format!("{other:?} to ListServers"),
            )),
        }
    }

    /// Ask the coordinator to move tablet `tablet_index` of `table_name` to
    /// server `server_id`. The cached map of the table is dropped.
    pub async fn move_tablet(
        &self,
        table_name: &str,
        tablet_index: u32,
        server_id: u64,
    ) -> Result<(), ClientError> {
        let request = Request::MoveTablet {
            table: table_name.to_string(),
            tablet_index,
            server_id,
        };
        let reply = self.coord_call(&request, false, self.deadline()).await?;
        if let Some(id) = self.inner.routes.id_of(table_name) {
            self.inner.routes.evict_id(id);
        }
        self.expect_done(&reply)
    }

    /// Declare server `server_id` dead now (`insitu server remove`): the
    /// coordinator recovers its tablets onto the live servers. Not an error
    /// for a server already dead; `Status::UnknownServer` for an unknown id.
    pub async fn remove_server(&self, server_id: u64) -> Result<(), ClientError> {
        let reply = self
            .coord_call(&Request::RemoveServer { server_id }, true, self.deadline())
            .await?;
        self.expect_done(&reply)
    }

    /// Acknowledge that table `table_name` lost objects with a server that
    /// held them in memory only (`insitu table ack-loss`): its tablets answer
    /// a missing key with "no such object" again instead of
    /// `Status::DataLost`. Returns how many tablets had been marked lost (0:
    /// none; acknowledging twice is harmless).
    pub async fn ack_loss(&self, table_name: &str) -> Result<u32, ClientError> {
        let request = Request::AckLoss {
            table: table_name.to_string(),
        };
        self.loss_call(table_name, &request).await
    }

    /// Give up what no backup holds of table `table_name`'s tablets waiting
    /// for recovery (`insitu table accept-loss`): their disks are gone for
    /// good and the log's digest keeps refusing their recovery. They are
    /// recovered from what the backups hold and marked lost (reads of
    /// missing keys fail with `Status::DataLost`) until `ack_loss`.
    /// Returns how many tablets were given up now (0: none was waiting).
    pub async fn accept_loss(&self, table_name: &str) -> Result<u32, ClientError> {
        let request = Request::AcceptLoss {
            table: table_name.to_string(),
        };
        self.loss_call(table_name, &request).await
    }

    /// `AckLoss` or `AcceptLoss`: both answer `LossAcknowledged`.
    async fn loss_call(&self, table_name: &str, request: &Request<'_>) -> Result<u32, ClientError> {
        let reply = self.coord_call(request, true, self.deadline()).await?;
        check_ok(&reply)?;
        if let Some(id) = self.inner.routes.id_of(table_name) {
            self.inner.routes.evict_id(id);
        }
        match decode(&reply, &self.inner.coordinator.addr)? {
            Response::LossAcknowledged { tablets } => Ok(tablets),
            other => Err(ClientError::unexpected(
                &self.inner.coordinator.addr,
                format!("{other:?} where LossAcknowledged was expected"),
            )),
        }
    }

    /// The tablets of table `name` whose objects were lost and not yet
    /// acknowledged (index in the table's map, tablet), from a fresh map:
    /// what `count` and `agg` warn about.
    pub async fn lost_tablets(&self, name: &str) -> Result<Vec<(usize, TabletInfo)>, ClientError> {
        let info = self.open_table(name).await?;
        Ok(info
            .tablets
            .into_iter()
            .enumerate()
            .filter(|(_, t)| t.lost_from != 0)
            .collect())
    }

    /// Memory and tablet figures of the shard at `addr`.
    pub async fn shard_stats(&self, addr: &str) -> Result<ShardStats, ClientError> {
        self.shard_stats_with(addr, false).await
    }

    /// `shard_stats`, and with `reset_longest_call` a new window for its
    /// `longest_point_call_us` starts after this reading (what a benchmark
    /// uses to learn the longest call of one case).
    pub async fn shard_stats_with(
        &self,
        addr: &str,
        reset_longest_call: bool,
    ) -> Result<ShardStats, ClientError> {
        let ep = self.inner.pool.get(addr);
        let request = Request::ShardStats { reset_longest_call };
        let reply = call_endpoint(&ep, &request, true, self.deadline()).await?;
        check_ok(&reply)?;
        match decode(&reply, addr)? {
            Response::ShardStats(s) => Ok(s),
            other => Err(ClientError::unexpected(
                addr,
                format!("{other:?} to ShardStats"),
            )),
        }
    }
}
