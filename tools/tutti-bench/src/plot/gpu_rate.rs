//! `gpu-rate`: commands per second of one I/O kernel launch, by the
//! kernel's own GPU time and by the whole launch, beside the bare ring
//! probe over the same queues and one CPU thread on one queue pair.

use super::bars::{self, Bar, BarChart};
use super::{render, PlotError};
use crate::schema::GpuRateResult;

/// The chart of a `gpu-rate` result, as SVG.
pub fn svg(r: &GpuRateResult) -> Result<String, PlotError> {
    let series = ["I/O kernel (tutti_io)", "bare ring probe", "one CPU thread"].map(str::to_owned);
    let mut bars = vec![
        Bar { label: "protocol, kernel time".into(), series: 0, value: r.gpu_commands_per_second / 1e6 },
        Bar { label: "protocol, whole launch".into(), series: 0, value: r.gpu_launch_commands_per_second / 1e6 },
    ];
    if let Some(p) = r.probe_entries_per_second {
        bars.push(Bar { label: "probe, kernel time".into(), series: 1, value: p / 1e6 });
    }
    if let Some(p) = r.probe_launch_entries_per_second {
        bars.push(Bar { label: "probe, whole launch".into(), series: 1, value: p / 1e6 });
    }
    bars.push(Bar { label: "CPU queue pair".into(), series: 2, value: r.cpu_commands_per_second / 1e6 });
    let title = format!(
        "GPU submission, {} commands over {} queues of {} ({}, rings in {})",
        r.gpu_commands, r.queues, r.queue_depth, r.controller, r.rings
    );
    let chart = BarChart {
        title: &title,
        x_desc: "measurement",
        y_desc: "million commands per second",
        series: &series,
        bars: &bars,
    };
    render(|area| bars::draw(area, &chart))
}
