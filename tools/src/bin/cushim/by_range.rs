//! `cushim summary --by range`: bytes per NVTX range path of each file (a snapshot or a
//! whole-run log).

use std::path::PathBuf;

use cushim_tools::analyze::by_range::{by_range_file, render};

pub fn summary(files: &[PathBuf], as_json: bool) -> Result<i32, String> {
    let mut all = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let devs = by_range_file(f).map_err(|e| format!("{}: {e}", f.display()))?;
        if as_json {
            all.push((f.display().to_string(), devs));
            continue;
        }
        if files.len() > 1 {
            if i > 0 {
                println!();
            }
            println!("== {}", f.display());
        }
        print!("{}", render(&devs));
    }
    if as_json {
        println!("{}", cushim_tools::analyze::json::ranges(&all));
    }
    Ok(0)
}
