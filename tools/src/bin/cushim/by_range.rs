//! `cushim summary --by range`: bytes per NVTX range path of each file (a snapshot or a
//! whole-run log).

use std::path::PathBuf;

use cushim_tools::analyze::by_range::{by_range_file, render};

pub fn summary(files: &[PathBuf]) -> Result<i32, String> {
    for (i, f) in files.iter().enumerate() {
        let devs = by_range_file(f).map_err(|e| format!("{}: {e}", f.display()))?;
        if files.len() > 1 {
            if i > 0 {
                println!();
            }
            println!("== {}", f.display());
        }
        print!("{}", render(&devs));
    }
    Ok(0)
}
