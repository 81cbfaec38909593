//! NVTX range cost: a push/pop pair on the engine's per-thread range stack (what the shim's
//! `nvtxRangePushA`/`nvtxRangePop` callbacks do, without NVTX's own dispatch), by name and by
//! registered string, and by name with history on (each start and end kept as an annotation);
//! and one recorded event into a full ring outside every range and inside
//! a three-level range path (the added cost is one thread-local read either way).
//! Then the same costs in a program, through NVTX's own dispatch and the shim's injection
//! callbacks: `examples/bench_nvtx.c`, built against NVIDIA's NVTX headers (the wheel
//! `cargo test --test shim -- shim_nvtx::` fetches into `target/nvtx-wheel/`) and run on simcuda under
//! `libcushim.so` of this profile (`cargo build --release` first), in one run of this bench:
//! push+pop with history off, and a cached cudaMalloc+cudaFree pair outside and inside a
//! three-level range path with history on (no stacks) and off.
//! Prints median nanoseconds; `cargo bench --bench nvtx_ranges`.

use cushim::config::history::{parse, HistoryConf};
use cushim::trace::event::{now_us, Action, EventSink, TraceEvent};
use cushim::trace::range::{self, DEFAULT_DOMAIN};
use cushim::trace::ring::TraceRing;
use cushim_testsupport::workloads::timing;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

fn ring() -> TraceRing {
    let conf = parse("enabled=all,max_entries=100000").unwrap_or_else(|_| HistoryConf::off());
    let mut r = TraceRing::for_device(&conf);
    for i in 0..100_000 {
        r.record(event(i));
    }
    r
}

#[inline(always)]
fn event(i: u64) -> TraceEvent {
    TraceEvent {
        action: Action::Alloc,
        device: 0,
        addr: 0x7f00_0000_0000 + (i & 0xffff) * 512,
        size: 512,
        stream: 0,
        time_us: now_us(),
        stack: 0,
        device_free: 0,
        range: 0,
    }
}

fn main() {
    let batch = Duration::from_millis(50);
    let reps = 7;
    let push_pop_str = timing::median_ns(batch, reps, |n| {
        for _ in 0..n {
            range::open_str(DEFAULT_DOMAIN, black_box("forward"), 0);
            range::pop(DEFAULT_DOMAIN);
        }
    });
    let name = range::intern_name("forward");
    let push_pop_registered = timing::median_ns(batch, reps, |n| {
        for _ in 0..n {
            range::open(DEFAULT_DOMAIN, black_box(name), 0);
            range::pop(DEFAULT_DOMAIN);
        }
    });
    // With history on, every start and end is also kept as an annotation.
    cushim::trace::annotations::enable(100_000, || 0);
    let push_pop_annotated = timing::median_ns(batch, reps, |n| {
        for _ in 0..n {
            range::open_str(DEFAULT_DOMAIN, black_box("forward"), 0);
            range::pop(DEFAULT_DOMAIN);
        }
    });
    let mut r = ring();
    let outside = timing::median_ns(batch, reps, |n| {
        for i in 0..n {
            r.record(event(i));
        }
    });
    range::open_str(DEFAULT_DOMAIN, "step", 0);
    range::open_str(DEFAULT_DOMAIN, "forward", 0);
    range::open_str(DEFAULT_DOMAIN, "layer", 0);
    let inside = timing::median_ns(batch, reps, |n| {
        for i in 0..n {
            r.record(event(i));
        }
    });
    println!("push+pop by name:              {push_pop_str:7.1} ns");
    println!("push+pop by registered string: {push_pop_registered:7.1} ns");
    println!("push+pop by name, annotated:   {push_pop_annotated:7.1} ns");
    println!("event outside every range:     {outside:7.1} ns");
    println!("event inside a 3-level path:   {inside:7.1} ns");
    if let Err(e) = in_a_program() {
        println!("in a program: not measured: {e}");
    }
}

/// The program-level figures (module docs).
fn in_a_program() -> Result<(), String> {
    use cushim_testsupport::artifacts;
    use cushim_testsupport::workloads::procs::ProcEnv;
    let dir = artifacts::build_dir().map_err(|e| format!("the build directory: {e}"))?;
    let include = dir
        .parent()
        .ok_or("the build directory has no parent")?
        .join("nvtx-wheel/x/nvidia/nvtx/include");
    if !include.join("nvtx3/nvToolsExt.h").exists() {
        return Err(format!(
            "no NVTX headers at {} (cargo test --test shim -- shim_nvtx:: fetches them)",
            include.display()
        ));
    }
    let env = ProcEnv::new(&dir)?;
    let exe = env.bins.join("bench_nvtx");
    let src = artifacts::source_root().join("examples/bench_nvtx.c");
    let flag = format!("-I{}", include.display());
    artifacts::compile_c(&src, &exe, &env.layout, &["-O2", "-ldl", &flag])
        .map_err(|e| format!("compiling {}: {e}", src.display()))?;
    let shim = env.shim.display().to_string();
    let run = |history: &str| -> Result<String, String> {
        let mut vars = vec![("NVTX_INJECTION64_PATH", shim.as_str())];
        if !history.is_empty() {
            vars.push(("CUSHIM_HISTORY", history));
        }
        let out = env.run(
            &exe,
            &["200000", "7"],
            true,
            &vars,
            Duration::from_secs(120),
        )?;
        out.lines()
            .find(|l| l.starts_with("nvtx "))
            .map(str::to_string)
            .ok_or_else(|| format!("{}: no figures in {out:?}", Path::new(&exe).display()))
    };
    println!("in a program, history off:     {}", run("")?);
    println!(
        "in a program, history on:      {}",
        run("enabled=all,context=all,stacks=none")?
    );
    Ok(())
}
