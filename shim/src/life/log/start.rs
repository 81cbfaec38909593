//! Starting the process's event log at the shim's start-up: the header (the process, its
//! settings, its devices' memory), the file and the writer (`open.rs`), then the hooks
//! that feed and guard it: the NVTX range annotations' hook (`sink.rs`), the ending-signal
//! handlers that close it, and the fatal-signal handlers that flush it (`crash.rs`).
//!
//! Invariant: the hooks are installed only once the log is open and its writer runs, so
//! nothing ever waits for a writer that does not exist; a log that cannot open leaves the
//! program as without one, with one `cushim:` line saying why.

use cushim::trace::log::format::VERSION;

use super::crash::flush_from_signal;
use super::open::open_log;
use super::ring::Ring;
use super::shared::{template, HEADER, MARKS, MARK_SLOTS};
use super::sink::push_mark;
use crate::life::shim::Shim;

/// Open the log and start its writer (from the shim's start-up, with its state built).
pub fn start(s: &Shim) {
    let Some(t) = template() else { return };
    if let Err(e) = open_and_spawn(s, t) {
        eprintln!("cushim: no event log: {e}");
        return;
    }
    crate::life::ending::install(crate::life::dump::dump_signal());
    crate::life::sigchain::on(crate::life::sigchain::Role::Fatal, |_| flush_from_signal());
    crate::life::sigchain::arm_fatal();
}

fn open_and_spawn(s: &Shim, template: &str) -> Result<(), String> {
    let header = serde_json::json!({
        "format": "cushim event log",
        "version": VERSION,
        "pid": std::process::id(),
        "rank": cushim::snapshot::output::rank_from_env(),
        "cmdline": std::env::args().collect::<Vec<_>>(),
        "clock": "microseconds since the Unix epoch",
        "clock_origin_us": cushim::trace::event::now_us(),
        "mode": crate::life::mode::mode_name(),
        "allocator_settings": s.alloc.conf().settings_json(),
        "env": {
            "CUSHIM_HISTORY": std::env::var("CUSHIM_HISTORY").ok(),
            "CUSHIM_ALLOC_CONF": std::env::var("CUSHIM_ALLOC_CONF").ok(),
            "PYTORCH_CUDA_ALLOC_CONF": std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok(),
        },
        "device_count": s.alloc.device_count(),
        "memory": crate::life::unexplained::memory_json(s),
    });
    let _ = MARKS.set(Ring::leaked(MARK_SLOTS));
    open_log(template, &header)?;
    let _ = HEADER.set(header);
    // With the writer running: the starts and ends kept so far may be more than the marks'
    // ring holds.
    cushim::trace::annotations::set_log_hook(push_mark);
    Ok(())
}
