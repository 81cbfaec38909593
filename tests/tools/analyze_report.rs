//! `cushim report`: one self-contained HTML page, checked in a real browser (Debian's
//! headless Chromium): it renders without console errors, its screenshot has the window's
//! size and carries far more drawing than an empty page. Skips visibly (`common::skip`)
//! where no Chromium is installed, a failure under `CUSHIM_REQUIRE_ALL=1`.
use crate::common;
use crate::common::analyze_support as support;

use cushim::snapshot::Format;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// Screenshot `page` at 1100x1400; returns (PNG bytes, browser stderr).
fn screenshot(browser: &Path, dir: &Path, page: &Path, name: &str) -> (Vec<u8>, String) {
    let shot = dir.join(format!("{name}.png"));
    let out = common::run(
        Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1100,1400",
                "--enable-logging=stderr",
                "--v=0",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.join(format!("profile-{name}")).display()
            ))
            .arg(format!("--screenshot={}", shot.display()))
            .arg(format!("file://{}", page.display())),
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "chromium failed: {err}");
    (std::fs::read(&shot).expect("the screenshot"), err)
}

fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[1..4], b"PNG");
    let be = |i: usize| u32::from_be_bytes([png[i], png[i + 1], png[i + 2], png[i + 3]]);
    (be(16), be(20))
}

/// Console messages the page logged (Chromium writes them as `CONSOLE` lines).
fn console_lines(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.contains("CONSOLE")).collect()
}

#[test]
fn report_renders_in_headless_chromium_without_console_errors() {
    let dir = common::scratch("analyze-report");
    let snap = dir.join("seed.pickle");
    std::fs::write(&snap, seed_scenario("", Format::Pickle)).unwrap();
    let page = dir.join("report.html");
    common::run_ok(
        Command::new(common::cushim_bin())
            .arg("report")
            .arg(&snap)
            .arg("-o")
            .arg(&page),
    );
    let html = std::fs::read_to_string(&page).unwrap();
    for part in [
        "<svg class=\"tl\"",
        "<svg class=\"flame\"",
        "replay under other settings",
        "128.0 MiB",
        // Axes with units, the peak marked, and the summary's sections.
        "trace events (oldest left)",
        "<title>peak allocated 128.0 MiB after event",
        "<h2>summary</h2>",
        "fragmentation:",
    ] {
        assert!(html.contains(part), "report lacks {part:?}");
    }
    // The memory axis is labelled in round steps with their unit (`... MiB</text>` right-
    // aligned beside the axis).
    assert!(
        html.split("text-anchor=\"end\">")
            .skip(1)
            .filter(|t| t
                .split("</text>")
                .next()
                .is_some_and(|l| l.ends_with(" MiB")))
            .count()
            >= 2,
        "report has no MiB ticks on its memory axis"
    );
    for remote in ["http://", "https://", "src=", "<link"] {
        assert!(
            !html.contains(remote),
            "report refers to {remote:?}: not self-contained"
        );
    }
    let Some(browser) = chromium() else {
        common::skip::skip(
            "the report's browser check",
            "no chromium installed (apt-get install chromium)",
        );
        return;
    };
    // The detector sees a console error when there is one; the page draws nothing, so its
    // screenshot is also the size of a blank one.
    let broken = dir.join("broken.html");
    std::fs::write(
        &broken,
        "<html><body><script>no_such_function()</script></body></html>",
    )
    .unwrap();
    let (blank, err) = screenshot(&browser, &dir, &broken, "broken");
    assert!(
        !console_lines(&err).is_empty(),
        "console errors are detected: {err}"
    );

    let (png, err) = screenshot(&browser, &dir, &page, "report");
    assert!(
        console_lines(&err).is_empty(),
        "console output: {:?}",
        console_lines(&err)
    );
    assert_eq!(png_size(&png), (1100, 1400));
    assert!(
        png.len() > 10 * blank.len(),
        "the report draws content: {} bytes vs {} for an empty page",
        png.len(),
        blank.len()
    );
}

