//! Shapes found in public PyTorch snapshots by the sweep over real files
//! (`scripts/real_sweep.py`), each reduced to a small generated pickle that reproduces it:
//! what the real file made a command get wrong, and what it must give instead.
use super::analyze_real::{python, replay_row, FRAMES_PY};
use crate::common;

use common::cli::{ok, write};

/// PyTorch splits a large-pool block only when more than 1 MiB would be left, so a block
/// keeps a tail of up to 1 MiB beyond its request, and the trace records the request. Two
/// blocks live when the trace began, a 5 MiB request holding 5.5 MiB and the next block
/// right after it, fill a 20 MiB segment: the replay lays them out as they were, in that
/// one segment, instead of taking the half-MiB tail as a small request (a new 2 MiB
/// small-pool segment, 22 MiB reserved where the program had 20); and `fit` finds the 20
/// MiB device enough.
#[test]
fn a_block_that_kept_its_free_blocks_tail_replays_in_its_segment() {
    let dir = common::scratch("analyze-real-shapes-tail");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
base = 0x7f0000000000
a, b = base, base + 5 * MIB + MIB // 2
def e(action, x, n): return {{"action": action, "addr": x, "size": n, "stream": 0, "frames": bert}}
trace = [e("free_requested", a, 5 * MIB), e("free_completed", a, 5 * MIB),
         e("alloc", a, 4 * MIB), e("free_requested", a, 4 * MIB), e("free_completed", a, 4 * MIB),
         e("free_requested", b, 14 * MIB + MIB // 2), e("free_completed", b, 14 * MIB + MIB // 2)]
segs = [{{"device": 0, "address": base, "total_size": 20 * MIB, "stream": 0, "segment_type": "large",
          "is_expandable": False, "frames": bert,
          "blocks": [{{"address": base, "size": 20 * MIB, "requested_size": 0, "state": "inactive",
                      "frames": []}}]}}]
s = {{"segments": segs, "device_traces": [trace],
     "allocator_settings": DEFAULTS}}
sys.stdout.buffer.write(pickle.dumps(s, protocol=4))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "tail.pickle", &p);
    let out = ok(&["replay", "--conf", ""], &[&f]);
    assert_eq!(replay_row(&out, "recorded")[1], "20.0", "{out}");
    let replayed = replay_row(&out, "replay: recorded");
    assert_eq!(
        (replayed[1].as_str(), replayed[5].as_str()),
        ("20.0", "0"),
        "the two blocks in their one segment, no small-pool segment\n{out}"
    );
    let fit: serde_json::Value = serde_json::from_str(&ok(&["fit", "--json"], &[&f])).unwrap();
    let recorded = &fit["devices"][0]["configurations"][0];
    assert_eq!(recorded["recorded"], true, "{fit}");
    assert_eq!(recorded["min_device_bytes"], 20u64 << 20, "{fit}");
}

/// The same tail at the end: a 5 MiB request holds a 5.5 MiB block, live when the snapshot
/// was taken. The trace's peak is counted in the trace's sizes, the end's blocks in theirs;
/// `summary`'s peak allocated is the trace's (5 MiB, not the block's 5.5 MiB), the moment
/// `--by category` splits, so its categories sum to the peak.
#[test]
fn summarys_peak_is_the_moment_the_categories_split_when_a_block_holds_a_tail() {
    let dir = common::scratch("analyze-real-shapes-peak");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
base = 0x7f0000000000
def e(action, x, n): return {{"action": action, "addr": x, "size": n, "stream": 0, "frames": bert}}
trace = [e("segment_alloc", base, 20 * MIB), e("alloc", base, 5 * MIB)]
segs = [{{"device": 0, "address": base, "total_size": 20 * MIB, "stream": 0, "segment_type": "large",
          "is_expandable": False, "frames": bert,
          "blocks": [{{"address": base, "size": 5 * MIB + MIB // 2, "requested_size": 5 * MIB,
                      "state": "active_allocated", "frames": bert}},
                     {{"address": base + 5 * MIB + MIB // 2, "size": 14 * MIB + MIB // 2,
                      "requested_size": 0, "state": "inactive", "frames": []}}]}}]
sys.stdout.buffer.write(pickle.dumps({{"segments": segs, "device_traces": [trace]}}, protocol=4))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "peak.pickle", &p);
    let s: serde_json::Value = serde_json::from_str(&ok(&["summary", "--json"], &[&f])).unwrap();
    let peak = s["devices"][0]["peak_allocated_bytes"].as_u64().unwrap();
    assert_eq!(peak, 5 << 20, "{s}");
    let c: serde_json::Value =
        serde_json::from_str(&ok(&["summary", "--by", "category", "--json"], &[&f])).unwrap();
    let dev = &c["devices"][0];
    let sum: u64 = dev["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(
        (dev["allocated_bytes"].as_u64(), sum),
        (Some(peak), peak),
        "{c}"
    );
}

