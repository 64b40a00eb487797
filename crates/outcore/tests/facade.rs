//! The facade end to end on small zoo models: parsing and its errors, planning
//! (a plan comes back only if it runs under its allocator), simulating plan
//! files, comparing, and the latency table the executor writes feeding back
//! into planning and simulation.

use outcore::{
    ErrorKind, GraphSource, LoadedGraph, PlanOptions, RunOptions, Runnability, SimulateOptions,
    Target,
};
use std::path::PathBuf;

fn zoo(model: &str, batch: u64) -> LoadedGraph {
    outcore::load_graph(&GraphSource::Zoo {
        model: model.into(),
        batch: Some(batch),
        knobs: Default::default(),
        optimizer: None,
    })
    .expect("zoo model builds")
}

/// The executor tests' setting: this tiny-cnn runs at 40% under `window`.
fn tiny_cnn() -> LoadedGraph {
    outcore::load_graph(&GraphSource::Zoo {
        model: "tiny-cnn".into(),
        batch: Some(16),
        knobs: [("depth".to_string(), 8), ("width".to_string(), 8)].into(),
        optimizer: None,
    })
    .unwrap()
}

/// `window`'s plan for `graph` at 60% of its footprint on `a100-40gb` under
/// `allocator` (2 s at most).
fn window_at_60(graph: &LoadedGraph, allocator: &str) -> outcore::PlanResult {
    let target = Target::parse(graph, "a100-40gb", "60%", allocator).unwrap();
    let options = PlanOptions {
        time_limit_s: 2.0,
        ..PlanOptions::default()
    };
    outcore::plan(graph, "window", &target, &options)
        .unwrap_or_else(|e| panic!("window plans under {allocator}: {e}"))
}

/// A scratch file under the build directory (inside the repository).
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("outcore-facade-tests");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

#[test]
fn budgets_and_sizes_parse_and_bad_ones_name_the_range() {
    assert_eq!(outcore::parse_budget("50%", 1000).unwrap(), 500);
    assert_eq!(outcore::parse_budget("2KiB", 1).unwrap(), 2048);
    assert_eq!(outcore::parse_budget("1234", 1).unwrap(), 1234);
    assert_eq!(outcore::parse_size("1.5MB").unwrap(), 1_500_000);
    for bad in [
        "lots", "-5%", "0%", "nan%", "1e9%", "0", "-1GiB", "1e300TiB",
    ] {
        let err = outcore::parse_budget(bad, 1000).expect_err(bad);
        let msg = err.to_string();
        assert!(matches!(err.kind, ErrorKind::InvalidValue { .. }), "{msg}");
        assert!(msg.contains(&format!("`{bad}`")), "{msg}");
        assert!(msg.contains("accepted:"), "{msg}");
    }
    // 0.01% of a 1000-byte footprint rounds to nothing.
    let msg = outcore::parse_budget("0.01%", 1000)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("rounds to 0 bytes"), "{msg}");
}

#[test]
fn names_and_numbers_out_of_range_are_errors() {
    for (seconds, ok) in [
        (10.0, true),
        (0.5, true),
        (0.0, false),
        (-1.0, false),
        (f64::NAN, false),
        (f64::INFINITY, false),
    ] {
        assert_eq!(
            outcore::check_time_limit_s(seconds).is_ok(),
            ok,
            "{seconds}"
        );
    }
    let msg = outcore::check_time_limit_s(-1.0).unwrap_err().to_string();
    assert!(msg.contains("positive, finite number of seconds"), "{msg}");
    let msg = outcore::parse_allocator("buddy").unwrap_err().to_string();
    assert!(msg.contains("unknown allocator `buddy`"), "{msg}");
    assert!(msg.contains("best-fit"), "{msg}");
    let msg = outcore::parse_planner_list("none,magic")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("unknown planner `magic`"), "{msg}");
    assert!(outcore::parse_planner_list("all").unwrap().len() > 5);
    let msg = outcore::parse_planner_list("window, dtr,window")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("names `window` twice"), "{msg}");
    assert_eq!(
        outcore::parse_planner_list("window, dtr").unwrap(),
        ["window", "dtr"]
    );
    let msg = outcore::parse_optimizer("lion").unwrap_err().to_string();
    assert!(msg.contains("sgd, adam, adamw, none"), "{msg}");
    assert!(outcore::virtual_chunks_allocator(0).is_err());
    let run = RunOptions {
        link_bytes_per_s: Some(-1.0),
        ..RunOptions::default()
    };
    assert!(
        run.validate()
            .unwrap_err()
            .to_string()
            .contains("link rate")
    );
}