/// A snapshot whose trace carries NVTX range paths: three "train/iteration" ranges each make
/// a 1 MiB buffer they free and a 2 MiB one they keep, then "eval" makes 8 MiB and frees it.
fn ranges_snapshot() -> String {
    let mib = 1i64 << 20;
    let mut trace = Vec::new();
    let mut ann = Vec::new();
    let a = |stage: &str, t: i64, path: &str| {
        serde_json::json!({"stage": stage, "name": path.rsplit('/').next(), "device": 0,
                           "time_us": t, "range": path})
    };
    let ev = |action: &str, addr: i64, size: i64, t: i64, path: Option<&str>| {
        let mut e = serde_json::json!({"action": action, "addr": addr, "size": size,
                                       "stream": 0, "time_us": t, "frames": []});
        if let Some(p) = path {
            e["user_metadata"] = p.into();
        }
        e
    };
    for i in 0..3i64 {
        let t = 100 * (i + 1);
        ann.push(a("START", t, "train/iteration"));
        trace.push(ev(
            "alloc",
            0x1000_0000 + i * 0x100_0000,
            mib,
            t + 1,
            Some("train/iteration"),
        ));
        trace.push(ev(
            "alloc",
            0x2000_0000 + i * 0x100_0000,
            2 * mib,
            t + 2,
            Some("train/iteration"),
        ));
        trace.push(ev(
            "free_requested",
            0x1000_0000 + i * 0x100_0000,
            mib,
            t + 3,
            None,
        ));
        trace.push(ev(
            "free_completed",
            0x1000_0000 + i * 0x100_0000,
            mib,
            t + 3,
            None,
        ));
        ann.push(a("END", t + 4, "train/iteration"));
    }
    ann.push(a("START", 500, "eval"));
    trace.push(ev("alloc", 0x3000_0000, 8 * mib, 501, Some("eval")));
    trace.push(ev("free_requested", 0x3000_0000, 8 * mib, 502, None));
    trace.push(ev("free_completed", 0x3000_0000, 8 * mib, 502, None));
    ann.push(a("END", 503, "eval"));
    serde_json::json!({"segments": [], "device_traces": [trace], "external_annotations": ann})
        .to_string()
}

#[test]
fn report_shows_bytes_by_range_and_what_outlived_its_range() {
    let dir = common::scratch("analyze-report-ranges");
    let snap = dir.join("ranges.json");
    std::fs::write(&snap, ranges_snapshot()).unwrap();
    let page = dir.join("report.html");
    common::run_ok(
        Command::new(common::cushim_bin())
            .arg("report")
            .arg(&snap)
            .arg("-o")
            .arg(&page),
    );
    let html = std::fs::read_to_string(&page).unwrap();
    for part in [
        "<h3 id=\"ranges\">by NVTX range</h3>",
        // The peak: 6 MiB kept + 8 MiB in eval.
        "held the most at the peak (14.0 MiB live): <b>eval</b>",
        // train/iteration: 6 MiB at the peak, at most 7 MiB live (the third iteration's
        // buffers over two kept ones), 6 MiB live at the end, 9 MiB allocated in 6
        // allocations, 6 MiB outlived.
        "<td>6.0 MiB</td><td>7.0 MiB</td><td>6.0 MiB</td><td>9.0 MiB</td><td>6</td><td>6.0 MiB</td><td>train/iteration</td>",
        "<li>3 of 6 allocations (6.0 MiB) made in train/iteration outlived the range (3 still live at the end)</li>",
    ] {
        assert!(html.contains(part), "report lacks {part:?}:\n{html}");
    }
    let Some(browser) = chromium() else {
        common::skip::skip(
            "the report's browser check",
            "no chromium installed (apt-get install chromium)",
        );
        return;
    };
    let (png, err) = screenshot(&browser, &dir, &page, "ranges");
    assert!(
        console_lines(&err).is_empty(),
        "console output: {:?}",
        console_lines(&err)
    );
    assert_eq!(png_size(&png), (1100, 1400));
}
