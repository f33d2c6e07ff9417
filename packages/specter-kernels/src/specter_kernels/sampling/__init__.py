"""Greedy token choice: the argmax over the vocabulary."""
