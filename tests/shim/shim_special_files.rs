//! Files the shim writes, at paths where something else already is. Snapshot targets that
//! are not regular files: a character device (a copy of /dev/null made with mknod), a FIFO,
//! a symlink to that device and a directory are left exactly as they were, with one stderr
//! line each naming the path, and the program's results are unchanged. The event log's path
//! (the parent's, and a fork child's `%p` one): a planted link is replaced, never followed;
//! a FIFO, a directory or a link to one is left as it was with one line saying why, and the
//! program runs on without a log; the log is private; a previous log is kept.
use crate::common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in a scratch path")
}

/// Run the trace program with `target` as the snapshot path; require success, its normal
/// output, exactly one stderr line naming `target`, and no file left beside it.
fn run_with_target(target: &Path) -> String {
    let exe = common::compile("shim_trace", &[]);
    let out = common::run(
        common::shim_cmd(&exe)
            .arg("sites")
            .env("CUSHIM_SNAPSHOT", target)
            .env("CUSHIM_HISTORY", "enabled=all,stacks=native"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].contains(&*target.to_string_lossy()), "{stderr}");
    let dir = target.parent().expect("a parent");
    let temps: Vec<_> = std::fs::read_dir(dir)
        .expect("listing")
        .map_while(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(temps.is_empty(), "temporary files left: {temps:?}");
    lines[0].to_string()
}

#[test]
fn a_character_device_and_a_symlink_to_it_are_left_as_they_were() {
    let dir = common::scratch("special-chr");
    let dev = dir.join("null-copy");
    // SAFETY: a valid path; makedev(1, 3) is /dev/null's number.
    let rc = unsafe {
        libc::mknod(
            cpath(&dev).as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
        )
    };
    if rc != 0 {
        common::skip::skip(
            "the character-device target",
            &format!("mknod needs root here: {}", std::io::Error::last_os_error()),
        );
        return;
    }
    let line = run_with_target(&dev);
    assert!(line.contains("character device"), "{line}");
    let m = std::fs::symlink_metadata(&dev).expect("still there");
    assert!(m.file_type().is_char_device());
    assert_eq!(m.rdev(), libc::makedev(1, 3));

    let link = dir.join("link-to-dev");
    std::os::unix::fs::symlink(&dev, &link).expect("symlink");
    let line = run_with_target(&link);
    assert!(
        line.contains("symbolic link to a character device"),
        "{line}"
    );
    assert!(std::fs::symlink_metadata(&link)
        .expect("still there")
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_link(&link).expect("a link"), dev);
    assert!(std::fs::symlink_metadata(&dev)
        .expect("device")
        .file_type()
        .is_char_device());
}

#[test]
fn a_fifo_is_left_as_it_was_and_nothing_blocks_on_it() {
    let dir = common::scratch("special-fifo");
    let fifo = dir.join("fifo");
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(cpath(&fifo).as_ptr(), 0o600) }, 0);
    let line = run_with_target(&fifo);
    assert!(line.contains("FIFO"), "{line}");
    assert!(std::fs::symlink_metadata(&fifo)
        .expect("still there")
        .file_type()
        .is_fifo());
}

#[test]
fn a_directory_is_left_as_it_was() {
    let dir = common::scratch("special-dir");
    let target = dir.join("adir");
    std::fs::create_dir(&target).expect("mkdir");
    std::fs::write(target.join("keep"), "kept").expect("a file inside");
    let line = run_with_target(&target);
    assert!(line.contains("a directory"), "{line}");
    assert!(std::fs::symlink_metadata(&target)
        .expect("still there")
        .is_dir());
    assert_eq!(
        std::fs::read_to_string(target.join("keep")).expect("kept"),
        "kept"
    );
}

// The whole-run event log's path: a link planted there is replaced and never followed; a
// FIFO or a directory is left as it was and the program runs on without a log; the log is
// private (0600); a previous log there is kept under a new name. Each run's status and
// output are those of the same program without the shim.

/// Run `shim_trace sites` with `CUSHIM_LOG=log`; require the status and output of the same
/// program without the shim; returns stderr's lines.
fn run_with_log(log: &Path) -> Vec<String> {
    run_with_log_env(log, &[])
}

