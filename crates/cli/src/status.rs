//! Cluster administration commands: `insitu status` (servers, their state,
//! shard figures, tablets waiting for recovery) and `insitu server remove ID`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use futures::future::join_all;
use insitu_client::{ServerInfo, TableInfo};
use insitu_protocol::ServerState;

use crate::ClusterArg;
use crate::data::{connect, runtime};

/// Per-shard figures are asked of every shard at once, each within this
/// long: a dead or hung server must not hold `insitu status` up (its shards
/// show as unreachable instead).
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// `insitu server remove ID`.
pub fn remove_server(id: u64, cluster: &ClusterArg) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = connect(cluster).await?;
        client.remove_server(id).await?;
        crate::outln!(
            "server {id} declared dead; its tablets are recovered onto the live servers (`insitu status` shows what is still waiting)"
        )?;
        Ok(())
    })
}

/// The tablets no live server holds: (table name, tablet index, owner id
/// (0: none)), by table then index.
fn waiting_tablets(tables: &[TableInfo], dead: &HashSet<u64>) -> Vec<(String, usize, u64)> {
    tables
        .iter()
        .flat_map(|t| {
            t.tablets
                .iter()
                .enumerate()
                .filter(|(_, x)| x.server_id == 0 || dead.contains(&x.server_id))
                .map(|(i, x)| (t.name.clone(), i, x.server_id))
        })
        .collect()
}

pub async fn status(cluster: &ClusterArg) -> anyhow::Result<()> {
    let client = connect(cluster).await?;
    let servers: Vec<ServerInfo> = client.list_servers().await?;
    let tables = client.list_tables().await?;
    let dead: HashSet<u64> = servers
        .iter()
        .filter(|s| s.state == ServerState::Dead)
        .map(|s| s.id)
        .collect();
    let mut header = format!(
        "coordinator {}: {} servers",
        cluster.cluster,
        servers.len() - dead.len()
    );
    if !dead.is_empty() {
        header.push_str(&format!(" ({} dead)", dead.len()));
    }
    crate::outln!("{header}, {} tables", tables.len())?;
    crate::outln!(
        "{:>6} {:<5} {:>5} {:<22} {:>8} {:>12} {:>12} {:>12}",
        "server",
        "state",
        "shard",
        "address",
        "tablets",
        "objects",
        "live MiB",
        "used MiB"
    )?;
    // Every live shard at once, each bounded by STATS_TIMEOUT.
    let shards: Vec<(&ServerInfo, usize, &str)> = servers
        .iter()
        .filter(|s| s.state == ServerState::Up)
        .flat_map(|s| {
            s.shard_addrs
                .iter()
                .enumerate()
                .map(move |(i, a)| (s, i, a.as_str()))
        })
        .collect();
    let stats = join_all(shards.iter().map(|(_, _, addr)| async {
        match tokio::time::timeout(STATS_TIMEOUT, client.shard_stats(addr)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no reply within {STATS_TIMEOUT:?}")),
        }
    }))
    .await;
    let mut stats = shards.iter().zip(stats);
    for s in &servers {
        if s.state == ServerState::Dead {
            for (i, addr) in s.shard_addrs.iter().enumerate() {
                crate::outln!(
                    "{:>6} {:<5} {:>5} {:<22} declared dead",
                    s.id,
                    "dead",
                    i,
                    addr
                )?;
            }
            continue;
        }
        for _ in 0..s.shard_addrs.len() {
            let Some(((_, i, addr), result)) = stats.next() else {
                break;
            };
            match result {
                Ok(st) => {
                    let objects: u64 = st.tablets.iter().map(|t| t.objects).sum();
                    crate::outln!(
                        "{:>6} {:<5} {:>5} {:<22} {:>8} {:>12} {:>12.1} {:>12.1}",
                        s.id,
                        "up",
                        i,
                        addr,
                        st.tablets.len(),
                        objects,
                        st.live_bytes as f64 / 1048576.0,
                        st.segment_bytes as f64 / 1048576.0
                    )?;
                }
                Err(e) => crate::outln!(
                    "{:>6} {:<5} {:>5} {:<22} unreachable: {e}",
                    s.id,
                    "up",
                    i,
                    addr
                )?,
            }
        }
    }
    let waiting = waiting_tablets(&tables, &dead);
    if !waiting.is_empty() {
        // Per table: its waiting tablet indexes.
        let mut by_table: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (table, index, owner) in &waiting {
            let note = if *owner == 0 {
                format!("{index}")
            } else {
                format!("{index} (server {owner})")
            };
            by_table.entry(table.as_str()).or_default().push(note);
        }
        crate::outln!("{} tablets waiting for recovery:", waiting.len())?;
        for (table, tablets) in by_table {
            crate::outln!("  table {table:?}: tablets {}", tablets.join(", "))?;
        }
    }
    // Tablets whose objects were lost, until an operator acknowledges it.
    let lost: Vec<(&str, Vec<String>)> = tables
        .iter()
        .map(|t| {
            let indexes = t
                .tablets
                .iter()
                .enumerate()
                .filter(|(_, x)| x.lost_from != 0)
                .map(|(i, x)| {
                    format!(
                        "{i} (lost with {})",
                        insitu_protocol::lost_with(x.lost_from)
                    )
                })
                .collect::<Vec<_>>();
            (t.name.as_str(), indexes)
        })
        .filter(|(_, indexes)| !indexes.is_empty())
        .collect();
    if !lost.is_empty() {
        let n: usize = lost.iter().map(|(_, i)| i.len()).sum();
        crate::outln!(
            "{n} tablets lost their objects (in-memory only); acknowledge with `insitu table ack-loss TABLE`:"
        )?;
        for (table, tablets) in lost {
            crate::outln!("  table {table:?}: tablets {}", tablets.join(", "))?;
        }
    }
    Ok(())
}
