//! `cushim fit` and `cushim replay --json`: the fitting search and the replay table, as
//! text or JSON, with `fit`'s exit status saying whether the recorded settings fit.

use std::path::Path;

use cushim_tools::analyze::device_size::parse_size;
use cushim_tools::analyze::{fit, input, replay};

/// `cushim fit FILE [--device-memory SIZE] [--conf ...] [--json]`: exit status 0 when the
/// recorded settings fit SIZE (or no SIZE was given), 1 when they do not.
pub fn fit(
    file: &Path,
    confs: &[String],
    device_memory: Option<&str>,
    json: bool,
) -> Result<i32, String> {
    let size = device_memory.map(parse_size).transpose()?;
    let (snap, walks) = input::read_walked(file)?;
    let f = fit::fit(&snap, confs, size, walks.as_deref())
        .map_err(|e| format!("{}: {e}", file.display()))?;
    if json {
        let v = fit::json(&f, &file.display().to_string());
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", fit::render(&f));
    }
    Ok(match f.recorded_fits() {
        Some(false) => 1,
        _ => 0,
    })
}

/// `cushim replay --json`: the replay table as JSON (`docs/json/replay.schema.json`).
pub fn replay_json(
    file: &Path,
    confs: &[String],
    device_memory: Option<&str>,
) -> Result<i32, String> {
    let r = crate::analyze::replayed(file, confs, device_memory)?;
    let v = replay::json(&r, &file.display().to_string());
    println!(
        "{}",
        serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
    );
    Ok(0)
}
