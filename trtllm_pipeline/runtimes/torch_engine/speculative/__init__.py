"""Speculative decoding for the torch runtime: proposers draft tokens, the target verifies them in one step.

``proposer`` (the interface, n-gram prompt lookup), ``registry`` (proposers by name), ``draft`` (a smaller model with the same tokenizer),
``acceptance`` (greedy and the rejection rule), ``speculator`` (per-request adaptive draft lengths and counters).
"""
