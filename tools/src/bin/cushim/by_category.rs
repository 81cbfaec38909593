//! `cushim summary --by category`: what kind of memory each allocated byte is, at the peak,
//! the end or any event, per device, with the loop's steps.

use std::path::PathBuf;

use cushim_tools::analyze::category::{categorize_all, parse_moment, render};
use cushim_tools::analyze::category_rules::parse_user_rule;
use cushim_tools::analyze::{input, json, steps};

pub fn summary(
    files: &[PathBuf],
    at: &str,
    rules: &[String],
    depth: usize,
    as_json: bool,
) -> Result<i32, String> {
    let user = rules
        .iter()
        .map(|r| parse_user_rule(r))
        .collect::<Result<Vec<_>, _>>()?;
    let moment = parse_moment(at)?;
    let mut all = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let snap = input::read(f)?;
        let devs = categorize_all(&snap, &user, moment).map_err(|e| format!("{name}: {e}"))?;
        let st: Vec<steps::Steps> = snap
            .devices
            .iter()
            .filter(|d| !d.events.is_empty())
            .map(|d| steps::steps(&snap, d, &user, depth.max(1)))
            .collect();
        if !as_json {
            if files.len() > 1 {
                println!("== {name}");
            }
            print!("{}", render(&devs, moment));
            for s in &st {
                println!("device {} steps:", s.device);
                print!("{}", steps::render(s));
            }
        }
        all.push((name, devs, st));
    }
    if as_json {
        println!("{}", json::categories(&all, at.trim()));
    }
    Ok(0)
}
