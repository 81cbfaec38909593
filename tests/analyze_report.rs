//! `cushim report`: one self-contained HTML page, checked in a real browser (Debian's
//! headless Chromium): it renders without console errors, its screenshot has the window's
//! size and carries far more drawing than an empty page. Skips visibly (`common::skip`)
//! where no Chromium is installed, a failure under `CUSHIM_REQUIRE_ALL=1`.
mod common;
#[path = "analyze_support.rs"]
mod support;

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
        "text-anchor=\"end\">128 MiB</text>",
        "<title>peak allocated 128.0 MiB after event",
        "<h2>summary</h2>",
        "fragmentation:",
    ] {
        assert!(html.contains(part), "report lacks {part:?}");
    }
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
