"""The torch runtime's fast CUDA path: Triton kernels for one decode step, replayed as CUDA graphs.

Decode at small batch reads every weight once per token and does little arithmetic with it, so its
speed is memory bandwidth minus overheads: kernel launches (removed by CUDA graphs), passes over
activations between small ops (removed by fusing norms, rotary, the KV-cache write and the SiLU gate
into the kernels around them) and GEMMs that cannot keep enough loads in flight at M=1 (replaced by
split-K weight-streaming kernels). ``decode_step`` composes the kernels; ``graphs`` captures them per
batch bucket. Everything here needs CUDA and Triton; ``support.available()`` says whether this
process has both, and the eager path in ``torch_engine/model`` stays the reference the fast path is checked
against.
"""

