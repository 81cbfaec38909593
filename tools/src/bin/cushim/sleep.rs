//! `cushim pause PID [TAG]` and `cushim resume PID [TAG]`: ask a running program under the
//! shim, with sleep mode on, to pause or resume a tag (every tag without one), and print
//! the bytes released or mapped again. The request travels as a private file plus a signal
//! (`cushim::sleep::request`); a process without the shim, or without sleep mode, is refused
//! before anything is sent.

use cushim::sleep::request::{self, Request};
use cushim::sleep::Mode;

/// How long the answer is waited for (a pause waits for the device's work first).
const WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The CUDA error codes sleep mode returns, in words.
fn meaning(code: i32) -> &'static str {
    match code {
        1 => "invalid request",
        2 => "out of memory: the tag stays paused and can be resumed later",
        214 => "a host backup no longer matches its checksum",
        801 => "sleep mode is off in that process",
        900 => {
            "a CUDA graph capture is running, and a captured graph may use its memory whenever \
             it is launched: nothing was paused; pause after the capture ends"
        }
        _ => "driver error",
    }
}

/// The process to ask: `pid` when it loaded the shim with sleep mode on, else its one child
/// that did (a `cushim run` wrapper's program).
fn target(pid: i32) -> Result<i32, String> {
    let lib = cushim_tools::artifacts::SHIM_LIB;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("process {pid}: cannot read /proc/{pid}/maps: {e}"))?;
    let pid = if maps.contains(lib) {
        pid
    } else {
        crate::tools::child_with_shim(pid)
            .ok_or_else(|| format!("process {pid} has not loaded {lib}; not sending it a signal"))?
    };
    let conf = crate::tools::environ_var(pid, "CUSHIM_ALLOC_CONF").flatten();
    let on = conf
        .as_deref()
        .is_some_and(|c| cushim::config::alloc::parse(c).0.sleep_mode);
    if !on {
        return Err(format!(
            "process {pid} runs without sleep mode (its CUSHIM_ALLOC_CONF has no sleep_mode:True); not sending it a signal"
        ));
    }
    Ok(pid)
}

/// Send `req` to `pid` and wait for its answer.
fn ask(pid: i32, req: &Request) -> Result<u64, String> {
    let pid = target(pid)?;
    let dir = request::dir()?;
    let upid = pid as u32;
    let answer = request::answer_path(&dir, upid);
    let _ = std::fs::remove_file(&answer);
    request::write_atomic(&request::request_path(&dir, upid), &req.to_line())?;
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, request::SIGNAL) } != 0 {
        return Err(format!(
            "signalling process {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    let start = std::time::Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&answer) {
            let _ = std::fs::remove_file(&answer);
            return match request::parse_answer(&text) {
                Some(Ok(bytes)) => Ok(bytes),
                Some(Err(code)) => Err(format!(
                    "process {pid} answered CUDA error {code}: {}",
                    meaning(code)
                )),
                None => Err(format!(
                    "process {pid} wrote an unreadable answer: {text:?}"
                )),
            };
        }
        if !running(pid) {
            return Err(format!("process {pid} ended before answering"));
        }
        if start.elapsed() > WAIT {
            return Err(format!(
                "process {pid} did not answer within {} s",
                WAIT.as_secs()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Whether `pid` still runs (exists and is not a zombie).
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn tag_words(tag: &Option<String>) -> String {
    tag.as_ref()
        .map_or_else(|| "every tag".to_string(), |t| format!("tag '{t}'"))
}

/// `cushim pause PID [TAG] [--backup]`.
pub fn pause(pid: i32, tag: Option<String>, backup: bool) -> Result<i32, String> {
    let mode = if backup { Mode::Backup } else { Mode::Discard };
    let bytes = ask(pid, &Request::Pause(tag.clone(), mode))?;
    println!(
        "paused {bytes} bytes of {} in process {pid} ({})",
        tag_words(&tag),
        mode.name()
    );
    Ok(0)
}

/// `cushim resume PID [TAG]`.
pub fn resume(pid: i32, tag: Option<String>) -> Result<i32, String> {
    let bytes = ask(pid, &Request::Resume(tag.clone()))?;
    println!(
        "resumed {bytes} bytes of {} in process {pid}",
        tag_words(&tag)
    );
    Ok(0)
}
