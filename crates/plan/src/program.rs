//! Step programs: what `verify()`, the simulator and the lowering see of a plan.
//!
//! A [`Plan`] is the serialisable, self-describing form. Search needs the same
//! instructions without a fingerprint, JSON-ready vectors or one allocation per
//! step, so the three algorithms that judge or build plans are written once over
//! two traits: [`Program`] (read the steps of three streams) and [`ProgramSink`]
//! (append steps). `Plan` implements both; [`CompactProgram`] implements both
//! with flat, reusable buffers. Because the lowering, `verify()` and the
//! simulator run the same code on either form, a search evaluator that lowers
//! into a `CompactProgram` gets exactly the answers the full pipeline would.

use crate::plan::{Instr, Plan, Residency, Step, StepRef, Stream};
use outcore_graph::{OpId, TensorId};
use std::fmt;

/// One instruction, borrowed from a program (see [`Instr`] for the meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepInstr<'a> {
    Compute(OpId),
    Recompute { op: OpId, outputs: &'a [TensorId] },
    SwapIn(TensorId),
    SwapOut(TensorId),
    Free(TensorId),
}

impl StepInstr<'_> {
    /// The stream an instruction must be on (`None`: any stream).
    pub fn required_stream(&self) -> Option<Stream> {
        match self {
            StepInstr::Compute(_) | StepInstr::Recompute { .. } => Some(Stream::Compute),
            StepInstr::SwapIn(_) => Some(Stream::H2d),
            StepInstr::SwapOut(_) => Some(Stream::D2h),
            StepInstr::Free(_) => None,
        }
    }

    /// The owned instruction.
    pub fn to_instr(&self) -> Instr {
        match *self {
            StepInstr::Compute(op) => Instr::Compute(op),
            StepInstr::Recompute { op, outputs } => Instr::Recompute {
                op,
                outputs: outputs.to_vec(),
            },
            StepInstr::SwapIn(t) => Instr::SwapIn(t),
            StepInstr::SwapOut(t) => Instr::SwapOut(t),
            StepInstr::Free(t) => Instr::Free(t),
        }
    }
}

impl<'a> From<&'a Instr> for StepInstr<'a> {
    fn from(instr: &'a Instr) -> Self {
        match instr {
            Instr::Compute(op) => StepInstr::Compute(*op),
            Instr::Recompute { op, outputs } => StepInstr::Recompute { op: *op, outputs },
            Instr::SwapIn(t) => StepInstr::SwapIn(*t),
            Instr::SwapOut(t) => StepInstr::SwapOut(*t),
            Instr::Free(t) => StepInstr::Free(*t),
        }
    }
}

impl fmt::Display for StepInstr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepInstr::Compute(op) => write!(f, "compute {op}"),
            StepInstr::Recompute { op, outputs } => {
                let outs: Vec<String> = outputs.iter().map(|t| t.to_string()).collect();
                write!(f, "recompute {op} -> [{}]", outs.join(", "))
            }
            StepInstr::SwapIn(t) => write!(f, "swap-in {t}"),
            StepInstr::SwapOut(t) => write!(f, "swap-out {t}"),
            StepInstr::Free(t) => write!(f, "free {t}"),
        }
    }
}

/// Read access to the steps of a plan-like program.
pub trait Program {
    /// Number of steps on a stream.
    fn stream_len(&self, stream: Stream) -> usize;
    /// The instruction at `index` of `stream` (`index < stream_len(stream)`).
    fn instr(&self, stream: Stream, index: usize) -> StepInstr<'_>;
    /// The cross-stream waits of that step.
    fn waits(&self, stream: Stream, index: usize) -> &[StepRef];
    /// Device memory the program may use.
    fn budget_bytes(&self) -> u64;
    /// Where persistent tensors are at the iteration start (absent: on the device).
    fn initial_residency(&self) -> &[(TensorId, Residency)];

