"""DeepSeek-V2's absorbed MLA attention and prologue, and the rotary embeddings."""
