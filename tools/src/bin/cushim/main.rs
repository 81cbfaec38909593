//! The `cushim` command: run programs under the shim, the bundled demo, and snapshot tools.

mod analyze;
mod bench;
mod by_category;
mod by_range;
mod cache_dir;
mod demo;
mod doctor;
mod embedded;
mod export_cmd;
mod fit_cmd;
mod forward;
mod launch;
mod locate;
mod nvtx_env;
mod run_checks;
mod sleep;
mod snapshot_cmd;
mod tools;
mod workload;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cushim",
    max_term_width = 100,
    about = "A PyTorch-compatible CUDA caching allocator, preloaded into unmodified programs"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run PROGRAM with the shim preloaded.
    Run {
        /// Use expandable segments (CUDA virtual memory).
        #[arg(long)]
        expandable: bool,
        /// Write a snapshot at exit (and on SIGUSR1) to this path template.
        #[arg(long)]
        snapshot: Option<PathBuf>,
        /// Stream every event to this whole-run log (path template, as --snapshot).
        #[arg(long)]
        log: Option<PathBuf>,
        /// CUSHIM_HISTORY settings (default with --snapshot or --log: enabled=all, whose other keys take
        /// CUSHIM_HISTORY's defaults).
        #[arg(long)]
        history: Option<String>,
        /// Run on simcuda, the simulated GPU (the default when no CUDA driver is installed).
        #[arg(long)]
        sim: bool,
        /// Observe only (CUSHIM_MODE=observe): every allocation goes to CUDA unchanged and is
        /// recorded; nothing is cached.
        #[arg(long)]
        observe: bool,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<OsString>,
    },
    /// Run the bundled workload on simcuda, without and with the shim, and print what the
    /// cache did.
    Demo {
        /// Use expandable segments.
        #[arg(long)]
        expandable: bool,
        /// Where to write the snapshot (default: cushim-demo.pickle in the current directory).
        #[arg(long)]
        snapshot: Option<PathBuf>,
        /// Number of steps of the workload.
        #[arg(long, default_value_t = 200)]
        steps: u32,
    },
    /// Measure the shim's costs next to their baselines and print one table (about two
    /// minutes; needs libcushim.so and libsimcuda.so built next to this binary).
    Bench {
        /// More repeats per figure, and 1M-event dumps in every format (several minutes;
        /// the JSON dump of 1M events is about 7 GB, in memory and on disk).
        #[arg(long)]
        full: bool,
        /// Also write the table, with the machine and command, to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print a summary of a snapshot (ours in any format, PyTorch's pickle, an RMM or
    /// alloc/free log); several files (one per rank) add a per-rank table.
    Summary {
        /// Snapshot files (ours in any format, PyTorch's pickle, RMM or alloc/free logs).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Frames per allocation site: the program's first frame and its callers.
        #[arg(long, default_value_t = 1)]
        depth: usize,
        /// Also print the top-down tree of live bytes.
        #[arg(long)]
        tree: bool,
        /// Group bytes by something else than allocation site: `range` (the NVTX range path
        /// each allocation was made in), `category` (what kind of memory: parameters,
        /// gradients, optimizer state, activations, ...; docs/ANALYSES-CATEGORIES.md).
        #[arg(long, value_parser = ["range", "category"])]
        by: Option<String>,
        /// With --by category: the moment, `peak` (the trace's peak allocated), `end`, an
        /// event index (after that many trace events), or `SECONDSs` after the trace's first
        /// event (`12.5s`, from a snapshot's times).
        #[arg(long, default_value = "peak")]
        at: String,
        /// With --by category: a category of your own, NAME=REGEX over frames (`name
        /// file:line`), NVTX range paths and user_metadata; repeatable, first match wins,
        /// before the built-in rules.
        #[arg(long = "category")]
        categories: Vec<String>,
        /// Print one JSON object (docs/JSON.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Replay a recorded trace through the engine under the recorded settings and others,
    /// and print peaks, fragmentation, device allocations and OOMs side by side.
    Replay {
        /// The snapshot whose trace to replay (recorded with allocation history).
        file: PathBuf,
        /// A configuration to replay (PYTORCH_CUDA_ALLOC_CONF syntax); repeatable. Default:
        /// PyTorch's defaults, expandable segments, max_split_size_mb 32/128/512, GC 0.6.
        #[arg(long = "conf")]
        confs: Vec<String>,
        /// The device memory to replay on (80GiB, 40960MiB, bytes). Default: the size the
        /// file records, else inferred from the trace (release-and-retry, out-of-memory),
        /// else 256 GiB; the output says which and why.
        #[arg(long)]
        device_memory: Option<String>,
        /// Print JSON (docs/JSON.md) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// The smallest device memory on which a recorded trace replays without running out
    /// of memory, under the recorded settings and other configurations; given a size,
    /// which configurations fit it (exit status 0 when the recorded settings do, 1 when not).
    Fit {
        /// The snapshot whose trace to replay (recorded with allocation history).
        file: PathBuf,
        /// A configuration to try besides the recorded settings (PYTORCH_CUDA_ALLOC_CONF
        /// syntax; pytorch_expandable_segments:True is PyTorch's expandable segments);
        /// repeatable. Default: replay's.
        #[arg(long = "conf")]
        confs: Vec<String>,
        /// The device memory to check (80GiB, 40960MiB, bytes).
        #[arg(long)]
        device_memory: Option<String>,
        /// Print JSON (docs/JSON.md) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Write a self-contained HTML report (timeline, top sites and flame graph at the peak,
    /// segments, replay table).
    Report {
        /// The snapshot to report on.
        file: PathBuf,
        /// The HTML file to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Compare two runs: peaks and the allocation sites that grew, shrank, appeared or
    /// vanished, per device.
    Diff {
        /// The first run's snapshot (the baseline).
        a: PathBuf,
        /// The second run's snapshot, compared against A.
        b: PathBuf,
        /// Frames per allocation site.
        #[arg(long, default_value_t = 1)]
        depth: usize,
        /// Sites listed per device.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Pair devices by number even when each file has one device (by default two
        /// single-device files are compared device to device, whatever their numbers).
        #[arg(long)]
        by_number: bool,
        /// Print one JSON object (docs/JSON.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a snapshot (memory_viz opens it) of one moment of a whole-run event log
    /// (`CUSHIM_LOG`, `cushim run --log`).
    Snapshot {
        /// The whole-run event log to read (`CUSHIM_LOG`, `cushim run --log`).
        log: PathBuf,
        /// The moment SECONDS after the run's start.
        #[arg(long, conflicts_with_all = ["peak", "end"])]
        at: Option<f64>,
        /// The moment the most bytes were held by allocations (frees waiting for the GPU
        /// included).
        #[arg(long, conflicts_with = "end")]
        peak: bool,
        /// The end of the log (the default).
        #[arg(long)]
        end: bool,
        /// Trace events kept before the moment, per device.
        #[arg(long, default_value_t = 100_000)]
        events: usize,
        /// The snapshot to write (format by extension: .pickle, .msgpack, .json).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Export snapshots and whole-run logs for other tools: Parquet tables partitioned by
    /// rank (DuckDB, Spark, pyarrow) and a Chrome trace (Perfetto); see docs/EXPORT.md.
    Export {
        /// Snapshots or whole-run logs (one per rank, for example run-%r.log's files).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write the events, stacks and segments tables under this directory.
        #[arg(long)]
        parquet: Option<PathBuf>,
        /// Write one log's timeline (memory counters, NVTX ranges, OOMs) as a Chrome trace.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Replace the tables in a directory that holds files, or an existing trace file.
        #[arg(long)]
        replace: bool,
        /// The trace's baseTimeNanoseconds (default: the first event's whole second); give a
        /// PyTorch profiler trace's to line the two up.
        #[arg(long)]
        base_ns: Option<i64>,
        /// The events table's `category` with a category of your own, NAME=REGEX, as
        /// `summary --by category --category` takes it; repeatable, first match wins, before
        /// the built-in rules.
        #[arg(long = "category")]
        categories: Vec<String>,
    },
    /// Convert a snapshot between formats (by extension: .pickle, .msgpack, .json).
    Convert {
        /// The snapshot to read (any supported format).
        input: PathBuf,
        /// The file to write; its extension (.pickle/.pkl, .msgpack, .json) picks the format.
        output: PathBuf,
    },
    /// Ask a running process under the shim to write a live snapshot: sends its dump signal
    /// (the process's CUSHIM_DUMP_SIGNAL, else this one's, else USR1); refuses a process that
    /// has not loaded the shim.
    Dump {
        /// The process id of a program running under the shim.
        pid: i32,
        /// The signal to send: a name (USR2, SIGUSR2) or a number.
        #[arg(long)]
        signal: Option<String>,
    },
    /// Ask a running program under the shim (sleep_mode:True) to give back the device memory
    /// of TAG (every tag without one), keeping its addresses; prints the bytes released.
    /// The program must not touch that memory until it is resumed.
    Pause {
        /// The process id of a program running under the shim.
        pid: i32,
        /// The tag: an explicit tag or an NVTX range name or path; every tag without one.
        tag: Option<String>,
        /// Keep the contents in host memory (restored by resume); without it they are lost.
        #[arg(long)]
        backup: bool,
    },
    /// Ask a running program under the shim to map the memory of TAG (every tag without one)
    /// again, restoring backed-up contents; prints the bytes mapped. On failure the tag stays
    /// paused.
    Resume {
        /// The process id of a program running under the shim.
        pid: i32,
        /// The tag; every tag without one.
        tag: Option<String>,
    },
    /// Say what a first run needs: the driver found (or simcuda) and its version, the shim's
    /// path, membarrier, frame pointers, whether the snapshot directory is writable.
    Doctor,
}

/// `VERSION (commit C)`, as the first line of `--version` and `doctor`.
pub fn version_line() -> String {
    format!("cushim {}", cushim::version::LONG)
}

/// `--version`: the release, the commit, and the shim `run` will preload.
fn long_version() -> String {
    let shim = match locate::shim() {
        Ok((p, o)) => format!("{} ({})", p.display(), o.describe()),
        Err(e) => format!("not found: {e}"),
    };
    format!("{}\nshim: {shim}", cushim::version::LONG)
}

fn main() -> ExitCode {
    // A reader that closes our output early ends us quietly, as it ends every Unix filter
    // (`cushim summary F | head`): Rust's runtime ignores SIGPIPE, so `print!` would panic
    // on the broken pipe instead. cushim writes to no other pipe, so nothing else changes.
    // SAFETY: setting one signal's disposition to its default, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // The version names the shim's path, found at run time; clap keeps it for the process.
    let version: &'static str = Box::leak(long_version().into_boxed_str());
    let matches = Cli::command().version(version).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let result = match cli.cmd {
        Cmd::Run {
            expandable,
            snapshot,
            log,
            history,
            sim,
            observe,
            program,
        } => run(
            launch::Launch {
                expandable,
                snapshot,
                log,
                log_replace: false,
                history,
                sim,
                observe,
                preload: true,
            },
            program,
        ),
        Cmd::Demo {
            expandable,
            snapshot,
            steps,
        } => demo::demo(expandable, snapshot, steps),
        Cmd::Bench { full, out } => bench::bench(!full, out.as_deref()),
        Cmd::Summary {
            files,
            by: Some(by),
            at,
            categories,
            json,
            depth,
            ..
        } if by == "category" => by_category::summary(&files, &at, &categories, depth, json),
        Cmd::Summary { at, categories, .. } if at != "peak" || !categories.is_empty() => {
            Err("--at and --category go with --by category".to_string())
        }
        Cmd::Summary {
            files,
            by: Some(_),
            json,
            ..
        } => by_range::summary(&files, json),
        Cmd::Summary {
            files,
            depth,
            tree,
            json,
            ..
        } => analyze::summary(&files, depth, tree, json),
        Cmd::Replay {
            file,
            confs,
            device_memory,
            json: true,
        } => fit_cmd::replay_json(&file, &confs, device_memory.as_deref()),
        Cmd::Replay {
            file,
            confs,
            device_memory,
            ..
        } => analyze::replay(&file, &confs, device_memory.as_deref()),
        Cmd::Fit {
            file,
            confs,
            device_memory,
            json,
        } => fit_cmd::fit(&file, &confs, device_memory.as_deref(), json),
        Cmd::Report { file, output } => analyze::report(&file, &output),
        Cmd::Diff {
            a,
            b,
            depth,
            top,
            by_number,
            json,
        } => analyze::diff(&a, &b, depth, top, by_number, json),
        Cmd::Snapshot {
            log,
            at,
            peak,
            end: _,
            events,
            output,
        } => {
            let moment = match (at, peak) {
                (Some(s), _) => cushim_tools::snapshot::from_log::Moment::At(s),
                (None, true) => cushim_tools::snapshot::from_log::Moment::Peak,
                (None, false) => cushim_tools::snapshot::from_log::Moment::End,
            };
            snapshot_cmd::snapshot(&log, moment, events, &output)
        }
        Cmd::Export {
            files,
            parquet,
            trace,
            replace,
            base_ns,
            categories,
        } => export_cmd::export(
            &files,
            parquet.as_deref(),
            trace.as_deref(),
            replace,
            base_ns,
            &categories,
        ),
        Cmd::Convert { input, output } => tools::convert(&input, &output),
        Cmd::Dump { pid, signal } => tools::dump(pid, signal.as_deref()),
        Cmd::Pause { pid, tag, backup } => sleep::pause(pid, tag, backup),
        Cmd::Resume { pid, tag } => sleep::resume(pid, tag),
        Cmd::Doctor => doctor::doctor(),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("cushim: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(launch: launch::Launch, program: Vec<OsString>) -> Result<i32, String> {
    let (prog, args) = program.split_first().ok_or("no program given")?;
    let mut cmd = launch.command(prog, args)?;
    forward::install();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cushim: starting {}: {e}", prog.to_string_lossy());
            return Ok(run_checks::spawn_failure_code(&e));
        }
    };
    forward::started(child.id());
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {}: {e}", prog.to_string_lossy()))?;
    Ok(forward::end_like(status))
}
