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