/// PyTorch's best fit breaks ties between free blocks of one size by address, and CUDA's
/// driver mostly hands each new allocation out below the earlier ones. A 200 MiB request
/// with two equal free blocks, the tail of a 400 MiB segment and a later, lower 200 MiB
/// segment, took the lower one; so the 400 MiB segment became whole again and held the
/// 400 MiB request that followed (600 MiB reserved). With the replay's device handing out
/// rising addresses the tie went the other way and a third segment was needed (1000 MiB).
#[test]
fn a_tie_between_equal_free_blocks_goes_where_the_recording_sent_it() {
    let dir = common::scratch("analyze-real-shapes-tie");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
a, b = 0x7f0040000000, 0x7f0000000000
def e(action, x, n): return {{"action": action, "addr": x, "size": n, "stream": 0, "frames": bert}}
def free(x, n): return [e("free_requested", x, n), e("free_completed", x, n)]
trace = ([e("segment_alloc", a, 400 * MIB), e("alloc", a, 400 * MIB)] + free(a, 400 * MIB)
         + [e("alloc", a, 200 * MIB), e("alloc", a + 200 * MIB, 200 * MIB),
            e("segment_alloc", b, 200 * MIB), e("alloc", b, 200 * MIB)]
         + free(a + 200 * MIB, 200 * MIB) + free(b, 200 * MIB)
         + [e("alloc", b, 200 * MIB)] + free(a, 200 * MIB) + [e("alloc", a, 400 * MIB)])
def seg(x, n):
    return {{"device": 0, "address": x, "total_size": n, "stream": 0, "segment_type": "large",
             "is_expandable": False, "frames": bert,
             "blocks": [{{"address": x, "size": n, "requested_size": n,
                         "state": "active_allocated", "frames": bert}}]}}
s = {{"segments": [seg(a, 400 * MIB), seg(b, 200 * MIB)], "device_traces": [trace],
     "allocator_settings": DEFAULTS}}
sys.stdout.buffer.write(pickle.dumps(s, protocol=4))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "tie.pickle", &p);
    let out = ok(&["replay", "--conf", ""], &[&f]);
    assert_eq!(replay_row(&out, "recorded")[1], "600.0", "{out}");
    let replayed = replay_row(&out, "replay: recorded");
    assert_eq!(
        (replayed[1].as_str(), replayed[4].as_str()),
        ("600.0", "2"),
        "two segments, the tie sent to the lower one\n{out}"
    );
}

