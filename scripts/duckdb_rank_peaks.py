#!/usr/bin/env python3
# The per-rank peak of allocated bytes over `cushim export --parquet DIR` tables, timed
# (BENCHMARKS.md, "Export"): python3 scripts/duckdb_rank_peaks.py DIR  (needs `pip install duckdb`).
import duckdb, sys, time
d = sys.argv[1]
con = duckdb.connect()
ev = f"read_parquet('{d}/events/*/*.parquet', hive_partitioning = true)"
t0 = time.perf_counter()
n = con.sql(f"select count(*) from {ev}").fetchall()[0][0]
t1 = time.perf_counter()
rows = con.sql(f"""
with req as (select rank, device, bool_or(action = 'free_requested') as req from {ev} group by all),
deltas as (select e.rank, e.device, seq,
    case when action = 'alloc' then size when action = 'free_requested' then -size
         when action = 'free_completed' and not req then -size else 0 end as delta
    from {ev} e join req using (rank, device))
select rank, device, max(allocated) as peak from
  (select rank, device, sum(delta) over (partition by rank, device order by seq) as allocated from deltas)
group by all order by rank""").fetchall()
t2 = time.perf_counter()
print(f"count(*) {n} in {t1-t0:.2f} s; peak query: {t2-t1:.2f} s for {len(rows)} (rank, device) rows; first {rows[:2]} last {rows[-1]}")
