//! `cushim report FILE -o report.html`: one self-contained HTML page (every style inline,
//! no script, no network) with, per device, the timeline of allocated and reserved memory,
//! the top sites at the peak, bytes by NVTX range path when the trace carries ranges
//! (`by_range`: peak and live bytes per path, the path that held the most at the peak, the
//! allocations that outlived their range), a flame graph of live bytes at the peak, the
//! segments' fill at the peak (`segments_at`), and the replay table.
//!
//! Policy: the page stays small whatever the input: the timeline is aggregated into at most
//! [`BUCKETS`] columns (each the maximum of its events), the flame graph drops frames under
//! 0.5% of the peak, and segment, site and step lists are capped; nothing is drawn per block or
//! per event. Drawing is SVG, so the page needs no script to render. Text from the input
//! (frame names, file names) is escaped.

use crate::analyze::by_range::{self, DeviceRanges};
use crate::analyze::model::{Device, Snapshot};
use crate::analyze::replay::{self, Replay};
use crate::analyze::segments_at::{segments_at, SegFill, SegmentsForward};
use crate::analyze::sites::{by_site, tree_by_function, Node};
use crate::analyze::timeline::{apply, State};
use crate::analyze::walk::{walks_of, Walked};
use std::fmt::Write;

/// Columns of the timeline.
pub const BUCKETS: usize = crate::analyze::walk::BUCKETS;
/// Rows of the by-range table (most bytes at the peak first).
const RANGE_ROWS: usize = 30;
/// Rows of the steps table (the first steps; the one that peaked is listed too).
const STEP_ROWS: usize = 50;
/// Levels of the flame graph.
const FLAME_DEPTH: usize = 12;
const WIDTH: f64 = 1000.0;

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

use crate::analyze::units::mib1 as mib;

/// A byte count with the unit that keeps it short (axis labels).
fn short_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.0} MiB", b / (1u64 << 20) as f64)
    }
}

/// The round step (1, 2, 2.5 or 5 times a power of ten) at or above `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// A tick's label: `v` units, with the decimals the step needs.
fn tick_label(v: f64, step: f64, unit: &str) -> String {
    let decimals = if step.fract().abs() < 1e-9 {
        0
    } else if (step * 10.0).fract().abs() < 1e-9 {
        1
    } else {
        2
    };
    format!("{v:.decimals$} {unit}")
}

/// Where to mark the timeline: the peak's event index and every OOM's.
struct Marks {
    events: usize,
    /// Events per column of the timeline (`Walked::per`).
    per: usize,
    peak_at: usize,
    peak: u64,
    ooms: Vec<usize>,
}