/// The bytes of each category of `summary --by category --json` (args after the command).
fn categories(args: &[&str], f: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    let mut a = vec!["summary", "--by", "category", "--json"];
    a.extend_from_slice(args);
    let c: serde_json::Value = serde_json::from_str(&ok(&a, &[f])).unwrap();
    c["devices"][0]["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["category"].as_str().unwrap().to_string(),
                c["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Frames of a training loop driven by Lightning, whose automatic optimization calls
/// `optimizer.step(closure)`: the forward and backward passes run inside torch.optim's
/// step. `inner` are the frames closest to the allocation.
const CLOSURE_PY: &str = r#"
lightning = "/env/site-packages/lightning/pytorch/loops/optimization/automatic.py"
def in_step(inner):
    return inner + [py("training_step", "/w/model.py", 105), py("closure", lightning, 131),
        py("step", "/env/site-packages/torch/optim/adam.py", 146),
        py("wrapper", "/env/site-packages/torch/optim/optimizer.py", 385),
        py("run", lightning, 192), py("main", "/w/train.py", 40)]
fwd = in_step([py("forward", "/w/dit.py", 125),
               py("_call_impl", "/env/site-packages/torch/nn/modules/module.py", 1561)])
bwd = [native("torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)"),
       native("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)")]
opt = [py("_init_group", "/env/site-packages/torch/optim/adam.py", 100),
       py("step", "/env/site-packages/torch/optim/adam.py", 146),
       py("wrapper", "/env/site-packages/torch/optim/optimizer.py", 385),
       py("run", lightning, 192), py("main", "/w/train.py", 40)]
init = [py("__init__", "/env/site-packages/torch/nn/modules/linear.py", 99),
        py("<module>", "/w/train.py", 8)]
base = 0x7f0000000000
P, A, T, G, S = base, base + 4 * MIB, base + 36 * MIB, base + 38 * MIB, base + 42 * MIB
def e(action, x, n, fr): return {"action": action, "addr": x, "size": n, "stream": 0, "frames": fr}
def free(x, n, fr): return [e("free_requested", x, n, fr), e("free_completed", x, n, fr)]
trace = ([e("segment_alloc", base, 64 * MIB, init), e("alloc", P, 4 * MIB, init),
          e("alloc", A, 32 * MIB, fwd), e("alloc", T, 2 * MIB, fwd)] + free(T, 2 * MIB, fwd)
         + [e("alloc", G, 4 * MIB, bwd)] + free(A, 32 * MIB, bwd)
         + [e("alloc", S, 8 * MIB, opt)])
def blk(x, n, st, fr): return {"address": x, "size": n, "requested_size": n, "state": st, "frames": fr}
segs = [{"device": 0, "address": base, "total_size": 64 * MIB, "stream": 0, "segment_type": "large",
         "is_expandable": False, "frames": init,
         "blocks": [blk(P, 4 * MIB, "active_allocated", init), blk(A, 34 * MIB, "inactive", []),
                    blk(G, 4 * MIB, "active_allocated", bwd), blk(S, 8 * MIB, "active_allocated", opt),
                    blk(S + 8 * MIB, 14 * MIB, "inactive", [])]}]
sys.stdout.buffer.write(pickle.dumps({"segments": segs, "device_traces": [trace],
                                      "allocator_settings": DEFAULTS}, protocol=4))
"#;

/// Lightning (and LBFGS, SAM) step the optimizer with a closure that runs the forward and
/// backward passes, so every frame of the forward pass sits inside torch.optim's `step`. A
/// public snapshot of such a run showed 22 GB of a ViT's activations as "optimizer state".
/// The forward frames closer to the allocation win: what the forward made and the
/// backward freed is an activation, what the backward made a gradient, and only what
/// torch.optim made itself is optimizer state.
#[test]
fn the_forward_pass_inside_an_optimizers_closure_is_the_forward_pass() {
    let dir = common::scratch("analyze-real-shapes-closure");
    let Some(p) = python(&format!("{FRAMES_PY}{CLOSURE_PY}")) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "closure.pickle", &p);
    let peak = categories(&[], &f);
    let mib = |n: u64| n << 20;
    assert_eq!(
        peak.get("activations kept for backward"),
        Some(&mib(32)),
        "{peak:?}"
    );
    assert_eq!(peak.get("gradients"), Some(&mib(4)), "{peak:?}");
    assert_eq!(peak.get("optimizer state"), None, "{peak:?}");
    let end = categories(&["--at", "end"], &f);
    assert_eq!(end.get("optimizer state"), Some(&mib(8)), "{end:?}");
    let text = ok(&["summary", "--by", "category"], &[&f]);
    assert!(
        text.contains("phases (events): forward 2..6, backward 6..9, optimizer 9..10"),
        "{text}"
    );
}

/// A layer built straight on the device (`nn.Linear(..., device="cuda")`) allocates its
/// weight in torch.nn's constructor, with no `_apply`, `nn.init` or `nn.Parameter` frame:
/// those bytes are parameters, not "unclassified".
#[test]
fn a_layer_made_on_the_device_by_its_constructor_is_parameters() {
    let dir = common::scratch("analyze-real-shapes-ctor");
    let Some(p) = python(&format!("{FRAMES_PY}{CLOSURE_PY}")) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "ctor.pickle", &p);
    let end = categories(&["--at", "end"], &f);
    assert_eq!(
        end.get("parameters and buffers"),
        Some(&(4 << 20)),
        "{end:?}"
    );
    assert_eq!(end.get("unclassified"), None, "{end:?}");
}

/// Rebinding `out = model(x)` without a backward pass drops the old autograd graph: its
/// nodes free the tensors they saved, with frames of the backward nodes
/// (`AddmmBackward0::release_variables`) under `torch::autograd::deleteNode` but no autograd
/// engine. A public forward-only snapshot showed a "backward" phase after each forward and
/// counted its steps by them; the graph's teardown is no phase clue, so a forward-only
/// trace has forward passes only (and its steps start with them). What the graph saved and
/// freed as it went was still kept for backward, not a forward temporary.
#[test]
fn an_autograd_graph_dropped_without_backward_is_not_a_backward_pass() {
    let dir = common::scratch("analyze-real-shapes-teardown");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
teardown = [native("torch::autograd::SavedVariable::reset_data()"),
            native("torch::autograd::generated::AddmmBackward0::release_variables()"),
            native("torch::autograd::deleteNode(torch::autograd::Node*)"),
            py("<module>", "/w/profile.py", 11)]
base = 0x7f0000000000
def e(action, x, n, fr): return {{"action": action, "addr": x, "size": n, "stream": 0, "frames": fr}}
trace = [e("segment_alloc", base, 20 * MIB, bert)]
for i in range(3):
    x, y = base + (i % 2) * 8 * MIB, base + 16 * MIB
    trace += [e("alloc", x, 8 * MIB, bert), e("alloc", y, 2 * MIB, bert),
              e("free_requested", y, 2 * MIB, bert), e("free_completed", y, 2 * MIB, bert)]
    if i:
        old = base + ((i - 1) % 2) * 8 * MIB
        trace += [e("free_requested", old, 8 * MIB, teardown), e("free_completed", old, 8 * MIB, teardown)]
segs = [{{"device": 0, "address": base, "total_size": 20 * MIB, "stream": 0, "segment_type": "large",
          "is_expandable": False, "frames": bert,
          "blocks": [{{"address": base, "size": 8 * MIB, "requested_size": 8 * MIB,
                      "state": "active_allocated", "frames": bert}},
                     {{"address": base + 8 * MIB, "size": 12 * MIB, "requested_size": 0,
                      "state": "inactive", "frames": []}}]}}]
sys.stdout.buffer.write(pickle.dumps({{"segments": segs, "device_traces": [trace]}}, protocol=4))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "teardown.pickle", &p);
    let text = ok(&["summary", "--by", "category"], &[&f]);
    let phases = text
        .lines()
        .find(|l| l.contains("phases (events)"))
        .unwrap_or_default();
    assert!(
        phases.contains("forward") && !phases.contains("backward"),
        "{text}"
    );
    assert!(
        text.contains("(phases: a step starts with each forward pass)"),
        "{text}"
    );
    // What each forward saved stayed live until its graph went: kept for a backward pass.
    let peak = categories(&[], &f);
    assert_eq!(
        (
            peak.get("activations kept for backward"),
            peak.get("forward temporaries")
        ),
        (Some(&(16 << 20)), Some(&(2 << 20))),
        "{peak:?}"
    );
}

