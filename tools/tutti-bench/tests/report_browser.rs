//! The report page as a browser draws it (issue 28): headless Chromium
//! renders `tutti-bench report` over the recorded fixtures to a PNG, and
//! the picture must not be blank (many colours, a fair share of non-white
//! pixels: text, axes, the charts' lines and bars). Skips, saying so, where
//! no Chromium is installed, unless `TUTTI_CHROMIUM_REQUIRED=1` (CI, where
//! `.ci/run` installs it).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A Chromium binary on PATH.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|n| std::env::split_paths(&path).map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

/// The report page over every fixture, written into `dir`.
fn report_page(dir: &Path) -> PathBuf {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for e in std::fs::read_dir(&fixtures).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    let page = dir.join("page.html");
    let o = Command::new(env!("CARGO_BIN_EXE_tutti-bench"))
        .args(["report", dir.to_str().unwrap(), "-o", page.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    page
}

#[test]
fn the_report_page_renders_in_headless_chromium_and_is_not_blank() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("TUTTI_CHROMIUM_REQUIRED").is_none_or(|v| v != "1"),
            "TUTTI_CHROMIUM_REQUIRED=1 but no chromium on PATH"
        );
        eprintln!("skipped: no chromium on PATH (apt-get install chromium)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let page = report_page(dir.path());
    let shot = dir.path().join("shot.png");
    let o = Command::new(&browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1600"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    assert!(shot.is_file(), "no screenshot: {}", String::from_utf8_lossy(&o.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0u8; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1280, 1600));
    let px = info.color_type.samples();
    assert!(px >= 3, "{:?}", info.color_type);
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks_exact(px).map(|p| &p[..3]).collect();
    let colours: HashSet<&[u8]> = pixels.iter().copied().collect();
    let inked = pixels.iter().filter(|p| p.iter().any(|&c| c < 200)).count();
    assert!(colours.len() > 16, "{} colours: a blank page", colours.len());
    let share = inked as f64 / pixels.len() as f64;
    assert!(share > 0.01 && share < 0.9, "{:.3} of the pixels inked", share);
    // The charts' colours are there, not only black text: a saturated
    // blue or red of the series.
    assert!(
        pixels.iter().any(|p| (p[2] > 150 && p[0] < 80) || (p[0] > 180 && p[1] < 80 && p[2] < 80)),
        "no chart colour in the picture"
    );
}
