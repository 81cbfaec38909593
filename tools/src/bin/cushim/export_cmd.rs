//! `cushim export`: the command's side of `cushim_tools::export` (what it writes is there
//! and in `docs/EXPORT.md`): which output, and one line per input written.

use cushim_tools::analyze::category_rules::parse_user_rules;
use cushim_tools::export::{parquet_dir, trace};
use std::path::{Path, PathBuf};

/// Export `files` as Parquet tables into `parquet` and/or the first as a Chrome trace at
/// `trace_out`.
pub fn export(
    files: &[PathBuf],
    parquet: Option<&Path>,
    trace_out: Option<&Path>,
    replace: bool,
    base_ns: Option<i64>,
    rules: &[String],
) -> Result<i32, String> {
    let user = parse_user_rules(rules)?;
    if parquet.is_none() && trace_out.is_none() {
        return Err("nothing to write: give --parquet DIR, --trace FILE.json or both".into());
    }
    if let Some(dir) = parquet {
        let w = parquet_dir::export(files, dir, replace, &user)?;
        for (name, rank, n) in &w.inputs {
            println!("{name}: rank {rank}, {n} events");
        }
        println!(
            "wrote {} tables of {} inputs under {}",
            w.files.len(),
            w.inputs.len(),
            dir.display()
        );
    }
    if let Some(out) = trace_out {
        let [file] = files else {
            return Err(format!(
                "--trace writes one input's timeline; {} were given",
                files.len()
            ));
        };
        let w = trace::export(file, out, replace, base_ns)?;
        println!(
            "{}: {} events as {} trace events in {}",
            file.display(),
            w.events,
            w.trace_events,
            out.display()
        );
    }
    Ok(0)
}
