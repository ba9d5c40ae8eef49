"""Stage 4, lowering: each fusion group to kernels and library calls, through one registry
(registry.py): per group, the fused lowerings (lower_attention, lower_sequence, lower_recurrent,
lower_conv, lower_gemm, lower_rows, lower_pointwise); per operator, the family lowerings
(families/), which take any instance of their operator. lower.py walks the groups; lowered.py
holds the records emit reads; gemm_calls, split_tf32 and cutlass_* are the library-call paths."""
