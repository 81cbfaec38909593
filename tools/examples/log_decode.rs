//! How fast the tools decode an event log, with nothing done with the events: the log
//! reader (`snapshot::log_reader`, as `cushim summary/replay/report/snapshot LOG` read a
//! log) with a visitor that only counts, `RUNS` times. Prints events per second of this
//! process's CPU time (user + system) and of wall time.
//!
//! usage: cargo run --release -p cushim-tools --example log_decode -- LOG [RUNS]

use std::io::BufReader;
use std::time::Instant;

use cushim::trace::event::TraceEvent;
use cushim_tools::snapshot::log_reader::{read_log_from, LogFrame, LogVisitor};

#[derive(Default)]
struct Count {
    events: u64,
    /// Folded from every event, so the decode cannot be optimized away.
    check: u64,
}

impl LogVisitor for Count {
    fn event(&mut self, ev: TraceEvent) {
        self.events += 1;
        self.check = self.check.wrapping_add(ev.addr ^ ev.size);
    }
    fn frame(&mut self, _id: u64, _frame: LogFrame) {}
    fn stack(&mut self, _id: u32, _frames: Vec<u64>) {}
}

/// This process's CPU time so far (user + system), in seconds.
fn cpu_s() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: log_decode LOG [RUNS]");
        std::process::exit(2);
    };
    let runs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    for _ in 0..runs {
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("log_decode: {path}: {e}");
                std::process::exit(2);
            }
        };
        let mut v = Count::default();
        let (c0, t0) = (cpu_s(), Instant::now());
        if let Err(e) = read_log_from(BufReader::new(file), &mut v) {
            eprintln!("log_decode: {path}: {e}");
            std::process::exit(2);
        }
        let (cpu, wall) = (cpu_s() - c0, t0.elapsed().as_secs_f64());
        println!(
            "{} events: {cpu:.3} s CPU ({:.1} M events/s), {wall:.3} s wall ({:.1} M events/s) [{:x}]",
            v.events,
            v.events as f64 / cpu / 1e6,
            v.events as f64 / wall / 1e6,
            v.check & 0xff
        );
    }
}