/// A snapshot with segments and no trace (history recorded as `"state"`, or its trace
/// dropped) has one moment, its own: `summary` does not call it a peak from the trace, and
/// `--by category` does not say "after event 0 of 0".
#[test]
fn a_snapshot_without_a_trace_names_its_one_moment_as_the_snapshots() {
    let dir = common::scratch("analyze-real-shapes-notrace");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
base = 0x7f0000000000
segs = [{{"device": 0, "address": base, "total_size": 20 * MIB, "stream": 0, "segment_type": "large",
          "is_expandable": False, "frames": bert,
          "blocks": [{{"address": base, "size": 8 * MIB, "requested_size": 8 * MIB,
                      "state": "active_allocated", "frames": bert}},
                     {{"address": base + 8 * MIB, "size": 12 * MIB, "requested_size": 0,
                      "state": "inactive", "frames": []}}]}}]
sys.stdout.buffer.write(pickle.dumps({{"segments": segs, "device_traces": [[]]}}, protocol=4))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "notrace.pickle", &p);
    let s = ok(&["summary"], &[&f]);
    assert!(
        s.contains("allocated: 8.00 MiB (peak 8.00 MiB, no trace: the snapshot's own moment)"),
        "{s}"
    );
    assert!(!s.contains("from the trace"), "{s}");
    let c = ok(&["summary", "--by", "category"], &[&f]);
    assert!(
        c.contains("device 0: 8.00 MiB allocated at the snapshot (no trace"),
        "{c}"
    );
    assert!(!c.contains("after event 0 of 0"), "{c}");
}

