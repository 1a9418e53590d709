"""GPU-kernel support shared by `engine` (the fused DiT-block and Snake kernels) and `quant` (the
W4A16 kernel). It sits beside both packages because both use it and the engine must not import quant;
the dependency arrows are engine -> kernels <- quant, and quant -> engine.
"""
