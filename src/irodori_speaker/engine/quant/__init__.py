"""Int4 weights: GPTQ / RTN-nibble formats (`formats`), int4 checkpoints (`checkpoint`), int4 modules
(`layers`), the W4A16 GEMM (the fused Triton kernel `w4a16_kernel`, the dequantise-first paths
`w4a16_dequant`, the per-shape chooser `w4a16_chooser`), and the quantiser (`quantize`).

Submodules are imported on use (triton is optional and slow to import); see docs/int4.md.
"""