    /// Total number of steps.
    fn n_steps(&self) -> usize {
        Stream::ALL.iter().map(|&s| self.stream_len(s)).sum()
    }
}

/// Append access: what the lowering writes.
pub trait ProgramSink {
    /// Appends a step and returns its reference.
    fn push_step(&mut self, stream: Stream, instr: StepInstr<'_>, waits: &[StepRef]) -> StepRef;
    /// Sets where a persistent tensor starts the iteration; `false` when the
    /// tensor has no initial-residency entry (it is not persistent).
    fn set_initial_residency(&mut self, tensor: TensorId, residency: Residency) -> bool;
}

impl Program for Plan {
    #[inline]
    fn stream_len(&self, stream: Stream) -> usize {
        self.streams[stream.index()].len()
    }

    #[inline]
    fn instr(&self, stream: Stream, index: usize) -> StepInstr<'_> {
        (&self.streams[stream.index()][index].instr).into()
    }

    #[inline]
    fn waits(&self, stream: Stream, index: usize) -> &[StepRef] {
        &self.streams[stream.index()][index].waits
    }

    #[inline]
    fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    fn initial_residency(&self) -> &[(TensorId, Residency)] {
        &self.initial_residency
    }
}

impl ProgramSink for Plan {
    #[inline]
    fn push_step(&mut self, stream: Stream, instr: StepInstr<'_>, waits: &[StepRef]) -> StepRef {
        let program = &mut self.streams[stream.index()];
        program.push(Step {
            instr: instr.to_instr(),
            waits: waits.to_vec(),
        });
        StepRef {
            stream,
            index: (program.len() - 1) as u32,
        }
    }

    fn set_initial_residency(&mut self, tensor: TensorId, residency: Residency) -> bool {
        set_residency(&mut self.initial_residency, tensor, residency)
    }
}

/// Sets a tensor's entry in an initial-residency list kept in tensor order (as
/// `Plan::new` and `CompactProgram::reset` make it); `false` when it has none.
fn set_residency(
    list: &mut [(TensorId, Residency)],
    tensor: TensorId,
    residency: Residency,
) -> bool {
    match list.binary_search_by_key(&tensor, |e| e.0) {
        Ok(i) => {
            list[i].1 = residency;
            true
        }
        Err(_) => false,
    }
}

/// One step of a [`CompactProgram`]: the instruction with its operands, and
/// ranges into the program's flat wait and output lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CompactStep {
    kind: CompactKind,
    /// Op id for compute and recompute, tensor id otherwise.
    id: u32,
    outputs: (u32, u32),
    waits: (u32, u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CompactKind {
    Compute,
    Recompute,
    SwapIn,
    SwapOut,
    Free,
}

/// A plan's program in flat buffers that are reused between lowerings: no
/// allocation per step, and [`CompactProgram::reset`] keeps every capacity.
#[derive(Debug, Clone, Default)]
pub struct CompactProgram {
    streams: [Vec<CompactStep>; 3],
    waits: Vec<StepRef>,
    outputs: Vec<TensorId>,
    initial_residency: Vec<(TensorId, Residency)>,
    budget_bytes: u64,
}

impl CompactProgram {
    /// Empties the program for a new lowering with every persistent tensor
    /// (given in tensor order) resident on the device.
    pub fn reset(&mut self, persistent: impl Iterator<Item = TensorId>, budget_bytes: u64) {
        for s in &mut self.streams {
            s.clear();
        }
        self.waits.clear();
        self.outputs.clear();
        self.initial_residency.clear();
        self.initial_residency
            .extend(persistent.map(|t| (t, Residency::Device)));
        self.budget_bytes = budget_bytes;
    }
}

impl Program for CompactProgram {
    #[inline]
    fn stream_len(&self, stream: Stream) -> usize {
        self.streams[stream.index()].len()
    }

    #[inline]
    fn instr(&self, stream: Stream, index: usize) -> StepInstr<'_> {
        let step = &self.streams[stream.index()][index];
        match step.kind {
            CompactKind::Compute => StepInstr::Compute(OpId(step.id)),
            CompactKind::Recompute => StepInstr::Recompute {
                op: OpId(step.id),
                outputs: &self.outputs[step.outputs.0 as usize..step.outputs.1 as usize],
            },
            CompactKind::SwapIn => StepInstr::SwapIn(TensorId(step.id)),
            CompactKind::SwapOut => StepInstr::SwapOut(TensorId(step.id)),
            CompactKind::Free => StepInstr::Free(TensorId(step.id)),
        }
    }

    #[inline]
    fn waits(&self, stream: Stream, index: usize) -> &[StepRef] {
        let (lo, hi) = self.streams[stream.index()][index].waits;
        &self.waits[lo as usize..hi as usize]
    }

    #[inline]
    fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    fn initial_residency(&self) -> &[(TensorId, Residency)] {
        &self.initial_residency
    }
}

