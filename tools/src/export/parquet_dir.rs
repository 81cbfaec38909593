//! `cushim export --parquet DIR`: inputs as three Parquet tables (schema in
//! `docs/EXPORT.md`), partitioned by rank as Hive lays partitions out, so DuckDB, Spark,
//! Trino and pyarrow read the rank from the path:
//!
//! ```text
//! DIR/events/rank=R/part-K.parquet
//! DIR/stacks/rank=R/part-K.parquet
//! DIR/segments/rank=R/part-K.parquet
//! ```
//!
//! K counts the inputs of one rank (a fork child's log shares its parent's rank), in the
//! order given. The rank is the log header's; an input that records none (a snapshot)
//! takes its place among the inputs, and a line on stderr says so. The rank is in the
//! path only, never a column of the files (Spark refuses a column that is both).
//!
//! Policy on the directory: one that holds anything is refused unless `replace` is asked
//! for, and then only the three table folders are removed before writing; every file is
//! written under a random temporary name and renamed into place when whole
//! (`export::table`). An input with no events is an error (one line); the inputs before
//! it stay exported.

use crate::analyze::category_rules::UserRule;
use crate::analyze::frames::{classify, Class};
use crate::analyze::model::Frame;
use crate::export::source::{open, walk, Row, SegRow, Sink};
use crate::export::table::{Kind, Spec, Table};
use parquet::data_type::ByteArray;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The tables' folders under the output directory.
pub const TABLES: [&str; 3] = ["events", "stacks", "segments"];

/// The events table's columns.
pub const EVENTS: [Spec; 16] = [
    ("source", Kind::Str, false),
    ("pid", Kind::I64, true),
    ("seq", Kind::I64, false),
    ("device", Kind::I32, false),
    ("time_us", Kind::I64, true),
    ("action", Kind::Str, false),
    ("address", Kind::I64, false),
    ("size", Kind::I64, false),
    ("stream", Kind::I64, false),
    ("pool", Kind::Str, true),
    ("segment", Kind::I64, true),
    ("category", Kind::Str, true),
    ("site", Kind::Str, true),
    ("range", Kind::Str, true),
    ("stack_id", Kind::I64, false),
    ("device_free", Kind::I64, true),
];

/// The stacks table's columns: one row per frame.
pub const STACKS: [Spec; 9] = [
    ("source", Kind::Str, false),
    ("pid", Kind::I64, true),
    ("stack_id", Kind::I64, false),
    ("depth", Kind::I32, false),
    ("function", Kind::Str, false),
    ("file", Kind::Str, false),
    ("line", Kind::I64, false),
    ("library", Kind::Str, true),
    ("class", Kind::Str, false),
];

/// The segments table's columns.
pub const SEGMENTS: [Spec; 12] = [
    ("source", Kind::Str, false),
    ("pid", Kind::I64, true),
    ("device", Kind::I32, false),
    ("address", Kind::I64, false),
    ("size", Kind::I64, false),
    ("stream", Kind::I64, false),
    ("pool", Kind::Str, true),
    ("kind", Kind::Str, true),
    ("created_us", Kind::I64, true),
    ("freed_us", Kind::I64, true),
    ("allocated_at_end", Kind::I64, true),
    ("live_at_end", Kind::I32, false),
];

/// What one export wrote.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    /// (input, rank, events) per input.
    pub inputs: Vec<(String, i64, u64)>,
    pub files: Vec<PathBuf>,
}

/// Refuse a directory that holds anything unless `replace`; then remove the tables'
/// folders.
pub fn prepare_dir(dir: &Path, replace: bool) -> Result<(), String> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(format!("{}: exists and is not a directory", dir.display()))
        }
        Ok(_) => {
            let mut entries =
                std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if entries.next().is_some() {
                if !replace {
                    return Err(format!(
                        "{}: the directory holds files; give --replace to replace the tables in it",
                        dir.display()
                    ));
                }
                for t in TABLES {
                    let p = dir.join(t);
                    match std::fs::symlink_metadata(&p) {
                        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p)
                            .map_err(|e| format!("removing {}: {e}", p.display()))?,
                        Ok(_) => std::fs::remove_file(&p)
                            .map_err(|e| format!("removing {}: {e}", p.display()))?,
                        Err(_) => {}
                    }
                }
            }
        }
        Err(_) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?
        }
    }
    Ok(())
}

fn partition(dir: &Path, table: &str, rank: i64, part: usize) -> Result<PathBuf, String> {
    let d = dir.join(table).join(format!("rank={rank}"));
    std::fs::create_dir_all(&d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    Ok(d.join(format!("part-{part}.parquet")))
}

/// The module of an unsymbolized native frame (`libfoo.so.1+0x1f2e`), or the file of a
/// native frame that names a shared object.
fn library(f: &Frame) -> Option<&str> {
    if let Some((m, off)) = f.name.rsplit_once("+0x") {
        if !m.is_empty() && off.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Some(m);
        }
    }
    let file = f.file.rsplit('/').next().unwrap_or("");
    (file.ends_with(".so") || file.contains(".so.")).then_some(file)
}

