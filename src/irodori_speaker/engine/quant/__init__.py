"""Int4 weights: GPTQ / RTN-nibble formats (`formats`), int4 checkpoints (`checkpoint`), int4 modules
(`layers`), the W4A16 Triton kernel and its chooser (`triton_w4a16`), and the quantiser (`quantize`).

Submodules are imported on use (triton is optional and slow to import); see docs/int4.md.
"""
