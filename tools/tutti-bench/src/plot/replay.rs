//! `replay`: the block-load latency distribution (CDF) beside the save and
//! load bandwidth; below, the hit ratio and the save/load bandwidth over
//! the trace (when the document has a timeline).

use super::bars::{self, Bar, BarChart};
use super::lines::{self, Line, LineChart};
use super::{render, render_sized, Area, PlotError, SIZE};
use crate::report::Summary;

/// Top left: the CDF of load latency; top right: save and load GB/s;
/// below them (with a timeline): hit ratio and GB/s over the trace.
pub fn svg(s: &Summary) -> Result<String, PlotError> {
    if s.timeline.is_empty() {
        return render(|root| top(root, s));
    }
    render_sized((SIZE.0 + 200, SIZE.1 * 2), |root| {
        let (upper, lower) = root.split_vertically(SIZE.1);
        top(&upper, s)?;
        let (left, right) = lower.split_horizontally((SIZE.0 + 200) / 2);
        hit_ratio_over_trace(&left, s)?;
        bandwidth_over_trace(&right, s)
    })
}

fn top(area: &Area<'_>, s: &Summary) -> Result<(), PlotError> {
    let (left, right) = area.split_horizontally(area.dim_in_pixel().0 * 3 / 5);
    cdf(&left, s)?;
    bandwidth(&right, s)
}

fn hit_ratio_over_trace(area: &Area<'_>, s: &Summary) -> Result<(), PlotError> {
    let line = Line {
        name: "hit ratio of the requests so far".into(),
        points: s.timeline.iter().map(|p| (p.requests as f64, p.hit_ratio)).collect(),
        dashed: false,
    };
    let chart = LineChart {
        title: "Hit ratio over the trace",
        x_desc: "requests replayed",
        y_desc: "hit ratio",
        lines: std::slice::from_ref(&line),
        integer_x: false,
        log_x: false,
    };
    lines::draw(area, &chart)
}

fn bandwidth_over_trace(area: &Area<'_>, s: &Summary) -> Result<(), PlotError> {
    let of = |f: fn(&crate::report::TimelinePoint) -> f64| {
        s.timeline.iter().map(|p| (p.requests as f64, f(p))).collect()
    };
    let lines = [
        Line { name: "save, GB/s within the step".into(), points: of(|p| p.save_gb_s), dashed: false },
        Line { name: "load, GB/s within the step".into(), points: of(|p| p.load_gb_s), dashed: false },
    ];
    let chart = LineChart {
        title: "Save and load bandwidth over the trace",
        x_desc: "requests replayed",
        y_desc: "GB/s (10^9 bytes/s)",
        lines: &lines,
        integer_x: false,
        log_x: false,
    };
    lines::draw(area, &chart)
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
        x_desc: "load latency, microseconds (log scale)",
        y_desc: "share of loads at or below",
        lines: std::slice::from_ref(&line),
        integer_x: false,
        log_x: true,
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