impl ProgramSink for CompactProgram {
    #[inline]
    fn push_step(&mut self, stream: Stream, instr: StepInstr<'_>, waits: &[StepRef]) -> StepRef {
        let w0 = self.waits.len() as u32;
        self.waits.extend_from_slice(waits);
        let waits = (w0, self.waits.len() as u32);
        let o0 = self.outputs.len() as u32;
        let (kind, id) = match instr {
            StepInstr::Compute(op) => (CompactKind::Compute, op.0),
            StepInstr::Recompute { op, outputs } => {
                self.outputs.extend_from_slice(outputs);
                (CompactKind::Recompute, op.0)
            }
            StepInstr::SwapIn(t) => (CompactKind::SwapIn, t.0),
            StepInstr::SwapOut(t) => (CompactKind::SwapOut, t.0),
            StepInstr::Free(t) => (CompactKind::Free, t.0),
        };
        let program = &mut self.streams[stream.index()];
        program.push(CompactStep {
            kind,
            id,
            outputs: (o0, self.outputs.len() as u32),
            waits,
        });
        StepRef {
            stream,
            index: (program.len() - 1) as u32,
        }
    }

    fn set_initial_residency(&mut self, tensor: TensorId, residency: Residency) -> bool {
        set_residency(&mut self.initial_residency, tensor, residency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compact_program_reads_back_what_was_pushed() {
        let mut p = CompactProgram::default();
        p.reset([TensorId(0), TensorId(3)].into_iter(), 100);
        let a = p.push_step(Stream::Compute, StepInstr::Compute(OpId(2)), &[]);
        let b = p.push_step(Stream::D2h, StepInstr::SwapOut(TensorId(5)), &[a]);
        let outs = [TensorId(7), TensorId(8)];
        p.push_step(
            Stream::Compute,
            StepInstr::Recompute {
                op: OpId(1),
                outputs: &outs,
            },
            &[b],
        );
        assert!(p.set_initial_residency(TensorId(3), Residency::Host));
        assert!(!p.set_initial_residency(TensorId(4), Residency::Host));
        assert_eq!(p.stream_len(Stream::Compute), 2);
        assert_eq!(p.instr(Stream::D2h, 0), StepInstr::SwapOut(TensorId(5)));
        assert_eq!(p.waits(Stream::D2h, 0), &[a]);
        assert_eq!(
            p.instr(Stream::Compute, 1),
            StepInstr::Recompute {
                op: OpId(1),
                outputs: &outs
            }
        );
        assert_eq!(p.waits(Stream::Compute, 1), &[b]);
        assert_eq!(
            p.initial_residency(),
            &[
                (TensorId(0), Residency::Device),
                (TensorId(3), Residency::Host)
            ]
        );
        assert_eq!(p.n_steps(), 3);
        // Reset keeps nothing of the previous program.
        p.reset(std::iter::empty(), 5);
        assert_eq!(p.n_steps(), 0);
        assert_eq!(p.budget_bytes(), 5);
    }
}
