//! The HTML reports, opened in headless Chromium: they must render (a screenshot with real
//! content, kept in the test's output directory) and hold the charts and tables they promise.
//!
//! Needs Chromium, so the tests are opt-in: `cargo test --test report -- --ignored` (`.ci/run`
//! installs Chromium and runs them). Set STEPCAST_CHROMIUM to the browser's path if it is not on
//! PATH as chromium, chromium-browser or google-chrome.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{repo, stderr, stepcast, LLAMA2_13B_ON_32};

fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("STEPCAST_CHROMIUM") {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            if dir.join(name).is_file() {
                return dir.join(name);
            }
        }
    }
    panic!(
        "no Chromium to render the HTML report: install it (apt-get install chromium) or set \
         STEPCAST_CHROMIUM to the browser"
    );
}

/// Renders `html` headless into a PNG next to it and checks that the page has content:
/// several colours and a good share of non-white pixels.
fn render(html: &Path) -> PathBuf {
    let png = html.with_extension("png");
    let out = Command::new(chromium())
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,2400",
        ])
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .output()
        .expect("run chromium");
    assert!(
        png.is_file(),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decoder = png::Decoder::new(std::fs::File::open(&png).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let mut colours = std::collections::HashSet::new();
    let mut inked = 0usize;
    for px in pixels.chunks(channels) {
        colours.insert(px[..3].to_vec());
        if px[..3].iter().any(|&c| c < 200) {
            inked += 1;
        }
    }
    let total = pixels.len() / channels;
    assert!(colours.len() > 20, "{} colours only", colours.len());
    assert!(inked * 50 > total, "only {inked} of {total} pixels drawn");
    println!("screenshot: {}", png.display());
    png
}

fn keep_dir() -> PathBuf {
    // under target/ so the screenshots stay after the test for a human to look at
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("html-reports");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
#[ignore = "needs Chromium: cargo test --test report -- --ignored"]
fn prediction_report_renders() {
    let html = keep_dir().join("predict.html");
    let cluster = repo("hardware-profiles/dgx-h100.yaml");
    let o = stepcast(&[
        "predict",
        "--cluster",
        &cluster,
        "--model",
        "llama2-13b",
        "--tp",
        "2",
        "--pp",
        "4",
        "--dp",
        "4",
        "--micro-batch",
        "1",
        "--micro-batches",
        "8",
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.starts_with("<!DOCTYPE html>"));
    assert!(
        !text.contains("<script") && !text.contains("src=\"http"),
        "not self-contained"
    );
    assert_eq!(
        text.matches("<svg").count(),
        3,
        "breakdown, timeline and memory charts"
    );
    for want in [
        "How each pipeline rank spends the step",
        "Timeline",
        "Memory per GPU",
        "F mb 7",
    ] {
        assert!(text.contains(want), "no {want}");
    }
    render(&html);
}

#[test]
#[ignore = "needs Chromium: cargo test --test report -- --ignored"]
fn search_report_renders() {
    let html = keep_dir().join("search.html");
    let cluster = repo("hardware-profiles/dgx-h100.yaml");
    let o = stepcast(
        &[
            &["search", "--cluster", &cluster][..],
            &LLAMA2_13B_ON_32,
            &["--top", "5", "--html", html.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.contains("Best configurations") && text.contains("Pruned"));
    assert!(text.matches("<tr><td>").count() >= 5);
    render(&html);
}
