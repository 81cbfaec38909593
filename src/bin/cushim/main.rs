//! The `cushim` command: run programs under the shim, the bundled demo, and snapshot tools.

mod analyze;
mod bench;
mod by_range;
mod demo;
mod launch;
mod nvtx_env;
mod run_checks;
mod tools;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cushim",
    version,
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
        /// CUSHIM_HISTORY settings (default with --snapshot: enabled=all,stacks=native).
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
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Frames per allocation site: the program's first frame and its callers.
        #[arg(long, default_value_t = 1)]
        depth: usize,
        /// Also print the top-down tree of live bytes.
        #[arg(long)]
        tree: bool,
        /// Group bytes by something else than allocation site: `range` (the NVTX range path
        /// each allocation was made in).
        #[arg(long, value_parser = ["range"])]
        by: Option<String>,
    },
    /// Replay a recorded trace through the engine under the recorded settings and others,
    /// and print peaks, fragmentation, device allocations and OOMs side by side.
    Replay {
        file: PathBuf,
        /// A configuration to replay (PYTORCH_CUDA_ALLOC_CONF syntax); repeatable. Default:
        /// PyTorch's defaults, expandable segments, max_split_size_mb 32/128/512, GC 0.6.
        #[arg(long = "conf")]
        confs: Vec<String>,
    },
    /// Write a self-contained HTML report (timeline, top sites and flame graph at the peak,
    /// segments, replay table).
    Report {
        file: PathBuf,
        /// The HTML file to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Compare two runs: peaks and the allocation sites that grew, shrank, appeared or
    /// vanished, per device.
    Diff {
        a: PathBuf,
        b: PathBuf,
        /// Frames per allocation site.
        #[arg(long, default_value_t = 1)]
        depth: usize,
        /// Sites listed per device.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Convert a snapshot between formats (by extension: .pickle, .msgpack, .json).
    Convert { input: PathBuf, output: PathBuf },
    /// Ask a running process to write a live snapshot (sends CUSHIM_DUMP_SIGNAL, default USR1).
    Dump {
        pid: i32,
        /// Signal number to send.
        #[arg(long, default_value_t = libc::SIGUSR1)]
        signal: i32,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Run {
            expandable,
            snapshot,
            history,
            sim,
            observe,
            program,
        } => run(
            launch::Launch {
                expandable,
                snapshot,
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
            files, by: Some(_), ..
        } => by_range::summary(&files),
        Cmd::Summary {
            files, depth, tree, ..
        } => analyze::summary(&files, depth, tree),
        Cmd::Replay { file, confs } => analyze::replay(&file, &confs),
        Cmd::Report { file, output } => analyze::report(&file, &output),
        Cmd::Diff { a, b, depth, top } => analyze::diff(&a, &b, depth, top),
        Cmd::Convert { input, output } => tools::convert(&input, &output),
        Cmd::Dump { pid, signal } => tools::dump(pid, signal),
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
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cushim: starting {}: {e}", prog.to_string_lossy());
            return Ok(run_checks::spawn_failure_code(&e));
        }
    };
    Ok(launch::exit_code(status))
}
