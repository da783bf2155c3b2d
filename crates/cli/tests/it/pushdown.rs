//! Data operations (pushdown) on a real multi-server cluster (separate
//! processes): count, aggregate, update, gradient and training, the CLI
//! commands, numbers out of range, resent updates (exactness while tablets
//! move and objects are overwritten is in `pushdown_exact.rs`).

use crate::common;

use common::pushdown::{load, update_request, value, with_table};
use common::{fails_saying, rt};

use std::time::Duration;

use common::Cluster;
use insitu_client::{Client, Selection, Status};
use insitu_compute::{AggExt, gradient_flat};
use insitu_protocol::Number;
use insitu_protocol::plan::{
    CmpOp, Field, KeyRange, Op, PointLayout, PredOp, ScanPlan, Source, UpdateAction, int_key,
};

fn cmp(field: Field, op: CmpOp, value: Number) -> PredOp {
    PredOp::Cmp { field, op, value }
}

#[test]
fn operations_work_on_a_multi_server_cluster_and_from_the_cli() {
    let n = 3000u64;
    let (cluster, rt, client, t) = with_table(3, 2, "nums", 6);
    rt.block_on(load(&client, t, n, value));

    rt.block_on(async {
        assert_eq!(client.count(t, &Selection::all()).await.unwrap(), n);
        let ge1000 = Selection::filter(vec![cmp(Field::I64(0), CmpOp::Ge, Number::I64(1000))]);
        assert_eq!(client.count(t, &ge1000).await.unwrap(), n - 1000);
        // Key range over the 8-byte keys: bytewise, so pick keys by first byte.
        let kr = Selection {
            key_range: Some(KeyRange {
                start: vec![10],
                end: Some(vec![20]),
            }),
            ..Selection::all()
        };
        let want = (0..n).filter(|i| (10..20).contains(&(i & 0xff))).count() as u64;
        assert_eq!(client.count(t, &kr).await.unwrap(), want);

        // Aggregates, every strategy.
        let all_sum: i128 = (0..n as i128).sum();
        for source in [
            Source::Log,
            Source::Index,
            Source::IntKeys { from: 0, to: n },
        ] {
            let (a, out) = client
                .aggregate_with(t, Field::I64(0), &Selection::all(), source.clone())
                .await
                .unwrap();
            assert_eq!((a.count, a.sum_int), (n, all_sum), "{source:?}");
            assert_eq!(a.min, Some(Number::I64(0)));
            assert_eq!(a.max, Some(Number::I64(n as i64 - 1)));
            assert_eq!(out.tablets, 6);
        }
        // i64@0 > 5 and (f64@8 between 1.5 and 200 or not i32@16 = 3)
        let p = vec![
            cmp(Field::I64(0), CmpOp::Gt, Number::I64(5)),
            PredOp::Between {
                field: Field::F64(8),
                lo: Number::F64(1.5),
                hi: Number::I64(200),
            },
            cmp(Field::I32(16), CmpOp::Eq, Number::I64(3)),
            PredOp::Not,
            PredOp::Or,
            PredOp::And,
        ];
        let keep = |i: u64| i > 5 && ((1.5..=200.0).contains(&(i as f64 / 2.0)) || i % 7 != 3);
        let a = client
            .aggregate(t, Field::F64(8), &Selection::filter(p.clone()))
            .await
            .unwrap();
        let want: Vec<u64> = (0..n).filter(|&i| keep(i)).collect();
        assert_eq!(a.count, want.len() as u64);
        assert_eq!(
            a.sum_float,
            want.iter().map(|&i| i as f64 / 2.0).sum::<f64>()
        );
        assert_eq!(a.avg(true), Some(a.sum_float / a.count as f64));
        let a = client
            .aggregate(t, Field::I32(16), &Selection::all())
            .await
            .unwrap();
        assert_eq!(a.sum_int, (0..n).map(|i| (i % 7) as i128).sum::<i128>());

        // Update: add 10 to i64@0 where i32@16 = 3; each change is a new version.
        let before = client.read(t, int_key(3)).await.unwrap().unwrap().1;
        let sel3 = Selection::filter(vec![cmp(Field::I32(16), CmpOp::Eq, Number::I64(3))]);
        let updated = client
            .update(t, Field::I64(0), UpdateAction::Add(Number::I64(10)), &sel3)
            .await
            .unwrap();
        let threes = (0..n).filter(|i| i % 7 == 3).count() as u64;
        assert_eq!(updated, threes);
        let (v, after) = client.read(t, int_key(3)).await.unwrap().unwrap();
        assert!(after > before, "the update wrote a new version");
        assert_eq!(i64::from_le_bytes(v[..8].try_into().unwrap()), 13);
        let a = client
            .aggregate(t, Field::I64(0), &Selection::all())
            .await
            .unwrap();
        assert_eq!(a.sum_int, all_sum + 10 * threes as i128);
        // Set, then back.
        let n_set = client
            .update(t, Field::F64(8), UpdateAction::Set(Number::F64(1.0)), &sel3)
            .await
            .unwrap();
        assert_eq!(n_set, threes);
        let a = client.aggregate(t, Field::F64(8), &sel3).await.unwrap();
        assert_eq!((a.count, a.sum_float), (threes, threes as f64));

        // A short value is an error naming the key and the field.
        let short = client.create_table("short", 2).await.unwrap().id;
        client.write(short, int_key(1), value(1)).await.unwrap();
        client.write(short, b"tiny", b"abc").await.unwrap();
        let e = client
            .aggregate(short, Field::I64(0), &Selection::all())
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(Status::BadRequest), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("\"tiny\"") && msg.contains("i64@0") && msg.contains("3 bytes"),
            "{msg}"
        );
        // A malformed plan is refused, not run.
        let bad = ScanPlan {
            filter: vec![PredOp::And],
            ..ScanPlan::new(Op::Count)
        };
        let e = client.execute_plan(t, &bad).await.unwrap_err();
        assert_eq!(e.status(), Some(Status::BadRequest), "{e}");
        let huge = ScanPlan {
            source: Source::IntKeys {
                from: 0,
                to: u64::MAX,
            },
            ..ScanPlan::new(Op::Count)
        };
        let e = client.execute_plan(t, &huge).await.unwrap_err();
        assert_eq!(e.status(), Some(Status::BadRequest), "{e}");
    });

    // The CLI.
    let ok = |args: &[&str]| {
        let (code, out, err) = cluster.cli(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        out.trim().to_string()
    };
    assert_eq!(ok(&["count", "nums"]), n.to_string());
    // At one snapshot (the default with 6 tablets), forced, or not.
    assert_eq!(ok(&["count", "nums", "--at-snapshot"]), n.to_string());
    assert_eq!(ok(&["count", "nums", "--no-snapshot"]), n.to_string());
    assert_eq!(
        ok(&["agg", "nums", "count", "i64@0", "--at-snapshot"]),
        n.to_string()
    );
    let (code, _, err) = cluster.cli(&["count", "nums", "--at-snapshot", "--no-snapshot"]);
    assert!(code != 0 && err.contains("cannot be used with"), "{err}");
    assert_eq!(
        ok(&["count", "nums", "--where", "i64@0 < 100 and not i32@16 = 3"]),
        (0..n)
            .filter(|i| {
                let v = if i % 7 == 3 { i + 10 } else { *i };
                v < 100 && i % 7 != 3
            })
            .count()
            .to_string()
    );
    assert_eq!(
        ok(&["agg", "nums", "sum", "i32@16"]),
        (0..n).map(|i| i % 7).sum::<u64>().to_string()
    );
    assert_eq!(ok(&["agg", "nums", "min", "i64@0"]), "0");
    assert_eq!(
        ok(&[
            "agg",
            "nums",
            "count",
            "i64@0",
            "--where",
            "i32@16 between 1 and 2"
        ]),
        (0..n)
            .filter(|i| (1..=2).contains(&(i % 7)))
            .count()
            .to_string()
    );
    assert_eq!(
        ok(&[
            "update",
            "nums",
            "i64@0",
            "--add",
            "-10",
            "--where",
            "i32@16 = 3"
        ]),
        format!("updated {} objects", (0..n).filter(|i| i % 7 == 3).count())
    );
    assert_eq!(
        ok(&["agg", "nums", "sum", "i64@0"]),
        (0..n).sum::<u64>().to_string()
    );
    assert_eq!(
        ok(&["agg", "nums", "avg", "i64@0"]),
        ((n - 1) as f64 / 2.0).to_string()
    );
    // Clear errors.
    let fails = |args: &[&str], want: &[&str]| fails_saying(&cluster, args, want);
    fails(
        &["agg", "nums", "sum", "i64"],
        &["bad field", "TYPE@OFFSET"],
    );
    fails(&["agg", "nums", "sum", "q64@0"], &["unknown type"]);
    fails(&["agg", "nums", "median", "i64@0"], &["unknown aggregate"]);
    fails(
        &["count", "nums", "--where", "i64@0 >"],
        &["column 8", "a number"],
    );
    fails(
        &["count", "nums", "--where", "i64@0 > 1 or"],
        &["expected a field"],
    );
    fails(
        &["agg", "short", "sum", "i64@0"],
        &["too short", "\"tiny\""],
    );
    fails(
        &["update", "nums", "i64@0", "--add", "0.5"],
        &["integer field"],
    );
    fails(&["count", "nope"], &["unknown table"]);
}