fn svg_timeline(out: &mut String, pts: &[(u64, u64)], marks: &Marks) {
    // Plot area inside margins for the axes' labels.
    let (left, bottom, h) = (70.0, 30.0, 230.0);
    let plot_w = WIDTH - left - 10.0;
    let plot_h = h - bottom - 10.0;
    let highest = pts.iter().map(|p| p.0.max(p.1)).max().unwrap_or(0).max(1) as f64;
    // The memory axis in round steps (1, 2, 2.5 or 5 times a power of ten, in MiB or GiB),
    // its top the first step at or above the highest value.
    let (unit, unit_name) = if highest >= 4.0 * (1u64 << 30) as f64 {
        ((1u64 << 30) as f64, "GiB")
    } else {
        ((1u64 << 20) as f64, "MiB")
    };
    let ystep = nice_step(highest / unit / 4.0) * unit;
    let top = (highest / ystep).ceil().max(1.0) * ystep;
    let x = |i: usize| left + i as f64 * plot_w / (pts.len().max(2) - 1) as f64;
    let y = |v: f64| 10.0 + plot_h - v * plot_h / top;
    // Event index -> x (bucket i holds events up to i * per).
    let per = marks.per.max(1) as f64;
    let ex = |e: usize| x(0) + (e as f64 / per) * plot_w / (pts.len().max(2) - 1) as f64;
    let line = |sel: &dyn Fn(&(u64, u64)) -> u64| -> String {
        pts.iter()
            .enumerate()
            .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(sel(p) as f64)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut axes = String::new();
    // Y axis: memory, at round steps.
    let yticks = (top / ystep).round() as usize;
    for k in 0..=yticks {
        let v = ystep * k as f64;
        let _ = write!(
            axes,
            "<line x1=\"{left}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            left + plot_w,
            left - 4.0,
            y(v) + 4.0,
            esc(&tick_label(v / unit, ystep / unit, unit_name)),
            yy = y(v)
        );
    }
    // X axis: trace events, at round steps; a label near the right edge ends there (one
    // centred on it would be clipped).
    let xstep = (nice_step(marks.events as f64 / 4.0).max(1.0)) as usize;
    for e in (0..=marks.events).step_by(xstep) {
        let anchor = if ex(e) > left + plot_w - 30.0 {
            "end"
        } else {
            "middle"
        };
        let _ = write!(
            axes,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{e}</text>",
            ex(e),
            h - bottom + 14.0
        );
    }
    let _ = write!(
        axes,
        "<line x1=\"{left}\" x2=\"{left}\" y1=\"10\" y2=\"{:.1}\" stroke=\"#888\"/>\
         <line x1=\"{left}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">trace events (oldest left)</text>\
         <text x=\"12\" y=\"{:.1}\" transform=\"rotate(-90 12 {:.1})\" text-anchor=\"middle\">memory</text>",
        10.0 + plot_h,
        left + plot_w,
        10.0 + plot_h,
        10.0 + plot_h,
        left + plot_w / 2.0,
        h - 2.0,
        10.0 + plot_h / 2.0,
        10.0 + plot_h / 2.0
    );
    // The peak and every OOM, marked.
    let mut markers = String::new();
    let px = ex(marks.peak_at);
    let _ = write!(
        markers,
        "<g><title>peak allocated {} after event {}</title>\
         <line x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"10\" y2=\"{:.1}\" stroke=\"#080\" \
         stroke-dasharray=\"4 3\"/><text x=\"{:.1}\" y=\"22\" fill=\"#080\">peak {}</text></g>",
        esc(&mib(marks.peak)),
        marks.peak_at,
        10.0 + plot_h,
        (px + 4.0).min(WIDTH - 110.0),
        esc(&short_bytes(marks.peak))
    );
    for &o in marks.ooms.iter().take(200) {
        let ox = ex(o);
        let _ = write!(
            markers,
            "<g><title>out of memory at event {o}</title><path d=\"M{:.1},{:.1} l5,-9 l-10,0 z\" \
             fill=\"#d00\"/></g>",
            ox,
            10.0 + plot_h
        );
    }
    let _ = writeln!(
        out,
        "<svg class=\"tl\" viewBox=\"0 0 {WIDTH} {h}\" width=\"{WIDTH}\" height=\"{h}\">{axes}\
         <polyline fill=\"none\" stroke=\"#c44\" stroke-width=\"1.5\" points=\"{}\"/>\
         <polyline fill=\"none\" stroke=\"#36c\" stroke-width=\"1.5\" points=\"{}\"/>{markers}</svg>",
        line(&|p| p.1),
        line(&|p| p.0),
    );
    let ooms = if marks.ooms.is_empty() {
        String::new()
    } else {
        format!(
            " <span style=\"color:#d00\">&#9650; out of memory ({})</span>",
            marks.ooms.len()
        )
    };
    let _ = writeln!(
        out,
        "<p class=\"legend\"><span style=\"color:#c44\">&#9632; reserved</span> \
         <span style=\"color:#36c\">&#9632; allocated</span> \
         <span style=\"color:#080\">&#9474; peak allocated</span>{ooms} (x: trace events, \
         oldest left, each column the maximum of its events; y: bytes)</p>"
    );
}

fn flame(out: &mut String, root: &Node) {
    let row_h = 18.0;
    let total = root.bytes.max(1) as f64;
    let mut rects = String::new();
    let mut max_depth = 0usize;
    fn walk(
        n: &Node,
        x0: f64,
        depth: usize,
        total: f64,
        row_h: f64,
        rects: &mut String,
        max_depth: &mut usize,
    ) {
        let mut x = x0;
        for c in &n.children {
            let w = c.bytes as f64 * WIDTH / total;
            if w < WIDTH * 0.005 {
                continue;
            }
            *max_depth = (*max_depth).max(depth + 1);
            let y = depth as f64 * row_h;
            // A label that fits is drawn whole; one cut short ends in an ellipsis; one with
            // room for under six characters is left to the hover text.
            let fits = (w / 7.0) as usize;
            let len = c.frame.chars().count();
            let label: String = if len <= fits {
                c.frame.clone()
            } else if fits >= 6 {
                let mut l: String = c.frame.chars().take(fits - 1).collect();
                l.push('…');
                l
            } else {
                String::new()
            };
            let lines = match c.lines.as_slice() {
                [] => String::new(),
                [one] => format!(" (line {one})"),
                many => format!(
                    " (lines {})",
                    many.iter()
                        .map(|l| l.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let hue = (c
                .frame
                .bytes()
                .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
                % 40)
                + 10;
            let _ = write!(
                rects,
                "<g><title>{}{} — {}</title><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" \
                 height=\"{}\" fill=\"hsl({hue},80%,60%)\" stroke=\"#fff\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\">{}</text></g>",
                esc(&c.frame),
                esc(&lines),
                esc(&mib(c.bytes)),
                row_h - 1.0,
                x + 3.0,
                y + 13.0,
                esc(&label)
            );
            walk(c, x, depth + 1, total, row_h, rects, max_depth);
            x += w;
        }
    }
    walk(root, 0.0, 0, total, row_h, &mut rects, &mut max_depth);
    let h = (max_depth.max(1) as f64) * row_h;
    let _ = writeln!(
        out,
        "<svg class=\"flame\" viewBox=\"0 0 {WIDTH} {h}\" width=\"{WIDTH}\" height=\"{h}\">{rects}</svg>"
    );
}

fn segments(out: &mut String, segs: &[SegFill]) {
    let mut segs: Vec<_> = segs.iter().collect();
    segs.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
    out.push_str("<table><tr><th>segment</th><th>size</th><th>fill</th><th></th></tr>\n");
    for s in segs.iter().take(64) {
        let pct = if s.size == 0 {
            0.0
        } else {
            (s.used as f64 * 100.0 / s.size as f64).min(100.0)
        };
        let _ = writeln!(
            out,
            "<tr><td>{:#x}{}</td><td>{}</td><td>{pct:.0}%</td><td><div class=\"bar\">\
             <div style=\"width:{pct:.1}%\"></div></div></td></tr>",
            s.address,
            if s.expandable { " (expandable)" } else { "" },
            mib(s.size)
        );
    }
    if segs.len() > 64 {
        let _ = writeln!(
            out,
            "<tr><td colspan=\"4\">… {} more</td></tr>",
            segs.len() - 64
        );
    }
    out.push_str("</table>\n");
}

/// The by-range section of one device: nothing when no entry carries a range.
fn range_section(out: &mut String, dev: &DeviceRanges) {
    if dev.paths.keys().all(|p| p == by_range::NO_RANGE) {
        return;
    }
    out.push_str("<h3 id=\"ranges\">by NVTX range</h3>\n");
    if let Some(p) = by_range::most_at_peak(dev) {
        let _ = writeln!(
            out,
            "<p>held the most at the peak ({} live): <b>{}</b></p>",
            mib(dev.peak),
            esc(p)
        );
    }
    out.push_str(
        "<table><tr><th>at peak</th><th>peak</th><th>live at end</th><th>allocated</th>\
         <th>allocs</th><th>outlived</th><th>range</th></tr>\n",
    );
    let mut rows: Vec<_> = dev.paths.iter().collect();
    rows.sort_by(|a, b| b.1.at_peak.cmp(&a.1.at_peak).then(a.0.cmp(b.0)));
    for (p, r) in rows.iter().take(RANGE_ROWS) {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            mib(r.at_peak),
            mib(r.peak),
            mib(r.live_at_end),
            mib(r.allocated),
            r.allocs,
            if dev.has_instances && p.as_str() != by_range::NO_RANGE {
                mib(r.outlived_bytes)
            } else {
                "-".into()
            },
            esc(p)
        );
    }
    out.push_str("</table>\n");
    if rows.len() > RANGE_ROWS {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} more range paths not shown (cushim summary --by range lists all)</p>",
            rows.len() - RANGE_ROWS
        );
    }
    if !dev.has_instances {
        out.push_str(
            "<p class=\"note\">outlived: not known (the input has no range starts and ends with paths)</p>\n",
        );
    }
    let outl = by_range::outliving(dev);
    if !outl.is_empty() {
        out.push_str("<p>outlived the range that made them:</p>\n<ul>\n");
        for (p, r) in outl.iter().take(RANGE_ROWS) {
            let _ = writeln!(out, "<li>{}</li>", esc(&by_range::outlived_line(p, r)));
        }
        out.push_str("</ul>\n");
    }
}

/// What a whole-run log's segment events say of the recorded run (its replay row has no
/// segments list to say it from).
struct Recorded {
    peak_reserved: u64,
    device_allocs: u64,
    segment_frees: u64,
}

fn replay_table(out: &mut String, r: &Replay, ordinal: i64, recorded: Option<&Recorded>) {
    let Some(d) = r.devices.iter().find(|d| d.ordinal == ordinal) else {
        return;
    };
    out.push_str(
        "<table><tr><th>settings</th><th>peak reserved</th><th>peak allocated</th>\
         <th>fragmentation</th><th>device allocs</th><th>segment frees</th><th>OOMs</th></tr>\n",
    );
    for row in &d.rows {
        let mut row = row.clone();
        if let Some(rec) = recorded.filter(|_| row.label == "recorded") {
            row.peak_reserved = row.peak_reserved.or(Some(rec.peak_reserved));
            row.device_allocs = row.device_allocs.or(Some(rec.device_allocs));
            row.segment_frees = row.segment_frees.or(Some(rec.segment_frees));
        }
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&row.label),
            row.peak_reserved.map_or("-".into(), mib),
            mib(row.peak_allocated),
            row.fragmentation()
                .map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
            row.device_allocs.map_or("-".into(), |n| n.to_string()),
            row.segment_frees.map_or("-".into(), |n| n.to_string()),
            row.ooms
        );
    }
    out.push_str("</table>\n");
    for n in &d.notes {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(n));
    }
}

