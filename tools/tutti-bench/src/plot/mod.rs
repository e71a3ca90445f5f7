//! Charts of `--json` documents, as SVG (issue 28).
//!
//! Drawn with `plotters` through its SVG backend only: text is written as
//! SVG `<text>` for the browser to lay out, so no font files, no bitmap
//! code and no system libraries are needed to build or run this. One file
//! per chart: [`stripe`], [`kv`], [`rate`], [`replay`]; [`lines`] and
//! [`bars`] are the two chart shapes they share.

pub mod bars;
pub mod gpu_rate;
pub mod kv;
pub mod lines;
pub mod rate;
pub mod replay;
pub mod stripe;
pub mod ttft;

use std::path::Path;

use plotters::prelude::*;

use crate::schema::AnyDocument;

/// Width and height of every chart, pixels.
pub const SIZE: (u32, u32) = (800, 480);

/// The series colours, in order.
pub const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// The colour of series `i`.
pub fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// Why a chart could not be drawn or written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// plotters refused (its error types are generic; kept as text).
    #[error("drawing the chart: {0}")]
    Draw(String),
    /// The document holds nothing to draw.
    #[error("nothing to plot: {0}")]
    Empty(&'static str),
    /// Writing the file.
    #[error("writing {path}")]
    Write {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// plotters' errors as [`PlotError::Draw`].
pub fn draw_err(e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Draws `chart`'s legend box at `at` (the series' names and swatches,
/// on a white box with a black border), the same on every chart.
pub fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> Result<(), PlotError>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(draw_err)
}

/// The drawing area `svg` is rendered into.
pub type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Runs `draw` on a white `SIZE` canvas and returns the SVG text.
pub fn render(draw: impl FnOnce(&Area<'_>) -> Result<(), PlotError>) -> Result<String, PlotError> {
    render_sized(SIZE, draw)
}

/// The same on a canvas of `size` pixels (charts of several panels).
pub fn render_sized(
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> Result<(), PlotError>,
) -> Result<String, PlotError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        draw(&root)?;
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// The chart of any typed document.
pub fn svg_of(doc: &AnyDocument) -> Result<String, PlotError> {
    match doc {
        AnyDocument::Replay(d) => replay::svg(&d.result),
        AnyDocument::Stripe(d) => stripe::svg(&d.result),
        AnyDocument::StripeDaemon(d) => stripe::svg_daemon(&d.result),
        AnyDocument::Rate(d) => rate::svg_runs(std::slice::from_ref(&d.result), &[]),
        AnyDocument::RateCompare(d) => rate::svg_compare(&d.result),
        AnyDocument::Kv(d) => kv::svg(&d.result),
        AnyDocument::GpuRate(d) => gpu_rate::svg(&d.result),
        AnyDocument::Ttft(d) => ttft::svg(d),
    }
}

/// Writes `svg` to `path`.
pub fn write(path: &Path, svg: &str) -> Result<(), PlotError> {
    std::fs::write(path, svg).map_err(|source| PlotError::Write { path: path.display().to_string(), source })
}
