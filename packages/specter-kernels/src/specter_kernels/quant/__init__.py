"""INT4 group quantization in the GPTQ layout: packing, the ``Int4Weight`` container, GPTQ
checkpoint import, and the Triton helpers that dequantize INT4 words."""
