//! Every zoo model: builds and validates at a small batch, matches its reference
//! parameter count within 0.5%, and its footprint agrees with a naive recount.

use outcore_graph::{Graph, stats, zoo};
use std::collections::BTreeMap;

/// Peak live bytes recomputed naively: for every op position, sum the sizes of the
/// storage owners whose interval covers it. Independent of `footprint()`'s
/// difference-array sweep and its interval code.
fn naive_footprint(g: &Graph) -> u64 {
    let n = g.ops.len();
    let mut first = vec![usize::MAX; g.tensors.len()];
    let mut last = vec![0usize; g.tensors.len()];
    let owner = |mut t: usize| {
        loop {
            let tensor = &g.tensors[t];
            match tensor.view_of.or(tensor.inplace_update_of) {
                Some(next) => t = next.index(),
                None => return t,
            }
        }
    };
    for (pos, op) in g.ops.iter().enumerate() {
        for t in op.inputs.iter().chain(&op.outputs) {
            let o = owner(t.index());
            first[o] = first[o].min(pos);
            last[o] = last[o].max(pos);
        }
    }
    // Owners of step outputs (directly or through a view) live to the end.
    let mut to_end_storage = vec![false; g.tensors.len()];
    for t in g.tensors.iter().filter(|t| t.is_output) {
        to_end_storage[owner(t.id.index())] = true;
    }
    let mut peak = 0;
    for pos in 0..n {
        let mut live = 0;
        for t in &g.tensors {
            if t.view_of.is_some() || t.inplace_update_of.is_some() {
                continue;
            }
            let i = t.id.index();
            let from_start = t.producer.is_none();
            let to_end = to_end_storage[i] || (t.kind.is_persistent() && t.producer.is_none());
            let starts = if from_start { 0 } else { first[i] };
            let ends = if to_end {
                n
            } else if first[i] == usize::MAX {
                starts
            } else {
                last[i]
            };
            if starts <= pos && pos <= ends {
                live += t.size_bytes;
            }
        }
        peak = peak.max(live + g.ops[pos].workspace_bytes);
    }
    peak
}

#[test]
fn every_zoo_model_builds_validates_and_matches_its_parameter_count() {
    for info in zoo::models() {
        let graph = zoo::build(info.name, Some(2), &BTreeMap::new(), None)
            .unwrap_or_else(|e| panic!("{} does not build: {e}", info.name));
        let s = stats(&graph);
        if let Some(reference) = info.reference_param_count {
            let rel = (s.param_count as f64 - reference as f64).abs() / reference as f64;
            assert!(
                rel <= 0.005,
                "{}: {} parameters vs {} in {} ({:.3}% off)",
                info.name,
                s.param_count,
                reference,
                info.source,
                rel * 100.0
            );
        }
        assert!(
            s.n_ops_by_phase["backward"] > 0,
            "{} has no backward",
            info.name
        );
        if graph.ops.len() < 6000 {
            assert_eq!(s.footprint_bytes, naive_footprint(&graph), "{}", info.name);
        }
    }
}

#[test]
fn unknown_model_and_bad_knobs_are_errors() {
    let err = zoo::build("resnet51", None, &BTreeMap::new(), None).unwrap_err();
    assert!(
        err.to_string().contains("unknown model `resnet51`"),
        "{err}"
    );
    let mut knobs = BTreeMap::new();
    knobs.insert("depth".to_string(), 51);
    let err = zoo::build("wide-resnet", None, &knobs, None).unwrap_err();
    assert!(err.to_string().contains("depth 51"), "{err}");
    let mut knobs = BTreeMap::new();
    knobs.insert("heads".to_string(), 2);
    let err = zoo::build("resnet50", None, &knobs, None).unwrap_err();
    assert!(err.to_string().contains("unknown knob `heads`"), "{err}");
    let err = zoo::build("mlp", Some(0), &BTreeMap::new(), None).unwrap_err();
    assert!(
        err.to_string().contains("batch must be at least 1"),
        "{err}"
    );
}

#[test]
fn new_family_knobs_scale_and_reject_bad_values() {
    let knobs = |k: &str, v: u64| BTreeMap::from([(k.to_string(), v)]);
    let base = stats(&zoo::build("inception_v4", Some(2), &BTreeMap::new(), None).unwrap());
    let wide = stats(&zoo::build("inception_v4", Some(2), &knobs("scale", 2), None).unwrap());
    // Doubling every conv's channels roughly quadruples the conv weights.
    assert!(wide.param_count > 3 * base.param_count, "{wide:?}");
    let err = zoo::build("inception_v4", Some(2), &knobs("scale", 1000), None).unwrap_err();
    assert!(err.to_string().contains("scale 1000"), "{err}");
    let small = zoo::build("unet", Some(1), &knobs("size", 100), None);
    assert!(small.is_ok(), "odd sizes pad the skips: {small:?}");
    let err = zoo::build("unet", Some(1), &knobs("size", 8), None).unwrap_err();
    assert!(err.to_string().contains("size 8 px"), "{err}");
}

#[test]
fn nasnet_knobs_scale_depth_and_width_and_reject_bad_values() {
    let knobs = |pairs: &[(&str, u64)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect::<BTreeMap<_, _>>()
    };
    let large = zoo::build("nasnet", Some(1), &BTreeMap::new(), None).unwrap();
    let deep = zoo::build("nasnet", Some(1), &knobs(&[("repeats", 25)]), None).unwrap();
    assert!(deep.ops.len() > 3 * large.ops.len());
    let narrow = zoo::build("nasnet", Some(1), &knobs(&[("filters", 1056)]), None).unwrap();
    assert!(stats(&narrow).param_count < stats(&large).param_count / 10);
    let err = zoo::build("nasnet", Some(1), &knobs(&[("filters", 4000)]), None).unwrap_err();
    assert!(err.to_string().contains("filters 4000"), "{err}");
    let err = zoo::build("nasnet", Some(1), &knobs(&[("repeats", 1000)]), None).unwrap_err();
    assert!(err.to_string().contains("repeats 1000"), "{err}");
}

/// HOME's Plain20 (He et al. 2016, Sec. 4.2): 6n+2 weighted layers (convs and
/// the classifier), no shortcut additions, 32x32 inputs; other depths by the knob.
#[test]
fn plain20_has_twenty_weighted_layers_and_no_shortcuts() {
    use outcore_graph::{OpKind, Phase};
    for (depth, params) in [(20u64, 269_722u64), (32, 464_154)] {
        let mut knobs = BTreeMap::new();
        knobs.insert("depth".to_string(), depth);
        let g = zoo::build("plain20", Some(2), &knobs, None).expect("builds");
        let forward = |f: &dyn Fn(&OpKind) -> bool| {
            g.ops
                .iter()
                .filter(|o| o.phase == Phase::Forward && f(&o.kind))
                .count() as u64
        };
        let weighted = forward(&|k| matches!(k, OpKind::Conv2d(_) | OpKind::Linear { .. }));
        assert_eq!(weighted, depth, "plain{depth}");
        assert_eq!(forward(&|k| matches!(k, OpKind::Add)), 0, "plain{depth}");
        assert_eq!(stats(&g).param_count, params, "plain{depth}");
        assert_eq!(g.tensors[g.ops[0].inputs[0].index()].shape, [2, 3, 32, 32]);
    }
    let mut knobs = BTreeMap::new();
    knobs.insert("depth".to_string(), 21);
    let err = zoo::build("plain20", None, &knobs, None).unwrap_err();
    assert!(err.to_string().contains("6n+2"), "{err}");
}
