//! `stripe`: GB/s against drive count, measured beside the timing model's
//! limit, the execution path (CPU or GPU) named in the series.

use super::lines::{self, Line, LineChart};
use super::{render, PlotError};
use crate::schema::{StripeDaemonResult, StripeResult};

/// The path's name as the legend shows it.
pub fn path_name(execution: &str) -> &'static str {
    match execution {
        "gpu" => "GPU path (GPU threads submit, data in GPU memory)",
        _ => "CPU path (CPU thread submits, data in host memory)",
    }
}

/// The lines of one or more `stripe` results (e.g. a CPU and a GPU run):
/// each one's measurement, and the modelled limit once per distinct
/// per-drive bandwidth.
pub fn lines_of(results: &[&StripeResult]) -> Vec<Line> {
    let mut models: Vec<u64> = results.iter().map(|r| r.drive_mb_s).collect();
    models.sort_unstable();
    models.dedup();
    // Several models on one chart: each measured line names its own.
    let model_of = |r: &StripeResult| match models.len() {
        1 => String::new(),
        _ => format!(", {} MB/s drives", r.drive_mb_s),
    };
    let mut out: Vec<Line> = results
        .iter()
        .map(|r| Line {
            name: format!("measured, {}{}", path_name(&r.execution), model_of(r)),
            points: r.points.iter().map(|p| (p.drives as f64, p.gb_s)).collect(),
            dashed: false,
        })
        .collect();
    for &mb_s in &models {
        let Some(r) = results.iter().find(|r| r.drive_mb_s == mb_s) else { continue };
        out.push(Line {
            name: format!("modelled limit: drives x {mb_s} MB/s"),
            points: r.points.iter().map(|p| (p.drives as f64, p.modelled_gb_s)).collect(),
            dashed: true,
        });
    }
    out
}

/// The chart of one or more `stripe` results, as SVG.
pub fn svg_many(results: &[&StripeResult]) -> Result<String, PlotError> {
    let first = results.first().ok_or(PlotError::Empty("no stripe result"))?;
    let title = format!(
        "Striped {} bandwidth, {} KiB requests, batch {}",
        if first.write { "write" } else { "read" },
        first.request_kib,
        first.batch
    );
    let lines = lines_of(results);
    let chart = LineChart {
        title: &title,
        x_desc: "drives",
        y_desc: "bandwidth, GB/s (10^9 bytes/s)",
        lines: &lines,
        integer_x: true,
        log_x: false,
    };
    render(|area| lines::draw(area, &chart))
}

/// The chart of one `stripe` result, as SVG.
pub fn svg(r: &StripeResult) -> Result<String, PlotError> {
    svg_many(&[r])
}

/// The chart of a `stripe --daemon` result: the runtime owning the drives
/// and the runtime as a tuttid client, beside the modelled limit, as SVG.
pub fn svg_daemon(r: &StripeDaemonResult) -> Result<String, PlotError> {
    let line = |name: String, f: fn(&crate::schema::StripeDaemonPoint) -> f64, dashed| Line {
        name,
        points: r.points.iter().map(|p| (p.drives as f64, f(p))).collect(),
        dashed,
    };
    let mediated = if r.mediated { ", mediated submission" } else { "" };
    let lines = [
        line("runtime owning the drives (median)".into(), |p| p.owner_gb_s, false),
        line(format!("runtime as a tuttid client{mediated} (median)"), |p| p.client_gb_s, false),
        line(format!("modelled limit: drives x {} MB/s", r.drive_mb_s), |p| p.modelled_gb_s, true),
    ];
    let title = format!(
        "Striped {}, owner vs tuttid client, {} KiB requests, {} run(s) each",
        if r.write { "writes" } else { "reads" },
        r.request_kib,
        r.repeat
    );
    let chart = LineChart {
        title: &title,
        x_desc: "drives",
        y_desc: "bandwidth, GB/s (10^9 bytes/s)",
        lines: &lines,
        integer_x: true,
        log_x: false,
    };
    render(|area| lines::draw(area, &chart))
}