/// [`run_with_log`] with more variables set.
fn run_with_log_env(log: &Path, env: &[(&str, &str)]) -> Vec<String> {
    let exe = common::compile("shim_trace", &[]);
    let plain = common::run(common::sim_cmd(&exe).arg("sites"));
    let out = common::run(
        common::shim_cmd(&exe)
            .arg("sites")
            .env("CUSHIM_LOG", log)
            .env("CUSHIM_HISTORY", "enabled=all,stacks=native")
            .envs(env.iter().copied()),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), plain.status.code(), "{stderr}");
    assert_eq!(out.stdout, plain.stdout, "{stderr}");
    stderr.lines().map(String::from).collect()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("listing")
        .map_while(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A log visitor that only lets the reader count.
struct Ignore;

impl cushim_tools::snapshot::log_reader::LogVisitor for Ignore {
    fn event(&mut self, _ev: cushim::trace::event::TraceEvent) {}
    fn frame(&mut self, _id: u64, _f: cushim_tools::snapshot::log_reader::LogFrame) {}
    fn stack(&mut self, _id: u32, _frames: Vec<u64>) {}
}

/// `path` is a regular file, private to its user, that reads as a log with events.
fn assert_private_log(path: &Path) {
    let m = std::fs::symlink_metadata(path).expect("the log");
    assert!(m.file_type().is_file(), "{}: {m:?}", path.display());
    assert_eq!(m.mode() & 0o777, 0o600, "{}", path.display());
    let bytes = std::fs::read(path).expect("reading the log");
    let info = cushim_tools::snapshot::log_reader::read_log(&bytes, &mut Ignore)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(info.events > 0, "{}: {info:?}", path.display());
}

#[test]
fn a_link_planted_at_the_log_path_is_replaced_and_the_file_it_points_to_is_untouched() {
    let dir = common::scratch("log-link");
    let victim = dir.join("precious");
    std::fs::write(&victim, "precious").expect("the victim file");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let log = dir.join("run.log");
    std::os::unix::fs::symlink(&victim, &log).expect("symlink");
    let lines = run_with_log(&log);
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious"
    );
    let m = std::fs::metadata(&victim).expect("victim");
    assert_eq!(m.mode() & 0o777, 0o644);
    assert_private_log(&log);
    assert_eq!(names(&dir), ["precious", "run.log"]);
}

#[test]
fn the_log_is_private_to_its_user_as_the_runs_snapshot_is() {
    let dir = common::scratch("log-mode");
    let log = dir.join("run.log");
    let lines = run_with_log(&log);
    assert!(lines.is_empty(), "{lines:?}");
    assert_private_log(&log);
}

#[test]
fn a_previous_log_at_the_path_is_kept_under_the_next_free_number_and_that_is_said() {
    let dir = common::scratch("log-keep");
    let log = dir.join("run.log");
    std::fs::write(&log, "the previous run's log").expect("previous");
    std::fs::write(dir.join("run.log.1"), "an older one").expect("older");
    let lines = run_with_log(&log);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("cushim: ")
            && lines[0].contains("kept as")
            && lines[0].contains("run.log.2"),
        "{lines:?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("run.log.2")).expect("kept"),
        "the previous run's log"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("run.log.1")).expect("older"),
        "an older one"
    );
    assert_private_log(&log);
    assert_eq!(names(&dir), ["run.log", "run.log.1", "run.log.2"]);
}

#[test]
fn with_the_replace_setting_a_previous_log_is_replaced_by_name_and_not_written_through() {
    let dir = common::scratch("log-replace");
    let log = dir.join("run.log");
    std::fs::write(&log, "the previous run's log").expect("previous");
    std::fs::hard_link(&log, dir.join("same-file")).expect("hard link");
    let lines = run_with_log_env(&log, &[("CUSHIM_LOG_REPLACE", "1")]);
    assert!(lines.is_empty(), "{lines:?}");
    assert_private_log(&log);
    assert_eq!(
        std::fs::read_to_string(dir.join("same-file")).expect("the other name"),
        "the previous run's log"
    );
    assert_eq!(names(&dir), ["run.log", "same-file"]);
}

/// The one stderr line of a run whose log path is `target`, which refuses it.
fn refused_line(target: &Path) -> String {
    let lines = run_with_log(target);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("cushim: no event log"), "{lines:?}");
    assert!(lines[0].contains(&*target.to_string_lossy()), "{lines:?}");
    lines[0].clone()
}

