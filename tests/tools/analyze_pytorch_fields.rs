//! PyTorch's newer snapshot content used by the analyses, on small snapshots shaped as
//! PyTorch writes them (`tests/data/pytorch-newer/make_fixtures.py` writes them and says
//! from which source): record_function annotations as phases, ranges and steps; FX nodes
//! as sites; pinned host memory apart from the device; the recorded allocator settings as
//! the replay's and fit's recorded configuration.
use crate::common;

use common::cli::{ok, write};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/pytorch-newer")
        .join(name)
}

/// Lines of `out` that contain `what`.
fn line_with<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line with {what:?} in\n{out}"))
}

/// PyTorch 2.5+'s `external_annotations` (record_function starts and ends with times): the
/// profiler's steps number the iterations, `## forward ##`, `## backward ##` and
/// `Optimizer.step#AdamW.step` are the phases, so each byte at the peak has its category.
#[test]
fn record_function_annotations_are_the_phases_and_steps_of_a_pytorch_snapshot() {
    let f = fixture("record-function-2.5.pickle");
    let out = ok(&["summary", "--by", "category"], &[&f]);
    assert!(line_with(&out, "gradients").contains("1.00 MiB"), "{out}");
    assert!(
        line_with(&out, "optimizer state").contains("2.00 MiB"),
        "{out}"
    );
    assert!(
        line_with(&out, "activations kept for backward").contains("1.00 MiB"),
        "{out}"
    );
    assert!(!out.contains("unclassified"), "{out}");
    assert!(
        out.contains("steps: 3 found (numbered ranges (ProfilerStep#N))"),
        "{out}"
    );
    let out = ok(&["summary", "--by", "range"], &[&f]);
    assert!(
        out.contains("held the most at the peak: ProfilerStep#0/Optimizer.step#AdamW.step"),
        "{out}"
    );
    assert!(
        out.contains("1 of 1 allocations (1.0 MiB) made in ProfilerStep#0/## backward ## outlived the range (1 still live at the end)"),
        "{out}"
    );
    assert!(!out.contains("(no range)"), "{out}");
}

/// PyTorch 2.4 wrote the same annotations as `user_defined` trace entries: the answers are
/// the same as from the newer layout.
#[test]
fn pytorch_2_4_inline_annotations_give_the_same_answers_as_external_ones() {
    let old = fixture("record-function-2.4.pickle");
    let new = fixture("record-function-2.5.pickle");
    for args in [
        &["summary", "--by", "category"][..],
        &["summary", "--by", "range"],
    ] {
        let a = ok(args, &[&old]);
        assert!(a.contains("ProfilerStep") || a.contains("gradients"), "{a}");
        assert_eq!(a, ok(args, &[&new]), "{args:?}");
    }
}

/// Frames augmented with FX nodes (`_snapshot(augment_with_fx_traces=True)`): the node at
/// the model's line is the site, the generated module's frame stays behind it, and the
/// bytes are compiled code; `convert` carries the fields.
#[test]
fn fx_nodes_are_the_sites_of_compiled_code_and_survive_convert() {
    let dir = common::scratch("analyze-fx-nodes");
    let f = fixture("fx-augmented.pickle");
    let site = "addmm [fx call_function aten.addmm.default] (/work/model.py:12)";
    let out = ok(&["summary"], &[&f]);
    assert!(line_with(&out, site).contains("3.00 MiB"), "{out}");
    assert!(
        out.contains("relu [fx call_function aten.relu.default] (/work/model.py:13)"),
        "{out}"
    );
    let out = ok(&["summary", "--depth", "2"], &[&f]);
    assert!(
        out.contains(&format!(
            "{site} <- forward (/tmp/torchinductor_u/fx/fx_generated_3f2a.py:7)"
        )),
        "{out}"
    );
    let out = ok(&["summary", "--by", "category"], &[&f]);
    assert!(
        line_with(&out, "compiled code").contains("4.00 MiB"),
        "{out}"
    );
    let json = dir.join("fx.json");
    ok(&["convert"], &[&f, &json]);
    let text = std::fs::read_to_string(&json).expect("the converted file");
    assert!(text.contains("\"fx_original_trace\""), "{text}");
    assert!(ok(&["summary"], &[&json]).contains(site));
}

