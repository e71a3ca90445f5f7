//! What the benchmarks write besides their text: `--plot` files, and the
//! `report` command's HTML page (issue 28).

use std::path::{Path, PathBuf};

use clap::Args;
use tutti_bench::page;
use tutti_bench::plot::{self, PlotError};
use tutti_bench::schema::AnyDocument;

use crate::interrupt::Ended;

/// Writes a chart drawn by `svg` to `path` and says so on stderr.
pub fn plot(path: &Path, svg: Result<String, PlotError>) -> Result<(), String> {
    let text = svg.map_err(|e| format!("--plot {}: {e}", path.display()))?;
    plot::write(path, &text).map_err(|e| tutti::error_chain(&e))?;
    eprintln!("tutti-bench: chart written to {}", path.display());
    Ok(())
}

/// Options of `plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// A document written by `--json` (`replay`, `stripe`, `rate`, `kv`).
    pub json: PathBuf,
    /// The SVG file to write.
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
}

/// `plot JSON -o FILE`: the chart of a recorded document.
pub fn plot_file(a: &PlotArgs) -> Result<Ended, String> {
    let text = std::fs::read_to_string(&a.json).map_err(|e| format!("reading {}: {e}", a.json.display()))?;
    let doc =
        AnyDocument::parse(&text).map_err(|e| format!("{}: {}", a.json.display(), tutti::error_chain(&e)))?;
    plot(&a.output, plot::svg_of(&doc))?;
    Ok(Ended::Complete)
}

/// Options of `report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Directory of `--json` documents (every `*.json` directly in it).
    pub dir: PathBuf,
    /// The page to write (default: DIR/report.html).
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The page's title.
    #[arg(long, default_value = "tutti-bench report")]
    pub title: String,
}

/// `report DIR`: one HTML page of the documents in DIR.
pub fn report(a: &ReportArgs) -> Result<Ended, String> {
    let entries = page::gather(&a.dir).map_err(|e| format!("reading {}: {e}", a.dir.display()))?;
    if entries.is_empty() {
        return Err(format!("no *.json file in {}", a.dir.display()));
    }
    let out = a.output.clone().unwrap_or_else(|| a.dir.join("report.html"));
    std::fs::write(&out, page::html(&a.title, &entries))
        .map_err(|e| format!("writing {}: {e}", out.display()))?;
    let shown = entries.iter().filter(|e| e.doc.is_ok()).count();
    for e in entries.iter().filter(|e| e.doc.is_err()) {
        if let Err(err) = &e.doc {
            eprintln!("tutti-bench: {}: skipped: {err}", e.path.display());
        }
    }
    println!("{}: {shown} of {} document(s)", out.display(), entries.len());
    Ok(Ended::Complete)
}
