//! Snapshot targets that are not regular files: a character device (a
//! copy of /dev/null made with mknod), a FIFO, a symlink to that device and a directory are
//! left exactly as they were, with one stderr line each naming the path, and the program's
//! results are unchanged.
use crate::common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

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
