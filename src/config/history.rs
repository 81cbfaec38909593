//! `CUSHIM_HISTORY`: the semantics of `torch.cuda.memory._record_memory_history`.
