#!/usr/bin/env python3
"""Computes the stored TPC-H answers with DuckDB.

Generates the 8 tables at a scale factor with this crate's generator (the
dump_csv example), loads them into an in-memory DuckDB with types matching
the crate's schemas, runs queries/q01.sql .. q22.sql and writes
answers/sf<SF>/qNN.csv (header row first; decimals in full, floats in
shortest round-trip form, dates as YYYY-MM-DD).

Usage: python3 crates/tpch/scripts/tpch_answers.py [SF]   (default 0.01)
Needs: cargo, and the duckdb Python package.
"""

import csv
import datetime
import decimal
import os
import subprocess
import sys
import tempfile

import duckdb

CRATE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MONEY = "DECIMAL(15,2) NOT NULL"
TABLES = {
    "part": [("p_partkey", "BIGINT"), ("p_name", "VARCHAR"), ("p_mfgr", "VARCHAR"),
             ("p_brand", "VARCHAR"), ("p_type", "VARCHAR"), ("p_size", "INTEGER"),
             ("p_container", "VARCHAR"), ("p_retailprice", MONEY), ("p_comment", "VARCHAR")],
    "supplier": [("s_suppkey", "BIGINT"), ("s_name", "VARCHAR"), ("s_address", "VARCHAR"),
                 ("s_nationkey", "BIGINT"), ("s_phone", "VARCHAR"), ("s_acctbal", MONEY),
                 ("s_comment", "VARCHAR")],
    "partsupp": [("ps_partkey", "BIGINT"), ("ps_suppkey", "BIGINT"), ("ps_availqty", "INTEGER"),
                 ("ps_supplycost", MONEY), ("ps_comment", "VARCHAR")],
    "customer": [("c_custkey", "BIGINT"), ("c_name", "VARCHAR"), ("c_address", "VARCHAR"),
                 ("c_nationkey", "BIGINT"), ("c_phone", "VARCHAR"), ("c_acctbal", MONEY),
                 ("c_mktsegment", "VARCHAR"), ("c_comment", "VARCHAR")],
    "orders": [("o_orderkey", "BIGINT"), ("o_custkey", "BIGINT"), ("o_orderstatus", "VARCHAR"),
               ("o_totalprice", MONEY), ("o_orderdate", "DATE"), ("o_orderpriority", "VARCHAR"),
               ("o_clerk", "VARCHAR"), ("o_shippriority", "INTEGER"), ("o_comment", "VARCHAR")],
    "lineitem": [("l_orderkey", "BIGINT"), ("l_partkey", "BIGINT"), ("l_suppkey", "BIGINT"),
                 ("l_linenumber", "INTEGER"), ("l_quantity", MONEY), ("l_extendedprice", MONEY),
                 ("l_discount", MONEY), ("l_tax", MONEY), ("l_returnflag", "VARCHAR"),
                 ("l_linestatus", "VARCHAR"), ("l_shipdate", "DATE"), ("l_commitdate", "DATE"),
                 ("l_receiptdate", "DATE"), ("l_shipinstruct", "VARCHAR"),
                 ("l_shipmode", "VARCHAR"), ("l_comment", "VARCHAR")],
    "nation": [("n_nationkey", "BIGINT"), ("n_name", "VARCHAR"), ("n_regionkey", "BIGINT"),
               ("n_comment", "VARCHAR")],
    "region": [("r_regionkey", "BIGINT"), ("r_name", "VARCHAR"), ("r_comment", "VARCHAR")],
}


def render(v):
    """A result value as answer-file text."""
    if v is None:
        return ""
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    return str(v)


def main():
    sf = sys.argv[1] if len(sys.argv) > 1 else "0.01"
    out_dir = os.path.join(CRATE, "answers", f"sf{sf}")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as data:
        subprocess.run(["cargo", "run", "-q", "-p", "insitu-tpch", "--example", "dump_csv",
                        "--", data, sf], check=True, cwd=CRATE)
        db = duckdb.connect()
        for table, columns in TABLES.items():
            cols = ", ".join(
                f"{n} {t if 'NOT NULL' in t else t + ' NOT NULL'}" for n, t in columns)
            db.execute(f"CREATE TABLE {table} ({cols})")
            # All columns as text first, so DuckDB's CSV sniffer neither trims
            # nor reinterprets anything; the INSERT casts to the column types.
            path = os.path.join(data, f"{table}.csv")
            db.execute(f"INSERT INTO {table} SELECT * FROM read_csv('{path}', header=true, "
                       f"all_varchar=true, quote='\"', escape='\"', delim=',')")
            n = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            print(f"{table}: {n} rows")
    for q in range(1, 23):
        with open(os.path.join(CRATE, "queries", f"q{q:02}.sql")) as f:
            sql = f.read()
        cur = db.execute(sql)
        header = [d[0] for d in cur.description]
        rows = cur.fetchall()
        with open(os.path.join(out_dir, f"q{q:02}.csv"), "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(header)
            for row in rows:
                w.writerow([render(v) for v in row])
        print(f"q{q:02}: {len(rows)} rows")


if __name__ == "__main__":
    main()
