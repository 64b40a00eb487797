//! One test per graph validation error, each on a deliberately broken graph.

use outcore_graph::builder::{GraphBuilder, Optimizer};
use outcore_graph::{DType, Graph, Location, OpId, TensorId, TensorKind, ViolationKind, validate};

/// x -> linear -> relu -> linear -> loss, SGD + momentum: a valid base graph.
fn base() -> Graph {
    let mut b = GraphBuilder::new("v", 2, DType::Float32);
    let x = b.input("x", &[2, 4]);
    let y = b.label("y", &[2]);
    let h = b.linear("fc", x, 3, true);
    let h = b.relu(h);
    let h = b.flatten(h);
    let logits = b.linear("head", h, 2, true);
    let loss = b.softmax_cross_entropy(logits, y);
    b.finish(loss, Optimizer::sgd_momentum())
        .expect("valid base")
}

fn kinds(g: &Graph) -> Vec<ViolationKind> {
    match validate(g) {
        Ok(()) => vec![],
        Err(e) => e.violations.into_iter().map(|v| v.kind).collect(),
    }
}

fn op_named(g: &Graph, name: &str) -> OpId {
    g.ops.iter().find(|o| o.name == name).expect("op").id
}

#[test]
fn base_graph_is_valid() {
    assert_eq!(kinds(&base()), vec![]);
}

#[test]
fn ids_not_dense() {
    let mut g = base();
    g.tensors[3].id = TensorId(77);
    assert!(matches!(
        kinds(&g).as_slice(),
        [ViolationKind::IdNotDense {
            index: 3,
            found: 77
        }]
    ));
}

#[test]
fn dangling_tensor_in_op() {
    let mut g = base();
    g.ops[0].inputs.push(TensorId(10_000));
    assert!(kinds(&g).contains(&ViolationKind::DanglingTensor { tensor: 10_000 }));
}

#[test]
fn dangling_producer_reference() {
    let mut g = base();
    let t = g.ops[0].outputs[0];
    g.tensors[t.index()].producer = Some(OpId(50_000));
    assert!(kinds(&g).contains(&ViolationKind::DanglingReference {
        field: "producer",
        target: 50_000
    }));
}

#[test]
fn two_producers() {
    let mut g = base();
    let t = g.ops[0].outputs[0];
    g.ops[1].outputs.push(t);
    assert!(
        kinds(&g)
            .iter()
            .any(|k| matches!(k, ViolationKind::TwoProducers { .. }))
    );
}

#[test]
fn producer_mismatch() {
    let mut g = base();
    let t = g.ops[1].outputs[0];
    g.tensors[t.index()].producer = Some(OpId(0));
    assert!(
        kinds(&g)
            .iter()
            .any(|k| matches!(k, ViolationKind::ProducerMismatch { .. }))
    );
}

#[test]
fn read_before_produced_and_cycle() {
    let mut g = base();
    // fc reads relu's output: fc -> relu -> fc.
    let relu = op_named(&g, "relu");
    let relu_out = g.ops[relu.index()].outputs[0];
    let fc = op_named(&g, "fc");
    g.ops[fc.index()].inputs.push(relu_out);
    let k = kinds(&g);
    assert!(
        k.contains(&ViolationKind::ReadBeforeProduced { producer: relu }),
        "{k:?}"
    );
    let cycle = k.iter().find_map(|k| match k {
        ViolationKind::Cycle { ops } => Some(ops.clone()),
        _ => None,
    });
    let cycle = cycle.expect("a cycle is reported");
    assert!(cycle.contains(&fc) && cycle.contains(&relu), "{cycle:?}");
}

#[test]
fn read_before_produced_without_cycle() {
    let mut g = base();
    // Swap the positions of fc and relu without renumbering: relu now comes first.
    g.ops.swap(0, 1);
    for (i, op) in g.ops.iter_mut().enumerate() {
        op.id = OpId(i as u32);
    }
    for op in g.ops.clone() {
        for &t in &op.outputs {
            g.tensors[t.index()].producer = Some(op.id);
        }
    }
    let k = kinds(&g);
    assert!(
        k.iter()
            .any(|k| matches!(k, ViolationKind::ReadBeforeProduced { .. })),
        "{k:?}"
    );
    assert!(
        !k.iter().any(|k| matches!(k, ViolationKind::Cycle { .. })),
        "{k:?}"
    );
}

