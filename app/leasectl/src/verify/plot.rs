//! `leasectl verify --plot FILE.svg`: the distribution of both latencies over a run's iterations, one panel per
//! order the run covered (`--order both` gives two). Each panel draws the empirical CDF (fraction of iterations
//! at or below a latency) of (a) control-plane recall (REVOKE sent → outcome) and (b) dataplane first-fail
//! (outcome → first failed completion; negative when the dataplane refused a request before the answer came
//! back), with one marker per iteration. The axes are per panel: qp-first's dataplane figure is about the
//! requester's retry time, mkey-first's about one round trip, so one shared axis would hide one of them.

use std::path::Path;

use plotters::prelude::*;

use super::{Mode, Report};

/// Series labels (the legend), also what the tests look for in the SVG.
pub const RECALL_LABEL: &str = "control-plane recall (REVOKE sent to outcome)";
pub const DATAPLANE_LABEL: &str = "dataplane first-fail (outcome to first failed completion)";

const PANEL_W: u32 = 720;
const PANEL_H: u32 = 480;

/// The step points of the empirical CDF of `ms`: (x, fraction of values ≤ x).
fn ecdf(ms: &[f64]) -> Vec<(f64, f64)> {
    let mut v = ms.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let mut out = Vec::with_capacity(2 * v.len());
    for (i, x) in v.iter().enumerate() {
        out.push((*x, i as f64 / n));
        out.push((*x, (i + 1) as f64 / n));
    }
    out
}

/// Recall and dataplane figures of a report, in milliseconds.
fn figures(r: &Report) -> (Vec<f64>, Vec<f64>) {
    let recall = r.iterations.iter().filter_map(|i| i.recall_us).map(|us| us as f64 / 1e3).collect();
    let dataplane = r.iterations.iter().filter_map(|i| i.dataplane_us).map(|us| us as f64 / 1e3).collect();
    (recall, dataplane)
}

/// The x range covering every figure, from 0 (or below, for a negative dataplane figure), with some room.
fn x_range(all: &[f64]) -> (f64, f64) {
    let lo = all.iter().copied().fold(0.0f64, f64::min);
    let hi = all.iter().copied().fold(0.0f64, f64::max);
    let span = (hi - lo).max(1e-3);
    (if lo < 0.0 { lo - 0.05 * span } else { 0.0 }, hi + 0.08 * span)
}

fn draw_err<E: std::fmt::Debug>(e: E) -> String {
    format!("drawing the plot: {e:?}")
}

/// Writes the SVG: one panel per report (one per order), side by side.
pub fn svg(reports: &[Report], path: &Path) -> Result<(), String> {
    if reports.is_empty() {
        return Err("nothing to plot".into());
    }
    let width = PANEL_W * reports.len() as u32;
    let root = SVGBackend::new(path, (width, PANEL_H)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let panels = root.split_evenly((1, reports.len()));
    for (area, r) in panels.iter().zip(reports) {
        panel(area, r)?;
    }
    root.present().map_err(|e| format!("writing {}: {e:?}", path.display()))
}

fn panel<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, r: &Report) -> Result<(), String> {
    let o = &r.options;
    let (recall, dataplane) = figures(r);
    let all: Vec<f64> = recall.iter().chain(&dataplane).copied().collect();
    let (x0, x1) = x_range(&all);
    let caption = format!(
        "{} {}: {} iteration(s), QP timeout {} retry_cnt {}",
        o.order.name(),
        o.mode.name(),
        r.iterations.len(),
        o.rc.timeout,
        o.rc.retry_cnt
    );
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(48)
        .build_cartesian_2d(x0..x1, 0f64..1.05f64)
        .map_err(draw_err)?;
    chart.configure_mesh().x_desc("latency (ms)").y_desc("fraction of iterations").draw().map_err(draw_err)?;
    let dataplane_label = match o.mode {
        Mode::Cooperating => format!("{DATAPLANE_LABEL}: n/a (cooperating client)"),
        Mode::RevokeTest if dataplane.is_empty() => format!("{DATAPLANE_LABEL}: no failed completion"),
        Mode::RevokeTest => DATAPLANE_LABEL.to_string(),
    };
    for (ms, label, color) in [(&recall, RECALL_LABEL.to_string(), BLUE), (&dataplane, dataplane_label, RED)] {
        chart
            .draw_series(LineSeries::new(ecdf(ms), color.stroke_width(2)))
            .map_err(draw_err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        let marks = ecdf(ms).into_iter().skip(1).step_by(2);
        chart.draw_series(marks.map(|p| Circle::new(p, 3, color.filled()))).map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::{Iteration, Options, Order};

    fn report(order: Order, figures: &[(u64, i64)]) -> Report {
        let iterations = figures
            .iter()
            .enumerate()
            .map(|(n, &(recall, dp))| Iteration {
                index: n as u32,
                recall_us: Some(recall),
                dataplane_us: Some(dp),
                ..Iteration::default()
            })
            .collect();
        Report { options: Options { order, iterations: figures.len() as u32, ..Options::default() }, iterations }
    }

    #[test]
    fn ecdf_steps() {
        assert_eq!(ecdf(&[2.0, 1.0]), vec![(1.0, 0.0), (1.0, 0.5), (2.0, 0.5), (2.0, 1.0)]);
        assert!(ecdf(&[]).is_empty());
        assert_eq!(x_range(&[]).0, 0.0);
        let (lo, hi) = x_range(&[-1.0, 9.0]);
        assert!(lo < -1.0 && hi > 9.0);
    }

    #[test]
    fn writes_an_svg_with_both_series_for_both_orders() {
        let dir = std::env::temp_dir().join(format!("leasectl-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("revoke.svg");
        let mkey = report(Order::MkeyFirst, &[(900, -120), (1100, 80), (1500, 310)]);
        let qp = report(Order::QpFirst, &[(1000, 33_000), (1200, 34_500)]);
        svg(&[mkey, qp], &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("<svg") || text.contains("<svg "), "{}", &text[..text.len().min(200)]);
        assert!(text.trim_end().ends_with("</svg>"));
        for s in [RECALL_LABEL, DATAPLANE_LABEL, "mkey-first", "qp-first", "latency (ms)"] {
            assert!(text.contains(s), "{s} missing from the SVG");
        }
        std::fs::remove_dir_all(dir).unwrap();
        assert!(svg(&[], &path).is_err());
    }
}