/// Pinned host memory (`host_segments`, `host_traces`) is its own section of `summary` and
/// the category "pinned host memory", never added to the device's figures.
#[test]
fn pinned_host_memory_is_shown_apart_from_the_device() {
    let f = fixture("pinned-host.pickle");
    let out = ok(&["summary"], &[&f]);
    let (dev, host) = out
        .split_once("pinned host memory:")
        .unwrap_or_else(|| panic!("no host section\n{out}"));
    assert!(dev.contains("allocated: 2.00 MiB"), "{out}");
    assert!(dev.contains("reserved:  16.00 MiB"), "{out}");
    assert!(host.contains("allocated: 4.00 MiB"), "{out}");
    assert!(host.contains("load_batch (/work/train.py:71)"), "{out}");
    let out = ok(&["summary", "--by", "category"], &[&f]);
    assert!(
        line_with(&out, "device 0:").contains("2.00 MiB allocated"),
        "{out}"
    );
    assert!(
        out.contains("4.00 MiB  100.0%  pinned host memory"),
        "{out}"
    );
    let out = ok(&["summary", "--json"], &[&f]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let devs = v["devices"].as_array().expect("devices");
    assert_eq!(devs.len(), 2, "{out}");
    assert_eq!(
        (&devs[0]["device"], &devs[0]["allocated_bytes"]),
        (&0.into(), &(2 << 20).into())
    );
    assert_eq!(
        (&devs[1]["device"], &devs[1]["allocated_bytes"]),
        (&(-1).into(), &(4 << 20).into())
    );
    let out = ok(&["summary", "--by", "category", "--json"], &[&f]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let host = v["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["device"] == -1))
        .unwrap_or_else(|| panic!("no device -1 in {out}"));
    assert_eq!(host["categories"][0]["category"], "pinned host memory");
    assert_eq!(host["allocated_bytes"], 4 << 20);
}

/// PyTorch's `allocator_settings` is the recorded configuration of `replay` and `fit`:
/// the effective values (set from Python, not in `PYTORCH_CUDA_ALLOC_CONF`) count, and its
/// other keys (`roundup_power2_divisions` as a dict, the pinned-memory keys) do not break it.
#[test]
fn recorded_allocator_settings_are_the_replays_and_fits_recorded_configuration() {
    let dir = common::scratch("analyze-allocator-settings");
    let mib = 1u64 << 20;
    let base = 0x7f00_0000_0000u64;
    let frames = serde_json::json!([{"name": "step", "filename": "/w/train.py", "line": 3}]);
    let snap = serde_json::json!({
        "segments": [{"device": 0, "address": base, "total_size": 20 * mib, "stream": 0,
            "segment_type": "large", "segment_pool_id": [0, 0], "is_expandable": false,
            "allocated_size": 6 * mib, "active_size": 6 * mib, "requested_size": 6 * mib,
            "frames": frames, "blocks": [
                {"address": base, "size": 6 * mib, "requested_size": 6 * mib,
                 "state": "active_allocated", "frames": frames},
                {"address": base + 6 * mib, "size": 14 * mib, "requested_size": 0,
                 "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": base, "size": 20 * mib, "stream": 0, "time_us": 1, "frames": frames},
            {"action": "alloc", "addr": base, "size": 6 * mib, "stream": 0, "time_us": 2, "frames": frames}
        ]],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.7",
            "max_split_size": 64 * mib, "garbage_collection_threshold": 0.7,
            "expandable_segments": false, "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": false, "pinned_use_cuda_host_register": false,
            "roundup_power2_divisions": {"1": 0, "2": 0, "4": 0}
        }
    });
    let f = write(&dir, "settings.json", snap.to_string().as_bytes());
    let conf = "garbage_collection_threshold:0.7,max_split_size_mb:64,expandable_segments:False";
    let out = ok(&["replay"], &[&f]);
    assert!(
        out.contains(&format!("recorded settings: {conf:?}")),
        "{out}"
    );
    assert!(out.contains(&format!("replay: recorded ({conf})")), "{out}");
    let out = ok(&["fit"], &[&f]);
    assert!(out.contains(&format!("recorded ({conf})")), "{out}");
}

/// A real PyTorch 2.5+ snapshot (tests/data/real/README.md: a full training step with AdamW)
/// carries the optimizer's own record_function annotation: the optimizer's step is a range,
/// which held the most at the peak and whose state outlived it.
#[test]
fn a_real_snapshots_optimizer_annotation_is_a_range() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real/cs336-medium-128-training-memory_snapshot.pickle.gz");
    let out = ok(&["summary", "--by", "range"], &[&f]);
    assert!(
        out.contains("held the most at the peak: Optimizer.step#AdamW.step"),
        "{out}"
    );
    assert!(
        out.contains("438 of 3066 allocations (3228.6 MiB) made in Optimizer.step#AdamW.step outlived the range (438 still live at the end)"),
        "{out}"
    );
}