#[test]
fn pushdown_training_reaches_the_in_memory_weights() {
    let cluster = Cluster::start(2, 2);
    let rt = rt();
    let (n, dims) = (3000usize, 8usize);
    let mut rng = common::rng(42);
    let mut rnd = move || rng.f32() * 2.0 - 1.0;
    let x: Vec<f32> = (0..n * dims).map(|_| rnd()).collect();
    let y: Vec<u8> = (0..n)
        .map(|i| {
            let z: f32 = x[i * dims..(i + 1) * dims]
                .iter()
                .enumerate()
                .map(|(j, v)| v * (j as f32 - 3.5))
                .sum();
            (z + 0.3 * rnd() > 0.0) as u8
        })
        .collect();
    let client = rt.block_on(Client::connect(&cluster.addr())).unwrap();
    let t = rt.block_on(client.create_table("points", 5)).unwrap().id;
    rt.block_on(load(&client, t, n as u64, |i| {
        let i = i as usize;
        let mut v: Vec<u8> = x[i * dims..(i + 1) * dims]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        v.push(y[i]);
        v
    }));
    let layout = PointLayout {
        offset: 0,
        dims: dims as u32,
        label_offset: (dims * 4) as u32,
    };
    let (iters, rate) = (30u32, 0.5f64);
    let model = rt
        .block_on(client.train_logreg(t, layout, iters, rate))
        .unwrap();

    // The same loop over a plain in-memory array.
    let (mut w, mut b) = (vec![0f32; dims], 0f32);
    let mut losses = Vec::new();
    for _ in 0..iters {
        let g = gradient_flat(&x, &y, dims, &w, b);
        losses.push(g.loss / n as f64);
        insitu_client::ops::step(&mut w, &mut b, &g, rate);
    }
    for (a, e) in model.weights.iter().zip(&w) {
        assert!(
            (a - e).abs() <= 1e-4 * e.abs().max(1.0),
            "weights {:?} vs {:?}",
            model.weights,
            w
        );
    }
    assert!((model.bias - b).abs() <= 1e-4 * b.abs().max(1.0));
    assert!(
        losses.last().unwrap() < &losses[0],
        "training lowers the loss"
    );
    for (a, e) in model.losses.iter().zip(&losses) {
        assert!((a - e).abs() <= 1e-6 * e.abs(), "{a} vs {e}");
    }

    // And from the CLI.
    let (code, out, err) = cluster.cli(&[
        "train",
        "logreg",
        "points",
        "--dims",
        "8",
        "--iterations",
        "30",
        "--rate",
        "0.5",
    ]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("weights "))
        .expect("weights line");
    let got: Vec<f32> = line["weights ".len()..]
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect();
    for (a, e) in got.iter().zip(&w) {
        assert!((a - e).abs() <= 1e-4 * e.abs().max(1.0), "{got:?} vs {w:?}");
    }
}