#[test]
fn activation_without_producer() {
    let mut g = base();
    let t = g.ops[0].outputs[0];
    g.ops[0].outputs.clear();
    g.ops[0].outputs.push(TensorId(0));
    g.tensors[t.index()].producer = None;
    assert!(kinds(&g).contains(&ViolationKind::NoProducer));
}

#[test]
fn parameter_with_producer() {
    let mut g = base();
    let t = g.ops[0].outputs[0];
    g.tensors[t.index()].kind = TensorKind::Parameter;
    assert!(
        kinds(&g)
            .iter()
            .any(|k| matches!(k, ViolationKind::InputWithProducer { .. }))
    );
}

#[test]
fn zero_size() {
    let mut g = base();
    g.tensors[0].size_bytes = 0;
    g.tensors[0].shape = vec![0];
    assert!(kinds(&g).contains(&ViolationKind::ZeroSize));
}

#[test]
fn size_mismatch() {
    let mut g = base();
    g.tensors[0].size_bytes += 4;
    assert!(
        kinds(&g)
            .iter()
            .any(|k| matches!(k, ViolationKind::SizeMismatch { .. }))
    );
}

#[test]
fn view_of_itself_and_loops() {
    let mut g = base();
    let v = g
        .tensors
        .iter()
        .find(|t| t.view_of.is_some())
        .expect("a view")
        .id;
    g.tensors[v.index()].view_of = Some(v);
    assert!(
        kinds(&g)
            .iter()
            .any(|k| matches!(k, ViolationKind::BadView { .. }))
    );

    let mut g = base();
    let v = g
        .tensors
        .iter()
        .find(|t| t.view_of.is_some())
        .expect("a view")
        .id;
    let owner = g.tensors[v.index()].view_of.expect("owner");
    g.tensors[owner.index()].view_of = Some(v);
    assert!(
        kinds(&g)
            .iter()
            .any(|k| matches!(k, ViolationKind::BadView { .. }))
    );
}

#[test]
fn bad_inplace_updates() {
    // Target not persistent.
    let mut g = base();
    let u = g
        .tensors
        .iter()
        .find(|t| t.inplace_update_of.is_some())
        .expect("an update")
        .id;
    let act = g.ops[0].outputs[0];
    g.tensors[u.index()].inplace_update_of = Some(act);
    assert!(
        kinds(&g)
            .iter()
            .any(|k| matches!(k, ViolationKind::BadInplaceUpdate { .. }))
    );
    // Two updates of one parameter.
    let mut g = base();
    let updates: Vec<TensorId> = g
        .tensors
        .iter()
        .filter(|t| t.inplace_update_of.is_some())
        .map(|t| t.id)
        .collect();
    let target = g.tensors[updates[0].index()].inplace_update_of;
    let size = g.tensors[updates[0].index()].size_bytes;
    // The momentum buffer's update has the parameter's size; point it at the parameter too.
    let other = updates
        .iter()
        .copied()
        .find(|u| g.tensors[u.index()].size_bytes == size && *u != updates[0])
        .expect("a same-sized update");
    g.tensors[other.index()].inplace_update_of = target;
    assert!(kinds(&g).iter().any(
        |k| matches!(k, ViolationKind::BadInplaceUpdate { reason } if reason.contains("already updated"))
    ));
}

#[test]
fn bad_outputs() {
    let mut g = base();
    let t = g.ops[0].outputs[0];
    g.ops[0].outputs.push(t);
    assert!(
        kinds(&g)
            .iter()
            .any(|k| matches!(k, ViolationKind::BadOutputs { .. }))
    );
    let mut g = base();
    let relu = op_named(&g, "relu");
    let out = g.ops[relu.index()].outputs[0];
    g.ops[relu.index()].outputs.clear();
    g.tensors[out.index()].producer = None;
    let k = kinds(&g);
    assert!(
        k.iter().any(
            |k| matches!(k, ViolationKind::BadOutputs { reason } if reason.contains("no outputs"))
        ),
        "{k:?}"
    );
}

#[test]
fn violations_are_located_and_rendered() {
    let mut g = base();
    g.tensors[0].size_bytes = 0;
    g.tensors[0].shape = vec![0];
    let err = validate(&g).expect_err("invalid");
    assert_eq!(err.violations[0].location, Location::Tensor(TensorId(0)));
    assert_eq!(
        err.to_string(),
        "invalid graph (1 problem): t0: has zero bytes"
    );
}