/// A trace that ends in a step cut short (an out-of-memory in its forward pass, the
/// snapshot dumped by an OOM observer) has its peak after the last complete step. A public
/// snapshot's summary said "the peak was in step 1 of 1: 124.79 MiB" where the trace peaked
/// at 22 GB in the unfinished step; the line says where the peak really was.
#[test]
fn a_peak_in_the_step_a_trace_ends_in_is_not_given_to_an_earlier_step() {
    let dir = common::scratch("analyze-real-shapes-unfinished");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
bwd = [native("torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)"),
       native("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)")]
opt = [py("_init_group", "/env/site-packages/torch/optim/adam.py", 100),
       py("step", "/env/site-packages/torch/optim/adam.py", 146), py("main", "/w/train.py", 40)]
base = 0x7f0000000000
A, G, S, B = base, base + 8 * MIB, base + 10 * MIB, base + 12 * MIB
def e(action, x, n, fr): return {{"action": action, "addr": x, "size": n, "stream": 0, "frames": fr}}
trace = [e("segment_alloc", base, 64 * MIB, bert), e("alloc", A, 8 * MIB, bert),
         e("alloc", G, 2 * MIB, bwd), e("free_requested", A, 8 * MIB, bwd),
         e("free_completed", A, 8 * MIB, bwd), e("alloc", S, 2 * MIB, opt),
         e("alloc", B, 32 * MIB, bert)]
def blk(x, n, st): return {{"address": x, "size": n, "requested_size": n, "state": st, "frames": bert}}
segs = [{{"device": 0, "address": base, "total_size": 64 * MIB, "stream": 0, "segment_type": "large",
          "is_expandable": False, "frames": bert,
          "blocks": [blk(A, 8 * MIB, "inactive"), blk(G, 2 * MIB, "active_allocated"),
                     blk(S, 2 * MIB, "active_allocated"), blk(B, 32 * MIB, "active_allocated"),
                     blk(B + 32 * MIB, 20 * MIB, "inactive")]}}]
sys.stdout.buffer.write(pickle.dumps({{"segments": segs, "device_traces": [trace]}}, protocol=4))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "unfinished.pickle", &p);
    let s = ok(&["summary"], &[&f]);
    assert!(
        s.contains(
            "the peak came after the last of them, in the unfinished step the trace ends in: \
             36.00 MiB after event 7 (the highest step, 1, peaked at"
        ),
        "{s}"
    );
    assert!(!s.contains("the peak was in step"), "{s}");
}