#[test]
fn a_budget_over_the_device_is_refused() {
    let graph = zoo("mlp", 8);
    let err = Target::parse(&graph, "a100-40gb", "41GiB", "perfect").unwrap_err();
    assert!(matches!(err.kind, ErrorKind::BudgetOverDevice { .. }));
    assert!(err.to_string().contains("larger than a100-40gb's memory"));
}

#[test]
fn a_plan_records_its_graph_device_and_allocator_and_simulates_again() {
    let graph = zoo("mlp", 8);
    // Room for best-fit's fragmentation (at 100% the mlp's plan does not fit).
    let target = Target::parse(&graph, "a100-40gb", "200%", "best-fit").unwrap();
    let result = outcore::plan(&graph, "none", &target, &PlanOptions::default()).expect("plans");
    assert!(result.verification.passed);
    assert!(result.report.oom.is_none());
    let plan = &result.plan;
    assert_eq!(plan.graph.zoo_model.as_deref(), Some("mlp"));
    assert_eq!(
        plan.device.as_ref().map(|d| d.name.as_str()),
        Some("a100-40gb")
    );
    assert_eq!(plan.allocator.name(), "best-fit");

    let path = scratch("mlp-plan.json");
    outcore::write_plan(plan, &path).unwrap();
    let loaded = outcore::load_plan(&path).unwrap();
    let sim = outcore::simulate_plan(&loaded, &SimulateOptions::default()).unwrap();
    assert!(sim.runnable, "{:?}", sim.reason);
    assert_eq!(sim.report.iter_time_s, result.report.iter_time_s);

    // A plan is checked for the graph it names.
    let mut other = loaded.clone();
    other.graph.batch = Some(3);
    let msg = outcore::simulate_plan(&other, &SimulateOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("another graph"), "{msg}");
    // ... and needs a device to be simulated on.
    let mut deviceless = loaded;
    deviceless.device = None;
    let err = outcore::simulate_plan(&deviceless, &SimulateOptions::default()).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::PlanNamesNoDevice));
}

/// Whatever the planners do about allocators, the facade returns a plan only if
/// it runs under its allocator, and otherwise names the allocator.
#[test]
fn plans_come_back_only_if_they_run_under_their_allocator() {
    let graph = zoo("resnet18", 16);
    let options = PlanOptions {
        time_limit_s: 2.0,
        ..PlanOptions::default()
    };
    for budget in ["50%", "60%", "80%"] {
        let target = Target::parse(&graph, "a100-40gb", budget, "best-fit").unwrap();
        for planner in ["window", "checkpoint-sqrt", "capuchin"] {
            match outcore::plan(&graph, planner, &target, &options) {
                Ok(result) => {
                    let sim = outcore::simulate_plan(&result.plan, &SimulateOptions::default())
                        .expect("simulates");
                    assert!(sim.runnable, "{planner} {budget}: {:?}", sim.reason);
                }
                Err(err) => {
                    let msg = err.to_string();
                    assert!(matches!(err.kind, ErrorKind::Infeasible { .. }), "{msg}");
                    if msg.contains("does not run under the best-fit allocator") {
                        assert!(msg.contains("largest free block"), "{msg}");
                    }
                }
            }
        }
    }
    // Compare judges alike: a feasible row has a report without an OOM.
    let target = Target::parse(&graph, "a100-40gb", "60%", "best-fit").unwrap();
    let c = outcore::compare(&graph, &["window".into(), "none".into()], &target, &options)
        .expect("compares");
    for row in &c.results {
        let oom_free = row.report.as_ref().is_some_and(|r| r.oom.is_none());
        assert_eq!(row.is_feasible(), row.verified && oom_free, "{row:?}");
        assert_ne!(row.status, Runnability::NotRunnable, "{row:?}");
    }
}

#[test]
fn a_plan_edited_onto_a_fragmenting_allocator_is_reported_not_runnable() {
    let graph = zoo("resnet18", 16);
    let mut plan = window_at_60(&graph, "perfect").plan;
    plan.allocator = outcore::parse_allocator("best-fit").unwrap();
    let sim = outcore::simulate_plan(&plan, &SimulateOptions::default()).unwrap();
    assert_eq!(sim.runnable, sim.report.oom.is_none());
    if let Some(reason) = &sim.reason {
        assert!(reason.contains("best-fit"), "{reason}");
    }
}

