//! `tutti-bench report DIR` over the recorded fixtures: one page, parsed
//! whole as XML, with every run's facts, an inline SVG chart per run, its
//! tables, and nothing fetched from elsewhere (issue 28).

use std::path::Path;
use std::process::Command;

#[test]
fn report_page_holds_every_run_inline() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = tempfile::tempdir().unwrap();
    let mut names = Vec::new();
    for e in std::fs::read_dir(&fixtures).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
            names.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert!(names.len() >= 6, "{names:?}");
    assert_eq!(names.iter().filter(|n| n.starts_with("stripe-cpu")).count(), 2, "{names:?}");
    // A file that is not a document is listed as skipped, not fatal.
    std::fs::write(dir.path().join("notes.json"), "not json").unwrap();
    let out = dir.path().join("page.html");
    let o = Command::new(env!("CARGO_BIN_EXE_tutti-bench"))
        .args([
            "report",
            dir.path().to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--title",
            "fixtures & runs",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("notes.json: skipped"));
    let html = std::fs::read_to_string(&out).unwrap();
    let doc = roxmltree::Document::parse_with_options(
        &html,
        roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() },
    )
    .unwrap_or_else(|e| panic!("page is not well-formed: {e}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "html");
    let count = |tag: &str| root.descendants().filter(|n| n.tag_name().name() == tag).count();
    assert_eq!(count("title"), 1);
    assert!(html.contains("<title>fixtures &amp; runs</title>"));
    // One chart per document, one more of the two stripe runs together,
    // and none for the file that is not a document.
    let svgs = root.descendants().filter(|n| n.tag_name().name() == "svg").count();
    assert_eq!(svgs, names.len() + 1, "{names:?}");
    assert_eq!(count("section"), names.len() + 2);
    assert!(html.contains("stripe: all runs") && html.contains("modelled limit: drives x 1000 MB/s"));
    assert!(html.contains("CPU thread submits, data in host memory), 1000 MB/s drives"));
    assert!(count("table") >= 2 * names.len());
    // Self-contained: no script, no linked stylesheet, image or frame, no URL.
    for tag in ["script", "link", "img", "iframe", "object"] {
        assert_eq!(count(tag), 0, "<{tag}> in the page");
    }
    for n in root.descendants() {
        for a in n.attributes() {
            assert!(
                !["src", "href"].contains(&a.name()),
                "{}={} on <{}>",
                a.name(),
                a.value(),
                n.tag_name().name()
            );
        }
    }
    let bare = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    assert!(!bare.contains("http") && !bare.contains("url("), "a URL in the page");
    // Each run's facts are on the page.
    for needle in
        ["command line", "git commit", "tutti version", "machine", "started", "load_latency_p99_us", "gb_s"]
    {
        assert!(html.contains(needle), "no {needle:?}");
    }
    assert!(html.contains("notes.json") && html.contains("skipped"));
}