/// A colour per category (table order), for the chart and its legend.
const CATEGORY_COLOURS: [&str; 14] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac", "#86bcb6", "#d37295", "#cccccc", "#555555",
];

/// What kind of memory: the categories at the peak, over the trace (stacked, one bar per
/// run of events), and the loop's steps.
fn categories_section(out: &mut String, snap: &Snapshot, dev: &Device) {
    use crate::analyze::category::{classifier, peak_and_over_time};
    if dev.events.len() > crate::analyze::steps::SUMMARY_MAX_EVENTS {
        let _ = writeln!(
            out,
            "<p class=\"note\">categories and steps: not computed for a trace of {} events \
             (`cushim summary --by category` computes them)</p>",
            dev.events.len()
        );
        return;
    }
    // One classifier (two walks) for the categories, their columns and the steps.
    let mut c = classifier(snap, dev, &[]);
    let (at, cols) = peak_and_over_time(&mut c, dev, &[], 200);
    out.push_str(
        "<h3>what kind of memory, at the peak (docs/ANALYSES-CATEGORIES.md)</h3>\n\
         <table><tr><th></th><th>bytes</th><th>share</th><th>category</th></tr>\n",
    );
    for (k, (name, bytes)) in at.rows.iter().enumerate() {
        if *bytes == 0 {
            continue;
        }
        let _ = writeln!(
            out,
            "<tr><td><span style=\"display:inline-block;width:10px;height:10px;\
             background:{}\"></span></td><td>{}</td><td>{:.1}%</td><td>{}</td></tr>",
            CATEGORY_COLOURS[k % CATEGORY_COLOURS.len()],
            mib(*bytes),
            *bytes as f64 * 100.0 / at.allocated.max(1) as f64,
            esc(name)
        );
    }
    out.push_str("</table>\n");
    if let Some(n) = &at.note {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(n));
    }
    let top = cols
        .iter()
        .map(|c| c.iter().sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    if cols.len() > 1 {
        let (h, bw) = (160.0, WIDTH / cols.len() as f64);
        let _ = write!(
            out,
            "<svg width=\"{WIDTH}\" height=\"{h}\" viewBox=\"0 0 {WIDTH} {h}\">"
        );
        for (x, col) in cols.iter().enumerate() {
            let mut y = h;
            for (k, b) in col.iter().enumerate() {
                if *b == 0 {
                    continue;
                }
                let bh = *b as f64 * (h - 10.0) / top;
                y -= bh;
                let _ = write!(
                    out,
                    "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" \
                     fill=\"{}\"/>",
                    x as f64 * bw,
                    bw.max(1.0),
                    CATEGORY_COLOURS[k % CATEGORY_COLOURS.len()]
                );
            }
        }
        let _ = writeln!(
            out,
            "</svg>\n<p class=\"note\">categories over the trace (oldest left, highest {}), \
             each bar the moment after its run of events</p>",
            mib(top as u64)
        );
    }
    let st = crate::analyze::steps::steps_by(
        &mut c,
        snap,
        dev,
        &[],
        1,
        crate::analyze::steps::Detail {
            rows: STEP_ROWS,
            sites: false,
        },
    );
    if !st.steps.is_empty() {
        out.push_str("<h3>steps</h3>\n<pre>");
        out.push_str(&esc(&crate::analyze::steps::render(&st)));
        out.push_str("</pre>\n");
    }
}

