//! The search figure of a plan made by a search planner: how the iteration
//! time went as the search scored candidates, one panel per start.
//!
//! The data is what the planner recorded in its settings:
//! - `outcore` writes, per start of its local search (`settings.local_search[]`),
//!   a `curve` of `[moves scored, current time, batch mean, batch worst]`
//!   points, one per scored batch of 32 moves, sampled to at most 100 (null
//!   where no candidate of the batch was feasible: a start still being
//!   repaired);
//! - `swapadvisor` writes its convergence `history`, one entry per generation
//!   (`evaluations`, and `best_s` / `mean_s` / `worst_s` over the feasible
//!   individuals alive, null when none is): SwapAdvisor's Fig. 9;
//! - `home` writes its `history`, one entry per iteration (`iteration`, and
//!   `best_s` / `average_s` / `worst_s` over the particles that fit, in the
//!   cost its scoring uses): HOME's Fig. 8.
//!
//! The figure draws one panel per curve: the best time so far (the running
//! minimum of the current or best time), and the mean and worst of each
//! step's feasible candidates. Planners that record neither get no search
//! figure.

use super::svg::{Svg, num, ticks};
use serde_json::Value;

/// One curve: its label, what its x axis counts, and its points.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchCurve {
    pub start: String,
    /// What the first coordinate counts ("moves scored", "individuals scored", "iterations").
    pub x_label: String,
    /// `[x, current (or step's best) time (s), step mean (s), step worst (s)]`,
    /// `NaN` where the plan recorded null.
    pub points: Vec<[f64; 4]>,
}

/// The curves a plan's settings record (empty if none).
pub fn curves(settings: &Value) -> Vec<SearchCurve> {
    let mut out = local_search_curves(settings);
    out.extend(history_curve(settings));
    out
}

/// The convergence history of SwapAdvisor's genetic search or HOME's
/// particle swarm, told apart by their entries' keys.
fn history_curve(settings: &Value) -> Option<SearchCurve> {
    let entries = settings.get("history")?.as_array()?;
    let first = entries.first()?;
    let (start, x_label, x_key, mean_key) = if first.get("generation").is_some() {
        (
            "genetic search (SwapAdvisor), per generation",
            "individuals scored",
            "evaluations",
            "mean_s",
        )
    } else if first.get("iteration").is_some() {
        (
            "particle swarm (HOME), per iteration",
            "iterations",
            "iteration",
            "average_s",
        )
    } else {
        return None;
    };
    let f = |e: &Value, k: &str| e.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let points: Vec<[f64; 4]> = entries
        .iter()
        .map(|e| [f(e, x_key), f(e, "best_s"), f(e, mean_key), f(e, "worst_s")])
        .filter(|p| p[0].is_finite())
        .collect();
    (!points.is_empty()).then(|| SearchCurve {
        start: start.to_string(),
        x_label: x_label.to_string(),
        points,
    })
}

/// `outcore`'s local search: one curve per start.
fn local_search_curves(settings: &Value) -> Vec<SearchCurve> {
    let Some(starts) = settings.get("local_search").and_then(Value::as_array) else {
        return Vec::new();
    };
    starts
        .iter()
        .filter_map(|s| {
            let start = s.get("start")?.as_str()?.to_string();
            let points: Vec<[f64; 4]> = s
                .get("curve")?
                .as_array()?
                .iter()
                .filter_map(|p| {
                    let p = p.as_array()?;
                    let at = |i: usize| p.get(i).and_then(Value::as_f64).unwrap_or(f64::NAN);
                    (p.len() == 4).then(|| [at(0), at(1), at(2), at(3)])
                })
                .collect();
            (!points.is_empty()).then(|| SearchCurve {
                start,
                x_label: "moves scored".to_string(),
                points,
            })
        })
        .collect()
}

/// The running minimum of the current time (`NaN` until a feasible point).
pub fn best_so_far(points: &[[f64; 4]]) -> Vec<f64> {
    let mut best = f64::NAN;
    points
        .iter()
        .map(|p| {
            if p[1].is_finite() && (best.is_nan() || p[1] < best) {
                best = p[1];
            }
            best
        })
        .collect()
}

const WIDTH_PX: f64 = 1180.0;
const PANEL_H_PX: f64 = 170.0;
const LEFT_PX: f64 = 80.0;
const TOP_PX: f64 = 40.0;

/// One SVG with a panel per curve.
pub fn render(curves: &[SearchCurve]) -> String {
    let height = TOP_PX + PANEL_H_PX * curves.len() as f64 + 20.0;
    let mut svg = Svg::new(WIDTH_PX, height);
    svg.text(
        LEFT_PX,
        20.0,
        14.0,
        "start",
        "Search: best iteration time so far (solid); mean and worst of each batch, generation or iteration's feasible candidates (dashed, light)",
    );
    for (k, c) in curves.iter().enumerate() {
        panel(&mut svg, c, TOP_PX + PANEL_H_PX * k as f64);
    }
    svg.finish()
}

