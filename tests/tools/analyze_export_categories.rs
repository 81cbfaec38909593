//! The Parquet export's `category` and `site` columns say what `cushim summary` says: SQL
//! over the exported events gives, at the peak, each category's bytes of
//! `cushim summary --by category --json` and the summary's top site at the peak, for a
//! real PyTorch snapshot (its trace starts with blocks live before it, which no event
//! shows), for a logged program whose categories come from its NVTX range paths, and with a
//! user's own category (`--category NAME=REGEX`) given to both; blocks live before the
//! trace began count in the category their own frames give. A free carries the category and site of the block it frees; `pool` is the snapshot's and null
//! for a log. DuckDB comes as in `analyze_export` (skipped visibly where pip cannot get it).
use crate::analyze_export::{cushim, export_parquet_with, py_json, python_or_skip};
use crate::common;

use cushim_tools::analyze::category::{classifier, names, BEFORE as BEFORE_BLOCK};
use cushim_tools::analyze::category_rules::parse_user_rule;
use cushim_tools::analyze::summary::{summaries, Options};
use cushim_tools::analyze::timeline::start_of;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// Device 0 of the exported events: the first event after which allocated bytes (counted
/// as the summary counts them) are at their most; the bytes of each category and site up
/// to it; how many block events have no category, no site, a pool.
const AT_PEAK: &str = r#"
import duckdb, json, sys
d = sys.argv[1]
con = duckdb.connect()
con.sql(f"create view events as select * from read_parquet('{d}/events/*/*.parquet', hive_partitioning = true) where device = 0")
con.sql("""create view deltas as
  with e as (select *, bool_or(action = 'free_requested') over () as req from events)
  select seq, site, category,
    case when action = 'alloc' then size
         when action = 'free_requested' then -size
         when action = 'free_completed' and not req then -size
         else 0 end as delta
  from e""")
peak = con.sql("""select seq from (select seq, sum(delta) over (order by seq) as allocated from deltas)
                  order by allocated desc, seq limit 1""").fetchall()[0][0]
cats = con.sql(f"""select coalesce(category, '(null)'), sum(delta) from deltas where seq <= {peak}
                   group by all""").fetchall()
sites = con.sql(f"""select site, sum(delta) as b from deltas where seq <= {peak} and site is not null
                    group by site order by b desc, site limit 5""").fetchall()
blocks = "action in ('alloc', 'free_requested', 'free_completed')"
print(json.dumps({
  "peak_seq": peak,
  "categories": {c: int(b) for c, b in cats},
  "sites": [[s, int(b)] for s, b in sites],
  "blocks": con.sql(f"select count(*) from events where {blocks}").fetchall()[0][0],
  "no_category": con.sql(f"select count(*) from events where {blocks} and category is null").fetchall()[0][0],
  "no_site": con.sql(f"select count(*) from events where {blocks} and site is null").fetchall()[0][0],
  "pools": con.sql(f"select count(pool) from events where {blocks}").fetchall()[0][0],
}))
"#;

const BEFORE: &str = "before the recording / no stack";
const LIVE_BEFORE: &str = "[live before the trace began]";
const NO_STACK: &str = "<no stack>";