#[test]
fn the_executors_latency_table_feeds_plan_compare_and_simulate() {
    let graph = tiny_cnn();
    let run_options = RunOptions {
        iters: 2,
        // A slow link, so that copies take measurable time.
        link_bytes_per_s: Some(1e9),
        ..RunOptions::default()
    };
    let budget_bytes = outcore::parse_budget("40%", graph.footprint_bytes()).unwrap();
    let target = outcore::cpu_target(&graph, budget_bytes, Default::default(), &run_options)
        .expect("cpu target");
    let made = outcore::plan(&graph, "window", &target, &PlanOptions::default()).expect("plans");
    let ran = outcore::run(&graph.graph, made.plan.clone(), &run_options).expect("runs");
    assert_eq!(ran.iters, 2);
    assert_eq!(ran.latency_table.entries.len(), graph.graph.ops.len());

    let path = scratch("tiny-cnn-latency.json");
    ran.latency_table.write_json_file(&path).unwrap();
    let table = outcore::load_latency_table(&path).expect("the cost model reads it");
    // serde_json's float parsing may differ from the written value in the last
    // bit, so times are compared to a relative 1e-12.
    assert_same_table(&table, &ran.latency_table);

    let options = PlanOptions {
        latency_table: Some(table.clone()),
        ..PlanOptions::default()
    };
    let measured = outcore::plan(&graph, "window", &target, &options).expect("plans");
    // Measured times replace the roofline's, so the prediction changes.
    assert_ne!(measured.report.ideal_time_s, made.report.ideal_time_s);
    let c = outcore::compare(&graph, &["none".into(), "window".into()], &target, &options)
        .expect("compares");
    assert_eq!(c.results.len(), 2);
    let sim = outcore::simulate_plan(
        &measured.plan,
        &SimulateOptions {
            latency_table: Some(table),
            ..SimulateOptions::default()
        },
    )
    .expect("simulates");
    assert_eq!(sim.report.ideal_time_s, measured.report.ideal_time_s);
}

fn assert_same_table(a: &outcore::MeasuredTable, b: &outcore::MeasuredTable) {
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-12 * x.abs().max(y.abs());
    assert_eq!(a.entries.len(), b.entries.len());
    for (x, y) in a.entries.iter().zip(&b.entries) {
        assert_eq!(
            (x.op, &x.name, x.samples, &x.kind),
            (y.op, &y.name, y.samples, &y.kind)
        );
        assert!(close(x.time_s, y.time_s), "{x:?} vs {y:?}");
    }
    assert_eq!(a.copy_entries.len(), b.copy_entries.len());
    for (x, y) in a.copy_entries.iter().zip(&b.copy_entries) {
        assert_eq!(
            (x.tensor, x.direction, x.size_bytes),
            (y.tensor, y.direction, y.size_bytes)
        );
        assert!(close(x.time_s, y.time_s), "{x:?} vs {y:?}");
    }
    let (x, y) = (a.copies.expect("rates"), b.copies.expect("rates"));
    assert!(
        close(x.h2d_bytes_per_s, y.h2d_bytes_per_s) && close(x.d2h_bytes_per_s, y.d2h_bytes_per_s)
    );
}

#[test]
fn an_offsets_request_is_laid_out_simulated_and_its_file_round_trips() {
    let graph = zoo("resnet18", 16);
    let made = window_at_60(&graph, "offsets");
    let budget_bytes = made.plan.budget_bytes;
    let outcore_plan::AllocatorSpec::Offsets(layout) = &made.plan.allocator else {
        panic!("not laid out: {}", made.plan.allocator.name());
    };
    assert!(layout.height_bytes <= budget_bytes);
    // The simulator ran the layout itself: its reserved peak is the highest
    // end it touched, within the layout's height.
    assert!(made.report.peak_reserved_bytes <= layout.height_bytes);
    assert!(made.report.oom.is_none());
    assert!(made.verification.passed);
    // Written and read back, the plan simulates the same.
    let path = scratch("offsets-plan.json");
    std::fs::write(&path, serde_json::to_string(&made.plan).unwrap()).unwrap();
    let loaded = outcore::load_plan(&path).expect("the plan file loads");
    let sim = outcore::simulate_plan(&loaded, &SimulateOptions::default()).unwrap();
    assert!(sim.runnable, "{:?}", sim.reason);
    assert_eq!(sim.report.iter_time_s, made.report.iter_time_s);
}

