//! `ttft`: time to first token per prompt length and variant, each bar the
//! prefix's restore (or recompute) with the rest of the prompt's prefill
//! stacked on it.

use plotters::prelude::*;

use super::{color, draw_err, render, Area, PlotError};
use crate::schema::TtftReport;

/// Where one stacked part of a column lies: (bottom, top), milliseconds.
type Span = fn(&Column) -> (f64, f64);

/// One bar: its label and its two stacked parts, milliseconds.
struct Column {
    label: String,
    restore_ms: f64,
    prefill_ms: f64,
}

/// The columns of the variants that finished, by prompt length (shortest
/// first, then variant name).
fn columns(r: &TtftReport) -> Vec<Column> {
    let mut runs: Vec<_> = r.runs.values().collect();
    runs.sort_by_key(|x| x.tokens);
    let mut out = Vec::new();
    for run in runs {
        for (name, v) in &run.variants {
            if let (true, Some(a), Some(b)) = (v.status == "ok", v.restore_median_s, v.rest_prefill_median_s)
            {
                out.push(Column {
                    label: format!("{} {name}", run.tokens),
                    restore_ms: a * 1e3,
                    prefill_ms: b * 1e3,
                });
            }
        }
    }
    out
}

/// The chart of a ttft.py report, as SVG.
pub fn svg(r: &TtftReport) -> Result<String, PlotError> {
    let cols = columns(r);
    if cols.is_empty() {
        return Err(PlotError::Empty("no variant finished"));
    }
    let gpu = r.config.get("gpu").and_then(|g| g.as_str()).unwrap_or("?").to_owned();
    let model = r.config.get("model").and_then(|g| g.as_str()).unwrap_or("?").to_owned();
    render(|area| draw(area, &cols, &format!("Time to first token, {model} on {gpu}")))
}

fn draw(area: &Area<'_>, cols: &[Column], title: &str) -> Result<(), PlotError> {
    let top = cols.iter().map(|c| c.restore_ms + c.prefill_ms).fold(0.0, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5..cols.len() as f64 - 0.5, 0.0..top.max(1.0))
        .map_err(draw_err)?;
    let label = |x: &f64| match (x.round() - x).abs() < 1e-9 && *x >= 0.0 {
        true => cols.get(x.round() as usize).map_or_else(String::new, |c| c.label.clone()),
        false => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("prompt tokens and variant")
        .y_desc("milliseconds (median)")
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 16))
        .x_labels(cols.len())
        .x_label_formatter(&label)
        .draw()
        .map_err(draw_err)?;
    let parts: [(&str, Span); 2] = [
        ("restore of the prefix (recompute: 0)", |c| (0.0, c.restore_ms)),
        ("prefill of the rest", |c| (c.restore_ms, c.restore_ms + c.prefill_ms)),
    ];
    for (s, (name, span)) in parts.into_iter().enumerate() {
        let fill = color(s).filled();
        let rects = cols.iter().enumerate().map(move |(i, c)| {
            let (lo, hi) = span(c);
            Rectangle::new([(i as f64 - 0.4, lo), (i as f64 + 0.4, hi)], fill)
        });
        let legend = move |(x, y): (i32, i32)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], fill);
        chart.draw_series(rects).map_err(draw_err)?.label(name).legend(legend);
    }
    super::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)
}