/// Issue: `update u8@0 --set 300` stored 44, `i32@0 --set 5000000000` stored
/// 705032704, `--add 1` at i64::MAX wrapped, `agg sum` saturated, and
/// `--set 1e400` stored inf, all with exit 0. Each is now refused (nothing
/// written) or exact.
#[test]
fn out_of_range_numbers_are_refused_and_sums_are_exact() {
    let (cluster, rt, client, t) = with_table(1, 2, "edge", 4);
    // i64@0 = i64::MAX, i32@8 = 7, u8@12 = 9, f64@16 = 1.5
    let mut v = Vec::new();
    v.extend_from_slice(&i64::MAX.to_le_bytes());
    v.extend_from_slice(&7i32.to_le_bytes());
    v.extend_from_slice(&[9, 0, 0, 0]);
    v.extend_from_slice(&1.5f64.to_le_bytes());
    let original = v.clone();
    rt.block_on(load(&client, t, 3, move |_| v.clone()));

    let fails = |args: &[&str], want: &[&str]| fails_saying(&cluster, args, want);
    fails(
        &["update", "edge", "u8@12", "--set", "300"],
        &["300", "out of range", "u8@12"],
    );
    fails(
        &["update", "edge", "i32@8", "--set", "5000000000"],
        &["5000000000", "out of range", "i32@8"],
    );
    fails(
        &["update", "edge", "i64@0", "--add", "1"],
        &["out of range for i64", "nothing was written", "integer key"],
    );
    fails(
        &["update", "edge", "f64@16", "--set", "1e400"],
        &["1e400", "not a finite number"],
    );
    // Nothing was written by any of them.
    for i in 0..3 {
        let (got, _) = rt.block_on(client.read(t, int_key(i))).unwrap().unwrap();
        assert_eq!(got, original, "object {i} changed");
    }
    // The sum of three i64::MAX is exact, not saturated.
    let (code, out, err) = cluster.cli(&["agg", "edge", "sum", "i64@0"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), (3 * i64::MAX as i128).to_string());
    // The servers check too: a plan sent straight to a shard, without the
    // client's check, is refused.
    let info = rt.block_on(client.open_table("edge")).unwrap();
    let tab = &info.tablets[0];
    let request = update_request(
        t,
        tab,
        Field::U8(12),
        UpdateAction::Set(Number::I64(300)),
        0,
        0,
    );
    let (status, body) = raw_call(&tab.addr, &request);
    assert_eq!(status, Status::BadRequest);
    assert!(body.contains("out of range"), "{body}");
    let (got, _) = rt.block_on(client.read(t, int_key(0))).unwrap().unwrap();
    assert_eq!(got, original);

    // One tablet refuses (an object at i64::MAX), the other applies: the
    // error says which tablets applied, with counts, and which did not.
    let mixed = rt.block_on(client.create_table("mixed", 2)).unwrap().id;
    rt.block_on(load(&client, mixed, 40, value));
    rt.block_on(client.write(mixed, int_key(1000), i64::MAX.to_le_bytes()))
        .unwrap();
    let e = rt
        .block_on(client.update(
            mixed,
            Field::I64(0),
            UpdateAction::Add(Number::I64(1)),
            &Selection::all(),
        ))
        .unwrap_err();
    let msg = e.to_string();
    assert_eq!(e.status(), Some(Status::BadRequest), "{msg}");
    assert!(
        msg.contains("failed on 1 of 2 tablets")
            && msg.contains("objects)")
            && msg.contains("not applied on [0x")
            && msg.contains("out of range for i64"),
        "{msg}"
    );
    let (got, _) = rt
        .block_on(client.read(mixed, int_key(1000)))
        .unwrap()
        .unwrap();
    assert_eq!(got[..], i64::MAX.to_le_bytes());
}

