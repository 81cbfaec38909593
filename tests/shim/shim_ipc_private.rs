//! IPC record files are private to the user who shares: created exclusively (a planted link
//! or file is never followed, truncated or reused), mode 0600, in a directory only the user
//! can write; an importer refuses a record that was replaced by a link or opened to others;
//! an unsafe directory refuses the export with one line instead of handing out a handle
//! that would open another block. Every run is under the shim exporting a block inside a
//! cached segment (the handle only the shim makes), so each test fails without the shim.
use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn exe() -> std::path::PathBuf {
    common::compile("sim_ipc", &["-lcuda"])
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn private_dir(name: &str) -> std::path::PathBuf {
    let dir = common::scratch(name);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    dir
}

fn run(dir: Option<&Path>, env: &[(&str, &str)]) -> (String, String) {
    let mut cmd = common::cmd(&exe(), true);
    cmd.arg("export").envs(env.iter().copied());
    match dir {
        Some(d) => cmd.env("CUSHIM_IPC_DIR", d),
        None => cmd.env_remove("CUSHIM_IPC_DIR"),
    };
    let out = common::run(&mut cmd);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

fn cushim_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("cushim:"))
        .collect()
}

#[test]
fn records_are_created_0600_and_planted_links_in_the_directory_are_never_followed() {
    let dir = private_dir("ipc-private-planted");
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").expect("victim");
    // Links under every name shape a record could have for nearby pids.
    let me = std::process::id();
    let mut planted = Vec::new();
    for pid in me..me + 256 {
        for name in [
            format!("cushim-ipc-{pid}-1"),
            format!("cushim-ipc-{pid}-1-0000000000000000"),
        ] {
            std::os::unix::fs::symlink(&victim, dir.join(&name)).expect("plant");
            planted.push(name);
        }
    }
    let (out, _) = run(Some(&dir), &[("SIM_IPC_SHOW_RECORDS", "1")]);
    assert!(
        out.contains("imported ok") && out.contains("offset_in_pair=2097152"),
        "{out}"
    );
    let records: Vec<_> = out
        .lines()
        .filter_map(|l| l.strip_prefix("record "))
        .filter(|l| !planted.iter().any(|p| l.starts_with(&format!("{p} "))))
        .collect();
    assert_eq!(records.len(), 1, "the exporter's one record: {out}");
    assert!(
        records[0].ends_with(&format!("mode 600 uid {}", euid())),
        "{out}"
    );
    assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
    for name in &planted {
        let target = std::fs::read_link(dir.join(name)).expect("planted link left alone");
        assert_eq!(target, victim);
    }
}

#[test]
fn the_default_directory_is_the_users_own_mode_0700() {
    let (out, _) = run(None, &[("SIM_IPC_SHOW_RECORDS", "1")]);
    assert!(
        out.contains("imported ok") && out.contains("offset_in_pair=2097152"),
        "{out}"
    );
    // The exporter saw its record in the default directory while it shared the block (only
    // the shim writes records, so this fails without it).
    assert!(
        out.lines().any(|l| l.starts_with("record cushim-ipc-")
            && l.ends_with(&format!("mode 600 uid {}", euid()))),
        "{out}"
    );
    let parent = if Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let m = std::fs::symlink_metadata(parent.join(format!("cushim-{}", euid()))).expect("dir");
    assert!(m.is_dir());
    assert_eq!(m.uid(), euid());
    assert_eq!(m.permissions().mode() & 0o7777, 0o700);
}

#[test]
fn a_directory_others_can_write_refuses_the_export_with_one_line() {
    let dir = common::scratch("ipc-private-open-dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let (out, stderr) = run(Some(&dir), &[("SIM_IPC_EXPECT_EXPORT_REFUSED", "1")]);
    assert!(out.contains("export refused"), "{out}");
    let lines = cushim_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("writable by others"), "{stderr}");
    let left = std::fs::read_dir(&dir).expect("listing").count();
    assert_eq!(left, 0, "nothing written into an unsafe directory");
}

fn refused_after(tamper: &str, why: &str) {
    let dir = private_dir(&format!("ipc-private-tamper-{tamper}"));
    let (out, stderr) = run(
        Some(&dir),
        &[("SIM_IPC_TAMPER", tamper), ("SIM_IPC_EXPECT_REFUSED", "1")],
    );
    assert!(
        out.contains("import refused") && out.contains("PASS export"),
        "{out}"
    );
    let refusal: Vec<_> = cushim_lines(&stderr)
        .into_iter()
        .filter(|l| l.contains("record is gone or wrong"))
        .collect();
    assert_eq!(refusal.len(), 1, "{stderr}");
    assert!(refusal[0].contains(why), "{stderr}");
}

#[test]
fn an_importer_refuses_a_record_replaced_by_a_link() {
    refused_after("link", "is a symbolic link");
}

#[test]
fn an_importer_refuses_a_record_readable_by_other_users() {
    refused_after("open", "open to other users");
}
