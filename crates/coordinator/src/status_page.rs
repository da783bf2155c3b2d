//! The status page (`GET /` on the coordinator's metrics port): one small
//! HTML page of the cluster, for a person with a browser. Servers and their
//! state, each shard's memory, objects and request rate, and where every
//! table's tablets live. Rendered from the model plus one `ShardStats` per
//! live shard (each bounded by `STATS_TIMEOUT`, so a hung server shows as
//! "no answer" instead of stalling the page). It refreshes itself every 5 s.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::join_all;

use crate::service::Coordinator;

const STATS_TIMEOUT: Duration = Duration::from_millis(500);

/// The previous reading of each shard's request counter, for rates.
#[derive(Default)]
pub struct Rates {
    last: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Rates {
    /// Requests per second at `addr` since the previous page (None the first time).
    fn rate(&self, addr: &str, requests: u64) -> Option<f64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let previous = last.insert(addr.to_string(), (now, requests));
        let (then, before) = previous?;
        let secs = now.duration_since(then).as_secs_f64();
        (secs > 0.0).then(|| requests.saturating_sub(before) as f64 / secs)
    }
}

/// Text made safe for HTML.
fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

pub async fn render(coord: &Coordinator, rates: &Rates) -> String {
    struct ServerRow {
        id: u64,
        live: bool,
        shards: Vec<String>,
        backup: String,
    }
    let (servers, tables, map_version, replicas) = {
        let model = coord.model();
        let servers: Vec<ServerRow> = model
            .servers
            .iter()
            .map(|(id, shards)| ServerRow {
                id: *id,
                live: model.is_live(*id),
                shards: shards.clone(),
                backup: model.backup_addrs.get(id).cloned().unwrap_or_default(),
            })
            .collect();
        // table name -> tablets per server id (orphaned ones under 0), and
        // how many lost their objects (not yet acknowledged).
        let tables: BTreeMap<String, (usize, BTreeMap<u64, usize>, usize)> = model
            .tables
            .values()
            .map(|t| {
                let mut per = BTreeMap::new();
                for tablet in &t.tablets {
                    *per.entry(tablet.server_id).or_insert(0) += 1;
                }
                let lost = model.data_lost.range((t.id, 0)..=(t.id, u32::MAX)).count();
                (t.name.clone(), (t.tablets.len(), per, lost))
            })
            .collect();
        (servers, tables, model.map_version, model.replicas)
    };
    let live_shards: Vec<String> = servers
        .iter()
        .filter(|s| s.live)
        .flat_map(|s| s.shards.clone())
        .collect();
    let stats = join_all(
        live_shards
            .iter()
            .map(|addr| coord.shards.shard_stats(addr, STATS_TIMEOUT)),
    )
    .await;
    let stats: HashMap<&str, _> = live_shards.iter().map(String::as_str).zip(stats).collect();

    let mut h = String::with_capacity(8 * 1024);
    let live = servers.iter().filter(|s| s.live).count();
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"5\"><title>insitu cluster</title><style>\
         body{{font-family:system-ui,sans-serif;margin:2em;background:#fafafa;color:#222}}\
         h1{{font-size:1.6em}} table{{border-collapse:collapse;margin:1em 0}}\
         th,td{{border:1px solid #bbb;padding:.35em .8em;text-align:left}}\
         th{{background:#e8eef7}} .live{{color:#17702a;font-weight:bold}}\
         .dead{{color:#b00020;font-weight:bold}} .num{{text-align:right}}\
         </style></head><body><h1>insitu cluster</h1>\
         <p>{live} of {} servers live &middot; {} tables &middot; R = {replicas} &middot; map version {map_version}</p>",
        servers.len(),
        tables.len()
    );
    h.push_str(
        "<h2>Servers</h2><table><tr><th>server</th><th>state</th><th>shard</th>\
         <th class=\"num\">objects</th><th class=\"num\">memory used / budget (MiB)</th>\
         <th class=\"num\">requests/s</th><th>backup</th></tr>",
    );
    for s in &servers {
        let state = if s.live {
            "<span class=\"live\">live</span>"
        } else {
            "<span class=\"dead\">dead</span>"
        };
        for (i, shard) in s.shards.iter().enumerate() {
            let (objects, memory, rate) = match stats.get(shard.as_str()) {
                Some(Ok(st)) => (
                    st.tablets
                        .iter()
                        .map(|t| t.objects)
                        .sum::<u64>()
                        .to_string(),
                    format!(
                        "{} / {}",
                        mib(st.segment_bytes),
                        mib(st.memory_budget_bytes)
                    ),
                    rates
                        .rate(shard, st.requests)
                        .map_or_else(|| "&ndash;".to_string(), |r| format!("{r:.1}")),
                ),
                Some(Err(e)) => ("no answer".into(), esc(&e.to_string()), "&ndash;".into()),
                None => ("&ndash;".into(), "&ndash;".into(), "&ndash;".into()),
            };
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{objects}</td>\
                 <td class=\"num\">{memory}</td><td class=\"num\">{rate}</td><td>{}</td></tr>",
                if i == 0 {
                    format!("server {}", s.id)
                } else {
                    String::new()
                },
                if i == 0 { state } else { "" },
                esc(shard),
                if i == 0 {
                    esc(&s.backup)
                } else {
                    String::new()
                },
            );
        }
    }
    h.push_str("</table><h2>Tables</h2>");
    if tables.is_empty() {
        h.push_str("<p>No tables yet.</p>");
    } else {
        h.push_str(
            "<table><tr><th>table</th><th class=\"num\">tablets</th><th>tablets per server</th></tr>",
        );
        for (name, (count, per, lost)) in &tables {
            let mut spread: Vec<String> = per
                .iter()
                .map(|(server, n)| match *server {
                    crate::model::ORPHANED => format!("{n} awaiting a server"),
                    id => format!("server {id}: {n}"),
                })
                .collect();
            if *lost > 0 {
                spread.push(format!(
                    "{lost} lost their objects (insitu table ack-loss {name})"
                ));
            }
            let _ = write!(
                h,
                "<tr><td>{}</td><td class=\"num\">{count}</td><td>{}</td></tr>",
                esc(name),
                esc(&spread.join(", "))
            );
        }
        h.push_str("</table>");
    }
    h.push_str(
        "<p>Prometheus metrics: <a href=\"/metrics\">/metrics</a> \
         (every server's own metrics port has its shards' series).</p></body></html>\n",
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_is_escaped_and_rates_need_two_readings() {
        assert_eq!(
            esc("<a href=\"x\">&</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
        );
        let rates = Rates::default();
        assert_eq!(rates.rate("s", 10), None);
        std::thread::sleep(Duration::from_millis(20));
        let r = rates.rate("s", 30).expect("a rate");
        assert!(r > 0.0 && r < 20.0 / 0.02 + 1.0, "{r}");
    }
}
