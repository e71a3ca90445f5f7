//! `replay`: the block-load latency distribution (CDF), beside the save and
//! load bandwidth.

use super::bars::{self, Bar, BarChart};
use super::lines::{self, Line, LineChart};
use super::{render, Area, PlotError};
use crate::report::Summary;

/// Left: the CDF of load latency; right: save and load GB/s.
pub fn svg(s: &Summary) -> Result<String, PlotError> {
    render(|root| {
        let (left, right) = root.split_horizontally(root.dim_in_pixel().0 * 3 / 5);
        cdf(&left, s)?;
        bandwidth(&right, s)
    })
}

fn cdf(area: &Area<'_>, s: &Summary) -> Result<(), PlotError> {
    if s.load_latency_cdf.is_empty() {
        return Err(PlotError::Empty("replay: no load latency (nothing was loaded)"));
    }
    let line = Line {
        name: format!("block loads, {} execution", if s.execution.is_empty() { "cpu" } else { &s.execution }),
        points: s.load_latency_cdf.iter().map(|p| (p.us as f64, p.quantile)).collect(),
        dashed: false,
    };
    let title = format!("Load latency CDF, {} requests, {}", s.requests, s.model);
    let chart = LineChart {
        title: &title,
        x_desc: "load latency, microseconds",
        y_desc: "share of loads at or below",
        lines: std::slice::from_ref(&line),
        integer_x: false,
    };
    lines::draw(area, &chart)
}

fn bandwidth(area: &Area<'_>, s: &Summary) -> Result<(), PlotError> {
    let series = ["save (put)".to_string(), "load (get)".to_string()];
    let bars = [
        Bar { label: "save".into(), series: 0, value: s.save_gb_s },
        Bar { label: "load".into(), series: 1, value: s.load_gb_s },
    ];
    let title = format!("Hit ratio {:.1} %", s.hit_ratio * 100.0);
    let chart = BarChart {
        title: &title,
        x_desc: "operation",
        y_desc: "bandwidth, GB/s (10^9 bytes/s)",
        series: &series,
        bars: &bars,
    };
    bars::draw(area, &chart)
}