#[test]
fn a_fifo_a_directory_or_a_link_to_them_at_the_log_path_is_left_as_it_was_and_the_program_runs_on()
{
    let dir = common::scratch("log-special");
    let fifo = dir.join("fifo.log");
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(cpath(&fifo).as_ptr(), 0o600) }, 0);
    let line = refused_line(&fifo);
    assert!(line.contains("a FIFO"), "{line}");
    assert!(std::fs::symlink_metadata(&fifo)
        .expect("still there")
        .file_type()
        .is_fifo());

    let adir = dir.join("dir.log");
    std::fs::create_dir(&adir).expect("mkdir");
    std::fs::write(adir.join("keep"), "kept").expect("a file inside");
    let line = refused_line(&adir);
    assert!(line.contains("a directory"), "{line}");
    assert_eq!(names(&adir), ["keep"]);
    assert_eq!(
        std::fs::read_to_string(adir.join("keep")).expect("kept"),
        "kept"
    );

    let link = dir.join("link.log");
    std::os::unix::fs::symlink(&fifo, &link).expect("symlink");
    let line = refused_line(&link);
    assert!(line.contains("symbolic link to a FIFO"), "{line}");
    assert_eq!(std::fs::read_link(&link).expect("still a link"), fifo);
    assert_eq!(names(&dir), ["dir.log", "fifo.log", "link.log"]);
}

/// What is planted at a fork child's own log path (`run-%p.log`).
enum Planted {
    LinkToVictim,
    Fifo,
    Directory,
}

/// Run `shim_fork alloc 1` with the child held before its first CUDA call; plant `what` at
/// the child's log path meanwhile. Returns the child's log path and stderr.
fn fork_child_with_planted(dir: &Path, what: Planted) -> (PathBuf, String) {
    use std::io::{BufRead, Read, Write};
    let exe = common::compile("shim_fork", &[]);
    let mut child = common::shim_cmd(&exe)
        .args(["alloc", "1"])
        .env("SHIM_FORK_HOLD", "1")
        .env("CUSHIM_LOG", dir.join("run-%p.log"))
        .env("CUSHIM_SNAPSHOT", dir.join("snap-%p.pickle"))
        .env("CUSHIM_HISTORY", "enabled=all,stacks=none")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting shim_fork");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let mut seen = String::new();
    let pid = loop {
        line.clear();
        if stdout.read_line(&mut line).expect("reading stdout") == 0 {
            let _ = child.kill();
            let mut err = String::new();
            let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
            panic!("the child never said it was held: {seen}\n{err}");
        }
        seen.push_str(&line);
        if let Some(p) = line.trim().strip_prefix("held=") {
            break p.to_string();
        }
    };
    let target = dir.join(format!("run-{pid}.log"));
    match what {
        Planted::LinkToVictim => {
            std::os::unix::fs::symlink(dir.join("precious"), &target).expect("symlink")
        }
        // SAFETY: a valid path.
        Planted::Fifo => assert_eq!(unsafe { libc::mkfifo(cpath(&target).as_ptr(), 0o600) }, 0),
        Planted::Directory => std::fs::create_dir(&target).expect("mkdir"),
    }
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"g")
        .expect("releasing the child");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("stdout");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    let status = child.wait().expect("waiting");
    assert!(status.success(), "{seen}{rest}\n{stderr}");
    let kv = common::kv(&rest);
    assert_eq!(common::num(&kv, "ok"), 1, "{rest}\n{stderr}");
    assert_eq!(common::num(&kv, "failed"), 0, "{rest}\n{stderr}");
    (target, stderr)
}

#[test]
fn at_a_fork_childs_log_path_a_link_is_replaced_and_a_fifo_or_directory_left_as_it_was() {
    let dir = common::scratch("log-fork-link");
    std::fs::write(dir.join("precious"), "precious").expect("victim");
    let (target, stderr) = fork_child_with_planted(&dir, Planted::LinkToVictim);
    assert!(!stderr.contains("no event log"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.join("precious")).expect("victim"),
        "precious"
    );
    assert_private_log(&target);

    for (what, name, says) in [
        (Planted::Fifo, "log-fork-fifo", "a FIFO"),
        (Planted::Directory, "log-fork-dir", "a directory"),
    ] {
        let dir = common::scratch(name);
        let (target, stderr) = fork_child_with_planted(&dir, what);
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("no event log of its own"))
            .collect();
        assert_eq!(said.len(), 1, "{stderr}");
        assert!(
            said[0].starts_with("cushim: ") && said[0].contains(says),
            "{stderr}"
        );
        assert!(said[0].contains(&*target.to_string_lossy()), "{stderr}");
        let m = std::fs::symlink_metadata(&target).expect("still there");
        match says {
            "a FIFO" => assert!(m.file_type().is_fifo()),
            _ => {
                assert!(m.is_dir());
                assert_eq!(names(&target), Vec::<String>::new());
            }
        }
    }
}