fn class_name(c: Class) -> &'static str {
    match c {
        Class::Program => "program",
        Class::Library => "library",
        Class::Machinery => "machinery",
        Class::Start => "start",
        Class::ThreadStart => "thread start",
    }
}

/// The three tables of one input.
struct Tables<'u> {
    user: &'u [UserRule],
    source: ByteArray,
    pid: Option<i64>,
    events: Table,
    stacks: Table,
    segments: Table,
    actions: HashMap<&'static str, ByteArray>,
}

impl Sink for Tables<'_> {
    fn event(&mut self, r: &Row) -> Result<(), String> {
        let t = &mut self.events;
        let name = r.action.name();
        let action = self
            .actions
            .entry(name)
            .or_insert_with(|| ByteArray::from(name.as_bytes().to_vec()))
            .clone();
        t.str(0, self.source.clone());
        t.opt_i64(1, self.pid);
        t.i64(2, r.seq as i64);
        t.i32(3, r.device);
        t.opt_i64(4, r.time_us);
        t.str(5, action);
        t.i64(6, r.addr as i64);
        t.i64(7, r.size as i64);
        t.i64(8, r.stream as i64);
        t.opt_str(9, r.pool.cloned());
        t.opt_i64(10, r.segment.map(|s| s as i64));
        t.opt_str(11, r.category.cloned());
        t.opt_str(12, r.site.cloned());
        t.opt_str(13, r.range.cloned());
        t.i64(14, i64::from(r.stack_id));
        t.opt_i64(15, r.device_free.map(|f| f as i64));
        t.end_row()
    }

    fn categories(&self) -> Option<Vec<UserRule>> {
        Some(self.user.to_vec())
    }

    fn stack(&mut self, id: u32, frames: &[&Frame]) -> Result<(), String> {
        let t = &mut self.stacks;
        for (depth, f) in frames.iter().enumerate() {
            t.str(0, self.source.clone());
            t.opt_i64(1, self.pid);
            t.i64(2, i64::from(id));
            t.i32(3, depth as i32);
            t.str(4, ByteArray::from(f.name.as_bytes().to_vec()));
            t.str(5, ByteArray::from(f.file.as_bytes().to_vec()));
            t.i64(6, f.line);
            t.opt_str(
                7,
                library(f).map(|l| ByteArray::from(l.as_bytes().to_vec())),
            );
            t.str(
                8,
                ByteArray::from(class_name(classify(f)).as_bytes().to_vec()),
            );
            t.end_row()?;
        }
        Ok(())
    }

    fn segment(&mut self, s: &SegRow) -> Result<(), String> {
        let t = &mut self.segments;
        t.str(0, self.source.clone());
        t.opt_i64(1, self.pid);
        t.i32(2, s.device);
        t.i64(3, s.address as i64);
        t.i64(4, s.size as i64);
        t.i64(5, s.stream as i64);
        t.opt_str(6, s.pool.clone());
        t.opt_str(7, s.kind.clone());
        t.opt_i64(8, s.created_us);
        t.opt_i64(9, s.freed_us);
        t.opt_i64(10, s.allocated_at_end.map(|a| a as i64));
        t.i32(11, i32::from(s.freed_us.is_none()));
        t.end_row()
    }
}

/// Export `inputs` into `dir` (see the module docs).
pub fn export(
    inputs: &[PathBuf],
    dir: &Path,
    replace: bool,
    user: &[UserRule],
) -> Result<Written, String> {
    prepare_dir(dir, replace)?;
    let mut parts: HashMap<i64, usize> = HashMap::new();
    let mut out = Written::default();
    for (i, path) in inputs.iter().enumerate() {
        let input = open(path)?;
        let rank = input.rank.unwrap_or(i as i64);
        let part = parts.entry(rank).or_insert(0);
        let k = *part;
        *part += 1;
        let mut t = Tables {
            user,
            source: ByteArray::from(input.name.as_bytes().to_vec()),
            pid: input.pid,
            events: Table::create(&partition(dir, "events", rank, k)?, "event", &EVENTS)?,
            stacks: Table::create(&partition(dir, "stacks", rank, k)?, "stack", &STACKS)?,
            segments: Table::create(&partition(dir, "segments", rank, k)?, "segment", &SEGMENTS)?,
            actions: HashMap::new(),
        };
        let n = walk(&input, &mut t)?;
        if n == 0 {
            return Err(format!(
                "{}: no events to export (a snapshot recorded without allocation history, or an empty log)",
                input.name
            ));
        }
        for table in [t.events, t.stacks, t.segments] {
            out.files.push(table.finish()?);
        }
        if input.rank.is_none() {
            eprintln!(
                "cushim: {}: records no rank; exported as rank {i} (its place among the inputs)",
                input.name
            );
        }
        out.inputs.push((input.name, rank, n));
    }
    Ok(out)
}
