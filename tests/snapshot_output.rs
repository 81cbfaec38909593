//! Snapshot files: atomic replace, mode 0600, symlinks replaced not followed, clear errors,
//! path templates and the format choice.

mod common;
use common::snapshot_support as support;

use cushim::snapshot::build::build;
use cushim::snapshot::output::{expand, rank_from_env, write_atomic, write_snapshot, TemplateVars};
use cushim::snapshot::Format;
use cushim::trace::intern::StackTable;
use cushim_tools::snapshot::reader;
use std::os::unix::fs::PermissionsExt;
use support::*;

fn leftovers(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

#[test]
fn written_file_has_mode_0600_and_replaces_the_old_one() {
    let dir = scratch("mode");
    let path = dir.join("snap.pickle");
    std::fs::write(&path, b"old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    write_atomic(&path, b"new contents").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn symlink_planted_at_the_target_is_replaced_never_followed() {
    let dir = scratch("symlink");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    let path = dir.join("snap.pickle");
    std::os::unix::fs::symlink(&victim, &path).unwrap();
    write_atomic(&path, b"snapshot").unwrap();
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"precious",
        "the link's target is untouched"
    );
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the link itself was replaced by a file"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"snapshot");
}

/// The variable naming the directory an unprivileged re-run of
/// [`unwritable_directory_gives_an_error_naming_the_path`] works in.
const UNPRIVILEGED_DIR: &str = "CUSHIM_TEST_UNPRIVILEGED_DIR";
/// The user the permission check runs as when the tests run as root (`nobody`).
const UNPRIVILEGED_ID: u32 = 65534;

#[test]
fn unwritable_directory_gives_an_error_naming_the_path() {
    let dir = match std::env::var_os(UNPRIVILEGED_DIR) {
        Some(d) => std::path::PathBuf::from(d),
        // SAFETY: geteuid has no preconditions.
        None if unsafe { libc::geteuid() } == 0 => return rerun_unprivileged(),
        None => scratch("unwritable"),
    };
    let ro = dir.join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).unwrap();
    let path = ro.join("snap.pickle");
    let r = write_atomic(&path, b"x");
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o700)).unwrap();
    let e = r.expect_err("writing into a read-only directory fails");
    assert!(e.contains("snap.pickle"), "{e}");
    let missing = dir.join("no/such/dir/snap.pickle");
    let e = write_atomic(&missing, b"x").unwrap_err();
    assert!(
        e.contains("no/such/dir/snap.pickle") && e.contains("creating"),
        "{e}"
    );
    assert!(
        write_atomic(&dir, b"x").is_err(),
        "a directory cannot be replaced by a file"
    );
    assert!(leftovers(&dir).is_empty());
}

/// Root ignores directory permissions: run the permission test again as `nobody` (with
/// `setpriv`), in a directory of its own under the system's temporary directory.
fn rerun_unprivileged() {
    use std::os::unix::fs::chown;
    let dir = std::env::temp_dir().join(format!("cushim-unwritable-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("creating the unprivileged run's directory");
    chown(&dir, Some(UNPRIVILEGED_ID), Some(UNPRIVILEGED_ID))
        .expect("handing the directory to the unprivileged user");
    // The executable too: linked (or copied) into that directory, so that a checkout the
    // user cannot reach does not stop it.
    let own = std::env::current_exe().expect("locating this test executable");
    let exe = dir.join("snapshot_output");
    if std::fs::hard_link(&own, &exe).is_err() {
        std::fs::copy(&own, &exe).expect("copying this test executable");
    }
    let name = "unwritable_directory_gives_an_error_naming_the_path";
    let out = std::process::Command::new("setpriv")
        .arg(format!("--reuid={UNPRIVILEGED_ID}"))
        .arg(format!("--regid={UNPRIVILEGED_ID}"))
        .arg("--clear-groups")
        .arg(&exe)
        .args(["--exact", name, "--test-threads=1"])
        .env(UNPRIVILEGED_DIR, &dir)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.expect("running setpriv (util-linux) to drop root");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the permission test as uid {UNPRIVILEGED_ID}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn concurrent_writers_to_one_path_leave_one_complete_file() {
    let dir = scratch("concurrent");
    let path = dir.join("snap.json");
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let path = &path;
            s.spawn(move || {
                for _ in 0..20 {
                    let body = vec![b'a' + t; 100_000];
                    write_atomic(path, &body).unwrap();
                }
            });
        }
    });
    let body = std::fs::read(&path).unwrap();
    assert_eq!(body.len(), 100_000);
    assert!(
        body.iter().all(|&b| b == body[0]),
        "never a mix of two writes"
    );
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn templates_rank_and_format_follow_the_environment() {
    // The only test in this binary that touches these variables.
    for k in ["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"] {
        std::env::remove_var(k);
    }
    assert_eq!(rank_from_env(), 0);
    std::env::set_var("PMI_RANK", "9");
    assert_eq!(rank_from_env(), 9);
    std::env::set_var("SLURM_PROCID", "5");
    assert_eq!(rank_from_env(), 5, "SLURM_PROCID comes before PMI_RANK");
    std::env::set_var("RANK", "3");
    let v = TemplateVars::current(4);
    assert_eq!(v.rank, 3);
    assert_eq!(v.pid, std::process::id());
    assert_eq!(
        expand("s-%r-%n-%p.pickle", &v),
        format!("s-3-4-{}.pickle", std::process::id())
    );
    let t = expand("%t", &v).parse::<u64>().unwrap();
    assert!(t > 1_600_000_000);

    let dir = scratch("format");
    let snap = build(&fixture("enabled=all"), StackTable::global());
    std::env::remove_var("CUSHIM_SNAPSHOT_FORMAT");
    for (name, f) in [
        ("a.pickle", Format::Pickle),
        ("a.json", Format::Json),
        ("a.msgpack", Format::Msgpack),
        ("a.bin", Format::Pickle),
    ] {
        let p = dir.join(name);
        assert_eq!(write_snapshot(&snap, &p).unwrap(), (f, None));
        assert_eq!(reader::detect(&std::fs::read(&p).unwrap()), f, "{name}");
    }
    std::env::set_var("CUSHIM_SNAPSHOT_FORMAT", "json");
    let p = dir.join("b.pickle");
    assert_eq!(write_snapshot(&snap, &p).unwrap().0, Format::Json);
    std::env::set_var("CUSHIM_SNAPSHOT_FORMAT", "yaml");
    let (f, warn) = write_snapshot(&snap, &p).unwrap();
    assert_eq!(f, Format::Pickle);
    assert!(warn.unwrap().contains("yaml"));
    std::env::remove_var("CUSHIM_SNAPSHOT_FORMAT");
}

#[test]
fn dump_builds_and_writes_a_loadable_snapshot_at_the_next_templated_path() {
    let dir = scratch("dump");
    let template = format!("{}/snap-%p-%n.pickle", dir.display());
    let first = cushim::snapshot::output::next_path(&template);
    let second = cushim::snapshot::output::next_path(&template);
    assert_ne!(first, second, "%n counts dumps");
    let input = fixture("enabled=all");
    for p in [&first, &second] {
        // (Another test in this binary may be varying CUSHIM_SNAPSHOT_FORMAT meanwhile; the
        // checker reads any of the formats by content.)
        cushim::snapshot::dump(&input, p).unwrap();
        let (ok, out) = python_check(p, &["--expect-frame", "site_a"]);
        assert!(ok, "{out}");
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(&format!("snap-{}-", std::process::id())),
            "{name}"
        );
    }
}
