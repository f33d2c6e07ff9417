"""llama.cpp on the same weights as Specter: GGUF files from a written checkpoint, the GPU
memory sizing of ``--n-cpu-moe``, and llama-bench / speculative runs as Specter's records
(``specter llama-cpp``)."""