const STYLE: &str = "body{font:13px sans-serif;margin:20px;color:#222}\
    h1{font-size:18px}h2{font-size:16px;border-bottom:1px solid #ccc}\
    table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 8px;text-align:left;\
    border-bottom:1px solid #eee}svg{display:block;background:#fafafa;margin:6px 0}\
    svg text{font:11px sans-serif;fill:#222}.bar{width:200px;height:10px;background:#eee}\
    .bar div{height:10px;background:#36c}.note{color:#666}.legend{margin:0}";

/// The HTML page for `snap` (its title names `source`); `ranges` is its bytes by range path
/// (`by_range`, empty when the input has no trace entries with ranges).
pub fn report(
    snap: &Snapshot,
    source: &str,
    ranges: &[DeviceRanges],
    walks: Option<&[Walked]>,
) -> Result<String, String> {
    // Each trace is walked once for the replay, the page and its summary (a log's trace is
    // decoded from the file on every walk; its reader may have walked it already:
    // `input::read_walked`), and once more up to its peak.
    let walked: &[Walked] = &walks_of(snap, walks);
    // The state at the peak, and for a whole-run log the segments then, in one walk up to
    // the peak.
    let at_peaks: Vec<(State, Option<Vec<SegFill>>)> = snap
        .devices
        .iter()
        .zip(walked)
        .map(|(d, w)| {
            if snap.has_state || !snap.reserved_known(d) || d.is_empty() {
                return (w.at_peak(d), None);
            }
            let mut s = w.start.state.clone();
            let mut segs = SegmentsForward::default();
            d.events.for_each_slice_upto(w.peaks.allocated_at, |evs| {
                for e in evs {
                    apply(&mut s, e);
                    segs.step(e);
                }
            });
            let fill = segs.finish(&s);
            (s, Some(fill))
        })
        .collect();
    let replayed: Vec<&Walked> = snap
        .devices
        .iter()
        .zip(walked)
        .filter(|(d, _)| !d.events.is_empty())
        .map(|(_, w)| w)
        .collect();
    let r = replay::replay_walked(
        snap,
        &replay::default_confs(),
        &replay::Options::default(),
        &replayed,
    )?;
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>cushim report: {}</title>\
         <style>{STYLE}</style></head><body>\n<h1>cushim report: {}</h1>\n",
        esc(source),
        esc(source)
    );
    let devs: Vec<(&Device, &Walked, &State, Option<&Vec<SegFill>>)> = snap
        .devices
        .iter()
        .zip(walked)
        .zip(&at_peaks)
        .filter(|((d, _), _)| !d.is_empty())
        .map(|((d, w), (a, f))| (d, w, a, f.as_ref()))
        .collect();
    if devs.is_empty() {
        out.push_str("<p>No device memory in this input.</p>\n");
    }
    for &(dev, walked, at_peak, fill_at_peak) in &devs {
        let p = walked.peaks;
        let _ = writeln!(
            out,
            "<h2 id=\"device-{0}\">device {0}</h2>\n<p>peak allocated {1} (PyTorch's \
             allocated_bytes.all.peak over the trace: after event {2} of {3}), peak reserved {4}</p>",
            dev.ordinal,
            mib(p.allocated),
            p.allocated_at,
            dev.events.len(),
            if snap.reserved_known(dev) { mib(p.reserved) } else { "not recorded".into() }
        );
        out.push_str("<h3>timeline</h3>\n");
        let marks = Marks {
            events: dev.events.len(),
            per: walked.per,
            peak_at: p.allocated_at,
            peak: p.allocated,
            ooms: walked.ooms.clone(),
        };
        svg_timeline(&mut out, &walked.timeline, &marks);
        // What the reader came for first: an out-of-memory, then what kind of memory it is.
        if !walked.ooms.is_empty() {
            let ooms = crate::analyze::oom::ooms(snap, dev)?;
            out.push_str("<h3>out of memory (docs/ANALYSES.md)</h3>\n<pre>");
            out.push_str(&esc(&crate::analyze::oom::render(&ooms, source)));
            out.push_str("</pre>\n");
        }
        categories_section(&mut out, snap, dev);
        out.push_str("<h3>top allocation sites at the peak</h3>\n<table><tr><th>live bytes</th><th>blocks</th><th>site</th></tr>\n");
        for row in by_site(&snap.stacks, at_peak.allocated.values(), 1)
            .iter()
            .take(20)
        {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                mib(row.bytes),
                row.count,
                esc(&row.site)
            );
        }
        out.push_str("</table>\n");
        if let Some(r) = ranges
            .iter()
            .find(|r| i64::try_from(r.device) == Ok(dev.ordinal))
        {
            range_section(&mut out, r);
        }
        out.push_str("<h3>live bytes at the peak (outermost caller on top)</h3>\n");
        flame(
            &mut out,
            &tree_by_function(&snap.stacks, at_peak.allocated.values(), FLAME_DEPTH),
        );
        if snap.has_state {
            out.push_str(
                "<h3>segments at the peak (fill = blocks allocated or pending a free)</h3>\n",
            );
            segments(&mut out, &segments_at(dev, at_peak, p.allocated_at));
        } else if let Some(f) = fill_at_peak {
            // A whole-run log: its segment events, applied from the run's start.
            out.push_str(
                "<h3>segments at the peak (fill = blocks allocated or pending a free)</h3>\n",
            );
            segments(&mut out, f);
        }
        out.push_str("<h3>replay under other settings</h3>\n");
        // The recorded row of a log has no segments list; its segment events give the
        // peak reserved the summary shows.
        let recorded = snap.reserved_known(dev).then_some(Recorded {
            peak_reserved: p.reserved,
            device_allocs: walked.segment_allocs,
            segment_frees: walked.segment_frees,
        });
        replay_table(&mut out, &r, dev.ordinal, recorded.as_ref());
    }
    for n in &r.notes {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(n));
    }
    // Every section `cushim summary` has (pinned host memory, segment kinds, driver memory
    // used = explained + unexplained), as it prints them.
    let _ = writeln!(
        out,
        "<h2>summary</h2>\n<pre>{}</pre>",
        esc(&crate::analyze::summary::render_walked(
            snap,
            &crate::analyze::summary::Options::default(),
            &devs
                .iter()
                .map(|&(d, w, a, _)| (d.ordinal, w, a))
                .collect::<Vec<_>>()
        ))
    );
    out.push_str("</body></html>\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_steps_are_round_numbers() {
        // 476 MiB over four ticks: 119 -> 200 MiB steps (0, 200, 400, 600), not 0/119/238.
        assert_eq!(nice_step(119.0), 200.0);
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(2.2), 2.5);
        assert_eq!(nice_step(1000.0), 1000.0);
        assert_eq!(nice_step(4835.5), 5000.0);
        assert_eq!(tick_label(2.5, 2.5, "GiB"), "2.5 GiB");
        assert_eq!(tick_label(400.0, 200.0, "MiB"), "400 MiB");
    }

    #[test]
    fn the_last_event_label_ends_at_the_plot_edge_instead_of_being_clipped() {
        // 1000 events in columns of 2 (BUCKETS): 501 points, the first the start.
        let pts = vec![(1u64 << 20, 2u64 << 20); 501];
        let marks = Marks {
            events: 1000,
            per: 2,
            peak_at: 10,
            peak: 1 << 20,
            ooms: Vec::new(),
        };
        let mut out = String::new();
        svg_timeline(&mut out, &pts, &marks);
        assert!(out.contains("text-anchor=\"end\">1000</text>"), "{out}");
        assert!(out.contains(">0.0 MiB</text>"), "{out}");
        assert!(out.contains(">2.0 MiB</text>"), "{out}");
        assert!(out.contains("text-anchor=\"middle\">500</text>"), "{out}");
    }
}
