//! The command line explains itself: every subcommand's `--help` describes each of its
//! positional arguments and keeps every line within 100 columns, on a wide terminal too.
use crate::common;

use std::process::Command;

fn help(args: &[&str]) -> String {
    common::run_ok(
        Command::new(common::cushim_bin())
            .args(args)
            .arg("--help")
            .env("COLUMNS", "300"),
    )
}

/// The subcommands `cushim --help` lists (all but `help`).
fn subcommands() -> Vec<String> {
    let top = help(&[]);
    top.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_help_line_fits_in_100_columns_and_every_positional_is_described() {
    let cmds = subcommands();
    for expected in [
        "run", "demo", "summary", "diff", "convert", "dump", "doctor",
    ] {
        assert!(
            cmds.iter().any(|c| c == expected),
            "{expected} not in {cmds:?}"
        );
    }
    let mut pages = vec![(String::from("cushim"), help(&[]))];
    for c in &cmds {
        pages.push((format!("cushim {c}"), help(&[c])));
    }
    for (name, page) in &pages {
        for line in page.lines() {
            assert!(
                line.chars().count() <= 100,
                "{name} --help has a line of {} columns: {line}",
                line.chars().count()
            );
        }
        // "Arguments:" entries: "  <NAME>...  description"; a description wrapped to the
        // next line still starts on the first.
        let args = page
            .lines()
            .skip_while(|l| !l.starts_with("Arguments:"))
            .skip(1)
            .take_while(|l| !l.trim().is_empty());
        for line in args {
            let t = line.trim_start();
            if t.starts_with('<') || t.starts_with('[') {
                let described = t.split_once(char::is_whitespace).map(|(_, d)| d.trim());
                assert!(
                    described.is_some_and(|d| !d.is_empty()),
                    "{name}: positional without a description: {line}"
                );
            }
        }
    }
}

#[test]
fn convert_refuses_an_extension_that_names_no_format_and_names_the_format_it_wrote() {
    let dir = common::scratch("cli-convert-ext");
    let src = dir.join("in.json");
    std::fs::write(&src, br#"{"segments": [], "device_traces": [[]]}"#).expect("writing");
    let txt = dir.join("out.txt");
    let out = Command::new(common::cushim_bin())
        .arg("convert")
        .arg(&src)
        .arg(&txt)
        .output()
        .expect("running cushim convert");
    assert!(!out.status.success(), "an unknown extension is refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown extension"), "{err}");
    assert!(!txt.exists(), "nothing is written under a misleading name");
    let pkl = dir.join("out.pkl");
    let out = Command::new(common::cushim_bin())
        .arg("convert")
        .arg(&src)
        .arg(&pkl)
        .output()
        .expect("running cushim convert");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("wrote {} (pickle)", pkl.display())),
        "{err}"
    );
    let back = common::run_ok(Command::new(common::cushim_bin()).arg("summary").arg(&pkl));
    assert!(!back.is_empty());
}

#[test]
fn version_and_doctor_name_the_shim_that_run_preloads() {
    let version = common::run_ok(Command::new(common::cushim_bin()).arg("--version"));
    let shim = common::shim_path();
    let line = format!("shim: {}", shim.display());
    assert!(version.contains(&line), "{version}");
    let doctor = common::run_ok(Command::new(common::cushim_bin()).arg("doctor"));
    for key in [
        "shim:",
        "driver:",
        "simcuda:",
        "membarrier:",
        "frame pointers:",
        "snapshots:",
    ] {
        assert!(
            doctor.contains(key),
            "doctor says nothing about {key}\n{doctor}"
        );
    }
    assert!(doctor.contains(&shim.display().to_string()), "{doctor}");
}

#[test]
fn cushim_lib_names_the_shim_to_preload_and_a_wrong_one_is_an_error() {
    let dir = common::scratch("cli-cushim-lib");
    let copy = dir.join("libcushim.so");
    std::fs::copy(common::shim_path(), &copy).expect("copying the shim");
    let version = common::run_ok(
        Command::new(common::cushim_bin())
            .arg("--version")
            .env("CUSHIM_LIB", &dir),
    );
    assert!(
        version.contains(&format!("shim: {} (from CUSHIM_LIB)", copy.display())),
        "{version}"
    );
    let out = Command::new(common::cushim_bin())
        .args(["run", "--sim", "--", "true"])
        .env("CUSHIM_LIB", dir.join("missing"))
        .output()
        .expect("running cushim run");
    assert!(!out.status.success(), "a wrong CUSHIM_LIB is an error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CUSHIM_LIB"), "{err}");
}