/// Export `file` (with `more` arguments), run [`AT_PEAK`] over it and hold it against the
/// summary of `file` (with the same arguments): the moment, every category's bytes and the
/// top site. Returns the SQL's answer.
fn check_against_summary(py: &Path, file: &Path, dir: &Path, more: &[&str]) -> Value {
    let out = dir.join("tables");
    export_parquet_with(&[file.to_path_buf()], &out, more);
    let got = py_json(py, AT_PEAK, &[&out]);

    let mut args: Vec<&std::ffi::OsStr> = vec![
        "summary".as_ref(),
        "--by".as_ref(),
        "category".as_ref(),
        "--json".as_ref(),
        file.as_os_str(),
    ];
    args.extend(more.iter().map(std::ffi::OsStr::new));
    let o = cushim(&args);
    assert!(o.status.success(), "{o:?}");
    let said: Value = serde_json::from_slice(&o.stdout).expect("the summary's JSON");
    let dev = said["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["device"] == 0)
        .expect("device 0");
    // The same moment: the summary's peak is after `after_event` events.
    assert_eq!(
        got["peak_seq"].as_u64().map(|s| s + 1),
        dev["after_event"].as_u64(),
        "{got}\n{dev}"
    );
    // Blocks live when the trace began are in no event: the SQL starts without them. The
    // summary counts each in the category its own frames give (else "before the
    // recording"): the classifier's, with the same rules.
    let snap = cushim_tools::analyze::input::read(file).expect("reading the input");
    let d0 = snap
        .devices
        .iter()
        .find(|d| d.ordinal == 0)
        .expect("device 0");
    let at_start = start_of(&snap, d0).state.allocated_bytes;
    let user: Vec<_> = more
        .chunks(2)
        .filter(|a| a[0] == "--category")
        .map(|a| parse_user_rule(a[1]).expect("a rule"))
        .collect();
    let mut c = classifier(&snap, d0, &user);
    let lives: Vec<(u64, u32)> = c
        .start
        .state
        .allocated
        .values()
        .map(|l| (l.size, l.stack))
        .collect();
    let cat_names = names(&user);
    let mut start_by: HashMap<String, i64> = HashMap::new();
    for (size, stack) in lives {
        let cat = c.category(BEFORE_BLOCK, stack) as usize;
        *start_by.entry(cat_names[cat].clone()).or_default() += size as i64;
    }
    let sql = |name: &str| got["categories"][name].as_i64().unwrap_or(0);
    let mut shown = 0;
    for c in dev["categories"].as_array().expect("categories") {
        let name = c["category"].as_str().expect("a name");
        let bytes = c["bytes"].as_i64().expect("bytes");
        let from_sql = sql(name) + start_by.get(name).copied().unwrap_or(0);
        assert_eq!(from_sql, bytes, "{name}: {got}\n{dev}");
        if bytes > 0 && name != BEFORE {
            shown += 1;
        }
    }
    // Every category the SQL sees is one of the summary's (no block without one).
    for (name, b) in got["categories"].as_object().expect("categories") {
        let known = dev["categories"]
            .as_array()
            .expect("categories")
            .iter()
            .any(|c| c["category"] == name.as_str());
        assert!(known || b.as_i64() == Some(0), "{name}: {got}");
    }
    assert!(
        shown >= 2,
        "the peak shows too few categories to tell: {dev}"
    );
    assert_eq!(got["no_category"], 0, "{got}");
    assert_eq!(got["no_site"], 0, "{got}");
    // The top site at the peak. When blocks were live at the trace's start, the summary
    // counts them too, under their sites marked as such or under `<no stack>` (no
    // record of their allocation): the top is then the one among the sites the trace
    // allocated, and `<no stack>` is set aside on both sides.
    let sums = summaries(&snap, &Options::default());
    let (_, s0) = sums.iter().find(|(o, _)| *o == 0).expect("device 0");
    let aside = |site: &str| at_start > 0 && (site.ends_with(LIVE_BEFORE) || site == NO_STACK);
    let top = s0
        .peak_sites
        .iter()
        .find(|s| !aside(&s.0))
        .expect("a site live at the peak");
    let sql_top = got["sites"]
        .as_array()
        .expect("sites")
        .iter()
        .find(|s| !aside(s[0].as_str().unwrap_or("")))
        .expect("a site in the SQL");
    assert_eq!(sql_top[0].as_str(), Some(top.0.as_str()), "{got}");
    assert_eq!(sql_top[1].as_u64(), Some(top.1), "{got}");
    got
}

#[test]
fn sql_over_a_real_snapshots_export_gives_the_summarys_categories_and_top_site_at_the_peak() {
    let Some(py) = python_or_skip("the DuckDB reading of a snapshot's categories") else {
        return;
    };
    let dir = common::scratch("export-categories-snapshot");
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real/cs336-bcrafton-memory_snapshot.pickle.gz");
    let got = check_against_summary(py, &file, &dir, &[]);
    // A snapshot records the pool of each segment: every block event carries it.
    assert_eq!(got["pools"], got["blocks"], "{got}");
    assert!(
        got["categories"]["optimizer state"].as_i64() > Some(0),
        "{got}"
    );
}

#[test]
fn sql_over_a_logs_export_gives_the_summarys_categories_from_its_nvtx_ranges_at_the_peak() {
    let Some(py) = python_or_skip("the DuckDB reading of a log's categories") else {
        return;
    };
    let dir = common::scratch("export-categories-log");
    let Some(log) = common::nvtx::logged_run(&dir) else {
        return;
    };
    let got = check_against_summary(py, &log, &dir, &[]);
    // A log records no pools.
    assert_eq!(got["pools"], 0, "{got}");
}

#[test]
fn a_users_own_category_names_the_exported_rows_as_the_summary_names_them() {
    let Some(py) = python_or_skip("the DuckDB reading of a user's category") else {
        return;
    };
    let dir = common::scratch("export-categories-user");
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real/cs336-bcrafton-memory_snapshot.pickle.gz");
    // The optimizer's update temporaries (optimizer.py:78), which the built-in rules call
    // optimizer temporaries.
    let got = check_against_summary(
        py,
        &file,
        &dir,
        &["--category", r"adam update=optimizer\.py:78"],
    );
    assert!(got["categories"]["adam update"].as_i64() > Some(0), "{got}");
    assert_eq!(
        got["categories"]["optimizer temporaries"]
            .as_i64()
            .unwrap_or(0),
        0,
        "the user's rule comes first: {got}"
    );
}