#[test]
fn laying_out_a_plan_that_needs_more_than_its_budget_is_an_error() {
    let graph = zoo("resnet18", 16);
    let mut plan = window_at_60(&graph, "perfect").plan;
    let layout = outcore_plan::lay_out(&plan, &graph.graph).expect("verifies");
    // A budget one byte below the layout's height: laying out must refuse.
    plan.budget_bytes = layout.config.height_bytes - 1;
    let err = outcore::set_allocator(
        &mut plan,
        &graph.graph,
        outcore::parse_allocator("offsets").unwrap(),
    )
    .expect_err("the layout does not fit");
    let msg = err.to_string();
    assert!(msg.contains("more than its budget"), "{msg}");
    assert!(msg.contains("outcore plan --allocator offsets"), "{msg}");
    assert!(plan.allocator == outcore_plan::AllocatorSpec::Perfect);
}

/// A plan made for the `perfect` allocator runs laid out at exact offsets
/// (the executor's best-fit list can fragment where the plan's bytes fit;
/// `outcore::run`'s doc), still bit-identical to training without a plan;
/// with `lay_out_perfect` off it runs on the best-fit list as before.
#[test]
fn a_perfect_plan_runs_laid_out_unless_asked_not_to() {
    let graph = tiny_cnn();
    let run_options = RunOptions {
        iters: 2,
        check: true,
        reference: true,
        ..RunOptions::default()
    };
    let budget_bytes = outcore::parse_budget("40%", graph.footprint_bytes()).unwrap();
    let target = outcore::cpu_target(&graph, budget_bytes, Default::default(), &run_options)
        .expect("cpu target");
    let made = outcore::plan(&graph, "window", &target, &PlanOptions::default()).expect("plans");
    assert_eq!(made.plan.allocator.name(), "perfect");
    assert!(made.report.swap_in_bytes > 0, "the plan moves something");
    let laid = outcore::run(&graph.graph, made.plan.clone(), &run_options).expect("runs");
    assert_eq!(laid.allocator, "offsets");
    assert!(laid.arena_high_water_bytes <= budget_bytes);
    assert_eq!(laid.checks_passed, Some(true));
    assert_eq!(laid.matches_reference, Some(true));
    let listed = RunOptions {
        lay_out_perfect: false,
        ..run_options
    };
    let ran = outcore::run(&graph.graph, made.plan, &listed).expect("runs");
    assert_eq!(ran.allocator, "perfect");
    assert_eq!(ran.matches_reference, Some(true));
}

/// Planned to run with no allocator named, a plan whose `perfect` layout
/// spans more than the arena is planned again for `offsets` and runs
/// bit-identically; a named allocator is kept. The default tiny-cnn at 100%
/// of its footprint under `dtr` is such a case: its perfect plan ran out of
/// the fragmented arena (`outcore::plan_for_run`'s doc).
#[test]
fn a_run_plan_that_cannot_be_laid_out_is_planned_for_offsets() {
    let graph = zoo("tiny-cnn", 32);
    let run_options = RunOptions {
        iters: 2,
        check: true,
        reference: true,
        ..RunOptions::default()
    };
    let budget_bytes = graph.footprint_bytes();
    let plan_options = PlanOptions::default();
    let target = outcore::cpu_target(&graph, budget_bytes, Default::default(), &run_options)
        .expect("cpu target");
    let perfect = outcore::plan(&graph, "dtr", &target, &plan_options).expect("dtr plans");
    let mut laid = perfect.plan.clone();
    let offsets = outcore::AllocatorSpec::Offsets(Default::default());
    assert!(
        outcore::set_allocator(&mut laid, &graph.graph, offsets).is_err(),
        "the perfect plan's layout spans more than the arena"
    );
    let made = outcore::plan_for_run(
        &graph,
        "dtr",
        budget_bytes,
        None,
        &plan_options,
        &run_options,
    )
    .expect("plans for the run");
    assert_eq!(made.plan.allocator.name(), "offsets");
    let ran = outcore::run(&graph.graph, made.plan, &run_options).expect("runs");
    assert!(ran.arena_high_water_bytes <= budget_bytes);
    assert_eq!(ran.checks_passed, Some(true));
    assert_eq!(ran.matches_reference, Some(true));
    let named = outcore::plan_for_run(
        &graph,
        "dtr",
        budget_bytes,
        Some(outcore::AllocatorSpec::Perfect),
        &plan_options,
        &run_options,
    )
    .expect("plans");
    assert_eq!(named.plan.allocator.name(), "perfect");
}

