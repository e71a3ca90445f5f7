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
        Bar {
            label: "protocol, whole launch".into(),
            series: 0,
            value: r.gpu_launch_commands_per_second / 1e6,
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Input for the renderer only, not a measurement: no `gpu-rate` run
    /// is recorded yet (it needs the GPU machine); a recorded fixture goes
    /// into `tests/fixtures/` with the next run there.
    fn input(probe: Option<f64>) -> GpuRateResult {
        GpuRateResult {
            drives: 2,
            queues: 4,
            queue_depth: 64,
            controller: "emulator".into(),
            rings: "host".into(),
            gpu_commands: 1000,
            gpu_kernel_seconds: 0.5,
            gpu_commands_per_second: 2000.0,
            gpu_launch_seconds: 1.0,
            gpu_launch_commands_per_second: 1000.0,
            probe_entries_per_second: probe,
            probe_launch_entries_per_second: probe.map(|p| p / 2.0),
            probe_skipped: probe.is_none().then(|| "--no-probe".into()),
            cq_full_stalls: 0,
            null_served: None,
            cpu_commands_per_second: 500.0,
            ratio: 4.0,
        }
    }

    fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).expect("SVG is XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc.descendants().filter_map(|n| n.text()).map(str::to_owned).collect()
    }

    #[test]
    fn the_chart_names_its_axes_and_every_series() {
        let t = texts(&svg(&input(Some(3000.0))).unwrap()).join("\n");
        for want in [
            "million commands per second",
            "measurement",
            "I/O kernel (tutti_io)",
            "bare ring probe",
            "one CPU thread",
            "protocol, kernel time",
            "probe, whole launch",
            "1000 commands over 4 queues of 64 (emulator, rings in host)",
        ] {
            assert!(t.contains(want), "{want:?} missing from:\n{t}");
        }
    }

    #[test]
    fn without_the_probe_its_bars_are_left_out() {
        let t = texts(&svg(&input(None)).unwrap()).join("\n");
        assert!(!t.contains("probe, kernel time") && t.contains("CPU queue pair"), "{t}");
    }
}