fn panel(svg: &mut Svg, c: &SearchCurve, top: f64) {
    let plot_w = WIDTH_PX - LEFT_PX - 40.0;
    let plot_h = PANEL_H_PX - 60.0;
    let base_y = top + 20.0 + plot_h;
    let best = best_so_far(&c.points);
    let best_s = best.last().copied().unwrap_or(f64::NAN);
    let finite = |x: &f64| x.is_finite();
    let values: Vec<f64> = c
        .points
        .iter()
        .flat_map(|p| [p[1], p[2], p[3]])
        .filter(finite)
        .collect();
    let title = if c.x_label == "moves scored" {
        format!("start: {}", c.start)
    } else {
        c.start.clone()
    };
    svg.text(LEFT_PX, top + 12.0, 12.0, "start", &title);
    let (Some(lo), Some(hi)) = (
        values.iter().copied().reduce(f64::min),
        values.iter().copied().reduce(f64::max),
    ) else {
        svg.text(
            LEFT_PX,
            top + 40.0,
            11.0,
            "start",
            "no feasible candidate scored (the start was still being repaired)",
        );
        return;
    };
    let span = (hi - lo).max(hi * 1e-6).max(1e-12);
    let max_x = c.points.last().map_or(1.0, |p| p[0].max(1.0));
    let x = |m: f64| LEFT_PX + m / max_x * plot_w;
    let y = |t: f64| base_y - (t - lo) / span * plot_h;
    for t in ticks(span, 3) {
        svg.line(
            LEFT_PX - 4.0,
            y(lo + t),
            LEFT_PX + plot_w,
            y(lo + t),
            "#eee",
            false,
        );
        svg.text(LEFT_PX - 8.0, y(lo + t) + 4.0, 10.0, "end", &num(lo + t));
    }
    svg.line(LEFT_PX, base_y, LEFT_PX + plot_w, base_y, "#333", false);
    svg.text(
        LEFT_PX + plot_w,
        base_y + 16.0,
        10.0,
        "end",
        &format!("{} ({})", c.x_label, num(max_x)),
    );
    let series: [(Vec<f64>, &str, bool); 3] = [
        (c.points.iter().map(|p| p[3]).collect(), "#ccc", true),
        (c.points.iter().map(|p| p[2]).collect(), "#8aa", true),
        (best, "#1f5fa8", false),
    ];
    for (ys, colour, dash) in &series {
        for i in 1..c.points.len() {
            let (a, b) = (ys[i - 1], ys[i]);
            if a.is_finite() && b.is_finite() {
                let (x0, x1) = (x(c.points[i - 1][0]), x(c.points[i][0]));
                svg.line(x0, y(a), x1, y(b), colour, *dash);
            }
        }
    }
    if let Some(&last) = c.points.last() {
        let hover = format!(
            "{}: {} {}; best {} s",
            c.start,
            num(last[0]),
            c.x_label,
            num(best_s)
        );
        if best_s.is_finite() {
            svg.circle(x(last[0]), y(best_s), 3.0, "#1f5fa8", Some(&hover));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn curves_are_read_with_nulls_as_nan_and_the_best_is_a_running_minimum() {
        let settings = json!({
            "local_search": [
                {"start": "dtr", "curve": [[32, 1.0, 1.1, 1.2], [64, 0.9, 1.0, 1.3], [96, 0.95, 0.97, 1.0]]},
                {"start": "keep-all (repaired)", "curve": [[32, null, null, null], [64, 2.0, 2.1, 2.2]]},
                {"start": "no curve"}
            ]
        });
        let c = curves(&settings);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].start, "dtr");
        assert!(c[1].points[0][1].is_nan());
        // After a kick the climb's current time rose (0.95); the best stays 0.9.
        assert_eq!(best_so_far(&c[0].points), vec![1.0, 0.9, 0.9]);
        let b = best_so_far(&c[1].points);
        assert!(b[0].is_nan() && b[1] == 2.0);
        let svg = render(&c);
        assert!(svg.starts_with("<svg") && svg.contains("<line"));
        assert!(svg.contains("start: keep-all (repaired)"));
        assert!(curves(&json!({"seed": 3})).is_empty());
    }

    #[test]
    fn swapadvisor_and_home_histories_become_one_curve_each() {
        let ga = json!({"history": [
            {"generation": 0, "evaluations": 144, "best_s": 2.0, "mean_s": 3.0, "worst_s": 5.0},
            {"generation": 1, "evaluations": 288, "best_s": null, "mean_s": null, "worst_s": null},
            {"generation": 2, "evaluations": 432, "best_s": 1.5, "mean_s": 2.5, "worst_s": 4.0}
        ]});
        let c = curves(&ga);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].x_label, "individuals scored");
        assert_eq!(c[0].points[2], [432.0, 1.5, 2.5, 4.0]);
        assert!(c[0].points[1][1].is_nan());
        assert_eq!(best_so_far(&c[0].points), vec![2.0, 2.0, 1.5]);
        let pso = json!({"history": [
            {"iteration": 0, "best_s": 1.2, "average_s": 1.4, "worst_s": 1.9},
            {"iteration": 1, "best_s": 1.3, "average_s": 1.35, "worst_s": 1.5}
        ]});
        let c = curves(&pso);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].x_label, "iterations");
        assert_eq!(c[0].points[1], [1.0, 1.3, 1.35, 1.5]);
        // A swarm's best may rise between iterations; the best so far does not.
        assert_eq!(best_so_far(&c[0].points), vec![1.2, 1.2]);
        let svg = render(&c);
        assert!(svg.contains("particle swarm (HOME), per iteration"));
        assert!(svg.contains("iterations (1)"));
        assert!(curves(&json!({"history": [{"other": 1}]})).is_empty());
    }
}