/// Planned to run with no allocator named, a perfect plan whose layout fits
/// the arena comes back laid out (`offsets`), so that `run` uses that layout
/// as it is, and runs with every check passing.
#[test]
fn a_run_plan_that_can_be_laid_out_comes_back_laid_out() {
    let graph = zoo("tiny-cnn", 32);
    let run_options = RunOptions {
        iters: 1,
        check: true,
        ..RunOptions::default()
    };
    let budget_bytes = 2 * graph.footprint_bytes();
    let made = outcore::plan_for_run(
        &graph,
        "none",
        budget_bytes,
        None,
        &PlanOptions::default(),
        &run_options,
    )
    .expect("plans at twice the footprint");
    assert_eq!(made.plan.allocator.name(), "offsets");
    let ran = outcore::run(&graph.graph, made.plan, &run_options).expect("runs");
    assert_eq!(ran.allocator, "offsets");
    assert!(ran.arena_high_water_bytes <= budget_bytes);
    assert_eq!(ran.checks_passed, Some(true));
}

/// `ideal` plans for unlimited memory whatever the budget: planned to run
/// in a smaller arena it is refused by name, with the budget it needs,
/// instead of running in an arena of its own size.
#[test]
fn a_run_plan_above_the_arena_asked_for_is_refused() {
    let graph = zoo("tiny-cnn", 32);
    let run_options = RunOptions::default();
    let half = graph.footprint_bytes() / 2;
    let e = outcore::plan_for_run(
        &graph,
        "ideal",
        half,
        None,
        &PlanOptions::default(),
        &run_options,
    )
    .expect_err("refused");
    let text = e.to_string();
    assert!(matches!(e.kind, ErrorKind::InvalidValue { .. }), "{text}");
    assert!(
        text.contains("--budget") && text.contains("`ideal` ignores the budget"),
        "{text}"
    );
    let made = outcore::plan_for_run(
        &graph,
        "ideal",
        2 * graph.footprint_bytes(),
        None,
        &PlanOptions::default(),
        &run_options,
    )
    .expect("plans in an arena twice its footprint");
    assert!(made.plan.budget_bytes <= 2 * graph.footprint_bytes());
}

/// A perfect plan that neither lays out in its arena nor fits the best-fit
/// list there (`none` on tiny-cnn at its footprint) stops out of memory
/// with the budget its exact layout needs, and runs laid out at that
/// budget. The plan copies nothing, so its allocations and frees reach the
/// arena in one order in every run (the executor drains in-flight frees
/// before it reports a shortfall): the shortfall does not depend on timing.
#[test]
fn a_run_out_of_a_fragmented_arena_names_the_budget_its_layout_needs() {
    let graph = zoo("tiny-cnn", 32);
    let run_options = RunOptions {
        iters: 1,
        ..RunOptions::default()
    };
    let plan_options = PlanOptions::default();
    let at = |budget_bytes: u64| {
        outcore::plan_for_run(
            &graph,
            "none",
            budget_bytes,
            None,
            &plan_options,
            &run_options,
        )
        .expect("none plans at the footprint and above")
    };
    let made = at(graph.footprint_bytes());
    assert_eq!(made.plan.allocator.name(), "perfect");
    let e = outcore::run(&graph.graph, made.plan, &run_options).expect_err("out of memory");
    let text = e.to_string();
    assert!(matches!(e.kind, ErrorKind::NotRunnable { .. }), "{text}");
    assert!(text.contains("out of device memory"), "{text}");
    let needed: u64 = text
        .split("(`--budget ")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a budget in bytes: {text}"));
    assert!(needed > graph.footprint_bytes(), "{text}");
    let ran = outcore::run(&graph.graph, at(needed).plan, &run_options).expect("runs laid out");
    assert_eq!(ran.allocator, "offsets");
    assert!(ran.arena_high_water_bytes <= needed);
}