/// Send one request on a fresh connection; the reply's status and body (Debug).
fn raw_call(addr: &str, request: &insitu_protocol::Request<'_>) -> (Status, String) {
    use std::io::{Read, Write};
    let mut buf = bytes::BytesMut::new();
    insitu_protocol::encode_request(&mut buf, 1, request).unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&buf).unwrap();
    let mut header = [0u8; insitu_protocol::HEADER_BYTES];
    s.read_exact(&mut header).unwrap();
    let (h, len) = insitu_protocol::frame::check_header(&header, insitu_protocol::MAX_BODY_BYTES)
        .unwrap()
        .unwrap();
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    let reply = insitu_protocol::decode_response(&body).unwrap();
    (h.status, format!("{reply:?}"))
}

/// A resent update (same operation id, e.g. after its connection dropped)
/// is answered with the remembered result, not applied twice; a new id applies.
#[test]
fn a_resent_update_is_applied_once() {
    let (_cluster, rt, client, t) = with_table(1, 1, "once", 1);
    rt.block_on(load(&client, t, 10, value));
    let info = rt.block_on(client.open_table("once")).unwrap();
    let tab = &info.tablets[0];
    let add = |op_id| {
        let action = UpdateAction::Add(Number::I64(100));
        update_request(t, tab, Field::I64(0), action, op_id, 10_000)
    };
    let first = raw_call(&tab.addr, &add(0xfeed));
    let resent = raw_call(&tab.addr, &add(0xfeed));
    assert_eq!(first.0, Status::Ok, "{}", first.1);
    assert_eq!(resent, first, "the resend gets the remembered result");
    let sum = |rt: &tokio::runtime::Runtime| {
        rt.block_on(client.aggregate(t, Field::I64(0), &Selection::all()))
            .unwrap()
            .sum_int
    };
    assert_eq!(sum(&rt), 45 + 100 * 10, "applied once");
    let other = raw_call(&tab.addr, &add(0xbeef));
    assert_eq!(other.0, Status::Ok, "{}", other.1);
    assert_eq!(sum(&rt), 45 + 200 * 10, "a new operation id applies again");
}