/// A committed public snapshot (tests/data/real/README.md says where each comes from and
/// under which licence).
fn real(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real")
        .join(name)
}

/// verl's public snapshot has no trace, vLLM's KV cache in a private pool and blocks
/// pending their free: `summary` names its one moment as the snapshot's, shows the
/// pending frees apart and the pools' memory; `--by category` splits exactly the
/// allocated bytes (the pending frees are no longer the program's) by what each block's
/// own frames say: the KV cache in its private pool, the parameters built on the device,
/// and the rest as live before the recording.
#[test]
fn a_public_snapshot_without_a_trace_shows_its_own_moment_pools_and_pending_frees() {
    let f = real("verl-mem.pickle.gz");
    let s = ok(&["summary"], &[&f]);
    for want in [
        "allocated: 23761.78 MiB (peak 23761.78 MiB, no trace: the snapshot's own moment)",
        "pending free: 569.70 MiB (freed, waiting for other streams)",
        "pool (0, 2): 20784.00 MiB reserved in 24 segments, 20784.00 MiB allocated",
    ] {
        assert!(s.contains(want), "{want}\n{s}");
    }
    let c: serde_json::Value =
        serde_json::from_str(&ok(&["summary", "--by", "category", "--json"], &[&f])).unwrap();
    let dev = &c["devices"][0];
    let cats = categories(&[], &f);
    let cat = |name: &str| cats.get(name).copied();
    assert_eq!(dev["allocated_bytes"].as_u64(), Some(24916034560), "{c}");
    assert_eq!(cat("CUDA-graph private pools"), Some(22292150272), "{c}");
    assert_eq!(cat("parameters and buffers"), Some(179998720), "{c}");
    assert_eq!(
        dev["before_recording_bytes"].as_u64(),
        cat("before the recording / no stack"),
        "{c}"
    );
}

/// A public snapshot recorded with `expandable_segments:True` (two expandable segments, 13
/// GB live before its trace began) replays under PyTorch's expandable segments, its
/// recorded settings, to its recorded peak reserved within 1%.
#[test]
fn a_public_expandable_segments_snapshot_replays_to_its_recorded_peak() {
    let f = real("cs336-bolongcheng-expandable-forward.pickle.gz");
    let out = ok(&["replay"], &[&f]);
    assert!(
        out.contains("note: recorded settings: \"expandable_segments:True\""),
        "{out}"
    );
    let recorded: f64 = replay_row(&out, "recorded")[1].parse().unwrap();
    let replayed: f64 = replay_row(&out, "replay: recorded (pytorch_expandable_segments:True)")[1]
        .parse()
        .unwrap();
    assert_eq!(recorded, 21764.0, "{out}");
    assert!(
        (replayed - recorded).abs() <= recorded / 100.0,
        "{replayed} vs {recorded}\n{out}"
    );
}

/// bcrafton's public snapshot began its trace with Adam's moments already allocated (their
/// allocation left the trace's ring, their stacks did not): at the peak they count as
/// optimizer state, by their own frames (`step (optimizer.py:71)` and `:72`), and only the
/// blocks without any stack stay "before the recording".
#[test]
fn blocks_live_before_the_trace_are_classified_by_their_own_frames() {
    let f = real("cs336-bcrafton-memory_snapshot.pickle.gz");
    let c: serde_json::Value =
        serde_json::from_str(&ok(&["summary", "--by", "category", "--json"], &[&f])).unwrap();
    let dev = &c["devices"][0];
    let cats = categories(&[], &f);
    let cat = |name: &str| cats.get(name).copied();
    // 2 x 579.31 MiB of moments and 294.47 MiB from before the trace, 294.47 MiB in it.
    assert_eq!(cat("optimizer state"), Some(1832460288), "{c}");
    assert_eq!(
        cat("before the recording / no stack"),
        Some(1545204736),
        "{c}"
    );
    assert_eq!(
        dev["before_recording_bytes"].as_u64(),
        Some(1545204736),
        "{c}"
    );
}
