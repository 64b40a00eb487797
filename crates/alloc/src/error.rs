//! Allocation errors: one struct carrying a `#[non_exhaustive]` kind enum.

use crate::AllocId;

/// An allocator operation failed; [`AllocError::kind`] says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}")]
pub struct AllocError {
    kind: AllocErrorKind,
}

impl AllocError {
    pub fn new(kind: AllocErrorKind) -> Self {
        AllocError { kind }
    }

    /// What went wrong.
    pub fn kind(&self) -> &AllocErrorKind {
        &self.kind
    }

    /// True for [`AllocErrorKind::OutOfMemory`]: the request was valid but did
    /// not fit (the simulator reacts to this by swapping or recomputing).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self.kind, AllocErrorKind::OutOfMemory { .. })
    }
}

impl From<AllocErrorKind> for AllocError {
    fn from(kind: AllocErrorKind) -> Self {
        AllocError::new(kind)
    }
}

/// Why an allocator operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocErrorKind {
    /// The request did not fit. `free_bytes` counts every byte not holding a
    /// live allocation that the allocator could in principle use (unreserved
    /// space plus cached free blocks or free pool objects);
    /// `largest_free_block_bytes` is the largest single request that could
    /// have succeeded, which is what fragmentation shrinks.
    /// `segment_bytes`: where the request needed a new segment larger than
    /// itself (the caching allocator reserves requests of 1 to 10 MiB in
    /// 20 MiB segments), that segment's size, which is what had to fit:
    /// without it a 2 MiB request failing beside a 14 MiB free block reads
    /// as a contradiction.
    #[error(
        "out of memory: allocation {id} of {requested_bytes} bytes does not fit{segment}; \
         {free_bytes} bytes are free but the largest free block is {largest_free_block_bytes} bytes \
         ({reserved_bytes} of {capacity_bytes} bytes reserved); free or swap out tensors, \
         raise the capacity, or use an allocator that fragments less",
        segment = segment_note(*.segment_bytes)
    )]
    OutOfMemory {
        id: AllocId,
        requested_bytes: u64,
        free_bytes: u64,
        largest_free_block_bytes: u64,
        reserved_bytes: u64,
        capacity_bytes: u64,
        segment_bytes: Option<u64>,
    },
    /// `free` of an id that is not live.
    #[error(
        "unknown allocation id {id}: it is not live (never allocated, already freed, \
         or its allocation failed); free each id once after a successful allocate"
    )]
    UnknownId { id: AllocId },
    /// `allocate` of an id that is already live.
    #[error(
        "allocation id {id} is already live; free it before allocating it again \
         or use a fresh id"
    )]
    DoubleAllocate { id: AllocId },
    /// The size-class pool has no class that may hold this size.
    #[error(
        "allocation {id} of {requested_bytes} bytes is larger than every size class \
         of the pool (largest class {largest_class_bytes} bytes); add a size class of at \
         least {requested_bytes} bytes"
    )]
    SizeTooLargeForPool {
        id: AllocId,
        requested_bytes: u64,
        largest_class_bytes: u64,
    },
    /// An `offsets` layout has no valid place for this allocation (not laid
    /// out, larger than laid out, past the capacity, or over a live one).
    #[error(
        "the layout has no place for allocation {id}: {reason}; plan again with \
         `--allocator offsets` for this graph and plan"
    )]
    LayoutViolation { id: AllocId, reason: String },
    /// Constructor parameters are inconsistent.
    #[error("invalid allocator configuration: {reason}")]
    InvalidConfig { reason: String },
    /// An allocator name that is none of the known ones.
    #[error(
        "unknown allocator name {name:?}; use one of \"size-class\", \"best-fit\", \
         \"virtual-chunks\", \"offsets\""
    )]
    UnknownAllocatorName { name: String },
}

pub(crate) fn invalid_config(reason: impl Into<String>) -> AllocError {
    AllocError::new(AllocErrorKind::InvalidConfig {
        reason: reason.into(),
    })
}

/// The clause of [`AllocErrorKind::OutOfMemory`]'s message that names the
/// segment a request needed, if any.
fn segment_note(segment_bytes: Option<u64>) -> String {
    segment_bytes
        .map(|b| {
            format!(" (it needs a new segment of {b} bytes, the allocator's segment size for it)")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lower_case_and_name_a_fix() {
        let err = AllocError::new(AllocErrorKind::UnknownId { id: AllocId(7) });
        let msg = err.to_string();
        assert!(msg.starts_with("unknown allocation id 7"), "{msg}");
        assert!(msg.contains("free each id once"), "{msg}");
        assert!(!err.is_out_of_memory());
    }
}
