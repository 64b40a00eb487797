//! The single-job part of TENSILE's Table III (paper 004, Sec. V-C): MSR, EOR
//! and CBR of `tensile`, `capuchin` and `vdnn-conv` on VGG-16, Inception v3,
//! Inception v4, ResNet-50 and DenseNet-121 at batch 16 on `a6000-48gb`.
//!
//! MSR = (VMP - EMP) / VMP, EOR = ETC / VTC, CBR = MSR / EOR (Sec. V-A), where
//! the vanilla group is the plan with nothing moved (`none`) and VMP, EMP are
//! simulated peaks of live bytes, VTC, ETC simulated iteration times. Each
//! planner runs at three budgets: the one its own Table III MSR implies,
//! `(1 - MSR_paper) * VMP`, the one TENSILE's Table III MSR implies (the
//! same memory for all three), and the smallest feasible one (bisection on the
//! fraction of VMP to 1/128). Prints a markdown table to stderr (the workspace denies printing to stdout).
//!
//! `cargo run --release -p outcore-planners --example tensile_table`
//!
//! With the argument `protocol`, prints instead the comparison the paper
//! itself makes (Sec. V-A, "Extra Setting"): TENSILE is an active method that
//! saves as much memory as hidden swaps allow even when the job fits, and
//! Capuchin (and here vDNN-conv) gets TENSILE's resulting peak as its budget.
//! Our `tensile` returns a plan that fits as it is, so its active run is at a
//! budget one byte below VMP: Algorithm 3's swapping phase does not depend on
//! the budget, and recomputation (driven by the budget) then has nothing to do
//! unless swapping cannot even save one byte.
//!
//! `cargo run --release -p outcore-planners --example tensile_table -- protocol`
//!
//! With `protocol-eager`, the same protocol with every planner (and the
//! vanilla run) in the eager-update order ([`outcore_plan::eager_update_order`]:
//! each optimizer op as soon as its gradient is complete, as PyTorch's
//! optimizer-in-backward runs it). It tests whether VGG-16's loss in the
//! protocol comes from the graph's order, where the classifier's gradients
//! and momentum buffers wait for the end of the iteration.
//!
//! With `protocol-min`, the same protocol with `tensile` active at its
//! smallest feasible budget (the bisection of the default table) instead of
//! one byte below VMP: there Algorithm 3 recomputes too (MSPS), which a
//! budget the swaps alone meet never asks for, so "saves as much memory as
//! it can" includes its recomputation phase; `capuchin` and `vdnn-conv` then
//! plan at the peak it reaches, in the graph's order.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{PlanOutcome, PlanRequest, verify};
use outcore_sim::{SimOptions, SimReport, simulate};
use std::collections::BTreeMap;

const DEVICE: &str = "a6000-48gb";
const BATCH: u64 = 16;
const PLANNERS: [&str; 3] = ["vdnn-conv", "capuchin", "tensile"];

/// (label, zoo name, Table III (MSR, EOR, CBR) for vDNN, Capuchin, TENSILE).
type PaperRow = (&'static str, &'static str, [[f64; 3]; 3]);

const PAPER: [PaperRow; 5] = [
    (
        "VGG-16",
        "vgg16",
        [
            [0.1109, 1.7835, 0.0622],
            [0.2558, 1.8304, 0.1398],
            [0.2670, 1.6287, 0.1639],
        ],
    ),
    (
        "InceptionV3",
        "inception_v3",
        [
            [0.1633, 2.5184, 0.0648],
            [0.4331, 2.7745, 0.1561],
            [0.4361, 1.6468, 0.2648],
        ],
    ),
    (
        "InceptionV4",
        "inception_v4",
        [
            [0.1903, 2.5028, 0.0760],
            [0.5129, 3.2362, 0.1585],
            [0.5154, 1.4281, 0.3609],
        ],
    ),
    (
        "ResNet-50",
        "resnet50",
        [
            [0.1733, 2.2981, 0.0754],
            [0.3859, 2.2320, 0.1729],
            [0.4258, 1.5540, 0.2740],
        ],
    ),
    (
        "DenseNet",
        "densenet121",
        [
            [0.1381, 2.6148, 0.0528],
            [0.4860, 3.4400, 0.1413],
            [0.5135, 1.1678, 0.4397],
        ],
    ),
];

/// The simulated report of `planner` at `budget_bytes` (`None`: infeasible).
fn run(
    planner: &str,
    g: &Graph,
    cost: &RooflineModel,
    budget_bytes: u64,
) -> Result<Option<SimReport>, String> {
    run_in(planner, g, cost, budget_bytes, None)
}

