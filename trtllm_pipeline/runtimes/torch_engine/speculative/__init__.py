"""Speculative decoding for the torch runtime: proposers draft tokens, the target verifies them in one step.

``proposer`` (the interface, n-gram prompt lookup), ``registry`` (proposers by name), ``draft`` (a smaller model with
the same tokenizer), ``eagle3`` (an EAGLE-3 draft head over the target's own hidden states: ``eagle3_checkpoint``, its
contract and reader; ``eagle3_head``, the module), ``acceptance`` (greedy and the rejection rule), ``speculator``
(per-request adaptive draft lengths and counters).
"""
