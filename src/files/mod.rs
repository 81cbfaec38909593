//! Files cushim creates: snapshots, reports, exports, the event log, IPC records. Policy: a
//! file is always created new and private (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600), under an
//! unpredictable temporary name where it is renamed into place, so a name planted in a shared
//! directory can neither redirect the write nor deny it; what may already be at the target is
//! judged once, here (`target`), for every kind of file alike.

use std::os::unix::fs::OpenOptionsExt;

pub mod target;
pub mod temp_file;

/// Options that create a new file only: never an existing name, never through a link
/// (`O_CREAT|O_EXCL|O_NOFOLLOW`), mode 0600, closed on exec. Temporary files and the event log
/// are created with these.
pub fn new_private_file() -> std::fs::OpenOptions {
    let mut o = std::fs::OpenOptions::new();
    o.write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}
