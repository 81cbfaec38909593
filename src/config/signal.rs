//! Signal names: `CUSHIM_DUMP_SIGNAL` and `cushim dump --signal` take a name (`USR1`,
//! `SIGUSR2`, any case) or a number; `0` and `none` mean "no dump signal".
//!
//! Policy: SIGKILL and SIGSTOP are refused (no handler can catch them, so a dump could never
//! be served), as is anything outside 1..=64.

use std::ffi::c_int;

/// The names this parser knows, without the `SIG` prefix.
const NAMES: &[(&str, c_int)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// Parse a signal for a dump: `Ok(None)` for `0`/`none`, `Ok(Some(n))` for a name or number
/// that can carry a dump request.
pub fn parse_dump_signal(text: &str) -> Result<Option<c_int>, String> {
    let t = text.trim();
    let upper = t.to_ascii_uppercase();
    if upper == "0" || upper == "NONE" {
        return Ok(None);
    }
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    let n = if let Ok(n) = bare.parse::<c_int>() {
        n
    } else if let Some(rt) = bare.strip_prefix("RTMIN+") {
        let k: c_int = rt
            .parse()
            .map_err(|_| format!("{text:?} is not a signal"))?;
        libc::SIGRTMIN() + k
    } else if let Some(&(_, n)) = NAMES.iter().find(|(name, _)| *name == bare) {
        n
    } else {
        return Err(format!(
            "{text:?} is not a signal (use a name such as USR1 or SIGUSR2, or a number)"
        ));
    };
    if !(1..=64).contains(&n) || n == libc::SIGKILL || n == libc::SIGSTOP {
        return Err(format!("{text:?} cannot carry a dump request"));
    }
    Ok(Some(n))
}

/// The name of a signal number (`USR1`), or the number as text.
pub fn name(sig: c_int) -> String {
    NAMES
        .iter()
        .find(|(_, n)| *n == sig)
        .map(|(name, _)| format!("SIG{name}"))
        .unwrap_or_else(|| sig.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_numbers_and_none_parse() {
        assert_eq!(parse_dump_signal("USR1"), Ok(Some(libc::SIGUSR1)));
        assert_eq!(parse_dump_signal("sigusr2"), Ok(Some(libc::SIGUSR2)));
        assert_eq!(parse_dump_signal(" 10 "), Ok(Some(10)));
        assert_eq!(parse_dump_signal("none"), Ok(None));
        assert_eq!(parse_dump_signal("0"), Ok(None));
        assert!(parse_dump_signal("KILL").is_err());
        assert!(parse_dump_signal("9").is_err());
        assert!(parse_dump_signal("USR3").is_err());
        assert!(parse_dump_signal("99").is_err());
    }
}