/// A swapping plan pinned to its timeline: the same instructions, waits only
/// added, the same predicted time, a timeline that lists every step once in
/// start order; and a plan for no device is refused by name.
#[test]
fn a_plan_pinned_to_its_timeline_keeps_its_prediction_and_adds_only_waits() {
    let graph = tiny_cnn();
    let result = window_at_60(&graph, "best-fit-paged");
    let plan = &result.plan;
    let pinned = outcore::pin_to_timeline(plan, None).expect("pins");
    assert_eq!(pinned.timeline.len(), plan.n_steps());
    assert!(
        pinned
            .timeline
            .windows(2)
            .all(|w| w[0].start_s <= w[1].start_s)
    );
    let mut added = 0;
    for (a, b) in plan.streams.iter().zip(&pinned.plan.streams) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.instr, y.instr);
            assert_eq!(y.waits[..x.waits.len()], x.waits[..]);
            added += y.waits.len() - x.waits.len();
        }
    }
    assert_eq!(added, pinned.waits_added);
    assert!(added > 0, "window's swap-outs free on the d2h stream");
    let before = outcore::simulate_plan(plan, &SimulateOptions::default()).unwrap();
    let after = outcore::simulate_plan(&pinned.plan, &SimulateOptions::default()).unwrap();
    assert_eq!(after.report.iter_time_s, before.report.iter_time_s);
    assert_eq!(after.report.peak_live_bytes, before.report.peak_live_bytes);

    let mut deviceless = plan.clone();
    deviceless.device = None;
    let err = outcore::pin_to_timeline(&deviceless, None).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::PlanNamesNoDevice));
}

/// The bytes a budget hint names: "... has a plan under 6.49 MiB (6801693
/// bytes, ...".
fn hinted_budget(msg: &str) -> Option<(String, u64)> {
    let at = msg.find("has a plan under ")?;
    let planner = msg[..at].rsplit('`').nth(1)?.to_string();
    let rest = &msg[at..];
    let open = rest.find('(')?;
    let bytes = rest[open + 1..].split(' ').next()?.parse().ok()?;
    Some((planner, bytes))
}

#[test]
fn a_plan_refused_names_a_budget_under_which_one_exists() {
    let graph = outcore::load_graph(&GraphSource::Zoo {
        model: "tiny-cnn".into(),
        batch: None,
        knobs: Default::default(),
        optimizer: None,
    })
    .unwrap();
    let options = PlanOptions {
        time_limit_s: 1.0,
        ..PlanOptions::default()
    };
    // 20% of the footprint: `window`'s shortfall at one op (2.38 MiB against
    // 2.18 MiB) is not what any planner needs; the hint names a larger
    // budget, and the planner it names plans there.
    let target = Target::parse(&graph, "v100-16gb-pcie3", "20%", "perfect").unwrap();
    let err = outcore::plan(&graph, "window", &target, &options).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err.kind, ErrorKind::Infeasible { .. }), "{msg}");
    let (planner, bytes) = hinted_budget(&msg).unwrap_or_else(|| panic!("no hint in: {msg}"));
    assert!(bytes > target.budget_bytes, "{msg}");
    assert!(
        bytes <= 4 * target.budget_bytes + 1,
        "above the ladder's top: {msg}"
    );
    let at_hint = Target {
        budget_bytes: bytes,
        ..target.clone()
    };
    let planned = outcore::plan(&graph, &planner, &at_hint, &options)
        .unwrap_or_else(|e| panic!("{planner} under the hinted {bytes} B: {e}"));
    assert!(planned.report.peak_live_bytes <= bytes);
}

#[test]
fn a_budget_no_op_fits_gets_no_hint() {
    let graph = tiny_cnn();
    let target = Target::parse(&graph, "v100-16gb-pcie3", "1KiB", "perfect").unwrap();
    let err = outcore::plan(&graph, "window", &target, &PlanOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err.kind, ErrorKind::Infeasible { .. }), "{msg}");
    // Four times 1 KiB is still below the first op's working set.
    assert!(!msg.contains("has a plan under"), "{msg}");
}

#[test]
fn another_planner_under_the_same_budget_is_named() {
    // tiny-cnn (depth 8, width 8, batch 16) at 40%: `window` plans there
    // (the executor tests' setting); `none` keeps everything and cannot.
    let graph = tiny_cnn();
    let target = Target::parse(&graph, "v100-16gb-pcie3", "40%", "perfect").unwrap();
    let err = outcore::plan(&graph, "none", &target, &PlanOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("has a plan under this budget"), "{msg}");
}