/// [`run`] in the compute order `order` (`None`: the graph's).
fn run_in(
    planner: &str,
    g: &Graph,
    cost: &RooflineModel,
    budget_bytes: u64,
    order: Option<&[outcore_graph::OpId]>,
) -> Result<Option<SimReport>, String> {
    let p = outcore_planners::by_name(planner)?;
    let mut request = PlanRequest::new(g, cost, budget_bytes);
    request.order = order;
    match p.plan(&request) {
        Ok(PlanOutcome::Feasible(plan)) => {
            if let Some(v) = verify(&plan, g).first() {
                return Err(format!("{planner} does not verify: {v}"));
            }
            let out =
                simulate(g, &plan, cost, &SimOptions::default()).map_err(|e| e.to_string())?;
            Ok(Some(out.report))
        }
        Ok(PlanOutcome::Infeasible(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The smallest feasible budget, as a fraction of `vmp_bytes`, and its report.
fn smallest(
    planner: &str,
    g: &Graph,
    cost: &RooflineModel,
    vmp_bytes: f64,
) -> Result<(f64, Option<SimReport>), String> {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    let mut best = run(planner, g, cost, vmp_bytes as u64)?;
    for _ in 0..7 {
        let mid = (lo + hi) / 2.0;
        match run(planner, g, cost, (mid * vmp_bytes) as u64)? {
            Some(r) => {
                hi = mid;
                best = Some(r);
            }
            None => lo = mid,
        }
    }
    Ok((hi, best))
}

/// One table cell group: measured MSR, EOR, CBR (or "infeasible").
fn metrics(vanilla: &SimReport, report: Option<&SimReport>) -> String {
    let Some(r) = report else {
        return "infeasible | | ".into();
    };
    let vmp = vanilla.peak_live_bytes as f64;
    let msr = (vmp - r.peak_live_bytes as f64) / vmp;
    let eor = r.iter_time_s / vanilla.iter_time_s;
    format!("{msr:.4} | {eor:.4} | {:.4}", msr / eor)
}

/// The paper's own protocol (see the module docs): `tensile` active, then
/// `capuchin` and `vdnn-conv` at the peak it reaches; all in the eager-update
/// order if `eager`, else in the graph's. With `min`, `tensile` is active at
/// its smallest feasible budget (graph order only).
fn protocol(cost: &RooflineModel, eager: bool, min: bool) -> Result<(), String> {
    eprintln!(
        "| model | tensile (active): EMP / VMP | MSR / EOR / CBR | capuchin at that budget: MSR / EOR / CBR | vdnn-conv at that budget: MSR / EOR / CBR |"
    );
    eprintln!("|---|---|---|---|---|");
    for (label, name, _) in PAPER {
        let g = zoo::build(name, Some(BATCH), &BTreeMap::new(), None).map_err(|e| e.to_string())?;
        let order = eager.then(|| outcore_plan::eager_update_order(&g));
        let order = order.as_deref();
        let vanilla = run_in("none", &g, cost, footprint(&g).0, order)?
            .ok_or_else(|| format!("{label}: the vanilla plan is infeasible"))?;
        let vmp = vanilla.peak_live_bytes;
        let active = if min {
            smallest("tensile", &g, cost, vmp as f64)?.1
        } else {
            run_in("tensile", &g, cost, vmp - 1, order)?
        }
        .ok_or_else(|| format!("{label}: tensile saves nothing below VMP"))?;
        let budget = active.peak_live_bytes;
        let capuchin = run_in("capuchin", &g, cost, budget, order)?;
        let vdnn = run_in("vdnn-conv", &g, cost, budget, order)?;
        eprintln!(
            "| {label} | {:.4} | {} | {} | {} |",
            budget as f64 / vmp as f64,
            metrics(&vanilla, Some(&active)).replace(" | ", " / "),
            metrics(&vanilla, capuchin.as_ref()).replace(" | ", " / "),
            metrics(&vanilla, vdnn.as_ref()).replace(" | ", " / "),
        );
    }
    Ok(())
}

fn main() -> Result<(), String> {
    let cost = RooflineModel::new(DeviceProfile::builtin(DEVICE).map_err(|e| e.to_string())?);
    match std::env::args().nth(1).as_deref() {
        Some("protocol") => return protocol(&cost, false, false),
        Some("protocol-eager") => return protocol(&cost, true, false),
        Some("protocol-min") => return protocol(&cost, false, true),
        _ => {}
    }
    eprintln!(
        "| model | method | paper MSR | paper EOR | paper CBR | MSR at own paper budget | EOR | CBR | MSR at TENSILE's paper budget | EOR | CBR | smallest feasible budget / VMP | MSR there | EOR | CBR |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, name, paper) in PAPER {
        let g = zoo::build(name, Some(BATCH), &BTreeMap::new(), None).map_err(|e| e.to_string())?;
        let vanilla = run("none", &g, &cost, footprint(&g).0)?
            .ok_or_else(|| format!("{label}: the vanilla plan is infeasible"))?;
        let vmp = vanilla.peak_live_bytes as f64;
        let tensile_budget = ((1.0 - paper[2][0]) * vmp) as u64;
        for (i, planner) in PLANNERS.iter().enumerate() {
            let own_budget = ((1.0 - paper[i][0]) * vmp) as u64;
            let own = run(planner, &g, &cost, own_budget)?;
            let same = run(planner, &g, &cost, tensile_budget)?;
            let (fraction, least) = smallest(planner, &g, &cost, vmp)?;
            if *planner == "tensile" {
                let at = (fraction * vmp) as u64;
                let p = outcore_planners::by_name(planner)?;
                if let Ok(PlanOutcome::Feasible(plan)) = p.plan(&PlanRequest::new(&g, &cost, at)) {
                    eprintln!(
                        "<!-- {label} tensile at {fraction:.4}: {} -->",
                        plan.planner.settings
                    );
                }
            }
            let [m, e, c] = paper[i];
            eprintln!(
                "| {label} | {planner} | {m:.4} | {e:.4} | {c:.4} | {} | {} | {fraction:.4} | {} |",
                metrics(&vanilla, own.as_ref()),
                metrics(&vanilla, same.as_ref()),
                metrics(&vanilla, least.as_ref())
            );
        }
    }
    Ok(())
}
