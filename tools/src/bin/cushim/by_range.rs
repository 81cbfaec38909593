//! `cushim summary --by range`: bytes per NVTX range path of each file.

use std::path::PathBuf;

use cushim_tools::analyze::by_range::{by_range, render};
use cushim_tools::snapshot::reader::read_file;

pub fn summary(files: &[PathBuf]) -> Result<i32, String> {
    for (i, f) in files.iter().enumerate() {
        let snap = read_file(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let devs = by_range(&snap).map_err(|e| format!("{}: {e}", f.display()))?;
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
